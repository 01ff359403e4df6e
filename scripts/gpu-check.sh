#!/usr/bin/env bash
# GPU check for a machine with one NVIDIA GPU, no network and maybe no Rust toolchain.
#
#   On an x86-64 build machine:  scripts/gpu-check.sh bundle   -> target/gpu-bundle/ (< 64 MiB)
#   On the GPU machine:          gpu-bundle/gpu-check.sh run   -> gpu-bundle/results/
#
# `bundle` builds the release binaries (dpctl and dpcap-worker with the `cuda` feature: burn-cuda
# and cudarc load CUDA, NVRTC and NCCL at run time, so no CUDA toolkit is needed to build; the
# accountant and coordinator are plain CPU binaries), strips and gzips them and copies this
# script beside them. `run` unpacks them and then, every step bounded and the whole run under
# 8 minutes (RUN_BUDGET_S):
#   0. finds the CUDA pieces the binaries load (find_cuda: NCCL, NVRTC and the headers cubecl's
#      kernels include, from the toolkit or from the pip wheels) and points the kernel caches
#      at results/cache (env.txt says what it chose);
#   1. records the GPU and the date;
#   2. `dpcap-worker preflight --device cuda:0 --json`: driver, device, NVRTC, headers, NCCL and
#      the cache, each ok or failed with the fix (preflight.json);
#   3. `dpctl bench clip --verify` on CUDA for the bench, tiny and base captioners in f32 and
#      bf16: timings, and the CUDA clipped sum against the CPU's f32 sum on identical seeded
#      weights and data, and the bench MAE;
#   4. a one-rank NCCL job end to end: accountant, coordinator and one `--device cuda:0
#      --precision bf16` worker on loopback run a budgeted 5-step micro job to SUCCEEDED with
#      reduction "nccl";
#   5. `dpctl bench scale --json` (CPU only): the paper-size release path on the machine's cores.
# results/summary.txt has a line per part: ok, FAILED (with why: the exit code, "timed out
# after N s", or which component died, and the last line of its stderr) or SKIPPED. Every
# stdout and stderr is kept beside it. Every process the script starts is killed when it ends,
# however it ends. `run-job` runs only part 4; with GPU_CHECK_DEVICE=cpu it runs the same
# plumbing on a CPU worker (reduction "accountant"): the end-to-end tests run it that way.
#
# Environment: GPU_CHECK_BIN (the binaries; default ./bin beside this script), GPU_CHECK_RESULTS
# (default ./results), GPU_CHECK_DEVICE (default cuda:0), GPU_CHECK_PYTHON (where to look for
# the NVIDIA wheels; default /opt/torch/.venv/bin/python, then python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${GPU_CHECK_BIN:-$here/bin}"
results="${GPU_CHECK_RESULTS:-$here/results}"
RUN_BUDGET_S=470
started=$SECONDS
pids=()

# Kills every process this script started (the components, and any bounded command still
# running when an interrupt arrives), then reaps them.
stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 30); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
  done
  pids=()
}
trap stop_all EXIT
interrupted() {
  [ -d "$results" ] && echo "FAILED interrupted after $((SECONDS - started)) s" >> "$results/summary.txt"
  echo "interrupted: stopping every process this run started" >&2
  exit 130
}
trap interrupted INT TERM

summary() { echo "$*" | tee -a "$results/summary.txt"; }

# The last non-empty line of a log, for the summary.
last_line() { [ -s "$1" ] && grep -v '^\s*$' "$1" | tail -1 | cut -c1-300 || true; }

# Why a process ended, from its stderr: a panic's message, else anyhow's "Error: …" line, else
# the last line (with RUST_BACKTRACE set, that is the backtrace's last frame).
cause() {
  local line
  line=$(grep -m1 -A1 'panicked at' "$1" 2> /dev/null | tr '\n' ' ' || true)
  [ -n "$line" ] || line=$(grep -m1 '^Error:' "$1" 2> /dev/null || true)
  [ -n "$line" ] || line=$(last_line "$1")
  echo "$line" | cut -c1-400
}

