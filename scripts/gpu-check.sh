#!/usr/bin/env bash
# GPU check for a machine with one NVIDIA GPU, no network and no Rust toolchain.
#
#   On an x86-64 build machine:  scripts/gpu-check.sh bundle          -> target/gpu-bundle/
#                                scripts/gpu-check.sh seed DIR        -> a call's cache beside it
#                                scripts/gpu-check.sh device-command  -> the command to run there
#   On the GPU machine:          gpu-bundle/gpu-check.sh run          -> gpu-bundle/results/
#
# `bundle` builds the release binaries (dpctl and dpcap-worker with the `cuda` feature and without
# `autotune`: burn-cuda and cudarc load CUDA, NVRTC and NCCL at run time, so no CUDA toolkit is
# needed to build; the accountant and coordinator are plain CPU binaries), strips and gzips them
# beside this script, and fails when the bundle exceeds 60 MiB, a binary needs a glibc newer than
# 2.35 (the GPU machine's) or a CUDA binary was built with cubecl's autotune (each binary states
# its kernel selection). It then runs the bundle's own binaries through `run-job` on a CPU worker,
# so a protocol mismatch fails here and not on the device, and the no-autotune jit-check on
# lavapipe (scripts/jit-check.sh; GPU_CHECK_JIT=0 skips it, saying so). `device-command` prints
# the one command the GPU machine runs (at most 2,000 characters) and the files it needs.
#
# `run` unpacks the binaries and then runs its parts in this order, each bounded and all within
# RUN_BUDGET_S (540 s: the call's 600 s less room to pack), cold cache or warm:
#   0. finds the CUDA pieces the binaries load (find_cuda: NCCL, NVRTC and the headers cubecl's
#      kernels include, from the toolkit or from the pip wheels), puts the directories of the
#      libraries it found on LD_LIBRARY_PATH (NVRTC loads libnvrtc-builtins.so.N.M by name from
#      there), and points cubecl's kernel cache and the driver's (CUDA_CACHE_PATH) under
#      results/kcache, so every process of the call shares what another compiled;
#   1. `preflight`: driver, device, NVRTC, NCCL, headers, a probe kernel, the cache;
#   2. `warm`: `dpctl bench clip` of the micro captioner in bf16 at batch 16, one run, verified:
#      the job's micro-batch shapes, so it fills the shared cache and fails fast if a kernel
#      cubek's Strategy::Auto picks cannot run;
#   3. `job`: a one-rank NCCL job end to end (accountant, coordinator and one `--device cuda:0
#      --precision bf16` worker on loopback: a budgeted 5-step micro job to SUCCEEDED with
#      reduction "nccl");
#   4. `base-bf16`: the paper's model, 3 runs, given what is left less RESERVE_S: the DP step
#      over the non-private step, examples/s and MFU, a NaN example masked on the device;
#   5. the rest, one run each, each given what is left: bench f32, tiny f32, base f32, bench
#      bf16, tiny bf16, the bench MAE. GPU_CHECK_PARTS (names, space-separated) runs a subset.
# Every figure is from a build without autotune, and is labelled so ("kernels" in each JSON):
# production images (`--features cuda,autotune`) tune between more kernels.
#
# What comes back. After each part, at once, into GPU_CHECK_OUT: summary.txt (a line per part:
# ok, FAILED with why, or SKIPPED; with the kernels it compiled and found cached), parts.jsonl
# (the part's line and its JSON), results.tgz (every log, the services' and dpctl's with a
# timestamped line per kernel compiled) and the kernel cache as kernel-cache.tgz.NN pieces under
# 15 MiB. Each file is written beside and renamed, so a hard kill leaves the last whole copy:
# at most 8 files, 64 MiB in all, come back from the GPU machine. Pieces beside this script
# (a previous call's, brought back) seed the cache first.
# `run-job` runs only part 3; with GPU_CHECK_DEVICE=cpu it runs the same plumbing, with the same
# bounds, on a CPU worker (reduction "accountant"): the end-to-end tests run it that way.
#
# Environment: GPU_CHECK_BIN (the binaries; default ./bin beside this script), GPU_CHECK_RESULTS
# (default ./results), GPU_CHECK_DEVICE (default cuda:0), GPU_CHECK_OUT (where results go),
# GPU_CHECK_BUDGET_S (default 540), GPU_CHECK_PARTS, GPU_CHECK_PIECE_BYTES (the cache's piece
# size), GPU_CHECK_PYTHON (where to look for the NVIDIA wheels; default
# /opt/torch/.venv/bin/python, then python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${GPU_CHECK_BIN:-$here/bin}"
results="${GPU_CHECK_RESULTS:-$here/results}"
RUN_BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
# The bundle's limits: what the GPU machine accepts (64 MiB a call, with the tree) and its glibc.
BUNDLE_MAX_BYTES=$((60 * 1024 * 1024))
GLIBC_MAX="${GPU_CHECK_GLIBC_MAX:-2.35}"
out_dir="${GPU_CHECK_OUT:-}"
# The kernel cache comes back in pieces under 15 MiB (the machine's limit is 16 MiB a file).
PIECE_BYTES="${GPU_CHECK_PIECE_BYTES:-15000000}"
PIECES_MAX=4
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
  pack || true
}
trap finish EXIT
interrupted() {
  [ -d "$results" ] && echo "FAILED interrupted after $((SECONDS - started)) s" >> "$results/summary.txt"
  echo "interrupted: stopping every process this run started" >&2
  exit 130
}
trap interrupted INT TERM

