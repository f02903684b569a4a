#!/bin/bash
# Activation checkpointing (train.activation_checkpointing): selective
# (recompute attention probabilities) and full (recompute each layer from its
# input) give bit-identical losses, gradient norms and final weights to
# keeping every activation, for GPT-2, Llama (GQA) and a Qwen3-shaped Llama
# (head_dim 12 at n_embd 32 and 4 heads, QK-norm), on one rank, under
# tensor parallelism (the recompute repeats its all-reduces) and under
# FULL_SHARD (the recompute runs inside the per-layer gather); and the
# activation bytes per rank fall none > selective > full. The LM head in
# chunks (train.lm_head_chunk 7: 64 rows in 10 chunks, the last short)
# matches the unchunked run within reduction order (the LM head's weight
# gradient is summed chunk by chunk) and keeps fewer activation bytes; with
# the same weights (lr 0) its greedy sample, read from the last chunk's
# logits, is the same; debug.dump needs it off. Attention keeps O(T) per
# head (the log-sum-exp, not the T x T probabilities): the same tokens per
# micro-batch as 1 x 512 or 8 x 64 take the same activation bytes.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
for arch in gpt2 llama qwen3; do # qwen3: the Llama with heads of 12 (not 32 / 4) and QK-norm
    case $arch in
    gpt2) shape='"arch": "gpt2", "n_layer": 3, "n_embd": 32, "n_head": 4' ;;
    llama) shape='"arch": "llama", "n_layer": 3, "n_embd": 32, "n_head": 4, "n_kv_head": 2' ;;
    qwen3) shape='"arch": "llama", "n_layer": 3, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "head_dim": 12, "qk_norm": true' ;;
    esac
    cat >"$TMP/$arch.json" <<EOF2
{"model": {$shape, "vocab_size": 96, "max_seq_len": 32},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 6, "seq_len": 32, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 0}}
EOF2
    for layout in "1" "2 --set parallel.tensor=2" "2 --set parallel.strategy=FULL_SHARD"; do
        read -r np rest <<<"$layout"
        tag=$arch-np$np-$(echo "$rest" | tr -dc 'a-zA-Z0-9_')
        for mode in none selective full norm_act all; do
            cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
            case $mode in # train.recompute_modules: a string of names, a JSON list
                norm_act) ck=(--set train.activation_checkpointing=selective --set "train.recompute_modules=norm,mlp_act") ;;
                all) ck=(--set train.activation_checkpointing=selective --set 'train.recompute_modules=["mlp_act", "attention", "norm"]') ;;
                *) ck=(--set train.activation_checkpointing=$mode) ;;
            esac
            $cmd "$TMP/$arch.json" $rest "${ck[@]}" --set log.dir="$TMP/$tag-$mode" \
                >"$TMP/$tag-$mode.out" 2>&1 || echo "  $tag $mode exited non-zero: $(tail -2 "$TMP/$tag-$mode.out")"
            $BIN export "$TMP/$tag-$mode/checkpoints" "$TMP/$tag-$mode/hf" >/dev/null 2>&1
        done
        # the header's batch line names what the backward recomputes
        hdr=$(grep -h "^batch: " "$TMP/$tag-none.out" "$TMP/$tag-selective.out" "$TMP/$tag-norm_act.out" "$TMP/$tag-all.out" "$TMP/$tag-full.out" |
              grep -o "| [a-z]* activation checkpointing.*" | tr '\n' ';')
        if [ "$hdr" = "| selective activation checkpointing (attention);| selective activation checkpointing (norm, mlp_act);| selective activation checkpointing (attention, norm, mlp_act);| full activation checkpointing;" ]; then
            echo "ok   $arch np $np ${rest:-} the batch line names the checkpointing: $hdr"; pass=$((pass + 1))
        else echo "FAIL $arch np $np ${rest:-} the batch lines name '$hdr'"; fail=$((fail + 1)); fi
        for mode in selective full norm_act all; do
            if $PY tests/compare_runs.py "$TMP/$tag-none" "$TMP/$tag-$mode" --steps 6 --exact; then
                echo "ok   $arch np $np ${rest:-} $mode: bit-identical to none"; pass=$((pass + 1))
            else
                echo "FAIL $arch np $np ${rest:-} $mode differs from none"; fail=$((fail + 1))
            fi
        done
        cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
        $cmd "$TMP/$arch.json" $rest --set train.lm_head_chunk=7 --set log.dir="$TMP/$tag-chunk" >"$TMP/$tag-chunk.out" 2>&1
        $BIN export "$TMP/$tag-chunk/checkpoints" "$TMP/$tag-chunk/hf" >/dev/null 2>&1
        # weights 1e-3: GPT-2's key bias has an exactly-zero true gradient whose round-off Adam amplifies (test_ddp.sh)
        if $PY tests/compare_runs.py "$TMP/$tag-none" "$TMP/$tag-chunk" --steps 6 --loss-rtol 1e-5 --weight-rtol 1e-3; then
            echo "ok   $arch np $np ${rest:-} lm_head_chunk 7: losses, norms and weights match the unchunked run"; pass=$((pass + 1))
        else
            echo "FAIL $arch np $np ${rest:-} lm_head_chunk 7 differs from the unchunked run"; fail=$((fail + 1))
        fi
        acts() { grep -o "rank 0: .*activations_bytes [0-9]*" "$TMP/$tag-$1.out" | awk '{print $NF}'; }
        a0=$(acts none); ac=$(acts chunk)
        if [ -n "$ac" ] && [ "$ac" -lt "$a0" ]; then
            echo "ok   $arch np $np ${rest:-} activations_bytes with lm_head_chunk 7: $ac < $a0"; pass=$((pass + 1))
        else echo "FAIL $arch np $np activations_bytes with lm_head_chunk: '$ac' vs '$a0'"; fail=$((fail + 1)); fi
        a0=$(acts none); a1=$(acts selective); a2=$(acts full); a3=$(acts norm_act); a4=$(acts all)
        if [ -n "$a0" ] && [ "$a0" -gt "$a1" ] && [ "$a1" -gt "$a3" ] && [ "$a3" -gt "$a4" ] && [ "$a4" -gt "$a2" ]; then
            echo "ok   $arch np $np ${rest:-} activations_bytes none $a0 > selective $a1 > norm,mlp_act $a3 > all three $a4 > full $a2"; pass=$((pass + 1))
        else
            echo "FAIL $arch np $np activations_bytes none '$a0' selective '$a1' norm,mlp_act '$a3' all three '$a4' full '$a2'"; fail=$((fail + 1))
        fi
    done
