//! A worker process for the end-to-end failure and job kinds tests, so that a test can SIGKILL
//! a real process mid-run or let one crash on a poison message.
//!
//! Configured by the environment (all required unless a default is given):
//! `CHIME_TEST_DATABASE_URL`, `CHIME_TEST_AMQP_URLS` (one broker address, or a cluster's,
//! comma-separated), `CHIME_TEST_AMQP_CA_FILE` (optional: CA certificates for `amqps://`),
//! `CHIME_TEST_PREFIX`, `CHIME_TEST_GROUP`, `CHIME_TEST_WORKER_ID`, `CHIME_TEST_HEARTBEAT_MS` (default 500), `CHIME_TEST_CAPACITY`
//! (default 2), `CHIME_TEST_CHAOS_JOBS` (default 0: also handle `chaos-0000` … `chaos-N-1` like
//! `chaos`), `CHIME_TEST_HANG_AFTER` (default: never; see `kinds-*`), `RUST_LOG` (default
//! `warn`).
//!
//! Jobs: `sleep` (params `{"ms": N}`: logs, sleeps N ms, succeeds), `abort` (aborts the whole
//! process, like a segfault or an OOM kill would), `ok` (succeeds at once), `chaos` (params
//! `{"ms": N}`: prints `ran RUN_ID ATTEMPT` on stdout, so the chaos suite can count executions
//! even of a worker it kills, then sleeps N ms and succeeds).
//!
//! The job kinds' jobs (tests/e2e/kinds_processes.rs) print `ran RUN_ID ATTEMPT UNIX_MS` as each
//! task starts (the wall clock then, in milliseconds since the Unix epoch); past the first `CHIME_TEST_HANG_AFTER` such starts, this process's tasks then
//! print `hung RUN_ID ATTEMPT` and hang until cancelled, so that a test kills the process with
//! tasks certainly mid-run. `kinds-task` (a broadcast or sharded job; params `{"ms": N,
//! "fail_shard": I, "fail_attempts": K}`, all optional): sleeps N ms, then fails (retryably) if
//! it is shard I at one of its first K attempts, else succeeds. `kinds-map` (a map/reduce job;
//! params `{"items": N, "ms": M}`): the root task maps items `{"n": 0, "ms": M}` …
//! `{"n": N-1, …}` and prints `mapped RUN_ID ATTEMPT CREATED`; each item sleeps M ms and stores
//! the output `{"double": 2n}`; the reducer prints `reduced RUN_ID ATTEMPT RESULTS
//! MAPS_SUCCEEDED SUM` (the results it read, how many are succeeded map tasks, and their
//! doubles' sum) and stores `{"sum": SUM}`.
//!
//! The worker runs until SIGTERM or Ctrl-C, then drains.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use chime_worker::{JobContext, JobError, RunState, TaskError, TaskKind, Worker};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Sleep {
    ms: u64,
}

async fn sleep(ctx: JobContext, p: Sleep) -> Result<(), JobError> {
    ctx.log()
        .info(format!("sleeping {} ms (attempt {})", p.ms, ctx.attempt()));
    tokio::time::sleep(Duration::from_millis(p.ms)).await;
    Ok(())
}

async fn chaos(ctx: JobContext, p: Sleep) -> Result<(), JobError> {
    // `println!` flushes at the newline: the line is out before the handler can be killed.
    println!("ran {} {}", ctx.run_id(), ctx.attempt());
    tokio::time::sleep(Duration::from_millis(p.ms)).await;
    Ok(())
}

async fn abort(ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
    eprintln!(
        "chime-test-worker: aborting on run {} attempt {}",
        ctx.run_id(),
        ctx.attempt()
    );
    std::process::abort()
}

async fn ok(_: JobContext, _: serde_json::Value) -> Result<(), JobError> {
    Ok(())
}

/// `CHIME_TEST_HANG_AFTER`: the job kinds' task starts of this process that run normally.
static HANG_AFTER: OnceLock<Option<u64>> = OnceLock::new();
/// The job kinds' task starts of this process so far.
static STARTED: AtomicU64 = AtomicU64::new(0);

