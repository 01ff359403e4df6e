#!/usr/bin/env bash
# DP-Cap's regime in miniature: many more examples than the demo, large expected batches,
# epsilon 8, and the evaluation suite of the DP model beside the random init (and, with
# BASELINE=1, beside the NOT PRIVATE baseline: twice the time). One `dpctl demo` run.
#
#   scripts/utility-bench.sh                                  # N 200,000, L 10,000, 300 steps: ~60 min on 2 cores
#   EXAMPLES=200000 BATCH=4000 STEPS=300 scripts/utility-bench.sh   # ~18 min on 2 cores
#   BASELINE=1 scripts/utility-bench.sh
#
# Prints a Markdown table and writes target/utility-bench/report.json.
set -euo pipefail
cd "$(dirname "$0")/.."
examples=${EXAMPLES:-200000}
batch=${BATCH:-10000}
steps=${STEPS:-300}
epsilon=${EPSILON:-8}
out=target/utility-bench
baseline=()
[ "${BASELINE:-0}" = 1 ] || baseline=(--no-baseline)
cargo build -q --release -p dpctl
rm -rf "$out/data"
target/release/dpctl demo --dir "$out" "${baseline[@]}" --examples "$examples" --batch-size "$batch" \
  --steps "$steps" --epsilon "$epsilon" > "$out.json" 2> "$out.log"
cp "$out.json" "$out/report.json"
python3 - "$out.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
models = [m for m in ("dp", "nonprivate", "random") if f"zero_shot_{m}" in r]
print(f"N = {r['delta'] and round(1 / r['delta'])}, L = {r['sample_rate'] * round(1 / r['delta']):.0f}, {r['steps']} steps, "
      f"sigma {r['noise_multiplier']:.3f}, epsilon {r['epsilon_spent']:.3f} at delta {r['delta']:.1e}, {r['wall_s'] / 60:.0f} min")
print("| metric | " + " | ".join(models) + " |")
print("|---|" + "---|" * len(models))
for key, name in [("zero_shot", "zero-shot (12 classes)"), ("aro_relation", "ARO relation (object swap)"),
                  ("aro_attribution", "ARO attribution (colour swap)"), ("layout", "layout"),
                  ("probe_accuracy", "linear probe"), ("few_shot_10", "10-shot probe")]:
    print(f"| {name} | " + " | ".join(f"{100 * r[f'{key}_{m}']:.1f} %" for m in models) + " |")
PY
