//! Job kinds against a real database: a parent expands once under the fence into its tasks,
//! the outbox reads tasks as the leader publishes them (a reduce task last), the aggregate
//! state follows the tasks, a broadcast task of a lost worker ends `lost`, a parent's cancel
//! reaches its tasks, and `chime_retry_failed` reruns only the failed tasks of the same run.

use chime_protocol::wire::TaskKind;
use chrono::{Duration as Span, Utc};
use serde_json::json;
use sqlx::PgPool;

use super::{Confirmed, Fence, OutboxRun, Store};
use crate::job::ConcurrencyPolicy;

async fn job(pool: &PgPool, name: &str, spec: serde_json::Value) {
    super::insert_test_job(pool, name, spec).await;
}

/// A pending parent of `job` (group `g`), scheduled now.
async fn parent(pool: &PgPool, job: &str) -> OutboxRun {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
         VALUES ($1, 'g', now(), 'schedule', 'pending') RETURNING id",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .unwrap();
    OutboxRun {
        id,
        job: job.into(),
        group: "g".into(),
        scheduled_at: Utc::now(),
        attempt: 1,
        params: json!({"day": "2026-12-01"}),
        timeout: None,
        retry: None,
        concurrency: ConcurrencyPolicy::Allow,
        task: None,
        fan_out: true,
        workflow: false,
    }
}

/// Worker `id` of group `g` handling `jobs`, online (or not).
async fn worker(pool: &PgPool, id: &str, jobs: &[&str], online: bool) {
    sqlx::query(
        "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, heartbeat_at)
         VALUES ($1, 'g', 'h', 4, $2, CASE WHEN $3 THEN now() ELSE now() - interval '1 hour' END)",
    )
    .bind(id)
    .bind(jobs)
    .bind(online)
    .execute(pool)
    .await
    .unwrap();
}

async fn state(pool: &PgPool, id: i64) -> (String, Option<String>) {
    sqlx::query_as("SELECT state, reason FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn set_states(pool: &PgPool, ids: &[i64], state: &str) {
    sqlx::query("UPDATE chime_runs SET state = $2, attempt = attempt + 1 WHERE id = ANY ($1)")
        .bind(ids)
        .bind(state)
        .execute(pool)
        .await
        .unwrap();
}

fn confirmed(tasks: &[OutboxRun]) -> Vec<Confirmed> {
    tasks
        .iter()
        .map(|t| Confirmed {
            id: t.id,
            confirmed_at: Utc::now(),
        })
        .collect()
}

/// Expansion makes each shard once, carrying its index, total and parameter; until the
/// tasks are recorded published, a second expansion (the next leader's) returns the same
/// tasks and creates none; after it, nothing is left to publish. The outbox never reads the
/// queued tasks, and a deposed term expands nothing.
#[sqlx::test(migrations = "../migrations")]
async fn a_sharded_parent_expands_once_into_its_shards(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(
        &pool,
        "s",
        json!({"kind": "sharded", "shards": 3, "shard_params": ["Beijing", null, "Guangzhou"]}),
    )
    .await;
    let fence = store.lead_for_test("me").await;
    let p = parent(&pool, "s").await;
    let deposed = Fence {
        holder: "me".into(),
        term: fence.term - 1,
    };
    assert_eq!(store.expand_run(&deposed, &p).await.unwrap(), None);

    let tasks = store.expand_run(&fence, &p).await.unwrap().unwrap();
    let shards: Vec<_> = tasks
        .iter()
        .map(|t| {
            let task = t.task.as_ref().unwrap();
            assert_eq!(task.parent_run_id, p.id);
            assert_eq!(task.kind, TaskKind::Shard);
            assert_eq!(t.attempt, 1);
            let shard = task.shard.as_ref().unwrap();
            (
                task.key.clone(),
                shard.index,
                shard.total,
                shard.param.clone(),
            )
        })
        .collect();
    assert_eq!(
        shards,
        [
            ("shard/0".to_owned(), 0, 3, Some(json!("Beijing"))),
            ("shard/1".to_owned(), 1, 3, None),
            ("shard/2".to_owned(), 2, 3, Some(json!("Guangzhou"))),
        ]
    );
    let horizon = Utc::now() + Span::seconds(5);
    let swept: Vec<i64> = store
        .outbox(horizon, 100)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        swept,
        [p.id],
        "the sweep reads the parent, never its unpublished tasks"
    );

    let again = store.expand_run(&fence, &p).await.unwrap().unwrap();
    assert_eq!(
        again.iter().map(|t| t.id).collect::<Vec<_>>(),
        tasks.iter().map(|t| t.id).collect::<Vec<_>>()
    );
    assert!(
        store
            .tasks_published(&fence, &confirmed(&tasks[..2]))
            .await
            .unwrap()
    );
    let rest = store.expand_run(&fence, &p).await.unwrap().unwrap();
    assert_eq!(rest.iter().map(|t| t.id).collect::<Vec<_>>(), [tasks[2].id]);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE parent_id = $1")
        .bind(p.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 3);
}

