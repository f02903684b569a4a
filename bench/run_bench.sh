#!/bin/bash
# make bench: CPU training throughput of llmtrain for GPT-2 124M (B=4, T=64)
# and a small Llama, next to this machine's measured sgemm peak and next to
# PyTorch CPU training the same model and batch, all in the same run; then
# a small Mixtral-shaped mixture of experts the same way, and its expert
# parallelism's all-to-all bytes at ep 2 and 4 against the formula; then
# GPT-2 124M's checkpoint blocking time and write bandwidth
# (bench/ckpt_bench.sh); then a multi-rank table.
# FLOPs per token = 6 x (parameters in matrix products) + 12 x L x C x T,
# for a mixture of experts its active parameters (router + k experts), the
# count bench/torch_train.py reports; the MoE row stops if llmtrain's differs.
# Environment: BENCH_STEPS (default 6; the first is warm-up),
# BENCH_THREADS (the single-rank rows' threads, llmtrain's OMP_NUM_THREADS and
# torch_train.py's --threads; default the cores),
# BENCH_MOE=0 (no mixture-of-experts rows), BENCH_MOE_ONLY=1 (only them),
# BENCH_MOE_EP_EXPERTS / BENCH_MOE_EP_TOPK (the all-to-all rows' model:
# default 8 experts, top 2; top-k = experts sends every token to every
# expert, which makes the uniform-routing formula exact),
# BENCH_MULTIRANK_ONLY=1 (only the multi-rank table), BENCH_MULTIRANK_SPECS
# (its rows, "RANKS:STRATEGY:SHARD_DEGREE[:CONTEXT[:CONTEXT_MODE]] ...", default every
# strategy at 1, 2, 4 and context parallelism 2 and 4, ring and all_gather),
# BENCH_CKPT=0 (skip the checkpoint benchmark), BENCH_CKPT_ONLY=1 (only it),
# BENCH_CKPT_DIR (where it writes its checkpoints; see bench/ckpt_bench.sh).
set -e
cd "$(dirname "$0")/.."
if [ "${BENCH_CKPT_ONLY:-0}" = 1 ]; then exec bench/ckpt_bench.sh; fi
PY=/usr/bin/python3
STEPS=${BENCH_STEPS:-6}
THREADS=${BENCH_THREADS:-$(nproc)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

$PY - "$TMP" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
for name, vocab, magic, ver, dt in (("gpt2_124M", 50257, 20240520, 1, np.uint16), ("llama_small", 32000, 20240520, 1, np.uint16),
                                     ("mixtral_small", 8192, 20240520, 1, np.uint16)):
    t = np.random.default_rng(0).integers(0, vocab, 200_000)
    h = np.zeros(256, np.int32); h[:3] = (magic, ver, len(t))
    with open(f"{d}/{name}.bin", "wb") as f:
        f.write(h.tobytes()); f.write(t.astype(dt).tobytes())
EOF

# name | llmtrain model json | torch_train.py args | B | T [| llmtrain --set args]
run_case() {
    local name="$1" model="$2" targs="$3" B="$4" T="$5" sets="${6:-}"
    cat >"$TMP/$name.json" <<EOF
{"model": $model,
 "data": {"train": "$TMP/$name.bin"},
 "train": {"steps": $STEPS, "seq_len": $T, "micro_batch": $B, "global_batch": $B, "device": "cpu"},
 "optim": {"lr": 3e-4, "warmup_steps": 0},
 "eval": {"sample_tokens": 0}, "log": {"dir": "$TMP/run_$name"}, "checkpoint": {"dir": "$TMP/ck_$name", "every_steps": 1000000}}
EOF
    OMP_NUM_THREADS=$THREADS ./llmtrain "$TMP/$name.json" --set checkpoint.every_steps=0 $sets >"$TMP/$name.out" 2>&1 || { cat "$TMP/$name.out"; exit 1; }
    local torch_json
    torch_json=$($PY bench/torch_train.py $targs --seq_len "$T" --batch "$B" --steps "$STEPS" --threads "$THREADS")
    $PY - "$name" "$TMP/$name.out" "$TMP/run_$name/metrics.jsonl" "$torch_json" "$TMP/$name.json" <<'EOF'
import json, re, statistics, sys
name, out, metrics, tj, job = sys.argv[1:6]
text = open(out).read()
peak = float(re.search(r"peak for MFU ([0-9.]+) GFLOP/s", text).group(1))
# a step faster than the peak measured at start had it measured again: the MFU after it is against that
again = re.findall(r"^peak for MFU measured again after step \d+, .*: ([0-9.e+-]+) GFLOP/s \(measured sgemm", text, re.M)
if again:
    peak = float(again[-1])
blas = re.search(r"backend cpu[^|]*\| (.*)", text).group(1)
params = re.search(r"([0-9.]+)M parameters", text).group(1)
steps = [d for d in map(json.loads, open(metrics)) if "tokens_per_s" in d]  # step lines, not events
ms = statistics.median(s["step_ms"] for s in steps[1:]) if len(steps) > 1 else steps[0]["step_ms"]
tps = statistics.median(s["tokens_per_s"] for s in steps[1:]) if len(steps) > 1 else steps[0]["tokens_per_s"]
mfu = statistics.median(s["mfu"] for s in steps[1:]) if len(steps) > 1 else steps[0]["mfu"]
torch = json.loads(tj)
model = json.load(open(job))["model"]
if not model.get("moe_experts"):
    print(f"{name}: {params}M params | llmtrain {ms:.0f} ms/step, {tps:.0f} tokens/s, {mfu * peak:.1f} GFLOP/s, "
          f"MFU {100 * mfu:.1f}% of sgemm peak {peak:.1f} GFLOP/s | PyTorch {torch['torch_version']} "
          f"{torch['ms_per_step']:.0f} ms/step, {torch['tokens_per_s']:.0f} tokens/s | speed-up {tps / torch['tokens_per_s']:.2f}x")
else:
    # both sides' GFLOP/s from one count, that of PyTorch's model's active parameters; llmtrain's own
    # (its last step's MFU x peak / tokens/s; the peak is printed to 0.1 GFLOP/s) must agree
    fpt, last = torch["flops_per_token"], steps[-1]
    own = last["mfu"] * peak * 1e9 / last["tokens_per_s"]
    if abs(own / fpt - 1) > 0.005:
        sys.exit(f"bench: {name}: llmtrain counts {own / 1e6:.2f} MFLOP a token, bench/torch_train.py {fpt / 1e6:.2f}: not one formula")
    g_l, g_t = fpt * tps / 1e9, fpt * torch["tokens_per_s"] / 1e9
    print(f"{name}: {model['moe_experts']} experts top-{model['moe_top_k']}, {params}M params, "
          f"{torch['active_params'] / 1e6:.1f}M active in matrix products, {fpt / 1e6:.1f} MFLOP/token | "
          f"llmtrain {ms:.0f} ms/step, {tps:.0f} tokens/s, {g_l:.1f} GFLOP/s, {100 * g_l / peak:.1f}% of sgemm peak "
          f"{peak:.1f} GFLOP/s | PyTorch {torch['torch_version']} {torch['ms_per_step']:.0f} ms/step, "
          f"{torch['tokens_per_s']:.0f} tokens/s, {g_t:.1f} GFLOP/s, {100 * g_t / peak:.1f}% | "
          f"speed-up {tps / torch['tokens_per_s']:.2f}x")
print(f"  BLAS: {blas}")
EOF
}

echo "llmtrain CPU benchmark ($(nproc) cores, $THREADS threads, $STEPS steps, median after the first)"
if [ "${BENCH_MULTIRANK_ONLY:-0}" != 1 ] && [ "${BENCH_MOE_ONLY:-0}" != 1 ]; then
run_case gpt2_124M '{"arch": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "max_seq_len": 1024}' \
    "--arch gpt2 --n_layer 12 --n_embd 768 --n_head 12 --vocab 50257 --max_seq_len 1024" 4 64
run_case llama_small '{"arch": "llama", "n_layer": 8, "n_embd": 512, "n_head": 8, "n_kv_head": 4, "ffn_hidden": 1536, "vocab_size": 32000, "max_seq_len": 256}' \
    "--arch llama --n_layer 8 --n_embd 512 --n_head 8 --n_kv_head 4 --ffn_hidden 1536 --vocab 32000 --max_seq_len 256" 4 128
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "${BENCH_MULTIRANK_ONLY:-0}" != 1 ] && [ "${BENCH_MOE:-1}" != 0 ]; then
# A Mixtral-shaped mixture of experts (every MLP 8 SwiGLU experts of 1024, top 2, renormalised,
# the load-balancing loss at 0.01), small enough for 2 cores
run_case mixtral_small '{"arch": "llama", "n_layer": 4, "n_embd": 384, "n_head": 6, "n_kv_head": 2, "ffn_hidden": 1024, "moe_experts": 8, "moe_top_k": 2, "moe_ffn_hidden": 1024, "vocab_size": 8192, "max_seq_len": 256}' \
    "--arch llama --n_layer 4 --n_embd 384 --n_head 6 --n_kv_head 2 --vocab 8192 --max_seq_len 256 --moe_experts 8 --moe_top_k 2 --moe_ffn_hidden 1024 --moe_aux_coef 0.01" \
    4 128 "--set train.moe_aux_loss_coef=0.01 --set train.moe_z_loss_coef=0"

