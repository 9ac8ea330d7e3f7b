//! Schedules (pure: no IO, never reads the clock): cron in three dialects, fixed rate, one-shot, manual.
//!
//! # Cron dialects
//!
//! The dialect is chosen by the expression's shape:
//!
//! - **5 fields**, Unix crontab: `minute hour day-of-month month day-of-week`. Day-of-week 0 and 7
//!   are Sunday, 1 is Monday. Names `JAN`–`DEC` and `SUN`–`SAT` (any case), ranges `1-5`,
//!   lists `1,15`, steps `*/15`, `1-5/2` and `5/15` (= `5-59/15`). `FRI-SUN` is Friday to Sunday.
//! - **6 fields** without `?`: `second` first, then as above, Unix weekday numbering.
//! - **Quartz**: 7 fields `second minute hour day-of-month month day-of-week year`, or 6 fields
//!   containing `?`. Quartz numbers weekdays **1 = Sunday … 7 = Saturday** (so `2-6` is Monday to
//!   Friday), keeping pasted XXL-Job/Quartz expressions meaning what they meant there. `?` means
//!   "no constraint" and is allowed only in the day fields; one of the two day fields must be
//!   `?` or `*` (as Quartz requires), and not both may be `?` (then neither says which days).
//! - **Macros**: `@yearly`/`@annually` (`0 0 1 1 *`), `@monthly` (`0 0 1 * *`), `@weekly`
//!   (`0 0 * * 0`), `@daily`/`@midnight` (`0 0 * * *`), `@hourly` (`0 * * * *`). `@reboot` is
//!   rejected: there is no boot event to run it on.
//!
//! The `cron` crate (0.17) evaluates the pattern, but it requires seconds and numbers Sunday as
//! 1, so `0 0 9 * * 1-5` there fires Sunday to Thursday. We therefore parse every dialect
//! ourselves and hand the crate only explicit number lists in its own numbering.
//!
//! **Quartz's day rules**, with Quartz's meaning, each standing alone in its field (not in a
//! list, range or step; any case):
//!
//! - Day-of-month `L`: the month's last day. `L-n` (n 0-30): n days before it, so `L-3` is
//!   February 26th in a leap year (2028) and the 25th otherwise; a month shorter than n + 1
//!   days has no fire (`L-30` fires only in 31-day months, on the 1st).
//! - Day-of-month `nW` (n 1-31): the weekday (Monday to Friday) nearest the nth, never leaving
//!   the month: a Saturday moves to Friday, a Sunday to Monday, but a Saturday 1st moves to
//!   Monday the 3rd and a Sunday last day to Friday two days before. A month without an nth
//!   (`31W` in April) has no fire, as `31` has none. `LW`: the month's last weekday.
//! - Day-of-week `nL`: the month's last weekday n (`6L` is the last Friday in Quartz). `n#k`
//!   (k 1-5): the kth weekday n (`6#3` the third Friday); a month without a 5th has no fire.
//!   Names work too (`FRI#3`). `L` alone is Saturday (7) in Quartz.
//!
//! The Unix dialects accept the same as extensions, with their own weekday numbering (`5L` and
//! `5#3` are the last and third Friday, 0 and 7 Sunday), and with Vixie's rule below when both
//! day fields are restricted (`0 9 L * 5#3`: the last day and the third Friday). Day-of-week `L`
//! alone is rejected there: it means Saturday in Quartz only. These rules depend on the month,
//! so the day fields are matched by us, one month at a time, not by the `cron` crate.
//!
//! An expression that can never fire is rejected: `0 0 30 2 *`, `0 0 0 L-30 2 ?`, `0 0 0 29 2 ?
//! 2027` (no allowed month of an allowed year has a matching day).
//!
//! **Day-of-month and day-of-week (Vixie rule).** When both day fields are restricted — neither
//! is written starting with `*` or `?` — a day matches if EITHER matches: `0 9 1 * MON` fires on
//! the 1st and on every Monday. When either starts with `*` (including `*/2`), both must match,
//! so `0 9 */2 * MON` fires on Mondays with an odd day of month. This is Vixie/cronie behaviour,
//! decided by the first character of the field. The `cron` crate always requires both to match,
//! so the crate is given `*` in both day fields and the days are filtered by us.
//!
//! # Time zones and DST
//!
//! A cron schedule is read in its job's IANA zone. One rule for all dialects, Vixie/Debian's:
//!
//! - A **fixed-time** job whose local time does not exist (spring forward) fires once, at the
//!   end of the gap: 02:30 on 2026-03-08 in New York fires at 03:00 EDT (07:00Z). Several of its
//!   local times in one gap (`0,30 2 * * *`) collapse onto that one instant; nothing fires twice.
//! - A **repeating** job has no fire at a local time that does not exist: `30 * * * *` fires at
//!   01:30 EST and 03:30 EDT on that day, not also at 03:00; `*/15 2 * * *` does not fire that
//!   day. Vixie cron, Quartz and croniter do the same.
//! - A **fixed-time** job fires once in a repeated (fall back) hour, at the first occurrence:
//!   01:30 on 2026-11-01 in New York fires at 01:30 EDT only.
//! - A **repeating** job fires in both passes of a repeated hour, so no interval is lost:
//!   `*/15 * * * *` fires at 01:00, 01:15, 01:30, 01:45 EDT and again at 01:00 … 01:45 EST.
//!
//! A job is *fixed-time* when none of its second, minute and hour fields is written starting
//! with `*` (so no `*`, `*/n`); otherwise it is *repeating*. A 5-field expression's implicit
//! second is `0`. This is Debian cron's test (jobs "specified with '*' in the hour or minute
//! specifier" are wildcard jobs), extended to the seconds field. So `30 1 * * *`, `0,30 1 * * *`
//! and `@daily` are fixed-time; `*/15 1 * * *`, `0 * * * *` and `@hourly` are repeating.
//!
//! # Fixed rate, one-shot, manual
//!
//! `every` fires at every whole multiple of its period since the Unix epoch (`30s` fires at :00
//! and :30 of each minute). `at` fires once. `manual` never fires on its own.

