# tests/lib.sh — shared prelude of the multi-rank shell tests: repo root,
# binary, a temp dir removed on exit, MPI as root on 2 cores, counters with
# ok/bad reporters, and a random token shard writer. Source it: `. "$(dirname "$0")/lib.sh"`.
cd "$(dirname "$0")/.." || exit 2
BIN=$PWD/llmtrain
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --allow-run-as-root -np"
pass=0; fail=0

# write_shard PATH VOCAB NTOKENS SEED: uniform random uint16 tokens, llm.c format
write_shard() {
    $PY - "$@" <<'PYEOF'
import sys, numpy as np
path, vocab, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = np.random.default_rng(seed).integers(0, vocab, n)
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))
open(path, "wb").write(h.tobytes() + t.astype(np.uint16).tobytes())
PYEOF
}
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
