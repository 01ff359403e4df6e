//! What runs is what is charged, tried against real processes: whoever can write the job store
//! (a worker, through its checkpoints) can neither change what a job samples or clips nor
//! create a job; a cancelled job's or a lost worker's capability stops working at once; a sum
//! that is not clipped is never released; and queued jobs cost the accountant no memory.

use std::time::Duration;

use dpcap_e2e::jobs::{get, spec, submit, tempfile_dir, wait_until, within};
use dpcap_e2e::{Process, Services, synth_dataset};
use dpcap_proto::ErrorCode;
use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell, PartKey};
use dpcap_proto::v1::worker_service_client::WorkerServiceClient;
use dpcap_proto::v1::{
    Assignment, AttachJobRequest, CancelJobRequest, FetchReleaseRequest, GetJobRequest, GetSpendRequest,
    GetStepRequest, HeartbeatRequest, Job, JobState, RegisterWorkerRequest, ReportStepRequest, StepOutcome, StepWork,
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
        let request = RegisterWorkerRequest { name: "hand".into(), device: "cpu".into() };
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
) -> Result<(), dpcap_proto::client::ClientError> {
    let key = PartKey { step: work.step, part: 0, attempt: assignment.generation };
    let data = dpcap_proto::floats::to_bytes(&vec![0.0; dim as usize]);
    let mut rank = accountant(services, &assignment.capability);
    rank.submit_bytes(&assignment.job_id, key, &work.capability, data).await.map(drop)
}

/// The accountant's resident memory in bytes (/proc/PID/status VmRSS).
fn accountant_rss(services: &Services) -> u64 {
    let pid = services.accountant.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_owned();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn dim(job: &Job) -> u64 {
    job.plan.as_ref().unwrap().gradient_dim
}

fn one_worker(dataset: &std::path::Path, steps: u64) -> dpcap_proto::spec::SpecFile {
    dpcap_proto::spec::SpecFile { workers: Some(1), ..spec(dataset, steps) }
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
    // Refused as a stale generation: the rank drops its session, the normal end of a cancel.
    assert_eq!(refused.code, Some(ErrorCode::StaleGeneration), "{refused}");
    assert!(refused.message.contains("suspended"), "{refused}");
    let fetch = FetchReleaseRequest { job_id: job.job_id.clone(), step: 0, chunk_values: 0 };
    let fetched = accountant(&services, &assignment.capability).raw().fetch_release(fetch).await;
    assert_eq!(ErrorCode::of(&fetched.map(drop).unwrap_err()), Some(ErrorCode::StaleGeneration));
    let attached = accountant(&services, &assignment.capability).raw().attach_job(attach).await;
    assert_eq!(ErrorCode::of(&attached.map(drop).unwrap_err()), Some(ErrorCode::StaleGeneration));
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
    assert_eq!(refused.code, Some(ErrorCode::StaleGeneration), "{refused}");
    assert!(refused.message.contains("re-formed") || refused.message.contains("revoked"), "{refused}");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "0 steps charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_skips_clipping_is_refused_at_its_first_step_and_nothing_is_released() {
    let dir = tempfile_dir("unclipped");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::start(&dir).await;
    // A small C: any unclipped example gradient is far past it.
    let job =
        submit(&services, dpcap_proto::spec::SpecFile { clipping_norm: Some(1e-4), ..one_worker(&dataset, 3) }).await;
    let env = [("DPCAP_TEST_SKIP_CLIPPING".to_owned(), "1".to_owned())];
    let _worker = Process::worker_with_env(&services.coordinator.grpc, "w0", &dir, &[], &env);
    let failed = wait_until(&services, &job.job_id, within(1), |j| j.state == JobState::Failed as i32).await;
    let condition = failed.conditions.last().unwrap();
    assert!(condition.message.contains("UNCLIPPED") && condition.message.contains("did not clip"), "{failed:#?}");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "nothing charged");
    let released = std::fs::read_dir(services.ledger.join("jobs").join(&job.job_id).join("releases"));
    assert!(released.map_or(0, |d| d.count()) == 0, "nothing released");
}

