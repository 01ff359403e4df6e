//! Registration of audited jobs across the placement change: a ledger from before placements
//! replays as model coordinates and accepts its workers' repeated registrations.

use super::*;

fn audited(job_id: &str, coordinates: &str) -> Registration {
    Registration {
        job_id: job_id.into(),
        sample_rate: 0.01,
        noise_multiplier: 1.0,
        clipping_norm: 1.0,
        delta: 1e-5,
        epsilon_target: 8.0,
        accountant: "rdp".into(),
        gradient_dim: 100,
        parts: 1,
        dataset_id: String::new(),
        dataset_epsilon_budget: 0.0,
        insecure_noise_seed: None,
        privacy: "dp".into(),
        simulated: None,
        audit_canaries: 10,
        audit_coordinates: coordinates.into(),
    }
}

async fn accountant(dir: &std::path::Path) -> Accountant {
    let (store, root) = dpcap_serve::open_durable_store(&dir.to_string_lossy()).unwrap();
    let policy = Policy { allow_unbudgeted_datasets: true, ..Default::default() };
    let accountant = Accountant::new(Ledger::new(store, root), policy);
    accountant.replay().await.unwrap();
    accountant
}

#[tokio::test]
async fn an_audited_job_from_before_placements_keeps_model_coordinates_and_its_repeats_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    // As an older accountant wrote it: canaries, and no placement.
    accountant(dir.path()).await.ledger.register(&audited("old", "")).await.unwrap();
    let accountant = accountant(dir.path()).await;
    let (job, created) = accountant.register(audited("old", "")).await.unwrap();
    assert!(!created, "a worker's repeated registration is the same contract");
    assert_eq!(job.audit.as_ref().unwrap().reserved(), 0, "model coordinates, as registered");

    let (job, created) = accountant.register(audited("new", "")).await.unwrap();
    assert!(created);
    assert_eq!(job.registration.audit_coordinates, "reserved", "unsaid means reserved for a new job");
    assert_eq!(job.audit.as_ref().unwrap().reserved(), 10);
    assert!(!accountant.register(audited("new", "")).await.unwrap().1);
    assert!(!accountant.register(audited("new", "reserved")).await.unwrap().1);
    let other = accountant.register(audited("new", "model")).await.unwrap_err();
    assert!(matches!(other, AccountantError::RegistrationConflict { .. }), "{other:?}");
}
