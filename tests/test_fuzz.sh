#!/bin/bash
# The readers of the files a user hands llmtrain, under AddressSanitizer and
# UndefinedBehaviorSanitizer (tests/fuzz_replay, built from tests/fuzz/fuzz.c
# by gcc): every file of tests/fuzz/corpus/<target>/ (the seeds and the
# inputs `make fuzz` once found a fault with) ends in acceptance or a
# one-line refusal, with no sanitizer report, no allocation past 2 GiB and
# no internal error; the inputs of the fixed findings are refused with the
# line their fix gives; the replay finds a fault when there is one (a
# two-line refusal, a read past a buffer); and the trainer's own error lines
# stay one line when the input holds a newline (die() escapes it).
. "$(dirname "$0")/lib.sh"
REPLAY=$PWD/tests/fuzz_replay
CORPUS=$PWD/tests/fuzz/corpus
export ASAN_OPTIONS=detect_leaks=0:max_allocation_size_mb=2048:allocator_may_return_null=0:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TMPDIR=$TMP LLMTRAIN_CACHE_DIR=$TMP/cache

[ -x "$REPLAY" ] || { bad "tests/fuzz_replay not built (make test builds it)"; echo "$pass passed, $fail failed"; exit 1; }
if ASAN_OPTIONS=help=1 "$REPLAY" 2>&1 | grep -q "Available flags for AddressSanitizer"; then
    ok "fuzz_replay runs under AddressSanitizer"
else
    bad "fuzz_replay has no AddressSanitizer"
fi

# every corpus file of every target
for dir in "$CORPUS"/*/; do
    t=$(basename "$dir")
    for f in "$dir"*; do
        out=$("$REPLAY" "$t" "$f" 2>"$TMP/err"); rc=$?
        if [ $rc -eq 0 ] && [ ! -s "$TMP/err" ]; then
            ok "$t $(basename "$f"): $(echo "${out#* * }" | cut -c1-200)"
        else
            bad "$t $(basename "$f"): exit $rc: $(grep -m3 -E 'ERROR|runtime error|fuzz:' "$TMP/err" | tr '\n' ' ')"
        fi
    done
done

# the fixed findings give their fix's line
expect() { # target file text
    out=$("$REPLAY" "$1" "$CORPUS/$1/$2" 2>&1)
    if echo "$out" | grep -qF -- "$3"; then ok "$1 $2: refused with '$3'"; else bad "$1 $2: expected '$3', got: $out"; fi
}
expect vocab size_past_file "vocab header says 886556672 tokens but the file has only 105 bytes after the header"
expect manifest slice_offset_5e44 "slice 3: expected 5 non-negative integers"
expect manifest kind_control_char 'kind "param\x01": expected param'

# the replay reports a fault when there is one: a tensor name with a
# newline refused with it unescaped would be two lines (fuzz.c's check
# aborts), and a vocab token read past the end of a truncated file is
# ASan's report. Both are made here by copies of the readers with the fault
# put back.
mkdir -p "$TMP/broken"
sed 's/^    if (o < n) vformat_line(line + o, n - o, fmt, ap);/    if (o < n) vsnprintf(line + o, n - o, fmt, ap);/' util.c >"$TMP/broken/util.c"
grep -q 'vsnprintf(line + o' "$TMP/broken/util.c" || bad "could not put the unescaped die() back into a copy of util.c"
sed 's/if (len - p < l)$/if (0)/' data.c >"$TMP/broken/data.c"
grep -q 'if (0)$' "$TMP/broken/data.c" || bad "could not take the truncation check out of a copy of data.c"
if ${CC:-cc} -O1 -g -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -std=c11 -fopenmp -I. \
        -Wl,--wrap=die,--wrap=mmap,--wrap=munmap tests/fuzz/fuzz.c config.c hf.c ckpt.c model.c cp.c moe.c \
        "$TMP/broken/data.c" indexed.c kernels_cpu.c kernels_cpu_attention.c kernels_cpu_moe.c fp8.c "$TMP/broken/util.c" -lcjson -lopenblas -lm -lpthread -o "$TMP/broken/replay" 2>"$TMP/broken/cc.err"; then
    printf '{"model": {"n_la\\nyer": 2}}' >"$TMP/newline.json"
    out=$("$TMP/broken/replay" config "$TMP/newline.json" 2>"$TMP/err"); rc=$?
    if [ $rc -ne 0 ] && grep -q "not one printable line" "$TMP/err"; then
        ok "the replay finds a two-line refusal (die() without its escaping: exit $rc)"
    else
        bad "the replay missed a two-line refusal (exit $rc): $(head -c 300 "$TMP/err")"
    fi
    size=$(wc -c <"$CORPUS/vocab/v2.bin")
    head -c $((size - 5)) "$CORPUS/vocab/v2.bin" >"$TMP/cut.bin" # "hello" cut to "hel"
    out=$("$TMP/broken/replay" vocab "$TMP/cut.bin" 2>"$TMP/err"); rc=$?
    if [ $rc -ne 0 ] && grep -q "ERROR: AddressSanitizer: heap-buffer-overflow" "$TMP/err"; then
        ok "the replay finds a read past a truncated vocab file (its check taken out: exit $rc, ASan's report)"
    else
        bad "the replay missed a read past a truncated vocab file (exit $rc): $(head -c 300 "$TMP/err")"
    fi
    "$REPLAY" vocab "$TMP/cut.bin" >"$TMP/out" 2>&1 && grep -q "truncated vocab file: token 8 needs 5 bytes, file has 3 left" "$TMP/out" &&
        ok "the real reader refuses it: $(cut -c1-160 "$TMP/out")" ||
        bad "the real reader on the truncated vocab file: $(cat "$TMP/out")"
else
    bad "building the replay with the faults put back: $(head -3 "$TMP/broken/cc.err")"
fi

# the trainer itself: a job file whose key holds a newline gets one line
printf '{"model": {"n_la\\nyer": 2}, "data": {"train": "x"}}' >"$TMP/nl.json"
"$BIN" "$TMP/nl.json" >/dev/null 2>"$TMP/err"; rc=$?
lines=$(wc -l <"$TMP/err")
if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF 'n_la\nyer' "$TMP/err"; then
    ok "a key with a newline: exit 2, one line naming it escaped: $(cat "$TMP/err")"
else
    bad "a key with a newline: exit $rc, $lines line(s): $(cat "$TMP/err")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
