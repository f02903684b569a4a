#!/usr/bin/env python3
"""A profiled fp8 run's profile.json against the same run's without fp8.

usage: check_profile_fp8.py PLAIN_JSON FP8_JSON TIMES

The layers' linears run between fp8_scope on and off, so under fp8 their
products are timed in twin entries (name + "_fp8", "fp8": true): for every
entry the plain run's calls and FLOPs must equal the fp8 run's entry plus
its twin's; the twins must hold the layers' linears (2 products forward a
layer at least: QKV and the MLP's up projection, and a projection back to
the residual), the LM head's products stay in the plain entries, nothing
but products has a twin, and peak_fp8_gflops is TIMES x peak_gflops. Prints
a one-line summary, or what differs and exits 1.
"""
import json
import sys


def main():
    plain, fp8 = (json.load(open(p)) for p in sys.argv[1:3])
    times = float(sys.argv[3])
    a = {e["name"]: e for e in plain["entries"]}
    b = {e["name"]: e for e in fp8["entries"]}
    errs = []
    twins = sorted(n for n in b if n.endswith("_fp8"))
    for n, e in b.items():
        if e["fp8"] != n.endswith("_fp8"):
            errs.append(f"{n}: fp8 flag {e['fp8']}")
        if n.endswith("_fp8") and not n.startswith("matmul_"):
            errs.append(f"{n}: a twin of something that is not a product")
    for n in sorted(set(a) | {t[:-4] for t in twins}):
        calls = b.get(n, {}).get("calls", 0) + b.get(n + "_fp8", {}).get("calls", 0)
        flops = b.get(n, {}).get("flops", 0) + b.get(n + "_fp8", {}).get("flops", 0)
        want = a.get(n, {"calls": 0, "flops": 0})
        if calls != want["calls"] or abs(flops - want["flops"]) > 1e-9 * max(1.0, want["flops"]):
            errs.append(f"{n}: {calls} calls {flops:.6g} FLOPs under fp8 (with the twin), {want['calls']} {want['flops']:.6g} without")
    for n in ("matmul_forward_res_fp8", "matmul_forward_a_fp8", "matmul_backward_a_fp8", "matmul_backward_dinp_a_fp8"):
        if n not in b:
            errs.append(f"no {n} entry")
    if "matmul_forward_res" in b:
        errs.append("matmul_forward_res (only the layers' projections call it) outside fp8")
    if "matmul_forward_a" not in b or "matmul_backward_a" not in b:
        errs.append("the LM head's products are not in the plain entries")
    if abs(fp8["peak_fp8_gflops"] - times * fp8["peak_gflops"]) > 1e-9 * fp8["peak_gflops"]:
        errs.append(f"peak_fp8_gflops {fp8['peak_fp8_gflops']} is not {times} x peak_gflops {fp8['peak_gflops']}")
    if errs:
        print("; ".join(errs[:4]))
        sys.exit(1)
    n8 = sum(b[t]["calls"] for t in twins)
    print(f"{len(twins)} FP8 entries with {n8} calls, each the plain run's calls and FLOPs less the bf16 ones; "
          f"FP8 peak {fp8['peak_fp8_gflops'] / 1e3:.4g} TFLOP/s = {times:g} x {fp8['peak_gflops'] / 1e3:.4g}")


main()
