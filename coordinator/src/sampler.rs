//! Poisson sampling in O(L): every example of [0, N) is in step t's batch independently with
//! probability q. Gaps between sampled indices are Geometric(q), drawn by inversion from a
//! ChaCha20 stream keyed by the job secret with stream id t, so a retried step sees the same
//! batch and nobody without the secret can predict one.

use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// 256 secret bits per job, from OS entropy at submission; never leaves the cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret(pub [u8; 32]);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

/// Why a sampler cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    /// q outside (0, 1].
    #[error("invalid sample_rate {0}: must be in (0, 1]")]
    Rate(f64),
    /// N = 0.
    #[error("invalid dataset size 0: the dataset has no examples")]
    Empty,
}

/// The sampler of one job: dataset size N and rate q, fixed for the job.
#[derive(Debug, Clone)]
pub struct PoissonSampler {
    secret: JobSecret,
    examples: u64,
    rate: f64,
}

impl PoissonSampler {
    /// A sampler over `examples` examples at rate `rate`.
    pub fn new(secret: JobSecret, examples: u64, rate: f64) -> Result<Self, SamplerError> {
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(SamplerError::Rate(rate));
        }
        if examples == 0 {
            return Err(SamplerError::Empty);
        }
        Ok(Self { secret, examples, rate })
    }

    /// The key of the job's training crops: SHA-256("dpcap-augment-v1" ‖ secret). One-way, so
    /// workers can crop reproducibly without learning the sampler's secret.
    pub fn augment_key(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update(b"dpcap-augment-v1");
        hasher.update(self.secret.0);
        hasher.finalize().into()
    }

    /// Expected batch size L = q·N: what updates divide by.
    pub fn expected_batch_size(&self) -> f64 {
        self.rate * self.examples as f64
    }

    /// The sorted example indices of step `step`.
    pub fn sample(&self, step: u64) -> Vec<u64> {
        let mut rng = ChaCha20Rng::from_seed(self.secret.0);
        rng.set_stream(step);
        if self.rate >= 1.0 {
            return (0..self.examples).collect();
        }
        let log_miss = (-self.rate).ln_1p(); // ln(1 - q) < 0
        let mut out = Vec::with_capacity((self.expected_batch_size() * 1.1) as usize + 16);
        let mut next: u64 = 0;
        loop {
            // U in (0, 1] with 53 random bits; the gap G = floor(ln U / ln(1-q)) ~ Geometric(q)
            // counts the examples skipped before the next sampled one.
            let u = ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
            let gap = (u.ln() / log_miss).floor();
            if gap >= (self.examples - next) as f64 {
                break;
            }
            next += gap as u64;
            out.push(next);
            next += 1;
            if next >= self.examples {
                break;
            }
        }
        out
    }
}
