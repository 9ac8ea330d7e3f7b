//! `fanout`: fires of N tasks each (default 10,000), with in-process workers and the scheduler
//! in process, one fire after the other: F fires of a sharded job of N shards, then F fires of
//! a map/reduce job whose root task maps N sub-tasks in one call and whose reducer reads every
//! result. Per fire, from the database: the parent's creation → the last task's
//! `published_at`, → the last task's start (the reduce task aside), → the parent's end (for
//! map/reduce: the reducer finished); tasks per second over the whole fire, judged against
//! issue 15's 3,000; and the checks that every task ran exactly one attempt, the parent
//! succeeded and the reducer saw every result.

use std::time::Duration;

use anyhow::Context as _;
use chime_e2e::Scheduler;
use chime_protocol::wire::TaskKind;
use chime_worker::{CancellationToken, JobContext, JobError, TaskError};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::report::{Report, Row, summary};
use crate::sandbox::{
    Sandbox, Services, WorkerTask, poll, start_in_process, stop_in_process, within,
};
use crate::stats::Summary;

/// End-to-end tasks per second a fire must reach (issue 15).
const TARGET_TASKS_PER_S: f64 = 3_000.0;

/// The job kinds a run of the scenario fires, in order.
const KINDS: [(&str, &str); 2] = [("fanout", "sharded"), ("fanout-mr", "map_reduce")];

/// Parameters of the fanout scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Tasks per fire: the sharded job's shards, the map/reduce root's sub-tasks.
    pub shards: usize,
    /// Fires of each kind, one after the other.
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
    /// `sharded` or `map_reduce`.
    pub kind: &'static str,
    /// The parent run.
    pub run_id: i64,
    /// Its final state.
    pub state: String,
    /// Tasks created (for map/reduce: the root, the sub-tasks and the reduce task).
    pub tasks: i64,
    /// Tasks that ended `succeeded`.
    pub succeeded: i64,
    /// Tasks with more than one attempt (a task run twice would show here).
    pub rerun: i64,
    /// Results the reducer read (map/reduce only): the root's and every sub-task's.
    pub reduced: Option<i64>,
    /// Parent created → last task published, ms.
    pub published_ms: f64,
    /// Parent created → last task started (the reduce task aside), ms.
    pub started_ms: f64,
    /// Parent created → parent ended, ms.
    pub ended_ms: f64,
}

impl Fire {
    /// Tasks per second over the whole fire.
    fn rate(&self) -> f64 {
        self.tasks as f64 / (self.ended_ms / 1000.0)
    }

    /// Tasks the fire should have: N shards, or N sub-tasks with the root and the reduce.
    fn expected(&self, n: i64) -> i64 {
        if self.kind == "map_reduce" { n + 2 } else { n }
    }

