//! Privacy auditing with one training run (Steinke, Nasr and Jagielski, NeurIPS 2023,
//! arXiv 2305.08846): m canaries, each included with probability 1/2; an auditor who sees the
//! run guesses "included" or "excluded" for r of them and is right v times. If the run were
//! (ε, δ)-DP, that many right guesses would be unlikely; the largest ε for which the p-value
//! of v falls below the significance level is an ε the run cannot have: a **lower bound** on
//! its true ε, at confidence 1 − significance.
//!
//! This is the one number of this crate that is a lower bound. It never certifies privacy: it
//! catches mechanisms that give less than they claim (a bound above the claimed ε is a bug).
//! Two tests: the paper's ([`epsilon_lower_bound`]) and the tighter f-DP one of Mahloujifar,
//! Melis and Chaudhuri (arXiv 2410.22235, [`epsilon_lower_bound_fdp`]), as JAX Privacy's
//! `CanaryScoreAuditor` computes them.

use crate::special::{log_normal_sf, normal_cdf};

/// What one audit observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditCounts {
    /// m: canaries, each included independently with probability 1/2.
    pub canaries: u64,
    /// r ≤ m: canaries the auditor guessed about (the others abstain).
    pub guesses: u64,
    /// v ≤ r: right guesses.
    pub correct: u64,
}

/// Guesses from canary scores (higher = more likely included): "included" for the `k_in`
/// highest, "excluded" for the `k_out` lowest, abstain on the rest. Fix k before seeing the
/// scores (a choice after looking would need a correction for multiple tests).
pub fn guess(scores: &[f64], included: &[bool], k_in: usize, k_out: usize) -> AuditCounts {
    debug_assert_eq!(scores.len(), included.len());
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let n = order.len();
    let k_in = k_in.min(n);
    let k_out = k_out.min(n - k_in);
    let right_in = order[..k_in].iter().filter(|&&i| included[i]).count();
    let right_out = order[n - k_out..].iter().filter(|&&i| !included[i]).count();
    AuditCounts {
        canaries: scores.len() as u64,
        guesses: (k_in + k_out) as u64,
        correct: (right_in + right_out) as u64,
    }
}

/// ln P[Binomial(n, p) = k] for k = 0..=n, with ln p and ln(1 − p) given.
fn binomial_log_pmf(n: u64, log_p: f64, log_1mp: f64) -> Vec<f64> {
    let ln_n_fact = libm::lgamma(n as f64 + 1.0);
    (0..=n)
        .map(|k| {
            let (k, rest) = (k as f64, (n - k) as f64);
            ln_n_fact - libm::lgamma(k + 1.0) - libm::lgamma(rest + 1.0) + k * log_p + rest * log_1mp
        })
        .collect()
}

/// ln(1 + e^x) without overflow.
fn softplus(x: f64) -> f64 {
    if x > 30.0 { x + (-x).exp().ln_1p() } else { x.exp().ln_1p() }
}

/// The p-value of `correct` right guesses under the hypothesis that the run is (ε, δ)-DP
/// (Steinke et al., Theorem 5.2 and its δ extension): β + 2mδ·α, where β = P[Bin(r, q) ≥ v]
/// with q = e^ε/(1 + e^ε), and α = max_{1≤i≤v} P[v − i ≤ Bin(r, q) < v] / i.
pub fn one_run_p_value(counts: AuditCounts, epsilon: f64, delta: f64) -> f64 {
    let AuditCounts { canaries: m, guesses: r, correct: v } = counts;
    assert!(v <= r && r <= m, "audit counts need correct <= guesses <= canaries, got {counts:?}");
    let pmf: Vec<f64> =
        binomial_log_pmf(r, -softplus(-epsilon), -softplus(epsilon)).into_iter().map(f64::exp).collect();
    // tail[k] = P[Bin >= k]
    let mut tail = vec![0.0; r as usize + 2];
    for k in (0..=r as usize).rev() {
        tail[k] = tail[k + 1] + pmf[k];
    }
    let beta = tail[v as usize].min(1.0);
    if delta == 0.0 {
        return beta;
    }
    let alpha = (1..=v as usize).map(|i| (tail[v as usize - i] - beta) / i as f64).fold(0.0, f64::max);
    (beta + alpha * delta * 2.0 * m as f64).min(1.0)
}