/// A broadcast makes one task per online worker handling the job, each for that worker; with
/// fewer online than `min_workers` the fire fails with a reason naming the numbers.
#[sqlx::test(migrations = "../migrations")]
async fn a_broadcast_targets_each_online_worker_or_fails_below_min_workers(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "b", json!({"kind": "broadcast"})).await;
    job(&pool, "b3", json!({"kind": "broadcast", "min_workers": 3})).await;
    worker(&pool, "w1", &["b", "b3"], true).await;
    worker(&pool, "w2", &["b", "b3"], true).await;
    worker(&pool, "w3", &["b", "b3"], false).await;
    worker(&pool, "w4", &["other"], true).await;
    let fence = store.lead_for_test("me").await;

    let p = parent(&pool, "b").await;
    let tasks = store.expand_run(&fence, &p).await.unwrap().unwrap();
    let targets: Vec<_> = tasks
        .iter()
        .map(|t| t.task.as_ref().unwrap().worker.clone().unwrap())
        .collect();
    assert_eq!(targets, ["w1", "w2"]);

    let p3 = parent(&pool, "b3").await;
    assert!(
        store
            .expand_run(&fence, &p3)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    let (s, reason) = state(&pool, p3.id).await;
    assert_eq!(s, "failed");
    assert_eq!(
        reason.as_deref(),
        Some("2 workers of group g handling job b3 online at the fire, 3 needed (min_workers)")
    );

    // w1's queue is gone: its task ends lost, the other is published, and the parent ends
    // when w2's task does, failed with the count.
    assert!(
        store
            .task_unroutable(&fence, tasks[0].id, "no queue")
            .await
            .unwrap()
    );
    assert!(
        store
            .tasks_published(&fence, &confirmed(&tasks[1..]))
            .await
            .unwrap()
    );
    set_states(&pool, &[tasks[1].id], "running").await;
    assert_eq!(state(&pool, p.id).await.0, "running");
    set_states(&pool, &[tasks[1].id], "succeeded").await;
    assert_eq!(
        state(&pool, p.id).await,
        ("failed".into(), Some("1 of 2 tasks did not succeed".into()))
    );
}

/// The aggregate: succeeded when every task did; a dead task makes the run dead under
/// `on_task_failure = "fail"`; under `ignore` the run succeeds and says how many failed.
#[sqlx::test(migrations = "../migrations")]
async fn the_parent_ends_when_its_last_task_does_by_its_failure_policy(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "f", json!({"kind": "sharded", "shards": 2})).await;
    job(
        &pool,
        "i",
        json!({"kind": "sharded", "shards": 2, "on_task_failure": "ignore"}),
    )
    .await;
    let fence = store.lead_for_test("me").await;
    for (name, last, expected) in [
        ("f", "succeeded", ("succeeded", None)),
        ("f", "dead", ("dead", Some("1 of 2 tasks did not succeed"))),
        (
            "i",
            "failed",
            (
                "succeeded",
                Some("1 of 2 tasks did not succeed (on_task_failure = \"ignore\")"),
            ),
        ),
    ] {
        let p = parent(&pool, name).await;
        let tasks = store.expand_run(&fence, &p).await.unwrap().unwrap();
        set_states(&pool, &[tasks[0].id], "succeeded").await;
        assert_eq!(
            state(&pool, p.id).await.0,
            "pending",
            "one task is still queued"
        );
        set_states(&pool, &[tasks[1].id], last).await;
        let (s, reason) = state(&pool, p.id).await;
        assert_eq!(
            (s.as_str(), reason.as_deref()),
            expected,
            "job {name}, last {last}"
        );
    }
}

