//! Burst pacing: how far ahead of an instant its runs are written (the planner's lookahead) and
//! its triggers published (the dispatcher's lead), sized from how many are due at that instant
//! and the publish rate the dispatcher measures.
//!
//! A trigger published ahead is claimed by its worker on arrival and held until the instant, so
//! a whole burst must cross the broker and be claimed before it. One trigger due alone needs a
//! few milliseconds; 10,000 due together need a second or two. A fixed lead either leaves the
//! large bursts late or holds every small one needlessly long. Here the lead of an instant is
//! `lead + allowance(n)` for its `n` triggers, where the allowance is twice the time `n`
//! triggers took to publish and confirm lately ([`Pace`]), capped so the lead stays at most
//! [`MAX_LEAD`], under the worker's hold limit for triggers
//! ([`chime_protocol::timing::TRIGGER_HOLD_MAX`], 4 s; the relation is checked where both are
//! defined, at compile time). The planner writes an instant's runs
//! `lookahead + allowance(n) × 5/4` ahead, so the insert of a large burst is done before its
//! first trigger goes out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The longest lead of any instant (3 s), a second under the worker's hold limit for triggers:
/// defined with that limit in the protocol crate.
pub use chime_protocol::timing::MAX_LEAD;

/// Publish rate assumed until the first burst is measured, triggers per second: on the low side
/// of what a 2-core machine reaches, so the first large burst gets more lead, not less.
const INITIAL_RATE: f64 = 4_000.0;
/// Measured rates are kept within these bounds (a burst measured during a stall does not make
/// every later lead the maximum; one measured on an idle broker does not make it zero).
const RATE_BOUNDS: (f64, f64) = (500.0, 100_000.0);
/// Bursts smaller than this are not measured: their time is latency, not rate.
const MIN_SAMPLE: usize = 100;
/// Weight of a new measurement in the moving average.
const SMOOTHING: f64 = 0.3;
/// The allowance is this many times the measured publish time: the workers' claims follow the
/// publishes, and the machine may be busier at the next burst.
const SLACK: f64 = 2.0;

/// The measured publish rate of this leadership's dispatcher (confirmed triggers per second
/// within a burst), shared with its planner.
#[derive(Debug)]
pub struct Pace {
    rate_bits: AtomicU64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            rate_bits: AtomicU64::new(INITIAL_RATE.to_bits()),
        }
    }
}

impl Pace {
    /// Triggers per second, as last measured.
    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    /// Records that a burst of `triggers` took `took` from its release to its last confirm.
    pub fn observe(&self, triggers: usize, took: Duration) {
        if triggers < MIN_SAMPLE || took.is_zero() {
            return;
        }
        let sample = (triggers as f64 / took.as_secs_f64()).clamp(RATE_BOUNDS.0, RATE_BOUNDS.1);
        let rate = self.rate() * (1.0 - SMOOTHING) + sample * SMOOTHING;
        self.rate_bits.store(rate.to_bits(), Ordering::Relaxed);
    }

    /// The extra time ahead that `n` triggers due at one instant need: twice (`SLACK`) their
    /// publish time at the measured rate, at most [`MAX_LEAD`].
    pub fn allowance(&self, n: usize) -> Duration {
        let seconds = SLACK * n as f64 / self.rate();
        Duration::try_from_secs_f64(seconds)
            .unwrap_or(MAX_LEAD)
            .min(MAX_LEAD)
    }

    /// The lead of an instant with `n` triggers: `base` plus their allowance, at most
    /// [`MAX_LEAD`].
    pub fn lead(&self, base: Duration, n: usize) -> Duration {
        base.saturating_add(self.allowance(n)).min(MAX_LEAD)
    }

    /// How far ahead the planner writes an instant with `n` fires: `base` (the configured
    /// lookahead) plus 5/4 of their allowance, so the insert finishes before the lead begins.
    pub fn lookahead(&self, base: Duration, n: usize) -> Duration {
        let allowance = self.allowance(n);
        base.saturating_add(allowance + allowance / 4)
    }

    /// The longest [`Pace::lookahead`] for this `base`, whatever the burst.
    pub fn max_lookahead(base: Duration) -> Duration {
        base.saturating_add(MAX_LEAD + MAX_LEAD / 4)
    }
}

/// How many entries are due at each instant: the planner's jobs by next fire, the dispatcher's
/// held triggers by scheduled instant.
#[derive(Debug, Default)]
pub struct Instants {
    counts: BTreeMap<DateTime<Utc>, usize>,
}

impl Instants {
    /// One more entry due at `at`; returns how many are due there now.
    pub fn add(&mut self, at: DateTime<Utc>) -> usize {
        let n = self.counts.entry(at).or_default();
        *n += 1;
        *n
    }

