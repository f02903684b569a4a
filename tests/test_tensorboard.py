"""test_tensorboard.py — log.tensorboard_dir writes what metrics.jsonl says.

    /usr/bin/python3 tests/test_tensorboard.py [--bin ./llmtrain] [--keep]

Reads the event files without llmtrain's code: the TFRecord frames with
both CRCs checked by crcmod's 'crc-32c' (masked as TFRecord masks them),
each record decoded by google.protobuf from tensorflow's Event, Summary
and Summary.Value messages, declared here as descriptors. Then: the first
record is file_version "brain.Event:2"; every step's scalars are exactly
metrics.jsonl's numbers of that step rounded to float32, under the tag
table below and no others; a number metrics.jsonl has as null (the NaN step's
grad_norm, LLMTRAIN_FAULT) has no scalar;
eval steps have val/loss and one val/loss_<i> per source of the blended
val data; a resumed run writes a second file whose steps go on; a 2-rank
MPI FULL_SHARD run writes one file; a flipped byte fails the CRC check;
an unwritable folder is one stderr line and exit 3.
Ends with "N passed, M failed"; exit 1 on any failure.
"""
import glob
import json
import os
import shutil
import struct
import subprocess

import crcmod.predefined
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pycheck import check, run_suite, write_shard


# metrics.jsonl key -> TensorBoard tag (docs/observability.md, TensorBoard)
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "param_norm": "train/param_norm",
        "global_batch": "train/global_batch", "consumed_samples": "train/consumed_samples",
        "nonfinite_total": "train/nonfinite_total", "grad_norm_mean20": "train/grad_norm_mean20",
        "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu", "step_ms": "perf/step_ms",
        "ckpt_block_ms": "perf/ckpt_block_ms", "comm_wait_ms": "perf/comm_wait_ms",
        "mem_bytes": "memory/mem_bytes", "gpu_mem_bytes": "memory/gpu_mem_bytes",
        "host_mem_bytes": "memory/host_mem_bytes", "params_peak_bytes": "memory/params_peak_bytes",
        "val_loss": "val/loss"}




def event_class():
    """tensorflow.Event as far as scalars go, from descriptors built here."""
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="tb_event_test.proto", package="tbtest", syntax="proto3")
    summ = fd.message_type.add(name="Summary")
    val = summ.nested_type.add(name="Value")
    val.oneof_decl.add(name="value")
    val.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    val.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    summ.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                   type_name=".tbtest.Summary.Value")
    ev = fd.message_type.add(name="Event")
    ev.oneof_decl.add(name="what")
    ev.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    ev.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    ev.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    ev.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=0,
                 type_name=".tbtest.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("tbtest.Event")
    factory = message_factory.MessageFactory(pool)
    return factory.GetMessageClass(desc) if hasattr(factory, "GetMessageClass") else factory.GetPrototype(desc)


Event = event_class()
CRC32C = crcmod.predefined.mkCrcFun("crc-32c")


def masked(data):
    c = CRC32C(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(path):
    """The file's Events; ValueError on a bad frame, CRC or unknown field."""
    raw = open(path, "rb").read()
    out, pos = [], 0
    while pos < len(raw):
        if pos + 12 > len(raw):
            raise ValueError(f"cut-off header at {pos}")
        head = raw[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        if hcrc != masked(head):
            raise ValueError(f"length CRC mismatch at {pos}")
        data = raw[pos + 12:pos + 12 + n]
        if len(data) != n or pos + 16 + n > len(raw):
            raise ValueError(f"cut-off record at {pos}")
        (dcrc,) = struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])
        if dcrc != masked(data):
            raise ValueError(f"data CRC mismatch at {pos}")
        ev = Event()
        ev.ParseFromString(data)
        if ev.UnknownFields() if hasattr(ev, "UnknownFields") else False:
            raise ValueError(f"unknown fields in the record at {pos}")
        out.append(ev)
        pos += 16 + n
    return out


def unknown_free(ev):
    """No field the descriptors do not name (a wrong field number lands there)."""
    try:
        from google.protobuf import unknown_fields
        msgs = [ev, ev.summary] + list(ev.summary.value)
        return all(len(unknown_fields.UnknownFieldSet(m)) == 0 for m in msgs)
    except ImportError:
        return all(not m.UnknownFields() for m in [ev, ev.summary] + list(ev.summary.value))


def f32(x):
    return float(np.float32(x))


def metric_segments(path):
    """metrics.jsonl's step lines, split where a resume event starts a new process."""
    segs = [[]]
    for line in open(path):
        o = json.loads(line)
        if o.get("event") == "resume":
            segs.append([])
        elif "event" not in o:
            segs[-1].append(o)
    return segs


