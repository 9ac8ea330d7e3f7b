//! Read-only operations the dashboard needs beyond listing: a schedule preview (validate a
//! schedule and show its next fire times without saving anything), one parked message in
//! full, and runs by state over time. Part of [`crate::ops`]; authorization goes through the same `Operations::allow` as
//! every other operation.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::{
    Action, DeadLetter, Entry, FieldProblem, Operations, OpsError, OpsResult, RUN_STATES, UPCOMING,
    dead_letter, no_such_run, validated,
};
use chime_protocol::Topology;

use crate::auth::Caller;
use crate::parking::ParkedPayload;
use crate::secrets;

/// The job-definition fields a schedule preview takes.
pub const PREVIEW_FIELDS: &[&str] = &[
    "schedule", "every", "at", "timezone", "jitter", "start_at", "end_at", "max_runs", "name",
];

/// What a schedule would do, as `chime check` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchedulePreview {
    /// The schedule in words (`cron "…" (zone)`, `every 30s`, `at …`, `manual`).
    pub schedule: String,
    /// The IANA time zone cron expressions are read in.
    pub timezone: String,
    /// The next [`UPCOMING`] fire times after now, in UTC.
    pub upcoming: Vec<DateTime<Utc>>,
    /// The same instants in the time zone, RFC 3339 with the zone's offset.
    pub upcoming_local: Vec<String>,
    /// Why there is no fire, when there is none.
    pub none_because: Option<&'static str>,
}

impl Operations {
    /// Validates the schedule fields of a job definition (`schedule`, `every`, `at`,
    /// `timezone`, `jitter`, `start_at`, `end_at`, `max_runs`, and `name` for the jitter; the
    /// job-file form, as JSON) with the same checks as job files and
    /// `POST /api/jobs`, and lists the next fire times after `now`. Nothing is saved.
    pub async fn preview_schedule(
        &self,
        caller: &Caller,
        fields: serde_json::Value,
        now: DateTime<Utc>,
    ) -> OpsResult<SchedulePreview> {
        self.authorize(caller, Action::SchedulesPreview, Entry::none())
            .await?;
        let serde_json::Value::Object(fields) = fields else {
            return Err(OpsError::Invalid(vec![FieldProblem {
                field: None,
                value: Some(fields.to_string()),
                message: "the body is a JSON object of schedule fields, such as \
                          {\"schedule\": \"0 9 * * MON-FRI\", \"timezone\": \"Europe/Berlin\"}"
                    .into(),
            }]));
        };
        let mut unknown: Vec<FieldProblem> = fields
            .iter()
            .filter(|(key, _)| !PREVIEW_FIELDS.contains(&key.as_str()))
            .map(|(key, value)| {
                FieldProblem::new(
                    key,
                    value.to_string(),
                    "unknown field; a preview takes \"schedule\", \"every\", \"at\", \
                     \"timezone\", \"jitter\", \"start_at\", \"end_at\", \"max_runs\" and \
                     \"name\" (the job's, which its jitter depends on)",
                )
            })
            .collect();
        if !unknown.is_empty() {
            unknown.sort_by(|a, b| a.field.cmp(&b.field));
            return Err(OpsError::Invalid(unknown));
        }
        // A stand-in group (and name, when none is given), which are valid, so every problem is
        // about the schedule. A jittered schedule depends on the job's name.
        let mut definition = fields;
        definition
            .entry("name")
            .or_insert_with(|| "schedule-preview".into());
        definition.insert("group".into(), "preview".into());
        let spec = validated(&serde_json::Value::Object(definition))?;
        let timing = spec.timing().map_err(|e| {
            OpsError::Invalid(vec![FieldProblem {
                field: None,
                value: None,
                message: e.to_string(),
            }])
        })?;
        let upcoming = spec.upcoming(&timing, now, UPCOMING, 0);
        Ok(SchedulePreview {
            schedule: timing.describe(),
            timezone: spec.timezone.name().to_owned(),
            upcoming_local: upcoming
                .iter()
                .map(|t| {
                    t.with_timezone(&spec.timezone)
                        .to_rfc3339_opts(SecondsFormat::AutoSi, false)
                })
                .collect(),
            none_because: upcoming
                .is_empty()
                .then(|| spec.why_no_fires(&timing, now, 0)),
            upcoming,
        })
    }
}

/// One parked message in full, for the dashboard's dead-letter viewer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterMessage {
    /// What the list shows of it.
    #[serde(flatten)]
    pub letter: DeadLetter,
    /// The parking-lot queue it was drained from.
    pub queue: String,
    /// Its place among its group's dead letters (0 = drained first).
    pub position: usize,
    /// Its properties, headers and body.
    pub message: ParkedPayload,
}

