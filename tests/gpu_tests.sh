#!/bin/bash
# make test-gpu: the CUDA backend against the CPU backend.
#   1. tests/test_gpu: every CUDA kernel vs the CPU kernel on the same random
#      inputs (tolerances stated in tests/test_gpu.c: 1e-5 fp32, 5e-3 TF32),
#      under each compute dtype: bf16 (1e-2 for the GEMMs), tf32 (5e-3)
#      and fp32 (1e-4).
#   2. whole training runs, small GPT-2 and small Llama (GQA), $STEPS steps with
#      gradient accumulation and a validation pass: train.device=cuda vs
#      train.device=cpu, loss / grad norm / val loss per step within a
#      relative 5e-3 under train.compute_dtype tf32 (the CPU is fp32
#      throughout), within 3e-2 with no compute dtype set (bf16, the
#      default: the header must say so) and 1e-4 under fp32.
#      The cuda runs report the device's memory: gpu_mem_bytes > 0 (= mem_bytes)
#      and host_mem_bytes in metrics.jsonl, "mem X GiB gpu" on the step line;
#      the bf16 run's activations take 2 bytes less for each element of the
#      [a] buffers (bf16 norm outputs, attention output, MLP activation).
#   2b. mixture of experts (Llama, 4 experts top-2, the balance losses on),
#      dropless and with a capacity factor, cuda against cpu under tf32,
#      bf16 and fp32 within those tolerances (the losses, the aux and z
#      losses, the dropped share); recomputing the experts' activation
#      under bf16 bit-identical to keeping it.
#   2c. Qwen3's attention (head_dim 24 at n_embd 64 and 4 heads, QK-norm):
#      cuda TF32 and bf16 against cpu; bf16 with selective norm and full
#      recompute bit-identical to keeping everything.
#   3. activation offload on cuda (5 layers) against cpu (fp32 GEMMs) and
#      against cuda without offload (fp32, TF32 and bf16 GEMMs).
#   3b. the fused attention kernels (train.attention_kernel flash) in whole
#      runs: GPT-2 (MHA) and Llama (GQA) with head dim 64 and T = 100 (a
#      ragged last tile), $STEPS steps against cpu: under
#      compute dtype fp32 (the fused kernels in fp32 FMA too) within
#      1e-4, with TF32 (tensor cores in the fused kernels) within 5e-3, and a
#      Llama run with selective activation checkpointing (attention forward
#      recomputed) within 5e-3; then both again under
#      compute dtype bf16 (the bf16 mma.sync attention kernels, the
#      header must name them) within 3e-2.
#   3b'. selective checkpointing's train.recompute_modules under bf16 on
#      the 3b shapes: Llama's norm,mlp_act and all three, GPT-2's norm
#      bit-identical to the run that keeps everything; GPT-2's norm,mlp_act
#      (its GELU then its own kernel in the forward) against cpu within 3e-2.
#   3c. cuDNN's fused attention (train.attention_kernel cudnn, the default
#      under bf16 GEMMs) in whole runs on the 3b shapes: TF32 GEMMs, bf16
#      GEMMs and (Llama) selective checkpointing, against cpu within 3e-2;
#      no shape declined; emulated, a cuDNN that declines everything leaves
#      the flash run's numbers; the memory estimate with its buffers (T 512).
#      Block-causal attention (train.attention_mask) in Llama runs on the
#      same shape: the fused kernels under TF32 and bf16 (cuDNN passing the
#      mask to them) against cpu.
#   3d. under bf16 GEMMs: the memory estimate with the weights' bf16 copies
#      (Llama, n_embd 256), and under fp8 with the FP8 buffers; runs with
#      the copies (Llama; checkpointing none and full) are the runs without
#      them (LLMTRAIN_CUDA_WEIGHT_CACHE=0) to 1e-7.
#   3e. checkpoint and resume on cuda: a bf16 run (bf16 working weights
#      rounded stochastically, the fused attention) killed at step 8 resumes
#      from step 6 bit-identical to the uninterrupted run, losses and
#      exported weights; its checkpoint resumed on the CPU continues within
#      3e-2 (with two GPUs, also under FULL_SHARD on NCCL, bit for bit).
#   3f. log.profile_steps on cuda: a bf16 Llama run's steps 2-3 timed by
#      events on the compute stream, with the CPU profile's calls and FLOPs
#      per kernel-table entry (the bytes of its bf16 norm outputs at 2 an
#      element), the GB/s held against the device's memory bandwidth and
#      every printed figure as profile.json's, and bit-identical to the run
#      unprofiled; under fp8 the layers' linears in _fp8 entries at twice
#      the bf16 peak.
#   4. with two GPUs or more: 2-rank CUDA runs (NCCL) under NO_SHARD,
#      FULL_SHARD (also with bf16 working weights, gathered as bf16 words)
#      and tp 2 (also with sequence parallelism) against the same jobs'
#      2-rank CPU runs (MPI); tp 2 with sequence parallelism under bf16
#      GEMMs (the norms' outputs all-gathered as bf16 words) against tp 2
#      without it (1e-4); FULL_SHARD with 4 layers under bf16 GEMMs with
#      the weights' bf16 copies against the run without them (1e-7):
#      loss / grad norm / val loss within the TF32 tolerance, the same
#      comm_bytes per step, the header naming NCCL; NO_SHARD's gradient
#      all-reduces started chunk by chunk in the backward and waited for
#      after it, on NCCL as on MPI (LLMTRAIN_COMM_TRACE, against the
#      FULL_SHARD run's reduce-scatters); auto picks cuda for 2
#      ranks; a torchrun-style launch (no MPI: NCCL's ids over the TCP
#      rendezvous) repeats the FULL_SHARD run; a hung rank ends the job
#      through the watchdog (exit 5, NCCL communicators aborted) within the
#      timeout plus a few seconds.
#      Context parallelism (cp 2): the ring and all_gather on NCCL against
#      the same jobs on the CPU (MPI) under TF32, within its tolerance and
#      with the same comm_bytes; the ring under bf16 against the 1-GPU bf16
#      run within 3e-2.
#      With one GPU: a 2-rank cuda job is exit 2 with one stderr line naming
#      the GPU count, and auto runs 2 ranks on the CPU (under mpirun, or the
#      torchrun-style launch where the GPU machine has no Open MPI); a note
#      line says that context parallelism on NCCL was not run (NCCL takes
#      one GPU a rank).
# Without a GPU this FAILS (exit 1, one line on stderr); it never skips.
# Not named test_*.sh: tests/run_all.sh (the CPU suite) must not pick it up.
# The same checks run on the host emulation of CUDA (tests/test_cuda_emu.sh)
# through these overrides: LLMTRAIN_GPU_BIN (the trainer), TEST_GPU_BIN (the
# kernel checks), GPU_TEST_STEPS (steps per run, default 20), GPU_COUNT
# (instead of nvidia-smi) and GPU_TESTS_EMULATED=1 (leaves out the launch
# without MPI, which the emulated NCCL cannot bootstrap).
. "$(dirname "$0")/lib.sh"
unset LLMTRAIN_DEVICE
BIN=${LLMTRAIN_GPU_BIN:-$BIN}
TEST_GPU=${TEST_GPU_BIN:-tests/test_gpu}
STEPS=${GPU_TEST_STEPS:-20}
# GPU images may keep numpy in another python3 than Debian's
$PY -c 'import numpy' 2>/dev/null || PY=python3
LOSS_RTOL=5e-3       # train.compute_dtype tf32
LOSS_RTOL_BF16=3e-2  # bf16 (the default)
LOSS_RTOL_FP32=1e-4  # fp32 (summation order only)

# synchronous launches: a kernel fault is reported at its own line; under
# each compute dtype (TF32, bf16 GEMMs of the linear layers, plain fp32),
# and the FP8 linears' checks (tests/test_gpu_fp8.c)
for mm in tf32 bf16 fp32 fp8; do
    echo "--- $TEST_GPU $mm"
    out=$(LLMTRAIN_CUDA_SYNC=1 $TEST_GPU $mm 2>&1); rc=$?
    echo "$out"
    if grep -q "no usable CUDA device" <<<"$out"; then
        echo "test-gpu: FAIL: $(grep -o 'no usable CUDA device.*' <<<"$out" | head -1)" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -1)
    if [ -n "$line" ]; then
        pass=$((pass + $(awk '{print $1}' <<<"$line"))); fail=$((fail + $(awk '{print $3}' <<<"$line")))
    fi
    [ "$rc" -ne 0 ] && [ -z "$line" ] && { echo "FAIL $TEST_GPU ($mm) crashed (exit $rc)"; fail=$((fail + 1)); }
done

