#!/usr/bin/python3
"""prepare_data.py -- turn a corpus of documents into llmtrain token data.

    prepare_data.py --input PATH|GLOB... --out-dir DIR [--name NAME]
                    [--tokenizer byte|PATH/tokenizer.json] [--eod-token ID]
                    [--field text] [--text-docs file|paragraphs]
                    [--val-fraction 0.1] [--seed 1234]
                    [--format shards|megatron] [--shard-tokens N] [--workers N]

Inputs (each --input a file, a folder (walked, sorted) or a glob):
  * *.jsonl / *.json: one document a line, its --field (default "text");
  * *.parquet: one document a row, the same column (needs pyarrow);
  * anything else: a text file, one document (--text-docs paragraphs: each
    run of lines between blank lines is a document, kept with its newline).
Each document is tokenized and followed by one end-of-document token:
  * --tokenizer byte (default): token = byte of the UTF-8 text, vocab 256,
    and the end-of-document token is 0 (the NUL byte, which text does not
    hold: a document containing it is refused);
  * --tokenizer tokenizer.json: the Hugging Face `tokenizers` package; its
    end-of-text token (<|endoftext|>, <|end_of_text|>, </s>, <eos>) or
    --eod-token ID.
The script prints the `data.eod_token` value for the job.

Split: each document goes to validation with probability --val-fraction,
decided by a hash of (--seed, document number), so the split is by whole
documents, seeded, and the same for every --workers.

Output (every file written to NAME.tmp first, then renamed):
  * --format shards (default): llm.c shards of at most --shard-tokens tokens
    (256 x int32 header: magic 20240520 version 1 for uint16 tokens, or
    20240801 version 7 for uint32; token count), NAME_train.bin when one
    shard holds the split, else NAME_train_000000.bin, ... (the glob
    NAME_train_*.bin is the data.train value); the same for val;
  * --format megatron: NAME_train.bin/.idx and NAME_val.bin/.idx, Megatron's
    MMIDIDX version 1 (uint16 tokens when the vocab fits, else int32), one
    sequence per document; data.train takes the prefix DIR/NAME_train.
  * NAME_vocab.bin: 256 x uint32 header (magic 20240328, version 2,
    vocab_size, eot token), then per token a uint8 length and its bytes.

--workers N parses JSONL and tokenizes in N processes; batches are written in input order,
so the output is byte-identical for every N. A progress line (documents/s,
tokens/s) goes to stderr, a summary to stdout. Bad input: one error line
naming the file (and line or row) and exit status 2.
"""
import argparse
import glob
import json
import multiprocessing
import os
import re
import struct
import sys
import time

try:
    import numpy as np
except ImportError:
    print("prepare_data.py: error: needs numpy, which this python3 lacks "
          "(apt-get install python3-numpy, or python3 -m pip install numpy)", file=sys.stderr)
    sys.exit(2)

SHARD_MAGIC_U16, SHARD_VERSION_U16 = 20240520, 1
SHARD_MAGIC_U32, SHARD_VERSION_U32 = 20240801, 7
VOCAB_MAGIC, VOCAB_VERSION = 20240328, 2
HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # an llm.c header's count is an int32
BATCH_BYTES = 1 << 20         # text per unit of work sent to a worker
BATCH_DOCS = 4096
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
BYTE_EOD = 0
MEGATRON_DTYPES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


class BadInput(Exception):
    pass


