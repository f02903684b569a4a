#!/bin/bash
# The whole trainer under AddressSanitizer, LeakSanitizer and
# UndefinedBehaviorSanitizer (tests/llmtrain_asan: a CPU-only gcc build at
# -O1, every finding fatal): a tiny Llama (GQA) trains with asynchronous
# checkpoints, durable copies and keep_last, evaluation with samples, the
# step profile, a TensorBoard event file, selective checkpointing and bf16 working weights with
# stochastic rounding; resumes; is exported and trained again from the
# export (init.from); a NaN step is skipped and a NaN streak ends in exit 4;
# GPT-2 under full checkpointing; then 2 ranks over the TCP rendezvous
# (FULL_SHARD with a checkpoint and its resume, tp 2 with sequence
# parallelism) and 2 MPI ranks (FULL_SHARD). Each run must end with its
# exit code and leave no sanitizer report (leaks are checked except under
# MPI, whose library keeps allocations past exit).
. "$(dirname "$0")/lib.sh"
ASAN=$PWD/tests/llmtrain_asan
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:log_path=$TMP/san/asan
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$TMP/san/ubsan
mkdir -p "$TMP/san"

[ -x "$ASAN" ] || { bad "tests/llmtrain_asan not built (make test builds it)"; echo "$pass passed, $fail failed"; exit 1; }
if ASAN_OPTIONS=help=1 "$ASAN" --version 2>&1 | grep -q "Available flags for AddressSanitizer"; then
    ok "llmtrain_asan runs under AddressSanitizer"
else
    bad "llmtrain_asan has no AddressSanitizer"
fi

# run NAME WANT_RC COMMAND...: COMMAND exits WANT_RC and leaves no report
run() {
    local name=$1 want=$2; shift 2
    rm -f "$TMP"/san/*
    "$@" >"$TMP/$name.out" 2>&1
    local rc=$? reports
    reports=$(cat "$TMP"/san/* 2>/dev/null | grep -m3 -E "ERROR: |runtime error|SUMMARY" | tr '\n' ' ')
    if [ "$rc" -eq "$want" ] && [ -z "$reports" ]; then
        ok "$name: exit $rc, no sanitizer report"
    else
        bad "$name: exit $rc (expected $want): ${reports:-$(grep -m2 'llmtrain' "$TMP/$name.out" | tr '\n' ' ')}"
    fi
}

write_shard "$TMP/train.bin" 96 20000 1
tiny_job llama "$TMP/llama.json" "$TMP/train.bin"
tiny_job gpt2 "$TMP/gpt2.json" "$TMP/train.bin"
L=(--set train.steps=6 --set checkpoint.every_steps=2 --set checkpoint.async=true --set checkpoint.keep_last=2
   --set checkpoint.dir="$TMP/ck" --set checkpoint.durable_dir="$TMP/dur" --set eval.every_steps=3 --set eval.batches=2
   --set eval.sample_tokens=4 --set log.profile_steps=2 --set train.activation_checkpointing=selective
   --set train.param_dtype=bf16 --set optim.stochastic_rounding=true --set log.dir="$TMP/run"
   --set log.tensorboard_dir="$TMP/tb")
run "llama: checkpoints, durable copies, eval, samples, profile, selective, bf16" 0 "$ASAN" "$TMP/llama.json" "${L[@]}"
ls "$TMP"/tb/events.out.tfevents.* >/dev/null 2>&1 || bad "llama: no TensorBoard event file in $TMP/tb"
ls "$TMP/dur/step_00000006/manifest.json" >/dev/null 2>&1 || bad "llama: no durable step 6 ($(ls "$TMP/dur" 2>&1 | tr '\n' ' '))"
run "llama: resumed from step 6 to 8" 0 "$ASAN" "$TMP/llama.json" "${L[@]}" --set train.steps=8 --set optim.override_schedule=true
grep -q "^resume: .*step_00000006 at step 6" "$TMP/llama: resumed from step 6 to 8.out" && grep -qE "^step +8/8 " "$TMP/llama: resumed from step 6 to 8.out" ||
    bad "llama: not resumed from step 6 to step 8: $(grep -m1 '^resume' "$TMP/llama: resumed from step 6 to 8.out")"
run "export of the checkpoint root" 0 "$ASAN" export "$TMP/ck" "$TMP/hf"
run "init.from the export" 0 "$ASAN" "$TMP/llama.json" --set init.from="$TMP/hf" --set train.steps=2 --set log.dir="$TMP/from" \
    --set checkpoint.dir="$TMP/ck_from"
run "a NaN step skipped" 0 env LLMTRAIN_FAULT=step=3,kind=nan "$ASAN" "$TMP/llama.json" --set train.steps=4 --set log.dir="$TMP/nan" \
    --set checkpoint.dir="$TMP/ck_nan"
run "a NaN streak: exit 4" 4 env LLMTRAIN_FAULT=step=2-9,kind=nan "$ASAN" "$TMP/llama.json" --set optim.max_nonfinite_steps=3 \
    --set log.dir="$TMP/nan4" --set checkpoint.dir="$TMP/ck_nan4"
run "gpt2: full checkpointing, LM head in chunks" 0 "$ASAN" "$TMP/gpt2.json" --set train.steps=3 \
    --set train.activation_checkpointing=full --set train.lm_head_chunk=8 --set log.dir="$TMP/g" --set checkpoint.dir="$TMP/ck_g"

# 2 ranks over TCP (no MPI library: leaks checked here too)
TCK=(--set parallel.strategy=FULL_SHARD --set train.steps=4 --set checkpoint.every_steps=2 --set checkpoint.dir="$TMP/ck_tcp"
     --set log.dir="$TMP/tcp")
run "TCP FULL_SHARD 2 with checkpoints" 0 trun tcp 2 "$ASAN" "$TMP/llama.json" "${TCK[@]}"
run "TCP FULL_SHARD 2 resumed" 0 trun tcpr 2 "$ASAN" "$TMP/llama.json" "${TCK[@]}" --set train.steps=6 --set optim.override_schedule=true
grep -q "^resume: .*step_00000004 at step 4" "$TMP/TCP FULL_SHARD 2 resumed.out" || bad "TCP FULL_SHARD 2: not resumed from step 4"
run "TCP tp 2 with sequence parallelism" 0 trun tp 2 "$ASAN" "$TMP/llama.json" --set parallel.tensor=2 \
    --set parallel.sequence_parallel=true --set train.steps=3 --set log.dir="$TMP/tp" --set checkpoint.dir="$TMP/ck_tp"

# 2 MPI ranks: Open MPI keeps allocations past exit, so no leak check
run "MPI FULL_SHARD 2" 0 env ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" $MPIRUN 2 -x ASAN_OPTIONS -x UBSAN_OPTIONS \
    "$ASAN" "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set train.steps=3 --set log.dir="$TMP/mpi" \
    --set checkpoint.dir="$TMP/ck_mpi"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
