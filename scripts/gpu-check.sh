#!/usr/bin/env bash
# GPU check for a machine with one NVIDIA GPU, no network and maybe no Rust toolchain.
#
#   On an x86-64 build machine:  scripts/gpu-check.sh bundle   -> target/gpu-bundle/ (< 64 MiB)
#   On the GPU machine:          gpu-bundle/gpu-check.sh run   -> gpu-bundle/results/
#
# `bundle` builds the release binaries (dpctl and dpcap-worker with the `cuda` feature: burn-cuda
# and cudarc load CUDA and NCCL at run time, so no CUDA toolkit is needed to build; the
# accountant and coordinator are plain CPU binaries), strips and gzips them (the bundle must stay
# under 64 MiB) and copies this script beside them. `run` unpacks them, then, bounded to stay
# under 8 minutes:
#   1. records the GPU and the date;
#   2. `dpctl bench clip --verify` on CUDA for the bench, tiny and base captioners in f32 and
#      bf16: timings, and the CUDA clipped sum against the CPU's f32 sum on identical seeded
#      weights and data (fails above 1e-3 relative in f32, 3e-2 in bf16), and the bench MAE (the
#      ClipEngine/non-private ratio is in each JSON: both run on the GPU in one process);
#   3. a one-rank NCCL job end to end: accountant, coordinator and one `--device cuda:0
#      --precision bf16` worker on loopback run a 5-step micro job to SUCCEEDED; the job must
#      report reduction "nccl" (rank 0 all-reduces, sends parts = 1, broadcasts the release);
#   4. `dpctl bench scale --json` (CPU only): the paper-size release path (P = 190M) on the
#      machine's 16 cores, which the 2-core development machine cannot show (issue 12's 1 GB/s).
# results/summary.txt lists each part as ok or FAILED. `run-job` runs only part 3; with
# GPU_CHECK_DEVICE=cpu it exercises the same plumbing on a CPU worker (reduction "accountant"),
# which is how the script is checked on machines without a GPU.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

bundle() {
  cd "$here/.."
  cargo build --release --locked --features dpctl/cuda,dpcap-worker/cuda \
    -p dpctl -p dpcap-worker -p dpcap-accountant -p dpcap-coordinator
  out=target/gpu-bundle
  rm -rf "$out" && mkdir -p "$out/bin"
  for b in dpctl dpcap-worker dpcap-accountant dpcap-coordinator; do cp "target/release/$b" "$out/bin/"; done
  strip "$out"/bin/*
  # Stripped, the two CUDA binaries alone are about 90 MiB; gzip -9 brings all four to ~30 MiB.
  gzip -9 "$out"/bin/*
  cp scripts/gpu-check.sh "$out/"
  du -sh "$out"
  size=$(du -sb "$out" | cut -f1)
  [ "$size" -lt $((64 * 1024 * 1024)) ] || { echo "bundle is $size bytes, over 64 MiB"; exit 1; }
}

summary() { echo "$1 $2" | tee -a "$results/summary.txt"; }

# Waits up to 30 s for an --addr-file and prints its gRPC address.
grpc_addr() {
  for _ in $(seq 300); do
    [ -s "$1" ] && { sed -n 's/.*"grpc":"\([^"]*\)".*/\1/p' "$1"; return 0; }
    sleep 0.1
  done
  return 1
}

