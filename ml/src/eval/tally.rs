//! Accuracy with ties split evenly, counted in integer units so that an image-blind scorer
//! lands on chance *exactly* (1/12, 1/2), not within rounding: a tie among k candidates that
//! includes the true one earns 1/k, and k ≤ 12 always divides [`UNITS`].

/// Credit for one fully correct answer: lcm(1..=12), so 1/k of it is whole for every k ≤ 12.
const UNITS: u64 = 27_720;

/// Correct answers so far, in units of 1/[`UNITS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tally {
    credit: u64,
    questions: u64,
}

impl Tally {
    /// Records one question answered with `scores` (one per candidate, the true one at
    /// `truth`): full credit if the true candidate alone scores highest, 1/k if it is one of
    /// k tied highest, none otherwise. A NaN score never wins.
    pub(super) fn record(&mut self, scores: &[f64], truth: usize) {
        self.questions += 1;
        let best = scores.iter().copied().filter(|s| !s.is_nan()).fold(f64::NEG_INFINITY, f64::max);
        if scores[truth] == best {
            let tied = scores.iter().filter(|&&s| s == best).count() as u64;
            // More than 12 candidates never happens in these tests; round down if it did.
            self.credit += UNITS / tied.min(UNITS);
        }
    }

    /// Fraction of credit earned (0 with no questions).
    pub(super) fn accuracy(&self) -> f64 {
        if self.questions == 0 { 0.0 } else { self.credit as f64 / (self.questions * UNITS) as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_split_the_credit_among_the_tied() {
        let mut t = Tally::default();
        t.record(&[1.0, 0.0], 0);
        t.record(&[0.0, 1.0], 0);
        t.record(&[2.0, 2.0], 1);
        t.record(&[f64::NAN, -1.0], 0);
        assert_eq!(t.accuracy(), 1.5 / 4.0);
        let mut t = Tally::default();
        for truth in 0..12 {
            t.record(&[0.5; 12], truth);
        }
        assert_eq!(t.accuracy(), 1.0 / 12.0);
    }
}
