//! `children`: chains of child jobs (`on_success`), with in-process workers and the scheduler in
//! process: C chains (default 50) of L jobs each (default 10) started at once, each job's run
//! starting the next job's when it succeeds. Per edge, from the database: the upstream run's
//! end → the child run made, → the child started (the advance latency, judged against issue
//! 18's p99 ≤ 50 ms); and the checks that every upstream run made exactly one child, every run
//! succeeded in one attempt and no chain lost a link.

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

/// Parameters of the children scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Chains started at once.
    pub chains: usize,
    /// Jobs per chain: each starts the next on success.
    pub length: usize,
    /// In-process workers.
    pub workers: usize,
    /// Handlers per worker.
    pub capacity: u16,
}

/// One link of a chain: an upstream run and the child run it made.
#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    /// The upstream run.
    pub upstream: i64,
    /// The child run.
    pub child: i64,
    /// Upstream ended → child made, ms.
    pub made_ms: f64,
    /// Upstream ended → child started, ms.
    pub started_ms: f64,
}

/// What the database holds once every chain ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Runs in all.
    pub runs: i64,
    /// Runs that succeeded in one attempt.
    pub succeeded_once: i64,
    /// Upstream runs with more than one child run.
    pub doubled: i64,
    /// The chains' links.
    pub edges: Vec<Edge>,
    /// First trigger → the last run ended, ms.
    pub total_ms: f64,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    anyhow::ensure!(
        (1..=1_000).contains(&params.chains),
        "children needs --jobs between 1 and 1000 (chains started at once)"
    );
    within(services, "children", async |sandbox| {
        measure(sandbox, params).await
    })
    .await
}

/// The name of link `i` of the chain.
fn link(i: usize) -> String {
    format!("chain-{i}")
}

