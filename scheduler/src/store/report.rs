//! The SQL of the per-job report: one job's runs per day (in the job's time zone) by state,
//! with the median and 95th percentile duration per day. Part of [`crate::store`].
//!
//! The job's rows are read through the index `chime_runs_job_recent` (on `job_name, id`),
//! from the first run created since the window opened (found through `chime_runs_created`,
//! with an hour's slack for runs written ahead of their instant and long transactions): ids
//! grow with `created_at`, so the scan reads the window's runs of this job and no others, and
//! its cost does not grow with the job's history nor with other jobs' runs.

use anyhow::Context as _;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::Row as _;

use super::Store;

/// One day's runs of one state (`state` none: the day's durations over every state).
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    /// The day, in the time zone the query named.
    pub day: NaiveDate,
    /// Run state; none on the day's summary row.
    pub state: Option<String>,
    /// Runs.
    pub runs: i64,
    /// Median of finished − started, in milliseconds, of the runs that have both.
    pub p50_ms: Option<f64>,
    /// 95th percentile of the same.
    pub p95_ms: Option<f64>,
}

impl Store {
    /// Runs of `job` scheduled in `[from, to)`, per day in `timezone` (an IANA name) and
    /// state, plus one summary row per day (state none) with duration percentiles; days
    /// without runs are left out.
    pub async fn job_report_rows(
        &self,
        job: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        timezone: &str,
    ) -> anyhow::Result<Vec<ReportRow>> {
        let rows = sqlx::query(
            "WITH first AS (
                 SELECT id FROM chime_runs
                 WHERE created_at >= $2 - interval '1 hour'
                 ORDER BY created_at LIMIT 1
             ), runs AS (
                 SELECT (scheduled_at AT TIME ZONE $4)::date AS day, state,
                        (extract(epoch FROM finished_at - started_at) * 1000)::float8 AS ms
                 FROM chime_runs
                 WHERE job_name = $1 AND parent_id IS NULL
                   AND id >= (SELECT id FROM first)
                   AND scheduled_at >= $2 AND scheduled_at < $3
             )
             SELECT day, state, count(*) AS runs,
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
                    percentile_cont(0.95) WITHIN GROUP (ORDER BY ms) AS p95
             FROM runs
             GROUP BY GROUPING SETS ((day, state), (day))
             ORDER BY day, state NULLS FIRST",
        )
        .bind(job)
        .bind(from)
        .bind(to)
        .bind(timezone)
        .fetch_all(self.pool())
        .await
        .with_context(|| format!("counting the runs of job {job:?} per day and state"))?;
        Ok(rows
            .into_iter()
            .map(|r| ReportRow {
                day: r.get("day"),
                state: r.get("state"),
                runs: r.get("runs"),
                p50_ms: r.get("p50"),
                p95_ms: r.get("p95"),
            })
            .collect())
    }
}
