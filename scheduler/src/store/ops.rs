//! The SQL of the operations surface: API tokens, the audit log, runtime job changes, runs pages
//! (keyset pagination), the worker registry as operators see it, and retention. Part of
//! [`crate::store`].

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row as _;

use super::{JOBS_CHANNEL, LISTED_RUN_COLUMNS, RunRecord, Store, notify, run_record, set_actor};
use crate::job::JobSpec;

/// One numbered version of a job's definition (`chime_job_versions`).
#[derive(Debug, Clone, PartialEq)]
pub struct JobVersion {
    /// Its number: 1 for the first definition, one more for each change.
    pub version: i32,
    /// The definition.
    pub spec: JobSpec,
    /// `config` (a job file) or `api`.
    pub source: String,
    /// Who made it: `file` for job files, else the actor (`token:ops`, `cli:alice`).
    pub actor: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// An API token as stored (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenRecord {
    /// Token id.
    pub id: i64,
    /// Unique name, shown in the audit log as `token:NAME`.
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Who created it.
    pub created_by: String,
    /// When it was last used (updated at most once a minute).
    pub last_used_at: Option<DateTime<Utc>>,
    /// When it was revoked; a revoked token is refused.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// One audit log entry to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuditEntry<'a> {
    /// `token:NAME` or `cli:USER`.
    pub actor: &'a str,
    /// The caller's role.
    pub role: &'a str,
    /// What was asked for, such as `jobs.trigger`.
    pub action: &'a str,
    /// `ok`, `denied` or `failed`.
    pub outcome: &'a str,
    /// The job concerned.
    pub job: Option<&'a str>,
    /// The run concerned.
    pub run_id: Option<i64>,
    /// Anything else worth keeping (params given, the reason of a refusal).
    pub detail: serde_json::Value,
}

/// One audit log entry as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    /// Entry id (increasing).
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// With which role.
    pub role: String,
    /// What.
    pub action: String,
    /// `ok`, `denied` or `failed`.
    pub outcome: String,
    /// Which job.
    pub job: Option<String>,
    /// Which run.
    pub run_id: Option<i64>,
    /// Details.
    pub detail: serde_json::Value,
}

/// A page query of the audit log, newest first.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// Only entries about this job.
    pub job: Option<String>,
    /// Only entries of this actor.
    pub actor: Option<String>,
    /// Only entries older than this id (the previous page's `next_before`).
    pub before: Option<i64>,
    /// Page size.
    pub limit: i64,
}

/// A page query of runs, newest first (keyset pagination on the run id).
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    /// Only this job.
    pub job: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only this executor group.
    pub group: Option<String>,
    /// Only runs with an id below this (the previous page's `next_before`).
    pub before: Option<i64>,
    /// Page size.
    pub limit: i64,
    /// Tasks too (the runs of broadcast, sharded and map/reduce fires); by default only
    /// top-level runs, one per fire, are listed.
    pub include_tasks: bool,
    /// Only the runs of this backfill.
    pub backfill: Option<i64>,
}

/// A worker as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerRecord {
    /// Worker id.
    pub id: String,
    /// Executor group it consumes.
    pub group: String,
    /// Host it runs on.
    pub hostname: String,
    /// Most runs it executes at once (its prefetch).
    pub capacity: i32,
    /// Jobs it has handlers for.
    pub jobs: Vec<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its latest heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// When it stopped, if it did.
    pub stopped_at: Option<DateTime<Utc>>,
    /// Not stopped and heartbeating (at most three heartbeat intervals old).
    pub online: bool,
    /// Runs it is executing now.
    pub running: i64,
}

