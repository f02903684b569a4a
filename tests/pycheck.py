"""pycheck.py — what the Python suites share: the ok/FAIL lines with their
"N passed, M failed" summary, and the llm.c token shards the real runs
train on."""
import sys

import numpy as np

counts = {"passed": 0, "failed": 0}


def check(ok, msg):
    counts["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {msg}")


def finish():
    """The summary line run_all.sh reads; exit 1 on any failure."""
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    sys.exit(1 if counts["failed"] else 0)


def write_shard(path, vocab, n, seed):
    """n random tokens below vocab as an llm.c shard (magic 20240520, version 1)."""
    t = np.random.default_rng(seed).integers(0, vocab, n)
    h = np.zeros(256, np.int32)
    h[:3] = (20240520, 1, len(t))
    with open(path, "wb") as f:
        f.write(h.tobytes() + t.astype(np.uint16).tobytes())


def run_suite(name, body):
    """The suites' command line, [--bin ./llmtrain] [--keep]: body(tmp,
    binary) in a fresh temporary folder (kept with --keep), then finish()."""
    import argparse
    import os
    import shutil
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(root, "llmtrain"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix=f"{name}.")
    try:
        body(tmp, os.path.abspath(args.bin))
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    finish()
