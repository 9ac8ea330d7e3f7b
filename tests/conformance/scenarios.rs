//! The scenarios of the conformance suite (docs/conformance.md): each one drives the worker
//! under test in a world of its own ([`World`]) and returns what it measured, or why the worker
//! does not conform.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use chime_e2e::try_wait_for;
use chime_protocol::headers::attempt_value;
use chime_protocol::topology::WORK_KEY;
use chime_protocol::{Topology, Trigger};
use chime_scheduler::auth::Caller;
use chime_scheduler::job::JobSpec;
use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::world::{LogRow, World, job};

/// How long a scenario waits for something that takes a moment on an idle machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// How late a log line may be stored after it was logged (the protocol's bound is 1 s; the
/// rest is the suite's polling and a loaded machine).
const LOG_LAG_LIMIT_MS: i64 = 1_250;

/// How much later than its backoff a retry may start.
const RETRY_SLACK_MS: i64 = 1_500;

/// How late after its instant a held trigger's handler may start.
const HOLD_SLACK_MS: i64 = 1_000;

/// What a scenario found.
pub enum Verdict {
    /// The worker conforms; what was measured.
    Pass(String),
    /// The scenario does not apply to this run of the suite; why.
    Skip(String),
}

/// One scenario: its name, what it checks, and its jobs.
pub struct Scenario {
    pub name: &'static str,
    pub checks: &'static str,
}

/// Every scenario, in the order the table lists them.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "runs-a-job",
        checks: "conf-ok succeeds on attempt 1 with its log line",
    },
    Scenario {
        name: "heartbeat",
        checks: "registers with its jobs; heartbeat_at advances",
    },
    Scenario {
        name: "duplicate-delivery",
        checks: "copies of a trigger (while running, after) run nothing",
    },
    Scenario {
        name: "hold-until-instant",
        checks: "triggers published ahead start at, never before, their instant",
    },
    Scenario {
        name: "retry-backoff",
        checks: "attempts 2 and 3 start after 1 s and 2 s backoffs",
    },
    Scenario {
        name: "retry-exhausted",
        checks: "the last failed attempt ends the run dead and parks it",
    },
    Scenario {
        name: "fatal-failure",
        checks: "a do-not-retry failure ends the run failed after 1 attempt",
    },
    Scenario {
        name: "timeout",
        checks: "a handler over the job's timeout is recorded timed_out",
    },
    Scenario {
        name: "cancel-running",
        checks: "an operator's cancel stops a running handler",
    },
    Scenario {
        name: "cancel-queued",
        checks: "a run cancelled while queued never runs",
    },
    Scenario {
        name: "poison-parked",
        checks: "malformed bodies are parked with x-chime-dead-reason",
    },
    Scenario {
        name: "sigkill-takeover",
        checks: "a worker SIGKILLed mid-run: a second worker takes the run over",
    },
    Scenario {
        name: "logs-live",
        checks: "log lines are stored within 1 s, while the run runs",
    },
    Scenario {
        name: "sigterm-drain",
        checks: "SIGTERM: the running handler finishes and is recorded; exit 0",
    },
    Scenario {
        name: "least-privilege",
        checks: "a worker role granted one group is refused another's claim",
    },
];

/// No retries: one attempt.
fn once() -> Value {
    json!({"retry": {"max_attempts": 1}})
}