    /// One entry due at `at` is gone.
    pub fn remove(&mut self, at: DateTime<Utc>) {
        if let Some(n) = self.counts.get_mut(&at) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&at);
            }
        }
    }

    /// Entries in all.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.counts.values().sum()
    }

    /// The earliest moment some instant's entries are due to go, each instant `ahead(n)` before
    /// itself for its `n` entries, where `ahead` never exceeds `max_ahead`.
    pub fn next_due(
        &self,
        ahead: impl Fn(usize) -> Duration,
        max_ahead: Duration,
    ) -> Option<DateTime<Utc>> {
        let mut best: Option<DateTime<Utc>> = None;
        for (&at, &n) in &self.counts {
            // Later instants go `max_ahead` before themselves at the earliest.
            if best.is_some_and(|b| minus(at, max_ahead) > b) {
                break;
            }
            let due = minus(at, ahead(n));
            best = Some(best.map_or(due, |b| b.min(due)));
        }
        best
    }

    /// The latest instant whose entries are due to go by `now` (see [`Instants::next_due`]);
    /// every entry at or before it goes with them, in instant order.
    pub fn horizon(
        &self,
        now: DateTime<Utc>,
        ahead: impl Fn(usize) -> Duration,
        max_ahead: Duration,
    ) -> Option<DateTime<Utc>> {
        let limit = plus(now, max_ahead);
        let mut horizon = None;
        for (&at, &n) in self.counts.range(..=limit) {
            if minus(at, ahead(n)) <= now {
                horizon = Some(at);
            }
        }
        horizon
    }
}

/// `at + d`, saturating at the latest instant chrono represents: a duration from settings or a
/// job definition never panics a leader duty, whatever its size.
pub fn plus(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at - d`, saturating at the earliest instant chrono represents.
pub fn minus(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(d)
        .ok()
        .and_then(|d| at.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn the_lead_grows_with_the_burst_up_to_the_cap() {
        let pace = Pace::default();
        let base = MS(200);
        assert_eq!(pace.lead(base, 1), MS(200) + Duration::from_micros(500));
        // 1,000 triggers at 4,000/s take 250 ms; twice that is the allowance.
        assert_eq!(pace.lead(base, 1_000), MS(700));
        assert_eq!(pace.lead(base, 10_000), MAX_LEAD);
        assert_eq!(pace.lookahead(MS(500), 1_000), MS(500 + 500 + 125));
        assert!(pace.lookahead(MS(500), 1_000_000) <= Pace::max_lookahead(MS(500)));
    }

    #[test]
    fn measured_bursts_move_the_rate_and_small_ones_do_not() {
        let pace = Pace::default();
        pace.observe(50, MS(1));
        assert_eq!(pace.rate(), INITIAL_RATE);
        // 1,000 in 100 ms: 10,000/s, weighted in.
        pace.observe(1_000, MS(100));
        assert!((pace.rate() - (4_000.0 * 0.7 + 10_000.0 * 0.3)).abs() < 1e-6);
        // A stall does not drive the rate under its floor.
        for _ in 0..50 {
            pace.observe(1_000, Duration::from_secs(3_600));
        }
        assert!(pace.rate() >= RATE_BOUNDS.0 - 1e-6);
        assert_eq!(pace.allowance(usize::MAX), MAX_LEAD);
    }

    #[test]
    fn a_large_burst_goes_before_a_small_earlier_instant() {
        let mut instants = Instants::default();
        instants.add(t(0));
        for _ in 0..1_000 {
            instants.add(t(10));
        }
        // One entry goes 200 ms ahead; a thousand go 200 ms + 1 ms each.
        let ahead = |n: usize| MS(200) + MS(n as u64);
        assert_eq!(instants.next_due(ahead, MS(5_000)), Some(t(10 - 1_200)));
        assert_eq!(instants.horizon(t(-1_300), ahead, MS(5_000)), None);
        assert_eq!(instants.horizon(t(-1_190), ahead, MS(5_000)), Some(t(10)));
        assert_eq!(instants.horizon(t(-200), ahead, MS(5_000)), Some(t(10)));
        instants.remove(t(0));
        instants.remove(t(0));
        assert_eq!(instants.len(), 1_000);
        assert_eq!(Instants::default().next_due(ahead, MS(5_000)), None);
    }

    proptest! {
        /// Every instant with entries is due no later than `ahead(n)` before itself, and the
        /// horizon at that moment reaches it.
        #[test]
        fn next_due_and_horizon_agree(
            entries in proptest::collection::vec((0i64..5_000, 1usize..50), 1..40),
            unit in 1u64..100,
        ) {
            let mut instants = Instants::default();
            for (at, n) in &entries {
                for _ in 0..*n {
                    instants.add(t(*at));
                }
            }
            let max_ahead = MS(unit * 60);
            let ahead = |n: usize| MS(unit * n.min(60) as u64);
            let due = instants.next_due(ahead, max_ahead).unwrap();
            for (&at, &n) in &instants.counts {
                prop_assert!(due <= minus(at, ahead(n)));
            }
            let horizon = instants.horizon(due, ahead, max_ahead).unwrap();
            prop_assert!(instants.counts.iter().any(|(&at, &n)| at == horizon && minus(at, ahead(n)) <= due));
            let earlier = due - chrono::TimeDelta::milliseconds(1);
            prop_assert_eq!(instants.horizon(earlier, ahead, max_ahead), None);
        }
    }
}
