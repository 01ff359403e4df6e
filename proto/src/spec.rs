//! The job spec file an operator writes (YAML, or JSON as a subset): the same fields as the
//! `JobSpec` message, with its enums by name, converted to the message in one place. Here, in
//! the protocol's crate, so that every client (dpctl, the suite, a user's program) reads a
//! spec file as the coordinator documents it without linking the coordinator.
//!
//! It checks only what the message cannot express (a key that is no field, an enum name that
//! is none of its values); the coordinator checks every value at submit.

use dpcap_privacy::contract::{ContractError, ModeKind};
use dpcap_privacy::{AccountantKind, PrivacyError};
use dpcap_registry::{Family, UnknownObjective};
use serde::{Deserialize, Serialize};

use crate::v1::{self, JobSpec, TelemetryMode};

/// Why a spec file is not a `JobSpec`, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    /// Not YAML, or a key that is no spec field (the parser names it, with its line).
    #[error("invalid spec: {0}")]
    Parse(#[source] serde_yaml::Error),
    /// A name that is none of its field's values.
    #[error("invalid {field}: {value:?} is not {allowed}")]
    Choice {
        /// The field.
        field: &'static str,
        /// The name given.
        value: String,
        /// The names allowed, in words.
        allowed: &'static str,
    },
    /// An objective that is not one of the registry's.
    #[error(transparent)]
    Objective(#[from] UnknownObjective),
    /// An accountant kind that is none of the privacy crate's.
    #[error("invalid accountant: {0}")]
    Accountant(#[from] PrivacyError),
    /// A privacy mode that is none of the privacy crate's (its error names the field).
    #[error(transparent)]
    Mode(#[from] ContractError),
}

impl SpecFileError {
    fn choice(field: &'static str, value: &str, allowed: &'static str) -> Self {
        Self::Choice { field, value: value.to_owned(), allowed }
    }

    /// The spec field it names ("spec" when the file itself does not parse).
    pub fn field(&self) -> &'static str {
        match self {
            Self::Parse(_) => "spec",
            Self::Choice { field, .. } => field,
            Self::Objective(_) => "objective",
            Self::Accountant(_) => "accountant",
            Self::Mode(e) => e.field,
        }
    }
}

/// A job spec file (YAML or JSON). Unknown keys are refused, so a typo names itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    /// Free-form name shown in listings.
    #[serde(default)]
    pub name: String,
    /// Dataset directory or URL (shards and index.json).
    pub dataset: String,
    /// Model configuration: micro, bench, tiny, small, base, large.
    pub model: String,
    /// caption (default) | mae | fedemb
    pub objective: Option<String>,
    /// ε target at δ (σ is calibrated from it unless `noise_multiplier` is fixed).
    pub epsilon: Option<f64>,
    /// δ; default 1/N.
    pub delta: Option<f64>,
    /// A fixed noise multiplier σ (noise std σ·C).
    pub noise_multiplier: Option<f64>,
    /// Poisson rate q in (0, 1]; or `batch_size` (expected L = qN).
    pub sample_rate: Option<f64>,
    /// Expected batch size L.
    pub batch_size: Option<u64>,
    /// Steps (ledger charges).
    pub steps: Option<u64>,
    /// Epochs instead of steps (steps = ceil(epochs / q)).
    pub epochs: Option<f64>,
    /// Per-example L2 clipping norm C; default 1.
    pub clipping_norm: Option<f64>,
    /// Peak AdamW learning rate; default 1e-3.
    pub learning_rate: Option<f64>,
    /// Linear warmup steps; default 5 % of the steps.
    pub warmup_steps: Option<u64>,
    /// Examples per physical micro-batch (memory bound); default 64.
    pub micro_batch: Option<u32>,
    /// Ranks the job needs at once; default 1.
    pub workers: Option<u32>,
    /// Rank 0 checkpoints every this many steps (and at the end); default 50.
    pub checkpoint_interval: Option<u64>,
    /// full (default) | strict
    pub telemetry: Option<String>,
    /// pld (default) | rdp
    pub accountant: Option<String>,
    /// A tokenizer.json path or URL; default the dataset's own.
    pub tokenizer: Option<String>,
    /// Seed of the initial weights (post-processing, not a privacy parameter).
    pub seed: Option<u64>,
    /// Refused unless 0: datasets' budgets are set by privacy admins, not by jobs.
    pub dataset_epsilon_budget: Option<f64>,
    /// random_resized_crop (default) | center_crop
    pub augment: Option<String>,
    /// dp (default) | not_private (a baseline: σ = 0, no ε) | simulation (TAN, with
    /// `simulate`); every mode but dp is NOT PRIVATE wherever it shows.
    pub privacy: Option<String>,
    /// The older spelling of `privacy: not_private`, still read.
    pub not_private: Option<bool>,
    /// The recipe a simulation simulates (without `privacy`, it asks for one).
    pub simulate: Option<SimulateFile>,
    /// Another job's checkpoint root to start from (weights only).
    pub init_from: Option<String>,
    /// The `init_from` weights, if NOT PRIVATE, were trained on public or synthetic data only.
    pub init_public: Option<bool>,
    /// A one-run privacy audit with gradient-space canaries.
    pub audit: Option<AuditFile>,
    /// DP-FedEmb's local training and server update (objective fedemb).
    pub fedemb: Option<FedEmbFile>,
}

/// DP-FedEmb's settings (see `FedEmb` in the proto).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedEmbFile {
    /// Local SGD steps per client (0: as many as `local_epochs` take).
    pub local_steps: Option<u32>,
    /// Passes over a client's examples; default 1.
    pub local_epochs: Option<u32>,
    /// Local SGD learning rate; default 0.05.
    pub local_learning_rate: Option<f64>,
    /// Examples per local step; default 8.
    pub local_batch: Option<u32>,
    /// Users per virtual client k; default 1 (the privacy unit is then exactly the user).
    pub users_per_client: Option<u32>,
    /// sgd (momentum, the default) | adam
    pub server_optimizer: Option<String>,
    /// Server SGD momentum; default 0.9.
    pub server_momentum: Option<f64>,
    /// Softmax scale of the local cosine head; default 10.
    pub head_scale: Option<f64>,
}

