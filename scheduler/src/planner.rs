//! The leader's planning, and its duties while it leads ([`lead`]).
//!
//! The **planner** keeps every active job in a min-heap keyed by its next fire, so a tick
//! touches only the jobs that are due, never the registered ones. A little before each instant
//! (`lookahead`, 500 ms, more for an instant with many fires: [`crate::pace`]) it writes the due
//! fires as runs in one fenced batch insert (unique on (job, scheduled instant), so a fire can
//! never become two runs), then hands them to the [`crate::dispatcher`]. On taking office and
//! whenever a job is found behind schedule, it applies the job's misfire policy from the
//! persisted cursor ([`crate::misfire`]).
//!
//! **Concurrency policies** are decided against the database when a fire is written
//! ([`Store::insert_fires`]): `forbid` records the fire `skipped` while a run of the job is
//! unfinished, `queue` keeps the new run out of the dispatcher and the outbox until the earlier
//! runs of its job have finished (a database trigger wakes the outbox sweep when one does), and
//! `replace` cancels the job's unfinished runs just before attempt 1 of the new run is published
//! ([`crate::dispatcher::Triggers`]).
//!
//! **Invariants** (enforced here):
//! * A run row exists before its trigger is published: a run reaches the dispatcher only after
//!   the fenced insert that wrote it committed; a lost fence stops the leadership.
//! * Tick cost grows with the number of *due* jobs, not registered ones.
//! * Memory grows by a compact record per planned job (what firing needs, schedule and group
//!   shared), never by whole definitions; jobs are read from the database in pages of 2,000.
//!
//! [`lead`] runs the planner with the [`crate::dispatcher`] and its [`crate::outbox`], the
//! [`crate::rescuer`] and the [`crate::alerts`] duty, for one term.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use chime_protocol::wire::RetryPolicy;

