//! A cron expression evaluated in an IANA time zone under Chime's one DST rule.
//!
//! The pattern is matched against naive local wall-clock time (the `cron` crate iterated in `Utc`
//! stands in for "naive local"), and each matching local time `L` becomes instants:
//!
//! | `Tz::from_local_datetime(L)` | fixed-time job        | repeating job          |
//! |------------------------------|-----------------------|------------------------|
//! | `Single(i)`                  | `i`                   | `i`                    |
//! | `Ambiguous(first, second)`   | `first` only          | `first` and `second`   |
//! | `None` (in a gap)            | end of the gap        | no fire                |
//!
//! "End of the gap" is the transition instant itself, whose local time is the first wall-clock
//! time that exists after the gap (03:00 EDT for New York's 02:00–03:00 gap). Several local
//! times collapsing onto it fire once: the schedule is a set of instants. A repeating job has
//! no fire in the gap: its next fire is its first matching local time after the gap, so the
//! hourly `30 * * * *` fires at 01:30 EST and 03:30 EDT, not also at 03:00.
//!
//! The crate finds the next local time matching the time-of-day, month and year fields; the
//! day fields (Quartz's month-dependent `L`, `W`, `nL`, `n#k`, and Vixie's OR) are applied to
//! its candidates one month at a time through [`Fields::day_set`], jumping straight to the next
//! matching day of the month or to the next month (see [`CronSchedule::next_match`]).
//!
//! Because "first occurrence" instants rise with local time but "second occurrence" instants of
//! a repeated hour come after all first occurrences, `next_after` of an instant inside a
//! repeated hour looks at both passes explicitly (see [`CronSchedule::next_after`]).

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeDelta,
    TimeZone, Utc,
};
use chrono_tz::Tz;
use std::str::FromStr;

use super::cron_expr::{self, CronDialect, Fields};

/// A parsed, normalised cron expression plus its time zone.
///
/// Built by [`Schedule::cron`](super::Schedule::cron); the expression is parsed once and the
/// `cron` crate schedules are kept, so computing the next fire never re-parses.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    expr: String,
    tz: Tz,
    dialect: CronDialect,
    fields: Fields,
    /// The `cron` crate schedule of the time-of-day, month and year fields (days are `*`);
    /// boxed, as it is several hundred bytes and [`Schedule`](super::Schedule)'s other
    /// variants are small.
    compiled: Box<cron::Schedule>,
}

impl PartialEq for CronSchedule {
    /// Same text (trimmed) and same zone: what a config reload diff should compare.
    fn eq(&self, other: &Self) -> bool {
        self.expr == other.expr && self.tz == other.tz
    }
}

impl Eq for CronSchedule {}

impl CronSchedule {
    /// Parses `expr` in any supported dialect, to be evaluated in `tz`. The error is the reason
    /// text; the caller wraps it with the expression.
    pub(crate) fn parse(expr: &str, tz: Tz) -> Result<CronSchedule, String> {
        let parsed = cron_expr::parse(expr)?;
        let normalised = parsed.fields.crate_expression();
        let compiled = cron::Schedule::from_str(&normalised)
            .map(Box::new)
            .map_err(|err| {
                format!("normalised form {normalised:?} was rejected ({err}); please report this")
            })?;
        Ok(CronSchedule {
            expr: expr.trim().to_string(),
            tz,
            dialect: parsed.dialect,
            fields: parsed.fields,
            compiled,
        })
    }

    /// The expression as written (surrounding whitespace trimmed).
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The IANA zone the expression is read in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The dialect the expression was read in.
    pub fn dialect(&self) -> CronDialect {
        self.dialect
    }

    /// Whether this is a fixed-time job for the DST rule: none of its second, minute and hour
    /// fields starts with `*`. A fixed time in a repeated hour fires only at its first occurrence;
    /// a repeating job fires in both passes.
    pub fn is_fixed_time(&self) -> bool {
        self.fields.fixed_time
    }

    /// Whether naive local wall-clock time `local` matches the pattern (ignoring DST).
    pub fn matches_local(&self, local: NaiveDateTime) -> bool {
        self.fields.matches(local)
    }

    /// The normalised `cron` crate expression (for tests and debugging).
    #[cfg(test)]
    pub(crate) fn normalised(&self) -> String {
        self.compiled.source().to_string()
    }

