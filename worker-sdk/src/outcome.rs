//! What a handler's result means: [`JobError`] and the pure mapping from an execution to the
//! attempt and run states the worker records.
//!
//! Everything here is pure: no IO, no clock (the jitter's random number is an argument). The
//! retry decision itself is `chime_protocol::retry`.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use chime_protocol::retry::{self, Decision};
use chime_protocol::wire::RetryPolicy;
use chime_protocol::{AttemptState, RunState};

/// A handler's verdict when it does not succeed. Returning it decides what happens to the run:
///
/// | constructor | attempt recorded as | run |
/// |---|---|---|
/// | [`JobError::retry`], [`JobError::retry_after`], any error through `?` | `failed` | `retrying` while the job's retry policy has attempts left, else `dead` (parked) |
/// | [`JobError::fail`] | `failed` | `failed`, never retried |
/// | [`JobError::cancel`] | `cancelled` | `cancelled` |
///
/// `JobError` converts from any error type (`std::error::Error + Send + Sync`, `anyhow::Error`,
/// `String`, `&str`), so `?` works in handlers and the converted error is a *retryable* failure.
/// That blanket conversion is why `JobError` itself deliberately does not implement
/// `std::error::Error` (the same trade-off `anyhow::Error` makes): a type cannot both implement
/// the trait and convert from every implementor of it.
#[non_exhaustive]
pub enum JobError {
    /// A failure worth another attempt, optionally not before `after`.
    Retry {
        /// What went wrong, stored as the attempt's error.
        message: String,
        /// The handler's requested minimum delay before the next attempt.
        after: Option<Duration>,
    },
    /// A failure that another attempt would not fix (bad input, a business rule).
    Fail {
        /// What went wrong, stored as the attempt's and the run's error.
        message: String,
    },
    /// The handler gave up on purpose (it saw its cancellation token fire, or decided the run is
    /// moot); the run ends `cancelled`.
    Cancel {
        /// Why, stored as the attempt's and the run's error.
        message: String,
    },
}

impl JobError {
    /// A retryable failure.
    pub fn retry(message: impl Into<String>) -> Self {
        JobError::Retry {
            message: message.into(),
            after: None,
        }
    }

    /// A retryable failure whose next attempt should not start before `after` has passed.
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        JobError::Retry {
            message: message.into(),
            after: Some(after),
        }
    }

    /// A failure that must not be retried.
    pub fn fail(message: impl Into<String>) -> Self {
        JobError::Fail {
            message: message.into(),
        }
    }

    /// The handler cancelled the run.
    pub fn cancel(message: impl Into<String>) -> Self {
        JobError::Cancel {
            message: message.into(),
        }
    }

    /// The error text stored with the attempt.
    pub fn message(&self) -> &str {
        match self {
            JobError::Retry { message, .. }
            | JobError::Fail { message }
            | JobError::Cancel { message } => message,
        }
    }

    /// True for failures that go through the retry decision.
    pub fn is_retryable(&self) -> bool {
        matches!(self, JobError::Retry { .. })
    }

    /// The delay the handler asked for before the next attempt, if any.
    pub fn requested_delay(&self) -> Option<Duration> {
        match self {
            JobError::Retry { after, .. } => *after,
            _ => None,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            JobError::Retry { .. } => "retry",
            JobError::Fail { .. } => "fail",
            JobError::Cancel { .. } => "cancel",
        }
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("JobError");
        d.field("kind", &self.kind())
            .field("message", &self.message());
        if let Some(after) = self.requested_delay() {
            d.field("after", &after);
        }
        d.finish()
    }
}

impl PartialEq for JobError {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind()
            && self.message() == other.message()
            && self.requested_delay() == other.requested_delay()
    }
}

/// Any error becomes a retryable failure whose message is the error and its chain of sources.
impl<E> From<E> for JobError
where
    E: Into<Box<dyn StdError + Send + Sync + 'static>>,
{
    fn from(error: E) -> Self {
        let error: Box<dyn StdError + Send + Sync + 'static> = error.into();
        JobError::retry(error_chain(error.as_ref()))
    }
}

/// `outer: inner: innermost`, skipping a source whose text the previous level already shows.
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// What becomes of the run after an attempt (`chime_runs.state` and what the worker does next).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RunEnd {
    Succeeded,
    /// Failed for good without retry (`JobError::fail`).
    Failed,
    Cancelled,
    /// `retrying`: publish the next attempt through the delay tiers, due after `delay`.
    Retry {
        delay: Duration,
    },
    /// `dead`: attempts exhausted; park the message with `reason`.
    Dead {
        reason: String,
    },
}

