#!/bin/bash
# The checkpoint folders are checked and claimed before step 1: a second
# job on a folder a running job holds (checkpoint.dir or durable_dir; 1 or
# 2 ranks) is exit 2 and one line naming the holder's pid and host once
# checkpoint.lock_wait_s has passed (saying once that it waits), and
# leaves the first job's checkpoints alone; a job whose folder's job ends
# within the wait goes on and resumes its checkpoint; durable_dir naming
# checkpoint.dir's folder is exit 2; a run that dies on a bad token while
# a checkpoint is in flight leaves no .tmp folder; a lock file left by a job that
# was SIGKILLed blocks nothing; a file system without locks (tests/nolock.so)
# is one warning and the run goes on; a checkpoint.dir or durable_dir that
# cannot be written (under a regular file, on a read-only mount) is exit 3
# and one line before any step, on 1 and 2 ranks.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
ckpt_job "$TMP/job.json" "$TMP/train.bin" 8 2
steps_in() { grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null || echo 0; }
one_line() { [ "$(grep -c . "$1")" -eq 1 ]; }

# ---- a running job holds its folders ----
# job A: 8 steps, 1 s each from step 2 on (kind=slow), checkpoints every 2 steps
LLMTRAIN_FAULT="step=2-8,kind=slow" $BIN "$TMP/job.json" --set log.dir="$TMP/a" --set checkpoint.durable_dir="$TMP/a-dur" >"$TMP/a.out" 2>&1 &
apid=$!
wait_steps "$TMP/a/metrics.jsonl" 2 60 || bad "job A did not reach step 2"
# B on A's checkpoint.dir; C on its own checkpoint.dir but A's durable_dir; D the same as B over 2 ranks
# (checkpoint.lock_wait_s 0: no wait for A to end)
$BIN "$TMP/job.json" --set log.dir="$TMP/b" --set checkpoint.dir="$TMP/a/checkpoints" --set checkpoint.lock_wait_s=0 >"$TMP/b.out" 2>&1; rcb=$?
$BIN "$TMP/job.json" --set log.dir="$TMP/c" --set checkpoint.durable_dir="$TMP/a-dur" --set checkpoint.lock_wait_s=0 >"$TMP/c.out" 2>&1; rcc=$?
t0=$(date +%s.%N)
$MPIRUN 2 $BIN "$TMP/job.json" --set log.dir="$TMP/d" --set checkpoint.dir="$TMP/a/checkpoints" --set checkpoint.lock_wait_s=1.5 >"$TMP/d.out" 2>&1; rcd=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
held="is in use by another job: llmtrain pid $apid on host $(hostname), job $TMP/job.json, since "
if [ $rcb -eq 2 ] && one_line "$TMP/b.out" && grep -q "^llmtrain: checkpoint.dir: $TMP/a/checkpoints $held.*; two jobs on one folder" "$TMP/b.out" &&
   [ "$(steps_in "$TMP/b")" -eq 0 ]; then ok "a second job on a running job's checkpoint.dir: exit 2, one line naming pid $apid and the host, no step"
else bad "second job on checkpoint.dir: rc $rcb: $(head -3 "$TMP/b.out")"; fi
if [ $rcc -eq 2 ] && one_line "$TMP/c.out" && grep -q "^llmtrain: checkpoint.durable_dir: $TMP/a-dur $held" "$TMP/c.out"; then
    ok "a second job on a running job's durable_dir: exit 2, one line naming the holder"
else bad "second job on durable_dir: rc $rcc: $(head -3 "$TMP/c.out")"; fi
if [ $rcd -eq 2 ] && [ "$(grep -c "^llmtrain: checkpoint.dir: .*$held" "$TMP/d.out")" -eq 2 ] && [ "$(steps_in "$TMP/d")" -eq 0 ] &&
   grep -q "waiting up to 2 s (checkpoint.lock_wait_s) for it to end" "$TMP/d.out" && awk -v s="$secs" 'BEGIN { exit !(s >= 1.5) }'; then
    ok "the same over 2 ranks with checkpoint.lock_wait_s 1.5: one line that it waits, then after ${secs} s exit 2 and the line once"
