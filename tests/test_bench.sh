#!/bin/bash
# make bench still runs: the multi-rank table (three of its rows, 2 steps)
# parses each run's metrics.jsonl and prints tokens/s and communication
# bytes per step: none at 1 rank, fewer for HYBRID_SHARD 2x2 than for
# FULL_SHARD at 4 ranks. (No timing is checked: the numbers are the
# benchmark's to print.)
. "$(dirname "$0")/lib.sh"
out=$(BENCH_MULTIRANK_ONLY=1 BENCH_STEPS=2 BENCH_MULTIRANK_SPECS="1:NO_SHARD:0 4:FULL_SHARD:0 4:HYBRID_SHARD:2" bench/run_bench.sh 2>&1)
rc=$?
echo "$out" | tail -4
mb() { echo "$out" | grep -E "ranks $1 $2 " | sed -E 's/.*comm +([0-9.]+) MB\/step.*/\1/'; }
full=$(mb 4 FULL_SHARD); hyb=$(mb 4 "HYBRID_SHARD 2x2"); one=$(mb 1 NO_SHARD)
if [ $rc -eq 0 ] && [ "$one" = "0.0" ] && [ -n "$full" ] && [ -n "$hyb" ] && awk -v f="$full" -v h="$hyb" 'BEGIN { exit !(h > 0 && h < f) }'; then
    ok "bench multi-rank table: 1 rank 0 MB, 4 ranks FULL_SHARD $full MB > HYBRID_SHARD 2x2 $hyb MB per step"
else bad "bench multi-rank table: rc $rc: $(echo "$out" | tail -3)"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
