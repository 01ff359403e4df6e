//! A typed client of the coordinator's WorkerService, as a worker calls it (with its token and,
//! once registered, its registration key): each call fails with a [`ClientError`].

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::{CallCredentials, ClientError};
use crate::v1::worker_service_client::WorkerServiceClient;
use crate::v1::{
    GetStepRequest, HeartbeatRequest, HeartbeatResponse, LeaveRequest, LeaveResponse, RegisterWorkerRequest,
    RegisterWorkerResponse, RendezvousRequest, RendezvousResponse, ReportStepRequest, ReportStepResponse, StepWork,
};

/// The generated WorkerService client with a worker's credentials.
pub type RawCoordinatorClient = WorkerServiceClient<InterceptedService<Channel, CallCredentials>>;

/// The coordinator's WorkerService, as a worker calls it.
#[derive(Debug, Clone)]
pub struct CoordinatorClient {
    inner: RawCoordinatorClient,
}

impl CoordinatorClient {
    /// A client of `endpoint` (TLS already configured on it) that connects on first use; work
    /// messages may be as large as [`crate::MAX_WORK_MESSAGE_BYTES`].
    pub fn lazy(endpoint: Endpoint, credentials: CallCredentials) -> Self {
        let inner = WorkerServiceClient::with_interceptor(endpoint.connect_lazy(), credentials)
            .max_decoding_message_size(crate::MAX_WORK_MESSAGE_BYTES)
            .max_encoding_message_size(crate::MAX_WORK_MESSAGE_BYTES);
        Self { inner }
    }

    /// The generated client, for calls without a helper here.
    pub fn raw(&mut self) -> &mut RawCoordinatorClient {
        &mut self.inner
    }

    /// Registers the worker: its id, key, lease and the accountant's endpoint.
    pub async fn register_worker(
        &mut self,
        request: RegisterWorkerRequest,
    ) -> Result<RegisterWorkerResponse, ClientError> {
        Ok(self.inner.register_worker(request).await?.into_inner())
    }

    /// Renews the lease; the answer carries the worker's assignment, if any.
    pub async fn heartbeat(&mut self, worker_id: &str) -> Result<HeartbeatResponse, ClientError> {
        Ok(self.inner.heartbeat(HeartbeatRequest { worker_id: worker_id.to_owned() }).await?.into_inner())
    }

    /// The next step's work for a rank of a generation.
    pub async fn get_step(&mut self, request: GetStepRequest) -> Result<StepWork, ClientError> {
        Ok(self.inner.get_step(request).await?.into_inner())
    }

    /// Reports a step's outcome.
    pub async fn report_step(&mut self, request: ReportStepRequest) -> Result<ReportStepResponse, ClientError> {
        Ok(self.inner.report_step(request).await?.into_inner())
    }

    /// Exchanges a generation's NCCL id (rank 0 publishes it, the others read it).
    pub async fn rendezvous(&mut self, request: RendezvousRequest) -> Result<RendezvousResponse, ClientError> {
        Ok(self.inner.rendezvous(request).await?.into_inner())
    }

    /// Leaves the worker's group at once (a shutdown), rather than at its lease's expiry.
    pub async fn leave(&mut self, worker_id: &str) -> Result<LeaveResponse, ClientError> {
        Ok(self.inner.leave(LeaveRequest { worker_id: worker_id.to_owned() }).await?.into_inner())
    }
}
