//! Executing a claimed attempt: hold it until its instant, take a handler slot, then run the
//! handler in a task of its own with its [`JobContext`], under its timeout, the operator's
//! cancel and the worker's shutdown (each fires the handler's token; after `cancel_grace` the
//! handler is abandoned), acking the delivery early once it has run for `ack_after`, while its
//! log lines are written as they come. Ends with what to record: the attempt's outcome under
//! the job's retry policy, its timings and its remaining log lines ([`Unrecorded`]).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chime_protocol::wire::Trigger;
use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::{
    Attempt, JobContext, JobLogger, Level, LogLine, LogSink, MAX_PENDING_BATCHES,
};
use crate::handler::ErasedHandler;
use crate::link::Inbound;
use crate::outcome::{self, Ending, Execution, JobError, RunEnd};
use crate::recording::Unrecorded;
use crate::store::{ClaimClock, RetryDecision};
use crate::tasks::TaskScope;

use super::clock::{deadline_after, due_after, hold_until, sleep_until};
use super::shared::{InFlight, Shared};

/// Runs claimed attempt `trigger` (the handler `handler`, with the run entered as `slot` and
/// claimed at `claim`), starting it at `start_at` when it was claimed ahead of its instant;
/// returns what to record.
pub(super) async fn run(
    shared: &Shared,
    delivery: &Inbound,
    handler: &ErasedHandler,
    mut trigger: Trigger,
    slot: &InFlight<'_>,
    claim: ClaimClock,
    start_at: Option<DateTime<Utc>>,
) -> Unrecorded {
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
    let tasks = Arc::new(TaskScope::new(
        trigger.run_id,
        trigger.attempt,
        shared.id.as_str().into(),
        trigger.task.clone(),
        shared.task_calls.clone(),
    ));
    let attempt = Attempt {
        run_id: trigger.run_id,
        job,
        attempt: trigger.attempt,
        scheduled_at: trigger.scheduled_at,
        params: params.clone(),
    };
    let ctx = JobContext::new(
        attempt,
        slot.token.clone(),
        JobLogger::new(sink.clone()),
        tasks,
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
                not_started(shared, slot)
            } else {
                run_handler(shared, delivery, handler, ctx, params, slot, timeout).await
            };
            // The handler is done: its slot is free while the outcome is written.
            drop(handler_slot);
            done.cancel();
            execution
        },
        flush_logs(shared, trigger.run_id, trigger.attempt, flush_rx, &done),
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
    decide(shared, &trigger, execution, duration, lines, started_at).await
}

/// What to record of an attempt: the outcome of `execution`, a retryable failure decided by
/// the database from the run's retry policy snapshot (`chime_retry_decision`: retry when, or
/// dead), logged, and its timings and log lines.
async fn decide(
    shared: &Shared,
    trigger: &Trigger,
    execution: Execution,
    duration: Duration,
    lines: Vec<LogLine>,
    started_at: Option<DateTime<Utc>>,
) -> Unrecorded {
    let mut failure: Option<(Option<Duration>, String)> = None;
    let mut outcome = outcome::outcome_with(execution, shared.cancel_grace, |requested, error| {
        failure = Some((requested, error.to_owned()));
        // Replaced below by the decision.
        RunEnd::Retry {
            delay: Duration::ZERO,
        }
    });
    let mut next_attempt_at = None;
    if let Some((requested, error)) = failure {
        let decided = shared
            .store
            .retry_decision(trigger.run_id, trigger.attempt, requested)
            .await;
        outcome.run = match decided {
            Ok(Some(RetryDecision::Retry(at))) => {
                next_attempt_at = Some(at);
                RunEnd::Retry {
                    delay: (at - Utc::now()).to_std().unwrap_or_default(),
                }
            }
            Ok(Some(RetryDecision::Dead(reason))) => RunEnd::Dead {
                reason: format!("{reason}: {error}"),
            },
            other => {
                // The database could not decide (unreachable; the run is gone): the same rule
                // on the policy the trigger carries, which is the run's snapshot as the
                // scheduler published it. Recording the outcome needs the database anyway.
                match &other {
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the retry decision; deciding by the trigger's retry policy")
                    }
                    _ => tracing::warn!(
                        "no run row for the retry decision; deciding by the trigger's retry policy"
                    ),
                }
                match outcome::after_retryable_failure(
                    trigger.attempt,
                    trigger.retry.as_ref(),
                    requested,
                    fastrand::f64(),
                    &error,
                ) {
                    RunEnd::Retry { delay } => match due_after(Utc::now(), delay) {
                        Some(due) => {
                            next_attempt_at = Some(due);
                            RunEnd::Retry { delay }
                        }
                        // Unreachable for a checked trigger (delays are at most
                        // MAX_RETRY_DELAY); an instant past chrono's range must end the run,
                        // not panic the task.
                        None => RunEnd::Dead {
                            reason: format!(
                                "retry delay {delay:?} puts the next attempt beyond any \
                                 representable instant; not retried"
                            ),
                        },
                    },
                    dead => dead,
                }
            }
        };
    }
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
    Unrecorded {
        attempt: trigger.attempt,
        outcome,
        next_attempt_at,
        duration,
        lines,
        started_at,
    }
}

/// The execution of a claimed attempt whose token fired before its handler started: recorded
/// like a handler that saw the cancellation at once (an operator's cancel ends the run
/// `cancelled`; a shutdown makes it a retryable interruption).
fn not_started(shared: &Shared, slot: &InFlight<'_>) -> Execution {
    Execution {
        ending: Ending::Returned(Err(JobError::cancel(
            "cancelled before its instant; the handler was not started",
        ))),
        timed_out: None,
        interrupted: shared.stop_handlers.is_cancelled(),
        cancel_requested: slot.cancel_requested.load(Ordering::SeqCst),
    }
}

/// Runs the handler in its own task under its timeout, the operator's cancel and the worker's
/// shutdown, acking the delivery early once it has run for `ack_after`.
async fn run_handler(
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

/// The handler of a reduce task of job `job`, which this worker handles without a reducer:
/// claimed and failed at once, not retried (another attempt would find the same worker code),
/// with the fix.
pub(super) fn no_reducer(job: &str) -> ErasedHandler {
    let message = format!(
        "job {} has a reduce task but this worker registers no reducer for it: register one with \
         .reducer({:?}, reducer) on the workers handling the job",
        crate::verify::quote(job),
        job
    );
    Arc::new(move |_ctx, _params| {
        let message = message.clone();
        Box::pin(async move { Err(JobError::fail(message)) })
    })
}

/// The message a panic carried, for the record.
pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
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
