//! Job kinds end to end with real worker processes (`chime-test-worker`), one of them SIGKILLed
//! mid-task: a broadcast task of the killed worker ends `lost` once its heartbeat has gone stale
//! and is never moved to another worker, while the others succeed; a shard of a 100-shard run
//! failing twice is retried alone with the job's policy until it succeeds; and a map/reduce run
//! of 10,000 sub-tasks loses a worker during its map phase, yet runs every sub-task to success
//! (twice only where the dead worker had it) and reduces once over all of them.
//!
//! Each worker prints `ran RUN_ID ATTEMPT` as a task starts (tests/bin/chime_test_worker.rs), so
//! the executions of a killed process are counted too; `CHIME_TEST_HANG_AFTER` makes the doomed
//! process's tasks hang after a number of starts, so it is killed with tasks certainly running.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use chime_e2e::process::Process;
use chime_e2e::{Scheduler, Setup, wait_for};
use chime_scheduler::config::RescuerSettings;
use chime_scheduler::service::DutySettings;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::process::Command;

use crate::common::job;
use crate::failures::support::trigger;
use crate::kinds::{ended_within, online, parent, tasks};

/// Longest a test waits for a run to end or a worker to get somewhere.
const PATIENCE: Duration = Duration::from_secs(120);
/// The worker processes' heartbeat: lost three intervals after its last beat.
const HEARTBEAT_MS: u64 = 500;
/// How long a lost worker stays lost before the (test's fast) rescuer acts.
const RESCUE_AFTER: Duration = Duration::from_secs(2);

/// A `chime-test-worker` process of the test's group as worker `id`, its output in `logs` and
/// its stdout lines kept; past `hang_after` task starts its tasks hang.
fn worker(t: &Setup, logs: &Path, id: &str, capacity: u16, hang_after: Option<u64>) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chime-test-worker"));
    command
        .env("CHIME_TEST_DATABASE_URL", &t.database_url)
        .env("CHIME_TEST_AMQP_URLS", &t.amqp_url)
        .env("CHIME_TEST_PREFIX", &t.prefix)
        .env("CHIME_TEST_GROUP", &t.group)
        .env("CHIME_TEST_WORKER_ID", id)
        .env("CHIME_TEST_HEARTBEAT_MS", HEARTBEAT_MS.to_string())
        .env("CHIME_TEST_CAPACITY", capacity.to_string())
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1");
    if let Some(after) = hang_after {
        command.env("CHIME_TEST_HANG_AFTER", after.to_string());
    }
    t.guard.add_worker_queue(&t.group, id);
    Process::spawn(
        &format!("worker {id}"),
        command,
        &logs.join(format!("{id}.log")),
    )
    .expect("start chime-test-worker")
}

/// The numbers on `process`'s stdout lines starting with `word` (`ran`, `mapped`, `reduced`).
fn reported(process: &Process, word: &str) -> Vec<Vec<i64>> {
    process
        .stdout_lines()
        .iter()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(word)).then(|| {
                words
                    .map(|n| n.parse().expect("numbers after the word"))
                    .collect()
            })
        })
        .collect()
}

/// (run id, attempt) of each of `process`'s stdout lines `WORD RUN_ID ATTEMPT …`: the tasks it
/// started (`ran`), or of those the tasks that hang (`hung`).
fn attempts_reported(process: &Process, word: &str) -> Vec<(i64, i32)> {
    reported(process, word)
        .into_iter()
        .map(|n| (n[0], i32::try_from(n[1]).expect("an attempt")))
        .collect()
}

/// The tasks `process` started, in order: (run id, attempt) of each `ran` line.
fn starts(process: &Process) -> Vec<(i64, i32)> {
    attempts_reported(process, "ran")
}

