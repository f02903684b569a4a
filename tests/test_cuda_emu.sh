#!/bin/bash
# The CUDA backend's own source on the host emulation of CUDA (tests/cuda_emu:
# kernels.cu rewritten to C++ by cu2cpp.py, a block's threads as fibers,
# cuBLASLt / CUB / NCCL stand-ins; see tests/cuda_emu/emu.h), so that the
# checks of make test-gpu run on a machine without a GPU:
#   1. the emulator's own strictness (tests/cuda_emu/selftest: a divergent
#      barrier, too much dynamic shared memory, a misaligned cuBLASLt
#      operand, lane-dependent wmma operands each fail as on the hardware);
#   2. tests/gpu_tests.sh with the emulated binaries: every CUDA kernel
#      against the CPU backend in tf32, bf16 and fp32 GEMM modes (attention
#      shapes up to T = 256), whole GPT-2 / Llama runs on train.device=cuda
#      against the CPU (GEMM and fused attention, offload, selective
#      checkpointing), and with 4 emulated devices the 2-rank NCCL runs
#      (NO_SHARD, FULL_SHARD, tp 2 with and without sequence parallelism)
#      and the 4-rank HYBRID_SHARD run against MPI on the CPU, tp 2's
#      sequence parallelism in bf16 against tp 2 alone, and the hung-rank
#      watchdog. 5 steps per run instead of 20
#      (the emulator runs a step of the small jobs in about 0.75 s);
#   3. what the GPU suite cannot stage: device memory running out (an
#      emulated 34 MiB device) is exit 3 and one line naming the allocation,
#      and 2 ranks on a node of 1 emulated device is exit 2 and one line;
#      train.compute_dtype fp8 on an emulated sm_80 (LLMTRAIN_CUDA_EMU_CC),
#      train.fp8_recipe blockwise and rowwise on an emulated sm_89 are
#      exit 2 and one line; FP8 at parallel.tensor 2 and parallel.context 2
#      against one emulated device (rowwise also against the CPU's of the
#      same layout and without the agreement), the amax all-reduces
#      counted; FP8 training (GPT-2, Llama;
#      Llama under each recipe) against the CPU's FP8, and with the FP8
#      weight copies against without them (bit-identical).
# What it cannot show: speed, races between streams, and the hardware's own
# rounding (the tolerances are the GPU suite's).
. "$(dirname "$0")/lib.sh"
# suite NAME CMD...: run a suite, print it, add its "N passed, M failed" to ours
# (no summary, or a non-zero exit with none failed, counts as a failure)
suite() {
    local name=$1 out rc line; shift
    out=$("$@" 2>&1); rc=$?
    echo "$out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -1)
    if [ -z "$line" ]; then echo "FAIL $name printed no summary (exit $rc)"; fail=$((fail + 1)); return; fi
    pass=$((pass + $(awk '{print $1}' <<<"$line"))); fail=$((fail + $(awk '{print $3}' <<<"$line")))
    [ $rc -ne 0 ] && [ "$(awk '{print $3}' <<<"$line")" -eq 0 ] && { echo "FAIL $name exited $rc"; fail=$((fail + 1)); }
}
suite selftest tests/cuda_emu/selftest.sh
suite "tests/gpu_tests.sh on the emulation" env LLMTRAIN_GPU_BIN="$PWD/tests/llmtrain_emu" TEST_GPU_BIN=tests/test_gpu_emu \
    TEST_GPU_MAX_T=256 GPU_TEST_STEPS=5 GPU_COUNT=4 LLMTRAIN_CUDA_EMU_DEVICES=4 GPU_TESTS_EMULATED=1 tests/gpu_tests.sh

write_shard "$TMP/train.bin" 96 4000 3
cat >"$TMP/job.json" <<JSON
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "vocab_size": 96, "max_seq_len": 64},
 "data": {"train": "$TMP/train.bin"}, "train": {"steps": 2, "seq_len": 64, "micro_batch": 4, "global_batch": 8, "device": "cuda"},
 "log": {"dir": "$TMP/run"}, "checkpoint": {"dir": "$TMP/run/ckpt"}}
