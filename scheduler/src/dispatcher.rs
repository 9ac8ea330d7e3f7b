//! The dispatcher: holds each run until its instant's lead begins, publishes its trigger with the
//! header `x-chime-not-before` = the instant, and hands confirmed runs to the outbox's marker.
//!
//! The worker holds an early trigger, claims it and starts the handler at the instant
//! (docs/protocol.md §4), so the broker's and the database's latency are spent before the
//! instant, not after it. An instant's lead is `lead` (200 ms) plus an allowance for its number
//! of runs, measured by this dispatcher ([`crate::pace`]).
//!
//! Its loop only holds runs, starts publishes and collects confirms: the database work it
//! depends on (marks, sweeps) runs in the [`crate::outbox`]'s tasks, so a slow database never
//! stalls publishing. It publishes through the [`Publish`] seam — [`Triggers`] for a leader (the
//! `replace` policy, then the [`Publisher`]); a test records instead — generically, so the hot
//! loop pays no boxing or dynamic dispatch per run.
//!
//! **Invariants** (enforced here):
//! * The trust window of the term is checked before every release of triggers, so before every
//!   publish; once it has closed nothing more is published, and the leadership's duties stop.
//! * A run goes to the marker only after its confirm ([`crate::outbox::Outbox::confirmed`]); a
//!   failed or nacked publish leaves it `pending` in the outbox, to be swept again.
//! * An instant's runs are released in instant order, never before an earlier instant's: a
//!   release takes every held run up to the latest instant due ([`crate::pace::Instants`]), in
//!   (instant, run id) order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chime_protocol::wire::ControlMessage;
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::job::ConcurrencyPolicy;
use crate::leader::Leadership;
use crate::outbox::{Outbox, Report};
use crate::pace::{Instants, MAX_LEAD, Pace, minus};
use crate::publish::{PublishError, Publisher};
use crate::store::{Fence, OutboxRun, Store};

