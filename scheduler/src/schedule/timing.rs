//! A job's fire instants: its [`Schedule`] narrowed to a window (`start_at`, `end_at`) and
//! spread by a stable jitter, the one place both rules live.
//!
//! **Jitter.** A nominal fire `n` of the schedule moves to `n + offset`, where `offset` is a
//! whole number of milliseconds in `[0, span)`, `span` being the job's `jitter` or the time to
//! the schedule's next nominal fire, whichever is shorter (all of `jitter` after the last
//! fire). The offset is `floor(h × span_ms / 2^64)`, `h` the first 8 bytes (big-endian) of the
//! SHA-256 of `"chime-jitter"`, a zero byte, the job's name, a zero byte and `n`'s nanoseconds
//! since the Unix epoch as 16 little-endian bytes. It depends on nothing but the job's name and
//! the nominal instant, so every leader, before and after a failover or a restart, computes the
//! same instant for the same fire, and the unique (job, instant) key keeps each fire one run.
//! A fire never moves past the next nominal fire, so jittered fires keep their order and a
//! cursor at a jittered instant finds the next one.
//!
//! **Calendar.** After jitter, a job's calendar decides: with `calendar_mode = "only"` a fire is
//! allowed when its instant is in the calendar, with `"except"` when it is not. An excluded
//! fire is, by `on_excluded`:
//!
//! - `skip` (the default): still decided at its instant, recorded skipped with the reason
//!   ([`Timing::next_after`] returns it, [`Timing::excluded`] says it is excluded);
//! - `next_allowed`: moved to the first allowed instant at or after it. Fires moved to one
//!   instant are one fire there, as is a fire moved onto an allowed fire of the schedule; so the
//!   fires stay in order and never fire twice. A fire with no allowed instant within
//!   [`MAX_CALENDAR_SEARCH`](chime_protocol::limits::MAX_CALENDAR_SEARCH) after it stays at its
//!   instant and is skipped, with that reason.
//!
//! **Window.** `start_at` and `end_at` bound the fire instants (after jitter), both inclusive:
//! no fire before `start_at`, none after `end_at`; after `end_at` the schedule has ended. A fire
//! that `next_allowed` moves past `end_at` is not made.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use sha2::{Digest as _, Sha256};

use super::{CalendarClock, Schedule, epoch_nanos};

/// At most this many decided fires are looked at to list upcoming ones: a calendar that
/// excludes every fire of a per-second job for a day still answers at once.
pub const UPCOMING_SCAN: usize = 100_000;

/// A job's fire instants: its schedule with its window, jitter and calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// Shared between the jobs of one schedule (the planner shares it).
    schedule: Arc<Schedule>,
    /// `None` for the common job without window or jitter (8 bytes a job in the plan).
    shape: Option<Box<Shape>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
    jitter: Option<Jitter>,
    calendar: Option<CalendarUse>,
}

/// What a job does with a fire its calendar excludes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExcluded {
    /// Record the fire skipped, with the reason.
    #[default]
    Skip,
    /// Move the fire to the first allowed instant at or after it.
    NextAllowed,
}

impl OnExcluded {
    /// The words of job files.
    pub const NAMES: &'static [&'static str] = &["skip", "next_allowed"];

    /// The word of job files.
    pub fn as_str(self) -> &'static str {
        match self {
            OnExcluded::Skip => "skip",
            OnExcluded::NextAllowed => "next_allowed",
        }
    }

    /// Whether this is the default, `skip`.
    pub fn is_skip(&self) -> bool {
        *self == OnExcluded::Skip
    }

    /// Parses the word of job files.
    pub fn parse(word: &str) -> Option<OnExcluded> {
        match word {
            "skip" => Some(OnExcluded::Skip),
            "next_allowed" => Some(OnExcluded::NextAllowed),
            _ => None,
        }
    }
}

/// A job's calendar as its fires use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarUse {
    /// The compiled calendar (shared between the jobs of one calendar).
    pub clock: Arc<CalendarClock>,
    /// Its name, for skip reasons.
    pub name: Box<str>,
    /// `calendar_mode = "only"` (fires in the calendar are allowed); else `"except"`.
    pub only: bool,
    /// What an excluded fire does.
    pub on_excluded: OnExcluded,
}

impl CalendarUse {
    fn allows(&self, t: DateTime<Utc>) -> bool {
        self.clock.contains(t) == self.only
    }

