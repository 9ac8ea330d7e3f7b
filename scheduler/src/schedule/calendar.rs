//! Calendars (pure: no IO, never reads the clock): named sets of days and times of day that a
//! job's fires are kept to (`calendar_mode = "only"`) or kept out of (`"except"`).
//!
//! A calendar's own rules are **day rules** — `weekdays` (`"mon-fri"`), `dates` (`"2027-01-01"`,
//! `"2027-02-10..2027-02-17"`) and `yearly` (`"12-25"`, `"12-24..01-02"`, every year) — and
//! **time rules**, `times` (`"09:00-18:00"`, end exclusive, `"22:00-06:00"` crossing midnight).
//! An instant is in the calendar's own set when its local date matches any day rule (every date
//! when there is none) and its local time of day any time rule (every time when there is none).
//! `include` adds other calendars' instants, `except` removes theirs:
//!
//! ```text
//! in(c, t) = (own(c, t) || any include in(i, t)) && !any except in(e, t)
//! ```
//!
//! where a calendar with neither rules of its own nor `include` covers every instant (so
//! `except` alone makes "everything but"), and one with only `include` is the union of those.
//! Business days are `weekdays = ["mon-fri"]` with `except` a holiday calendar; working
//! Saturdays are added with `include`.
//!
//! Every calendar of one tree is read in one time zone: the one a calendar of the tree names,
//! else the job's. Local dates and times come from the instant in that zone, so a window
//! `"01:00-02:00"` holds for both passes of a repeated hour and for neither of a skipped one.
//!
//! The searches ([`CalendarClock::first_at_or_after`], [`CalendarClock::stretch_start`]) look at
//! most [`MAX_CALENDAR_SEARCH`] from their instant: they walk the instants where membership can
//! change (local midnights, the start and end of each time rule, and the zone's offset changes)
//! day by day.

use chrono::{
    DateTime, Datelike as _, NaiveDate, NaiveDateTime, Offset as _, TimeDelta, TimeZone as _, Utc,
};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::fmt;

pub use chime_protocol::limits::{MAX_CALENDAR_DEPTH, MAX_CALENDAR_ENTRIES, MAX_CALENDAR_SEARCH};

/// A calendar as job files, API bodies and `chime_jobs.spec` write it, references resolved:
/// `include` and `except` hold the calendars themselves. Built by validation; [`compile`]
/// turns it into rules.
///
/// [`compile`]: CalendarDef::compile
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarDef {
    /// The calendar's name, shown in skip reasons.
    pub name: String,
    /// The zone its dates and times are read in (else the job's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<Tz>,
    /// Days of the week or ranges of them: `"mon"`, `"mon-fri"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weekdays: Vec<String>,
    /// Dates or inclusive ranges: `"2027-01-01"`, `"2027-02-10..2027-02-17"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dates: Vec<String>,
    /// Month-days or inclusive ranges of them, every year: `"12-25"`, `"12-24..01-02"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub yearly: Vec<String>,
    /// Times of day, start inclusive, end exclusive: `"09:00-18:00"`, `"22:00-06:00"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub times: Vec<String>,
    /// Calendars whose instants are added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<CalendarDef>,
    /// Calendars whose instants are removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<CalendarDef>,
}

/// A mistake in a calendar: which field (dotted from the calendar, as `except[0].dates[2]`), the
/// value, and what is wrong with the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarProblem {
    /// The field, relative to the calendar.
    pub field: String,
    /// The value as written.
    pub value: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for CalendarProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{} = {value:?}: {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const FULL_WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];
const DAY_SECS: u32 = 86_400;

fn weekday_index(word: &str) -> Option<u32> {
    let word = word.trim().to_ascii_lowercase();
    (0..7u32).find(|&i| WEEKDAYS[i as usize] == word || FULL_WEEKDAYS[i as usize] == word)
}

