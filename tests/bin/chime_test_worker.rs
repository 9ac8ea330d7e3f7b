//! A worker process for the end-to-end failure tests, so that a test can SIGKILL a real
//! process mid-run or let one crash on a poison message.
//!
//! Configured by the environment (all required unless a default is given):
//! `CHIME_TEST_DATABASE_URL`, `CHIME_TEST_AMQP_URL`, `CHIME_TEST_PREFIX`, `CHIME_TEST_GROUP`,
//! `CHIME_TEST_WORKER_ID`, `CHIME_TEST_HEARTBEAT_MS` (default 500), `CHIME_TEST_CAPACITY`
//! (default 2), `CHIME_TEST_CHAOS_JOBS` (default 0: also handle `chaos-0000` … `chaos-N-1` like
//! `chaos`), `RUST_LOG` (default `warn`).
//!
//! Jobs: `sleep` (params `{"ms": N}`: logs, sleeps N ms, succeeds), `abort` (aborts the whole
//! process, like a segfault or an OOM kill would), `ok` (succeeds at once), `chaos` (params
//! `{"ms": N}`: prints `ran RUN_ID ATTEMPT` on stdout, so the chaos suite can count executions
//! even of a worker it kills, then sleeps N ms and succeeds). The worker runs
//! until SIGTERM or Ctrl-C, then drains.

use std::time::Duration;

use anyhow::Context;
use chime_worker::{JobContext, JobError, Worker};
use serde::Deserialize;

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
    let mut builder = Worker::builder(var("CHIME_TEST_GROUP")?)
        .database_url(var("CHIME_TEST_DATABASE_URL")?)
        .amqp_url(var("CHIME_TEST_AMQP_URL")?)
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
        .handle("chaos", chaos);
    for i in 0..number("CHIME_TEST_CHAOS_JOBS", 0usize)? {
        builder = builder.handle(format!("chaos-{i:04}"), chaos);
    }
    let worker = builder.build()?;
    worker.run_until_signal().await?;
    Ok(())
}
