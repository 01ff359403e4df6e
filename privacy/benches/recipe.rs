//! ε of the DP-Cap recipe by PLD and by RDP, timed (medians of `RUNS`, default 5, after a first
//! call that is reported apart as `*_first_s`), printed as one JSON object:
//! `scripts/bench-privacy.sh` runs it beside Google's dp-accounting. `dpctl bench privacy`
//! measures the same in the shipped binary; this target builds without the rest of the
//! workspace, in about a minute.

use std::time::Instant;

use dpcap_privacy::AccountantKind;
use dpcap_privacy::recipes::DP_CAP;

fn main() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(5).max(1);
    let (segment, delta) = (DP_CAP.segment(), DP_CAP.delta());
    let mut report = serde_json::json!({
        "recipe": "dp-cap", "sample_rate": segment.sample_rate, "noise_multiplier": segment.noise_multiplier,
        "steps": segment.steps, "delta": delta, "runs": runs,
    });
    for kind in [AccountantKind::Pld, AccountantKind::Rdp] {
        let epsilon = || dpcap_privacy::epsilon(kind, &[segment], delta).expect("the recipe is valid");
        // The first call also plans its FFT lengths (cached for the calls after it).
        let started = Instant::now();
        let value = epsilon();
        report[format!("{kind}_first_s")] = started.elapsed().as_secs_f64().into();
        let mut seconds: Vec<f64> = (0..runs)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(epsilon());
                started.elapsed().as_secs_f64()
            })
            .collect();
        seconds.sort_by(f64::total_cmp);
        report[format!("{kind}_epsilon")] = value.into();
        report[format!("{kind}_s")] = seconds[seconds.len() / 2].into();
    }
    println!("{report}");
}
