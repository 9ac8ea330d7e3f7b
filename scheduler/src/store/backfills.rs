//! The SQL of backfills ([`crate::backfill`]): the batch rows, the runs the leader makes of
//! their fires under its fence, their progress, and cancelling a batch. Part of
//! [`crate::store`].

use std::collections::BTreeMap;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row as _;

use super::{Fence, OUTBOX_CHANNEL, Store, notify};

/// Notification channel: a backfill was requested, or a run of one ended (payload: its id). The
/// leader's backfill duty wakes on it.
pub const BACKFILLS_CHANNEL: &str = "chime_backfills";

/// The unfinished run states: a backfill's runs in them count against its `parallel`.
const UNFINISHED: &str = "('pending', 'queued', 'running', 'retrying')";

/// A backfill to record, validated by [`crate::ops`].
#[derive(Debug, Clone)]
pub struct NewBackfill<'a> {
    /// The job.
    pub job: &'a str,
    /// Fires at or after this instant…
    pub from: DateTime<Utc>,
    /// …and before this one.
    pub to: DateTime<Utc>,
    /// Runs unfinished at once, at most.
    pub parallel: i32,
    /// Runs made per second, at most.
    pub rate: i32,
    /// The fires of the range, counted when it was requested.
    pub fires_total: i32,
    /// Who asked (`cli:alice`, `token:ops`).
    pub requested_by: &'a str,
}

/// A backfill as listed and shown, with its progress.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BackfillRecord {
    /// Backfill id.
    pub id: i64,
    /// The job.
    pub job: String,
    /// Fires at or after this instant…
    pub from: DateTime<Utc>,
    /// …and before this one.
    pub to: DateTime<Utc>,
    /// Runs of it unfinished at once, at most.
    pub parallel: i32,
    /// Runs it makes per second, at most.
    pub rate: i32,
    /// `running`, `done` or `cancelled`.
    pub state: String,
    /// The fires of the range when it was requested.
    pub fires_total: i32,
    /// Runs it made.
    pub fires_made: i32,
    /// Fires it found with a run already (scheduled, caught up or another backfill's), which
    /// it left alone.
    pub fires_existing: i32,
    /// Every fire up to this instant has been handled (`null`: none yet; `to` once all have).
    pub cursor_at: Option<DateTime<Utc>>,
    /// Its runs by state now (`{"succeeded": 40, "running": 4}`); runs pruned by retention are
    /// no longer counted.
    pub runs: BTreeMap<String, i64>,
    /// `made/total made, 3 existing; 40 ok, 1 failed, 4 left` in words.
    pub progress: String,
    /// Who asked for it.
    pub requested_by: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// When it ended (done or cancelled).
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it was cancelled.
    pub reason: Option<String>,
    /// Who cancelled it.
    pub cancelled_by: Option<String>,
}

/// Which backfills to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct BackfillQuery {
    /// Only this job's.
    pub job: Option<String>,
    /// Only those in this state.
    pub state: Option<String>,
    /// Only those with an id below this (the previous page's `next_before`).
    pub before: Option<i64>,
    /// Page size.
    pub limit: i64,
}

/// A running backfill as the leader's duty works on it.
#[derive(Debug, Clone, PartialEq)]
pub struct BackfillWork {
    /// Backfill id.
    pub id: i64,
    /// The job.
    pub job: String,
    /// Fires at or after this instant…
    pub from: DateTime<Utc>,
    /// …and before this one.
    pub to: DateTime<Utc>,
    /// Runs unfinished at once, at most.
    pub parallel: i32,
    /// Runs made per second, at most.
    pub rate: i32,
    /// Every fire up to this instant has been handled; `None`: none yet.
    pub cursor_at: Option<DateTime<Utc>>,
    /// Its runs unfinished now.
    pub active: i64,
}

impl BackfillWork {
    /// Whether every fire of the range has been handled.
    pub fn every_fire_handled(&self) -> bool {
        self.cursor_at.is_some_and(|at| at >= self.to)
    }
}

/// What one step of a backfill wrote ([`Store::backfill_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// The fence no longer holds: nothing was written.
    LeaseLost,
    /// The backfill is no longer running, or another step moved its cursor first: nothing
    /// was written.
    Stale,
    /// The runs made and the fires found with a run already.
    Wrote {
        /// Runs created, and skipped runs made to run.
        made: i64,
        /// Fires that had a run.
        existing: i64,
    },
}

/// What cancelling a backfill did ([`Store::cancel_backfill`]).
#[derive(Debug, Clone, PartialEq)]
pub enum BackfillCancel {
    /// No such backfill.
    NotFound,
    /// It had ended already, in this state.
    Ended {
        /// `done` or `cancelled`.
        state: String,
    },
    /// Cancelled: its waiting runs are cancelled; those running were asked to stop and their
    /// workers must be told.
    Cancelled {
        /// The job.
        job: String,
        /// Runs cancelled at once (pending, queued, retrying).
        cancelled: i64,
        /// Runs running, whose cancel was requested.
        running: Vec<i64>,
    },
}

