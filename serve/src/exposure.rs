//! The exposure rule: a server reachable from other hosts needs TLS and authentication. On a
//! loopback address plaintext without tokens stays allowed for local use (the demo, tests);
//! anything else refuses to start unless the operator says `--insecure`.

use std::net::SocketAddr;

/// A server that would be exposed without protection.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to listen on {addr} {missing}: anyone who reaches the port could read gradients or spend budgets; add TLS (--tls-cert/--tls-key) and tokens, listen on 127.0.0.1, or pass --insecure"
)]
pub struct ExposureError {
    /// The address.
    pub addr: SocketAddr,
    /// What is missing ("without TLS", "without authentication", or both).
    pub missing: &'static str,
}

/// Checks that a server on `addr` may start with this protection.
pub fn check(addr: SocketAddr, tls: bool, auth: bool, insecure: bool) -> Result<(), ExposureError> {
    if addr.ip().is_loopback() || (tls && auth) {
        return Ok(());
    }
    let missing = match (tls, auth) {
        (false, false) => "without TLS or authentication",
        (false, true) => "without TLS",
        _ => "without authentication",
    };
    if insecure {
        tracing::warn!(%addr, missing, "--insecure: serving an exposed address unprotected");
        return Ok(());
    }
    Err(ExposureError { addr, missing })
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn only_loopback_or_tls_with_auth_or_an_explicit_insecure_may_listen() {
        let any = "0.0.0.0:7070".parse().unwrap();
        assert!(check("127.0.0.1:7070".parse().unwrap(), false, false, false).is_ok());
        assert!(check("[::1]:7070".parse().unwrap(), false, false, false).is_ok());
        let refused = check(any, false, false, false).unwrap_err().to_string();
        assert!(refused.contains("0.0.0.0:7070") && refused.contains("--insecure"), "{refused}");
        assert!(check(any, true, false, false).is_err(), "TLS alone lets anyone in");
        assert!(check(any, false, true, false).is_err(), "tokens alone cross the network in clear");
        assert!(check(any, true, true, false).is_ok());
        assert!(check(any, false, false, true).is_ok());
    }
}
