#!/bin/bash
# A real Slurm: Debian's slurmctld, slurmd and munge run as a private
# one-node cluster under $TMP (own munge socket and key, own ports, own
# state; stopped at exit). Checks:
#   - srun -n 2 / -n 4 ./llmtrain (no MPI, srun's variables): the tasks form
#     their world over TCP with rank 0 on the step's first node and the port
#     from the job and step ids, and train bit-identically to mpirun's runs;
#   - a stop through the launcher over srun: run_resilient.sh sends srun
#     SIGUSR1, which srun passes on; with a checkpoint that takes ~2 s
#     (kind=ckpt_slow) it is written and everything exits 143 (SIGTERM to
#     srun, --stop-signal TERM, SIGKILLs the tasks at once: 137, no
#     checkpoint; the test shows it);
#   - scripts/slurm.sbatch asks for the warning (#SBATCH --signal=B:USR1@300),
#     and its delivery, SIGUSR1 to the batch shell alone (scancel --batch
#     --signal=USR1: what the warning does, at a moment of our choosing;
#     slurmctld sends the real one on its periodic check, up to ~30 s late),
#     reaches the tasks through the launcher and srun: the checkpoint is
#     written and the job ends 143;
#   - scancel of that batch job (what a time limit does: SIGTERM to the
#     tasks and the batch shell at once): the tasks checkpoint and exit 143.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || { bad "the private Slurm cluster needs root (slurmd runs the tasks as the submitting user)"; echo "$pass passed, $fail failed"; exit 1; }
for c in munged slurmctld slurmd srun sbatch scancel sinfo squeue; do
    command -v $c >/dev/null || { bad "Slurm is not installed ($c missing; scripts/install_deps.sh installs it)"; echo "$pass passed, $fail failed"; exit 1; }
done

# ---- a private cluster ----
SL=$TMP/slurm
mkdir -p "$SL/state/ctld" "$SL/state/d"
head -c 1024 /dev/urandom >"$SL/munge.key"; chmod 400 "$SL/munge.key"
stop_cluster() {
    local p f jobs
    jobs=$(squeue -h -o %i 2>/dev/null)
    if [ -n "$jobs" ]; then # every job's processes gone before the daemons (slurmstepd outlives slurmd)
        scancel --quiet --full --signal=KILL $jobs 2>/dev/null
        for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    fi
    for f in slurmd slurmctld munged; do
        p=$(cat "$SL/$f.pid" 2>/dev/null) || continue
        kill "$p" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
        kill -9 "$p" 2>/dev/null
    done
}
trap 'stop_cluster; rm -rf "$TMP"' EXIT
/usr/sbin/munged --force --socket="$SL/munge.sock" --key-file="$SL/munge.key" --pid-file="$SL/munged.pid" \
    --log-file="$SL/munged.log" --seed-file="$SL/munge.seed" || bad "munged did not start"
host=$(hostname -s)
port=$(free_port) # and port + 1
cat >"$SL/slurm.conf" <<CONF
ClusterName=llmtrain-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SL/munge.sock
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SwitchType=switch/none
ReturnToService=2
StateSaveLocation=$SL/state/ctld
SlurmdSpoolDir=$SL/state/d
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/slurmctld.log
SlurmdLogFile=$SL/slurmd.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
KillWait=30
MailProg=/bin/true
InactiveLimit=0
NodeName=$host CPUs=$(getconf _NPROCESSORS_ONLN) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$SL/slurm.conf
/usr/sbin/slurmctld -f "$SLURM_CONF" && /usr/sbin/slurmd -f "$SLURM_CONF" || bad "slurmctld / slurmd did not start"
for _ in $(seq 200); do [ "$(sinfo -h -N -o %t 2>/dev/null)" = idle ] && break; sleep 0.05; done
if [ "$(sinfo -h -N -o %t 2>/dev/null)" != idle ]; then
    bad "the private Slurm cluster did not come up: $(sinfo -h -N -o '%N %t' 2>&1) $(tail -3 "$SL/slurmctld.log" "$SL/slurmd.log" 2>/dev/null)"
    echo "$pass passed, $fail failed"; exit 1