/// Two hand-driven ranks of one job: each step's work is an even split, each rank's step
/// capability states its own share n_r, and a part of norm C·(n_r + 1) on one coordinate (under
/// the step's C·n, which the whole-step check alone let through) is refused as UNCLIPPED with
/// nothing charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rank_gets_an_even_share_and_a_part_past_c_times_its_own_share_is_refused() {
    let dir = tempfile_dir("shares");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::with_lease(&dir, 60).await;
    let job = submit(&services, dpcap_proto::spec::SpecFile { clipping_norm: Some(1.0), ..spec(&dataset, 3) }).await;
    let (mut a, mut b) = (HandWorker::register(&services).await, HandWorker::register(&services).await);
    let (assigned_a, assigned_b) = (a.assignment().await, b.assignment().await);
    let (work_a, work_b) = tokio::join!(a.step(&assigned_a), b.step(&assigned_b));
    let count = |w: &StepWork| w.units.iter().map(|u| u.indices.len() as u64).sum::<u64>();
    let grant = |w: &StepWork| dpcap_serve::Capability::peek(&w.capability).and_then(|c| c.step).expect("a step grant");
    let n = grant(&work_a).sampled;
    assert!(n >= 4, "a step of {n} examples");
    for work in [&work_a, &work_b] {
        assert!(count(work) == n / 2 || count(work) == n.div_ceil(2), "an even share: {} of {n}", count(work));
        assert_eq!(grant(work).units, count(work), "the capability states the rank's own share");
    }
    let (assignment, work) = if assigned_a.rank == 0 { (&assigned_a, &work_a) } else { (&assigned_b, &work_b) };
    let share = grant(work).units;
    let mut values = vec![0.0f32; dim(&job) as usize];
    values[3] = share as f32 + 1.0; // past C·n_r, well under C·n
    let key = PartKey { step: work.step, part: 0, attempt: assignment.generation };
    let mut rank = accountant(&services, &assignment.capability);
    let attach = AttachJobRequest { job_id: job.job_id.clone(), gradient_dim: dim(&job), parts: 2 };
    rank.raw().attach_job(attach).await.expect("attached");
    let bytes = dpcap_proto::floats::to_bytes(&values);
    let refused = rank.submit_bytes(&job.job_id, key, &work.capability, bytes).await.unwrap_err();
    assert_eq!(refused.code, Some(dpcap_proto::ErrorCode::Unclipped), "{refused}");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "nothing charged");
}

/// A rank that reports its step done without sending a part: the ledger holds no charge for the
/// step, so the step does not complete; the job fails naming why, and nothing was charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_reported_done_without_its_charge_never_completes_and_the_job_fails_saying_why() {
    let dir = tempfile_dir("done-uncharged");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::with_lease(&dir, 60).await;
    let job = submit(&services, one_worker(&dataset, 3)).await;
    let mut worker = HandWorker::register(&services).await;
    let assignment = worker.assignment().await;
    let work = worker.step(&assignment).await;
    let report = ReportStepRequest {
        worker_id: worker.worker_id.clone(),
        job_id: job.job_id.clone(),
        generation: assignment.generation,
        step: work.step,
        outcome: StepOutcome::Done as i32,
        ..Default::default()
    };
    worker.coordinator.report_step(report).await.expect("the report is taken, and judged by the ledger");
    let failed = wait_until(&services, &job.job_id, within(1), |j| j.state == JobState::Failed as i32).await;
    let condition = failed.conditions.last().unwrap();
    assert!(condition.message.contains("the ledger holds no charge"), "{failed:#?}");
    assert_eq!(failed.progress.unwrap().step, 0, "the job's progress never runs ahead of the ledger");
    assert_eq!(services.charged_steps(&job.job_id), Vec::<u64>::new(), "nothing charged");
}

