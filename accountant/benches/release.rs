//! What one release costs: CPU-seconds per GB of gradient released through a real accountant
//! (one rank, noise drawn ahead), over the same-host socket and over gRPC on loopback, each
//! phase alone, and one memcpy of the same bytes, side by side in one run.
//! Run: `cargo bench -p dpcap-accountant --features bench --bench release` (P from `PARAMS`,
//! default 50M; timed releases from `STEPS`, default 5, untimed ones first from `WARMUP`;
//! `ONLY_LOCAL=1` times the same-host path alone, for a profile; `ONLY_BREAKDOWN=1` prints the
//! phases alone, as JSON;
//! `dpctl bench scale` runs the same at the paper's P = 190M).

use dpcap_accountant::cost::{self, CostOptions, Transport, Writer};
use dpcap_privacy::recipes::DP_CAP;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), cost::BenchError> {
    let params = env_or("PARAMS", 50_000_000);
    let dir = tempfile::tempdir()?;
    let mut opts = CostOptions {
        params,
        examples: DP_CAP.examples,
        batch: DP_CAP.batch,
        steps: env_or("STEPS", 5),
        warmup: env_or("WARMUP", cost::WARMUP_STEPS),
        writer: Writer::Synced,
        transport: Transport::Local,
    };
    if std::env::var("ONLY_BREAKDOWN").is_ok() {
        let parts = cost::breakdown(usize::try_from(params)?, &dir.path().join("breakdown")).await?;
        println!("{}", serde_json::to_string(&parts)?);
        return Ok(());
    }
    let local = cost::measure(&opts, &dir.path().join("local")).await?;
    if std::env::var("ONLY_LOCAL").is_ok() {
        println!(
            "same-host: {:.3} CPU-s per GB, {:.3} s; each {:?}; noise late by up to {:.2} s",
            local.release_cpu_s_per_gb, local.release_s, local.release_cpu_s_per_gb_each, local.release_noise_late_s
        );
        return Ok(());
    }
    opts.transport = Transport::Grpc;
    let grpc = cost::measure(&opts, &dir.path().join("grpc")).await?;
    let parts = cost::breakdown(usize::try_from(params)?, &dir.path().join("breakdown")).await?;
    let copy = cost::memcpy_reference(usize::try_from(params)?);
    println!(
        "release of P = {params} f32 ({:.2} GB), W = 1, median of {} steps after {} untimed",
        4.0 * params as f64 / 1e9,
        opts.steps,
        opts.warmup
    );
    println!("                               same-host    grpc");
    let row = |name: &str, a: f64, b: f64| println!("  {name:<28} {a:>9.3} {b:>7.3}");
    row("wall s", local.release_s, grpc.release_s);
    row("first data s", local.release_first_chunk_s, grpc.release_first_chunk_s);
    row("stored s", local.release_stored_s, grpc.release_stored_s);
    row("CPU-s per GB released", local.release_cpu_s_per_gb, grpc.release_cpu_s_per_gb);
    row("  check", parts.check_in_place_cpu_s_per_gb, parts.check_cpu_s_per_gb);
    row("  noise add", parts.noise_add_cpu_s_per_gb, parts.noise_add_cpu_s_per_gb);
    row("  encode", 0.0, parts.encode_cpu_s_per_gb);
    row("  store (write, fsync)", parts.store_cpu_s_per_gb, parts.store_cpu_s_per_gb);
    row(
        "  transport and the rest",
        parts.transport_cpu_s_per_gb(&local, Transport::Local),
        parts.transport_cpu_s_per_gb(&grpc, Transport::Grpc),
    );
    let each =
        |r: &cost::ReleaseCost| r.release_cpu_s_per_gb_each.iter().map(|c| format!("{c:.2}")).collect::<Vec<_>>();
    println!("  each release, CPU-s per GB: same-host {:?}, grpc {:?}", each(&local), each(&grpc));
    println!(
        "  memcpy: {:.2} GB/s, {:.3} CPU-s per GB (one core)",
        copy.memcpy_bytes_per_s / 1e9,
        copy.memcpy_cpu_s_per_gb
    );
    Ok(())
}
