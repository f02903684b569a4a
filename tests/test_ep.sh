#!/bin/bash
# Expert parallelism (parallel.expert): a Mixtral-shaped model (8 experts,
# top-2, a router far from uniform, imported from a Hugging Face folder
# written here) trains the same model as one process under ep 2 and 4 and
# with every other layout beside it: FULL_SHARD, HYBRID_SHARD, ZeRO-2, tp 2
# with sequence parallelism, cp 2, gradient accumulation, activation
# checkpointing (full, selective), offload, bf16 working weights and a
# capacity factor; the losses, grad norms, aux losses, loads and exported
# weights (tests/compare_runs.py). Some expert gets no token in some
# micro-batch (checked on the reference routing), so a rank with nothing to
# compute still takes part in every all-to-all. The all-to-all bytes are
# counted, resume across ep degrees keeps the losses, and impossible expert
# layouts are one line each.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
$PY - "$TMP" <<'PYEOF'
import sys, os, torch
sys.path.insert(0, "tests")
import hfio, torch_ref as R
d = sys.argv[1]
L, C, NH, NKV, E, K, F, V, T = 4, 32, 4, 2, 8, 2, 16, 96, 16
cfg = R.llama_config(L, C, NH, NKV, F, V, T)
cfg.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": E,
            "num_experts_per_tok": K, "router_aux_loss_coef": 0.02, "sliding_window": None})
