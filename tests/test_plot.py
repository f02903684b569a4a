"""test_plot.py — scripts/plot_metrics.py draws what metrics.jsonl says.

    /usr/bin/python3 tests/test_plot.py [--bin ./llmtrain] [--keep]

A real run writes the file: a tiny Llama on a 2-source blend, with a
batch-size ramp-up, a blended validation set, a NaN step (LLMTRAIN_FAULT)
and a resume from a checkpoint that logs steps again. The test parses the
file itself (the last line of a step wins) and reads every series back out
of the figure (each line's gid names it): loss, val, each val source,
lr, global batch, grad norm and its spikes, the parameter norm, memory,
step time, checkpoint blocking, the skipped step's and the resume's
verticals, the title. A
hand-written file covers the rest: duplicate steps, a cut-off last line,
events, a null loss, a val-only line, GPU memory fields, the communication
wait, a constant batch, MFU on an axis aligned with tokens/s, the smoothed
loss past 50 steps. Bad input (no file, a folder, no step lines, an
unwritable output, no matplotlib) is one error line and exit 2.
Ends with "N passed, M failed"; exit 1 on any failure.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "plot_metrics.py")
PY = "/usr/bin/python3"
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plot_metrics as P  # noqa: E402
from pycheck import check, run_suite, write_shard  # noqa: E402





def close(a, b, rtol=1e-9):
    a, b = list(a), list(b)
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= rtol * max(1.0, abs(float(y))) for x, y in zip(a, b))


def last_lines(path):
    """The test's own reading: step -> the last non-event line for it."""
    out = {}
    for raw in open(path):
        try:
            o = json.loads(raw)
        except ValueError:
            continue
        if "event" not in o:
            out[o["step"]] = o
    return out


def lines_by_gid(fig):
    got = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_gid():
                got.setdefault(line.get_gid(), []).append((ax, line))
    return got


def xy(got, gid):
    (_, line), = got[gid]
    return [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]


def vertical_steps(got, gid):
    """{axes: [steps]} of the axvlines with this gid."""
    out = {}
    for ax, line in got.get(gid, []):
        xs = line.get_xdata()
        out.setdefault(ax, []).append(float(xs[0]))
    return out


def plot_cli(*args, env=None):
    return subprocess.run([PY, SCRIPT, *args], capture_output=True, text=True, env=env)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])




def real_run(tmp, binary):
    """12 steps: steps 1-6 (NaN at step 3), then a restart from the step-4
    checkpoint that logs 5 and 6 again, on to 12."""
    write_shard(os.path.join(tmp, "a.bin"), 96, 20000, 1)
    write_shard(os.path.join(tmp, "b.bin"), 96, 20000, 2)
    job = {"model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "vocab_size": 96,
                     "max_seq_len": 16},
           "data": {"train": "0.7 a.bin 0.3 b.bin", "val": "0.5 a.bin 0.5 b.bin"},
           "train": {"steps": 12, "seq_len": 16, "micro_batch": 2, "global_batch": 8, "rampup_start_batch": 2,
                     "rampup_batch_increment": 2, "rampup_samples": 30},
           "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5},
           "checkpoint": {"every_steps": 4, "dir": "ck"},
           "log": {"dir": "run"},
           "eval": {"sample_tokens": 0, "batches": 2, "every_steps": 5}}
    with open(os.path.join(tmp, "job.json"), "w") as f:
        json.dump(job, f)
    env = dict(os.environ, LLMTRAIN_DEVICE="cpu", OMP_NUM_THREADS="1")
    first = subprocess.run([binary, "job.json", "--set", "train.steps=6"], cwd=tmp, capture_output=True, text=True,
                           env=dict(env, LLMTRAIN_FAULT="step=3,kind=nan"))
    # the restart resumes from the newest checkpoint: drop step 6's, keep 4's
    shutil.rmtree(os.path.join(tmp, "ck", "step_00000006"), ignore_errors=True)
    # (steps 6 -> 12 moves the cosine's end: a schedule change, taken on purpose)
    second = subprocess.run([binary, "job.json", "--set", "optim.override_schedule=true"], cwd=tmp, capture_output=True,
                            text=True, env=env)
    check(first.returncode == 0 and second.returncode == 0,
          f"real run: two attempts exit 0 ({first.returncode}, {second.returncode}) {second.stderr.strip()[-200:]}")
    return os.path.join(tmp, "run", "metrics.jsonl")