/// A fire's run, as a backfill's preview finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FireRun {
    /// Run id.
    pub id: i64,
    /// Its state now.
    pub state: String,
    /// How it came to be (`schedule`, `catchup`, `backfill`).
    pub trigger: String,
}

impl Store {
    /// Records a backfill as `running` and wakes the leader's duty. Returns its id.
    pub async fn create_backfill(&self, new: &NewBackfill<'_>) -> anyhow::Result<i64> {
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO chime_backfills (job_name, from_at, to_at, parallel, rate, fires_total,
                                          requested_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(new.job)
        .bind(new.from)
        .bind(new.to)
        .bind(new.parallel)
        .bind(new.rate)
        .bind(new.fires_total)
        .bind(new.requested_by)
        .fetch_one(&mut *tx)
        .await
        .with_context(|| format!("recording a backfill of job {:?}", new.job))?;
        notify(&mut tx, BACKFILLS_CHANNEL, &id.to_string()).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// A page of backfills, newest first, each with its runs by state.
    pub async fn backfills(&self, query: &BackfillQuery) -> anyhow::Result<Vec<BackfillRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{BACKFILL_SELECT}
             WHERE ($1::text IS NULL OR b.job_name = $1)
               AND ($2::text IS NULL OR b.status = $2)
               AND ($3::bigint IS NULL OR b.id < $3)
             ORDER BY b.id DESC LIMIT $4"
        )))
        .bind(query.job.as_deref())
        .bind(query.state.as_deref())
        .bind(query.before)
        .bind(query.limit)
        .fetch_all(&self.pool)
        .await
        .context("listing backfills")?;
        rows.into_iter().map(backfill_record).collect()
    }

    /// One backfill with its runs by state.
    pub async fn backfill(&self, id: i64) -> anyhow::Result<Option<BackfillRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{BACKFILL_SELECT} WHERE b.id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("reading backfill {id}"))?;
        row.map(backfill_record).transpose()
    }

    /// The running backfills, oldest first, at most `limit`, each with its unfinished runs.
    pub async fn running_backfills(&self, limit: i64) -> anyhow::Result<Vec<BackfillWork>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT b.id, b.job_name, b.from_at, b.to_at, b.parallel, b.rate, b.cursor_at,
                    (SELECT count(*) FROM chime_runs r
                     WHERE r.backfill_id = b.id AND r.state IN {UNFINISHED}) AS active
             FROM chime_backfills b WHERE b.status = 'running' ORDER BY b.id LIMIT $1"
        )))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .context("reading the running backfills")?;
        Ok(rows
            .into_iter()
            .map(|r| BackfillWork {
                id: r.get("id"),
                job: r.get("job_name"),
                from: r.get("from_at"),
                to: r.get("to_at"),
                parallel: r.get("parallel"),
                rate: r.get("rate"),
                cursor_at: r.get("cursor_at"),
                active: r.get("active"),
            })
            .collect())
    }

    /// One step of backfill `work`, under the leader's fence: makes a `pending` run (trigger
    /// `backfill`, the job's group and params, its retry policy and definition version) of each
    /// fire of `fires` that has no run yet, makes a fire's `skipped` run such a run (its reason
    /// says it was skipped before, and why), and moves the backfill's cursor to `cursor` with
    /// its counts, in one statement; then wakes the outbox. Nothing is written unless the backfill
    /// is still running with the cursor `work` read: a cancel, or a step of another leader,
    /// in between makes this one [`Stepped::Stale`].
    pub async fn backfill_step(
        &self,
        fence: &Fence,
        work: &BackfillWork,
        group: &str,
        params: &serde_json::Value,
        fires: &[DateTime<Utc>],
        cursor: DateTime<Utc>,
    ) -> anyhow::Result<Stepped> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), b AS (
                 SELECT c.id FROM chime_backfills c
                 WHERE c.id = $3 AND c.status = 'running' AND EXISTS (SELECT FROM lease)
                   AND c.cursor_at IS NOT DISTINCT FROM $4
                 FOR UPDATE
             ), ins AS (
                 INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                         term, retry_policy, job_version, backfill_id)
                 SELECT j.name, $6, f.at, 'backfill', $7, 'pending', lease.term,
                        chime_retry_snapshot(j.spec), j.version, b.id
                 FROM unnest($8::timestamptz[]) AS f(at)
                 CROSS JOIN b CROSS JOIN lease
                 JOIN chime_jobs j ON j.name = $5
                 ON CONFLICT (job_name, scheduled_at)
                 WHERE trigger IN ('schedule', 'catchup', 'backfill') AND parent_id IS NULL
                 DO NOTHING
                 RETURNING id
             ), revived AS (
                 -- A fire whose run was skipped never ran: that run is made the backfill's.
                 UPDATE chime_runs r SET
                     state = 'pending', trigger = 'backfill', backfill_id = b.id,
                     group_name = $6, params = $7, term = lease.term,
                     retry_policy = chime_retry_snapshot(j.spec), job_version = j.version,
                     reason = format('skipped before (%s); run by backfill %s',
                                     coalesce(r.reason, 'no reason recorded'), b.id),
                     finished_at = NULL
                 FROM b CROSS JOIN lease JOIN chime_jobs j ON j.name = $5
                 WHERE r.job_name = $5 AND r.parent_id IS NULL AND r.state = 'skipped'
                   AND r.scheduled_at = ANY ($8::timestamptz[])
                 RETURNING r.id
             ), upd AS (
                 UPDATE chime_backfills c SET
                     cursor_at = $9,
                     fires_made = c.fires_made + (SELECT count(*) FROM ins)
                                  + (SELECT count(*) FROM revived),
                     fires_existing = c.fires_existing + cardinality($8::timestamptz[])
                                      - (SELECT count(*) FROM ins) - (SELECT count(*) FROM revived)
                 FROM b WHERE c.id = b.id
                 RETURNING c.id
             )
             SELECT EXISTS (SELECT FROM lease) AS leased, EXISTS (SELECT FROM upd) AS stepped,
                    (SELECT count(*) FROM ins) + (SELECT count(*) FROM revived) AS made",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(work.id)
        .bind(work.cursor_at)
        .bind(&work.job)
        .bind(group)
        .bind(params)
        .bind(fires)
        .bind(cursor)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .with_context(|| format!("making runs of backfill {}", work.id))?;
        if !row.get::<bool, _>("leased") {
            return Ok(Stepped::LeaseLost);
        }
        if !row.get::<bool, _>("stepped") {
            return Ok(Stepped::Stale);
        }
        let made: i64 = row.get("made");
        if made > 0 {
            notify(&mut tx, OUTBOX_CHANNEL, "backfill").await?;
        }
        tx.commit().await?;
        let existing = i64::try_from(fires.len()).unwrap_or(i64::MAX) - made;
        Ok(Stepped::Wrote { made, existing })
    }

    /// Ends running backfill `id` under the leader's fence: `done`, or `cancelled` with
    /// `reason` (its job was deleted). Returns `None` when the fence no longer holds, else
    /// whether it was still running.
    pub async fn end_backfill(
        &self,
        fence: &Fence,
        id: i64,
        reason: Option<&str>,
    ) -> anyhow::Result<Option<bool>> {
        let row = sqlx::query(
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), upd AS (
                 UPDATE chime_backfills SET
                     status = CASE WHEN $4::text IS NULL THEN 'done' ELSE 'cancelled' END,
                     reason = $4, cancelled_by = CASE WHEN $4::text IS NULL THEN NULL
                                                      ELSE 'scheduler' END,
                     finished_at = now()
                 WHERE id = $3 AND status = 'running' AND EXISTS (SELECT FROM lease)
                 RETURNING id
             )
             SELECT EXISTS (SELECT FROM lease) AS leased, EXISTS (SELECT FROM upd) AS ended",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(id)
        .bind(reason)
        .fetch_one(&self.pool)
        .await
        .with_context(|| format!("ending backfill {id}"))?;
        Ok(row
            .get::<bool, _>("leased")
            .then(|| row.get::<bool, _>("ended")))
    }

    /// An operator's cancel of backfill `id`, by `by`: it makes no more runs, its waiting runs
    /// (pending, queued, retrying) are cancelled at once and the cancel of its running ones is
    /// requested, as [`Store::cancel_run`] does for one run. The backfill's row is locked
    /// first, so a step of the leader either committed before (its runs are cancelled here) or
    /// finds it cancelled and writes nothing.
    pub async fn cancel_backfill(&self, id: i64, by: &str) -> anyhow::Result<BackfillCancel> {
        let mut tx = self.pool.begin().await?;
        let row =
            sqlx::query("SELECT status, job_name FROM chime_backfills WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .with_context(|| format!("reading backfill {id}"))?;
        let Some(row) = row else {
            return Ok(BackfillCancel::NotFound);
        };
        let state: String = row.get("status");
        if state != "running" {
            return Ok(BackfillCancel::Ended { state });
        }
        let job: String = row.get("job_name");
        sqlx::query(
            "UPDATE chime_backfills SET status = 'cancelled', cancelled_by = $2,
                    reason = 'cancelled by ' || $2, finished_at = now()
             WHERE id = $1",
        )
        .bind(id)
        .bind(by)
        .execute(&mut *tx)
        .await
        .with_context(|| format!("cancelling backfill {id}"))?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH targets AS (
                 SELECT r.id, r.state FROM chime_runs r
                 WHERE r.backfill_id = $1 AND r.state IN {UNFINISHED}
                 ORDER BY r.id FOR UPDATE
             )
             UPDATE chime_runs r SET
                 cancel_requested_at = coalesce(r.cancel_requested_at, now()),
                 cancel_requested_by = coalesce(r.cancel_requested_by, $2),
                 state = CASE WHEN t.state = 'running' THEN 'running' ELSE 'cancelled' END,
                 finished_at = CASE WHEN t.state = 'running' THEN r.finished_at ELSE now() END,
                 reason = CASE WHEN t.state = 'running' THEN r.reason
                               ELSE 'cancelled by ' || $2 || ' with backfill ' || $1 END
             FROM targets t WHERE r.id = t.id
             RETURNING r.id, t.state AS before"
        )))
        .bind(id)
        .bind(by)
        .fetch_all(&mut *tx)
        .await
        .with_context(|| format!("cancelling the runs of backfill {id}"))?;
        tx.commit().await?;
        let mut running = Vec::new();
        let mut cancelled = 0;
        for r in rows {
            if r.get::<&str, _>("before") == "running" {
                running.push(r.get("id"));
            } else {
                cancelled += 1;
            }
        }
        running.sort_unstable();
        Ok(BackfillCancel::Cancelled {
            job,
            cancelled,
            running,
        })
    }

    /// The runs job `job` has at the fire instants `fires` (found by the fire key: manual runs
    /// and tasks are not fires), by instant: what a backfill of them would find there.
    pub async fn fire_runs(
        &self,
        job: &str,
        fires: &[DateTime<Utc>],
    ) -> anyhow::Result<BTreeMap<DateTime<Utc>, FireRun>> {
        let rows = sqlx::query(
            "SELECT id, scheduled_at, state, trigger FROM chime_runs
             WHERE job_name = $1 AND scheduled_at = ANY ($2::timestamptz[])
               AND trigger IN ('schedule', 'catchup', 'backfill') AND parent_id IS NULL",
        )
        .bind(job)
        .bind(fires)
        .persistent(false)
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("reading the runs of job {job:?} at its fires"))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get("scheduled_at"),
                    FireRun {
                        id: r.get("id"),
                        state: r.get("state"),
                        trigger: r.get("trigger"),
                    },
                )
            })
            .collect())
    }
}

