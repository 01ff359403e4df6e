//! The `dpcap-coordinator` binary: jobs, scheduling and worker leases over gRPC.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use dpcap_coordinator::Config;
use dpcap_coordinator::serve;
use dpcap_serve::process::{init_tracing, shutdown_signal, write_addr_file};
use dpcap_serve::{CapabilityArgs, ClientTlsArgs, ServerSecurity};
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
    /// Job secrets (sampler keys): a directory or object-store URL that workers cannot reach
    /// (default: the store's location with `-secrets` appended; use a separate bucket with its
    /// own credentials when the store is an object store).
    #[arg(long, default_value = "", env = "DPCAP_SECRETS_STORE")]
    secrets_store: String,
    /// The coordinator-role token this coordinator presents to the accountant.
    #[arg(long, env = "DPCAP_ACCOUNTANT_TOKEN", hide_env_values = true)]
    accountant_token: Option<dpcap_proto::Secret>,
    #[command(flatten)]
    security: ServerSecurity,
    #[command(flatten)]
    accountant_tls: ClientTlsArgs,
    #[command(flatten)]
    capability: CapabilityArgs,
    /// Seconds a worker's capability stays valid (0: three leases, at least 30 s). Workers
    /// renew it with every heartbeat (a quarter lease), so it only needs to outlast a few missed
    /// ones; short, so that a removed worker's capability soon stops working.
    #[arg(long, default_value_t = 0)]
    capability_ttl_seconds: u64,
    /// Mint a new record key although the stores hold jobs (the key in the secrets store was
    /// lost): every existing job record is then refused and its job suspended. Without it, a
    /// missing key with jobs present stops the start.
    #[arg(long)]
    new_record_key: bool,
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
    init_tracing(args.log_json);
    let grpc = TcpListener::bind(&args.listen).await.with_context(|| format!("binding --listen {}", args.listen))?;
    let server = args.security.server(grpc.local_addr()?)?;
    let auth_on = !args.security.auth.credentials()?.is_empty();
    let capabilities = args.capability.capabilities(auth_on)?;
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
        secrets_url: args.secrets_store,
        accountant_endpoint: args.accountant,
        accountant_tls: args.accountant_tls,
        accountant_token: args.accountant_token,
        lease: Duration::from_secs(args.lease_seconds.max(1)),
        capabilities,
        capability_ttl: Duration::from_secs(match args.capability_ttl_seconds {
            0 => (3 * args.lease_seconds).max(30),
            ttl => ttl.max(args.lease_seconds),
        }),
        new_record_key: args.new_record_key,
    };
    let tls = args.security.tls_on();
    serve(dpcap_serve::Listeners { grpc, metrics, tls }, server, config, shutdown_signal()).await?;
    Ok(())
}
