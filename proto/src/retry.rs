//! Bounded retries for calls between services. Transient failures (the peer restarting,
//! draining or unreachable: UNAVAILABLE, transport errors, DEADLINE_EXCEEDED) are retried with
//! exponential backoff and full jitter until a deadline; every other status is permanent and
//! returned at once. Only idempotent calls may be retried: dpcap's are, by step numbers, part
//! digests and attempts.

use std::future::Future;
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use crate::error::ErrorCode;

/// How long and how often to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// The first backoff; it doubles after every failure.
    pub initial: Duration,
    /// The largest backoff.
    pub max: Duration,
    /// Give up (returning the last status) once this much time has passed since the first try.
    pub deadline: Duration,
    /// Each attempt's bound, after which it ends DEADLINE_EXCEEDED (retried like any transient
    /// failure). None leaves the bound to the call: right for long streams, wrong for a small
    /// unary call, which would otherwise wait forever on an answer that never comes.
    pub attempt: Option<Duration>,
}

impl Default for RetryPolicy {
    /// 100 ms doubling to 5 s, for up to 10 minutes: long enough for a service to be restarted
    /// by its supervisor and replay its state, short enough that a dead peer surfaces.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            deadline: Duration::from_secs(600),
            attempt: None,
        }
    }
}

/// What to do about a failure that no retry can mend: a certificate the client cannot verify,
/// TLS spoken to a plaintext port or plaintext to a TLS one, a missing or unknown token. None
/// for anything else. Found by type in the status's source chain (rustls's and h2's errors),
/// never by a message's words.
pub fn misconfiguration(status: &Status) -> Option<&'static str> {
    if ErrorCode::of(status) == Some(ErrorCode::Unauthenticated) {
        return Some("pass --token (or set DPCAP_TOKEN) with a token of the role the call needs");
    }
    if ErrorCode::of(status).is_some() {
        return None;
    }
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(hint) = tls_hint(error) {
            return Some(hint);
        }
        // A TLS server's alert read as an HTTP/2 frame: its length field is far too large.
        if error.downcast_ref::<h2::Error>().and_then(h2::Error::reason) == Some(h2::Reason::FRAME_SIZE_ERROR) {
            return Some(PLAINTEXT_TO_TLS);
        }
        source = error.source();
    }
    None
}

const PLAINTEXT_TO_TLS: &str = "the server speaks TLS: use an https:// endpoint and --tls-ca";

/// The advice for a rustls failure (rustls reaches the chain inside an `io::Error`).
fn tls_hint(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let tls = match error.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        None => error.downcast_ref::<rustls::Error>(),
    }?;
    match tls {
        rustls::Error::InvalidCertificate(_) => Some(
            "the server's certificate is not trusted: pass --tls-ca with the CA that signed it (and --tls-domain if the name differs)",
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateHandshakeMessage { .. } => {
            Some("the server speaks plaintext: use an http:// endpoint (or start the server with --tls-cert)")
        }
        rustls::Error::AlertReceived(_) => Some(
            "the server refused the TLS handshake: it may need a client certificate (--tls-client-cert/--tls-client-key)",
        ),
        _ => None,
    }
}

/// Advice for any failure: a [`misconfiguration`], or, for a connection the server closed at
/// once, that it may speak TLS (transient all the same: a restarting server does that too).
pub fn hint(status: &Status) -> Option<&'static str> {
    misconfiguration(status).or_else(|| {
        let mut source = std::error::Error::source(status);
        while let Some(error) = source {
            if error.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) {
                return Some(
                    "the server closed the connection at once; if it speaks TLS, use an https:// endpoint and --tls-ca",
                );
            }
            source = error.source();
        }
        None
    })
}

/// Whether `status` is worth retrying: a dpcap service that says UNAVAILABLE (starting,
/// replaying, draining), or a failure that did not come from a dpcap handler at all (the
/// transport, a broken stream, a peer that is gone) unless it is a misconfiguration (a bad
/// certificate is not transient: see [`misconfiguration`]).
pub fn is_transient(status: &Status) -> bool {
    if misconfiguration(status).is_some() {
        return false;
    }
    match ErrorCode::of(status) {
        Some(code) => code == ErrorCode::Unavailable,
        None => matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled | Code::Internal
        ),
    }
}

/// The backoff before attempt `attempt` (0-based): full jitter over an exponential cap.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let cap = policy.initial.saturating_mul(1u32 << attempt.min(16)).min(policy.max);
    let mut bytes = [0u8; 8];
    let unit = match getrandom::fill(&mut bytes) {
        Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    };
    cap.mul_f64(0.5 + 0.5 * unit)
}

