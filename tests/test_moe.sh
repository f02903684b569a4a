#!/bin/bash
# Mixture of experts under every layout: a small Mixtral (8 experts, top-2)
# imported from a Hugging Face folder written here with a router far from
# uniform (the one-process run's moe_layer_load, max over mean tokens an
# expert, must be at least 1.8 in every layer and step: with top-2 of 8 its
# most is 4, and the least-chosen experts get no token in some micro-batch)
# trains as one process does, in losses, gradient norms and exported final
# weights: tp 2 with and without sequence parallelism, FULL_SHARD 2,
# HYBRID_SHARD (shard 2 x replicate 2), SHARD_GRAD_OP (ZeRO-2), NO_SHARD
# (DDP) 2 and 4 (the one process accumulates 4 micro-batches, 4 ranks 1
# each), cp 2 as a ring and all_gather, tp 2 x cp 2; activation
# checkpointing full, selective with mlp_act and norm (1 rank: bit for bit;
# under tp 2 sequence parallel), and offload (4 layers) bit for bit; bf16
# working weights under FULL_SHARD 2 against their own one-process run; a
# capacity factor under FULL_SHARD 2 against one process (choices dropped,
# the same counts). Resume: killed and resumed, bit for bit on 1 rank and
# FULL_SHARD 2; a FULL_SHARD 2 checkpoint resumed at 1 rank and at tp 2
# within the tolerance of the layouts.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1

# mixtral DIR LAYERS: a Mixtral folder (32 wide, 4 heads, 2 kv heads, 8
# experts of width 16, top-2, vocab 96, 16 tokens). Every token's
# embedding shares a small common part and the router's rows lean along it
# by steps from +0.6 to -0.8, so the low experts take most tokens and the
# high ones few or none, while each token's own part still picks among them.
mixtral() {
    $PY - "$@" <<'PYEOF'
import sys, numpy as np
sys.path.insert(0, "tests")
import hfio
out, L = sys.argv[1], int(sys.argv[2])
V, C, NH, NKV, F, E, K, T = 96, 32, 4, 2, 16, 8, 2, 16
rng = np.random.default_rng(7)
rnd = lambda *s, std: (rng.standard_normal(s) * std).astype(np.float32)
u = np.ones(C, np.float32) / np.sqrt(C)
t = {"model.embed_tokens.weight": rnd(V, C, std=0.3) + 0.1, "lm_head.weight": rnd(V, C, std=0.1),
     "model.norm.weight": 1 + rnd(C, std=0.1)}
for i in range(L):
    h = f"model.layers.{i}."
    t[h + "input_layernorm.weight"] = 1 + rnd(C, std=0.1)
    t[h + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.1)
    for n, r in (("q", NH), ("k", NKV), ("v", NKV)):
        t[h + f"self_attn.{n}_proj.weight"] = rnd(r * C // NH, C, std=0.2)
    t[h + "self_attn.o_proj.weight"] = rnd(C, C, std=0.2)
    lean = np.linspace(0.6, -0.8, E).astype(np.float32)[:, None]
    t[h + "block_sparse_moe.gate.weight"] = rnd(E, C, std=0.4) + lean * u[None, :]
    for e in range(E):
        x = h + f"block_sparse_moe.experts.{e}."
        t[x + "w1.weight"], t[x + "w3.weight"], t[x + "w2.weight"] = rnd(F, C, std=0.2), rnd(F, C, std=0.2), rnd(C, F, std=0.2)
cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": C, "intermediate_size": F,
       "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "vocab_size": V,
       "max_position_embeddings": T, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "num_local_experts": E, "num_experts_per_tok": K, "router_aux_loss_coef": 0.01, "sliding_window": None,
       "hidden_act": "silu"}
hfio.write_hf_folder(out, cfg, t)
PYEOF
}
mixtral "$TMP/mix2" 2
mixtral "$TMP/mix4" 4

# job NAME FOLDER: 6 steps of 8 sequences of 16 tokens in micro-batches of
# 2 from FOLDER, with the z-loss on and validation at steps 3 and 6
job() {
    cat >"$TMP/$1.json" <<EOF
{"model": {"arch": "llama", "vocab_size": 96, "max_seq_len": 16},
 "init": {"from": "$2"},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/train.bin"},
 "train": {"steps": 6, "seq_len": 16, "micro_batch": 2, "global_batch": 8, "moe_z_loss_coef": 0.001},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 0, "batches": 2, "every_steps": 3},
 "parallel": {"health_check": false}}
