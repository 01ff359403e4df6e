#!/usr/bin/env bash
# DP-Cap's central ablation in miniature: at a fixed epsilon, expected batch sizes spanning 8x
# with sigma recalibrated for each, and the same compute budget in examples (batch x steps), then
# the evaluation suite of each DP model beside the random init. DP-Cap's claim: larger batches
# win at fixed epsilon. Each point is a `dpctl demo --no-baseline` run (about 2-5 min on 2 cores).
#
#   scripts/ablation.sh                      # batches 375 750 1500 3000, 225,000 examples each
#   BATCHES="750 3000" EXAMPLES_SEEN=450000 EPSILON=8 scripts/ablation.sh
#
# Prints a Markdown table and writes target/ablation/ablation.json.
set -euo pipefail
cd "$(dirname "$0")/.."
batches=${BATCHES:-"375 750 1500 3000"}
seen=${EXAMPLES_SEEN:-225000}
epsilon=${EPSILON:-8}
out=target/ablation
mkdir -p "$out"
cargo build -q --release -p dpctl
for b in $batches; do
  steps=$(( seen / b ))
  echo "batch $b, $steps steps, epsilon $epsilon" >&2
  target/release/dpctl demo --dir "$out/b$b" --no-baseline --batch-size "$b" --steps "$steps" \
    --epsilon "$epsilon" > "$out/b$b.json" 2> "$out/b$b.log"
done
python3 - "$out" $batches <<'PY'
import json, sys
out, batches = sys.argv[1], sys.argv[2:]
rows = []
for b in batches:
    r = json.load(open(f"{out}/b{b}.json"))
    rows.append({"batch": int(b), "steps": r["steps"], "sigma": r["noise_multiplier"], "epsilon": r["epsilon_spent"],
                 **{k: r[f"{k}_dp"] for k in ("zero_shot", "aro_relation", "aro_attribution", "layout", "probe_accuracy")},
                 "zero_shot_random": r["zero_shot_random"], "wall_s": r["wall_s"]})
json.dump(rows, open(f"{out}/ablation.json", "w"), indent=1)
print("| batch L | steps | sigma | epsilon | zero-shot | ARO relation | ARO attribution | layout | linear probe | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['batch']} | {r['steps']} | {r['sigma']:.3f} | {r['epsilon']:.3f} | {100*r['zero_shot']:.1f} % | "
          f"{100*r['aro_relation']:.1f} % | {100*r['aro_attribution']:.1f} % | {100*r['layout']:.1f} % | "
          f"{100*r['probe_accuracy']:.1f} % | {r['wall_s']:.0f} |")
print(f"random init: zero-shot {100*rows[0]['zero_shot_random']:.1f} %, contrasts 50 % (chance)")
PY
