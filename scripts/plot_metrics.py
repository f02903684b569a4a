#!/usr/bin/python3
"""plot_metrics.py -- draw a training run's metrics.jsonl as a 2x3 PNG.

    plot_metrics.py METRICS_JSONL [--out PNG]

METRICS_JSONL holds one JSON object per line (llmtrain's log.dir/metrics.jsonl).
Step lines carry "step" and some of loss, lr, grad_norm, param_norm,
global_batch, tokens_per_s, mfu, mem_bytes, gpu_mem_bytes, host_mem_bytes,
params_peak_bytes, step_ms, comm_wait_ms, ckpt_block_ms, skipped,
grad_spike, val_loss and val_loss_sources (val_loss may be on its own line
with just "step"). A {"event":"resume","step":N} line marks a restart from
the checkpoint of step N; other event lines are ignored, as are lines that
are not JSON objects with a numeric "step". When a step is logged more than
once (a run resumed from a checkpoint logs the steps after it again), its
last line with "loss" wins, val loss included; a null (non-finite) loss is
not drawn, though the step is marked when that line says skipped.

Panels, all against the step:
  loss           train (smoothed too past 50 steps), val, each val source of
                 a blend (dashed), skipped steps (red verticals)
  tokens/s       and MFU (right axis, %), medians in the title
  grad norm      log scale; grad-norm spikes (dots) and skipped steps; the
                 parameter norm (right axis, linear)
  learning rate  and the global batch (right axis) when a ramp-up changes it
  memory         GiB: the step line's peak (host RSS, or the GPU's on CUDA),
                 the host's on CUDA, the working weights' peak when sharded
  step time      ms; the communication wait and checkpoint blocking
Every panel marks the resumes (gray dotted verticals). Default output:
metrics.png next to the input. Exit status 2 with one error line when the
file is missing or has no step lines, or matplotlib is missing.
"""
import argparse
import json
import math
import os
import sys