summary() { echo "$*" | tee -a "$results/summary.txt"; }

# A NOTE line in the summary, once.
note() {
  if ! grep -qxF "NOTE $*" "$results/summary.txt"; then summary "NOTE $*"; fi
}

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

# check LIMIT NAME DESCRIPTION CMD...: a bounded part recorded as ok, FAILED or SKIPPED in the
# summary, with the kernels it compiled, and published at once.
check() {
  local limit=$1 name=$2 what=$3 rc=0 began=$SECONDS status
  shift 3
  bounded "$limit" "$name" "$@" || rc=$?
  local took=$((SECONDS - began)) counted
  counted=$(kernels "$results/$name.err")
  if [ "$rc" -eq 0 ]; then
    status=ok
    summary ok "$what in $took s; $counted"
  elif [ "$rc" -eq 125 ]; then
    status=SKIPPED
    summary SKIPPED "$what (the run's ${RUN_BUDGET_S} s were spent)"
  else
    status=FAILED
    summary FAILED "$what ($(why "$rc" "$limit"); $counted; results/$name.err: $(cause "$results/$name.err"))"
  fi
  publish "$name" "$status" "$took" "$results/$name.out" "$results/$name.err"
  return 0
}

# The kernels a part's log shows cubecl-cuda compiling, and loading from the shared cache
# (RUST_LOG=...,cubecl_cuda=trace: one timestamped line each).
kernels() {
  local compiled cached
  compiled=$(grep -c 'Compiling kernel' "$@" 2> /dev/null | awk -F: '{ n += $NF } END { print n + 0 }')
  cached=$(grep -c 'Using PTX cache' "$@" 2> /dev/null | awk -F: '{ n += $NF } END { print n + 0 }')
  echo "kernels: $compiled compiled, $cached from the cache"
}

# What the part printed, as one JSON value: its whole stdout when that is a JSON object, else its
# last line that is one, else null.
part_json() {
  local line
  if [ -s "$1" ] && [ "$(head -c1 "$1")" = "{" ]; then
    tr -d '\n' < "$1"
  elif line=$(grep '^{' "$1" 2> /dev/null | tail -1) && [ -n "$line" ]; then
    echo -n "$line"
  else
    echo -n null
  fi
}

# put FILE NAME: copies FILE into GPU_CHECK_OUT as NAME through a temporary name, so that a kill
# mid-copy leaves the previous whole copy.
put() {
  cp "$1" "$out_dir/.$2.tmp" && mv -f "$out_dir/.$2.tmp" "$out_dir/$2"
}

