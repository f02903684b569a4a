#!/bin/bash
# The inner loop's training smoke (make test-quick; also part of make test):
# the small Llama trains 10 steps on 1 rank and on 2 ranks FULL_SHARD with
# the same global batch; the 2-rank run's losses, norms and exported weights
# match the 1-rank run's within reduction-order tolerance, and the loss falls.
. "$(dirname "$0")/lib.sh"

# a learnable shard: each token the last one times 5 plus 3 (mod 96), one in 10 random
learnable_shard "$TMP/train.bin"
ckpt_job "$TMP/job.json" "$TMP/train.bin" 10 5
$BIN "$TMP/job.json" --set log.dir="$TMP/one" >"$TMP/one.out" 2>&1; rc1=$?
$MPIRUN 2 $BIN "$TMP/job.json" --set log.dir="$TMP/two" --set parallel.strategy=FULL_SHARD >"$TMP/two.out" 2>&1; rc2=$?
for r in one two; do $BIN export "$TMP/$r/checkpoints" "$TMP/$r/hf" >/dev/null 2>&1; done
first=$(grep -o '"loss":[0-9.]*' "$TMP/one/metrics.jsonl" | head -1 | cut -d: -f2)
last=$(grep -o '"loss":[0-9.]*' "$TMP/one/metrics.jsonl" | tail -1 | cut -d: -f2)
if [ $rc1 -eq 0 ] && [ -f "$TMP/one/hf/model.safetensors" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
    ok "1 rank: 10 steps, the loss falls ($first -> $last), checkpoint exported"
else bad "1 rank: rc $rc1, loss $first -> $last: $(grep llmtrain: "$TMP/one.out" | head -2)"; fi
if [ $rc2 -eq 0 ] && $PY tests/compare_runs.py "$TMP/one" "$TMP/two" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3 >"$TMP/cmp.out" 2>&1; then
    ok "2 ranks FULL_SHARD: losses and exported weights match the 1-rank run"
else bad "2 ranks FULL_SHARD: rc $rc2: $(tail -2 "$TMP/cmp.out") $(grep llmtrain: "$TMP/two.out" | head -2)"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
