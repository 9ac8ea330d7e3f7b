//! The SQL of failure handling on the scheduler side: rescuing runs of lost workers and runs
//! stuck in `retrying`, cancelling, the `replace` policy, replaying parked runs, and the alert
//! record. Part of [`crate::store`]: leader writes are fenced like every other.

use std::time::Duration;

use anyhow::Context as _;
use chime_protocol::RunState;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row as _;

use super::{Fence, LEASE_CTE, OUTBOX_CHANNEL, Store, notify};

/// A run the rescuer moved on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescued {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// The attempt that was lost (or, for a stuck retry, the last attempt that ran).
    pub attempt: i32,
    /// The run's state now: `pending` (republished as the next attempt), `dead` (that was its
    /// last attempt) or `cancelled` (a cancel had been requested).
    pub state: RunState,
    /// What happened, as recorded on the attempt (`worker w1 lost (no heartbeat since …)`).
    pub detail: String,
}

/// Result of a cancel request ([`Store::cancel_run`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// No run has this id.
    NotFound,
    /// The run had already finished (`state`); nothing changed.
    Finished {
        /// Its state.
        state: String,
    },
    /// The run was waiting (`previous`: pending, queued or retrying) and is `cancelled` now;
    /// its trigger, when delivered, finds nothing to claim.
    Cancelled {
        /// Job name.
        job: String,
        /// The state it had.
        previous: String,
    },
    /// The run is `running`: the cancel is recorded and the worker holding it must be told
    /// through a control message.
    Requested {
        /// Job name.
        job: String,
        /// Executor group.
        group: String,
        /// A cancel had been requested before.
        again: bool,
    },
}

/// Result of a replay request ([`Store::replay_run`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// No run has this id.
    NotFound,
    /// The run is `state`, which is not replayable (pending, running, succeeded, skipped).
    NotReplayable {
        /// Its state.
        state: String,
    },
    /// The run is `pending` again: the leader publishes it as attempt `next_attempt`.
    Replayed {
        /// Job name.
        job: String,
        /// Executor group.
        group: String,
        /// The attempt number it will be published as.
        next_attempt: i32,
    },
}

/// States a run can be replayed from: finished without success, or waiting for a message that
/// is in the parking lot instead of the work queue.
pub const REPLAYABLE_STATES: &[&str] = &[
    RunState::Dead.as_str(),
    RunState::Failed.as_str(),
    RunState::Cancelled.as_str(),
    RunState::Queued.as_str(),
    RunState::Retrying.as_str(),
];

/// A run in a few words, to describe parked messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunBrief {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// State.
    pub state: String,
    /// Attempts started.
    pub attempt: i32,
    /// Last error.
    pub error: Option<String>,
    /// Why it was skipped, dead-lettered or cancelled.
    pub reason: Option<String>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// What an alert is about (`chime_alerts.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A run is `dead`: attempts exhausted, or it could not be run at all.
    Dead,
    /// An attempt timed out.
    Timeout,
    /// An attempt was lost with its worker.
    WorkerLost,
    /// Several runs of a job in a row failed.
    ConsecutiveFailures,
    /// A workflow run failed (a node failed, or a node could not run).
    WorkflowFailed,
    /// A workflow run exceeded its timeout and was stopped.
    WorkflowTimeout,
}

impl AlertKind {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Dead => "dead",
            AlertKind::Timeout => "timeout",
            AlertKind::WorkerLost => "worker_lost",
            AlertKind::ConsecutiveFailures => "consecutive_failures",
            AlertKind::WorkflowFailed => "workflow_failed",
            AlertKind::WorkflowTimeout => "workflow_timeout",
        }
    }
}

/// Something that happened to a run that may deserve an alert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertEvent {
    /// `None` for a run that merely `failed` (it only counts towards consecutive failures).
    pub kind: Option<AlertKind>,
    /// Run id.
    pub run_id: i64,
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// The attempt concerned (the run's last for run events).
    pub attempt: i32,
    /// The error recorded.
    pub error: Option<String>,
    /// When it happened.
    pub at: DateTime<Utc>,
}

/// An alert about to be sent, as recorded in `chime_alerts`.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertRecord {
    /// Kind.
    pub kind: AlertKind,
    /// Job name.
    pub job: String,
    /// Executor group.
    pub group: String,
    /// Run id.
    pub run_id: i64,
    /// Attempt.
    pub attempt: i32,
    /// Where it goes, without secrets (scheme, host and port of the webhook).
    pub target: String,
    /// The body sent.
    pub payload: serde_json::Value,
    /// At most one alert per (job, kind) is sent within this interval; later ones are recorded
    /// as suppressed.
    pub min_interval: Duration,
}

/// A recorded alert, to be sent unless suppressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimedAlert {
    /// Row id in `chime_alerts`.
    pub id: i64,
    /// Held back by the rate limit: recorded, not sent.
    pub suppressed: bool,
}

/// The instant a worker row `w` counts as lost from, for a run `r` it holds:
/// `chime_worker_lost_since` (its heartbeat went stale, or it stopped, whichever came first);
/// the run's start if the worker never registered.
const LOST_SINCE_SQL: &str = "CASE WHEN w.id IS NULL THEN coalesce(r.started_at, r.created_at) \
     ELSE chime_worker_lost_since(w.stopped_at, w.heartbeat_at, w.heartbeat_interval_ms) END";

/// The rescues' result rows: one `lease` row while the fence holds, then one per run changed
/// (CTE `runs`), as [`rescued`] reads them.
const RESCUED_SQL: &str = "SELECT 'lease' AS kind, NULL::bigint AS id, NULL::text AS job_name,
                    NULL::int AS attempt, NULL::text AS state, NULL::text AS detail FROM lease
             UNION ALL
             SELECT 'run', id, job_name, attempt, state, detail FROM runs";

