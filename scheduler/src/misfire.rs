//! Misfire catch-up (pure: no IO, never reads the clock): what to do with every fire the leader
//! has not yet turned into a run or a skip.
//!
//! The leader keeps a cursor per job: the last scheduled instant it has decided. [`catch_up`]
//! decides every fire in `(cursor, now]`, oldest first:
//!
//! 1. A fire no more than `grace` before `now` is **on time**: it fires, `late: false`.
//! 2. Any other fire is **missed**. A missed fire older than `now - catchup_window` is skipped
//!    ([`SkipReason::OutsideCatchupWindow`]), whatever the policy.
//! 3. The missed fires inside the window follow the job's [`MisfirePolicy`]:
//!    `skip` skips them all; `fire_once` fires the latest one (`late: true`) and skips the rest
//!    as coalesced; `fire_all` fires the latest `max_catchup` of them and skips the older ones.
//!
//! Boundaries: `now - at == grace` is on time; `at == now - catchup_window` is inside the window.
//!
//! A fire the job's calendar excludes ([`Timing::excluded`]) never runs: on time or missed it is
//! skipped ([`SkipReason::ExcludedByCalendar`]), and it is not one of the missed fires that
//! `fire_once` and `fire_all` count. Decisions stay in order of their instants.
//!
//! # Bounded work
//!
//! A day-long outage of a per-second job is 86,400 fires, so one call returns at most
//! [`MAX_DECISIONS`] decisions and enumerates at most [`MAX_SCAN`] fires. The oldest skips beyond
//! [`MAX_DECISIONS`] are not returned one by one but summarised in [`CatchUp::omitted`] and
//! [`CatchUp::omitted_range`]. Fixed-rate schedules are counted arithmetically, so any outage
//! takes one call. A cron schedule with more than [`MAX_SCAN`] fires pending, or any schedule
//! with more than [`MAX_DECISIONS`] fires to run, is decided in pages: the call returns
//! `complete: false` and a [`CatchUp::cursor`] before `now`; call again from that cursor.
//! Fires are never omitted, only skips. `max_catchup` above [`MAX_DECISIONS`] counts as
//! [`MAX_DECISIONS`].

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::job::{JobSpec, MisfirePolicy};
use crate::schedule::{Timing, epoch_nanos, from_epoch_nanos};

/// At most this many decisions are returned by one [`catch_up`] call.
pub const MAX_DECISIONS: usize = 1_000;

/// At most this many fires of a cron schedule are enumerated by one [`catch_up`] call (a day of
/// a per-second job fits). Fixed-rate schedules are counted, not enumerated.
pub const MAX_SCAN: usize = 100_000;

/// A job's catch-up settings (from [`JobSpec`]'s `misfire`, `misfire_grace`, `catchup_window`,
/// `max_catchup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUpPolicy {
    /// What to do with missed fires inside the window.
    pub policy: MisfirePolicy,
    /// A fire decided no later than this after its instant is on time, not missed.
    pub grace: Duration,
    /// Missed fires older than this before `now` are skipped whatever the policy.
    pub catchup_window: Duration,
    /// At most this many missed fires are run by `fire_all` (capped at [`MAX_DECISIONS`]).
    pub max_catchup: u32,
}

impl CatchUpPolicy {
    /// The policy a job spec declares.
    pub fn from_spec(spec: &JobSpec) -> CatchUpPolicy {
        CatchUpPolicy {
            policy: spec.misfire,
            grace: spec.misfire_grace,
            catchup_window: spec.catchup_window,
            max_catchup: spec.max_catchup,
        }
    }

    /// How many of the latest missed fires inside the window run.
    fn missed_to_fire(&self) -> usize {
        match self.policy {
            MisfirePolicy::Skip => 0,
            MisfirePolicy::FireOnce => 1,
            MisfirePolicy::FireAll => (self.max_catchup as usize).min(MAX_DECISIONS),
        }
    }
}

/// What happens to one scheduled instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Create a run for it.
    Fire {
        /// The scheduled instant.
        at: DateTime<Utc>,
        /// A catch-up run: it is more than `grace` behind `now`.
        late: bool,
    },
    /// Record it as skipped, with why.
    Skip {
        /// The scheduled instant.
        at: DateTime<Utc>,
        /// Why it does not run.
        reason: SkipReason,
    },
}

impl Decision {
    /// The scheduled instant decided.
    pub fn at(&self) -> DateTime<Utc> {
        match self {
            Decision::Fire { at, .. } | Decision::Skip { at, .. } => *at,
        }
    }

    /// Whether this decision creates a run.
    pub fn is_fire(&self) -> bool {
        matches!(self, Decision::Fire { .. })
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Fire { at, late: false } => write!(f, "fire {}", stamp(*at)),
            Decision::Fire { at, late: true } => write!(f, "fire {} (catch-up)", stamp(*at)),
            Decision::Skip { at, reason } => write!(f, "skip {}: {reason}", stamp(*at)),
        }
    }
}

/// Why a scheduled instant was skipped. The `Display` text is for operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Missed, and older than the catch-up window.
    OutsideCatchupWindow {
        /// How long before `now` it was due.
        missed_by: Duration,
        /// The job's catch-up window.
        window: Duration,
    },
    /// Missed, and the misfire policy is `skip`.
    MisfirePolicySkip {
        /// How long before `now` it was due.
        missed_by: Duration,
    },
    /// Missed, and `fire_once` runs only the latest missed fire.
    CoalescedByFireOnce {
        /// How long before `now` it was due.
        missed_by: Duration,
    },
    /// Missed, and older than the latest `max_catchup` missed fires `fire_all` runs.
    OverMaxCatchup {
        /// How long before `now` it was due.
        missed_by: Duration,
        /// The cap applied (the job's `max_catchup`, at most [`MAX_DECISIONS`]).
        max_catchup: u32,
    },
    /// The job's calendar excludes it ([`Timing::exclusion_reason`] says how, for the record).
    ExcludedByCalendar {
        /// How long before `now` it was due (zero when on time).
        missed_by: Duration,
    },
}

