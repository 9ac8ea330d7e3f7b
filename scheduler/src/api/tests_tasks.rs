//! Runs with tasks through the API (`#[sqlx::test]`): lists show fires with their progress, a
//! parent's tasks page by id with bounded pages, secrets stay hidden from viewers in tasks too,
//! the failed tasks of a finished run rerun (operators, audited, a 409 naming why when not
//! applicable), and a cancel of a parent reaches its tasks.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::tests::app;
use crate::auth::{Caller, Role};
use crate::ops::{Cancelled, OpsError};
use crate::store::tests_tasks::{set_task, sharded_run};

async fn state(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("state")
}

#[sqlx::test(migrations = "../migrations")]
async fn lists_show_fires_with_progress_and_tasks_page_by_id(pool: PgPool) {
    let app = app(pool.clone()).await;
    let viewer = app.token(Role::Viewer).await;
    let operator = app.token(Role::Operator).await;
    let secret = "s3cr3t-token-value";
    let params: Vec<Value> = (0..12)
        .map(|i| json!({"region": format!("r{i}"), "api_token": secret}))
        .collect();
    let (parent, tasks) = sharded_run(&pool, "shard", 12, Some(json!(params))).await;
    for (i, id) in tasks.iter().enumerate() {
        match i {
            0..9 => {
                set_task(&pool, *id, "running", Some("w1"), None).await;
                let output = json!({"rows": i, "echo": format!("token {secret}")});
                set_task(&pool, *id, "succeeded", None, Some(output)).await;
            }
            9 => set_task(&pool, *id, "failed", Some("w2"), None).await,
            _ => set_task(&pool, *id, "running", Some("w1"), None).await,
        }
    }

    let (status, body) = app
        .call(Method::GET, "/api/runs", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let runs = body["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "only the fire: {body}");
    assert_eq!(runs[0]["id"], parent);
    assert_eq!(runs[0]["progress"], "9/12 ok, 1 failed, 2 left");
    assert_eq!(
        (
            &runs[0]["tasks_total"],
            &runs[0]["tasks_ended"],
            &runs[0]["tasks_failed"]
        ),
        (&json!(12), &json!(10), &json!(1))
    );
    let (_, with_tasks) = app
        .call(Method::GET, "/api/runs?tasks=true", Some(&viewer), None)
        .await;
    assert_eq!(with_tasks["runs"].as_array().map(Vec::len), Some(13));
    let (status, bad) = app
        .call(Method::GET, "/api/runs?tasks=yes", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["problems"][0]["field"], "tasks");

    // Pages of 5 by id; the last page names no next one.
    let uri = |after: Option<i64>| {
        let after = after.map(|a| format!("&after={a}")).unwrap_or_default();
        format!("/api/runs/{parent}/tasks?limit=5{after}")
    };
    let (status, first) = app.call(Method::GET, &uri(None), Some(&viewer), None).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["progress"], "9/12 ok, 1 failed, 2 left");
    assert_eq!(first["tasks"].as_array().map(Vec::len), Some(5));
    assert_eq!(first["next_after"], tasks[4]);
    assert_eq!(first["tasks"][0]["task_key"], "shard/0");
    assert_eq!(first["tasks"][0]["parent_id"], parent);
    assert_eq!(first["tasks"][0]["shard_index"], 0);
    // A viewer sees neither the shard's secret param nor the output repeating it.
    assert_eq!(first["tasks"][0]["shard_param"]["api_token"], "[redacted]");
    assert_eq!(first["tasks"][0]["shard_param"]["region"], "r0");
    assert_eq!(first["tasks"][0]["output"]["echo"], "token [redacted]");
    let (_, second) = app
        .call(Method::GET, &uri(Some(tasks[4])), Some(&viewer), None)
        .await;
    assert_eq!(second["tasks"][0]["id"], tasks[5]);
    let (_, last) = app
        .call(Method::GET, &uri(Some(tasks[9])), Some(&viewer), None)
        .await;
    assert_eq!(last["tasks"].as_array().map(Vec::len), Some(2));
    assert_eq!(last["next_after"], Value::Null);
    // Operators read them whole.
    let (_, full) = app
        .call(Method::GET, &uri(None), Some(&operator), None)
        .await;
    assert_eq!(full["tasks"][0]["shard_param"]["api_token"], secret);
    let (_, failed) = app
        .call(
            Method::GET,
            &format!("/api/runs/{parent}/tasks?state=failed"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(failed["tasks"][0]["id"], tasks[9]);
    assert_eq!(failed["tasks"][0]["worker_id"], "w2");

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("state=lostt", "state"),
        ("after=x", "after"),
        ("page=2", "page"),
    ] {
        let (status, body) = app
            .call(
                Method::GET,
                &format!("/api/runs/{parent}/tasks?{query}"),
                Some(&viewer),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["problems"][0]["field"], field, "{query}");
    }
    let (status, _) = app
        .call(Method::GET, "/api/runs/999999/tasks", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A task's view names its parent; the parent's counts its tasks by state.
    let (_, task) = app
        .call(
            Method::GET,
            &format!("/api/runs/{}", tasks[10]),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(task["parent"]["id"], parent);
    assert_eq!(task["parent"]["progress"], "9/12 ok, 1 failed, 2 left");
    assert_eq!(task["task_key"], "shard/10");
    let (_, shown) = app
        .call(
            Method::GET,
            &format!("/api/runs/{parent}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(
        shown["tasks_by_state"],
        json!({"failed": 1, "running": 2, "succeeded": 9})
    );
    assert_eq!(shown["parent"], Value::Null);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_failed_tasks_of_a_finished_run_rerun_for_operators_audited(pool: PgPool) {
    let app = app(pool.clone()).await;
    let viewer = app.token(Role::Viewer).await;
    let operator = app.token(Role::Operator).await;
    let (parent, tasks) = sharded_run(&pool, "shard", 4, None).await;
    let retry = format!("/api/runs/{parent}/retry-failed");
    set_task(&pool, tasks[0], "running", Some("w1"), None).await;

    // Still running: refused with the database's reason.
    let (status, body) = app.call(Method::POST, &retry, Some(&operator), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("only a finished run"), "{message}");

    for (i, id) in tasks.iter().enumerate() {
        let end = if i < 2 { "succeeded" } else { "failed" };
        set_task(&pool, *id, end, Some("w1"), None).await;
    }
    assert_eq!(state(&pool, parent).await, "failed");

    let (status, _) = app.call(Method::POST, &retry, Some(&viewer), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = app.call(Method::POST, &retry, Some(&operator), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"run_id": parent, "job": "shard", "rerun": 2}));
    assert_eq!(state(&pool, parent).await, "queued", "running again");
    assert_eq!(
        state(&pool, tasks[2]).await,
        "pending",
        "back in the outbox"
    );
    assert_eq!(state(&pool, tasks[0]).await, "succeeded", "kept");
    let (_, shown) = app
        .call(
            Method::GET,
            &format!("/api/runs/{parent}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(shown["progress"], "2/4 ok, 2 left");

    let audited: Vec<(String, String, Option<String>, Option<i64>)> = sqlx::query_as(
        "SELECT actor, outcome, job_name, run_id FROM chime_audit
          WHERE action = 'runs.retry_failed' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("audit");
    let outcomes: Vec<&str> = audited.iter().map(|a| a.1.as_str()).collect();
    assert_eq!(outcomes, ["failed", "denied", "ok"]);
    assert_eq!(audited[2].2.as_deref(), Some("shard"));
    assert_eq!(audited[2].3, Some(parent));

    // A run without tasks, an unknown run, a finished run with nothing failed.
    sqlx::query(
        "INSERT INTO chime_runs (id, job_name, group_name, scheduled_at, trigger, state)
         OVERRIDING SYSTEM VALUE VALUES (900001, 'single', 'g1', now(), 'manual', 'failed')",
    )
    .execute(&pool)
    .await
    .expect("run");
    let (status, body) = app
        .call(
            Method::POST,
            "/api/runs/900001/retry-failed",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not a run with tasks")),
        "{body}"
    );
    let (status, _) = app
        .call(
            Method::POST,
            "/api/runs/900002/retry-failed",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (clean, clean_tasks) = sharded_run(&pool, "clean", 2, None).await;
    for id in &clean_tasks {
        set_task(&pool, *id, "succeeded", Some("w1"), None).await;
    }
    assert_eq!(state(&pool, clean).await, "succeeded");
    let (status, body) = app
        .call(
            Method::POST,
            &format!("/api/runs/{clean}/retry-failed"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(state(&pool, clean).await, "succeeded", "left as it was");
}

/// A cancel of a parent reaches its tasks: a queued parent's end at once; a running parent's
/// waiting tasks end, its running ones are asked to stop, and the control message names the
/// parent (workers cancel their tasks of that run).
#[sqlx::test(migrations = "../migrations")]
async fn a_cancel_of_a_parent_reaches_its_tasks(pool: PgPool) {
    let app = app(pool.clone()).await;
    let operator = Caller::token("ops", Role::Operator);

    let (queued, queued_tasks) = sharded_run(&pool, "quiet", 3, None).await;
    sqlx::query("UPDATE chime_runs SET state = 'queued' WHERE id = $1")
        .bind(queued)
        .execute(&pool)
        .await
        .expect("published");
    let done = app.ops.cancel_run(&operator, queued).await.expect("cancel");
    assert!(
        matches!(&done, Cancelled::Cancelled { run_id, previous_state, .. }
            if *run_id == queued && previous_state == "queued"),
        "{done:?}"
    );
    for id in &queued_tasks {
        assert_eq!(state(&pool, *id).await, "cancelled");
    }
    assert_eq!(state(&pool, queued).await, "cancelled");

    let (running, running_tasks) = sharded_run(&pool, "busy", 3, None).await;
    set_task(&pool, running_tasks[0], "running", Some("w1"), None).await;
    assert_eq!(state(&pool, running).await, "running");
    // Recorded; telling the workers (ControlMessage::CancelRun naming the parent) needs the
    // broker, which this test has not.
    let error = app
        .ops
        .cancel_run(&operator, running)
        .await
        .expect_err("no broker to tell the workers");
    assert!(matches!(&error, OpsError::Unavailable(_)), "{error:?}");
    assert_eq!(state(&pool, running_tasks[1]).await, "cancelled");
    assert_eq!(state(&pool, running_tasks[2]).await, "cancelled");
    let asked: bool = sqlx::query_scalar(
        "SELECT state = 'running' AND cancel_requested_at IS NOT NULL FROM chime_runs WHERE id = $1",
    )
    .bind(running_tasks[0])
    .fetch_one(&pool)
    .await
    .expect("task");
    assert!(asked, "the running task is asked to stop");
    // Its worker records the attempt cancelled: the parent ends cancelled.
    set_task(&pool, running_tasks[0], "cancelled", None, None).await;
    assert_eq!(state(&pool, running).await, "cancelled");
}