done
# attention memory linear in T: [B, nh, T, T] probabilities would make 1 x 512 cost
# 8x the attention bytes of 8 x 64 (a difference of 7 MB here)
for bt in "8 64" "1 512"; do
    read -r b t <<<"$bt"
    $BIN check "$TMP/llama.json" --set model.max_seq_len=512 --set train.seq_len=$t --set train.micro_batch=$b \
        --set train.global_batch=$b 2>&1 | grep -o "activations_bytes [0-9]*" | awk '{print $2}' >"$TMP/act-$b"
done
a8=$(cat "$TMP/act-8"); a1=$(cat "$TMP/act-1")
if [ -n "$a8" ] && [ "$a8" = "$a1" ]; then echo "ok   activations_bytes 8 x 64 = 1 x 512 = $a1 (attention O(T) per head)"; pass=$((pass + 1))
else echo "FAIL activations_bytes 8 x 64 '$a8' vs 1 x 512 '$a1'"; fail=$((fail + 1)); fi
# train.recompute_modules: what each module frees, counted exactly by
# `llmtrain check` (no training) on the CPU (fp32) and for CUDA under bf16
# ([a] buffers at 2 bytes): every layer but the first (whose buffers the
# others share) drops norm's two outputs (N x C, [a]) with their rstd (and
# GPT-2's mean, N floats each), mlp_act the MLP activation (N x F, [a]);
# N = 2 x 32 rows, C 32, F 256 (Llama) or 128 (GPT-2): all multiples of 16
# floats, so no padding enters
for arch in gpt2 llama; do
    F=256; stats=1; [ $arch = gpt2 ] && { F=128; stats=2; }
    for dev in cpu:4 cuda:2; do
        a=${dev#*:}
        got=""; want=""
        base=$($BIN check "$TMP/$arch.json" --set train.device=${dev%:*} 2>&1 | grep -o "activations_bytes [0-9]*" | awk '{print $2}')
        for mods in norm mlp_act "norm mlp_act"; do
            n=$($BIN check "$TMP/$arch.json" --set train.device=${dev%:*} --set train.activation_checkpointing=selective \
                --set "train.recompute_modules=$mods" 2>&1 | grep -o "activations_bytes [0-9]*" | awk '{print $2}')
            w=0
            case "$mods" in *norm*) w=$((w + 2 * (64 * 32 * a + stats * 64 * 4))) ;; esac
            case "$mods" in *mlp_act*) w=$((w + 64 * F * a)) ;; esac
            got="$got $((base - n))"; want="$want $((2 * w))"
        done
        if [ -n "$base" ] && [ "$got" = "$want" ]; then
            echo "ok   $arch ${dev%:*} recompute_modules norm / mlp_act / both free exactly$got activation bytes"; pass=$((pass + 1))
        else echo "FAIL $arch ${dev%:*} recompute_modules frees$got bytes, expected$want (base '$base')"; fail=$((fail + 1)); fi
    done