/// `"mon"` or `"mon-fri"` (wrapping: `"fri-mon"`) as a bit set, Monday bit 0.
fn parse_weekdays(text: &str) -> Result<u8, String> {
    let (from, to) = text.split_once('-').unwrap_or((text, text));
    let fix = "write a day as mon, tue, wed, thu, fri, sat or sun, or a range such as \"mon-fri\"";
    let (Some(from), Some(to)) = (weekday_index(from), weekday_index(to)) else {
        return Err(format!("not a day of the week or a range of them; {fix}"));
    };
    let mut bits = 0u8;
    let mut day = from;
    loop {
        bits |= 1 << day;
        if day == to {
            return Ok(bits);
        }
        day = (day + 1) % 7;
    }
}

fn parse_date(text: &str) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").ok()
}

/// `"2027-01-01"` or `"2027-02-10..2027-02-17"`.
fn parse_date_span(text: &str) -> Result<(NaiveDate, NaiveDate), String> {
    let (from, to) = text.split_once("..").unwrap_or((text, text));
    let (Some(from), Some(to)) = (parse_date(from), parse_date(to)) else {
        return Err(
            "not a date or a range of dates; write YYYY-MM-DD, such as \"2027-01-01\", \
                    or a range such as \"2027-02-10..2027-02-17\" (both days included)"
                .into(),
        );
    };
    if to < from {
        return Err(format!(
            "the range ends before it starts; write the earlier date first: \"{from}..{to}\""
        ));
    }
    Ok((from, to))
}

/// A month-day as `month * 100 + day`.
fn parse_month_day(text: &str) -> Option<u32> {
    let (month, day) = text.trim().split_once('-')?;
    let (month, day): (u32, u32) = (month.parse().ok()?, day.parse().ok()?);
    // 2000 is a leap year: "02-29" exists, "04-31" does not.
    NaiveDate::from_ymd_opt(2000, month, day).map(|_| month * 100 + day)
}

/// `"12-25"` or `"12-24..01-02"` (wrapping the year end).
fn parse_yearly_span(text: &str) -> Result<(u32, u32), String> {
    let (from, to) = text.split_once("..").unwrap_or((text, text));
    match (parse_month_day(from), parse_month_day(to)) {
        (Some(from), Some(to)) => Ok((from, to)),
        _ => Err(
            "not a month-day or a range of them; write MM-DD, such as \"12-25\", or a \
                  range such as \"12-24..01-02\" (both days included, every year)"
                .into(),
        ),
    }
}

fn parse_time_of_day(text: &str) -> Option<u32> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let number = |s: &str| (s.len() == 2).then(|| s.parse::<u32>().ok()).flatten();
    let (h, m, s) = match parts.as_slice() {
        [h, m] => (number(h)?, number(m)?, 0),
        [h, m, s] => (number(h)?, number(m)?, number(s)?),
        _ => return None,
    };
    if h == 24 && m == 0 && s == 0 {
        return Some(DAY_SECS);
    }
    (h < 24 && m < 60 && s < 60).then_some(h * 3600 + m * 60 + s)
}

/// `"09:00-18:00"`, `"22:00-06:00"`, seconds allowed (`"09:00:30-09:01:00"`), end `24:00`.
fn parse_time_span(text: &str) -> Result<(u32, u32), String> {
    let fix = "write a time window as HH:MM-HH:MM, such as \"09:00-18:00\" (the end is not \
               included; \"22:00-06:00\" crosses midnight; seconds as HH:MM:SS)";
    let Some((from, to)) = text.split_once('-') else {
        return Err(format!("not a time window; {fix}"));
    };
    let (Some(from), Some(to)) = (parse_time_of_day(from), parse_time_of_day(to)) else {
        return Err(format!("not a time window; {fix}"));
    };
    let from = from % DAY_SECS;
    if from == to % DAY_SECS {
        return Err(
            "the window starts where it ends, so it holds no time (or every time); \
                    give an end after the start, or leave times out for the whole day"
                .into(),
        );
    }
    Ok((from, to))
}

