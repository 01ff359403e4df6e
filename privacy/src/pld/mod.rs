//! Privacy loss distributions (PLD): the tight accountant. A mechanism's PLD is kept as a pair
//! of discretised distributions, one per neighbouring relation (remove, add); composition
//! convolves them (FFT) and ε at δ is the larger of the two. Every step of the construction is
//! pessimistic, so the ε reported is an upper bound on the true ε.

mod fft;
mod gaussian;
mod pmf;

pub use gaussian::{Adjacency, SubsampledGaussian};
pub use pmf::{MAX_POWER, Pmf};

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
    /// Largest FFT length once the grid is coarsened anyway: ε is then tens of nats or more,
    /// where a 4× wider grid moves it by about 1e-4 relative, and tiny σ stays cheap.
    pub coarse_max_len: usize,
}

impl Default for PldOptions {
    fn default() -> Self {
        Self { discretization: 1e-4, tail_mass: 1e-15, max_len: 1 << 23, coarse_max_len: 1 << 21 }
    }
}

impl PldOptions {
    /// These options for a grid of width `h`: the length limit is `coarse_max_len` when `h`
    /// is coarser than `discretization`.
    fn at(self, h: f64) -> Self {
        let coarse = h > self.discretization;
        Self { max_len: if coarse { self.max_len.min(self.coarse_max_len) } else { self.max_len }, ..self }
    }
}

/// Grid points of the probe PLD that sizes the grid (two PMFs of this length: cheap).
const PROBE_POINTS: usize = 1 << 12;

/// Coarsening stops at the first width d·4^k at or above this (nats): beyond it the PLD gives
/// way to RDP.
const COARSEST: f64 = 1.0;

/// The grid widths tried, finest first: d·4^k up to the first at or above [`COARSEST`].
fn widths(discretization: f64) -> impl Iterator<Item = f64> {
    let d = if discretization > 0.0 { discretization } else { COARSEST };
    std::iter::successors(Some(d), |&h| (h < COARSEST).then_some(h * 4.0))
}

/// Extra mass (over 1) a one-step PMF may carry from rounding (clamped negative noise leaves
/// 1e-6 at most, on the longest grids); more means the discretisation itself went wrong.
const ONE_STEP_EXCESS: f64 = 1e-3;

/// The PLD of a mechanism under add/remove-one adjacency.
#[derive(Debug, Clone)]
pub struct Pld {
    remove: Pmf,
    add: Pmf,
}

impl Pld {
    /// The PLD of the composition of `segments` (in order), each `steps` runs of the
    /// subsampled Gaussian. The grid is coarsened by powers of four when the finest one would
    /// exceed `options.max_len` points (huge ε, tiny σ); a coarse probe picks the first width
    /// worth building, so that tiny σ does not build (and discard) PLDs of millions of points.
    /// An error when no width up to about 1 nat holds the composed losses, when a segment has
    /// more than [`MAX_POWER`] steps, or when the numbers lose their meaning (non-finite
    /// or excess mass): the caller must then use RDP.
    pub fn for_segments(segments: &[Segment], options: PldOptions) -> Result<Self, PrivacyError> {
        if let Some(long) = segments.iter().find(|s| s.steps > MAX_POWER) {
            return Err(PrivacyError::invalid(
                "steps",
                long.steps,
                "more than 2^24 in one segment, beyond what the PLD accountant composes exactly; use rdp",
            ));
        }
        let start = Self::starting_discretization(segments, options);
        widths(options.discretization)
            .filter(|&h| h >= start)
            .find_map(|h| Self::try_for_segments(segments, options.at(h), h))
            .ok_or_else(|| {
                PrivacyError::invalid(
                    "segments",
                    format!("{segments:?}"),
                    "privacy loss support too large for the PLD accountant; use rdp",
                )
            })
    }

    /// The first width of [`widths`] at which the composed support, as a probe PLD of about
    /// [`PROBE_POINTS`] points measures it, fits `options.max_len`. The support's width in
    /// nats hardly depends on the grid (the Chernoff orders scale with the one-step width);
    /// an underestimate only costs one more try.
    fn starting_discretization(segments: &[Segment], options: PldOptions) -> f64 {
        let coarsest = widths(options.discretization).last().unwrap_or(COARSEST);
        let mut width = 0.0; // nats spanned by the composed support, summed over segments
        for segment in segments.iter().filter(|s| s.steps > 0) {
            let mechanism = SubsampledGaussian::new(segment.sample_rate, segment.noise_multiplier);
            let probe =
                widths(options.discretization).find(|&h| mechanism.grid_points(h) <= PROBE_POINTS).unwrap_or(coarsest);
            if mechanism.grid_points(probe) > options.at(coarsest).max_len {
                return coarsest; // not even one step fits: the last try refuses it
            }
            let one = Self::one_step(&mechanism, probe);
            let points = [&one.remove, &one.add]
                .iter()
                .map(|p| p.support_points(segment.steps, options.tail_mass).map_or(f64::INFINITY, |n| n as f64))
                .fold(0.0, f64::max);
            width += points * probe;
        }
        widths(options.discretization).find(|&h| width / h <= options.at(h).max_len as f64).unwrap_or(coarsest)
    }

    fn try_for_segments(segments: &[Segment], options: PldOptions, h: f64) -> Option<Self> {
        let mut composed: Option<Pld> = None;
        for segment in segments.iter().filter(|s| s.steps > 0) {
            let mechanism = SubsampledGaussian::new(segment.sample_rate, segment.noise_multiplier);
            if mechanism.grid_points(h) > options.max_len {
                return None;
            }
            let one = Self::one_step(&mechanism, h);
            if !one.is_sane() {
                return None;
            }
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

    /// True when both relations' masses are finite and sum to at most 1 plus rounding
    /// ([`ONE_STEP_EXCESS`]); a one-step PLD that is not must not be composed.
    pub fn is_sane(&self) -> bool {
        self.remove.is_sane(ONE_STEP_EXCESS) && self.add.is_sane(ONE_STEP_EXCESS)
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

    /// The grid width (nats) this PLD was built on; wider than the options' when coarsened.
    pub fn discretization(&self) -> f64 {
        self.remove.discretization()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(q: f64, sigma: f64, steps: u64) -> Segment {
        Segment { sample_rate: q, noise_multiplier: sigma, steps }
    }

    #[test]
    fn a_support_no_grid_can_hold_is_refused_not_truncated() {
        // σ = 1e-4: one inclusion is worth 5e7 nats, beyond any grid of 2^21 points.
        assert!(Pld::for_segments(&[segment(0.5, 1e-4, 10)], PldOptions::default()).is_err());
    }

    #[test]
    fn the_probe_starts_at_the_finest_width_that_fits() {
        let (segments, options) = ([segment(0.075, 0.009, 150)], PldOptions::default());
        let h = Pld::starting_discretization(&segments, options);
        assert!(h > options.discretization, "tiny sigma needs a coarser grid");
        assert!(Pld::try_for_segments(&segments, options.at(h), h).is_some());
        assert!(Pld::try_for_segments(&segments, options.at(h / 4.0), h / 4.0).is_none());
        // The normal regime stays on the finest grid.
        let normal = [segment(0.075, 0.845, 150)];
        assert_eq!(Pld::starting_discretization(&normal, options), options.discretization);
    }
}
