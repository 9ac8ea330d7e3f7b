//! Everything the worker writes to PostgreSQL: the claim, attempt outcomes, run log lines, dead
//! runs and the worker registry. The only module of the SDK that speaks SQL.
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
use sqlx::{Connection, PgConnection, PgPool, Postgres, Row};

use crate::context::LogLine;
use crate::outcome::{Outcome, RunEnd};

/// The run as a refused claim explains it, with its worker's liveness: a worker is lost when its
/// heartbeat is older than three of its own intervals, it has stopped, or it never registered.
macro_rules! run_snapshot_select {
    () => {
        "r.job_name, r.group_name, r.state, r.attempt, r.worker_id, r.reason, r.error, r.next_attempt_at,
       r.cancel_requested_at IS NOT NULL AS cancel_requested,
       w.heartbeat_interval_ms,
       coalesce(r.started_at < w.started_at, false) AS holder_restarted,
       (w.id IS NULL OR w.stopped_at IS NOT NULL
        OR w.heartbeat_at < now() - 3 * w.heartbeat_interval_ms * interval '1 millisecond')
           AS worker_lost
  FROM chime_runs r
  LEFT JOIN chime_workers w ON w.id = r.worker_id
 WHERE r.id = $1"
    };
}

/// The claim, in one statement: move the run to `running` for this attempt and insert the
/// attempt row, only if the run is of this job (`$4`) and group (`$6`), waiting (`pending`,
/// `queued`, `retrying`), nobody asked to cancel it, and this attempt is the one after the run's
/// last (every publisher, the scheduler's outbox and a worker's retry alike, publishes the run's
/// attempt + 1; a trigger that skips ahead is forged or corrupt). The trailing SELECT reads the run
/// as it was *before* the update (data-modifying CTEs are invisible to the outer query), so a
/// refused claim says why. `claim_clock` is the database clock at the statement's start (the
/// run's `started_at` estimate is the instant instead for a claim ahead of it): the worker
/// dates its handler's real start from it ([`ClaimClock`]). A claim that comes before the
/// leader's mark of the published trigger (the usual case: the delivery races the confirm)
/// records `published_at` itself, so the mark leaves the row alone instead of writing a second
/// version of it (docs/runs.md).
const CLAIM_SQL: &str = concat!(
    "WITH claimed AS (
    UPDATE chime_runs
       SET state = 'running', attempt = $2, worker_id = $3, started_at = greatest(now(), $5),
           finished_at = NULL, error = NULL, reason = NULL, next_attempt_at = NULL,
           published_at = coalesce(published_at, now())
     WHERE id = $1 AND job_name = $4 AND group_name = $6
       AND state IN ('pending', 'queued', 'retrying')
       AND cancel_requested_at IS NULL
       AND attempt = $2 - 1
    RETURNING id, started_at
), attempt_row AS (
    INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at)
    SELECT id, $2, $3, 'running', started_at FROM claimed
)
SELECT (SELECT started_at FROM claimed) AS claimed_at, statement_timestamp() AS claim_clock,
       ",
    run_snapshot_select!()
);

