//! The fields SQL reads from a stored job definition (`chime_jobs.spec`, through the functions
//! of migration `job_fields`) agree with the `JobSpec`'s serde form and its defaults.

use sqlx::PgPool;

use crate::job::{ConcurrencyPolicy, JobSpec};

async fn concurrency(pool: &PgPool, spec: Option<serde_json::Value>) -> String {
    sqlx::query_scalar("SELECT chime_job_concurrency($1)")
        .bind(spec)
        .fetch_one(pool)
        .await
        .expect("chime_job_concurrency")
}

#[sqlx::test(migrations = "../migrations")]
async fn chime_job_concurrency_reads_the_policy_a_spec_stores(pool: PgPool) {
    let base: JobSpec =
        serde_json::from_value(serde_json::json!({"name": "a", "group": "g"})).expect("valid");
    for policy in [
        ConcurrencyPolicy::Allow,
        ConcurrencyPolicy::Forbid,
        ConcurrencyPolicy::Queue,
        ConcurrencyPolicy::Replace,
    ] {
        let spec = JobSpec {
            concurrency: policy,
            ..base.clone()
        };
        let stored = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(concurrency(&pool, Some(stored)).await, policy.as_str());
    }
    // A definition without the key reads as the JobSpec's default, and so does a run whose job
    // is gone (the outer join's NULL).
    let default = ConcurrencyPolicy::default().as_str();
    let without = serde_json::json!({"name": "a", "group": "g"});
    assert_eq!(concurrency(&pool, Some(without)).await, default);
    assert_eq!(concurrency(&pool, None).await, default);
}

/// The trigger of migration 4, reading the policy through `chime_job_concurrency` since
/// migration `job_fields`: a finished run of a `queue` job wakes the outbox sweep, a finished
/// run of another job does not.
#[sqlx::test(migrations = "../migrations")]
async fn only_a_finished_run_of_a_queue_job_wakes_the_outbox_sweep(pool: PgPool) {
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("listener");
    listener
        .listen(super::OUTBOX_CHANNEL)
        .await
        .expect("listen");
    let mut runs = Vec::new();
    for (name, policy) in [("forbidding", "forbid"), ("queueing", "queue")] {
        let spec: JobSpec = serde_json::from_value(
            serde_json::json!({"name": name, "group": "g", "concurrency": policy}),
        )
        .expect("valid");
        let spec = serde_json::to_value(&spec).expect("serialises");
        crate::store::insert_test_job(&pool, name, spec).await;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
             VALUES ($1, 'g', now(), 'manual', 'running') RETURNING id",
        )
        .bind(name)
        .fetch_one(&pool)
        .await
        .expect("run");
        runs.push(id);
    }
    for id in &runs {
        sqlx::query("UPDATE chime_runs SET state = 'succeeded' WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await
            .expect("finished");
    }
    sqlx::query("SELECT pg_notify($1, 'sentinel')")
        .bind(super::OUTBOX_CHANNEL)
        .execute(&pool)
        .await
        .expect("sentinel");
    let mut seen = Vec::new();
    loop {
        let notification =
            tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
                .await
                .expect("notifications arrive")
                .expect("notification");
        if notification.payload() == "sentinel" {
            break;
        }
        seen.push(notification.payload().to_owned());
    }
    assert_eq!(seen, [format!("finished {}", runs[1])]);
}
