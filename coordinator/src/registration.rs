//! What the coordinator registers with the accountant when a job is submitted, before any
//! worker sees it: the job's privacy contract, built from the spec's resolved terms in this
//! one place; its
//! gradient dimension P, from the model registry (no burn, no worker); and, for captioning,
//! the tokenizer pinned by the digest of its bytes.

use dpcap_privacy::contract::{Mechanism, PrivacyContract, PrivacyUnit};

use crate::error::CoordinatorError;
use crate::init::InitSource;
use crate::plan::Terms;
use crate::spec::Checked;

/// P for the spec's model and objective.
pub fn gradient_dim(checked: &Checked) -> Result<u64, CoordinatorError> {
    let spec = &checked.spec;
    dpcap_registry::parameter_count(checked.family, &spec.model).ok_or_else(|| {
        CoordinatorError::invalid(
            "model",
            format!("{:?} is not one of {}", spec.model, dpcap_registry::NAMES.join(", ")),
        )
    })
}

/// What a contract is built from, besides the spec's terms.
#[derive(Debug, Clone, Default)]
pub struct Provenance<'a> {
    /// The dataset: the digest of the index the plan was made on.
    pub dataset_id: String,
    /// The data: [`dpcap_dataset::index::Manifest::data_digest`] ("" when the index pins no
    /// shard bytes).
    pub data_id: String,
    /// [`dpcap_dataset::index::Manifest::shards_digest`] ("" when the index pins no shard bytes).
    pub shards_id: String,
    /// The user table's digest, for a user-level job.
    pub users_digest: Option<String>,
    /// Where the job's initial weights come from, if anywhere.
    pub init: Option<&'a InitSource>,
}

/// The contract of a checked spec's terms: the one statement of the job's mechanism and
/// guarantee, which the plan never copies. A job that starts from the weights of a DP job on
/// the same dataset and unit names it, so that their ε compose in its status.
pub fn contract(
    checked: &Checked,
    terms: &Terms,
    provenance: Provenance<'_>,
) -> Result<PrivacyContract, CoordinatorError> {
    let mode = terms.resolved.mode;
    let unit = match provenance.users_digest {
        Some(users_digest) => PrivacyUnit::User { users_digest },
        None => PrivacyUnit::Example,
    };
    let init_from_job = provenance
        .init
        .filter(|source| source.is_private() && source.dataset == provenance.dataset_id && mode.is_private())
        .filter(|source| source.objective.is_user_level() == matches!(unit, PrivacyUnit::User { .. }))
        .map(|source| source.job_id.clone());
    let contract = PrivacyContract {
        mechanism: Mechanism {
            sample_rate: terms.sample_rate,
            noise_multiplier: terms.resolved.noise_multiplier,
            clipping_norm: terms.clipping_norm,
        },
        accountant: terms.kind,
        delta: terms.delta,
        epsilon_target: terms.resolved.epsilon_target,
        mode,
        unit,
        dataset_id: provenance.dataset_id,
        data_id: provenance.data_id,
        shards_id: provenance.shards_id,
        audit: checked.audit,
        init_from_job,
        planned_steps: terms.steps,
    };
    contract.check()?;
    Ok(contract)
}

/// A captioning job's tokenizer: its location (the spec's, or the dataset's own
/// `tokenizer.json`) and the digest of its bytes, which workers check. None for objectives
/// without captions.
pub async fn pin_tokenizer(checked: &Checked) -> Result<Option<(String, String)>, CoordinatorError> {
    let spec = &checked.spec;
    if !checked.family.has_captions() {
        return Ok(None);
    }
    let location = if spec.tokenizer.is_empty() {
        format!("{}/tokenizer.json", spec.dataset.trim_end_matches('/'))
    } else {
        spec.tokenizer.clone()
    };
    let bytes = dpcap_serve::store::read_object(&location).await.map_err(|source| {
        let what = if spec.tokenizer.is_empty() {
            "none given and the dataset has no tokenizer.json; set tokenizer (a public vocabulary), or for public or \
             synthetic captions run `dpctl dataset index --train-tokenizer`"
                .to_owned()
        } else {
            "cannot read it".to_owned()
        };
        CoordinatorError::Unreadable { field: "tokenizer", what, source }
    })?;
    Ok(Some((location, dpcap_proto::digest::sha256(&bytes))))
}
