//! The leader's duties: turn schedules into runs (planner) and publish them on the instant
//! (dispatcher), with the outbox as the safety net.
//!
//! * The **planner** keeps every active job in a min-heap keyed by its next fire, so a tick
//!   touches only the jobs that are due, never the registered ones. A little before each instant
//!   (`lookahead`) it writes the due fires as runs in one fenced batch insert (unique on
//!   (job, scheduled instant), so a fire can never become two runs), then hands them to the
//!   dispatcher. On taking office and whenever a job is found behind schedule, it applies the
//!   job's misfire policy from the persisted cursor ([`crate::misfire`]).
//! * The **dispatcher** holds runs until `lead` before their instant, publishes them with
//!   confirms and the header `x-chime-not-before` = the instant, and marks them `queued` in
//!   batches at their instant, unless a worker claimed them first (the usual case, which spares
//!   the row a version). A publish that fails leaves the run `pending` in the outbox. The worker holds an
//!   early trigger, claims it, and starts the handler at the instant (docs/protocol.md §4), so
//!   the broker's and the database's latency are spent before the instant, not after it.
//! * The **outbox sweep** (every `sweep_interval`, and at once on `NOTIFY chime_outbox`) hands
//!   the dispatcher every pending run due by the horizon that it does not already hold: manual
//!   triggers, runs a previous leader persisted but did not publish, and failed publishes.
//!
//! * **Concurrency policies** are decided against the database when a fire is written
//!   ([`Store::insert_fires`]): `forbid` records the fire `skipped` while a run of the job is
//!   unfinished, `queue` keeps the new run out of the dispatcher and the outbox until the
//!   earlier runs of its job have finished (a database trigger wakes the sweep when one does),
//!   and `replace` cancels the job's unfinished runs just before attempt 1 of the new run is
//!   published (running ones through a `CancelRun` control message).
//! * Next to these run the [`crate::rescuer`] and the [`crate::alerts`] duty.
//!
//! Before each publish the dispatcher checks the local trust window of its term; every database
//! write is fenced by the term.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use chime_protocol::wire::{ControlMessage, RetryPolicy};

use crate::config::{AlertSettings, RescuerSettings};
use crate::job::{ConcurrencyPolicy, JobSpec};
use crate::leader::Leadership;
use crate::misfire::{self, CatchUpPolicy, Decision};
pub use crate::pace::MAX_LEAD;
use crate::pace::{Instants, Pace, minus, plus};
use crate::publish::Publisher;
use crate::schedule::Schedule;
use crate::store::{
    ALL_JOBS, Confirmed, Fence, JOBS_CHANNEL, JobRecord, NewFire, OUTBOX_CHANNEL, OutboxRun, Store,
    TriggerKind,
};

/// Tuning of the leader's loops.
#[derive(Debug, Clone, Copy)]
pub struct PlannerTimings {
    /// Fires are written this long before their instant, so the insert is done when it comes.
    pub lookahead: Duration,
    /// How often the outbox is swept for runs nobody holds.
    pub sweep_interval: Duration,
    /// Triggers of an instant are published at least this long before it, plus an allowance
    /// for the number due at that instant ([`crate::pace`]); the worker holds them until it.
    /// The whole lead is capped at [`MAX_LEAD`], under the worker's hold limit for triggers.
    /// Keep it below `lookahead`, so the rows exist before their triggers go out.
    pub lead: Duration,
}

impl Default for PlannerTimings {
    fn default() -> Self {
        PlannerTimings {
            lookahead: Duration::from_millis(500),
            sweep_interval: Duration::from_secs(1),
            lead: Duration::from_millis(200),
        }
    }
}

/// What a leader needs to do its duties.
#[derive(Debug)]
pub struct LeaderContext {
    /// Database.
    pub store: Store,
    /// Broker.
    pub publisher: Arc<Publisher>,
    /// This instance's id.
    pub instance: String,
    /// Loop timings.
    pub timings: PlannerTimings,
    /// The rescuer's timings.
    pub rescuer: RescuerSettings,
    /// Alert webhooks (the alert duty runs only if some webhook is configured).
    pub alerts: Arc<AlertSettings>,
}

