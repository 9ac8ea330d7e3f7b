//! The only module of the scheduler that speaks SQL: leader lease, jobs, runs and their records.
//!
//! Functions return domain types, never rows. Every write the leader makes is *fenced*: it
//! lands only while the caller's `(holder, term)` still holds an unexpired lease, checked by the
//! database in the same statement (`chime_fence`, which takes `FOR KEY SHARE` on the lease row, so a takeover, which
//! changes the key `(name, term)`, cannot commit in between, while a renewal, which changes only
//! `expires_at`, never waits for the leader's own writes). Times come from the database clock (`now()`), never from this process.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use chime_protocol::redact::redact_url;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row as _};

use crate::job::{ConcurrencyPolicy, JobSpec};

/// The fence of a leader write, as the first CTE of its statement (`$1` holder, `$2` term):
/// `lease` has the lease row while `(holder, term)` holds an unexpired lease, locked `FOR KEY
/// SHARE` by `chime_fence` (migration `protocol_calls`) until the transaction ends; the
/// statement writes only `WHERE EXISTS (SELECT FROM lease)`.
macro_rules! lease_cte {
    () => {
        "lease AS (SELECT term FROM chime_fence($1, $2))"
    };
}

/// [`lease_cte!`] for statements built with `format!`.
const LEASE_CTE: &str = lease_cte!();

mod advances;
mod backfills;
mod dead_letters;
mod failures;
mod grants;
mod ops;
mod overdue;
mod report;

#[cfg(test)]
mod tests_children;
#[cfg(test)]
mod tests_job_fields;
#[cfg(test)]
mod tests_kinds;
#[cfg(test)]
mod tests_lease;
#[cfg(test)]
mod tests_pause;
#[cfg(test)]
mod tests_privilege;
#[cfg(test)]
mod tests_protocol_calls;
#[cfg(test)]
pub(crate) mod tests_tasks;
#[cfg(test)]
pub(crate) mod tests_workflows;
mod timeline;
mod workflows;

pub use advances::{ADVANCE_BATCH, ChildRun};
pub use backfills::{
    BACKFILLS_CHANNEL, BackfillCancel, BackfillQuery, BackfillRecord, BackfillWork, FireRun,
    NewBackfill, Stepped,
};
pub use dead_letters::{DeadLetterContent, DeadLetterRecord, NewDeadLetter};
pub use failures::{
    AlertEvent, AlertKind, AlertRecord, CancelOutcome, ClaimedAlert, REPLAYABLE_STATES,
    ReplayOutcome, Rescued, RunBrief,
};
pub use ops::{
    AuditQuery, AuditRecord, JobVersion, NewAuditEntry, ObservedRun, RunQuery, TokenRecord,
    WorkerRecord,
};
pub use overdue::Overdue;
pub use report::ReportRow;
pub use workflows::{
    EdgeView, NodeRunView, NodeShape, NodeView, Rerun, WORKFLOW_BATCH, WorkflowRunView,
    WorkflowStep,
};

/// Migrations embedded from `migrations/`; `run` takes an advisory lock, so several instances
/// starting at once migrate safely.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The mark of published runs (see [`Store::mark_published`]), fenced. Only runs still
/// `pending` are marked: a run a worker claimed first already has its `published_at` from the
/// claim, and leaving its row alone spares PostgreSQL a row version and an entry in each of the
/// table's indexes per run (most runs at a high rate: the delivery usually beats the confirm).
/// The runs are locked in id order, as the workers' batched claims lock them: no deadlocks. Each is found by its primary
/// key whatever the statistics say (a new database has none until autovacuum analyses it): a
/// `LATERAL … FOR UPDATE` subquery is never flattened into a join, so it is one index lookup per
/// run, and `= ANY (ARRAY[…])` in the update is a condition no hash or merge join can use.
const MARK_PUBLISHED_SQL: &str = concat!(
    "WITH ",
    lease_cte!(),
    ", locked AS MATERIALIZED (
    SELECT k.id, k.confirmed_at
      FROM (SELECT * FROM unnest($3::bigint[], $4::timestamptz[]) AS u(id, confirmed_at)
             ORDER BY id) k
     CROSS JOIN LATERAL (
         SELECT FROM chime_runs r WHERE r.id = k.id AND r.state = 'pending' FOR UPDATE
     ) r
     WHERE EXISTS (SELECT FROM lease)
), upd AS (
    UPDATE chime_runs r SET state = 'queued', published_at = coalesce(r.published_at, l.confirmed_at)
    FROM locked l WHERE r.id = ANY (ARRAY[l.id])
)
SELECT count(*) AS leased FROM lease"
);

/// Notification channel: a job was added, changed, paused, resumed or removed (payload: job name).
pub const JOBS_CHANNEL: &str = "chime_jobs";
/// Payload on [`JOBS_CHANNEL`]: many jobs changed at once; re-read them all. (`*` is not a
/// valid job name.)
pub const ALL_JOBS: &str = "*";
/// A config sync that touches more jobs than this sends one [`ALL_JOBS`] notification instead
/// of one per job.
pub const NOTIFY_EACH_MAX: usize = 64;
/// Rows per batched insert of the config sync. Each row is a few hundred bytes, and the
/// connection keeps its largest message buffer: 1,000 rows keep that under a megabyte.
const SYNC_BATCH: usize = 1_000;
/// Notification channel: a run was added to the outbox outside the planner (manual trigger, replay).
pub const OUTBOX_CHANNEL: &str = "chime_outbox";
/// Notification channel: the leader resigned; followers try to take over at once.
pub const LEADER_CHANNEL: &str = "chime_leader";

/// A manual trigger, for [`Store::trigger`] (`chime_trigger`).
#[derive(Debug, Clone)]
pub struct TriggerRequest<'a> {
    /// The job.
    pub job: &'a str,
    /// Params replacing the job's own (a JSON object, at most 64 KiB).
    pub params: Option<&'a serde_json::Value>,
    /// The run's instant (now when `None`; within now − 1 day ..= now + 366 days).
    pub at: Option<DateTime<Utc>>,
    /// Asking again with the same key returns the job's run of that key (1..=200 bytes).
    pub idempotency_key: Option<&'a str>,
    /// Who asks (`chime_runs.requested_by`, the audit row's actor).
    pub requested_by: &'a str,
    /// The caller's role, for the audit row.
    pub audit_role: &'a str,
    /// The audit row's details, secrets hidden (a JSON object).
    pub audit_detail: &'a serde_json::Value,
}

/// The run a trigger made or found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriggeredRun {
    /// The run.
    pub run_id: i64,
    /// False: the idempotency key named a run made before.
    pub created: bool,
}

/// What `chime_trigger` refused (SQLSTATE 22023): the field, its value and what is wrong with
/// it and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerRefusal {
    /// `job`, `params`, `run_at`, `idempotency_key` or `actor`.
    pub field: String,
    /// The value as the database saw it (`field = value`), if it said.
    pub value: Option<String>,
    /// What is wrong and the fix.
    pub message: String,
}

impl TriggerRefusal {
    /// The refusal `error` carries, if it is one of `chime_trigger`'s (22023 with a column).
    fn from_error(error: &sqlx::Error) -> Option<TriggerRefusal> {
        let db = error.as_database_error()?;
        if db.code().as_deref() != Some("22023") {
            return None;
        }
        let pg = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
        let field = pg.column()?.to_owned();
        let value = pg
            .detail()
            .and_then(|d| d.split_once(" = "))
            .map(|(_, v)| v.to_owned());
        Some(TriggerRefusal {
            field,
            value,
            message: pg.message().to_owned(),
        })
    }
}

/// Handle on the Chime database.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

/// The leader's identity and fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Instance id of the leader.
    pub holder: String,
    /// Term number of its leadership.
    pub term: i64,
}

/// Who leads, as the database sees it.
#[derive(Debug, Clone, Serialize)]
pub struct LeaderInfo {
    /// Instance id of the holder, if any.
    pub holder: Option<String>,
    /// Current term.
    pub term: i64,
    /// When the current term began.
    pub elected_at: Option<DateTime<Utc>>,
    /// When the lease runs out unless renewed.
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether the lease is unexpired now.
    pub active: bool,
}

/// How a run came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    /// An on-time scheduled fire.
    Schedule,
    /// A missed fire run late under the misfire policy.
    Catchup,
    /// Triggered by an operator.
    Manual,
}

impl TriggerKind {
    fn as_str(self) -> &'static str {
        match self {
            TriggerKind::Schedule => "schedule",
            TriggerKind::Catchup => "catchup",
            TriggerKind::Manual => "manual",
        }
    }
}

/// A fire the planner decided on: to be published, or recorded as skipped with its reason.
#[derive(Debug, Clone)]
pub struct NewFire {
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// Scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// Schedule or catch-up.
    pub kind: TriggerKind,
    /// Parameters for the handler.
    pub params: serde_json::Value,
    /// `Some(reason)` records the fire as skipped instead of publishing it.
    pub skip: Option<String>,
    /// The job's overlap policy: `forbid` turns the fire into a skip while an earlier run of the
    /// job is unfinished, `queue` holds the new run back in the outbox until it finishes.
    pub concurrency: ConcurrencyPolicy,
}

