//! Job kinds against the real PostgreSQL and RabbitMQ (docs/protocol.md, "Job kinds and
//! tasks"): shards see their place, a broadcast task runs on its own worker only (forwarded
//! there when it reaches another one, parked when that worker's queue is gone), map creates
//! sub-tasks once per key, outputs are stored and a reducer reads them, and a cancel of the
//! parent run reaches a running task. Parents and tasks are made as the leader makes them
//! (`chime_expand_run` under a lease held by the test), and their triggers published as it
//! publishes them.

mod support;

use std::sync::{Arc, Mutex};

use chime_protocol::Trigger;
use chime_protocol::wire::{HEADER_ATTEMPT, HEADER_DEAD_REASON, Shard, Task, TaskKind};
use chime_test_kit::{done_if, wait_for};
use chime_worker::{JobContext, JobError, RunState, TaskError};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};
use sqlx::PgPool;
use support::{Env, WAIT, header, policy, snapshot_of};

/// A task as `chime_expand_run` returns it.
#[derive(Debug, Clone, sqlx::FromRow)]
struct TaskRow {
    id: i64,
    task_key: String,
    task_kind: String,
    shard_index: Option<i32>,
    shard_total: Option<i32>,
    shard_param: Option<Value>,
    target_worker: Option<String>,
    params: Value,
    map_step: Option<String>,
    map_depth: Option<i32>,
}

/// Stores job `job` of the test's group with `spec`, and a pending parent run of it with
/// `retry` as its retry policy snapshot; returns the parent's id.
async fn parent(env: &Env, job: &str, spec: Value, retry: &Value) -> i64 {
    sqlx::query("INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, $2, $3)")
        .bind(job)
        .bind(&env.group)
        .bind(&spec)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                 retry_policy)
         VALUES ($1, $2, now(), 'manual', '{\"n\": 1}', 'pending', $3) RETURNING id",
    )
    .bind(job)
    .bind(&env.group)
    .bind(retry)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

