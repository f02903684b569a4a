#!/bin/bash
# Bad input: every case must end with exit code 2 and exactly one line on
# stderr that names the culprit. Also: --set overrides, `keys` covers the
# key table of docs/config.md, and a good job exits 0.
cd "$(dirname "$0")/.." || exit 2
BIN=./llmtrain
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0; fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

# tiny data: 2000 byte tokens, header [20240520, 1, n]
$PY - "$TMP" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
def shard(path, toks, magic=20240520, version=1, count=None, dtype=np.uint16):
    h = np.zeros(256, np.int32); h[0] = magic; h[1] = version; h[2] = len(toks) if count is None else count
    with open(path, "wb") as f:
        f.write(h.tobytes()); f.write(np.asarray(toks, dtype).tobytes())
rng = np.random.default_rng(0)
t = rng.integers(0, 64, 2000)
shard(f"{d}/train.bin", t)
shard(f"{d}/badmagic.bin", t, magic=1234)
shard(f"{d}/trunc.bin", t, count=5000)
t2 = t.copy(); t2[1500] = 100
shard(f"{d}/oob.bin", t2)
shard(f"{d}/u32.bin", t, magic=20240801, version=7, dtype=np.uint32)
EOF

cat > "$TMP/job.json" <<EOF
{"model": {"arch": "llama", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_kv_head": 1, "vocab_size": 64, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 2, "seq_len": 16, "micro_batch": 2, "global_batch": 4},
 "eval": {"sample_tokens": 0},
 "log": {"dir": "$TMP/run"}, "checkpoint": {"dir": "$TMP/ckpt"}}
EOF

# expect_fail NAME SUBSTRING CMD... : exit 2, one stderr line containing SUBSTRING
expect_fail() {
    local name="$1" want="$2"; shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$? lines
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -ne 2 ]; then bad "$name: exit $rc, expected 2 ($(head -c 200 "$TMP/err"))"; return; fi
    if [ "$lines" -ne 1 ]; then bad "$name: $lines stderr lines, expected 1: $(head -c 300 "$TMP/err")"; return; fi
    if ! grep -qF -- "$want" "$TMP/err"; then bad "$name: stderr lacks '$want': $(cat "$TMP/err")"; return; fi
    ok "$name: $(cat "$TMP/err")"
}

# a good run first, so the cases below fail for the reason they name
if $BIN "$TMP/job.json" >"$TMP/out" 2>"$TMP/err"; then ok "good job exits 0"; else bad "good job failed: $(cat "$TMP/err")"; fi
if grep -q '"step":2' "$TMP/run/metrics.jsonl" 2>/dev/null; then ok "metrics.jsonl has step 2"; else bad "metrics.jsonl lacks step 2"; fi
# log.param_norm (default true): pnorm on each step line equal to metrics.jsonl's param_norm; false: neither
if $PY - "$TMP/out" "$TMP/run/metrics.jsonl" <<'PYEOF'
import json, re, sys
shown = [float(x) for x in re.findall(r"^step +\d+/2 \|.* \| norm [0-9.]+\*? \| pnorm ([0-9.]+) \|", open(sys.argv[1]).read(), re.M)]
logged = [l["param_norm"] for l in map(json.loads, open(sys.argv[2])) if "loss" in l]
assert len(shown) == 2 and len(logged) == 2 and all(abs(a - b) <= 0.005 for a, b in zip(shown, logged)) and logged[0] > 0, (shown, logged)
PYEOF
then ok "log.param_norm: pnorm on the step lines, param_norm in metrics.jsonl"; else bad "pnorm / param_norm: $(grep '^step' "$TMP/out")"; fi
if $BIN "$TMP/job.json" --set log.param_norm=false --set log.dir="$TMP/nopn" --set checkpoint.dir="$TMP/nopn/ckpt" >"$TMP/nopn.out" 2>&1 &&
   grep -q '^step     2/2 | loss' "$TMP/nopn.out" && ! grep -q pnorm "$TMP/nopn.out" && ! grep -q param_norm "$TMP/nopn/metrics.jsonl"; then
    ok "log.param_norm=false: no pnorm, no param_norm"
else bad "log.param_norm=false: $(grep '^step' "$TMP/nopn.out")"; fi

printf '{"model": {"arch": "llama",\n "n_layer": 1,, }}' >"$TMP/malformed.json"
expect_fail "malformed JSON" "malformed.json:2:" $BIN "$TMP/malformed.json"
expect_fail "missing job file" "nope.json" $BIN "$TMP/nope.json"
# a job file is strict JSON: what was found instead, and where
strict() { # strict NAME TEXT MESSAGE: a job file of TEXT (printf's) is refused with "NAME:MESSAGE"
    printf "$2" >"$TMP/$1"
    expect_fail "strict JSON: $1" "$1:$3 (a job file is strict JSON: one object, no comments, no trailing commas)" $BIN check "$TMP/$1"
}
strict line_comment.json '{\n  // the model\n  "model": {"n_layer": 2}\n}\n' "2:3: malformed JSON: a // comment"
strict block_comment.json '{"model": {"n_layer": 2, /* two */ "n_embd": 32}}' "1:26: malformed JSON: a /* */ comment"
strict trailing_comma.json '{"model": {"n_layer": 2,\n  "n_embd": 32,\n  },\n "data": {}}' "2:15: malformed JSON: a trailing comma before '}'"
strict trailing_comma_list.json '{"train": {"recompute_modules": ["norm",]}}' "1:40: malformed JSON: a trailing comma before ']'"
strict unquoted.json '{model: {"n_layer": 2}}' "1:2: malformed JSON: a key without double quotes"
strict job.toml '# the job\n\n[model]\nn_layer = 2\n' "3:1: not JSON: this looks like TOML: a [section] header ([model])"
strict key.toml 'description = "x"\n' '1:1: not JSON: this looks like TOML: key = value (description = "x")'
strict job.yaml '# the job\nmodel:\n  n_layer: 2\n' "2:1: not JSON: this looks like YAML: key: value (model:)"
strict empty.json '  \n' "1:1: not JSON: the file is empty"
strict plain.json '{"model": {"n_layer": 2 "n_embd": 3}}' "1:25: malformed JSON"
# the job file's JSON: one top-level object, each key once, nested (a dotted name is --set's)
printf '{"train": {"steps": 2}}\n  {"train": {"steps": 3}}' >"$TMP/trailing.json"
expect_fail "text after the top-level object" "trailing.json:2:3: malformed JSON: text after the top-level object (expected one JSON object)" $BIN check "$TMP/trailing.json"
$PY - "$TMP" <<'EOF'
import sys
d = sys.argv[1]
job = open(f"{d}/job.json").read().rstrip()[:-1]  # without its closing brace
open(f"{d}/dup_section.json", "w").write(job + ', "train": {"steps": -5}}')
open(f"{d}/dup_key.json", "w").write(job.replace('"steps": 2,', '"steps": 2, "steps": 3,') + "}")
open(f"{d}/dotted.json", "w").write(job + ', "train.steps": 5}')
EOF
expect_fail "duplicate section" "dup_section.json: duplicate key 'train' (expected each key once)" $BIN check "$TMP/dup_section.json"
expect_fail "duplicate key" "dup_key.json: duplicate key 'train.steps' (expected each key once)" $BIN check "$TMP/dup_key.json"
expect_fail "dotted key in the job file" "dotted.json: key 'train.steps': a dotted name is for --set (expected it nested: {\"train\": {\"steps\": ...}})" $BIN check "$TMP/dotted.json"
expect_fail "unknown key" "unknown key 'model.n_layers' (did you mean 'model.n_layer'?)" $BIN "$TMP/job.json" --set model.n_layers=2
expect_fail "unknown section" "unknown key 'trian.steps'" $BIN "$TMP/job.json" --set trian.steps=2
expect_fail "wrong type (string for int)" "model.n_layer: expected an integer" $BIN "$TMP/job.json" --set model.n_layer=two
expect_fail "wrong type (float for int)" "train.steps: expected an integer, got 2.5" $BIN "$TMP/job.json" --set train.steps=2.5
expect_fail "wrong type (bool)" "data.shuffle: expected true or false" $BIN "$TMP/job.json" --set data.shuffle=1
expect_fail "--set value with trailing text" 'train.steps: expected an integer, got "5abc"' $BIN "$TMP/job.json" --set train.steps=5abc
expect_fail "out of range" "optim.beta2: expected a value in" $BIN "$TMP/job.json" --set optim.beta2=1.5
expect_fail "negative" "model.n_layer: expected a value in [1," $BIN "$TMP/job.json" --set model.n_layer=0
expect_fail "bad enum" "model.arch: expected one of gpt2|llama" $BIN "$TMP/job.json" --set model.arch=bert
expect_fail "eval.sample_tokens past 2^20" "eval.sample_tokens: expected a value in [0, 1048576], got 2147483647" $BIN check "$TMP/job.json" --set eval.sample_tokens=2147483647
# init.seed is a JSON number, exact only up to 2^53: 2^53 + 1 read as 2^53 ran the seed 2^53's job
expect_fail "init.seed past 2^53 - 1" "init.seed: expected a value in [0, 9007199254740991], got 9007199254740992" $BIN check "$TMP/job.json" --set init.seed=9007199254740993
if $BIN check "$TMP/job.json" --set init.seed=9007199254740991 >"$TMP/out" 2>&1; then
    ok "check: init.seed 2^53 - 1 is valid"; else bad "check: init.seed 2^53 - 1: $(cat "$TMP/out")"; fi