    /// Every task succeeded once, and a reducer saw the root's and every sub-task's result.
    fn whole(&self, n: i64) -> bool {
        let expected = self.expected(n);
        self.state == "succeeded"
            && self.tasks == expected
            && self.succeeded == expected
            && self.rerun == 0
            && (self.kind != "map_reduce" || self.reduced == Some(n + 1))
    }
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
    let specs = KINDS
        .iter()
        .map(|(name, kind)| {
            let mut spec = json!({"name": name, "group": group, "kind": kind});
            if *kind == "sharded" {
                spec["shards"] = json!(params.shards);
            }
            serde_json::from_value::<chime_scheduler::job::JobSpec>(spec)
                .with_context(|| format!("the {kind} fanout job is not valid"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let scheduler = Scheduler::start(sandbox.service_config("bench-fanout"), specs);
    let (stop, workers) = start_workers(sandbox, &group, params)?;
    sandbox
        .wait_for_consumers(&group, u32::try_from(params.workers).unwrap_or(u32::MAX))
        .await?;
    for (name, _) in KINDS {
        poll(Duration::from_secs(60), "the jobs to be stored", || async {
            Ok(sandbox.store.job(name).await?.map(|_| ()))
        })
        .await?;
    }

    let mut fires = Vec::with_capacity(params.fires * KINDS.len());
    for (name, kind) in KINDS {
        for n in 0..params.fires {
            let params = json!({"items": params.shards});
            let id = sandbox
                .store
                .trigger(name, Some(params), "chime-bench")
                .await?
                .with_context(|| format!("the {kind} fanout job is not stored"))?;
            let ended = poll(Duration::from_secs(600), "the fire to end", || async {
                let state: String =
                    sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
                        .bind(id)
                        .fetch_one(sandbox.store.pool())
                        .await?;
                Ok((!matches!(state.as_str(), "pending" | "queued" | "running")).then_some(()))
            })
            .await;
            if let Err(e) = ended {
                eprintln!("[fanout] {kind} fire {n}: {e:#}");
            }
            let fire = read_fire(sandbox, kind, id).await?;
            eprintln!(
                "[fanout] {kind} fire {n}: {} tasks, published in {:.0} ms, ended in {:.0} ms",
                fire.tasks, fire.published_ms, fire.ended_ms
            );
            fires.push(fire);
        }
    }
    stop_in_process(&stop, workers, scheduler).await?;
    Ok(report(params, &fires))
}

/// The scenario's workers: a no-op shard handler; a map/reduce handler whose root maps
/// `params.items` sub-tasks (numbers) in one call and whose sub-tasks do nothing; a reducer
/// that reads every result and stores how many it read.
fn start_workers(
    sandbox: &Sandbox,
    group: &str,
    params: &Params,
) -> anyhow::Result<(CancellationToken, Vec<WorkerTask>)> {
    start_in_process(
        sandbox,
        "fanout",
        group,
        params.workers,
        params.capacity,
        |builder| {
            builder
                .hold(params.hold)
                .handle("fanout", |_: JobContext, _: Value| async {
                    Ok::<(), JobError>(())
                })
                .handle("fanout-mr", |ctx: JobContext, params: Value| async move {
                    if ctx.task().map(|t| t.kind) == Some(TaskKind::Root) {
                        let items = params["items"].as_u64().unwrap_or(0);
                        ctx.map("items", 0..items)
                            .await
                            .map_err(TaskError::into_job_error)?;
                    }
                    Ok::<(), JobError>(())
                })
                .reducer("fanout-mr", |ctx: JobContext, _: Value| async move {
                    let results = ctx.results().await.map_err(TaskError::into_job_error)?;
                    ctx.set_output(&json!({"results": results.len()}))
                        .await
                        .map_err(TaskError::into_job_error)?;
                    Ok::<(), JobError>(())
                })
        },
    )
}

async fn read_fire(sandbox: &Sandbox, kind: &'static str, id: i64) -> anyhow::Result<Fire> {
    let ms = |field: &str| {
        format!(
            "extract(epoch FROM (SELECT max(t.{field}) FROM chime_runs t
                                  WHERE t.parent_id = p.id
                                    AND t.task_kind IS DISTINCT FROM 'reduce') - p.created_at)
             * 1000"
        )
    };
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT p.state,
                (SELECT count(*) FROM chime_runs t WHERE t.parent_id = p.id) AS tasks,
                (SELECT count(*) FROM chime_runs t WHERE t.parent_id = p.id
                    AND t.state = 'succeeded') AS succeeded,
                (SELECT count(*) FROM chime_runs t WHERE t.parent_id = p.id AND t.attempt > 1)
                    AS rerun,
                (SELECT (t.output->>'results')::bigint FROM chime_runs t
                  WHERE t.parent_id = p.id AND t.task_kind = 'reduce') AS reduced,
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
        kind,
        run_id: id,
        state: row.get("state"),
        tasks: row.get("tasks"),
        succeeded: row.get("succeeded"),
        rerun: row.get("rerun"),
        reduced: row.get("reduced"),
        published_ms: get("published_ms"),
        started_ms: get("started_ms"),
        ended_ms: get("ended_ms"),
    })
}

fn report(params: &Params, fires: &[Fire]) -> Report {
    let n = i64::try_from(params.shards).unwrap_or(i64::MAX);
    let mut rows = Vec::new();
    let mut correct = !fires.is_empty();
    for (_, kind) in KINDS {
        let of_kind: Vec<&Fire> = fires.iter().filter(|f| f.kind == kind).collect();
        let whole = of_kind.iter().filter(|f| f.whole(n)).count();
        let rerun: i64 = of_kind.iter().map(|f| f.rerun).sum();
        correct &= whole == of_kind.len() && !of_kind.is_empty();
        let series = |f: fn(&Fire) -> f64| Summary::of(of_kind.iter().map(|x| f(x)).collect());
        let rates: Vec<String> = of_kind.iter().map(|f| format!("{:.0}", f.rate())).collect();
        let fast = of_kind.iter().all(|f| f.rate() >= TARGET_TASKS_PER_S);
        let what = if kind == "map_reduce" {
            "fires whose every task succeeded once, reduced over all"
        } else {
            "fires whose every shard succeeded once"
        };
        rows.extend([
            Row::judged(
                format!("{kind}: {what}"),
                format!("{whole} of {}", of_kind.len()),
                format!("{}", of_kind.len()),
                whole == of_kind.len(),
            ),
            Row::judged(
                format!("{kind}: tasks with a second attempt"),
                rerun.to_string(),
                "0",
                rerun == 0,
            ),
            Row::info(
                format!("{kind}: created → last task published"),
                summary(&series(|f| f.published_ms)),
            ),
            Row::info(
                format!("{kind}: created → last task started"),
                summary(&series(|f| f.started_ms)),
            ),
            Row::info(
                format!("{kind}: created → run ended"),
                summary(&series(|f| f.ended_ms)),
            ),
            Row::judged(
                format!("{kind}: tasks per second, each fire"),
                rates.join(", "),
                format!("≥ {TARGET_TASKS_PER_S:.0} each"),
                fast,
            ),
        ]);
    }
    Report {
        scenario: "fanout",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct,
        results: serde_json::to_value(fires).unwrap_or_default(),
        table: rows,
        notes: vec![format!(
            "{} fires of a sharded job of {} shards, then {} of a map/reduce job whose root \
             maps {} sub-tasks in one call and whose reducer reads every result, fired by \
             hand one after the other; {} Rust SDK workers in this process (capacity {}, \
             no-op handlers); the scheduler in this process; times from the database",
            params.fires,
            params.shards,
            params.fires,
            params.shards,
            params.workers,
            params.capacity
        )],
    }
}
