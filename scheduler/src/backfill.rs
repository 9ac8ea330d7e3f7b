//! Backfills, a leader duty: the fires a job's schedule has in a past range, made into runs as
//! one batch (docs/operations.md, "Backfilling a range").
//!
//! A backfill's fires are the job's fires as the planner makes them: its schedule with its
//! jitter, `start_at`/`end_at` window and calendar (a fire its calendar moves is backfilled
//! where it moves to; one it skips is left out, counted nowhere, as it is not a run). Each pass
//! of the duty takes every running backfill in turn and makes its next fires into runs,
//! at most as many as its `parallel` leaves room for (its runs unfinished count against it) and
//! its `rate` allows (a token bucket per backfill, one second of burst), in one fenced statement
//! per step that also moves the backfill's cursor ([`Store::backfill_step`]). A fire that has a
//! run already (scheduled, caught up, another backfill's) keeps it: the fire key makes a second
//! one impossible, so repeated and overlapping backfills create no duplicate. Such fires cost
//! neither room nor rate: a step looks up which of its next fires have runs and goes past them,
//! and a pass makes several steps while there are some. A backfill whose
//! every fire has been handled and whose runs have all ended is `done`.
//!
//! The duty wakes every second, and at once on `NOTIFY chime_backfills` (a backfill requested,
//! a run of one ended), at most every [`MIN_PASS_GAP`]. A new leader goes on from each
//! backfill's cursor.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::schedule::Timing;
use crate::store::{BACKFILLS_CHANNEL, BackfillWork, Fence, Stepped, Store};

/// How often the duty looks at the running backfills when nothing wakes it.
const INTERVAL: Duration = Duration::from_secs(1);
/// The shortest time between two passes, however often it is woken.
pub const MIN_PASS_GAP: Duration = Duration::from_millis(50);
/// Most runs one step makes.
pub const STEP_RUNS: usize = 500;
/// Most fires one step looks at (fires the calendar skips included): a step over a sparse
/// calendar stays short and moves the cursor as far as it looked.
const STEP_SCAN: usize = 10_000;
/// Running backfills one pass reads.
const PASS_LIMIT: i64 = 1_000;

/// The fires of one step of a backfill ([`step_fires`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFires {
    /// The fires to make into runs, in order.
    pub fires: Vec<DateTime<Utc>>,
    /// Every fire up to this instant has been looked at: the backfill's next cursor.
    pub cursor: DateTime<Utc>,
    /// Whether every fire of the range has been (the cursor is then `to`).
    pub ended: bool,
}

/// The next fires of a backfill of `from..to` after `cursor` (`None`: from `from` on), at most
/// `max` of them, looking at no more than `scan` fires: those `timing`'s calendar skips are
/// left out.
pub fn step_fires(
    timing: &Timing,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    cursor: Option<DateTime<Utc>>,
    max: usize,
    scan: usize,
) -> StepFires {
    let mut at = match cursor {
        Some(at) => at,
        // A fire at `from` itself is in the range: look from just before it.
        None => from
            .checked_sub_signed(TimeDelta::nanoseconds(1))
            .unwrap_or(from),
    };
    let mut fires = Vec::new();
    for _ in 0..scan {
        if fires.len() >= max {
            break;
        }
        match timing.next_after(at) {
            Some(next) if next < to => {
                if !timing.excluded(next) {
                    fires.push(next);
                }
                at = next;
            }
            _ => {
                return StepFires {
                    fires,
                    cursor: to,
                    ended: true,
                };
            }
        }
    }
    StepFires {
        fires,
        cursor: at,
        ended: false,
    }
}

/// Every fire of `from..to` that runs, as [`step_fires`] finds them, or `None` when there are
/// more than `limit`.
pub fn fires_in(
    timing: &Timing,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    limit: usize,
) -> Option<Vec<DateTime<Utc>>> {
    let mut fires = Vec::new();
    let mut cursor = None;
    loop {
        let step = step_fires(timing, from, to, cursor, STEP_RUNS, STEP_SCAN);
        fires.extend(step.fires);
        if fires.len() > limit {
            return None;
        }
        if step.ended {
            return Some(fires);
        }
        cursor = Some(step.cursor);
    }
}

