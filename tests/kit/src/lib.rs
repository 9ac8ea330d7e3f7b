//! Chime's test kit, shared by the end-to-end suite and benchmarks (`tests/`) and the worker
//! SDK's integration tests (`worker-sdk/tests/`): one way to wait for a condition
//! ([`wait_for`]), one way to capture what a worker or handler did ([`Events`]), and one
//! per-test setup ([`Setup`]: the test's own database, its own queue prefix and group, and the
//! deletion of its exchanges and queues, also when the test fails), database roles that are
//! dropped when the test ends ([`RoleGuard`]), and the files under `deploy/` as the tests beside
//! each binary check them ([`Unit`], [`env_file`]).
//!
//! A test reads like this (tests/README.md has the longer version):
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) {
//! use chime_test_kit::{Setup, WAIT, done_if, wait_for};
//!
//! let t = Setup::new(&pool); // own database (`#[sqlx::test]`), prefix and group
//! // … start a scheduler and a worker on t.database_url, t.prefix, t.group …
//! let count: i64 = wait_for(WAIT, "two runs", || async {
//!     let n = sqlx::query_scalar("SELECT count(*) FROM chime_runs")
//!         .fetch_one(&t.pool)
//!         .await
//!         .expect("count runs");
//!     done_if(n, |n| *n >= 2)
//! })
//! .await;
//! assert_eq!(count, 2);
//! t.finish().await; // or let it drop: the topology is deleted either way
//! # }
//! ```
//!
//! This crate depends on neither the scheduler nor the SDK, so that the SDK can use it as a
//! dev-dependency without the scheduler ever depending on the SDK.

mod broker;
mod deploy;
mod events;
mod roles;
mod setup;
mod wait;

pub use broker::{
    AMQP_URL, TopologyGuard, amqp_url, confirm_channel, passive_declare, publish_routed, unique,
};
pub use deploy::{Unit, deploy_path, env_file};
pub use events::{Events, LogGuard, capture_logs};
pub use roles::RoleGuard;
pub use setup::{Setup, database_url, init_tracing};
pub use wait::{Outcome, TimedOut, WAIT, done_if, try_wait_for, wait_for};
