//! FFT convolutions of probability vectors (indices are losses in units of the grid width).

use realfft::RealFftPlanner;
use realfft::num_complex::Complex;

/// The smallest 2^a·3^b·5^c ≥ n: lengths the FFT handles at full speed.
pub fn fast_len(n: usize) -> usize {
    let n = n.max(1);
    let mut best = n.next_power_of_two();
    let mut p5 = 1usize;
    while p5 < best {
        let mut p35 = p5;
        while p35 < best {
            let mut m = p35;
            while m < n {
                m *= 2;
            }
            best = best.min(m);
            p35 *= 3;
        }
        p5 *= 5;
    }
    best
}

/// Chernoff bounds [lo, hi] on the index sum of `times` independent draws from `probs` such
/// that the mass outside is at most `tail_mass` (half on each side). Orders as in Google's
/// dp-accounting: ±1/len … ±20/len, which keeps every e^{iλ} within [e^-20, e^20]. None when
/// the sum's index range does not fit an i64.
pub fn chernoff_bounds(probs: &[f64], times: u64, tail_mass: f64) -> Option<(i64, i64)> {
    let m = probs.len();
    let full = i64::try_from(m.max(1) - 1).ok()?.checked_mul(i64::try_from(times).ok()?)?;
    if tail_mass <= 0.0 || m <= 1 {
        return Some((0, full));
    }
    const K: usize = 20;
    let mut lambdas = [0.0f64; 2 * K];
    for j in 0..K {
        lambdas[j] = (j + 1) as f64 / m as f64;
        lambdas[K + j] = -((j + 1) as f64) / m as f64;
    }
    let steps: [f64; 2 * K] = std::array::from_fn(|j| lambdas[j].exp());
    let mut mgf = [0.0f64; 2 * K];
    let mut w = [1.0f64; 2 * K];
    for (i, &p) in probs.iter().enumerate() {
        if i % 1024 == 0 {
            // Re-anchor the running powers to stop rounding drift.
            for j in 0..2 * K {
                w[j] = (i as f64 * lambdas[j]).exp();
            }
        }
        for j in 0..2 * K {
            mgf[j] += p * w[j];
            w[j] *= steps[j];
        }
    }
    let log_term = (2.0 / tail_mass).ln();
    let (mut lo, mut hi) = (0i64, full);
    for j in 0..2 * K {
        let bound = (times as f64 * mgf[j].ln() + log_term) / lambdas[j];
        if !bound.is_finite() {
            continue;
        }
        if lambdas[j] > 0.0 {
            hi = hi.min(bound.ceil() as i64);
        } else {
            lo = lo.max(bound.floor() as i64);
        }
    }
    Some((lo.min(hi), hi))
}

/// Below this, e^x is exactly 0 in f64 (the smallest subnormal is about e^-744.4).
const EXP_UNDERFLOW: f64 = -746.0;

/// The `times`-fold self-convolution of `probs`, on index sums lo..=hi only, by one real FFT,
/// a complex power, and one inverse FFT. Mass outside [lo, hi] aliases into the window; it is
/// bounded by the Chernoff tail and accounted for by the caller.
pub fn self_convolve_window(probs: &[f64], times: u64, lo: i64, hi: i64) -> Vec<f64> {
    let n = (hi - lo + 1) as usize;
    let len = fast_len(n.max(probs.len()));
    let mut planner = RealFftPlanner::<f64>::new();
    let forward = planner.plan_fft_forward(len);
    let inverse = planner.plan_fft_inverse(len);
    let mut input = forward.make_input_vec();
    input[..probs.len()].copy_from_slice(probs);
    let mut spectrum = forward.make_output_vec();
    forward.process(&mut input, &mut spectrum).expect("fft buffers are sized by their plan");
    let t = times as f64;
    for z in spectrum.iter_mut() {
        // |z|^t underflows to exactly 0 for most bins of a smooth PMF's spectrum (|z| < 0.88
        // at t = 5708): those skip the angle (atan2) and sin_cos, the costly part.
        let log_magnitude = 0.5 * t * z.norm_sqr().ln();
        // A NaN takes the full path, so it reaches the caller's finiteness check.
        *z = if log_magnitude <= EXP_UNDERFLOW {
            Complex::new(0.0, 0.0)
        } else {
            Complex::from_polar(log_magnitude.exp(), t * z.arg())
        };
    }
    zero_edge_imaginary(&mut spectrum, len);
    let mut output = inverse.make_output_vec();
    inverse.process(&mut spectrum, &mut output).expect("fft buffers are sized by their plan");
    let scale = 1.0 / len as f64;
    (0..n).map(|k| output[(lo + k as i64).rem_euclid(len as i64) as usize] * scale).collect()
}

