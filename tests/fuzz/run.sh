#!/bin/bash
# make fuzz: clang's libFuzzer on each reader (tests/fuzz/fuzz.c) for
# FUZZ_SECONDS (default 60) each, from the seeds in tests/fuzz/corpus/<target>/;
# FUZZ_TARGETS picks some (default: all seven). New inputs that grow coverage
# go to a scratch corpus, not the committed one; a finding stops the run with
# its input saved as tests/fuzz/build/<target>-crash-<sha1> (exit 1). To keep
# one as a regression, fix the reader and copy the input into the target's
# corpus folder: make test replays every file there (tests/test_fuzz.sh).
set -u
cd "$(dirname "$0")/../.." || exit 2
SECONDS_EACH=${FUZZ_SECONDS:-60}
TARGETS=${FUZZ_TARGETS:-config job safetensors hf_config manifest shard indexed vocab}
BIN=tests/fuzz/build/fuzz
[ -x "$BIN" ] || { echo "fuzz: FAIL: $BIN not built (make fuzz builds it)" >&2; exit 1; }
case $SECONDS_EACH in ''|*[!0-9]*) echo "fuzz: FAIL: FUZZ_SECONDS=$SECONDS_EACH: expected a whole number of seconds" >&2; exit 1;; esac
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
rc=0
for t in $TARGETS; do
    [ -d "tests/fuzz/corpus/$t" ] || { echo "fuzz: FAIL: no target '$t' (tests/fuzz/corpus/$t missing)" >&2; exit 1; }
    mkdir -p "$SCRATCH/$t"
    out=$(LLMTRAIN_FUZZ_TARGET=$t "$BIN" -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -max_len=16384 \
          -artifact_prefix="tests/fuzz/build/$t-" "$SCRATCH/$t" "tests/fuzz/corpus/$t" 2>&1)
    status=$?
    runs=$(echo "$out" | sed -n 's/^Done \([0-9]*\) runs.*/\1/p' | tail -1)
    cov=$(echo "$out" | grep -o 'cov: [0-9]*' | tail -1)
    if [ "$status" -eq 0 ]; then
        echo "fuzz: $t: ${runs:-?} inputs in ${SECONDS_EACH} s, ${cov:-cov: ?} edges, no finding"
    else
        echo "$out" | grep -v '^#' | tail -40
        echo "fuzz: $t: FINDING (libFuzzer exit $status); the input is under tests/fuzz/build/$t-*"
        rc=1
    fi
done
exit $rc
