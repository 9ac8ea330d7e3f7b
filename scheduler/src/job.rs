//! The job definition: what config files and the runtime API declare, as validated domain values.
//!
//! A [`JobSpec`] is stored as JSON in `chime_jobs.spec`; its serde form is the same as the config
//! file form (durations as humantime strings such as "30s"), so a stored job reads like its file.

use chime_protocol::retry;
use chrono::{DateTime, FixedOffset};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::schedule::{Schedule, ScheduleError};

/// A validated job definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Unique job name; also the handler name workers register.
    pub name: String,
    /// Executor group: the RabbitMQ queue its triggers go to.
    pub group: String,
    /// Cron expression (exclusive with `every` and `at`; none of the three = manual only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Fixed rate, aligned to the Unix epoch ("30s" fires at :00 and :30).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub every: Option<Duration>,
    /// One-shot instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<FixedOffset>>,
    /// IANA time zone the cron expression is read in.
    #[serde(default = "utc")]
    pub timezone: Tz,
    /// JSON parameters handed to the handler.
    #[serde(default)]
    pub params: serde_json::Value,
    /// Keys of `params` whose values are secrets, hidden from viewers and in the audit log
    /// (besides the keys that read as credentials by convention, `crate::secrets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_params: Vec<String>,
    /// Handler timeout.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// What to do with fires missed while no leader could publish them.
    #[serde(default)]
    pub misfire: MisfirePolicy,
    /// A fire published later than this after its instant counts as missed.
    #[serde(default = "default_misfire_grace", with = "humantime_serde_compat")]
    pub misfire_grace: Duration,
    /// Missed fires older than this are skipped whatever the policy.
    #[serde(default = "default_catchup_window", with = "humantime_serde_compat")]
    pub catchup_window: Duration,
    /// At most this many missed fires are run by `fire_all`.
    #[serde(default = "default_max_catchup")]
    pub max_catchup: u32,
    /// Cluster-wide overlap policy.
    #[serde(default)]
    pub concurrency: ConcurrencyPolicy,
    /// Retries with exponential backoff after a failed attempt.
    #[serde(default)]
    pub retry: RetrySpec,
    /// Where this job's alerts go, overriding the settings' `alerts` (docs/failures.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<AlertSpec>,
    /// How long this job's finished runs are kept, overriding the `retention.max_age` setting.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub retention: Option<Duration>,
    /// Whether the job starts paused.
    #[serde(default)]
    pub paused: bool,
    /// Free text shown in listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Misfire (catch-up) policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// Record missed fires as skipped; resume with the next future fire.
    Skip,
    /// Run the latest missed fire once; record the others as skipped.
    #[default]
    FireOnce,
    /// Run every missed fire inside the catch-up window, up to `max_catchup`.
    FireAll,
}

/// Retry policy: `max_attempts` in all; the delay before attempt `n + 1` is
/// `min(max, initial × multiplier^(n−1))`, spread by ±20 % with `jitter` (docs/failures.md).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included; 1 = no retry.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Delay before the second attempt.
    #[serde(default = "default_retry_initial", with = "humantime_serde_compat")]
    pub initial: Duration,
    /// Factor applied to the delay after each further failure.
    #[serde(default = "default_retry_multiplier")]
    pub multiplier: f64,
    /// Upper bound of any delay.
    #[serde(default = "default_retry_max", with = "humantime_serde_compat")]
    pub max: Duration,
    /// Spread delays by a random factor in [0.8, 1.2].
    #[serde(default = "default_jitter")]
    pub jitter: bool,
}

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: default_max_attempts(),
            initial: default_retry_initial(),
            multiplier: default_retry_multiplier(),
            max: default_retry_max(),
            jitter: default_jitter(),
        }
    }
}

impl RetrySpec {
    /// The policy as it travels in the trigger message, inside the documented limits
    /// (`chime_protocol::limits`) whatever the spec says: validation keeps new definitions inside
    /// them, and this clamps a definition stored before they were checked, so no trigger
    /// carries a value a worker would refuse.
    pub fn to_wire(&self) -> chime_protocol::wire::RetryPolicy {
        use chime_protocol::limits::{MAX_ATTEMPTS, MAX_MULTIPLIER, MAX_RETRY_DELAY};
        let ms = |d: Duration| u64::try_from(d.min(MAX_RETRY_DELAY).as_millis()).unwrap_or(0);
        let multiplier = if self.multiplier.is_finite() {
            self.multiplier.clamp(1.0, MAX_MULTIPLIER)
        } else {
            1.0
        };
        chime_protocol::wire::RetryPolicy {
            max_attempts: self.max_attempts.clamp(1, MAX_ATTEMPTS),
            initial_ms: ms(self.initial),
            multiplier,
            max_ms: ms(self.max),
            jitter: self.jitter,
        }
    }
}

