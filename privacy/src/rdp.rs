//! Rényi DP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar, Zhang 2019), exact at
//! integer and fractional orders, and its conversion to (ε, δ) (Balle et al. 2020, as Opacus ≥ 1.0
//! and Google's dp-accounting convert). Everything is computed in log space so that huge orders,
//! tiny rates and tiny noise neither overflow nor produce NaN.

use super::special::{log_add, log_erfc, log_sub};
use super::{PrivacyError, Segment};

/// Orders 1.1, 1.2, …, 10.9 and 11, 12, …, 63: the defaults of Opacus and of this product.
pub fn default_orders() -> Vec<f64> {
    let fractional = (11..110).map(|i| i as f64 / 10.0);
    let integer = (11..=63).map(f64::from);
    fractional.chain(integer).collect()
}

/// RDP ε(α) of one step of the Poisson-subsampled Gaussian with rate q and noise multiplier σ
/// (noise std σ·C on a sum of vectors clipped to L2 norm C), add/remove-one adjacency. Always an
/// upper bound of the exact value: rounding or a cut series never claims more privacy.
pub fn subsampled_gaussian_rdp(q: f64, sigma: f64, order: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if q == 1.0 {
        return order / (2.0 * sigma * sigma);
    }
    if order.is_infinite() || (0.5 / (sigma * sigma)).is_infinite() {
        return f64::INFINITY;
    }
    let log_a = if order.fract() == 0.0 {
        log_a_integer(q, sigma, order as u64)
    } else {
        log_a_fractional(q, sigma, order).min(log_a_chord(q, sigma, order))
    };
    // A few ulps up: every sum above rounds to nearest, not upward.
    let rdp = log_a * (1.0 + 1e-12) / (order - 1.0);
    // NaN (∞ - ∞ in the series at absurdly small σ) must not read as 0: that would claim privacy.
    if rdp.is_nan() { f64::INFINITY } else { rdp.max(0.0) }
}

/// ln A_α for integer α ≥ 1: ln Σ_{i=0}^{α} C(α,i) (1-q)^{α-i} q^i exp((i²-i)/(2σ²)), summed as
/// ln(1 + Σ_{i≥2} C(α,i) (1-q)^{α-i} q^i (exp((i²-i)/(2σ²)) - 1)): the binomial terms alone sum
/// to 1, so only positive excesses are added and a tiny q (A_α - 1 far below f64's resolution
/// of 1) keeps every digit instead of rounding to 0.
fn log_a_integer(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    let mut log_excess = f64::NEG_INFINITY;
    let mut log_binom = 0.0_f64; // ln C(α, i), updated incrementally
    for i in 1..=alpha {
        log_binom += ((alpha - i + 1) as f64).ln() - (i as f64).ln();
        if i < 2 {
            continue;
        }
        let fi = i as f64;
        let growth = log_expm1((fi * fi - fi) / (2.0 * sigma * sigma));
        log_excess = log_add(log_excess, log_binom + fi * log_q + (alpha - i) as f64 * log_1mq + growth);
    }
    softplus(log_excess)
}

/// ln(e^x - 1) for x > 0, without overflow for large x or cancellation for small.
fn log_expm1(x: f64) -> f64 {
    if x > 30.0 { x + (-(-x).exp()).ln_1p() } else { x.exp_m1().ln() }
}

/// ln(1 + e^x).
fn softplus(x: f64) -> f64 {
    if x > 0.0 { x + (-x).exp().ln_1p() } else { x.exp().ln_1p() }
}

/// An upper bound of ln A_α for fractional α from its integer neighbours k < α < k + 1: ln A_α
/// is convex in α (Hölder) and ln A_1 = 0, so the chord between k and k + 1 lies above it.
/// Exact where the series cannot be (q so small that A_α - 1 is below f64's resolution).
fn log_a_chord(q: f64, sigma: f64, alpha: f64) -> f64 {
    let k = alpha.floor();
    let below = if k <= 1.0 { 0.0 } else { log_a_integer(q, sigma, k as u64) };
    let above = log_a_integer(q, sigma, k as u64 + 1);
    (k + 1.0 - alpha) * below + (alpha - k) * above
}

/// Relative size of the last term at which the fractional series stops: it and the rounding
/// allowance loosen ln A_α by about this much at most.
const SERIES_STOP: f64 = 1e-8;