/// The claim of several deliveries at once: the same conditions as [`CLAIM_SQL`], one row of
/// input per delivery (`$1` run ids, `$2` attempts, `$3` jobs, `$4` start instants or the
/// epoch, `$5` worker id, `$6` the worker's group); returns the ids claimed, each with the
/// database clock at the statement's start (`claim_clock`, as [`CLAIM_SQL`] returns it). The rows are locked in id order first, as
/// the leader's mark of published runs does, so two multi-row statements never deadlock (each
/// deadlock cost a second: PostgreSQL's `deadlock_timeout`).
///
/// Every row is found by its primary key, whatever the table's statistics say (see
/// [`RECORD_MANY_SQL`] for how).
const CLAIM_MANY_SQL: &str = "WITH input AS MATERIALIZED (
    SELECT * FROM UNNEST($1::bigint[], $2::int[], $3::text[], $4::timestamptz[])
        AS i(id, attempt, job, starts_at)
), found AS MATERIALIZED (
    SELECT i.* FROM (SELECT * FROM input ORDER BY id) i
     CROSS JOIN LATERAL (
         SELECT FROM chime_runs r
          WHERE r.id = i.id AND r.job_name = i.job AND r.group_name = $6
            AND r.state IN ('pending', 'queued', 'retrying')
            AND r.cancel_requested_at IS NULL
            AND r.attempt = i.attempt - 1
            FOR UPDATE
     ) r
), claimed AS (
    UPDATE chime_runs r
       SET state = 'running', attempt = f.attempt, worker_id = $5,
           started_at = greatest(now(), f.starts_at),
           finished_at = NULL, error = NULL, reason = NULL, next_attempt_at = NULL,
           published_at = coalesce(r.published_at, now())
      FROM found f
     WHERE r.id = ANY (ARRAY[f.id])
    RETURNING r.id, r.attempt, r.started_at
), attempt_rows AS (
    INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at)
    SELECT id, attempt, $5, 'running', started_at FROM claimed
)
SELECT id, statement_timestamp() AS claim_clock FROM claimed";

/// The outcomes of several attempts at once, in one statement: the same writes and fences as
/// [`Store::record_outcome`] (the attempt row only while it is `running` on this worker; the
/// run row only while it is `running` this attempt on this worker; `cancelled` instead of
/// `retrying` or `dead` when an operator asked to cancel meanwhile; log lines only with a
/// recorded attempt), one row of input per attempt (`$1` run ids, `$2` attempts, `$3` attempt
/// states, `$4` durations in ms, `$5` errors, `$6` run states, `$7` dead reasons, `$8` next
/// attempt instants, `$9` worker id; log lines flattened in `$10`–`$14`; `$15` the handlers'
/// starts, see [`AttemptRecord::started_at`]). The run rows are
/// locked in id order, each before its attempt row, as the batched claim, the leader's mark of
/// published runs and the rescuer (runs, then attempts) lock them, so none of these statements
/// deadlock with another. Returns, per input run, whether its attempt row was written and the
/// run's new state (NULL when the run had moved on).
///
/// **Primary-key lookups whatever the statistics.** A new database has no statistics until
/// autovacuum analyses it (`reltuples = -1`); the planner then takes `worker_id = … AND state
/// = 'running'` for a filter that leaves one row and joins the batch to a sequential scan of
/// the table in a nested loop: table size × batch size, seconds per batch (docs/benchmarks.md).
/// So the statement leaves the planner no such choice: `found` walks the batch in id order and
/// looks each row up in a `LATERAL` subquery with `FOR UPDATE`, which PostgreSQL cannot flatten
/// into a join (one index scan per row, and the locks taken in that order); the conditions on
/// the rows are checked there, under the lock. The updates then join `found` with `r.id = ANY
/// (ARRAY[f.run_id])`, a condition a hash or merge join cannot use, so the only plan that is
/// not a scan per batch row is an index lookup per batch row.
const RECORD_MANY_SQL: &str = "WITH input AS MATERIALIZED (
    SELECT * FROM UNNEST($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::text[],
                         $6::text[], $7::text[], $8::timestamptz[], $15::timestamptz[])
        AS i(run_id, attempt, attempt_state, duration_ms, error, run_state, reason, next_at,
             started)
), found AS MATERIALIZED (
    SELECT i.*, r.run_ours, r.cancel_requested, a.ours IS NOT NULL AS attempt_ours
      FROM (SELECT * FROM input ORDER BY run_id) i
     CROSS JOIN LATERAL (
         SELECT r.attempt = i.attempt AND r.worker_id = $9 AND r.state = 'running' AS run_ours,
                r.cancel_requested_at IS NOT NULL AS cancel_requested
           FROM chime_runs r WHERE r.id = i.run_id FOR UPDATE
     ) r
      LEFT JOIN LATERAL (
         SELECT true AS ours FROM chime_attempts a
          WHERE a.run_id = i.run_id AND a.attempt = i.attempt
            AND a.worker_id = $9 AND a.state = 'running'
            FOR UPDATE
     ) a ON true
), attempts AS (
    UPDATE chime_attempts a
       SET state = f.attempt_state, duration_ms = f.duration_ms, error = f.error,
           started_at = coalesce(f.started, a.started_at),
           finished_at = coalesce(f.started, a.started_at)
                         + f.duration_ms::float8 * interval '1 millisecond'
      FROM found f
     WHERE a.run_id = ANY (ARRAY[f.run_id]) AND a.attempt = ANY (ARRAY[f.attempt]) AND f.attempt_ours
    RETURNING a.run_id, a.started_at, a.finished_at
), runs AS (
    UPDATE chime_runs r
       SET state = CASE WHEN f.run_state IN ('retrying', 'dead') AND f.cancel_requested
                        THEN 'cancelled' ELSE f.run_state END,
           started_at = a.started_at,
           finished_at = CASE WHEN f.run_state = 'retrying' AND NOT f.cancel_requested
                              THEN NULL ELSE a.finished_at END,
           error = f.error,
           reason = CASE WHEN f.run_state = 'dead' AND NOT f.cancel_requested
                         THEN f.reason ELSE r.reason END,
           next_attempt_at = CASE WHEN f.run_state = 'retrying' AND NOT f.cancel_requested
                                  THEN f.next_at END
      FROM found f JOIN attempts a ON a.run_id = f.run_id
     WHERE r.id = ANY (ARRAY[f.run_id]) AND f.run_ours
    RETURNING r.id, r.state
), logs AS (
    INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
    SELECT l.run_id, l.attempt, l.at, l.level, l.message
      FROM UNNEST($10::bigint[], $11::int[], $12::timestamptz[], $13::text[], $14::text[])
               WITH ORDINALITY AS l(run_id, attempt, at, level, message, n)
      JOIN attempts a ON a.run_id = l.run_id
     ORDER BY l.n
)
SELECT i.run_id, a.run_id IS NOT NULL AS attempt_recorded, r.state AS run_state
  FROM input i
  LEFT JOIN attempts a ON a.run_id = i.run_id
  LEFT JOIN runs r ON r.id = i.run_id";