/// The full linear convolution of two probability vectors.
pub fn convolve(a: &[f64], b: &[f64]) -> Vec<f64> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    let n = a.len() + b.len() - 1;
    if a.len().min(b.len()) <= 32 {
        let mut out = vec![0.0; n];
        for (i, x) in a.iter().enumerate() {
            for (j, y) in b.iter().enumerate() {
                out[i + j] += x * y;
            }
        }
        return out;
    }
    let len = fast_len(n);
    let mut planner = RealFftPlanner::<f64>::new();
    let forward = planner.plan_fft_forward(len);
    let inverse = planner.plan_fft_inverse(len);
    let transform = |x: &[f64]| {
        let mut input = forward.make_input_vec();
        input[..x.len()].copy_from_slice(x);
        let mut spectrum = forward.make_output_vec();
        forward.process(&mut input, &mut spectrum).expect("fft buffers are sized by their plan");
        spectrum
    };
    let (fa, fb) = (transform(a), transform(b));
    let mut product: Vec<Complex<f64>> = fa.iter().zip(&fb).map(|(x, y)| x * y).collect();
    zero_edge_imaginary(&mut product, len);
    let mut output = inverse.make_output_vec();
    inverse.process(&mut product, &mut output).expect("fft buffers are sized by their plan");
    let scale = 1.0 / len as f64;
    output.truncate(n);
    output.iter_mut().for_each(|v| *v *= scale);
    output
}

/// The DC bin (and the Nyquist bin of an even length) of a real signal's spectrum are real;
/// rounding leaves ~1e-17 imaginary parts that the inverse transform rejects.
fn zero_edge_imaginary(spectrum: &mut [Complex<f64>], len: usize) {
    spectrum[0].im = 0.0;
    if len.is_multiple_of(2)
        && let Some(last) = spectrum.last_mut()
    {
        last.im = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_len_is_smooth_and_minimal() {
        assert_eq!(fast_len(1), 1);
        assert_eq!(fast_len(7), 8);
        assert_eq!(fast_len(11), 12);
        assert_eq!(fast_len(1000), 1000);
        assert_eq!(fast_len(1001), 1024);
    }

    #[test]
    fn fft_convolution_matches_direct() {
        let a: Vec<f64> = (0..100).map(|i| ((i * 7) % 13) as f64).collect();
        let b: Vec<f64> = (0..77).map(|i| ((i * 5) % 11) as f64).collect();
        let fast = convolve(&a, &b);
        for k in 0..fast.len() {
            let direct: f64 = (0..a.len()).filter(|&i| k >= i && k - i < b.len()).map(|i| a[i] * b[k - i]).sum();
            assert!((fast[k] - direct).abs() < 1e-8 * direct.max(1.0), "k={k}");
        }
    }

    #[test]
    fn chernoff_window_keeps_almost_all_mass() {
        let p = vec![0.2, 0.5, 0.3];
        let (lo, hi) = chernoff_bounds(&p, 1000, 1e-15).unwrap();
        assert!(lo > 0 && hi < 2000 && lo < 1100 && hi > 1100);
        let window = self_convolve_window(&p, 1000, lo, hi);
        let mass: f64 = window.iter().sum();
        assert!((mass - 1.0).abs() < 1e-12, "mass {mass}");
    }
}
