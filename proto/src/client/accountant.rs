//! A typed client for the AccountantService: streams a part in as chunks and assembles a
//! release from its chunks (workers on the CPU path, tests and benchmarks), and makes the
//! coordinator's and a rank's unary calls, each failing with a [`ClientError`]. A rank on the
//! accountant's host sends its parts and reads its releases over the same-host socket once both
//! ends agree ([`AccountantClient::use_local`]).

use std::sync::Arc;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use super::local::{self, Fetched, LocalChoice, LocalLink};
use super::{CallCredentials, ClientError, MAX_MESSAGE_BYTES, bulk};
use crate::floats;
use crate::v1::accountant_service_client::AccountantServiceClient;
use crate::v1::{
    AttachJobRequest, AuditJobRequest, AuditReport, CloseJobRequest, FenceJobRequest, FetchReleaseRequest,
    GetSpendRequest, GradientChunk, JobSpend, LocalEndpointRequest, RegisterJobRequest, RegisterJobResponse,
    SubmitPartResponse, TrimReleasesRequest,
};

/// The generated client with the caller's credentials attached to every call.
pub type RawClient = AccountantServiceClient<InterceptedService<Channel, CallCredentials>>;

/// Values per submitted chunk: 1048576 f32 = 4 MiB, half the message limit.
pub const CHUNK_VALUES: usize = 1 << 20;

/// A connected accountant client.
#[derive(Debug, Clone)]
pub struct AccountantClient {
    inner: RawClient,
    /// What every call carries, for the same-host socket's calls too.
    credentials: CallCredentials,
    /// The same-host socket, once agreed (shared by clones).
    local: Option<Arc<LocalLink>>,
}

/// Which part a submission carries: part `part` (a rank, or 0 for an all-reduced sum) of
/// `step`, computed by group generation `attempt` (a newer attempt replaces pending parts of an
/// older one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartKey {
    /// The step number the ledger will charge.
    pub step: u64,
    /// The part's index, 0 <= part < W.
    pub part: u32,
    /// The group generation that computed it.
    pub attempt: u64,
}

impl AccountantClient {
    /// Connects to `endpoint` (e.g. "http://127.0.0.1:7070") in plaintext without a token.
    pub async fn connect(endpoint: String) -> Result<Self, tonic::transport::Error> {
        let channel = bulk(Endpoint::from_shared(endpoint)?).connect().await?;
        Ok(Self::over(channel, CallCredentials::default()))
    }

    /// A client of `endpoint` (TLS already configured on it) presenting `credentials`. It
    /// connects on first use and reconnects after the accountant restarts (calls made while it
    /// is down fail with UNAVAILABLE, which callers retry).
    pub fn lazy(endpoint: Endpoint, credentials: CallCredentials) -> Self {
        Self::over(bulk(endpoint).connect_lazy(), credentials)
    }

