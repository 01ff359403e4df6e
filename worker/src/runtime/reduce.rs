//! A step's reduction and release on either path ([`Reducer`]): forming the NCCL group at the
//! start of a session (rendezvous through the coordinator), and turning this rank's part into
//! the step's release. Submitting and fetching survive an accountant restart: a transient
//! failure re-submits the part (idempotent by digest and step) and fetches again.

use std::time::{Duration, Instant};

use dpcap_proto::client::{AccountantClient, CoordinatorClient, PartKey};
use dpcap_proto::floats;
use dpcap_proto::retry::backoff;
use dpcap_proto::v1::{Assignment, JobSpend, Reduction};
use dpcap_proto::{ErrorCode, RetryPolicy};

use crate::collective::Reducer;
use crate::runtime::RuntimeError;

/// Where a step's part goes: the job, and which part of which step (`part.part` is the rank).
#[derive(Debug, Clone, Copy)]
pub struct StepKey<'a> {
    /// The job.
    pub job_id: &'a str,
    /// The step, the rank and the group generation.
    pub part: PartKey,
}

/// What became of a step's part.
pub enum Outcome {
    /// The step was charged and released.
    Released(Box<Released>),
    /// The step was charged but its release was lost (an accountant crash between the charge
    /// and the stored release): it stays spent and the replica skips it.
    Discarded,
}

/// The step's release, the spend rank 0 saw, and the seconds spent reducing and releasing.
pub struct Released {
    /// R_t, P values.
    pub values: Vec<f32>,
    /// Spend after the step (only where this rank talked to the accountant).
    pub spend: Option<JobSpend>,
    /// Seconds in the reduction (all-reduce and submission).
    pub reduce_seconds: f64,
    /// Seconds obtaining the release (fetch and broadcast).
    pub release_seconds: f64,
}

/// The reducer for `assignment`: the accountant path, or an NCCL group joined through the
/// coordinator's rendezvous (rank 0 publishes a fresh id for this generation).
pub async fn form(
    assignment: &Assignment,
    (coordinator, worker_id): (&mut CoordinatorClient, &str),
    (device, timeout): (&str, Duration),
) -> Result<Reducer, RuntimeError> {
    if assignment.reduction != Reduction::Nccl as i32 {
        return Ok(Reducer::Accountant);
    }
    form_nccl(assignment, (coordinator, worker_id), (device, timeout)).await
}

#[cfg(feature = "cuda")]
async fn form_nccl(
    assignment: &Assignment,
    (coordinator, worker_id): (&mut CoordinatorClient, &str),
    (device, timeout): (&str, Duration),
) -> Result<Reducer, RuntimeError> {
    use crate::collective::nccl::{NcclGroup, new_id};
    let ordinal =
        device.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()).ok_or_else(|| RuntimeError::Spec {
            field: "device",
            reason: format!("{device:?} cannot join an NCCL group (expected cuda:N)"),
        })?;
    crate::cuda::check_nccl().map_err(|reason| RuntimeError::Spec { field: "reduction", reason })?;
    let nccl_id = if assignment.rank == 0 { new_id()? } else { Vec::new() };
    let request = dpcap_proto::v1::RendezvousRequest {
        worker_id: worker_id.to_owned(),
        job_id: assignment.job_id.clone(),
        generation: assignment.generation,
        nccl_id: nccl_id.into(),
    };
    let id = coordinator.rendezvous(request).await.map_err(crate::runtime::lease_or)?.nccl_id;
    let ranks = (assignment.rank as usize, assignment.world_size as usize);
    let group = NcclGroup::join_async(ordinal, ranks, id.to_vec(), timeout).await?;
    tracing::info!(job_id = %assignment.job_id, rank = assignment.rank, generation = assignment.generation, "joined the NCCL group");
    Ok(Reducer::Nccl(group))
}

#[cfg(not(feature = "cuda"))]
async fn form_nccl(
    assignment: &Assignment,
    _: (&mut CoordinatorClient, &str),
    _: (&str, Duration),
) -> Result<Reducer, RuntimeError> {
    Err(RuntimeError::Spec {
        field: "reduction",
        reason: format!("job {} reduces over NCCL; this worker was built without the cuda feature", assignment.job_id),
    })
}

/// Reduces `part` and returns the step's release.
pub async fn release(
    reducer: &Reducer,
    accountant: &mut AccountantClient,
    key: StepKey<'_>,
    part: Vec<f32>,
) -> Result<Outcome, RuntimeError> {
    match reducer {
        Reducer::Accountant => through_accountant(accountant, key, part).await,
        #[cfg(feature = "cuda")]
        Reducer::Nccl(group) => over_nccl(group, accountant, key, part).await,
    }
}

