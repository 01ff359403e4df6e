#!/usr/bin/env bash
# The release dpctl on a CPU without AVX-512. Our build turns on gemm's AVX-512 kernels
# (burn-flex `x86-v4`) and compiles the part check for AVX-512 too (`multiversion`), both chosen
# by run-time detection, so one binary must still run where only AVX2 exists. This runs one
# `micro` DP step (gemm, burn-flex's SIMD kernels, the ClipEngine) under qemu-user's emulation
# of a Haswell CPU (AVX2 and FMA, no AVX-512; checked first with a CPUID probe): an AVX-512
# instruction reached without the detection would end it with SIGILL. Then the ClipEngine's
# tests run there too (the Gram kernels choose their blocks by the vector unit). Installs Debian's
# qemu-user when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-x86_64 > /dev/null; then
  apt-get install -y -q qemu-user > /dev/null
fi
cargo build -q --release -p dpctl
cpu=${QEMU_CPU_MODEL:-Haswell}
quiet() { "$@" 2> >(grep -v "TCG doesn't support requested feature" >&2); }
echo "qemu-x86_64 -cpu $cpu: $(qemu-x86_64 --version | head -1)"
# The control: what the emulated CPU reports, by the same CPUID test gcc's run-time dispatch uses.
probe=target/avx2-check-cpuid
gcc -x c -O1 -o "$probe" - << 'C'
#include <stdio.h>
int main(void) {
  __builtin_cpu_init();
  printf("avx2 %d avx512f %d", __builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("avx512f") != 0);
  return 0;
}
C
reported=$(quiet qemu-x86_64 -cpu "$cpu" "$probe")
echo "emulated CPU: $reported (this machine: $("$probe"))"
[ "$reported" = "avx2 1 avx512f 0" ] || { echo "qemu's $cpu does not model an AVX2-only CPU" >&2; exit 2; }
# And an AVX-512 instruction there must fault, or a run below would prove nothing.
gcc -x c -O1 -mavx512f -o "$probe-avx512" - << 'C'
#include <immintrin.h>
#include <stdio.h>
int main(void) {
  volatile float one = 1.0f;
  __m512 v = _mm512_add_ps(_mm512_set1_ps(one), _mm512_set1_ps(one));
  printf("%f", _mm512_reduce_add_ps(v));
  return 0;
}
C
if quiet qemu-x86_64 -cpu "$cpu" "$probe-avx512" > /dev/null 2>&1; then
  echo "an AVX-512 instruction ran under qemu's $cpu: the check would prove nothing" >&2
  exit 2
fi
echo "an AVX-512 instruction faults there, as it should"
quiet qemu-x86_64 -cpu "$cpu" target/release/dpctl bench clip --model micro --batch 4 --runs 1 --skip-naive --json
echo "dpctl ran its DP step on an AVX2-only CPU"
# The ghost norms' Gram kernels and fused attention pick their blocks by the vector unit found at run time
# (ml/src/clip/gram.rs): their tests, against per-example gradients, on the AVX2 blocks.
suite=$(cargo test -q -p dpcap-ml --test suite --no-run --message-format=json 2> /dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("target", {}).get("name") == "suite" and m.get("executable"): print(m["executable"])')
quiet qemu-x86_64 -cpu "$cpu" "$suite" gram:: clip_vs_naive:: fused::
echo "the Gram kernels and the fused ops match their references on an AVX2-only CPU"
