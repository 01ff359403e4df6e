//! The gRPC faces of the coordinator: `dpcap.v1.JobService` for operators and
//! `dpcap.v1.WorkerService` for workers. Handlers translate and delegate to [`Coordinator`].

use std::pin::Pin;
use std::sync::Arc;

use dpcap_proto::client::WORKER_KEY_HEADER;
use dpcap_proto::to_status;
use dpcap_proto::v1::job_service_server::JobService;
use dpcap_proto::v1::worker_service_server::WorkerService;
use dpcap_proto::v1::{
    AuditJobRequest, AuditReport, CancelJobRequest, GetJobRequest, GetStepRequest, HeartbeatRequest, HeartbeatResponse,
    Job, LeaveRequest, LeaveResponse, ListJobsRequest, ListJobsResponse, RegisterWorkerRequest, RegisterWorkerResponse,
    RendezvousRequest, RendezvousResponse, ReportStepRequest, ReportStepResponse, ResumeJobRequest, StepOutcome,
    StepWork, SubmitJobRequest, WatchJobRequest,
};
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;
use crate::state::Report;
use dpcap_proto::job::is_terminal;

/// Operators' service.
#[derive(Debug, Clone)]
pub struct JobGrpc(pub Arc<Coordinator>);

/// Workers' service.
#[derive(Debug, Clone)]
pub struct WorkerGrpc {
    /// The coordinator.
    pub coordinator: Arc<Coordinator>,
    /// Told to every worker at registration.
    pub accountant_endpoint: String,
    /// The lease, in seconds.
    pub lease_seconds: u32,
}

type JobStream = Pin<Box<dyn Stream<Item = Result<Job, Status>> + Send>>;

#[tonic::async_trait]
impl JobService for JobGrpc {
    async fn submit_job(&self, request: Request<SubmitJobRequest>) -> Result<Response<Job>, Status> {
        let SubmitJobRequest { spec, idempotency_key } = request.into_inner();
        let spec = spec.ok_or_else(|| to_status(CoordinatorError::invalid("spec", "missing")))?;
        Ok(Response::new(self.0.submit(spec, &idempotency_key).await.map_err(to_status)?))
    }

    async fn get_job(&self, request: Request<GetJobRequest>) -> Result<Response<Job>, Status> {
        Ok(Response::new(self.0.get(&request.into_inner().job_id).map_err(to_status)?))
    }

    async fn list_jobs(&self, _request: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        Ok(Response::new(ListJobsResponse { jobs: self.0.list() }))
    }

    async fn cancel_job(&self, request: Request<CancelJobRequest>) -> Result<Response<Job>, Status> {
        Ok(Response::new(self.0.cancel(&request.into_inner().job_id).await.map_err(to_status)?))
    }

    async fn resume_job(&self, request: Request<ResumeJobRequest>) -> Result<Response<Job>, Status> {
        Ok(Response::new(self.0.resume(&request.into_inner().job_id).await.map_err(to_status)?))
    }

    async fn audit_job(&self, request: Request<AuditJobRequest>) -> Result<Response<AuditReport>, Status> {
        Ok(Response::new(self.0.audit(&request.into_inner().job_id).await.map_err(to_status)?))
    }

    type WatchJobStream = JobStream;

    async fn watch_job(&self, request: Request<WatchJobRequest>) -> Result<Response<JobStream>, Status> {
        let job_id = request.into_inner().job_id;
        let coordinator = self.0.clone();
        coordinator.snapshot(&job_id).map_err(to_status)?;
        let stream = async_stream(coordinator, job_id);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The job now, then each new version, ending after a final state or with UNAVAILABLE when
/// the coordinator drains (the watcher reconnects to its replacement).
fn async_stream(coordinator: Arc<Coordinator>, job_id: String) -> impl Stream<Item = Result<Job, Status>> {
    futures::stream::unfold((coordinator, job_id, None::<u64>, false), |(c, id, seen, done)| async move {
        if done {
            return None;
        }
        let mut changed = c.subscribe();
        let mut draining = c.draining();
        loop {
            if *draining.borrow_and_update() {
                return Some((Err(to_status(CoordinatorError::Draining)), (c, id, seen, true)));
            }
            match c.snapshot(&id) {
                Ok(Some((version, job))) if seen != Some(version) => {
                    let end = is_terminal(job.state);
                    return Some((Ok(job), (c, id, Some(version), end)));
                }
                // Seen already, or an end still settling: its effects' end wakes us.
                Ok(_) => {}
                Err(e) => return Some((Err(to_status(e)), (c, id, seen, true))),
            }
            tokio::select! {
                result = changed.changed() => if result.is_err() { return None },
                _ = draining.changed() => {}
            }
        }
    })
}

impl WorkerGrpc {
    /// Refuses a call that does not carry `worker_id`'s registration key.
    fn authenticate<T>(&self, request: &Request<T>, worker_id: &str) -> Result<(), Status> {
        let key = request.metadata().get(WORKER_KEY_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
        self.coordinator.authenticate(worker_id, key).map_err(to_status)
    }
}

#[tonic::async_trait]
impl WorkerService for WorkerGrpc {
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let r = request.into_inner();
        let (worker_id, worker_key) = self.coordinator.register_worker(r.name, r.device).await.map_err(to_status)?;
        Ok(Response::new(RegisterWorkerResponse {
            worker_id,
            worker_key,
            lease_seconds: self.lease_seconds,
            accountant_endpoint: self.accountant_endpoint.clone(),
        }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        self.authenticate(&request, &request.get_ref().worker_id)?;
        let assignment = self.coordinator.heartbeat(&request.into_inner().worker_id).map_err(to_status)?;
        Ok(Response::new(HeartbeatResponse { assignment }))
    }

    async fn get_step(&self, request: Request<GetStepRequest>) -> Result<Response<StepWork>, Status> {
        self.authenticate(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        Ok(Response::new(self.coordinator.next_step(&r.worker_id, &r.job_id, r.generation).await.map_err(to_status)?))
    }

    async fn report_step(&self, request: Request<ReportStepRequest>) -> Result<Response<ReportStepResponse>, Status> {
        self.authenticate(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let outcome = StepOutcome::try_from(r.outcome)
            .map_err(|_| to_status(CoordinatorError::invalid("outcome", format!("unknown value {}", r.outcome))))?;
        let report = Report {
            outcome,
            message: r.message,
            examples: r.examples,
            loss: r.loss,
            phases: [r.compute_seconds, r.reduce_seconds, r.release_seconds, r.update_seconds, r.checkpoint_seconds],
            checkpoint_step: r.checkpoint_step,
            nonfinite_examples: r.nonfinite_examples,
            dropped_examples: r.dropped_examples,
        };
        self.coordinator.report(&r.worker_id, &r.job_id, r.generation, r.step, report).await.map_err(to_status)?;
        Ok(Response::new(ReportStepResponse {}))
    }

    async fn leave(&self, request: Request<LeaveRequest>) -> Result<Response<LeaveResponse>, Status> {
        self.authenticate(&request, &request.get_ref().worker_id)?;
        self.coordinator.leave(&request.into_inner().worker_id).await.map_err(to_status)?;
        Ok(Response::new(LeaveResponse {}))
    }

    async fn rendezvous(&self, request: Request<RendezvousRequest>) -> Result<Response<RendezvousResponse>, Status> {
        self.authenticate(&request, &request.get_ref().worker_id)?;
        let r = request.into_inner();
        let nccl_id = self
            .coordinator
            .rendezvous((&r.worker_id, &r.job_id, r.generation), &r.nccl_id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(RendezvousResponse { nccl_id: nccl_id.into() }))
    }
}