def die(msg):
    print(f"prepare_data.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def fsync_close(f):
    f.flush()
    os.fsync(f.fileno())
    f.close()


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------ inputs

def kind_of(path):
    low = path.lower()
    if low.endswith((".jsonl", ".json")):
        return "jsonl"
    if low.endswith(".parquet"):
        return "parquet"
    return "text"


def expand_inputs(specs):
    out = []
    for spec in specs:
        if os.path.isdir(spec):
            found = []
            for root, dirs, files in os.walk(spec):
                dirs.sort()
                found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
            if not found:
                die(f"--input {spec}: an empty folder")
            out += found
        elif os.path.exists(spec):
            if not os.path.isfile(spec):
                die(f"--input {spec}: not a regular file or folder")
            out.append(spec)
        elif glob.has_magic(spec):
            found = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            if not found:
                die(f"--input {spec}: the glob matches no file")
            out += found
        else:
            die(f"--input {spec}: no such file, folder or glob")
    for p in out:
        if not os.access(p, os.R_OK):
            die(f"--input {p}: not readable")
    return out


def text_docs(path, mode):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: byte {e.start}: not UTF-8 text")
    if mode == "file":
        if text:
            yield text, path, None
        return
    # paragraphs: lines between blank lines, each paragraph with its newline
    para, first = [], 0
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        if line.strip() == "":
            if para:
                yield "".join(para), path, first
            para = []
        else:
            if not para:
                first = n
            para.append(line)
    if para:
        yield "".join(para), path, first


def jsonl_docs(path):
    """The file's lines, unparsed: the workers parse them (parse_jsonl)."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                yield raw, path, n


def parse_jsonl(raw, path, n, field):
    try:
        row = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        msg = getattr(e, "msg", None) or type(e).__name__
        raise BadInput(f"{path}: line {n}: not valid JSON ({msg})")
    if not isinstance(row, dict) or field not in row:
        raise BadInput(f"{path}: line {n}: no \"{field}\" field (--field names it)")
    if not isinstance(row[field], str):
        raise BadInput(f"{path}: line {n}: \"{field}\" is a {type(row[field]).__name__}, expected a string")
    return row[field]


def parquet_docs(path, field):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BadInput(f"{path}: Parquet input needs pyarrow, which this python3 lacks "
                       "(apt-get install python3-pyarrow, or python3 -m pip install pyarrow)")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 -- any failure to open is a damaged file
        raise BadInput(f"{path}: not a readable Parquet file ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if field not in pf.schema_arrow.names:
        raise BadInput(f"{path}: no \"{field}\" column (--field names it; columns: {', '.join(pf.schema_arrow.names)})")
    row = 0
    for g in range(pf.num_row_groups):
        try:
            col = pf.read_row_group(g, columns=[field]).column(0).to_pylist()
        except Exception as e:  # noqa: BLE001
            raise BadInput(f"{path}: row {row} (row group {g}): cannot be read "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        for v in col:
            if not isinstance(v, str):
                raise BadInput(f"{path}: row {row}: \"{field}\" is {type(v).__name__}, expected a string")
            yield v, path, row
            row += 1


def documents(paths, field, text_mode):
    for p in paths:
        k = kind_of(p)
        if k == "jsonl":
            yield from jsonl_docs(p)
        elif k == "parquet":
            yield from parquet_docs(p, field)
        else:
            yield from text_docs(p, text_mode)


def batches(docs):
    batch, size = [], 0
    for d in docs:
        batch.append(d)
        size += len(d[0])
        if size >= BATCH_BYTES or len(batch) >= BATCH_DOCS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# ------------------------------------------------------------ tokenizing (in workers)

_TK = None  # (kind, tokenizer or None, eod, JSONL field)


def worker_init(tok_spec, eod, field):
    global _TK
    if tok_spec == "byte":
        _TK = ("byte", None, eod, field)
    else:
        from tokenizers import Tokenizer
        _TK = ("json", Tokenizer.from_file(tok_spec), eod, field)


def tokenize_batch(batch):
    """batch: [(text, or a JSONL line as bytes, path, where)] -> (per-document
    lengths, the tokens with an end-of-document token after each), or the
    BadInput message of the batch's first bad line."""
    kind, tk, eod, field = _TK
    try:
        batch = [(parse_jsonl(t, p, w, field) if isinstance(t, bytes) else t, p, w) for t, p, w in batch]
    except BadInput as e:
        return str(e)
    if kind == "byte":
        parts = []
        for text, path, where in batch:
            b = text.encode("utf-8")
            if bytes(1) in b:
                at = f"line {where}" if where is not None else f"byte {b.index(bytes(1))}"
                return f"{path}: {at}: a NUL byte, which is the byte tokenizer's end-of-document token"
            parts.append(b)
            parts.append(bytes(1))
        toks = np.frombuffer(b"".join(parts), dtype=np.uint8).astype(np.uint32)
        lens = np.fromiter((len(p) + 1 for p in parts[::2]), dtype=np.int64, count=len(batch))
        return lens, toks
    encs = tk.encode_batch([t for t, _, _ in batch], add_special_tokens=False)
    lens = np.fromiter((len(e.ids) + 1 for e in encs), dtype=np.int64, count=len(batch))
    toks = np.empty(int(lens.sum()), dtype=np.uint32)
    at = 0
    for e in encs:
        n = len(e.ids)
        toks[at:at + n] = e.ids
        toks[at + n] = eod
        at += n + 1
    return lens, toks


# ------------------------------------------------------------ split

def val_mask(seed, first, n, fraction):
    """Documents first..first+n-1: True where the document is validation
    (splitmix64 of seed and document number, compared to the fraction)."""
    if fraction <= 0:
        return np.zeros(n, dtype=bool)
    with np.errstate(over="ignore"):
        x = (np.arange(first, first + n, dtype=np.uint64) +
             np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x100000001B3)) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


