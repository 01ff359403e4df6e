//! How a worker process runs: its coordinator, name, device, credentials and the settings of
//! its compute and collectives.

use std::time::Duration;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The coordinator, e.g. "http://127.0.0.1:7071".
    pub coordinator: String,
    /// Shown in listings.
    pub name: String,
    /// "cpu" or "cuda:N".
    pub device: String,
    /// The worker-role bearer token, presented to the coordinator and the accountant.
    pub cluster_token: Option<dpcap_proto::Secret>,
    /// TLS towards the coordinator and the accountant (https:// endpoints).
    pub tls: dpcap_serve::ClientTlsArgs,
    /// Watchdog for NCCL collectives: a peer silent this long aborts the communicator and the
    /// group re-forms.
    pub collective_timeout: Duration,
    /// Dtype of the matrix products in the ClipEngine (norms and sums stay f32).
    pub precision: dpcap_ml::clip::Precision,
}
