//! Job kinds end to end, with a real scheduler, real workers, PostgreSQL and RabbitMQ: a sharded
//! fire runs each shard once with its parameter, a broadcast runs once on each online worker and
//! nowhere else, a map/reduce run maps a thousand sub-tasks and reduces their outputs once, the
//! failed shard of a finished run reruns alone in the same run, and a leader killed while it
//! expands fires runs no task twice. The workers here run in the test's process; the same kinds
//! with worker processes SIGKILLed mid-task are in `kinds_processes.rs`, which shares the
//! helpers `parent`, `ended_within`, `tasks` and `online`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chime_e2e::{Events, Scheduler, Setup, wait_for};
use chime_worker::{CancellationToken, JobContext, JobError, Worker, WorkerBuilder};
use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};

use crate::common::job;
use crate::failures::support::trigger;

/// Longest a test waits for a run to end.
const PATIENCE: Duration = Duration::from_secs(60);

/// A task as a handler saw it.
#[derive(Debug, Clone)]
struct Seen {
    run_id: i64,
    worker: String,
    shard: Option<(u32, u32, Option<Value>)>,
}

/// A worker of the test's group under a fixed id, with what `configure` registers (also the
/// worker of `children.rs`).
pub(crate) struct KindWorker {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>,
}

impl KindWorker {
    pub(crate) fn start(
        t: &Setup,
        id: &str,
        configure: impl FnOnce(WorkerBuilder) -> WorkerBuilder,
    ) -> Self {
        t.guard.add_worker_queue(&t.group, id);
        let builder = Worker::builder(&t.group)
            .database_url(&t.database_url)
            .amqp_url(&t.amqp_url)
            .prefix(&t.prefix)
            .worker_id(id)
            .capacity(16);
        let worker = configure(builder).build().expect("worker builds");
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone()));
        KindWorker { stop, task }
    }

    /// A worker whose handler for `job` records every task it runs and succeeds.
    fn recording(t: &Setup, id: &str, job: &str, seen: &Events<Seen>) -> Self {
        let (seen, me) = (seen.clone(), id.to_owned());
        Self::start(t, id, |b| {
            b.handle(job, move |ctx: JobContext, _: Value| {
                let (seen, me) = (seen.clone(), me.clone());
                async move {
                    seen.record(Seen {
                        run_id: ctx.run_id(),
                        worker: me,
                        shard: ctx.shard().map(|s| (s.index, s.total, s.param.clone())),
                    });
                    Ok::<(), JobError>(())
                }
            })
        })
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("worker task")
            .expect("worker ran cleanly");
    }
}

/// The parent's state, reason and counters (total, ended, failed).
pub(crate) async fn parent(pool: &PgPool, id: i64) -> (String, Option<String>, (i32, i32, i32)) {
    let r = sqlx::query(
        "SELECT state, reason, tasks_total, tasks_ended, tasks_failed FROM chime_runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("read the parent");
    (
        r.get("state"),
        r.get("reason"),
        (
            r.get("tasks_total"),
            r.get("tasks_ended"),
            r.get("tasks_failed"),
        ),
    )
}

/// Waits until run `id` has ended; its state.
async fn ended(pool: &PgPool, id: i64) -> String {
    ended_within(pool, id, PATIENCE).await
}

/// Waits up to `patience` until run `id` has ended; its state.
pub(crate) async fn ended_within(pool: &PgPool, id: i64, patience: Duration) -> String {
    wait_for(patience, &format!("run {id} to end"), || async {
        let (state, _, _) = parent(pool, id).await;
        (!matches!(
            state.as_str(),
            "pending" | "queued" | "running" | "retrying"
        ))
        .then_some(state)
    })
    .await
}

/// Tasks of `parent`: id → (key, state, worker).
pub(crate) async fn tasks(
    pool: &PgPool,
    parent: i64,
) -> BTreeMap<i64, (String, String, Option<String>)> {
    sqlx::query("SELECT id, task_key, state, worker_id FROM chime_runs WHERE parent_id = $1")
        .bind(parent)
        .fetch_all(pool)
        .await
        .expect("read tasks")
        .into_iter()
        .map(|r| {
            (
                r.get("id"),
                (r.get("task_key"), r.get("state"), r.get("worker_id")),
            )
        })
        .collect()
}

/// Waits until `n` workers of the group are registered and online.
pub(crate) async fn online(pool: &PgPool, n: i64) {
    wait_for(PATIENCE, &format!("{n} workers online"), || async {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM chime_workers
              WHERE chime_worker_online(stopped_at, heartbeat_at, heartbeat_interval_ms)",
        )
        .fetch_one(pool)
        .await
        .expect("count workers");
        (count >= n).then_some(())
    })
    .await;
}

