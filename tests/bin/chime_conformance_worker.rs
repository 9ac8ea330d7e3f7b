//! The Rust SDK's conformance worker: the five `conf-*` jobs of docs/conformance.md on
//! `chime-worker`, configured only by the environment the conformance suite
//! (`chime-conformance`) gives every worker under test.
//!
//! Environment: `CHIME_DATABASE_URL`, `CHIME_AMQP_URL`, `CHIME_QUEUE_PREFIX` (read by the SDK),
//! `CHIME_GROUP`, `CHIME_WORKER_ID` (required here), `RUST_LOG` (default `warn`). It runs until
//! SIGTERM or Ctrl-C, then drains.

use std::time::Duration;

use anyhow::Context as _;
use chime_worker::{JobContext, JobError, Worker};
use serde::Deserialize;

/// `conf-ok`'s params.
#[derive(Deserialize)]
struct Ok {
    #[serde(default)]
    tag: String,
}

/// `conf-sleep`'s params.
#[derive(Deserialize)]
struct Sleep {
    seconds: f64,
}

/// `conf-fail`'s params.
#[derive(Deserialize)]
struct Fail {
    fails: u32,
}

/// `conf-log`'s params.
#[derive(Deserialize)]
struct Log {
    lines: u32,
    every: f64,
}

/// Longest sleep or log interval the jobs accept: the suite's own are seconds long.
const MAX_SECONDS: f64 = 3_600.0;

/// `seconds` as a duration, or a fatal error naming the field and the bound.
fn seconds(field: &str, value: f64) -> Result<Duration, JobError> {
    if !(0.0..=MAX_SECONDS).contains(&value) {
        return Err(JobError::fail(format!(
            "params.{field} is {value}; use a number of seconds from 0 to {MAX_SECONDS}"
        )));
    }
    Ok(Duration::from_secs_f64(value))
}

/// Sleeps `d`, or returns "cancel" as soon as the run's cancellation is signalled.
async fn sleep_or_cancel(ctx: &JobContext, d: Duration) -> Result<(), JobError> {
    tokio::select! {
        () = tokio::time::sleep(d) => Ok(()),
        () = ctx.cancelled() => Err(JobError::cancel("cancelled while sleeping")),
    }
}

async fn ok(ctx: JobContext, p: Ok) -> Result<(), JobError> {
    ctx.log().info(format!("ok {}", p.tag));
    Ok(())
}

async fn sleep(ctx: JobContext, p: Sleep) -> Result<(), JobError> {
    let d = seconds("seconds", p.seconds)?;
    ctx.log().info("sleeping");
    sleep_or_cancel(&ctx, d).await
}

async fn fail(ctx: JobContext, p: Fail) -> Result<(), JobError> {
    if ctx.attempt() <= p.fails {
        return Err(JobError::retry(format!(
            "failing attempt {} of the first {}",
            ctx.attempt(),
            p.fails
        )));
    }
    ctx.log()
        .info(format!("succeeded on attempt {}", ctx.attempt()));
    Ok(())
}

async fn fatal(_: JobContext, _: serde_json::Value) -> Result<(), JobError> {
    Err(JobError::fail("fatal: this job never succeeds"))
}

async fn log(ctx: JobContext, p: Log) -> Result<(), JobError> {
    let every = seconds("every", p.every)?;
    for i in 1..=p.lines {
        if i > 1 {
            sleep_or_cancel(&ctx, every).await?;
        }
        ctx.log().info(format!("line {i}"));
    }
    Ok(())
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("environment variable {name} is required"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let worker = Worker::builder(var("CHIME_GROUP")?)
        .worker_id(var("CHIME_WORKER_ID")?)
        .handle("conf-ok", ok)
        .handle("conf-sleep", sleep)
        .handle("conf-fail", fail)
        .handle("conf-fatal", fatal)
        .handle("conf-log", log)
        .build()?;
    worker.run_until_signal().await?;
    Ok(())
}
