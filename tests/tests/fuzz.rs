//! Hostile input: 10,000 generated cases — job-spec files, and structurally valid request
//! messages with hostile field values for every RPC in the role table (`dpcap_proto::roles::POLICY`,
//! which a serve test holds equal to the protocol's RPCs) — against running servers.
//! No case may crash a server or hang it, and every INVALID_ARGUMENT names its field
//! (`invalid FIELD: …`). Reproducible from the seed.

use std::time::Duration;

use dpcap_e2e::jobs::tempfile_dir;
use dpcap_e2e::{Services, synth_dataset};
use dpcap_proto::roles::POLICY;
use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::accountant_service_client::AccountantServiceClient;
use dpcap_proto::v1::job_service_client::JobServiceClient;
use dpcap_proto::v1::worker_service_client::WorkerServiceClient;
use dpcap_proto::v1::*;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use tonic::transport::Channel;
use tonic::{Code, Status};

const CASES: usize = 10_000;

/// Hostile values: the edges of every type.
struct Gen(ChaCha20Rng);

impl Gen {
    fn pick<T: Clone>(&mut self, options: &[T]) -> T {
        options[(self.0.next_u64() % options.len() as u64) as usize].clone()
    }

    fn f64(&mut self) -> f64 {
        let random = f64::from_bits(self.0.next_u64());
        self.pick(&[0.0, -0.0, -1.0, 1e-300, 1e300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.5, 1.0, 2.0, random])
    }

    fn u64(&mut self) -> u64 {
        let random = self.0.next_u64();
        self.pick(&[0, 1, 7, u64::MAX, u64::MAX / 2, 1 << 34, 1 << 40, random])
    }

    fn u32(&mut self) -> u32 {
        self.u64() as u32
    }

    fn string(&mut self) -> String {
        let long = "x".repeat(1 + (self.0.next_u64() % 5000) as usize);
        self.pick(&[
            String::new(),
            "job-1".into(),
            "../../etc/passwd".into(),
            "a/b".into(),
            "\u{0}\u{ffff}é漢".into(),
            long,
            format!("sha256:{}", "ab".repeat(32)),
            "sha256:".into(),
            "w-00000000".into(),
        ])
    }

    fn maybe<T>(&mut self, value: T) -> Option<T> {
        if self.0.next_u64().is_multiple_of(2) { Some(value) } else { None }
    }

    /// A chunk's data: whole and ragged lengths of hostile f32 values.
    fn data(&mut self) -> Vec<u8> {
        let n = self.pick(&[0usize, 1, 3, 17]);
        let mut bytes: Vec<u8> = (0..n).flat_map(|_| (self.f64() as f32).to_le_bytes()).collect();
        bytes.truncate(bytes.len() - self.pick(&[0usize, 0, 1, 3]).min(bytes.len()));
        bytes
    }
}

/// Whether an answer is acceptable: any status a handler may give, and for INVALID_ARGUMENT a
/// message that names the field.
fn check(what: &str, answer: Result<(), Status>) {
    let Err(status) = answer else { return };
    match status.code() {
        Code::InvalidArgument => assert!(
            status.message().starts_with("invalid "),
            "{what}: INVALID_ARGUMENT must name the field: {:?}",
            status.message()
        ),
        Code::NotFound | Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted | Code::OutOfRange => {}
        // A message that exceeds the server's limits, refused by the transport.
        Code::ResourceExhausted => {}
        other => panic!("{what}: unexpected {other:?}: {}", status.message()),
    }
}

async fn channel(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned()).unwrap().connect().await.unwrap()
}

async fn within<T>(what: &str, call: impl std::future::Future<Output = Result<T, Status>>) -> Result<(), Status> {
    match tokio::time::timeout(Duration::from_secs(20), call).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => panic!("{what}: no answer within 20 s"),
    }
}

