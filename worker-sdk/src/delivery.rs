//! One delivery, start to finish: decode, dead-letter what cannot run, claim (or take over from
//! a lost worker), hold it until it is due, execute, record, then retry, park or ack.
//!
//! The order is the guarantee. The claim comes before the handler, so a duplicate delivery of an
//! attempt never executes twice; the outcome is committed before anything is published or
//! acked, so an ack never hides a lost record and a lost or hung worker's late outcome is fenced
//! out; a retry or a parked copy is confirmed by the broker before the original is acked, so a
//! crash in between can duplicate it (the claim drops the duplicate) but never lose it. Each of
//! those steps can be redone by a redelivery of the original: a run found `retrying` or `dead`
//! at this attempt has its retry published (or its message parked) again.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chime_protocol::limits::cap_header_value;
use chime_protocol::retry::{self, Wait};
use chime_protocol::topology::RETRY_TIERS;
use chime_protocol::wire::{HEADER_DELIVERY_COUNT, HEADER_NOT_BEFORE, Trigger};
use chime_protocol::{AttemptState, RunState};
use chrono::{DateTime, TimeDelta, Utc};
use futures::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::claims;
use crate::consumer::Link;
use crate::context::{JobContext, JobLogger, Level, LogLine, LogSink, MAX_PENDING_BATCHES};
use crate::delay;
use crate::handler::ErasedHandler;
use crate::outcome::{self, Ending, Execution, Outcome, RunEnd};
use crate::parking;
use crate::recording::Batched;
use crate::store::{
    AttemptRecord, Claim, ClaimClock, ClaimRequest, DeadRun, Recorded, RunSnapshot, TakeOver,
    TakenOver,
};
use crate::verify::{self, Seen};
use crate::worker::{Entered, InFlight, Shared, Unrecorded};

/// How often a worker re-reads a run that is `running` on another worker while it waits for
/// that worker to be judged lost.
const TAKE_OVER_POLL: Duration = Duration::from_millis(50);
/// Take-overs refused in a row before a delivery gives up (each refusal means the run changed
/// between reading and taking it, so this only guards against a row that never matches).
const MAX_REFUSALS: u32 = 20;
/// Pause before requeueing a message whose publish failed, so a broken broker does not spin.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

/// A delivery, and whether it has been settled (acked early by `ack_after`, or acked or
/// requeued): settling twice is a no-op.
pub(crate) struct Inbound {
    delivery: Delivery,
    settled: AtomicBool,
    /// The run and attempt this delivery claimed (or took over), once it has: what a panic
    /// further on must record.
    claimed: Mutex<Option<(i64, u32)>>,
}

impl Inbound {
    fn new(delivery: Delivery) -> Self {
        Inbound {
            delivery,
            settled: AtomicBool::new(false),
            claimed: Mutex::new(None),
        }
    }

    fn set_claimed(&self, run_id: i64, attempt: u32) {
        *self.claimed.lock().unwrap_or_else(|e| e.into_inner()) = Some((run_id, attempt));
    }

    fn claimed(&self) -> Option<(i64, u32)> {
        *self.claimed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_settled(&self) -> bool {
        self.settled.load(Ordering::SeqCst)
    }

    async fn ack(&self) {
        if !self.settled.swap(true, Ordering::SeqCst) {
            ack(&self.delivery).await;
        }
    }

    async fn requeue(&self) {
        if self.settled.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "the delivery was already acked early (ack_after), so it cannot be requeued; the \
                 run stays as recorded and the scheduler's rescuer republishes a run stuck in \
                 `retrying` or `running`"
            );
        } else {
            requeue(&self.delivery).await;
        }
    }
}

/// How many handler names an "unknown job" reason lists before it only counts the rest.
const LISTED_JOBS: usize = 20;

/// Handles one delivery; never fails (every path ends in an ack or a requeue, and a log line).
/// A panic anywhere on the way (a bug, or an input nobody foresaw) is caught here: the attempt
/// the delivery claimed, if any, is recorded failed and its run `dead`, and the message is
/// parked with the panic as its reason, so a run never stays `running` on a live worker.
pub(crate) async fn handle(shared: Arc<Shared>, link: Arc<Link>, delivery: Delivery) {
    let inbound = Arc::new(Inbound::new(delivery));
    let path = route(shared.clone(), link.clone(), inbound.clone());
    let Err(panic) = AssertUnwindSafe(path).catch_unwind().await else {
        return;
    };
    let message = panic_message(panic.as_ref());
    let reason = format!("the worker panicked handling this delivery: {message}");
    tracing::error!(%reason, "per-delivery path panicked; recording and parking");
    after_panic(&shared, &link, &inbound, reason).await;
}

