//! Everything the worker writes to PostgreSQL: the claim, attempt outcomes, run log lines, dead
//! runs and the worker registry. The only module of the SDK that speaks SQL.
//!
//! Every statement calls a function of migration `protocol_calls` (`chime_claim`,
//! `chime_record_outcomes`, …), where the rule it applies lives once, for workers in any
//! language; docs/protocol.md states their contracts. `STATEMENTS` lists every statement, and
//! a test prepares each against the migrated schema, so a renamed function or column fails CI.
//!
//! Every write retries with capped backoff while the error looks like a lost or refused
//! connection (a PostgreSQL restart, a pool timeout), for up to the store's retry budget, so a
//! brief outage delays a record instead of losing it.

use std::future::Future;
use std::time::{Duration, Instant};

use chime_protocol::backoff;
use chime_protocol::wire::Trigger;
use chime_protocol::{RunState, UnknownState};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool, Row};

use crate::context::LogLine;
use crate::outcome::{Outcome, RunEnd};
use crate::tasks::{MapCall, TaskCalls, TaskError, TaskResult, Upstream, kind_from_name};

/// The claim of one delivery: a batch of one of `chime_claim` (`$1` run id, `$2` attempt, `$3`
/// worker id, `$4` job, `$5` the handler's start for an attempt claimed ahead of it or NULL,
/// `$6` the worker's group), and the run as `chime_run_snapshot` shows it, with its worker's
/// liveness. The snapshot is read in the same statement, so it shows the run as it was
/// *before* the claim (a STABLE function sees the statement's snapshot): a refused claim says
/// why. `claim_clock` is the database clock at the statement's start (the run's `started_at`
/// estimate is the instant instead for a claim ahead of it): the worker dates its handler's
/// real start from it ([`ClaimClock`]).
const CLAIM_SQL: &str = "WITH claimed AS MATERIALIZED (
    SELECT * FROM chime_claim(ARRAY[$1::bigint], ARRAY[$2::int], ARRAY[$4::text],
                              ARRAY[$5::timestamptz], $3, $6)
)
SELECT (SELECT started_at FROM claimed) AS claimed_at, statement_timestamp() AS claim_clock, s.*
  FROM chime_run_snapshot($1) s";

/// The claim of several deliveries at once (`chime_claim`): one row of input per delivery (`$1`
/// run ids, `$2` attempts, `$3` jobs, `$4` start instants or the epoch, `$5` worker id, `$6`
/// the worker's group); returns the ids claimed, each with the database clock at the
/// statement's start (`claim_clock`, as [`CLAIM_SQL`] returns it). The function locks the rows
/// in id order and finds each by its primary key whatever the statistics say (migration
/// `protocol_calls`).
const CLAIM_MANY_SQL: &str = "SELECT run_id, claim_clock FROM chime_claim($1, $2, $3, $4, $5, $6)";

/// The outcomes of several attempts at once, in one statement (`chime_record_outcomes`; one
/// outcome is a batch of one): the attempt row only while it is `running` on this worker; the
/// run row only while it is `running` this attempt on this worker; `cancelled` instead of
/// `retrying` or `dead` when an operator asked to cancel meanwhile; log lines only with a
/// recorded attempt. One row of input per attempt (`$1` run ids, `$2` attempts, `$3` attempt
/// states, `$4` durations in ms, `$5` errors, `$6` run states, `$7` dead reasons, `$8` next
/// attempt instants, `$9` worker id; log lines flattened in `$10`–`$14`; `$15` the handlers'
/// starts, see [`AttemptRecord::started_at`]). Returns, per input run, whether its attempt row
/// was written and the run's new state (NULL when the run had moved on). The function locks
/// the run rows in id order, each before its attempt row, and looks every row up by its
/// primary key whatever the statistics say (migration `protocol_calls`).
const RECORD_MANY_SQL: &str = "SELECT run_id, attempt_recorded, run_state
  FROM chime_record_outcomes($1, $2, $3, $4, $5, $6, $7, $8, $15, $9, $10, $11, $12, $13, $14)";

/// Whether an outcome that found its attempt no longer `running` was written by this very
/// worker with this very outcome (a commit whose reply was lost), and the run's state then.
const OWN_RECORD_SQL: &str =
    "SELECT run_recorded, run_state FROM chime_outcome_recorded($1, $2, $3, $4, $5, $6)";

/// Takes a run over from a lost worker (`chime_take_over`).
const TAKE_OVER_SQL: &str = "SELECT outcome, attempt, reason, claim_clock
  FROM chime_take_over($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Stores a batch of log lines (`chime_append_logs`).
const APPEND_LOGS_SQL: &str = "SELECT chime_append_logs($1, $2, $3, $4, $5)";

/// Marks a waiting run dead (`chime_mark_dead`).
const MARK_DEAD_SQL: &str = "SELECT chime_mark_dead($1, $2, $3, $4, $5, $6)";

/// Records why a waiting run waits (`chime_mark_unhandled`).
const MARK_UNHANDLED_SQL: &str = "SELECT chime_mark_unhandled($1, $2, $3, $4, $5)";

/// Whether another online worker of the group handles the job (`chime_handled_elsewhere`).
const HANDLED_ELSEWHERE_SQL: &str = "SELECT chime_handled_elsewhere($1, $2, $3)";

/// The retry-or-dead decision after a retryable failure (`chime_retry_decision`).
const RETRY_DECISION_SQL: &str =
    "SELECT run_state, next_attempt_at, reason FROM chime_retry_decision($1, $2, $3)";

/// A run triggered from code (`chime_trigger`); params travel as JSON text.
const TRIGGER_SQL: &str =
    "SELECT run_id, created FROM chime_trigger($1, $2::text::jsonb, $3, $4, $5)";

/// A running root or mapped task maps items to sub-tasks (`chime_map`: `$1` caller run id,
/// `$2` attempt, `$3` worker id, `$4` step, `$5` the attempt's call number, `$6` the items as
/// JSON texts); returns how many sub-tasks were new.
const MAP_SQL: &str = "SELECT chime_map($1, $2, $3, $4, $5, $6::text[]::jsonb[])";

/// A running attempt stores its handler's output (`chime_set_output`; the output as JSON
/// text); false when the attempt is not running on this worker any more.
const SET_OUTPUT_SQL: &str = "SELECT chime_set_output($1, $2, $3, $4::text::jsonb)";

/// A reduce task reads the other tasks of its run, keyset-paged by id (`chime_task_results`:
/// `$1` the reduce task's run id, `$2` the last id of the previous page or 0, `$3` the page
/// size); JSON columns as text.
const TASK_RESULTS_SQL: &str = "SELECT id, task_key, task_kind, map_step, shard_index, state,
       output::text AS output, error, params::text AS params
  FROM chime_task_results($1, $2, $3)";

/// A run reads one row of `chime_upstream_runs` (`$1` the run id, `$2` the row's `node`): with
/// `$2` NULL, a child job's run reads the run that ended and started it; with a node name, a
/// workflow node's run reads that node's latest ended run of its workflow run. No row for
/// other runs or nodes; the output as text.
const UPSTREAM_SQL: &str = "SELECT node, run_id, job_name, state, output::text AS output, error,
       finished_at
  FROM chime_upstream_runs($1) WHERE node IS NOT DISTINCT FROM $2::text LIMIT 1";

/// The worker registry (`chime_register_worker`, `chime_heartbeat`, `chime_worker_stopped`).
const REGISTER_SQL: &str = "SELECT chime_register_worker($1, $2, $3, $4, $5, $6)";
const HEARTBEAT_SQL: &str = "SELECT chime_heartbeat($1)";
const STOPPED_SQL: &str = "SELECT chime_worker_stopped($1)";

/// Every statement of this module, by name: a test prepares each against the migrated
/// schema, so a renamed function, column or parameter type fails the build's tests.
#[cfg(test)]
const STATEMENTS: &[(&str, &str)] = &[
    ("claim", CLAIM_SQL),
    ("claim_many", CLAIM_MANY_SQL),
    ("snapshot", SNAPSHOT_SQL),
    ("record_many", RECORD_MANY_SQL),
    ("own_record", OWN_RECORD_SQL),
    ("take_over", TAKE_OVER_SQL),
    ("append_logs", APPEND_LOGS_SQL),
    ("mark_dead", MARK_DEAD_SQL),
    ("mark_unhandled", MARK_UNHANDLED_SQL),
    ("handled_elsewhere", HANDLED_ELSEWHERE_SQL),
    ("map", MAP_SQL),
    ("set_output", SET_OUTPUT_SQL),
    ("task_results", TASK_RESULTS_SQL),
    ("upstream", UPSTREAM_SQL),
    ("register", REGISTER_SQL),
    ("heartbeat", HEARTBEAT_SQL),
    ("stopped", STOPPED_SQL),
];

/// One finished attempt of a batch, for [`Store::record_outcomes`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutcomeRow<'a> {
    pub run_id: i64,
    pub attempt: u32,
    pub record: AttemptRecord<'a>,
}

