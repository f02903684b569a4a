#!/bin/bash
# log.profile_steps: the kernel table timed call by call over a window of
# steps. Checked against what the job's shape says a step must do, not
# against the profiler's own code: the calls of each kernel-table entry a
# step (derived here from the model's structure: layers, micro-batches,
# checkpointing mode, what selective checkpointing recomputes), the matrix products' FLOPs (6 x the product weights x
# tokens, plus the recomputed forward under full checkpointing) and
# attention's (causal: 2 products forward, 5 backward, over T(T+1)/2 pairs);
# the least traffic of the memory-bound entries (the final norm, AdamW over
# every parameter, the cross-entropy's logits); the timed calls inside the
# steps' wall time; the window (the run's second
# step on, also after a resume, there with a window of every step
# (log.profile_steps 2^31 - 1); a one-step run times its step); the table on
# stdout once per job, profile.json beside metrics.jsonl, every figure the
# table prints recomputed from profile.json (tests/check_profile_table.py:
# the rates, the shares of log.peak_gflops and log.peak_gbs, the time at the
# peaks); and a profiled run's
# losses, norms and weights bit-identical to the same run unprofiled (1 rank
# and FULL_SHARD on 2).
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
tiny_job gpt2 "$TMP/gpt2.json" "$TMP/train.bin"
tiny_job llama "$TMP/llama.json" "$TMP/train.bin"

