#!/bin/bash
# Watchdog (parallel.timeout_s, exit 5) and the test-only fault hook
# LLMTRAIN_FAULT: a hung or killed rank ends the whole job non-zero within
# the timeout plus a few seconds, so does a checkpoint write that never
# returns, while one that is slow but progressing is waited for; a poisoned gradient is a skipped step, and
# enough of them in a row is exit 4; a malformed value is exit 2; a healthy
# 2-rank run is not disturbed by the watchdog. Every case is bounded by
# `timeout 60`, so a regression fails instead of hanging CI.
. "$(dirname "$0")/lib.sh"
unset LLMTRAIN_FAULT

write_shard "$TMP/train.bin" 96 20000 1

cat >"$TMP/job.json" <<EOF
{"model": {"arch": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 10, "seq_len": 16, "micro_batch": 2, "global_batch": 4},
 "optim": {"lr": 1e-2, "warmup_steps": 2},
 "eval": {"sample_tokens": 0}}
EOF

# run NAME NP FAULT [--set ...]: runs the job under timeout 60; sets rc and secs
run() {
    local name=$1 np=$2 fault=$3; shift 3
    local cmd=("$BIN")
    [ "$np" -gt 1 ] && cmd=($MPIRUN "$np" "$BIN")
    local t0 t1
    t0=$(date +%s.%N)
    LLMTRAIN_FAULT="$fault" timeout 60 "${cmd[@]}" "$TMP/job.json" --set log.dir="$TMP/$name" \
        --set checkpoint.dir="$TMP/$name/ckpt" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    rc=$?
    t1=$(date +%s.%N)
    secs=$($PY -c "print(round($t1 - $t0, 1))")
}

# (a) rank 1 hangs at the start of step 3: the watchdogs end the job
run hang 2 "rank=1,step=3,kind=hang" --set parallel.timeout_s=3
line=$(grep -E '^llmtrain: rank [01]: watchdog: step 3 phase [a-z]+ \(collective [A-Za-z_]+\) exceeded parallel.timeout_s=3 s; aborting$' "$TMP/hang.err" | head -1)
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -n "$line" ] && $PY -c "import sys; sys.exit(not $secs <= 15)"; then
    ok "hang on rank 1 at step 3: exit $rc after ${secs}s: $line"
else
    bad "hang: rc=$rc after ${secs}s, stderr: $(head -5 "$TMP/hang.err")"
fi
if grep -q '^llmtrain: rank 1: watchdog: step 3 phase forward (collective none)' "$TMP/hang.err" ||
   grep -q '^llmtrain: rank 0: watchdog: step 3 phase allreduce (collective MPI_Iallreduce)' "$TMP/hang.err"; then
    ok "hang: the watchdog line names the hung rank's phase or the peer's blocked collective"
else
    bad "hang: unexpected watchdog lines: $(grep watchdog "$TMP/hang.err")"
fi

# (b) rank 1 is SIGKILLed at the start of step 3: the job ends non-zero
run die 2 "rank=1,step=3,kind=die" --set parallel.timeout_s=3
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && $PY -c "import sys; sys.exit(not $secs <= 13)"; then
    ok "die (SIGKILL) on rank 1 at step 3: exit $rc after ${secs}s"
else
    bad "die: rc=$rc after ${secs}s, stderr: $(head -5 "$TMP/die.err")"
fi

# (c) one poisoned step, single process: logged as skipped, run finishes
run nan1 1 "rank=0,step=2,kind=nan"
if [ $rc -eq 0 ] && grep -q '^{"step":2,.*"skipped":true' "$TMP/nan1/metrics.jsonl" &&
   [ "$(grep -c '"skipped":true' "$TMP/nan1/metrics.jsonl")" -eq 1 ] && grep -q '^{"step":10,' "$TMP/nan1/metrics.jsonl"; then
    ok "nan at step 2: step skipped, run exits 0"
else
    bad "nan at step 2: rc=$rc $(head -3 "$TMP/nan1.err") $(grep '"step":2,' "$TMP/nan1/metrics.jsonl")"
fi

# (d) poisoned steps 2-10 with max_nonfinite_steps=3: exit 4 after step 4
run nan9 1 "rank=0,step=2-10,kind=nan" --set optim.max_nonfinite_steps=3
if [ $rc -eq 4 ] && grep -q "3 consecutive steps with non-finite loss or gradients (step 4)" "$TMP/nan9.err"; then
    ok "nan at steps 2-10: exit 4 after 3 consecutive skipped steps"
