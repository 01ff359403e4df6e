//! What one release costs: CPU-seconds per GB of gradient released through a real accountant on
//! loopback (one rank, noise drawn ahead), and each phase alone, side by side in one run.
//! Run: `cargo bench -p dpcap-accountant --features bench --bench release` (P from `PARAMS`, default 50M; timed
//! releases from `STEPS`, untimed ones first from `WARMUP`; `dpctl bench scale` runs the same
//! at the paper's P = 190M).

use dpcap_accountant::cost::{self, CostOptions, Writer};
use dpcap_privacy::recipes::DP_CAP;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), cost::BenchError> {
    let params = env_or("PARAMS", 50_000_000);
    let dir = tempfile::tempdir()?;
    let opts = CostOptions {
        params,
        examples: DP_CAP.examples,
        batch: DP_CAP.batch,
        steps: env_or("STEPS", 3),
        warmup: env_or("WARMUP", cost::WARMUP_STEPS),
        writer: Writer::Synced,
    };
    let release = cost::measure(&opts, &dir.path().join("release")).await?;
    let parts = cost::breakdown(usize::try_from(params)?, &dir.path().join("breakdown")).await?;
    println!(
        "release of P = {params} f32 ({:.2} GB), W = 1, median of {} steps",
        4.0 * params as f64 / 1e9,
        opts.steps
    );
    println!(
        "  wall {:.3} s, first chunk {:.3} s, stored {:.3} s",
        release.release_s, release.release_first_chunk_s, release.release_stored_s
    );
    println!("  CPU-s per GB released      {:>6.3}", release.release_cpu_s_per_gb);
    println!("    check (copy, finite, hash) {:>4.3}", parts.check_cpu_s_per_gb);
    println!("    noise add                {:>6.3}", parts.noise_add_cpu_s_per_gb);
    println!("    encode                   {:>6.3}", parts.encode_cpu_s_per_gb);
    println!("    store (write, fsync)     {:>6.3}", parts.store_cpu_s_per_gb);
    println!("    transport and the rest   {:>6.3}", parts.transport_cpu_s_per_gb(&release));
    Ok(())
}