    fn next_allowed(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.clock.first_at_or_after(t, self.only)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Jitter {
    max: Duration,
    /// The hash input up to the instant: the domain tag and the job's name.
    prefix: Box<[u8]>,
}

impl Jitter {
    fn new(name: &str, max: Duration) -> Jitter {
        let mut prefix = b"chime-jitter\0".to_vec();
        prefix.extend_from_slice(name.as_bytes());
        prefix.push(0);
        Jitter {
            max,
            prefix: prefix.into_boxed_slice(),
        }
    }

    /// Where the nominal fire `n` goes, given the schedule's next nominal fire after it.
    fn apply(&self, n: DateTime<Utc>, next: Option<DateTime<Utc>>) -> DateTime<Utc> {
        let gap = next
            .and_then(|next| (next - n).to_std().ok())
            .unwrap_or(self.max);
        let span_ms = self.max.min(gap).as_millis();
        if span_ms == 0 {
            return n;
        }
        let digest = Sha256::new()
            .chain_update(&self.prefix)
            .chain_update(epoch_nanos(n).to_le_bytes())
            .finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let h = u128::from(u64::from_be_bytes(first));
        let offset_ms = (h * span_ms) >> 64;
        i64::try_from(offset_ms)
            .ok()
            .and_then(|ms| n.checked_add_signed(TimeDelta::milliseconds(ms)))
            .unwrap_or(n)
    }
}

impl Timing {
    /// The schedule as it is, without window or jitter.
    pub fn plain(schedule: Arc<Schedule>) -> Timing {
        Timing {
            schedule,
            shape: None,
        }
    }

    /// The schedule of job `name`, fired only inside `[start_at, end_at]` and spread by up to
    /// `jitter` (`None` or zero: not spread).
    pub fn new(
        schedule: Arc<Schedule>,
        name: &str,
        start_at: Option<DateTime<Utc>>,
        end_at: Option<DateTime<Utc>>,
        jitter: Option<Duration>,
    ) -> Timing {
        Timing::plain(schedule).shaped(name, start_at, end_at, jitter, None)
    }

    /// This timing with a window, jitter and calendar (each `None`: none).
    pub fn shaped(
        self,
        name: &str,
        start_at: Option<DateTime<Utc>>,
        end_at: Option<DateTime<Utc>>,
        jitter: Option<Duration>,
        calendar: Option<CalendarUse>,
    ) -> Timing {
        let jitter = jitter
            .filter(|max| !max.is_zero())
            .map(|max| Jitter::new(name, max));
        let shaped = start_at.is_some() || end_at.is_some() || jitter.is_some();
        let shape = (shaped || calendar.is_some()).then(|| {
            Box::new(Shape {
                start_at,
                end_at,
                jitter,
                calendar,
            })
        });
        Timing {
            schedule: self.schedule,
            shape,
        }
    }

    /// The job's calendar, if it has one.
    pub fn calendar(&self) -> Option<&CalendarUse> {
        self.shape.as_ref()?.calendar.as_ref()
    }

    /// Whether the calendar excludes the fire decided at `at` (one [`Timing::next_after`]
    /// returned): it is recorded skipped instead of run.
    pub fn excluded(&self, at: DateTime<Utc>) -> bool {
        self.calendar().is_some_and(|calendar| !calendar.allows(at))
    }

    /// Why the calendar excludes the fire at `at`, for the skip's record.
    pub fn exclusion_reason(&self, at: DateTime<Utc>) -> String {
        let Some(calendar) = self.calendar() else {
            return "excluded by the job's calendar".into();
        };
        let mode = if calendar.only { "only" } else { "except" };
        match calendar.on_excluded {
            OnExcluded::Skip => format!(
                "excluded by calendar {} (calendar_mode = \"{mode}\", on_excluded = \"skip\")",
                calendar.name
            ),
            OnExcluded::NextAllowed => format!(
                "excluded by calendar {} (calendar_mode = \"{mode}\"), which allows no instant \
                 in the {} after {}, so on_excluded = \"next_allowed\" has nowhere to move it",
                calendar.name,
                super::calendar::search_words(),
                at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
            ),
        }
    }

    /// The schedule before window and jitter.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The fixed-rate period when fires are exactly the schedule's (no window, no jitter), so
    /// whole ranges of fires can be counted without walking them.
    pub fn plain_every(&self) -> Option<Duration> {
        match (&self.shape, self.schedule.as_ref()) {
            (None, Schedule::Every(period)) => Some(*period),
            _ => None,
        }
    }

    /// The first fire strictly after `after`, or `None` if the schedule has ended.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let Some(shape) = &self.shape else {
            return self.schedule.next_after(after);
        };
        // Nothing fires before `start_at`: look from just before it.
        let from = match shape.start_at {
            Some(start) if start > after => start
                .checked_sub_signed(TimeDelta::nanoseconds(1))
                .unwrap_or(after),
            _ => after,
        };
        let at = match &shape.calendar {
            Some(calendar) if calendar.on_excluded == OnExcluded::NextAllowed => {
                self.next_moved(shape, calendar, from)?
            }
            _ => self.next_jittered_or_nominal(shape, from)?,
        };
        match shape.end_at {
            Some(end) if at > end => None,
            _ => Some(at),
        }
    }

