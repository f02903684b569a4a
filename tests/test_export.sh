#!/bin/bash
# llmtrain export and init.from a checkpoint. Export of a 2-rank FULL_SHARD
# Llama and a GPT-2 checkpoint: BF16 tensors are the round-to-nearest-even
# of the F32 export's (bits computed here), the sharded layout holds the
# F32 export's tensors bit for bit, its index names every tensor in the file
# that holds it and total_size their bytes, stale files of the other layout
# go; bos/eos ids in config.json and generation_config.json come from
# data.eod_token, or from init.from's config.json (through a checkpoint
# too); the tokenizer files of data.tokenizer or init.from are copied byte
# for byte, a gone or changed one is exit 2 before any weight is written;
# peak RSS of an export stays near its largest tensor, far below the model.
# init.from a checkpoint (2-rank FULL_SHARD) on 1 rank and tp 2: the losses
# of init.from its Hugging Face export (same weights, new optimizer) step
# for step, step 1 first, and the header names the folder, its format,
# tensor count and dtype.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
job() { # job ARCH PATH
    local kv='"n_kv_head": 2,'; [ "$1" = gpt2 ] && kv=''
    cat >"$2" <<EOF
{"model": {"arch": "$1", "n_layer": 2, "n_embd": 32, "n_head": 4, $kv "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 4, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2},
 "eval": {"sample_tokens": 0}}
EOF
}
job llama "$TMP/llama.json"; job gpt2 "$TMP/gpt2.json"
# a tokenizer folder: the names export copies (one binary), plus one it does not
mkdir -p "$TMP/tok"
$PY - "$TMP/tok" <<'EOF'
import os, sys
d = sys.argv[1]
for n in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "merges.txt"]:
    open(os.path.join(d, n), "w").write('{"name": "%s", "pad": "%s"}\n' % (n, "x" * (len(n) * 37)))
open(os.path.join(d, "tokenizer.model"), "wb").write(bytes(range(256)) * 9)
open(os.path.join(d, "README.md"), "w").write("not a tokenizer file\n")
EOF
train() { # train NAME NP JOB [--set ...]: a run into $TMP/NAME, output in $TMP/NAME.out
    local name=$1 np=$2 j=$3; shift 3
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$j" --set log.dir="$TMP/$name" "$@" >"$TMP/$name.out" 2>&1
}

# ---- export: ids, tokenizer, generation_config, bf16, shards ----
train ll 2 "$TMP/llama.json" --set parallel.strategy=FULL_SHARD --set data.eod_token=3 --set train.eod_mask_loss=true --set data.tokenizer="$TMP/tok" ||
    bad "2-rank llama run failed: $(tail -2 "$TMP/ll.out")"
train gp 1 "$TMP/gpt2.json" || bad "gpt2 run failed: $(tail -2 "$TMP/gp.out")"
for a in ll gp; do
    $BIN export "$TMP/$a/checkpoints" "$TMP/$a/f32" >"$TMP/$a.x1" 2>&1 &&
    $BIN export "$TMP/$a/checkpoints" "$TMP/$a/bf16" --dtype bf16 --tokenizer none >"$TMP/$a.x2" 2>&1 &&
    $BIN export "$TMP/$a/checkpoints" "$TMP/$a/sh" --max-shard-size=20KB --tokenizer none >"$TMP/$a.x3" 2>&1 &&
    $BIN export "$TMP/$a/checkpoints" "$TMP/$a/shbf" --dtype=bf16 --max-shard-size 9000 --tokenizer none >"$TMP/$a.x4" 2>&1 ||
        bad "$a: export failed: $(cat "$TMP/$a".x*)"