impl SkipReason {
    /// A stable snake_case code for storage and metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            SkipReason::OutsideCatchupWindow { .. } => "outside_catchup_window",
            SkipReason::MisfirePolicySkip { .. } => "misfire_policy_skip",
            SkipReason::CoalescedByFireOnce { .. } => "coalesced_by_fire_once",
            SkipReason::OverMaxCatchup { .. } => "over_max_catchup",
            SkipReason::ExcludedByCalendar { .. } => "excluded_by_calendar",
        }
    }

    /// How long before `now` the skipped fire was due.
    pub fn missed_by(&self) -> Duration {
        match *self {
            SkipReason::OutsideCatchupWindow { missed_by, .. }
            | SkipReason::MisfirePolicySkip { missed_by }
            | SkipReason::CoalescedByFireOnce { missed_by }
            | SkipReason::OverMaxCatchup { missed_by, .. }
            | SkipReason::ExcludedByCalendar { missed_by } => missed_by,
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "missed by {}; ", short(self.missed_by()))?;
        match self {
            SkipReason::OutsideCatchupWindow { window, .. } => {
                write!(f, "older than the catch-up window of {}", short(*window))
            }
            SkipReason::MisfirePolicySkip { .. } => f.write_str("misfire policy skip"),
            SkipReason::CoalescedByFireOnce { .. } => {
                f.write_str("misfire policy fire_once runs only the latest missed fire")
            }
            SkipReason::OverMaxCatchup { max_catchup, .. } => write!(
                f,
                "misfire policy fire_all runs only the latest {max_catchup} missed fires (max_catchup)"
            ),
            SkipReason::ExcludedByCalendar { .. } => f.write_str("excluded by the job's calendar"),
        }
    }
}

/// The decisions of one [`catch_up`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp {
    /// Decisions for the fires after the omitted ones, strictly increasing by instant.
    pub decisions: Vec<Decision>,
    /// How many of the oldest fires were skipped without a decision of their own (all skips).
    pub omitted: u64,
    /// First and last instant of the omitted fires.
    pub omitted_range: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The last instant decided (omitted included), or the cursor passed in if none was;
    /// persist it. Never after `now`.
    pub cursor: DateTime<Utc>,
    /// Every fire in `(cursor passed in, now]` is decided. When false, call again from
    /// [`CatchUp::cursor`] with the same `now`.
    pub complete: bool,
}

/// Decides every fire of `timing` in `(cursor, now]`; see the module docs for the rules.
pub fn catch_up(
    timing: &Timing,
    cursor: DateTime<Utc>,
    now: DateTime<Utc>,
    policy: &CatchUpPolicy,
) -> CatchUp {
    let mut run = Run::new(cursor, now, policy);
    if now <= cursor {
        return run.finish(true);
    }
    let mut pos = cursor;
    if let Some(period) = timing.plain_every() {
        pos = run.fast_forward_every(period, cursor);
    }
    let mut scanned = 0;
    loop {
        let Some(at) = timing.next_after(pos).filter(|at| *at <= now) else {
            let done = run.flush_missed();
            return run.finish(done);
        };
        scanned += 1;
        if scanned > MAX_SCAN || !run.decide(at, timing.excluded(at)) {
            return run.finish(false);
        }
        pos = at;
    }
}

/// The state of one call.
struct Run<'p> {
    policy: &'p CatchUpPolicy,
    now: DateTime<Utc>,
    /// Fires at or after this are on time.
    on_time_from: DateTime<Utc>,
    /// Missed fires before this are outside the window.
    window_from: DateTime<Utc>,
    /// How many of the latest missed fires run.
    keep: usize,
    /// Missed fires inside the window not yet decided: a fire runs only if fewer than `keep`
    /// missed fires follow it, which we know only once they have been seen. Excluded fires
    /// (`true`) wait among them only to keep the decisions in order.
    pending: VecDeque<(DateTime<Utc>, bool)>,
    /// How many of `pending` are not excluded.
    pending_fires: usize,
    decisions: VecDeque<Decision>,
    omitted: u64,
    omitted_range: Option<(DateTime<Utc>, DateTime<Utc>)>,
    cursor: DateTime<Utc>,
}

