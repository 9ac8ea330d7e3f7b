//! The hostile-input corpus (`tests/corpus/amqp/`, described in its README): every message in
//! it is published to a fresh group on the real RabbitMQ, with its run in the real PostgreSQL,
//! and the worker must park it with the expected reason (or settle it as expected) without
//! running the handler, and leave the run it names as the case says.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use chime_protocol::wire::HEADER_DEAD_REASON;
use chime_test_kit::{capture_logs, wait_for};
use chime_worker::JobContext;
use lapin::types::{AMQPValue, FieldTable};
use serde::Deserialize;
use serde_json::Value;
use sqlx::PgPool;
use support::{Env, WAIT, header};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/corpus/amqp");

/// The handler every case's worker has.
const JOB: &str = "corpus-job";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    case: String,
    run: Option<RunSpec>,
    #[serde(default)]
    headers: serde_json::Map<String, Value>,
    message_id: Option<String>,
    body: Option<Value>,
    raw_body: Option<String>,
    pad_body_to: Option<usize>,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunSpec {
    job: String,
    group: Option<String>,
    state: Option<String>,
    attempt: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    parked: Option<String>,
    acked_log: Option<String>,
    run_state: Option<String>,
    run_error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Params {
    #[allow(dead_code)]
    size: u32,
}

fn cases() -> Vec<(PathBuf, Case)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(CORPUS)
        .unwrap_or_else(|e| panic!("reading {CORPUS}: {e}"))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let case = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not a corpus case: {e}", path.display()));
            (path, case)
        })
        .collect()
}

/// Expands `$REPEAT(c,n)` into `n` copies of `c`.
fn expand_repeats(mut text: String) -> String {
    while let Some(start) = text.find("$REPEAT(") {
        let end = start + text[start..].find(')').expect("a closing parenthesis");
        let (c, n) = text[start + 8..end].split_once(',').expect("$REPEAT(c,n)");
        let copies = c.repeat(n.trim().parse().expect("a count"));
        text.replace_range(start..=end, &copies);
    }
    text
}

fn amqp_value(value: &Value) -> AMQPValue {
    match value {
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::LongLongInt(i64::MAX),
        },
        Value::String(s) => AMQPValue::LongString(s.as_str().into()),
        Value::Bool(b) => AMQPValue::Boolean(*b),
        other => AMQPValue::LongString(other.to_string().as_str().into()),
    }
}

/// Inserts the case's run; returns its id.
async fn insert_run(env: &Env, spec: &RunSpec) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt)
         VALUES ($1, $2, now(), 'manual', $3, $4) RETURNING id",
    )
    .bind(&spec.job)
    .bind(spec.group.as_deref().unwrap_or(&env.group))
    .bind(spec.state.as_deref().unwrap_or("queued"))
    .bind(spec.attempt.unwrap_or(0))
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

async fn play(pool: &PgPool, path: &Path, case: Case) {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let env = Env::new(pool.clone()).await;
    let (_capturing, mut events) = capture_logs("");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    // A genuine run of a job nobody handles is parked at once, not after a wait for a worker
    // with its handler (tested in worker.rs).
    let worker = env
        .worker()
        .unhandled_wait(Duration::ZERO)
        .handle(JOB, move |_: JobContext, _: Params| {
            counted.fetch_add(1, SeqCst);
            async { Ok(()) }
        })
        .build()
        .unwrap();
    let running = env.start(worker);

    let run_id = match &case.run {
        Some(spec) => Some(insert_run(&env, spec).await),
        None => None,
    };
    let id = run_id.map(|id| id.to_string()).unwrap_or_default();
    let fill = |text: String| {
        expand_repeats(
            text.replace("$RUN_ID", &id)
                .replace("$GROUP", &env.group)
                .replace("$NOW", &chrono::Utc::now().to_rfc3339()),
        )
    };
    let mut body = match (&case.body, &case.raw_body) {
        // In a JSON body `"$RUN_ID"` stands for the number.
        (Some(json), None) => fill(json.to_string().replace("\"$RUN_ID\"", &id)).into_bytes(),
        (None, Some(raw)) => fill(raw.clone()).into_bytes(),
        _ => panic!("{name}: give exactly one of body and raw_body"),
    };
    if let Some(size) = case.pad_body_to {
        assert!(
            body.len() <= size,
            "{name}: the body is longer than pad_body_to"
        );
        body.resize(size, b' ');
    }
    let mut headers = FieldTable::default();
    for (key, value) in &case.headers {
        headers.insert(key.as_str().into(), amqp_value(value));
    }
    let message_id = case.message_id.as_ref().map(|m| {
        fill(m.clone())
            .parse::<i64>()
            .unwrap_or_else(|_| panic!("{name}: message_id must be a run id"))
    });
    env.publish_raw(&body, message_id, headers).await;

    if let Some(want) = &case.expect.parked {
        let parking = env.topology.parking_queue();
        let env_ref = &env;
        wait_for(WAIT, &format!("{name}: the parked message"), || {
            let parking = parking.clone();
            async move { (env_ref.queue_state(&parking).await.0 == 1).then_some(()) }
        })
        .await;
        let parked = env.take_parked().await.unwrap();
        let reason = header(&parked, HEADER_DEAD_REASON).unwrap_or_default();
        assert!(
            reason.contains(want.as_str()),
            "{name} ({}): parked with {reason:?}, expected it to contain {want:?}",
            case.case
        );
        assert!(reason.len() <= chime_protocol::limits::MAX_HEADER_VALUE_BYTES);
        assert_eq!(parked.data, body, "{name}: the parked copy keeps the body");
    }
    if let Some(want) = &case.expect.acked_log {
        events.wait_for_message(WAIT, want).await;
    }
    if let (Some(run_id), Some(state)) = (run_id, &case.expect.run_state) {
        let run = env.run_in_state(run_id, state).await;
        if let Some(want) = &case.expect.run_error {
            let error = run.error.unwrap_or_default();
            assert!(error.contains(want.as_str()), "{name}: run error {error:?}");
        }
    }
    running.stop().await;
    assert_eq!(calls.load(SeqCst), 0, "{name}: the handler ran");
    assert_eq!(
        env.queue_state(&env.topology.work_queue()).await.0,
        0,
        "{name}: the message was settled"
    );
    if case.expect.parked.is_none() {
        assert_eq!(
            env.queue_state(&env.topology.parking_queue()).await.0,
            0,
            "{name}: nothing parked"
        );
    }
    if let Some(run_id) = run_id
        && case.expect.run_state.as_deref() == Some("queued")
    {
        assert!(
            env.attempts(run_id).await.is_empty(),
            "{name}: no attempt recorded"
        );
    }
    env.cleanup().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn every_hostile_message_in_the_corpus_is_parked_or_settled_without_running(pool: PgPool) {
    let cases = cases();
    assert!(cases.len() >= 12, "the corpus has {} cases", cases.len());
    for (path, case) in cases {
        play(&pool, &path, case).await;
    }
}