impl RunEnd {
    /// The run state recorded for this end.
    pub(crate) fn state(&self) -> RunState {
        match self {
            RunEnd::Succeeded => RunState::Succeeded,
            RunEnd::Failed => RunState::Failed,
            RunEnd::Cancelled => RunState::Cancelled,
            RunEnd::Retry { .. } => RunState::Retrying,
            RunEnd::Dead { .. } => RunState::Dead,
        }
    }
}

/// How a handler invocation ended, as observed by the worker.
#[derive(Debug)]
pub(crate) enum Ending {
    /// The handler's future completed.
    Returned(Result<(), JobError>),
    /// The handler panicked; the panic message.
    Panicked(String),
    /// The handler did not stop within the grace period after its token fired; its task was
    /// aborted.
    Abandoned,
}

/// Everything the outcome depends on.
#[derive(Debug)]
pub(crate) struct Execution {
    pub ending: Ending,
    /// The job's timeout, if it elapsed before the handler ended.
    pub timed_out: Option<Duration>,
    /// The worker was shutting down and had fired the handler's token before the handler ended.
    pub interrupted: bool,
    /// An operator cancelled the run (control message) before the handler ended.
    pub cancel_requested: bool,
}

/// What the worker records for one finished attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub attempt: AttemptState,
    pub run: RunEnd,
    pub error: Option<String>,
}

/// The run's end after attempt `attempt` failed retryably with `error`: retry after the
/// policy's delay (or the handler's `requested` one) while attempts remain, else dead with the
/// reason `attempts exhausted (n of max): error`. `random` is uniform in [0, 1) (the jitter).
pub(crate) fn after_retryable_failure(
    attempt: u32,
    policy: Option<&RetryPolicy>,
    requested: Option<Duration>,
    random: f64,
    error: &str,
) -> RunEnd {
    match retry::decide(policy, attempt, requested, random) {
        Decision::Retry { delay, .. } => RunEnd::Retry { delay },
        Decision::Exhausted { max_attempts } => RunEnd::Dead {
            reason: format!("attempts exhausted ({attempt} of {max_attempts}): {error}"),
        },
    }
}

/// Maps an execution of attempt `attempt` to the states and error the worker records, under the
/// job's retry `policy` (`None`: one attempt). `random` is uniform in [0, 1) (the jitter).
#[cfg(test)]
pub(crate) fn outcome(
    attempt: u32,
    execution: Execution,
    cancel_grace: Duration,
    policy: Option<&RetryPolicy>,
    random: f64,
) -> Outcome {
    outcome_with(execution, cancel_grace, |requested, error| {
        after_retryable_failure(attempt, policy, requested, random, error)
    })
}