/// Runs the leader's duties for `term` until `stop` is cancelled or the lease is lost.
pub async fn lead(
    ctx: Arc<LeaderContext>,
    term: i64,
    leadership: watch::Receiver<Leadership>,
    stop: CancellationToken,
) {
    let fence = Fence {
        holder: ctx.instance.clone(),
        term,
    };
    let (tx, rx) = mpsc::channel(4096);
    let pace = Arc::new(Pace::default());
    let dispatcher = Dispatcher {
        ctx: ctx.clone(),
        fence: fence.clone(),
        leadership,
        stop: stop.clone(),
        pace: pace.clone(),
    };
    let dispatch = tokio::spawn(dispatcher.run(rx));
    let rescuer = tokio::spawn(crate::rescuer::run(
        ctx.store.clone(),
        fence.clone(),
        ctx.rescuer,
        stop.clone(),
    ));
    // Job files can name webhooks too, so the duty always runs; without any webhook it only
    // reads events.
    let alerts = tokio::spawn(crate::alerts::run(
        ctx.store.clone(),
        fence.clone(),
        ctx.alerts.clone(),
        stop.clone(),
    ));
    let mut planner = Planner {
        ctx,
        fence,
        jobs: HashMap::new(),
        heap: BinaryHeap::new(),
        instants: Instants::default(),
        pace,
        dispatch: tx,
        generation: 0,
        schedules: HashMap::new(),
        groups: HashSet::new(),
    };
    if let Err(e) = planner.run(&stop).await {
        if stop.is_cancelled() {
            // Stopping (shutdown, resignation or a lost fence seen by another duty): the
            // planner's last write found the dispatcher gone, which is expected.
            debug!(term, error = %format!("{e:#}"), "planner stopped while stopping");
        } else {
            error!(term, error = %format!("{e:#}"), "planner stopped");
        }
    }
    // Lost the fence or told to stop: either way the dispatcher must stop too.
    stop.cancel();
    drop(planner);
    if let Err(e) = dispatch.await {
        error!(term, error = %e, "dispatcher ended abnormally");
    }
    for (duty, task) in [("rescuer", rescuer), ("alerts", alerts)] {
        if let Err(e) = task.await {
            error!(term, duty, error = %e, "leader duty ended abnormally");
        }
    }
}

/// What the planner keeps of a planned job: only what planning and firing need (about 150
/// bytes a job, against ~560 for a whole [`JobSpec`]), with the schedule and the group shared
/// between jobs. The name is the key of [`Planner::jobs`].
struct Planned {
    schedule: Arc<Schedule>,
    group: Arc<str>,
    /// `None` for `null`, the parameters of most jobs.
    params: Option<Box<serde_json::Value>>,
    catch_up: CatchUpPolicy,
    concurrency: ConcurrencyPolicy,
    timeout: Option<Duration>,
    retry: RetryPolicy,
    generation: u64,
}

impl Planned {
    /// Whether `other` plans and fires the same way (the generation aside).
    fn same_plan(&self, other: &Planned) -> bool {
        (Arc::ptr_eq(&self.schedule, &other.schedule) || self.schedule == other.schedule)
            && self.group == other.group
            && self.params == other.params
            && self.catch_up == other.catch_up
            && self.concurrency == other.concurrency
            && self.timeout == other.timeout
            && self.retry == other.retry
    }

    fn params(&self) -> serde_json::Value {
        self.params
            .as_deref()
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    }
}

/// A heap entry: next fire of a job; stale when the job's generation moved on.
type Slot = Reverse<(DateTime<Utc>, Arc<str>, u64)>;

/// Jobs read from the database per query when the planner (re)reads them all, so the rows and
/// decoded definitions of 100,000 jobs are never in memory at once; at start the planner fires
/// what falls due between two pages, so the first jobs fire before the last ones are read.
const JOB_PAGE: i64 = 2_000;

