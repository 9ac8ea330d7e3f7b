//! Chime worker SDK: embed it in a service to consume an executor group's trigger queue.
//!
//! A [`Worker`] registers async handlers by job name, consumes its group's RabbitMQ work queue
//! with bounded concurrency (prefetch = capacity + hold), claims each attempt in PostgreSQL before
//! running it (so a duplicate delivery never executes twice), records the attempt's timings,
//! outcome and log lines, then acks. Messages it cannot run (undecodable, forged) go to the
//! group's parking lot with the reason; so does a job no online worker of the group has a
//! handler for, once it has waited `unhandled_wait` for one (a rolling deploy). On shutdown it drains: stop consuming, let in-flight
//! handlers finish (bounded), cancel the rest, record everything, exit.
//!
//! Failures (`docs/failures.md`): a retryable failure is retried under the job's retry policy
//! (`chime_protocol::retry`) through the group's delay tiers, and a run out of attempts is
//! parked `dead`; timeouts and operators' cancels (control messages) fire the handler's token; a
//! run of a crashed worker is taken over when that worker's heartbeat goes stale; a message that
//! keeps crashing workers is parked `dead` at the broker's delivery limit; handlers that run long
//! have their delivery acked early, before RabbitMQ's consumer timeout.
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
//! // The database, broker and queue prefix come from CHIME_DATABASE_URL, CHIME_AMQP_URL and
//! // CHIME_QUEUE_PREFIX, as for the `chime` CLI (see `Worker::builder`), unless set here.
//! Worker::builder("orders")
//!     .capacity(4) // concurrent handlers
//!     .hold(256) // + triggers held for their instant; prefetch = capacity + hold
//!     .handle("close-unpaid-orders", close_unpaid_orders)
//!     .build()?
//!     .run_until_signal()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! TLS: an `amqps://` URL always connects over TLS; [`WorkerBuilder::amqp_tls`] adds a CA file
//! and a client certificate ([`AmqpTls`]), and the database URL takes libpq's `sslmode=verify-full`
//! and `sslrootcert=` (`chime_protocol::tls`). Errors and `Debug` output show URLs through
//! `chime_protocol::redact::redact_url`, never with a password.
//!
//! Log lines written through [`JobContext::log`] reach `chime_run_logs` within a second (a batch
//! every 100 lines or 250 ms), at most `chime_protocol::limits::MAX_LOG_LINES_PER_ATTEMPT` per
//! attempt.
//!
//! Code may trigger runs too ([`Client`]: `client.trigger("job").params(..)?.at(..)
//! .idempotency_key(..).send()`), through the same database call as the API.
//!
//! # Job kinds
//!
//! A broadcast, sharded or map/reduce job fires as a parent run with tasks, each a run of its
//! own for the job's handler; [`JobContext::task`] says which, [`JobContext::shard`] gives a
//! shard its place, [`JobContext::map`] maps sub-tasks, [`JobContext::set_output`] stores an
//! output, and the job's reducer ([`WorkerBuilder::reducer`]) reads the other tasks'
//! results ([`JobContext::results`]). Each worker also consumes its own queue, for the
//! broadcast tasks meant for it; give it a stable id (`CHIME_WORKER_ID`). docs/protocol.md,
//! section 13.
//!
//! ```no_run
//! use chime_worker::{JobContext, JobError, TaskKind, Worker};
//!
//! // A sharded job: each shard of the run gets its index and the job's shard parameter.
//! async fn reindex(ctx: JobContext, _: ()) -> Result<(), JobError> {
//!     let shard = ctx.shard().ok_or_else(|| JobError::fail("reindex is a sharded job"))?;
//!     ctx.log().info(format!("shard {} of {}", shard.index, shard.total));
//!     Ok(())
//! }
//!
//! // A map/reduce job: the root task maps, the sub-tasks store outputs, the reducer sums them.
//! async fn count(ctx: JobContext, item: serde_json::Value) -> Result<(), JobError> {
//!     if ctx.task().map(|t| t.kind) == Some(TaskKind::Root) {
//!         ctx.map("file", ["a.txt", "b.txt"]).await?;
//!     } else {
//!         ctx.set_output(&item.as_str().map_or(0, str::len)).await?;
//!     }
//!     Ok(())
//! }
//!
//! async fn total(ctx: JobContext, _: ()) -> Result<(), JobError> {
//!     let results = ctx.results().await?;
//!     let sum: u64 = results.iter().filter_map(|r| r.output.as_ref()?.as_u64()).sum();
//!     ctx.set_output(&sum).await?;
//!     Ok(())
//! }
//!
//! # async fn main_() -> anyhow::Result<()> {
//! Worker::builder("docs")
//!     .handle("reindex", reindex)
//!     .handle("count", count)
//!     .reducer("count", total)
//!     .build()?
//!     .run_until_signal()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Child jobs
//!
//! A job named in another's `on_success`, `on_failure` or `on_complete` runs once after each
//! run of that job ends that way; its handler reads the run that started it with
//! [`JobContext::parent`]: its id, job, state, the output its handler stored, its error
//! (docs/runs.md, "Child runs"; docs/protocol.md, section 14).
//!
//! ```no_run
//! use chime_worker::{JobContext, JobError};
//!
//! async fn upload(ctx: JobContext, _: ()) -> Result<(), JobError> {
//!     let Some(export) = ctx.parent().await? else {
//!         return Err(JobError::fail("upload runs after export (on_success)"));
//!     };
//!     let file = export.output.as_ref().and_then(|o| o["file"].as_str()).unwrap_or("?");
//!     ctx.log().info(format!("uploading {file} from run {}", export.run_id));
//!     Ok(())
//! }
//! ```
//!
//! # Workflows
//!
//! A node of a workflow (a job file's `[[workflows]]`) runs its job with trigger `workflow`
//! once the nodes it comes after have ended; its handler reads the latest ended run of another
//! node of the same workflow run with [`JobContext::upstream`], by node name: the same
//! [`Upstream`] as [`JobContext::parent`], with [`Upstream::node`] set (docs/workflows.md).
//! The workflow run's params are layered into every node run's params (the job's, then the
//! workflow run's, then the node's), so the handler reads them as any params.
//!
//! ```no_run
//! use chime_worker::{JobContext, JobError, RunState};
//!
//! async fn clean(ctx: JobContext, _: ()) -> Result<(), JobError> {
//!     let Some(extract) = ctx.upstream("extract").await? else {
//!         return Err(JobError::fail("clean runs after node extract"));
//!     };
//!     if extract.state != RunState::Succeeded {
//!         return Err(JobError::fail(format!("extract ended {:?}", extract.state)));
//!     }
//!     let rows = extract.output.as_ref().and_then(|o| o["rows"].as_u64()).unwrap_or(0);
//!     ctx.log().info(format!("cleaning {rows} rows of run {}", extract.run_id));
//!     Ok(())
//! }
//! ```
//!
//! Handlers are unit-tested without a broker or database through [`testing`]. The wire contract
//! (for workers in other languages) is the `chime-protocol` crate, described in
//! `docs/protocol.md`; runnable examples are
//! `examples/quickstart.rs` (the README's worker) and `examples/example_worker.rs`.
//!
//! # Layers
//!
//! Each module imports only modules below it, never one above (no import cycles; checked by
//! `tests/layering.rs`):
//!
//! 1. `runtime` — the [`Worker`] and its builder; one worker's life: register, consume until
//!    shutdown, heartbeat, drain, stop. It hands the link's deliveries to the delivery path.
//! 2. `delivery` — one delivery's life, in order: `claim` (check the trigger, hold an early
//!    one, claim its attempt or take over a lost worker's run), `execute` (the handler under its
//!    timeout, cancel and shutdown), `settle` (record the outcome, then retry, park or ack);
//!    `unhandled` sends back a trigger of a job this worker has no handler for.
//! 3. `link` — RabbitMQ, and the only module that uses lapin: the connection and its channels,
//!    the supervised consumer, acks, and the confirmed publishes of retries and parked copies.
//! 4. Leaves, acyclic among themselves: `claims` and `recording` (batched claims and outcome
//!    writes) and [`Client`] (`client`: triggering runs from code) over `store` (the only
//!    module that speaks SQL); `verify` (pure checks of a
//!    trigger); [`testing`] and `handler` over `context` and `outcome` (`JobError` and the
//!    decision after an attempt); `context` and `store` over `tasks` (the job kinds' calls:
//!    map, output, results, parent, through a trait the store implements).

