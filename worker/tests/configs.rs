//! The named captioner configurations and their parameter counts.

use burn::tensor::backend::AutodiffBackend;
use dpcap_worker::CpuBackend;
use dpcap_worker::model::{Captioner, CaptionerConfig};
use dpcap_worker::params::ParamSet;

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

fn count(name: &str) -> usize {
    let mut ps = ParamSet::<Inner>::specs_only(&Default::default());
    Captioner::new(&mut ps, CaptionerConfig::named(name).unwrap());
    ps.numel()
}

#[test]
fn parameter_counts_grow_with_size_and_base_is_about_190m() {
    let counts: Vec<usize> = CaptionerConfig::NAMES.iter().map(|n| count(n)).collect();
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
    let base = count("base");
    assert!((185_000_000..195_000_000).contains(&base), "base has {base} parameters");
    assert!(CaptionerConfig::named("huge").is_none());
}

#[test]
fn bench_config_is_the_issue_shape() {
    let c = CaptionerConfig::named("bench").unwrap();
    assert_eq!(
        (c.encoder.image, c.encoder.patch, c.encoder.width, c.encoder.depth, c.encoder.heads),
        (32, 4, 128, 4, 4)
    );
    assert_eq!((c.dec_width, c.dec_depth, c.dec_heads, c.vocab, c.seq), (128, 2, 4, 1000, 16));
}
