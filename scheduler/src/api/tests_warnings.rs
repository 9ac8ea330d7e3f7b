//! Warnings in API answers: creating or triggering a job no online worker of its group has a
//! handler for says so, since its runs only wait for one for a while before they are parked.

use axum::http::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;

/// Registers worker `id` of `group` with handlers for `jobs`, its heartbeat `age_ms` old
/// (500 ms interval: offline after 1.5 s), stopped if `stopped`.
async fn worker(pool: &PgPool, id: &str, group: &str, jobs: &[&str], age_ms: i32, stopped: bool) {
    sqlx::query(
        "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, heartbeat_interval_ms,
                                    heartbeat_at, stopped_at)
         VALUES ($1, $2, 'h', 1, $3, 500, now() - $4 * interval '1 millisecond',
                 CASE WHEN $5 THEN now() END)",
    )
    .bind(id)
    .bind(group)
    .bind(jobs)
    .bind(age_ms)
    .bind(stopped)
    .execute(pool)
    .await
    .expect("worker row");
}

#[sqlx::test(migrations = "../migrations")]
async fn creating_or_triggering_a_job_no_online_worker_handles_warns_until_one_does(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    let warned = json!([
        "no online worker of group `orders` has a handler for `invoice`; its runs wait for one \
         (the workers' unhandled_wait, 5 min by default), then are parked"
    ]);
    // Close, but none counts: another job's handler, another group, stopped, heartbeat stale.
    worker(&pool, "w-other-job", "orders", &["refund"], 0, false).await;
    worker(&pool, "w-other-group", "payments", &["invoice"], 0, false).await;
    worker(&pool, "w-stopped", "orders", &["invoice"], 0, true).await;
    worker(&pool, "w-stale", "orders", &["invoice"], 2_000, false).await;

    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "invoice", "group": "orders"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["name"], "invoice", "the job itself, as before: {body}");
    assert_eq!(body["group"], "orders");
    assert_eq!(body["warnings"], warned);

    let trigger = || {
        app.call(
            Method::POST,
            "/api/jobs/invoice/trigger",
            Some(&admin),
            None,
        )
    };
    let (status, body) = trigger().await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(body["run_id"].as_i64().is_some(), "{body}");
    assert_eq!(body["warnings"], warned);

    // An online worker of the group with the handler: no warning.
    worker(&pool, "w-new", "orders", &["refund", "invoice"], 0, false).await;
    let (status, body) = trigger().await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["warnings"], json!([]));
    let (_, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "refund", "group": "orders"})),
        )
        .await;
    assert_eq!(body["warnings"], json!([]), "{body}");
    assert_eq!(
        app.count("SELECT count(*) FROM chime_runs WHERE job_name = 'invoice'")
            .await,
        2
    );
}