/// One delivery's claim, for [`Store::claim_many`].
#[derive(Debug, Clone)]
pub(crate) struct ClaimRequest {
    pub run_id: i64,
    pub attempt: i32,
    pub job: String,
    pub starts_at: Option<DateTime<Utc>>,
}

/// The run as it is, without claiming it.
const SNAPSHOT_SQL: &str =
    "SELECT NULL::timestamptz AS claimed_at, s.* FROM chime_run_snapshot($1) s";

/// The run a trigger describes, for [`Store::mark_dead`] and [`Store::mark_unhandled`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeadRun<'a> {
    pub run_id: i64,
    pub job: &'a str,
    pub group: &'a str,
    pub attempt: u32,
}

/// A run as the claim found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunSnapshot {
    pub job_name: String,
    pub group_name: String,
    pub state: RunState,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub reason: Option<String>,
    pub error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub cancel_requested: bool,
    /// The heartbeat interval of the run's worker, if it is registered.
    pub worker_interval_ms: Option<i32>,
    /// The run's worker is lost (`chime_run_snapshot`: not online, or not registered);
    /// meaningless without a worker.
    pub worker_lost: bool,
    /// The run's worker registered again after it claimed the run (a restart under the same
    /// worker id): the attempt belongs to its earlier life.
    pub holder_restarted: bool,
}

/// Result of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This worker owns the attempt now; `clock` dates the claim (or the retry that found the
    /// claim ours): the handler starts after it.
    Claimed { clock: ClaimClock },
    /// Duplicate or stale delivery: the run is not waiting for this attempt (`None`: no such run).
    Refused(Option<RunSnapshot>),
}

/// A claim's statement as the two clocks saw it: the database's clock at the statement's start
/// (`statement_timestamp()`) and the worker's monotonic clock just before it was sent, on a
/// connection already acquired. The statement cannot start before it is sent, so a handler's
/// start dated from these ([`ClaimClock::started_at`]) is never earlier than it really was,
/// and later only by the statement's way to the server (well under a millisecond locally).
/// Dating from the reply instead would be early by the commit and the worker's wake-up, which
/// on a busy machine is tens of milliseconds: exactly the lateness this figure is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimClock {
    pub db: DateTime<Utc>,
    pub sent: Instant,
}

impl ClaimClock {
    /// A handler started at `started` (monotonic), on the database's clock: the claim's clock
    /// plus the monotonic time since the claim was sent, so never before the claim. `None`
    /// only past chrono's range.
    pub(crate) fn started_at(&self, started: Instant) -> Option<DateTime<Utc>> {
        let waited =
            chrono::TimeDelta::from_std(started.saturating_duration_since(self.sent)).ok()?;
        self.db.checked_add_signed(waited)
    }
}

/// What recording an outcome changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Attempt and run rows updated; the run's new state (`cancelled` instead of `retrying` or
    /// `dead` when an operator asked to cancel it meanwhile).
    Both(RunState),
    /// The attempt row was updated but the run had moved on (cancelled or rescued meanwhile).
    AttemptOnly,
    /// The attempt row was no longer `running`: recorded before (a retry after a commit whose
    /// reply was lost) or taken over by another worker or the rescuer (this worker was judged
    /// lost), so a late outcome is discarded.
    Nothing,
}

/// A finished attempt, as recorded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptRecord<'a> {
    pub outcome: &'a Outcome,
    /// When the next attempt is due (with a retry).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// How long the handler ran (monotonic clock).
    pub duration: Duration,
    /// When the handler started, on the database clock ([`ClaimClock::started_at`]). It
    /// replaces the claim's estimate in the attempt's and the run's `started_at`; `None` keeps
    /// the estimate.
    pub started_at: Option<DateTime<Utc>>,
    /// Log lines not stored yet.
    pub lines: &'a [LogLine],
}

/// Taking over attempt `attempt` of a run from a lost worker.
#[derive(Debug, Clone)]
pub(crate) struct TakeOver<'a> {
    pub run_id: i64,
    pub job: &'a str,
    /// The attempt that was running on the lost worker.
    pub attempt: u32,
    pub lost_worker: &'a str,
    /// Stored as the lost attempt's error.
    pub lost_error: &'a str,
    /// Check in the same transaction that the lost worker is still lost (false when it is this
    /// worker's own earlier incarnation).
    pub require_lost: bool,
    /// Dead instead of a new attempt when the run has this many lost attempts (the work queue's
    /// delivery limit).
    pub delivery_limit: u32,
    /// Dead instead of a new attempt, whatever the count, with this reason (the delivery is the
    /// last one the broker allows).
    pub dead_reason: Option<String>,
}

/// What a take-over did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TakenOver {
    /// The lost attempt is recorded and this worker owns the next one, `attempt`; `clock`
    /// dates the claim (see [`Claim::Claimed`]).
    Claimed { attempt: u32, clock: ClaimClock },
    /// The lost attempt is recorded and the run is dead with `reason`.
    Dead { reason: String },
    /// The lost attempt is recorded and the run cancelled: an operator had asked for it.
    Cancelled,
    /// Nothing done: the attempt is no longer running on that worker, or the worker is back.
    Refused,
}

/// A worker's registry row.
#[derive(Debug, Clone)]
pub(crate) struct WorkerRow<'a> {
    pub id: &'a str,
    pub group: &'a str,
    pub hostname: &'a str,
    pub capacity: u16,
    pub jobs: &'a [String],
    pub heartbeat_interval: Duration,
}

/// The worker's database access.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: PgPool,
    retry_budget: Duration,
}

