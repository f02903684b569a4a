#!/bin/bash
# Launches without MPI: torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR, MASTER_PORT), the world formed over the TCP rendezvous and
# the host collectives run there. Every layout whose groups have two members
# (NO_SHARD 2, FULL_SHARD 2, HYBRID_SHARD 2x2, tp 2, tp 2 x FULL_SHARD 2)
# gives bit-identical losses and weights to mpirun's run (a sum of two is
# the same in any order); 4-member groups match one rank within fp32
# reduction order and repeat bit for bit. A rank that dies or hangs, a rank
# that never arrives and bad variables end every rank promptly with one line
# each; a stop request (SIGUSR1) during the rendezvous ends both ranks with 143
# before step 1; a killed run restarts under scripts/run_resilient.sh and finishes
# bit-identical to an uninterrupted one; MASTER_PORT held by the launcher's
# own store (TORCHELASTIC_USE_AGENT_STORE=True) moves the rendezvous to
# MASTER_PORT + 1; the ranks per node come from LOCAL_WORLD_SIZE, else from
# the host names; the soft open-file limit is raised for rank 0's sockets,
# and a hard limit too low is one line per rank.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
for arch in gpt2 llama; do tiny_job $arch "$TMP/$arch.json" "$TMP/train.bin" ',"checkpoint": {"every_steps": 2}'; done

# ---- training: the same run as mpirun's ----
for arch in gpt2 llama; do
    $BIN "$TMP/$arch.json" --set log.dir="$TMP/$arch-1" >"$TMP/$arch-1.out" 2>&1 || bad "$arch 1 rank: $(tail -2 "$TMP/$arch-1.out")"
    $BIN export "$TMP/$arch-1/checkpoints" "$TMP/$arch-1/hf" >/dev/null 2>&1
    for run in 2 2-FULL_SHARD 4-HYBRID_SHARD-2 2-NO_SHARD-1-2 4-FULL_SHARD-2-2; do
        IFS=- read -r np strategy degree tp <<<"$run"
        args=()
        [ -n "$strategy" ] && args+=(--set parallel.strategy=$strategy)
        [ -n "$degree" ] && [ -z "$tp" ] && args+=(--set parallel.shard_degree=$degree)
        [ -n "$tp" ] && args+=(--set parallel.tensor=$tp)
        $MPIRUN $np $BIN "$TMP/$arch.json" "${args[@]}" --set log.dir="$TMP/$arch-$run-mpi" >"$TMP/$arch-$run-mpi.out" 2>&1
        trun $arch-$run-tcp $np $BIN "$TMP/$arch.json" "${args[@]}" --set log.dir="$TMP/$arch-$run-tcp" >"$TMP/$arch-$run-tcp.out" 2>&1
        rc=$?
        $BIN export "$TMP/$arch-$run-mpi/checkpoints" "$TMP/$arch-$run-mpi/hf" >/dev/null 2>&1
        $BIN export "$TMP/$arch-$run-tcp/checkpoints" "$TMP/$arch-$run-tcp/hf" >/dev/null 2>&1
        if [ $rc -eq 0 ] && grep -q "^launch: torchrun-style, host collectives over TCP" "$TMP/$arch-$run-tcp.out" &&
           $PY tests/compare_runs.py "$TMP/$arch-$run-mpi" "$TMP/$arch-$run-tcp" --steps 10 --exact >/dev/null; then
            ok "$arch $run: over TCP, losses, val losses and final weights bit-identical to mpirun's"
        else
            bad "$arch $run over TCP: rc $rc: $(grep -E 'llmtrain:|differ|mismatch' "$TMP/$arch-$run-tcp.out" | head -2) $($PY tests/compare_runs.py "$TMP/$arch-$run-mpi" "$TMP/$arch-$run-tcp" --steps 10 --exact 2>&1 | tail -2)"
        fi
    done
