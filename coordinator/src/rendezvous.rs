//! NCCL bootstrap: rank 0 of an NCCL group publishes the generation's unique id, the other ranks
//! wait for it. The id lives only in memory with its group: a re-formed group (new generation)
//! or a restarted coordinator needs a fresh one, so no rank ever rejoins an old communicator.

use std::time::Duration;

use dpcap_proto::v1::Reduction;

use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;
use crate::state::State;
use dpcap_proto::job::is_terminal;

/// Bytes of an `ncclUniqueId`.
pub const NCCL_ID_BYTES: usize = 128;

/// Publishes `id` (rank 0) or reads the published id (other ranks): `Ok(None)` means "not yet".
pub fn exchange(
    state: &mut State,
    (worker_id, job_id, generation): (&str, &str, u64),
    id: &[u8],
) -> Result<Option<Vec<u8>>, CoordinatorError> {
    let worker = state.workers.get_mut(worker_id).ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
    worker.last_seen = std::time::Instant::now();
    let entry = state.jobs.get_mut(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
    let refuse = |state: &str, reason: String| CoordinatorError::Precondition {
        job_id: job_id.into(),
        state: state.into(),
        reason,
    };
    if entry.job.reduction != Reduction::Nccl as i32 {
        return Err(refuse("not reducing over NCCL", "its ranks send parts to the accountant".into()));
    }
    let terminal = is_terminal(entry.job.state);
    let Some(group) = entry.group.as_mut().filter(|g| g.generation == generation && !terminal) else {
        return Err(CoordinatorError::StaleGeneration { job_id: job_id.into(), generation });
    };
    let Some(rank) = group.members.iter().position(|m| m == worker_id) else {
        return Err(CoordinatorError::invalid("worker_id", format!("{worker_id} is not in the group of {job_id}")));
    };
    match (rank, id.is_empty()) {
        (0, true) => Err(CoordinatorError::invalid("nccl_id", "rank 0 must publish the generation's id")),
        (0, false) if id.len() != NCCL_ID_BYTES => {
            Err(CoordinatorError::invalid("nccl_id", format!("{} bytes, expected {NCCL_ID_BYTES}", id.len())))
        }
        (0, false) => match &group.nccl_id {
            Some(published) if published != id => Err(refuse(
                "bootstrapped",
                format!("generation {generation} already has a different NCCL id; a new one needs a new generation"),
            )),
            _ => Ok(Some(group.nccl_id.get_or_insert_with(|| id.to_vec()).clone())),
        },
        (rank, false) => Err(CoordinatorError::invalid("nccl_id", format!("rank {rank} must not publish an id"))),
        (_, true) => Ok(group.nccl_id.clone()),
    }
}

impl Coordinator {
    /// [`exchange`], waiting (and renewing the lease) until rank 0 has published.
    pub async fn rendezvous(
        &self,
        (worker_id, job_id, generation): (&str, &str, u64),
        id: &[u8],
    ) -> Result<Vec<u8>, CoordinatorError> {
        loop {
            let mut changed = self.changed.subscribe();
            let published = exchange(&mut self.lock(), (worker_id, job_id, generation), id)?;
            if let Some(published) = published {
                if !id.is_empty() {
                    tracing::info!(job_id, generation, "nccl id published");
                    self.changed.send_modify(|v| *v += 1);
                }
                return Ok(published);
            }
            let _ = tokio::time::timeout(Duration::from_secs(5), changed.changed()).await;
        }
    }
}