struct Planner {
    ctx: Arc<LeaderContext>,
    fence: Fence,
    /// Planned jobs by name; the heap's slots share the name.
    jobs: HashMap<Arc<str>, Planned>,
    heap: BinaryHeap<Slot>,
    /// How many heap slots fall on each instant (stale ones included until popped), so a large
    /// burst is written earlier than a lone fire.
    instants: Instants,
    /// The dispatcher's measured publish rate.
    pace: Arc<Pace>,
    dispatch: mpsc::Sender<OutboxRun>,
    generation: u64,
    /// Parsed schedules by definition, while a batch of jobs is admitted.
    schedules: HashMap<String, Arc<Schedule>>,
    /// Group names, shared by the jobs of each group (a handful of groups for many jobs).
    groups: HashSet<Arc<str>>,
}

impl Planner {
    async fn run(&mut self, stop: &CancellationToken) -> anyhow::Result<()> {
        let mut changes = listen(&self.ctx.store, JOBS_CHANNEL).await;
        info!(term = self.fence.term, "planning");
        let mut after: Option<String> = None;
        let mut read = 0usize;
        loop {
            let records = self.ctx.store.jobs_page(after.as_deref(), JOB_PAGE).await?;
            let Some(last) = records.last() else { break };
            after = Some(last.spec.name.clone());
            read += records.len();
            let now = Utc::now();
            let mut fires = Vec::new();
            for record in records {
                self.admit(record, now, &mut fires);
            }
            self.write(fires).await?;
            // The jobs planned so far fire on time while the others are read.
            self.tick().await?;
        }
        self.schedules = HashMap::new();
        self.jobs.shrink_to_fit();
        info!(
            term = self.fence.term,
            jobs = read,
            planned = self.jobs.len(),
            "planned"
        );

        loop {
            self.tick().await?;

            let base = self.ctx.timings.lookahead;
            let wake = match self
                .instants
                .next_due(|n| self.pace.lookahead(base, n), Pace::max_lookahead(base))
            {
                Some(at) => (at - Utc::now()).to_std().unwrap_or(Duration::ZERO),
                None => Duration::from_secs(3600),
            };
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(wake) => {}
                Some(name) = changes.recv() => {
                    if name == ALL_JOBS {
                        self.reload_all().await?;
                    } else {
                        self.reload(&name).await?;
                    }
                }
            }
        }
    }

    /// Writes the fires due by the lookahead horizon: each instant `lookahead` ahead, more for
    /// an instant with many fires ([`Pace::lookahead`]).
    async fn tick(&mut self) -> anyhow::Result<()> {
        let now = Utc::now();
        let base = self.ctx.timings.lookahead;
        let horizon = self.instants.horizon(
            now,
            |n| self.pace.lookahead(base, n),
            Pace::max_lookahead(base),
        );
        let mut fires = Vec::new();
        while let Some(horizon) = horizon
            && let Some(Reverse((at, _, _))) = self.heap.peek()
            && *at <= horizon
        {
            let Reverse((at, name, generation)) = self.heap.pop().expect("peeked");
            self.instants.remove(at);
            self.fire(at, name, generation, now, &mut fires);
        }
        self.write(fires).await
    }

    /// Plans a job's next fire.
    fn push(&mut self, at: DateTime<Utc>, name: Arc<str>, generation: u64) {
        self.instants.add(at);
        self.heap.push(Reverse((at, name, generation)));
    }

    /// Takes a job into the plan: applies its misfire policy from the persisted cursor, then
    /// schedules its next fire.
    fn admit(&mut self, record: JobRecord, now: DateTime<Utc>, fires: &mut Vec<NewFire>) {
        if record.paused {
            return;
        }
        let name: Arc<str> = Arc::from(record.spec.name.as_str());
        let Some(planned) = self.plan(record.spec) else {
            return;
        };
        self.enter(name, planned, record.cursor_at, now, fires);
    }

    /// The compact record of a job (with a new generation), or `None` for a stored job whose
    /// schedule does not parse (logged).
    fn plan(&mut self, spec: JobSpec) -> Option<Planned> {
        let schedule = match self.schedule_of(&spec) {
            Ok(s) => s,
            Err(e) => {
                error!(job = %spec.name, error = %e, "stored job has an invalid schedule; not planned");
                return None;
            }
        };
        let group = match self.groups.get(spec.group.as_str()) {
            Some(group) => group.clone(),
            None => {
                let group: Arc<str> = Arc::from(spec.group.as_str());
                self.groups.insert(group.clone());
                group
            }
        };
        self.generation += 1;
        let planned = Planned {
            schedule,
            group,
            params: (!spec.params.is_null()).then(|| Box::new(spec.params.clone())),
            catch_up: CatchUpPolicy::from_spec(&spec),
            concurrency: spec.concurrency,
            timeout: spec.timeout,
            retry: spec.retry.to_wire(),
            generation: self.generation,
        };
        Some(planned)
    }

    /// Puts a planned job in the plan: catches up from `cursor` and pushes its next fire.
    fn enter(
        &mut self,
        name: Arc<str>,
        planned: Planned,
        cursor: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        fires: &mut Vec<NewFire>,
    ) {
        // A job never planned before starts now: nothing to catch up.
        let cursor = cursor.unwrap_or(now);
        let next_from = if cursor < now {
            catch_up(&name, &planned, cursor, now, fires);
            now
        } else {
            cursor
        };
        if let Some(next) = planned.schedule.next_after(next_from) {
            self.push(next, name.clone(), planned.generation);
        }
        self.jobs.insert(name, planned);
    }

    /// The job's parsed schedule, shared with every job of the same schedule admitted in the
    /// same batch (the cache is emptied after each batch; the sharing stays). A parsed cron
    /// expression holds a set per field (a few KiB), and at 100,000 jobs one copy per job
    /// dominated the scheduler's memory; real job sets repeat a few expressions many times.
    fn schedule_of(
        &mut self,
        spec: &JobSpec,
    ) -> Result<Arc<Schedule>, crate::schedule::ScheduleError> {
        let key = format!("{:?}|{}", spec.when, spec.timezone);
        if let Some(schedule) = self.schedules.get(&key) {
            return Ok(schedule.clone());
        }
        let schedule = Arc::new(spec.schedule()?);
        self.schedules.insert(key, schedule.clone());
        Ok(schedule)
    }

    /// A heap slot came due (or is about to).
    fn fire(
        &mut self,
        at: DateTime<Utc>,
        name: Arc<str>,
        generation: u64,
        now: DateTime<Utc>,
        fires: &mut Vec<NewFire>,
    ) {
        let Some(planned) = self.jobs.get(&name) else {
            return;
        };
        if planned.generation != generation {
            return;
        }
        let late = (now - at).to_std().unwrap_or(Duration::ZERO) > planned.catch_up.grace;
        let next_from = if late {
            // The loop fell behind (database stall, long pause): the misfire policy decides.
            let just_before = minus(at, Duration::from_nanos(1));
            catch_up(&name, planned, just_before, now, fires);
            now
        } else {
            fires.push(new_fire(&name, planned, at, TriggerKind::Schedule, None));
            at
        };
        let next = planned.schedule.next_after(next_from);
        if let Some(next) = next {
            self.push(next, name, generation);
        }
    }

    /// Writes fires under the fence and hands the pending ones to the dispatcher.
    async fn write(&mut self, fires: Vec<NewFire>) -> anyhow::Result<()> {
        if fires.is_empty() {
            return Ok(());
        }
        let skipped = fires.iter().filter(|f| f.skip.is_some()).count();
        let Some(created) = self.ctx.store.insert_fires(&self.fence, &fires).await? else {
            anyhow::bail!("lease lost (term {} no longer current)", self.fence.term);
        };
        if skipped > 0 {
            info!(skipped, "recorded skipped fires");
        }
        // A `queue` job's runs go one at a time: the first new one of this batch may go to the
        // dispatcher if nothing of its job is unfinished; the others wait for the outbox sweep,
        // which orders them.
        let mut queued_jobs = HashSet::new();
        for created in created {
            let Some(planned) = self.jobs.get(created.job.as_str()) else {
                continue;
            };
            if planned.concurrency == ConcurrencyPolicy::Queue
                && (created.blocked || !queued_jobs.insert(created.job.clone()))
            {
                debug!(run_id = created.id, job = %created.job,
                       "run waits for the job's earlier run (concurrency queue)");
                continue;
            }
            let run = OutboxRun {
                id: created.id,
                group: planned.group.to_string(),
                job: created.job,
                scheduled_at: created.scheduled_at,
                attempt: 1,
                params: planned.params(),
                timeout: planned.timeout,
                retry: Some(planned.retry),
                concurrency: planned.concurrency,
            };
            if self.dispatch.send(run).await.is_err() {
                anyhow::bail!("dispatcher stopped");
            }
        }
        Ok(())
    }

    /// Many jobs changed at once (a large config sync): re-read them all (in pages) and re-plan
    /// those whose plan or pause state differs; drop the ones that are gone.
    async fn reload_all(&mut self) -> anyhow::Result<()> {
        let before = self.jobs.len();
        let mut present: HashSet<Arc<str>> = HashSet::with_capacity(before);
        let now = Utc::now();
        let mut fires = Vec::new();
        let mut replanned = 0usize;
        let mut after: Option<String> = None;
        loop {
            let records = self.ctx.store.jobs_page(after.as_deref(), JOB_PAGE).await?;
            let Some(last) = records.last() else { break };
            after = Some(last.spec.name.clone());
            for record in records {
                let name: Arc<str> = match self.jobs.get_key_value(record.spec.name.as_str()) {
                    Some((name, _)) => name.clone(),
                    None => Arc::from(record.spec.name.as_str()),
                };
                present.insert(name.clone());
                if record.paused {
                    // A paused job is not in the plan; it stays out.
                    if self.jobs.remove(&name).is_some() {
                        replanned += 1;
                    }
                    continue;
                }
                let cursor = record.cursor_at;
                let Some(planned) = self.plan(record.spec) else {
                    self.jobs.remove(&name);
                    continue;
                };
                if self
                    .jobs
                    .get(&name)
                    .is_some_and(|current| current.same_plan(&planned))
                {
                    continue;
                }
                self.jobs.remove(&name);
                replanned += 1;
                self.enter(name, planned, cursor, now, &mut fires);
            }
        }
        let kept = self.jobs.len();
        self.jobs.retain(|name, _| present.contains(name));
        let removed = kept - self.jobs.len();
        self.schedules = HashMap::new();
        info!(replanned, removed, "jobs re-planned after a bulk change");
        self.write(fires).await
    }

    /// A job changed in the database: re-read it and re-plan it.
    async fn reload(&mut self, name: &str) -> anyhow::Result<()> {
        self.jobs.remove(name);
        let Some(record) = self.ctx.store.job(name).await? else {
            info!(job = name, "job removed from the plan");
            return Ok(());
        };
        let mut fires = Vec::new();
        self.admit(record, Utc::now(), &mut fires);
        debug!(job = name, "job re-planned");
        self.write(fires).await
    }
}

