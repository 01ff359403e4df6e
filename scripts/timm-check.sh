#!/usr/bin/env bash
# Checks `dpctl export --format timm` against timm itself: exports a checkpoint's encoder as a
# timm VisionTransformer state dict with check vectors (seeded images, our encoder's tokens and
# features), then `reference/timm_check.py` loads it with strict=True into the timm model built
# from the recorded arguments and compares within 1e-4.
#
#   scripts/timm-check.sh                  # a short demo's DP checkpoint (about 1 min)
#   scripts/timm-check.sh CHECKPOINT_ROOT  # any job's checkpoint root (`dpctl get JOB`)
#
# Needs torch, timm and safetensors from PyPI in target/torch-venv (made here if missing;
# about 5.5 GB with the default CUDA wheel). Prints the comparison as JSON, exit 1 on a mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/torch-venv
out=target/timm-check
mkdir -p "$out"
if ! "$venv/bin/python" -c "import torch, timm, safetensors" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch timm safetensors numpy
fi
cargo build -q --release -p dpctl
root=${1:-}
if [ -z "$root" ]; then
  rm -rf "$out/demo"
  target/release/dpctl demo --dir "$out/demo" --no-baseline --examples 2000 --steps 5 --batch-size 200 \
    > "$out/demo.json" 2> "$out/demo.log"
  root=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$out/demo.json")
fi
target/release/dpctl export "$root" --format timm --out "$out/encoder-timm.safetensors" \
  --check-vectors "$out/check.safetensors"
"$venv/bin/python" reference/timm_check.py "$out/encoder-timm.safetensors" "$out/check.safetensors" \
  --keys-out "$out/timm-keys.json"