/// The jobs of scenario `name` in `group`: the five `conf-*` jobs, manual, with the scenario's
/// retry policies and timeouts.
pub fn jobs(name: &str, group: &str) -> anyhow::Result<Vec<JobSpec>> {
    let mut specs: BTreeMap<&str, Value> = [
        ("conf-ok", once()),
        ("conf-sleep", once()),
        ("conf-fail", once()),
        ("conf-fatal", once()),
        ("conf-log", once()),
    ]
    .into_iter()
    .collect();
    match name {
        "hold-until-instant" => {
            specs.insert(
                "conf-ok",
                json!({"every": "1s", "params": {"tag": "scheduled"},
                       "retry": {"max_attempts": 1}}),
            );
        }
        "retry-backoff" => {
            specs.insert(
                "conf-fail",
                json!({"retry": {"max_attempts": 3, "initial": "1s", "multiplier": 2.0,
                                 "max": "1m", "jitter": false}}),
            );
        }
        "retry-exhausted" => {
            specs.insert(
                "conf-fail",
                json!({"retry": {"max_attempts": 2, "initial": "250ms", "jitter": false}}),
            );
        }
        "fatal-failure" => {
            specs.insert(
                "conf-fatal",
                json!({"retry": {"max_attempts": 3, "initial": "250ms", "jitter": false}}),
            );
        }
        "timeout" => {
            specs.insert(
                "conf-sleep",
                json!({"timeout": "1s", "retry": {"max_attempts": 1}}),
            );
        }
        "sigkill-takeover" => {
            specs.insert(
                "conf-sleep",
                json!({"retry": {"max_attempts": 3, "initial": "250ms", "jitter": false}}),
            );
        }
        _ => {}
    }
    let mut jobs = specs
        .into_iter()
        .map(|(name, extra)| job(name, group, extra))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if name == "least-privilege" {
        // A job of another group, which the worker's role is not granted.
        jobs.push(job(
            "conf-other",
            &format!("{group}-other"),
            json!({"retry": {"max_attempts": 1}}),
        )?);
    }
    Ok(jobs)
}

/// Runs scenario `name` in `world`.
pub async fn run(name: &str, w: &mut World) -> anyhow::Result<Verdict> {
    match name {
        "runs-a-job" => runs_a_job(w).await,
        "heartbeat" => heartbeat(w).await,
        "duplicate-delivery" => duplicate_delivery(w).await,
        "hold-until-instant" => hold_until_instant(w).await,
        "retry-backoff" => retry_backoff(w).await,
        "retry-exhausted" => retry_exhausted(w).await,
        "fatal-failure" => fatal_failure(w).await,
        "timeout" => timeout(w).await,
        "cancel-running" => cancel_running(w).await,
        "cancel-queued" => cancel_queued(w).await,
        "poison-parked" => poison_parked(w).await,
        "sigkill-takeover" => sigkill_takeover(w).await,
        "logs-live" => logs_live(w).await,
        "sigterm-drain" => sigterm_drain(w).await,
        "least-privilege" => least_privilege(w).await,
        other => bail!("no scenario {other}"),
    }
}

fn ms(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds()
}

/// The states of a run's attempts, as `[(attempt, state)]`.
fn states(attempts: &[crate::world::AttemptRow]) -> Vec<(i32, String)> {
    attempts
        .iter()
        .map(|a| (a.attempt, a.state.clone()))
        .collect()
}

fn messages(logs: &[crate::world::LogRow]) -> Vec<String> {
    logs.iter().map(|l| l.message.clone()).collect()
}

async fn runs_a_job(w: &mut World) -> anyhow::Result<Verdict> {
    let worker = w.start_worker().await?;
    let id = w.trigger("conf-ok", json!({"tag": "hello"})).await?;
    let run = w.wait_state(id, "succeeded", PATIENCE).await?;
    ensure!(
        run.attempt == 1,
        "the run succeeded on attempt {}",
        run.attempt
    );
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "succeeded".to_owned())],
        "attempts {:?}",
        states(&attempts)
    );
    ensure!(
        attempts[0].worker_id == worker.id,
        "attempt 1 was recorded by {:?}, not by the worker's CHIME_WORKER_ID {:?}",
        attempts[0].worker_id,
        worker.id
    );
    // A runner may log lines of its own around the job's; the job's line is there once.
    let logs = messages(&w.logs(id).await?);
    ensure!(
        logs.iter().filter(|l| *l == "ok hello").count() == 1,
        "log lines {logs:?}, expected \"ok hello\" once among them"
    );
    let took = attempts[0]
        .finished_at
        .map_or(-1, |f| ms(attempts[0].started_at, f));
    Ok(Verdict::Pass(format!(
        "succeeded on attempt 1 (handler {took} ms), log line stored"
    )))
}