/// A calendar's compiled rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    /// Bit per weekday, Monday bit 0; 0 when no `weekdays` rule is given.
    weekdays: u8,
    /// Inclusive date ranges, sorted by start.
    dates: Vec<(NaiveDate, NaiveDate)>,
    /// Inclusive month-day ranges (`month * 100 + day`); `from > to` wraps the year end.
    yearly: Vec<(u32, u32)>,
    /// Second-of-day windows, end exclusive (86400 is midnight); `from > to` crosses midnight.
    times: Vec<(u32, u32)>,
    include: Vec<Rules>,
    except: Vec<Rules>,
}

impl CalendarDef {
    /// Checks every rule and compiles the calendar tree; the zone its instants are read in is
    /// the one a calendar of the tree names, else `default_zone`. Returns every mistake.
    pub fn compile(&self, default_zone: Tz) -> Result<CalendarClock, Vec<CalendarProblem>> {
        let mut problems = Vec::new();
        let mut zones = Vec::new();
        let mut entries = 0usize;
        let rules = self.compile_into("", 0, &mut zones, &mut entries, &mut problems);
        zones.dedup();
        if let [first, second, ..] = zones.as_slice() {
            problems.push(CalendarProblem {
                field: "timezone".into(),
                value: Some(second.to_string()),
                message: format!(
                    "calendars combined by include and except are read in one time zone, and \
                     this tree names both {first} and {second}; name the zone in one of them"
                ),
            });
        }
        if entries > MAX_CALENDAR_ENTRIES {
            problems.push(CalendarProblem {
                field: "dates".into(),
                value: None,
                message: format!(
                    "{entries} rules in calendar {} and the calendars it includes and excepts; \
                     at most {MAX_CALENDAR_ENTRIES}: merge consecutive dates into ranges \
                     (\"2027-02-10..2027-02-17\")",
                    self.name
                ),
            });
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(CalendarClock::new(
            rules,
            zones.first().copied().unwrap_or(default_zone),
        ))
    }

    fn compile_into(
        &self,
        at: &str,
        depth: usize,
        zones: &mut Vec<Tz>,
        entries: &mut usize,
        problems: &mut Vec<CalendarProblem>,
    ) -> Rules {
        let mut rules = Rules::default();
        if let Some(zone) = self.timezone
            && !zones.contains(&zone)
        {
            zones.push(zone);
        }
        *entries += self.weekdays.len() + self.dates.len() + self.yearly.len() + self.times.len();
        let mut fail = |field: &str, i: usize, value: &str, message: String| {
            problems.push(CalendarProblem {
                field: format!("{at}{field}[{i}]"),
                value: Some(value.to_owned()),
                message,
            });
        };
        for (i, text) in self.weekdays.iter().enumerate() {
            match parse_weekdays(text) {
                Ok(bits) => rules.weekdays |= bits,
                Err(message) => fail("weekdays", i, text, message),
            }
        }
        for (i, text) in self.dates.iter().enumerate() {
            match parse_date_span(text) {
                Ok(span) => rules.dates.push(span),
                Err(message) => fail("dates", i, text, message),
            }
        }
        for (i, text) in self.yearly.iter().enumerate() {
            match parse_yearly_span(text) {
                Ok(span) => rules.yearly.push(span),
                Err(message) => fail("yearly", i, text, message),
            }
        }
        for (i, text) in self.times.iter().enumerate() {
            match parse_time_span(text) {
                Ok(span) => rules.times.push(span),
                Err(message) => fail("times", i, text, message),
            }
        }
        rules.dates.sort();
        if depth >= MAX_CALENDAR_DEPTH && !(self.include.is_empty() && self.except.is_empty()) {
            problems.push(CalendarProblem {
                field: format!("{at}include"),
                value: None,
                message: format!(
                    "calendars nest at most {MAX_CALENDAR_DEPTH} levels deep through include \
                     and except; flatten the chain"
                ),
            });
            return rules;
        }
        for (i, inner) in self.include.iter().enumerate() {
            let at = format!("{at}include[{i}].");
            rules
                .include
                .push(inner.compile_into(&at, depth + 1, zones, entries, problems));
        }
        for (i, inner) in self.except.iter().enumerate() {
            let at = format!("{at}except[{i}].");
            rules
                .except
                .push(inner.compile_into(&at, depth + 1, zones, entries, problems));
        }
        rules
    }
}

impl Rules {
    fn has_own_rules(&self) -> bool {
        self.weekdays != 0
            || !self.dates.is_empty()
            || !self.yearly.is_empty()
            || !self.times.is_empty()
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        if self.weekdays == 0 && self.dates.is_empty() && self.yearly.is_empty() {
            return true;
        }
        if self.weekdays & (1 << date.weekday().num_days_from_monday()) != 0 {
            return true;
        }
        // The last range starting on or before `date`, and any earlier one that is longer.
        let before = self.dates.partition_point(|(from, _)| *from <= date);
        if self.dates[..before].iter().rev().any(|(_, to)| *to >= date) {
            return true;
        }
        let md = date.month() * 100 + date.day();
        self.yearly.iter().any(|&(from, to)| {
            if from <= to {
                (from..=to).contains(&md)
            } else {
                md >= from || md <= to
            }
        })
    }

