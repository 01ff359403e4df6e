#!/usr/bin/env bash
# Repeats the real-process suites (the e2e and fault-injection test binaries) RUNS times
# (default 20) under cargo-nextest, each test in its own process, and reports every test's
# median and slowest time. The component logs of any run slower than 3x its test's median are
# kept under target/loop-e2e/ (all others are removed). Exits 1 on a failure or a slow run.
# Needs cargo-nextest (`cargo install cargo-nextest --locked`); the suites are built once.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
filter=${LOOP_FILTER:-'binary(e2e) | binary(faults)'}
out=target/loop-e2e
rm -rf "$out" && mkdir -p "$out"
cargo nextest run --workspace --no-run
for i in $(seq 1 "$runs"); do
  mkdir -p "$out/run-$i"
  started=$(date +%s)
  TMPDIR="$PWD/$out/run-$i" DPCAP_E2E_KEEP_DIRS=1 cargo nextest run --workspace --profile loop \
    -E "$filter" > "$out/run-$i/nextest.log" 2>&1 || true
  cp target/nextest/loop/junit.xml "$out/run-$i.xml"
  echo "run $i: $(( $(date +%s) - started )) s"
done
python3 - "$out" "$runs" <<'PY'
import glob, os, re, shutil, statistics, sys
import xml.etree.ElementTree as ET
out, runs = sys.argv[1], int(sys.argv[2])
times, failed = {}, []
for i in range(1, runs + 1):
    for case in ET.parse(f"{out}/run-{i}.xml").getroot().iter("testcase"):
        name = case.get("name")
        times.setdefault(name, []).append((i, float(case.get("time"))))
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append((i, name))
slow = []
print(f"{'test':<100} {'runs':>4} {'median s':>9} {'max s':>7} {'max/median':>10}")
for name, runs_times in sorted(times.items()):
    values = [t for _, t in runs_times]
    median = statistics.median(values)
    worst = max(values)
    print(f"{name:<100} {len(values):>4} {median:>9.1f} {worst:>7.1f} {worst / median:>10.2f}")
    slow += [(i, name, t, median) for i, t in runs_times if t > 3 * median]
keep = {(i, name.rsplit("::", 1)[-1]) for i, name, _, _ in slow} | {(i, n.rsplit("::", 1)[-1]) for i, n in failed}
for path in glob.glob(f"{out}/run-*/dpcap-e2e-*"):
    run = int(re.search(r"run-(\d+)", path).group(1))
    if not any(r == run for r, _ in keep):
        shutil.rmtree(path, ignore_errors=True)
for i, name, t, median in slow:
    print(f"SLOW run {i}: {name} took {t:.1f} s (median {median:.1f} s); logs in {out}/run-{i}/")
for i, name in failed:
    print(f"FAILED run {i}: {name}; logs in {out}/run-{i}/")
print(f"{runs} runs, {len(times)} tests, {len(failed)} failures, {len(slow)} runs slower than 3x their median")
sys.exit(1 if failed or slow else 0)
PY
