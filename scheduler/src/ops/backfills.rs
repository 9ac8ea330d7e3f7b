//! Backfill operations: preview, start, list, show and cancel a backfill of a job's past range
//! (the leader's duty makes the runs, [`crate::backfill`]). One home for a backfill request's
//! checks: the API, the CLI and the dashboard all come here.

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone as _, Utc};
use serde::{Deserialize, Serialize};

use chime_protocol::limits::{
    MAX_BACKFILL_FIRES, MAX_BACKFILL_PARALLEL, MAX_BACKFILL_RANGE, MAX_BACKFILL_RATE,
};
use chime_protocol::wire::ControlMessage;

use super::audit::Entry;
use super::{
    Action, FieldProblem, MAX_PAGE, Operations, OpsError, OpsResult, keyset_page, no_such_job,
};
use crate::auth::Caller;
use crate::backfill::fires_in;
use crate::broker::ControlDelivery;
use crate::job::When;
use crate::store::{
    BackfillCancel, BackfillQuery, BackfillRecord, FireRun, JobRecord, NewBackfill,
};

/// Runs of a backfill unfinished at once when the request does not say.
pub const DEFAULT_PARALLEL: u32 = 4;
/// Runs a backfill makes per second when the request does not say.
pub const DEFAULT_RATE: u32 = 10;
/// Fires a preview lists (it counts them all).
pub const PREVIEW_FIRES: usize = 100;
/// The states a backfill can be in.
pub const BACKFILL_STATES: &[&str] = &["running", "done", "cancelled"];

/// A backfill request, as the API's body and the CLI's flags give it.
#[derive(Debug, Clone, Default)]
pub struct BackfillRequest {
    /// Fires at or after this: RFC 3339, or a date (`2026-11-01`, midnight in the job's zone).
    pub from: String,
    /// …and before this, in the same forms; not after now.
    pub to: String,
    /// Runs unfinished at once, 1 to [`MAX_BACKFILL_PARALLEL`] ([`DEFAULT_PARALLEL`]); 1 is
    /// one after the other.
    pub parallel: Option<u32>,
    /// Runs made per second, 1 to [`MAX_BACKFILL_RATE`] ([`DEFAULT_RATE`]).
    pub rate: Option<u32>,
    /// Only say what it would do.
    pub dry_run: bool,
}

/// What a backfill would do, without doing it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillPreview {
    /// The job.
    pub job: String,
    /// Its schedule in words.
    pub schedule: String,
    /// The range: fires at or after `from`…
    pub from: DateTime<Utc>,
    /// …and before `to`.
    pub to: DateTime<Utc>,
    /// Runs unfinished at once, at most.
    pub parallel: u32,
    /// Runs made per second, at most.
    pub rate: u32,
    /// The fires of the range (its calendar's skips left out).
    pub fires_total: usize,
    /// Those with a run already, which a backfill leaves alone (a skipped one not counted).
    pub fires_existing: usize,
    /// Those it would make into runs, or whose skipped run it would run.
    pub fires_to_make: usize,
    /// The first [`PREVIEW_FIRES`] fires, each with its run if it has one.
    pub fires: Vec<PreviewFire>,
}

/// One fire of a preview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreviewFire {
    /// Its instant.
    pub at: DateTime<Utc>,
    /// The same instant in the job's zone (RFC 3339 with its offset).
    pub at_local: String,
    /// Its run, if it has one.
    pub run: Option<FireRun>,
}

/// A backfill started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillStarted {
    /// It, as recorded.
    #[serde(flatten)]
    pub backfill: BackfillRecord,
    /// Sentences of advice (no worker handles the job), as a trigger answers.
    pub warnings: Vec<String>,
}

/// A page of backfills, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillsPage {
    /// The backfills.
    pub backfills: Vec<BackfillRecord>,
    /// Pass as `before` for the next, older page; none on the last page.
    pub next_before: Option<i64>,
}

/// Which backfills to list.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillListQuery {
    /// Only this job's.
    pub job: Option<String>,
    /// Only those in this state.
    pub state: Option<String>,
    /// Only those older than this id.
    pub before: Option<i64>,
    /// Page size (1 to 1000, default 50).
    pub limit: Option<i64>,
}