    /// The first fire strictly after `after`, under the DST rule in the module docs.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.tz).naive_local();
        let LocalResult::Ambiguous(a, b) = self.tz.from_local_datetime(&local) else {
            // `local` exists once, so the first instant of every later local time is later than
            // `after`, and no second pass of a repeated hour straddles `after`.
            return self.next_first_fire(local);
        };
        // `after` is inside a repeated hour: local times [start, end) occur twice.
        let overlap = Overlap::around(
            self.tz,
            a.to_utc().min(b.to_utc()),
            a.to_utc().max(b.to_utc()),
        );
        let repeating = !self.fields.fixed_time;
        let second_pass =
            |m: NaiveDateTime| (m < overlap.end_local).then(|| self.latest_instant(m));
        if after < overlap.transition {
            // First pass. Later first-pass fires come before any second-pass fire, but the
            // earliest second-pass fire may still precede the next fire after the overlap.
            let first = self.next_first_fire(local);
            let second = if repeating {
                self.next_match(overlap.start_local - TimeDelta::seconds(1))
                    .and_then(second_pass)
            } else {
                None
            };
            min_some(first, second)
        } else {
            // Second pass: all first-pass instants are behind us.
            let second = if repeating {
                self.next_match(local).and_then(second_pass)
            } else {
                None
            };
            second.or_else(|| self.next_first_fire(overlap.end_local - TimeDelta::seconds(1)))
        }
    }

    /// The earliest instant of the first matching local time strictly after `local` that fires
    /// at all: itself, its first occurrence, or (fixed-time jobs) the end of the gap it falls in.
    /// A repeating job's matches in a gap do not fire; the search resumes after the gap.
    fn next_first_fire(&self, local: NaiveDateTime) -> Option<DateTime<Utc>> {
        let mut cursor = local;
        loop {
            let m = self.next_match(cursor)?;
            match self.tz.from_local_datetime(&m) {
                LocalResult::Single(t) => return Some(t.to_utc()),
                LocalResult::Ambiguous(a, b) => return Some(a.to_utc().min(b.to_utc())),
                LocalResult::None if self.fields.fixed_time => return Some(gap_end(self.tz, m)),
                // The gap's end is a local time after `m`, so the cursor moves forward and the
                // loop ends when the crate runs out of years.
                LocalResult::None => {
                    let after_gap = gap_end(self.tz, m).with_timezone(&self.tz).naive_local();
                    cursor = (after_gap - TimeDelta::seconds(1)).max(m);
                }
            }
        }
    }

    /// The first matching local time strictly after `local` (whole seconds).
    ///
    /// The crate's candidate matches every field but the two day fields; a candidate on a day
    /// [`Fields::day_set`] excludes moves the search to the next day of that month the set
    /// includes, or to the next month. Each candidate month costs at most two crate calls, and
    /// the crate ends in 2100, so the search is bounded even for a day rule that rarely matches
    /// (parsing has already rejected rules that never do); [`MAX_CANDIDATES`] is a guard.
    fn next_match(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        let mut cursor = local;
        for _ in 0..MAX_CANDIDATES {
            let candidate = self.compiled.after(&cursor.and_utc()).next()?.naive_utc();
            let date = candidate.date();
            let days = self.fields.day_set(date.year(), date.month());
            if days & (1 << date.day()) != 0 {
                return Some(candidate);
            }
            let later = days & !((2u64 << date.day()) - 1);
            let next_day = if later != 0 {
                date.with_day(later.trailing_zeros())?
            } else {
                first_of_next_month(date)?
            };
            cursor = next_day.and_time(NaiveTime::MIN) - TimeDelta::seconds(1);
        }
        None
    }

    /// The second occurrence of a local time inside a repeated hour.
    fn latest_instant(&self, local: NaiveDateTime) -> DateTime<Utc> {
        match self.tz.from_local_datetime(&local) {
            LocalResult::Ambiguous(a, b) => a.to_utc().max(b.to_utc()),
            LocalResult::Single(t) => t.to_utc(),
            LocalResult::None => gap_end(self.tz, local),
        }
    }
}

/// Two crate calls per month from 1970 to 2100: more than any search can need.
const MAX_CANDIDATES: usize = 2 * 12 * 131;

fn first_of_next_month(date: NaiveDate) -> Option<NaiveDate> {
    match date.month() {
        12 => NaiveDate::from_ymd_opt(date.year().checked_add(1)?, 1, 1),
        m => NaiveDate::from_ymd_opt(date.year(), m + 1, 1),
    }
}

fn min_some<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn exists(tz: Tz, local: NaiveDateTime) -> bool {
    !matches!(tz.from_local_datetime(&local), LocalResult::None)
}

/// The instant a DST gap containing `local` ends: the first instant whose wall-clock time is
/// after `local`. Gallops then bisects at one-second resolution (tzdata transitions are whole
/// seconds); handles gaps up to a whole skipped day (Pacific/Apia, 2011-12-30).
pub(crate) fn gap_end(tz: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    let mut missing = local;
    let mut step = TimeDelta::seconds(1);
    let mut present = local + step;
    // 2^22 s is 48 days; real gaps are at most a day, so the bound only guards odd tzdata.
    for _ in 0..22 {
        if exists(tz, present) {
            break;
        }
        missing = present;
        step = step * 2;
        present = local + step;
    }
    while present - missing > TimeDelta::seconds(1) {
        let mid = missing + (present - missing) / 2;
        if exists(tz, mid) {
            present = mid;
        } else {
            missing = mid;
        }
    }
    tz.from_local_datetime(&present)
        .earliest()
        .map(|t| t.to_utc())
        .unwrap_or_else(|| present.and_utc())
}

/// A repeated (fall-back) stretch of local time.
#[derive(Debug, Clone, Copy)]
struct Overlap {
    /// The instant the clock is set back: the first instant of the second pass.
    transition: DateTime<Utc>,
    /// First repeated local time (inclusive).
    start_local: NaiveDateTime,
    /// First local time after the repeated stretch (exclusive end).
    end_local: NaiveDateTime,
}

impl Overlap {
    /// The overlap containing the two occurrences `first < second` of one local time.
    fn around(tz: Tz, first: DateTime<Utc>, second: DateTime<Utc>) -> Overlap {
        let offset_at = |secs: i64| {
            let t = DateTime::from_timestamp(secs, 0).unwrap_or(first);
            tz.offset_from_utc_datetime(&t.naive_utc()).fix()
        };
        // Invariant: offset(lo) is the pre-transition offset, offset(hi) is not.
        let mut lo = first.timestamp();
        let before = offset_at(lo);
        let mut hi = second.timestamp() + i64::from(second.timestamp_subsec_nanos() > 0);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if offset_at(mid) == before {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let transition = DateTime::from_timestamp(hi, 0).unwrap_or(second);
        let last_before = DateTime::from_timestamp(lo, 0).unwrap_or(first);
        Overlap {
            transition,
            start_local: transition.with_timezone(&tz).naive_local(),
            end_local: last_before.with_timezone(&tz).naive_local() + TimeDelta::seconds(1),
        }
    }
}
