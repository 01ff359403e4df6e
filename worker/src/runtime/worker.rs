//! The worker's outer loop: register, keep the lease, and run each assignment as a
//! [`Session`]. The lease is kept by its own task for as long as the registration lives, so
//! liveness never depends on how long a step computes; the session only watches what the
//! lease task learns (a new generation, a lost lease). On shutdown the worker leaves its group
//! so that the coordinator re-forms it at once instead of waiting out the lease.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell, CoordinatorClient};
use dpcap_proto::v1::{Assignment, RegisterWorkerRequest, TelemetryMode};
use dpcap_proto::{ErrorCode, RetryPolicy, retry};
use tokio::sync::watch;

use crate::runtime::RuntimeError;
use crate::runtime::config::WorkerConfig;
use crate::runtime::session::{Clients, Session};

/// What the lease task knows of this worker's registration.
#[derive(Debug, Clone, PartialEq)]
enum Lease {
    /// Registered, not yet confirmed by a heartbeat.
    Unknown,
    /// Held; the assignment, if the worker belongs to a running group.
    Held(Option<Box<Assignment>>),
    /// The coordinator no longer knows this worker: register again.
    Lost,
}

/// How long a stopping worker waits for its Leave call.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often an idle worker (no assignment) asks for one.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// A coordinator client presenting the worker token and, once registered, the worker's key.
fn connect(config: &WorkerConfig, key: Option<String>) -> Result<CoordinatorClient, RuntimeError> {
    let endpoint = config
        .tls
        .endpoint(&config.coordinator)
        .map_err(|source| RuntimeError::Endpoint { field: "coordinator", source })?;
    let credentials = CallCredentials::token(config.cluster_token.clone());
    let credentials = match key {
        Some(key) => credentials.with_worker_key(key),
        None => credentials,
    };
    Ok(CoordinatorClient::lazy(endpoint, credentials))
}