# Seconds left of RUN_BUDGET_S, capped at $1.
bound() {
  local left=$((RUN_BUDGET_S - (SECONDS - started)))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# bounded LIMIT NAME CMD...: runs CMD for at most LIMIT seconds (less when the run's budget is
# nearly spent), its stdout in results/NAME.out and stderr in results/NAME.err, and returns its
# exit status (124: timed out). It runs in the background so that an interrupt reaches the trap.
bounded() {
  local limit name=$2 rc=0
  limit=$(bound "$1")
  shift 2
  if [ "$limit" -lt 3 ]; then
    echo "out of the run's ${RUN_BUDGET_S} s" > "$results/$name.err"
    return 125
  fi
  timeout --kill-after=5 "$limit" "$@" > "$results/$name.out" 2> "$results/$name.err" &
  local pid=$!
  pids+=("$pid")
  wait "$pid" || rc=$?
  return "$rc"
}

# Why a bounded command failed, in words.
why() {
  case "$1" in
    124) echo "timed out after $2 s" ;;
    125) echo "skipped: the run's ${RUN_BUDGET_S} s were spent" ;;
    *) echo "exit $1" ;;
  esac
}

# check LIMIT NAME DESCRIPTION CMD...: a bounded step recorded as ok or FAILED in the summary.
check() {
  local limit=$1 name=$2 what=$3 rc=0
  shift 3
  bounded "$limit" "$name" "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then
    summary ok "$what"
  elif [ "$rc" -eq 125 ]; then
    summary SKIPPED "$what (the run's ${RUN_BUDGET_S} s were spent)"
  else
    summary FAILED "$what ($(why "$rc" "$limit"); results/$name.err: $(cause "$results/$name.err"))"
  fi
  return 0
}

# The first file named $1 under the CUDA toolkit or the NVIDIA pip wheels.
find_file() {
  local root
  for root in ${CUDA_PATH:-} /usr/local/cuda /opt/cuda $wheels; do
    [ -d "$root" ] || continue
    find -L "$root" -maxdepth 5 -path "*/$1" -print -quit 2> /dev/null | grep . && return 0
  done
  return 1
}

# Finds NCCL, NVRTC and the CUDA headers, links what cudarc and cubecl look for by name under
# results/cuda, and exports LD_LIBRARY_PATH and CUDA_PATH. cudarc asks for libnccl.so and
# libnvrtc.so (and some numbered names, never libnccl.so.2, the only name the wheel ships);
# cubecl-cuda compiles kernels with NVRTC against $CUDA_PATH/include and panics without one.
find_cuda() {
  local python="${GPU_CHECK_PYTHON:-}" site="" cuda="$results/cuda" lib header
  [ -n "$python" ] || { [ -x /opt/torch/.venv/bin/python ] && python=/opt/torch/.venv/bin/python || python=python3; }
  site=$(timeout 20 "$python" -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null || true)
  wheels=""
  for dir in $site; do [ -d "$dir/nvidia" ] && wheels="$wheels $dir/nvidia"; done
  mkdir -p "$cuda/lib" "$cuda/include"
  {
    echo "python: $python; wheels:${wheels:- none}"
    for lib in libnccl.so.2 libnvrtc.so.13 libnvrtc.so.12 libnvrtc-builtins.so.13 libnvrtc-builtins.so.12; do
      if found=$(find_file "$lib"); then
        echo "$lib: $found"
        ln -sf "$found" "$cuda/lib/$lib"
        case "$lib" in
          libnccl.so.2) ln -sf "$found" "$cuda/lib/libnccl.so" ;;
          libnvrtc.so.*) [ -e "$cuda/lib/libnvrtc.so" ] || ln -sf "$found" "$cuda/lib/libnvrtc.so" ;;
        esac
      else
        echo "$lib: not found"
      fi
    done
    # The toolkit's include dir when it has the headers; else the wheels' include dirs merged.
    if [ -n "${CUDA_PATH:-}" ] && [ -e "$CUDA_PATH/include/cuda_runtime.h" ]; then
      echo "CUDA_PATH: $CUDA_PATH (given)"
    else
      # The headers of dpcap_ml::device::KERNEL_HEADERS; CCCL's may sit under include/cccl.
      for header in cuda_runtime.h cuda_fp16.h cuda_bf16.h mma.h cooperative_groups.h cuda/pipeline cuda/barrier cuda/ptx; do
        if found=$(find_file "include/$header"); then
          dest="$cuda/include"
        elif found=$(find_file "include/cccl/$header"); then
          dest="$cuda/include/cccl"
        else
          echo "$header: not found"
          continue
        fi
        echo "$header: $found"
        [ -L "$dest" ] && continue
        mkdir -p "$dest"
        for entry in "${found%/"$header"}"/*; do
          [ -e "$dest/$(basename "$entry")" ] || ln -s "$entry" "$dest/"
        done
      done
      [ -e "$cuda/include/cuda_runtime.h" ] && export CUDA_PATH="$cuda"
      echo "CUDA_PATH: ${CUDA_PATH:-unset}"
    fi
  } > "$results/env.txt"
  export LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH" >> "$results/env.txt"
}

# Compiled kernels and autotune results persist in one directory, so that the bf16 runs reuse
# the f32 runs' kernels and a second run of this script compiles nothing.
kernel_cache() {
  export DPCAP_KERNEL_CACHE="$results/cache"
  mkdir -p "$DPCAP_KERNEL_CACHE"
  echo "DPCAP_KERNEL_CACHE: $DPCAP_KERNEL_CACHE" >> "$results/env.txt"
}

bundle() {
  cd "$here/.."
  # cudarc's bindings pinned to the lent machine's CUDA (driver 580: CUDA 13.0). Built without
  # nvcc, cudarc would otherwise pick its newest (13.4), which the driver may lack symbols of.
  CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}" cargo build --release --locked --features dpctl/cuda,dpcap-worker/cuda \
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

# start NAME CMD...: starts a component in the background, its stderr in results/job/NAME.log.
start() {
  local name=$1
  shift
  "$@" > /dev/null 2> "$work/$name.log" &
  pids+=($!)
  eval "pid_$name=$!"
}

# dead NAME: true when component NAME has exited, with the reason in results/job/why.txt.
dead() {
  local pid rc=0
  pid=$(eval "echo \$pid_$1")
  kill -0 "$pid" 2> /dev/null && return 1
  wait "$pid" 2> /dev/null || rc=$?
  echo "$1 exited (exit $rc): $(cause "$work/$1.log")" > "$work/why.txt"
}

# Waits up to 30 s for component NAME's --addr-file and sets `addr` to its gRPC URL; fails,
# with the reason in results/job/why.txt, when the component dies at start or stays silent.
wait_addr() {
  local name=$1
  for _ in $(seq 300); do
    if [ -s "$work/$name.addr" ]; then
      addr="http://$(sed -n 's/.*"grpc":"\([^"]*\)".*/\1/p' "$work/$name.addr")"
      return 0
    fi
    dead "$name" && return 1
    sleep 0.1
  done
  echo "$name wrote no address in 30 s (results/job/$name.log: $(last_line "$work/$name.log"))" > "$work/why.txt"
  return 1
}