/// A run the planner created as `pending`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedRun {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// Scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// Held back behind an unfinished earlier run of a `queue`-policy job: the outbox sweep
    /// publishes it once that run has finished.
    pub blocked: bool,
}

/// A run whose trigger the broker confirmed, for [`Store::mark_published`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Confirmed {
    /// The run.
    pub id: i64,
    /// When the confirm arrived: the run's `published_at`.
    pub confirmed_at: DateTime<Utc>,
}

/// A run waiting in the outbox (persisted, not yet confirmed by the broker).
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRun {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// Scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// Attempt number to publish.
    pub attempt: u32,
    /// Handler parameters.
    pub params: serde_json::Value,
    /// Handler timeout, from the job's spec.
    pub timeout: Option<Duration>,
    /// Retry policy, from the job's spec.
    pub retry: Option<chime_protocol::wire::RetryPolicy>,
    /// The job's overlap policy: with `replace`, publishing attempt 1 first cancels the job's
    /// earlier unfinished runs (a task's is `allow`: its parent's policy was applied).
    pub concurrency: ConcurrencyPolicy,
    /// The task this run is, for a task of a broadcast, sharded or map/reduce run.
    pub task: Option<chime_protocol::wire::Task>,
    /// A parent run of a broadcast, sharded or map/reduce job: publishing it means expanding it
    /// into its tasks and publishing those ([`Store::expand_run`]); it has no trigger itself.
    pub fan_out: bool,
    /// A workflow run: publishing it means starting it ([`Store::advance_workflows`]), which
    /// makes its first node runs; it has no trigger itself.
    pub workflow: bool,
}

/// The database holds fewer planner writes than the planner made: it lost writes it had
/// acknowledged (a failover to an asynchronous standby). The planner starts again from the
/// database's cursors.
#[derive(Debug, thiserror::Error)]
#[error(
    "the database holds {found} planner writes where this planner made {expected}: it lost \
     writes it had acknowledged (a failover to a standby without synchronous replication); \
     planning again from the cursors it has, under the job's misfire policy"
)]
pub struct PlanWritesLost {
    /// The count this planner last wrote.
    pub expected: i64,
    /// The count the database has.
    pub found: i64,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// The definition.
    pub spec: JobSpec,
    /// `config` or `api`.
    pub source: String,
    /// Paused jobs are not planned (manual triggers still work).
    pub paused: bool,
    /// Who paused it: `file` (its job file says `paused = true`) or the operator's actor
    /// (`cli:alice`, `token:ops`); `None` when it is not paused.
    pub paused_by: Option<String>,
    /// Last scheduled instant turned into a run or a skip; for a job none of whose fires has
    /// been, when its definition was last written: its schedule counts from there, so a fire
    /// due before a new job's first write (a leader lost in between) is decided by the misfire
    /// policy, not lost.
    pub cursor_at: Option<DateTime<Utc>>,
    /// Fires the job's schedule has made, skipped ones included (what `max_runs` counts).
    pub scheduled_runs: i64,
    /// The number of its definition's current version (`chime_job_versions`).
    pub version: i32,
}

/// What a config sync changed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct JobDiff {
    /// Jobs that did not exist.
    pub added: Vec<String>,
    /// Jobs whose definition changed.
    pub changed: Vec<String>,
    /// Config-declared jobs no longer in any file.
    pub removed: Vec<String>,
}

impl JobDiff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// One run, as listed and shown.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunRecord {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// Scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// `schedule`, `catchup`, `manual`, `backfill` or `child`.
    pub trigger: String,
    /// State (see docs/runs.md).
    pub state: String,
    /// Why it was skipped or dead-lettered.
    pub reason: Option<String>,
    /// Attempts started so far.
    pub attempt: i32,
    /// Worker of the latest attempt.
    pub worker_id: Option<String>,
    /// Last error.
    pub error: Option<String>,
    /// Handler parameters.
    pub params: serde_json::Value,
    /// Leader term that created it (none for manual runs).
    pub term: Option<i64>,
    /// The version of its job's definition it was made under (`chime jobs history`); `None`
    /// for tasks (their parent has it) and runs made before versions were kept.
    pub job_version: Option<i32>,
    /// The backfill that made it (`chime jobs backfill`; its trigger is `backfill`).
    pub backfill_id: Option<i64>,
    /// The run whose end made it, for a child job's run (its trigger is `child`).
    pub upstream_run_id: Option<i64>,
    /// Who triggered it (manual runs).
    pub requested_by: Option<String>,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
    /// When the broker confirmed the trigger.
    pub published_at: Option<DateTime<Utc>>,
    /// When the latest attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// When a `retrying` run's next attempt is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When an operator (or the `replace` policy) asked to cancel it.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// Who asked to cancel it.
    pub cancel_requested_by: Option<String>,
    /// Who replayed it from the parking lot.
    pub replayed_by: Option<String>,
    /// When it was replayed.
    pub replayed_at: Option<DateTime<Utc>>,
    /// A task's run (its parent: the fire of a broadcast, sharded or map/reduce job); `None`
    /// for a top-level run.
    pub parent_id: Option<i64>,
    /// A task's key, unique within its parent (`worker/<id>`, `shard/<n>`, `root`, `reduce`,
    /// `<caller>/<step>/<call>/<n>`).
    pub task_key: Option<String>,
    /// A task's kind: `broadcast`, `shard`, `root`, `map` or `reduce`.
    pub task_kind: Option<String>,
    /// A shard task's index (0-based).
    pub shard_index: Option<i32>,
    /// A shard task's count of shards.
    pub shard_total: Option<i32>,
    /// A shard task's own parameter (the job's `shard_params[index]`).
    pub shard_param: Option<serde_json::Value>,
    /// A broadcast task's worker.
    pub target_worker: Option<String>,
    /// A mapped task's step name.
    pub map_step: Option<String>,
    /// A map/reduce task's nesting depth (the root task is 0).
    pub map_depth: Option<i32>,
    /// What the handler returned (JSON); in lists cut to [`MAX_LISTED_OUTPUT_BYTES`] of JSON
    /// text (then a string, and `output_truncated`).
    pub output: Option<serde_json::Value>,
    /// Whether `output` was cut (it is then a string of the JSON text's start).
    pub output_truncated: bool,
    /// A parent's tasks created so far (0 for a run without tasks).
    pub tasks_total: i32,
    /// A parent's tasks in a final state.
    pub tasks_ended: i32,
    /// A parent's tasks that ended other than `succeeded`.
    pub tasks_failed: i32,
    /// A parent's progress in words ([`task_progress`]): `12/12 ok`, `9/12 ok, 1 failed, 2
    /// left`; `None` for a run without tasks.
    pub progress: Option<String>,
}

/// Longest JSON text of a run's `output` a list of runs or tasks carries (the run's own view
/// has it whole, at most the protocol's 64 KiB): a page of 1,000 tasks stays a few megabytes.
pub const MAX_LISTED_OUTPUT_BYTES: usize = 1024;

/// A parent run's progress from its task counters, the one wording the CLI, the API and the
/// dashboard show: `12/12 ok` (all succeeded), `9/12 ok, 1 failed, 2 left` (ended other than
/// `succeeded`, and not ended yet: pending, queued, running or retrying). `None` without tasks.
pub fn task_progress(total: i32, ended: i32, failed: i32) -> Option<String> {
    if total <= 0 {
        return None;
    }
    let ok = ended - failed;
    let mut text = format!("{ok}/{total} ok");
    if failed > 0 {
        text.push_str(&format!(", {failed} failed"));
    }
    let left = total - ended;
    if left > 0 {
        text.push_str(&format!(", {left} left"));
    }
    Some(text)
}

/// One execution attempt.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AttemptRecord {
    /// Attempt number.
    pub attempt: i32,
    /// Worker that ran it.
    pub worker_id: String,
    /// Outcome.
    pub state: String,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// End.
    pub finished_at: Option<DateTime<Utc>>,
    /// Duration in milliseconds.
    pub duration_ms: Option<i64>,
    /// Error text.
    pub error: Option<String>,
}

/// One stored log line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LogLine {
    /// Attempt that wrote it.
    pub attempt: i32,
    /// When.
    pub at: DateTime<Utc>,
    /// Level.
    pub level: String,
    /// Text.
    pub message: String,
}