expect_fail "empty checkpoint.resume" 'checkpoint.resume: expected auto, none or a checkpoint folder or root, got ""' $BIN check "$TMP/job.json" --set checkpoint.resume=
expect_fail "n_head not dividing n_embd" "model.n_head 3 does not divide model.n_embd 16 (expected a divisor, or model.head_dim set)" $BIN "$TMP/job.json" --set model.n_head=3
if $BIN check "$TMP/job.json" --set model.n_head=3 --set model.n_kv_head=1 --set model.head_dim=8 2>"$TMP/err" | grep -q "3 heads (1 kv), .*, head_dim 8"; then
    ok "model.head_dim 8 with 3 heads at n_embd 16: check passes and names head_dim 8"
else bad "model.head_dim 8 with 3 heads: $(cat "$TMP/err")"; fi
expect_fail "odd head_dim" "model.head_dim 7 (the head dimension) must be even for RoPE" $BIN check "$TMP/job.json" --set model.head_dim=7
expect_fail "head_dim with GPT-2" "model.head_dim 16: GPT-2's heads split n_embd (expected n_embd/n_head, or 0)" $BIN check "$TMP/job.json" --set model.arch=gpt2 --set model.n_kv_head=0 --set model.head_dim=16
expect_fail "qk_norm with GPT-2" "model.qk_norm true: GPT-2 has no QK-norm (expected false, or model.arch \"llama\")" $BIN check "$TMP/job.json" --set model.arch=gpt2 --set model.n_kv_head=0 --set model.qk_norm=true
expect_fail "n_kv_head not dividing n_head" "model.n_kv_head 4 does not divide model.n_head 6" $BIN "$TMP/job.json" --set model.n_embd=24 --set model.n_head=6 --set model.n_kv_head=4
expect_fail "seq_len > max_seq_len" "train.seq_len 32 exceeds model.max_seq_len 16" $BIN "$TMP/job.json" --set train.seq_len=32
expect_fail "global batch not divisible" "train.global_batch 5 is not a multiple of train.micro_batch 2" $BIN "$TMP/job.json" --set train.global_batch=5
# sizes that overflow an int: a micro-batch's tokens (at most 2^30) and micro_batch x ranks (the global batch)
expect_fail "micro-batch tokens past 2^30" "train.micro_batch 257 x train.seq_len 16711935 = 4294967295 tokens a micro-batch exceeds 1073741824 (2^30)" $BIN check "$TMP/job.json" --set model.max_seq_len=16711935 --set train.seq_len=16711935 --set train.micro_batch=257 --set train.global_batch=0
expect_fail "micro-batch tokens past 2^30 by one sequence" "train.micro_batch 65 x train.seq_len 16777216 = 1090519040 tokens a micro-batch exceeds" $BIN check "$TMP/job.json" --set model.max_seq_len=16777216 --set train.seq_len=16777216 --set train.micro_batch=65 --set train.global_batch=0
if $BIN check "$TMP/job.json" --set model.max_seq_len=16777216 --set train.seq_len=16777216 --set train.micro_batch=64 --set train.global_batch=0 >"$TMP/out" 2>&1; then
    ok "check: a micro-batch of 2^30 tokens is valid"; else bad "check: 64 x 2^24 tokens: $(cat "$TMP/out")"; fi
expect_fail "micro_batch x ranks past an int (check)" "train.micro_batch 1048576 x data-parallel ranks 4096 = 4294967296 sequences a step exceeds train.global_batch's maximum 2147483647" $BIN check "$TMP/job.json" --world 4096 --set train.micro_batch=1048576 --set train.global_batch=0
expect_fail "micro_batch x ranks above global_batch (check)" "train.global_batch 2097152 is not divisible by train.micro_batch 1048576 x data-parallel ranks 4096" $BIN check "$TMP/job.json" --world 4096 --set train.micro_batch=1048576 --set train.global_batch=2097152
expect_fail "missing data" "data.train: no file matches" $BIN "$TMP/job.json" --set data.train="$TMP/none*.bin"
expect_fail "bad magic" "bad magic 1234" $BIN "$TMP/job.json" --set data.train="$TMP/badmagic.bin"
expect_fail "truncated shard" "trunc.bin" $BIN "$TMP/job.json" --set data.train="$TMP/trunc.bin"
expect_fail "token id out of range" "token 100 at token offset 1500 >= model.vocab_size 64" $BIN "$TMP/job.json" --set data.train="$TMP/oob.bin" --set train.steps=40 --set checkpoint.resume=none
expect_fail "missing init folder" "config.json" $BIN "$TMP/job.json" --set init.from="$TMP/nohf"
expect_fail "unknown option" "unknown option '--bogus'" $BIN "$TMP/job.json" --bogus
# a first word that is no command: a job when it names a file, a path or a .json; else a mistyped command
expect_fail "mistyped command" "'chek' is not a command, nor a job file (did you mean 'check'?): the commands are check, export and keys, and \`llmtrain JOB.json\` trains" $BIN chek "$TMP/job.json"
expect_fail "'train' is no command" "'train' is not a command, nor a job file: the commands are check, export and keys" $BIN train "$TMP/job.json"
expect_fail "mistyped export" "'exprot' is not a command, nor a job file (did you mean 'export'?)" $BIN exprot "$TMP/ckpt" "$TMP/out_hf"
expect_fail "a bare .json that does not exist is a job file" "nope.json: cannot read job file" $BIN nope.json
cp "$TMP/job.json" "$TMP/jobnoext"
if (cd "$TMP" && "$OLDPWD/$BIN" jobnoext --set train.steps=1 --set log.dir="$TMP/noext" --set checkpoint.dir="$TMP/noext/ck" >"$TMP/noext.out" 2>&1) &&
   grep -q '"step":1' "$TMP/noext/metrics.jsonl"; then ok "a bare word naming a file (no .json) trains"
else bad "bare job file name: $(tail -2 "$TMP/noext.out")"; fi
# every option as --opt VALUE and --opt=VALUE
if $BIN check "$TMP/job.json" --world 2 --set train.micro_batch=1 >"$TMP/w_sp.out" 2>&1 &&
   $BIN check "$TMP/job.json" --world=2 --set=train.micro_batch=1 >"$TMP/w_eq.out" 2>&1 && cmp -s "$TMP/w_sp.out" "$TMP/w_eq.out" &&
   grep -q "valid for 2 ranks" "$TMP/w_eq.out"; then ok "check: --world=2 --set=k=v print what --world 2 --set k=v do"
else bad "--opt=value: $(head -2 "$TMP/w_eq.out")"; fi
expect_fail "--world= empty" "--world: expected a number of ranks in [1, 16777216], got ''" $BIN check "$TMP/job.json" --world=
expect_fail "--world without its value" "--world: expected a value after it (--world VALUE or --world=VALUE)" $BIN check "$TMP/job.json" --world
expect_fail "--world for training" "--world is llmtrain check's option: a training run takes its ranks from its launcher" $BIN "$TMP/job.json" --world=2
expect_fail "a second job file" "unexpected argument 'x.json': one job file only (usage: llmtrain check JOB.json" $BIN check "$TMP/job.json" x.json
# a directory or a FIFO where a file belongs: one line, never a wait for a
# FIFO's writer (timeout 20) or an allocation of a directory's "size"
mkfifo "$TMP/fifo"
mkdir -p "$TMP/hf_dir/config.json" "$TMP/ck_dir/step_00000001/manifest.json"
expect_fail "job file is a directory" "$TMP: cannot read job file (is a directory, expected a file)" timeout 20 $BIN check "$TMP"
expect_fail "job file is a FIFO" "fifo: cannot read job file (is a FIFO, expected a regular file)" timeout 20 $BIN check "$TMP/fifo"
expect_fail "data.train is a FIFO" "data.train: $TMP/fifo: not a regular file (expected a token shard)" timeout 20 $BIN "$TMP/job.json" --set data.train="$TMP/fifo"
expect_fail "data.val is a directory" "data.val: $TMP: not a regular file (expected a token shard)" timeout 20 $BIN "$TMP/job.json" --set data.val="$TMP"
expect_fail "data.vocab is a directory" "llmtrain: data.vocab: $TMP: cannot read vocab file (is a directory, expected a file)" timeout 20 $BIN "$TMP/job.json" --set data.vocab="$TMP"
expect_fail "data.vocab is a FIFO" "fifo: cannot read vocab file (is a FIFO, expected a regular file)" timeout 20 $BIN "$TMP/job.json" --set data.vocab="$TMP/fifo"
expect_fail "data.vocab missing" "llmtrain: data.vocab: $TMP/nope.bin: cannot read vocab file (" timeout 20 $BIN "$TMP/job.json" --set data.vocab="$TMP/nope.bin"
expect_fail "init.from config.json is a directory" "hf_dir/config.json: cannot read (is a directory, expected a file)" timeout 20 $BIN "$TMP/job.json" --set init.from="$TMP/hf_dir"
expect_fail "checkpoint manifest.json is a directory" "step_00000001/manifest.json: cannot read (is a directory, expected a file)" timeout 20 $BIN "$TMP/job.json" --set checkpoint.resume="$TMP/ck_dir/step_00000001"
# no GPU here (CPU-only build, or CUDA build without a device): one line, exit 2
# (tests/test_cuda_build.sh checks the exact wording of each case)
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || expect_fail "train.device=cuda without a usable GPU" "train.device" $BIN "$TMP/job.json" --set train.device=cuda
expect_fail "export of nothing" "no complete checkpoint" $BIN export "$TMP/empty" "$TMP/out_hf"

