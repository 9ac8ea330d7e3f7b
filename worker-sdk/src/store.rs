//! Everything the worker writes to PostgreSQL: the claim, attempt outcomes, run log lines, dead
//! runs and the worker registry. The only module of the SDK that speaks SQL.
//!
//! Every write retries with capped backoff while the error looks like a lost or refused
//! connection (a PostgreSQL restart, a pool timeout), for up to the store's retry budget, so a
//! brief outage delays a record instead of losing it.

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Row};

use crate::backoff;
use crate::context::LogLine;
use crate::outcome::Outcome;
use crate::protocol::Trigger;

/// The claim, in one statement: move the run to `running` for this attempt and insert the
/// attempt row, only if the run is waiting (`pending`, `queued`, `retrying`) and this attempt is
/// newer than the run's last. The trailing SELECT reads the run as it was *before* the update
/// (data-modifying CTEs are invisible to the outer query), so a refused claim says why.
const CLAIM_SQL: &str = "\
WITH claimed AS (
    UPDATE chime_runs
       SET state = 'running', attempt = $2, worker_id = $3, started_at = now(),
           finished_at = NULL, error = NULL
     WHERE id = $1 AND job_name = $4
       AND state IN ('pending', 'queued', 'retrying')
       AND attempt < $2
    RETURNING id, started_at
), attempt_row AS (
    INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at)
    SELECT id, $2, $3, 'running', started_at FROM claimed
)
SELECT (SELECT started_at FROM claimed) AS claimed_at,
       r.job_name, r.state, r.attempt, r.worker_id
  FROM chime_runs r
 WHERE r.id = $1";

/// A run as the claim found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunSnapshot {
    pub job_name: String,
    pub state: String,
    pub attempt: i32,
    pub worker_id: Option<String>,
}

/// Result of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This worker owns the attempt now.
    Claimed,
    /// Duplicate or stale delivery: the run is not waiting for this attempt (`None`: no such run).
    Refused(Option<RunSnapshot>),
}

/// What recording an outcome changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Attempt and run rows updated.
    Both,
    /// The attempt row was updated but the run had moved on (cancelled or rescued meanwhile).
    AttemptOnly,
    /// The attempt row was no longer `running`: recorded before (a retry after a commit whose
    /// reply was lost) or taken over.
    Nothing,
}

/// A worker's registry row.
#[derive(Debug, Clone)]
pub(crate) struct WorkerRow<'a> {
    pub id: &'a str,
    pub group: &'a str,
    pub hostname: &'a str,
    pub capacity: u16,
    pub jobs: &'a [String],
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
    pub(crate) async fn claim(
        &self,
        trigger: &Trigger,
        worker_id: &str,
    ) -> Result<Claim, sqlx::Error> {
        let attempt = attempt_i32(trigger.attempt);
        self.retrying("claiming a run", |retry| async move {
            let row = sqlx::query(CLAIM_SQL)
                .bind(trigger.run_id)
                .bind(attempt)
                .bind(worker_id)
                .bind(&trigger.job)
                .fetch_optional(&self.pool)
                .await?;
            let Some(row) = row else {
                return Ok(Claim::Refused(None));
            };
            let claimed_at: Option<DateTime<Utc>> = row.try_get("claimed_at")?;
            let snapshot = RunSnapshot {
                job_name: row.try_get("job_name")?,
                state: row.try_get("state")?,
                attempt: row.try_get("attempt")?,
                worker_id: row.try_get("worker_id")?,
            };
            let ours_from_a_lost_reply = retry > 0
                && snapshot.state == "running"
                && snapshot.attempt == attempt
                && snapshot.worker_id.as_deref() == Some(worker_id);
            Ok(if claimed_at.is_some() || ours_from_a_lost_reply {
                Claim::Claimed
            } else {
                Claim::Refused(Some(snapshot))
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
        self.retrying("storing run log lines", |_| async move {
            insert_logs(&self.pool, run_id, attempt, lines).await
        })
        .await
    }

    /// Records a finished attempt: attempt row, run row and the remaining log lines, in one
    /// transaction. `finished_at` is `started_at + duration` (a monotonic duration measured by
    /// the worker added to the DB clock's start), so a delayed write does not stretch the run.
    pub(crate) async fn record_outcome(
        &self,
        run_id: i64,
        attempt: u32,
        worker_id: &str,
        outcome: &Outcome,
        duration: Duration,
        lines: &[LogLine],
    ) -> Result<Recorded, sqlx::Error> {
        let attempt_no = attempt_i32(attempt);
        let duration_ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        self.retrying("recording an attempt's outcome", |_| async move {
            let mut tx = self.pool.begin().await?;
            let finished_at: Option<DateTime<Utc>> = sqlx::query_scalar(
                "UPDATE chime_attempts
                    SET state = $4, duration_ms = $5, error = $6,
                        finished_at = started_at + $5::float8 * interval '1 millisecond'
                  WHERE run_id = $1 AND attempt = $2 AND worker_id = $3 AND state = 'running'
                 RETURNING finished_at",
            )
            .bind(run_id)
            .bind(attempt_no)
            .bind(worker_id)
            .bind(outcome.attempt.as_str())
            .bind(duration_ms)
            .bind(outcome.error.as_deref())
            .fetch_optional(&mut *tx)
            .await?;
            let Some(finished_at) = finished_at else {
                return Ok(Recorded::Nothing);
            };
            let run = sqlx::query(
                "UPDATE chime_runs SET state = $4, finished_at = $5, error = $6
                  WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND state = 'running'",
            )
            .bind(run_id)
            .bind(attempt_no)
            .bind(worker_id)
            .bind(outcome.run.as_str())
            .bind(finished_at)
            .bind(outcome.error.as_deref())
            .execute(&mut *tx)
            .await?;
            insert_logs(&mut *tx, run_id, attempt, lines).await?;
            tx.commit().await?;
            Ok(if run.rows_affected() == 1 {
                Recorded::Both
            } else {
                Recorded::AttemptOnly
            })
        })
        .await
    }

    /// Marks a waiting run of `group` dead with `reason` (unknown job, undecodable trigger).
    /// Returns false if there is no such waiting run.
    pub(crate) async fn mark_dead(
        &self,
        run_id: i64,
        group: &str,
        reason: &str,
        worker_id: &str,
    ) -> Result<bool, sqlx::Error> {
        self.retrying("marking a run dead", |_| async move {
            let done = sqlx::query(
                "UPDATE chime_runs
                    SET state = 'dead', reason = $3, error = $3, worker_id = $4, finished_at = now()
                  WHERE id = $1 AND group_name = $2 AND state IN ('pending', 'queued', 'retrying')",
            )
            .bind(run_id)
            .bind(group)
            .bind(reason)
            .bind(worker_id)
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
                "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (id) DO UPDATE
                    SET group_name = EXCLUDED.group_name, hostname = EXCLUDED.hostname,
                        capacity = EXCLUDED.capacity, jobs = EXCLUDED.jobs,
                        started_at = now(), heartbeat_at = now(), stopped_at = NULL",
            )
            .bind(w.id)
            .bind(w.group)
            .bind(w.hostname)
            .bind(i32::from(w.capacity))
            .bind(w.jobs)
            .execute(&self.pool)
            .await
            .map(drop)
        })
        .await
    }

    /// Refreshes the worker's heartbeat (one try: the next beat is the retry).
    pub(crate) async fn heartbeat(&self, worker_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE chime_workers SET heartbeat_at = now() WHERE id = $1")
            .bind(worker_id)
            .execute(&self.pool)
            .await
            .map(drop)
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
}
