//! DP-FedEmb's client update: local SGD from the global backbone on one client's examples,
//! then the client's delta u = θ_global − θ_local clipped to L2 ≤ C and added to the rank's
//! part. The sum over a step's clients goes to the accountant like any part (noise once, the
//! charge durable first); the server divides the release by the *expected* number of clients.
//!
//! The client is the privacy unit here, as the example is for the ClipEngine: whatever the
//! local steps do, one client moves the part by at most C. With one example, one step, local
//! learning rate 1 and no head, u is that example's gradient and its clipped sum is DP-SGD's.
//! This module must never send anything but the clipped delta: the local head and every
//! per-example quantity stay on the rank.

use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use dpcap_registry::FedEmb;

use crate::clip::{ClippedSum, GradSum, Objective, plain_grads};
use crate::params::ParamSet;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// Local training of one client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalConfig {
    /// SGD steps; 0: `epochs` passes over the client's examples.
    pub steps: u32,
    /// Passes over the client's examples when `steps` is 0 (at least 1).
    pub epochs: u32,
    /// Local SGD learning rate (on the mean loss of a local batch).
    pub learning_rate: f64,
    /// Examples per local step.
    pub batch: usize,
}

impl Default for LocalConfig {
    /// DP-FedEmb's local defaults ([`FedEmb::DEFAULT`]).
    fn default() -> Self {
        Self::from(&FedEmb::DEFAULT)
    }
}

impl From<&FedEmb> for LocalConfig {
    fn from(f: &FedEmb) -> Self {
        Self {
            steps: f.local_steps,
            epochs: f.local_epochs,
            learning_rate: f.local_learning_rate,
            batch: f.local_batch as usize,
        }
    }
}

/// What one client's local training produced.
#[derive(Debug, Clone)]
pub struct ClientDelta<B: burn::tensor::backend::Backend> {
    /// u = θ_global − θ_local, per parameter (before clipping).
    pub delta: GradSum<B>,
    /// Mean per-example loss of the client's first local step (non-DP telemetry).
    pub first_loss: f32,
    /// Local SGD steps taken.
    pub steps: u32,
}

/// Runs local SGD from `global` and returns the delta. `epoch_batches` is called at the start
/// of every pass with the current local weights and returns that pass's local batches (so the
/// client's head can be rebuilt from its current backbone).
pub fn local_delta<AB: AutodiffBackend, M: Objective<AB>>(
    model: &M,
    global: &ParamSet<Inner<AB>>,
    config: &LocalConfig,
    mut epoch_batches: impl FnMut(&ParamSet<Inner<AB>>) -> Vec<M::Batch>,
) -> ClientDelta<Inner<AB>> {
    let mut local = global.clone();
    let (mut steps, mut first_loss, mut epoch) = (0u32, None, 0u32);
    'passes: loop {
        let done = if config.steps > 0 { steps >= config.steps } else { epoch >= config.epochs.max(1) };
        if done {
            break;
        }
        let batches = epoch_batches(&local);
        if batches.is_empty() {
            break;
        }
        for batch in batches {
            if config.steps > 0 && steps >= config.steps {
                break 'passes;
            }
            let n = model.batch_len(&batch).max(1) as f64;
            let (grads, losses) = plain_grads(model, &local, &batch);
            first_loss.get_or_insert_with(|| losses.iter().sum::<f32>() / losses.len().max(1) as f32);
            for (id, g) in local.ids().zip(grads.grads) {
                let w = local.value(id);
                local.set(id, w - g.mul_scalar(config.learning_rate / n));
            }
            steps += 1;
        }
        epoch += 1;
    }
    let delta = GradSum { grads: global.ids().map(|id| global.value(id) - local.value(id)).collect() };
    ClientDelta { delta, first_loss: first_loss.unwrap_or(0.0), steps }
}

/// The L2 norm of a delta over every parameter.
pub fn delta_norm<B: burn::tensor::backend::Backend>(delta: &GradSum<B>) -> f64 {
    delta.grads.iter().map(|g| g.clone().powi_scalar(2).sum().into_scalar().elem::<f64>()).sum::<f64>().sqrt()
}

/// Adds clip_C(u) = u·min(1, C / (‖u‖ + 1e-6)) to `part` and records the client's loss and
/// unclipped norm as telemetry. Returns ‖u‖. A delta that is not finite (local training that
/// diverged) adds nothing: NaN survives any scaling, and zero is within C like any clipped
/// delta, whereas one NaN would void the whole release.
pub fn add_clipped<B: burn::tensor::backend::Backend>(
    part: &mut ClippedSum<B>,
    client: ClientDelta<B>,
    clipping_norm: f64,
) -> f64 {
    let norm = delta_norm(&client.delta);
    if norm.is_finite() && client.first_loss.is_finite() {
        let factor = crate::clip::clip_factor(norm, clipping_norm);
        for (id, g) in client.delta.grads.into_iter().enumerate() {
            part.sum.add(crate::params::ParamId(id), g.mul_scalar(factor));
        }
        part.telemetry.losses.push(client.first_loss);
        part.telemetry.norms.push(norm as f32);
    } else {
        part.telemetry.nonfinite += 1;
    }
    norm
}

/// Splits `n` examples into local batches of `batch` in order: [0, b), [b, 2b), ….
pub fn batch_ranges(n: usize, batch: usize) -> Vec<std::ops::Range<usize>> {
    let b = batch.max(1);
    (0..n).step_by(b).map(|s| s..(s + b).min(n)).collect()
}
