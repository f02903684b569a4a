#!/bin/bash
# scripts/prepare_data.py: text files, JSONL and Parquet (folders and
# globs of them) round-trip to the token ids a reader written here finds
# (numpy, from the formats' definitions: llm.c shards, Megatron MMIDIDX),
# with one end-of-document token after every document; the validation
# split is by whole documents and seeded; --workers 1 and 2 write the same
# bytes; a damaged JSONL line / Parquet file is one line naming it; the
# same corpus as one shard, as several and as a Megatron dataset trains to
# bit-identical losses, and resumes exactly from the shards; tokens/s
# with 1 and 2 workers is printed.
. "$(dirname "$0")/lib.sh"
PREP="$PY scripts/prepare_data.py"
have_pa=0; $PY -c 'import pyarrow.parquet' 2>/dev/null && have_pa=1
have_tk=0; $PY -c 'import tokenizers' 2>/dev/null && have_tk=1

# the corpus: text files in a folder tree, JSONL (field text, and body),
# Parquet in two row groups
$PY - "$TMP" "$have_pa" <<'PYEOF' || exit 1
import sys, os, json, numpy as np
d, have_pa = sys.argv[1], sys.argv[2] == "1"
rng = np.random.default_rng(5)
words = ["the", "king", "größe", "naïve", "💡", "of", "a", "\n", "to", "be"]
def doc(): return " ".join(rng.choice(words, rng.integers(1, 40))) + "\n"
os.makedirs(f"{d}/txt/sub")
for p in ("txt/a.txt", "txt/b.txt", "txt/sub/c.txt"):
    open(f"{d}/{p}", "w").write("".join(doc() for _ in range(3)))
with open(f"{d}/rows.jsonl", "w") as f:
    for i in range(300): f.write(json.dumps({"id": i, "text": doc()}) + "\n")
with open(f"{d}/body.jsonl", "w") as f:
    for i in range(50): f.write(json.dumps({"body": doc()}, ensure_ascii=False) + "\n")
if have_pa:
    import pyarrow as pa, pyarrow.parquet as pq
    pq.write_table(pa.table({"n": list(range(120)), "text": [doc() for _ in range(120)]}), f"{d}/rows.parquet", row_group_size=70)
PYEOF

# check.py OUTDIR NAME FORMAT FIELD TOKENIZER INPUT...: the documents read
# here from the inputs, each tokenized (+ the end-of-document token) must be,
# in order, the next document of the train or the val stream read back from
# OUTDIR; prints the split (0/1 per document)
cat >"$TMP/check.py" <<'PYEOF'
import sys, os, glob, json, struct, numpy as np
out, name, fmt, field, tokz = sys.argv[1:6]
files = sys.argv[6:]
docs = []
for p in files:
    if p.endswith(".jsonl"):
        docs += [json.loads(l)[field] for l in open(p, encoding="utf-8") if l.strip()]
    elif p.endswith(".parquet"):
        import pyarrow.parquet as pq
        docs += pq.read_table(p).column(field).to_pylist()
    else:
        docs.append(open(p, encoding="utf-8").read())
if tokz == "byte":
    enc = lambda s: list(s.encode("utf-8")) + [0]
else:
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(tokz); eot = tk.token_to_id("<|endoftext|>")
    enc = lambda s: tk.encode(s, add_special_tokens=False).ids + [eot]
def shards(split):
    one = f"{out}/{name}_{split}.bin"
    paths = [one] if os.path.exists(one) else sorted(glob.glob(f"{out}/{name}_{split}_*.bin"))
    parts = []
    for p in paths:
        h = np.fromfile(p, "<i4", 256)
        assert h[0] == 20240520 and h[1] == 1, (p, h[:3])
        t = np.fromfile(p, "<u2", offset=1024)
        assert len(t) == h[2] and h[2] > 0, (p, len(t), h[2])
        parts.append(t)
    return np.concatenate(parts).astype(np.int64), None, len(paths)
