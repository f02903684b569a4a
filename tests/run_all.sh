#!/bin/bash
# Run every test suite; each prints "N passed, M failed" as its last line.
# Prints the totals the same way and exits non-zero if anything failed.
#   tests/run_all.sh         every suite (make test, CI)
#   tests/run_all.sh quick   the inner loop's tier (make test-quick): the
#                            kernel, FP8, model, data, config and checkpoint units
#                            and a 1-rank and 2-rank training smoke
# Every suite runs in two lanes: the longest, CPU-bound ones (the CUDA
# emulation, FP8 convergence, activation checkpointing; LANE2 below) one
# after another beside the rest, which spend much of their time waiting
# (launches, timeouts, restarts, file syncs): make test's wall time falls
# by about a third on 2 cores. Each suite's output is printed whole when it
# ends. TEST_LANES=1 runs everything in one lane.
cd "$(dirname "$0")/.." || exit 2
case "${1:-all}" in all|quick) ;; *) echo "usage: tests/run_all.sh [quick]" >&2; exit 2;; esac
PY=/usr/bin/python3
total_pass=0; total_fail=0; broken=""
run() {
    local name="$1"; shift
    local out rc t0=$SECONDS
    out=$("$@" 2>&1); rc=$?
    report "$name" "$*" "$out" "$rc" $((SECONDS - t0))
}
# report NAME CMD OUTPUT EXIT SECONDS: print a suite's end and add up its summary
report() {
    local name="$1" out="$3" rc="$4"
    echo "=== $name: $2"
    echo "$out" | tail -n 40
    echo "--- $name: $5 s" # where make test's time goes
    local line
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "--- $name: no summary line (exit $rc)"; broken="$broken $name"; total_fail=$((total_fail + 1)); return
    fi
    local p f
    p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}')
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then broken="$broken $name"; total_fail=$((total_fail + 1)); fi
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The CPU suite checks the CPU backend: on a machine with a GPU, train.device
# "auto" would pick CUDA. (make test-gpu checks the CUDA backend.)
export LLMTRAIN_DEVICE=cpu
run kernels tests/test_kernels
run model tests/test_model
run data tests/test_data
run indexed tests/test_indexed
run ckpt tests/test_ckpt
run fp8 "$PY" tests/test_fp8.py
run moe "$PY" tests/test_moe.py --bin ./llmtrain
# against transformers itself, where scripts/install_deps.sh could install it
[ -x tests/.venv-hf/bin/python ] && run transformers tests/.venv-hf/bin/python tests/test_transformers.py --bin ./llmtrain
if [ "${1:-all}" = quick ]; then
    run cli tests/test_cli.sh
    run smoke tests/test_smoke.sh
    echo "==="
    [ -n "$broken" ] && echo "suites that crashed or exited non-zero:$broken"
    echo "$total_pass passed, $total_fail failed"
    [ "$total_fail" -eq 0 ]
    exit
fi
LANE2="tests/test_cuda_emu.sh tests/test_fp8_train.sh tests/test_actckpt.sh"
lane=$(mktemp -d) || exit 2
trap 'kill $lane2_pid 2>/dev/null; rm -rf "$lane"' EXIT
# the second lane: each suite's output, exit code and seconds into $lane
lane2() {
    local t n t0
    for t in $LANE2; do
        n=$(basename "$t" .sh); t0=$SECONDS
        "$t" >"$lane/$n.out" 2>&1; echo $? >"$lane/$n.rc"; echo $((SECONDS - t0)) >"$lane/$n.s"
    done
}
if [ "${TEST_LANES:-2}" = 1 ]; then lane2; else lane2 & lane2_pid=$!; fi
run rendezvous tests/test_rendezvous
run cli tests/test_cli.sh
run torch "$PY" tests/test_torch.py --bin ./llmtrain
run fp8_model "$PY" tests/test_fp8_model.py --bin ./llmtrain
run plot "$PY" tests/test_plot.py --bin ./llmtrain
run tensorboard "$PY" tests/test_tensorboard.py --bin ./llmtrain
for t in tests/test_*.sh; do
    case " tests/test_cli.sh $LANE2 " in *" $t "*) continue;; esac
    [ -x "$t" ] && run "$(basename "$t" .sh)" "$t"
done
[ -n "$lane2_pid" ] && wait "$lane2_pid"
for t in $LANE2; do
    n=$(basename "$t" .sh)
    report "$n" "$t" "$(cat "$lane/$n.out" 2>/dev/null)" "$(cat "$lane/$n.rc" 2>/dev/null || echo 1)" "$(cat "$lane/$n.s" 2>/dev/null)"
done
echo "==="
[ -n "$broken" ] && echo "suites that crashed or exited non-zero:$broken"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