/// Ends a delivery whose path panicked: records the attempt it claimed as failed and its run
/// `dead` (fenced like any outcome: only while that attempt is still `running` on this worker),
/// then parks the message unless it was settled already.
async fn after_panic(shared: &Shared, link: &Link, inbound: &Inbound, reason: String) {
    if let Some((run_id, attempt)) = inbound.claimed() {
        let outcome = Outcome {
            attempt: AttemptState::Failed,
            run: RunEnd::Dead {
                reason: reason.clone(),
            },
            error: Some(reason.clone()),
        };
        let record = AttemptRecord {
            outcome: &outcome,
            next_attempt_at: None,
            duration: Duration::ZERO,
            lines: &[],
            started_at: None,
        };
        match shared
            .store
            .record_outcome(run_id, attempt, &shared.id, &record, false)
            .await
        {
            Ok(recorded) => log_recorded(recorded, &outcome),
            Err(error) => tracing::error!(
                %error,
                run_id,
                "cannot record the panicked attempt; the scheduler's rescuer takes the run once \
                 this worker stops"
            ),
        }
    }
    if !inbound.is_settled() {
        dead_letter(shared, link, inbound, None, reason).await;
    }
}

/// Decodes and checks the delivery, then runs it; everything but a panic ends here.
async fn route(shared: Arc<Shared>, link: Arc<Link>, delivery: Arc<Inbound>) {
    let trigger = match Trigger::from_body(&delivery.delivery.data) {
        Ok(trigger) => trigger,
        Err(error) => {
            // The message id names a run, but nothing vouches for it: the run is left as it is
            // (a forged message must not end a real run); the parked copy keeps the reason.
            let run_id = delivery
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| verify::quote(id.as_str()));
            let span = tracing::warn_span!("undecodable", run_id);
            return dead_letter(&shared, &link, &delivery, None, error.to_string())
                .instrument(span)
                .await;
        }
    };
    let span = tracing::info_span!(
        "run",
        run_id = trigger.run_id,
        job = %verify::quote(&trigger.job),
        attempt = trigger.attempt
    );
    let seen = Seen {
        group: shared.topology.group(),
        not_before_ms: delay::header_integer(&delivery.delivery, HEADER_NOT_BEFORE),
        delivery_count: delay::header_integer(&delivery.delivery, HEADER_DELIVERY_COUNT),
        redelivered: delivery.delivery.redelivered,
        delivery_limit: shared.topology.delivery_limit(),
        now: Utc::now(),
    };
    if let Err(reason) = verify::check(&trigger, &seen) {
        return dead_letter(&shared, &link, &delivery, None, reason)
            .instrument(span)
            .await;
    }
    run(shared, link, delivery, trigger).instrument(span).await
}

/// "unknown job" reason: names at most [`LISTED_JOBS`] of the worker's handlers and counts
/// the rest, so a worker with thousands of handlers still writes a short header.
fn unknown_job_reason(job: &str, worker: &str, group: &str, mut jobs: Vec<String>) -> String {
    jobs.sort();
    let total = jobs.len();
    let mut listed = jobs
        .into_iter()
        .take(LISTED_JOBS)
        .map(|j| verify::quote(&j))
        .collect::<Vec<_>>()
        .join(", ");
    if total > LISTED_JOBS {
        listed.push_str(&format!(" and {} more", total - LISTED_JOBS));
    }
    format!(
        "unknown job {}: worker {} of group {} has handlers for {listed}",
        verify::quote(job),
        verify::quote(worker),
        verify::quote(group)
    )
}

/// Why a run waits for a worker with its job's handler, until `until`.
fn unhandled_reason(job: &str, group: &str, until: DateTime<Utc>) -> String {
    format!(
        "no worker handles this job (waiting until {}): no online worker of group {} has a \
         handler for {}; then it is parked",
        until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        verify::quote(group),
        verify::quote(job),
    )
}