/// Two queued jobs, their records rewritten (sample rate 1, C = 100), then the coordinator
/// restarted. `kept`'s rewrite is in the job store only, as a worker could make it: restore reads
/// the coordinator's own copy, so the job runs as submitted. `job`'s is in the coordinator's own
/// copy too (a writer of the secrets store): its seal no longer verifies, so it is never
/// restored, registered or run. A record copied under a new id, with the secret a legacy store
/// kept beside it, is refused alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_record_rewritten_or_copied_in_the_store_is_never_restored_registered_or_run() {
    use prost::Message;
    let dir = tempfile_dir("rewritten");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    let job = submit(&services, one_worker(&dataset, 3)).await;
    let kept = submit(&services, one_worker(&dataset, 2)).await;
    services.coordinator.kill();

    // The sealed format: 8 bytes of magic, a 32-byte tag, an 8-byte version, then the record.
    let rewrite = |record: &std::path::Path| {
        let sealed = std::fs::read(record).unwrap();
        let (header, payload) = sealed.split_at(48);
        let mut rewritten = Job::decode(payload).unwrap();
        let contract = rewritten.plan.as_mut().unwrap().contract.as_mut().unwrap();
        let mechanism = contract.mechanism.as_mut().unwrap();
        (mechanism.sample_rate, mechanism.clipping_norm) = (1.0, 100.0);
        std::fs::write(record, [header, &rewritten.encode_to_vec()].concat()).unwrap();
        rewritten
    };
    let mut rewritten = rewrite(&services.record_path(&job.job_id));
    rewrite(&services.own_record_path(&job.job_id));
    rewrite(&services.record_path(&kept.job_id));
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
    let done = wait_until(&services, &kept.job_id, within(2), |j| j.state == JobState::Succeeded as i32).await;
    let rate = |j: &Job| j.plan.as_ref().unwrap().contract.as_ref().unwrap().mechanism.unwrap().sample_rate;
    assert_eq!(rate(&done), rate(&kept), "run as submitted, whatever the job store's copy says");
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
    std::fs::remove_file(services.own_record_path(&orphan.job_id)).unwrap();

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
    let rss = || accountant_rss(&services);
    let idle = rss();
    for _ in 0..20 {
        submit(&services, dpcap_proto::spec::SpecFile { model: "tiny".into(), ..one_worker(&dataset, 3) }).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // a drawing, had one started, would be well on
    let queued = rss();
    assert!(queued < idle + 100_000_000, "idle {idle} B, with 20 queued tiny jobs {queued} B");
}

/// Audit canaries are held only for a running job: four queued audited jobs of 10M canaries
/// each (about 170 MB each, were they drawn at registration) leave the accountant within
/// 100 MB of its idle size, and so does its restart on that ledger (a replay draws none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_queued_audited_jobs_keep_the_accountants_memory_within_100_mb_of_idle_across_a_restart() {
    let dir = tempfile_dir("queued-audits");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    let idle = accountant_rss(&services);
    let audit = dpcap_proto::spec::AuditFile { canaries: 10_000_000, kind: None, coordinates: None };
    for _ in 0..4 {
        let spec = dpcap_proto::spec::SpecFile { audit: Some(audit.clone()), ..one_worker(&dataset, 3) };
        submit(&services, spec).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let queued = accountant_rss(&services);
    assert!(queued < idle + 100_000_000, "idle {idle} B, with 4 queued audited jobs {queued} B");
    services.restart_accountant(Duration::ZERO).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let replayed = accountant_rss(&services);
    assert!(replayed < idle + 100_000_000, "idle {idle} B, replayed with 4 queued audited jobs {replayed} B");
}

/// A writer of the job store (a worker, through its checkpoints) drops junk named `job.sealed`
/// under another job's checkpoints, with a sound job's id as the folder above it, and plants an
/// idempotency claim. After a coordinator restart the sound job still runs to SUCCEEDED (a
/// record is read only at its exact path), and a submit with the planted key creates its own
/// job (claims live where only the coordinator writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_in_the_job_store_neither_kills_a_sound_job_nor_answers_a_submit() {
    use dpcap_proto::v1::SubmitJobRequest;
    let dir = tempfile_dir("junk-store");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    let sound = submit(&services, one_worker(&dataset, 2)).await;
    let other = submit(&services, one_worker(&dataset, 2)).await;
    services.coordinator.kill();
    for holder in [&other.job_id, &sound.job_id] {
        let nested = services.store.join("jobs").join(holder).join("checkpoints/9").join(&sound.job_id);
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::write(nested.join("job.sealed"), b"junk").unwrap();
    }
    let key = "sweep-7";
    let claims = services.store.join("idempotency");
    std::fs::create_dir_all(&claims).unwrap();
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    std::fs::write(claims.join(hex), other.job_id.as_bytes()).unwrap();

    services.restart_coordinator(Duration::ZERO).await;
    let metrics = services.coordinator.scrape().await;
    assert!(metrics.contains("dpcap_coordinator_records_refused_total 0"), "nothing nested was read: {metrics}");
    let request =
        SubmitJobRequest { spec: Some(one_worker(&dataset, 2).into_proto().unwrap()), idempotency_key: key.into() };
    let keyed = services.jobs().await.submit_job(request).await.expect("submitted").into_inner();
    assert!(keyed.job_id != other.job_id && keyed.job_id != sound.job_id, "a job of its own: {}", keyed.job_id);
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    let done = wait_until(&services, &sound.job_id, within(2), |j| j.state == JobState::Succeeded as i32).await;
    assert_eq!(done.progress.unwrap().step, 2);
}

