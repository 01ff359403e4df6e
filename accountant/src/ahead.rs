//! The next step's noise, drawn while the current step computes. Noise does not depend on the
//! gradient, and the attack-resistant sampler (four Box–Muller draws per coordinate) is far
//! slower than the network: drawn when the last part arrives, it would dominate the release.
//! Drawn ahead, the release is one memory-bound pass.
//!
//! The rules that keep this safe: noise drawn for step t is only ever used for step t, only
//! after t's durable charge (the caller's release procedure), and at most once ([`take`]
//! moves it out). A discarded or refused step drops its noise; a restart loses it and the
//! step draws fresh noise when its parts arrive. Seeded test noise is keyed by (seed, step),
//! so drawing ahead never changes a seeded release.
//!
//! [`take`]: NoiseAhead::take

use std::sync::Mutex;

use tokio::task::JoinHandle;

use crate::error::AccountantError;
use crate::noise::{self, NoiseMode};

type Drawing = JoinHandle<Result<Vec<f64>, getrandom::Error>>;

/// One job's noise source: `dim` coordinates of N(0, std²) per step.
#[derive(Debug)]
pub struct NoiseAhead {
    dim: usize,
    std: f64,
    mode: NoiseMode,
    /// Draw ahead at all (off: 8·P bytes less per open job, slower releases).
    enabled: bool,
    next: Mutex<Option<(u64, Drawing)>>,
}

impl NoiseAhead {
    /// A source for a job of dimension `dim` with noise std `std` = σ·C.
    pub fn new(dim: usize, std: f64, mode: NoiseMode, enabled: bool) -> Self {
        Self { dim, std, mode, enabled, next: Mutex::new(None) }
    }

    /// Starts drawing `step`'s noise in the background (replacing any other step's). Must be
    /// called from a tokio runtime.
    pub fn prepare(&self, step: u64) {
        if !self.enabled {
            return;
        }
        let (dim, std, mode) = (self.dim, self.std, self.mode);
        if std == 0.0 {
            return; // a NOT PRIVATE baseline: nothing to draw
        }
        let task = tokio::task::spawn_blocking(move || noise::draw(dim, std, mode, step));
        *self.next.lock().expect("noise lock") = Some((step, task));
    }

    /// Drops any noise drawn ahead (a refused, closed or exhausted job will not use it).
    pub fn clear(&self) {
        self.next.lock().expect("noise lock").take();
    }

    /// Step `step`'s noise: the one drawn ahead if it was for this step, else drawn now. The
    /// caller must have durably charged `step`.
    pub async fn take(&self, step: u64) -> Result<Vec<f64>, AccountantError> {
        let ready = self.next.lock().expect("noise lock").take();
        let task = match ready {
            Some((drawn_for, task)) if drawn_for == step => task,
            _ if self.std == 0.0 => return Ok(vec![0.0; self.dim]),
            _ => {
                let (dim, std, mode) = (self.dim, self.std, self.mode);
                tokio::task::spawn_blocking(move || noise::draw(dim, std, mode, step))
            }
        };
        task.await
            .map_err(|e| AccountantError::Internal(format!("noise task failed: {e}")))?
            .map_err(|e| AccountantError::Internal(format!("os entropy unavailable: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn seeded_noise_drawn_ahead_equals_noise_drawn_on_demand() {
        let ahead = NoiseAhead::new(1000, 2.0, NoiseMode::Seeded(9), true);
        ahead.prepare(5);
        let drawn_ahead = ahead.take(5).await.unwrap();
        let on_demand = NoiseAhead::new(1000, 2.0, NoiseMode::Seeded(9), false).take(5).await.unwrap();
        assert_eq!(drawn_ahead, on_demand);
    }

    #[tokio::test]
    async fn noise_drawn_for_one_step_is_never_used_for_another() {
        let ahead = NoiseAhead::new(1000, 2.0, NoiseMode::Seeded(9), true);
        ahead.prepare(5);
        let six = ahead.take(6).await.unwrap();
        assert_eq!(six, noise::draw(1000, 2.0, NoiseMode::Seeded(9), 6).unwrap());
        assert!(ahead.next.lock().unwrap().is_none(), "step 5's noise is dropped, not kept");
    }

    #[tokio::test]
    async fn os_entropy_noise_is_used_once() {
        let ahead = NoiseAhead::new(64, 1.0, NoiseMode::OsEntropy, true);
        ahead.prepare(0);
        let first = ahead.take(0).await.unwrap();
        let again = ahead.take(0).await.unwrap();
        assert_ne!(first, again, "a second take draws fresh noise, never the same twice");
    }
}