else bad "2-rank second job: rc $rcd: $(grep llmtrain "$TMP/d.out" | head -3)"; fi
wait $apid; rca=$?
if [ $rca -eq 0 ] && [ -f "$TMP/a/checkpoints/step_00000008/manifest.json" ] && [ -f "$TMP/a-dur/step_00000008/manifest.json" ] &&
   [ "$(ls "$TMP/a/checkpoints" | grep -c '^step_0*[2468]$')" -eq 4 ] && ! ls -d "$TMP"/a/checkpoints/*.tmp >/dev/null 2>&1; then
    ok "the first job trained on undisturbed: its 4 checkpoints and their durable copies complete"
else bad "job A after the others: rc $rca, $(ls "$TMP/a/checkpoints" | tr '\n' ' ')"; fi

# ---- a job that ends while the next waits for its folder: the next goes on ----
LLMTRAIN_FAULT="step=2-4,kind=slow" $BIN "$TMP/job.json" --set log.dir="$TMP/w" --set train.steps=4 >"$TMP/w.out" 2>&1 &
wpid=$!
wait_steps "$TMP/w/metrics.jsonl" 1 60 || bad "job W did not reach step 1"
$BIN "$TMP/job.json" --set log.dir="$TMP/w2" --set checkpoint.dir="$TMP/w/checkpoints" --set train.steps=6 \
    --set optim.override_schedule=true >"$TMP/w2.out" 2>&1; rc=$?
wait $wpid; rcw=$?
if [ $rc -eq 0 ] && [ $rcw -eq 0 ] && grep -q "is in use by another job: llmtrain pid $wpid .*; waiting up to 60 s" "$TMP/w2.out" &&
   grep -q "^resume: $TMP/w/checkpoints/step_00000004 at step 4" "$TMP/w2.out" && [ "$(steps_in "$TMP/w2")" -eq 2 ]; then
    ok "a job started on a folder whose job is ending waits (one line), then resumes its final checkpoint (step 4) and trains on"
else bad "waiting for a lock: rc $rc/$rcw: $(grep -E 'llmtrain|resume' "$TMP/w2.out" | head -3)"; fi

# ---- durable_dir naming checkpoint.dir's folder: exit 2 ----
$BIN "$TMP/job.json" --set log.dir="$TMP/same" --set checkpoint.durable_dir="$TMP/same/./checkpoints" >"$TMP/same.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && one_line "$TMP/same.out" &&
   grep -q "^llmtrain: checkpoint.durable_dir $TMP/same/./checkpoints is the folder checkpoint.dir $TMP/same/checkpoints names; expected another folder" "$TMP/same.out"; then
    ok "durable_dir naming checkpoint.dir's folder (another spelling): exit 2, one line"
else bad "durable_dir = checkpoint.dir: rc $rc: $(head -3 "$TMP/same.out")"; fi

# ---- a SIGKILLed job's lock file blocks nothing ----
LLMTRAIN_FAULT="step=2-8,kind=slow" $BIN "$TMP/job.json" --set log.dir="$TMP/k" >"$TMP/k.out" 2>&1 &
kpid=$!
wait_steps "$TMP/k/metrics.jsonl" 3 60 || bad "job K did not reach step 3"
kill -9 $kpid; wait $kpid 2>/dev/null
stale=$(cat "$TMP/k/checkpoints/.llmtrain.lock")
$BIN "$TMP/job.json" --set log.dir="$TMP/k" >>"$TMP/k.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && [[ "$stale" == "llmtrain pid $kpid "* ]] && grep -q "^resume: .*step_00000002 at step 2" "$TMP/k.out" &&
   ! grep -q "llmtrain pid $kpid " "$TMP/k/checkpoints/.llmtrain.lock"; then
    ok "the lock file of a SIGKILLed job (pid $kpid) does not block the restart, which resumes and takes it over"
else bad "stale lock: rc $rc, lock '$stale': $(grep -E 'llmtrain:' "$TMP/k.out" | head -3)"; fi

# ---- a file system with no locks: one warning, the run goes on ----
LD_PRELOAD=$PWD/tests/nolock.so $BIN "$TMP/job.json" --set log.dir="$TMP/nl" --set train.steps=2 >"$TMP/nl.out" 2>&1; rc=$?
n=$(grep -c "warning: checkpoint.dir: $TMP/nl/checkpoints/.llmtrain.lock: the file system takes no lock (flock: No locks available; fcntl: No locks available); this job cannot tell whether another uses the folder" "$TMP/nl.out")
if [ $rc -eq 0 ] && [ "$n" -eq 1 ] && [ -f "$TMP/nl/checkpoints/step_00000002/manifest.json" ]; then
    ok "a file system without flock or fcntl locks: one warning line, the run trains and checkpoints"
else bad "no-lock file system: rc $rc, $n warnings: $(grep llmtrain "$TMP/nl.out" | head -3)"; fi

# ---- a run that fails mid-run (a token past the vocabulary, read at step
# 5) while its step-4 checkpoint is being written (kind=ckpt_slow): one
# line, exit 2, and no half-written .tmp folder left behind ----
$PY - "$TMP/bad.bin" <<'PYEOF'
import sys, numpy as np
t = np.random.default_rng(1).integers(0, 96, 20000); t[16 * 8 * 4 + 5] = 200  # in step 5's sequences
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))
open(sys.argv[1], "wb").write(h.tobytes() + t.astype(np.uint16).tobytes())
PYEOF
for np in 1 2; do
    cmd=$BIN; [ $np -gt 1 ] && cmd="$MPIRUN $np $BIN"
    LLMTRAIN_FAULT="step=1-10,kind=ckpt_slow" $cmd "$TMP/job.json" --set data.train="$TMP/bad.bin" --set log.dir="$TMP/tok$np" \
        --set checkpoint.every_steps=1 --set parallel.strategy=FULL_SHARD >"$TMP/tok$np.out" 2>&1; rc=$?
    left=$(ls "$TMP/tok$np/checkpoints" | tr '\n' ' ')
    if [ $rc -ne 0 ] && [ "$(grep -c "^llmtrain: data.train: $TMP/bad.bin: token 200 at token offset 517 >= model.vocab_size 96" "$TMP/tok$np.out")" -eq 1 ] &&
       [ "$left" = "step_00000001 step_00000002 step_00000003 " ]; then
        ok "$np rank(s): a bad token at step 5 with step 4's checkpoint in flight: one line, and no .tmp folder left ($left)"
    else bad "$np rank(s) bad token: rc $rc, left '$left': $(grep llmtrain: "$TMP/tok$np.out" | head -2)"; fi
done

# ---- folders that cannot be written: exit 3, one line, before step 1 ----
touch "$TMP/afile"
unwritable() { # unwritable NAME NP WANT ARGS...
    local name=$1 np=$2 want=$3 cmd="$BIN"; shift 3
    [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set log.dir="$TMP/$name" "$@" >"$TMP/$name.out" 2>&1; local rc=$?
    if [ $rc -eq 3 ] && [ "$(grep -c "$want" "$TMP/$name.out")" -eq 1 ] && [ "$(grep -c '^llmtrain: ' "$TMP/$name.out")" -eq 1 ] &&
       [ "$(steps_in "$TMP/$name")" -eq 0 ]; then
        ok "$np rank(s): $name: exit 3, one line, no step"
    else bad "$name ($np ranks): rc $rc: $(grep llmtrain "$TMP/$name.out" | head -3)"; fi
}
unwritable under-a-file 1 "^llmtrain: checkpoint.dir: $TMP/afile/ck: cannot create the folder (Not a directory) (host .*); expected a folder this job can write, checked before step 1" \
    --set checkpoint.dir="$TMP/afile/ck"
unwritable durable-under-a-file 2 "^llmtrain: checkpoint.durable_dir: $TMP/afile/dur: cannot create the folder (Not a directory)" \
    --set checkpoint.durable_dir="$TMP/afile/dur"
mkdir -p "$TMP/ro"
if mount -t tmpfs -o ro,size=1m tmpfs "$TMP/ro" 2>"$TMP/mount.err"; then
    unwritable read-only 1 "^llmtrain: checkpoint.dir: $TMP/ro: cannot create a file in it (Read-only file system)" --set checkpoint.dir="$TMP/ro"
    unwritable read-only-2 2 "^llmtrain: checkpoint.dir: $TMP/ro/ck: cannot create the folder (Read-only file system)" --set checkpoint.dir="$TMP/ro/ck"
    umount "$TMP/ro"
else
    bad "cannot mount a read-only tmpfs (the test runs as root): $(cat "$TMP/mount.err")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