# mem_check CUDA_RUN CUDA_OUT [CPU_RUN CPU_OUT]: on CUDA mem_bytes is the
# device's peak (= gpu_mem_bytes), at least the layout's params + grads +
# optimizer state + activations, and at most that plus the CUDA scratch
# estimate (cuda_scratch_bytes on the layout line), which overshoots it by
# at most 2 MiB (its allowance for CUB's temporary storage is 1 MiB + 8 bytes
# a token); host RSS beside it (host_mem_bytes);
# the step line says "GiB gpu"; a CPU run keeps its fields and line as they
# were
mem_check() {
    $PY - "$@" <<'PYEOF'
import json, os, re, sys
cuda, out = sys.argv[1:3]
cpu, cpu_out = (sys.argv[3:5] + [None, None])[:2]
last = lambda run: [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss"' in l][-1]
g = last(cuda)
c = last(cpu) if cpu else {}
text = open(out).read()
lay = re.search(r"rank 0: params_bytes (\d+) master_bytes \d+ grads_bytes (\d+) optimizer_state_bytes (\d+) activations_bytes (\d+) cuda_scratch_bytes (\d+)", text)
need = sum(int(x) for x in lay.groups()[:4]) if lay else float("inf")
scratch = int(lay.group(5)) if lay else float("inf")
gm = g.get("gpu_mem_bytes", 0) or 0
ok = (gm > 0 and g.get("mem_bytes") == gm and (g.get("host_mem_bytes") or 0) > 0 and gm >= need
      and gm <= need + scratch <= gm + 2 * 2**20 + int(os.environ.get("MEM_SLACK_BYTES", "0"))
      and re.search(r"\| mem [0-9.]+ GiB gpu \|", text)
      and (not cpu or ("gpu_mem_bytes" not in c and "host_mem_bytes" not in c and (c.get("mem_bytes") or 0) > 0
                       and not re.search(r"GiB gpu", open(cpu_out).read()))))
print("gpu_mem_bytes %s (layout needs %s, with the CUDA scratch estimate %s), host_mem_bytes %s; cpu mem_bytes %s"
      % (gm, need, need + scratch, g.get("host_mem_bytes"), c.get("mem_bytes")))
sys.exit(0 if ok else 1)
PYEOF
}

write_shard "$TMP/train.bin" 96 40000 3
write_shard "$TMP/val.bin" 96 8000 4
for arch in gpt2 llama; do
    cat >"$TMP/$arch.json" <<JSON
{"model": {"arch": "$arch", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": $([ $arch = llama ] && echo 2 || echo 4),
           "vocab_size": 96, "max_seq_len": 64},
 "data": {"train": "$TMP/train.bin", "val": "$TMP/val.bin"},
 "train": {"steps": $STEPS, "seq_len": 64, "micro_batch": 4, "global_batch": 8},
 "optim": {"lr": 3e-3, "warmup_steps": 3, "grad_clip": 1.0},
 "eval": {"sample_tokens": 16, "batches": 2, "every_steps": 10}}
JSON
    ok_runs=1
    for dev in cpu cuda cuda-bf16 cuda-fp32; do
        # cuda-bf16 sets no compute dtype: bf16 is the default
        mm=(--set train.compute_dtype=tf32); case $dev in *-bf16) mm=();; *-fp32) mm=(--set train.compute_dtype=fp32);; esac
        if ! $BIN "$TMP/$arch.json" "${mm[@]}" --set train.device=${dev%-*} --set log.dir="$TMP/$arch-$dev" \
             --set checkpoint.dir="$TMP/$arch-$dev/ckpt" >"$TMP/$arch-$dev.out" 2>&1; then
            echo "FAIL $arch train.device=$dev exited non-zero: $(tail -3 "$TMP/$arch-$dev.out")"; fail=$((fail + 1)); ok_runs=0
        fi
    done
    [ $ok_runs = 1 ] || continue
    if grep -q "backend cuda" "$TMP/$arch-cuda.out"; then echo "ok   $arch: header names the CUDA device: $(grep -o 'backend cuda.*' "$TMP/$arch-cuda.out")"; pass=$((pass + 1))
    else echo "FAIL $arch: header lacks 'backend cuda'"; fail=$((fail + 1)); fi
    # the job without train.compute_dtype runs bf16 GEMMs and, attention
    # being auto, cuDNN's attention; the tf32 and fp32 ones say theirs
    if grep -q "matmuls bf16 tensor cores (train.compute_dtype bf16).*; attention cudnn" "$TMP/$arch-cuda-bf16.out" &&
       grep -q "matmuls TF32 tensor cores (train.compute_dtype tf32).*; attention flash" "$TMP/$arch-cuda.out" &&
       grep -q "matmuls plain fp32 (train.compute_dtype fp32).*; attention flash" "$TMP/$arch-cuda-fp32.out"; then
        echo "ok   $arch: the default compute dtype is bf16 (cuDNN attention); tf32 and fp32 as set, the fused attention"; pass=$((pass + 1))
    else echo "FAIL $arch: header modes: default '$(grep -o 'matmuls.*' "$TMP/$arch-cuda-bf16.out" | cut -c1-90)', tf32 '$(grep -o 'matmuls.*' "$TMP/$arch-cuda.out" | cut -c1-90)'"; fail=$((fail + 1)); fi
    # mem on CUDA against the layout and the scratch estimate (mem_check)
    if memline=$(mem_check "$TMP/$arch-cuda" "$TMP/$arch-cuda.out" "$TMP/$arch-cpu" "$TMP/$arch-cpu.out"); then
        echo "ok   $arch: mem on cuda is the device's: $memline"; pass=$((pass + 1))
    else echo "FAIL $arch: mem fields on cuda/cpu: $memline"; fail=$((fail + 1)); fi
    # [a] activations (kernels.h) in bf16 under compute dtype bf16: the
    # layout's activations_bytes is the TF32 run's less 2 bytes for each element
    # of every layer's ln1, qkv ((heads + 2 kv heads) x head dim), attention
    # output, ln2, MLP activation and MLP pre-activation (GELU's F wide,
    # SwiGLU's 2F), of lnf and of the logits, plus 2 bytes an element of the
    # residual gradient's bf16 copy, which only bf16 holds (C wide, as lnf:
    # the two cancel) (B*T = 256 rows; the buffers' sizes are multiples of 16
    # floats here)
    if actline=$($PY - "$TMP/$arch-cuda.out" "$TMP/$arch-cuda-bf16.out" "$arch" <<'PYEOF'
import re, sys
def grab(path):
    t = open(path).read()
    return (int(re.search(r"rank 0: .*activations_bytes (\d+)", t).group(1)),
            [int(x) for x in re.search(r"(\d+) layers, (\d+) embd, (\d+) heads \((\d+) kv\), ffn (\d+), vocab (\d+)",
                                       t).groups()])
a32, (L, C, H, KV, F, V) = grab(sys.argv[1])
a16, _ = grab(sys.argv[2])
Q = (H + 2 * KV) * (C // H)
want = 2 * 256 * (L * (3 * C + Q + F + (2 * F if sys.argv[3] == "llama" else F)) + C + V) - 2 * 256 * C
print("activations_bytes tf32 %d, bf16 %d: %d less (expected %d)" % (a32, a16, a32 - a16, want))
sys.exit(0 if a32 - a16 == want else 1)
PYEOF
    ); then echo "ok   $arch: [a] activations in bf16 under bf16 GEMMs: $actline"; pass=$((pass + 1))
    else echo "FAIL $arch: [a] activations under bf16 GEMMs: $actline"; fail=$((fail + 1)); fi
    for run in cuda:$LOSS_RTOL cuda-bf16:$LOSS_RTOL_BF16 cuda-fp32:$LOSS_RTOL_FP32; do
        dev=${run%%:*} tol=${run#*:}
        if $PY tests/compare_runs.py "$TMP/$arch-cpu" "$TMP/$arch-$dev" --steps $STEPS --loss-rtol $tol; then
            echo "ok   $arch: $STEPS steps $dev vs cpu, loss/grad norm/val loss within $tol"; pass=$((pass + 1))
        else
            echo "FAIL $arch: $dev and cpu loss trajectories differ by more than $tol"; fail=$((fail + 1))
        fi
    done
done

# mixture of experts (docs/moe.md; kernels/moe.cuh): the Llama job with 4
# experts, top-2, in both layers (moe_ffn_hidden 64; the balance losses
# on: the aux loss's default 0.01, z-loss 1e-3), dropless and under a
# capacity factor of 1 (choices dropped), on cuda against cpu: loss / grad
# norm / val loss and the step's moe_aux_loss and moe_z_loss within the
# compute dtype's tolerance (tf32, bf16, fp32); the capacity runs drop
# choices, each step's count within 2% of its 2048 choices (2 layers x
# 512 tokens x 2) of the CPU's (the TF32 or bf16 router logits tip
# near-ties the other way: 9 seen emulated), the dropless ones none; the
# memory estimate
# bounds the tf32 run's peak; under bf16 the run with selective
# checkpointing recomputing the experts' activation (mlp_act) is
# bit-identical to the one keeping it (the GEMM attention, whose backward
# sums in a fixed order: head dim 16)
MOE=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_ffn_hidden=64 --set train.moe_z_loss_coef=1e-3)
moe_ok=1
for run in cpu:cpu::none cuda:cuda:tf32:none cuda-bf16:cuda:bf16:none cuda-fp32:cuda:fp32:none cuda-bf16-rc:cuda:bf16:selective \
           cap-cpu:cpu::none cap-cuda:cuda:tf32:none cap-cuda-bf16:cuda:bf16:none; do
    IFS=: read -r name dev mm ac <<<"$run"
    extra=(); [ -n "$mm" ] && extra=(--set train.compute_dtype=$mm --set train.attention_kernel=flash)
    [ "${name#cap-}" != "$name" ] && extra+=(--set train.moe_capacity_factor=1.0)
    [ $ac = selective ] && extra+=(--set train.activation_checkpointing=selective --set train.recompute_modules=mlp_act)
    if ! $BIN "$TMP/llama.json" "${MOE[@]}" "${extra[@]}" --set train.device=$dev --set log.dir="$TMP/moe-$name" \
         --set checkpoint.dir="$TMP/moe-$name/ckpt" >"$TMP/moe-$name.out" 2>&1; then
        echo "FAIL moe $name (train.device=$dev) exited non-zero: $(tail -3 "$TMP/moe-$name.out")"; fail=$((fail + 1)); moe_ok=0
    fi
done
if [ $moe_ok = 1 ]; then
    for run in cuda:cpu:$LOSS_RTOL cuda-bf16:cpu:$LOSS_RTOL_BF16 cuda-fp32:cpu:$LOSS_RTOL_FP32 cap-cuda:cap-cpu:$LOSS_RTOL \
               cap-cuda-bf16:cap-cpu:$LOSS_RTOL_BF16; do
        IFS=: read -r name ref tol <<<"$run"
        msg=""
        if $PY tests/compare_runs.py "$TMP/moe-$ref" "$TMP/moe-$name" --steps $STEPS --loss-rtol $tol &&
           msg=$($PY - "$TMP/moe-$ref" "$TMP/moe-$name" "$tol" "${name%%-*}" $((2 * 8 * 64 * 2)) <<'PYEOF'
import json, sys
a, b, tol, cap, routed = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "cap", int(sys.argv[5])
st = lambda r: [d for d in map(json.loads, open(r + "/metrics.jsonl")) if "loss" in d and "step" in d]
sa, sb = st(a), st(b)
worst = {k: max(abs(x[k] - y[k]) / max(abs(x[k]), 1e-12) for x, y in zip(sa, sb)) for k in ("moe_aux_loss", "moe_z_loss")}
drop = max(abs(x["moe_dropped"] - y["moe_dropped"]) for x, y in zip(sa, sb)) / routed
drops = [d["moe_dropped"] for d in sa + sb]
ok = (len(sa) == len(sb) > 0 and all(v <= tol for v in worst.values()) and drop <= 0.02
      and (all(x > 0 for x in drops) if cap else not any(drops)))
print("; ".join(f"{k} within {v:.1e}" for k, v in worst.items()) + f"; choices dropped a step {min(drops):.0f}..{max(drops):.0f} "
      f"of {routed}, within {100 * drop:.2f}% of them of the reference's")
sys.exit(0 if ok else 1)
PYEOF
           ); then
            echo "ok   moe $name: $STEPS steps vs $ref, loss/grad norm/val loss within $tol; $msg"; pass=$((pass + 1))
        else echo "FAIL moe $name: differs from $ref by more than $tol: $msg"; fail=$((fail + 1)); fi
    done
    if memline=$(mem_check "$TMP/moe-cuda" "$TMP/moe-cuda.out"); then
        echo "ok   moe on cuda: the memory estimate bounds the peak: $memline"; pass=$((pass + 1))
    else echo "FAIL moe on cuda: memory estimate: $memline"; fail=$((fail + 1)); fi
    if $PY tests/compare_runs.py "$TMP/moe-cuda-bf16" "$TMP/moe-cuda-bf16-rc" --steps $STEPS --exact; then
        echo "ok   moe cuda bf16: selective with recompute_modules mlp_act (the experts' SwiGLU recomputed): $STEPS steps bit-identical to keeping it"; pass=$((pass + 1))
    else echo "FAIL moe cuda bf16: recomputing the experts' activation changed the run"; fail=$((fail + 1)); fi
fi

# Qwen3's attention on cuda (the Llama above with heads of 24, not 64 / 4,
# and QK-norm): TF32 and bf16 against cpu; under bf16 the norms recomputed
# (selective norm) and the whole layer (full) bit-identical to keeping them
$PY -c 'import json, sys; j = json.load(open(sys.argv[1])); j["model"].update(head_dim=24, qk_norm=True); json.dump(j, open(sys.argv[2], "w"))' \
    "$TMP/llama.json" "$TMP/qwen3.json"
q_ok=1
for run in cpu:cpu: cuda:cuda:tf32 cuda-bf16:cuda: cuda-norm:cuda:norm cuda-full:cuda:full; do
    IFS=: read -r name dev how <<<"$run"
    case $how in
    tf32) extra=(--set train.compute_dtype=tf32) ;;
    norm) extra=(--set train.activation_checkpointing=selective --set train.recompute_modules=norm) ;;
    full) extra=(--set train.activation_checkpointing=full) ;;
    *) extra=() ;;
    esac
    $BIN "$TMP/qwen3.json" --set train.device=$dev "${extra[@]}" --set log.dir="$TMP/qwen3-$name" \
        --set checkpoint.dir="$TMP/qwen3-$name/ckpt" >"$TMP/qwen3-$name.out" 2>&1 ||
        { echo "FAIL qwen3 $name exited non-zero: $(tail -2 "$TMP/qwen3-$name.out")"; fail=$((fail + 1)); q_ok=0; }