# ------------------------------------------------------------ writers

class Shards:
    """llm.c shards of at most cap tokens: DIR/NAME_SPLIT_000000.bin, ...;
    a lone shard is renamed NAME_SPLIT.bin."""

    def __init__(self, out_dir, stem, dtype, cap):
        self.out_dir, self.stem, self.dtype, self.cap = out_dir, stem, np.dtype(dtype), cap
        self.paths, self.f, self.n, self.total = [], None, 0, 0

    def _open(self):
        path = os.path.join(self.out_dir, f"{self.stem}_{len(self.paths):06d}.bin")
        self.paths.append(path)
        self.f = open(path + ".tmp", "wb")
        self.f.write(b"\0" * (HEADER_INTS * 4))
        self.n = 0

    def _seal(self):
        header = np.zeros(HEADER_INTS, dtype="<i4")
        if self.dtype == np.uint16:
            header[0], header[1] = SHARD_MAGIC_U16, SHARD_VERSION_U16
        else:
            header[0], header[1] = SHARD_MAGIC_U32, SHARD_VERSION_U32
        header[2] = self.n
        self.f.seek(0)
        self.f.write(header.tobytes())
        fsync_close(self.f)
        self.f = None

    def write(self, toks, lens):
        at = 0
        while at < toks.size:
            if self.f is None or self.n == self.cap:
                if self.f is not None:
                    self._seal()
                self._open()
            k = min(self.cap - self.n, toks.size - at)
            self.f.write(toks[at:at + k].astype(self.dtype).tobytes())
            self.n += k
            self.total += k
            at += k

    def close(self):
        """Seal, rename the .tmp files; returns (paths, data.train value)."""
        if self.f is not None:
            self._seal()
        final = self.paths
        if len(self.paths) == 1:
            final = [os.path.join(self.out_dir, f"{self.stem}.bin")]
        for tmp, path in zip(self.paths, final):
            os.replace(tmp + ".tmp", path)
        # shards of an earlier run of this name would join the glob: remove them
        keep = set(final)
        pat = re.compile(re.escape(self.stem) + r"(_\d{6})?\.bin$")
        for f in os.listdir(self.out_dir):
            p = os.path.join(self.out_dir, f)
            if pat.fullmatch(f) and p not in keep:
                os.remove(p)
        spec = final[0] if len(final) == 1 else os.path.join(self.out_dir, f"{self.stem}_*.bin")
        return final, spec

    def abort(self):
        if self.f is not None:
            self.f.close()
        for p in self.paths:
            if os.path.exists(p + ".tmp"):
                os.remove(p + ".tmp")