done
if out=$($PY - "$TMP" <<'EOF'
import json, os, re, sys
sys.path.insert(0, "tests")
import numpy as np, hfio
T = sys.argv[1]
def fail(msg): print(msg); sys.exit(1)
for run in ["ll", "gp"]:
    f32, _ = hfio.read_safetensors_np(f"{T}/{run}/f32/model.safetensors")
    # BF16: the RNE of the F32 export, bit for bit (the raw bits read here)
    def raw(path):
        b = open(path, "rb").read(); n = int.from_bytes(b[:8], "little"); h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
        return h, memoryview(b)[8 + n:]
    h, data = raw(f"{T}/{run}/bf16/model.safetensors")
    if set(h) != set(f32): fail(f"{run} bf16: tensors {sorted(set(h) ^ set(f32))} differ from the F32 export's")
    for k, v in h.items():
        if v["dtype"] != "BF16": fail(f"{run} bf16: {k} is {v['dtype']}")
        bits = np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<u2")
        want = hfio.f32_to_bf16_bits(f32[k].ravel())
        if list(v["shape"]) != list(f32[k].shape) or not np.array_equal(bits, want): fail(f"{run} bf16: {k} is not the RNE of the F32 values")
    cfg = json.load(open(f"{T}/{run}/bf16/config.json"))
    if cfg["torch_dtype"] != "bfloat16": fail(f"{run} bf16 config torch_dtype {cfg['torch_dtype']}")
    # shards: the index against the files, values against the F32 export
    for d, limit, dt in [("sh", 20000, "F32"), ("shbf", 9000, "BF16")]:
        folder = f"{T}/{run}/{d}"
        if os.path.exists(f"{folder}/model.safetensors"): fail(f"{run} {d}: model.safetensors next to the index")
        idx = json.load(open(f"{folder}/model.safetensors.index.json"))
        wm = idx["weight_map"]
        files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors"))
        m = len(files)
        if m < 2 or files != [f"model-{i:05d}-of-{m:05d}.safetensors" for i in range(1, m + 1)] or sorted(set(wm.values())) != files:
            fail(f"{run} {d}: files {files}, index names {sorted(set(wm.values()))}")
        if set(wm) != set(f32): fail(f"{run} {d}: weight_map has {sorted(set(wm) ^ set(f32))} unlike the F32 export")
        total = 0
        for fn in files:
            h, data = raw(f"{folder}/{fn}")
            size = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in h.values())
            if size > limit and len(h) > 1: fail(f"{run} {d}: {fn} holds {size} bytes in {len(h)} tensors, past {limit}")
            for k, v in h.items():
                if wm.get(k) != fn: fail(f"{run} {d}: {k} is in {fn}, the index says {wm.get(k)}")
                if v["dtype"] != dt: fail(f"{run} {d}: {k} is {v['dtype']}")
                raw_b = data[v["data_offsets"][0]:v["data_offsets"][1]]
                got = np.frombuffer(raw_b, "<f4" if dt == "F32" else "<u2")
                want = f32[k].ravel() if dt == "F32" else hfio.f32_to_bf16_bits(f32[k].ravel())
                if not np.array_equal(got.view(np.uint32) if dt == "F32" else got, want.view(np.uint32) if dt == "F32" else want):
                    fail(f"{run} {d}: {k} differs from the F32 export")
                total += len(raw_b)
        if idx["metadata"]["total_size"] != total: fail(f"{run} {d}: total_size {idx['metadata']['total_size']}, the files hold {total}")
# ids: data.eod_token (llama) or none (gpt2, vocab 96), in both files
for run, want in [("ll", 3), ("gp", None)]:
    for fn in ["config.json", "generation_config.json"]:
        c = json.load(open(f"{T}/{run}/f32/{fn}"))
        if c.get("bos_token_id", "missing") != want or c.get("eos_token_id", "missing") != want:
            fail(f"{run} {fn}: bos {c.get('bos_token_id', 'missing')} eos {c.get('eos_token_id', 'missing')}, expected {want}")
print("ok")
EOF
); then ok "export: BF16 = RNE of F32 bit for bit; shards (F32 and BF16) hold the F32 export's tensors, index matches the files and total_size, no shard past the size with 2+ tensors; ids from data.eod_token in config.json and generation_config.json (GPT-2 vocab 96: null)"
else bad "export checks: $out"; fi
if grep -q "2 ranks: tp 1 x shard 2 .* fp32, model.safetensors | 5 tokenizer files from $TMP/tok" "$TMP/ll.x1" &&
   grep -q "bf16, [0-9]* shards" "$TMP/ll.x4"; then ok "export's summary line names the dtype, the layout and the tokenizer files"
else bad "export summary: $(cat "$TMP/ll.x1" "$TMP/ll.x4")"; fi
same=1
for f in tokenizer.json tokenizer_config.json special_tokens_map.json merges.txt tokenizer.model; do cmp -s "$TMP/tok/$f" "$TMP/ll/f32/$f" || same=0; done
if [ $same = 1 ] && [ ! -e "$TMP/ll/f32/README.md" ] && [ ! -e "$TMP/ll/bf16/tokenizer.json" ]; then
    ok "export copies data.tokenizer's 5 files byte for byte (not other files; none under --tokenizer none)"
