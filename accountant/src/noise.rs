//! Gaussian noise for releases: ChaCha20 keyed from OS entropy, with a sampler that resists
//! floating-point attacks (Mironov 2012): each coordinate's N(0, 1) is the scaled sum of four
//! independent Box–Muller draws in f64, so the low-order bits of one draw do not expose the
//! pattern of the underlying uniform. A seeded mode exists for tests only and is recorded in
//! every ledger charge it produces.

use rand_chacha::ChaCha20Rng;
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

/// Adds N(0, std²) to every coordinate of `sum` (f64 arithmetic) and returns the f32 release.
/// `std` is σ·C. Noise is drawn exactly once per call; callers call it once per step.
pub fn release(sum: &[f64], std: f64, mode: NoiseMode, step: u64) -> Result<Vec<f32>, getrandom::Error> {
    let key = mode.key(step)?;
    let mut out = vec![0.0f32; sum.len()];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(sum.len().div_ceil(BLOCK)).max(1);
    let mut work: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
    for (index, blocks) in sum.chunks(BLOCK).zip(out.chunks_mut(BLOCK)).enumerate() {
        work[index % threads].push((index, blocks));
    }
    std::thread::scope(|scope| {
        for blocks in work {
            scope.spawn(move || {
                for (index, (input, output)) in blocks {
                    let mut rng = ChaCha20Rng::from_seed(key);
                    rng.set_stream(index as u64);
                    fill_block(&mut rng, input, output, std);
                }
            });
        }
    });
    Ok(out)
}

fn fill_block(rng: &mut ChaCha20Rng, input: &[f64], output: &mut [f32], std: f64) {
    let scale = std / 2.0; // the sum of four N(0,1) has std 2
    for (x, y) in input.iter().zip(output.iter_mut()) {
        let (a, b) = box_muller(rng);
        let (c, d) = box_muller(rng);
        *y = (x + scale * (a + b + c + d)) as f32;
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

    #[test]
    fn seeded_noise_is_reproducible_and_step_dependent() {
        let sum = vec![1.0; 3000];
        let a = release(&sum, 1.0, NoiseMode::Seeded(7), 3).unwrap();
        let b = release(&sum, 1.0, NoiseMode::Seeded(7), 3).unwrap();
        let c = release(&sum, 1.0, NoiseMode::Seeded(7), 4).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn os_entropy_noise_differs_between_calls() {
        let sum = vec![0.0; 64];
        let a = release(&sum, 1.0, NoiseMode::OsEntropy, 0).unwrap();
        let b = release(&sum, 1.0, NoiseMode::OsEntropy, 0).unwrap();
        assert_ne!(a, b);
    }
}