/// A trigger of a job this worker has no handler for: during a rolling deploy, a job only newer
/// (or older) workers of the group know. Never requeued (a requeue counts toward the work
/// queue's delivery limit and comes straight back): a copy goes through a delay tier, confirmed,
/// then the original is acked. If another online worker of the group declares the handler, the
/// copy goes through the shortest tier, for that worker. If none does, the run waits: its
/// `reason` says so (its state stays) and the copy pauses 5 to 30 s, until `unhandled_wait`
/// after the run's scheduled instant; then it is parked as an unknown job, as a job nobody will
/// ever handle.
async fn unhandled(shared: &Shared, link: &Link, delivery: &Inbound, trigger: &Trigger) {
    let group = shared.topology.group();
    let now = Utc::now();
    let until = due_after(trigger.scheduled_at, shared.unhandled_wait);
    let waiting = until.filter(|until| now < *until);
    let run = dead_run(shared, trigger);
    let tier = match shared
        .store
        .handled_elsewhere(group, &trigger.job, &shared.id)
        .await
    {
        Ok(true) => {
            tracing::info!(
                "no handler for this job here, but another online worker of the group has one; \
                 sending the trigger back for it"
            );
            RETRY_TIERS[0]
        }
        Ok(false) => {
            let Some(until) = waiting else {
                let reason =
                    unknown_job_reason(&trigger.job, &shared.id, group, shared.handlers.jobs());
                return dead_letter(shared, link, delivery, Some(run), reason).await;
            };
            let reason = unhandled_reason(&trigger.job, group, until);
            match shared
                .store
                .mark_unhandled(run, &cap_header_value(&reason))
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    // No run waits for this attempt (stale, or it moved on): nothing to wait for.
                    let reason =
                        unknown_job_reason(&trigger.job, &shared.id, group, shared.handlers.jobs());
                    return dead_letter(shared, link, delivery, Some(run), reason).await;
                }
                Err(error) => tracing::error!(%error, "cannot record why the run waits"),
            }
            tracing::info!(%reason, "no online worker has a handler for this job; the run waits");
            let waited = (now - trigger.scheduled_at).to_std().unwrap_or_default();
            let left = (until - now).to_std().unwrap_or_default();
            retry::unhandled_pause(waited, left)
        }
        Err(error) => {
            // Nothing is decided without the registry: the run waits, unmarked, and is looked
            // at again after the pause.
            tracing::error!(%error, "cannot look for a worker with this job's handler; sending the trigger back");
            retry::unhandled_pause(Duration::ZERO, Duration::MAX)
        }
    };
    // The copy keeps its instant: one due later (a retry) still waits it out where it is run.
    let due = delay::not_before(&delivery.delivery).unwrap_or(now);
    match delay::publish_via(
        &link.publish,
        &shared.topology,
        &delivery.delivery.properties,
        &delivery.delivery.data,
        trigger.attempt,
        Some(tier),
        due,
    )
    .await
    {
        Ok(key) => {
            tracing::debug!(via = %key, "trigger of an unhandled job sent back");
            delivery.ack().await;
        }
        Err(error) => {
            tracing::error!(%error, "cannot send the trigger of an unhandled job back; requeueing it");
            requeue_after_publish_failure(link, delivery).await;
        }
    }
}

async fn run(shared: Arc<Shared>, link: Arc<Link>, delivery: Arc<Inbound>, mut trigger: Trigger) {
    let Some(handler) = shared.handlers.get(&trigger.job).cloned() else {
        return unhandled(&shared, &link, &delivery, &trigger).await;
    };

    // One delivery of a run at a time in this worker (see `Store::claim`). A later attempt
    // (its retry, published just before this worker acks the earlier one) waits its turn.
    let slot = match shared.enter(trigger.run_id, trigger.attempt).await {
        Entered::Yes(slot) => slot,
        Entered::Duplicate => {
            tracing::info!(
                "duplicate delivery of a run this worker is handling right now; acked without running"
            );
            return delivery.ack().await;
        }
        Entered::Busy => {
            tracing::warn!("a later attempt of a run this worker is still handling; requeueing it");
            return delivery.requeue().await;
        }
    };

    // An earlier delivery of this attempt ran here but could not record its outcome.
    if let Some(pending) = shared.take_unrecorded(trigger.run_id, trigger.attempt) {
        tracing::info!("redelivery of an attempt whose outcome is not recorded yet; recording it");
        return finish(&shared, &link, &delivery, trigger.run_id, pending).await;
    }

    // A trigger published ahead of its instant (the scheduler's lead) or a retry due within
    // the hold limit is claimed now and started at its instant; one due later goes through a
    // delay tier.
    let start_at = match delay::not_before(&delivery.delivery) {
        None => None,
        Some(due) => match plan_start(&shared, &link, &delivery, &trigger, due).await {
            Start::Now => None,
            Start::At(at) => Some(at),
            Start::Retiered => return,
        },
    };

    // At most `capacity` handlers run at once, but the claim comes first, outside the slots,
    // for a due delivery as for one held for its instant: a slot taken before the claim would
    // stay busy for the claim's round trip, so that once deliveries arrive late (a backlog)
    // throughput would fall to `capacity` / claim latency, just when it is most needed. The
    // claimed runs waiting for a slot are bounded by the prefetch (`capacity + hold`), and
    // the outcome records when each handler really started.
    let Some((attempt, claim)) = acquire(&shared, &link, &delivery, &trigger, start_at).await
    else {
        return;
    };
    delivery.set_claimed(trigger.run_id, attempt);
    if attempt != trigger.attempt {
        tracing::Span::current().record("attempt", attempt);
        trigger.attempt = attempt;
    }

    // Claimed: only the handler's start is left for the instant. The wait holds the delivery
    // (unacked, within the prefetch's hold budget) but not a handler slot.
    if let Some(at) = start_at
        && (at - Utc::now()).to_std().is_ok()
    {
        hold_until(at).await;
    }
    let handler_slot = shared.handler_slots.acquire().await.ok();
    // The handler starts now, however long the instant or a free slot kept it. Its start goes
    // on record on the database's clock (see `ClaimClock`): a claim ahead of its instant wrote
    // the instant, but a worker saturated at that instant starts later. The duration runs from
    // here.
    let started = Instant::now();
    let started_at = claim.started_at(started.into_std());
    let job: Arc<str> = trigger.job.as_str().into();
    let (flush_tx, flush_rx) = mpsc::channel(MAX_PENDING_BATCHES);
    let sink = Arc::new(LogSink::new(
        trigger.run_id,
        job.clone(),
        trigger.attempt,
        Some(flush_tx),
    ));
    let params = std::mem::take(&mut trigger.params);
    let ctx = JobContext::new(
        trigger.run_id,
        job,
        trigger.attempt,
        trigger.scheduled_at,
        params.clone(),
        slot.token.clone(),
        JobLogger::new(sink.clone()),
    );
    let timeout = trigger.timeout_ms.map(Duration::from_millis);
    tracing::debug!("claimed; running the handler");
    let done = CancellationToken::new();
    let (execution, lost_lines) = tokio::join!(
        async {
            // Re-checked at the instant: an operator's cancel (a control message) or the
            // worker's shutdown may have come while the claimed trigger was held.
            let execution = if slot.token.is_cancelled() {
                tracing::info!("cancelled while held for its instant; the handler is not started");
                not_started(&shared, &slot)
            } else {
                execute(&shared, &delivery, &handler, ctx, params, &slot, timeout).await
            };
            // The handler is done: its slot is free while the outcome is written.
            drop(handler_slot);
            done.cancel();
            execution
        },
        flush_logs(&shared, trigger.run_id, trigger.attempt, flush_rx, &done),
    );
    let duration = started.elapsed();
    let mut lines = sink.finish();
    if lost_lines > 0 {
        lines.push(LogLine {
            at: Utc::now(),
            level: Level::Warn,
            message: format!(
                "{lost_lines} log lines were lost because the log store was unavailable"
            ),
        });
    }
    let mut outcome = outcome::outcome(
        trigger.attempt,
        execution,
        shared.cancel_grace,
        trigger.retry.as_ref(),
        fastrand::f64(),
    );
    let next_attempt_at = match &outcome.run {
        RunEnd::Retry { delay } => match due_after(Utc::now(), *delay) {
            Some(due) => Some(due),
            None => {
                // Unreachable for a checked trigger (delays are at most MAX_RETRY_DELAY); an
                // instant past chrono's range must end the run, not panic the task.
                outcome.run = RunEnd::Dead {
                    reason: format!(
                        "retry delay {delay:?} puts the next attempt beyond any representable \
                         instant; not retried"
                    ),
                };
                None
            }
        },
        _ => None,
    };
    match &outcome.error {
        None => tracing::info!(?duration, "run succeeded"),
        Some(error) => tracing::warn!(
            ?duration,
            attempt_state = outcome.attempt.as_str(),
            run_state = outcome.run.state().as_str(),
            next_attempt_at = next_attempt_at.map(|t| t.to_rfc3339()),
            error = %error,
            "run did not succeed"
        ),
    }
    let pending = Unrecorded {
        attempt: trigger.attempt,
        outcome,
        next_attempt_at,
        duration,
        lines,
        started_at,
    };
    finish(&shared, &link, &delivery, trigger.run_id, pending).await
}