def megatron(split):
    pre = f"{out}/{name}_{split}"
    b = open(pre + ".idx", "rb").read()
    assert b[:9] == b"MMIDIDX\x00\x00", b[:9]
    ver, code, n, nd = struct.unpack_from("<QBQQ", b, 9)
    assert ver == 1 and code == 8 and nd == n + 1, (ver, code, n, nd)
    o = 9 + 25
    sizes = np.frombuffer(b, "<i4", n, o); ptrs = np.frombuffer(b, "<i8", n, o + 4 * n)
    didx = np.frombuffer(b, "<i8", nd, o + 12 * n)
    assert len(b) == o + 12 * n + 8 * nd
    assert (didx == np.arange(nd)).all() and (ptrs == 2 * np.concatenate([[0], np.cumsum(sizes)[:-1]])).all()
    t = np.fromfile(pre + ".bin", "<u2").astype(np.int64)
    assert len(t) == sizes.sum()
    return t, sizes, 1
streams = [(shards if fmt == "shards" else megatron)(s) for s in ("train", "val")]
at, split, seen = [0, 0], [], [[], []]
for d in docs:
    e = np.asarray(enc(d))
    for k in (0, 1):
        t = streams[k][0]
        if len(t) >= at[k] + len(e) and (t[at[k]:at[k] + len(e)] == e).all():
            at[k] += len(e); split.append(k); seen[k].append(len(e)); break
    else:
        sys.exit(f"document {len(split)} ({d[:20]!r}) is not the next document of train or val")
for k in (0, 1):
    assert at[k] == len(streams[k][0]), (k, at[k], len(streams[k][0]))
    if streams[k][1] is not None: assert list(streams[k][1]) == seen[k], "index sizes are not the documents"
assert 0 < sum(split) < len(split), "a split with no val or no train documents"
print("".join(map(str, split)), streams[0][2])
PYEOF

inputs=("$TMP/txt" "$TMP/rows.jsonl")
[ $have_pa = 1 ] && inputs+=("$TMP/rows.parquet")
# what check.py reads: the folder's files sorted, the JSONL, the Parquet
files=("$TMP/txt/a.txt" "$TMP/txt/b.txt" "$TMP/txt/sub/c.txt" "$TMP/rows.jsonl")
[ $have_pa = 1 ] && files+=("$TMP/rows.parquet")
what="text files (a folder), JSONL$([ $have_pa = 1 ] && echo ", Parquet")"
[ $have_pa = 1 ] || echo "info Parquet untested: pyarrow is not importable by $PY"

prep() { local o=$1; shift; $PREP --out-dir "$TMP/$o" --name c "$@" >"$TMP/$o.out" 2>"$TMP/$o.err"; }
check() { $PY "$TMP/check.py" "$TMP/$1" c "$2" "$3" "$4" "${@:5}" 2>&1 | tail -1; }

prep w1 --input "${inputs[@]}" --val-fraction 0.2 --seed 7
s1=$(check w1 shards text byte "${files[@]}")
if [[ "$s1" =~ ^[01]+\ 1$ ]] && grep -q '^data.eod_token: 0$' "$TMP/w1.out"; then
    ok "$what: byte tokens + eod 0 after every document, in one shard; the split is by documents; prints data.eod_token: 0"
else bad "$what round trip: $s1 $(cat "$TMP/w1.err")"; fi
prep w2 --input "${inputs[@]}" --val-fraction 0.2 --seed 7 --workers 2
if cmp -s "$TMP/w1/c_train.bin" "$TMP/w2/c_train.bin" && cmp -s "$TMP/w1/c_val.bin" "$TMP/w2/c_val.bin" &&
    cmp -s "$TMP/w1/c_vocab.bin" "$TMP/w2/c_vocab.bin"; then ok "--workers 2 writes the bytes --workers 1 does"
else bad "--workers 2 differs from --workers 1"; fi
prep seed8 --input "${inputs[@]}" --val-fraction 0.2 --seed 8
s8=$(check seed8 shards text byte "${files[@]}")
if [[ "$s8" =~ ^[01]+\ 1$ ]] && [ "${s8% *}" != "${s1% *}" ]; then ok "another --seed splits other documents"
else bad "--seed 8: $s8 vs $s1"; fi
# a glob of the glob: the JSONL files by field body
prep body --input "$TMP/b*.jsonl" --field body --val-fraction 0.3
sb=$(check body shards body byte "$TMP/body.jsonl")
if [[ "$sb" =~ ^[01]+\ 1$ ]]; then ok "a glob, JSONL by --field body"; else bad "--field body: $sb $(cat "$TMP/body.err")"; fi

