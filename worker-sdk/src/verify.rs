//! The checks a decoded trigger must pass before a worker acts on it, pure: every value against
//! its bound in `chime_protocol::limits`, the group against the queue it came from, and the
//! broker's headers against what the broker can really have written.
//!
//! Anyone who can publish to the work queue can forge a trigger, so a value is trusted only as
//! far as these bounds (and then the run row, in the claim) vouch for it. A trigger that fails a
//! check is parked with the reason and never run; the run it names is left as it is, because a
//! forged message must not be able to end a real run (docs/protocol.md, "What a worker checks").

use chime_protocol::headers::NotAnInteger;
use chime_protocol::limits::{
    MAX_ATTEMPTS, MAX_MULTIPLIER, MAX_NAME_BYTES, MAX_RETRY_DELAY, MAX_TIMEOUT, NOT_BEFORE_SLACK,
    cap_bytes,
};
use chime_protocol::wire::{HEADER_NOT_BEFORE, Trigger};
use chrono::{DateTime, TimeDelta, Utc};

/// Prefix of every reason a check gives, so operators (and the hostile-input corpus) can tell a
/// refused trigger from a run that failed.
pub(crate) const IMPLAUSIBLE: &str = "implausible trigger: ";

/// How much of a forged name a reason quotes.
const QUOTED_NAME_BYTES: usize = 80;

/// What the worker knows about a delivery besides its body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    /// The group whose work queue the delivery came from.
    pub group: &'a str,
    /// `x-chime-not-before` in Unix ms, if present as an integer; an error if present but not
    /// an integer.
    pub not_before_ms: Result<Option<i64>, NotAnInteger>,
    /// `x-delivery-count` as the header says it, if present as an integer; an error if present
    /// but not an integer.
    pub delivery_count: Result<Option<i64>, NotAnInteger>,
    /// The broker's `redelivered` flag.
    pub redelivered: bool,
    /// The work queue's `x-delivery-limit` (0: none).
    pub delivery_limit: u32,
    /// The worker's clock.
    pub now: DateTime<Utc>,
}

/// Quotes a name from a message for a reason, cut to a readable length.
pub(crate) fn quote(name: &str) -> String {
    format!("`{}`", cap_bytes(name, QUOTED_NAME_BYTES))
}

/// Checks `trigger` and its delivery; `Err` is the parked reason (starting with
/// [`IMPLAUSIBLE`]).
pub(crate) fn check(trigger: &Trigger, seen: &Seen<'_>) -> Result<(), String> {
    detail(trigger, seen).map_err(|detail| format!("{IMPLAUSIBLE}{detail}"))
}

