#!/bin/bash
# Two "hosts" on this machine: network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2, interface smeth0 in both), Open MPI launching one rank in each through an
# rsh agent that runs the remote command with `ip netns exec`. Checks: a 2-host job
# reproduces the single-process loss trajectory and weights (plain mpirun, and through
# the SageMaker entry point with a leader and a waiting worker); a rank SIGKILLed on the
# second host ends the job on both hosts promptly and non-zero, the leader's failure
# file says so, and no process is left in either namespace; a launch without MPI
# (torchrun's variables, 2 ranks per host) matches too, with MASTER_ADDR an
# address and a host name that is loopback on rank 0's host. Skips only where
# network namespaces are not permitted. Namespaces are removed on exit.
. "$(dirname "$0")/lib.sh"
unset LLMTRAIN_FAULT

command -v ip >/dev/null 2>&1 || scripts/install_deps.sh >/dev/null 2>&1
NS1=llmsm$$a NS2=llmsm$$b
cleanup() {
    for ns in $NS1 $NS2; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    ip link del vsa$$ 2>/dev/null   # only left in this namespace when the set-up failed half way
    rm -rf "$TMP"
}
trap cleanup EXIT
netns_setup() {
    ip netns add $NS1 && ip netns add $NS2 &&
    ip link add vsa$$ type veth peer name vsb$$ &&
    ip link set vsa$$ netns $NS1 && ip link set vsb$$ netns $NS2 &&
    ip -n $NS1 link set vsa$$ name smeth0 && ip -n $NS2 link set vsb$$ name smeth0 &&
    ip -n $NS1 addr add 10.77.0.1/24 dev smeth0 && ip -n $NS2 addr add 10.77.0.2/24 dev smeth0 &&
    for ns in $NS1 $NS2; do ip -n $ns link set smeth0 up && ip -n $ns link set lo up || return 1; done
}
if ! err=$(netns_setup 2>&1); then
    echo "SKIP: this machine does not permit network namespaces joined by veth ($err)"
    echo "0 passed, 0 failed"
    exit 0
fi

# rsh agent: `agent [options] HOST COMMAND...` runs COMMAND in HOST's namespace
cat >"$TMP/agent" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in 10.77.0.1) ns=$NS1 ;; 10.77.0.2) ns=$NS2 ;; *) echo "agent: unknown host \$host" >&2; exit 255 ;; esac
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$TMP/agent"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' >"$TMP/hostfile"
MH="mpirun --hostfile $TMP/hostfile -np 2 --mca plm_rsh_agent $TMP/agent --mca btl tcp,self
    --mca btl_tcp_if_include smeth0 --mca oob_tcp_if_include smeth0 -x OMP_NUM_THREADS"

write_shard "$TMP/train.bin" 96 20000 1
cat >"$TMP/job.json" <<EOF
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/train.bin"},
 "train": {"steps": 10, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 0, "batches": 4, "every_steps": 5}}
EOF
left() { echo "$(ip netns pids $NS1 | wc -l) $(ip netns pids $NS2 | wc -l)"; }

# 1. the single-process reference and a plain 2-host mpirun
$BIN "$TMP/job.json" --set log.dir="$TMP/one" --set checkpoint.dir="$TMP/one/ckpt" >"$TMP/one.out" 2>&1 &&
    $BIN export "$TMP/one/ckpt" "$TMP/one/hf" >/dev/null || bad "single-process run failed: $(tail -3 "$TMP/one.out")"
timeout 90 ip netns exec $NS1 $MH $BIN "$TMP/job.json" --set log.dir="$TMP/mh" --set checkpoint.dir="$TMP/mh/ckpt" >"$TMP/mh.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "health: dp all-reduce .* over 2 ranks" "$TMP/mh.out" && $BIN export "$TMP/mh/ckpt" "$TMP/mh/hf" >/dev/null &&
   $PY tests/compare_runs.py "$TMP/one" "$TMP/mh" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3; then
    ok "2 hosts (one rank per namespace over veth) match the single-process losses and weights"