# Expert parallelism: the all-to-all bytes rank 0 sends a step (metrics.jsonl's comm_bytes.a2a)
# at ep 2 and 4 against docs/moe.md's exchange under uniform routing: each of the four
# all-to-alls of an MoE layer and micro-batch moves C x 4 bytes (fp32 on the CPU) for each of
# the rank's N x k choices whose expert is another member's, (ep - 1) / ep of them.
EP_E=${BENCH_MOE_EP_EXPERTS:-8}; EP_K=${BENCH_MOE_EP_TOPK:-2}
cat >"$TMP/moe_ep.json" <<EOF2
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 128, "n_head": 4, "n_kv_head": 2, "ffn_hidden": 256,
           "moe_experts": $EP_E, "moe_top_k": $EP_K, "moe_ffn_hidden": 256, "vocab_size": 8192, "max_seq_len": 64},
 "data": {"train": "$TMP/mixtral_small.bin"},
 "train": {"steps": 3, "seq_len": 64, "micro_batch": 2, "global_batch": 8, "device": "cpu"},
 "eval": {"sample_tokens": 0}, "checkpoint": {"every_steps": 0}}
EOF2
echo "expert parallelism (llama 2x128, every layer $EP_E experts top-$EP_K, 8 x 64 tokens/step, micro-batch 2):"
for ep in 2 4; do
    dir="$TMP/moe_ep$ep"
    OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np "$ep" ./llmtrain "$TMP/moe_ep.json" --set parallel.expert=$ep \
        --set log.dir=$dir --set checkpoint.dir=$dir/ckpt >"$dir.out" 2>&1 || { cat "$dir.out"; exit 1; }
    $PY - "$ep" "$TMP/moe_ep.json" "$dir/metrics.jsonl" <<'EOF2'
