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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use crate::error::AccountantError;
use crate::noise::{self, NoiseMode, Urgency};

type Drawing = JoinHandle<Result<Vec<f64>, getrandom::Error>>;

/// The ceiling on noise drawn ahead across every job of an accountant (8 bytes per noised
/// coordinate per job: 1.5 GB at P = 190M). A draw that would pass it is not made: that job's
/// next release draws its own noise, more slowly. 0 draws nothing ahead.
#[derive(Debug)]
pub struct AheadBudget {
    limit: u64,
    held: AtomicU64,
}

impl AheadBudget {
    /// A ceiling of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self { limit, held: AtomicU64::new(0) })
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Reserves `bytes` if they fit under the ceiling.
    fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(bytes).filter(|&after| after <= self.limit)
            })
            .ok()
            .map(|_| Reservation { budget: self.clone(), bytes })
    }
}

/// Bytes of an [`AheadBudget`] held by one drawing, returned when it is dropped.
#[derive(Debug)]
struct Reservation {
    budget: Arc<AheadBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// One job's noise source: `dim` coordinates of N(0, std²) per step.
#[derive(Debug)]
pub struct NoiseAhead {
    dim: usize,
    std: f64,
    mode: NoiseMode,
    /// The accountant's ceiling on noise drawn ahead.
    budget: Arc<AheadBudget>,
    next: Mutex<Option<(u64, Drawing, Reservation)>>,
    /// The last release's noise buffer, which the next draw writes over
    /// ([`noise::draw_into`]), with its bytes of the ceiling: kept memory is counted memory.
    spare: Mutex<Option<(Vec<f64>, Reservation)>>,
}

impl NoiseAhead {
    /// A source for a job of dimension `dim` with noise std `std` = σ·C, drawing ahead within
    /// `budget`.
    pub fn new(dim: usize, std: f64, mode: NoiseMode, budget: Arc<AheadBudget>) -> Self {
        Self { dim, std, mode, budget, next: Mutex::new(None), spare: Mutex::new(None) }
    }

    /// Starts drawing `step`'s noise in the background (replacing any other step's), when the
    /// accountant's ceiling allows. Must be called from a tokio runtime.
    pub fn prepare(&self, step: u64) {
        let (dim, std, mode) = (self.dim, self.std, self.mode);
        if std == 0.0 {
            return; // a NOT PRIVATE baseline: nothing to draw
        }
        let mut next = self.next.lock().expect("noise lock");
        // The replaced drawing's bytes go back before the new ones are asked for.
        next.take();
        // A kept buffer brings its own bytes of the ceiling; a fresh one must find room.
        let spare = self.spare.lock().expect("noise lock").take();
        let fresh = || self.budget.reserve(8 * dim as u64).map(|reservation| (Vec::new(), reservation));
        let Some((used, reservation)) = spare.or_else(fresh) else {
            tracing::debug!(step, bytes = 8 * dim, "noise not drawn ahead: the accountant's ceiling is reached");
            return;
        };
        let task = tokio::task::spawn_blocking(move || noise::draw_into(used, dim, std, mode, step, Urgency::Ahead));
        *next = Some((step, task, reservation));
    }

    /// Keeps a release's noise buffer (its values used) for the next step's draw to write
    /// over, when the ceiling has room for it; otherwise it is freed.
    pub fn recycle(&self, used: Vec<f64>) {
        if used.len() == self.dim
            && let Some(reservation) = self.budget.reserve(8 * self.dim as u64)
        {
            *self.spare.lock().expect("noise lock") = Some((used, reservation));
        }
    }

    /// [`Self::prepare`], unless `step`'s noise is being drawn already.
    pub fn prepare_if_idle(&self, step: u64) {
        let drawing = self.next.lock().expect("noise lock").as_ref().is_some_and(|(s, ..)| *s == step);
        if !drawing {
            self.prepare(step);
        }
    }

    /// Drops any noise drawn ahead (a refused, closed or exhausted job will not use it).
    pub fn clear(&self) {
        self.next.lock().expect("noise lock").take();
        self.spare.lock().expect("noise lock").take();
    }

