//! What a checkpoint is: the manifest rank 0 writes beside its weights, read by workers
//! (resume, `init_from`), the coordinator (checking an `init_from` source at submit) and
//! `dpctl` (export, evaluation), all with this one type.

use dpcap_privacy::contract::ModeKind;
use serde::{Deserialize, Serialize};

use crate::Family;

/// What a checkpoint is, for people and for resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The job.
    pub job_id: String,
    /// Releases of steps < step are applied.
    pub step: u64,
    /// The ledger's next step when it was written (the same number: the ledger owns steps).
    pub ledger_position: u64,
    /// Model configuration name.
    pub model: String,
    /// The objective it trains.
    pub objective: Family,
    /// P: trainable parameters (the length of every part and release).
    pub parameters: u64,
    /// The group generation of the rank 0 that wrote it.
    pub generation: u64,
    /// When, in milliseconds since the Unix epoch.
    pub created_unix_ms: i64,
    /// Releases applied to this state (charged steps whose update reached the model).
    #[serde(default)]
    pub applied_steps: u64,
    /// Charged steps skipped because their release was lost (they stay spent). With
    /// `applied_steps` this must account for every charge below `step`:
    /// charged = applied + discarded.
    #[serde(default)]
    pub discarded_steps: Vec<u64>,
    /// The weights' privacy: DP, or NOT PRIVATE (a baseline's or a simulation's), which every
    /// export of them says. Checkpoints from before modes read as DP; an unknown name is
    /// refused, never read as DP.
    #[serde(default)]
    pub privacy: ModeKind,
    /// The digest of the dataset the job trains on ("" before it was recorded): `init_from`
    /// refuses NOT PRIVATE weights of a DP job's own dataset.
    #[serde(default)]
    pub dataset: String,
    /// Where the job's initial weights came from ("job J step S (privacy)"; "" for a fresh
    /// init), carried into exports.
    #[serde(default)]
    pub init_from: String,
}

impl Manifest {
    /// Whether the weights carry the job's DP guarantee.
    pub fn is_private(&self) -> bool {
        self.privacy.is_private()
    }

    /// How the weights' privacy is shown wherever they are listed (evaluations, exports):
    /// "dp", or "NOT PRIVATE: <mode>", so that weights without the guarantee always say so.
    pub fn privacy_label(&self) -> String {
        if self.is_private() { "dp".to_owned() } else { format!("NOT PRIVATE: {}", self.privacy) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_names_its_objective_and_privacy_and_refuses_an_unknown_one() {
        let json = r#"{"job_id":"j","step":3,"ledger_position":3,"model":"micro","objective":"fedemb",
            "parameters":10,"generation":1,"created_unix_ms":0,"privacy":"simulation"}"#;
        let m: Manifest = serde_json::from_str(json).unwrap();
        assert_eq!((m.objective, m.privacy), (Family::Embedder, ModeKind::Simulation));
        assert!(!m.is_private());
        assert_eq!(m.privacy_label(), "NOT PRIVATE: simulation");
        let old = json.replace(r#","privacy":"simulation""#, "");
        assert!(serde_json::from_str::<Manifest>(&old).unwrap().is_private(), "before modes: DP");
        let unknown = json.replace("simulation", "unknown");
        assert!(serde_json::from_str::<Manifest>(&unknown).is_err(), "never read as DP");
        let round = serde_json::to_string(&m).unwrap();
        assert!(round.contains(r#""objective":"fedemb""#) && round.contains(r#""privacy":"simulation""#));
    }
}