# RoPE scaling: each number only with the scalings that read it (the factor
# with llama3, linear and yarn, which need it; the original context with
# llama3 and yarn, which needs it; the betas, attention factor and truncate
# with yarn), a blend band and a ramp that exist, and none on GPT-2; a
# llama3, a linear and a yarn job train and resume from their own
# checkpoints, and a checkpoint of the unscaled job is another model's
expect_fail "bad rope_scaling" 'model.rope_scaling: expected one of none|llama3|linear|yarn, got "dynamic"' $BIN "$TMP/job.json" --set model.rope_scaling=dynamic
expect_fail "rope scaling number without llama3" 'model.rope_scaling_factor is set but model.rope_scaling is "none" (it applies only with "llama3", "linear" or "yarn")' $BIN "$TMP/job.json" --set model.rope_scaling_factor=32
expect_fail "llama3's number with linear scaling" 'model.rope_original_max_seq_len is set but model.rope_scaling is "linear" (it applies only with "llama3" or "yarn")' $BIN "$TMP/job.json" --set model.rope_scaling=linear --set model.rope_scaling_factor=2 --set model.rope_original_max_seq_len=4096
expect_fail "llama3's number with yarn" 'model.rope_low_freq_factor is set but model.rope_scaling is "yarn" (it applies only with "llama3")' $BIN "$TMP/job.json" --set model.rope_scaling=yarn --set model.rope_scaling_factor=2 --set model.rope_original_max_seq_len=8 --set model.rope_low_freq_factor=2
expect_fail "yarn's number with llama3" 'model.rope_truncate is set but model.rope_scaling is "llama3" (it applies only with "yarn")' $BIN "$TMP/job.json" --set model.rope_scaling=llama3 --set model.rope_truncate=false
expect_fail "yarn's attention factor without scaling" 'model.rope_attention_factor is set but model.rope_scaling is "none" (it applies only with "yarn")' $BIN "$TMP/job.json" --set model.rope_attention_factor=1.2
expect_fail "linear scaling on GPT-2" 'model.rope_scaling "linear": GPT-2 has no RoPE' $BIN "$TMP/job.json" --set model.arch=gpt2 --set model.rope_scaling=linear --set model.rope_scaling_factor=2
expect_fail "yarn on GPT-2" 'model.rope_scaling "yarn": GPT-2 has no RoPE' $BIN "$TMP/job.json" --set model.arch=gpt2 --set model.rope_scaling=yarn --set model.rope_scaling_factor=2 --set model.rope_original_max_seq_len=8
expect_fail "linear scaling without its factor" 'model.rope_scaling "linear" needs model.rope_scaling_factor (the interpolation factor' $BIN "$TMP/job.json" --set model.rope_scaling=linear
expect_fail "yarn without its factor" 'model.rope_scaling "yarn" needs model.rope_scaling_factor (the extension factor' $BIN "$TMP/job.json" --set model.rope_scaling=yarn --set model.rope_original_max_seq_len=8
expect_fail "yarn without its original context" 'model.rope_scaling "yarn" needs model.rope_original_max_seq_len (the context the model was trained at' $BIN "$TMP/job.json" --set model.rope_scaling=yarn --set model.rope_scaling_factor=2
expect_fail "yarn beta_fast <= beta_slow" "model.rope_beta_fast 2 must exceed model.rope_beta_slow 4" $BIN "$TMP/job.json" --set model.rope_scaling=yarn --set model.rope_scaling_factor=2 --set model.rope_original_max_seq_len=8 --set model.rope_beta_fast=2 --set model.rope_beta_slow=4
expect_fail "rope_high_freq_factor <= rope_low_freq_factor" "model.rope_high_freq_factor 1 must exceed model.rope_low_freq_factor 1" $BIN "$TMP/job.json" --set model.rope_scaling=llama3 --set model.rope_high_freq_factor=1
expect_fail "rope scaling on GPT-2" 'model.rope_scaling "llama3": GPT-2 has no RoPE' $BIN "$TMP/job.json" --set model.arch=gpt2 --set model.rope_scaling=llama3
expect_fail "resume with another rope scaling" "was written for another model (checkpoint vs job: model.rope_scaling none vs llama3)" $BIN "$TMP/job.json" --set model.rope_scaling=llama3
for kind in llama3 linear yarn; do
    RS=(--set model.rope_scaling=$kind --set model.rope_scaling_factor=32 --set checkpoint.dir="$TMP/ckpt_$kind" --set log.dir="$TMP/run_$kind")
    [ $kind != linear ] && RS+=(--set model.rope_original_max_seq_len=8)
    if $BIN "$TMP/job.json" "${RS[@]}" >"$TMP/out" 2>"$TMP/err" && $BIN "$TMP/job.json" "${RS[@]}" --set train.steps=3 --set optim.override_schedule=true >"$TMP/out2" 2>&1 &&
       grep -q "resume: .*step_00000002 at step 2" "$TMP/out2" && grep -q '"step":3' "$TMP/run_$kind/metrics.jsonl" &&
       grep -q "scaled $kind (factor 32" "$TMP/out2" &&
       { [ $kind != yarn ] || grep -q "scaled yarn (factor 32, original 8, beta 32/1, attention factor 1.347)" "$TMP/out2"; }; then
        ok "a rope_scaling $kind job trains 2 steps and a 3-step run resumes from its checkpoint"
    else bad "rope_scaling $kind train + resume: $(cat "$TMP/err"; grep -E 'resume|error' "$TMP/out2" | head -3)"; fi
done
expect_fail "resume a yarn checkpoint with another attention factor" "was written for another model (checkpoint vs job: model.rope_attention_factor 0 vs 1.2)" $BIN "$TMP/job.json" --set model.rope_scaling=yarn --set model.rope_scaling_factor=32 --set model.rope_original_max_seq_len=8 --set model.rope_attention_factor=1.2 --set checkpoint.dir="$TMP/ckpt_yarn" --set log.dir="$TMP/run_yarn"

# block-causal attention, the loss mask and reset positions: each needs the
# document end token, the token only with one of them, and one the model has (tests/test_torch.py checks the masked
# model against PyTorch; tests/test_kernels.c and tests/test_gpu.c the kernels)
expect_fail "block_causal without data.eod_token" 'train.attention_mask "block_causal" needs data.eod_token (the token that ends a document; got -1)' $BIN "$TMP/job.json" --set train.attention_mask=block_causal
expect_fail "data.eod_token that nothing uses" 'data.eod_token is set but unused (it applies with train.attention_mask "block_causal", train.eod_mask_loss true or train.reset_position_ids true; got "causal", false and false)' $BIN "$TMP/job.json" --set data.eod_token=3
expect_fail "reset_position_ids without data.eod_token" 'train.reset_position_ids needs data.eod_token (the token that ends a document; got -1)' $BIN "$TMP/job.json" --set train.reset_position_ids=true
expect_fail "reset_position_ids: data.eod_token past the vocabulary" "data.eod_token 64 is not a token of the model (expected below model.vocab_size 64)" $BIN "$TMP/job.json" --set train.reset_position_ids=true --set data.eod_token=64
expect_fail "eod_mask_loss without data.eod_token" 'train.eod_mask_loss needs data.eod_token (the token that ends a document; got -1)' $BIN "$TMP/job.json" --set train.eod_mask_loss=true
expect_fail "eod_mask_loss: data.eod_token past the vocabulary" "data.eod_token 64 is not a token of the model (expected below model.vocab_size 64)" $BIN "$TMP/job.json" --set train.eod_mask_loss=true --set data.eod_token=64
expect_fail "data.eod_token past the vocabulary" "data.eod_token 64 is not a token of the model (expected below model.vocab_size 64)" $BIN "$TMP/job.json" --set train.attention_mask=block_causal --set data.eod_token=64
expect_fail "bad attention_mask" 'train.attention_mask: expected one of causal|block_causal, got "document"' $BIN "$TMP/job.json" --set train.attention_mask=document

