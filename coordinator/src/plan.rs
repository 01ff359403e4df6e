//! A checked spec resolved over its population into the plan the operator sees and the privacy
//! terms of its contract, in this one place: q (from the rate or the batch), the steps (from the
//! steps or the epochs), δ (defaulting to 1/N), and the mode's σ and ε: DP (σ calibrated from ε
//! or fixed), a non-private baseline (σ = 0), or a TAN simulation (Sander et al. 2023) of a
//! target recipe (batch B, σ) at the job's own expected batch B' with σ' = σ·B'/B, which keeps
//! the noise per example σ·C/B of the target. Calibration runs here, remembered by its exact
//! inputs.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use dpcap_privacy::contract::{Mode, Recipe};
use dpcap_privacy::{self as privacy, AccountantKind};
use dpcap_proto::v1::Plan;

use crate::error::CoordinatorError;
use crate::spec::{Checked, Length, ModeRequest, Rate};

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

/// The privacy terms a spec resolves into: they become the job's contract, never the plan's.
#[derive(Debug, Clone, PartialEq)]
pub struct Terms {
    /// Poisson rate q.
    pub sample_rate: f64,
    /// Planned steps.
    pub steps: u64,
    /// δ at which ε is stated.
    pub delta: f64,
    /// The accountant.
    pub kind: AccountantKind,
    /// Per-unit L2 clipping norm C.
    pub clipping_norm: f64,
    /// The mode, σ and ε.
    pub resolved: Resolved,
}

/// What a plan is resolved over: the accounting N (examples, or a user-level job's clients)
/// and δ's default (1/N, or 1/N_users for a user-level job).
#[derive(Debug, Clone, Copy)]
pub struct Population {
    /// N.
    pub units: u64,
    /// δ when the spec gives none: 1/N of the privacy unit, and the largest δ a DP job may take.
    pub default_delta: f64,
}

impl Population {
    /// N units, δ defaulting to 1/N.
    pub fn of(units: u64) -> Self {
        Self { units, default_delta: 1.0 / units.max(1) as f64 }
    }
}

/// Resolves a checked spec over its population into the plan the operator sees before
/// training and the privacy terms of its contract: calibration runs here (σ for the target ε at
/// δ over all steps).
pub fn plan(checked: &Checked, population: Population) -> Result<(Plan, Terms), CoordinatorError> {
    let (spec, examples) = (&checked.spec, population.units);
    if examples == 0 {
        return Err(CoordinatorError::invalid("dataset", "the dataset index has 0 examples"));
    }
    let sample_rate = match checked.rate {
        Rate::SampleRate(q) => q,
        Rate::BatchSize(b) if b > examples => {
            return Err(CoordinatorError::invalid(
                "batch_size",
                format!("{b} exceeds the dataset's {examples} examples"),
            ));
        }
        Rate::BatchSize(b) => b as f64 / examples as f64,
    };
    let steps = match checked.length {
        Length::Steps(s) => s,
        Length::Epochs(e) => (e / sample_rate).ceil().max(1.0) as u64,
    };
    let delta = spec.delta.unwrap_or(population.default_delta);
    if delta >= 1.0 {
        return Err(CoordinatorError::invalid("delta", format!("default 1/N = {delta} is not < 1; set delta")));
    }
    check_delta(&checked.mode, delta, population)?;
    let resolved = resolve(&checked.mode, checked.kind, (sample_rate, steps, delta), examples)?;
    let warmup_steps = spec.warmup_steps.unwrap_or(steps / 20);
    if warmup_steps > steps {
        return Err(CoordinatorError::invalid("warmup_steps", format!("{warmup_steps} exceeds the {steps} steps")));
    }
    let plan = Plan {
        examples,
        // AdamW's 1e-3, or a user-level job's server optimizer's own (FedAvg's SGD applies
        // the average client delta as it is, at 1).
        learning_rate: spec.learning_rate.unwrap_or(checked.fedemb.map_or(1e-3, |f| f.server_learning_rate())),
        warmup_steps,
        micro_batch: spec.micro_batch.unwrap_or(64),
        workers: spec.workers.unwrap_or(1),
        checkpoint_interval: spec.checkpoint_interval.unwrap_or(50),
        calibrated: resolved.calibrated,
        epsilon_planned: resolved.epsilon_planned,
        // Set by the caller: the user table's counts, the init source it checked, the
        // registry's P, the pinned tokenizer and the contract.
        ..Plan::default()
    };
    let clipping_norm = spec.clipping_norm.unwrap_or(1.0);
    Ok((plan, Terms { sample_rate, steps, delta, kind: checked.kind, clipping_norm, resolved }))
}