/// When `process` started attempt `attempt` of task `task` (its wall clock, in milliseconds since
/// the Unix epoch), if it did.
fn started_at_ms(process: &Process, task: i64, attempt: i32) -> Option<i64> {
    reported(process, "ran")
        .into_iter()
        .find(|n| n[0] == task && n[1] == i64::from(attempt))
        .map(|n| n[2])
}

/// A rescuer that acts soon after a worker's heartbeat has gone stale.
fn fast_rescuer() -> DutySettings {
    DutySettings {
        rescuer: RescuerSettings {
            interval: Duration::from_millis(250),
            rescue_after: RESCUE_AFTER,
            ..RescuerSettings::default()
        },
        ..DutySettings::default()
    }
}

/// An attempt of a task.
#[derive(Debug, Clone, sqlx::FromRow)]
struct TaskAttempt {
    task_id: i64,
    task_kind: String,
    shard_index: Option<i32>,
    attempt: i32,
    worker_id: String,
    state: String,
    error: Option<String>,
}

/// Every attempt of `parent`'s tasks, by task id, in attempt order.
async fn task_attempts(pool: &PgPool, parent: i64) -> BTreeMap<i64, Vec<TaskAttempt>> {
    let rows: Vec<TaskAttempt> = sqlx::query_as(
        "SELECT r.id AS task_id, r.task_kind, r.shard_index, a.attempt, a.worker_id, a.state,
                a.error
           FROM chime_runs r JOIN chime_attempts a ON a.run_id = r.id
          WHERE r.parent_id = $1
          ORDER BY r.id, a.attempt",
    )
    .bind(parent)
    .fetch_all(pool)
    .await
    .expect("read the tasks' attempts");
    let mut by_task: BTreeMap<i64, Vec<TaskAttempt>> = BTreeMap::new();
    for row in rows {
        by_task.entry(row.task_id).or_default().push(row);
    }
    by_task
}

