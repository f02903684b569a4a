#!/usr/bin/env python3
"""Check LLMTRAIN_COMM_TRACE files (tests/test_ddp.sh and tests/gpu_tests.sh).

    check_comm_trace.py NO_SHARD_PREFIX FULL_SHARD_PREFIX RANKS STEPS CHUNKS
    check_comm_trace.py --hybrid HYBRID_SHARD_PREFIX RANKS STEPS CHUNKS

NO_SHARD overlaps its gradient all-reduce with the backward: at every step,
on every rank, exactly CHUNKS non-blocking data-parallel all-reduces start
in phase `backward` (one a chunk, after that chunk's backward of the last
micro-batch), none elsewhere; chunk by chunk they cover what the FULL_SHARD
run reduce-scatters in its last micro-batch (the same chunks, in the same
order, RANKS times the elements: a shard is 1/RANKS of a chunk); each is
waited for once, in phase `allreduce`, after the step's last start.

HYBRID_SHARD (--hybrid) overlaps its all-reduce over the replicas with the
backward: at every step, on every rank, exactly CHUNKS non-blocking
replicate-group all-reduces, none over the data-parallel group; the i-th
covers the shard of the i-th reduce-scatter of the last micro-batch (the
same elements) and starts after that reduce-scatter's wait; the first
CHUNKS - 2 start in phase `backward` (each chunk's reduce-scatter is waited
for at the start of the backward two chunks below it), the last two (the
lowest chunks') in phase `reduce_scatter` after it; each is waited for
once, in phase `allreduce`, after the step's last start.

Every handle is waited for exactly once. Prints one line; exits 1 on a
mismatch."""
import re
import sys

LINE = re.compile(r"^step (\d+) phase (\S+) (?:start (\S+) (\S+) (\d+) h(-?\d+)|wait h(-?\d+))$")


def read(path):
    events = []
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"FAIL no trace {path}: {e.strerror}")
    with f:
        for n, line in enumerate(f, 1):
            m = LINE.match(line.rstrip("\n"))
            if not m:
                sys.exit(f"FAIL {path}:{n}: not a trace line: {line.rstrip()!r}")
            step, phase = int(m.group(1)), m.group(2)
            if m.group(3):
                events.append((step, phase, "start", m.group(3), m.group(4), int(m.group(5)), int(m.group(6))))
            else:
                events.append((step, phase, "wait", None, None, 0, int(m.group(7))))
    return events


def check_handles(path, events):
    """every handle started (>= 0) is waited for once before it is reused"""
    open_h = {}
    for i, e in enumerate(events):
        if e[2] == "start" and e[6] >= 0:
            if e[6] in open_h:
                sys.exit(f"FAIL {path}: handle h{e[6]} started again before its wait")
            open_h[e[6]] = i
        elif e[2] == "wait":
            if e[6] not in open_h:
                sys.exit(f"FAIL {path}: wait for h{e[6]}, which is not in flight")
            del open_h[e[6]]
    if open_h:
        sys.exit(f"FAIL {path}: handles never waited for: {sorted(open_h)}")


def next_wait(ev, idx, after):
    """index in idx of the first wait for the handle started at ev[after], None if none"""
    return next((i for i in idx if i > after and ev[i][2] == "wait" and ev[i][6] == ev[after][6]), None)


