//! Waiting for a condition with a deadline: the one polling loop of Chime's tests.

use std::fmt;
use std::time::Duration;

/// How long a test waits for a condition unless it has a reason to wait longer.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often a probe is called.
const POLL: Duration = Duration::from_millis(25);

/// What one call of a probe found: the awaited value, or what it saw instead.
///
/// - `Option<T>`: `Some(value)` is done; `None` is "not yet" (and says nothing more).
/// - `Result<T, S>`: `Ok(value)` is done; `Err(seen)` is "not yet, and this is what I saw";
///   the last `seen` goes into the timeout message. [`done_if`] makes one from a value.
pub trait Outcome<T> {
    /// The value, or a description of what was seen instead (if the probe gave one).
    fn outcome(self) -> Result<T, Option<String>>;
}

impl<T> Outcome<T> for Option<T> {
    fn outcome(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, S: fmt::Debug> Outcome<T> for Result<T, S> {
    fn outcome(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(format!("{seen:?}")))
    }
}

/// `Ok(value)` if `done(&value)`, else `Err(value)`: a probe's answer that shows the last value
/// in the timeout message.
pub fn done_if<S>(value: S, done: impl FnOnce(&S) -> bool) -> Result<S, S> {
    if done(&value) { Ok(value) } else { Err(value) }
}

/// A condition that did not hold in time: what was awaited, for how long, and the last value
/// the probe saw.
#[derive(Debug, Clone)]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// How long.
    pub timeout: Duration,
    /// What the probe last saw, if it said.
    pub last_seen: Option<String>,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.timeout, self.what
        )?;
        match &self.last_seen {
            Some(seen) => write!(f, "; last seen: {seen}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for TimedOut {}

/// Calls `probe` every 25 ms until it yields a value ([`Outcome`]), or returns [`TimedOut`]
/// after `timeout`. The probe is always called at least once. It may be an async closure that
/// changes what it captured (`async || { … }`) or a closure returning a future
/// (`|| async { … }`).
pub async fn try_wait_for<T, O: Outcome<T>>(
    timeout: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> O,
) -> Result<T, TimedOut> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last_seen = match probe().await.outcome() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_owned(),
                timeout,
                last_seen,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Calls `probe` every 25 ms until it yields a value ([`Outcome`]); fails the test after
/// `timeout`, naming `what` and the last value the probe saw.
pub async fn wait_for<T, O: Outcome<T>>(
    timeout: Duration,
    what: &str,
    probe: impl AsyncFnMut() -> O,
) -> T {
    match try_wait_for(timeout, what, probe).await {
        Ok(value) => value,
        Err(timed_out) => panic!("{timed_out}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_probe_yields_it() {
        let mut calls = 0;
        let value = wait_for(WAIT, "the third call", || {
            calls += 1;
            std::future::ready(done_if(calls, |n| *n == 3))
        })
        .await;
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn a_timeout_names_what_was_awaited_and_the_last_value_seen() {
        let mut calls = 0;
        let timed_out = try_wait_for(Duration::from_millis(60), "a miracle", || {
            calls += 1;
            std::future::ready(done_if(calls, |_| false))
        })
        .await
        .expect_err("never done");
        assert_eq!(timed_out.last_seen, Some(calls.to_string()));
        let message = timed_out.to_string();
        assert!(
            message.starts_with("timed out after 60ms waiting for a miracle; last seen: "),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_option_probe_times_out_without_a_last_value() {
        let timed_out = try_wait_for(Duration::ZERO, "nothing", || async { None::<()> })
            .await
            .expect_err("never done");
        assert_eq!(
            timed_out.to_string(),
            "timed out after 0ns waiting for nothing"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for the impossible; last seen: \"no\"")]
    async fn wait_for_fails_the_test_with_that_message() {
        wait_for(Duration::ZERO, "the impossible", || async {
            Err::<(), _>("no")
        })
        .await;
    }
}
