#!/bin/bash
# The CUDA backend's own source on the host emulation of CUDA (tests/cuda_emu:
# kernels.cu rewritten to C++ by cu2cpp.py, a block's threads as fibers,
# cuBLASLt / CUB / NCCL stand-ins; see tests/cuda_emu/emu.h), so that the
# checks of make test-gpu run on a machine without a GPU:
#   1. the emulator's own strictness (tests/cuda_emu/selftest: a divergent
#      barrier, too much dynamic shared memory, a misaligned cuBLASLt
#      operand, lane-dependent wmma operands each fail as on the hardware);
#   2. tests/gpu_tests.sh with the emulated binaries: every CUDA kernel
#      against the CPU backend in tf32, bf16 and fp32 GEMM modes (attention
#      shapes up to T = 256), whole GPT-2 / Llama runs on train.device=cuda
#      against the CPU (GEMM and fused attention, offload, selective
#      checkpointing), and with 2 emulated devices the 2-rank NCCL runs
#      (NO_SHARD, FULL_SHARD, tp 2) against MPI on the CPU and the hung-rank
#      watchdog. 8 steps per run instead of 20 (the emulator runs a step of
#      the small jobs in about 0.75 s).
# What it cannot show: speed, races between streams, and the hardware's own
# rounding (the tolerances are the GPU suite's).
cd "$(dirname "$0")/.." || exit 2
pass=0; fail=0
out=$(tests/cuda_emu/selftest.sh 2>&1); rc=$?
echo "$out"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -1)
if [ -n "$line" ]; then pass=$(awk '{print $1}' <<<"$line"); fail=$(awk '{print $3}' <<<"$line"); fi
[ $rc -ne 0 ] && [ "$fail" -eq 0 ] && fail=1
out=$(LLMTRAIN_GPU_BIN=$PWD/tests/llmtrain_emu TEST_GPU_BIN=tests/test_gpu_emu TEST_GPU_MAX_T=256 GPU_TEST_STEPS=8 \
      GPU_COUNT=2 LLMTRAIN_CUDA_EMU_DEVICES=2 GPU_TESTS_EMULATED=1 tests/gpu_tests.sh 2>&1); rc=$?
echo "$out"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -1)
if [ -n "$line" ]; then
    pass=$((pass + $(awk '{print $1}' <<<"$line"))); fail=$((fail + $(awk '{print $3}' <<<"$line")))
else
    echo "FAIL tests/gpu_tests.sh on the emulation printed no summary (exit $rc)"; fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