/// Expands `parent` as the leader does, under a lease the test holds.
async fn expand(env: &Env, parent: i64) -> Vec<TaskRow> {
    sqlx::query(
        "UPDATE chime_leader SET holder = 't', term = 1, expires_at = now() + interval '1 hour'",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    sqlx::query_as(
        "SELECT id, task_key, task_kind, shard_index, shard_total, shard_param, target_worker,
                params, map_step, map_depth
           FROM chime_expand_run('t', 1, $1)",
    )
    .bind(parent)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

/// The tasks of `parent` of kind `kind`, as they are now.
async fn tasks_of(env: &Env, parent: i64, kind: &str) -> Vec<TaskRow> {
    sqlx::query_as(
        "SELECT id, task_key, task_kind, shard_index, shard_total, shard_param, target_worker,
                params, map_step, map_depth
           FROM chime_runs WHERE parent_id = $1 AND task_kind = $2 ORDER BY id",
    )
    .bind(parent)
    .bind(kind)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

/// The trigger the leader publishes for task `t` of run `parent` of job `job`.
async fn task_trigger(env: &Env, job: &str, parent: i64, t: &TaskRow) -> Trigger {
    let mut trigger = env.trigger(t.id, job, t.params.clone()).await;
    let kind: TaskKind = serde_json::from_value(json!(t.task_kind)).unwrap();
    trigger.task = Some(Task {
        parent_run_id: parent,
        key: t.task_key.clone(),
        kind,
        shard: t.shard_index.map(|index| Shard {
            index: u32::try_from(index).unwrap(),
            total: u32::try_from(t.shard_total.unwrap()).unwrap(),
            param: t.shard_param.clone(),
        }),
        worker: t.target_worker.clone(),
        step: t.map_step.clone(),
        depth: t.map_depth.map(|d| u32::try_from(d).unwrap()),
    });
    trigger
}

/// Publishes `trigger` with routing key `key` of the group's exchange, confirmed and routed
/// (the run keeps the retry policy snapshot it has).
async fn publish_to(env: &Env, key: &str, trigger: &Trigger) {
    let mut headers = FieldTable::default();
    headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(trigger.attempt));
    let properties = lapin::BasicProperties::default()
        .with_content_type(chime_protocol::wire::CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_message_id(trigger.run_id.to_string().into())
        .with_headers(headers);
    chime_test_kit::publish_routed(
        &env.channel,
        &env.topology.exchange(),
        key,
        &trigger.to_body(),
        &properties,
    )
    .await;
}

async fn publish_work(env: &Env, trigger: &Trigger) {
    publish_to(env, chime_protocol::topology::WORK_KEY, trigger).await;
}

/// `(state, output)` of run `id`.
async fn state_and_output(env: &Env, id: i64) -> (String, Option<Value>) {
    sqlx::query_as("SELECT state, output FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// A registry row of a worker that is online (a long heartbeat interval) and handles `job`.
async fn register(env: &Env, worker: &str, job: &str) {
    sqlx::query(
        "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs,
                                    heartbeat_interval_ms, heartbeat_at)
         VALUES ($1, $2, 'h', 1, ARRAY[$3], 600000, now())",
    )
    .bind(worker)
    .bind(&env.group)
    .bind(job)
    .execute(&env.pool)
    .await
    .unwrap();
}

type Seen<T> = Arc<Mutex<Vec<T>>>;

fn seen<T>() -> Seen<T> {
    Arc::new(Mutex::new(Vec::new()))
}

/// Each shard's handler sees its index, the total, its parameter and its parent, and stores
/// an output; the parent run ends `succeeded` with its three tasks.
#[sqlx::test(migrations = "../migrations")]
async fn sharded_tasks_see_their_shard_and_store_their_output(pool: PgPool) {
    let env = Env::new(pool).await;
    let spec = json!({"kind": "sharded", "shards": 3, "shard_params": ["eu", "us", "asia"]});
    let parent = parent(&env, "count", spec, &snapshot_of(None)).await;
    let shards: Seen<(Option<Shard>, Option<i64>, Option<String>)> = seen();
    let record = shards.clone();
    let worker = env
        .worker()
        .handle("count", move |ctx: JobContext, _: Value| {
            let record = record.clone();
            async move {
                let shard = ctx.shard().cloned();
                record.lock().unwrap().push((
                    shard.clone(),
                    ctx.parent_run_id(),
                    ctx.task().map(|t| t.key.clone()),
                ));
                let index = shard.map(|s| s.index);
                ctx.set_output(&json!({"index": index})).await?;
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let tasks = expand(&env, parent).await;
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    for t in &tasks {
        publish_work(&env, &task_trigger(&env, "count", parent, t).await).await;
    }
    env.run_in_state(parent, "succeeded").await;
    let mut seen = shards.lock().unwrap().clone();
    seen.sort_by_key(|(s, ..)| s.as_ref().map(|s| s.index));
    let expected: Vec<_> = ["eu", "us", "asia"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                Some(Shard {
                    index: u32::try_from(i).unwrap(),
                    total: 3,
                    param: Some(json!(p)),
                }),
                Some(parent),
                Some(format!("shard/{i}")),
            )
        })
        .collect();
    assert_eq!(seen, expected);
    for t in &tasks {
        let (state, output) = state_and_output(&env, t.id).await;
        assert_eq!(state, "succeeded");
        assert_eq!(output, Some(json!({"index": t.shard_index})));
    }
    running.stop().await;
    env.cleanup().await;
}

/// A broadcast task published to its worker's own queue runs there; one that reaches another
/// worker through the work queue (as a retry does, after its delay tier) is forwarded to its
/// worker's queue, never run by the worker that received it, and run by its own worker once
/// it starts; one for a worker whose queue does not exist is parked with the reason and its
/// run ends `dead`.
#[sqlx::test(migrations = "../migrations")]
async fn a_broadcast_task_runs_on_its_own_worker_only(pool: PgPool) {
    let env = Env::new(pool).await;
    let a = chime_test_kit::unique("wa");
    let b = chime_test_kit::unique("wb");
    let gone = chime_test_kit::unique("wc");
    env.delete_worker_queue_at_cleanup(&a);
    env.delete_worker_queue_at_cleanup(&b);
    let ran: Seen<(String, String)> = seen();
    let worker = |id: &str| {
        let (ran, me) = (ran.clone(), id.to_owned());
        env.worker()
            .worker_id(id)
            .handle("hello", move |ctx: JobContext, _: Value| {
                let (ran, me) = (ran.clone(), me.clone());
                async move {
                    let task = ctx.task().and_then(|t| t.worker.clone());
                    ran.lock().unwrap().push((me, task.unwrap_or_default()));
                    Ok(())
                }
            })
            .build()
            .unwrap()
    };
    let running_a = env.start(worker(&a));
    // B and the gone worker are online in the registry; B's queue exists (as if B had run
    // before), the gone worker's does not.
    register(&env, &b, "hello").await;
    register(&env, &gone, "hello").await;
    env.topology
        .declare_worker_queue(&env.channel, &b)
        .await
        .unwrap();
    let online = |id: String| {
        let env = &env;
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM chime_workers
                  WHERE id = $1 AND chime_worker_online(stopped_at, heartbeat_at,
                                                        heartbeat_interval_ms)",
            )
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
            done_if(n, |n| *n == 1)
        }
    };
    wait_for(WAIT, "worker A to be online", || online(a.clone())).await;

    let parent = parent(
        &env,
        "hello",
        json!({"kind": "broadcast"}),
        &snapshot_of(None),
    )
    .await;
    let tasks = expand(&env, parent).await;
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    let task_for = |w: &str| tasks.iter().find(|t| t.target_worker.as_deref() == Some(w));
    let (ta, tb, tc) = (
        task_for(&a).unwrap(),
        task_for(&b).unwrap(),
        task_for(&gone).unwrap(),
    );
    let trigger_a = task_trigger(&env, "hello", parent, ta).await;
    publish_to(&env, &chime_protocol::Topology::worker_key(&a), &trigger_a).await;
    publish_work(&env, &task_trigger(&env, "hello", parent, tb).await).await;
    publish_work(&env, &task_trigger(&env, "hello", parent, tc).await).await;

    env.run_in_state(ta.id, "succeeded").await;
    // The gone worker's task: parked by A, its run dead with the reason.
    let dead = env.run_in_state(tc.id, "dead").await;
    assert!(
        dead.reason
            .as_deref()
            .unwrap_or_default()
            .contains("its queue"),
        "{dead:?}"
    );
    let parked = wait_for(WAIT, "the gone worker's task to be parked", || async {
        env.take_parked().await
    })
    .await;
    let reason = header(&parked, HEADER_DEAD_REASON).unwrap();
    assert!(
        reason.starts_with(&format!("broadcast task for worker `{gone}`: its queue")),
        "{reason}"
    );
    // B's task waits in B's queue, forwarded by A, which did not claim it.
    wait_for(WAIT, "B's task to be forwarded to B's queue", || async {
        done_if(
            env.queue_state(&env.topology.worker_queue(&b)).await.0,
            |n| *n == 1,
        )
    })
    .await;
    assert_eq!(env.run(tb.id).await.state, "queued");

    let running_b = env.start(worker(&b));
    env.run_in_state(tb.id, "succeeded").await;
    let mut ran = ran.lock().unwrap().clone();
    ran.sort();
    let mut expected = vec![(a.clone(), a.clone()), (b.clone(), b.clone())];
    expected.sort();
    assert_eq!(ran, expected, "each task ran on its own worker, once");
    env.run_in_state(parent, "dead").await;

    running_a.stop().await;
    running_b.stop().await;
    // The queues stay for the workers' restarts under their ids.
    for id in [&a, &b] {
        assert!(env.queue_exists(&env.topology.worker_queue(id)).await);
    }
    env.cleanup().await;
}

/// The root task maps three items; its retried attempt maps them again and creates nothing
/// new (the same keys), and a bad step is refused naming the field. The sub-tasks are rows of
/// the run with their keys, step, depth and item.
#[sqlx::test(migrations = "../migrations")]
async fn map_creates_sub_tasks_once_across_a_retried_attempt(pool: PgPool) {
    let env = Env::new(pool).await;
    let retry = policy(2, 100, 1.0, 100);
    let parent = parent(
        &env,
        "split",
        json!({"kind": "map_reduce"}),
        &snapshot_of(Some(&retry)),
    )
    .await;
    let created: Seen<(u32, u64, String)> = seen();
    let record = created.clone();
    let worker = env
        .worker()
        .handle("split", move |ctx: JobContext, _: Value| {
            let record = record.clone();
            async move {
                let n = ctx.map("part", [json!({"i": 0}), json!({"i": 1}), json!({"i": 2})]);
                let n = n.await?;
                let bad = match ctx.map("no spaces", [1]).await {
                    Err(TaskError::Invalid { field, .. }) => field,
                    other => format!("{other:?}"),
                };
                record.lock().unwrap().push((ctx.attempt(), n, bad));
                if ctx.attempt() == 1 {
                    return Err(JobError::retry("once more"));
                }
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let tasks = expand(&env, parent).await;
    let root = tasks.iter().find(|t| t.task_key == "root").unwrap();
    assert_eq!(
        tasks.len(),
        1,
        "the reduce task is not published: {tasks:?}"
    );
    let mut trigger = task_trigger(&env, "split", parent, root).await;
    trigger.retry = Some(retry);
    publish_work(&env, &trigger).await;
    env.run_in_state(root.id, "succeeded").await;
    assert_eq!(
        *created.lock().unwrap(),
        [(1, 3, "step".to_owned()), (2, 0, "step".to_owned())]
    );
    let mapped = tasks_of(&env, parent, "map").await;
    let keys: Vec<_> = mapped.iter().map(|t| t.task_key.clone()).collect();
    let expected: Vec<_> = (0..3).map(|n| format!("{}/part/0/{n}", root.id)).collect();
    assert_eq!(keys, expected);
    for (n, t) in mapped.iter().enumerate() {
        assert_eq!(t.params, json!({"i": n}));
        assert_eq!(
            (t.map_step.as_deref(), t.map_depth),
            (Some("part"), Some(1))
        );
    }
    let total: i32 = sqlx::query_scalar("SELECT tasks_total FROM chime_runs WHERE id = $1")
        .bind(parent)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(total, 5, "root, reduce and three mapped");
    running.stop().await;
    env.cleanup().await;
}

/// Root and mapped tasks store outputs; the reducer (registered with `.reducer`) reads every
/// other task's result and stores the sum; the run ends `succeeded`. A reduce task on a worker
/// without the reducer fails, naming the fix.
#[sqlx::test(migrations = "../migrations")]
async fn a_reducer_reads_every_tasks_output(pool: PgPool) {
    let env = Env::new(pool).await;
    let parent = parent(
        &env,
        "sum",
        json!({"kind": "map_reduce"}),
        &snapshot_of(None),
    )
    .await;
    let reduced: Seen<Vec<(String, RunState, Option<Value>)>> = seen();
    let record = reduced.clone();
    let worker = env
        .worker()
        .handle("sum", |ctx: JobContext, item: Value| async move {
            match ctx.task().map(|t| t.kind) {
                Some(chime_worker::TaskKind::Root) => {
                    ctx.map("add", [1, 2, 3]).await?;
                    ctx.set_output("root").await?;
                }
                _ => {
                    let n = item.as_i64().unwrap_or_default();
                    ctx.set_output(&(n * 10)).await?;
                }
            }
            Ok(())
        })
        .reducer("sum", move |ctx: JobContext, _: Value| {
            let record = record.clone();
            async move {
                let results = ctx.results().await?;
                let first = ctx.results_page(0, 1).await?;
                assert_eq!(first.len(), 1);
                assert_eq!(first[0].id, results[0].id);
                let sum: i64 = results
                    .iter()
                    .filter_map(|r| r.output.as_ref()?.as_i64())
                    .sum();
                record.lock().unwrap().push(
                    results
                        .into_iter()
                        .map(|r| (r.key, r.state, r.output))
                        .collect(),
                );
                ctx.set_output(&sum).await?;
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let root = expand(&env, parent).await.remove(0);
    publish_work(&env, &task_trigger(&env, "sum", parent, &root).await).await;
    env.run_in_state(root.id, "succeeded").await;
    let mapped = tasks_of(&env, parent, "map").await;
    assert_eq!(mapped.len(), 3);
    for t in &mapped {
        publish_work(&env, &task_trigger(&env, "sum", parent, t).await).await;
    }
    for t in &mapped {
        env.run_in_state(t.id, "succeeded").await;
    }
    let reduce = tasks_of(&env, parent, "reduce").await.remove(0);
    publish_work(&env, &task_trigger(&env, "sum", parent, &reduce).await).await;
    env.run_in_state(parent, "succeeded").await;
    let mut expected = vec![("root".to_owned(), RunState::Succeeded, Some(json!("root")))];
    for (n, t) in mapped.iter().enumerate() {
        let output = json!((n as i64 + 1) * 10);
        expected.push((t.task_key.clone(), RunState::Succeeded, Some(output)));
    }
    assert_eq!(*reduced.lock().unwrap(), [expected]);
    assert_eq!(state_and_output(&env, reduce.id).await.1, Some(json!(60)));
    let jobs: Vec<String> = sqlx::query_scalar("SELECT jobs FROM chime_workers")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(jobs, ["sum"]);
    running.stop().await;

    // A worker with the job's handler but no reducer fails a reduce task, not retried.
    let other = parent_again(&env, "sum").await;
    let worker = env
        .worker()
        .handle("sum", |_: JobContext, _: Value| async { Ok(()) })
        .build()
        .unwrap();
    let running = env.start(worker);
    let tasks = expand(&env, other).await;
    assert_eq!(tasks.len(), 1);
    let reduce = tasks_of(&env, other, "reduce").await.remove(0);
    publish_work(&env, &task_trigger(&env, "sum", other, &reduce).await).await;
    let failed = env.run_in_state(reduce.id, "failed").await;
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("no reducer") && error.contains(".reducer(\"sum\", reducer)"),
        "{error}"
    );
    running.stop().await;
    env.cleanup().await;
}

/// Another pending parent run of stored job `job`.
async fn parent_again(env: &Env, job: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                 retry_policy)
         VALUES ($1, $2, now() + interval '1 second', 'manual', 'null', 'pending',
                 '{\"max_attempts\": 1}')
         RETURNING id",
    )
    .bind(job)
    .bind(&env.group)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

/// An operator's cancel names the parent run; the worker cancels its running task of that run,
/// which ends `cancelled`, and so does the run.
#[sqlx::test(migrations = "../migrations")]
async fn a_cancel_of_the_parent_cancels_a_running_task(pool: PgPool) {
    let env = Env::new(pool).await;
    let parent = parent(
        &env,
        "wait",
        json!({"kind": "sharded", "shards": 1}),
        &snapshot_of(None),
    )
    .await;
    let worker = env
        .worker()
        .handle("wait", |ctx: JobContext, _: Value| async move {
            ctx.cancelled().await;
            Err(JobError::cancel("stopped by the cancel"))
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let task = expand(&env, parent).await.remove(0);
    publish_work(&env, &task_trigger(&env, "wait", parent, &task).await).await;
    env.run_in_state(task.id, "running").await;
    env.cancel(parent).await;
    let cancelled = env.run_in_state(task.id, "cancelled").await;
    let error = cancelled.error.unwrap_or_default();
    assert!(
        error.ends_with("handler returned: stopped by the cancel"),
        "{error}"
    );
    env.run_in_state(parent, "cancelled").await;
    running.stop().await;
    env.cleanup().await;
}