def test_real(tmp, binary):
    path = real_run(tmp, binary)
    if not os.path.exists(path):
        check(False, "real run: metrics.jsonl written")
        return
    rows = last_lines(path)
    steps = sorted(rows)
    check(steps == list(range(1, 13)), f"real run: steps 1..12 logged ({steps})")
    resumes = [json.loads(l)["step"] for l in open(path) if '"event":"resume"' in l]
    check(resumes == [4], f"real run: one resume, from step 4 ({resumes})")

    out = os.path.join(tmp, "plot.png")
    r = plot_cli(path, "--out", out)
    nval = sum(1 for s in steps if "val_loss" in rows[s])
    check(r.returncode == 0 and r.stdout.strip() == f"wrote {out}: 12 train steps, {nval} val points",
          f"cli: exit 0 and its line ({r.returncode}: {r.stdout.strip()} {r.stderr.strip()})")
    check(png_size(out) == (1760, 880), f"cli: a 1760x880 PNG (16x8 in at 110 dpi): {png_size(out)}")
    r = plot_cli(path)
    default = os.path.join(tmp, "run", "metrics.png")
    check(r.returncode == 0 and png_size(default) == (1760, 880), "cli: default output metrics.png beside the input")

    m = P.read_metrics(path)
    fig = P.build_figure(m, "run/metrics.jsonl")
    got = lines_by_gid(fig)

    def series_ok(gid, key, want_steps=None, scale=1.0):
        st = want_steps if want_steps is not None else [s for s in steps if rows[s].get(key) is not None]
        want = [rows[s][key] * scale for s in st]
        if gid not in got:
            check(False, f"figure: {gid} drawn")
            return
        x, y = xy(got, gid)
        check(x == [float(s) for s in st] and close(y, want, 1e-6), f"figure: {gid} = metrics {key} at steps {st}")

    series_ok("loss", "loss")
    series_ok("lr", "lr")
    series_ok("global_batch", "global_batch")
    batches = [rows[s]["global_batch"] for s in steps]
    check(batches[0] == 2 and batches[-1] == 8 and len(set(batches)) > 2, f"real run: the batch ramps 2 to 8 ({batches})")
    series_ok("tokens_per_s", "tokens_per_s")
    series_ok("mem", "mem_bytes", scale=1 / 2**30)
    series_ok("step_ms", "step_ms")
    series_ok("ckpt_block_ms", "ckpt_block_ms", [s for s in steps if rows[s].get("ckpt_block_ms", 0) > 0])
    skipped = [s for s in steps if rows[s]["skipped"]]
    check(skipped == [3], f"real run: step 3 skipped ({skipped})")
    series_ok("grad_norm", "grad_norm", [s for s in steps if rows[s]["grad_norm"] is not None])
    series_ok("param_norm", "param_norm")
    spikes = [s for s in steps if rows[s]["grad_spike"]]
    if spikes:
        series_ok("grad_spike", "grad_norm", spikes)
    else:
        check("grad_spike" not in got, "figure: no spike markers without spikes")
    vsteps = [s for s in steps if "val_loss" in rows[s]]
    # the first attempt's val at its last step, 6, is gone: the restart
    # logged step 6 again, without one
    check(vsteps == [5, 10, 12], f"real run: val at 5, 10, 12 ({vsteps})")
    first6 = [json.loads(l) for l in open(path) if l.startswith('{"step":6,')]
    check(len(first6) == 2 and "val_loss" in first6[0] and "val_loss" not in first6[1],
          "real run: step 6 logged twice, with val loss the first time only")
    series_ok("val", "val_loss", vsteps)
    for i in range(2):
        gid = f"val_source_{i + 1}"
        if gid in got:
            x, y = xy(got, gid)
            check(x == [float(s) for s in vsteps] and close(y, [rows[s]["val_loss_sources"][i] for s in vsteps], 1e-6),
                  f"figure: {gid} = metrics val_loss_sources[{i}]")
        else:
            check(False, f"figure: {gid} drawn")
    check("val_source_3" not in got, "figure: two val sources, no third")
    # MFU: a line of its own here (the restart measured the CPU's peak again)
    # or an axis aligned with tokens/s when mfu/tokens_per_s is constant
    ratios = [rows[s]["mfu"] / rows[s]["tokens_per_s"] for s in steps]
    if max(ratios) > min(ratios) * 1.01:
        series_ok("mfu", "mfu", scale=100.0)
    else:
        check("mfu" not in got, "figure: MFU as an aligned axis")

    sk = vertical_steps(got, "skipped")
    check(sorted(len(v) for v in sk.values()) == [1, 1] and all(v == [3.0] for v in sk.values()),
          f"figure: the skipped step marked at 3 on the loss and grad-norm panels ({list(sk.values())})")
    rs = vertical_steps(got, "resume")
    check(len(rs) == 6 and all(v == [4.0] for v in rs.values()), f"figure: the resume marked at 4 on all 6 panels")
    title = fig._suptitle.get_text()
    want = f"step 12, loss {rows[12]['loss']:.4f}"
    check(want in title and f"val {rows[12]['val_loss']:.4f} @ 12" in title and "1 resume" in title,
          f"figure: title '{title}'")
    titles = [ax.get_title() for ax in fig.axes[:6]]
    check([t.split(" (")[0].split(",")[0] for t in titles] ==
          ["loss", "tokens/s", "grad norm", "learning rate and global batch", "memory", "step time"] and
          "param norm (dashed, right)" in titles[2],
          f"figure: six panels {titles}")