# the LR schedule: a known style, wsd's keys only with wsd, and a wsd decay
# that has a length and fits after the warmup (tests/test_torch.py checks
# every style's values against PyTorch's schedulers)
expect_fail "bad lr_decay_style" 'optim.lr_decay_style: expected one of cosine|linear|constant|inverse_sqrt|wsd, got "step"' $BIN "$TMP/job.json" --set optim.lr_decay_style=step
expect_fail "wsd_decay_steps without wsd" 'optim.wsd_decay_steps is set but optim.lr_decay_style is "linear" (it applies only with "wsd")' $BIN "$TMP/job.json" --set optim.lr_decay_style=linear --set optim.wsd_decay_steps=2
expect_fail "wsd_decay_style without wsd" 'optim.wsd_decay_style is set but optim.lr_decay_style is "cosine"' $BIN "$TMP/job.json" --set optim.wsd_decay_style=cosine
expect_fail "wsd without wsd_decay_steps" 'optim.lr_decay_style "wsd" needs optim.wsd_decay_steps > 0' $BIN "$TMP/job.json" --set optim.lr_decay_style=wsd
expect_fail "wsd decay longer than decay_steps - warmup_steps" "optim.wsd_decay_steps 9 exceeds optim.decay_steps 10 - optim.warmup_steps 2 (the decay would begin before the warmup ends)" $BIN "$TMP/job.json" --set optim.lr_decay_style=wsd --set optim.wsd_decay_steps=9 --set optim.decay_steps=10 --set optim.warmup_steps=2
expect_fail "cosine decay_steps below warmup_steps" "optim.decay_steps 5 is below optim.warmup_steps 10 (the cosine decay would end before the warmup does)" $BIN check "$TMP/job.json" --set optim.decay_steps=5 --set optim.warmup_steps=10
expect_fail "linear decay_steps below warmup_steps" "optim.decay_steps 5 is below optim.warmup_steps 10 (the linear decay would end before the warmup does)" $BIN check "$TMP/job.json" --set optim.lr_decay_style=linear --set optim.decay_steps=5 --set optim.warmup_steps=10
# a warmup longer than the run: refused by check and by training alike, for
# every style (the decay ending at train.steps, or none); a short run of a
# longer schedule that optim.decay_steps names, or a warmup of the whole run, is valid
W="optim.warmup_steps 10 exceeds train.steps 2, where the cosine decay ends (optim.decay_steps 0): it would end before the warmup does (to run part of a longer schedule, set optim.decay_steps to its end)"
expect_fail "check: warmup_steps past train.steps" "$W" $BIN check "$TMP/job.json" --set optim.warmup_steps=10
expect_fail "training: warmup_steps past train.steps" "$W" $BIN "$TMP/job.json" --set optim.warmup_steps=10
expect_fail "wsd: warmup_steps past train.steps" "optim.warmup_steps 3 exceeds train.steps 2, where the wsd decay ends (optim.decay_steps 0)" $BIN check "$TMP/job.json" --set optim.lr_decay_style=wsd --set optim.wsd_decay_steps=1 --set optim.warmup_steps=3
for style in constant inverse_sqrt; do
    expect_fail "$style: warmup_steps past train.steps" "optim.warmup_steps 3 exceeds train.steps 2 (the run would end before the warmup does)" $BIN check "$TMP/job.json" --set optim.lr_decay_style=$style --set optim.warmup_steps=3
done
for ok_set in "optim.warmup_steps=10 --set optim.decay_steps=100" "optim.warmup_steps=2"; do
    if $BIN check "$TMP/job.json" --set $ok_set >"$TMP/out" 2>&1; then ok "check: --set $ok_set on a 2-step run is valid"
    else bad "check --set $ok_set: $(cat "$TMP/out")"; fi
done
expect_fail "bad wsd_decay_style" 'optim.wsd_decay_style: expected one of linear|cosine|exponential|minus_sqrt, got "sqrt"' $BIN "$TMP/job.json" --set optim.lr_decay_style=wsd --set optim.wsd_decay_steps=1 --set optim.wsd_decay_style=sqrt
# a batch-size ramp-up: its three keys together, every batch whole micro-batches per rank, below global_batch
R="--set train.rampup_start_batch=2 --set train.rampup_batch_increment=2 --set train.rampup_samples=8"
expect_fail "rampup increment without a start" 'train.rampup_batch_increment is set but train.rampup_start_batch is 0 (it applies only with a batch-size ramp-up)' $BIN "$TMP/job.json" --set train.rampup_batch_increment=2
expect_fail "rampup start without samples" 'train.rampup_start_batch 2 needs train.rampup_samples > 0 (got 0)' $BIN "$TMP/job.json" --set train.rampup_start_batch=2 --set train.rampup_batch_increment=2
expect_fail "rampup start not below global_batch" 'train.rampup_start_batch 4 is not below train.global_batch 4 (a ramp-up grows to it)' $BIN "$TMP/job.json" $R --set train.rampup_start_batch=4
expect_fail "rampup start not whole micro-batches" 'train.rampup_start_batch 3 is not divisible by train.micro_batch 2 x data-parallel ranks 1' $BIN "$TMP/job.json" $R --set train.rampup_start_batch=3 --set train.global_batch=6
expect_fail "rampup increment not dividing the ramp" 'train.rampup_batch_increment 4 does not divide train.global_batch 8 - train.rampup_start_batch 2' $BIN "$TMP/job.json" $R --set train.rampup_batch_increment=4 --set train.global_batch=8
expect_fail "rampup start at 2 data-parallel ranks (check)" 'train.rampup_start_batch 2 is not divisible by train.micro_batch 2 x data-parallel ranks 2' $BIN check "$TMP/job.json" --world 2 $R --set train.global_batch=8

# keys that cannot apply to the job as written, and a device override that is neither cpu nor cuda
expect_fail "GPT-2 with tie_embeddings false" "model.tie_embeddings false: GPT-2's token embedding is always the LM head (expected true or unset" $BIN check "$TMP/job.json" --set model.arch=gpt2 --set model.n_kv_head=0 --set model.tie_embeddings=false
expect_fail "shard_degree without a hybrid strategy" 'parallel.shard_degree is set but parallel.strategy is "FULL_SHARD" (it applies only with HYBRID_SHARD or HYBRID_SHARD_ZERO2)' $BIN check "$TMP/job.json" --world 2 --set parallel.strategy=FULL_SHARD --set parallel.shard_degree=2
expect_fail "min_bus_gbps without the health check" "parallel.min_bus_gbps is set but parallel.health_check is false (it applies only to the health check's measurement)" $BIN check "$TMP/job.json" --set parallel.min_bus_gbps=10 --set parallel.health_check=false
expect_fail "bad LLMTRAIN_DEVICE" 'environment: LLMTRAIN_DEVICE="gpu": expected cpu or cuda (or unset)' env LLMTRAIN_DEVICE=gpu $BIN "$TMP/job.json" --set log.dir="$TMP/run_dev"
if $BIN check "$TMP/job.json" --world 2 --set parallel.strategy=HYBRID_SHARD_ZERO2 --set parallel.shard_degree=2 --set train.global_batch=4 >"$TMP/out" 2>&1 &&
   $BIN check "$TMP/job.json" --set model.arch=gpt2 --set model.n_kv_head=0 --set model.tie_embeddings=true >>"$TMP/out" 2>&1; then
    ok "check: shard_degree under HYBRID_SHARD_ZERO2 and GPT-2 with tie_embeddings true are valid"
else bad "check: hybrid shard_degree / GPT-2 tied: $(cat "$TMP/out")"; fi

# the CUDA backend's precision and attention are job keys; the variables
# that once set them are refused, not silently ignored
expect_fail "bad compute dtype" 'train.compute_dtype: expected one of bf16|tf32|fp32|fp8, got "fp16"' $BIN "$TMP/job.json" --set train.compute_dtype=fp16
expect_fail "bad FP8 recipe" 'train.fp8_recipe: expected one of tensorwise|blockwise|rowwise, got "channelwise"' $BIN "$TMP/job.json" --set train.compute_dtype=fp8 --set train.fp8_recipe=channelwise
expect_fail "FP8 recipe without fp8" 'train.fp8_recipe is set but train.compute_dtype is "bf16" (it applies only with "fp8")' $BIN check "$TMP/job.json" --set train.fp8_recipe=rowwise
if $BIN check "$TMP/job.json" --world 2 --set train.compute_dtype=fp8 --set parallel.tensor=2 --set model.n_kv_head=2 >"$TMP/out" 2>&1; then
    ok "check: fp8 with parallel.tensor 2 is valid (the split tensors' scales are agreed over the TP group)"
else bad "check: fp8 with tensor parallelism: $(cat "$TMP/out")"; fi
expect_fail "bad attention kernel" 'train.attention_kernel: expected one of auto|cudnn|flash|gemm, got "sdpa"' $BIN "$TMP/job.json" --set train.attention_kernel=sdpa
expect_fail "LLMTRAIN_CUDA_MATMUL set (train)" "LLMTRAIN_CUDA_MATMUL is no longer read; set train.compute_dtype" env LLMTRAIN_CUDA_MATMUL=bf16 $BIN "$TMP/job.json"
expect_fail "LLMTRAIN_CUDA_ATTENTION set (check)" "LLMTRAIN_CUDA_ATTENTION is no longer read; set train.attention_kernel" env LLMTRAIN_CUDA_ATTENTION=flash $BIN check "$TMP/job.json"

# llmtrain check sizes a CUDA job by its keys (no GPU needed). A Llama of 2
# layers, C 128, F 512 (Llama's rule), V 96 at N = 2 x 512 tokens, head dim
# 64: under bf16 (the default) the [a] buffers take 2 bytes an element
# fewer than under tf32 or fp32, less the residual gradient's bf16 copy
# that only bf16 holds (2 N C), i.e. 2 N (L (3C + Q + F + 2F) + C + V) -
# 2 N C = 9,109,504 bytes less activations (ln1, qkv of Q = (2 + 2 x 1) x 64
# = 256, attention output, ln2, SwiGLU's output and its 2F input per layer;
# lnf; the logits); a CPU job's do not
# change. The scratch estimate follows train.attention_kernel: the GEMM
# attention's [B, T, T] blocks make gemm the larger of gemm/flash, cudnn
# (auto under bf16) adds its 64 MiB workspace cap, auto under tf32 is flash.
cat >"$TMP/cjob.json" <<EOF
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_kv_head": 1, "vocab_size": 96, "max_seq_len": 512},
 "data": {"train": "$TMP/train.bin"}, "train": {"seq_len": 512, "micro_batch": 2, "global_batch": 2, "device": "cuda"}}
