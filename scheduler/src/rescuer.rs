//! The rescuer, a leader duty: runs whose worker was lost, and runs whose retry never came.
//!
//! Every `interval` it looks for
//! * runs `running` on a worker that has been lost for longer than `rescue_after` (no heartbeat,
//!   or stopped): the attempt is recorded `lost` with the reason and the run goes back to the
//!   outbox, so the dispatcher publishes it as the next attempt (a cancel that was requested
//!   makes it `cancelled` instead, and a lost last attempt makes it `dead`); a broadcast task
//!   ends `lost` instead: it is for that worker only;
//! * broadcast tasks still waiting for a worker lost for longer than `rescue_after`: `lost`;
//! * runs still `retrying` `retry_slack` after their `next_attempt_at` (the retry message was
//!   lost): back to the outbox too.
//!
//! A new leader waits `rescue_after` before its first pass: a database outage stops every
//! heartbeat, and it must not take the silence for lost workers.
//!
//! A late outcome from a hung worker is discarded by the worker's fenced outcome write, and a
//! late retry message finds nothing to claim. Work per pass is bounded; every write is fenced by
//! the leader's term ([`crate::store`]).

use std::time::Duration;

use chime_protocol::RunState;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::RescuerSettings;
use crate::store::{Fence, Rescued, Store};

/// Runs rescued per statement.
const BATCH: i64 = 100;
/// Statements per kind of rescue per pass: at most `BATCH × MAX_BATCHES` runs a pass.
const MAX_BATCHES: usize = 10;

/// Runs the rescuer for `fence`'s term until `stop`; cancels `stop` if the lease is lost.
pub async fn run(store: Store, fence: Fence, settings: RescuerSettings, stop: CancellationToken) {
    // A heartbeat's age proves a worker lost only if the workers could write heartbeats all
    // that time. A leader just elected may come back from a database outage (or follow a
    // leader that could not reach the database) during which no worker could beat: wait until
    // it has itself held the lease for `rescue_after`, so every live worker has beaten again.
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(settings.rescue_after) => {}
    }
    let mut tick = tokio::time::interval(settings.interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !pass(&store, &fence, &settings).await {
            warn!(
                term = fence.term,
                "lease lost while rescuing runs; leader duties stop"
            );
            stop.cancel();
            return;
        }
    }
}

/// One pass. Returns false when the fence no longer holds.
pub async fn pass(store: &Store, fence: &Fence, settings: &RescuerSettings) -> bool {
    let after = settings.rescue_after;
    batches("rescuing runs of lost workers", log_lost, || {
        store.rescue_lost_runs(fence, after, BATCH)
    })
    .await
        && batches("ending broadcast tasks of lost workers", log_lost, || {
            store.rescue_stranded_broadcasts(fence, after, BATCH)
        })
        .await
        && batches("rescuing stuck retries", log_stuck, || {
            store.rescue_stuck_retries(fence, settings.retry_slack, BATCH)
        })
        .await
}

/// Runs one rescue in batches of [`BATCH`] until a batch is short, at most [`MAX_BATCHES`];
/// `log` reports each batch. Returns false when the fence no longer holds; a failed batch is
/// logged and left to the next pass.
async fn batches<F, Fut>(what: &str, log: fn(&[Rescued]), mut batch: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<Vec<Rescued>>>>,
{
    for _ in 0..MAX_BATCHES {
        match batch().await {
            Ok(None) => return false,
            Ok(Some(runs)) => {
                log(&runs);
                if i64::try_from(runs.len()).unwrap_or(i64::MAX) < BATCH {
                    break;
                }
            }
            Err(e) => {
                warn!(error = %format!("{e:#}"), "{what} failed; next pass retries");
                break;
            }
        }
    }
    true
}

fn log_stuck(runs: &[Rescued]) {
    for r in runs {
        warn!(run_id = r.id, job = %r.job, attempt = r.attempt, detail = %r.detail,
              "run stuck in retrying; republishing it as the next attempt");
    }
}

fn log_lost(runs: &[Rescued]) {
    for r in runs {
        match r.state {
            RunState::Pending => {
                warn!(run_id = r.id, job = %r.job, attempt = r.attempt, detail = %r.detail,
                               "attempt lost with its worker; republishing the run as the next attempt")
            }
            RunState::Lost => {
                warn!(run_id = r.id, job = %r.job, attempt = r.attempt, detail = %r.detail,
                      "broadcast task's worker lost; the task is lost, not moved")
            }
            RunState::Dead => {
                warn!(run_id = r.id, job = %r.job, attempt = r.attempt, detail = %r.detail,
                            "attempt lost with its worker; it was the last attempt, the run is dead")
            }
            _ => info!(run_id = r.id, job = %r.job, attempt = r.attempt, detail = %r.detail,
                       state = %r.state, "attempt lost with its worker; the run was being cancelled"),
        }
    }
}
