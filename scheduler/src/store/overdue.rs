//! The SQL of the overdue-outbox duty ([`crate::overdue`]): first attempts persisted on time
//! whose trigger is still unpublished, and skipping them under the leader's fence. Part of
//! [`crate::store`].

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::{Fence, Store};

/// A scheduled run still in the outbox, never published, with its job's definition.
#[derive(Debug, Clone)]
pub struct Overdue {
    /// Run id.
    pub id: i64,
    /// Job name.
    pub job: String,
    /// The fire's instant.
    pub scheduled_at: DateTime<Utc>,
    /// The job's definition as stored (`chime_jobs.spec`).
    pub spec: serde_json::Value,
}

impl Store {
    /// Scheduled first attempts still `pending` more than `older_than` after their instant,
    /// oldest first, at most `limit`. Manual and replayed runs and retries are not included, nor
    /// runs a `queue` job holds back on purpose.
    pub async fn overdue_runs(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> anyhow::Result<Vec<Overdue>> {
        let rows = sqlx::query(
            "SELECT r.id, r.job_name, r.scheduled_at, j.spec
             FROM chime_runs r JOIN chime_jobs j ON j.name = r.job_name
             WHERE r.state = 'pending' AND r.attempt = 0 AND r.trigger <> 'manual'
               AND r.replayed_at IS NULL
               AND coalesce(j.spec->>'concurrency', 'allow') <> 'queue'
               AND r.scheduled_at < now() - make_interval(secs => $1)
             ORDER BY r.scheduled_at, r.id
             LIMIT $2",
        )
        .bind(older_than.as_secs_f64())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .context("reading overdue runs in the outbox")?;
        Ok(rows
            .into_iter()
            .map(|r| Overdue {
                id: r.get("id"),
                job: r.get("job_name"),
                scheduled_at: r.get("scheduled_at"),
                spec: r.get("spec"),
            })
            .collect())
    }

    /// Records overdue runs `skipped` with their reasons, under the leader's fence; a run
    /// published (or claimed) meanwhile keeps its state. Returns the runs skipped, or `None`
    /// if the fence no longer holds.
    pub async fn skip_overdue(
        &self,
        fence: &Fence,
        skips: &[(i64, String)],
    ) -> anyhow::Result<Option<Vec<i64>>> {
        let ids: Vec<i64> = skips.iter().map(|(id, _)| *id).collect();
        let reasons: Vec<&str> = skips.iter().map(|(_, r)| r.as_str()).collect();
        let row = sqlx::query(
            "WITH lease AS (
                 SELECT term FROM chime_leader
                 WHERE name = 'default' AND holder = $1 AND term = $2 AND expires_at > now()
                 FOR SHARE
             ), s AS (
                 SELECT * FROM unnest($3::bigint[], $4::text[]) AS s(id, reason)
             ), upd AS (
                 UPDATE chime_runs r SET state = 'skipped', reason = s.reason
                 FROM lease, s
                 WHERE r.id = s.id AND r.state = 'pending' AND r.attempt = 0
                 RETURNING r.id
             )
             SELECT (SELECT count(*) FROM lease) AS leased,
                    coalesce((SELECT array_agg(id) FROM upd), '{}') AS skipped",
        )
        .bind(&fence.holder)
        .bind(fence.term)
        .bind(&ids)
        .bind(&reasons)
        .fetch_one(&self.pool)
        .await
        .context("skipping overdue runs")?;
        if row.get::<i64, _>("leased") != 1 {
            return Ok(None);
        }
        Ok(Some(row.get("skipped")))
    }
}
