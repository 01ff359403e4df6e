#!/usr/bin/env bash
# GPU check for a machine with one NVIDIA GPU, no network and no Rust toolchain.
#
#   On an x86-64 build machine:  scripts/gpu-check.sh bundle          -> target/gpu-bundle/
#                                scripts/gpu-check.sh device-command  -> the command to run there
#   On the GPU machine:          gpu-bundle/gpu-check.sh run          -> gpu-bundle/results/
#
# `bundle` builds the release binaries (dpctl and dpcap-worker with the `cuda` feature: burn-cuda
# and cudarc load CUDA, NVRTC and NCCL at run time, so no CUDA toolkit is needed to build; the
# accountant and coordinator are plain CPU binaries), strips and gzips them beside this script,
# and fails when the bundle exceeds 60 MiB or a binary needs a glibc newer than 2.35 (the GPU
# machine's). `device-command` prints the one command the GPU machine runs (at most 2,000
# characters) and the files it needs. `run` unpacks the binaries and then, each step bounded and
# the whole run within RUN_BUDGET_S (480 s) with an empty kernel cache:
#   0. finds the CUDA pieces the binaries load (find_cuda: NCCL, NVRTC and the headers cubecl's
#      kernels include, from the toolkit or from the pip wheels), puts the directories of the
#      libraries it found on LD_LIBRARY_PATH (NVRTC loads libnvrtc-builtins.so.N.M by name from
#      there) and points the kernel caches at results/cache (env.txt says what it chose);
#   1. records the GPU and the date;
#   2. `dpcap-worker preflight --device cuda:0 --json`: driver, device, NVRTC, NCCL, headers, a
#      probe kernel compiled with cubecl's own options, loaded and run, and the cache;
#   3. a one-rank NCCL job end to end: accountant, coordinator and one `--device cuda:0
#      --precision bf16` worker on loopback run a budgeted 5-step micro job to SUCCEEDED with
#      reduction "nccl" (NCCL_SOCKET_IFNAME=lo, NCCL's INFO log in results/job/);
#   4. `dpctl bench clip --verify` on CUDA: base in bf16 first (the paper's model: the DP step
#      over the non-private step, examples/s and MFU, a NaN example masked on the device), then
#      bench, tiny and base in f32, bench and tiny in bf16, and the bench MAE. The first compile
#      of each element type has its own longer bound; the autotune level is `minimal` unless
#      CUBECL_AUTOTUNE_LEVEL says otherwise.
# results/summary.txt has a line per part: ok, FAILED (with why: the exit code, "timed out
# after N s", or which component died, and the last line of its stderr) or SKIPPED. Every
# stdout and stderr is kept beside it. Every process the script starts is killed when it ends,
# however it ends. With GPU_CHECK_OUT set, the results are packed there when the run ends
# (summary.txt, results.tgz, kernel-cache.tgz: at most 8 files come back from the GPU machine),
# and a kernel-cache.tgz beside this script is unpacked first, so a second run starts warm.
# `run-job` runs only part 3; with GPU_CHECK_DEVICE=cpu it runs the same plumbing, with the same
# bounds, on a CPU worker (reduction "accountant"): the end-to-end tests run it that way.
#
# Environment: GPU_CHECK_BIN (the binaries; default ./bin beside this script), GPU_CHECK_RESULTS
# (default ./results), GPU_CHECK_DEVICE (default cuda:0), GPU_CHECK_OUT (where to pack the
# results), GPU_CHECK_PYTHON (where to look for the NVIDIA wheels; default
# /opt/torch/.venv/bin/python, then python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${GPU_CHECK_BIN:-$here/bin}"
results="${GPU_CHECK_RESULTS:-$here/results}"
RUN_BUDGET_S="${GPU_CHECK_BUDGET_S:-480}"
# The bundle's limits: what the GPU machine accepts (64 MiB a call, with the tree) and its glibc.
BUNDLE_MAX_BYTES=$((60 * 1024 * 1024))
GLIBC_MAX="${GPU_CHECK_GLIBC_MAX:-2.35}"
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
finish() {
  stop_all
  pack
}
trap finish EXIT
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
  local limit=$1 name=$2 what=$3 rc=0 began=$SECONDS
  shift 3
  bounded "$limit" "$name" "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then
    summary ok "$what in $((SECONDS - began)) s"
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

