//! Chime scheduler: a leader-elected planner that turns job schedules into runs and publishes
//! trigger messages to RabbitMQ. See ARCHITECTURE.md for the module map and invariants.

pub mod alerts;
pub mod amqp;
pub mod api;
pub mod auth;
pub mod backfill;
pub mod broker;
pub mod check;
pub mod cli;
pub mod config;
pub mod dashboard;
pub mod diff;
pub mod dispatcher;
pub mod job;
pub mod leader;
pub mod metrics;
pub mod misfire;
pub mod ops;
pub mod outbox;
pub mod overdue;
pub mod pace;
pub mod parking;
pub mod planner;
pub mod publish;
pub mod rescuer;
pub mod retention;
pub mod schedule;
pub mod secrets;
pub mod service;
pub mod store;
pub mod watch;
pub mod workflow;
