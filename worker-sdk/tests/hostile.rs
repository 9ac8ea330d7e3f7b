//! Forged and oversized messages against a real worker, PostgreSQL and RabbitMQ: a header value
//! that once closed the connection (and black-holed the next triggers), absurd durations that
//! once panicked a task, forged fields naming a real run, and the last delivery the broker
//! really allows. Each forged message is parked with its reason, never run, and never changes
//! the run it names, which its genuine trigger still runs.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use chime_protocol::limits::{MAX_HEADER_VALUE_BYTES, MAX_TRIGGER_BYTES};
use chime_protocol::wire::{HEADER_ATTEMPT, HEADER_DEAD_REASON, HEADER_NOT_BEFORE};
use chime_test_kit::{capture_logs, wait_for};
use chime_worker::{JobContext, JobError};
use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;
use sqlx::PgPool;
use support::{Env, WAIT, header, policy};

/// Waits for the parking lot to hold `n` messages, then takes them.
async fn take_parked(env: &Env, n: u32) -> Vec<lapin::message::Delivery> {
    let parking = env.topology.parking_queue();
    wait_for(WAIT, &format!("{n} parked messages"), || {
        let parking = parking.clone();
        async move { (env.queue_state(&parking).await.0 == n).then_some(()) }
    })
    .await;
    let mut parked = Vec::new();
    for _ in 0..n {
        parked.push(env.take_parked().await.unwrap());
    }
    parked
}

fn reason(message: &lapin::message::Delivery) -> String {
    header(message, HEADER_DEAD_REASON).unwrap_or_default()
}

fn counting(calls: &Arc<AtomicUsize>) -> impl Fn(JobContext, Value) -> CallFuture + use<> {
    let calls = calls.clone();
    move |_: JobContext, _: Value| -> CallFuture {
        calls.fetch_add(1, SeqCst);
        Box::pin(async { Ok(()) })
    }
}

type CallFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>;

/// Once: a worker with 15,000 handlers wrote an "unknown job" reason of 185 KB, over the
/// broker's frame_max; RabbitMQ closed the connection, and after lapin's recovery half of the
/// next triggers stayed queued, unacked, until the worker restarted.
#[sqlx::test(migrations = "../migrations")]
async fn an_unknown_job_on_a_worker_with_15000_handlers_parks_a_short_reason_and_the_next_10_run(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let calls = Arc::new(AtomicUsize::new(0));
    // No wait for a worker with the unknown job's handler: parked at once.
    let mut builder = env.worker().unhandled_wait(Duration::ZERO);
    for i in 0..15_000 {
        builder = builder.handle(format!("job-{i:05}"), counting(&calls));
    }
    let running = env.start(builder.build().unwrap());

    let unknown = env.submit("no-such-job", Value::Null).await;
    let parked = take_parked(&env, 1).await;
    let why = reason(&parked[0]);
    // A header the broker took (100 KB, under its frame_max) comes back cut in the parked copy,
    // so the copy plus the worker's own headers cannot go over the frame_max either.
    let forged = env.insert_run("no-such-job", &Value::Null).await;
    let mut huge = FieldTable::default();
    huge.insert(
        "x-forged".into(),
        AMQPValue::LongString("f".repeat(100_000).into()),
    );
    let trigger = env.trigger(forged, "no-such-job", Value::Null).await;
    env.publish_with_headers(&trigger, huge).await;
    let copy = take_parked(&env, 1).await.remove(0);
    let kept = header(&copy, "x-forged").unwrap();
    assert!(kept.len() <= MAX_HEADER_VALUE_BYTES, "{} bytes", kept.len());
    assert!(kept.ends_with("…[truncated]"));
    assert_eq!(reason(&copy), why);
    assert!(why.starts_with("unknown job `no-such-job`"), "{why}");
    assert!(why.contains("`job-00000`, `job-00001`"), "{why}");
    assert!(why.ends_with("and 14980 more"), "{why}");
    assert!(why.len() <= MAX_HEADER_VALUE_BYTES, "{} bytes", why.len());
    assert_eq!(env.run_in_state(unknown, "dead").await.reason, Some(why));

    let mut runs = Vec::new();
    for i in 0..10 {
        runs.push(env.submit(&format!("job-{i:05}"), Value::Null).await);
    }
    for run in runs {
        env.run_in_state(run, "succeeded").await;
    }
    assert_eq!(calls.load(SeqCst), 10);
    running.stop().await;
    // The connection never broke: no consumer was lost, nothing recovered.
    let said = events.take_new();
    assert!(
        !said
            .iter()
            .any(|m| m.contains("lost the work queue consumer")
                || m.contains("AMQP connection recovered")
                || m.contains("waiting for recovery")),
        "{said:#?}"
    );
    env.cleanup().await;
}

