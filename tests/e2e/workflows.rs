//! Workflows end to end, with a real scheduler, real workers, PostgreSQL and RabbitMQ
//! (docs/workflows.md): a three-node chain passes each node's output to the next through
//! `ctx.upstream` and params templates; a diamond whose one branch fails once and is retried
//! joins once both branches end; a failed node is rerun from the operations API and the nodes
//! after it run in the new round; and a 50-node DAG with a sharded and a map/reduce node runs
//! every node exactly once, after all the nodes it comes after, while its leader process is
//! SIGKILLed twice as it advances (reconciled from the database and the workers' own output).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chime_e2e::process::{Process, sibling_binary};
use chime_e2e::{AMQP_URL, Events, Scheduler, Setup, wait_for};
use chime_scheduler::auth::{Caller, Role};
use chime_scheduler::ops::Operations;
use chime_scheduler::store::Store;
use chime_worker::{JobContext, JobError};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};
use tokio::process::Command;

use crate::common::job;
use crate::failures::support::trigger;
use crate::kinds::KindWorker;

/// Longest a test waits for a workflow run to end.
const PATIENCE: Duration = Duration::from_secs(120);

/// One handler call: its run, node job, attempt, the params it got and the upstream nodes it
/// read (node → the upstream run's output).
#[derive(Debug, Clone)]
struct Call {
    run_id: i64,
    job: String,
    attempt: u32,
    params: Value,
    upstream: BTreeMap<String, Option<Value>>,
}

/// A worker with a handler for each of `jobs`: it reads `ctx.upstream` for each node named in
/// its params' `read` list, records the call, stores `{"job": JOB, "rows": N}` as its output
/// (N = its params' `rows`, plus one), and fails while `failing` says so for its job, or on its
/// first attempt when its params say `{"fail_once": true}`.
fn node_worker(
    t: &Setup,
    jobs: &[&str],
    calls: &Events<Call>,
    failing: &Arc<(String, AtomicBool)>,
) -> KindWorker {
    KindWorker::start(t, "wf-worker", |mut builder| {
        builder = builder.capacity(16);
        for &name in jobs {
            let (calls, failing) = (calls.clone(), failing.clone());
            builder = builder.handle(name, move |ctx: JobContext, params: Value| {
                let (calls, failing) = (calls.clone(), failing.clone());
                async move {
                    let mut upstream = BTreeMap::new();
                    for node in params["read"].as_array().into_iter().flatten() {
                        let node = node.as_str().unwrap_or_default();
                        let run = ctx.upstream(node).await.map_err(|e| e.into_job_error())?;
                        upstream.insert(node.to_owned(), run.and_then(|r| r.output));
                    }
                    calls.record(Call {
                        run_id: ctx.run_id(),
                        job: ctx.job().to_owned(),
                        attempt: ctx.attempt(),
                        params: params.clone(),
                        upstream,
                    });
                    let rows = params["rows"].as_i64().unwrap_or(0) + 1;
                    ctx.set_output(&json!({"job": ctx.job(), "rows": rows}))
                        .await
                        .map_err(|e| e.into_job_error())?;
                    if failing.0 == ctx.job() && failing.1.load(Ordering::SeqCst) {
                        return Err(JobError::fail("failing, as the test asks"));
                    }
                    if params["fail_once"] == json!(true) && ctx.attempt() == 1 {
                        return Err(JobError::retry("the first attempt fails"));
                    }
                    Ok::<(), JobError>(())
                }
            });
        }
        builder
    })
}