/// A run with its attempts and log lines; a task with its parent; a parent with its tasks
/// counted by state.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunDetail {
    /// The run.
    #[serde(flatten)]
    pub run: RunRecord,
    /// Its attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// Its log lines, oldest first.
    pub logs: Vec<LogLine>,
    /// A task's parent run (its `output` cut as in lists); `None` for a top-level run.
    pub parent: Option<Box<RunRecord>>,
    /// A parent's tasks by state (states without tasks left out); empty without tasks.
    pub tasks_by_state: std::collections::BTreeMap<String, i64>,
    /// The child runs its end made (its job's `on_success`, `on_failure`, `on_complete`),
    /// oldest first, at most [`MAX_SHOWN_CHILDREN`]; empty for others.
    pub children: Vec<ChildBrief>,
}

/// Child runs a run's detail lists at most (a job names at most
/// `limits::MAX_CHILD_JOBS` at a time; a definition that changed may have named others).
pub const MAX_SHOWN_CHILDREN: i64 = 100;

/// A child run as its upstream run's detail lists it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChildBrief {
    /// The child run.
    pub id: i64,
    /// Its job.
    pub job: String,
    /// Its state now.
    pub state: String,
}

/// Filter for [`Store::list_runs`].
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only this job.
    pub job: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// At most this many, newest first.
    pub limit: i64,
    /// Tasks too; by default only top-level runs (the fires) are listed.
    pub include_tasks: bool,
}

/// A run's job, state and task counters ([`Store::task_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCounts {
    /// Job name.
    pub job: String,
    /// The run's state.
    pub state: String,
    /// Tasks created (0: a run without tasks).
    pub total: i32,
    /// Tasks in a final state.
    pub ended: i32,
    /// Tasks that ended other than `succeeded`.
    pub failed: i32,
}

/// A keyset page of a parent's tasks, in creation order (id).
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    /// The parent run.
    pub parent: i64,
    /// Only tasks with an id above this (the previous page's `next_after`).
    pub after: Option<i64>,
    /// Only tasks in this state.
    pub state: Option<String>,
    /// Page size.
    pub limit: i64,
}

const RUN_COLUMNS: &str = "id, job_name, group_name, scheduled_at, trigger, state, reason, attempt, \
     worker_id, error, params, term, job_version, backfill_id, upstream_run_id, requested_by, created_at, \
     published_at, started_at, \
     finished_at, next_attempt_at, cancel_requested_at, cancel_requested_by, replayed_by, replayed_at, \
     parent_id, task_key, task_kind, shard_index, shard_total, shard_param, target_worker, \
     map_step, map_depth, output, tasks_total, tasks_ended, tasks_failed";

/// [`RUN_COLUMNS`] with the output cut to a little more than [`MAX_LISTED_OUTPUT_BYTES`] by
/// the database (so a page of tasks does not read every task's 64 KiB), for lists.
const LISTED_RUN_COLUMNS: &str = "id, job_name, group_name, scheduled_at, trigger, state, reason, \
     attempt, worker_id, error, params, term, job_version, backfill_id, upstream_run_id, requested_by, \
     created_at, \
     published_at, started_at, \
     finished_at, next_attempt_at, cancel_requested_at, cancel_requested_by, replayed_by, \
     replayed_at, parent_id, task_key, task_kind, shard_index, shard_total, shard_param, \
     target_worker, map_step, map_depth, tasks_total, tasks_ended, tasks_failed, \
     CASE WHEN octet_length(output::text) > 1024 THEN to_jsonb(left(output::text, 1025)) \
          ELSE output END AS output, \
     octet_length(output::text) > 1024 AS output_cut";

impl Store {
    /// Connects a pool to `url`.
    pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Store> {
        let options: PgConnectOptions = url.parse().with_context(|| {
            format!(
                "database_url {} is not a PostgreSQL URL; write it as \
                 postgres://user:password@host:5432/database",
                redact_url(url)
            )
        })?;
        chime_protocol::tls::check_database_url(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .with_context(|| format!("connecting to PostgreSQL at {}", redact_url(url)))?;
        Ok(Store { pool })
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Store {
        Store { pool }
    }

    /// The underlying pool (for LISTEN connections).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Notifications on `channel` (`LISTEN`) as a stream of payloads, on a connection of their
    /// own that is reopened a second after it fails (callers poll meanwhile). Stops when the
    /// receiver is dropped.
    pub async fn listen(&self, channel: &'static str) -> tokio::sync::mpsc::Receiver<String> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let pool = self.pool.clone();
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
                    Err(e) => {
                        tracing::warn!(channel, error = %e, "cannot LISTEN; relying on polling");
                    }
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        rx
    }

    /// Creates the database `url` names if it does not exist yet (several instances may race
    /// here; losing the race is fine); whether this call created it.
    pub async fn create_database_if_missing(url: &str) -> anyhow::Result<bool> {
        use sqlx::migrate::MigrateDatabase as _;
        let exists = sqlx::Postgres::database_exists(url)
            .await
            .with_context(|| format!("checking the database at {}", redact_url(url)))?;
        if !exists
            && let Err(e) = sqlx::Postgres::create_database(url).await
            && !sqlx::Postgres::database_exists(url).await.unwrap_or(false)
        {
            return Err(e).with_context(|| format!("creating the database at {}", redact_url(url)));
        }
        Ok(!exists)
    }

    /// Applies pending migrations; how many it applied.
    pub async fn migrate(&self) -> anyhow::Result<usize> {
        let applied = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM _sqlx_migrations")
                .fetch_one(&self.pool)
                .await
                .context("counting applied migrations")
        };
        let tracked: bool =
            sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                .fetch_one(&self.pool)
                .await
                .context("looking for applied migrations")?;
        let before = if tracked { applied().await? } else { 0 };
        MIGRATOR
            .run(&self.pool)
            .await
            .context("applying database migrations")?;
        Ok(usize::try_from(applied().await? - before).unwrap_or(0))
    }

    // ---- leader lease -------------------------------------------------------------------

    /// Acquires or renews the lease for `me`; returns the term, or `None` if another instance
    /// holds an unexpired lease. The term is bumped on every takeover.
    pub async fn acquire_lease(&self, me: &str, ttl: Duration) -> anyhow::Result<Option<i64>> {
        let row = sqlx::query(
            "UPDATE chime_leader SET
                 term = CASE WHEN holder = $1 AND expires_at > now() THEN term ELSE term + 1 END,
                 elected_at = CASE WHEN holder = $1 AND expires_at > now() THEN elected_at ELSE now() END,
                 holder = $1,
                 expires_at = now() + make_interval(secs => $2)
             WHERE name = 'default' AND (holder IS NULL OR holder = $1 OR expires_at <= now())
             RETURNING term",
        )
        .bind(me)
        .bind(ttl.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
        .context("acquiring the leader lease")?;
        Ok(row.map(|r| r.get::<i64, _>("term")))
    }

    /// Gives the lease up at once and wakes followers.
    pub async fn resign(&self, fence: &Fence) -> anyhow::Result<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE chime_leader SET holder = NULL, expires_at = now()
             WHERE name = 'default' AND holder = $1 AND term = $2",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .execute(&mut *tx)
        .await
        .context("resigning the leader lease")?
        .rows_affected()
            == 1;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LEADER_CHANNEL)
            .bind(fence.term.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done)
    }

    /// The lease row.
    pub async fn leader(&self) -> anyhow::Result<LeaderInfo> {
        let r = sqlx::query(
            "SELECT holder, term, elected_at,
                    CASE WHEN isfinite(expires_at) THEN expires_at END AS expires_at,
                    expires_at > now() AS active
             FROM chime_leader WHERE name = 'default'",
        )
        .fetch_one(&self.pool)
        .await
        .context("reading the leader lease")?;
        let expires_at: Option<DateTime<Utc>> = r.try_get("expires_at").ok();
        Ok(LeaderInfo {
            holder: r.get("holder"),
            term: r.get("term"),
            elected_at: r.get("elected_at"),
            expires_at,
            active: r.get("active"),
        })
    }

    // ---- jobs ---------------------------------------------------------------------------