/// A backfill cancelled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillCancelled {
    /// The backfill.
    pub backfill_id: i64,
    /// Its job.
    pub job: String,
    /// Its waiting runs, cancelled at once.
    pub runs_cancelled: i64,
    /// Its running runs, whose workers were asked to stop them.
    pub cancel_requested: Vec<i64>,
}

/// A request checked against its job: what both the preview and the start need.
struct Planned {
    job: JobRecord,
    /// Its timing in words.
    schedule: String,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    parallel: u32,
    rate: u32,
    fires: Vec<DateTime<Utc>>,
}

impl Operations {
    /// What backfilling `request`'s range of job `name` would do: its fires, those with a
    /// run already and those it would make. Changes nothing.
    pub async fn preview_backfill(
        &self,
        caller: &Caller,
        name: &str,
        request: &BackfillRequest,
    ) -> OpsResult<BackfillPreview> {
        self.authorize(caller, Action::BackfillsPreview, Entry::job(name))
            .await?;
        let planned = self.plan_backfill(name, request).await?;
        let runs = self.store.fire_runs(name, &planned.fires).await?;
        let zone = planned.job.spec.timezone;
        // A skipped run never ran: the backfill runs it.
        let existing = planned
            .fires
            .iter()
            .filter(|at| runs.get(at).is_some_and(|run| run.state != "skipped"))
            .count();
        Ok(BackfillPreview {
            job: name.to_owned(),
            schedule: planned.schedule.clone(),
            from: planned.from,
            to: planned.to,
            parallel: planned.parallel,
            rate: planned.rate,
            fires_total: planned.fires.len(),
            fires_existing: existing,
            fires_to_make: planned.fires.len() - existing,
            fires: planned
                .fires
                .iter()
                .take(PREVIEW_FIRES)
                .map(|at| PreviewFire {
                    at: *at,
                    at_local: at.with_timezone(&zone).to_rfc3339(),
                    run: runs.get(at).cloned(),
                })
                .collect(),
        })
    }

    /// Starts a backfill of `request`'s range of job `name`: recorded `running`, its runs made
    /// by the leader.
    pub async fn start_backfill(
        &self,
        caller: &Caller,
        name: &str,
        request: &BackfillRequest,
    ) -> OpsResult<BackfillStarted> {
        let entry = Entry::job(name).detail(serde_json::json!({
            "from": request.from, "to": request.to,
            "parallel": request.parallel, "rate": request.rate,
        }));
        self.audited(caller, Action::JobsBackfill, entry, async |entry| {
            let planned = self.plan_backfill(name, request).await?;
            if planned.fires.is_empty() {
                return Err(OpsError::Invalid(vec![FieldProblem::new(
                    "from",
                    format!("{:?}", request.from),
                    format!(
                        "job {name:?} has no fire from {} to {} ({}); widen the range",
                        planned.from, planned.to, planned.schedule
                    ),
                )]));
            }
            let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
            let id = self
                .store
                .create_backfill(&NewBackfill {
                    job: name,
                    from: planned.from,
                    to: planned.to,
                    parallel: i32::try_from(planned.parallel).unwrap_or(1),
                    rate: i32::try_from(planned.rate).unwrap_or(1),
                    fires_total: count(planned.fires.len()),
                    requested_by: &caller.actor,
                })
                .await?;
            entry.detail["backfill_id"] = id.into();
            let backfill = self.existing_backfill(id).await?;
            Ok(BackfillStarted {
                backfill,
                warnings: self.handler_warnings(name).await,
            })
        })
        .await
    }

    /// A page of backfills, newest first.
    pub async fn backfills(
        &self,
        caller: &Caller,
        query: BackfillListQuery,
    ) -> OpsResult<BackfillsPage> {
        self.authorize(
            caller,
            Action::BackfillsList,
            Entry::job_named(query.job.as_deref()),
        )
        .await?;
        let limit = query.limit.unwrap_or(50);
        let mut problems = Vec::new();
        if let Some(state) = &query.state
            && !BACKFILL_STATES.contains(&state.as_str())
        {
            problems.push(FieldProblem::new(
                "state",
                format!("{state:?}"),
                format!(
                    "unknown backfill state; use one of {}",
                    BACKFILL_STATES.join(", ")
                ),
            ));
        }
        if !(1..=MAX_PAGE).contains(&limit) {
            problems.push(FieldProblem::new(
                "limit",
                limit.to_string(),
                format!("use a page size from 1 to {MAX_PAGE}"),
            ));
        }
        if !problems.is_empty() {
            return Err(OpsError::Invalid(problems));
        }
        let rows = self
            .store
            .backfills(&BackfillQuery {
                job: query.job,
                state: query.state,
                before: query.before,
                limit: limit + 1,
            })
            .await?;
        let (backfills, next_before) = keyset_page(rows, limit, |b| b.id);
        Ok(BackfillsPage {
            backfills,
            next_before,
        })
    }

