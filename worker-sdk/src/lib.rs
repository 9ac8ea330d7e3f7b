//! Chime worker SDK: embed it in a service to consume an executor group's trigger queue.
//!
//! A [`Worker`] registers async handlers by job name, consumes its group's RabbitMQ work queue
//! with bounded concurrency (prefetch = capacity), claims each attempt in PostgreSQL before
//! running it (so a duplicate delivery never executes twice), records the attempt's timings,
//! outcome and log lines, then acks. Messages it cannot run (undecodable, unknown job) go to the
//! group's parking lot with the reason. On shutdown it drains: stop consuming, let in-flight
//! handlers finish (bounded), cancel the rest, record everything, exit.
//!
//! Failures (`docs/failures.md`): a retryable failure is retried under the job's retry policy
//! ([`retry`]) through the group's delay tiers, and a run out of attempts is parked `dead`;
//! timeouts and operators' cancels (control messages) fire the handler's token; a run of a
//! crashed worker is taken over when that worker's heartbeat goes stale; a message that keeps
//! crashing workers is parked `dead` at the broker's delivery limit; handlers that run long have
//! their delivery acked early, before RabbitMQ's consumer timeout.
//!
//! ```no_run
//! use chime_worker::{JobContext, JobError, Worker};
//!
//! #[derive(serde::Deserialize)]
//! struct CloseUnpaid { batch: u32 }
//!
//! async fn close_unpaid_orders(ctx: JobContext, p: CloseUnpaid) -> Result<(), JobError> {
//!     ctx.log().info(format!("closing up to {} unpaid orders", p.batch));
//!     // `?` on any error is a retryable failure; JobError::fail(..) is final.
//!     Ok(())
//! }
//!
//! # async fn main_() -> anyhow::Result<()> {
//! Worker::builder("orders")
//!     .database_url("postgres://postgres@127.0.0.1:5432/chime")
//!     .amqp_url("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .capacity(4)
//!     .handle("close-unpaid-orders", close_unpaid_orders)
//!     .build()?
//!     .run_until_signal()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! TLS: an `amqps://` URL always connects over TLS; [`WorkerBuilder::amqp_tls`] adds a CA file
//! and a client certificate ([`AmqpTls`]), and the database URL takes libpq's `sslmode=verify-full`
//! and `sslrootcert=` ([`tls`]). Errors and `Debug` output show URLs through
//! [`redact::redact_url`], never with a password.
//!
//! Handlers are unit-tested without a broker or database through [`testing`]. The wire contract
//! (for workers in other languages) is in `docs/protocol.md`; a runnable example is
//! `examples/example_worker.rs`.

mod backoff;
mod claims;
mod consumer;
mod context;
mod delay;
mod delivery;
mod handler;
pub mod limits;
mod outcome;
mod parking;
pub mod protocol;
mod publish;
mod recording;
pub mod redact;
pub mod retry;
mod store;
pub mod testing;
pub mod tls;
pub mod topology;
mod verify;
mod worker;

pub use context::{JobContext, JobLogger, Level};
pub use handler::Handler;
pub use outcome::JobError;
pub use protocol::Trigger;
pub use tls::AmqpTls;
pub use topology::Topology;
pub use worker::{
    BuildError, DEFAULT_ACK_AFTER, DEFAULT_AMQP_URL, DEFAULT_CANCEL_GRACE, DEFAULT_CAPACITY,
    DEFAULT_DB_RETRY_BUDGET, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HOLD,
    Worker, WorkerBuilder, WorkerError,
};

/// Re-exported so handlers can name the token type without adding `tokio-util` themselves.
pub use tokio_util::sync::CancellationToken;