#[test]
fn ten_thousand_hostile_spec_files_never_panic_and_every_refusal_names_its_field() {
    let mut g = Gen(ChaCha20Rng::seed_from_u64(1));
    let keys = [
        "name",
        "dataset",
        "model",
        "epsilon",
        "delta",
        "noise_multiplier",
        "sample_rate",
        "batch_size",
        "steps",
        "epochs",
        "clipping_norm",
        "learning_rate",
        "warmup_steps",
        "micro_batch",
        "workers",
        "telemetry",
        "accountant",
        "seed",
        "bogus_key",
    ];
    for case in 0..CASES {
        let mut text = String::new();
        for _ in 0..(g.0.next_u64() % 6) {
            let key = g.pick(&keys);
            let value = match g.0.next_u64() % 5 {
                0 => format!("{}", g.f64()),
                1 => format!("{}", g.u64()),
                2 => format!("{:?}", g.string()),
                3 => "[1, 2]".into(),
                _ => "{a: b}".into(),
            };
            text.push_str(&format!("{key}: {value}\n"));
        }
        if g.0.next_u64().is_multiple_of(10) {
            text = String::from_utf8_lossy(&g.0.next_u64().to_le_bytes()).into_owned();
        }
        match SpecFile::parse(&text) {
            Ok(spec) => {
                if let Err(e) = spec.into_proto() {
                    assert!(e.to_string().starts_with("invalid "), "case {case}: {e}");
                }
            }
            Err(e) => assert!(e.to_string().starts_with("invalid "), "case {case} {text:?}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_hostile_requests_to_every_rpc_never_crash_a_server() {
    let dir = tempfile_dir("fuzz");
    let dataset = synth_dataset(&dir, 60);
    let services = Services::start(&dir).await;
    let mut accountant = AccountantServiceClient::new(channel(&services.accountant.grpc).await);
    let mut jobs = JobServiceClient::new(channel(&services.coordinator.grpc).await);
    let mut workers = WorkerServiceClient::new(channel(&services.coordinator.grpc).await);
    let mut g = Gen(ChaCha20Rng::seed_from_u64(2));
    let dataset = dataset.to_string_lossy().into_owned();
    for case in 0..CASES {
        // Every RPC the role table names, in turn: an RPC added to the protocol (and so to the
        // table, which a serve test holds to the protocol) and not here fails below.
        let rpc = POLICY[case % POLICY.len()].0.trim_start_matches("/dpcap.v1.");
        let what = format!("case {case} {rpc}");
        let answer = match rpc {
            "AccountantService/RegisterJob" => {
                // Cheap mechanisms only: calibrating an absurd σ is a cost question, not this test's.
                let mechanism = Mechanism {
                    sample_rate: g.f64(),
                    noise_multiplier: g.pick(&[f64::NAN, -1.0, 0.0, 1.0, 3.0]),
                    clipping_norm: g.f64(),
                };
                let contract = PrivacyContract {
                    mechanism: g.pick(&[None, Some(mechanism)]),
                    delta: g.f64(),
                    epsilon_target: g.pick(&[f64::NAN, -1.0, 8.0, f64::INFINITY]),
                    accountant: g.u32() as i32,
                    dataset_id: g.string(),
                    data_id: g.string(),
                    shards_id: String::new(),
                    privacy: g.u32() as i32,
                    simulated: g.pick(&[None, Some(mechanism)]),
                    audit_canaries: g.pick(&[0, 1, 1000, u32::MAX]),
                    audit_coordinates: g.u32() as i32,
                    unit: g.u32() as i32,
                    users_digest: g.string(),
                    init_from_job: g.string(),
                    planned_steps: g.u64(),
                };
                let request = RegisterJobRequest {
                    job_id: g.string(),
                    contract: g.pick(&[None, Some(contract)]),
                    gradient_dim: g.u64(),
                    insecure_noise_seed: None,
                };
                within(&what, accountant.register_job(request)).await
            }
            "AccountantService/SubmitPart" => {
                let chunks: Vec<GradientChunk> = (0..(g.0.next_u64() % 3))
                    .map(|_| GradientChunk {
                        job_id: g.string(),
                        step: g.u64(),
                        part: g.u32(),
                        offset: g.u64(),
                        data: g.data().into(),
                        attempt: g.u64(),
                        step_capability: g.string(),
                    })
                    .collect();
                within(&what, accountant.submit_part(futures_stream(chunks))).await
            }
            "AccountantService/FetchRelease" => {
                let request = FetchReleaseRequest { job_id: g.string(), step: g.u64(), chunk_values: g.u32() };
                within(&what, async { accountant.fetch_release(request).await?.into_inner().message().await }).await
            }
            "AccountantService/GetLocalEndpoint" => {
                within(&what, accountant.get_local_endpoint(dpcap_proto::v1::LocalEndpointRequest {})).await
            }
            "AccountantService/GetSpend" => {
                within(&what, accountant.get_spend(GetSpendRequest { job_id: g.string() })).await
            }
            "AccountantService/CloseJob" => {
                within(
                    &what,
                    accountant.close_job(CloseJobRequest {
                        job_id: g.string(),
                        reason: g.string(),
                        resumable: g.pick(&[false, true]),
                        generation: g.u64(),
                    }),
                )
                .await
            }
            "AccountantService/TrimReleases" => {
                within(
                    &what,
                    accountant.trim_releases(TrimReleasesRequest { job_id: g.string(), before_step: g.u64() }),
                )
                .await
            }
            "AccountantService/Estimate" => {
                let request = EstimateRequest {
                    sample_rate: g.f64(),
                    delta: g.f64(),
                    accountant: g.u32() as i32,
                    noise_multiplier: g.pick(&[None, Some(f64::NAN), Some(-1.0), Some(1.0)]),
                    steps: g.pick(&[None, Some(0), Some(10)]),
                    epsilon: g.pick(&[None, Some(f64::INFINITY), Some(-2.0)]),
                };
                within(&what, accountant.estimate(request)).await
            }
            "AccountantService/SetDatasetBudget" => {
                let request = SetDatasetBudgetRequest {
                    dataset_id: g.string(),
                    epsilon: g.f64(),
                    delta: g.f64(),
                    reason: g.string(),
                    allow_not_private: g.pick(&[false, true]),
                    unit: g.u32() as i32,
                    name: g.string(),
                    population: g.pick(&[0, 1, 20_000, u64::MAX]),
                    force: g.pick(&[false, true]),
                    shards_id: g.string(),
                };
                within(&what, accountant.set_dataset_budget(request)).await
            }
            "AccountantService/GetDatasetBudget" => {
                within(
                    &what,
                    accountant
                        .get_dataset_budget(GetDatasetBudgetRequest { dataset_id: g.string(), unit: g.u32() as i32 }),
                )
                .await
            }
            "JobService/SubmitJob" => {
                let mut spec = SpecFile {
                    dataset: if case % 2 == 0 { dataset.clone() } else { g.string() },
                    model: if case % 3 == 0 { g.string() } else { "micro".to_owned() },
                    ..Default::default()
                }
                .into_proto()
                .unwrap_or_default();
                spec.epsilon = {
                    let v = g.f64();
                    g.maybe(v)
                };
                spec.steps = {
                    let v = g.u64();
                    g.maybe(v)
                };
                spec.batch_size = {
                    let v = g.u64();
                    g.maybe(v)
                };
                spec.objective = g.u32() as i32;
                spec.micro_batch = {
                    let v = g.u32();
                    g.maybe(v)
                };
                spec.workers = {
                    let v = g.u32();
                    g.maybe(v)
                };
                let request = SubmitJobRequest { spec: g.pick(&[None, Some(spec)]), idempotency_key: g.string() };
                within(&what, jobs.submit_job(request)).await
            }
            "JobService/GetJob" => within(&what, jobs.get_job(GetJobRequest { job_id: g.string() })).await,
            "JobService/CancelJob" => within(&what, jobs.cancel_job(CancelJobRequest { job_id: g.string() })).await,
            "JobService/ResumeJob" => within(&what, jobs.resume_job(ResumeJobRequest { job_id: g.string() })).await,
            "JobService/WatchJob" => {
                within(&what, async { jobs.watch_job(WatchJobRequest { job_id: g.string() }).await.map(|_| ()) }).await
            }
            "WorkerService/RegisterWorker" => {
                let request = RegisterWorkerRequest { name: g.string(), device: g.string() };
                within(&what, workers.register_worker(request)).await
            }
            "WorkerService/Heartbeat" => {
                within(&what, workers.heartbeat(HeartbeatRequest { worker_id: g.string() })).await
            }
            "WorkerService/GetStep" => {
                let request = GetStepRequest { worker_id: g.string(), job_id: g.string(), generation: g.u64() };
                within(&what, workers.get_step(request)).await
            }
            "WorkerService/ReportStep" => {
                let request = ReportStepRequest {
                    worker_id: g.string(),
                    job_id: g.string(),
                    generation: g.u64(),
                    step: g.u64(),
                    outcome: g.u32() as i32,
                    message: g.string(),
                    examples: g.u64(),
                    loss: Some(g.f64()),
                    compute_seconds: g.f64(),
                    ..Default::default()
                };
                within(&what, workers.report_step(request)).await
            }
            "AccountantService/AttachJob" => {
                let request = AttachJobRequest { job_id: g.string(), gradient_dim: g.u64(), parts: g.u32() };
                within(&what, accountant.attach_job(request)).await
            }
            "AccountantService/FenceJob" => {
                let request =
                    FenceJobRequest { job_id: g.string(), generation: g.u64(), resume: g.pick(&[false, true]) };
                within(&what, accountant.fence_job(request)).await
            }
            "AccountantService/AuditJob" => {
                within(&what, accountant.audit_job(AuditJobRequest { job_id: g.string() })).await
            }
            "JobService/AuditJob" => within(&what, jobs.audit_job(AuditJobRequest { job_id: g.string() })).await,
            "JobService/ListJobs" => within(&what, jobs.list_jobs(ListJobsRequest {})).await,
            "WorkerService/Leave" => within(&what, workers.leave(LeaveRequest { worker_id: g.string() })).await,
            "WorkerService/Rendezvous" => {
                let request = RendezvousRequest {
                    worker_id: g.string(),
                    job_id: g.string(),
                    generation: g.u64(),
                    nccl_id: vec![0; (g.0.next_u64() % 300) as usize].into(),
                };
                within(&what, workers.rendezvous(request)).await
            }
            other => panic!("{other} is in the role table but has no hostile case here: add one"),
        };
        check(&what, answer);
    }
    // Both servers are still up and serving.
    accountant.get_spend(GetSpendRequest { job_id: "none".into() }).await.unwrap_err();
    jobs.list_jobs(ListJobsRequest {}).await.expect("the coordinator still serves");
}

fn futures_stream(chunks: Vec<GradientChunk>) -> impl tonic::codegen::tokio_stream::Stream<Item = GradientChunk> {
    tonic::codegen::tokio_stream::iter(chunks)
}