import json, statistics, sys
ep, job, path = int(sys.argv[1]), json.load(open(sys.argv[2])), sys.argv[3]
m, t = job["model"], job["train"]
steps = [d for d in map(json.loads, open(path)) if "tokens_per_s" in d][1:]  # step 2 on
got = statistics.mean(s["comm_bytes"]["a2a"] for s in steps)
load = statistics.mean(s["moe_load"] for s in steps)
mbs = t["global_batch"] // (t["micro_batch"] * ep)  # a rank's micro-batches a step (dp = ep ranks)
N = t["micro_batch"] * t["seq_len"]
want = 4 * m["n_layer"] * mbs * N * m["moe_top_k"] * (ep - 1) / ep * m["n_embd"] * 4
print(f"  ranks {ep} ep {ep} | a2a {got / 1e6:.4f} MB/step measured (rank 0, steps 2-{len(steps) + 1}) | "
      f"{want / 1e6:.4f} MB uniform routing = 4 x {m['n_layer']} layers x {mbs} micro-batches x {N} tokens x "
      f"top-{m['moe_top_k']} x {ep - 1}/{ep} x {m['n_embd']} x 4 B | ratio {got / want:.3f} " +
      ("(every token reaches every expert: exact)" if m["moe_top_k"] == m["moe_experts"] else
       f"(routing is not exactly uniform: load {load:.2f})"))
