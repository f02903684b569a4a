#!/bin/bash
# Activation offload (train.activation_offload): every layer's kept
# activations go to host memory after its forward and come back before its
# backward through 3 device slots (layer l in slot l % 3). With 5 layers the
# slots are reused, so a layer that read another layer's activations would
# change the gradients: losses, gradient norms and exported weights must be
# bit-identical to the same run without offload, under each checkpointing
# mode (selective also with train.recompute_modules norm,mlp_act) on 1
# rank, none and norm,mlp_act on tp 2, none on FULL_SHARD 2, for GPT-2
# and Llama (GQA) (a Qwen3-shaped Llama, head_dim 12 and QK-norm: none
# and norm,mlp_act on 1 rank, none on tp 2), with gradient accumulation
# and evaluation in between.
# The device activations fall and the host copy is n_layer x one layer's
# kept buffers.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
write_shard "$TMP/val.bin" 96 4000 2
for arch in gpt2 llama qwen3; do
    layouts=("1:none selective full norm_act" "2 --set parallel.tensor=2:none norm_act" "2 --set parallel.strategy=FULL_SHARD:none")
    case $arch in
    gpt2) shape='"arch": "gpt2", "n_layer": 5, "n_embd": 32, "n_head": 4' ;;
    llama) shape='"arch": "llama", "n_layer": 5, "n_embd": 32, "n_head": 4, "n_kv_head": 2' ;;
    qwen3) # the Llama with heads of 12 (not 32 / 4) and QK-norm: its normalized q|k buffer travels too
        shape='"arch": "llama", "n_layer": 5, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "head_dim": 12, "qk_norm": true'
        layouts=("1:none norm_act" "2 --set parallel.tensor=2:none") ;;
    esac
    cat >"$TMP/$arch.json" <<EOF2
{"model": {$shape, "vocab_size": 96, "max_seq_len": 32},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/val.bin"},
 "train": {"steps": 6, "seq_len": 32, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "eval": {"every_steps": 3, "batches": 2, "sample_tokens": 0}}
EOF2
    # layout:modes. Every mode on 1 rank; tp 2 shards the kept buffers
    # (everything kept, and the norms and MLP activation recomputed);
    # FULL_SHARD keeps 1 rank's buffers and adds the gathers' ordering
    for layout in "${layouts[@]}"; do
        read -r np rest <<<"${layout%%:*}"
        cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
        for mode in ${layout#*:}; do
            tag=$arch-np$np-$(echo "$rest" | tr -dc 'a-zA-Z0-9_')-$mode
            ck=(--set train.activation_checkpointing=$mode) # norm_act: the norms and the MLP activation recomputed, not offloaded
            [ $mode = norm_act ] && ck=(--set train.activation_checkpointing=selective --set train.recompute_modules=norm,mlp_act)
            for off in false true; do
                $cmd "$TMP/$arch.json" $rest "${ck[@]}" --set train.activation_offload=$off \
                    --set log.dir="$TMP/$tag-$off" >"$TMP/$tag-$off.out" 2>&1 || echo "  $tag offload $off exited non-zero: $(tail -2 "$TMP/$tag-$off.out")"
                $BIN export "$TMP/$tag-$off/checkpoints" "$TMP/$tag-$off/hf" >/dev/null 2>&1
            done
            if $PY tests/compare_runs.py "$TMP/$tag-false" "$TMP/$tag-true" --steps 6 --exact; then
                ok "$arch np $np ${rest:-} $mode: offload bit-identical to no offload (losses, norms, val loss, weights)"
            else
                bad "$arch np $np ${rest:-} $mode: offload differs"
            fi
            acts() { grep -o "rank 0: .*activations_bytes [0-9]*" "$TMP/$tag-$1.out" | awk '{print $NF}'; }
            host=$(grep -o "rank 0: .*offload_host_bytes [0-9]*" "$TMP/$tag-true.out" | awk '{print $NF}')
            a0=$(acts false); a1=$(acts true)
            # the device keeps 3 of 5 layers' kept buffers: saved = 2/5 of the host copy
            if [ -n "$a0" ] && [ -n "$a1" ] && [ -n "$host" ] && [ $((a0 - a1)) -eq $((host * 2 / 5)) ] && \
               ! grep -q offload_host_bytes "$TMP/$tag-false.out"; then
                ok "$arch np $np ${rest:-} $mode: activations_bytes $a0 -> $a1, offload_host_bytes $host (2 of 5 layers' worth saved)"
            else
                bad "$arch np $np ${rest:-} $mode: activations_bytes '$a0' -> '$a1', host '$host'"
            fi
        done
    done
done
# 3 layers or fewer: nothing to offload, the layout is the plain one
$BIN check "$TMP/llama.json" --set model.n_layer=3 --set train.activation_offload=true >"$TMP/c3.out" 2>&1
$BIN check "$TMP/llama.json" --set model.n_layer=3 >"$TMP/c3n.out" 2>&1
if ! grep -q offload_host_bytes "$TMP/c3.out" && [ "$(grep -o 'activations_bytes [0-9]*' "$TMP/c3.out")" = "$(grep -o 'activations_bytes [0-9]*' "$TMP/c3n.out")" ]; then
    ok "3 layers: offload is a no-op (same activations, no host copy)"
else bad "3 layers with offload: $(cat "$TMP/c3.out" | tail -2)"; fi
$BIN "$TMP/llama.json" --set train.activation_offload=yes >"$TMP/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "train.activation_offload" "$TMP/bad.out" && [ "$(wc -l <"$TMP/bad.out")" -eq 1 ]; then
    ok "train.activation_offload \"yes\": one line, exit 2"
else bad "bad offload value: rc $rc $(cat "$TMP/bad.out")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
