#!/bin/bash
# The Llama 2 configs: each parses and its layout is valid for every cluster of the
# SMP v2 scaling table (docs/config.md, "Llama 2 configs"), checked with `llmtrain check --world N`
# without allocating the model; the shapes are Llama 2's; `check` fails an impossible
# layout with the same line as training.
cd "$(dirname "$0")/.." || exit 2
BIN=./llmtrain
pass=0; fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# model nodes tp shard_degree activation_checkpointing offload expected-parameters(M):
# each row fits a p4d's A100 40GB by check's own estimate (exit 0, "fits")
while read -r model nodes tp sdp ckpt offload params; do
    world=$((nodes * 8))
    out=$($BIN check "configs/llama2_$model.json" --world $world --set parallel.tensor=$tp --set parallel.shard_degree=$sdp \
          --set train.activation_checkpointing=$ckpt --set train.activation_offload=$offload 2>&1)
    rc=$?
    dp=$((world / tp))
    if [ $rc -eq 0 ] && echo "$out" | grep -q "^check: configs/llama2_$model.json: valid for $world ranks" &&
       echo "$out" | grep -q "^parallel: tensor $tp x data-parallel $dp | strategy HYBRID_SHARD: shard groups of $sdp x $((dp / sdp)) replicas" &&
       echo "$out" | grep -q "vocab 32000, ${params}M parameters" &&
       echo "$out" | grep -q "^batch: 1024 seqs x 4096 tokens = 4194304 tokens/step" &&
       echo "$out" | grep -q "^per rank (estimate): params_bytes [0-9]* .*optimizer_state_bytes [0-9]*" &&
       echo "$out" | grep -q "^fit: ml.p4d.24xlarge: 8 x A100 40GB, 40.0 GiB a GPU; .* GiB a rank: fits, "; then
        ok "llama2_$model on $nodes p4d nodes ($world ranks): tp $tp, sdp $sdp, $ckpt checkpointing, offload $offload: $(echo "$out" | grep -o 'estimate [0-9.]* GiB a rank: fits.*')"
    else
        bad "llama2_$model on $nodes nodes: rc=$rc $out"
    fi
done <<'EOF'
7b 16 1 32 selective false 6738.42
7b 32 1 64 selective false 6738.42
7b 64 1 64 selective false 6738.42
7b 128 1 64 selective false 6738.42
13b 16 1 32 full true 13015.86
13b 32 1 256 full false 13015.86
13b 64 1 128 full false 13015.86
13b 128 1 128 full false 13015.86
70b 32 1 256 full true 68976.65
70b 64 1 256 full true 68976.65
70b 128 2 64 full false 68976.65
EOF