/// The secrets store loses its record key while jobs are held: the coordinator refuses to
/// start, naming the key and the flag, instead of refusing every record in silence; with the
/// flag it starts, and the key file it writes is its owner's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_record_key_with_jobs_held_stops_the_start_unless_a_new_key_is_asked_for() {
    let dir = tempfile_dir("lost-key");
    let dataset = synth_dataset(&dir, 120);
    let mut services = Services::start(&dir).await;
    submit(&services, one_worker(&dataset, 2)).await;
    services.coordinator.kill();
    let secrets = std::path::PathBuf::from(format!("{}-secrets", services.store.display()));
    std::fs::remove_file(secrets.join("record.key")).unwrap();
    let start = |extra: &[&str]| {
        std::process::Command::new(dpcap_e2e::binary("dpcap-coordinator"))
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--store"])
            .arg(&services.store)
            .args(["--accountant", &services.accountant.grpc])
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = start(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("record.key is missing while the stores hold 1 jobs"), "{stderr}");
    assert!(stderr.contains("--new-record-key"), "{stderr}");
    assert!(!secrets.join("record.key").exists(), "no key minted");

    services.add_coordinator_flags(&["--new-record-key"]);
    services.restart_coordinator(Duration::ZERO).await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(secrets.join("record.key")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key is its owner's alone");
    let metrics = services.coordinator.scrape().await;
    assert!(metrics.contains("dpcap_coordinator_records_refused_total 1"), "{metrics}");
}

/// A budget of ε 2 on a dataset; copies of its examples: its index copied and its manifest
/// edited by a byte, its shards indexed afresh (another manifest, no trained tokenizer), the
/// same examples cut into other shards, and that re-cut beside a copy of an original shard
/// (each example twice). Each has an index digest of its own, yet names the original's budget
/// (by its examples), and a plan past that budget is refused on each as on the original. An
/// index without example identities, or one whose identities hold an example twice, trains no
/// DP job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_a_recut_or_a_reindex_of_a_budgeted_dataset_spends_its_budget_and_an_index_without_identities_trains_no_dp_job()
 {
    use dpcap_e2e::dpctl;
    use dpcap_proto::v1::SubmitJobRequest;
    let dir = tempfile_dir("copy-budget");
    let dataset = synth_dataset(&dir, 120);
    // As in production: a dataset trains only under a budget its privacy admin set.
    let services = Services::with_args(&dir, 3, &[], &[]).await;
    let accountant = services.accountant.grpc.clone();
    let delta = (1.0f64 / 120.0).to_string();
    let set = ["dataset", "budget", "set", dataset.to_str().unwrap(), "--epsilon", "2", "--delta", &delta];
    let set = dpctl(&[&set[..], &["--accountant", &accountant]].concat());
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));

    let (edited, reindexed) = (dir.join("copy-edited"), dir.join("copy-reindexed"));
    copy_tree(&dataset, &edited, true);
    let manifest = edited.join("index/manifest.json");
    let mut bytes = std::fs::read(&manifest).unwrap();
    bytes.push(b'\n');
    std::fs::write(&manifest, bytes).unwrap();
    copy_tree(&dataset, &reindexed, false);
    let index = dpctl(&["dataset", "index", reindexed.to_str().unwrap()]);
    assert!(index.status.success(), "{}", String::from_utf8_lossy(&index.stderr));

    let shown = |data: &std::path::Path| {
        let out = dpctl(&["dataset", "budget", "show", data.to_str().unwrap(), "--accountant", &accountant]);
        assert!(out.status.success(), "{}: {}", data.display(), String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["dataset_id"].as_str().unwrap().to_owned()
    };
    // The same examples cut into shards of 50 (the same member bytes, other tars), and the
    // shards of the original beside them (every example twice: the indexer keeps one copy).
    let recut = recut(&dir, 120, 50);
    std::fs::copy(dataset.join("tokenizer.json"), recut.join("tokenizer.json")).unwrap();
    let doubled = dir.join("copy-doubled");
    copy_tree(&recut, &doubled, false);
    std::fs::copy(dataset.join("shard-00000.tar"), doubled.join("zz-copy.tar")).unwrap();
    let index = dpctl(&["dataset", "index", doubled.to_str().unwrap()]);
    assert!(index.status.success(), "{}", String::from_utf8_lossy(&index.stderr));
    let indexed: serde_json::Value = serde_json::from_slice(&index.stdout).unwrap();
    assert_eq!((indexed["examples"].as_u64(), indexed["skipped"]["duplicate"].as_u64()), (Some(120), Some(100)));

    let submit = |data: &std::path::Path| {
        let spec = dpcap_proto::spec::SpecFile { epsilon: Some(8.0), workers: Some(1), ..spec(data, 3) };
        let request = SubmitJobRequest { spec: Some(spec.into_proto().unwrap()), idempotency_key: String::new() };
        let services = &services;
        async move { services.jobs().await.submit_job(request).await.expect_err("refused at submit") }
    };
    // The original's shards with identities written by hand (each id + 1): named otherwise by
    // its examples, bound all the same by the shards' bytes the budget was set from.
    let forged = dir.join("copy-forged");
    copy_tree(&dataset, &forged, true);
    rewrite_ids(&forged, |id| id.wrapping_add(1));
    let original = shown(&dataset);
    for copy in [&edited, &reindexed, &recut, &doubled, &forged] {
        if *copy != forged {
            assert_eq!(shown(copy), original, "{} names the original's budget", copy.display());
        }
        let refused = submit(copy).await;
        assert!(refused.message().contains(&original) && refused.message().contains("budget 2"), "{refused}");
    }

    // An index without example identities (version 3) trains no DP job and names no budget.
    let v3 = dir.join("copy-v3");
    copy_tree(&dataset, &v3, true);
    let manifest = v3.join("index/manifest.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    json["version"] = 3.into();
    json.as_object_mut().unwrap().remove("example_ids");
    std::fs::write(&manifest, serde_json::to_vec(&json).unwrap()).unwrap();
    let refused = submit(&v3).await;
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    let message = refused.message();
    assert!(message.contains("version 3") && message.contains("dpctl dataset index"), "{message}");
    let budget = ["dataset", "budget", "set", v3.to_str().unwrap(), "--epsilon", "9", "--delta", &delta];
    let budget = dpctl(&[&budget[..], &["--accountant", &accountant]].concat());
    assert!(!budget.status.success() && String::from_utf8_lossy(&budget.stderr).contains("index it again"));

    // An identities file written by hand to hold an example twice is refused, by id.
    let twice = dir.join("copy-twice");
    copy_tree(&dataset, &twice, true);
    let mut previous = None;
    rewrite_ids(&twice, |id| *previous.get_or_insert(id)); // every id the first
    let refused = submit(&twice).await;
    assert!(refused.message().contains("the index holds one example twice"), "{refused}");
}

/// Rewrites every id of `data`'s `index/examples.bin` with `f`, and the manifest's pin of it.
fn rewrite_ids(data: &std::path::Path, mut f: impl FnMut(u64) -> u64) {
    let ids = data.join("index/examples.bin");
    let mut bytes = std::fs::read(&ids).unwrap();
    for id in bytes[13..].chunks_exact_mut(8) {
        let new = f(u64::from_le_bytes(id.try_into().unwrap()));
        id.copy_from_slice(&new.to_le_bytes());
    }
    std::fs::write(&ids, &bytes).unwrap();
    let manifest = data.join("index/manifest.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    json["example_ids"]["sha256"] = dpcap_proto::digest::sha256(&bytes).into();
    std::fs::write(&manifest, serde_json::to_vec(&json).unwrap()).unwrap();
}

/// The first `examples` synthetic examples (the bytes [`synth_dataset`] writes) cut into shards
/// of `shard_size`, indexed.
fn recut(dir: &std::path::Path, examples: u64, shard_size: u64) -> std::path::PathBuf {
    let out = dir.join("recut");
    let (examples, shard_size) = (examples.to_string(), shard_size.to_string());
    let o = dpcap_e2e::dpctl(&[
        "dataset",
        "synth",
        "--out",
        out.to_str().unwrap(),
        "--examples",
        &examples,
        "--eval-examples",
        "0",
        "--shard-size",
        &shard_size,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let train = out.join("train");
    let index = dpcap_e2e::dpctl(&["dataset", "index", train.to_str().unwrap()]);
    assert!(index.status.success(), "{}", String::from_utf8_lossy(&index.stderr));
    train
}

/// Copies `from`'s shards (and, with `index`, its index) to `to`.
fn copy_tree(from: &std::path::Path, to: &std::path::Path, index: bool) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            if index {
                copy_tree(&path, &target, true);
            }
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