def die(msg):
    print(f"plot_metrics.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class Metrics:
    """What the file says: train[step] = the step's last line (finite loss),
    val[step] = (val_loss, [per-source losses] or None), skipped = the steps
    whose last line says skipped, resumes = the steps restarted from, bad =
    lines that were not JSON."""

    def __init__(self):
        self.train, self.val, self.skipped, self.resumes, self.bad = {}, {}, set(), [], 0


def read_metrics(path):
    m = Metrics()
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except ValueError:
                m.bad += 1  # e.g. a last line cut short by a crash
                continue
            if not isinstance(o, dict) or not finite(o.get("step")):
                continue
            step = int(o["step"])
            if "event" in o:
                if o["event"] == "resume" and step not in m.resumes:
                    m.resumes.append(step)
                continue
            if "loss" in o:
                # the step's line: it replaces what an earlier attempt logged
                # for this step, val loss included
                m.train.pop(step, None)
                m.val.pop(step, None)
                m.skipped.discard(step)
                if o.get("skipped") is True:
                    m.skipped.add(step)
                if finite(o["loss"]):
                    m.train[step] = o
            if finite(o.get("val_loss")):
                src = o.get("val_loss_sources")
                if isinstance(src, list) and src:
                    src = [float(v) if finite(v) else math.nan for v in src]
                else:
                    src = None
                m.val[step] = (float(o["val_loss"]), src)
    m.resumes.sort()
    return m


def series(rows, key, positive=False, scale=1.0):
    xs, ys = [], []
    for step in sorted(rows):
        v = rows[step].get(key)
        if finite(v) and (not positive or v > 0):
            xs.append(step)
            ys.append(float(v) * scale)
    return xs, ys


def flagged(rows, key):
    return [step for step in sorted(rows) if rows[step].get(key) is True]


def ema(ys, n):
    if not ys:
        return []
    a = 2.0 / (n + 1)
    out, m = [], ys[0]
    for y in ys:
        m = a * y + (1 - a) * m
        out.append(m)
    return out


def human(x):
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def median(ys):
    s = sorted(ys)
    return s[len(s) // 2]


SOURCE_COLORS = ("tab:cyan", "tab:olive", "tab:pink", "tab:brown", "tab:gray", "tab:purple")


def build_figure(m, name):
    """The figure for Metrics m. Each plotted line's gid names its series
    (tests/test_plot.py reads them back): loss, loss_smoothed, val,
    val_source_1.., tokens_per_s, mfu, grad_norm, grad_spike, param_norm,
    lr, global_batch, mem, host_mem, params_peak, step_ms, comm_wait_ms,
    ckpt_block_ms; skipped and resume for the vertical markers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    train, val = m.train, m.val
    fig, axes = plt.subplots(2, 3, figsize=(16, 8), constrained_layout=True)
    (ax_loss, ax_tps, ax_gn), (ax_lr, ax_mem, ax_time) = axes

    def empty(ax, what):
        ax.text(0.5, 0.5, f"no {what} data", ha="center", va="center", transform=ax.transAxes, color="gray")

    def plot(ax, gid, xs, ys, **kw):
        (line,) = ax.plot(xs, ys, **kw)
        line.set_gid(gid)
        return line

    def verticals(ax, steps, gid, label=None, **kw):
        for i, s in enumerate(steps):
            ax.axvline(s, label=label if i == 0 else None, gid=gid, **kw)

    skipped = sorted(m.skipped)

    # loss: train, val, each val source, skipped steps
    xs, ys = series(train, "loss")
    if xs:
        if len(xs) > 50:
            plot(ax_loss, "loss", xs, ys, color="tab:blue", alpha=0.3, lw=0.8, label="train")
            plot(ax_loss, "loss_smoothed", xs, ema(ys, max(5, len(xs) // 50)), color="tab:blue", lw=1.6,
                 label="train (smoothed)")
        else:
            plot(ax_loss, "loss", xs, ys, color="tab:blue", lw=1.4, marker="." if len(xs) < 30 else None, label="train")
    vx = sorted(val)
    vys = [val[s][0] for s in vx]
    if vx:
        plot(ax_loss, "val", vx, vys, color="tab:orange", lw=1.6, marker="o", ms=4, label="val")
        n_src = max(len(val[s][1] or []) for s in vx)
        for i in range(n_src):
            sx = [s for s in vx if val[s][1] and i < len(val[s][1]) and finite(val[s][1][i])]
            if sx:
                plot(ax_loss, f"val_source_{i + 1}", sx, [val[s][1][i] for s in sx], lw=1.0, ls="--", marker="o",
                     ms=3, color=SOURCE_COLORS[i % len(SOURCE_COLORS)], label=f"val source {i + 1}")
                vys += [val[s][1][i] for s in sx]
    verticals(ax_loss, skipped, "skipped", "skipped step", color="tab:red", lw=0.8, alpha=0.6)
    ax_loss.set_title("loss")
    if xs or vx:
        ax_loss.legend(loc="best", fontsize="small")
        lo = min(ys + vys)
        # keep the early spike from flattening the interesting part
        tail = ys[len(ys) // 10:] + vys
        hi = max(tail) if tail else max(ys)
        top = max(ys + vys)
        if hi > lo:
            ax_loss.set_ylim(lo - 0.05 * (hi - lo), hi + 0.15 * (hi - lo))
            if top > hi + 0.15 * (hi - lo):
                ax_loss.set_title(f"loss (axis clipped at top; max {top:.3f})")
    else:
        empty(ax_loss, "loss")

    # tokens/s, and MFU on the right axis
    xs, ys = series(train, "tokens_per_s")
    if xs:
        plot(ax_tps, "tokens_per_s", xs, ys, color="tab:green", lw=1.2, label="tokens/s")
        ax_tps.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
        title = f"tokens/s (median {human(median(ys))})"
        top = 1.05 * max(ys)
        ax_tps.set_ylim(0, top)
        mx, mfu = series(train, "mfu", scale=100.0)
        if mfu:
            # MFU is tokens/s times FLOPs per token / peak, a constant until a
            # restart changes the world or the measured peak: while it is, a
            # right axis aligned with tokens/s, otherwise a dashed line
            ax_mfu = ax_tps.twinx()
            ax_mfu.set_gid("mfu_axis")
            tps = dict(zip(xs, ys))
            ratios = [v / tps[s] for s, v in zip(mx, mfu) if tps.get(s, 0) > 0]
            if ratios and max(ratios) <= min(ratios) * 1.01:
                ax_mfu.set_ylim(0, top * median(ratios))
                title += f", MFU (right) median {median(mfu):.1f}%"
            else:
                plot(ax_mfu, "mfu", mx, mfu, color="tab:olive", lw=1.0, ls="--", label="MFU")
                ax_mfu.set_ylim(bottom=0)
                title += f", MFU (dashed, right) median {median(mfu):.1f}%"
            ax_mfu.set_ylabel("MFU %")
        ax_tps.set_title(title)
    else:
        empty(ax_tps, "tokens/s")
        ax_tps.set_title("tokens/s")

    # grad norm, spikes and skipped steps
    xs, ys = series(train, "grad_norm", positive=True)
    spikes = []
    if xs:
        plot(ax_gn, "grad_norm", xs, ys, color="tab:red", lw=1.0)
        spikes = [s for s in flagged(train, "grad_spike") if s in set(xs)]
        if spikes:
            plot(ax_gn, "grad_spike", spikes, [float(train[s]["grad_norm"]) for s in spikes], ls="none", marker="o",
                 ms=4, color="black", label="spike")
        ax_gn.set_yscale("log")
        fmt = FuncFormatter(lambda v, _: f"{v:g}")
        ax_gn.yaxis.set_major_formatter(fmt)
        if max(ys) / min(ys) < 1e3:  # few decades: label 2x and 5x too
            ax_gn.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            ax_gn.yaxis.set_minor_formatter(fmt)
        else:
            ax_gn.yaxis.set_minor_formatter(NullFormatter())
    else:
        empty(ax_gn, "grad norm")
    verticals(ax_gn, skipped, "skipped", "skipped step", color="tab:red", lw=0.8, alpha=0.6)
    if spikes or skipped:
        ax_gn.legend(loc="upper right", fontsize="small")
    title = "grad norm (log scale)"
    # the parameter norm (log.param_norm) on the right, linear
    px, pys = series(train, "param_norm")
    if px:
        ax_pn = ax_gn.twinx()
        plot(ax_pn, "param_norm", px, pys, color="tab:blue", lw=1.2, ls="--")
        ax_pn.set_ylabel("parameter norm")
        title += f", param norm (dashed, right) {pys[0]:.4g} to {pys[-1]:.4g}"
    ax_gn.set_title(title)

    # learning rate, and the global batch when it changes (a ramp-up)
    xs, ys = series(train, "lr")
    title = "learning rate"
    if xs:
        plot(ax_lr, "lr", xs, ys, color="tab:purple", lw=1.4)
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax_lr.set_ylim(bottom=0)
    else:
        empty(ax_lr, "lr")
    bx, bys = series(train, "global_batch")
    if len(set(bys)) > 1:
        ax_b = ax_lr.twinx()
        plot(ax_b, "global_batch", bx, bys, color="tab:brown", lw=1.2, ls="--", drawstyle="steps-post")
        ax_b.set_ylabel("global batch (sequences)")
        ax_b.set_ylim(bottom=0)
        title += f" and global batch (dashed, right: {human(bys[0])} to {human(bys[-1])})"
    elif bys:
        title += f" (global batch {human(bys[0])})"
    ax_lr.set_title(title)

    # memory
    gib = 1.0 / 2**30
    last = train[max(train)] if train else {}
    gpu = "gpu_mem_bytes" in last
    drawn = False
    for key, gid, label, style in (("mem_bytes", "mem", "GPU peak" if gpu else "peak RSS", "-"),
                                   ("host_mem_bytes", "host_mem", "host peak RSS", "--"),
                                   ("params_peak_bytes", "params_peak", "working weights peak", ":")):
        xs, ys = series(train, key, positive=True, scale=gib)
        if xs:
            plot(ax_mem, gid, xs, ys, lw=1.4, ls=style, label=label)
            drawn = True
    if drawn:
        ax_mem.legend(loc="lower right", fontsize="small")
        ax_mem.set_ylim(0, 1.1 * max(max(line.get_ydata()) for line in ax_mem.get_lines()))
    else:
        empty(ax_mem, "memory")
    ax_mem.set_title("memory (GiB)")

    # step time, communication wait, checkpoint blocking
    xs, ys = series(train, "step_ms")
    if xs:
        plot(ax_time, "step_ms", xs, ys, color="tab:gray", lw=1.2, label="step")
        title = f"step time (ms; median {median(ys):.4g})"
        cx, cys = series(train, "comm_wait_ms")
        if cx:
            plot(ax_time, "comm_wait_ms", cx, cys, color="tab:cyan", lw=1.0, label="comm wait")
        kx, kys = series(train, "ckpt_block_ms", positive=True)
        if kx:
            plot(ax_time, "ckpt_block_ms", kx, kys, ls="none", marker="v", ms=5, color="tab:pink",
                 label="checkpoint blocking")
        ax_time.legend(loc="upper right", fontsize="small")
        ax_time.set_ylim(bottom=0)
        ax_time.set_title(title)
    else:
        empty(ax_time, "step time")
        ax_time.set_title("step time (ms)")

    for ax in axes.flat:
        verticals(ax, m.resumes, "resume", color="gray", ls=":", lw=1.0)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    fig.suptitle(title_of(m, name))
    return fig


def title_of(m, name):
    parts = [name]
    if m.train:
        last = max(m.train)
        parts.append(f"step {last}, loss {float(m.train[last]['loss']):.4f}")
        mem = m.train[last].get("mem_bytes")
        if finite(mem) and mem > 0:
            gpu = " gpu" if "gpu_mem_bytes" in m.train[last] else ""  # CUDA: the device's memory
            parts.append(f"mem {mem / 2**30:.2f} GiB{gpu}")
    if m.val:
        s = max(m.val)
        parts.append(f"val {m.val[s][0]:.4f} @ {s}")
    if m.resumes:
        parts.append(f"{len(m.resumes)} resume{'s' if len(m.resumes) != 1 else ''} (dotted)")
    return "   ".join(parts)


def main():
    ap = argparse.ArgumentParser(description="Plot a metrics.jsonl file (loss, val loss, tokens/s and MFU, grad norm, "
                                             "lr and batch, memory, step time).")
    ap.add_argument("metrics", metavar="METRICS_JSONL")
    ap.add_argument("--out", metavar="PNG", help="output image (default: metrics.png next to the input)")
    args = ap.parse_args()

    if not os.path.exists(args.metrics):
        die(f"{args.metrics}: no such file")
    if not os.path.isfile(args.metrics):
        die(f"{args.metrics}: not a regular file")
    try:
        m = read_metrics(args.metrics)
    except OSError as e:
        die(f"{args.metrics}: cannot read ({e.strerror})")
    if not m.train and not m.val:
        die(f"{args.metrics}: no step lines (expected JSON objects with \"step\" and \"loss\" or \"val_loss\")")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.metrics)), "metrics.png")

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        die("needs matplotlib (apt-get install python3-matplotlib, or pip install matplotlib)")

    name = os.path.basename(os.path.dirname(os.path.abspath(args.metrics))) + "/" + os.path.basename(args.metrics)
    fig = build_figure(m, name)
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        die(f"{out}: cannot write ({e.strerror})")
    note = f" ({m.bad} unreadable line{'s' if m.bad != 1 else ''} skipped)" if m.bad else ""
    print(f"wrote {out}: {len(m.train)} train steps, {len(m.val)} val points{note}")


if __name__ == "__main__":
    main()
