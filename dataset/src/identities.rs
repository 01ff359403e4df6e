//! A user-partitioned synthetic identity dataset for DP-FedEmb, in the spirit of DigiFace:
//! each identity is a procedural glyph (three coloured parts at fixed places, on a face-like
//! disc), and each of its images varies the pose (shift and scale), lighting (brightness),
//! background colour and sensor noise. Each user owns a few identities and a few images of
//! each (`KEY.json` names the user and the identity); held-out identities, never owned by any
//! user, are for retrieval evaluation. Every image is a pure function of (seed, identity,
//! variant).

use std::io;
use std::path::{Path, PathBuf};

use image::{ImageBuffer, Rgb, RgbImage};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

use super::SynthExample;
use super::synth::write_with;

/// How a user-partitioned identity set is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityLayout {
    /// Users.
    pub users: u64,
    /// Identities each user owns.
    pub identities_per_user: u64,
    /// Images of each identity.
    pub images_per_identity: u64,
}

impl IdentityLayout {
    /// Examples per user.
    pub fn per_user(&self) -> u64 {
        self.identities_per_user * self.images_per_identity
    }

    /// Training examples.
    pub fn examples(&self) -> u64 {
        self.users * self.per_user()
    }

    /// Identities owned by users (held-out ones are numbered from here).
    pub fn identities(&self) -> u64 {
        self.users * self.identities_per_user
    }

    /// (user, identity, variant) of training example `index`.
    pub fn locate(&self, index: u64) -> (u64, u64, u64) {
        let user = index / self.per_user();
        let within = index % self.per_user();
        (user, user * self.identities_per_user + within / self.images_per_identity, within % self.images_per_identity)
    }
}

fn uniform(rng: &mut ChaCha8Rng) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32
}

/// Image `variant` of `identity`, on a `side`×`side` canvas.
pub fn render(seed: u64, identity: u64, variant: u64, side: u32) -> RgbImage {
    // The identity: three parts (shape, colour, place) and a disc tone.
    let mut id_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x4944_454e_5449_5459);
    id_rng.set_stream(identity);
    let tone = [0.45 + 0.4 * uniform(&mut id_rng), 0.35 + 0.4 * uniform(&mut id_rng), 0.3 + 0.4 * uniform(&mut id_rng)];
    let parts: Vec<(u32, [f32; 3], f32, f32, f32)> = (0..3)
        .map(|_| {
            let shape = (id_rng.next_u64() % 3) as u32;
            let colour = [uniform(&mut id_rng), uniform(&mut id_rng), uniform(&mut id_rng)];
            let (px, py) = (uniform(&mut id_rng) * 1.2 - 0.6, uniform(&mut id_rng) * 1.2 - 0.6);
            (shape, colour, px, py, 0.22 + 0.16 * uniform(&mut id_rng))
        })
        .collect();
    // The image's nuisance: pose, light, background, noise.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0056_4152_4941_4e54);
    rng.set_stream(identity.wrapping_mul(1 << 20) ^ variant);
    let s = side as f32;
    let (cx, cy) = (s / 2.0 + (uniform(&mut rng) - 0.5) * s * 0.15, s / 2.0 + (uniform(&mut rng) - 0.5) * s * 0.15);
    let radius = s * (0.33 + 0.07 * uniform(&mut rng));
    let light = 0.8 + 0.4 * uniform(&mut rng);
    // A grey background with a slight tint: the nuisance a face crop has, not a second subject.
    let grey = 0.2 + 0.6 * uniform(&mut rng);
    let background = [0; 3].map(|_| grey + (uniform(&mut rng) - 0.5) * 0.2);
    let noise_seed = rng.next_u64();
    let mut noise = ChaCha8Rng::seed_from_u64(noise_seed);
    ImageBuffer::from_fn(side, side, |x, y| {
        let (u, v) = ((x as f32 + 0.5 - cx) / radius, (y as f32 + 0.5 - cy) / radius);
        let mut c = background;
        if u * u + v * v <= 1.0 {
            c = tone.map(|t| t * light);
            for &(shape, colour, px, py, r) in &parts {
                let (du, dv) = (u - px, v - py);
                let inside = match shape {
                    0 => du * du + dv * dv <= r * r,
                    1 => du.abs() <= r && dv.abs() <= r,
                    _ => dv <= r && dv >= -r && du.abs() <= (dv + r) / 2.0,
                };
                if inside {
                    c = colour.map(|k| k * light);
                }
            }
        }
        let jitter = (uniform(&mut noise) - 0.5) * 0.1;
        Rgb(c.map(|k| ((k + jitter).clamp(0.0, 1.0) * 255.0) as u8))
    })
}

