#!/bin/bash
# Evaluation and sampling under sharding gather chunk by chunk through the
# chunk hook (forward only), never the full weights: FULL_SHARD 2 and 4,
# HYBRID_SHARD 2x2, FULL_SHARD with reshard_after_forward false and tp 2 x
# FULL_SHARD 2 give the single-process val losses (3 eval batches, so some
# ranks run an uncounted forward) and the same greedy sample, for GPT-2,
# Llama and Llama with tied embeddings; an 8-layer Llama under FULL_SHARD 4
# keeps params_peak_bytes (metrics.jsonl) at params_bytes through its
# evaluations, below the model's size. A blended data.val's per-source val
# losses (each a collective evaluation of its own) match 1 rank's.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1

# run NAME NP JSON SET_ARGS...: one run, its stdout in $TMP/NAME.out; ranks
# whose forwards fall out of step hang in a collective: the watchdog ends it
run() {
    local name=$1 np=$2 json=$3; shift 3
    local cmd="$BIN"
    [ "$np" != 1 ] && cmd="$MPIRUN $np $BIN"
    if ! $cmd "$json" --set log.dir="$TMP/$name" --set checkpoint.every_steps=0 --set parallel.health_check=false \
        --set parallel.timeout_s=30 "$@" >"$TMP/$name.out" 2>&1; then
        bad "$name exited non-zero: $(tail -3 "$TMP/$name.out")"; return 1
    fi
}
# the printed samples of a run, one line each
samples() { awk '/^--- sample ---$/ {getline; print}' "$TMP/$1.out"; }
# number of val_loss entries in a run's metrics
n_val() { grep -c '"val_loss"' "$TMP/$1/metrics.jsonl"; }

for arch in gpt2 llama llama-tied; do
    base=${arch%-tied}
    cat >"$TMP/$arch.json" <<EOF
{"model": {"arch": "$base", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": $([ $base = llama ] && echo 2 || echo 4),
           "vocab_size": 96, "max_seq_len": 16$([ $arch = llama-tied ] && echo ', "tie_embeddings": true')},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/train.bin"},
 "train": {"steps": 4, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"sample_tokens": 8, "temperature": 0, "batches": 3, "every_steps": 2}}
EOF
    run "$arch-1" 1 "$TMP/$arch.json" || continue
    ref=$(samples "$arch-1")
    if [ "$(n_val "$arch-1")" != 2 ] || [ "$(echo "$ref" | wc -l)" != 2 ]; then
        bad "$arch 1 rank: expected 2 val losses and 2 samples, got $(n_val "$arch-1") and '$ref'"; continue
    fi
    # run name: ranks-strategy[-shard_degree][-noreshard|-tp2]
    for r in 2-FULL_SHARD 4-FULL_SHARD 4-HYBRID_SHARD-2 2-FULL_SHARD-noreshard 4-FULL_SHARD-tp2; do
        IFS=- read -r np strategy x <<<"$r"
        args=(--set parallel.strategy="$strategy")
        case $x in
        2) args+=(--set parallel.shard_degree=2) ;;
        noreshard) args+=(--set parallel.reshard_after_forward=false) ;;
        tp2) args+=(--set parallel.tensor=2) ;;
        esac
        run "$arch-$r" "$np" "$TMP/$arch.json" "${args[@]}" || continue
        if [ "$(n_val "$arch-$r")" = 2 ] && $PY tests/compare_runs.py "$TMP/$arch-1" "$TMP/$arch-$r" --steps 4 --loss-rtol 1e-5; then
            ok "$arch $r: val losses (3 batches over the dp ranks) match 1 rank"
        else
            bad "$arch $r: val losses differ from 1 rank ($(n_val "$arch-$r") val_loss entries)"
        fi
        got=$(samples "$arch-$r")
        if [ "$got" = "$ref" ]; then
            ok "$arch $r: greedy samples equal 1 rank's"
        else
            bad "$arch $r: samples '$got' vs 1 rank '$ref'"
        fi
    done
done

# a blended data.val: every source's val loss is a collective evaluation of
# its own (3 batches over the dp ranks), the same on 4 ranks sharded as on 1
write_shard "$TMP/val2.bin" 96 3000 2
vb=(--set data.val="1 $TMP/train.bin 2 $TMP/val2.bin")
if run vblend-1 1 "$TMP/llama.json" "${vb[@]}" &&
   run vblend-4 4 "$TMP/llama.json" "${vb[@]}" --set parallel.strategy=FULL_SHARD --set parallel.tensor=2; then
    if cmp=$($PY - "$TMP/vblend-1/metrics.jsonl" "$TMP/vblend-4/metrics.jsonl" <<'PYEOF2'
import json, sys
a, b = ([d for d in map(json.loads, open(p)) if "val_loss" in d] for p in sys.argv[1:3])
ok = len(a) == len(b) == 2 and all(
    len(x["val_loss_sources"]) == len(y["val_loss_sources"]) == 2 and
    all(abs(u - v) <= 1e-5 * abs(u) for u, v in zip(x["val_loss_sources"] + [x["val_loss"]], y["val_loss_sources"] + [y["val_loss"]]))
    for x, y in zip(a, b))
print([d["val_loss_sources"] for d in b])
sys.exit(0 if ok else 1)
PYEOF2
    ); then ok "val blend: tp 2 x FULL_SHARD 2 val_loss and val_loss_sources match 1 rank's $cmp"
    else bad "val blend: 4 ranks' val_loss_sources differ from 1 rank's: $cmp"; fi
fi

# memory: the 8-layer Llama's working weights stay the chunk pools (the
# embeddings, the final chunk and 2 layers) through eval and sampling at
# every step; gathering the full weights for them would add the model's
# size to params_peak_bytes
run llama8-1 1 "$TMP/llama.json" --set model.n_layer=8 --set eval.every_steps=1
run llama8-4 4 "$TMP/llama.json" --set model.n_layer=8 --set eval.every_steps=1 --set parallel.strategy=FULL_SHARD
full=$(grep -o "rank 0: params_bytes [0-9]*" "$TMP/llama8-1.out" | awk '{print $NF}')
pb=$(grep -o "rank 0: params_bytes [0-9]*" "$TMP/llama8-4.out" | awk '{print $NF}')
peak=$($PY -c "import json,sys; print(max(round(d['params_peak_bytes']) for d in map(json.loads, open(sys.argv[1])) if 'params_peak_bytes' in d))" \
    "$TMP/llama8-4/metrics.jsonl" 2>/dev/null)
nv=$(n_val llama8-4)
if [ -n "$full" ] && [ -n "$pb" ] && [ "$peak" = "$pb" ] && [ "$pb" -lt "$full" ] && [ "$nv" = 4 ] \
    && [ "$(samples llama8-4)" = "$(samples llama8-1)" ] && [ "$(samples llama8-4 | wc -l)" = 4 ]; then
    ok "FULL_SHARD x4, 8 layers: params_peak_bytes $peak = params_bytes through 4 evaluations (model $full bytes)"
else
    bad "FULL_SHARD x4, 8 layers: params_peak_bytes '$peak' vs params_bytes '$pb' (model '$full' bytes), $nv val losses"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
