#!/bin/bash
# A log.dir (or log.tensorboard_dir) that fills during the run: the write
# that fails (at its fflush, on a tiny tmpfs the test mounts: it runs as
# root) ends the run after that step's checkpoint, on every rank at the same
# step, with one line naming the file and the error and exit 3; the file
# keeps only whole lines (the cut-off one removed) and a rerun with a roomy
# log.dir resumes from that checkpoint. 1 rank and 2 ranks FULL_SHARD for
# metrics.jsonl, a TensorBoard events file, and a profile.json that cannot
# be written.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
tiny_job llama "$TMP/job.json" "$TMP/train.bin"
disks=()
small_disk() { # small_disk NAME: an 8 KiB tmpfs at $TMP/NAME (about 13 metrics.jsonl lines)
    mkdir -p "$TMP/$1" && mount -t tmpfs -o size=8k tmpfs "$TMP/$1" && disks+=("$TMP/$1")
}
trap 'for d in "${disks[@]}"; do umount "$d"; done; rm -rf "$TMP"' EXIT
# run NAME NP [args...]: 30 steps, checkpoints in $TMP/NAME.ck, output in $TMP/NAME.out / .err
run() {
    local name=$1 np=$2; shift 2
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set train.steps=30 --set checkpoint.dir="$TMP/$name.ck" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
}
# whole_lines FILE: the step of its last line, if every line is JSON (else "bad")
whole_lines() {
    $PY - "$1" <<'PYEOF'
import json, sys
try:
    print([json.loads(l) for l in open(sys.argv[1])][-1]["step"])
except Exception:
    print("bad")
PYEOF
}
# failed NAME NP WHAT: exit 3, one llmtrain line naming WHAT (a path pattern)
# and the error, the step it names checkpointed (every rank's file), the
# only checkpoint; sets $step
failed() {
    local rc=$1 name=$2 np=$3 what=$4 err=${5:-No space left on device}
    local lines; lines=$(grep -c '^llmtrain' "$TMP/$name.err")
    step=$(sed -n "s|^llmtrain: $what: cannot write ($err); stopped after step \([0-9]*\), its checkpoint written, exiting 3$|\1|p" "$TMP/$name.err")
    local ck; ck=$(printf '%s/step_%08d' "$TMP/$name.ck" "${step:-0}")
    [ "$rc" = 3 ] && [ "$lines" = 1 ] && [ -n "$step" ] && [ "$step" -lt 30 ] && [ -f "$ck/manifest.json" ] &&
        [ "$(ls "$ck" | grep -c '^rank_')" = "$np" ] && [ "$(ls "$TMP/$name.ck")" = "$(basename "$ck")" ]
}
resumes() { # resumes NAME NP [args]: a rerun with a roomy log.dir goes on from $step to 30
    local name=$1 np=$2; shift 2
    run "$name" "$np" --set log.dir="$TMP/$name-roomy" "$@" &&
        grep -q "^resume: $(printf '%s/step_%08d' "$TMP/$name.ck" "$step") at step $step" "$TMP/$name.out" &&
        [ "$(whole_lines "$TMP/$name-roomy/metrics.jsonl")" = 30 ]
}

# ---- metrics.jsonl on a full disk: 1 rank, 2 ranks FULL_SHARD ----
for spec in "m1 1" "m2 2 --set parallel.strategy=FULL_SHARD"; do
    read -r name np rest <<<"$spec"
    if ! small_disk "$name-disk"; then bad "$name: cannot mount a tmpfs at $TMP/$name-disk (this test runs as root)"; continue; fi
    run "$name" "$np" $rest --set log.dir="$TMP/$name-disk/run"; rc=$?
    if failed $rc "$name" "$np" "$TMP/$name-disk/run/metrics.jsonl" &&
       [ "$(whole_lines "$TMP/$name-disk/run/metrics.jsonl")" = $((step - 1)) ] &&
       grep -q "^step *$step/30 " "$TMP/$name.out" && ! grep -q "^step *$((step + 1))/30 " "$TMP/$name.out"; then
        ok "$np rank(s): metrics.jsonl's disk full at step $step: one line, exit 3, step $step checkpointed, no later step, the file whole lines to step $((step - 1))"
    else bad "$name: rc $rc, step '$step', last line '$(whole_lines "$TMP/$name-disk/run/metrics.jsonl")', $(ls "$TMP/$name.ck" | tr '\n' ' '); $(head -c 400 "$TMP/$name.err")"; fi
    if [ -n "$step" ] && resumes "$name" "$np" $rest; then ok "$np rank(s): a rerun with a roomy log.dir resumes from step $step and ends at step 30"
    else bad "$name resume: $(grep -E '^resume|^llmtrain' "$TMP/$name.out" "$TMP/$name.err" | head -3)"; fi
done

# ---- a TensorBoard events file on a full disk (metrics.jsonl roomy) ----
if small_disk tb-disk; then
    run tb 1 --set log.dir="$TMP/tb" --set log.tensorboard_dir="$TMP/tb-disk"; rc=$?
    if failed $rc tb 1 "$TMP/tb-disk/events\.out\.tfevents\.[^:]*" &&
       [ "$(whole_lines "$TMP/tb/metrics.jsonl")" = "$step" ]; then
        ok "the TensorBoard file's disk full at step $step: one line naming it, exit 3, step $step checkpointed (its metrics.jsonl line written)"
    else bad "tb: rc $rc, step '$step', $(ls "$TMP/tb.ck" | tr '\n' ' '); $(head -c 400 "$TMP/tb.err")"; fi
    if [ -n "$step" ] && resumes tb 1; then ok "and a rerun resumes from step $step"
    else bad "tb resume: $(grep -E '^resume|^llmtrain' "$TMP/tb.out" "$TMP/tb.err" | head -3)"; fi
else bad "tb: cannot mount a tmpfs"; fi

# ---- profile.json that cannot be written (its temporary name a folder) ----
mkdir -p "$TMP/prof/profile.json.tmp"
run prof 1 --set log.dir="$TMP/prof" --set log.profile_steps=2; rc=$?
if failed $rc prof 1 "$TMP/prof/profile.json" "Is a directory" && [ "$step" = 3 ]; then
    ok "profile.json not writable after the profiled steps 2-3: one line naming it, exit 3, step 3 checkpointed"
else bad "prof: rc $rc, step '$step'; $(head -c 400 "$TMP/prof.err")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
