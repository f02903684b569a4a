#!/bin/bash
# Context parallelism (parallel.context, cp.c): each sequence cut into 2 cp
# chunks, context rank r holding chunks r and 2cp-1-r, attention as a ring
# of key/value blocks merged by their log-sum-exp. Against one process: the
# losses, gradient norms, validation losses and exported weights of a small
# GPT-2 and a small Llama with GQA (and a Qwen3-shaped one: head_dim 24,
# QK-norm, under cp 2, cp 2 x tp 2 sequence parallel, recompute) under cp 2, cp 4, cp 2 x tp 2 (sequence
# parallel), cp 2 x FULL_SHARD 2, cp 2 x HYBRID_SHARD (shard groups of 2)
# and 8 ranks of tp 2 x cp 2 x dp 2 (the Llama also tp 2 x cp 2 without
# sequence parallelism, SHARD_GRAD_OP, HYBRID_SHARD_ZERO2, YaRN and Llama 3
# RoPE scaling, bf16 working weights); activation recompute (full, and
# selective attention: the ring again in the backward), parallel.context_mode
# all_gather (cp 4, and with documents), offload and the LM head in
# chunks; sampling (1 rank's tokens, over the whole context); the profile
# table; a hung context rank (watchdog, exit 5); block-causal documents
# with reset positions and eod_mask_loss, which straddle the chunks and
# the ranks, each rank reading only its own chunks (LLMTRAIN_DATA_TRACE);
# a checkpoint written under cp 2 resumed under cp 1 and cp 4, and written
# under cp 1 and cp 4 resumed under cp 2; the TCP rendezvous (no MPI); the
# ring's bytes per step against
# docs/layouts.md's formula; the context groups printed; activation bytes
# per rank falling with cp in `llmtrain check`, and the shipped 131072-token
# Llama 3.1 8B job fitting in 80 GB a GPU at its cp 4, not at cp 2; the
# CUDA backend on the host emulation (the attention parts, the emulated
# NCCL's send/recv; cp 2, all_gather, documents, tp 2 x cp 2 sequence
# parallel on 4 devices, selective recompute) against one emulated device;
# impossible layouts as one line and exit 2.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
write_shard "$TMP/docs.bin" 8 20000 2 # token 5 ends documents: about 8 tokens each, chunks of 4 and 8

# job ARCH: 2 layers, 64 wide, 4 heads (Llama: 2 kv heads), 32 tokens, 6
# steps of 4 sequences in micro-batches of 2, validation at steps 3 and 6;
# qwen3: the Llama with heads of 24 (not 64 / 4) and QK-norm
job() {
    local arch=$1 extra=""
    [ "$1" = qwen3 ] && { arch=llama; extra=', "head_dim": 24, "qk_norm": true'; }
    cat >"$TMP/$1.json" <<EOF
{"model": {"arch": "$arch", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": $([ "$arch" = llama ] && echo 2 || echo 4),
           "vocab_size": 96, "max_seq_len": 32$extra},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/train.bin"},
 "train": {"steps": 6, "seq_len": 32, "micro_batch": 2, "global_batch": 4},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 0, "batches": 2, "every_steps": 3},
 "parallel": {"health_check": false}}
EOF
}

# train NAME ARCH NP [--set ...]: lib.sh's layout_run of $TMP/ARCH.json
train() { layout_run "$@"; }

# same REF NAME WHAT [compare_runs options]: NAME's losses, norms, val
# losses and weights are REF's (both exports there: compare_runs.py skips
# weights it cannot find)
same() {
    local ref=$1 name=$2 what=$3; shift 3
    if [ -s "$TMP/$name/metrics.jsonl" ] && [ -s "$TMP/$ref/hf/model.safetensors" ] && [ -s "$TMP/$name/hf/model.safetensors" ] &&
        $PY tests/compare_runs.py "$TMP/$ref" "$TMP/$name" --steps 6 --loss-rtol 2e-5 --weight-rtol 1e-3 "$@" \
        >"$TMP/$name.cmp" && grep -q '"val_loss"' "$TMP/$name/metrics.jsonl"; then
        ok "$what matches 1 rank (losses, norms, val losses, weights)"
    else
        bad "$what differs from 1 rank: $(head -2 "$TMP/$name.cmp" 2>/dev/null | tr '\n' ' ') $([ -s "$TMP/$name/hf/model.safetensors" ] || echo "(no export)")"
    fi
}