/// Maps an execution to the states and error the worker records; a retryable failure's run
/// end is `after_failure(requested delay, error)` (the worker asks the database:
/// `chime_retry_decision`).
pub(crate) fn outcome_with(
    execution: Execution,
    cancel_grace: Duration,
    mut after_failure: impl FnMut(Option<Duration>, &str) -> RunEnd,
) -> Outcome {
    let Execution {
        ending,
        timed_out,
        interrupted,
        cancel_requested,
    } = execution;
    let mut retryable = |state, requested, error: String| Outcome {
        attempt: state,
        run: after_failure(requested, &error),
        error: Some(error),
    };
    let abandoned = || {
        format!(
            "handler did not stop within {cancel_grace:?} of its cancellation and was abandoned"
        )
    };
    let detail = |ending: &Ending| match ending {
        Ending::Returned(Err(e)) => format!("handler returned: {e}"),
        Ending::Panicked(p) => format!("handler panicked: {p}"),
        Ending::Abandoned => abandoned(),
        Ending::Returned(Ok(())) => unreachable!("success is matched first"),
    };
    if let Ending::Returned(Ok(())) = ending {
        // Finishing successfully wins, even after the token fired.
        return Outcome {
            attempt: AttemptState::Succeeded,
            run: RunEnd::Succeeded,
            error: None,
        };
    }
    if cancel_requested {
        // The operator's decision wins over a timeout or a retryable error: no retry.
        return Outcome {
            attempt: AttemptState::Cancelled,
            run: RunEnd::Cancelled,
            error: Some(format!("cancelled by an operator; {}", detail(&ending))),
        };
    }
    if let Some(limit) = timed_out {
        let requested = match &ending {
            Ending::Returned(Err(e)) => e.requested_delay(),
            _ => None,
        };
        return retryable(
            AttemptState::TimedOut,
            requested,
            format!("timed out after {limit:?}; {}", detail(&ending)),
        );
    }
    match ending {
        Ending::Returned(Err(JobError::Cancel { .. })) | Ending::Abandoned if interrupted => {
            let error = format!("interrupted by worker shutdown; {}", detail(&ending));
            retryable(AttemptState::Cancelled, None, error)
        }
        Ending::Abandoned => {
            // Only a fired token leads here, and every firing is one of the cases above.
            let error = format!("interrupted; {}", abandoned());
            retryable(AttemptState::Cancelled, None, error)
        }
        Ending::Returned(Err(JobError::Retry { message, after })) => {
            retryable(AttemptState::Failed, after, message)
        }
        Ending::Returned(Err(JobError::Fail { message })) => Outcome {
            attempt: AttemptState::Failed,
            run: RunEnd::Failed,
            error: Some(message),
        },
        Ending::Returned(Err(JobError::Cancel { message })) => Outcome {
            attempt: AttemptState::Cancelled,
            run: RunEnd::Cancelled,
            error: Some(message),
        },
        Ending::Panicked(p) => {
            retryable(AttemptState::Failed, None, format!("handler panicked: {p}"))
        }
        Ending::Returned(Ok(())) => unreachable!("matched above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("loading orders")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn any_error_converts_to_a_retryable_failure_with_its_sources() {
        fn handler() -> Result<(), JobError> {
            Err(Outer(std::io::Error::other("connection refused")))?
        }
        let err = handler().unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(err.message(), "loading orders: connection refused");

        let from_str: JobError = "boom".into();
        assert_eq!(from_str, JobError::retry("boom"));
        let from_anyhow: JobError = anyhow::anyhow!("root").context("outer").into();
        assert_eq!(from_anyhow.message(), "outer: root");
    }

    #[test]
    fn constructors_carry_their_kind() {
        let d = Duration::from_secs(30);
        assert_eq!(JobError::retry_after(d, "later").requested_delay(), Some(d));
        assert!(!JobError::fail("no").is_retryable());
        assert_eq!(format!("{}", JobError::cancel("stop")), "stop");
        assert_eq!(
            format!("{:?}", JobError::fail("no")),
            r#"JobError { kind: "fail", message: "no" }"#
        );
    }

    fn ex(ending: Ending, timed_out: Option<u64>, interrupted: bool) -> Execution {
        Execution {
            ending,
            timed_out: timed_out.map(Duration::from_millis),
            interrupted,
            cancel_requested: false,
        }
    }

    fn dead(reason: &str) -> RunEnd {
        RunEnd::Dead {
            reason: reason.to_owned(),
        }
    }

    /// No retry policy: one attempt, so every retryable failure is final (`dead`).
    #[test]
    fn executions_map_to_recorded_states() {
        use AttemptState as A;
        use RunEnd as R;
        let grace = Duration::from_secs(5);
        let ok = || Ending::Returned(Ok(()));
        let err = |e: JobError| Ending::Returned(Err(e));
        let table: Vec<(Execution, A, R, Option<&str>)> = vec![
            (ex(ok(), None, false), A::Succeeded, R::Succeeded, None),
            // Finishing successfully wins even after the token fired.
            (ex(ok(), Some(10), true), A::Succeeded, R::Succeeded, None),
            (
                ex(err(JobError::retry("db down")), None, false),
                A::Failed,
                dead("attempts exhausted (1 of 1): db down"),
                Some("db down"),
            ),
            (
                ex(err(JobError::fail("bad input")), None, false),
                A::Failed,
                R::Failed,
                Some("bad input"),
            ),
            (
                ex(err(JobError::cancel("moot")), None, false),
                A::Cancelled,
                R::Cancelled,
                Some("moot"),
            ),
            (
                ex(Ending::Panicked("index out of bounds".into()), None, false),
                A::Failed,
                dead("attempts exhausted (1 of 1): handler panicked: index out of bounds"),
                Some("handler panicked: index out of bounds"),
            ),
            (
                ex(err(JobError::cancel("token fired")), Some(250), false),
                A::TimedOut,
                dead(
                    "attempts exhausted (1 of 1): timed out after 250ms; handler returned: token fired",
                ),
                Some("timed out after 250ms; handler returned: token fired"),
            ),
            (
                ex(Ending::Abandoned, Some(250), false),
                A::TimedOut,
                dead(
                    "attempts exhausted (1 of 1): timed out after 250ms; handler did not stop within 5s of its cancellation and was abandoned",
                ),
                Some(
                    "timed out after 250ms; handler did not stop within 5s of its cancellation and was abandoned",
                ),
            ),
            // A cancel caused by the worker's shutdown is not an operator's cancel.
            (
                ex(err(JobError::cancel("token fired")), None, true),
                A::Cancelled,
                dead(
                    "attempts exhausted (1 of 1): interrupted by worker shutdown; handler returned: token fired",
                ),
                Some("interrupted by worker shutdown; handler returned: token fired"),
            ),
            (
                ex(Ending::Abandoned, None, true),
                A::Cancelled,
                dead(
                    "attempts exhausted (1 of 1): interrupted by worker shutdown; handler did not stop within 5s of its cancellation and was abandoned",
                ),
                Some(
                    "interrupted by worker shutdown; handler did not stop within 5s of its cancellation and was abandoned",
                ),
            ),
            // A real failure during shutdown is still that failure.
            (
                ex(err(JobError::fail("bad input")), None, true),
                A::Failed,
                R::Failed,
                Some("bad input"),
            ),
        ];
        for (execution, attempt, run, error) in table {
            let case = format!("{execution:?}");
            let got = outcome(1, execution, grace, None, 0.5);
            assert_eq!(
                got,
                Outcome {
                    attempt,
                    run,
                    error: error.map(str::to_owned)
                },
                "{case}"
            );
        }
    }

    #[test]
    fn retryable_failures_retry_while_the_policy_has_attempts_left() {
        let policy = RetryPolicy {
            max_attempts: 3,
            initial_ms: 1_000,
            multiplier: 2.0,
            max_ms: 60_000,
            jitter: false,
        };
        let s = Duration::from_secs;
        let retryable = [
            (Ending::Returned(Err(JobError::retry("x"))), None),
            (Ending::Panicked("p".into()), None),
            (Ending::Returned(Err(JobError::cancel("t"))), Some(100)),
        ];
        for (ending, timed_out) in retryable {
            let case = format!("{ending:?}");
            let run = |attempt| {
                outcome(
                    attempt,
                    ex(clone(&ending), timed_out, false),
                    s(5),
                    Some(&policy),
                    0.5,
                )
                .run
            };
            assert_eq!(run(1), RunEnd::Retry { delay: s(1) }, "{case}");
            assert_eq!(run(2), RunEnd::Retry { delay: s(2) }, "{case}");
            assert!(
                matches!(run(3), RunEnd::Dead { reason } if reason.starts_with("attempts exhausted (3 of 3): ")),
                "{case}"
            );
        }
        // The handler's own delay replaces the policy's, also after a timeout.
        let asked = Ending::Returned(Err(JobError::retry_after(s(7), "busy")));
        assert_eq!(
            outcome(1, ex(asked, None, false), s(5), Some(&policy), 0.5).run,
            RunEnd::Retry { delay: s(7) }
        );
        let asked = Ending::Returned(Err(JobError::retry_after(s(9), "late")));
        assert_eq!(
            outcome(1, ex(asked, Some(100), false), s(5), Some(&policy), 0.5).run,
            RunEnd::Retry { delay: s(9) }
        );
        // fail and cancel are never retried.
        for (e, want) in [
            (JobError::fail("no"), RunEnd::Failed),
            (JobError::cancel("no"), RunEnd::Cancelled),
        ] {
            let got = outcome(
                1,
                ex(Ending::Returned(Err(e)), None, false),
                s(5),
                Some(&policy),
                0.5,
            );
            assert_eq!(got.run, want);
        }
    }

    #[test]
    fn an_operators_cancel_wins_over_timeout_and_retry() {
        let policy = RetryPolicy {
            max_attempts: 5,
            initial_ms: 1_000,
            multiplier: 2.0,
            max_ms: 60_000,
            jitter: true,
        };
        let grace = Duration::from_millis(500);
        let table = [
            (
                Ending::Returned(Err(JobError::cancel("saw the token"))),
                Some(100),
                "cancelled by an operator; handler returned: saw the token",
            ),
            (
                Ending::Returned(Err(JobError::retry("interrupted"))),
                None,
                "cancelled by an operator; handler returned: interrupted",
            ),
            (
                Ending::Abandoned,
                None,
                "cancelled by an operator; handler did not stop within 500ms of its cancellation and was abandoned",
            ),
        ];
        for (ending, timed_out, error) in table {
            let mut execution = ex(ending, timed_out, false);
            execution.cancel_requested = true;
            assert_eq!(
                outcome(1, execution, grace, Some(&policy), 0.5),
                Outcome {
                    attempt: AttemptState::Cancelled,
                    run: RunEnd::Cancelled,
                    error: Some(error.to_owned()),
                }
            );
        }
        // Success still wins.
        let mut execution = ex(Ending::Returned(Ok(())), None, false);
        execution.cancel_requested = true;
        assert_eq!(
            outcome(1, execution, grace, Some(&policy), 0.5).run,
            RunEnd::Succeeded
        );
    }

    fn clone(ending: &Ending) -> Ending {
        match ending {
            Ending::Returned(Ok(())) => Ending::Returned(Ok(())),
            Ending::Returned(Err(e)) => Ending::Returned(Err(match e {
                JobError::Retry { message, after } => JobError::Retry {
                    message: message.clone(),
                    after: *after,
                },
                JobError::Fail { message } => JobError::fail(message.clone()),
                JobError::Cancel { message } => JobError::cancel(message.clone()),
            })),
            Ending::Panicked(p) => Ending::Panicked(p.clone()),
            Ending::Abandoned => Ending::Abandoned,
        }
    }
}