async fn heartbeat(w: &mut World) -> anyhow::Result<Verdict> {
    let worker = w.start_worker().await?;
    let row = sqlx::query(
        "SELECT group_name, jobs, heartbeat_interval_ms, heartbeat_at
         FROM chime_workers WHERE id = $1",
    )
    .bind(&worker.id)
    .fetch_one(&w.pool)
    .await
    .context("reading the worker's row")?;
    let group: String = row.get("group_name");
    ensure!(
        group == w.group,
        "registered in group {group:?}, not {:?}",
        w.group
    );
    let jobs: Vec<String> = row.get("jobs");
    let missing: Vec<&str> = [
        "conf-ok",
        "conf-sleep",
        "conf-fail",
        "conf-fatal",
        "conf-log",
    ]
    .into_iter()
    .filter(|j| !jobs.iter().any(|have| have == j))
    .collect();
    ensure!(
        missing.is_empty(),
        "registered jobs {jobs:?} lack {missing:?}"
    );
    let interval: i32 = row.get("heartbeat_interval_ms");
    ensure!(
        (1..=10_000).contains(&interval),
        "heartbeat_interval_ms is {interval}; the suite expects at most 10000"
    );
    let mut last: DateTime<Utc> = row.get("heartbeat_at");
    let started = tokio::time::Instant::now();
    let limit = Duration::from_millis(3 * u64::try_from(interval)? + 2_000);
    for beat in 1..=3 {
        let pool = w.pool.clone();
        let id = worker.id.clone();
        let what = format!("heartbeat {beat} (heartbeat_at after {last})");
        last = try_wait_for(limit, &what, || async {
            let at: Option<DateTime<Utc>> =
                sqlx::query_scalar("SELECT heartbeat_at FROM chime_workers WHERE id = $1")
                    .bind(&id)
                    .fetch_optional(&pool)
                    .await
                    .ok()
                    .flatten();
            at.filter(|at| *at > last)
        })
        .await?;
    }
    Ok(Verdict::Pass(format!(
        "interval {interval} ms; 3 beats in {} ms",
        started.elapsed().as_millis()
    )))
}

/// Publishes a copy of attempt 1's trigger of run `id` to the world's work queue, as a broker
/// redelivering or a publisher repeating itself would.
async fn publish_copy(w: &World, id: i64, job: &str, params: Value) -> anyhow::Result<()> {
    let run = w.run(id).await?;
    let trigger = Trigger {
        v: 1,
        run_id: id,
        job: job.to_owned(),
        group: w.group.clone(),
        attempt: 1,
        scheduled_at: run.scheduled_at,
        params,
        timeout_ms: None,
        retry: None,
        task: None,
    };
    let mut headers = FieldTable::default();
    headers.insert("x-chime-attempt".into(), attempt_value(1));
    publish(
        w,
        &trigger.to_body(),
        BasicProperties::default()
            .with_message_id(id.to_string().into())
            .with_content_type("application/json".into())
            .with_headers(headers),
    )
    .await
}

/// Publishes `body` to the world's work queue with publisher confirms.
async fn publish(w: &World, body: &[u8], properties: BasicProperties) -> anyhow::Result<()> {
    let connection = w.broker().await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let topology = Topology::new(w.prefix.as_str(), w.group.as_str());
    let confirm = channel
        .basic_publish(
            topology.exchange().as_str().into(),
            WORK_KEY.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            properties.with_delivery_mode(2),
        )
        .await?
        .await?;
    let _ = connection.close(200, "published".into()).await;
    ensure!(
        matches!(confirm, lapin::Confirmation::Ack(None)),
        "the broker did not take the message: {confirm:?}"
    );
    Ok(())
}

/// Messages ready in the world's work queue.
async fn ready(w: &World) -> anyhow::Result<u32> {
    let connection = w.broker().await?;
    let channel = connection.create_channel().await?;
    let queue = Topology::new(w.prefix.as_str(), w.group.as_str()).work_queue();
    let declared = chime_e2e::passive_declare(&channel, &queue).await?;
    let _ = connection.close(200, "counted".into()).await;
    Ok(declared.message_count())
}

