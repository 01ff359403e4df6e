//! A job's privacy mode, resolved from its spec into the plan's σ and ε: DP (σ calibrated from
//! ε or fixed), a non-private baseline (σ = 0), or a TAN simulation (Sander et al. 2023) of a
//! target recipe (batch B, σ) at the job's own expected batch B' with σ' = σ·B'/B, which keeps
//! the noise per example σ·C/B of the target. The last two carry no guarantee: [`label`] is
//! what every surface shows for them.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use dpcap_privacy::contract::{Mode, PrivacyContract, Recipe};
use dpcap_privacy::{self as privacy, AccountantKind};
use dpcap_proto::v1::{JobSpec, Plan};

use crate::error::CoordinatorError;

/// What a mode contributes to the contract and the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// DP, NOT PRIVATE, or a simulation of its target recipe.
    pub mode: Mode,
    /// σ the job adds (σ' for a simulation, 0 for a baseline).
    pub noise_multiplier: f64,
    /// Whether σ (the target's, for a simulation) was calibrated from ε.
    pub calibrated: bool,
    /// ε at δ after the planned steps: the job's, or the target recipe's; +∞ for a baseline.
    pub epsilon_planned: f64,
    /// The ε the accountant enforces: the spec's, else the planned; None for a baseline.
    pub epsilon_target: Option<f64>,
}

/// The label of a mode where people read it: "" for DP, else "NOT PRIVATE (...)".
pub fn label(mode: &Mode) -> &'static str {
    match mode {
        Mode::NotPrivate => "NOT PRIVATE (non-private baseline, sigma = 0)",
        Mode::Simulation { .. } => "NOT PRIVATE (TAN simulation)",
        Mode::Dp => "",
    }
}

/// The condition message of a plan without a guarantee (None for DP).
pub fn notice(plan: &Plan, contract: &PrivacyContract) -> Option<String> {
    match contract.mode {
        Mode::NotPrivate => Some(format!("{}: sigma = 0, no epsilon", label(&contract.mode))),
        Mode::Simulation { target } => Some(format!(
            "{}: target batch {:.0} at sigma {:.4} simulated at batch {:.1} with sigma' = {:.6}; \
             epsilon {:.4} is the target recipe's (RDP), not this job's",
            label(&contract.mode),
            target.sample_rate * dpcap_proto::plan::units(plan) as f64,
            target.noise_multiplier,
            dpcap_proto::plan::expected_batch_size(plan, contract),
            contract.mechanism.noise_multiplier,
            plan.epsilon_planned
        )),
        Mode::Dp => None,
    }
}

/// Whether the spec asks for a DP job (neither a baseline nor a simulation), before its
/// fields are resolved into a [`Mode`].
pub fn requested_is_private(spec: &JobSpec) -> bool {
    !spec.not_private && spec.simulate.is_none()
}

/// Checks the privacy fields against each other (before the dataset is read).
pub fn check(spec: &JobSpec) -> Result<(), CoordinatorError> {
    fn invalid(field: &'static str, reason: impl Into<String>) -> CoordinatorError {
        CoordinatorError::invalid(field, reason)
    }
    if spec.not_private {
        if spec.epsilon.is_some() || spec.noise_multiplier.is_some() || spec.simulate.is_some() {
            return Err(invalid("not_private", "a non-private job has no epsilon, noise_multiplier or simulate"));
        }
        return Ok(());
    }
    if let Some(simulate) = &spec.simulate {
        if spec.noise_multiplier.is_some() {
            return Err(invalid(
                "noise_multiplier",
                "a simulation derives sigma' from simulate; set simulate.noise_multiplier",
            ));
        }
        if simulate.batch_size == 0 {
            return Err(invalid("simulate.batch_size", "0 must be at least 1"));
        }
        match simulate.noise_multiplier {
            Some(s) if !(s > 0.0 && s.is_finite()) => {
                return Err(invalid("simulate.noise_multiplier", format!("{s} must be a finite number > 0")));
            }
            None if spec.epsilon.is_none() => {
                return Err(invalid("simulate.noise_multiplier", "give it, or a target epsilon to calibrate it"));
            }
            _ => {}
        }
        return Ok(());
    }
    if spec.epsilon.is_none() && spec.noise_multiplier.is_none() {
        return Err(invalid("epsilon", "give a target epsilon, a fixed noise_multiplier, or both"));
    }
    Ok(())
}

