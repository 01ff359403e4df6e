//! Bearer-token checks: one token for operators (JobService), one for cluster members
//! (WorkerService). A service started without a token accepts every caller (the local demo).

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Checks `authorization: Bearer <token>` when a token is configured.
#[derive(Debug, Clone)]
pub struct BearerAuth {
    expected: Option<String>,
}

impl BearerAuth {
    /// Requires `token` when `Some` and non-empty.
    pub fn new(token: Option<String>) -> Self {
        Self { expected: token.filter(|t| !t.is_empty()).map(|t| format!("Bearer {t}")) }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else { return Ok(request) };
        let given = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        // Constant-time comparison: the token must not leak through timing.
        let matches = given.is_some_and(|g| {
            g.len() == expected.len() && g.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        });
        if matches { Ok(request) } else { Err(Status::unauthenticated("missing or invalid bearer token")) }
    }
}

/// Adds `authorization: Bearer <token>` to outgoing requests when a token is set.
#[derive(Debug, Clone)]
pub struct AttachToken(pub Option<String>);

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = self.0.as_deref().filter(|t| !t.is_empty()) {
            let value =
                format!("Bearer {token}").parse().map_err(|_| Status::invalid_argument("token is not valid ASCII"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}
