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
pub fn table(r: &SuiteReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<28} {:>7} {:>7}", "metric", "value", "chance");
    for (_, label, value, chance) in rows(r) {
        let _ = writeln!(out, "{label:<28} {:>7} {chance:>7.3}", cell(value));
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

/// Flat keys for each named report: `{metric}_{name}` for every metric, and
/// `caption_slot_accuracy` as an object keyed by name.
pub fn named_keys(reports: &[(&str, &SuiteReport)]) -> Map<String, Value> {
    let mut keys = Map::new();
    let mut slots = Map::new();
    for (name, report) in reports {
        for (key, _, value, _) in rows(report) {
            keys.insert(format!("{key}_{name}"), json!(value));
        }
        slots.insert((*name).to_owned(), json!(report.caption_slot_accuracy));
    }
    keys.insert("caption_slot_accuracy".into(), Value::Object(slots));
    keys
}