    fn time_matches(&self, secs: u32) -> bool {
        self.times.is_empty()
            || self.times.iter().any(|&(from, to)| {
                if from < to {
                    (from..to).contains(&secs)
                } else {
                    secs >= from || secs < to
                }
            })
    }

    /// Whether the local date and second of day are in the calendar.
    fn contains(&self, date: NaiveDate, secs: u32) -> bool {
        let own = if self.has_own_rules() {
            self.day_matches(date) && self.time_matches(secs)
        } else {
            self.include.is_empty()
        };
        (own || self.include.iter().any(|i| i.contains(date, secs)))
            && !self.except.iter().any(|e| e.contains(date, secs))
    }

    /// Every second of day where a time rule of the tree starts or ends.
    fn boundaries(&self, into: &mut Vec<u32>) {
        for &(from, to) in &self.times {
            into.push(from);
            into.push(to % DAY_SECS);
        }
        for inner in self.include.iter().chain(&self.except) {
            inner.boundaries(into);
        }
    }
}

/// A calendar tree compiled and placed in its time zone: membership of instants and the
/// searches the fire rules need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarClock {
    rules: Rules,
    zone: Tz,
    /// Seconds of day where membership can change, sorted, 0 first.
    boundaries: Vec<u32>,
}

impl CalendarClock {
    fn new(rules: Rules, zone: Tz) -> CalendarClock {
        let mut boundaries = vec![0];
        rules.boundaries(&mut boundaries);
        boundaries.sort_unstable();
        boundaries.dedup();
        CalendarClock {
            rules,
            zone,
            boundaries,
        }
    }