else bad "tokenizer copy: $(ls "$TMP/ll/f32")"; fi
# a folder that held the other layout: its files go (loaders prefer model.safetensors to an index)
$BIN export "$TMP/ll/checkpoints" "$TMP/ll/sh" --tokenizer none >/dev/null 2>&1
$BIN export "$TMP/ll/checkpoints" "$TMP/ll/shbf" --max-shard-size 30KB --tokenizer none >/dev/null 2>&1
shards=$(ls "$TMP/ll/shbf" | grep -c 'of-'); of=$(ls "$TMP/ll/shbf" | grep -o 'of-[0-9]*' | sort -u)
if [ "$(ls "$TMP/ll/sh" | grep -c safetensors)" = 1 ] && [ -f "$TMP/ll/sh/model.safetensors" ] && [ ! -e "$TMP/ll/sh/model.safetensors.index.json" ] &&
   [ "$shards" -ge 2 ] && [ "$of" = "$(printf 'of-%05d' "$shards")" ]; then
    ok "export over another layout's folder removes its index and shards, or its single file and the shards of another count"
else bad "stale files: $(ls "$TMP/ll/sh" "$TMP/ll/shbf" | tr '\n' ' ')"; fi
expect_exit() { # expect_exit WHAT PATTERN CMD...: exit 2, PATTERN in its one line
    local what=$1 pat=$2 rc; shift 2
    "$@" >"$TMP/ee.out" 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pat" "$TMP/ee.out"; then ok "$what: exit 2"; else bad "$what: rc $rc: $(head -2 "$TMP/ee.out")"; fi
}
expect_exit "export --dtype fp16" "expected fp32 or bf16, got 'fp16'" $BIN export "$TMP/ll/checkpoints" "$TMP/x" --dtype fp16
expect_exit "export --max-shard-size 5XB" "expected a size such as 5GB" $BIN export "$TMP/ll/checkpoints" "$TMP/x" --max-shard-size 5XB
expect_exit "export --bogus" "unknown option '--bogus'" $BIN export "$TMP/ll/checkpoints" "$TMP/x" --bogus 1
expect_exit "data.tokenizer without tokenizer files" "data.tokenizer $TMP: no tokenizer file there" $BIN "$TMP/llama.json" --set data.tokenizer="$TMP" --set log.dir="$TMP/nt"
# the tokenizer changed or gone since the run recorded it: exit 2, no weights written; --tokenizer DIR copies from elsewhere
cp -r "$TMP/tok" "$TMP/tok_keep"
echo " " >>"$TMP/tok/merges.txt"
expect_exit "export with a changed tokenizer file" "merges.txt: .* it changed since the run's tokenizer was recorded" $BIN export "$TMP/ll/checkpoints" "$TMP/tc"
rm "$TMP/tok/tokenizer.json"
expect_exit "export with a tokenizer file gone" "tok/tokenizer.json: cannot read .* pass --tokenizer DIR" $BIN export "$TMP/ll/checkpoints" "$TMP/tg"
if [ ! -e "$TMP/tc/model.safetensors" ] && [ ! -e "$TMP/tg/model.safetensors" ] && [ ! -e "$TMP/tg/config.json" ]; then
    ok "a failed tokenizer check leaves no weights or config behind"; else bad "weights written before the tokenizer check: $(ls "$TMP/tc" "$TMP/tg")"; fi
if $BIN export "$TMP/ll/checkpoints" "$TMP/tu" --tokenizer "$TMP/tok_keep" >/dev/null 2>&1 && cmp -s "$TMP/tok_keep/tokenizer.json" "$TMP/tu/tokenizer.json" &&
   cmp -s "$TMP/tok_keep/tokenizer.model" "$TMP/tu/tokenizer.model"; then ok "export --tokenizer DIR copies that folder's files"
else bad "--tokenizer DIR: $(ls "$TMP/tu" 2>&1)"; fi

# ---- imported ids and tokenizer: init.from a folder with bos 1 / eos [2, 5], then through a checkpoint ----
cp -r "$TMP/ll/f32" "$TMP/imp" && rm -f "$TMP/imp"/tokenizer* "$TMP/imp"/special_tokens_map.json "$TMP/imp"/merges.txt
cp "$TMP/tok_keep/tokenizer.json" "$TMP/tok_keep/tokenizer_config.json" "$TMP/imp/"
$PY - "$TMP/imp/config.json" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["bos_token_id"] = 1; c["eos_token_id"] = [2, 5]; json.dump(c, open(p, "w"))
EOF
train imp1 1 "$TMP/llama.json" --set init.from="$TMP/imp" --set train.steps=2 &&
    train imp2 1 "$TMP/llama.json" --set init.from="$TMP/imp1/checkpoints" --set train.steps=2 --set data.eod_token=7 --set train.eod_mask_loss=true &&
    $BIN export "$TMP/imp1/checkpoints" "$TMP/imp1/hf" >/dev/null 2>&1 && $BIN export "$TMP/imp2/checkpoints" "$TMP/imp2/hf" >/dev/null 2>&1 ||
    bad "init.from the edited folder: $(tail -2 "$TMP/imp1.out" "$TMP/imp2.out")"