/// Training example `index`: key, its identity as caption and label, and the image.
pub fn example(seed: u64, layout: &IdentityLayout, index: u64, side: u32) -> (SynthExample, u64) {
    let (user, identity, variant) = layout.locate(index);
    let example = SynthExample {
        key: format!("u{user:07}_{index:09}"),
        caption: format!("identity {identity}"),
        label: identity as u32,
        image: render(seed, identity, variant, side),
    };
    (example, user)
}

/// Writes the training set as tar shards of `shard_users` whole users (a user's examples are
/// adjacent and in one shard); `KEY.json` holds `user`, `label` (identity) and `class`.
pub fn write_shards(
    dir: &Path,
    seed: u64,
    layout: &IdentityLayout,
    shard_users: u64,
    side: u32,
) -> io::Result<Vec<PathBuf>> {
    let shard_size = shard_users.max(1) * layout.per_user();
    write_with(dir, 0..layout.examples(), shard_size, |index| {
        let (example, user) = example(seed, layout, index, side);
        let meta =
            format!("{{\"user\":\"user-{user:07}\",\"label\":{},\"class\":\"{}\"}}", example.label, example.caption);
        (example, meta)
    })
}

/// Held-out identities for retrieval: `identities` identities numbered after every owned one,
/// `images` images each (variants past any training variant), labelled with their identity.
pub fn heldout(seed: u64, layout: &IdentityLayout, identities: u64, images: u64, side: u32) -> Vec<SynthExample> {
    let first = layout.identities();
    (first..first + identities)
        .flat_map(|id| {
            (0..images).map(move |v| SynthExample {
                key: format!("heldout-identity-{id}-{v}"),
                caption: format!("identity {id}"),
                label: id as u32,
                image: render(seed, id, HELDOUT_VARIANT + v, side),
            })
        })
        .collect()
}

/// The first variant of a held-out image: training variants stay below it.
pub const HELDOUT_VARIANT: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: IdentityLayout = IdentityLayout { users: 5, identities_per_user: 2, images_per_identity: 3 };

    #[test]
    fn every_example_belongs_to_its_users_own_identities() {
        for index in 0..LAYOUT.examples() {
            let (user, identity, variant) = LAYOUT.locate(index);
            assert_eq!(identity / LAYOUT.identities_per_user, user, "example {index}");
            assert!(variant < LAYOUT.images_per_identity);
        }
        assert_eq!(LAYOUT.locate(LAYOUT.examples() - 1), (4, 9, 2));
    }

    #[test]
    fn images_are_pure_functions_of_seed_identity_and_variant_and_variants_differ() {
        assert_eq!(render(1, 3, 0, 16), render(1, 3, 0, 16));
        assert_ne!(render(1, 3, 0, 16), render(1, 3, 1, 16), "variants vary the pose and light");
        assert_ne!(render(1, 3, 0, 16), render(1, 4, 0, 16), "identities differ");
    }

    #[test]
    fn held_out_identities_are_owned_by_no_user() {
        let held = heldout(0, &LAYOUT, 3, 2, 16);
        assert_eq!(held.len(), 6);
        assert!(held.iter().all(|e| u64::from(e.label) >= LAYOUT.identities()));
    }
}
