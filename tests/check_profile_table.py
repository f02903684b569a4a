#!/usr/bin/env python3
"""The log.profile_steps table a run printed against the profile.json it wrote.

usage: check_profile_table.py OUT JSON

Recomputes from the JSON's sums (in its order, so the same doubles as
llmtrain's) every figure the table prints: each row's ms a step, share,
calls, us a call, the products' TFLOP/s and share of peak_gflops (the FP8
products', names ending _fp8, of peak_fp8_gflops), the
memory-bound entries' GB/s and share of peak_gbs (blank with no peak), the
two summary lines and, with both peaks, the line of what the calls would take
at them. Prints what differs and exits 1, else a one-line summary.
"""
import json
import sys


def main():
    out, path = sys.argv[1:3]
    p = json.load(open(path))
    lines = [ln[len("profile: "):] for ln in open(out, errors="replace").read().splitlines() if ln.startswith("profile: ")]
    s = p["steps"] or 1
    pf, pb, p8 = p["peak_gflops"], p["peak_gbs"], p["peak_fp8_gflops"]
    E = p["entries"]
    errs = []
    peak = lambda e: p8 if e["fp8"] else pf
    bad8 = [e["name"] for e in E if e["fp8"] != e["name"].endswith("_fp8")]
    if bad8:
        errs.append(f"fp8 flags and names disagree: {bad8}")

    ms = fl = fl_ms = ff = by = by_ms = 0.0
    n8 = 0
    for e in E:
        ms += e["ms"]
        if e["flops"] > 0:
            fl += e["flops"]
            fl_ms += e["ms"]
            ff += e["flops"] / (peak(e) * 1e6) if pf > 0 else 0.0
            n8 += e["fp8"]
        elif e["bytes"] > 0:
            by += e["bytes"]
            by_ms += e["ms"]

    def want_line(prefix, text):
        got = [ln for ln in lines if ln.startswith(prefix)]
        if text is None:
            if got:
                errs.append(f"unexpected line: {got[0]!r}")
        elif got != [text]:
            errs.append(f"expected {text!r}, got {got!r}")

    if fl > 0:
        t = f"matrix products and attention: {fl / s / 1e12:.4g} TFLOP a step in {fl_ms / s:.2f} ms, {fl / (fl_ms * 1e9):.4g} TFLOP/s"
        if pf > 0 and not n8:
            t += f" ({100 * fl / (fl_ms * 1e6) / pf:.1f}% of the {pf / 1e3:.4g} TFLOP/s peak)"
        elif pf > 0:
            t += f" ({100 * ff / fl_ms:.1f}% of the peaks: {pf / 1e3:.4g} TFLOP/s, FP8 products {p8 / 1e3:.4g})"
        want_line("matrix products and attention:", t)
    if by > 0:
        t = f"memory-bound entries: {by / s / 1e9:.4g} GB a step in {by_ms / s:.2f} ms, {by / (by_ms * 1e6):.4g} GB/s"
        if pb > 0:
            t += f" ({100 * by / (by_ms * 1e6) / pb:.1f}% of the {pb:.4g} GB/s peak)"
        want_line("memory-bound entries:", t)
    floor = None
    if fl > 0 and by > 0 and pf > 0 and pb > 0:
        bf, rest = by / (pb * 1e6), ms - fl_ms - by_ms
        floor = ff + bf + rest
        want_line("at the peaks", f"at the peaks these calls would take {floor / s:.2f} ms a step (the products and attention "
                  f"{ff / s:.2f}, the memory-bound entries {bf / s:.2f}, the rest {rest / s:.2f} as timed): "
                  f"{100 * floor / ms:.1f}% of their timed {ms / s:.2f} ms")
    else:
        want_line("at the peaks", None)

    rows = {}
    for ln in lines:
        f = ln.split()
        if len(f) >= 5 and f[-1] in {e["name"] for e in E} and f[1].endswith("%"):
            rows[f[-1]] = f
    for e in E:
        f = rows.get(e["name"])
        if f is None:
            errs.append(f"no row for {e['name']}")
            continue
        want = [f"{e['ms'] / s:.3f}", f"{100 * e['ms'] / ms if ms > 0 else 0:.1f}%", f"{e['calls'] / s:.1f}",
                f"{1000 * e['ms'] / e['calls']:.1f}"]
        if e["flops"] > 0 and e["ms"] > 0:
            tf = e["flops"] / (e["ms"] * 1e9)
            want.append(f"{tf:.4g}")
            if pf > 0:
                want.append(f"{100 * tf * 1e3 / peak(e):.1f}%")
        elif e["bytes"] > 0 and e["ms"] > 0:
            gbs = e["bytes"] / (e["ms"] * 1e6)
            if pb > 0:
                want.append(f"{100 * gbs / pb:.1f}%")
            want.append(f"{gbs:.4g}")
        want.append(e["name"])
        if f != want:
            errs.append(f"{e['name']}: printed {f}, expected {want}")
    if len(rows) != len(E):
        errs.append(f"{len(rows)} rows for {len(E)} entries")
    if errs:
        print("; ".join(errs[:4]))
        sys.exit(1)
    print(f"{len(E)} rows and the summary lines as the JSON says"
          + (f", at the peaks {floor / s:.2f} of {ms / s:.2f} ms a step" if floor is not None else ""))


main()