done
if [ $q_ok = 1 ]; then
    for cmp in "cpu cuda --loss-rtol $LOSS_RTOL" "cpu cuda-bf16 --loss-rtol $LOSS_RTOL_BF16" "cuda-bf16 cuda-norm --exact" \
               "cuda-bf16 cuda-full --exact"; do
        read -r a b opts <<<"$cmp"
        if $PY tests/compare_runs.py "$TMP/qwen3-$a" "$TMP/qwen3-$b" --steps $STEPS $opts; then
            echo "ok   qwen3 (head_dim 24, QK-norm): $STEPS steps $b vs $a ($opts)"; pass=$((pass + 1))
        else echo "FAIL qwen3 (head_dim 24, QK-norm): $b vs $a ($opts)"; fail=$((fail + 1)); fi
    done
fi

# the scratch estimate where attention's [B, T, T] blocks are most of it (T 512)
if $BIN "$TMP/llama.json" --set train.device=cuda --set train.compute_dtype=tf32 --set train.steps=2 --set optim.warmup_steps=0 --set train.seq_len=512 --set model.max_seq_len=512 \
     --set train.micro_batch=2 --set train.global_batch=2 --set eval.batches=0 --set eval.sample_tokens=0 \
     --set log.dir="$TMP/mem512" --set checkpoint.dir="$TMP/mem512/ckpt" >"$TMP/mem512.out" 2>&1 &&
   memline=$(mem_check "$TMP/mem512" "$TMP/mem512.out"); then
    echo "ok   llama T 512 on cuda: the memory estimate bounds the peak: $memline"; pass=$((pass + 1))
else echo "FAIL llama T 512 on cuda: $memline $(tail -2 "$TMP/mem512.out")"; fail=$((fail + 1)); fi

# activation offload on the GPU: 5 layers (the 3 device slots reused, the
# copies on their own stream). With plain fp32 GEMMs cuda matches cpu to the
# summation order, so offload vs the cpu run (no offload, no checkpointing)
# holds to the fp32 tolerance; with and without offload must agree to 1e-5
# under fp32, TF32 and bf16 GEMMs (bf16: the [a] activations
# travel as bf16). (A TF32 run against the CPU
# over 20 steps of this 5-layer model drifts past 5e-3 in the grad norm
# from about step 11 on an H100 with or without offload, so the cpu
# comparison is the fp32 one; and that one, on an H200, drifted to 1.0e-4
# to 1.9e-4 in the grad norm at steps 14, 15 and 19, the summation orders'
# difference grown over the steps, so it is held over the first 10.)
off_ok=1
for mm in fp32 tf32 bf16; do
    for off in false true; do
        $BIN "$TMP/llama.json" --set model.n_layer=5 --set train.device=cuda --set train.compute_dtype=$mm --set train.activation_offload=$off \
            --set train.activation_checkpointing=selective --set log.dir="$TMP/off-$mm-$off" --set checkpoint.dir="$TMP/off-$mm-$off/ckpt" \
            >"$TMP/off-$mm-$off.out" 2>&1 || { echo "FAIL offload $mm $off run: $(tail -3 "$TMP/off-$mm-$off.out")"; off_ok=0; }
    done
done
$BIN "$TMP/llama.json" --set model.n_layer=5 --set train.device=cpu --set log.dir="$TMP/off-cpu" \
    --set checkpoint.dir="$TMP/off-cpu/ckpt" >"$TMP/off-cpu.out" 2>&1 || { echo "FAIL offload cpu run: $(tail -3 "$TMP/off-cpu.out")"; off_ok=0; }
grep -q "offload_host_bytes" "$TMP/off-tf32-true.out" || { echo "  no offload_host_bytes line in the offload run"; off_ok=0; }
OFF_CPU_STEPS=$((STEPS < 10 ? STEPS : 10))
$PY tests/compare_runs.py "$TMP/off-cpu" "$TMP/off-fp32-true" --steps $STEPS --upto $OFF_CPU_STEPS --loss-rtol $LOSS_RTOL_FP32 ||
    { echo "  (above: cpu vs cuda fp32 GEMMs with offload, $OFF_CPU_STEPS steps within $LOSS_RTOL_FP32)"; off_ok=0; }
for mm in fp32 tf32 bf16; do
    $PY tests/compare_runs.py "$TMP/off-$mm-false" "$TMP/off-$mm-true" --steps $STEPS --loss-rtol 1e-5 ||
        { echo "  (above: cuda $mm GEMMs without vs with offload, within 1e-5)"; off_ok=0; }
done
if [ $off_ok = 1 ]; then
    echo "ok   activation offload on cuda (5 layers, selective): matches cpu within $LOSS_RTOL_FP32 over $OFF_CPU_STEPS steps (fp32 GEMMs) and cuda without offload within 1e-5 (fp32, TF32 and bf16 GEMMs, whose [a] activations are bf16)"; pass=$((pass + 1))
else
    echo "FAIL activation offload on cuda differs (or no offload_host_bytes line)"; fail=$((fail + 1))
fi

