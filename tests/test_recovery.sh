#!/bin/bash
# Automatic recovery (scripts/run_resilient.sh): under each fault the
# launcher finishes the run and the final exported weights (and every
# step's loss) are bit-identical to an uninterrupted run of the same layout
# (2 ranks, FULL_SHARD): a rank SIGKILLed at a random step, a rank killed
# halfway through writing its checkpoint file, a hung rank (watchdog),
# NaN gradients for max_nonfinite_steps steps, a corrupted shard file and a
# truncated manifest found at the restart, and a full local disk (a small
# tmpfs) with a durable copy. Also: goodput recomputed from metrics.jsonl,
# no restart after bad input, SIGTERM forwarded and not restarted, the
# launcher SIGKILLed (the command checkpoints and ends with it), the
# command's own code when a stop comes as it exits,
# --max-restarts honoured.
. "$(dirname "$0")/lib.sh"
RES="$PWD/scripts/run_resilient.sh"
NVME="$TMP/nvme"
trap 'umount "$NVME" 2>/dev/null; rm -rf "$TMP"' EXIT

write_shard "$TMP/train.bin" 96 20000 3
cat >"$TMP/job.json" <<EOF2
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2,
           "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 12, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5, "max_nonfinite_steps": 3},
 "parallel": {"strategy": "FULL_SHARD", "timeout_s": 4},
 "checkpoint": {"every_steps": 2},
 "eval": {"sample_tokens": 0}}
EOF2
# launch NAME [launcher options --] [llmtrain --set args]: the resilient
# launcher over 2 ranks, log and checkpoints in $TMP/NAME, output appended to $TMP/NAME.out
launch() {
    local name=$1; shift
    local opts=(--delay 0)
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    "$RES" "${opts[@]}" -- $MPIRUN 2 "$BIN" "$TMP/job.json" --set log.dir="$TMP/$name" "$@" >>"$TMP/$name.out" 2>&1
}
export_run() { $BIN export "$TMP/$1/checkpoints" "$TMP/$1/hf" >/dev/null 2>&1; }
same_as_ref() { export_run "$1" && $PY tests/compare_runs.py "$TMP/ref" "$TMP/$1" --steps 12 --exact; }
why() { grep -E "run_resilient|resume:|warning|llmtrain:" "$TMP/$1.out" | head -6 | tr '\n' ' '; }

# ---- the uninterrupted reference ----
$MPIRUN 2 "$BIN" "$TMP/job.json" --set log.dir="$TMP/ref" >"$TMP/ref.out" 2>&1 || { echo "FAIL reference run: $(tail -3 "$TMP/ref.out")"; echo "0 passed, 1 failed"; exit 1; }
export_run ref

# ---- a rank SIGKILLed at a random step ----
k=$((2 + RANDOM % 10)); r=$((RANDOM % 2))
LLMTRAIN_FAULT="rank=$r,step=$k,kind=die,attempt=1" launch kill; rc=$?
# (which checkpoint the restart finds depends on whether the asynchronous
# write begun before the kill had been committed; the cases below pin it)
if [ $rc -eq 0 ] && grep -q "run_resilient: attempt 1 exited with code 137 (killed by SIGKILL)" "$TMP/kill.out" &&
   [ "$(grep -c '^resume: ' "$TMP/kill.out")" -eq 2 ]; then
    if same_as_ref kill; then ok "rank $r SIGKILLed at step $k (random): restarted, resumed from the last checkpoint, losses and final weights bit-identical"
    else bad "kill at step $k: differs from the uninterrupted run"; fi
else bad "kill at step $k rank $r: rc $rc: $(why kill)"; fi

# goodput: the launcher's figures against a recomputation from metrics.jsonl
line=$(grep "run_resilient: finished" "$TMP/kill.out")
if $PY - "$TMP/kill/metrics.jsonl" "$line" <<'PYEOF'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
last, redone = {}, 0
for l in lines:
    redone += l["step"] in last
    last[l["step"]] = l["step_ms"]