impl Store {
    pub(crate) fn new(pool: PgPool, retry_budget: Duration) -> Self {
        Store { pool, retry_budget }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn retry_budget(&self) -> Duration {
        self.retry_budget
    }

    /// Runs `op` until it succeeds, fails with a non-transient error, or the budget is spent.
    /// `op` gets the retry number (0 for the first try).
    async fn retrying<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, sqlx::Error>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let start = Instant::now();
        let mut retry = 0;
        loop {
            match op(retry).await {
                Ok(value) => return Ok(value),
                Err(error) if is_transient(&error) => {
                    let wait =
                        backoff::delay(retry, Duration::from_millis(100), Duration::from_secs(5));
                    if start.elapsed() + wait > self.retry_budget {
                        return Err(error);
                    }
                    tracing::warn!(%error, retry, ?wait, "database unavailable while {what}; retrying");
                    tokio::time::sleep(wait).await;
                    retry += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Claims `trigger`'s attempt for `worker_id` (see [`CLAIM_SQL`]).
    ///
    /// If a try fails with a transient error its commit may still have happened with the reply
    /// lost; a retry then finds the run `running` for this very attempt and worker, which is our
    /// own claim, and reports it claimed. (Concurrent duplicates inside one worker are kept out
    /// before the claim, so that cannot be anyone else's.)
    ///
    /// `starts_at` is when the handler will start, for an attempt claimed ahead of its instant
    /// (a trigger published early, a retry held for its last moments): it becomes the attempt's
    /// `started_at` unless the claim comes later.
    ///
    /// `maybe_ours`: an earlier statement (a batched claim that failed) may have claimed it
    /// already, so a run `running` for this attempt on this worker counts as claimed even on
    /// the first try.
    pub(crate) async fn claim(
        &self,
        trigger: &Trigger,
        worker_id: &str,
        group: &str,
        starts_at: Option<DateTime<Utc>>,
        maybe_ours: bool,
    ) -> Result<Claim, sqlx::Error> {
        let attempt = attempt_i32(trigger.attempt);
        self.retrying("claiming a run", |retry| async move {
            let mut conn = self.pool.acquire().await?;
            let sent = Instant::now();
            let row = sqlx::query(CLAIM_SQL)
                .bind(trigger.run_id)
                .bind(attempt)
                .bind(worker_id)
                .bind(&trigger.job)
                .bind(starts_at)
                .bind(group)
                .fetch_optional(&mut *conn)
                .await?;
            let Some(row) = row else {
                return Ok(Claim::Refused(None));
            };
            let claimed_at: Option<DateTime<Utc>> = row.try_get("claimed_at")?;
            let clock = ClaimClock {
                db: row.try_get("claim_clock")?,
                sent,
            };
            let snapshot = snapshot(&row)?;
            let ours_from_a_lost_reply = (retry > 0 || maybe_ours)
                && snapshot.state == RunState::Running
                && snapshot.attempt == attempt
                && snapshot.worker_id.as_deref() == Some(worker_id);
            Ok(if claimed_at.is_some() || ours_from_a_lost_reply {
                Claim::Claimed { clock }
            } else {
                Claim::Refused(Some(snapshot))
            })
        })
        .await
    }

    /// Claims several attempts in one statement (see [`CLAIM_MANY_SQL`]); returns the run ids
    /// claimed, each with the database clock at its claim. No retries: a caller whose run is not
    /// in the answer (or gets an error) claims it alone with [`Store::claim`], which also says
    /// why a claim was refused.
    pub(crate) async fn claim_many(
        &self,
        claims: &[ClaimRequest],
        worker_id: &str,
        group: &str,
    ) -> Result<Vec<(i64, ClaimClock)>, sqlx::Error> {
        // Sorted, so two batches lock their rows in the same order.
        let mut claims: Vec<&ClaimRequest> = claims.iter().collect();
        claims.sort_by_key(|c| c.run_id);
        let ids: Vec<i64> = claims.iter().map(|c| c.run_id).collect();
        let attempts: Vec<i32> = claims.iter().map(|c| c.attempt).collect();
        let jobs: Vec<&str> = claims.iter().map(|c| c.job.as_str()).collect();
        // `greatest` takes now() over the epoch: the epoch stands for "no start instant".
        let starts: Vec<DateTime<Utc>> = claims
            .iter()
            .map(|c| c.starts_at.unwrap_or(DateTime::<Utc>::UNIX_EPOCH))
            .collect();
        let mut conn = self.pool.acquire().await?;
        let sent = Instant::now();
        let claimed: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(CLAIM_MANY_SQL)
            .bind(&ids)
            .bind(&attempts)
            .bind(&jobs)
            .bind(&starts)
            .bind(worker_id)
            .bind(group)
            .fetch_all(&mut *conn)
            .await?;
        Ok(claimed
            .into_iter()
            .map(|(id, db)| (id, ClaimClock { db, sent }))
            .collect())
    }

    /// Retry or dead after attempt `attempt` of run `run_id` failed retryably, by the run's
    /// retry policy snapshot (`chime_retry_decision`); `requested` is the handler's own delay.
    /// One try: a caller that gets an error decides by the trigger's policy instead (the same
    /// rule, `chime_protocol::retry`). `None`: no such run.
    pub(crate) async fn retry_decision(
        &self,
        run_id: i64,
        attempt: u32,
        requested: Option<Duration>,
    ) -> Result<Option<RetryDecision>, sqlx::Error> {
        let requested_ms = requested.map(duration_ms);
        let row: Option<(String, Option<DateTime<Utc>>, Option<String>)> =
            sqlx::query_as(RETRY_DECISION_SQL)
                .bind(run_id)
                .bind(attempt_i32(attempt))
                .bind(requested_ms)
                .fetch_optional(&self.pool)
                .await?;
        let Some((state, next_at, reason)) = row else {
            return Ok(None);
        };
        match (run_state(&state)?, next_at, reason) {
            (RunState::Retrying, Some(at), _) => Ok(Some(RetryDecision::Retry(at))),
            (RunState::Dead, _, Some(reason)) => Ok(Some(RetryDecision::Dead(reason))),
            (state, at, reason) => Err(sqlx::Error::Protocol(format!(
                "chime_retry_decision answered {state:?}, {at:?}, {reason:?}"
            ))),
        }
    }

    /// The run as it is now (`None`: no such run).
    pub(crate) async fn snapshot(&self, run_id: i64) -> Result<Option<RunSnapshot>, sqlx::Error> {
        self.retrying("reading a run", |_| async move {
            let row = sqlx::query(SNAPSHOT_SQL)
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await?;
            row.as_ref().map(snapshot).transpose()
        })
        .await
    }

    /// Records attempt `t.attempt` of a run `lost` and, in the same transaction, claims the next
    /// attempt for `worker_id`, or ends the run `dead` (delivery limit, or the lost attempt was
    /// the last its retry policy snapshot allows: a lost attempt counts like a failed one, as
    /// for the rescuer) or `cancelled` (requested), in one call of `chime_take_over`. Fenced
    /// like an outcome: only while that attempt is still `running` on the lost worker, so two
    /// workers racing for a take-over cannot both win.
    pub(crate) async fn take_over(
        &self,
        t: &TakeOver<'_>,
        worker_id: &str,
    ) -> Result<TakenOver, sqlx::Error> {
        let attempt = attempt_i32(t.attempt);
        self.retrying("taking over a run from a lost worker", |_| async move {
            let mut conn = self.pool.acquire().await?;
            let sent = Instant::now();
            let (outcome, next, reason, db): (
                String,
                Option<i32>,
                Option<String>,
                Option<DateTime<Utc>>,
            ) = sqlx::query_as(TAKE_OVER_SQL)
                .bind(t.run_id)
                .bind(t.job)
                .bind(attempt)
                .bind(t.lost_worker)
                .bind(t.lost_error)
                .bind(t.require_lost)
                .bind(i32::try_from(t.delivery_limit).unwrap_or(i32::MAX))
                .bind(t.dead_reason.as_deref())
                .bind(worker_id)
                .fetch_one(&mut *conn)
                .await?;
            Ok(match (outcome.as_str(), next, reason, db) {
                ("claimed", Some(next), _, Some(db)) => TakenOver::Claimed {
                    attempt: u32::try_from(next).unwrap_or(u32::MAX),
                    clock: ClaimClock { db, sent },
                },
                ("dead", _, Some(reason), _) => TakenOver::Dead { reason },
                ("cancelled", ..) => TakenOver::Cancelled,
                ("refused", ..) => TakenOver::Refused,
                (other, ..) => {
                    return Err(sqlx::Error::Protocol(format!(
                        "chime_take_over answered {other:?}"
                    )));
                }
            })
        })
        .await
    }

    /// Stores a batch of log lines of a running attempt.
    pub(crate) async fn append_logs(
        &self,
        run_id: i64,
        attempt: u32,
        lines: &[LogLine],
    ) -> Result<(), sqlx::Error> {
        if lines.is_empty() {
            return Ok(());
        }
        let at: Vec<DateTime<Utc>> = lines.iter().map(|l| l.at).collect();
        let level: Vec<&str> = lines.iter().map(|l| l.level.as_str()).collect();
        let message: Vec<&str> = lines.iter().map(|l| l.message.as_str()).collect();
        let (at, level, message) = (&at, &level, &message);
        self.retrying("storing run log lines", |_| async move {
            sqlx::query(APPEND_LOGS_SQL)
                .bind(run_id)
                .bind(attempt_i32(attempt))
                .bind(at)
                .bind(level)
                .bind(message)
                .execute(&self.pool)
                .await
                .map(drop)
        })
        .await
    }

    /// Records a finished attempt: attempt row, run row and the remaining log lines, in one
    /// statement (a batch of one of [`Store::record_outcomes`]). `started_at` becomes the
    /// handler's real start ([`AttemptRecord::started_at`]) and `finished_at` is `started_at +
    /// duration` (a monotonic duration measured by the worker added to the DB clock's start),
    /// so a delayed write does not stretch the run.
    ///
    /// A run an operator asked to cancel meanwhile ends `cancelled` rather than `retrying` or
    /// `dead`; the returned state says which.
    ///
    /// If a try fails with a transient error its commit may still have happened with the reply
    /// lost; a retry then finds the attempt recorded already. When the recorded attempt is this
    /// worker's with exactly this outcome, the write was ours and counts as done. `maybe_ours`:
    /// an earlier statement (a batched write that failed) may have written it, so that holds
    /// on the first try too.
    pub(crate) async fn record_outcome(
        &self,
        run_id: i64,
        attempt: u32,
        worker_id: &str,
        record: &AttemptRecord<'_>,
        maybe_ours: bool,
    ) -> Result<Recorded, sqlx::Error> {
        let row = OutcomeRow {
            run_id,
            attempt,
            record: *record,
        };
        let outcome = record.outcome;
        let attempt_no = attempt_i32(attempt);
        let duration_ms = duration_ms(record.duration);
        self.retrying("recording an attempt's outcome", |retry| async move {
            let recorded = record_batch(&self.pool, std::slice::from_ref(&row), worker_id)
                .await?
                .pop()
                .ok_or_else(|| {
                    sqlx::Error::Protocol(format!(
                        "the outcome write returned no row for run {run_id}"
                    ))
                })?;
            if recorded != Recorded::Nothing || !(retry > 0 || maybe_ours) {
                return Ok(recorded);
            }
            let own: Option<(bool, String)> = sqlx::query_as(OWN_RECORD_SQL)
                .bind(run_id)
                .bind(attempt_no)
                .bind(worker_id)
                .bind(outcome.attempt.as_str())
                .bind(duration_ms)
                .bind(outcome.error.as_deref())
                .fetch_optional(&self.pool)
                .await?;
            Ok(match own {
                Some((true, state)) => Recorded::Both(run_state(&state)?),
                Some((false, _)) => Recorded::AttemptOnly,
                None => Recorded::Nothing,
            })
        })
        .await
    }

    /// Records several finished attempts in one statement (see [`RECORD_MANY_SQL`]); returns
    /// what was recorded for each row of `rows`, in their order. No retries: a caller gets an
    /// error for the whole batch and records each attempt alone with [`Store::record_outcome`]
    /// (with `maybe_ours`, in case the batch committed and only its reply was lost), which
    /// also tells which attempt cannot be written. Each run appears at most once in `rows`.
    pub(crate) async fn record_outcomes(
        &self,
        rows: &[OutcomeRow<'_>],
        worker_id: &str,
    ) -> Result<Vec<Recorded>, sqlx::Error> {
        record_batch(&self.pool, rows, worker_id).await
    }

    /// Marks a waiting run dead with `reason` (a job this worker has no handler for, the last
    /// delivery the broker allows), only if it is the run the trigger describes: of job `job`
    /// and group `group`, waiting for attempt `attempt` (the one after its last). A forged
    /// trigger naming another run's id therefore never ends that run.
    /// Returns false if there is no such waiting run.
    pub(crate) async fn mark_dead(
        &self,
        run: DeadRun<'_>,
        reason: &str,
        worker_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let DeadRun {
            run_id,
            job,
            group,
            attempt,
        } = run;
        let attempt = attempt_i32(attempt);
        self.retrying("marking a run dead", |_| async move {
            sqlx::query_scalar(MARK_DEAD_SQL)
                .bind(run_id)
                .bind(group)
                .bind(reason)
                .bind(worker_id)
                .bind(job)
                .bind(attempt)
                .fetch_one(&self.pool)
                .await
        })
        .await
    }

    /// Whether a worker of `group` other than `worker_id` is online and declares a handler for
    /// `job`. Online as the scheduler counts it (`chime_worker_online`): not stopped, and a
    /// heartbeat within three of its own intervals.
    pub(crate) async fn handled_elsewhere(
        &self,
        group: &str,
        job: &str,
        worker_id: &str,
    ) -> Result<bool, sqlx::Error> {
        self.retrying("looking for a worker with the handler", |_| async move {
            sqlx::query_scalar(HANDLED_ELSEWHERE_SQL)
                .bind(group)
                .bind(job)
                .bind(worker_id)
                .fetch_one(&self.pool)
                .await
        })
        .await
    }

    /// Writes why a waiting run waits (no online worker has its job's handler) into its
    /// `reason`, leaving its state as it is; like [`Store::mark_dead`], only if it is the run
    /// the trigger describes, waiting for that attempt. The claim clears the reason. Returns
    /// false if there is no such waiting run.
    pub(crate) async fn mark_unhandled(
        &self,
        run: DeadRun<'_>,
        reason: &str,
    ) -> Result<bool, sqlx::Error> {
        let DeadRun {
            run_id,
            job,
            group,
            attempt,
        } = run;
        let attempt = attempt_i32(attempt);
        self.retrying("recording why a run waits", |_| async move {
            sqlx::query_scalar(MARK_UNHANDLED_SQL)
                .bind(run_id)
                .bind(group)
                .bind(reason)
                .bind(job)
                .bind(attempt)
                .fetch_one(&self.pool)
                .await
        })
        .await
    }

    /// Registers (or re-registers) the worker as running.
    pub(crate) async fn register_worker(&self, w: &WorkerRow<'_>) -> Result<(), sqlx::Error> {
        self.retrying("registering the worker", |_| async move {
            sqlx::query(REGISTER_SQL)
                .bind(w.id)
                .bind(w.group)
                .bind(w.hostname)
                .bind(i32::from(w.capacity))
                .bind(w.jobs)
                .bind(
                    i32::try_from(w.heartbeat_interval.as_millis())
                        .unwrap_or(i32::MAX)
                        .max(1),
                )
                .execute(&self.pool)
                .await
                .map(drop)
        })
        .await
    }

    /// Refreshes the worker's heartbeat on `connection`, a connection of its own (opened here
    /// when there is none), so that busy handlers holding every pooled connection cannot delay
    /// it: a heartbeat three intervals late gets the worker's runs taken over. One try, bounded
    /// by `limit`; the next beat is the retry. A failed connection is dropped and reopened.
    pub(crate) async fn heartbeat(
        &self,
        connection: &mut Option<PgConnection>,
        worker_id: &str,
        limit: Duration,
    ) -> Result<(), sqlx::Error> {
        let beat = async {
            if connection.is_none() {
                let options = self.pool.connect_options();
                *connection = Some(PgConnection::connect_with(&options).await?);
            }
            let conn = connection.as_mut().expect("opened above");
            sqlx::query(HEARTBEAT_SQL)
                .bind(worker_id)
                .execute(conn)
                .await
                .map(drop)
        };
        let result = match tokio::time::timeout(limit, beat).await {
            Ok(result) => result,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        };
        if result.is_err() {
            *connection = None;
        }
        result
    }

    /// Marks the worker stopped.
    pub(crate) async fn mark_stopped(&self, worker_id: &str) -> Result<(), sqlx::Error> {
        self.retrying("marking the worker stopped", |_| async move {
            sqlx::query(STOPPED_SQL)
                .bind(worker_id)
                .execute(&self.pool)
                .await
                .map(drop)
        })
        .await
    }
}

/// The job kinds' calls of a handler ([`crate::tasks`]), each retried through connection
/// errors like any write (each is idempotent: a map call repeated makes the same keys).
impl TaskCalls for Store {
    fn map<'a>(&'a self, call: MapCall<'a>) -> BoxFuture<'a, Result<u32, TaskError>> {
        Box::pin(async move {
            let items: Vec<String> = call.items.iter().map(Value::to_string).collect();
            let items = &items;
            let created: i32 = self
                .retrying("mapping sub-tasks", |_| async move {
                    sqlx::query_scalar(MAP_SQL)
                        .bind(call.caller)
                        .bind(attempt_i32(call.attempt))
                        .bind(call.worker)
                        .bind(call.step)
                        .bind(call.call_no)
                        .bind(items)
                        .fetch_one(&self.pool)
                        .await
                })
                .await
                .map_err(|e| task_error("chime_map", e))?;
            Ok(u32::try_from(created).unwrap_or_default())
        })
    }

    fn set_output<'a>(
        &'a self,
        run_id: i64,
        attempt: u32,
        worker: &'a str,
        output: &'a Value,
    ) -> BoxFuture<'a, Result<bool, TaskError>> {
        Box::pin(async move {
            let output = &output.to_string();
            self.retrying("storing a handler's output", |_| async move {
                sqlx::query_scalar(SET_OUTPUT_SQL)
                    .bind(run_id)
                    .bind(attempt_i32(attempt))
                    .bind(worker)
                    .bind(output)
                    .fetch_one(&self.pool)
                    .await
            })
            .await
            .map_err(|e| task_error("chime_set_output", e))
        })
    }

    fn task_results(
        &self,
        reduce_run: i64,
        after_id: i64,
        page: u32,
    ) -> BoxFuture<'_, Result<Vec<TaskResult>, TaskError>> {
        Box::pin(async move {
            let page = i32::try_from(page).unwrap_or(i32::MAX);
            self.retrying("reading the results of a run's tasks", |_| async move {
                let rows = sqlx::query(TASK_RESULTS_SQL)
                    .bind(reduce_run)
                    .bind(after_id)
                    .bind(page)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(task_result).collect()
            })
            .await
            .map_err(|e| task_error("chime_task_results", e))
        })
    }

    fn upstream<'a>(
        &'a self,
        run_id: i64,
        node: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Upstream>, TaskError>> {
        let what = if node.is_some() {
            "reading the run of an upstream workflow node"
        } else {
            "reading the run that started this one"
        };
        Box::pin(async move {
            self.retrying(what, |_| async move {
                let row = sqlx::query(UPSTREAM_SQL)
                    .bind(run_id)
                    .bind(node)
                    .fetch_optional(&self.pool)
                    .await?;
                row.as_ref().map(upstream).transpose()
            })
            .await
            .map_err(|e| task_error("chime_upstream_runs", e))
        })
    }
}

/// A row of [`UPSTREAM_SQL`].
fn upstream(row: &sqlx::postgres::PgRow) -> Result<Upstream, sqlx::Error> {
    let output: Option<String> = row.try_get("output")?;
    Ok(Upstream {
        run_id: row.try_get("run_id")?,
        job: row.try_get("job_name")?,
        state: run_state(&row.try_get::<String, _>("state")?)?,
        output: output
            .map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        error: row.try_get("error")?,
        finished_at: row.try_get("finished_at")?,
        node: row.try_get("node")?,
    })
}

/// A row of [`TASK_RESULTS_SQL`].
fn task_result(row: &sqlx::postgres::PgRow) -> Result<TaskResult, sqlx::Error> {
    let json = |column: &str| -> Result<Option<Value>, sqlx::Error> {
        let text: Option<String> = row.try_get(column)?;
        text.map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))
    };
    let kind: Option<String> = row.try_get("task_kind")?;
    let kind = kind
        .as_deref()
        .and_then(kind_from_name)
        .ok_or_else(|| sqlx::Error::Protocol(format!("chime_task_results: task kind {kind:?}")))?;
    let shard_index: Option<i32> = row.try_get("shard_index")?;
    Ok(TaskResult {
        id: row.try_get("id")?,
        key: row
            .try_get::<Option<String>, _>("task_key")?
            .unwrap_or_default(),
        kind,
        step: row.try_get("map_step")?,
        shard_index: shard_index.and_then(|i| u32::try_from(i).ok()),
        state: run_state(&row.try_get::<String, _>("state")?)?,
        output: json("output")?,
        error: row.try_get("error")?,
        params: json("params")?.unwrap_or(Value::Null),
    })
}