use crate::broker::Broker;
use crate::config::{AlertSettings, RescuerSettings};
use crate::dispatcher::{Dispatcher, Triggers, WallClock};
use crate::job::{ConcurrencyPolicy, JobSpec};
use crate::leader::Leadership;
use crate::misfire::{self, CatchUpPolicy, Decision, SkipReason};
use crate::outbox::Outbox;
pub use crate::pace::MAX_LEAD;
use crate::pace::{Instants, Pace, minus};
use crate::publish::Publisher;
use crate::schedule::{CalendarClock, Schedule, Timing};
use crate::store::{
    ALL_JOBS, Fence, JOBS_CHANNEL, JobRecord, NewFire, OutboxRun, Store, TriggerKind,
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
    /// Triggers.
    pub publisher: Arc<Publisher>,
    /// Control messages (the `replace` policy's cancels), on the connection the operations of
    /// this instance share.
    pub broker: Broker,
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
    let outbox = Outbox::start(
        ctx.store.clone(),
        fence.clone(),
        ctx.timings.sweep_interval,
        ctx.timings.lookahead,
        stop.clone(),
        ctx.broker.clone(),
    );
    let triggers = Triggers {
        store: ctx.store.clone(),
        fence: fence.clone(),
        publisher: ctx.publisher.clone(),
        broker: ctx.broker.clone(),
    };
    let dispatcher = Dispatcher::new(
        Arc::new(triggers),
        WallClock,
        term,
        ctx.timings.lead,
        leadership,
        stop.clone(),
        pace.clone(),
    );
    let dispatch = tokio::spawn(dispatcher.run(rx, outbox));
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
        plan_writes: 0,
        schedules: HashMap::new(),
        calendars: HashMap::new(),
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

/// What the planner keeps of a planned job: only what planning and firing need (a record of
/// 160 bytes, `tests::a_planned_job_stays_compact`, against ~560 for a whole [`JobSpec`]), with
/// the schedule and the group shared between jobs, and a job's window and jitter boxed, so a
/// job without them pays 8 bytes for them. The name is the key of [`Planner::jobs`].
struct Planned {
    /// The schedule (shared) with the job's window and jitter.
    timing: Timing,
    /// Fires the schedule may still make (`max_runs` less those made); `None` without a limit.
    runs_left: Option<u64>,
    group: Arc<str>,
    /// `None` for `null`, the parameters of most jobs.
    params: Option<Box<serde_json::Value>>,
    catch_up: CatchUpPolicy,
    concurrency: ConcurrencyPolicy,
    timeout: Option<Duration>,
    retry: RetryPolicy,
    /// A fire makes tasks (broadcast, sharded, map/reduce): the dispatcher expands it.
    fan_out: bool,
    /// A fire is a workflow run: the dispatcher starts it.
    workflow: bool,
    generation: u64,
}

impl Planned {
    /// Whether `other` plans and fires the same way (the generation aside).
    fn same_plan(&self, other: &Planned) -> bool {
        self.timing == other.timing
            && self.runs_left == other.runs_left
            && self.group == other.group
            && self.params == other.params
            && self.catch_up == other.catch_up
            && self.concurrency == other.concurrency
            && self.timeout == other.timeout
            && self.retry == other.retry
            && self.fan_out == other.fan_out
            && self.workflow == other.workflow
    }

    /// Counts one fire against `max_runs`; false when none is left to make.
    fn take_run(&mut self) -> bool {
        match &mut self.runs_left {
            None => true,
            Some(0) => false,
            Some(left) => {
                *left -= 1;
                true
            }
        }
    }

    /// Whether the schedule has made its `max_runs` fires.
    fn used_up(&self) -> bool {
        self.runs_left == Some(0)
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
    /// The planner's count of its writes ([`Store::insert_fires`]): a
    /// database that lost acknowledged writes is noticed at the next write.
    plan_writes: i64,
    /// Parsed schedules by definition, while a batch of jobs is admitted.
    schedules: HashMap<String, Arc<Schedule>>,
    /// Compiled calendars by definition and zone, while a batch of jobs is admitted (shared as
    /// the schedules are: a holiday list is named by many jobs).
    calendars: HashMap<String, Arc<CalendarClock>>,
    /// Group names, shared by the jobs of each group (a handful of groups for many jobs).
    groups: HashSet<Arc<str>>,
}

impl Planner {
    async fn run(&mut self, stop: &CancellationToken) -> anyhow::Result<()> {
        let mut changes = self.ctx.store.listen(JOBS_CHANNEL).await;
        // Read before the jobs and their cursors: writes lost before this are not this
        // planner's to notice; the cursors it reads next are the database's.
        self.plan_writes = self.ctx.store.plan_writes().await?;
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
        self.calendars = HashMap::new();
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
        let Some(planned) = self.plan(record.spec, record.scheduled_runs) else {
            return;
        };
        self.enter(name, planned, record.cursor_at, now, fires);
    }

    /// The compact record of a job (with a new generation), or `None` for a stored job whose
    /// schedule does not parse (logged). `scheduled_runs`: the fires its schedule has made.
    fn plan(&mut self, spec: JobSpec, scheduled_runs: i64) -> Option<Planned> {
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
            timing: spec.timing_with(schedule, self.calendar_of(&spec)),
            runs_left: spec.max_runs.map(|max| {
                u64::from(max).saturating_sub(u64::try_from(scheduled_runs).unwrap_or(0))
            }),
            group,
            params: (!spec.params.is_null()).then(|| Box::new(spec.params.clone())),
            catch_up: CatchUpPolicy::from_spec(&spec),
            concurrency: spec.concurrency,
            timeout: spec.timeout,
            retry: spec.retry.to_wire(),
            fan_out: !spec.kind.is_single() && spec.kind.name() != crate::job::KindName::Workflow,
            workflow: spec.kind.name() == crate::job::KindName::Workflow,
            generation: self.generation,
        };
        Some(planned)
    }

    /// Puts a planned job in the plan: catches up from `cursor` and pushes its next fire.
    fn enter(
        &mut self,
        name: Arc<str>,
        mut planned: Planned,
        cursor: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        fires: &mut Vec<NewFire>,
    ) {
        // A job never planned before starts now: nothing to catch up.
        let cursor = cursor.unwrap_or(now);
        let next_from = if cursor < now {
            catch_up(&name, &mut planned, cursor, now, fires);
            now
        } else {
            cursor
        };
        if planned.used_up() {
            debug!(job = %name, "schedule ended: max_runs fires made");
        } else if let Some(next) = planned.timing.next_after(next_from) {
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

    /// The job's compiled calendar, shared like [`Planner::schedule_of`]'s schedules.
    fn calendar_of(&mut self, spec: &JobSpec) -> Option<Arc<CalendarClock>> {
        let calendar = spec.calendar.as_ref()?;
        let key = format!("{calendar:?}|{}", spec.timezone);
        if let Some(clock) = self.calendars.get(&key) {
            return Some(clock.clone());
        }
        let clock = Arc::new(spec.calendar_clock()?);
        self.calendars.insert(key, clock.clone());
        Some(clock)
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
        let Some(planned) = self.jobs.get_mut(&name) else {
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
            if planned.take_run() {
                let skip = planned
                    .timing
                    .excluded(at)
                    .then(|| planned.timing.exclusion_reason(at));
                fires.push(new_fire(&name, planned, at, TriggerKind::Schedule, skip));
            }
            at
        };
        if planned.used_up() {
            info!(job = %name, "schedule ended: its max_runs fires are made");
            return;
        }
        let next = planned.timing.next_after(next_from);
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
        let Some(created) = self
            .ctx
            .store
            .insert_fires(&self.fence, Some(&mut self.plan_writes), &fires)
            .await?
        else {
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
                task: None,
                fan_out: planned.fan_out,
                workflow: planned.workflow,
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
                let Some(planned) = self.plan(record.spec, record.scheduled_runs) else {
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
        self.calendars = HashMap::new();
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
    planned: &mut Planned,
    cursor: DateTime<Utc>,
    now: DateTime<Utc>,
    fires: &mut Vec<NewFire>,
) {
    let mut cursor = cursor;
    loop {
        let outcome = misfire::catch_up(&planned.timing, cursor, now, &planned.catch_up);
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
        if outcome.complete || outcome.cursor <= cursor || planned.used_up() {
            break;
        }
        cursor = outcome.cursor;
    }
}

/// Turns decisions into fires, each counted against `max_runs`; those past it are dropped.
fn push_decisions(
    name: &str,
    planned: &mut Planned,
    decisions: Vec<Decision>,
    fires: &mut Vec<NewFire>,
) {
    for decision in decisions {
        if !planned.take_run() {
            break;
        }
        let fire = match decision {
            Decision::Fire { at, late: true } => {
                new_fire(name, planned, at, TriggerKind::Catchup, None)
            }
            Decision::Fire { at, late: false } => {
                new_fire(name, planned, at, TriggerKind::Schedule, None)
            }
            Decision::Skip {
                at,
                reason: SkipReason::ExcludedByCalendar { .. },
            } => {
                let reason = planned.timing.exclusion_reason(at);
                new_fire(name, planned, at, TriggerKind::Schedule, Some(reason))
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

#[cfg(test)]
mod tests {
    /// The plan's memory grows by one of these per job (docs/benchmarks.md, "Scale memory"):
    /// a window, jitter or `max_runs` must not make every job's record larger.
    #[test]
    fn a_planned_job_stays_compact() {
        let size = std::mem::size_of::<super::Planned>();
        assert!(size <= 160, "Planned is {size} bytes");
    }
}
