//! The published recipes that benchmarks and scale checks measure against, defined once.

use crate::Segment;

/// A DP-SGD recipe as a paper reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recipe {
    /// Examples N (δ = 1/N).
    pub examples: u64,
    /// Expected logical batch L = q·N.
    pub batch: u64,
    /// σ, the noise std as a multiple of the clipping norm C.
    pub noise_multiplier: f64,
    /// Steps composed.
    pub steps: u64,
}

/// DP-Cap (Sander et al. 2024): a captioner on 233.8M LAION pairs at ε = 8.
pub const DP_CAP: Recipe = Recipe { examples: 233_804_767, batch: 1_310_720, noise_multiplier: 0.728, steps: 5708 };

impl Recipe {
    /// The Poisson sampling rate q = L/N.
    pub fn sample_rate(&self) -> f64 {
        self.batch as f64 / self.examples as f64
    }

    /// δ = 1/N, the design's default.
    pub fn delta(&self) -> f64 {
        1.0 / self.examples as f64
    }

    /// The whole run as one segment.
    pub fn segment(&self) -> Segment {
        Segment { sample_rate: self.sample_rate(), noise_multiplier: self.noise_multiplier, steps: self.steps }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dp_caps_recipe_spends_about_its_published_epsilon() {
        let recipe = super::DP_CAP;
        let epsilon = crate::epsilon(crate::AccountantKind::Pld, &[recipe.segment()], recipe.delta()).unwrap();
        assert!((7.0..8.0).contains(&epsilon), "{epsilon}");
        assert!((recipe.sample_rate() - 0.005606).abs() < 1e-6);
    }
}
