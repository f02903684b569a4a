"""test_fp8.py — fp8.c (through tests/fp8_tool) against an independent
reference written here in numpy: the E4M3 and E5M2 grids enumerated from
the formats' definitions, the nearest grid value found by search with ties
to the even code, saturation to the largest finite value, and the recipes'
scale groups and fake quantization restated from docs/fp8.md. (Debian's
torch 1.13 has no float8 dtypes, so the reference is numpy's.)

Checks: all 256 codes decode and round-trip; ties between neighbours go to
the even code, one float32 ulp either side to the nearer; fp32 and FP8
subnormals; values past the top, infinities and NaN; random magnitudes over
2^-30..2^20; the groups of each recipe, operand and orientation; scales and
fake quantization of shapes that are and are not multiples of 128, an
all-zero tensor and block, a NaN or an infinity in one block only, and an
outlier in the last (partial) block that moves its scale and no other."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pycheck import check, finish  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tests", "fp8_tool")
FMTS = {"e4m3": dict(mbits=3, bias=7, max=448.0, inf=False),
        "e5m2": dict(mbits=2, bias=15, max=57344.0, inf=True)}
RECIPES = {"tensorwise": 0, "blockwise": 1, "rowwise": 2}
FLT_MAX = np.float32(np.finfo(np.float32).max)


def tool(args, data=b""):
    r = subprocess.run([TOOL] + [str(a) for a in args], input=data, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"fp8_tool {args}: exit {r.returncode}: {r.stderr.decode()}")
    return r.stdout


def ref_table(name):
    """Each code's value (float64), from the bit layout: S.E.M, bias,
    subnormals at E = 0; E4M3fn: S.1111.111 NaN, no infinity; E5M2:
    E all ones is infinity (M = 0) or NaN."""
    f = FMTS[name]
    mb, emax = f["mbits"], (0x7f >> f["mbits"])
    out = np.empty(256)
    for code in range(256):
        s = -1.0 if code & 0x80 else 1.0
        e, m = (code & 0x7f) >> mb, code & ((1 << mb) - 1)
        if name == "e4m3" and code & 0x7f == 0x7f:
            v = np.nan
        elif name == "e5m2" and e == emax:
            v = s * np.inf if m == 0 else np.nan
        elif e == 0:
            v = s * m * 2.0 ** (1 - f["bias"] - mb)
        else:
            v = s * (1 + m / 2 ** mb) * 2.0 ** (e - f["bias"])
        out[code] = v
    return out


def ref_encode(x, name):
    """float32 array -> codes: nearest finite grid value, ties to the even
    code, |x| clamped to the top first (satfinite), NaN -> 0x7f | sign."""
    f, tab = FMTS[name], ref_table(name)
    pos = [(tab[c], c) for c in range(128) if np.isfinite(tab[c]) and tab[c] <= f["max"]]
    pos.sort()
    grid = np.array([v for v, _ in pos])
    codes = np.array([c for _, c in pos], dtype=np.int64)
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x.astype(np.float64)), f["max"])
    a = np.where(np.isnan(a), 0.0, a)
    hi = np.clip(np.searchsorted(grid, a, "left"), 0, len(grid) - 1)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - grid[lo], grid[hi] - a
    take_hi = (dhi < dlo) | ((dhi == dlo) & (codes[hi] % 2 == 0))
    take_hi |= grid[hi] == a
    c = np.where(take_hi, codes[hi], codes[lo])
    c = c | np.where(np.signbit(x), 0x80, 0)
    c = np.where(np.isnan(x), 0x7f | np.where(np.signbit(x), 0x80, 0), c)
    return c.astype(np.uint8)


def ref_groups(recipe, weight, kdim, rows, cols):
    if recipe == "tensorwise":
        g = (rows, cols)
    elif recipe == "rowwise":  # one scale per index of the non-contracted dimension
        g = (1, cols) if kdim == 1 else (rows, 1)
    elif weight:
        g = (128, 128)
    else:  # 1 x 128 along the contraction dimension
        g = (1, 128) if kdim == 1 else (128, 1)
    return min(g[0], rows), min(g[1], cols)


def ref_quant(x, name, gr, gc):
    f, tab = FMTS[name], ref_table(name)
    rows, cols = x.shape
    nrt, nct = -(-rows // gr), -(-cols // gc)
    scales = np.empty((nrt, nct), np.float32)
    out = np.empty_like(x)
    for i in range(nrt):
        for j in range(nct):
            blk = x[i * gr:(i + 1) * gr, j * gc:(j + 1) * gc]
            amax = np.float32(np.abs(blk).max()) if not np.isnan(blk).any() else np.float32(np.nan)
            if not np.isfinite(amax) or amax == 0:
                s = np.float32(1)
            else:
                with np.errstate(over="ignore"):
                    s = np.float32(f["max"]) / amax
                if not np.isfinite(s):
                    s = FLT_MAX
            scales[i, j] = s
            with np.errstate(over="ignore", invalid="ignore"):
                q = tab[ref_encode((blk * s).astype(np.float32), name)].astype(np.float32)
                out[i * gr:(i + 1) * gr, j * gc:(j + 1) * gc] = q * (np.float32(1) / s)
    return scales.ravel(), out


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def c_quant(x, name, gr, gc):
    rows, cols = x.shape
    out = tool(["quant", name, rows, cols, gr, gc], x.astype(np.float32).tobytes())
    ng = -(-rows // gr) * -(-cols // gc)
    arr = np.frombuffer(out, np.float32)
    return arr[:ng], arr[ng:].reshape(rows, cols)


def formats():
    rng = np.random.default_rng(59)
    for name, f in FMTS.items():
        tab = ref_table(name)
        dec = np.frombuffer(tool(["decode", name]), np.float32)
        check(same_bits(dec, tab.astype(np.float32)), f"{name}: the 256 codes decode to the format's values")
        check(np.nanmax(np.where(np.isinf(tab), np.nan, tab)) == f["max"], f"{name}: the largest finite value is {f['max']:g}")
        finite = [c for c in range(256) if np.isfinite(tab[c])]
        vals = tab[finite].astype(np.float32)
        enc = np.frombuffer(tool(["encode", name], vals.tobytes()), np.uint8)
        check(np.array_equal(enc, np.array(finite, np.uint8)),
              f"{name}: every finite code ({len(finite)}) round-trips (0x00 and 0x80 keep the sign of zero)")
        pos = np.sort(np.unique(tab[(tab >= 0) & np.isfinite(tab)]))
        mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)
        assert np.array_equal(mids.astype(np.float64), (pos[:-1] + pos[1:]) / 2)  # exact in float32
        ties = np.concatenate([mids, -mids])
        enc = np.frombuffer(tool(["encode", name], ties.tobytes()), np.uint8)
        ref = ref_encode(ties, name)
        check(np.array_equal(enc, ref) and np.all(ref % 2 == 0),
              f"{name}: {len(ties)} exact midpoints between neighbours go to the even code")
        near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))])
        enc = np.frombuffer(tool(["encode", name], near.tobytes()), np.uint8)
        check(np.array_equal(enc, ref_encode(near, name)), f"{name}: one float32 ulp off each midpoint goes to the nearer value")
        sub = pos[pos < 2.0 ** (1 - f["bias"])]
        subs = np.concatenate([sub, sub * 0.75, sub * 1.25, [1e-45, 1e-40, 2.0 ** -126]]).astype(np.float32)
        enc = np.frombuffer(tool(["encode", name], subs.tobytes()), np.uint8)
        check(np.array_equal(enc, ref_encode(subs, name)), f"{name}: FP8 subnormals and fp32 subnormals round as the reference")
        top = f["max"]
        big = np.array([top, np.nextafter(np.float32(top), np.float32(np.inf)), top * 1.03, top * 1.0625, top * 2, 1e30, FLT_MAX,
                        np.inf, -np.inf, -top * 1.5], np.float32)
        enc = np.frombuffer(tool(["encode", name], big.tobytes()), np.uint8)
        maxc = int(np.where(tab == top)[0][0])
        check(np.array_equal(enc, np.array([maxc] * 8 + [maxc | 0x80] * 2, np.uint8)),
              f"{name}: values past {top:g} and infinities saturate to the largest finite code 0x{maxc:02x} (sign kept)")
        nans = np.array([np.nan, -np.nan], np.float32)
        nans[1] = -np.abs(nans[1])
        enc = np.frombuffer(tool(["encode", name], nans.tobytes()), np.uint8)
        check(list(enc) == [0x7f, 0xff] and np.isnan(tab[0x7f]) and np.isnan(tab[0xff]), f"{name}: NaN stays NaN (0x7f, 0xff)")
        mags = np.exp2(rng.uniform(-30, 20, 200000)) * rng.choice([-1.0, 1.0], 200000)
        x = mags.astype(np.float32)
        enc = np.frombuffer(tool(["encode", name], x.tobytes()), np.uint8)
        check(np.array_equal(enc, ref_encode(x, name)), f"{name}: 200000 random magnitudes 2^-30..2^20 encode as the reference")


def scaling():
    rng = np.random.default_rng(60)
    shapes = [(1, 1), (3, 5), (128, 128), (130, 257), (257, 130), (64, 384)]
    ok_groups = True
    for recipe, rv in RECIPES.items():
        for weight in (0, 1):
            for kdim in (0, 1):
                for rows, cols in shapes:
                    got = tuple(int(v) for v in tool(["groups", rv, weight, kdim, rows, cols]).split())
                    ok_groups &= got == ref_groups(recipe, weight, kdim, rows, cols)
    check(ok_groups, "the groups of every recipe, operand and contraction dimension, shapes on and off the 128 grid")
    for name in FMTS:
        bad = []
        for recipe in RECIPES:
            for weight in (0, 1):
                for kdim in (0, 1):
                    for rows, cols in shapes:
                        x = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-12, 12, (rows, 1)))).astype(np.float32)
                        gr, gc = ref_groups(recipe, weight, kdim, rows, cols)
                        s, y = c_quant(x, name, gr, gc)
                        rs, ry = ref_quant(x, name, gr, gc)
                        if not (same_bits(s, rs) and same_bits(y, ry)):
                            bad.append((recipe, weight, kdim, rows, cols))
        check(not bad, f"{name}: scales and fake quantization bit for bit, every recipe and shape{': ' + str(bad[:3]) if bad else ''}")
        z = np.zeros((130, 257), np.float32)
        s, y = c_quant(z, name, 1, 128)
        check(np.all(s == 1) and np.all(y == 0) and not np.signbit(y).any(), f"{name}: an all-zero tensor takes scale 1 in every block and stays 0")
        s, y = c_quant(z, name, 130, 257)
        check(list(s) == [1.0] and np.all(y == 0), f"{name}: tensorwise, an all-zero tensor takes scale 1")
        x = rng.standard_normal((130, 257)).astype(np.float32)
        x[:, 128:256] = 0
        x[0:128, 256] = 0
        s, y = c_quant(x, name, 128, 128)
        rs, ry = ref_quant(x, name, 128, 128)
        check(same_bits(s, rs) and s[1] == 1 and s[2] == 1 and s[4] == 1 and s[5] != 1 and same_bits(y, ry),
              f"{name}: 128x128 blocks over 130x257: the zero blocks take 1, the partial corner block its own amax")
        x = rng.standard_normal((130, 257)).astype(np.float32)
        s0, _ = c_quant(x, name, 128, 128)
        x2 = x.copy()
        x2[129, 256] = 1e4
        s2, y2 = c_quant(x2, name, 128, 128)
        check(np.array_equal(s0[:5], s2[:5]) and s2[5] != s0[5] and s2[5] == np.float32(FMTS[name]["max"]) / np.float32(1e4),
              f"{name}: an outlier at [129, 256] moves only the last partial block's scale")
        s1, y1 = c_quant(x2, name, 1, 128)
        rs1, ry1 = ref_quant(x2, name, 1, 128)
        check(same_bits(s1, rs1) and same_bits(y1, ry1) and len(s1) == 130 * 3,
              f"{name}: 1x128 blocks over 130x257: 3 a row, the last 1 wide")
        x3 = x.copy()
        x3[5, 3] = np.nan
        x3[140 - 130, 200] = np.inf
        s3, y3 = c_quant(x3, name, 1, 128)
        rs3, ry3 = ref_quant(x3, name, 1, 128)
        nanrow_ok = s3[5 * 3] == 1 and np.isnan(y3[5, 3]) and np.isfinite(np.delete(y3[5], 3)).all()
        infrow_ok = s3[10 * 3 + 1] == 1 and y3[10, 200] == FMTS[name]["max"]
        check(same_bits(s3, rs3) and same_bits(y3, ry3) and nanrow_ok and infrow_ok and np.isfinite(y3[11:]).all(),
              f"{name}: a NaN or an infinity takes its block's scale to 1 (NaN stays, infinity saturates) and no other block's")
        tiny = np.full((2, 3), 1e-42, np.float32)
        s4, y4 = c_quant(tiny, name, 2, 3)
        check(s4[0] == FLT_MAX and same_bits(y4, ref_quant(tiny, name, 2, 3)[1]),
              f"{name}: a subnormal amax whose scale overflows takes FLT_MAX")


formats()
scaling()
finish()