m = re.search(r"after 2 attempt\(s\), 1 restart\(s\) \| goodput ([0-9.]+)%: ([0-9.]+) s of (\d+) training steps that count over ([0-9.]+) s wall \| (\d+) step\(s\) redone", sys.argv[2])
assert m, sys.argv[2]
pct, good, n, wall, red = float(m[1]), float(m[2]), int(m[3]), float(m[4]), int(m[5])
assert n == 12 and red == redone, (n, red, redone)
assert abs(good - sum(last.values()) / 1000) <= 0.051, (good, sum(last.values()))
expect = 100 * sum(last.values()) / 1000 / wall  # wall is printed to 0.1 s, pct to 0.1%
assert abs(pct - expect) <= expect * 0.051 / wall + 0.051 and 0 < pct < 100, (pct, expect, wall)
PYEOF
then ok "goodput line: 12 steps that count, their time and the redone steps match metrics.jsonl"
else bad "goodput line: '$line'"; fi

# ---- SIGKILL halfway through a checkpoint write ----
# first without the launcher, to see what the dead rank leaves: a half file
# in the .tmp folder, no complete step 6
LLMTRAIN_FAULT="rank=1,step=6,kind=ckpt_die" $MPIRUN 2 "$BIN" "$TMP/job.json" --set log.dir="$TMP/half" --set checkpoint.async=false >"$TMP/half.out" 2>&1; rc=$?
full=$(stat -c %s "$TMP/half/checkpoints/step_00000004/rank_00001.bin" 2>/dev/null)
part=$(stat -c %s "$TMP/half/checkpoints/step_00000006.tmp/rank_00001.bin" 2>/dev/null)
if [ $rc -ne 0 ] && [ -n "$full" ] && [ "$part" = $((full / 2)) ] && [ ! -e "$TMP/half/checkpoints/step_00000006" ] &&
   [ ! -e "$TMP/half/checkpoints/step_00000006.tmp/manifest.json" ]; then
    ok "ckpt_die: the rank died with $part of $full bytes written; step 6 never became complete"