/// Resolves σ and ε for a job at rate `q` over `steps` at `delta` on `examples` examples.
pub fn resolve(
    spec: &JobSpec,
    kind: AccountantKind,
    (q, steps, delta): (f64, u64, f64),
    examples: u64,
) -> Result<Resolved, CoordinatorError> {
    let invalid = |field: &'static str| move |e: privacy::PrivacyError| CoordinatorError::invalid(field, e.to_string());
    if spec.not_private {
        return Ok(Resolved {
            mode: Mode::NotPrivate,
            noise_multiplier: 0.0,
            calibrated: false,
            epsilon_planned: f64::INFINITY,
            epsilon_target: None,
        });
    }
    let Some(simulate) = &spec.simulate else {
        let (sigma, calibrated) = sigma_for(spec.noise_multiplier, spec.epsilon, (kind, q, steps, delta))?;
        let epsilon_planned = kept([0, kind as u64, q.to_bits(), steps, sigma.to_bits(), delta.to_bits()], || {
            Ok(privacy::EpsilonCurve::new(kind, q, sigma, delta)?.epsilon_after(steps))
        })
        .map_err(invalid("noise_multiplier"))?;
        return Ok(Resolved {
            mode: Mode::Dp,
            noise_multiplier: sigma,
            calibrated,
            epsilon_planned,
            epsilon_target: Some(spec.epsilon.unwrap_or(epsilon_planned)),
        });
    };
    let target_batch = simulate.batch_size as f64;
    let expected = q * examples as f64;
    if simulate.batch_size > examples {
        return Err(CoordinatorError::invalid(
            "simulate.batch_size",
            format!("{} exceeds the dataset's {examples} examples", simulate.batch_size),
        ));
    }
    if expected > target_batch {
        return Err(CoordinatorError::invalid(
            "simulate.batch_size",
            format!("{target_batch} is below the job's own expected batch {expected:.1}: nothing to simulate"),
        ));
    }
    // The target's ε is informational (the job has no guarantee): RDP keeps it cheap whatever σ.
    let target_q = target_batch / examples as f64;
    let (sigma, calibrated) =
        sigma_for(simulate.noise_multiplier, spec.epsilon, (AccountantKind::Rdp, target_q, steps, delta))?;
    let curve = privacy::EpsilonCurve::new(AccountantKind::Rdp, target_q, sigma, delta)
        .map_err(invalid("simulate.noise_multiplier"))?;
    let epsilon_planned = curve.epsilon_after(steps);
    Ok(Resolved {
        mode: Mode::Simulation { target: Recipe { sample_rate: target_q, noise_multiplier: sigma } },
        noise_multiplier: sigma * expected / target_batch,
        calibrated,
        epsilon_planned,
        epsilon_target: Some(spec.epsilon.unwrap_or(epsilon_planned)),
    })
}

/// Values kept before the memo starts over.
const KEPT: usize = 4096;

/// A calibration's σ or a plan's ε remembered by its exact inputs (`key`: what it is, then the
/// bit patterns of every input): a sweep submits one setting many times, and a PLD calibration
/// is a search over many compositions (about 1 s at a low σ).
fn kept(
    key: [u64; 6],
    compute: impl FnOnce() -> Result<f64, privacy::PrivacyError>,
) -> Result<f64, privacy::PrivacyError> {
    static VALUES: LazyLock<Mutex<HashMap<[u64; 6], f64>>> = LazyLock::new(Mutex::default);
    if let Some(&value) = VALUES.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(value);
    }
    let value = compute()?;
    let mut values = VALUES.lock().unwrap_or_else(|p| p.into_inner());
    if values.len() >= KEPT {
        values.clear();
    }
    values.insert(key, value);
    Ok(value)
}

/// σ fixed, or calibrated for `epsilon` at (q, steps, δ).
fn sigma_for(
    fixed: Option<f64>,
    epsilon: Option<f64>,
    (kind, q, steps, delta): (AccountantKind, f64, u64, f64),
) -> Result<(f64, bool), CoordinatorError> {
    match (fixed, epsilon) {
        (Some(sigma), _) => Ok((sigma, false)),
        (None, Some(eps)) => kept([1, kind as u64, q.to_bits(), steps, eps.to_bits(), delta.to_bits()], || {
            privacy::noise_multiplier(kind, q, steps, eps, delta)
        })
        .map(|sigma| (sigma, true))
        .map_err(|e| CoordinatorError::invalid("epsilon", e.to_string())),
        (None, None) => Err(CoordinatorError::invalid("epsilon", "give a target epsilon or a noise_multiplier")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibration_is_computed_once_per_exact_inputs_and_a_failure_is_not_kept() {
        let key = [9, 9, 0.25f64.to_bits(), 3, 2.0f64.to_bits(), 1e-5f64.to_bits()];
        let mut computed = 0;
        for _ in 0..3 {
            let value = kept(key, || {
                computed += 1;
                Ok(0.5)
            });
            assert_eq!(value, Ok(0.5));
        }
        assert_eq!(computed, 1, "remembered");
        let other = [9, 9, 0.25f64.to_bits(), 4, 2.0f64.to_bits(), 1e-5f64.to_bits()];
        let failed =
            kept(other, || Err(privacy::PrivacyError::Invalid { field: "steps", value: "4".into(), reason: "test" }));
        assert!(failed.is_err());
        assert_eq!(kept(other, || Ok(0.75)), Ok(0.75), "a failure is computed again");
    }
}
