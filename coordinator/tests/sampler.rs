//! The PoissonSampler draws each example independently with probability q, reproducibly per
//! (secret, step), whatever the number of workers; work units cover the sample exactly.

use dpcap_coordinator::SamplerError;
use dpcap_coordinator::{JobSecret, PoissonSampler, split_work};
use dpcap_dataset::index::Layout;

fn sampler(secret: u8, n: u64, q: f64) -> PoissonSampler {
    PoissonSampler::new(JobSecret([secret; 32]), n, q).unwrap()
}

#[test]
fn a_step_is_reproducible_and_keyed_by_secret_and_step() {
    let s = sampler(1, 10_000, 0.01);
    assert_eq!(s.sample(5), s.sample(5));
    assert_ne!(s.sample(5), s.sample(6));
    assert_ne!(s.sample(5), sampler(2, 10_000, 0.01).sample(5));
    let batch = s.sample(5);
    assert!(batch.windows(2).all(|w| w[0] < w[1]) && *batch.last().unwrap() < 10_000);
}

#[test]
fn inclusion_is_independent_with_probability_q() {
    let (n, q, steps) = (1000u64, 0.1, 2000u64);
    let s = sampler(3, n, q);
    let mut counts = vec![0u64; n as usize];
    let mut sizes = Vec::new();
    let mut neighbours = 0u64;
    for t in 0..steps {
        let batch = s.sample(t);
        sizes.push(batch.len() as f64);
        for &i in &batch {
            counts[i as usize] += 1;
        }
        neighbours += batch.windows(2).filter(|w| w[1] == w[0] + 1).count() as u64;
    }
    let mean = sizes.iter().sum::<f64>() / steps as f64;
    let var = sizes.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (steps - 1) as f64;
    assert!((mean - 100.0).abs() < 1.5, "mean batch size {mean}, expected qN = 100");
    assert!((70.0..110.0).contains(&var), "batch size variance {var}, expected Nq(1-q) = 90");
    // χ² over per-example inclusion counts: 1000 degrees of freedom, mean 1000, sd ~45.
    let expected = steps as f64 * q;
    let chi2: f64 = counts.iter().map(|&c| (c as f64 - expected).powi(2) / (expected * (1.0 - q))).sum();
    assert!((800.0..1200.0).contains(&chi2), "chi-square {chi2}");
    // Both of two adjacent examples sampled: probability q² each, independently.
    let trials = (steps * (n - 1)) as f64;
    let want = trials * q * q;
    assert!((neighbours as f64 - want).abs() < 5.0 * want.sqrt(), "adjacent pairs {neighbours}, expected {want}");
}

#[test]
fn edge_rates_and_bad_parameters() {
    assert_eq!(sampler(1, 7, 1.0).sample(0), (0..7).collect::<Vec<_>>());
    assert_eq!(PoissonSampler::new(JobSecret([0; 32]), 10, 0.0).unwrap_err(), SamplerError::Rate(0.0));
    assert_eq!(PoissonSampler::new(JobSecret([0; 32]), 10, 1.5).unwrap_err(), SamplerError::Rate(1.5));
    assert_eq!(PoissonSampler::new(JobSecret([0; 32]), 0, 0.5).unwrap_err(), SamplerError::Empty);
    let big = sampler(9, 233_804_767, 1_310_720.0 / 233_804_767.0);
    let batch = big.sample(0);
    assert!((batch.len() as f64 - 1_310_720.0).abs() < 5.0 * 1_310_720f64.sqrt(), "{}", batch.len());
    assert!((big.expected_batch_size() - 1_310_720.0).abs() < 1e-6);
}

#[test]
fn work_units_cover_the_sample_for_any_number_of_ranks_in_even_shares() {
    let layout = Layout::from_counts(&[300, 300, 400]);
    let batch = sampler(4, 1000, 0.2).sample(1);
    for world in [1usize, 2, 3, 7] {
        let ranks = split_work(&batch, &layout, world);
        assert_eq!(ranks.len(), world);
        let mut covered: Vec<u64> = Vec::new();
        for units in &ranks {
            for unit in units {
                let base = [0u64, 300, 600][unit.shard];
                assert!(unit.indices.iter().all(|&i| i < [300, 300, 400][unit.shard]));
                covered.extend(unit.indices.iter().map(|i| base + i));
            }
        }
        assert_eq!(covered, batch, "{world} ranks: the ranks' units are exactly the sample");
        for units in &ranks {
            let got = units.iter().map(|u| u.indices.len()).sum::<usize>();
            let (floor, ceil) = (batch.len() / world, batch.len().div_ceil(world));
            assert!((floor..=ceil).contains(&got), "{world} ranks: share {got} of {}", batch.len());
        }
    }
    assert!(split_work(&[], &layout, 2).iter().all(|units| units.is_empty()), "ranks with no examples get empty lists");
}

/// The paper's step for one rank (L = 1.31M examples of N = 233.8M in LAION's 23,381 shards,
/// W = 1) is one StepWork message under the WorkerService limit, and the linear-time split
/// puts every example where a binary-search lookup does.
#[test]
fn the_papers_step_for_a_single_rank_fits_in_one_message() {
    use prost::Message;
    let (n, shards) = (233_804_767u64, 23_381u64);
    let counts: Vec<u64> = (0..shards).map(|s| n / shards + u64::from(s < n % shards)).collect();
    let layout = Layout::from_counts(&counts);
    let batch = sampler(11, n, 1_310_720.0 / n as f64).sample(3);
    let mut ranks = split_work(&batch, &layout, 1);
    let units = ranks.pop().unwrap();
    for (i, &global) in batch.iter().enumerate().step_by(997) {
        let (shard, local) = layout.locate(global).unwrap();
        let unit = units.iter().find(|u| u.shard == shard).expect("the shard has a unit");
        assert!(unit.indices.contains(&local), "example {i} ({global})");
    }
    let message = dpcap_coordinator::step_work(3, dpcap_coordinator::example_units(units), false);
    let bytes = message.encoded_len();
    assert!(bytes < dpcap_proto::MAX_WORK_MESSAGE_BYTES, "{bytes} bytes");
    assert!(bytes < 3 << 20, "about 2 bytes per example: {bytes} bytes for {}", batch.len());
}
