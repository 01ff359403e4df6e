#!/usr/bin/env bash
# Side by side, in one run: one DP-SGD step of the `bench` captioner (batch 64) with dpcap
# (`dpctl bench clip`: non-private, naive per-example, ClipEngine) and with PyTorch + Opacus
# (the project's shared reference script: non-private, Opacus hooks, Opacus ghost clipping).
# Installs torch and opacus into target/bench-torch-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
reference=${OPACUS_REF:-../shared/bench/opacus_ref.py}
venv=target/bench-torch-venv
[ -f "$reference" ] || { echo "reference script $reference not found (set OPACUS_REF)" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch opacus
fi
cargo build -q --release -p dpctl
ours=$(target/release/dpctl bench clip --model bench --batch 64 --runs "${RUNS:-3}" --json)
theirs=$("$venv/bin/python" "$reference" 2>/dev/null | tail -1)
python3 - "$ours" "$theirs" <<'PY'
import json, sys
o, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"bench captioner, batch 64, 2 threads; seconds per step (medians)")
print(f"  dpcap  non-private {o['nonprivate_s']:.3f}  naive {o['naive_s']:.3f}  ClipEngine {o['clip_s']:.3f}  (ClipEngine / non-private {o['ratio']:.2f}x)")
print(f"  torch  non-private {t['nonprivate_s']:.3f}  Opacus hooks {t['opacus_hooks_s']:.3f}  Opacus ghost {t['opacus_ghost_s']:.3f}")
print(f"  ClipEngine / Opacus ghost: {o['clip_s'] / t['opacus_ghost_s']:.2f}x   dpcap non-private / torch non-private: {o['nonprivate_s'] / t['nonprivate_s']:.2f}x")
PY
