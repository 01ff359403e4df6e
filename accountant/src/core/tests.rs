//! The core's registration rules over a real ledger directory: contracts from before typed
//! contracts replay, registrations are idempotent, a plan the dataset cannot afford is refused
//! at registration, and a job started from another reports their composed ε.

use super::*;
use crate::datasets::BudgetSetting;
use crate::privacy::AccountantKind;
use crate::privacy::contract::{Audit, Mechanism, Mode, PrivacyContract, PrivacyUnit};

fn dataset() -> String {
    format!("sha256:{}", "ab".repeat(32))
}

fn registration(job_id: &str, sigma: f64) -> Registration {
    Registration {
        job_id: job_id.into(),
        contract: PrivacyContract {
            mechanism: Mechanism { sample_rate: 0.01, noise_multiplier: sigma, clipping_norm: 1.0 },
            accountant: AccountantKind::Rdp,
            delta: 1e-5,
            epsilon_target: Some(8.0),
            mode: Mode::Dp,
            unit: PrivacyUnit::Example,
            dataset_id: dataset(),
            audit: None,
            init_from_job: None,
        },
        gradient_dim: 100,
        insecure_noise_seed: None,
        legacy: false,
    }
}

async fn accountant(dir: &std::path::Path, allow_unbudgeted_datasets: bool) -> Accountant {
    let (store, root) = dpcap_serve::open_durable_store(&dir.to_string_lossy()).unwrap();
    let policy = Policy { allow_unbudgeted_datasets, ..Default::default() };
    let accountant = Accountant::new(Ledger::new(store, root), policy);
    accountant.replay().await.unwrap();
    accountant
}

#[tokio::test]
async fn an_audited_job_registered_before_placements_replays_with_model_coordinates() {
    let dir = tempfile::tempdir().unwrap();
    let job_dir = dir.path().join("jobs/old");
    std::fs::create_dir_all(&job_dir).unwrap();
    // As an older accountant wrote it: flat fields, canaries, no placement.
    std::fs::write(
        job_dir.join("registration.json"),
        r#"{"job_id":"old","sample_rate":0.01,"noise_multiplier":1.0,"clipping_norm":1.0,"delta":1e-5,
            "epsilon_target":8.0,"accountant":"rdp","gradient_dim":100,"parts":1,"dataset_id":"",
            "dataset_epsilon_budget":0.0,"insecure_noise_seed":null,"privacy":"dp","audit_canaries":10}"#,
    )
    .unwrap();
    let accountant = accountant(dir.path(), true).await;
    let job = accountant.job("old").unwrap();
    assert_eq!(job.audit.as_ref().unwrap().reserved(), 0, "model coordinates, as registered");
    assert_eq!(job.registration.contract.audit, Some(Audit { canaries: 10, placement: Placement::Model }));
}

#[tokio::test]
async fn a_registration_is_idempotent_and_a_different_contract_for_the_same_job_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), true).await;
    assert!(accountant.register(registration("j", 1.0), 10).await.unwrap().1);
    assert!(!accountant.register(registration("j", 1.0), 10).await.unwrap().1, "the same contract again");
    let other = accountant.register(registration("j", 0.5), 10).await.unwrap_err();
    assert!(matches!(other, AccountantError::RegistrationConflict { .. }), "{other:?}");
    // After a restart the ledger's typed contract is the same value.
    let again = super::Accountant::new(accountant.ledger.clone(), Policy::default());
    again.replay().await.unwrap();
    assert_eq!(again.job("j").unwrap().registration, registration("j", 1.0));
}

#[tokio::test]
async fn a_plan_the_datasets_remaining_budget_cannot_cover_is_refused_at_registration() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), false).await;
    let key = BudgetKey { dataset_id: dataset(), unit: "example".into() };
    let setting = BudgetSetting { epsilon: 2.0, delta: 1e-5, reason: "test".into(), allow_not_private: false };
    accountant.set_budget(&key, setting).await.unwrap();
    // σ = 1, q = 0.01 by RDP: about ε 1.2 after 200 steps, 3.7 after 2,000.
    assert!(accountant.register(registration("fits", 1.0), 200).await.is_ok());
    let refused = accountant.register(registration("too-long", 1.0), 2_000).await.unwrap_err();
    let message = refused.to_string();
    assert!(matches!(refused, AccountantError::InvalidArgument { field: "steps", .. }), "{refused:?}");
    assert!(message.contains("example-level") && message.contains("budget 2"), "{message}");
    assert!(accountant.job("too-long").is_err(), "nothing registered");
}

#[tokio::test]
async fn a_job_started_from_another_dp_job_on_its_dataset_reports_their_composed_epsilon() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), true).await;
    let (source, _) = accountant.register(registration("source", 1.0), 0).await.unwrap();
    source.progress.send_modify(|p| p.charged = 300);
    let mut child = registration("child", 1.0);
    child.contract.init_from_job = Some("source".into());
    let (child, _) = accountant.register(child, 0).await.unwrap();
    child.progress.send_modify(|p| (p.charged, p.epsilon_spent) = (100, 1.0));
    let composed = accountant.epsilon_composed(&child).await.unwrap();
    let alone = crate::privacy::epsilon(
        AccountantKind::Rdp,
        &[Segment { sample_rate: 0.01, noise_multiplier: 1.0, steps: 400 }],
        1e-5,
    )
    .unwrap();
    assert_eq!(composed, alone, "300 + 100 steps of the same mechanism");
    let mut stranger = registration("stranger", 1.0);
    stranger.contract.init_from_job = Some("nobody".into());
    let refused = accountant.register(stranger, 0).await.unwrap_err();
    assert!(matches!(refused, AccountantError::InvalidArgument { field: "init_from_job", .. }), "{refused:?}");
}
