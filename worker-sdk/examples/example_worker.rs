//! Example worker: handlers for the jobs of `deploy/examples/jobs.toml` and the demo's
//! `heartbeat` (`deploy/local/demo-jobs.toml`), each logging what it does, for the quick start.
//!
//! ```text
//! cargo run -p chime-worker --example example_worker -- [GROUP]
//! ```
//!
//! Settings come from the environment: the group from the first argument or `CHIME_GROUP`
//! (default `examples`, the group of the example jobs); `CHIME_CAPACITY` (default 8); `RUST_LOG`
//! (default `info`); and, read by `Worker::builder` itself, `CHIME_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/chime`), `CHIME_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`) and `CHIME_QUEUE_PREFIX` (default `chime`). SIGTERM
//! or Ctrl-C drains and exits.

use std::time::Duration;

use anyhow::Context;
use chime_worker::{JobContext, JobError, Worker};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Heartbeat {
    #[serde(default)]
    note: Option<String>,
}

/// `heartbeat` (the demo's every-2-seconds job): `{note}`, optional.
async fn heartbeat(ctx: JobContext, p: Option<Heartbeat>) -> Result<(), JobError> {
    let note = p.and_then(|p| p.note).unwrap_or_default();
    let late_ms = (chrono::Utc::now() - ctx.scheduled_at()).num_milliseconds();
    ctx.log().info(format!(
        "beat for {} ({late_ms} ms after its scheduled instant) {note}",
        ctx.scheduled_at()
    ));
    Ok(())
}

/// `weekday-digest`: no params.
async fn weekday_digest(ctx: JobContext, _: Value) -> Result<(), JobError> {
    ctx.log().info(format!(
        "collecting open tickets for the digest scheduled at {}",
        ctx.scheduled_at()
    ));
    ctx.log().info("digest sent to support@example.com");
    Ok(())
}

#[derive(Deserialize)]
struct CloseUnpaid {
    batch: u32,
    older_than_minutes: u32,
}

/// `close-unpaid-orders`: `{batch, older_than_minutes}`.
async fn close_unpaid_orders(ctx: JobContext, p: CloseUnpaid) -> Result<(), JobError> {
    let closed = fastrand::u32(0..=p.batch.min(20));
    ctx.log().info(format!(
        "closed {closed} of at most {} orders unpaid for {} minutes (idempotency key: run {})",
        p.batch,
        p.older_than_minutes,
        ctx.run_id()
    ));
    Ok(())
}

#[derive(Deserialize)]
struct LedgerExport {
    format: String,
    bucket: String,
}

/// `nightly-ledger-export`: `{format, bucket}`; rejects formats it does not know, without retry.
async fn nightly_ledger_export(ctx: JobContext, p: LedgerExport) -> Result<(), JobError> {
    if !matches!(p.format.as_str(), "parquet" | "csv") {
        return Err(JobError::fail(format!(
            "unknown export format `{}`: use parquet or csv",
            p.format
        )));
    }
    ctx.log().info(format!(
        "exported the ledger of {} as {} to s3://{}/",
        ctx.scheduled_at().date_naive(),
        p.format,
        p.bucket
    ));
    Ok(())
}

#[derive(Deserialize)]
struct Purge {
    older_than: String,
}

/// `purge-temp-uploads`: `{older_than}`.
async fn purge_temp_uploads(ctx: JobContext, p: Purge) -> Result<(), JobError> {
    ctx.log().info(format!(
        "purged temporary uploads older than {}",
        p.older_than
    ));
    Ok(())
}

/// `refresh-exchange-rates`: fails (retryably) one time in five, like a flaky upstream API.
async fn refresh_exchange_rates(ctx: JobContext, _: Value) -> Result<(), JobError> {
    if fastrand::u8(0..5) == 0 {
        ctx.log().error("rates provider answered 503");
        // Any error converts into a retryable failure with `?`.
        Err(std::io::Error::other("rates provider unavailable (503)"))?;
    }
    ctx.log().info("refreshed 32 exchange rates");
    Ok(())
}

#[derive(Deserialize)]
struct Campaign {
    campaign: String,
}

/// `open-spring-sale`: `{campaign}`.
async fn open_spring_sale(ctx: JobContext, p: Campaign) -> Result<(), JobError> {
    ctx.log()
        .info(format!("campaign `{}` is now live", p.campaign));
    Ok(())
}

#[derive(Deserialize)]
struct Reindex {
    full: bool,
    shards: Vec<u32>,
}

/// `reindex-products`: `{full, shards}`; works shard by shard and stops early when cancelled.
async fn reindex_products(ctx: JobContext, p: Reindex) -> Result<(), JobError> {
    let kind = if p.full { "full" } else { "incremental" };
    for shard in &p.shards {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                ctx.log().info(format!("{kind} reindex of shard {shard} done"));
            }
            _ = ctx.cancelled() => {
                ctx.log().warn(format!("cancelled before shard {shard}"));
                return Err(JobError::cancel(format!("cancelled before shard {shard}")));
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let group = std::env::args()
        .nth(1)
        .unwrap_or_else(|| env("CHIME_GROUP", "examples"));
    let capacity: u16 = env("CHIME_CAPACITY", "8")
        .parse()
        .context("CHIME_CAPACITY must be a number from 1 to 65535")?;

    Worker::builder(group)
        .capacity(capacity)
        .handle("heartbeat", heartbeat)
        .handle("weekday-digest", weekday_digest)
        .handle("close-unpaid-orders", close_unpaid_orders)
        .handle("nightly-ledger-export", nightly_ledger_export)
        .handle("purge-temp-uploads", purge_temp_uploads)
        .handle("refresh-exchange-rates", refresh_exchange_rates)
        .handle("open-spring-sale", open_spring_sale)
        .handle("reindex-products", reindex_products)
        .build()?
        .run_until_signal()
        .await?;
    Ok(())
}
