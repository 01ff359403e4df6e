//! Privacy modes in the plan: a non-private baseline (σ = 0, no ε) and a TAN simulation
//! (σ' = σ·B'/B, the target recipe's ε), each refused when its fields contradict it.

use dpcap_coordinator::check_fields;
use dpcap_coordinator::{Population, plan};
use dpcap_coordinator::{Provenance, contract};
use dpcap_privacy::contract::{Mode, PrivacyContract, Recipe};
use dpcap_proto::spec::SimulateFile;
use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::Plan;

fn base() -> SpecFile {
    SpecFile {
        dataset: "/d".into(),
        model: "micro".into(),
        batch_size: Some(100),
        steps: Some(50),
        ..Default::default()
    }
}

/// The plan and the contract a spec resolves into over 10,000 examples.
fn planned(spec: SpecFile) -> Result<(Plan, PrivacyContract), String> {
    let spec = spec.into_proto().map_err(|e| e.to_string())?;
    let checked = check_fields(&spec).map_err(|e| e.to_string())?;
    let (plan, terms) = plan(&checked, Population::of(10_000)).map_err(|e| e.to_string())?;
    let contract = contract(&checked, &terms, Provenance::default()).map_err(|e| e.to_string())?;
    Ok((plan, contract))
}

#[test]
fn a_non_private_job_adds_no_noise_and_has_no_epsilon() {
    let (plan, c) = planned(SpecFile { not_private: Some(true), ..base() }).unwrap();
    assert_eq!(c.mode, Mode::NotPrivate);
    assert_eq!(c.mechanism.noise_multiplier, 0.0);
    assert_eq!((plan.epsilon_planned, c.epsilon_target), (f64::INFINITY, None));
    assert!(dpcap_proto::plan::notice(&plan, &c).unwrap().starts_with("NOT PRIVATE"));
    let err = planned(SpecFile { not_private: Some(true), epsilon: Some(8.0), ..base() }).unwrap_err();
    assert!(err.starts_with("invalid not_private:"), "{err}");
}

#[test]
fn the_privacy_field_asks_for_each_mode_and_contradicting_spellings_are_refused_naming_the_field() {
    let asked = |name: &str, spec: SpecFile| planned(SpecFile { privacy: Some(name.into()), ..spec });
    assert_eq!(asked("not_private", base()).unwrap().1.mode, Mode::NotPrivate);
    assert_eq!(asked("dp", SpecFile { epsilon: Some(8.0), ..base() }).unwrap().1.mode, Mode::Dp);
    let simulate = Some(SimulateFile { batch_size: 2_000, noise_multiplier: Some(3.0) });
    let simulated = asked("simulation", SpecFile { simulate: simulate.clone(), ..base() }).unwrap().1.mode;
    assert_eq!(simulated, Mode::Simulation { target: Recipe { sample_rate: 0.2, noise_multiplier: 3.0 } });

    let refused = |name: &str, spec: SpecFile| asked(name, spec).unwrap_err();
    let err = refused("simulation", SpecFile { epsilon: Some(8.0), ..base() });
    assert!(err.starts_with("invalid simulate:"), "a simulation without its recipe: {err}");
    let err = refused("dp", SpecFile { simulate, epsilon: Some(8.0), ..base() });
    assert!(err.starts_with("invalid simulate:"), "a recipe on a DP job: {err}");
    let err = refused("dp", SpecFile { not_private: Some(true), epsilon: Some(8.0), ..base() });
    assert!(err.starts_with("invalid not_private:") && err.contains("privacy is dp"), "{err}");
    let err = refused("not_private", SpecFile { epsilon: Some(8.0), ..base() });
    assert!(err.starts_with("invalid privacy:"), "{err}");
    let err = refused("secret", base());
    assert!(err.contains("\"secret\" is not dp, not_private or simulation"), "{err}");

    // A value no mode has, from a client that bypasses the spec file, is refused at decode.
    let mut spec = SpecFile { epsilon: Some(8.0), ..base() }.into_proto().unwrap();
    spec.privacy = 9;
    let err = check_fields(&spec).unwrap_err().to_string();
    assert!(err.contains("privacy") && err.contains("unknown privacy mode 9"), "{err}");
}