impl<'p> Run<'p> {
    fn new(cursor: DateTime<Utc>, now: DateTime<Utc>, policy: &'p CatchUpPolicy) -> Run<'p> {
        Run {
            policy,
            now,
            on_time_from: before(now, policy.grace),
            window_from: before(now, policy.catchup_window),
            keep: policy.missed_to_fire(),
            pending: VecDeque::new(),
            pending_fires: 0,
            decisions: VecDeque::new(),
            omitted: 0,
            omitted_range: None,
            cursor,
        }
    }

    /// Decides (or holds as pending) one fire, `excluded` by the calendar or not; false if the
    /// output is full of fires.
    fn decide(&mut self, at: DateTime<Utc>, excluded: bool) -> bool {
        if at >= self.on_time_from {
            if !self.flush_missed() {
                return false;
            }
            if excluded {
                return self.emit(self.excluded_skip(at));
            }
            self.emit(Decision::Fire { at, late: false })
        } else if at < self.window_from {
            let reason = SkipReason::OutsideCatchupWindow {
                missed_by: self.missed_by(at),
                window: self.policy.catchup_window,
            };
            self.emit(Decision::Skip { at, reason })
        } else if excluded && self.pending.is_empty() {
            self.emit(self.excluded_skip(at))
        } else {
            self.pending.push_back((at, excluded));
            if !excluded {
                self.pending_fires += 1;
            }
            self.settle_pending()
        }
    }

    /// Decides the oldest pending fires that can be: excluded ones, and missed ones followed by
    /// `keep` others (skipped by the policy).
    fn settle_pending(&mut self) -> bool {
        while let Some(&(at, excluded)) = self.pending.front() {
            let decision = if excluded {
                self.excluded_skip(at)
            } else if self.pending_fires > self.keep {
                Decision::Skip {
                    at,
                    reason: self.policy_skip(at),
                }
            } else {
                return true;
            };
            if !self.emit_pending(decision) {
                return false;
            }
        }
        true
    }

    /// The pending missed fires are the latest ones: they run (late), the excluded ones among
    /// them are skipped.
    fn flush_missed(&mut self) -> bool {
        while let Some(&(at, excluded)) = self.pending.front() {
            let decision = if excluded {
                self.excluded_skip(at)
            } else {
                Decision::Fire { at, late: true }
            };
            if !self.emit_pending(decision) {
                return false;
            }
        }
        true
    }

    /// Emits the decision of the oldest pending fire and lets it go; false (and it stays) when
    /// the output is full of fires.
    fn emit_pending(&mut self, decision: Decision) -> bool {
        if !self.emit(decision) {
            return false;
        }
        if let Some((_, false)) = self.pending.pop_front() {
            self.pending_fires -= 1;
        }
        true
    }

    fn excluded_skip(&self, at: DateTime<Utc>) -> Decision {
        Decision::Skip {
            at,
            reason: SkipReason::ExcludedByCalendar {
                missed_by: self.missed_by(at),
            },
        }
    }

    fn policy_skip(&self, at: DateTime<Utc>) -> SkipReason {
        let missed_by = self.missed_by(at);
        match self.policy.policy {
            MisfirePolicy::Skip => SkipReason::MisfirePolicySkip { missed_by },
            MisfirePolicy::FireOnce => SkipReason::CoalescedByFireOnce { missed_by },
            MisfirePolicy::FireAll => SkipReason::OverMaxCatchup {
                missed_by,
                max_catchup: self.keep as u32,
            },
        }
    }

    fn missed_by(&self, at: DateTime<Utc>) -> Duration {
        (self.now - at).to_std().unwrap_or(Duration::ZERO)
    }

    /// Appends a decision; when full, the oldest skip makes room by becoming omitted. Returns
    /// false (and decides nothing) when the output holds only fires.
    fn emit(&mut self, decision: Decision) -> bool {
        if self.decisions.len() == MAX_DECISIONS {
            match self.decisions.front() {
                Some(Decision::Skip { at, .. }) => {
                    let at = *at;
                    self.decisions.pop_front();
                    self.omit(1, at, at);
                }
                _ => return false,
            }
        }
        self.cursor = decision.at();
        self.decisions.push_back(decision);
        true
    }

    fn omit(&mut self, count: u64, first: DateTime<Utc>, last: DateTime<Utc>) {
        self.omitted += count;
        self.omitted_range = Some(match self.omitted_range {
            Some((start, _)) => (start, last),
            None => (first, last),
        });
        self.cursor = self.cursor.max(last);
    }

    /// Fixed rate: omits, by arithmetic, the oldest fires that would only be pushed out of the
    /// output again, so the loop enumerates a bounded number. Returns where the loop starts.
    fn fast_forward_every(&mut self, period: Duration, cursor: DateTime<Utc>) -> DateTime<Utc> {
        let Ok(p) = i128::try_from(period.as_nanos()) else {
            return cursor;
        };
        if p == 0 {
            return cursor;
        }
        // Fires are k * p for k in first..=last.
        let first = epoch_nanos(cursor).div_euclid(p) + 1;
        let last = epoch_nanos(self.now).div_euclid(p);
        let total = last - first + 1;
        // At most `keep` missed fires and every on-time fire run; everything older is a skip.
        let on_time_first = (epoch_nanos(self.on_time_from) - 1).div_euclid(p) + 1;
        let on_time = (last - on_time_first.max(first) + 1).max(0);
        let room = (MAX_DECISIONS + self.keep) as i128 + on_time;
        let skip = total - room;
        if skip <= 0 {
            return cursor;
        }
        let (Some(start), Some(end)) = (
            from_epoch_nanos(first * p),
            from_epoch_nanos((first + skip - 1) * p),
        ) else {
            return cursor;
        };
        self.omit(skip as u64, start, end);
        end
    }

    fn finish(self, complete: bool) -> CatchUp {
        CatchUp {
            decisions: self.decisions.into(),
            omitted: self.omitted,
            omitted_range: self.omitted_range,
            cursor: self.cursor,
            complete,
        }
    }
}

/// `now - d`, saturating at the earliest representable instant.
fn before(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The misfire policy applied to runs that were decided and persisted on time but whose
/// trigger could not be published in time (a broker outage): given the instants of one job's
/// unpublished first attempts, ascending, returns the index and reason of each to skip.
///
/// A run up to `grace` late is on time. Of the late ones, those older than the catch-up window
/// are skipped; inside it `skip` skips them all, `fire_once` keeps only the latest, `fire_all`
/// the latest `max_catchup`.
pub fn undelivered(
    instants: &[DateTime<Utc>],
    now: DateTime<Utc>,
    policy: &CatchUpPolicy,
) -> Vec<(usize, SkipReason)> {
    let missed_by = |at: DateTime<Utc>| (now - at).to_std().unwrap_or(Duration::ZERO);
    let late: Vec<usize> = (0..instants.len())
        .filter(|&i| missed_by(instants[i]) > policy.grace)
        .collect();
    let mut skips = Vec::new();
    let mut inside = Vec::new();
    for i in late {
        let missed_by = missed_by(instants[i]);
        if missed_by > policy.catchup_window {
            skips.push((
                i,
                SkipReason::OutsideCatchupWindow {
                    missed_by,
                    window: policy.catchup_window,
                },
            ));
        } else {
            inside.push((i, missed_by));
        }
    }
    let keep = policy.missed_to_fire();
    let skipped = inside.len().saturating_sub(keep);
    for &(i, missed_by) in &inside[..skipped] {
        let reason = match policy.policy {
            MisfirePolicy::Skip => SkipReason::MisfirePolicySkip { missed_by },
            MisfirePolicy::FireOnce => SkipReason::CoalescedByFireOnce { missed_by },
            MisfirePolicy::FireAll => SkipReason::OverMaxCatchup {
                missed_by,
                max_catchup: keep as u32,
            },
        };
        skips.push((i, reason));
    }
    skips.sort_by_key(|(i, _)| *i);
    skips
}

/// A duration for operators: whole seconds from 1 s up, milliseconds below.
fn short(d: Duration) -> humantime::FormattedDuration {
    let rounded = if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64)
    };
    humantime::format_duration(rounded)
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn undelivered_runs_follow_the_misfire_policy() {
        let now = t("2026-01-01T10:00:10Z");
        // Due 10 s, 8 s, 6 s and 1 s ago; grace 5 s: the first three are late.
        let instants = [
            t("2026-01-01T10:00:00Z"),
            t("2026-01-01T10:00:02Z"),
            t("2026-01-01T10:00:04Z"),
            t("2026-01-01T10:00:09Z"),
        ];
        let policy = |policy, window: u64, max_catchup| CatchUpPolicy {
            policy,
            grace: Duration::from_secs(5),
            catchup_window: Duration::from_secs(window),
            max_catchup,
        };
        let cases: [(CatchUpPolicy, Vec<(usize, &str)>); 5] = [
            (
                policy(MisfirePolicy::Skip, 3600, 100),
                vec![
                    (0, "missed by 10s; misfire policy skip"),
                    (1, "missed by 8s; misfire policy skip"),
                    (2, "missed by 6s; misfire policy skip"),
                ],
            ),
            (
                policy(MisfirePolicy::FireOnce, 3600, 100),
                vec![
                    (
                        0,
                        "missed by 10s; misfire policy fire_once runs only the latest missed fire",
                    ),
                    (
                        1,
                        "missed by 8s; misfire policy fire_once runs only the latest missed fire",
                    ),
                ],
            ),
            (policy(MisfirePolicy::FireAll, 3600, 100), vec![]),
            (
                policy(MisfirePolicy::FireAll, 3600, 2),
                vec![(
                    0,
                    "missed by 10s; misfire policy fire_all runs only the latest 2 missed fires (max_catchup)",
                )],
            ),
            (
                policy(MisfirePolicy::FireAll, 7, 100),
                vec![
                    (0, "missed by 10s; older than the catch-up window of 7s"),
                    (1, "missed by 8s; older than the catch-up window of 7s"),
                ],
            ),
        ];
        for (policy, expected) in cases {
            let got: Vec<(usize, String)> = undelivered(&instants, now, &policy)
                .into_iter()
                .map(|(i, reason)| (i, reason.to_string()))
                .collect();
            let expected: Vec<(usize, String)> = expected
                .into_iter()
                .map(|(i, r)| (i, r.to_owned()))
                .collect();
            assert_eq!(got, expected, "{policy:?}");
        }
        assert!(undelivered(&[], now, &policy(MisfirePolicy::Skip, 3600, 100)).is_empty());
    }

