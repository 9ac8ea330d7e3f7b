//! From a delivery to an attempt this worker owns: check the trigger (`verify`), decide how an
//! early one waits, then claim its attempt in PostgreSQL, or take the run over from a lost
//! worker.
//!
//! The claim is the guarantee that a duplicate delivery never executes twice: only the delivery
//! whose claim the run row accepts goes on to the handler. Every other delivery is settled here,
//! by what the run row says: a stale or duplicate delivery is acked, a retry or parked copy
//! whose publish failed is published again, the last delivery the broker allows ends the run
//! `dead`, and a trigger the run row contradicts is parked without touching the run.

use std::time::Duration;

use chime_protocol::RunState;
use chime_protocol::retry::{self, Wait};
use chime_protocol::wire::{HEADER_DELIVERY_COUNT, HEADER_NOT_BEFORE, Trigger};
use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::claims;
use crate::link::{Inbound, Link};
use crate::store::{Claim, ClaimClock, ClaimRequest, RunSnapshot, TakeOver, TakenOver};
use crate::verify::{self, Seen};

use super::settle::{
    dead_letter, dead_run, park_dead, publish_retry, requeue_after_publish_failure,
};
use super::shared::Shared;

/// How often a worker re-reads a run that is `running` on another worker while it waits for
/// that worker to be judged lost.
const TAKE_OVER_POLL: Duration = Duration::from_millis(50);
/// Take-overs refused in a row before a delivery gives up (each refusal means the run changed
/// between reading and taking it, so this only guards against a row that never matches).
const MAX_REFUSALS: u32 = 20;

/// Checks a decoded trigger and its delivery against `limits`, its queue's group and what the
/// broker can have written ([`verify::check`]); `Err` is the reason to park it.
pub(super) fn verify(shared: &Shared, delivery: &Inbound, trigger: &Trigger) -> Result<(), String> {
    let seen = Seen {
        group: shared.topology.group(),
        not_before_ms: delivery.header_integer(HEADER_NOT_BEFORE),
        delivery_count: delivery.header_integer(HEADER_DELIVERY_COUNT),
        redelivered: delivery.redelivered(),
        delivery_limit: shared.topology.delivery_limit(),
        now: Utc::now(),
    };
    verify::check(trigger, &seen)
}

/// When a delivery with a not-before instant starts.
pub(super) enum Start {
    /// Due already.
    Now,
    /// Due within the hold limit: claim now, start the handler at this instant.
    At(DateTime<Utc>),
    /// Sent through a delay tier (or requeued); this delivery is settled.
    Retiered,
}

/// Decides how a delayed message waits: held in memory for the last moments (the scheduler's
/// lead, the end of a retry's delay), or sent through another delay tier (confirmed, then the
/// original is acked).
pub(super) async fn plan_start(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    trigger: &Trigger,
    due: DateTime<Utc>,
) -> Start {
    // The header has millisecond precision; the trigger's own instant is exact. A delivery due
    // at its own instant is a trigger the scheduler published ahead (its lead grows with the
    // triggers due at that instant); any other is a retry's delay.
    let own_instant = due.timestamp_millis() == trigger.scheduled_at.timestamp_millis();
    let due = if own_instant {
        due.max(trigger.scheduled_at)
    } else {
        due
    };
    let remaining = (due - Utc::now()).to_std().unwrap_or_default();
    let wait = if own_instant {
        retry::plan_trigger_wait(remaining)
    } else {
        retry::plan_wait(remaining)
    };
    match wait {
        Wait::Now => Start::Now,
        Wait::Hold(wait) => {
            tracing::debug!(?wait, "due shortly; claiming it and holding it until due");
            Start::At(due)
        }
        Wait::Tier(_) => {
            match link
                .publish_delayed(
                    &shared.topology,
                    delivery,
                    delivery.body(),
                    trigger.attempt,
                    due,
                )
                .await
            {
                Ok(key) => {
                    tracing::debug!(?remaining, via = %key, "retry not due yet; sent through another delay tier");
                    delivery.ack().await;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot re-tier an early retry; requeueing it");
                    requeue_after_publish_failure(link, delivery).await;
                }
            }
            Start::Retiered
        }
    }
}