/// The largest ε such that `objective(ε) > 0` (the (ε, δ) claim is falsified), searched from
/// 0 upward by doubling, then bisection to 1e-9; 0 when no ε ≥ 0 is falsified.
fn largest_falsified(objective: impl Fn(f64) -> f64) -> f64 {
    if objective(0.0) <= 0.0 {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0, 1.0);
    while objective(hi) > 0.0 {
        (lo, hi) = (hi, hi * 2.0);
        if hi > 1e4 {
            return lo;
        }
    }
    while hi - lo > 1e-9 {
        let mid = 0.5 * (lo + hi);
        if objective(mid) > 0.0 { lo = mid } else { hi = mid }
    }
    lo
}

/// The one-run ε lower bound at confidence 1 − `significance` (0.05 for 95 %): the largest ε
/// whose (ε, δ) claim the counts reject. 0 when they reject none.
pub fn epsilon_lower_bound(counts: AuditCounts, significance: f64, delta: f64) -> f64 {
    if one_run_p_value(counts, 0.0, 0.0) > significance {
        return 0.0; // not even ε = 0 with δ = 0 is rejected
    }
    largest_falsified(|eps| significance - one_run_p_value(counts, eps, delta))
}

/// Φ⁻¹(x) by bisection (x in (0, 1)); ±40 at the ends.
fn normal_quantile(x: f64) -> f64 {
    if x <= 0.0 {
        return -40.0;
    }
    if x >= 1.0 {
        return 40.0;
    }
    let (mut lo, mut hi) = (-40.0f64, 40.0f64);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if normal_cdf(mid) < x { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// δ of the Gaussian mechanism with sensitivity 1 and noise σ at ε (Balle and Wang 2018):
/// Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ).
fn gaussian_delta(sigma: f64, epsilon: f64) -> f64 {
    let (a, b) = (0.5 / sigma - epsilon * sigma, -0.5 / sigma - epsilon * sigma);
    log_normal_sf(-a).exp() - (epsilon + log_normal_sf(-b)).exp()
}

/// The smallest σ whose Gaussian mechanism is (ε, δ)-DP (δ decreases in σ).
fn gaussian_sigma(epsilon: f64, delta: f64) -> f64 {
    let (mut lo, mut hi) = (1e-6, 1.0);
    while gaussian_delta(hi, epsilon) > delta {
        (lo, hi) = (hi, hi * 2.0);
        if hi > 1e12 {
            return f64::INFINITY; // δ = 0 needs infinite noise
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if gaussian_delta(mid, epsilon) > delta { lo = mid } else { hi = mid }
    }
    hi
}

/// The f-DP one-run ε lower bound (Mahloujifar et al., "audit with reconstruction cap"): the
/// counts are tested against the trade-off curve of the Gaussian mechanism that is (ε, δ)-DP,
/// which rejects more than [`epsilon_lower_bound`] at the same counts.
pub fn epsilon_lower_bound_fdp(counts: AuditCounts, significance: f64, delta: f64) -> f64 {
    let AuditCounts { canaries: m, guesses: n_guess, correct: n_correct } = counts;
    assert!(n_correct <= n_guess && n_guess <= m, "audit counts need correct <= guesses <= canaries, got {counts:?}");
    let m = m as f64;
    let objective = |eps: f64| {
        let sigma = gaussian_sigma(eps, delta);
        let blow_up_inverse = |x: f64| normal_cdf(normal_quantile(x) - 1.0 / sigma);
        let mut r = significance * n_correct as f64 / m;
        let mut h = significance * (n_guess - n_correct) as f64 / m;
        for i in (0..n_correct).rev() {
            let h_new = h.max(blow_up_inverse(r));
            if h == h_new {
                break;
            }
            r = (r + (i as f64 / (n_guess - i) as f64) * (h_new - h)).min(1.0);
            h = h_new;
        }
        r + h - n_guess as f64 / m
    };
    largest_falsified(objective)
}
