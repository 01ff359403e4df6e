//! Job helpers shared by the end-to-end tests: a small spec, submit/get/poll, and the
//! accountant's view of a job.

use std::path::Path;
use std::time::{Duration, Instant};

use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::accountant_service_client::AccountantServiceClient;
use dpcap_proto::v1::{GetJobRequest, GetSpendRequest, Job, JobState, SubmitJobRequest};

use crate::Services;

/// A `micro` captioner job of `steps` steps on two workers, ε = 8, L = 24.
pub fn spec(dataset: &Path, steps: u64) -> SpecFile {
    SpecFile {
        name: "e2e".into(),
        dataset: dataset.to_string_lossy().into_owned(),
        model: "micro".into(),
        epsilon: Some(8.0),
        batch_size: Some(24),
        steps: Some(steps),
        micro_batch: Some(16),
        workers: Some(2),
        checkpoint_interval: Some(3),
        ..Default::default()
    }
}

/// Submits `spec` to the coordinator.
pub async fn submit(services: &Services, spec: SpecFile) -> Job {
    let request = SubmitJobRequest { spec: Some(spec.into_proto().unwrap()), idempotency_key: String::new() };
    services.jobs().await.submit_job(request).await.expect("submitted").into_inner()
}

/// The job as the coordinator reports it.
pub async fn get(services: &Services, job_id: &str) -> Job {
    services.jobs().await.get_job(GetJobRequest { job_id: job_id.into() }).await.expect("get").into_inner()
}

/// A bound for a job of `steps` micro steps to get somewhere: a minute of start-up (the
/// workers build their models) and ten seconds a step, generous on a loaded 2-core machine and
/// proportionate to the work, so a stuck job fails its test instead of waiting minutes.
pub fn within(steps: u64) -> Duration {
    Duration::from_secs(60 + 10 * steps)
}

/// Polls until `done(job)` or panics after `timeout`.
pub async fn wait_until(services: &Services, job_id: &str, timeout: Duration, done: impl Fn(&Job) -> bool) -> Job {
    let deadline = Instant::now() + timeout;
    loop {
        let job = get(services, job_id).await;
        if done(&job) {
            return job;
        }
        assert!(Instant::now() < deadline, "timed out; job is {job:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A predicate: the job is in `state`.
pub fn is(state: JobState) -> impl Fn(&Job) -> bool {
    move |job| job.state == state as i32
}

/// A predicate: the job has ended (neither pending nor running).
pub fn ended(job: &Job) -> bool {
    job.state != JobState::Running as i32 && job.state != JobState::Pending as i32
}

/// The job's next step.
pub fn step(job: &Job) -> u64 {
    job.progress.as_ref().map_or(0, |p| p.step)
}

/// The accountant's spend record of the job.
pub async fn spend(services: &Services, job_id: &str) -> dpcap_proto::v1::JobSpend {
    let mut client = AccountantServiceClient::connect(services.accountant.grpc.clone()).await.unwrap();
    client.get_spend(GetSpendRequest { job_id: job_id.into() }).await.unwrap().into_inner()
}

/// A fresh directory for one test: removed after success, kept with its logs printed after a
/// failure, and watched for hangs (see [`crate::testdir`]).
pub fn tempfile_dir(name: &str) -> crate::testdir::TestDir {
    crate::testdir::TestDir::new(name)
}