/// Claims the delivery's attempt, or takes the run over from a lost worker; returns the attempt
/// this worker now owns and the claim's clock. Every other case is settled here (see the module
/// docs). The steps, in order: [`Claiming::in_batch`] (the common case: a waiting run, claimed
/// with the deliveries that arrived together), then until a step decides,
/// [`Claiming::alone`] (which reads the run row when the claim is refused) and
/// [`Claiming::judge`] (what that row means for this delivery).
pub(super) async fn acquire(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    trigger: &Trigger,
    start_at: Option<DateTime<Utc>>,
) -> Option<(u32, ClaimClock)> {
    let claiming = Claiming::new(shared, link, delivery, trigger, start_at);
    let mut maybe_ours = false;
    if !claiming.last {
        match claiming.in_batch().await {
            claims::Batched::Claimed { clock } => return Some((trigger.attempt, clock)),
            claims::Batched::Alone { maybe_ours: m } => maybe_ours = m,
        }
    }
    let mut patience = Patience::default();
    loop {
        let run = match claiming.alone(maybe_ours).await {
            Alone::Claimed { clock } => return Some((trigger.attempt, clock)),
            Alone::Refused(run) => run,
            Alone::Settled => return None,
        };
        match claiming.judge(&run, &mut patience).await {
            Verdict::TookOver { attempt, clock } => return Some((attempt, clock)),
            Verdict::LookAgain => {}
            Verdict::Drop => {
                delivery.ack().await;
                return None;
            }
            Verdict::Settled => return None,
        }
    }
}

/// One delivery on its way to a claim: what every step of [`acquire`] looks at.
struct Claiming<'a> {
    shared: &'a Shared,
    link: &'a Link,
    delivery: &'a Inbound,
    trigger: &'a Trigger,
    /// When the handler is to start, for a trigger held for its instant.
    start_at: Option<DateTime<Utc>>,
    /// The work queue's delivery limit (0: none).
    limit: u32,
    /// How many times the work queue delivered this message before.
    deliveries: u32,
    /// This is the last delivery the broker allows (`x-delivery-limit`): it claims nothing, and
    /// a run waiting for it, or lost with its worker, ends `dead`.
    last: bool,
    /// The broker's `redelivered` flag.
    redelivered: bool,
    /// The trigger's attempt, as the run row types it.
    attempt: i32,
}

/// What claiming alone found.
enum Alone {
    /// The attempt is this worker's.
    Claimed { clock: ClaimClock },
    /// The claim was refused (or not tried, for the last delivery); the run row says why.
    Refused(RunSnapshot),
    /// No such run (acked), or no database (requeued).
    Settled,
}

/// What the run row means for a delivery whose claim it refused.
enum Verdict {
    /// This worker took the run over from a lost worker: it owns `attempt`.
    TookOver { attempt: u32, clock: ClaimClock },
    /// The run is changing under the delivery (its worker may be lost): look at it again.
    LookAgain,
    /// Not to be run here: ack it without running (each case logs why).
    Drop,
    /// Settled already: parked, its retry published again, or requeued.
    Settled,
}

/// How long a delivery keeps looking at a run that is changing under it.
#[derive(Default)]
struct Patience {
    /// Until when it waits for the run's worker to be judged lost.
    wait_deadline: Option<Instant>,
    /// Take-overs refused so far.
    refusals: u32,
}

impl<'a> Claiming<'a> {
    fn new(
        shared: &'a Shared,
        link: &'a Link,
        delivery: &'a Inbound,
        trigger: &'a Trigger,
        start_at: Option<DateTime<Utc>>,
    ) -> Self {
        let limit = shared.topology.delivery_limit();
        let deliveries = delivery.delivery_count();
        Claiming {
            shared,
            link,
            delivery,
            trigger,
            start_at,
            limit,
            deliveries,
            last: limit > 0 && deliveries >= limit,
            redelivered: delivery.redelivered(),
            attempt: i32::try_from(trigger.attempt).unwrap_or(i32::MAX),
        }
    }

    /// Claims the attempt in one statement with the other deliveries that arrived together.
    async fn in_batch(&self) -> claims::Batched {
        let claim = ClaimRequest {
            run_id: self.trigger.run_id,
            attempt: self.attempt,
            job: self.trigger.job.clone(),
            starts_at: self.start_at,
        };
        self.shared.claims.claim(claim).await
    }

    /// Claims the attempt alone, reading the run row if the claim is refused; the last delivery
    /// only reads the row. A missing run acks the delivery, a database error requeues it.
    async fn alone(&self, maybe_ours: bool) -> Alone {
        let (shared, trigger) = (self.shared, self.trigger);
        let found = if self.last {
            shared.store.snapshot(trigger.run_id).await
        } else {
            match shared
                .store
                .claim(
                    trigger,
                    &shared.id,
                    shared.topology.group(),
                    self.start_at,
                    maybe_ours,
                )
                .await
            {
                Ok(Claim::Claimed { clock }) => return Alone::Claimed { clock },
                Ok(Claim::Refused(run)) => Ok(run),
                Err(error) => Err(error),
            }
        };
        match found {
            Ok(Some(run)) => Alone::Refused(run),
            Ok(None) => {
                tracing::info!("stale delivery: no such run; acked without running");
                self.delivery.ack().await;
                Alone::Settled
            }
            Err(error) if crate::store::is_forbidden(&error) => {
                // The run is of a group this worker's database role may not act for: the
                // trigger names another group's run (forged or misrouted). Never retried.
                let reason = format!(
                    "implausible trigger: run {} is not of a group this worker may act for: {}",
                    trigger.run_id,
                    error
                        .as_database_error()
                        .map_or_else(|| error.to_string(), |db| db.message().to_owned())
                );
                dead_letter(shared, self.link, self.delivery, None, reason).await;
                Alone::Settled
            }
            Err(error) => {
                tracing::error!(%error, "cannot claim the run (database unavailable); requeueing the delivery");
                self.delivery.requeue().await;
                Alone::Settled
            }
        }
    }

