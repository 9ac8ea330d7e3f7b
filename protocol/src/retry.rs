//! Retry maths, pure: the delay before the next attempt, the retry-or-dead decision, and how a
//! delay is served by the broker's delay tiers.
//!
//! No IO and no clock: callers pass the failed attempt number, the job's [`RetryPolicy`], the
//! handler's requested delay, a uniform random number for the jitter, and remaining durations.
//! The formula (also in `docs/failures.md`): the delay before attempt `n + 1` after attempt `n`
//! failed is `min(max, initial × multiplier^(n−1))`; with jitter it is multiplied by a uniform
//! factor in [[`JITTER_MIN`], [`JITTER_MAX`]] and capped by `max` again. A delay the handler asked
//! for (`JobError::retry_after`) replaces the computed one, capped by `max`.

use std::time::Duration;

use crate::limits::{MAX_ATTEMPTS, MAX_MULTIPLIER, MAX_RETRY_DELAY};
use crate::timing::{HOLD_MAX, TRIGGER_HOLD_MAX};
use crate::topology::{RETRY_TIERS, RetryTier};
use crate::wire::RetryPolicy;

/// Smallest jitter factor.
pub const JITTER_MIN: f64 = 0.8;
/// Largest jitter factor.
pub const JITTER_MAX: f64 = 1.2;

/// Attempts in all of a job whose retry policy does not say (`retry.max_attempts`), the first
/// included: the job file's default, and what the rescuer assumes of a stored definition it
/// cannot read.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Delay before the second attempt when the policy does not say (`retry.initial`).
pub const DEFAULT_INITIAL: Duration = Duration::from_secs(10);
/// Factor applied to the delay after each further failure when the policy does not say
/// (`retry.multiplier`).
pub const DEFAULT_MULTIPLIER: f64 = 2.0;
/// Upper bound of any delay when the policy does not say (`retry.max`).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(600);
/// Whether delays are spread by a random factor when the policy does not say (`retry.jitter`).
pub const DEFAULT_JITTER: bool = true;

// The defaults are a policy the limits accept.
const _: () = assert!(DEFAULT_MAX_ATTEMPTS >= 1 && DEFAULT_MAX_ATTEMPTS <= MAX_ATTEMPTS);
const _: () = assert!(DEFAULT_INITIAL.as_millis() <= DEFAULT_MAX_DELAY.as_millis());
const _: () = assert!(DEFAULT_MAX_DELAY.as_millis() <= MAX_RETRY_DELAY.as_millis());
const _: () = assert!(DEFAULT_MULTIPLIER >= 1.0 && DEFAULT_MULTIPLIER <= MAX_MULTIPLIER);
// `plan_wait` sends any wait of at least `HOLD_MAX` through a tier, so the shortest tier must
// fit such a wait (the last in-memory hold then stays under `HOLD_MAX`).
const _: () = assert!(RETRY_TIERS[0].ttl.as_millis() <= HOLD_MAX.as_millis());

/// What becomes of a run whose attempt failed retryably.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Attempts remain: run attempt `next_attempt` after `delay`.
    Retry {
        /// The attempt number of the retry.
        next_attempt: u32,
        /// How long to wait before it.
        delay: Duration,
    },
    /// No attempts remain: the run is dead.
    Exhausted {
        /// The policy's `max_attempts` (at least 1).
        max_attempts: u32,
    },
}

/// Attempts in all under `policy`; no policy means one attempt (no retry). Never below 1.
pub fn max_attempts(policy: Option<&RetryPolicy>) -> u32 {
    policy.map_or(1, |p| p.max_attempts.max(1))
}

