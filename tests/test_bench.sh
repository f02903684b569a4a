#!/bin/bash
# make bench still runs: its mixture-of-experts rows (the PyTorch MoE
# against a naive sum, the throughput row well-formed, the all-to-all bytes
# exact where every token reaches every expert), and the multi-rank table
# (three of its rows, 2 steps), which
# parses each run's metrics.jsonl and prints tokens/s and communication
# bytes per step: none at 1 rank, fewer for HYBRID_SHARD 2x2 than for
# FULL_SHARD at 4 ranks; its context-parallel rows' bytes are the
# analytic counts. (No timing is checked: the numbers are the
# benchmark's to print.)
. "$(dirname "$0")/lib.sh"
out=$(BENCH_MULTIRANK_ONLY=1 BENCH_STEPS=2 BENCH_MULTIRANK_SPECS="1:NO_SHARD:0 4:FULL_SHARD:0 4:HYBRID_SHARD:2" bench/run_bench.sh 2>&1)
rc=$?
echo "$out" | tail -4
mb() { echo "$out" | grep -E "ranks $1 $2 " | sed -E 's/.*comm +([0-9.]+) MB\/step.*/\1/'; }
full=$(mb 4 FULL_SHARD); hyb=$(mb 4 "HYBRID_SHARD 2x2"); one=$(mb 1 NO_SHARD)
if [ $rc -eq 0 ] && [ "$one" = "0.0" ] && [ -n "$full" ] && [ -n "$hyb" ] && awk -v f="$full" -v h="$hyb" 'BEGIN { exit !(h > 0 && h < f) }'; then
    ok "bench multi-rank table: 1 rank 0 MB, 4 ranks FULL_SHARD $full MB > HYBRID_SHARD 2x2 $hyb MB per step"
else bad "bench multi-rank table: rc $rc: $(echo "$out" | tail -3)"; fi

# context parallelism's rows: the bytes of the ring and of the all-gather
# per step are docs/layouts.md's, (3 cp - 2) KV and 3 (cp - 1) KV per layer
# and micro-batch, KV = B (T/cp) 2 nkv hd 4 bytes (the bench's GPT-2: 4
# layers, 4 heads of 64, B 2, T 64, 4 micro-batches a step at cp 2)
out=$(BENCH_MULTIRANK_ONLY=1 BENCH_STEPS=2 BENCH_MULTIRANK_SPECS="2:NO_SHARD:0:2 2:NO_SHARD:0:2:all_gather" bench/run_bench.sh 2>&1)
rc=$?
echo "$out" | tail -2
kv=$((2 * 32 * 2 * 4 * 64 * 4))
want_ring=$(awk -v b=$((4 * 4 * 4 * kv)) 'BEGIN { printf "%.1f", b / 1e6 }')
want_ag=$(awk -v b=$((4 * 4 * 3 * kv)) 'BEGIN { printf "%.1f", b / 1e6 }')
if [ $rc -eq 0 ] && echo "$out" | grep -E "ranks 2 NO_SHARD cp 2 " | grep -v all_gather | grep -q "cp_sendrecv $want_ring MB" &&
   echo "$out" | grep -E "ranks 2 NO_SHARD cp 2 all_gather" | grep -q "cp_sendrecv $want_ag MB"; then
    ok "bench multi-rank table: cp 2 rows, ring $want_ring MB and all_gather $want_ag MB a step, the analytic counts"
else bad "bench cp rows: rc $rc, want ring $want_ring all_gather $want_ag MB: $(echo "$out" | tail -2)"; fi