fn catch_up(
    name: &str,
    planned: &Planned,
    cursor: DateTime<Utc>,
    now: DateTime<Utc>,
    fires: &mut Vec<NewFire>,
) {
    let mut cursor = cursor;
    loop {
        let outcome = misfire::catch_up(&planned.schedule, cursor, now, &planned.catch_up);
        if outcome.omitted > 0 {
            warn!(
                job = %name,
                omitted = outcome.omitted,
                range = ?outcome.omitted_range,
                "too many missed fires to record one by one; skipped without a run row"
            );
        }
        push_decisions(name, planned, outcome.decisions, fires);
        // Long outages are decided in pages; each page moves the cursor forward.
        if outcome.complete || outcome.cursor <= cursor {
            break;
        }
        cursor = outcome.cursor;
    }
}

fn push_decisions(
    name: &str,
    planned: &Planned,
    decisions: Vec<Decision>,
    fires: &mut Vec<NewFire>,
) {
    for decision in decisions {
        let fire = match decision {
            Decision::Fire { at, late: true } => {
                new_fire(name, planned, at, TriggerKind::Catchup, None)
            }
            Decision::Fire { at, late: false } => {
                new_fire(name, planned, at, TriggerKind::Schedule, None)
            }
            Decision::Skip { at, reason } => new_fire(
                name,
                planned,
                at,
                TriggerKind::Schedule,
                Some(reason.to_string()),
            ),
        };
        fires.push(fire);
    }
}