/// `now + delay`, or `None` when that is not a representable instant.
fn due_after(now: DateTime<Utc>, delay: Duration) -> Option<DateTime<Utc>> {
    now.checked_add_signed(TimeDelta::from_std(delay).ok()?)
}

/// The monotonic instant `after` from now, or `None` (never) when that overflows the clock.
fn deadline_after(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}

/// When a delivery with a not-before instant starts.
enum Start {
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
async fn plan_start(
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
            match delay::publish(
                &link.publish,
                &shared.topology,
                &delivery.delivery.properties,
                &delivery.delivery.data,
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

/// Sleeps until the wall clock reaches `at` (never returns before it: tokio's timer rounds up).
async fn hold_until(at: DateTime<Utc>) {
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

/// The execution of a claimed attempt whose token fired before its handler started: recorded
/// like a handler that saw the cancellation at once (an operator's cancel ends the run
/// `cancelled`; a shutdown makes it a retryable interruption).
fn not_started(shared: &Shared, slot: &InFlight<'_>) -> Execution {
    Execution {
        ending: Ending::Returned(Err(crate::JobError::cancel(
            "cancelled before its instant; the handler was not started",
        ))),
        timed_out: None,
        interrupted: shared.stop_handlers.is_cancelled(),
        cancel_requested: slot.cancel_requested.load(Ordering::SeqCst),
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

/// Claims the delivery's attempt, or takes the run over from a lost worker; returns the attempt
/// this worker now owns. Every other case is settled here: a stale or duplicate delivery is
/// acked, a retry or parked copy whose publish failed is published again, the last delivery the
/// broker allows ends the run `dead`.
async fn acquire(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    trigger: &Trigger,
    start_at: Option<DateTime<Utc>>,
) -> Option<(u32, ClaimClock)> {
    let limit = shared.topology.delivery_limit();
    let deliveries = delay::delivery_count(&delivery.delivery);
    let last = limit > 0 && deliveries >= limit;
    let redelivered = delivery.delivery.redelivered;
    let attempt = i32::try_from(trigger.attempt).unwrap_or(i32::MAX);
    let mut wait_deadline: Option<Instant> = None;
    let mut refusals = 0;
    // The common case, a waiting run, goes with the other deliveries that arrived together.
    let mut maybe_ours = false;
    if !last {
        let claim = ClaimRequest {
            run_id: trigger.run_id,
            attempt,
            job: trigger.job.clone(),
            starts_at: start_at,
        };
        match shared.claims.claim(claim).await {
            claims::Batched::Claimed { clock } => return Some((trigger.attempt, clock)),
            claims::Batched::Alone { maybe_ours: m } => maybe_ours = m,
        }
    }
    loop {
        let found = if last {
            shared.store.snapshot(trigger.run_id).await
        } else {
            match shared
                .store
                .claim(
                    trigger,
                    &shared.id,
                    shared.topology.group(),
                    start_at,
                    maybe_ours,
                )
                .await
            {
                Ok(Claim::Claimed { clock }) => return Some((trigger.attempt, clock)),
                Ok(Claim::Refused(run)) => Ok(run),
                Err(error) => Err(error),
            }
        };
        let run = match found {
            Ok(Some(run)) => run,
            Ok(None) => {
                tracing::info!("stale delivery: no such run; acked without running");
                delivery.ack().await;
                return None;
            }
            Err(error) => {
                tracing::error!(%error, "cannot claim the run (database unavailable); requeueing the delivery");
                delivery.requeue().await;
                return None;
            }
        };
        // The run row, not the message, says what the run is: a trigger that disagrees is forged
        // or corrupt, and is parked without touching the run it names.
        if let Some(reason) = disagreement(shared, trigger, &run) {
            dead_letter(shared, link, delivery, None, reason).await;
            return None;
        }
        let waiting = run.state.is_waiting();
        match run.state {
            _ if waiting && run.attempt < attempt && run.cancel_requested => {
                tracing::info!(state = %run.state, "an operator cancelled the run before it started; acked without running");
            }
            _ if waiting && run.attempt < attempt && last && run.job_name == trigger.job => {
                let reason = format!(
                    "delivery limit reached: the trigger was delivered {} times without an ack \
                     (x-delivery-limit {limit}): workers holding it crashed or lost their channel; \
                     not run again, to stop a crash loop",
                    deliveries.saturating_add(1)
                );
                let run = dead_run(shared, trigger);
                dead_letter(shared, link, delivery, Some(run), reason).await;
                return None;
            }
            RunState::Retrying if redelivered && run.attempt >= attempt => {
                // Our earlier delivery recorded the retry but could not publish it.
                let due = run.next_attempt_at.unwrap_or_else(Utc::now);
                let ran = u32::try_from(run.attempt).unwrap_or(trigger.attempt);
                tracing::info!(
                    next_attempt = ran.saturating_add(1),
                    "the run's retry may not have been published; publishing it again"
                );
                publish_retry(shared, link, delivery, ran, due).await;
                return None;
            }
            RunState::Dead if redelivered && run.attempt >= attempt && run.reason.is_some() => {
                let reason = run.reason.as_deref().unwrap_or_default();
                tracing::info!(%reason, "the dead run's message may not have been parked; parking it again");
                park_dead(shared, link, delivery, reason, run.error.as_deref()).await;
                return None;
            }
            // A later attempt than the message's: a take-over of this very message (its body
            // keeps the attempt it was published with) that was lost in turn.
            RunState::Running if run.attempt >= attempt && run.job_name == trigger.job => {
                let holder = run.worker_id.clone().unwrap_or_default();
                let ours = holder == shared.id;
                if ours && !run.holder_restarted {
                    tracing::info!(
                        "duplicate delivery of an attempt this worker is running; acked without running"
                    );
                } else if run.worker_lost || ours {
                    // `ours` here: claimed by this worker id before it last registered.
                    match take_over(shared, trigger, &run, &holder, ours, last, deliveries).await {
                        Ok(TakenOver::Claimed { attempt, clock }) => {
                            return Some((attempt, clock));
                        }
                        Ok(TakenOver::Dead { reason }) => {
                            tracing::error!(%reason, lost_worker = %holder, "run dead: its attempt was lost with its worker, and no attempt is left");
                            park_dead(shared, link, delivery, &reason, None).await;
                            return None;
                        }
                        Ok(TakenOver::Cancelled) => {
                            tracing::info!(lost_worker = %holder, "lost attempt recorded; the run was cancelled by an operator");
                        }
                        Ok(TakenOver::Refused) if refusals < MAX_REFUSALS => {
                            refusals += 1;
                            tracing::debug!(
                                "take-over refused (the run moved on, or its worker is back); looking again"
                            );
                            tokio::time::sleep(TAKE_OVER_POLL).await;
                            continue;
                        }
                        Ok(TakenOver::Refused) => {
                            tracing::error!(
                                lost_worker = %holder,
                                "the run looks taken by a lost worker but cannot be taken over \
                                 (is its attempt row missing?); acked without running, the \
                                 scheduler's rescuer handles it"
                            );
                        }
                        Err(error) => {
                            tracing::error!(%error, "cannot take the run over (database unavailable); requeueing the delivery");
                            delivery.requeue().await;
                            return None;
                        }
                    }
                } else if redelivered || last {
                    // Its worker may have just died: the broker redelivers at once, the
                    // heartbeat goes stale only after three intervals.
                    let interval = run.worker_interval_ms.unwrap_or(5_000).max(1);
                    let patience =
                        Duration::from_millis(3 * interval as u64) + Duration::from_secs(1);
                    let deadline = *wait_deadline.get_or_insert_with(|| {
                        tracing::info!(worker = %holder, ?patience, "run is running on another worker; waiting to see if that worker is lost");
                        Instant::now() + patience
                    });
                    if Instant::now() < deadline {
                        tokio::time::sleep(TAKE_OVER_POLL).await;
                        continue;
                    }
                    tracing::info!(
                        worker = %holder,
                        "duplicate delivery: the run is still running on a live worker, which records it; acked without running"
                    );
                } else {
                    tracing::info!(
                        worker = %holder,
                        "duplicate delivery: the run is running on another worker; acked without running"
                    );
                }
            }
            _ => tracing::info!(
                state = %run.state,
                run_attempt = run.attempt,
                run_job = %run.job_name,
                run_worker = run.worker_id.as_deref().unwrap_or("-"),
                "duplicate or stale delivery: the run is not waiting for this attempt; acked without running"
            ),
        }
        delivery.ack().await;
        return None;
    }
}

async fn take_over(
    shared: &Shared,
    trigger: &Trigger,
    run: &RunSnapshot,
    holder: &str,
    own_earlier_life: bool,
    last: bool,
    deliveries: u32,
) -> Result<TakenOver, sqlx::Error> {
    let lost_error = if own_earlier_life {
        format!("worker {holder} restarted while running this attempt")
    } else {
        format!(
            "worker {holder} was lost while running this attempt (no heartbeat for 3 × {} ms, \
             or stopped)",
            run.worker_interval_ms.unwrap_or(5_000)
        )
    };
    let limit = shared.topology.delivery_limit();
    let lost = u32::try_from(run.attempt).unwrap_or(trigger.attempt);
    let dead_reason = last.then(|| {
        format!(
            "delivery limit reached: the trigger was delivered {} times without an ack \
             (x-delivery-limit {limit}); attempt {lost} was lost with worker {holder}",
            deliveries.saturating_add(1),
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

/// Runs the handler in its own task under its timeout, the operator's cancel and the worker's
/// shutdown, acking the delivery early once it has run for `ack_after`.
async fn execute(
    shared: &Shared,
    delivery: &Inbound,
    handler: &ErasedHandler,
    ctx: JobContext,
    params: serde_json::Value,
    slot: &InFlight<'_>,
    timeout: Option<Duration>,
) -> Execution {
    let token = &slot.token;
    // Its own task, so a handler that ignores its token (or blocks a thread) cannot stop this
    // one from giving up on it; `abort` then drops it at its next await point. The handler is
    // called (its params decoded, its future built) inside the task too, so a panic there is a
    // handler panic like any other, recorded under the retry policy.
    let handler = handler.clone();
    let mut task = tokio::spawn(async move { handler(ctx, params).await });
    let start = Instant::now();
    let deadline = timeout.and_then(|t| start.checked_add(t));
    let ack_at = start.checked_add(shared.ack_after);
    let mut acked_early = false;
    let mut timed_out = None;
    // Set once the handler's token fired: it has this long to return.
    // (`graced` with no deadline: a grace too long for the clock, so never abandoned.)
    let mut grace_deadline: Option<Instant> = None;
    let mut graced = token.is_cancelled();
    if graced {
        grace_deadline = start.checked_add(shared.cancel_grace);
    }
    let ending = loop {
        tokio::select! {
            joined = &mut task => break match joined {
                Ok(returned) => Ending::Returned(returned),
                Err(e) if e.is_panic() => Ending::Panicked(panic_message(e.into_panic().as_ref())),
                Err(_) => Ending::Abandoned,
            },
            _ = sleep_until(deadline), if timed_out.is_none() && !graced => {
                tracing::warn!(timeout = ?timeout, "job timeout elapsed; cancelling the handler");
                timed_out = timeout;
                token.cancel();
                graced = true;
                grace_deadline = deadline_after(shared.cancel_grace);
            }
            _ = token.cancelled(), if !graced => {
                graced = true;
                grace_deadline = deadline_after(shared.cancel_grace);
            }
            _ = sleep_until(grace_deadline), if graced => break Ending::Abandoned,
            _ = shared.abandon.cancelled() => break Ending::Abandoned,
            _ = sleep_until(ack_at), if !acked_early => {
                acked_early = true;
                tracing::info!(
                    ack_after = ?shared.ack_after,
                    "handler still running: acked its delivery early (before the broker's consumer \
                     timeout); the heartbeat and the scheduler's rescuer protect the run from now on"
                );
                delivery.ack().await;
            }
        }
    };
    if matches!(ending, Ending::Abandoned) {
        task.abort();
        tracing::error!(grace = ?shared.cancel_grace, "handler ignored its cancellation; abandoned (its task is aborted at its next await)");
    }
    Execution {
        ending,
        timed_out,
        interrupted: shared.stop_handlers.is_cancelled(),
        cancel_requested: slot.cancel_requested.load(Ordering::SeqCst),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Writes log batches while the handler runs; returns how many lines could not be stored.
async fn flush_logs(
    shared: &Shared,
    run_id: i64,
    attempt: u32,
    mut batches: mpsc::Receiver<Vec<LogLine>>,
    done: &CancellationToken,
) -> u64 {
    let mut lost = 0;
    let mut write = async |batch: Vec<LogLine>| {
        if let Err(error) = shared.store.append_logs(run_id, attempt, &batch).await {
            tracing::error!(%error, lines = batch.len(), "cannot store run log lines");
            lost += batch.len() as u64;
        }
    };
    loop {
        tokio::select! {
            biased;
            Some(batch) = batches.recv() => write(batch).await,
            _ = done.cancelled() => break,
        }
    }
    // Closed first: a batch the flush timer hands over from now on stays in the sink for the
    // outcome's final write instead of landing in a receiver nobody reads.
    batches.close();
    while let Some(batch) = batches.recv().await {
        write(batch).await;
    }
    lost
}

/// Records the outcome, then publishes the retry or parks the message, then acks; if the record
/// cannot be written, keeps it for a later try and requeues the delivery so it is not lost.
async fn finish(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    run_id: i64,
    pending: Unrecorded,
) {
    let recorded = record(shared, run_id, &pending).await;
    let Unrecorded {
        attempt,
        outcome,
        next_attempt_at,
        ..
    } = &pending;
    match recorded {
        Ok(Recorded::Both(state)) => match (&outcome.run, state) {
            (RunEnd::Retry { .. }, RunState::Retrying) => {
                let due = next_attempt_at.unwrap_or_else(Utc::now);
                publish_retry(shared, link, delivery, *attempt, due).await;
            }
            (RunEnd::Dead { reason }, RunState::Dead) => {
                tracing::error!(%reason, "run dead: attempts exhausted");
                park_dead(shared, link, delivery, reason, outcome.error.as_deref()).await;
            }
            (end, state) => {
                if end.state() != state {
                    tracing::info!(
                        run_state = %state,
                        "an operator cancelled the run meanwhile: recorded `{state}` instead of `{}`",
                        end.state()
                    );
                }
                delivery.ack().await;
            }
        },
        Ok(recorded) => {
            log_recorded(recorded, outcome);
            delivery.ack().await;
        }
        Err(error) => {
            tracing::error!(
                %error,
                attempt_state = outcome.attempt.as_str(),
                "CANNOT RECORD THE OUTCOME of this attempt (database unavailable); keeping it to \
                 retry and requeueing the delivery"
            );
            shared.keep_unrecorded(run_id, pending);
            delivery.requeue().await;
        }
    }
}

/// Writes the outcome with the others finishing together; alone (with retries) if the batch
/// did not write it. Returns once it is durable, or with the error of the write alone.
async fn record(
    shared: &Shared,
    run_id: i64,
    pending: &Unrecorded,
) -> Result<Recorded, sqlx::Error> {
    let maybe_ours = match shared.outcomes.record(run_id, pending).await {
        Batched::Recorded(recorded) => return Ok(recorded),
        Batched::Alone { maybe_ours } => maybe_ours,
    };
    shared
        .store
        .record_outcome(
            run_id,
            pending.attempt,
            &shared.id,
            &pending.record(),
            maybe_ours,
        )
        .await
}

pub(crate) fn log_recorded(recorded: Recorded, outcome: &Outcome) {
    match recorded {
        Recorded::Both(_) => {}
        Recorded::AttemptOnly => tracing::warn!(
            attempt_state = outcome.attempt.as_str(),
            "attempt recorded, but the run had moved on meanwhile (cancelled or rescued); run left as it is"
        ),
        Recorded::Nothing => tracing::warn!(
            attempt_state = outcome.attempt.as_str(),
            "late outcome discarded: the attempt is no longer running on this worker in the \
             database (already recorded, or recorded lost and taken over while this worker \
             was judged lost)"
        ),
    }
}

/// Publishes attempt `ran + 1` (the delivery's trigger with that attempt) due at `due` through
/// the delay tiers, then acks the original; requeues the original if the broker does not
/// confirm, so its redelivery publishes the retry again.
async fn publish_retry(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    ran: u32,
    due: DateTime<Utc>,
) {
    let mut next = match Trigger::from_body(&delivery.delivery.data) {
        Ok(trigger) => trigger,
        Err(error) => {
            // Unreachable: the delivery decoded before it ran.
            tracing::error!(%error, "cannot re-encode the trigger for its retry");
            return delivery.requeue().await;
        }
    };
    next.attempt = ran.saturating_add(1);
    match delay::publish(
        &link.publish,
        &shared.topology,
        &delivery.delivery.properties,
        &next.to_body(),
        next.attempt,
        due,
    )
    .await
    {
        Ok(key) => {
            tracing::info!(
                next_attempt = next.attempt,
                due = %due.to_rfc3339(),
                via = %key,
                "retry published"
            );
            delivery.ack().await;
        }
        Err(error) => {
            tracing::error!(
                %error,
                next_attempt = next.attempt,
                "cannot publish the retry; requeueing the original so that its redelivery \
                 publishes the retry again"
            );
            requeue_after_publish_failure(link, delivery).await;
        }
    }
}

/// Parks the delivery of a run recorded `dead` with `reason`, then acks it; requeues it if the
/// parking lot does not confirm (its redelivery parks it again).
async fn park_dead(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    reason: &str,
    error: Option<&str>,
) {
    match parking::park(
        &link.publish,
        &shared.topology,
        &delivery.delivery,
        reason,
        error,
        &shared.id,
    )
    .await
    {
        Ok(()) => {
            tracing::warn!(
                reason = %reason,
                parking_queue = %shared.topology.parking_queue(),
                "message parked"
            );
            delivery.ack().await;
        }
        Err(error) => {
            tracing::error!(%error, reason = %reason, "cannot park the dead run's message; requeueing it");
            requeue_after_publish_failure(link, delivery).await;
        }
    }
}

async fn requeue_after_publish_failure(link: &Link, delivery: &Inbound) {
    if !link.publish.status().connected() {
        link.broken.cancel();
    }
    tokio::time::sleep(REQUEUE_PAUSE).await;
    delivery.requeue().await;
}

/// The run `trigger` describes, to be marked dead only if the run row matches it.
fn dead_run<'a>(shared: &'a Shared, trigger: &'a Trigger) -> DeadRun<'a> {
    DeadRun {
        run_id: trigger.run_id,
        job: &trigger.job,
        group: shared.topology.group(),
        attempt: trigger.attempt,
    }
}

/// Parks the message with `reason`, marks `run` dead if given (and only if the run row matches
/// it, see [`crate::store::Store::mark_dead`]), then acks it. If parking fails the message is
/// requeued (after a pause, so a broken parking lot does not spin).
async fn dead_letter(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    run: Option<DeadRun<'_>>,
    reason: String,
) {
    match parking::park(
        &link.publish,
        &shared.topology,
        &delivery.delivery,
        &reason,
        None,
        &shared.id,
    )
    .await
    {
        Ok(()) => {
            tracing::warn!(
                reason = %reason,
                parking_queue = %shared.topology.parking_queue(),
                "message dead-lettered to the parking lot"
            );
            if let Some(run) = run {
                let run_id = run.run_id;
                match shared
                    .store
                    .mark_dead(run, &cap_header_value(&reason), &shared.id)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => tracing::info!(
                        run_id,
                        "no waiting run of this job, group and attempt to mark dead; left as it is"
                    ),
                    Err(error) => tracing::error!(
                        %error,
                        run_id,
                        "cannot mark the run dead; the parked message keeps the reason"
                    ),
                }
            }
            delivery.ack().await;
        }
        Err(error) => {
            tracing::error!(%error, reason = %reason, "cannot dead-letter the message; requeueing it");
            requeue_after_publish_failure(link, delivery).await;
        }
    }
}

async fn ack(delivery: &Delivery) {
    match delivery.acker.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "ack not sent: the channel closed meanwhile; the broker redelivers the message and the \
             claim drops that copy"
        ),
        Err(error) => tracing::warn!(
            %error,
            "ack failed; the broker redelivers the message and the claim drops that copy"
        ),
    }
}

async fn requeue(delivery: &Delivery) {
    let options = BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    };
    match delivery.acker.nack(options).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "nack not sent: the channel closed; the broker requeues the message itself"
        ),
        Err(error) => {
            tracing::warn!(%error, "nack failed; the broker requeues the message when the channel closes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_instant_past_chronos_range_is_none_not_a_panic() {
        let now: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(
            due_after(now, week),
            Some("2026-12-08T00:00:00Z".parse().unwrap())
        );
        // `retry = { initial = "300000years" }`: once `DateTime + TimeDelta overflowed`.
        let years = Duration::from_secs(300_000 * 365 * 86_400);
        assert_eq!(due_after(now, years), None);
        assert_eq!(due_after(now, Duration::MAX), None);
        assert_eq!(deadline_after(Duration::MAX), None);
    }

    #[test]
    fn an_unknown_job_reason_lists_twenty_handlers_and_counts_the_rest() {
        let jobs: Vec<String> = (0..15_000).map(|i| format!("job-{i:05}")).collect();
        let reason = unknown_job_reason(&"x".repeat(300_000), "w1", "orders", jobs);
        assert!(reason.starts_with("unknown job `xxx"), "{}", &reason[..40]);
        assert!(reason.contains("…[truncated]`: worker `w1` of group `orders`"));
        assert!(reason.contains("`job-00000`, `job-00001`"));
        assert!(reason.contains("`job-00019` and 14980 more"), "{reason}");
        assert!(!reason.contains("job-00020"));
        assert!(reason.len() < 1_024, "{} bytes", reason.len());
        let one = unknown_job_reason("nope", "w1", "orders", vec!["greet".into()]);
        assert_eq!(
            one,
            "unknown job `nope`: worker `w1` of group `orders` has handlers for `greet`"
        );
    }
}
