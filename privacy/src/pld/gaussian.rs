//! The privacy loss of one step of the Poisson-subsampled Gaussian, discretised by
//! "connect the dots" (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022), which is
//! pessimistic and tighter than rounding losses up.
//!
//! Normalise C = 1 and shift so that M(D') ~ N(0, σ²) and M(D) ~ (1-q)·N(0, σ²) + q·N(1, σ²),
//! where D has one more example than D'.
//! - remove (P = M(D), Q = M(D')): loss L(o) = ln(1 - q + q·e^{(2o-1)/(2σ²)}), increasing in o.
//! - add (P = M(D'), Q = M(D)): loss L(o) = -ln(1 - q + q·e^{(2o-1)/(2σ²)}), decreasing in o.

use super::super::special::{log_add, log_normal_sf, log_sub, normal_cdf, normal_isf_log, normal_sf};
use super::pmf::Pmf;

/// ln of the Gaussian tail mass left outside the grid on each side, as dp-accounting does.
const LOG_TAIL_MASS: f64 = -50.0;

/// Largest ln of the factor e^ε (or e^ε - (1-q)) that the hockey-stick divergence multiplies
/// by a Gaussian tail directly; beyond it (small σ puts the loss grid at thousands of nats,
/// where e^ε overflows to ∞ and ∞·0 to NaN) both terms are taken in log space.
const LINEAR_LIMIT: f64 = 500.0;

/// Which neighbouring relation a PLD describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjacency {
    /// The real dataset has the extra example.
    Remove,
    /// The real dataset lacks it.
    Add,
}

/// One step of the Poisson-subsampled Gaussian with rate q and noise multiplier σ.
#[derive(Debug, Clone, Copy)]
pub struct SubsampledGaussian {
    q: f64,
    sigma: f64,
    log_q: f64,
    log_1mq: f64,
}

impl SubsampledGaussian {
    /// q in (0, 1], σ > 0 (checked by the caller).
    pub fn new(q: f64, sigma: f64) -> Self {
        Self { q, sigma, log_q: q.ln(), log_1mq: (-q).ln_1p() }
    }

    /// ln(1 - q + q·e^{(2o-1)/(2σ²)}), the remove-relation loss at output o.
    fn remove_loss(&self, o: f64) -> f64 {
        log_add(self.log_1mq, self.log_q + (2.0 * o - 1.0) / (2.0 * self.sigma * self.sigma))
    }

    /// The output o* where the remove loss equals `eps` (needs e^eps > 1 - q).
    fn remove_threshold(&self, log_excess: f64) -> f64 {
        self.sigma * self.sigma * (log_excess - self.log_q) + 0.5
    }

    /// δ(ε) = sup_A P(A) - e^ε Q(A) for this relation, at one ε.
    pub fn hockey_stick(&self, adjacency: Adjacency, eps: f64) -> f64 {
        let s = self.sigma;
        match adjacency {
            Adjacency::Remove => {
                if eps <= self.log_1mq {
                    return -eps.exp_m1();
                }
                // A = {o > o*}; δ = q·Φ̄((o*-1)/σ) - (e^ε - (1-q))·Φ̄(o*/σ).
                let log_excess = log_sub(eps, self.log_1mq);
                let o = self.remove_threshold(log_excess);
                if log_excess < LINEAR_LIMIT {
                    (self.q * normal_sf((o - 1.0) / s) - log_excess.exp() * normal_sf(o / s)).max(0.0)
                } else {
                    exp_sub(self.log_q + log_normal_sf((o - 1.0) / s), log_excess + log_normal_sf(o / s))
                }
            }
            Adjacency::Add => {
                if eps >= -self.log_1mq {
                    return 0.0;
                }
                // A = {o < o*}; δ = (1 - e^ε(1-q))·Φ(o*/σ) - e^ε·q·Φ((o*-1)/σ).
                let log_excess = log_sub(-eps, self.log_1mq);
                let o = self.remove_threshold(log_excess);
                let a = -(eps + self.log_1mq).exp_m1();
                if eps < LINEAR_LIMIT {
                    (a * normal_cdf(o / s) - (eps + self.log_q).exp() * normal_cdf((o - 1.0) / s)).max(0.0)
                } else {
                    exp_sub(a.ln() + log_normal_sf(-o / s), eps + self.log_q + log_normal_sf((1.0 - o) / s))
                }
            }
        }
    }

    /// The loss range [ε_lower, ε_upper] covering outputs within the tail truncation.
    fn loss_range(&self, adjacency: Adjacency) -> (f64, f64) {
        let z = normal_isf_log(LOG_TAIL_MASS + 0.5f64.ln()) * self.sigma;
        let (lo, hi) = (self.remove_loss(-z - 1.0), self.remove_loss(z + 1.0));
        match adjacency {
            Adjacency::Remove => (lo, hi),
            Adjacency::Add => (-hi, -lo),
        }
    }

