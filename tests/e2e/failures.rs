//! Failure handling end to end, the scheduler publishing and SDK workers consuming: retries with
//! backoff through the delay tiers, a worker process SIGKILLed mid-run, a poison message that
//! crashes every worker taking it, and a job longer than the broker's consumer timeout.

#[path = "failures_support.rs"]
pub(crate) mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use chime_e2e::{
    AMQP_URL, Scheduler, Setup, capture_logs, done_if, service_config, unique, wait_for,
};
use chime_protocol::Topology;
use chime_protocol::wire::HEADER_DEAD_REASON;
use chime_worker::{CancellationToken, JobContext, JobError, Worker};
use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;
use support::{WAIT, WorkerProcess, attempts, run, run_until, trigger};

use crate::common::job;

fn ms(from: chrono::DateTime<Utc>, to: chrono::DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds()
}

/// An in-process worker of `group` running `handlers` until the returned token fires.
fn start(
    builder: chime_worker::WorkerBuilder,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>,
) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.build().expect("worker builds").run(stop.clone()));
    (stop, task)
}

async fn stop(
    (token, task): (
        CancellationToken,
        tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>,
    ),
) {
    token.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("worker stops in time")
        .expect("worker task")
        .expect("worker ran cleanly");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_job_failing_twice_is_retried_after_one_then_two_seconds_and_succeeds(pool: PgPool) {
    let t = Setup::new(&pool);
    let (db, prefix, group) = (t.database_url.clone(), t.prefix.clone(), t.group.clone());
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![job(json!({
            "name": "flaky", "group": group,
            "retry": {"max_attempts": 3, "initial": "1s", "multiplier": 2.0, "max": "1m", "jitter": false}
        }))],
    );
    let worker = start(
        Worker::builder(group.as_str())
            .database_url(&db)
            .amqp_url(AMQP_URL)
            .prefix(prefix.as_str())
            .handle(
                "flaky",
                |ctx: JobContext, _: serde_json::Value| async move {
                    if ctx.attempt() < 3 {
                        return Err(JobError::retry(format!("not yet ({})", ctx.attempt())));
                    }
                    Ok(())
                },
            ),
    );
    let run_id = trigger(&pool, "flaky", json!(null)).await;
    let done = run_until(&pool, run_id, "to succeed", |r| r.state == "succeeded").await;
    assert_eq!(done.attempt, 3);
    let rows = attempts(&pool, run_id).await;
    let states: Vec<(i32, &str)> = rows.iter().map(|a| (a.attempt, a.state.as_str())).collect();
    assert_eq!(states, [(1, "failed"), (2, "failed"), (3, "succeeded")]);
    let gaps = [
        ms(rows[0].started_at, rows[1].started_at),
        ms(rows[1].started_at, rows[2].started_at),
    ];
    println!(
        "e2e backoff (initial 1 s, multiplier 2, no jitter): attempts started {} ms and {} ms apart",
        gaps[0], gaps[1]
    );
    for (gap, want) in gaps.into_iter().zip([1_000, 2_000]) {
        assert!(
            (want - 300..=want + 300).contains(&gap),
            "{gap} ms, expected {want} ± 300"
        );
    }
    stop(worker).await;
    scheduler.stop().await.expect("graceful stop");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_worker_killed_mid_run_is_taken_over_by_another_worker(pool: PgPool) {
    let t = Setup::new(&pool);
    let (db, prefix, group) = (t.database_url.clone(), t.prefix.clone(), t.group.clone());
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![job(json!({"name": "sleep", "group": group}))],
    );
    // The first worker is a real process with the default 500 ms heartbeat.
    let doomed = WorkerProcess::spawn(&db, &prefix, &group, &unique("doomed"), 500, 2);
    let run_id = trigger(&pool, "sleep", json!({"ms": 1_500})).await;
    let held = run_until(&pool, run_id, "to run on the child worker", |r| {
        r.state == "running"
    })
    .await;
    assert_eq!(held.worker_id.as_deref(), Some(doomed.id.as_str()));

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let survivor = start(
        Worker::builder(group.as_str())
            .database_url(&db)
            .amqp_url(AMQP_URL)
            .prefix(prefix.as_str())
            .worker_id(unique("survivor"))
            .handle("sleep", move |ctx: JobContext, p: serde_json::Value| {
                counted.fetch_add(1, SeqCst);
                async move {
                    ctx.log().info("taking over");
                    tokio::time::sleep(Duration::from_millis(p["ms"].as_u64().unwrap_or(0))).await;
                    Ok(())
                }
            }),
    );
    // Let the survivor's consumer start before the kill (its registry row comes first).
    wait_for(WAIT, "the survivor to register", || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM chime_workers WHERE id LIKE 'survivor%'")
                .fetch_one(&pool)
                .await
                .unwrap();
        (n == 1).then_some(())
    })
    .await;
    let doomed_id = doomed.id.clone();
    let killed_at = Utc::now();
    doomed.kill().await;

    let done = run_until(&pool, run_id, "to succeed on the survivor", |r| {
        r.state == "succeeded"
    })
    .await;
    assert_eq!(done.attempt, 2);
    assert!(done.worker_id.unwrap().starts_with("survivor"));
    let rows = attempts(&pool, run_id).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0].state.as_str(), rows[0].worker_id.as_str()),
        ("lost", doomed_id.as_str())
    );
    assert!(
        rows[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with(&format!("worker {doomed_id} was lost")),
        "{rows:?}"
    );
    assert_eq!(rows[1].state, "succeeded");
    let recovery = ms(killed_at, rows[1].started_at);
    println!(
        "crash recovery: SIGKILL → attempt 2 started on another worker after {recovery} ms \
         (heartbeat 500 ms, lost after 3 missed)"
    );
    assert!((0..5_000).contains(&recovery), "{recovery} ms");
    assert_eq!(calls.load(SeqCst), 1);
    stop(survivor).await;
    scheduler.stop().await.expect("graceful stop");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_message_that_crashes_every_worker_ends_dead_with_the_delivery_limit_reason(
    pool: PgPool,
) {
    let t = Setup::new(&pool);
    let (db, prefix, group) = (t.database_url.clone(), t.prefix.clone(), t.group.clone());
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        // Enough attempts that the delivery limit (5), not the retry policy, ends the poison.
        vec![
            job(json!({"name": "abort", "group": group, "retry": {"max_attempts": 10}})),
            job(json!({"name": "sleep", "group": group, "retry": {"max_attempts": 10}})),
        ],
    );
    let poison = trigger(&pool, "abort", json!(null)).await;
    let mut innocents = Vec::new();
    for _ in 0..3 {
        innocents.push(trigger(&pool, "sleep", json!({"ms": 200})).await);
    }

    // Keep one worker process alive, replacing each one the poison kills, until every run has
    // ended. Heartbeats every 100 ms: a crashed worker is judged lost 300 ms later.
    let terminal = ["succeeded", "dead", "failed", "cancelled"];
    let mut started = 0;
    let mut worker: Option<WorkerProcess> = None;
    let mut all = vec![poison];
    all.extend(&innocents);
    wait_for(Duration::from_secs(90), "every run to end", async || {
        let mut states = Vec::new();
        for id in &all {
            states.push(run(&pool, *id).await.state);
        }
        if states.iter().all(|s| terminal.contains(&s.as_str())) {
            return Ok(());
        }
        if worker.as_mut().is_none_or(WorkerProcess::exited) {
            started += 1;
            worker = Some(WorkerProcess::spawn(
                &db,
                &prefix,
                &group,
                &unique("w"),
                100,
                2,
            ));
        }
        Err(states)
    })
    .await;
    if let Some(worker) = worker {
        worker.kill().await;
    }

    let dead = run(&pool, poison).await;
    assert_eq!(dead.state, "dead", "{dead:?}");
    let reason = dead.reason.unwrap();
    assert!(reason.starts_with("delivery limit reached: "), "{reason}");
    let rows = attempts(&pool, poison).await;
    assert!(rows.iter().all(|a| a.state == "lost"), "{rows:?}");
    assert_eq!(
        rows.len(),
        5,
        "one lost attempt per crash, up to the delivery limit: {rows:?}"
    );
    println!(
        "poison message: {started} worker processes started, run dead after {} lost attempts: {reason}",
        rows.len()
    );

    let (mut ok, mut parked_innocents) = (0, 0);
    for id in &innocents {
        let r = run(&pool, *id).await;
        match r.state.as_str() {
            "succeeded" => ok += 1,
            "dead" => {
                let why = r.reason.unwrap_or_default();
                assert!(
                    why.starts_with("delivery limit reached: "),
                    "innocent run {id}: {why}"
                );
                parked_innocents += 1;
            }
            other => panic!("innocent run {id} ended {other}"),
        }
    }
    println!(
        "innocent runs: {ok} succeeded, {parked_innocents} dead by the delivery limit (replayable)"
    );

    // Every dead run's message is parked with its reason: still in the parking lot, or already
    // drained by the leader into `chime_dead_letters` (about once a second). Messages taken
    // from the queue here leave it, so each is seen once, from one place or the other.
    let topology = Topology::new(prefix.as_str(), group.as_str());
    let parking = topology.parking_queue();
    let connection = lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut from_queue = Vec::new();
    let reasons = wait_for(WAIT, "the parked messages", async || {
        while let Some(m) = channel
            .basic_get(
                parking.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            let headers = m.delivery.properties.headers().clone().unwrap_or_default();
            if let Some(lapin::types::AMQPValue::LongString(s)) =
                headers.inner().get(HEADER_DEAD_REASON)
            {
                from_queue.push(String::from_utf8_lossy(s.as_bytes()).into_owned());
            }
        }
        let drained: Vec<String> = sqlx::query_scalar(
            "SELECT reason FROM chime_dead_letters WHERE group_name = $1 AND reason IS NOT NULL",
        )
        .bind(group.as_str())
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut reasons = from_queue.clone();
        reasons.extend(drained);
        if reasons.len() > parked_innocents {
            Ok(reasons)
        } else {
            Err(format!("{reasons:?}, want {}", 1 + parked_innocents))
        }
    })
    .await;
    assert_eq!(reasons.len(), 1 + parked_innocents, "{reasons:?}");
    assert!(reasons.contains(&reason), "{reasons:?}");
    let _ = connection.close(200, "done".into()).await;
    scheduler.stop().await.expect("graceful stop");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_job_longer_than_the_consumer_timeout_finishes_exactly_once(pool: PgPool) {
    let t = Setup::new(&pool);
    let (db, prefix, group) = (t.database_url.clone(), t.prefix.clone(), t.group.clone());
    // Before the worker opens its channels: they read the timeout when they open.
    let _timeout = support::ConsumerTimeout::set(60_000).await;
    let (_capturing, mut events) = capture_logs("chime_worker");
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![job(json!({"name": "long", "group": group}))],
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = start(
        Worker::builder(group.as_str())
            .database_url(&db)
            .amqp_url(AMQP_URL)
            .prefix(prefix.as_str())
            .ack_after(Duration::from_secs(20))
            .handle("long", move |_: JobContext, _: serde_json::Value| {
                counted.fetch_add(1, SeqCst);
                async {
                    tokio::time::sleep(Duration::from_secs(90)).await;
                    Ok(())
                }
            }),
    );
    let run_id = trigger(&pool, "long", json!(null)).await;
    let done = wait_for(
        Duration::from_secs(150),
        "the 90 s run to finish",
        || async { done_if(run(&pool, run_id).await, |r| r.state == "succeeded") },
    )
    .await;
    assert_eq!(done.attempt, 1);
    let rows = attempts(&pool, run_id).await;
    assert_eq!(rows.len(), 1);
    let took = ms(rows[0].started_at, rows[0].finished_at.unwrap());
    assert!(took >= 90_000, "{took} ms");
    stop(worker).await;
    scheduler.stop().await.expect("graceful stop");

    let seen = events.take_new();
    assert!(
        seen.iter()
            .any(|m| m.starts_with("handler still running: acked its delivery early")),
        "{seen:#?}"
    );
    // The broker never closed the channel under the handler, and nothing came back.
    for bad in [
        "lost the work queue consumer",
        "work queue consumer failed",
        "duplicate",
    ] {
        assert!(
            !seen.iter().any(|m| m.contains(bad)),
            "`{bad}` in {seen:#?}"
        );
    }
    assert_eq!(calls.load(SeqCst), 1, "the handler ran exactly once");
}