class Megatron:
    """NAME_SPLIT.bin + .idx (MMIDIDX version 1), one sequence per document."""

    def __init__(self, out_dir, stem, dtype, cap):
        del cap
        self.prefix = os.path.join(out_dir, stem)
        self.dtype = np.dtype(dtype)
        self.f = open(self.prefix + ".bin.tmp", "wb")
        self.sizes, self.total = [], 0

    def write(self, toks, lens):
        self.f.write(toks.astype(self.dtype.newbyteorder("<")).tobytes())
        self.sizes.append(lens)
        self.total += int(toks.size)

    def close(self):
        fsync_close(self.f)
        sizes = np.concatenate(self.sizes) if self.sizes else np.zeros(0, np.int64)
        if sizes.size and sizes.max() > 2**31 - 1:
            raise BadInput(f"{self.prefix}: a document of {sizes.max()} tokens, more than an index's int32 size")
        ptrs = np.zeros(sizes.size, dtype="<i8")
        if sizes.size > 1:
            ptrs[1:] = np.cumsum(sizes[:-1]) * self.dtype.itemsize
        docs = np.arange(sizes.size + 1, dtype="<i8")
        head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, MEGATRON_DTYPES[self.dtype], sizes.size, docs.size)
        os.replace(self.prefix + ".bin.tmp", self.prefix + ".bin")
        write_atomic(self.prefix + ".idx", head + sizes.astype("<i4").tobytes() + ptrs.tobytes() + docs.tobytes())
        return [self.prefix + ".bin", self.prefix + ".idx"], self.prefix

    def abort(self):
        self.f.close()
        if os.path.exists(self.prefix + ".bin.tmp"):
            os.remove(self.prefix + ".bin.tmp")


# ------------------------------------------------------------ vocab

def vocab_bytes(tokens, eot):
    header = np.zeros(256, dtype="<u4")
    header[0], header[1], header[2] = VOCAB_MAGIC, VOCAB_VERSION, len(tokens)
    header[3] = 0xFFFFFFFF if eot < 0 else eot
    out = [header.tobytes()]
    for b in tokens:
        b = b[:255]
        out.append(bytes([len(b)]))
        out.append(b)
    return b"".join(out)


def bytes_to_unicode():
    """GPT-2's byte <-> printable-unicode table used by ByteLevel BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def is_byte_level(spec):
    def has(node):
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                return True
            return any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False
    return has(spec.get("decoder")) or has(spec.get("pre_tokenizer"))


def tokenizer_vocab(tk, spec, n):
    """Each id's bytes: exact bytes for ByteLevel BPE, <0xNN> byte-fallback
    pieces as that byte, SentencePiece's U+2581 as a space, else decode()."""
    inv = {c: b for b, c in bytes_to_unicode().items()} if is_byte_level(spec) else None
    out = []
    for i in range(n):
        tok = tk.id_to_token(i)
        if tok is None:
            out.append(b"")
            continue
        m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", tok)
        if inv is not None and all(c in inv for c in tok):
            b = bytes(inv[c] for c in tok)
        elif m:
            b = bytes([int(m.group(1), 16)])
        elif "\u2581" in tok:
            b = tok.replace("\u2581", " ").encode("utf-8")
        elif inv is not None:
            b = tok.encode("utf-8")  # added/special token text
        else:
            b = (tk.decode([i], skip_special_tokens=False) or tok).encode("utf-8")
        out.append(b[:255])
    return out