if $PY - "$TMP" <<'EOF'
import json, sys
T = sys.argv[1]
for run in ["imp1", "imp2"]:
    for fn in ["config.json", "generation_config.json"]:
        c = json.load(open(f"{T}/{run}/hf/{fn}"))
        assert c["bos_token_id"] == 1 and c["eos_token_id"] == [2, 5], (run, fn, c)
    for fn in ["tokenizer.json", "tokenizer_config.json"]:
        assert open(f"{T}/{run}/hf/{fn}", "rb").read() == open(f"{T}/imp/{fn}", "rb").read(), (run, fn)
EOF
then ok "init.from a folder with bos 1 / eos [2, 5]: its export and that of a run from its checkpoint keep them and its tokenizer files"
else bad "imported ids or tokenizer lost"; fi

# ---- init.from a checkpoint: weights only, any layout ----
$BIN export "$TMP/ll/checkpoints" "$TMP/ll/hfx" --tokenizer none >/dev/null 2>&1
for lay in "1 1" "2 2"; do
    read -r np tp <<<"$lay"
    train nat$np $np "$TMP/llama.json" --set init.from="$TMP/ll/checkpoints" --set parallel.tensor=$tp &&
        train hfi$np $np "$TMP/llama.json" --set init.from="$TMP/ll/hfx" --set parallel.tensor=$tp ||
        bad "init.from on $np rank(s): $(tail -2 "$TMP/nat$np.out" "$TMP/hfi$np.out")"
    if $PY - "$TMP/nat$np/metrics.jsonl" "$TMP/hfi$np/metrics.jsonl" "$TMP/ll/metrics.jsonl" <<'EOF'
import json, sys
def steps(p): return [json.loads(l) for l in open(p) if '"loss"' in l]
a, b, src = steps(sys.argv[1]), steps(sys.argv[2]), steps(sys.argv[3])
assert [d["step"] for d in a] == [1, 2, 3, 4], [d["step"] for d in a]
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] and x["lr"] == y["lr"], (x, y)
assert a[0]["lr"] == src[0]["lr"], "the schedule starts over"
EOF
    then ok "init.from a 2-rank FULL_SHARD checkpoint on $np rank(s), tp $tp: steps 1..4 with the losses, norms and lr of init.from its export (fresh optimizer, step 1 first)"
    else bad "init.from checkpoint on $np rank(s): $(grep -E 'init.from|error' "$TMP/nat$np.out" | head -3)"; fi
done
if grep -q "^resume: no complete checkpoint" "$TMP/nat1.out" && ! grep -q "^resume: .*(written by" "$TMP/nat1.out"; then
    ok "init.from a checkpoint is no resume (its step and data cursor stay behind)"; else bad "init.from checkpoint resumed: $(grep resume "$TMP/nat1.out")"; fi
# the header: folder, format, tensor count (counted here) and dtype
n_ck=$($PY -c 'import json, sys; print(sum(t["kind"] == "param" for t in json.load(open(sys.argv[1]))["tensors"]))' "$TMP/ll/checkpoints/step_00000004/manifest.json")
n_hf=$($PY -c 'import sys; sys.path.insert(0, "tests"); import hfio; print(len(hfio.read_safetensors_np(sys.argv[1])[0]))' "$TMP/ll/hfx/model.safetensors")
train hbf 1 "$TMP/llama.json" --set init.from="$TMP/ll/bf16" --set train.steps=1 --set optim.warmup_steps=0
train hsh 1 "$TMP/llama.json" --set init.from="$TMP/ll/shbf" --set train.steps=1 --set optim.warmup_steps=0
nsh=$(ls "$TMP/ll/shbf" | grep -c 'of-')
if grep -q "^init.from: $TMP/ll/checkpoints/step_00000004 | llmtrain checkpoint of step 4, written by 2 ranks (tp 1 x shard 2 x replicate 1); weights only: new optimizer state, step 0 | $n_ck tensors | F32$" "$TMP/nat1.out" &&
   grep -q "^init.from: $TMP/ll/hfx | Hugging Face safetensors, 1 file | $n_hf tensors | F32$" "$TMP/hfi1.out" &&
   grep -q "^init.from: $TMP/ll/bf16 | Hugging Face safetensors, 1 file | $n_hf tensors | BF16$" "$TMP/hbf.out" &&
   grep -q "^init.from: $TMP/ll/shbf | Hugging Face safetensors, $nsh files | $n_hf tensors | F32$" "$TMP/hsh.out"; then
    ok "the header names init.from's folder, format, tensor count ($n_ck checkpoint, $n_hf safetensors) and dtype"