/// Why worker row `w` counts as gone, for a rescue's reason: not registered, stopped at …, or
/// no heartbeat since ….
fn worker_gone_sql() -> String {
    format!(
        "CASE WHEN w.id IS NULL THEN 'not registered'
              WHEN w.stopped_at IS NOT NULL THEN 'stopped at ' || {stopped}
              ELSE 'no heartbeat since ' || {heartbeat} END",
        stopped = ts_sql("w.stopped_at"),
        heartbeat = ts_sql("w.heartbeat_at"),
    )
}

impl Store {
    /// The database clock.
    pub async fn db_now(&self) -> anyhow::Result<DateTime<Utc>> {
        sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await
            .context("reading the database clock")
    }

    /// Every executor group that has a job, by name.
    pub async fn groups(&self) -> anyhow::Result<Vec<String>> {
        // A workflow's group is empty: it has no queues.
        sqlx::query_scalar(
            "SELECT DISTINCT group_name FROM chime_jobs WHERE group_name <> '' ORDER BY group_name",
        )
        .fetch_all(&self.pool)
        .await
        .context("listing executor groups")
    }

    /// Rescues up to `limit` runs whose worker has been lost for longer than `rescue_after`,
    /// under the leader's fence: the attempt is recorded `lost` with the reason, and the run goes
    /// back to the outbox (`pending`, attempt number unchanged, so it is published as the next
    /// attempt) — or becomes `cancelled` if a cancel was requested, or `dead` if that was its
    /// last attempt. Returns `None` if the fence no longer holds.
    pub async fn rescue_lost_runs(
        &self,
        fence: &Fence,
        rescue_after: Duration,
        limit: i64,
    ) -> anyhow::Result<Option<Vec<Rescued>>> {
        let sql = format!(
            "WITH {LEASE_CTE}, lost AS (
                 SELECT r.id, r.job_name, r.attempt, r.worker_id, r.cancel_requested_by,
                        r.cancel_requested_at IS NOT NULL AS cancel,
                        r.target_worker IS NOT NULL AS broadcast,
                        chime_retry_max_attempts(r.retry_policy) AS max_attempts,
                        chime_retry_exhausted(r.retry_policy, r.attempt) AS exhausted,
                        'worker ' || coalesce(r.worker_id, '?') || ' lost (' || {gone} || ')'
                            AS detail
                 FROM chime_runs r
                 LEFT JOIN chime_workers w ON w.id = r.worker_id
                 WHERE r.state = 'running' AND EXISTS (SELECT 1 FROM lease)
                   -- A parent runs through its tasks and has no worker of its own.
                   AND r.tasks_total = 0
                   AND {lost_since} < now() - make_interval(secs => $3)
                 ORDER BY r.id
                 LIMIT $4
                 FOR UPDATE OF r SKIP LOCKED
             ), attempt_rows AS (
                 UPDATE chime_attempts a SET state = 'lost', finished_at = now(),
                     duration_ms = (extract(epoch FROM now() - a.started_at) * 1000)::bigint,
                     error = l.detail
                 FROM lost l
                 WHERE a.run_id = l.id AND a.attempt = l.attempt AND a.state = 'running'
             ), runs AS (
                 UPDATE chime_runs r SET
                     state = CASE WHEN l.cancel THEN 'cancelled'
                                  WHEN l.broadcast THEN 'lost'
                                  WHEN l.exhausted THEN 'dead'
                                  ELSE 'pending' END,
                     error = l.detail,
                     reason = CASE
                         WHEN l.cancel THEN 'cancelled by ' || coalesce(l.cancel_requested_by, '?')
                                            || ' (its worker was lost)'
                         WHEN l.broadcast THEN
                             'its worker was lost; a broadcast task is not moved to another worker'
                         WHEN l.exhausted THEN
                             'worker lost on the last attempt (' || l.attempt || ' of '
                             || l.max_attempts || ')'
                         ELSE r.reason END,
                     finished_at = CASE WHEN l.cancel OR l.exhausted OR l.broadcast
                                        THEN now() END,
                     published_at = CASE WHEN l.cancel OR l.exhausted OR l.broadcast
                                         THEN r.published_at END
                 FROM lost l
                 WHERE r.id = l.id AND r.state = 'running' AND r.attempt = l.attempt
                 RETURNING r.id, r.job_name, r.attempt, r.state, l.detail
             )
             {rescued}",
            gone = worker_gone_sql(),
            lost_since = LOST_SINCE_SQL,
            rescued = RESCUED_SQL,
        );
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(rescue_after.as_secs_f64())
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .context("rescuing runs of lost workers")?;
        let result = rescued(rows)?;
        if result
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r.state == RunState::Pending))
        {
            notify(&mut tx, OUTBOX_CHANNEL, "rescued").await?;
        }
        tx.commit().await?;
        Ok(result)
    }

    /// Ends `lost` up to `limit` broadcast tasks still waiting (`pending`, `queued`, `retrying`)
    /// for a worker lost for longer than `rescue_after`, under the leader's fence: a broadcast
    /// task is for its worker only, so nobody else would ever start it and its run would never
    /// end. Returns `None` if the fence no longer holds.
    pub async fn rescue_stranded_broadcasts(
        &self,
        fence: &Fence,
        rescue_after: Duration,
        limit: i64,
    ) -> anyhow::Result<Option<Vec<Rescued>>> {
        let sql = format!(
            "WITH {LEASE_CTE}, stranded AS (
                 SELECT r.id,
                        'its worker ' || r.target_worker || ' was lost before it started (' ||
                        {gone} || '); a broadcast task is not moved to another worker' AS detail
                 FROM chime_runs r
                 LEFT JOIN chime_workers w ON w.id = r.target_worker
                 WHERE r.target_worker IS NOT NULL AND EXISTS (SELECT 1 FROM lease)
                   AND r.state IN ('pending', 'queued', 'retrying')
                   AND {lost_since} < now() - make_interval(secs => $3)
                 ORDER BY r.id
                 LIMIT $4
                 FOR UPDATE OF r SKIP LOCKED
             ), runs AS (
                 UPDATE chime_runs r SET state = 'lost', reason = s.detail, finished_at = now(),
                                         next_attempt_at = NULL
                 FROM stranded s
                 WHERE r.id = s.id
                 RETURNING r.id, r.job_name, r.attempt, r.state, s.detail
             )
             {rescued}",
            gone = worker_gone_sql(),
            lost_since = LOST_SINCE_SQL,
            rescued = RESCUED_SQL,
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(rescue_after.as_secs_f64())
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .context("ending broadcast tasks of lost workers")?;
        rescued(rows)
    }

    /// Puts back in the outbox up to `limit` runs still `retrying` more than `slack` after their
    /// `next_attempt_at` (their retry message was lost), under the leader's fence. They are
    /// published as the next attempt; a late retry message then finds nothing to claim.
    pub async fn rescue_stuck_retries(
        &self,
        fence: &Fence,
        slack: Duration,
        limit: i64,
    ) -> anyhow::Result<Option<Vec<Rescued>>> {
        let sql = format!(
            "WITH {LEASE_CTE}, stuck AS (
                 SELECT r.id FROM chime_runs r
                 WHERE r.state = 'retrying' AND EXISTS (SELECT 1 FROM lease)
                   AND r.next_attempt_at < now() - make_interval(secs => $3)
                 ORDER BY r.next_attempt_at
                 LIMIT $4
                 FOR UPDATE OF r SKIP LOCKED
             ), runs AS (
                 UPDATE chime_runs r SET state = 'pending', published_at = NULL
                 FROM stuck s
                 WHERE r.id = s.id AND r.state = 'retrying'
                 RETURNING r.id, r.job_name, r.attempt, r.state,
                     'retry of attempt ' || r.attempt || ' was due at ' || {due}
                     || ' but never started' AS detail
             )
             {rescued}",
            due = ts_sql("r.next_attempt_at"),
            rescued = RESCUED_SQL,
        );
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(slack.as_secs_f64())
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .context("rescuing runs stuck in retrying")?;
        let result = rescued(rows)?;
        if result.as_ref().is_some_and(|r| !r.is_empty()) {
            notify(&mut tx, OUTBOX_CHANNEL, "rescued").await?;
        }
        tx.commit().await?;
        Ok(result)
    }

    /// An operator's cancel: records `cancel_requested_at`/`_by`; a waiting run (pending,
    /// queued, retrying) becomes `cancelled` at once, a running one stays `running` until its
    /// worker reacts to the control message the caller sends.
    pub async fn cancel_run(&self, id: i64, by: &str) -> anyhow::Result<CancelOutcome> {
        let row = sqlx::query(
            "WITH target AS (
                 SELECT id, state, job_name, group_name, cancel_requested_at
                 FROM chime_runs WHERE id = $1 FOR UPDATE
             ), upd AS (
                 UPDATE chime_runs r SET
                     cancel_requested_at = coalesce(r.cancel_requested_at, now()),
                     cancel_requested_by = coalesce(r.cancel_requested_by, $2),
                     state = CASE WHEN t.state = 'running' THEN 'running' ELSE 'cancelled' END,
                     finished_at = CASE WHEN t.state = 'running' THEN r.finished_at
                                        ELSE now() END,
                     reason = CASE WHEN t.state = 'running' THEN r.reason
                                   ELSE 'cancelled by ' || $2 END
                 FROM target t
                 WHERE r.id = t.id AND t.state IN ('pending', 'queued', 'running', 'retrying')
                 RETURNING r.id
             )
             SELECT t.state, t.job_name, t.group_name,
                    t.cancel_requested_at IS NOT NULL AS again,
                    EXISTS (SELECT 1 FROM upd) AS changed
             FROM target t",
        )
        .bind(id)
        .bind(by)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("cancelling run {id}"))?;
        let Some(row) = row else {
            return Ok(CancelOutcome::NotFound);
        };
        let state: String = row.get("state");
        let job: String = row.get("job_name");
        Ok(if !row.get::<bool, _>("changed") {
            CancelOutcome::Finished { state }
        } else if state == RunState::Running.as_str() {
            CancelOutcome::Requested {
                job,
                group: row.get("group_name"),
                again: row.get("again"),
            }
        } else {
            CancelOutcome::Cancelled {
                job,
                previous: state,
            }
        })
    }

    /// The `replace` policy, under the leader's fence: cancels every unfinished run of `job`
    /// older than run `newer` (as [`Store::cancel_run`] does, requested by `by`), but a
    /// backfill's (the backfill's own `parallel` governs them). Returns the runs that were
    /// `running` (their workers must be told), or `None` if the fence no longer
    /// holds.
    pub async fn cancel_superseded(
        &self,
        fence: &Fence,
        job: &str,
        newer: i64,
        by: &str,
    ) -> anyhow::Result<Option<Vec<(i64, String)>>> {
        let sql = format!(
            "WITH {LEASE_CTE}, targets AS (
                 SELECT r.id, r.state FROM chime_runs r
                 WHERE r.job_name = $3 AND r.id < $4 AND EXISTS (SELECT 1 FROM lease)
                   AND r.parent_id IS NULL AND r.backfill_id IS NULL
                   AND r.state IN ('pending', 'queued', 'running', 'retrying')
                 ORDER BY r.id
                 FOR UPDATE OF r
             ), upd AS (
                 UPDATE chime_runs r SET
                     cancel_requested_at = coalesce(r.cancel_requested_at, now()),
                     cancel_requested_by = coalesce(r.cancel_requested_by, $5),
                     state = CASE WHEN t.state = 'running' THEN 'running' ELSE 'cancelled' END,
                     finished_at = CASE WHEN t.state = 'running' THEN r.finished_at
                                        ELSE now() END,
                     reason = CASE WHEN t.state = 'running' THEN r.reason
                                   ELSE 'cancelled by ' || $5 END
                 FROM targets t WHERE r.id = t.id
                 RETURNING r.id, t.state AS before
             )
             SELECT 'lease' AS kind, NULL::bigint AS id, NULL::text AS before FROM lease
             UNION ALL
             SELECT 'run', id, before FROM upd"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(job)
            .bind(newer)
            .bind(by)
            .fetch_all(&self.pool)
            .await
            .with_context(|| format!("cancelling runs of {job:?} replaced by run {newer}"))?;
        let mut leased = false;
        let mut cancelled = Vec::new();
        for r in rows {
            if r.get::<&str, _>("kind") == "lease" {
                leased = true;
            } else {
                cancelled.push((r.get("id"), r.get("before")));
            }
        }
        Ok(leased.then_some(cancelled))
    }

    /// Replays a run from the parking lot: `pending` again with `replayed_by`/`replayed_at`,
    /// error, reason and cancel request cleared, attempt number kept (so it is published as the
    /// next attempt; the attempts keep their history), and wakes the leader.
    pub async fn replay_run(&self, id: i64, by: &str) -> anyhow::Result<ReplayOutcome> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "WITH target AS (
                 SELECT id, state FROM chime_runs WHERE id = $1 FOR UPDATE
             ), upd AS (
                 UPDATE chime_runs r SET state = 'pending', replayed_by = $2, replayed_at = now(),
                     error = NULL, reason = NULL, finished_at = NULL, next_attempt_at = NULL,
                     cancel_requested_at = NULL, cancel_requested_by = NULL, published_at = NULL
                 FROM target t
                 WHERE r.id = t.id AND t.state = ANY($3)
                 RETURNING r.job_name, r.group_name, r.attempt
             )
             SELECT t.state, u.job_name, u.group_name, u.attempt
             FROM target t LEFT JOIN upd u ON true",
        )
        .bind(id)
        .bind(by)
        .bind(REPLAYABLE_STATES)
        .fetch_optional(&mut *tx)
        .await
        .with_context(|| format!("replaying run {id}"))?;
        let Some(row) = row else {
            return Ok(ReplayOutcome::NotFound);
        };
        let Some(job) = row.get::<Option<String>, _>("job_name") else {
            return Ok(ReplayOutcome::NotReplayable {
                state: row.get("state"),
            });
        };
        notify(&mut tx, OUTBOX_CHANNEL, &id.to_string()).await?;
        tx.commit().await?;
        Ok(ReplayOutcome::Replayed {
            job,
            group: row.get("group_name"),
            next_attempt: row.get::<i32, _>("attempt") + 1,
        })
    }

    /// The runs with these ids (those that exist), by id.
    pub async fn run_briefs(&self, ids: &[i64]) -> anyhow::Result<Vec<RunBrief>> {
        let rows = sqlx::query(
            "SELECT id, job_name, group_name, state, attempt, error, reason, finished_at
             FROM chime_runs WHERE id = ANY($1) ORDER BY id",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .context("loading runs of parked messages")?;
        Ok(rows
            .into_iter()
            .map(|r| RunBrief {
                id: r.get("id"),
                job: r.get("job_name"),
                group: r.get("group_name"),
                state: r.get("state"),
                attempt: r.get("attempt"),
                error: r.get("error"),
                reason: r.get("reason"),
                finished_at: r.get("finished_at"),
            })
            .collect())
    }

    /// Events that may deserve an alert, in (time, run, kind) order after `after`, at most
    /// `limit`: dead and failed runs, timed-out and lost attempts. Events already recorded in
    /// `chime_alerts` are left out. A failed run's kind is `None`; `after`'s kind is spelt as
    /// stored, `failed` for those.
    pub async fn alert_events(
        &self,
        after: (DateTime<Utc>, i64, &str),
        limit: i64,
    ) -> anyhow::Result<Vec<AlertEvent>> {
        let rows = sqlx::query(
            "SELECT * FROM (
                 SELECT CASE WHEN r.state = 'dead' THEN 'dead'
                             WHEN w.workflow AND r.cancel_requested_by = 'timeout'
                             THEN 'workflow_timeout'
                             WHEN w.workflow THEN 'workflow_failed'
                             ELSE 'failed' END AS kind,
                        r.id AS run_id, r.job_name, r.group_name,
                        -- A workflow run alerts once per round (a rerun that fails again).
                        CASE WHEN w.workflow
                             THEN (SELECT coalesce(max(x.round), 0)
                                     FROM chime_workflow_reruns x WHERE x.run_id = r.id)
                             ELSE r.attempt END AS attempt,
                        coalesce(r.error, r.reason) AS error, r.finished_at AS at
                 FROM chime_runs r
                 CROSS JOIN LATERAL (
                     SELECT coalesce((SELECT chime_job_kind(j.spec) = 'workflow'
                                        FROM chime_jobs j WHERE j.name = r.job_name), false)
                            AND r.workflow_run_id IS NULL AS workflow
                 ) w
                 WHERE r.state IN ('dead', 'failed') AND r.finished_at >= $1
                   -- A run with tasks alerts once, when it ends; not per task.
                   AND r.parent_id IS NULL
                 UNION ALL
                 SELECT CASE a.state WHEN 'timed_out' THEN 'timeout' ELSE 'worker_lost' END,
                        a.run_id, r.job_name, r.group_name, a.attempt, a.error, a.finished_at
                 FROM chime_attempts a JOIN chime_runs r ON r.id = a.run_id
                 WHERE a.state IN ('timed_out', 'lost') AND a.finished_at >= $1
             ) e
             WHERE (e.at, e.run_id, e.kind) > ($1, $2, $3)
               AND (e.kind = 'failed' OR NOT EXISTS (
                   SELECT 1 FROM chime_alerts x
                   WHERE x.kind = e.kind AND x.run_id = e.run_id
                     AND coalesce(x.attempt, 0) = e.attempt))
             ORDER BY e.at, e.run_id, e.kind
             LIMIT $4",
        )
        .bind(after.0)
        .bind(after.1)
        .bind(after.2)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .context("reading events for alerts")?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let kind: String = r.get("kind");
                AlertEvent {
                    kind: match kind.as_str() {
                        "dead" => Some(AlertKind::Dead),
                        "timeout" => Some(AlertKind::Timeout),
                        "worker_lost" => Some(AlertKind::WorkerLost),
                        "workflow_failed" => Some(AlertKind::WorkflowFailed),
                        "workflow_timeout" => Some(AlertKind::WorkflowTimeout),
                        _ => None,
                    },
                    run_id: r.get("run_id"),
                    job: r.get("job_name"),
                    group: r.get("group_name"),
                    attempt: r.get("attempt"),
                    error: r.get("error"),
                    at: r.get("at"),
                }
            })
            .collect())
    }

    /// Whether any job names its own alert webhook.
    pub async fn any_job_alert_webhook(&self) -> anyhow::Result<bool> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM chime_jobs WHERE spec->'alerts' ? 'webhook')",
        )
        .fetch_one(&self.pool)
        .await
        .context("looking for jobs with an alert webhook")
    }

    /// How many finished runs of `job` in a row, ending with run `upto`, failed or went dead
    /// (counting at most `max`). Cancelled and skipped runs do not break or extend a streak.
    pub async fn failure_streak(&self, job: &str, upto: i64, max: u32) -> anyhow::Result<u32> {
        let states: Vec<String> = sqlx::query_scalar(
            "SELECT state FROM chime_runs
             WHERE job_name = $1 AND id <= $2 AND state IN ('succeeded', 'failed', 'dead')
             ORDER BY id DESC LIMIT $3",
        )
        .bind(job)
        .bind(upto)
        .bind(i64::from(max))
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("counting consecutive failures of {job:?}"))?;
        Ok(u32::try_from(states.iter().take_while(|s| *s != "succeeded").count()).unwrap_or(0))
    }

    /// Records an alert under the leader's fence, once per (kind, run, attempt), suppressed when
    /// another alert of the same (job, kind) was sent within `min_interval`. Returns `Ok(None)`
    /// if the fence no longer holds, `Ok(Some(None))` if the event was recorded before.
    pub async fn record_alert(
        &self,
        fence: &Fence,
        alert: &AlertRecord,
    ) -> anyhow::Result<Option<Option<ClaimedAlert>>> {
        let sql = format!(
            "WITH {LEASE_CTE}, recent AS (
                 SELECT 1 FROM chime_alerts
                 WHERE job_name = $3 AND kind = $4 AND NOT suppressed
                   AND at > now() - make_interval(secs => $9)
                 LIMIT 1
             ), ins AS (
                 INSERT INTO chime_alerts (kind, job_name, group_name, run_id, attempt, target,
                                           delivered, error, payload, suppressed)
                 SELECT $4, $3, $5, $6, $7, $8, false,
                        CASE WHEN EXISTS (SELECT 1 FROM recent)
                             THEN 'suppressed: an alert of this kind for this job was sent less \
                                   than ' || $10 || ' ago' END,
                        $11, EXISTS (SELECT 1 FROM recent)
                 FROM lease
                 ON CONFLICT (kind, run_id, coalesce(attempt, 0)) WHERE run_id IS NOT NULL
                 DO NOTHING
                 RETURNING id, suppressed
             )
             SELECT 'lease' AS kind, NULL::bigint AS id, NULL::boolean AS suppressed FROM lease
             UNION ALL
             SELECT 'alert', id, suppressed FROM ins"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(&alert.job)
            .bind(alert.kind.as_str())
            .bind(&alert.group)
            .bind(alert.run_id)
            .bind(alert.attempt)
            .bind(&alert.target)
            .bind(alert.min_interval.as_secs_f64())
            .bind(humantime::format_duration(alert.min_interval).to_string())
            .bind(&alert.payload)
            .fetch_all(&self.pool)
            .await
            .context("recording an alert")?;
        let mut leased = false;
        let mut claimed = None;
        for r in rows {
            if r.get::<&str, _>("kind") == "lease" {
                leased = true;
            } else {
                claimed = Some(ClaimedAlert {
                    id: r.get("id"),
                    suppressed: r.get("suppressed"),
                });
            }
        }
        Ok(leased.then_some(claimed))
    }

    /// Records how sending alert `id` went.
    pub async fn finish_alert(
        &self,
        id: i64,
        delivered: bool,
        error: Option<&str>,
    ) -> anyhow::Result<()> {
        sqlx::query("UPDATE chime_alerts SET delivered = $2, error = $3 WHERE id = $1")
            .bind(id)
            .bind(delivered)
            .bind(error)
            .execute(&self.pool)
            .await
            .context("recording an alert's delivery")?;
        Ok(())
    }
}

