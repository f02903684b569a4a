#!/bin/bash
# parallel.c's routing to a device communication library (the DistDevComm
# NCCL plugs into on the CUDA backend), without a GPU: tests/test_dist_dev
# attaches a recording fake and checks, on 2 and 4 MPI ranks and every kind
# of group (tp x shard x replicate), that the float32 collectives on backend
# memory go to it (operation, group, buffers, handles started, tested,
# waited once and reused; one-member groups copy through it; the same byte
# accounting), that the float64 reductions, gathers and broadcasts stay on
# MPI with right results, that the health check times through it and that
# dist_finalize closes it; and that the watchdog calls its abort before it
# ends the job with exit 5.
. "$(dirname "$0")/lib.sh"
[ -x tests/test_dist_dev ] || make -s tests/test_dist_dev >/dev/null 2>&1
for layout in "4 2 2" "4 1 2" "4 2 1" "4 1 4" "4 1 1" "2 1 1" "2 2 1"; do
    set -- $layout
    out=$($MPIRUN "$1" tests/test_dist_dev "$2" "$3" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out")
    if [ $rc -eq 0 ] && grep -q ' passed, 0 failed$' <<<"$line"; then ok "$1 ranks, tp $2 x shard $3: $line"
    else bad "$1 ranks, tp $2 x shard $3: exit $rc: $(grep -E 'FAIL|llmtrain' <<<"$out" | head -5)"; fi
done
timeout 60 $MPIRUN 2 tests/test_dist_dev watchdog "$TMP/abort" >"$TMP/wd.out" 2>&1; rc=$?
if [ $rc -eq 5 ] && grep -q '^abort$' "$TMP/abort.1" 2>/dev/null &&
   grep -q '^llmtrain: rank 1: watchdog: step 1 phase forward (collective none) exceeded' "$TMP/wd.out"; then
    ok "watchdog: the device library's abort ran before exit 5"
else bad "watchdog: exit $rc, abort mark '$(cat "$TMP/abort.1" 2>/dev/null)': $(grep llmtrain "$TMP/wd.out" | head -2)"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