fn new_fire(
    name: &str,
    planned: &Planned,
    at: DateTime<Utc>,
    kind: TriggerKind,
    skip: Option<String>,
) -> NewFire {
    NewFire {
        job: name.to_owned(),
        group: planned.group.to_string(),
        scheduled_at: at,
        kind,
        params: planned.params(),
        skip,
        concurrency: planned.concurrency,
    }
}

/// Holds runs until `lead` before their instant and publishes them.
///
/// Its loop only holds runs, starts publishes and collects confirms: the two database writes
/// it depends on run in tasks of their own, so a slow database never stalls publishing. The
/// **marker** writes the marks of confirmed runs (`queued`, `published_at`) in batches; the
/// **sweeper** reads the outbox. A run stays in the dispatcher's `held` set from the moment it
/// is taken until a sweep that *started after its mark committed* has been handed over (the
/// marker counts its committed marks, each sweep notes the count before its query), so a sweep
/// that read the run still `pending` can never hand it over a second time.
struct Dispatcher {
    ctx: Arc<LeaderContext>,
    fence: Fence,
    leadership: watch::Receiver<Leadership>,
    stop: CancellationToken,
    /// The measured publish rate, which sizes each instant's lead.
    pace: Arc<Pace>,
}

/// A group of triggers released together, timed from its release to its last confirm to
/// measure the publish rate ([`Pace::observe`]).
struct Burst {
    size: usize,
    unsettled: usize,
    released: Instant,
}

