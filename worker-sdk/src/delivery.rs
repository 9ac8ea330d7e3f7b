//! One delivery, start to finish: decode, dead-letter what cannot run, claim, execute, record,
//! ack.
//!
//! The order is the guarantee. The claim comes before the handler, so a duplicate delivery of an
//! attempt never executes twice; the outcome is committed before the ack, so an ack never hides
//! a lost record; a parked copy is confirmed before the original is acked, so a dead-lettered
//! message is never lost.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::consumer::Link;
use crate::context::{JobContext, JobLogger, Level, LogLine, LogSink, MAX_PENDING_BATCHES};
use crate::handler::ErasedHandler;
use crate::outcome::{self, Ending, Execution, Outcome};
use crate::parking;
use crate::protocol::Trigger;
use crate::store::{Claim, Recorded};
use crate::worker::{Shared, Unrecorded};

/// Handles one delivery; never fails (every path ends in an ack or a requeue, and a log line).
pub(crate) async fn handle(shared: Arc<Shared>, link: Arc<Link>, delivery: Delivery) {
    let trigger = match Trigger::from_body(&delivery.data) {
        Ok(trigger) => trigger,
        Err(error) => {
            // The message id is the run id; with it the run can be marked dead too.
            let run_id = delivery
                .properties
                .message_id()
                .as_ref()
                .and_then(|id| id.as_str().parse::<i64>().ok());
            let span = tracing::warn_span!("undecodable", run_id);
            return dead_letter(&shared, &link, &delivery, run_id, error.to_string())
                .instrument(span)
                .await;
        }
    };
    let span = tracing::info_span!(
        "run",
        run_id = trigger.run_id,
        job = %trigger.job,
        attempt = trigger.attempt
    );
    run(shared, link, delivery, trigger).instrument(span).await
}

async fn run(shared: Arc<Shared>, link: Arc<Link>, delivery: Delivery, mut trigger: Trigger) {
    let Some(handler) = shared.handlers.get(&trigger.job).cloned() else {
        let reason = format!(
            "unknown job `{}`: worker {} of group `{}` has handlers for {}",
            trigger.job,
            shared.id,
            shared.topology.group(),
            shared.handlers.jobs().join(", ")
        );
        return dead_letter(&shared, &link, &delivery, Some(trigger.run_id), reason).await;
    };

    // One delivery of a run at a time in this worker (see `Store::claim`).
    let Some(_in_flight) = shared.enter(trigger.run_id) else {
        tracing::info!(
            "duplicate delivery of a run this worker is handling right now; acked without running"
        );
        return ack(&delivery).await;
    };

    // An earlier delivery of this attempt ran here but could not record its outcome.
    if let Some(pending) = shared.take_unrecorded(trigger.run_id, trigger.attempt) {
        tracing::info!("redelivery of an attempt whose outcome is not recorded yet; recording it");
        return finish(&shared, &delivery, trigger.run_id, pending).await;
    }

    match shared.store.claim(&trigger, &shared.id).await {
        Ok(Claim::Claimed) => {}
        Ok(Claim::Refused(run)) => {
            match run {
                Some(run) => tracing::info!(
                    state = %run.state,
                    run_attempt = run.attempt,
                    run_job = %run.job_name,
                    run_worker = run.worker_id.as_deref().unwrap_or("-"),
                    "duplicate or stale delivery: the run is not waiting for this attempt; acked without running"
                ),
                None => tracing::info!("stale delivery: no such run; acked without running"),
            }
            return ack(&delivery).await;
        }
        Err(error) => {
            tracing::error!(%error, "cannot claim the run (database unavailable); requeueing the delivery");
            return requeue(&delivery).await;
        }
    }

    let started = Instant::now();
    let job: Arc<str> = trigger.job.as_str().into();
    let (flush_tx, flush_rx) = mpsc::channel(MAX_PENDING_BATCHES);
    let sink = Arc::new(LogSink::new(
        trigger.run_id,
        job.clone(),
        trigger.attempt,
        Some(flush_tx),
    ));
    let token = shared.stop_handlers.child_token();
    let params = std::mem::take(&mut trigger.params);
    let ctx = JobContext::new(
        trigger.run_id,
        job,
        trigger.attempt,
        trigger.scheduled_at,
        params.clone(),
        token.clone(),
        JobLogger::new(sink.clone()),
    );
    let timeout = trigger.timeout_ms.map(Duration::from_millis);
    tracing::debug!("claimed; running the handler");
    let done = CancellationToken::new();
    let (execution, lost_lines) = tokio::join!(
        async {
            let execution = execute(&shared, &handler, ctx, params, token, timeout).await;
            done.cancel();
            execution
        },
        flush_logs(&shared, trigger.run_id, trigger.attempt, flush_rx, &done),
    );
    let duration = started.elapsed();
    let mut lines = sink.finish();
    if lost_lines > 0 {
        lines.push(LogLine {
            at: chrono::Utc::now(),
            level: Level::Warn,
            message: format!(
                "{lost_lines} log lines were lost because the log store was unavailable"
            ),
        });
    }
    let outcome = outcome::outcome(trigger.attempt, execution, shared.cancel_grace);
    match &outcome.error {
        None => tracing::info!(?duration, "run succeeded"),
        Some(error) => tracing::warn!(
            ?duration,
            attempt_state = outcome.attempt.as_str(),
            run_state = outcome.run.as_str(),
            error = %error,
            "run did not succeed"
        ),
    }
    let pending = Unrecorded {
        attempt: trigger.attempt,
        outcome,
        duration,
        lines,
    };
    finish(&shared, &delivery, trigger.run_id, pending).await
}