/// SQL rendering a timestamp column as `2026-11-30T07:00:00.000Z`.
fn ts_sql(column: &str) -> String {
    format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
}

fn rescued(rows: Vec<sqlx::postgres::PgRow>) -> anyhow::Result<Option<Vec<Rescued>>> {
    let mut leased = false;
    let mut runs = Vec::new();
    for r in rows {
        if r.get::<&str, _>("kind") == "lease" {
            leased = true;
        } else {
            runs.push(Rescued {
                id: r.get("id"),
                job: r.get("job_name"),
                attempt: r.get("attempt"),
                state: r.get::<&str, _>("state").parse()?,
                detail: r.get("detail"),
            });
        }
    }
    Ok(leased.then_some(runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_kinds_match_the_schema() {
        let kinds: Vec<&str> = [
            AlertKind::Dead,
            AlertKind::Timeout,
            AlertKind::WorkerLost,
            AlertKind::ConsecutiveFailures,
            AlertKind::WorkflowFailed,
            AlertKind::WorkflowTimeout,
        ]
        .into_iter()
        .map(AlertKind::as_str)
        .collect();
        assert_eq!(
            kinds,
            [
                "dead",
                "timeout",
                "worker_lost",
                "consecutive_failures",
                "workflow_failed",
                "workflow_timeout"
            ]
        );
    }

    mod db {
        //! The failure-handling SQL against a real database (`#[sqlx::test]`: one per test).

        use super::super::super::{CreatedRun, NewFire, TriggerKind};
        use super::*;
        use crate::job::ConcurrencyPolicy;
        use sqlx::PgPool;

        async fn leader(store: &Store) -> Fence {
            store.lead_for_test("me").await
        }

        async fn run(pool: &PgPool, job: &str, state: &str, attempt: i32) -> i64 {
            sqlx::query_scalar(
                "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                         attempt, worker_id, started_at, finished_at)
                 VALUES ($1, 'g', now(), 'manual', $2, $3, 'w1', now(),
                         CASE WHEN $2 IN ('succeeded', 'failed', 'dead', 'cancelled')
                              THEN now() END)
                 RETURNING id",
            )
            .bind(job)
            .bind(state)
            .bind(attempt)
            .fetch_one(pool)
            .await
            .unwrap()
        }

        async fn job(pool: &PgPool, name: &str, spec: serde_json::Value) {
            crate::store::insert_test_job(pool, name, spec).await;
        }

        async fn state(pool: &PgPool, id: i64) -> (String, Option<String>) {
            let row = sqlx::query("SELECT state, reason FROM chime_runs WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
            (row.get("state"), row.get("reason"))
        }

        fn fire(job: &str, at: DateTime<Utc>, concurrency: ConcurrencyPolicy) -> NewFire {
            NewFire {
                job: job.into(),
                group: "g".into(),
                scheduled_at: at,
                kind: TriggerKind::Schedule,
                params: serde_json::json!({}),
                skip: None,
                concurrency,
            }
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn forbid_skips_and_queue_blocks_while_a_run_is_unfinished(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            let fence = leader(&store).await;
            let active = run(&pool, "f", "running", 1).await;
            run(&pool, "q", "queued", 0).await;
            let at = Utc::now() + chrono::Duration::seconds(1);
            let created = store
                .insert_fires(
                    &fence,
                    None,
                    &[
                        fire("f", at, ConcurrencyPolicy::Forbid),
                        fire("q", at, ConcurrencyPolicy::Queue),
                        fire("a", at, ConcurrencyPolicy::Allow),
                    ],
                )
                .await
                .unwrap()
                .expect("leading");
            let created: Vec<(String, bool)> = created
                .into_iter()
                .map(|CreatedRun { job, blocked, .. }| (job, blocked))
                .collect();
            assert_eq!(created, [("q".to_owned(), true), ("a".to_owned(), false)]);
            let skipped: (String, Option<String>) = {
                let row = sqlx::query(
                    "SELECT state, reason FROM chime_runs WHERE job_name = 'f' AND id <> $1",
                )
                .bind(active)
                .fetch_one(&pool)
                .await
                .unwrap();
                (row.get("state"), row.get("reason"))
            };
            assert_eq!(
                skipped,
                (
                    "skipped".to_owned(),
                    Some(format!(
                        "previous run {active} still active (concurrency forbid)"
                    ))
                )
            );
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn the_outbox_holds_back_later_runs_of_a_queue_job(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            job(
                &pool,
                "q",
                serde_json::json!({"name": "q", "group": "g", "concurrency": "queue"}),
            )
            .await;
            job(&pool, "a", serde_json::json!({"name": "a", "group": "g"})).await;
            let first = run(&pool, "q", "pending", 0).await;
            let second = run(&pool, "q", "pending", 0).await;
            let free = run(&pool, "a", "pending", 0).await;
            run(&pool, "a", "pending", 0).await;
            let horizon = Utc::now() + chrono::Duration::seconds(5);
            let ids = |runs: Vec<crate::store::OutboxRun>| {
                let mut ids: Vec<i64> = runs.into_iter().map(|r| r.id).collect();
                ids.sort_unstable();
                ids
            };
            let out = ids(store.outbox(horizon, 100).await.unwrap());
            assert_eq!(out, [first, free, free + 1]);
            sqlx::query("UPDATE chime_runs SET state = 'running' WHERE id = $1")
                .bind(first)
                .execute(&pool)
                .await
                .unwrap();
            assert!(!ids(store.outbox(horizon, 100).await.unwrap()).contains(&second));
            sqlx::query("UPDATE chime_runs SET state = 'succeeded' WHERE id = $1")
                .bind(first)
                .execute(&pool)
                .await
                .unwrap();
            assert!(ids(store.outbox(horizon, 100).await.unwrap()).contains(&second));
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn cancel_outcomes(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            let queued = run(&pool, "j", "queued", 0).await;
            let running = run(&pool, "j", "running", 1).await;
            let done = run(&pool, "j", "succeeded", 1).await;
            assert_eq!(
                store.cancel_run(queued, "cli:a").await.unwrap(),
                CancelOutcome::Cancelled {
                    job: "j".into(),
                    previous: "queued".into()
                }
            );
            assert_eq!(
                state(&pool, queued).await,
                ("cancelled".into(), Some("cancelled by cli:a".into()))
            );
            assert_eq!(
                store.cancel_run(running, "cli:a").await.unwrap(),
                CancelOutcome::Requested {
                    job: "j".into(),
                    group: "g".into(),
                    again: false
                }
            );
            assert_eq!(state(&pool, running).await.0, "running");
            assert!(matches!(
                store.cancel_run(running, "cli:b").await.unwrap(),
                CancelOutcome::Requested { again: true, .. }
            ));
            let by: String =
                sqlx::query_scalar("SELECT cancel_requested_by FROM chime_runs WHERE id = $1")
                    .bind(running)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(by, "cli:a", "the first request is kept");
            assert_eq!(
                store.cancel_run(done, "cli:a").await.unwrap(),
                CancelOutcome::Finished {
                    state: "succeeded".into()
                }
            );
            assert_eq!(
                store.cancel_run(queued, "cli:a").await.unwrap(),
                CancelOutcome::Finished {
                    state: "cancelled".into()
                }
            );
            assert_eq!(
                store.cancel_run(9_999, "cli:a").await.unwrap(),
                CancelOutcome::NotFound
            );
        }

        /// A worker counts as lost three of its own heartbeat intervals after its last
        /// heartbeat: a slow-beating worker silent for 100 s still holds its run, a fast one
        /// silent as long has lost it.
        #[sqlx::test(migrations = "../migrations")]
        async fn rescue_judges_each_worker_by_its_own_heartbeat_interval(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            job(&pool, "j", serde_json::json!({"name": "j", "group": "g"})).await;
            sqlx::query(
                "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, heartbeat_at,
                                            heartbeat_interval_ms)
                 VALUES ('slow', 'g', 'h', 1, '{j}', now() - interval '100 seconds', 60000),
                        ('fast', 'g', 'h', 1, '{j}', now() - interval '100 seconds', 1000)",
            )
            .execute(&pool)
            .await
            .unwrap();
            let mut runs = Vec::new();
            for worker in ["slow", "fast"] {
                let id = run(&pool, "j", "running", 1).await;
                sqlx::query("UPDATE chime_runs SET worker_id = $2 WHERE id = $1")
                    .bind(id)
                    .bind(worker)
                    .execute(&pool)
                    .await
                    .unwrap();
                runs.push(id);
            }
            let fence = leader(&store).await;
            let rescued = store
                .rescue_lost_runs(&fence, Duration::from_secs(1), 100)
                .await
                .unwrap()
                .expect("leading");
            let ids: Vec<i64> = rescued.iter().map(|r| r.id).collect();
            assert_eq!(ids, [runs[1]], "only the fast worker's run: {rescued:?}");
            assert_eq!(state(&pool, runs[0]).await.0, "running");
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn rescue_republishes_kills_the_last_attempt_and_honours_cancels(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            job(
                &pool,
                "j",
                serde_json::json!({"name": "j", "group": "g",
                                               "retry": {"max_attempts": 2}}),
            )
            .await;
            sqlx::query(
                "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, heartbeat_at)
                 VALUES ('w1', 'g', 'h', 1, '{j}', now() - interval '1 hour'),
                        ('alive', 'g', 'h', 1, '{j}', now())",
            )
            .execute(&pool)
            .await
            .unwrap();
            let again = run(&pool, "j", "running", 1).await;
            let last = run(&pool, "j", "running", 2).await;
            let cancelled = run(&pool, "j", "running", 1).await;
            let healthy = run(&pool, "j", "running", 1).await;
            sqlx::query("UPDATE chime_runs SET cancel_requested_at = now(), cancel_requested_by = 'cli:a' WHERE id = $1")
                .bind(cancelled)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query("UPDATE chime_runs SET worker_id = 'alive' WHERE id = $1")
                .bind(healthy)
                .execute(&pool)
                .await
                .unwrap();
            for (id, attempt) in [(again, 1), (last, 2), (cancelled, 1), (healthy, 1)] {
                sqlx::query(
                    "INSERT INTO chime_attempts (run_id, attempt, worker_id, state)
                     SELECT id, $2, worker_id, 'running' FROM chime_runs WHERE id = $1",
                )
                .bind(id)
                .bind(attempt)
                .execute(&pool)
                .await
                .unwrap();
            }
            let fence = leader(&store).await;
            let rescued = store
                .rescue_lost_runs(&fence, Duration::from_secs(1), 100)
                .await
                .unwrap()
                .expect("leading");
            let mut states: Vec<(i64, RunState)> =
                rescued.iter().map(|r| (r.id, r.state)).collect();
            states.sort_unstable();
            assert_eq!(
                states,
                [
                    (again, RunState::Pending),
                    (last, RunState::Dead),
                    (cancelled, RunState::Cancelled)
                ]
            );
            let detail = &rescued.iter().find(|r| r.id == again).unwrap().detail;
            assert!(
                detail.starts_with("worker w1 lost (no heartbeat since "),
                "{detail}"
            );
            assert_eq!(
                state(&pool, last).await.1.as_deref(),
                Some("worker lost on the last attempt (2 of 2)")
            );
            assert_eq!(state(&pool, healthy).await.0, "running");
            let lost: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM chime_attempts WHERE state = 'lost' AND error LIKE 'worker w1 lost%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(lost, 3);
            // The outbox publishes the rescued run as attempt 2.
            let out = store
                .outbox(Utc::now() + chrono::Duration::seconds(1), 10)
                .await
                .unwrap();
            assert_eq!(out.len(), 1);
            assert_eq!((out[0].id, out[0].attempt), (again, 2));

            // A stale leader rescues nothing.
            let stale = Fence {
                holder: "me".into(),
                term: fence.term - 1,
            };
            assert_eq!(
                store
                    .rescue_lost_runs(&stale, Duration::from_secs(1), 100)
                    .await
                    .unwrap(),
                None
            );
        }

        /// Regression: a definition stored before max_attempts was bounded (3000000000, beyond
        /// PostgreSQL's integer) made every rescue statement fail with "out of range for type
        /// integer", so no lost run of any job was rescued any more.
        #[sqlx::test(migrations = "../migrations")]
        async fn an_out_of_range_stored_max_attempts_stops_no_rescue(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            for (name, retry) in [
                (
                    "huge",
                    serde_json::json!({"max_attempts": 3_000_000_000_u64}),
                ),
                ("beyond-numeric", serde_json::json!({"max_attempts": 1e300})),
                ("negative", serde_json::json!({"max_attempts": -5})),
                ("text", serde_json::json!({"max_attempts": "many"})),
                ("plain", serde_json::json!({"max_attempts": 2})),
            ] {
                job(
                    &pool,
                    name,
                    serde_json::json!({"name": name, "group": "g", "retry": retry}),
                )
                .await;
            }
            sqlx::query(
                "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, heartbeat_at)
                 VALUES ('w1', 'g', 'h', 1, '{}', now() - interval '1 hour')",
            )
            .execute(&pool)
            .await
            .unwrap();
            let huge = run(&pool, "huge", "running", 1).await;
            let beyond = run(&pool, "beyond-numeric", "running", 1).await;
            let negative = run(&pool, "negative", "running", 1).await;
            let text = run(&pool, "text", "running", 1).await;
            let unrelated = run(&pool, "plain", "running", 1).await;
            let fence = leader(&store).await;
            let settings = crate::config::RescuerSettings {
                rescue_after: Duration::from_secs(1),
                ..crate::config::RescuerSettings::default()
            };
            assert!(crate::rescuer::pass(&store, &fence, &settings).await);

            assert_eq!(
                state(&pool, unrelated).await.0,
                "pending",
                "unrelated run rescued"
            );
            assert_eq!(
                state(&pool, huge).await.0,
                "pending",
                "3e9 attempts: retried"
            );
            assert_eq!(
                state(&pool, beyond).await.0,
                "pending",
                "clamped to i32::MAX"
            );
            // At least one attempt: a negative count means this one was the last.
            assert_eq!(state(&pool, negative).await.0, "dead");
            assert_eq!(
                state(&pool, text).await.0,
                "pending",
                "not a number: default 3"
            );
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn jobs_with_their_own_webhook_are_found(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            job(
                &pool,
                "plain",
                serde_json::json!({"name": "plain", "group": "g"}),
            )
            .await;
            job(
                &pool,
                "fmt",
                serde_json::json!({"name": "fmt", "group": "g",
                                                 "alerts": {"format": "slack"}}),
            )
            .await;
            assert!(!store.any_job_alert_webhook().await.unwrap());
            job(
                &pool,
                "hook",
                serde_json::json!({"name": "hook", "group": "g",
                                                  "alerts": {"webhook": "http://h/x"}}),
            )
            .await;
            assert!(store.any_job_alert_webhook().await.unwrap());
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn alerts_are_recorded_once_and_rate_limited_per_job_and_kind(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            let fence = leader(&store).await;
            let first = run(&pool, "j", "dead", 3).await;
            let second = run(&pool, "j", "dead", 3).await;
            let record = |run_id| AlertRecord {
                kind: AlertKind::Dead,
                job: "j".into(),
                group: "g".into(),
                run_id,
                attempt: 3,
                target: "http://h".into(),
                payload: serde_json::json!({}),
                min_interval: Duration::from_secs(60),
            };
            let events = store
                .alert_events((Utc::now() - chrono::Duration::minutes(1), 0, ""), 10)
                .await
                .unwrap();
            assert_eq!(events.len(), 2);
            assert_eq!(events[0].kind, Some(AlertKind::Dead));
            let claimed = store
                .record_alert(&fence, &record(first))
                .await
                .unwrap()
                .expect("leading")
                .expect("new");
            assert!(!claimed.suppressed);
            store.finish_alert(claimed.id, true, None).await.unwrap();
            assert_eq!(
                store.record_alert(&fence, &record(first)).await.unwrap(),
                Some(None),
                "recorded once"
            );
            let again = store
                .record_alert(&fence, &record(second))
                .await
                .unwrap()
                .expect("leading")
                .expect("new");
            assert!(again.suppressed, "within min_interval of the first");
            let events = store
                .alert_events((Utc::now() - chrono::Duration::minutes(1), 0, ""), 10)
                .await
                .unwrap();
            assert!(
                events.is_empty(),
                "recorded events are not read again: {events:?}"
            );
            let stale = Fence {
                holder: "other".into(),
                term: fence.term,
            };
            assert_eq!(store.record_alert(&stale, &record(9)).await.unwrap(), None);
        }

        #[sqlx::test(migrations = "../migrations")]
        async fn replay_puts_a_dead_run_back_as_the_next_attempt(pool: PgPool) {
            let store = Store::from_pool(pool.clone());
            let dead = run(&pool, "j", "dead", 3).await;
            let live = run(&pool, "j", "running", 1).await;
            assert_eq!(
                store.replay_run(dead, "cli:a").await.unwrap(),
                ReplayOutcome::Replayed {
                    job: "j".into(),
                    group: "g".into(),
                    next_attempt: 4
                }
            );
            let row = sqlx::query(
                "SELECT state, replayed_by, replayed_at IS NOT NULL AS at, error FROM chime_runs WHERE id = $1",
            )
            .bind(dead)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(row.get::<String, _>("state"), "pending");
            assert_eq!(row.get::<String, _>("replayed_by"), "cli:a");
            assert!(row.get::<bool, _>("at"));
            assert_eq!(
                store.replay_run(live, "cli:a").await.unwrap(),
                ReplayOutcome::NotReplayable {
                    state: "running".into()
                }
            );
            assert_eq!(
                store.replay_run(9_999, "cli:a").await.unwrap(),
                ReplayOutcome::NotFound
            );
        }
    }
}
