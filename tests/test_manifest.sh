#!/bin/bash
# A damaged checkpoint manifest at resume: one-character and one-bit edits
# of every kind of field (slice offsets and lengths, step, data cursor,
# tensor names, kind, format, a file's checksum) are caught by the
# manifest's own checksum, and a manifest sealed over a tensor missing or a
# slice past its tensor by the structural check, all before loading: resume
# falls back to the previous checkpoint, on 1 rank and on 2 ranks
# FULL_SHARD. A folder whose every checkpoint is damaged is exit 2 and one
# line unless checkpoint.resume=none says to start over; a format /2
# manifest (written before the seal) still resumes, with a warning, to the
# same weights as its sealed twin.
. "$(dirname "$0")/lib.sh"

write_shard "$TMP/train.bin" 96 20000 1
ckpt_job "$TMP/job.json" "$TMP/train.bin" 6 3
# the reference checkpoints (steps 3 and 6) of 1 rank and of 2 ranks FULL_SHARD
$BIN "$TMP/job.json" --set log.dir="$TMP/ref1" >"$TMP/ref1.out" 2>&1 || bad "1-rank reference run failed: $(tail -2 "$TMP/ref1.out")"
$MPIRUN 2 $BIN "$TMP/job.json" --set log.dir="$TMP/ref2" --set parallel.strategy=FULL_SHARD >"$TMP/ref2.out" 2>&1 ||
    bad "2-rank reference run failed: $(tail -2 "$TMP/ref2.out")"

# edit FILE ANCHOR FROM TO [seal]: FROM -> TO at its first occurrence after
# ANCHOR (sealed again when the fifth argument is "seal")
edit() {
    $PY - "$@" <<'PYEOF' || return 1
import sys
p, anchor, frm, to = sys.argv[1:5]
t = open(p).read()
a = t.index(anchor)
f = t.index(frm, a)
open(p, "w").write(t[:f] + to + t[f + len(frm):])
if len(sys.argv) > 5:
    sys.path.insert(0, "tests")
    import manifest_seal
    manifest_seal.reseal(p)
PYEOF
}
flip_bit() { # flip_bit FILE: bit 3 of the byte in the middle of the file
    $PY - "$1" <<'PYEOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); i = len(b) // 2; b[i] ^= 8; open(sys.argv[1], "wb").write(b)
PYEOF
}
# resume_from NAME NP REF: a copy of REF's checkpoints with NAME's damage
# applied by the caller, then a run of 3 steps of the same schedule over it (nothing to train
# when it resumes from step 3; it would say step 6 if it took the damaged one)
fresh() { rm -rf "$TMP/$1" && mkdir -p "$TMP/$1" && cp -r "$TMP/$2/checkpoints" "$TMP/$1/checkpoints"; }
resume3() {
    local name=$1 np=$2 cmd="$BIN"; shift 2
    [ "$np" -gt 1 ] && cmd="$MPIRUN $np $BIN"
    $cmd "$TMP/job.json" --set log.dir="$TMP/$name" --set train.steps=3 --set optim.decay_steps=6 "$@" >"$TMP/$name.out" 2>&1
}
falls_back() { # falls_back NAME NP RC WHAT REASON: skipped step 6 (REASON), resumed from step 3
    if [ "$3" -eq 0 ] && grep -q "warning: skipping checkpoint $TMP/$1/checkpoints/step_00000006: .*$5" "$TMP/$1.out" &&
       grep -q "^resume: $TMP/$1/checkpoints/step_00000003 at step 3" "$TMP/$1.out"; then
        ok "$2 rank(s): $4: step 6 skipped ($5), resumed from step 3"
    else bad "$2 rank(s): $4: rc $3: $(grep -E 'resume|llmtrain' "$TMP/$1.out" | head -3)"; fi
}
M=checkpoints/step_00000006/manifest.json
SEAL="its manifest_checksum says"
i=0
while IFS='|' read -r what anchor from to; do
    i=$((i + 1))
    fresh e$i ref1 && edit "$TMP/e$i/$M" "$anchor" "$from" "$to" || bad "edit '$what' not applied"
    resume3 e$i 1; falls_back e$i 1 $? "$what" "$SEAL"
