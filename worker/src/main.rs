//! The `dpcap-worker` binary: one rank, on CPU (burn-flex) or CUDA (feature `cuda`).

use anyhow::{Result, bail};
use clap::Parser;
use dpcap_ml::clip::Precision;
use dpcap_serve::ClientTlsArgs;
use dpcap_serve::process::{init_tracing, shutdown_signal};
use dpcap_worker::runtime::{WorkerConfig, run};

/// dpcap's worker.
#[derive(Debug, Parser)]
#[command(name = "dpcap-worker", version, about)]
struct Args {
    /// The coordinator's gRPC endpoint.
    #[arg(long, default_value = "http://127.0.0.1:7071", env = "DPCAP_COORDINATOR")]
    coordinator: String,
    /// Name shown in listings (default: host name and process id).
    #[arg(long, env = "DPCAP_WORKER_NAME")]
    name: Option<String>,
    /// cpu, or cuda:N with the `cuda` feature.
    #[arg(long, default_value = "cpu", env = "DPCAP_DEVICE")]
    device: String,
    /// Worker-role bearer token, presented to the coordinator and the accountant.
    #[arg(long, alias = "worker-token", env = "DPCAP_CLUSTER_TOKEN", hide_env_values = true)]
    cluster_token: Option<dpcap_proto::Secret>,
    #[command(flatten)]
    tls: ClientTlsArgs,
    /// Watchdog for NCCL collectives, in seconds: a peer silent this long aborts the
    /// communicator and the coordinator re-forms the group. Must exceed a step's compute skew.
    #[arg(long, default_value_t = dpcap_worker::DEFAULT_COLLECTIVE_TIMEOUT.as_secs(), env = "DPCAP_COLLECTIVE_TIMEOUT")]
    collective_timeout: u64,
    /// Matrix products in f32, bf16 or f16 (mixed precision: per-example norms, clip factors
    /// and the clipped sum stay f32; f16 for devices without bf16).
    #[arg(long, default_value = "f32", env = "DPCAP_PRECISION")]
    precision: Precision,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Check what the device needs (driver, NVRTC, CUDA headers, NCCL, kernel cache) and exit:
    /// 0 when it can run, 1 when a check failed (each failure says what to do).
    Preflight {
        /// The device to check: cpu or cuda:N.
        #[arg(long, default_value = "cuda:0")]
        device: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Prints the preflight of `device` and exits 1 when it failed.
fn preflight(device: &str, json: bool) -> Result<()> {
    let report = dpcap_worker::preflight::run(device, dpcap_worker::preflight::Needs { nccl: true });
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    if !report.ok {
        std::process::exit(1);
    }
    Ok(())
}

fn main() -> Result<()> {
    // Before the runtime starts its threads: mallopt is not meant to race other allocations.
    dpcap_ml::alloc::keep_step_buffers();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve())
}

async fn serve() -> Result<()> {
    let args = Args::parse();
    if let Some(Command::Preflight { device, json }) = &args.command {
        return preflight(device, *json);
    }
    init_tracing(args.log_json);
    let name = args.name.unwrap_or_else(|| {
        format!("{}-{}", std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into()), std::process::id())
    });
    let config = WorkerConfig {
        coordinator: args.coordinator,
        name,
        device: args.device.clone(),
        cluster_token: args.cluster_token,
        tls: args.tls,
        collective_timeout: std::time::Duration::from_secs(args.collective_timeout.max(1)),
        precision: args.precision,
    };
    if args.device == "cpu" {
        run::<dpcap_ml::CpuBackend>(config, Default::default(), shutdown_signal()).await?;
        return Ok(());
    }
    if let Some(index) = args.device.strip_prefix("cuda:") {
        let Ok(index) = index.parse::<usize>() else {
            bail!("invalid --device {}: expected cpu or cuda:N", args.device)
        };
        return run_cuda(config, index).await;
    }
    bail!("invalid --device {}: expected cpu or cuda:N", args.device)
}

#[cfg(feature = "cuda")]
async fn run_cuda(config: WorkerConfig, index: usize) -> Result<()> {
    dpcap_worker::preflight::require(&config.device, dpcap_worker::preflight::Needs { nccl: true })?;
    let device = burn::backend::cuda::CudaDevice::new(index);
    run::<dpcap_worker::CudaBackend>(config, device, shutdown_signal()).await?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
async fn run_cuda(_config: WorkerConfig, _index: usize) -> Result<()> {
    bail!("invalid --device cuda: this dpcap-worker was built without the `cuda` feature")
}