/// ln A_α for fractional α via the two-sided series of Mironov et al. (Sec. 3.3), as an upper
/// bound. Past i > α the terms alternate in sign and shrink (polynomially: the Gaussian tail of
/// erfc cancels the geometric growth), so the tail after the last term is at most that term's
/// size; it is added to both sums, with an allowance for the rounding of every addition (a few
/// ulps of the partial sums each). The series stops once the last term is below
/// [`SERIES_STOP`] of the sum, or after 100,000 terms (still an upper bound then).
fn log_a_fractional(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    let s2 = sigma * sigma;
    let z0 = s2 * (1.0 / q - 1.0).ln() + 0.5;
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    // |C(α, i)| in log space and its sign, from C(α, i+1) = C(α, i) (α - i) / (i + 1).
    let (mut log_abs_binom, mut positive) = (0.0_f64, true);
    let (mut last, mut terms) = (f64::NEG_INFINITY, 0u32);
    for i in 0..100_000u32 {
        let fi = f64::from(i);
        if i > 0 {
            let factor = alpha - (fi - 1.0);
            log_abs_binom += factor.abs().ln() - fi.ln();
            if factor < 0.0 {
                positive = !positive;
            }
        }
        let j = alpha - fi;
        let log_t0 = log_abs_binom + fi * log_q + j * log_1mq;
        let log_t1 = log_abs_binom + j * log_q + fi * log_1mq;
        let log_e0 = 0.5f64.ln() + log_erfc((fi - z0) / (std::f64::consts::SQRT_2 * sigma));
        let log_e1 = 0.5f64.ln() + log_erfc((z0 - j) / (std::f64::consts::SQRT_2 * sigma));
        let log_s0 = log_t0 + (fi * fi - fi) / (2.0 * s2) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * s2) + log_e1;
        if positive {
            log_a0 = log_add(log_a0, log_s0);
            log_a1 = log_add(log_a1, log_s1);
        } else {
            log_a0 = log_sub(log_a0, log_s0);
            log_a1 = log_sub(log_a1, log_s1);
        }
        let shrinking = log_s0.max(log_s1) <= last;
        (last, terms) = (log_s0.max(log_s1), i + 1);
        if fi > alpha + 1.0 && shrinking {
            let sum = log_add(log_a0, log_a1);
            if last < sum + (SERIES_STOP * sum.abs().min(1.0)).ln() || last < -700.0 {
                break;
            }
        }
    }
    // Both tails bounded by the last term; every addition's rounding, a few ulps of its sums.
    let sum = log_add(log_add(log_a0, last), log_add(log_a1, last));
    sum + 4.0 * f64::from(terms) * f64::EPSILON
}

/// An RDP curve over a fixed set of orders, composed over segments by addition.
#[derive(Debug, Clone)]
pub struct RdpCurve {
    orders: Vec<f64>,
    rdp: Vec<f64>,
}

/// ε at δ together with the RDP order that attains it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RdpEpsilon {
    /// ε at the requested δ.
    pub epsilon: f64,
    /// The order α whose bound is the smallest.
    pub order: f64,
}

impl RdpCurve {
    /// The zero curve (no steps) over `orders`; every order must be > 1.
    pub fn new(orders: Vec<f64>) -> Result<Self, PrivacyError> {
        if orders.is_empty() || orders.iter().any(|&a| a.is_nan() || a <= 1.0) {
            return Err(PrivacyError::invalid("orders", format!("{orders:?}"), "every order must be > 1"));
        }
        let rdp = vec![0.0; orders.len()];
        Ok(Self { orders, rdp })
    }

    /// A curve of composed `rdp` at `orders` (one value each, orders > 1: the caller's own).
    pub(crate) fn with_values(orders: Vec<f64>, rdp: Vec<f64>) -> Self {
        debug_assert_eq!(orders.len(), rdp.len());
        Self { orders, rdp }
    }

    /// Adds `segment.steps` steps of the subsampled Gaussian to the curve.
    pub fn compose(&mut self, segment: &Segment) {
        let steps = segment.steps as f64;
        for (order, rdp) in self.orders.iter().zip(self.rdp.iter_mut()) {
            *rdp += steps * subsampled_gaussian_rdp(segment.sample_rate, segment.noise_multiplier, *order);
        }
    }

    /// This curve composed with itself `times` times (RDP adds up linearly).
    pub fn repeated(&self, times: u64) -> Self {
        Self { orders: self.orders.clone(), rdp: self.rdp.iter().map(|r| r * times as f64).collect() }
    }

    /// The orders and the composed RDP at each.
    pub fn values(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.orders.iter().copied().zip(self.rdp.iter().copied())
    }

