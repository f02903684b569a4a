#!/bin/bash
# make bench: CPU training throughput of llmtrain for GPT-2 124M (B=4, T=64)
# and a small Llama, next to this machine's measured sgemm peak and next to
# PyTorch CPU training the same model and batch, all in the same run; then
# GPT-2 124M's checkpoint blocking time and write bandwidth
# (bench/ckpt_bench.sh); then a multi-rank table.
# FLOPs per token = 6 x (parameters in matrix products) + 12 x L x C x T.
# Environment: BENCH_STEPS (default 6; the first is warm-up),
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
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

$PY - "$TMP" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
for name, vocab, magic, ver, dt in (("gpt2_124M", 50257, 20240520, 1, np.uint16), ("llama_small", 32000, 20240520, 1, np.uint16)):
    t = np.random.default_rng(0).integers(0, vocab, 200_000)
    h = np.zeros(256, np.int32); h[:3] = (magic, ver, len(t))
    with open(f"{d}/{name}.bin", "wb") as f:
        f.write(h.tobytes()); f.write(t.astype(dt).tobytes())
EOF

# name | llmtrain model json | torch_train.py args | B | T
run_case() {
    local name="$1" model="$2" targs="$3" B="$4" T="$5"
    cat >"$TMP/$name.json" <<EOF
{"model": $model,
 "data": {"train": "$TMP/$name.bin"},
 "train": {"steps": $STEPS, "seq_len": $T, "micro_batch": $B, "global_batch": $B, "device": "cpu"},
 "optim": {"lr": 3e-4, "warmup_steps": 0},
 "eval": {"sample_tokens": 0}, "log": {"dir": "$TMP/run_$name"}, "checkpoint": {"dir": "$TMP/ck_$name", "every_steps": 1000000}}
EOF
    ./llmtrain "$TMP/$name.json" --set checkpoint.every_steps=0 >"$TMP/$name.out" 2>&1 || { cat "$TMP/$name.out"; exit 1; }
    local torch_json
    torch_json=$($PY bench/torch_train.py $targs --seq_len "$T" --batch "$B" --steps "$STEPS")
    $PY - "$name" "$TMP/$name.out" "$TMP/run_$name/metrics.jsonl" "$torch_json" <<'EOF'
import json, re, statistics, sys
name, out, metrics, tj = sys.argv[1:5]
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
print(f"{name}: {params}M params | llmtrain {ms:.0f} ms/step, {tps:.0f} tokens/s, {mfu * peak:.1f} GFLOP/s, "
      f"MFU {100 * mfu:.1f}% of sgemm peak {peak:.1f} GFLOP/s | PyTorch {torch['torch_version']} "
      f"{torch['ms_per_step']:.0f} ms/step, {torch['tokens_per_s']:.0f} tokens/s | speed-up {tps / torch['tokens_per_s']:.2f}x")
print(f"  BLAS: {blas}")
EOF
}

echo "llmtrain CPU benchmark ($(nproc) cores, $STEPS steps, median after the first)"
if [ "${BENCH_MULTIRANK_ONLY:-0}" != 1 ]; then
run_case gpt2_124M '{"arch": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "max_seq_len": 1024}' \
    "--arch gpt2 --n_layer 12 --n_embd 768 --n_head 12 --vocab 50257 --max_seq_len 1024" 4 64
run_case llama_small '{"arch": "llama", "n_layer": 8, "n_embd": 512, "n_head": 8, "n_kv_head": 4, "ffn_hidden": 1536, "vocab_size": 32000, "max_seq_len": 256}' \
    "--arch llama --n_layer 8 --n_embd 512 --n_head 8 --n_kv_head 4 --ffn_hidden 1536 --vocab 32000 --max_seq_len 256" 4 128
if [ "${BENCH_CKPT:-1}" != 0 ]; then bench/ckpt_bench.sh; fi
fi

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
