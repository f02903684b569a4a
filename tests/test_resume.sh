#!/bin/bash
# Checkpoints and resume (checkpoint.*): a run killed mid-way and restarted
# continues bit-identically to an uninterrupted run of the same layout
# (losses and exported weights), on 1 rank and sharded on 2 and 4; a chain
# tp2 x FULL_SHARD 2 (4 ranks) -> 1 rank -> 2 ranks HYBRID_SHARD continues the
# uninterrupted losses within reduction-order tolerance; SIGTERM (and
# SIGUSR1, SIGINT, SIGHUP; a SIGHUP ignored under nohup stays so) writes a
# checkpoint and exits 143, during an evaluation (abandoned) or a sample (cut
# short) too; durable_dir holds a second complete copy that
# resume falls back to, verified against the manifest's checksums, made again
# by the next start when it was cut off, and whose failure for the final
# checkpoint is exit 3; keep_last never prunes the checkpoint just written;
# 150 asynchronous checkpoints with durable copies leave the open files,
# threads, memory maps and folders of a run where they were;
# samples after a resume are the uninterrupted run's; metrics.jsonl is
# appended and its gradient-spike fields match a recomputation from the
# logged norms.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
cat >"$TMP/job.json" <<EOF2
{"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2,
           "vocab_size": 96, "max_seq_len": 16},
 "data": {"train": "$TMP/train.bin"},
 "train": {"steps": 10, "seq_len": 16, "micro_batch": 2, "global_batch": 8},
 "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
 "checkpoint": {"every_steps": 3},
 "eval": {"sample_tokens": 0}}
EOF2
# run NAME NP [args...]: train into $TMP/NAME (log and checkpoints), output in $TMP/NAME.out (appended)
run() {
    local name=$1 np=$2; shift 2
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set log.dir="$TMP/$name" "$@" >>"$TMP/$name.out" 2>&1
}
export_run() { $BIN export "$TMP/$1/checkpoints" "$TMP/$1/hf" >/dev/null 2>&1; }

# ---- exact resume, same layout: 1 rank, FULL_SHARD 2, HYBRID_SHARD 2x2 ----
for layout in "1" "2 --set parallel.strategy=FULL_SHARD" "4 --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=2"; do
    read -r np rest <<<"$layout"
    tag="np$np"
    run ref-$tag $np $rest
    LLMTRAIN_FAULT="rank=$((np - 1)),step=8,kind=die" run cut-$tag $np $rest --set checkpoint.async=false
    rc1=$?
    run cut-$tag $np $rest
    rc2=$?
    export_run ref-$tag; export_run cut-$tag
    if [ $rc1 -ne 0 ] && [ $rc2 -eq 0 ] && grep -q "resume: .*step_00000006 at step 6" "$TMP/cut-$tag.out" &&
       $PY tests/compare_runs.py "$TMP/ref-$tag" "$TMP/cut-$tag" --steps 10 --exact; then
        ok "$np rank(s) ${rest:+($rest) }killed at step 8, resumed from step 6: losses and weights bit-identical"
    else
        bad "$tag exact resume: rc $rc1/$rc2; $(grep -E 'resume|error' "$TMP/cut-$tag.out" | head -3)"
    fi