EOF2
done
fi
if [ "${BENCH_MULTIRANK_ONLY:-0}" != 1 ] && [ "${BENCH_MOE_ONLY:-0}" != 1 ] && [ "${BENCH_CKPT:-1}" != 0 ]; then bench/ckpt_bench.sh; fi
if [ "${BENCH_MOE_ONLY:-0}" = 1 ]; then exit 0; fi

# Multi-rank: the same model and global batch at 1, 2 and 4 ranks under each
# strategy: tokens/s and communication bytes per step (bus bytes as
# nccl-tests counts them), so the saving of hybrid over full sharding shows;
# context parallelism's rows add the ring's (or the all-gather's) bytes,
# whose formula docs/layouts.md gives and tests/test_bench.sh checks.
# On a 2-core machine ranks share cores, so tokens/s says little; bytes are exact.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MR_MODEL='{"arch": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 50257, "max_seq_len": 128}'
cat >"$TMP/multirank.json" <<EOF2
{"model": $MR_MODEL,
 "data": {"train": "$TMP/gpt2_124M.bin"},
 "train": {"steps": 4, "seq_len": 64, "micro_batch": 2, "global_batch": 8, "device": "cpu"},
 "eval": {"sample_tokens": 0}, "checkpoint": {"every_steps": 0}}
EOF2
echo "multi-rank (gpt2 4x256, vocab 50257, 8 x 64 tokens/step):"
SPECS=${BENCH_MULTIRANK_SPECS:-"1:NO_SHARD:0 2:NO_SHARD:0 2:FULL_SHARD:0 2:SHARD_GRAD_OP:0 4:NO_SHARD:0 4:FULL_SHARD:0 4:SHARD_GRAD_OP:0 4:HYBRID_SHARD:2 4:HYBRID_SHARD_ZERO2:2 2:NO_SHARD:0:2 4:NO_SHARD:0:4 4:FULL_SHARD:0:2 2:NO_SHARD:0:2:all_gather 4:NO_SHARD:0:4:all_gather"}
for spec in $SPECS; do
    spec=${spec//:/ }
    set -- $spec
    np=$1; strat=$2; sd=$3; cp=${4:-1}; mode=${5:-ring}
    dir="$TMP/mr_${np}_${strat}_${cp}_$mode"
    args="--set parallel.strategy=$strat --set parallel.shard_degree=$sd --set parallel.context=$cp --set parallel.context_mode=$mode"
    args="$args --set log.dir=$dir --set checkpoint.dir=$dir/ckpt"
    if [ "$np" = 1 ]; then ./llmtrain "$TMP/multirank.json" $args >"$dir.out" 2>&1 || { cat "$dir.out"; exit 1; }
    else OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np "$np" ./llmtrain "$TMP/multirank.json" $args >"$dir.out" 2>&1 || { cat "$dir.out"; exit 1; }
    fi
    $PY - "$np" "$strat" "$sd" "$dir/metrics.jsonl" "$cp" "$mode" <<'EOF2'
import json, statistics, sys
np_, strat, sd, path, cp, mode = sys.argv[1:7]
steps = [d for d in map(json.loads, open(path)) if "tokens_per_s" in d]  # step lines, not events
tps = statistics.median(s["tokens_per_s"] for s in steps[1:])
comm = steps[-1].get("comm_bytes", {}) or {}
total = sum(v for v in comm.values() if isinstance(v, (int, float)))
kinds = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in comm.items() if v)
layout = f"{strat}" + (f" {sd}x{int(np_) // int(sd)}" if strat.startswith("HYBRID") else "")
layout += f" cp {cp}" + (" all_gather" if mode == "all_gather" else "") if cp != "1" else ""
print(f"  ranks {np_} {layout:<24} {tps:8.0f} tokens/s | comm {total / 1e6:7.1f} MB/step ({kinds or 'none'})")
EOF2
done