mod calendar;
mod cron_expr;
mod timing;
mod zoned;

#[cfg(test)]
mod tests;

pub use calendar::{
    CalendarClock, CalendarDef, CalendarProblem, search_words as calendar_search_words,
};
pub use cron_expr::CronDialect;
pub use timing::{CalendarUse, OnExcluded, Timing, UPCOMING_SCAN};
pub use zoned::CronSchedule;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use std::fmt;
use std::time::Duration;

/// When a job fires.
#[derive(Debug, Clone, PartialEq, Eq)]
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

const NANOS_PER_SEC: i128 = 1_000_000_000;

impl Schedule {
    /// A fixed-rate schedule; rejects periods under 1 ms.
    pub fn every(period: Duration) -> Result<Schedule, ScheduleError> {
        if period < Duration::from_millis(1) {
            return Err(ScheduleError::Period(
                humantime::format_duration(period).to_string(),
            ));
        }
        Ok(Schedule::Every(period))
    }

    /// Parses a cron expression (5-field Unix, 6-field with seconds, 7-field Quartz, or a macro).
    pub fn cron(expr: &str, tz: Tz) -> Result<Schedule, ScheduleError> {
        CronSchedule::parse(expr, tz)
            .map(Schedule::Cron)
            .map_err(|reason| ScheduleError::Cron {
                expr: expr.to_string(),
                reason,
            })
    }

    /// The first fire strictly after `after`, or `None` if the schedule never fires again.
    ///
    /// Cron schedules end after 2100 (the `cron` crate's last year).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Cron(cron) => cron.next_after(after),
            Schedule::Every(period) => every_next_after(*period, after),
            Schedule::At(at) => (*at > after).then_some(*at),
            Schedule::Manual => None,
        }
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

    /// A one-line description for listings: `cron "0 9 * * 1-5" (Europe/Berlin)`, `every 30s`,
    /// `at 2026-12-01T00:00:00Z`, `manual`.
    pub fn describe(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron(cron) => write!(f, "cron {:?} ({})", cron.expr(), cron.timezone()),
            Schedule::Every(period) => write!(f, "every {}", humantime::format_duration(*period)),
            Schedule::At(at) => write!(f, "at {}", at.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            Schedule::Manual => f.write_str("manual"),
        }
    }
}

/// The smallest whole multiple of `period` since the epoch that is strictly after `after`.
fn every_next_after(period: Duration, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let period = i128::try_from(period.as_nanos()).ok()?;
    let k = epoch_nanos(after).div_euclid(period) + 1;
    from_epoch_nanos(k.checked_mul(period)?)
}

/// Nanoseconds since the Unix epoch, without `timestamp_nanos`'s 1677..2262 limit.
pub(crate) fn epoch_nanos(t: DateTime<Utc>) -> i128 {
    i128::from(t.timestamp()) * NANOS_PER_SEC + i128::from(t.timestamp_subsec_nanos())
}

/// The inverse of [`epoch_nanos`]; `None` outside chrono's range.
pub(crate) fn from_epoch_nanos(nanos: i128) -> Option<DateTime<Utc>> {
    let secs = i64::try_from(nanos.div_euclid(NANOS_PER_SEC)).ok()?;
    let sub = u32::try_from(nanos.rem_euclid(NANOS_PER_SEC)).ok()?;
    DateTime::from_timestamp(secs, sub)
}