/// Waits until the world's work queue has `n` consumers: its workers have declared and bound
/// it and consume (a worker registers before it consumes).
async fn wait_consumers(w: &World, n: u32) -> anyhow::Result<()> {
    let queue = Topology::new(w.prefix.as_str(), w.group.as_str()).work_queue();
    let what = format!("{n} consumers on {queue}");
    try_wait_for(PATIENCE, &what, || async {
        let connection = w.broker().await.map_err(|e| format!("{e:#}"))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let declared = chime_e2e::passive_declare(&channel, &queue).await;
        let _ = connection.close(200, "counted".into()).await;
        match declared {
            Ok(q) if q.consumer_count() >= n => Ok(()),
            Ok(q) => Err(format!("{} consumers", q.consumer_count())),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

/// Triggers a `conf-ok` run tagged `tag` and waits for it to succeed, then for the work queue
/// to be empty: whatever was published before it has been delivered.
async fn flush(w: &World, tag: &str) -> anyhow::Result<()> {
    let id = w.trigger("conf-ok", json!({"tag": tag})).await?;
    w.wait_state(id, "succeeded", PATIENCE).await?;
    try_wait_for(PATIENCE, "the work queue to be empty", || async {
        match ready(w).await {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!("{n} ready")),
            Err(e) => Err(format!("{e:#}")),
        }
    })
    .await?;
    Ok(())
}

async fn duplicate_delivery(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let params = json!({"seconds": 2});
    let id = w.trigger("conf-sleep", params.clone()).await?;
    w.wait_logged(id, "sleeping", PATIENCE).await?;
    publish_copy(w, id, "conf-sleep", params.clone()).await?;
    w.wait_state(id, "succeeded", PATIENCE).await?;
    publish_copy(w, id, "conf-sleep", params).await?;
    flush(w, "after the copies").await?;
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "succeeded".to_owned())],
        "attempts {:?} after two copies of the trigger",
        states(&attempts)
    );
    let logs = messages(&w.logs(id).await?);
    ensure!(
        logs.iter().filter(|l| *l == "sleeping").count() == 1,
        "log lines {logs:?}: \"sleeping\" is not there exactly once"
    );
    let run = w.run(id).await?;
    ensure!(run.state == "succeeded", "the run is {} now", run.state);
    Ok(Verdict::Pass(
        "2 copies (one while running, one after) ran nothing".into(),
    ))
}

async fn hold_until_instant(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let pool = w.pool.clone();
    let rows = try_wait_for(
        PATIENCE,
        "three scheduled conf-ok runs to succeed",
        || async {
            let rows = sqlx::query(
                "SELECT r.id, r.scheduled_at, r.published_at, a.started_at
             FROM chime_runs r JOIN chime_attempts a ON a.run_id = r.id AND a.attempt = 1
             WHERE r.job_name = 'conf-ok' AND r.trigger = 'schedule' AND r.state = 'succeeded'
             ORDER BY r.scheduled_at LIMIT 3",
            )
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if rows.len() == 3 {
                Ok(rows)
            } else {
                Err(format!("{} so far", rows.len()))
            }
        },
    )
    .await?;
    let mut lateness = Vec::new();
    let mut ahead = 0;
    for row in &rows {
        let id: i64 = row.get("id");
        let scheduled: DateTime<Utc> = row.get("scheduled_at");
        let published: Option<DateTime<Utc>> = row.get("published_at");
        let started: DateTime<Utc> = row.get("started_at");
        let late = (started - scheduled).num_microseconds().unwrap_or(i64::MAX);
        ensure!(
            late >= 0,
            "run {id} started at {started}, {} µs before its instant {scheduled}",
            -late
        );
        ensure!(
            late <= HOLD_SLACK_MS * 1_000,
            "run {id} started {} ms after its instant (limit {HOLD_SLACK_MS} ms)",
            late / 1_000
        );
        if published.is_some_and(|p| p < scheduled) {
            ahead += 1;
        }
        lateness.push(format!("{:.1}", late as f64 / 1_000.0));
    }
    Ok(Verdict::Pass(format!(
        "3 runs started {} ms after their instants ({ahead} of 3 published ahead)",
        lateness.join(", ")
    )))
}

