#!/usr/bin/env python3
"""tests/cuda_emu/cu2cpp.py IN.cu OUT.cpp — kernels.cu as plain C++ for the
host emulation of CUDA (tests/cuda_emu/emu.h). Two rewrites, nothing else:

  kernel<<<grid, block[, smem[, stream]]>>>(args);
      -> ::emu::Launch(grid, block[, ...]).run("kernel", kernel, args);
  extern __shared__ [__align__(n)] T name[];
      -> T *name = (T *)::emu::dyn_smem();

kernels.cu's parts (#include "kernels/NAME.cuh") are read into the output
in their place; #line directives keep compiler messages pointing at the
file and line each piece came from. Fails (exit 1, one line) on a launch
it cannot parse."""
import os
import re
import sys

PART = re.compile(r'^#include "(kernels/\w+\.cuh)"\s*$')


def expand(path):
    """the source of path with each part it includes put in its place"""
    out = []
    for n, line in enumerate(open(path).read().split("\n"), 1):
        m = PART.match(line)
        if not m:
            out.append(line)
            continue
        part = os.path.join(os.path.dirname(path), m.group(1))
        out.append(f'#line 1 "{part}"')
        out.append(open(part).read().rstrip("\n"))
        out.append(f'#line {n + 1} "{path}"')
    return "\n".join(out)


def match(s, i, open_c, close_c, step):
    """index of the bracket matching the one at s[i], scanning by step
    (+1 from an open_c, -1 from a close_c); -1 when unbalanced"""
    depth = 0
    while 0 <= i < len(s):
        if s[i] == open_c:
            depth += step
        elif s[i] == close_c:
            depth -= step
        if depth == 0:
            return i
        i += step
    return -1


def fail(src, pos, why):
    """one line naming the file and line of src[pos], by the last #line
    directive before it (the parts expand() read in)"""
    path, line = sys.argv[1], src.count("\n", 0, pos) + 1
    for m in re.finditer(r'^#line (\d+) "([^"]+)"$', src[:pos], re.M):
        path, line = m.group(2), int(m.group(1)) + src.count("\n", m.end() + 1, pos)
    sys.stderr.write(f"cu2cpp: {path}:{line}: {why}\n")
    sys.exit(1)


def rewrite_launches(src):
    out = []
    pos = 0
    while True:
        i = src.find("<<<", pos)
        if i < 0:
            out.append(src[pos:])
            return "".join(out)
        # the kernel expression: an identifier, optionally with <template args>
        j = i - 1
        while j >= 0 and src[j].isspace():
            j -= 1
        if src[j] == ">":
            j = match(src, j, "<", ">", -1) - 1
            if j < 0:
                fail(src, i, "unbalanced template arguments before <<<")
        k = j
        while k >= 0 and (src[k].isalnum() or src[k] in "_:"):
            k -= 1
        start = k + 1
        kernel = src[start:i].strip()
        if not re.match(r"^[A-Za-z_][\w:]*(\s*<.*>)?$", kernel, re.S):
            fail(src, i, f"cannot parse the kernel before <<<: {kernel!r}")
        e = src.find(">>>", i)
        if e < 0:
            fail(src, i, "<<< without >>>")
        cfg = src[i + 3:e]
        a = e + 3
        while src[a].isspace():
            a += 1
        if src[a] != "(":
            fail(src, i, "no argument list after >>>")
        close = match(src, a, "(", ")", 1)
        if close < 0:
            fail(src, i, "unbalanced argument list")
        args = src[a + 1:close].strip()
        name = re.sub(r"\s+", " ", kernel)
        call = f'::emu::Launch({cfg}).run("{name}", {kernel}' + (f", {args})" if args else ")")
        # keep the line count: the launch's newlines go after it
        call += "\n" * (src.count("\n", start, close + 1) - call.count("\n"))
        out.append(src[pos:start])
        out.append(call)
        pos = close + 1


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: cu2cpp.py IN.cu OUT.cpp\n")
        sys.exit(2)
    src = expand(sys.argv[1])
    src = re.sub(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?(\w+)\s+(\w+)\s*\[\s*\]\s*;",
                 r"\1 *\2 = (\1 *)::emu::dyn_smem();", src)
    if "extern __shared__" in src:
        fail(src, src.find("extern __shared__"), "an extern __shared__ declaration it cannot parse")
    src = rewrite_launches(src)
    with open(sys.argv[2], "w") as f:
        f.write(f'#line 1 "{sys.argv[1]}"\n' + src)


main()