EOF
}
job mix2 "$TMP/mix2"
job mix4 "$TMP/mix4"

# same REF NAME WHAT [compare_runs options]: NAME's losses, norms, val
# losses and exported weights are REF's (within the layouts' tolerance
# unless the options say otherwise)
same() {
    local ref=$1 name=$2 what=$3; shift 3
    [ $# -eq 0 ] && set -- --loss-rtol 1e-5 --weight-rtol 1e-3
    if [ -s "$TMP/$ref/hf/model.safetensors" ] && [ -s "$TMP/$name/hf/model.safetensors" ] &&
        $PY tests/compare_runs.py "$TMP/$ref" "$TMP/$name" --steps 6 "$@" >"$TMP/$name.cmp" &&
        grep -q '"val_loss"' "$TMP/$name/metrics.jsonl"; then
        ok "$what matches $ref (losses, norms, val losses, weights)"
    else
        bad "$what differs from $ref: $(head -2 "$TMP/$name.cmp" 2>/dev/null | tr '\n' ' ') $([ -s "$TMP/$name/hf/model.safetensors" ] || echo "(no export)")"
    fi
}

layout_run one mix2 1
# the routing is far from uniform in every layer and step, and the MoE
# statistics are logged per MoE layer
if $PY - "$TMP/one/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
loads = [x for r in rows for x in r["moe_layer_load"]]
print(f"moe_layer_load from {min(loads):.2f} to {max(loads):.2f} over {len(rows)} steps")
sys.exit(0 if len(rows) == 6 and all(len(r["moe_layer_load"]) == 2 for r in rows) and min(loads) >= 1.8 else 1)
PYEOF
then ok "one process: the router is far from uniform (moe_layer_load >= 1.8 of at most 4, 2 MoE layers, every step)"
else bad "one process: routing not skewed enough, or moe_layer_load missing"; fi

while read -r name np sets; do
    layout_run "$name" mix2 "$np" $sets
    same one "$name" "$name ($np ranks)"
done <<EOF
tp2 2 --set parallel.tensor=2
tp2-sp 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
full-shard 2 --set parallel.strategy=FULL_SHARD
hybrid-2x2 4 --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=2
zero2 2 --set parallel.strategy=SHARD_GRAD_OP
ddp2 2 --set parallel.strategy=NO_SHARD
ddp4-accum1 4 --set parallel.strategy=NO_SHARD
cp2-ring 2 --set parallel.context=2
cp2-all-gather 2 --set parallel.context=2 --set parallel.context_mode=all_gather
tp2-cp2 4 --set parallel.tensor=2 --set parallel.context=2 --set parallel.sequence_parallel=true
tp2-sp-selective 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set train.activation_checkpointing=selective --set train.recompute_modules=mlp_act,norm
EOF

# recompute and offload redo or move the same arithmetic: bit for bit
layout_run ckpt-full mix2 1 --set train.activation_checkpointing=full
same one ckpt-full "activation checkpointing full (1 rank)" --exact
layout_run ckpt-sel mix2 1 --set train.activation_checkpointing=selective --set train.recompute_modules=mlp_act,norm
same one ckpt-sel "selective checkpointing mlp_act,norm (1 rank)" --exact
layout_run one4 mix4 1
layout_run offload4 mix4 1 --set train.activation_offload=true
if grep -q "rank 0: .* offload_host_bytes [1-9]" "$TMP/offload4.out"; then same one4 offload4 "activation offload, 4 layers (1 rank)" --exact
else bad "activation offload: no offload_host_bytes in the run's layout lines"; fi

# bf16 working weights: FULL_SHARD 2 against its own one-process run
# (test_bf16.sh's tolerance for a bf16 layout change)
layout_run bf16-one mix2 1 --set train.param_dtype=bf16
layout_run bf16-full-shard mix2 2 --set train.param_dtype=bf16 --set parallel.strategy=FULL_SHARD
same bf16-one bf16-full-shard "bf16 working weights FULL_SHARD 2" --loss-rtol 1e-4 --weight-rtol 1e-2

# a capacity: each rank's micro-batch drops the same choices as one process's
layout_run cap-one mix2 1 --set train.moe_capacity_factor=1.0
layout_run cap-full-shard mix2 2 --set train.moe_capacity_factor=1.0 --set parallel.strategy=FULL_SHARD
same cap-one cap-full-shard "capacity factor 1.0 under FULL_SHARD 2"
if $PY - "$TMP/cap-one/metrics.jsonl" "$TMP/cap-full-shard/metrics.jsonl" "$TMP/one/metrics.jsonl" <<'PYEOF'
import json, sys
rd = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l]
a, b, free = rd(sys.argv[1]), rd(sys.argv[2]), rd(sys.argv[3])
da, db = [r["moe_dropped"] for r in a], [r["moe_dropped"] for r in b]
print(f"dropped choices a step: {da} (FULL_SHARD 2: {db}); dropless: {[r['moe_dropped'] for r in free]}")
sys.exit(0 if da == db and min(da) > 0 and all(r["moe_dropped"] == 0 for r in free) and a[0]["loss"] != free[0]["loss"] else 1)
PYEOF
then ok "capacity 1.0: choices dropped every step, the same counts under FULL_SHARD 2, none dropless, and the loss moves"
else bad "capacity drops differ between layouts or are absent"; fi