    use super::*;
    use crate::schedule::Schedule;

    /// The fires of `schedule` itself, without window or jitter.
    fn plain(schedule: &Schedule) -> Timing {
        Timing::plain(std::sync::Arc::new(schedule.clone()))
    }
    use chrono_tz::Tz;
    use proptest::prelude::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn every(n: u64) -> Schedule {
        Schedule::every(secs(n)).unwrap()
    }

    fn policy(policy: MisfirePolicy, grace: u64, window: u64, max_catchup: u32) -> CatchUpPolicy {
        CatchUpPolicy {
            policy,
            grace: secs(grace),
            catchup_window: secs(window),
            max_catchup,
        }
    }

    /// Compact form of a decision list: "F" on time, "L" late fire, or the skip reason's code.
    fn kinds(c: &CatchUp) -> Vec<(String, &'static str)> {
        c.decisions
            .iter()
            .map(|d| {
                let kind = match d {
                    Decision::Fire { late: false, .. } => "F",
                    Decision::Fire { late: true, .. } => "L",
                    Decision::Skip { reason, .. } => reason.code(),
                };
                (stamp(d.at()), kind)
            })
            .collect()
    }

    fn expect(list: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
        list.iter().map(|(at, k)| (stamp(t(at)), *k)).collect()
    }

    use MisfirePolicy::{FireAll, FireOnce, Skip};

    /// (schedule, cursor, now, policy, expected decisions, expected cursor)
    type Case = (
        Schedule,
        &'static str,
        &'static str,
        CatchUpPolicy,
        Vec<(&'static str, &'static str)>,
        &'static str,
    );

