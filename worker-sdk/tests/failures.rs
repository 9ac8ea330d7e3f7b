//! Failure handling in the worker against real PostgreSQL and RabbitMQ: retries through the
//! delay tiers (timing, exhaustion, the handler's own delay, exactness between tiers, a retry
//! whose publish fails), timeouts, operators' cancels, taking over from a lost worker with
//! fenced late outcomes, and early acks of long handlers (the last delivery the broker allows is
//! in `hostile.rs`, next to its forged twin).
//!
//! Same environment as `worker.rs`: `DATABASE_URL` and RabbitMQ at `AMQP_URL`; every test has its
//! own database, prefix and group, and deletes its queues at the end.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use chime_protocol::topology::RETRY_TIERS;
use chime_protocol::wire::{HEADER_ATTEMPT, HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_NOT_BEFORE};
use chime_test_kit::{capture_logs, wait_for};
use chime_worker::{JobContext, JobError};
use chrono::Utc;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;
use sqlx::PgPool;
use support::{Env, WAIT, header, policy};
use tokio::sync::{Notify, mpsc};

/// Milliseconds between two instants.
fn ms(from: chrono::DateTime<Utc>, to: chrono::DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds()
}

/// Waits for the parking lot to hold `n` messages.
async fn parked(env: &Env, n: u32) {
    let parking = env.topology.parking_queue();
    wait_for(WAIT, &format!("{n} parked messages"), || {
        let parking = parking.clone();
        async move { (env.queue_state(&parking).await.0 == n).then_some(()) }
    })
    .await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_handler_failing_twice_then_succeeding_is_retried_after_one_then_two_seconds(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let worker = env
        .worker()
        .handle("flaky", |ctx: JobContext, _: Value| async move {
            if ctx.attempt() < 3 {
                return Err(JobError::retry(format!("failure {}", ctx.attempt())));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let running = env.start(worker);

    let run_id = env.insert_run("flaky", &Value::Null).await;
    let mut trigger = env.trigger(run_id, "flaky", Value::Null).await;
    trigger.retry = Some(policy(3, 1_000, 2.0, 60_000));
    env.publish(&trigger).await;

    let run = env.run_in_state(run_id, "succeeded").await;
    assert_eq!(run.attempt, 3);
    assert_eq!(run.error, None);
    assert_eq!(run.next_attempt_at, None);
    let attempts = env.attempts(run_id).await;
    let states: Vec<&str> = attempts.iter().map(|a| a.state.as_str()).collect();
    assert_eq!(states, ["failed", "failed", "succeeded"]);
    assert_eq!(attempts[0].error.as_deref(), Some("failure 1"));
    assert_eq!(attempts[1].error.as_deref(), Some("failure 2"));

    let start_to_start = [
        ms(attempts[0].started_at, attempts[1].started_at),
        ms(attempts[1].started_at, attempts[2].started_at),
    ];
    let failure_to_start = [
        ms(attempts[0].finished_at.unwrap(), attempts[1].started_at),
        ms(attempts[1].finished_at.unwrap(), attempts[2].started_at),
    ];
    println!(
        "backoff 1 s × 2, no jitter: attempts started {} ms and {} ms apart; \
         {} ms and {} ms after the failures",
        start_to_start[0], start_to_start[1], failure_to_start[0], failure_to_start[1]
    );
    for (measured, want) in start_to_start.into_iter().zip([1_000, 2_000]) {
        assert!(
            (want - 300..=want + 300).contains(&measured),
            "{measured} ms between attempts, expected {want} ± 300"
        );
    }
    for (measured, want) in failure_to_start.into_iter().zip([1_000, 2_000]) {
        assert!(
            measured >= want - 5,
            "attempt started {measured} ms after the failure, before its {want} ms delay"
        );
    }

    // The worker declared the delay tiers these waits went through, and no others.
    let mut declared = Vec::new();
    for tier in &RETRY_TIERS {
        if env.queue_exists(&env.topology.retry_queue(tier)).await {
            declared.push(tier.name);
        }
    }
    assert!(
        declared.contains(&"1s") || declared.contains(&"500ms"),
        "a 1 s wait went through a tier: {declared:?}"
    );
    assert!(
        !declared.iter().any(|t| ["5s", "1m", "1h"].contains(t)),
        "tiers longer than any wait of this run were declared: {declared:?}"
    );

    running.stop().await;
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn exhausted_retries_park_the_message_with_the_reason_and_the_run_is_dead(pool: PgPool) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = env
        .worker()
        .handle("doomed", move |_: JobContext, _: Value| {
            counted.fetch_add(1, SeqCst);
            async { Err::<(), _>(JobError::retry("upstream said 503")) }
        })
        .build()
        .unwrap();
    let worker_id = worker.id().to_owned();
    let running = env.start(worker);
    let run_id = env.insert_run("doomed", &Value::Null).await;
    let mut trigger = env.trigger(run_id, "doomed", Value::Null).await;
    trigger.retry = Some(policy(3, 250, 1.0, 1_000));
    env.publish(&trigger).await;

    let run = env.run_in_state(run_id, "dead").await;
    let reason = "attempts exhausted (3 of 3): upstream said 503";
    assert_eq!(run.reason.as_deref(), Some(reason));
    assert_eq!(run.error.as_deref(), Some("upstream said 503"));
    assert_eq!(run.attempt, 3);
    assert!(run.finished_at.is_some());
    let states: Vec<String> = env
        .attempts(run_id)
        .await
        .into_iter()
        .map(|a| a.state)
        .collect();
    assert_eq!(states, ["failed", "failed", "failed"]);

    parked(&env, 1).await;
    let message = env.take_parked().await.unwrap();
    assert_eq!(
        header(&message, HEADER_DEAD_REASON).as_deref(),
        Some(reason)
    );
    assert_eq!(
        header(&message, HEADER_DEAD_BY).as_deref(),
        Some(worker_id.as_str())
    );
    let body = chime_protocol::Trigger::from_body(&message.data).unwrap();
    assert_eq!(
        (body.run_id, body.attempt),
        (run_id, 3),
        "the last attempt's trigger is parked"
    );
    assert_eq!(
        message
            .properties
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .get(HEADER_ATTEMPT),
        Some(&AMQPValue::LongUInt(3))
    );

    running.stop().await;
    assert_eq!(calls.load(SeqCst), 3);
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_handlers_retry_after_replaces_the_policys_delay(pool: PgPool) {
    let env = Env::new(pool).await;
    let worker = env
        .worker()
        .handle("polite", |ctx: JobContext, _: Value| async move {
            if ctx.attempt() == 1 {
                return Err(JobError::retry_after(
                    Duration::from_millis(600),
                    "rate limited",
                ));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.insert_run("polite", &Value::Null).await;
    let mut trigger = env.trigger(run_id, "polite", Value::Null).await;
    // The policy alone would wait a minute.
    trigger.retry = Some(policy(2, 60_000, 2.0, 600_000));
    env.publish(&trigger).await;

    env.run_in_state(run_id, "succeeded").await;
    let attempts = env.attempts(run_id).await;
    let waited = ms(attempts[0].finished_at.unwrap(), attempts[1].started_at);
    println!("retry_after 600 ms: attempt 2 started {waited} ms after attempt 1 failed");
    assert!((595..900).contains(&waited), "{waited} ms");
    running.stop().await;
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_delay_between_tiers_is_served_by_hops_and_a_short_hold_exact_to_a_few_ms(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let worker = env
        .worker()
        .handle("punctual", |_: JobContext, _: Value| async { Ok(()) })
        .build()
        .unwrap();
    let running = env.start(worker);
    // 1.7 s: through the 1 s tier, then the 500 ms tier, then a ~200 ms hold in memory.
    let run_id = env.insert_run("punctual", &Value::Null).await;
    let trigger = env.trigger(run_id, "punctual", Value::Null).await;
    let due = Utc::now() + chrono::Duration::milliseconds(1_700);
    let mut headers = FieldTable::default();
    headers.insert(
        HEADER_NOT_BEFORE.into(),
        AMQPValue::LongLongInt(due.timestamp_millis()),
    );
    env.publish_with_headers(&trigger, headers).await;

    env.run_in_state(run_id, "succeeded").await;
    events
        .wait_for_count(
            WAIT,
            "two hops through a delay tier",
            |m| m.starts_with("retry not due yet; sent through another delay tier"),
            2,
        )
        .await;
    let started = env.attempts(run_id).await[0].started_at;
    let late = ms(due, started);
    println!("due in 1.7 s (2 tier hops and a hold): started {late} ms after its due instant");
    assert!(
        (0..60).contains(&late),
        "started {late} ms after its due instant"
    );
    running.stop().await;
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_retry_whose_publish_fails_is_published_by_the_redelivery_of_the_original(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let worker = env
        .worker()
        .handle("once-more", |ctx: JobContext, _: Value| async move {
            if ctx.attempt() == 1 {
                return Err(JobError::retry("first try fails"));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let warmup = env.insert_run("once-more", &Value::Null).await;
    let mut trigger = env.trigger(warmup, "once-more", Value::Null).await;
    trigger.retry = Some(policy(2, 1_000, 2.0, 60_000));
    env.publish(&trigger).await;
    env.run_in_state(warmup, "succeeded").await; // topology declared by the worker

    // A delay tier that cannot be declared (here: queues of the tiers' names with other
    // arguments, as an operator's mistake would leave them) fails the retry's publish: nothing
    // is acked.
    for tier in &RETRY_TIERS {
        let queue = env.topology.retry_queue(tier);
        env.channel
            .queue_delete(
                queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await
            .unwrap();
        env.channel
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let run_id = env.insert_run("once-more", &Value::Null).await;
    trigger.run_id = run_id;
    env.publish(&trigger).await;
    events
        .wait_for_message(
            WAIT,
            "cannot publish the retry; requeueing the original so that its redelivery publishes \
         the retry again",
        )
        .await;
    let run = env.run(run_id).await;
    assert_eq!((run.state.as_str(), run.attempt), ("retrying", 1));
    assert!(run.next_attempt_at.is_some());

    // The requeued original comes back once the 1 s delay has passed: its retry is published
    // again, straight to the work queue, and attempt 2 runs once.
    events
        .wait_for_message(
            WAIT,
            "the run's retry may not have been published; publishing it again",
        )
        .await;
    env.run_in_state(run_id, "succeeded").await;
    let states: Vec<String> = env
        .attempts(run_id)
        .await
        .into_iter()
        .map(|a| a.state)
        .collect();
    assert_eq!(states, ["failed", "succeeded"]);
    running.stop().await;
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_timed_out_attempt_is_retried_under_the_policy(pool: PgPool) {
    let env = Env::new(pool).await;
    let worker = env
        .worker()
        .handle("slow-then-fast", |ctx: JobContext, _: Value| async move {
            if ctx.attempt() == 1 {
                ctx.cancelled().await;
                return Err(JobError::cancel("saw the token"));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.insert_run("slow-then-fast", &Value::Null).await;
    let mut trigger = env.trigger(run_id, "slow-then-fast", Value::Null).await;
    trigger.timeout_ms = Some(200);
    trigger.retry = Some(policy(2, 250, 2.0, 60_000));
    env.publish(&trigger).await;

    env.run_in_state(run_id, "succeeded").await;
    let attempts = env.attempts(run_id).await;
    let states: Vec<&str> = attempts.iter().map(|a| a.state.as_str()).collect();
    assert_eq!(states, ["timed_out", "succeeded"]);
    assert_eq!(
        attempts[0].error.as_deref(),
        Some("timed out after 200ms; handler returned: saw the token")
    );
    let ran = attempts[0].duration_ms.unwrap();
    assert!((200..1_000).contains(&ran), "{ran} ms");
    running.stop().await;
    env.cleanup().await;
}

/// Sets a flag when dropped: shows that an abandoned handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_handler_ignoring_its_timeout_is_abandoned_after_the_grace_and_frees_its_slot(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (flag, done) = (dropped.clone(), finished.clone());
    let worker = env
        .worker()
        .capacity(1)
        .cancel_grace(Duration::from_millis(300))
        .handle("stubborn", move |_: JobContext, _: Value| {
            let (guard, done) = (DropFlag(flag.clone()), done.clone());
            async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_secs(60)).await;
                done.store(true, SeqCst);
                Ok(())
            }
        })
        .handle("quick", |_: JobContext, _: Value| async { Ok(()) })
        .build()
        .unwrap();
    let running = env.start(worker);
    let stubborn = env.insert_run("stubborn", &Value::Null).await;
    let mut trigger = env.trigger(stubborn, "stubborn", Value::Null).await;
    trigger.timeout_ms = Some(200);
    env.publish(&trigger).await;
    // Capacity 1: this one runs only once the stubborn handler's slot is released.
    let quick = env.submit("quick", Value::Null).await;

    let run = env.run_in_state(stubborn, "dead").await;
    let error = run.error.unwrap();
    assert_eq!(
        error,
        "timed out after 200ms; handler did not stop within 300ms of its cancellation and was \
         abandoned"
    );
    let attempt = &env.attempts(stubborn).await[0];
    assert_eq!(attempt.state, "timed_out");
    let held = attempt.duration_ms.unwrap();
    assert!((500..2_000).contains(&held), "slot held {held} ms");
    env.run_in_state(quick, "succeeded").await;
    let quick_started = env.attempts(quick).await[0].started_at;
    let freed_after = ms(attempt.started_at, quick_started);
    println!(
        "ignoring handler: timeout 200 ms + grace 300 ms; next run started after {freed_after} ms"
    );
    assert!(freed_after < 2_000, "{freed_after} ms");
    assert!(dropped.load(SeqCst), "the abandoned handler was aborted");
    assert!(!finished.load(SeqCst));
    running.stop().await;
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_control_message_cancels_a_running_run_without_retry(pool: PgPool) {
    let env = Env::new(pool).await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let worker = env
        .worker()
        .capacity(2)
        .cancel_grace(Duration::from_millis(300))
        .handle("cooperative", {
            let started_tx = started_tx.clone();
            move |ctx: JobContext, _: Value| {
                let started_tx = started_tx.clone();
                async move {
                    started_tx.send(ctx.run_id()).unwrap();
                    ctx.cancelled().await;
                    // Even a retryable error: an operator's cancel is final.
                    Err(JobError::retry("stopped early"))
                }
            }
        })
        .handle("deaf", move |ctx: JobContext, _: Value| {
            let started_tx = started_tx.clone();
            async move {
                started_tx.send(ctx.run_id()).unwrap();
                std::future::pending::<()>().await;
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let mut runs = Vec::new();
    for job in ["cooperative", "deaf"] {
        let run_id = env.insert_run(job, &Value::Null).await;
        let mut trigger = env.trigger(run_id, job, Value::Null).await;
        trigger.retry = Some(policy(3, 250, 2.0, 60_000));
        env.publish(&trigger).await;
        runs.push(run_id);
    }
    for _ in 0..2 {
        tokio::time::timeout(WAIT, started.recv()).await.unwrap();
    }
    for run_id in &runs {
        env.cancel(*run_id).await;
    }
    let errors = [
        "cancelled by an operator; handler returned: stopped early",
        "cancelled by an operator; handler did not stop within 300ms of its cancellation and was \
         abandoned",
    ];
    for (run_id, error) in runs.iter().zip(errors) {
        let run = env.run_in_state(*run_id, "cancelled").await;
        assert_eq!(run.error.as_deref(), Some(error));
        let attempts = env.attempts(*run_id).await;
        assert_eq!(attempts.len(), 1, "not retried");
        assert_eq!(attempts[0].state, "cancelled");
    }
    running.stop().await;
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    assert_eq!(env.queue_state(&env.topology.parking_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_claim_refuses_a_run_whose_cancel_was_requested(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = env
        .worker()
        .handle("never", move |_: JobContext, _: Value| {
            counted.fetch_add(1, SeqCst);
            async { Ok(()) }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.insert_run("never", &Value::Null).await;
    env.request_cancel(run_id).await;
    let trigger = env.trigger(run_id, "never", Value::Null).await;
    env.publish(&trigger).await;
    events
        .wait_for_message(
            WAIT,
            "an operator cancelled the run before it started; acked without running",
        )
        .await;
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 0);
    assert!(env.attempts(run_id).await.is_empty());
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_run_of_a_lost_worker_is_taken_over_and_its_late_outcome_is_discarded(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let release = Arc::new(Notify::new());
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let make = |release: Arc<Notify>, started_tx: mpsc::UnboundedSender<(u32, String)>| {
        move |ctx: JobContext, _: Value| {
            let (release, started_tx) = (release.clone(), started_tx.clone());
            async move {
                started_tx
                    .send((ctx.attempt(), ctx.job().to_owned()))
                    .unwrap();
                if ctx.attempt() == 1 {
                    release.notified().await; // hangs until the test lets it go
                }
                Ok(())
            }
        }
    };
    // No hold budget: the prefetch is the one handler slot, so while a's handler hangs the
    // broker sends the copy to b.
    let a = env
        .worker()
        .capacity(1)
        .hold(0)
        .handle("hang", make(release.clone(), started_tx.clone()))
        .build()
        .unwrap();
    let b = env
        .worker()
        .capacity(1)
        .hold(0)
        .handle("hang", make(release.clone(), started_tx.clone()))
        .build()
        .unwrap();
    let (a, b) = (env.start(a), env.start(b));
    let run_id = env.insert_run("hang", &Value::Null).await;
    let mut trigger = env.trigger(run_id, "hang", Value::Null).await;
    // A lost attempt counts: without attempts left the run would end dead instead.
    trigger.retry = Some(policy(3, 1_000, 2.0, 60_000));
    env.publish(&trigger).await;
    assert_eq!(
        tokio::time::timeout(WAIT, started.recv())
            .await
            .unwrap()
            .unwrap()
            .0,
        1
    );
    // Its worker is judged lost (as if its heartbeat had stopped); a copy of the trigger reaches
    // the other worker (the hung one's only slot is taken).
    let hung = env.run(run_id).await.worker_id.unwrap();
    sqlx::query("UPDATE chime_workers SET stopped_at = now() WHERE id = $1")
        .bind(&hung)
        .execute(&env.pool)
        .await
        .unwrap();
    env.publish(&trigger).await;

    let run = env.run_in_state(run_id, "succeeded").await;
    assert_eq!(run.attempt, 2);
    assert_ne!(run.worker_id.as_deref(), Some(hung.as_str()));
    // The hung handler finishes now; its outcome must not overwrite anything.
    release.notify_one();
    events
        .wait_for_message(
            WAIT,
            "late outcome discarded: the attempt is no longer running on this worker in the \
         database (already recorded, or recorded lost and taken over while this worker was \
         judged lost)",
        )
        .await;
    let attempts = env.attempts(run_id).await;
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        (attempts[0].state.as_str(), attempts[0].worker_id.as_str()),
        ("lost", hung.as_str())
    );
    let lost_error = attempts[0].error.clone().unwrap();
    assert!(
        lost_error.starts_with(&format!("worker {hung} was lost")),
        "{lost_error}"
    );
    assert_eq!(attempts[1].state, "succeeded");
    assert_eq!(env.run(run_id).await.state, "succeeded");
    a.stop().await;
    b.stop().await;
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_long_handler_has_its_delivery_acked_early_and_finishes_once(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = env
        .worker()
        .ack_after(Duration::from_millis(300))
        .handle("long", move |_: JobContext, _: Value| {
            counted.fetch_add(1, SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                Ok(())
            }
        })
        .build()
        .unwrap();
    let connection_name = format!("chime-worker-{}", worker.id());
    let running = env.start(worker);
    let run_id = env.submit("long", Value::Null).await;
    events
        .wait_for_one(WAIT, "the early ack", |m| {
            m.starts_with("handler still running: acked its delivery early")
        })
        .await;
    // Acked: losing the connection now redelivers nothing.
    close_connection(&connection_name).await;
    env.run_in_state(run_id, "succeeded").await;
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(env.attempts(run_id).await.len(), 1);
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

/// Closes the broker connection named `name` with `rabbitmqctl` (RabbitMQ runs here).
async fn close_connection(name: &str) {
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        let run = |args: &[&str]| {
            let out = std::process::Command::new("rabbitmqctl")
                .args(args)
                .output()
                .expect("rabbitmqctl");
            assert!(out.status.success(), "rabbitmqctl {args:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let listing = run(&[
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ]);
        let pid = listing
            .lines()
            .find(|line| line.contains(&name))
            .and_then(|line| line.split('\t').next())
            .unwrap_or_else(|| panic!("connection {name} in {listing}"))
            .to_owned();
        run(&["close_connection", &pid, "test: forced close"]);
    })
    .await
    .unwrap();
}