fn detail(trigger: &Trigger, seen: &Seen<'_>) -> Result<(), String> {
    let bound = |what: &str, value: &str, limit: &str, name: &str| {
        format!("{what} is {value}, over the limit of {limit} (limits::{name})")
    };
    if trigger.job.len() > MAX_NAME_BYTES {
        return Err(bound(
            &format!("job name {}", quote(&trigger.job)),
            &format!("{} bytes", trigger.job.len()),
            &format!("{MAX_NAME_BYTES} bytes"),
            "MAX_NAME_BYTES",
        ));
    }
    if trigger.group != seen.group {
        return Err(format!(
            "it names group {} but came from the work queue of group {}",
            quote(&trigger.group),
            quote(seen.group)
        ));
    }
    if trigger.attempt > MAX_ATTEMPTS {
        return Err(bound(
            "attempt",
            &trigger.attempt.to_string(),
            &MAX_ATTEMPTS.to_string(),
            "MAX_ATTEMPTS",
        ));
    }
    let days = |d: std::time::Duration| format!("{d:?} ({} days)", d.as_secs() / 86_400);
    if let Some(ms) = trigger.timeout_ms
        && u128::from(ms) > MAX_TIMEOUT.as_millis()
    {
        return Err(bound(
            "timeout_ms",
            &format!("{ms} ms"),
            &days(MAX_TIMEOUT),
            "MAX_TIMEOUT",
        ));
    }
    if let Some(policy) = &trigger.retry {
        if policy.max_attempts > MAX_ATTEMPTS {
            return Err(bound(
                "retry.max_attempts",
                &policy.max_attempts.to_string(),
                &MAX_ATTEMPTS.to_string(),
                "MAX_ATTEMPTS",
            ));
        }
        for (field, ms) in [
            ("retry.initial_ms", policy.initial_ms),
            ("retry.max_ms", policy.max_ms),
        ] {
            if u128::from(ms) > MAX_RETRY_DELAY.as_millis() {
                return Err(bound(
                    field,
                    &format!("{ms} ms"),
                    &days(MAX_RETRY_DELAY),
                    "MAX_RETRY_DELAY",
                ));
            }
        }
        if !policy.multiplier.is_finite() || policy.multiplier > MAX_MULTIPLIER {
            return Err(bound(
                "retry.multiplier",
                &policy.multiplier.to_string(),
                &MAX_MULTIPLIER.to_string(),
                "MAX_MULTIPLIER",
            ));
        }
    }
    if let Some(shard) = trigger.task.as_ref().and_then(|t| t.shard.as_ref())
        && shard.index >= shard.total
    {
        return Err(format!(
            "task shard index {} is not below the shard total {}",
            shard.index, shard.total
        ));
    }
    match seen.not_before_ms {
        Err(NotAnInteger) => {
            return Err(format!(
                "header {HEADER_NOT_BEFORE} is not an integer (Unix milliseconds)"
            ));
        }
        Ok(Some(ms)) => {
            let horizon = TimeDelta::from_std(MAX_RETRY_DELAY + NOT_BEFORE_SLACK)
                .expect("a week and an hour fit a TimeDelta");
            let latest = seen.now.checked_add_signed(horizon);
            let plausible = latest.is_some_and(|latest| ms <= latest.timestamp_millis())
                && DateTime::<Utc>::from_timestamp_millis(ms).is_some();
            if !plausible {
                return Err(format!(
                    "header {HEADER_NOT_BEFORE} {ms} ({}) is further ahead than \
                     limits::MAX_RETRY_DELAY + limits::NOT_BEFORE_SLACK ({}) from now ({})",
                    DateTime::<Utc>::from_timestamp_millis(ms)
                        .map_or_else(|| "out of range".to_owned(), |t| t.to_rfc3339()),
                    days(MAX_RETRY_DELAY + NOT_BEFORE_SLACK),
                    seen.now.to_rfc3339()
                ));
            }
        }
        Ok(None) => {}
    }
    match seen.delivery_count {
        Err(NotAnInteger) => return Err("header x-delivery-count is not an integer".to_owned()),
        Ok(Some(count)) if count != 0 && !seen.redelivered => {
            return Err(format!(
                "x-delivery-count {count} on a first delivery (the broker's redelivered flag is \
                 not set): only the broker counts deliveries, so the publisher set it"
            ));
        }
        Ok(Some(count))
            if count < 0 || (seen.delivery_limit > 0 && count > i64::from(seen.delivery_limit)) =>
        {
            return Err(format!(
                "x-delivery-count {count} is outside 0..={} (the work queue's \
                 x-delivery-limit): the broker never delivers such a count",
                seen.delivery_limit
            ));
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chime_protocol::wire::{PROTOCOL_VERSION, RetryPolicy};

    fn trigger() -> Trigger {
        Trigger {
            v: PROTOCOL_VERSION,
            run_id: 7,
            job: "report".into(),
            group: "g".into(),
            attempt: 2,
            scheduled_at: "2026-12-01T00:00:00Z".parse().unwrap(),
            params: serde_json::Value::Null,
            timeout_ms: Some(60_000),
            retry: Some(RetryPolicy {
                max_attempts: 3,
                initial_ms: 1_000,
                multiplier: 2.0,
                max_ms: 60_000,
                jitter: true,
            }),
            task: None,
        }
    }

    fn seen() -> Seen<'static> {
        Seen {
            group: "g",
            not_before_ms: Ok(None),
            delivery_count: Ok(None),
            redelivered: false,
            delivery_limit: 5,
            now: "2026-12-01T00:00:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn a_shard_must_lie_below_its_total() {
        let mut t = trigger();
        t.task = Some(chime_protocol::wire::Task {
            parent_run_id: 6,
            key: "shard/2".into(),
            kind: chime_protocol::wire::TaskKind::Shard,
            shard: Some(chime_protocol::wire::Shard {
                index: 2,
                total: 3,
                param: None,
            }),
            worker: None,
            step: None,
            depth: None,
        });
        assert_eq!(check(&t, &seen()), Ok(()));
        if let Some(shard) = t.task.as_mut().and_then(|t| t.shard.as_mut()) {
            shard.total = 2;
        }
        assert_eq!(
            check(&t, &seen()),
            Err(format!(
                "{IMPLAUSIBLE}task shard index 2 is not below the shard total 2"
            ))
        );
    }

    #[test]
    fn a_plausible_trigger_passes() {
        assert_eq!(check(&trigger(), &seen()), Ok(()));
        let mut s = seen();
        s.redelivered = true;
        s.delivery_count = Ok(Some(5));
        s.not_before_ms = Ok(Some(s.now.timestamp_millis() + 7 * 86_400_000));
        let mut t = trigger();
        t.attempt = MAX_ATTEMPTS;
        t.job = "j".repeat(MAX_NAME_BYTES);
        assert_eq!(check(&t, &s), Ok(()));
    }

    #[test]
    fn each_implausible_value_is_named_with_its_limit() {
        let now_ms = seen().now.timestamp_millis();
        type Case = (fn(&mut Trigger, &mut Seen<'static>), &'static str);
        let table: [Case; 14] = [
            (
                |t, _| t.job = "x".repeat(300_000),
                "is 300000 bytes, over the limit of 63 bytes (limits::MAX_NAME_BYTES)",
            ),
            (
                |t, _| t.group = "other".into(),
                "it names group `other` but came from the work queue of group `g`",
            ),
            (
                |t, _| t.attempt = u32::MAX,
                "attempt is 4294967295, over the limit of 1000 (limits::MAX_ATTEMPTS)",
            ),
            (
                |t, _| t.timeout_ms = Some(u64::MAX),
                "timeout_ms is 18446744073709551615 ms",
            ),
            (
                |t, _| t.retry.as_mut().unwrap().max_attempts = 1_001,
                "retry.max_attempts is 1001",
            ),
            (
                |t, _| t.retry.as_mut().unwrap().initial_ms = 9_467_280_000_000_000,
                "retry.initial_ms is 9467280000000000 ms, over the limit of 604800s (7 days) \
                 (limits::MAX_RETRY_DELAY)",
            ),
            (
                |t, _| t.retry.as_mut().unwrap().max_ms = u64::MAX,
                "retry.max_ms is",
            ),
            (
                |t, _| t.retry.as_mut().unwrap().multiplier = 1e300,
                "retry.multiplier is",
            ),
            (
                |t, _| t.retry.as_mut().unwrap().multiplier = f64::NAN,
                "retry.multiplier is NaN",
            ),
            (
                |_, s| s.not_before_ms = Ok(Some(32_503_680_000_000)),
                "x-chime-not-before 32503680000000 (3000-01-01T00:00:00+00:00) is further ahead",
            ),
            (
                |_, s| s.not_before_ms = Ok(Some(i64::MAX)),
                "(out of range) is further ahead",
            ),
            (
                |_, s| s.not_before_ms = Err(NotAnInteger),
                "header x-chime-not-before is not an integer",
            ),
            (
                |_, s| s.delivery_count = Ok(Some(50)),
                "x-delivery-count 50 on a first delivery",
            ),
            (
                |_, s| {
                    s.redelivered = true;
                    s.delivery_count = Ok(Some(6));
                },
                "x-delivery-count 6 is outside 0..=5",
            ),
        ];
        for (i, (edit, want)) in table.into_iter().enumerate() {
            let (mut t, mut s) = (trigger(), seen());
            edit(&mut t, &mut s);
            let reason = check(&t, &s).expect_err(&format!("case {i} passed"));
            assert!(reason.starts_with(IMPLAUSIBLE), "{reason}");
            assert!(reason.contains(want), "case {i}: {reason}");
            assert!(reason.len() < 1_024, "case {i}: {} bytes", reason.len());
        }
        // A not-before within the horizon passes; one just beyond it does not.
        let horizon = (MAX_RETRY_DELAY + NOT_BEFORE_SLACK).as_millis() as i64;
        let mut s = seen();
        s.not_before_ms = Ok(Some(now_ms + horizon));
        assert_eq!(check(&trigger(), &s), Ok(()));
        s.not_before_ms = Ok(Some(now_ms + horizon + 1));
        assert!(check(&trigger(), &s).is_err());
    }
}