async fn retry_backoff(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let id = w.trigger("conf-fail", json!({"fails": 2})).await?;
    let run = w.wait_state(id, "succeeded", PATIENCE).await?;
    ensure!(run.attempt == 3, "succeeded on attempt {}", run.attempt);
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts)
            == [
                (1, "failed".to_owned()),
                (2, "failed".to_owned()),
                (3, "succeeded".to_owned())
            ],
        "attempts {:?}",
        states(&attempts)
    );
    for a in &attempts[..2] {
        ensure!(
            a.error.as_deref().is_some_and(|e| !e.is_empty()),
            "attempt {} failed without an error",
            a.attempt
        );
    }
    let mut gaps = Vec::new();
    for (pair, backoff) in attempts.windows(2).zip([1_000, 2_000]) {
        let finished = pair[0]
            .finished_at
            .with_context(|| format!("attempt {} has no finished_at", pair[0].attempt))?;
        let gap = ms(finished, pair[1].started_at);
        ensure!(
            gap >= backoff - 50,
            "attempt {} started {gap} ms after attempt {} finished, before its {backoff} ms backoff",
            pair[1].attempt,
            pair[0].attempt
        );
        ensure!(
            gap <= backoff + RETRY_SLACK_MS,
            "attempt {} started {gap} ms after attempt {} finished: over its {backoff} ms backoff \
             by more than {RETRY_SLACK_MS} ms",
            pair[1].attempt,
            pair[0].attempt
        );
        gaps.push(gap);
    }
    Ok(Verdict::Pass(format!(
        "attempts 2, 3 started {} ms and {} ms after the failures (backoff 1000, 2000)",
        gaps[0], gaps[1]
    )))
}

/// Waits for the leader to drain a parked message of the world's group into
/// `chime_dead_letters` that `matches`; returns its reason, parked_by and body.
async fn wait_parked(
    w: &World,
    what: &str,
    matches: impl Fn(Option<i64>, &[u8]) -> bool,
) -> anyhow::Result<(Option<String>, Option<String>, Vec<u8>, Value)> {
    let what = format!("{what} to be parked (drained into chime_dead_letters)");
    let found = try_wait_for(PATIENCE, &what, || async {
        let rows = sqlx::query(
            "SELECT run_id, reason, parked_by, body, headers FROM chime_dead_letters
             WHERE group_name = $1 ORDER BY id",
        )
        .bind(&w.group)
        .fetch_all(&w.pool)
        .await
        .map_err(|e| e.to_string())?;
        let count = rows.len();
        rows.into_iter()
            .find(|r| matches(r.get("run_id"), r.get::<Vec<u8>, _>("body").as_slice()))
            .map(|r| {
                (
                    r.get("reason"),
                    r.get("parked_by"),
                    r.get("body"),
                    r.get("headers"),
                )
            })
            .ok_or(format!("{count} other dead letters"))
    })
    .await?;
    Ok(found)
}

async fn retry_exhausted(w: &mut World) -> anyhow::Result<Verdict> {
    let worker = w.start_worker().await?;
    let id = w.trigger("conf-fail", json!({"fails": 9})).await?;
    let run = w.wait_state(id, "dead", PATIENCE).await?;
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "failed".to_owned()), (2, "failed".to_owned())],
        "attempts {:?}",
        states(&attempts)
    );
    let reason = run.reason.unwrap_or_default();
    ensure!(
        reason.starts_with("attempts exhausted (2 of 2)"),
        "the run's reason is {reason:?}, expected `attempts exhausted (2 of 2): …`"
    );
    let (parked_reason, parked_by, _, headers) =
        wait_parked(w, &format!("run {id}'s trigger"), |run, _| run == Some(id)).await?;
    ensure!(
        parked_reason.as_deref().is_some_and(|r| !r.is_empty()),
        "parked without x-chime-dead-reason; headers {headers}"
    );
    ensure!(
        parked_by.as_deref() == Some(worker.id.as_str()),
        "x-chime-dead-by is {parked_by:?}, not the worker id {:?}",
        worker.id
    );
    ensure!(
        headers.get("x-chime-error").is_some(),
        "parked without x-chime-error; headers {headers}"
    );
    Ok(Verdict::Pass(format!(
        "dead after 2 attempts, parked: {}",
        parked_reason.unwrap_or_default()
    )))
}

async fn fatal_failure(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let id = w.trigger("conf-fatal", json!({})).await?;
    let run = w.wait_state(id, "failed", PATIENCE).await?;
    ensure!(run.attempt == 1, "failed on attempt {}", run.attempt);
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "failed".to_owned())],
        "attempts {:?} (retry policy allows 3)",
        states(&attempts)
    );
    let error = attempts[0].error.clone().unwrap_or_default();
    ensure!(!error.is_empty(), "attempt 1 failed without an error");
    Ok(Verdict::Pass(format!(
        "failed, not retried (policy allows 3): {error}"
    )))
}

