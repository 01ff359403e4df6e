//! Gaussian noise for releases: ChaCha20 keyed from OS entropy, with a sampler that resists
//! floating-point attacks (Mironov 2012): each coordinate's N(0, 1) is the scaled sum of four
//! independent Box–Muller draws in f64, so the low-order bits of one draw do not expose the
//! pattern of the underlying uniform. A seeded mode exists for tests only and is recorded in
//! every ledger charge it produces.

use rand_chacha::ChaCha20Rng;

use crate::sum::Sum;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Coordinates per independent ChaCha20 stream; blocks are filled in parallel and the result
/// does not depend on the number of threads.
const BLOCK: usize = 1 << 20;

/// Where a release's noise key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseMode {
    /// A fresh 256-bit key from the operating system for every release.
    OsEntropy,
    /// A key derived from (seed, step): reproducible, for tests only.
    Seeded(u64),
}

impl NoiseMode {
    /// How the ledger records this mode.
    pub fn describe(&self) -> String {
        match self {
            NoiseMode::OsEntropy => "os-entropy".to_owned(),
            NoiseMode::Seeded(seed) => format!("insecure-seeded:{seed}"),
        }
    }

    fn key(&self, step: u64) -> Result<[u8; 32], getrandom::Error> {
        let mut key = [0u8; 32];
        match self {
            NoiseMode::OsEntropy => getrandom::fill(&mut key)?,
            NoiseMode::Seeded(seed) => {
                key[..8].copy_from_slice(&seed.to_le_bytes());
                key[8..16].copy_from_slice(&step.to_le_bytes());
                key[16..].copy_from_slice(b"dpcap-test-noise");
            }
        }
        Ok(key)
    }
}

/// Runs `work(block_index, block)` over `block`-sized blocks of `out` on every core. Block
/// `i` is always the same coordinates, so results never depend on the number of threads.
fn par_blocks<T: Send>(out: &mut [T], block: usize, work: impl Fn(usize, &mut [T]) + Sync) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(out.len().div_ceil(block)).max(1);
    let mut shares: Vec<Vec<(usize, &mut [T])>> = (0..threads).map(|_| Vec::new()).collect();
    for (index, chunk) in out.chunks_mut(block).enumerate() {
        shares[index % threads].push((index, chunk));
    }
    let work = &work;
    std::thread::scope(|scope| {
        for share in shares {
            scope.spawn(move || share.into_iter().for_each(|(index, chunk)| work(index, chunk)));
        }
    });
}

/// `dim` coordinates of N(0, std²) noise for `step` (f64), drawn on every core. `std` is σ·C.
/// Noise does not depend on the gradient, so it can be drawn before the step's parts arrive;
/// callers draw it at most once per step and never release it before the step's charge.
pub fn draw(dim: usize, std: f64, mode: NoiseMode, step: u64) -> Result<Vec<f64>, getrandom::Error> {
    let key = mode.key(step)?;
    let mut out = vec![0.0f64; dim];
    par_blocks(&mut out, BLOCK, |index, block| {
        let mut rng = ChaCha20Rng::from_seed(key);
        rng.set_stream(index as u64);
        fill_block(&mut rng, block, std);
    });
    Ok(out)
}

/// The release bytes: `(sum + noise) as f32` per coordinate, little-endian, in one pass on
/// every core (memory-bound). The f64 addition happens before the single rounding to f32.
pub fn apply(sum: &Sum, noise: &[f64]) -> Vec<u8> {
    assert_eq!(sum.len(), noise.len(), "noise drawn for another dimension");
    match sum {
        Sum::Empty => Vec::new(),
        Sum::One(values) => apply_to(values, noise),
        Sum::Many(values) => apply_to(values, noise),
    }
}

fn apply_to<T: Copy + Into<f64> + Sync>(sum: &[T], noise: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; noise.len() * 4];
    par_blocks(&mut out, BLOCK * 4, |index, bytes| {
        let range = index * BLOCK..index * BLOCK + bytes.len() / 4;
        for ((y, n), x) in bytes.chunks_exact_mut(4).zip(&noise[range.clone()]).zip(&sum[range]) {
            y.copy_from_slice(&(((*x).into() + n) as f32).to_le_bytes());
        }
    });
    out
}

fn fill_block(rng: &mut ChaCha20Rng, output: &mut [f64], std: f64) {
    let scale = std / 2.0; // the sum of four N(0,1) has std 2
    for y in output.iter_mut() {
        let (a, b) = box_muller(rng);
        let (c, d) = box_muller(rng);
        *y = scale * (a + b + c + d);
    }
}

/// Two independent N(0, 1) draws from two uniforms in (0, 1] with 53 random bits each.
fn box_muller(rng: &mut ChaCha20Rng) -> (f64, f64) {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    let u1 = ((rng.next_u64() >> 11) + 1) as f64 * SCALE;
    let u2 = (rng.next_u64() >> 11) as f64 * SCALE;
    let r = (-2.0 * u1.ln()).sqrt();
    let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
    (r * c, r * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ones(dim: usize) -> Sum {
        let mut sum = Sum::default();
        sum.add(vec![1.0; dim]);
        sum
    }

    /// One release as the accountant makes it: noise drawn for `step`, added to `sum`.
    fn release(sum: &Sum, std: f64, mode: NoiseMode, step: u64) -> Vec<u8> {
        apply(sum, &draw(sum.len(), std, mode, step).unwrap())
    }

    #[test]
    fn seeded_noise_is_reproducible_and_step_dependent() {
        let sum = ones(3000);
        let a = release(&sum, 1.0, NoiseMode::Seeded(7), 3);
        let b = release(&sum, 1.0, NoiseMode::Seeded(7), 3);
        let c = release(&sum, 1.0, NoiseMode::Seeded(7), 4);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn os_entropy_noise_differs_between_calls() {
        let sum = ones(64);
        let a = release(&sum, 1.0, NoiseMode::OsEntropy, 0);
        let b = release(&sum, 1.0, NoiseMode::OsEntropy, 0);
        assert_ne!(a, b);
    }

    #[test]
    fn noise_spans_several_blocks_and_has_the_asked_spread() {
        let dim = 2 * BLOCK + 12_345;
        let noise = draw(dim, 3.0, NoiseMode::Seeded(1), 0).unwrap();
        let mean = noise.iter().sum::<f64>() / dim as f64;
        let var = noise.iter().map(|n| (n - mean).powi(2)).sum::<f64>() / dim as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 3.0).abs() < 0.01, "std {}", var.sqrt());
        assert_ne!(noise[..BLOCK], noise[BLOCK..2 * BLOCK], "blocks use independent streams");
        let released = apply(&ones(dim), &noise);
        let last = dim - 1;
        let value = f32::from_le_bytes(released[last * 4..].try_into().unwrap());
        assert_eq!(value, (1.0 + noise[last]) as f32);
    }
}