    #[test]
    fn policy_tables() {
        let cases: Vec<Case> = vec![
            // Nothing due.
            (
                every(3600),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:30:00Z",
                policy(FireOnce, 5, 3600, 100),
                vec![],
                "2026-01-01T10:00:00Z",
            ),
            // On time.
            (
                every(10),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:00:12Z",
                policy(Skip, 5, 3600, 100),
                vec![("2026-01-01T10:00:10Z", "F")],
                "2026-01-01T10:00:10Z",
            ),
            // Grace boundary: exactly `grace` late is on time; a nanosecond more is late.
            (
                every(10),
                "2026-01-01T09:59:59Z",
                "2026-01-01T10:00:05Z",
                policy(Skip, 5, 3600, 100),
                vec![("2026-01-01T10:00:00Z", "F")],
                "2026-01-01T10:00:00Z",
            ),
            (
                every(10),
                "2026-01-01T09:59:59Z",
                "2026-01-01T10:00:05.000000001Z",
                policy(Skip, 5, 3600, 100),
                vec![("2026-01-01T10:00:00Z", "misfire_policy_skip")],
                "2026-01-01T10:00:00Z",
            ),
            (
                every(10),
                "2026-01-01T09:59:59Z",
                "2026-01-01T10:00:05.000000001Z",
                policy(FireOnce, 5, 3600, 100),
                vec![("2026-01-01T10:00:00Z", "L")],
                "2026-01-01T10:00:00Z",
            ),
            // Each policy over five missed minutes.
            (
                every(60),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:05:30Z",
                policy(Skip, 5, 3600, 100),
                vec![
                    ("2026-01-01T10:01:00Z", "misfire_policy_skip"),
                    ("2026-01-01T10:02:00Z", "misfire_policy_skip"),
                    ("2026-01-01T10:03:00Z", "misfire_policy_skip"),
                    ("2026-01-01T10:04:00Z", "misfire_policy_skip"),
                    ("2026-01-01T10:05:00Z", "misfire_policy_skip"),
                ],
                "2026-01-01T10:05:00Z",
            ),
            (
                every(60),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:05:30Z",
                policy(FireOnce, 5, 3600, 100),
                vec![
                    ("2026-01-01T10:01:00Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:02:00Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:03:00Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:04:00Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:05:00Z", "L"),
                ],
                "2026-01-01T10:05:00Z",
            ),
            (
                every(60),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:05:30Z",
                policy(FireAll, 5, 3600, 3),
                vec![
                    ("2026-01-01T10:01:00Z", "over_max_catchup"),
                    ("2026-01-01T10:02:00Z", "over_max_catchup"),
                    ("2026-01-01T10:03:00Z", "L"),
                    ("2026-01-01T10:04:00Z", "L"),
                    ("2026-01-01T10:05:00Z", "L"),
                ],
                "2026-01-01T10:05:00Z",
            ),
            (
                every(60),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:02:30Z",
                policy(FireAll, 5, 3600, 0),
                vec![
                    ("2026-01-01T10:01:00Z", "over_max_catchup"),
                    ("2026-01-01T10:02:00Z", "over_max_catchup"),
                ],
                "2026-01-01T10:02:00Z",
            ),
            // Window boundary: exactly `catchup_window` old is inside; older is outside.
            (
                every(60),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:05:00Z",
                policy(FireAll, 5, 180, 100),
                vec![
                    ("2026-01-01T10:01:00Z", "outside_catchup_window"),
                    ("2026-01-01T10:02:00Z", "L"),
                    ("2026-01-01T10:03:00Z", "L"),
                    ("2026-01-01T10:04:00Z", "L"),
                    ("2026-01-01T10:05:00Z", "F"),
                ],
                "2026-01-01T10:05:00Z",
            ),
            (
                every(60),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:05:00Z",
                policy(FireOnce, 5, 180, 100),
                vec![
                    ("2026-01-01T10:01:00Z", "outside_catchup_window"),
                    ("2026-01-01T10:02:00Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:03:00Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:04:00Z", "L"),
                    ("2026-01-01T10:05:00Z", "F"),
                ],
                "2026-01-01T10:05:00Z",
            ),
            // A window shorter than grace: on time still wins; every missed fire is outside.
            (
                every(2),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:00:10Z",
                policy(FireAll, 5, 1, 100),
                vec![
                    ("2026-01-01T10:00:02Z", "outside_catchup_window"),
                    ("2026-01-01T10:00:04Z", "outside_catchup_window"),
                    ("2026-01-01T10:00:06Z", "F"),
                    ("2026-01-01T10:00:08Z", "F"),
                    ("2026-01-01T10:00:10Z", "F"),
                ],
                "2026-01-01T10:00:10Z",
            ),
            // fire_once with on-time fires after the missed ones.
            (
                every(2),
                "2026-01-01T10:00:00Z",
                "2026-01-01T10:00:10Z",
                policy(FireOnce, 5, 3600, 100),
                vec![
                    ("2026-01-01T10:00:02Z", "coalesced_by_fire_once"),
                    ("2026-01-01T10:00:04Z", "L"),
                    ("2026-01-01T10:00:06Z", "F"),
                    ("2026-01-01T10:00:08Z", "F"),
                    ("2026-01-01T10:00:10Z", "F"),
                ],
                "2026-01-01T10:00:10Z",
            ),
            // One-shot in the past, inside the window (exactly at its start), per policy.
            (
                Schedule::At(t("2026-01-01T09:00:00Z")),
                "2026-01-01T08:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(FireOnce, 5, 3600, 100),
                vec![("2026-01-01T09:00:00Z", "L")],
                "2026-01-01T09:00:00Z",
            ),
            (
                Schedule::At(t("2026-01-01T09:00:00Z")),
                "2026-01-01T08:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(FireAll, 5, 3600, 1),
                vec![("2026-01-01T09:00:00Z", "L")],
                "2026-01-01T09:00:00Z",
            ),
            (
                Schedule::At(t("2026-01-01T09:00:00Z")),
                "2026-01-01T08:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(Skip, 5, 3600, 100),
                vec![("2026-01-01T09:00:00Z", "misfire_policy_skip")],
                "2026-01-01T09:00:00Z",
            ),
            (
                Schedule::At(t("2026-01-01T08:59:59Z")),
                "2026-01-01T08:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(FireOnce, 5, 3600, 100),
                vec![("2026-01-01T08:59:59Z", "outside_catchup_window")],
                "2026-01-01T08:59:59Z",
            ),
            // One-shot already decided, or still in the future.
            (
                Schedule::At(t("2026-01-01T09:00:00Z")),
                "2026-01-01T09:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(FireOnce, 5, 3600, 100),
                vec![],
                "2026-01-01T09:00:00Z",
            ),
            (
                Schedule::At(t("2026-01-01T11:00:00Z")),
                "2026-01-01T08:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(FireOnce, 5, 3600, 100),
                vec![],
                "2026-01-01T08:00:00Z",
            ),
            (
                Schedule::Manual,
                "2026-01-01T08:00:00Z",
                "2026-01-01T10:00:00Z",
                policy(FireAll, 5, 3600, 100),
                vec![],
                "2026-01-01T08:00:00Z",
            ),
            // Cron across New York's spring-forward gap: 02:30 local fires at 07:00Z.
            (
                Schedule::cron("30 2 * * *", "America/New_York".parse::<Tz>().unwrap()).unwrap(),
                "2026-03-07T12:00:00Z",
                "2026-03-08T07:00:03Z",
                policy(FireOnce, 5, 3600, 100),
                vec![("2026-03-08T07:00:00Z", "F")],
                "2026-03-08T07:00:00Z",
            ),
        ];
        for (schedule, cursor, now, policy, want, want_cursor) in cases {
            let got = catch_up(&plain(&schedule), t(cursor), t(now), &policy);
            let label = format!("{schedule} cursor {cursor} now {now} {policy:?}");
            assert_eq!(kinds(&got), expect(&want), "{label}");
            assert_eq!(got.cursor, t(want_cursor), "{label}");
            assert_eq!(
                (got.omitted, got.omitted_range, got.complete),
                (0, None, true),
                "{label}"
            );
        }
    }

    #[test]
    fn cursor_at_or_after_now_decides_nothing() {
        let p = policy(FireAll, 5, 3600, 100);
        for cursor in ["2026-01-01T10:00:00Z", "2026-01-01T10:00:01Z"] {
            let got = catch_up(&plain(&every(1)), t(cursor), t("2026-01-01T10:00:00Z"), &p);
            assert!(got.decisions.is_empty());
            assert_eq!(
                (got.cursor, got.omitted, got.complete),
                (t(cursor), 0, true)
            );
        }
    }