# every shipped config fits the hardware it names, by check's own estimate:
# the ranks its description gives (--world N) on its train.instance, which
# the description names too; a CPU job names no GPU and gets no fit line
for f in configs/*.json; do
    read -r world inst dev < <(/usr/bin/python3 -c '
import json, re, sys
j = json.load(open(sys.argv[1])); t = j.get("train", {}); d = j.get("description", "")
m = re.search(r"--world (\d+)", d)
print(m.group(1) if m else 1, t.get("instance", "-"), t.get("device", "auto"))' "$f")
    out=$($BIN check "$f" --world "$world" 2>&1); rc=$?
    if [ "$dev" = cpu ]; then
        if [ $rc -eq 0 ] && ! grep -q "^fit:" <<<"$out"; then ok "$f: a CPU job, no GPU to fit"; else bad "$f (cpu): rc=$rc $out"; fi
    elif [ "$inst" != - ] && [ $rc -eq 0 ] && grep -q "^description: .*${inst#ml.}" <<<"$out" &&
         grep -q "^fit: $inst: .* GiB a rank: fits, [0-9.]* GiB left$" <<<"$out"; then
        ok "$f on $world ranks of $inst: $(grep -o 'estimate [0-9.]* GiB a rank: fits.*' <<<"$out")"
    else
        bad "$f on $world ranks of '$inst': rc=$rc $out"
    fi
done

# the fit check: a job that does not fit its GPUs is exit 2 with one line on
# stderr; stdout says by how much (the estimate's bytes summed here, against
# 90% of the GPU) and lists the nearest layouts that fit, each of which
# check itself then passes with the GiB it was listed with
fitsum() { /usr/bin/python3 -c '
import re, sys
t = sys.stdin.read()
b = sum(int(x) for x in re.search(r"params_bytes (\d+) master_bytes (\d+) grads_bytes (\d+) optimizer_state_bytes (\d+) activations_bytes (\d+)", t).groups())
b += int(re.search(r"cuda_scratch_bytes (\d+)", t).group(1))
print(f"{b / 2**30:.1f} {(float(sys.argv[1]) * 0.9 * 2**30 - b) / 2**30:.1f}")' "$1"; }
out=$($BIN check configs/llama2_70b.json --world 1024 --set train.activation_checkpointing=selective 2>"$TMP/err"); rc=$?
read -r need left <<<"$(fitsum 40 <<<"$out")"
over=$(awk -v l="$left" 'BEGIN { printf "%.1f", -l }')
if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
   grep -q "llama2_70b.json: does not fit ml.p4d.24xlarge: 8 x A100 40GB: $need GiB a rank by the estimate, over the 36.0 GiB a rank may use" "$TMP/err" &&
   grep -q "^fit: ml.p4d.24xlarge: .* | estimate $need GiB a rank: does not fit, $over GiB over$" <<<"$out" &&
   grep -q "^fit: the nearest layouts that fit" <<<"$out"; then
    ok "70B with selective checkpointing on p4d: exit 2, $need GiB a rank, $over GiB over: $(cat "$TMP/err")"
else bad "70B selective on p4d: rc=$rc $(cat "$TMP/err") $out"; fi
n=0; good=0
while read -r sets; do
    want=$(sed 's/.*: \([0-9.]*\) GiB a rank.*/\1/' <<<"$sets")
    # shellcheck disable=SC2086
    o=$($BIN check configs/llama2_70b.json --world 1024 --set train.activation_checkpointing=selective ${sets%%:*} 2>&1)
    n=$((n + 1))
    grep -q "^fit: .* | estimate $want GiB a rank: fits, " <<<"$o" && good=$((good + 1))
done < <(grep '^  --set' <<<"$out" | sed 's/^  //')
if [ "$n" -ge 3 ] && [ "$good" -eq "$n" ] && grep -q "^  --set train.activation_checkpointing=full: 30.4 GiB a rank" <<<"$out"; then
    ok "70B on p4d: each of the $n nearest layouts listed fits when checked (first: full checkpointing)"
else bad "70B nearest layouts: $good of $n fit: $out"; fi
# the GPU's memory by flag (both option forms) and by key; the flag wins
out=$($BIN check configs/llama2_70b.json --world 1024 --set train.activation_checkpointing=selective --gpu-mem 96GiB 2>&1); rc=$?
read -r need left <<<"$(fitsum 96 <<<"$out")"
out2=$($BIN check configs/llama2_70b.json --world 1024 --instance=p5e.48xlarge 2>&1); rc2=$?
read -r need2 left2 <<<"$(fitsum 140.4013671875 <<<"$out2")"
if [ $rc -eq 0 ] && grep -q "^fit: --gpu-mem 96GiB, 96.0 GiB a GPU; a rank may use 86.4 GiB .* | estimate $need GiB a rank: fits, $left GiB left$" <<<"$out" &&
   [ $rc2 -eq 0 ] && grep -q "^fit: ml.p5e.48xlarge: 8 x H200 141GB, 140.4 GiB a GPU; .* | estimate $need2 GiB a rank: fits, $left2 GiB left$" <<<"$out2"; then
    ok "--gpu-mem 96GiB: $need GiB fits, $left GiB left; --instance=p5e.48xlarge over the job's train.instance: $left2 GiB left"
