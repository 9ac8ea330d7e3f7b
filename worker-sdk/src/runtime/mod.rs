//! The runtime: the public [`Worker`] and its builder (`worker`), and one worker's life
//! (`run`): register, open the link and consume until shutdown, with the heartbeat and the
//! retry of unwritten outcomes beside it, then drain and stop.
//!
//! **Layering:** the top of the crate. It wires the link's consume loop to the delivery path
//! (`run::Deliveries`, the link's `Dispatch`), so neither of those imports the runtime.

mod run;
mod worker;

pub use run::WorkerError;
pub use worker::{
    BuildError, DEFAULT_ACK_AFTER, DEFAULT_AMQP_URL, DEFAULT_CANCEL_GRACE, DEFAULT_CAPACITY,
    DEFAULT_DATABASE_URL, DEFAULT_DB_RETRY_BUDGET, DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HOLD, DEFAULT_UNHANDLED_WAIT, ENV_AMQP_URL,
    ENV_DATABASE_URL, ENV_QUEUE_PREFIX, ENV_WORKER_ID, MAX_QUEUE_NAME_BYTES, Worker, WorkerBuilder,
};