done
# four members per group: the first member sums in member order, so two runs agree bit for bit
for k in a b; do
    trun ll4-$k 4 $BIN "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set log.dir="$TMP/ll4-$k" >"$TMP/ll4-$k.out" 2>&1 || bad "FULL_SHARD 4 over TCP: $(grep llmtrain: "$TMP/ll4-$k.out" | head -2)"
    $BIN export "$TMP/ll4-$k/checkpoints" "$TMP/ll4-$k/hf" >/dev/null 2>&1
done
if $PY tests/compare_runs.py "$TMP/llama-1" "$TMP/ll4-a" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3 >/dev/null &&
   $PY tests/compare_runs.py "$TMP/ll4-a" "$TMP/ll4-b" --steps 10 --exact >/dev/null; then
    ok "llama FULL_SHARD 4 over TCP: matches 1 rank within fp32 reduction order, and a second run bit for bit"
else
    bad "llama FULL_SHARD 4 over TCP: $($PY tests/compare_runs.py "$TMP/llama-1" "$TMP/ll4-a" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3 2>&1 | tail -1) / $($PY tests/compare_runs.py "$TMP/ll4-a" "$TMP/ll4-b" --steps 10 --exact 2>&1 | tail -1)"
fi

# ---- ranks per node ----
LOCAL_WORLD_SIZE=2 trun lws 4 $BIN "$TMP/gpt2.json" --set train.steps=1 --set optim.warmup_steps=0 --set log.dir="$TMP/lws" >"$TMP/lws.out" 2>&1
a=$(grep -o "4 ranks, [0-9]* on this node" "$TMP/lws.out")
trun hn 4 $BIN "$TMP/gpt2.json" --set train.steps=1 --set optim.warmup_steps=0 --set log.dir="$TMP/hn" >"$TMP/hn.out" 2>&1
b=$(grep -o "4 ranks, [0-9]* on this node" "$TMP/hn.out")
if [ "$a" = "4 ranks, 2 on this node" ] && [ "$b" = "4 ranks, 4 on this node" ]; then
    ok "ranks per node: LOCAL_WORLD_SIZE=2 (2 nodes of 2) says 2; unset, the 4 ranks sharing this host name"
else bad "ranks per node: '$a' / '$b'"; fi

# ---- faults ----
t0=$(date +%s.%N)
LLMTRAIN_FAULT=rank=3,step=4,kind=die trun die 4 $BIN "$TMP/llama.json" --set parallel.strategy=HYBRID_SHARD \
    --set parallel.shard_degree=2 --set log.dir="$TMP/die" >"$TMP/die.out" 2>&1
dt=$(echo "$(date +%s.%N) - $t0" | bc)
n=$(grep -cE "^llmtrain: rank [012]: TCP [a-z-]+ on the (shard|replicate|world) group failed: .*closed its connection" "$TMP/die.out")
if [ "$(rcs die 4)" = "6,6,6,137" ] && [ "$n" -ge 1 ] && [ "$(grep -c '^llmtrain:' "$TMP/die.out")" -eq 3 ] && (($(echo "$dt < 10" | bc))); then
    ok "rank 3 SIGKILLed at step 4 (HYBRID_SHARD 2x2): ranks 0-2 exit 6 in ${dt%???????} s, one line each"
else bad "rank 3 dies: exit codes $(rcs die 4), ${dt} s: $(grep llmtrain: "$TMP/die.out" | head -3)"; fi

t0=$(date +%s.%N)
LLMTRAIN_FAULT=rank=1,step=4,kind=hang trun hang 2 $BIN "$TMP/llama.json" --set parallel.strategy=FULL_SHARD \
    --set parallel.timeout_s=2 --set log.dir="$TMP/hang" >"$TMP/hang.out" 2>&1
