//! The core's registration rules over a real ledger directory: contracts from before typed
//! contracts replay, registrations are idempotent, a plan the dataset cannot afford is refused
//! at registration, and a job started from another reports their composed ε.

use super::*;
use crate::datasets::BudgetSetting;
use crate::privacy::AccountantKind;
use crate::privacy::contract::{Audit, Mechanism, Mode, PrivacyContract, PrivacyUnit};
use dpcap_proto::ServiceError;

fn dataset() -> String {
    format!("sha256:{}", "ab".repeat(32))
}

fn registration(job_id: &str, sigma: f64) -> Registration {
    planned(job_id, sigma, 10)
}

/// A DP job at q = 0.01 and `sigma` that plans `steps` steps.
fn planned(job_id: &str, sigma: f64, steps: u64) -> Registration {
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
            data_id: String::new(),
            shards_id: String::new(),
            audit: None,
            init_from_job: None,
            planned_steps: steps,
        },
        gradient_dim: 100,
        insecure_noise_seed: None,
        legacy: false,
    }
}

/// A budget of `epsilon` at δ = 1e-5 on a dataset of 100,000 examples.
fn setting(epsilon: f64) -> BudgetSetting {
    BudgetSetting {
        epsilon,
        delta: 1e-5,
        reason: "test".into(),
        allow_not_private: false,
        name: String::new(),
        population: 100_000,
        force: false,
        shards_id: String::new(),
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
    assert!(accountant.register(registration("j", 1.0)).await.unwrap().1);
    assert!(!accountant.register(registration("j", 1.0)).await.unwrap().1, "the same contract again");
    let other = accountant.register(registration("j", 0.5)).await.unwrap_err();
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
    accountant.set_budget(&key, setting(2.0)).await.unwrap();
    // σ = 1, q = 0.01 by RDP: about ε 1.2 after 200 steps, 3.7 after 2,000.
    assert!(accountant.register(planned("fits", 1.0, 200)).await.is_ok());
    let refused = accountant.register(planned("too-long", 1.0, 2_000)).await.unwrap_err();
    let message = refused.to_string();
    let figures = refused.budget_exhausted().expect("a budget refusal has figures");
    assert_eq!((figures.steps, figures.epsilon_budget, figures.unit.as_str()), (2_000, 2.0, "example"), "{figures:?}");
    assert!(figures.asked > 2.0 && figures.spent == 0.0 && figures.free <= 2.0, "{figures:?}");
    assert_eq!(
        refused.error_code(),
        dpcap_proto::ErrorCode::BudgetExhausted,
        "the budget is spent, not the spec wrong"
    );
    assert!(message.contains("example-level") && message.contains("budget 2"), "{message}");
    assert!(accountant.job("too-long").is_err(), "nothing registered");
}

#[tokio::test]
async fn a_job_started_from_another_dp_job_on_its_dataset_reports_their_composed_epsilon() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), true).await;
    let (source, _) = accountant.register(planned("source", 1.0, 300)).await.unwrap();
    source.progress.send_modify(|p| p.charged = 300);
    let mut child = registration("child", 1.0);
    child.contract.init_from_job = Some("source".into());
    let (child, _) = accountant.register(child).await.unwrap();
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
    let refused = accountant.register(stranger).await.unwrap_err();
    assert!(matches!(refused, AccountantError::InvalidArgument { field: "init_from_job", .. }), "{refused:?}");
}

#[tokio::test]
async fn a_contract_without_planned_steps_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), true).await;
    let refused = accountant.register(planned("none", 1.0, 0)).await.unwrap_err();
    assert!(matches!(refused, AccountantError::InvalidArgument { field: "contract.planned_steps", .. }), "{refused:?}");
}

/// What ε `steps` steps of the test mechanism spend at δ = 1e-5 (RDP).
fn rdp(steps: u64) -> f64 {
    let segment = Segment { sample_rate: 0.01, noise_multiplier: 1.0, steps };
    crate::privacy::epsilon(AccountantKind::Rdp, &[segment], 1e-5).unwrap()
}

#[tokio::test]
async fn a_dataset_budget_is_never_promised_twice_and_a_suspended_jobs_reservation_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), false).await;
    let key = BudgetKey { dataset_id: dataset(), unit: "example".into() };
    // A budget between the ε of 400 and of 600 planned steps: two plans of 200 fit, a third not.
    let budget = (rdp(400) + rdp(600)) / 2.0;
    accountant.set_budget(&key, setting(budget)).await.unwrap();
    let (first, _) = accountant.register(planned("first", 1.0, 200)).await.unwrap();
    accountant.register(planned("second", 1.0, 200)).await.unwrap();
    let refused = accountant.register(planned("third", 1.0, 200)).await.unwrap_err().to_string();
    assert!(refused.contains("0.0000 is spent") && refused.contains("reserved by other jobs"), "{refused}");
    assert!(accountant.job("third").is_err(), "nothing spent, yet both plans are promised");
    // Cancelled (suspended): it keeps what it charged (here 50 steps), and frees the rest.
    first.progress.send_modify(|p| p.charged = 50);
    accountant.suspend(&first, "cancelled", 1).await.unwrap();
    accountant.register(planned("third", 1.0, 140)).await.unwrap();
    // Resuming the first job re-admits its plan: it no longer fits beside the third's.
    let refused = accountant.fence(&first, 2, true).await.unwrap_err().to_string();
    assert!(refused.contains("reserved by other jobs"), "{refused}");
    assert!(first.suspended.load(Ordering::SeqCst), "still suspended");
    // The reservation survives a restart: the ledger holds the plans and the suspension.
    let again = super::Accountant::new(accountant.ledger.clone(), Policy::default());
    again.replay().await.unwrap();
    assert!(again.job("first").unwrap().suspended.load(Ordering::SeqCst));
    let segments = again.reserved_segments(&key, None);
    let steps: u64 = segments.iter().map(|s| s.steps).sum();
    assert_eq!(steps, 200 + 140, "the suspended job reserves nothing it has not charged (none after replay)");
}

