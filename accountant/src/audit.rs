//! Gradient-space canaries for auditing a job in one run (Steinke, Nasr and Jagielski 2023).
//!
//! A canary is one more "example" whose clipped gradient is a Dirac direction: C·s on one
//! coordinate c of the model (s = ±1), each canary on its own coordinate. Every canary is
//! *included* with probability 1/2 by a secret coin; every step each canary is Poisson-sampled
//! with the job's rate q, exactly like an example, and an included canary that is sampled adds
//! its gradient to the step's sum before the noise. The auditor's white-box score of a canary
//! is Σ over **every** step of ⟨release_t, direction⟩ = s·release_t[c]; an included canary
//! scores about q·T·C more. The score must not use which steps sampled the canary: the job's ε
//! counts on that sampling staying hidden (amplification by subsampling), so an auditor who
//! knew it would face a weaker mechanism than the one claimed, and a correct job could audit
//! above its ε. Guessing "included" for the top scores and
//! "excluded" for the bottom ones gives counts whose one-run ε lower bound
//! (`dpcap_privacy::audit`) a correct mechanism never exceeds (beyond the test's 5 %).
//!
//! Canaries live on one of two [`Placement`]s. *Reserved* (the default): m coordinates
//! appended to the model's P for the audit alone. They are noised in the same pass, with the
//! same noise, as the release; no example's gradient ever moves them and no rank receives
//! them, so a canary's score is its own gradient plus the mechanism's noise, and nothing else:
//! the audit then measures the noise the mechanism really adds, as tightly as one run can.
//! *Model*: coordinates of the model itself, as a canary inserted among the data would be;
//! the examples' gradients at those coordinates then blur the scores (on the demo, a bound of
//! 0.63 at a claimed ε of 100), and the canaries train with the model.
//!
//! Everything is a pure function of a 256-bit secret the accountant draws at registration and
//! keeps in its ledger: coins, coordinates, signs and per-step samples are reproducible from
//! the ledger and unknown to every worker. The secret never leaves the accountant.

use std::collections::HashSet;

use dpcap_privacy::audit::{AuditCounts, epsilon_lower_bound, epsilon_lower_bound_fdp, guess};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// ChaCha20 streams of the secret: one per purpose, then one per step.
const COIN_STREAM: u64 = 0;
const PLACE_STREAM: u64 = 1;
const STEP_STREAM_BASE: u64 = 2;

/// The audit's significance level: bounds hold at 95 % confidence.
pub const SIGNIFICANCE: f64 = 0.05;

/// Where a job's canaries live (see the module's note): the contract's own type.
pub use dpcap_privacy::contract::Placement;

/// A job's canaries.
#[derive(Debug, Clone)]
pub struct Canaries {
    secret: [u8; 32],
    /// q: each canary's per-step sampling probability (the job's rate).
    sample_rate: f64,
    /// C: the L2 norm of each canary's gradient (the job's clipping norm).
    clip: f64,
    /// Per canary: whether it is included (the secret coin).
    included: Vec<bool>,
    /// Per canary: its coordinate and sign. Reserved coordinates are P..P+m.
    directions: Vec<(usize, f64)>,
    /// Coordinates appended to the model's for the audit (m when reserved, else 0).
    reserved: usize,
}

/// A job's audit as registered: what draws its canaries, and the canaries while they are held.
/// Drawing them is a pure function of the secret (the same canaries every time), so they are
/// drawn when the job's ranks attach, or when a release or the final audit needs them, and let
/// go whenever the job holds nothing (queued, suspended, closed, audited): about 17 bytes a
/// canary (170 MB for 10M) only while the job runs.
#[derive(Debug)]
pub struct AuditPlan {
    secret: [u8; 32],
    count: usize,
    dim: usize,
    sample_rate: f64,
    clip: f64,
    placement: Placement,
    /// The canaries while held, and the number of times they were let go: a draw that began
    /// before a let-go is not kept (the job stopped running meanwhile).
    drawn: std::sync::Mutex<(Option<std::sync::Arc<Canaries>>, u64)>,
}