EOF
est() { # est DEVICE [--set ...]: "activations_bytes scratch_bytes" of llmtrain check
    local dev=$1; shift
    $BIN check "$TMP/cjob.json" --set train.device="$dev" "$@" 2>&1 |
        sed -n 's/.*activations_bytes \([0-9]*\).*/\1/p; s/.*cuda_scratch_bytes \([0-9]*\).*/\1/p' | tr '\n' ' '
}
read -r a_def s_def <<<"$(est cuda)"
read -r a_bf s_bf <<<"$(est cuda --set train.compute_dtype=bf16)"
read -r a_tf s_tf <<<"$(est cuda --set train.compute_dtype=tf32)"
read -r a_fp s_fp <<<"$(est cuda --set train.compute_dtype=fp32)"
read -r a_c1 s_c1 <<<"$(est cpu --set train.compute_dtype=bf16)"
read -r a_c2 s_c2 <<<"$(est cpu --set train.compute_dtype=tf32)"
if [ -n "$a_def" ] && [ "$a_def" = "$a_bf" ] && [ "$s_def" = "$s_bf" ] && [ "$a_tf" = "$a_fp" ] && [ "$s_tf" = "$s_fp" ] &&
   [ $((a_tf - a_bf)) -eq 9109504 ] && [ "$a_c1" = "$a_c2" ] && [ "$a_c1" = "$a_tf" ] && [ -z "$s_c1$s_c2" ]; then
    ok "check: compute_dtype bf16 (the default) has 9109504 activation bytes fewer than tf32/fp32 ($a_bf vs $a_tf); a cpu job's are $a_c1 either way"
else bad "check: activations by compute dtype: default '$a_def' bf16 '$a_bf' tf32 '$a_tf' fp32 '$a_fp' cpu '$a_c1'/'$a_c2' (cpu scratch '$s_c1$s_c2')"; fi
read -r _ s_gemm <<<"$(est cuda --set train.compute_dtype=tf32 --set train.attention_kernel=gemm)"
read -r _ s_flash <<<"$(est cuda --set train.compute_dtype=tf32 --set train.attention_kernel=flash)"
read -r _ s_dn <<<"$(est cuda --set train.compute_dtype=tf32 --set train.attention_kernel=cudnn)"
read -r _ s_bflash <<<"$(est cuda --set train.attention_kernel=flash)"
if [ -n "$s_gemm" ] && [ "$s_gemm" -gt "$s_flash" ] && [ "$s_tf" = "$s_flash" ] && [ "$s_dn" -ge $((s_flash + 75497472)) ] &&
   [ "$s_bf" -ge $((s_bflash + 75497472)) ]; then
    ok "check: cuda_scratch_bytes follows train.attention_kernel (tf32: gemm $s_gemm > flash $s_flash = auto; cudnn $s_dn; bf16: auto $s_bf = cudnn, flash $s_bflash)"
else bad "check: scratch by attention kernel: gemm '$s_gemm' flash '$s_flash' auto-tf32 '$s_tf' cudnn '$s_dn' auto-bf16 '$s_bf' flash-bf16 '$s_bflash'"; fi

# the printed sample escapes the bytes that are not printable UTF-8 (\xHH), keeping valid characters
# whole even across tokens: a byte-level vocab, a prompt of é (two tokens), NUL, ESC, 0xff, A and
# U+0085 (a C1 control), then 300 tokens of a model at random init (every byte value likely)
$PY - "$TMP" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
h = np.zeros(256, np.uint32); h[:4] = (20240328, 2, 256, 0xFFFFFFFF)
open(f"{d}/bytes_vocab.bin", "wb").write(h.tobytes() + b"".join(bytes([1, i]) for i in range(256)))
t = np.concatenate([[0xC3, 0xA9, 0x00, 0x1B, 0xFF, 0x41, 0xC2, 0x85], np.random.default_rng(3).integers(0, 256, 2000)])
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))
open(f"{d}/bytes.bin", "wb").write(h.tobytes() + t.astype(np.uint16).tobytes())
EOF
$BIN "$TMP/job.json" --set model.vocab_size=256 --set data.train="$TMP/bytes.bin" --set data.vocab="$TMP/bytes_vocab.bin" \
    --set train.steps=1 --set eval.sample_tokens=300 --set eval.temperature=2 --set log.dir="$TMP/smp" \
    --set checkpoint.dir="$TMP/smp/ck" >"$TMP/smp.out" 2>&1
if smp=$($PY - "$TMP/smp.out" <<'EOF'
import re, sys
raw = open(sys.argv[1], "rb").read()
m = re.search(rb"--- sample ---\n(.*)\n--------------\n", raw, re.S)
assert m, raw[-300:]
text = m.group(1).decode("utf-8")  # strict: the sample is valid UTF-8
assert text.startswith("\u00e9\\x00\\x1b\\xffA\\xc2\\x85"), text[:40]
bad = [c for c in raw.decode("utf-8") if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f]
assert not bad, bad[:5]
esc = len(re.findall(r"\\x[0-9a-f]{2}", text))
assert esc >= 20, esc  # a random-init byte model draws control and stray bytes
print(f"{esc} bytes escaped in its {len(text)} characters; the output has no control byte but newline and tab")
EOF
); then ok "sample: the prompt printed as é\\x00\\x1b\\xffA\\xc2\\x85, valid UTF-8; $smp"
else bad "sample escaping: $smp"; fi

# scripts/prepare_data.py without numpy (hidden from its import): one line saying so and how to install, exit 2
$PY -c 'import runpy, sys; sys.modules["numpy"] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' \
    scripts/prepare_data.py --input data/tinyshakespeare.txt --out-dir "$TMP/pd" >"$TMP/pd.out" 2>"$TMP/pd.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/pd.err")" -eq 1 ] && grep -q "^prepare_data.py: error: needs numpy, .*apt-get install python3-numpy" "$TMP/pd.err" &&
   [ ! -e "$TMP/pd" ]; then ok "prepare_data.py without numpy: exit 2, one line: $(cat "$TMP/pd.err")"
else bad "prepare_data.py without numpy: rc $rc: $(head -3 "$TMP/pd.err")"; fi

# uint32 shards are read too
if $BIN "$TMP/job.json" --set data.train="$TMP/u32.bin" --set log.dir="$TMP/run32" >/dev/null 2>&1; then ok "uint32 shard trains"; else bad "uint32 shard failed"; fi

# init.from: export the good run, then conflicting and mismatched weights
if $BIN export "$TMP/ckpt" "$TMP/hf" >/dev/null 2>"$TMP/err"; then ok "export of the good run"; else bad "export failed: $(cat "$TMP/err")"; fi
# transformers 5's config.json layout (rope_parameters, no top-level rope_theta / rope_scaling) gives the
# step-0 logits of transformers 4's layout of the same RoPE, bit for bit, for theta alone and each rope_type;
# theta 10000 without scaling (what the layout once read as) gives others. The export's bos/eos ids: none for vocab 64.
rope_folder() { # rope_folder NAME PYTHON-EDIT-OF-c
    rm -rf "$TMP/$1" && cp -r "$TMP/hf" "$TMP/$1" && $PY - "$TMP/$1/config.json" "$2" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); exec(sys.argv[2]); json.dump(c, open(p, "w"))
EOF
}
logits_of() { $BIN "$TMP/job.json" --set init.from="$TMP/$1" --set train.steps=1 --set log.dir="$TMP/run_$1" --set checkpoint.dir="$TMP/run_$1/ck" --set debug.dump="$TMP/dump_$1" >"$TMP/run_$1.out" 2>&1 && cat "$TMP/dump_$1"/logits* | md5sum; }
for kind in theta llama3 linear yarn; do
    case $kind in
    theta) rs='None'; rp='{"rope_theta": 500000.0, "rope_type": "default"}' ;;
    llama3) rs='{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4}'
            rp='{"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4}' ;;
    linear) rs='{"rope_type": "linear", "factor": 4.0}'; rp='{"rope_theta": 500000.0, "rope_type": "linear", "factor": 4.0}' ;;
    yarn) rs='{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}'
          rp='{"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}' ;;
    esac
    rope_folder hf4_$kind "c['rope_theta'] = 500000.0; c['rope_scaling'] = $rs"
    rope_folder hf5_$kind "c.pop('rope_theta'); c.pop('rope_scaling'); c['rope_parameters'] = $rp"
    l4=$(logits_of hf4_$kind); l5=$(logits_of hf5_$kind)
    [ -z "${l0:-}" ] && { rope_folder hf_t10k "c['rope_theta'] = 10000.0; c['rope_scaling'] = None"; l0=$(logits_of hf_t10k); }
    if [ -n "$l4" ] && [ "$l4" = "$l5" ] && [ "$l5" != "$l0" ]; then ok "init.from transformers 5's rope_parameters ($kind): the logits of the 4.x layout, bit for bit, not theta 10000's"
    else bad "rope_parameters $kind: logits $l4 (4.x) vs $l5 (5.x), theta 10000 $l0: $(tail -1 "$TMP/run_hf5_$kind.out")"; fi
done
rope_folder hf5_dyn "c.pop('rope_theta'); c.pop('rope_scaling'); c['rope_parameters'] = {'rope_theta': 500000.0, 'rope_type': 'dynamic', 'factor': 2.0}"
expect_fail "init.from rope_parameters rope_type dynamic" 'config.json: key rope_parameters: rope_type "dynamic" is not supported' \
    $BIN "$TMP/job.json" --set init.from="$TMP/hf5_dyn"
