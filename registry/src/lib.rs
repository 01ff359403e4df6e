//! The model registry: every model configuration a job can name (micro, bench, tiny, small,
//! base, large), for each objective ([`Family`]: caption, mae, fedemb), the parameter count P of
//! each, and what a checkpoint of one is ([`Manifest`]).
//!
//! It owns the shapes, not the layers: the burn models in `dpcap-ml` are built from these
//! configurations, and a test there holds [`parameter_count`] equal to the count of every built
//! model. The coordinator reads P here at submit, before any worker exists, to register the
//! job's gradient dimension with the accountant, and reads checkpoint manifests here with the
//! same type the workers write. This crate must never depend on burn or on any service: it is
//! plain data and arithmetic.

mod fedemb;
mod manifest;
mod objective;

pub use fedemb::{FedEmb, ServerOptimizer};
pub use manifest::Manifest;
// Every item of `objective` is public surface: the objectives, their configurations and P.
pub use objective::*;

/// Every configuration name, smallest first.
pub const NAMES: [&str; 6] = ["micro", "bench", "tiny", "small", "base", "large"];

/// Linear d_in → d_out: weight and bias.
const fn linear(d_in: usize, d_out: usize) -> usize {
    d_in * d_out + d_out
}

/// LayerNorm over d: gamma and beta.
const fn layer_norm(d: usize) -> usize {
    2 * d
}

/// A pre-norm transformer block of width d: self-attention (q, k, v, o), a cross-attention with
/// its own norm in decoders, and the 4·d MLP.
const fn block(d: usize, decoder: bool) -> usize {
    let attention = 4 * linear(d, d);
    let cross = if decoder { layer_norm(d) + attention } else { 0 };
    layer_norm(d) + attention + cross + layer_norm(d) + linear(d, 4 * d) + linear(4 * d, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_resolves_in_every_family_and_unknown_names_do_not() {
        for family in Family::ALL {
            for name in NAMES {
                assert!(parameter_count(family, name).is_some_and(|p| p > 0), "{family:?} {name}");
            }
            assert_eq!(parameter_count(family, "huge"), None);
        }
    }

    #[test]
    fn the_base_captioner_has_the_papers_parameter_count() {
        // ViT-B/16 encoder (85.8M with its 196 positions) and a 6-block decoder of width 768
        // with cross-attention and an untied 30,522-token head: DP-Cap's 190M-parameter base.
        let p = parameter_count(Family::Captioner, "base").unwrap();
        assert_eq!(p, 190_042_170);
    }

    #[test]
    fn a_vit_b_forward_costs_what_the_literature_counts() {
        // ViT-B/16 at 224: 17.6 G multiply-adds in the usual tables (which call them FLOPs),
        // so about 35 GFLOPs at 2 per multiply-add.
        let base = CaptionerConfig::named("base").unwrap();
        let encoder = base.encoder.forward_flops() as f64 / 1e9;
        assert!((34.5..35.5).contains(&encoder), "{encoder} GFLOPs");
        // The decoder adds its 39 tokens, the cross-attention over 196 and the 30,522-way head.
        let total = base.forward_flops() as f64 / 1e9;
        assert!(total > encoder + 5.0 && total < encoder + 10.0, "{total} GFLOPs");
        assert_eq!(base.train_flops(), 3 * base.forward_flops());
    }
}