def check_hybrid(prefix, ranks, steps, chunks):
    total = 0
    for r in range(ranks):
        path = f"{prefix}.{r}"
        ev = read(path)
        check_handles(path, ev)
        for s in range(1, steps + 1):
            idx = [i for i, e in enumerate(ev) if e[0] == s]
            rs = [i for i in idx if ev[i][2] == "start" and ev[i][3] == "reduce_scatter"]
            ar = [i for i in idx if ev[i][2] == "start" and ev[i][3] == "allreduce"]
            if any(ev[i][4] != "replicate" for i in ar):
                sys.exit(f"FAIL {path}: step {s}: all-reduces over {sorted(set(ev[i][4] for i in ar))}, expected the replicate group only")
            if len(ar) != chunks or any(ev[i][6] < 0 for i in ar):
                sys.exit(f"FAIL {path}: step {s}: {len(ar)} replicate all-reduces with handles {[ev[i][6] for i in ar]}, "
                         f"expected {chunks} non-blocking ones (one a chunk)")
            if len(rs) < chunks or len(rs) % chunks:
                sys.exit(f"FAIL {path}: step {s}: {len(rs)} reduce-scatters, expected a whole number of micro-batches x {chunks}")
            last = rs[-chunks:]
            got, want = [ev[i][5] for i in ar], [ev[i][5] for i in last]
            if got != want:
                sys.exit(f"FAIL {path}: step {s}: replicate all-reduce sizes {got}, expected the last micro-batch's "
                         f"reduce-scatters {want}")
            for k, (a, b) in enumerate(zip(ar, last)):
                done = next_wait(ev, idx, b)
                if done is None or done > a:
                    sys.exit(f"FAIL {path}: step {s}: all-reduce {k} (h{ev[a][6]}) starts before its chunk's reduce-scatter "
                             f"(h{ev[b][6]}) is waited for")
            phases = [ev[i][1] for i in ar]
            want_ph = ["backward"] * (chunks - 2) + ["reduce_scatter"] * 2
            if phases != want_ph:
                sys.exit(f"FAIL {path}: step {s}: replicate all-reduces started in phases {phases}, expected {want_ph}")
            # each start's own wait: the handle's next wait (check_handles: exactly one before it is reused)
            waits = [next_wait(ev, idx, a) for a in ar]
            if None in waits or any(ev[i][1] != "allreduce" or i < ar[-1] for i in waits):
                sys.exit(f"FAIL {path}: step {s}: the waits for its all-reduces in phases "
                         f"{[ev[i][1] if i is not None else None for i in waits]}; expected {chunks}, in allreduce, after the last start")
            total += len(ar)
    print(f"HYBRID_SHARD: {total} replicate all-reduces over {ranks} ranks x {steps} steps, {chunks} a step, each after its "
          f"chunk's last reduce-scatter, {chunks - 2} a step started in the backward, all waited for after it")


def main():
    if sys.argv[1] == "--hybrid":
        check_hybrid(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    ddp, fsdp, ranks, steps, chunks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    total = 0
    for r in range(ranks):
        dpath, fpath = f"{ddp}.{r}", f"{fsdp}.{r}"
        dev, fev = read(dpath), read(fpath)
        check_handles(dpath, dev)
        check_handles(fpath, fev)
        for s in range(1, steps + 1):
            ar = [e for e in dev if e[0] == s and e[2] == "start" and e[3] == "allreduce" and e[4] == "dp"]
            if len(ar) != chunks or any(e[1] != "backward" for e in ar):
                sys.exit(f"FAIL {dpath}: step {s}: {len(ar)} data-parallel all-reduces in phases "
                         f"{sorted(set(e[1] for e in ar))}, expected {chunks} in backward")
            if any(e[6] < 0 for e in ar) and ranks > 1:
                sys.exit(f"FAIL {dpath}: step {s}: a blocking all-reduce (h-1) where a non-blocking one was expected")
            rs = [e for e in fev if e[0] == s and e[2] == "start" and e[3] == "reduce_scatter"]
            last = rs[-chunks:]
            want = [e[5] * ranks for e in last]
            got = [e[5] for e in ar]
            if len(rs) < chunks or got != want:
                sys.exit(f"FAIL {dpath}: step {s}: all-reduce sizes {got}, expected {want} "
                         f"({ranks} x the FULL_SHARD run's last {chunks} reduce-scatters)")
            handles = {e[6] for e in ar}
            idx = [i for i, e in enumerate(dev) if e[0] == s]
            last_start = max(i for i in idx if dev[i][2] == "start" and dev[i][3] == "allreduce")
            waits = [dev[i] for i in idx if dev[i][2] == "wait" and dev[i][6] in handles]
            early = [i for i in idx if dev[i][2] == "wait" and dev[i][6] in handles and i < last_start]
            if len(waits) != chunks or any(w[1] != "allreduce" for w in waits) or early:
                sys.exit(f"FAIL {dpath}: step {s}: {len(waits)} waits for its all-reduces in phases "
                         f"{sorted(set(w[1] for w in waits))}, {len(early)} before its last start; expected "
                         f"{chunks}, in allreduce, after it")
            total += len(ar)
    print(f"NO_SHARD: {total} gradient all-reduces over {ranks} ranks x {steps} steps, {chunks} a step, all started "
          f"in the backward and waited for after it, each {ranks} x its chunk's FULL_SHARD reduce-scatter")


main()