dt=$(echo "$(date +%s.%N) - $t0" | bc)
# (rank 0 waits in a TCP collective: its own watchdog ends it, exit 5, or,
# when rank 1's watchdog fired first, the closed connection does, exit 6)
if [[ "$(rcs hang 2)" =~ ^[56],5$ ]] && grep -q "rank 1: watchdog: step 4 phase forward" "$TMP/hang.out" &&
   grep -qE "rank 0: (watchdog: step 4 .*collective TCP|TCP [a-z-]+ on the world group failed)" "$TMP/hang.out" && (($(echo "$dt < 12" | bc))); then
    ok "rank 1 hangs at step 4: its watchdog ends it (exit 5), rank 0 follows (exit $(cat "$TMP/hang.rc.0")) in ${dt%???????} s"
else bad "hang: exit codes $(rcs hang 2), ${dt} s: $(grep llmtrain: "$TMP/hang.out" | head -2)"; fi

# rank 1 reads another job (its optim.warmup_steps): both ranks exit 2 before
# a step with the same line, naming rank 1, the key and both values
printf '#!/bin/sh\n[ "$RANK" = 1 ] && exec "$@" --set optim.warmup_steps=3\nexec "$@"\n' >"$TMP/rank1_other.sh"
chmod +x "$TMP/rank1_other.sh"
trun other 2 "$TMP/rank1_other.sh" $BIN "$TMP/gpt2.json" --set log.dir="$TMP/other" >"$TMP/other.out" 2>&1
want="llmtrain: $TMP/gpt2.json: rank 1 (host $(hostname)) reads another job than rank 0 (host $(hostname)): optim.warmup_steps is 3 on rank 1, $(grep -o '"warmup_steps": [0-9]*' "$TMP/gpt2.json" | grep -o '[0-9]*$') on rank 0 (1 of 2 ranks differ from rank 0;"
if [ "$(rcs other 2)" = "2,2" ] && [ "$(grep -c '^llmtrain:' "$TMP/other.out")" -eq 2 ] && [ "$(grep -cF "$want" "$TMP/other.out")" -eq 2 ] &&
   ! grep -qs '"loss"' "$TMP/other/metrics.jsonl"; then
    ok "rank 1 with another optim.warmup_steps over TCP: both ranks exit 2 before a step, each with the line naming rank 1 and the key"
else bad "rank 1 reads another job over TCP: codes $(rcs other 2): $(grep -v '^ *$' "$TMP/other.out" | head -3) (wanted $want)"; fi

# two jobs on one MASTER_PORT: job B's rank 1 (TORCHELASTIC_RUN_ID jobB)
# reaches job A's rank 0 first and is turned away at once (exit 6, one line
# with both ids); job A's own rank 1 then joins and A trains to the end
port=$(free_port)
ajob() { RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=$2 LLMTRAIN_RDZV_TIMEOUT_S=30 \
    $BIN "$TMP/gpt2.json" --set train.steps=2 --set log.dir="$TMP/jobs-$2" >"$TMP/jobs-$2.$1.out" 2>&1; echo $? >"$TMP/jobs-$2.rc.$1"; }
ajob 0 jobA &
pa=$!
for _ in $(seq 200); do grep -q ":$(printf '%04X' "$port") 00000000:0000 0A" /proc/net/tcp && break; sleep 0.05; done
t0=$(date +%s.%N)
ajob 1 jobB
dt=$(echo "$(date +%s.%N) - $t0" | bc)
ajob 1 jobA
wait $pa
if [ "$(cat "$TMP/jobs-jobB.rc.1")" = 6 ] && [ "$(grep -c . "$TMP/jobs-jobB.1.out")" -eq 1 ] &&
   grep -q "^llmtrain: rank 1: rendezvous failed: 127.0.0.1:$port is the rendezvous of another job (its job id \"jobA\", this rank's \"jobB\"; the id comes from LLMTRAIN_RDZV_ID, else TORCHELASTIC_RUN_ID, else SLURM_JOB_ID): give this job a MASTER_PORT of its own" "$TMP/jobs-jobB.1.out" &&
   (($(echo "$dt < 3" | bc))) && [ "$(cat "$TMP/jobs-jobA.rc.0" "$TMP/jobs-jobA.rc.1" | tr '\n' ,)" = "0,0," ] &&
   [ "$(grep -c '"loss"' "$TMP/jobs-jobA/metrics.jsonl")" = 2 ]; then
    ok "another job's rank on this job's MASTER_PORT: turned away in ${dt%???????} s (exit 6, one line with both ids); this job forms and trains"
