//! The worker's outer loop: register, heartbeat, and run each assignment as a [`Session`]
//! while a heartbeat task keeps the lease. A lost lease (coordinator restart, long pause)
//! means registering again; a shutdown stops between steps' RPCs.

use std::future::Future;
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use dpcap_accountant::client::AccountantClient;
use dpcap_proto::auth::AttachToken;
use dpcap_proto::v1::worker_service_client::WorkerServiceClient;
use dpcap_proto::v1::{HeartbeatRequest, RegisterWorkerRequest};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::runtime::RuntimeError;
use crate::runtime::session::Session;

/// The coordinator's WorkerService client with the cluster token attached.
pub type CoordinatorClient = WorkerServiceClient<InterceptedService<Channel, AttachToken>>;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The coordinator, e.g. "http://127.0.0.1:7071".
    pub coordinator: String,
    /// Shown in listings.
    pub name: String,
    /// "cpu" or "cuda:N".
    pub device: String,
    /// The cluster bearer token, if the coordinator requires one.
    pub cluster_token: Option<String>,
    /// Watchdog for NCCL collectives: a peer silent this long aborts the communicator and the
    /// group re-forms.
    pub collective_timeout: Duration,
    /// Dtype of the matrix products in the ClipEngine (norms and sums stay f32).
    pub precision: crate::clip::Precision,
}

async fn connect(config: &WorkerConfig) -> Result<CoordinatorClient, RuntimeError> {
    let channel = tonic::transport::Endpoint::from_shared(config.coordinator.clone())
        .map_err(|e| RuntimeError::Spec { field: "coordinator", reason: e.to_string() })?
        .connect_lazy();
    Ok(WorkerServiceClient::with_interceptor(channel, AttachToken(config.cluster_token.clone())))
}

/// Runs the worker until `shutdown` resolves.
pub async fn run<AB: AutodiffBackend>(
    config: WorkerConfig,
    device: AB::Device,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RuntimeError> {
    let coordinator = connect(&config).await?;
    tokio::pin!(shutdown);
    tokio::select! {
        result = serve::<AB>(&config, coordinator, &device) => result,
        _ = &mut shutdown => {
            tracing::info!(name = %config.name, "worker shutting down");
            Ok(())
        }
    }
}

async fn serve<AB: AutodiffBackend>(
    config: &WorkerConfig,
    mut coordinator: CoordinatorClient,
    device: &AB::Device,
) -> Result<(), RuntimeError> {
    loop {
        let request =
            RegisterWorkerRequest { name: config.name.clone(), device: config.device.clone(), throughput: 0.0 };
        let registered = match coordinator.register_worker(request).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::Unavailable || s.code() == tonic::Code::Unknown => {
                tracing::debug!(error = %s, "coordinator unreachable; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(s) => return Err(s.into()),
        };
        let worker_id = registered.worker_id;
        let beat = Duration::from_millis(u64::from(registered.lease_seconds.max(1)) * 1000 / 4);
        tracing::info!(worker_id, name = %config.name, accountant = %registered.accountant_endpoint, "registered");
        let accountant = loop {
            match AccountantClient::connect(registered.accountant_endpoint.clone()).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::debug!(error = %e, "accountant unreachable; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        // Heartbeat; run assignments; stop when the lease is lost.
        loop {
            let assignment = match coordinator.heartbeat(HeartbeatRequest { worker_id: worker_id.clone() }).await {
                Ok(r) => r.into_inner().assignment,
                Err(s) if s.code() == tonic::Code::NotFound => break,
                Err(s) => {
                    tracing::debug!(error = %s, "heartbeat failed; retrying");
                    tokio::time::sleep(beat).await;
                    continue;
                }
            };
            let Some(assignment) = assignment else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let (job_id, rank, assignment_generation) =
                (assignment.job_id.clone(), assignment.rank, assignment.generation);
            tracing::info!(worker_id, job_id, rank, generation = assignment.generation, "assigned");
            let session = async {
                let session = Session::<AB>::start(
                    (worker_id.clone(), assignment),
                    (coordinator.clone(), accountant.clone()),
                    (config, device),
                )
                .await?;
                session.run().await
            };
            let generation = assignment_generation;
            let result = tokio::select! {
                r = session => r,
                ended = keep_lease(coordinator.clone(), worker_id.clone(), (&job_id, generation), beat) => Err(ended),
            };
            match result {
                Ok(()) => {}
                Err(RuntimeError::LeaseLost) => break,
                Err(RuntimeError::Superseded) => {
                    tracing::info!(worker_id, job_id, rank, generation, "group re-formed; session dropped");
                }
                Err(e) => {
                    tracing::error!(worker_id, job_id, rank, error = %e, "session failed");
                    fail_job(&mut coordinator, &worker_id, &job_id, &e).await;
                }
            }
        }
        tracing::warn!(worker_id, "lease lost; registering again");
    }
}

/// Heartbeats until the coordinator forgets this worker ([`RuntimeError::LeaseLost`]) or no
/// longer lists it in generation `generation` of `job_id` ([`RuntimeError::Superseded`]: a
/// peer was lost and the group re-formed, so a step this rank waits on can never complete).
async fn keep_lease(
    mut coordinator: CoordinatorClient,
    worker_id: String,
    (job_id, generation): (&str, u64),
    beat: Duration,
) -> RuntimeError {
    loop {
        tokio::time::sleep(beat).await;
        match coordinator.heartbeat(HeartbeatRequest { worker_id: worker_id.clone() }).await {
            Err(s) if s.code() == tonic::Code::NotFound => return RuntimeError::LeaseLost,
            Err(_) => {} // unreachable for a beat: the lease has slack
            Ok(r) => match r.into_inner().assignment {
                Some(a) if a.job_id == job_id && a.generation == generation => {}
                _ => return RuntimeError::Superseded,
            },
        }
    }
}

/// A session that could not start (bad spec, unreadable data) fails its job with the reason.
async fn fail_job(coordinator: &mut CoordinatorClient, worker_id: &str, job_id: &str, error: &RuntimeError) {
    let Ok(Some(assignment)) = coordinator
        .heartbeat(HeartbeatRequest { worker_id: worker_id.into() })
        .await
        .map(|r| r.into_inner().assignment)
    else {
        return;
    };
    if assignment.job_id != job_id {
        return;
    }
    let request = dpcap_proto::v1::GetStepRequest {
        worker_id: worker_id.into(),
        job_id: job_id.into(),
        generation: assignment.generation,
    };
    let Ok(work) = coordinator.get_step(request).await.map(|r| r.into_inner()) else { return };
    let outcome = if matches!(error, RuntimeError::BudgetExhausted(_)) {
        dpcap_proto::v1::StepOutcome::BudgetExhausted
    } else {
        dpcap_proto::v1::StepOutcome::Failed
    };
    let report = dpcap_proto::v1::ReportStepRequest {
        worker_id: worker_id.into(),
        job_id: job_id.into(),
        generation: assignment.generation,
        step: work.step,
        outcome: outcome as i32,
        message: error.to_string(),
        ..Default::default()
    };
    let _ = coordinator.report_step(report).await;
}