/// One statement of [`RECORD_MANY_SQL`] for `rows`: what was recorded for each, in their order.
async fn record_batch(
    pool: &PgPool,
    rows: &[OutcomeRow<'_>],
    worker_id: &str,
) -> Result<Vec<Recorded>, sqlx::Error> {
    let mut run_ids = Vec::with_capacity(rows.len());
    let mut attempts = Vec::with_capacity(rows.len());
    let mut attempt_states = Vec::with_capacity(rows.len());
    let mut durations = Vec::with_capacity(rows.len());
    let mut errors = Vec::with_capacity(rows.len());
    let mut run_states = Vec::with_capacity(rows.len());
    let mut reasons = Vec::with_capacity(rows.len());
    let mut next_at = Vec::with_capacity(rows.len());
    let mut started = Vec::with_capacity(rows.len());
    let (mut log_runs, mut log_attempts, mut log_at, mut log_levels, mut log_messages) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        let outcome = row.record.outcome;
        let attempt = attempt_i32(row.attempt);
        run_ids.push(row.run_id);
        attempts.push(attempt);
        attempt_states.push(outcome.attempt.as_str());
        durations.push(duration_ms(row.record.duration));
        errors.push(outcome.error.as_deref());
        run_states.push(outcome.run.state().as_str());
        reasons.push(match &outcome.run {
            RunEnd::Dead { reason } => Some(reason.as_str()),
            _ => None,
        });
        next_at.push(row.record.next_attempt_at);
        started.push(row.record.started_at);
        for line in row.record.lines {
            log_runs.push(row.run_id);
            log_attempts.push(attempt);
            log_at.push(line.at);
            log_levels.push(line.level.as_str());
            log_messages.push(line.message.as_str());
        }
    }
    let found: Vec<(i64, bool, Option<String>)> = sqlx::query_as(RECORD_MANY_SQL)
        .bind(&run_ids)
        .bind(&attempts)
        .bind(&attempt_states)
        .bind(&durations)
        .bind(&errors)
        .bind(&run_states)
        .bind(&reasons)
        .bind(&next_at)
        .bind(worker_id)
        .bind(&log_runs)
        .bind(&log_attempts)
        .bind(&log_at)
        .bind(&log_levels)
        .bind(&log_messages)
        .bind(&started)
        .fetch_all(pool)
        .await?;
    let by_run: std::collections::HashMap<i64, Recorded> = found
        .into_iter()
        .map(|(run_id, attempt_recorded, state)| {
            let recorded = match (attempt_recorded, state) {
                (false, _) => Recorded::Nothing,
                (true, None) => Recorded::AttemptOnly,
                (true, Some(state)) => Recorded::Both(run_state(&state)?),
            };
            Ok((run_id, recorded))
        })
        .collect::<Result<_, sqlx::Error>>()?;
    rows.iter()
        .map(|row| {
            by_run.get(&row.run_id).cloned().ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "the batched outcome write returned no row for run {}",
                    row.run_id
                ))
            })
        })
        .collect()
}

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn snapshot(row: &sqlx::postgres::PgRow) -> Result<RunSnapshot, sqlx::Error> {
    Ok(RunSnapshot {
        job_name: row.try_get("job_name")?,
        group_name: row.try_get("group_name")?,
        state: run_state(row.try_get("state")?)?,
        attempt: row.try_get("attempt")?,
        worker_id: row.try_get("worker_id")?,
        reason: row.try_get("reason")?,
        error: row.try_get("error")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        cancel_requested: row.try_get("cancel_requested")?,
        worker_interval_ms: row.try_get("heartbeat_interval_ms")?,
        worker_lost: row
            .try_get::<Option<bool>, _>("worker_lost")?
            .unwrap_or(true),
        holder_restarted: row.try_get("holder_restarted")?,
    })
}

