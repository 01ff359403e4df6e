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
    /// A PEM file that could not be read.
    #[error("cannot read {flag} {path}: {source}")]
    Read {
        /// The flag that named it.
        flag: &'static str,
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate that is no X.509 certificate.
    #[error("invalid {flag} {path}: not an X.509 certificate: {source}")]
    NotX509 {
        /// The flag that named it.
        flag: &'static str,
        /// The path.
        path: String,
        /// Why.
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
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
        reason: &'static str,
    },
    /// The endpoint URL or its TLS setup, refused by the transport.
    #[error("invalid endpoint {url}: {source}")]
    Transport {
        /// The URL.
        url: String,
        /// Why.
        source: tonic::transport::Error,
    },
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { flag, path: path.display().to_string(), source })
}

/// What rustls (and so every client) would refuse about a server's certificate, found at start
/// with its reason, where tonic would only report "transport error" at the first handshake or
/// at bind: rustls accepts X.509 v3 only and matches the server's name against subjectAltName
/// only (never the CN), and an expired certificate fails every handshake.
fn check_server_pem(cert: &Path, cert_pem: &[u8], key: &Path, key_pem: &[u8]) -> Result<(), TlsError> {
    use x509_parser::pem::Pem;
    let bad = |flag: &'static str, path: &Path, reason: String| TlsError::File {
        flag,
        path: path.display().to_string(),
        reason,
    };
    let leaf = Pem::iter_from_buffer(cert_pem)
        .filter_map(Result::ok)
        .find(|block| block.label == "CERTIFICATE")
        .ok_or_else(|| bad("tls_cert", cert, "no PEM CERTIFICATE block".into()))?;
    let parsed = leaf.parse_x509().map_err(|source| TlsError::NotX509 {
        flag: "tls_cert",
        path: cert.display().to_string(),
        source,
    })?;
    let version = parsed.version().0 + 1;
    if version != 3 {
        return Err(bad(
            "tls_cert",
            cert,
            format!(
                "certificate is X.509 v{version}: rustls accepts only v3; issue it with extensions \
                 (openssl x509 -req ... -extfile with a subjectAltName line: docs/security.md, TLS quickstart)"
            ),
        ));
    }
    match parsed.subject_alternative_name() {
        Ok(Some(_)) => {}
        _ => {
            return Err(bad(
                "tls_cert",
                cert,
                "certificate has no subjectAltName: clients check the server's name against it only (never the \
                 CN); add subjectAltName=DNS:NAME,IP:ADDRESS for every name clients dial"
                    .into(),
            ));
        }
    }
    let validity = parsed.validity();
    if !validity.is_valid() {
        return Err(bad(
            "tls_cert",
            cert,
            format!(
                "certificate is valid from {} to {}, not now: issue a new one",
                validity.not_before, validity.not_after
            ),
        ));
    }
    let keys = ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];
    if !Pem::iter_from_buffer(key_pem).filter_map(Result::ok).any(|block| keys.contains(&block.label.as_str())) {
        return Err(bad(
            "tls_key",
            key,
            "no PEM private key block (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)".into(),
        ));
    }
    Ok(())
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
        let (cert_pem, key_pem) = (read("tls_cert", cert)?, read("tls_key", key)?);
        check_server_pem(cert, &cert_pem, key, &key_pem)?;
        let identity = Identity::from_pem(cert_pem, key_pem);
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
        let transport = |source| TlsError::Transport { url: url.to_owned(), source };
        let endpoint = Endpoint::from_shared(url.to_owned()).map_err(transport)?;
        let wants_tls = self.tls_ca.is_some() || self.tls_client_cert.is_some();
        if !url.starts_with("https://") {
            if wants_tls {
                let reason = "client TLS flags are set but the endpoint is not https://";
                return Err(TlsError::Endpoint { url: url.to_owned(), reason });
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
        endpoint.tls_config(config).map_err(transport)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made by the TLS quickstart's openssl commands (docs/security.md), with 100-year validity:
    /// the v3 certificate with -extfile and a subjectAltName line, and the two mistakes.
    fn server(cert: &str) -> ServerTlsArgs {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        ServerTlsArgs {
            tls_cert: Some(fixtures.join(cert)),
            tls_key: Some(fixtures.join("server.key")),
            tls_client_ca: None,
        }
    }

    #[test]
    fn a_v3_certificate_with_a_subject_alternative_name_is_served() {
        assert!(server("v3-san.crt").config().unwrap().is_some());
    }

    #[test]
    fn a_v1_certificate_is_refused_at_start_naming_its_version_and_the_fix() {
        let error = server("v1.crt").config().unwrap_err().to_string();
        assert!(error.contains("tls_cert") && error.contains("X.509 v1") && error.contains("-extfile"), "{error}");
    }

    #[test]
    fn a_certificate_without_a_subject_alternative_name_is_refused_at_start() {
        let error = server("v3-nosan.crt").config().unwrap_err().to_string();
        assert!(error.contains("no subjectAltName"), "{error}");
    }

    #[test]
    fn a_key_file_without_a_private_key_is_refused_naming_the_flag() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let args = ServerTlsArgs { tls_key: Some(fixtures.join("ca.crt")), ..server("v3-san.crt") };
        let error = args.config().unwrap_err().to_string();
        assert!(error.contains("tls_key") && error.contains("no PEM private key"), "{error}");
    }
}
