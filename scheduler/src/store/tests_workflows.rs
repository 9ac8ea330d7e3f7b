//! Workflow runs against a real database (`#[sqlx::test]`): a start makes the root nodes, each
//! node's end queues its workflow run, the fenced advance makes each node once whatever
//! repeats, edges and failure policies decide what runs, params are layered and rendered, and
//! cancel, timeout and rerun end or reopen the run as docs/workflows.md says.

use serde_json::{Value, json};
use sqlx::PgPool;

use super::{Fence, Rerun, Store, WorkflowStep, insert_test_job};

/// Stores the jobs `names` (group `g`, params naming the job) and workflow `wf` with `nodes`.
async fn setup(pool: &PgPool, names: &[&str], nodes: Value) {
    for name in names {
        insert_test_job(
            pool,
            name,
            json!({"name": name, "group": "g", "params": {"job": name, "shared": "job"}}),
        )
        .await;
    }
    insert_test_job(
        pool,
        "wf",
        json!({"name": "wf", "kind": "workflow", "nodes": nodes, "timeout": "1h"}),
    )
    .await;
}

/// A pending manual run of workflow `wf` with `params`.
async fn workflow_run(pool: &PgPool, params: Value) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, params)
         VALUES ('wf', '', now(), 'manual', 'pending', $1) RETURNING id",
    )
    .bind(params)
    .fetch_one(pool)
    .await
    .expect("the workflow run is stored")
}

async fn start(store: &Store, fence: &Fence, id: i64) -> Vec<WorkflowStep> {
    store
        .advance_workflows(fence, &[id], 0)
        .await
        .expect("the start runs")
        .expect("the fence holds")
}

async fn advance(store: &Store, fence: &Fence) -> Vec<WorkflowStep> {
    store
        .advance_workflows(fence, &[], 100)
        .await
        .expect("the advance runs")
        .expect("the fence holds")
}

/// Each node's current runs: (node, round, state), by node then round.
async fn nodes(pool: &PgPool, wf: i64) -> Vec<(String, i32, String)> {
    sqlx::query_as(
        "SELECT node, node_round, state FROM chime_runs WHERE workflow_run_id = $1
          ORDER BY node, node_round",
    )
    .bind(wf)
    .fetch_all(pool)
    .await
    .expect("the node runs read")
}

async fn node_run(pool: &PgPool, wf: i64, node: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT id FROM chime_runs WHERE workflow_run_id = $1 AND node = $2
          ORDER BY node_round DESC LIMIT 1",
    )
    .bind(wf)
    .bind(node)
    .fetch_one(pool)
    .await
    .expect("the node has a run")
}

/// Ends node `node`'s latest run in `state` (running first, as a worker would), with `output`.
async fn end(pool: &PgPool, wf: i64, node: &str, state: &str, output: Value) {
    let id = node_run(pool, wf, node).await;
    sqlx::query("UPDATE chime_runs SET state = 'running', attempt = 1 WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .expect("the node runs");
    sqlx::query("UPDATE chime_runs SET state = $2, output = $3, finished_at = now() WHERE id = $1")
        .bind(id)
        .bind(state)
        .bind(output)
        .execute(pool)
        .await
        .expect("the node ends");
}

async fn state(pool: &PgPool, id: i64) -> (String, Option<String>) {
    sqlx::query_as("SELECT state, reason FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("the run reads")
}

/// A failed run of a two-node workflow `audit-wf` (jobs `audit-wf-a` and `audit-wf-b`) whose
/// first node failed: what a rerun acts on.
pub(crate) async fn ended_workflow_run(pool: &PgPool) -> i64 {
    for name in ["audit-wf-a", "audit-wf-b"] {
        insert_test_job(pool, name, json!({"name": name, "group": "g"})).await;
    }
    let nodes = json!([
        {"name": "extract", "job": "audit-wf-a"},
        {"name": "load", "job": "audit-wf-b", "after": ["extract"]},
    ]);
    insert_test_job(
        pool,
        "audit-wf",
        json!({"name": "audit-wf", "kind": "workflow", "nodes": nodes}),
    )
    .await;
    let wf: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, finished_at)
         VALUES ('audit-wf', '', now(), 'manual', 'failed', now()) RETURNING id",
    )
    .fetch_one(pool)
    .await
    .expect("the workflow run is stored");
    sqlx::query(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                 workflow_run_id, node, node_round, finished_at)
         VALUES ('audit-wf-a', 'g', now(), 'workflow', 'failed', $1, 'extract', 0, now())",
    )
    .bind(wf)
    .execute(pool)
    .await
    .expect("the node run is stored");
    wf
}