    fn next_jittered_or_nominal(
        &self,
        shape: &Shape,
        after: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match &shape.jitter {
            None => self.schedule.next_after(after),
            Some(jitter) => self.next_jittered(jitter, after),
        }
    }

    /// The first fire strictly after `after` when excluded fires move to the next allowed
    /// instant (`g(f)`, nondecreasing in `f`, so moved fires keep their order).
    fn next_moved(
        &self,
        shape: &Shape,
        calendar: &CalendarUse,
        after: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        if !calendar.allows(after) {
            // A fire at or before `after` in the excluded stretch around `after` moves past it:
            // to the stretch's end, the first allowed instant after `after`.
            let stretch = calendar.clock.stretch_start(after, calendar.only);
            let lowest = match shape.start_at {
                Some(start) if start > stretch => start,
                _ => stretch,
            };
            let pending = lowest
                .checked_sub_signed(TimeDelta::nanoseconds(1))
                .and_then(|before| self.next_jittered_or_nominal(shape, before))
                .is_some_and(|fire| fire <= after);
            if pending && let Some(allowed) = calendar.next_allowed(after) {
                return Some(allowed);
            }
        }
        let fire = self.next_jittered_or_nominal(shape, after)?;
        // No allowed instant within the search: the fire stays, to be recorded skipped.
        Some(calendar.next_allowed(fire).unwrap_or(fire))
    }

    /// The first fire strictly after `after` that runs (not excluded by the calendar), looking
    /// at no more than `scan` decided fires.
    pub fn next_run_after(&self, after: DateTime<Utc>, scan: usize) -> Option<DateTime<Utc>> {
        let mut at = after;
        for _ in 0..scan {
            at = self.next_after(at)?;
            if !self.excluded(at) {
                return Some(at);
            }
        }
        None
    }

    /// The first jittered fire strictly after `after`. A nominal fire `n` lands in
    /// `[n, n + max)`, so the one sought is among the nominal fires after `after - max`; and
    /// jittered fires keep the nominal order, so the first that lands after `after` is it.
    fn next_jittered(&self, jitter: &Jitter, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let back = TimeDelta::from_std(jitter.max).ok();
        let from = back
            .and_then(|back| after.checked_sub_signed(back))
            .unwrap_or(after);
        let mut n = self.schedule.next_after(from)?;
        loop {
            let next = self.schedule.next_after(n);
            let at = jitter.apply(n, next);
            if at > after {
                return Some(at);
            }
            n = next?;
        }
    }

    /// Up to `n` fires strictly after `after` that run, in order: those the calendar
    /// excludes are left out, and the search ends after [`UPCOMING_SCAN`] decided fires.
    pub fn upcoming(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        self.upcoming_within(after, n, UPCOMING_SCAN)
    }

    /// [`Timing::upcoming`] among the next `decided` fires at most (run or skipped: `max_runs`
    /// counts both).
    pub fn upcoming_within(
        &self,
        after: DateTime<Utc>,
        n: usize,
        decided: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut fires = Vec::with_capacity(n.min(1024));
        let mut at = after;
        for _ in 0..decided.min(UPCOMING_SCAN) {
            if fires.len() >= n {
                break;
            }
            let Some(next) = self.next_after(at) else {
                break;
            };
            if !self.excluded(next) {
                fires.push(next);
            }
            at = next;
        }
        fires
    }