for arch in gpt2 llama; do
    job $arch
    train $arch-1 $arch 1
    # name: ranks, then the layout's settings
    while read -r name np sets; do
        train "$arch-$name" $arch "$np" $sets
        same "$arch-1" "$arch-$name" "$arch $name ($np ranks)"
    done <<EOF
cp2 2 --set parallel.context=2
cp4 4 --set parallel.context=4 --set parallel.health_check=true
cp2-tp2-sp 4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
cp2-full-shard 4 --set parallel.context=2 --set parallel.strategy=FULL_SHARD
cp2-hybrid 4 --set parallel.context=2 --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=2
cp2-recompute 2 --set parallel.context=2 --set train.activation_checkpointing=selective --set train.recompute_modules=attention,norm
cp4-all-gather 4 --set parallel.context=4 --set parallel.context_mode=all_gather
EOF
done
# Qwen3's attention (a head_dim of its own, QK-norm: per token, so the ring is unchanged)
job qwen3
train qwen3-1 qwen3 1
while read -r name np sets; do
    train "qwen3-$name" qwen3 "$np" $sets
    same qwen3-1 "qwen3-$name" "qwen3 $name ($np ranks)"
done <<EOF
cp2 2 --set parallel.context=2
cp2-tp2-sp 4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
cp2-recompute 2 --set parallel.context=2 --set train.activation_checkpointing=selective --set train.recompute_modules=attention,norm
EOF
train llama-tp2-cp2-dp2 llama 8 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true \
    --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=2 --set train.activation_checkpointing=full
same llama-1 llama-tp2-cp2-dp2 "llama tp 2 x cp 2 x dp 2 (8 ranks, HYBRID_SHARD, full recompute)"
# the Llama's other layouts: tp 2 x cp 2 without sequence parallelism, the
# strategies that keep the weights gathered (ZeRO-2: SHARD_GRAD_OP, and
# HYBRID_SHARD_ZERO2 in shard groups of 2)
while read -r name np sets; do
    train "llama-$name" llama "$np" $sets
    same llama-1 "llama-$name" "llama $name ($np ranks)"
done <<EOF
cp2-tp2 4 --set parallel.context=2 --set parallel.tensor=2
cp2-shard-grad-op 4 --set parallel.context=2 --set parallel.strategy=SHARD_GRAD_OP
cp2-hybrid-zero2 4 --set parallel.context=2 --set parallel.strategy=HYBRID_SHARD_ZERO2 --set parallel.shard_degree=2
EOF
# RoPE scaled (positions global: a scaled angle at a wrong position would
# show), and bf16 working weights: each against its own 1-rank run. bf16's
# gradient norms are held to 1e-4: its stochastic rounding of the
# reduced gradients' sums in another order parts them by up to 5.2e-5
# under tp 2 as under cp 2 (data-parallel ranks, which sum in the same
# order, match exactly)
while read -r name rel sets; do
    train "llama-$name-1" llama 1 $sets
    train "llama-$name-cp2" llama 2 $sets --set parallel.context=2
    same "llama-$name-1" "llama-$name-cp2" "llama $name, cp 2" --norm-rtol "$rel"
done <<EOF
yarn 2e-5 --set model.rope_scaling=yarn --set model.rope_scaling_factor=4 --set model.rope_original_max_seq_len=8
llama3 2e-5 --set model.rope_scaling=llama3 --set model.rope_scaling_factor=8 --set model.rope_original_max_seq_len=16
bf16 1e-4 --set train.param_dtype=bf16
EOF

