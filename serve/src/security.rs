//! A server's security flags in one place (TLS, tokens by role, `--insecure`), and the tonic
//! server builder every dpcap server starts from: TLS when configured, the auth layer always,
//! HTTP/2 adaptive windows.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tonic::transport::Server;
use tower::layer::util::{Identity, Stack};

use dpcap_proto::Secret;

use crate::auth::{AuthError, AuthLayer, Credentials, Role};
use crate::exposure::{self, ExposureError};
use crate::tls::{ServerTlsArgs, TlsError};

/// Tokens a server accepts, by role (each flag may also come from its environment variable).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AuthArgs {
    /// Bearer token of the operator role (submit, cancel, resume).
    #[arg(long, env = "DPCAP_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<Secret>,
    /// Bearer token of the viewer role (get, list, watch, spend).
    #[arg(long, env = "DPCAP_VIEWER_TOKEN", hide_env_values = true)]
    pub viewer_token: Option<Secret>,
    /// Bearer token of the worker role (WorkerService, parts and releases).
    #[arg(long, alias = "cluster-token", env = "DPCAP_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<Secret>,
    /// Bearer token of the coordinator role (register, close, trim at the accountant).
    #[arg(long, env = "DPCAP_COORDINATOR_TOKEN", hide_env_values = true)]
    pub coordinator_token: Option<Secret>,
    /// Bearer token of the privacy-admin role (dataset budgets).
    #[arg(long, env = "DPCAP_PRIVACY_ADMIN_TOKEN", hide_env_values = true)]
    pub privacy_admin_token: Option<Secret>,
    /// A file of `ROLE TOKEN` lines (several tokens per role, for rotation).
    #[arg(long, env = "DPCAP_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,
}

impl AuthArgs {
    /// The credentials these flags name (empty: authentication off).
    pub fn credentials(&self) -> Result<Credentials, AuthError> {
        let mut credentials = Credentials::default();
        let flags = [
            (Role::Operator, &self.operator_token),
            (Role::Viewer, &self.viewer_token),
            (Role::Worker, &self.worker_token),
            (Role::Coordinator, &self.coordinator_token),
            (Role::PrivacyAdmin, &self.privacy_admin_token),
        ];
        for (role, token) in flags {
            if let Some(token) = token.as_ref().map(Secret::expose).filter(|t| !t.is_empty()) {
                credentials.add(role, token)?;
            }
        }
        if let Some(path) = &self.auth_tokens_file {
            credentials.add_file(path)?;
        }
        Ok(credentials)
    }
}

/// Everything a server needs to decide who may talk to it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerSecurity {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub tls: ServerTlsArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub auth: AuthArgs,
    /// Serve a non-loopback address without TLS or without tokens (refused otherwise).
    #[arg(long)]
    pub insecure: bool,
}

/// Why a server's security could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A TLS flag.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A token flag or file.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The exposure rule.
    #[error(transparent)]
    Exposure(#[from] ExposureError),
    /// tonic refused the TLS configuration (its own message is only "transport error": the
    /// causes under it are spelled out).
    #[error("tls setup failed: {}", causes(.0))]
    Transport(#[from] tonic::transport::Error),
}

/// An error and every cause under it, the empty ones left out.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let line = cause.to_string();
        if !line.is_empty() && !text.ends_with(&line) {
            text = format!("{text}: {line}");
        }
        next = cause.source();
    }
    text
}

/// A tonic server with the auth layer.
pub type SecuredServer = Server<Stack<AuthLayer, Identity>>;

/// HTTP/2 frame size that dpcap's servers and bulk clients accept (1 MiB; the protocol's default
/// is 16 KiB).
pub use dpcap_proto::client::MAX_FRAME_BYTES;

impl ServerSecurity {
    /// Whether the server speaks TLS (a certificate is given; its files are checked by
    /// [`Self::server`]).
    pub fn tls_on(&self) -> bool {
        self.tls.tls_cert.is_some()
    }

    /// Loads the flags, applies the exposure rule for `addr`, and returns the server builder.
    pub fn server(&self, addr: SocketAddr) -> Result<SecuredServer, SecurityError> {
        let tls = self.tls.config()?;
        let credentials = self.auth.credentials()?;
        exposure::check(addr, tls.is_some(), !credentials.is_empty(), self.insecure)?;
        tracing::info!(%addr, tls = tls.is_some(), roles = ?credentials, "security");
        // Large HTTP/2 frames: gradient chunks are 4 MiB, and 16 KiB frames (the default) cost a
        // frame header, a poll and a copy every 16 KiB of a 760 MB part.
        let mut server = Server::builder().http2_adaptive_window(Some(true)).max_frame_size(Some(MAX_FRAME_BYTES));
        if let Some(tls) = tls {
            server = server.tls_config(tls)?;
        }
        Ok(server.layer(AuthLayer::new(Arc::new(credentials))))
    }
}
