#!/bin/bash
# Tensor parallelism (parallel.tensor) over MPI: tp 2 alone (2 ranks), with
# FULL_SHARD over 2 data-parallel ranks (4 ranks) and with HYBRID_SHARD 2x2
# (8 ranks) must reproduce the single-process losses, gradient norms and
# exported final weights, for a small GPT-2 and a small Llama with GQA
# (export reassembles the sharded checkpoint of any layout into global
# tensors). Impossible layouts: one line, exit 2.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1

for arch in gpt2 llama; do
    cat >"$TMP/$arch.json" <<EOF
{"model": {"arch": "$arch", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": $([ $arch = llama ] && echo 2 || echo 4),
           "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 10, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 0}}
EOF
    # run name: ranks-tp[-strategy[-shard_degree]]
    for run in 1-1 2-2 4-2-FULL_SHARD 8-2-HYBRID_SHARD-2; do
        IFS=- read -r np tp strategy degree <<<"$run"
        set_args="--set log.dir=$TMP/$arch-$run --set checkpoint.dir=$TMP/$arch-$run/ckpt --set parallel.tensor=$tp"
        [ -n "$strategy" ] && set_args="$set_args --set parallel.strategy=$strategy"
        [ -n "$degree" ] && set_args="$set_args --set parallel.shard_degree=$degree"
        if [ $np = 1 ]; then cmd="$BIN"; else cmd="$MPIRUN $np $BIN"; fi
        if ! $cmd "$TMP/$arch.json" $set_args >"$TMP/$arch-$run.out" 2>&1; then
            echo "FAIL $arch $run exited non-zero: $(tail -3 "$TMP/$arch-$run.out")"; fail=$((fail + 1)); continue
        fi
        $BIN export "$TMP/$arch-$run/ckpt" "$TMP/$arch-$run/hf" >/dev/null
        [ $run = 1-1 ] && continue
        # weights get 1e-3 for the reason given in test_ddp.sh (GPT-2's key bias)
        if $PY tests/compare_runs.py "$TMP/$arch-1-1" "$TMP/$arch-$run" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3; then
            echo "ok   $arch: ranks $np tp $tp ${strategy:-NO_SHARD} matches 1 rank"; pass=$((pass + 1))
        else
            echo "FAIL $arch: ranks $np tp $tp ${strategy:-NO_SHARD} differs from 1 rank"; fail=$((fail + 1))
        fi
    done
done

# the TP groups are printed, the health check times every group kind (8
# ranks: tp 2 x shard 2 x replicate 2, dp 4) and tp all-reduces are counted per step
o8="$TMP/gpt2-8-2-HYBRID_SHARD-2.out"
if grep -q "TP group 3: ranks 6 7" "$o8" && grep -qE "^health: tp all-reduce 1048576 over 2 ranks: [0-9.]+ GB/s" "$o8" &&
   grep -qE "^health: shard all-reduce 1048576 over 2 ranks" "$o8" && grep -qE "^health: replicate all-reduce 1048576 over 2 ranks" "$o8" &&
   grep -qE "^health: dp all-reduce 1048576 over 4 ranks" "$o8" &&
   grep '"loss"' "$TMP/gpt2-2-2/metrics.jsonl" | tail -1 | grep -q '"tp_allreduce":[1-9]'; then
    echo "ok   TP groups printed, health check on the tp, shard, replicate and dp groups, tp_allreduce bytes counted"; pass=$((pass + 1))
else
    echo "FAIL TP group lines or tp_allreduce bytes missing"; fail=$((fail + 1))
fi

# init.from under tensor parallelism: each rank keeps its slices of the Hugging Face tensors
for run in init-1 init-2; do
    np=${run#init-}
    cmd="$BIN"; [ $np -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/llama.json" --set init.from="$TMP/llama-1-1/hf" --set parallel.tensor=$np --set train.steps=4 \
        --set log.dir="$TMP/$run" --set checkpoint.dir="$TMP/$run/ckpt" >"$TMP/$run.out" 2>&1
    $BIN export "$TMP/$run/ckpt" "$TMP/$run/hf" >/dev/null 2>&1
done
if $PY tests/compare_runs.py "$TMP/init-1" "$TMP/init-2" --steps 4 --loss-rtol 1e-5 --weight-rtol 1e-3 &&
   $PY -c "import json,sys; f=lambda p: [json.loads(l)['loss'] for l in open(p) if '\"loss\"' in l][0]
sys.exit(0 if f('$TMP/init-2/metrics.jsonl') < f('$TMP/llama-1-1/metrics.jsonl') - 0.01 else 1)"; then
    echo "ok   init.from with tp 2 continues the trained weights like tp 1"; pass=$((pass + 1))
else
    echo "FAIL init.from with tp 2: $(tail -2 "$TMP/init-2.out")"; fail=$((fail + 1))
fi

# impossible layouts: one clear line and exit 2 before any work
reject() { # name ranks expected-message set-args...
    local name=$1 np=$2 msg=$3; shift 3
    $MPIRUN $np $BIN "$TMP/llama.json" --set log.dir="$TMP/bad-$name" "$@" >"$TMP/bad-$name.out" 2>&1
    local rc=$?
    if [ $rc -eq 2 ] && grep -q "$msg" "$TMP/bad-$name.out" && [ ! -e "$TMP/bad-$name/metrics.jsonl" ] &&
       [ "$(grep -c 'llmtrain' "$TMP/bad-$name.out")" -eq 1 ]; then
        echo "ok   $name rejected, one line for $np ranks"; pass=$((pass + 1))
    else
        echo "FAIL $name: rc=$rc $(head -3 "$TMP/bad-$name.out")"; fail=$((fail + 1))
    fi
}
reject world 3 "parallel.tensor 2 does not divide the 3 ranks" --set parallel.tensor=2
reject kv_heads 4 "model.n_kv_head 2 (n_head 4) is not divisible by parallel.tensor 4" --set parallel.tensor=4
reject ffn 2 "model.ffn_hidden 91 is not divisible by parallel.tensor 2" --set parallel.tensor=2 --set model.ffn_hidden=91
reject vocab 2 "model.vocab_size 95 is not divisible by parallel.tensor 2; pad the vocabulary" --set parallel.tensor=2 --set model.vocab_size=95
reject shard 4 "parallel.shard_degree 3 does not divide the 2 data-parallel ranks" --set parallel.tensor=2 \
    --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=3
reject batch 4 "train.global_batch 6 is not divisible by train.micro_batch 2 x data-parallel ranks 2" --set parallel.tensor=2 \
    --set train.global_batch=6

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