else bad "ckpt_die: rc $rc, file $part of $full bytes, $(ls "$TMP/half/checkpoints" | tr '\n' ' ')"; fi
LLMTRAIN_FAULT="rank=1,step=6,kind=ckpt_die,attempt=1" launch ckdie; rc=$?
if [ $rc -eq 0 ] && grep -q "^resume: .*step_00000004 at step 4" "$TMP/ckdie.out" && ! ls -d "$TMP"/ckdie/checkpoints/*.tmp >/dev/null 2>&1 && same_as_ref ckdie; then
    ok "killed while writing the step 6 checkpoint: resumed from step 4, half-written folder removed, bit-identical"
else bad "ckpt_die under the launcher: rc $rc: $(why ckdie)"; fi

# ---- a hung rank: the watchdog ends the attempt (exit 5), the launcher restarts ----
# (rank 0 hangs at the start of step 7: step 6's checkpoint is never committed)
start=$(date +%s)
LLMTRAIN_FAULT="rank=0,step=7,kind=hang,attempt=1" launch hang; rc=$?
if [ $rc -eq 0 ] && grep -q "run_resilient: attempt 1 exited with code 5 (watchdog timeout" "$TMP/hang.out" &&
   grep -q "^resume: .*step_00000004 at step 4" "$TMP/hang.out" && same_as_ref hang; then
    ok "hung rank: watchdog exit 5, restarted from step 4, bit-identical ($(($(date +%s) - start)) s in all, timeout_s 4)"
else bad "hung rank: rc $rc: $(why hang)"; fi

# ---- non-finite gradients for max_nonfinite_steps steps: exit 4, roll back ----
# (the step-10 checkpoint falls inside the streak and is deferred; the
# step-8 one is completed before the exit)
LLMTRAIN_FAULT="step=9-11,kind=nan,attempt=1" launch nan; rc=$?
if [ $rc -eq 0 ] && grep -q "run_resilient: attempt 1 exited with code 4 (non-finite" "$TMP/nan.out" &&
   grep -q "^resume: .*step_00000008 at step 8" "$TMP/nan.out" && same_as_ref nan; then
    ok "3 non-finite steps: exit 4, no checkpoint taken inside the streak, rolled back to step 8, bit-identical"
else bad "non-finite steps: rc $rc: $(why nan)"; fi

# ---- the launcher SIGKILLed: the command (mpirun, 2 ranks) checkpoints and ends with it ----
"$RES" --delay 0 -- $MPIRUN 2 "$BIN" "$TMP/job.json" --set log.dir="$TMP/orphan" --set train.steps=3000 --set checkpoint.every_steps=0 \
    >>"$TMP/orphan.out" 2>&1 &
lp=$!
wait_steps "$TMP/orphan/metrics.jsonl" 20 30 || bad "orphan: no step 20 within 30 s"
kill -KILL $lp
for _ in $(seq 300); do pgrep -f "log.dir=$TMP/orphan" >/dev/null || break; sleep 0.1; done
left=$(pgrep -f "log.dir=$TMP/orphan" | wc -l)
pkill -KILL -f "log.dir=$TMP/orphan" # (the old launcher left them training)
wait $lp 2>/dev/null
k=$(ls "$TMP/orphan/checkpoints" 2>/dev/null | tr '\n' ' '); n=${k#step_}; n=$((10#${n%% *}))
last=$(grep '"loss"' "$TMP/orphan/metrics.jsonl" | tail -1 | grep -o '"step":[0-9]*' | cut -d: -f2)
launch orphan -- --set train.steps=$((n + 2)) --set optim.override_schedule=true; rc=$?
if [ "$left" -eq 0 ] && [ "$(echo $k | wc -w)" -eq 1 ] && [ -f "$TMP/orphan/checkpoints/${k% }/manifest.json" ] && [ "$n" = "$last" ] &&
   grep -q "run_resilient: the launcher (pid $lp) is gone; stopping the command (SIGUSR1)" "$TMP/orphan.out" &&
   grep -q "stopped by signal after step $n; checkpoint written, exiting 143" "$TMP/orphan.out" &&
   [ $rc -eq 0 ] && grep -q "^resume: .*step_$(printf %08d $n) at step $n" "$TMP/orphan.out"; then
    ok "the launcher SIGKILLed at step $n: mpirun's ranks got SIGUSR1, wrote step $n's checkpoint and ended, no process left; a new launch resumed from it"
else bad "launcher SIGKILLed: $left processes left, checkpoints '$k', last step $last, rc $rc: $(why orphan)"; fi

# ---- damage found at the restart: a corrupted shard file, a truncated manifest ----
for damage in corrupt truncate; do
    LLMTRAIN_FAULT="rank=0,step=11,kind=die" launch $damage --max-restarts 0 -- --set checkpoint.async=false; rc1=$?
    d="$TMP/$damage/checkpoints/step_00000010"
    if [ $damage = corrupt ]; then
        printf '\x55\xaa\x55\xaa' | dd of="$d/rank_00001.bin" bs=1 seek=100 conv=notrunc status=none
    else
        sz=$(stat -c %s "$d/manifest.json"); truncate -s $((sz / 2)) "$d/manifest.json"
    fi
    launch $damage; rc2=$?
    if [ $rc1 -eq 137 ] && grep -q "giving up after 0 restart(s)" "$TMP/$damage.out" && [ $rc2 -eq 0 ] &&
       grep -q "warning: skipping checkpoint .*step_00000010" "$TMP/$damage.out" &&
       grep -q "^resume: .*step_00000008 at step 8" "$TMP/$damage.out" && same_as_ref $damage; then
        ok "$damage: --max-restarts 0 stopped at the first failure; the next launch skipped the damaged step 10, resumed from 8, bit-identical"
    else bad "$damage: rc $rc1/$rc2: $(why $damage)"; fi
done

# ---- full local disk: a 1 MiB tmpfs holds one checkpoint; the rest go to durable_dir ----
mkdir -p "$NVME"
if mount -t tmpfs -o size=1m tmpfs "$NVME" 2>"$TMP/mount.err"; then
    LLMTRAIN_FAULT="rank=1,step=9,kind=die,attempt=1" launch full -- --set checkpoint.dir="$NVME/ck" \
        --set checkpoint.durable_dir="$TMP/durable" --set checkpoint.keep_last=1 --set checkpoint.async=false; rc=$?
    if [ $rc -eq 0 ] && grep -q "local write failed; writing it to $TMP/durable instead" "$TMP/full.out" &&
       grep -q "^resume: $TMP/durable/step_00000008 at step 8" "$TMP/full.out" &&
       $BIN export "$TMP/durable" "$TMP/full/hf" >/dev/null 2>&1 &&
       $PY tests/compare_runs.py "$TMP/ref" "$TMP/full" --steps 12 --exact; then
        ok "full local disk: checkpoints written to durable_dir instead, resumed from it after a kill, bit-identical"
    else bad "full disk: rc $rc: $(why full)"; fi
    umount "$NVME"
else
    echo "skip full-disk case: cannot mount a tmpfs here ($(head -1 "$TMP/mount.err"))"
fi

# ---- the launcher's temporary file holds the "metrics:" line, not the output ----
# (it once held a copy of all of stdout, in $TMPDIR for the whole run: weeks
# of step lines; the command reads it and the launcher's output before it exits)
mkdir -p "$TMP/rtmp"
TMPDIR="$TMP/rtmp" "$RES" --delay 0 -- bash -c '"$0" "$1" --set log.dir="$2" --set train.steps=300 --set parallel.strategy=NO_SHARD \
    --set checkpoint.every_steps=0; rc=$?; sleep 0.5; cat "$TMPDIR"/*/* >"$3"; grep -c "^step" "$4" >"$3.live"; exit $rc' \
    "$BIN" "$TMP/job.json" "$TMP/quiet" "$TMP/quiet.kept" "$TMP/quiet.out" >"$TMP/quiet.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(cat "$TMP/quiet.kept")" = "metrics: $TMP/quiet/metrics.jsonl" ] && [ "$(cat "$TMP/quiet.kept.live")" = 300 ] &&
   [ "$(grep -c '^step' "$TMP/quiet.out")" -eq 300 ] && [ -z "$(ls -A "$TMP/rtmp")" ]; then
    ok "300 step lines passed through as they came; the launcher's temporary file held only the metrics: line ($(wc -c <"$TMP/quiet.out") bytes of output) and is gone at the end"