else bad "init.from header: $(grep -h '^init.from' "$TMP"/nat1.out "$TMP"/hfi1.out "$TMP"/hbf.out "$TMP"/hsh.out)"; fi
# the sharded F32 export loads like the single file: same step-1 loss
$BIN export "$TMP/ll/checkpoints" "$TMP/ll/sh32" --max-shard-size 20KB --tokenizer none >/dev/null 2>&1
train hsh32 1 "$TMP/llama.json" --set init.from="$TMP/ll/sh32" --set train.steps=1 --set optim.warmup_steps=0
l1=$(grep -o '"loss":[^,]*' "$TMP/hsh32/metrics.jsonl" | head -1); l2=$(grep -o '"loss":[^,]*' "$TMP/hfi1/metrics.jsonl" | head -1)
if [ -n "$l1" ] && [ "$l1" = "$l2" ]; then ok "init.from the sharded export: the step-1 loss of the single file ($l1)"; else bad "sharded init.from: $l1 vs $l2"; fi
expect_exit "init.from neither kind" "neither a Hugging Face folder (no config.json) nor an llmtrain checkpoint" $BIN "$TMP/llama.json" --set init.from="$TMP/tok_keep" --set log.dir="$TMP/nk"
expect_exit "init.from a checkpoint of another model" "model.n_layer = 3 conflicts with init.from $TMP/ll/checkpoints/step_00000004/manifest.json" \
    $BIN "$TMP/llama.json" --set init.from="$TMP/ll/checkpoints" --set model.n_layer=3 --set log.dir="$TMP/nm"
cp -r "$TMP/ll/checkpoints" "$TMP/ck_bad" && printf 'x' | dd of="$TMP/ck_bad/step_00000004/rank_00001.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_exit "init.from a damaged checkpoint (2 ranks)" "rank_00001.bin: checksum" $MPIRUN 2 $BIN "$TMP/llama.json" --set init.from="$TMP/ck_bad" --set log.dir="$TMP/nb"

# ---- peak memory: export streams a tensor at a time ----
# (peak RSS over the binary's own, what `llmtrain --version` peaks at: the
# libraries it maps, 10 MiB for a CPU-only build, ~215 MiB with CUDA's,
# whose start-up peak may hide part of export's; a 41M-parameter Llama of
# 12 layers, 156 MiB of fp32, which the old export held whole)
cat >"$TMP/big.json" <<EOF
{"model": {"arch": "llama", "n_layer": 12, "n_embd": 512, "n_head": 8, "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"}, "train": {"steps": 1, "seq_len": 16, "micro_batch": 1},
 "eval": {"sample_tokens": 0}}
EOF
train big 1 "$TMP/big.json" || bad "big run: $(tail -2 "$TMP/big.out")"
peak_rss() { $PY -c 'import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); sys.exit(r.returncode) if r.returncode else print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)' "$@"; }
base=$(peak_rss "$BIN" --version)
for dt in fp32 bf16; do
    peak=$(peak_rss "$BIN" export "$TMP/big/checkpoints" "$TMP/big/hf_$dt" --dtype $dt --max-shard-size 40MB --tokenizer none)
    if out=$($PY - "$TMP/big/hf_$dt" "$base" "$peak" <<'EOF'
import json, os, sys
sys.path.insert(0, "tests")
import hfio
d, base, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
idx = json.load(open(d + "/model.safetensors.index.json"))
t = {}
for f in sorted(set(idx["weight_map"].values())): t.update(hfio.read_safetensors_np(f"{d}/{f}")[0])
model = sum(a.size * 4 for a in t.values())  # as fp32
largest = 2 * max(a.size * 4 for a in t.values())  # our largest: a layer's fused gate|up, 2 HF tensors
grew = peak - base
bound = 2 * largest + 24 * 2**20  # the tensor, its read, the checksum pass's 16 MiB buffer
M = 2**20
print(f"peak RSS {peak / M:.1f} MiB, {grew / M:.1f} MiB over the binary's own start-up peak {base / M:.1f} MiB, for {model / M:.1f} MiB of fp32 weights "
      f"in {len(t)} tensors (largest {largest / M:.1f} MiB; bound {bound / M:.1f} MiB)")
sys.exit(0 if grew < bound and grew < model / 4 else 1)
EOF
    ); then ok "export --dtype $dt (sharded): $out"; else bad "export $dt memory: ${out:-export failed}"; fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