/// Whether an outcome that found its attempt no longer `running` was written by this very
/// worker with this very outcome (a commit whose reply was lost), and the run's state then.
const OWN_RECORD_SQL: &str = "SELECT r.attempt = a.attempt AND r.worker_id = a.worker_id
           AND r.state <> 'running' AS run_recorded,
       r.state
  FROM chime_attempts a JOIN chime_runs r ON r.id = a.run_id
 WHERE a.run_id = $1 AND a.attempt = $2 AND a.worker_id = $3 AND a.state = $4
   AND a.duration_ms = $5 AND a.error IS NOT DISTINCT FROM $6";

/// One finished attempt of a batch, for [`Store::record_outcomes`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutcomeRow<'a> {
    pub run_id: i64,
    pub attempt: u32,
    pub record: AttemptRecord<'a>,
}

/// `persistent` for the multi-row statements: false, so PostgreSQL plans each execution for
/// its actual arrays. A prepared statement switches to a generic plan after five executions,
/// which guesses ten rows per array and joins the locked rows in a nested loop: quadratic in
/// the batch (512 rows: 110 ms instead of 6 ms), so the busier the worker, the slower each
/// batch, and the longer the rows stay locked against the leader's marks.
const CUSTOM_PLAN: bool = false;

/// One delivery's claim, for [`Store::claim_many`].
#[derive(Debug, Clone)]
pub(crate) struct ClaimRequest {
    pub run_id: i64,
    pub attempt: i32,
    pub job: String,
    pub starts_at: Option<DateTime<Utc>>,
}