/// Submits `sum` as part `part` and fetches the release, riding out accountant restarts: a
/// transient failure of either call re-submits (an identical part is recognised, a charged
/// step answers STEP_ALREADY_CHARGED and is fetched) until the retry deadline. The fetch runs
/// beside the submit: the release streams while the accountant stores it, and its last chunk
/// arrives once it is stored, so storing is not paid twice on the step's critical path.
async fn through_accountant(
    accountant: &mut AccountantClient,
    StepKey { job_id, part: key }: StepKey<'_>,
    sum: Vec<f32>,
) -> Result<Outcome, RuntimeError> {
    let PartKey { step, part, .. } = key;
    let policy = RetryPolicy::default();
    let started = Instant::now();
    let data = floats::into_bytes(sum); // one buffer for every attempt, never copied
    let mut failures = 0u32;
    loop {
        let t = Instant::now();
        let mut fetcher = accountant.clone();
        let fetch = fetcher.fetch_release(job_id, key.step);
        tokio::pin!(fetch);
        // The call's capability, renewed by every heartbeat, carries the step's grant (the units
        // sampled for it): read at each attempt, it never expires however long the step took.
        let submit = accountant.submit_bytes(job_id, key, "", data.clone());
        // Until the submit answers, a fetch that ends is the answer (the step was released).
        let (submitted, fetched) = tokio::select! {
            submitted = submit => (Some(submitted), None),
            fetched = &mut fetch => (None, Some(fetched)),
        };
        let reduce_seconds = t.elapsed().as_secs_f64();
        let failure = match submitted {
            None | Some(Ok(_)) => None,
            Some(Err(e)) if e.code == Some(ErrorCode::StepAlreadyCharged) => None,
            Some(Err(e)) if e.code == Some(ErrorCode::ReleaseDiscarded) => return Ok(Outcome::Discarded),
            Some(Err(e)) => Some(e),
        };
        let failure = match failure {
            Some(s) => s, // the fetch is dropped with this attempt
            None => {
                let t = Instant::now();
                let fetched = match fetched {
                    Some(fetched) => fetched,
                    None => fetch.await,
                };
                match fetched {
                    Ok((values, spend)) => {
                        let release_seconds = t.elapsed().as_secs_f64();
                        return Ok(Outcome::Released(Box::new(Released {
                            values,
                            spend,
                            reduce_seconds,
                            release_seconds,
                        })));
                    }
                    Err(e) if e.code == Some(ErrorCode::ReleaseDiscarded) => return Ok(Outcome::Discarded),
                    Err(e) => e,
                }
            }
        };
        if !failure.transient || started.elapsed() >= policy.deadline {
            return Err(failure.into());
        }
        let wait = backoff(&policy, failures);
        tracing::warn!(job_id, step, part, error = %failure, wait_ms = wait.as_millis() as u64, "accountant unavailable; re-submitting the part");
        tokio::time::sleep(wait).await;
        failures = failures.saturating_add(1);
    }
}

#[cfg(feature = "cuda")]
async fn over_nccl(
    group: &std::sync::Arc<crate::collective::nccl::NcclGroup>,
    accountant: &mut AccountantClient,
    StepKey { job_id, part: key }: StepKey<'_>,
    part: Vec<f32>,
) -> Result<Outcome, RuntimeError> {
    let PartKey { step, part: rank, .. } = key;
    use crate::collective::ReleaseStatus;
    let t = Instant::now();
    let dim = part.len();
    let sum = group.sum(part).await?;
    let mut reduce_seconds = t.elapsed().as_secs_f64();
    if rank == 0 {
        // Rank 0 alone talks to the accountant (parts = 1), then tells the others what happened.
        let fetched = through_accountant(accountant, StepKey { job_id, part: PartKey { part: 0, ..key } }, sum).await;
        let status = match &fetched {
            Ok(Outcome::Released(_)) => ReleaseStatus::Released,
            Ok(Outcome::Discarded) => ReleaseStatus::Discarded,
            Err(RuntimeError::BudgetExhausted(_)) => ReleaseStatus::BudgetExhausted,
            Err(_) => ReleaseStatus::Failed,
        };
        let t = Instant::now();
        group.from_rank_zero(vec![status as u32]).await?;
        let Outcome::Released(mut released) = fetched? else { return Ok(Outcome::Discarded) };
        released.values = group.from_rank_zero(released.values).await?;
        reduce_seconds += released.reduce_seconds;
        released.reduce_seconds = reduce_seconds;
        released.release_seconds += t.elapsed().as_secs_f64();
        return Ok(Outcome::Released(released));
    }
    let t = Instant::now();
    let status = group.from_rank_zero(vec![0u32]).await?;
    match ReleaseStatus::from_code(status[0]) {
        ReleaseStatus::Released => {}
        ReleaseStatus::Discarded => return Ok(Outcome::Discarded),
        ReleaseStatus::BudgetExhausted => {
            return Err(RuntimeError::BudgetExhausted(crate::runtime::BudgetRefusal::RankZero { step }));
        }
        ReleaseStatus::Failed => {
            return Err(RuntimeError::Protocol(format!("rank 0 could not obtain the release of step {step}")));
        }
    }
    let values = group.from_rank_zero(vec![0.0f32; dim]).await?;
    let release_seconds = t.elapsed().as_secs_f64();
    Ok(Outcome::Released(Box::new(Released { values, spend: None, reduce_seconds, release_seconds })))
}