/// A workflow run's state and reason.
async fn workflow_state(pool: &PgPool, id: i64) -> (String, Option<String>) {
    sqlx::query_as("SELECT state, reason FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("read the workflow run")
}

/// Waits until workflow run `id` has ended; its state.
async fn ended(pool: &PgPool, id: i64) -> String {
    wait_for(PATIENCE, &format!("workflow run {id} to end"), || async {
        let (state, _) = workflow_state(pool, id).await;
        (!matches!(state.as_str(), "pending" | "running")).then_some(state)
    })
    .await
}

/// A node run as these tests reconcile it.
#[derive(Debug, Clone)]
struct NodeRun {
    id: i64,
    node: String,
    round: i32,
    state: String,
    attempt: i32,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

/// The node runs of workflow run `id`, by node then round.
async fn node_runs(pool: &PgPool, id: i64) -> Vec<NodeRun> {
    sqlx::query(
        "SELECT id, node, node_round, state, attempt, created_at, started_at, finished_at
           FROM chime_runs WHERE workflow_run_id = $1 ORDER BY node, node_round",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .expect("read node runs")
    .iter()
    .map(|r| NodeRun {
        id: r.get("id"),
        node: r.get("node"),
        round: r.get("node_round"),
        state: r.get("state"),
        attempt: r.get("attempt"),
        created_at: r.get("created_at"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
    })
    .collect()
}

/// Checks every edge of `nodes` (node → the nodes it comes after) against the runs: each node's
/// run was made, and its handler started, after every run it comes after had ended.
fn assert_edges(nodes: &[(String, Vec<String>)], runs: &[NodeRun]) {
    let by_node: HashMap<&str, &NodeRun> = runs.iter().map(|r| (r.node.as_str(), r)).collect();
    for (node, after) in nodes {
        let run = by_node[node.as_str()];
        for up in after {
            let up_run = by_node[up.as_str()];
            let up_end = up_run.finished_at.expect("an upstream node ended");
            assert!(
                run.created_at >= up_end,
                "node {node} (run {}) was made at {} before {up} ended at {up_end}",
                run.id,
                run.created_at
            );
            if let Some(started) = run.started_at {
                assert!(started >= up_end, "node {node} started before {up} ended");
            }
        }
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_chain_passes_outputs_through_upstream_and_templates(pool: PgPool) {
    let t = Setup::new(&pool);
    let jobs = ["wf-extract", "wf-transform", "wf-load"];
    let mut specs: Vec<_> = jobs
        .iter()
        .map(|name| job(json!({"name": name, "group": t.group, "params": {"own": name}})))
        .collect();
    specs.push(job(json!({
        "name": "etl", "kind": "workflow", "params": {"day": "2026-12-04"},
        "nodes": [
            {"name": "extract", "job": "wf-extract", "params": {"rows": 41}},
            {"name": "transform", "job": "wf-transform", "after": ["extract"],
             "params": {"rows": "{{ nodes.extract.output.rows }}", "read": ["extract"]}},
            {"name": "load", "job": "wf-load", "after": ["transform"],
             "params": {"label": "{{ workflow.name }} {{ params.day }}",
                        "read": ["extract", "transform"]}},
        ],
    })));
    let scheduler = Scheduler::on(&t, "s1", specs);
    let calls = Events::new();
    let failing = Arc::new((String::new(), AtomicBool::new(false)));
    let worker = node_worker(&t, &jobs, &calls, &failing);

    let wf = trigger(&pool, "etl", json!({"day": "2026-12-05"})).await;
    assert_eq!(ended(&pool, wf).await, "succeeded");
    let runs = node_runs(&pool, wf).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(
        runs.iter()
            .all(|r| r.state == "succeeded" && r.attempt == 1),
        "{runs:?}"
    );
    assert_edges(
        &[
            ("transform".into(), vec!["extract".into()]),
            ("load".into(), vec!["transform".into()]),
        ],
        &runs,
    );
    let by_job: HashMap<String, Call> = calls
        .all()
        .into_iter()
        .map(|c| (c.job.clone(), c))
        .collect();
    assert_eq!(calls.len(), 3, "each node ran once");
    assert!(
        calls
            .all()
            .iter()
            .all(|c| runs.iter().any(|r| r.id == c.run_id)),
        "every call was a node run"
    );
    // Params: the job's, the workflow run's, then the node's rendered templates.
    assert_eq!(
        by_job["wf-extract"].params,
        json!({"own": "wf-extract", "day": "2026-12-05", "rows": 41})
    );
    assert_eq!(by_job["wf-transform"].params["rows"], json!(42));
    assert_eq!(by_job["wf-load"].params["label"], json!("etl 2026-12-05"));
    assert_eq!(
        by_job["wf-transform"].upstream["extract"],
        Some(json!({"job": "wf-extract", "rows": 42}))
    );
    assert_eq!(
        by_job["wf-load"].upstream["transform"],
        Some(json!({"job": "wf-transform", "rows": 43}))
    );

    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_diamond_joins_once_after_a_branch_retries(pool: PgPool) {
    let t = Setup::new(&pool);
    let jobs = ["wf-root", "wf-left", "wf-right", "wf-join"];
    let mut specs: Vec<_> = jobs
        .iter()
        .map(|name| {
            job(json!({"name": name, "group": t.group,
                       "retry": {"max_attempts": 3, "initial": "1s", "jitter": false}}))
        })
        .collect();
    specs.push(job(json!({
        "name": "diamond", "kind": "workflow",
        "nodes": [
            {"name": "root", "job": "wf-root"},
            {"name": "left", "job": "wf-left", "after": ["root"], "params": {"fail_once": true}},
            {"name": "right", "job": "wf-right", "after": ["root"]},
            {"name": "join", "job": "wf-join", "after": ["left", "right"],
             "params": {"read": ["left", "right"]}},
        ],
    })));
    let scheduler = Scheduler::on(&t, "s1", specs);
    let calls = Events::new();
    let failing = Arc::new((String::new(), AtomicBool::new(false)));
    let worker = node_worker(&t, &jobs, &calls, &failing);

    let wf = trigger(&pool, "diamond", json!({})).await;
    assert_eq!(ended(&pool, wf).await, "succeeded");
    let runs = node_runs(&pool, wf).await;
    let attempts: BTreeMap<&str, (i32, &str)> = runs
        .iter()
        .map(|r| (r.node.as_str(), (r.attempt, r.state.as_str())))
        .collect();
    assert_eq!(
        attempts,
        BTreeMap::from([
            ("join", (1, "succeeded")),
            ("left", (2, "succeeded")),
            ("right", (1, "succeeded")),
            ("root", (1, "succeeded")),
        ])
    );
    assert_edges(
        &[
            ("left".into(), vec!["root".into()]),
            ("right".into(), vec!["root".into()]),
            ("join".into(), vec!["left".into(), "right".into()]),
        ],
        &runs,
    );
    let joins: Vec<Call> = calls
        .all()
        .into_iter()
        .filter(|c| c.job == "wf-join")
        .collect();
    assert_eq!(joins.len(), 1, "the join ran once: {joins:?}");
    assert_eq!(joins[0].attempt, 1);
    assert!(joins[0].upstream.values().all(Option::is_some), "{joins:?}");

    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failed_node_is_rerun_with_the_nodes_after_it(pool: PgPool) {
    let t = Setup::new(&pool);
    let jobs = ["wf-a", "wf-b", "wf-c", "wf-side"];
    let mut specs: Vec<_> = jobs
        .iter()
        .map(|name| job(json!({"name": name, "group": t.group, "retry": {"max_attempts": 1}})))
        .collect();
    specs.push(job(json!({
        "name": "rerun-me", "kind": "workflow",
        "nodes": [
            {"name": "a", "job": "wf-a"},
            {"name": "b", "job": "wf-b", "after": ["a"]},
            {"name": "c", "job": "wf-c", "after": ["b"]},
            {"name": "side", "job": "wf-side", "after": ["a"]},
        ],
    })));
    let scheduler = Scheduler::on(&t, "s1", specs);
    let calls = Events::new();
    let failing = Arc::new(("wf-b".to_owned(), AtomicBool::new(true)));
    let worker = node_worker(&t, &jobs, &calls, &failing);

    let wf = trigger(&pool, "rerun-me", json!({})).await;
    assert_eq!(ended(&pool, wf).await, "failed");
    assert_eq!(
        workflow_state(&pool, wf).await.1.as_deref(),
        Some("node b failed")
    );
    let outline = |runs: Vec<NodeRun>| -> Vec<(String, i32, String)> {
        runs.into_iter()
            .map(|r| (r.node, r.round, r.state))
            .collect()
    };
    let row = |n: &str, round: i32, s: &str| (n.to_owned(), round, s.to_owned());
    assert_eq!(
        outline(node_runs(&pool, wf).await),
        [
            row("a", 0, "succeeded"),
            row("b", 0, "failed"),
            row("c", 0, "skipped"),
            row("side", 0, "succeeded"),
        ]
    );

    failing.1.store(false, Ordering::SeqCst);
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let operator = Caller {
        actor: "cli:oncall".into(),
        role: Role::Operator,
    };
    let reran = ops
        .rerun_workflow(&operator, wf, "b")
        .await
        .expect("the rerun is accepted");
    assert_eq!(
        (reran.round, reran.nodes.clone()),
        (1, vec!["b".to_owned(), "c".to_owned()])
    );
    assert_eq!(ended(&pool, wf).await, "succeeded");
    assert_eq!(
        outline(node_runs(&pool, wf).await),
        [
            row("a", 0, "succeeded"),
            row("b", 0, "failed"),
            row("b", 1, "succeeded"),
            row("c", 0, "skipped"),
            row("c", 1, "succeeded"),
            row("side", 0, "succeeded"),
        ]
    );
    let ran: Vec<String> = calls.all().into_iter().map(|c| c.job).collect();
    assert_eq!(
        ran.iter().filter(|j| *j == "wf-a").count(),
        1,
        "a is not rerun: {ran:?}"
    );
    assert_eq!(ran.iter().filter(|j| *j == "wf-b").count(), 2, "{ran:?}");

    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

/// Nodes of the 50-node DAG: ten layers of five; each node after one or two of the layer
/// before. Node `n-3-2` is sharded (4 shards), `n-6-0` a map/reduce fire (20 items); the
/// rest run `chaos`, which prints each execution.
fn fifty_nodes() -> Vec<(String, String, Vec<String>)> {
    let mut nodes = Vec::new();
    for layer in 0..10 {
        for i in 0..5 {
            let name = format!("n-{layer}-{i}");
            let after = if layer == 0 {
                Vec::new()
            } else {
                let mut after = vec![format!("n-{}-{i}", layer - 1)];
                if i % 2 == 1 {
                    after.push(format!("n-{}-{}", layer - 1, (i + 1) % 5));
                }
                after
            };
            let job = match (layer, i) {
                (3, 2) => "kinds-task",
                (6, 0) => "kinds-map",
                _ => "chaos",
            };
            nodes.push((name, job.to_owned(), after));
        }
    }
    nodes
}

/// `chime scheduler` as instance `instance`, with a short lease so a killed leader is replaced
/// within seconds.
fn scheduler_process(t: &Setup, jobs: &Path, logs: &Path, instance: &str) -> Process {
    let chime = sibling_binary("chime").expect("chime is built");
    let mut command = Command::new(chime);
    command
        .arg("scheduler")
        .arg("--jobs")
        .arg(jobs)
        .env("CHIME_DATABASE_URL", &t.database_url)
        .env("CHIME_AMQP_URL", AMQP_URL)
        .env("CHIME_QUEUE_PREFIX", &t.prefix)
        .env("CHIME_INSTANCE_ID", instance)
        .env("CHIME_BIND", "127.0.0.1:0")
        .env("CHIME_LEADER__LEASE_TTL", "3s")
        .env("CHIME_LEADER__RENEW_INTERVAL", "1s")
        .env("RUST_LOG", "info,sqlx=warn,lapin=warn")
        .env("NO_COLOR", "1");
    Process::spawn(
        &format!("scheduler {instance}"),
        command,
        &logs.join(format!("{instance}.log")),
    )
    .expect("start chime scheduler")
}

/// A `chime-test-worker` process of the test's group.
fn worker_process(t: &Setup, logs: &Path, id: &str) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chime-test-worker"));
    command
        .env("CHIME_TEST_DATABASE_URL", &t.database_url)
        .env("CHIME_TEST_AMQP_URLS", AMQP_URL)
        .env("CHIME_TEST_PREFIX", &t.prefix)
        .env("CHIME_TEST_GROUP", &t.group)
        .env("CHIME_TEST_WORKER_ID", id)
        .env("CHIME_TEST_CAPACITY", "8")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1");
    t.guard.add_worker_queue(&t.group, id);
    Process::spawn(
        &format!("worker {id}"),
        command,
        &logs.join(format!("{id}.log")),
    )
    .expect("start chime-test-worker")
}

/// The instance holding the lease, if any.
async fn leader(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar("SELECT holder FROM chime_leader WHERE expires_at > now()")
        .fetch_optional(pool)
        .await
        .expect("read the lease")
        .flatten()
}

/// How many node runs of workflow run `id` have ended.
async fn nodes_ended(pool: &PgPool, id: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM chime_runs WHERE workflow_run_id = $1 AND chime_run_ended(state)",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("count ended nodes")
}

#[sqlx::test(migrations = "../migrations")]
async fn fifty_nodes_run_once_each_in_order_while_the_leader_is_killed_twice(pool: PgPool) {
    let t = Setup::new(&pool);
    let logs = tempfile::tempdir().expect("a log directory");
    let nodes = fifty_nodes();
    let mut text = format!(
        "[[jobs]]\nname = \"chaos\"\ngroup = \"{g}\"\n\n\
         [[jobs]]\nname = \"kinds-task\"\ngroup = \"{g}\"\nkind = \"sharded\"\nshards = 4\n\n\
         [[jobs]]\nname = \"kinds-map\"\ngroup = \"{g}\"\nkind = \"map_reduce\"\n\n\
         [[workflows]]\nname = \"fifty\"\n\n",
        g = t.group
    );
    for (name, job, after) in &nodes {
        let params = match job.as_str() {
            "kinds-map" => "{ items = 20, ms = 20 }",
            _ => "{ ms = 150 }",
        };
        let after: Vec<String> = after.iter().map(|a| format!("{a:?}")).collect();
        text.push_str(&format!(
            "[[workflows.nodes]]\nname = \"{name}\"\njob = \"{job}\"\nafter = [{}]\nparams = {params}\n\n",
            after.join(", ")
        ));
    }
    let jobs = logs.path().join("jobs.toml");
    std::fs::write(&jobs, text).expect("write the job file");

    let mut workers = vec![
        worker_process(&t, logs.path(), "wf-node-1"),
        worker_process(&t, logs.path(), "wf-node-2"),
    ];
    let mut a = scheduler_process(&t, &jobs, logs.path(), "a");
    wait_for(PATIENCE, "a to lead", || async {
        (leader(&pool).await.as_deref() == Some("a")).then_some(())
    })
    .await;
    let mut b = scheduler_process(&t, &jobs, logs.path(), "b");
    let wf = trigger(&pool, "fifty", json!({})).await;

    // First kill: some nodes have ended and others wait to be advanced.
    wait_for(PATIENCE, "10 nodes to end", || async {
        (nodes_ended(&pool, wf).await >= 10).then_some(())
    })
    .await;
    a.kill().await.expect("SIGKILL a");
    wait_for(PATIENCE, "b to lead", || async {
        (leader(&pool).await.as_deref() == Some("b")).then_some(())
    })
    .await;
    let mut c = scheduler_process(&t, &jobs, logs.path(), "c");
    // Second kill, halfway.
    wait_for(PATIENCE, "25 nodes to end", || async {
        (nodes_ended(&pool, wf).await >= 25).then_some(())
    })
    .await;
    b.kill().await.expect("SIGKILL b");

    assert_eq!(ended(&pool, wf).await, "succeeded");
    let runs = node_runs(&pool, wf).await;
    assert_eq!(runs.len(), 50, "one run per node: {runs:?}");
    assert!(
        runs.iter().all(|r| r.round == 0 && r.state == "succeeded"),
        "{runs:?}"
    );
    let edges: Vec<(String, Vec<String>)> = nodes
        .iter()
        .map(|(name, _, after)| (name.clone(), after.clone()))
        .collect();
    assert_edges(&edges, &runs);

    // Each chaos node run was executed exactly once, by the workers' own account.
    let mut executions: HashMap<i64, usize> = HashMap::new();
    for worker in &workers {
        for line in worker.stdout_lines() {
            let mut words = line.split_whitespace();
            if words.next() == Some("ran")
                && let Some(id) = words.next().and_then(|n| n.parse::<i64>().ok())
            {
                *executions.entry(id).or_default() += 1;
            }
        }
    }
    for run in runs
        .iter()
        .filter(|r| !matches!(r.node.as_str(), "n-3-2" | "n-6-0"))
    {
        assert_eq!(
            executions.get(&run.id),
            Some(&1),
            "node {} (run {})",
            run.node,
            run.id
        );
    }
    // The sharded node's 4 shards and the map/reduce node's tasks ran under their node run.
    let tasks: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT p.node, count(*), count(*) FILTER (WHERE t.state = 'succeeded')
           FROM chime_runs p JOIN chime_runs t ON t.parent_id = p.id
          WHERE p.workflow_run_id = $1 GROUP BY p.node ORDER BY p.node",
    )
    .bind(wf)
    .fetch_all(&pool)
    .await
    .expect("count tasks");
    assert_eq!(tasks[0], ("n-3-2".to_owned(), 4, 4));
    assert_eq!(tasks[1].0, "n-6-0");
    assert_eq!(tasks[1].1, tasks[1].2, "every map/reduce task succeeded");
    assert_eq!(tasks[1].1, 22, "the root, 20 items and the reducer");
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_workflow_advances")
        .fetch_one(&pool)
        .await
        .expect("read the queue");
    assert_eq!(queued, 0, "nothing left to advance");

    c.stop(Duration::from_secs(10)).await.expect("stop c");
    for worker in &mut workers {
        worker
            .stop(Duration::from_secs(10))
            .await
            .expect("stop a worker");
    }
    t.finish().await;
}

/// A workflow with `concurrency = "replace"`: a second run cancels the first, whose running
/// node's handler is told through its cancellation token; the first run ends `cancelled`, its
/// waiting node skipped, and the second runs to the end.
#[sqlx::test(migrations = "../migrations")]
async fn a_replaced_workflow_run_stops_its_running_node(pool: PgPool) {
    let t = Setup::new(&pool);
    let specs = vec![
        job(json!({"name": "wf-hold", "group": t.group, "retry": {"max_attempts": 1}})),
        job(json!({"name": "wf-after", "group": t.group})),
        job(json!({
            "name": "replaced", "kind": "workflow", "concurrency": "replace",
            "nodes": [
                {"name": "hold", "job": "wf-hold"},
                {"name": "after", "job": "wf-after", "after": ["hold"]},
            ],
        })),
    ];
    let scheduler = Scheduler::on(&t, "s1", specs);
    let cancelled = Events::new();
    let worker = {
        let cancelled = cancelled.clone();
        KindWorker::start(&t, "wf-replace-worker", move |builder| {
            builder
                .handle("wf-hold", move |ctx: JobContext, params: Value| {
                    let cancelled = cancelled.clone();
                    async move {
                        if params["hold"] == json!(true) {
                            ctx.cancelled().await;
                            cancelled.record(ctx.run_id());
                            return Err(JobError::fail("cancelled"));
                        }
                        Ok::<(), JobError>(())
                    }
                })
                .handle("wf-after", |_: JobContext, _: Value| async {
                    Ok::<(), JobError>(())
                })
        })
    };

    let first = trigger(&pool, "replaced", json!({"hold": true})).await;
    let held = wait_for(PATIENCE, "the first run's node to be running", || async {
        node_runs(&pool, first)
            .await
            .into_iter()
            .find(|r| r.node == "hold" && r.state == "running")
            .map(|r| r.id)
    })
    .await;
    let second = trigger(&pool, "replaced", json!({"hold": false})).await;
    assert_eq!(ended(&pool, second).await, "succeeded");
    assert_eq!(ended(&pool, first).await, "cancelled");
    wait_for(PATIENCE, "the held handler to see its cancel", || async {
        cancelled.all().contains(&held).then_some(())
    })
    .await;
    let outline: Vec<(String, String)> = node_runs(&pool, first)
        .await
        .into_iter()
        .map(|r| (r.node, r.state))
        .collect();
    assert_eq!(outline[0], ("after".to_owned(), "skipped".to_owned()));
    assert_eq!(outline[1].0, "hold");
    assert_ne!(outline[1].1, "succeeded", "{outline:?}");

    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}