async fn timeout(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let id = w.trigger("conf-sleep", json!({"seconds": 30})).await?;
    w.wait_run(id, PATIENCE, "to end (timeout 1 s)", |r| {
        !["pending", "queued", "running"].contains(&r.state.as_str())
    })
    .await?;
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "timed_out".to_owned())],
        "attempts {:?}, expected attempt 1 timed_out",
        states(&attempts)
    );
    let a = &attempts[0];
    let took = a
        .finished_at
        .map(|f| ms(a.started_at, f))
        .context("no finished_at")?;
    ensure!(
        (950..=8_000).contains(&took),
        "the attempt lasted {took} ms with a 1 s timeout (and a grace of at most 5 s)"
    );
    let run = w.run(id).await?;
    ensure!(
        run.state == "dead",
        "the run is {} (one attempt allowed: dead)",
        run.state
    );
    Ok(Verdict::Pass(format!(
        "timed_out after {took} ms (timeout 1000 ms): {}",
        a.error.clone().unwrap_or_default()
    )))
}

async fn cancel_running(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let id = w.trigger("conf-sleep", json!({"seconds": 30})).await?;
    w.wait_logged(id, "sleeping", PATIENCE).await?;
    let asked = Utc::now();
    w.ops
        .cancel_run(&Caller::cli(), id)
        .await
        .map_err(|e| anyhow::anyhow!("cancelling run {id}: {e}"))?;
    w.wait_state(id, "cancelled", Duration::from_secs(15))
        .await?;
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "cancelled".to_owned())],
        "attempts {:?}",
        states(&attempts)
    );
    let finished = attempts[0].finished_at.context("no finished_at")?;
    let after = ms(asked, finished);
    ensure!(
        after < 6_000,
        "the handler stopped {after} ms after the cancel (grace 5 s)"
    );
    Ok(Verdict::Pass(format!(
        "attempt cancelled {after} ms after the request"
    )))
}

async fn cancel_queued(w: &mut World) -> anyhow::Result<Verdict> {
    // No worker yet: the run waits in the queue.
    let id = w.trigger("conf-ok", json!({"tag": "cancelled"})).await?;
    w.wait_state(id, "queued", PATIENCE).await?;
    w.ops
        .cancel_run(&Caller::cli(), id)
        .await
        .map_err(|e| anyhow::anyhow!("cancelling run {id}: {e}"))?;
    w.wait_state(id, "cancelled", PATIENCE).await?;
    let _worker = w.start_worker().await?;
    flush(w, "after the cancelled one").await?;
    let attempts = w.attempts(id).await?;
    ensure!(
        attempts.is_empty(),
        "the cancelled run has attempts {:?}",
        states(&attempts)
    );
    let logs = messages(&w.logs(id).await?);
    ensure!(logs.is_empty(), "the cancelled run logged {logs:?}");
    let run = w.run(id).await?;
    ensure!(run.state == "cancelled", "the run is {} now", run.state);
    Ok(Verdict::Pass(
        "its trigger was delivered and not run".into(),
    ))
}

async fn poison_parked(w: &mut World) -> anyhow::Result<Verdict> {
    let worker = w.start_worker().await?;
    wait_consumers(w, 1).await?;
    let bodies: [&[u8]; 2] = [
        b"this is not a trigger {",
        br#"{"v":2,"run_id":1,"job":"conf-ok","group":"g","attempt":1,"scheduled_at":"2026-01-01T00:00:00Z"}"#,
    ];
    for body in bodies {
        publish(
            w,
            body,
            BasicProperties::default()
                .with_message_id("987654321".into())
                .with_content_type("application/json".into()),
        )
        .await?;
    }
    let mut reasons = Vec::new();
    for body in bodies {
        let label = String::from_utf8_lossy(&body[..12]).into_owned();
        let (reason, parked_by, stored, headers) =
            wait_parked(w, &format!("the body starting {label:?}"), |_, b| b == body).await?;
        let reason = reason.unwrap_or_default();
        ensure!(
            !reason.is_empty() && headers.get("x-chime-dead-reason").is_some(),
            "parked without x-chime-dead-reason; headers {headers}"
        );
        ensure!(stored == body, "the parked body was changed");
        ensure!(
            parked_by.as_deref() == Some(worker.id.as_str()),
            "x-chime-dead-by is {parked_by:?}, not the worker id"
        );
        reasons.push(reason);
    }
    flush(w, "after the poison").await?;
    Ok(Verdict::Pass(format!(
        "both parked; reasons: {}",
        reasons.join(" / ")
    )))
}