# bench/torch_train.py's mixture of experts (the MoE row's baseline) against
# every token through every expert, weighted by its renormalised top-2
# router probability (0 for the others), and the load-balancing loss
# E sum_e f_e P_e from its own counts, on a router sharp enough to route
# unevenly; its active matrix parameters by hand (router + 2 of 4 experts)
t=$($PY - <<'PYEOF' 2>&1
import sys, torch
sys.path.insert(0, "bench")
import torch_train as tt
E, K, C, Fe, N = 4, 2, 16, 8, 24
m = tt.MoELlama(1, C, 2, 1, 32, E, K, Fe, 0.01, 16, seed=3)
p = m.params
with torch.no_grad():
    p["l0.router"].mul_(40)
a = torch.randn(N, C, generator=torch.Generator().manual_seed(5))
y, aux = m.moe(0, a)
probs = torch.softmax(a @ p["l0.router"].t(), dim=-1)
ref, count = torch.zeros(N, C), [0] * E
for n in range(N):
    top = sorted(range(E), key=lambda e: -float(probs[n, e]))[:K]
    s = sum(float(probs[n, e]) for e in top)
    for e in top:
        count[e] += 1
        gu = p[f"l0.e{e}.gate_up"]
        h = torch.nn.functional.silu(a[n] @ gu[:Fe].t()) * (a[n] @ gu[Fe:].t())
        ref[n] += float(probs[n, e]) / s * (h @ p[f"l0.e{e}.down"].t())
aux_ref = E * sum(count[e] / (N * K) * float(probs[:, e].mean()) for e in range(E))
active = (16 + 8 + 8 + 16) * C + E * C + K * 3 * Fe * C + 32 * C  # q, k, v, o; router; 2 experts; head
err = float((y - ref).abs().max() / ref.abs().max())  # relative to the largest output
good = err < 1e-5 and abs(float(aux) - aux_ref) < 1e-6 and max(count) > min(count) and m.active_matmul_params() == active
print(f"{'good' if good else 'wrong'}: max relative error {err:.1e}, aux {float(aux):.6f} (by hand {aux_ref:.6f}), "
      f"expert counts {count}, active {m.active_matmul_params():.0f} (by hand {active})")
PYEOF
)
if grep -q "^good: " <<<"$t"; then
    ok "torch_train.py's MoE layer is the naive every-expert sum: ${t#good: }"
else bad "torch_train.py's MoE layer against the naive sum: $t"; fi

# make bench's MoE rows (BENCH_MOE_ONLY, 2 steps, 1 thread so that neither
# side waits on a busy core's second thread): the throughput row's active
# parameters and FLOPs a token as counted here by hand, its GFLOP/s its
# tokens/s times them and its speed-up their ratio; the all-to-all rows at
# ep 2 and 4 with top-4 of 4 experts, where every token reaches every
# expert, equal to the uniform formula exactly
out=$(BENCH_MOE_ONLY=1 BENCH_STEPS=2 BENCH_THREADS=1 BENCH_MOE_EP_EXPERTS=4 BENCH_MOE_EP_TOPK=4 bench/run_bench.sh 2>&1)
rc=$?
echo "$out" | grep -E "^mixtral|ranks"
# 4 layers: q, o 384^2, k, v 128 x 384, router 8 x 384, 2 experts 3 x 1024 x 384; head 8192 x 384
active=$((4 * (2 * 384 * 384 + 2 * 128 * 384 + 8 * 384 + 2 * 3 * 1024 * 384) + 8192 * 384))
fpt=$((6 * active + 12 * 4 * 384 * 128))
want_act=$(awk -v a=$active 'BEGIN { printf "%.1f", a / 1e6 }'); want_f=$(awk -v f=$fpt 'BEGIN { printf "%.1f", f / 1e6 }')
row=$(echo "$out" | grep "^mixtral_small: ")
re="^mixtral_small: 8 experts top-2, [0-9.]+M params, $want_act""M active in matrix products, $want_f MFLOP/token \| llmtrain ([0-9]+) ms/step, ([0-9]+) tokens/s, ([0-9.]+) GFLOP/s, ([0-9.]+)% of sgemm peak ([0-9.]+) GFLOP/s \| PyTorch [^ ]+ ([0-9]+) ms/step, ([0-9]+) tokens/s, ([0-9.]+) GFLOP/s, ([0-9.]+)% \| speed-up ([0-9.]+)x$"
if [ $rc -eq 0 ] && [[ $row =~ $re ]]; then
    r=("${BASH_REMATCH[@]}")
    if awk -v f=$fpt -v lt="${r[2]}" -v lg="${r[3]}" -v ls="${r[4]}" -v pk="${r[5]}" -v tt="${r[7]}" -v tg="${r[8]}" -v ts="${r[9]}" -v sp="${r[10]}" '
        function near(a, b, tol) { return a >= b * (1 - tol) - 0.05 && a <= b * (1 + tol) + 0.05 }
        BEGIN { exit !(near(lg, f * lt / 1e9, 0.01) && near(tg, f * tt / 1e9, 0.01) && near(ls, 100 * lg / pk, 0.01) &&
                       near(ts, 100 * tg / pk, 0.01) && near(sp, lt / tt, 0.01) && lt > 0 && tt > 0) }'; then
        ok "bench MoE row: $want_act M active, $want_f MFLOP/token; GFLOP/s, % of peak and speed-up follow from tokens/s"
    else bad "bench MoE row's numbers do not follow from its tokens/s: $row"; fi
