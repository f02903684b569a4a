#!/bin/bash
# The emulator's own checks (tests/cuda_emu/selftest.cu, cudnn_selftest.cpp): run by
# tests/test_cuda_emu.sh before the CUDA backend's checks.
cd "$(dirname "$0")" || exit 2
BIN=build/selftest
pass=0; fail=0
# (blocks: 4 OS threads run the launch's blocks, whatever the host has)
for mode in shuffle smem wmma mma-bf16 ldmatrix cublas-align events blocks; do
    out=$(LLMTRAIN_CUDA_EMU_THREADS=4 $BIN $mode 2>&1); rc=$?
    echo "$out"
    p=$(grep -c '^ok' <<<"$out"); f=$(grep -c '^FAIL' <<<"$out")
    pass=$((pass + p)); fail=$((fail + f))
    [ $rc -ne 0 ] && [ "$f" -eq 0 ] && { echo "FAIL selftest $mode exited $rc"; fail=$((fail + 1)); }
done
# the cuDNN emulator (cudnn_selftest.cpp): graphs through the backend API
# against direct computation, causal attention forward and backward, errors
out=$(build/cudnn_selftest 2>&1); rc=$?
echo "$out" | grep -v '^[0-9]* passed, [0-9]* failed$'
p=$(grep -c '^ok' <<<"$out"); f=$(grep -c '^FAIL' <<<"$out")
pass=$((pass + p)); fail=$((fail + f))
[ $rc -ne 0 ] && [ "$f" -eq 0 ] && { echo "FAIL cudnn_selftest exited $rc"; fail=$((fail + 1)); }
# these must end the process: exit 70 and one line from the emulator
for case in "diverge:deadlocks: .* a barrier not every thread reaches" \
            "diverge-many:diverge_many_k: block (37,0,0) deadlocks: .* a barrier not every thread reaches" \
            "wmma-poison:operands differ between the lanes of a warp" \
            "wmma-misaligned:wmma tile pointer not 32-byte aligned" \
            "mma-bf16-partial:mma.sync with fewer than 32 live lanes" \
            "ldmatrix-misaligned:ldmatrix row address not 16-byte aligned"; do
    mode=${case%%:*} want=${case#*:}
    err=$(LLMTRAIN_CUDA_EMU_THREADS=4 $BIN $mode 2>&1 >/dev/null); rc=$?
    if [ $rc -eq 70 ] && [ "$(wc -l <<<"$err")" -eq 1 ] && grep -q "^llmtrain: CUDA emulator: kernel .*$want" <<<"$err"; then
        echo "ok   $mode ends the process: exit 70, $err"; pass=$((pass + 1))
    else
        echo "FAIL $mode: exit $rc, expected 70 and one line matching '$want': $err"; fail=$((fail + 1))
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