/// Marks of published runs are flushed at least this often.
const MARK_INTERVAL: Duration = Duration::from_millis(20);
/// Pending runs read per outbox sweep.
const SWEEP_LIMIT: i64 = 10_000;

/// Runs whose mark committed as the marker's `seq`-th batch.
type Marked = (u64, Vec<i64>);
/// An outbox sweep: the marker's count of committed batches before its query, and what it read.
type Swept = (u64, Vec<OutboxRun>);

impl Dispatcher {
    async fn run(self, mut incoming: mpsc::Receiver<OutboxRun>) {
        let marks_done = Arc::new(AtomicU64::new(0));
        let (published_tx, published_rx) = mpsc::unbounded_channel::<Published>();
        let (marked_tx, mut marked_rx) = mpsc::unbounded_channel::<Marked>();
        let (swept_tx, mut swept_rx) = mpsc::channel::<Swept>(1);
        let marker = tokio::spawn(mark_loop(
            self.ctx.clone(),
            self.fence.clone(),
            self.stop.clone(),
            marks_done.clone(),
            published_rx,
            marked_tx,
        ));
        let sweeper = tokio::spawn(sweep_loop(
            self.ctx.clone(),
            self.stop.clone(),
            marks_done,
            swept_tx,
        ));
        // Held runs by scheduled instant; `instants` counts them per instant, and `release` is
        // the next moment some instant's lead begins (cached: recomputed after each release).
        let mut waiting: BinaryHeap<Reverse<(DateTime<Utc>, i64)>> = BinaryHeap::new();
        let mut instants = Instants::default();
        let mut release: Option<DateTime<Utc>> = None;
        let mut bursts: HashMap<u64, Burst> = HashMap::new();
        let mut burst_seq = 0u64;
        let mut runs: HashMap<i64, OutboxRun> = HashMap::new();
        let mut held: HashSet<i64> = HashSet::new();
        let mut marked: VecDeque<Marked> = VecDeque::new();
        let mut in_flight = FuturesUnordered::new();

        loop {
            let next_due = release
                .map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::ZERO))
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
                        Ok(()) => {
                            // The marker only ends once the leadership ends.
                            let _ = published_tx.send(Published { id, scheduled_at, confirmed_at: Utc::now() });
                        }
                        Err(e) => {
                            warn!(run_id = id, error = %format!("{e:#}"), "publish failed; the run stays in the outbox");
                            held.remove(&id);
                        }
                    }
                }
                () = tokio::time::sleep(next_due), if release.is_some() => {
                    let Some(term) = self.trusted_term() else { break };
                    let horizon = instants.horizon(Utc::now(), |n| self.lead(n), MAX_LEAD);
                    burst_seq += 1;
                    let mut size = 0;
                    while let Some(horizon) = horizon
                        && let Some(Reverse((at, _))) = waiting.peek()
                        && *at <= horizon
                    {
                        let Reverse((at, id)) = waiting.pop().expect("peeked");
                        instants.remove(at);
                        let Some(run) = runs.remove(&id) else { continue };
                        let ctx = self.ctx.clone();
                        let fence = self.fence.clone();
                        size += 1;
                        in_flight.push(async move {
                            let result = publish(&ctx, &fence, &run, term).await;
                            (run.id, run.scheduled_at, burst_seq, result)
                        });
                    }
                    if size > 0 {
                        bursts.insert(burst_seq, Burst { size, unsettled: size, released: Instant::now() });
                    }
                    release = instants.next_due(|n| self.lead(n), MAX_LEAD);
                }
                Some(run) = incoming.recv() => {
                    if held.insert(run.id) {
                        self.hold(run, &mut waiting, &mut instants, &mut release, &mut runs);
                    }
                }
                Some(batch) = marked_rx.recv() => marked.push_back(batch),
                Some((marks_before, pending)) = swept_rx.recv() => {
                    // Marks committed before the sweep's query: the sweep saw those runs
                    // `queued`, so from now on a run of theirs found `pending` is a new
                    // attempt (rescued, republished) and may be taken again.
                    while marked.front().is_some_and(|(seq, _)| *seq <= marks_before) {
                        for id in marked.pop_front().expect("checked").1 {
                            held.remove(&id);
                        }
                    }
                    for run in pending {
                        if held.insert(run.id) {
                            debug!(run_id = run.id, job = %run.job, "outbox run picked up");
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
                let _ = published_tx.send(Published {
                    id,
                    scheduled_at,
                    confirmed_at: Utc::now(),
                });
            }
        }
        drop(published_tx);
        for (task, what) in [(marker, "marker"), (sweeper, "outbox sweep")] {
            if let Err(e) = task.await {
                error!(term = self.fence.term, task = what, error = %e, "dispatcher task ended abnormally");
            }
        }
    }

    /// The lead of an instant with `n` triggers ([`Pace::lead`]).
    fn lead(&self, n: usize) -> Duration {
        self.pace.lead(self.ctx.timings.lead, n)
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
        if term != Some(self.fence.term) {
            warn!(
                term = self.fence.term,
                "no longer trusted as leader; dispatcher stops"
            );
            self.stop.cancel();
            return None;
        }
        term
    }
}