g = torch.Generator().manual_seed(3)
r = lambda *s, std=0.1: torch.randn(*s, generator=g) * std
t = {"model.embed_tokens.weight": r(V, C, std=0.5), "lm_head.weight": r(V, C), "model.norm.weight": 1 + r(C)}
for i in range(L):
    h = f"model.layers.{i}."
    t[h + "input_layernorm.weight"] = 1 + r(C); t[h + "post_attention_layernorm.weight"] = 1 + r(C)
    for n, rows in (("q", C), ("k", C // 2), ("v", C // 2), ("o", C)):
        t[h + f"self_attn.{n}_proj.weight"] = r(rows, C, std=0.2)
    t[h + "block_sparse_moe.gate.weight"] = r(E, C, std=2.0)  # far from uniform
    for e in range(E):
        x = h + f"block_sparse_moe.experts.{e}."
        t[x + "w1.weight"] = r(F, C, std=0.2); t[x + "w3.weight"] = r(F, C, std=0.2); t[x + "w2.weight"] = r(C, F, std=0.2)
hfio.write_hf_folder(os.path.join(d, "hf"), cfg, t)
PYEOF
cat >"$TMP/ep.json" <<EOF
{"init": {"from": "$TMP/hf"},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/train.bin"},
 "train": {"steps": 6, "seq_len": 16, "micro_batch": 2, "global_batch": 8, "moe_z_loss_coef": 0.001},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "decay_steps": 6, "grad_clip": 0.5},
 "eval": {"sample_tokens": 4, "batches": 4, "every_steps": 3},
 "checkpoint": {"every_steps": 6}}
EOF

# run NAME NP SET_ARGS...: one run into $TMP/NAME, its export in $TMP/NAME/hf
run() {
    local name=$1 np=$2 cmd; shift 2
    if [ "$np" = 1 ]; then cmd="$BIN"; else cmd="$MPIRUN $np $BIN"; fi
    if ! $cmd "$TMP/ep.json" --set log.dir="$TMP/$name" --set checkpoint.dir="$TMP/$name/ckpt" "$@" >"$TMP/$name.out" 2>&1; then
        bad "$name exited non-zero: $(grep -v '^ ' "$TMP/$name.out" | tail -2 | tr '\n' ' ')"; return 1
    fi
    $BIN export "$TMP/$name/ckpt" "$TMP/$name/hf" >/dev/null
}
# same NAME REF: NAME's metrics and weights are REF's
same() {
    if $PY tests/compare_runs.py "$TMP/$2" "$TMP/$1" --steps 6 --loss-rtol 1e-5 --norm-rtol 1e-4 --weight-rtol 1e-4 \
        >"$TMP/cmp.out" 2>&1; then ok "$1 trains what $2 does"
    else bad "$1 differs from $2: $(head -3 "$TMP/cmp.out" | tr '\n' ' ')"; fi
}

run one 1
# the routing is far from uniform, and some expert of some layer gets no token of a micro-batch
$PY - "$TMP" <<'PYEOF' >"$TMP/routing.out"
import sys, json, torch
sys.path.insert(0, "tests")
import hfio, torch_ref as R
d = sys.argv[1]
cfg, t = hfio.read_hf_folder(d + "/hf")
t = {n: torch.as_tensor(v, dtype=torch.float64) for n, v in t.items()}
import numpy as np
tok = np.fromfile(d + "/train.bin", dtype="<u2", offset=1024).astype(np.int64)
x, _ = R.global_batch(tok, 0, 8, 16)
empty = 0
for j in range(4):  # each micro-batch of 2 sequences of the first step
    h = t["model.embed_tokens.weight"][x[2 * j:2 * j + 2]]
    cos, sin = R.rope_cos_sin(16, 8, 10000.0, torch.float64)
    for i in range(4):
        p = f"model.layers.{i}."
        a = R.rms_norm(h, t[p + "input_layernorm.weight"], 1e-5)
        q, k, v = (a @ t[p + f"self_attn.{n}_proj.weight"].t() for n in "qkv")
        q = R.apply_rope(q.view(2, 16, 4, 8).transpose(1, 2), cos, sin)
        k = R.apply_rope(k.view(2, 16, 2, 8).transpose(1, 2), cos, sin)
        v = v.view(2, 16, 2, 8).transpose(1, 2)
        y = R.causal_attention(q, R.repeat_kv(k, 2), R.repeat_kv(v, 2)).transpose(1, 2).reshape(2, 16, 32)
        h = h + y @ t[p + "self_attn.o_proj.weight"].t()
        a = R.rms_norm(h, t[p + "post_attention_layernorm.weight"], 1e-5).reshape(-1, 32)
        pr = torch.softmax(a @ t[p + "block_sparse_moe.gate.weight"].t(), -1)
        tv, ti = pr.topk(2, -1)
        cnt = torch.bincount(ti.reshape(-1), minlength=8)
        empty += int((cnt == 0).sum())
        w = tv / tv.sum(-1, keepdim=True)
        out = torch.zeros_like(a)
        for e in range(8):
            ex = p + f"block_sparse_moe.experts.{e}."
            ye = (R.silu(a @ t[ex + "w1.weight"].t()) * (a @ t[ex + "w3.weight"].t())) @ t[ex + "w2.weight"].t()
            out = out + ((ti == e) * w).sum(-1, keepdim=True) * ye
        h = h + out.view(2, 16, 32)
print(empty)
PYEOF
empty=$(cat "$TMP/routing.out")
load=$($PY -c "import json; print(json.loads(open('$TMP/one/metrics.jsonl').readline())['moe_load'])")
if [ "${empty:-0}" -gt 0 ] && $PY -c "import sys; sys.exit(not $load > 1.5)"; then
    ok "the routing is far from uniform (load $load) and $empty (layer, micro-batch, expert)s of step 1 get no token"
else bad "routing not skewed enough to test: load $load, empty experts '${empty}'"; fi

run ep2 2 --set parallel.expert=2 && same ep2 one
run ep4 4 --set parallel.expert=4 && same ep4 one
run ep2x2 4 --set parallel.expert=2 && same ep2x2 one
run ep2-full 2 --set parallel.expert=2 --set parallel.strategy=FULL_SHARD && same ep2-full one
run ep4-full 4 --set parallel.expert=4 --set parallel.strategy=FULL_SHARD && same ep4-full one
run ep2-hybrid 4 --set parallel.expert=2 --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=2 && same ep2-hybrid one
run ep2-zero2 2 --set parallel.expert=2 --set parallel.strategy=SHARD_GRAD_OP && same ep2-zero2 one
run ep2-tp2 4 --set parallel.expert=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true && same ep2-tp2 one
run ep2-cp2 4 --set parallel.expert=2 --set parallel.context=2 && same ep2-cp2 one
run ep4-cp2 4 --set parallel.expert=4 --set parallel.context=2 && same ep4-cp2 one
run accum 1 --set train.micro_batch=1
run ep2-accum 2 --set parallel.expert=2 --set train.micro_batch=1 && same ep2-accum accum
run ep2-full-ckpt 2 --set parallel.expert=2 --set train.activation_checkpointing=full && same ep2-full-ckpt one
run ep2-sel 2 --set parallel.expert=2 --set train.activation_checkpointing=selective \
    --set train.recompute_modules=attention,norm,mlp_act && same ep2-sel one
run ep2-offload 2 --set parallel.expert=2 --set train.activation_offload=true && same ep2-offload one
run bf16 1 --set train.param_dtype=bf16
run ep2-bf16 2 --set parallel.expert=2 --set train.param_dtype=bf16 --set parallel.strategy=FULL_SHARD && same ep2-bf16 bf16
run cap 1 --set train.moe_capacity_factor=1.0
run ep2-cap 2 --set parallel.expert=2 --set train.moe_capacity_factor=1.0 && same ep2-cap cap

# the all-to-all is counted: ep 2 moves bytes, and the step line says how many
a2a=$(grep -o '"a2a":[0-9.e+]*' "$TMP/ep2/metrics.jsonl" | head -1 | cut -d: -f2)
if [ -n "$a2a" ] && $PY -c "import sys; sys.exit(not $a2a > 0)" && grep -q "^step .*a2a [0-9.]*" "$TMP/ep2.out"; then
    ok "ep 2 counts its all-to-all bytes ($a2a on step 1) and the step line shows them"
else bad "ep 2 all-to-all bytes: '$a2a'; $(grep '^step' "$TMP/ep2.out" | head -1)"; fi

# resume across ep degrees: saved at ep 2 after 3 steps, resumed at ep 4 and at 1 rank
run half 2 --set parallel.expert=2 --set train.steps=3 --set checkpoint.every_steps=3
for to in "4 --set parallel.expert=4" "1"; do
    set -- $to
    np=$1; shift
    name=resume-$np
    rm -rf "$TMP/$name"; mkdir -p "$TMP/$name"; cp -r "$TMP/half/ckpt" "$TMP/$name/ckpt"
    run $name $np "$@" && \
        if $PY tests/compare_runs.py "$TMP/one" "$TMP/$name" --loss-rtol 1e-5 --norm-rtol 1e-4 --weight-rtol 1e-4 \
            >"$TMP/cmp.out" 2>&1; then ok "saved at ep 2, resumed on $np rank(s): the straight run's steps 4-6 and weights"
        else bad "resume at ep 2 -> $np: $(head -3 "$TMP/cmp.out" | tr '\n' ' ')"; fi
done
rm -rf "$TMP/ep2-again"; mkdir -p "$TMP/ep2-again"; cp -r "$TMP/half/ckpt" "$TMP/ep2-again/ckpt"
run ep2-again 2 --set parallel.expert=2 && \
    if $PY tests/compare_runs.py "$TMP/ep2" "$TMP/ep2-again" --exact >"$TMP/cmp.out" 2>&1; then
        ok "saved and resumed at ep 2: bit for bit the straight ep 2 run"
    else bad "ep 2 resume not exact: $(head -3 "$TMP/cmp.out" | tr '\n' ' ')"; fi

# impossible expert layouts, one line each
refused "parallel.expert 3 on 2 ranks" "$TMP/ep.json: parallel.expert 3 does not divide" $MPIRUN 2 $BIN "$TMP/ep.json" \
    --set parallel.expert=3 --set log.dir=$TMP/bad
refused "parallel.expert 4 not dividing 6 experts" ".*parallel.expert 4 does not divide model.moe_experts 6" \
    $MPIRUN 4 $BIN "$TMP/ep.json" --set parallel.expert=4 --set init.from= --set model.arch=llama --set model.n_layer=1 \
    --set model.n_embd=32 --set model.n_head=4 --set model.vocab_size=96 --set model.max_seq_len=16 --set model.moe_experts=6 \
    --set log.dir=$TMP/bad
ckpt_job "$TMP/dense.json" "$TMP/train.bin" 2 0
refused "parallel.expert on a dense model" ".*parallel.expert 2: the model has no experts" $MPIRUN 2 $BIN "$TMP/dense.json" \
    --set parallel.expert=2 --set log.dir=$TMP/bad

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
