//! Settling a delivery, last of its life: record the attempt's outcome (with the others
//! finishing together), then publish the retry or park the message, then ack; or, for a
//! delivery that is not run, park it with its reason. Nothing is acked before what it stands for
//! is durable: a record that cannot be written is kept for a later try and the delivery
//! requeued; a copy the broker does not confirm leaves the original requeued, so its
//! redelivery publishes the copy again.

use std::time::Duration;

use chime_protocol::limits::cap_header_value;
use chime_protocol::wire::Trigger;
use chime_protocol::{AttemptState, RunState};
use chrono::{DateTime, Utc};

use crate::link::{Inbound, Link};
use crate::outcome::{Outcome, RunEnd};
use crate::recording::{Batched, Unrecorded, log_recorded};
use crate::store::{AttemptRecord, DeadRun, Recorded};

use super::shared::Shared;

/// Pause before requeueing a message whose publish failed, so a broken broker does not spin.
const REQUEUE_PAUSE: Duration = Duration::from_secs(1);

/// Records the outcome, then publishes the retry or parks the message, then acks; if the record
/// cannot be written, keeps it for a later try and requeues the delivery so it is not lost.
pub(super) async fn finish(
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

/// Publishes attempt `ran + 1` (the delivery's trigger with that attempt) due at `due` through
/// the delay tiers, then acks the original; requeues the original if the broker does not
/// confirm, so its redelivery publishes the retry again.
pub(super) async fn publish_retry(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    ran: u32,
    due: DateTime<Utc>,
) {
    let mut next = match Trigger::from_body(delivery.body()) {
        Ok(trigger) => trigger,
        Err(error) => {
            // Unreachable: the delivery decoded before it ran.
            tracing::error!(%error, "cannot re-encode the trigger for its retry");
            return delivery.requeue().await;
        }
    };
    next.attempt = ran.saturating_add(1);
    match link
        .publish_delayed(
            &shared.topology,
            delivery,
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
pub(super) async fn park_dead(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    reason: &str,
    error: Option<&str>,
) {
    match link
        .park(&shared.topology, delivery, reason, error, &shared.id)
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

/// Requeues `delivery` after a publish of its copy failed, once a pause has passed; marks the
/// link broken first if its publishing channel died.
pub(super) async fn requeue_after_publish_failure(link: &Link, delivery: &Inbound) {
    link.publish_failed();
    tokio::time::sleep(REQUEUE_PAUSE).await;
    delivery.requeue().await;
}

/// The run `trigger` describes, to be marked dead only if the run row matches it.
pub(super) fn dead_run<'a>(shared: &'a Shared, trigger: &'a Trigger) -> DeadRun<'a> {
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
pub(super) async fn dead_letter(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    run: Option<DeadRun<'_>>,
    reason: String,
) {
    match link
        .park(&shared.topology, delivery, &reason, None, &shared.id)
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

/// Ends a delivery whose path panicked: records the attempt it claimed (`claimed`: run and
/// attempt, if it got that far) as failed and its run `dead` (fenced like any outcome: only
/// while that attempt is still `running` on this worker), then parks the message unless it was
/// settled already.
pub(super) async fn after_panic(
    shared: &Shared,
    link: &Link,
    inbound: &Inbound,
    claimed: Option<(i64, u32)>,
    reason: String,
) {
    if let Some((run_id, attempt)) = claimed {
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