else bad "temporary file: rc $rc, it held $(wc -c <"$TMP/quiet.kept") bytes, $(cat "$TMP/quiet.kept.live") step lines out while running, left: $(ls -A "$TMP/rtmp")"; fi

# ---- no restart after bad input; SIGTERM is forwarded and ends the launcher ----
"$RES" --delay 0 -- "$BIN" "$TMP/job.json" --set optim.lrr=1 >"$TMP/badin.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c 'did you mean' "$TMP/badin.out")" -eq 1 ] && grep -q "a restart would fail the same way" "$TMP/badin.out" &&
   [ "$(grep -c '^run_resilient:' "$TMP/badin.out")" -eq 1 ] && ! grep -q goodput "$TMP/badin.out"; then
    ok "bad input: exit 2 after one attempt, one line of the launcher's (no goodput for a job that never started)"
else bad "bad input: rc $rc: $(cat "$TMP/badin.out")"; fi
"$RES" --delay 0 -- "$BIN" "$TMP/job.json" --set log.dir="$TMP/term" --set train.steps=100000 --set parallel.strategy=NO_SHARD \
    --set checkpoint.every_steps=0 >"$TMP/term.out" 2>&1 &
pid=$!
wait_steps "$TMP/term/metrics.jsonl" 5 15
kill -TERM $pid; wait $pid; rc=$?
if [ $rc -eq 143 ] && grep -q "stopped on request (exit 143)" "$TMP/term.out" && ls "$TMP/term/checkpoints" | grep -q step_ &&
   [ "$(grep -c '^metrics: ' "$TMP/term.out")" -eq 1 ]; then
    ok "SIGTERM to the launcher: forwarded, checkpoint written, exit 143, no restart"