else bad "two jobs on one port: B's rank 1 exit $(cat "$TMP/jobs-jobB.rc.1") in $dt s: $(head -2 "$TMP/jobs-jobB.1.out"); A: $(cat "$TMP/jobs-jobA.rc."{0,1} | tr '\n' ,) $(grep llmtrain: "$TMP/jobs-jobA".*.out | head -2)"; fi

# a rank that never arrives: the others give up after LLMTRAIN_RDZV_TIMEOUT_S, rank 0 naming it
port=$(free_port); t0=$(date +%s.%N)
for r in 0 1 2; do
    (RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port LLMTRAIN_RDZV_TIMEOUT_S=2 \
        $BIN "$TMP/gpt2.json" --set log.dir="$TMP/absent" >"$TMP/absent.$r.out" 2>&1; echo $? >"$TMP/absent.rc.$r") &
done
wait
dt=$(echo "$(date +%s.%N) - $t0" | bc)
if [ "$(cat "$TMP/absent.rc."{0,1,2} | tr '\n' ,)" = "6,6,6," ] && grep -q "rank 0: rendezvous failed: .*timed out after 2 s: rank 3 never arrived" "$TMP/absent.0.out" &&
   grep -q "rank 3 never arrived" "$TMP/absent.1.out" && [ "$(wc -l <"$TMP/absent.1.out")" -eq 1 ] && (($(echo "$dt < 6" | bc))); then
    ok "rank 3 never starts: ranks 0-2 exit 6 after LLMTRAIN_RDZV_TIMEOUT_S=2 (${dt%???????} s), one line naming it"
else bad "absent rank: $(cat "$TMP/absent.rc."{0,1,2} | tr '\n' ,) ${dt} s: $(cat "$TMP/absent.0.out" "$TMP/absent.1.out" | head -3)"; fi

# a stop request during start-up: rank 0 gets SIGUSR1 while it waits in the
# rendezvous for rank 1 (which starts a second later); both exit 143 before
# a step, with nothing written (SIGUSR1's default action once killed rank 0)
port=$(free_port)
startup() { RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port LLMTRAIN_RDZV_TIMEOUT_S=30 \
    $BIN "$TMP/llama.json" --set log.dir="$TMP/early" >"$TMP/early.$1.out" 2>&1; echo $? >"$TMP/early.rc.$1"; }
startup 0 &
p0=$!
# until rank 0 listens on MASTER_PORT (in the rendezvous, its handlers long installed)
for _ in $(seq 200); do grep -q ":$(printf '%04X' "$port") 00000000:0000 0A" /proc/net/tcp && break; sleep 0.05; done
sleep 0.2
pkill -USR1 -f "^$BIN $TMP/llama.json --set log.dir=$TMP/early"
sleep 0.5
startup 1
wait $p0
if [ "$(cat "$TMP/early.rc.0" "$TMP/early.rc.1" | tr '\n' ,)" = "143,143," ] &&
   grep -q "stopped by signal during start-up, before step 1; nothing new to checkpoint, exiting 143" "$TMP/early.0.out" &&
   ! grep -q '"loss"' "$TMP/early/metrics.jsonl" 2>/dev/null && [ -z "$(ls -A "$TMP/early/checkpoints" 2>/dev/null | grep -vx "\.llmtrain\.lock")" ]; then
    ok "SIGUSR1 to rank 0 in the rendezvous: both ranks exit 143 before step 1, no step, no checkpoint"
