//! `dpcap-accountant`: the privacy accountant service.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
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
    /// Write {"grpc": ADDR, "metrics": ADDR} here once both ports are bound.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, env = "DPCAP_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if args.log_json {
        builder.json().init()
    } else {
        builder.init()
    }

    let grpc = TcpListener::bind(args.listen).await.with_context(|| format!("binding --listen {}", args.listen))?;
    let metrics = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;
    let addrs =
        serde_json::json!({ "grpc": grpc.local_addr()?.to_string(), "metrics": metrics.local_addr()?.to_string() });
    tracing::info!(grpc = %addrs["grpc"], metrics = %addrs["metrics"], ledger = %args.ledger, "accountant listening");
    if let Some(path) = &args.addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, addrs.to_string()).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing --addr-file {}", path.display()))?;
    }
    let ledger = dpcap_accountant::server::open_ledger(&args.ledger)?;
    dpcap_accountant::server::serve(grpc, metrics, ledger, args.allow_seeded_noise, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