    /// The zone the calendar is read in.
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// Whether the instant is in the calendar.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        let local = t.with_timezone(&self.zone).naive_local();
        self.contains_local(local)
    }

    fn contains_local(&self, local: NaiveDateTime) -> bool {
        let secs = local.time().signed_duration_since(chrono::NaiveTime::MIN);
        let secs = u32::try_from(secs.num_seconds()).unwrap_or(0);
        self.rules.contains(local.date(), secs)
    }

    /// The instants of local date `date` where membership can change, ascending: each boundary
    /// (both passes of a repeated time, the end of a skipped one) and the zone's offset change.
    fn changes_on(&self, date: NaiveDate) -> Vec<DateTime<Utc>> {
        let midnight = date.and_time(chrono::NaiveTime::MIN);
        let mut instants = Vec::with_capacity(self.boundaries.len() + 2);
        for &secs in &self.boundaries {
            let local = midnight + TimeDelta::seconds(i64::from(secs));
            match self.zone.from_local_datetime(&local) {
                chrono::LocalResult::Single(t) => instants.push(t.to_utc()),
                chrono::LocalResult::Ambiguous(a, b) => {
                    instants.push(a.to_utc());
                    instants.push(b.to_utc());
                }
                chrono::LocalResult::None => instants.push(super::zoned::gap_end(self.zone, local)),
            }
        }
        if let Some(change) = self.offset_change_on(midnight) {
            instants.push(change);
        }
        instants.sort_unstable();
        instants.dedup();
        instants
    }

    /// The instant the zone's offset changes during the local day starting at `midnight`, if
    /// it does (bisection at one-second resolution, as tzdata transitions are whole seconds).
    fn offset_change_on(&self, midnight: NaiveDateTime) -> Option<DateTime<Utc>> {
        let start = self
            .zone
            .from_local_datetime(&midnight)
            .earliest()?
            .to_utc();
        // Up to the next local midnight: a change after it is the next day's (listing it here
        // would put it before that day's midnight).
        let next = midnight + TimeDelta::days(1);
        let end = match self.zone.from_local_datetime(&next).earliest() {
            Some(t) => t.to_utc(),
            None => super::zoned::gap_end(self.zone, next),
        };
        let offset = |t: DateTime<Utc>| self.zone.offset_from_utc_datetime(&t.naive_utc()).fix();
        let before = offset(start);
        if offset(end) == before {
            return None;
        }
        let (mut lo, mut hi) = (start.timestamp(), end.timestamp());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let at = DateTime::from_timestamp(mid, 0)?;
            if offset(at) == before {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        DateTime::from_timestamp(hi, 0)
    }

    fn local_date(&self, t: DateTime<Utc>) -> NaiveDate {
        t.with_timezone(&self.zone).date_naive()
    }

    /// The first instant at or after `t`, no more than [`MAX_CALENDAR_SEARCH`] later, whose
    /// membership is `wanted` (`true`: in the calendar).
    pub fn first_at_or_after(&self, t: DateTime<Utc>, wanted: bool) -> Option<DateTime<Utc>> {
        if self.contains(t) == wanted {
            return Some(t);
        }
        let limit = t.checked_add_signed(search_span())?;
        let mut date = self.local_date(t).pred_opt()?;
        loop {
            for change in self.changes_on(date) {
                if change > limit {
                    return None;
                }
                if change > t && self.contains(change) == wanted {
                    return Some(change);
                }
            }
            date = date.succ_opt()?;
        }
    }

    /// For an instant whose membership is not `wanted`: where that stretch began, the earliest
    /// `s` with every instant of `[s, t]` not `wanted`, looking back at most
    /// [`MAX_CALENDAR_SEARCH`] (the bound is returned when the stretch is longer).
    pub fn stretch_start(&self, t: DateTime<Utc>, wanted: bool) -> DateTime<Utc> {
        let Some(limit) = t.checked_sub_signed(search_span()) else {
            return t;
        };
        let mut earliest = t;
        let Some(mut date) = self.local_date(t).succ_opt() else {
            return t;
        };
        loop {
            for change in self.changes_on(date).into_iter().rev() {
                if change > t {
                    continue;
                }
                if change < limit {
                    return limit;
                }
                if self.contains(change) == wanted {
                    return earliest;
                }
                earliest = change;
            }
            match date.pred_opt() {
                Some(before) => date = before,
                None => return earliest,
            }
        }
    }
}

fn search_span() -> TimeDelta {
    TimeDelta::from_std(MAX_CALENDAR_SEARCH).unwrap_or(TimeDelta::days(366))
}

/// [`MAX_CALENDAR_SEARCH`] in words, for messages.
pub fn search_words() -> String {
    format!("{} days", MAX_CALENDAR_SEARCH.as_secs() / 86_400)
}

#[cfg(test)]
mod tests;
