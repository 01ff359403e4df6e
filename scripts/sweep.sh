#!/usr/bin/env bash
# A hyperparameter sweep on one budgeted dataset, as a platform team runs one: the README tour's
# cluster (release binaries: an accountant, a coordinator and WORKERS workers on 127.0.0.1:7070
# and 7071), a budget of epsilon 1000, and JOBS `micro` jobs (epsilon 2, batch 24, 3 steps, one
# worker each) submitted one after another. Prints each submit's latency (median, worst), the
# submits that failed, the jobs' outcomes, the accountant's RSS and CPU-seconds, and how its
# budget checks were decided. Logs and data stay under target/sweep/.
# Usage: scripts/sweep.sh [JOBS=100] [WORKERS=4]. Run it alone: it uses the tour's ports.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-100}
workers=${2:-4}
out=$PWD/target/sweep
rm -rf "$out" && mkdir -p "$out"
cargo build --release -p dpctl -p dpcap-accountant -p dpcap-coordinator -p dpcap-worker
bin=$PWD/target/release
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

"$bin/dpctl" dataset synth --out "$out/data" --examples 20000 > "$out/synth.log"
"$bin/dpctl" dataset index --train-tokenizer "$out/data/train" > "$out/index.log"
"$bin/dpcap-accountant" --ledger "$out/ledger" --metrics-listen 127.0.0.1:0 --addr-file "$out/accountant.addr" \
  > "$out/accountant.log" 2>&1 &
accountant=$!
pids+=("$accountant")
"$bin/dpcap-coordinator" --store "$out/store" --accountant http://127.0.0.1:7070 > "$out/coordinator.log" 2>&1 &
pids+=($!)
for i in $(seq 1 "$workers"); do
  "$bin/dpcap-worker" --coordinator http://127.0.0.1:7071 > "$out/worker-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do [ -s "$out/accountant.addr" ] && break; sleep 0.2; done
metrics=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"])' "$out/accountant.addr")
for _ in $(seq 1 100); do
  "$bin/dpctl" dataset budget set "$out/data/train" --epsilon 1000 --delta 5e-5 --name sweep \
    > "$out/budget.log" 2>&1 && break
  sleep 0.5
done
cat > "$out/sweep.yaml" <<'SPEC'
name: sweep
dataset: data/train
model: micro
objective: caption
epsilon: 2
batch_size: 24
steps: 3
clipping_norm: 1.0
learning_rate: 3.0e-3
micro_batch: 24
workers: 1
augment: center_crop
accountant: pld
SPEC

started=$(date +%s.%N)
: > "$out/submits.txt"
for i in $(seq 1 "$jobs"); do
  t0=$(date +%s.%N)
  if job=$("$bin/dpctl" submit --json "$out/sweep.yaml" 2>> "$out/submit-errors.log"); then
    id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])' <<< "$job")
    echo "ok $(echo "$(date +%s.%N) - $t0" | bc) $id" >> "$out/submits.txt"
  else
    echo "failed $(echo "$(date +%s.%N) - $t0" | bc) -" >> "$out/submits.txt"
  fi
done
outcomes=()
while read -r status _ id; do
  [ "$status" = ok ] || continue
  code=0
  "$bin/dpctl" wait "$id" > /dev/null 2>&1 || code=$?
  outcomes+=("$code")
done < "$out/submits.txt"
elapsed=$(echo "$(date +%s.%N) - $started" | bc)
rss_kb=$(awk '/VmRSS/ {print $2}' "/proc/$accountant/status")
cpu_s=$(awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$accountant/stat")
curl -s "http://$metrics/metrics" | grep '^dpcap_dataset_budget_checks_total' > "$out/checks.txt" || true
python3 - "$out" "$elapsed" "$rss_kb" "$cpu_s" "${outcomes[@]}" <<'PY'
import statistics, sys
out, elapsed, rss_kb, cpu_s, *codes = sys.argv[1:]
rows = [line.split() for line in open(f"{out}/submits.txt")]
ok = [float(r[1]) for r in rows if r[0] == "ok"]
failed = [r for r in rows if r[0] == "failed"]
names = {"0": "SUCCEEDED", "3": "FAILED", "4": "CANCELLED", "5": "BUDGET_EXHAUSTED"}
counts = {}
for c in codes:
    counts[names.get(c, f"exit {c}")] = counts.get(names.get(c, f"exit {c}"), 0) + 1
print(f"{len(rows)} submits: {len(ok)} accepted, {len(failed)} failed; submit latency median "
      f"{statistics.median(ok) * 1e3:.0f} ms, worst {max(ok) * 1e3:.0f} ms, median of the last 10 "
      f"{statistics.median(ok[-10:]) * 1e3:.0f} ms" if ok else f"{len(rows)} submits, none accepted")
print(f"outcomes: {counts}; all ended {float(elapsed):.0f} s after the first submit")
print(f"accountant: RSS {int(rss_kb) / 1024:.0f} MiB, {cpu_s} CPU-s")
for line in open(f"{out}/checks.txt"):
    print("  " + line.strip())
sys.exit(1 if failed or set(codes) != {"0"} else 0)
PY