else
    bad "nan at steps 2-10: rc=$rc $(head -3 "$TMP/nan9.err")"
fi
# ... and on one rank of two: the summed gradient is non-finite on every rank
run nan9mpi 2 "rank=1,step=2-10,kind=nan" --set optim.max_nonfinite_steps=3
if [ $rc -eq 4 ]; then
    ok "nan on rank 1 of 2 at steps 2-10: exit 4"
else
    bad "nan on rank 1 of 2: rc=$rc $(head -3 "$TMP/nan9mpi.err")"
fi

# ... and under HYBRID_SHARD 2 x 2 on rank 3, whose shard group is {2, 3}:
# rank 0 sees the NaN only through rank 1, rank 3's replica, whose chunk 0
# shard the all-reduce over the replicas sums with rank 3's poisoned one
run nanhyb 4 "rank=3,step=2,kind=nan" --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=2 \
    --set train.global_batch=8 --set train.micro_batch=1 --set train.steps=4
if [ $rc -eq 0 ] && grep -q '^{"step":2,.*"skipped":true' "$TMP/nanhyb/metrics.jsonl" &&
   [ "$(grep -c '"skipped":true' "$TMP/nanhyb/metrics.jsonl")" -eq 1 ] && grep -q '^{"step":4,' "$TMP/nanhyb/metrics.jsonl"; then
    ok "nan on rank 3 of HYBRID_SHARD 2 x 2 at step 2: skipped on rank 0 too (through the replicate all-reduce), run exits 0"
else
    bad "nan on rank 3 of HYBRID_SHARD 2 x 2: rc=$rc $(head -3 "$TMP/nanhyb.err") $(grep '"step":2,' "$TMP/nanhyb/metrics.jsonl")"
fi

# (d2) checkpoint writes: one that keeps writing, slower than the timeout
# (rank 1's file at 4 KiB a 20 ms, about 6 s, against parallel.timeout_s 3)
# is waited for; one that never returns still ends the job (exit 5)
ck="--set model.n_embd=64 --set model.n_layer=4 --set checkpoint.every_steps=3 --set checkpoint.async=false --set parallel.timeout_s=3"
run ckslow 2 "rank=1,step=3,kind=ckpt_slow" $ck
if [ $rc -eq 0 ] && ! grep -q watchdog "$TMP/ckslow.err" && [ -f "$TMP/ckslow/ckpt/step_00000003/manifest.json" ] &&
   $PY -c "import sys; sys.exit(not $secs >= 4)"; then
    ok "a checkpoint write slower than parallel.timeout_s but progressing: waited for, exit 0 (${secs}s)"
else
    bad "slow checkpoint write: rc=$rc after ${secs}s: $(grep -E 'watchdog|error' "$TMP/ckslow.err" | head -2)"
fi
run ckhang 2 "rank=1,step=3,kind=ckpt_hang" $ck
if [ $rc -eq 5 ] && grep -q '^llmtrain: rank [01]: watchdog: step 3 phase checkpoint' "$TMP/ckhang.err" &&
   $PY -c "import sys; sys.exit(not $secs <= 15)"; then
    ok "a checkpoint write that never returns: watchdog, exit 5 after ${secs}s"
else
    bad "hung checkpoint write: rc=$rc after ${secs}s: $(grep -E 'watchdog|error' "$TMP/ckhang.err" | head -2)"
fi

# (e) malformed LLMTRAIN_FAULT: exit 2, one line
for f in "rank=1,step=3,kind=explode" "rank=1,kind=hang" "step=x,kind=die" "rank=0,step=5-2,kind=nan" "bogus" "step=2,kind=die,attempt=0" "step=2,kind=ckpt_die,attempt=x"; do
    run malformed 1 "$f"
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/malformed.err")" -eq 1 ] && grep -q '^llmtrain: LLMTRAIN_FAULT' "$TMP/malformed.err"; then
        ok "malformed LLMTRAIN_FAULT=\"$f\": exit 2, one line"
    else
        bad "malformed LLMTRAIN_FAULT=\"$f\": rc=$rc $(cat "$TMP/malformed.err")"
    fi
done

# (f) healthy 2-rank run with a short timeout: the watchdog stays quiet
run healthy 2 "" --set parallel.timeout_s=5
if [ $rc -eq 0 ] && ! grep -q watchdog "$TMP/healthy.err" && grep -q '^{"step":10,' "$TMP/healthy/metrics.jsonl"; then
    ok "healthy 2-rank run exits 0 (${secs}s)"
else
    bad "healthy 2-rank run: rc=$rc $(head -5 "$TMP/healthy.err")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