impl AuditPlan {
    /// `count` canaries for a `dim`-parameter model, not drawn yet (see [`Canaries::new`]).
    pub fn new(secret: [u8; 32], count: usize, dim: usize, sample_rate: f64, clip: f64, placement: Placement) -> Self {
        Self { secret, count, dim, sample_rate, clip, placement, drawn: Default::default() }
    }

    /// Coordinates the audit appends to the model's (known without drawing).
    pub fn reserved(&self) -> usize {
        if self.placement == Placement::Reserved { self.count } else { 0 }
    }

    /// The canaries, drawn now (outside the lock) if they are not held; kept for later calls
    /// unless they were let go while drawing.
    pub fn canaries(&self) -> std::sync::Arc<Canaries> {
        let epoch = {
            let drawn = self.drawn.lock().expect("audit lock");
            if let Some(canaries) = &drawn.0 {
                return canaries.clone();
            }
            drawn.1
        };
        let (secret, count, dim) = (self.secret, self.count, self.dim);
        let fresh = std::sync::Arc::new(Canaries::new(secret, count, dim, self.sample_rate, self.clip, self.placement));
        let mut drawn = self.drawn.lock().expect("audit lock");
        if drawn.1 == epoch && drawn.0.is_none() {
            drawn.0 = Some(fresh.clone());
        }
        fresh
    }

    /// Lets the canaries go (they are drawn again, identical, when next needed); a draw under
    /// way is not kept.
    pub fn clear(&self) {
        let mut drawn = self.drawn.lock().expect("audit lock");
        drawn.0 = None;
        drawn.1 += 1;
    }

    /// Bytes the drawn canaries hold (0 when not drawn).
    pub fn held_bytes(&self) -> usize {
        self.drawn.lock().expect("audit lock").0.as_ref().map_or(0, |c| c.held_bytes())
    }
}

/// What an audit concluded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditOutcome {
    /// Canaries, guesses and right guesses.
    pub counts: AuditCounts,
    /// The one-run ε lower bound at δ, 95 % confidence (Steinke et al.).
    pub epsilon_lower_bound: f64,
    /// The f-DP variant's bound on the same counts (0 when δ = 0): the ε of the Gaussian
    /// mechanism the counts rule out. It assumes a Gaussian trade-off curve, which a Poisson-
    /// subsampled Gaussian only approaches, so it is shown but never raises the alarm: in our
    /// tests a correct mechanism at ε = 1 scored 1.22 on it at one seed in four.
    pub epsilon_lower_bound_fdp: f64,
}

impl AuditOutcome {
    /// The bound that holds for every (ε, δ)-DP mechanism (Steinke et al.): a value above the
    /// claimed ε means the mechanism is broken (or a 5 % chance event).
    pub fn bound(&self) -> f64 {
        self.epsilon_lower_bound
    }
}

fn stream(secret: &[u8; 32], stream: u64) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::from_seed(*secret);
    rng.set_stream(stream);
    rng
}

/// A uniform draw below `n` (rejection sampling, no modulo bias).
fn below(rng: &mut ChaCha20Rng, n: u64) -> u64 {
    let zone = u64::MAX - u64::MAX % n;
    loop {
        let x = rng.next_u64();
        if x < zone {
            return x % n;
        }
    }
}

impl Canaries {
    /// `count` canaries for a `dim`-parameter model: on `count` coordinates after the model's
    /// (reserved), or on distinct coordinates of the model (count ≤ dim).
    pub fn new(secret: [u8; 32], count: usize, dim: usize, sample_rate: f64, clip: f64, placement: Placement) -> Self {
        let mut coins = stream(&secret, COIN_STREAM);
        let included = (0..count).map(|_| coins.next_u64() & 1 == 1).collect();
        let mut place = stream(&secret, PLACE_STREAM);
        let sign = |rng: &mut ChaCha20Rng| if rng.next_u64() & 1 == 1 { 1.0 } else { -1.0 };
        let (directions, reserved) = match placement {
            Placement::Reserved => ((0..count).map(|j| (dim + j, sign(&mut place))).collect(), count),
            Placement::Model => {
                assert!(count <= dim, "{count} canaries need as many coordinates, the model has {dim}");
                // Floyd's algorithm: `count` distinct coordinates in O(count) memory, whatever dim is.
                let mut taken = HashSet::with_capacity(count);
                let mut directions = Vec::with_capacity(count);
                for j in (dim - count)..dim {
                    let t = below(&mut place, j as u64 + 1) as usize;
                    let coordinate = if taken.insert(t) { t } else { taken.insert(j).then_some(j).expect("j is new") };
                    directions.push((coordinate, sign(&mut place)));
                }
                (directions, 0)
            }
        };
        Self { secret, sample_rate, clip, included, directions, reserved }
    }