done
# async (default): the checkpoint being written when the rank died is lost, never half-used
if ! ls -d "$TMP"/cut-np*/checkpoints/*.tmp >/dev/null 2>&1; then ok "no .tmp folder left after the restarts"; else bad "a .tmp folder was left"; fi

# ---- metrics.jsonl appended: a resume event, every step present, spikes recomputed ----
# spikes_match METRICS STEPS: the final lineage's (the last line of each
# step) grad_norm_mean20, grad_spike and grad_spike_steps against the rule
# recomputed from the logged norms: the mean of the previous 20 (fewer while
# fewer are behind), a spike only once 20 are, above the mean + 0.1; prints
# how many steps a mean over fewer than 20 would have flagged
spikes_match() {
    $PY - "$@" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
last = {}
for l in lines:
    if "loss" in l: last[l["step"]] = l
hist, run_len, early = [], 0, 0
for s in range(1, int(sys.argv[2]) + 1):
    l = last[s]; g = l["grad_norm"]
    mean = sum(hist[-20:]) / len(hist[-20:]) if hist else None
    early += mean is not None and len(hist) < 20 and g > mean + 0.1
    spike = len(hist) >= 20 and g > mean + 0.1
    assert l["grad_spike"] == spike, (s, l, mean)
    if mean is not None: assert abs(l["grad_norm_mean20"] - mean) <= 1e-8 * mean, (s, l, mean)  # of norms logged to 9 digits
    else: assert "grad_norm_mean20" not in l
    ended = run_len if (not spike and run_len) else 0
    assert l.get("grad_spike_steps", 0) == ended, (s, l, ended)
    run_len = run_len + 1 if spike else 0
    hist.append(g)
print(early)
PYEOF
}
if $PY - "$TMP/cut-np1/metrics.jsonl" <<'PYEOF' && spikes_match "$TMP/cut-np1/metrics.jsonl" 10 >/dev/null
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ev = [l for l in lines if l.get("event") == "resume"]
assert len(ev) == 1 and ev[0]["step"] == 6, ev
steps = [l["step"] for l in lines if "loss" in l]
assert steps[:7] == list(range(1, 8)) and steps[7:] == list(range(7, 11)), steps
assert any(l.get("event") == "checkpoint" and l["step"] == 9 for l in lines)
PYEOF
then ok "metrics.jsonl appended on resume (resume event, steps 7-10 re-logged); spike fields match a recomputation across the restart"
else bad "metrics.jsonl after resume"; fi
# 30 steps, killed at step 24 and resumed from 21: no spike is flagged
# before 20 norms are behind a step (steps whose mean over fewer a norm
# exceeds by 0.1 are there: the count must be above 0), and after that the
# tracker continues across the restart
LLMTRAIN_FAULT="rank=0,step=24,kind=die" run spk 1 --set train.steps=30 --set checkpoint.async=false
run spk 1 --set train.steps=30; rc=$?
early=$(spikes_match "$TMP/spk/metrics.jsonl" 30)
if [ $rc -eq 0 ] && grep -q "resume: .*step_00000021 at step 21" "$TMP/spk.out" && [ "${early:-0}" -gt 0 ]; then
    ok "grad-norm spikes: none flagged before the 20-step window is full ($early steps above a shorter mean + 0.1), the rule recomputed over 30 steps and a restart at 21"
else bad "spikes over 30 steps: rc $rc, early '$early'; $(grep -E 'resume|llmtrain:' "$TMP/spk.out" | head -3)"; fi

# ---- reshard chain: tp2 x FULL_SHARD 2 (4) -> 1 rank -> 2 ranks HYBRID_SHARD (2 replicas) ----
LLMTRAIN_FAULT="rank=1,step=5,kind=die" run chain 4 --set parallel.tensor=2 --set parallel.strategy=FULL_SHARD --set checkpoint.async=false
LLMTRAIN_FAULT="rank=0,step=8,kind=die" run chain 1 --set checkpoint.async=false
run chain 2 --set parallel.strategy=HYBRID_SHARD --set parallel.shard_degree=1
rc=$?
export_run chain
if [ $rc -eq 0 ] && grep -q "resume: .*step_00000003 at step 3 (written by 4 ranks: tp 2 x shard 2 x replicate 1; now 1" "$TMP/chain.out" &&
   grep -q "resume: .*step_00000006 at step 6 (written by 1 rank: tp 1 x shard 1 x replicate 1; now 2: tp 1 x shard 1 x replicate 2)" "$TMP/chain.out" &&
   $PY tests/compare_runs.py "$TMP/ref-np1" "$TMP/chain" --steps 10 --loss-rtol 1e-5 --weight-rtol 1e-3; then
    ok "reshard: tp2 x FULL_SHARD 2 -> 1 rank -> HYBRID_SHARD 2 replicas continues the uninterrupted losses and weights"
else
    bad "reshard chain rc $rc: $(grep -E 'resume|llmtrain:' "$TMP/chain.out" | head -4)"
fi
# export reads a sharded checkpoint of any layout: tp2 x FULL_SHARD's step 3 = 1 rank's step 3 (reduction order aside:
# Adam turns the round-off of near-zero gradients into up to 1e-4 of a tensor's scale after 3 steps; a misplaced
# shard would be off by the weights' own size)
$BIN export "$TMP/chain/checkpoints/step_00000003" "$TMP/e3" >/dev/null 2>&1
$BIN export "$TMP/ref-np1/checkpoints/step_00000003" "$TMP/r3" >/dev/null 2>&1
if $PY - "$TMP/e3/model.safetensors" "$TMP/r3/model.safetensors" <<'PYEOF'
import sys, numpy as np
sys.path.insert(0, "tests")
import hfio
a, b = hfio.read_safetensors(sys.argv[1]), hfio.read_safetensors(sys.argv[2])
assert set(a) == set(b) and len(a) > 0
for k in a:
    assert a[k].shape == b[k].shape, k
    assert np.abs(a[k] - b[k]).max() <= 1e-3 * max(1e-3, np.abs(b[k]).max()), k
PYEOF
then ok "export of the 4-rank tp2 x FULL_SHARD checkpoint equals the 1-rank one (every tensor, 1e-3 of its scale)"
else bad "export of the tp2 x FULL_SHARD step 3 differs from 1 rank"; fi

# ---- durable_dir: a second complete copy; resume falls back to it ----
LLMTRAIN_FAULT="rank=0,step=8,kind=die" run dur 1 --set checkpoint.durable_dir="$TMP/durable" --set checkpoint.keep_last=1 \
    --set checkpoint.async=false
if [ -f "$TMP/durable/step_00000006/manifest.json" ] && cmp -s "$TMP/durable/step_00000006/manifest.json" "$TMP/dur/checkpoints/step_00000006/manifest.json" &&
   cmp -s "$TMP/durable/step_00000006/rank_00000.bin" "$TMP/dur/checkpoints/step_00000006/rank_00000.bin" &&
   [ "$(ls "$TMP/durable")" = "step_00000006" ]; then
    ok "durable_dir: the same files and manifest, keep_last applied there too"
else bad "durable_dir copy: $(ls "$TMP/durable" 2>&1)"; fi
rm -rf "$TMP/dur/checkpoints"
run dur 1 --set checkpoint.durable_dir="$TMP/durable" --set checkpoint.keep_last=1
export_run dur
if grep -q "resume: $TMP/durable/step_00000006 at step 6" "$TMP/dur.out" && $PY tests/compare_runs.py "$TMP/ref-np1" "$TMP/dur" --steps 10 --exact >/dev/null &&
   [ -f "$TMP/durable/step_00000010/manifest.json" ]; then
    ok "local checkpoints gone: resumed from durable_dir, bit-identical; the final one copied there"
else bad "resume from durable_dir: $(grep resume "$TMP/dur.out")"; fi

disks=()
full_disk() { # full_disk NAME [OPTIONS]: a 1900 KiB tmpfs at $TMP/NAME (a checkpoint here is 0.74 MB)
    mkdir -p "$TMP/$1" && mount -t tmpfs -o "${2:-size=1900k}" tmpfs "$TMP/$1" && disks+=("$TMP/$1")
}
trap 'for d in "${disks[@]}"; do umount "$d"; done; rm -rf "$TMP"' EXIT
# ---- durable copies that fail (a durable_dir on a 64 KiB tmpfs: writable
# at start, too small for a copy). The copy of the final checkpoint failing
# is exit 3 (the local disk may not outlive the job); a local file that
# changed after it was written (LLMTRAIN_FAULT kind=ckpt_rot) is not copied
# as if the manifest described it ----
full_disk durfail-disk size=64k || bad "durfail: cannot mount a tmpfs"
run durfail 1 --set train.steps=4 --set checkpoint.durable_dir="$TMP/durfail-disk/durable"; rc=$?
if [ $rc -eq 3 ] && grep -q "checkpoint step 3: the copy to $TMP/durfail-disk/durable failed; the checkpoint is complete in $TMP/durfail/checkpoints only" "$TMP/durfail.out" &&
   grep -q "the final checkpoint (step 4) is complete in $TMP/durfail/checkpoints but could not be copied to $TMP/durfail-disk/durable" "$TMP/durfail.out" &&
   [ -f "$TMP/durfail/checkpoints/step_00000004/manifest.json" ]; then
    ok "durable copies failing: each one line, the local checkpoint complete; the final one's: exit 3"
else bad "durable copy failing: rc $rc; $(grep -E 'copy|final' "$TMP/durfail.out" | head -3)"; fi
LLMTRAIN_FAULT="rank=0,step=6,kind=ckpt_rot" run rot 1 --set checkpoint.durable_dir="$TMP/rotdur" --set checkpoint.keep_last=1 \
    --set checkpoint.async=false; rc=$?
if [ $rc -eq 0 ] && grep -q "checkpoint step 6: rank_00000.bin read .* for the durable copy; the manifest says .* (the local file changed after it was written)" "$TMP/rot.out" &&
   $PY - "$TMP/rot/metrics.jsonl" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"event":"checkpoint"' in l]
assert [e["step"] for e in ev if e["durable"]] == [3, 9, 10], ev
assert [e["step"] for e in ev if not e["durable"]] == [3, 6, 9, 10], ev
PYEOF
then ok "a local file changed before its durable copy: that copy refused (steps 3, 9 and 10 copied, not 6)"
else bad "ckpt_rot: rc $rc; $(grep -E 'durable|changed' "$TMP/rot.out" | head -3)"; fi

# ---- a durable copy that never completed (the job died during it) is made
# again by the next start, here one with nothing left to train ----
rm -rf "$TMP/rotdur/step_00000010" && mkdir -p "$TMP/rotdur/step_00000010.tmp" &&
    head -c 100 "$TMP/rot/checkpoints/step_00000010/rank_00000.bin" >"$TMP/rotdur/step_00000010.tmp/rank_00000.bin"
run rot 1 --set checkpoint.durable_dir="$TMP/rotdur" --set checkpoint.keep_last=1; rc=$?
if [ $rc -eq 0 ] && grep -q "^resume: $TMP/rotdur has no complete step 10; copying it there again" "$TMP/rot.out" &&
   grep -q "nothing to train" "$TMP/rot.out" && [ "$(ls "$TMP/rotdur")" = "step_00000010" ] &&
   cmp -s "$TMP/rotdur/step_00000010/manifest.json" "$TMP/rot/checkpoints/step_00000010/manifest.json" &&
   cmp -s "$TMP/rotdur/step_00000010/rank_00000.bin" "$TMP/rot/checkpoints/step_00000010/rank_00000.bin"; then
    ok "resumed from a local checkpoint whose durable copy was cut off: copied again, the same manifest and file"
else bad "durable copy not redone: rc $rc; $(ls "$TMP/rotdur" | tr '\n' ' '); $(grep -E 'resume' "$TMP/rot.out" | tail -2)"; fi
# the same on 2 ranks (FULL_SHARD: each copies its own file), with steps left to train
run rc2 2 --set train.steps=6 --set parallel.strategy=FULL_SHARD --set checkpoint.durable_dir="$TMP/rc2dur"
rm -rf "$TMP/rc2dur/step_00000006"
run rc2 2 --set train.steps=8 --set parallel.strategy=FULL_SHARD --set checkpoint.durable_dir="$TMP/rc2dur" \
    --set optim.override_schedule=true; rc=$?
if [ $rc -eq 0 ] && grep -q "^resume: $TMP/rc2dur has no complete step 6; copying it there again" "$TMP/rc2.out" &&
   cmp -s "$TMP/rc2dur/step_00000006/rank_00001.bin" "$TMP/rc2/checkpoints/step_00000006/rank_00001.bin" &&
   cmp -s "$TMP/rc2dur/step_00000006/rank_00000.bin" "$TMP/rc2/checkpoints/step_00000006/rank_00000.bin" &&
   [ -f "$TMP/rc2dur/step_00000008/manifest.json" ]; then
    ok "2 ranks FULL_SHARD: the cut-off durable copy of step 6 made again beside training on to step 8"
else bad "2-rank durable re-copy: rc $rc; $(ls "$TMP/rc2dur" | tr '\n' ' '); $(grep -E 'resume|error' "$TMP/rc2.out" | tail -2)"; fi

# ---- a full disk (a tmpfs that holds two checkpoints, not three). Under
# keep_last 2 the oldest checkpoint goes before the new one is written again
# (1 rank, 2 ranks FULL_SHARD, and a full durable_dir whose copy is made
# again), the run checkpoints every time and ends as the reference run; under
# keep_last 0 (keep all) each checkpoint after the second is dropped with one
# line saying the disk is full and a checkpoint_failed event, the final one
# exit 3 ----
# events NAME: "checkpoint events | failed events" of $TMP/NAME/metrics.jsonl
events() {
    $PY - "$TMP/$1/metrics.jsonl" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"event":"checkpoint' in l]
ok = " ".join(f"{e['step']}{'d' if e['durable'] else ''}" for e in ev if e["event"] == "checkpoint")
bad = " ".join(f"{e['step']}:{e['disk_full']}:{'No space left on device' in e['error']}" for e in ev if e["event"] == "checkpoint_failed")
print(f"{ok} | {bad}")
PYEOF
}
for spec in "full1 1" "full2 2 --set parallel.strategy=FULL_SHARD"; do
    read -r name np rest <<<"$spec"
    if ! full_disk "$name-disk"; then bad "$name: cannot mount a tmpfs at $TMP/$name-disk (this test runs as root)"; continue; fi
    run "$name" "$np" $rest --set checkpoint.dir="$TMP/$name-disk" --set checkpoint.every_steps=2 --set checkpoint.keep_last=2; rc=$?
    $BIN export "$TMP/$name-disk" "$TMP/$name/hf" >/dev/null 2>&1
    ref=ref-np1; [ "$np" = 2 ] && { run "$name-ref" 2 $rest; export_run "$name-ref"; ref=$name-ref; }
    n=$(grep -c "no space left in $TMP/$name-disk; removed its oldest complete checkpoint(s) now rather than once this one is complete (checkpoint.keep_last 2), and writing step [0-9]* again" "$TMP/$name.out")
    if [ $rc -eq 0 ] && [ "$n" = 3 ] && [ "$(events "$name")" = "2 4 6 8 10 | " ] &&
       [ "$(ls "$TMP/$name-disk" | tr '\n' ' ')" = "step_00000008 step_00000010 " ] &&
       $PY tests/compare_runs.py "$TMP/$ref" "$TMP/$name" --steps 10 --exact >/dev/null; then
        ok "$np rank(s) ${rest:+($rest) }on a disk holding 2 checkpoints, keep_last 2: steps 6, 8 and 10 made room and were written again, every checkpoint complete, the run bit-identical to the reference"
    else bad "$name: rc $rc, $n make-room lines, events '$(events "$name")', $(ls "$TMP/$name-disk" | tr '\n' ' '); $(grep -E 'llmtrain' "$TMP/$name.out" | head -3)"; fi
done
# out of inodes instead (10: the root, the job's lock file, 2 checkpoints
# of a folder, its file and manifest, and a third's folder and file): the
# manifest cannot be created, and the commit's ENOSPC makes room as the
# writer's does
if full_disk fullino-disk size=8m,nr_inodes=10; then
    run fullino 1 --set checkpoint.dir="$TMP/fullino-disk" --set checkpoint.every_steps=2 --set checkpoint.keep_last=2; rc=$?
    n=$(grep -c "^llmtrain: checkpoint step [0-9]*: no space left in $TMP/fullino-disk; removed its oldest" "$TMP/fullino.out")
    m=$(grep -c "^llmtrain: rank 0: checkpoint step [0-9]*: $TMP/fullino-disk/step_000000[0-9]*.tmp/manifest.json.[0-9]*.tmp: cannot create (No space left on device)" "$TMP/fullino.out")
    if [ $rc -eq 0 ] && [ "$n" = 3 ] && [ "$m" = 3 ] && [ "$(events fullino)" = "2 4 6 8 10 | " ] &&
       [ "$(ls "$TMP/fullino-disk" | tr '\n' ' ')" = "step_00000008 step_00000010 " ]; then
        ok "a disk out of inodes, keep_last 2: the manifests of steps 6, 8 and 10 could not be created, each made room and was written again"
    else bad "fullino: rc $rc, $n make-room and $m manifest lines, events '$(events fullino)', $(ls "$TMP/fullino-disk" | tr '\n' ' '); $(grep -E 'llmtrain' "$TMP/fullino.out" | head -3)"; fi
else bad "fullino: cannot mount a tmpfs"; fi
# a damaged step 4 on the full disk (its manifest cut short): the restart
# resumes from step 2 and its step 4 makes room by removing the damaged
# folder it replaces, never step 2 (this run's newest good checkpoint until
# the new step 4 is complete), which keep_last 2 then keeps beside it
if full_disk fulldmg-disk; then
    dargs=(--set checkpoint.dir="$TMP/fulldmg-disk" --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 --set train.steps=4)
    run fulldmg 1 "${dargs[@]}"
    head -c 20 "$TMP/fulldmg-disk/step_00000004/manifest.json" >"$TMP/m" && cp "$TMP/m" "$TMP/fulldmg-disk/step_00000004/manifest.json"
    run fulldmg 1 "${dargs[@]}"; rc=$?
    if [ $rc -eq 0 ] && grep -q "resume: $TMP/fulldmg-disk/step_00000002 at step 2" "$TMP/fulldmg.out" &&
       grep -q "checkpoint step 4: no space left in $TMP/fulldmg-disk; removed its oldest complete checkpoint(s) now" "$TMP/fulldmg.out" &&
       [ "$(ls "$TMP/fulldmg-disk" | tr '\n' ' ')" = "step_00000002 step_00000004 " ] &&
       $PY -c 'import json, sys; json.load(open(sys.argv[1]))' "$TMP/fulldmg-disk/step_00000004/manifest.json" 2>/dev/null; then
        ok "a damaged step 4 filling the disk: resumed from step 2, step 4 written again in the damaged one's room, step 2 kept"
    else bad "fulldmg: rc $rc, $(ls "$TMP/fulldmg-disk" | tr '\n' ' '); $(grep -E 'resume|llmtrain' "$TMP/fulldmg.out" | tail -4)"; fi
else bad "fulldmg: cannot mount a tmpfs"; fi
if full_disk fulldur-disk; then
    run fulldur 1 --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 --set checkpoint.durable_dir="$TMP/fulldur-disk"; rc=$?
    n=$(grep -c "no space left in $TMP/fulldur-disk; removed its oldest complete checkpoint(s) now .*, and copying step [0-9]* again" "$TMP/fulldur.out")
    if [ $rc -eq 0 ] && [ "$n" = 3 ] && [ "$(events fulldur)" = "2 2d 4 4d 6 6d 8 8d 10 10d | " ] &&
       [ "$(ls "$TMP/fulldur-disk" | tr '\n' ' ')" = "step_00000008 step_00000010 " ] &&
       cmp -s "$TMP/fulldur-disk/step_00000010/rank_00000.bin" "$TMP/fulldur/checkpoints/step_00000010/rank_00000.bin"; then
        ok "a durable_dir holding 2 checkpoints, keep_last 2: the copies of steps 6, 8 and 10 made room and were made again"
    else bad "fulldur: rc $rc, $n make-room lines, events '$(events fulldur)', $(ls "$TMP/fulldur-disk" | tr '\n' ' '); $(grep -E 'llmtrain' "$TMP/fulldur.out" | head -3)"; fi
else bad "fulldur: cannot mount a tmpfs"; fi
if full_disk full0-disk; then
    run full0 1 --set checkpoint.dir="$TMP/full0-disk" --set checkpoint.every_steps=2; rc=$?
    n=$(grep -c "^llmtrain: warning: checkpoint step [0-9]* dropped; the newest complete checkpoint is still the previous one; the disk of $TMP/full0-disk is full: free space there, or set checkpoint.keep_last to 2 or more (at most the checkpoints it holds) so that the oldest makes room$" "$TMP/full0.out")
    if [ $rc -eq 3 ] && [ "$n" = 3 ] && [ "$(events full0)" = "2 4 | 6:True:True 8:True:True 10:True:True" ] &&
       grep -q "the final checkpoint (step 10) could not be written to $TMP/full0-disk" "$TMP/full0.out" &&
       [ "$(ls "$TMP/full0-disk" | tr '\n' ' ')" = "step_00000002 step_00000004 " ]; then
        ok "keep_last 0 (keep all) on a disk holding 2 checkpoints: steps 6, 8 and 10 dropped, each one line and a checkpoint_failed event, the final one exit 3"
    else bad "full0: rc $rc, $n drop lines, events '$(events full0)', $(ls "$TMP/full0-disk" | tr '\n' ' '); $(grep -E 'llmtrain' "$TMP/full0.out" | head -3)"; fi
else bad "full0: cannot mount a tmpfs"; fi

# ---- keep_last after resuming below a damaged newer checkpoint: the one just
# completed is never the one pruned ----
run lin 1 --set train.steps=6 --set checkpoint.keep_last=2
head -c 20 "$TMP/lin/checkpoints/step_00000006/manifest.json" >"$TMP/m" && mv "$TMP/m" "$TMP/lin/checkpoints/step_00000006/manifest.json"
LLMTRAIN_FAULT="rank=0,step=6,kind=die" run lin 1 --set train.steps=8 --set checkpoint.every_steps=4 --set checkpoint.keep_last=1 \
    --set checkpoint.async=false --set optim.override_schedule=true
run lin 1 --set train.steps=8 --set checkpoint.every_steps=4 --set checkpoint.keep_last=1 --set optim.override_schedule=true; rc=$?
if [ $rc -eq 0 ] && grep -q "resume: $TMP/lin/checkpoints/step_00000003 at step 3" "$TMP/lin.out" &&
   grep -q "resume: $TMP/lin/checkpoints/step_00000004 at step 4" "$TMP/lin.out"; then
    ok "resumed from step 3 below a damaged step 6: step 4 kept by keep_last=1, the next resume takes it"
else bad "keep_last below a damaged checkpoint: rc $rc; $(grep -E 'resume' "$TMP/lin.out" | tail -2)"; fi

# ---- a long run stays flat: from step 100 to step 400, 150 more asynchronous
# checkpoints with durable copies (every 2 steps, keep_last 2) and 30 more
# evaluations with samples add no file descriptor, thread or memory map, and
# no folder beyond keep_last in either root. Looked at while the run is held
# at the start of the next step (kind=hang; then SIGKILLed): the step's local
# write is done, its commit and durable copy wait for the main thread, so
# both points show the same state. ----
# held NAME STEP: "fds threads maps local-folders durable-folders" of a run held at STEP
held() {
    local name=$1 s=$2 pid n state
    LLMTRAIN_FAULT="step=$s,kind=hang" $BIN "$TMP/job.json" --set log.dir="$TMP/$name" --set train.steps=1000 \
        --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 --set checkpoint.durable_dir="$TMP/$name-dur" \
        --set data.val="$TMP/train.bin" --set eval.every_steps=10 --set eval.batches=1 --set eval.sample_tokens=4 \
        >"$TMP/$name.out" 2>&1 &
    pid=$!
    for _ in $(seq 1500); do n=$(grep -c '"loss"' "$TMP/$name/metrics.jsonl" 2>/dev/null); [ "${n:-0}" -ge $((s - 1)) ] && break; sleep 0.02; done
    sleep 0.5
    state="$(ls /proc/$pid/fd | wc -l) $(awk '/^Threads:/ {print $2}' /proc/$pid/status) $(wc -l <"/proc/$pid/maps")"
    echo "$state $(ls "$TMP/$name/checkpoints" | tr '\n' ,) $(ls "$TMP/$name-dur" | tr '\n' ,)"
    kill -KILL $pid
    wait $pid 2>/dev/null
}
read -r fd1 th1 mp1 loc1 dur1 <<<"$(held flat100 101)"
read -r fd4 th4 mp4 loc4 dur4 <<<"$(held flat400 401)"
if [ "$fd4" -le $((fd1 + 1)) ] && [ "$th4" -eq "$th1" ] && [ "$mp4" -le $((mp1 + 4)) ] &&
   [ "$loc1" = "step_00000096,step_00000098,step_00000100.tmp," ] && [ "$dur1" = "step_00000096,step_00000098," ] &&
   [ "$loc4" = "step_00000396,step_00000398,step_00000400.tmp," ] && [ "$dur4" = "step_00000396,step_00000398," ]; then
    ok "step 100 -> 400 (150 async checkpoints with durable copies, 30 samples): fds $fd1 -> $fd4, threads $th1 -> $th4, maps $mp1 -> $mp4; keep_last 2 in both roots"
else bad "flat long run: fds $fd1 -> $fd4, threads $th1 -> $th4, maps $mp1 -> $mp4, local $loc1 -> $loc4, durable $dur1 -> $dur4"; fi

# ---- samples: a resumed run prints the samples the uninterrupted one printed ----
smp="--set train.steps=8 --set checkpoint.every_steps=2 --set eval.every_steps=2 --set eval.sample_tokens=12"
run smp-ref 1 $smp
LLMTRAIN_FAULT="rank=0,step=5,kind=die" run smp-cut 1 $smp --set checkpoint.async=false
run smp-cut 1 $smp
samples() { grep -A1 -e '^--- sample ---' "$1" | grep -v -e '^--'; }
if [ "$(samples "$TMP/smp-ref.out" | wc -l)" -eq 4 ] && [ "$(samples "$TMP/smp-ref.out" | sort -u | wc -l)" -gt 1 ] &&
   [ "$(samples "$TMP/smp-ref.out")" = "$(samples "$TMP/smp-cut.out")" ] && grep -q "at step 4" "$TMP/smp-cut.out"; then
    ok "killed at step 5, resumed from step 4: the samples after steps 6 and 8 are the uninterrupted run's"
else bad "samples after a resume differ: $(samples "$TMP/smp-ref.out" | tr '\n' '/') vs $(samples "$TMP/smp-cut.out" | tr '\n' '/')"; fi

# ---- SIGTERM / SIGUSR1 / SIGINT / SIGHUP: checkpoint at the end of the step, exit 143 ----
# (started with SIGINT at its default action: a script's background job
# would inherit it ignored, as the trainer then leaves it)
for sig in TERM USR1 INT HUP; do
    $PY -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
        $BIN "$TMP/job.json" --set log.dir="$TMP/sig$sig" --set train.steps=3000 --set checkpoint.every_steps=0 >"$TMP/sig$sig.out" 2>&1 &
    pid=$!
    wait_steps "$TMP/sig$sig/metrics.jsonl" 20 10
    kill -$sig $pid; wait $pid; rc=$?
    k=$(ls "$TMP/sig$sig/checkpoints" 2>/dev/null | head -1)
    if [ $rc -eq 143 ] && [ -n "$k" ] && grep -q "stopped by signal after step" "$TMP/sig$sig.out"; then ok "SIG$sig: exit 143 after writing $k"
    else bad "SIG$sig: rc $rc, checkpoints '$k': $(tail -2 "$TMP/sig$sig.out")"; fi
done
# a hangup the job was started to ignore (nohup) stays ignored
nohup $BIN "$TMP/job.json" --set log.dir="$TMP/nohup" --set train.steps=3000 --set checkpoint.every_steps=0 >"$TMP/nohup.out" 2>&1 &
pid=$!
wait_steps "$TMP/nohup/metrics.jsonl" 20 10
kill -HUP $pid
n=$(grep -c '"loss"' "$TMP/nohup/metrics.jsonl")
wait_steps "$TMP/nohup/metrics.jsonl" $((n + 20)) 10; alive=$?
kill -TERM $pid; wait $pid; rc=$?
if [ $alive -eq 0 ] && [ $rc -eq 143 ]; then ok "under nohup SIGHUP stays ignored: 20 more steps trained, then SIGTERM stops it (143)"
else bad "nohup: trained on after SIGHUP: $([ $alive -eq 0 ] && echo yes || echo no), rc $rc"; fi

# ---- a stop during an evaluation or a sample: checkpoint of that step, exit 143 ----
# stop_during NAME ARGS...: 2 ranks train into $TMP/NAME (3000 steps, no
# periodic checkpoints) and get SIGUSR1 through mpirun (which passes it on)
# 2 s after the first step's line; sets rc (137: still running 30 s later)
stop_during() {
    local name=$1 pid; shift
    $MPIRUN 2 $BIN "$TMP/job.json" --set log.dir="$TMP/$name" --set train.steps=3000 --set checkpoint.every_steps=0 "$@" \
        >"$TMP/$name.out" 2>&1 &
    pid=$!
    wait_steps "$TMP/$name/metrics.jsonl" 1 20
    sleep 2
    kill -USR1 $pid
    for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -0 $pid 2>/dev/null && { kill -KILL $pid; echo "(still running 30 s after SIGUSR1: killed)" >>"$TMP/$name.out"; }
    wait $pid; rc=$?
}
stopped_at() { echo "rc $rc, checkpoints '$(ls "$TMP/$1/checkpoints" 2>/dev/null | tr '\n' ' ')', $(grep -c '"loss"' "$TMP/$1/metrics.jsonl") steps: $(tail -2 "$TMP/$1.out")"; }
# FULL_SHARD; eval.batches 2^31 - 1 at step 2 keeps the evaluation running
# until the signal (its per-rank count once wrapped to nothing: no evaluation)
stop_during sigeval --set data.val="$TMP/train.bin" --set parallel.strategy=FULL_SHARD --set eval.every_steps=2 --set eval.batches=2147483647
if [ $rc -eq 143 ] && [ "$(ls "$TMP/sigeval/checkpoints")" = step_00000002 ] &&
   grep -q "stop requested during the evaluation after step 2; evaluation abandoned" "$TMP/sigeval.out" &&
   [ "$(grep -c '"loss"' "$TMP/sigeval/metrics.jsonl")" -eq 2 ] && ! grep -q '"val_loss"' "$TMP/sigeval/metrics.jsonl"; then
    ok "SIGUSR1 to mpirun during step 2's evaluation (2 ranks, FULL_SHARD): evaluation abandoned, no val_loss logged, step_00000002 written, exit 143"
else bad "SIGUSR1 during an evaluation: $(stopped_at sigeval)"; fi
# NO_SHARD: rank 0 samples alone; 2^20 tokens take a minute and more
stop_during sigsmp --set parallel.strategy=NO_SHARD --set eval.every_steps=2 --set eval.sample_tokens=1048576
if [ $rc -eq 143 ] && [ "$(ls "$TMP/sigsmp/checkpoints")" = step_00000002 ] && grep -q -- "--- sample (cut short: stop requested) ---" "$TMP/sigsmp.out" &&
   [ "$(grep -c '"loss"' "$TMP/sigsmp/metrics.jsonl")" -eq 2 ]; then
    ok "SIGUSR1 to mpirun during step 2's sample (2 ranks, NO_SHARD): sample cut short, step_00000002 written, exit 143"
else bad "SIGUSR1 during a sample: $(stopped_at sigsmp)"; fi

# ---- every_minutes: checkpoints by the clock ----
run clock 1 --set checkpoint.every_steps=0 --set checkpoint.every_minutes=0.00001 --set train.steps=6
n=$(grep -c '"event":"checkpoint"' "$TMP/clock/metrics.jsonl")
if [ "$n" -ge 3 ]; then ok "every_minutes: $n checkpoints by the clock in 6 steps"; else bad "every_minutes: $n checkpoints"; fi

# ---- a finished run started again resumes at its end and trains nothing ----
run ref-np1 1; rc=$?
if [ $rc -eq 0 ] && grep -q "nothing to train" "$TMP/ref-np1.out" && [ "$(grep -c '"loss"' "$TMP/ref-np1/metrics.jsonl")" -eq 10 ]; then
    ok "a finished run started again: exit 0, nothing trained"
else bad "rerun of a finished job: rc $rc"; fi

# ---- a checkpoint folder with a quote, a backslash and a tab: metrics.jsonl stays JSON ----
odd="$TMP/odd \"ck\\x	y"
run odd 1 --set train.steps=4 --set "checkpoint.dir=$odd"; rc1=$?
run odd 1 --set train.steps=6 --set "checkpoint.dir=$odd" --set optim.override_schedule=true; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && $PY - "$TMP/odd/metrics.jsonl" "$odd" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ck = [l["path"] for l in lines if l.get("event") == "checkpoint"]
assert ck == [sys.argv[2] + "/step_%08d" % s for s in (3, 4, 6)], ck
assert [l["step"] for l in lines if l.get("event") == "resume"] == [4], lines
PYEOF
then ok "a checkpoint.dir with '\"', '\\' and a tab: every metrics.jsonl line parses, the paths as written, resumed"
else bad "odd checkpoint.dir: rc $rc1/$rc2; $(grep -E 'error' "$TMP/odd.out" | head -2)"; fi

# ---- resume with another LR / batch schedule: exit 2 naming the key,
# unless optim.override_schedule takes the job's ----
run sch 1 --set train.steps=6
run sch8 1 --set train.steps=8
if $PY - "$TMP/sch/checkpoints/step_00000006/manifest.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))["schedule"]
want = {"optim": {"lr_decay_style": "cosine", "lr": 0.01, "min_lr": 0, "warmup_steps": 2, "decay_steps": 6,
                  "wsd_decay_steps": 0, "wsd_decay_style": "linear"},
        "train": {"rampup_start_batch": 0, "rampup_batch_increment": 0, "rampup_samples": 0, "global_batch": 8, "steps": 6}}
assert s == want, s
PYEOF
then ok "the manifest records the schedule resolved (decay_steps 0 as train.steps 6, global_batch 8)"
else bad "manifest schedule: $(grep '"schedule"' "$TMP/sch/checkpoints/step_00000006/manifest.json")"; fi
S6="checkpoint.resume: $TMP/sch/checkpoints/step_00000006 was trained with another schedule"
tail6="; set optim.override_schedule=true to take this job's from step 6 on, or give the key the checkpoint's value"
# sched_refused WHAT NP ARGS...: exit 2, the line once, nothing trained
sched_refused() {
    local what=$1 np=$2; shift 2
    local cmd="$BIN"; [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set log.dir="$TMP/sch" "$@" >"$TMP/schr.out" 2>&1; local rc=$?
    if [ $rc -eq 2 ] && [ "$(grep -cxF "llmtrain: $S6, $what$tail6" "$TMP/schr.out")" -eq 1 ] &&
       [ "$(grep -c '"loss"' "$TMP/sch/metrics.jsonl")" -eq 6 ]; then ok "resume with $what on $np rank(s): exit 2, the line once"
    else bad "resume with $what: rc $rc: $(grep llmtrain: "$TMP/schr.out" | head -2)"; fi
}
sched_refused "train.steps: 6 -> 8 (where the cosine decay ends, optim.decay_steps being 0; optim.decay_steps=6 keeps the checkpoint's end)" 1 --set train.steps=8
sched_refused "train.steps: 6 -> 8 (where the cosine decay ends, optim.decay_steps being 0; optim.decay_steps=6 keeps the checkpoint's end)" 2 --set train.steps=8 --set parallel.strategy=FULL_SHARD
sched_refused "optim.lr: 0.01 -> 0.02" 1 --set train.steps=6 --set optim.lr=2e-2
sched_refused "optim.min_lr: 0 -> 0.001" 1 --set train.steps=6 --set optim.min_lr=1e-3
sched_refused "optim.warmup_steps: 2 -> 3" 1 --set train.steps=6 --set optim.warmup_steps=3
sched_refused "optim.lr_decay_style: cosine -> linear" 1 --set train.steps=6 --set optim.lr_decay_style=linear
sched_refused "optim.decay_steps: 6 -> 12 (where the cosine decay ends)" 1 --set train.steps=6 --set optim.decay_steps=12
sched_refused "train.rampup_start_batch: 0 -> 4" 1 --set train.steps=6 --set train.rampup_start_batch=4 \
    --set train.rampup_batch_increment=4 --set train.rampup_samples=16
# lr_at LOG STEP: the lr metrics.jsonl logged for STEP (its last line)
lr_at() { grep '"loss"' "$1/metrics.jsonl" | grep "\"step\":$2," | tail -1 | grep -o '"lr":[^,]*' | cut -d: -f2; }
from6=(--set checkpoint.resume="$TMP/sch/checkpoints/step_00000006" --set train.steps=8)
# the old decay's end kept: train.steps is then no part of the schedule, steps 7-8 at min_lr
run schk 1 "${from6[@]}" --set optim.decay_steps=6; rc=$?
if [ $rc -eq 0 ] && ! grep -q "^schedule:" "$TMP/schk.out" && [ "$(lr_at "$TMP/schk" 7)" = "0" ] && [ "$(lr_at "$TMP/schk" 8)" = "0" ]; then
    ok "train.steps 6 -> 8 with optim.decay_steps=6 (the checkpoint's end): resumed, steps 7-8 at min_lr 0"
else bad "extension keeping the decay's end: rc $rc, lr $(lr_at "$TMP/schk" 7) $(lr_at "$TMP/schk" 8); $(grep llmtrain: "$TMP/schk.out" | head -2)"; fi
# the override: the header says what changed; steps 7-8 take the 8-step run's LR
run scho 1 "${from6[@]}" --set optim.override_schedule=true; rc=$?
a7=$(lr_at "$TMP/scho" 7); a8=$(lr_at "$TMP/scho" 8)
if [ $rc -eq 0 ] && grep -qx "schedule: this job's, not the checkpoint's (optim.override_schedule): train.steps: 6 -> 8" "$TMP/scho.out" &&
   [ -n "$a7" ] && [ "$a7" = "$(lr_at "$TMP/sch8" 7)" ] && [ "$a8" = "$(lr_at "$TMP/sch8" 8)" ] && [ "$a7" != "0" ] &&
   grep -q '"decay_steps":8,' "$TMP/scho/checkpoints/step_00000008/manifest.json" &&
   run scho 1 --set train.steps=8 && grep -q "nothing to train" "$TMP/scho.out"; then
    ok "optim.override_schedule: header 'train.steps: 6 -> 8', steps 7-8 at the 8-step run's lr ($a7, $a8); its checkpoint records the new schedule"
else bad "override: rc $rc, lr $a7 $a8 vs $(lr_at "$TMP/sch8" 7) $(lr_at "$TMP/sch8" 8); $(grep -E '^schedule|llmtrain:' "$TMP/scho.out" | head -2)"; fi
# a checkpoint from before manifests recorded the schedule: compared through
# the job config it stored; it still loads and continues bit-identically
mkdir -p "$TMP/old" && cp -r "$TMP/sch/checkpoints/step_00000003" "$TMP/old/"
$PY - "$TMP/old/step_00000003/manifest.json" <<'PYEOF'
import sys
sys.path.insert(0, "tests")
import manifest_seal
p = sys.argv[1]
lines = open(p).read().split("\n")
kept = [l for l in lines if not l.startswith('"schedule": ')]
assert len(kept) == len(lines) - 1
open(p, "w").write("\n".join(kept))
manifest_seal.reseal(p)
PYEOF
$BIN "$TMP/job.json" --set log.dir="$TMP/oldr" --set checkpoint.resume="$TMP/old/step_00000003" --set train.steps=8 >"$TMP/oldr.out" 2>&1; rc1=$?
run oldok 1 --set checkpoint.resume="$TMP/old/step_00000003" --set train.steps=6; rc2=$?
if [ $rc1 -eq 2 ] && grep -qxF "llmtrain: checkpoint.resume: $TMP/old/step_00000003 was trained with another schedule, train.steps: 6 -> 8 (where the cosine decay ends, optim.decay_steps being 0; optim.decay_steps=6 keeps the checkpoint's end); set optim.override_schedule=true to take this job's from step 3 on, or give the key the checkpoint's value" "$TMP/oldr.out" &&
   [ $rc2 -eq 0 ] && $PY - "$TMP/sch/metrics.jsonl" "$TMP/oldok/metrics.jsonl" <<'PYEOF'; then
import json, sys
a, b = ({l["step"]: l["loss"] for l in map(json.loads, open(p)) if "loss" in l} for p in sys.argv[1:])
assert sorted(b) == [4, 5, 6] and all(a[k] == b[k] for k in b), (a, b)
PYEOF
    ok "a manifest without a schedule: train.steps 6 -> 8 refused from its stored config; the same schedule resumes at step 3, steps 4-6 bit-identical"
else bad "manifest without a schedule: rc $rc1/$rc2: $(grep llmtrain: "$TMP/oldr.out" "$TMP/oldok.out" | head -2)"; fi

# ---- errors: one line, exit 2 ----
run other 1 --set train.steps=2
$BIN "$TMP/job.json" --set log.dir="$TMP/other" --set model.n_layer=3 >"$TMP/other3.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "was written for another model (checkpoint vs job: model.n_layer 2 vs 3)" "$TMP/other3.out"; then
    ok "resume into a different model: exit 2, one line"
else bad "different model: rc $rc $(tail -1 "$TMP/other3.out")"; fi
$BIN "$TMP/job.json" --set log.dir="$TMP/x" --set checkpoint.resume="$TMP/nowhere" >"$TMP/x.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/x.out")" -eq 1 ] && grep -q "checkpoint.resume: $TMP/nowhere/manifest.json: cannot read" "$TMP/x.out"; then
    ok "checkpoint.resume=<missing path>: exit 2, one line"
else bad "resume missing path: rc $rc $(cat "$TMP/x.out")"; fi
run other 1 --set train.steps=2 --set checkpoint.resume=none
if ! grep -q '"event":"resume"' "$TMP/other/metrics.jsonl" && [ "$(grep -c '"loss"' "$TMP/other/metrics.jsonl")" -eq 2 ]; then
    ok "checkpoint.resume=none starts over"
else bad "resume=none"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