else
    bad "2-host mpirun: rc=$rc $(tail -5 "$TMP/mh.out")"
fi

# SageMaker trees for the two hosts (each host has its own /opt/ml)
for h in 1 2; do
    r=$TMP/h$h/ml
    mkdir -p "$r/input/config" "$r/code" "$r/input/data/train" "$r/input/data/val"
    cp "$TMP/job.json" "$r/code/job.json"
    cp "$TMP/train.bin" "$r/input/data/train/"
    cp "$TMP/train.bin" "$r/input/data/val/"
    echo "{\"current_host\": \"10.77.0.$h\", \"hosts\": [\"10.77.0.2\", \"10.77.0.1\"], \"network_interface_name\": \"smeth0\"}" \
        >"$r/input/config/resourceconfig.json"
    echo '{"job": "job.json"}' >"$r/input/config/hyperparameters.json"
done
# sm_job NAME [env...]: worker entry point in NS2 (background), leader in NS1; sets rc wrc secs
sm_job() {
    local name=$1; shift
    rm -rf "$TMP/h1/ml/output" "$TMP/h1/ml/checkpoints" "$TMP/h1/ml/model" "$TMP/h1/llmtrain-local"
    env LLMTRAIN_SM_ROOT="$TMP/h2/ml" LLMTRAIN_SM_WORKER_WAIT_S=60 LLMTRAIN_SM_SSHD=0 LLMTRAIN_SM_EFA_PROBE=/nonexistent \
        timeout 90 ip netns exec $NS2 scripts/sagemaker/train >"$TMP/$name.worker" 2>&1 &
    local wpid=$! t0 t1
    t0=$(date +%s.%N)
    env LLMTRAIN_SM_ROOT="$TMP/h1/ml" LLMTRAIN_SM_RSH_AGENT="$TMP/agent" LLMTRAIN_SM_SSHD=0 LLMTRAIN_SM_EFA_PROBE=/nonexistent \
        LLMTRAIN_BIN="$BIN" "$@" timeout 90 ip netns exec $NS1 scripts/sagemaker/train >"$TMP/$name.leader" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    wait $wpid
    wrc=$?
    secs=$($PY -c "print(round($t1 - $t0, 1))")
}

# 2. through the entry point: the leader (10.77.0.1, first when sorted) runs mpirun over both
sm_job sm
cp -r "$TMP/h1/ml/output/data" "$TMP/sm" 2>/dev/null && cp -r "$TMP/h1/ml/model" "$TMP/sm/hf" 2>/dev/null
if [ $rc -eq 0 ] && [ $wrc -eq 0 ] && grep -q "worker: MPI job finished" "$TMP/sm.worker" &&
   [ "$(cat "$TMP/h1/llmtrain-local/hostfile")" = "$(printf '10.77.0.1 slots=1\n10.77.0.2 slots=1')" ] &&
   $PY tests/compare_runs.py "$TMP/one" "$TMP/sm" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3; then
    ok "entry point, 2 hosts: leader's mpirun over the hostfile matches 1 process; the worker exits 0 after the job"
else
    bad "entry point 2 hosts: leader rc=$rc worker rc=$wrc $(tail -3 "$TMP/sm.leader") | $(tail -2 "$TMP/sm.worker")"
fi

# 3. rank 1 (second host) SIGKILLed at step 3: both hosts end promptly, non-zero, nothing left behind
sm_job die LLMTRAIN_FAULT="rank=1,step=3,kind=die"
f=$TMP/h1/ml/output/failure
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $wrc -eq 0 ] && $PY -c "import sys; sys.exit(not $secs <= 30)" &&
   [ -f "$f" ] && [ "$(wc -l <"$f")" -eq 1 ] && grep -q "^llmtrain exited with code $rc: .*rank 1 .* on node 10.77.0.2 exited on signal 9" "$f"; then
    ok "rank killed on host 2: job ends on both hosts in ${secs}s, exit $rc, failure: $(cat "$f")"