    /// Step `step`'s noise: the one drawn ahead if it was for this step, else drawn now. The
    /// caller must have durably charged `step`. Noise drawn ahead keeps its bytes of the
    /// ceiling until the returned [`Noise`] is dropped (after the noise pass).
    pub async fn take(&self, step: u64) -> Result<Noise, AccountantError> {
        let ready = self.next.lock().expect("noise lock").take();
        let (task, held) = match ready {
            Some((drawn_for, task, reservation)) if drawn_for == step => (task, Some(reservation)),
            _ if self.std == 0.0 => return Ok(Noise { values: vec![0.0; self.dim], _held: None }),
            _ => {
                let (dim, std, mode) = (self.dim, self.std, self.mode);
                let (used, held) = self.spare.lock().expect("noise lock").take().unzip();
                let used = used.unwrap_or_default();
                let draw = move || noise::draw_into(used, dim, std, mode, step, Urgency::Now);
                (tokio::task::spawn_blocking(draw), held)
            }
        };
        let values = task.await.map_err(|source| AccountantError::Task { what: "noise", source })??;
        Ok(Noise { values, _held: held })
    }
}

/// One step's noise, with the ceiling's bytes it holds while it lives.
#[derive(Debug)]
pub struct Noise {
    /// N(0, std²) per coordinate.
    pub values: Vec<f64>,
    _held: Option<Reservation>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn seeded_noise_drawn_ahead_equals_noise_drawn_on_demand() {
        let ahead = NoiseAhead::new(1000, 2.0, NoiseMode::Seeded(9), AheadBudget::new(u64::MAX));
        ahead.prepare(5);
        let drawn_ahead = ahead.take(5).await.unwrap().values;
        let on_demand =
            NoiseAhead::new(1000, 2.0, NoiseMode::Seeded(9), AheadBudget::new(0)).take(5).await.unwrap().values;
        assert_eq!(drawn_ahead, on_demand);
    }

    #[tokio::test]
    async fn noise_drawn_for_one_step_is_never_used_for_another() {
        let ahead = NoiseAhead::new(1000, 2.0, NoiseMode::Seeded(9), AheadBudget::new(u64::MAX));
        ahead.prepare(5);
        let six = ahead.take(6).await.unwrap().values;
        assert_eq!(six, noise::draw(1000, 2.0, NoiseMode::Seeded(9), 6).unwrap());
        assert!(ahead.next.lock().unwrap().is_none(), "step 5's noise is dropped, not kept");
    }

    #[tokio::test]
    async fn a_recycled_buffer_is_drawn_over_and_never_serves_its_old_noise() {
        let ahead = NoiseAhead::new(1000, 2.0, NoiseMode::OsEntropy, AheadBudget::new(u64::MAX));
        ahead.prepare(0);
        let first = ahead.take(0).await.unwrap().values;
        let (kept, address) = (first.clone(), first.as_ptr());
        ahead.recycle(first);
        ahead.prepare(1);
        let second = ahead.take(1).await.unwrap().values;
        assert_eq!(second.as_ptr(), address, "the next draw wrote into the recycled buffer");
        assert!(second.iter().zip(&kept).all(|(a, b)| a != b), "no value of step 0's noise is left");
        ahead.recycle(vec![0.0; 999]);
        assert!(ahead.spare.lock().unwrap().is_none(), "a buffer of another dimension is not kept");
    }

    #[tokio::test]
    async fn a_kept_buffer_holds_its_bytes_of_the_ceiling_and_none_is_kept_past_it() {
        let budget = AheadBudget::new(8 * 100);
        let ahead = NoiseAhead::new(100, 1.0, NoiseMode::Seeded(2), budget.clone());
        ahead.recycle(vec![0.0; 100]);
        assert_eq!(budget.held(), 800, "the kept buffer is counted");
        ahead.prepare(1);
        assert_eq!(budget.held(), 800, "the draw into it uses the same bytes");
        let noise = ahead.take(1).await.unwrap();
        ahead.recycle(vec![0.0; 100]);
        assert!(ahead.spare.lock().unwrap().is_none(), "no room under the ceiling: freed, not kept");
        drop(noise);
        assert_eq!(budget.held(), 0);
        ahead.recycle(vec![0.0; 100]);
        ahead.clear();
        assert_eq!(budget.held(), 0, "a cleared job keeps nothing");
    }

    #[tokio::test]
    async fn os_entropy_noise_is_used_once() {
        let ahead = NoiseAhead::new(64, 1.0, NoiseMode::OsEntropy, AheadBudget::new(u64::MAX));
        ahead.prepare(0);
        let first = ahead.take(0).await.unwrap().values;
        let again = ahead.take(0).await.unwrap().values;
        assert_ne!(first, again, "a second take draws fresh noise, never the same twice");
    }

    #[tokio::test]
    async fn drawing_ahead_stops_at_the_ceiling_and_gives_bytes_back_when_taken_or_cleared() {
        let budget = AheadBudget::new(2 * 8 * 100);
        let jobs: Vec<NoiseAhead> =
            (0..3).map(|_| NoiseAhead::new(100, 1.0, NoiseMode::Seeded(1), budget.clone())).collect();
        for job in &jobs {
            job.prepare(0);
        }
        assert_eq!(budget.held(), 1600, "two jobs fit under the ceiling, the third draws nothing ahead");
        assert!(jobs[2].next.lock().unwrap().is_none());
        let taken = jobs[0].take(0).await.unwrap();
        assert_eq!((taken.values.len(), budget.held()), (100, 1600), "held while the noise pass uses it");
        drop(taken);
        assert_eq!(budget.held(), 800);
        jobs[2].prepare(1);
        jobs[1].clear();
        assert_eq!(budget.held(), 800, "the third now fits; the cleared one gave its bytes back");
        jobs[2].prepare(2);
        assert_eq!(budget.held(), 800, "a new step's drawing replaces the old one's bytes");
    }
}
