//! `workflow`: one run of a layered DAG of N nodes in L layers (default 1,000 nodes in 20
//! layers of 50; as many layers as nodes: a chain), each node after two of the layer before (fan-in) and so each before two
//! of the next (fan-out), with
//! in-process workers and the scheduler in process. Per node, from the database: the latest end
//! among the nodes it comes after → its run made, → its handler started (the advance latency,
//! judged against issue 18's p99 ≤ 50 ms); the workflow run's total time; and the checks that
//! every node ran exactly once, succeeded in one attempt, and started after all its `after`
//! nodes ended.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use chime_e2e::Scheduler;
use chime_worker::{CancellationToken, JobContext, JobError, TaskError};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::report::{Report, Row, summary};
use crate::sandbox::{
    Sandbox, Services, WorkerTask, poll, start_in_process, stop_in_process, within,
};
use crate::stats::Summary;

/// The advance latency's 99th percentile must stay within this (issue 18), ms.
const TARGET_P99_MS: f64 = 50.0;
/// Layers of the DAG when `--layers` is not given (fewer when there are fewer nodes).
pub const DEFAULT_LAYERS: usize = 20;
/// The job every node runs.
const NODE_JOB: &str = "wf-bench-node";

/// Parameters of the workflow scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Nodes in the DAG, in layers of `nodes / layers` (at least 1).
    pub nodes: usize,
    /// Layers of the DAG (default 20; more than the nodes makes a chain).
    pub layers: usize,
    /// In-process workers.
    pub workers: usize,
    /// Handlers per worker.
    pub capacity: u16,
}

/// One node's run as measured.
#[derive(Debug, Clone, Serialize)]
pub struct NodeTiming {
    /// The node.
    pub node: String,
    /// Its run.
    pub run_id: i64,
    /// The latest end among its `after` nodes → its run made, ms (`None` for a first node).
    pub made_ms: Option<f64>,
    /// The latest end among its `after` nodes → its handler started, ms.
    pub started_ms: Option<f64>,
}

/// What the database holds once the workflow run ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The workflow run's end state.
    pub state: String,
    /// Node runs in all.
    pub node_runs: i64,
    /// Node runs that succeeded in one attempt.
    pub succeeded_once: i64,
    /// Nodes with more than one run.
    pub doubled: i64,
    /// Node runs made or started before one of their `after` nodes ended.
    pub early: usize,
    /// Per node.
    pub nodes: Vec<NodeTiming>,
    /// The workflow run started → ended, ms.
    pub total_ms: f64,
}

/// Nodes per layer: `layers` layers when there are at least that many nodes.
fn width(nodes: usize, layers: usize) -> usize {
    (nodes / layers.max(1)).max(1)
}

/// The DAG: node `l-i` after `(l-1)-i` and `(l-1)-(i+1 mod width)`.
fn dag(nodes: usize, layers: usize) -> Vec<(String, Vec<String>)> {
    let width = width(nodes, layers);
    let layers = nodes.div_ceil(width);
    let mut out = Vec::with_capacity(nodes);
    for layer in 0..layers {
        for i in 0..width {
            if out.len() == nodes {
                break;
            }
            let after = if layer == 0 {
                Vec::new()
            } else if width == 1 {
                vec![format!("n{}-{i}", layer - 1)]
            } else {
                vec![
                    format!("n{}-{i}", layer - 1),
                    format!("n{}-{}", layer - 1, (i + 1) % width),
                ]
            };
            out.push((format!("n{layer}-{i}"), after));
        }
    }
    out
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    anyhow::ensure!(
        (1..=chime_protocol::limits::MAX_WORKFLOW_NODES).contains(&params.nodes),
        "workflow needs --jobs between 1 and {} (the DAG's nodes)",
        chime_protocol::limits::MAX_WORKFLOW_NODES
    );
    anyhow::ensure!(
        params.layers >= 1,
        "workflow needs --layers of 1 or more (more than the nodes makes a chain)"
    );
    within(services, "workflow", async |sandbox| {
        measure(sandbox, params).await
    })
    .await
}

