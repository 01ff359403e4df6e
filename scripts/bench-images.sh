#!/usr/bin/env bash
# Side by side, in one run, on the same files: the worker's image pipeline (`dpctl bench images`)
# and Pillow + numpy (reference/pillow_pipeline.py): decode, shorter side to 224 px (bicubic),
# centre crop, normalise, one thread each. Installs Pillow and numpy into target/bench-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-200}
venv=target/bench-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c "import PIL, numpy" 2>/dev/null || "$venv/bin/pip" install -q pillow numpy
jpegs=target/bench-jpegs
[ -d "$jpegs" ] || "$venv/bin/python" reference/pillow_pipeline.py --write-jpegs "$jpegs" --count "$count" . >/dev/null
cargo build -q --release -p dpctl
ours=$(target/release/dpctl bench images "$jpegs" --threads 1 --json)
theirs=$("$venv/bin/python" reference/pillow_pipeline.py "$jpegs")
pool=$(target/release/dpctl bench images "$jpegs" --json)
python3 - "$ours" "$theirs" "$pool" <<'PY'
import json, sys
ours, theirs, pool = (json.loads(a) for a in sys.argv[1:4])
ratio = ours["images_per_s"] / theirs["images_per_s"]
print(f"{ours['images']} JPEGs 500x375 -> 224 px (decode, resize, centre crop, normalise):")
print(f"  dpcap pipeline, one thread  {ours['images_per_s']:.0f} images/s")
print(f"  Pillow + numpy, one thread  {theirs['images_per_s']:.0f} images/s")
print(f"  ratio {ratio:.2f}x; dpcap on {pool['threads']} threads: {pool['images_per_s']:.0f} images/s")
PY
