#!/usr/bin/env bash
# compare_builds.sh — do two llmtrain binaries train the same model? For a
# change that should move code and not behaviour: the same small Llama job
# (GQA, evaluation, sampling) on 1 rank, FULL_SHARD over 2 ranks and tensor
# parallel 2, on each binary; the model, batch and layout lines (groups, each
# rank's bytes), the step and validation lines less their timings, the
# sampled tokens, and the exported model.safetensors must be byte-identical.
#
#   scripts/compare_builds.sh OLD_BINARY NEW_BINARY [--set key=value ...]
#
# Extra arguments go to every run (--set train.device=cuda with two builds of
# tests/llmtrain_emu compares the CUDA emulation; LLMTRAIN_CUDA_EMU_DEVICES=2
# is set). Exit 0 when everything matches, 1 when anything differs (named),
# 2 for a bad command line.
set -u
[ $# -ge 2 ] || { echo "usage: scripts/compare_builds.sh OLD_BINARY NEW_BINARY [--set key=value ...]" >&2; exit 2; }
OLD=$1 NEW=$2
shift 2
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "compare_builds.sh: $b: not an executable" >&2; exit 2; }; done
W=$(mktemp -d /tmp/compare_builds.XXXXXX)
trap 'rm -rf "$W"' EXIT
export LLMTRAIN_CUDA_EMU_DEVICES=2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
python3 - "$W/train.bin" <<'EOF'
import random, struct, sys
r = random.Random(7)
t = [r.randrange(96) for _ in range(30000)]
h = [20240520, 1, len(t)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *h) + struct.pack("<%dH" % len(t), *t))
EOF
cat > "$W/job.json" <<EOF
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "vocab_size": 96, "max_seq_len": 32},
 "data": {"train": "$W/train.bin", "val": "$W/train.bin"},
 "train": {"steps": 6, "seq_len": 32, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 1.0},
 "eval": {"sample_tokens": 8, "batches": 2, "every_steps": 3}}
EOF
# the lines that carry the model's numbers and the layout's (the model and
# batch header, the groups and each rank's bytes, step and val lines, the
# sampled tokens), less timings, memory and paths
strip() {
    sed -E "s@[0-9.]+ tok/s|MFU [0-9.]+%|[0-9.]+ ms|ETA [0-9:]+|mem [0-9.]+ GiB|in [0-9.]+ s|\([0-9.]+ MB/s\)|[0-9.]+ GFLOP/s|$W/[a-z0-9_]*@@g" |
        awk 'sample { print; sample = 0; next }
             /^--- sample ---$/ { print; sample = 1; next }
             /^(step|val|model|batch|tokens|optim|parallel|tensor parallel|  (shard|replicate|TP) group|  tp_rank|  rank [0-9]+:)/'
}
fail=0
for lay in "1 one_rank" "2 full_shard --set parallel.strategy=FULL_SHARD" "2 tensor2 --set parallel.tensor=2"; do
    read -r np name rest <<<"$lay"
    for which in old new; do
        bin=$OLD
        [ $which = new ] && bin=$NEW
        cmd=("$bin")
        [ "$np" -gt 1 ] && cmd=(mpirun --oversubscribe --allow-run-as-root -np "$np" "$bin")
        d="$W/$name.$which"
        # shellcheck disable=SC2086
        if ! "${cmd[@]}" "$W/job.json" --set log.dir="$d" --set checkpoint.resume=none $rest "$@" > "$d.out" 2>&1; then
            echo "$name: the $which binary failed (last lines below)"; tail -3 "$d.out"; fail=1; continue
        fi
        strip < "$d.out" > "$d.steps"
        "$bin" export "$d/checkpoints" "$d/hf" > /dev/null 2>&1 || { echo "$name: the $which binary's export failed"; fail=1; }
    done
    if [ ! -s "$W/$name.old.steps" ]; then echo "$name: no output lines"; fail=1
    elif cmp -s "$W/$name.old.steps" "$W/$name.new.steps"; then echo "$name: output lines identical ($(wc -l < "$W/$name.new.steps") lines)"
    else echo "$name: output lines differ:"; diff "$W/$name.old.steps" "$W/$name.new.steps" | head -6; fail=1; fi
    if cmp -s "$W/$name.old/hf/model.safetensors" "$W/$name.new/hf/model.safetensors"; then
        echo "$name: exported model.safetensors byte-identical"
    else echo "$name: exported model.safetensors differ"; fail=1; fi
done
exit $fail
