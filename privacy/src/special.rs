//! Numerically careful scalar functions for the accounting math: log-space sums and the
//! Gaussian tail in log space, accurate far beyond where `erfc` underflows.

use std::f64::consts::{LN_2, PI, SQRT_2};

/// ln(e^a + e^b), exact at -inf.
pub fn log_add(a: f64, b: f64) -> f64 {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// ln(e^a - e^b) for a >= b; -inf when they are equal.
pub fn log_sub(a: f64, b: f64) -> f64 {
    debug_assert!(a >= b || a.is_nan(), "log_sub needs a >= b, got a={a} b={b}");
    if b == f64::NEG_INFINITY {
        return a;
    }
    if a <= b {
        return f64::NEG_INFINITY;
    }
    a + (-(b - a).exp()).ln_1p()
}

/// ln(erfc(x)) for any finite x, relative error ~1e-15 including x in the thousands.
pub fn log_erfc(x: f64) -> f64 {
    if x < 5.0 {
        return libm::erfc(x).ln();
    }
    // erfc(x) = exp(-x^2) * erfcx(x); erfcx by its continued fraction (Lentz), which converges
    // in a few dozen terms for x >= 5.
    -x * x + erfcx_continued_fraction(x).ln()
}

/// erfcx(x) = exp(x^2) erfc(x) for x >= 5 via
/// erfcx(x) = (1/sqrt(pi)) / (x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...))))).
fn erfcx_continued_fraction(x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for k in 1..200 {
        let a = k as f64 / 2.0;
        d = x + a * d;
        if d.abs() < TINY {
            d = TINY;
        }
        d = 1.0 / d;
        c = x + a / c;
        if c.abs() < TINY {
            c = TINY;
        }
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    1.0 / (PI.sqrt() * f)
}

/// P(Z > z) for a standard normal Z; relative accuracy holds into the far tail.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / SQRT_2)
}

/// P(Z <= z) for a standard normal Z.
pub fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z / SQRT_2)
}

/// ln P(Z > z) for a standard normal Z.
pub fn log_normal_sf(z: f64) -> f64 {
    log_erfc(z / SQRT_2) - LN_2
}

/// The z with P(Z > z) = e^log_p, for log_p well below 0 (a tail quantile), by Newton steps on
/// the log tail; used to place truncation points, so 1e-12 relative accuracy is ample.
pub fn normal_isf_log(log_p: f64) -> f64 {
    // Start from the asymptotic inverse, then refine.
    let mut z = (-2.0 * log_p).sqrt().max(1.0);
    for _ in 0..100 {
        let f = log_normal_sf(z) - log_p;
        // d/dz ln sf(z) = -pdf(z)/sf(z)
        let log_pdf = -0.5 * z * z - 0.5 * (2.0 * PI).ln();
        let slope = -(log_pdf - log_normal_sf(z)).exp();
        let step = f / slope;
        z -= step;
        if step.abs() < 1e-13 * z.abs().max(1.0) {
            break;
        }
    }
    z
}

/// ln sum_i e^{x_i} over a slice, -inf for an empty or all -inf slice.
pub fn log_sum_exp(xs: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = xs.clone().fold(f64::NEG_INFINITY, f64::max);
    if max.is_infinite() {
        return max;
    }
    max + xs.map(|x| (x - max).exp()).sum::<f64>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_erfc_matches_erfc_where_both_work_and_stays_finite_beyond() {
        for x in [-3.0, -0.5, 0.0, 0.7, 2.0, 4.9, 5.0, 5.1, 8.0, 20.0, 26.0] {
            let want = libm::erfc(x).ln();
            let got = log_erfc(x);
            assert!((got - want).abs() <= 1e-12 * want.abs().max(1.0), "x={x} {got} vs {want}");
        }
        // Asymptotic: ln erfc(x) ~ -x^2 - ln(x sqrt(pi)) for large x.
        let x = 1000.0_f64;
        let asym = -x * x - (x * PI.sqrt()).ln() + (1.0 - 0.5 / (x * x)).ln();
        assert!((log_erfc(x) - asym).abs() < 1e-9);
    }

    #[test]
    fn log_add_and_sub_are_inverse() {
        let (a, b) = (3.2_f64, 1.1_f64);
        let s = log_add(a, b);
        assert!((s - (a.exp() + b.exp()).ln()).abs() < 1e-14);
        assert!((log_sub(s, b) - a).abs() < 1e-13);
        assert_eq!(log_add(f64::NEG_INFINITY, 2.0), 2.0);
    }

    #[test]
    fn normal_tail_quantile_inverts_the_tail() {
        for log_p in [-3.0, -10.0, -50.0 - LN_2, -700.0] {
            let z = normal_isf_log(log_p);
            assert!((log_normal_sf(z) - log_p).abs() < 1e-9 * log_p.abs(), "log_p={log_p}");
        }
    }
}