done
# Megatron's names: core_attn and layernorm are attention and norm (the same
# activation bytes and batch line as those names)
for arch in gpt2 llama; do
    meg=$($BIN check "$TMP/$arch.json" --set train.activation_checkpointing=selective \
          --set 'train.recompute_modules=["core_attn", "layernorm"]' 2>&1 | grep -E "activations_bytes|^batch")
    own=$($BIN check "$TMP/$arch.json" --set train.activation_checkpointing=selective \
          --set "train.recompute_modules=attention,norm" 2>&1 | grep -E "activations_bytes|^batch")
    if [ -n "$own" ] && [ "$meg" = "$own" ] && grep -q "(attention, norm)" <<<"$own"; then
        echo "ok   $arch recompute_modules core_attn, layernorm = attention, norm (Megatron's names)"; pass=$((pass + 1))
    else echo "FAIL $arch recompute_modules core_attn, layernorm: '$meg' vs '$own'"; fail=$((fail + 1)); fi
done
# bad train.recompute_modules: one line, exit 2, naming the key and what was expected
rc_bad() { # EXPECTED_TEXT ARGS...
    local want=$1; shift
    $BIN check "$TMP/llama.json" "$@" >"$TMP/rcbad.out" 2>&1; local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/rcbad.out")" -eq 1 ] && grep -qF -- "$want" "$TMP/rcbad.out"; then
        echo "ok   recompute_modules $*: $(cat "$TMP/rcbad.out")"; pass=$((pass + 1))
    else echo "FAIL recompute_modules $*: rc $rc: $(cat "$TMP/rcbad.out") (expected: $want)"; fail=$((fail + 1)); fi
}
rc_bad 'train.recompute_modules: "mlp" is not one of attention|norm|mlp_act (got "norm mlp")' \
    --set train.activation_checkpointing=selective --set "train.recompute_modules=norm mlp"
rc_bad 'train.recompute_modules: expected at least one of attention|norm|mlp_act, got []' \
    --set train.activation_checkpointing=selective --set "train.recompute_modules=[]"
rc_bad 'train.recompute_modules: expected a list of strings (names from attention|norm|mlp_act), got ["norm",3]' \
    --set train.activation_checkpointing=selective --set 'train.recompute_modules=["norm", 3]'
rc_bad 'train.recompute_modules is set but train.activation_checkpointing is "full" (it applies only with "selective")' \
    --set train.activation_checkpointing=full --set train.recompute_modules=norm
rc_bad 'train.recompute_modules is set but train.activation_checkpointing is "none" (it applies only with "selective")' \
    --set train.recompute_modules=attention
# the sample reads the last chunk's logits: the same text as unchunked with the same weights
for layout in "1" "2 --set parallel.tensor=2"; do
    read -r np rest <<<"$layout"
    cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    for ch in 0 5; do
        $cmd "$TMP/llama.json" $rest --set train.steps=1 --set optim.warmup_steps=0 --set optim.lr=0 --set eval.sample_tokens=12 --set eval.temperature=0 \
            --set train.lm_head_chunk=$ch --set log.dir="$TMP/s$np-$ch" >"$TMP/s$np-$ch.out" 2>&1
    done
    a=$(sed -n '/^--- sample ---$/,/^-----*$/p' "$TMP/s$np-0.out"); b=$(sed -n '/^--- sample ---$/,/^-----*$/p' "$TMP/s$np-5.out")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   np $np ${rest:-} greedy sample identical with lm_head_chunk 5"; pass=$((pass + 1))
    else echo "FAIL np $np sample with lm_head_chunk 5: '$b' vs '$a'"; fail=$((fail + 1)); fi
