//! Read-only operations the dashboard needs beyond listing: a schedule preview (validate a
//! schedule and show its next fire times without saving anything) and one parked message in
//! full. Part of [`crate::ops`]; authorization goes through the same `Operations::allow` as
//! every other operation.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::{
    DeadLetter, FieldProblem, Operations, OpsError, OpsResult, UPCOMING, dead_letter, no_such_run,
    validated,
};
use crate::auth::{Caller, Role};
use crate::parking::{ParkedPayload, SCAN};

/// The job-definition fields a schedule preview takes.
pub const PREVIEW_FIELDS: &[&str] = &["schedule", "every", "at", "timezone"];

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
    /// `timezone`; the job-file form, as JSON) with the same checks as job files and
    /// `POST /api/jobs`, and lists the next fire times after `now`. Nothing is saved.
    pub async fn preview_schedule(
        &self,
        caller: &Caller,
        fields: serde_json::Value,
        now: DateTime<Utc>,
    ) -> OpsResult<SchedulePreview> {
        self.allow(caller, "schedules.preview", Role::Viewer, None, None)
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
                    "unknown field; a preview takes \"schedule\", \"every\", \"at\" and \
                     \"timezone\"",
                )
            })
            .collect();
        if !unknown.is_empty() {
            unknown.sort_by(|a, b| a.field.cmp(&b.field));
            return Err(OpsError::Invalid(unknown));
        }
        // A stand-in name and group, which are valid, so every problem is about the schedule.
        let mut definition = fields;
        definition.insert("name".into(), "schedule-preview".into());
        definition.insert("group".into(), "preview".into());
        let spec = validated(&serde_json::Value::Object(definition))?;
        let schedule = spec.schedule().map_err(|e| {
            OpsError::Invalid(vec![FieldProblem {
                field: None,
                value: None,
                message: e.to_string(),
            }])
        })?;
        let upcoming = schedule.upcoming(now, UPCOMING);
        Ok(SchedulePreview {
            schedule: schedule.describe(),
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
                .then(|| crate::check::why_no_fires(&spec)),
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
    /// The parking-lot queue holding it.
    pub queue: String,
    /// Its place in that queue when read (0 = the head).
    pub position: usize,
    /// Its properties, headers and body.
    pub message: ParkedPayload,
}

impl Operations {
    /// The parked message of run `id` in full: headers and trigger body. It stays parked, and
    /// the parking lot keeps its order (see [`crate::parking::ParkingLot::peek`]).
    pub async fn dead_letter_message(
        &self,
        caller: &Caller,
        id: i64,
    ) -> OpsResult<DeadLetterMessage> {
        self.allow(caller, "dlq.show", Role::Viewer, None, Some(id))
            .await?;
        let broker = self.broker()?;
        let Some(run) = self.store.run_briefs(&[id]).await?.into_iter().next() else {
            return Err(no_such_run(id));
        };
        let lot = self.parking_lot(broker).await?;
        let queue = lot.queue(&run.group);
        let found = lot.peek(&run.group, id, SCAN).await;
        lot.close().await;
        let Some((position, message, payload)) =
            found.map_err(|e| OpsError::Unavailable(format!("{e:#}")))?
        else {
            return Err(OpsError::NotFound(format!(
                "run {id} has no message in the parking lot {queue}: it was replayed or purged, \
                 or never parked; GET /api/dead-letters lists the parked runs"
            )));
        };
        Ok(DeadLetterMessage {
            letter: dead_letter(message, Some(&run)),
            queue,
            position,
            message: payload,
        })
    }
}
