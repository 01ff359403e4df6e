//! The `dpcap-coordinator` binary: jobs, scheduling and worker leases over gRPC.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use dpcap_accountant::process::{shutdown_signal, write_addr_file};
use dpcap_coordinator::coordinator::Config;
use dpcap_coordinator::server::{Tokens, serve};
use tokio::net::TcpListener;

/// dpcap's coordinator.
#[derive(Debug, Parser)]
#[command(name = "dpcap-coordinator", version, about)]
struct Args {
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7071", env = "DPCAP_COORDINATOR_LISTEN")]
    listen: String,
    /// Prometheus /metrics listen address.
    #[arg(long, default_value = "127.0.0.1:9091", env = "DPCAP_COORDINATOR_METRICS_LISTEN")]
    metrics_listen: String,
    /// Job store and checkpoints: a directory or object-store URL.
    #[arg(long, default_value = "./dpcap-store", env = "DPCAP_STORE")]
    store: String,
    /// The accountant's gRPC endpoint, told to workers.
    #[arg(long, default_value = "http://127.0.0.1:7070", env = "DPCAP_ACCOUNTANT")]
    accountant: String,
    /// Seconds a worker may stay silent before its job's group is re-formed.
    #[arg(long, default_value_t = 10)]
    lease_seconds: u64,
    /// Bearer token operators must present (JobService); unset: open.
    #[arg(long, env = "DPCAP_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Option<String>,
    /// Bearer token workers must present (WorkerService); unset: open.
    #[arg(long, env = "DPCAP_CLUSTER_TOKEN", hide_env_values = true)]
    cluster_token: Option<String>,
    /// Write {"grpc": ADDR, "metrics": ADDR} to this file once listening (for tests and scripts).
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    dpcap_accountant::process::init_tracing(args.log_json);
    let grpc = TcpListener::bind(&args.listen).await.with_context(|| format!("binding --listen {}", args.listen))?;
    let metrics = TcpListener::bind(&args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    let (grpc_addr, metrics_addr) = (grpc.local_addr()?, metrics.local_addr()?);
    if let Some(path) = &args.addr_file {
        write_addr_file(path, grpc_addr, Some(metrics_addr)).context("writing --addr-file")?;
    }
    tracing::info!(%grpc_addr, %metrics_addr, store = %args.store, "coordinator listening");
    let config = Config {
        store_url: args.store,
        accountant_endpoint: args.accountant,
        lease: Duration::from_secs(args.lease_seconds.max(1)),
    };
    let tokens = Tokens { operator: args.operator_token, cluster: args.cluster_token };
    serve(grpc, metrics, config, tokens, shutdown_signal()).await?;
    Ok(())
}