/// Runs the handler under its timeout and the worker's cancellation, catching panics.
async fn execute(
    shared: &Shared,
    handler: &ErasedHandler,
    ctx: JobContext,
    params: serde_json::Value,
    token: CancellationToken,
    timeout: Option<Duration>,
) -> Execution {
    let handler = AssertUnwindSafe(async { handler(ctx, params).await }).catch_unwind();
    tokio::pin!(handler);
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut timed_out = None;
    // Set once the handler's token fired: it has this long to return.
    let mut grace_deadline: Option<Instant> = None;
    let ending = loop {
        tokio::select! {
            result = &mut handler => break match result {
                Ok(returned) => Ending::Returned(returned),
                Err(panic) => Ending::Panicked(panic_message(panic.as_ref())),
            },
            _ = sleep_until(deadline), if timed_out.is_none() && grace_deadline.is_none() => {
                tracing::warn!(timeout = ?timeout, "job timeout elapsed; cancelling the handler");
                timed_out = timeout;
                token.cancel();
                grace_deadline = Some(Instant::now() + shared.cancel_grace);
            }
            _ = token.cancelled(), if grace_deadline.is_none() => {
                grace_deadline = Some(Instant::now() + shared.cancel_grace);
            }
            _ = sleep_until(grace_deadline), if grace_deadline.is_some() => break Ending::Abandoned,
            _ = shared.abandon.cancelled() => break Ending::Abandoned,
        }
    };
    if matches!(ending, Ending::Abandoned) {
        tracing::error!(grace = ?shared.cancel_grace, "handler ignored its cancellation; abandoned");
    }
    Execution {
        ending,
        timed_out,
        interrupted: shared.stop_handlers.is_cancelled(),
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
    while let Ok(batch) = batches.try_recv() {
        write(batch).await;
    }
    lost
}

/// Records the outcome, then acks; if the record cannot be written, keeps it for a later try
/// and requeues the delivery so it is not lost.
async fn finish(shared: &Shared, delivery: &Delivery, run_id: i64, pending: Unrecorded) {
    let Unrecorded {
        attempt,
        outcome,
        duration,
        lines,
    } = &pending;
    match shared
        .store
        .record_outcome(run_id, *attempt, &shared.id, outcome, *duration, lines)
        .await
    {
        Ok(recorded) => {
            log_recorded(recorded, outcome);
            ack(delivery).await;
        }
        Err(error) => {
            tracing::error!(
                %error,
                attempt_state = outcome.attempt.as_str(),
                "CANNOT RECORD THE OUTCOME of this attempt (database unavailable); keeping it to \
                 retry and requeueing the delivery"
            );
            shared.keep_unrecorded(run_id, pending);
            requeue(delivery).await;
        }
    }
}

pub(crate) fn log_recorded(recorded: Recorded, outcome: &Outcome) {
    match recorded {
        Recorded::Both => {}
        Recorded::AttemptOnly => tracing::warn!(
            attempt_state = outcome.attempt.as_str(),
            "attempt recorded, but the run had moved on meanwhile (cancelled or rescued); run left as it is"
        ),
        Recorded::Nothing => tracing::info!(
            "attempt was no longer running in the database (already recorded, or taken over); nothing written"
        ),
    }
}

/// Parks the message with `reason`, marks its run dead if known, then acks it. If parking
/// fails the message is requeued (after a pause, so a broken parking lot does not spin).
async fn dead_letter(
    shared: &Shared,
    link: &Link,
    delivery: &Delivery,
    run_id: Option<i64>,
    reason: String,
) {
    match parking::park(
        &link.publish,
        &shared.topology,
        delivery,
        &reason,
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
            if let Some(run_id) = run_id {
                match shared
                    .store
                    .mark_dead(run_id, shared.topology.group(), &reason, &shared.id)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => tracing::info!(run_id, "no waiting run with this id to mark dead"),
                    Err(error) => tracing::error!(
                        %error,
                        run_id,
                        "cannot mark the run dead; the parked message keeps the reason"
                    ),
                }
            }
            ack(delivery).await;
        }
        Err(error) => {
            tracing::error!(%error, reason = %reason, "cannot dead-letter the message; requeueing it");
            if !link.publish.status().connected() {
                link.broken.cancel();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            requeue(delivery).await;
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