mod claims;
mod client;
mod context;
mod delivery;
mod handler;
mod link;
mod outcome;
mod recording;
mod runtime;
mod store;
mod tasks;
pub mod testing;
mod verify;

/// A run's or task's state, as [`TaskResult::state`] gives it.
pub use chime_protocol::RunState;
pub use chime_protocol::tls::AmqpTls;
/// The task types a [`JobContext`] hands out ([`JobContext::task`]), re-exported from the
/// protocol crate.
pub use chime_protocol::wire::{Shard, Task, TaskKind};
pub use client::{Client, DEFAULT_ACTOR, TriggerError, TriggerRun, Triggered};
pub use context::{JobContext, JobLogger, Level};
pub use handler::Handler;
pub use outcome::JobError;
pub use runtime::{
    BuildError, DEFAULT_ACK_AFTER, DEFAULT_AMQP_URL, DEFAULT_CANCEL_GRACE, DEFAULT_CAPACITY,
    DEFAULT_DATABASE_URL, DEFAULT_DB_RETRY_BUDGET, DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HOLD, DEFAULT_UNHANDLED_WAIT, ENV_AMQP_URL,
    ENV_DATABASE_URL, ENV_QUEUE_PREFIX, ENV_WORKER_ID, MAX_QUEUE_NAME_BYTES, Worker, WorkerBuilder,
    WorkerError,
};
pub use tasks::{
    MAX_MAP_ITEMS_PER_CALL, MAX_TASK_OUTPUT_BYTES, RESULTS_PAGE, TaskError, TaskResult, Upstream,
};

/// Re-exported so handlers can name the token type without adding `tokio-util` themselves.
pub use tokio_util::sync::CancellationToken;
