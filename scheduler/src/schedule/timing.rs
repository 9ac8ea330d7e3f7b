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
//! **Window.** `start_at` and `end_at` bound the fire instants (after jitter), both inclusive:
//! no fire before `start_at`, none after `end_at`; after `end_at` the schedule has ended.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use sha2::{Digest as _, Sha256};

use super::{Schedule, epoch_nanos};

/// A job's fire instants: its schedule with its window and jitter.
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
        let jitter = jitter
            .filter(|max| !max.is_zero())
            .map(|max| Jitter::new(name, max));
        let shape = (start_at.is_some() || end_at.is_some() || jitter.is_some()).then(|| {
            Box::new(Shape {
                start_at,
                end_at,
                jitter,
            })
        });
        Timing { schedule, shape }
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
        let at = match &shape.jitter {
            None => self.schedule.next_after(from)?,
            Some(jitter) => self.next_jittered(jitter, from)?,
        };
        match shape.end_at {
            Some(end) if at > end => None,
            _ => Some(at),
        }
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

    /// Up to `n` fires strictly after `after`, in order.
    pub fn upcoming(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        std::iter::successors(self.next_after(after), |at| self.next_after(*at))
            .take(n)
            .collect()
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
        }
    }
}