    /// The smallest ε at δ over all orders: ε = r + ln(1 - 1/α) - ln(δ α)/(α - 1).
    pub fn epsilon(&self, delta: f64) -> RdpEpsilon {
        let mut best = RdpEpsilon { epsilon: f64::INFINITY, order: f64::NAN };
        for (alpha, r) in self.values() {
            let eps = if delta * delta + (-r).exp_m1() > 0.0 {
                0.0
            } else if alpha > 1.01 {
                r + (-1.0 / alpha).ln_1p() - (delta * alpha).ln() / (alpha - 1.0)
            } else {
                f64::INFINITY
            };
            if eps < best.epsilon {
                best = RdpEpsilon { epsilon: eps.max(0.0), order: alpha };
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_orders_are_the_documented_grid() {
        let o = default_orders();
        assert_eq!(o.len(), 99 + 53);
        assert!((o[0] - 1.1).abs() < 1e-12 && (o[98] - 10.9).abs() < 1e-12);
        assert_eq!((o[99], *o.last().unwrap()), (11.0, 63.0));
    }

    #[test]
    fn full_batch_is_the_gaussian_closed_form() {
        assert_eq!(subsampled_gaussian_rdp(1.0, 2.0, 3.0), 3.0 / 8.0);
        assert_eq!(subsampled_gaussian_rdp(0.0, 2.0, 3.0), 0.0);
    }

    #[test]
    fn absurdly_small_noise_is_infinite_not_zero() {
        for order in [2.5, 3.0] {
            assert_eq!(subsampled_gaussian_rdp(0.3, 1e-160, order), f64::INFINITY);
        }
    }

    /// ε(α) of one step computed by quadrature of A_α = E_{z~N(0,σ²)}[((1-q) +
    /// q·e^{(2z-1)/(2σ²)})^α] (mpmath at 60 digits): (q, σ, α, RDP).
    const EXACT: [(f64, f64, f64, f64); 6] = [
        (1e-4, 0.5, 1.4, 3.6273195214922614e-07),
        (1e-16, 1.0, 1.1, 9.450550056524746e-33),
        (0.01, 2.5, 1.5, 1.3001417943760795e-05),
        (1e-16, 0.5, 1.01, 2.706706576673513e-31),
        (0.9, 0.6, 1.0001, 1.1435622011944693),
        (0.3, 1.0, 5.5, 1.3138845622427093),
    ];

    #[test]
    fn fractional_orders_are_upper_bounds_of_the_exact_value_and_tight_from_tiny_rates_to_large() {
        for (q, sigma, order, exact) in EXACT {
            let rdp = subsampled_gaussian_rdp(q, sigma, order);
            assert!(rdp >= exact, "q {q} sigma {sigma} order {order}: {rdp:e} is below the exact {exact:e}");
            // Where A_α - 1 is below f64's resolution the chord of the integer orders bounds it:
            // within 2× (C(α,2) against (α-1)·C(2,2) at q → 0), on ε's of order 1e-30.
            let slack = if q < 1e-8 { 1.0 } else { 1e-3 };
            assert!(rdp <= exact * (1.0 + slack), "q {q} sigma {sigma} order {order}: {rdp:e} is loose ({exact:e})");
        }
    }

    #[test]
    fn a_tiny_rate_never_rounds_to_zero_privacy_loss_at_any_order() {
        for q in [1e-16, 1e-12, 1e-8, 1e-4, 0.5, 1.0] {
            for order in [1.0 + 1e-9, 1.0001, 1.1, 1.5, 2.0, 2.5, 10.9, 63.0] {
                let rdp = subsampled_gaussian_rdp(q, 1.0, order);
                assert!(rdp > 0.0 && rdp.is_finite(), "q {q} order {order}: {rdp:e}");
                // Non-decreasing in α: never above the next integer order's.
                let next = subsampled_gaussian_rdp(q, 1.0, order.floor() + 1.0);
                assert!(rdp <= next * (1.0 + 1e-9), "q {q} order {order}: {rdp:e} > {next:e}");
            }
        }
    }

    #[test]
    fn fractional_series_agrees_with_neighbouring_integer_orders() {
        // RDP is continuous and non-decreasing in α: α = 3 ± tiny brackets the integer value.
        let (q, s) = (0.02, 1.1);
        let at = |a| subsampled_gaussian_rdp(q, s, a);
        let exact = at(3.0);
        assert!((at(3.0 - 1e-7) - exact).abs() < 1e-6 * exact);
        assert!((at(3.0 + 1e-7) - exact).abs() < 1e-6 * exact);
        assert!(at(2.5) < exact && exact < at(3.5));
    }
}