/// Every forged field that once changed a real run, or ran it, or panicked the worker, on
/// messages naming one real queued run: each is parked with its own reason, the handler never
/// runs for them, and the run's genuine trigger then runs it as attempt 1, once.
#[sqlx::test(migrations = "../migrations")]
async fn forged_triggers_naming_a_real_run_are_parked_and_leave_it_to_its_genuine_trigger(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .handle("real", counting(&calls))
        .handle("other", counting(&calls))
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.insert_run("real", &Value::Null).await;
    let genuine = env.trigger(run_id, "real", Value::Null).await;
    let year_3000_ms = 32_503_680_000_000_i64;

    let mut forged_job = genuine.clone();
    forged_job.job = "no-such-job".into();
    let mut handled_job = genuine.clone();
    handled_job.job = "other".into();
    let mut forged_group = genuine.clone();
    forged_group.group = "payments".into();
    let mut huge_attempt = genuine.clone();
    huge_attempt.attempt = u32::MAX;
    let mut skipping = genuine.clone();
    skipping.attempt = 3;
    skipping.retry = Some(policy(5, 1_000, 2.0, 60_000));
    let mut absurd = genuine.clone();
    // `retry = { initial = "300000years", max = "300000years" }`: once a panic at
    // `DateTime + TimeDelta` after the first failure, with the run left `running`.
    let years = 300_000 * 365 * 86_400_000_u64;
    absurd.retry = Some(policy(3, years, 2.0, years));
    let headers = |name: &str, value: i64| {
        let mut h = FieldTable::default();
        h.insert(name.into(), AMQPValue::LongLongInt(value));
        h
    };
    let cases: Vec<(&chime_protocol::Trigger, FieldTable, &str)> = vec![
        (
            &forged_job,
            FieldTable::default(),
            "unknown job `no-such-job`",
        ),
        (
            &handled_job,
            FieldTable::default(),
            "it names job `other` for run",
        ),
        (
            &forged_group,
            FieldTable::default(),
            "it names group `payments`",
        ),
        (
            &huge_attempt,
            FieldTable::default(),
            "attempt is 4294967295",
        ),
        (&skipping, FieldTable::default(), "whose next attempt is 1"),
        (
            &absurd,
            FieldTable::default(),
            "retry.initial_ms is 9460800000000000 ms",
        ),
        (
            &genuine,
            headers("x-delivery-count", 50),
            "x-delivery-count 50 on a first delivery",
        ),
        (
            &genuine,
            headers(HEADER_NOT_BEFORE, year_3000_ms),
            "x-chime-not-before 32503680000000 (3000-01-01T00:00:00+00:00) is further ahead",
        ),
    ];
    for (trigger, headers, _) in &cases {
        env.publish_with_headers(trigger, headers.clone()).await;
    }
    // An oversized body that is otherwise the genuine trigger.
    let mut body = genuine.to_body();
    body.resize(MAX_TRIGGER_BYTES + 1, b' ');
    let mut attempt = FieldTable::default();
    attempt.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(1));
    env.publish_raw(&body, Some(run_id), attempt).await;

    let parked = take_parked(&env, cases.len() as u32 + 1).await;
    let reasons: Vec<String> = parked.iter().map(reason).collect();
    for (_, _, want) in &cases {
        assert!(
            reasons.iter().any(|r| r.contains(want)),
            "no parked reason contains {want:?}: {reasons:#?}"
        );
    }
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with(&format!("message body is {} bytes", MAX_TRIGGER_BYTES + 1))),
        "{reasons:#?}"
    );
    let run = env.run(run_id).await;
    assert_eq!((run.state.as_str(), run.attempt), ("queued", 0), "{run:?}");
    assert!(env.attempts(run_id).await.is_empty());
    assert_eq!(calls.load(SeqCst), 0, "no forged message ran");

    env.publish(&genuine).await;
    let run = env.run_in_state(run_id, "succeeded").await;
    assert_eq!(run.attempt, 1);
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

/// A handler that panics while its future is being built (in the closure itself, or in its
/// params' `Deserialize`) once panicked the delivery's task, leaving the run `running` on a
/// live, heartbeating worker forever. Now it is a handler panic like any other.
#[sqlx::test(migrations = "../migrations")]
async fn a_handler_panicking_before_its_future_exists_is_recorded_not_stuck_running(pool: PgPool) {
    let env = Env::new(pool).await;
    let worker = env
        .worker()
        .handle("eager", |_: JobContext, params: Value| -> CallFuture {
            if params.is_null() {
                panic!("no params at all");
            }
            Box::pin(async { Ok(()) })
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.submit("eager", Value::Null).await;
    let run = env.run_in_state(run_id, "dead").await;
    assert_eq!(
        run.reason.as_deref(),
        Some("attempts exhausted (1 of 1): handler panicked: no params at all")
    );
    let attempts = env.attempts(run_id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, "failed");
    let parked = take_parked(&env, 1).await;
    assert!(reason(&parked[0]).ends_with("handler panicked: no params at all"));
    running.stop().await;
    env.cleanup().await;
}

/// The last delivery the broker really allows (five requeues before, so the broker's
/// `x-delivery-count` is 5 and its redelivered flag set) still ends the run dead without
/// running it; the same count forged on a first delivery does not (see the test above).
#[sqlx::test(migrations = "../migrations")]
async fn the_last_delivery_the_broker_really_allows_ends_the_run_dead_and_parked(pool: PgPool) {
    let env = Env::new(pool).await;
    let run_id = env.submit("victim", Value::Null).await;
    for _ in 0..5 {
        let got = wait_for(WAIT, "the trigger back in the work queue", || async {
            env.channel
                .basic_get(
                    env.topology.work_queue().as_str().into(),
                    BasicGetOptions { no_ack: false },
                )
                .await
                .unwrap()
        })
        .await;
        got.delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            })
            .await
            .unwrap();
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .handle("victim", counting(&calls))
        .build()
        .unwrap();
    let running = env.start(worker);
    let run = env.run_in_state(run_id, "dead").await;
    let why = run.reason.unwrap();
    assert!(why.starts_with("delivery limit reached: "), "{why}");
    assert!(why.contains("delivered 6 times"), "{why}");
    let parked = take_parked(&env, 1).await;
    assert_eq!(reason(&parked[0]), why);
    running.stop().await;
    assert_eq!(
        calls.load(SeqCst),
        0,
        "not run: it may be what crashes workers"
    );
    env.cleanup().await;
}
