//! A dataset's composed ε, remembered by exactly what was composed. Each step of a job on a
//! budgeted dataset checks the composition of every private job on it plus the step: a PLD
//! composition that costs ~0.2 s at the demo's σ and far more at a low σ. After a release the
//! next step's composition is started in the background ([`Composed::get`] without awaiting),
//! and the next check finds it if nothing else was charged on the dataset in between (the
//! key is the exact segments and δ, so a stale value is never used).

use std::collections::HashMap;
use std::sync::Mutex;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use crate::error::AccountantError;
use crate::privacy::{self, AccountantKind, Segment};

pub(crate) type Composing = Shared<BoxFuture<'static, Result<f64, String>>>;

/// The latest composition per dataset.
#[derive(Default)]
pub struct Composed {
    latest: Mutex<HashMap<String, (String, Composing)>>,
}

impl std::fmt::Debug for Composed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composed").finish_non_exhaustive()
    }
}

impl Composed {
    /// ε at `delta` of `segments` composed with `kind` for `dataset_id`: the remembered value
    /// when the same segments were composed last, else a new composition (which replaces it).
    /// Awaiting is optional: the composition runs on a blocking thread either way.
    pub fn get(&self, dataset_id: &str, kind: AccountantKind, mut segments: Vec<Segment>, delta: f64) -> Composing {
        segments.retain(|s| s.steps > 0);
        segments.sort_by(|a, b| {
            (a.sample_rate.to_bits(), a.noise_multiplier.to_bits(), a.steps).cmp(&(
                b.sample_rate.to_bits(),
                b.noise_multiplier.to_bits(),
                b.steps,
            ))
        });
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
            let task = tokio::task::spawn_blocking(move || privacy::epsilon(kind, &segments, delta));
            async move {
                match task.await {
                    Ok(Ok(epsilon)) => Ok(epsilon),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(format!("composition task failed: {e}")),
                }
            }
            .boxed()
            .shared()
        };
        latest.insert(dataset_id.to_owned(), (key, composing.clone()));
        composing
    }
}

/// The result of a composition as the accountant's error.
pub async fn epsilon(composing: Composing) -> Result<f64, AccountantError> {
    composing.await.map_err(|e| AccountantError::Internal(format!("dataset composition: {e}")))
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
}