JSON
LLMTRAIN_CUDA_EMU_MEM_MIB=34 tests/llmtrain_emu "$TMP/job.json" >"$TMP/oom.out" 2>"$TMP/oom.err"; rc=$?
if [ $rc -eq 3 ] && [ "$(wc -l <"$TMP/oom.err")" -eq 1 ] &&
   grep -q '^llmtrain: CUDA out of memory at kernels[^ ]*\.cuh*:[0-9]* allocating [0-9.]* GiB ([0-9.]* of 0.03 GiB free on the device, [0-9.]* GiB held by llmtrain)$' "$TMP/oom.err"; then
    echo "ok   device memory runs out (34 MiB emulated): exit 3, $(cat "$TMP/oom.err")"; pass=$((pass + 1))
else echo "FAIL out of device memory: exit $rc, expected 3 and one line: $(head -c 400 "$TMP/oom.err")"; fail=$((fail + 1)); fi
# FP8 (train.compute_dtype fp8): a GPU before sm_89, and rowwise and
# blockwise (cuBLASLt scales them on sm_90 only) before sm_90, are exit 2
# and one line
LLMTRAIN_CUDA_EMU_CC=8.0 tests/llmtrain_emu "$TMP/job.json" --set train.compute_dtype=fp8 >"$TMP/fp8.out" 2>"$TMP/fp8.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/fp8.err")" -eq 1 ] &&
   grep -q '^llmtrain: train.compute_dtype "fp8": device 0 (.*compute capability 8.0) has no FP8 tensor cores (sm_89 or newer)$' "$TMP/fp8.err"; then
    echo "ok   train.compute_dtype fp8 on an emulated sm_80: exit 2, $(cat "$TMP/fp8.err")"; pass=$((pass + 1))
else echo "FAIL fp8 on sm_80: exit $rc, expected 2 and one line: $(head -c 400 "$TMP/fp8.err")"; fail=$((fail + 1)); fi
for r in blockwise rowwise; do
    LLMTRAIN_CUDA_EMU_CC=8.9 tests/llmtrain_emu "$TMP/job.json" --set train.compute_dtype=fp8 --set train.fp8_recipe=$r \
        >"$TMP/fp8b.out" 2>"$TMP/fp8b.err"; rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/fp8b.err")" -eq 1 ] &&
       grep -q "^llmtrain: train.fp8_recipe \"$r\": device 0 (.*compute capability 8.9) has no cuBLASLt .* scaling (sm_90 only" "$TMP/fp8b.err"; then
        echo "ok   train.fp8_recipe $r on an emulated sm_89: exit 2, $(cat "$TMP/fp8b.err")"; pass=$((pass + 1))
    else echo "FAIL fp8 $r on sm_89: exit $rc, expected 2 and one line: $(head -c 400 "$TMP/fp8b.err")"; fail=$((fail + 1)); fi
