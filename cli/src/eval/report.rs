//! Presenting suite reports: a table for people, and the demo's flat `report.json` keys
//! (`zero_shot_dp`, `few_shot_5_random`, …) for any number of named models, so that a further
//! model (a non-private baseline) is one more entry.

use std::fmt::Write;

use serde_json::{Map, Value, json};

use super::suite::SuiteReport;

/// Chance level of a 12-way classification.
const CHANCE_12: f64 = 1.0 / 12.0;

/// The metrics one row each: (report key, label, value, chance).
fn rows(r: &SuiteReport) -> Vec<(&'static str, &'static str, Option<f64>, f64)> {
    vec![
        ("zero_shot", "zero-shot (12 classes)", r.zero_shot, CHANCE_12),
        ("aro_relation", "ARO relation", r.aro_relation, 0.5),
        ("aro_attribution", "ARO attribution", r.aro_attribution, 0.5),
        ("layout", "layout (above / left of)", r.layout, 0.5),
        ("probe_accuracy", "linear probe", Some(r.probe_accuracy), CHANCE_12),
        ("few_shot_1", "1-shot probe", Some(r.few_shot_1), CHANCE_12),
        ("few_shot_5", "5-shot probe", Some(r.few_shot_5), CHANCE_12),
        ("few_shot_10", "10-shot probe", Some(r.few_shot_10), CHANCE_12),
    ]
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3}"))
}

/// The report as an aligned table with chance levels, slot accuracies and sample captions.
/// With `random` (the same suite on a randomly initialised model: the floor a trained encoder
/// must beat, which on these scenes is far above chance), its values are a column beside, and a
/// row below it is marked.
pub fn table(r: &SuiteReport, random: Option<&SuiteReport>) -> String {
    let mut out = String::new();
    let floors: Vec<Option<f64>> = match random {
        Some(random) => rows(random).into_iter().map(|(_, _, value, _)| value).collect(),
        None => vec![None; rows(r).len()],
    };
    let _ = write!(out, "{:<28} {:>7} {:>7}", "metric", "value", "chance");
    let _ = writeln!(out, "{}", if random.is_some() { format!(" {:>7}", "random") } else { String::new() });
    for ((_, label, value, chance), floor) in rows(r).into_iter().zip(floors) {
        let _ = write!(out, "{label:<28} {:>7} {chance:>7.3}", cell(value));
        if random.is_some() {
            let _ = write!(out, " {:>7}", cell(floor));
        }
        let below = matches!((value, floor), (Some(v), Some(f)) if v < f);
        let _ = writeln!(out, "{}", if below { "  < below the random-init encoder" } else { "" });
    }
    match &r.caption_slot_accuracy {
        Some(s) => {
            let _ = writeln!(out, "{:<28} {:>7}", "caption slots (mean)", cell(Some(s.mean)));
            for (label, v) in [
                ("first colour", s.first_colour),
                ("first shape", s.first_shape),
                ("first size", s.first_size),
                ("relation", s.relation),
                ("second colour", s.second_colour),
                ("second shape", s.second_shape),
                ("second size", s.second_size),
                ("parsed", s.parsed),
            ] {
                let _ = writeln!(out, "  {label:<26} {:>7}", cell(Some(v)));
            }
        }
        None => {
            let _ = writeln!(out, "{:<28} {:>7}", "caption slots (mean)", "n/a");
        }
    }
    for c in &r.captions {
        let _ = writeln!(out, "caption: {:?} -> {:?}", c.reference, c.generated);
    }
    let i = r.images;
    let _ = write!(
        out,
        "held-out images: zero-shot {}, each contrast {}, slots {}, probes {}; {:.1} s",
        i.zero_shot, i.contrast, i.slots, i.probe, r.seconds
    );
    out
}

/// The report keys of `r`'s metrics that score below `random`'s (a randomly initialised model).
pub fn below(r: &SuiteReport, random: &SuiteReport) -> Vec<&'static str> {
    let floors = rows(random);
    rows(r)
        .into_iter()
        .zip(floors)
        .filter(|((_, _, value, _), (_, _, floor, _))| matches!((value, floor), (Some(v), Some(f)) if v < f))
        .map(|((key, ..), _)| key)
        .collect()
}

/// Flat keys for each named report: `{metric}_{name}` for every metric, and
/// `caption_slot_accuracy` as an object keyed by name.
pub fn named_keys(reports: &[(&str, &SuiteReport)]) -> Map<String, Value> {
    let mut keys = Map::new();
    let mut slots = Map::new();
    let random = reports.iter().find(|(name, _)| *name == "random").map(|(_, r)| *r);
    for (name, report) in reports {
        for (key, _, value, _) in rows(report) {
            keys.insert(format!("{key}_{name}"), json!(value));
        }
        if let Some(random) = random.filter(|_| *name != "random") {
            keys.insert(format!("below_random_{name}"), json!(below(report, random)));
        }
        slots.insert((*name).to_owned(), json!(report.caption_slot_accuracy));
    }
    keys.insert("caption_slot_accuracy".into(), Value::Object(slots));
    keys
}