    /// Bytes its tables hold.
    pub fn held_bytes(&self) -> usize {
        self.included.capacity() + self.directions.capacity() * std::mem::size_of::<(usize, f64)>()
    }

    /// Coordinates the audit appends to the model's: the release is noised over P + this many,
    /// and only the first P reach the ranks.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Number of canaries.
    pub fn len(&self) -> usize {
        self.included.len()
    }

    /// True without canaries.
    pub fn is_empty(&self) -> bool {
        self.included.is_empty()
    }

    /// The secret coins (for the audit's conclusion and for tests; never sent to workers).
    pub fn included(&self) -> &[bool] {
        &self.included
    }

    /// The canaries Poisson-sampled at `step` (included or not), each with probability q.
    pub fn sampled(&self, step: u64) -> Vec<usize> {
        let mut rng = stream(&self.secret, STEP_STREAM_BASE + step);
        let threshold = (self.sample_rate * 2f64.powi(64)).min(u64::MAX as f64) as u64;
        (0..self.len()).filter(|_| rng.next_u64() < threshold).collect()
    }

    /// Adds the gradients of the included canaries sampled at `step` to `noise` (which the
    /// release then adds to the parts' sum), each scaled by `scale` (1 for a correct mechanism:
    /// a canary's gradient has norm C).
    pub fn inject(&self, step: u64, noise: &mut [f64], scale: f64) {
        for j in self.sampled(step) {
            if self.included[j] {
                let (coordinate, sign) = self.directions[j];
                noise[coordinate] += scale * sign * self.clip;
            }
        }
    }

    /// The noised vector's value at each canary's coordinate (little-endian f32, canary order;
    /// `value` reads a coordinate's 4 bytes, reserved coordinates included): all the audit needs of a release, stored
    /// beside it and kept when the release is trimmed.
    pub fn readings(&self, value: impl Fn(usize) -> Option<[u8; 4]>) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 * self.len());
        for &(coordinate, _) in &self.directions {
            out.extend_from_slice(&value(coordinate).unwrap_or([0; 4]));
        }
        out
    }

    /// Adds one release's readings to the scores: s·release[c] for every canary, sampled or
    /// not (see the module's note on why the samples stay out of the score).
    pub fn score(&self, readings: &[u8], scores: &mut [f64]) {
        for ((value, &(_, sign)), score) in readings.chunks_exact(4).zip(&self.directions).zip(scores) {
            *score += sign * f64::from(f32::from_le_bytes([value[0], value[1], value[2], value[3]]));
        }
    }

    /// Guesses per side for `m` canaries: the top and bottom 1 % (at least one).
    pub fn default_guesses(&self) -> usize {
        (self.len() / 100).max(1)
    }

    /// Guesses on the scores ("included" for the `k` highest, "excluded" for the `k` lowest,
    /// k fixed before the scores are seen) and the ε lower bounds at δ they give.
    pub fn conclude(&self, scores: &[f64], delta: f64, k: usize) -> AuditOutcome {
        let counts = guess(scores, &self.included, k, k);
        AuditOutcome {
            counts,
            epsilon_lower_bound: epsilon_lower_bound(counts, SIGNIFICANCE, delta),
            epsilon_lower_bound_fdp: if delta > 0.0 {
                epsilon_lower_bound_fdp(counts, SIGNIFICANCE, delta)
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests;