/// Where the dispatcher sends a run's trigger: the seam between it and the broker.
pub trait Publish: Send + Sync + 'static {
    /// Publishes attempt `run.attempt` of `run` under leader `term`; `Ok` only once the broker
    /// confirmed it (an ack, not returned).
    fn publish(
        &self,
        run: &OutboxRun,
        term: i64,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The wall clock the dispatcher times instants by.
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock, as the planner and the workers read it.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A leader's publishing: attempt 1 of a `replace` job first cancels the job's earlier
/// unfinished runs (fenced), telling the workers of running ones through a control message;
/// then the trigger goes out through the [`Publisher`].
#[derive(Debug)]
pub struct Triggers {
    /// Database, for the `replace` policy's cancels.
    pub store: Store,
    /// The leadership's fence.
    pub fence: Fence,
    /// Triggers.
    pub publisher: Arc<Publisher>,
    /// Control messages.
    pub broker: Broker,
}

impl Publish for Triggers {
    async fn publish(&self, run: &OutboxRun, term: i64) -> anyhow::Result<()> {
        if run.concurrency == ConcurrencyPolicy::Replace && run.attempt == 1 {
            self.replace(run).await?;
        }
        if run.workflow {
            return self.start_workflow(run).await;
        }
        if run.fan_out {
            return self.fan_out(run, term).await;
        }
        self.publisher.publish(run, term).await?;
        Ok(())
    }
}

impl Triggers {
    /// Publishing a workflow run is starting it under the fence: it is `running`, and its first
    /// nodes' runs are made `pending` at its instant, which the outbox sweep (woken by the
    /// start) publishes like any run (docs/workflows.md).
    async fn start_workflow(&self, run: &OutboxRun) -> anyhow::Result<()> {
        let Some(steps) = self
            .store
            .advance_workflows(&self.fence, &[run.id], 0)
            .await?
        else {
            anyhow::bail!("lease lost (term {} no longer current)", self.fence.term);
        };
        for step in steps {
            info!(run_id = step.run_id, workflow = %run.job, nodes = step.started.len(),
                  ended = step.ended.as_deref().unwrap_or(""), "workflow run started");
        }
        Ok(())
    }
}

/// Triggers of one parent's tasks in flight at once while it is expanded.
const FAN_OUT_IN_FLIGHT: usize = 256;

impl Triggers {
    /// Publishing a parent run (broadcast, sharded, map/reduce) is publishing its tasks: expand
    /// it under the fence (once; a later call returns the tasks not yet published), publish each
    /// task's trigger, record the confirmed ones. `Ok` only when every task is published, so
    /// the parent is marked `queued` after its tasks; otherwise it stays `pending` and the next
    /// sweep (or the next leader) publishes the rest. A broadcast task whose worker has no queue
    /// ends `lost` with the reason: that worker is gone for good, or its SDK takes no broadcast
    /// tasks.
    async fn fan_out(&self, parent: &OutboxRun, term: i64) -> anyhow::Result<()> {
        let Some(tasks) = self.store.expand_run(&self.fence, parent).await? else {
            anyhow::bail!("lease lost (term {} no longer current)", self.fence.term);
        };
        let count = tasks.len();
        // Owned tasks and publisher: the stream's futures borrow nothing (a borrowing closure
        // makes this future not `Send` for every lifetime, which the dispatcher needs).
        let sent: Vec<_> = futures::stream::iter(tasks)
            .map(|task| {
                let publisher = self.publisher.clone();
                async move {
                    let result = publisher.publish(&task, term).await;
                    (task, result, Utc::now())
                }
            })
            .buffer_unordered(FAN_OUT_IN_FLIGHT)
            .collect()
            .await;
        let mut confirmed = Vec::with_capacity(sent.len());
        let mut failed = 0usize;
        let mut last_error = None;
        for (task, result, at) in sent {
            match (result, task.task.as_ref().and_then(|t| t.worker.as_deref())) {
                (Ok(()), _) => confirmed.push(crate::store::Confirmed {
                    id: task.id,
                    confirmed_at: at,
                }),
                (Err(PublishError::Unroutable { .. }), Some(worker)) => {
                    let why = format!(
                        "worker {worker} has no queue {}: it stopped for good, or its SDK takes \
                         no broadcast tasks",
                        chime_protocol::topology::Topology::new(
                            self.publisher.prefix(),
                            &task.group
                        )
                        .worker_queue(worker)
                    );
                    warn!(run_id = task.id, parent = parent.id, %worker, "{why}");
                    self.store
                        .task_unroutable(&self.fence, task.id, &why)
                        .await?;
                }
                (Err(e), _) => {
                    failed += 1;
                    last_error = Some(e);
                }
            }
        }
        if !confirmed.is_empty() && !self.store.tasks_published(&self.fence, &confirmed).await? {
            anyhow::bail!("lease lost (term {} no longer current)", self.fence.term);
        }
        if let Some(e) = last_error {
            return Err(anyhow::Error::from(e).context(format!(
                "{failed} of {count} tasks of run {} not published; the run stays in the outbox",
                parent.id
            )));
        }
        if count > 0 {
            info!(run_id = parent.id, job = %parent.job, tasks = count, "published the run's tasks");
        }
        Ok(())
    }

    async fn replace(&self, run: &OutboxRun) -> anyhow::Result<()> {
        let by = format!("replace policy (run {})", run.id);
        let Some(cancelled) = self
            .store
            .cancel_superseded(&self.fence, &run.job, run.id, &by)
            .await?
        else {
            anyhow::bail!("lease lost (term {} no longer current)", self.fence.term);
        };
        for (id, before) in cancelled {
            if before != "running" {
                info!(run_id = id, job = %run.job, replaced_by = run.id, state = %before,
                      "run cancelled before it started (concurrency replace)");
                continue;
            }
            // A running workflow run's running nodes are runs of their own: each is told too.
            let nodes = if run.workflow {
                self.store.running_nodes(id).await?
            } else {
                Vec::new()
            };
            for run_id in std::iter::once(id).chain(nodes) {
                match self
                    .broker
                    .publish_control(&ControlMessage::CancelRun { run_id })
                    .await
                {
                    Ok(delivery) => info!(run_id, job = %run.job, replaced_by = run.id, ?delivery,
                                          "asked the worker to cancel the running run (concurrency replace)"),
                    // The cancel request is recorded: if the worker is lost the rescuer finishes
                    // it as cancelled; otherwise the old run may overlap the new one.
                    Err(e) => warn!(run_id, job = %run.job, replaced_by = run.id,
                                    error = %format!("{e:#}"),
                                    "could not send the cancel control message (concurrency replace)"),
                }
            }
        }
        Ok(())
    }
}

/// Holds runs until their lead and publishes them through `P`, timing instants by `C`.
pub struct Dispatcher<P, C = WallClock> {
    publisher: Arc<P>,
    clock: C,
    term: i64,
    lead: Duration,
    leadership: watch::Receiver<Leadership>,
    stop: CancellationToken,
    /// The measured publish rate, which sizes each instant's lead; shared with the planner.
    pace: Arc<Pace>,
}

impl<P, C> std::fmt::Debug for Dispatcher<P, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("term", &self.term)
            .field("lead", &self.lead)
            .finish_non_exhaustive()
    }
}