else bad "SIGTERM: rc $rc: $(tail -3 "$TMP/term.out")"; fi
# over mpirun, whose answer to SIGTERM is SIGKILL for every rank 1 s later:
# the launcher's SIGTERM (and SIGUSR1, Slurm's --signal=B:USR1) reaches the
# ranks as SIGUSR1, and a checkpoint that takes ~2 s (kind=ckpt_slow) is
# written; mpirun exits 143
for sig in TERM USR1; do
    LLMTRAIN_FAULT="step=1-100000,kind=ckpt_slow" "$RES" --delay 0 -- $MPIRUN 2 "$BIN" "$TMP/job.json" --set log.dir="$TMP/mpi$sig" \
        --set train.steps=100000 --set checkpoint.every_steps=0 >"$TMP/mpi$sig.out" 2>&1 &
    pid=$!
    wait_steps "$TMP/mpi$sig/metrics.jsonl" 5 15
    kill -$sig $pid; wait $pid; rc=$?
    k=$(ls "$TMP/mpi$sig/checkpoints" 2>/dev/null)
    if [ $rc -eq 143 ] && [ "$(echo "$k" | wc -w)" -eq 1 ] && [ -f "$TMP/mpi$sig/checkpoints/$k/manifest.json" ] &&
       grep -q "stopped on request (exit 143)" "$TMP/mpi$sig.out" && grep -q "$k complete | .* in [1-9][.0-9]* s" "$TMP/mpi$sig.out"; then
        ok "SIG$sig to the launcher over mpirun 2: SIGUSR1 to mpirun, $k written in $(grep -o "$k complete | .* in [.0-9]* s" "$TMP/mpi$sig.out" | grep -o '[.0-9]* s$'), exit 143"
    else bad "SIG$sig over mpirun: rc $rc, checkpoints '$k': $(grep -E 'run_resilient|llmtrain:' "$TMP/mpi$sig.out" | head -3)"; fi
done
# which stop signal the command gets: SIGUSR1 for an MPI launcher or srun
# (srun SIGKILLs its tasks at once on SIGTERM), also behind exec-style
# wrappers and their options; SIGTERM for anything else, and for timeout,
# which forks (its child would not get SIGUSR1)
mkdir -p "$TMP/fakebin"
for l in mpirun mpiexec srun other; do
    printf '#!/bin/bash\nfor s in USR1 TERM; do trap "echo got $s >>\\"$TMP/sigs\\"; kill \\$!; exit 143" $s; done\n'"echo started >>\"\$TMP/sigs\"\n"'sleep 30 & wait\n' >"$TMP/fakebin/$l"
    chmod +x "$TMP/fakebin/$l"
done
export TMP
sigs_ok=1 sigs_report=""
for spec in "USR1|$TMP/fakebin/mpirun -np 2 x" "USR1|$TMP/fakebin/srun -n 2 x" "USR1|env A=1 nice -n 5 $TMP/fakebin/mpiexec x" \
            "USR1|stdbuf -oL taskset -c 0 $TMP/fakebin/srun x" "TERM|$TMP/fakebin/other x" "TERM|timeout 60 $TMP/fakebin/other x"; do
    want=${spec%%|*}; cmd=${spec#*|}
    rm -f "$TMP/sigs"
    "$RES" --delay 0 -- $cmd >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -s "$TMP/sigs" ] && break; sleep 0.05; done
    kill -TERM $pid; wait $pid; rc=$?
    got=$(grep -o 'got [A-Z0-9]*' "$TMP/sigs" 2>/dev/null | head -1)
    sigs_report="$sigs_report [${cmd//$TMP\/fakebin\//}: $got, $rc]"
    [ "$got" = "got $want" ] && [ $rc -eq 143 ] || sigs_ok=0
done
if [ $sigs_ok = 1 ]; then ok "the stop signal follows the launcher's name:$sigs_report"
else bad "stop signal by launcher name:$sigs_report"; fi
# a stop sent to the launcher's whole process group: SIGINT (Ctrl-C at a
# terminal) and SIGTERM (a supervisor that signals process groups). The
# launcher runs in its own group here, with SIGINT's default action, as a
# foreground command has it (a background job of this script would ignore
# it). Its output filter once died of the SIGTERM: the run's stdout after
# it, the checkpoint line, was lost (a command that does not ignore SIGPIPE
# died of it: exit 141).
for sig in INT TERM; do
    $PY -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execv(sys.argv[1], sys.argv[1:])' \
        "$RES" --delay 0 -- "$BIN" "$TMP/job.json" --set log.dir="$TMP/pg$sig" --set train.steps=100000 --set parallel.strategy=NO_SHARD \
        --set checkpoint.every_steps=0 >"$TMP/pg$sig.out" 2>&1 &
    pid=$!
    wait_steps "$TMP/pg$sig/metrics.jsonl" 5 15
    kill -$sig -- -$pid; wait $pid; rc=$?
    if [ $rc -eq 143 ] && ls "$TMP/pg$sig/checkpoints" | grep -q step_ && grep -q "stopped on request (exit 143)" "$TMP/pg$sig.out" &&
       grep -q "^checkpoint: .*/step_[0-9]* complete" "$TMP/pg$sig.out"; then
        ok "SIG$sig to the launcher's process group: checkpoint written, its line passed through, exit 143"
    else bad "SIG$sig to the process group: rc $rc, checkpoints '$(ls "$TMP/pg$sig/checkpoints" 2>/dev/null)': $(tail -2 "$TMP/pg$sig.out")"; fi
