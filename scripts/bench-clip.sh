#!/usr/bin/env bash
# One DP-SGD step of the `bench` captioner (batch 64, 2 threads) with dpcap and with PyTorch +
# Opacus, interleaved: ROUNDS rounds (default 7) of one dpcap process (`dpctl bench clip`:
# non-private and ClipEngine, the median of RUNS timed steps after a warm-up) then one
# reference process (reference/opacus_ref.py: non-private, Opacus hooks, Opacus ghost, the
# median of RUNS steps after a warm-up), after one discarded warm-up round of each. These
# machines are noisy: a single run decides nothing, so the script prints each method's median
# over the rounds with its spread (min..max), the ratios of those medians, and each ratio's
# spread over the rounds; the last line is the same as JSON (docs/benchmarks.md keeps the runs).
# Installs torch and opacus (from PyPI) into target/bench-torch-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
reference=${OPACUS_REF:-reference/opacus_ref.py}
venv=target/bench-torch-venv
rounds=${ROUNDS:-7}
runs=${RUNS:-3}
[ -f "$reference" ] || { echo "reference script $reference not found (set OPACUS_REF)" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, opacus' 2> /dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch opacus
fi
cargo build -q --release -p dpctl
ours() { target/release/dpctl bench clip --model bench --batch 64 --runs "$runs" --skip-naive --json; }
theirs() { "$venv/bin/python" "$reference" "{\"steps\": $runs}" 2> /dev/null | tail -1; }
ours > /dev/null
theirs > /dev/null
results=$(mktemp)
for round in $(seq "$rounds"); do
  echo "{\"round\": $round, \"ours\": $(ours), \"theirs\": $(theirs)}" >> "$results"
done
python3 - "$results" "$rounds" "$runs" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rounds, runs = sys.argv[2], sys.argv[3]
series = {
    "dpcap non-private": [r["ours"]["nonprivate_s"] for r in rows],
    "dpcap ClipEngine": [r["ours"]["clip_s"] for r in rows],
    "torch non-private": [r["theirs"]["nonprivate_s"] for r in rows],
    "Opacus ghost": [r["theirs"]["opacus_ghost_s"] for r in rows],
    "Opacus hooks": [r["theirs"]["opacus_hooks_s"] for r in rows if isinstance(r["theirs"]["opacus_hooks_s"], float)],
}
med = {k: statistics.median(v) for k, v in series.items() if v}
print(f"bench captioner, batch 64, 2 threads: {rounds} interleaved rounds, each the median of {runs} steps; seconds per step")
for k, v in series.items():
    if v:
        print(f"  {k:<18} median {med[k]:.3f}  spread {min(v):.3f}..{max(v):.3f}")
ratios = {
    "ClipEngine / dpcap non-private": ("dpcap ClipEngine", "dpcap non-private"),
    "ClipEngine / Opacus ghost": ("dpcap ClipEngine", "Opacus ghost"),
    "dpcap non-private / torch non-private": ("dpcap non-private", "torch non-private"),
}
out = {"rounds": int(rounds), "runs": int(runs), "medians_s": med, "ratios": {}}
for name, (a, b) in ratios.items():
    per_round = [x / y for x, y in zip(series[a], series[b])]
    ratio = med[a] / med[b]
    spread = (max(per_round) - min(per_round)) / statistics.median(per_round)
    out["ratios"][name] = {"of_medians": ratio, "per_round_min": min(per_round), "per_round_max": max(per_round)}
    print(f"  {name:<38} {ratio:.2f}x  (per round {min(per_round):.2f}..{max(per_round):.2f}, spread {spread:.0%})")
print(json.dumps(out))
PY
rm -f "$results"