/// Map/reduce: the root and the reduce task exist from the expansion; mapped sub-tasks are
/// pending in the outbox at once; the reduce task is read by the outbox only once every other
/// task has ended, and the run ends with it.
#[sqlx::test(migrations = "../migrations")]
async fn the_reduce_task_waits_in_the_outbox_for_every_other_task(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "m", json!({"kind": "map_reduce"})).await;
    let fence = store.lead_for_test("me").await;
    let p = parent(&pool, "m").await;
    let tasks = store.expand_run(&fence, &p).await.unwrap().unwrap();
    assert_eq!(
        tasks.len(),
        1,
        "only the root is published by the expansion"
    );
    let root = tasks[0].id;
    assert_eq!(tasks[0].task.as_ref().unwrap().kind, TaskKind::Root);
    store
        .tasks_published(&fence, &confirmed(&tasks))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE chime_runs SET state = 'running', attempt = 1, worker_id = 'w' WHERE id = $1",
    )
    .bind(root)
    .execute(&pool)
    .await
    .unwrap();
    let made: i32 =
        sqlx::query_scalar("SELECT chime_map($1, 1, 'w', 'pages', 1, ARRAY['1', '2']::jsonb[])")
            .bind(root)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(made, 2);

    let horizon = Utc::now() + Span::seconds(5);
    let swept = store.outbox(horizon, 100).await.unwrap();
    let kinds: Vec<_> = swept
        .iter()
        .filter(|r| r.task.is_some())
        .map(|r| (r.task.as_ref().unwrap().kind, r.params.clone()))
        .collect();
    assert_eq!(
        kinds,
        [(TaskKind::Map, json!(1)), (TaskKind::Map, json!(2))]
    );
    let mapped: Vec<i64> = swept
        .iter()
        .filter(|r| r.task.is_some())
        .map(|r| r.id)
        .collect();

    set_states(&pool, &[root], "succeeded").await;
    set_states(&pool, &mapped, "succeeded").await;
    let swept = store.outbox(horizon, 100).await.unwrap();
    let reduce: Vec<_> = swept
        .iter()
        .filter(|r| r.task.as_ref().is_some_and(|t| t.kind == TaskKind::Reduce))
        .collect();
    assert_eq!(
        reduce.len(),
        1,
        "the reduce task is due once the others ended"
    );
    assert_eq!(state(&pool, p.id).await.0, "running");
    set_states(&pool, &[reduce[0].id], "succeeded").await;
    assert_eq!(state(&pool, p.id).await, ("succeeded".into(), None));
}

/// A broadcast task whose worker is lost ends `lost`, not back in the outbox; the parent (no
/// worker of its own) is never taken for a lost run.
#[sqlx::test(migrations = "../migrations")]
async fn a_broadcast_task_of_a_lost_worker_ends_lost_and_is_not_moved(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "b", json!({"kind": "broadcast"})).await;
    worker(&pool, "w1", &["b"], true).await;
    let fence = store.lead_for_test("me").await;
    let p = parent(&pool, "b").await;
    let tasks = store.expand_run(&fence, &p).await.unwrap().unwrap();
    sqlx::query(
        "UPDATE chime_runs SET state = 'running', attempt = 1, worker_id = 'w1',
                started_at = now() WHERE id = $1",
    )
    .bind(tasks[0].id)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO chime_attempts (run_id, attempt, worker_id, state) VALUES ($1, 1, 'w1', 'running')")
        .bind(tasks[0].id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE chime_workers SET heartbeat_at = now() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    let rescued = store
        .rescue_lost_runs(&fence, std::time::Duration::ZERO, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rescued.iter().map(|r| r.id).collect::<Vec<_>>(),
        [tasks[0].id]
    );
    let (s, reason) = state(&pool, tasks[0].id).await;
    assert_eq!(s, "lost");
    assert!(reason.unwrap().contains("not moved to another worker"));
    assert_eq!(
        state(&pool, p.id).await,
        ("failed".into(), Some("1 of 1 tasks did not succeed".into()))
    );
}