    /// One backfill with its progress.
    pub async fn backfill(&self, caller: &Caller, id: i64) -> OpsResult<BackfillRecord> {
        self.authorize(caller, Action::BackfillsShow, Entry::none())
            .await?;
        self.existing_backfill(id).await
    }

    /// Cancels a running backfill: it makes no more runs, its waiting runs are cancelled and
    /// the workers of its running ones are told to stop them.
    pub async fn cancel_backfill(&self, caller: &Caller, id: i64) -> OpsResult<BackfillCancelled> {
        let entry = Entry::none().detail(serde_json::json!({"backfill_id": id}));
        self.audited(caller, Action::BackfillsCancel, entry, async |entry| {
            let (job, cancelled, running) =
                match self.store.cancel_backfill(id, &caller.actor).await? {
                    BackfillCancel::NotFound => return Err(no_such_backfill(id)),
                    BackfillCancel::Ended { state } => {
                        return Err(OpsError::Conflict(format!(
                            "backfill {id} has already ended ({state}); there is nothing to \
                             cancel"
                        )));
                    }
                    BackfillCancel::Cancelled {
                        job,
                        cancelled,
                        running,
                    } => (job, cancelled, running),
                };
            entry.job = Some(job.clone());
            if !running.is_empty() {
                let broker = self.broker()?;
                for run_id in &running {
                    let delivery = broker
                        .publish_control(&ControlMessage::CancelRun { run_id: *run_id })
                        .await
                        .map_err(|e| {
                            OpsError::Unavailable(format!(
                                "backfill {id} is cancelled, but the workers running its run \
                                 {run_id} could not be told: {e:#}; cancel that run when the \
                                 broker is back (`chime runs cancel {run_id}`)"
                            ))
                        })?;
                    if delivery != ControlDelivery::Delivered {
                        tracing::info!(run_id, "no worker listens for the cancel of a run");
                    }
                }
            }
            Ok(BackfillCancelled {
                backfill_id: id,
                job,
                runs_cancelled: cancelled,
                cancel_requested: running,
            })
        })
        .await
    }

    async fn existing_backfill(&self, id: i64) -> OpsResult<BackfillRecord> {
        self.store
            .backfill(id)
            .await?
            .ok_or_else(|| no_such_backfill(id))
    }