prep many --input "${inputs[@]}" --val-fraction 0.2 --seed 7 --shard-tokens 1000
sm=$(check many shards text byte "${files[@]}")
n=$(ls "$TMP/many"/c_train_*.bin | wc -l)
if [ "${sm% *}" = "${s1% *}" ] && [ "${sm#* }" -gt 3 ] && [ "${sm#* }" -eq "$n" ] && [ ! -e "$TMP/many/c_train.bin" ] &&
    grep -q "^train: $TMP/many/c_train_\*.bin" "$TMP/many.out" && ! ls "$TMP/many" | grep -q tmp; then
    ok "--shard-tokens 1000: $n shards, the same tokens, the glob printed, no .tmp left"
else bad "--shard-tokens: $sm ($n shards) $(cat "$TMP/many.err")"; fi
prep mg --input "${inputs[@]}" --val-fraction 0.2 --seed 7 --format megatron --workers 2
sg=$(check mg megatron text byte "${files[@]}")
if [ "${sg% *}" = "${s1% *}" ]; then ok "--format megatron: uint16 MMIDIDX, one sequence per document, the same tokens and split"
else bad "megatron: $sg $(cat "$TMP/mg.err")"; fi

if [ $have_tk = 1 ]; then
    $PY - "$TMP/tok.json" >/dev/null <<'PYEOF' || exit 1
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
tk = Tokenizer(models.BPE())
tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False); tk.decoder = decoders.ByteLevel()
tk.train(["data/tinyshakespeare.txt"], trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|endoftext|>"],
         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tk.save(sys.argv[1])
PYEOF
    prep bpe --input "${inputs[@]}" --val-fraction 0.2 --seed 7 --tokenizer "$TMP/tok.json" --workers 2
    st=$(check bpe shards text "$TMP/tok.json" "${files[@]}")
    if [ "${st% *}" = "${s1% *}" ] && grep -q '^data.eod_token: 0$' "$TMP/bpe.out"; then
        ok "tokenizers byte-level BPE: its ids + <|endoftext|> after every document, the same split"
    else bad "bpe: $st $(cat "$TMP/bpe.err")"; fi
else echo "info the tokenizers package is not installed: BPE untested"; fi

# damaged input: one line naming the file and the line (row)
oneline() {
    local what=$1 pat=$2; shift 2
    $PREP --out-dir "$TMP/bad" --name c "$@" >/dev/null 2>"$TMP/bad.err"; local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/bad.err")" -eq 1 ] && grep -q "^prepare_data.py: error: $pat" "$TMP/bad.err" &&
        ! ls "$TMP/bad" 2>/dev/null | grep -q .; then ok "$what: exit 2, one line: $(cat "$TMP/bad.err")"
    else bad "$what: rc $rc: $(head -3 "$TMP/bad.err")"; fi
}
{ head -4 "$TMP/rows.jsonl"; echo '{"text": "cut'; tail -3 "$TMP/rows.jsonl"; } >"$TMP/bad.jsonl"
oneline "a damaged JSONL line" "$TMP/bad.jsonl: line 5: not valid JSON" --input "$TMP/rows.jsonl" "$TMP/bad.jsonl"
oneline "a damaged JSONL line, --workers 2" "$TMP/bad.jsonl: line 5: not valid JSON" --input "$TMP/rows.jsonl" "$TMP/bad.jsonl" --workers 2
echo '{"body": "x"}' >"$TMP/nofield.jsonl"
oneline "a JSONL row without the field" "$TMP/nofield.jsonl: line 1: no \"text\" field" --input "$TMP/nofield.jsonl"
if [ $have_pa = 1 ]; then
    head -c 1500 "$TMP/rows.parquet" >"$TMP/bad.parquet"
    oneline "a damaged Parquet file" "$TMP/bad.parquet: not a readable Parquet file" --input "$TMP/bad.parquet"
fi
oneline "a glob matching nothing" "--input $TMP/none\*.txt: the glob matches no file" --input "$TMP/none*.txt"