else bad "stop during start-up: codes $(cat "$TMP/early.rc.0" "$TMP/early.rc.1" | tr '\n' ,) $(cat "$TMP/early.0.out" | grep llmtrain: | head -2)"; fi

# bad variables: exit 2, one line
for spec in "RANK=4 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500|RANK=4 is out of range (expected an integer in 0..3 for WORLD_SIZE=4)" \
            "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=29500|MASTER_ADDR is not set" \
            "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=999.1.1.1 MASTER_PORT=29500|MASTER_ADDR='999.1.1.1' is not a valid IPv4 address" \
            "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=1.2.3 MASTER_PORT=29500|MASTER_ADDR='1.2.3' is not a valid IPv4 address" \
            "WORLD_SIZE=abc|WORLD_SIZE='abc' is not a number (expected an integer in 1..1048576)" \
            "WORLD_SIZE=-4|WORLD_SIZE=-4 is out of range (expected an integer in 1..1048576)" \
            "WORLD_SIZE=0|WORLD_SIZE=0 is out of range" \
            "WORLD_SIZE=4294967298|WORLD_SIZE=4294967298 is out of range" \
            "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 LLMTRAIN_RDZV_TIMEOUT_S=soon|LLMTRAIN_RDZV_TIMEOUT_S=\"soon\": expected a number"; do
    vars=${spec%%|*}; want=${spec#*|}
    env -u MASTER_ADDR $vars $BIN "$TMP/gpt2.json" --set log.dir="$TMP/badenv" >"$TMP/badenv.out" 2>&1
    rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/badenv.out")" -eq 1 ] && grep -qF "$want" "$TMP/badenv.out"; then ok "[$vars]: exit 2, one line: $want"
    else bad "[$vars]: rc $rc: $(head -2 "$TMP/badenv.out")"; fi
done

# ---- open-file limit ----
# 12 ranks under a soft limit of 12 descriptors: rank 0 raises it toward the
# hard limit (without that, rank 0 runs out mid-rendezvous); a hard limit
# below 2 x world + 64 is exit 2 on every rank, one line each
(ulimit -Sn 12; trun fd12 12 $BIN "$TMP/llama.json" --set train.steps=2 --set train.global_batch=12 --set train.micro_batch=1 \
    --set checkpoint.every_steps=0 --set log.dir="$TMP/fd12" >"$TMP/fd12.out" 2>&1)
if [ "$(rcs fd12 12)" = "0,0,0,0,0,0,0,0,0,0,0,0" ] && grep -q "^step     2/2" "$TMP/fd12.out"; then
    ok "12 ranks under a soft open-file limit of 12: the limit is raised and the run completes"
else bad "soft open-file limit: exit codes $(rcs fd12 12): $(grep llmtrain: "$TMP/fd12.out" | head -2)"; fi
(ulimit -n 40; trun fd40 4 $BIN "$TMP/llama.json" --set train.steps=2 --set log.dir="$TMP/fd40" >"$TMP/fd40.out" 2>&1)
if [ "$(rcs fd40 4)" = "2,2,2,2" ] && [ "$(grep -c "the open-file limit is 40, below the 72 descriptors a world of 4 ranks needs" "$TMP/fd40.out")" -eq 4 ] &&
   [ "$(wc -l <"$TMP/fd40.out")" -eq 4 ]; then
    ok "hard open-file limit 40 for 4 ranks (72 needed): every rank exits 2 with one line"
else bad "hard open-file limit: exit codes $(rcs fd40 4): $(head -2 "$TMP/fd40.out")"; fi

