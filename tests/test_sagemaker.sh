#!/bin/bash
# SageMaker entry point (scripts/sagemaker/train) against a fake $LLMTRAIN_SM_ROOT:
# a tiny job end to end (exported model, metrics, TensorBoard event file, checkpoints
# where SageMaker expects them), a restart that resumes from the durable copy, one-line
# failure files for a missing channel, a malformed and an unknown hyperparameter, the
# EFA environment only when the (fake) EFA probe finds a device, NCCL_DEBUG on request,
# launch.py --dry-run without the sagemaker package, and the Dockerfile's COPY sources.
. "$(dirname "$0")/lib.sh"
unset LLMTRAIN_FAULT FI_PROVIDER FI_EFA_USE_DEVICE_RDMA NCCL_PROTO NCCL_DEBUG LLMTRAIN_SM_EFA_PROBE
ENTRY=$PWD/scripts/sagemaker/train
export LLMTRAIN_SM_EFA_PROBE="$TMP/efa/*"   # no fake EFA device unless a case makes one

write_shard "$TMP/train.bin" 64 6000 1
write_shard "$TMP/val.bin" 64 2000 2
cat >"$TMP/tiny.json" <<EOF
{"description": "test: tiny Llama",
 "model": {"arch": "llama", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_kv_head": 1, "vocab_size": 64, "max_seq_len": 16},
 "data": {"train": "/opt/ml/input/data/train/*.bin", "val": "/opt/ml/input/data/val/*.bin"},
 "train": {"steps": 4, "seq_len": 16, "micro_batch": 2, "global_batch": 4},
 "eval": {"sample_tokens": 0}, "checkpoint": {"every_steps": 2}}
EOF

# make_root DIR HYPERPARAMETERS_JSON [channels...]: a SageMaker /opt/ml tree, one host
make_root() {
    local r=$1 hp=$2; shift 2
    mkdir -p "$r/input/config" "$r/code"
    cp "$TMP/tiny.json" "$r/code/tiny.json"
    echo '{"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}' >"$r/input/config/resourceconfig.json"
    echo "$hp" >"$r/input/config/hyperparameters.json"
    for ch in "$@"; do mkdir -p "$r/input/data/$ch"; cp "$TMP/$ch.bin" "$r/input/data/$ch/shard_000000.bin"; done
}
# entry ROOT [env...]: run the entry point; sets rc, output in ROOT.out
entry() {
    local r=$1; shift
    env LLMTRAIN_SM_ROOT="$r" LLMTRAIN_BIN="$BIN" "$@" timeout 120 "$ENTRY" >"$r.out" 2>&1
    rc=$?
}
# expect_failure NAME ROOT SUBSTRING: non-zero exit, output/failure is one line containing SUBSTRING
expect_failure() {
    local name=$1 r=$2 want=$3 f="$2/output/failure"
    if [ $rc -ne 0 ] && [ -f "$f" ] && [ "$(wc -l <"$f")" -eq 1 ] && grep -qF -- "$want" "$f"; then
        ok "$name: exit $rc, failure: $(cat "$f")"
    else
        bad "$name: rc=$rc failure='$(cat "$f" 2>/dev/null)' $(tail -3 "$r.out")"
    fi
}

# 1. end to end
R=$TMP/e2e/ml
make_root "$R" '{"job": "tiny.json", "optim.lr": "0.01", "data.shuffle": "true"}' train val
entry "$R"
if [ $rc -eq 0 ] && [ ! -e "$R/output/failure" ]; then ok "tiny job through the entry point exits 0"; else bad "tiny job: rc=$rc $(tail -5 "$R.out")"; fi
if [ -s "$R/model/config.json" ] && [ -s "$R/model/model.safetensors" ] &&
   $PY -c "import json,sys; c=json.load(open('$R/model/config.json')); sys.exit(c.get('num_hidden_layers') != 1)"; then
    ok "exported Hugging Face model in \$ROOT/model"
else
    bad "no exported model in $R/model: $(ls "$R/model" 2>&1)"
fi
if grep -q '^{"step":4,' "$R/output/data/metrics.jsonl" 2>/dev/null && grep -q '"val_loss"' "$R/output/data/metrics.jsonl"; then
    ok "metrics.jsonl (4 steps, val_loss) in \$ROOT/output/data"
else
    bad "metrics.jsonl missing or short in $R/output/data"
fi
# TensorBoardOutputConfig's folder: one event file whose records are steps 1..4
if $PY -c "import sys, glob; sys.path.insert(0, 'tests'); from test_tensorboard import read_events
f = glob.glob('$R/output/tensorboard/events.out.tfevents.*'); e = read_events(f[0]) if len(f) == 1 else []
sys.exit([x.step for x in e[1:]] != [1, 2, 3, 4] or e[0].file_version != 'brain.Event:2')" 2>"$TMP/tb.err"; then
    ok "TensorBoard event file (steps 1..4) in \$ROOT/output/tensorboard"
else
    bad "no TensorBoard event file of steps 1..4 in $R/output/tensorboard: $(ls "$R/output/tensorboard" 2>&1) $(tail -2 "$TMP/tb.err")"
fi
if $PY -c "import matplotlib" 2>/dev/null; then
    if [ -s "$R/output/data/metrics.png" ]; then ok "metrics.png plotted"; else bad "no metrics.png with matplotlib installed"; fi
fi
if [ -f "$R/checkpoints/step_00000002/manifest.json" ] && [ -f "$R/checkpoints/step_00000004/manifest.json" ] &&
   [ -f "$TMP/e2e/llmtrain-local/checkpoints/step_00000004/manifest.json" ]; then
    ok "checkpoints in \$ROOT/checkpoints (synced to checkpoint_s3_uri) and the local copy beside \$ROOT"
else
    bad "checkpoints missing in $R/checkpoints: $(ls "$R/checkpoints" 2>&1)"
fi
if grep -q -- "--set 'data.train=\"$R/input/data/train/\*.bin\"'" "$R.out" && grep -qE "optim.lr=0.01( |$)" "$R.out" &&
   grep -qE "data.shuffle=true( |$)" "$R.out"; then
    ok "channels map to data.train/data.val, hyperparameters typed (0.01, true)"
else
    bad "command line lacks channel or typed overrides: $(grep '^train: 1 host' "$R.out")"
fi

# 2. restart after a crash resumes from the durable copy (the crashed attempt
# checkpoints synchronously, so step 2 is complete before the kill at step 3)
R=$TMP/restart/ml
make_root "$R" '{"job": "tiny.json", "checkpoint.async": "false"}' train val
entry "$R" LLMTRAIN_FAULT="rank=0,step=3,kind=die"
expect_failure "rank killed at step 3" "$R" "killed by signal 9"
rm -rf "$TMP/restart/llmtrain-local"   # a fresh instance: only the durable copy survives
entry "$R" LLMTRAIN_SM_LOCAL_DIR="$TMP/nvme"
line=$(grep -m1 '^resume: ' "$R.out")
if [ $rc -eq 0 ] && echo "$line" | grep -q "checkpoints/step_00000002 at step 2" && [ ! -e "$R/output/failure" ] &&
   [ -f "$TMP/nvme/checkpoints/step_00000004/manifest.json" ] &&
   [ -s "$R/model/model.safetensors" ] && grep -q '^{"step":4,' "$R/output/data/metrics.jsonl"; then
    ok "restart resumes from the durable checkpoint, local copy in LLMTRAIN_SM_LOCAL_DIR: $line"
else
    bad "restart: rc=$rc resume line '$line' $(tail -3 "$R.out")"
fi

# 2a. max_restarts: a rank killed at step 3 of the first attempt; the entry
# point's run_resilient.sh restarts it from the step-2 checkpoint, one job
R=$TMP/restarts/ml
make_root "$R" '{"job": "tiny.json", "max_restarts": "1", "checkpoint.async": "false"}' train val
entry "$R" LLMTRAIN_FAULT="rank=0,step=3,kind=die,attempt=1"
if [ $rc -eq 0 ] && [ ! -e "$R/output/failure" ] && grep -q "run_resilient: attempt 1 exited with code 137" "$R.out" &&
   grep -q "^resume: .*step_00000002 at step 2" "$R.out" && grep -q "run_resilient: finished after 2 attempt(s), 1 restart(s) | goodput" "$R.out" &&
   [ -s "$R/model/model.safetensors" ]; then
    ok "max_restarts 1: killed at step 3, restarted inside the job from step 2, model exported"
else bad "max_restarts: rc=$rc $(grep -E 'run_resilient|FAILED' "$R.out" | head -3)"; fi
R=$TMP/badrestarts/ml
make_root "$R" '{"job": "tiny.json", "max_restarts": "-1"}' train val
entry "$R"
expect_failure "max_restarts=-1" "$R" "max_restarts: expected a whole number >= 0"

# 2b. ranks per host from the GPUs nvidia-smi lists (a fake one listing 2):
# one host runs mpirun over 2 local ranks
mkdir -p "$TMP/fakebin"
printf '#!/bin/sh\necho "GPU 0: Fake (UUID: GPU-0)"\necho "GPU 1: Fake (UUID: GPU-1)"\n' >"$TMP/fakebin/nvidia-smi"
chmod +x "$TMP/fakebin/nvidia-smi"
R=$TMP/gpus/ml
make_root "$R" '{"job": "tiny.json"}' train val
entry "$R" PATH="$TMP/fakebin:$PATH" LLMTRAIN_SM_MPIRUN_ARGS="--oversubscribe"
if [ $rc -eq 0 ] && grep -q "^train: 1 host(s) x 2 rank(s): mpirun .*-np 2 " "$R.out" && grep -q "| world 2$" "$R.out" &&
   [ -s "$R/model/model.safetensors" ]; then
    ok "2 GPUs listed by nvidia-smi: 2 ranks on the host through mpirun"
else bad "ranks from nvidia-smi: rc=$rc $(grep -E '^train: |world' "$R.out" | head -3)"; fi

# 2c. the export takes the newest complete checkpoint of local and durable
# (a full local disk leaves the last ones in durable only)
mkdir -p "$TMP/nc/local/step_00000004" "$TMP/nc/local/step_00000008.tmp" "$TMP/nc/durable/step_00000006" "$TMP/nc/durable/step_00000010"
touch "$TMP/nc/local/step_00000004/manifest.json" "$TMP/nc/local/step_00000008.tmp/manifest.json" "$TMP/nc/durable/step_00000006/manifest.json"
if $PY - "$ENTRY" "$TMP/nc" <<'PYEOF'
import importlib.machinery, sys
m = importlib.machinery.SourceFileLoader("sm_entry", sys.argv[1]).load_module()
t = sys.argv[2]
base = {"checkpoint.dir": f"{t}/local", "checkpoint.durable_dir": f"{t}/durable"}
assert m.newest_checkpoint_root(base) == f"{t}/durable", m.newest_checkpoint_root(base)  # 6 beats 4; 10 has no manifest, 8 is .tmp
import os
os.rename(f"{t}/local/step_00000004", f"{t}/local/step_00000007")
assert m.newest_checkpoint_root(base) == f"{t}/local"
PYEOF
then ok "export reads the newest complete checkpoint of the local and durable copies"
else bad "newest checkpoint root"; fi

# 3. failures: one line in output/failure, non-zero exit
R=$TMP/nochan/ml
make_root "$R" '{"job": "tiny.json"}' val
entry "$R"
expect_failure "missing train channel" "$R" "channel 'train' missing"
R=$TMP/noval/ml
make_root "$R" '{"job": "tiny.json"}' train
entry "$R"
expect_failure "missing val channel the job needs" "$R" "channel 'val' missing"
R=$TMP/badint/ml
make_root "$R" '{"job": "tiny.json", "train.steps": "abc"}' train val
entry "$R"
expect_failure "train.steps=abc" "$R" 'train.steps: expected an integer, got "abc"'
[ $rc -eq 2 ] && ok "train.steps=abc exits 2 (bad input)" || bad "train.steps=abc exit $rc, expected 2"
R=$TMP/unknown/ml
make_root "$R" '{"job": "tiny.json", "train.stepz": "5"}' train val
entry "$R"
expect_failure "unknown key" "$R" "unknown key 'train.stepz' (did you mean 'train.steps'?)"
R=$TMP/nojob/ml
make_root "$R" '{"job": "nope.json"}' train val
entry "$R"
expect_failure "missing job file" "$R" "job=nope.json: no such job file"
R=$TMP/badhp/ml
make_root "$R" '{"job": "tiny.json",' train val
entry "$R"
expect_failure "malformed hyperparameters.json" "$R" "hyperparameters.json: malformed JSON"

# 4. EFA environment only with a device; NCCL_DEBUG on request (recorded by a wrapper binary)
cat >"$TMP/wrap.sh" <<EOF
#!/bin/sh
env | grep -E '^(FI_|NCCL_)' | sort >"\$WRAP_ENV"
exec "$BIN" "\$@"
EOF
chmod +x "$TMP/wrap.sh"
# (this run also takes its training data from SM_CHANNEL_TRAIN and validates on a "validation" channel)
R=$TMP/noefa/ml
cp "$TMP/val.bin" "$TMP/validation.bin"
make_root "$R" '{"job": "tiny.json", "train.steps": "1"}' validation
mkdir -p "$TMP/elsewhere" && cp "$TMP/train.bin" "$TMP/elsewhere/part-0.bin"
env LLMTRAIN_SM_ROOT="$R" LLMTRAIN_BIN="$TMP/wrap.sh" WRAP_ENV="$TMP/noefa.env" SM_CHANNEL_TRAIN="$TMP/elsewhere" "$ENTRY" >"$R.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ -f "$TMP/noefa.env" ] && [ ! -s "$TMP/noefa.env" ]; then
    ok "no EFA device: no FI_/NCCL_ variables"
else
    bad "no EFA: rc=$rc env: $(cat "$TMP/noefa.env" 2>&1)"
fi
if grep -q "^data: $TMP/elsewhere/\*.bin (6000 tokens, [0-9.e+-]* epochs this run), val on" "$R.out" &&
   grep -qF -- "--set 'data.val=\"$R/input/data/validation/*.bin\"'" "$R.out"; then
    ok "SM_CHANNEL_TRAIN names the train channel; 'validation' maps to data.val"
else
    bad "SM_CHANNEL_TRAIN / validation channel: $(grep -E '^(data:|train: 1 host)' "$R.out")"
fi
mkdir -p "$TMP/efa/rdmap0s6-efa"
R=$TMP/efa1/ml
make_root "$R" '{"job": "tiny.json", "train.steps": "1", "nccl_debug": "true"}' train val
env LLMTRAIN_SM_ROOT="$R" LLMTRAIN_BIN="$TMP/wrap.sh" WRAP_ENV="$TMP/efa.env" "$ENTRY" >"$R.out" 2>&1
rc=$?
want="FI_EFA_USE_DEVICE_RDMA=1 FI_PROVIDER=efa NCCL_DEBUG=INFO NCCL_LAUNCH_MODE=PARALLEL NCCL_NET_SHARED_COMMS=0 NCCL_PROTO=simple"
if [ $rc -eq 0 ] && [ "$(tr '\n' ' ' <"$TMP/efa.env" | sed 's/ $//')" = "$want" ]; then
    ok "fake EFA device: $want"
else
    bad "EFA env: rc=$rc got '$(tr '\n' ' ' <"$TMP/efa.env" 2>&1)'"
fi

# 5a. launch.py --dry-run fits the job to the instance type's GPUs: 70B with
# selective checkpointing (79.2 GiB a rank) is refused on 128 p4d (40 GB),
# naming the nearest layouts, and taken on 128 p5e (H200 141GB)
dry70() { $PY scripts/sagemaker/launch.py --job configs/llama2_70b.json --image-uri x --role arn:aws:iam::1:role/r --instance-count 128 \
    --train s3://b/train --checkpoint-s3-uri s3://b/ck --set train.activation_checkpointing=selective --dry-run "$@"; }
dry70 >"$TMP/d70.json" 2>"$TMP/d70.err"; rc=$?
dry70 --instance-type ml.p5e.48xlarge >"$TMP/d70e.json" 2>"$TMP/d70e.err"; rc2=$?
if [ $rc -ne 0 ] && [ ! -s "$TMP/d70.json" ] && grep -q "^launch.py: the job does not fit 1024 ranks of ml.p4d.24xlarge: .*79.2 GiB a rank" "$TMP/d70.err" &&
   grep -q "^  --set train.activation_checkpointing=full: 30.4 GiB a rank" "$TMP/d70.err" &&
   [ $rc2 -eq 0 ] && grep -q '"instance_type": "ml.p5e.48xlarge"' "$TMP/d70e.json"; then
    ok "launch.py --dry-run: 70B selective refused on p4d with the nearest layouts, taken on p5e"
else bad "launch.py fit: rc=$rc/$rc2 $(cat "$TMP/d70.err" "$TMP/d70e.err")"; fi
# 5b. launch.py's GPUs an instance are check's instance table, type for type
# (a missing type once became 1 rank a host); an unknown type is refused
names=$($BIN check configs/llama2_7b.json --instance ml.none 2>&1 | sed -n 's/.*expected one of \(.*\); or give.*/\1/p' | tr -d ',')
mismatch=""
for n in $names; do
    c=$($BIN check configs/llama2_7b.json --world 64 --instance "$n" 2>/dev/null | sed -n "s/^fit: $n: \([0-9]*\) x .*/\1/p")
    p=$($PY -c "import sys; sys.path.insert(0, 'scripts/sagemaker'); import launch; print(launch.GPUS.get('$n', 0))")
    [ -n "$c" ] && [ "$c" = "$p" ] || mismatch="$mismatch $n:$c/$p"
done
dry70 --instance-type ml.p9.nope >/dev/null 2>"$TMP/dnope.err"; rc=$?
if [ -n "$names" ] && [ -z "$mismatch" ] && [ $rc -ne 0 ] && [ "$(wc -l <"$TMP/dnope.err")" -eq 1 ] &&
   grep -q "^launch.py: --instance-type ml.p9.nope: GPUs an instance unknown" "$TMP/dnope.err"; then
    ok "launch.py knows the GPUs of each of check's $(wc -w <<<"$names") instance types; an unknown type is one line"
else bad "launch.py's instance table: mismatch$mismatch; unknown type rc $rc: $(cat "$TMP/dnope.err")"; fi
# 5. launch.py --dry-run: the Estimator's arguments, without importing sagemaker
mkdir -p "$TMP/fakesdk/sagemaker"
echo 'raise ImportError("the dry run must not import sagemaker")' >"$TMP/fakesdk/sagemaker/__init__.py"
if PYTHONPATH="$TMP/fakesdk" $PY scripts/sagemaker/launch.py --job configs/llama2_7b.json --image-uri 1.dkr.ecr/llmtrain:1 \
    --role arn:aws:iam::1:role/r --instance-count 16 --train s3://b/train --val s3://b/val --checkpoint-s3-uri s3://b/ck \
    --set parallel.shard_degree=32 --tensorboard-s3-uri s3://b/tb --dry-run >"$TMP/dry.json" 2>"$TMP/dry.err" &&
   $PY - "$TMP/dry.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); e = d["estimator"]; hp = e["hyperparameters"]
assert e["instance_count"] == 16 and e["instance_type"] == "ml.p4d.24xlarge", e
assert e["checkpoint_s3_uri"] == "s3://b/ck" and e["checkpoint_local_path"] == "/opt/ml/checkpoints", e
assert e["image_uri"] == "1.dkr.ecr/llmtrain:1" and e["role"] == "arn:aws:iam::1:role/r", e
assert hp["job"] == "configs/llama2_7b.json" and hp["parallel.shard_degree"] == "32", hp
assert hp["optim.lr"] == "0.0003" and hp["model.n_layer"] == "32" and "data.train" not in hp, hp
assert all(isinstance(v, str) for v in hp.values()), hp
assert d["inputs"] == {"train": "s3://b/train", "val": "s3://b/val"} and d["world"] == 128, d
# the TensorBoard sync of the folder the entry point writes its event files to
assert e["tensorboard_output_config"] == {"s3_output_path": "s3://b/tb",
                                          "container_local_output_path": "/opt/ml/output/tensorboard"}, e
EOF
then
    ok "launch.py --dry-run: estimator arguments and inputs, the TensorBoard sync of /opt/ml/output/tensorboard, sagemaker not imported"
else
    bad "launch.py --dry-run: $(cat "$TMP/dry.err") $(head -c 300 "$TMP/dry.json")"
fi
if ! $PY scripts/sagemaker/launch.py --job configs/llama2_70b.json --image-uri x --instance-count 3 --train s3://b/t \
    --checkpoint-s3-uri s3://b/c --dry-run >/dev/null 2>"$TMP/dry3.err" &&
   grep -q "does not divide the 12 data-parallel ranks" "$TMP/dry3.err"; then
    ok "launch.py rejects a cluster the layout does not fit: $(cat "$TMP/dry3.err")"
else
    bad "launch.py accepted 70B on 3 instances: $(cat "$TMP/dry3.err")"
fi

# 6. the scripts compile; every COPY source of the Dockerfile exists
if $PY -m py_compile scripts/sagemaker/launch.py && $PY -c "import ast,sys; ast.parse(open('$ENTRY').read())"; then
    ok "entry point and launch.py compile"
else
    bad "entry point or launch.py does not compile"
fi
missing=""; copied=""
for src in $(sed -n 's/^COPY \(.*\) [^ ]*$/\1/p' scripts/sagemaker/Dockerfile); do
    ls -d $src >/dev/null 2>&1 || missing="$missing $src"
    copied="$copied $(ls -d $src 2>/dev/null | tr '\n' ' ')"
done
for c in Makefile *.c *.h *.cu; do case " $copied " in *" $c "*) ;; *) missing="$missing (not copied: $c)";; esac; done
if [ -z "$missing" ] && grep -q '^ENTRYPOINT \["/usr/local/bin/train"\]' scripts/sagemaker/Dockerfile; then
    ok "Dockerfile: every COPY source exists, every file make needs (Makefile, *.c, *.h, *.cu) copied, ENTRYPOINT train"
else
    bad "Dockerfile:$missing"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