# Finds NCCL, NVRTC and the CUDA headers and exports LD_LIBRARY_PATH and CUDA_PATH. The
# directory of each library found goes on LD_LIBRARY_PATH as it is: libnvrtc.so.13 loads its
# builtins (libnvrtc-builtins.so.13.0 in the wheel, whatever its minor) by name, so the real
# directory must be searched, not links to guessed names. Links are made under results/cuda/lib
# only for names cudarc asks for that the install lacks: libnccl.so (cudarc never asks for
# libnccl.so.2, the only name the wheel and Debian ship) and libnvrtc.so. cubecl-cuda compiles
# kernels with NVRTC against $CUDA_PATH/include and panics without one.
find_cuda() {
  local python="${GPU_CHECK_PYTHON:-}" site="" cuda="$results/cuda" lib header found dirs="" dir
  [ -n "$python" ] || { [ -x /opt/torch/.venv/bin/python ] && python=/opt/torch/.venv/bin/python || python=python3; }
  site=$(timeout 20 "$python" -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null || true)
  wheels=""
  for dir in $site; do [ -d "$dir/nvidia" ] && wheels="$wheels $dir/nvidia"; done
  mkdir -p "$cuda/lib" "$cuda/include"
  {
    echo "python: $python; wheels:${wheels:- none}"
    for lib in libnccl.so.2 libnvrtc.so.13 libnvrtc.so.12; do
      if found=$(find_file "$lib"); then
        dir=$(dirname "$(readlink -f "$found")")
        echo "$lib: $found (directory $dir: $(ls "$dir" | grep -E '^lib(nccl|nvrtc)' | tr '\n' ' '))"
        case " $dirs " in *" $dir "*) ;; *) dirs="$dirs $dir" ;; esac
        case "$lib" in
          libnccl.so.2) [ -e "$dir/libnccl.so" ] || ln -sf "$found" "$cuda/lib/libnccl.so" ;;
          libnvrtc.so.*) [ -e "$dir/libnvrtc.so" ] || [ -e "$cuda/lib/libnvrtc.so" ] || ln -sf "$found" "$cuda/lib/libnvrtc.so" ;;
        esac
      else
        echo "$lib: not found"
      fi
    done
    # The toolkit's include dir when it has the headers; else the wheels' include dirs merged.
    if [ -n "${CUDA_PATH:-}" ] && [ -e "$CUDA_PATH/include/cuda_runtime.h" ]; then
      echo "CUDA_PATH: $CUDA_PATH (given)"
    elif [ -e /usr/local/cuda/include/cuda_runtime.h ]; then
      export CUDA_PATH=/usr/local/cuda
      echo "CUDA_PATH: $CUDA_PATH (the toolkit)"
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
  dirs="$cuda/lib$(printf ':%s' $dirs)"
  export LD_LIBRARY_PATH="${dirs%:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH" >> "$results/env.txt"
}

# Compiled kernels and autotune results persist in one directory (f32 and bf16 kernels are
# distinct: each element type compiles its own), so that a second run of this script compiles
# nothing. A kernel-cache.tgz beside the script (a previous run's, brought back) seeds it.
kernel_cache() {
  export DPCAP_KERNEL_CACHE="$results/cache"
  mkdir -p "$DPCAP_KERNEL_CACHE"
  if [ -s "$here/kernel-cache.tgz" ]; then
    tar -xzf "$here/kernel-cache.tgz" -C "$DPCAP_KERNEL_CACHE" && echo "kernel cache seeded from kernel-cache.tgz" >> "$results/env.txt"
  fi
  export CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}"
  echo "DPCAP_KERNEL_CACHE: $DPCAP_KERNEL_CACHE; CUBECL_AUTOTUNE_LEVEL: $CUBECL_AUTOTUNE_LEVEL" >> "$results/env.txt"
}

# The newest glibc symbol version a binary needs ("2.34"), from its dynamic symbol table.
glibc_needed() {
  { objdump -T "$1" 2> /dev/null || true; } | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1 || true
}