/// What `chime_retry_decision` decided for a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RetryDecision {
    /// `retrying`: the next attempt is due at this instant (database clock).
    Retry(DateTime<Utc>),
    /// `dead`, with the reason (`attempts exhausted (n of m)`).
    Dead(String),
}

/// A run's `state` column as a [`RunState`]; a word the migrations do not allow is a decode
/// error, never a guess.
fn run_state(text: &str) -> Result<RunState, sqlx::Error> {
    text.parse()
        .map_err(|e: UnknownState| sqlx::Error::ColumnDecode {
            index: "state".to_owned(),
            source: Box::new(e),
        })
}

fn attempt_i32(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}

/// Asks `chime_trigger` for a run of `job` (params as JSON text; `None` for the job's own);
/// returns the run id and whether it was made now (false: the idempotency key's earlier run).
pub(crate) async fn trigger_run(
    pool: &PgPool,
    job: &str,
    params: Option<&str>,
    at: Option<DateTime<Utc>>,
    idempotency_key: Option<&str>,
    actor: &str,
) -> Result<(i64, bool), sqlx::Error> {
    sqlx::query_as(TRIGGER_SQL)
        .bind(job)
        .bind(params)
        .bind(at)
        .bind(idempotency_key)
        .bind(actor)
        .fetch_one(pool)
        .await
}

