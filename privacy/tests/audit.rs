//! The one-run audit's ε lower bounds against JAX Privacy's `CanaryScoreAuditor` on the same
//! counts (`reference/audit_vectors.py` made the fixture), and the bound's behaviour: no
//! bound from guesses at chance, a larger bound from more right guesses.

use dpcap_privacy::audit::{AuditCounts, epsilon_lower_bound, epsilon_lower_bound_fdp, guess, one_run_p_value};

fn cases() -> Vec<serde_json::Value> {
    let fixture: serde_json::Value = serde_json::from_str(include_str!("data/audit_vectors.json")).unwrap();
    fixture["cases"].as_array().unwrap().clone()
}

fn counts(case: &serde_json::Value) -> AuditCounts {
    let n = |k: &str| case[k].as_u64().unwrap();
    AuditCounts { canaries: n("canaries"), guesses: n("guesses"), correct: n("correct") }
}

#[test]
fn the_p_values_and_bounds_match_jax_privacy_on_the_same_counts() {
    for case in cases() {
        let (c, significance, delta) =
            (counts(&case), case["significance"].as_f64().unwrap(), case["delta"].as_f64().unwrap());
        let p = one_run_p_value(c, 1.0, delta);
        let p_ref = case["p_value_at_eps_1"].as_f64().unwrap();
        assert!((p - p_ref).abs() <= 1e-9 * p_ref.max(1e-300) + 1e-15, "{c:?}: p-value {p} vs {p_ref}");
        let eps = epsilon_lower_bound(c, significance, delta);
        let eps_ref = case["epsilon_lower_bound"].as_f64().unwrap();
        assert!((eps - eps_ref).abs() < 1e-5, "{c:?}: bound {eps} vs JAX Privacy {eps_ref}");
        if let Some(fdp_ref) = case["epsilon_lower_bound_fdp"].as_f64() {
            let fdp = epsilon_lower_bound_fdp(c, significance, delta);
            assert!((fdp - fdp_ref).abs() < 1e-4, "{c:?}: f-DP bound {fdp} vs JAX Privacy {fdp_ref}");
        }
    }
}

#[test]
fn guesses_at_chance_give_no_bound_and_more_right_guesses_give_a_larger_one() {
    let at = |correct| epsilon_lower_bound(AuditCounts { canaries: 1000, guesses: 200, correct }, 0.05, 1e-5);
    assert_eq!(at(100), 0.0, "half right is what a coin gets");
    let bounds: Vec<f64> = [120, 140, 160, 180, 200].into_iter().map(at).collect();
    assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
}

#[test]
fn guesses_take_the_top_as_included_and_the_bottom_as_excluded() {
    let scores = [5.0, -1.0, 3.0, 0.0, -4.0, 2.0];
    let included = [true, false, false, true, false, true];
    // top 2: scores 5 (in) and 3 (out); bottom 2: -4 (out) and -1 (out)
    assert_eq!(guess(&scores, &included, 2, 2), AuditCounts { canaries: 6, guesses: 4, correct: 3 });
    // asking for more than there are abstains on nothing and never double-counts
    assert_eq!(guess(&scores, &included, 5, 5).guesses, 6);
}
