"""ε of mixed histories (many jobs' segments on one dataset) by Google's dp-accounting, for
`privacy/tests/accounting_history.rs`: each history composed segment by segment, as
dp-accounting's own accountants compose a sequence of events, with PLD (pessimistic estimate,
value discretisation 1e-4, as dpcap's grid) and RDP (dp-accounting's default orders).

    python3 -m venv target/dpa-venv && target/dpa-venv/bin/pip install dp-accounting==0.6.0
    target/dpa-venv/bin/python reference/history_vectors.py > privacy/tests/data/history_vectors.json
"""

import importlib.metadata
import json

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

# (q, sigma, steps) per job, in submission order: a sweep repeats a setting, a tuning run varies
# it; the demo's mechanism (batch 1500 of 20000) at the demo's and at a lower sigma.
HISTORIES = {
    "sweep of one setting, 20 jobs": [(0.075, 1.1, 150)] * 20,
    "sweep over sigma, 12 jobs": [(0.075, s, 60) for s in (0.8, 0.9, 1.0, 1.1, 1.2, 1.4)] * 2,
    "mixed rates and sigmas": [(0.01, 0.9, 400), (0.075, 1.1, 150), (0.01, 0.9, 200), (0.0012, 2.0, 3), (0.3, 3.0, 40)],
    "low sigma": [(0.075, 0.6, 30), (0.075, 0.7, 30), (0.075, 0.6, 20)],
}
DELTA = 1 / 20000


def epsilon(accountant, history):
    for q, sigma, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        accountant.compose(event, steps)
    return accountant.get_epsilon(DELTA)


rows = []
for name, history in HISTORIES.items():
    pld = epsilon(pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4), history)
    rdp = epsilon(rdp_privacy_accountant.RdpAccountant(), history)
    segments = [{"q": q, "sigma": s, "steps": n} for q, s, n in history]
    rows.append({"name": name, "delta": DELTA, "segments": segments, "pld": pld, "rdp": rdp})

print(json.dumps({"dp_accounting": importlib.metadata.version("dp-accounting"), "histories": rows}, indent=1))