/// A call's failure as [`retry`] sees it: a raw `Status`, or a typed client's `ClientError`.
pub trait Retryable: std::fmt::Display {
    /// Whether the same call may succeed later.
    fn is_transient(&self) -> bool;
    /// The failure of an attempt cut at its bound (DEADLINE_EXCEEDED, which is transient).
    fn timed_out(message: String) -> Self;
}

impl Retryable for Status {
    fn is_transient(&self) -> bool {
        is_transient(self)
    }

    fn timed_out(message: String) -> Self {
        Status::deadline_exceeded(message)
    }
}

impl Retryable for crate::client::ClientError {
    fn is_transient(&self) -> bool {
        self.transient
    }

    fn timed_out(message: String) -> Self {
        Status::deadline_exceeded(message).into()
    }
}

/// Runs `call` until it succeeds, fails permanently, or the policy's deadline passes. `what`
/// names the call in the logs.
pub async fn retry<T, E, F, Fut>(policy: RetryPolicy, what: &str, mut call: F) -> Result<T, E>
where
    E: Retryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut attempt = 0u32;
    loop {
        let outcome = match policy.attempt {
            None => call().await,
            Some(bound) => tokio::time::timeout(bound, call()).await.unwrap_or_else(|_| {
                // A small call that outlives its bound is an anomaly worth seeing, not noise.
                tracing::warn!(
                    call = what,
                    attempt,
                    bound_s = bound.as_secs_f64(),
                    "no answer within the attempt's bound"
                );
                Err(E::timed_out(format!("{what}: no answer within {:.1} s", bound.as_secs_f64())))
            }),
        };
        match outcome {
            Ok(value) => return Ok(value),
            Err(error) if error.is_transient() && started.elapsed() < policy.deadline => {
                let wait = backoff(&policy, attempt);
                tracing::debug!(call = what, attempt, %error, wait_ms = wait.as_millis() as u64, "transient failure; retrying");
                tokio::time::sleep(wait).await;
                attempt = attempt.saturating_add(1);
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::error::{ServiceError, to_status};

    #[derive(Debug, thiserror::Error)]
    #[error("replaying the ledger")]
    struct Starting;

    impl ServiceError for Starting {
        fn error_code(&self) -> ErrorCode {
            ErrorCode::Unavailable
        }
    }

    fn quick() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
            deadline: Duration::from_secs(5),
            attempt: None,
        }
    }

    #[tokio::test]
    async fn an_attempt_that_never_answers_is_cut_at_its_bound_and_retried() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy { attempt: Some(Duration::from_millis(20)), ..quick() };
        let answered = retry(policy, "close_job", || {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    std::future::pending::<()>().await; // an answer that never comes
                }
                Ok::<_, Status>(7)
            }
        })
        .await;
        assert_eq!(answered.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the stuck attempt was cut and retried once");
        // Never answering at all ends DEADLINE_EXCEEDED at the policy's deadline, naming the call.
        let policy =
            RetryPolicy { attempt: Some(Duration::from_millis(10)), deadline: Duration::from_millis(50), ..quick() };
        let stuck = retry(policy, "audit_job", std::future::pending::<Result<(), Status>>).await.unwrap_err();
        assert_eq!(stuck.code(), Code::DeadlineExceeded);
        assert!(stuck.message().starts_with("audit_job: no answer within"), "{stuck:?}");
    }

    #[tokio::test]
    async fn transient_failures_are_retried_until_the_call_succeeds() {
        let calls = AtomicU32::new(0);
        let result = retry(quick(), "test", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(Status::unavailable("connection refused")),
                1 => Err(to_status(Starting)),
                2 => Err(Status::unknown("transport error")),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(result.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_permanent_failure_returns_at_once() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = retry(quick(), "test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Status::invalid_argument("bad field"))
        })
        .await;
        assert_eq!(result.unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn retries_stop_at_the_deadline() {
        let policy = RetryPolicy { deadline: Duration::from_millis(30), ..quick() };
        let result: Result<(), _> = retry(policy, "test", || async { Err(Status::unavailable("down")) }).await;
        assert_eq!(result.unwrap_err().code(), Code::Unavailable);
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let policy = RetryPolicy { initial: Duration::from_millis(100), max: Duration::from_secs(1), ..quick() };
        let first = backoff(&policy, 0);
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
        let late = backoff(&policy, 30);
        assert!(late >= Duration::from_millis(500) && late <= Duration::from_secs(1), "{late:?}");
    }
}