done
# FP8 training on the emulation against the CPU's FP8 (fake quantization,
# fp32 activations), 6 steps of GPT-2 and Llama under tensorwise, Llama
# under blockwise and rowwise (its 256-token batch and 256-wide MLP make
# two 128-blocks along the weight gradient's K and the MLP down input
# gradient's; measured losses within 6.6e-5 and gradient norms within
# 1.1e-3, the emulated cuBLASLt reading the scales in cuBLASLt's
# documented layouts): the CUDA run's [a]
# activations are bf16, so some values quantize to the neighbouring FP8
# code; measured (2026-11-28) losses within 6e-5 and gradient norms within
# 2.6e-3, held to 5e-4 and 1e-2. Weight copies left stale across steps
# (made once, never again) moved the gradient norm by 7e-2 by step 5. And
# the Llama run without the FP8 weight copies (LLMTRAIN_CUDA_WEIGHT_CACHE=0:
# every product quantizes its weight) and with full activation
# checkpointing (the recompute quantizes the same values again)
# bit-identical to the run with the copies and without checkpointing.
fp8_ok=1
for run in gpt2:tensorwise llama:tensorwise llama:blockwise llama:rowwise; do
    arch=${run%%:*} r=${run#*:} kv=$([ ${run%%:*} = gpt2 ] && echo 4 || echo 2)
    name=$arch$([ $r = tensorwise ] || echo "-$r")
    for dev in cpu cuda; do
        tests/llmtrain_emu "$TMP/job.json" --set train.steps=6 --set model.arch=$arch --set model.n_kv_head=$kv \
            --set train.device=$dev --set train.compute_dtype=fp8 --set train.fp8_recipe=$r --set log.dir="$TMP/f8-$name-$dev" \
            --set checkpoint.dir="$TMP/f8-$name-$dev/ckpt" >"$TMP/f8-$name-$dev.out" 2>&1 ||
            { echo "  fp8 $name on $dev: exit $?: $(tail -2 "$TMP/f8-$name-$dev.out")"; fp8_ok=0; }
    done
    $PY tests/compare_runs.py "$TMP/f8-$name-cpu" "$TMP/f8-$name-cuda" --steps 6 --loss-rtol 5e-4 --norm-rtol 1e-2 ||
        { echo "  (above: fp8 $name, cuda vs cpu)"; fp8_ok=0; }
done
grep -q 'matmuls FP8 layer linears, else bf16 (train.compute_dtype fp8)' "$TMP/f8-llama-cuda.out" ||
    { echo "  the fp8 header does not name the FP8 products: $(grep -m1 backend "$TMP/f8-llama-cuda.out")"; fp8_ok=0; }
LLMTRAIN_CUDA_WEIGHT_CACHE=0 tests/llmtrain_emu "$TMP/job.json" --set train.steps=6 --set train.compute_dtype=fp8 \
    --set train.activation_checkpointing=full --set log.dir="$TMP/f8-nocopy" --set checkpoint.dir="$TMP/f8-nocopy/ckpt" \
    >"$TMP/f8-nocopy.out" 2>&1 || fp8_ok=0
$PY tests/compare_runs.py "$TMP/f8-llama-cuda" "$TMP/f8-nocopy" --steps 6 --exact ||
    { echo "  (above: fp8 llama with the weight copies, no checkpointing vs without them, full checkpointing)"; fp8_ok=0; }
if [ $fp8_ok = 1 ]; then
    ok "train.compute_dtype fp8 on CUDA: GPT-2 and Llama 6 steps vs cpu fp8 (loss 5e-4, grad norm 1e-2), Llama also blockwise and rowwise; Llama without the FP8 weight copies and with full checkpointing bit-identical"
else bad "train.compute_dtype fp8 on CUDA (above)"; fi
# FP8 under tp 2 and cp 2 on the emulation (Kernels.fp8_tp / fp8_cp: the
# amax all-reduced over the group, ncclMax, on the device): a step of the
# Llama job against the first step of the one-device run above. tp 2's
# loss (the forward's) is the one device's bit for bit (measured; with
# LLMTRAIN_FP8_AGREE=0 it parts by 7.2e-6), held to 1e-6; the rest as that
# section holds CUDA against the CPU (loss 5e-4, grad norm 1e-2; measured:
# tp 2's grad norm 1.4e-4, cp 2's loss 4.0e-6 and grad norm 1.9e-4: its
# bf16 ring attention's merge order moves more than the agreement, so cp 2
# is held by its bytes, and the agreement by test_fp8_cp.sh). cp 2's
# cp_sendrecv a step is the ring's (docs/layouts.md: 2 (cp - 1) KVa + cp
# KV4 a layer and micro-batch, KVa = B (T/cp) 2 nkv hd x 2 bytes, KV4 twice
# that) plus 4 bytes per tensorwise amax: 12 a layer and micro-batch (the
# 4 linears' inputs forward, their douts and inputs for the weight
# gradient).
f8par_ok=1
for run in tp2:parallel.tensor cp2:parallel.context; do
    IFS=: read -r name key <<<"$run"
    LLMTRAIN_CUDA_EMU_DEVICES=2 LLMTRAIN_CUDA_EMU_THREADS=1 $MPIRUN 2 tests/llmtrain_emu "$TMP/job.json" --set train.compute_dtype=fp8 \
        --set train.steps=1 --set log.dir="$TMP/f8p-$name" --set checkpoint.dir="$TMP/f8p-$name/ckpt" --set $key=2 \
        >"$TMP/f8p-$name.out" 2>&1 || { echo "  fp8 $name on the emulation: exit $?: $(grep llmtrain: "$TMP/f8p-$name.out" | head -2)"; f8par_ok=0; }
done
$PY - "$TMP/f8-llama-cuda" "$TMP/f8p-tp2" "$TMP/f8p-cp2" <<'PYEOF' || f8par_ok=0
import json, sys
def step1(run):
    return next(json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step":1,' in l and '"loss"' in l)
one = step1(sys.argv[1])
for run, loss_rtol in ((sys.argv[2], 1e-6), (sys.argv[3], 5e-4)):
    got = step1(run)
    for key, tol in (("loss", loss_rtol), ("grad_norm", 1e-2)):
        if abs(got[key] - one[key]) > tol * abs(one[key]):
            sys.exit(f"  fp8 {run.split('-')[-1]} step 1 {key} {got[key]} against one device's {one[key]} (rtol {tol})")
PYEOF
e=$((4 * 32 * 2 * 2 * 16)) # B (T/cp) 2 nkv hd
want=$((2 * 2 * (2 * e * 2 + 2 * 4 * e) + 4 * 12 * 2 * 2)) # accum 2 x L 2 x the ring's, + 4 bytes x 12 x L x accum
got=$(grep -o '"cp_sendrecv":[0-9]*' "$TMP/f8p-cp2/metrics.jsonl" | sort -u | tr '\n' ' ')
[ "$got" = "\"cp_sendrecv\":$want " ] || { echo "  fp8 cp 2: cp_sendrecv a step $got, want $want (the ring's and 48 amaxes of 4 bytes)"; f8par_ok=0; }
if [ $f8par_ok = 1 ]; then
    ok "train.compute_dtype fp8 on CUDA under tp 2 and cp 2 matches one emulated device (tp 2's loss 1e-6, else loss 5e-4, grad norm 1e-2); cp 2 moves the ring's bytes and 48 amaxes a step"
else bad "fp8 under tp 2 / cp 2 on the emulation (above)"; fi
# rowwise under tp 2 and cp 2 (a row of each operand as the product reads
# it: the groups along a split K take their max over the group, OC or C
# amaxes an all-reduce): a step on the emulation against the CPU backend's
# step of the same layout and against the one-device rowwise run above,
# held as tensorwise's (tp 2's loss 1e-6 against one device, else loss
# 5e-4, grad norm 1e-2); with LLMTRAIN_FP8_AGREE=0 (each rank's own
# amaxes) tp 2's loss and cp 2's gradient norm (the agreement is the
# weight gradient's there) must part from the agreed run's, and cp 2
# moves only the ring's bytes; agreed, the ring's and 4 bytes an amax
# (1216 a layer and micro-batch: the 4 linears' C and OC, MLP 256).
# Measured: tp 2's loss the one device's within 1.5e-8 (own amaxes:
# 2.7e-5), grad norm 1.0e-4; cp 2's loss 8.9e-6, grad norm 3.3e-4 (own
# amaxes: grad norm 1.7e-4 from the agreed run's); against the cpu's
# layout losses 4.6e-6 and 1.3e-5, norms 1.2e-4 and 1.1e-4.
f8rw_ok=1
for run in tp2:parallel.tensor cp2:parallel.context; do
    IFS=: read -r name key <<<"$run"
    for v in cuda:1 cpu:1 cuda:0; do
        IFS=: read -r dev agree <<<"$v"
        d="$TMP/f8rw-$name-$dev-$agree"
        LLMTRAIN_FP8_AGREE=$agree LLMTRAIN_CUDA_EMU_DEVICES=2 LLMTRAIN_CUDA_EMU_THREADS=1 $MPIRUN 2 tests/llmtrain_emu "$TMP/job.json" \
            --set train.compute_dtype=fp8 --set train.fp8_recipe=rowwise --set train.steps=1 --set train.device=$dev --set $key=2 \
            --set log.dir="$d" --set checkpoint.dir="$d/ckpt" >"$d.out" 2>&1 ||
            { echo "  fp8 rowwise $name on $dev (agree $agree): exit $?: $(grep llmtrain: "$d.out" | head -2)"; f8rw_ok=0; }
    done
done
$PY - "$TMP/f8-llama-rowwise-cuda" "$TMP/f8rw" <<'PYEOF' || f8rw_ok=0
import json, sys
def step1(run):
    return next(json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step":1,' in l and '"loss"' in l)
one, pre, bad = step1(sys.argv[1]), sys.argv[2], []
for name, loss_rtol, parts in (("tp2", 1e-6, "loss"), ("cp2", 5e-4, "grad_norm")):
    got, cpu, own = (step1(f"{pre}-{name}-{v}") for v in ("cuda-1", "cpu-1", "cuda-0"))
    for ref, what, ltol in ((one, "one device", loss_rtol), (cpu, "the cpu's", 5e-4)):
        for key, tol in (("loss", ltol), ("grad_norm", 1e-2)):
            if abs(got[key] - ref[key]) > tol * abs(ref[key]):
                bad.append(f"fp8 rowwise {name} step 1 {key} {got[key]} against {what} {ref[key]} (rtol {tol})")
    if own[parts] == got[parts]:
        bad.append(f"fp8 rowwise {name} with LLMTRAIN_FP8_AGREE=0: step 1 {parts} {own[parts]}, the agreed run's: no agreement to see")
    print(f"  rowwise {name}: loss {got['loss']!r} (one device {one['loss']!r}, cpu {cpu['loss']!r}, own amaxes {own['loss']!r}); "
          f"grad norm {got['grad_norm']!r} ({one['grad_norm']!r}, {cpu['grad_norm']!r}, {own['grad_norm']!r})")
if bad: sys.exit("  " + "\n  ".join(bad))
PYEOF
ring=$((2 * 2 * (2 * e * 2 + 2 * 4 * e))) # the ring's bytes a step (above)
for a in 1:$((ring + 4 * 1216 * 2 * 2)) 0:$ring; do # agreed: 1216 amaxes a layer and micro-batch (x's C and dout's OC of the 4 linears)
    got=$(grep -o '"cp_sendrecv":[0-9]*' "$TMP/f8rw-cp2-cuda-${a%:*}/metrics.jsonl" | sort -u | tr '\n' ' ')
    [ "$got" = "\"cp_sendrecv\":${a#*:} " ] || { echo "  fp8 rowwise cp 2 (agree ${a%:*}): cp_sendrecv a step $got, want ${a#*:}"; f8rw_ok=0; }
done
if [ $f8rw_ok = 1 ]; then
    ok "train.fp8_recipe rowwise on CUDA under tp 2 and cp 2 matches the cpu's of each layout and one emulated device (tp 2's loss 1e-6 against one device, else loss 5e-4, grad norm 1e-2); with each rank's own amaxes (LLMTRAIN_FP8_AGREE=0) tp 2's loss and cp 2's grad norm part"
else bad "fp8 rowwise under tp 2 / cp 2 on the emulation (above)"; fi
LLMTRAIN_CUDA_EMU_DEVICES=1 $MPIRUN 2 tests/llmtrain_emu "$TMP/job.json" >"$TMP/one.out" 2>"$TMP/one.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c '^llmtrain:' "$TMP/one.err")" -eq 1 ] &&
   grep -q "^llmtrain: .*train.device \"cuda\": ranks 0 and 1 on host $(hostname) would share GPU GPU-656d752d-6375-6461-2d64-657669636500 (2 ranks on this node, 1 CUDA device visible to this rank" "$TMP/one.err"; then
    echo "ok   2 ranks on 1 emulated device: exit 2, one line naming the ranks and the GPU's UUID"; pass=$((pass + 1))
else echo "FAIL 2 ranks on 1 device: exit $rc: $(grep llmtrain: "$TMP/one.err" | head -2)"; fail=$((fail + 1)); fi
# one GPU bound to each rank (CUDA_VISIBLE_DEVICES per rank, as srun
# --gpus-per-task 1 sets it): each rank sees 1 device of the node's 2 and
# trains as the ranks that see both do; two ranks bound to the same GPU are
# refused under "cuda" and take the CPU under "auto"
bind() { LLMTRAIN_CUDA_EMU_DEVICES=2 $MPIRUN 2 sh -c "CUDA_VISIBLE_DEVICES=$1 exec tests/llmtrain_emu $TMP/job.json --set log.dir=$TMP/$2 --set checkpoint.dir=$TMP/$2/ckpt $3"; }
LLMTRAIN_CUDA_EMU_DEVICES=2 $MPIRUN 2 tests/llmtrain_emu "$TMP/job.json" --set log.dir="$TMP/both" --set checkpoint.dir="$TMP/both/ckpt" >"$TMP/both.out" 2>&1; rc1=$?
bind '$OMPI_COMM_WORLD_LOCAL_RANK' own >"$TMP/own.out" 2>&1; rc2=$?
bind 1 same >"$TMP/same.out" 2>"$TMP/same.err"; rc3=$?
bind 1 same-auto "--set train.device=auto" >"$TMP/same-auto.out" 2>&1; rc4=$?
losses() { $PY -c 'import json, sys; print([json.loads(l)["loss"] for l in open(sys.argv[1]) if "\"loss\"" in l])' "$1"; }
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "| backend cuda" "$TMP/own.out" && [ "$(losses "$TMP/both/metrics.jsonl")" = "$(losses "$TMP/own/metrics.jsonl")" ] &&
   [ $rc3 -eq 2 ] && [ "$(grep -c '^llmtrain:' "$TMP/same.err")" -eq 1 ] && grep -q "ranks 0 and 1 on host $(hostname) would share GPU GPU-656d752d-6375-6461-2d64-657669636501 (2 ranks on this node, 1 CUDA device visible" "$TMP/same.err" &&
   [ $rc4 -eq 0 ] && grep -q "| backend cpu" "$TMP/same-auto.out"; then
    echo "ok   one emulated GPU bound to each rank: trains as with both visible (losses $(losses "$TMP/own/metrics.jsonl")); both bound to GPU 1: \"cuda\" exit 2 naming it, \"auto\" the CPU"; pass=$((pass + 1))
else echo "FAIL per-rank GPU binding: exit codes $rc1 $rc2 $rc3 $rc4: $(grep -hE "backend|llmtrain:" "$TMP/own.out" "$TMP/same.err" "$TMP/same-auto.out" | head -4)"; fail=$((fail + 1)); fi

# make bench-gpu's script on the emulation (BENCH_SMOKE=1: tiny models, every
# case): a GPU session's bench must not fail on the script (the config keys it
# writes, the header, metrics and profile lines it parses). Each case's result
# line, with the profile's summary and table under BENCH_PROFILE=kernels and
# none without.
res_re='^(gpt2_124M|llama_1B|llama_1B_moe) \(0\.[0-9]+M params\) B=[12] T=64( \(8 micro-batches a step\))?(, selective checkpointing \((attention|norm, mlp_act)\))? (bf16|tf32) GEMMs, (cudnn|flash|gemm) attention on device 0: host emulation of CUDA .*: [0-9]+ ms/step, [0-9]+ tokens/s, MFU [0-9.]+% of 1071 TFLOP/s bf16 dense \(median of 2 steps after warm-up\)$'
bench_smoke() { # OUT PROFILE MATMUL ATTENTION CP
    BENCH_BIN=tests/llmtrain_emu BENCH_TEST_GPU=tests/test_gpu_emu BENCH_SMOKE=1 BENCH_STEPS=3 BENCH_PROFILE=$2 BENCH_MATMUL=$3 \
        BENCH_ATTENTION=$4 BENCH_FP8=0 BENCH_CP=$5 bench/run_bench_gpu.sh >"$1" 2>&1
}
bench_smoke "$TMP/bk.out" kernels bf16 "cudnn flash" 1; rc=$?
cases=$(grep -cE "$res_re" "$TMP/bk.out")
order=$(grep -E "$res_re" "$TMP/bk.out" | sed -E 's/ \(0\.[0-9]+M params\) B=[12] T=64//; s/ on device 0.*//')
want=$'gpt2_124M bf16 GEMMs, cudnn attention\ngpt2_124M bf16 GEMMs, flash attention
llama_1B, selective checkpointing (attention) bf16 GEMMs, cudnn attention
llama_1B, selective checkpointing (attention) bf16 GEMMs, flash attention
llama_1B, selective checkpointing (norm, mlp_act) bf16 GEMMs, cudnn attention
llama_1B, selective checkpointing (norm, mlp_act) bf16 GEMMs, flash attention
llama_1B (8 micro-batches a step), selective checkpointing (attention) bf16 GEMMs, cudnn attention
llama_1B (8 micro-batches a step), selective checkpointing (attention) bf16 GEMMs, flash attention
llama_1B_moe, selective checkpointing (attention) bf16 GEMMs, cudnn attention'
sums=$(grep -cE '^profile: steps 2-3 \(2 steps\): [0-9.]+ ms a step in [0-9]+ calls of the kernel table \(timed on the CUDA compute stream\)' "$TMP/bk.out")
rows=$(grep -cE '^profile: +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+ +[0-9.e-]+ +[0-9.]+% +matmul_forward_a$' "$TMP/bk.out")
floors=$(grep -cE '^profile: at the peaks these calls would take [0-9.]+ ms a step .*% of their timed [0-9.]+ ms$' "$TMP/bk.out")
# and the ring's attention parts against the whole-sequence call (tests/test_gpu cp-bench)
cpl=$(grep -cE '^cp-bench (forward|backward) cp [24]: B 1 T 256 heads 4/2 hd 64: whole sequence [0-9.]+ ms [0-9.e+-]+ TFLOP/s; ring parts \(rank 0, (5 pairs of 64|9 pairs of 32) rows\) [0-9.]+ ms [0-9.e+-]+ TFLOP/s; parts/whole [0-9.]+; parts/cudnn [0-9.]+$' "$TMP/bk.out")
cpd=$(grep -cE '^cp-bench whole sequence on cudnn: B 1 T 256 heads 4/2 hd 64: forward [0-9.]+ ms [0-9.e+-]+ TFLOP/s, backward [0-9.]+ ms [0-9.e+-]+ TFLOP/s$' "$TMP/bk.out")
if [ $rc -eq 0 ] && [ "$cases" -eq 9 ] && [ "$order" = "$want" ] && [ "$sums" -eq 9 ] && [ "$rows" -eq 9 ] && [ "$floors" -eq 9 ] &&
   [ "$cpl" -eq 4 ] && [ "$cpd" -eq 1 ] && ! grep -q 'profile\.json$' "$TMP/bk.out"; then
    ok "BENCH_SMOKE=1 BENCH_PROFILE=kernels bench-gpu on the emulation: 9 cases (GPT-2, Llama, Llama recomputing norm and mlp_act, Llama x 8 micro-batches; cudnn, flash; the MoE Llama on the first attention, cudnn), each its result line and profile table with the time at the GPU's peaks; the 4 cp-bench lines (cp 2, 4; forward, backward) and the whole call on cuDNN"
else bad "bench-gpu smoke, BENCH_PROFILE=kernels: exit $rc, $cases result lines, $sums profile summaries, $rows matmul rows, $floors lines of the peaks' time, $cpl cp-bench lines, $cpd cuDNN lines: $(grep -v '^profile:  ' "$TMP/bk.out" | head -c 1500)"; fi
# with a baseline build to compare (the same binary here): after each case
# the baseline's result line and the comparison line
BENCH_BASELINE_BIN=tests/llmtrain_emu bench_smoke "$TMP/bt.out" 0 tf32 gemm 0; rc=$?
cases=$(grep -cE "$res_re" "$TMP/bt.out")
based=$(sed -n 's/^baseline: //p' "$TMP/bt.out" | grep -cE "$res_re")
vs=$(grep -cE '^(gpt2_124M|llama_1B|llama_1B_moe) tf32 gemm (none|selective|selective:norm,mlp_act)( x8)? vs baseline tests/llmtrain_emu: [0-9]+ vs [0-9]+ ms/step, [0-9]+ vs [0-9]+ tokens/s \(x[0-9.]+ the baseline.s\)$' "$TMP/bt.out")
if [ $rc -eq 0 ] && [ "$cases" -eq 5 ] && [ "$based" -eq 5 ] && [ "$vs" -eq 5 ] &&
   [ "$(grep -c ' tf32 GEMMs, gemm attention ' "$TMP/bt.out")" -eq 10 ] &&
   ! grep -q '^profile:' "$TMP/bt.out" && ! grep -q '^cp-bench' "$TMP/bt.out"; then
    ok "BENCH_SMOKE=1 BENCH_BASELINE_BIN bench-gpu on the emulation, tf32 and the GEMM attention: 5 result lines (the MoE Llama's last), each followed by the baseline's and the comparison, no profile"
else bad "bench-gpu smoke, tf32 gemm with a baseline: exit $rc, $cases result lines, $based baseline lines, $vs comparisons: $(head -c 1500 "$TMP/bt.out")"; fi
# the FP8 section (BENCH_FP8=only) under two recipes: for each of the three
# shapes the bf16 line, then each recipe's line and its comparison with bf16
BENCH_BIN=tests/llmtrain_emu BENCH_SMOKE=1 BENCH_FP8=only BENCH_FP8_STEPS=3 BENCH_FP8_RECIPES="tensorwise blockwise" \
    bench/run_bench_gpu.sh >"$TMP/b8.out" 2>&1; rc=$?
want=""
for n in gpt2_124M llama_1B llama_3B; do want="$want $n:bf16 $n:fp8:tensorwise $n:vs:tensorwise $n:fp8:blockwise $n:vs:blockwise"; done
got=$($PY - "$TMP/b8.out" <<'PYEOF'
import re, sys
out = []
for ln in open(sys.argv[1]):
    m = re.match(r"^(\w+) \(0\.[0-9]+M params\) B=[12] T=64.* (bf16|fp8 (tensorwise|blockwise)) GEMMs, cudnn attention on device 0: .* [0-9]+ tokens/s, ", ln)
    if m: out.append(f"{m[1]}:{m[2].replace(' ', ':')}")
    m = re.match(r"^fp8 \((tensorwise|blockwise)\) vs bf16 (\w+): tokens/s [0-9]+ vs [0-9]+ \(x[0-9.]+\); loss over 3 steps \(every 20th\): "
                 r"largest gap [-+][0-9.]+% at step [0-9]+, last [0-9.]+ vs [0-9.]+ \([-+][0-9.]+%\)"
                 r"(; goal x1\.3 tokens/s and the loss within 1%: (met|not met))?$", ln)
    if m and (m[3] is not None) == (m[2] == "llama_3B"): out.append(f"{m[2]}:vs:{m[1]}")
print(" " + " ".join(out))
PYEOF
)
if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then
    ok "BENCH_SMOKE=1 BENCH_FP8=only BENCH_FP8_RECIPES=\"tensorwise blockwise\" bench-gpu on the emulation: GPT-2, Llama 1B and 3B shapes, each a bf16 line and per recipe its fp8 line and comparison"
else bad "bench-gpu FP8 smoke: exit $rc, lines [$got], expected [$want]: $(head -c 1500 "$TMP/b8.out")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