/// The dispatcher's marker: writes the marks of confirmed runs in batches (at most every
/// [`MARK_INTERVAL`]), counts each committed batch in `marks_done` and reports it to the
/// dispatcher. Ends when the dispatcher drops its sender (after flushing what it got) or the
/// fence is lost.
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
    ctx: Arc<LeaderContext>,
    fence: Fence,
    stop: CancellationToken,
    marks_done: Arc<AtomicU64>,
    mut published: mpsc::UnboundedReceiver<Published>,
    marked: mpsc::UnboundedSender<Marked>,
) {
    // Confirmed runs by the instant they are due to be marked: (due, run id, confirmed at).
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
        if !mark(&ctx, &fence, &stop, &batch).await {
            return;
        }
        let seq = marks_done.load(Ordering::SeqCst) + 1;
        marks_done.store(seq, Ordering::SeqCst);
        let _ = marked.send((seq, batch.into_iter().map(|r| r.id).collect()));
    }
}

/// A confirmed run waiting for its mark: when it is due, the run, when its confirm arrived.
type MarkDue = (DateTime<Utc>, i64, DateTime<Utc>);

/// A run whose trigger the broker confirmed, on its way from the dispatcher to the marker.
struct Published {
    id: i64,
    scheduled_at: DateTime<Utc>,
    confirmed_at: DateTime<Utc>,
}

