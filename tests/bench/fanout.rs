//! `fanout`: one sharded job with N shards (default 10,000), fired F times by hand, one fire
//! after the other, with in-process workers. Per fire, from the database: the expansion and
//! publishing of its tasks (the parent's creation → the last task's `published_at`), the
//! parent's creation → the last task's start, and → the parent's end; tasks per second over the
//! whole fire; and the checks that every task ran exactly one attempt and the parent succeeded.

use std::time::Duration;

use anyhow::Context as _;
use chime_e2e::Scheduler;
use serde::Serialize;
use sqlx::Row as _;

use crate::recorder::{WorkerKind, Workers};
use crate::report::{Report, Row, summary};
use crate::sandbox::{Sandbox, Services, bounded, poll, within};
use crate::stats::Summary;

/// Parameters of the fanout scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Shards of the job: tasks per fire.
    pub shards: usize,
    /// Fires, one after the other.
    pub fires: usize,
    /// In-process workers.
    pub workers: usize,
    /// Handlers per worker.
    pub capacity: u16,
    /// Deliveries each worker may hold beyond its handlers.
    pub hold: u16,
}

/// One fire as the database recorded it.
#[derive(Debug, Clone, Serialize)]
pub struct Fire {
    /// The parent run.
    pub run_id: i64,
    /// Its final state.
    pub state: String,
    /// Tasks created.
    pub tasks: i64,
    /// Tasks that ended `succeeded`.
    pub succeeded: i64,
    /// Tasks with more than one attempt (a task run twice would show here).
    pub rerun: i64,
    /// Parent created → last task published, ms.
    pub published_ms: f64,
    /// Parent created → last task started, ms.
    pub started_ms: f64,
    /// Parent created → parent ended, ms.
    pub ended_ms: f64,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    anyhow::ensure!(
        (1..=chime_protocol::limits::MAX_SHARDS as usize).contains(&params.shards),
        "fanout needs --jobs between 1 and {} (shards per fire)",
        chime_protocol::limits::MAX_SHARDS
    );
    within(services, "fanout", async |sandbox| {
        measure(sandbox, params).await
    })
    .await
}

async fn measure(sandbox: &Sandbox, params: &Params) -> anyhow::Result<Report> {
    let group = sandbox.group("fanout");
    let spec: chime_scheduler::job::JobSpec = serde_json::from_value(serde_json::json!({
        "name": "fanout", "group": group, "kind": "sharded", "shards": params.shards,
    }))
    .context("the fanout job is not valid")?;
    let scheduler = Scheduler::start(sandbox.service_config("bench-fanout"), vec![spec]);
    let workers = Workers::start(
        sandbox,
        &WorkerKind::InProcess,
        &group,
        &["fanout".to_owned()],
        params.workers,
        params.capacity,
        params.hold,
    )?;
    sandbox
        .wait_for_consumers(&group, u32::try_from(params.workers).unwrap_or(u32::MAX))
        .await?;
    poll(Duration::from_secs(60), "the job to be stored", || async {
        Ok(sandbox.store.job("fanout").await?.map(|_| ()))
    })
    .await?;

    let mut fires = Vec::with_capacity(params.fires);
    for n in 0..params.fires {
        let id = sandbox
            .store
            .trigger("fanout", None, "chime-bench")
            .await?
            .context("the fanout job is not stored")?;
        let ended = poll(Duration::from_secs(600), "the fire to end", || async {
            let state: String = sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
                .bind(id)
                .fetch_one(sandbox.store.pool())
                .await?;
            Ok((!matches!(state.as_str(), "pending" | "queued" | "running")).then_some(()))
        })
        .await;
        if let Err(e) = ended {
            eprintln!("[fanout] fire {n}: {e:#}");
        }
        let fire = read_fire(sandbox, id).await?;
        eprintln!(
            "[fanout] fire {n}: {} tasks, published in {:.0} ms, ended in {:.0} ms",
            fire.tasks, fire.published_ms, fire.ended_ms
        );
        fires.push(fire);
    }
    workers.stop().await?;
    bounded(
        "stopping the scheduler",
        Duration::from_secs(60),
        scheduler.stop(),
    )
    .await?;
    Ok(report(params, &fires))
}

async fn read_fire(sandbox: &Sandbox, id: i64) -> anyhow::Result<Fire> {
    let ms = |field: &str| {
        format!(
            "extract(epoch FROM (SELECT max(t.{field}) FROM chime_runs t WHERE t.parent_id = p.id) - p.created_at) * 1000"
        )
    };
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT p.state,
                (SELECT count(*) FROM chime_runs t WHERE t.parent_id = p.id) AS tasks,
                (SELECT count(*) FROM chime_runs t WHERE t.parent_id = p.id
                    AND t.state = 'succeeded') AS succeeded,
                (SELECT count(*) FROM chime_runs t WHERE t.parent_id = p.id AND t.attempt > 1)
                    AS rerun,
                ({published})::float8 AS published_ms, ({started})::float8 AS started_ms,
                (extract(epoch FROM p.finished_at - p.created_at) * 1000)::float8 AS ended_ms
         FROM chime_runs p WHERE p.id = $1",
        published = ms("published_at"),
        started = ms("started_at"),
    )))
    .bind(id)
    .fetch_one(sandbox.store.pool())
    .await
    .context("reading the fire")?;
    let get = |c: &str| row.get::<Option<f64>, _>(c).unwrap_or(f64::NAN);
    Ok(Fire {
        run_id: id,
        state: row.get("state"),
        tasks: row.get("tasks"),
        succeeded: row.get("succeeded"),
        rerun: row.get("rerun"),
        published_ms: get("published_ms"),
        started_ms: get("started_ms"),
        ended_ms: get("ended_ms"),
    })
}

fn report(params: &Params, fires: &[Fire]) -> Report {
    let shards = i64::try_from(params.shards).unwrap_or(i64::MAX);
    let whole = fires
        .iter()
        .filter(|f| f.state == "succeeded" && f.tasks == shards && f.succeeded == shards)
        .count();
    let rerun: i64 = fires.iter().map(|f| f.rerun).sum();
    let series = |f: fn(&Fire) -> f64| Summary::of(fires.iter().map(f).collect());
    let rates: Vec<String> = fires
        .iter()
        .map(|f| format!("{:.0}", f.tasks as f64 / (f.ended_ms / 1000.0)))
        .collect();
    let rows = vec![
        Row::judged(
            "fires whose every shard succeeded once",
            format!("{whole} of {}", fires.len()),
            format!("{}", fires.len()),
            whole == fires.len(),
        ),
        Row::judged(
            "tasks with a second attempt",
            rerun.to_string(),
            "0",
            rerun == 0,
        ),
        Row::info(
            "created → last task published",
            summary(&series(|f| f.published_ms)),
        ),
        Row::info(
            "created → last task started",
            summary(&series(|f| f.started_ms)),
        ),
        Row::info("created → run ended", summary(&series(|f| f.ended_ms))),
        Row::info("tasks per second, each fire", rates.join(", ")),
    ];
    Report {
        scenario: "fanout",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: !fires.is_empty() && whole == fires.len() && rerun == 0,
        results: serde_json::to_value(fires).unwrap_or_default(),
        table: rows,
        notes: vec![format!(
            "one sharded job of {} shards fired by hand {} times, one after the other; {} Rust \
             SDK workers in this process (capacity {}, no-op handler); the scheduler in this \
             process; times from the database",
            params.shards, params.fires, params.workers, params.capacity
        )],
    }
}
