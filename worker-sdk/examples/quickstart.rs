//! The README's quick-start worker (README.md, "A worker"), compiled as written.
use chime_worker::{JobContext, JobError, Worker};

#[derive(serde::Deserialize)]
struct CloseUnpaid {
    batch: u32,
}

async fn close_unpaid_orders(ctx: JobContext, p: CloseUnpaid) -> Result<(), JobError> {
    ctx.log().info(format!("closing up to {} orders", p.batch)); // stored with the run
    // `?` on any error retries under the job's policy; JobError::fail(..) gives up at once,
    // JobError::retry_after(d, ..) picks the delay; ctx.cancellation_token() fires on a
    // timeout or a `chime runs cancel`.
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Prints the worker's start, every run and the handlers' log lines on stderr.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_writer(std::io::stderr)
        .init();
    // Connects with CHIME_DATABASE_URL, CHIME_AMQP_URL and CHIME_QUEUE_PREFIX (defaults: the
    // local PostgreSQL database `chime`, the local RabbitMQ, prefix `chime`).
    Worker::builder("orders")
        .capacity(8) // concurrent handlers
        .hold(256) // + triggers held for their instant; prefetch = capacity + hold
        .handle("close-unpaid-orders", close_unpaid_orders)
        .build()?
        .run_until_signal() // SIGTERM or Ctrl-C drains in-flight handlers
        .await?;
    Ok(())
}