# training: one shard, several shards and Megatron train bit-identically
head -c 60000 data/tinyshakespeare.txt >"$TMP/small.txt"
for o in "one" "sh --shard-tokens 700" "mgt --format megatron"; do
    read -r d rest <<<"$o"
    prep "$d" --input "$TMP/small.txt" --text-docs paragraphs $rest
done
cat >"$TMP/job.json" <<EOF
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "vocab_size": 256, "max_seq_len": 32},
 "train": {"steps": 8, "seq_len": 32, "micro_batch": 2, "global_batch": 4},
 "optim": {"lr": 1e-2, "warmup_steps": 2},
 "eval": {"sample_tokens": 0, "batches": 2, "every_steps": 4},
 "checkpoint": {"every_steps": 4}, "parallel": {"health_check": false}}
EOF
train() {
    local n=$1 t=$2 v=$3; shift 3
    $BIN "$TMP/job.json" --set log.dir="$TMP/run-$n" --set checkpoint.dir="$TMP/run-$n/ck" \
        --set "data.train=$t" --set "data.val=$v" "$@" </dev/null >>"$TMP/run-$n.out" 2>&1
}
train one "$TMP/one/c_train.bin" "$TMP/one/c_val.bin"
nsh=$(ls "$TMP/sh"/c_train_*.bin | wc -l)
train sh "$TMP/sh/c_train_*.bin" "$TMP/sh/c_val_*.bin"
train mgt "$TMP/mgt/c_train" "$TMP/mgt/c_val"
for r in sh mgt; do
    if [ "$nsh" -gt 10 ] && $PY tests/compare_runs.py "$TMP/run-one" "$TMP/run-$r" --steps 8 --exact >"$TMP/$r.cmp" 2>&1; then
        ok "trains on the $r output (sh: $nsh shards) to the one shard's losses, norms and val losses"
    else bad "$r vs one shard: $(head -2 "$TMP/$r.cmp") $(grep llmtrain: "$TMP/run-$r.out" | head -1)"; fi
done
# the shards, shuffled, killed at step 6 and resumed from step 4's checkpoint
train shuf "$TMP/sh/c_train_*.bin" "$TMP/sh/c_val_*.bin" --set data.shuffle=true
(LLMTRAIN_FAULT="rank=0,step=6,kind=die" train cut "$TMP/sh/c_train_*.bin" "$TMP/sh/c_val_*.bin" \
    --set data.shuffle=true --set checkpoint.async=false) 2>/dev/null
train cut "$TMP/sh/c_train_*.bin" "$TMP/sh/c_val_*.bin" --set data.shuffle=true
if grep -q "resume: .*step_00000004 at step 4" "$TMP/run-cut.out" &&
    $PY tests/compare_runs.py "$TMP/run-shuf" "$TMP/run-cut" --steps 8 --exact >"$TMP/cut.cmp" 2>&1; then
    ok "$nsh shards, shuffled, killed at step 6 and resumed from step 4: bit-identical"
else bad "resume on shards: $(head -2 "$TMP/cut.cmp") $(grep -E 'resume|llmtrain:' "$TMP/run-cut.out" | head -2)"; fi

# tokens/s with 1 and 2 workers: the shipped text, a JSONL corpus of it
$PY - data/tinyshakespeare.txt "$TMP/big.jsonl" <<'PYEOF'
import sys, json
paras = [p + "\n" for p in open(sys.argv[1]).read().split("\n\n") if p.strip()]
with open(sys.argv[2], "w") as f:
    for _ in range(4):
        for p in paras: f.write(json.dumps({"text": p}) + "\n")
PYEOF
toks=byte; [ $have_tk = 1 ] && toks="byte $TMP/tok.json"
for tz in $toks; do
    for in in "data/tinyshakespeare.txt --text-docs paragraphs" "$TMP/big.jsonl"; do
        for w in 1 2; do
            $PREP --input $in --out-dir "$TMP/speed" --name s --tokenizer "$tz" --workers $w >"$TMP/speed.out" 2>/dev/null
            echo "info $(basename "${in%% *}") $([ "$tz" = byte ] && echo byte || echo bpe-1000) --workers $w: $(grep '^tokens/s' "$TMP/speed.out")"
        done
    done
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
