#!/usr/bin/env bash
# The JIT path without a GPU: `dpctl bench clip --verify` on burn-wgpu over Mesa's lavapipe
# (Vulkan on the CPU). cubecl-wgpu shares cubecl's IR, fusion and matmul selection with
# cubecl-cuda, which burn-flex never exercises: a kernel that miscompiles, a fused op that
# changes a clipped sum, or a kernel selection that panics fails here first. The check compares
# the device's clipped sum with the CPU's f32 sum on the same weights and data.
#
#   scripts/jit-check.sh                 # no autotune: the kernels the GPU check's bundle takes
#   JIT_AUTOTUNE=1 scripts/jit-check.sh  # with cubecl's autotune, as production images build
#
# Without autotune (the default, as scripts/gpu-check.sh bundles), a matmul takes cubek's
# `Strategy::Auto` and a reduction one thread per output: the selection the GPU's first call
# never had, run here first. Each precision in PRECISIONS (default "f32 f16") runs the micro
# captioner (MODEL, BATCH, RUNS override) and must report the build's kernel selection. WGSL has
# no bf16 type, so bf16 cannot run here (dpctl refuses it for wgpu); f16 runs the same mixed
# precision (half-precision inputs, f32 products' outputs, f32 norms and sums) through the same
# casts and matmul selection.
#
# Needs Debian's mesa-vulkan-drivers and libvulkan1 (installed here when missing and root);
# builds dpctl with the `wgpu` feature into target/jit (target/jit-autotune with autotune), its
# own target directory, so the suite's build is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."
icd=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ ! -f "$icd" ] || ! ldconfig -p | grep -q libvulkan.so.1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mesa-vulkan-drivers libvulkan1 > /dev/null
  else
    echo "jit-check: lavapipe is missing: install mesa-vulkan-drivers and libvulkan1" >&2
    exit 2
  fi
fi
if [ "${JIT_AUTOTUNE:-0}" = 1 ]; then
  features=wgpu,autotune target=target/jit-autotune expect="kernel selection: autotune"
else
  features=wgpu target=target/jit expect="kernel selection: no autotune"
fi
CARGO_TARGET_DIR=$target cargo build -q --release --locked -p dpctl --features "$features"
# Lavapipe alone, whatever other Vulkan drivers are installed.
export VK_ICD_FILENAMES=$icd
# Mesa asks for a runtime directory; none exists in CI containers.
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
failed=0
for precision in ${PRECISIONS:-f32 f16}; do
  rc=0
  log=$(mktemp)
  # cubecl-wgpu logs each WGSL module it compiles (trace), as cubecl-cuda logs each kernel.
  out=$(RUST_LOG=warn,cubecl_wgpu::backend=trace timeout "${JIT_TIMEOUT:-900}" "$target/release/dpctl" bench clip \
    --device wgpu --model "${MODEL:-micro}" --batch "${BATCH:-4}" --runs "${RUNS:-1}" --precision "$precision" \
    --skip-naive --verify --json 2> "$log") || rc=$?
  kernels=$(grep -c 'compiling WGSL module' "$log" || true)
  if [ "$rc" -ne 0 ]; then
    echo "$out"
    grep -v 'cubecl_wgpu::backend' "$log" | tail -40 >&2
    echo "jit-check: $precision FAILED (exit $rc; $kernels kernels compiled): see the error above" >&2
    failed=1
    continue
  fi
  rm -f "$log"
  python3 - "$out" "$expect" "$kernels" << 'PY' || failed=1
import json, sys
o, expect, kernels = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
if o.get("kernels") != expect:
    sys.exit(f"jit-check: the binary reports {o.get('kernels')!r}, not {expect!r}")
print(f"jit-check: wgpu (lavapipe) {o['model']} {o['precision']}, batch {o['batch']}, {o['kernels']} "
      f"({kernels} kernels compiled): "
      f"ClipEngine {o['clip_s']:.3f} s, non-private {o['nonprivate_s']:.3f} s, "
      f"clipped sum within {o['verify_rel_err']:.2e} of the CPU's")
PY
done
exit "$failed"