done
# a stop that comes while the launcher prepares an attempt, before it knows
# the command's pid (here an rm that takes a second), is not lost: the
# command is not started (it once ran to its end, exit 0)
mkdir -p "$TMP/slowbin"
printf '#!/bin/sh\nsleep 1\nexec /bin/rm "$@"\n' >"$TMP/slowbin/rm"; chmod +x "$TMP/slowbin/rm"
PATH="$TMP/slowbin:$PATH" "$RES" --delay 0 -- sh -c 'trap "echo cmd: got TERM; exit 143" TERM; sleep 4 & wait; echo cmd: finished' \
    >"$TMP/early.out" 2>&1 &
pid=$!
sleep 0.5; kill -TERM $pid; wait $pid; rc=$?
if [ $rc -eq 143 ] && ! grep -q "cmd: finished" "$TMP/early.out" && grep -q "stopped on request (exit 143)" "$TMP/early.out"; then
    ok "SIGTERM while the launcher prepares the attempt: the command not started, exit 143"
else bad "stop before the command's pid was known: rc $rc: $(cat "$TMP/early.out" | head -3)"; fi
"$RES" --stop-signal HUP -- true 2>"$TMP/opt.err"; rc=$?
if [ $rc -eq 2 ] && grep -q "expected TERM or USR1" "$TMP/opt.err"; then ok "--stop-signal HUP: exit 2, one line"
else bad "--stop-signal HUP: rc $rc $(cat "$TMP/opt.err")"; fi

# a stop that comes as the command exits: the launcher exits with the
# command's code, not with the 143 of its own wait interrupted by the trap
# (the command signals the launcher, then exits at once, three times over;
# it ignores the SIGTERM passed back to it, which could otherwise end it
# first, with 143 of its own)
for i in 1 2 3; do
    rm -f "$TMP/res.pid"
    "$RES" --delay 0 -- sh -c 'trap "" TERM; while [ ! -s "$0" ]; do sleep 0.02; done; kill -TERM "$(cat "$0")"; exit 5' "$TMP/res.pid" \
        >"$TMP/race$i.out" 2>&1 &
    echo $! >"$TMP/res.pid"; wait $!; echo $? >"$TMP/race$i.rc"
done
if [ "$(cat "$TMP"/race[123].rc | tr '\n' ' ')" = "5 5 5 " ] && [ "$(grep -l 'stopped on request (exit 5)' "$TMP"/race[123].out | wc -l)" -eq 3 ]; then
    ok "a stop as the command exits with 5: the launcher exits with 5 (three times), not the 143 of its interrupted wait"
else bad "stop as the command exits: codes $(cat "$TMP"/race[123].rc | tr '\n' ' '): $(tail -2 "$TMP/race1.out")"; fi
"$RES" --delay 0 -- "$TMP/no-such-binary" >"$TMP/nf.out" 2>&1; rc=$?
if [ $rc -eq 127 ] && [ "$(grep -c '^run_resilient: attempt' "$TMP/nf.out")" -eq 1 ]; then ok "command not found: exit 127 after one attempt"
else bad "command not found: rc $rc: $(cat "$TMP/nf.out")"; fi
"$RES" --max-restarts x -- true 2>"$TMP/opt.err"; rc=$?
if [ $rc -eq 2 ] && grep -q "expected a whole number" "$TMP/opt.err"; then ok "malformed --max-restarts: exit 2, one line"
else bad "malformed option: rc $rc"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