nccl_job() {
  local work="$results/nccl-job" pids=() status=0 device="${GPU_CHECK_DEVICE:-cuda:0}" expect=nccl
  [ "$device" = cpu ] && expect=accountant
  rm -rf "$work" && mkdir -p "$work"
  "$bin/dpctl" dataset synth --out "$work/data" --examples 480 --eval-examples 10 > /dev/null
  "$bin/dpctl" dataset index --train-tokenizer "$work/data/train" > /dev/null
  "$bin/dpcap-accountant" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --ledger "$work/ledger" \
    --addr-file "$work/accountant.addr" 2> "$work/accountant.log" & pids+=($!)
  local accountant; accountant="http://$(grpc_addr "$work/accountant.addr")"
  "$bin/dpcap-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --store "$work/store" \
    --accountant "$accountant" --addr-file "$work/coordinator.addr" 2> "$work/coordinator.log" & pids+=($!)
  local coordinator; coordinator="http://$(grpc_addr "$work/coordinator.addr")"
  "$bin/dpcap-worker" --coordinator "$coordinator" --name gpu0 --device "$device" --precision bf16 \
    --collective-timeout 120 2> "$work/worker.log" & pids+=($!)
  cat > "$work/job.yaml" << EOF
name: nccl-one-rank
dataset: $work/data/train
model: micro
epsilon: 8
batch_size: 48
steps: 5
micro_batch: 16
workers: 1
checkpoint_interval: 5
EOF
  local id
  id=$("$bin/dpctl" --coordinator "$coordinator" submit "$work/job.yaml" --json | sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' | head -1)
  timeout 60 "$bin/dpctl" --coordinator "$coordinator" wait "$id" || status=$?
  "$bin/dpctl" --coordinator "$coordinator" get "$id" --json > "$work/job.json" || true
  kill "${pids[@]}" 2> /dev/null || true
  wait 2> /dev/null || true
  if [ "$status" -eq 0 ] && grep -q "\"reduction\": \"$expect\"" "$work/job.json" \
    && grep -q '"state": "SUCCEEDED"' "$work/job.json"; then
    summary ok "one-rank job on $device (5 steps, bf16, reduction $expect)"
  else
    summary FAILED "one-rank job on $device (dpctl wait exit $status; see results/nccl-job/*.log)"
  fi
}

# The bundle ships gzipped binaries; unpack them once beside the archives.
unpack() {
  bin="$here/bin"
  for gz in "$bin"/*.gz; do
    [ -e "$gz" ] || continue
    [ -x "${gz%.gz}" ] || { gzip -dc "$gz" > "${gz%.gz}" && chmod +x "${gz%.gz}"; }
  done
}

run() {
  unpack
  results="$here/results"
  mkdir -p "$results" && : > "$results/summary.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$results/gpu.txt"
  date -u +%FT%TZ > "$results/date.txt"
  # Worst case, every bound reached: 2 x (40 + 60 + 90) + 30 + 60 + 60 = 530 s, under 9 minutes.
  for precision in f32 bf16; do
    for model in bench tiny base; do
      batch=64 limit=40; [ "$model" = tiny ] && batch=16 limit=60; [ "$model" = base ] && batch=8 limit=90
      out="$results/clip-$model-$precision-cuda.json"
      if timeout "$limit" "$bin/dpctl" bench clip --model "$model" --batch "$batch" --device cuda:0 --precision "$precision" \
        --runs 3 --skip-naive --verify --json | tee "$out"; then
        summary ok "clip $model $precision (verified against cpu f32)"
      else
        summary FAILED "clip $model $precision"
      fi
    done
  done
  timeout 30 "$bin/dpctl" bench clip --model bench --objective mae --batch 64 --device cuda:0 --runs 3 --json \
    | tee "$results/mae-bench-cuda.json" || summary FAILED "mae bench"
  nccl_job
  if timeout 60 "$bin/dpctl" bench scale --release-steps 2 --json | tee "$results/bench-scale.json"; then
    summary ok "bench scale (release path at P = 190M on $(nproc) cores)"
  else
    summary FAILED "bench scale"
  fi
  ! grep -q FAILED "$results/summary.txt"
}

case "${1:-}" in
  bundle) bundle ;;
  run) run ;;
  run-job)
    unpack
    results="$here/results"
    mkdir -p "$results" && : > "$results/summary.txt"
    nccl_job
    ! grep -q FAILED "$results/summary.txt"
    ;;
  *) echo "usage: $0 bundle|run|run-job"; exit 2 ;;
esac
