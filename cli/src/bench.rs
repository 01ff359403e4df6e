//! `dpctl bench privacy`: how long the accountants take on the DP-Cap recipe. Compare against
//! Google's dp-accounting with `scripts/bench-privacy.sh`, which runs both side by side.

use std::time::Instant;

use anyhow::Result;
use clap::Subcommand;
use dpcap_privacy::recipes::DP_CAP;
use dpcap_privacy::{self as privacy, AccountantKind};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Time one step: non-private, naive per-example, and the ClipEngine.
    Clip(crate::bench_clip::ClipBench),
    /// Peak RSS of one rank streaming its share of a step (run for two share sizes).
    Share(crate::bench_share::ShareBench),
    /// The image pipeline's throughput on a directory of images (one core and every core).
    Images(crate::bench_images::ImagesBench),
    /// One paper-scale step without GPU compute: index, layout, sample, split, release.
    Scale(crate::bench_scale::ScaleBench),
    /// A sweep on one budgeted dataset: admission, step and budget-check cost, replay and memory.
    Budget(crate::bench_budget::BudgetBench),
    /// Time PLD and RDP epsilon for the DP-Cap recipe (median of --runs).
    Privacy {
        /// Timed runs per accountant (after one warm-up).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn median_seconds(runs: usize, mut f: impl FnMut() -> f64) -> (f64, f64) {
    let value = f(); // warm-up
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], value)
}

/// Runs one benchmark.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Clip(opts) => crate::bench_clip::run(opts)?,
        BenchCommand::Share(opts) => crate::bench_share::run(opts)?,
        BenchCommand::Scale(opts) => crate::bench_scale::run(opts)?,
        BenchCommand::Budget(opts) => crate::bench_budget::run(opts)?,
        BenchCommand::Images(opts) => crate::bench_images::run(opts)?,
        BenchCommand::Privacy { runs, json } => {
            let segment = DP_CAP.segment();
            let delta = DP_CAP.delta();
            let eps = |kind| privacy::epsilon(kind, &[segment], delta).expect("valid recipe");
            let (pld_s, pld_eps) = median_seconds(runs, || eps(AccountantKind::Pld));
            let (rdp_s, rdp_eps) = median_seconds(runs, || eps(AccountantKind::Rdp));
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            if json {
                outln!(
                    "{}",
                    json!({"recipe": "dp-cap", "sample_rate": segment.sample_rate, "noise_multiplier": 0.728, "steps": 5708,
                           "delta": delta, "pld_epsilon": pld_eps, "pld_s": pld_s, "rdp_epsilon": rdp_eps, "rdp_s": rdp_s, "threads": threads})
                );
            } else {
                outln!(
                    "DP-Cap recipe: q = {:.6}, sigma = 0.728, 5708 steps, delta = 1/N ({threads} threads)",
                    segment.sample_rate
                );
                outln!("  pld: epsilon {pld_eps:.5} in {:.1} ms (median of {runs})", pld_s * 1e3);
                outln!("  rdp: epsilon {rdp_eps:.5} in {:.3} ms (median of {runs})", rdp_s * 1e3);
            }
        }
    }
    Ok(())
}
