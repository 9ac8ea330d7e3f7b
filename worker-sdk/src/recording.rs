//! An attempt's outcome on its way to PostgreSQL ([`Unrecorded`] until it is written), and
//! batched outcome writes: attempts that finish together (the burst of runs of one instant, or
//! a steady high rate) are recorded in one statement instead of one transaction each.
//!
//! One task sends the statements, one at a time: outcomes that finish while a statement runs
//! wait and go together in the next one, so a lone outcome costs one round trip (fewer than the
//! single-run transaction's four) and a burst costs a few. The window is therefore adaptive:
//! as long as the previous statement takes, never a fixed delay added to a lone outcome.
//!
//! Nothing is acked before its outcome is durable: each caller waits for the statement that
//! carried its outcome to commit. When a batch fails, every outcome in it is written alone
//! with [`crate::store::Store::record_outcome`] (with its retries), so one run whose write fails
//! does not hold back the others and is found out.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use crate::context::LogLine;
use crate::outcome::Outcome;
use crate::store::{AttemptRecord, OutcomeRow, Recorded, Store};

/// An attempt's outcome that could not be written yet.
#[derive(Clone)]
pub(crate) struct Unrecorded {
    pub attempt: u32,
    pub outcome: Outcome,
    /// When the retry is due, if the run is to be retried.
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub duration: Duration,
    pub lines: Vec<LogLine>,
    /// When the handler started (database clock), kept so a late write records the same start.
    pub started_at: Option<DateTime<Utc>>,
}

impl Unrecorded {
    /// The outcome as the store writes it.
    pub(crate) fn record(&self) -> AttemptRecord<'_> {
        AttemptRecord {
            outcome: &self.outcome,
            next_attempt_at: self.next_attempt_at,
            duration: self.duration,
            lines: &self.lines,
            started_at: self.started_at,
        }
    }
}

/// Logs what the store did with `outcome` when it did not record it in full.
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

/// Outcomes per statement at most.
const MAX_BATCH: usize = 512;

/// What the batch did with one outcome.
pub(crate) enum Batched {
    /// Written (or fenced out) by the batch; durable.
    Recorded(Recorded),
    /// Not written by the batch: write it alone. `maybe_ours` when the batch failed, so its
    /// commit may have happened with the reply lost.
    Alone { maybe_ours: bool },
}

type Request = (i64, Unrecorded, oneshot::Sender<Batched>);

/// The handle of the batching task; the task ends when this is dropped.
pub(crate) struct OutcomeBatcher {
    requests: mpsc::UnboundedSender<Request>,
}

impl OutcomeBatcher {
    /// Starts the batching task for `worker_id` on the current runtime.
    pub(crate) fn start(store: Store, worker_id: String) -> Self {
        let (requests, mut incoming) = mpsc::unbounded_channel::<Request>();
        tokio::spawn(async move {
            while let Some(first) = incoming.recv().await {
                let mut runs = HashSet::from([first.0]);
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match incoming.try_recv() {
                        // One row per run and statement (a second outcome of a run this soon is
                        // a redelivery's; it goes alone).
                        Ok(next) if !runs.insert(next.0) => {
                            let _ = next.2.send(Batched::Alone { maybe_ours: false });
                        }
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let rows: Vec<OutcomeRow<'_>> = batch
                    .iter()
                    .map(|(run_id, pending, _)| OutcomeRow {
                        run_id: *run_id,
                        attempt: pending.attempt,
                        record: pending.record(),
                    })
                    .collect();
                let written = store.record_outcomes(&rows, &worker_id).await;
                drop(rows);
                match written {
                    Ok(recorded) => {
                        for ((_, _, reply), recorded) in batch.into_iter().zip(recorded) {
                            let _ = reply.send(Batched::Recorded(recorded));
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, outcomes = batch.len(), "batched outcome write failed; recording one by one");
                        for (_, _, reply) in batch {
                            let _ = reply.send(Batched::Alone { maybe_ours: true });
                        }
                    }
                }
            }
        });
        OutcomeBatcher { requests }
    }

    /// Records `pending` (a copy of it) with whatever other outcomes are waiting.
    pub(crate) async fn record(&self, run_id: i64, pending: &Unrecorded) -> Batched {
        let (reply, answer) = oneshot::channel();
        if self
            .requests
            .send((run_id, pending.clone(), reply))
            .is_err()
        {
            return Batched::Alone { maybe_ours: false };
        }
        // The task went away mid-batch (runtime shutting down): the statement may have run.
        answer.await.unwrap_or(Batched::Alone { maybe_ours: true })
    }
}
