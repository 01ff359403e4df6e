//! `dpctl bench budget`: a sweep on one budgeted dataset through a real accountant on loopback
//! (`dpcap_accountant::budget`): each job admitted, run and closed one after another, then the
//! ledger replayed and one more step's budget check timed by reservation, by the RDP bound and
//! by the exact composition. Run at the demo's σ and at a lower one, where PLD costs more.

use anyhow::Result;
use clap::Args;
use dpcap_accountant::budget::{self, SweepCost, SweepOptions};
use dpcap_privacy::{AccountantKind, noise_multiplier};
use serde_json::json;

/// The demo's job: batch 1500 of 20,000 examples, 150 steps at ε 8, δ = 1/N (each sweep job's
/// target is the demo's ε 8).
const DEMO: (f64, u64, f64, f64) = (1500.0 / 20_000.0, 150, 8.0, 1.0 / 20_000.0);

/// Options of `dpctl bench budget`.
#[derive(Debug, Args)]
pub struct BudgetBench {
    /// Jobs submitted one after another to the one dataset.
    #[arg(long, default_value_t = 100)]
    jobs: u64,
    /// Steps each job plans and runs.
    #[arg(long, default_value_t = 3)]
    steps: u64,
    /// The lower σ, run after the demo's (0 skips it).
    #[arg(long, default_value_t = 0.6, allow_negative_numbers = true)]
    low_sigma: f64,
    /// Each job its own σ (σ · (1 + i/1000)): a history of as many mechanisms as jobs.
    #[arg(long)]
    distinct: bool,
    /// The dataset's lifetime ε at δ = 1/N: large enough for every job of the sweep.
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true)]
    budget: f64,
    /// Print one JSON object per σ.
    #[arg(long)]
    json: bool,
}

/// Runs the sweep at the demo's σ and at `--low-sigma`.
pub fn run(opts: BudgetBench) -> Result<()> {
    if opts.jobs == 0 || opts.steps == 0 {
        anyhow::bail!("--jobs and --steps must be at least 1");
    }
    let (q, steps, epsilon, delta) = DEMO;
    let demo_sigma = noise_multiplier(AccountantKind::Pld, q, steps, epsilon, delta)?;
    let mut sigmas = vec![("demo", demo_sigma)];
    if opts.low_sigma > 0.0 {
        sigmas.push(("low", opts.low_sigma));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for (name, sigma) in sigmas {
        let sweep = SweepOptions {
            jobs: opts.jobs,
            steps: opts.steps,
            sample_rate: q,
            noise_multiplier: sigma,
            distinct: opts.distinct,
            delta,
            budget: opts.budget,
            target: epsilon,
        };
        let dir = tempfile::tempdir()?;
        let cost = runtime.block_on(budget::measure(&sweep, dir.path())).map_err(|e| anyhow::anyhow!("{e}"))?;
        report(&opts, name, &sweep, &cost);
    }
    Ok(())
}

fn report(opts: &BudgetBench, name: &str, sweep: &SweepOptions, cost: &SweepCost) {
    if opts.json {
        let mut value = json!({"sigma_name": name, "sigma": sweep.noise_multiplier, "sample_rate": sweep.sample_rate,
            "jobs": sweep.jobs, "steps": sweep.steps, "distinct": sweep.distinct, "budget": sweep.budget});
        if let (Some(object), Ok(serde_json::Value::Object(measured))) =
            (value.as_object_mut(), serde_json::to_value(cost))
        {
            object.extend(measured);
        }
        outln!("{value}");
        return;
    }
    let ms = |s: f64| s * 1e3;
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    outln!(
        "{} jobs of {} steps at sigma {:.4} ({name}), q = {}, {} mechanism(s), budget epsilon {}: spent {:.3}",
        sweep.jobs,
        sweep.steps,
        sweep.noise_multiplier,
        sweep.sample_rate,
        if sweep.distinct { sweep.jobs } else { 1 },
        sweep.budget,
        cost.epsilon_spent
    );
    outln!(
        "  admission: median {:.1} ms, worst {:.1} ms, median of the last 10 {:.1} ms",
        ms(cost.admission_median_s),
        ms(cost.admission_worst_s),
        ms(cost.admission_last10_median_s)
    );
    outln!(
        "  step (part to release): median {:.1} ms over the first 10 jobs, {:.1} ms over the last 10",
        ms(cost.step_first10_median_s),
        ms(cost.step_last10_median_s)
    );
    outln!(
        "  budget check of one more step: {:.3} ms by reservation, {:.3} ms by the RDP bound, {:.1} ms exact (PLD)",
        ms(cost.check_reservation_s),
        ms(cost.check_bound_s),
        ms(cost.check_composition_s)
    );
    outln!(
        "  memory: +{:.1} MiB over the sweep, +{:.1} MiB of it after the 10th job; replay of the ledger {:.2} s, +{:.1} MiB",
        mib(cost.sweep_rss_growth_bytes),
        mib(cost.history_rss_growth_bytes),
        cost.replay_s,
        mib(cost.replay_rss_growth_bytes)
    );
}