/// A job's audit (see `Audit` in the proto).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditFile {
    /// Number of canaries.
    pub canaries: u32,
    /// gradient (the default).
    pub kind: Option<String>,
    /// reserved (the default: coordinates set aside for the audit) or model.
    pub coordinates: Option<String>,
}

/// The recipe a TAN job simulates (see `Simulation` in the proto).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulateFile {
    /// The target's expected batch size B.
    pub batch_size: u64,
    /// The target's σ; default calibrated for the job's ε at q = B/N.
    pub noise_multiplier: Option<f64>,
}

impl SpecFile {
    /// Parses YAML (of which JSON is a subset).
    pub fn parse(text: &str) -> Result<Self, SpecFileError> {
        serde_yaml::from_str(text).map_err(SpecFileError::Parse)
    }

    /// The wire message; enum names are checked here.
    pub fn into_proto(self) -> Result<JobSpec, SpecFileError> {
        let objective = match self.objective.as_deref() {
            None => Family::default(),
            Some(name) => name.parse::<Family>()?,
        };
        let objective = crate::contract::family_to_proto(objective);
        let telemetry = match self.telemetry.as_deref().unwrap_or("full") {
            "full" => TelemetryMode::Full,
            "strict" => TelemetryMode::Strict,
            other => return Err(SpecFileError::choice("telemetry", other, "full or strict")),
        };
        let accountant = match self.accountant.as_deref() {
            None => v1::AccountantKind::Pld,
            Some(name) => crate::contract::kind_to_proto(name.parse::<AccountantKind>()?),
        };
        let privacy = match self.privacy.as_deref() {
            None => v1::Privacy::Unspecified,
            Some(name) => crate::contract::mode_to_proto(name.parse::<ModeKind>()?),
        };
        let augment = match self.augment.as_deref().unwrap_or("random_resized_crop") {
            "random_resized_crop" => v1::Augment::RandomResizedCrop,
            "center_crop" => v1::Augment::CenterCrop,
            other => return Err(SpecFileError::choice("augment", other, "random_resized_crop or center_crop")),
        };
        Ok(JobSpec {
            name: self.name,
            dataset: self.dataset,
            model: self.model,
            objective: objective as i32,
            epsilon: self.epsilon,
            delta: self.delta,
            noise_multiplier: self.noise_multiplier,
            sample_rate: self.sample_rate,
            batch_size: self.batch_size,
            steps: self.steps,
            epochs: self.epochs,
            clipping_norm: self.clipping_norm,
            learning_rate: self.learning_rate,
            warmup_steps: self.warmup_steps,
            micro_batch: self.micro_batch,
            workers: self.workers,
            checkpoint_interval: self.checkpoint_interval,
            telemetry: telemetry as i32,
            accountant: accountant as i32,
            tokenizer: self.tokenizer.unwrap_or_default(),
            seed: self.seed.unwrap_or(0),
            dataset_epsilon_budget: self.dataset_epsilon_budget.unwrap_or(0.0),
            augment: augment as i32,
            // Also for a coordinator that predates `privacy` (it reads only this spelling).
            not_private: self.not_private.unwrap_or(false) || privacy == v1::Privacy::NotPrivate,
            init_from: self.init_from.unwrap_or_default(),
            init_public: self.init_public.unwrap_or(false),
            simulate: self
                .simulate
                .map(|s| v1::Simulation { batch_size: s.batch_size, noise_multiplier: s.noise_multiplier }),
            audit: self.audit.map(|a| v1::Audit {
                canaries: a.canaries,
                kind: a.kind.unwrap_or_default(),
                coordinates: a.coordinates.unwrap_or_default(),
            }),
            privacy: privacy as i32,
            fedemb: self.fedemb.map(|f| v1::FedEmb {
                local_steps: f.local_steps.unwrap_or(0),
                local_epochs: f.local_epochs.unwrap_or(0),
                local_learning_rate: f.local_learning_rate,
                local_batch: f.local_batch.unwrap_or(0),
                users_per_client: f.users_per_client.unwrap_or(0),
                server_optimizer: f.server_optimizer.unwrap_or_default(),
                server_momentum: f.server_momentum,
                head_scale: f.head_scale,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_files_parse_from_yaml_and_json_and_each_refusal_names_its_field() {
        let yaml = "dataset: /data\nmodel: micro\nepsilon: 8\nbatch_size: 64\nsteps: 10\nobjective: mae\n";
        let yaml = SpecFile::parse(yaml).unwrap();
        let json = r#"{"dataset": "/data", "model": "micro", "epsilon": 8, "batch_size": 64, "steps": 10, "objective": "mae"}"#;
        assert_eq!(yaml, SpecFile::parse(json).unwrap());
        assert_eq!(yaml.clone().into_proto().unwrap().objective, v1::Objective::Mae as i32);

        let typo = SpecFile::parse("dataset: /data\nmodel: micro\nclip_norm: 1\n").unwrap_err();
        assert!(matches!(typo, SpecFileError::Parse(_)) && typo.field() == "spec", "{typo:?}");
        assert!(typo.to_string().contains("unknown field `clip_norm`"), "{typo}");
        let telemetry = SpecFile { telemetry: Some("verbose".into()), ..yaml.clone() }.into_proto().unwrap_err();
        assert_eq!(telemetry.to_string(), "invalid telemetry: \"verbose\" is not full or strict");
        let augment = SpecFile { augment: Some("flip".into()), ..yaml.clone() }.into_proto().unwrap_err();
        assert_eq!(augment.field(), "augment", "{augment}");
        let objective = SpecFile { objective: Some("gan".into()), ..yaml.clone() }.into_proto().unwrap_err();
        assert!(matches!(objective, SpecFileError::Objective(_)), "{objective:?}");
        let accountant = SpecFile { accountant: Some("moments".into()), ..yaml }.into_proto().unwrap_err();
        assert!(matches!(accountant, SpecFileError::Accountant(_)) && accountant.field() == "accountant");
        assert!(accountant.to_string().contains("moments"), "{accountant}");
        let mode = SpecFile { privacy: Some("private".into()), ..SpecFile::default() }.into_proto().unwrap_err();
        assert!(matches!(mode, SpecFileError::Mode(_)) && mode.field() == "privacy", "{mode:?}");
        assert!(mode.to_string().contains("\"private\" is not dp, not_private or simulation"), "{mode}");
        let baseline = SpecFile { privacy: Some("not_private".into()), ..SpecFile::default() }.into_proto().unwrap();
        assert_eq!(baseline.privacy, v1::Privacy::NotPrivate as i32);
        assert!(baseline.not_private, "also the older spelling, for a coordinator that predates privacy");
    }
}