def want_scalars(row):
    want = {}
    for k, tag in TAGS.items():
        if row.get(k) is not None:
            want[tag] = f32(row[k])
    for i, v in enumerate(row.get("val_loss_sources") or []):
        if v is not None:
            want[f"val/loss_{i}"] = f32(v)
    return want


def got_scalars(ev):
    return {v.tag: v.simple_value for v in ev.summary.value if v.HasField("simple_value")}


def check_file(label, path, rows):
    """path's Events against rows (one process's metrics.jsonl step lines)."""
    try:
        evs = read_events(path)
    except ValueError as e:
        check(False, f"{label}: frames and CRCs valid ({e})")
        return []
    check(len(evs) >= 1 and evs[0].HasField("file_version") and evs[0].file_version == "brain.Event:2"
          and evs[0].wall_time > 1.6e9, f"{label}: first record is file_version brain.Event:2 with a wall time")
    steps = evs[1:]
    check(all(e.HasField("summary") and unknown_free(e) for e in steps) and unknown_free(evs[0]),
          f"{label}: every later record a summary, no unknown fields")
    check([e.step for e in steps] == [r["step"] for r in rows],
          f"{label}: one event per metrics step line ({[e.step for e in steps]} vs {[r['step'] for r in rows]})")
    bad = []
    for e, r in zip(steps, rows):
        got, want = got_scalars(e), want_scalars(r)
        if got != want or abs(e.wall_time - r["time"]) > 0.002:
            bad.append((r["step"], sorted(set(got.items()) ^ set(want.items()))[:4], e.wall_time, r["time"]))
    check(not bad and rows, f"{label}: each step's scalars = metrics.jsonl's as float32, same tags, same time {bad[:2]}")
    return steps




def make_job(tmp):
    write_shard(os.path.join(tmp, "a.bin"), 96, 20000, 1)
    write_shard(os.path.join(tmp, "b.bin"), 96, 20000, 2)
    job = {"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "vocab_size": 96,
                     "max_seq_len": 16},
           "data": {"train": "0.7 a.bin 0.3 b.bin", "val": "0.5 a.bin 0.5 b.bin"},
           "train": {"steps": 6, "seq_len": 16, "micro_batch": 2, "global_batch": 4},
           "optim": {"lr": 1e-2, "warmup_steps": 2},
           "checkpoint": {"every_steps": 3, "dir": "ck"},
           "log": {"dir": "run", "tensorboard_dir": "tb"},
           "eval": {"sample_tokens": 0, "batches": 2, "every_steps": 4}}
    with open(os.path.join(tmp, "job.json"), "w") as f:
        json.dump(job, f)


def test_resume(tmp, binary, env):
    """6 steps (NaN at 3), then a resume from step 6 on to 9: two files."""
    first = subprocess.run([binary, "job.json"], cwd=tmp, capture_output=True, text=True,
                           env=dict(env, LLMTRAIN_FAULT="step=3,kind=nan"))
    files1 = glob.glob(os.path.join(tmp, "tb", "events.out.tfevents.*"))
    second = subprocess.run([binary, "job.json", "--set", "train.steps=9", "--set", "optim.override_schedule=true"], cwd=tmp,
                            capture_output=True, text=True, env=env)  # 6 -> 9 steps moves the decay's end: taken on purpose
    check(first.returncode == 0 and second.returncode == 0,
          f"run and resume exit 0 ({first.returncode}, {second.returncode}) {second.stderr.strip()[-200:]}")
    files = sorted(glob.glob(os.path.join(tmp, "tb", "events.out.tfevents.*")), key=os.path.getmtime)
    check(len(files1) == 1 and len(files) == 2 and files[0] == files1[0],
          f"one file per start, the resume's a new one ({[os.path.basename(f) for f in files]})")
    host = os.uname().nodename
    check(all(os.path.basename(f).split(".")[4] == host and os.path.basename(f).split(".")[3].isdigit()
              for f in files), "named events.out.tfevents.<unix seconds>.<host>.<pid>")
    lines = first.stdout.splitlines()
    check(any(l.startswith("tensorboard: tb/events.out.tfevents.") for l in lines) and
          any(l == "metrics: " + os.path.join("run", "metrics.jsonl") for l in lines),
          "the header names the event file on its own line (the metrics: line stays the bare path)")
    segs = metric_segments(os.path.join(tmp, "run", "metrics.jsonl"))
    if len(segs) != 2 or len(files) != 2:
        check(False, f"two metrics segments and two files ({len(segs)}, {len(files)})")
        return files
    ev1 = check_file("first run", files[0], segs[0])
    ev2 = check_file("resumed run", files[1], segs[1])
    check([e.step for e in ev2] == [7, 8, 9] and [e.step for e in ev1] == [1, 2, 3, 4, 5, 6],
          "the resumed file's steps go on from the checkpoint (7..9 after 1..6)")
    by_step = {e.step: got_scalars(e) for e in ev1 + ev2}
    # kind=nan poisons the gradients: metrics.jsonl has grad_norm null there
    nan_row = [r for r in segs[0] if r["step"] == 3]
    check(nan_row and nan_row[0]["grad_norm"] is None and nan_row[0]["skipped"] and 3 in by_step
          and "train/grad_norm" not in by_step[3] and "train/lr" in by_step[3]
          and by_step[3].get("train/loss") == f32(nan_row[0]["loss"]),
          "the NaN-skipped step 3 has no train/grad_norm (metrics null), its other scalars stay")
    check(all("train/loss" in by_step.get(s, {}) for s in (1, 2, 4, 5, 6, 7, 8, 9)), "every other step has train/loss")
    val_steps = sorted(s for s, g in by_step.items() if "val/loss" in g)
    check(val_steps == [4, 6, 8, 9], f"val/loss at the eval steps 4, 6 (end), 8, 9 (end): {val_steps}")
    check(val_steps and all("val/loss_0" in by_step[s] and "val/loss_1" in by_step[s]
                            and "val/loss_2" not in by_step[s] for s in val_steps) and all("val/loss_0" not in by_step[s] for s in by_step if s not in val_steps),
          "each val step has val/loss_0 and val/loss_1 (the blend's two sources), no other step any")
    check(all(k in by_step.get(1, {}) for k in ("train/lr", "perf/tokens_per_s", "perf/mfu", "perf/step_ms",
                                        "memory/mem_bytes", "train/global_batch", "train/param_norm")),
          f"step 1 has lr, tokens/s, MFU, step time, memory, global batch, param norm: {sorted(by_step.get(1, {}))}")
    return files