    /// Whether the schedule has ended by `now` because of `end_at`: the schedule itself fires
    /// again, but not inside the window.
    pub fn ended_by_window(&self, now: DateTime<Utc>) -> bool {
        self.next_after(now).is_none() && self.schedule.next_after(now).is_some()
    }

    /// A one-line description for listings: the schedule's, then the jitter and the window
    /// (`cron "0 0 * * *" (UTC), jitter up to 5m, from 2027-01-01T00:00:00Z`).
    pub fn describe(&self) -> String {
        let mut text = self.schedule.describe();
        if let Some(shape) = &self.shape {
            if let Some(jitter) = &shape.jitter {
                text.push_str(&format!(
                    ", jitter up to {}",
                    humantime::format_duration(jitter.max)
                ));
            }
            let instant = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
            if let Some(start) = shape.start_at {
                text.push_str(&format!(", from {}", instant(start)));
            }
            if let Some(end) = shape.end_at {
                text.push_str(&format!(", until {}", instant(end)));
            }
            if let Some(calendar) = &shape.calendar {
                let mode = if calendar.only { "only" } else { "except" };
                text.push_str(&format!(", {mode} calendar {}", calendar.name));
                if calendar.on_excluded == OnExcluded::NextAllowed {
                    text.push_str(" (excluded fires move to the next allowed instant)");
                }
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use chrono_tz::Tz;
    use proptest::prelude::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    fn cron(expr: &str) -> Arc<Schedule> {
        Arc::new(Schedule::cron(expr, Tz::UTC).unwrap())
    }

    fn jittered(schedule: Arc<Schedule>, name: &str, max: Duration) -> Timing {
        Timing::new(schedule, name, None, None, Some(max))
    }

    /// The nominal fires after `after`, each with where jitter moves it: what `next_after`
    /// must agree with, computed fire by fire.
    fn walk(t: &Timing, after: DateTime<Utc>, n: usize) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        let jitter = t.shape.as_ref().unwrap().jitter.as_ref().unwrap();
        std::iter::successors(t.schedule.next_after(after), |n| t.schedule.next_after(*n))
            .take(n)
            .map(|n| (n, jitter.apply(n, t.schedule.next_after(n))))
            .collect()
    }

    #[test]
    fn without_window_or_jitter_the_fires_are_the_schedules() {
        let schedule = cron("*/15 * * * *");
        let t = Timing::new(schedule.clone(), "a", None, None, Some(Duration::ZERO));
        assert_eq!(t, Timing::plain(schedule.clone()));
        let after = utc(2026, 12, 2, 10, 7, 0);
        assert_eq!(t.upcoming(after, 4), schedule.upcoming(after, 4));
        assert_eq!(t.plain_every(), None);
        let every = Timing::plain(Arc::new(Schedule::every(Duration::from_secs(30)).unwrap()));
        assert_eq!(every.plain_every(), Some(Duration::from_secs(30)));
    }

    #[test]
    fn the_window_is_inclusive_at_both_ends_and_the_schedule_ends_after_it() {
        let start = utc(2027, 1, 1, 0, 0, 0);
        let end = utc(2027, 1, 3, 0, 0, 0);
        let t = Timing::new(cron("0 0 * * *"), "w", Some(start), Some(end), None);
        assert_eq!(
            t.upcoming(utc(2026, 6, 1, 0, 0, 0), 10),
            vec![start, utc(2027, 1, 2, 0, 0, 0), end]
        );
        assert_eq!(t.next_after(end), None);
        assert!(t.ended_by_window(end));
        assert!(!t.ended_by_window(start));
        // From inside the window, the next fire is the schedule's.
        assert_eq!(
            t.next_after(utc(2027, 1, 1, 12, 0, 0)),
            Some(utc(2027, 1, 2, 0, 0, 0))
        );
        // start_at alone: nothing before it, the schedule goes on after.
        let from = Timing::new(cron("0 0 * * *"), "w", Some(start), None, None);
        assert_eq!(from.next_after(utc(2020, 1, 1, 0, 0, 0)), Some(start));
        assert!(!from.ended_by_window(utc(2030, 1, 1, 0, 0, 0)));
    }

    #[test]
    fn a_jittered_fire_depends_only_on_the_job_and_the_instant() {
        let daily = cron("0 0 * * *");
        let a = jittered(daily.clone(), "report", Duration::from_secs(300));
        let again = jittered(cron("0 0 * * *"), "report", Duration::from_secs(300));
        let other = jittered(daily.clone(), "report-2", Duration::from_secs(300));
        // Noon: the day's 00:00 fire is behind, whatever its offset.
        let after = utc(2026, 12, 2, 12, 0, 0);
        let fires = a.upcoming(after, 50);
        // Another leader builds the same instants; another job gets others.
        assert_eq!(again.upcoming(after, 50), fires);
        assert_ne!(other.upcoming(after, 50), fires);
        for (k, fire) in fires.iter().enumerate() {
            let nominal = utc(2026, 12, 3, 0, 0, 0) + TimeDelta::days(k as i64);
            let offset = *fire - nominal;
            assert!(offset >= TimeDelta::zero() && offset < TimeDelta::seconds(300));
            assert_eq!(offset.subsec_nanos() % 1_000_000, 0, "whole milliseconds");
        }
        // The offsets vary from fire to fire (50 equal ones would be a broken hash).
        let mut offsets: Vec<TimeDelta> = fires
            .iter()
            .zip(daily.upcoming(after, 50))
            .map(|(fire, nominal)| *fire - nominal)
            .collect();
        offsets.sort();
        offsets.dedup();
        assert!(offsets.len() > 40, "{offsets:?}");
    }

    #[test]
    fn a_cursor_at_a_jittered_fire_finds_the_next_one() {
        let t = jittered(cron("*/5 * * * *"), "sweep", Duration::from_secs(240));
        let after = utc(2026, 12, 2, 10, 0, 0);
        let fires = t.upcoming(after, 30);
        assert_eq!(fires.len(), 30);
        for pair in fires.windows(2) {
            assert_eq!(t.next_after(pair[0]), Some(pair[1]));
            // Anywhere between two fires, the next is the later one.
            let between = pair[0] + (pair[1] - pair[0]) / 2;
            assert_eq!(t.next_after(between), Some(pair[1]));
        }
    }

    #[test]
    fn jitter_longer_than_the_gap_is_cut_to_the_gap() {
        // Every 10 s with up to 1 h of jitter: each fire stays before the next nominal one.
        let every = Arc::new(Schedule::every(Duration::from_secs(10)).unwrap());
        let t = jittered(every, "dense", Duration::from_secs(3600));
        let after = utc(2026, 12, 2, 10, 0, 0);
        for (nominal, at) in walk(&t, after, 100) {
            assert!(at >= nominal && at < nominal + TimeDelta::seconds(10));
        }
        // A one-shot has no next fire: the whole jitter applies.
        let once = Arc::new(Schedule::At(utc(2027, 1, 1, 0, 0, 0)));
        let t = jittered(once, "once", Duration::from_secs(60));
        let at = t.next_after(after).unwrap();
        assert!(at >= utc(2027, 1, 1, 0, 0, 0) && at < utc(2027, 1, 1, 0, 1, 0));
        assert_eq!(t.next_after(at), None);
    }

    #[test]
    fn the_window_bounds_jittered_instants() {
        let start = utc(2027, 1, 1, 0, 0, 0);
        let t = Timing::new(
            cron("0 * * * *"),
            "hourly",
            Some(start),
            Some(utc(2027, 1, 1, 5, 0, 0)),
            Some(Duration::from_secs(1800)),
        );
        let fires = t.upcoming(utc(2026, 1, 1, 0, 0, 0), 10);
        // 00:xx … 04:xx; the 05:00 fire moves past end_at unless its offset is zero.
        assert!(fires.len() == 5 || fires.len() == 6, "{fires:?}");
        assert!(
            fires
                .iter()
                .all(|f| *f >= start && *f <= utc(2027, 1, 1, 5, 0, 0))
        );
        assert_eq!(
            t.describe(),
            "cron \"0 * * * *\" (UTC), jitter up to 30m, from 2027-01-01T00:00:00Z, until 2027-01-01T05:00:00Z"
        );
    }

    /// A calendar of `weekdays` and `times` in UTC, used `only` or not, with `on_excluded`.
    fn calendar(
        weekdays: &[&str],
        times: &[&str],
        only: bool,
        on_excluded: OnExcluded,
    ) -> CalendarUse {
        let def = crate::schedule::CalendarDef {
            name: "office".into(),
            weekdays: weekdays.iter().map(|s| (*s).to_owned()).collect(),
            times: times.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        CalendarUse {
            clock: Arc::new(def.compile(Tz::UTC).unwrap()),
            name: "office".into(),
            only,
            on_excluded,
        }
    }

    fn kept_to(schedule: Arc<Schedule>, calendar: CalendarUse) -> Timing {
        Timing::plain(schedule).shaped("c", None, None, None, Some(calendar))
    }

    #[test]
    fn skipped_fires_stay_at_their_instants_and_upcoming_leaves_them_out() {
        let office = calendar(&["mon-fri"], &["09:00-17:00"], true, OnExcluded::Skip);
        let t = kept_to(cron("0 * * * *"), office);
        // 2027-01-08 is a Friday.
        let friday = utc(2027, 1, 8, 16, 30, 0);
        assert_eq!(t.next_after(friday), Some(utc(2027, 1, 8, 17, 0, 0)));
        assert!(t.excluded(utc(2027, 1, 8, 17, 0, 0)));
        assert!(!t.excluded(utc(2027, 1, 8, 16, 0, 0)));
        assert_eq!(
            t.exclusion_reason(utc(2027, 1, 8, 17, 0, 0)),
            "excluded by calendar office (calendar_mode = \"only\", on_excluded = \"skip\")"
        );
        assert_eq!(
            t.upcoming(friday, 2),
            vec![utc(2027, 1, 11, 9, 0, 0), utc(2027, 1, 11, 10, 0, 0)]
        );
        assert_eq!(
            t.next_run_after(friday, 100),
            Some(utc(2027, 1, 11, 9, 0, 0))
        );
        assert_eq!(
            t.next_run_after(friday, 10),
            None,
            "only 10 fires looked at"
        );
        assert_eq!(
            t.describe(),
            "cron \"0 * * * *\" (UTC), only calendar office"
        );
    }

    #[test]
    fn next_allowed_moves_excluded_fires_and_makes_one_fire_of_those_landing_together() {
        let office = calendar(
            &["mon-fri"],
            &["09:00-17:00"],
            true,
            OnExcluded::NextAllowed,
        );
        let t = kept_to(cron("0 * * * *"), office);
        let friday = utc(2027, 1, 8, 16, 30, 0);
        // Friday 17:00 .. Monday 09:00 all land on Monday 09:00: one fire.
        assert_eq!(
            t.upcoming(friday, 3),
            vec![
                utc(2027, 1, 11, 9, 0, 0),
                utc(2027, 1, 11, 10, 0, 0),
                utc(2027, 1, 11, 11, 0, 0)
            ]
        );
        // From inside the excluded stretch, the moved fires are still to come.
        assert_eq!(
            t.next_after(utc(2027, 1, 9, 12, 0, 0)),
            Some(utc(2027, 1, 11, 9, 0, 0))
        );
        // Past the moved fire, the next is the schedule's.
        assert_eq!(
            t.next_after(utc(2027, 1, 11, 9, 0, 0)),
            Some(utc(2027, 1, 11, 10, 0, 0))
        );
        // A fire mid-stretch of a job firing weekly on Saturday noon moves to Monday 09:00.
        let weekly = kept_to(
            cron("0 12 * * 6"),
            calendar(
                &["mon-fri"],
                &["09:00-17:00"],
                true,
                OnExcluded::NextAllowed,
            ),
        );
        assert_eq!(
            weekly.next_after(utc(2027, 1, 4, 0, 0, 0)),
            Some(utc(2027, 1, 4, 9, 0, 0)),
            "Saturday's fire is still to come on Monday morning"
        );
        assert_eq!(
            weekly.next_after(utc(2027, 1, 4, 9, 0, 0)),
            Some(utc(2027, 1, 11, 9, 0, 0))
        );
        assert!(!weekly.excluded(utc(2027, 1, 11, 9, 0, 0)));
    }

    #[test]
    fn except_mode_keeps_fires_out_of_the_calendar() {
        let night = calendar(&[], &["22:00-06:00"], false, OnExcluded::NextAllowed);
        let t = kept_to(cron("0 */4 * * *"), night);
        // 00:00 and 04:00 fall in the night and move to 06:00 as one fire.
        assert_eq!(
            t.upcoming(utc(2027, 1, 8, 21, 0, 0), 4),
            vec![
                utc(2027, 1, 9, 6, 0, 0),
                utc(2027, 1, 9, 8, 0, 0),
                utc(2027, 1, 9, 12, 0, 0),
                utc(2027, 1, 9, 16, 0, 0)
            ]
        );
    }

    #[test]
    fn a_fire_with_nowhere_to_move_stays_and_is_excluded() {
        let def = crate::schedule::CalendarDef {
            name: "old".into(),
            dates: vec!["2020-01-01".into()],
            ..Default::default()
        };
        let t = kept_to(
            cron("0 0 * * *"),
            CalendarUse {
                clock: Arc::new(def.compile(Tz::UTC).unwrap()),
                name: "old".into(),
                only: true,
                on_excluded: OnExcluded::NextAllowed,
            },
        );
        let at = utc(2027, 1, 1, 0, 0, 0);
        assert_eq!(t.next_after(at - TimeDelta::seconds(1)), Some(at));
        assert!(t.excluded(at));
        assert!(
            t.exclusion_reason(at).contains("has nowhere to move it"),
            "{}",
            t.exclusion_reason(at)
        );
        assert!(t.upcoming(at, 3).is_empty());
    }

    proptest! {
    /// Against a walk of the nominal fires: `next_after` from any instant is the first
    /// jittered fire after it, and jittered fires are strictly increasing.
    #[test]
    fn next_after_is_the_first_jittered_fire_after_any_instant(
        period_s in 1u64..7200,
        jitter_s in 1u64..3600,
        name in "[a-z]{1,12}",
        from_s in 0i64..86_400,
        probes in proptest::collection::vec(0i64..200_000, 1..20),
    ) {
        let every = Arc::new(Schedule::every(Duration::from_secs(period_s)).unwrap());
        let t = jittered(every, &name, Duration::from_secs(jitter_s));
        let origin = utc(2026, 12, 2, 0, 0, 0) + TimeDelta::seconds(from_s);
        let back = origin - TimeDelta::seconds(3600);
        let walked = walk(&t, back, 400);
        prop_assert!(walked.windows(2).all(|w| w[0].1 < w[1].1));
        for probe in probes {
            let at = origin + TimeDelta::milliseconds(probe * 10);
            let expected = walked.iter().map(|(_, j)| *j).find(|j| *j > at);
            if let Some(expected) = expected {
                prop_assert_eq!(t.next_after(at), Some(expected));
            }
        }
    }    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against moving every nominal fire one by one: with `next_allowed`, `next_after` from
        /// any instant is the least moved fire after it, so moved fires are in order and each
        /// instant fires once.
        #[test]
        fn next_allowed_is_the_least_moved_fire_after_any_instant(
            period_m in 7u64..600,
            day in 0usize..7,
            days in 0usize..7,
            from_m in 0u32..1440,
            len_m in 1u32..1439,
            only in any::<bool>(),
            probes in proptest::collection::vec(0i64..20_000, 1..10),
        ) {
            const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
            let weekdays = format!("{}-{}", DAYS[day], DAYS[(day + days) % 7]);
            let clock = |m: u32| format!("{:02}:{:02}", m / 60, m % 60);
            let times = format!("{}-{}", clock(from_m), clock((from_m + len_m) % 1440));
            let use_ = calendar(&[weekdays.as_str()], &[times.as_str()], only, OnExcluded::NextAllowed);
            let every = Arc::new(Schedule::every(Duration::from_secs(period_m * 60)).unwrap());
            let t = kept_to(every.clone(), use_.clone());
            let origin = utc(2027, 3, 1, 0, 0, 0);
            let moved: Vec<DateTime<Utc>> = std::iter::successors(
                every.next_after(origin - TimeDelta::days(8)),
                |f| every.next_after(*f),
            )
            .take_while(|f| *f < origin + TimeDelta::days(30))
            .map(|f| use_.next_allowed(f).unwrap_or(f))
            .collect();
            for probe in probes {
                let at = origin + TimeDelta::minutes(probe) + TimeDelta::seconds(probe % 60);
                let expected = moved.iter().copied().filter(|m| *m > at).min();
                if let Some(expected) = expected.filter(|e| *e < origin + TimeDelta::days(29)) {
                    prop_assert_eq!(t.next_after(at), Some(expected));
                }
            }
        }
    }
}