# ---- ports ----
# MASTER_PORT taken: without the agent-store flag the rendezvous cannot
# listen (exit 6, saying so); with TORCHELASTIC_USE_AGENT_STORE=True it uses MASTER_PORT + 1
port=$(free_port)
$PY -c 'import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); time.sleep(60)' $port &
holder=$!
sleep 0.5
PORT=$port LLMTRAIN_RDZV_TIMEOUT_S=2 trun held 2 $BIN "$TMP/gpt2.json" --set train.steps=2 --set log.dir="$TMP/held" >"$TMP/held.out" 2>&1
c1=$(rcs held 2)
if [ "$(cat "$TMP/held.rc.0")" = 6 ] && grep -q "rank 0: rendezvous failed: .*Address already in use" "$TMP/held.out"; then
    ok "MASTER_PORT held by another process: rank 0 exits 6 saying the address is in use (exit codes $c1)"
else bad "held MASTER_PORT: exit codes $c1: $(grep llmtrain: "$TMP/held.out" | head -2)"; fi
PORT=$port TORCHELASTIC_USE_AGENT_STORE=True trun agent 2 $BIN "$TMP/gpt2.json" --set train.steps=2 --set log.dir="$TMP/agent" >"$TMP/agent.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "rendezvous 127.0.0.1:$((port + 1)))" "$TMP/agent.out"; then
    ok "TORCHELASTIC_USE_AGENT_STORE=True: the rendezvous moves to MASTER_PORT + 1 and the run completes"
else bad "agent store: rc $rc: $(grep -E 'launch|llmtrain:' "$TMP/agent.out" | head -2)"; fi
kill $holder 2>/dev/null; wait $holder 2>/dev/null

# ---- Slurm: srun's variables, no MPI ----
# srun_emu NAME NP [VAR=VALUE...] -- CMD...: NP tasks with the variables srun
# gives a step's tasks (SLURM_JOB_ID from $JOB, the step's nodes from
# $NODES); what a task leaves unset is llmtrain's to derive (rank 0's host
# from the node list, the port from the job and step ids)
srun_emu() {
    local name=$1 np=$2 pids=() r rc=0 c extra=(); shift 2
    while [ "$1" != -- ]; do extra+=("$1"); shift; done; shift
    for ((r = 0; r < np; r++)); do
        (env SLURM_JOB_ID=$JOB SLURM_JOBID=$JOB SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_NTASKS=$np SLURM_NPROCS=$np \
             SLURM_STEP_NUM_TASKS=$np SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_STEP_NUM_NODES=1 \
             SLURM_STEP_NODELIST="$NODES" SLURM_JOB_NODELIST="$NODES" SLURM_NODELIST="$NODES" \
             SLURM_STEP_TASKS_PER_NODE=$np SLURM_TASKS_PER_NODE=$np LLMTRAIN_RDZV_TIMEOUT_S=60 "${extra[@]}" "$@"
         echo $? >"$TMP/$name.rc.$r") &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
    for ((r = 0; r < np; r++)); do c=$(cat "$TMP/$name.rc.$r"); [ "$c" -gt $rc ] && rc=$c; done
    return $rc
}
# a job id whose port (15000 + (8 x job + step) mod 17000, docs/launching.md) is free here
JOB=$($PY - <<'PYEOF'
import random, socket
while True:
    job = random.randrange(1000, 10**7)
    port = 15000 + (job * 8) % 17000
    try:
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))
        print(job)
        break
    except OSError:
        pass
