#!/bin/bash
# bf16 working weights (train.param_dtype bf16) with stochastic rounding
# (optim.stochastic_rounding), on top of test_torch.py's nearest-rounding
# comparison with PyTorch: the step-0 working weights are bf16 values that
# round the init stochastically (some up, some down, each a neighbour);
# stochastic and nearest runs differ; a run killed and resumed is
# bit-identical to an uninterrupted one (the draws are keyed by seed, step
# and element, so a resume redraws the same), on 1 rank and FULL_SHARD 2;
# FULL_SHARD 2 matches 1 rank within reduction order; sharded, the
# all-gathers move bf16 words (half the fp32 bytes) over MPI and TCP and
# the gathered weights are the 1-rank ones; stochastic rounding without bf16
# is one line and exit 2.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 5
cat >"$TMP/job.json" <<EOF2
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 10, "seq_len": 16, "micro_batch": 2, "global_batch": 8, "param_dtype": "bf16"},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "stochastic_rounding": true},
 "checkpoint": {"every_steps": 3, "async": false},
 "eval": {"sample_tokens": 0}}
EOF2
run() { # name np [args]
    local name=$1 np=$2; shift 2
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set log.dir="$TMP/$name" "$@" >>"$TMP/$name.out" 2>&1
}
export_run() { $BIN export "$TMP/$1/checkpoints" "$TMP/$1/hf" >/dev/null 2>&1; }

# step-0 working weights: bf16 values, the stochastic rounding of the fp32 init
run dump 1 --set train.steps=1 --set optim.decay_steps=10 --set debug.dump="$TMP/dump" --set checkpoint.every_steps=0
run dump32 1 --set train.steps=1 --set optim.decay_steps=10 --set debug.dump="$TMP/dump32" --set checkpoint.every_steps=0 --set train.param_dtype=fp32 \
    --set optim.stochastic_rounding=false
if $PY - "$TMP/dump/params0/model.safetensors" "$TMP/dump32/params0/model.safetensors" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, "tests")
import hfio
w, f = hfio.read_safetensors(sys.argv[1]), hfio.read_safetensors(sys.argv[2])
up = down = 0
for n in f:
    a, x = w[n].numpy().astype(np.float32).ravel(), f[n].numpy().astype(np.float32).ravel()
    assert not (a.view(np.uint32) & 0xffff).any(), n                      # bf16 values
    lo = (x.view(np.uint32) & 0xffff0000).view(np.float32)                # toward zero
    hi = np.nextafter(lo, np.where(x < 0, -np.inf, np.inf).astype(np.float32), dtype=np.float32)
    hi = ((hi.view(np.uint32) + 0xffff) & 0xffff0000).view(np.float32)   # next bf16 away from zero
    exact = (x.view(np.uint32) & 0xffff) == 0
    assert np.all((a == lo) | (a == hi) | exact), n                       # a neighbour
    up += int(((a == hi) & ~exact).sum()); down += int(((a == lo) & ~exact).sum())
assert up > 0.3 * (up + down) and down > 0.3 * (up + down), (up, down)
print(f"rounded away from zero {up}, toward zero {down}")
PYEOF
then ok "step-0 working weights: bf16 neighbours of the fp32 init, rounded both ways"
else bad "stochastic working weights at step 0"; fi

run near 1 --set optim.stochastic_rounding=false
run sto 1
export_run near; export_run sto
if ! $PY tests/compare_runs.py "$TMP/near" "$TMP/sto" --steps 10 --exact >/dev/null 2>&1 &&
   $PY tests/compare_runs.py "$TMP/near" "$TMP/sto" --steps 10 --loss-rtol 5e-2 --weight-rtol 1e-1 >/dev/null; then
    ok "stochastic and nearest rounding give different, close trajectories"
else bad "stochastic vs nearest"; fi

# exact resume: killed at step 8 (checkpoint 6 complete), restarted
for layout in "1" "2 --set parallel.strategy=FULL_SHARD"; do
    read -r np rest <<<"$layout"
    run ref$np $np $rest
    (LLMTRAIN_FAULT="rank=0,step=8,kind=die" run cut$np $np $rest) 2>/dev/null
    run cut$np $np $rest
    export_run ref$np; export_run cut$np
    if grep -q "resume: .*step_00000006 at step 6" "$TMP/cut$np.out" && $PY tests/compare_runs.py "$TMP/ref$np" "$TMP/cut$np" --steps 10 --exact; then
        ok "$np rank(s) ${rest:+($rest) }stochastic bf16: killed at step 8, resumed from 6, bit-identical"
    else bad "$np rank(s) resume with stochastic rounding: $(grep -E 'resume|llmtrain:' "$TMP/cut$np.out" | head -3)"; fi
done
if $PY tests/compare_runs.py "$TMP/ref1" "$TMP/ref2" --steps 10 --loss-rtol 1e-4 --weight-rtol 1e-2; then
    ok "FULL_SHARD 2 with stochastic bf16 matches 1 rank (the draws do not depend on the sharding)"
else bad "FULL_SHARD 2 vs 1 rank with stochastic bf16"; fi

# sharded bf16 working weights travel as bf16 words: the all-gathers move
# exactly half the fp32 run's bytes (the reduce-scatters are fp32 in both),
# a torchrun-style launch (TCP collectives) gets the MPI run's trajectory,
# and the gathered step-0 weights (debug.dump) are the 1-rank ones bit for bit
run fs32 2 --set parallel.strategy=FULL_SHARD --set train.param_dtype=fp32 --set optim.stochastic_rounding=false
if $PY - "$TMP/ref2/metrics.jsonl" "$TMP/fs32/metrics.jsonl" <<'PYEOF'
import json, sys
cb = lambda p: [d["comm_bytes"] for d in map(json.loads, open(p)) if "comm_bytes" in d]
b, f = cb(sys.argv[1]), cb(sys.argv[2])
ok = len(b) == len(f) == 10 and all(x["allgather"] > 0 and 2 * x["allgather"] == y["allgather"] and
                                    x["reduce_scatter"] == y["reduce_scatter"] for x, y in zip(b, f))
