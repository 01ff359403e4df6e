#!/usr/bin/env bash
# One DP-SGD step of the `bench` captioner (batch 64, THREADS=2 threads) with dpcap and with
# PyTorch + Opacus, interleaved: ROUNDS rounds (default 7) of one dpcap process (`dpctl bench
# clip`: non-private and ClipEngine, the median of RUNS timed steps after a warm-up) then one
# reference process (reference/opacus_ref.py: non-private, Opacus hooks, Opacus ghost), a
# control of PyTorch with its OpenMP threads told not to spin (OMP_WAIT_POLICY=PASSIVE), and a
# 1-thread control of both sides (CONTROL=0 skips it). Each round
# measures the CPU that other processes took while it ran; a round where they held more than
# MAX_OTHER_CORES (0.2) is flagged and left out, and fewer than MIN_QUIET (5) quiet rounds exits
# 3 with no result. Prints medians over the quiet rounds with spreads, the ratios of medians
# against the issue's targets, and the same as JSON on the last line (docs/benchmarks.md keeps
# the runs). The driver is scripts/bench_clip_rounds.py.
# Installs torch and opacus (from PyPI) into target/bench-torch-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
reference=${OPACUS_REF:-reference/opacus_ref.py}
venv=target/bench-torch-venv
[ -f "$reference" ] || { echo "reference script $reference not found (set OPACUS_REF)" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, opacus' 2> /dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch opacus
fi
cargo build -q --release -p dpctl
exec python3 scripts/bench_clip_rounds.py "$venv/bin/python" "$reference"