    #[test]
    fn skip_reasons_read_well() {
        let cases = [
            (
                SkipReason::MisfirePolicySkip {
                    missed_by: Duration::from_millis(42_700),
                },
                "missed by 42s; misfire policy skip",
            ),
            (
                SkipReason::OutsideCatchupWindow {
                    missed_by: secs(7500),
                    window: secs(3600),
                },
                "missed by 2h 5m; older than the catch-up window of 1h",
            ),
            (
                SkipReason::CoalescedByFireOnce {
                    missed_by: Duration::from_millis(250),
                },
                "missed by 250ms; misfire policy fire_once runs only the latest missed fire",
            ),
            (
                SkipReason::OverMaxCatchup {
                    missed_by: secs(600),
                    max_catchup: 100,
                },
                "missed by 10m; misfire policy fire_all runs only the latest 100 missed fires (max_catchup)",
            ),
        ];
        for (reason, want) in cases {
            assert_eq!(reason.to_string(), want);
        }
        let skip = Decision::Skip {
            at: t("2026-01-01T10:00:00Z"),
            reason: cases[0].0,
        };
        assert_eq!(
            skip.to_string(),
            "skip 2026-01-01T10:00:00Z: missed by 42s; misfire policy skip"
        );
        assert_eq!(
            Decision::Fire {
                at: t("2026-01-01T10:00:00Z"),
                late: true
            }
            .to_string(),
            "fire 2026-01-01T10:00:00Z (catch-up)"
        );
        assert_eq!(
            Decision::Fire {
                at: t("2026-01-01T10:00:00Z"),
                late: false
            }
            .to_string(),
            "fire 2026-01-01T10:00:00Z"
        );
    }

