//! Workflows through the router against a real database: an API workflow names existing jobs
//! that are not workflows, a workflow is listed and shown with its layers, a workflow run is
//! shown node by node, a viewer may read but not rerun, and a rerun and a cancel answer with
//! what they did or why not (409 while running, 404 naming the nodes).

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;

#[sqlx::test(migrations = "../migrations")]
async fn workflows_are_created_listed_shown_and_rerun(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    let viewer = app.token(Role::Viewer).await;
    let workflow = json!({
        "name": "etl", "kind": "workflow",
        "nodes": [
            {"name": "extract", "job": "extract-job"},
            {"name": "load", "job": "load-job", "after": ["extract"]},
        ],
    });
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(workflow.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let problems = body["error"]["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 2, "{body}");
    assert_eq!(problems[0]["field"], "nodes[0].job");
    assert!(
        problems[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("create the job first")),
        "{body}"
    );
    for name in ["extract-job", "load-job"] {
        let (status, body) = app
            .call(
                Method::POST,
                "/api/jobs",
                Some(&admin),
                Some(json!({"name": name, "group": "g"})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = app
        .call(Method::POST, "/api/jobs", Some(&admin), Some(workflow))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (status, body) = app
        .call(Method::GET, "/api/workflows", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["workflows"][0]["name"], "etl");
    assert_eq!(body["workflows"][0]["nodes"], 2);
    assert_eq!(body["workflows"][0]["layers"], 2);
    let (status, body) = app
        .call(Method::GET, "/api/workflows/etl", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["nodes"][1]["after"],
        json!([{"node": "extract", "when": "success"}])
    );
    assert_eq!(body["nodes"][1]["layer"], 1);
    let (status, body) = app
        .call(
            Method::GET,
            "/api/workflows/extract-job",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // A run of the workflow, ended failed with its first node failed.
    let wf: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, finished_at)
         VALUES ('etl', '', now(), 'manual', 'failed', now()) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                 workflow_run_id, node, node_round, finished_at)
         VALUES ('extract-job', 'g', now(), 'workflow', 'failed', $1, 'extract', 0, now()),
                ('load-job', 'g', now(), 'workflow', 'skipped', $1, 'load', 0, now())",
    )
    .bind(wf)
    .execute(&pool)
    .await
    .unwrap();
    let (status, body) = app
        .call(
            Method::GET,
            &format!("/api/workflows/runs/{wf}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "failed");
    assert_eq!(body["nodes"][0]["run"]["state"], "failed");
    assert_eq!(body["nodes"][1]["run"]["state"], "skipped");
    let (status, body) = app
        .call(Method::GET, "/api/workflows/etl/runs", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["runs"][0]["id"], wf, "{body}");

    let rerun = format!("/api/workflows/runs/{wf}/rerun");
    let (status, _) = app
        .call(
            Method::POST,
            &rerun,
            Some(&viewer),
            Some(json!({"node": "extract"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = app
        .call(
            Method::POST,
            &rerun,
            Some(&admin),
            Some(json!({"node": "nope"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("its nodes: extract, load")),
        "{body}"
    );
    let (status, body) = app
        .call(Method::POST, &rerun, Some(&admin), Some(json!({"node": 3})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = app
        .call(
            Method::POST,
            &rerun,
            Some(&admin),
            Some(json!({"node": "extract"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"run_id": wf, "round": 1, "nodes": ["extract", "load"]})
    );
    let (status, body) = app
        .call(
            Method::POST,
            &rerun,
            Some(&admin),
            Some(json!({"node": "extract"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = app
        .call(
            Method::GET,
            &format!("/api/workflows/runs/{wf}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["round"], 1);
    assert_eq!(
        body["nodes"][0]["run"],
        Value::Null,
        "the rerun node waits for its advance"
    );
    assert_eq!(body["nodes"][0]["earlier_runs"], 1);
    let audit: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chime_audit WHERE action = 'workflows.rerun' AND outcome = 'ok'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audit, 1);
    let (status, body) = app
        .call(
            Method::GET,
            &format!("/api/workflows/runs/{}", wf + 1),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a node run is no workflow run: {body}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_job_a_workflow_runs_cannot_be_deleted_and_a_workflow_trigger_warns_of_no_group(
    pool: PgPool,
) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    for body in [
        json!({"name": "node-job", "group": "g"}),
        json!({"name": "wf", "kind": "workflow", "nodes": [{"name": "n", "job": "node-job"}]}),
    ] {
        let (status, body) = app
            .call(Method::POST, "/api/jobs", Some(&admin), Some(body))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = app
        .call(Method::DELETE, "/api/jobs/node-job", Some(&admin), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("a node's job in workflow wf")),
        "{body}"
    );
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/wf/trigger",
            Some(&admin),
            Some(json!({})),
        )
        .await;
    assert!(status.is_success(), "{body}");
    assert!(
        !body.to_string().contains("no online worker"),
        "a workflow has no handler to miss: {body}"
    );
    let (status, body) = app
        .call(Method::DELETE, "/api/jobs/wf", Some(&admin), None)
        .await;
    assert!(status.is_success(), "the workflow itself goes: {body}");
    let (status, body) = app
        .call(Method::DELETE, "/api/jobs/node-job", Some(&admin), None)
        .await;
    assert!(status.is_success(), "then its node's job: {body}");
}
