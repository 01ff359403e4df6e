//! DP-FedEmb end to end with real processes: a user-level job samples users (N = users, δ =
//! 1/N_users), trains each sampled user locally on two CPU workers, charges one step per
//! round at the accountant, and leaves an embedder checkpoint; virtual clients are refused
//! (not yet data-independent); a dataset without users is refused naming the objective.

use std::time::Duration;

use dpcap_e2e::jobs::{ended, spend, submit, tempfile_dir, wait_until};
use dpcap_e2e::{Process, Services, identities_dataset, synth_dataset};
use dpcap_proto::spec::FedEmbFile;
use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::{JobState, SubmitJobRequest};

fn fedemb_spec(dataset: &std::path::Path, users_per_client: u32) -> SpecFile {
    SpecFile {
        name: "e2e-fedemb".into(),
        dataset: dataset.to_string_lossy().into_owned(),
        model: "micro".into(),
        objective: Some("fedemb".into()),
        epsilon: Some(8.0),
        batch_size: Some(6),
        steps: Some(3),
        workers: Some(2),
        checkpoint_interval: Some(3),
        augment: Some("center_crop".into()),
        fedemb: Some(FedEmbFile {
            users_per_client: Some(users_per_client),
            local_batch: Some(4),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_level_job_samples_users_charges_each_round_once_and_leaves_an_embedder() {
    let dir = tempfile_dir("fedemb");
    let dataset = identities_dataset(&dir, 30);
    let services = Services::start(&dir).await;
    let _workers = [
        Process::worker(&services.coordinator.grpc, "w0", &dir),
        Process::worker(&services.coordinator.grpc, "w1", &dir),
    ];
    let job = submit(&services, fedemb_spec(&dataset, 1)).await;
    let plan = job.plan.clone().unwrap();
    let c = dpcap_proto::plan::contract(&plan).unwrap();
    assert_eq!((plan.users, plan.clients, plan.examples), (30, 30, 240), "{plan:?}");
    assert!((c.mechanism.sample_rate - 6.0 / 30.0).abs() < 1e-12, "q is over users: {c:?}");
    assert!((c.delta - 1.0 / 30.0).abs() < 1e-12, "delta defaults to 1/N_users: {c:?}");
    assert!(c.mechanism.noise_multiplier > 0.0);

    let job = wait_until(&services, &job.job_id, Duration::from_secs(400), ended).await;
    assert_eq!(job.state, JobState::Succeeded as i32, "{job:#?}");
    assert_eq!(services.charged_steps(&job.job_id), vec![0, 1, 2], "one charge per round");
    let spend = spend(&services, &job.job_id).await;
    assert!(spend.epsilon_spent > 0.0 && spend.epsilon_spent <= c.epsilon_target.unwrap() + 1e-9, "{spend:?}");

    // The checkpoint is an embedder's (encoder and projection), with server momentum state.
    let checkpoints = dpcap_ml::checkpoint::CheckpointStore::open(&job.checkpoint_root).unwrap();
    let (manifest, weights, optimizer) = checkpoints.load(3).await.unwrap();
    assert_eq!((manifest.objective.name(), manifest.step), ("fedemb", 3));
    let mut params = dpcap_ml::params::ParamSet::<Inner>::new(&Default::default());
    let config = dpcap_ml::model::EmbedderConfig::named("micro").unwrap();
    let _model = dpcap_ml::model::Embedder::new(&mut params, config);
    dpcap_ml::checkpoint::load_weights(&mut params, &weights).expect("embedder weights load");
    let state = dpcap_ml::checkpoint::load_optimizer(&params, &optimizer).expect("server optimizer loads");
    assert_eq!(state.config.rule, dpcap_ml::optim::Rule::Momentum);

    // Virtual clients (k > 1) are refused: ⌈users/k⌉ would make the grouping data-dependent.
    let request =
        SubmitJobRequest { spec: Some(fedemb_spec(&dataset, 3).into_proto().unwrap()), idempotency_key: String::new() };
    let err = services.jobs().await.submit_job(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("fedemb.users_per_client"), "{}", err.message());

    // A dataset whose examples name no user cannot train at user level.
    let captions = synth_dataset(&dir, 100);
    let request = SubmitJobRequest {
        spec: Some(fedemb_spec(&captions, 1).into_proto().unwrap()),
        idempotency_key: String::new(),
    };
    let err = services.jobs().await.submit_job(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("objective") && err.message().contains("user"), "{}", err.message());
}

type Inner = <dpcap_ml::CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;