/// True for a refusal of the worker's database role (42501 `insufficient_privilege`): the run,
/// worker or job is of an executor group the role may not act for (`chime_may_act_for`).
pub(crate) fn is_forbidden(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("42501"))
}

/// A refusal by `chime_invalid` (22023 `invalid_parameter_value`): the field (the error's
/// COLUMN), the value (its DETAIL, `field = value`) and the message with the fix.
pub(crate) struct Refusal {
    pub field: String,
    pub value: Option<String>,
    pub message: String,
}

/// The refusal `error` carries, if it is one of `chime_invalid`'s.
pub(crate) fn refusal(error: &sqlx::Error) -> Option<Refusal> {
    let pg = error
        .as_database_error()?
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
    (pg.code() == "22023").then(|| Refusal {
        field: pg.column().unwrap_or_default().to_owned(),
        value: pg
            .detail()
            .and_then(|d| d.split_once(" = "))
            .map(|(_, v)| v.to_owned()),
        message: pg.message().to_owned(),
    })
}

/// The error of a task call `call` (`chime_map`, `chime_set_output`, `chime_task_results`):
/// a `chime_invalid` refusal is [`TaskError::Invalid`], anything else [`TaskError::Database`].
fn task_error(call: &'static str, source: sqlx::Error) -> TaskError {
    match refusal(&source) {
        Some(r) => TaskError::Invalid {
            field: r.field,
            value: r.value,
            message: r.message,
        },
        None => TaskError::Database { call, source },
    }
}