else bad "bench MoE row: rc $rc: $(echo "$out" | tail -4)"; fi
for ep in 2 4; do
    mbs=$((8 / (2 * ep)))
    want=$(awk -v b=$((4 * 2 * mbs * 128 * 4 * (ep - 1) * 128 * 4 / ep)) 'BEGIN { printf "%.4f", b / 1e6 }')
    if echo "$out" | grep -Eq "^  ranks $ep ep $ep \| a2a $want MB/step measured \(rank 0, steps 2-3\) \| $want MB uniform routing = .* ratio 1\.000 \(every token reaches every expert: exact\)$"; then
        ok "bench MoE all-to-all row, ep $ep, top-4 of 4: $want MB a step, the formula's exactly"
    else bad "bench MoE all-to-all row ep $ep: want $want MB: $(echo "$out" | grep "ranks $ep ep")"; fi
done

# bench/ncu_table.py (BENCH_PROFILE=1 make bench-gpu) on a hand-made ncu CSV:
# step 2 is the launches after the first run of AdamW launches up to the end
# of the second (here 2 + 3 + 4 + 5 + 1 + 1 ms = 16 ms); categories by name
cat >"$TMP/ncu.csv" <<'CSV'
==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","llmtrain","h","embed_fwd_k(float *)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,000,000"
"1","1","llmtrain","h","sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","9,000,000"
"2","1","llmtrain","h","adamw_multi_k(float *)","1","7","(256, 1, 1)","(99, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","7,000,000"
"3","1","llmtrain","h","sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","2,000,000"
"4","1","llmtrain","h","void flash_fwd_k<64>(float *)","1","7","(128, 1, 1)","(16, 12, 16)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","3,000,000"
"5","1","llmtrain","h","ce_fwd_k(float *)","1","7","(512, 1, 1)","(16384, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","4,000,000"
"6","1","llmtrain","h","sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","5,000,000"
"7","1","llmtrain","h","adamw_multi_k(float *)","1","7","(256, 1, 1)","(99, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,000,000"
"8","1","llmtrain","h","adamw_k(float *)","1","7","(256, 1, 1)","(99, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,000,000"
"9","1","llmtrain","h","embed_fwd_k(float *)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","50,000,000"
CSV
t=$($PY bench/ncu_table.py "$TMP/ncu.csv" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "^kernel time, step 2 .*: 16.00 ms in 6 launches$" <<<"$t" &&
   grep -Eq "^  GEMM \(cuBLASLt\) +7.00 ms  43.8%$" <<<"$t" && grep -Eq "^  attention \(softmax / fused\) +3.00 ms" <<<"$t" &&
   grep -Eq "^  cross-entropy +4.00 ms" <<<"$t" && grep -Eq "^  AdamW +2.00 ms" <<<"$t" &&
   grep -Eq "^ +7.00  43.8% +2 +3500.0  sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n \(132, 1, 1\) \(384, 1, 1\)$" <<<"$t"; then
    ok "ncu_table: step 2 of a hand-made ncu CSV is 16.00 ms in 6 launches, GEMM 7.00 ms (2 calls), by category and kernel"
else bad "ncu_table on the hand-made CSV: rc $rc: $t"; fi
grep -v adamw "$TMP/ncu.csv" >"$TMP/ncu1.csv"
t=$($PY bench/ncu_table.py "$TMP/ncu1.csv" 2>&1)
if grep -q "^kernel time, every launch (fewer than two AdamW updates in the file): 74.00 ms in 7 launches$" <<<"$t"; then
    ok "ncu_table: without two AdamW updates it sums every launch (74.00 ms in 7)"
else bad "ncu_table without AdamW: $t"; fi
echo "not a CSV" >"$TMP/ncu2.csv"
t=$($PY bench/ncu_table.py "$TMP/ncu2.csv" 2>&1); rc=$?
if [ $rc -ne 0 ] && [ "$(wc -l <<<"$t")" -eq 1 ] && grep -q "^ncu_table: .*ncu2.csv: no gpu__time_duration.sum rows" <<<"$t"; then
    ok "ncu_table: a file without ncu rows is exit $rc and one line"
else bad "ncu_table on a non-CSV: rc $rc: $t"; fi
# BENCH_PROFILE=1 without ncu: one line, exit 1, before any run
mkdir -p "$TMP/nobin"; for c in bash dirname mktemp rm python3 cat; do ln -sf "$(command -v $c)" "$TMP/nobin/$c"; done
t=$(PATH="$TMP/nobin" BENCH_PROFILE=1 bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = "bench-gpu: FAIL: BENCH_PROFILE=1 needs Nsight Compute's ncu on PATH" ]; then
    ok "BENCH_PROFILE=1 without ncu: exit 1, one line"
else bad "BENCH_PROFILE=1 without ncu: rc $rc: $t"; fi

# BENCH_PROFILE must name a mode: one line, exit 1, before any run
t=$(BENCH_PROFILE=yes bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = "bench-gpu: FAIL: BENCH_PROFILE=yes: expected 0, 1 (Nsight Compute) or kernels (log.profile_steps)" ]; then
    ok "BENCH_PROFILE=yes: exit 1, one line naming the modes"
else bad "BENCH_PROFILE=yes: rc $rc: $t"; fi
t=$(BENCH_SMOKE=yes bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = "bench-gpu: FAIL: BENCH_SMOKE=yes: expected 0 or 1" ]; then
    ok "BENCH_SMOKE=yes: exit 1, one line"
else bad "BENCH_SMOKE=yes: rc $rc: $t"; fi
t=$(BENCH_FP8_RECIPES="tensorwise delayed" bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = 'bench-gpu: FAIL: BENCH_FP8_RECIPES: "delayed": expected tensorwise, blockwise or rowwise' ]; then
    ok "BENCH_FP8_RECIPES naming no recipe: exit 1, one line"
else bad "BENCH_FP8_RECIPES=\"tensorwise delayed\": rc $rc: $t"; fi
t=$(BENCH_BASELINE_BIN=/nonexistent/llmtrain bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = "bench-gpu: FAIL: BENCH_BASELINE_BIN=/nonexistent/llmtrain: not an executable file" ]; then
    ok "BENCH_BASELINE_BIN naming no binary: exit 1, one line"
else bad "BENCH_BASELINE_BIN=/nonexistent/llmtrain: rc $rc: $t"; fi
t=$(BENCH_BASELINE_BIN=./llmtrain BENCH_PROFILE=kernels bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = "bench-gpu: FAIL: BENCH_BASELINE_BIN with BENCH_PROFILE=kernels: a profiled step's time is not a timing to compare" ]; then
    ok "BENCH_BASELINE_BIN under BENCH_PROFILE: exit 1, one line"
else bad "BENCH_BASELINE_BIN with BENCH_PROFILE=kernels: rc $rc: $t"; fi
t=$(BENCH_CP=yes bench/run_bench_gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$t" = "bench-gpu: FAIL: BENCH_CP=yes: expected 0, 1 or only" ]; then
    ok "BENCH_CP=yes: exit 1, one line"
else bad "BENCH_CP=yes: rc $rc: $t"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