    fn over(channel: Channel, credentials: CallCredentials) -> Self {
        let inner = AccountantServiceClient::with_interceptor(channel, credentials.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Self { inner, credentials, local: None }
    }

    /// Asks the accountant for its same-host socket and uses it for parts and releases when
    /// both ends agree (see [`LocalChoice`]); otherwise they stay on gRPC. A rank calls this
    /// once its capability is set: the socket checks the same credentials.
    pub async fn use_local(&mut self) -> Result<LocalChoice, ClientError> {
        let endpoint = self.inner.get_local_endpoint(LocalEndpointRequest {}).await?.into_inner();
        match LocalLink::agree(endpoint).await {
            Ok(link) => {
                let chosen = LocalChoice::Chosen(link.path().to_owned());
                self.local = Some(Arc::new(link));
                Ok(chosen)
            }
            Err(choice) => {
                self.local = None;
                Ok(choice)
            }
        }
    }

    /// The agreed socket and a connection to it, unless it stopped answering (then the call
    /// goes over gRPC: nothing was sent on the socket).
    async fn local_stream(&self) -> Option<(&LocalLink, tokio::net::UnixStream)> {
        let link = self.local.as_deref().filter(|link| link.working())?;
        match link.connect().await {
            Ok(stream) => Some((link, stream)),
            Err(e) => {
                tracing::warn!(socket = %link.path().display(), error = %e, "same-host socket set aside; using grpc");
                None
            }
        }
    }

    /// The generated client, for calls without a helper here.
    pub fn raw(&mut self) -> &mut RawClient {
        &mut self.inner
    }

    /// Registers a job's contract (the coordinator's call; idempotent for an identical one).
    pub async fn register_job(&mut self, request: RegisterJobRequest) -> Result<RegisterJobResponse, ClientError> {
        Ok(self.inner.register_job(request).await?.into_inner())
    }

    /// A job's spend and contract as the ledger holds them (NOT_FOUND: never registered).
    pub async fn get_spend(&mut self, job_id: &str) -> Result<JobSpend, ClientError> {
        Ok(self.inner.get_spend(GetSpendRequest { job_id: job_id.to_owned() }).await?.into_inner())
    }

    /// Refuses the job's generations below `generation` from now on; with `resume`, opens a
    /// suspended job to a group of `generation`.
    pub async fn fence_job(&mut self, job_id: &str, generation: u64, resume: bool) -> Result<JobSpend, ClientError> {
        let request = FenceJobRequest { job_id: job_id.to_owned(), generation, resume };
        Ok(self.inner.fence_job(request).await?.into_inner())
    }

    /// Closes (or, resumable, suspends) a job.
    pub async fn close_job(&mut self, request: CloseJobRequest) -> Result<JobSpend, ClientError> {
        Ok(self.inner.close_job(request).await?.into_inner())
    }

    /// Lets the accountant delete the job's releases below `before_step`.
    pub async fn trim_releases(&mut self, job_id: &str, before_step: u64) -> Result<JobSpend, ClientError> {
        let request = TrimReleasesRequest { job_id: job_id.to_owned(), before_step };
        Ok(self.inner.trim_releases(request).await?.into_inner())
    }

    /// Scores an ended job's one-run audit, the attempt bounded by `timeout` at both ends.
    pub async fn audit_job(&mut self, job_id: &str, timeout: std::time::Duration) -> Result<AuditReport, ClientError> {
        let mut request = Request::new(AuditJobRequest { job_id: job_id.to_owned() });
        request.set_timeout(timeout);
        Ok(self.inner.audit_job(request).await?.into_inner())
    }

    /// A rank's attach to its job's current generation (its capability is the call's).
    pub async fn attach_job(&mut self, request: AttachJobRequest) -> Result<JobSpend, ClientError> {
        Ok(self.inner.attach_job(request).await?.into_inner())
    }

    /// Streams part `part` of `step` (all P values) in chunks of [`CHUNK_VALUES`], as attempt 0.
    pub async fn submit_part(
        &mut self,
        job_id: &str,
        step: u64,
        part: u32,
        values: &[f32],
    ) -> Result<SubmitPartResponse, ClientError> {
        self.submit_attempt(job_id, PartKey { step, part, attempt: 0 }, values).await
    }

    /// Streams part `part` of `step`, computed by group generation `attempt`: a newer attempt
    /// replaces pending parts of an older one (a re-formed group reruns an unreleased step).
    pub async fn submit_attempt(
        &mut self,
        job_id: &str,
        key: PartKey,
        values: &[f32],
    ) -> Result<SubmitPartResponse, ClientError> {
        self.submit_bytes(job_id, key, "", floats::to_bytes(values)).await
    }

    /// Streams a part given as little-endian f32 bytes ([`floats::into_bytes`] makes them from
    /// a `Vec<f32>` without a copy); a retry sends the same buffer again. `step_capability` is
    /// the step's capability (`StepWork.capability`), carried by the first chunk; empty, the
    /// call's own capability must be the step's.
    pub async fn submit_bytes(
        &mut self,
        job_id: &str,
        PartKey { step, part, attempt }: PartKey,
        step_capability: &str,
        data: bytes::Bytes,
    ) -> Result<SubmitPartResponse, ClientError> {
        if let Some((link, stream)) = self.local_stream().await {
            let header = GradientChunk {
                job_id: job_id.to_owned(),
                step,
                part,
                attempt,
                step_capability: step_capability.to_owned(),
                ..Default::default()
            };
            match local::submit(link, stream, &self.credentials, header, &data).await {
                // A rank known by its TLS certificate has no token for the socket: gRPC it is.
                Err(e) if e.status == tonic::Code::Unauthenticated => link.set_aside(),
                submitted => return submitted,
            }
        }
        let values = data.len() / 4;
        let job_id = job_id.to_owned();
        let step_capability = step_capability.to_owned();
        // Chunks are zero-copy slices of one buffer, made as the stream is polled.
        let chunks = (0..values.div_ceil(CHUNK_VALUES).max(1)).map(move |i| {
            let start = (i * CHUNK_VALUES * 4).min(data.len());
            let end = (start + CHUNK_VALUES * 4).min(data.len());
            GradientChunk {
                job_id: job_id.clone(),
                step,
                part,
                offset: (start / 4) as u64,
                data: data.slice(start..end),
                attempt,
                step_capability: if i == 0 { step_capability.clone() } else { String::new() },
            }
        });
        Ok(self.inner.submit_part(Request::new(futures::stream::iter(chunks))).await?.into_inner())
    }

    /// Waits for the release of `step` and returns its values and the spend after it. Only a
    /// complete release is returned: a stream that ends before the chunk marked `last` (the
    /// accountant failed before the release was stored) is UNAVAILABLE, to be fetched again.
    pub async fn fetch_release(
        &mut self,
        job_id: &str,
        step: u64,
    ) -> Result<(Vec<f32>, Option<JobSpend>), ClientError> {
        let mut values = Vec::new();
        let fetched = self.fetch_release_into(job_id, step, &mut values).await?;
        Ok((values, fetched.spend))
    }

    /// [`Self::fetch_release`] into `values`, whose memory is reused when it holds a release
    /// of the same size (a running job's every step): a release then touches no new pages.
    pub async fn fetch_release_into(
        &mut self,
        job_id: &str,
        step: u64,
        values: &mut Vec<f32>,
    ) -> Result<Fetched, ClientError> {
        let request = FetchReleaseRequest { job_id: job_id.to_owned(), step, chunk_values: 0 };
        if let Some((link, stream)) = self.local_stream().await {
            match local::fetch_into(link, stream, &self.credentials, request.clone(), values).await {
                Err(e) if e.status == tonic::Code::Unauthenticated => link.set_aside(),
                fetched => return fetched,
            }
        }
        let mut stream = self.inner.fetch_release(request).await?.into_inner();
        let (mut spend, mut first_data) = (None, None);
        values.clear();
        loop {
            let Some(chunk) = stream.message().await? else {
                return Err(ClientError::from(Status::unavailable(format!(
                    "release of step {step} ended after {} values without its last chunk",
                    values.len()
                ))));
            };
            if chunk.offset != values.len() as u64 {
                return Err(ClientError::from(Status::data_loss(format!(
                    "release chunk at offset {} after {} values",
                    chunk.offset,
                    values.len()
                ))));
            }
            spend = spend.or(chunk.spend);
            let first_data = *first_data.get_or_insert_with(std::time::Instant::now);
            floats::extend(values, &chunk.data).map_err(|e| ClientError::from(Status::data_loss(e.to_string())))?;
            if chunk.last {
                return Ok(Fetched { spend, first_data });
            }
        }
    }
}