# publish NAME STATUS SECONDS STDOUT LOG...: the part's line in parts.jsonl, then summary.txt,
# results.tgz and the kernel cache's pieces, refreshed in GPU_CHECK_OUT.
publish() {
  local name=$1 status=$2 took=$3 stdout=$4
  shift 4
  [ -n "$out_dir" ] || return 0
  mkdir -p "$out_dir"
  local compiled
  compiled=$(kernels "$@" | sed 's/kernels: \([0-9]*\) compiled, \([0-9]*\).*/"kernels_compiled": \1, "kernels_cached": \2/')
  echo "{\"part\": \"$name\", \"status\": \"$status\", \"seconds\": $took, $compiled, \"result\": $(part_json "$stdout")}" \
    >> "$results/parts.jsonl"
  # Packing never stops the run: what it could not bring back, it says.
  pack || note "packing the results failed after part $name"
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

# Compiled kernels persist under results/kcache, shared by every process of the call: cubecl's
# own cache (kcache/cubecl: the PTX of each kernel, keyed by a stable hash) and the driver's
# (kcache/cuda: the SASS it JIT-compiles from that PTX, which it would otherwise redo in every
# process). Pieces of a previous call's cache beside the script (kernel-cache.tgz.NN, or one
# kernel-cache.tgz) seed it, so a second call compiles nothing it compiled before.
kernel_cache() {
  local pieces
  export DPCAP_KERNEL_CACHE="$results/kcache/cubecl" CUDA_CACHE_PATH="$results/kcache/cuda"
  # The driver's cache is 256 MiB by default and evicts silently; 4 GiB is its maximum.
  export CUDA_CACHE_MAXSIZE=4294967296
  mkdir -p "$DPCAP_KERNEL_CACHE" "$CUDA_CACHE_PATH"
  pieces=$(find "$here" -maxdepth 1 -name 'kernel-cache.tgz*' -type f | sort)
  if [ -n "$pieces" ]; then
    # shellcheck disable=SC2086 # the pieces' names are ours: no spaces.
    if whole_pieces $pieces && cat $pieces | tar -xz -C "$results/kcache"; then
      echo "kernel cache seeded from $(echo $pieces | wc -w) piece(s): $(du -sh "$results/kcache" | cut -f1)" >> "$results/env.txt"
    else
      echo "kernel cache pieces beside the script are not a whole archive: starting cold" >> "$results/env.txt"
    fi
  fi
  echo "DPCAP_KERNEL_CACHE: $DPCAP_KERNEL_CACHE; CUDA_CACHE_PATH: $CUDA_CACHE_PATH" >> "$results/env.txt"
}

# Whether the pieces named, in order, make one whole gzipped tar (a set cut short by a kill
# does not): checked before anything is unpacked from them.
whole_pieces() {
  cat "$@" | tar -tzf - > /dev/null 2>&1
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
  kernel_selection "$dir" || return 1
  echo "bundle $dir: $size bytes ($((size / 1024 / 1024)) MiB), within 60 MiB"
}

# kernel_selection DIR: fails, saying why, unless each CUDA binary in DIR/bin states the kernel
# selection GPU_CHECK_KERNELS (default "no autotune"; dpcap_ml::device::KERNEL_SELECTION is
# compiled into every binary that can run cubecl).
kernel_selection() {
  local dir=$1 f s n found want="kernel selection: ${GPU_CHECK_KERNELS:-no autotune}"
  for f in "$dir"/bin/dpctl* "$dir"/bin/dpcap-worker*; do
    [ -e "$f" ] || continue
    # The statement sits in the read-only data among other strings, with no terminator: look for
    # each of the two whole phrases, never for what follows one.
    found=""
    for s in "kernel selection: autotune" "kernel selection: no autotune"; do
      n=$(case "$f" in *.gz) gzip -dc "$f" ;; *) cat "$f" ;; esac | grep -a -c -F "$s" || true)
      if [ "${n:-0}" -gt 0 ]; then found="${found:+$found, }$s"; fi
    done
    if [ "$found" != "$want" ]; then
      echo "$(basename "$f") states \"${found:-no kernel selection}\", not \"$want\": rebuild it without --features autotune" >&2
      return 1
    fi
    echo "$(basename "$f"): $want"
  done
}

