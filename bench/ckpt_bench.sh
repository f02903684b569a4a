#!/bin/bash
# Checkpoint benchmark for GPT-2 124M on the CPU backend (B=4, T=64, random
# tokens): how long training blocks for an asynchronous checkpoint against a
# synchronous one, and the checkpoint's write bandwidth against dd writing
# as many bytes to the same folder in the same run (both end with fsync).
#
# Each run trains 4 steps with checkpoint.every_steps=2 and measures the
# checkpoint begun after step 2: no earlier checkpoint is in flight then, so
# its ckpt_block_ms (metrics.jsonl) is only that checkpoint's own cost:
#   sync  (checkpoint.async=false): staging copy + write + fsync + commit
#   async (checkpoint.async=true):  staging copy only; the writer thread then
#         writes (and checksums) the file while steps 3 and 4 train, and the
#         checkpoint event's write_s is that background write.
# The step-4 checkpoint (end of training) first waits for the step-2 one, so
# it is not measured. dd runs once after each llmtrain run (a shared virtual
# disk varies from minute to minute): both figures are printed and their mean
# is compared. dd starts BENCH_CKPT_SETTLE seconds after the last file was
# deleted, as the checkpoint writer does (it starts well after the previous
# deletion): a buffered write right after deleting a file of the same size
# reuses the page cache just freed, and on the 2-core development VM ran 3-5x
# faster (1.3-1.8 GB/s) than one a second or more later (0.25-0.5 GB/s), which
# would compare the writer with a dd that had an advantage it never has.
#
# Environment: BENCH_CKPT_DIR (parent folder of the temporary checkpoint
# folder, default <repo>/runs; the numbers are for the disk holding it, which
# the output names with df -P), BENCH_CKPT_SETTLE (default 10). A checkpoint
# is ~1.5 GB; up to two exist at once, and everything is removed at the end.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
export LC_ALL=C

[ -x ./llmtrain ] || { echo "ckpt_bench: ./llmtrain not built (make llmtrain)" >&2; exit 1; }
PARENT=${BENCH_CKPT_DIR:-$PWD/runs}
mkdir -p "$PARENT"
DIR=$(mktemp -d "$PARENT/ckpt_bench.XXXXXX")
trap 'rm -rf "$DIR"' EXIT

$PY - "$DIR/tokens.bin" <<'EOF'
import sys, numpy as np
t = np.random.default_rng(0).integers(0, 50257, 200_000)
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(t.astype(np.uint16).tobytes())
EOF

cat >"$DIR/gpt2_124M.json" <<EOF
{"model": {"arch": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "max_seq_len": 1024},
 "data": {"train": "$DIR/tokens.bin"},
 "train": {"steps": 4, "seq_len": 64, "micro_batch": 4, "global_batch": 4, "device": "cpu"},
 "optim": {"lr": 3e-4, "warmup_steps": 0},
 "eval": {"sample_tokens": 0},
 "checkpoint": {"every_steps": 2, "keep_last": 1, "resume": "none"}}
EOF

# bytes of the step-2 checkpoint a run logged (0: none)
ckpt_bytes() {
    $PY - "$1" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"event":"checkpoint"')]
print(next((int(e["bytes"]) for e in ev if e["step"] == 2), 0))
EOF
}

SETTLE=${BENCH_CKPT_SETTLE:-10}
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
for mode in sync async; do
    async=false
    [ "$mode" = async ] && async=true
    if ! ./llmtrain "$DIR/gpt2_124M.json" --set "checkpoint.async=$async" --set "log.dir=$DIR/run_$mode" \
        --set "checkpoint.dir=$DIR/ck_$mode" >"$DIR/$mode.out" 2>&1; then
        cat "$DIR/$mode.out" >&2
        echo "ckpt_bench: the $mode checkpoint run failed (output above)" >&2
        exit 1
    fi
    rm -rf "$DIR/ck_$mode" # ~1.5 GB
    BYTES=$(ckpt_bytes "$DIR/run_$mode/metrics.jsonl")
    [ "$BYTES" -gt 0 ] || { echo "ckpt_bench: the $mode run logged no step-2 checkpoint in $DIR/run_$mode/metrics.jsonl" >&2; exit 1; }
    # as many MiB as the checkpoint has bytes (rounded up); fsync before dd ends
    sleep "$SETTLE"
    if ! dd if=/dev/zero of="$DIR/dd.bin" bs=1M count=$(( (BYTES + 1048575) / 1048576 )) conv=fsync 2>"$DIR/dd_$mode.err"; then
        cat "$DIR/dd_$mode.err" >&2
        echo "ckpt_bench: dd to $DIR failed (output above)" >&2
        exit 1
    fi
    rm -f "$DIR/dd.bin"
done

$PY - "$DIR" "$LOAD" <<'EOF'
import json, re, sys
d, load = sys.argv[1:3]

def measured(mode):
    lines = [json.loads(l) for l in open(f"{d}/run_{mode}/metrics.jsonl") if l.startswith("{")]
    step = next((l for l in lines if "event" not in l and l.get("step") == 2), None)
    ev = next((l for l in lines if l.get("event") == "checkpoint" and l.get("step") == 2), None)
    if step is None or "ckpt_block_ms" not in step or ev is None:
        sys.exit(f"ckpt_bench: {mode} run: no step-2 checkpoint in {d}/run_{mode}/metrics.jsonl")
    return step["ckpt_block_ms"], ev["bytes"], ev["write_s"]

def dd(mode):  # MB/s from dd's byte count and seconds, not its unit formatting
    err = open(f"{d}/dd_{mode}.err").read()
    m = re.search(r"^(\d+) bytes .* copied, ([0-9.]+) s", err, re.M)
    if not m:
        sys.exit(f"ckpt_bench: cannot read dd's output: {err!r}")
    return int(m.group(1)) / 1e6 / float(m.group(2))

sync_ms, sync_bytes, sync_write_s = measured("sync")
async_ms, nbytes, write_s = measured("async")
dd_1, dd_2 = dd("sync"), dd("async")
dd_mbs = (dd_1 + dd_2) / 2
mb = nbytes / 1e6
wr_mbs = mb / write_s
pct = 100 * async_ms / sync_ms
print(f"checkpoint gpt2_124M: {mb:.1f} MB per checkpoint | sync: blocked {sync_ms:.0f} ms | "
      f"async: blocked {async_ms:.0f} ms ({pct:.1f}% of sync; target < 10%{'' if pct < 10 else ': missed'}), "
      f"background write {write_s:.1f} s ({wr_mbs:.0f} MB/s) | dd to the same disk: {dd_mbs:.0f} MB/s "
      f"(write bandwidth {100 * wr_mbs / dd_mbs:.0f}% of dd)")
print(f"  async blocking = staging copy at {mb / async_ms:.2f} GB/s | sync run's write {sync_write_s:.1f} s "
      f"({sync_bytes / 1e6 / sync_write_s:.0f} MB/s) | dd {dd_1:.0f} MB/s after the sync run, {dd_2:.0f} MB/s after "
      f"the async one | load average before: {load}")
EOF
echo "  disk ($DIR):"
df -P "$DIR" | sed 's/^/    /'
