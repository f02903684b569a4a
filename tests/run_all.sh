#!/bin/bash
# Run every test suite; each prints "N passed, M failed" as its last line.
# Prints the totals the same way and exits non-zero if anything failed.
#   tests/run_all.sh         every suite (make test, CI)
#   tests/run_all.sh quick   the inner loop's tier (make test-quick): the
#                            kernel, FP8, model, data, config and checkpoint units
#                            and a 1-rank and 2-rank training smoke
cd "$(dirname "$0")/.." || exit 2
case "${1:-all}" in all|quick) ;; *) echo "usage: tests/run_all.sh [quick]" >&2; exit 2;; esac
PY=/usr/bin/python3
total_pass=0; total_fail=0; broken=""
run() {
    local name="$1"; shift
    echo "=== $name: $*"
    local out rc t0=$SECONDS
    out=$("$@" 2>&1); rc=$?
    echo "$out" | tail -n 40
    echo "--- $name: $((SECONDS - t0)) s" # where make test's time goes
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
run ckpt tests/test_ckpt
run fp8 "$PY" tests/test_fp8.py
if [ "${1:-all}" = quick ]; then
    run cli tests/test_cli.sh
    run smoke tests/test_smoke.sh
    echo "==="
    [ -n "$broken" ] && echo "suites that crashed or exited non-zero:$broken"
    echo "$total_pass passed, $total_fail failed"
    [ "$total_fail" -eq 0 ]
    exit
fi
run rendezvous tests/test_rendezvous
run cli tests/test_cli.sh
run torch "$PY" tests/test_torch.py --bin ./llmtrain
run fp8_model "$PY" tests/test_fp8_model.py --bin ./llmtrain
run plot "$PY" tests/test_plot.py --bin ./llmtrain
run tensorboard "$PY" tests/test_tensorboard.py --bin ./llmtrain
for t in tests/test_*.sh; do
    case "$t" in tests/test_cli.sh) continue;; esac
    [ -x "$t" ] && run "$(basename "$t" .sh)" "$t"
done
echo "==="
[ -n "$broken" ] && echo "suites that crashed or exited non-zero:$broken"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