/// Holds a DP job's δ to at most 1/N of its privacy unit (examples, or users): a mechanism may
/// publish someone's data outright with probability δ, so a larger δ allows one that publishes
/// somebody's. A baseline and a simulation make no claim at δ about this dataset.
fn check_delta(mode: &ModeRequest, delta: f64, population: Population) -> Result<(), CoordinatorError> {
    let largest = population.default_delta;
    if !matches!(mode, ModeRequest::Dp { .. }) || delta <= largest {
        return Ok(());
    }
    Err(CoordinatorError::invalid(
        "delta",
        format!(
            "{delta:e} is above 1/N = {largest:e} for N = {:.0} of the job's privacy unit: a mechanism may publish \
             someone's data outright with probability delta; the largest delta allowed is {largest:e} (leave delta \
             out for 1/N, or take less: 1/(N log N) is common)",
            1.0 / largest
        ),
    ))
}

/// Resolves σ and ε for a job at rate `q` over `steps` at `delta` on `examples` examples.
fn resolve(
    mode: &ModeRequest,
    kind: AccountantKind,
    (q, steps, delta): (f64, u64, f64),
    examples: u64,
) -> Result<Resolved, CoordinatorError> {
    let invalid =
        |field: &'static str| move |source: privacy::PrivacyError| CoordinatorError::Privacy { field, source };
    let (batch_size, noise_multiplier, epsilon) = match *mode {
        ModeRequest::NotPrivate => {
            return Ok(Resolved {
                mode: Mode::NotPrivate,
                noise_multiplier: 0.0,
                calibrated: false,
                epsilon_planned: f64::INFINITY,
                epsilon_target: None,
            });
        }
        ModeRequest::Dp { epsilon, noise_multiplier } => {
            let (sigma, calibrated) = sigma_for(noise_multiplier, epsilon, (kind, q, steps, delta))?;
            let epsilon_planned = kept([0, kind as u64, q.to_bits(), steps, sigma.to_bits(), delta.to_bits()], || {
                Ok(privacy::EpsilonCurve::new(kind, q, sigma, delta)?.epsilon_after(steps))
            })
            .map_err(invalid("noise_multiplier"))?;
            return Ok(Resolved {
                mode: Mode::Dp,
                noise_multiplier: sigma,
                calibrated,
                epsilon_planned,
                epsilon_target: Some(epsilon.unwrap_or(epsilon_planned)),
            });
        }
        ModeRequest::Simulate { batch_size, noise_multiplier, epsilon } => (batch_size, noise_multiplier, epsilon),
    };
    let target_batch = batch_size as f64;
    let expected = q * examples as f64;
    if batch_size > examples {
        return Err(CoordinatorError::invalid(
            "simulate.batch_size",
            format!("{batch_size} exceeds the dataset's {examples} examples"),
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
    let (sigma, calibrated) = sigma_for(noise_multiplier, epsilon, (AccountantKind::Rdp, target_q, steps, delta))?;
    let curve = privacy::EpsilonCurve::new(AccountantKind::Rdp, target_q, sigma, delta)
        .map_err(invalid("simulate.noise_multiplier"))?;
    let epsilon_planned = curve.epsilon_after(steps);
    Ok(Resolved {
        mode: Mode::Simulation { target: Recipe { sample_rate: target_q, noise_multiplier: sigma } },
        noise_multiplier: sigma * expected / target_batch,
        calibrated,
        epsilon_planned,
        epsilon_target: Some(epsilon.unwrap_or(epsilon_planned)),
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
        .map_err(|source| CoordinatorError::Privacy { field: "epsilon", source }),
        (None, None) => Err(CoordinatorError::invalid("epsilon", "give a target epsilon or a noise_multiplier")),
    }
}