# Qwen3 folders: attention biases refused; model_type qwen3 means QK-norm, whose weights must be there
rope_folder hf_qwen_bias "c['model_type'] = 'qwen3'; c['architectures'] = ['Qwen3ForCausalLM']; c['attention_bias'] = True"
expect_fail "init.from Qwen3 with attention_bias true" "hf_qwen_bias/config.json: key attention_bias: true is not supported (no attention biases in llmtrain's Qwen3)" \
    $BIN "$TMP/job.json" --set init.from="$TMP/hf_qwen_bias"
rope_folder hf_qwen_nonorm "c['model_type'] = 'qwen3'; c['architectures'] = ['Qwen3ForCausalLM']"
expect_fail "init.from Qwen3 without q_norm tensors" "missing tensor model.layers.0.self_attn.q_norm.weight" \
    $BIN "$TMP/job.json" --set init.from="$TMP/hf_qwen_nonorm"
rope_folder hf_drop "c['attention_dropout'] = 0.1"
$BIN "$TMP/job.json" --set init.from="$TMP/hf_drop" --set train.steps=1 --set log.dir="$TMP/run_drop" --set checkpoint.dir="$TMP/run_drop/ck" >/dev/null 2>"$TMP/drop.err"; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'ignored, llmtrain trains without dropout: attention_dropout 0.1' "$TMP/drop.err")" -eq 1 ]; then
    ok "init.from with attention_dropout 0.1: trains, one line says it is ignored"
else bad "dropout note: rc $rc: $(head -3 "$TMP/drop.err")"; fi
if $PY -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(0 if c["bos_token_id"] is None and c["eos_token_id"] is None and c["vocab_size"] == 64 else 1)' "$TMP/hf/config.json"; then
    ok "export: bos_token_id and eos_token_id null for a vocabulary of 64 (not transformers' defaults outside it)"
else bad "export bos/eos: $(grep -o '"[be]os_token_id": [a-z0-9]*' "$TMP/hf/config.json")"; fi

# a manifest whose layout cannot be the model's (damaged): exit 2 naming layout.tp, for export and resume
ck_layout() { # ck_layout NAME TP SHARD WORLD: a copy of the good run's checkpoint with that layout
    rm -rf "$TMP/$1" && mkdir "$TMP/$1" && cp -r "$TMP/ckpt/step_00000002" "$TMP/$1/"
    $PY - "$TMP/$1/step_00000002/manifest.json" "$2" "$3" "$4" <<'EOF'
import json, sys
p = sys.argv[1]; m = json.load(open(p)); m["layout"] = {"world": int(sys.argv[4]), "tp": int(sys.argv[2]), "shard": int(sys.argv[3]), "replicate": 1}
open(p, "w").write(json.dumps(m)[:-1] + "\n}\n") # manifest_checksum stays the last key
EOF
    $PY tests/manifest_seal.py "$TMP/$1/step_00000002/manifest.json" # sealed again: a writer's bug, not damage on disk
}
ck_layout ck_tp3 3 1 3
expect_fail "export: manifest layout.tp not dividing the model" "step_00000002/manifest.json: key layout.tp: 3 does not divide the model's n_head 2, n_kv_head 1" $BIN export "$TMP/ck_tp3" "$TMP/hf_tp3"
expect_fail "resume: manifest layout.tp not dividing the model" "step_00000002/manifest.json: key layout.tp: 3 does not divide the model's n_head 2, n_kv_head 1" $BIN "$TMP/job.json" --set checkpoint.resume="$TMP/ck_tp3" --set log.dir="$TMP/run_tp3"
ck_layout ck_tpbig 65536 65537 65536
expect_fail "export: manifest layout tp x shard past an int" "step_00000002/manifest.json: key layout: expected world = tp x shard x replicate" $BIN export "$TMP/ck_tpbig" "$TMP/hf_tpbig"
expect_fail "init.from conflicts with model key" "model.n_layer = 2 conflicts with init.from" $BIN "$TMP/job.json" --set init.from="$TMP/hf" --set model.n_layer=2
cp -r "$TMP/hf" "$TMP/hf_bad"
$PY - "$TMP/hf_bad/config.json" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["intermediate_size"] = c["intermediate_size"] + 8; json.dump(c, open(p, "w"))
EOF
expect_fail "init weights with wrong shape" "has shape" $BIN "$TMP/job.json" --set init.from="$TMP/hf_bad"
# a start that fails on its job, data, vocab or weights creates no log or checkpoint folder (no empty
# metrics.jsonl, no checkpoints/ with a lock file in it)
printf 'not a vocab table %.0s' $(seq 100) >"$TMP/badvocab.bin"
n_left=0
for set in train.steps=abc data.train="$TMP/none.bin" data.val="$TMP/badmagic.bin" data.vocab="$TMP/nope.bin" \
           data.vocab="$TMP/badvocab.bin" init.from="$TMP/nohf" init.from="$TMP/hf_bad"; do
    rm -rf "$TMP/left"
    $BIN "$TMP/job.json" --set "$set" --set log.dir="$TMP/left" --set checkpoint.dir="$TMP/left/checkpoints" >/dev/null 2>"$TMP/left.err"; rc=$?
    if [ $rc -eq 2 ] && [ ! -e "$TMP/left" ]; then n_left=$((n_left + 1))
    else bad "a failed start (--set $set) left: rc $rc, $(find "$TMP/left" 2>/dev/null | tr '\n' ' ') $(cat "$TMP/left.err")"; fi
done
[ $n_left -eq 7 ] && ok "7 failed starts (a bad key value, data, val, vocab, init.from folder and weights) leave no log.dir"
$BIN "$TMP/job.json" --set train.steps=1 --set log.dir="$TMP/left" --set checkpoint.dir="$TMP/left/checkpoints" >/dev/null 2>&1
if [ -s "$TMP/left/metrics.jsonl" ] && [ -d "$TMP/left/checkpoints/step_00000001" ]; then ok "the same start, valid, makes them"
else bad "valid start: $(find "$TMP/left" 2>/dev/null | tr '\n' ' ')"; fi
rm -f "$TMP/hf_bad/model.safetensors"
expect_fail "init weights missing" "hf_bad" $BIN "$TMP/job.json" --set init.from="$TMP/hf_bad"
# config.json's values are held to the ranges of the model.* keys they fill, as a job's are
hf_range() { # hf_range KEY VALUE MESSAGE: the good run's config.json with KEY = VALUE
    rm -rf "$TMP/hf_r" && mkdir "$TMP/hf_r" && cp "$TMP/hf/model.safetensors" "$TMP/hf_r/"
    $PY - "$TMP/hf/config.json" "$TMP/hf_r/config.json" "$1" "$2" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c[sys.argv[3]] = json.loads(sys.argv[4]); json.dump(c, open(sys.argv[2], "w"))
EOF
    expect_fail "init.from config.json $1 $2" "hf_r/config.json: key $1: expected $3" $BIN "$TMP/job.json" --set init.from="$TMP/hf_r"
}
hf_range max_position_embeddings 2147483647 "an integer in [1, 16777216] (the range of model.max_seq_len), got 2147483647"
hf_range num_hidden_layers 2147483647 "an integer in [1, 4096] (the range of model.n_layer), got 2147483647"
hf_range hidden_size 1073741824 "an integer in [1, 1048576] (the range of model.n_embd), got 1073741824"
hf_range num_key_value_heads 0 "an integer in [1, 4096] (the range of model.n_kv_head), got 0"
hf_range rms_norm_eps 50 "a number in (0, 1] (the range of model.norm_eps, above 0), got 50"
hf_range rope_theta 0.001 "a number in [1, 1e+12] (the range of model.rope_theta, above 0), got 0.001"

# data.vocab against model.vocab_size: as many tokens, or fewer where the
# model pads the table to the next multiple of 128 (GPT-2's 50257 -> 50304);
# a larger table, or one the model exceeds by more than the padding, is exit 2
$PY - "$TMP" <<'PYEOF'
import sys, numpy as np
for n in (64, 65, 128, 50257):
    h = np.zeros(256, np.uint32); h[:4] = (20240328, 2, n, n - 1)
    with open(f"{sys.argv[1]}/vocab{n}.bin", "wb") as f:
        f.write(h.tobytes())
        for i in range(n): f.write(bytes([1, 97 + i % 26]))
PYEOF
V=(--set checkpoint.resume=none --set train.steps=1)
expect_fail "data.vocab larger than the model's vocabulary" "data.vocab: $TMP/vocab65.bin has 65 tokens, more than model.vocab_size 64 (a table of another tokenizer? expected at most 64)" $BIN "$TMP/job.json" "${V[@]}" --set data.vocab="$TMP/vocab65.bin"
expect_fail "data.vocab smaller than the model's vocabulary past its padding" "data.vocab: $TMP/vocab64.bin has 64 tokens but model.vocab_size is 256 (expected 64, or up to 128: a vocabulary padded to the next multiple of 128, as GPT-2's 50257 to 50304)" $BIN "$TMP/job.json" "${V[@]}" --set data.vocab="$TMP/vocab64.bin" --set model.vocab_size=256
expect_fail "data.vocab of a multiple of 128 under a larger model.vocab_size" "data.vocab: $TMP/vocab128.bin has 128 tokens but model.vocab_size is 256 (expected 128, a multiple of 128 that no padding rounds up)" $BIN "$TMP/job.json" "${V[@]}" --set data.vocab="$TMP/vocab128.bin" --set model.vocab_size=256
for vs in "64 64" "50257 50304"; do
    read -r n m <<<"$vs"
    if $BIN "$TMP/job.json" "${V[@]}" --set data.vocab="$TMP/vocab$n.bin" --set model.vocab_size=$m --set eval.sample_tokens=4 \
        --set log.dir="$TMP/run_vocab$n" >"$TMP/out" 2>&1 && grep -q '"step":1' "$TMP/run_vocab$n/metrics.jsonl"; then
        ok "a $n-token data.vocab on model.vocab_size $m trains"
    else bad "$n-token data.vocab on model.vocab_size $m: $(grep llmtrain: "$TMP/out" | head -2)"; fi