/// Marks published runs `queued`, retrying while the database fails. Returns false when the
/// fence no longer holds (the leadership stops) or on a failure while stopping.
async fn mark(
    ctx: &LeaderContext,
    fence: &Fence,
    stop: &CancellationToken,
    runs: &[Confirmed],
) -> bool {
    let mut delay = Duration::from_millis(50);
    loop {
        match ctx.store.mark_published(fence, runs).await {
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

/// The dispatcher's outbox sweep: every `sweep_interval`, and at once on `NOTIFY chime_outbox`
/// (notifications that arrive during a sweep are served by one more sweep). Hands over the
/// pending runs due by the horizon with the marker's count of committed batches taken before
/// the query.
async fn sweep_loop(
    ctx: Arc<LeaderContext>,
    stop: CancellationToken,
    marks_done: Arc<AtomicU64>,
    swept: mpsc::Sender<Swept>,
) {
    let mut outbox_wake = listen(&ctx.store, OUTBOX_CHANNEL).await;
    let mut sweep = tokio::time::interval(ctx.timings.sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = sweep.tick() => {}
            Some(_) = outbox_wake.recv() => {
                while outbox_wake.try_recv().is_ok() {}
            }
        }
        let marks_before = marks_done.load(Ordering::SeqCst);
        // As far ahead as the planner writes the largest burst: a new leader takes over runs
        // its predecessor wrote early for their lead.
        let horizon = plus(Utc::now(), Pace::max_lookahead(ctx.timings.lookahead));
        let pending = tokio::select! {
            () = stop.cancelled() => return,
            pending = ctx.store.outbox(horizon, SWEEP_LIMIT) => pending,
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

/// Publishes one run. Attempt 1 of a `replace` job first cancels the job's earlier unfinished
/// runs (fenced), telling the workers of running ones through a control message.
async fn publish(
    ctx: &LeaderContext,
    fence: &Fence,
    run: &OutboxRun,
    term: i64,
) -> anyhow::Result<()> {
    if run.concurrency == ConcurrencyPolicy::Replace && run.attempt == 1 {
        replace(ctx, fence, run).await?;
    }
    ctx.publisher.publish(run, term).await?;
    Ok(())
}

async fn replace(ctx: &LeaderContext, fence: &Fence, run: &OutboxRun) -> anyhow::Result<()> {
    let by = format!("replace policy (run {})", run.id);
    let Some(cancelled) = ctx
        .store
        .cancel_superseded(fence, &run.job, run.id, &by)
        .await?
    else {
        anyhow::bail!("lease lost (term {} no longer current)", fence.term);
    };
    for (id, before) in cancelled {
        if before != "running" {
            info!(run_id = id, job = %run.job, replaced_by = run.id, state = %before,
                  "run cancelled before it started (concurrency replace)");
            continue;
        }
        match ctx
            .publisher
            .publish_control(&ControlMessage::CancelRun { run_id: id })
            .await
        {
            Ok(delivery) => info!(run_id = id, job = %run.job, replaced_by = run.id, ?delivery,
                                  "asked the worker to cancel the running run (concurrency replace)"),
            // The cancel request is recorded: if the worker is lost the rescuer finishes it as
            // cancelled; otherwise the old run may overlap the new one.
            Err(e) => warn!(run_id = id, job = %run.job, replaced_by = run.id, error = %e,
                            "could not send the cancel control message (concurrency replace)"),
        }
    }
    Ok(())
}

/// Notifications on `channel` as a stream of payloads; reconnects on its own.
async fn listen(store: &Store, channel: &'static str) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(1024);
    let pool = store.pool().clone();
    tokio::spawn(async move {
        loop {
            match sqlx::postgres::PgListener::connect_with(&pool).await {
                Ok(mut listener) => {
                    if listener.listen(channel).await.is_ok() {
                        while let Ok(n) = listener.recv().await {
                            if tx.send(n.payload().to_owned()).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                Err(e) => warn!(channel, error = %e, "cannot LISTEN; relying on polling"),
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    rx
}