print(f"allgather per step bf16 {b[-1]['allgather']:.0f} fp32 {f[-1]['allgather']:.0f}; "
      f"reduce_scatter {b[-1]['reduce_scatter']:.0f} {f[-1]['reduce_scatter']:.0f}")
sys.exit(0 if ok else 1)
PYEOF
then ok "FULL_SHARD 2 bf16: all-gather bytes exactly half the fp32 run's every step, reduce-scatter the same"
else bad "bf16 all-gather bytes"; fi
# memory: the bf16 shard (half the fp32 master shard) is all sharded bf16 adds to the weight pool
field() { grep -o "rank 0: .*$2 [0-9]*" "$TMP/$1.out" | head -1 | awk '{print $NF}'; }
pb=$(field ref2 params_bytes); pf=$(field fs32 params_bytes); mb=$(field ref2 master_bytes)
if [ -n "$pb" ] && [ -n "$pf" ] && [ -n "$mb" ] && [ "$mb" -gt 0 ] && [ $((pb - pf)) -eq $((mb / 2)) ]; then
    ok "FULL_SHARD 2 bf16: params_bytes $pb = fp32 run's $pf + half the master shard ($mb / 2): no staging copy"
else bad "FULL_SHARD 2 bf16 params_bytes '$pb' vs fp32 '$pf' + '$mb' / 2"; fi
trun tcp 2 $BIN "$TMP/job.json" --set parallel.strategy=FULL_SHARD --set log.dir="$TMP/tcp" >"$TMP/tcp.out" 2>&1
export_run tcp
if grep -q "^launch: torchrun-style" "$TMP/tcp.out" &&
   $PY tests/compare_runs.py "$TMP/ref2" "$TMP/tcp" --steps 10 --loss-rtol 1e-4 --weight-rtol 1e-2; then
    ok "FULL_SHARD 2 stochastic bf16 over the TCP rendezvous (bf16 words) matches the MPI run"
else bad "torchrun-style FULL_SHARD bf16: $(grep -E 'launch|llmtrain:' "$TMP/tcp.out" | head -3)"; fi
run dumpfs 2 --set train.steps=1 --set optim.decay_steps=10 --set debug.dump="$TMP/dumpfs" --set checkpoint.every_steps=0 --set parallel.strategy=FULL_SHARD
if cmp -s "$TMP/dump/params0/model.safetensors" "$TMP/dumpfs/params0/model.safetensors"; then
    ok "FULL_SHARD 2: the step-0 working weights gathered as bf16 words equal the 1-rank ones bit for bit"
else bad "FULL_SHARD 2 bf16 dump differs from 1 rank: $(ls "$TMP/dumpfs" 2>&1 | head -2)"; fi

# what bf16 working weights cost, against a formula written here: one rank of a model of P = 19,928,064 parameters
# (2 layers of 1024 wide, 8 heads, 4 kv heads, MLP 2048, vocabulary 512,
# untied) holds a whole fp32 master copy (4P bytes) beside its working
# weights; check's estimate says 4P more and why; FULL_SHARD 2 adds the shard's bf16 words
# (2 bytes a parameter over 2 ranks: P bytes a rank)
C=1024; L=2; F=2048; V=512; KV=$((C / 8 * 4))
P=$(( V * C * 2 + C + L * (2 * C + 2 * C * C + 2 * C * KV + 3 * C * F) ))
cat >"$TMP/big.json" <<EOF2
{"model": {"arch": "llama", "n_layer": $L, "n_embd": $C, "n_head": 8, "n_kv_head": 4, "ffn_hidden": $F, "vocab_size": $V, "max_seq_len": 16, "tie_embeddings": false},
 "data": {"train": "$TMP/big.bin"}, "train": {"steps": 1, "seq_len": 16, "micro_batch": 1, "device": "cpu"},
 "checkpoint": {"every_steps": 0}, "eval": {"sample_tokens": 0}}
EOF2
e1=$($BIN check "$TMP/big.json" --set train.param_dtype=bf16 2>&1); e2=$($BIN check "$TMP/big.json" --world 2 --set train.param_dtype=bf16 --set parallel.strategy=FULL_SHARD 2>&1)
if grep -q "^per rank (estimate): params_bytes $((4 * P)) master_bytes $((4 * P)) " <<<"$e1" &&
   grep -q "^param_dtype bf16: $((4 * P)) bytes a rank more than fp32 working weights .* so bf16 adds a whole fp32 master copy beside the working weights; .*, not memory$" <<<"$e1" &&
   grep -q "^param_dtype bf16: $P bytes a rank more than fp32 working weights .* bf16 adds the bf16 words of the rank's shard" <<<"$e2"; then
    ok "check, P = $P: 1 rank bf16 params_bytes = master_bytes = 4P and says it costs 4P more; FULL_SHARD 2 P more a rank"
else bad "bf16 estimate against P = $P: $(grep -E 'params_bytes|param_dtype' <<<"$e1$e2")"; fi

$BIN "$TMP/job.json" --set train.param_dtype=fp32 >"$TMP/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/bad.out")" -eq 1 ] && grep -q "optim.stochastic_rounding needs train.param_dtype" "$TMP/bad.out"; then
    ok "stochastic rounding without bf16: one line, exit 2"
else bad "stochastic without bf16: rc $rc $(cat "$TMP/bad.out")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