    #[test]
    fn policy_from_spec() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "a", "group": "g", "misfire": "fire_all", "misfire_grace": "10s",
            "catchup_window": "2h", "max_catchup": 7,
        }))
        .unwrap();
        assert_eq!(
            CatchUpPolicy::from_spec(&spec),
            policy(FireAll, 10, 7200, 7)
        );
    }

    /// A day-long outage of a per-second job, fixed rate (counted) and cron (enumerated): the
    /// newest `MAX_DECISIONS` are returned, the older skips summarised, the cursor reaches now.
    #[test]
    fn day_long_outage_of_a_per_second_job_is_bounded() {
        let now = t("2026-01-02T00:00:00Z");
        let cursor = t("2026-01-01T00:00:00Z");
        let per_second_cron = Schedule::cron("* * * * * *", Tz::UTC).unwrap();
        for schedule in [every(1), per_second_cron] {
            let got = catch_up(
                &plain(&schedule),
                cursor,
                now,
                &policy(FireOnce, 5, 3600, 100),
            );
            assert!(got.complete, "{schedule}");
            assert_eq!(got.decisions.len(), MAX_DECISIONS, "{schedule}");
            assert_eq!(got.omitted, 86_400 - MAX_DECISIONS as u64, "{schedule}");
            assert_eq!(
                got.omitted_range,
                Some((t("2026-01-01T00:00:01Z"), t("2026-01-01T23:43:20Z"))),
                "{schedule}"
            );
            assert_eq!(got.cursor, now, "{schedule}");
            assert_eq!(
                got.decisions[0].at(),
                t("2026-01-01T23:43:21Z"),
                "{schedule}"
            );
            let fires: Vec<_> = got.decisions.iter().filter(|d| d.is_fire()).collect();
            // now-6s late (the latest missed), now-5s..now on time.
            assert_eq!(fires.len(), 7, "{schedule}");
            assert_eq!(
                *fires[0],
                Decision::Fire {
                    at: t("2026-01-01T23:59:54Z"),
                    late: true
                }
            );
            assert!(
                fires[1..]
                    .iter()
                    .all(|d| matches!(d, Decision::Fire { late: false, .. }))
            );
        }
    }

    #[test]
    fn more_fires_than_fit_are_paged_never_omitted() {
        // fire_all over a 2 h outage of a per-second job: 1000 late (max_catchup capped at
        // MAX_DECISIONS) + 6 on time = 1006 fires > MAX_DECISIONS.
        let now = t("2026-01-01T02:00:00Z");
        let p = policy(FireAll, 5, 3 * 3600, 5000);
        let first = catch_up(&plain(&every(1)), t("2026-01-01T00:00:00Z"), now, &p);
        assert!(!first.complete);
        assert_eq!(first.decisions.len(), MAX_DECISIONS);
        assert!(
            first
                .decisions
                .iter()
                .all(|d| matches!(d, Decision::Fire { late: true, .. }))
        );
        assert_eq!(first.omitted, 7200 - 6 - 1000);
        assert_eq!(first.cursor, first.decisions.last().unwrap().at());
        assert!(first.cursor < now);
        let second = catch_up(&plain(&every(1)), first.cursor, now, &p);
        assert!(second.complete);
        assert_eq!(
            (second.decisions.len(), second.omitted, second.cursor),
            (6, 0, now)
        );
        assert!(
            second
                .decisions
                .iter()
                .all(|d| matches!(d, Decision::Fire { late: false, .. }))
        );
    }

    #[test]
    fn a_grace_spanning_many_fires_pages_its_on_time_fires() {
        // Every 100 ms, 1 h outage, 200 s grace: 2001 on time + 1 late (fire_once) = 2002 fires,
        // 33,998 coalesced skips, all omitted; the fires come in three pages.
        let s = Schedule::every(Duration::from_millis(100)).unwrap();
        let now = t("2026-01-01T01:00:00Z");
        let p = policy(FireOnce, 200, 3600, 100);
        let mut pos = t("2026-01-01T00:00:00Z");
        let mut pages = Vec::new();
        loop {
            let got = catch_up(&plain(&s), pos, now, &p);
            assert!(
                got.decisions.iter().all(Decision::is_fire),
                "only skips may be omitted"
            );
            pages.push((got.decisions.len(), got.omitted, got.complete));
            pos = got.cursor;
            if got.complete {
                break;
            }
        }
        assert_eq!(
            pages,
            [(1000, 33_998, false), (1000, 0, false), (2, 0, true)]
        );
        assert_eq!(pos, now);
    }

    #[test]
    fn max_catchup_above_max_decisions_is_capped() {
        assert_eq!(
            policy(FireAll, 0, 3600, 5000).missed_to_fire(),
            MAX_DECISIONS
        );
        // 1799 missed + 1 on time; the 799 oldest missed are over the (capped) max_catchup and,
        // with 1000 late fires to return, omitted.
        let got = catch_up(
            &plain(&every(1)),
            t("2026-01-01T00:00:00Z"),
            t("2026-01-01T00:30:00Z"),
            &policy(FireAll, 0, 3600, 5000),
        );
        assert_eq!(got.omitted, 799);
        assert_eq!(got.decisions.len(), MAX_DECISIONS);
        assert_eq!(
            got.decisions[0],
            Decision::Fire {
                at: t("2026-01-01T00:13:20Z"),
                late: true
            }
        );
        assert!(!got.complete);
    }

    #[test]
    fn cron_with_more_fires_than_max_scan_is_paged() {
        let s = Schedule::cron("* * * * * *", Tz::UTC).unwrap();
        let cursor = t("2026-01-01T00:00:00Z");
        let now = t("2026-01-03T00:00:00Z");
        let p = policy(Skip, 5, 3600, 100);
        let first = catch_up(&plain(&s), cursor, now, &p);
        assert!(!first.complete);
        assert!(first.cursor < now);
        let accounted = first.omitted + first.decisions.len() as u64;
        assert_eq!(accounted, MAX_SCAN as u64);
        let second = catch_up(&plain(&s), first.cursor, now, &p);
        assert!(second.complete);
        assert_eq!(second.cursor, now);
        assert_eq!(
            accounted + second.omitted + second.decisions.len() as u64,
            2 * 86_400
        );
    }

    // -----------------------------------------------------------------------------------------

    /// A schedule and an outage length (seconds) that keep the brute-force list small.
    fn schedule_and_span() -> impl Strategy<Value = (Schedule, i64)> {
        let ny = || "America/New_York".parse::<Tz>().unwrap();
        let long = prop_oneof![0i64..600, 0i64..(6 * 3600)];
        prop_oneof![
            (
                (1u64..600).prop_map(|s| Schedule::every(Duration::from_secs(s)).unwrap()),
                long.clone()
            ),
            (
                (50u64..2000).prop_map(|ms| Schedule::every(Duration::from_millis(ms)).unwrap()),
                0i64..600
            ),
            (
                prop::sample::select(vec![
                    "*/7 * * * * *",
                    "* * * * *",
                    "*/5 * * * *",
                    "0 * * * *",
                    "30 2 * * *",
                    "*/20 * 1-3 * * *"
                ])
                .prop_map(move |e| Schedule::cron(e, ny()).unwrap()),
                long.clone(),
            ),
            (
                Just(Schedule::cron("* * * * * *", Tz::UTC).unwrap()),
                0i64..1200
            ),
            (
                (0i64..86_400)
                    .prop_map(|s| Schedule::At(t("2026-03-08T00:00:00Z") + TimeDelta::seconds(s))),
                long.clone()
            ),
            (Just(Schedule::Manual), long),
        ]
    }

    /// The decision the rules give each fire, knowing all fires (the oracle). `all` is sorted.
    fn expected(all: &[DateTime<Utc>], now: DateTime<Utc>, p: &CatchUpPolicy) -> Vec<&'static str> {
        let on_time_from = before(now, p.grace);
        let window_from = before(now, p.catchup_window);
        // Missed fires inside the window are a contiguous run of `all`; its last `keep` run.
        let missed_start = all.partition_point(|a| *a < window_from);
        let missed_end = all.partition_point(|a| *a < on_time_from).max(missed_start);
        let late_from = missed_end
            .saturating_sub(p.missed_to_fire())
            .max(missed_start);
        (0..all.len())
            .map(|i| {
                if all[i] >= on_time_from {
                    "F"
                } else if i < missed_start {
                    "outside_catchup_window"
                } else if i >= late_from {
                    "L"
                } else {
                    match p.policy {
                        Skip => "misfire_policy_skip",
                        FireOnce => "coalesced_by_fire_once",
                        FireAll => "over_max_catchup",
                    }
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Every fire in (cursor, now] is decided exactly once or counted in `omitted`, by the
        /// rules; decisions strictly increase; at most `max_catchup` (capped) late fires and at
        /// most one for fire_once; only skips are omitted; paging reaches `now`.
        #[test]
        fn every_fire_is_decided_once_by_the_rules(
            (schedule, span) in schedule_and_span(),
            start in 0i64..(2 * 86_400),
            span_nanos in prop_oneof![Just(0i64), 0i64..1_000_000_000],
            policy_kind in prop::sample::select(vec![Skip, FireOnce, FireAll]),
            grace in prop_oneof![Just(0u64), 0u64..120, 100u64..400],
            window in prop_oneof![Just(0u64), 0u64..(3 * 3600)],
            max_catchup in prop_oneof![0u32..5, 0u32..2000],
        ) {
            let cursor = t("2026-03-07T00:00:00Z") + TimeDelta::seconds(start);
            let now = cursor + TimeDelta::seconds(span) + TimeDelta::nanoseconds(span_nanos);
            let p = policy(policy_kind, grace, window, max_catchup);
            let all = {
                let mut v = Vec::new();
                let mut pos = cursor;
                while let Some(next) = schedule.next_after(pos).filter(|n| *n <= now) {
                    v.push(next);
                    pos = next;
                }
                v
            };
            let want = expected(&all, now, &p);

            let mut pos = cursor;
            let mut decided: Vec<(DateTime<Utc>, &'static str)> = Vec::new();
            let mut omitted_total = 0u64;
            let mut omitted_fires = Vec::new();
            for page in 0.. {
                prop_assert!(page < 100, "paging does not converge");
                let got = catch_up(&plain(&schedule), pos, now, &p);
                prop_assert!(got.cursor <= now.max(pos));
                prop_assert!(got.decisions.len() <= MAX_DECISIONS);
                if let Some((first, last)) = got.omitted_range {
                    let inside: Vec<_> = all.iter().filter(|a| **a >= first && **a <= last).copied().collect();
                    prop_assert_eq!(inside.len() as u64, got.omitted);
                    prop_assert!(inside.first().is_some_and(|f| *f > pos));
                    if let Some(d) = got.decisions.first() {
                        prop_assert!(last < d.at());
                    }
                    omitted_fires.extend(inside);
                } else {
                    prop_assert_eq!(got.omitted, 0);
                }
                omitted_total += got.omitted;
                for d in &got.decisions {
                    prop_assert!(d.at() > pos && d.at() <= now);
                }
                decided.extend(kinds(&got).into_iter().map(|(_, k)| k).zip(got.decisions.iter().map(Decision::at)).map(|(k, a)| (a, k)));
                prop_assert!(got.cursor >= pos);
                if got.complete {
                    prop_assert_eq!(got.cursor, all.last().copied().unwrap_or(cursor).max(pos));
                    break;
                }
                prop_assert!(got.cursor > pos, "an incomplete page must make progress");
                pos = got.cursor;
            }
            // Decided + omitted = all fires, each once, in order.
            prop_assert!(decided.windows(2).all(|w| w[0].0 < w[1].0));
            let mut accounted: Vec<_> = decided.iter().map(|(a, _)| *a).chain(omitted_fires.iter().copied()).collect();
            accounted.sort();
            prop_assert_eq!(&accounted, &all);
            prop_assert_eq!(omitted_total as usize + decided.len(), all.len());
            // Each decision follows the rules; omitted ones are all skips.
            let rule = |at: &DateTime<Utc>| want[all.binary_search(at).unwrap()];
            for (at, kind) in &decided {
                prop_assert_eq!(*kind, rule(at), "at {}", at);
            }
            for at in &omitted_fires {
                prop_assert!(!matches!(rule(at), "F" | "L"), "fire at {} was omitted", at);
            }
            let late = decided.iter().filter(|(_, k)| *k == "L").count();
            let bound = match policy_kind { Skip => 0, FireOnce => 1, FireAll => (max_catchup as usize).min(MAX_DECISIONS) };
            prop_assert!(late <= bound);
            let on_time = decided.iter().filter(|(_, k)| *k == "F").count();
            prop_assert_eq!(on_time, all.iter().filter(|a| **a >= before(now, p.grace)).count());
        }
    }

    /// A timing of `schedule` kept out of the second-of-minute windows `times` (UTC), its
    /// excluded fires skipped.
    fn kept_out(schedule: &Schedule, times: &[String]) -> Timing {
        let def = crate::schedule::CalendarDef {
            name: "quiet".into(),
            times: times.to_vec(),
            ..Default::default()
        };
        let calendar = crate::schedule::CalendarUse {
            clock: std::sync::Arc::new(def.compile(Tz::UTC).unwrap()),
            name: "quiet".into(),
            only: false,
            on_excluded: crate::schedule::OnExcluded::Skip,
        };
        plain(schedule).shaped("quiet", None, None, None, Some(calendar))
    }

    #[test]
    fn excluded_fires_are_skipped_in_order_and_are_not_missed_fires() {
        // Every 10 s; 10:00:20-10:00:40 excluded. Cursor 10:00:00, now 10:01:05, grace 5 s:
        // 10:00:10 .. 10:01:00 are missed, the excluded 10:00:20 and :30 among them.
        let timing = kept_out(
            &every(10),
            &[
                "10:00:20-10:00:40".to_owned(),
                "10:01:00-10:01:01".to_owned(),
            ],
        );
        let got = catch_up(
            &timing,
            t("2026-01-01T10:00:00Z"),
            t("2026-01-01T10:01:05Z"),
            &policy(FireOnce, 5, 3600, 100),
        );
        assert_eq!(
            kinds(&got),
            expect(&[
                ("2026-01-01T10:00:10Z", "coalesced_by_fire_once"),
                ("2026-01-01T10:00:20Z", "excluded_by_calendar"),
                ("2026-01-01T10:00:30Z", "excluded_by_calendar"),
                ("2026-01-01T10:00:40Z", "coalesced_by_fire_once"),
                ("2026-01-01T10:00:50Z", "L"),
                ("2026-01-01T10:01:00Z", "excluded_by_calendar"),
            ])
        );
        assert!(got.complete);
        // An on-time fire the calendar excludes is skipped too.
        let got = catch_up(
            &timing,
            t("2026-01-01T10:00:15Z"),
            t("2026-01-01T10:00:21Z"),
            &policy(FireAll, 5, 3600, 100),
        );
        assert_eq!(
            kinds(&got),
            expect(&[("2026-01-01T10:00:20Z", "excluded_by_calendar")])
        );
        let Decision::Skip { reason, .. } = &got.decisions[0] else {
            panic!("a skip");
        };
        assert_eq!(
            reason.to_string(),
            "missed by 1s; excluded by the job's calendar"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// With a calendar: excluded fires are skipped (older than the window: skipped as
        /// such), the others are decided by the rules as if the excluded ones did not exist,
        /// and decisions stay in order.
        #[test]
        fn excluded_fires_leave_the_rules_to_the_others(
            period in 1u64..30,
            windows in proptest::collection::vec((0u32..86_400, 1u32..600), 1..4),
            start in 0i64..86_400,
            span in 0i64..900,
            policy_kind in prop::sample::select(vec![Skip, FireOnce, FireAll]),
            grace in 0u64..60,
            window in 0u64..1200,
            max_catchup in 0u32..5,
        ) {
            let clock = |s: u32| format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
            let times: Vec<String> = windows
                .iter()
                .map(|&(from, len)| format!("{}-{}", clock(from), clock((from + len) % 86_400)))
                .collect();
            let schedule = every(period);
            let timing = kept_out(&schedule, &times);
            let cursor = t("2026-03-07T00:00:00Z") + TimeDelta::seconds(start);
            let now = cursor + TimeDelta::seconds(span);
            let p = policy(policy_kind, grace, window, max_catchup);
            let all: Vec<DateTime<Utc>> = std::iter::successors(schedule.next_after(cursor), |at| schedule.next_after(*at))
                .take_while(|at| *at <= now)
                .collect();
            let allowed: Vec<DateTime<Utc>> = all.iter().copied().filter(|at| !timing.excluded(*at)).collect();
            let want = expected(&allowed, now, &p);
            let got = catch_up(&timing, cursor, now, &p);
            prop_assert!(got.complete);
            prop_assert_eq!(got.omitted, 0);
            let decided: Vec<DateTime<Utc>> = got.decisions.iter().map(Decision::at).collect();
            prop_assert_eq!(&decided, &all);
            for (decision, (at, kind)) in got.decisions.iter().zip(kinds(&got)) {
                let at = t(&at);
                let rule = if timing.excluded(at) {
                    if at < before(now, p.catchup_window) { "outside_catchup_window" } else { "excluded_by_calendar" }
                } else {
                    want[allowed.binary_search(&at).unwrap()]
                };
                prop_assert_eq!(kind, rule, "{}", decision);
            }
        }
    }
}
