//! Who may call what. Every dpcap RPC has the roles allowed to call it ([`POLICY`], defined
//! beside the protocol in `dpcap_proto::roles` and enforced here); a caller
//! proves a role with a bearer token (`authorization: Bearer T`), or, over mTLS, with a client
//! certificate whose SHA-256 fingerprint is listed for the role. Health and reflection stay
//! open. A missing or unknown token is UNAUTHENTICATED; a known token without the RPC's role
//! is PERMISSION_DENIED; an RPC missing from the policy is denied. Tokens are compared in
//! constant time and never logged.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use dpcap_proto::{ErrorCode, ServiceError, to_status};
use futures::future::BoxFuture;

pub use dpcap_proto::roles::{POLICY, ROLES, Role, UnknownRole, allowed};

/// Paths every caller may use: health checks and server reflection.
const OPEN: [&str; 3] =
    ["/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"];

/// Why a caller was refused, or a credential could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No bearer token, or one that matches no credential.
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    /// The token is valid but its roles may not call this RPC.
    #[error("{path} needs role {needed}; the caller has {has}")]
    PermissionDenied {
        /// The RPC.
        path: String,
        /// The roles that may call it.
        needed: String,
        /// The caller's roles.
        has: String,
    },
    /// A role name that does not exist.
    #[error(transparent)]
    UnknownRole(#[from] UnknownRole),
    /// A token that is too short to be a secret.
    #[error("invalid {role} token: {len} characters; a token needs at least {MIN_TOKEN_LEN}")]
    WeakToken {
        /// Its role.
        role: Role,
        /// Its length.
        len: usize,
    },
    /// One token (or certificate) given for two roles: every caller holding it would have both,
    /// more than either grants.
    #[error(
        "invalid {second} credential: the same token or certificate is already given to role {first}; each \
         credential grants one role (make a token per role: openssl rand -hex 32)"
    )]
    SharedCredential {
        /// The role it was given first.
        first: Role,
        /// The role it was given again.
        second: Role,
    },
    /// A token file could not be read or parsed.
    #[error("invalid auth tokens file {path}: {reason}")]
    TokenFile {
        /// The file.
        path: String,
        /// Why (never the token itself).
        reason: String,
    },
    /// A token file that could not be read.
    #[error("cannot read auth tokens file {path}: {source}")]
    TokenFileRead {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A token file's line whose token or fingerprint was refused.
    #[error("invalid auth tokens file {path}: line {line}: {source}")]
    TokenFileLine {
        /// The file.
        path: String,
        /// The line, from 1.
        line: usize,
        /// Why (never the token itself).
        source: Box<AuthError>,
    },
    /// A token file's line names a role the protocol does not define.
    #[error("invalid auth tokens file {path}: line {line}: {source}")]
    TokenFileRole {
        /// The file.
        path: String,
        /// The line, from 1.
        line: usize,
        /// The role named.
        source: UnknownRole,
    },
}

impl ServiceError for AuthError {
    fn error_code(&self) -> ErrorCode {
        match self {
            AuthError::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            _ => ErrorCode::Unauthenticated,
        }
    }
}

/// Shortest accepted token: 16 characters (e.g. `openssl rand -hex 16` gives 32).
pub const MIN_TOKEN_LEN: usize = 16;

/// The tokens a server accepts, each with its role.
#[derive(Default, Clone)]
pub struct Credentials {
    tokens: Vec<(Vec<u8>, Role)>,
    /// Client-certificate fingerprints ("sha256:" + lowercase hex of the DER) with their role.
    certs: Vec<(String, Role)>,
}

impl fmt::Debug for Credentials {
    /// Roles only: a token never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tokens.iter().map(|(_, r)| r).chain(self.certs.iter().map(|(_, r)| r))).finish()
    }
}

/// "sha256:" and lowercase hex, from any of `sha256:AB:CD…`, `AB:CD…` or `abcd…` (openssl prints
/// the colon form: `openssl x509 -noout -fingerprint -sha256`).
fn normalise_fingerprint(text: &str) -> Option<String> {
    let hex: String = text.trim().trim_start_matches("sha256:").chars().filter(|c| *c != ':').collect();
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| format!("sha256:{}", hex.to_lowercase()))
}

impl Credentials {
    /// Accepts `token` for `role`.
    pub fn add(&mut self, role: Role, token: &str) -> Result<(), AuthError> {
        let token = token.trim();
        if token.len() < MIN_TOKEN_LEN {
            return Err(AuthError::WeakToken { role, len: token.len() });
        }
        if let Some((_, first)) = self.tokens.iter().find(|(t, _)| t == token.as_bytes()) {
            if *first == role {
                return Ok(()); // the same grant twice changes nothing
            }
            return Err(AuthError::SharedCredential { first: *first, second: role });
        }
        self.tokens.push((token.as_bytes().to_vec(), role));
        Ok(())
    }

