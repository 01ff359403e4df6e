//! `init_from`: where a job's initial weights come from, checked at submission. The source is
//! another job's checkpoint root; its latest manifest must be of the job's model. Weights
//! trained without DP (a NOT PRIVATE baseline or simulation) start a DP job only when the
//! submitter states they saw public or synthetic data only (`init_public`): trained on private
//! data, they would void the new job's guarantee, so that choice is explicit and recorded.

use object_store::ObjectStoreExt;

use crate::error::CoordinatorError;
use crate::spec::Checked;

/// The checkpoint a job starts from: its manifest, read with the one type workers write it with.
pub type InitSource = dpcap_registry::Manifest;

fn invalid(reason: String) -> CoordinatorError {
    CoordinatorError::invalid("init_from", reason)
}

/// The spec's init source for a job on the dataset with index digest `dataset`, read and
/// checked; None without `init_from`.
pub async fn check(checked: &Checked, dataset: &str) -> Result<Option<InitSource>, CoordinatorError> {
    let spec = &checked.spec;
    if spec.init_from.is_empty() {
        if spec.init_public {
            return Err(CoordinatorError::invalid("init_public", "is only meaningful with init_from"));
        }
        return Ok(None);
    }
    let location = spec.init_from.as_str();
    let (store, root) = dpcap_serve::open_existing_store(location)
        .map_err(|source| CoordinatorError::Location { field: "init_from", source })?;
    let read = |rest: String| {
        let (store, path) =
            (store.clone(), object_store::path::Path::from(format!("{root}/{rest}").trim_start_matches('/')));
        async move { store.get(&path).await?.bytes().await }
    };
    let unread = |what: String| move |source| CoordinatorError::Read { field: "init_from", what, source };
    let latest = read("latest".into()).await.map_err(unread(format!("{location}/latest (it holds no checkpoint)")))?;
    let step: u64 = String::from_utf8_lossy(&latest)
        .trim()
        .parse()
        .map_err(|_| invalid(format!("{location}/latest is not a step number")))?;
    let manifest =
        read(format!("{step}/manifest.json")).await.map_err(unread(format!("{location}/{step}/manifest.json")))?;
    let source: InitSource = serde_json::from_slice(&manifest).map_err(|source| CoordinatorError::InitManifest {
        what: format!("{location}/{step}/manifest.json"),
        source,
    })?;
    if source.model != spec.model {
        return Err(invalid(format!("{location} is a {} model, this job trains {}", source.model, spec.model)));
    }
    let job_is_private = checked.mode.is_private();
    if job_is_private && !source.is_private() && !dataset.is_empty() && source.dataset == dataset {
        return Err(invalid(format!(
            "{location} holds NOT PRIVATE weights trained on this job's own dataset (job {}): they would void its guarantee",
            source.job_id
        )));
    }
    if job_is_private && !source.is_private() && !spec.init_public {
        return Err(invalid(format!(
            "{location} holds NOT PRIVATE weights (job {}, {}); a DP job starts from them only with init_public: \
             true, stating they were trained on public or synthetic data only",
            source.job_id, source.privacy
        )));
    }
    Ok(Some(source))
}
