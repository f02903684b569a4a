#!/bin/bash
# The CUDA build on a machine without a GPU (CI): when nvcc exists, ./llmtrain
# carries the CUDA backend and NCCL and still runs on the CPU, alone and as 2
# MPI ranks (auto falls back to the CPU on every rank); train.device=cuda is
# one clear error line and exit 2, for 1 rank and for 2; `make test-gpu`
# fails loudly (non-zero, one line naming the missing device) rather than
# skipping; `make NVCC=` builds a CPU-only binary (no CUDA, no NCCL) that
# names the missing backend. On a machine with a GPU the no-GPU cases are
# replaced by "auto picks cuda".
. "$(dirname "$0")/lib.sh"
unset LLMTRAIN_DEVICE

have_nvcc=0
{ command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } && have_nvcc=1
have_gpu=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU' && have_gpu=1

write_shard "$TMP/train.bin" 64 4000 1
cat >"$TMP/job.json" <<JSON
{"model": {"arch": "llama", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_kv_head": 1, "vocab_size": 64, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 2, "seq_len": 16, "micro_batch": 2, "global_batch": 4},
 "eval": {"sample_tokens": 0}, "log": {"dir": "$TMP/run"}, "checkpoint": {"dir": "$TMP/ckpt"}}
JSON

if [ $have_nvcc = 1 ]; then
    if nm "$BIN" 2>/dev/null | grep -q 'kernels_cuda_available'; then ok "nvcc present: ./llmtrain is built with the CUDA backend"
    else bad "nvcc present but ./llmtrain has no CUDA backend (kernels_cuda_available missing)"; fi
    if nm "$BIN" 2>/dev/null | grep -q 'dist_nccl_attach' && ldd "$BIN" | grep -q 'libnccl'; then ok "the CUDA build carries the NCCL collectives (dist_nccl.c, libnccl)"
    else bad "the CUDA build lacks dist_nccl_attach or libnccl: $(ldd "$BIN" | grep -i -E 'nccl|cuda|cublas')"; fi
    if nm tests/test_gpu >/dev/null 2>&1 || make -s tests/test_gpu >"$TMP/mk.out" 2>&1; then ok "tests/test_gpu builds"
    else bad "tests/test_gpu does not build: $(tail -3 "$TMP/mk.out")"; fi
else
    echo "note: no nvcc on this machine: only the CPU-only cases run"
fi

# CPU runs of this binary: auto and cpu
if $BIN "$TMP/job.json" --set train.device=cpu >"$TMP/cpu.out" 2>&1 && grep -q "backend cpu" "$TMP/cpu.out"; then ok "train.device=cpu trains on the CPU"
else bad "train.device=cpu: $(tail -3 "$TMP/cpu.out")"; fi
$BIN "$TMP/job.json" --set log.dir="$TMP/run_auto" >"$TMP/auto.out" 2>&1; rc=$?
want=cpu; [ $have_nvcc = 1 ] && [ $have_gpu = 1 ] && want=cuda
if [ $rc -eq 0 ] && grep -q "backend $want" "$TMP/auto.out"; then ok "train.device=auto picks $want here"
else bad "train.device=auto: exit $rc, expected backend $want: $(head -3 "$TMP/auto.out")"; fi
if LLMTRAIN_DEVICE=cpu $BIN "$TMP/job.json" --set log.dir="$TMP/run_env" >"$TMP/env.out" 2>&1 && grep -q "backend cpu" "$TMP/env.out"; then
    ok "LLMTRAIN_DEVICE=cpu pins auto to the CPU"
else bad "LLMTRAIN_DEVICE=cpu: $(head -3 "$TMP/env.out")"; fi

# 2 ranks: auto gives the same backend on both (the CPU without a GPU)
$MPIRUN 2 $BIN "$TMP/job.json" --set log.dir="$TMP/run_auto2" >"$TMP/auto2.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "backend $want" "$TMP/auto2.out" && grep -q '| world 2$' "$TMP/auto2.out"; then ok "2 ranks, train.device=auto: backend $want"
else bad "2 ranks, train.device=auto: exit $rc, expected backend $want: $(grep -E 'backend|llmtrain:' "$TMP/auto2.out" | head -3)"; fi

if [ $have_nvcc = 1 ] && [ $have_gpu = 0 ]; then
    $BIN "$TMP/job.json" --set train.device=cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q 'train.device "cuda": no usable CUDA device' "$TMP/err"; then
        ok "train.device=cuda without a GPU: exit 2, $(cat "$TMP/err")"
    else bad "train.device=cuda without a GPU: exit $rc, stderr: $(head -c 300 "$TMP/err")"; fi
    for strat in NO_SHARD FULL_SHARD; do
        $MPIRUN 2 $BIN "$TMP/job.json" --set train.device=cuda --set parallel.strategy=$strat --set log.dir="$TMP/run_cuda2" \
            >"$TMP/out2" 2>"$TMP/err2"; rc=$?
        if [ $rc -eq 2 ] && [ "$(grep -c '^llmtrain:' "$TMP/err2")" -eq 1 ] && grep -q '^llmtrain: .*train.device "cuda": no usable CUDA device' "$TMP/err2" &&
           [ ! -e "$TMP/run_cuda2/metrics.jsonl" ]; then
            ok "2 ranks ($strat), train.device=cuda without a GPU: exit 2, one line for the job"
        else bad "2 ranks ($strat), train.device=cuda without a GPU: exit $rc, stderr: $(grep llmtrain "$TMP/err2" | head -c 400)"; fi
    done
    # check validates the job for the cluster it names, not for this machine: no GPU needed
    $BIN check "$TMP/job.json" --world 2 --set train.device=cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ $rc -eq 0 ] && [ ! -s "$TMP/err" ] && grep -q "valid for 2 ranks" "$TMP/out"; then
        ok "llmtrain check --world 2 with train.device=cuda and no GPU: valid (the cluster's devices are not probed)"
    else bad "llmtrain check --world 2, train.device=cuda: exit $rc, stderr: $(head -c 300 "$TMP/err")"; fi
    make -s test-gpu >"$TMP/tg.out" 2>"$TMP/tg.err"; rc=$?
    if [ $rc -ne 0 ] && grep -q "test-gpu: FAIL: no usable CUDA device" "$TMP/tg.err"; then
        ok "make test-gpu without a GPU fails loudly (exit $rc): $(grep 'test-gpu: FAIL' "$TMP/tg.err")"
    else bad "make test-gpu without a GPU: exit $rc, stderr: $(head -c 300 "$TMP/tg.err")"; fi
    make -s bench-gpu >"$TMP/bg.out" 2>"$TMP/bg.err"; rc=$?
    if [ $rc -ne 0 ] && grep -q "bench-gpu: FAIL: .*no usable CUDA device" "$TMP/bg.err"; then
        ok "make bench-gpu without a GPU fails loudly (exit $rc)"
    else bad "make bench-gpu without a GPU: exit $rc, stderr: $(head -c 300 "$TMP/bg.err")"; fi
