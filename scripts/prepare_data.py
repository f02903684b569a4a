#!/usr/bin/python3
"""prepare_data.py -- turn text files into llmtrain token shards (llm.c format).

    prepare_data.py --input FILE [FILE...] --out-dir DIR [--name NAME]
                    [--val-fraction 0.1] [--tokenizer byte|PATH/tokenizer.json]

Writes DIR/NAME_train.bin, DIR/NAME_val.bin and DIR/NAME_vocab.bin (each to
a .tmp file first, then os.replace) and prints the token counts.

  * Shards: 256 x int32 header (magic, version, token count), then tokens:
    magic 20240520 version 1 = uint16 tokens (vocab <= 65535), otherwise
    magic 20240801 version 7 = uint32 tokens.
  * Vocab: 256 x uint32 header (magic 20240328, version 2, vocab_size,
    eot_token or 0xFFFFFFFF for none), then per token a uint8 length and that
    many bytes (at most 255).
  * --tokenizer byte (default): token = byte value, vocab 256, no EOT.
    The files are concatenated as they are.
  * --tokenizer tokenizer.json: the Hugging Face `tokenizers` package (only
    needed for this mode). If the tokenizer has an end-of-text token
    (<|endoftext|>, <|end_of_text|>, </s>, <eos>), it is put before each
    input file's tokens (llm.c's convention: files are documents). Text is
    encoded in chunks that end at a line break (a token never spans one in
    practice), so huge files need not be encoded in one call.
  * Split: the last --val-fraction of all tokens is the validation set.

Needs only numpy and the standard library (plus `tokenizers` for a
tokenizer.json). Exit status 2 with one error line on bad input.
"""
import argparse
import json
import os
import re
import sys

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
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32
CHUNK = 1 << 24               # bytes / tokens per streamed piece
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def die(msg):
    print(f"prepare_data.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


class ShardWriter:
    """Streams tokens into DIR/file.tmp; close() fixes the count and renames."""

    def __init__(self, path, dtype):
        self.path, self.tmp = path, path + ".tmp"
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.f = open(self.tmp, "wb")
        self.f.write(b"\0" * (HEADER_INTS * 4))

    def write(self, arr):
        arr = np.asarray(arr)
        if arr.size == 0:
            return
        self.n += int(arr.size)
        if self.n > MAX_SHARD_TOKENS:
            self.abort()
            die(f"{self.path}: more than {MAX_SHARD_TOKENS} tokens for one shard (the header count is int32); "
                "split the input into several runs")
        self.f.write(arr.astype(self.dtype, copy=False).tobytes())

    def close(self):
        header = np.zeros(HEADER_INTS, dtype="<i4")
        if self.dtype == np.uint16:
            header[0], header[1] = SHARD_MAGIC_U16, SHARD_VERSION_U16
        else:
            header[0], header[1] = SHARD_MAGIC_U32, SHARD_VERSION_U32
        header[2] = self.n
        self.f.seek(0)
        self.f.write(header.tobytes())
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self):
        try:
            self.f.close()
            os.remove(self.tmp)
        except OSError:
            pass


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def vocab_bytes(tokens, eot):
    """tokens: list of bytes (truncated to 255). eot: id or -1."""
    header = np.zeros(256, dtype="<u4")
    header[0], header[1], header[2] = VOCAB_MAGIC, VOCAB_VERSION, len(tokens)
    header[3] = 0xFFFFFFFF if eot < 0 else eot
    out = [header.tobytes()]
    for b in tokens:
        b = b[:255]
        out.append(bytes([len(b)]))
        out.append(b)
    return b"".join(out)


# ------------------------------------------------------------ byte level

def byte_chunks(inputs):
    for path in inputs:
        with open(path, "rb") as f:
            while True:
                buf = f.read(CHUNK)
                if not buf:
                    break
                yield np.frombuffer(buf, dtype=np.uint8)


# ------------------------------------------------------------ tokenizer.json

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


def text_pieces(path):
    """Yield the file's text in pieces of about CHUNK bytes ending at a newline."""
    with open(path, "r", encoding="utf-8", errors="replace", newline="") as f:
        rest = ""
        while True:
            buf = f.read(CHUNK)
            if not buf:
                break
            buf = rest + buf
            cut = buf.rfind("\n")
            if cut < 0:
                rest = buf
                continue
            rest = buf[cut + 1:]
            yield buf[:cut + 1]
        if rest:
            yield rest


def tokenizer_chunks(tk, inputs, eot):
    for path in inputs:
        if eot >= 0:
            yield np.array([eot], dtype=np.uint32)
        for piece in text_pieces(path):
            ids = tk.encode(piece, add_special_tokens=False).ids
            yield np.asarray(ids, dtype=np.uint32)


# ------------------------------------------------------------ main

def split_write(chunks, total, n_train, train_w, val_w):
    """Send the first n_train tokens of the stream to train_w, the rest to val_w."""
    seen = 0
    for arr in chunks:
        a = seen
        seen += arr.size
        if a >= n_train:
            val_w.write(arr)
        elif seen <= n_train:
            train_w.write(arr)
        else:
            k = n_train - a
            train_w.write(arr[:k])
            val_w.write(arr[k:])
    if seen != total:
        die(f"input changed while reading ({seen} tokens, expected {total})")