# check_json PROFILE.json ARCH ACCUM CKPT HEADCHUNKS FIRST STEPS: calls, FLOPs and times
check_json() {
    $PY - "$@" <<'PYEOF'
import json, sys
path, arch, accum, ckpt, H, first, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
p = json.load(open(path))
# the tiny job of tests/lib.sh: 2 layers, 32 wide, 4 heads (Llama 2 kv heads, ffn 256 by Llama's rule), vocab 96, 2 x 16 tokens
L, C, nh, V, B, T = 2, 32, 4, 96, 2, 16
hd = C // nh
llama = arch == "llama"
nkv, F = (2, 256) if llama else (nh, 4 * C)
norm = "rmsnorm" if llama else "layernorm"
# ckpt: none, full, selective (the attention recomputed) or sel:MODS (train.recompute_modules)
mods = set(ckpt[4:].split(",")) if ckpt.startswith("sel:") else {"attention"} if ckpt == "selective" else set()
act = "swiglu_forward" if llama else "gelu_forward"
layer_fwd = {f"{norm}_forward": 2, "matmul_forward_a": 1 + llama, "attention_forward": 1, "matmul_forward_res": 2}
if llama: layer_fwd.update({"rope_forward": 1, "swiglu_forward": 1})
elif "mlp_act" in mods: layer_fwd.update({"matmul_forward_a": 2, "gelu_forward": 1})  # the GELU as recomputed, not the epilogue
else: layer_fwd["matmul_gelu_forward"] = 1
layer_bwd = {("matmul_swiglu_backward" if llama else "matmul_gelu_backward"): 1, "matmul_backward_a": 2,
             f"{norm}_backward": 2, "matmul_backward_dinp_a": 1, "attention_backward": 1}
if llama: layer_bwd["rope_backward"] = 1
micro = {"from_host": 2, "embed_forward": 1, f"{norm}_forward": 1, "matmul_forward_a": H, "crossentropy_fused": H,
         "matmul_backward_a": H, "sum": 1, "zero": 1, f"{norm}_backward": 1, "embed_backward": 1}
def add(d, e, n):
    for k, v in e.items(): d[k] = d.get(k, 0) + n * v
add(micro, layer_fwd, L)
add(micro, layer_bwd, L)
# the backward recomputes every layer but the last (whose forward's values
# are still in the buffers the layers share)
if ckpt == "full": add(micro, layer_fwd, L - 1)
recompute = {"attention": {"attention_forward": 1}, "norm": {f"{norm}_forward": 2}, "mlp_act": {act: 1}}
for mod in mods: add(micro, recompute[mod], L - 1)
# a step: the gradients declared fresh (grads_fresh, in place of a zeroing
# pass) and settled chunk by chunk (L + 2 chunks) after the last micro-batch's
# backward of each, their norm's sums of squares queued then, chunk by chunk,
# and taken once after the backward (no pass over every gradient), AdamW
# (which sums the updated weights' squares for log.param_norm: no sumsq)
want = {"grads_fresh": 1, "grads_settle": L + 2, "sumsq_queue": L + 2, "sumsq_take": 1, "adamw_multi": 1}
add(want, micro, accum)
got = {e["name"]: e["calls"] for e in p["entries"]}
errs = []
for k in sorted(set(want) | set(got)):
    if got.get(k, 0) != want.get(k, 0) * steps:
        errs.append(f"{k}: {got.get(k, 0)} calls, expected {want.get(k, 0) * steps}")
layer = (C * (nh + 2 * nkv) * hd + nh * hd * C + C * (2 * F if llama else F) + F * C)
tokens = accum * B * T
mm_want = steps * tokens * (6 * (L * layer + V * C) + (2 * (L - 1) * layer if ckpt == "full" else 0))
att = B * nh * hd * T * (T + 1) * L * accum * steps
att_again = ckpt == "full" or "attention" in mods  # the forward of L - 1 layers again
att_want = {"attention_forward": att // L * (2 * L + (2 * (L - 1) if att_again else 0)), "attention_backward": 5 * att}
fl = {e["name"]: e["flops"] for e in p["entries"]}
mm_got = sum(v for k, v in fl.items() if k.startswith("matmul_"))
if mm_got != mm_want: errs.append(f"matrix-product FLOPs {mm_got:.0f}, expected {mm_want}")
for k, v in att_want.items():
    if fl.get(k) != v: errs.append(f"{k} FLOPs {fl.get(k)}, expected {v}")
others = [k for k, v in fl.items() if v and not (k.startswith("matmul_") or k in att_want)]
if others: errs.append(f"FLOPs counted for {others}")
# the least traffic (fp32 on the CPU): the final norm's forward per call, AdamW's 28 bytes a
# parameter a step, the cross-entropy's logits read and written once
N = B * T
params = (2 * V * C + L * (2 * C + layer) + C) if llama else (V * C + T * C + L * (4 * C + layer + 9 * C) + 2 * C)
by = {e["name"]: e["bytes"] for e in p["entries"]}
by_want = {f"{norm}_forward": got.get(f"{norm}_forward", 0) * (8 * N * C + (4 * N + 4 * C if llama else 8 * N + 8 * C)),
           "adamw_multi": 28 * params * steps, "crossentropy_fused": accum * steps * (8 * N * V + 8 * N)}
for k, v in by_want.items():
    if by.get(k) != v: errs.append(f"{k} bytes {by.get(k)}, expected {v}")
if any(by[k] for k in by if k.startswith("matmul_") or k.startswith("attention_")): errs.append("bytes counted for a product")
ms = sum(e["ms"] for e in p["entries"])
if not (p["first_step"] == first and p["steps"] == steps): errs.append(f"window {p['first_step']}+{p['steps']}, expected {first}+{steps}")
if not all(e["ms"] >= 0 for e in p["entries"]) or not (0.2 * p["wall_ms"] <= ms <= p["wall_ms"] * (1 + 1e-9)):
    errs.append(f"timed calls {ms:.3f} ms against the steps' {p['wall_ms']:.3f} ms")
print("; ".join(errs) if errs else f"{sum(got.values())} calls in {len(got)} entries, {mm_got:.0f} + {att_want['attention_forward'] + 5 * att} FLOPs, AdamW {by_want['adamw_multi']:.0f} bytes, {ms:.2f} of {p['wall_ms']:.2f} ms")
sys.exit(1 if errs else 0)
PYEOF
}

# 1 rank: GPT-2 (steps 2-4 of 5), Llama under each checkpointing mode (a
# window past the run's end: steps 2-3 of 3, printed at the end)
run() { # NAME JOB ARGS...: llmtrain into $TMP/NAME
    local name=$1 job=$2; shift 2
    $BIN "$job" --set log.dir="$TMP/$name" "$@" >"$TMP/$name.out" 2>&1 || echo "  $name exited non-zero: $(tail -2 "$TMP/$name.out")"
}
run g0 "$TMP/gpt2.json" --set train.steps=5
run g1 "$TMP/gpt2.json" --set train.steps=5 --set log.profile_steps=3
if t=$(check_json "$TMP/g1/profile.json" gpt2 4 none 1 2 3); then ok "gpt2 steps 2-4: $t"; else bad "gpt2 profile.json: $t"; fi
# the table: its header names the window, a row per entry, where the JSON went; nothing from a run without it
rows=$(grep -cE '^profile: +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+ ' "$TMP/g1.out")
entries=$($PY -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["entries"]))' "$TMP/g1/profile.json")
if grep -q "^profile: steps 2-4 (3 steps): [0-9.]* ms a step in 167 calls of the kernel table (timed by the host clock)" "$TMP/g1.out" &&
   grep -Eq "^profile: +[0-9.]+ +[0-9.]+% +20\.0 +[0-9.]+ +[0-9.e-]+ +[0-9.]+% +matmul_backward_a$" "$TMP/g1.out" &&
   grep -Eq "^profile: +[0-9.]+ +[0-9.]+% +1\.0 +[0-9.]+ +[0-9.e-]+  adamw_multi$" "$TMP/g1.out" &&
   [ "$rows" = "$entries" ] && grep -qx "profile: $TMP/g1/profile.json" "$TMP/g1.out" &&
   [ "$(grep -n '^profile: steps' "$TMP/g1.out" | cut -d: -f1)" -gt "$(grep -n '^step     4/5' "$TMP/g1.out" | cut -d: -f1)" ] &&
   ! grep -q "^profile" "$TMP/g0.out" && [ ! -e "$TMP/g0/profile.json" ]; then
    ok "gpt2: the table after step 4 (167 calls a step, $rows rows, matmul_backward_a 20 a step at its rate and share of the peak, adamw_multi's GB/s)"
