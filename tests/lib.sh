# tests/lib.sh — shared prelude of the multi-rank shell tests: repo root,
# binary, a temp dir removed on exit, MPI as root on 2 cores, counters with
# ok/bad reporters, and a random token shard writer. Source it: `. "$(dirname "$0")/lib.sh"`.
cd "$(dirname "$0")/.." || exit 2
BIN=$PWD/llmtrain
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
unset LLMTRAIN_RDZV_ID # the launches here take the ids their tests give (or none)
MPIRUN="mpirun --oversubscribe --allow-run-as-root -np"
pass=0; fail=0

# write_shard PATH VOCAB NTOKENS SEED: uniform random uint16 tokens, llm.c format
write_shard() {
    $PY - "$@" <<'PYEOF'
import sys, numpy as np
path, vocab, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = np.random.default_rng(seed).integers(0, vocab, n)
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))
open(path, "wb").write(h.tobytes() + t.astype(np.uint16).tobytes())
PYEOF
}
# learnable_shard PATH: 20000 tokens below 96, each the last one times 5
# plus 3 (mod 96), one in 10 random: a shard the small models learn from
learnable_shard() {
    $PY - "$1" <<'PYEOF'
import sys, numpy as np
rng = np.random.default_rng(1); t = np.zeros(20000, np.int64)
for i in range(1, len(t)): t[i] = rng.integers(0, 96) if rng.random() < 0.1 else (t[i - 1] * 5 + 3) % 96
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))
open(sys.argv[1], "wb").write(h.tobytes() + t.astype(np.uint16).tobytes())
PYEOF
}
# wait_steps FILE N SECONDS: until metrics.jsonl FILE has logged N steps, at
# most SECONDS (polled every 50 ms); non-zero if it did not
wait_steps() {
    local i n
    for ((i = 0; i < $3 * 20; i++)); do
        n=$(grep -c '"loss"' "$1" 2>/dev/null); [ "${n:-0}" -ge "$2" ] && return 0; sleep 0.05
    done
    return 1
}
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
# refused WHAT PATTERN CMD...: CMD exits 2 with a line `llmtrain: PATTERN...`
# (grep's regex) among its output (each rank prints its own)
refused() {
    local what=$1 pat=$2 rc; shift 2
    "$@" >"$TMP/refused.out" 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q "^llmtrain: $pat" "$TMP/refused.out"; then ok "$what: exit 2 with the line"
    else bad "$what: rc $rc, expected 2 and llmtrain: $pat: $(grep llmtrain: "$TMP/refused.out" | head -2)"; fi
}

# layout_run NAME JOB NP [--set ...]: one run of $TMP/JOB.json on NP ranks
# into $TMP/NAME (metrics.jsonl, the checkpoint in NAME/ckpt, its export in
# NAME/hf), its output in $TMP/NAME.out; a run that fails says so
layout_run() {
    local name=$1 job=$2 np=$3; shift 3
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/$job.json" --set log.dir="$TMP/$name" --set checkpoint.dir="$TMP/$name/ckpt" "$@" </dev/null >"$TMP/$name.out" 2>&1 ||
        echo "(run $name exited non-zero: $(grep llmtrain: "$TMP/$name.out" | head -1))"
    $BIN export "$TMP/$name/ckpt" "$TMP/$name/hf" >/dev/null 2>&1
}

# tiny_job ARCH PATH DATA [EXTRA]: the small test model (2 layers, 32 wide,
# 4 heads, Llama with 2 KV heads; vocab 96, 16 tokens), 10 steps of 8
# sequences in micro-batches of 2 on DATA (also the validation set);
# EXTRA adds top-level JSON members (',"checkpoint": {...}').
tiny_job() {
    cat >"$2" <<EOF
{"model": {"arch": "$1", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": $([ "$1" = llama ] && echo 2 || echo 4),
           "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$3", "val": "$3"},
 "train": {"steps": 10, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 0, "batches": 4, "every_steps": 5}${4:-}}
EOF
}

# ckpt_job PATH DATA STEPS EVERY: the small Llama of tiny_job, STEPS steps
# on DATA with a checkpoint every EVERY steps, no evaluation, no sample
ckpt_job() {
    cat >"$1" <<EOF
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2,
           "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$2"},
 "train": {"steps": $3, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2},
 "checkpoint": {"every_steps": $4},
 "eval": {"sample_tokens": 0}}
EOF
}

# A port nothing listens on, with the next one free too (the agent-store
# test moves the rendezvous to MASTER_PORT + 1), per launch. Drawn below the
# kernel's ephemeral range, so no connection a rank or an earlier test opens
# can be holding it by the time rank 0 listens (a port the kernel picked for
# bind(0) is also one it hands out to connect()).
free_port() {
    $PY - <<'PYEOF'
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
for _ in range(1000):
    p = random.randrange(10000, max(low - 1, 10001))
    held = []
    try:
        for q in (p, p + 1):
            s = socket.socket(); held.append(s); s.bind(("127.0.0.1", q))
    except OSError:
        continue
    finally:
        for s in held: s.close()
    print(p); break
else:
    raise SystemExit("free_port: no free pair of ports below %d" % low)
PYEOF
}
# trun NAME NP COMMAND...: a torchrun-style launch of NP local ranks of
# COMMAND (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set; PORT
# and LOCAL_WORLD_SIZE from the caller's environment when set; a rendezvous
# timeout of 60 s unless the caller sets one, so a launch that cannot form
# fails in a minute, not the default 300 s); the ranks
# write to trun's stdout and stderr; rank r's exit code lands in
# $TMP/NAME.rc.r (rcs NAME NP lists them); returns the largest code.
trun() {
    local name=$1 np=$2; shift 2
    local port=${PORT:-$(free_port)} pids=() r rc=0 c
    for ((r = 0; r < np; r++)); do
        (RANK=$r WORLD_SIZE=$np LOCAL_RANK=$((r % ${LOCAL_WORLD_SIZE:-$np})) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port LLMTRAIN_RDZV_TIMEOUT_S=${LLMTRAIN_RDZV_TIMEOUT_S:-60} "$@"; echo $? >"$TMP/$name.rc.$r") &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
    for ((r = 0; r < np; r++)); do c=$(cat "$TMP/$name.rc.$r"); [ "$c" -gt $rc ] && rc=$c; done
    return $rc
}
rcs() { local r s=""; for ((r = 0; r < $2; r++)); do s="$s$(cat "$TMP/$1.rc.$r")"; [ $r -lt $(($2 - 1)) ] && s="$s,"; done; echo "$s"; }
