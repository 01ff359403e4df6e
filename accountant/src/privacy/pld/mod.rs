//! Privacy loss distributions (PLD): the tight accountant. A mechanism's PLD is kept as a pair
//! of discretised distributions, one per neighbouring relation (remove, add); composition
//! convolves them (FFT) and ε at δ is the larger of the two. Every step of the construction is
//! pessimistic, so the ε reported is an upper bound on the true ε.

mod fft;
mod gaussian;
mod pmf;

pub use gaussian::{Adjacency, SubsampledGaussian};
pub use pmf::Pmf;

use super::{PrivacyError, Segment};

/// Grid width (nats) and tail truncation of the PLD accountant.
#[derive(Debug, Clone, Copy)]
pub struct PldOptions {
    /// Width of the loss grid; dp-accounting's default is 1e-4.
    pub discretization: f64,
    /// Mass that composition may cut from the tails (charged to +∞).
    pub tail_mass: f64,
    /// Largest FFT length allowed; beyond it the grid is coarsened (still an upper bound).
    pub max_len: usize,
}

impl Default for PldOptions {
    fn default() -> Self {
        Self { discretization: 1e-4, tail_mass: 1e-15, max_len: 1 << 23 }
    }
}

/// The PLD of a mechanism under add/remove-one adjacency.
#[derive(Debug, Clone)]
pub struct Pld {
    remove: Pmf,
    add: Pmf,
}

impl Pld {
    /// The PLD of the composition of `segments` (in order), each `steps` runs of the
    /// subsampled Gaussian. The grid is coarsened by powers of two when the finest one would
    /// exceed `options.max_len` points (huge ε, tiny σ).
    pub fn for_segments(segments: &[Segment], options: PldOptions) -> Result<Self, PrivacyError> {
        let mut h = options.discretization;
        loop {
            match Self::try_for_segments(segments, options, h) {
                Some(pld) => return Ok(pld),
                None if h < 1.0 => h *= 4.0,
                None => {
                    return Err(PrivacyError::invalid(
                        "segments",
                        format!("{segments:?}"),
                        "privacy loss support too large for the PLD accountant; use rdp",
                    ));
                }
            }
        }
    }

    fn try_for_segments(segments: &[Segment], options: PldOptions, h: f64) -> Option<Self> {
        let mut composed: Option<Pld> = None;
        for segment in segments.iter().filter(|s| s.steps > 0) {
            let mechanism = SubsampledGaussian::new(segment.sample_rate, segment.noise_multiplier);
            if mechanism.grid_points(h) > options.max_len {
                return None;
            }
            let one = Self::one_step(&mechanism, h);
            let many = one.self_compose(segment.steps, options)?;
            composed = Some(match composed {
                None => many,
                Some(before) => before.compose(&many, options)?,
            });
        }
        Some(composed.unwrap_or_else(|| Self::identity(h)))
    }

    /// One step of `mechanism`, both relations built in parallel.
    pub fn one_step(mechanism: &SubsampledGaussian, h: f64) -> Self {
        let (remove, add) = std::thread::scope(|scope| {
            let add = scope.spawn(|| mechanism.connect_the_dots(Adjacency::Add, h));
            let remove = mechanism.connect_the_dots(Adjacency::Remove, h);
            (remove, add.join().expect("connect-the-dots thread panicked"))
        });
        Self { remove, add }
    }

    fn identity(h: f64) -> Self {
        let p = Pmf::new(h, 0, vec![1.0], 0.0);
        Self { remove: p.clone(), add: p }
    }

    /// `times` runs of this mechanism; None when the result would exceed `options.max_len`.
    pub fn self_compose(&self, times: u64, options: PldOptions) -> Option<Self> {
        let (remove, add) = std::thread::scope(|scope| {
            let add = scope.spawn(|| self.add.self_compose(times, options.tail_mass, options.max_len));
            let remove = self.remove.self_compose(times, options.tail_mass, options.max_len);
            (remove, add.join().expect("composition thread panicked"))
        });
        Some(Self { remove: remove?, add: add? })
    }

    /// This mechanism followed by `other`.
    pub fn compose(&self, other: &Self, options: PldOptions) -> Option<Self> {
        if self.remove.len() + other.remove.len() > options.max_len
            || self.add.len() + other.add.len() > options.max_len
        {
            return None;
        }
        Some(Self {
            remove: self.remove.compose(&other.remove, options.tail_mass),
            add: self.add.compose(&other.add, options.tail_mass),
        })
    }

    /// The smallest ε ≥ 0 such that the mechanism is (ε, δ)-DP under both relations.
    pub fn epsilon_for_delta(&self, delta: f64) -> f64 {
        self.remove.epsilon_for_delta(delta).max(self.add.epsilon_for_delta(delta))
    }

    /// δ at ε: the larger hockey-stick divergence of the two relations.
    pub fn delta_for_epsilon(&self, epsilon: f64) -> f64 {
        self.remove.delta_for_epsilon(epsilon).max(self.add.delta_for_epsilon(epsilon))
    }
}