async fn measure(sandbox: &Sandbox, params: &Params) -> anyhow::Result<Report> {
    let group = sandbox.group("workflow");
    let nodes = dag(params.nodes, params.layers);
    let definition: Vec<Value> = nodes
        .iter()
        .map(|(name, after)| json!({"name": name, "job": NODE_JOB, "after": after}))
        .collect();
    let specs = [
        json!({"name": NODE_JOB, "group": group}),
        json!({"name": "wf-bench", "kind": "workflow", "nodes": definition}),
    ]
    .into_iter()
    .map(|spec| {
        serde_json::from_value::<chime_scheduler::job::JobSpec>(spec)
            .context("a workflow bench job is not valid")
    })
    .collect::<anyhow::Result<Vec<_>>>()?;
    let scheduler = Scheduler::start(sandbox.service_config("bench-workflow"), specs);
    let (stop, workers) = start_workers(sandbox, &group, params)?;
    sandbox
        .wait_for_consumers(&group, u32::try_from(params.workers).unwrap_or(u32::MAX))
        .await?;
    for name in [NODE_JOB, "wf-bench"] {
        poll(Duration::from_secs(60), "the jobs to be stored", || async {
            Ok(sandbox.store.job(name).await?.map(|_| ()))
        })
        .await?;
    }
    let id = sandbox
        .store
        .trigger("wf-bench", Some(json!({})), "chime-bench")
        .await?
        .context("the workflow is not stored")?;
    let ended = poll(
        Duration::from_secs(900),
        "the workflow run to end",
        || async {
            let state: String = sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
                .bind(id)
                .fetch_one(sandbox.store.pool())
                .await?;
            Ok((!matches!(state.as_str(), "pending" | "running")).then_some(()))
        },
    )
    .await;
    if let Err(e) = ended {
        eprintln!("[workflow] {e:#}");
    }
    let outcome = read_outcome(sandbox, id, &nodes).await?;
    stop_in_process(&stop, workers, scheduler).await?;
    Ok(report(params, &outcome))
}

/// The scenario's workers: the node job's handler reads one upstream node, as a node reading
/// its input would, and stores a small output.
fn start_workers(
    sandbox: &Sandbox,
    group: &str,
    params: &Params,
) -> anyhow::Result<(CancellationToken, Vec<WorkerTask>)> {
    start_in_process(
        sandbox,
        "workflow",
        group,
        params.workers,
        params.capacity,
        |builder| {
            builder.handle(NODE_JOB, |ctx: JobContext, _: Value| async move {
                ctx.set_output(&json!({"run": ctx.run_id()}))
                    .await
                    .map_err(TaskError::into_job_error)?;
                Ok::<(), JobError>(())
            })
        },
    )
}