else bad "--gpu-mem / --instance: rc=$rc/$rc2 $out $out2"; fi
out=$($BIN check configs/llama2_7b.json --world 1024 --set train.gpu_mem=24GB 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "^fit: configs/llama2_7b.json: train.gpu_mem 24GB, 22.4 GiB a GPU; a rank may use 20.1 GiB" <<<"$out"; then
    ok "train.gpu_mem 24GB: 22.4 GiB, 7B at 25.8 GiB does not fit, exit 2"
else bad "train.gpu_mem 24GB: rc=$rc $out"; fi
expect_one() { # what rc-and-line-pattern command...
    local what=$1 pat=$2; shift 2
    "$@" >/dev/null 2>"$TMP/err"; local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "$pat" "$TMP/err"; then ok "$what: exit 2: $(cat "$TMP/err")"
    else bad "$what: rc=$rc $(cat "$TMP/err")"; fi
}
expect_one "--gpu-mem without a unit" '--gpu-mem: "40": expected a GPU.s memory as a number and a unit, such as 40GiB' $BIN check configs/llama2_7b.json --world 1024 --gpu-mem 40
expect_one "--gpu-mem without a value" '--gpu-mem: expected a value after it (a GPU.s memory, such as 40GiB)' $BIN check configs/llama2_7b.json --world 1024 --gpu-mem
expect_one "unknown --instance" '--instance: unknown instance type "ml.p9.48xlarge" (expected one of ml.p4d.24xlarge, ml.p4de.24xlarge, ml.p5.48xlarge, ml.p5e.48xlarge, ml.p5en.48xlarge, ml.g5.xlarge' $BIN check configs/llama2_7b.json --world 1024 --instance ml.p9.48xlarge
expect_one "unknown train.instance" 'llama2_7b.json: train.instance: unknown instance type "p3.2xlarge"' $BIN check configs/llama2_7b.json --world 1024 --set train.instance=p3.2xlarge

# each file as shipped is laid out for 128 nodes and says so
for model in 7b 13b 70b; do
    out=$($BIN check "configs/llama2_$model.json" --world 1024 2>&1)
    if [ $? -eq 0 ] && echo "$out" | grep -q "^description: .*128 ml.p4d.24xlarge nodes"; then
        ok "llama2_$model.json as shipped: valid for 1024 ranks, description names the cluster"
    else
        bad "llama2_$model.json as shipped: $out"
    fi
done
# the shapes and recipe, read from the files
if /usr/bin/python3 - <<'EOF'
import json
shapes = {"7b": (32, 4096, 32, 32, 11008), "13b": (40, 5120, 40, 40, 13824), "70b": (80, 8192, 64, 8, 28672)}
for name, (l, c, h, kv, f) in shapes.items():
    j = json.load(open(f"configs/llama2_{name}.json"))
    m, t, o = j["model"], j["train"], j["optim"]
    assert (m["n_layer"], m["n_embd"], m["n_head"], m["n_kv_head"], m["ffn_hidden"], m["vocab_size"]) == (l, c, h, kv, f, 32000), name
    assert (t["seq_len"], t["global_batch"]) == (4096, 1024), name
    assert (o["lr"], o["min_lr"], o["warmup_steps"], o["weight_decay"], o["grad_clip"]) == (3e-4, 3e-5, 2000, 0.1, 1.0), name
    assert (o["beta1"], o["beta2"], o["eps"]) == (0.9, 0.95, 1e-5), name
EOF
then ok "Llama 2 shapes (70B: 8 kv heads) and recipe (4M tokens, 3e-4 -> 3e-5, warmup 2000, wd 0.1, clip 1, betas 0.9/0.95, eps 1e-5)"
else bad "config shapes or recipe"; fi

# Llama 3.2 1B: its shape (1,235,814,400 parameters) and Llama 3's RoPE
# scaling. The file agrees with Meta's config.json as published with the
# weights (below, verbatim), so --set init.from=<that folder> takes it, and a
# folder whose scaling differs is refused naming the key.
mkdir -p "$TMP/l32" "$TMP/l32_x8"
cat >"$TMP/l32/config.json" <<'EOF'
{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
EOF
sed 's/"factor": 32.0/"factor": 8.0/' "$TMP/l32/config.json" >"$TMP/l32_x8/config.json"
line="model llama: 16 layers, 2048 embd, 32 heads (8 kv), ffn 8192, vocab 128256, 1235.81M parameters (tied embeddings), RoPE theta 500000 scaled llama3 (factor 32, low 1, high 4, original 8192)"
out=$($BIN check configs/llama3.2_1b.json --world 8 2>&1)
rc=$?
out2=$($BIN check configs/llama3.2_1b.json --world 8 --set init.from="$TMP/l32" 2>&1)
rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && echo "$out" | grep -qxF "$line" && echo "$out2" | grep -qxF "$line" &&
   echo "$out" | grep -q "^batch: 512 seqs x 8192 tokens = 4194304 tokens/step; micro 2 x accum 32 x dp 8 | world 8 | selective activation checkpointing (norm, mlp_act) |"; then
    ok "llama3.2_1b.json on 8 ranks: Llama 3.2 1B's shape and RoPE scaling, selective checkpointing of norm and mlp_act, alone and with init.from Meta's config.json"
else
    bad "llama3.2_1b.json: rc=$rc/$rc2 $out $out2"
fi
err=$($BIN check configs/llama3.2_1b.json --world 8 --set init.from="$TMP/l32_x8" 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q "model.rope_scaling_factor = 32 conflicts with init.from"; then
    ok "llama3.2_1b.json with init.from a folder scaled by 8: exit 2: $err"
else
    bad "llama3.2_1b.json with a folder scaled by 8: rc=$rc $err"
fi

# configs/qwen3_0.6b.json is Qwen/Qwen3-0.6B's shape: check alone and with init.from its
# config.json as published (a head_dim of 128 at 1024 wide and 16 heads, QK-norm); its parameter
# count is the model's, 596,049,920 (0.44B without the tied embedding)
mkdir -p "$TMP/q3"
cat >"$TMP/q3/config.json" <<'EOF'
{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
EOF
line="model llama: 28 layers, 1024 embd, 16 heads (8 kv), ffn 3072, vocab 151936, 596.05M parameters (tied embeddings), head_dim 128, QK-norm, RoPE theta 1e+06"
out=$($BIN check configs/qwen3_0.6b.json --world 8 2>&1); rc=$?
out2=$($BIN check configs/qwen3_0.6b.json --world 8 --set init.from="$TMP/q3" 2>&1); rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && echo "$out" | grep -qxF "$line" && echo "$out2" | grep -qxF "$line" &&
   echo "$out" | grep -q "fits"; then
    ok "qwen3_0.6b.json on 8 ranks: Qwen3-0.6B's shape (head_dim 128, QK-norm), alone and with init.from its config.json"
else
    bad "qwen3_0.6b.json: rc=$rc/$rc2 $out $out2"
fi
sed 's/"head_dim": 128/"head_dim": 64/' "$TMP/q3/config.json" >"$TMP/q3_64.json" && mkdir -p "$TMP/q3_64" && mv "$TMP/q3_64.json" "$TMP/q3_64/config.json"
err=$($BIN check configs/qwen3_0.6b.json --world 8 --set init.from="$TMP/q3_64" 2>&1 >/dev/null); rc=$?
if [ $rc -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q "model.head_dim = 128 conflicts with init.from"; then
    ok "qwen3_0.6b.json with init.from a folder of head_dim 64: exit 2: $err"
else
    bad "qwen3_0.6b.json with a head_dim 64 folder: rc=$rc $err"
fi

# an impossible layout: the same message as a training start, exit 2, one line
err=$($BIN check configs/llama2_70b.json --world 24 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
   echo "$err" | grep -q "parallel.shard_degree 64 does not divide the 12 data-parallel ranks (parallel.strategy HYBRID_SHARD)"; then
    ok "70B on 24 ranks: exit 2: $err"
else
    bad "70B on 24 ranks: rc=$rc $err"
fi
out=$($BIN check configs/llama2_7b.json --world 2 --set parallel.tensor=3 2>&1)
if [ $? -eq 2 ] && echo "$out" | grep -q "parallel.tensor 3 does not divide the 2 ranks"; then
    ok "tp 3 on 2 ranks rejected as in training"
else
    bad "tp 3 on 2 ranks: $out"
fi

# mixture of experts: check's moe line, its numbers computed here from the shapes
moe_line() { # moe_line CONFIG WORLD: check's moe line against the counts computed from the config
    /usr/bin/python3 - "$1" "$($BIN check "$1" --world "$2" 2>&1 | grep '^moe: ')" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1])); m = j["model"]; line = sys.argv[2]
ep = j.get("parallel", {}).get("expert", 1)
C, L, V, E, k, F = m["n_embd"], m["n_layer"], m["vocab_size"], m["moe_experts"], m["moe_top_k"], m["moe_ffn_hidden"]
hd = m.get("head_dim") or C // m["n_head"]
layer = 2 * C + (m["n_head"] + 2 * m["n_kv_head"]) * hd * C + m["n_head"] * hd * C + E * C + E * 3 * F * C
layer += 2 * hd if m.get("qk_norm") else 0
total = 2 * V * C + C + L * layer
active = total - L * (E - k) * 3 * F * C
fmt = lambda x: next(f"{x / s:.4g}{u}" for s, u in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"), (1, "")) if x >= s)
want = (f"moe: {E} experts, top-{k} renormalised, expert width {F}, {L} of {L} layers MoE | parameters {fmt(total)} total, "
        f"{fmt(active)} active a token (every rank holds every expert" + (f"; ep {ep} computes {E // ep} a rank)" if ep > 1 else ")"))
print(line if line == want else f"got '{line}', want '{want}'")
sys.exit(line != want)
PYEOF
}
for cw in "configs/mixtral_8x7b.json 64" "configs/qwen3_30b_a3b.json 32"; do
    # shellcheck disable=SC2086
    if out=$(moe_line $cw); then ok "$out"; else bad "${cw% *}: $out"; fi
done
if ! $BIN check configs/llama2_7b.json --world 1024 2>&1 | grep -q "^moe:"; then ok "a dense model has no moe line"
else bad "a dense model printed a moe line"; fi

# check's per-rank bytes of an MoE job against CPU runs' peak RSS. top-2
# and top-4 of 8 experts have the same parameters, and twice the MoE
# activations and scratch (the permuted rows, the experts' SwiGLU, their
# gradients): the peaks must differ by what the estimates differ by, within
# 5%. 16 experts instead of 8: params, grads and both Adam moments grow by
# exactly 4 x 4 bytes x the added experts' weights (and router rows). And no
# run peaks below its estimate plus a start-up's RSS (a 16-wide job).
/usr/bin/python3 - "$TMP/moe.bin" <<'PYEOF'
import sys, numpy as np
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, 40000)
open(sys.argv[1], "wb").write(h.tobytes() + np.random.default_rng(3).integers(0, 1024, 40000).astype(np.uint16).tobytes())
PYEOF
moe_job() { # moe_job NAME WIDTH EXPERTS TOP_K: a CPU job of 4 MoE layers (experts 512 wide; 16-wide: 8) on $TMP/moe.bin, one step
    cat >"$TMP/$1.json" <<JOB
{"model": {"arch": "llama", "n_layer": 4, "n_embd": $2, "n_head": 4, "n_kv_head": 2, "vocab_size": 1024, "max_seq_len": 256,
           "moe_experts": $3, "moe_top_k": $4, "moe_ffn_hidden": $(($2 * 2))},
 "data": {"train": "$TMP/moe.bin"},
 "train": {"steps": 1, "seq_len": $([ "$2" -gt 16 ] && echo 256 || echo 16), "micro_batch": 8, "global_batch": 8, "device": "cpu"},
 "optim": {"warmup_steps": 0}, "eval": {"sample_tokens": 0}, "parallel": {"health_check": false}}
JOB
}
rss() { /usr/bin/python3 -c 'import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); sys.exit(r.returncode) if r.returncode else print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)' "$@"; }
moe_job base 16 8 2; moe_job k2 256 8 2; moe_job k4 256 8 4; moe_job e16 256 16 2
for n in base k2 k4 e16; do
    $BIN check "$TMP/$n.json" | grep -o "^per rank (estimate): .*activations_bytes [0-9]*" >"$TMP/$n.est"
    [ $n = e16 ] || OMP_NUM_THREADS=1 rss $BIN "$TMP/$n.json" --set log.dir="$TMP/$n" --set checkpoint.dir="$TMP/$n/ck" >"$TMP/$n.rss"
done
if out=$(/usr/bin/python3 - "$TMP" <<'PYEOF'
import re, sys
d = sys.argv[1]
est = {n: [int(x) for x in re.findall(r"_bytes (\d+)", open(f"{d}/{n}.est").read())] for n in ("k2", "k4", "e16")}
peak = {n: int(open(f"{d}/{n}.rss").read() or 0) for n in ("base", "k2", "k4")}
M = 2**20
d_est, d_peak = sum(est["k4"]) - sum(est["k2"]), peak["k4"] - peak["k2"]
C, F, L = 256, 512, 4
d_state = sum(est["e16"][:4]) - sum(est["k2"][:4])
want_state = 4 * 4 * L * 8 * (3 * F * C + C)
low = all(sum(est[n]) <= peak[n] - peak["base"] for n in ("k2", "k4"))
print(f"top-4 over top-2: estimate +{d_est / M:.1f} MiB, peak RSS +{d_peak / M:.1f} MiB; 16 experts over 8: state "
      f"+{d_state / M:.1f} MiB (want {want_state / M:.1f}); top-2 estimate {sum(est['k2']) / M:.1f} MiB, peak "
      f"{(peak['k2'] - peak['base']) / M:.1f} over a start-up's {peak['base'] / M:.1f}")
sys.exit(0 if d_est > 100 * M and abs(d_peak - d_est) <= 0.05 * d_est and d_state == want_state and low else 1)
PYEOF
); then ok "MoE check estimate against CPU runs: $out"; else bad "MoE check estimate against CPU runs: $out"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