    /// Checks `request` against job `name` and its bounds, and lists the range's fires.
    async fn plan_backfill(&self, name: &str, request: &BackfillRequest) -> OpsResult<Planned> {
        let Some(job) = self.store.job(name).await? else {
            return Err(no_such_job(name));
        };
        if job.spec.when == When::Manual {
            return Err(OpsError::Conflict(format!(
                "job {name:?} is manual only: it has no fires to backfill; run it with `chime \
                 jobs trigger {name}`"
            )));
        }
        let now = Utc::now();
        let zone = job.spec.timezone;
        let mut problems = Vec::new();
        let from = parse_instant("from", &request.from, zone, &mut problems);
        let to = parse_instant("to", &request.to, zone, &mut problems);
        if let (Some(from), Some(to)) = (from, to) {
            let value = format!("{:?}", request.to);
            if to <= from {
                problems.push(FieldProblem::new(
                    "to",
                    value,
                    format!("must be after `from` ({from}); the range is from..to, `to` left out"),
                ));
            } else if to > now {
                problems.push(FieldProblem::new(
                    "to",
                    value,
                    format!(
                        "is in the future ({to}, now {now}); a backfill makes past fires, the \
                         planner makes the coming ones: write an instant up to now"
                    ),
                ));
            } else if (to - from)
                .to_std()
                .is_ok_and(|span| span > MAX_BACKFILL_RANGE)
            {
                problems.push(FieldProblem::new(
                    "to",
                    value,
                    format!(
                        "the range is longer than {} (MAX_BACKFILL_RANGE); split it into \
                         several backfills",
                        humantime::format_duration(MAX_BACKFILL_RANGE)
                    ),
                ));
            }
        }
        let parallel = request.parallel.unwrap_or(DEFAULT_PARALLEL);
        if !(1..=MAX_BACKFILL_PARALLEL).contains(&parallel) {
            problems.push(FieldProblem::new(
                "parallel",
                parallel.to_string(),
                format!(
                    "use 1 (one run after the other) to {MAX_BACKFILL_PARALLEL} runs at once \
                     (MAX_BACKFILL_PARALLEL)"
                ),
            ));
        }
        let rate = request.rate.unwrap_or(DEFAULT_RATE);
        if !(1..=MAX_BACKFILL_RATE).contains(&rate) {
            problems.push(FieldProblem::new(
                "rate",
                rate.to_string(),
                format!("use 1 to {MAX_BACKFILL_RATE} runs per second (MAX_BACKFILL_RATE)"),
            ));
        }
        let (Some(from), Some(to), true) = (from, to, problems.is_empty()) else {
            return Err(OpsError::Invalid(problems));
        };
        let timing = job.spec.timing().map_err(anyhow::Error::from)?;
        let limit = usize::try_from(MAX_BACKFILL_FIRES).unwrap_or(usize::MAX);
        let Some(fires) = fires_in(&timing, from, to, limit) else {
            return Err(OpsError::Invalid(vec![FieldProblem::new(
                "to",
                format!("{:?}", request.to),
                format!(
                    "the range holds more than {MAX_BACKFILL_FIRES} fires of job {name:?} \
                     (MAX_BACKFILL_FIRES); split it into shorter ranges"
                ),
            )]));
        };
        Ok(Planned {
            schedule: timing.describe(),
            job,
            from,
            to,
            parallel,
            rate,
            fires,
        })
    }
}

/// `text` as an instant: RFC 3339, or a date alone for its midnight in `zone` (the first
/// instant of the day, should a clock change skip midnight). A mistake is added to `problems`.
fn parse_instant(
    field: &str,
    text: &str,
    zone: chrono_tz::Tz,
    problems: &mut Vec<FieldProblem>,
) -> Option<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Some(at.to_utc());
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let midnight: NaiveDateTime = day.and_time(chrono::NaiveTime::MIN);
        // A zone whose clock skips midnight that day starts it at the end of the gap.
        let local = (0..=24 * 4).find_map(|quarter| {
            let at = midnight + chrono::TimeDelta::minutes(15 * quarter);
            zone.from_local_datetime(&at).earliest()
        });
        if let Some(at) = local {
            return Some(at.to_utc());
        }
    }
    problems.push(FieldProblem::new(
        field,
        format!("{text:?}"),
        format!(
            "not an instant; write RFC 3339 such as \"2026-11-01T00:00:00Z\", or a date such as \
             \"2026-11-01\" for its midnight in the job's time zone ({zone})"
        ),
    ));
    None
}

fn no_such_backfill(id: i64) -> OpsError {
    OpsError::NotFound(format!(
        "no backfill {id}; `chime backfills list` lists them"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_is_rfc_3339_or_a_date_at_midnight_in_the_jobs_zone() {
        let mut problems = Vec::new();
        let berlin = chrono_tz::Europe::Berlin;
        let utc = |s: &str| DateTime::parse_from_rfc3339(s).expect("instant").to_utc();
        assert_eq!(
            parse_instant("from", "2026-11-01T08:00:00+01:00", berlin, &mut problems),
            Some(utc("2026-11-01T07:00:00Z"))
        );
        assert_eq!(
            parse_instant("from", "2026-11-01", berlin, &mut problems),
            Some(utc("2026-10-31T23:00:00Z"))
        );
        // São Paulo skipped midnight on 2018-11-04: the day began at 01:00 local.
        assert_eq!(
            parse_instant(
                "from",
                "2018-11-04",
                chrono_tz::America::Sao_Paulo,
                &mut problems
            ),
            Some(utc("2018-11-04T03:00:00Z"))
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            parse_instant("to", "yesterday", berlin, &mut problems),
            None
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field.as_deref(), Some("to"));
        assert!(
            problems[0].message.contains("Europe/Berlin"),
            "{}",
            problems[0]
        );
    }
}