PYEOF
)
sport=$((15000 + (JOB * 8) % 17000))
NODES="$(hostname),ghost[02-04]"
for run in llama-4-HYBRID_SHARD-2 gpt2-2-FULL_SHARD; do
    IFS=- read -r arch np strategy degree <<<"$run"
    args=(--set parallel.strategy=$strategy)
    [ -n "$degree" ] && args+=(--set parallel.shard_degree=$degree)
    srun_emu srun-$run $np -- $BIN "$TMP/$arch.json" "${args[@]}" --set log.dir="$TMP/srun-$run" >"$TMP/srun-$run.out" 2>&1
    rc=$?
    $BIN export "$TMP/srun-$run/checkpoints" "$TMP/srun-$run/hf" >/dev/null 2>&1
    if [ $rc -eq 0 ] && grep -q "^launch: Slurm srun, host collectives over TCP (rendezvous $(hostname):$sport) | $np ranks, $np on this node" "$TMP/srun-$run.out" &&
       $PY tests/compare_runs.py "$TMP/$arch-${run#*-}-mpi" "$TMP/srun-$run" --steps 10 --exact >/dev/null; then
        ok "srun's variables alone ($run, job $JOB): rank 0 on the node list's first host, port $sport from the job id; bit-identical to mpirun's"
    else
        bad "srun $run: rc $rc: $(grep -E '^launch|llmtrain:' "$TMP/srun-$run.out" | head -2) $($PY tests/compare_runs.py "$TMP/$arch-${run#*-}-mpi" "$TMP/srun-$run" --steps 10 --exact 2>&1 | tail -1)"
    fi
done
# MASTER_ADDR / MASTER_PORT given: they win; torchrun's variables (srun
# torchrun ...) and an MPI launcher (srun --mpi=pmix, or mpirun in the
# allocation) win over srun's
port=$(free_port)
srun_emu srun-ma 2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $BIN "$TMP/gpt2.json" --set train.steps=2 --set log.dir="$TMP/srun-ma" >"$TMP/srun-ma.out" 2>&1
rc1=$?
export SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_STEP_NODELIST=ghost05
trun srun-tr 2 $BIN "$TMP/gpt2.json" --set train.steps=2 --set log.dir="$TMP/srun-tr" >"$TMP/srun-tr.out" 2>&1
rc2=$?
$MPIRUN 2 -x SLURM_STEP_NUM_TASKS -x SLURM_PROCID -x SLURM_LOCALID -x SLURM_STEP_NODELIST $BIN "$TMP/gpt2.json" --set train.steps=2 \
    --set log.dir="$TMP/srun-mpi" >"$TMP/srun-mpi.out" 2>&1
rc3=$?
unset SLURM_STEP_NUM_TASKS SLURM_PROCID SLURM_LOCALID SLURM_STEP_NODELIST
if [ $rc1 -eq 0 ] && grep -q "^launch: Slurm srun, host collectives over TCP (rendezvous 127.0.0.1:$port) | 2 ranks" "$TMP/srun-ma.out" &&
   [ $rc2 -eq 0 ] && grep -q "^launch: torchrun-style, host collectives over TCP" "$TMP/srun-tr.out" &&
   [ $rc3 -eq 0 ] && grep -q "^launch: MPI | 2 ranks" "$TMP/srun-mpi.out"; then
    ok "srun with MASTER_ADDR/MASTER_PORT uses them; torchrun's variables and mpirun each win over srun's (every rank saying rank 0 of the Slurm step)"
else bad "srun precedence: rc $rc1/$rc2/$rc3: $(grep -hE '^launch|llmtrain:' "$TMP/srun-ma.out" "$TMP/srun-tr.out" "$TMP/srun-mpi.out" | head -3)"; fi
# a batch script's own shell (SLURM_PROCID and SLURM_NTASKS, no step): one process, alone
env SLURM_JOB_ID=$JOB SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_JOB_NODELIST="$NODES" \
    $BIN "$TMP/gpt2.json" --set log.dir="$TMP/srun-batch" >"$TMP/srun-batch.out" 2>&1
rc=$?
$BIN export "$TMP/srun-batch/checkpoints" "$TMP/srun-batch/hf" >/dev/null 2>&1
# salloc's interactive step (LaunchParameters=use_interactive_step): a step of
# one task with a special step id near 2^32, alone as well
env SLURM_JOB_ID=$JOB SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=1 SLURM_STEP_ID=4294967290 SLURM_PROCID=0 SLURM_LOCALID=0 \
    SLURM_STEP_NODELIST="$NODES" $BIN "$TMP/gpt2.json" --set log.dir="$TMP/srun-int" >"$TMP/srun-int.out" 2>&1
rc2=$?
$BIN export "$TMP/srun-int/checkpoints" "$TMP/srun-int/hf" >/dev/null 2>&1
if [ $rc -eq 0 ] && ! grep -q "^launch:" "$TMP/srun-batch.out" && $PY tests/compare_runs.py "$TMP/gpt2-1" "$TMP/srun-batch" --steps 10 --exact >/dev/null &&
   [ $rc2 -eq 0 ] && ! grep -q "^launch:" "$TMP/srun-int.out" && $PY tests/compare_runs.py "$TMP/gpt2-1" "$TMP/srun-int" --steps 10 --exact >/dev/null; then
    ok "in a batch script outside srun (no SLURM_STEP_NUM_TASKS), and in salloc's interactive step (1 task, step 4294967290): a world of one, the same run as 1 rank"
else bad "batch script / interactive step: rc $rc/$rc2: $(grep -hE '^launch|llmtrain:' "$TMP/srun-batch.out" "$TMP/srun-int.out" | head -2)"; fi
# bad variables: exit 2 and one line on every task
for spec in "SLURM_STEP_NODELIST=ghost[01-|SLURM_STEP_NODELIST: node list 'ghost[01-' is malformed at '[01-'" \
            "SLURM_PROCID=7|SLURM_PROCID=7 is out of range (expected an integer in 0..1 for SLURM_STEP_NUM_TASKS=2)" \
            "SLURM_JOB_ID=|SLURM_JOB_ID is not set (expected an integer in 0..2147483647 (or set MASTER_PORT))"; do
    srun_emu srun-bad 2 "${spec%%|*}" -- $BIN "$TMP/gpt2.json" --set log.dir="$TMP/srun-bad" >"$TMP/srun-bad.out" 2>&1
    if [ "$(rcs srun-bad 2)" = 2,2 ] && [ "$(wc -l <"$TMP/srun-bad.out")" -eq 2 ] &&
       [ "$(grep -cF "llmtrain: Slurm srun launch (SLURM_STEP_NUM_TASKS is set, no MPI launcher, no WORLD_SIZE): ${spec#*|}" "$TMP/srun-bad.out")" -eq 2 ]; then
        ok "srun with ${spec%%|*}: both tasks exit 2, one line each"
    else bad "srun with ${spec%%|*}: exit codes $(rcs srun-bad 2): $(head -2 "$TMP/srun-bad.out")"; fi
done

# ---- recovery under scripts/run_resilient.sh ----
trun ref 2 $BIN "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set log.dir="$TMP/ref" >"$TMP/ref.out" 2>&1
$BIN export "$TMP/ref/checkpoints" "$TMP/ref/hf" >/dev/null 2>&1
export -f trun free_port
export TMP BIN PY
LLMTRAIN_FAULT="rank=1,step=7,kind=die,attempt=1" scripts/run_resilient.sh --delay 0 -- bash -c 'trun kill 2 "$@"' _ \
    $BIN "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set log.dir="$TMP/kill" >"$TMP/kill.out" 2>&1
rc=$?
$BIN export "$TMP/kill/checkpoints" "$TMP/kill/hf" >/dev/null 2>&1
if [ $rc -eq 0 ] && grep -q "run_resilient: attempt 1 exited with code 137" "$TMP/kill.out" && grep -q "^resume: " "$TMP/kill.out" &&
   $PY tests/compare_runs.py "$TMP/ref" "$TMP/kill" --steps 10 --exact >/dev/null; then
    ok "rank 1 SIGKILLed at step 7, relaunched by run_resilient.sh: resumed, losses and final weights bit-identical"
else bad "recovery over TCP: rc $rc: $(grep -E 'run_resilient|resume:|llmtrain:' "$TMP/kill.out" | head -4)"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