fi
echo "slurm $(sinfo -V): node $host idle"
# until the node is idle again (a finished job's node stays "completing" a moment)
node_idle() { for _ in $(seq 300); do [ "$(sinfo -h -N -o %t 2>/dev/null)" = idle ] && return 0; sleep 0.1; done; return 1; }

write_shard "$TMP/train.bin" 96 20000 1
for arch in gpt2 llama; do tiny_job $arch "$TMP/$arch.json" "$TMP/train.bin" ',"checkpoint": {"every_steps": 2}'; done
# srun's job and step ids for each task, then llmtrain
ids='echo $SLURM_JOB_ID $SLURM_STEP_ID >"$0.$SLURM_PROCID"; exec "$@"'

# ---- srun ./llmtrain, against mpirun ----
for run in gpt2-2-FULL_SHARD llama-4-HYBRID_SHARD-2; do
    IFS=- read -r arch np strategy degree <<<"$run"
    args=(--set parallel.strategy=$strategy)
    [ -n "$degree" ] && args+=(--set parallel.shard_degree=$degree)
    $MPIRUN $np $BIN "$TMP/$arch.json" "${args[@]}" --set log.dir="$TMP/$run-mpi" >"$TMP/$run-mpi.out" 2>&1
    node_idle
    timeout 300 srun -n $np --overcommit sh -c "$ids" "$TMP/$run.ids" $BIN "$TMP/$arch.json" "${args[@]}" --set log.dir="$TMP/$run-srun" >"$TMP/$run-srun.out" 2>&1
    rc=$?
    $BIN export "$TMP/$run-mpi/checkpoints" "$TMP/$run-mpi/hf" >/dev/null 2>&1
    $BIN export "$TMP/$run-srun/checkpoints" "$TMP/$run-srun/hf" >/dev/null 2>&1
    read -r job step <"$TMP/$run.ids.0"
    want=$((15000 + (job * 8 + step % 8) % 17000))
    if [ $rc -eq 0 ] && grep -q "^launch: Slurm srun, host collectives over TCP (rendezvous $host:$want) | $np ranks, $np on this node" "$TMP/$run-srun.out" &&
       $PY tests/compare_runs.py "$TMP/$run-mpi" "$TMP/$run-srun" --steps 10 --exact >/dev/null; then
        ok "srun -n $np ./llmtrain ($run, job $job step $step): rendezvous at $host:$want; losses, val losses and weights bit-identical to mpirun's"
    else
        bad "srun $run: rc $rc: $(grep -E '^launch|llmtrain:|srun:' "$TMP/$run-srun.out" | head -3) $($PY tests/compare_runs.py "$TMP/$run-mpi" "$TMP/$run-srun" --steps 10 --exact 2>&1 | tail -1)"
    fi
done

# ---- a stop through the launcher over srun ----
# SIGTERM to the launcher: srun gets SIGUSR1 (its name picks it), passes it
# on, the ~2 s checkpoint is written, exit 143. --stop-signal TERM shows why:
# srun answers SIGTERM by SIGKILLing its tasks at once.
for how in auto TERM; do
    node_idle
    opt=(); [ $how = TERM ] && opt=(--stop-signal TERM)
    LLMTRAIN_FAULT="step=1-100000,kind=ckpt_slow" scripts/run_resilient.sh "${opt[@]}" --delay 0 -- srun -n 2 --overcommit --immediate=120 $BIN "$TMP/llama.json" \
        --set parallel.strategy=FULL_SHARD --set train.steps=100000 --set checkpoint.every_steps=0 --set log.dir="$TMP/stop-$how" >"$TMP/stop-$how.out" 2>&1 &
    pid=$!
    wait_steps "$TMP/stop-$how/metrics.jsonl" 5 60
    kill -TERM $pid; wait $pid; rc=$?
    k=$(ls "$TMP/stop-$how/checkpoints" 2>/dev/null)
    if [ $how = auto ]; then
        if [ $rc -eq 143 ] && [ "$(echo "$k" | wc -w)" -eq 1 ] && [ -f "$TMP/stop-$how/checkpoints/$k/manifest.json" ] &&
           grep -q "$k complete | .* in [1-9][.0-9]* s" "$TMP/stop-$how.out" && grep -q "stopped on request (exit 143)" "$TMP/stop-$how.out"; then
            ok "SIGTERM to run_resilient.sh -- srun -n 2: srun got SIGUSR1, $k written in $(grep -o "$k complete | .* in [.0-9]* s" "$TMP/stop-$how.out" | grep -o '[.0-9]* s$'), exit 143"
        else bad "stop over srun: rc $rc, checkpoints '$k': $(grep -E 'run_resilient|llmtrain:|srun:' "$TMP/stop-$how.out" | head -3)"; fi
    else
        if [ $rc -eq 137 ] && [ -z "$k" ]; then
            ok "the same with --stop-signal TERM: srun SIGKILLs the tasks, exit 137, no checkpoint (why srun gets SIGUSR1)"
        else bad "--stop-signal TERM over srun: rc $rc, checkpoints '$k' (srun's SIGTERM behaviour changed?)"; fi
    fi
