//! One step of one job at the accountant: its parts are collected, then, once all W are in and
//! under the job's lock, the step is released in four named phases: **check** (the step is the
//! ledger's next and stays within the job's target and its dataset's budget), **charge**
//! (durably, before any byte of the release exists), **noise** (drawn once, added once) and
//! **publish** (streamed to the ranks while stored; the last chunk only once stored).

use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use dpcap_proto::ErrorCode;

use crate::core::Accountant;
use crate::datasets::{Of, exceeds};
use crate::error::AccountantError;
use crate::job::CLIP_SLACK;
use crate::job::{Job, Part, Pending, Phase, Progress, StepState};
use crate::metrics;
use crate::noise;
use crate::records::{BudgetKey, Charge};
use crate::release::{Release, Stored};
use crate::sum::Sum;

/// What became of a submitted part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartOutcome {
    /// Parts of the step received so far (W once released).
    pub received: u32,
    /// Parts W the step sums.
    pub expected: u32,
    /// True once the step is charged and released.
    pub released: bool,
    /// False when this exact part had been received before (an idempotent retry).
    pub accepted_new: bool,
}

/// What the check phase decided: ε after the step, and the dataset budget's, if any.
struct Checked {
    epsilon_after: f64,
    /// The budget the step spends, if any: its standing changes with the charge.
    spends: Option<BudgetKey>,
}

impl Accountant {
    /// Adds one complete part. When it is the last of the W parts, charges and releases the
    /// step before returning.
    pub async fn submit_part(&self, job: &Job, part: Part) -> Result<PartOutcome, AccountantError> {
        let Part { step, part, values, digest, attempt, parts, group, norm, sampled, .. } = part;
        let r = &job.registration;
        let mut state = job.state.lock().await;
        // Under the step lock, which a fence or a suspension takes too: a part admitted before
        // one, and still streaming, is refused now, never charged after it.
        check_admitted(job, attempt)?;
        let progress = job.progress();
        if let Some((released, digests)) = &state.last_released
            && *released == step
            && digests.get(part as usize) == Some(&Some(digest))
        {
            let expected = digests.len() as u32;
            return Ok(PartOutcome { received: expected, expected, released: true, accepted_new: false });
        }
        check_step_open(job, &progress, step)?;
        if let Some(pending) = &state.pending {
            if pending.attempt > attempt {
                return Err(AccountantError::StalePart {
                    job_id: r.job_id.clone(),
                    step,
                    attempt,
                    current: pending.attempt,
                });
            }
            if pending.attempt < attempt || pending.group != group {
                // The group that sent these parts was re-formed before the step was complete
                // (or is another group under the same generation number, after a coordinator
                // restart): nothing was charged or released from them, so dropping them is
                // safe, and parts of two groups are never summed.
                tracing::info!(job_id = %r.job_id, step, attempt, "dropping pending parts of another group");
                state.pending = None;
            }
        }
        let pending = state.pending.get_or_insert_with(|| Pending {
            step,
            sum: Sum::default(),
            digests: vec![None; parts as usize],
            started: Instant::now(),
            attempt,
            group,
            sampled,
            norms: 0.0,
        });
        let expected = pending.digests.len() as u32;
        if expected != parts {
            return Err(AccountantError::invalid(
                "parts",
                format!("attempt {attempt} of step {step} sums {expected} parts; this capability says {parts}"),
            ));
        }
        if pending.sampled != sampled {
            return Err(AccountantError::invalid(
                "step_capability",
                format!(
                    "step {step}'s parts state {} sampled units; this part's capability says {sampled}",
                    pending.sampled
                ),
            ));
        }
        let slot = &mut pending.digests[part as usize];
        let accepted_new = match slot {
            Some(existing) if *existing == digest => false,
            Some(_) => return Err(AccountantError::ConflictingPart { job_id: r.job_id.clone(), step, part }),
            None => {
                *slot = Some(digest);
                pending.sum.add(values);
                pending.norms += norm;
                true
            }
        };
        let received = pending.digests.iter().filter(|d| d.is_some()).count() as u32;
        if received < expected {
            return Ok(PartOutcome { received, expected, released: false, accepted_new });
        }
        self.release(job, &mut state).await?;
        Ok(PartOutcome { received, expected, released: true, accepted_new })
    }