    /// What `run`, the row that refused the claim, means for this delivery.
    async fn judge(&self, run: &RunSnapshot, patience: &mut Patience) -> Verdict {
        let (shared, link, delivery, trigger) =
            (self.shared, self.link, self.delivery, self.trigger);
        // The run row, not the message, says what the run is: a trigger that disagrees is forged
        // or corrupt, and is parked without touching the run it names.
        if let Some(reason) = disagreement(shared, trigger, run) {
            dead_letter(shared, link, delivery, None, reason).await;
            return Verdict::Settled;
        }
        let attempt = self.attempt;
        let waiting = run.state.is_waiting();
        match run.state {
            _ if waiting && run.attempt < attempt && run.cancel_requested => {
                tracing::info!(state = %run.state, "an operator cancelled the run before it started; acked without running");
                Verdict::Drop
            }
            _ if waiting && run.attempt < attempt && self.last && run.job_name == trigger.job => {
                let reason = format!(
                    "delivery limit reached: the trigger was delivered {} times without an ack \
                     (x-delivery-limit {}): workers holding it crashed or lost their channel; \
                     not run again, to stop a crash loop",
                    self.deliveries.saturating_add(1),
                    self.limit,
                );
                let run = dead_run(shared, trigger);
                dead_letter(shared, link, delivery, Some(run), reason).await;
                Verdict::Settled
            }
            RunState::Retrying if self.redelivered && run.attempt >= attempt => {
                // Our earlier delivery recorded the retry but could not publish it.
                let due = run.next_attempt_at.unwrap_or_else(Utc::now);
                let ran = u32::try_from(run.attempt).unwrap_or(trigger.attempt);
                tracing::info!(
                    next_attempt = ran.saturating_add(1),
                    "the run's retry may not have been published; publishing it again"
                );
                publish_retry(shared, link, delivery, ran, due).await;
                Verdict::Settled
            }
            RunState::Dead
                if self.redelivered && run.attempt >= attempt && run.reason.is_some() =>
            {
                let reason = run.reason.as_deref().unwrap_or_default();
                tracing::info!(%reason, "the dead run's message may not have been parked; parking it again");
                park_dead(shared, link, delivery, reason, run.error.as_deref()).await;
                Verdict::Settled
            }
            // A later attempt than the message's: a take-over of this very message (its body
            // keeps the attempt it was published with) that was lost in turn.
            RunState::Running if run.attempt >= attempt && run.job_name == trigger.job => {
                self.running(run, patience).await
            }
            _ => {
                tracing::info!(
                    state = %run.state,
                    run_attempt = run.attempt,
                    run_job = %run.job_name,
                    run_worker = run.worker_id.as_deref().unwrap_or("-"),
                    "duplicate or stale delivery: the run is not waiting for this attempt; acked without running"
                );
                Verdict::Drop
            }
        }
    }

    /// A run `running` at this attempt or later: a duplicate of this worker's own, taken over
    /// from a lost worker (or this worker's earlier life), or left to the live worker running
    /// it, after waiting to see whether a redelivery means that worker just died.
    async fn running(&self, run: &RunSnapshot, patience: &mut Patience) -> Verdict {
        let holder = run.worker_id.clone().unwrap_or_default();
        let ours = holder == self.shared.id;
        if ours && !run.holder_restarted {
            tracing::info!(
                "duplicate delivery of an attempt this worker is running; acked without running"
            );
            Verdict::Drop
        } else if run.worker_lost || ours {
            // `ours` here: claimed by this worker id before it last registered.
            let taken = self.take_over(run, &holder, ours).await;
            self.after_take_over(taken, &holder, patience).await
        } else if self.redelivered || self.last {
            // Its worker may have just died: the broker redelivers at once, the heartbeat goes
            // stale only after three intervals.
            let interval = run.worker_interval_ms.unwrap_or(5_000).max(1);
            let wait = Duration::from_millis(3 * interval as u64) + Duration::from_secs(1);
            let deadline = *patience.wait_deadline.get_or_insert_with(|| {
                tracing::info!(worker = %holder, patience = ?wait, "run is running on another worker; waiting to see if that worker is lost");
                Instant::now() + wait
            });
            if Instant::now() < deadline {
                tokio::time::sleep(TAKE_OVER_POLL).await;
                return Verdict::LookAgain;
            }
            tracing::info!(
                worker = %holder,
                "duplicate delivery: the run is still running on a live worker, which records it; acked without running"
            );
            Verdict::Drop
        } else {
            tracing::info!(
                worker = %holder,
                "duplicate delivery: the run is running on another worker; acked without running"
            );
            Verdict::Drop
        }
    }

