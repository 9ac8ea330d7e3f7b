//! The delivery path's time arithmetic, checked: an instant or a deadline out of range is
//! `None` ("never"), so no input can panic a delivery.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

/// `now + delay`, or `None` when that is not a representable instant.
pub(super) fn due_after(now: DateTime<Utc>, delay: Duration) -> Option<DateTime<Utc>> {
    now.checked_add_signed(TimeDelta::from_std(delay).ok()?)
}

/// The monotonic instant `after` from now, or `None` (never) when that overflows the clock.
pub(super) fn deadline_after(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}

/// Sleeps until `deadline`; forever when there is none.
pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until the wall clock reaches `at` (never returns before it: tokio's timer rounds up).
pub(super) async fn hold_until(at: DateTime<Utc>) {
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_instant_past_chronos_range_is_none_not_a_panic() {
        let now: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(
            due_after(now, week),
            Some("2026-12-08T00:00:00Z".parse().unwrap())
        );
        // `retry = { initial = "300000years" }`: once `DateTime + TimeDelta overflowed`.
        let years = Duration::from_secs(300_000 * 365 * 86_400);
        assert_eq!(due_after(now, years), None);
        assert_eq!(due_after(now, Duration::MAX), None);
        assert_eq!(deadline_after(Duration::MAX), None);
    }
}