async fn sigkill_takeover(w: &mut World) -> anyhow::Result<Verdict> {
    let mut doomed = w.start_worker().await?;
    let id = w.trigger("conf-sleep", json!({"seconds": 3})).await?;
    w.wait_logged(id, "sleeping", PATIENCE).await?;
    let run = w.run(id).await?;
    ensure!(
        run.worker_id.as_deref() == Some(doomed.id.as_str()),
        "run {id} runs on {:?}, not on the only worker {:?}",
        run.worker_id,
        doomed.id
    );
    let survivor = w.start_worker().await?;
    wait_consumers(w, 2).await?;
    // The first worker counts as lost 3 heartbeat intervals after its last beat.
    let interval: i32 =
        sqlx::query_scalar("SELECT heartbeat_interval_ms FROM chime_workers WHERE id = $1")
            .bind(&doomed.id)
            .fetch_one(&w.pool)
            .await?;
    let patience = PATIENCE + Duration::from_millis(3 * u64::try_from(interval.max(0))?);
    let killed = Utc::now();
    doomed.kill().await?;
    let run = w.wait_state(id, "succeeded", patience).await?;
    ensure!(run.attempt == 2, "succeeded on attempt {}", run.attempt);
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "lost".to_owned()), (2, "succeeded".to_owned())],
        "attempts {:?}",
        states(&attempts)
    );
    ensure!(
        attempts[0].worker_id == doomed.id && attempts[1].worker_id == survivor.id,
        "attempt 1 on {:?}, attempt 2 on {:?}",
        attempts[0].worker_id,
        attempts[1].worker_id
    );
    let recovery = ms(killed, attempts[1].started_at);
    Ok(Verdict::Pass(format!(
        "attempt 1 lost; attempt 2 started on the second worker {recovery} ms after the kill"
    )))
}

