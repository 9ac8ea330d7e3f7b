//! The worker against real PostgreSQL and RabbitMQ: claim, execute, record, ack; duplicates,
//! dead letters, outcomes, bounded concurrency, drain, and channel/connection loss.
//!
//! Needs `DATABASE_URL` (a role that may create databases; `#[sqlx::test]` gives every test a
//! fresh one) and RabbitMQ at `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//! Every test declares its own prefix and group and deletes them at the end.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use chime_protocol::wire::{HEADER_ATTEMPT, HEADER_DEAD_BY, HEADER_DEAD_REASON};
use chime_test_kit::{capture_logs, wait_for};
use chime_worker::{JobContext, JobError};
use lapin::types::FieldTable;
use serde_json::{Value, json};
use sqlx::PgPool;
use support::{Env, WAIT, header};
use tokio::sync::{Notify, mpsc};

#[derive(serde::Deserialize)]
struct Greet {
    name: String,
}

/// A handler that counts its invocations and logs two lines.
fn greeter(
    calls: &Arc<AtomicUsize>,
) -> impl Fn(JobContext, Greet) -> std::pin::Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>
+ Send
+ Sync
+ 'static {
    let calls = calls.clone();
    move |ctx: JobContext, p: Greet| {
        let calls = calls.clone();
        Box::pin(async move {
            calls.fetch_add(1, SeqCst);
            ctx.log().info(format!("hello, {}", p.name));
            ctx.log().warn(format!(
                "run {} attempt {} scheduled {}",
                ctx.run_id(),
                ctx.attempt(),
                ctx.scheduled_at().to_rfc3339()
            ));
            Ok(())
        })
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_trigger_is_claimed_executed_once_recorded_and_acked(pool: PgPool) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .capacity(3)
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let worker_id = worker.id().to_owned();
    let running = env.start(worker);

    let run_id = env.submit("greet", json!({"name": "Ada"})).await;
    let run = env.run_in_state(run_id, "succeeded").await;
    assert_eq!(run.attempt, 1);
    assert_eq!(run.worker_id.as_deref(), Some(worker_id.as_str()));
    assert_eq!(run.error, None);
    let (started, finished) = (run.started_at.unwrap(), run.finished_at.unwrap());
    assert!(started <= finished);

    let attempts = env.attempts(run_id).await;
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!(
        (a.attempt, a.state.as_str(), a.worker_id.as_str()),
        (1, "succeeded", worker_id.as_str())
    );
    assert_eq!(a.started_at, started);
    assert_eq!(a.finished_at, Some(finished));
    let duration_ms = a.duration_ms.unwrap();
    assert!(duration_ms >= 0);
    assert_eq!((finished - started).num_milliseconds(), duration_ms);
    assert_eq!(a.error, None);

    let scheduled = env.scheduled_at(run_id).await.to_rfc3339();
    assert_eq!(
        env.logs(run_id).await,
        [
            (1, "info".to_owned(), "hello, Ada".to_owned()),
            (
                1,
                "warn".to_owned(),
                format!("run {run_id} attempt 1 scheduled {scheduled}")
            ),
        ]
    );

    // The registry row exists and its heartbeat moves.
    let (capacity, jobs): (i32, Vec<String>) =
        sqlx::query_as("SELECT capacity, jobs FROM chime_workers WHERE id = $1")
            .bind(&worker_id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!((capacity, jobs), (3, vec!["greet".to_owned()]));
    let pool = &env.pool;
    let id = worker_id.as_str();
    wait_for(WAIT, "a heartbeat after registration", || async move {
        sqlx::query_scalar::<_, bool>(
            "SELECT heartbeat_at > started_at FROM chime_workers WHERE id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
        .then_some(())
    })
    .await;

    running.stop().await;
    assert_eq!(calls.load(SeqCst), 1);
    // Acked: after the worker's connection closed nothing came back to the queue.
    assert_eq!(env.queue_state(&env.topology.work_queue()).await, (0, 0));
    let stopped: bool =
        sqlx::query_scalar("SELECT stopped_at IS NOT NULL FROM chime_workers WHERE id = $1")
            .bind(&worker_id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(stopped, "stopped_at is set on exit");
    env.cleanup().await;
}

/// Several broker addresses with a dead one first: the worker connects to the next one and
/// runs the trigger (`chime_protocol::addresses`, the scheduler's rule too).
#[sqlx::test(migrations = "../migrations")]
async fn a_worker_given_a_dead_address_first_connects_to_the_next_and_runs(pool: PgPool) {
    let env = Env::new(pool).await;
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .amqp_urls([
            format!("amqp://guest:guest@127.0.0.1:{dead}/%2f"),
            env.amqp_url.clone(),
        ])
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.submit("greet", json!({"name": "Ada"})).await;
    env.run_in_state(run_id, "succeeded").await;
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 1);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_trigger_delivered_three_times_executes_once(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let run_id = env.insert_run("greet", &json!({"name": "Bo"})).await;
    let trigger = env.trigger(run_id, "greet", json!({"name": "Bo"})).await;
    // Two copies before the worker starts: delivered together, handled concurrently.
    env.publish(&trigger).await;
    env.publish(&trigger).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let running = env.start(worker);
    env.run_in_state(run_id, "succeeded").await;

    // A third copy after the run finished (a confirmed publish the scheduler did not mark).
    env.publish(&trigger).await;
    // Both extra copies acked unexecuted: the concurrent one by the in-flight guard or the
    // claim, the late one by the claim.
    events
        .wait_for_count(WAIT, "two duplicates", |m| m.starts_with("duplicate"), 2)
        .await;
    running.stop().await;

    assert_eq!(calls.load(SeqCst), 1, "the handler ran once");
    assert_eq!(env.attempts(run_id).await.len(), 1);
    assert_eq!(env.logs(run_id).await.len(), 2);
    assert_eq!(env.run(run_id).await.state, "succeeded");
    assert_eq!(
        env.queue_state(&env.topology.work_queue()).await.0,
        0,
        "all copies acked"
    );
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn malformed_and_unknown_job_messages_are_parked_and_the_worker_keeps_consuming(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let garbage_run = env.insert_run("greet", &Value::Null).await;
    env.publish_raw(b"{not json", Some(garbage_run), FieldTable::default())
        .await;
    let unknown_run = env.submit("no-such-job", json!({"x": 1})).await;
    let good_run = env.submit("greet", json!({"name": "Cy"})).await;

    let calls = Arc::new(AtomicUsize::new(0));
    // Capacity 1: the good trigger is handled only after both bad ones. No wait for a worker
    // with the unknown job's handler: parked at once (the wait has its own tests below).
    let worker = env
        .worker()
        .capacity(1)
        .unhandled_wait(Duration::ZERO)
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let worker_id = worker.id().to_owned();
    let running = env.start(worker);

    env.run_in_state(good_run, "succeeded").await;
    let unknown = env.run_in_state(unknown_run, "dead").await;
    let reason = unknown.reason.unwrap();
    assert!(reason.starts_with("unknown job `no-such-job`"), "{reason}");
    assert!(reason.contains("has handlers for `greet`"), "{reason}");
    assert_eq!(unknown.error.as_deref(), Some(reason.as_str()));

    let parking = env.topology.parking_queue();
    let env_ref = &env;
    wait_for(WAIT, "two parked messages", || {
        let parking = parking.clone();
        async move { (env_ref.queue_state(&parking).await.0 == 2).then_some(()) }
    })
    .await;
    let parked = [
        env.take_parked().await.unwrap(),
        env.take_parked().await.unwrap(),
    ];
    let by_id = |run_id: i64| {
        parked
            .iter()
            .find(|d| {
                d.properties.message_id().as_ref().map(|m| m.as_str()) == Some(&run_id.to_string())
            })
            .unwrap_or_else(|| panic!("parked message of run {run_id}"))
    };
    let g = by_id(garbage_run);
    assert_eq!(g.data, b"{not json");
    assert!(
        header(g, HEADER_DEAD_REASON)
            .unwrap()
            .starts_with("message body is not a Chime trigger")
    );
    assert_eq!(
        header(g, HEADER_DEAD_BY).as_deref(),
        Some(worker_id.as_str())
    );
    let u = by_id(unknown_run);
    assert_eq!(
        header(u, HEADER_DEAD_REASON).as_deref(),
        Some(reason.as_str())
    );
    assert_eq!(
        header(u, HEADER_DEAD_BY).as_deref(),
        Some(worker_id.as_str())
    );
    assert!(
        u.properties
            .headers()
            .as_ref()
            .unwrap()
            .contains_key(HEADER_ATTEMPT),
        "original headers are kept"
    );
    assert_eq!(u.properties.delivery_mode(), &Some(2));

    running.stop().await;
    assert_eq!(calls.load(SeqCst), 1);
    assert_eq!(
        env.queue_state(&env.topology.work_queue()).await.0,
        0,
        "originals acked"
    );
    assert!(env.attempts(unknown_run).await.is_empty());
    // Nothing vouches for the run id of a body that does not decode (its message id), so that
    // run is left as it is: garbage must not be able to end a real run.
    assert_eq!(env.run(garbage_run).await.state, "queued");
    env.cleanup().await;
}

/// The run's reason while it waits for a worker with its job's handler, once it is set.
async fn waiting_reason(env: &Env, run_id: i64) -> String {
    wait_for(
        WAIT,
        "the run to say it waits for a worker",
        || async move {
            env.run(run_id)
                .await
                .reason
                .filter(|r| r.starts_with("no worker handles this job (waiting until "))
        },
    )
    .await
}

/// Once: during a rolling deploy, an old worker received the first trigger of a job only the
/// new workers handle and parked it at once ("unknown job"), so the run was dead before a new
/// worker started.
#[sqlx::test(migrations = "../migrations")]
async fn a_run_of_a_job_nobody_handles_waits_queued_and_runs_once_a_worker_with_its_handler_starts(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let calls = Arc::new(AtomicUsize::new(0));
    let old = env
        .worker()
        .unhandled_wait(Duration::from_secs(120))
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let old_running = env.start(old);
    let run_id = env.submit("greet-v2", json!({"name": "Di"})).await;

    // Nobody handles it: it waits, visibly, and stays queued with nothing parked.
    let reason = waiting_reason(&env, run_id).await;
    let until = (env.scheduled_at(run_id).await + chrono::Duration::seconds(120))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(
        reason,
        format!(
            "no worker handles this job (waiting until {until}): no online worker of group `{}` \
             has a handler for `greet-v2`; then it is parked",
            env.group
        )
    );
    let run = env.run(run_id).await;
    assert_eq!(run.state, "queued");
    assert!(env.attempts(run_id).await.is_empty());
    assert_eq!(env.queue_state(&env.topology.parking_queue()).await.0, 0);

    // A new worker with the handler starts: the waiting trigger comes back and runs there.
    let new_calls = Arc::new(AtomicUsize::new(0));
    let new = env
        .worker()
        .handle("greet", greeter(&new_calls))
        .handle("greet-v2", greeter(&new_calls))
        .build()
        .unwrap();
    let new_id = new.id().to_owned();
    let new_running = env.start(new);
    let run = env.run_in_state(run_id, "succeeded").await;
    assert_eq!(run.worker_id.as_deref(), Some(new_id.as_str()));
    assert_eq!(run.reason, None, "the claim clears the waiting reason");

    // With the new worker online, the old one sends each trigger it receives back for it
    // (round-robin gives it about half of them) instead of parking or holding it.
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(env.submit("greet-v2", json!({"name": "Ed"})).await);
    }
    for run in &runs {
        let run = env.run_in_state(*run, "succeeded").await;
        assert_eq!(run.worker_id.as_deref(), Some(new_id.as_str()));
    }
    events
        .wait_for_one(
            WAIT,
            "the unhandled job left to a worker that has it",
            |m| m.contains("another online worker of the group has one"),
        )
        .await;
    old_running.stop().await;
    new_running.stop().await;
    assert_eq!(calls.load(SeqCst), 0, "the old worker ran nothing");
    assert_eq!(new_calls.load(SeqCst), 7, "each run once");
    assert_eq!(env.queue_state(&env.topology.parking_queue()).await.0, 0);
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_run_nobody_handles_is_parked_as_an_unknown_job_once_its_unhandled_wait_passed(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let wait = Duration::from_secs(2);
    let worker = env
        .worker()
        .unhandled_wait(wait)
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let worker_id = worker.id().to_owned();
    let running = env.start(worker);
    let run_id = env.submit("greet-v2", Value::Null).await;

    waiting_reason(&env, run_id).await;
    assert_eq!(env.run(run_id).await.state, "queued");
    let dead = env.run_in_state(run_id, "dead").await;
    let reason = dead.reason.unwrap();
    assert_eq!(
        reason,
        format!(
            "unknown job `greet-v2`: worker `{worker_id}` of group `{}` has handlers for `greet`",
            env.group
        )
    );
    let scheduled = env.scheduled_at(run_id).await;
    let waited = (dead.finished_at.unwrap() - scheduled).to_std().unwrap();
    assert!(
        waited >= wait,
        "parked after {waited:?}, before its wait of {wait:?}"
    );
    let parking = env.topology.parking_queue();
    let env_ref = &env;
    wait_for(WAIT, "the parked copy", || {
        let parking = parking.clone();
        async move { (env_ref.queue_state(&parking).await.0 == 1).then_some(()) }
    })
    .await;
    let parked = env.take_parked().await.unwrap();
    assert_eq!(
        header(&parked, HEADER_DEAD_REASON).as_deref(),
        Some(reason.as_str())
    );
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 0);
    assert!(env.attempts(run_id).await.is_empty());
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_parking_copy_that_is_not_confirmed_keeps_the_original(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .unhandled_wait(Duration::ZERO)
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let running = env.start(worker);
    let first = env.submit("greet", json!({"name": "Hu"})).await;
    env.run_in_state(first, "succeeded").await; // the worker has declared its topology
    // No parking queue now: the copy comes back unroutable (`Ack(Some(returned))`).
    env.channel
        .queue_delete(
            env.topology.parking_queue().as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    let unknown = env.submit("no-such-job", Value::Null).await;
    events
        .wait_for_message(WAIT, "cannot dead-letter the message; requeueing it")
        .await;
    assert_eq!(
        env.run(unknown).await.state,
        "queued",
        "not dead while the copy is unconfirmed"
    );

    // Once the parking lot exists again, the requeued original is parked for real.
    env.topology.declare(&env.channel).await.unwrap();
    env.run_in_state(unknown, "dead").await;
    let parking = env.topology.parking_queue();
    let env_ref = &env;
    wait_for(WAIT, "the parked copy", || {
        let parking = parking.clone();
        async move { (env_ref.queue_state(&parking).await.0 == 1).then_some(()) }
    })
    .await;
    let parked = env.take_parked().await.unwrap();
    assert!(
        header(&parked, HEADER_DEAD_REASON)
            .unwrap()
            .starts_with("unknown job `no-such-job`")
    );
    running.stop().await;
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[derive(Debug, serde::Deserialize)]
struct Batch {
    #[allow(dead_code)]
    size: u32,
}

#[sqlx::test(migrations = "../migrations")]
async fn params_that_do_not_decode_fail_the_run_naming_job_and_field(pool: PgPool) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = env
        .worker()
        .handle("batch", move |_: JobContext, _: Batch| {
            counted.fetch_add(1, SeqCst);
            async { Ok(()) }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let run_id = env.submit("batch", json!({"sise": 10})).await;
    let run = env.run_in_state(run_id, "failed").await;
    let error = run.error.unwrap();
    assert!(
        error.starts_with("params of job `batch` do not decode"),
        "{error}"
    );
    assert!(error.contains("missing field `size`"), "{error}");
    let attempts = env.attempts(run_id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, "failed");
    assert_eq!(attempts[0].error.as_deref(), Some(error.as_str()));
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 0, "the handler never ran");
    env.cleanup().await;
}

#[derive(Debug, thiserror::Error)]
#[error("loading orders")]
struct LoadError(#[source] std::io::Error);

async fn flaky(ctx: JobContext, _: Value) -> Result<(), JobError> {
    ctx.log().info("trying");
    Err(LoadError(std::io::Error::other("connection refused")))?
}

#[sqlx::test(migrations = "../migrations")]
async fn handler_outcomes_are_recorded(pool: PgPool) {
    let env = Env::new(pool).await;
    let worker = env
        .worker()
        .capacity(5)
        .cancel_grace(Duration::from_secs(5))
        .handle("flaky", flaky)
        .handle("refuse", |_: JobContext, _: Value| async {
            Err(JobError::fail("order 7 does not exist"))
        })
        .handle("give-up", |_: JobContext, _: Value| async {
            Err(JobError::cancel("nothing to do today"))
        })
        .handle("boom", |_: JobContext, v: Vec<u8>| async move {
            let _ = v[3];
            Ok(())
        })
        .handle("slow", |ctx: JobContext, _: Value| async move {
            ctx.cancelled().await;
            Err(JobError::cancel("saw the token"))
        })
        .build()
        .unwrap();
    let running = env.start(worker);

    let flaky_run = env.submit("flaky", Value::Null).await;
    let refuse_run = env.submit("refuse", Value::Null).await;
    let give_up_run = env.submit("give-up", Value::Null).await;
    let boom_run = env.submit("boom", json!([1, 2])).await;
    let slow_run = env.insert_run("slow", &Value::Null).await;
    let mut slow = env.trigger(slow_run, "slow", Value::Null).await;
    slow.timeout_ms = Some(150);
    env.publish(&slow).await;

    // No retry policy in these triggers: one attempt, so a retryable failure ends `dead`.
    let cases = [
        (
            flaky_run,
            "dead",
            "failed",
            "loading orders: connection refused",
        ),
        (refuse_run, "failed", "failed", "order 7 does not exist"),
        (give_up_run, "cancelled", "cancelled", "nothing to do today"),
        (
            boom_run,
            "dead",
            "failed",
            "handler panicked: index out of bounds",
        ),
        (
            slow_run,
            "dead",
            "timed_out",
            "timed out after 150ms; handler returned: saw the token",
        ),
    ];
    for (run_id, run_state, attempt_state, error) in cases {
        let run = env.run_in_state(run_id, run_state).await;
        let err = run.error.unwrap();
        assert!(err.starts_with(error), "run {run_id}: {err}");
        let attempts = env.attempts(run_id).await;
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].state, attempt_state, "run {run_id}");
        assert_eq!(attempts[0].error.as_deref(), Some(err.as_str()));
        assert!(attempts[0].finished_at.is_some());
    }
    assert_eq!(
        env.logs(flaky_run).await,
        [(1, "info".to_owned(), "trying".to_owned())]
    );
    // Timed out after ~150 ms, not after the 5 s grace.
    let slow_ms = env.attempts(slow_run).await[0].duration_ms.unwrap();
    assert!((150..4_000).contains(&slow_ms), "{slow_ms} ms");

    running.stop().await;
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn capacity_bounds_concurrent_handlers(pool: PgPool) {
    let env = Env::new(pool).await;
    let current = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (c, p) = (current.clone(), peak.clone());
    let worker = env
        .worker()
        .capacity(2)
        .handle("slow", move |_: JobContext, _: Value| {
            let (current, peak) = (c.clone(), p.clone());
            async move {
                let now = current.fetch_add(1, SeqCst) + 1;
                peak.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                current.fetch_sub(1, SeqCst);
                Ok(())
            }
        })
        .build()
        .unwrap();
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(env.submit("slow", Value::Null).await);
    }
    let running = env.start(worker);
    for run_id in &runs {
        env.run_in_state(*run_id, "succeeded").await;
    }
    running.stop().await;
    assert_eq!(peak.load(SeqCst), 2, "two at a time, never more");
    // The database agrees: no instant had more than two attempts running. The recorded starts
    // are the database clock at the claim plus the worker's monotonic time since, so each is
    // an estimate (milliseconds off on an idle machine, tens on a loaded one): a handler that
    // starts the moment another's slot frees may be recorded as starting just before it
    // finished. Overlaps count from 100 ms on; a third handler running at once would overlap
    // for most of its 300 ms.
    let overlapping: i64 = sqlx::query_scalar(
        "SELECT max((SELECT count(*) FROM chime_attempts b
                      WHERE b.started_at <= a.started_at
                        AND b.finished_at > a.started_at + interval '100 milliseconds'))
           FROM chime_attempts a",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(overlapping <= 2, "{overlapping} attempts overlapped");
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn shutdown_stops_consuming_and_lets_the_running_handler_finish(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let worker = env
        .worker()
        .handle("hold", move |ctx: JobContext, _: Value| {
            let (started_tx, gate) = (started_tx.clone(), gate.clone());
            async move {
                started_tx.send(ctx.run_id()).unwrap();
                gate.notified().await;
                ctx.log()
                    .info(format!("released; cancelled = {}", ctx.is_cancelled()));
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let first = env.submit("hold", Value::Null).await;
    let got = tokio::time::timeout(WAIT, started.recv()).await.unwrap();
    assert_eq!(got, Some(first));

    running.shutdown.cancel();
    events.wait_for_message(WAIT, "stopped consuming").await;
    // Stopped consuming: a new trigger stays in the queue.
    let second = env.submit("hold", Value::Null).await;
    assert!(
        !running.handle.is_finished(),
        "run() waits for the in-flight handler"
    );
    assert_eq!(env.run(first).await.state, "running");

    release.notify_one();
    running.join().await;
    env.run_in_state(first, "succeeded").await;
    assert_eq!(
        env.logs(first).await,
        [(
            1,
            "info".to_owned(),
            "released; cancelled = false".to_owned()
        )]
    );
    assert_eq!(env.run(second).await.state, "queued");
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 1);
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn drain_timeout_cancels_handlers_and_records_them_interrupted(pool: PgPool) {
    let env = Env::new(pool).await;
    let worker = env
        .worker()
        .capacity(2)
        .drain_timeout(Duration::from_millis(200))
        .cancel_grace(Duration::from_millis(500))
        .handle("polite", |ctx: JobContext, _: Value| async move {
            ctx.cancelled().await;
            ctx.log().warn("stopping early");
            Err(JobError::cancel("saw the token"))
        })
        .handle("stubborn", |_: JobContext, _: Value| async move {
            std::future::pending::<()>().await;
            Ok(())
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let polite = env.submit("polite", Value::Null).await;
    let stubborn = env.submit("stubborn", Value::Null).await;
    env.run_in_state(polite, "running").await;
    env.run_in_state(stubborn, "running").await;

    running.stop().await;

    // No retry policy: the interrupted attempt was the last one.
    let run = env.run(polite).await;
    assert_eq!(run.state, "dead");
    assert_eq!(
        run.error.as_deref(),
        Some("interrupted by worker shutdown; handler returned: saw the token")
    );
    assert_eq!(env.attempts(polite).await[0].state, "cancelled");
    assert_eq!(
        env.logs(polite).await,
        [(1, "warn".to_owned(), "stopping early".to_owned())]
    );

    let run = env.run(stubborn).await;
    assert_eq!(run.state, "dead");
    let error = run.error.unwrap();
    assert!(
        error.starts_with("interrupted by worker shutdown; handler did not stop"),
        "{error}"
    );
    assert_eq!(env.attempts(stubborn).await[0].state, "cancelled");
    assert_eq!(
        env.queue_state(&env.topology.work_queue()).await.0,
        0,
        "both acked"
    );
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_deleted_work_queue_is_redeclared_and_consumed_again(pool: PgPool) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = env
        .worker()
        .handle("greet", greeter(&calls))
        .build()
        .unwrap();
    let running = env.start(worker);
    let before = env.submit("greet", json!({"name": "Di"})).await;
    env.run_in_state(before, "succeeded").await;

    // The broker cancels the worker's consumer (a channel-level end lapin does not recover).
    env.channel
        .queue_delete(
            env.topology.work_queue().as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    // Routed only once the worker's supervisor has declared the queue again.
    let after = env.submit("greet", json!({"name": "Ed"})).await;
    env.run_in_state(after, "succeeded").await;

    running.stop().await;
    assert_eq!(calls.load(SeqCst), 2);
    env.cleanup().await;
}

/// Runs `rabbitmqctl` (RabbitMQ runs on this machine) and returns its output.
fn rabbitmqctl(args: &[&str]) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl (RabbitMQ runs on this machine)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_connection_lost_mid_run_executes_once_and_consumes_again(pool: PgPool) {
    let env = Env::new(pool).await;
    let (_capturing, mut events) = capture_logs("");
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let (gate, calls) = (release.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = calls.clone();
    let worker = env
        .worker()
        .handle("hold", move |ctx: JobContext, _: Value| {
            let (started_tx, gate, counted) = (started_tx.clone(), gate.clone(), counted.clone());
            async move {
                counted.fetch_add(1, SeqCst);
                started_tx.send(ctx.run_id()).unwrap();
                gate.notified().await;
                Ok(())
            }
        })
        .build()
        .unwrap();
    let connection_name = format!("chime-worker-{}", worker.id());
    let running = env.start(worker);
    let held = env.submit("hold", Value::Null).await;
    assert_eq!(
        tokio::time::timeout(WAIT, started.recv()).await.unwrap(),
        Some(held)
    );

    // The broker drops the connection while the handler runs: the delivery goes back to the
    // queue and comes again after lapin's recovery; the original can no longer be acked.
    let listing = tokio::task::spawn_blocking(|| {
        rabbitmqctl(&[
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
    })
    .await
    .unwrap();
    let pid = listing
        .lines()
        .find(|line| line.contains(&connection_name))
        .and_then(|line| line.split('\t').next())
        .unwrap_or_else(|| panic!("connection {connection_name} in {listing}"))
        .to_owned();
    tokio::task::spawn_blocking(move || {
        rabbitmqctl(&["close_connection", &pid, "test: forced close"])
    })
    .await
    .unwrap();
    release.notify_one();

    env.run_in_state(held, "succeeded").await;
    events
        .wait_for_all(
            WAIT,
            "the unsent ack and the duplicate",
            &[
                &|m: &String| m.starts_with("ack not sent: the channel closed meanwhile"),
                &|m: &String| m.starts_with("duplicate"),
            ],
        )
        .await;
    assert_eq!(env.attempts(held).await.len(), 1);

    // And the worker consumes again on the recovered connection.
    let after = env.submit("hold", Value::Null).await;
    assert_eq!(
        tokio::time::timeout(WAIT, started.recv()).await.unwrap(),
        Some(after)
    );
    release.notify_one();
    env.run_in_state(after, "succeeded").await;
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 2, "the held run executed once");
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    env.cleanup().await;
}

/// A run due `ahead` from now, with the trigger the scheduler would publish for it ahead of
/// its instant (`x-chime-not-before` = the instant).
async fn early_trigger(
    env: &Env,
    job: &str,
    ahead: Duration,
) -> (i64, chime_protocol::wire::Trigger, FieldTable) {
    let run_id = env.insert_run(job, &Value::Null).await;
    let at = chrono::Utc::now() + chrono::Duration::from_std(ahead).unwrap();
    // Whole milliseconds, as the header carries them.
    let at = chrono::DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap();
    sqlx::query("UPDATE chime_runs SET scheduled_at = $2 WHERE id = $1")
        .bind(run_id)
        .bind(at)
        .execute(&env.pool)
        .await
        .unwrap();
    let trigger = env.trigger(run_id, job, Value::Null).await;
    let mut headers = FieldTable::default();
    headers.insert(
        chime_protocol::wire::HEADER_NOT_BEFORE.into(),
        lapin::types::AMQPValue::LongLongInt(at.timestamp_millis()),
    );
    (run_id, trigger, headers)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_trigger_published_ahead_is_claimed_at_once_and_started_at_its_instant(pool: PgPool) {
    let env = Env::new(pool).await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let worker = env
        .worker()
        .capacity(1)
        .handle("tick", move |ctx: JobContext, _: Value| {
            let started_tx = started_tx.clone();
            async move {
                started_tx
                    .send((chrono::Utc::now(), ctx.scheduled_at()))
                    .unwrap();
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let (run_id, trigger, headers) = early_trigger(&env, "tick", Duration::from_millis(200)).await;
    env.publish_with_headers(&trigger, headers).await;

    // Claimed while held: `running` before its instant, recorded as started at the instant.
    let claimed = env.run_in_state(run_id, "running").await;
    let seen_at = chrono::Utc::now();
    assert!(
        seen_at < trigger.scheduled_at,
        "the claim should come during the hold, {} ms before the instant at the latest",
        (trigger.scheduled_at - seen_at).num_milliseconds()
    );
    assert_eq!(claimed.started_at, Some(trigger.scheduled_at));

    let (handler_start, scheduled) = tokio::time::timeout(WAIT, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(scheduled, trigger.scheduled_at);
    let late = handler_start - scheduled;
    assert!(
        late >= chrono::Duration::zero(),
        "started {} µs before its instant",
        -late.num_microseconds().unwrap()
    );
    // A few ms on an idle machine; generous for a shared one.
    assert!(
        late < chrono::Duration::milliseconds(100),
        "started {late} late"
    );
    let done = env.run_in_state(run_id, "succeeded").await;
    assert!(done.finished_at.unwrap() >= handler_start - chrono::Duration::milliseconds(5));
    // The outcome records the handler's start, which for an on-time run is its instant: never
    // before it (the recorded start errs late, if at all), a few ms after.
    assert_start_recorded(&env, run_id, handler_start).await;
    let recorded = env.run(run_id).await.started_at.unwrap() - scheduled;
    assert!(
        recorded >= chrono::Duration::milliseconds(-1)
            && recorded < chrono::Duration::milliseconds(100),
        "recorded as started {recorded} late"
    );
    running.stop().await;
    env.cleanup().await;
}

/// The run's and its attempt's `started_at` are the handler's start as the handler saw it
/// (`seen`, the same machine's clock), give or take the claim statement's way to the server and
/// the handler task's spawn. `finished_at` is `started_at` + duration.
async fn assert_start_recorded(env: &Env, run_id: i64, seen: chrono::DateTime<chrono::Utc>) {
    let run = env.run(run_id).await;
    let attempts = env.attempts(run_id).await;
    let started = run.started_at.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].started_at, started, "run and attempt agree");
    let off = started - seen;
    assert!(
        off.abs() < chrono::Duration::milliseconds(50),
        "recorded start {started} is {} µs off the handler's own {seen}",
        off.num_microseconds().unwrap()
    );
    let duration = chrono::Duration::milliseconds(attempts[0].duration_ms.unwrap());
    assert_eq!(attempts[0].finished_at, Some(started + duration));
    assert_eq!(run.finished_at, Some(started + duration));
}

/// Regression (issue 11): a trigger claimed ahead of its instant was recorded as started at the
/// instant however long its handler then waited for a free slot, so every surface reported the
/// run on time. Here the only slot is busy until the test releases it, well after the instant.
#[sqlx::test(migrations = "../migrations")]
async fn a_run_claimed_ahead_but_held_up_records_its_real_start(pool: PgPool) {
    let env = Env::new(pool).await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let released = release.clone();
    let block_tx = started_tx.clone();
    let worker = env
        .worker()
        .capacity(1)
        .handle("block", move |_: JobContext, _: Value| {
            let (started_tx, released) = (block_tx.clone(), released.clone());
            async move {
                started_tx.send(("block", chrono::Utc::now())).unwrap();
                released.notified().await;
                Ok(())
            }
        })
        .handle("tick", move |_: JobContext, _: Value| {
            let started_tx = started_tx.clone();
            async move {
                started_tx.send(("tick", chrono::Utc::now())).unwrap();
                Ok(())
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    let blocker = env.submit("block", Value::Null).await;
    let (job, _) = tokio::time::timeout(WAIT, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job, "block", "the blocker holds the only slot");

    let (run_id, trigger, headers) = early_trigger(&env, "tick", Duration::from_millis(200)).await;
    env.publish_with_headers(&trigger, headers).await;
    // Claimed during the hold: until its outcome, the run shows the claim's estimate.
    let claimed = env.run_in_state(run_id, "running").await;
    assert_eq!(claimed.started_at, Some(trigger.scheduled_at));

    // The hold-up under test: the slot stays busy until 160 ms past the instant.
    let hold_up = chrono::Duration::milliseconds(160);
    let until = trigger.scheduled_at + hold_up;
    tokio::time::sleep((until - chrono::Utc::now()).to_std().unwrap_or_default()).await;
    let released_at = chrono::Utc::now();
    release.notify_one();

    let (job, handler_start) = tokio::time::timeout(WAIT, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job, "tick");
    assert!(
        handler_start >= released_at,
        "capacity 1: tick waits for the slot"
    );
    env.run_in_state(run_id, "succeeded").await;
    env.run_in_state(blocker, "succeeded").await;
    // The recorded start is never earlier than the real one, which is after the release.
    let run = env.run(run_id).await;
    let late = run.started_at.unwrap() - trigger.scheduled_at;
    let released_late = released_at - trigger.scheduled_at;
    assert!(
        late >= released_late - chrono::Duration::milliseconds(1),
        "recorded {} ms late; its handler started after the slot was released {} ms late",
        late.num_milliseconds(),
        released_late.num_milliseconds()
    );
    assert!(released_late >= hold_up);
    assert_start_recorded(&env, run_id, handler_start).await;
    running.stop().await;
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_cancel_while_a_trigger_is_held_keeps_its_handler_from_starting(pool: PgPool) {
    let env = Env::new(pool).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = env
        .worker()
        .handle("tick", move |_: JobContext, _: Value| {
            counted.fetch_add(1, SeqCst);
            async { Ok(()) }
        })
        .build()
        .unwrap();
    let running = env.start(worker);
    // The scheduler's longest lead: held (under the workers' 4 s hold limit for triggers),
    // and seconds for the cancel to arrive even on a loaded machine (245 ms was not, in CI).
    let ahead = chime_protocol::timing::MAX_LEAD;
    let (run_id, trigger, headers) = early_trigger(&env, "tick", ahead).await;
    env.publish_with_headers(&trigger, headers).await;
    env.run_in_state(run_id, "running").await;
    env.cancel(run_id).await;
    let cancelled_at = chrono::Utc::now();
    assert!(
        cancelled_at < trigger.scheduled_at,
        "the cancel must reach the worker while the trigger is held; it came {} ms late",
        (cancelled_at - trigger.scheduled_at).num_milliseconds()
    );

    let run = env.run_in_state(run_id, "cancelled").await;
    assert_eq!(calls.load(SeqCst), 0, "the handler must not start");
    let attempts = env.attempts(run_id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, "cancelled");
    assert!(
        run.error
            .as_deref()
            .unwrap_or_default()
            .contains("the handler was not started"),
        "{run:?}"
    );
    running.stop().await;
    env.cleanup().await;
}

/// Handlers that wait at a gate, so a test can finish many of them at the same moment: each
/// reports its run id when it starts, waits for a permit (attempt 1 only), logs its fate and
/// ends as `fate` in its params says (`ok`, `fail`, `cancel`, `retry`).
fn gated(
    started: mpsc::UnboundedSender<i64>,
    gate: Arc<tokio::sync::Semaphore>,
) -> impl Fn(JobContext, Value) -> std::pin::Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>
+ Send
+ Sync
+ 'static {
    move |ctx: JobContext, params: Value| {
        let (started, gate) = (started.clone(), gate.clone());
        Box::pin(async move {
            started.send(ctx.run_id()).unwrap();
            if ctx.attempt() == 1 {
                gate.acquire().await.unwrap().forget();
            }
            let fate = params["fate"].as_str().unwrap_or("ok").to_owned();
            ctx.log()
                .info(format!("fate {fate}, attempt {}", ctx.attempt()));
            match (fate.as_str(), ctx.attempt()) {
                ("fail", _) => Err(JobError::fail("refused")),
                ("cancel", _) => Err(JobError::cancel("moot")),
                ("retry", 1) => Err(JobError::retry("try again")),
                _ => Ok(()),
            }
        })
    }
}

/// Counts the rows each UPDATE statement on `chime_attempts` changes, in `test_statements`.
async fn count_attempt_updates(pool: &PgPool) {
    for sql in [
        "CREATE TABLE test_statements (changed bigint NOT NULL)",
        "CREATE FUNCTION test_count_changed() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO test_statements SELECT count(*) FROM changed;
             RETURN NULL;
         END $$",
        "CREATE TRIGGER test_count_changed AFTER UPDATE ON chime_attempts
             REFERENCING NEW TABLE AS changed
             FOR EACH STATEMENT EXECUTE FUNCTION test_count_changed()",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

/// Starts `runs` (submitted with the `gated` handler), then holds their rows locked while
/// every handler finishes, so all their outcomes wait together for the batch writer; returns
/// the open transaction (commit it to let the writes through).
async fn finish_together(
    env: &Env,
    runs: &[i64],
    started: &mut mpsc::UnboundedReceiver<i64>,
    gate: &tokio::sync::Semaphore,
    events: &mut chime_test_kit::Events<String>,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    for _ in runs {
        tokio::time::timeout(WAIT, started.recv())
            .await
            .expect("every handler starts")
            .unwrap();
    }
    let mut tx = env.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM chime_runs WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(runs)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    gate.add_permits(runs.len());
    // Logged just before each outcome goes to the batch writer, in the same poll.
    events
        .wait_for_count(
            WAIT,
            "every outcome on its way to the batch writer",
            |m| m == "run succeeded" || m == "run did not succeed",
            runs.len(),
        )
        .await;
    tx
}

#[sqlx::test(migrations = "../migrations")]
async fn outcomes_finishing_together_are_written_in_one_statement_each_with_its_own_fate(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    count_attempt_updates(&env.pool).await;
    let (_capturing, mut events) = capture_logs("");
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let worker = env
        .worker()
        .capacity(40)
        .handle("fate", gated(started_tx, gate.clone()))
        .build()
        .unwrap();
    let worker_id = worker.id().to_owned();
    let running = env.start(worker);

    let fates = ["ok", "fail", "cancel", "retry"];
    let mut runs = Vec::new();
    for i in 0..36 {
        let fate = fates[i % fates.len()];
        runs.push((env.submit("fate", json!({ "fate": fate })).await, fate));
    }
    // Retried under a policy: `retrying`, then attempt 2 succeeds.
    let retried = env.insert_run("fate", &json!({"fate": "retry"})).await;
    let mut trigger = env.trigger(retried, "fate", json!({"fate": "retry"})).await;
    trigger.retry = Some(support::policy(2, 100, 1.0, 100));
    env.publish(&trigger).await;
    // An operator asks to cancel this one while it runs: `cancelled`, not `dead`.
    let cancelled = env.submit("fate", json!({"fate": "retry"})).await;
    // Judged lost while it runs (the rescuer recorded its attempt `lost` and put the run back
    // in the outbox): its late outcome is fenced out.
    let fenced = env.submit("fate", json!({"fate": "ok"})).await;
    let ids: Vec<i64> = runs
        .iter()
        .map(|(id, _)| *id)
        .chain([retried, cancelled, fenced])
        .collect();

    let mut tx = finish_together(&env, &ids, &mut started, &gate, &mut events).await;
    sqlx::query("UPDATE chime_runs SET cancel_requested_at = now() WHERE id = $1")
        .bind(cancelled)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE chime_attempts SET state = 'lost', error = 'test: lost' WHERE run_id = $1")
        .bind(fenced)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE chime_runs SET state = 'pending', worker_id = NULL WHERE id = $1")
        .bind(fenced)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut dead = 0;
    for (run_id, fate) in &runs {
        let (run_state, attempt_state, error) = match *fate {
            "ok" => ("succeeded", "succeeded", None),
            "fail" => ("failed", "failed", Some("refused")),
            "cancel" => ("cancelled", "cancelled", Some("moot")),
            _ => ("dead", "failed", Some("try again")),
        };
        dead += usize::from(run_state == "dead");
        let run = env.run_in_state(*run_id, run_state).await;
        assert_eq!(run.error.as_deref(), error, "run {run_id}");
        assert_eq!(run.worker_id.as_deref(), Some(worker_id.as_str()));
        if run_state == "dead" {
            assert_eq!(
                run.reason.as_deref(),
                Some("attempts exhausted (1 of 1): try again")
            );
        }
        let attempts = env.attempts(*run_id).await;
        assert_eq!(attempts.len(), 1, "run {run_id}");
        let a = &attempts[0];
        assert_eq!(
            (a.state.as_str(), a.error.as_deref()),
            (attempt_state, error)
        );
        assert_eq!(a.finished_at, run.finished_at, "run {run_id}");
        assert_eq!(
            (a.finished_at.unwrap() - a.started_at).num_milliseconds(),
            a.duration_ms.unwrap()
        );
        assert_eq!(
            env.logs(*run_id).await,
            [(1, "info".to_owned(), format!("fate {fate}, attempt 1"))]
        );
    }

    let run = env.run_in_state(retried, "succeeded").await;
    assert_eq!(run.attempt, 2);
    let states: Vec<String> = env
        .attempts(retried)
        .await
        .into_iter()
        .map(|a| a.state)
        .collect();
    assert_eq!(states, ["failed", "succeeded"]);
    assert_eq!(env.logs(retried).await.len(), 2);

    let run = env.run_in_state(cancelled, "cancelled").await;
    assert_eq!(run.reason, None);
    assert_eq!(env.attempts(cancelled).await[0].state, "failed");

    // The fenced run's outcome was discarded: the rescuer's record stands, no log line of the
    // late attempt was stored, and its delivery was acked (nothing left in the queue below).
    events
        .wait_for_one(WAIT, "the late outcome discarded", |m| {
            m.starts_with("late outcome discarded")
        })
        .await;
    let run = env.run(fenced).await;
    assert_eq!((run.state.as_str(), run.worker_id), ("pending", None));
    let attempt = &env.attempts(fenced).await[0];
    assert_eq!(
        (attempt.state.as_str(), attempt.duration_ms),
        ("lost", None)
    );
    assert!(env.logs(fenced).await.is_empty());

    // Written together: the outcomes that waited for the lock went in one statement.
    let largest: Option<i64> = sqlx::query_scalar("SELECT max(changed) FROM test_statements")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(largest.unwrap_or(0) > 1, "largest statement: {largest:?}");

    running.stop().await;
    assert_eq!(env.queue_state(&env.topology.work_queue()).await.0, 0);
    let mut parked = 0;
    while env.take_parked().await.is_some() {
        parked += 1;
    }
    assert_eq!(parked, dead, "each dead run's message parked once");
    env.cleanup().await;
}

/// `(ready, unacked)` messages of `queue`, as the broker counts them.
fn queue_counts(queue: &str) -> (u64, u64) {
    let listing = rabbitmqctl(&[
        "list_queues",
        "-q",
        "--no-table-headers",
        "name",
        "messages_ready",
        "messages_unacknowledged",
    ]);
    let line = listing
        .lines()
        .find(|line| line.split('\t').next() == Some(queue))
        .unwrap_or_else(|| panic!("queue {queue} in {listing}"));
    let counts: Vec<u64> = line
        .split('\t')
        .skip(1)
        .map(|n| n.trim().parse().unwrap())
        .collect();
    (counts[0], counts[1])
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failing_batch_falls_back_to_one_write_per_run_and_acks_only_what_is_recorded(
    pool: PgPool,
) {
    let env = Env::new(pool).await;
    // The attempt of a "poisoned" run cannot be written while it is poisoned: the database
    // refuses as it does while it restarts (a transient error, so the write is retried).
    for sql in [
        "CREATE TABLE test_poison (run_id bigint PRIMARY KEY)",
        "CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.state <> 'running' AND EXISTS (SELECT 1 FROM test_poison WHERE run_id = NEW.run_id) THEN
                 RAISE EXCEPTION 'test: run % is poisoned', NEW.run_id USING ERRCODE = '57P03';
             END IF;
             RETURN NEW;
         END $$",
        "CREATE TRIGGER test_poison BEFORE UPDATE ON chime_attempts
             FOR EACH ROW EXECUTE FUNCTION test_poison()",
    ] {
        sqlx::query(sql).execute(&env.pool).await.unwrap();
    }
    let (_capturing, mut events) = capture_logs("");
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let worker = env
        .worker()
        .capacity(10)
        .db_retry_budget(Duration::from_secs(120))
        .handle("fate", gated(started_tx, gate.clone()))
        .build()
        .unwrap();
    let running = env.start(worker);
    let mut runs = Vec::new();
    for _ in 0..10 {
        runs.push(env.submit("fate", json!({"fate": "ok"})).await);
    }
    let poisoned = runs[3];
    sqlx::query("INSERT INTO test_poison VALUES ($1)")
        .bind(poisoned)
        .execute(&env.pool)
        .await
        .unwrap();

    let tx = finish_together(&env, &runs, &mut started, &gate, &mut events).await;
    tx.commit().await.unwrap();
    events
        .wait_for_message(WAIT, "batched outcome write failed; recording one by one")
        .await;
    // Every other run is recorded (the ones of the failed batch one by one) and acked; the
    // poisoned one stays `running` and its delivery unacked while its write is retried.
    for run_id in runs.iter().filter(|id| **id != poisoned) {
        env.run_in_state(*run_id, "succeeded").await;
    }
    let queue = env.topology.work_queue();
    let q = queue.clone();
    wait_for(
        WAIT,
        "only the poisoned run's delivery to be unacked",
        || {
            let q = q.clone();
            async move {
                let counts = tokio::task::spawn_blocking(move || queue_counts(&q))
                    .await
                    .unwrap();
                (counts == (0, 1)).then_some(())
            }
        },
    )
    .await;
    let run = env.run(poisoned).await;
    assert_eq!(run.state, "running");
    assert_eq!(env.attempts(poisoned).await[0].state, "running");

    sqlx::query("DELETE FROM test_poison")
        .execute(&env.pool)
        .await
        .unwrap();
    env.run_in_state(poisoned, "succeeded").await;
    let attempts = env.attempts(poisoned).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, "succeeded");
    assert_eq!(
        env.logs(poisoned).await,
        [(1, "info".to_owned(), "fate ok, attempt 1".to_owned())]
    );
    let q = queue.clone();
    wait_for(WAIT, "the poisoned run's delivery to be acked", || {
        let q = q.clone();
        async move {
            let counts = tokio::task::spawn_blocking(move || queue_counts(&q))
                .await
                .unwrap();
            (counts == (0, 0)).then_some(())
        }
    })
    .await;
    running.stop().await;
    env.cleanup().await;
}