    /// Makes the config-declared jobs in the database equal to `specs`: inserts new ones,
    /// updates changed ones (keeping their cursor), deletes config jobs that are gone. Jobs
    /// created through the API are left alone unless a config job has the same name, in which
    /// case the config wins (and is reported as changed). Of two specs with one name, the last
    /// wins.
    ///
    /// Pause: a new job starts paused when its file says `paused = true`. Later, an operator's
    /// pause or resume stands across reloads, until the file's own `paused` value changes from
    /// one load to the next (or the file takes over an API job): then the file's new word
    /// applies, and a resume moves the cursor to now (no catch-up), as [`Store::set_paused`].
    ///
    /// Batched, so start-up with 100,000 jobs costs two hundred statements, not 100,000: per
    /// 1,000 jobs one `SELECT` finds the new and changed ones (comparing the stored `jsonb`
    /// with the new definition in the database) and one `INSERT … SELECT FROM UNNEST` writes them,
    /// the removed ones deleted in one statement, and the planner is told by one `NOTIFY` per
    /// job when at most [`NOTIFY_EACH_MAX`] changed, else by a single [`ALL_JOBS`].
    pub async fn sync_config_jobs(&self, specs: &[JobSpec]) -> anyhow::Result<JobDiff> {
        let mut tx = self.pool.begin().await?;
        // Serialise concurrent syncs from several instances starting at once.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('chime_jobs_sync'))")
            .execute(&mut *tx)
            .await?;
        set_actor(&mut tx, JOB_FILES_ACTOR).await?;
        // Names only: stored definitions are compared with the new ones in the database, a
        // batch at a time, so 100,000 of them are never decoded here at once.
        let config_names: Vec<String> =
            sqlx::query_scalar("SELECT name FROM chime_jobs WHERE source = 'config'")
                .fetch_all(&mut *tx)
                .await?;
        let mut last: HashMap<&str, &JobSpec> = HashMap::with_capacity(specs.len());
        for spec in specs {
            last.insert(spec.name.as_str(), spec);
        }
        let current: Vec<&JobSpec> = specs
            .iter()
            .filter(|spec| std::ptr::eq(last[spec.name.as_str()], *spec))
            .collect();
        let mut diff = JobDiff::default();
        for batch in current.chunks(SYNC_BATCH) {
            let names: Vec<&str> = batch.iter().map(|spec| spec.name.as_str()).collect();
            let jsons = batch
                .iter()
                .map(|spec| {
                    serde_json::to_string(spec)
                        .with_context(|| format!("encoding job {:?}", spec.name))
                })
                .collect::<anyhow::Result<Vec<String>>>()?;
            // The new jobs and those whose stored definition differs (or is an API job's).
            let differing = sqlx::query(
                "SELECT j.ord, c.name IS NULL AS added, c.source <> 'config' AS taken_over,
                        COALESCE((c.spec->>'paused')::boolean, false) AS file_paused
                   FROM UNNEST($1::text[], $2::text[]) WITH ORDINALITY AS j(name, spec, ord)
                   LEFT JOIN chime_jobs c ON c.name = j.name
                  WHERE c.name IS NULL OR c.source <> 'config' OR c.spec <> j.spec::jsonb
                  ORDER BY j.ord",
            )
            .bind(&names)
            .bind(&jsons)
            .fetch_all(&mut *tx)
            .await
            .context("comparing jobs")?;
            if differing.is_empty() {
                continue;
            }
            let (mut w_names, mut w_groups, mut w_jsons, mut w_paused) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            // Existing jobs whose file turned `paused` (or took over an API job): the file's
            // new word applies to them.
            let (mut turned, mut turned_paused) = (Vec::new(), Vec::new());
            for row in differing {
                let ord: i64 = row.get("ord");
                let i = usize::try_from(ord - 1).context("row position")?;
                let spec = batch[i];
                if row.get::<bool, _>("added") {
                    diff.added.push(spec.name.clone());
                } else {
                    diff.changed.push(spec.name.clone());
                    if row.get::<bool, _>("taken_over")
                        || row.get::<bool, _>("file_paused") != spec.paused
                    {
                        turned.push(names[i]);
                        turned_paused.push(spec.paused);
                    }
                }
                w_names.push(names[i]);
                w_groups.push(spec.group.as_str());
                w_jsons.push(jsons[i].as_str());
                w_paused.push(spec.paused);
            }
            sqlx::query(
                "INSERT INTO chime_jobs (name, group_name, spec, source, paused, paused_by)
                 SELECT j.name, j.group_name, j.spec::jsonb, 'config', j.paused,
                        CASE WHEN j.paused THEN 'file' END
                   FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bool[])
                        AS j(name, group_name, spec, paused)
                 ON CONFLICT (name) DO UPDATE SET group_name = EXCLUDED.group_name,
                     spec = EXCLUDED.spec, source = 'config', updated_at = now()",
            )
            .bind(&w_names)
            .bind(&w_groups)
            .bind(&w_jsons)
            .bind(&w_paused)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("saving {} jobs", w_names.len()))?;
            if !turned.is_empty() {
                // As `set_paused`: a resume moves the cursor to now (no catch-up).
                sqlx::query(
                    "UPDATE chime_jobs c SET paused = u.paused,
                         paused_by = CASE WHEN u.paused THEN 'file' END,
                         cursor_at = CASE WHEN c.paused AND NOT u.paused THEN now()
                                          ELSE c.cursor_at END
                       FROM UNNEST($1::text[], $2::bool[]) AS u(name, paused)
                      WHERE c.name = u.name",
                )
                .bind(&turned)
                .bind(&turned_paused)
                .execute(&mut *tx)
                .await
                .context("applying the job files' pause changes")?;
            }
        }
        let mut removed: Vec<String> = config_names
            .into_iter()
            .filter(|name| !last.contains_key(name.as_str()))
            .collect();
        removed.sort_unstable();
        if !removed.is_empty() {
            sqlx::query("DELETE FROM chime_jobs WHERE name = ANY($1)")
                .bind(&removed)
                .execute(&mut *tx)
                .await
                .context("deleting removed jobs")?;
        }
        diff.removed = removed;
        let touched = diff.added.len() + diff.changed.len() + diff.removed.len();
        if touched > NOTIFY_EACH_MAX {
            notify(&mut tx, JOBS_CHANNEL, ALL_JOBS).await?;
        } else {
            for name in diff.added.iter().chain(&diff.changed).chain(&diff.removed) {
                notify(&mut tx, JOBS_CHANNEL, name).await?;
            }
        }
        tx.commit().await.context("committing the job sync")?;
        Ok(diff)
    }

    /// All jobs, by name.
    pub async fn jobs(&self) -> anyhow::Result<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT spec, source, paused, paused_by, coalesce(cursor_at, updated_at) AS cursor_at,
                    scheduled_runs, version FROM chime_jobs ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .context("loading jobs")?;
        rows.into_iter().map(job_record).collect()
    }

    /// Up to `limit` jobs in name order, those after `after` (keyset paging on the primary
    /// key; job names are never empty): reading 100,000 jobs in pages keeps only one page of
    /// rows and decoded definitions in memory at a time.
    pub async fn jobs_page(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> anyhow::Result<Vec<JobRecord>> {
        let rows = sqlx::query(
            "SELECT spec, source, paused, paused_by, coalesce(cursor_at, updated_at) AS cursor_at,
                    scheduled_runs, version FROM chime_jobs
             WHERE name > $1 ORDER BY name LIMIT $2",
        )
        .bind(after.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .context("loading jobs")?;
        rows.into_iter().map(job_record).collect()
    }

    /// One job.
    pub async fn job(&self, name: &str) -> anyhow::Result<Option<JobRecord>> {
        let row = sqlx::query(
            "SELECT spec, source, paused, paused_by, coalesce(cursor_at, updated_at) AS cursor_at,
                    scheduled_runs, version FROM chime_jobs WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("loading job {name:?}"))?;
        row.map(job_record).transpose()
    }

    /// Pauses or resumes a job for operator `by` (recorded as who paused it). Returns false if
    /// there is no such job. Resuming moves the cursor to now: fires that fell due while paused
    /// are not caught up. The operator's word stands across job-file reloads until the file's
    /// own `paused` value changes.
    pub async fn set_paused(&self, name: &str, paused: bool, by: &str) -> anyhow::Result<bool> {
        let mut tx = self.pool.begin().await?;
        let found = sqlx::query(
            "UPDATE chime_jobs SET paused = $2, updated_at = now(),
                 paused_by = CASE WHEN NOT $2 THEN NULL WHEN paused THEN paused_by ELSE $3 END,
                 cursor_at = CASE WHEN paused AND NOT $2 THEN now() ELSE cursor_at END
             WHERE name = $1",
        )
        .bind(name)
        .bind(paused)
        .bind(by)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        notify(&mut tx, JOBS_CHANNEL, name).await?;
        tx.commit().await?;
        Ok(found)
    }

    // ---- runs ---------------------------------------------------------------------------

    /// Inserts fires as runs (`pending`, or `skipped` with a reason) under the leader's fence and
    /// advances the jobs' cursors. Each run keeps its job's retry policy as it is now
    /// (`chime_retry_snapshot`). A fire that already has a run is left alone (the unique key on
    /// (job, scheduled instant) makes a duplicate trigger impossible).
    ///
    /// The concurrency policy is decided here, against the database, in the same statement:
    /// a `forbid` fire while the job has an unfinished run (pending, queued, running or retrying)
    /// is recorded `skipped` with reason `previous run N still active (concurrency forbid)`; a
    /// backfill's runs do not count (its own `parallel` governs them); a `queue` fire in that case is created `pending` but reported [`CreatedRun::blocked`].
    ///
    /// `plan_writes` is the planner's count of its writes (`chime_plan_writes`, read
    /// with [`Store::plan_writes`] when it starts): the statement writes only if the table
    /// still holds that count, and adds one to it and to `*plan_writes`. A lower count means
    /// the database lost writes it had acknowledged (an asynchronous standby promoted):
    /// [`PlanWritesLost`], nothing written. `None` checks nothing (callers outside the planner).
    ///
    /// Returns `Ok(None)` if `fence` no longer holds the lease: nothing was written. Otherwise
    /// the runs that were created as `pending`.
    pub async fn insert_fires(
        &self,
        fence: &Fence,
        plan_writes: Option<&mut i64>,
        fires: &[NewFire],
    ) -> anyhow::Result<Option<Vec<CreatedRun>>> {
        let jobs: Vec<&str> = fires.iter().map(|f| f.job.as_str()).collect();
        let groups: Vec<&str> = fires.iter().map(|f| f.group.as_str()).collect();
        let instants: Vec<DateTime<Utc>> = fires.iter().map(|f| f.scheduled_at).collect();
        let kinds: Vec<&str> = fires.iter().map(|f| f.kind.as_str()).collect();
        let params: Vec<&serde_json::Value> = fires.iter().map(|f| &f.params).collect();
        let states: Vec<&str> = fires
            .iter()
            .map(|f| {
                if f.skip.is_some() {
                    "skipped"
                } else {
                    "pending"
                }
            })
            .collect();
        let reasons: Vec<Option<&str>> = fires.iter().map(|f| f.skip.as_deref()).collect();
        let policies: Vec<&str> = fires.iter().map(|f| f.concurrency.as_str()).collect();
        let rows = sqlx::query(
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), counted AS (
                 UPDATE chime_plan_writes p SET writes = p.writes + 1
                 FROM lease
                 WHERE p.name = 'default' AND ($11::bigint IS NULL OR p.writes = $11)
                 RETURNING p.writes
             ), fires AS (
                 SELECT * FROM unnest($3::text[], $4::text[], $5::timestamptz[], $6::text[],
                                      $7::jsonb[], $8::text[], $9::text[], $10::text[])
                     AS f(job_name, group_name, scheduled_at, trigger, params, state, reason, policy)
             ), decided AS (
                 SELECT f.job_name, f.group_name, f.scheduled_at, f.trigger, f.params,
                        CASE WHEN f.state = 'pending' AND f.policy = 'forbid' AND a.id IS NOT NULL
                             THEN 'skipped' ELSE f.state END AS state,
                        CASE WHEN f.state = 'pending' AND f.policy = 'forbid' AND a.id IS NOT NULL
                             THEN format('previous run %s still active (concurrency forbid)', a.id)
                             ELSE f.reason END AS reason,
                        (f.policy = 'queue' AND a.id IS NOT NULL) AS blocked
                 FROM fires f
                 LEFT JOIN LATERAL (
                     SELECT e.id FROM chime_runs e
                     WHERE f.policy IN ('forbid', 'queue') AND f.state = 'pending'
                       AND e.job_name = f.job_name AND e.parent_id IS NULL
                       AND e.state IN ('pending', 'queued', 'running', 'retrying')
                       AND e.backfill_id IS NULL
                     ORDER BY e.id DESC LIMIT 1
                 ) a ON true
             ), ins AS (
                 INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                         reason, term, retry_policy, job_version)
                 SELECT d.job_name, d.group_name, d.scheduled_at, d.trigger, d.params, d.state,
                        d.reason, lease.term, chime_retry_snapshot(j.spec), j.version
                 FROM decided d CROSS JOIN lease CROSS JOIN counted
                 LEFT JOIN chime_jobs j ON j.name = d.job_name
                 ON CONFLICT (job_name, scheduled_at)
                 WHERE trigger IN ('schedule', 'catchup', 'backfill') AND parent_id IS NULL
                 DO NOTHING
                 RETURNING id, job_name, scheduled_at, state, trigger
             ), made AS (
                 -- The schedule's fires written (max_runs counts them, skips included).
                 SELECT job_name, count(*) AS n FROM ins
                 WHERE trigger IN ('schedule', 'catchup')
                 GROUP BY job_name
             ), cursor AS (
                 UPDATE chime_jobs j
                 SET cursor_at = greatest(j.cursor_at, c.at),
                     scheduled_runs = j.scheduled_runs + coalesce(m.n, 0)
                 FROM (SELECT job_name, max(scheduled_at) AS at FROM fires GROUP BY job_name) c
                      LEFT JOIN made m ON m.job_name = c.job_name,
                      lease, counted
                 WHERE j.name = c.job_name
                   AND (j.cursor_at IS NULL OR j.cursor_at < c.at OR m.n IS NOT NULL)
             )
             SELECT 'lease' AS kind, NULL::bigint AS id, NULL::text AS job_name,
                    NULL::timestamptz AS scheduled_at, false AS blocked FROM lease
             UNION ALL
             SELECT 'counted', writes, NULL, NULL, false FROM counted
             UNION ALL
             SELECT 'run', i.id, i.job_name, i.scheduled_at, d.blocked
             FROM ins i JOIN decided d
               ON d.job_name = i.job_name AND d.scheduled_at = i.scheduled_at
             WHERE i.state = 'pending'",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(&jobs)
        .bind(&groups)
        .bind(&instants)
        .bind(&kinds)
        .bind(&params)
        .bind(&states)
        .bind(&reasons)
        .bind(&policies)
        .bind(plan_writes.as_deref().copied())
        // Planned for its arrays each time (an unnamed statement): a generic plan guesses ten
        // rows per array and joins the CTEs in nested loops, quadratic in the batch.
        .persistent(false)
        .fetch_all(&self.pool)
        .await
        .context("inserting runs")?;
        let mut leased = false;
        let mut counted = None;
        let mut created = Vec::with_capacity(rows.len());
        for r in rows {
            let kind: &str = r.get("kind");
            if kind == "lease" {
                leased = true;
            } else if kind == "counted" {
                counted = Some(r.get::<i64, _>("id"));
            } else {
                created.push(CreatedRun {
                    id: r.get("id"),
                    job: r.get("job_name"),
                    scheduled_at: r.get("scheduled_at"),
                    blocked: r.get("blocked"),
                });
            }
        }
        if !leased {
            return Ok(None);
        }
        match (counted, plan_writes) {
            (Some(count), Some(expected)) => *expected = count,
            (Some(_), None) => {}
            (None, expected) => {
                return Err(PlanWritesLost {
                    expected: expected.map_or(0, |e| *e),
                    found: self.plan_writes().await?,
                }
                .into());
            }
        }
        Ok(Some(created))
    }

    /// The planner's count of its writes (see [`Store::insert_fires`]).
    pub async fn plan_writes(&self) -> anyhow::Result<i64> {
        sqlx::query_scalar("SELECT writes FROM chime_plan_writes WHERE name = 'default'")
            .fetch_one(&self.pool)
            .await
            .context("reading the planner's write count")
    }

    /// Runs in the outbox due by `horizon`, oldest first, at most `limit`. A pending run of a
    /// `queue`-policy job is left out while an earlier run of the job is unfinished, so the job's
    /// runs are published one after the other (a task is not: its parent's turn came). A
    /// backfill's runs are outside the job's policy both ways: its `parallel` governs them, so
    /// they are never held back, nor hold back or cancel (`replace`) the job's other runs. A
    /// map/reduce run's reduce task is left out until every other task of its run has ended.
    /// Each carries the retry policy its run was made with (`chime_runs.retry_policy`, filled at
    /// insert from the job's), not the job's current one; a run without one gets the default
    /// policy.
    pub async fn outbox(
        &self,
        horizon: DateTime<Utc>,
        limit: i64,
    ) -> anyhow::Result<Vec<OutboxRun>> {
        let rows = sqlx::query(
            "SELECT r.id, r.job_name, r.group_name, r.scheduled_at, r.attempt, r.params,
                    j.spec->>'timeout' AS timeout, r.retry_policy AS retry,
                    CASE WHEN r.backfill_id IS NULL AND r.workflow_run_id IS NULL
                         THEN chime_job_concurrency(j.spec) ELSE 'allow' END AS concurrency,
                    r.parent_id IS NULL
                        AND chime_job_kind(j.spec) NOT IN ('single', 'workflow') AS fan_out,
                    r.parent_id IS NULL AND r.workflow_run_id IS NULL
                        AND chime_job_kind(j.spec) = 'workflow' AS workflow,
                    r.parent_id, r.task_key, r.task_kind, r.shard_index, r.shard_total,
                    r.shard_param, r.target_worker, r.map_step, r.map_depth
             FROM chime_runs r LEFT JOIN chime_jobs j ON j.name = r.job_name
             WHERE r.state = 'pending' AND r.scheduled_at <= $1
               AND NOT (r.parent_id IS NULL AND r.backfill_id IS NULL
                   AND r.workflow_run_id IS NULL
                   AND chime_job_concurrency(j.spec) = 'queue'
                   AND EXISTS (
                   SELECT 1 FROM chime_runs e
                   WHERE e.job_name = r.job_name AND e.id < r.id AND e.parent_id IS NULL
                     AND e.state IN ('pending', 'queued', 'running', 'retrying')
                     AND e.backfill_id IS NULL AND e.workflow_run_id IS NULL))
               AND NOT (r.task_kind = 'reduce' AND EXISTS (
                   SELECT 1 FROM chime_runs p
                   WHERE p.id = r.parent_id AND p.tasks_ended < p.tasks_total - 1))
             ORDER BY r.scheduled_at, r.id LIMIT $2",
        )
        .bind(horizon)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .context("reading the outbox")?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let timeout: Option<String> = r.get("timeout");
                let retry: Option<serde_json::Value> = r.get("retry");
                let concurrency: Option<String> = r.get("concurrency");
                let retry = retry
                    .and_then(|v| serde_json::from_value::<crate::job::RetrySpec>(v).ok())
                    .unwrap_or_default();
                let task = task_of(&r);
                OutboxRun {
                    id: r.get("id"),
                    job: r.get("job_name"),
                    group: r.get("group_name"),
                    scheduled_at: r.get("scheduled_at"),
                    attempt: u32::try_from(r.get::<i32, _>("attempt")).unwrap_or(0) + 1,
                    params: r.get("params"),
                    timeout: timeout.and_then(|t| humantime::parse_duration(&t).ok()),
                    retry: Some(retry.to_wire()),
                    concurrency: match task {
                        Some(_) => ConcurrencyPolicy::Allow,
                        None => concurrency
                            .as_deref()
                            .and_then(ConcurrencyPolicy::parse)
                            .unwrap_or_default(),
                    },
                    fan_out: r.get::<Option<bool>, _>("fan_out").unwrap_or(false),
                    workflow: r.get::<Option<bool>, _>("workflow").unwrap_or(false),
                    task,
                }
            })
            .collect())
    }

    /// Expands pending parent run `parent` into its tasks under the leader's fence
    /// (`chime_expand_run`: once; a broadcast below `min_workers` fails the parent instead) and
    /// returns the tasks whose triggers are not yet published, each as the attempt to publish,
    /// carrying `parent`'s timeout and retry policy. `Ok(None)` when the fence no longer holds.
    pub async fn expand_run(
        &self,
        fence: &Fence,
        parent: &OutboxRun,
    ) -> anyhow::Result<Option<Vec<OutboxRun>>> {
        let rows = match sqlx::query(
            "SELECT e.id, e.task_key, e.task_kind, e.shard_index, e.shard_total, e.shard_param,
                    e.target_worker, e.params, e.attempt, e.map_step, e.map_depth,
                    $3::bigint AS parent_id
             FROM chime_expand_run($1, $2, $3) e",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(parent.id)
        .fetch_all(&self.pool)
        .await
        {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                return Ok(None);
            }
            Err(e) => {
                return Err(e).with_context(|| format!("expanding run {} into tasks", parent.id));
            }
        };
        Ok(Some(
            rows.iter()
                .map(|r| OutboxRun {
                    id: r.get("id"),
                    job: parent.job.clone(),
                    group: parent.group.clone(),
                    scheduled_at: parent.scheduled_at,
                    attempt: u32::try_from(r.get::<i32, _>("attempt")).unwrap_or(0) + 1,
                    params: r.get("params"),
                    timeout: parent.timeout,
                    retry: parent.retry,
                    concurrency: ConcurrencyPolicy::Allow,
                    task: task_of(r),
                    fan_out: false,
                    workflow: false,
                })
                .collect(),
        ))
    }

    /// Records under the leader's fence that the broker confirmed these tasks' triggers
    /// (`chime_tasks_published`). Returns false when the fence no longer holds.
    pub async fn tasks_published(
        &self,
        fence: &Fence,
        tasks: &[Confirmed],
    ) -> anyhow::Result<bool> {
        let ids: Vec<i64> = tasks.iter().map(|t| t.id).collect();
        let at: Vec<DateTime<Utc>> = tasks.iter().map(|t| t.confirmed_at).collect();
        sqlx::query_scalar("SELECT chime_tasks_published($1, $2, $3, $4)")
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(&ids)
            .bind(&at)
            .fetch_one(&self.pool)
            .await
            .context("recording published tasks")
    }

    /// Ends broadcast task `task` `lost` under the leader's fence: its trigger could not be
    /// routed to its worker's queue (`why`). Returns false when it was not waiting any more or
    /// the fence no longer holds.
    pub async fn task_unroutable(
        &self,
        fence: &Fence,
        task: i64,
        why: &str,
    ) -> anyhow::Result<bool> {
        sqlx::query_scalar("SELECT chime_task_unroutable($1, $2, $3, $4)")
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(task)
            .bind(why)
            .fetch_one(&self.pool)
            .await
            .with_context(|| format!("recording task {task} as lost"))
    }

    /// Marks runs whose trigger the broker confirmed as `queued`, under the leader's fence,
    /// each with the instant its confirm arrived as `published_at`. A run a fast worker has
    /// already claimed is left as it is (its claim recorded `published_at`).
    pub async fn mark_published(&self, fence: &Fence, runs: &[Confirmed]) -> anyhow::Result<bool> {
        let ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
        let confirmed: Vec<DateTime<Utc>> = runs.iter().map(|r| r.confirmed_at).collect();
        let row = sqlx::query(MARK_PUBLISHED_SQL)
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(&ids)
            .bind(&confirmed)
            // Planned for its array each time, as `insert_fires`.
            .persistent(false)
            .fetch_one(&self.pool)
            .await
            .context("marking runs published")?;
        Ok(row.get::<i64, _>("leased") == 1)
    }

    /// Triggers `job` now (paused jobs too) with `params` replacing its own, for tools and tests
    /// that act as an admin (`chime jobs trigger` goes through `Operations` instead): the audit
    /// entry names `requested_by` as `admin`, without the params. Returns the run id, or `None`
    /// if there is no such job.
    pub async fn trigger(
        &self,
        job: &str,
        params: Option<serde_json::Value>,
        requested_by: &str,
    ) -> anyhow::Result<Option<i64>> {
        let detail = serde_json::json!({});
        let request = TriggerRequest {
            job,
            params: params.as_ref(),
            at: None,
            idempotency_key: None,
            requested_by,
            audit_role: "admin",
            audit_detail: &detail,
        };
        match self.trigger_with(&request).await? {
            Ok(run) => Ok(Some(run.run_id)),
            Err(refusal) if refusal.field == "job" => Ok(None),
            Err(refusal) => anyhow::bail!("triggering job {job:?}: {}", refusal.message),
        }
    }

    /// Records a manual trigger of `job` (paused jobs too) in the outbox and wakes the leader,
    /// through `chime_trigger` (the one home of its validation, its idempotency and its audit
    /// row): `params` replaces the job's params when given, `at` is its instant (now when
    /// `None`), a repeated `idempotency_key` returns the job's run of that key. The audit row
    /// names `requested_by` with `audit_role` and `audit_detail` (secrets already hidden).
    /// Returns the run, or the field `chime_trigger` refused.
    pub async fn trigger_with(
        &self,
        request: &TriggerRequest<'_>,
    ) -> anyhow::Result<Result<TriggeredRun, TriggerRefusal>> {
        let mut tx = self.pool.begin().await?;
        // Transaction-local: they reach this call's chime_trigger only.
        sqlx::query(
            "SELECT set_config('chime.audit_role', $1, true),
                    set_config('chime.audit_detail', $2, true)",
        )
        .bind(request.audit_role)
        .bind(request.audit_detail.to_string())
        .execute(&mut *tx)
        .await
        .context("passing the audit details")?;
        let row = sqlx::query("SELECT run_id, created FROM chime_trigger($1, $2, $3, $4, $5)")
            .bind(request.job)
            .bind(request.params)
            .bind(request.at)
            .bind(request.idempotency_key)
            .bind(request.requested_by)
            .fetch_one(&mut *tx)
            .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                if let Some(refusal) = TriggerRefusal::from_error(&e) {
                    return Ok(Err(refusal));
                }
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("triggering job {:?}", request.job));
            }
        };
        tx.commit().await?;
        Ok(Ok(TriggeredRun {
            run_id: row.get("run_id"),
            created: row.get("created"),
        }))
    }

    /// Runs, newest first: top-level runs (the fires), and their tasks too with
    /// `include_tasks`.
    pub async fn list_runs(&self, filter: &RunFilter) -> anyhow::Result<Vec<RunRecord>> {
        let top = if filter.include_tasks {
            ""
        } else {
            "AND parent_id IS NULL"
        };
        let sql = format!(
            "SELECT {LISTED_RUN_COLUMNS} FROM chime_runs
             WHERE ($1::text IS NULL OR job_name = $1) AND ($2::text IS NULL OR state = $2) {top}
             ORDER BY id DESC LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&filter.job)
            .bind(&filter.state)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await
            .context("listing runs")?;
        Ok(rows.into_iter().map(run_record).collect())
    }

    /// One run with its attempts and log lines.
    pub async fn run(&self, id: i64) -> anyhow::Result<Option<RunDetail>> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM chime_runs WHERE id = $1");
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .with_context(|| format!("loading run {id}"))?
        else {
            return Ok(None);
        };
        let attempts = sqlx::query(
            "SELECT attempt, worker_id, state, started_at, finished_at, duration_ms, error
             FROM chime_attempts WHERE run_id = $1 ORDER BY attempt",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|r| AttemptRecord {
            attempt: r.get("attempt"),
            worker_id: r.get("worker_id"),
            state: r.get("state"),
            started_at: r.get("started_at"),
            finished_at: r.get("finished_at"),
            duration_ms: r.get("duration_ms"),
            error: r.get("error"),
        })
        .collect();
        let logs = sqlx::query(
            "SELECT attempt, at, level, message FROM chime_run_logs WHERE run_id = $1 ORDER BY id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|r| LogLine {
            attempt: r.get("attempt"),
            at: r.get("at"),
            level: r.get("level"),
            message: r.get("message"),
        })
        .collect();
        let run = run_record(row);
        let parent = match run.parent_id {
            Some(parent) => {
                let sql = format!("SELECT {LISTED_RUN_COLUMNS} FROM chime_runs WHERE id = $1");
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(parent)
                    .fetch_optional(&self.pool)
                    .await
                    .with_context(|| format!("loading run {id}'s parent {parent}"))?
                    .map(|row| Box::new(run_record(row)))
            }
            None => None,
        };
        let tasks_by_state = if run.tasks_total > 0 {
            self.task_state_counts(id).await?
        } else {
            std::collections::BTreeMap::new()
        };
        let children = sqlx::query(
            "SELECT id, job_name, state FROM chime_runs WHERE upstream_run_id = $1
              ORDER BY id LIMIT $2",
        )
        .bind(id)
        .bind(MAX_SHOWN_CHILDREN)
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("loading run {id}'s child runs"))?
        .into_iter()
        .map(|r| ChildBrief {
            id: r.get("id"),
            job: r.get("job_name"),
            state: r.get("state"),
        })
        .collect();
        Ok(Some(RunDetail {
            run,
            attempts,
            logs,
            parent,
            tasks_by_state,
            children,
        }))
    }

    /// Run `id`'s job, state and task counters; `None` when there is no such run.
    pub async fn task_counts(&self, id: i64) -> anyhow::Result<Option<TaskCounts>> {
        let row = sqlx::query(
            "SELECT job_name, state, tasks_total, tasks_ended, tasks_failed
             FROM chime_runs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("loading run {id}'s task counters"))?;
        Ok(row.map(|r| TaskCounts {
            job: r.get("job_name"),
            state: r.get("state"),
            total: r.get("tasks_total"),
            ended: r.get("tasks_ended"),
            failed: r.get("tasks_failed"),
        }))
    }

    /// Parent run `parent`'s tasks by state (served by `chime_runs_task_order`).
    pub async fn task_state_counts(
        &self,
        parent: i64,
    ) -> anyhow::Result<std::collections::BTreeMap<String, i64>> {
        let rows = sqlx::query(
            "SELECT state, count(*) AS n FROM chime_runs WHERE parent_id = $1
             GROUP BY state ORDER BY state",
        )
        .bind(parent)
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("counting run {parent}'s tasks by state"))?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("state"), r.get("n")))
            .collect())
    }

    /// A page of parent run `query.parent`'s tasks in creation order (keyset on the id, served
    /// by `chime_runs_task_order`), their outputs cut as in lists.
    pub async fn tasks_page(&self, query: &TaskQuery) -> anyhow::Result<Vec<RunRecord>> {
        let sql = format!(
            "SELECT {LISTED_RUN_COLUMNS} FROM chime_runs
             WHERE parent_id = $1 AND id > coalesce($2, 0)
               AND ($3::text IS NULL OR state = $3)
             ORDER BY id LIMIT $4"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(query.parent)
            .bind(query.after)
            .bind(&query.state)
            .bind(query.limit)
            .fetch_all(&self.pool)
            .await
            .with_context(|| format!("listing run {}'s tasks", query.parent))?;
        Ok(rows.into_iter().map(run_record).collect())
    }

    /// Reruns the tasks of finished parent run `parent` that did not succeed
    /// (`chime_retry_failed`, as `by`): how many rerun, or what the database refused (22023:
    /// not a run with tasks, or not finished) as the field, value and message.
    pub async fn retry_failed_tasks(
        &self,
        parent: i64,
        by: &str,
    ) -> anyhow::Result<Result<i32, TriggerRefusal>> {
        let done = sqlx::query_scalar("SELECT chime_retry_failed($1, $2)")
            .bind(parent)
            .bind(by)
            .fetch_one(&self.pool)
            .await;
        match done {
            Ok(n) => Ok(Ok(n)),
            Err(e) => match TriggerRefusal::from_error(&e) {
                Some(refusal) => Ok(Err(refusal)),
                None => Err(anyhow::Error::new(e))
                    .with_context(|| format!("rerunning run {parent}'s failed tasks")),
            },
        }
    }
}