async fn logs_live(w: &mut World) -> anyhow::Result<Verdict> {
    let _worker = w.start_worker().await?;
    let lines = 5;
    let id = w
        .trigger("conf-log", json!({"lines": lines, "every": 0.5}))
        .await?;
    // Poll the lines and the run's state; note when each line was first seen, and whether the
    // run was still running after that read.
    let mut seen: BTreeMap<i64, (String, i64, bool)> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let logs = w.logs(id).await?;
        let now = Utc::now();
        let run = w.run(id).await?;
        let running = run.state == "running";
        note_lines(&mut seen, logs, now, running);
        if !["pending", "queued", "running"].contains(&run.state.as_str()) {
            ensure!(run.state == "succeeded", "the run ended {}", run.state);
            // The last line may have been stored between the read of the lines above and the
            // read of the state: read the lines once more now that the run has ended.
            let logs = w.logs(id).await?;
            note_lines(&mut seen, logs, Utc::now(), false);
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the run did not finish within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The job's lines, in order (a runner may add lines of its own).
    seen.retain(|_, (message, _, _)| {
        message
            .strip_prefix("line ")
            .is_some_and(|n| n.parse::<u32>().is_ok())
    });
    let got: Vec<&str> = seen.values().map(|(m, _, _)| m.as_str()).collect();
    let want: Vec<String> = (1..=lines).map(|i| format!("line {i}")).collect();
    ensure!(got == want, "log lines {got:?}, expected {want:?}");
    let live = seen.values().filter(|(_, _, running)| *running).count();
    ensure!(
        live >= lines - 1,
        "only {live} of {lines} lines were stored while the run was running"
    );
    let worst = seen.values().map(|(_, lag, _)| *lag).max().unwrap_or(0);
    for (message, lag, running) in seen.values() {
        if *running {
            ensure!(
                *lag <= LOG_LAG_LIMIT_MS,
                "{message:?} was stored {lag} ms after it was logged (limit 1 s)"
            );
        }
    }
    Ok(Verdict::Pass(format!(
        "{live} of {lines} lines seen while running; worst lag {worst} ms"
    )))
}

/// Notes each line not seen before: its message, how long after it was logged it was first seen,
/// and whether the run was still running after the read that returned it.
fn note_lines(
    seen: &mut BTreeMap<i64, (String, i64, bool)>,
    logs: Vec<LogRow>,
    now: DateTime<Utc>,
    running: bool,
) {
    for line in logs {
        seen.entry(line.id)
            .or_insert_with(|| (line.message, ms(line.at, now), running));
    }
}

async fn sigterm_drain(w: &mut World) -> anyhow::Result<Verdict> {
    let mut worker = w.start_worker().await?;
    let id = w.trigger("conf-sleep", json!({"seconds": 2})).await?;
    w.wait_logged(id, "sleeping", PATIENCE).await?;
    let asked = tokio::time::Instant::now();
    let clean = worker.terminate(Duration::from_secs(40)).await?;
    let took = asked.elapsed().as_millis();
    ensure!(
        clean,
        "the worker did not exit with status 0 after SIGTERM; its log: {}",
        worker.log()
    );
    // Read once, at once: the outcome must be recorded before the process exits.
    let run = w.run(id).await?;
    ensure!(
        run.state == "succeeded",
        "after the worker exited the run is {} (attempt {})",
        run.state,
        run.attempt
    );
    let attempts = w.attempts(id).await?;
    ensure!(
        states(&attempts) == [(1, "succeeded".to_owned())],
        "attempts {:?}",
        states(&attempts)
    );
    let a = &attempts[0];
    let slept = a.finished_at.map_or(0, |f| ms(a.started_at, f));
    ensure!(slept >= 1_950, "the handler ran only {slept} ms of its 2 s");
    let stopped: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT stopped_at FROM chime_workers WHERE id = $1")
            .bind(&worker.id)
            .fetch_one(&w.pool)
            .await?;
    ensure!(
        stopped.is_some(),
        "the worker exited without chime_worker_stopped"
    );
    Ok(Verdict::Pass(format!(
        "handler finished ({slept} ms), recorded; exit 0 {took} ms after SIGTERM"
    )))
}

async fn least_privilege(w: &mut World) -> anyhow::Result<Verdict> {
    let Some(role) = w.role().map(str::to_owned) else {
        return Ok(Verdict::Skip(
            "no chime_grant_worker in the schema (or --privilege off)".into(),
        ));
    };
    let _worker = w.start_worker().await?;
    let id = w.trigger("conf-ok", json!({"tag": "as a role"})).await?;
    w.wait_state(id, "succeeded", PATIENCE).await?;
    let sessions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND usename = $1",
    )
    .bind(&role)
    .fetch_one(&w.pool)
    .await?;
    ensure!(
        sessions > 0,
        "the worker has no session as role {role}: it did not use CHIME_DATABASE_URL"
    );
    let other_group = format!("{}-other", w.group);
    let other = w.trigger("conf-other", json!({})).await?;
    w.wait_state(other, "queued", PATIENCE).await?;
    let role = sqlx::PgPool::connect(w.worker_database_url())
        .await
        .context("connecting as the worker's role")?;
    let claimed = sqlx::query(
        "SELECT run_id FROM chime_claim(ARRAY[$1::bigint], ARRAY[1], ARRAY['conf-other'],
                                         ARRAY[NULL::timestamptz], 'conf-intruder', $2)",
    )
    .bind(other)
    .bind(&other_group)
    .fetch_all(&role)
    .await;
    role.close().await;
    let code = match claimed {
        Ok(rows) => bail!(
            "the role granted only group {} called chime_claim on a run of group {other_group} \
             and got {} rows, not SQLSTATE 42501",
            w.group,
            rows.len()
        ),
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
        Err(e) => bail!("chime_claim as the role failed with {e}, not SQLSTATE 42501"),
    };
    ensure!(
        code.as_deref() == Some("42501"),
        "chime_claim as the role failed with SQLSTATE {code:?}, not 42501"
    );
    let run = w.run(other).await?;
    ensure!(
        run.state == "queued",
        "the other group's run is {}",
        run.state
    );
    Ok(Verdict::Pass(format!(
        "worker ran as a role granted group {} only ({sessions} sessions); claiming another \
         group's run: 42501",
        w.group
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_valid_jobs_and_a_runner() {
        for scenario in SCENARIOS {
            let jobs = jobs(scenario.name, "g").expect("valid jobs");
            assert!(jobs.len() >= 5, "{}", scenario.name);
        }
    }
}