#[test]
fn a_simulation_scales_sigma_by_the_batch_ratio_and_reports_the_targets_epsilon() {
    let simulate = Some(SimulateFile { batch_size: 2_000, noise_multiplier: Some(3.0) });
    let (plan, c) = planned(SpecFile { simulate, ..base() }).unwrap();
    assert_eq!(c.mode, Mode::Simulation { target: Recipe { sample_rate: 0.2, noise_multiplier: 3.0 } });
    assert!((c.mechanism.noise_multiplier - 3.0 * 100.0 / 2_000.0).abs() < 1e-12, "{c:?}");
    let target = dpcap_privacy::EpsilonCurve::new(dpcap_privacy::AccountantKind::Rdp, 0.2, 3.0, 1e-4).unwrap();
    assert_eq!(plan.epsilon_planned, target.epsilon_after(50), "the target's epsilon, by RDP");
    assert!(dpcap_proto::plan::notice(&plan, &c).unwrap().contains("NOT PRIVATE"));

    // Without the target's sigma, it is calibrated for the job's epsilon at the target's q.
    let simulate = Some(SimulateFile { batch_size: 2_000, noise_multiplier: None });
    let (plan, c) = planned(SpecFile { simulate, epsilon: Some(8.0), ..base() }).unwrap();
    assert!(plan.calibrated && plan.epsilon_planned <= 8.0 && plan.epsilon_planned > 7.9, "{plan:?}");
    let Mode::Simulation { target } = c.mode else { panic!("{c:?}") };
    assert!((c.mechanism.noise_multiplier * 20.0 - target.noise_multiplier).abs() < 1e-12);
}

#[test]
fn simulations_that_contradict_themselves_are_refused_naming_the_field() {
    let sim = |batch_size, noise_multiplier| Some(SimulateFile { batch_size, noise_multiplier });
    let cases = [
        ("simulate.batch_size", SpecFile { simulate: sim(50, Some(1.0)), ..base() }),
        ("simulate.batch_size", SpecFile { simulate: sim(20_000, Some(1.0)), ..base() }),
        ("simulate.batch_size", SpecFile { simulate: sim(0, Some(1.0)), ..base() }),
        ("simulate.noise_multiplier", SpecFile { simulate: sim(2_000, Some(-1.0)), ..base() }),
        ("simulate.noise_multiplier", SpecFile { simulate: sim(2_000, None), ..base() }),
        ("noise_multiplier", SpecFile { simulate: sim(2_000, Some(1.0)), noise_multiplier: Some(0.1), ..base() }),
        ("not_private", SpecFile { simulate: sim(2_000, Some(1.0)), not_private: Some(true), ..base() }),
    ];
    for (field, spec) in cases {
        let err = planned(spec).unwrap_err();
        assert!(err.starts_with(&format!("invalid {field}:")), "{field}: {err}");
    }
}

/// The dataset the test checkpoints were trained on, and another one.
const SAME: &str = "sha256:5a";
const OTHER: &str = "sha256:07";

/// A checkpoint root with one checkpoint of `model` written by a job of `privacy` on `SAME`.
fn checkpoint(dir: &std::path::Path, model: &str, privacy: &str) -> String {
    std::fs::create_dir_all(dir.join("4")).unwrap();
    std::fs::write(dir.join("latest"), "4").unwrap();
    let manifest = serde_json::json!({"job_id": "job-src", "step": 4, "ledger_position": 4, "model": model,
        "objective": "caption", "parameters": 1, "generation": 1, "created_unix_ms": 0, "privacy": privacy,
        "dataset": SAME});
    std::fs::write(dir.join("4/manifest.json"), manifest.to_string()).unwrap();
    dir.to_string_lossy().into_owned()
}