/// The actor of definition versions written by loading job files.
pub const JOB_FILES_ACTOR: &str = "file";

/// Names `actor` as the author of the definition versions the transaction writes
/// (`chime.actor`, read by the `chime_job_version` trigger).
async fn set_actor(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    actor: &str,
) -> anyhow::Result<()> {
    sqlx::query("SELECT set_config('chime.actor', $1, true)")
        .bind(actor)
        .execute(&mut **tx)
        .await
        .context("naming the change's actor")?;
    Ok(())
}

async fn notify(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    channel: &str,
    payload: &str,
) -> anyhow::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(payload)
        .execute(&mut **tx)
        .await
        .with_context(|| format!("notifying {channel}"))?;
    Ok(())
}

fn job_record(r: sqlx::postgres::PgRow) -> anyhow::Result<JobRecord> {
    let spec: serde_json::Value = r.get("spec");
    let spec: JobSpec = serde_json::from_value(spec).context("decoding a stored job spec")?;
    Ok(JobRecord {
        spec,
        source: r.get("source"),
        paused: r.get("paused"),
        paused_by: r.get("paused_by"),
        cursor_at: r.get("cursor_at"),
        scheduled_runs: r.get("scheduled_runs"),
        version: r.get("version"),
    })
}

fn run_record(r: sqlx::postgres::PgRow) -> RunRecord {
    let (tasks_total, tasks_ended, tasks_failed) = (
        r.get("tasks_total"),
        r.get("tasks_ended"),
        r.get("tasks_failed"),
    );
    let output = r.get("output");
    let mut record = RunRecord {
        id: r.get("id"),
        job: r.get("job_name"),
        group: r.get("group_name"),
        scheduled_at: r.get("scheduled_at"),
        trigger: r.get("trigger"),
        state: r.get("state"),
        reason: r.get("reason"),
        attempt: r.get("attempt"),
        worker_id: r.get("worker_id"),
        error: r.get("error"),
        params: r.get("params"),
        term: r.get("term"),
        job_version: r.get("job_version"),
        backfill_id: r.get("backfill_id"),
        upstream_run_id: r.get("upstream_run_id"),
        requested_by: r.get("requested_by"),
        created_at: r.get("created_at"),
        published_at: r.get("published_at"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
        next_attempt_at: r.get("next_attempt_at"),
        cancel_requested_at: r.get("cancel_requested_at"),
        cancel_requested_by: r.get("cancel_requested_by"),
        replayed_by: r.get("replayed_by"),
        replayed_at: r.get("replayed_at"),
        parent_id: r.get("parent_id"),
        task_key: r.get("task_key"),
        task_kind: r.get("task_kind"),
        shard_index: r.get("shard_index"),
        shard_total: r.get("shard_total"),
        shard_param: r.get("shard_param"),
        target_worker: r.get("target_worker"),
        map_step: r.get("map_step"),
        map_depth: r.get("map_depth"),
        output,
        output_truncated: false,
        progress: task_progress(tasks_total, tasks_ended, tasks_failed),
        tasks_total,
        tasks_ended,
        tasks_failed,
    };
    // LISTED_RUN_COLUMNS: the database sent the start of a longer output's text.
    if r.try_get::<Option<bool>, _>("output_cut").ok().flatten() == Some(true)
        && let Some(serde_json::Value::String(start)) = &record.output
    {
        let cut = chime_protocol::limits::cap_bytes(start, MAX_LISTED_OUTPUT_BYTES).into_owned();
        record.output = Some(serde_json::Value::String(cut));
        record.output_truncated = true;
    }
    record
}

/// Stores a job named `name` of group `g` with the stored definition `spec`, as a test's
/// fixture.
#[cfg(test)]
pub(crate) async fn insert_test_job(pool: &sqlx::PgPool, name: &str, spec: serde_json::Value) {
    sqlx::query("INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, 'g', $2)")
        .bind(name)
        .bind(spec)
        .execute(pool)
        .await
        .expect("the test job is stored");
}

#[cfg(test)]
impl Store {
    /// Takes the free lease as `holder` for 30 s: the fence of a test's leader.
    pub(crate) async fn lead_for_test(&self, holder: &str) -> Fence {
        let term = self
            .acquire_lease(holder, Duration::from_secs(30))
            .await
            .expect("the lease can be read")
            .expect("the lease is free");
        Fence {
            holder: holder.into(),
            term,
        }
    }
}

#[cfg(test)]
mod connect_tests {
    //! Connection errors, before any database is reached.

    use super::*;

    /// Issue 10: a URL that does not parse was shown whole, password included.
    #[tokio::test]
    async fn a_bad_url_is_reported_without_its_password() {
        for url in [
            "postgres://u:secret@host:notaport/db",
            "postgres://u:se@cret@host:notaport/db",
        ] {
            let error = format!("{:#}", Store::connect(url, 1).await.unwrap_err());
            assert!(error.starts_with("database_url "), "{error}");
            assert!(error.contains("postgres://user:password@host"), "{error}");
            assert!(
                !error.contains("secret") && !error.contains("cret"),
                "{error}"
            );
        }
        // sqlx takes a URL without a scheme for a connection string; whatever it then fails
        // with, the password is not in it.
        let error = format!(
            "{:#}",
            Store::connect("u:secret@127.0.0.1:1/db", 1)
                .await
                .unwrap_err()
        );
        assert!(!error.contains("secret"), "{error}");
    }

    #[tokio::test]
    async fn a_missing_root_certificate_names_the_parameter() {
        let url = "postgres://u:secret@127.0.0.1:1/db?sslmode=verify-full\
                   &sslrootcert=/nonexistent/chime-ca.pem";
        let error = format!("{:#}", Store::connect(url, 1).await.unwrap_err());
        assert!(
            error.starts_with("database_url sslrootcert = \"/nonexistent/chime-ca.pem\""),
            "{error}"
        );
    }
}

#[cfg(test)]
mod sync_tests {
    //! The batched config sync against a real database (`#[sqlx::test]`: one per test).

    use super::*;
    use serde_json::json;
    use sqlx::postgres::PgListener;

    fn spec(name: &str, every: &str) -> JobSpec {
        serde_json::from_value(json!({"name": name, "group": "g", "every": every}))
            .expect("valid job spec")
    }

    /// The notifications on [`JOBS_CHANNEL`] up to a sentinel sent after them (notifications
    /// arrive in commit order, so nothing sent before the sentinel is missed).
    async fn notifications(pool: &PgPool, listener: &mut PgListener) -> Vec<String> {
        sqlx::query("SELECT pg_notify($1, 'sentinel')")
            .bind(JOBS_CHANNEL)
            .execute(pool)
            .await
            .unwrap();
        let mut seen = Vec::new();
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
                .await
                .expect("the sentinel arrives")
                .unwrap();
            if n.payload() == "sentinel" {
                return seen;
            }
            seen.push(n.payload().to_owned());
        }
    }

    async fn stored(pool: &PgPool) -> Vec<(String, String)> {
        sqlx::query("SELECT name, spec->>'every' AS every FROM chime_jobs ORDER BY name")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.get("name"), r.get("every")))
            .collect()
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn bulk_sync_writes_every_job_and_notifies_once(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let mut listener = PgListener::connect_with(&pool).await.unwrap();
        listener.listen(JOBS_CHANNEL).await.unwrap();

        let specs: Vec<JobSpec> = (0..200).map(|i| spec(&format!("j{i:03}"), "1s")).collect();
        let diff = store.sync_config_jobs(&specs).await.unwrap();
        assert_eq!(diff.added.len(), 200);
        assert!(diff.changed.is_empty() && diff.removed.is_empty());
        assert_eq!(notifications(&pool, &mut listener).await, [ALL_JOBS]);
        let rows = stored(&pool).await;
        assert_eq!(rows.len(), 200);
        assert_eq!(rows[0], ("j000".to_owned(), "1s".to_owned()));

        // Unchanged: nothing written, nothing notified.
        let diff = store.sync_config_jobs(&specs).await.unwrap();
        assert!(diff.is_empty(), "{diff:?}");
        assert!(notifications(&pool, &mut listener).await.is_empty());

        // A few changes are notified one by one; of two specs with one name the last wins.
        let mut specs: Vec<JobSpec> = specs.into_iter().filter(|s| s.name != "j007").collect();
        specs.push(spec("j001", "5s"));
        specs.push(spec("new", "1m"));
        let diff = store.sync_config_jobs(&specs).await.unwrap();
        assert_eq!(diff.added, ["new"]);
        assert_eq!(diff.changed, ["j001"]);
        assert_eq!(diff.removed, ["j007"]);
        assert_eq!(
            notifications(&pool, &mut listener).await,
            ["new", "j001", "j007"]
        );
        let rows = stored(&pool).await;
        assert_eq!(rows.len(), 200);
        assert!(rows.contains(&("j001".to_owned(), "5s".to_owned())));
        assert!(!rows.iter().any(|(name, _)| name == "j007"));
    }
}