fn diamond() -> Value {
    json!([
        {"name": "extract", "job": "a"},
        {"name": "left", "job": "b", "after": ["extract"]},
        {"name": "right", "job": "c", "after": ["extract"]},
        {"name": "load", "job": "d", "after": ["left", "right"]},
    ])
}

fn row(node: &str, round: i32, state: &str) -> (String, i32, String) {
    (node.to_owned(), round, state.to_owned())
}

#[sqlx::test(migrations = "../migrations")]
async fn a_diamond_runs_each_node_once_after_its_upstream_nodes(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, json!({"day": "mon"})).await;
    let steps = start(&store, &fence, wf).await;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].started.len(), 1);
    assert_eq!(state(&pool, wf).await.0, "running");
    assert_eq!(nodes(&pool, wf).await, [row("extract", 0, "pending")]);
    // A repeated start, and an advance with nothing queued, make nothing.
    start(&store, &fence, wf).await;
    assert!(advance(&store, &fence).await.is_empty());
    assert_eq!(nodes(&pool, wf).await.len(), 1);

    end(&pool, wf, "extract", "succeeded", json!({"rows": 3})).await;
    let steps = advance(&store, &fence).await;
    assert_eq!(steps[0].started.len(), 2);
    assert_eq!(
        steps[0].waits.len(),
        2,
        "both started nodes had an upstream end"
    );
    end(&pool, wf, "left", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    assert!(
        !nodes(&pool, wf).await.iter().any(|n| n.0 == "load"),
        "load waits for right"
    );
    end(&pool, wf, "right", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    end(&pool, wf, "load", "succeeded", Value::Null).await;
    let steps = advance(&store, &fence).await;
    assert_eq!(steps[0].ended.as_deref(), Some("succeeded"));
    assert_eq!(state(&pool, wf).await, ("succeeded".to_owned(), None));
    assert_eq!(
        nodes(&pool, wf).await,
        [
            row("extract", 0, "succeeded"),
            row("left", 0, "succeeded"),
            row("load", 0, "succeeded"),
            row("right", 0, "succeeded"),
        ]
    );
    // Re-queueing the ended run changes nothing.
    sqlx::query("INSERT INTO chime_workflow_advances (run_id) VALUES ($1)")
        .bind(wf)
        .execute(&pool)
        .await
        .unwrap();
    advance(&store, &fence).await;
    assert_eq!(nodes(&pool, wf).await.len(), 4);
}

#[sqlx::test(migrations = "../migrations")]
async fn node_params_layer_the_job_the_workflow_run_and_rendered_templates(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    let dag = json!([
        {"name": "extract", "job": "a"},
        {"name": "clean", "job": "b", "after": ["extract"],
         "params": {"rows": "{{ nodes.extract.output.rows }}", "shared": "node",
                    "label": "{{ workflow.name }} #{{ workflow.run_id }} {{ params.day }}"}},
    ]);
    setup(&pool, &["a", "b"], dag).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, json!({"day": "mon", "shared": "workflow"})).await;
    start(&store, &fence, wf).await;
    let params: Value = sqlx::query_scalar("SELECT params FROM chime_runs WHERE id = $1")
        .bind(node_run(&pool, wf, "extract").await)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        params,
        json!({"job": "a", "shared": "workflow", "day": "mon"})
    );
    end(&pool, wf, "extract", "succeeded", json!({"rows": 42})).await;
    advance(&store, &fence).await;
    let params: Value = sqlx::query_scalar("SELECT params FROM chime_runs WHERE id = $1")
        .bind(node_run(&pool, wf, "clean").await)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        params,
        json!({"job": "b", "shared": "node", "day": "mon", "rows": 42,
               "label": format!("wf #{wf} mon")})
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failure_fails_the_run_and_starts_only_failure_handlers(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    let dag = json!([
        {"name": "work", "job": "a"},
        {"name": "other", "job": "b"},
        {"name": "after-other", "job": "b", "after": ["other"]},
        {"name": "next", "job": "c", "after": ["work"]},
        {"name": "alert", "job": "d", "after": [{"node": "work", "when": "failure"}]},
    ]);
    setup(&pool, &["a", "b", "c", "d"], dag).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    end(&pool, wf, "work", "dead", Value::Null).await;
    advance(&store, &fence).await;
    // alert starts, next is skipped; other (running) finishes, after-other is then skipped.
    end(&pool, wf, "other", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    end(&pool, wf, "alert", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    assert_eq!(
        nodes(&pool, wf).await,
        [
            row("after-other", 0, "skipped"),
            row("alert", 0, "succeeded"),
            row("next", 0, "skipped"),
            row("other", 0, "succeeded"),
            row("work", 0, "dead"),
        ]
    );
    assert_eq!(
        state(&pool, wf).await,
        ("failed".to_owned(), Some("node work failed".to_owned()))
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn an_advance_without_the_fence_makes_nothing_and_keeps_the_queue(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    end(&pool, wf, "extract", "succeeded", Value::Null).await;
    let stale = Fence {
        holder: "t".into(),
        term: fence.term + 1,
    };
    assert!(
        store
            .advance_workflows(&stale, &[], 100)
            .await
            .unwrap()
            .is_none()
    );
    let queued: Vec<i64> = sqlx::query_scalar("SELECT run_id FROM chime_workflow_advances")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(queued, [wf]);
    assert_eq!(nodes(&pool, wf).await.len(), 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_cancel_stops_waiting_nodes_and_ends_the_run_when_running_ones_end(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    end(&pool, wf, "extract", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    // left runs, right is still pending.
    sqlx::query("UPDATE chime_runs SET state = 'running', attempt = 1 WHERE id = $1")
        .bind(node_run(&pool, wf, "left").await)
        .execute(&pool)
        .await
        .unwrap();
    store.cancel_run(wf, "test").await.unwrap();
    assert_eq!(store.running_nodes(wf).await.unwrap().len(), 1);
    advance(&store, &fence).await;
    assert_eq!(state(&pool, wf).await.0, "running", "left still runs");
    end(&pool, wf, "left", "cancelled", Value::Null).await;
    advance(&store, &fence).await;
    assert_eq!(state(&pool, wf).await.0, "cancelled");
    assert_eq!(
        nodes(&pool, wf).await,
        [
            row("extract", 0, "succeeded"),
            row("left", 0, "cancelled"),
            row("load", 0, "skipped"),
            row("right", 0, "cancelled"),
        ]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_run_past_its_deadline_fails_with_the_timeout(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    sqlx::query("UPDATE chime_runs SET deadline_at = now() - interval '1s' WHERE id = $1")
        .bind(wf)
        .execute(&pool)
        .await
        .unwrap();
    advance(&store, &fence).await;
    // The pending root was cancelled by the stop; the next advance ends the run.
    advance(&store, &fence).await;
    assert_eq!(
        state(&pool, wf).await,
        (
            "failed".to_owned(),
            Some("exceeded its timeout of 1h".to_owned())
        )
    );
    assert_eq!(nodes(&pool, wf).await[0], row("extract", 0, "cancelled"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_timeout_stops_running_nodes_and_names_them_for_their_workers(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    let extract = node_run(&pool, wf, "extract").await;
    sqlx::query("UPDATE chime_runs SET state = 'running', attempt = 1 WHERE id = $1;")
        .bind(extract)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE chime_runs SET deadline_at = now() - interval '1s' WHERE id = $1")
        .bind(wf)
        .execute(&pool)
        .await
        .unwrap();
    let steps = advance(&store, &fence).await;
    assert_eq!(steps[0].stopped, [extract], "its worker is to be told");
    let asked: Option<String> =
        sqlx::query_scalar("SELECT cancel_requested_by FROM chime_runs WHERE id = $1")
            .bind(extract)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(asked.as_deref(), Some("timeout"));
    assert_eq!(
        state(&pool, wf).await.0,
        "running",
        "until its running node ends"
    );
    // A later advance does not stop it again.
    sqlx::query("INSERT INTO chime_workflow_advances (run_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(wf)
        .execute(&pool)
        .await
        .unwrap();
    let steps = advance(&store, &fence).await;
    assert!(steps.iter().all(|s| s.stopped.is_empty()), "{steps:?}");
    end(&pool, wf, "extract", "cancelled", Value::Null).await;
    advance(&store, &fence).await;
    assert_eq!(
        state(&pool, wf).await,
        (
            "failed".to_owned(),
            Some("exceeded its timeout of 1h".to_owned())
        )
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_rerun_from_a_failed_node_runs_it_and_what_follows_in_a_new_round(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    end(&pool, wf, "extract", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    assert_eq!(
        store.rerun_workflow(wf, "left", "x").await.unwrap(),
        Rerun::Running
    );
    end(&pool, wf, "left", "failed", Value::Null).await;
    end(&pool, wf, "right", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    assert_eq!(state(&pool, wf).await.0, "failed");
    assert!(matches!(
        store.rerun_workflow(wf, "nope", "x").await.unwrap(),
        Rerun::NoSuchNode(names) if names.len() == 4
    ));
    let rerun = store.rerun_workflow(wf, "left", "cli:alice").await.unwrap();
    assert_eq!(
        rerun,
        Rerun::Done {
            round: 1,
            nodes: vec!["left".into(), "load".into()]
        }
    );
    assert_eq!(state(&pool, wf).await.0, "running");
    advance(&store, &fence).await;
    end(&pool, wf, "left", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    end(&pool, wf, "load", "succeeded", Value::Null).await;
    advance(&store, &fence).await;
    assert_eq!(state(&pool, wf).await.0, "succeeded");
    assert_eq!(
        nodes(&pool, wf).await,
        [
            row("extract", 0, "succeeded"),
            row("left", 0, "failed"),
            row("left", 1, "succeeded"),
            row("load", 0, "skipped"),
            row("load", 1, "succeeded"),
            row("right", 0, "succeeded"),
        ]
    );
    let view = store
        .workflow_run(wf)
        .await
        .unwrap()
        .expect("a workflow run");
    assert_eq!(view.round, 1);
    let left = view.nodes.iter().find(|n| n.shape.name == "left").unwrap();
    assert_eq!(left.earlier_runs, 1);
    assert_eq!(left.run.as_ref().map(|r| r.round), Some(1));
    assert_eq!(
        view.nodes.iter().map(|n| n.shape.layer).collect::<Vec<_>>(),
        [0, 1, 1, 2]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_node_reads_the_ended_nodes_of_its_workflow_run(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let wf = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, wf).await;
    end(&pool, wf, "extract", "succeeded", json!({"rows": 7})).await;
    advance(&store, &fence).await;
    let left = node_run(&pool, wf, "left").await;
    let rows: Vec<(Option<String>, String, Option<Value>)> =
        sqlx::query_as("SELECT node, state, output FROM chime_upstream_runs($1)")
            .bind(left)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [(
            Some("extract".to_owned()),
            "succeeded".to_owned(),
            Some(json!({"rows": 7}))
        )]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn failed_and_timed_out_workflow_runs_are_alert_events_once_per_round(pool: PgPool) {
    use super::{AlertKind, AlertRecord};
    let store = Store::from_pool(pool.clone());
    setup(&pool, &["a", "b", "c", "d"], diamond()).await;
    let fence = store.lead_for_test("t").await;
    let failed = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, failed).await;
    end(&pool, failed, "extract", "failed", Value::Null).await;
    advance(&store, &fence).await;
    let timed_out = workflow_run(&pool, Value::Null).await;
    start(&store, &fence, timed_out).await;
    sqlx::query("UPDATE chime_runs SET deadline_at = now() - interval '1s' WHERE id = $1")
        .bind(timed_out)
        .execute(&pool)
        .await
        .unwrap();
    advance(&store, &fence).await;
    advance(&store, &fence).await;
    let since = (chrono::Utc::now() - chrono::Duration::minutes(1), 0, "");
    let events = store.alert_events(since, 10).await.unwrap();
    let kinds: Vec<(i64, Option<AlertKind>, Option<&str>, i32)> = events
        .iter()
        .filter(|e| e.job == "wf")
        .map(|e| (e.run_id, e.kind, e.error.as_deref(), e.attempt))
        .collect();
    assert_eq!(
        kinds,
        [
            (
                failed,
                Some(AlertKind::WorkflowFailed),
                Some("node extract failed"),
                0
            ),
            (
                timed_out,
                Some(AlertKind::WorkflowTimeout),
                Some("exceeded its timeout of 1h"),
                0
            ),
        ]
    );
    let record = AlertRecord {
        kind: AlertKind::WorkflowFailed,
        job: "wf".into(),
        group: String::new(),
        run_id: failed,
        attempt: 0,
        target: "http://h".into(),
        payload: json!({}),
        min_interval: std::time::Duration::from_secs(60),
    };
    let claimed = store.record_alert(&fence, &record).await.unwrap();
    assert!(
        matches!(claimed, Some(Some(_))),
        "the schema takes the new kind"
    );
    // Sent once: the rerun's round is a new event when it fails again.
    store.rerun_workflow(failed, "extract", "x").await.unwrap();
    advance(&store, &fence).await;
    end(&pool, failed, "extract", "failed", Value::Null).await;
    advance(&store, &fence).await;
    let again = store.alert_events(since, 10).await.unwrap();
    assert!(
        again.iter().any(|e| e.run_id == failed
            && e.attempt == 1
            && e.kind == Some(AlertKind::WorkflowFailed)),
        "{again:?}"
    );
}