fn default_max_attempts() -> u32 {
    retry::DEFAULT_MAX_ATTEMPTS
}
fn default_retry_initial() -> Duration {
    retry::DEFAULT_INITIAL
}
fn default_retry_multiplier() -> f64 {
    retry::DEFAULT_MULTIPLIER
}
fn default_retry_max() -> Duration {
    retry::DEFAULT_MAX_DELAY
}
fn default_jitter() -> bool {
    retry::DEFAULT_JITTER
}

/// A job's own alert target: its webhook and body format, each overriding the settings'.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertSpec {
    /// Webhook URL (`http://` or `https://`) the job's alerts are posted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// Body format of the job's alerts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<AlertFormat>,
}

/// Body of an alert webhook.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertFormat {
    /// `{"kind", "job", "group", "run_id", "attempt", "error", "at", "text"}`.
    #[default]
    Generic,
    /// Slack-compatible incoming webhook: `{"text": …}`.
    Slack,
}

impl AlertFormat {
    /// As written in settings and job files.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertFormat::Generic => "generic",
            AlertFormat::Slack => "slack",
        }
    }

    /// The format a word names, if any.
    pub fn parse(word: &str) -> Option<AlertFormat> {
        match word {
            "generic" => Some(AlertFormat::Generic),
            "slack" => Some(AlertFormat::Slack),
            _ => None,
        }
    }
}

/// Cluster-wide overlap policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyPolicy {
    /// Runs may overlap.
    #[default]
    Allow,
    /// Skip a fire while a run of the job is still going.
    Forbid,
    /// Start the new run after the current one.
    Queue,
    /// Cancel the running one and start the new one.
    Replace,
}

impl ConcurrencyPolicy {
    /// The policy as the job file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConcurrencyPolicy::Allow => "allow",
            ConcurrencyPolicy::Forbid => "forbid",
            ConcurrencyPolicy::Queue => "queue",
            ConcurrencyPolicy::Replace => "replace",
        }
    }

    /// The policy a job file's word names, if any.
    pub fn parse(word: &str) -> Option<ConcurrencyPolicy> {
        match word {
            "allow" => Some(ConcurrencyPolicy::Allow),
            "forbid" => Some(ConcurrencyPolicy::Forbid),
            "queue" => Some(ConcurrencyPolicy::Queue),
            "replace" => Some(ConcurrencyPolicy::Replace),
            _ => None,
        }
    }
}

impl JobSpec {
    /// Builds the schedule this spec describes.
    pub fn schedule(&self) -> Result<Schedule, ScheduleError> {
        if let Some(expr) = &self.schedule {
            Schedule::cron(expr, self.timezone)
        } else if let Some(period) = self.every {
            Schedule::every(period)
        } else if let Some(at) = self.at {
            Ok(Schedule::At(at.to_utc()))
        } else {
            Ok(Schedule::Manual)
        }
    }
}

fn utc() -> Tz {
    Tz::UTC
}
fn default_misfire_grace() -> Duration {
    Duration::from_secs(5)
}
fn default_catchup_window() -> Duration {
    Duration::from_secs(3600)
}
fn default_max_catchup() -> u32 {
    100
}

/// Serde for `Duration` as a humantime string ("30s", "5m").
mod humantime_serde_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?}: {e}; write a number with a unit, such as \"30s\", \"5m\" or \"1h\""
            ))
        })
    }
}

/// Serde for `Option<Duration>` as a humantime string.
mod opt_duration {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::humantime_serde_compat::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::humantime_serde_compat::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chime_protocol::limits::{MAX_ATTEMPTS, MAX_MULTIPLIER, MAX_RETRY_DELAY};

    /// A definition stored before the limits were checked still sends a policy inside them.
    #[test]
    fn a_stored_out_of_range_retry_policy_goes_on_the_wire_clamped() {
        let stored = RetrySpec {
            max_attempts: 3_000_000_000,
            initial: Duration::from_secs(300_000 * 366 * 24 * 3600),
            multiplier: f64::INFINITY,
            max: Duration::MAX,
            jitter: true,
        };
        let wire = stored.to_wire();
        assert_eq!(wire.max_attempts, MAX_ATTEMPTS);
        assert_eq!(wire.initial_ms, MAX_RETRY_DELAY.as_millis() as u64);
        assert_eq!(wire.max_ms, MAX_RETRY_DELAY.as_millis() as u64);
        assert_eq!(wire.multiplier, 1.0);
        let steep = RetrySpec {
            multiplier: 1e300,
            max_attempts: 0,
            ..RetrySpec::default()
        };
        assert_eq!(steep.to_wire().multiplier, MAX_MULTIPLIER);
        assert_eq!(steep.to_wire().max_attempts, 1);
        // A valid policy is sent as it is.
        let default = RetrySpec::default().to_wire();
        assert_eq!(
            (default.max_attempts, default.initial_ms, default.max_ms),
            (3, 10_000, 600_000)
        );
        assert_eq!(default.multiplier, 2.0);
    }
}