#[cfg(test)]
mod mark_tests {
    //! The mark of published runs on a database without statistics.

    use super::*;

    fn seq_scans(plan: &serde_json::Value, found: &mut Vec<String>) {
        if plan["Node Type"] == "Seq Scan" {
            found.push(plan["Relation Name"].as_str().unwrap_or("?").to_owned());
        }
        for child in plan["Plans"].as_array().into_iter().flatten() {
            seq_scans(child, found);
        }
    }

    /// On a new database (no statistics yet, as in a benchmark's first minute) the mark looks
    /// each run up by primary key, marks exactly the runs it is given, and nothing under a
    /// stale fence.
    #[sqlx::test(migrations = "../migrations")]
    async fn the_mark_uses_primary_key_lookups_without_statistics(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let term = store
            .acquire_lease("mark-test", Duration::from_secs(30))
            .await
            .unwrap()
            .expect("free lease");
        let fence = Fence {
            holder: "mark-test".into(),
            term,
        };
        let ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
             SELECT 'job', 'g', now() + g * interval '1 ms', 'schedule', 'pending'
               FROM generate_series(1, 3000) g
             RETURNING id",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let analysed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stats WHERE tablename = 'chime_runs'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(analysed, 0, "the test needs a database without statistics");
        let batch = &ids[100..164];
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (FORMAT JSON) {MARK_PUBLISHED_SQL}"
        )))
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(batch)
        .bind(vec![Utc::now(); batch.len()])
        .persistent(false)
        .fetch_one(&pool)
        .await
        .unwrap();
        let mut scanned = Vec::new();
        seq_scans(&plan[0]["Plan"], &mut scanned);
        assert!(
            !scanned.iter().any(|t| t == "chime_runs"),
            "the mark scans chime_runs: {plan:#}"
        );

        let stale = Fence {
            holder: "mark-test".into(),
            term: term - 1,
        };
        let marked = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT id FROM chime_runs WHERE state = 'queued' AND published_at IS NOT NULL
                  ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        };
        let confirmed: Vec<Confirmed> = batch
            .iter()
            .map(|&id| Confirmed {
                id,
                confirmed_at: Utc::now(),
            })
            .collect();
        assert!(!store.mark_published(&stale, &confirmed).await.unwrap());
        assert_eq!(
            marked().await,
            Vec::<i64>::new(),
            "a stale fence marks nothing"
        );
        assert!(store.mark_published(&fence, &confirmed).await.unwrap());
        assert_eq!(marked().await, batch);
    }
}