/// A run as the metrics observer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedRun {
    /// Run id.
    pub id: i64,
    /// Job.
    pub job: String,
    /// State.
    pub state: String,
    /// Attempts started.
    pub attempt: i32,
    /// Scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// When the broker's confirm was recorded.
    pub published_at: Option<DateTime<Utc>>,
    /// When the latest recorded attempt's handler started (`None` while that attempt runs).
    pub started_at: Option<DateTime<Utc>>,
    /// In a final state.
    pub is_final: bool,
    /// Created long enough ago to stop watching it.
    pub settled: bool,
    /// A task of a broadcast, sharded or map/reduce fire.
    pub is_task: bool,
    /// A parent run (with tasks): never published nor run by a handler itself.
    pub has_tasks: bool,
    /// For a child job's run, when its upstream run ended.
    pub upstream_finished_at: Option<DateTime<Utc>>,
    /// For a workflow node's run, the latest end among the other node runs of its workflow run
    /// before it was made (what the advance that made it answered); `None` for a first node.
    pub node_wait_from: Option<DateTime<Utc>>,
    /// A workflow run (a run of a workflow job).
    pub is_workflow: bool,
}

impl Store {
    /// The job and params of each of the runs `ids` (those that exist), for hiding their secrets.
    pub async fn run_params(
        &self,
        ids: &[i64],
    ) -> anyhow::Result<Vec<(i64, String, serde_json::Value)>> {
        let rows = sqlx::query("SELECT id, job_name, params FROM chime_runs WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .context("loading the params of runs")?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("id"), r.get("job_name"), r.get("params")))
            .collect())
    }

    // ---- API tokens -----------------------------------------------------------------------