/// A job kinds' task starts: prints `ran RUN_ID ATTEMPT UNIX_MS` (flushed at the newline, so it
/// is out before the process can be killed); past `CHIME_TEST_HANG_AFTER` starts it then prints
/// `hung RUN_ID ATTEMPT` and waits for the task's cancellation, which a killed process never
/// sees. (Concurrent starts print in any order: the `hung` lines, not the `ran` lines' order,
/// say which tasks hang.)
async fn task_started(ctx: &JobContext) -> Result<(), JobError> {
    let now = chrono::Utc::now().timestamp_millis();
    println!("ran {} {} {now}", ctx.run_id(), ctx.attempt());
    let started = STARTED.fetch_add(1, Ordering::SeqCst) + 1;
    if HANG_AFTER
        .get()
        .copied()
        .flatten()
        .is_some_and(|after| started > after)
    {
        println!("hung {} {}", ctx.run_id(), ctx.attempt());
        ctx.cancelled().await;
        return Err(JobError::cancel(
            "hung until cancelled (CHIME_TEST_HANG_AFTER)",
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
struct KindsTask {
    #[serde(default)]
    ms: u64,
    fail_shard: Option<u32>,
    #[serde(default)]
    fail_attempts: u32,
}

async fn kinds_task(ctx: JobContext, p: KindsTask) -> Result<(), JobError> {
    task_started(&ctx).await?;
    tokio::time::sleep(Duration::from_millis(p.ms)).await;
    if let Some(index) = ctx.shard().map(|s| s.index)
        && p.fail_shard == Some(index)
        && ctx.attempt() <= p.fail_attempts
    {
        return Err(JobError::retry(format!(
            "shard {index} fails attempt {} (its first {} fail)",
            ctx.attempt(),
            p.fail_attempts
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
struct KindsMap {
    #[serde(default)]
    items: u64,
    #[serde(default)]
    n: i64,
    #[serde(default)]
    ms: u64,
}

async fn kinds_map(ctx: JobContext, p: KindsMap) -> Result<(), JobError> {
    if ctx.task().map(|t| t.kind) == Some(TaskKind::Root) {
        let items = (0..p.items).map(|n| json!({"n": n, "ms": p.ms}));
        let created = ctx
            .map("items", items)
            .await
            .map_err(TaskError::into_job_error)?;
        println!("mapped {} {} {created}", ctx.run_id(), ctx.attempt());
        return Ok(());
    }
    task_started(&ctx).await?;
    tokio::time::sleep(Duration::from_millis(p.ms)).await;
    ctx.set_output(&json!({"double": p.n * 2}))
        .await
        .map_err(TaskError::into_job_error)
}

async fn kinds_reduce(ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
    let results = ctx.results().await.map_err(TaskError::into_job_error)?;
    let maps: Vec<_> = results
        .iter()
        .filter(|r| r.kind == TaskKind::Map && r.state == RunState::Succeeded)
        .collect();
    let sum: i64 = maps
        .iter()
        .filter_map(|r| r.output.as_ref()?.get("double")?.as_i64())
        .sum();
    println!(
        "reduced {} {} {} {} {sum}",
        ctx.run_id(),
        ctx.attempt(),
        results.len(),
        maps.len()
    );
    ctx.set_output(&json!({"sum": sum}))
        .await
        .map_err(TaskError::into_job_error)
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("environment variable {name} is required"))
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let hang_after = match std::env::var("CHIME_TEST_HANG_AFTER") {
        Ok(_) => Some(number("CHIME_TEST_HANG_AFTER", 0u64)?),
        Err(_) => None,
    };
    HANG_AFTER.set(hang_after).expect("set once, first");
    let mut builder = Worker::builder(var("CHIME_TEST_GROUP")?)
        .database_url(var("CHIME_TEST_DATABASE_URL")?)
        .amqp_urls(chime_protocol::addresses::split_list(&var(
            "CHIME_TEST_AMQP_URLS",
        )?))
        .prefix(var("CHIME_TEST_PREFIX")?)
        .worker_id(var("CHIME_TEST_WORKER_ID")?)
        .heartbeat_interval(Duration::from_millis(number(
            "CHIME_TEST_HEARTBEAT_MS",
            500,
        )?))
        .capacity(number("CHIME_TEST_CAPACITY", 2)?)
        .handle("sleep", sleep)
        .handle("abort", abort)
        .handle("ok", ok)
        .handle("chaos", chaos)
        .handle("kinds-task", kinds_task)
        .handle("kinds-map", kinds_map)
        .reducer("kinds-map", kinds_reduce);
    for i in 0..number("CHIME_TEST_CHAOS_JOBS", 0usize)? {
        builder = builder.handle(format!("chaos-{i:04}"), chaos);
    }
    if let Ok(ca) = std::env::var("CHIME_TEST_AMQP_CA_FILE") {
        builder = builder.amqp_tls(chime_worker::AmqpTls::new().ca_file(ca));
    }
    let worker = builder.build()?;
    worker.run_until_signal().await?;
    Ok(())
}