# check_bundle DIR: fails, saying why, when DIR exceeds BUNDLE_MAX_BYTES or a binary in DIR/bin
# (plain or gzipped) needs a glibc newer than GLIBC_MAX.
check_bundle() {
  local dir=$1 size f needed tmp
  size=$(du -sb "$dir" | cut -f1)
  if [ "$size" -gt "$BUNDLE_MAX_BYTES" ]; then
    echo "bundle $dir is $size bytes, over the $BUNDLE_MAX_BYTES-byte limit (60 MiB)" >&2
    return 1
  fi
  for f in "$dir"/bin/*; do
    tmp=$f
    case "$f" in *.gz) tmp=$(mktemp) && gzip -dc "$f" > "$tmp" ;; esac
    needed=$(glibc_needed "$tmp")
    [ "$tmp" = "$f" ] || rm -f "$tmp"
    if [ -n "$needed" ] && [ "$(printf '%s\n%s\n' "$needed" "$GLIBC_MAX" | sort -V | tail -1)" != "$GLIBC_MAX" ]; then
      echo "$(basename "$f") needs glibc $needed, newer than the GPU machine's $GLIBC_MAX: build on an older distribution" >&2
      return 1
    fi
    echo "$(basename "$f"): glibc ${needed:-none} needed"
  done
  echo "bundle $dir: $size bytes ($((size / 1024 / 1024)) MiB), within 60 MiB"
}

bundle() {
  cd "$here/.."
  local began=$SECONDS target="${CARGO_TARGET_DIR:-target}"
  local out="$target/gpu-bundle"
  # cudarc's bindings pinned to the lent machine's CUDA (driver 580: CUDA 13.0). Built without
  # nvcc, cudarc would otherwise pick its newest (13.4), which the driver may lack symbols of.
  # Without the `autotune` feature: a cold autotune takes 25-35 s per matmul shape on an H200,
  # so the check could not finish in one call with an empty cache (docs/gpu.md).
  CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}" cargo build --release --locked --features dpctl/cuda,dpcap-worker/cuda \
    -p dpctl -p dpcap-worker -p dpcap-accountant -p dpcap-coordinator
  local built=$((SECONDS - began))
  # A kernel cache brought back from an earlier GPU run survives the rebuild.
  local cache=""
  [ -s "$out/kernel-cache.tgz" ] && cache=$(mktemp) && cp "$out/kernel-cache.tgz" "$cache"
  rm -rf "$out" && mkdir -p "$out/bin"
  for b in dpctl dpcap-worker dpcap-accountant dpcap-coordinator; do cp "$target/release/$b" "$out/bin/"; done
  strip "$out"/bin/*
  # Stripped, the two CUDA binaries alone are about 90 MiB; gzip -9 brings all four to ~36 MiB.
  gzip -9 "$out"/bin/*
  cp scripts/gpu-check.sh "$out/"
  [ -n "$cache" ] && mv "$cache" "$out/kernel-cache.tgz"
  check_bundle "$out" | tee "$out/BUNDLE.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
  echo "built in $built s (cargo), bundled in $((SECONDS - began)) s" | tee -a "$out/BUNDLE.txt"
  device_command
}

# The command the GPU machine runs from the repository's root, and what it needs there.
DEVICE_COMMAND='cd target/gpu-bundle && GPU_CHECK_OUT="$OUT" GPU_CHECK_RESULTS=/tmp/gpu-check bash gpu-check.sh run'

device_command() {
  local built="${CARGO_TARGET_DIR:-$here/../target}/gpu-bundle"
  echo "files to bring (carry): target/gpu-bundle ($(du -sh "$built" 2> /dev/null | cut -f1 || echo 'not built'))"
  echo "timeout: 600 s (the run bounds itself at ${RUN_BUDGET_S} s)"
  echo "command (${#DEVICE_COMMAND} characters):"
  echo "$DEVICE_COMMAND"
  [ "${#DEVICE_COMMAND}" -le 2000 ]
}

# Packs the results into GPU_CHECK_OUT: what comes back from the GPU machine is at most 8 files,
# no deeper than two folders, so the logs travel as one archive and the kernel cache as another.
pack() {
  local out="${GPU_CHECK_OUT:-}"
  [ -n "$out" ] && [ -d "$results" ] || return 0
  mkdir -p "$out"
  cp "$results/summary.txt" "$out/" 2> /dev/null || true
  tar -czf "$out/results.tgz" -C "$results" --exclude=./cache --exclude=./cuda --exclude=./job/data --exclude=./job/store --exclude=./job/ledger . 2> /dev/null || true
  [ -d "$results/cache" ] && tar -czf "$out/kernel-cache.tgz" -C "$results/cache" . 2> /dev/null || true
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
  [ "$rc" -eq 0 ] || echo "dpctl wait: $(why "$rc" "$JOB_WAIT_S"); worker: $(cause "$work/worker.log")" > "$work/why.txt"
  return "$rc"
}

job_failed() { summary FAILED "one-rank job on $device ($1)"; stop_all; }

nccl_job() {
  device="${GPU_CHECK_DEVICE:-cuda:0}"
  local expect=nccl accountant coordinator id rc=0 job_began=$SECONDS
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
  # One GPU: NCCL talks to itself over loopback; its INFO log stays with the results.
  start worker env NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$work/nccl.%p.log" \
    "$bin/dpcap-worker" --coordinator "$coordinator" --name gpu0 --device "$device" \
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
  # The first CUDA process compiles (and autotunes) every bf16 kernel it meets, with an empty
  # cache: JOB_WAIT_S covers that with room; on a CPU worker the same bound holds.
  timeout --kill-after=5 "$(bound "$JOB_WAIT_S")" "$bin/dpctl" --coordinator "$coordinator" wait "$id" \
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
    summary ok "one-rank job on $device (5 steps, bf16, reduction $expect) in $((SECONDS - job_began)) s"
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

# Bounds of the run, in seconds, with an empty kernel cache. The job's wait includes the first
# bf16 compile; each element type's first clip run compiles its f32 kernels or the base model's
# new shapes; later runs reuse the cache.
JOB_WAIT_S=200
FIRST_COMPILE_S=150
CLIP_S=60

# clip NAME MODEL BATCH PRECISION LIMIT [ARGS...]: one `bench clip` on the device, verified.
clip() {
  local name=$1 model=$2 batch=$3 precision=$4 limit=$5 peak=494
  shift 5
  [ "$precision" = bf16 ] && peak=989
  check "$limit" "clip-$name" "clip $model $precision on $device (verified against cpu f32)" \
    "$bin/dpctl" bench clip --model "$model" --batch "$batch" --device "$device" --precision "$precision" \
    --runs 3 --skip-naive --verify --peak-tflops "$peak" --json "$@"
}

run() {
  prepare
  device="${GPU_CHECK_DEVICE:-cuda:0}"
  bounded 15 gpu nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  cp "$results/gpu.out" "$results/gpu.txt" 2> /dev/null || true
  date -u +%FT%TZ > "$results/date.txt"
  check 30 preflight "worker preflight on $device (results/preflight.out)" \
    "$bin/dpcap-worker" preflight --device "$device" --json
  # The job first: it proves NCCL, the runtime and the first bf16 compile. Worst case, every
  # bound reached: 15 + 30 + (4 x 30 + 200 + 15) + 150 + 150 + ... > 480, so the run's budget
  # cuts the later clip runs (SKIPPED), never the job or the base bf16 run.
  nccl_job
  clip base-bf16 base 8 bf16 "$FIRST_COMPILE_S"
  clip bench-f32 bench 64 f32 "$FIRST_COMPILE_S"
  clip tiny-f32 tiny 16 f32 "$CLIP_S"
  clip base-f32 base 8 f32 "$CLIP_S"
  clip bench-bf16 bench 64 bf16 "$CLIP_S"
  clip tiny-bf16 tiny 16 bf16 "$CLIP_S"
  check "$CLIP_S" mae-bench "mae bench on $device" \
    "$bin/dpctl" bench clip --model bench --objective mae --batch 64 --device "$device" --runs 3 --json
  echo "run took $((SECONDS - started)) s" | tee "$results/took.txt"
  ! grep -qE '^(FAILED|SKIPPED)' "$results/summary.txt"
}

case "${1:-}" in
  bundle) bundle ;;
  check-bundle) check_bundle "${2:?usage: $0 check-bundle DIR}" ;;
  device-command) device_command ;;
  run) run ;;
  run-job)
    prepare
    nccl_job
    ! grep -qE '^(FAILED|SKIPPED)' "$results/summary.txt"
    ;;
  *)
    echo "usage: $0 bundle|check-bundle DIR|device-command|run|run-job"
    exit 2
    ;;
esac