async fn measure(sandbox: &Sandbox, params: &Params) -> anyhow::Result<Report> {
    let group = sandbox.group("children");
    let specs = (0..params.length)
        .map(|i| {
            let mut spec = json!({"name": link(i), "group": group});
            if i + 1 < params.length {
                spec["on_success"] = json!([link(i + 1)]);
            }
            serde_json::from_value::<chime_scheduler::job::JobSpec>(spec)
                .context("a chain job is not valid")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let scheduler = Scheduler::start(sandbox.service_config("bench-children"), specs);
    let (stop, workers) = start_workers(sandbox, &group, params)?;
    sandbox
        .wait_for_consumers(&group, u32::try_from(params.workers).unwrap_or(u32::MAX))
        .await?;
    let last = link(params.length - 1);
    for name in [link(0), last.clone()] {
        poll(Duration::from_secs(60), "the jobs to be stored", || async {
            Ok(sandbox.store.job(&name).await?.map(|_| ()))
        })
        .await?;
    }
    let started = sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>("SELECT now()")
        .fetch_one(sandbox.store.pool())
        .await?;
    for _ in 0..params.chains {
        sandbox
            .store
            .trigger(&link(0), Some(json!({})), "chime-bench")
            .await?
            .context("the first chain job is not stored")?;
    }
    let chains = i64::try_from(params.chains).unwrap_or(i64::MAX);
    let ended = poll(Duration::from_secs(600), "every chain to end", || async {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM chime_runs WHERE job_name = $1 AND finished_at IS NOT NULL",
        )
        .bind(&last)
        .fetch_one(sandbox.store.pool())
        .await?;
        Ok((done >= chains).then_some(()))
    })
    .await;
    if let Err(e) = ended {
        eprintln!("[children] {e:#}");
    }
    let outcome = read_outcome(sandbox, started).await?;
    stop_in_process(&stop, workers, scheduler).await?;
    Ok(report(params, &outcome))
}

/// The scenario's workers: each chain job's handler reads its parent (`ctx.parent()`, as a
/// child job's handler would) and stores a small output for the next.
fn start_workers(
    sandbox: &Sandbox,
    group: &str,
    params: &Params,
) -> anyhow::Result<(CancellationToken, Vec<WorkerTask>)> {
    start_in_process(
        sandbox,
        "children",
        group,
        params.workers,
        params.capacity,
        |mut builder| {
            for i in 0..params.length {
                builder = builder.handle(link(i), |ctx: JobContext, _: Value| async move {
                    let depth = match ctx.parent().await.map_err(TaskError::into_job_error)? {
                        Some(parent) => {
                            parent.output.and_then(|o| o["depth"].as_u64()).unwrap_or(0) + 1
                        }
                        None => 0,
                    };
                    ctx.set_output(&json!({"depth": depth}))
                        .await
                        .map_err(TaskError::into_job_error)?;
                    Ok::<(), JobError>(())
                });
            }
            builder
        },
    )
}

async fn read_outcome(
    sandbox: &Sandbox,
    started: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Outcome> {
    let pool = sandbox.store.pool();
    let counts = sqlx::query(
        "SELECT count(*) AS runs,
                count(*) FILTER (WHERE state = 'succeeded' AND attempt = 1) AS succeeded_once,
                (SELECT count(*) FROM (SELECT upstream_run_id FROM chime_runs
                                        WHERE upstream_run_id IS NOT NULL
                                        GROUP BY upstream_run_id HAVING count(*) > 1) d)
                    AS doubled,
                (extract(epoch FROM max(finished_at) - $1) * 1000)::float8 AS total_ms
           FROM chime_runs",
    )
    .bind(started)
    .fetch_one(pool)
    .await
    .context("counting the runs")?;
    let edges = sqlx::query(
        "SELECT u.id AS upstream, c.id AS child,
                (extract(epoch FROM c.created_at - u.finished_at) * 1000)::float8 AS made_ms,
                (extract(epoch FROM c.started_at - u.finished_at) * 1000)::float8 AS started_ms
           FROM chime_runs c JOIN chime_runs u ON u.id = c.upstream_run_id
          ORDER BY c.id",
    )
    .fetch_all(pool)
    .await
    .context("reading the links")?
    .iter()
    .map(|r| Edge {
        upstream: r.get("upstream"),
        child: r.get("child"),
        made_ms: r.get::<Option<f64>, _>("made_ms").unwrap_or(f64::NAN),
        started_ms: r.get::<Option<f64>, _>("started_ms").unwrap_or(f64::NAN),
    })
    .collect();
    Ok(Outcome {
        runs: counts.get("runs"),
        succeeded_once: counts.get("succeeded_once"),
        doubled: counts.get("doubled"),
        edges,
        total_ms: counts.get::<Option<f64>, _>("total_ms").unwrap_or(f64::NAN),
    })
}

fn report(params: &Params, outcome: &Outcome) -> Report {
    let chains = i64::try_from(params.chains).unwrap_or(i64::MAX);
    let length = i64::try_from(params.length).unwrap_or(i64::MAX);
    let runs = chains.saturating_mul(length);
    let links = usize::try_from(chains.saturating_mul(length - 1)).unwrap_or(usize::MAX);
    let made = Summary::of(outcome.edges.iter().map(|e| e.made_ms).collect());
    let started = Summary::of(outcome.edges.iter().map(|e| e.started_ms).collect());
    let fast = started.p99_ms.is_some_and(|p99| p99 <= TARGET_P99_MS);
    let whole = outcome.runs == runs
        && outcome.succeeded_once == runs
        && outcome.doubled == 0
        && outcome.edges.len() == links;
    let rows = vec![
        Row::judged(
            "runs that succeeded in one attempt",
            format!("{} of {}", outcome.succeeded_once, outcome.runs),
            runs.to_string(),
            outcome.runs == runs && outcome.succeeded_once == runs,
        ),
        Row::judged(
            "links made (one child per upstream run)",
            outcome.edges.len().to_string(),
            links.to_string(),
            outcome.edges.len() == links,
        ),
        Row::judged(
            "upstream runs with a second child",
            outcome.doubled.to_string(),
            "0",
            outcome.doubled == 0,
        ),
        Row::info("upstream ended → child made", summary(&made)),
        Row::judged(
            "upstream ended → child started (advance latency)",
            summary(&started),
            format!("p99 ≤ {TARGET_P99_MS:.0} ms"),
            fast,
        ),
        Row::info(
            "first trigger → last run ended",
            format!("{:.0} ms", outcome.total_ms),
        ),
    ];
    Report {
        scenario: "children",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: whole,
        results: serde_json::to_value(outcome).unwrap_or_default(),
        table: rows,
        notes: vec![format!(
            "{} chains of {} jobs linked by on_success, started at once by manual triggers; \
             each handler reads its parent (ctx.parent()) and stores an output; {} Rust SDK \
             workers in this process (capacity {}); the scheduler in this process; times from \
             the database (the upstream's finished_at is its worker's record of the handler's \
             end)",
            params.chains, params.length, params.workers, params.capacity
        )],
    }
}
