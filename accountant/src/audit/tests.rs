//! The canaries' statistics, and the audit run end to end on the release path's own functions
//! (`noise::draw`, `noise::apply`): a correct mechanism never audits above its claimed ε, and
//! each of three mechanism bugs that keep the printed ε does.

use super::*;
use crate::noise::{self, NoiseMode};
use crate::sum::Sum;
use dpcap_privacy::{AccountantKind, noise_multiplier};

fn secret(seed: u8) -> [u8; 32] {
    [seed; 32]
}

#[test]
fn coins_places_and_samples_are_reproducible_from_the_secret_and_fair() {
    let (m, dim, q) = (4000, 10_000, 0.1);
    let a = Canaries::new(secret(1), m, dim, q, 1.0);
    let b = Canaries::new(secret(1), m, dim, q, 1.0);
    let other = Canaries::new(secret(2), m, dim, q, 1.0);
    assert_eq!((a.included(), a.sampled(7)), (b.included(), b.sampled(7)), "a pure function of the secret");
    assert_ne!(a.included(), other.included(), "another secret, other coins");
    let included = a.included().iter().filter(|&&i| i).count() as f64;
    assert!((included / m as f64 - 0.5).abs() < 0.03, "coins: {included} of {m} included");
    let places: HashSet<usize> = a.directions.iter().map(|d| d.0).collect();
    assert_eq!(places.len(), m, "every canary has its own coordinate");
    assert!(places.iter().all(|&c| c < dim));
    // Poisson sampling at q, independent across steps: mean q·m per step, and the chance that
    // a canary is in two given steps is q².
    let steps: Vec<HashSet<usize>> = (0..50).map(|t| a.sampled(t).into_iter().collect()).collect();
    let mean = steps.iter().map(HashSet::len).sum::<usize>() as f64 / 50.0;
    assert!((mean - q * m as f64).abs() < 0.05 * q * m as f64, "mean per step {mean}");
    let both = steps.windows(2).map(|w| w[0].intersection(&w[1]).count()).sum::<usize>() as f64 / 49.0;
    assert!((both - q * q * m as f64).abs() < 0.3 * q * q * m as f64, "in two steps {both}");
}

/// Faults a broken mechanism could have while printing the same ε.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Noise drawn with σ·C/2.
    HalfNoise,
    /// Noise meant to be shared by W = 8 parts (σ·C/√W each), only one part's share added.
    OnePartOfW,
    /// The canaries' gradients not clipped (norm 10·C).
    Unclipped,
}

/// One audited job: `steps` releases of a model with `dim` coordinates whose examples sum to
/// zero, σ calibrated for (ε, δ), canaries injected and scored as the accountant does.
fn audit_run(fault: Fault, seed: u8, epsilon: f64) -> AuditOutcome {
    // Detecting a fault in one run needs many canaries: 100,000 on 200,000 coordinates, q and
    // T small enough that amplification by subsampling is in play. Guesses on the top and
    // bottom 1 %. Measured (seeds 0-3, 5-7, 9): correct 0.49-0.57, halved noise 1.10-1.24,
    // one part of W 1.55, unclipped 2.98.
    let (m, dim, q, steps, delta, clip) = (100_000, 200_000, 0.25, 10, 1e-5, 1.0);
    let sigma = noise_multiplier(AccountantKind::Pld, q, steps, epsilon, delta).unwrap();
    let canaries = Canaries::new(secret(seed), m, dim, q, clip);
    let mut scores = vec![0.0; m];
    let examples = Sum::Many(vec![0.0; dim]);
    for step in 0..steps {
        let std = match fault {
            Fault::HalfNoise => sigma * clip / 2.0,
            Fault::OnePartOfW => sigma * clip / 8f64.sqrt(),
            Fault::None | Fault::Unclipped => sigma * clip,
        };
        let mut noise = noise::draw(dim, std, NoiseMode::Seeded(seed as u64), step).unwrap();
        canaries.inject(step, &mut noise, if fault == Fault::Unclipped { 10.0 } else { 1.0 });
        canaries.score(&canaries.readings(&noise::apply(&examples, &noise)), &mut scores);
    }
    canaries.conclude(&scores, delta, canaries.default_guesses())
}

#[test]
fn a_correct_mechanism_never_audits_above_its_claimed_epsilon() {
    for seed in 0..4 {
        let outcome = audit_run(Fault::None, seed, 1.0);
        assert!(outcome.bound() <= 1.0, "seed {seed}: {outcome:?}");
    }
}

#[test]
fn halved_noise_one_part_of_w_and_unclipped_canaries_audit_above_the_claimed_epsilon() {
    for fault in [Fault::HalfNoise, Fault::OnePartOfW, Fault::Unclipped] {
        let outcome = audit_run(fault, 7, 1.0);
        assert!(outcome.bound() > 1.0, "{fault:?} went unnoticed: {outcome:?}");
    }
}

#[test]
fn a_weak_guarantee_audits_far_higher_than_a_strong_one() {
    // ε = 50: little noise, and the top and bottom 1 % are nearly all right (1,947 of 2,000:
    // 3.19). What stays wrong are included canaries that no step sampled (0.75^10 = 5.6 %):
    // nothing in the run tells them apart, which is the guarantee subsampling gives.
    let outcome = audit_run(Fault::None, 3, 50.0);
    assert!(outcome.counts.correct as f64 > 0.95 * outcome.counts.guesses as f64, "{outcome:?}");
    assert!(outcome.bound() > 3.0, "{outcome:?}");
}
