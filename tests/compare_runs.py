"""compare_runs.py — compare two llmtrain runs: the per-step loss, grad
norm, parameter norm and val loss in their metrics.jsonl and (when both have one) the exported weights in
RUN/hf/model.safetensors. Exit 0 when they agree within tolerance.

  compare_runs.py RUN_A RUN_B [--steps N] [--upto S] [--loss-rtol R] [--norm-rtol R] [--weight-rtol R] [--exact]

--steps N: each run must have logged N steps; --upto S: the metrics of steps
1..S only (the weights are still compared). --loss-rtol bounds the relative
difference of every metric; --norm-rtol, where given, that of the gradient
norm instead (a gradient moves far more with the weights than the loss does:
the weights of two runs of other reduction orders part by ~1e-5 over a few
AdamW steps while their losses agree to 1e-7).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfio  # noqa: E402


def steps(run):
    out = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "step" in d and "loss" in d:
                out[d["step"]] = d
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--upto", type=int, default=0, help="compare the metrics of the steps up to this one only")
    ap.add_argument("--norm-rtol", type=float, default=None, help="for grad_norm (default: --loss-rtol)")
    ap.add_argument("--weight-rtol", type=float, default=1e-5)
    ap.add_argument("--exact", action="store_true", help="require bit-identical losses and weights")
    args = ap.parse_args()
    sa, sb = steps(args.a), steps(args.b)
    bad = 0
    if args.steps and (len(sa) != args.steps or len(sb) != args.steps):
        print(f"  step count: {len(sa)} vs {len(sb)}, expected {args.steps}")
        bad += 1
    for s in sorted(set(sa) & set(sb)):
        if args.upto and s > args.upto:
            continue
        for key in ("loss", "grad_norm", "param_norm", "val_loss"):
            if key not in sa[s] and key not in sb[s]:
                continue
            if key not in sa[s] or key not in sb[s]:
                print(f"  step {s} {key}: present in only one run")
                bad += 1
                continue
            x, y = sa[s][key], sb[s][key]
            err = abs(x - y) / max(abs(x), 1e-12)
            tol = args.norm_rtol if key == "grad_norm" and args.norm_rtol is not None else args.loss_rtol
            if (args.exact and x != y) or err > tol:
                print(f"  step {s} {key}: {x!r} vs {y!r} (rel {err:.2e})")
                bad += 1
    wa, wb = os.path.join(args.a, "hf", "model.safetensors"), os.path.join(args.b, "hf", "model.safetensors")
    if os.path.exists(wa) and os.path.exists(wb):
        ta, tb = hfio.read_safetensors(wa), hfio.read_safetensors(wb)
        if set(ta) != set(tb):
            print(f"  tensor names differ: {sorted(set(ta) ^ set(tb))}")
            bad += 1
        for name in sorted(set(ta) & set(tb)):
            x, y = np.asarray(ta[name], np.float64), np.asarray(tb[name], np.float64)
            err = np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-12)
            if (args.exact and not np.array_equal(x, y)) or err > args.weight_rtol:
                print(f"  weight {name}: rel err {err:.2e}")
                bad += 1
    elif os.path.exists(wa) != os.path.exists(wb):
        print("  only one run has exported weights")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
