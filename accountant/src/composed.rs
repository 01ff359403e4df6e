//! A dataset's composed ε, remembered by exactly what was composed, and a cheap bound that
//! decides first. A budget's check composes the history of every private job on the dataset:
//! segments of one mechanism are merged (`privacy::history`), so a sweep of one setting costs
//! one segment; the RDP bound ([`Composed::bound`], microseconds from each mechanism's kept
//! one-step RDP) decides every check clearly inside its budget, and only a check near the
//! boundary waits for the exact composition ([`Composed::get`]: PLD, ~0.04 s a mechanism at the
//! demo's σ and more at a low σ). Both are upper bounds of the true ε, so a check passed by
//! either is sound. Exact compositions run at most [`COMPOSING_AT_ONCE`] at a time (each holds
//! FFT buffers), and are remembered per dataset by their merged segments and δ, so a stale
//! value is never used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::sync::Semaphore;

use crate::error::{AccountantError, CompositionError};
use crate::privacy::{self, AccountantKind, Segment};
use crate::privacy::{RdpSteps, merged};

pub(crate) type Composing = Shared<BoxFuture<'static, Result<f64, Arc<CompositionError>>>>;

/// Exact compositions run at once, across every dataset and lineage: each holds FFT buffers
/// (up to ~100 MB at a low σ), and checks of one budget are serialised anyway.
pub const COMPOSING_AT_ONCE: usize = 2;

/// The latest composition per dataset, and every mechanism's one-step RDP.
pub struct Composed {
    latest: Mutex<HashMap<String, (String, Composing)>>,
    rdp: Arc<RdpSteps>,
    permits: Arc<Semaphore>,
}

impl Default for Composed {
    fn default() -> Self {
        Self { latest: Mutex::default(), rdp: Arc::default(), permits: Arc::new(Semaphore::new(COMPOSING_AT_ONCE)) }
    }
}

impl std::fmt::Debug for Composed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composed").finish_non_exhaustive()
    }
}

impl Composed {
    /// ε at `delta` of `segments` by RDP: never below the true ε nor below [`Composed::get`]'s
    /// value, and cheap (it runs on a blocking thread only for its first sight of a mechanism).
    pub async fn bound(&self, segments: Vec<Segment>, delta: f64) -> Result<f64, AccountantError> {
        privacy::check_delta(delta)?;
        for s in &segments {
            Segment::new(s.sample_rate, s.noise_multiplier, s.steps)?;
        }
        let rdp = self.rdp.clone();
        AccountantError::blocking(move || rdp.epsilon(&segments, delta)).await
    }

    /// ε at `delta` of `segments` composed with `kind` for `dataset_id` (for PLD, the smaller
    /// of it and the RDP bound: both are upper bounds): the remembered value when the same
    /// history was composed last, else a new composition (which replaces it). Awaiting is
    /// optional: the composition starts either way.
    pub fn get(&self, dataset_id: &str, kind: AccountantKind, segments: Vec<Segment>, delta: f64) -> Composing {
        let segments = merged(&segments);
        let key = format!("{kind:?} {:x} {segments:?}", delta.to_bits());
        let mut latest = self.latest.lock().expect("composed lock");
        // A composition that failed is computed again, never served from memory.
        if let Some((k, composing)) = latest.get(dataset_id)
            && *k == key
            && !matches!(composing.peek(), Some(Err(_)))
        {
            return composing.clone();
        }
        let composing: Composing = if segments.is_empty() {
            futures::future::ready(Ok(0.0)).boxed().shared()
        } else {
            let (permits, rdp) = (self.permits.clone(), self.rdp.clone());
            let task = tokio::spawn(async move {
                let _permit = permits.acquire_owned().await?;
                tokio::task::spawn_blocking(move || {
                    let exact = privacy::epsilon(kind, &segments, delta)?;
                    Ok(if kind == AccountantKind::Pld { exact.min(rdp.epsilon(&segments, delta)) } else { exact })
                })
                .await?
            });
            async move { task.await.map_err(|e| Arc::new(e.into()))?.map_err(Arc::new) }.boxed().shared()
        };
        latest.insert(dataset_id.to_owned(), (key, composing.clone()));
        composing
    }
}

/// The result of a composition as the accountant's error.
pub async fn epsilon(composing: Composing) -> Result<f64, AccountantError> {
    composing.await.map_err(AccountantError::Composition)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_same_segments_in_any_order_are_composed_once_and_others_anew() {
        let composed = Composed::default();
        let a = Segment { sample_rate: 0.01, noise_multiplier: 1.0, steps: 10 };
        let b = Segment { sample_rate: 0.02, noise_multiplier: 2.0, steps: 5 };
        let first = composed.get("d", AccountantKind::Rdp, vec![a, b], 1e-5);
        let again = composed.get("d", AccountantKind::Rdp, vec![b, a], 1e-5);
        assert!(first.ptr_eq(&again), "remembered");
        let want = privacy::epsilon(AccountantKind::Rdp, &[a, b], 1e-5).unwrap();
        assert_eq!(epsilon(again).await.unwrap(), want);
        let more = composed.get("d", AccountantKind::Rdp, vec![a, Segment { steps: 6, ..b }], 1e-5);
        assert!(!first.ptr_eq(&more), "another composition");
        assert!(epsilon(more).await.unwrap() > want);
        assert_eq!(epsilon(composed.get("e", AccountantKind::Pld, vec![], 1e-5)).await.unwrap(), 0.0);
    }

    #[tokio::test]
    async fn jobs_of_one_mechanism_are_one_composition_and_the_bound_is_never_below_it() {
        let composed = Composed::default();
        let a = Segment { sample_rate: 0.075, noise_multiplier: 1.1, steps: 50 };
        let three_jobs = composed.get("d", AccountantKind::Pld, vec![a; 3], 1e-5);
        let one_job = composed.get("d", AccountantKind::Pld, vec![Segment { steps: 150, ..a }], 1e-5);
        assert!(three_jobs.ptr_eq(&one_job), "one history, one composition");
        let exact = epsilon(one_job).await.unwrap();
        let bound = composed.bound(vec![a; 3], 1e-5).await.unwrap();
        assert!(bound >= exact && bound < 1.3 * exact, "bound {bound}, exact {exact}");
    }
}
