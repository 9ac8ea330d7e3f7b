//! Child jobs through the router against a real database: an API job names existing jobs and
//! closes no cycle (the problem names the field, the value and the fix), a job another names
//! cannot be deleted, and a run's detail lists the child runs its end made.

use axum::http::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;

#[sqlx::test(migrations = "../migrations")]
async fn api_jobs_link_to_existing_jobs_without_cycles(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    let create = |body: serde_json::Value| {
        let (app, admin) = (&app, &admin);
        async move {
            app.call(Method::POST, "/api/jobs", Some(admin), Some(body))
                .await
        }
    };
    let (status, body) = create(json!({"name": "a", "group": "g", "on_success": ["b"]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let problem = &body["error"]["problems"][0];
    assert_eq!(
        (problem["field"].as_str(), problem["value"].as_str()),
        (Some("on_success"), Some("\"b\""))
    );
    assert!(
        problem["message"]
            .as_str()
            .is_some_and(|m| m.contains("create the child job first")),
        "{body}"
    );
    let (status, body) = create(json!({"name": "b", "group": "g"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = create(json!({"name": "a", "group": "g", "on_success": ["b"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["spec"]["on_success"], json!(["b"]), "{body}");

    // b → a would close a → b → a.
    let (status, body) = app
        .call(
            Method::PATCH,
            "/api/jobs/b",
            Some(&admin),
            Some(json!({"on_failure": ["a"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let problem = &body["error"]["problems"][0];
    assert_eq!(problem["field"], "on_failure", "{body}");
    assert!(
        problem["message"]
            .as_str()
            .is_some_and(|m| m.contains("child jobs form a cycle: b → a → b")),
        "{body}"
    );

    // b is a's child: deleting it would leave a's list dangling.
    let (status, body) = app
        .call(Method::DELETE, "/api/jobs/b", Some(&admin), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("child job of a"), "{body}");
    let (status, _) = app
        .call(
            Method::PATCH,
            "/api/jobs/a",
            Some(&admin),
            Some(json!({"on_success": null})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app
        .call(Method::DELETE, "/api/jobs/b", Some(&admin), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_runs_detail_lists_its_child_runs(pool: PgPool) {
    let app = app(pool.clone()).await;
    let viewer = app.token(Role::Viewer).await;
    let upstream: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
         VALUES ('a', 'g', now(), 'manual', 'succeeded') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .expect("upstream");
    let child: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                 upstream_run_id)
         VALUES ('b', 'g', now(), 'child', 'pending', $1) RETURNING id",
    )
    .bind(upstream)
    .fetch_one(&pool)
    .await
    .expect("child");
    let (status, body) = app
        .call(
            Method::GET,
            &format!("/api/runs/{upstream}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["children"],
        json!([{"id": child, "job": "b", "state": "pending"}])
    );
    let (_, body) = app
        .call(
            Method::GET,
            &format!("/api/runs/{child}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(body["upstream_run_id"], upstream);
    assert_eq!(body["trigger"], "child");
    assert_eq!(body["children"], json!([]));
}
