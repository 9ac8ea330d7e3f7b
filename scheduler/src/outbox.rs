//! The outbox: runs persisted but not yet confirmed published, seen from the dispatcher. Two
//! tasks of their own do its database work, so a slow database never stalls publishing: the
//! **marker** writes the marks of confirmed runs (`queued`, `published_at`) in fenced batches
//! at their instant, unless a worker claimed them first (the usual case, which spares the row a
//! version), at least every [`MARK_INTERVAL`]; the **sweep** reads the pending runs due by the horizon
//! every `sweep_interval` (1 s), and at once on `NOTIFY chime_outbox` — manual triggers, runs a
//! previous leader persisted but did not publish, runs whose publish failed, runs a `queue`
//! policy released. Before its read, a sweep woken by `advance …` (a run with child jobs ended)
//! or by its tick first makes the child runs of ended runs under the fence ([`Store::advance`],
//! docs/runs.md, "Child runs"), so the same sweep publishes them.
//!
//! **Invariants** (enforced here, by [`Outbox`]):
//! * A run is marked only after its confirm: the dispatcher hands a run to the marker only
//!   on [`Outbox::confirmed`]; a run whose publish failed stays `pending`, and a later sweep
//!   hands it over again ([`Outbox::failed`]).
//! * A run stays held by the dispatcher until a sweep that *started after its mark committed*
//!   has been handed over: the marker counts its committed batches, each sweep notes the count
//!   before its query, and only then are the batch's runs released. So a sweep that read a run
//!   still `pending` never hands it over a second time, while a run found `pending` after its
//!   mark (rescued, republished) is a new attempt and is taken again.
//! * Marks are fenced: a mark that finds the lease gone stops the leadership.
//! * Every confirmed run is marked before the marker stops, however far its instant lies ahead.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chime_protocol::timing::MAX_LEAD;
use chime_protocol::wire::ControlMessage;
use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::broker::Broker;
use crate::pace::{Pace, plus};
use crate::store::{
    ADVANCE_BATCH, Confirmed, Fence, OUTBOX_CHANNEL, OutboxRun, Store, WORKFLOW_BATCH,
};

/// The `NOTIFY chime_outbox` payloads that ask for an advance start with this: a run with child
/// jobs ended (`advance <run id>`), or a full advance batch left more (`advance more`).
const ADVANCE_WAKE: &str = "advance";

/// Marks of published runs are flushed at least this often.
pub const MARK_INTERVAL: Duration = Duration::from_millis(20);
/// Pending runs read per outbox sweep.
pub const SWEEP_LIMIT: i64 = 10_000;

/// Runs whose mark committed as the marker's `seq`-th batch.
pub type Marked = (u64, Vec<i64>);
/// An outbox sweep: the marker's count of committed batches before its query, and what it read.
pub type Swept = (u64, Vec<OutboxRun>);

/// A run whose trigger the broker confirmed, on its way from the dispatcher to the marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The run.
    pub id: i64,
    /// Its instant: the mark waits for it.
    pub scheduled_at: DateTime<Utc>,
    /// When the confirm arrived: the run's `published_at`.
    pub confirmed_at: DateTime<Utc>,
}

/// A confirmed run waiting for its mark: when it is due, the run, when its confirm arrived.
type MarkDue = (DateTime<Utc>, i64, DateTime<Utc>);

/// What the outbox reported to the dispatcher ([`Outbox::report`]).
#[derive(Debug)]
pub enum Report {
    /// A batch of marks committed (recorded by the outbox).
    Marked,
    /// A sweep handed over these runs, now held by the dispatcher.
    Swept(Vec<OutboxRun>),
}