    /// Accepts the client certificate with SHA-256 `fingerprint` (of its DER) for `role`, over mTLS.
    pub fn add_cert(&mut self, role: Role, fingerprint: &str) -> Result<(), AuthError> {
        let fingerprint = normalise_fingerprint(fingerprint).ok_or_else(|| AuthError::TokenFile {
            path: "(certificate)".into(),
            reason: format!("invalid {role} certificate fingerprint {fingerprint:?}: expected sha256 hex"),
        })?;
        if let Some((_, first)) = self.certs.iter().find(|(f, _)| *f == fingerprint) {
            if *first == role {
                return Ok(());
            }
            return Err(AuthError::SharedCredential { first: *first, second: role });
        }
        self.certs.push((fingerprint, role));
        Ok(())
    }

    /// Adds every `ROLE TOKEN` or `ROLE cert:FINGERPRINT` line of `path` (blank lines and `#`
    /// comments skipped).
    pub fn add_file(&mut self, path: &Path) -> Result<(), AuthError> {
        let file_error = |reason: String| AuthError::TokenFile { path: path.display().to_string(), reason };
        let shown = || path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| AuthError::TokenFileRead { path: shown(), source })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (role, token) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| file_error(format!("line {}: expected `ROLE TOKEN`", n + 1)))?;
            let role: Role = role.parse().map_err(|source: UnknownRole| AuthError::TokenFileRole {
                path: shown(),
                line: n + 1,
                source,
            })?;
            let added = match token.trim().strip_prefix("cert:") {
                Some(fingerprint) => self.add_cert(role, fingerprint),
                None => self.add(role, token),
            };
            added.map_err(|e| AuthError::TokenFileLine { path: shown(), line: n + 1, source: Box::new(e) })?;
        }
        Ok(())
    }

    /// True when no token is configured: authentication is off (loopback only, or --insecure).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.certs.is_empty()
    }

    /// The roles of `presented`: every configured token is compared, each in constant time,
    /// so the time taken says nothing about which token (or how much of it) matched.
    pub fn roles_of(&self, presented: &[u8]) -> Vec<Role> {
        let mut roles = Vec::new();
        for (token, role) in &self.tokens {
            if constant_time_eq(token, presented) {
                roles.push(*role);
            }
        }
        roles
    }

    /// Decides a call to `path` with an `authorization` header value and the fingerprint of
    /// the client certificate the TLS handshake verified, if any.
    pub fn check(&self, path: &str, authorization: Option<&[u8]>, peer_cert: Option<&str>) -> Result<(), AuthError> {
        if self.is_empty() || OPEN.iter().any(|p| path.starts_with(p)) {
            return Ok(());
        }
        let mut roles = match authorization.and_then(bearer) {
            Some(token) => self.roles_of(token),
            None => Vec::new(),
        };
        if let Some(fingerprint) = peer_cert {
            roles.extend(self.certs.iter().filter(|(f, _)| f == fingerprint).map(|(_, r)| *r));
        }
        if roles.is_empty() {
            return Err(AuthError::Unauthenticated);
        }
        let needed = allowed(path).unwrap_or(&[]);
        if roles.iter().any(|r| needed.contains(r)) {
            return Ok(());
        }
        let names = |rs: &[Role]| rs.iter().map(|r| r.as_str()).collect::<Vec<_>>().join("|");
        Err(AuthError::PermissionDenied {
            path: path.to_owned(),
            needed: if needed.is_empty() { "(none: not in the policy)".into() } else { names(needed) },
            has: names(&roles),
        })
    }
}

/// The token of an `authorization` value: the scheme is case-insensitive (RFC 6750).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // Length is not secret (tokens have public minimum lengths); contents are.
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A tower layer that enforces [`Credentials`] on every request a tonic server receives.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    credentials: Arc<Credentials>,
}

impl AuthLayer {
    /// Enforces `credentials` (nothing, when they are empty).
    pub fn new(credentials: Arc<Credentials>) -> Self {
        Self { credentials }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;
    fn layer(&self, inner: S) -> Auth<S> {
        Auth { inner, credentials: self.credentials.clone() }
    }
}

/// The service [`AuthLayer`] wraps around a server's routes.
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    credentials: Arc<Credentials>,
}

