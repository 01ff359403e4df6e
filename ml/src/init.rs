//! A job's initial weights from another job's checkpoint (`init_from`): the warm start of ViP
//! and DP-Cap (a model pretrained without privacy on synthetic images) and DP-FedEmb's public
//! pretraining. Weights only: the optimizer starts fresh. The same objective takes every
//! weight; another objective of the same model (a ViP MAE into a captioner) takes the encoder.
//! Names and shapes are checked, so a mismatch is refused naming `init_from`, never loaded
//! halfway. Whether the source may start a DP job is the coordinator's check at submission.

use burn::tensor::backend::Backend;

use crate::checkpoint::load_weights_with_prefix;
use crate::checkpoint::{CheckpointStore, Manifest};
use crate::error::MlError;
use crate::params::ParamSet;
use dpcap_privacy::contract::ModeKind;
use dpcap_registry::Family;

/// Loads checkpoint `step` under `location`, which the coordinator checked and found of
/// `privacy`, into `params` of a `model` trained for `objective`; returns its manifest. A
/// checkpoint whose privacy is not the one checked is refused.
pub async fn load_init<B: Backend>(
    params: &mut ParamSet<B>,
    location: &str,
    (model, objective): (&str, Family),
    (step, privacy): (u64, ModeKind),
) -> Result<Manifest, MlError> {
    let spec = |reason: String| MlError::Spec { field: "init_from", reason };
    let init_from = |step, source| MlError::InitFrom { location: location.to_owned(), step, source: Box::new(source) };
    let store = CheckpointStore::open_existing(location).map_err(|e| init_from(None, e))?;
    let (manifest, weights, _) = store.load(step).await.map_err(|e| init_from(Some(step), e))?;
    if manifest.privacy != privacy {
        return Err(spec(format!(
            "{location} step {step} is {}, not the {privacy} checked at submission",
            manifest.privacy
        )));
    }
    if manifest.model != model {
        return Err(spec(format!("{location} is a {} model, this job trains {model}", manifest.model)));
    }
    let prefix = if manifest.objective == objective { "" } else { "encoder." };
    load_weights_with_prefix(params, &weights, prefix).map_err(|e| init_from(Some(step), e))?;
    Ok(manifest)
}