/// The dispatcher's side of the outbox: which runs it holds, the marker and the sweep.
pub struct Outbox {
    published: mpsc::UnboundedSender<Published>,
    marked: mpsc::UnboundedReceiver<Marked>,
    swept: mpsc::Receiver<Swept>,
    held: Held,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("held", &self.held.ids.len())
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// Starts the marker (fenced by `fence`) and the sweep (every `sweep_interval`, as far
    /// ahead as the planner writes with `lookahead`), until `stop`.
    pub fn start(
        store: Store,
        fence: Fence,
        sweep_interval: Duration,
        lookahead: Duration,
        stop: CancellationToken,
        control: Broker,
    ) -> Outbox {
        let marks_done = Arc::new(AtomicU64::new(0));
        let (published_tx, published_rx) = mpsc::unbounded_channel::<Published>();
        let (marked_tx, marked_rx) = mpsc::unbounded_channel::<Marked>();
        let (swept_tx, swept_rx) = mpsc::channel::<Swept>(1);
        let marker = tokio::spawn(mark_loop(
            store.clone(),
            fence.clone(),
            stop.clone(),
            marks_done.clone(),
            published_rx,
            marked_tx,
        ));
        let sweep = tokio::spawn(sweep_loop(
            Sweeper {
                store,
                fence,
                control,
            },
            sweep_interval,
            lookahead,
            stop,
            marks_done,
            swept_tx,
        ));
        Outbox {
            published: published_tx,
            marked: marked_rx,
            swept: swept_rx,
            held: Held::default(),
            tasks: vec![("marker", marker), ("outbox sweep", sweep)],
        }
    }

    /// Takes the run `id` unless the dispatcher holds it already; whether it was taken.
    pub fn take(&mut self, id: i64) -> bool {
        self.held.ids.insert(id)
    }

    /// The broker confirmed the run's trigger (at `confirmed_at`): it is marked at its
    /// instant, and stays held until a sweep after that mark.
    pub fn confirmed(&self, id: i64, scheduled_at: DateTime<Utc>, confirmed_at: DateTime<Utc>) {
        // The marker only ends once the leadership ends.
        let _ = self.published.send(Published {
            id,
            scheduled_at,
            confirmed_at,
        });
    }

    /// The run's trigger was not published: it stays `pending`, for a later sweep to hand over.
    pub fn failed(&mut self, id: i64) {
        self.held.ids.remove(&id);
    }

    /// Waits for the marker's next committed batch or the sweep's next read; `None` once both
    /// have ended. Cancel-safe.
    pub async fn report(&mut self) -> Option<Report> {
        tokio::select! {
            biased;
            Some(batch) = self.marked.recv() => {
                self.held.marked.push_back(batch);
                Some(Report::Marked)
            }
            Some(swept) = self.swept.recv() => Some(Report::Swept(self.held.hand_over(swept))),
            else => None,
        }
    }

    /// Stopping: lets the marker write the marks of the confirmed runs it was given (so the
    /// next leader does not publish them again), then waits for both tasks.
    pub async fn finish(self, term: i64) {
        let Outbox {
            published, tasks, ..
        } = self;
        drop(published);
        for (what, task) in tasks {
            if let Err(e) = task.await {
                error!(term, task = what, error = %e, "dispatcher task ended abnormally");
            }
        }
    }
}

/// The runs the dispatcher holds, and the marks committed since the last sweep that released
/// them: the hand-over rule.
#[derive(Debug, Default)]
struct Held {
    ids: HashSet<i64>,
    marked: VecDeque<Marked>,
}

impl Held {
    /// A sweep's read: first releases the runs whose marks committed before the sweep's query
    /// (the sweep saw them `queued`, so from now on a run of theirs found `pending` is a new
    /// attempt), then takes every pending run not held, in the sweep's order.
    fn hand_over(&mut self, (marks_before, mut pending): Swept) -> Vec<OutboxRun> {
        while self
            .marked
            .front()
            .is_some_and(|(seq, _)| *seq <= marks_before)
        {
            for id in self.marked.pop_front().expect("checked").1 {
                self.ids.remove(&id);
            }
        }
        pending.retain(|run| {
            let taken = self.ids.insert(run.id);
            if taken {
                debug!(run_id = run.id, job = %run.job, "outbox run picked up");
            }
            taken
        });
        pending
    }
}

