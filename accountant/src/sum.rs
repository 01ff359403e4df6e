//! The sum of a step's W parts, built as they arrive. One part (the GPU path: rank 0 sends the
//! all-reduced sum) is kept as it came, in f32, and never copied; a second part turns the sum
//! into f64, so that adding W parts rounds once, at the release, not W times.

/// Σ of the parts received so far.
#[derive(Debug, Default)]
pub enum Sum {
    /// No part yet.
    #[default]
    Empty,
    /// Exactly one part.
    One(Vec<f32>),
    /// Two or more parts, in f64.
    Many(Vec<f64>),
}

impl Sum {
    /// Adds a part (all parts of a step have the job's dimension).
    pub fn add(&mut self, part: Vec<f32>) {
        *self = match std::mem::take(self) {
            Sum::Empty => Sum::One(part),
            Sum::One(first) => Sum::Many(first.iter().zip(&part).map(|(a, b)| f64::from(*a) + f64::from(*b)).collect()),
            Sum::Many(mut sum) => {
                sum.iter_mut().zip(&part).for_each(|(s, v)| *s += f64::from(*v));
                Sum::Many(sum)
            }
        };
    }

    /// Coordinates.
    pub fn len(&self) -> usize {
        match self {
            Sum::Empty => 0,
            Sum::One(v) => v.len(),
            Sum::Many(v) => v.len(),
        }
    }

    /// True before the first part.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Coordinate `i` (in range; 0 before the first part). The release reads the sum as slices.
    #[cfg(test)]
    fn at(&self, i: usize) -> f64 {
        match self {
            Sum::Empty => 0.0,
            Sum::One(v) => f64::from(v[i]),
            Sum::Many(v) => v[i],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_in_f64_without_rounding_each_time() {
        let mut sum = Sum::default();
        sum.add(vec![1.0e8, 1.0]);
        assert_eq!(sum.at(0), 1.0e8);
        sum.add(vec![1.0, 2.0]);
        sum.add(vec![1.0, 3.0]);
        // 1e8 + 1 + 1 is not representable in f32 (it would round to 1e8 + 0 each time).
        assert_eq!(sum.at(0), 100_000_002.0);
        assert_eq!((sum.len(), sum.at(1)), (2, 6.0));
    }
}