    /// Check, charge, noise, publish. Called with the job's lock held and every part in.
    async fn release(&self, job: &Job, state: &mut StepState) -> Result<(), AccountantError> {
        let step = state.pending.as_ref().expect("release needs a pending step").step;
        // The budget's lock whether or not a budget exists yet: one set while this step is
        // checked must not let an admission reserve beside a charge it cannot see.
        let key = self.datasets.key_of(&job.registration.contract);
        let _dataset_guard = self.datasets.admission_lock(&key).lock_owned().await;
        let checked = match self.check(job, step, state).await {
            Ok(checked) => checked,
            Err(refused) => {
                state.pending = None;
                return Err(refused);
            }
        };
        self.charge(job, step, state, &checked).await?;
        let mut pending = state.pending.take().expect("pending step is still held");
        let release = self.noise(job, step, state, &mut pending, checked.epsilon_after).await?;
        self.publish(job, step, state, release).await?;
        metrics::record_release(pending.started.elapsed());
        Ok(())
    }

    /// The step's sum has exactly P values, and the step stays within the job's target and its
    /// dataset's budget. Nothing is spent on a refusal.
    async fn check(&self, job: &Job, step: u64, state: &StepState) -> Result<Checked, AccountantError> {
        let r = &job.registration;
        let pending = state.pending.as_ref().expect("check needs a pending step");
        // Parts are exactly P values (PartAssembler): anything else would reach the audit's
        // reserved coordinates.
        if pending.sum.len() as u64 != r.gradient_dim {
            return Err(AccountantError::Internal(format!(
                "step {step}'s sum has {} values, not {}",
                pending.sum.len(),
                r.gradient_dim
            )));
        }
        check_clipped(job, step, pending)?;
        let progress = job.progress();
        let epsilon_after = job.spending.epsilon_after(progress.charged + 1).await?;
        let contract = &r.contract;
        if let Some(target) = contract.epsilon_target
            && exceeds(epsilon_after, target)
        {
            let refusal = Refusal { scope: "job".into(), spent: progress.epsilon_spent, after: epsilon_after, target };
            return Err(self.refuse(job, step, refusal, contract.delta, "job_target"));
        }
        let spends = self.check_dataset(job, step, &progress).await?;
        Ok(Checked { epsilon_after, spends })
    }

    /// The job's next step stays within its dataset's budget; returns the budget it spends,
    /// if any. Call it under the budget's lock ([`crate::datasets::Datasets::admission_lock`]).
    pub(crate) async fn check_dataset(
        &self,
        job: &Job,
        step: u64,
        progress: &Progress,
    ) -> Result<Option<BudgetKey>, AccountantError> {
        let contract = &job.registration.contract;
        self.datasets.check(contract, false)?;
        // Jobs without a guarantee were let onto the dataset by its owners and never spend it.
        let key = self.datasets.key_of(contract);
        let Some(budget) = self.datasets.budget_of(&key).filter(|_| contract.mode.is_private()) else {
            return Ok(None);
        };
        // A step within an open job's plan is part of what its admission reserved: while that
        // reservation holds (the budget unchanged, no step beyond a plan since), it fits.
        let within_plan = progress.charged < contract.planned_steps;
        let open = progress.phase == Phase::Open && !job.suspended.load(Ordering::SeqCst);
        if within_plan && open && self.datasets.check_reserved(&budget) {
            return Ok(Some(key));
        }
        if !within_plan {
            self.datasets.unreserve(&key);
        }
        let kind = job.spending.kind();
        let after = self.datasets.within(&budget, kind, self.segments(&key, Some((job, 1)))).await?;
        if !after.fits {
            let spent = self.datasets.epsilon(&budget, kind, Of::Spent, self.segments(&key, None)).await?;
            let refusal = Refusal { scope: budget.describe(), spent, after: after.epsilon, target: budget.epsilon };
            return Err(self.refuse(job, step, refusal, budget.delta, "dataset_budget"));
        }
        Ok(Some(key))
    }