/// True for errors that say "the database was unreachable, try again", not "your query is wrong".
pub(crate) fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-03: admin/crash shutdown, cannot connect now;
            // 40001/40P01: serialization failure, deadlock (the transaction can simply rerun).
            code.starts_with("08")
                || matches!(&*code, "57P01" | "57P02" | "57P03" | "40001" | "40P01")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chime_protocol::AttemptState;

    #[test]
    fn connection_trouble_is_transient_and_query_mistakes_are_not() {
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::PoolClosed));
        assert!(!is_transient(&sqlx::Error::ColumnNotFound("x".into())));
    }

    /// A database as new as the benchmark's: 3,000 finished runs, 64 running on worker `w`
    /// (with their attempts) and 64 pending, and no statistics (`#[sqlx::test]` databases are
    /// new; autovacuum has not analysed them). Returns the running and the pending run ids.
    async fn unanalysed_runs(pool: &PgPool) -> (Vec<i64>, Vec<i64>) {
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                     worker_id, started_at, finished_at)
             SELECT 'job', 'g', now() - g * interval '1 ms', 'schedule', 'succeeded', 1, 'w',
                    now(), now()
               FROM generate_series(1, 3000) g",
        )
        .execute(pool)
        .await
        .unwrap();
        let running: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                     worker_id, started_at)
             SELECT 'job', 'g', now() + g * interval '1 ms', 'schedule', 'running', 1, 'w', now()
               FROM generate_series(1, 64) g
             RETURNING id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at,
                                         finished_at, duration_ms)
             SELECT id, 1, 'w', CASE WHEN state = 'running' THEN 'running' ELSE 'succeeded' END,
                    now(), CASE WHEN state = 'running' THEN NULL ELSE now() END, 0
               FROM chime_runs",
        )
        .execute(pool)
        .await
        .unwrap();
        let pending: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
             SELECT 'job', 'g', now() + interval '1 hour' + g * interval '1 ms', 'schedule',
                    'pending'
               FROM generate_series(1, 64) g
             RETURNING id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let analysed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stats WHERE tablename IN ('chime_runs', 'chime_attempts')",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(analysed, 0, "the test needs a database without statistics");
        (running, pending)
    }

    /// Sequential scans of `chime_runs` and `chime_attempts` this session has counted and not yet
    /// reported: the current transaction's, and since PostgreSQL 15 also those of the session's
    /// earlier transactions of the last second (a backend reports its counts at most once a
    /// second), so a caller compares two readings in one transaction.
    async fn seq_scans(tx: &mut sqlx::PgConnection) -> i64 {
        sqlx::query_scalar(
            "SELECT coalesce(sum(seq_scan), 0)::bigint FROM pg_stat_xact_user_tables
              WHERE relname IN ('chime_runs', 'chime_attempts')",
        )
        .fetch_one(tx)
        .await
        .unwrap()
    }

    /// The batched claim and outcome write look their rows up by primary key on a database
    /// without statistics: a sequential scan of `chime_runs` or `chime_attempts` per batch (or,
    /// as the planner chose before, per batch row) is what made 512-row batches take seconds.
    /// The statements run inside `chime_claim` and `chime_record_outcomes`, where EXPLAIN does
    /// not reach, so the test counts the scans the transaction made
    /// (`pg_stat_xact_user_tables`, from a reading at its start: the pooled connection may carry
    /// the counts of the setup's statements, which scan), and checks that the count does see a
    /// sequential scan.
    #[sqlx::test(migrations = "../migrations")]
    async fn batch_statements_use_primary_key_lookups_without_statistics(pool: PgPool) {
        let (running, pending) = unanalysed_runs(&pool).await;
        let n = running.len();
        let no_text: Vec<Option<&str>> = vec![None; n];
        let no_time: Vec<Option<DateTime<Utc>>> = vec![None; n];
        let mut tx = pool.begin().await.unwrap();
        let before = seq_scans(&mut tx).await;
        let recorded: Vec<(i64, bool, Option<String>)> = sqlx::query_as(RECORD_MANY_SQL)
            .bind(&running)
            .bind(vec![1_i32; n])
            .bind(vec![AttemptState::Succeeded.as_str(); n])
            .bind(vec![3_i64; n])
            .bind(&no_text)
            .bind(vec![RunState::Succeeded.as_str(); n])
            .bind(&no_text)
            .bind(&no_time)
            .bind("w")
            .bind(Vec::<i64>::new())
            .bind(Vec::<i32>::new())
            .bind(Vec::<DateTime<Utc>>::new())
            .bind(Vec::<&str>::new())
            .bind(Vec::<&str>::new())
            .bind(vec![Some(Utc::now()); n])
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        assert!(
            recorded.iter().all(|(_, written, _)| *written),
            "{recorded:?}"
        );
        let claimed: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(CLAIM_MANY_SQL)
            .bind(&pending)
            .bind(vec![1_i32; n])
            .bind(vec!["job"; n])
            .bind(vec![DateTime::<Utc>::UNIX_EPOCH; n])
            .bind("w")
            .bind("g")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        assert_eq!(claimed.len(), n);
        assert_eq!(
            seq_scans(&mut tx).await - before,
            0,
            "a batch statement scanned chime_runs or chime_attempts"
        );
        sqlx::query("SELECT count(*) FROM chime_runs WHERE error = 'none'")
            .execute(&mut *tx)
            .await
            .unwrap();
        assert_eq!(
            seq_scans(&mut tx).await - before,
            1,
            "the count sees a scan"
        );
    }

    /// Every statement of the module prepares against the migrated schema: a renamed
    /// function, column or parameter type fails here, not in production.
    #[sqlx::test(migrations = "../migrations")]
    async fn every_statement_prepares_against_the_migrated_schema(pool: PgPool) {
        use sqlx::{Executor as _, SqlSafeStr as _};
        let mut conn = pool.acquire().await.unwrap();
        for (name, sql) in STATEMENTS {
            if let Err(e) = (&mut *conn).prepare(sql.into_sql_str()).await {
                panic!("statement {name} does not prepare: {e}\n{sql}");
            }
        }
    }

    fn trigger(run_id: i64, job: &str, attempt: u32) -> Trigger {
        Trigger {
            v: chime_protocol::wire::PROTOCOL_VERSION,
            run_id,
            job: job.to_owned(),
            group: "g".to_owned(),
            attempt,
            scheduled_at: Utc::now(),
            params: serde_json::Value::Null,
            timeout_ms: None,
            retry: None,
            task: None,
        }
    }

    /// One claim is a batch of one: the same runs, claimed one by one and in one batch, end
    /// the same (claimed, or refused for a wrong job, group or attempt, a cancel request or a
    /// finished run), with the same attempt rows.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_claim_alone_ends_as_the_same_claim_in_a_batch(pool: PgPool) {
        let store = Store::new(pool.clone(), Duration::ZERO);
        // (job the trigger names, attempt it claims, run state, cancel requested)
        let cases: [(&str, i32, &str, bool); 7] = [
            ("job", 1, "pending", false),
            ("job", 1, "queued", false),
            ("job", 3, "retrying", false),
            ("other", 1, "pending", false),
            ("job", 2, "pending", false),
            ("job", 1, "pending", true),
            ("job", 1, "succeeded", false),
        ];
        let mut twins = Vec::new();
        for (_, attempt, state, cancel) in cases {
            let mut pair = Vec::new();
            for _ in 0..2 {
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                             attempt, cancel_requested_at)
                     VALUES ('job', 'g', now(), 'manual', $1, $2,
                             CASE WHEN $3 THEN now() END)
                     RETURNING id",
                )
                .bind(state)
                .bind(if state == "retrying" {
                    attempt - 1
                } else {
                    0_i32
                })
                .bind(cancel)
                .fetch_one(&pool)
                .await
                .unwrap();
                pair.push(id);
            }
            twins.push((pair[0], pair[1]));
        }
        let mut alone = Vec::new();
        for (&(job, attempt, ..), &(id, _)) in cases.iter().zip(&twins) {
            let claim = store
                .claim(
                    &trigger(id, job, u32::try_from(attempt).unwrap()),
                    "w",
                    "g",
                    None,
                    false,
                )
                .await
                .unwrap();
            alone.push(matches!(claim, Claim::Claimed { .. }));
        }
        let batch: Vec<ClaimRequest> = cases
            .iter()
            .zip(&twins)
            .map(|(&(job, attempt, ..), &(_, id))| ClaimRequest {
                run_id: id,
                attempt,
                job: job.to_owned(),
                starts_at: None,
            })
            .collect();
        let claimed = store.claim_many(&batch, "w", "g").await.unwrap();
        let in_batch: Vec<bool> = twins
            .iter()
            .map(|(_, id)| claimed.iter().any(|(c, _)| c == id))
            .collect();
        assert_eq!(alone, in_batch);
        assert_eq!(alone, [true, true, true, false, false, false, false]);
        let row = |id: i64| {
            sqlx::query_as::<_, (String, i32, Option<String>, i64)>(
                "SELECT r.state, r.attempt, r.worker_id,
                        (SELECT count(*) FROM chime_attempts a WHERE a.run_id = r.id)
                   FROM chime_runs r WHERE r.id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
        };
        for (a, b) in twins {
            assert_eq!(
                row(a).await.unwrap(),
                row(b).await.unwrap(),
                "runs {a} and {b}"
            );
        }
        // The wrong group is refused alone and in a batch alike.
        let id = pending_run(&pool).await;
        let refused = store
            .claim(&trigger(id, "job", 1), "w", "h", None, false)
            .await
            .unwrap();
        assert!(matches!(refused, Claim::Refused(Some(_))), "{refused:?}");
    }

    async fn pending_run(pool: &PgPool) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
             VALUES ('job', 'g', now(), 'manual', 'pending') RETURNING id",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// The take-over decides retry-or-dead from the run's retry policy snapshot, taken when
    /// the run was inserted, not from the job's definition as it is now.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_take_over_decides_from_the_runs_retry_snapshot(pool: PgPool) {
        let store = Store::new(pool.clone(), Duration::ZERO);
        sqlx::query(
            "INSERT INTO chime_jobs (name, group_name, spec)
             VALUES ('job', 'g', '{\"retry\": {\"max_attempts\": 2}}')",
        )
        .execute(&pool)
        .await
        .unwrap();
        let mut runs = Vec::new();
        for _ in 0..2 {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                         attempt, worker_id, started_at)
                 VALUES ('job', 'g', now(), 'manual', 'running', 2, 'gone', now())
                 RETURNING id",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO chime_attempts (run_id, attempt, worker_id, state)
                 VALUES ($1, 2, 'gone', 'running')",
            )
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
            runs.push(id);
        }
        // The job now allows five attempts; the runs keep the two they were made with.
        sqlx::query("UPDATE chime_jobs SET spec = '{\"retry\": {\"max_attempts\": 5}}'")
            .execute(&pool)
            .await
            .unwrap();
        let take = |run_id| TakeOver {
            run_id,
            job: "job",
            attempt: 2,
            lost_worker: "gone",
            lost_error: "worker gone lost",
            require_lost: true,
            delivery_limit: 5,
            dead_reason: None,
        };
        assert_eq!(
            store.take_over(&take(runs[0]), "w").await.unwrap(),
            TakenOver::Dead {
                reason: "worker lost on the last attempt (2 of 2)".to_owned()
            }
        );
        // A run whose snapshot allows more attempts is claimed as its next attempt.
        sqlx::query("UPDATE chime_runs SET retry_policy = '{\"max_attempts\": 3}' WHERE id = $1")
            .bind(runs[1])
            .execute(&pool)
            .await
            .unwrap();
        let taken = store.take_over(&take(runs[1]), "w").await.unwrap();
        assert!(
            matches!(taken, TakenOver::Claimed { attempt: 3, .. }),
            "{taken:?}"
        );
        // Taken over once: a second take-over of the same attempt is refused.
        assert_eq!(
            store.take_over(&take(runs[1]), "w").await.unwrap(),
            TakenOver::Refused
        );
    }

    /// Liveness: a worker is online while not stopped and its heartbeat is within three of
    /// its own intervals; a refused claim reports its holder lost otherwise, or unregistered.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_worker_is_lost_after_three_of_its_intervals_or_when_stopped(pool: PgPool) {
        let store = Store::new(pool.clone(), Duration::ZERO);
        // (worker, heartbeat age in ms, interval in ms, stopped)
        let workers = [
            ("fresh", 2_000, 1_000, false),
            ("stale", 3_500, 1_000, false),
            ("stopped", 0, 1_000, true),
        ];
        for (id, age, interval, stopped) in workers {
            sqlx::query(
                "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs,
                                            heartbeat_interval_ms, heartbeat_at, stopped_at)
                 VALUES ($1, 'g', 'h', 1, '{job}', $3,
                         now() - $2 * interval '1 millisecond', CASE WHEN $4 THEN now() END)",
            )
            .bind(id)
            .bind(age)
            .bind(interval)
            .bind(stopped)
            .execute(&pool)
            .await
            .unwrap();
        }
        for (holder, lost) in [
            ("fresh", false),
            ("stale", true),
            ("stopped", true),
            ("unregistered", true),
        ] {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                         attempt, worker_id, started_at)
                 VALUES ('job', 'g', now(), 'manual', 'running', 1, $1, now() - interval '1 h')
                 RETURNING id",
            )
            .bind(holder)
            .fetch_one(&pool)
            .await
            .unwrap();
            let snapshot = store.snapshot(id).await.unwrap().unwrap();
            assert_eq!(snapshot.worker_lost, lost, "holder {holder}");
        }
        assert!(store.handled_elsewhere("g", "job", "me").await.unwrap());
        assert!(!store.handled_elsewhere("g", "job", "fresh").await.unwrap());
    }

    /// A run to insert for [`insert_run`]: of `job` in `state` (ended now when the state is
    /// final, with `output` and `error`); a node run of workflow run `node.0` as node
    /// `node.1`, round `node.2` (trigger `workflow`) when `node` is given, else a manual run;
    /// `parent` makes it a task (`shard/0`) of that run, `upstream` a child run of that one.
    #[derive(Default)]
    struct RunRow<'a> {
        job: &'a str,
        state: &'a str,
        node: Option<(i64, &'a str, i32)>,
        parent: Option<i64>,
        upstream: Option<i64>,
        output: Option<Value>,
        error: Option<&'a str>,
    }

    async fn insert_run(pool: &PgPool, run: RunRow<'_>) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, params,
                                     workflow_run_id, node, node_round, parent_id, task_key,
                                     task_kind, shard_index, upstream_run_id, output, error,
                                     started_at, finished_at)
             VALUES ($1, 'g', now(), CASE WHEN $3::bigint IS NULL AND $6::bigint IS NULL
                                          THEN 'manual' ELSE 'workflow' END,
                     $2, 'null', $3, $4, $5, $6,
                     CASE WHEN $6::bigint IS NULL THEN NULL ELSE 'shard/0' END,
                     CASE WHEN $6::bigint IS NULL THEN NULL ELSE 'shard' END,
                     CASE WHEN $6::bigint IS NULL THEN NULL ELSE 0 END,
                     $7, $8::text::jsonb, $9, now(),
                     CASE WHEN chime_run_ended($2) THEN now() END)
             RETURNING id",
        )
        .bind(run.job)
        .bind(run.state)
        .bind(run.node.map(|n| n.0))
        .bind(run.node.map(|n| n.1))
        .bind(run.node.map(|n| n.2))
        .bind(run.parent)
        .bind(run.upstream)
        .bind(run.output.map(|o| o.to_string()))
        .bind(run.error)
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// `chime_upstream_runs` through the store: a node run reads each other node's latest
    /// ended round by name (a node not ended, its own node and an unknown name read none), a
    /// task of it (as `chime_expand_run` makes one: trigger `workflow`, no node) reads the
    /// same, and the child job's row (`node` NULL) is `parent`'s alone, here of a node run
    /// given an upstream run too, to show the rows are told apart by node.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_node_run_reads_the_other_nodes_by_name_and_parent_the_child_row(pool: PgPool) {
        use serde_json::json;
        let store = Store::new(pool.clone(), Duration::ZERO);
        let run = |job, state| RunRow {
            job,
            state,
            ..RunRow::default()
        };
        let export = insert_run(&pool, run("export", "succeeded")).await;
        let wf = insert_run(&pool, run("nightly-etl", "running")).await;
        let node = |job, state, node, round| RunRow {
            node: Some((wf, node, round)),
            ..run(job, state)
        };
        let first = RunRow {
            output: Some(json!({"rows": 1})),
            error: Some("timed out"),
            ..node("extract-orders", "failed", "extract", 1)
        };
        let first = insert_run(&pool, first).await;
        let extract = RunRow {
            output: Some(json!({"rows": 1200, "city": "Zürich"})),
            ..node("extract-orders", "succeeded", "extract", 2)
        };
        let extract = insert_run(&pool, extract).await;
        let skipped = insert_run(&pool, node("page-oncall", "skipped", "alert", 1)).await;
        insert_run(&pool, node("clean-orders", "running", "clean", 1)).await;
        let load = RunRow {
            upstream: Some(export),
            ..node("load-warehouse", "running", "load", 1)
        };
        let load = insert_run(&pool, load).await;
        let task = RunRow {
            parent: Some(load),
            ..run("load-warehouse", "running")
        };
        let task = insert_run(&pool, task).await;
        assert!(first < extract);

        for reader in [load, task] {
            let got = store
                .upstream(reader, Some("extract"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (got.run_id, got.job.as_str(), got.state, got.node.as_deref()),
                (
                    extract,
                    "extract-orders",
                    RunState::Succeeded,
                    Some("extract")
                ),
                "reader {reader}"
            );
            assert_eq!(got.output, Some(json!({"rows": 1200, "city": "Zürich"})));
            assert_eq!(got.error, None);
            assert!(got.finished_at.is_some());
            let alert = store
                .upstream(reader, Some("alert"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!((alert.run_id, alert.state), (skipped, RunState::Skipped));
            for none in ["clean", "load", "nope", ""] {
                assert_eq!(
                    store.upstream(reader, Some(none)).await.unwrap(),
                    None,
                    "{none}"
                );
            }
            let parent = store.upstream(reader, None).await.unwrap().unwrap();
            assert_eq!(
                (parent.run_id, parent.job.as_str(), parent.node),
                (export, "export", None)
            );
        }
        // Runs of no workflow read no node, and a workflow run itself none of its nodes.
        for run in [export, wf, 1 << 50] {
            assert_eq!(store.upstream(run, Some("extract")).await.unwrap(), None);
            assert_eq!(store.upstream(run, None).await.unwrap(), None);
        }
    }
}