/// A backfill's row with its runs by state (a JSON object), for [`backfill_record`].
const BACKFILL_SELECT: &str = "SELECT b.*, coalesce((
         SELECT jsonb_object_agg(s.state, s.n) FROM (
             SELECT r.state, count(*) AS n FROM chime_runs r WHERE r.backfill_id = b.id
             GROUP BY r.state) s), '{}') AS runs
     FROM chime_backfills b";

fn backfill_record(r: sqlx::postgres::PgRow) -> anyhow::Result<BackfillRecord> {
    let runs: BTreeMap<String, i64> =
        serde_json::from_value(r.get("runs")).context("decoding a backfill's run counts")?;
    let (total, made, existing) = (
        r.get::<i32, _>("fires_total"),
        r.get::<i32, _>("fires_made"),
        r.get::<i32, _>("fires_existing"),
    );
    Ok(BackfillRecord {
        id: r.get("id"),
        job: r.get("job_name"),
        from: r.get("from_at"),
        to: r.get("to_at"),
        parallel: r.get("parallel"),
        rate: r.get("rate"),
        state: r.get("status"),
        progress: progress(total, made, existing, &runs),
        fires_total: total,
        fires_made: made,
        fires_existing: existing,
        cursor_at: r.get("cursor_at"),
        runs,
        requested_by: r.get("requested_by"),
        created_at: r.get("created_at"),
        finished_at: r.get("finished_at"),
        reason: r.get("reason"),
        cancelled_by: r.get("cancelled_by"),
    })
}

/// A backfill's progress in words: `12/40 fires handled (10 made, 2 existing); 8 succeeded,
/// 1 failed, 1 left` (each ended state with runs named, then the unfinished ones together).
pub fn progress(total: i32, made: i32, existing: i32, runs: &BTreeMap<String, i64>) -> String {
    let handled = i64::from(made) + i64::from(existing);
    let mut text = format!("{handled}/{total} fires handled ({made} made, {existing} existing)");
    let mut parts = Vec::new();
    let mut left = 0;
    for (state, n) in runs {
        if ["pending", "queued", "running", "retrying"].contains(&state.as_str()) {
            left += n;
        } else {
            parts.push(format!("{n} {state}"));
        }
    }
    if left > 0 {
        parts.push(format!("{left} left"));
    }
    if !parts.is_empty() {
        text.push_str("; ");
        text.push_str(&parts.join(", "));
    }
    text
}