/// A group of triggers released together, timed from its release to its last confirm to
/// measure the publish rate ([`Pace::observe`]).
struct Burst {
    size: usize,
    unsettled: usize,
    released: Instant,
}

impl<P: Publish, C: Clock> Dispatcher<P, C> {
    /// A dispatcher for `term`, publishing each instant `lead` (plus its allowance from `pace`)
    /// ahead while `leadership` trusts the term; cancels `stop` when it no longer does.
    pub fn new(
        publisher: Arc<P>,
        clock: C,
        term: i64,
        lead: Duration,
        leadership: watch::Receiver<Leadership>,
        stop: CancellationToken,
        pace: Arc<Pace>,
    ) -> Dispatcher<P, C> {
        Dispatcher {
            publisher,
            clock,
            term,
            lead,
            leadership,
            stop,
            pace,
        }
    }

    /// Dispatches the runs that come on `incoming` (from the planner) and from `outbox`'s
    /// sweeps until `stop` or the trust window closes; then waits for the confirms of
    /// publishes already sent and lets the outbox mark them.
    pub async fn run(self, mut incoming: mpsc::Receiver<OutboxRun>, mut outbox: Outbox) {
        // Held runs by scheduled instant; `instants` counts them per instant, and `release` is
        // the next moment some instant's lead begins (cached: recomputed after each release).
        let mut waiting: BinaryHeap<Reverse<(DateTime<Utc>, i64)>> = BinaryHeap::new();
        let mut instants = Instants::default();
        let mut release: Option<DateTime<Utc>> = None;
        let mut bursts: HashMap<u64, Burst> = HashMap::new();
        let mut burst_seq = 0u64;
        let mut runs: HashMap<i64, OutboxRun> = HashMap::new();
        let mut in_flight = FuturesUnordered::new();

        loop {
            let next_due = release
                .map(|at| (at - self.clock.now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                Some((id, scheduled_at, burst, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    let result: anyhow::Result<()> = result;
                    if let Some(b) = bursts.get_mut(&burst) {
                        b.unsettled -= 1;
                        if b.unsettled == 0 {
                            let b = bursts.remove(&burst).expect("present");
                            if result.is_ok() {
                                self.pace.observe(b.size, b.released.elapsed());
                            }
                        }
                    }
                    match result {
                        Ok(()) => outbox.confirmed(id, scheduled_at, self.clock.now()),
                        Err(e) => {
                            warn!(run_id = id, error = %format!("{e:#}"), "publish failed; the run stays in the outbox");
                            outbox.failed(id);
                        }
                    }
                }
                () = tokio::time::sleep(next_due), if release.is_some() => {
                    let Some(term) = self.trusted_term() else { break };
                    let horizon = instants.horizon(self.clock.now(), |n| self.lead(n), MAX_LEAD);
                    burst_seq += 1;
                    let mut size = 0;
                    while let Some(horizon) = horizon
                        && let Some(Reverse((at, _))) = waiting.peek()
                        && *at <= horizon
                    {
                        let Reverse((at, id)) = waiting.pop().expect("peeked");
                        instants.remove(at);
                        let Some(run) = runs.remove(&id) else { continue };
                        let publisher = self.publisher.clone();
                        size += 1;
                        in_flight.push(async move {
                            let result = publisher.publish(&run, term).await;
                            (run.id, run.scheduled_at, burst_seq, result)
                        });
                    }
                    if size > 0 {
                        bursts.insert(burst_seq, Burst { size, unsettled: size, released: Instant::now() });
                    }
                    release = instants.next_due(|n| self.lead(n), MAX_LEAD);
                }
                Some(run) = incoming.recv() => {
                    if outbox.take(run.id) {
                        self.hold(run, &mut waiting, &mut instants, &mut release, &mut runs);
                    }
                }
                Some(report) = outbox.report() => {
                    if let Report::Swept(pending) = report {
                        for run in pending {
                            self.hold(run, &mut waiting, &mut instants, &mut release, &mut runs);
                        }
                    }
                }
            }
        }
        // Stopping: let publishes already sent get their confirms and record them, so the next
        // leader does not publish them again.
        while let Some((id, scheduled_at, _, result)) = in_flight.next().await {
            if result.is_ok() {
                outbox.confirmed(id, scheduled_at, self.clock.now());
            }
        }
        outbox.finish(self.term).await;
    }

    /// The lead of an instant with `n` triggers ([`Pace::lead`]).
    fn lead(&self, n: usize) -> Duration {
        self.pace.lead(self.lead, n)
    }

    /// Holds a run until its instant's lead begins. The instant now has one more trigger, so its
    /// lead can only have grown: the next release moves earlier or stays.
    fn hold(
        &self,
        run: OutboxRun,
        waiting: &mut BinaryHeap<Reverse<(DateTime<Utc>, i64)>>,
        instants: &mut Instants,
        release: &mut Option<DateTime<Utc>>,
        runs: &mut HashMap<i64, OutboxRun>,
    ) {
        let n = instants.add(run.scheduled_at);
        let at = minus(run.scheduled_at, self.lead(n));
        *release = Some(release.map_or(at, |r| r.min(at)));
        waiting.push(Reverse((run.scheduled_at, run.id)));
        runs.insert(run.id, run);
    }

    fn trusted_term(&self) -> Option<i64> {
        let term = self.leadership.borrow().term_at(Instant::now());
        if term != Some(self.term) {
            warn!(
                term = self.term,
                "no longer trusted as leader; dispatcher stops"
            );
            self.stop.cancel();
            return None;
        }
        term
    }
}

#[cfg(test)]
mod tests {
    //! The dispatcher over a recording publish seam, in paused time: no broker, no database.

    use std::collections::HashSet;
    use std::sync::Mutex;

    use chime_protocol::wire::HEADER_NOT_BEFORE;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::outbox::{self, Ends};
    use crate::publish::TriggerMessage;

    const TERM: i64 = 7;
    const LEAD: Duration = Duration::from_millis(200);
    /// Longest a test waits for an event (in paused time, so never really).
    const PATIENCE: Duration = Duration::from_secs(60);

    /// Wall-clock time that follows tokio's paused clock.
    #[derive(Debug, Clone, Copy)]
    struct PausedClock {
        wall: DateTime<Utc>,
        start: Instant,
    }

    impl Clock for PausedClock {
        fn now(&self) -> DateTime<Utc> {
            crate::pace::plus(self.wall, Instant::now() - self.start)
        }
    }

    /// One publish as the broker would have seen it.
    #[derive(Debug, Clone, PartialEq)]
    struct Sent {
        id: i64,
        at: DateTime<Utc>,
        not_before: Option<i64>,
        term: i64,
    }

    /// The test's seam: records each publish with its wall time and the header the real
    /// trigger carries, and nacks the first publish of the runs in `nack_once`.
    struct Recorder {
        clock: PausedClock,
        sent: Mutex<Vec<Sent>>,
        nack_once: Mutex<HashSet<i64>>,
    }

    impl Publish for Recorder {
        async fn publish(&self, run: &OutboxRun, term: i64) -> anyhow::Result<()> {
            let trigger = TriggerMessage::new(run, term);
            self.sent.lock().expect("not poisoned").push(Sent {
                id: run.id,
                at: self.clock.now(),
                not_before: trigger.header(HEADER_NOT_BEFORE),
                term,
            });
            // A confirm takes a moment.
            tokio::time::sleep(Duration::from_millis(2)).await;
            if self.nack_once.lock().expect("not poisoned").remove(&run.id) {
                return Err(crate::publish::PublishError::Nacked.into());
            }
            Ok(())
        }
    }

    struct Harness {
        clock: PausedClock,
        recorder: Arc<Recorder>,
        incoming: mpsc::Sender<OutboxRun>,
        outbox: Ends,
        stop: CancellationToken,
        task: JoinHandle<()>,
    }

    /// A dispatcher trusted for `trusted_for` from now, nacking the first publish of
    /// `nack_once`.
    fn start(trusted_for: Duration, nack_once: &[i64]) -> Harness {
        let clock = PausedClock {
            wall: DateTime::from_timestamp_millis(1_800_000_000_000).expect("instant"),
            start: Instant::now(),
        };
        let recorder = Arc::new(Recorder {
            clock,
            sent: Mutex::new(Vec::new()),
            nack_once: Mutex::new(nack_once.iter().copied().collect()),
        });
        let (_, leadership) = watch::channel(Leadership::Leader {
            term: TERM,
            trusted_until: Instant::now() + trusted_for,
        });
        let (outbox, ends) = outbox::detached();
        let (incoming, rx) = mpsc::channel(64);
        let stop = CancellationToken::new();
        let dispatcher = Dispatcher::new(
            recorder.clone(),
            clock,
            TERM,
            LEAD,
            leadership,
            stop.clone(),
            Arc::new(Pace::default()),
        );
        Harness {
            clock,
            recorder,
            incoming,
            outbox: ends,
            stop,
            task: tokio::spawn(dispatcher.run(rx, outbox)),
        }
    }

    impl Harness {
        fn at(&self, ms: i64) -> DateTime<Utc> {
            self.clock.wall + chrono::TimeDelta::milliseconds(ms)
        }

        fn run(&self, id: i64, at_ms: i64) -> OutboxRun {
            OutboxRun {
                id,
                job: format!("job-{id}"),
                group: "g".into(),
                scheduled_at: self.at(at_ms),
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

        async fn give(&self, id: i64, at_ms: i64) {
            self.incoming
                .send(self.run(id, at_ms))
                .await
                .expect("dispatcher running");
        }

        /// The next run handed to the marker.
        async fn marked(&mut self) -> i64 {
            tokio::time::timeout(PATIENCE, self.outbox.published.recv())
                .await
                .expect("a run confirmed in time")
                .expect("the marker's channel is open")
                .id
        }

        fn sent(&self) -> Vec<Sent> {
            self.recorder.sent.lock().expect("not poisoned").clone()
        }

        fn sent_ids(&self) -> Vec<i64> {
            self.sent().iter().map(|s| s.id).collect()
        }

        /// Waits for the dispatcher to end; what the marker's channel still holds after it.
        async fn stopped(mut self) -> Vec<i64> {
            tokio::time::timeout(PATIENCE, &mut self.task)
                .await
                .expect("the dispatcher stops")
                .expect("the dispatcher does not panic");
            let mut left = Vec::new();
            while let Some(run) = self.outbox.published.recv().await {
                left.push(run.id);
            }
            left
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_run_goes_out_its_lead_before_its_instant_with_the_instant_as_not_before() {
        let mut h = start(PATIENCE, &[]);
        // Two instants 50 ms apart: each goes at its own lead, not with the other.
        h.give(2, 1_050).await;
        h.give(1, 1_000).await;
        assert_eq!(h.marked().await, 1, "confirmed, so handed to the marker");
        assert_eq!(h.marked().await, 2);
        let sent = h.sent();
        assert_eq!(sent.iter().map(|s| s.id).collect::<Vec<_>>(), [1, 2]);
        // One trigger at its instant: the base lead plus a half-millisecond allowance; the
        // timer wakes within a millisecond after it.
        let lead = Pace::default().lead(LEAD, 1);
        for (sent, at_ms) in sent.iter().zip([1_000, 1_050]) {
            let instant = h.at(at_ms);
            assert_eq!(
                sent.not_before,
                Some(instant.timestamp_millis()),
                "run {}",
                sent.id
            );
            assert_eq!(sent.term, TERM);
            let ahead = (instant - sent.at)
                .to_std()
                .expect("published before the instant");
            assert!(
                ahead <= lead && ahead > lead - Duration::from_millis(1),
                "run {} published {ahead:?} ahead, lead {lead:?}",
                sent.id
            );
        }
        h.stop.cancel();
        assert_eq!(h.stopped().await, Vec::<i64>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_nacked_run_stays_in_the_outbox_and_a_later_sweep_publishes_it_again() {
        let mut h = start(PATIENCE, &[2]);
        for id in [3, 1, 2] {
            h.give(id, 300).await;
        }
        let mut marked = vec![h.marked().await, h.marked().await];
        marked.sort_unstable();
        assert_eq!(marked, [1, 3], "run 2 was nacked: not marked");
        assert_eq!(h.sent_ids(), [1, 2, 3], "one instant's runs in id order");

        // A sweep that read before any mark committed: 1 and 3 are held (confirmed, mark
        // pending), so only 2, back in the outbox, is published again.
        let swept = [1, 2, 3].map(|id| h.run(id, 300)).to_vec();
        h.outbox.swept.send((0, swept)).await.expect("sweep taken");
        assert_eq!(h.marked().await, 2, "the second publish was confirmed");
        assert_eq!(h.sent_ids(), [1, 2, 3, 2]);

        // 1's mark commits; a sweep after it finds 1 pending again (rescued): a new attempt.
        h.outbox
            .marked
            .send((1, vec![1, 3]))
            .expect("marks reported");
        h.outbox
            .swept
            .send((1, vec![h.run(1, 300)]))
            .await
            .expect("sweep taken");
        assert_eq!(h.marked().await, 1);
        assert_eq!(h.sent_ids(), [1, 2, 3, 2, 1]);
        h.stop.cancel();
        assert_eq!(h.stopped().await, Vec::<i64>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_published_once_the_trust_window_has_closed() {
        let mut h = start(Duration::from_secs(1), &[]);
        // Due inside the window, and long after it.
        h.give(1, 500).await;
        h.give(2, 3_000).await;
        assert_eq!(h.marked().await, 1);
        let (stop, recorder) = (h.stop.clone(), h.recorder.clone());
        assert_eq!(h.stopped().await, Vec::<i64>::new(), "nothing more to mark");
        assert!(
            stop.is_cancelled(),
            "the leadership's duties are told to stop"
        );
        let sent = recorder.sent.lock().expect("not poisoned").clone();
        assert_eq!(sent.iter().map(|s| s.id).collect::<Vec<_>>(), [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_instant_takes_the_earlier_instant_with_it_in_instant_order() {
        let mut h = start(PATIENCE, &[]);
        // 200 runs at 1 s (lead 200 ms + 100 ms for their number) given in reverse, and one run
        // 50 ms earlier (lead 200.5 ms), given last.
        for id in (1_000..1_200).rev() {
            h.give(id, 1_000).await;
        }
        h.give(5, 950).await;
        for _ in 0..201 {
            h.marked().await;
        }
        let sent = h.sent();
        let order: Vec<(DateTime<Utc>, i64)> = sent
            .iter()
            .map(|s| match s.not_before {
                Some(ms) => (DateTime::from_timestamp_millis(ms).expect("ms"), s.id),
                other => panic!("no not-before header: {other:?}"),
            })
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "released in (instant, run id) order");
        assert_eq!(sent[0].id, 5, "the earlier instant first");
        // All in one release, when the large instant's lead began: before the earlier
        // instant's own lead.
        let released = sent[0].at;
        assert!(sent.iter().all(|s| s.at == released));
        let large_lead = Pace::default().lead(LEAD, 200);
        let ahead = (h.at(1_000) - released).to_std().expect("ahead");
        assert!(
            ahead <= large_lead && ahead > large_lead - Duration::from_millis(1),
            "released {ahead:?} ahead of the large instant, its lead {large_lead:?}"
        );
        assert!(h.at(950) - released > chrono::TimeDelta::milliseconds(201));
        h.stop.cancel();
        assert_eq!(h.stopped().await, Vec::<i64>::new());
    }
}