# Waits for the background `dpctl wait` ($1) while every component lives; fails, with the
# reason in results/job/why.txt, when one dies first.
watch_job() {
  local waiter=$1 rc=0 name
  while kill -0 "$waiter" 2> /dev/null; do
    for name in accountant coordinator worker; do
      dead "$name" && return 1
    done
    sleep 1
  done
  wait "$waiter" || rc=$?
  [ "$rc" -eq 0 ] || echo "dpctl wait: $(why "$rc" 150); worker: $(cause "$work/worker.log")" > "$work/why.txt"
  return "$rc"
}

job_failed() { summary FAILED "one-rank job on $device ($1)"; stop_all; }

nccl_job() {
  device="${GPU_CHECK_DEVICE:-cuda:0}"
  local expect=nccl accountant coordinator id rc=0
  [ "$device" = cpu ] && expect=accountant
  work="$results/job"
  rm -rf "$work" && mkdir -p "$work"
  bounded 30 job-synth "$bin/dpctl" dataset synth --out "$work/data" --examples 480 --eval-examples 10 \
    || { job_failed "dataset synth: $(why $? 30); $(cause "$results/job-synth.err")"; return 0; }
  bounded 30 job-index "$bin/dpctl" dataset index --train-tokenizer "$work/data/train" \
    || { job_failed "dataset index: $(why $? 30); $(cause "$results/job-index.err")"; return 0; }
  start accountant "$bin/dpcap-accountant" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --ledger "$work/ledger" --addr-file "$work/accountant.addr"
  wait_addr accountant || { job_failed "$(cat "$work/why.txt")"; return 0; }
  accountant=$addr
  # The data's owner budgets the dataset before any job may spend it. The job's ε = 8 is at
  # δ = 1/N; its 5 steps cost ε ≈ 14.9 at the budget's δ = 1e-5, so the budget is 20.
  bounded 30 job-budget "$bin/dpctl" dataset budget set "$work/data/train" --epsilon 20 --delta 1e-5 \
    --reason "gpu check" --accountant "$accountant" \
    || { job_failed "dataset budget set: $(why $? 30); $(cause "$results/job-budget.err")"; return 0; }
  start coordinator "$bin/dpcap-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --store "$work/store" --accountant "$accountant" --addr-file "$work/coordinator.addr"
  wait_addr coordinator || { job_failed "$(cat "$work/why.txt")"; return 0; }
  coordinator=$addr
  start worker "$bin/dpcap-worker" --coordinator "$coordinator" --name gpu0 --device "$device" \
    --precision bf16 --collective-timeout 60
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
  bounded 30 job-submit "$bin/dpctl" --coordinator "$coordinator" submit "$work/job.yaml" --json \
    || { job_failed "submit: $(why $? 30); $(cause "$results/job-submit.err")"; return 0; }
  id=$(sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' "$results/job-submit.out" | head -1)
  # The first CUDA run compiles every kernel it meets: 150 s covers that with room.
  timeout --kill-after=5 "$(bound 150)" "$bin/dpctl" --coordinator "$coordinator" wait "$id" \
    > "$results/job-wait.out" 2> "$results/job-wait.err" &
  pids+=($!)
  watch_job $! || rc=$?
  bounded 15 job-get "$bin/dpctl" --coordinator "$coordinator" get "$id" --json || true
  cp "$results/job-get.out" "$work/job.json" 2> /dev/null || true
  if [ "$rc" -ne 0 ]; then
    job_failed "$(cat "$work/why.txt")"
  elif ! grep -q '"state": "SUCCEEDED"' "$work/job.json"; then
    job_failed "the job did not succeed: $(grep -m1 '"error"' "$work/job.json" || echo 'see results/job/job.json')"
  elif ! grep -q "\"reduction\": \"$expect\"" "$work/job.json"; then
    job_failed "reduction is not $expect: $(grep -m1 '"reduction"' "$work/job.json")"
  else
    summary ok "one-rank job on $device (5 steps, bf16, reduction $expect)"
    stop_all
  fi
}

# The bundle ships gzipped binaries; unpack them once beside the archives.
unpack() {
  for gz in "$bin"/*.gz; do
    [ -e "$gz" ] || continue
    [ -x "${gz%.gz}" ] || { gzip -dc "$gz" > "${gz%.gz}" && chmod +x "${gz%.gz}"; }
  done
}

prepare() {
  unpack
  mkdir -p "$results" && : > "$results/summary.txt"
  find_cuda
  kernel_cache
}

run() {
  prepare
  bounded 15 gpu nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  cp "$results/gpu.out" "$results/gpu.txt"
  date -u +%FT%TZ > "$results/date.txt"
  check 20 preflight "worker preflight on cuda:0 (results/preflight.out)" \
    "$bin/dpcap-worker" preflight --device cuda:0 --json
  # Worst case, every bound reached: 15 + 20 + 2 x (30 + 45 + 60) + 25 + (4 x 30 + 150 + 15) + 75
  # = 690 s, so RUN_BUDGET_S cuts it at 470 s; in a healthy run the kernel cache makes the bf16
  # runs short.
  for precision in f32 bf16; do
    for model in bench tiny base; do
      batch=64 limit=30
      [ "$model" = tiny ] && batch=16 limit=45
      [ "$model" = base ] && batch=8 limit=60
      check "$limit" "clip-$model-$precision" "clip $model $precision (verified against cpu f32)" \
        "$bin/dpctl" bench clip --model "$model" --batch "$batch" --device cuda:0 --precision "$precision" \
        --runs 3 --skip-naive --verify --json
    done
  done
  check 25 mae-bench "mae bench on cuda:0" \
    "$bin/dpctl" bench clip --model bench --objective mae --batch 64 --device cuda:0 --runs 3 --json
  nccl_job
  check 75 bench-scale "bench scale (release path at P = 190M on $(nproc) cores)" \
    "$bin/dpctl" bench scale --release-steps 2 --json
  echo "run took $((SECONDS - started)) s" | tee "$results/took.txt"
  ! grep -qE '^(FAILED|SKIPPED)' "$results/summary.txt"
}

case "${1:-}" in
  bundle) bundle ;;
  run) run ;;
  run-job)
    prepare
    nccl_job
    ! grep -qE '^(FAILED|SKIPPED)' "$results/summary.txt"
    ;;
  *)
    echo "usage: $0 bundle|run|run-job"
    exit 2
    ;;
esac