done <<'EOF3'
a slice offset (byte 0 -> 4)|"slices": [[|0, 0, 0, |0, 0, 4, 
a slice length|"slices": [[|]|1]
the step|"step": |6|7
the data cursor|"seq_cursor": "|"|"1
a tensor name|"tensors": [|"name": "|"name": "x
a kind|"kind": "exp_avg_sq"|exp_avg_sq|exp_avg_sp
a file's checksum|"files": [|"checksum": "|"checksum": "1
EOF3
fresh bit ref1 && flip_bit "$TMP/bit/$M"
resume3 bit 1; falls_back bit 1 $? "one bit flipped in the middle of the manifest" "manifest"
fresh fmt ref1 && edit "$TMP/fmt/$M" '"format"' "/3" "/4"
resume3 fmt 1; falls_back fmt 1 $? "the format /3 -> /4" 'key format: "llmtrain-checkpoint/4" is not a format this build reads'
# sealed again over damage a writer could make: only the structural check sees it
fresh past ref1 && edit "$TMP/past/$M" '"slices": [[' "]" "1]" seal
resume3 past 1; falls_back past 1 $? "a sealed manifest whose slice runs past its tensor" "gap, overlap or run past"
fresh lack ref1 && edit "$TMP/lack/$M" '"kind": "exp_avg"' '"name": "' '"name": "zz' seal
resume3 lack 1; falls_back lack 1 $? "a sealed manifest lacking a tensor" "no tensor"
# 2 ranks FULL_SHARD: every rank falls back together
fresh s2 ref2 && edit "$TMP/s2/$M" '"slices": [[' "0, 0, 0, " "0, 0, 4, "
resume3 s2 2 --set parallel.strategy=FULL_SHARD; falls_back s2 2 $? "FULL_SHARD, a slice offset" "$SEAL"
fresh p2 ref2 && edit "$TMP/p2/$M" '"slices": [[' "]" "1]" seal
resume3 p2 2 --set parallel.strategy=FULL_SHARD; falls_back p2 2 $? "FULL_SHARD, a sealed slice past its tensor" "gap, overlap or run past"
# an explicit checkpoint.resume of a damaged one: exit 2, one line
fresh ex ref1 && edit "$TMP/ex/$M" '"step": ' "6" "7"
resume3 ex 1 --set checkpoint.resume="$TMP/ex/checkpoints/step_00000006"; rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c . "$TMP/ex.out")" -eq 1 ] && grep -q "^llmtrain: checkpoint.resume: .*step_00000006/manifest.json: .*$SEAL" "$TMP/ex.out"; then
    ok "an explicit checkpoint.resume of an edited manifest: exit 2, one line naming it"
else bad "explicit resume of a damaged manifest: rc $rc: $(head -3 "$TMP/ex.out")"; fi

# ---- every checkpoint damaged: exit 2 and one line; checkpoint.resume=none starts over ----
for np in 1 2; do
    fresh all$np ref$np
    edit "$TMP/all$np/$M" '"step": ' "6" "7"
    flip_bit "$TMP/all$np/checkpoints/step_00000003/manifest.json"
    set -- ; [ $np -eq 2 ] && set -- --set parallel.strategy=FULL_SHARD
    resume3 all$np $np "$@"; rc=$?
    errs=$(grep -c "^llmtrain: checkpoint.resume: every checkpoint" "$TMP/all$np.out")
    if [ $rc -eq 2 ] && [ "$errs" -eq 1 ] && ! grep -q '"loss"' "$TMP/all$np/metrics.jsonl" 2>/dev/null &&
       grep -q "every checkpoint in $TMP/all$np/checkpoints failed verification (2; newest $TMP/all$np/checkpoints/step_00000006: .*); to train from step 0 anyway set checkpoint.resume=none" "$TMP/all$np.out"; then
        ok "$np rank(s): every checkpoint damaged: exit 2, one line, no step trained"
    else bad "$np rank(s): all damaged: rc $rc, $errs lines: $(grep llmtrain "$TMP/all$np.out" | head -3)"; fi
    resume3 all$np $np "$@" --set checkpoint.resume=none; rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$TMP/all$np/metrics.jsonl")" -eq 3 ]; then
        ok "$np rank(s): the same folder with checkpoint.resume=none trains from step 0"
    else bad "$np rank(s): resume=none over damaged checkpoints: rc $rc: $(grep llmtrain "$TMP/all$np.out" | head -3)"; fi
done

# ---- a format /2 manifest (no seal) resumes, with a warning, to the same weights ----
fresh v2 ref1
$PY - "$TMP/v2/$M" <<'PYEOF'
import sys
p = sys.argv[1]; t = open(p).read()
t = t.replace('"llmtrain-checkpoint/3"', '"llmtrain-checkpoint/2"', 1)
open(p, "w").write(t[:t.rindex(',\n"manifest_checksum"')] + "\n}\n")
PYEOF
fresh v3 ref1
run7() { $BIN "$TMP/job.json" --set log.dir="$TMP/$1" --set train.steps=7 --set optim.decay_steps=6 >"$TMP/$1.out" 2>&1; }
run7 v2; rc2=$?; run7 v3; rc3=$?
l2=$(grep '"step":7,' "$TMP/v2/metrics.jsonl" | grep -o '"loss":[^,]*'); l3=$(grep '"step":7,' "$TMP/v3/metrics.jsonl" | grep -o '"loss":[^,]*')
if [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && grep -q "^resume: $TMP/v2/checkpoints/step_00000006 at step 6" "$TMP/v2.out" &&
   grep -q "warning: .*step_00000006/manifest.json is format llmtrain-checkpoint/2, written before manifests carried their own checksum" "$TMP/v2.out" &&
   [ -n "$l2" ] && [ "$l2" = "$l3" ] && grep -q '"format": "llmtrain-checkpoint/3"' "$TMP/v2/checkpoints/step_00000007/manifest.json"; then
    ok "a format /2 manifest resumes with a warning; step 7's loss equals the sealed twin's ($l2); the next checkpoint is /3"
else bad "format /2: rc $rc2/$rc3, loss '$l2' vs '$l3': $(grep -E 'resume|llmtrain' "$TMP/v2.out" | head -3)"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