# documents: block-causal attention, positions reset at each document and
# no loss after token 5; a document's start may lie on another rank's chunk
for arch in llama gpt2; do
    docs="--set data.train=$TMP/docs.bin --set data.val=$TMP/docs.bin --set data.eod_token=5 --set train.eod_mask_loss=true
          --set train.attention_mask=block_causal --set train.reset_position_ids=true"
    train $arch-docs-1 $arch 1 $docs
    for cp in 2 4; do
        LLMTRAIN_DATA_TRACE="$TMP/trace-$arch-cp$cp" train $arch-docs-cp$cp $arch $cp $docs --set parallel.context=$cp
        # each rank read its own two chunks of every sequence, and nothing
        # else (LLMTRAIN_DATA_TRACE: a line a read, WHAT SEQ OFF N)
        reads=$($PY - "$TMP/trace-$arch-cp$cp" $cp 32 <<'PYEOF'
import sys
pre, cp, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tc, n, wrong = T // (2 * cp), 0, []
for r in range(cp):
    for line in open(f"{pre}.{r}"):
        what, seq, off, ln = line.split()
        n += 1
        if int(ln) != tc or int(off) not in (r * tc, (2 * cp - 1 - r) * tc):
            wrong.append(f"rank {r}: {line.strip()}")
print(f"{n} reads" + (f", {len(wrong)} outside the rank's chunks: " + "; ".join(wrong[:3]) if wrong else "") if n else "no reads traced")
PYEOF
)
        case "$reads" in
        *outside*|"no reads"*|"") bad "$arch documents under cp $cp: a rank read more than its chunks: $reads";;
        *) ok "$arch documents under cp $cp: each rank read its two chunks of $((32 / (2 * cp))) tokens only ($reads)";;
        esac
    done
    same $arch-docs-1 $arch-docs-cp2 "$arch block-causal documents across chunks, cp 2"
    same $arch-docs-1 $arch-docs-cp4 "$arch block-causal documents across chunks, cp 4 (chunks of 4 tokens)"
    train $arch-docs-ag $arch 2 $docs --set parallel.context=2 --set parallel.context_mode=all_gather
    same $arch-docs-1 $arch-docs-ag "$arch block-causal documents across chunks, cp 2 all_gather"
done

# 4 layers in 3 offload slots and the LM head 16 rows at a time, under cp 2
off="--set model.n_layer=4 --set train.activation_offload=true --set train.lm_head_chunk=16"
train off-1 llama 1 $off
train off-cp2 llama 2 $off --set parallel.context=2
same off-1 off-cp2 "llama cp 2 with activation offload (4 layers) and the LM head in chunks of 16 rows"

# sampling: the context group of data-parallel slot 0 runs each forward
# over the whole context (the ring), so a prompt of 8 and 40 new tokens
# (48 > seq_len 32 > T / cp 16: the window slides, and a rank alone over
# its T / cp tokens would see less; the old sampling's tokens differed from
# the 21st on) give 1 rank's tokens: cp 2, cp 2 x FULL_SHARD (every rank
# runs the forwards), cp 4 (the last token on any context rank) and
# cp 2 x tp 2 sequence parallel (the row's vocabulary slices gathered on
# the rank holding it, then moved to rank 0)
sample() { sed -n '/^--- sample ---$/,+1p' "$1"; }
smp="--set eval.sample_tokens=40 --set train.steps=3"
train smp-1 llama 1 $smp
while read -r name np sets; do
    train "smp-$name" llama "$np" $smp $sets
    if [ "$(sample "$TMP/smp-1.out" | wc -w)" -eq 52 ] && [ "$(sample "$TMP/smp-1.out")" = "$(sample "$TMP/smp-$name.out")" ]; then
        ok "sampling under $name: the 48 tokens of 1 rank"
    else bad "sampling under $name: $(sample "$TMP/smp-$name.out" | tail -1) vs $(sample "$TMP/smp-1.out" | tail -1)"; fi
done <<EOF
cp2 2 --set parallel.context=2
cp2-full-shard 4 --set parallel.context=2 --set parallel.strategy=FULL_SHARD
cp4 4 --set parallel.context=4
cp2-tp2-sp 4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
EOF
# ... and with documents (block-causal, positions reset after token 5, found in the window)
train smp-docs-1 llama 1 $smp $docs
train smp-docs-cp2 llama 2 $smp $docs --set parallel.context=2
if [ "$(sample "$TMP/smp-docs-1.out" | wc -w)" -eq 52 ] && [ "$(sample "$TMP/smp-docs-1.out")" = "$(sample "$TMP/smp-docs-cp2.out")" ]; then
    ok "sampling under cp 2 with block-causal documents: the 48 tokens of 1 rank"
else bad "sampling with documents under cp 2: $(sample "$TMP/smp-docs-cp2.out" | tail -1) vs $(sample "$TMP/smp-docs-1.out" | tail -1)"; fi

# log.profile_steps times the attention parts and the k|v copies
train prof llama 2 --set parallel.context=2 --set log.profile_steps=2
if grep -qE "^profile: .* attention_part_forward$" "$TMP/prof.out" && grep -qE "^profile: .* attention_part_backward$" "$TMP/prof.out" &&
   grep -qE "^profile: .* copy_2d$" "$TMP/prof.out"; then ok "log.profile_steps times attention_part_forward/backward and copy_2d"
