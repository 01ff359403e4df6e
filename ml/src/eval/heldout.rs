//! Held-out synthetic scenes. Training sets are written from index 0 upward (`dpctl dataset
//! synth`: training then eval examples; the demo: training examples), so held-out scenes come
//! from the same generators and seed at indices from [`HELDOUT_START`] = 2^40 upward, far past
//! any dataset's size: a different ChaCha stream per index, hence draws independent of every
//! training example. Each set has its own block of 2^32 indices so that sets never share an
//! image. (With 28,800 distinct pair scenes, a held-out scene can still *look* like a
//! training one; it was never a training example.)

use rayon::prelude::*;

use super::EvalError;
use dpcap_dataset::Example;
use dpcap_dataset::SynthExample;
use dpcap_dataset::pipeline::{Crop, Pipeline};
use dpcap_dataset::synth::{self, PairScene};

/// The first held-out index.
pub const HELDOUT_START: u64 = 1 << 40;

/// Indices per held-out set.
const BLOCK: u64 = 1 << 32;

/// The held-out sets, each a block of indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Pair scenes: caption slots and the seeds of the contrast sets.
    Pairs,
    /// Single shapes for zero-shot classification.
    ZeroShot,
    /// Single shapes for the linear and few-shot probes.
    Probe,
}

impl Split {
    /// The generator index of the `i`-th example of this split.
    pub fn index(self, i: u64) -> u64 {
        let block = match self {
            Split::Pairs => 0,
            Split::ZeroShot => 1,
            Split::Probe => 2,
        };
        HELDOUT_START + block * BLOCK + i
    }
}

/// The first `count` held-out pair scenes.
pub fn pair_scenes(seed: u64, count: usize) -> Vec<PairScene> {
    (0..count as u64).map(|i| PairScene::sample(seed, Split::Pairs.index(i))).collect()
}

/// `per_class` held-out single-shape examples of each of the 12 classes, grouped by class in
/// label order: the first ones of each class in the zero-shot split.
pub fn balanced_singles(seed: u64, per_class: usize, side: u32) -> Vec<SynthExample> {
    let mut by_class: Vec<Vec<SynthExample>> = vec![Vec::new(); synth::CLASSES];
    let mut i = 0;
    while by_class.iter().any(|c| c.len() < per_class) {
        let e = synth::generate_single(seed, Split::ZeroShot.index(i), side);
        i += 1;
        let class = &mut by_class[e.label as usize];
        if class.len() < per_class {
            class.push(e);
        }
    }
    by_class.into_iter().flatten().collect()
}

/// The first `count` held-out single-shape examples of the probe split.
pub fn probe_singles(seed: u64, count: usize, side: u32) -> Vec<SynthExample> {
    (0..count as u64).into_par_iter().map(|i| synth::generate_single(seed, Split::Probe.index(i), side)).collect()
}

/// Renders `scenes` as labelled examples.
pub fn render_pairs(scenes: &[PairScene], side: u32) -> Vec<SynthExample> {
    scenes
        .par_iter()
        .enumerate()
        .map(|(i, scene)| SynthExample {
            key: format!("heldout-pair-{i}"),
            caption: scene.description.caption(),
            label: scene.description.first.class(),
            image: scene.render(side),
        })
        .collect()
}

/// Examples ready for a model of `side` px: each image through the evaluation crop, as the
/// training data's images go through the pipeline.
pub fn prepare(examples: &[SynthExample], pipeline: &Pipeline) -> Result<Vec<Example>, EvalError> {
    examples
        .par_iter()
        .map(|e| {
            let pixels = pipeline
                .transform(&e.image, &Crop::Eval)
                .map_err(|source| EvalError::Image { key: e.key.clone(), source })?;
            Ok(Example { key: e.key.clone(), pixels, caption: e.caption.clone(), label: Some(e.label) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_indices_never_reach_into_training_ranges_or_each_other() {
        // The largest training range any writer uses is 0..N (+ eval examples) with N < 2^40.
        let splits = [Split::Pairs, Split::ZeroShot, Split::Probe];
        for (k, split) in splits.iter().enumerate() {
            assert_eq!(split.index(0), HELDOUT_START + k as u64 * BLOCK);
            assert!(split.index(BLOCK - 1) < HELDOUT_START + (k as u64 + 1) * BLOCK);
        }
        // The scenes themselves are the generator's at those indices, not at training ones.
        let scenes = pair_scenes(0, 50);
        for (i, scene) in scenes.iter().enumerate() {
            assert_eq!(*scene, PairScene::sample(0, HELDOUT_START + i as u64));
            assert_eq!(scene.description.caption(), synth::generate(0, HELDOUT_START + i as u64, 32).caption);
        }
        // Single-shape examples carry their generator index as the key.
        let index = |e: &SynthExample| e.key.parse::<u64>().unwrap();
        for e in balanced_singles(0, 2, 32) {
            assert!((Split::ZeroShot.index(0)..Split::Probe.index(0)).contains(&index(&e)), "{}", e.key);
        }
        for e in probe_singles(0, 20, 32) {
            assert!((Split::Probe.index(0)..Split::Probe.index(BLOCK)).contains(&index(&e)), "{}", e.key);
        }
    }

    #[test]
    fn singles_are_class_balanced() {
        let set = balanced_singles(0, 3, 32);
        assert_eq!(set.len(), 36);
        for (i, e) in set.iter().enumerate() {
            assert_eq!(e.label as usize, i / 3);
            assert_eq!(e.caption.split_whitespace().count(), 4, "{}", e.caption);
        }
    }
}
