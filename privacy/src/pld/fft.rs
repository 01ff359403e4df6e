//! FFT convolutions of probability vectors (indices are losses in units of the grid width).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use realfft::num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};

/// A forward and inverse real FFT of one length.
#[derive(Clone)]
struct Plan {
    len: usize,
    forward: Arc<dyn RealToComplex<f64>>,
    inverse: Arc<dyn ComplexToReal<f64>>,
}

/// Most FFT points the plan cache keeps, over all its plans (a plan's twiddles take about
/// 24 bytes a point for both directions: about 50 MB here). Computing the twiddles (a sine and
/// cosine each) costs more than the transforms themselves, and the same lengths recur: an
/// accountant recomputes ε at each step with the same grid, a calibration retries nearby σ.
const CACHED_POINTS: usize = 1 << 21;

/// Recently used plans, newest first, within [`CACHED_POINTS`].
static PLANS: Mutex<VecDeque<Plan>> = Mutex::new(VecDeque::new());

/// The plan of length `len`: from the cache, or made (outside the lock) and cached.
fn plan(len: usize) -> Plan {
    let cached = {
        let mut plans = PLANS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let found = plans.iter().position(|p| p.len == len).and_then(|i| plans.remove(i));
        if let Some(p) = &found {
            plans.push_front(p.clone());
        }
        found
    };
    if let Some(p) = cached {
        return p;
    }
    let mut planner = RealFftPlanner::<f64>::new();
    let made = Plan { len, forward: planner.plan_fft_forward(len), inverse: planner.plan_fft_inverse(len) };
    if len <= CACHED_POINTS {
        let mut plans = PLANS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !plans.iter().any(|p| p.len == len) {
            plans.push_front(made.clone());
        }
        let mut kept = 0;
        plans.retain(|p| {
            kept += p.len;
            kept <= CACHED_POINTS
        });
    }
    made
}

