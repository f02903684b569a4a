#!/bin/bash
# dist_nccl.c (the CUDA backend's NCCL layer) without a GPU: tests/test_dist_nccl
# builds it against the fake CUDA runtime and NCCL of tests/fake_cuda (host
# memory, MPI underneath, NCCL's in-place rules, non-blocking communicators
# answering ncclInProgress) and drives it through parallel.c on 2 and 4 ranks
# over tp x shard x replicate layouts: one non-blocking communicator per
# distinct group (shard / replicate as large as dp share dp's) with the group
# index as NCCL rank; every collective's result, the in-place reduce-scatter
# included; each collective ordered after the compute stream on its own
# stream and waited by the compute stream (event trace); not-ready queries
# polled and cleared; the backend's host wait polling; health check and
# finalize; context groups' ring shift (ncclSend/ncclRecv in one group
# call), byte all-gather and reduce-scatter; expert groups' communicators
# and all-to-all (one group call of ncclSend / ncclRecv per peer with bytes,
# results against tests/a2a_check.h's), and the same on the emulation's
# NCCL (tests/test_nccl_emu), which refuses mismatched counts. An asynchronous NCCL error met in a host wait is one line naming
# the collective and group, exit 6; a host wait that never ends is the
# watchdog's: communicators aborted, exit 5. It checks dist_nccl.c's logic,
# not NCCL or a GPU (make test-gpu does).
. "$(dirname "$0")/lib.sh"
[ -x tests/test_dist_nccl ] || make -s tests/test_dist_nccl >/dev/null 2>&1
for layout in "4 2 2" "4 1 2" "4 2 1" "4 1 4" "4 4 1" "4 1 1" "2 1 1" "2 2 1"; do
    set -- $layout
    out=$(timeout 120 $MPIRUN "$1" tests/test_dist_nccl "$2" "$3" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out")
    if [ $rc -eq 0 ] && grep -q ' passed, 0 failed$' <<<"$line"; then ok "$1 ranks, tp $2 x shard $3: $line"
    else bad "$1 ranks, tp $2 x shard $3: exit $rc: $(grep -E 'FAIL|llmtrain' <<<"$out" | head -5)"; fi
done
# context parallelism: groups of 2 inside 4 ranks (a communicator of their
# own), and of 2 on 2 ranks (the dp communicator)
for layout in "4 2" "2 2"; do
    set -- $layout
    out=$(timeout 120 $MPIRUN "$1" tests/test_dist_nccl cp "$2" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out")
    if [ $rc -eq 0 ] && grep -q ' passed, 0 failed$' <<<"$line"; then ok "$1 ranks, context groups of $2 (ring shift, all-gather, reduce-scatter): $line"
    else bad "$1 ranks, cp $2: exit $rc: $(grep -E 'FAIL|llmtrain' <<<"$out" | head -5)"; fi
done
# expert groups: their own communicator (ep 2 of 4 ranks), the dp one (ep =
# dp), the context one (ep = cp 2), under tp 2; the all-to-all of random
# sizes as one group call of ncclSend / ncclRecv per peer with bytes
# ranks WHAT NP CMD...: CMD on NP MPI ranks passes every check
ranks() {
    local what=$1 np=$2 out rc line; shift 2
    out=$(timeout 120 $MPIRUN "$np" "$@" 2>&1); rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out")
    if [ $rc -eq 0 ] && grep -q ' passed, 0 failed$' <<<"$line"; then ok "$what: $line"
    else bad "$what: exit $rc: $(grep -E 'FAIL|llmtrain' <<<"$out" | head -5)"; fi
}
for layout in "2 1 1 2" "4 1 1 2" "4 1 1 4" "4 2 1 2" "4 1 2 2" "4 1 2 4" "4 1 1 1"; do
    set -- $layout
    ranks "$1 ranks, tp $2 x cp $3, expert groups of $4 (all-to-all)" "$1" tests/test_dist_nccl ep "$2" "$3" "$4"
done
# the same all-to-all on the host emulation's NCCL and CUDA runtime
# (tests/cuda_emu, what tests/llmtrain_emu runs), and its refusal of a
# receive whose count is not the sender's
[ -x tests/test_nccl_emu ] || make -s tests/test_nccl_emu >/dev/null 2>&1
for layout in "2 1 2" "4 1 2" "4 1 4" "4 2 2" "4 1 1"; do
    set -- $layout
    ranks "emulated NCCL: $1 ranks, tp $2, expert groups of $3 (all-to-all)" "$1" tests/test_nccl_emu "$2" "$3"
done
timeout 60 $MPIRUN 2 tests/test_nccl_emu mismatch >"$TMP/mm.out" 2>&1; rc=$?
if [ $rc -eq 70 ] && grep -q '^llmtrain: rank 1: NCCL error in ncclSend/ncclRecv (all-to-all) on the ep group (2 ranks): invalid usage (ncclRecv of 12 bytes from peer 0 got 8 (the peer.s ncclSend count))$' "$TMP/mm.out"; then
    ok "emulated NCCL: a receive count that is not the sender's: exit 70, $(grep -m1 'NCCL error' "$TMP/mm.out")"
else bad "emulated NCCL count mismatch: exit $rc: $(grep llmtrain "$TMP/mm.out" | head -2)"; fi
timeout 60 $MPIRUN 2 tests/test_dist_nccl error >"$TMP/err.out" 2>&1; rc=$?
n=$(grep -c '^llmtrain: rank [01]: NCCL error in ncclAllReduce on the replicate group (2 ranks): remote process exited or there was a network error (fake detail second line)$' "$TMP/err.out")
if [ $rc -eq 6 ] && [ "$n" -ge 1 ]; then ok "asynchronous NCCL error in a host wait: exit 6, $(grep -m1 'NCCL error' "$TMP/err.out")"
else bad "asynchronous NCCL error: exit $rc: $(grep llmtrain "$TMP/err.out" | head -3)"; fi
timeout 60 $MPIRUN 2 tests/test_dist_nccl hang "$TMP/abort" >"$TMP/hang.out" 2>&1; rc=$?
if [ $rc -eq 5 ] && [ "$(grep -c '^abort$' "$TMP/abort.1" 2>/dev/null)" -eq 1 ] &&
   grep -q '^llmtrain: rank 1: watchdog: step 1 phase backward (collective none) exceeded parallel.timeout_s=0.5 s; aborting$' "$TMP/hang.out"; then
    ok "a host wait that never ends: the watchdog aborted the communicator, exit 5"
else bad "hang: exit $rc, abort marks '$(cat "$TMP/abort.1" 2>/dev/null)': $(grep llmtrain "$TMP/hang.out" | head -2)"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
