//! Chime scheduler: a leader-elected planner that turns job schedules into runs and publishes
//! trigger messages to RabbitMQ. See ARCHITECTURE.md for the module map and invariants.

pub mod job;
pub mod schedule;
pub mod misfire;
pub mod leader;
pub mod publish;
pub mod store;
pub mod config;
pub mod check;
pub mod planner;
pub mod service;
pub mod cli;
