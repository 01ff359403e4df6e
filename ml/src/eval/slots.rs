//! Caption slot accuracy: greedy captions of held-out pair scenes parsed back with the
//! dataset's grammar ([`Description::parse`]) and compared slot by slot with the scene. It says
//! *what* a captioner gets wrong (colours, shapes, sizes, the relation) where a single
//! likelihood number cannot. A caption outside the grammar is wrong in every slot.

use serde::Serialize;

use super::EvalError;
use dpcap_dataset::synth::Description;

/// Fraction of captions right in each slot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlotAccuracy {
    /// Colour of the first-named object.
    pub first_colour: f64,
    /// Shape of the first-named object.
    pub first_shape: f64,
    /// Size of the first-named object.
    pub first_size: f64,
    /// "above" or "left of".
    pub relation: f64,
    /// Colour of the second-named object.
    pub second_colour: f64,
    /// Shape of the second-named object.
    pub second_shape: f64,
    /// Size of the second-named object.
    pub second_size: f64,
    /// Captions that parse at all.
    pub parsed: f64,
    /// Mean of the seven slots.
    pub mean: f64,
}

/// Scores `generated` captions against the `truth` of the same scenes.
pub fn accuracy(generated: &[String], truth: &[Description]) -> Result<SlotAccuracy, EvalError> {
    if generated.len() != truth.len() || truth.is_empty() {
        return Err(EvalError::Input(format!("{} captions for {} scenes", generated.len(), truth.len())));
    }
    let mut right = [0usize; 8];
    for (text, t) in generated.iter().zip(truth) {
        let Some(g) = Description::parse(text) else { continue };
        let slots = [
            g.first.colour == t.first.colour,
            g.first.shape == t.first.shape,
            g.first.large == t.first.large,
            g.relation == t.relation,
            g.second.colour == t.second.colour,
            g.second.shape == t.second.shape,
            g.second.large == t.second.large,
            true,
        ];
        for (count, ok) in right.iter_mut().zip(slots) {
            *count += usize::from(ok);
        }
    }
    let f = right.map(|c| c as f64 / truth.len() as f64);
    Ok(SlotAccuracy {
        first_colour: f[0],
        first_shape: f[1],
        first_size: f[2],
        relation: f[3],
        second_colour: f[4],
        second_shape: f[5],
        second_size: f[6],
        parsed: f[7],
        mean: f[..7].iter().sum::<f64>() / 7.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_scored_and_garbage_is_wrong_everywhere() {
        let truth: Vec<Description> =
            ["a small red circle above a large blue square", "a large green triangle left of a small yellow circle"]
                .iter()
                .map(|c| Description::parse(c).unwrap())
                .collect();
        let perfect: Vec<String> = truth.iter().map(Description::caption).collect();
        let all = accuracy(&perfect, &truth).unwrap();
        assert_eq!((all.mean, all.parsed, all.relation), (1.0, 1.0, 1.0));
        let generated = vec![
            "a small red circle left of a small blue circle".to_owned(),
            "a large green triangle left of a small yellow".to_owned(),
        ];
        let s = accuracy(&generated, &truth).unwrap();
        assert_eq!(
            [s.first_colour, s.first_shape, s.first_size, s.relation, s.second_colour, s.second_shape, s.second_size],
            [0.5, 0.5, 0.5, 0.0, 0.5, 0.0, 0.0]
        );
        assert_eq!(s.parsed, 0.5);
        assert!((s.mean - 2.0 / 7.0).abs() < 1e-12);
        assert!(accuracy(&generated[..1], &truth).is_err());
    }
}