/// The smallest length ≥ n of the form 2^k·m/8 with m in {8, 9, 10, 12, 15}: 2-, 3- and
/// 5-smooth (the FFT runs at full speed), at most 1.25× n, and sparse enough that the windows
/// of nearby step counts share a length, and so a cached plan (see [`plan`]). Up to 16 points,
/// n itself: a transform that small costs nothing whatever its factors.
pub fn fast_len(n: usize) -> usize {
    if n <= 16 {
        return n.max(1);
    }
    let octave = n.next_power_of_two() / 2; // octave < n <= 2·octave
    [9, 10, 12, 15, 16].iter().map(|m| octave / 8 * m).find(|&len| len >= n).unwrap_or(2 * octave)
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
/// bounded by the Chernoff tail and accounted for by the caller. `times` is at most
/// [`super::MAX_POWER`].
pub fn self_convolve_window(probs: &[f64], times: u64, lo: i64, hi: i64) -> Vec<f64> {
    let n = (hi - lo + 1) as usize;
    let len = fast_len(n.max(probs.len()));
    let Plan { forward, inverse, .. } = plan(len);
    // One signal buffer (input, then output) and one scratch for both transforms: every fresh
    // buffer of this size costs its pages' first-touch faults, a large share of the time.
    let mut signal = vec![0.0; len];
    signal[..probs.len()].copy_from_slice(probs);
    let mut spectrum = forward.make_output_vec();
    let mut scratch = vec![Complex::new(0.0, 0.0); forward.get_scratch_len().max(inverse.get_scratch_len())];
    forward
        .process_with_scratch(&mut signal, &mut spectrum, &mut scratch)
        .expect("fft buffers are sized by their plan");
    power(&mut spectrum, times);
    zero_edge_imaginary(&mut spectrum, len);
    inverse
        .process_with_scratch(&mut spectrum, &mut signal, &mut scratch)
        .expect("fft buffers are sized by their plan");
    // Index sum lo + k sits at (lo + k) mod len: rotate it to k, keep the window, rescale.
    signal.rotate_left(lo.rem_euclid(len as i64) as usize);
    signal.truncate(n);
    let scale = 1.0 / len as f64;
    signal.iter_mut().for_each(|v| *v *= scale);
    signal
}

/// Raises every transformed value to the power `times` in place. |z|^t underflows to exactly 0
/// for most bins of a smooth PMF's spectrum (|z| < 0.88 at t = 5708): those are set to 0 by
/// one comparison of |z|² with the bound. The others are raised by repeated squaring (about
/// 2·log2 t complex products, with the rounding of t products, as the polar form's t·arg has),
/// which costs less than the logarithm, arctangent, exponential and sine/cosine of the polar
/// form. A NaN fails the comparison and stays NaN, so it reaches the caller's finiteness check.
fn power(spectrum: &mut [Complex<f64>], times: u64) {
    let exponent = u32::try_from(times).expect("at most MAX_POWER runs reach the FFT power");
    // |z|^t <= e^EXP_UNDERFLOW  <=>  |z|² <= e^(2·EXP_UNDERFLOW / t).
    let vanishes = (2.0 * EXP_UNDERFLOW / times as f64).exp();
    for z in spectrum.iter_mut() {
        *z = if z.norm_sqr() <= vanishes { Complex::new(0.0, 0.0) } else { z.powu(exponent) };
    }
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
    let Plan { forward, inverse, .. } = plan(len);
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
    fn fast_lengths_are_smooth_sparse_and_within_a_quarter_of_the_need() {
        assert_eq!(fast_len(1), 1);
        assert_eq!(fast_len(11), 11);
        assert_eq!(fast_len(17), 18);
        assert_eq!(fast_len(1000), 1024);
        assert_eq!(fast_len(1025), 1152);
        assert_eq!(fast_len(345_224), 393_216);
        for n in [17, 100, 97, 1000, 4097, 345_224, 468_499, 1 << 20, (1 << 20) + 1] {
            let len = fast_len(n);
            assert!(len >= n && (len as f64) <= 1.25 * n as f64, "{n} -> {len}");
            let mut rest = len;
            for p in [2, 3, 5] {
                while rest.is_multiple_of(p) {
                    rest /= p;
                }
            }
            assert_eq!(rest, 1, "{len} is not 5-smooth");
        }
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
    fn the_power_by_squaring_matches_the_polar_form_and_zeroes_what_underflows() {
        let t = 5708u64;
        let values: Vec<Complex<f64>> = (0..2000)
            .map(|i| Complex::from_polar(1.0 - i as f64 * 1e-5, i as f64 * 0.37))
            .chain([Complex::new(0.5, 0.5), Complex::new(f64::NAN, 0.0)])
            .collect();
        let mut raised = values.clone();
        power(&mut raised, t);
        for (z, got) in values.iter().zip(&raised).take(2000) {
            let want = Complex::from_polar(z.norm().powf(t as f64), z.arg() * t as f64);
            assert!((got - want).norm() <= 1e-11, "{z}^{t}: {got} vs {want}");
        }
        assert_eq!(raised[2000], Complex::new(0.0, 0.0), "0.71^5708 is below the smallest f64");
        assert!(raised[2001].re.is_nan(), "a NaN must reach the finiteness check");
    }

    #[test]
    fn cached_plans_give_the_same_convolutions_and_stay_within_their_bound() {
        let p: Vec<f64> = (0..3000).map(|i| ((i * 7919) % 1000) as f64 / 1e6).collect();
        let first = self_convolve_window(&p, 50, 0, 40_000);
        for len in [1 << 20, 3 << 18, 5 << 17] {
            plan(len); // other lengths push the first plan towards eviction
        }
        assert_eq!(first, self_convolve_window(&p, 50, 0, 40_000));
        let plans = PLANS.lock().unwrap();
        assert!(plans.iter().map(|p| p.len).sum::<usize>() <= CACHED_POINTS);
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