else bad "profile table under cp: $(grep -c '^profile:' "$TMP/prof.out") profile lines, no part entries"; fi

# a hung context rank: the other waits in the ring's shift, and the watchdog ends the job (exit 5)
LLMTRAIN_FAULT="rank=1,step=2,kind=hang" timeout 60 $MPIRUN 2 $BIN "$TMP/llama.json" --set parallel.context=2 \
    --set parallel.timeout_s=2 --set log.dir="$TMP/hang" --set checkpoint.dir="$TMP/hang/ckpt" </dev/null >"$TMP/hang.out" 2>&1
rc=$?
if [ $rc -eq 5 ] && grep -qE "^llmtrain: rank [01]: watchdog: step 2 phase [a-z_]+ \(collective [A-Za-z_]+\) exceeded parallel.timeout_s=2 s" \
    "$TMP/hang.out"; then ok "a hung context rank ends the job with exit 5 ($(grep -o 'collective [A-Za-z_]*' "$TMP/hang.out" | head -1))"
else bad "hung context rank: rc=$rc $(grep llmtrain: "$TMP/hang.out" | head -2)"; fi

# a checkpoint at step 3 resumed under another cp degree: written under cp
# 2, resumed under cp 1 and cp 4, and the reverse, written under cp 1 and
# cp 4, resumed under cp 2: steps 4-6 and the weights of the uninterrupted
# run (checkpoints hold no layout; the first 3 steps of its schedule, whose
# cosine ends at step 6)
for w in 1 2 4; do train ck-cp$w llama $w --set parallel.context=$w --set train.steps=3 --set optim.decay_steps=6; done
for wr in 2:1 2:4 1:2 4:2; do
    w=${wr%:*} r=${wr#*:}
    mkdir -p "$TMP/ck-$w-$r" && cp -r "$TMP/ck-cp$w/ckpt" "$TMP/ck-$w-$r/ckpt"
    train ck-$w-$r llama $r --set parallel.context=$r
    if [ "$(grep -c '"loss"' "$TMP/ck-$w-$r/metrics.jsonl" 2>/dev/null)" = 3 ] && [ -s "$TMP/ck-$w-$r/hf/model.safetensors" ] &&
       $PY tests/compare_runs.py "$TMP/llama-1" "$TMP/ck-$w-$r" --loss-rtol 2e-5 --weight-rtol 1e-3 >"$TMP/ck-$w-$r.cmp"; then
        ok "checkpoint of cp $w resumed under cp $r: steps 4-6 and weights of the uninterrupted run"
    else bad "cp $w resumed under cp $r: $(head -2 "$TMP/ck-$w-$r.cmp" | tr '\n' ' ') $(grep llmtrain: "$TMP/ck-$w-$r.out" | head -1)"; fi
done

# the TCP rendezvous (a torchrun-style launch, no MPI): the ring over its all-gather
mkdir -p "$TMP/tcp"
trun tcp 2 $BIN "$TMP/llama.json" --set parallel.context=2 --set log.dir="$TMP/tcp" --set checkpoint.dir="$TMP/tcp/ckpt" >"$TMP/tcp.out" 2>&1
$BIN export "$TMP/tcp/ckpt" "$TMP/tcp/hf" >/dev/null 2>&1
same llama-1 tcp "llama cp 2 over the TCP rendezvous"

# the CUDA backend on the host emulation (tests/llmtrain_emu, train.device
# cuda: kernels.cu's attention parts, the ring over the emulated NCCL's
# ncclSend/ncclRecv, all_gather over its all-gather and reduce-scatter)
# against one emulated device, 4 steps of the llama job with GQA. Under
# compute dtype bf16 (the default: [a] qkv and out in bf16, the 1-rank run
# on the emulated cuDNN attention) the losses and val losses agree within
# 2e-3 and the gradient norms within 3e-2 (measured: 1.4e-4 and 6.0e-3;
# tp 2 x cp 2 with sequence parallelism on 4 emulated devices, whose bf16
# activations also meet the TP collectives: 1.0e-3 and 7.5e-3); under fp32
# with block-causal documents that straddle the chunks, within 1e-5 and
# 1e-4 (measured: 1.4e-8 and 6.8e-8); with those documents under bf16 at
# head dim 32 (the cp run's parts on the bf16 tensor-core kernels, the
# 1-rank run on the emulated cuDNN) within 2e-3 and 3e-2 (measured: 2.5e-4
# and 9.3e-4). Selective recompute of the attention (the ring run again in
# the backward) and the norms under cp 2 is the run without recompute bit
# for bit, as on one device (test_actckpt.sh).
# Their bytes are checked with the CPU's below.
EMU=$PWD/tests/llmtrain_emu
[ -x "$EMU" ] || make -s tests/llmtrain_emu >/dev/null 2>&1
emu() { # NAME NP ARGS...: an emulated CUDA run of the llama job on NP devices
    local name=$1 np=$2; shift 2
    local cmd="$EMU"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $EMU"
    LLMTRAIN_CUDA_EMU_DEVICES=$((np > 2 ? np : 2)) LLMTRAIN_CUDA_EMU_THREADS=1 $cmd "$TMP/llama.json" --set train.device=cuda --set train.steps=4 \
        --set eval.every_steps=2 --set log.dir="$TMP/$name" --set checkpoint.dir="$TMP/$name/ckpt" "$@" </dev/null >"$TMP/$name.out" 2>&1 ||
        echo "(emulated run $name exited non-zero: $(grep llmtrain: "$TMP/$name.out" | head -1))"
}
emu_same() { # REF NAME LOSS_RTOL NORM_RTOL WHAT
    if [ -s "$TMP/$2/metrics.jsonl" ] && grep -q "| backend cuda" "$TMP/$2.out" &&
       $PY tests/compare_runs.py "$TMP/$1" "$TMP/$2" --steps 4 --loss-rtol "$3" --norm-rtol "$4" >"$TMP/$2.cmp" &&
       [ "$(grep -c '"val_loss"' "$TMP/$2/metrics.jsonl")" -eq 2 ]; then
        ok "$5 matches 1 emulated device (losses, val losses within $3, norms within $4)"
    else bad "$5 differs from 1 emulated device: $(head -2 "$TMP/$2.cmp" 2>/dev/null | tr '\n' ' ') $(grep llmtrain: "$TMP/$2.out" | head -1)"; fi
}
docs="--set data.train=$TMP/docs.bin --set data.val=$TMP/docs.bin --set data.eod_token=5 --set train.eod_mask_loss=true
      --set train.attention_mask=block_causal --set train.reset_position_ids=true --set train.compute_dtype=fp32"
emu emu-1 1
emu emu-cp2 2 --set parallel.context=2
emu emu-cp2-ag 2 --set parallel.context=2 --set parallel.context_mode=all_gather
emu emu-docs-1 1 $docs
emu emu-docs-cp2 2 $docs --set parallel.context=2
emu emu-tp2-cp2-sp 4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
emu emu-cp2-recompute 2 --set parallel.context=2 --set train.activation_checkpointing=selective --set train.recompute_modules=attention,norm
# head dim 32 (2 heads, 1 kv head) under bf16: the ring's parts on the
# bf16 tensor-core kernels (kernels/attention_flash_bf16.cuh), documents
# across the chunks
tc="--set model.n_head=2 --set model.n_kv_head=1 ${docs/--set train.compute_dtype=fp32/}"
emu emu-tc-1 1 $tc
emu emu-tc-cp2 2 $tc --set parallel.context=2
emu_same emu-1 emu-cp2 2e-3 3e-2 "emulated CUDA cp 2 ring (bf16, NCCL send/recv)"
emu_same emu-1 emu-cp2-ag 2e-3 3e-2 "emulated CUDA cp 2 all_gather (bf16)"
emu_same emu-1 emu-tp2-cp2-sp 2e-3 3e-2 "emulated CUDA tp 2 x cp 2, sequence parallel (4 devices, bf16)"
emu_same emu-1 emu-cp2-recompute 2e-3 3e-2 "emulated CUDA cp 2 with selective recompute of attention and norms (bf16)"
if $PY tests/compare_runs.py "$TMP/emu-cp2" "$TMP/emu-cp2-recompute" --steps 4 --exact >"$TMP/emu-rc.cmp"; then
    ok "emulated CUDA cp 2: selective recompute (attention, norm) is the run without it bit for bit"
else bad "emulated CUDA cp 2 recompute differs from the run without: $(head -2 "$TMP/emu-rc.cmp" | tr '\n' ' ')"; fi
emu_same emu-docs-1 emu-docs-cp2 1e-5 1e-4 "emulated CUDA cp 2 ring, fp32, block-causal documents across chunks"
emu_same emu-tc-1 emu-tc-cp2 2e-3 3e-2 "emulated CUDA cp 2 ring, bf16 tensor-core parts (head dim 32), documents"
# sampling on the emulated CUDA backend under fp32 (under bf16 the part
# kernels' rounding is not cuDNN's, and a draw near a boundary may differ)
emu emu-smp-1 1 --set eval.sample_tokens=40 --set train.compute_dtype=fp32
emu emu-smp-cp2 2 --set eval.sample_tokens=40 --set train.compute_dtype=fp32 --set parallel.context=2
if [ "$(sample "$TMP/emu-smp-1.out" | wc -w)" -eq 104 ] && [ "$(sample "$TMP/emu-smp-1.out")" = "$(sample "$TMP/emu-smp-cp2.out")" ]; then
    ok "sampling on the emulated CUDA backend under cp 2 (fp32): 1 device's tokens, both samples"
else bad "emulated sampling under cp 2: $(sample "$TMP/emu-smp-cp2.out" | tail -1) vs $(sample "$TMP/emu-smp-1.out" | tail -1)"; fi

# the ring's bytes per step (docs/layouts.md): a k|v block is E = B (T/cp) 2
# (nkv/tp) hd elements, KVa = E act_bytes (4 on the CPU, 2 under CUDA's
# bf16) and its gradient KV4 = 4 E bytes; per layer and micro-batch the
# forward sends cp - 1 blocks, the backward cp - 1 blocks and cp gradients
# (the last one home): 2 (cp - 1) KVa + cp KV4, (3 cp - 2) KV on the CPU; a
# recomputed attention (all layers but the last) adds (cp - 1) KVa;
# all_gather: (cp - 1) KVa for each gather (forward, backward) and (cp - 1)
# KV4 for the gradients' reduce-scatter
if $PY - "$TMP" <<'PYEOF'
import json, sys
tmp = sys.argv[1]
L, B, T, hd, accum = 2, 2, 32, 16, 2
def want(cp, nkv, recompute=0, gather=False, ab=4):
    e = B * (T // cp) * 2 * nkv * hd
    per = (cp - 1) * (2 * e * ab + 4 * e) if gather else 2 * (cp - 1) * e * ab + cp * 4 * e
    return accum * (L * per + recompute * (L - 1) * (cp - 1) * e * ab)
cases = {"llama-cp2": want(2, 2), "llama-cp4": want(4, 2), "gpt2-cp2": want(2, 4), "llama-cp2-tp2-sp": want(2, 1),
         "llama-cp2-recompute": want(2, 2, 1), "llama-docs-cp4": want(4, 2),
         "llama-cp4-all-gather": want(4, 2, gather=True), "gpt2-docs-ag": want(2, 4, gather=True),
         "emu-cp2": want(2, 2, ab=2), "emu-cp2-ag": want(2, 2, gather=True, ab=2), "emu-docs-cp2": want(2, 2),
         "emu-tp2-cp2-sp": want(2, 1, ab=2), "emu-cp2-recompute": want(2, 2, 1, ab=2)}
for run, w in cases.items():
    got = [json.loads(l)["comm_bytes"].get("cp_sendrecv") for l in open(f"{tmp}/{run}/metrics.jsonl") if '"comm_bytes"' in l]
    if len(got) != (4 if run.startswith("emu") else 6) or any(g != w for g in got):
        sys.exit(f"{run}: want {w} a step, got {got}")
PYEOF
then ok "cp_sendrecv bytes per step are docs/layouts.md's (CPU, and the emulated NCCL's): ring 2 (cp - 1) KVa + cp KV4, all_gather (cp - 1) (2 KVa + KV4) a layer and micro-batch"
else bad "cp_sendrecv bytes differ from docs/layouts.md's count"; fi
if grep -qE '^step +6/6 .*comm [0-9.]+ MB \(.*cp 0\.[0-9]+\)' "$TMP/llama-cp2.out" &&
   grep -q "context group 0: ranks 0 1 2 3" "$TMP/llama-cp4.out" &&
   grep -qE "^health: cp all-reduce 1048576 over 4 ranks: [0-9.]+ GB/s" "$TMP/llama-cp4.out" &&
   grep -q "tp_rank 1  context group 1: ranks 5 7" "$TMP/llama-tp2-cp2-dp2.out"; then
    ok "the step line counts the ring (cp), the context groups are printed, the health check times them"
else bad "step line's cp bytes or the context groups missing: $(grep -m1 'context group' "$TMP/llama-tp2-cp2-dp2.out")"; fi

# activation bytes per rank fall with cp
acts() { $BIN check "$TMP/llama.json" --world "$1" --set parallel.context="$1" | grep -o 'activations_bytes [0-9]*' | cut -d' ' -f2; }
a1=$(acts 1) a2=$(acts 2) a4=$(acts 4)
if [ -n "$a4" ] && [ "$a2" -lt "$a1" ] && [ "$a4" -lt "$a2" ] &&
   $BIN check "$TMP/llama.json" --world 4 --set parallel.context=2 | grep -q "x context 2 (16 tokens of each sequence a rank) x data-parallel 2"; then
    ok "llmtrain check: activations_bytes $a1 (cp 1) > $a2 (cp 2) > $a4 (cp 4)"
else bad "llmtrain check's activation bytes under cp: $a1 $a2 $a4"; fi

# the shipped long-context job (configs/llama3.1_8b_128k_h100.json: Llama 3.1
# 8B, 131072 tokens, tp 4 x cp 4 x dp 4 on 64 H100 80GB): `llmtrain check`'s
# total a GPU (the layout's bytes and the CUDA scratch) is within 80 GB
# (74.5 GiB) as shipped and over it at cp 2 (docs/layouts.md's table)
gib() { $BIN check configs/llama3.1_8b_128k_h100.json --world "$1" --set parallel.context="$2" |
        sed -n 's/^on CUDA also (estimate): .* | total \([0-9.]*\) GiB$/\1/p'; }
g4=$(gib 64 4) g2=$(gib 32 2)
if [ -n "$g4" ] && [ -n "$g2" ] && awk -v a="$g4" -v b="$g2" 'BEGIN { exit !(a < 74.5 && b > 74.5) }'; then
    ok "Llama 3.1 8B at 131072 tokens: $g4 GiB a GPU at cp 4 fits in 80 GB, $g2 GiB at cp 2 does not"
else bad "Llama 3.1 8B at 131072 tokens: '$g4' GiB at cp 4, '$g2' GiB at cp 2 (expected < 74.5 and > 74.5)"; fi

# impossible layouts: one line, exit 2 (check, then a launch)
reject() { # name world message set-args...
    local name=$1 world=$2 msg=$3; shift 3
    $BIN check "$TMP/llama.json" --world "$world" "$@" >"$TMP/bad-$name.out" 2>&1
    local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/bad-$name.out")" -eq 1 ] && grep -q "$msg" "$TMP/bad-$name.out"; then ok "$name rejected: one line, exit 2"
    else bad "$name: rc=$rc $(head -2 "$TMP/bad-$name.out")"; fi
}
reject seq_len 3 "train.seq_len 32 is not divisible by 2 x parallel.context 3 = 6" --set parallel.context=3
reject world 6 "parallel.tensor 2 x parallel.context 2 = 4 does not divide the 6 ranks" --set parallel.context=2 --set parallel.tensor=2
reject cuda-hd 2 "head dim 264 (the CUDA attention parts take head dims up to 128" --set parallel.context=2 --set train.device=cuda \
    --set model.n_embd=528 --set model.n_head=2
reject shard 4 "parallel.shard_degree 3 does not divide the 4 data-parallel x context ranks" --set parallel.context=2 \
    --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=3
reject batch 4 "train.global_batch 6 is not divisible by train.micro_batch 2 x data-parallel ranks 2" --set parallel.context=2 \
    --set train.global_batch=6
$MPIRUN 2 $BIN "$TMP/llama.json" --set parallel.context=2 --set train.seq_len=30 --set log.dir="$TMP/bad-run" >"$TMP/bad-run.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c llmtrain "$TMP/bad-run.out")" -eq 1 ] && grep -q "not divisible by 2 x parallel.context 2 = 4" "$TMP/bad-run.out" &&
   [ ! -e "$TMP/bad-run/metrics.jsonl" ]; then ok "a launch of 2 ranks with seq_len 30 under cp 2: one line, exit 2"
else bad "bad launch: rc=$rc $(head -2 "$TMP/bad-run.out")"; fi

echo "$pass passed, $fail failed"
