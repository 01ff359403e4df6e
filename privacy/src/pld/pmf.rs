//! A discretised privacy loss distribution: mass on losses k·h for k in [lower, lower+len), plus
//! a mass at +∞. Every operation here keeps it pessimistic: mass is only ever moved to a
//! higher loss (or to +∞), so δ(ε) computed from it is an upper bound on the true one.

use super::fft;

/// Most runs one FFT power composes (2^24, about 1.7e7). The t-th power multiplies each
/// transformed value's rounding (~1e-16·log2 len) by t; beyond this, equivalent routes to the
/// same composition start to disagree in δ (by ~1e-4 relative in ε at 1e8 runs), and an ε
/// below the truth could not be ruled out.
pub const MAX_POWER: u64 = 1 << 24;

/// A dense PLD probability mass function on a grid of width `h` (nats).
#[derive(Debug, Clone)]
pub struct Pmf {
    h: f64,
    lower: i64,
    probs: Vec<f64>,
    infinity_mass: f64,
}

impl Pmf {
    /// Builds a PMF; negative masses (rounding noise) are clamped to zero. NaN is kept, so
    /// that [`Pmf::is_sane`] can refuse a PMF that lost its numbers rather than read it as 0.
    pub fn new(h: f64, lower: i64, mut probs: Vec<f64>, infinity_mass: f64) -> Self {
        for p in &mut probs {
            if *p <= 0.0 {
                *p = 0.0;
            }
        }
        Self { h, lower, probs, infinity_mass: infinity_mass.clamp(0.0, 1.0) }
    }

    /// True when every mass is finite and the total is at most `1 + excess`. Rounding leaves
    /// a little extra mass (pessimistic); more than `excess` means the numbers went wrong, and
    /// an ε read from them could be far below the truth.
    pub fn is_sane(&self, excess: f64) -> bool {
        let total: f64 = self.probs.iter().sum::<f64>() + self.infinity_mass;
        total.is_finite() && total <= 1.0 + excess
    }

    /// The grid width h in nats.
    pub fn discretization(&self) -> f64 {
        self.h
    }

    /// Number of grid points carried.
    pub fn len(&self) -> usize {
        self.probs.len()
    }

    /// True when no finite loss carries mass.
    pub fn is_empty(&self) -> bool {
        self.probs.is_empty()
    }

    /// Mass at +∞ (a δ that no ε can remove).
    pub fn infinity_mass(&self) -> f64 {
        self.infinity_mass
    }

    fn loss(&self, i: usize) -> f64 {
        (self.lower + i as i64) as f64 * self.h
    }

    /// The ε-hockey-stick divergence δ(ε) = p_∞ + Σ_{l > ε} p_l (1 - e^{ε - l}).
    pub fn delta_for_epsilon(&self, epsilon: f64) -> f64 {
        let tail: f64 = (0..self.probs.len())
            .rev()
            .take_while(|&i| self.loss(i) > epsilon)
            .map(|i| self.probs[i] * -(epsilon - self.loss(i)).exp_m1())
            .sum();
        (self.infinity_mass + tail).min(1.0)
    }

    /// The smallest ε ≥ 0 with δ(ε) ≤ `delta` (∞ when the +∞ mass alone exceeds δ).
    pub fn epsilon_for_delta(&self, delta: f64) -> f64 {
        if self.infinity_mass > delta {
            return f64::INFINITY;
        }
        // Walk down from the top loss keeping A = Σ_{i>j} p_i and S = Σ_{i>j} p_i e^{l_j - l_i},
        // so that δ(l_j) = p_∞ + A - S; between l_j and l_{j+1}, δ(ε) = p_∞ + A - S e^{ε - l_j}.
        let decay = (-self.h).exp();
        let (mut above, mut weighted) = (0.0_f64, 0.0_f64);
        for j in (0..self.probs.len()).rev() {
            let l = self.loss(j);
            if l < 0.0 {
                break;
            }
            let d = self.infinity_mass + above - weighted;
            if d > delta {
                let eps = l + ((self.infinity_mass + above - delta) / weighted).ln();
                return eps.max(0.0);
            }
            weighted = decay * (weighted + self.probs[j]);
            above += self.probs[j];
        }
        // δ at the lowest non-negative grid point is within budget; check ε = 0 itself.
        if self.delta_for_epsilon(0.0) <= delta {
            0.0
        } else {
            // δ crosses between 0 and the lowest non-negative grid point: solve on that piece.
            let first = self.probs.iter().enumerate().position(|(i, _)| self.loss(i) > 0.0);
            match first {
                Some(j) => {
                    let above: f64 = self.probs[j..].iter().sum();
                    let weighted: f64 =
                        self.probs[j..].iter().enumerate().map(|(k, p)| p * (-self.loss(j + k)).exp()).sum();
                    (((self.infinity_mass + above - delta) / weighted).ln()).max(0.0)
                }
                None => 0.0,
            }
        }
    }

    /// Grid points that `times` runs keep (the Chernoff window of
    /// [`Pmf::self_compose`]); None when the index range overflows.
    pub fn support_points(&self, times: u64, tail_mass: f64) -> Option<u64> {
        if times <= 1 {
            return u64::try_from(self.probs.len()).ok();
        }
        let (lo, hi) = fft::chernoff_bounds(&self.probs, times, tail_mass)?;
        u64::try_from(hi.checked_sub(lo)?).ok()?.checked_add(1)
    }

