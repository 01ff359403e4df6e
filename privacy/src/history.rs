//! Many jobs' segments as one history: what a dataset's budget composes. Composition commutes,
//! and a mechanism (q, σ) run a times and then b times is that mechanism run a + b times, so a
//! history is its steps per mechanism ([`merged`]): a sweep of a hundred jobs of one setting
//! composes as one segment, at the cost of one.
//!
//! [`RdpSteps`] keeps each mechanism's one-step RDP at the default orders, so a history's RDP
//! bound costs one multiply-add per order and mechanism, whatever the number of jobs behind it:
//! the cheap upper bound that decides every check clearly inside a budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::Segment;
use crate::rdp::{self, RdpCurve};

/// Mechanisms whose one-step RDP is kept (each 152 orders: about 1.2 kB); past this the memo
/// starts over rather than grow without bound.
const MECHANISMS_KEPT: usize = 8192;

/// `segments` with those of one mechanism merged (their steps added, saturating), those of no
/// steps dropped, in a fixed order (by q, then σ): the same history, so the same ε.
pub fn merged(segments: &[Segment]) -> Vec<Segment> {
    let mut steps: HashMap<MechanismBits, u64> = HashMap::new();
    for s in segments.iter().filter(|s| s.steps > 0) {
        let total = steps.entry(mechanism(s)).or_default();
        *total = total.saturating_add(s.steps);
    }
    let mut merged: Vec<Segment> = steps
        .into_iter()
        .map(|((q, sigma), steps)| Segment {
            sample_rate: f64::from_bits(q),
            noise_multiplier: f64::from_bits(sigma),
            steps,
        })
        .collect();
    merged.sort_by(|a, b| {
        a.sample_rate.total_cmp(&b.sample_rate).then(a.noise_multiplier.total_cmp(&b.noise_multiplier))
    });
    merged
}

/// A segment's mechanism, exactly (bit patterns: two σ that print alike are not merged).
fn mechanism(s: &Segment) -> MechanismBits {
    (s.sample_rate.to_bits(), s.noise_multiplier.to_bits())
}

/// A mechanism (q, σ) as the bit patterns of both.
type MechanismBits = (u64, u64);

/// One-step RDP per mechanism at the default orders, computed once each (see the module docs).
#[derive(Debug, Default)]
pub struct RdpSteps {
    per_step: Mutex<HashMap<MechanismBits, Arc<[f64]>>>,
}

impl RdpSteps {
    /// ε at δ of `segments` (validated by the caller) by RDP over the default orders: the same
    /// value as [`crate::epsilon`] with [`crate::AccountantKind::Rdp`], from the kept steps.
    pub fn epsilon(&self, segments: &[Segment], delta: f64) -> f64 {
        let orders = rdp::default_orders();
        let mut total = vec![0.0; orders.len()];
        for segment in merged(segments) {
            let one = self.one_step(&segment, &orders);
            let steps = segment.steps as f64;
            total.iter_mut().zip(one.iter()).for_each(|(t, r)| *t += steps * r);
        }
        RdpCurve::with_values(orders, total).epsilon(delta).epsilon
    }

    /// The mechanism's one-step RDP at `orders` (the default ones), from memory or computed now.
    fn one_step(&self, segment: &Segment, orders: &[f64]) -> Arc<[f64]> {
        let key = mechanism(segment);
        if let Some(kept) = self.per_step.lock().expect("rdp steps lock").get(&key) {
            return kept.clone();
        }
        let (q, sigma) = (segment.sample_rate, segment.noise_multiplier);
        let one: Arc<[f64]> = orders.iter().map(|&order| rdp::subsampled_gaussian_rdp(q, sigma, order)).collect();
        let mut kept = self.per_step.lock().expect("rdp steps lock");
        if kept.len() >= MECHANISMS_KEPT {
            kept.clear();
        }
        kept.insert(key, one.clone());
        one
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AccountantKind, epsilon};

    fn s(q: f64, sigma: f64, steps: u64) -> Segment {
        Segment { sample_rate: q, noise_multiplier: sigma, steps }
    }

    #[test]
    fn segments_of_one_mechanism_merge_into_one_and_others_stay_apart() {
        let history = [s(0.02, 1.0, 3), s(0.01, 1.0, 5), s(0.02, 1.0, 4), s(0.02, 1.1, 2), s(0.01, 1.0, 0)];
        assert_eq!(merged(&history), vec![s(0.01, 1.0, 5), s(0.02, 1.0, 7), s(0.02, 1.1, 2)]);
        assert_eq!(merged(&[s(0.5, 1.0, u64::MAX), s(0.5, 1.0, 2)]), vec![s(0.5, 1.0, u64::MAX)], "saturating");
        assert!(merged(&[s(0.5, 1.0, 0)]).is_empty());
    }

    #[test]
    fn the_kept_rdp_bound_is_the_rdp_accountants_value_for_any_history() {
        let steps = RdpSteps::default();
        let history: Vec<Segment> =
            (0..30).map(|i| s(0.01 * (1 + i % 3) as f64, 0.8 + 0.1 * (i % 4) as f64, 7)).collect();
        let want = epsilon(AccountantKind::Rdp, &history, 1e-6).unwrap();
        let got = steps.epsilon(&history, 1e-6);
        assert!((got - want).abs() <= 1e-9 * want, "kept {got}, computed {want}");
        assert_eq!(steps.epsilon(&history, 1e-6), got, "again, from memory");
        assert_eq!(steps.epsilon(&[], 1e-6), 0.0);
    }
}