impl Operations {
    /// The first dead letter of run `id` in full: headers and trigger body, as drained into
    /// the database. Reads the database only; nothing changes.
    pub async fn dead_letter_message(
        &self,
        caller: &Caller,
        id: i64,
    ) -> OpsResult<DeadLetterMessage> {
        self.authorize(caller, Action::DlqShow, Entry::run(id))
            .await?;
        let Some(run) = self.store.run_briefs(&[id]).await?.into_iter().next() else {
            return Err(no_such_run(id));
        };
        let prefix = self.broker.as_ref().map(|b| b.queue_prefix.as_str());
        let queue = Topology::new(
            prefix.unwrap_or(crate::config::DEFAULT_QUEUE_PREFIX),
            &run.group,
        )
        .parking_queue();
        let Some(stored) = self.store.dead_letter_of_run(id).await? else {
            return Err(OpsError::NotFound(format!(
                "run {id} has no message in the parking lot {queue}: it was replayed or purged, \
                 or never parked (or is not drained yet: the leader drains the parking lots \
                 every second); GET /api/dead-letters lists the parked runs"
            )));
        };
        let mut message = ParkedPayload::from_stored(&stored);
        let queue = Topology::new(
            prefix.unwrap_or(crate::config::DEFAULT_QUEUE_PREFIX),
            &stored.record.group,
        )
        .parking_queue();
        let mut letter = dead_letter(stored.record, Some(&run));
        if !super::sees_secrets(caller) {
            let declared = self.declared_secrets(&run.job).await;
            let mut values = self
                .run_secret_texts(caller, &[id])
                .await?
                .remove(&id)
                .unwrap_or_default();
            if let Some(params) = message.body.get_mut("params") {
                values.extend(secrets::secret_values(params, &declared));
                *params = secrets::redact_params(params, &declared);
            }
            super::scrub_letter(&mut letter, &values);
            for header in message.headers.values_mut() {
                if let serde_json::Value::String(text) = header {
                    *text = secrets::scrub(text, &values);
                }
            }
            if let serde_json::Value::String(text) = &mut message.body {
                *text = secrets::scrub(text, &values);
            }
        }
        Ok(DeadLetterMessage {
            message,
            queue,
            position: usize::try_from(stored.position).unwrap_or(usize::MAX),
            letter,
        })
    }
}

/// Shortest and longest timeline windows (a day of runs is a 100 ms query on 10 million runs).
pub const TIMELINE_WINDOWS: (Duration, Duration) =
    (Duration::from_secs(60), Duration::from_secs(24 * 3600));

/// Most buckets one timeline has.
pub const MAX_TIMELINE_BUCKETS: u64 = 1440;

/// Runs by state over time, for the overview's chart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunTimeline {
    /// Length of each bucket, in seconds.
    pub bucket_seconds: u64,
    /// Start of the first bucket (a whole multiple of the bucket length since the epoch).
    pub from: DateTime<Utc>,
    /// End of the last bucket (after now; the last bucket is still filling).
    pub to: DateTime<Utc>,
    /// Every run state, in the order the chart stacks them.
    pub states: Vec<&'static str>,
    /// Every bucket from `from` to `to`, oldest first, empty ones included.
    pub buckets: Vec<TimelineBucket>,
}

/// The runs created in one bucket, by the state they have now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineBucket {
    /// Bucket start.
    pub start: DateTime<Utc>,
    /// Runs created in the bucket.
    pub total: i64,
    /// Those runs by state; states without runs are left out.
    pub counts: BTreeMap<String, i64>,
}

impl Operations {
    /// Runs created over the last `window` before `now`, counted per `bucket` and state.
    pub async fn run_timeline(
        &self,
        caller: &Caller,
        window: Duration,
        bucket: Duration,
        now: DateTime<Utc>,
    ) -> OpsResult<RunTimeline> {
        self.authorize(caller, Action::OverviewTimeline, Entry::none())
            .await?;
        let mut problems = Vec::new();
        let (shortest, longest) = TIMELINE_WINDOWS;
        if window < shortest || window > longest {
            problems.push(FieldProblem::new(
                "window",
                format!("{:?}", humantime::format_duration(window).to_string()),
                "use a window from 1m to 24h, such as \"1h\"",
            ));
        }
        let b = bucket.as_secs();
        if b == 0 || bucket.subsec_nanos() != 0 || bucket > window {
            problems.push(FieldProblem::new(
                "bucket",
                format!("{:?}", humantime::format_duration(bucket).to_string()),
                "use whole seconds, at least 1s and at most the window, such as \"1m\"",
            ));
        } else if window.as_secs().div_ceil(b) > MAX_TIMELINE_BUCKETS {
            problems.push(FieldProblem::new(
                "bucket",
                format!("{:?}", humantime::format_duration(bucket).to_string()),
                format!(
                    "the window would have more than {MAX_TIMELINE_BUCKETS} buckets; use longer \
                     buckets, such as \"1h\" for 7days"
                ),
            ));
        }
        if !problems.is_empty() {
            return Err(OpsError::Invalid(problems));
        }
        let b = b as i64;
        let count = window.as_secs().div_ceil(b as u64) as i64;
        let end = (now.timestamp().div_euclid(b) + 1) * b;
        let start = end - count * b;
        let at = |secs: i64| DateTime::from_timestamp(secs, 0).unwrap_or(now);
        let (from, to) = (at(start), at(end));
        let mut buckets: Vec<TimelineBucket> = (0..count)
            .map(|i| TimelineBucket {
                start: at(start + i * b),
                total: 0,
                counts: BTreeMap::new(),
            })
            .collect();
        for (bucket_start, state, n) in self.store.run_state_buckets(from, to, b).await? {
            let index = (bucket_start.timestamp() - start).div_euclid(b);
            if let Some(bucket) = usize::try_from(index).ok().and_then(|i| buckets.get_mut(i)) {
                bucket.total += n;
                bucket.counts.insert(state, n);
            }
        }
        Ok(RunTimeline {
            bucket_seconds: b as u64,
            from,
            to,
            states: RUN_STATES.to_vec(),
            buckets,
        })
    }
}