    /// The PLD of `times` independent runs of this mechanism. Mass beyond Chernoff bounds on
    /// the sum is at most `tail_mass` in all; it is charged to +∞ (pessimistic). None when the
    /// bounded support still exceeds `max_len` grid points, when its losses overflow the index
    /// range, when the FFT power returns non-finite masses, for more than [`MAX_POWER`] runs,
    /// and for 0 runs.
    pub fn self_compose(&self, times: u64, tail_mass: f64, max_len: usize) -> Option<Self> {
        if times <= 1 || times > MAX_POWER {
            return (times == 1).then(|| self.clone());
        }
        let (lo, hi) = fft::chernoff_bounds(&self.probs, times, tail_mass)?;
        if hi.checked_sub(lo)? >= i64::try_from(max_len).unwrap_or(i64::MAX) {
            return None;
        }
        let lower = self.lower.checked_mul(i64::try_from(times).ok()?)?.checked_add(lo)?;
        let probs = fft::self_convolve_window(&self.probs, times, lo, hi);
        let infinity_mass = tail_mass - (times as f64 * (-self.infinity_mass).ln_1p()).exp_m1();
        let composed = Self::new(self.h, lower, probs, infinity_mass);
        composed.probs.iter().all(|p| p.is_finite()).then_some(composed)
    }

    /// The PLD of running this mechanism and then `other` (same grid width). Tails of mass at
    /// most `tail_mass / 2` each are cut: the lower one is moved up to the lowest kept loss,
    /// the upper one to +∞.
    pub fn compose(&self, other: &Self, tail_mass: f64) -> Self {
        assert!((self.h - other.h).abs() <= 1e-12 * self.h, "composing PLDs of different grid widths");
        let full = fft::convolve(&self.probs, &other.probs);
        let infinity_mass = 1.0 - (1.0 - self.infinity_mass) * (1.0 - other.infinity_mass);
        Self::new(self.h, self.lower + other.lower, full, infinity_mass).truncated(tail_mass)
    }

    fn truncated(mut self, tail_mass: f64) -> Self {
        let half = tail_mass / 2.0;
        let (mut cut_lo, mut lo_mass) = (0usize, 0.0);
        while cut_lo + 1 < self.probs.len() && lo_mass + self.probs[cut_lo] <= half {
            lo_mass += self.probs[cut_lo];
            cut_lo += 1;
        }
        let (mut cut_hi, mut hi_mass) = (self.probs.len(), 0.0);
        while cut_hi > cut_lo + 1 && hi_mass + self.probs[cut_hi - 1] <= half {
            hi_mass += self.probs[cut_hi - 1];
            cut_hi -= 1;
        }
        self.probs.truncate(cut_hi);
        self.probs.drain(..cut_lo);
        if let Some(first) = self.probs.first_mut() {
            *first += lo_mass;
        }
        self.lower += cut_lo as i64;
        self.infinity_mass = (self.infinity_mass + hi_mass).min(1.0);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coin() -> Pmf {
        // Randomised response style: losses ±1 (h = 1) with masses 0.75 / 0.25.
        Pmf::new(1.0, -1, vec![0.25, 0.0, 0.75], 0.0)
    }

    #[test]
    fn delta_and_epsilon_are_inverse() {
        let p = coin().self_compose(5, 1e-15, usize::MAX).unwrap();
        for eps in [0.3, 1.0, 2.5] {
            let d = p.delta_for_epsilon(eps);
            let back = p.epsilon_for_delta(d);
            assert!((back - eps).abs() < 1e-9, "eps {eps} -> delta {d} -> {back}");
        }
    }

    #[test]
    fn self_compose_equals_repeated_compose() {
        let p = coin();
        let a = p.self_compose(4, 1e-15, usize::MAX).unwrap();
        let b = p.compose(&p, 0.0).compose(&p, 0.0).compose(&p, 0.0);
        for eps in [0.0, 0.5, 1.5, 3.0] {
            assert!((a.delta_for_epsilon(eps) - b.delta_for_epsilon(eps)).abs() < 1e-12);
        }
        // Exact: 4 coins, loss = 2k - 4 with k ~ Binomial(4, 0.75).
        let exact: f64 = (0..=4u32)
            .map(|k| {
                let c = [1.0, 4.0, 6.0, 4.0, 1.0][k as usize];
                let p = c * 0.75f64.powi(k as i32) * 0.25f64.powi(4 - k as i32);
                let l = 2.0 * f64::from(k) - 4.0;
                if l > 1.0 { p * (1.0 - (1.0 - l).exp()) } else { 0.0 }
            })
            .sum();
        assert!((a.delta_for_epsilon(1.0) - exact).abs() < 1e-12);
    }

    #[test]
    fn self_compose_refuses_an_index_overflow_instead_of_panicking() {
        assert!(coin().self_compose(u64::MAX, 1e-15, usize::MAX).is_none());
        assert!(coin().self_compose(0, 1e-15, usize::MAX).is_none());
        assert!(coin().self_compose(MAX_POWER + 1, 1e-15, usize::MAX).is_none());
    }

    #[test]
    fn a_pmf_that_lost_its_numbers_is_not_sane() {
        assert!(coin().is_sane(1e-12));
        assert!(!Pmf::new(1.0, 0, vec![0.5, f64::NAN], 0.0).is_sane(1e-3));
        // Mass above 1: what an overflowing δ(ε) once produced at small σ.
        assert!(!Pmf::new(1.0, 0, vec![0.5, 2.5], 0.0).is_sane(1e-3));
    }

    #[test]
    fn infinity_mass_composes_and_dominates() {
        let p = Pmf::new(1.0, 0, vec![1.0 - 1e-3], 1e-3);
        let c = p.self_compose(10, 0.0, usize::MAX).unwrap();
        assert!((c.infinity_mass() - (1.0 - 0.999f64.powi(10))).abs() < 1e-12);
        assert_eq!(c.epsilon_for_delta(1e-3), f64::INFINITY);
    }
}
