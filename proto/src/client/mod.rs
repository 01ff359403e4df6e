//! Typed clients of dpcap's services and the credentials they carry on every call, so that no
//! service or tool depends on another service's crate to call it.
//!
//! A call carries up to three credentials, each as gRPC metadata: the bearer token of its role
//! (`authorization`), the worker's own registration key towards the coordinator
//! ([`WORKER_KEY_HEADER`]), and the coordinator-signed capability for one job towards the
//! accountant ([`CAPABILITY_HEADER`]). None of them is ever logged.

mod accountant;

use std::fmt;
use std::sync::{Arc, RwLock};

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::v1::worker_service_client::WorkerServiceClient;

pub use accountant::{AccountantClient, CHUNK_VALUES, PartKey, RawClient};

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
#[derive(Clone, Default)]
pub struct AttachToken(pub Option<String>);

impl fmt::Debug for AttachToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "AttachToken(set)" } else { "AttachToken(none)" })
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        attach(&mut request, "authorization", self.0.as_deref().map(|t| format!("Bearer {t}")))?;
        Ok(request)
    }
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

    /// The current capability ("" before the first).
    pub fn get(&self) -> String {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A worker's credentials on every call: its role's token, and towards the coordinator its
/// registration key, towards the accountant its current capability.
#[derive(Clone, Default)]
pub struct CallCredentials {
    token: Option<String>,
    worker_key: Option<String>,
    capability: Option<CapabilityCell>,
}

impl CallCredentials {
    /// The bearer token alone.
    pub fn token(token: Option<String>) -> Self {
        Self { token, ..Self::default() }
    }

    /// Adds the worker's registration key.
    pub fn with_worker_key(mut self, key: String) -> Self {
        self.worker_key = Some(key);
        self
    }

    /// Adds a capability cell.
    pub fn with_capability(mut self, capability: CapabilityCell) -> Self {
        self.capability = Some(capability);
        self
    }
}

impl fmt::Debug for CallCredentials {
    /// Which credentials are set, never their values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallCredentials")
            .field("token", &self.token.is_some())
            .field("worker_key", &self.worker_key.is_some())
            .field("capability", &self.capability.is_some())
            .finish()
    }
}

impl Interceptor for CallCredentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        attach(&mut request, "authorization", self.token.as_deref().map(|t| format!("Bearer {t}")))?;
        attach(&mut request, WORKER_KEY_HEADER, self.worker_key.clone())?;
        attach(&mut request, CAPABILITY_HEADER, self.capability.as_ref().map(CapabilityCell::get))?;
        Ok(request)
    }
}

/// The coordinator's WorkerService client with a worker's credentials.
pub type CoordinatorClient = WorkerServiceClient<InterceptedService<Channel, CallCredentials>>;

/// A WorkerService client of `endpoint` (TLS already configured on it) that connects on first
/// use; work messages may be as large as [`crate::MAX_WORK_MESSAGE_BYTES`].
pub fn coordinator_client(endpoint: Endpoint, credentials: CallCredentials) -> CoordinatorClient {
    WorkerServiceClient::with_interceptor(endpoint.connect_lazy(), credentials)
        .max_decoding_message_size(crate::MAX_WORK_MESSAGE_BYTES)
        .max_encoding_message_size(crate::MAX_WORK_MESSAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_attach_what_is_set_and_never_show_it() {
        let cell = CapabilityCell::new("cap-1".into());
        let mut creds = CallCredentials::token(Some("t".repeat(20))).with_capability(cell.clone());
        cell.set("cap-2".into());
        let request = creds.call(Request::new(())).unwrap();
        let meta = request.metadata();
        assert_eq!(meta.get("authorization").unwrap(), &format!("Bearer {}", "t".repeat(20)));
        assert_eq!(meta.get(CAPABILITY_HEADER).unwrap(), "cap-2", "the renewed capability is sent");
        assert!(meta.get(WORKER_KEY_HEADER).is_none());
        assert!(!format!("{creds:?}").contains("cap-2") && !format!("{creds:?}").contains("tttt"));
    }
}
