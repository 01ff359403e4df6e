//! TLS (rustls) for every server and client. A server with `--tls-cert`/`--tls-key` serves
//! only TLS; with `--tls-client-ca` it also requires a client certificate signed by that CA
//! (mTLS). A client uses TLS for `https://` endpoints, trusting `--tls-ca`, and presents
//! `--tls-client-cert`/`--tls-client-key` when the server asks for them.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// A TLS file that could not be used, or an endpoint that could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("invalid {flag} {path}: {reason}")]
    File {
        /// The flag that named it.
        flag: &'static str,
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Flags that only work together were given apart.
    #[error("invalid {flag}: {reason}")]
    Incomplete {
        /// The flag.
        flag: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// The endpoint URL or its TLS setup was refused.
    #[error("invalid endpoint {url}: {reason}")]
    Endpoint {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File { flag, path: path.display().to_string(), reason: e.to_string() })
}

/// Server TLS flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerTlsArgs {
    /// PEM certificate chain this server presents; with --tls-key, the server speaks only TLS.
    #[arg(long, env = "DPCAP_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "DPCAP_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: clients must present a certificate it signed (mTLS).
    #[arg(long, env = "DPCAP_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    /// The server's TLS configuration; None when TLS is off.
    pub fn config(&self) -> Result<Option<ServerTlsConfig>, TlsError> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (None, None) => {
                if self.tls_client_ca.is_some() {
                    return Err(TlsError::Incomplete {
                        flag: "tls_client_ca",
                        reason: "needs --tls-cert and --tls-key",
                    });
                }
                return Ok(None);
            }
            (Some(cert), Some(key)) => (cert, key),
            (Some(_), None) => return Err(TlsError::Incomplete { flag: "tls_key", reason: "--tls-cert needs it" }),
            (None, Some(_)) => return Err(TlsError::Incomplete { flag: "tls_cert", reason: "--tls-key needs it" }),
        };
        let identity = Identity::from_pem(read("tls_cert", cert)?, read("tls_key", key)?);
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.tls_client_ca {
            config =
                config.client_ca_root(Certificate::from_pem(read("tls_client_ca", ca)?)).client_auth_optional(false);
        }
        Ok(Some(config))
    }
}

/// Client TLS flags (global: they may come before or after a subcommand).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsArgs {
    /// PEM CA bundle trusted for https:// endpoints.
    #[arg(long, global = true, env = "DPCAP_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate presented to servers that require mTLS.
    #[arg(long, global = true, env = "DPCAP_TLS_CLIENT_CERT")]
    pub tls_client_cert: Option<PathBuf>,
    /// PEM private key of --tls-client-cert.
    #[arg(long, global = true, env = "DPCAP_TLS_CLIENT_KEY")]
    pub tls_client_key: Option<PathBuf>,
    /// The server name to verify (default: the endpoint's host).
    #[arg(long, global = true, env = "DPCAP_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
}

impl ClientTlsArgs {
    /// An endpoint for `url`: TLS for `https://` (an error for `http://` when client TLS
    /// flags are set, so that a typo never silently sends gradients in clear).
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, TlsError> {
        let bad = |reason: String| TlsError::Endpoint { url: url.to_owned(), reason };
        let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| bad(e.to_string()))?;
        let wants_tls = self.tls_ca.is_some() || self.tls_client_cert.is_some();
        if !url.starts_with("https://") {
            if wants_tls {
                return Err(bad("client TLS flags are set but the endpoint is not https://".into()));
            }
            return Ok(endpoint);
        }
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.tls_ca {
            config = config.ca_certificate(Certificate::from_pem(read("tls_ca", ca)?));
        }
        match (&self.tls_client_cert, &self.tls_client_key) {
            (Some(cert), Some(key)) => {
                config =
                    config.identity(Identity::from_pem(read("tls_client_cert", cert)?, read("tls_client_key", key)?));
            }
            (None, None) => {}
            _ => return Err(TlsError::Incomplete { flag: "tls_client_cert", reason: "needs --tls-client-key too" }),
        }
        if let Some(domain) = &self.tls_domain {
            config = config.domain_name(domain.clone());
        }
        endpoint.tls_config(config).map_err(|e| bad(e.to_string()))
    }
}
