"""ncu_table.py — where one training step's GPU time goes, from Nsight
Compute's CSV of gpu__time_duration.sum per launch (what
`BENCH_PROFILE=1 make bench-gpu` writes):

  ncu_table.py NCU.csv [--top N]

One step is the launches after the first AdamW update up to and including
the second (step 2 of a 2-step run: no warm-up, no start-up); with fewer than
two updates in the file, every launch. Prints the step's kernel time, the
share of GEMMs (cuBLASLt / CUTLASS), attention (the causal softmax kernels
and the fused flash ones; cuDNN's attention kernels apart), cross-entropy and
the rest, then the kernels by
time (name, grid, block), largest first.
"""
import argparse
import collections
import csv
import sys


def category(name):
    name = name[5:] if name.startswith("void ") else name
    if "sdpa" in name or "fmha" in name or "flash_fprop" in name or "flash_bprop" in name:
        return "attention (cuDNN)"
    if "gemm" in name or "cutlass" in name or "splitKreduce" in name or "cublasLt::" in name:
        return "GEMM (cuBLASLt)"
    if name.startswith(("causal_", "flash_")):
        return "attention (softmax / fused)"
    if name.startswith("ce_"):
        return "cross-entropy"
    if name.startswith("adamw"):
        return "AdamW"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    launches = []
    with open(a.csv) as f:
        for r in csv.DictReader(line for line in f if line.startswith('"')):
            if r.get("Metric Name") != "gpu__time_duration.sum":
                continue
            unit = r.get("Metric Unit", "nsecond")
            scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(unit)
            if scale is None:
                sys.exit(f"ncu_table: {a.csv}: unit {unit!r} of gpu__time_duration.sum: expected ns, us or ms")
            launches.append((r["Kernel Name"], r["Grid Size"], r["Block Size"],
                             float(r["Metric Value"].replace(",", "")) * scale))
    if not launches:
        sys.exit(f"ncu_table: {a.csv}: no gpu__time_duration.sum rows (expected ncu --csv --metrics gpu__time_duration.sum output)")
    # ends of the runs of consecutive AdamW launches: the step boundaries
    ends = [i for i, l in enumerate(launches) if l[0].startswith("adamw")
            and (i + 1 == len(launches) or not launches[i + 1][0].startswith("adamw"))]
    if len(ends) >= 2:
        step, what = launches[ends[0] + 1:ends[1] + 1], "step 2 (after the first AdamW, to the second)"
    else:
        step, what = launches, "every launch (fewer than two AdamW updates in the file)"
    total = sum(l[3] for l in step)
    print(f"kernel time, {what}: {total:.2f} ms in {len(step)} launches")
    cat = collections.defaultdict(float)
    for l in step:
        cat[category(l[0])] += l[3]
    for c, v in sorted(cat.items(), key=lambda x: -x[1]):
        print(f"  {c:28s} {v:9.2f} ms {100 * v / total:5.1f}%")
    by = collections.defaultdict(lambda: [0.0, 0])
    for name, grid, block, ms in step:
        k = (name.split("(")[0][:60], grid, block)
        by[k][0] += ms
        by[k][1] += 1
    print(f"  {'ms':>9} {'share':>6} {'calls':>6} {'us/call':>9}  kernel, grid, block")
    for (name, grid, block), (ms, n) in sorted(by.items(), key=lambda x: -x[1][0])[:a.top]:
        print(f"  {ms:9.2f} {100 * ms / total:5.1f}% {n:6d} {1000 * ms / n:9.1f}  {name} {grid} {block}")


if __name__ == "__main__":
    main()
