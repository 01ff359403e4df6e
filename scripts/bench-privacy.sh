#!/usr/bin/env bash
# Side by side, in one run: epsilon for the DP-Cap recipe with dpcap's accountants
# (`dpctl bench privacy`) and with Google's dp-accounting (PLD, discretisation 1e-4, and RDP),
# then the speed ratios. Installs dp-accounting into target/bench-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
venv=target/bench-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q dp-accounting==0.6.0
fi
# The privacy crate's own bench target: the same math as `dpctl bench privacy`, built in
# about a minute instead of the whole workspace in release.
ours=$(RUNS="$runs" cargo bench -q -p dpcap-privacy --bench recipe)
theirs=$("$venv/bin/python" - "$runs" <<'PY'
import json, statistics, sys, time
import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
runs = int(sys.argv[1])
n, b, sigma, steps = 233804767, 1310720, 0.728, 5708
q, delta = b / n, 1 / n
event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
def pld():
    return pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(delta)
orders = [1 + x / 10 for x in range(1, 100)] + list(range(11, 64))
def rdp():
    return rdp_privacy_accountant.RdpAccountant(orders).compose(event).get_epsilon(delta)
def timed(f):
    value = f()
    times = []
    for _ in range(runs):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return statistics.median(times), value
pld_s, pld_eps = timed(pld)
rdp_s, rdp_eps = timed(rdp)
print(json.dumps({"pld_s": pld_s, "pld_epsilon": pld_eps, "rdp_s": rdp_s, "rdp_epsilon": rdp_eps}))
PY
)
python3 - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"DP-Cap recipe: q = {ours['sample_rate']:.6f}, sigma 0.728, 5708 steps, delta = 1/N; medians of runs")
print(f"{'':14}{'dpcap':>22}{'dp-accounting 0.6.0':>26}{'speed-up':>10}")
for k in ("pld", "rdp"):
    o, t = ours[k + "_s"], theirs[k + "_s"]
    print(f"{k:14}{o*1e3:>12.2f} ms eps {ours[k+'_epsilon']:.5f}{t*1e3:>14.2f} ms eps {theirs[k+'_epsilon']:.5f}{t/o:>9.1f}x")
print(f"dpcap's first call (it also plans the FFT lengths, then cached): pld {ours['pld_first_s']*1e3:.2f} ms")
PY