# ---- resume: killed at step 5 after a checkpoint at step 3 ----
for layout in "1" "2 --set parallel.strategy=FULL_SHARD"; do
    read -r np rest <<<"$layout"
    tag=resume-np$np
    # shellcheck disable=SC2086
    layout_run "$tag-ref" mix2 "$np" $rest --set checkpoint.every_steps=3
    cut=$TMP/$tag-cut
    cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    # shellcheck disable=SC2086
    (LLMTRAIN_FAULT="rank=$((np - 1)),step=5,kind=die" $cmd "$TMP/mix2.json" --set log.dir="$cut" --set checkpoint.dir="$cut/ckpt" \
        --set checkpoint.every_steps=3 --set checkpoint.async=false $rest </dev/null >"$cut.out" 2>&1) 2>/dev/null
    rc1=$?
    # shellcheck disable=SC2086
    $cmd "$TMP/mix2.json" --set log.dir="$cut" --set checkpoint.dir="$cut/ckpt" --set checkpoint.every_steps=3 $rest </dev/null >>"$cut.out" 2>&1
    rc2=$?
    $BIN export "$cut/ckpt" "$cut/hf" >/dev/null 2>&1
    if [ $rc1 -ne 0 ] && [ $rc2 -eq 0 ] && grep -q "resume: .*step_00000003 at step 3" "$cut.out"; then
        same "$tag-ref" "$tag-cut" "MoE $np rank(s) ${rest:+($rest) }killed at step 5, resumed from step 3, bit for bit:" --exact
    else bad "MoE $tag: rc $rc1/$rc2; $(grep -E 'resume|llmtrain:' "$cut.out" | head -3)"; fi
done
# across layouts: FULL_SHARD 2's step-3 checkpoint resumed at 1 rank and at tp 2
for to in "1" "2 --set parallel.tensor=2"; do
    read -r np rest <<<"$to"
    name=reshard-np$np${rest:+-tp2}
    mkdir -p "$TMP/$name/ckpt"
    cp -r "$TMP/resume-np2-ref/ckpt/step_00000003" "$TMP/$name/ckpt/"
    # shellcheck disable=SC2086
    layout_run "$name" mix2 "$np" $rest --set checkpoint.every_steps=3
    if grep -q "resume: .*step_00000003 at step 3 (written by 2 ranks" "$TMP/$name.out"; then
        $PY - "$TMP/$name/metrics.jsonl" <<'PYEOF' || bad "$name: metrics.jsonl does not start at step 4"
import json, sys
s = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
sys.exit(0 if s == [4, 5, 6] else 1)
PYEOF
        # the steps it ran (4-6) against the uninterrupted one-process run's
        if $PY tests/compare_runs.py "$TMP/one" "$TMP/$name" --loss-rtol 1e-5 --weight-rtol 1e-3 >"$TMP/$name.cmp"; then
            ok "MoE FULL_SHARD 2's step 3 resumed at $np rank(s)${rest:+ tp 2}: steps 4-6 and the weights match one process"
        else bad "MoE $name differs: $(head -2 "$TMP/$name.cmp" | tr '\n' ' ')"; fi
    else bad "MoE $name: did not resume from FULL_SHARD 2's step 3: $(grep -E 'resume|llmtrain:' "$TMP/$name.out" | head -2)"; fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
