//! A typed client for the JobService (operators, viewers, dashboards), and the one error every
//! typed client returns: what a caller needs to act on a failed call without reading its text.

use tonic::Streaming;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::AttachToken;
use crate::v1::job_service_client::JobServiceClient;
use crate::v1::{
    AuditJobRequest, AuditReport, CancelJobRequest, GetJobRequest, Job, JobSpec, ListJobsRequest, ResumeJobRequest,
    SubmitJobRequest, WatchJobRequest,
};
use crate::{ErrorCode, Secret};

/// A failed call: the typed code the server sent (None for a transport failure or a server
/// that sent none), the gRPC code, the message, whether the same call may succeed later (a
/// server restarting, a connection reset), and what to do when it is a misconfiguration (TLS on
/// one side only, a missing token).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}{}", code.map_or_else(|| format!("{status:?}"), |c| c.as_str().to_owned()), hint.map(|h| format!(" ({h})")).unwrap_or_default())]
pub struct ClientError {
    /// The server's typed code.
    pub code: Option<ErrorCode>,
    /// The gRPC status code.
    pub status: tonic::Code,
    /// The server's message (or the transport's).
    pub message: String,
    /// A retry of the same call may succeed.
    pub transient: bool,
    /// What to change when the call can never succeed as configured.
    pub hint: Option<&'static str>,
    /// A dataset budget's refusal in figures (a submit or resume the budget cannot cover);
    /// boxed, so that every call's failure stays small.
    pub budget: Option<Box<crate::v1::BudgetExhausted>>,
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        Self {
            code: ErrorCode::of(&status),
            status: status.code(),
            message: status.message().to_owned(),
            transient: crate::is_transient(&status),
            hint: crate::hint(&status),
            budget: crate::budget_exhausted(&status).map(Box::new),
        }
    }
}

impl From<tonic::transport::Error> for ClientError {
    fn from(error: tonic::transport::Error) -> Self {
        Self::from(tonic::Status::from_error(Box::new(error)))
    }
}

/// The generated JobService client with the caller's token attached.
pub type RawJobsClient = JobServiceClient<InterceptedService<Channel, AttachToken>>;

/// A connected JobService client.
#[derive(Debug, Clone)]
pub struct JobsClient {
    inner: RawJobsClient,
}

impl JobsClient {
    /// Connects to `endpoint` (TLS already configured on it), presenting `token`.
    pub async fn connect(endpoint: Endpoint, token: Option<Secret>) -> Result<Self, ClientError> {
        let channel = endpoint.connect().await?;
        Ok(Self { inner: JobServiceClient::with_interceptor(channel, AttachToken(token)) })
    }

    /// The generated client, for calls without a helper here.
    pub fn raw(&mut self) -> &mut RawJobsClient {
        &mut self.inner
    }

    /// Submits `spec`; a repeated non-empty `idempotency_key` returns the original job.
    pub async fn submit(&mut self, spec: JobSpec, idempotency_key: String) -> Result<Job, ClientError> {
        Ok(self.inner.submit_job(SubmitJobRequest { spec: Some(spec), idempotency_key }).await?.into_inner())
    }

    /// One job.
    pub async fn get(&mut self, job_id: &str) -> Result<Job, ClientError> {
        Ok(self.inner.get_job(GetJobRequest { job_id: job_id.to_owned() }).await?.into_inner())
    }

    /// Every job, oldest first.
    pub async fn list(&mut self) -> Result<Vec<Job>, ClientError> {
        Ok(self.inner.list_jobs(ListJobsRequest {}).await?.into_inner().jobs)
    }

    /// Cancels a pending or running job.
    pub async fn cancel(&mut self, job_id: &str) -> Result<Job, ClientError> {
        Ok(self.inner.cancel_job(CancelJobRequest { job_id: job_id.to_owned() }).await?.into_inner())
    }

    /// Resumes a failed or cancelled job.
    pub async fn resume(&mut self, job_id: &str) -> Result<Job, ClientError> {
        Ok(self.inner.resume_job(ResumeJobRequest { job_id: job_id.to_owned() }).await?.into_inner())
    }

    /// The job now and at every change until it ends.
    pub async fn watch(&mut self, job_id: &str) -> Result<Streaming<Job>, ClientError> {
        Ok(self.inner.watch_job(WatchJobRequest { job_id: job_id.to_owned() }).await?.into_inner())
    }

    /// The one-run audit of an ended, audited job.
    pub async fn audit(&mut self, job_id: &str) -> Result<AuditReport, ClientError> {
        Ok(self.inner.audit_job(AuditJobRequest { job_id: job_id.to_owned() }).await?.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_error_carries_the_typed_code_and_whether_to_retry_whatever_the_text() {
        let exhausted: ClientError = crate::to_status(TestError(ErrorCode::BudgetExhausted)).into();
        assert_eq!((exhausted.code, exhausted.transient), (Some(ErrorCode::BudgetExhausted), false));
        let restarting: ClientError = tonic::Status::unavailable("connection reset").into();
        assert!(restarting.transient && restarting.code.is_none(), "{restarting:?}");
        assert!(exhausted.to_string().starts_with("BUDGET_EXHAUSTED: "), "{exhausted}");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("made up")]
    struct TestError(ErrorCode);

    impl crate::ServiceError for TestError {
        fn error_code(&self) -> ErrorCode {
            self.0
        }
    }
}