#[tokio::test]
async fn a_fence_revokes_older_generations_a_suspension_all_of_them_and_a_resume_reopens_a_newer_one() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), true).await;
    let (job, _) = accountant.register(registration("j", 1.0)).await.unwrap();
    assert!(accountant.admit_generation(&job, 1).await.is_ok());
    accountant.fence(&job, 2, false).await.unwrap();
    assert!(accountant.admit_generation(&job, 1).await.unwrap_err().contains("generation 2"), "revoked at once");
    assert!(accountant.admit_generation(&job, 2).await.is_ok());
    accountant.suspend(&job, "cancelled", 2).await.unwrap();
    let refused = accountant.admit_generation(&job, 3).await.unwrap_err();
    assert!(refused.contains("suspended"), "{refused}");
    let stale = accountant.fence(&job, 2, true).await.unwrap_err();
    assert!(matches!(stale, AccountantError::Fenced { admitted: 3, .. }), "a stale resume: {stale:?}");
    accountant.fence(&job, 3, true).await.unwrap();
    assert!(accountant.admit_generation(&job, 3).await.is_ok(), "resumed at the new group's generation");
    // A restart remembers the fence.
    let again = super::Accountant::new(accountant.ledger.clone(), Policy::default());
    again.replay().await.unwrap();
    let job = again.job("j").unwrap();
    assert!(again.admit_generation(&job, 2).await.is_err() && again.admit_generation(&job, 3).await.is_ok());
}

#[tokio::test]
async fn a_budgets_standing_is_refused_while_the_ledger_replays_never_shown_from_part_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, root) = dpcap_serve::open_durable_store(&dir.path().to_string_lossy()).unwrap();
    let replaying = Accountant::new(Ledger::new(store, root), Policy::default());
    let key = BudgetKey { dataset_id: dataset(), unit: "example".into() };
    let refused = replaying.dataset(&key).await.unwrap_err();
    assert!(matches!(refused, AccountantError::Unavailable(_)), "{refused:?}");
}

#[tokio::test]
async fn a_ledger_budget_whose_delta_is_out_of_range_stops_the_replay_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), false).await;
    let key = BudgetKey { dataset_id: dataset(), unit: "example".into() };
    accountant.set_budget(&key, setting(2.0)).await.unwrap();
    // A δ of 1 or more would pass every check: a ledger that holds one is refused, not served.
    let mut rewritten = 0;
    let mut dirs = vec![dir.path().join("datasets")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(d).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let mut value: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                value["delta"] = serde_json::json!(1.5);
                std::fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
                rewritten += 1;
            }
        }
    }
    assert!(rewritten > 0, "the budget is in the ledger");
    let again = super::Accountant::new(accountant.ledger.clone(), Policy::default());
    let refused = again.replay().await.unwrap_err();
    assert!(
        matches!(&refused, AccountantError::CorruptBudget { path, .. } if path.starts_with("datasets/")),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("delta"), "{refused}");
}

#[tokio::test]
async fn a_closed_jobs_spend_is_replayed_as_its_close_recorded_it_unless_a_charge_came_after() {
    let dir = tempfile::tempdir().unwrap();
    let accountant = accountant(dir.path(), true).await;
    for id in ["recorded", "stale"] {
        let (job, _) = accountant.register(planned(id, 1.0, 200)).await.unwrap();
        accountant.close(&job, "succeeded").await.unwrap();
    }
    let max_steps = accountant.job("recorded").unwrap().spending.max_steps();
    // Rewrite both records: the replay reads what they say only where it covers every charge.
    let closed = |id: &str| dir.path().join(format!("jobs/{id}/closed.json"));
    let record = |charged: u64| {
        serde_json::json!({"reason": "succeeded",
        "spend": {"charged": charged, "epsilon_spent": 0.125, "max_steps": 7}})
    };
    std::fs::write(closed("recorded"), serde_json::to_vec(&record(0)).unwrap()).unwrap();
    std::fs::write(closed("stale"), serde_json::to_vec(&record(5)).unwrap()).unwrap();
    let again = super::Accountant::new(accountant.ledger.clone(), Policy::default());
    again.replay().await.unwrap();
    let recorded = again.job("recorded").unwrap();
    assert_eq!((recorded.progress().epsilon_spent, recorded.spending.max_steps()), (0.125, 7), "as recorded");
    let stale = again.job("stale").unwrap();
    assert_eq!((stale.progress().epsilon_spent, stale.spending.max_steps()), (0.0, max_steps), "computed again");
}
