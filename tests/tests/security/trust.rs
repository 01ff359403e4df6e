//! What runs is what is charged, tried against real processes: whoever can write the job store
//! (a worker, through its checkpoints) can neither change what a job samples or clips nor
//! create a job; a cancelled job's or a lost worker's capability stops working at once; a sum
//! that is not clipped is never released; and queued jobs cost the accountant no memory.

use std::time::Duration;

use dpcap_e2e::jobs::{get, spec, submit, tempfile_dir, wait_until, within};
use dpcap_e2e::{Process, Services, synth_dataset};
use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell, PartKey};
use dpcap_proto::v1::worker_service_client::WorkerServiceClient;
use dpcap_proto::v1::{
    Assignment, AttachJobRequest, CancelJobRequest, FetchReleaseRequest, GetJobRequest, GetSpendRequest,
    GetStepRequest, HeartbeatRequest, Job, JobState, RegisterWorkerRequest, StepWork,
};
use tonic::Code;

/// A worker driven by hand over gRPC, as a compromised one would act: it keeps what the
/// coordinator gave it (its assignment's capability, a step's capability) and uses it later.
struct HandWorker {
    worker_id: String,
    coordinator: WorkerServiceClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, CallCredentials>,
    >,
}

impl HandWorker {
    async fn register(services: &Services) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(services.coordinator.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut registrar = WorkerServiceClient::with_interceptor(channel.clone(), CallCredentials::default());
        let request = RegisterWorkerRequest { name: "hand".into(), device: "cpu".into(), throughput: 0.0 };
        let registered = registrar.register_worker(request).await.unwrap().into_inner();
        let credentials = CallCredentials::default().with_worker_key(registered.worker_key);
        Self {
            worker_id: registered.worker_id,
            coordinator: WorkerServiceClient::with_interceptor(channel, credentials),
        }
    }

    async fn assignment(&mut self) -> Assignment {
        let beat = HeartbeatRequest { worker_id: self.worker_id.clone() };
        self.coordinator.heartbeat(beat).await.unwrap().into_inner().assignment.expect("assigned")
    }

    /// The current step's work (the group is positioned at the accountant first).
    async fn step(&mut self, assignment: &Assignment) -> StepWork {
        let request = GetStepRequest {
            worker_id: self.worker_id.clone(),
            job_id: assignment.job_id.clone(),
            generation: assignment.generation,
        };
        self.coordinator.get_step(request).await.unwrap().into_inner()
    }
}

fn accountant(services: &Services, capability: &str) -> AccountantClient {
    let endpoint = tonic::transport::Endpoint::from_shared(services.accountant.grpc.clone()).unwrap();
    AccountantClient::lazy(endpoint, CallCredentials::default().with_capability(CapabilityCell::new(capability.into())))
}

/// Part 0 of `work`'s step, all zeros, sent with the step's capability.
async fn send_part(
    services: &Services,
    assignment: &Assignment,
    work: &StepWork,
    dim: u64,
) -> Result<(), tonic::Status> {
    let key = PartKey { step: work.step, part: 0, attempt: assignment.generation };
    let data = dpcap_proto::floats::to_bytes(&vec![0.0; dim as usize]);
    let mut rank = accountant(services, &assignment.capability);
    rank.submit_bytes(&assignment.job_id, key, &work.capability, data).await.map(drop)
}

fn dim(job: &Job) -> u64 {
    job.plan.as_ref().unwrap().gradient_dim
}

