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

# model nodes tp shard_degree expected-parameters(M)
while read -r model nodes tp sdp params; do
    world=$((nodes * 8))
    out=$($BIN check "configs/llama2_$model.json" --world $world --set parallel.tensor=$tp --set parallel.shard_degree=$sdp 2>&1)
    rc=$?
    dp=$((world / tp))
    if [ $rc -eq 0 ] && echo "$out" | grep -q "^check: configs/llama2_$model.json: valid for $world ranks" &&
       echo "$out" | grep -q "^parallel: tensor $tp x data-parallel $dp | strategy HYBRID_SHARD: shard groups of $sdp x $((dp / sdp)) replicas" &&
       echo "$out" | grep -q "vocab 32000, ${params}M parameters" &&
       echo "$out" | grep -q "^batch: 1024 seqs x 4096 tokens = 4194304 tokens/step" &&
       echo "$out" | grep -q "^per rank (estimate): params_bytes [0-9]* .*optimizer_state_bytes [0-9]*"; then
        ok "llama2_$model on $nodes p4d nodes ($world ranks): tp $tp, sdp $sdp"
    else
        bad "llama2_$model on $nodes nodes: rc=$rc $out"
    fi
done <<'EOF'
7b 16 1 32 6738.42
7b 32 1 64 6738.42
7b 64 1 64 6738.42
7b 128 1 64 6738.42
13b 16 1 32 13015.86
13b 32 1 256 13015.86
13b 64 1 128 13015.86
13b 128 1 128 13015.86
70b 32 1 256 68976.65
70b 64 1 256 68976.65
70b 128 2 64 68976.65
EOF

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
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
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

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
