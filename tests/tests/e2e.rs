//! The product end to end with real processes: `dpcap-accountant`, `dpcap-coordinator`, two
//! `dpcap-worker`s and `dpctl`, on 127.0.0.1 ephemeral ports over local directories (and, in
//! `e2e/s3.rs`, over the buckets of a real S3 server).

use std::time::Duration;

#[path = "e2e/metrics_doc.rs"]
mod metrics_doc;
#[path = "e2e/s3.rs"]
mod s3;
#[path = "e2e/tour.rs"]
mod tour;

use dpcap_e2e::jobs::{ended, get, is, spec, spend, step, submit, tempfile_dir, wait_until, within};
use dpcap_e2e::{Process, Services, dpctl, synth_dataset};
use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::{CancelJobRequest, GetJobRequest, JobPhase, JobState, Reduction, SubmitJobRequest};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_to_success_charging_exactly_its_steps_and_leaves_a_loadable_checkpoint() {
    let dir = tempfile_dir("success");
    let dataset = synth_dataset(&dir, 240);
    let services = Services::start(&dir).await;
    let _workers = [
        Process::worker(&services.coordinator.grpc, "w0", &dir),
        Process::worker(&services.coordinator.grpc, "w1", &dir),
    ];
    // Audited in one run: 1,000 canaries the accountant alone knows.
    let audit = dpcap_proto::spec::AuditFile { canaries: 1000, kind: Some("gradient".into()), coordinates: None };
    let job = submit(&services, SpecFile { audit: Some(audit), ..spec(&dataset, 5) }).await;
    let plan = job.plan.unwrap();
    let c = dpcap_proto::plan::contract(&plan).unwrap();
    assert!(plan.calibrated && c.mechanism.noise_multiplier > 0.0, "sigma calibrated before training: {plan:?}");
    assert!((c.delta - 1.0 / 240.0).abs() < 1e-12, "delta defaults to 1/N");

    let waited = dpctl(&["--coordinator", &services.coordinator.grpc, "wait", &job.job_id]);
    assert_eq!(
        waited.status.code(),
        Some(0),
        "dpctl wait exits 0 on success: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let job = get(&services, &job.job_id).await;
    assert_eq!(job.state, JobState::Succeeded as i32, "{job:#?}");
    assert_eq!(job.reduction, Reduction::Accountant as i32, "CPU ranks send their parts to the accountant");
    assert_eq!(services.charged_steps(&job.job_id), (0..5).collect::<Vec<_>>(), "one charge per step, no more");
    let spend = spend(&services, &job.job_id).await;
    assert!(spend.epsilon_spent <= c.epsilon_target.unwrap() + 1e-9, "{spend:?}");
    // A watcher is shown the job's end only once the accountant has closed it.
    assert_eq!(spend_phase(&services, &job.job_id).await, JobPhase::Closed as i32, "closed before `dpctl wait` ends");

    // The audit is among the job's conditions when it ends, and `dpctl audit` shows it.
    let audited = job.conditions.iter().find(|c| c.r#type == "Audited").unwrap_or_else(|| panic!("{job:#?}"));
    assert_eq!(audited.reason, "AuditPassed", "{audited:?}");
    assert!(audited.message.ends_with("not the workers' clipping"), "it says what it covers: {audited:?}");
    // Through the coordinator: an operator needs no accountant address.
    let out = dpctl(&["audit", &job.job_id, "--json", "--coordinator", &services.coordinator.grpc]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["canaries"].as_u64(), report["guesses"].as_u64(), report["steps_scored"].as_u64()),
        (Some(1000), Some(20), Some(5))
    );
    assert!(report["epsilon_lower_bound"].as_f64().unwrap() <= report["epsilon_claimed"].as_f64().unwrap(), "{report}");
    assert!(report["covers"].as_str().unwrap().contains("reserved coordinates"), "{report}");
    // The job's epsilon is the ledger's, read by the coordinator (never a worker's report).
    assert_eq!(job.progress.as_ref().unwrap().epsilon_spent, spend.epsilon_spent);

    // The checkpoint of the last step exists and loads into the model.
    let checkpoints = dpcap_ml::checkpoint::CheckpointStore::open(&job.checkpoint_root).unwrap();
    assert_eq!(checkpoints.latest().await.unwrap(), Some(5));
    let (manifest, weights, optimizer) = checkpoints.load(5).await.unwrap();
    assert_eq!((manifest.step, manifest.model.as_str()), (5, "micro"));
    let mut params = dpcap_ml::params::ParamSet::<burn_inner::Inner>::new(&Default::default());
    let captioner =
        dpcap_ml::model::Captioner::new(&mut params, dpcap_ml::model::CaptionerConfig::named("micro").unwrap());
    dpcap_ml::checkpoint::load_weights(&mut params, &weights).expect("weights load");
    dpcap_ml::checkpoint::load_optimizer(&params, &optimizer).expect("optimizer state loads");
    drop(captioner);

    // A worker wrote that manifest: altered to say the weights were NOT PRIVATE (or anything
    // else its ledger does not say), it no longer passes as the job's at submit.
    let manifest_path = std::path::Path::new(&job.checkpoint_root).join("5/manifest.json");
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    std::fs::write(&manifest_path, text.replace("\"privacy\": \"dp\"", "\"privacy\": \"not_private\"")).unwrap();
    let from_altered = SpecFile {
        init_from: Some(job.checkpoint_root.clone()),
        init_public: Some(true),
        dataset: synth_dataset(&dir.join("other"), 60).to_string_lossy().into_owned(),
        ..spec(&dataset, 2)
    };
    let request = SubmitJobRequest { spec: Some(from_altered.into_proto().unwrap()), idempotency_key: String::new() };
    let refused = services.jobs().await.submit_job(request).await.unwrap_err();
    assert!(refused.message().starts_with("invalid init_from:") && refused.message().contains("altered"), "{refused}");
    // A manifest that names a job the accountant never knew, claiming DP weights, vouches for
    // nothing: refused, whatever dataset it names.
    let ghost = dir.join("ghost");
    std::fs::create_dir_all(ghost.join("5")).unwrap();
    std::fs::write(ghost.join("latest"), "5").unwrap();
    let claimed = text.replace(&format!("\"{}\"", job.job_id), "\"job-ghost\"");
    assert!(claimed.contains("job-ghost") && claimed.contains("\"privacy\": \"dp\""), "{claimed}");
    std::fs::write(ghost.join("5/manifest.json"), claimed).unwrap();
    let from_ghost = SpecFile { init_from: Some(ghost.to_string_lossy().into_owned()), ..spec(&dataset, 2) };
    let request = SubmitJobRequest { spec: Some(from_ghost.into_proto().unwrap()), idempotency_key: String::new() };
    let refused = services.jobs().await.submit_job(request).await.unwrap_err();
    assert!(refused.message().contains("the accountant knows no such job"), "{refused}");

    let metrics = services.coordinator.scrape().await;
    assert!(
        metrics.contains(&format!("dpcap_job_state{{job_id=\"{}\",privacy=\"dp\",state=\"succeeded\"}} 1", job.job_id)),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("dpcap_job_steps_completed{{job_id=\"{}\",privacy=\"dp\"}} 5", job.job_id)),
        "{metrics}"
    );
    assert!(metrics.contains("dpcap_step_duration_seconds_count"), "{metrics}");
}