# The bundle's own binaries, gunzipped apart from it, through `run-job` on a CPU worker.
bundle_cpu_run() {
  local trial
  trial=$(mktemp -d)
  cp -r "$1/bin" "$trial/bin"
  if ! GPU_CHECK_DEVICE=cpu GPU_CHECK_BIN="$trial/bin" GPU_CHECK_RESULTS="$trial/results" GPU_CHECK_OUT= \
    bash "$1/gpu-check.sh" run-job; then
    echo "the bundle's binaries failed the CPU run: see $trial/results (summary.txt, job/*.log)" >&2
    return 1
  fi
  rm -rf "$trial"
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
  local cache
  cache=$(mktemp -d)
  find "$out" -maxdepth 1 -name 'kernel-cache.tgz*' -type f -exec mv {} "$cache/" \; 2> /dev/null || true
  rm -rf "$out" && mkdir -p "$out/bin"
  for b in dpctl dpcap-worker dpcap-accountant dpcap-coordinator; do cp "$target/release/$b" "$out/bin/"; done
  strip "$out"/bin/*
  # Stripped, the two CUDA binaries alone are about 90 MiB; gzip -9 brings all four to ~36 MiB.
  gzip -9 "$out"/bin/*
  cp scripts/gpu-check.sh "$out/"
  find "$cache" -type f -exec mv {} "$out/" \; && rmdir "$cache"
  check_bundle "$out" | tee "$out/BUNDLE.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
  echo "built in $built s (cargo), bundled in $((SECONDS - began)) s" | tee -a "$out/BUNDLE.txt"
  bundle_cpu_run "$out" || exit 1
  echo "the bundle's binaries passed the CPU run (run-job, GPU_CHECK_DEVICE=cpu)" | tee -a "$out/BUNDLE.txt"
  if [ "${GPU_CHECK_JIT:-1}" = 0 ]; then
    echo "jit-check SKIPPED (GPU_CHECK_JIT=0): the no-autotune kernels have not run on lavapipe" | tee -a "$out/BUNDLE.txt"
  else
    scripts/jit-check.sh | tee -a "$out/BUNDLE.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
  fi
  device_command
}

# seed DIR: puts the kernel cache a call brought back (DIR/kernel-cache.tgz.NN, the files of
# its $OUT) beside the built bundle, so that the next call starts warm. The bundle travels to
# the GPU machine whole (60 MiB with the binaries): a cache too large for it goes without the
# driver's part (kcache/cuda, which the driver rebuilds from cubecl's PTX in seconds).
seed() {
  local from=$1 out tmp size
  cd "$here/.."
  out="${CARGO_TARGET_DIR:-target}/gpu-bundle"
  [ -d "$out/bin" ] || { echo "no bundle at $out: run $0 bundle first" >&2; return 1; }
  local pieces
  pieces=$(find "$from" -maxdepth 1 -name 'kernel-cache.tgz*' -type f | sort)
  [ -n "$pieces" ] || { echo "no kernel-cache.tgz pieces in $from" >&2; return 1; }
  # shellcheck disable=SC2086 # the pieces' names are ours: no spaces.
  whole_pieces $pieces || { echo "the pieces in $from are not a whole archive (a call cut short?): not seeded" >&2; return 1; }
  find "$out" -maxdepth 1 -name 'kernel-cache.tgz*' -delete
  # shellcheck disable=SC2086
  cp $pieces "$out/"
  size=$(du -sb "$out" | cut -f1)
  if [ "$size" -gt "$BUNDLE_MAX_BYTES" ]; then
    tmp=$(mktemp -d)
    cat "$out"/kernel-cache.tgz* | tar -xz -C "$tmp"
    find "$out" -maxdepth 1 -name 'kernel-cache.tgz*' -delete
    tar -czf - -C "$tmp" cubecl | split -b "$PIECE_BYTES" -d -a 2 - "$out/kernel-cache.tgz."
    rm -rf "$tmp"
    echo "the driver's kernel cache was left out: with it the bundle was $size bytes, over 60 MiB"
  fi
  check_bundle "$out"
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

# Refreshes results.tgz (every log; not the data, the store, the ledger or the cache) and the
# kernel cache's pieces in GPU_CHECK_OUT. The GPU machine brings back at most 8 files of 16 MiB,
# 64 MiB in all: summary.txt, parts.jsonl, results.tgz and at most PIECES_MAX pieces. A cache too
# large for them goes without the driver's part, then not at all, and the summary says so.
pack() {
  [ -n "$out_dir" ] && [ -d "$results" ] || return 0
  mkdir -p "$out_dir"
  put "$results/summary.txt" summary.txt
  [ -s "$results/parts.jsonl" ] && put "$results/parts.jsonl" parts.jsonl
  tar -czf "$out_dir/.results.tgz.tmp" -C "$results" --exclude=./kcache --exclude=./cuda --exclude=./job/data \
    --exclude=./job/store --exclude=./job/ledger . 2> /dev/null && mv -f "$out_dir/.results.tgz.tmp" "$out_dir/results.tgz"
  [ -d "$results/kcache" ] || return 0
  local stamp
  stamp=$(find "$results/kcache" -type f -printf '%s %p\n' 2> /dev/null | sort | md5sum) || stamp=unknown
  [ "$stamp" = "${packed_stamp:-}" ] && return 0
  # The pieces are made beside their final place (one file system, so each rename is atomic),
  # then renamed over the old ones; a set cut short by a kill fails the next call's check and
  # that call starts cold.
  local pieces="$out_dir/.pieces" what n=0 f
  for what in "cubecl cuda" cubecl; do
    rm -rf "$pieces" && mkdir -p "$pieces"
    # shellcheck disable=SC2086 # two fixed folder names
    if ! tar -czf - -C "$results/kcache" $what 2> /dev/null | split -b "$PIECE_BYTES" -d -a 2 - "$pieces/kernel-cache.tgz."; then
      note "the kernel cache could not be packed at $((SECONDS - started)) s: see the next call's cold start"
      n=0
      break
    fi
    n=$(find "$pieces" -type f | wc -l)
    [ "$n" -le "$PIECES_MAX" ] && break
    n=0
  done
  if [ "$n" -eq 0 ]; then
    echo "kernel cache at $((SECONDS - started)) s: $(du -sh "$results/kcache" | cut -f1), too large" >> "$results/env.txt"
    note "the kernel cache is too large to bring back in $PIECES_MAX pieces (results/env.txt has its size)"
  else
    if [ "$what" = cubecl ]; then
      note "the driver's kernel cache is left behind: cubecl's alone fits in $PIECES_MAX pieces"
    fi
    for f in "$pieces"/*; do mv -f "$f" "$out_dir/"; done
    # Old pieces past the new set's end.
    find "$out_dir" -maxdepth 1 -name 'kernel-cache.tgz.*' | sort | tail -n +$((n + 1)) | xargs -r rm -f
  fi
  rm -rf "$pieces"
  packed_stamp=$stamp
  put "$results/summary.txt" summary.txt
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

# The job's end, in the summary and published: its kernels are the worker's.
job_ended() {
  local status=$1 line=$2
  summary "$status" "$line; $(kernels "$work/worker.log")"
  stop_all
  publish job "$status" $((SECONDS - job_began)) "$work/job.json" "$work/worker.log"
}

job_failed() { job_ended FAILED "one-rank job on $device ($1)"; }

# job_step_failed RC WHAT NAME: a bounded step of the job ended RC: SKIPPED when the run's budget
# was spent before it, else FAILED with why and its error line.
job_step_failed() {
  if [ "$1" -eq 125 ]; then
    job_ended SKIPPED "one-rank job on $device (the run's ${RUN_BUDGET_S} s were spent before $2)"
  else
    job_failed "$2: $(why "$1" 30); $(cause "$results/$3.err")"
  fi
}

nccl_job() {
  device="${GPU_CHECK_DEVICE:-cuda:0}"
  local expect=nccl accountant coordinator id rc=0
  job_began=$SECONDS
  [ "$device" = cpu ] && expect=accountant
  work="$results/job"
  rm -rf "$work" && mkdir -p "$work"
  bounded 30 job-synth "$bin/dpctl" dataset synth --out "$work/data" --examples 480 --eval-examples 10 \
    || { job_step_failed $? "dataset synth" job-synth; return 0; }
  bounded 30 job-index "$bin/dpctl" dataset index --train-tokenizer "$work/data/train" \
    || { job_step_failed $? "dataset index" job-index; return 0; }
  start accountant "$bin/dpcap-accountant" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --ledger "$work/ledger" --addr-file "$work/accountant.addr"
  wait_addr accountant || { job_failed "$(cat "$work/why.txt")"; return 0; }
  accountant=$addr
  # The data's owner budgets the dataset before any job may spend it. The job's ε = 8 is at
  # δ = 1/N; its 5 steps cost ε ≈ 14.9 at the budget's δ = 1e-5, so the budget is 20.
  bounded 30 job-budget "$bin/dpctl" dataset budget set "$work/data/train" --epsilon 20 --delta 1e-5 \
    --reason "gpu check" --accountant "$accountant" \
    || { job_step_failed $? "dataset budget set" job-budget; return 0; }
  start coordinator "$bin/dpcap-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --store "$work/store" --accountant "$accountant" --addr-file "$work/coordinator.addr"
  wait_addr coordinator || { job_failed "$(cat "$work/why.txt")"; return 0; }
  coordinator=$addr
  # One GPU: NCCL talks to itself over loopback; its INFO log stays with the results.
  start worker env RUST_LOG="${RUST_LOG:-info,cubecl_cuda=trace}" NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$work/nccl.%p.log" \
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
    || { job_step_failed $? "submit" job-submit; return 0; }
  id=$(sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' "$results/job-submit.out" | head -1)
  # The worker compiles every bf16 kernel the warm-up did not: JOB_WAIT_S covers a cold cache
  # with room; on a CPU worker the same bound holds. `timeout 0` would mean no bound at all.
  local limit
  limit=$(bound "$JOB_WAIT_S")
  [ "$limit" -ge 3 ] || { job_step_failed 125 "dpctl wait" job-wait; return 0; }
  timeout --kill-after=5 "$limit" "$bin/dpctl" --coordinator "$coordinator" wait "$id" \
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
    job_ended ok "one-rank job on $device (5 steps, bf16, reduction $expect) in $((SECONDS - job_began)) s"
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
  # A machine kept warm between calls keeps /tmp: this call's results start empty.
  mkdir -p "$results" && : > "$results/summary.txt" && : > "$results/parts.jsonl"
  find_cuda
  kernel_cache
}

# Bounds of the parts, in seconds, for a cold cache (estimates from the kernels each compiles:
# docs/gpu.md). The warm-up compiles the job's micro-batch kernels, so the job mostly loads them;
# base-bf16 gets what is left less RESERVE_S, so at least one later part runs; each later part
# gets what is left, up to REST_S.
WARM_S=150
JOB_WAIT_S=200
RESERVE_S=60
REST_S=150

# Seconds left of the run's budget.
left() { echo $((RUN_BUDGET_S - (SECONDS - started))); }

# Whether part $1 is in GPU_CHECK_PARTS (every part when unset).
wanted() { case " ${GPU_CHECK_PARTS:-$1} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# clip NAME MODEL BATCH PRECISION LIMIT RUNS [ARGS...]: one `bench clip` on the device, verified,
# with each kernel cubecl-cuda compiles logged (timestamped) in its stderr.
clip() {
  local name=$1 model=$2 batch=$3 precision=$4 limit=$5 runs=$6 peak=494
  shift 6
  wanted "$name" || return 0
  [ "$precision" = bf16 ] && peak=989
  check "$limit" "$name" "clip $model $precision batch $batch on $device, no autotune (verified against cpu f32)" \
    env RUST_LOG="${RUST_LOG:-warn,cubecl_cuda=trace}" "$bin/dpctl" bench clip --model "$model" --batch "$batch" \
    --device "$device" --precision "$precision" --runs "$runs" --skip-naive --verify --peak-tflops "$peak" --json "$@"
}

run() {
  prepare
  device="${GPU_CHECK_DEVICE:-cuda:0}"
  bounded 15 gpu nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  cp "$results/gpu.out" "$results/gpu.txt" 2> /dev/null || true
  date -u +%FT%TZ > "$results/date.txt"
  if wanted preflight; then
    check 30 preflight "worker preflight on $device (results/preflight.out)" \
      "$bin/dpcap-worker" preflight --device "$device" --json
  fi
  clip warm micro 16 bf16 "$WARM_S" 1
  if wanted job; then nccl_job; fi
  clip base-bf16 base 8 bf16 $(($(left) - RESERVE_S)) 3
  clip bench-f32 bench 64 f32 "$REST_S" 1
  clip tiny-f32 tiny 16 f32 "$REST_S" 1
  clip base-f32 base 8 f32 "$REST_S" 1
  clip bench-bf16 bench 64 bf16 "$REST_S" 1
  clip tiny-bf16 tiny 16 bf16 "$REST_S" 1
  if wanted mae-bench; then
    check "$REST_S" mae-bench "mae bench on $device, no autotune" env RUST_LOG="${RUST_LOG:-warn,cubecl_cuda=trace}" \
      "$bin/dpctl" bench clip --model bench --objective mae --batch 64 --device "$device" --runs 1 --json
  fi
  echo "run took $((SECONDS - started)) s" | tee "$results/took.txt"
  ! grep -qE '^(FAILED|SKIPPED)' "$results/summary.txt"
}

case "${1:-}" in
  bundle) bundle ;;
  check-bundle) check_bundle "${2:?usage: $0 check-bundle DIR}" ;;
  device-command) device_command ;;
  seed) seed "${2:?usage: $0 seed DIR (the kernel-cache.tgz.NN pieces a call brought back)}" ;;
  run) run ;;
  run-job)
    prepare
    nccl_job
    ! grep -qE '^(FAILED|SKIPPED)' "$results/summary.txt"
    ;;
  *)
    echo "usage: $0 bundle|check-bundle DIR|seed DIR|device-command|run|run-job"
    exit 2
    ;;
esac