else bad "gpt2 table: $(grep '^profile' "$TMP/g1.out" | head -5)"; fi
# every printed figure against profile.json: with no bandwidth peak on the
# CPU the GB/s rows have no share and there is no line of the peaks' time;
# with log.peak_gbs (and log.peak_gflops) both, and the JSON records it
run gb "$TMP/gpt2.json" --set train.steps=3 --set log.profile_steps=2 --set log.peak_gbs=5 --set log.peak_gflops=50
if t0=$($PY tests/check_profile_table.py "$TMP/g1.out" "$TMP/g1/profile.json") &&
   t1=$($PY tests/check_profile_table.py "$TMP/gb.out" "$TMP/gb/profile.json") &&
   ! grep -q "^profile: at the peaks" "$TMP/g1.out" && grep -q "^profile: at the peaks" "$TMP/gb.out" &&
   $PY -c 'import json, sys; sys.exit(not (json.load(open(sys.argv[1]))["peak_gbs"] == 0 and json.load(open(sys.argv[2]))["peak_gbs"] == 5))' \
       "$TMP/g1/profile.json" "$TMP/gb/profile.json"; then
    ok "gpt2: the table's figures as profile.json's ($t0); with log.peak_gbs=5: $t1"
else bad "the table against profile.json: ${t0:-} / ${t1:-} $(grep -E '^profile: (memory|at the)' "$TMP/gb.out")"; fi
# under fp8 the layers' linears are timed in their own _fp8 entries
# (tests/check_profile_fp8.py: calls and FLOPs split from the plain run's,
# the LM head's left out) at the FP8 peak, which on the CPU (fake-quantized
# fp32 products) is the products' peak; the table's figures as profile.json's
for a in gpt2 llama; do
    run ${a}p "$TMP/$a.json" --set train.steps=3 --set log.profile_steps=2 --set log.peak_gbs=5 --set log.peak_gflops=50
    run ${a}8 "$TMP/$a.json" --set train.steps=3 --set log.profile_steps=2 --set log.peak_gbs=5 --set log.peak_gflops=50 \
        --set train.compute_dtype=fp8
    if t0=$($PY tests/check_profile_fp8.py "$TMP/${a}p/profile.json" "$TMP/${a}8/profile.json" 1) &&
       t1=$($PY tests/check_profile_table.py "$TMP/${a}8.out" "$TMP/${a}8/profile.json") &&
       grep -q "^profile: matrix products and attention: .* of the peaks: 0.05 TFLOP/s, FP8 products 0.05)$" "$TMP/${a}8.out"; then
        ok "$a under fp8: $t0; $t1"
    else bad "$a under fp8: ${t0:-} / ${t1:-} $(grep -E '^profile: matrix' "$TMP/${a}8.out")"; fi