/// A backfill's rate limit: runs it may make now, refilled at `rate` per second up to one
/// second's worth.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: i32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(rate.max(1)),
            at: now,
        }
    }

    /// Refills to `now`; the whole runs it allows.
    fn refill(&mut self, rate: i32, now: Instant) -> usize {
        let rate = f64::from(rate.max(1));
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.at = now;
        // In 0..=1000 (the rate's bound): the cast cannot truncate.
        self.tokens.floor() as usize
    }

    fn spend(&mut self, runs: usize) {
        self.tokens = (self.tokens - runs as f64).max(0.0);
    }
}

/// Runs the duty for `fence`'s term until `stop`; cancels `stop` if the lease is lost.
pub async fn run(store: Store, fence: Fence, stop: CancellationToken) {
    let mut wake = store.listen(BACKFILLS_CHANNEL).await;
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buckets: HashMap<i64, Bucket> = HashMap::new();
    let mut last_pass: Option<Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            Some(_) = wake.recv() => {}
        }
        if let Some(last) = last_pass {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(last + MIN_PASS_GAP) => {}
            }
        }
        // Notifications that came meanwhile are served by this pass.
        while wake.try_recv().is_ok() {}
        last_pass = Some(Instant::now());
        match pass(&store, &fence, &mut buckets).await {
            Ok(true) => {}
            Ok(false) => {
                warn!(
                    term = fence.term,
                    "lease lost while backfilling; leader duties stop"
                );
                stop.cancel();
                return;
            }
            Err(e) => {
                warn!(error = %format!("{e:#}"), "a backfill pass failed; the next pass retries")
            }
        }
    }
}

/// One pass over the running backfills. Returns false when the fence no longer holds.
async fn pass(
    store: &Store,
    fence: &Fence,
    buckets: &mut HashMap<i64, Bucket>,
) -> anyhow::Result<bool> {
    let running = store.running_backfills(PASS_LIMIT).await?;
    buckets.retain(|id, _| running.iter().any(|b| b.id == *id));
    for work in &running {
        let now = Instant::now();
        let bucket = buckets
            .entry(work.id)
            .or_insert_with(|| Bucket::full(work.rate, now));
        match advance(store, fence, work, bucket, now).await {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            // One backfill's trouble does not stop the others'.
            Err(e) => warn!(
                backfill = work.id,
                job = %work.job,
                error = %format!("{e:#}"),
                "a backfill step failed; the next pass retries"
            ),
        }
    }
    Ok(true)
}

/// One step of backfill `work`. Returns false when the fence no longer holds.
async fn advance(
    store: &Store,
    fence: &Fence,
    work: &BackfillWork,
    bucket: &mut Bucket,
    now: Instant,
) -> anyhow::Result<bool> {
    if work.every_fire_handled() {
        if work.active == 0 {
            return match store.end_backfill(fence, work.id, None).await? {
                None => Ok(false),
                Some(ended) => {
                    if ended {
                        info!(backfill = work.id, job = %work.job, "backfill done");
                    }
                    Ok(true)
                }
            };
        }
        return Ok(true);
    }
    let Some(job) = store.job(&work.job).await? else {
        let reason = format!("its job {:?} was deleted", work.job);
        info!(backfill = work.id, job = %work.job, "backfill cancelled: {reason}");
        return Ok(store
            .end_backfill(fence, work.id, Some(&reason))
            .await?
            .is_some());
    };
    let room = usize::try_from(i64::from(work.parallel) - work.active).unwrap_or(0);
    let mut allowed = bucket.refill(work.rate, now).min(room).min(STEP_RUNS);
    if allowed == 0 {
        // No room or no rate: nothing to build the timing (its calendar compiled) for.
        return Ok(true);
    }
    let timing = job.spec.timing()?;
    let mut cursor = work.cursor_at;
    // Fires that have a run already cost neither room nor rate: a pass goes on past them, up
    // to STEPS_PER_PASS steps, so a repeated backfill of a long range ends in a few passes.
    for _ in 0..STEPS_PER_PASS {
        let candidates = step_fires(&timing, work.from, work.to, cursor, STEP_RUNS, STEP_SCAN);
        let runs = store.fire_runs(&work.job, &candidates.fires).await?;
        let step = up_to_free(candidates, allowed, |at| {
            runs.get(at).is_some_and(|run| run.state != "skipped")
        });
        let at = BackfillWork {
            cursor_at: cursor,
            ..work.clone()
        };
        let written = store
            .backfill_step(
                fence,
                &at,
                &job.spec.group,
                &job.spec.params,
                &step.fires,
                step.cursor,
            )
            .await?;
        let Stepped::Wrote { made, existing } = written else {
            return Ok(written != Stepped::LeaseLost);
        };
        let made = usize::try_from(made).unwrap_or(0);
        bucket.spend(made);
        allowed = allowed.saturating_sub(made);
        if made > 0 || existing > 0 {
            info!(
                backfill = work.id,
                job = %work.job,
                made,
                existing,
                cursor = %step.cursor,
                "backfill step"
            );
        }
        if step.ended || step.fires.is_empty() || allowed == 0 {
            break;
        }
        cursor = Some(step.cursor);
    }
    Ok(true)
}