/// SQLSTATE `lock_not_available`: what `chime_expand_run` raises when the fence does not hold.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The task a run row is (its `parent_id` and `task_*` columns), as its trigger carries it;
/// `None` for a run without a parent.
fn task_of(r: &sqlx::postgres::PgRow) -> Option<chime_protocol::wire::Task> {
    use chime_protocol::wire::{Shard, Task, TaskKind};
    let parent_run_id: i64 = r.get::<Option<i64>, _>("parent_id")?;
    let kind = match r.get::<Option<&str>, _>("task_kind")? {
        "broadcast" => TaskKind::Broadcast,
        "shard" => TaskKind::Shard,
        "root" => TaskKind::Root,
        "map" => TaskKind::Map,
        "reduce" => TaskKind::Reduce,
        _ => return None,
    };
    let shard = match (
        r.get::<Option<i32>, _>("shard_index"),
        r.get::<Option<i32>, _>("shard_total"),
    ) {
        (Some(index), Some(total)) => Some(Shard {
            index: u32::try_from(index).ok()?,
            total: u32::try_from(total).ok()?,
            param: r.get("shard_param"),
        }),
        _ => None,
    };
    Some(Task {
        parent_run_id,
        key: r.get::<Option<String>, _>("task_key").unwrap_or_default(),
        kind,
        shard,
        worker: r.get("target_worker"),
        step: r.get("map_step"),
        depth: r
            .get::<Option<i32>, _>("map_depth")
            .and_then(|d| u32::try_from(d).ok()),
    })
}