done

# train.steps 0 and no checkpoint: says so, not that a checkpoint is at step 0
if $BIN "$TMP/job.json" --set train.steps=0 --set log.dir="$TMP/run0" --set checkpoint.dir="$TMP/ckpt0" >"$TMP/out" 2>&1 &&
   grep -qx "train.steps is 0: nothing to train" "$TMP/out" && ! grep -q "checkpoint is at step" "$TMP/out"; then
    ok "train.steps=0 without a checkpoint: exit 0, 'train.steps is 0: nothing to train'"
else bad "train.steps=0 without a checkpoint: $(grep -E 'nothing|llmtrain:' "$TMP/out")"; fi

# --set really overrides (the run has 3 steps, not 2)
$BIN "$TMP/job.json" --set train.steps=3 --set log.dir="$TMP/run3" --set checkpoint.resume=none >/dev/null 2>&1
if grep -q '"step":3' "$TMP/run3/metrics.jsonl" 2>/dev/null; then ok "--set train.steps=3 overrides"; else bad "--set did not override"; fi

# checkpoint.keep_last: 4 steps, a checkpoint each, keep the newest 2
$BIN "$TMP/job.json" --set train.steps=4 --set checkpoint.every_steps=1 --set checkpoint.keep_last=2 \
    --set log.dir="$TMP/runkl" --set checkpoint.dir="$TMP/ckkl" >/dev/null 2>&1
kept=$(ls "$TMP/ckkl" 2>/dev/null | tr '\n' ' ')
if [ "$kept" = "step_00000003 step_00000004 " ]; then ok "checkpoint.keep_last=2 keeps the newest two"; else bad "keep_last left: $kept"; fi

# MFU's CPU peak, measured at start, is measured again when a step runs
# faster than it (a measurement that shared the cores with something else
# reads low and would put MFU over 100%): LLMTRAIN_FAULT kind=low_peak at
# step 2 divides it by 10^4; after step 2, one line, the new peak near the
# header's, and every step's MFU in metrics.jsonl against a peak within 10x of
# the header's (mfu / tokens_per_s is flops a token / peak). 10x, not
# closer: the two sgemm measurements may see different loads on shared
# cores, and the fault is 10^4. Without the fault a second measurement
# only after a step that really ran above the first (one measured on
# loaded cores can read below this tiny job's rate), and none with
# log.peak_gflops below its rate (the user's peak stands).
$BIN "$TMP/job.json" --set train.steps=4 --set log.every_steps=1 --set log.dir="$TMP/pk" --set checkpoint.dir="$TMP/pk/ck" \
    >"$TMP/pk0.out" 2>&1
LLMTRAIN_FAULT="step=2,kind=low_peak" $BIN "$TMP/job.json" --set train.steps=4 --set log.every_steps=1 \
    --set log.dir="$TMP/pk1" --set checkpoint.dir="$TMP/pk1/ck" >"$TMP/pk1.out" 2>&1
$BIN "$TMP/job.json" --set train.steps=4 --set log.peak_gflops=0.0001 --set log.dir="$TMP/pk2" \
    --set checkpoint.dir="$TMP/pk2/ck" >"$TMP/pk2.out" 2>&1
if pkline=$($PY - "$TMP/pk0.out" "$TMP/pk1.out" "$TMP/pk1/metrics.jsonl" "$TMP/pk2.out" <<'PYEOF'
import json, re, sys
t0, t1, t2 = (open(p).read() for p in (sys.argv[1], sys.argv[2], sys.argv[4]))
head = float(re.search(r"peak for MFU ([0-9.]+) GFLOP/s \(measured sgemm\)", t1).group(1))
again = re.findall(r"^peak for MFU measured again after step (\d+), which ran at ([0-9.e+-]+) GFLOP/s a rank: "
                   r"([0-9.e+-]+) GFLOP/s \(measured sgemm; ([0-9.e+-]+) before\)$", t1, re.M)
assert len(again) >= 1, again
step, ran, new, was = int(again[0][0]), *map(float, again[0][1:])
again0 = re.findall(r"^peak for MFU measured again after step \d+, which ran at ([0-9.e+-]+) GFLOP/s a rank: "
                    r"[0-9.e+-]+ GFLOP/s \(measured sgemm; ([0-9.e+-]+) before\)$", t0, re.M)
m = [l for l in map(json.loads, open(sys.argv[3])) if "loss" in l]
per = [l["mfu"] / l["tokens_per_s"] for l in m]
checks = {"after step 2": step == 2,
          "the fault's peak": abs(was * 1e4 - head) <= 0.05 + 1e-3 * head,  # the header prints it to 0.1
          "ran above it": ran > was,
          "new peak within 10x": head / 10 < new < 10 * head,
          "4 steps": len(m) == 4,
          "every step's peak within 10x": all(0.1 * per[0] < p < 10 * per[0] for p in per),
          "MFU above 0": m[-1]["mfu"] > 0,
          "without the fault only after a faster step": t0.count("measured again") == len(again0)
                                                         and all(float(r) > float(b) for r, b in again0),
          "none under log.peak_gflops": "measured again" not in t2,
          "log.peak_gflops named": "(log.peak_gflops)" in t2}
failed = [k for k, v in checks.items() if not v]
print(f"peak {head:g} at start, {was:g} under the fault, {new:g} measured again after step {step} (which ran at {ran:g})"
      + (f"; failed: {', '.join(failed)}; per step {per}" if failed else ""))
sys.exit(1 if failed else 0)
PYEOF
); then ok "MFU peak: $pkline; without the fault none, or only after a step above it; none under log.peak_gflops"
else bad "MFU peak measured again: $pkline $(grep -h 'peak for MFU' "$TMP/pk0.out" "$TMP/pk1.out" "$TMP/pk2.out")"; fi

# make demo installs what the demo needs and no more (a fresh machine's
# demo once spent minutes installing PyTorch, Slurm and munge, which only
# the tests use): install_deps.sh against stubs of dpkg-query (nothing
# installed) and apt-get (records what it is asked for)
mkdir -p "$TMP/stubs"
printf '#!/bin/sh\nexit 1\n' >"$TMP/stubs/dpkg-query"
printf '#!/bin/sh\n[ "$1" = update ] || echo "$@" >>"%s"\n' "$TMP/apt.log" >"$TMP/stubs/apt-get"
printf '#!/bin/sh\nexec "$@"\n' >"$TMP/stubs/sudo" # (not root: sudo's secure_path would skip the apt-get stub)
chmod +x "$TMP/stubs/dpkg-query" "$TMP/stubs/apt-get" "$TMP/stubs/sudo"
for what in demo test; do
    rm -f "$TMP/apt.log"; PATH="$TMP/stubs:$PATH" scripts/install_deps.sh $what >/dev/null 2>&1 || bad "install_deps.sh $what failed"
    cp "$TMP/apt.log" "$TMP/apt-$what.log" 2>/dev/null
done
demo_pkgs=$(tr ' ' '\n' <"$TMP/apt-demo.log" | grep -v -e '^-' -e '^install$' | sort | tr '\n' ' ')
if [ "$demo_pkgs" = "build-essential libcjson-dev libopenblas-dev libopenmpi-dev openmpi-bin python3-matplotlib python3-numpy " ] &&
   grep -q "python3-torch" "$TMP/apt-test.log" && grep -q "slurmctld" "$TMP/apt-test.log" && grep -q "python3-numpy" "$TMP/apt-test.log" &&
   make -n demo 2>/dev/null | grep -q "scripts/install_deps.sh demo" && make -n test 2>/dev/null | grep -q "scripts/install_deps.sh test"; then
    ok "make demo installs the build, numpy and matplotlib only; make test installs torch and Slurm too"
else bad "demo packages '$demo_pkgs', test: $(cat "$TMP/apt-test.log" 2>/dev/null)"; fi

# every key of `llmtrain keys` is documented in docs/config.md, with the same row
# (that table is that output: a doc changed on one side only fails)
missing=""
for k in $($BIN keys | sed -n 's/^| `\([^`]*\)`.*/\1/p'); do grep -qF "\`$k\`" docs/config.md || missing="$missing $k"; done
if [ -z "$missing" ]; then ok "docs/config.md documents every config key"; else bad "docs/config.md lacks keys:$missing"; fi
stale=""
while IFS= read -r row; do grep -qxF -- "$row" docs/config.md || stale="$stale $(cut -d'`' -f2 <<<"$row")"; done < <($BIN keys)
if [ -z "$stale" ]; then ok "docs/config.md's key table rows are the rows of llmtrain keys, word for word"
else bad "docs/config.md's key table differs from llmtrain keys (regenerate it) at:$stale"; fi