impl<S, B> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let authorization = request.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes());
        type Tls = tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>;
        let peer_cert = request
            .extensions()
            .get::<Tls>()
            .and_then(Tls::peer_certs)
            .and_then(|chain| chain.first().map(|leaf| dpcap_proto::digest::sha256(leaf.as_ref())));
        match self.credentials.check(request.uri().path(), authorization, peer_cert.as_deref()) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(refused) => {
                tracing::warn!(path = %request.uri().path(), reason = %refused, "call refused");
                let response = to_status(refused).into_http();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        let mut c = Credentials::default();
        c.add(Role::Worker, "worker-token-0123456789").unwrap();
        c.add(Role::Operator, "operator-token-0123456789").unwrap();
        c
    }

    #[test]
    fn every_rpc_of_every_service_has_a_role_and_unknown_ones_are_denied() {
        let c = creds();
        let header = |t: &str| format!("Bearer {t}").into_bytes();
        let worker = header("worker-token-0123456789");
        assert!(c.check("/dpcap.v1.AccountantService/SubmitPart", Some(&worker), None).is_ok());
        assert!(matches!(
            c.check("/dpcap.v1.AccountantService/CloseJob", Some(&worker), None),
            Err(AuthError::PermissionDenied { .. })
        ));
        assert!(matches!(
            c.check("/dpcap.v1.AccountantService/Nope", Some(&worker), None),
            Err(AuthError::PermissionDenied { .. })
        ));
        assert!(matches!(c.check("/dpcap.v1.JobService/SubmitJob", None, None), Err(AuthError::Unauthenticated)));
        assert!(matches!(
            c.check("/dpcap.v1.JobService/SubmitJob", Some(b"Bearer wrong-token-0123456789"), None),
            Err(AuthError::Unauthenticated)
        ));
        assert!(c.check("/grpc.health.v1.Health/Check", None, None).is_ok(), "health stays open");
        let lower = b"bearer worker-token-0123456789";
        assert!(c.check("/dpcap.v1.AccountantService/SubmitPart", Some(lower), None).is_ok(), "RFC 6750: any case");
        assert!(Credentials::default().check("/dpcap.v1.AccountantService/CloseJob", None, None).is_ok(), "auth off");
    }

    #[test]
    fn short_tokens_unknown_roles_and_bad_files_are_refused_without_echoing_tokens() {
        let mut c = Credentials::default();
        assert!(matches!(c.add(Role::Worker, "short"), Err(AuthError::WeakToken { len: 5, .. })));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# comment\nworker  aaaaaaaaaaaaaaaaaaaa\nwizard bbbbbbbbbbbbbbbbbbbbbb\n").unwrap();
        let err = c.add_file(&file).unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("wizard") && !err.contains("bbbb"), "{err}");
        assert_eq!(c.roles_of(b"aaaaaaaaaaaaaaaaaaaa"), vec![Role::Worker]);
        assert!(!format!("{c:?}").contains("aaaa"), "debug output never shows a token");
    }

    #[test]
    fn a_credential_given_to_two_roles_is_refused_naming_both_and_never_the_token() {
        let mut c = Credentials::default();
        c.add(Role::Operator, "shared-token-0123456789").unwrap();
        c.add(Role::Operator, "shared-token-0123456789").unwrap();
        let err = c.add(Role::Worker, "shared-token-0123456789").unwrap_err().to_string();
        assert!(err.contains("worker") && err.contains("operator") && !err.contains("0123"), "{err}");
        let fingerprint = "ab".repeat(32);
        c.add_cert(Role::Viewer, &fingerprint).unwrap();
        assert!(matches!(c.add_cert(Role::Coordinator, &fingerprint), Err(AuthError::SharedCredential { .. })));
        assert_eq!(c.roles_of(b"shared-token-0123456789"), vec![Role::Operator]);
    }

    #[test]
    fn the_policy_names_exactly_the_rpcs_the_protocol_defines() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(dpcap_proto::FILE_DESCRIPTOR_SET).unwrap();
        let mut defined: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                let package = f.package().to_owned();
                f.service.iter().flat_map(move |s| {
                    let service = format!("{package}.{}", s.name());
                    s.method.iter().map(move |m| format!("/{service}/{}", m.name()))
                })
            })
            .collect();
        defined.sort();
        let mut listed: Vec<String> = POLICY.iter().map(|(path, _)| path.to_string()).collect();
        listed.sort();
        assert_eq!(listed, defined, "every RPC needs a role (a new one without is denied to everybody)");
        assert!(POLICY.iter().all(|(_, roles)| !roles.is_empty()));
    }

    #[test]
    fn a_listed_client_certificate_proves_its_role_over_mtls() {
        let mut c = Credentials::default();
        let colons = ["AB"; 32].join(":");
        c.add_cert(Role::Coordinator, &colons).unwrap();
        let fingerprint = format!("sha256:{}", "ab".repeat(32));
        assert!(c.check("/dpcap.v1.AccountantService/CloseJob", None, Some(&fingerprint)).is_ok());
        assert!(matches!(
            c.check("/dpcap.v1.AccountantService/SubmitPart", None, Some(&fingerprint)),
            Err(AuthError::PermissionDenied { .. })
        ));
        let other = format!("sha256:{}", "cd".repeat(32));
        assert!(matches!(
            c.check("/dpcap.v1.AccountantService/CloseJob", None, Some(&other)),
            Err(AuthError::Unauthenticated)
        ));
        assert!(c.add_cert(Role::Worker, "sha256:zz").is_err());
    }
}
