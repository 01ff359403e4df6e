//! ARO-style contrasts (Yuksekgonul et al., "When and why vision-language models behave like
//! bags-of-words"): does the model find the true caption of a scene likelier than a foil that
//! uses the same words in another order?
//!
//! Each foil is an involution of the description (applying it twice gives the truth back), and
//! every set holds scenes in mirrored pairs: a held-out scene and the scene the foil describes
//! (same layout). In the mirror the true caption and the foil trade places, so a scorer whose
//! likelihoods ignore the image wins exactly one of the two (or ties both): exactly 50 %.

use super::EvalError;
use super::heldout::pair_scenes;
use super::likelihood::{CaptionScorer, Span};
use super::tally::Tally;
use dpcap_dataset::Example;
use dpcap_dataset::synth::{Description, Object, PairScene, Relation};

/// Which words a foil exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contrast {
    /// VG-Relation: "a A rel a B" vs "a B rel a A" (the objects must differ).
    Relation,
    /// VG-Attribution: the two objects' colours exchanged (the colours must differ).
    Attribution,
    /// Layout: "above" vs "left of".
    Layout,
}

impl Contrast {
    /// All contrasts, in report order.
    pub const ALL: [Contrast; 3] = [Contrast::Relation, Contrast::Attribution, Contrast::Layout];

    /// Whether the foil of `d` is a different caption (else the question has no answer).
    pub fn admits(self, d: &Description) -> bool {
        self.foil(d) != *d
    }

    /// The foil: the caption a model that ignores this aspect finds as likely as the truth.
    pub fn foil(self, d: &Description) -> Description {
        match self {
            Contrast::Relation => Description { first: d.second, relation: d.relation, second: d.first },
            Contrast::Attribution => Description {
                first: Object { colour: d.second.colour, ..d.first },
                relation: d.relation,
                second: Object { colour: d.first.colour, ..d.second },
            },
            Contrast::Layout => Description {
                relation: match d.relation {
                    Relation::Above => Relation::LeftOf,
                    Relation::LeftOf => Relation::Above,
                },
                ..*d
            },
        }
    }

    /// `pairs` mirrored pairs of held-out scenes: each admitted held-out scene followed by the
    /// scene its foil describes, with the same layout.
    pub fn scenes(self, seed: u64, pairs: usize) -> Vec<PairScene> {
        let mut out = Vec::with_capacity(2 * pairs);
        // Every contrast admits well over a third of random scenes; scan in growing windows.
        let mut window = 2 * pairs + 16;
        while out.len() < 2 * pairs {
            out.clear();
            for scene in pair_scenes(seed, window).into_iter().filter(|s| self.admits(&s.description)) {
                if out.len() == 2 * pairs {
                    break;
                }
                out.push(scene);
                out.push(PairScene { description: self.foil(&scene.description), ..scene });
            }
            window *= 2;
        }
        out
    }
}

/// Fraction of `images` (rendered from `scenes`, same order) whose true caption `scorer` finds
/// likelier than the foil; a tie counts one half.
pub fn accuracy(
    scorer: &dyn CaptionScorer,
    contrast: Contrast,
    scenes: &[PairScene],
    images: &[Example],
) -> Result<f64, EvalError> {
    if scenes.len() != images.len() {
        return Err(EvalError::Input(format!("{} scenes for {} images", scenes.len(), images.len())));
    }
    if let Some(s) = scenes.iter().find(|s| !contrast.admits(&s.description)) {
        return Err(EvalError::Input(format!(
            "{contrast:?} cannot ask about {:?}: its foil is the same caption",
            s.description.caption()
        )));
    }
    let rows: Vec<(usize, String)> = scenes
        .iter()
        .enumerate()
        .flat_map(|(i, s)| [(i, s.description.caption()), (i, contrast.foil(&s.description).caption())])
        .collect();
    let scores = scorer.score(images, &rows, Span::Caption)?;
    let mut tally = Tally::default();
    for pair in scores.chunks(2) {
        tally.record(pair, 0);
    }
    Ok(tally.accuracy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foils_are_involutions_and_sets_come_in_mirrored_pairs() {
        for contrast in Contrast::ALL {
            let scenes = contrast.scenes(0, 40);
            assert_eq!(scenes.len(), 80);
            for pair in scenes.chunks(2) {
                let (a, b) = (pair[0].description, pair[1].description);
                assert!(contrast.admits(&a), "{contrast:?} {}", a.caption());
                assert_eq!(contrast.foil(&a), b);
                assert_eq!(contrast.foil(&b), a);
                assert_eq!(pair[0].jitter, pair[1].jitter);
            }
        }
        let d = Description::parse("a small red circle above a large blue square").unwrap();
        assert_eq!(Contrast::Relation.foil(&d).caption(), "a large blue square above a small red circle");
        assert_eq!(Contrast::Attribution.foil(&d).caption(), "a small blue circle above a large red square");
        assert_eq!(Contrast::Layout.foil(&d).caption(), "a small red circle left of a large blue square");
        let same = Description::parse("a small red circle above a small red circle").unwrap();
        assert!(!Contrast::Relation.admits(&same) && !Contrast::Attribution.admits(&same));
        assert!(Contrast::Layout.admits(&same));
    }
}