/// Steps one pass makes of one backfill, at most.
const STEPS_PER_PASS: usize = 50;

/// The first of `step`'s fires up to the `allowed`-th that `has_run` says has no run (those
/// with a run are handled without making one): the fires to write, and the cursor after the
/// last of them; all of `step` when it has no more than `allowed` such fires.
fn up_to_free(
    step: StepFires,
    allowed: usize,
    has_run: impl Fn(&DateTime<Utc>) -> bool,
) -> StepFires {
    let mut free = 0;
    for (i, at) in step.fires.iter().enumerate() {
        if !has_run(at) {
            free += 1;
            if free == allowed && i + 1 < step.fires.len() {
                let mut fires = step.fires;
                fires.truncate(i + 1);
                return StepFires {
                    cursor: fires[i],
                    fires,
                    ended: false,
                };
            }
        }
    }
    step
}

#[cfg(test)]
mod tests_db;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::schedule::Schedule;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("instant")
            .to_utc()
    }

    fn hourly() -> Timing {
        Timing::plain(Arc::new(
            Schedule::cron("0 0 * * * *", chrono_tz::UTC).expect("cron"),
        ))
    }

    #[test]
    fn a_range_holds_the_fires_from_its_start_up_to_before_its_end() {
        let (from, to) = (at("2026-11-01T00:00:00Z"), at("2026-11-01T03:00:00Z"));
        let step = step_fires(&hourly(), from, to, None, 100, 100);
        assert_eq!(
            step.fires,
            [
                at("2026-11-01T00:00:00Z"),
                at("2026-11-01T01:00:00Z"),
                at("2026-11-01T02:00:00Z"),
            ]
        );
        assert_eq!((step.cursor, step.ended), (to, true));
    }

    #[test]
    fn steps_go_on_from_the_cursor_and_together_make_every_fire_once() {
        let (from, to) = (at("2026-11-01T00:30:00Z"), at("2026-11-02T00:00:00Z"));
        let mut cursor = None;
        let mut all = Vec::new();
        for _ in 0..100 {
            let step = step_fires(&hourly(), from, to, cursor, 5, 100);
            assert!(step.fires.len() <= 5, "{step:?}");
            all.extend(step.fires);
            if step.ended {
                break;
            }
            cursor = Some(step.cursor);
        }
        let expected: Vec<_> = (1..24)
            .map(|h| at("2026-11-01T00:00:00Z") + TimeDelta::hours(h))
            .collect();
        assert_eq!(all, expected);
    }

    #[test]
    fn a_step_looks_at_no_more_than_its_scan_and_keeps_its_place() {
        let (from, to) = (at("2026-11-01T00:00:00Z"), at("2026-11-03T00:00:00Z"));
        let step = step_fires(&hourly(), from, to, None, 100, 3);
        assert_eq!(step.fires.len(), 3);
        assert_eq!(step.cursor, at("2026-11-01T02:00:00Z"));
        assert!(!step.ended);
    }

    #[test]
    fn a_range_with_more_fires_than_the_limit_has_none_listed() {
        let (from, to) = (at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:00Z"));
        assert_eq!(fires_in(&hourly(), from, to, 100), None);
        let fires = fires_in(&hourly(), from, to, 365 * 24).expect("within the limit");
        assert_eq!(fires.len(), 365 * 24);
        assert_eq!(fires[0], from);
        assert_eq!(fires[fires.len() - 1], at("2026-12-31T23:00:00Z"));
    }

    /// A job of a 10-minute cron in Berlin, with `jitter` and a nightly calendar when asked.
    fn shaped(jitter: bool, calendar: Option<&str>) -> Timing {
        let mut spec = serde_json::json!({
            "name": "shaped", "group": "g", "schedule": "0 */10 * * * *",
            "timezone": "Europe/Berlin",
        });
        if jitter {
            spec["jitter"] = "4m".into();
        }
        if let Some(on_excluded) = calendar {
            spec["calendar"] = serde_json::json!({"name": "night", "times": ["22:00-06:00"]});
            spec["calendar_mode"] = "except".into();
            spec["on_excluded"] = on_excluded.into();
        }
        let spec: crate::job::JobSpec = serde_json::from_value(spec).expect("a valid job");
        spec.timing().expect("a valid timing")
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 128, ..proptest::prelude::ProptestConfig::default()
        })]

        /// However small its steps, a backfill makes the fires of its range that run, each
        /// once and in order, as the job's timing lists them (jitter and calendar included;
        /// across the Berlin clock changes of 2026).
        #[test]
        fn steps_of_any_size_make_the_fires_the_timing_lists(
            start in 0i64..(365 * 24 * 6),
            span in 1i64..(3 * 24 * 6),
            max in 1usize..40,
            scan in 1usize..60,
            jitter in proptest::bool::ANY,
            calendar in proptest::option::of(proptest::sample::select(vec!["skip", "next_allowed"])),
        ) {
            let timing = shaped(jitter, calendar);
            let from = at("2026-01-01T00:00:00Z") + TimeDelta::minutes(10 * start) + TimeDelta::seconds(7);
            let to = from + TimeDelta::minutes(10 * span);
            let mut want = Vec::new();
            let mut after = from - TimeDelta::nanoseconds(1);
            while let Some(next) = timing.next_after(after).filter(|n| *n < to) {
                if !timing.excluded(next) {
                    want.push(next);
                }
                after = next;
            }
            let mut got = Vec::new();
            let mut cursor = None;
            for _ in 0..100_000 {
                let step = step_fires(&timing, from, to, cursor, max, scan);
                proptest::prop_assert!(step.fires.len() <= max);
                got.extend(step.fires);
                if step.ended {
                    break;
                }
                cursor = Some(step.cursor);
            }
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert_eq!(fires_in(&timing, from, to, usize::MAX), Some(want));
        }
    }

    #[test]
    fn a_step_takes_fires_up_to_the_allowed_one_without_a_run() {
        let (from, to) = (at("2026-11-01T00:00:00Z"), at("2026-11-01T06:00:00Z"));
        let all = step_fires(&hourly(), from, to, None, 100, 100);
        let taken = [at("2026-11-01T00:00:00Z"), at("2026-11-01T02:00:00Z")];
        let has_run = |at: &DateTime<Utc>| taken.contains(at);
        // Two allowed: hours 1 and 3 are the free ones, hours 0 and 2 go along.
        let step = up_to_free(all.clone(), 2, has_run);
        assert_eq!(step.fires.len(), 4, "{step:?}");
        assert_eq!(
            (step.cursor, step.ended),
            (at("2026-11-01T03:00:00Z"), false)
        );
        // More allowed than there are free fires: the whole step, ended.
        assert_eq!(up_to_free(all.clone(), 10, has_run), all);
        // Exactly as many as the free ones: the whole step too, so it ends.
        let step = up_to_free(all.clone(), 4, has_run);
        assert_eq!((step.fires.len(), step.ended), (6, true));
    }

    #[test]
    fn the_rate_refills_over_time_up_to_one_seconds_worth() {
        let start = Instant::now();
        let mut bucket = Bucket::full(10, start);
        assert_eq!(bucket.refill(10, start), 10);
        bucket.spend(10);
        assert_eq!(bucket.refill(10, start), 0);
        assert_eq!(bucket.refill(10, start + Duration::from_millis(500)), 5);
        assert_eq!(bucket.refill(10, start + Duration::from_secs(60)), 10);
    }
}