fn one_worker(dataset: &std::path::Path, steps: u64) -> dpcap_coordinator::SpecFile {
    dpcap_coordinator::SpecFile { workers: Some(1), ..spec(dataset, steps) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_cancel_returns_a_workers_capabilities_are_refused_and_nothing_more_is_charged() {
    let dir = tempfile_dir("revoke-cancel");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::with_lease(&dir, 60).await;
    let job = submit(&services, one_worker(&dataset, 5)).await;
    let mut worker = HandWorker::register(&services).await;
    let assignment = worker.assignment().await;
    let work = worker.step(&assignment).await;
    let attach = AttachJobRequest { job_id: job.job_id.clone(), gradient_dim: dim(&job), parts: 1 };
    accountant(&services, &assignment.capability).raw().attach_job(attach.clone()).await.expect("attached");

    let cancel = CancelJobRequest { job_id: job.job_id.clone() };
    services.jobs().await.cancel_job(cancel).await.expect("cancelled");
    let refused = send_part(&services, &assignment, &work, dim(&job)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    assert!(refused.message().contains("suspended"), "{refused}");
    let fetch = FetchReleaseRequest { job_id: job.job_id.clone(), step: 0, chunk_values: 0 };
    let fetched = accountant(&services, &assignment.capability).raw().fetch_release(fetch).await;
    assert_eq!(fetched.map(drop).unwrap_err().code(), Code::PermissionDenied);
    let attached = accountant(&services, &assignment.capability).raw().attach_job(attach).await;
    assert_eq!(attached.map(drop).unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "0 steps charged");
    let shown = get(&services, &job.job_id).await;
    assert_eq!(shown.progress.unwrap().step, 0, "the status shows what the ledger holds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_workers_lease_expires_its_capabilities_are_refused_before_a_new_group_forms() {
    let dir = tempfile_dir("revoke-lease");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::start(&dir).await; // a 3 s lease
    let job = submit(&services, one_worker(&dataset, 5)).await;
    let mut worker = HandWorker::register(&services).await;
    let assignment = worker.assignment().await;
    let work = worker.step(&assignment).await;
    // The worker falls silent; its lease runs out and the group dissolves (no other worker).
    wait_until(&services, &job.job_id, Duration::from_secs(30), |j| {
        j.conditions.iter().any(|c| c.reason == "LeaseExpired")
    })
    .await;
    let refused = send_part(&services, &assignment, &work, dim(&job)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    assert!(refused.message().contains("revoked"), "{refused}");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "0 steps charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_skips_clipping_is_refused_at_its_first_step_and_nothing_is_released() {
    let dir = tempfile_dir("unclipped");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::start(&dir).await;
    // A small C: any unclipped example gradient is far past it.
    let job =
        submit(&services, dpcap_coordinator::SpecFile { clipping_norm: Some(1e-4), ..one_worker(&dataset, 3) }).await;
    let env = [("DPCAP_TEST_SKIP_CLIPPING".to_owned(), "1".to_owned())];
    let _worker = Process::worker_with_env(&services.coordinator.grpc, "w0", &dir, &[], &env);
    let failed = wait_until(&services, &job.job_id, within(1), |j| j.state == JobState::Failed as i32).await;
    let condition = failed.conditions.last().unwrap();
    assert!(condition.message.contains("UNCLIPPED") && condition.message.contains("did not clip"), "{failed:#?}");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "nothing charged");
    let released = std::fs::read_dir(services.ledger.join("jobs").join(&job.job_id).join("releases"));
    assert!(released.map_or(0, |d| d.count()) == 0, "nothing released");
}

/// A queued job, its record rewritten as a worker could (sample rate 1, C = 100), then the
/// coordinator restarted: the record's seal no longer verifies, so the job is never restored,
/// registered or run. A record copied under a new id, with the secret a legacy store kept
/// beside it, is refused alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_record_rewritten_or_copied_in_the_store_is_never_restored_registered_or_run() {
    use prost::Message;
    let dir = tempfile_dir("rewritten");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    let job = submit(&services, one_worker(&dataset, 3)).await;
    services.coordinator.kill();

    let record = services.record_path(&job.job_id);
    let sealed = std::fs::read(&record).unwrap();
    // The sealed format: 8 bytes of magic, a 32-byte tag, an 8-byte version, then the record.
    let (header, payload) = sealed.split_at(48);
    let mut rewritten = Job::decode(payload).unwrap();
    let contract = rewritten.plan.as_mut().unwrap().contract.as_mut().unwrap();
    let mechanism = contract.mechanism.as_mut().unwrap();
    (mechanism.sample_rate, mechanism.clipping_norm) = (1.0, 100.0);
    std::fs::write(&record, [header, &rewritten.encode_to_vec()].concat()).unwrap();
    let copy = services.store.join("jobs/job-copy");
    std::fs::create_dir_all(&copy).unwrap();
    rewritten.job_id = "job-copy".into();
    std::fs::write(copy.join("job.binpb"), rewritten.encode_to_vec()).unwrap();
    std::fs::write(copy.join("private.json"), r#"{"secret":"00","shard_counts":[120]}"#).unwrap();

    services.restart_coordinator(Duration::ZERO).await;
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    for id in [&job.job_id, "job-copy"] {
        let status = services.jobs().await.get_job(GetJobRequest { job_id: id.to_string() }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{id}: {status}");
    }
    let metrics = services.coordinator.scrape().await;
    assert!(metrics.contains("dpcap_coordinator_records_refused_total 2"), "{metrics}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "never run");
    let mut ledger =
        dpcap_proto::v1::accountant_service_client::AccountantServiceClient::connect(services.accountant.grpc.clone())
            .await
            .unwrap();
    let copy = ledger.get_spend(GetSpendRequest { job_id: "job-copy".into() }).await.unwrap_err();
    assert_eq!(copy.code(), Code::NotFound, "never registered: {copy}");
}

/// A junk unsealed `job.binpb` dropped beside a sound sealed record (a worker can write the
/// job store) neither runs nor gets the sound job fenced: it runs to its end. A job whose
/// record is gone but whose secret remains (a registration whose answer never came) is
/// suspended at the accountant at restore: it reserves nothing and admits no capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_junk_unsealed_record_fences_nothing_and_a_secret_without_its_record_is_suspended() {
    let dir = tempfile_dir("orphans");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    let sound = submit(&services, one_worker(&dataset, 2)).await;
    let orphan = submit(&services, one_worker(&dataset, 2)).await;
    services.coordinator.kill();
    std::fs::write(services.record_path(&sound.job_id).with_file_name("job.binpb"), b"junk").unwrap();
    std::fs::remove_file(services.record_path(&orphan.job_id)).unwrap();

    services.restart_coordinator(Duration::ZERO).await;
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    wait_until(&services, &sound.job_id, within(2), |j| j.state == JobState::Succeeded as i32).await;
    let metrics = services.coordinator.scrape().await;
    assert!(metrics.contains("dpcap_coordinator_records_refused_total 0"), "the junk was ignored: {metrics}");
    let generation = services.ledger.join("jobs").join(&orphan.job_id).join("generation.json");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let fence: serde_json::Value =
            std::fs::read(&generation).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        if fence["suspended"] == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the orphan was never suspended: {fence}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(services.charged_steps(&orphan.job_id), Vec::<u64>::new(), "never run");
}

/// Defence in depth: a record sealed with the coordinator's own key (as if that key leaked)
/// whose contract is not the ledger's fails its job before any step, naming each field with
/// both values; the ledger is the source of truth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_record_whose_contract_is_not_the_ledgers_fails_its_job_naming_each_field() {
    let dir = tempfile_dir("mismatch");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    let job = submit(&services, one_worker(&dataset, 3)).await;
    services.coordinator.kill();
    let store = services.job_store().await;
    let mut stored = store.get_job(&job.job_id).await.unwrap().unwrap();
    let mechanism = stored.plan.as_mut().unwrap().contract.as_mut().unwrap().mechanism.as_mut().unwrap();
    let ledger_q = mechanism.sample_rate;
    (mechanism.sample_rate, mechanism.clipping_norm) = (1.0, 100.0);
    store.put_job(&stored).await.unwrap();

    services.restart_coordinator(Duration::ZERO).await;
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    let failed = wait_until(&services, &job.job_id, within(1), |j| j.state == JobState::Failed as i32).await;
    let message = &failed.conditions.last().unwrap().message;
    assert!(
        message.contains(&format!("mechanism.sample_rate: 1 in the record, {ledger_q} in the ledger")),
        "{message}"
    );
    assert!(message.contains("mechanism.clipping_norm: 100 in the record, 1 in the ledger"), "{message}");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "never run");
}

/// Noise (and the ε curve) is held only for a job whose ranks have attached: twenty queued
/// `tiny` jobs (P = 59.5M each: 476 MB of noise each, were it drawn at submit) leave the
/// accountant within 100 MB of its idle size (measured: +54 MB, the PLD's shared FFT plans).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_queued_tiny_jobs_keep_the_accountants_memory_within_100_mb_of_idle() {
    let dir = tempfile_dir("queued-memory");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::start(&dir).await;
    let rss = || {
        let pid = services.accountant.pid().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_owned();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let idle = rss();
    for _ in 0..20 {
        submit(&services, dpcap_coordinator::SpecFile { model: "tiny".into(), ..one_worker(&dataset, 3) }).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // a drawing, had one started, would be well on
    let queued = rss();
    assert!(queued < idle + 100_000_000, "idle {idle} B, with 20 queued tiny jobs {queued} B");
}