def test_corrupt(tmp, path):
    raw = bytearray(open(path, "rb").read())
    for where, label in ((len(raw) - 30, "a record's data"), (0, "the first length")):
        bad = bytearray(raw)
        bad[where] ^= 0x01
        p = os.path.join(tmp, "corrupt")
        open(p, "wb").write(bytes(bad))
        try:
            read_events(p)
            check(False, f"a flipped bit in {label} fails the CRC check")
        except ValueError as e:
            check("CRC" in str(e), f"a flipped bit in {label} fails the CRC check ({e})")


def test_mpi(tmp, binary, env):
    d = os.path.join(tmp, "mpi")
    os.makedirs(d)
    for f in ("a.bin", "b.bin", "job.json"):
        shutil.copy(os.path.join(tmp, f), d)
    r = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", "-x", "LLMTRAIN_DEVICE",
                        "-x", "OMP_NUM_THREADS", binary, "job.json", "--set", "parallel.strategy=FULL_SHARD",
                        "--set", "train.steps=3", "--set", "checkpoint.every_steps=0"],
                       cwd=d, capture_output=True, text=True, env=env)
    files = glob.glob(os.path.join(d, "tb", "*"))
    check(r.returncode == 0 and len(files) == 1,
          f"2 MPI ranks, FULL_SHARD: exit 0 and one event file ({r.returncode}, {files}) {r.stderr.strip()[-200:]}")
    if files:
        segs = metric_segments(os.path.join(d, "run", "metrics.jsonl"))
        evs = check_file("2 ranks", files[0], segs[0])
        check(evs and all("perf/comm_wait_ms" in got_scalars(e) and "memory/params_peak_bytes" in got_scalars(e)
                          for e in evs), "2 ranks: perf/comm_wait_ms and memory/params_peak_bytes each step")


def test_unwritable(tmp, binary, env):
    r = subprocess.run([binary, "job.json", "--set", "log.tensorboard_dir=job.json/tb", "--set", "log.dir=run_bad",
                        "--set", "checkpoint.resume=none"],
                       cwd=tmp, capture_output=True, text=True, env=env)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 3 and len(lines) == 1 and "log.tensorboard_dir: cannot create job.json/tb" in lines[0],
          f"a folder under a regular file: exit 3 and one stderr line ({r.returncode}: {r.stderr.strip()[:200]})")
    check(not any(l.startswith("step ") for l in r.stdout.splitlines()), "and no step runs")


def main(tmp, binary):
    env = dict(os.environ, LLMTRAIN_DEVICE="cpu", OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("LLMTRAIN_FAULT", None)
    make_job(tmp)
    files = test_resume(tmp, binary, env)
    if files:
        test_corrupt(tmp, files[0])
    test_mpi(tmp, binary, env)
    test_unwritable(tmp, binary, env)


if __name__ == "__main__":
    run_suite("test_tensorboard", main)
