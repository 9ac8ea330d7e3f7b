//! The SQL of child jobs' advancement ([`crate::outbox`]'s sweep makes the runs): the ended runs
//! queued in `chime_advances` turned into their child runs under the leader's fence, exactly once
//! (`chime_advance`). Part of [`crate::store`].

use std::collections::HashMap;

use anyhow::Context as _;
use sqlx::Row as _;

use super::{Fence, LOCK_NOT_AVAILABLE, Store};
use crate::job::ChildJobs;

/// Ended runs one advance takes at most; a full batch wakes the sweep for the next at once.
pub const ADVANCE_BATCH: i32 = 5_000;

/// A child run an ended run asked for, as one advance handled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRun {
    /// The run that ended.
    pub upstream_id: i64,
    /// The child job its definition names.
    pub job: String,
    /// The run made: `None` when the child had been made already (a repeated advance), or
    /// when the child job does not exist.
    pub run_id: Option<i64>,
    /// The state it was made in: `pending`, or `skipped` while the child job is paused.
    pub state: Option<String>,
    /// False when no job of that name exists any more (nothing made).
    pub known: bool,
}

impl Store {
    /// Takes up to `batch` ended runs whose child runs are still to make and makes them, under
    /// the leader's fence (`chime_advance`), so each is made once whichever leader advances.
    /// The children wait `pending` in the outbox: the caller's sweep publishes them. `Ok(None)`
    /// when the fence no longer holds.
    pub async fn advance(
        &self,
        fence: &Fence,
        batch: i32,
    ) -> anyhow::Result<Option<Vec<ChildRun>>> {
        let rows = match sqlx::query(
            "SELECT upstream_id, job_name, run_id, state, known FROM chime_advance($1, $2, $3)",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(batch)
        .fetch_all(&self.pool)
        .await
        {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                return Ok(None);
            }
            Err(e) => return Err(e).context("making the child runs of ended runs"),
        };
        Ok(Some(
            rows.iter()
                .map(|r| ChildRun {
                    upstream_id: r.get("upstream_id"),
                    job: r.get("job_name"),
                    run_id: r.get("run_id"),
                    state: r.get("state"),
                    known: r.get("known"),
                })
                .collect(),
        ))
    }
}

impl Store {
    /// The child lists of every stored job reachable from `names` through child links (those
    /// jobs included, when they exist): what an API job's links are checked against
    /// (`crate::config::api_link_problems`). One recursive query, ending on cycles.
    pub async fn child_links(
        &self,
        names: &[String],
    ) -> anyhow::Result<HashMap<String, ChildJobs>> {
        let rows = sqlx::query(
            "WITH RECURSIVE reach (name) AS (
                 SELECT unnest($1::text[])
                 UNION
                 SELECT c.name FROM reach r
                   JOIN chime_jobs j ON j.name = r.name
                  CROSS JOIN LATERAL unnest(
                        chime_job_children(j.spec, 'succeeded')
                        || chime_job_children(j.spec, 'failed')) AS c(name)
             )
             SELECT j.name, j.spec->'on_success' AS on_success, j.spec->'on_failure' AS on_failure,
                    j.spec->'on_complete' AS on_complete
               FROM chime_jobs j WHERE j.name IN (SELECT name FROM reach)",
        )
        .bind(names)
        .fetch_all(&self.pool)
        .await
        .context("reading the child links of stored jobs")?;
        let list = |r: &sqlx::postgres::PgRow, column: &str| -> Vec<String> {
            r.get::<Option<serde_json::Value>, _>(column)
                .and_then(|value| serde_json::from_value(value).ok())
                .unwrap_or_default()
        };
        Ok(rows
            .iter()
            .map(|r| {
                let children = ChildJobs {
                    on_success: list(r, "on_success"),
                    on_failure: list(r, "on_failure"),
                    on_complete: list(r, "on_complete"),
                };
                (r.get("name"), children)
            })
            .collect())
    }

    /// The jobs whose child lists name one of `children` (other than itself), as (job, child)
    /// pairs by job, at most 100: what a delete or a reload's removal leaves dangling.
    pub async fn jobs_naming(&self, children: &[String]) -> anyhow::Result<Vec<(String, String)>> {
        if children.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_as(
            "SELECT DISTINCT j.name, c.name AS child
               FROM chime_jobs j
              CROSS JOIN LATERAL unnest(chime_job_children(j.spec, 'succeeded')
                                        || chime_job_children(j.spec, 'failed')) AS c(name)
              WHERE c.name = ANY ($1) AND c.name <> j.name
              ORDER BY j.name, child LIMIT 100",
        )
        .bind(children)
        .fetch_all(&self.pool)
        .await
        .context("finding the jobs that name these as child jobs")
    }
}