/// Cancelling a running parent cancels its waiting tasks at once and asks its running ones;
/// the parent ends `cancelled` with its last task. Rerunning the failed tasks of a finished run
/// puts only those back in the outbox, in the same run, with their retry budget renewed.
#[sqlx::test(migrations = "../migrations")]
async fn cancel_reaches_every_task_and_retry_failed_reruns_only_the_failed(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "s", json!({"kind": "sharded", "shards": 3})).await;
    let fence = store.lead_for_test("me").await;
    let p = parent(&pool, "s").await;
    let t: Vec<i64> = store
        .expand_run(&fence, &p)
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    set_states(&pool, &[t[0]], "running").await;
    sqlx::query("UPDATE chime_runs SET cancel_requested_at = now(), cancel_requested_by = 'cli:a' WHERE id = $1")
        .bind(p.id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(state(&pool, t[1]).await.0, "cancelled");
    assert_eq!(state(&pool, t[0]).await.0, "running");
    assert_eq!(state(&pool, p.id).await.0, "running");
    set_states(&pool, &[t[0]], "cancelled").await;
    assert_eq!(
        state(&pool, p.id).await,
        ("cancelled".into(), Some("cancelled by cli:a".into()))
    );

    let q = parent(&pool, "s").await;
    let u: Vec<i64> = store
        .expand_run(&fence, &q)
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    set_states(&pool, &u[..2], "succeeded").await;
    let refused = sqlx::query_scalar::<_, i32>("SELECT chime_retry_failed($1, 'cli:a')")
        .bind(q.id)
        .fetch_one(&pool)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("only a finished run's failed tasks rerun"),
        "{refused}"
    );
    set_states(&pool, &u[2..], "dead").await;
    assert_eq!(state(&pool, q.id).await.0, "dead");
    let rerun: i32 = sqlx::query_scalar("SELECT chime_retry_failed($1, 'cli:a')")
        .bind(q.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rerun, 1);
    assert_eq!(state(&pool, q.id).await.0, "queued");
    let horizon = Utc::now() + Span::seconds(5);
    let swept = store.outbox(horizon, 100).await.unwrap();
    let again: Vec<_> = swept.iter().filter(|r| r.task.is_some()).collect();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, u[2]);
    assert_eq!(again[0].attempt, 2, "the next attempt of the same task");
    assert_eq!(
        again[0].retry.unwrap().max_attempts,
        1 + 3,
        "a renewed budget"
    );
    set_states(&pool, &u[2..], "succeeded").await;
    assert_eq!(state(&pool, q.id).await.0, "succeeded");
}

/// A broadcast task still waiting for a worker that is lost ends `lost` (nobody else would
/// start it, and its run would never end); one waiting for an online worker stays.
#[sqlx::test(migrations = "../migrations")]
async fn a_broadcast_task_waiting_for_a_lost_worker_ends_lost(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "b", json!({"kind": "broadcast"})).await;
    worker(&pool, "w1", &["b"], true).await;
    worker(&pool, "w2", &["b"], true).await;
    let fence = store.lead_for_test("me").await;
    let p = parent(&pool, "b").await;
    let tasks = store.expand_run(&fence, &p).await.unwrap().unwrap();
    store
        .tasks_published(&fence, &confirmed(&tasks))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE chime_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'w2'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let ended = store
        .rescue_stranded_broadcasts(&fence, std::time::Duration::from_secs(60), 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ended.iter().map(|r| r.id).collect::<Vec<_>>(),
        [tasks[1].id]
    );
    let (s, reason) = state(&pool, tasks[1].id).await;
    assert_eq!(s, "lost");
    assert!(
        reason
            .unwrap()
            .starts_with("its worker w2 was lost before it started (no heartbeat since ")
    );
    assert_eq!(state(&pool, tasks[0].id).await.0, "queued");
}

/// The bounds the migration's functions check are the documented limits.
#[test]
fn the_sql_bounds_of_job_kinds_are_the_limits() {
    use chime_protocol::limits;
    let sql = include_str!("../../../migrations/20261201000013_job_kinds.sql");
    let limits: [(&str, u64); 3] = [
        (
            "MAX_MAP_ITEMS_PER_CALL",
            u64::from(limits::MAX_MAP_ITEMS_PER_CALL),
        ),
        ("MAX_TASKS_PER_RUN", u64::from(limits::MAX_TASKS_PER_RUN)),
        (
            "MAX_TASK_OUTPUT_BYTES",
            limits::MAX_TASK_OUTPUT_BYTES as u64,
        ),
    ];
    for (name, value) in limits {
        let line = sql
            .lines()
            .find(|l| l.contains("constant integer") && l.contains(&format!("-- limits::{name}")))
            .unwrap_or_else(|| panic!("the migration checks {name}"));
        assert!(line.contains(&format!(":= {value};")), "{name}: {line}");
    }
    assert!(sql.contains(&format!(
        "least((spec->>'shards')::numeric, {})",
        limits::MAX_SHARDS
    )));
    assert!(sql.contains(&format!("{{1,{}}}", limits::MAX_MAP_STEP_LEN)));
    assert!(sql.contains(&format!(
        ":= {}; -- limits::MAX_PARAMS_BYTES",
        limits::MAX_PARAMS_BYTES
    )));
}
