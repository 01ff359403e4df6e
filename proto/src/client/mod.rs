//! Typed clients of dpcap's services and the credentials they carry on every call, so that no
//! service or tool depends on another service's crate to call it.
//!
//! A call carries up to three credentials, each as gRPC metadata: the bearer token of its role
//! (`authorization`), the worker's own registration key towards the coordinator
//! ([`WORKER_KEY_HEADER`]), and the coordinator-signed capability for one job towards the
//! accountant ([`CAPABILITY_HEADER`]). None of them is ever logged.

mod accountant;
mod jobs;
mod local;
mod workers;

use std::fmt;
use std::sync::{Arc, RwLock};

use tonic::service::Interceptor;
use tonic::transport::Endpoint;
use tonic::{Request, Status};

use crate::Secret;

pub use accountant::{AccountantClient, CHUNK_VALUES, PartKey, RawClient};
pub use jobs::{ClientError, JobsClient, RawJobsClient};
pub use local::{Fetched, LocalChoice};
pub use workers::{CoordinatorClient, RawCoordinatorClient};

/// Metadata carrying a rank's capability for one job (see `Assignment.capability`).
pub const CAPABILITY_HEADER: &str = "x-dpcap-capability";

/// Metadata carrying a worker's registration key (see `RegisterWorkerResponse.worker_key`).
pub const WORKER_KEY_HEADER: &str = "x-dpcap-worker-key";

/// Largest gRPC message of the accountant's bulk streams (a part or release chunk): 8 MiB.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;

/// HTTP/2 frames of 1 MiB (the default 16 KiB costs a frame header and a wake-up per 16 KiB of
/// a 760 MB part).
pub const MAX_FRAME_BYTES: u32 = 1 << 20;

/// Settings for streams of hundreds of MB: windows that grow to the bandwidth-delay product and
/// large frames.
pub fn bulk(endpoint: Endpoint) -> Endpoint {
    endpoint.http2_adaptive_window(true).max_frame_size(MAX_FRAME_BYTES).tcp_nodelay(true)
}

/// Adds `authorization: Bearer <token>` to a client's requests when a token is set.
#[derive(Debug, Clone, Default)]
pub struct AttachToken(pub Option<Secret>);

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        attach(&mut request, "authorization", bearer(&self.0))?;
        Ok(request)
    }
}

fn bearer(token: &Option<Secret>) -> Option<String> {
    token.as_ref().map(|t| format!("Bearer {}", t.expose()))
}

fn attach(request: &mut Request<()>, key: &'static str, value: Option<String>) -> Result<(), Status> {
    if let Some(value) = value.filter(|v| !v.is_empty()) {
        let value = value.parse().map_err(|_| Status::invalid_argument(format!("invalid {key}: not ASCII")))?;
        request.metadata_mut().insert(key, value);
    }
    Ok(())
}

/// A capability that the worker's lease task renews while calls read it: the latest one the
/// coordinator issued is attached to every accountant call.
#[derive(Clone, Default)]
pub struct CapabilityCell(Arc<RwLock<String>>);

impl CapabilityCell {
    /// A cell holding `capability`.
    pub fn new(capability: String) -> Self {
        Self(Arc::new(RwLock::new(capability)))
    }

    /// Replaces the capability (a renewal, or a new generation's).
    pub fn set(&self, capability: String) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = capability;
    }

    /// Replaces the capability when `supersedes(held)` says the new one is newer, deciding
    /// under the cell's lock (a heartbeat and a step's work may both renew it at once).
    pub fn renew(&self, capability: String, supersedes: impl FnOnce(&str) -> bool) {
        let mut held = self.0.write().unwrap_or_else(|p| p.into_inner());
        if supersedes(&held) {
            *held = capability;
        }
    }

    /// The current capability ("" before the first).
    pub fn get(&self) -> String {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A worker's credentials on every call: its role's token, and towards the coordinator its
/// registration key, towards the accountant its current capability.
#[derive(Clone, Default)]
pub struct CallCredentials {
    token: Option<Secret>,
    worker_key: Option<Secret>,
    capability: Option<CapabilityCell>,
}

impl CallCredentials {
    /// The bearer token alone.
    pub fn token(token: Option<Secret>) -> Self {
        Self { token, ..Self::default() }
    }

    /// Adds the worker's registration key.
    pub fn with_worker_key(mut self, key: String) -> Self {
        self.worker_key = Some(key.into());
        self
    }

    /// Adds a capability cell.
    pub fn with_capability(mut self, capability: CapabilityCell) -> Self {
        self.capability = Some(capability);
        self
    }

    /// The `authorization` value a call carries ("" without a token).
    fn authorization(&self) -> String {
        bearer(&self.token).unwrap_or_default()
    }

    /// The capability a call carries now ("" without one).
    fn capability(&self) -> String {
        self.capability.as_ref().map(CapabilityCell::get).unwrap_or_default()
    }
}

impl fmt::Debug for CallCredentials {
    /// Which credentials are set, never their values (the capability cell is no `Secret`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallCredentials")
            .field("token", &self.token)
            .field("worker_key", &self.worker_key)
            .field("capability", &self.capability.is_some())
            .finish()
    }
}

impl Interceptor for CallCredentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        attach(&mut request, "authorization", bearer(&self.token))?;
        attach(&mut request, WORKER_KEY_HEADER, self.worker_key.as_ref().map(|k| k.expose().to_owned()))?;
        attach(&mut request, CAPABILITY_HEADER, self.capability.as_ref().map(CapabilityCell::get))?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_attach_what_is_set_and_never_show_it() {
        let cell = CapabilityCell::new("cap-1".into());
        let mut creds = CallCredentials::token(Some("t".repeat(20).into())).with_capability(cell.clone());
        cell.set("cap-2".into());
        let request = creds.call(Request::new(())).unwrap();
        let meta = request.metadata();
        assert_eq!(meta.get("authorization").unwrap(), &format!("Bearer {}", "t".repeat(20)));
        assert_eq!(meta.get(CAPABILITY_HEADER).unwrap(), "cap-2", "the renewed capability is sent");
        assert!(meta.get(WORKER_KEY_HEADER).is_none());
        assert!(!format!("{creds:?}").contains("cap-2") && !format!("{creds:?}").contains("tttt"));
    }
}