mod burn_inner {
    pub type Inner = <dpcap_ml::CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_resumes_after_its_coordinator_and_workers_are_killed_without_charging_a_step_twice() {
    let dir = tempfile_dir("resume");
    let dataset = synth_dataset(&dir, 240);
    let mut services = Services::start(&dir).await;
    let mut workers = [
        Process::worker(&services.coordinator.grpc, "w0", &dir),
        Process::worker(&services.coordinator.grpc, "w1", &dir),
    ];
    let job = submit(&services, spec(&dataset, 10)).await;
    wait_until(&services, &job.job_id, within(10), |j| step(j) >= 4).await;
    services.coordinator.kill();
    workers.iter_mut().for_each(Process::kill);

    services.coordinator = Services::coordinator(&dir, &services.store, &services.accountant.grpc).await;
    let restored = get(&services, &job.job_id).await;
    assert!(restored.conditions.iter().any(|c| c.reason == "CoordinatorRestarted"), "{restored:#?}");
    let _workers = [
        Process::worker(&services.coordinator.grpc, "w2", &dir),
        Process::worker(&services.coordinator.grpc, "w3", &dir),
    ];
    let job = wait_until(&services, &job.job_id, within(10), |j| {
        j.state != JobState::Running as i32 && j.state != JobState::Pending as i32
    })
    .await;
    assert_eq!(job.state, JobState::Succeeded as i32, "{job:#?}");
    assert!(job.progress.as_ref().unwrap().generation >= 2, "the group was re-formed");
    let charged = services.charged_steps(&job.job_id);
    assert_eq!(charged, (0..10).collect::<Vec<_>>(), "every step number charged exactly once");
    assert_eq!(spend(&services, &job.job_id).await.steps_charged, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surviving_rank_rejoins_the_re_formed_group_when_its_peer_dies_mid_job() {
    let dir = tempfile_dir("peer-lost");
    let dataset = synth_dataset(&dir, 240);
    let services = Services::start(&dir).await;
    let _survivor = Process::worker(&services.coordinator.grpc, "w0", &dir);
    let mut lost = Process::worker(&services.coordinator.grpc, "w1", &dir);
    let job = submit(&services, spec(&dataset, 10)).await;
    wait_until(&services, &job.job_id, within(6), |j| step(j) >= 3).await;
    // The survivor is mid-step, waiting on a release that needs the lost rank's part.
    lost.kill();
    let _replacement = Process::worker(&services.coordinator.grpc, "w2", &dir);
    let job = wait_until(&services, &job.job_id, Duration::from_secs(120), |j| {
        j.state != JobState::Running as i32 && j.state != JobState::Pending as i32
    })
    .await;
    assert_eq!(job.state, JobState::Succeeded as i32, "{job:#?}");
    let progress = job.progress.as_ref().unwrap();
    // Only two workers live: the job can finish only if the survivor joined the new group.
    assert!(progress.generation >= 2, "the group was re-formed: {progress:?}");
    assert!(job.conditions.iter().any(|c| c.reason == "LeaseExpired"), "{job:#?}");
    assert_eq!(services.charged_steps(&job.job_id), (0..10).collect::<Vec<_>>(), "every step charged once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_budget_exhaustion_end_jobs_in_their_own_states() {
    let dir = tempfile_dir("cancel");
    let dataset = synth_dataset(&dir, 240);
    let services = Services::start(&dir).await;
    let _workers = [
        Process::worker(&services.coordinator.grpc, "w0", &dir),
        Process::worker(&services.coordinator.grpc, "w1", &dir),
    ];

    // Budget: a fixed sigma whose 40 steps would pass epsilon 1.5.
    let mut over = spec(&dataset, 40);
    (over.epsilon, over.noise_multiplier) = (Some(1.5), Some(0.7));
    over.telemetry = Some("strict".into());
    let job = submit(&services, over).await;
    assert!(job.conditions.iter().any(|c| c.reason == "BudgetWillExhaust"), "warned at submission: {job:#?}");
    let waited = dpctl(&["--coordinator", &services.coordinator.grpc, "wait", &job.job_id]);
    assert_eq!(waited.status.code(), Some(5), "dpctl wait exits 5 on budget exhaustion");
    let job = get(&services, &job.job_id).await;
    assert_eq!(job.state, JobState::BudgetExhausted as i32, "not FAILED: {job:#?}");
    let ended = job.conditions.iter().find(|c| c.reason == "BudgetExhausted").unwrap();
    assert!(ended.message.contains("> job target 1.5"), "the condition says which budget: {ended:?}");
    let spend = spend(&services, &job.job_id).await;
    assert!(spend.epsilon_spent <= 1.5 && spend.steps_charged < 40, "{spend:?}");
    let progress = job.progress.clone().unwrap();
    assert!(progress.step >= 1, "some steps ran before the refusal: {progress:?}");
    assert_eq!((progress.loss, progress.loss_first), (None, None), "telemetry: strict reports no loss");

    // Cancel a running job.
    let job = submit(&services, spec(&dataset, 500)).await;
    wait_until(&services, &job.job_id, within(2), |j| step(j) >= 1).await;
    let cancelled =
        services.jobs().await.cancel_job(CancelJobRequest { job_id: job.job_id.clone() }).await.unwrap().into_inner();
    assert_eq!(cancelled.state, JobState::Cancelled as i32);
    let again = services.jobs().await.cancel_job(CancelJobRequest { job_id: job.job_id.clone() }).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    let stopped = wait_until(&services, &job.job_id, Duration::from_secs(10), is(JobState::Cancelled)).await;
    assert!(step(&stopped) < 500);
    // A cancelled job can be resumed, so it stays open at the accountant; but nothing is
    // charged once its ranks have stopped.
    assert_eq!(spend_phase(&services, &job.job_id).await, JobPhase::Open as i32);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = services.charged_steps(&job.job_id).len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(services.charged_steps(&job.job_id).len(), settled, "a cancelled job charges no more steps");
    // A cancel and a spent budget are outcomes, not worker failures: nothing logs ERROR.
    for worker in ["w0", "w1"] {
        let log = std::fs::read_to_string(dir.join(format!("{worker}.log"))).unwrap();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
        assert!(errors.is_empty(), "{worker} logged errors: {errors:#?}");
    }
}

async fn spend_phase(services: &Services, job_id: &str) -> i32 {
    spend(services, job_id).await.phase
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_are_refused_naming_the_field_and_idempotency_keys_return_the_original() {
    let dir = tempfile_dir("invalid");
    let dataset = synth_dataset(&dir, 50);
    let services = Services::start(&dir).await;
    let base = spec(&dataset, 5);
    let cases: Vec<(&str, SpecFile)> = vec![
        ("model", SpecFile { model: "huge".into(), ..base.clone() }),
        ("epsilon", SpecFile { epsilon: Some(-1.0), ..base.clone() }),
        ("epsilon", SpecFile { epsilon: None, noise_multiplier: None, ..base.clone() }),
        ("noise_multiplier", SpecFile { noise_multiplier: Some(0.0), ..base.clone() }),
        ("delta", SpecFile { delta: Some(1.5), ..base.clone() }),
        ("delta", SpecFile { delta: Some(0.05), ..base.clone() }), // above 1/N = 0.02
        ("sample_rate", SpecFile { sample_rate: Some(2.0), batch_size: None, ..base.clone() }),
        ("sample_rate", SpecFile { sample_rate: Some(0.1), ..base.clone() }),
        ("batch_size", SpecFile { batch_size: Some(51), ..base.clone() }),
        ("steps", SpecFile { epochs: Some(1.0), ..base.clone() }),
        ("steps", SpecFile { steps: Some(0), ..base.clone() }),
        ("workers", SpecFile { workers: Some(0), ..base.clone() }),
        ("micro_batch", SpecFile { micro_batch: Some(0), ..base.clone() }),
        ("clipping_norm", SpecFile { clipping_norm: Some(f64::NAN), ..base.clone() }),
        ("checkpoint_interval", SpecFile { checkpoint_interval: Some(0), ..base.clone() }),
        ("warmup_steps", SpecFile { warmup_steps: Some(6), ..base.clone() }),
        ("dataset", SpecFile { dataset: dir.join("nowhere").to_string_lossy().into_owned(), ..base.clone() }),
    ];
    let mut client = services.jobs().await;
    for (field, bad) in cases {
        let request =
            SubmitJobRequest { spec: Some(bad.clone().into_proto().unwrap()), idempotency_key: String::new() };
        let error = client.submit_job(request).await.expect_err(field);
        assert_eq!(error.code(), tonic::Code::InvalidArgument, "{field}: {error:?}");
        assert!(error.message().starts_with(&format!("invalid {field}:")), "{field}: {}", error.message());
    }
    assert!(!dir.join("nowhere").exists(), "naming a dataset path never creates it");
    let mut raw = base.clone().into_proto().unwrap();
    raw.objective = 7;
    let error =
        client.submit_job(SubmitJobRequest { spec: Some(raw), idempotency_key: String::new() }).await.unwrap_err();
    assert!(error.message().contains("invalid objective"), "{error:?}");
    assert!(
        client.list_jobs(dpcap_proto::v1::ListJobsRequest {}).await.unwrap().into_inner().jobs.is_empty(),
        "nothing was queued"
    );

    let keyed =
        |key: &str| SubmitJobRequest { spec: Some(base.clone().into_proto().unwrap()), idempotency_key: key.into() };
    let first = client.submit_job(keyed("deploy-42")).await.unwrap().into_inner();
    let again = client.submit_job(keyed("deploy-42")).await.unwrap().into_inner();
    let other = client.submit_job(keyed("deploy-43")).await.unwrap().into_inner();
    assert_eq!(first.job_id, again.job_id);
    assert_ne!(first.job_id, other.job_id);
    let missing = client.get_job(GetJobRequest { job_id: "job-nope".into() }).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // dpctl names a mistyped key in a spec file.
    let file = dir.join("typo.yaml");
    std::fs::write(&file, "dataset: x\nmodel: micro\nepsilonn: 8\n").unwrap();
    let out = dpctl(&["--coordinator", &services.coordinator.grpc, "submit", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field `epsilonn`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A TAN simulation through the real processes: NOT PRIVATE in its conditions, metrics,
/// spend, checkpoint and export, with σ' = σ·B'/B added and the target recipe's ε reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tan_simulation_runs_not_private_and_reports_its_targets_epsilon_everywhere() {
    let dir = tempfile_dir("simulation");
    let dataset = synth_dataset(&dir, 240);
    let services = Services::start(&dir).await;
    let _workers = [
        Process::worker(&services.coordinator.grpc, "w0", &dir),
        Process::worker(&services.coordinator.grpc, "w1", &dir),
    ];
    let simulate = Some(dpcap_proto::spec::SimulateFile { batch_size: 120, noise_multiplier: Some(2.0) });
    let job = submit(&services, SpecFile { epsilon: None, simulate, ..spec(&dataset, 3) }).await;
    let c = dpcap_proto::plan::contract(job.plan.as_ref().unwrap()).unwrap();
    assert_eq!(c.mode.name(), "simulation");
    assert!((c.mechanism.noise_multiplier - 2.0 * 24.0 / 120.0).abs() < 1e-12, "sigma' = sigma B'/B: {c:?}");
    let job = wait_until(&services, &job.job_id, within(3), ended).await;
    assert_eq!(job.state, JobState::Succeeded as i32, "{job:#?}");
    assert!(job.conditions.iter().any(|c| c.reason == "NotPrivate" && c.message.starts_with("NOT PRIVATE")));

    let spend = spend(&services, &job.job_id).await;
    use dpcap_accountant::privacy::{AccountantKind, EpsilonCurve};
    let target = EpsilonCurve::new(AccountantKind::Rdp, 0.5, 2.0, 1.0 / 240.0).unwrap();
    assert_eq!(spend.privacy(), dpcap_proto::v1::Privacy::Simulation);
    assert_eq!(spend.epsilon_spent, target.epsilon_after(3), "the target recipe's epsilon, by RDP");
    let metrics = services.coordinator.scrape().await;
    let state = format!("dpcap_job_state{{job_id=\"{}\",privacy=\"simulation\",state=\"succeeded\"}} 1", job.job_id);
    assert!(metrics.contains(&state), "{metrics}");

    let checkpoints = dpcap_ml::checkpoint::CheckpointStore::open(&job.checkpoint_root).unwrap();
    let (manifest, _, _) = checkpoints.load(checkpoints.latest().await.unwrap().unwrap()).await.unwrap();
    assert_eq!(manifest.privacy, dpcap_accountant::privacy::contract::ModeKind::Simulation);
    assert!(!manifest.is_private());
}

/// One bad example cannot stop a job. A learning rate of 1e30 makes the weights diverge after
/// the first update, so from then on every example's loss is NaN or infinite: each is left out
/// of the clipped sum and counted, the parts stay finite, and the job runs to its end with the
/// count in its status and the coordinator's metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_examples_turn_nonfinite_keeps_running_and_counts_them() {
    let dir = tempfile_dir("nonfinite");
    let dataset = synth_dataset(&dir, 120);
    let services = Services::start(&dir).await;
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    let diverging =
        SpecFile { learning_rate: Some(1e30), warmup_steps: Some(0), workers: Some(1), ..spec(&dataset, 4) };
    let job = submit(&services, diverging).await;
    let job = wait_until(&services, &job.job_id, within(4), ended).await;
    assert_eq!(job.state, JobState::Succeeded as i32, "{job:#?}");
    let counted = job.progress.as_ref().unwrap().nonfinite_examples;
    assert!(counted > 0, "the diverged steps' examples are counted: {job:#?}");
    assert_eq!(services.charged_steps(&job.job_id), (0..4).collect::<Vec<_>>());
    let metrics = services.coordinator.scrape().await;
    let series = format!("dpcap_job_nonfinite_examples_total{{job_id=\"{}\"", job.job_id);
    assert!(metrics.contains(&series), "{metrics}");
}

/// The binaries are targets of the test package, built by cargo before any test runs: the
/// harness never builds (which once cost a first run about 300 s inside its first tests).
#[test]
fn the_binaries_exist_before_any_test_runs_and_the_harness_never_invokes_cargo() {
    for name in dpcap_e2e::binaries::BINARIES {
        assert!(dpcap_e2e::binary(name).is_file(), "{name}");
    }
    let harness = [include_str!("../src/lib.rs"), include_str!("../src/binaries.rs"), include_str!("../src/chaos.rs")];
    for source in harness {
        assert!(!source.contains("env!(\"CARGO\")"), "a test must never run cargo");
    }
}

/// The submit call's refusal of `spec`, which it must refuse.
async fn refused(services: &Services, spec: SpecFile) -> tonic::Status {
    let request = SubmitJobRequest { spec: Some(spec.into_proto().unwrap()), idempotency_key: String::new() };
    services.jobs().await.submit_job(request).await.expect_err("refused at submit")
}

/// An operator's mistakes about data and budgets are refused at submit, naming the field,
/// never as a worker's failure minutes later; a job on a shard whose bytes changed after
/// indexing fails naming the shard; a job that cannot get its workers says so while a job that
/// fits runs beside it; and a spec file's relative dataset path is its own directory's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_mistakes_are_refused_at_submit_by_name_and_changed_shards_fail_the_job() {
    let dir = tempfile_dir("operator");
    let dataset = synth_dataset(&dir, 240);
    // As in production: a dataset trains only under a budget its privacy admin set.
    let services = Services::with_args(&dir, 3, &[], &[]).await;
    let small = SpecFile { epsilon: Some(1.0), workers: Some(1), ..spec(&dataset, 3) };

    let unbudgeted = refused(&services, small.clone()).await;
    assert!(
        unbudgeted.message().starts_with("dataset ") && unbudgeted.message().contains("budget set"),
        "{unbudgeted}"
    );
    let delta = (1.0f64 / 240.0).to_string();
    let set = dpctl(&[
        "dataset",
        "budget",
        "set",
        dataset.to_str().unwrap(),
        "--epsilon",
        "2",
        "--delta",
        &delta,
        "--accountant",
        &services.accountant.grpc,
    ]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let cases = [
        ("privacy", SpecFile { not_private: Some(true), epsilon: None, ..small.clone() }),
        ("tokenizer", SpecFile { tokenizer: Some(dir.join("nowhere.json").to_string_lossy().into()), ..small.clone() }),
    ];
    for (field, bad) in cases {
        let e = refused(&services, bad).await;
        assert!(e.message().starts_with(&format!("invalid {field}:")), "{field}: {e}");
    }
    // A plan its budget cannot cover is a spent budget, not a bad spec: typed BUDGET_EXHAUSTED.
    let over = SpecFile { epsilon: None, noise_multiplier: Some(0.5), steps: Some(400), ..small.clone() };
    let over = refused(&services, over).await;
    assert_eq!(dpcap_proto::ErrorCode::of(&over), Some(dpcap_proto::ErrorCode::BudgetExhausted), "{over}");
    assert!(over.message().starts_with("400 planned steps would bring dataset"), "{over}");
    let figures = dpcap_proto::budget_exhausted(&over).expect("the refusal's figures travel with it");
    assert_eq!((figures.steps, figures.epsilon_budget, figures.delta), (400, 2.0, 1.0 / 240.0), "{figures:?}");
    assert!(figures.asked > 2.0 && figures.dataset_id.starts_with("sha256:"), "{figures:?}");
    assert!(
        services
            .jobs()
            .await
            .list_jobs(dpcap_proto::v1::ListJobsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs
            .is_empty()
    );

    // Five workers are wanted, one is registered: the job says so, and a one-worker job
    // submitted after it (through dpctl, from a spec file naming its data relatively) runs.
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    let waiting = submit(&services, SpecFile { workers: Some(5), ..small.clone() }).await;
    let file = dir.join("job.yaml");
    std::fs::write(
        &file,
        "dataset: ./data/train\nmodel: micro\nepsilon: 1.0\nbatch_size: 24\nsteps: 3\nmicro_batch: 16\nworkers: 1\n",
    )
    .unwrap();
    let out = dpctl(&["--coordinator", &services.coordinator.grpc, "submit", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fits = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["job_id"].as_str().unwrap().to_owned();
    let done = wait_until(&services, &fits, within(3), ended).await;
    assert_eq!(done.state, JobState::Succeeded as i32, "{done:#?}");
    let head = get(&services, &waiting.job_id).await;
    assert_eq!(head.state, JobState::Pending as i32, "{head:#?}");
    let why = head.conditions.iter().find(|c| c.reason == "WaitingForWorkers").unwrap_or_else(|| panic!("{head:#?}"));
    assert!(why.message.starts_with("waiting for 5 workers (1 registered"), "{why:?}");
    services.jobs().await.cancel_job(CancelJobRequest { job_id: waiting.job_id.clone() }).await.unwrap();

    // A shard rewritten in place after indexing (same size, other bytes) is refused by name.
    let shard = dataset.join("shard-00001.tar");
    let mut bytes = std::fs::read(&shard).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&shard, &bytes).unwrap();
    let job = submit(&services, SpecFile { epsilon: Some(0.5), ..small }).await;
    let job = wait_until(&services, &job.job_id, within(3), ended).await;
    assert_eq!(job.state, JobState::Failed as i32, "{job:#?}");
    let failed = job.conditions.iter().map(|c| c.message.as_str()).collect::<Vec<_>>().join("\n");
    assert!(failed.contains("shard-00001.tar") && failed.contains("digest"), "{failed}");

    // The budget forced below what is spent: resuming the cancelled job is refused at once,
    // with the budget's figures, never answered RUNNING and failed later; dpctl exits 5 for it,
    // as `dpctl wait` does for a budget's end.
    let accountant = ["--accountant", services.accountant.grpc.as_str()];
    let base = ["dataset", "budget", "set", dataset.to_str().unwrap(), "--epsilon", "0.2", "--delta", &delta];
    let lowered = dpctl(&[&base[..], &accountant[..], &["--force"]].concat());
    assert!(lowered.status.success(), "{}", String::from_utf8_lossy(&lowered.stderr));
    let resumed = dpctl(&["--coordinator", &services.coordinator.grpc, "resume", &waiting.job_id]);
    let said = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(5), "{said}");
    assert!(said.contains("BUDGET_EXHAUSTED") && said.contains("of its budget 0.2"), "{said}");
    let still = get(&services, &waiting.job_id).await;
    assert_eq!(still.state, JobState::Cancelled as i32, "nothing was queued: {still:#?}");
}