/// The delay before attempt `failed_attempt + 1` without jitter: `min(max, initial ×
/// multiplier^(failed_attempt − 1))`. A multiplier below 1 (or not a number) counts as 1, so
/// delays never shrink; an `initial` above `max` is capped.
pub fn backoff(policy: &RetryPolicy, failed_attempt: u32) -> Duration {
    let multiplier = if policy.multiplier >= 1.0 {
        policy.multiplier
    } else {
        1.0
    };
    let exponent = i32::try_from(failed_attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let ms = policy.initial_ms as f64 * multiplier.powi(exponent);
    capped_ms(ms, policy.max_ms)
}

/// The delay before attempt `failed_attempt + 1`: the handler's `requested` delay if any, else
/// [`backoff`] with jitter when the policy asks for it, where `random` (uniform in [0, 1))
/// picks the factor in [[`JITTER_MIN`], [`JITTER_MAX`]]. Always capped by the policy's `max`.
pub fn delay(
    policy: &RetryPolicy,
    failed_attempt: u32,
    requested: Option<Duration>,
    random: f64,
) -> Duration {
    let max = Duration::from_millis(policy.max_ms);
    if let Some(requested) = requested {
        return requested.min(max);
    }
    let base = backoff(policy, failed_attempt);
    if !policy.jitter {
        return base;
    }
    let factor = JITTER_MIN + (JITTER_MAX - JITTER_MIN) * random.clamp(0.0, 1.0);
    capped_ms(base.as_millis() as f64 * factor, policy.max_ms)
}

/// Retry or dead after attempt `failed_attempt` failed retryably (see [`delay`] for the
/// arguments). Attempt numbers past `max_attempts` (a run that lost attempts to crashed workers
/// may get there) are exhausted too.
pub fn decide(
    policy: Option<&RetryPolicy>,
    failed_attempt: u32,
    requested: Option<Duration>,
    random: f64,
) -> Decision {
    let max_attempts = max_attempts(policy);
    match policy {
        Some(policy) if failed_attempt < max_attempts => Decision::Retry {
            next_attempt: failed_attempt + 1,
            delay: delay(policy, failed_attempt, requested, random),
        },
        _ => Decision::Exhausted { max_attempts },
    }
}

fn capped_ms(ms: f64, max_ms: u64) -> Duration {
    if ms.is_nan() || ms <= 0.0 {
        Duration::ZERO
    } else if ms >= max_ms as f64 {
        Duration::from_millis(max_ms)
    } else {
        Duration::from_millis(ms.round() as u64)
    }
}

/// How a worker waits out what remains of a message's delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Due: run it now.
    Now,
    /// Hold the delivery in memory this long, then run it.
    Hold(Duration),
    /// Send it through this delay tier; it comes back at most the tier's TTL (plus the broker's
    /// few milliseconds) later.
    Tier(RetryTier),
}

/// How to wait out `remaining` (negative or zero: due). Under [`HOLD_MAX`] it is held in memory;
/// otherwise it goes to the largest tier not longer than `remaining`, so it comes back early (or
/// a few ms late when the delay equals a tier) and the rest is waited out the same way: a delay
/// under an hour takes at most 14 hops (most take one to four), longer ones one more per
/// hour.
pub fn plan_wait(remaining: Duration) -> Wait {
    plan_wait_within(remaining, HOLD_MAX)
}

/// [`plan_wait`] for a trigger published ahead of its own instant: held in memory when due
/// within [`TRIGGER_HOLD_MAX`].
pub fn plan_trigger_wait(remaining: Duration) -> Wait {
    plan_wait_within(remaining, TRIGGER_HOLD_MAX)
}

fn plan_wait_within(remaining: Duration, hold_max: Duration) -> Wait {
    if remaining.is_zero() {
        return Wait::Now;
    }
    if remaining < hold_max {
        return Wait::Hold(remaining);
    }
    match RETRY_TIERS.iter().rev().find(|t| t.ttl <= remaining) {
        Some(tier) => Wait::Tier(*tier),
        None => Wait::Hold(remaining),
    }
}

/// Shortest pause of a run waiting for a worker with its job's handler.
const UNHANDLED_PAUSE_MIN: Duration = Duration::from_secs(5);
/// Longest pause of a run waiting for a worker with its job's handler.
const UNHANDLED_PAUSE_MAX: Duration = Duration::from_secs(30);