# bad mixture-of-experts jobs: one line naming the key, the value and what
# was expected (job.json: a 1-layer Llama; the cases set 2 layers)
moe() { $BIN check "$TMP/job.json" --set model.n_layer=2 "$@"; }
expect_fail "moe_experts with gpt2" 'model.moe_experts 4: mixture of experts needs model.arch "llama" (SwiGLU experts), not "gpt2"' moe --set model.arch=gpt2 --set model.n_kv_head=2 --set model.moe_experts=4
expect_fail "moe_top_k over moe_experts" "model.moe_top_k 5 exceeds model.moe_experts 4" moe --set model.moe_experts=4 --set model.moe_top_k=5
expect_fail "moe_top_k 0" "model.moe_top_k: expected a value in [1, 65536], got 0" moe --set model.moe_experts=4 --set model.moe_top_k=0
expect_fail "moe_experts 1" "model.moe_experts 1: a mixture needs at least 2 experts (0 = dense)" moe --set model.moe_experts=1 --set model.moe_top_k=1
expect_fail "moe_dense_layers out of range" 'model.moe_dense_layers "0,2": at character 3: expected layer indices below n_layer 2, as "0,1"' moe --set model.moe_experts=4 --set model.moe_dense_layers=0,2
expect_fail "moe_dense_layers malformed" 'model.moe_dense_layers "0;1": at character 2: expected layer indices below n_layer 2' moe --set model.moe_experts=4 --set 'model.moe_dense_layers=0;1'
expect_fail "moe_dense_layers not a string" "model.moe_dense_layers: expected a string, got 1" moe --set model.moe_experts=4 --set model.moe_dense_layers=1
expect_fail "no MoE layer left (dense_layers)" 'model.moe_experts 4 but no layer is MoE (moe_layer_freq 1, moe_dense_layers "0,1" over 2 layers)' moe --set model.moe_experts=4 --set model.moe_dense_layers=0,1
expect_fail "no MoE layer left (layer_freq)" 'model.moe_experts 4 but no layer is MoE (moe_layer_freq 3, moe_dense_layers "" over 2 layers)' moe --set model.moe_experts=4 --set model.moe_layer_freq=3
for k in model.moe_ffn_hidden=8 model.moe_shared_experts=1 model.moe_dense_layers=0, model.moe_top_k=2 model.moe_norm_topk=false \
         model.moe_layer_freq=2 train.moe_aux_loss_coef=0.01 train.moe_z_loss_coef=0.001 train.moe_capacity_factor=1.25; do
    v=${k#*=}; [ "${k%%=*}" = model.moe_dense_layers ] && v='"0,"'
    expect_fail "${k%%=*} with moe_experts 0" "${k%%=*} $v is set but model.moe_experts is 0 (it applies only to a mixture of experts; expected it unset, or model.moe_experts >= 2)" moe --set "$k"
done
expect_fail "fp8 with MoE" 'train.compute_dtype "fp8" with model.moe_experts 4: FP8 products inside the experts are not built yet (expected bf16, tf32 or fp32)' moe --set model.moe_experts=4 --set train.compute_dtype=fp8
expect_fail "fp8 with MoE, training" 'train.compute_dtype "fp8" with model.moe_experts 4' $BIN "$TMP/job.json" --set model.moe_experts=4 --set train.compute_dtype=fp8 --set log.dir="$TMP/fp8moe"
expect_fail "negative capacity factor" "train.moe_capacity_factor: expected a value in [0, 1e+06], got -1" moe --set model.moe_experts=4 --set train.moe_capacity_factor=-1

# one rank is "1 rank", in check's verdict and in a layout's refusal
if $BIN check "$TMP/job.json" --world 1 2>&1 | grep -q ": valid for 1 rank$"; then ok "check --world 1 says 'valid for 1 rank'"
else bad "check --world 1: $($BIN check "$TMP/job.json" --world 1 2>&1 | grep valid)"; fi
expect_fail "tp 2 on one rank" "parallel.tensor 2 does not divide the 1 rank" $BIN check "$TMP/job.json" --world 1 --set parallel.tensor=2
# expert groups: ep consecutive data-parallel x context ranks (world / tp of them), at least 1
expect_fail "ep 3 on 4 ranks" "job.json: parallel.expert 3 does not divide the 4 data-parallel x context ranks (world 4 / parallel.tensor 1; an expert group is ep consecutive ones)" \
    $BIN check "$TMP/job.json" --world 4 --set parallel.expert=3
expect_fail "ep 4 with tp 2 on 4 ranks" "job.json: parallel.expert 4 does not divide the 2 data-parallel x context ranks (world 4 / parallel.tensor 2; an expert group is ep consecutive ones)" \
    $BIN check "$TMP/job.json" --world 4 --set parallel.tensor=2 --set model.n_kv_head=2 --set parallel.expert=4
expect_fail "ep 2 on one rank" "parallel.expert 2 does not divide the 1 data-parallel x context rank (world 1" $BIN check "$TMP/job.json" --world 1 --set parallel.expert=2
expect_fail "ep 0" "job.json: parallel.expert: expected a value in [1, 1024], got 0" $BIN check "$TMP/job.json" --world 2 --set parallel.expert=0
if $BIN check "$TMP/job.json" --world 8 --set parallel.tensor=2 --set model.n_kv_head=2 --set parallel.context=2 --set parallel.expert=4 --set model.moe_experts=4 >"$TMP/out" 2>&1 &&
   grep -q "^parallel: tensor 2 x context 2 .* x data-parallel 2 | .* | expert groups of 4 (innermost of dp x cp)$" "$TMP/out"; then
    ok "check: ep 4 with tp 2 x cp 2 on 8 ranks is valid (4 data-parallel x context ranks), its parallel line says so"
else bad "check: ep 4 with tp 2 x cp 2 on 8 ranks: $(grep llmtrain: "$TMP/out" | head -2)"; fi

# the resolved config: check --print-config is every applying key's value as
# a job file that loads back as the same job, under several schedules and
# modes; a training run writes the same text to log.dir/config.json
roundtrip() {
    local what=$1; shift
    if $BIN check "$TMP/job.json" --print-config "$@" >"$TMP/pc1.json" 2>"$TMP/pc.err" &&
       $BIN check "$TMP/pc1.json" --print-config >"$TMP/pc2.json" 2>>"$TMP/pc.err" && cmp -s "$TMP/pc1.json" "$TMP/pc2.json"; then
        ok "check --print-config ($what) loads back as the same job"
    else bad "check --print-config ($what): $(cat "$TMP/pc.err") $(diff "$TMP/pc1.json" "$TMP/pc2.json" 2>&1 | head -4)"; fi
}
roundtrip "defaults"
roundtrip "selective recompute" --set train.activation_checkpointing=selective --set 'train.recompute_modules=["attention"]'
roundtrip "FP8 rowwise" --set train.compute_dtype=fp8 --set train.fp8_recipe=rowwise
roundtrip "wsd" --set optim.lr_decay_style=wsd --set optim.wsd_decay_steps=1 --set optim.warmup_steps=0
roundtrip "a decay of its own" --set optim.decay_steps=40
roundtrip "mixture of experts" --set model.n_layer=2 --set model.moe_experts=4 --set 'model.moe_dense_layers="0"' --set train.moe_capacity_factor=1.5
$BIN check "$TMP/job.json" --print-config --set train.steps=3 --set=optim.lr=0.002 >"$TMP/pc.json" 2>&1
$BIN keys | sed -n 's/^| `\([^`]*\)`.*/\1/p' >"$TMP/keys.txt"
if "$PY" - "$TMP/pc.json" "$TMP/keys.txt" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
def flat(o, pre=""):
    for k, v in o.items():
        if isinstance(v, dict): yield from flat(v, pre + k + ".")
        else: yield pre + k, v
got = dict(flat(d))
moe_only = lambda k: (k.startswith("model.moe_") and k != "model.moe_experts") or k.startswith("train.moe_")
want = [k for k in open(sys.argv[2]).read().split() if k not in ("train.recompute_modules", "train.fp8_recipe") and not moe_only(k)]
assert list(got) == want, set(want) ^ set(got)
assert got["train.steps"] == 3 and abs(got["optim.lr"] - 0.002) < 1e-9 and got["model.n_layer"] == 1, got
assert got["model.ffn_hidden"] > 0 and got["optim.decay_steps"] == 0  # resolved; decay_steps as the job gave it
PYEOF
then ok "check --print-config: every key in the key table's order less those that do not apply (a dense model: the MoE keys), --set values in"
else bad "check --print-config's keys or values: $(head -c 300 "$TMP/pc.json")"; fi
rm -rf "$TMP/pcrun"
$BIN "$TMP/job.json" --set log.dir="$TMP/pcrun" --set checkpoint.dir="$TMP/pcrun/ck" --set train.steps=3 >/dev/null 2>&1
$BIN check "$TMP/job.json" --print-config --set log.dir="$TMP/pcrun" --set checkpoint.dir="$TMP/pcrun/ck" --set train.steps=3 >"$TMP/pc3.json" 2>&1
if cmp -s "$TMP/pcrun/config.json" "$TMP/pc3.json" && ! ls "$TMP/pcrun"/config.json.tmp >/dev/null 2>&1; then
    ok "a run writes log.dir/config.json, check --print-config's text for the same job"
else bad "log.dir/config.json: $(diff "$TMP/pcrun/config.json" "$TMP/pc3.json" 2>&1 | head -4)"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
