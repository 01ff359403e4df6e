//! Durable job state on an object store (a local directory by default): one protobuf object
//! per job (spec, plan, state, conditions, progress), the job's private part (sampler secret and
//! shard layout) written once, and idempotency keys claimed with create-if-absent puts.
//!
//! Layout under the root: `jobs/{id}/job.binpb`, `jobs/{id}/private.json`,
//! `idempotency/{hex(key)}`. One coordinator replica writes it (Deployment, Recreate).

use std::sync::Arc;

use dpcap_proto::v1::Job;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::CoordinatorError;
use crate::sampler::JobSecret;

/// What a job needs that the operator never sees.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Private {
    /// The sampler key, hex.
    pub secret: String,
    /// Examples per shard, in shard order.
    pub shard_counts: Vec<u64>,
}

impl Private {
    /// The sampler key.
    pub fn job_secret(&self) -> Result<JobSecret, CoordinatorError> {
        let bytes = (0..self.secret.len())
            .step_by(2)
            .map(|i| self.secret.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect::<Option<Vec<u8>>>();
        let key: [u8; 32] = bytes
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| CoordinatorError::Store("a job's sampler secret is not 64 hex digits".into()))?;
        Ok(JobSecret(key))
    }
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The job store.
#[derive(Debug, Clone)]
pub struct JobStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
}

impl JobStore {
    /// A store rooted at `root`.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        Self { store, root }
    }

    fn path(&self, rest: &str) -> Path {
        Path::from(format!("{}/{rest}", self.root).trim_start_matches('/'))
    }

    /// Overwrites the job's record.
    pub async fn put_job(&self, job: &Job) -> Result<(), CoordinatorError> {
        let path = self.path(&format!("jobs/{}/job.binpb", job.job_id));
        self.store.put(&path, PutPayload::from(job.encode_to_vec())).await?;
        Ok(())
    }

    /// Writes the job's private part once.
    pub async fn put_private(&self, job_id: &str, private: &Private) -> Result<(), CoordinatorError> {
        let body = serde_json::to_vec(private).map_err(|e| CoordinatorError::Store(e.to_string()))?;
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.store
            .put_opts(&self.path(&format!("jobs/{job_id}/private.json")), PutPayload::from(body), options)
            .await?;
        Ok(())
    }

    /// Claims `key` for `job_id`; returns the job that already holds it, if any.
    pub async fn claim_key(&self, key: &str, job_id: &str) -> Result<Option<String>, CoordinatorError> {
        let path = self.path(&format!("idempotency/{}", hex(key.as_bytes())));
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(&path, PutPayload::from(job_id.as_bytes().to_vec()), options).await {
            Ok(_) => Ok(None),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let bytes = self.store.get(&path).await?.bytes().await?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Every stored job with its private part, in no particular order. Jobs without a private
    /// part (a crash between the two writes of a submission) are skipped.
    pub async fn load_all(&self) -> Result<Vec<(Job, Private)>, CoordinatorError> {
        let listed: Vec<_> = self.store.list(Some(&self.path("jobs"))).try_collect().await?;
        let mut out = Vec::new();
        for meta in listed.iter().filter(|m| m.location.as_ref().ends_with("/job.binpb")) {
            let bytes = self.store.get(&meta.location).await?.bytes().await?;
            let job = Job::decode(bytes).map_err(|e| CoordinatorError::Store(format!("{}: {e}", meta.location)))?;
            let private_path = self.path(&format!("jobs/{}/private.json", job.job_id));
            let private = match self.store.get(&private_path).await {
                Ok(r) => r.bytes().await?,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let private: Private = serde_json::from_slice(&private)
                .map_err(|e| CoordinatorError::Store(format!("{private_path}: {e}")))?;
            out.push((job, private));
        }
        Ok(out)
    }
}
