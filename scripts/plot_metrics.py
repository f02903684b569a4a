#!/usr/bin/python3
"""plot_metrics.py -- draw a training run's metrics.jsonl as a 2x2 PNG.

    plot_metrics.py METRICS_JSONL [--out PNG]

METRICS_JSONL holds one JSON object per line. Step lines carry "step" and
some of loss, lr, grad_norm, tokens_per_s, mfu, mem_bytes, val_loss (val_loss
may be on its own line with just "step"). Ignored: lines that are not JSON
objects with a numeric "step", lines with an "event" key, and lines whose
"loss" is present but null or non-finite. When a step appears more than once
(a run resumed from a checkpoint), the last line for it wins.

Panels: train (and smoothed) and val loss vs step; tokens/s; grad norm (log
scale); learning rate. Default output: metrics.png next to the input.
Exit status 2 with one error line when the file is missing or has no step
lines (or matplotlib is missing).
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


def read_metrics(path):
    train, val = {}, {}
    bad = 0
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except ValueError:
                bad += 1  # e.g. a last line cut short by a crash
                continue
            if not isinstance(o, dict) or "event" in o or not finite(o.get("step")):
                continue
            step = int(o["step"])
            if "loss" in o:
                if not finite(o["loss"]):
                    continue
                train[step] = o
            if finite(o.get("val_loss")):
                val[step] = float(o["val_loss"])
    return train, val, bad


def series(rows, key, positive=False):
    xs, ys = [], []
    for step in sorted(rows):
        v = rows[step].get(key)
        if finite(v) and (not positive or v > 0):
            xs.append(step)
            ys.append(float(v))
    return xs, ys


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


def main():
    ap = argparse.ArgumentParser(description="Plot a metrics.jsonl file (loss, val loss, tokens/s, grad norm, lr).")
    ap.add_argument("metrics", metavar="METRICS_JSONL")
    ap.add_argument("--out", metavar="PNG", help="output image (default: metrics.png next to the input)")
    args = ap.parse_args()

    if not os.path.exists(args.metrics):
        die(f"{args.metrics}: no such file")
    if not os.path.isfile(args.metrics):
        die(f"{args.metrics}: not a regular file")
    try:
        train, val, bad = read_metrics(args.metrics)
    except OSError as e:
        die(f"{args.metrics}: cannot read ({e.strerror})")
    if not train and not val:
        die(f"{args.metrics}: no step lines (expected JSON objects with \"step\" and \"loss\" or \"val_loss\")")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.metrics)), "metrics.png")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
    except ImportError:
        die("needs matplotlib (apt-get install python3-matplotlib, or pip install matplotlib)")

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    (ax_loss, ax_tps), (ax_gn, ax_lr) = axes

    def empty(ax, what):
        ax.text(0.5, 0.5, f"no {what} data", ha="center", va="center", transform=ax.transAxes, color="gray")

    # loss
    xs, ys = series(train, "loss")
    if xs:
        if len(xs) > 50:
            ax_loss.plot(xs, ys, color="tab:blue", alpha=0.3, lw=0.8, label="train")
            ax_loss.plot(xs, ema(ys, max(5, len(xs) // 50)), color="tab:blue", lw=1.6, label="train (smoothed)")
        else:
            ax_loss.plot(xs, ys, color="tab:blue", lw=1.4, marker="." if len(xs) < 30 else None, label="train")
    vx = sorted(val)
    if vx:
        ax_loss.plot(vx, [val[s] for s in vx], color="tab:orange", lw=1.6, marker="o", ms=4, label="val")
    if xs or vx:
        ax_loss.legend(loc="upper right")
        lo = min(ys + [val[s] for s in vx])
        # keep the early spike from flattening the interesting part
        tail = ys[len(ys) // 10:] + [val[s] for s in vx]
        hi = max(tail) if tail else max(ys)
        top = max(ys + [val[s] for s in vx])
        ax_loss.set_title("loss")
        if hi > lo:
            ax_loss.set_ylim(lo - 0.05 * (hi - lo), hi + 0.15 * (hi - lo))
            if top > hi + 0.15 * (hi - lo):
                ax_loss.set_title(f"loss (axis clipped at top; max {top:.3f})")
    else:
        empty(ax_loss, "loss")
        ax_loss.set_title("loss")
    ax_loss.set_xlabel("step")

    # tokens/s (and MFU in the title when logged)
    xs, ys = series(train, "tokens_per_s")
    if xs:
        ax_tps.plot(xs, ys, color="tab:green", lw=1.2)
        ax_tps.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
        ys_sorted = sorted(ys)
        med = ys_sorted[len(ys_sorted) // 2]
        title = f"tokens/s (median {human(med)})"
        _, mfu = series(train, "mfu")
        if mfu:
            m = sorted(mfu)[len(mfu) // 2]
            title += f", MFU median {100 * m:.1f}%" if m <= 1 else f", MFU median {m:.1f}%"
        ax_tps.set_title(title)
        ax_tps.set_ylim(bottom=0)
    else:
        empty(ax_tps, "tokens/s")
        ax_tps.set_title("tokens/s")
    ax_tps.set_xlabel("step")

    # grad norm
    xs, ys = series(train, "grad_norm", positive=True)
    if xs:
        ax_gn.plot(xs, ys, color="tab:red", lw=1.0)
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
    ax_gn.set_title("grad norm (log scale)")
    ax_gn.set_xlabel("step")

    # lr
    xs, ys = series(train, "lr")
    if xs:
        ax_lr.plot(xs, ys, color="tab:purple", lw=1.4)
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax_lr.set_ylim(bottom=0)
    else:
        empty(ax_lr, "lr")
    ax_lr.set_title("learning rate")
    ax_lr.set_xlabel("step")

    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    parts = [os.path.basename(os.path.dirname(os.path.abspath(args.metrics))) + "/" + os.path.basename(args.metrics)]
    if train:
        last = max(train)
        parts.append(f"step {last}, loss {float(train[last]['loss']):.4f}")
        mem = train[last].get("mem_bytes")
        if finite(mem) and mem > 0:
            gpu = " gpu" if "gpu_mem_bytes" in train[last] else ""  # CUDA: the device's memory
            parts.append(f"mem {mem / 2**30:.2f} GiB{gpu}")
    if vx:
        parts.append(f"val {val[vx[-1]]:.4f} @ {vx[-1]}")
    fig.suptitle("   ".join(parts))

    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        die(f"{out}: cannot write ({e.strerror})")
    note = f" ({bad} unreadable line{'s' if bad != 1 else ''} skipped)" if bad else ""
    print(f"wrote {out}: {len(train)} train steps, {len(vx)} val points{note}")


if __name__ == "__main__":
    main()
