//! Procedural images with no private content, for a non-private warm start (ViP and DP-Cap
//! pretrain on Shaders21k, images drawn by programs): overlaid sinusoidal gratings, a radial
//! blob and random-coloured bands, each a pure function of (seed, index). There is nothing to
//! describe, so every caption is the same placeholder (an MAE warm start ignores captions).

use image::{ImageBuffer, Rgb, RgbImage};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

use super::SynthExample;

/// The caption of every procedural image.
pub const CAPTION: &str = "a procedural image";

/// Procedural image `index` of the set with `seed`, on a `side`×`side` canvas.
pub fn generate(seed: u64, index: u64, side: u32) -> SynthExample {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5052_4f43_4544);
    rng.set_stream(index);
    let mut uniform = move || (rng.next_u64() >> 11) as f32 / (1u64 << 53) as f32;
    let gratings: Vec<[f32; 6]> = (0..3)
        .map(|_| {
            let angle = uniform() * std::f32::consts::TAU;
            let frequency = 0.1 + uniform() * 0.8; // radians per pixel
            [angle.cos() * frequency, angle.sin() * frequency, uniform() * 6.3, uniform(), uniform(), uniform()]
        })
        .collect();
    let blob = (uniform() * side as f32, uniform() * side as f32, 3.0 + uniform() * side as f32 / 3.0);
    let blob_colour = [uniform(), uniform(), uniform()];
    let image: RgbImage = ImageBuffer::from_fn(side, side, |x, y| {
        let (fx, fy) = (x as f32, y as f32);
        let mut rgb = [0.0f32; 3];
        for g in &gratings {
            let wave = 0.5 + 0.5 * (g[0] * fx + g[1] * fy + g[2]).sin();
            for (c, weight) in rgb.iter_mut().zip(&g[3..6]) {
                *c += wave * weight / 3.0;
            }
        }
        let d2 = (fx - blob.0).powi(2) + (fy - blob.1).powi(2);
        let inside = (-d2 / (2.0 * blob.2 * blob.2)).exp();
        for (c, b) in rgb.iter_mut().zip(blob_colour) {
            *c = *c * (1.0 - inside) + b * inside;
        }
        Rgb(rgb.map(|c| (c.clamp(0.0, 1.0) * 255.0) as u8))
    });
    SynthExample { key: format!("{index:09}"), caption: CAPTION.into(), label: 0, image }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procedural_images_are_reproducible_varied_and_captioned_alike() {
        let a = generate(0, 5, 32);
        assert_eq!(a, generate(0, 5, 32), "a pure function of (seed, index)");
        assert_ne!(a.image, generate(0, 6, 32).image);
        assert_ne!(a.image, generate(1, 5, 32).image);
        let distinct: std::collections::HashSet<_> = a.image.pixels().map(|p| p.0).collect();
        assert!(distinct.len() > 100, "a texture, not a flat colour: {} colours", distinct.len());
        assert_eq!(a.caption, CAPTION);
    }
}