def test_synthetic(tmp):
    path = os.path.join(tmp, "synthetic.jsonl")
    n = 60
    rng = np.random.default_rng(0)
    loss = [float(4 - 2 * s / n + 0.1 * rng.standard_normal()) for s in range(1, n + 1)]
    lines = []
    for s in range(1, n + 1):
        o = {"step": s, "loss": loss[s - 1], "lr": 1e-3, "grad_norm": 1.0 + 0.01 * s, "global_batch": 8,
             "tokens_per_s": 1000.0 + s, "mfu": (1000.0 + s) * 2e-4, "mem_bytes": 3 * 2**30, "gpu_mem_bytes": 3 * 2**30,
             "host_mem_bytes": 2**30, "params_peak_bytes": 2**29, "step_ms": 100.0 + s, "comm_wait_ms": 5.0,
             "skipped": False, "grad_spike": s == 7}
        lines.append(json.dumps(o))
        if s == 20:
            # a first attempt's steps 21-22, logged again after the resume
            lines.append(json.dumps(dict(o, step=21, loss=99.0)))
            lines.append(json.dumps(dict(o, step=22, loss=98.0, val_loss=97.0)))
            lines.append('{"event":"checkpoint","step":20,"path":"x","bytes":1,"write_s":0.1,"durable":false}')
            lines.append('{"event":"resume","step":20,"world":1}')
    lines.append('{"step":30,"val_loss":3.5}')  # val on its own line
    lines.append('{"step":61,"loss":null,"lr":1e-3,"skipped":true}')  # non-finite loss: not drawn, marked
    lines.append('{"step":true,"loss":1.0}')  # not a numeric step
    lines.append('[1,2]')
    lines.append('{"step":62,"loss":1.0,"lr"')  # cut off by a crash
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")

    r = plot_cli(path, "--out", os.path.join(tmp, "s.png"))
    check(r.returncode == 0 and r.stdout.strip().endswith(f": {n} train steps, 1 val points (1 unreadable line skipped)"),
          f"synthetic cli: counts and the unreadable line ({r.stdout.strip()} {r.stderr.strip()})")
    m = P.read_metrics(path)
    check(sorted(m.train) == list(range(1, n + 1)) and m.train[21]["loss"] == loss[20] and m.train[22]["loss"] == loss[21],
          "synthetic: the last line of a repeated step wins, null loss and bool step dropped")
    check(m.resumes == [20] and m.bad == 1 and m.val == {30: (3.5, None)},
          "synthetic: one resume, one bad line, one val (the first attempt's at 22 replaced)")
    fig = P.build_figure(m, "x")
    got = lines_by_gid(fig)
    x, y = xy(got, "loss")
    check(close(y, loss), "synthetic: loss drawn")
    # the smoothed loss: an EMA of span max(5, n // 50), written again here
    a, e, want = 2.0 / (max(5, n // 50) + 1), loss[0], []
    for v in loss:
        e = a * v + (1 - a) * e
        want.append(e)
    x, y = xy(got, "loss_smoothed")
    check(close(y, want, 1e-12), "synthetic: smoothed loss past 50 steps is the EMA of span 5")
    x, y = xy(got, "val")
    check(x == [30.0] and y == [3.5], "synthetic: the val-only line")
    check("global_batch" not in got and "(global batch 8)" in fig.axes[3].get_title(),
          f"synthetic: a constant batch is in the title, not a line ('{fig.axes[3].get_title()}')")
    check("mfu" not in got, "synthetic: constant mfu/tokens_per_s draws no MFU line")
    check("param_norm" not in got and "param norm" not in fig.axes[2].get_title(),
          "synthetic: no param_norm (log.param_norm false), no parameter-norm axis")
    twins = [ax for ax in fig.axes if ax.get_gid() == "mfu_axis"]
    tps_ax = got["tokens_per_s"][0][0]
    ok = len(twins) == 1 and abs(twins[0].get_ylim()[1] / tps_ax.get_ylim()[1] - 100 * 2e-4) < 1e-12
    check(ok, "synthetic: the MFU axis is tokens/s x (mfu / tokens_per_s) in %")
    labels = {line.get_gid(): line.get_label() for ax in fig.axes for line in ax.get_lines() if line.get_gid()}
    check(labels.get("mem") == "GPU peak" and "host_mem" in got and "params_peak" in got,
          "synthetic: GPU peak, host RSS and working-weights peak drawn")
    x, y = xy(got, "host_mem")
    check(close(y, [1.0] * n), "synthetic: host memory in GiB")
    x, y = xy(got, "comm_wait_ms")
    check(close(y, [5.0] * n), "synthetic: communication wait drawn")
    x, y = xy(got, "grad_spike")
    check(x == [7.0], "synthetic: spike marker at step 7")
    rs = vertical_steps(got, "resume")
    check(len(rs) == 6 and all(v == [20.0] for v in rs.values()), "synthetic: resume at 20 on every panel")
    sk = vertical_steps(got, "skipped")
    check(len(sk) == 2 and all(v == [61.0] for v in sk.values()), "synthetic: the null-loss skipped step marked")
    check("mem 3.00 GiB gpu" in fig._suptitle.get_text(), f"synthetic: title '{fig._suptitle.get_text()}'")


def test_errors(tmp):
    def one_error(r, what, needle):
        err = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(err) == 1 and err[0].startswith("plot_metrics.py: error: ") and needle in err[0],
              f"error: {what} -> exit 2, one line ({r.returncode}: {r.stderr.strip()})")

    one_error(plot_cli(os.path.join(tmp, "nope.jsonl")), "missing file", "no such file")
    one_error(plot_cli(tmp), "a folder", "not a regular file")
    ev = os.path.join(tmp, "events.jsonl")
    with open(ev, "w") as f:
        f.write('{"event":"resume","step":4,"world":1}\n{"step":1,"loss":null}\n')
    one_error(plot_cli(ev), "no step lines", "no step lines")
    good = os.path.join(tmp, "good.jsonl")
    with open(good, "w") as f:
        f.write('{"step":1,"loss":2.0}\n')
    one_error(plot_cli(good, "--out", os.path.join(tmp, "no", "such", "dir.png")), "unwritable output", "cannot write")
    fake = os.path.join(tmp, "nompl", "matplotlib")
    os.makedirs(fake)
    with open(os.path.join(fake, "__init__.py"), "w") as f:
        f.write("raise ImportError('no matplotlib here')\n")
    one_error(plot_cli(good, "--out", os.path.join(tmp, "x.png"), env=dict(os.environ, PYTHONPATH=os.path.dirname(fake))),
              "no matplotlib", "needs matplotlib")
    check(not os.path.exists(os.path.join(tmp, "x.png")), "error: nothing written without matplotlib")


def main(tmp, binary):
    test_real(tmp, binary)
    test_synthetic(tmp)
    test_errors(tmp)


if __name__ == "__main__":
    run_suite("test_plot", main)
