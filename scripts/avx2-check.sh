#!/usr/bin/env bash
# The release dpctl on a CPU without AVX-512. Our build turns on gemm's AVX-512 kernels
# (burn-flex `x86-v4`) and compiles the part check for AVX-512 too (`multiversion`), both chosen
# by run-time detection, so one binary must still run where only AVX2 exists. This runs one
# `micro` DP step and the accountant's same-host release path under qemu-user's emulation of a
# Haswell CPU (AVX2 and FMA, no AVX-512): an AVX-512 instruction reached without the detection
# would end it with SIGILL. Installs Debian's qemu-user when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-x86_64 > /dev/null; then
  apt-get install -y -q qemu-user > /dev/null
fi
cargo build -q --release -p dpctl
cpu=${QEMU_CPU_MODEL:-Haswell}
echo "qemu-x86_64 -cpu $cpu: $(qemu-x86_64 --version | head -1)"
qemu-x86_64 -cpu "$cpu" target/release/dpctl bench clip --model micro --batch 4 --runs 1 --skip-naive --json
