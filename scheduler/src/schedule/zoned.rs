//! A cron expression evaluated in an IANA time zone under Chime's one DST rule.
//!
//! The pattern is matched against naive local wall-clock time (the `cron` crate iterated in `Utc`
//! stands in for "naive local"), and each matching local time `L` becomes instants:
//!
//! | `Tz::from_local_datetime(L)` | fixed-time job        | repeating job          |
//! |------------------------------|-----------------------|------------------------|
//! | `Single(i)`                  | `i`                   | `i`                    |
//! | `Ambiguous(first, second)`   | `first` only          | `first` and `second`   |
//! | `None` (in a gap)            | end of the gap        | end of the gap         |
//!
//! "End of the gap" is the transition instant itself, whose local time is the first wall-clock
//! time that exists after the gap (03:00 EDT for New York's 02:00–03:00 gap). Several local
//! times collapsing onto it fire once: the schedule is a set of instants.
//!
//! Because "first occurrence" instants rise with local time but "second occurrence" instants of
//! a repeated hour come after all first occurrences, `next_after` of an instant inside a
//! repeated hour looks at both passes explicitly (see [`CronSchedule::next_after`]).

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone, Utc};
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
    /// One `cron` crate schedule, or two whose union is Vixie's day-of-month OR day-of-week.
    compiled: Vec<cron::Schedule>,
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
        let compiled = parsed
            .fields
            .crate_expressions()
            .iter()
            .map(|e| {
                cron::Schedule::from_str(e).map_err(|err| {
                    format!("normalised form {e:?} was rejected ({err}); please report this")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
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

    /// The normalised `cron` crate expressions (for tests and debugging).
    #[cfg(test)]
    pub(crate) fn normalised(&self) -> Vec<String> {
        self.compiled
            .iter()
            .map(|s| s.source().to_string())
            .collect()
    }

    /// The first fire strictly after `after`, under the DST rule in the module docs.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.tz).naive_local();
        let LocalResult::Ambiguous(a, b) = self.tz.from_local_datetime(&local) else {
            // `local` exists once, so the first instant of every later local time is later than
            // `after`, and no second pass of a repeated hour straddles `after`.
            return self.next_match(local).map(|m| self.first_instant(m));
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
            let first = self.next_match(local).map(|m| self.first_instant(m));
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
            second.or_else(|| {
                self.next_match(overlap.end_local - TimeDelta::seconds(1))
                    .map(|m| self.first_instant(m))
            })
        }
    }

    /// The first matching local time strictly after `local` (whole seconds).
    fn next_match(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        let start = local.and_utc();
        self.compiled
            .iter()
            .filter_map(|s| s.after(&start).next())
            .min()
            .map(|t| t.naive_utc())
    }

    /// The earliest instant a matching local time fires at: itself, its first occurrence, or
    /// the end of the gap it falls in.
    fn first_instant(&self, local: NaiveDateTime) -> DateTime<Utc> {
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => t.to_utc(),
            LocalResult::Ambiguous(a, b) => a.to_utc().min(b.to_utc()),
            LocalResult::None => gap_end(self.tz, local),
        }
    }

    /// The second occurrence of a local time inside a repeated hour.
    fn latest_instant(&self, local: NaiveDateTime) -> DateTime<Utc> {
        match self.tz.from_local_datetime(&local) {
            LocalResult::Ambiguous(a, b) => a.to_utc().max(b.to_utc()),
            _ => self.first_instant(local),
        }
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