/// The run as it is, without claiming it.
const SNAPSHOT_SQL: &str = concat!(
    "SELECT NULL::timestamptz AS claimed_at,
       ",
    run_snapshot_select!()
);

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
    /// The run's worker is lost (see [`run_snapshot_select`]); meaningless without a worker.
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
    /// Dead instead of a new attempt when the lost attempt was the last the job's retry policy
    /// allows: a lost attempt counts like a failed one (the rescuer decides the same way).
    pub max_attempts: u32,
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
            // Planned for its arrays each time: see [`CUSTOM_PLAN`].
            .persistent(CUSTOM_PLAN)
            .fetch_all(&mut *conn)
            .await?;
        Ok(claimed
            .into_iter()
            .map(|(id, db)| (id, ClaimClock { db, sent }))
            .collect())
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
    /// attempt for `worker_id`, or ends the run `dead` (delivery limit) or `cancelled`
    /// (requested). Fenced like an outcome: only while that attempt is still `running` on the
    /// lost worker, so two workers racing for a take-over cannot both win.
    pub(crate) async fn take_over(
        &self,
        t: &TakeOver<'_>,
        worker_id: &str,
    ) -> Result<TakenOver, sqlx::Error> {
        let attempt = attempt_i32(t.attempt);
        self.retrying("taking over a run from a lost worker", |_| async move {
            let mut tx = self.pool.begin().await?;
            let marked = sqlx::query(
                "UPDATE chime_attempts a
                    SET state = 'lost', error = $4, finished_at = now(),
                        duration_ms = greatest(0, (extract(epoch FROM now() - a.started_at) * 1000)::bigint)
                  WHERE a.run_id = $1 AND a.attempt = $2 AND a.worker_id = $3 AND a.state = 'running'
                    AND (NOT $5 OR NOT EXISTS (
                        SELECT 1 FROM chime_workers w
                         WHERE w.id = $3 AND w.stopped_at IS NULL
                           AND w.heartbeat_at >= now() - 3 * w.heartbeat_interval_ms * interval '1 millisecond'))",
            )
            .bind(t.run_id)
            .bind(attempt)
            .bind(t.lost_worker)
            .bind(t.lost_error)
            .bind(t.require_lost)
            .execute(&mut *tx)
            .await?;
            if marked.rows_affected() == 0 {
                return Ok(TakenOver::Refused);
            }
            let cancel_requested: Option<bool> = sqlx::query_scalar(
                "SELECT cancel_requested_at IS NOT NULL FROM chime_runs
                  WHERE id = $1 AND job_name = $2 AND state = 'running' AND attempt = $3
                    AND worker_id = $4
                    FOR UPDATE",
            )
            .bind(t.run_id)
            .bind(t.job)
            .bind(attempt)
            .bind(t.lost_worker)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(cancel_requested) = cancel_requested else {
                return Ok(TakenOver::Refused); // rolled back: the run is not where we thought
            };
            let lost: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM chime_attempts WHERE run_id = $1 AND state = 'lost'",
            )
            .bind(t.run_id)
            .fetch_one(&mut *tx)
            .await?;
            let dead_reason = t
                .dead_reason
                .clone()
                .or_else(|| {
                    (lost >= i64::from(t.delivery_limit)).then(|| {
                        format!(
                            "delivery limit reached: {lost} attempts were lost with their \
                             workers (limit {}), the last on worker {}; a handler that crashes \
                             its worker?",
                            t.delivery_limit, t.lost_worker
                        )
                    })
                })
                .or_else(|| {
                    (t.attempt >= t.max_attempts).then(|| {
                        format!(
                            "worker lost on the last attempt ({} of {})",
                            t.attempt, t.max_attempts
                        )
                    })
                });
            let taken = if cancel_requested {
                sqlx::query(
                    "UPDATE chime_runs SET state = 'cancelled', finished_at = now(), error = $2
                      WHERE id = $1",
                )
                .bind(t.run_id)
                .bind(format!("cancelled by an operator; {}", t.lost_error))
                .execute(&mut *tx)
                .await?;
                TakenOver::Cancelled
            } else if let Some(reason) = dead_reason {
                sqlx::query(
                    "UPDATE chime_runs
                        SET state = 'dead', reason = $2, error = $3, finished_at = now(),
                            next_attempt_at = NULL
                      WHERE id = $1",
                )
                .bind(t.run_id)
                .bind(&reason)
                .bind(t.lost_error)
                .execute(&mut *tx)
                .await?;
                TakenOver::Dead { reason }
            } else {
                let next = attempt.saturating_add(1);
                let sent = Instant::now();
                let db: DateTime<Utc> = sqlx::query_scalar(
                    "WITH claimed AS (
                         UPDATE chime_runs
                            SET state = 'running', attempt = $2, worker_id = $3, started_at = now(),
                                finished_at = NULL, error = NULL, next_attempt_at = NULL
                          WHERE id = $1
                         RETURNING id, started_at
                     )
                     INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at)
                     SELECT id, $2, $3, 'running', started_at FROM claimed
                     RETURNING statement_timestamp()",
                )
                .bind(t.run_id)
                .bind(next)
                .bind(worker_id)
                .fetch_one(&mut *tx)
                .await?;
                TakenOver::Claimed {
                    attempt: u32::try_from(next).unwrap_or(u32::MAX),
                    clock: ClaimClock { db, sent },
                }
            };
            tx.commit().await?;
            Ok(taken)
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
        self.retrying("storing run log lines", |_| async move {
            insert_logs(&self.pool, run_id, attempt, lines).await
        })
        .await
    }

    /// Records a finished attempt: attempt row, run row and the remaining log lines, in one
    /// transaction. `started_at` becomes the handler's real start ([`AttemptRecord::started_at`])
    /// and `finished_at` is `started_at + duration` (a monotonic duration measured by the worker
    /// added to the DB clock's start), so a delayed write does not stretch the run.
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
        let AttemptRecord {
            outcome,
            next_attempt_at,
            duration,
            lines,
            started_at,
        } = *record;
        let reason = match &outcome.run {
            RunEnd::Dead { reason } => Some(reason.as_str()),
            _ => None,
        };
        let attempt_no = attempt_i32(attempt);
        let duration_ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        self.retrying("recording an attempt's outcome", |retry| async move {
            let mut tx = self.pool.begin().await?;
            let times: Option<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
                "UPDATE chime_attempts
                    SET state = $4, duration_ms = $5, error = $6,
                        started_at = coalesce($7, started_at),
                        finished_at = coalesce($7, started_at) + $5::float8 * interval '1 millisecond'
                  WHERE run_id = $1 AND attempt = $2 AND worker_id = $3 AND state = 'running'
                 RETURNING started_at, finished_at",
            )
            .bind(run_id)
            .bind(attempt_no)
            .bind(worker_id)
            .bind(outcome.attempt.as_str())
            .bind(duration_ms)
            .bind(outcome.error.as_deref())
            .bind(started_at)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((started_at, finished_at)) = times else {
                if retry > 0 || maybe_ours {
                    let own: Option<(bool, String)> = sqlx::query_as(OWN_RECORD_SQL)
                        .bind(run_id)
                        .bind(attempt_no)
                        .bind(worker_id)
                        .bind(outcome.attempt.as_str())
                        .bind(duration_ms)
                        .bind(outcome.error.as_deref())
                        .fetch_optional(&mut *tx)
                        .await?;
                    match own {
                        Some((true, state)) => {
                            return Ok(Recorded::Both(run_state(&state)?));
                        }
                        Some((false, _)) => return Ok(Recorded::AttemptOnly),
                        None => {}
                    }
                }
                return Ok(Recorded::Nothing);
            };
            let state: Option<String> = sqlx::query_scalar(
                "UPDATE chime_runs
                    SET state = CASE WHEN $4 IN ('retrying', 'dead') AND cancel_requested_at IS NOT NULL
                                     THEN 'cancelled' ELSE $4 END,
                        finished_at = CASE WHEN $4 = 'retrying' AND cancel_requested_at IS NULL
                                           THEN NULL ELSE $5 END,
                        error = $6,
                        reason = CASE WHEN $4 = 'dead' AND cancel_requested_at IS NULL
                                      THEN $7 ELSE reason END,
                        next_attempt_at = CASE WHEN $4 = 'retrying' AND cancel_requested_at IS NULL
                                               THEN $8 END,
                        started_at = $9
                  WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND state = 'running'
                 RETURNING state",
            )
            .bind(run_id)
            .bind(attempt_no)
            .bind(worker_id)
            .bind(outcome.run.state().as_str())
            .bind(finished_at)
            .bind(outcome.error.as_deref())
            .bind(reason)
            .bind(next_attempt_at)
            .bind(started_at)
            .fetch_optional(&mut *tx)
            .await?;
            insert_logs(&mut *tx, run_id, attempt, lines).await?;
            tx.commit().await?;
            Ok(match state {
                Some(state) => Recorded::Both(run_state(&state)?),
                None => Recorded::AttemptOnly,
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
            durations.push(i64::try_from(row.record.duration.as_millis()).unwrap_or(i64::MAX));
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
            .persistent(CUSTOM_PLAN)
            .fetch_all(&self.pool)
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
            let done = sqlx::query(
                "UPDATE chime_runs
                    SET state = 'dead', reason = $3, error = $3, worker_id = $4, finished_at = now()
                  WHERE id = $1 AND group_name = $2 AND state IN ('pending', 'queued', 'retrying')
                    AND job_name = $5 AND attempt = $6 - 1",
            )
            .bind(run_id)
            .bind(group)
            .bind(reason)
            .bind(worker_id)
            .bind(job)
            .bind(attempt)
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Whether a worker of `group` other than `worker_id` is online and declares a handler for
    /// `job`. Online as the scheduler counts it: not stopped, and a heartbeat within three of its
    /// own intervals.
    pub(crate) async fn handled_elsewhere(
        &self,
        group: &str,
        job: &str,
        worker_id: &str,
    ) -> Result<bool, sqlx::Error> {
        self.retrying("looking for a worker with the handler", |_| async move {
            sqlx::query_scalar(
                "SELECT EXISTS (
                     SELECT 1 FROM chime_workers
                      WHERE group_name = $1 AND id <> $3 AND $2 = ANY (jobs)
                        AND stopped_at IS NULL
                        AND heartbeat_at >= now()
                            - 3 * heartbeat_interval_ms * interval '1 millisecond')",
            )
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
            let done = sqlx::query(
                "UPDATE chime_runs SET reason = $3
                  WHERE id = $1 AND group_name = $2 AND state IN ('pending', 'queued', 'retrying')
                    AND job_name = $4 AND attempt = $5 - 1 AND cancel_requested_at IS NULL",
            )
            .bind(run_id)
            .bind(group)
            .bind(reason)
            .bind(job)
            .bind(attempt)
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    /// Registers (or re-registers) the worker as running.
    pub(crate) async fn register_worker(&self, w: &WorkerRow<'_>) -> Result<(), sqlx::Error> {
        self.retrying("registering the worker", |_| async move {
            sqlx::query(
                "INSERT INTO chime_workers
                        (id, group_name, hostname, capacity, jobs, heartbeat_interval_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (id) DO UPDATE
                    SET group_name = EXCLUDED.group_name, hostname = EXCLUDED.hostname,
                        capacity = EXCLUDED.capacity, jobs = EXCLUDED.jobs,
                        heartbeat_interval_ms = EXCLUDED.heartbeat_interval_ms,
                        started_at = now(), heartbeat_at = now(), stopped_at = NULL",
            )
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
            sqlx::query("UPDATE chime_workers SET heartbeat_at = now() WHERE id = $1")
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
            sqlx::query(
                "UPDATE chime_workers SET stopped_at = now(), heartbeat_at = now() WHERE id = $1",
            )
            .bind(worker_id)
            .execute(&self.pool)
            .await
            .map(drop)
        })
        .await
    }
}

/// Batched insert of log lines: one statement whatever the count, in their original order.
async fn insert_logs<'e, E>(
    executor: E,
    run_id: i64,
    attempt: u32,
    lines: &[LogLine],
) -> Result<(), sqlx::Error>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    if lines.is_empty() {
        return Ok(());
    }
    let at: Vec<DateTime<Utc>> = lines.iter().map(|l| l.at).collect();
    let level: Vec<&str> = lines.iter().map(|l| l.level.as_str()).collect();
    let message: Vec<&str> = lines.iter().map(|l| l.message.as_str()).collect();
    sqlx::query(
        "INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
         SELECT $1, $2, l.at, l.level, l.message
           FROM UNNEST($3::timestamptz[], $4::text[], $5::text[])
                WITH ORDINALITY AS l(at, level, message, n)
          ORDER BY l.n",
    )
    .bind(run_id)
    .bind(attempt_i32(attempt))
    .bind(at)
    .bind(level)
    .bind(message)
    .execute(executor)
    .await
    .map(drop)
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

    /// The relations a plan reads with a sequential scan.
    fn seq_scans(plan: &serde_json::Value, found: &mut Vec<String>) {
        if plan["Node Type"] == "Seq Scan" {
            found.push(plan["Relation Name"].as_str().unwrap_or("?").to_owned());
        }
        for child in plan["Plans"].as_array().into_iter().flatten() {
            seq_scans(child, found);
        }
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

    /// The batched claim and outcome write look their rows up by primary key on a database
    /// without statistics: a sequential scan of `chime_runs` or `chime_attempts` per batch (or,
    /// as the planner chose before, per batch row) is what made 512-row batches take seconds.
    #[sqlx::test(migrations = "../migrations")]
    async fn batch_statements_use_primary_key_lookups_without_statistics(pool: PgPool) {
        let (running, pending) = unanalysed_runs(&pool).await;
        let n = running.len();
        let explain = |sql: &str| format!("EXPLAIN (FORMAT JSON) {sql}");
        let no_text: Vec<Option<&str>> = vec![None; n];
        let no_time: Vec<Option<DateTime<Utc>>> = vec![None; n];
        let record_plan: serde_json::Value =
            sqlx::query_scalar(sqlx::AssertSqlSafe(explain(RECORD_MANY_SQL)))
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
                .persistent(CUSTOM_PLAN)
                .fetch_one(&pool)
                .await
                .unwrap();
        let claim_plan: serde_json::Value =
            sqlx::query_scalar(sqlx::AssertSqlSafe(explain(CLAIM_MANY_SQL)))
                .bind(&pending)
                .bind(vec![1_i32; n])
                .bind(vec!["job"; n])
                .bind(vec![DateTime::<Utc>::UNIX_EPOCH; n])
                .bind("w")
                .bind("g")
                .persistent(CUSTOM_PLAN)
                .fetch_one(&pool)
                .await
                .unwrap();
        for (what, plan) in [("outcome", record_plan), ("claim", claim_plan)] {
            let mut scanned = Vec::new();
            seq_scans(&plan[0]["Plan"], &mut scanned);
            scanned.retain(|table| table.starts_with("chime_"));
            assert!(
                scanned.is_empty(),
                "the batched {what} statement scans {scanned:?}: {plan:#}"
            );
        }
    }
}