# fused attention (train.attention_kernel flash) in whole runs. The jobs
# above have head dim 16, which the fused kernels leave to the GEMMs: these
# use n_embd 128 with 2 heads (head dim 64; Llama 2 query heads on 1 kv
# head) and T = 100, so the last 64-row tile is ragged.
for arch in gpt2 llama; do
    nkv=2; [ $arch = llama ] && nkv=1
    ok_runs=1
    for run in cpu:gemm:tf32:none flash-fp32:flash:fp32:none flash:flash:tf32:none flash-sel:flash:tf32:selective \
               flash-bf16:flash:bf16:none flash-bf16-sel:flash:bf16:selective; do
        IFS=: read -r name att mm ac <<<"$run"
        dev=cuda; [ $name = cpu ] && dev=cpu
        [ $arch = gpt2 ] && [ "${name%-sel}" != $name ] && continue
        if ! $BIN "$TMP/$arch.json" --set train.attention_kernel=$att --set train.compute_dtype=$mm --set model.n_embd=128 \
             --set model.n_head=2 --set model.n_kv_head=$nkv --set model.max_seq_len=128 --set train.seq_len=100 \
             --set train.activation_checkpointing=$ac --set train.device=$dev --set log.dir="$TMP/fa-$arch-$name" \
             --set checkpoint.dir="$TMP/fa-$arch-$name/ckpt" >"$TMP/fa-$arch-$name.out" 2>&1; then
            echo "FAIL flash $arch $name exited non-zero: $(tail -3 "$TMP/fa-$arch-$name.out")"; fail=$((fail + 1)); ok_runs=0
        fi
    done
    [ $ok_runs = 1 ] || continue
    if grep -q "attention flash" "$TMP/fa-$arch-flash.out" && ! grep -q "attention flash" "$TMP/fa-$arch-cpu.out"; then
        echo "ok   flash $arch: the header names the fused attention: $(grep -o 'attention flash[^;]*' "$TMP/fa-$arch-flash.out" | head -1)"; pass=$((pass + 1))
    else echo "FAIL flash $arch: the header of the flash run lacks 'attention flash'"; fail=$((fail + 1)); fi
    if grep -q "attention flash (fused kernels, bf16 tensor cores through mma.sync" "$TMP/fa-$arch-flash-bf16.out" &&
       ! grep -q "mma.sync" "$TMP/fa-$arch-flash.out"; then
        echo "ok   flash $arch: under bf16 GEMMs the header names the bf16 mma.sync kernels (TF32 ones otherwise)"; pass=$((pass + 1))
    else echo "FAIL flash $arch: the bf16 run's header lacks the bf16 mma.sync attention (or the TF32 run's has it)"; fail=$((fail + 1)); fi
    for run in flash-fp32:1e-4 flash:$LOSS_RTOL flash-sel:$LOSS_RTOL flash-bf16:$LOSS_RTOL_BF16 flash-bf16-sel:$LOSS_RTOL_BF16; do
        name=${run%%:*} tol=${run#*:}
        [ $arch = gpt2 ] && [ "${name%-sel}" != $name ] && continue
        if $PY tests/compare_runs.py "$TMP/fa-$arch-cpu" "$TMP/fa-$arch-$name" --steps $STEPS --loss-rtol $tol; then
            echo "ok   flash $arch (head dim 64, T 100): $STEPS steps $name vs cpu, loss/grad norm/val loss within $tol"; pass=$((pass + 1))
        else
            echo "FAIL flash $arch: $name and cpu loss trajectories differ by more than $tol"; fail=$((fail + 1))
        fi
    done
done

# selective checkpointing's train.recompute_modules on cuda under bf16 [a]
# activations, on the 3b shapes: bit-identical to the 3b run that keeps
# everything (flash attention, whose backward sums in a fixed order; cuDNN's
# does not) where the forward is the same: Llama with norm,mlp_act and with
# all three, GPT-2 with norm. GPT-2 with mlp_act runs its GELU as its own
# kernel in the forward too, not in the GEMM's epilogue, so its bits are
# not that run's: it is held to the CPU within the bf16 tolerance (and
# tests/test_gpu to a reference with that forward, gradients ==)
for arch in gpt2 llama; do
    nkv=2; [ $arch = llama ] && nkv=1
    mods_list="norm:exact norm,mlp_act:cpu"; [ $arch = llama ] && mods_list="norm,mlp_act:exact attention,norm,mlp_act:exact"
    for item in $mods_list; do
        mods=${item%:*} against=${item#*:} name=rc-$(tr , - <<<"${item%:*}")
        if ! $BIN "$TMP/$arch.json" --set train.attention_kernel=flash --set train.compute_dtype=bf16 --set model.n_embd=128 \
             --set model.n_head=2 --set model.n_kv_head=$nkv --set model.max_seq_len=128 --set train.seq_len=100 \
             --set train.activation_checkpointing=selective --set train.recompute_modules=$mods --set train.device=cuda \
             --set log.dir="$TMP/fa-$arch-$name" --set checkpoint.dir="$TMP/fa-$arch-$name/ckpt" >"$TMP/fa-$arch-$name.out" 2>&1; then
            echo "FAIL $arch cuda bf16 recompute_modules $mods exited non-zero: $(tail -2 "$TMP/fa-$arch-$name.out")"; fail=$((fail + 1))
        elif [ $against = exact ] && $PY tests/compare_runs.py "$TMP/fa-$arch-flash-bf16" "$TMP/fa-$arch-$name" --steps $STEPS --exact; then
            echo "ok   $arch cuda bf16: selective with recompute_modules $mods: $STEPS steps bit-identical to keeping everything"; pass=$((pass + 1))
        elif [ $against = cpu ] && $PY tests/compare_runs.py "$TMP/fa-$arch-cpu" "$TMP/fa-$arch-$name" --steps $STEPS --loss-rtol $LOSS_RTOL_BF16; then
            echo "ok   $arch cuda bf16: selective with recompute_modules $mods: $STEPS steps vs cpu within $LOSS_RTOL_BF16"; pass=$((pass + 1))
        else echo "FAIL $arch cuda bf16: recompute_modules $mods differs (against: $against)"; fail=$((fail + 1)); fi
    done
done

# cuDNN's fused attention (train.attention_kernel cudnn; the default under
# bf16 GEMMs) in whole runs, on the shapes of 3b (head dim 64, T = 100):
# with TF32 GEMMs, with bf16 GEMMs (auto picks cudnn there) and, for Llama,
# with selective checkpointing, each against cpu within the bf16 tolerance
# (cuDNN reads bf16 Q, K, V and dO: the [a] qkv itself under bf16); the header names it and no
# shape is declined. Emulated, a cuDNN that declines every graph
# (LLMTRAIN_EMU_CUDNN=unsupported) must leave the run to the fused kernels:
# one stderr line per shape and the flash run's numbers exactly. Then the
# scratch estimate against the peak with cuDNN's buffers (T 512): it counts
# the plans' workspace at its cap (64 MiB + an eighth: MEM_SLACK_BYTES), which
# a plan may not use (the emulated ones take 4 KiB).
for arch in gpt2 llama; do
    nkv=2; [ $arch = llama ] && nkv=1
    ok_runs=1
    for run in dn:cudnn:tf32:none dn-bf16:auto:bf16:none dn-sel:cudnn:tf32:selective dn-declined:cudnn:tf32:none; do
        IFS=: read -r name att mm ac <<<"$run"
        [ $arch = gpt2 ] && [ $name = dn-sel ] && continue
        emu=""; [ $name = dn-declined ] && { [ "${GPU_TESTS_EMULATED:-0}" = 1 ] || continue; emu=unsupported; }
        if ! LLMTRAIN_EMU_CUDNN=$emu $BIN "$TMP/$arch.json" --set train.attention_kernel=$att --set train.compute_dtype=$mm \
             --set model.n_embd=128 --set model.n_head=2 --set model.n_kv_head=$nkv --set model.max_seq_len=128 \
             --set train.seq_len=100 --set train.activation_checkpointing=$ac --set train.device=cuda \
             --set log.dir="$TMP/fa-$arch-$name" --set checkpoint.dir="$TMP/fa-$arch-$name/ckpt" \
             >"$TMP/fa-$arch-$name.out" 2>"$TMP/fa-$arch-$name.err"; then
            echo "FAIL cudnn $arch $name exited non-zero: $(tail -3 "$TMP/fa-$arch-$name.err")"; fail=$((fail + 1)); ok_runs=0
        fi
    done
    [ $ok_runs = 1 ] || continue
    if grep -q "attention cudnn (cuDNN" "$TMP/fa-$arch-dn.out" && grep -q "attention cudnn (cuDNN" "$TMP/fa-$arch-dn-bf16.out" &&
       ! grep -q "declined" "$TMP/fa-$arch-dn.err" "$TMP/fa-$arch-dn-bf16.err"; then
        echo "ok   cudnn $arch: the header names cuDNN's attention (cudnn, and auto under bf16) and no shape was declined"; pass=$((pass + 1))
    else echo "FAIL cudnn $arch: header lacks 'attention cudnn', or cuDNN declined: $(grep -h declined "$TMP/fa-$arch-dn.err" "$TMP/fa-$arch-dn-bf16.err" | head -2)"; fail=$((fail + 1)); fi
    for name in dn dn-bf16 dn-sel; do
        [ $arch = gpt2 ] && [ $name = dn-sel ] && continue
        if $PY tests/compare_runs.py "$TMP/fa-$arch-cpu" "$TMP/fa-$arch-$name" --steps $STEPS --loss-rtol $LOSS_RTOL_BF16; then
            echo "ok   cudnn $arch (head dim 64, T 100): $STEPS steps $name vs cpu, loss/grad norm/val loss within $LOSS_RTOL_BF16"; pass=$((pass + 1))
        else
            echo "FAIL cudnn $arch: $name and cpu loss trajectories differ by more than $LOSS_RTOL_BF16"; fail=$((fail + 1))
        fi
    done
    if [ "${GPU_TESTS_EMULATED:-0}" = 1 ]; then
        # one line per shape: training's forward and backward (B 4, T 100), then
        # evaluation's and sampling's forwards (B 1, growing contexts)
        dl=$(grep -o "declined attention [a-z]* B[0-9]* T[0-9]*" "$TMP/fa-$arch-dn-declined.err")
        nd=$(grep -c . <<<"$dl"); nu=$(sort -u <<<"$dl" | grep -c .)
        if [ "$nd" = "$nu" ] && grep -q "forward B4 T100" <<<"$dl" && grep -q "backward B4 T100" <<<"$dl" &&
           $PY tests/compare_runs.py "$TMP/fa-$arch-flash" "$TMP/fa-$arch-dn-declined" --steps $STEPS --loss-rtol 1e-7; then
            echo "ok   cudnn $arch declined (emulated): one stderr line per shape ($nd, training's forward and backward among them), the fused kernels' run exactly"; pass=$((pass + 1))
        else echo "FAIL cudnn $arch declined (emulated): $nd 'declined' lines for $nu shapes (training's B4 T100 among them?), or the run differs from the flash one"; fail=$((fail + 1)); fi
    fi
done
# block-causal attention (train.attention_mask block_causal, documents
# ending at data.eod_token 5: about one boundary a row of the uniform
# tokens) with no loss on the prediction after each (train.eod_mask_loss:
# the cross-entropy's rows without a target, the mean over the targets
# left) in whole runs on the 3b shape (head dim 64, T = 100), GPT-2's with
# its positions reset at each document too (train.reset_position_ids: the
# wpe rows by position array, their gradient through the sort): cpu, the
# fused kernels under TF32 and under bf16 (auto = cuDNN's causal graphs,
# which a block-causal mask passes to the fused kernels), each against the
# cpu run; the cpu run is not the causal one (the mask changed the losses).
for arch in llama gpt2; do
    nkv=2 extra=(--set train.reset_position_ids=true) what="block_causal + eod_mask_loss + reset_position_ids"
    [ $arch = llama ] && { nkv=1 extra=() what="block_causal + eod_mask_loss"; }
    ok_runs=1
    for run in cpu:auto:tf32 flash:flash:tf32 auto-bf16:auto:bf16; do
        IFS=: read -r name att mm <<<"$run"
        dev=cuda; [ $name = cpu ] && dev=cpu
        if ! $BIN "$TMP/$arch.json" --set train.attention_kernel=$att --set train.compute_dtype=$mm --set model.n_embd=128 \
             --set model.n_head=2 --set model.n_kv_head=$nkv --set model.max_seq_len=128 --set train.seq_len=100 \
             --set data.eod_token=5 --set train.attention_mask=block_causal --set train.eod_mask_loss=true "${extra[@]}" \
             --set train.device=$dev --set log.dir="$TMP/bc-$arch-$name" --set checkpoint.dir="$TMP/bc-$arch-$name/ckpt" \
             >"$TMP/bc-$arch-$name.out" 2>&1; then
            echo "FAIL block-causal $arch $name exited non-zero: $(tail -3 "$TMP/bc-$arch-$name.out")"; fail=$((fail + 1)); ok_runs=0
        fi
    done
    [ $ok_runs = 1 ] || continue
    for run in flash:$LOSS_RTOL auto-bf16:$LOSS_RTOL_BF16; do
        name=${run%%:*} tol=${run#*:}
        if $PY tests/compare_runs.py "$TMP/bc-$arch-cpu" "$TMP/bc-$arch-$name" --steps $STEPS --loss-rtol $tol; then
            echo "ok   $arch $what (head dim 64, T 100): $STEPS steps $name vs cpu, loss/grad norm/val loss within $tol"; pass=$((pass + 1))
        else
            echo "FAIL $arch $what: $name and cpu loss trajectories differ by more than $tol"; fail=$((fail + 1))
        fi
    done
    if ! $PY tests/compare_runs.py "$TMP/fa-$arch-cpu" "$TMP/bc-$arch-cpu" --steps $STEPS --loss-rtol 1e-3 >/dev/null 2>&1 &&
       grep -q "block-causal attention (documents end at token 5)" "$TMP/bc-$arch-cpu.out"; then
        echo "ok   $arch $what: the header says so, and the losses are not the causal run's (beyond 1e-3)"; pass=$((pass + 1))
    else echo "FAIL $arch $what: the header lacks it, or the run's losses are the causal run's"; fail=$((fail + 1)); fi
done
# RoPE scaling in whole runs on the 3b shape (head dim 64, T 100): Llama
# with YaRN by 4 over an original context of 32 (frequency 0 kept, 1 to 5
# on the ramp, 6 to 31 divided; cos and sin times 0.1 ln 4 + 1) and with
# linear scaling by 4: cpu, the fused kernels under TF32 and auto under
# bf16, each against the cpu run; the cpu run is not the unscaled one.
for kind in yarn linear; do
    extra=(--set model.rope_scaling=$kind --set model.rope_scaling_factor=4)
    [ $kind = yarn ] && extra+=(--set model.rope_original_max_seq_len=32)
    ok_runs=1
    for run in cpu:auto:tf32 flash:flash:tf32 auto-bf16:auto:bf16; do
        IFS=: read -r name att mm <<<"$run"
        dev=cuda; [ $name = cpu ] && dev=cpu
        if ! $BIN "$TMP/llama.json" --set train.attention_kernel=$att --set train.compute_dtype=$mm --set model.n_embd=128 \
             --set model.n_head=2 --set model.n_kv_head=1 --set model.max_seq_len=128 --set train.seq_len=100 "${extra[@]}" \
             --set train.device=$dev --set log.dir="$TMP/rs-$kind-$name" --set checkpoint.dir="$TMP/rs-$kind-$name/ckpt" \
             >"$TMP/rs-$kind-$name.out" 2>&1; then
            echo "FAIL rope scaling $kind $name exited non-zero: $(tail -3 "$TMP/rs-$kind-$name.out")"; fail=$((fail + 1)); ok_runs=0
        fi
    done
    [ $ok_runs = 1 ] || continue
    for run in flash:$LOSS_RTOL auto-bf16:$LOSS_RTOL_BF16; do
        name=${run%%:*} tol=${run#*:}
        if $PY tests/compare_runs.py "$TMP/rs-$kind-cpu" "$TMP/rs-$kind-$name" --steps $STEPS --loss-rtol $tol; then
            echo "ok   llama rope_scaling $kind (head dim 64, T 100): $STEPS steps $name vs cpu, loss/grad norm/val loss within $tol"; pass=$((pass + 1))
        else
            echo "FAIL llama rope_scaling $kind: $name and cpu loss trajectories differ by more than $tol"; fail=$((fail + 1))
        fi
    done
    # (the CPU runs are deterministic: a run that left the scaling out would
    # be the unscaled run's bits; at T 100 scaling by 4 moves the 5-step
    # trajectory by 1.5e-4 (linear) and 3.9e-4 (YaRN) in the grad norm)
    if ! $PY tests/compare_runs.py "$TMP/fa-llama-cpu" "$TMP/rs-$kind-cpu" --steps $STEPS --loss-rtol 1e-5 >/dev/null 2>&1 &&
       grep -q "scaled $kind (factor 4" "$TMP/rs-$kind-cpu.out"; then
        echo "ok   llama rope_scaling $kind: the header says so, and the losses are not the unscaled run's (beyond 1e-5)"; pass=$((pass + 1))
    else echo "FAIL llama rope_scaling $kind: the header lacks it, or the run's losses are the unscaled run's"; fail=$((fail + 1)); fi
done
if $BIN "$TMP/llama.json" --set train.device=cuda --set train.attention_kernel=cudnn --set train.compute_dtype=tf32 \
     --set train.steps=2 --set optim.warmup_steps=0 --set train.seq_len=512 \
     --set model.max_seq_len=512 --set model.n_embd=128 --set model.n_head=2 --set model.n_kv_head=1 \
     --set train.micro_batch=2 --set train.global_batch=2 --set eval.batches=0 --set eval.sample_tokens=0 \
     --set log.dir="$TMP/mem512dn" --set checkpoint.dir="$TMP/mem512dn/ckpt" >"$TMP/mem512dn.out" 2>&1 &&
   memline=$(MEM_SLACK_BYTES=75497472 mem_check "$TMP/mem512dn" "$TMP/mem512dn.out"); then
    echo "ok   llama T 512 on cuda with cuDNN attention: the memory estimate bounds the peak: $memline"; pass=$((pass + 1))
else echo "FAIL llama T 512 with cuDNN attention: $memline $(tail -2 "$TMP/mem512dn.out")"; fail=$((fail + 1)); fi

# The scratch estimate under bf16 GEMMs: the output gradients' bf16 scratch
# and the weights' bf16 copies, exactly their size (n_embd 256: 3.2 MB of
# copies, so an estimate without them falls below the peak); the GEMM
# attention (cuDNN's workspace cap would hide them). Under fp8 also the FP8
# products' codes, fp32 stage and the weights' FP8 copies (fp8_setup
# allocates them once, exactly: 7.2 MB here, missed they too fall below it);
# under blockwise their scales in cuBLASLt's layouts as well
for dt in "bf16:the weights' bf16 copies" "fp8:the FP8 buffers" "fp8-blockwise:the FP8 buffers and block scales"; do
    d=${dt%%:*} r=(); [ "$d" = fp8-blockwise ] && r=(--set train.fp8_recipe=blockwise)
    if $BIN "$TMP/llama.json" --set train.device=cuda --set train.attention_kernel=gemm --set train.compute_dtype=${d%-*} "${r[@]}" --set train.steps=2 --set optim.warmup_steps=0 \
         --set model.n_embd=256 --set eval.batches=0 --set eval.sample_tokens=0 \
         --set log.dir="$TMP/mem-$d" --set checkpoint.dir="$TMP/mem-$d/ckpt" >"$TMP/mem-$d.out" 2>&1 &&
       memline=$(mem_check "$TMP/mem-$d" "$TMP/mem-$d.out"); then
        echo "ok   llama n_embd 256 on cuda under $d GEMMs: the memory estimate with ${dt#*:} bounds the peak: $memline"; pass=$((pass + 1))
    else echo "FAIL llama n_embd 256 under $d GEMMs: $memline $(tail -2 "$TMP/mem-$d.out")"; fail=$((fail + 1)); fi
done

# The weights' bf16 copies (kernels.h weights_stable; under bf16 GEMMs a
# product's weights are converted once and the copy kept until they change):
# a run with them must be the run that converts at every product
# (LLMTRAIN_CUDA_WEIGHT_CACHE=0) to the bit; a copy used after the optimizer
# step or the evaluation's forward changed nothing it had would not be.
# Llama (accumulation 2: the second micro-batch's forward takes the copies
# the first made, model.h same_weights; evaluation, sampling), and with full activation
# checkpointing (the recompute reads the copies); the sharded case (a chunk
# gather into a reused pool slot) is in the 2-rank section below.
wc_ok=1
for ac in none full; do
    for wc in 1 0; do
        LLMTRAIN_CUDA_WEIGHT_CACHE=$wc $BIN "$TMP/llama.json" --set train.device=cuda --set train.compute_dtype=bf16 \
            --set train.activation_checkpointing=$ac --set log.dir="$TMP/wc-$ac-$wc" --set checkpoint.dir="$TMP/wc-$ac-$wc/ckpt" \
            >"$TMP/wc-$ac-$wc.out" 2>&1 || { echo "FAIL weight copies $ac $wc run: $(tail -2 "$TMP/wc-$ac-$wc.out")"; wc_ok=0; }
    done
    $PY tests/compare_runs.py "$TMP/wc-$ac-0" "$TMP/wc-$ac-1" --steps $STEPS --loss-rtol 1e-7 || wc_ok=0
done
if [ $wc_ok = 1 ]; then
    echo "ok   bf16 weight copies: llama runs with them (checkpointing none and full) are the runs without, to 1e-7"; pass=$((pass + 1))
else echo "FAIL bf16 weight copies: a run with them differs from the run without"; fail=$((fail + 1)); fi

# Checkpoint and resume on cuda: a run killed at step 8 (checkpoints every 3
# steps, written synchronously so that step 6's is complete) and started
# again resumes from step 6 and ends bit-identical to the uninterrupted run,
# losses and exported weights (compare_runs.py --exact). The job is the one
# with most device-side state to lose: bf16 GEMMs with the weights' bf16
# copies, bf16 working weights rounded stochastically (the rounding keyed by
# step), AdamW's moments; the fused attention, whose backward sums in a fixed
# order (cuDNN's does not). Then the cuda checkpoint of step 6 resumed on the
# CPU: steps 7-10 within the bf16 tolerance of the cuda run's (a checkpoint
# does not depend on the backend that wrote it).
# resume_case NAME NP ARGS...: $TMP/rs-NAME-ref uninterrupted, $TMP/rs-NAME-cut
# killed at step 8 on its last rank and restarted; 0 when they are identical
resume_case() {
    local name=$1 np=$2 rc1 rc2; shift 2
    local launch=($BIN); [ "$np" -gt 1 ] && launch=($MPIRUN "$np" $BIN)
    local job=("$TMP/llama.json" --set train.steps=10 --set train.device=cuda --set train.compute_dtype=bf16
               --set train.attention_kernel=flash --set train.param_dtype=bf16 --set optim.stochastic_rounding=true
               --set checkpoint.every_steps=3 --set eval.sample_tokens=0 "$@")
    timeout 600 "${launch[@]}" "${job[@]}" --set log.dir="$TMP/rs-$name-ref" >"$TMP/rs-$name-ref.out" 2>&1 ||
        { echo "  uninterrupted run exited non-zero: $(grep llmtrain: "$TMP/rs-$name-ref.out" | head -2)"; return 1; }
    LLMTRAIN_FAULT="rank=$((np - 1)),step=8,kind=die" timeout 600 "${launch[@]}" "${job[@]}" --set checkpoint.async=false \
        --set log.dir="$TMP/rs-$name-cut" >"$TMP/rs-$name-cut.out" 2>&1; rc1=$?
    timeout 600 "${launch[@]}" "${job[@]}" --set log.dir="$TMP/rs-$name-cut" >>"$TMP/rs-$name-cut.out" 2>&1; rc2=$?
    $BIN export "$TMP/rs-$name-ref/checkpoints" "$TMP/rs-$name-ref/hf" >/dev/null 2>&1 &&
        $BIN export "$TMP/rs-$name-cut/checkpoints" "$TMP/rs-$name-cut/hf" >/dev/null 2>&1 ||
        { echo "  export failed"; return 1; }
    [ $rc1 -ne 0 ] && [ $rc2 -eq 0 ] && grep -q "^resume: .*step_00000006 at step 6" "$TMP/rs-$name-cut.out" &&
        grep -q "backend cuda" "$TMP/rs-$name-cut.out" &&
        $PY tests/compare_runs.py "$TMP/rs-$name-ref" "$TMP/rs-$name-cut" --steps 10 --exact ||
        { echo "  exit $rc1 then $rc2; $(grep -E '^resume|llmtrain:' "$TMP/rs-$name-cut.out" | head -3)"; return 1; }
}
if resume_case 1 1; then
    echo "ok   cuda, bf16 working weights rounded stochastically, killed at step 8: resumed from step 6, losses and weights bit-identical"; pass=$((pass + 1))
else echo "FAIL cuda resume: the resumed run is not the uninterrupted one"; fail=$((fail + 1)); fi
# the cuda checkpoint of step 6 resumed on the CPU
mkdir -p "$TMP/rs-cpu/checkpoints" && cp -r "$TMP/rs-1-cut/checkpoints/step_00000006" "$TMP/rs-cpu/checkpoints/" 2>/dev/null
if $BIN "$TMP/llama.json" --set train.steps=10 --set train.device=cpu --set train.param_dtype=bf16 --set optim.stochastic_rounding=true \
       --set eval.sample_tokens=0 --set log.dir="$TMP/rs-cpu" >"$TMP/rs-cpu.out" 2>&1 &&
   grep -q "^resume: .*step_00000006 at step 6" "$TMP/rs-cpu.out" &&
   [ "$(grep -c '"loss"' "$TMP/rs-cpu/metrics.jsonl")" -eq 4 ] &&
   $BIN export "$TMP/rs-cpu/checkpoints" "$TMP/rs-cpu/hf" >/dev/null 2>&1 &&
   $PY tests/compare_runs.py "$TMP/rs-1-ref" "$TMP/rs-cpu" --loss-rtol $LOSS_RTOL_BF16 --weight-rtol $LOSS_RTOL_BF16 >"$TMP/rs-cpu.cmp"; then
    echo "ok   the cuda checkpoint of step 6 resumed on the CPU: steps 7-10 and the final weights within $LOSS_RTOL_BF16 of the cuda run"; pass=$((pass + 1))
else echo "FAIL cuda checkpoint resumed on the CPU: $(grep -E '^resume|llmtrain:' "$TMP/rs-cpu.out" | head -2) $(head -3 "$TMP/rs-cpu.cmp" 2>/dev/null)"; fail=$((fail + 1)); fi

# log.profile_steps on cuda: steps 2-3 of a bf16 Llama run (the fused
# attention, whose bits repeat) timed by events on the compute stream; the
# same calls and FLOPs per kernel-table entry as the CPU's profile of the
# job (the norms' least traffic counting their bf16 outputs at 2 bytes and
# the residual gradient's bf16 copy, AdamW's the bf16 copies it writes
# beside the weights: 30 bytes a weight to the CPU's 28, so the trainer took
# those paths), every call timed within
# the steps' wall time, and the run bit-identical to the same run unprofiled
pjob=("$TMP/llama.json" --set train.steps=4 --set train.compute_dtype=bf16 --set train.attention_kernel=flash --set eval.sample_tokens=0)
for p in cpu:2 cuda:2 cuda:0; do
    $BIN "${pjob[@]}" --set train.device=${p%:*} --set log.profile_steps=${p#*:} --set log.dir="$TMP/prof-${p/:/-}" \
        >"$TMP/prof-${p/:/-}.out" 2>&1 || echo "  profile run $p exited non-zero: $(grep llmtrain: "$TMP/prof-${p/:/-}.out" | head -2)"
done
if $PY - "$TMP/prof-cpu-2/profile.json" "$TMP/prof-cuda-2/profile.json" "$TMP/prof-cuda-2.out" <<'PYEOF' &&
import json, sys
c, g = (json.load(open(p)) for p in sys.argv[1:3])
# the memory bandwidth: the device's (2 x memory clock x bus width; the
# emulation reports an H100 SXM's 2619 MHz x 5120 bits), none on the CPU
emu = "host emulation of CUDA" in open(sys.argv[3]).read()
bw = g["peak_gbs"] > 100 and c["peak_gbs"] == 0 and (not emu or abs(g["peak_gbs"] - 3352.32) < 1e-6)
print(f"  memory bandwidth peak {g['peak_gbs']:.6g} GB/s" + ("" if bw else " (wrong)"))
key = lambda p: {e["name"]: (e["calls"], e["flops"]) for e in p["entries"]}
ms = sum(e["ms"] for e in g["entries"])
# the least traffic counts bf16 [a] buffers at 2 bytes: the norms' outputs (N = 4 x 64 rows of 64)
cb, gb = ({e["name"]: (e["calls"], e["bytes"]) for e in p["entries"]} for p in (c, g))
n, bc = cb["rmsnorm_forward"]
ok = gb["rmsnorm_forward"][1] == bc - 2 * 256 * 64 * n
# and the norms' backward writes the residual gradient's bf16 copy beside it
# (2 bytes an element; the job's 2 layers: 5 norm backwards a micro-batch,
# all but layer 0's first), which the CPU does not hold
nb, bb = cb["rmsnorm_backward"]
ok = ok and gb["rmsnorm_backward"][1] == bb + 2 * 256 * 64 * (nb // 5 * 4)
ok = ok and all(gb[k][1] <= cb[k][1] for k in cb if k not in ("adamw_multi", "rmsnorm_backward"))
ok = ok and gb["adamw_multi"][1] * 28 == cb["adamw_multi"][1] * 30
ok = ok and bw and (g["backend"] == "cuda" and c["backend"] == "cpu" and key(c) == key(g) and g["first_step"] == 2 and g["steps"] == 2
      and all(e["ms"] >= 0 for e in g["entries"]) and 0 < ms <= g["wall_ms"] * (1 + 1e-6))
print(f"  {len(key(g))} entries, {sum(v[0] for v in key(g).values())} calls; {ms:.2f} of {g['wall_ms']:.2f} ms timed")
sys.exit(0 if ok else 1)
PYEOF
   grep -q "^profile: steps 2-3 (2 steps): .* (timed on the CUDA compute stream)" "$TMP/prof-cuda-2.out" &&
   $PY tests/check_profile_table.py "$TMP/prof-cuda-2.out" "$TMP/prof-cuda-2/profile.json" >/dev/null &&
   grep -q "^profile: at the peaks" "$TMP/prof-cuda-2.out" &&
   $PY tests/compare_runs.py "$TMP/prof-cuda-0" "$TMP/prof-cuda-2" --steps 4 --exact >/dev/null; then
    echo "ok   log.profile_steps on cuda: the CPU's calls and FLOPs per entry, timed on the compute stream, the GB/s against the device's memory bandwidth, the run's bits unchanged"; pass=$((pass + 1))
else echo "FAIL log.profile_steps on cuda: $(grep '^profile: steps' "$TMP/prof-cuda-2.out")"; fail=$((fail + 1)); fi
# ... and under fp8: the layers' linears in their _fp8 entries
# (tests/check_profile_fp8.py: each entry's calls and FLOPs those of the
# bf16 run above, split) rated at twice the bf16 dense peak, every printed
# figure as profile.json says
$BIN "${pjob[@]}" --set train.device=cuda --set train.compute_dtype=fp8 --set log.profile_steps=2 --set log.dir="$TMP/prof-fp8" \
    >"$TMP/prof-fp8.out" 2>&1 || echo "  profile run fp8 exited non-zero: $(grep llmtrain: "$TMP/prof-fp8.out" | head -2)"
if t=$($PY tests/check_profile_fp8.py "$TMP/prof-cuda-2/profile.json" "$TMP/prof-fp8/profile.json" 2) &&
   $PY tests/check_profile_table.py "$TMP/prof-fp8.out" "$TMP/prof-fp8/profile.json" >/dev/null; then
    echo "ok   log.profile_steps on cuda under fp8: $t"; pass=$((pass + 1))
else echo "FAIL log.profile_steps on cuda under fp8: ${t:-} $(grep '^profile: matrix' "$TMP/prof-fp8.out")"; fail=$((fail + 1)); fi

# multi-rank: NCCL (2 GPUs or more) or the refusal (1 GPU)
ngpu=${GPU_COUNT:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
# same_comm_bytes RUN_A RUN_B: identical comm_bytes in every step line
same_comm_bytes() {
    $PY - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PYEOF'
import json, sys
def cb(p): return [(d["step"], d["comm_bytes"]) for d in map(json.loads, open(p)) if "comm_bytes" in d]
a, b = cb(sys.argv[1]), cb(sys.argv[2])
sys.exit(0 if a == b and a else 1)
PYEOF
}
if [ "${ngpu:-0}" -ge 2 ]; then
    # fullshard-bf16: bf16 working weights, all-gathered as bf16 words (ncclBfloat16 against MPI_UINT16_T)
    # tp2-sp: sequence parallelism's all-gathers and reduce-scatters on the TP group
    for case in noshard:NO_SHARD:1:fp32 fullshard:FULL_SHARD:1:fp32 fullshard-bf16:FULL_SHARD:1:bf16 tp2:NO_SHARD:2:fp32 \
                tp2-sp:NO_SHARD:2:fp32:true; do
        IFS=: read -r name strat tp pdt sp <<<"$case"
        ok_runs=1
        for dev in cpu cuda; do
            if ! LLMTRAIN_COMM_TRACE="$TMP/trace-$name-$dev" timeout 600 $MPIRUN 2 -x LLMTRAIN_COMM_TRACE $BIN "$TMP/llama.json" \
                 --set train.device=$dev --set train.compute_dtype=tf32 --set parallel.strategy=$strat \
                 --set parallel.tensor=$tp --set train.param_dtype=$pdt --set parallel.sequence_parallel=${sp:-false} \
                 --set log.dir="$TMP/mr-$name-$dev" --set checkpoint.dir="$TMP/mr-$name-$dev/ckpt" \
                 >"$TMP/mr-$name-$dev.out" 2>&1; then
                echo "FAIL 2 ranks $name train.device=$dev exited non-zero: $(grep -E 'llmtrain:|NCCL' "$TMP/mr-$name-$dev.out" | head -3)"
                fail=$((fail + 1)); ok_runs=0
            fi
        done
        [ $ok_runs = 1 ] || continue
        if grep -q "backend cuda, collectives NCCL" "$TMP/mr-$name-cuda.out"; then
            echo "ok   2 ranks $name: $(grep -o 'backend cuda.*' "$TMP/mr-$name-cuda.out" | cut -c1-120)"; pass=$((pass + 1))
        else echo "FAIL 2 ranks $name: the header does not name NCCL: $(head -1 "$TMP/mr-$name-cuda.out")"; fail=$((fail + 1)); fi
        if $PY tests/compare_runs.py "$TMP/mr-$name-cpu" "$TMP/mr-$name-cuda" --steps $STEPS --loss-rtol $LOSS_RTOL; then
            echo "ok   2 ranks $name: $STEPS steps NCCL vs MPI on the CPU, loss/grad norm/val loss within $LOSS_RTOL"; pass=$((pass + 1))
        else echo "FAIL 2 ranks $name: NCCL and CPU loss trajectories differ by more than $LOSS_RTOL"; fail=$((fail + 1)); fi
        if same_comm_bytes "$TMP/mr-$name-cpu" "$TMP/mr-$name-cuda"; then
            echo "ok   2 ranks $name: comm_bytes per step identical on NCCL and MPI"; pass=$((pass + 1))
        else echo "FAIL 2 ranks $name: comm_bytes differ between NCCL and MPI"; fail=$((fail + 1)); fi
    done
    # NO_SHARD's gradient all-reduces start chunk by chunk in the backward
    # (NCCL: queued on the communication stream, waited for by the compute
    # stream after it), as on MPI
    for dev in cpu cuda; do
        if msg=$($PY tests/check_comm_trace.py "$TMP/trace-noshard-$dev" "$TMP/trace-fullshard-$dev" 2 $STEPS 4 2>&1); then
            echo "ok   2 ranks train.device=$dev: $msg"; pass=$((pass + 1))
        else echo "$msg (train.device=$dev)"; fail=$((fail + 1)); fi
    done
    # HYBRID_SHARD, 2 shards x 2 replicas (4 GPUs), 2 micro-batches a step:
    # each chunk's shard all-reduced over the replicas once its last
    # reduce-scatter is waited for (NCCL: the shard and replicate groups'
    # collectives share the communication stream, in one order on every
    # rank), as on MPI; the run is MPI's on the CPU
    if [ "$ngpu" -ge 4 ]; then
        ok_runs=1
        for dev in cpu cuda; do
            LLMTRAIN_COMM_TRACE="$TMP/trace-hybrid-$dev" timeout 600 $MPIRUN 4 -x LLMTRAIN_COMM_TRACE $BIN "$TMP/llama.json" \
                --set train.device=$dev --set train.compute_dtype=tf32 --set parallel.strategy=HYBRID_SHARD \
                --set parallel.shard_degree=2 --set train.micro_batch=1 --set log.dir="$TMP/mr-hybrid-$dev" \
                --set checkpoint.dir="$TMP/mr-hybrid-$dev/ckpt" >"$TMP/mr-hybrid-$dev.out" 2>&1 ||
                { echo "FAIL 4 ranks HYBRID_SHARD train.device=$dev exited non-zero: $(grep -E 'llmtrain:|NCCL' "$TMP/mr-hybrid-$dev.out" | head -3)"
                  fail=$((fail + 1)); ok_runs=0; }
        done
        if [ $ok_runs = 1 ]; then
            if grep -q "backend cuda, collectives NCCL" "$TMP/mr-hybrid-cuda.out" &&
               $PY tests/compare_runs.py "$TMP/mr-hybrid-cpu" "$TMP/mr-hybrid-cuda" --steps $STEPS --loss-rtol $LOSS_RTOL &&
               same_comm_bytes "$TMP/mr-hybrid-cpu" "$TMP/mr-hybrid-cuda"; then
                echo "ok   4 ranks HYBRID_SHARD 2 x 2 on NCCL: $STEPS steps within $LOSS_RTOL of MPI on the CPU, the same comm_bytes"; pass=$((pass + 1))
            else echo "FAIL 4 ranks HYBRID_SHARD 2 x 2: NCCL's run is not MPI's on the CPU (or names no NCCL)"; fail=$((fail + 1)); fi
            for dev in cpu cuda; do
                if msg=$($PY tests/check_comm_trace.py --hybrid "$TMP/trace-hybrid-$dev" 4 $STEPS 4 2>&1); then
                    echo "ok   4 ranks train.device=$dev: $msg"; pass=$((pass + 1))
                else echo "$msg (train.device=$dev)"; fail=$((fail + 1)); fi
            done
        fi
    else
        echo "note HYBRID_SHARD on NCCL is left out: 2 shards x 2 replicas needs 4 GPUs, this machine has $ngpu"
    fi
    # sequence parallelism with bf16 activations: the norms' outputs are
    # all-gathered as bf16 words (ncclBfloat16); the run is tp 2's without
    # it but for the order of the norms' weight-gradient sums
    sp_ok=1
    for sp in false true; do
        timeout 600 $MPIRUN 2 $BIN "$TMP/llama.json" --set train.device=cuda --set train.compute_dtype=bf16 --set parallel.tensor=2 \
            --set parallel.sequence_parallel=$sp --set log.dir="$TMP/mr-sp-$sp" --set checkpoint.dir="$TMP/mr-sp-$sp/ckpt" \
            >"$TMP/mr-sp-$sp.out" 2>&1 || { echo "FAIL 2 ranks tp 2 bf16 sequence_parallel $sp run: $(grep -E 'llmtrain:|NCCL' "$TMP/mr-sp-$sp.out" | head -2)"; sp_ok=0; }
    done
    if [ $sp_ok = 1 ] && $PY tests/compare_runs.py "$TMP/mr-sp-false" "$TMP/mr-sp-true" --steps $STEPS --loss-rtol 1e-4 &&
       grep '"loss"' "$TMP/mr-sp-true/metrics.jsonl" | tail -1 | grep -q '"tp_allgather":[1-9]'; then
        echo "ok   2 ranks tp 2 bf16: sequence parallel (bf16 all-gathers) matches tensor parallel alone to 1e-4"; pass=$((pass + 1))
    else echo "FAIL 2 ranks tp 2 bf16: sequence parallel differs from tensor parallel alone"; fail=$((fail + 1)); fi
    # the weights' bf16 copies under FULL_SHARD with 4 layers: the layers share 2
    # pool slots, so a slot's weights change at each gather; with the copies
    # the run must be the one without them
    wc_ok=1
    for wc in 1 0; do
        LLMTRAIN_CUDA_WEIGHT_CACHE=$wc timeout 600 $MPIRUN 2 $BIN "$TMP/llama.json" --set train.device=cuda --set train.compute_dtype=bf16 \
            --set parallel.strategy=FULL_SHARD --set model.n_layer=4 --set log.dir="$TMP/mr-wc-$wc" \
            --set checkpoint.dir="$TMP/mr-wc-$wc/ckpt" >"$TMP/mr-wc-$wc.out" 2>&1 ||
            { echo "FAIL 2 ranks weight copies $wc run: $(grep -E 'llmtrain:|NCCL' "$TMP/mr-wc-$wc.out" | head -2)"; wc_ok=0; }
    done
    if [ $wc_ok = 1 ] && $PY tests/compare_runs.py "$TMP/mr-wc-0" "$TMP/mr-wc-1" --steps $STEPS --loss-rtol 1e-7; then
        echo "ok   2 ranks FULL_SHARD, 4 layers in 2 pool slots, bf16: the run with the weights' bf16 copies is the run without, to 1e-7"; pass=$((pass + 1))
    else echo "FAIL 2 ranks FULL_SHARD bf16: the run with the weights' bf16 copies differs from the run without"; fail=$((fail + 1)); fi
    # context parallelism, cp 2 (each rank 32 of the 64 tokens of every
    # sequence): the ring's k|v blocks and fp32 gradients over ncclSend /
    # ncclRecv, overlapped with the attention part kernels, and all_gather's
    # ncclAllGather / ncclReduceScatter, against the same 2-rank jobs on
    # the CPU (MPI) under TF32 ([a] fp32: the same bytes a step); the ring
    # under bf16 (the default: bf16 blocks, the part kernels against 1
    # GPU's cuDNN attention) against the 1-GPU bf16 run
    for mode in ring all_gather; do
        ok_runs=1
        for dev in cpu cuda; do
            timeout 600 $MPIRUN 2 $BIN "$TMP/llama.json" --set train.device=$dev --set train.compute_dtype=tf32 \
                --set parallel.context=2 --set parallel.context_mode=$mode --set log.dir="$TMP/mr-cp-$mode-$dev" \
                --set checkpoint.dir="$TMP/mr-cp-$mode-$dev/ckpt" >"$TMP/mr-cp-$mode-$dev.out" 2>&1 ||
                { echo "FAIL 2 ranks cp 2 $mode train.device=$dev exited non-zero: $(grep -E 'llmtrain:|NCCL' "$TMP/mr-cp-$mode-$dev.out" | head -3)"
                  fail=$((fail + 1)); ok_runs=0; }
        done
        [ $ok_runs = 1 ] || continue
        if grep -q "backend cuda, collectives NCCL" "$TMP/mr-cp-$mode-cuda.out" &&
           $PY tests/compare_runs.py "$TMP/mr-cp-$mode-cpu" "$TMP/mr-cp-$mode-cuda" --steps $STEPS --loss-rtol $LOSS_RTOL &&
           same_comm_bytes "$TMP/mr-cp-$mode-cpu" "$TMP/mr-cp-$mode-cuda"; then
            echo "ok   2 ranks cp 2 $mode on NCCL: $STEPS steps within $LOSS_RTOL of MPI on the CPU, the same comm_bytes"; pass=$((pass + 1))
        else echo "FAIL 2 ranks cp 2 $mode: NCCL's run is not MPI's on the CPU (or names no NCCL, or other comm_bytes)"; fail=$((fail + 1)); fi
    done
    if timeout 600 $MPIRUN 2 $BIN "$TMP/llama.json" --set train.device=cuda --set parallel.context=2 --set log.dir="$TMP/mr-cp-bf16" \
           --set checkpoint.dir="$TMP/mr-cp-bf16/ckpt" >"$TMP/mr-cp-bf16.out" 2>&1 &&
       grep -q "backend cuda, collectives NCCL" "$TMP/mr-cp-bf16.out" &&
       $PY tests/compare_runs.py "$TMP/llama-cuda-bf16" "$TMP/mr-cp-bf16" --steps $STEPS --loss-rtol $LOSS_RTOL_BF16; then
        echo "ok   2 ranks cp 2 ring under bf16 on NCCL: $STEPS steps within $LOSS_RTOL_BF16 of 1 GPU's bf16 run"; pass=$((pass + 1))
    else echo "FAIL 2 ranks cp 2 bf16: $(grep -E 'llmtrain:|NCCL' "$TMP/mr-cp-bf16.out" | head -2)"; fail=$((fail + 1)); fi
    # checkpoint and resume under FULL_SHARD on NCCL: each rank saves and
    # reloads its own shard of the master weights and moments
    if resume_case fs 2 --set parallel.strategy=FULL_SHARD; then
        echo "ok   2 ranks FULL_SHARD on NCCL, rank 1 killed at step 8: resumed from step 6, losses and weights bit-identical"; pass=$((pass + 1))
    else echo "FAIL 2 ranks FULL_SHARD resume on NCCL: the resumed run is not the uninterrupted one"; fail=$((fail + 1)); fi
    $MPIRUN 2 $BIN "$TMP/llama.json" --set train.steps=2 --set optim.warmup_steps=0 --set log.dir="$TMP/mr-auto" --set checkpoint.dir="$TMP/mr-auto/ckpt" \
        >"$TMP/mr-auto.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "backend cuda, collectives NCCL" "$TMP/mr-auto.out"; then
        echo "ok   2 ranks, train.device=auto on $ngpu GPUs: backend cuda with NCCL"; pass=$((pass + 1))
    else echo "FAIL 2 ranks auto: exit $rc: $(grep -E 'backend|llmtrain:' "$TMP/mr-auto.out" | head -2)"; fail=$((fail + 1)); fi
    # a torchrun-style launch (no MPI): NCCL bootstrapped over the TCP rendezvous, the MPI launch's run
    if [ "${GPU_TESTS_EMULATED:-0}" = 1 ]; then
        echo "note the launch without MPI is left out: the emulated NCCL runs over MPI"
    else
    trun mr-tr 2 $BIN "$TMP/llama.json" --set train.device=cuda --set train.compute_dtype=tf32 --set parallel.strategy=FULL_SHARD \
        --set log.dir="$TMP/mr-tr" --set checkpoint.dir="$TMP/mr-tr/ckpt" >"$TMP/mr-tr.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "backend cuda, collectives NCCL" "$TMP/mr-tr.out" && grep -q "^launch: torchrun-style" "$TMP/mr-tr.out" &&
       $PY tests/compare_runs.py "$TMP/mr-fullshard-cuda" "$TMP/mr-tr" --steps $STEPS --loss-rtol $LOSS_RTOL; then
        echo "ok   2 ranks FULL_SHARD launched without MPI: NCCL over the TCP bootstrap, the mpirun run's losses"; pass=$((pass + 1))
    else echo "FAIL torchrun-style NCCL launch: exit $rc: $(grep -E 'launch|llmtrain:|NCCL' "$TMP/mr-tr.out" | head -3)"; fail=$((fail + 1)); fi
    fi
    # a hung rank: both watchdogs fire (rank 0 waits on the device for NCCL), the communicators are aborted, exit 5
    t0=$(date +%s)
    LLMTRAIN_FAULT="rank=1,step=3,kind=hang" timeout 120 $MPIRUN 2 $BIN "$TMP/llama.json" --set train.device=cuda \
        --set parallel.timeout_s=5 --set log.dir="$TMP/mr-hang" --set checkpoint.dir="$TMP/mr-hang/ckpt" \
        >"$TMP/mr-hang.out" 2>"$TMP/mr-hang.err"; rc=$?
    secs=$(($(date +%s) - t0))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 40 ] &&
       grep -q '^llmtrain: rank [01]: watchdog: step 3 phase [a-z_]* (collective [A-Za-z_]*) exceeded parallel.timeout_s=5 s; aborting$' "$TMP/mr-hang.err"; then
        echo "ok   2 ranks on NCCL, rank 1 hung at step 3: exit $rc after ${secs}s: $(grep -m1 watchdog "$TMP/mr-hang.err")"; pass=$((pass + 1))
    else echo "FAIL NCCL hang: exit $rc after ${secs}s: $(grep llmtrain "$TMP/mr-hang.err" | head -3)"; fail=$((fail + 1)); fi
elif [ "${ngpu:-0}" -eq 1 ]; then
    # context parallelism over NCCL needs a GPU a context rank: not run here
    echo "note context parallelism on NCCL (cp 2 against MPI and 1 GPU) is left out: it needs 2 GPUs, this machine has 1;" \
         "the part kernels ran in $TEST_GPU above, the ring over NCCL runs on the host emulation (tests/test_cp.sh, tests/test_cuda_emu.sh)"
    # GPU images often have no Open MPI: there the torchrun-style launch (TCP)
    # takes its place. mpirun ends the other rank once rank 0 has said it
    # (one line); lib.sh's launcher ends no rank, so there each rank says
    # the same line
    if command -v mpirun >/dev/null; then lines=1; launch2() { $MPIRUN 2 "${@:2}"; }
    else lines=2; launch2() { trun "$1" 2 "${@:2}"; }; fi
    launch2 mr $BIN "$TMP/llama.json" --set train.device=cuda --set log.dir="$TMP/mr" >"$TMP/mr.out" 2>"$TMP/mr.err"; rc=$?
    if [ $rc -eq 2 ] && [ "$(grep -c '^llmtrain:' "$TMP/mr.err")" -eq $lines ] && [ "$(grep '^llmtrain:' "$TMP/mr.err" | sort -u | wc -l)" -eq 1 ] &&
       grep -q '^llmtrain: .*train.device "cuda": ranks 0 and 1 on host .* would share GPU GPU-[0-9a-f-]* (2 ranks on this node, 1 CUDA device visible to this rank; expected one GPU per rank' "$TMP/mr.err"; then
        echo "ok   2 ranks on 1 GPU refused: exit 2, $lines line(s): $(grep -m1 '^llmtrain:' "$TMP/mr.err")"; pass=$((pass + 1))
    else
        echo "FAIL 2 ranks on 1 GPU: exit $rc, expected 2 and one line naming the ranks and the GPU: $(head -c 300 "$TMP/mr.err")"; fail=$((fail + 1))
    fi
    launch2 mr-auto $BIN "$TMP/llama.json" --set train.steps=2 --set optim.warmup_steps=0 --set log.dir="$TMP/mr-auto" --set checkpoint.dir="$TMP/mr-auto/ckpt" \
        >"$TMP/mr-auto.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "backend cpu" "$TMP/mr-auto.out"; then
        echo "ok   2 ranks on 1 GPU, train.device=auto: the CPU on both"; pass=$((pass + 1))
    else echo "FAIL 2 ranks on 1 GPU, auto: exit $rc: $(grep -E 'backend|llmtrain:' "$TMP/mr-auto.out" | head -2)"; fail=$((fail + 1)); fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