/// (attempt, worker, state) of each attempt.
fn outline(attempts: &[TaskAttempt]) -> Vec<(i32, &str, &str)> {
    attempts
        .iter()
        .map(|a| (a.attempt, a.worker_id.as_str(), a.state.as_str()))
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_broadcast_task_of_a_killed_worker_process_ends_lost_and_is_not_moved(pool: PgPool) {
    let t = Setup::new(&pool);
    let logs = tempfile::tempdir().expect("a log directory");
    let spec =
        job(json!({"name": "kinds-task", "group": t.group, "kind": "broadcast", "min_workers": 3}));
    let scheduler = Scheduler::on_with(&t, "s1", vec![spec], fast_rescuer());
    let mut survivors = vec![
        worker(&t, logs.path(), "node-1", 2, None),
        worker(&t, logs.path(), "node-2", 2, None),
    ];
    // node-3's task hangs once started: it is killed with the task certainly running.
    let mut doomed = worker(&t, logs.path(), "node-3", 2, Some(0));
    online(&pool, 3).await;

    let id = trigger(&pool, "kinds-task", json!({"ms": 100})).await;
    let doomed_task = wait_for(PATIENCE, "node-3 to be running its task", || async {
        let started = starts(&doomed);
        tasks(&pool, id)
            .await
            .into_iter()
            .find_map(|(task, (key, state, worker))| {
                (key == "worker/node-3"
                    && state == "running"
                    && worker.as_deref() == Some("node-3")
                    && started.contains(&(task, 1)))
                .then_some(task)
            })
    })
    .await;
    let killed_at = Instant::now();
    doomed.kill().await.expect("SIGKILL node-3");

    assert_eq!(ended_within(&pool, id, PATIENCE).await, "failed");
    let detected = killed_at.elapsed();
    let (_, reason, counters) = parent(&pool, id).await;
    assert_eq!(
        (reason.as_deref(), counters),
        (Some("1 of 3 tasks did not succeed"), (3, 3, 1)),
        "the aggregate: one task of three did not succeed, none dead, so the run failed"
    );
    // Which worker did what: each task ran on the worker it was for, node-3's was lost there.
    let by_task = tasks(&pool, id).await;
    let mut per_task: Vec<(&str, &str, Option<&str>)> = by_task
        .values()
        .map(|(key, state, worker)| (key.as_str(), state.as_str(), worker.as_deref()))
        .collect();
    per_task.sort_unstable();
    assert_eq!(
        per_task,
        [
            ("worker/node-1", "succeeded", Some("node-1")),
            ("worker/node-2", "succeeded", Some("node-2")),
            ("worker/node-3", "lost", Some("node-3")),
        ]
    );
    let attempts = task_attempts(&pool, id).await;
    for (task, (key, _, _)) in &by_task {
        let owner = key.strip_prefix("worker/").expect("a broadcast task key");
        let state = if *task == doomed_task {
            "lost"
        } else {
            "succeeded"
        };
        assert_eq!(
            outline(&attempts[task]),
            [(1, owner, state)],
            "{key}: one attempt, on its own worker"
        );
    }
    let lost = &attempts[&doomed_task][0];
    let error = lost.error.as_deref().expect("a lost attempt says why");
    assert!(
        error.starts_with("worker node-3 lost (no heartbeat since "),
        "{error}"
    );

    // Lost by its heartbeat going stale, then `rescue_after`: not sooner.
    let (reason, finished_at, heartbeat_at, interval_ms): (
        Option<String>,
        DateTime<Utc>,
        DateTime<Utc>,
        i32,
    ) = sqlx::query_as(
        "SELECT r.reason, r.finished_at, w.heartbeat_at, w.heartbeat_interval_ms
           FROM chime_runs r JOIN chime_workers w ON w.id = r.worker_id WHERE r.id = $1",
    )
    .bind(doomed_task)
    .fetch_one(&pool)
    .await
    .expect("read the lost task and its worker");
    assert_eq!(
        reason.as_deref(),
        Some("its worker was lost; a broadcast task is not moved to another worker")
    );
    let stale = heartbeat_at + chrono::Duration::milliseconds(3 * i64::from(interval_ms));
    let earliest = stale + chrono::Duration::from_std(RESCUE_AFTER).expect("short");
    assert!(
        finished_at >= earliest,
        "ended lost at {finished_at}, before its worker's heartbeat (last {heartbeat_at}) was \
         stale for {RESCUE_AFTER:?}"
    );
    println!(
        "broadcast: SIGKILL of node-3 -> its task lost and the run failed after {} ms \
         (heartbeat {HEARTBEAT_MS} ms, stale after 3, rescue_after {RESCUE_AFTER:?})",
        detected.as_millis()
    );

    // Not moved: each process started its own task once, and nobody else's.
    for process in &mut survivors {
        assert!(
            process.stop(PATIENCE).await.expect("stop a worker"),
            "{} stops cleanly",
            process.name
        );
    }
    let task_of = |worker: &str| {
        by_task
            .iter()
            .find(|(_, (key, _, _))| *key == format!("worker/{worker}"))
            .map(|(id, _)| *id)
            .expect("a task for each worker")
    };
    for (process, worker) in [
        (&survivors[0], "node-1"),
        (&survivors[1], "node-2"),
        (&doomed, "node-3"),
    ] {
        assert_eq!(starts(process), [(task_of(worker), 1)], "{worker}'s runs");
    }
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_shard_failing_twice_is_retried_alone_and_its_hundred_shard_run_succeeds(pool: PgPool) {
    const SHARDS: i32 = 100;
    const FLAKY: i32 = 42;
    let t = Setup::new(&pool);
    let logs = tempfile::tempdir().expect("a log directory");
    let spec = job(json!({
        "name": "kinds-task", "group": t.group, "kind": "sharded", "shards": SHARDS,
        "retry": {"max_attempts": 3, "initial": "250ms", "multiplier": 2.0, "max": "1s",
                  "jitter": false}
    }));
    let scheduler = Scheduler::on(&t, "s1", vec![spec]);
    let mut workers = vec![
        worker(&t, logs.path(), "shards-1", 4, None),
        worker(&t, logs.path(), "shards-2", 4, None),
    ];
    online(&pool, 2).await;

    let id = trigger(
        &pool,
        "kinds-task",
        json!({"fail_shard": FLAKY, "fail_attempts": 2}),
    )
    .await;
    assert_eq!(ended_within(&pool, id, PATIENCE).await, "succeeded");
    let (_, reason, counters) = parent(&pool, id).await;
    assert_eq!(
        (reason, counters),
        (None, (SHARDS, SHARDS, 0)),
        "every shard succeeded in the end"
    );

    let attempts = task_attempts(&pool, id).await;
    let shards: BTreeSet<Option<i32>> = attempts.values().map(|a| a[0].shard_index).collect();
    assert_eq!(
        shards,
        (0..SHARDS).map(Some).collect(),
        "one task per shard"
    );
    let mut flaky_task = None;
    for (task, rows) in &attempts {
        let states: Vec<(i32, &str)> = rows.iter().map(|a| (a.attempt, a.state.as_str())).collect();
        if rows[0].shard_index == Some(FLAKY) {
            flaky_task = Some(*task);
            assert_eq!(states, [(1, "failed"), (2, "failed"), (3, "succeeded")]);
            let errors: Vec<Option<&str>> = rows.iter().map(|a| a.error.as_deref()).collect();
            assert_eq!(
                errors,
                [
                    Some("shard 42 fails attempt 1 (its first 2 fail)"),
                    Some("shard 42 fails attempt 2 (its first 2 fail)"),
                    None,
                ]
            );
        } else {
            assert_eq!(
                states,
                [(1, "succeeded")],
                "shard {:?}",
                rows[0].shard_index
            );
        }
    }
    let flaky_task = flaky_task.expect("the flaky shard's task");

    // What the processes ran: the flaky shard's three attempts, every other shard once.
    for process in &mut workers {
        assert!(
            process.stop(PATIENCE).await.expect("stop a worker"),
            "{} stops cleanly",
            process.name
        );
    }
    let mut ran: BTreeMap<i64, Vec<i32>> = BTreeMap::new();
    for process in &workers {
        for (task, attempt) in starts(process) {
            ran.entry(task).or_default().push(attempt);
        }
    }
    assert_eq!(ran.len(), attempts.len(), "every shard ran");
    for (task, mut tried) in ran {
        tried.sort_unstable();
        let want: &[i32] = if task == flaky_task { &[1, 2, 3] } else { &[1] };
        assert_eq!(tried, want, "task {task}'s executions");
    }
    // The job's backoff, from the worker's clock at each start: 250 ms before the second
    // attempt, 500 ms before the third. (Each attempt fails after its start; the next is due
    // the delay after the failure, and no worker starts a retry before it is due; the due
    // instant travels in whole milliseconds, hence the 1 ms. The attempt rows' `started_at`
    // cannot say this: it is the claim's database clock plus the worker's time since it sent
    // the claim, so it runs late by the claim's latency, which varies.)
    let flaky_starts: Vec<i64> = (1..=3)
        .map(|attempt| {
            workers
                .iter()
                .find_map(|p| started_at_ms(p, flaky_task, attempt))
                .expect("each attempt started")
        })
        .collect();
    for (pair, delay) in flaky_starts.windows(2).zip([250, 500]) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= delay - 1,
            "attempts started {gap} ms apart, want {delay} ms"
        );
    }
    println!(
        "shards: the flaky shard's attempts started {} ms and {} ms apart (backoff 250 ms, 500 ms)",
        flaky_starts[1] - flaky_starts[0],
        flaky_starts[2] - flaky_starts[1]
    );
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn map_reduce_of_ten_thousand_sub_tasks_survives_a_worker_process_killed_mid_map(
    pool: PgPool,
) {
    const ITEMS: i64 = 10_000;
    const CAPACITY: u16 = 8;
    // The doomed process's task starts before its tasks hang: it does its share first.
    const DOOMED_STARTS: usize = 500;
    let t = Setup::new(&pool);
    let logs = tempfile::tempdir().expect("a log directory");
    let spec = job(json!({"name": "kinds-map", "group": t.group, "kind": "map_reduce"}));
    let scheduler = Scheduler::on(&t, "s1", vec![spec]);
    let mut survivor = worker(&t, logs.path(), "mr-1", CAPACITY, None);
    let hang_after = u64::try_from(DOOMED_STARTS).expect("small");
    let mut doomed = worker(&t, logs.path(), "mr-2", CAPACITY, Some(hang_after));
    online(&pool, 2).await;

    let began = Instant::now();
    let id = trigger(&pool, "kinds-map", json!({"items": ITEMS, "ms": 0})).await;
    // Once the doomed process has hung with a full house of running sub-tasks, kill it.
    let hung = wait_for(PATIENCE, "mr-2 to run its share, then hang", || async {
        let hung = attempts_reported(&doomed, "hung");
        (hung.len() >= usize::from(CAPACITY)).then_some(hung)
    })
    .await;
    let started = starts(&doomed).len();
    assert_eq!(
        (hung.len(), started),
        (usize::from(CAPACITY), DOOMED_STARTS + usize::from(CAPACITY)),
        "its slots are full of hung tasks: {hung:?}"
    );
    let hung_ids: Vec<i64> = hung.iter().map(|(task, _)| *task).collect();
    let (running, maps_done): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE id = ANY($2) AND state = 'running' AND worker_id = 'mr-2'),
                count(*) FILTER (WHERE task_kind = 'map' AND state = 'succeeded')
           FROM chime_runs WHERE parent_id = $1",
    )
    .bind(id)
    .bind(&hung_ids)
    .fetch_one(&pool)
    .await
    .expect("read the map phase");
    assert_eq!(
        running,
        i64::from(CAPACITY),
        "the hung tasks are running on mr-2"
    );
    assert!(
        maps_done < ITEMS,
        "killed during the map phase ({maps_done} done)"
    );
    doomed.kill().await.expect("SIGKILL mr-2");

    assert_eq!(ended_within(&pool, id, PATIENCE).await, "succeeded");
    let took = began.elapsed();
    assert!(
        survivor.stop(PATIENCE).await.expect("stop mr-1"),
        "mr-1 stops cleanly"
    );
    let (_, reason, counters) = parent(&pool, id).await;
    let total = i32::try_from(ITEMS).expect("small") + 2;
    assert_eq!((reason, counters), (None, (total, total, 0)));

    // Every task succeeded in the end; an attempt before its last is one lost with mr-2.
    let attempts = task_attempts(&pool, id).await;
    let kinds: BTreeMap<&str, usize> = attempts.values().fold(BTreeMap::new(), |mut n, a| {
        *n.entry(a[0].task_kind.as_str()).or_default() += 1;
        n
    });
    assert_eq!(
        kinds,
        BTreeMap::from([("map", 10_000), ("reduce", 1), ("root", 1)])
    );
    let mut taken_over = BTreeSet::new();
    for (task, rows) in &attempts {
        let (last, earlier) = rows.split_last().expect("at least one attempt");
        let numbers: Vec<i32> = rows.iter().map(|a| a.attempt).collect();
        assert_eq!(
            numbers,
            (1..=last.attempt).collect::<Vec<_>>(),
            "task {task}"
        );
        assert_eq!(last.state, "succeeded", "task {task}: {:?}", outline(rows));
        for lost in earlier {
            assert_eq!(
                (lost.worker_id.as_str(), lost.state.as_str()),
                ("mr-2", "lost")
            );
            let error = lost.error.as_deref().unwrap_or_default();
            assert!(
                error.starts_with("worker mr-2 was lost while running this attempt")
                    || error.starts_with("worker mr-2 lost ("),
                "task {task}: {error}"
            );
        }
        if !earlier.is_empty() {
            assert_eq!(
                last.worker_id, "mr-1",
                "task {task}: taken over by the survivor"
            );
            taken_over.insert(*task);
        }
    }
    // The hung tasks were taken over, and ran on mr-1 as their next attempt.
    for (task, attempt) in &hung {
        assert_eq!(
            outline(&attempts[task]),
            [
                (*attempt, "mr-2", "lost"),
                (attempt + 1, "mr-1", "succeeded")
            ],
            "hung task {task}"
        );
    }

    // Executions: mr-1 ran exactly its succeeded sub-task attempts, each once; mr-2 ran only
    // attempts recorded as its own, each once. So only a task mr-2 had ran twice.
    let succeeded_on_mr1: BTreeSet<(i64, i32)> = attempts
        .values()
        .flatten()
        .filter(|a| a.task_kind == "map" && a.worker_id == "mr-1" && a.state == "succeeded")
        .map(|a| (a.task_id, a.attempt))
        .collect();
    let survivor_starts = starts(&survivor);
    assert_eq!(
        survivor_starts.iter().copied().collect::<BTreeSet<_>>(),
        succeeded_on_mr1
    );
    assert_eq!(
        survivor_starts.len(),
        succeeded_on_mr1.len(),
        "no start twice on mr-1"
    );
    let doomed_starts = starts(&doomed);
    let on_mr2: BTreeSet<(i64, i32)> = attempts
        .values()
        .flatten()
        .filter(|a| a.worker_id == "mr-2")
        .map(|a| (a.task_id, a.attempt))
        .collect();
    let doomed_set: BTreeSet<(i64, i32)> = doomed_starts.iter().copied().collect();
    assert_eq!(
        doomed_set.len(),
        doomed_starts.len(),
        "no start twice on mr-2"
    );
    assert!(
        doomed_set.is_subset(&on_mr2),
        "mr-2 ran only its own attempts"
    );
    let ran_twice: BTreeSet<i64> = doomed_set
        .iter()
        .map(|(task, _)| *task)
        .filter(|task| survivor_starts.iter().any(|(t, _)| t == task))
        .collect();
    assert!(ran_twice.is_subset(&taken_over), "{ran_twice:?}");

    // The root mapped 10,000 (a retried root maps none anew); one reduction saw them all.
    let mapped: i64 = [&survivor, &doomed]
        .iter()
        .flat_map(|p| reported(p, "mapped"))
        .map(|n| n[2])
        .sum();
    assert_eq!(mapped, ITEMS);
    let reductions: Vec<Vec<i64>> = [&survivor, &doomed]
        .iter()
        .flat_map(|p| reported(p, "reduced"))
        .collect();
    let reduce_task = *attempts
        .iter()
        .find(|(_, a)| a[0].task_kind == "reduce")
        .expect("a reduce task")
        .0;
    let expected: i64 = (0..ITEMS).map(|n| n * 2).sum();
    assert_eq!(
        reductions,
        [vec![reduce_task, 1, ITEMS + 1, ITEMS, expected]],
        "one reduction, over the root and every sub-task, all succeeded"
    );
    assert_eq!(outline(&attempts[&reduce_task]), [(1, "mr-1", "succeeded")]);
    let output: Value = sqlx::query_scalar("SELECT output FROM chime_runs WHERE id = $1")
        .bind(reduce_task)
        .fetch_one(&pool)
        .await
        .expect("the reduce task's output");
    assert_eq!(output, json!({"sum": expected}));
    println!(
        "map/reduce of {ITEMS}: run ended {} ms after the trigger; mr-2 killed with {maps_done} \
         sub-tasks done; {} tasks taken over, {} of them ran twice",
        took.as_millis(),
        taken_over.len(),
        ran_twice.len()
    );
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}
