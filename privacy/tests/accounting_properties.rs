//! Properties every accountant must have: ε grows with steps and with q, falls with σ; extreme
//! parameters give finite, non-NaN answers; PLD never reports more privacy than RDP claims
//! is impossible (both are upper bounds, PLD the tighter one on these grids).

use dpcap_privacy::{AccountantKind, PrivacyError, Segment, epsilon};

const KINDS: [AccountantKind; 2] = [AccountantKind::Pld, AccountantKind::Rdp];

fn eps(kind: AccountantKind, q: f64, sigma: f64, steps: u64, delta: f64) -> f64 {
    epsilon(kind, &[Segment::new(q, sigma, steps).unwrap()], delta).unwrap()
}

#[test]
fn epsilon_is_monotone_in_steps_rate_and_noise() {
    for kind in KINDS {
        for &(q, sigma) in &[(0.01, 1.0), (0.001, 0.8), (0.1, 2.0)] {
            let delta = 1e-6;
            let by_steps: Vec<f64> = [1, 10, 100, 1000].iter().map(|&t| eps(kind, q, sigma, t, delta)).collect();
            assert!(by_steps.windows(2).all(|w| w[0] < w[1]), "{kind} steps: {by_steps:?}");
            let by_rate: Vec<f64> = [q / 4.0, q / 2.0, q].iter().map(|&r| eps(kind, r, sigma, 100, delta)).collect();
            assert!(by_rate.windows(2).all(|w| w[0] < w[1]), "{kind} rate: {by_rate:?}");
            let by_sigma: Vec<f64> =
                [sigma, sigma * 1.5, sigma * 3.0].iter().map(|&s| eps(kind, q, s, 100, delta)).collect();
            assert!(by_sigma.windows(2).all(|w| w[0] > w[1]), "{kind} sigma: {by_sigma:?}");
        }
    }
}

#[test]
fn pld_is_tighter_than_rdp() {
    for &(q, sigma, steps) in &[(0.01, 1.0, 1000), (0.05, 0.9, 300), (1.0, 5.0, 50)] {
        let (pld, rdp) =
            (eps(AccountantKind::Pld, q, sigma, steps, 1e-5), eps(AccountantKind::Rdp, q, sigma, steps, 1e-5));
        assert!(pld < rdp, "q={q} sigma={sigma}: pld {pld} rdp {rdp}");
    }
}

#[test]
fn extreme_parameters_stay_finite() {
    for kind in KINDS {
        // Huge epsilon: tiny noise, many steps.
        let huge = eps(kind, 0.5, 0.05, 100_000, 1e-7);
        assert!(huge.is_finite() && huge > 1e3, "{kind} huge: {huge}");
        // Tiny rate: epsilon is tiny but not NaN.
        let tiny = eps(kind, 1e-9, 1.0, 10, 1e-5);
        assert!(tiny.is_finite() && (0.0..1e-3).contains(&tiny), "{kind} tiny q: {tiny}");
        // Enormous noise.
        let quiet = eps(kind, 0.01, 1e4, 100, 1e-5);
        assert!(quiet.is_finite() && quiet < 1e-3, "{kind} quiet: {quiet}");
    }
}

#[test]
fn heterogeneous_segments_compose() {
    for kind in KINDS {
        let a = Segment::new(0.01, 1.0, 500).unwrap();
        let b = Segment::new(0.02, 1.5, 300).unwrap();
        let both = epsilon(kind, &[a, b], 1e-5).unwrap();
        let only_a = epsilon(kind, &[a], 1e-5).unwrap();
        let only_b = epsilon(kind, &[b], 1e-5).unwrap();
        assert!(both > only_a.max(only_b) && both < only_a + only_b, "{kind}: {both} vs {only_a} + {only_b}");
        // Splitting one mechanism into two segments changes nothing.
        let split = epsilon(kind, &[Segment { steps: 200, ..a }, Segment { steps: 300, ..a }], 1e-5).unwrap();
        assert!((split - only_a).abs() < 1e-3 * only_a, "{kind}: split {split} vs {only_a}");
    }
}

#[test]
fn bad_parameters_name_the_field() {
    let err = Segment::new(1.5, 1.0, 1).unwrap_err();
    assert!(matches!(err, PrivacyError::Invalid { field: "sample_rate", .. }), "{err}");
    assert_eq!(err.to_string(), "invalid sample_rate 1.5: must be in (0, 1]");
    let err = Segment::new(0.1, 0.0, 1).unwrap_err();
    assert!(matches!(err, PrivacyError::Invalid { field: "noise_multiplier", .. }));
    let err = epsilon(AccountantKind::Pld, &[], 1.0).unwrap_err();
    assert!(matches!(err, PrivacyError::Invalid { field: "delta", .. }));
}