    /// Stores a new token's hash; `None` if the name is taken.
    pub async fn create_token(
        &self,
        name: &str,
        role: &str,
        secret_sha256: &[u8],
        created_by: &str,
    ) -> anyhow::Result<Option<TokenRecord>> {
        let row = sqlx::query(
            "INSERT INTO chime_api_tokens (name, role, secret_sha256, created_by)
             VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING
             RETURNING id, name, role, created_at, created_by, last_used_at, revoked_at",
        )
        .bind(name)
        .bind(role)
        .bind(secret_sha256)
        .bind(created_by)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("creating API token {name:?}"))?;
        Ok(row.map(token_record))
    }

    /// The unrevoked token with this hash, noting its use (written at most once a minute, so
    /// a busy client does not turn every request into a write).
    pub async fn token_by_hash(&self, secret_sha256: &[u8]) -> anyhow::Result<Option<TokenRecord>> {
        let row = sqlx::query(
            "WITH token AS (
                 SELECT id, name, role, created_at, created_by, last_used_at, revoked_at
                 FROM chime_api_tokens WHERE secret_sha256 = $1 AND revoked_at IS NULL
             ), used AS (
                 UPDATE chime_api_tokens t SET last_used_at = now()
                 FROM token
                 WHERE t.id = token.id
                   AND (token.last_used_at IS NULL
                        OR token.last_used_at < now() - interval '1 minute')
             )
             SELECT * FROM token",
        )
        .bind(secret_sha256)
        .fetch_optional(&self.pool)
        .await
        .context("checking an API token")?;
        Ok(row.map(token_record))
    }

    /// Every token, by name.
    pub async fn tokens(&self) -> anyhow::Result<Vec<TokenRecord>> {
        let rows = sqlx::query(
            "SELECT id, name, role, created_at, created_by, last_used_at, revoked_at
             FROM chime_api_tokens ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .context("listing API tokens")?;
        Ok(rows.into_iter().map(token_record).collect())
    }

    /// Revokes a token; false if there is no unrevoked token of that name.
    pub async fn revoke_token(&self, name: &str) -> anyhow::Result<bool> {
        let done = sqlx::query(
            "UPDATE chime_api_tokens SET revoked_at = now()
             WHERE name = $1 AND revoked_at IS NULL",
        )
        .bind(name)
        .execute(&self.pool)
        .await
        .with_context(|| format!("revoking API token {name:?}"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Whether any token can be used.
    pub async fn any_active_token(&self) -> anyhow::Result<bool> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM chime_api_tokens WHERE revoked_at IS NULL)",
        )
        .fetch_one(&self.pool)
        .await
        .context("looking for API tokens")
    }

    // ---- audit log ------------------------------------------------------------------------

    /// Writes one audit entry; returns its id.
    pub async fn record_audit(&self, entry: &NewAuditEntry<'_>) -> anyhow::Result<i64> {
        sqlx::query_scalar(
            "INSERT INTO chime_audit (actor, role, action, outcome, job_name, run_id, detail)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(entry.actor)
        .bind(entry.role)
        .bind(entry.action)
        .bind(entry.outcome)
        .bind(entry.job)
        .bind(entry.run_id)
        .bind(&entry.detail)
        .fetch_one(&self.pool)
        .await
        .context("writing the audit log")
    }

    /// A page of the audit log, newest first.
    pub async fn audit(&self, query: &AuditQuery) -> anyhow::Result<Vec<AuditRecord>> {
        let rows = sqlx::query(
            "SELECT id, at, actor, role, action, outcome, job_name, run_id, detail
             FROM chime_audit
             WHERE ($1::text IS NULL OR job_name = $1) AND ($2::text IS NULL OR actor = $2)
               AND ($3::bigint IS NULL OR id < $3)
             ORDER BY id DESC LIMIT $4",
        )
        .bind(&query.job)
        .bind(&query.actor)
        .bind(query.before)
        .bind(query.limit)
        .fetch_all(&self.pool)
        .await
        .context("reading the audit log")?;
        Ok(rows
            .into_iter()
            .map(|r| AuditRecord {
                id: r.get("id"),
                at: r.get("at"),
                actor: r.get("actor"),
                role: r.get("role"),
                action: r.get("action"),
                outcome: r.get("outcome"),
                job: r.get("job_name"),
                run_id: r.get("run_id"),
                detail: r.get("detail"),
            })
            .collect())
    }

    // ---- runtime job changes --------------------------------------------------------------

    /// Job `name`'s latest `limit` definition versions, oldest first (those of a deleted job
    /// included), and the one before them when there is one: what the oldest shown changed.
    pub async fn job_versions(&self, name: &str, limit: i64) -> anyhow::Result<Vec<JobVersion>> {
        let rows = sqlx::query(
            "SELECT version, spec, source, actor, created_at FROM chime_job_versions
             WHERE job_name = $1 ORDER BY version DESC LIMIT $2",
        )
        .bind(name)
        .bind(limit.saturating_add(1))
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("reading the versions of job {name:?}"))?;
        let mut versions = rows
            .into_iter()
            .map(|r| job_version(name, r))
            .collect::<anyhow::Result<Vec<JobVersion>>>()?;
        versions.reverse();
        Ok(versions)
    }

    /// Version `version` of job `name`'s definition, and the number of its latest version (0
    /// when it has none).
    pub async fn job_version(
        &self,
        name: &str,
        version: i32,
    ) -> anyhow::Result<(Option<JobVersion>, i32)> {
        let found = sqlx::query(
            "SELECT version, spec, source, actor, created_at FROM chime_job_versions
             WHERE job_name = $1 AND version = $2",
        )
        .bind(name)
        .bind(version)
        .fetch_optional(&self.pool)
        .await
        .with_context(|| format!("reading version {version} of job {name:?}"))?
        .map(|r| job_version(name, r))
        .transpose()?;
        let latest: Option<i32> =
            sqlx::query_scalar("SELECT max(version) FROM chime_job_versions WHERE job_name = $1")
                .bind(name)
                .fetch_one(&self.pool)
                .await
                .with_context(|| format!("reading the versions of job {name:?}"))?;
        Ok((found, latest.unwrap_or(0)))
    }

    /// Creates a job at runtime (`source = 'api'`) as `actor`'s change; false if the name is
    /// taken.
    pub async fn create_api_job(&self, spec: &JobSpec, actor: &str) -> anyhow::Result<bool> {
        let insert = sqlx::query(
            "INSERT INTO chime_jobs (name, group_name, spec, source, paused, paused_by)
             VALUES ($1, $2, $3, 'api', $4, CASE WHEN $4 THEN 'operator' END)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&spec.name)
        .bind(&spec.group)
        .bind(serde_json::to_value(spec)?)
        .bind(spec.paused);
        self.change_api_job(&spec.name, actor, "creating", insert)
            .await
    }

    /// Replaces the definition of a job created at runtime (its cursor and pause state stay)
    /// as `actor`'s change; false if there is no such job created through the API.
    pub async fn update_api_job(&self, spec: &JobSpec, actor: &str) -> anyhow::Result<bool> {
        let update = sqlx::query(
            "UPDATE chime_jobs SET group_name = $2, spec = $3, updated_at = now()
             WHERE name = $1 AND source = 'api'",
        )
        .bind(&spec.name)
        .bind(&spec.group)
        .bind(serde_json::to_value(spec)?);
        self.change_api_job(&spec.name, actor, "updating", update)
            .await
    }

    /// Deletes a job created at runtime (its runs and versions stay); false if there is none of
    /// that name.
    pub async fn delete_api_job(&self, name: &str, actor: &str) -> anyhow::Result<bool> {
        let delete =
            sqlx::query("DELETE FROM chime_jobs WHERE name = $1 AND source = 'api'").bind(name);
        self.change_api_job(name, actor, "deleting", delete).await
    }

    /// Runs `statement` (a change of job `name` by `actor`, whom a new definition version
    /// names) and, when it changed the row, tells the planners (`NOTIFY`) in the same
    /// transaction; whether it changed the row.
    async fn change_api_job(
        &self,
        name: &str,
        actor: &str,
        doing: &str,
        statement: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> anyhow::Result<bool> {
        let mut tx = self.pool.begin().await?;
        set_actor(&mut tx, actor).await?;
        let changed = statement
            .execute(&mut *tx)
            .await
            .with_context(|| format!("{doing} job {name:?}"))?
            .rows_affected()
            == 1;
        if changed {
            notify(&mut tx, JOBS_CHANNEL, name).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    // ---- runs and workers -----------------------------------------------------------------

    /// A page of runs, newest first: top-level runs only, unless `include_tasks`. Every
    /// filter combination is served by an index on `(column, id DESC)` (or the primary key),
    /// so a page costs the same at any depth; leaving tasks out is a filter on the rows read
    /// (a page behind a fire of many tasks reads past them).
    pub async fn runs_page(&self, query: &RunQuery) -> anyhow::Result<Vec<RunRecord>> {
        let top = if query.include_tasks {
            ""
        } else {
            "AND parent_id IS NULL"
        };
        let sql = format!(
            "SELECT {LISTED_RUN_COLUMNS} FROM chime_runs
             WHERE ($1::text IS NULL OR job_name = $1) AND ($2::text IS NULL OR state = $2)
               AND ($3::text IS NULL OR group_name = $3) AND ($4::bigint IS NULL OR id < $4)
               AND ($6::bigint IS NULL OR backfill_id = $6)
               {top}
             ORDER BY id DESC LIMIT $5"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&query.job)
            .bind(&query.state)
            .bind(&query.group)
            .bind(query.before)
            .bind(query.limit)
            .bind(query.backfill)
            .fetch_all(&self.pool)
            .await
            .context("listing runs")?;
        Ok(rows.into_iter().map(run_record).collect())
    }

    /// Workers that are online or stopped within the last day, by group and id.
    pub async fn workers(&self) -> anyhow::Result<Vec<WorkerRecord>> {
        let rows = sqlx::query(
            "SELECT w.id, w.group_name, w.hostname, w.capacity, w.jobs, w.started_at,
                    w.heartbeat_at, w.stopped_at,
                    chime_worker_online(w.stopped_at, w.heartbeat_at, w.heartbeat_interval_ms)
                        AS online,
                    (SELECT count(*) FROM chime_runs r
                     WHERE r.worker_id = w.id AND r.state = 'running') AS running
             FROM chime_workers w
             WHERE w.stopped_at IS NULL OR w.stopped_at > now() - interval '1 day'
             ORDER BY w.group_name, w.id",
        )
        .fetch_all(&self.pool)
        .await
        .context("listing workers")?;
        Ok(rows
            .into_iter()
            .map(|r| WorkerRecord {
                id: r.get("id"),
                group: r.get("group_name"),
                hostname: r.get("hostname"),
                capacity: r.get("capacity"),
                jobs: r.get("jobs"),
                started_at: r.get("started_at"),
                heartbeat_at: r.get("heartbeat_at"),
                stopped_at: r.get("stopped_at"),
                online: r.get("online"),
                running: r.get("running"),
            })
            .collect())
    }

    // ---- retention ------------------------------------------------------------------------

    /// Jobs with their own `retention`, and its value.
    pub async fn job_retentions(&self) -> anyhow::Result<Vec<(String, std::time::Duration)>> {
        let rows = sqlx::query(
            "SELECT name, spec->>'retention' AS retention FROM chime_jobs
             WHERE spec ? 'retention' ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .context("reading jobs' retention")?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let text: Option<String> = r.get("retention");
                let age = humantime::parse_duration(text.as_deref()?).ok()?;
                Some((r.get("name"), age))
            })
            .collect())
    }

    /// Deletes one batch of finished runs created more than `max_age` ago, with their attempts
    /// and log lines (`ON DELETE CASCADE`), under the leader's fence: of `job` when given, else
    /// of every job not in `except`. Oldest first, at most `limit`; rows locked by someone else
    /// are skipped, so the batch never waits. Returns `None` if the fence no longer holds,
    /// else how many runs were deleted.
    ///
    /// Each shape walks one index over old rows only, whatever the table's size: the default
    /// pass `chime_runs_created` (oldest first); a job's pass its `(job_name, id)` index below
    /// the id of the first run created at or after the cutoff (ids follow creation; a run
    /// inserted by a long transaction out of order is pruned by a later pass).
    pub async fn prune_runs(
        &self,
        fence: &super::Fence,
        job: Option<&str>,
        except: &[String],
        max_age: std::time::Duration,
        limit: i64,
    ) -> anyhow::Result<Option<u64>> {
        let (which, order) = if job.is_some() {
            ("r.job_name = $4 AND r.id < b.id", "r.id")
        } else {
            ("r.job_name <> ALL($5)", "r.created_at")
        };
        let sql = format!(
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), bound AS (
                 SELECT coalesce(
                     (SELECT r.id FROM chime_runs r
                      WHERE r.created_at >= now() - make_interval(secs => $3)
                      ORDER BY r.created_at LIMIT 1),
                     (SELECT max(id) + 1 FROM chime_runs),
                     0) AS id
             ), victims AS (
                 SELECT r.id FROM chime_runs r, bound b
                 WHERE EXISTS (SELECT 1 FROM lease)
                   AND r.created_at < now() - make_interval(secs => $3)
                   AND chime_run_ended(r.state)
                   -- Tasks go with their parent (ON DELETE CASCADE), never before it.
                   AND r.parent_id IS NULL
                   AND {which}
                 ORDER BY {order} LIMIT $6
                 FOR UPDATE OF r SKIP LOCKED
             ), deleted AS (
                 DELETE FROM chime_runs r USING victims v WHERE r.id = v.id RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM lease) AS leased,
                    (SELECT count(*) FROM deleted) AS deleted"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&fence.holder)
            .bind(fence.term)
            .bind(max_age.as_secs_f64())
            .bind(job)
            .bind(except)
            .bind(limit)
            .fetch_one(&self.pool)
            .await
            .context("pruning old runs")?;
        if !row.get::<bool, _>("leased") {
            return Ok(None);
        }
        Ok(Some(
            u64::try_from(row.get::<i64, _>("deleted")).unwrap_or(0),
        ))
    }

    /// Deletes one batch of audit entries older than `max_age`, oldest first, at most `limit`,
    /// under the leader's fence; entries locked by someone else are skipped. Returns `None` if
    /// the fence no longer holds, else how many entries were deleted.
    ///
    /// Ids follow `at` (both are assigned at insert), so the old entries are the lowest ids: the
    /// statement walks the primary key from the oldest entry up to the first one inside the
    /// window, whatever the table's size.
    pub async fn prune_audit(
        &self,
        fence: &super::Fence,
        max_age: std::time::Duration,
        limit: i64,
    ) -> anyhow::Result<Option<u64>> {
        let row = sqlx::query(
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), bound AS (
                 SELECT coalesce(
                     (SELECT id FROM chime_audit
                      WHERE at >= now() - make_interval(secs => $3)
                      ORDER BY id LIMIT 1),
                     (SELECT max(id) + 1 FROM chime_audit),
                     0) AS id
             ), victims AS (
                 SELECT a.id FROM chime_audit a, bound b
                 WHERE EXISTS (SELECT 1 FROM lease)
                   AND a.id < b.id
                   AND a.at < now() - make_interval(secs => $3)
                 ORDER BY a.id LIMIT $4
                 FOR UPDATE OF a SKIP LOCKED
             ), deleted AS (
                 DELETE FROM chime_audit a USING victims v WHERE a.id = v.id RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM lease) AS leased,
                    (SELECT count(*) FROM deleted) AS deleted",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(max_age.as_secs_f64())
        .bind(limit)
        .fetch_one(&self.pool)
        .await
        .context("pruning the audit log")?;
        if !row.get::<bool, _>("leased") {
            return Ok(None);
        }
        Ok(Some(
            u64::try_from(row.get::<i64, _>("deleted")).unwrap_or(0),
        ))
    }

    /// How many jobs there are, and how many of them are paused.
    pub async fn job_counts(&self) -> anyhow::Result<(i64, i64)> {
        let row = sqlx::query(
            "SELECT count(*) AS jobs, count(*) FILTER (WHERE paused) AS paused FROM chime_jobs",
        )
        .fetch_one(&self.pool)
        .await
        .context("counting jobs")?;
        Ok((row.get("jobs"), row.get("paused")))
    }

    /// Top-level runs (fires, not their tasks) created within `window`, by state (served by
    /// `chime_runs_created`).
    pub async fn run_state_counts(
        &self,
        window: std::time::Duration,
    ) -> anyhow::Result<Vec<(String, i64)>> {
        let rows = sqlx::query(
            "SELECT state, count(*) AS n FROM chime_runs
             WHERE created_at > now() - make_interval(secs => $1) AND parent_id IS NULL
             GROUP BY state ORDER BY state",
        )
        .bind(window.as_secs_f64())
        .fetch_all(&self.pool)
        .await
        .context("counting recent runs by state")?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("state"), r.get("n")))
            .collect())
    }

    // ---- metrics --------------------------------------------------------------------------

    /// The newest run's id (0 without runs).
    pub async fn newest_run_id(&self) -> anyhow::Result<i64> {
        sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM chime_runs")
            .fetch_one(&self.pool)
            .await
            .context("reading the newest run id")
    }

    /// Runs with an id above `after`, oldest first, at most `limit`, as the metrics observer
    /// reads them, tasks included (`is_task`); `settled` once a run is older than `settle`.
    /// `started_at` only once the run has left `running` (or settled): while it runs, the
    /// column holds the claim's estimate, which the outcome write replaces with the handler's
    /// real start (docs/runs.md).
    pub async fn runs_after(
        &self,
        after: i64,
        limit: i64,
        settle: std::time::Duration,
    ) -> anyhow::Result<Vec<ObservedRun>> {
        let rows = sqlx::query(
            "SELECT id, job_name, state, attempt, scheduled_at, published_at,
                    CASE WHEN state <> 'running' OR settled THEN started_at END AS started_at,
                    chime_run_ended(state) AS is_final, settled,
                    parent_id IS NOT NULL AS is_task, tasks_total > 0 AS has_tasks,
                    (SELECT u.finished_at FROM chime_runs u WHERE u.id = r.upstream_run_id)
                        AS upstream_finished_at,
                    (SELECT max(s.finished_at) FROM chime_runs s
                      WHERE r.workflow_run_id IS NOT NULL AND s.workflow_run_id = r.workflow_run_id
                        AND s.id <> r.id AND s.state <> 'skipped'
                        AND s.finished_at <= r.created_at) AS node_wait_from,
                    r.parent_id IS NULL AND r.workflow_run_id IS NULL AND coalesce(
                        (SELECT chime_job_kind(j.spec) = 'workflow'
                           FROM chime_jobs j WHERE j.name = r.job_name), false) AS is_workflow
             FROM (SELECT *, created_at < now() - make_interval(secs => $3) AS settled
                     FROM chime_runs WHERE id > $1 ORDER BY id LIMIT $2) r
             ORDER BY id",
        )
        .bind(after)
        .bind(limit)
        .bind(settle.as_secs_f64())
        .fetch_all(&self.pool)
        .await
        .context("reading new runs for metrics")?;
        Ok(rows
            .into_iter()
            .map(|r| ObservedRun {
                id: r.get("id"),
                job: r.get("job_name"),
                state: r.get("state"),
                attempt: r.get("attempt"),
                scheduled_at: r.get("scheduled_at"),
                published_at: r.get("published_at"),
                started_at: r.get("started_at"),
                is_final: r.get("is_final"),
                settled: r.get("settled"),
                is_task: r.get("is_task"),
                has_tasks: r.get("has_tasks"),
                upstream_finished_at: r.get("upstream_finished_at"),
                node_wait_from: r.get("node_wait_from"),
                is_workflow: r.get("is_workflow"),
            })
            .collect())
    }

    /// Unfinished runs by job, state and whether they are tasks (served by the partial index
    /// of unfinished runs): `(job, state, is_task, count)`.
    pub async fn active_run_counts(&self) -> anyhow::Result<Vec<(String, String, bool, i64)>> {
        let rows = sqlx::query(
            "SELECT job_name, state, parent_id IS NOT NULL AS is_task, count(*) AS n
             FROM chime_runs
             WHERE state IN ('pending', 'queued', 'running', 'retrying')
             GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        )
        .fetch_all(&self.pool)
        .await
        .context("counting unfinished runs")?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get("job_name"),
                    r.get("state"),
                    r.get("is_task"),
                    r.get("n"),
                )
            })
            .collect())
    }

    /// The group of `job` when no online worker of that group declares a handler for it (online
    /// as [`Store::workers`] counts it); `None` when one does, there is no such job, or it is a
    /// workflow (no handler runs it: its nodes' jobs are checked when they run).
    pub async fn unhandled_job_group(&self, job: &str) -> anyhow::Result<Option<String>> {
        sqlx::query_scalar(
            "SELECT j.group_name FROM chime_jobs j
             WHERE j.name = $1 AND chime_job_kind(j.spec) <> 'workflow' AND NOT EXISTS (
                 SELECT 1 FROM chime_workers w
                 WHERE w.group_name = j.group_name AND j.name = ANY (w.jobs)
                   AND chime_worker_online(w.stopped_at, w.heartbeat_at,
                                           w.heartbeat_interval_ms))",
        )
        .bind(job)
        .fetch_optional(&self.pool)
        .await
        .context("looking for a worker with the job's handler")
    }

    /// Online workers by group.
    pub async fn workers_online(&self) -> anyhow::Result<Vec<(String, i64)>> {
        let rows = sqlx::query(
            "SELECT group_name, count(*) AS n FROM chime_workers
             WHERE chime_worker_online(stopped_at, heartbeat_at, heartbeat_interval_ms)
             GROUP BY group_name ORDER BY group_name",
        )
        .fetch_all(&self.pool)
        .await
        .context("counting online workers")?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("group_name"), r.get("n")))
            .collect())
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> anyhow::Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .context("pinging PostgreSQL")?;
        Ok(())
    }
}

fn token_record(r: sqlx::postgres::PgRow) -> TokenRecord {
    TokenRecord {
        id: r.get("id"),
        name: r.get("name"),
        role: r.get("role"),
        created_at: r.get("created_at"),
        created_by: r.get("created_by"),
        last_used_at: r.get("last_used_at"),
        revoked_at: r.get("revoked_at"),
    }
}

/// A `chime_job_versions` row of job `name`.
fn job_version(name: &str, r: sqlx::postgres::PgRow) -> anyhow::Result<JobVersion> {
    Ok(JobVersion {
        version: r.get("version"),
        spec: serde_json::from_value(r.get("spec"))
            .with_context(|| format!("decoding a stored version of job {name:?}"))?,
        source: r.get("source"),
        actor: r.get("actor"),
        at: r.get("created_at"),
    })
}