    /// Durably records the charge of `step`. A step another accountant charged first is spent
    /// and not ours to release (discarded); any other failure leaves the parts pending, so a
    /// retried part re-triggers the release.
    async fn charge(
        &self,
        job: &Job,
        step: u64,
        state: &mut StepState,
        checked: &Checked,
    ) -> Result<(), AccountantError> {
        let r = &job.registration;
        let charge = Charge {
            job_id: r.job_id.clone(),
            step,
            epsilon_after: r.contract.epsilon_target.is_some().then_some(checked.epsilon_after),
            noise: job.noise.describe(),
            charged_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        let charged = self.ledger.charge(&charge).await;
        if let (Ok(()) | Err(AccountantError::ChargedElsewhere { .. }), Some(key)) = (&charged, &checked.spends) {
            self.datasets.touch(key);
        }
        if let Err(e) = charged {
            if matches!(e, AccountantError::ChargedElsewhere { .. }) {
                state.pending = None;
                discard_charged(job, state, step, checked.epsilon_after);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The charge is durable: only now may noise touch the sum. Noise drawn ahead is this
    /// step's (taken once); if it cannot be had, the step stays spent and is discarded, never
    /// re-noised. The pass runs on a blocking thread and fills the release block by block.
    async fn noise(
        &self,
        job: &Job,
        step: u64,
        state: &mut StepState,
        pending: &mut Pending,
        epsilon_after: f64,
    ) -> Result<Filling, AccountantError> {
        let noising = Instant::now();
        let noise = match job.ahead.take(step).await {
            Ok(noise) => noise,
            Err(e) => {
                discard_charged(job, state, step, epsilon_after);
                return Err(self.record_discard(job, step, e).await);
            }
        };
        // Ranks get the model's P coordinates; an audit's reserved ones stay here.
        let (stored, stored_rx) = watch::channel(Stored::Writing);
        let visible = 4 * job.registration.gradient_dim as usize;
        let release = std::sync::Arc::new(Release::filling(
            step,
            epsilon_after,
            visible,
            4 * noise.values.len(),
            noise::BLOCK_BYTES,
            stored_rx,
        ));
        let pass = {
            // Drawn in the blocking pass if the ranks' attach has not drawn them yet.
            let plan = job.audit.clone();
            let (release, sum) = (release.clone(), std::mem::take(&mut pending.sum));
            let (mut noise, blocks) = (noise, self.blocks.clone());
            tokio::task::spawn_blocking(move || {
                // An audit's canaries are gradients like any example's: in the sum, under the noise.
                if let Some(plan) = plan {
                    plan.canaries().inject(step, &mut noise.values, 1.0);
                }
                let passed = noise::apply_each(sum, &noise.values, &blocks, |index, block| release.fill(index, block));
                (passed, noise.values)
            })
        };
        job.keep_release(release.clone());
        state.last_released = Some((step, pending.digests.clone()));
        // Fetches start streaming the blocks the pass has filled, while the release is written;
        // their last chunk waits until it is durable, and ranks apply only a release with its
        // last chunk.
        job.progress.send_modify(|p| {
            p.next_step = step + 1;
            p.charged += 1;
            p.epsilon_spent = epsilon_after;
        });
        Ok(Filling { release, pass, stored, noising })
    }

    /// Stores the release while it streams; marks it durable, or discards the step when it
    /// could not be stored. Then starts the next step's noise and ε.
    async fn publish(
        &self,
        job: &Job,
        step: u64,
        state: &mut StepState,
        filling: Filling,
    ) -> Result<(), AccountantError> {
        let r = &job.registration;
        let Filling { release, pass, stored, noising } = filling;
        let passed = async {
            let passed = match pass.await {
                Ok((Ok(()), used)) => {
                    if step + 1 < job.spending.max_steps() {
                        job.ahead.recycle(used); // the next step's draw writes over it
                    }
                    Ok(())
                }
                Ok((Err(not_finite), _)) => Err(format!("it was refused: {not_finite}")),
                Err(e) => Err(format!("the noise pass failed: {e}")),
            };
            if passed.is_err() {
                release.fail(); // wakes the store and the fetches waiting for its blocks
            }
            (passed, noising.elapsed().as_secs_f64())
        };
        let ((passed, noise_s), put) = tokio::join!(passed, self.ledger.put_release(&r.job_id, step, &release));
        let put = match passed {
            Ok(()) => put,
            Err(why) => Err(AccountantError::Internal(format!("release of step {step}: {why}"))),
        };
        if let Err(e) = put {
            release.fail();
            stored.send_replace(Stored::Failed);
            job.releases.lock().expect("releases lock").remove(&step);
            state.discarded.insert(step);
            job.progress.send_modify(|p| p.discarded += 1);
            return Err(self.record_discard(job, step, e).await);
        }
        state.stored.insert(step);
        stored.send_replace(Stored::Done);
        if let Some(canaries) = job.audit.as_ref().map(|plan| plan.canaries())
            && let Err(e) =
                self.ledger.put_audit_readings(&r.job_id, step, canaries.readings(|c| release.value(c))).await
        {
            // The audit then scores one release fewer: weaker, never wrong.
            tracing::warn!(job_id = %r.job_id, step, error = %e, "audit readings not stored");
        }
        // The next step's noise is drawn while the ranks apply this release and compute.
        let charged = job.progress().charged;
        if step + 1 < job.spending.max_steps() {
            job.ahead.prepare(step + 1);
            job.spending.prepare(charged + 1);
        }
        let stored_s = noising.elapsed().as_secs_f64();
        tracing::info!(job_id = %r.job_id, step, epsilon_after = release.epsilon_after, noise_s, stored_s, "released step");
        Ok(())
    }

    /// A charged step's release was lost before it was stored: the ledger must say so too, or
    /// a replay that finds a release object (a put that landed despite its error) would serve
    /// a step the ranks skipped. Returns the original error.
    async fn record_discard(&self, job: &Job, step: u64, error: AccountantError) -> AccountantError {
        let job_id = &job.registration.job_id;
        tracing::error!(job_id = %job_id, step, error = %error, "release not stored: step discarded");
        if let Err(marker) = self.ledger.discard(job_id, step).await {
            tracing::error!(job_id = %job_id, step, error = %marker, "discard not recorded; refusing further steps");
            job.let_go();
            job.progress.send_modify(|p| p.phase = Phase::Closed);
        }
        error
    }

    fn refuse(&self, job: &Job, step: u64, refusal: Refusal, delta: f64, reason: &'static str) -> AccountantError {
        metrics::record_budget_rejection(reason);
        job.let_go();
        job.progress.send_modify(|p| p.phase = Phase::BudgetExhausted);
        tracing::warn!(job_id = %job.registration.job_id, step, epsilon_after = refusal.after, target = refusal.target,
            reason, "refused step: budget exhausted");
        let error = AccountantError::BudgetExhausted {
            job_id: job.registration.job_id.clone(),
            step,
            scope: refusal.scope,
            epsilon_spent: refusal.spent,
            epsilon_after: refusal.after,
            epsilon_target: refusal.target,
            delta,
        };
        let _ = job.exhausted_by.set(error.to_string());
        error
    }
}

/// A release being filled by its noise pass.
struct Filling {
    release: std::sync::Arc<Release>,
    /// The noise pass, and the noise buffer it used (for the next step's draw to write over).
    pass: tokio::task::JoinHandle<(Result<(), noise::NotFinite>, Vec<f64>)>,
    stored: watch::Sender<Stored>,
    noising: Instant,
}

/// Which budget a step would pass, and by how much.
struct Refusal {
    /// "job", or the dataset budget's description.
    scope: String,
    spent: f64,
    after: f64,
    target: f64,
}

/// A charged step that will never be released: it stays spent, counted as discarded.
fn discard_charged(job: &Job, state: &mut StepState, step: u64, epsilon_after: f64) {
    state.discarded.insert(step);
    job.progress.send_modify(|p| {
        p.next_step = step + 1;
        p.charged += 1;
        p.discarded += 1;
        p.epsilon_spent = epsilon_after;
    });
}

/// The step's parts could have come from clipped examples only: Σ_r ‖S_r‖ ≤ C·n (1 + slack),
/// n the units the coordinator sampled. Each part was already held to its own rank's share
/// (‖S_r‖ ≤ C·n_r, [`crate::job::PartAssembler`]); this whole-step bound is the second line, for
/// shares that would not add up to n.
fn check_clipped(job: &Job, step: u64, pending: &Pending) -> Result<(), AccountantError> {
    let clipping_norm = job.registration.contract.mechanism.clipping_norm;
    let bound = clipping_norm * pending.sampled as f64 * (1.0 + CLIP_SLACK);
    if pending.norms.is_nan() || pending.norms > bound {
        return Err(AccountantError::Unclipped {
            job_id: job.registration.job_id.clone(),
            step,
            norms: pending.norms,
            clipping_norm,
            sampled: pending.sampled,
            bound,
        });
    }
    Ok(())
}

/// A part of `attempt` may still be taken: the job is not suspended and the attempt's
/// generation not revoked (checked again under the step lock, after the capability's check).
fn check_admitted(job: &Job, attempt: u64) -> Result<(), AccountantError> {
    let admitted = job.generation.load(Ordering::SeqCst);
    let reason = if job.suspended.load(Ordering::SeqCst) {
        "the job was suspended (cancelled or failed) while the part streamed".to_owned()
    } else if attempt < admitted {
        format!("generation {attempt} was revoked while the part streamed ({admitted} is the oldest admitted)")
    } else {
        return Ok(());
    };
    Err(AccountantError::Revoked { job_id: job.registration.job_id.clone(), generation: attempt, reason })
}

fn check_step_open(job: &Job, progress: &Progress, step: u64) -> Result<(), AccountantError> {
    let id = &job.registration.job_id;
    match progress.phase {
        Phase::Closed => return Err(AccountantError::JobClosed { job_id: id.clone() }),
        Phase::BudgetExhausted => {
            return Err(AccountantError::refused(
                id,
                step,
                ErrorCode::BudgetExhausted,
                format!("budget exhausted after {} steps (epsilon {:.6})", progress.charged, progress.epsilon_spent),
            ));
        }
        Phase::Open => {}
    }
    if step < progress.next_step {
        return Err(AccountantError::refused(
            id,
            step,
            ErrorCode::StepAlreadyCharged,
            format!("step was already charged; the ledger expects step {}", progress.next_step),
        ));
    }
    if step > progress.next_step {
        return Err(AccountantError::refused(
            id,
            step,
            ErrorCode::StepNotNext,
            format!("step is not next; the ledger expects step {}", progress.next_step),
        ));
    }
    // After the two above: a retried part of the last planned step is "already charged".
    let planned = job.registration.contract.planned_steps;
    if planned > 0 && progress.charged >= planned {
        return Err(AccountantError::refused(
            id,
            step,
            ErrorCode::BudgetExhausted,
            format!("its contract plans {planned} steps, all charged: no step past the plan is charged"),
        ));
    }
    Ok(())
}