fi

# CPU-only build (make NVCC=) of a copy of the sources: links nothing CUDA
mkdir -p "$TMP/src/tests"
cp ./*.c ./*.h Makefile "$TMP/src/"
if (cd "$TMP/src" && make -s NVCC= llmtrain >"$TMP/cpuonly.out" 2>&1); then
    # (kernels_cuda_scratch_bytes, the CUDA backend's size arithmetic for llmtrain check, is plain C in every build)
    if ! nm "$TMP/src/llmtrain" | grep -v kernels_cuda_scratch_bytes | grep -q -i -E 'kernels_cuda|nccl' && ! ldd "$TMP/src/llmtrain" | grep -q -i -E 'cublas|nccl|cudart'; then
        ok "make NVCC= builds a CPU-only binary (no CUDA, no NCCL)"
    else bad "make NVCC= binary still carries CUDA"; fi
    "$TMP/src/llmtrain" "$TMP/job.json" --set train.device=cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "built without the CUDA backend" "$TMP/err"; then
        ok "CPU-only build: train.device=cuda is exit 2, $(cat "$TMP/err")"
    else bad "CPU-only build, train.device=cuda: exit $rc, stderr: $(head -c 300 "$TMP/err")"; fi
    if "$TMP/src/llmtrain" "$TMP/job.json" --set log.dir="$TMP/run_co" >"$TMP/co.out" 2>&1; then ok "CPU-only build trains (auto -> cpu)"
    else bad "CPU-only build run failed: $(tail -3 "$TMP/co.out")"; fi
else
    bad "make NVCC= failed: $(tail -5 "$TMP/cpuonly.out")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