/// Runs the worker until `shutdown` resolves, then leaves its group.
pub async fn run<AB: AutodiffBackend>(
    config: WorkerConfig,
    device: AB::Device,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RuntimeError> {
    let coordinator = connect(&config, None)?;
    let registered: Arc<Mutex<Option<(String, CoordinatorClient)>>> = Arc::default();
    tokio::pin!(shutdown);
    tokio::select! {
        result = serve::<AB>(&config, coordinator, &device, registered.clone()) => result,
        _ = &mut shutdown => {
            let worker = registered.lock().expect("registration lock").clone();
            if let Some((worker_id, mut client)) = worker {
                tracing::info!(worker_id, name = %config.name, "worker shutting down: leaving its group");
                let leave = client.leave(&worker_id);
                match tokio::time::timeout(LEAVE_TIMEOUT, leave).await {
                    Ok(Ok(_)) => {}
                    // The coordinator is stopping too (an embedded cluster, a rolling restart).
                    Ok(Err(e)) if e.transient => {
                        tracing::debug!(error = %e, "coordinator unreachable; the group re-forms when the lease expires")
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not leave; the group re-forms when the lease expires"),
                    Err(_) => tracing::warn!("leave timed out; the group re-forms when the lease expires"),
                }
            }
            Ok(())
        }
    }
}

async fn serve<AB: AutodiffBackend>(
    config: &WorkerConfig,
    registrar: CoordinatorClient,
    device: &AB::Device,
    registered: Arc<Mutex<Option<(String, CoordinatorClient)>>>,
) -> Result<(), RuntimeError> {
    let forever = RetryPolicy { deadline: Duration::MAX, ..RetryPolicy::default() };
    loop {
        let request = RegisterWorkerRequest { name: config.name.clone(), device: config.device.clone() };
        let response = retry(forever, "register_worker", || {
            let (mut client, request) = (registrar.clone(), request.clone());
            async move { client.register_worker(request).await }
        })
        .await?;
        let worker_id = response.worker_id;
        // Every later call of this registration carries its key.
        let coordinator = connect(config, Some(response.worker_key))?;
        *registered.lock().expect("registration lock") = Some((worker_id.clone(), coordinator.clone()));
        let beat = Duration::from_millis(u64::from(response.lease_seconds.max(1)) * 1000 / 4);
        tracing::info!(worker_id, name = %config.name, accountant = %response.accountant_endpoint, "registered");
        let endpoint = config
            .tls
            .endpoint(&response.accountant_endpoint)
            .map_err(|source| RuntimeError::Endpoint { field: "accountant_endpoint", source })?;
        let capability = CapabilityCell::default();
        let credentials = CallCredentials::token(config.cluster_token.clone()).with_capability(capability.clone());
        let accountant = AccountantClient::lazy(endpoint, credentials);
        let (lease_tx, mut lease) = watch::channel(Lease::Unknown);
        let keeper = KeeperGuard(tokio::spawn(keep_lease(
            coordinator.clone(),
            worker_id.clone(),
            beat,
            (lease_tx, capability.clone()),
        )));
        loop {
            let assignment = match next_assignment(&mut lease).await {
                Some(a) => a,
                None => break,
            };
            let (job_id, rank, generation) = (assignment.job_id.clone(), assignment.rank, assignment.generation);
            // A failure's report withholds what names an example under `telemetry: strict` (and
            // for an assignment without a spec, which says nothing of its telemetry).
            let strict = assignment.spec.as_ref().is_none_or(|s| s.telemetry == TelemetryMode::Strict as i32);
            tracing::info!(worker_id, job_id, rank, generation, "assigned");
            let session = async {
                let clients = Clients {
                    coordinator: coordinator.clone(),
                    accountant: accountant.clone(),
                    capability: capability.clone(),
                };
                Session::<AB>::start((worker_id.clone(), assignment), clients, (config, device)).await?.run().await
            };
            let result = tokio::select! {
                r = session => r,
                ended = superseded(lease.clone(), &job_id, generation) => Err(ended),
            };
            match result {
                Ok(()) => {}
                Err(RuntimeError::LeaseLost) => break,
                Err(RuntimeError::Superseded) => {
                    tracing::info!(worker_id, job_id, rank, generation, "group re-formed; session dropped");
                }
                Err(e) => {
                    if matches!(e, RuntimeError::Revoked(_)) {
                        tracing::info!(worker_id, job_id, rank, error = %e, "generation revoked; reporting it");
                    } else {
                        tracing::error!(worker_id, job_id, rank, error = %e, "session failed");
                    }
                    let reported = super::session::reported_error(&e, strict);
                    fail_job(&mut coordinator.clone(), &worker_id, (&job_id, generation), (&e, reported)).await;
                }
            }
            // Wait for the lease task's next word before taking the same assignment again.
            let _ = lease.changed().await;
        }
        drop(keeper);
        tracing::warn!(worker_id, "lease lost; registering again");
    }
}

/// Aborts the lease task when the registration it keeps is over.
struct KeeperGuard(tokio::task::JoinHandle<()>);

impl Drop for KeeperGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Heartbeats every `beat` (every [`IDLE_POLL`] while unassigned) and publishes what the
/// coordinator says, until it no longer knows this worker; each heartbeat renews the
/// capability the accountant client carries. It runs on its own task, so a step that computes
/// for minutes never starves it (nor lets its capability expire).
async fn keep_lease(
    mut coordinator: CoordinatorClient,
    worker_id: String,
    beat: Duration,
    (lease, capability): (watch::Sender<Lease>, CapabilityCell),
) {
    loop {
        match coordinator.heartbeat(&worker_id).await {
            Ok(r) => {
                let assignment = r.assignment.map(|mut a| {
                    // Renewed every beat: kept apart, so that only a new assignment wakes the
                    // session, and set before the assignment is published.
                    super::renew(&capability, std::mem::take(&mut a.capability));
                    Box::new(a)
                });
                lease.send_if_modified(|held| {
                    let new = Lease::Held(assignment);
                    let changed = *held != new;
                    *held = new;
                    changed
                });
            }
            Err(e) if e.code == Some(ErrorCode::WorkerNotRegistered) => {
                lease.send_replace(Lease::Lost);
                return;
            }
            Err(e) => tracing::debug!(worker_id, error = %e, "heartbeat failed; the lease has slack"),
        }
        let idle = matches!(&*lease.borrow(), Lease::Held(None) | Lease::Unknown);
        tokio::time::sleep(if idle { beat.min(IDLE_POLL) } else { beat }).await;
    }
}

/// The next assignment the lease task reports; None once the lease is lost.
async fn next_assignment(lease: &mut watch::Receiver<Lease>) -> Option<Assignment> {
    loop {
        match &*lease.borrow_and_update() {
            Lease::Lost => return None,
            Lease::Held(Some(a)) => return Some(a.as_ref().clone()),
            Lease::Held(None) | Lease::Unknown => {}
        }
        if lease.changed().await.is_err() {
            return None;
        }
    }
}

/// Resolves when the lease is lost ([`RuntimeError::LeaseLost`]) or the coordinator no longer
/// lists this worker in generation `generation` of `job_id` ([`RuntimeError::Superseded`]: a
/// peer was lost and the group re-formed, so a step this rank waits on can never complete).
async fn superseded(mut lease: watch::Receiver<Lease>, job_id: &str, generation: u64) -> RuntimeError {
    loop {
        match &*lease.borrow_and_update() {
            Lease::Lost => return RuntimeError::LeaseLost,
            Lease::Held(Some(a)) if a.job_id == job_id && a.generation == generation => {}
            Lease::Unknown => {}
            Lease::Held(_) => return RuntimeError::Superseded,
        }
        if lease.changed().await.is_err() {
            return RuntimeError::LeaseLost;
        }
    }
}

/// A session that could not start or run (bad spec, unreadable data, a contract the accountant
/// refuses) fails its job with the reason as `reported` (withheld where it names an example
/// under `telemetry: strict`; the rank's own log keeps the detail): the report names the group's current step, or step
/// 0 when the group has none yet (the coordinator takes a failure for any step). Each call is
/// retried while the coordinator is unreachable; a report that still cannot be delivered makes
/// the worker leave, so that the group re-forms instead of waiting on it. A failure of a
/// generation the coordinator has replaced is not reported.
async fn fail_job(
    coordinator: &mut CoordinatorClient,
    worker_id: &str,
    (job_id, generation): (&str, u64),
    (error, reported): (&RuntimeError, String),
) {
    let policy = RetryPolicy::default();
    let assignment = retry(policy, "heartbeat", || {
        let (mut client, worker_id) = (coordinator.clone(), worker_id.to_owned());
        async move { client.heartbeat(&worker_id).await }
    })
    .await
    .map(|r| r.assignment);
    let Ok(Some(assignment)) = assignment else { return };
    // Only for the generation that failed: a newer group of the same job is not this failure's.
    if assignment.job_id != job_id || assignment.generation != generation {
        return;
    }
    let request = dpcap_proto::v1::GetStepRequest {
        worker_id: worker_id.into(),
        job_id: job_id.into(),
        generation: assignment.generation,
    };
    let step = coordinator.get_step(request).await.map_or(0, |r| r.step);
    let outcome = if matches!(error, RuntimeError::BudgetExhausted(_)) {
        dpcap_proto::v1::StepOutcome::BudgetExhausted
    } else {
        dpcap_proto::v1::StepOutcome::Failed
    };
    let report = dpcap_proto::v1::ReportStepRequest {
        worker_id: worker_id.into(),
        job_id: job_id.into(),
        generation: assignment.generation,
        step,
        outcome: outcome as i32,
        message: reported,
        ..Default::default()
    };
    let reported = retry(policy, "report_step", || {
        let (mut client, report) = (coordinator.clone(), report.clone());
        async move { client.report_step(report).await }
    })
    .await;
    if let Err(e) = reported {
        tracing::error!(worker_id, job_id, error = %e, "could not report the failure; leaving the group");
        let _ = coordinator.leave(worker_id).await;
    }
}
