//! What a handler's result means: [`JobError`] and the pure mapping from an execution to the
//! attempt and run states the worker records.
//!
//! Everything here is pure: no IO, no clock. The retry tiers (a later issue) plug in at
//! [`decide_after_failure`] and nowhere else.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A handler's verdict when it does not succeed. Returning it decides what happens to the run:
///
/// | constructor | attempt recorded as | run |
/// |---|---|---|
/// | [`JobError::retry`], [`JobError::retry_after`], any error through `?` | `failed` | goes through the retry decision (today: `failed`) |
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

/// State of one attempt row (`chime_attempts.state`) as the worker records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptState {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
}

impl AttemptState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttemptState::Succeeded => "succeeded",
            AttemptState::Failed => "failed",
            AttemptState::TimedOut => "timed_out",
            AttemptState::Cancelled => "cancelled",
        }
    }
}

/// Final state of a run (`chime_runs.state`) as the worker records it after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunState {
    Succeeded,
    Failed,
    Cancelled,
}

impl RunState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
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
    /// The handler did not stop within the grace period after its token fired; its future was
    /// dropped.
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
}

/// Why an attempt failed, as input to the retry decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Failure {
    /// The handler asked for a retry (explicitly or by `?` on an error).
    Retryable { after: Option<Duration> },
    /// The handler panicked.
    Panicked,
    /// The job's timeout elapsed.
    TimedOut,
    /// The worker shut down before the handler finished.
    Interrupted,
}

/// What the worker records for one finished attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub attempt: AttemptState,
    pub run: RunState,
    pub error: Option<String>,
}

/// The retry decision: what becomes of a run whose attempt `attempt` failed retryably.
///
/// **The retry path plugs in exactly here.** Today there are no retry tiers yet, so every
/// retryable failure ends the run `failed` with the attempt's error. The retry issue changes this
/// function to consult the job's retry policy (`attempt` against `max_attempts`, backoff with
/// jitter, the handler's requested delay in [`Failure::Retryable`]) and to return "retry after
/// `d`" (the worker then publishes the trigger with `attempt + 1` to a delay tier and records the
/// run `retrying`) or "dead" (park the message, run `dead`).
pub(crate) fn decide_after_failure(attempt: u32, failure: Failure) -> RunState {
    let _ = (attempt, failure);
    RunState::Failed
}

/// Maps an execution of attempt `attempt` to the states and error the worker records.
pub(crate) fn outcome(attempt: u32, execution: Execution, cancel_grace: Duration) -> Outcome {
    let Execution {
        ending,
        timed_out,
        interrupted,
    } = execution;
    let failed = |state, failure, error: String| Outcome {
        attempt: state,
        run: decide_after_failure(attempt, failure),
        error: Some(error),
    };
    let abandoned = || {
        format!(
            "handler did not stop within {cancel_grace:?} of its cancellation and was abandoned"
        )
    };
    match (ending, timed_out) {
        (Ending::Returned(Ok(())), _) => Outcome {
            attempt: AttemptState::Succeeded,
            run: RunState::Succeeded,
            error: None,
        },
        (ending, Some(limit)) => {
            let detail = match ending {
                Ending::Returned(Err(e)) => format!("; handler returned: {e}"),
                Ending::Panicked(p) => format!("; handler panicked: {p}"),
                Ending::Abandoned => format!("; {}", abandoned()),
                Ending::Returned(Ok(())) => unreachable!("matched above"),
            };
            failed(
                AttemptState::TimedOut,
                Failure::TimedOut,
                format!("timed out after {limit:?}{detail}"),
            )
        }
        (Ending::Returned(Err(JobError::Cancel { message })), None) if interrupted => failed(
            AttemptState::Cancelled,
            Failure::Interrupted,
            format!("interrupted by worker shutdown; handler returned: {message}"),
        ),
        (Ending::Abandoned, None) => failed(
            AttemptState::Cancelled,
            Failure::Interrupted,
            format!("interrupted by worker shutdown; {}", abandoned()),
        ),
        (Ending::Returned(Err(e)), None) => match e {
            JobError::Retry { message, after } => {
                failed(AttemptState::Failed, Failure::Retryable { after }, message)
            }
            JobError::Fail { message } => Outcome {
                attempt: AttemptState::Failed,
                run: RunState::Failed,
                error: Some(message),
            },
            JobError::Cancel { message } => Outcome {
                attempt: AttemptState::Cancelled,
                run: RunState::Cancelled,
                error: Some(message),
            },
        },
        (Ending::Panicked(p), None) => failed(
            AttemptState::Failed,
            Failure::Panicked,
            format!("handler panicked: {p}"),
        ),
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
        }
    }

    #[test]
    fn executions_map_to_recorded_states() {
        use AttemptState as A;
        use RunState as R;
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
                R::Failed,
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
                R::Failed,
                Some("handler panicked: index out of bounds"),
            ),
            (
                ex(err(JobError::cancel("token fired")), Some(250), false),
                A::TimedOut,
                R::Failed,
                Some("timed out after 250ms; handler returned: token fired"),
            ),
            (
                ex(Ending::Abandoned, Some(250), false),
                A::TimedOut,
                R::Failed,
                Some(
                    "timed out after 250ms; handler did not stop within 5s of its cancellation and was abandoned",
                ),
            ),
            // A cancel caused by the worker's shutdown is not an operator's cancel.
            (
                ex(err(JobError::cancel("token fired")), None, true),
                A::Cancelled,
                R::Failed,
                Some("interrupted by worker shutdown; handler returned: token fired"),
            ),
            (
                ex(Ending::Abandoned, None, true),
                A::Cancelled,
                R::Failed,
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
            let got = outcome(1, execution, grace);
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
    fn every_failure_ends_the_run_failed_until_retry_tiers_exist() {
        for failure in [
            Failure::Retryable { after: None },
            Failure::Retryable {
                after: Some(Duration::from_secs(1)),
            },
            Failure::Panicked,
            Failure::TimedOut,
            Failure::Interrupted,
        ] {
            assert_eq!(decide_after_failure(1, failure), RunState::Failed);
        }
    }
}