#[tokio::test]
async fn a_dp_job_starts_from_not_private_weights_only_when_told_they_saw_public_data() {
    use dpcap_coordinator::check_init as check;
    let dir = tempfile::tempdir().unwrap();
    let spec = |init_from: String, init_public: bool, not_private: bool| {
        let file = SpecFile {
            epsilon: (!not_private).then_some(8.0),
            not_private: Some(not_private),
            init_from: Some(init_from),
            init_public: Some(init_public),
            ..base()
        };
        check_fields(&file.into_proto().unwrap()).unwrap()
    };
    let baseline = checkpoint(&dir.path().join("baseline"), "micro", "not_private");
    let err = check(&spec(baseline.clone(), false, false), OTHER).await.unwrap_err().to_string();
    assert!(err.starts_with("invalid init_from:") && err.contains("init_public"), "{err}");
    let source = check(&spec(baseline.clone(), true, false), OTHER).await.unwrap().unwrap();
    assert_eq!((source.job_id.as_str(), source.step, source.privacy.name()), ("job-src", 4, "not_private"));
    let own = check(&spec(baseline.clone(), true, false), SAME).await.unwrap_err().to_string();
    assert!(own.contains("own dataset"), "never from NOT PRIVATE weights of the same data: {own}");
    assert!(
        check(&spec(baseline, false, true), OTHER).await.unwrap().is_some(),
        "a NOT PRIVATE job may start anywhere"
    );
    let private = checkpoint(&dir.path().join("dp"), "micro", "dp");
    assert!(check(&spec(private, false, false), OTHER).await.unwrap().is_some(), "DP weights start a DP job");

    let bench = checkpoint(&dir.path().join("bench"), "bench", "dp");
    let err = check(&spec(bench, false, false), OTHER).await.unwrap_err().to_string();
    assert!(err.contains("is a bench model, this job trains micro"), "{err}");
    let nowhere = dir.path().join("nowhere").to_string_lossy().into_owned();
    let err = check(&spec(nowhere, false, false), OTHER).await.unwrap_err().to_string();
    assert!(err.starts_with("invalid init_from:"), "{err}");
    assert!(!dir.path().join("nowhere").exists(), "naming a path never creates it");
    let lone = check_fields(&SpecFile { epsilon: Some(8.0), init_public: Some(true), ..base() }.into_proto().unwrap())
        .unwrap();
    assert!(check(&lone, OTHER).await.unwrap_err().to_string().starts_with("invalid init_public:"));
}

#[test]
fn audits_are_refused_naming_the_field_when_their_kind_placement_count_or_mode_is_wrong() {
    use dpcap_proto::spec::AuditFile;
    let audit = |canaries, kind: Option<&str>, coordinates: Option<&str>| {
        Some(AuditFile { canaries, kind: kind.map(Into::into), coordinates: coordinates.map(Into::into) })
    };
    let dp = || SpecFile { epsilon: Some(8.0), ..base() };
    for coordinates in [None, Some("reserved"), Some("model")] {
        let spec = SpecFile { audit: audit(1000, Some("gradient"), coordinates), ..dp() }.into_proto().unwrap();
        assert_eq!(spec.audit.as_ref().unwrap().coordinates, coordinates.unwrap_or(""));
        check_fields(&spec).unwrap();
    }
    let cases = [
        ("audit.coordinates", SpecFile { audit: audit(1000, None, Some("elsewhere")), ..dp() }),
        ("audit.kind", SpecFile { audit: audit(1000, Some("input"), None), ..dp() }),
        ("audit.canaries", SpecFile { audit: audit(0, None, None), ..dp() }),
        ("audit", SpecFile { audit: audit(1000, None, None), not_private: Some(true), ..base() }),
    ];
    for (field, spec) in cases {
        let err = planned(spec).unwrap_err();
        assert!(err.starts_with(&format!("invalid {field}:")), "{field}: {err}");
    }
}

/// A sweep submits one setting many times: its calibration is kept by exact inputs, so every
/// plan of it has the same σ, bit for bit.
#[test]
fn repeated_plans_of_one_setting_calibrate_the_same_sigma() {
    let dp = SpecFile { epsilon: Some(3.0), ..base() };
    let (first, a) = planned(dp.clone()).unwrap();
    let (second, b) = planned(dp).unwrap();
    assert!(first.calibrated && second.calibrated);
    assert_eq!(a.mechanism.noise_multiplier.to_bits(), b.mechanism.noise_multiplier.to_bits());
    assert_eq!(first.epsilon_planned.to_bits(), second.epsilon_planned.to_bits());
}
