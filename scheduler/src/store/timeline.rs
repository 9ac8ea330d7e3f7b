//! The SQL of the dashboard's runs-over-time chart: top-level runs (fires, not their tasks)
//! created per time bucket, by their state now. Part of [`crate::store`].
//!
//! The query is a range scan of the index `chime_runs_created` (on `created_at`), reading the
//! rows it finds for their state; runs are inserted in creation order, so one hour's runs sit
//! together in the table. Measured on 10 million runs (one every 0.5 s): 3 ms for the last hour
//! (7,200 runs), 100 ms for the last day. Including `state` in the index (an index-only scan)
//! made the hour no faster and the day 25 % faster, for an index 80 % larger, so it is not
//! done. Buckets are aligned to the Unix epoch with `date_bin`, so an instant always falls in
//! the same bucket.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::Store;

impl Store {
    /// Runs created in `[from, to)`, counted per `bucket_seconds`-long bucket (aligned to the
    /// epoch) and state: `(bucket start, state, count)`, by bucket then state, empty buckets
    /// left out.
    pub async fn run_state_buckets(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        bucket_seconds: i64,
    ) -> anyhow::Result<Vec<(DateTime<Utc>, String, i64)>> {
        let rows = sqlx::query(
            "SELECT date_bin(make_interval(secs => $3), created_at, 'epoch') AS bucket,
                    state, count(*) AS n
             FROM chime_runs
             WHERE created_at >= $1 AND created_at < $2 AND parent_id IS NULL
             GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(from)
        .bind(to)
        .bind(bucket_seconds as f64)
        .fetch_all(self.pool())
        .await
        .context("counting runs per time bucket and state")?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("bucket"), r.get("state"), r.get("n")))
            .collect())
    }
}
