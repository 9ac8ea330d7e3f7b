//! The per-job report (what XXL-Job calls the report): one job's runs per day by outcome over
//! the last days, and the median and 95th percentile duration per day. Days are the job's own,
//! in its time zone. Part of [`crate::ops`].

use std::collections::BTreeMap;

use chrono::{DateTime, Days, NaiveDate, SecondsFormat, TimeZone as _, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use super::{Action, Entry, FieldProblem, Operations, OpsError, OpsResult, no_such_job};
use crate::auth::Caller;

/// Fewest and most days a report covers.
pub const REPORT_DAYS: (u32, u32) = (1, 90);

/// The final states a report charts, in the order it stacks them.
pub const REPORT_OUTCOMES: &[&str] = &["succeeded", "failed", "dead", "cancelled"];

/// One job's runs per day.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobReport {
    /// Job name.
    pub job: String,
    /// The job's time zone, which the days are in.
    pub timezone: String,
    /// The first day's start, RFC 3339 with the zone's offset.
    pub from: String,
    /// The end of today, RFC 3339 with the zone's offset.
    pub to: String,
    /// The outcomes the chart stacks (other states are counted too).
    pub outcomes: Vec<&'static str>,
    /// Every day from the first to today, oldest first, days without runs included.
    pub days: Vec<ReportDay>,
    /// Runs over all days, by state.
    pub totals: BTreeMap<String, i64>,
    /// Succeeded among the succeeded, failed and dead runs; none without such runs.
    pub success_rate: Option<f64>,
}

/// One day of a [`JobReport`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReportDay {
    /// The date, `YYYY-MM-DD`, in the job's time zone.
    pub day: NaiveDate,
    /// Runs scheduled that day.
    pub total: i64,
    /// Those runs by state now; states without runs are left out.
    pub counts: BTreeMap<String, i64>,
    /// Median duration (finished − started) of the day's runs that started and finished, ms.
    pub p50_ms: Option<f64>,
    /// 95th percentile duration, ms.
    pub p95_ms: Option<f64>,
}

/// The first instant of `day` in `zone` (the first one after a gap, at a DST change).
fn start_of(day: NaiveDate, zone: Tz) -> DateTime<Utc> {
    let midnight = day.and_hms_opt(0, 0, 0).unwrap_or_default();
    (0..4)
        .find_map(|hour| {
            zone.from_local_datetime(&(midnight + chrono::Duration::hours(hour)))
                .earliest()
        })
        .map_or_else(|| midnight.and_utc(), |t| t.with_timezone(&Utc))
}

impl Operations {
    /// Runs of job `name` scheduled over the last `days` days in its time zone (today
    /// included, as of `now`), per day and state, with duration percentiles per day.
    pub async fn job_report(
        &self,
        caller: &Caller,
        name: &str,
        days: u32,
        now: DateTime<Utc>,
    ) -> OpsResult<JobReport> {
        self.authorize(caller, Action::JobsReport, Entry::job(name))
            .await?;
        let (fewest, most) = REPORT_DAYS;
        if !(fewest..=most).contains(&days) {
            return Err(OpsError::Invalid(vec![FieldProblem::new(
                "days",
                days.to_string(),
                format!("use a number of days from {fewest} to {most}, such as 14"),
            )]));
        }
        let Some(job) = self.store.job(name).await? else {
            return Err(no_such_job(name));
        };
        let zone = job.spec.timezone;
        let today = now.with_timezone(&zone).date_naive();
        let first = today - Days::new(u64::from(days - 1));
        let (from, to) = (start_of(first, zone), start_of(today + Days::new(1), zone));
        let mut report: Vec<ReportDay> = first
            .iter_days()
            .take(days as usize)
            .map(|day| ReportDay {
                day,
                total: 0,
                counts: BTreeMap::new(),
                p50_ms: None,
                p95_ms: None,
            })
            .collect();
        let mut totals = BTreeMap::new();
        for row in self
            .store
            .job_report_rows(name, from, to, zone.name())
            .await?
        {
            let Some(day) = report.iter_mut().find(|d| d.day == row.day) else {
                continue;
            };
            match row.state {
                None => {
                    day.total = row.runs;
                    day.p50_ms = row.p50_ms;
                    day.p95_ms = row.p95_ms;
                }
                Some(state) => {
                    *totals.entry(state.clone()).or_insert(0) += row.runs;
                    day.counts.insert(state, row.runs);
                }
            }
        }
        let count = |s: &str| totals.get(s).copied().unwrap_or(0);
        let ended = count("succeeded") + count("failed") + count("dead");
        let local = |t: DateTime<Utc>| {
            t.with_timezone(&zone)
                .to_rfc3339_opts(SecondsFormat::Secs, false)
        };
        Ok(JobReport {
            job: job.spec.name,
            timezone: zone.name().to_owned(),
            from: local(from),
            to: local(to),
            outcomes: REPORT_OUTCOMES.to_vec(),
            success_rate: (ended > 0).then(|| count("succeeded") as f64 / ended as f64),
            days: report,
            totals,
        })
    }
}
