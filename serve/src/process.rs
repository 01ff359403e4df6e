//! Process plumbing shared by every dpcap binary: logging, the shutdown signal, and the
//! address file through which tests and scripts learn ephemeral ports.

use std::net::SocketAddr;
use std::path::Path;

/// Logs to stderr, filtered by `RUST_LOG` (default info), as text or JSON lines.
pub fn init_tracing(json: bool) {
    init_tracing_at(json, "info");
}

/// Like [`init_tracing`] with another default filter (`dpctl demo` keeps its servers quiet).
pub fn init_tracing_at(json: bool, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    // Colour only on a terminal: a redirected log (a file, a pipe, kubectl logs) stays plain.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// A server's two listening sockets, bound before it serves so that their ephemeral ports can
/// be published first: gRPC (with health and reflection) and the HTTP `/metrics` port.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC services.
    pub grpc: tokio::net::TcpListener,
    /// Prometheus's `/metrics`.
    pub metrics: tokio::net::TcpListener,
    /// Whether `grpc` speaks TLS ([`crate::ServerSecurity::tls_on`]): a client that speaks
    /// plaintext to it is then logged ([`crate::plaintext`]).
    pub tls: bool,
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} },
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Writes `{"grpc": ADDR, "metrics": ADDR}` atomically (write then rename).
pub fn write_addr_file(path: &Path, grpc: SocketAddr, metrics: Option<SocketAddr>) -> std::io::Result<()> {
    let body = serde_json::json!({ "grpc": grpc.to_string(), "metrics": metrics.map(|m| m.to_string()) });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body.to_string())?;
    std::fs::rename(&tmp, path)
}