def load_tokenizer(path, eod_flag):
    if not os.path.isfile(path):
        die(f"--tokenizer {path}: no such file (expected 'byte' or a tokenizer.json)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        die("--tokenizer tokenizer.json needs the 'tokenizers' package (python3 -m pip install tokenizers)")
    try:
        tk = Tokenizer.from_file(path)
        with open(path, "r", encoding="utf-8") as f:
            spec = json.load(f)
    except Exception as e:  # noqa: BLE001 -- any parse failure is a bad file
        die(f"--tokenizer {path}: cannot load ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    n_vocab = tk.get_vocab_size(with_added_tokens=True)
    eod = eod_flag
    if eod is None:
        for nm in EOT_NAMES:
            i = tk.token_to_id(nm)
            if i is not None:
                eod = i
                break
    if eod is None:
        die(f"--tokenizer {path}: no end-of-text token ({', '.join(EOT_NAMES)}); name one with --eod-token ID")
    if not 0 <= eod < n_vocab:
        die(f"--eod-token {eod}: outside the tokenizer's vocab of {n_vocab}")
    return tokenizer_vocab(tk, spec, n_vocab), eod


# ------------------------------------------------------------ main

class Progress:
    def __init__(self):
        self.t0 = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def update(self, docs, toks, final=False):
        now = time.monotonic()
        if not final and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        line = f"prepare: {docs} documents, {toks} tokens, {docs / dt:.0f} documents/s, {toks / dt:.0f} tokens/s"
        if self.tty:
            print("\r" + line, end="\n" if final else "", file=sys.stderr, flush=True)
        elif not final:
            print(line, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description="Tokenize documents (text, JSONL, Parquet) into llm.c shards or a Megatron indexed dataset.")
    ap.add_argument("--input", nargs="+", required=True, metavar="PATH", help="files, folders or globs, in order")
    ap.add_argument("--out-dir", required=True, metavar="DIR")
    ap.add_argument("--name", help="file name prefix (default: first input's name without extension)")
    ap.add_argument("--tokenizer", default="byte", help="'byte' (default) or a tokenizer.json path")
    ap.add_argument("--eod-token", type=int, help="end-of-document id (default: 0 for byte, the tokenizer's end-of-text)")
    ap.add_argument("--field", default="text", help="JSONL field / Parquet column holding the text (default text)")
    ap.add_argument("--text-docs", choices=("file", "paragraphs"), default="file",
                    help="a text file is one document (default) or one per paragraph")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="fraction of documents kept for validation")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the document split")
    ap.add_argument("--format", choices=("shards", "megatron"), default="shards")
    ap.add_argument("--shard-tokens", type=int, default=MAX_SHARD_TOKENS, help="tokens per llm.c shard at most")
    ap.add_argument("--workers", type=int, default=1, help="tokenizing processes")
    args = ap.parse_args()

    if not (0.0 <= args.val_fraction < 1.0):
        die(f"--val-fraction {args.val_fraction} must be in [0, 1)")
    if not 1 <= args.shard_tokens <= MAX_SHARD_TOKENS:
        die(f"--shard-tokens {args.shard_tokens} must be in [1, {MAX_SHARD_TOKENS}] (an llm.c header's count is int32)")
    if args.workers < 1:
        die(f"--workers {args.workers} must be at least 1")
    paths = expand_inputs(args.input)
    name = args.name or os.path.splitext(os.path.basename(paths[0]))[0]
    if not name or "/" in name:
        die(f"--name '{name}' must be a non-empty file name prefix")

    if args.tokenizer == "byte":
        vocab = [bytes([i]) for i in range(256)]
        eod = BYTE_EOD if args.eod_token is None else args.eod_token
        if eod != BYTE_EOD:
            die(f"--eod-token {eod}: the byte tokenizer's end-of-document token is {BYTE_EOD} (the NUL byte)")
    else:
        vocab, eod = load_tokenizer(args.tokenizer, args.eod_token)
    if args.format == "megatron":
        dtype = np.uint16 if len(vocab) <= 65535 else np.int32
    else:
        dtype = np.uint16 if len(vocab) <= 65535 else np.uint32
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        die(f"--out-dir {args.out_dir}: {e.strerror}")

    Writer = Megatron if args.format == "megatron" else Shards
    train_w = Writer(args.out_dir, f"{name}_train", dtype, args.shard_tokens)
    val_w = Writer(args.out_dir, f"{name}_val", dtype, args.shard_tokens) if args.val_fraction > 0 else None
    writers = [w for w in (train_w, val_w) if w is not None]
    n_docs = [0, 0]
    prog = Progress()
    pool = None
    try:
        work = batches(documents(paths, args.field, args.text_docs))
        if args.workers > 1:
            pool = multiprocessing.Pool(args.workers, worker_init, (args.tokenizer, eod, args.field))
            results = pool.imap(tokenize_batch, work)
        else:
            worker_init(args.tokenizer, eod, args.field)
            results = map(tokenize_batch, work)
        first = 0
        for res in results:
            if isinstance(res, str):
                raise BadInput(res)
            lens, toks = res
            is_val = val_mask(args.seed, first, lens.size, args.val_fraction)
            first += lens.size
            ends = np.cumsum(lens)
            starts = ends - lens
            for w, sel, k in ((train_w, ~is_val, 0), (val_w, is_val, 1)):
                if w is None or not sel.any():
                    continue
                idx = np.nonzero(sel)[0]
                keep = np.concatenate([np.arange(starts[i], ends[i]) for i in idx]) if idx.size < lens.size else slice(None)
                w.write(toks[keep], lens[idx])
                n_docs[k] += idx.size
            prog.update(first, train_w.total + (val_w.total if val_w else 0))
        if pool is not None:
            pool.close()
            pool.join()
            pool = None
        if first == 0:
            raise BadInput("the inputs hold no documents")
        if n_docs[0] == 0:
            raise BadInput(f"{first} documents leave none for training with --val-fraction {args.val_fraction} --seed {args.seed}")
        if val_w is not None and n_docs[1] == 0:
            raise BadInput(f"{first} documents give none for validation with --val-fraction {args.val_fraction} "
                           f"--seed {args.seed} (more documents, e.g. --text-docs paragraphs, or --val-fraction 0)")
        outs = [w.close() for w in writers]
    except BaseException as e:
        if pool is not None:
            pool.terminate()
        for w in writers:
            w.abort()
        if isinstance(e, BadInput):
            die(str(e))
        raise
    vocab_path = os.path.join(args.out_dir, f"{name}_vocab.bin")
    write_atomic(vocab_path, vocab_bytes(vocab, eod))
    prog.update(first, train_w.total + (val_w.total if val_w else 0), final=True)

    dt = max(time.monotonic() - prog.t0, 1e-9)
    total = train_w.total + (val_w.total if val_w else 0)
    width = {np.dtype(np.uint16): "uint16", np.dtype(np.uint32): "uint32", np.dtype(np.int32): "int32"}[np.dtype(dtype)]
    print(f"documents: {first} ({n_docs[0]} train, {n_docs[1]} val, seed {args.seed}) from {len(paths)} file(s)")
    print(f"tokens: {total} total, {train_w.total} train, {val_w.total if val_w else 0} val "
          f"({width}, vocab {len(vocab)}, one end-of-document token after each document)")
    print(f"tokens/s: {total / dt:.0f} ({dt:.2f} s, {args.workers} worker(s))")
    print(f"train: {outs[0][1]} ({', '.join(os.path.basename(p) for p in outs[0][0][:3])}"
          f"{', ...' if len(outs[0][0]) > 3 else ''}; {len(outs[0][0])} file(s))")
    if val_w is not None:
        print(f"val:   {outs[1][1]} ({len(outs[1][0])} file(s))")
    else:
        print("val:   none (--val-fraction 0)")
    print(f"vocab: {vocab_path} ({len(vocab)} tokens)")
    print(f"job: \"data\": {{\"train\": \"{outs[0][1]}\", "
          f"{'' if val_w is None else chr(34) + 'val' + chr(34) + ': ' + chr(34) + outs[1][1] + chr(34) + ', '}"
          f"\"vocab\": \"{vocab_path}\", \"eod_token\": {eod}}}")
    print(f"data.eod_token: {eod}")


if __name__ == "__main__":
    main()
