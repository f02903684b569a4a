#!/bin/bash
# Megatron indexed datasets in training (indexed.c through data.c): the
# same tokens as an llm.c shard and as an indexed dataset (uint16 and
# int32, documents split into several sequences, written here from the
# format's definition) train bit-identically under 1 rank, FULL_SHARD 2 and
# cp 2, shuffled, in a blend, and resumed mid-epoch; documents from the
# index with no data.eod_token (block-causal attention, reset positions,
# eod_mask_loss) train as the shard's documents ending at their token do,
# on 1 rank and under cp 2; a shard where the index's documents are needed
# is one line and exit 2, and `check` takes an indexed prefix without
# data.eod_token. Losses, norms and exported weights via compare_runs.py.
. "$(dirname "$0")/lib.sh"
export LLMTRAIN_CACHE_DIR="$TMP/cache"

# the shard: 3000 tokens below 8; token 5 ends documents (about 8 tokens
# each); then the same tokens as indexed datasets whose documents end
# after each 5 (Megatron's --append-eod), each document one or two
# sequences (MMIDIDX version 1: magic, version, dtype, counts, sizes,
# pointers, document index)
write_shard "$TMP/docs.bin" 8 3000 2
$PY - "$TMP/docs.bin" "$TMP" <<'PYEOF' || exit 1
import sys, struct, numpy as np
tok = np.fromfile(sys.argv[1], np.uint16, offset=1024).astype(np.int64)
ends = list(np.nonzero(tok == 5)[0] + 1)
if not ends or ends[-1] != len(tok): ends.append(len(tok))
def write(prefix, code, dt):
    sizes, docs, at = [], [0], 0
    for e in ends:
        n = e - at
        parts = [n] if n < 3 else [n // 3, n - n // 3]
        sizes += parts
        docs.append(len(sizes))
        at = e
    item = np.dtype(dt).itemsize
    ptrs = np.concatenate([[0], np.cumsum(sizes)[:-1]]) * item
    tok.astype(dt).tofile(prefix + ".bin")
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(sizes), len(docs)))
        f.write(np.asarray(sizes, "<i4").tobytes() + np.asarray(ptrs, "<i8").tobytes() + np.asarray(docs, "<i8").tobytes())
write(sys.argv[2] + "/docs_u16", 8, "<u2")
write(sys.argv[2] + "/docs_i32", 4, "<i4")
PYEOF

cat >"$TMP/job.json" <<EOF
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "vocab_size": 8, "max_seq_len": 32},
 "data": {"train": "$TMP/docs.bin", "val": "$TMP/docs.bin"},
 "train": {"steps": 8, "seq_len": 32, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2},
 "checkpoint": {"every_steps": 4},
 "eval": {"sample_tokens": 0, "batches": 2, "every_steps": 4},
 "parallel": {"health_check": false}}
EOF
idx() { echo "--set data.train=$TMP/$1 --set data.val=$TMP/$1"; }

# train NAME NP [--set ...]: one run into $TMP/NAME (metrics, checkpoints, export)
train() {
    local name=$1 np=$2; shift 2
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set log.dir="$TMP/$name" --set checkpoint.dir="$TMP/$name/ckpt" "$@" </dev/null >"$TMP/$name.out" 2>&1
    local rc=$?
    $BIN export "$TMP/$name/ckpt" "$TMP/$name/hf" >/dev/null 2>&1
    return $rc
}
# same REF NAME WHAT: bit-identical losses, norms, val losses and weights
same() {
    if [ -s "$TMP/$2/hf/model.safetensors" ] && $PY tests/compare_runs.py "$TMP/$1" "$TMP/$2" --steps 8 --exact >"$TMP/$2.cmp" 2>&1
    then ok "$3: bit-identical to the shard's run (losses, norms, val losses, weights)"
    else bad "$3: $(head -2 "$TMP/$2.cmp" | tr '\n' ' ') $(grep llmtrain: "$TMP/$2.out" | head -1)"; fi
}

docs="--set train.attention_mask=block_causal --set train.reset_position_ids=true --set train.eod_mask_loss=true"
while read -r name np sets; do
    train "shard-$name" "$np" $sets
    train "u16-$name" "$np" $sets $(idx docs_u16)
    same "shard-$name" "u16-$name" "uint16 indexed, $name ($np ranks)"
done <<EOF
1 1
fs2 2 --set parallel.strategy=FULL_SHARD
cp2 2 --set parallel.context=2
shuffle 1 --set data.shuffle=true
EOF
train i32-1 1 $(idx docs_i32)
same shard-1 i32-1 "int32 indexed, 1 rank"
train blend-shard 1 --set "data.train=0.7 $TMP/docs.bin 0.3 $TMP/docs.bin"
train blend-idx 1 --set "data.train=0.7 $TMP/docs_u16 0.3 $TMP/docs_i32.idx"
same blend-shard blend-idx "a blend of two indexed sources"
if grep -q "data: $TMP/docs_u16 (3000 tokens" "$TMP/u16-1.out"; then ok "the header names the dataset and its tokens"
else bad "header: $(grep '^data' "$TMP/u16-1.out")"; fi

# documents: the shard's end at token 5, the index's from its document index
for layout in "1" "2 --set parallel.context=2"; do
    read -r np rest <<<"$layout"
    train "eod-$np" "$np" $rest $docs --set data.eod_token=5
    train "index-$np" "$np" $rest $docs $(idx docs_u16)
    same "eod-$np" "index-$np" "documents from the index, no data.eod_token, $np rank(s) ${rest:+($rest)}"
done
# ... and they matter: the same run with no documents differs
train nodocs 1 $(idx docs_u16)
if ! $PY tests/compare_runs.py "$TMP/index-1" "$TMP/nodocs" --steps 8 --exact >/dev/null 2>&1; then
    ok "the index's documents change the run (block-causal, positions, masked targets)"
else bad "a run with the index's documents is the same as one without"; fi

# resume mid-epoch (93 sequences an epoch in shuffled order; the resume at sequence 32)
train ref-resume 1 $(idx docs_u16) --set data.shuffle=true --set train.steps=8
LLMTRAIN_FAULT="rank=0,step=6,kind=die" train cut 1 $(idx docs_u16) --set data.shuffle=true --set checkpoint.async=false
train cut 1 $(idx docs_u16) --set data.shuffle=true
if grep -q "resume: .*step_00000004 at step 4" "$TMP/cut.out" &&
    $PY tests/compare_runs.py "$TMP/ref-resume" "$TMP/cut" --steps 8 --exact >/dev/null; then
    ok "indexed and shuffled, killed at step 6 and resumed from step 4: bit-identical"
else bad "indexed resume: $(grep -E 'resume|llmtrain:' "$TMP/cut.out" | head -2)"; fi

# a shard where the index's documents are needed; check takes a prefix
refused "block_causal on a glob with a shard, no data.eod_token" "$TMP/job.json: data.train '$TMP/docs\*' has no document index" \
    $BIN "$TMP/job.json" --set log.dir="$TMP/r1" --set train.attention_mask=block_causal \
    --set "data.train=$TMP/docs*" --set "data.val=$TMP/docs_u16"
refused "block_causal naming a .bin, at check" "$TMP/job.json: train.attention_mask \"block_causal\" needs data.eod_token" \
    $BIN check "$TMP/job.json" --set train.attention_mask=block_causal
if $BIN check "$TMP/job.json" $docs $(idx docs_u16) >"$TMP/check.out" 2>&1; then ok "check takes block_causal on an indexed prefix"
else bad "check on an indexed prefix: $(cat "$TMP/check.out" | head -2)"; fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
