//! `dpcap-accountant`: the privacy accountant service.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use dpcap_serve::process::{init_tracing, shutdown_signal, write_addr_file};
use dpcap_serve::{CapabilityArgs, ServerSecurity};
use tokio::net::TcpListener;

/// dpcap's privacy accountant: adds the noise, enforces budgets, keeps the ledger.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, env = "DPCAP_ACCOUNTANT_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Prometheus /metrics listen address.
    #[arg(long, env = "DPCAP_ACCOUNTANT_METRICS_LISTEN", default_value = "127.0.0.1:9070")]
    metrics_listen: SocketAddr,
    /// Ledger location: a directory, or an object-store URL (file://, s3://, gs://, az://).
    #[arg(long, env = "DPCAP_LEDGER", default_value = "./dpcap-ledger")]
    ledger: String,
    /// Accept jobs with insecure_noise_seed (tests only; recorded in every charge).
    #[arg(long)]
    allow_seeded_noise: bool,
    /// Accept jobs on datasets without a budget set by a privacy admin (no lifetime limit).
    #[arg(long, env = "DPCAP_ALLOW_UNBUDGETED_DATASETS")]
    allow_unbudgeted_datasets: bool,
    /// Bytes of noise drawn ahead at most, across the jobs whose ranks have attached (8 bytes
    /// per gradient coordinate per job: 1.5 GB at P = 190M; queued jobs hold none). A job past
    /// it draws each step's noise when its parts are in, a slower release. 0: never ahead.
    #[arg(long, env = "DPCAP_NOISE_AHEAD_BYTES", default_value_t = dpcap_accountant::DEFAULT_NOISE_AHEAD_BYTES)]
    noise_ahead_bytes: u64,
    /// Seconds a part stream may wait for its next chunk before it is cut off (its memory let
    /// go, nothing charged; the rank's retry sends the part again).
    #[arg(long, env = "DPCAP_PART_IDLE_SECONDS", default_value_t = dpcap_accountant::DEFAULT_PART_IDLE.as_secs())]
    part_idle_seconds: u64,
    /// Serve ranks on this host their parts and releases over a Unix socket at this path as
    /// well (same checks, about half the CPU of gRPC per GB; docs/grpc.md). Ranks use it only
    /// when they share this host's kernel and reach the path; others keep to gRPC.
    #[arg(long, env = "DPCAP_LOCAL_SOCKET")]
    local_socket: Option<PathBuf>,
    /// Write {"grpc": ADDR, "metrics": ADDR} here once both ports are bound.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, env = "DPCAP_LOG_JSON")]
    log_json: bool,
    #[command(flatten)]
    security: ServerSecurity,
    #[command(flatten)]
    capability: CapabilityArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_json);
    let server = args.security.server(args.listen)?;
    let credentials = std::sync::Arc::new(args.security.auth.credentials()?);
    let auth_on = !credentials.is_empty();
    let capabilities = args.capability.capabilities(auth_on)?;

    let grpc = TcpListener::bind(args.listen).await.with_context(|| format!("binding --listen {}", args.listen))?;
    let metrics = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    let (grpc_addr, metrics_addr) = (grpc.local_addr()?, metrics.local_addr()?);
    tracing::info!(%grpc_addr, %metrics_addr, ledger = %args.ledger, "accountant listening");
    if let Some(path) = &args.addr_file {
        write_addr_file(path, grpc_addr, Some(metrics_addr))
            .with_context(|| format!("writing --addr-file {}", path.display()))?;
    }
    let ledger = dpcap_accountant::open_ledger(&args.ledger)?;
    let policy = dpcap_accountant::Policy {
        allow_seeded_noise: args.allow_seeded_noise,
        allow_unbudgeted_datasets: args.allow_unbudgeted_datasets,
        noise_ahead_bytes: args.noise_ahead_bytes,
        part_idle: std::time::Duration::from_secs(args.part_idle_seconds.max(1)),
    };
    let local = args.local_socket.map(|path| dpcap_accountant::LocalSetup { path, credentials });
    let setup = dpcap_accountant::Setup { ledger, policy, capabilities, local };
    let listeners = dpcap_serve::Listeners { grpc, metrics, tls: args.security.tls_on() };
    dpcap_accountant::serve(listeners, server, setup, shutdown_signal()).await?;
    Ok(())
}