/// The marker: writes the marks of confirmed runs in batches (at most every
/// [`MARK_INTERVAL`]), counts each committed batch in `marks_done` and reports it. Ends when
/// the dispatcher drops its sender (after flushing what it got) or the fence is lost.
///
/// A confirmed run is marked at its instant, not at once: a worker claims a trigger published
/// ahead as soon as it arrives, and its claim records `published_at` itself, so by the instant
/// most runs are `running` and the mark leaves them alone (one row version fewer per run, with
/// an entry in each of `chime_runs`'s indexes: the hot path's largest cost in PostgreSQL). A run
/// confirmed after its instant is marked within [`MARK_INTERVAL`]; when the leadership ends,
/// every confirmed run is marked before the marker stops. A new leader after a crash republishes
/// the runs confirmed but neither marked nor claimed (at most a lead's worth), as it always
/// could; the claim keeps each from running twice.
async fn mark_loop(
    store: Store,
    fence: Fence,
    stop: CancellationToken,
    marks_done: Arc<AtomicU64>,
    mut published: mpsc::UnboundedReceiver<Published>,
    marked: mpsc::UnboundedSender<Marked>,
) {
    let mut waiting: BinaryHeap<Reverse<MarkDue>> = BinaryHeap::new();
    let mut tick = tokio::time::interval(MARK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    while open || !waiting.is_empty() {
        if open {
            tokio::select! {
                run = published.recv() => match run {
                    Some(run) => {
                        let due = run.scheduled_at.min(plus(run.confirmed_at, MAX_LEAD));
                        waiting.push(Reverse((due, run.id, run.confirmed_at)));
                        continue;
                    }
                    None => open = false,
                },
                _ = tick.tick(), if !waiting.is_empty() => {}
            }
        }
        // While open, the runs due by now; once the leadership ends, all of them.
        let now = Utc::now();
        let mut batch: Vec<Confirmed> = Vec::new();
        while let Some(Reverse((due, id, confirmed_at))) = waiting.peek().copied()
            && (!open || due <= now)
        {
            waiting.pop();
            batch.push(Confirmed { id, confirmed_at });
        }
        if batch.is_empty() {
            continue;
        }
        if !mark(&store, &fence, &stop, &batch).await {
            return;
        }
        let seq = marks_done.load(Ordering::SeqCst) + 1;
        marks_done.store(seq, Ordering::SeqCst);
        let _ = marked.send((seq, batch.into_iter().map(|r| r.id).collect()));
    }
}

/// Marks published runs `queued`, retrying while the database fails. Returns false when the
/// fence no longer holds (the leadership stops) or on a failure while stopping.
async fn mark(store: &Store, fence: &Fence, stop: &CancellationToken, runs: &[Confirmed]) -> bool {
    let mut delay = Duration::from_millis(50);
    loop {
        match store.mark_published(fence, runs).await {
            Ok(true) => return true,
            Ok(false) => {
                warn!(term = fence.term, "lease lost while marking published runs");
                stop.cancel();
                return false;
            }
            Err(e) => {
                warn!(error = %format!("{e:#}"), "marking published runs failed; retrying");
                if stop.is_cancelled() {
                    return false;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// The sweep: every `sweep_interval`, and at once on `NOTIFY chime_outbox` (notifications that
/// arrive during a sweep are served by one more sweep). Hands over the pending runs due by the
/// horizon with the marker's count of committed batches taken before the query.
/// What the sweep works with: the database, the fence, and the control messages that tell the
/// workers of a timed-out workflow run's running nodes to stop.
struct Sweeper {
    store: Store,
    fence: Fence,
    control: Broker,
}

async fn sweep_loop(
    sweeper: Sweeper,
    sweep_interval: Duration,
    lookahead: Duration,
    stop: CancellationToken,
    marks_done: Arc<AtomicU64>,
    swept: mpsc::Sender<Swept>,
) {
    let Sweeper {
        store,
        fence,
        control,
    } = sweeper;
    let mut outbox_wake = store.listen(OUTBOX_CHANNEL).await;
    let mut sweep = tokio::time::interval(sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let advance_due = tokio::select! {
            () = stop.cancelled() => return,
            _ = sweep.tick() => true,
            Some(first) = outbox_wake.recv() => {
                let mut due = first.starts_with(ADVANCE_WAKE);
                while let Ok(more) = outbox_wake.try_recv() {
                    due |= more.starts_with(ADVANCE_WAKE);
                }
                due
            }
        };
        // Child runs first, so this sweep publishes them.
        if advance_due && !advance(&store, &fence, &control, &stop).await {
            return;
        }
        let marks_before = marks_done.load(Ordering::SeqCst);
        // As far ahead as the planner writes the largest burst: a new leader takes over runs
        // its predecessor wrote early for their lead.
        let horizon = plus(Utc::now(), Pace::max_lookahead(lookahead));
        let pending = tokio::select! {
            () = stop.cancelled() => return,
            pending = store.outbox(horizon, SWEEP_LIMIT) => pending,
        };
        match pending {
            Ok(pending) => {
                let handed = tokio::select! {
                    () = stop.cancelled() => return,
                    handed = swept.send((marks_before, pending)) => handed,
                };
                if handed.is_err() {
                    return;
                }
            }
            Err(e) => warn!(error = %format!("{e:#}"), "outbox sweep failed"),
        }
    }
}

/// Makes the child runs of one batch of ended runs (`Store::advance`); a full batch notifies
/// `advance more`, which wakes the next sweep for the rest. Returns false when the fence no
/// longer holds (the leadership stops); a database failure is logged and left to the next
/// sweep (the queue keeps the runs).
async fn advance(store: &Store, fence: &Fence, control: &Broker, stop: &CancellationToken) -> bool {
    let made = tokio::select! {
        () = stop.cancelled() => return false,
        made = store.advance(fence, ADVANCE_BATCH) => made,
    };
    match made {
        Ok(Some(children)) => {
            for child in &children {
                if !child.known {
                    warn!(
                        upstream_run = child.upstream_id,
                        job = %child.job,
                        "child job does not exist (deleted since); not run"
                    );
                } else if let Some(id) = child.run_id {
                    debug!(upstream_run = child.upstream_id, run = id, job = %child.job,
                           state = child.state.as_deref().unwrap_or(""), "child run made");
                }
            }
        }
        Ok(None) => {
            warn!(term = fence.term, "lease lost while making child runs");
            stop.cancel();
            return false;
        }
        Err(e) => {
            warn!(error = %format!("{e:#}"), "making child runs failed; the next sweep retries");
        }
    }
    advance_workflows(store, fence, control, stop).await
}

/// Advances one batch of queued workflow runs (`Store::advance_workflows`): their next node
/// runs are made `pending`, for this sweep to publish. As [`advance`] for the fence and errors.
async fn advance_workflows(
    store: &Store,
    fence: &Fence,
    control: &Broker,
    stop: &CancellationToken,
) -> bool {
    let began = std::time::Instant::now();
    let steps = tokio::select! {
        () = stop.cancelled() => return false,
        steps = store.advance_workflows(fence, &[], WORKFLOW_BATCH) => steps,
    };
    if let Ok(Some(steps)) = &steps
        && !steps.is_empty()
    {
        debug!(
            runs = steps.len(),
            took_ms = began.elapsed().as_secs_f64() * 1e3,
            started = steps.iter().map(|s| s.started.len()).sum::<usize>(),
            "workflow advance"
        );
    }
    match steps {
        Ok(Some(steps)) => {
            for step in &steps {
                debug!(
                    workflow_run = step.run_id,
                    started = step.started.len(),
                    decided = step.decided,
                    ended = step.ended.as_deref().unwrap_or(""),
                    "workflow run advanced"
                );
                if let Some(state) = &step.ended {
                    info!(workflow_run = step.run_id, %state, "workflow run ended");
                }
                for &run_id in &step.stopped {
                    // The cancel is recorded; a worker that misses the message finishes the
                    // run, and the workflow run ends when it does.
                    if let Err(e) = control
                        .publish_control(&ControlMessage::CancelRun { run_id })
                        .await
                    {
                        warn!(workflow_run = step.run_id, run_id, error = %format!("{e:#}"),
                              "could not tell the workers to stop a timed-out workflow's node");
                    }
                }
            }
            true
        }
        Ok(None) => {
            warn!(
                term = fence.term,
                "lease lost while advancing workflow runs"
            );
            stop.cancel();
            false
        }
        Err(e) => {
            warn!(error = %format!("{e:#}"), "advancing workflow runs failed; the next sweep retries");
            true
        }
    }
}

/// The ends of a [`detached`] outbox that the marker and the sweep would hold.
#[cfg(test)]
pub(crate) struct Ends {
    /// Confirmed runs, as the marker receives them.
    pub published: mpsc::UnboundedReceiver<Published>,
    /// Where the marker reports committed batches.
    pub marked: mpsc::UnboundedSender<Marked>,
    /// Where the sweep hands over what it read.
    pub swept: mpsc::Sender<Swept>,
}

/// An outbox without a database: the test plays the marker and the sweep through [`Ends`].
#[cfg(test)]
pub(crate) fn detached() -> (Outbox, Ends) {
    let (published_tx, published_rx) = mpsc::unbounded_channel();
    let (marked_tx, marked_rx) = mpsc::unbounded_channel();
    let (swept_tx, swept_rx) = mpsc::channel(1);
    let outbox = Outbox {
        published: published_tx,
        marked: marked_rx,
        swept: swept_rx,
        held: Held::default(),
        tasks: Vec::new(),
    };
    let ends = Ends {
        published: published_rx,
        marked: marked_tx,
        swept: swept_tx,
    };
    (outbox, ends)
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::job::ConcurrencyPolicy;

    fn run(id: i64, at: DateTime<Utc>) -> OutboxRun {
        OutboxRun {
            id,
            job: format!("job-{id}"),
            group: "g".into(),
            scheduled_at: at,
            attempt: 1,
            params: serde_json::Value::Null,
            timeout: None,
            retry: None,
            concurrency: ConcurrencyPolicy::Allow,
            task: None,
            fan_out: false,
            workflow: false,
        }
    }

    fn ids(runs: &[OutboxRun]) -> Vec<i64> {
        runs.iter().map(|r| r.id).collect()
    }

    /// The hand-over rule: a confirmed run is released only by a sweep that started after its
    /// mark committed; a failed one by the next sweep.
    #[test]
    fn a_sweep_hands_a_run_over_once_its_mark_is_older_than_the_sweep() {
        let (mut outbox, _ends) = detached();
        let now = Utc::now();
        assert!(outbox.take(1) && outbox.take(2) && outbox.take(3));
        assert!(!outbox.take(1), "held already");
        // 1 and 2 confirmed (to be marked), 3 failed.
        outbox.failed(3);
        let sweep = |before, runs: &[i64]| (before, runs.iter().map(|&id| run(id, now)).collect());
        // A sweep that read before any mark: 1 and 2 are still held; 3 is taken again.
        assert_eq!(ids(&outbox.held.hand_over(sweep(0, &[1, 2, 3]))), [3]);
        // 1's mark commits as batch 1; a sweep that started before it still finds 1 held.
        outbox.held.marked.push_back((1, vec![1]));
        assert!(ids(&outbox.held.hand_over(sweep(0, &[1, 2]))).is_empty());
        // A sweep that started after it: 1 found pending again is a new attempt, taken; 2's
        // mark has not committed, so 2 stays held.
        assert_eq!(ids(&outbox.held.hand_over(sweep(1, &[1, 2]))), [1]);
        assert!(outbox.held.marked.is_empty());
        assert_eq!(ids(&outbox.held.hand_over(sweep(1, &[2, 4]))), [4]);
    }
}
