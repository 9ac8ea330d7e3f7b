//! End-to-end tests of Chime against the real local PostgreSQL and RabbitMQ: schedulers, the
//! broker and SDK workers together. One test binary; every test has its own database and queue
//! prefix, so they run in parallel.

mod api;
mod backfill;
mod bench_smoke;
mod chaos;
mod children;
mod common;
mod conformance;
mod control;
mod dashboard;
mod dead_letters;
mod failures;
mod fencing;
mod fires;
mod ha;
mod kinds;
mod kinds_processes;
mod ops;
mod outage;
mod pg_failover;
mod policies;
mod quickstart;
mod rabbit_cluster;
mod restarts;
mod timing;
mod tls;
mod workflows;
