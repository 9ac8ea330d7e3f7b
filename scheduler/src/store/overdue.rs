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
    /// oldest first, at most `limit`. Manual, backfilled and replayed runs and retries are not
    /// included (a backfill's fires are past on purpose), nor
    /// runs a `queue` job holds back on purpose, nor tasks (a reduce task waits on purpose; a
    /// mapped one is made when its caller runs).
    pub async fn overdue_runs(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> anyhow::Result<Vec<Overdue>> {
        let rows = sqlx::query(
            "SELECT r.id, r.job_name, r.scheduled_at, j.spec
             FROM chime_runs r JOIN chime_jobs j ON j.name = r.job_name
             WHERE r.state = 'pending' AND r.attempt = 0 AND r.trigger IN ('schedule', 'catchup')
               AND r.replayed_at IS NULL AND r.parent_id IS NULL
               AND chime_job_concurrency(j.spec) <> 'queue'
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
            "WITH lease AS (SELECT term FROM chime_fence($1, $2)), s AS (
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

#[cfg(test)]
mod tests {
    //! The overdue-outbox SQL against a real database (`#[sqlx::test]`: one per test).

    use super::*;
    use sqlx::PgPool;

    async fn leader(store: &Store, me: &str) -> Fence {
        store.lead_for_test(me).await
    }

    async fn job(pool: &PgPool, name: &str, concurrency: &str) {
        let spec = serde_json::json!({"name": name, "group": "g", "every": "1s",
                                      "concurrency": concurrency});
        crate::store::insert_test_job(pool, name, spec).await;
    }

    /// A run of `job` due `ago_ms` ago.
    async fn run(pool: &PgPool, job: &str, ago_ms: i64, trigger: &str, attempt: i32) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt)
             VALUES ($1, 'g', now() - make_interval(secs => $2::float8 / 1000), $3, 'pending', $4)
             RETURNING id",
        )
        .bind(job)
        .bind(ago_ms as f64)
        .bind(trigger)
        .bind(attempt)
        .fetch_one(pool)
        .await
        .unwrap()
    }

    async fn state(pool: &PgPool, id: i64) -> String {
        sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn only_overdue_first_attempts_of_scheduled_runs_are_candidates(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        job(&pool, "a", "allow").await;
        job(&pool, "q", "queue").await;
        let overdue = run(&pool, "a", 5_000, "schedule", 0).await;
        let catchup = run(&pool, "a", 4_000, "catchup", 0).await;
        run(&pool, "a", 100, "schedule", 0).await; // not overdue yet
        run(&pool, "a", 5_000, "manual", 0).await; // an operator's trigger
        run(&pool, "a", 5_000, "schedule", 1).await; // a rescued run's next attempt
        run(&pool, "q", 5_000, "schedule", 0).await; // held back by `queue` on purpose
        let found: Vec<i64> = store
            .overdue_runs(Duration::from_secs(1), 100)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.id)
            .collect();
        assert_eq!(found, [overdue, catchup]);
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn skips_are_fenced_and_leave_published_runs_alone(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        job(&pool, "a", "allow").await;
        let stale_fence = leader(&store, "old").await;
        store.resign(&stale_fence).await.unwrap();
        let fence = leader(&store, "new").await;
        let first = run(&pool, "a", 5_000, "schedule", 0).await;
        let published = run(&pool, "a", 4_000, "schedule", 0).await;
        sqlx::query("UPDATE chime_runs SET state = 'queued' WHERE id = $1")
            .bind(published)
            .execute(&pool)
            .await
            .unwrap();
        let skips = vec![
            (first, "missed by 5s; misfire policy skip".to_owned()),
            (published, "missed by 4s; misfire policy skip".to_owned()),
        ];

        assert_eq!(
            store.skip_overdue(&stale_fence, &skips).await.unwrap(),
            None
        );
        assert_eq!(
            state(&pool, first).await,
            "pending",
            "a stale term writes nothing"
        );

        let skipped = store.skip_overdue(&fence, &skips).await.unwrap();
        assert_eq!(skipped, Some(vec![first]));
        assert_eq!(state(&pool, first).await, "skipped");
        assert_eq!(state(&pool, published).await, "queued");
        let reason: Option<String> =
            sqlx::query_scalar("SELECT reason FROM chime_runs WHERE id = $1")
                .bind(first)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(reason.as_deref(), Some("missed by 5s; misfire policy skip"));
    }
}