done

# ---- scripts/slurm.sbatch: the warning before the time limit ----
# (sbatch options on the command line override the script's #SBATCH lines)
node_idle
jobid=$(LLMTRAIN_FAULT="step=1-100000,kind=ckpt_slow" sbatch --parsable -n 2 --overcommit -o "$TMP/sb.out" \
    scripts/slurm.sbatch "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set train.steps=100000 \
    --set checkpoint.every_steps=0 --set log.dir="$TMP/sb")
wait_steps "$TMP/sb/metrics.jsonl" 5 60
scancel --batch --signal=USR1 "$jobid"
gone() { for _ in $(seq 1200); do [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0; sleep 0.1; done; return 1; }
gone "$jobid"; rc=$?
k=$(ls "$TMP/sb/checkpoints" 2>/dev/null)
if [ -n "$jobid" ] && [ $rc -eq 0 ] && grep -q '^#SBATCH --signal=B:USR1@300$' scripts/slurm.sbatch && [ "$(echo "$k" | wc -w)" -eq 1 ] &&
   [ -f "$TMP/sb/checkpoints/$k/manifest.json" ] && grep -q "$k complete | .* in [1-9][.0-9]* s" "$TMP/sb.out" &&
   grep -q "stopped on request (exit 143)" "$TMP/sb.out" && grep -q "^launch: Slurm srun" "$TMP/sb.out"; then
    ok "scripts/slurm.sbatch (#SBATCH --signal=B:USR1@300), the warning delivered to the batch shell: through the launcher and srun, $k written, exit 143"
else bad "slurm.sbatch warning: job '$jobid' (ended: $rc), checkpoints '$k': $(grep -E 'run_resilient|llmtrain:|srun:|slurmstepd' "$TMP/sb.out" | head -4)"; fi

# ---- scancel (as at the time limit): SIGTERM to the tasks themselves ----
node_idle
jobid=$(LLMTRAIN_FAULT="step=1-100000,kind=ckpt_slow" sbatch --parsable -n 2 --overcommit -o "$TMP/sc.out" \
    scripts/slurm.sbatch "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set train.steps=100000 \
    --set checkpoint.every_steps=0 --set log.dir="$TMP/sc")
wait_steps "$TMP/sc/metrics.jsonl" 5 60
scancel "$jobid"
gone "$jobid"
k=$(ls "$TMP/sc/checkpoints" 2>/dev/null)
if [ "$(echo "$k" | wc -w)" -eq 1 ] && [ -f "$TMP/sc/checkpoints/$k/manifest.json" ] && grep -q "$k complete | .* in [1-9][.0-9]* s" "$TMP/sc.out" &&
   [ "$(grep -c "stopped by signal" "$TMP/sc.out")" -ge 1 ]; then
    ok "scancel of the batch job: the tasks' SIGTERM writes $k (in $(grep -o "$k complete | .* in [.0-9]* s" "$TMP/sc.out" | grep -o '[.0-9]* s$')) before Slurm's KillWait"
else bad "scancel: checkpoints '$k': $(grep -E 'run_resilient|llmtrain:|srun:|stopped|CANCELLED' "$TMP/sc.out" | head -4)"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
