#!/usr/bin/env python3
"""Interleaved rounds of dpcap's DP step against PyTorch + Opacus, with a load check per round.

Called by scripts/bench-clip.sh (which builds dpctl and the torch venv); reads its settings from
the environment. Each round runs, back to back:
  1. ours at THREADS threads (`dpctl bench clip`: non-private and ClipEngine);
  2. theirs at THREADS threads (non-private, Opacus hooks, ghost), OpenMP's default wait policy;
  3. theirs non-private with OMP_WAIT_POLICY=PASSIVE (the control for threads that spin);
  4. ours and theirs at 1 thread (the control that no thread pool's behaviour can skew).

Why the load check is not the load average: the 1-minute load average lags by a minute and
counts our own benchmark, so it cannot tell a quiet round from a loaded one. Instead each round
reads the machine's busy CPU time from /proc/stat and subtracts the CPU time of the processes
it started (getrusage of children): what is left is what other processes took. A round in which
they averaged more than MAX_OTHER_CORES (default 0.2) cores is flagged and left out of the
medians (PyTorch's OpenMP threads spin at barriers: one busy core turned its 0.44 s step into
4.79 s). PASSIVE would shield PyTorch from such load, but it is not free on a quiet machine
(1.19x on this step, docs/benchmarks.md), so the headline is PyTorch at its default, faster
setting, and only quiet rounds count. Every round does the same work, so a round that took
more than MAX_SLOW_ROUND (default 1.2) times the median round's wall time was slowed by
something the load check cannot see (the host: its other guests, the clock, memory bandwidth;
seen 2026-12-06: rounds 1.3x longer, every program in them slower, 0.01 other cores) and is
left out too. Fewer than MIN_QUIET (default 5) rounds that are both is a failure, not a
result: exit 3. The load averages before and after each round are printed too, for the record.
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

DPCTL = "target/release/dpctl"
ROUNDS = int(os.environ.get("ROUNDS", "7"))
RUNS = int(os.environ.get("RUNS", "3"))
THREADS = int(os.environ.get("THREADS", "2"))
MAX_OTHER = float(os.environ.get("MAX_OTHER_CORES", "0.2"))
MIN_QUIET = int(os.environ.get("MIN_QUIET", "5"))
MAX_SLOW = float(os.environ.get("MAX_SLOW_ROUND", "1.2"))
CONTROL = os.environ.get("CONTROL", "1") != "0"
PYTHON, REFERENCE = sys.argv[1], sys.argv[2]
TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds():
    """CPU seconds the whole machine spent busy since boot (all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


def children_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def last_json(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours(threads):
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    cmd = [DPCTL, "bench", "clip", "--model", "bench", "--batch", "64", "--runs", str(RUNS), "--skip-naive", "--json"]
    return last_json(cmd, env)


def theirs(threads, passive=False, opacus=True):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cfg = json.dumps({"steps": RUNS, "threads": threads, "opacus": opacus})
    return last_json([PYTHON, REFERENCE, cfg], env)


def one_round(index):
    load_before = os.getloadavg()[0]
    busy0, mine0, wall0 = busy_seconds(), children_seconds(), time.monotonic()
    row = {"round": index, "ours": ours(THREADS), "theirs": theirs(THREADS)}
    row["theirs_passive"] = theirs(THREADS, passive=True, opacus=False)
    if CONTROL:
        row["ours_1t"], row["theirs_1t"] = ours(1), theirs(1)
    wall = time.monotonic() - wall0
    other = max(0.0, (busy_seconds() - busy0) - (children_seconds() - mine0)) / wall
    row.update(load_before=load_before, load_after=os.getloadavg()[0], other_cores=other, quiet=other <= MAX_OTHER)
    row["wall"] = wall
    flag = "quiet" if row["quiet"] else f"LOADED (other processes > {MAX_OTHER} cores): left out"
    print(f"round {index}: {wall:.0f} s, other processes {other:.2f} cores, load average "
          f"{load_before:.2f} -> {row['load_after']:.2f}: {flag}", file=sys.stderr, flush=True)
    return row


def mark_slow(rows):
    """Flags the rounds that took over MAX_SLOW times the median round (same work in each)."""
    typical = statistics.median(r["wall"] for r in rows)
    for r in rows:
        r["steady"] = r["wall"] <= MAX_SLOW * typical
        if not r["steady"]:
            print(f"round {r['round']}: {r['wall']:.0f} s, {r['wall'] / typical:.2f}x the median round "
                  f"({typical:.0f} s): SLOWED by something the load check cannot see: left out", file=sys.stderr)


def series(rows):
    s = {
        "dpcap non-private": [r["ours"]["nonprivate_s"] for r in rows],
        "dpcap ClipEngine": [r["ours"]["clip_s"] for r in rows],
        "torch non-private": [r["theirs"]["nonprivate_s"] for r in rows],
        "Opacus ghost": [r["theirs"]["opacus_ghost_s"] for r in rows],
        "Opacus hooks": [r["theirs"]["opacus_hooks_s"] for r in rows if isinstance(r["theirs"]["opacus_hooks_s"], float)],
        "torch non-private, PASSIVE": [r["theirs_passive"]["nonprivate_s"] for r in rows],
    }
    if CONTROL:
        s["dpcap non-private, 1 thread"] = [r["ours_1t"]["nonprivate_s"] for r in rows]
        s["dpcap ClipEngine, 1 thread"] = [r["ours_1t"]["clip_s"] for r in rows]
        s["torch non-private, 1 thread"] = [r["theirs_1t"]["nonprivate_s"] for r in rows]
        s["Opacus ghost, 1 thread"] = [r["theirs_1t"]["opacus_ghost_s"] for r in rows]
    return s


RATIOS = {
    "ClipEngine / dpcap non-private": ("dpcap ClipEngine", "dpcap non-private", 1.2),
    "ClipEngine / Opacus ghost": ("dpcap ClipEngine", "Opacus ghost", 1.0),
    "dpcap non-private / torch non-private": ("dpcap non-private", "torch non-private", 1.3),
    "torch PASSIVE / default wait": ("torch non-private, PASSIVE", "torch non-private", None),
    "1 thread: ClipEngine / Opacus ghost": ("dpcap ClipEngine, 1 thread", "Opacus ghost, 1 thread", None),
    "1 thread: dpcap / torch non-private": ("dpcap non-private, 1 thread", "torch non-private, 1 thread", None),
}


def report(rows):
    s = series(rows)
    med = {k: statistics.median(v) for k, v in s.items() if v}
    print(f"bench captioner, batch 64: {len(rows)} quiet, steady rounds of {ROUNDS}, each the median of {RUNS} steps; "
          f"{THREADS} threads unless marked; seconds per step")
    for k, v in s.items():
        if v:
            print(f"  {k:<34} median {med[k]:.3f}  spread {min(v):.3f}..{max(v):.3f}")
    out = {"rounds": ROUNDS, "quiet_rounds": len(rows), "runs": RUNS, "threads": THREADS, "medians_s": med,
           "ratios": {}, "targets_met": True}
    for name, (a, b, target) in RATIOS.items():
        if a not in med or b not in med:
            continue
        per_round = [x / y for x, y in zip(s[a], s[b])]
        ratio = med[a] / med[b]
        verdict = "" if target is None else (f"  target <= {target}: " + ("met" if ratio <= target else "NOT met"))
        if target is not None and ratio > target:
            out["targets_met"] = False
        out["ratios"][name] = {"of_medians": ratio, "per_round_min": min(per_round), "per_round_max": max(per_round)}
        print(f"  {name:<38} {ratio:.2f}x  (per round {min(per_round):.2f}..{max(per_round):.2f}){verdict}")
    print(json.dumps(out))


def main():
    ours(THREADS)
    theirs(THREADS)
    rows = [one_round(i + 1) for i in range(ROUNDS)]
    mark_slow(rows)
    quiet = [r for r in rows if r["quiet"] and r["steady"]]
    if len(quiet) < MIN_QUIET:
        print(f"only {len(quiet)} of {ROUNDS} rounds were quiet (other processes at most {MAX_OTHER} cores) and "
              f"steady (at most {MAX_SLOW}x the median round; need {MIN_QUIET}): no result. Stop the other load, "
              f"or raise ROUNDS.", file=sys.stderr)
        sys.exit(3)
    report(quiet)


main()