    /// Records `run`'s attempt `lost` with its worker `holder` and claims the next one; ends the
    /// run `dead` instead on the last delivery or when no attempt is left.
    async fn take_over(
        &self,
        run: &RunSnapshot,
        holder: &str,
        own_earlier_life: bool,
    ) -> Result<TakenOver, sqlx::Error> {
        let (shared, trigger) = (self.shared, self.trigger);
        let lost_error = if own_earlier_life {
            format!("worker {holder} restarted while running this attempt")
        } else {
            format!(
                "worker {holder} was lost while running this attempt (no heartbeat for 3 × {} ms, \
                 or stopped)",
                run.worker_interval_ms.unwrap_or(5_000)
            )
        };
        let limit = self.limit;
        let lost = u32::try_from(run.attempt).unwrap_or(trigger.attempt);
        let dead_reason = self.last.then(|| {
            format!(
                "delivery limit reached: the trigger was delivered {} times without an ack \
                 (x-delivery-limit {limit}); attempt {lost} was lost with worker {holder}",
                self.deliveries.saturating_add(1),
            )
        });
        let taken = shared
            .store
            .take_over(
                &TakeOver {
                    run_id: trigger.run_id,
                    job: &trigger.job,
                    attempt: lost,
                    lost_worker: holder,
                    lost_error: &lost_error,
                    require_lost: !own_earlier_life,
                    delivery_limit: limit,
                    dead_reason,
                },
                &shared.id,
            )
            .await?;
        if let TakenOver::Claimed { attempt, .. } = taken {
            tracing::warn!(lost_worker = %holder, lost_attempt = lost, attempt, "{lost_error}; took the run over as attempt {attempt}");
        }
        Ok(taken)
    }

    /// What a take-over's answer means for this delivery.
    async fn after_take_over(
        &self,
        taken: Result<TakenOver, sqlx::Error>,
        holder: &str,
        patience: &mut Patience,
    ) -> Verdict {
        match taken {
            Ok(TakenOver::Claimed { attempt, clock }) => Verdict::TookOver { attempt, clock },
            Ok(TakenOver::Dead { reason }) => {
                tracing::error!(%reason, lost_worker = %holder, "run dead: its attempt was lost with its worker, and no attempt is left");
                park_dead(self.shared, self.link, self.delivery, &reason, None).await;
                Verdict::Settled
            }
            Ok(TakenOver::Cancelled) => {
                tracing::info!(lost_worker = %holder, "lost attempt recorded; the run was cancelled by an operator");
                Verdict::Drop
            }
            Ok(TakenOver::Refused) if patience.refusals < MAX_REFUSALS => {
                patience.refusals += 1;
                tracing::debug!(
                    "take-over refused (the run moved on, or its worker is back); looking again"
                );
                tokio::time::sleep(TAKE_OVER_POLL).await;
                Verdict::LookAgain
            }
            Ok(TakenOver::Refused) => {
                tracing::error!(
                    lost_worker = %holder,
                    "the run looks taken by a lost worker but cannot be taken over \
                     (is its attempt row missing?); acked without running, the \
                     scheduler's rescuer handles it"
                );
                Verdict::Drop
            }
            Err(error) => {
                tracing::error!(%error, "cannot take the run over (database unavailable); requeueing the delivery");
                self.delivery.requeue().await;
                Verdict::Settled
            }
        }
    }
}

/// Why the run row contradicts `trigger`, if it does: another job or group, or (for a run still
/// waiting) an attempt that skips past the one after the run's last.
fn disagreement(shared: &Shared, trigger: &Trigger, run: &RunSnapshot) -> Option<String> {
    let group = shared.topology.group();
    if run.job_name != trigger.job || run.group_name != group {
        return Some(format!(
            "{}it names job {} for run {}, which is job {} of group {}: the run is left as it is",
            verify::IMPLAUSIBLE,
            verify::quote(&trigger.job),
            trigger.run_id,
            verify::quote(&run.job_name),
            verify::quote(&run.group_name),
        ));
    }
    let waiting = run.state.is_waiting();
    let expected = i64::from(run.attempt) + 1;
    if waiting && i64::from(trigger.attempt) > expected {
        return Some(format!(
            "{}attempt {} of run {}, whose next attempt is {expected} (the database's history): \
             the run is left as it is",
            verify::IMPLAUSIBLE,
            trigger.attempt,
            trigger.run_id,
        ));
    }
    None
}
