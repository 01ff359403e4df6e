"""Reference values for `privacy/src/audit.rs` from JAX Privacy's one-run auditor.

Prints, for a grid of (canaries, guesses, correct, significance, delta), the ε lower bounds of
`jax_privacy.auditing` (Steinke et al. 2023, and its f-DP variant), as the JSON fixture
`privacy/tests/data/audit_vectors.json`:

    python3 -m venv target/audit-venv && target/audit-venv/bin/pip install jax-privacy
    target/audit-venv/bin/python reference/audit_vectors.py > privacy/tests/data/audit_vectors.json
"""

import importlib.metadata
import json

from jax_privacy import auditing

CASES = [
    # (canaries, guesses, correct, significance, delta)
    (1000, 100, 100, 0.05, 0.0),
    (1000, 100, 100, 0.05, 1e-5),
    (1000, 100, 90, 0.05, 1e-5),
    (1000, 200, 150, 0.05, 1e-5),
    (1000, 100, 60, 0.05, 1e-5),
    (1000, 100, 50, 0.05, 1e-5),
    (10000, 1000, 1000, 0.05, 1e-5),
    (10000, 1000, 800, 0.05, 1e-6),
    (10000, 2000, 1300, 0.05, 1e-5),
    (500, 50, 48, 0.01, 1e-4),
    (256, 256, 200, 0.05, 1e-5),
    (100, 20, 20, 0.05, 0.0),
]

rows = []
for m, r, v, significance, delta in CASES:
    rows.append({
        "canaries": m, "guesses": r, "correct": v, "significance": significance, "delta": delta,
        "p_value_at_eps_1": float(auditing._one_run_p_value(m, r, v, 1.0, delta)),
        "epsilon_lower_bound": float(auditing._epsilon_one_run(0.0, m, r, v, significance, delta)),
        "epsilon_lower_bound_fdp": float(auditing._epsilon_one_run_fdp(0.0, m, r, v, significance, delta))
        if delta > 0 else None,
    })
print(json.dumps({"jax_privacy": importlib.metadata.version("jax-privacy"), "cases": rows}, indent=1))