/// A node run as read back.
struct NodeRow {
    id: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

async fn read_outcome(
    sandbox: &Sandbox,
    id: i64,
    nodes: &[(String, Vec<String>)],
) -> anyhow::Result<Outcome> {
    let pool = sandbox.store.pool();
    let run = sqlx::query(
        "SELECT state, (extract(epoch FROM finished_at - started_at) * 1000)::float8 AS total_ms
           FROM chime_runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .context("reading the workflow run")?;
    let rows = sqlx::query(
        "SELECT id, node, state, attempt, created_at, started_at, finished_at
           FROM chime_runs WHERE workflow_run_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .context("reading the node runs")?;
    let mut by_node: HashMap<String, Vec<NodeRow>> = HashMap::new();
    for r in &rows {
        by_node.entry(r.get("node")).or_default().push(NodeRow {
            id: r.get("id"),
            created_at: r.get("created_at"),
            started_at: r.get("started_at"),
            finished_at: r.get("finished_at"),
        });
    }
    let ms = |d: chrono::TimeDelta| d.num_microseconds().map_or(f64::NAN, |us| us as f64 / 1e3);
    let mut timings = Vec::with_capacity(nodes.len());
    let mut early = 0;
    for (name, after) in nodes {
        let Some(run) = by_node.get(name).and_then(|runs| runs.first()) else {
            continue;
        };
        let latest = after
            .iter()
            .filter_map(|a| {
                by_node
                    .get(a)
                    .and_then(|r| r.first())
                    .and_then(|r| r.finished_at)
            })
            .max();
        if let Some(latest) = latest
            && (run.created_at < latest || run.started_at.is_some_and(|s| s < latest))
        {
            early += 1;
        }
        timings.push(NodeTiming {
            node: name.clone(),
            run_id: run.id,
            made_ms: latest.map(|l| ms(run.created_at - l)),
            started_ms: latest.and_then(|l| run.started_at.map(|s| ms(s - l))),
        });
    }
    Ok(Outcome {
        state: run.get("state"),
        node_runs: i64::try_from(rows.len()).unwrap_or(i64::MAX),
        succeeded_once: rows
            .iter()
            .filter(|r| {
                r.get::<String, _>("state") == "succeeded" && r.get::<i32, _>("attempt") == 1
            })
            .count() as i64,
        doubled: by_node.values().filter(|runs| runs.len() > 1).count() as i64,
        early,
        nodes: timings,
        total_ms: run.get::<Option<f64>, _>("total_ms").unwrap_or(f64::NAN),
    })
}

fn report(params: &Params, outcome: &Outcome) -> Report {
    let nodes = i64::try_from(params.nodes).unwrap_or(i64::MAX);
    let made = Summary::of(outcome.nodes.iter().filter_map(|n| n.made_ms).collect());
    let started = Summary::of(outcome.nodes.iter().filter_map(|n| n.started_ms).collect());
    let fast = started.p99_ms.is_some_and(|p99| p99 <= TARGET_P99_MS);
    let whole = outcome.state == "succeeded"
        && outcome.node_runs == nodes
        && outcome.succeeded_once == nodes
        && outcome.doubled == 0
        && outcome.early == 0;
    let width = width(params.nodes, params.layers);
    let layers = params.nodes.div_ceil(width);
    let rows = vec![
        Row::judged(
            "workflow run",
            outcome.state.clone(),
            "succeeded",
            outcome.state == "succeeded",
        ),
        Row::judged(
            "node runs that succeeded in one attempt",
            format!("{} of {}", outcome.succeeded_once, outcome.node_runs),
            nodes.to_string(),
            outcome.node_runs == nodes && outcome.succeeded_once == nodes,
        ),
        Row::judged(
            "nodes run twice",
            outcome.doubled.to_string(),
            "0",
            outcome.doubled == 0,
        ),
        Row::judged(
            "nodes made or started before an after node ended",
            outcome.early.to_string(),
            "0",
            outcome.early == 0,
        ),
        Row::info("after nodes ended → node run made", summary(&made)),
        Row::judged(
            "after nodes ended → node started (advance latency)",
            summary(&started),
            format!("p99 ≤ {TARGET_P99_MS:.0} ms"),
            fast,
        ),
        Row::info(
            "workflow run started → ended",
            format!("{:.0} ms", outcome.total_ms),
        ),
    ];
    Report {
        scenario: "workflow",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: whole,
        results: serde_json::to_value(outcome).unwrap_or_default(),
        table: rows,
        notes: vec![format!(
            "one workflow run of {} nodes in {layers} layers of up to {width}, each node after two \
             of the layer before, started by a manual trigger; each handler stores an output; \
             {} Rust SDK workers in this process (capacity {}); the scheduler in this process; \
             times from the database (a node's finished_at is its worker's record of the \
             handler's end)",
            params.nodes, params.workers, params.capacity
        )],
    }
}