done
$BIN "$TMP/llama.json" --set train.lm_head_chunk=4 --set debug.dump="$TMP/dump" >"$TMP/dd.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/dd.out")" -eq 1 ] &&
   grep -q "debug.dump writes the whole micro-batch's logits, but the LM head takes 4 of its 64 rows at a time (train.lm_head_chunk 4; expected at least 64, or 0 with the logits within 2048 MiB)" "$TMP/dd.out"; then
    echo "ok   debug.dump with lm_head_chunk: one line, exit 2"; pass=$((pass + 1))
else echo "FAIL debug.dump with lm_head_chunk: rc $rc $(cat "$TMP/dd.out")"; fail=$((fail + 1)); fi
# train.lm_head_chunk 0 (the default) chunks the LM head only where the
# micro-batch's logits would pass 2 GiB: GPT-2 124M's at B 16, T 1024
# (vocabulary 50304) take 1.5 GiB under CUDA's bf16 and 3.1 GiB in the CPU's
# fp32, so the CPU job takes 2 chunks of 8192 rows (the header says so) and
# holds exactly half of the logits' bytes fewer than with lm_head_chunk
# 16384; the CUDA job holds them whole, as with 16384
g124='{"model": {"arch": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50304, "max_seq_len": 1024},
 "data": {"train": "'$TMP/train.bin'"}, "train": {"seq_len": 1024, "micro_batch": 16, "global_batch": 16}}'
echo "$g124" >"$TMP/g124.json"
chk() { $BIN check "$TMP/g124.json" --set train.device=$1 --set train.lm_head_chunk=$2 2>&1; }
act() { grep -o "activations_bytes [0-9]*" <<<"$1" | awk '{print $2}'; }
c0=$(chk cpu 0); c1=$(chk cpu 16384); g0=$(chk cuda 0); g1=$(chk cuda 16384)
if grep -q "^batch: .* | lm head 8192 rows at a time (1572 MiB of logits)$" <<<"$c0" &&
   [ "$(act "$c1")" = "$(( $(act "$c0") + 8192 * 50304 * 4 ))" ] &&
   ! grep -q "lm head" <<<"$g0$c1" && [ -n "$(act "$g0")" ] && [ "$(act "$g0")" = "$(act "$g1")" ]; then
    echo "ok   lm_head_chunk 0: GPT-2 124M at 16 x 1024 in fp32 takes 2 chunks of 8192 rows ($(act "$c0") activation bytes, $(act "$c1") whole), in bf16 one"; pass=$((pass + 1))
else echo "FAIL lm_head_chunk 0: cpu '$(grep -o 'lm head.*' <<<"$c0")' $(act "$c0") vs $(act "$c1"); cuda $(act "$g0") vs $(act "$g1")"; fail=$((fail + 1)); fi
# under context parallelism a rank's micro-batch is micro_batch x seq_len / cp
# rows: cp 2 halves GPT-2 124M's 16 x 1024 to 8192 rows, which the fp32 head
# takes whole (no "lm head" note), while lm_head_chunk 4096 takes 2 chunks
p0=$($BIN check "$TMP/g124.json" --world 2 --set parallel.context=2 --set train.device=cpu 2>&1)
p1=$($BIN check "$TMP/g124.json" --world 2 --set parallel.context=2 --set train.device=cpu --set train.lm_head_chunk=4096 2>&1)
if grep -q "^batch: .*context parallel 2: 512 tokens of each sequence a rank" <<<"$p0" && ! grep -q "lm head" <<<"$p0" &&
   grep -q "^batch: .* | lm head 4096 rows at a time (786 MiB of logits)$" <<<"$p1"; then
    echo "ok   cp 2: the rank's whole 8192-row micro-batch is not called a chunk; 4096 rows is"; pass=$((pass + 1))
else echo "FAIL cp 2 lm head: '$(grep -o 'context parallel.*' <<<"$p0")' / '$(grep -o 'lm head.*' <<<"$p1")'"; fail=$((fail + 1)); fi
$BIN "$TMP/llama.json" --set train.activation_checkpointing=some >"$TMP/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "train.activation_checkpointing" "$TMP/bad.out" && [ "$(wc -l <"$TMP/bad.out")" -eq 1 ]; then
    echo "ok   an unknown mode is one line, exit 2"; pass=$((pass + 1))
else echo "FAIL unknown mode: rc $rc $(cat "$TMP/bad.out")"; fail=$((fail + 1)); fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
