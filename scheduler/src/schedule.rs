//! Schedules (pure: no IO, never reads the clock): cron in three dialects, fixed rate, one-shot, manual.
//!
//! SKELETON — being implemented by the schedule helper. Public API is fixed:

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use std::time::Duration;

/// When a job fires.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A cron expression evaluated in a time zone.
    Cron(CronSchedule),
    /// Fixed rate: every `period`, aligned to the Unix epoch.
    Every(Duration),
    /// Once, at this instant.
    At(DateTime<Utc>),
    /// Never on its own: only manual triggers.
    Manual,
}

/// A parsed, normalised cron expression plus its time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    _private: (),
}

/// Why a schedule could not be built. Messages name the value and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression is invalid.
    #[error("invalid cron expression {expr:?}: {reason}")]
    Cron {
        /// The expression as written.
        expr: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A fixed-rate period of zero or sub-millisecond.
    #[error("invalid period {0:?}: use a duration of at least 1ms, such as \"30s\" or \"5m\"")]
    Period(String),
}

impl Schedule {
    /// A fixed-rate schedule; rejects periods under 1 ms.
    pub fn every(period: Duration) -> Result<Schedule, ScheduleError> {
        let _ = period;
        unimplemented!("schedule helper")
    }

    /// Parses a cron expression (5-field Unix, 6-field with seconds, 7-field Quartz, or a macro).
    pub fn cron(expr: &str, tz: Tz) -> Result<Schedule, ScheduleError> {
        let _ = (expr, tz);
        unimplemented!("schedule helper")
    }

    /// The first fire strictly after `after`, or `None` if the schedule never fires again.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let _ = after;
        unimplemented!("schedule helper")
    }

    /// Up to `n` fires strictly after `after`, in order.
    pub fn upcoming(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut cursor = after;
        while out.len() < n {
            match self.next_after(cursor) {
                Some(t) => {
                    out.push(t);
                    cursor = t;
                }
                None => break,
            }
        }
        out
    }
}