    /// Number of grid points the connect-the-dots PMF of one step needs at width `h`;
    /// `usize::MAX` when the loss range is not finite (σ so small that 1/σ² overflows).
    pub fn grid_points(&self, h: f64) -> usize {
        [Adjacency::Remove, Adjacency::Add]
            .iter()
            .map(|&a| {
                let (lo, hi) = self.loss_range(a);
                let points = (hi / h).ceil() - (lo / h).floor() + 1.0;
                if points.is_finite() && points < usize::MAX as f64 { points as usize } else { usize::MAX }
            })
            .max()
            .unwrap_or(usize::MAX)
    }

    /// The pessimistic connect-the-dots PMF of one step on the grid of width `h`.
    pub fn connect_the_dots(&self, adjacency: Adjacency, h: f64) -> Pmf {
        let (eps_lo, eps_hi) = self.loss_range(adjacency);
        let (k_lo, k_hi) = ((eps_lo / h).floor() as i64, (eps_hi / h).ceil() as i64);
        let deltas: Vec<f64> = (k_lo..=k_hi).map(|k| self.hockey_stick(adjacency, k as f64 * h)).collect();
        let n = deltas.len();
        if n == 1 {
            return Pmf::new(h, k_lo, vec![1.0 - deltas[0]], deltas[0]);
        }
        // Masses that make the discrete δ(ε) agree with the true one at every grid point and
        // interpolate it (convexly in e^ε) in between; the top δ becomes the mass at +∞.
        let em1 = h.exp_m1();
        let e = h.exp();
        let mut probs = Vec::with_capacity(n);
        probs.push((1.0 - deltas[0]) + (deltas[1] - deltas[0]) / em1);
        for i in 1..n - 1 {
            probs.push(((deltas[i + 1] - deltas[i]) - e * (deltas[i] - deltas[i - 1])) / em1);
        }
        probs.push((deltas[n - 1] - deltas[n - 2]) / (-h).exp_m1());
        Pmf::new(h, k_lo, probs, deltas[n - 1])
    }
}

/// e^a - e^b, or 0 when b ≥ a: a difference of probabilities whose logs may exceed 709.
fn exp_sub(a: f64, b: f64) -> f64 {
    if a <= b { 0.0 } else { -a.exp() * (b - a).exp_m1() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_batch_gaussian_hockey_stick_matches_closed_form() {
        // q = 1: δ(ε) = Φ(1/(2σ) - εσ) - e^ε Φ(-1/(2σ) - εσ) for both relations.
        let g = SubsampledGaussian::new(1.0, 2.0);
        for eps in [0.0, 0.1, 0.5, 1.0] {
            let want = normal_cdf(0.25 - eps * 2.0) - eps.exp() * normal_cdf(-0.25 - eps * 2.0);
            for adj in [Adjacency::Remove, Adjacency::Add] {
                let got = g.hockey_stick(adj, eps);
                assert!((got - want).abs() < 1e-12, "{adj:?} eps={eps}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn hockey_stick_stays_exact_where_e_to_the_epsilon_overflows() {
        // q = 1, σ = 0.02: the loss is N(1250, 50²) nats, far past e^709. With μ = 1/σ,
        // δ(ε) = Φ(μ/2 - ε/μ) - e^{ε + ln Φ̄(μ/2 + ε/μ)} for both relations.
        let (g, mu) = (SubsampledGaussian::new(1.0, 0.02), 50.0);
        for eps in [600.0, 1000.0, 1250.0, 1500.0] {
            let want = normal_cdf(mu / 2.0 - eps / mu) - (eps + log_normal_sf(mu / 2.0 + eps / mu)).exp();
            for adj in [Adjacency::Remove, Adjacency::Add] {
                let got = g.hockey_stick(adj, eps);
                assert!((got - want).abs() <= 1e-9 * want, "{adj:?} eps={eps}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn connect_the_dots_keeps_unit_mass_at_tiny_sigma() {
        // σ = 0.005: one inclusion is worth ~20,000 nats; the PMF must still sum to 1.
        let g = SubsampledGaussian::new(0.075, 0.005);
        for adj in [Adjacency::Remove, Adjacency::Add] {
            let pmf = g.connect_the_dots(adj, 0.4096);
            assert!(pmf.is_sane(1e-9), "{adj:?}: mass above 1");
            let mass = pmf.delta_for_epsilon(-1e6); // every loss is far above: δ is the mass
            assert!((mass - 1.0).abs() < 1e-9, "{adj:?}: mass {mass}");
        }
    }

    #[test]
    fn connect_the_dots_reproduces_delta_at_grid_points() {
        let g = SubsampledGaussian::new(0.05, 1.0);
        for adj in [Adjacency::Remove, Adjacency::Add] {
            let pmf = g.connect_the_dots(adj, 1e-3);
            for eps in [0.0, 0.02, 0.1, 0.5] {
                let exact = g.hockey_stick(adj, eps);
                let discrete = pmf.delta_for_epsilon(eps);
                assert!(discrete >= exact - 1e-12, "{adj:?} eps={eps}: not an upper bound");
                assert!((discrete - exact).abs() < 1e-9 + 1e-6 * exact, "{adj:?} eps={eps}: {discrete} vs {exact}");
            }
        }
    }
}
