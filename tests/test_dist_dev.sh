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
# ends the job with exit 5. The expert group's membership and all-to-all
# over MPI and TCP (test_dist_dev ep).
. "$(dirname "$0")/lib.sh"
[ -x tests/test_dist_dev ] || make -s tests/test_dist_dev >/dev/null 2>&1
for layout in "4 2 2" "4 1 2" "4 2 1" "4 1 4" "4 1 1" "2 1 1" "2 2 1"; do
    set -- $layout
    out=$($MPIRUN "$1" tests/test_dist_dev "$2" "$3" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out")
    if [ $rc -eq 0 ] && grep -q ' passed, 0 failed$' <<<"$line"; then ok "$1 ranks, tp $2 x shard $3: $line"
    else bad "$1 ranks, tp $2 x shard $3: exit $rc: $(grep -E 'FAIL|llmtrain' <<<"$out" | head -5)"; fi
done
# the expert group (tp x cp x dp, ep consecutive data-parallel indices of
# one tp_rank): its members against the layout's formula, the count
# exchange and the all-to-all of random sizes (zeros, a rank sending
# nothing, a round where none does; displacements with gaps) against the
# bytes the test computes, bytes_ep, then the routing to a device, and
# under MPI each one's LLMTRAIN_COMM_TRACE line (the bytes sent); over
# MPI and over the TCP rendezvous of a torchrun-style launch
for layout in "2 1 1 2" "4 1 1 2" "4 1 1 4" "4 2 1 2" "4 1 2 2" "4 1 2 4" "4 1 1 1"; do
    set -- $layout
    out=$(LLMTRAIN_COMM_TRACE="$TMP/tr" timeout 60 $MPIRUN "$1" -x LLMTRAIN_COMM_TRACE tests/test_dist_dev ep "$2" "$3" "$4" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out")
    if [ $rc -eq 0 ] && grep -q '^launch: MPI$' <<<"$out" && grep -q ' passed, 0 failed$' <<<"$line"; then
        ok "MPI $1 ranks, tp $2 x cp $3, ep $4: all-to-all: $line"
    else bad "MPI $1 ranks, tp $2 x cp $3, ep $4: exit $rc: $(grep -E 'FAIL|llmtrain' <<<"$out" | head -5)"; fi
    LLMTRAIN_RDZV_TIMEOUT_S=30 trun ep "$1" timeout 60 tests/test_dist_dev ep "$2" "$3" "$4" >"$TMP/ep.out" 2>&1; rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$TMP/ep.out")
    if [ $rc -eq 0 ] && grep -q '^launch: torchrun-style, host collectives over TCP' "$TMP/ep.out" && grep -q ' passed, 0 failed$' <<<"$line"; then
        ok "TCP $1 ranks, tp $2 x cp $3, ep $4: all-to-all: $line"
    else bad "TCP $1 ranks, tp $2 x cp $3, ep $4: exit codes $(rcs ep "$1"): $(grep -E 'FAIL|llmtrain' "$TMP/ep.out" | head -5)"; fi
done
# a rank waiting in an all-to-all its peer never joins: the watchdog names it
timeout 60 $MPIRUN 2 tests/test_dist_dev ephang >"$TMP/eph.out" 2>&1; rc=$?
if [ $rc -eq 5 ] && grep -q '^llmtrain: rank 0: watchdog: step 1 phase moe_dispatch (collective MPI_Alltoallv) exceeded' "$TMP/eph.out"; then
    ok "MPI: a hung all-to-all: the watchdog names MPI_Alltoallv, exit 5"
else bad "MPI hung all-to-all: exit $rc: $(grep llmtrain "$TMP/eph.out" | head -2)"; fi
trun eph 2 timeout 60 tests/test_dist_dev ephang >"$TMP/eph.out" 2>&1
if [ "$(cat "$TMP/eph.rc.0")" = 5 ] && grep -q '^llmtrain: rank 0: watchdog: step 1 phase moe_dispatch (collective TCP alltoallv) exceeded' "$TMP/eph.out"; then
    ok "TCP: a hung all-to-all: the watchdog names TCP alltoallv, exit 5"
else bad "TCP hung all-to-all: exit codes $(rcs eph 2): $(grep llmtrain "$TMP/eph.out" | head -2)"; fi
timeout 60 $MPIRUN 2 tests/test_dist_dev watchdog "$TMP/abort" >"$TMP/wd.out" 2>&1; rc=$?
if [ $rc -eq 5 ] && grep -q '^abort$' "$TMP/abort.1" 2>/dev/null &&
   grep -q '^llmtrain: rank 1: watchdog: step 1 phase forward (collective none) exceeded' "$TMP/wd.out"; then
    ok "watchdog: the device library's abort ran before exit 5"
else bad "watchdog: exit $rc, abort mark '$(cat "$TMP/abort.1" 2>/dev/null)': $(grep llmtrain "$TMP/wd.out" | head -2)"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
