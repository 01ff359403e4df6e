//! Calibration by bisection: the smallest noise multiplier σ, or the largest number of steps,
//! that keeps ε at δ within a target. Both rely on ε being monotone (decreasing in σ,
//! increasing in steps); the answers always sit on the safe side of the target.

use super::{AccountantKind, EpsilonCurve, PrivacyError, check_delta, check_epsilon, check_sample_rate};

/// Relative precision of a calibrated σ (the returned σ is within this of the smallest one).
pub const SIGMA_RELATIVE_TOLERANCE: f64 = 1e-5;

/// Most steps a calibration will consider (2^40): beyond it the budget is effectively unbounded.
pub const STEPS_LIMIT: u64 = 1 << 40;

/// The smallest σ (to [`SIGMA_RELATIVE_TOLERANCE`]) such that `steps` steps at rate q stay within
/// `epsilon` at `delta`. The σ returned always satisfies the target.
pub fn noise_multiplier(
    kind: AccountantKind,
    q: f64,
    steps: u64,
    epsilon: f64,
    delta: f64,
) -> Result<f64, PrivacyError> {
    check_sample_rate(q)?;
    check_epsilon(epsilon)?;
    check_delta(delta)?;
    if steps == 0 {
        return Err(PrivacyError::invalid("steps", steps, "must be at least 1"));
    }
    let eps_at = |sigma: f64| -> Result<f64, PrivacyError> {
        Ok(EpsilonCurve::new(kind, q, sigma, delta)?.epsilon_after(steps))
    };
    // Bracket [lo, hi] with eps(lo) > target >= eps(hi); RDP (cheap) gives a good first guess.
    let mut hi = match kind {
        AccountantKind::Pld => noise_multiplier(AccountantKind::Rdp, q, steps, epsilon, delta).unwrap_or(1.0),
        AccountantKind::Rdp => 1.0,
    };
    while eps_at(hi)? > epsilon {
        hi *= 2.0;
        if hi > 1e6 {
            return Err(PrivacyError::Unreachable {
                what: "noise multiplier",
                epsilon,
                delta,
                reason: "needs sigma above 1e6",
            });
        }
    }
    let mut lo = hi / 2.0;
    while eps_at(lo)? <= epsilon {
        hi = lo;
        lo /= 2.0;
        if lo < 1e-6 {
            return Ok(hi);
        }
    }
    while hi - lo > SIGMA_RELATIVE_TOLERANCE * hi {
        let mid = 0.5 * (lo + hi);
        if eps_at(mid)? <= epsilon { hi = mid } else { lo = mid }
    }
    Ok(hi)
}

/// The largest number of steps whose ε at the curve's δ stays within `epsilon` (0 if even one
/// step exceeds it).
pub fn max_steps(curve: &EpsilonCurve, epsilon: f64) -> Result<u64, PrivacyError> {
    check_epsilon(epsilon)?;
    if curve.epsilon_after(1) > epsilon {
        return Ok(0);
    }
    let mut lo = 1u64; // eps(lo) <= target
    let mut hi = 2u64;
    while curve.epsilon_after(hi) <= epsilon {
        lo = hi;
        hi *= 2;
        if hi > STEPS_LIMIT {
            return Err(PrivacyError::Unreachable {
                what: "step count",
                epsilon,
                delta: f64::NAN,
                reason: "more than 2^40 steps fit in the budget",
            });
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if curve.epsilon_after(mid) <= epsilon { lo = mid } else { hi = mid }
    }
    Ok(lo)
}
