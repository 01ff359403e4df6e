#!/usr/bin/env bash
# Repeats the real-process suites (the e2e and fault-injection test binaries) RUNS times
# (default 20) and reports every test's median and slowest time. The component logs of any run
# slower than 3x its test's median, or failed, are kept under target/loop-e2e/ (all others are
# removed). Exits 1 on a failure or a slow run. Per-test times come from libtest's JSON events
# (`--report-time`, unstable on stable Rust: RUSTC_BOOTSTRAP=1 enables it for the test binary
# only), so nothing needs installing; the suites are built once, as the README's command builds.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
suites=${LOOP_SUITES:-e2e faults}
out=$PWD/target/loop-e2e
rm -rf "$out" && mkdir -p "$out"
export CARGO_INCREMENTAL=0
cargo test --workspace --no-run --message-format json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["kind"] == ["test"] and m.get("executable"):
        print(m["target"]["name"], m["executable"])' > "$out/binaries.txt"
# Set-up, not measured: the S3 tests install their pinned server into target/s3-venv on first
# use (a pip install from PyPI), which would otherwise count as run 1's slowness.
e2e=$(awk '$1 == "e2e" {print $2}' "$out/binaries.txt")
(cd tests && TMPDIR="$out" "$e2e" s3:: > "$out/warm-up.log" 2>&1) || echo "warm-up failed: see $out/warm-up.log"
for i in $(seq 1 "$runs"); do
  mkdir -p "$out/run-$i"
  started=$(date +%s)
  for suite in $suites; do
    exe=$(awk -v s="$suite" '$1 == s {print $2}' "$out/binaries.txt")
    (cd tests && TMPDIR="$out/run-$i" DPCAP_E2E_KEEP_DIRS=1 RUSTC_BOOTSTRAP=1 "$exe" \
      -Z unstable-options --format json --report-time > "$out/run-$i/$suite.json" 2> "$out/run-$i/$suite.err") || true
  done
  echo "run $i: $(( $(date +%s) - started )) s"
done
python3 - "$out" "$runs" <<'PY'
import glob, json, os, re, shutil, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
times, failed = {}, []
for i in range(1, runs + 1):
    for path in glob.glob(f"{out}/run-{i}/*.json"):
        for line in open(path):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("type") != "test" or e.get("event") not in ("ok", "failed"):
                continue
            times.setdefault(e["name"], []).append((i, float(e.get("exec_time", 0.0))))
            if e["event"] == "failed":
                failed.append((i, e["name"]))
slow = []
print(f"{'test':<100} {'runs':>4} {'median s':>9} {'max s':>7} {'max/median':>10}")
for name, runs_times in sorted(times.items()):
    values = [t for _, t in runs_times]
    median = statistics.median(values)
    worst = max(values)
    print(f"{name:<100} {len(values):>4} {median:>9.1f} {worst:>7.1f} {worst / max(median, 1e-9):>10.2f}")
    slow += [(i, name, t, median) for i, t in runs_times if t > 3 * median and t > 1.0]
keep = {i for i, *_ in slow} | {i for i, _ in failed}
for path in glob.glob(f"{out}/run-*/dpcap-e2e-*"):
    if int(re.search(r"run-(\d+)", path).group(1)) not in keep:
        shutil.rmtree(path, ignore_errors=True)
for i, name, t, median in slow:
    print(f"SLOW run {i}: {name} took {t:.1f} s (median {median:.1f} s); logs in {out}/run-{i}/")
for i, name in failed:
    print(f"FAILED run {i}: {name}; logs in {out}/run-{i}/")
print(f"{runs} runs, {len(times)} tests, {len(failed)} failures, {len(slow)} runs slower than 3x their median")
sys.exit(1 if failed or slow else 0)
PY