/// The delay tier a run waits in, between two looks for a worker with its job's handler, when
/// it has waited `waited` and may wait `left` more: half of what it waited, between 5 s and
/// 30 s, so a run that just started waiting is picked up soon after a new worker starts and
/// a long wait costs a publish every 30 s; never (much) past what is left, so the run is
/// parked close to its deadline.
pub fn unhandled_pause(waited: Duration, left: Duration) -> RetryTier {
    let want = (waited / 2)
        .clamp(UNHANDLED_PAUSE_MIN, UNHANDLED_PAUSE_MAX)
        .min(left);
    RETRY_TIERS
        .iter()
        .rev()
        .find(|t| t.ttl <= want)
        .copied()
        .unwrap_or(RETRY_TIERS[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_unhandled_run_pauses_half_its_wait_between_5_and_30_s_and_not_past_its_deadline() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        for (waited, left, tier) in [
            (s(0), s(300), "5s"),
            (s(15), s(285), "5s"),
            (s(20), s(280), "10s"),
            (s(100), s(200), "30s"),
            (s(3_600), s(3_600), "30s"),
            (s(290), s(10), "10s"),
            (s(0), s(2), "2s"),
            (s(2), ms(300), "250ms"),
            (s(2), Duration::ZERO, "250ms"),
        ] {
            assert_eq!(
                unhandled_pause(waited, left).name,
                tier,
                "waited {waited:?}, left {left:?}"
            );
        }
    }

    fn policy(max_attempts: u32, initial_ms: u64, multiplier: f64, max_ms: u64) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial_ms,
            multiplier,
            max_ms,
            jitter: false,
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn backoff_grows_from_initial_by_the_multiplier_up_to_max() {
        let p = policy(10, 10_000, 2.0, 600_000);
        let table = [
            (1, 10_000),
            (2, 20_000),
            (3, 40_000),
            (4, 80_000),
            (6, 320_000),
            (7, 600_000),
            (50, 600_000),
            (u32::MAX, 600_000),
        ];
        for (failed, want) in table {
            assert_eq!(backoff(&p, failed), MS(want), "after attempt {failed}");
        }
        // Attempt 0 does not exist; treat it as the first.
        assert_eq!(backoff(&p, 0), MS(10_000));
    }

    #[test]
    fn odd_policies_stay_sane() {
        let table = [
            // (initial, multiplier, max, failed attempt, want)
            (1_000, 1.0, 60_000, 5, 1_000), // constant backoff
            (1_000, 0.5, 60_000, 5, 1_000), // a shrinking multiplier counts as 1
            (1_000, f64::NAN, 60_000, 3, 1_000),
            (1_000, 1.5, 60_000, 3, 2_250), // fractional multipliers round to ms
            (90_000, 2.0, 60_000, 1, 60_000), // initial above max is capped
            (0, 2.0, 60_000, 4, 0),
            (1_000, f64::INFINITY, 60_000, 2, 60_000),
        ];
        for (initial, multiplier, max, failed, want) in table {
            let p = policy(10, initial, multiplier, max);
            assert_eq!(backoff(&p, failed), MS(want), "{p:?} after {failed}");
        }
    }

    #[test]
    fn jitter_spreads_by_twenty_percent_and_is_capped() {
        let mut p = policy(5, 10_000, 2.0, 30_000);
        p.jitter = true;
        assert_eq!(delay(&p, 1, None, 0.0), MS(8_000));
        assert_eq!(delay(&p, 1, None, 0.5), MS(10_000));
        assert_eq!(delay(&p, 1, None, 1.0), MS(12_000));
        // 20 s × 1.2 = 24 s; 40 s is capped to 30 s before and after the jitter.
        assert_eq!(delay(&p, 2, None, 1.0), MS(24_000));
        assert_eq!(delay(&p, 3, None, 1.0), MS(30_000));
        assert_eq!(delay(&p, 3, None, 0.0), MS(24_000));
    }

    #[test]
    fn a_requested_delay_replaces_the_computed_one_capped_by_max() {
        let mut p = policy(5, 10_000, 2.0, 60_000);
        p.jitter = true;
        assert_eq!(delay(&p, 1, Some(MS(1_500)), 0.9), MS(1_500));
        assert_eq!(delay(&p, 1, Some(MS(3_600_000)), 0.9), MS(60_000));
        assert_eq!(delay(&p, 1, Some(Duration::ZERO), 0.9), Duration::ZERO);
    }

    #[test]
    fn decide_retries_while_attempts_remain() {
        let p = policy(3, 1_000, 2.0, 60_000);
        let table = [
            (
                1,
                Decision::Retry {
                    next_attempt: 2,
                    delay: MS(1_000),
                },
            ),
            (
                2,
                Decision::Retry {
                    next_attempt: 3,
                    delay: MS(2_000),
                },
            ),
            (3, Decision::Exhausted { max_attempts: 3 }),
            (7, Decision::Exhausted { max_attempts: 3 }),
        ];
        for (failed, want) in table {
            assert_eq!(
                decide(Some(&p), failed, None, 0.5),
                want,
                "attempt {failed}"
            );
        }
        // No policy, or max_attempts 1 (or a nonsensical 0): one attempt, no retry.
        assert_eq!(
            decide(None, 1, None, 0.5),
            Decision::Exhausted { max_attempts: 1 }
        );
        for max in [0, 1] {
            assert_eq!(
                decide(Some(&policy(max, 1_000, 2.0, 60_000)), 1, None, 0.5),
                Decision::Exhausted { max_attempts: 1 }
            );
        }
    }

    #[test]
    fn waits_go_through_the_largest_tier_that_fits_and_end_in_a_short_hold() {
        let tier = |name: &str| Wait::Tier(*RETRY_TIERS.iter().find(|t| t.name == name).unwrap());
        let table = [
            (0, Wait::Now),
            (1, Wait::Hold(MS(1))),
            (249, Wait::Hold(MS(249))),
            (250, tier("250ms")),
            (499, tier("250ms")),
            (800, tier("500ms")),
            (1_000, tier("1s")),
            (1_999, tier("1s")),
            (2_000, tier("2s")),
            (12_345, tier("10s")),
            (59_999, tier("30s")),
            (86_400_000, tier("1h")),
        ];
        for (ms, want) in table {
            assert_eq!(plan_wait(MS(ms)), want, "{ms} ms");
        }
    }

    #[test]
    fn a_trigger_published_ahead_is_held_up_to_the_trigger_limit() {
        assert_eq!(plan_trigger_wait(MS(0)), Wait::Now);
        assert_eq!(plan_trigger_wait(MS(249)), Wait::Hold(MS(249)));
        assert_eq!(plan_trigger_wait(MS(2_500)), Wait::Hold(MS(2_500)));
        assert_eq!(plan_trigger_wait(MS(3_999)), Wait::Hold(MS(3_999)));
        let four = *RETRY_TIERS.iter().find(|t| t.name == "2s").unwrap();
        assert_eq!(plan_trigger_wait(MS(4_000)), Wait::Tier(four));
        // A retry's wait is not a trigger's: it goes through the tiers as before.
        assert_eq!(plan_wait(MS(2_500)), Wait::Tier(four));
    }

    /// Follows a delay through the tiers as the worker does, with zero broker overhead.
    fn hops(total: Duration) -> (usize, Duration) {
        let (mut remaining, mut hops) = (total, 0);
        loop {
            match plan_wait(remaining) {
                Wait::Now => return (hops, Duration::ZERO),
                Wait::Hold(d) => return (hops, d),
                Wait::Tier(t) => {
                    remaining -= t.ttl;
                    hops += 1;
                }
            }
        }
    }

    proptest! {
        #[test]
        fn without_jitter_delays_never_shrink(
            initial in 1u64..100_000,
            multiplier in 1.0f64..10.0,
            max in 1u64..10_000_000,
            attempt in 1u32..60,
        ) {
            let p = policy(100, initial, multiplier, max);
            prop_assert!(backoff(&p, attempt) <= backoff(&p, attempt + 1));
        }

        #[test]
        fn delays_never_exceed_max(
            initial in 0u64..10_000_000,
            multiplier in 0.0f64..100.0,
            max in 0u64..10_000_000,
            attempt in 0u32..1_000,
            jitter: bool,
            requested in proptest::option::of(0u64..100_000_000),
            random in 0.0f64..1.0,
        ) {
            let mut p = policy(100, initial, multiplier, max);
            p.jitter = jitter;
            let d = delay(&p, attempt, requested.map(MS), random);
            prop_assert!(d <= MS(max), "{d:?} > {max} ms");
        }

        #[test]
        fn jitter_stays_within_its_bounds(
            initial in 1u64..100_000,
            multiplier in 1.0f64..4.0,
            attempt in 1u32..10,
            random in 0.0f64..1.0,
        ) {
            let mut p = policy(100, initial, multiplier, u64::MAX / 4);
            let base = backoff(&p, attempt).as_millis() as f64;
            p.jitter = true;
            let d = delay(&p, attempt, None, random).as_millis() as f64;
            // ±0.5 ms: delays are whole milliseconds.
            prop_assert!(d >= base * JITTER_MIN - 0.5 && d <= base * JITTER_MAX + 0.5,
                "{d} outside [{}, {}]", base * JITTER_MIN, base * JITTER_MAX);
        }

        #[test]
        fn any_delay_takes_a_handful_of_hops_and_a_short_hold(ms in 0u64..100_000_000) {
            let (hops, hold) = hops(MS(ms));
            prop_assert!(hold < HOLD_MAX);
            // 1 h tiers first, then at most 14 hops through the shorter ones.
            let hours = (ms / 3_600_000) as usize;
            prop_assert!(hops <= hours + 14, "{hops} hops for {ms} ms");
        }
    }
}