else
    bad "killed rank: leader rc=$rc worker rc=$wrc after ${secs}s failure='$(cat "$f" 2>/dev/null)' $(tail -3 "$TMP/die.leader")"
fi
sleep 1
if [ "$(left)" = "0 0" ]; then ok "no process left in either namespace"; else bad "processes left (ns1 ns2): $(left)"; fi

# 3b. max_restarts 1: the same kill in the first attempt only; the leader
# restarts mpirun over both hosts, the worker waits for the second MPI job
for h in 1 2; do echo '{"job": "job.json", "max_restarts": "1", "checkpoint.async": "false"}' >"$TMP/h$h/ml/input/config/hyperparameters.json"; done
sm_job restart LLMTRAIN_FAULT="rank=1,step=3,kind=die,attempt=1"
cp -r "$TMP/h1/ml/output/data" "$TMP/restart" 2>/dev/null && cp -r "$TMP/h1/ml/model" "$TMP/restart/hf" 2>/dev/null
if [ $rc -eq 0 ] && [ $wrc -eq 0 ] && grep -q "run_resilient: finished after 2 attempt(s)" "$TMP/restart.leader" &&
   grep -q "worker: MPI daemon gone; waiting up to" "$TMP/restart.worker" && [ "$(grep -c 'worker: MPI daemon running' "$TMP/restart.worker")" -eq 2 ] &&
   $PY tests/compare_runs.py "$TMP/one" "$TMP/restart" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3; then
    ok "max_restarts 1 over 2 hosts: rank killed on host 2, mpirun restarted over both, the worker served both jobs; matches 1 process"
else
    bad "2-host restart: leader rc=$rc worker rc=$wrc $(grep -E 'run_resilient|FAILED' "$TMP/restart.leader" | head -3) | $(tail -2 "$TMP/restart.worker")"
fi
for h in 1 2; do echo '{"job": "job.json"}' >"$TMP/h$h/ml/input/config/hyperparameters.json"; done

# 3c. SageMaker stops the job: SIGTERM to the entry point on both hosts (each
# container's process 1) while it trains; each rank's checkpoint takes ~2 s
# (kind=ckpt_slow), longer than the 1 s mpirun gives its ranks after a SIGTERM
for h in 1 2; do echo '{"job": "job.json", "train.steps": "100000", "checkpoint.every_steps": "0"}' >"$TMP/h$h/ml/input/config/hyperparameters.json"; done
rm -rf "$TMP/h1/ml/checkpoints" "$TMP/h1/ml/output"
(sm_job stop LLMTRAIN_FAULT="step=1-1000000,kind=ckpt_slow"; echo "$rc $wrc" >"$TMP/stop.rc") &
spid=$!
wait_steps "$TMP/h1/ml/output/data/metrics.jsonl" 5 30
pkill -TERM -f '^/usr/bin/python3 scripts/sagemaker/train'
wait $spid
read -r rc wrc <"$TMP/stop.rc"
f=$TMP/h1/ml/output/failure
k=$(ls "$TMP/h1/ml/checkpoints" 2>/dev/null)
if [ "$rc" -eq 143 ] && [ "$wrc" -eq 0 ] && [ "$(echo "$k" | wc -w)" -eq 1 ] && [ -f "$TMP/h1/ml/checkpoints/$k/manifest.json" ] &&
   [ "$(ls "$TMP/h1/ml/checkpoints/$k" | grep -c '^rank_')" -eq 2 ] && grep -q "waiting for its daemon to finish" "$TMP/stop.worker" &&
   grep -q "stopped by signal after step $((10#${k#step_})); checkpoint written, exiting 143" "$f"; then
    ok "SIGTERM to both hosts' entry points: SIGUSR1 through mpirun, both ranks' files of $k written and copied to the durable folder, leader exit 143, worker 0"
else
    bad "stopping the 2-host job: leader rc=$rc worker rc=$wrc checkpoints '$k' failure='$(cat "$f" 2>/dev/null)' $(tail -2 "$TMP/stop.worker")"