done
$BIN export "$TMP/g0/checkpoints" "$TMP/g0/hf" >/dev/null 2>&1; $BIN export "$TMP/g1/checkpoints" "$TMP/g1/hf" >/dev/null 2>&1
if $PY tests/compare_runs.py "$TMP/g0" "$TMP/g1" --steps 5 --exact >/dev/null; then
    ok "gpt2: profiled run bit-identical to the unprofiled one (losses, norms, weights)"
else bad "gpt2: the profiled run differs"; fi

for mode in none selective full sel:norm,mlp_act sel:attention,norm,mlp_act; do
    ck=(--set train.activation_checkpointing=$mode)
    [ "${mode#sel:}" != "$mode" ] && ck=(--set train.activation_checkpointing=selective --set train.recompute_modules=${mode#sel:})
    run l-$mode "$TMP/llama.json" --set train.steps=3 --set log.profile_steps=10 "${ck[@]}"
    if t=$(check_json "$TMP/l-$mode/profile.json" llama 4 $mode 1 2 2) && grep -q "^profile: steps 2-3 (2 steps)" "$TMP/l-$mode.out"; then
        ok "llama $mode, window past the end (steps 2-3 of 3): $t"
    else bad "llama $mode: $t $(grep '^profile: steps' "$TMP/l-$mode.out")"; fi
done
# GPT-2 recomputing its norms and GELU: the forward runs the GELU as its own kernel
run g-rc "$TMP/gpt2.json" --set train.steps=3 --set log.profile_steps=2 --set train.activation_checkpointing=selective \
    --set train.recompute_modules=norm,mlp_act
if t=$(check_json "$TMP/g-rc/profile.json" gpt2 4 sel:norm,mlp_act 1 2 2); then ok "gpt2 recomputing norm and mlp_act: $t"
else bad "gpt2 sel:norm,mlp_act: $t"; fi
# the LM head in chunks: 32-row micro-batches in 3 chunks of at most 12 rows
run l-chunk "$TMP/llama.json" --set train.steps=3 --set log.profile_steps=2 --set train.lm_head_chunk=12
if t=$(check_json "$TMP/l-chunk/profile.json" llama 4 none 3 2 2); then ok "llama, lm head in 3 chunks: $t"; else bad "llama chunked head: $t"; fi

# more calls in a step than the backend has timer slots (8192, 2 a call):
# 300 micro-batches, about 11,700 calls, read back in several batches
run many "$TMP/gpt2.json" --set train.steps=2 --set train.global_batch=600 --set log.profile_steps=1
if t=$(check_json "$TMP/many/profile.json" gpt2 300 none 1 2 1); then ok "300 micro-batches a step (slots read back mid-step): $t"; else bad "300 micro-batches: $t"; fi

# after a resume the window starts at the resumed run's second step; a
# one-step run times its only step
run r "$TMP/gpt2.json" --set train.steps=3
run r "$TMP/gpt2.json" --set train.steps=6 --set optim.override_schedule=true --set log.profile_steps=1
if t=$(check_json "$TMP/r/profile.json" gpt2 4 none 1 5 1) && grep -q "^resume" "$TMP/r.out" && grep -q "^profile: step 5 (1 step)" "$TMP/r.out"; then
    ok "resumed at step 3: step 5 timed: $t"
else bad "resumed window: $t $(grep '^profile: step' "$TMP/r.out")"; fi
# a window of every step (log.profile_steps at its maximum) after a resume:
# the resumed step plus the window's length is past INT_MAX
run r "$TMP/gpt2.json" --set train.steps=9 --set optim.override_schedule=true --set log.profile_steps=2147483647
if t=$(check_json "$TMP/r/profile.json" gpt2 4 none 1 8 2) && grep -q "^resume: .* at step 6" "$TMP/r.out" &&
   grep -q "^profile: steps 8-9 (2 steps)" "$TMP/r.out"; then
    ok "resumed at step 6 with log.profile_steps 2147483647: steps 8-9 timed: $t"
else bad "resumed window of every step: $t $(grep -E '^(resume|profile): ' "$TMP/r.out" | head -3)"; fi
run one "$TMP/gpt2.json" --set train.steps=1 --set optim.warmup_steps=0 --set log.profile_steps=4
if t=$(check_json "$TMP/one/profile.json" gpt2 4 none 1 1 1); then ok "one-step run: step 1 timed: $t"; else bad "one-step run: $t"; fi

# 2 ranks, FULL_SHARD: one table for the job, the same bits as unprofiled
for p in 0 2; do
    $MPIRUN 2 $BIN "$TMP/gpt2.json" --set train.steps=4 --set parallel.strategy=FULL_SHARD --set log.profile_steps=$p \
        --set log.dir="$TMP/fs$p" >"$TMP/fs$p.out" 2>&1 || echo "  FULL_SHARD profile $p exited non-zero: $(tail -2 "$TMP/fs$p.out")"
done
# each rank's timed time a step: rank 0's is its table's, the line gives min, mean and max
rank_line=$($PY - "$TMP/fs2/profile.json" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
r = p.get("rank_ms", [])
own = sum(e["ms"] for e in p["entries"]) / p["steps"]
ok = len(r) == 2 and all(x > 0 for x in r) and abs(r[0] - own) <= 1e-9 * own
lo, hi = min(range(2), key=lambda i: r[i]), max(range(2), key=lambda i: r[i])
print(f"profile: timed ms a step over the 2 ranks: min {r[lo]:.2f} (rank {lo}), mean {sum(r) / 2:.2f}, max {r[hi]:.2f} (rank {hi})" if ok else "bad rank_ms")
PYEOF
)
if [ "$(grep -c '^profile: steps 2-3 (2 steps)' "$TMP/fs2.out")" = 1 ] && [ -s "$TMP/fs2/profile.json" ] &&
   grep -q "^$rank_line" "$TMP/fs2.out" && ! grep -q "over the .* ranks" "$TMP/g1.out" &&
   $PY tests/compare_runs.py "$TMP/fs0" "$TMP/fs2" --steps 4 --exact >/dev/null; then
    ok "FULL_SHARD 2 ranks: one table, each rank's timed ms a step (rank 0's its own), losses and norms bit-identical to unprofiled"
else bad "FULL_SHARD profile: $(grep -c '^profile: steps' "$TMP/fs2.out") tables, '$rank_line' vs $(grep 'over the' "$TMP/fs2.out")"; fi

for kv in log.profile_steps=-1 log.peak_gbs=-1; do
    $BIN "$TMP/gpt2.json" --set $kv >"$TMP/bad.out" 2>&1; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/bad.out")" -eq 1 ] && grep -q "${kv%=*}" "$TMP/bad.out"; then
        ok "$kv: one line, exit 2"
    else bad "$kv: rc $rc $(cat "$TMP/bad.out")"; fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