fn counts(seen: &Events<Seen>) -> HashMap<i64, usize> {
    seen.with(|all| {
        let mut counts = HashMap::new();
        for s in all {
            *counts.entry(s.run_id).or_default() += 1;
        }
        counts
    })
}

#[sqlx::test(migrations = "../migrations")]
async fn a_sharded_fire_runs_each_shard_once_with_its_parameter(pool: PgPool) {
    let t = Setup::new(&pool);
    let spec = job(
        json!({"name": "cities", "group": t.group, "kind": "sharded", "shards": 4,
                          "shard_params": ["Beijing", "Shanghai", null, "Guangzhou"]}),
    );
    let scheduler = Scheduler::on(&t, "s1", vec![spec]);
    let seen = Events::new();
    let a = KindWorker::recording(&t, "shard-a", "cities", &seen);
    let b = KindWorker::recording(&t, "shard-b", "cities", &seen);

    let id = trigger(&pool, "cities", json!({"day": "2026-12-01"})).await;
    assert_eq!(ended(&pool, id).await, "succeeded");
    let (_, reason, counters) = parent(&pool, id).await;
    assert_eq!((reason, counters), (None, (4, 4, 0)));
    let tasks = tasks(&pool, id).await;
    assert_eq!(tasks.len(), 4);
    assert!(
        counts(&seen)
            .iter()
            .all(|(run, n)| tasks.contains_key(run) && *n == 1)
    );
    let mut shards: Vec<_> = seen.all().into_iter().filter_map(|s| s.shard).collect();
    shards.sort_by_key(|s| s.0);
    assert_eq!(
        shards,
        [
            (0, 4, Some(json!("Beijing"))),
            (1, 4, Some(json!("Shanghai"))),
            (2, 4, None),
            (3, 4, Some(json!("Guangzhou"))),
        ]
    );
    a.stop().await;
    b.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_broadcast_runs_once_on_each_online_worker_and_nowhere_else(pool: PgPool) {
    let t = Setup::new(&pool);
    let spec = job(
        json!({"name": "purge-cache", "group": t.group, "kind": "broadcast",
                          "min_workers": 3}),
    );
    let scheduler = Scheduler::on(&t, "s1", vec![spec]);
    let seen = Events::new();
    let workers: Vec<_> = ["node-1", "node-2", "node-3"]
        .into_iter()
        .map(|id| KindWorker::recording(&t, id, "purge-cache", &seen))
        .collect();
    online(&pool, 3).await;

    let id = trigger(&pool, "purge-cache", json!({})).await;
    assert_eq!(ended(&pool, id).await, "succeeded");
    let tasks = tasks(&pool, id).await;
    let mut ran: Vec<(String, String)> = tasks
        .values()
        .map(|(key, state, worker)| {
            assert_eq!(state, "succeeded");
            (key.clone(), worker.clone().expect("a worker ran it"))
        })
        .collect();
    ran.sort();
    assert_eq!(
        ran,
        [
            ("worker/node-1".to_owned(), "node-1".to_owned()),
            ("worker/node-2".to_owned(), "node-2".to_owned()),
            ("worker/node-3".to_owned(), "node-3".to_owned()),
        ],
        "each task ran on the worker it was for"
    );
    let mut by_worker: Vec<String> = seen.all().into_iter().map(|s| s.worker).collect();
    by_worker.sort();
    assert_eq!(
        by_worker,
        ["node-1", "node-2", "node-3"],
        "once on each worker"
    );

    // One worker stops for good: the next fire needs three and fails, saying why.
    let mut workers = workers;
    workers.pop().expect("three").stop().await;
    let id = trigger(&pool, "purge-cache", json!({})).await;
    assert_eq!(ended(&pool, id).await, "failed");
    let (_, reason, _) = parent(&pool, id).await;
    assert!(
        reason.as_deref().is_some_and(
            |r| r.starts_with("2 workers of group") && r.ends_with("3 needed (min_workers)")
        ),
        "{reason:?}"
    );
    for w in workers {
        w.stop().await;
    }
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn map_reduce_maps_a_thousand_sub_tasks_and_reduces_their_outputs_once(pool: PgPool) {
    const ITEMS: i64 = 1_000;
    let t = Setup::new(&pool);
    let spec = job(json!({"name": "totals", "group": t.group, "kind": "map_reduce"}));
    let scheduler = Scheduler::on(&t, "s1", vec![spec]);
    let reductions = Events::new();
    let seen = reductions.clone();
    let worker = KindWorker::start(&t, "mr-1", move |b| {
        b.handle("totals", |ctx: JobContext, params: Value| async move {
            match ctx.task().map(|task| task.kind) {
                Some(chime_protocol::wire::TaskKind::Root) => {
                    let made = ctx
                        .map("items", 0..ITEMS)
                        .await
                        .map_err(chime_worker::TaskError::into_job_error)?;
                    assert_eq!(made, 1_000);
                }
                _ => {
                    let n = params.as_i64().unwrap_or(0);
                    ctx.set_output(&json!({"double": n * 2}))
                        .await
                        .map_err(chime_worker::TaskError::into_job_error)?;
                }
            }
            Ok::<(), JobError>(())
        })
        .reducer("totals", move |ctx: JobContext, _: Value| {
            let seen = seen.clone();
            async move {
                let results = ctx
                    .results()
                    .await
                    .map_err(chime_worker::TaskError::into_job_error)?;
                let sum: i64 = results
                    .iter()
                    .filter_map(|r| r.output.as_ref()?.get("double")?.as_i64())
                    .sum();
                seen.record((results.len(), sum));
                ctx.set_output(&json!({"sum": sum}))
                    .await
                    .map_err(chime_worker::TaskError::into_job_error)?;
                Ok::<(), JobError>(())
            }
        })
    });

    let id = trigger(&pool, "totals", json!({})).await;
    assert_eq!(ended(&pool, id).await, "succeeded");
    let expected: i64 = (0..ITEMS).map(|n| n * 2).sum();
    assert_eq!(
        reductions.all(),
        [(1_001, expected)],
        "one reduction over the root and every item"
    );
    let (_, _, counters) = parent(&pool, id).await;
    assert_eq!(counters, (1_002, 1_002, 0));
    let output: Value = sqlx::query_scalar(
        "SELECT output FROM chime_runs WHERE parent_id = $1 AND task_key = 'reduce'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .expect("the reduce task's output");
    assert_eq!(output, json!({"sum": expected}));
    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_failed_shard_of_a_finished_run_reruns_alone_in_the_same_run(pool: PgPool) {
    let t = Setup::new(&pool);
    let spec = job(
        json!({"name": "flaky", "group": t.group, "kind": "sharded", "shards": 3,
                          "retry": {"max_attempts": 1}}),
    );
    let scheduler = Scheduler::on(&t, "s1", vec![spec]);
    let seen = Events::new();
    let recorded = seen.clone();
    let worker = KindWorker::start(&t, "flaky-1", move |b| {
        b.handle("flaky", move |ctx: JobContext, _: Value| {
            let seen = recorded.clone();
            async move {
                let index = ctx.shard().map(|s| s.index);
                seen.record((ctx.run_id(), ctx.attempt()));
                if index == Some(2) && ctx.attempt() == 1 {
                    return Err(JobError::fail("shard 2 fails its first attempt"));
                }
                Ok(())
            }
        })
    });

    let id = trigger(&pool, "flaky", json!({})).await;
    assert_eq!(ended(&pool, id).await, "failed");
    let rerun: i32 = sqlx::query_scalar("SELECT chime_retry_failed($1, 'cli:test')")
        .bind(id)
        .fetch_one(&pool)
        .await
        .expect("retry the failed tasks");
    assert_eq!(rerun, 1);
    assert_eq!(ended(&pool, id).await, "succeeded");
    let all = seen.all();
    assert_eq!(
        all.len(),
        4,
        "three shards, then the failed one again: {all:?}"
    );
    let again: Vec<_> = all.iter().filter(|(_, attempt)| *attempt == 2).collect();
    assert_eq!(again.len(), 1);
    let (_, state, _) = tasks(&pool, id)
        .await
        .remove(&again[0].0)
        .expect("a task of the run");
    assert_eq!(state, "succeeded");
    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_leader_killed_while_it_expands_fires_runs_no_task_twice(pool: PgPool) {
    let t = Setup::new(&pool);
    let spec = job(
        json!({"name": "wide", "group": t.group, "kind": "sharded", "shards": 50,
                          "every": "1s"}),
    );
    let seen = Events::new();
    let worker = KindWorker::recording(&t, "wide-1", "wide", &seen);
    let first = Scheduler::on(&t, "s1", vec![spec.clone()]);
    let second = Scheduler::on(&t, "s2", vec![spec]);
    // Kill whichever leads once three fires have expanded, then let the other take over.
    wait_for(PATIENCE, "three fires expanded", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM chime_runs WHERE parent_id IS NULL AND tasks_total = 50",
        )
        .fetch_one(&pool)
        .await
        .expect("count parents");
        (n >= 3).then_some(())
    })
    .await;
    let (holder, _) = crate::common::leader(&pool).await.expect("a leader");
    let survivor = if holder == "s1" {
        first.kill().await;
        second
    } else {
        second.kill().await;
        first
    };
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE parent_id IS NULL")
        .fetch_one(&pool)
        .await
        .expect("count parents");
    wait_for(PATIENCE, "three more fires after the takeover", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM chime_runs WHERE parent_id IS NULL AND state = 'succeeded'",
        )
        .fetch_one(&pool)
        .await
        .expect("count parents");
        (n >= before + 3).then_some(())
    })
    .await;
    survivor.stop().await.expect("graceful stop");
    // Every published task runs exactly once; every parent has 50 tasks with distinct shards.
    let published: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM chime_runs WHERE parent_id IS NOT NULL AND published_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .expect("published tasks");
    let counts = wait_for(PATIENCE, "every published task run", || {
        let counts = counts(&seen);
        let published = published.clone();
        async move {
            published
                .iter()
                .all(|id| counts.contains_key(id))
                .then_some(counts)
        }
    })
    .await;
    assert!(
        counts.values().all(|&n| n == 1),
        "a task ran twice: {counts:?}"
    );
    let shapes: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT count(*), count(DISTINCT shard_index) FROM chime_runs
          WHERE parent_id IS NOT NULL GROUP BY parent_id",
    )
    .fetch_all(&pool)
    .await
    .expect("tasks per parent");
    assert!(shapes.iter().all(|&s| s == (50, 50)), "{shapes:?}");
    worker.stop().await;
    t.finish().await;
}
