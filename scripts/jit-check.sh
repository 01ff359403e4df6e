#!/usr/bin/env bash
# The JIT path without a GPU: `dpctl bench clip --verify` on burn-wgpu over Mesa's lavapipe
# (Vulkan on the CPU). cubecl-wgpu shares cubecl's IR, fusion, autotune and matmul with
# cubecl-cuda, which burn-flex never exercises: a kernel that miscompiles or a fused op that
# changes a clipped sum fails here first. The check compares the device's clipped sum with the
# CPU's f32 sum on the same weights and data (tolerance 1e-3 of the largest value).
#
#   scripts/jit-check.sh            # micro captioner, batch 4; MODEL, BATCH, RUNS override
#
# Needs Debian's mesa-vulkan-drivers and libvulkan1 (installed here when missing and root);
# builds dpctl with the `wgpu` feature into target/jit (its own target directory, so the
# suite's build is not invalidated).
set -euo pipefail
cd "$(dirname "$0")/.."
icd=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ ! -f "$icd" ] || ! ldconfig -p | grep -q libvulkan.so.1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mesa-vulkan-drivers libvulkan1 >/dev/null
  else
    echo "jit-check: lavapipe is missing: install mesa-vulkan-drivers and libvulkan1" >&2
    exit 2
  fi
fi
CARGO_TARGET_DIR=target/jit cargo build -q --release --locked -p dpctl --features wgpu
# Lavapipe alone, whatever other Vulkan drivers are installed.
export VK_ICD_FILENAMES=$icd
# Mesa asks for a runtime directory; none exists in CI containers.
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
out=$(timeout "${JIT_TIMEOUT:-900}" target/jit/release/dpctl bench clip --device wgpu --model "${MODEL:-micro}" \
  --batch "${BATCH:-4}" --runs "${RUNS:-1}" --skip-naive --verify --json) || {
  rc=$?
  echo "$out"
  echo "jit-check: FAILED (exit $rc): see the error above" >&2
  exit "$rc"
}
echo "$out"
python3 - "$out" <<'PY'
import json, sys
o = json.loads(sys.argv[1])
print(f"jit-check: wgpu (lavapipe) {o['model']}, batch {o['batch']}: ClipEngine {o['clip_s']:.3f} s, "
      f"non-private {o['nonprivate_s']:.3f} s, clipped sum within {o['verify_rel_err']:.2e} of the CPU's")
PY