class Null:
    n = 0

    def write(self, arr):
        if np.asarray(arr).size:
            raise AssertionError("val tokens with val-fraction 0")


def main():
    ap = argparse.ArgumentParser(description="Write llm.c-format token shards and vocab from text files.")
    ap.add_argument("--input", nargs="+", required=True, metavar="FILE", help="text files, concatenated in order")
    ap.add_argument("--out-dir", required=True, metavar="DIR")
    ap.add_argument("--name", help="file name prefix (default: first input's name without extension)")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="last fraction of tokens kept for validation")
    ap.add_argument("--tokenizer", default="byte", help="'byte' (default) or a tokenizer.json path")
    args = ap.parse_args()

    if not (0.0 <= args.val_fraction < 1.0):
        die(f"--val-fraction {args.val_fraction} must be in [0, 1)")
    for p in args.input:
        if not os.path.exists(p):
            die(f"--input {p}: no such file")
        if not os.path.isfile(p):
            die(f"--input {p}: not a regular file")
        if not os.access(p, os.R_OK):
            die(f"--input {p}: not readable")
    name = args.name or os.path.splitext(os.path.basename(args.input[0]))[0]
    if not name or "/" in name:
        die(f"--name '{name}' must be a non-empty file name prefix")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        die(f"--out-dir {args.out_dir}: {e.strerror}")
    train_path = os.path.join(args.out_dir, f"{name}_train.bin")
    val_path = os.path.join(args.out_dir, f"{name}_val.bin")
    vocab_path = os.path.join(args.out_dir, f"{name}_vocab.bin")

    if args.tokenizer == "byte":
        vocab = [bytes([i]) for i in range(256)]
        eot = -1
        total = sum(os.path.getsize(p) for p in args.input)
        dtype = np.uint16
        make_chunks = lambda: byte_chunks(args.input)
        spill = None
    else:
        if not os.path.isfile(args.tokenizer):
            die(f"--tokenizer {args.tokenizer}: no such file (expected 'byte' or a tokenizer.json)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            die("--tokenizer tokenizer.json needs the 'tokenizers' package (pip install tokenizers)")
        try:
            tk = Tokenizer.from_file(args.tokenizer)
            with open(args.tokenizer, "r", encoding="utf-8") as f:
                spec = json.load(f)
        except Exception as e:  # noqa: BLE001 -- any parse failure is a bad file
            die(f"--tokenizer {args.tokenizer}: cannot load ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        n_vocab = tk.get_vocab_size(with_added_tokens=True)
        eot = -1
        for nm in EOT_NAMES:
            i = tk.token_to_id(nm)
            if i is not None:
                eot = i
                break
        vocab = tokenizer_vocab(tk, spec, n_vocab)
        dtype = np.uint16 if n_vocab <= 65535 else np.uint32
        # Token count is unknown until encoded: spill all tokens to a raw
        # file, then split it (memory stays bounded for any corpus size).
        spill = os.path.join(args.out_dir, f".{name}_all.u32.tmp")
        total = 0
        with open(spill, "wb") as f:
            for arr in tokenizer_chunks(tk, args.input, eot):
                f.write(arr.astype("<u4").tobytes())
                total += arr.size

        def make_chunks():
            if total == 0:
                return
            mm = np.memmap(spill, dtype="<u4", mode="r")
            for a in range(0, total, CHUNK):
                yield np.array(mm[a:a + CHUNK])
            del mm

    if total == 0:
        if spill:
            os.remove(spill)
        die("the input files contain no tokens")
    n_val = int(round(total * args.val_fraction))
    n_train = total - n_val
    if n_train == 0:
        die(f"{total} tokens leave none for training with --val-fraction {args.val_fraction}")
    if args.val_fraction > 0 and n_val == 0:
        die(f"{total} tokens are too few for a validation set with --val-fraction {args.val_fraction}")

    train_w = ShardWriter(train_path, dtype)
    val_w = ShardWriter(val_path, dtype) if n_val > 0 else Null()
    try:
        split_write(make_chunks(), total, n_train, train_w, val_w)
    except BaseException:
        train_w.abort()
        if n_val > 0:
            val_w.abort()
        raise
    finally:
        if spill and os.path.exists(spill):
            os.remove(spill)
    train_w.close()
    if n_val > 0:
        val_w.close()
    write_atomic(vocab_path, vocab_bytes(vocab, eot))

    width = "uint16" if dtype == np.uint16 else "uint32"
    print(f"tokens: {total} total, {n_train} train, {n_val} val ({width}, vocab {len(vocab)}, "
          f"eot {eot if eot >= 0 else 'none'})")
    print(f"train: {train_path} ({n_train} tokens)")
    if n_val > 0:
        print(f"val:   {val_path} ({n_val} tokens)")
    else:
        print("val:   none (--val-fraction 0)")
    print(f"vocab: {vocab_path} ({len(vocab)} tokens)")


if __name__ == "__main__":
    main()