fi
for h in 1 2; do echo '{"job": "job.json"}' >"$TMP/h$h/ml/input/config/hyperparameters.json"; done

# 4. the same kill under plain mpirun
t0=$(date +%s)
LLMTRAIN_FAULT="rank=1,step=3,kind=die" timeout 90 ip netns exec $NS1 $MH -x LLMTRAIN_FAULT $BIN "$TMP/job.json" \
    --set log.dir="$TMP/mhdie" --set checkpoint.dir="$TMP/mhdie/ckpt" >"$TMP/mhdie.out" 2>&1
rc=$?
secs=$(($(date +%s) - t0))
sleep 1
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 30 ] && [ "$(left)" = "0 0" ]; then
    ok "plain mpirun: rank killed on host 2 ends the job in ${secs}s (exit $rc), no process left"
else
    bad "plain mpirun kill: rc=$rc after ${secs}s, left $(left): $(tail -3 "$TMP/mhdie.out")"
fi

# 5. without MPI (torchrun's variables): 2 ranks per host, HYBRID_SHARD 2x2
# (shard groups inside a host, replicate groups across). MASTER_ADDR is
# 10.77.0.1, then the host name llmhost0, which host 1's /etc/hosts maps to
# 127.0.1.1 (as Debian maps a host's own name) and host 2's to 10.77.0.1: the
# ranks on host 1 reach rank 0 through loopback, and the groups they lead
# must advertise smeth0's address instead, or host 2's members never connect.
mkdir -p /etc/netns/$NS1 /etc/netns/$NS2
printf '127.0.0.1 localhost\n127.0.1.1 llmhost0\n' >/etc/netns/$NS1/hosts
printf '127.0.0.1 localhost\n10.77.0.1 llmhost0\n' >/etc/netns/$NS2/hosts
trap 'rm -rf /etc/netns/$NS1 /etc/netns/$NS2; cleanup' EXIT
# tr_2hosts NAME ADDR: ranks 0, 1 in NS1 and 2, 3 in NS2 (LOCAL_WORLD_SIZE 2)
tr_2hosts() {
    local name=$1 addr=$2 r ns pids=()
    for r in 0 1 2 3; do
        ns=$NS1; [ $r -ge 2 ] && ns=$NS2
        (timeout 90 ip netns exec $ns env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 MASTER_ADDR=$addr \
            MASTER_PORT=29400 LLMTRAIN_RDZV_TIMEOUT_S=20 $BIN "$TMP/job.json" --set parallel.strategy=HYBRID_SHARD \
            --set parallel.shard_degree=2 --set log.dir="$TMP/$name" --set checkpoint.dir="$TMP/$name/ckpt"; echo $? >"$TMP/$name.rc.$r") &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
}
for v in "tr-ip 10.77.0.1" "tr-name llmhost0"; do
    set -- $v
    codes=$(tr_2hosts "$1" "$2" >"$TMP/$1.out" 2>&1; cat "$TMP/$1.rc."{0,1,2,3} | tr '\n' ' ')
    if [ "$codes" = "0 0 0 0 " ] && grep -q "rendezvous $2:29400) | 4 ranks, 2 on this node" "$TMP/$1.out" &&
       $BIN export "$TMP/$1/ckpt" "$TMP/$1/hf" >/dev/null && $PY tests/compare_runs.py "$TMP/one" "$TMP/$1" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3; then
        ok "without MPI, 2 hosts x 2 ranks (HYBRID_SHARD 2x2), MASTER_ADDR=$2: matches 1 process"
    else
        bad "without MPI, MASTER_ADDR=$2: exit codes $codes: $(grep -E 'llmtrain:' "$TMP/$1.out" | head -3)"
    fi
done
sleep 1
if [ "$(left)" = "0 0" ]; then ok "no process left in either namespace after the launches without MPI"; else bad "processes left (ns1 ns2): $(left)"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
