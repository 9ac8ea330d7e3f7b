//! Run a handler in a unit test: no broker, no database.
//!
//! The handler gets a real [`JobContext`] (params decoded exactly as the worker decodes them, a
//! logger, a cancellation token) and the test gets its result and log lines:
//!
//! ```
//! use chime_worker::{JobContext, JobError, Level, testing};
//!
//! #[derive(serde::Deserialize)]
//! struct Greet { name: String }
//!
//! async fn greet(ctx: JobContext, p: Greet) -> Result<(), JobError> {
//!     ctx.log().info(format!("hello, {} (run {})", p.name, ctx.run_id()));
//!     Ok(())
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let run = testing::run(greet, serde_json::json!({"name": "Ada"})).await;
//! assert!(run.result.is_ok());
//! assert_eq!(run.logs, [(Level::Info, "hello, Ada (run 1)".to_string())]);
//!
//! let run = testing::TestJob::new("greet").run_id(42).attempt(2)
//!     .run(greet, serde_json::json!({"nom": "Ada"})).await;
//! assert!(run.result.unwrap_err().message().contains("missing field `name`"));
//! # });
//! ```
//!
//! A panic in the handler propagates to the test (the worker records it as a failure instead).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::context::{JobContext, JobLogger, Level, LogSink};
use crate::handler;
use crate::outcome::JobError;

/// What a test run produced.
#[derive(Debug)]
#[non_exhaustive]
pub struct TestRun {
    /// The handler's result (a params decode failure shows here as [`JobError::Fail`]).
    pub result: Result<(), JobError>,
    /// The lines the handler logged, in order.
    pub logs: Vec<(Level, String)>,
}

/// Runs `handler` once with `params` as run 1, attempt 1 of job `test-job`, scheduled now.
pub async fn run<P, F, Fut>(handler: F, params: Value) -> TestRun
where
    P: DeserializeOwned + Send + 'static,
    F: Fn(JobContext, P) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    TestJob::new("test-job").run(handler, params).await
}

/// A configurable test run: job name, run id, attempt, scheduled instant, cancellation.
#[derive(Debug, Clone)]
pub struct TestJob {
    job: String,
    run_id: i64,
    attempt: u32,
    scheduled_at: DateTime<Utc>,
    cancellation: CancellationToken,
}

impl TestJob {
    /// A run of `job` with run id 1, attempt 1, scheduled now.
    pub fn new(job: impl Into<String>) -> Self {
        TestJob {
            job: job.into(),
            run_id: 1,
            attempt: 1,
            scheduled_at: Utc::now(),
            cancellation: CancellationToken::new(),
        }
    }

    /// Sets the run id.
    pub fn run_id(mut self, run_id: i64) -> Self {
        self.run_id = run_id;
        self
    }

    /// Sets the attempt number.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Sets the scheduled instant.
    pub fn scheduled_at(mut self, at: DateTime<Utc>) -> Self {
        self.scheduled_at = at;
        self
    }

    /// The token handed to the handler: cancel it (before or during the run) to test how the
    /// handler reacts to a timeout or shutdown.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancellation.clone()
    }

    /// Runs `handler` with `params`.
    pub async fn run<P, F, Fut>(self, handler: F, params: Value) -> TestRun
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(JobContext, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let handler = handler::erase(&self.job, handler);
        let job: Arc<str> = self.job.into();
        let sink = Arc::new(LogSink::new(self.run_id, job.clone(), self.attempt, None));
        let ctx = JobContext::new(
            self.run_id,
            job,
            self.attempt,
            self.scheduled_at,
            params.clone(),
            self.cancellation,
            JobLogger::new(sink.clone()),
        );
        let result = handler(ctx, params).await;
        let logs = sink
            .finish()
            .into_iter()
            .map(|line| (line.level, line.message))
            .collect();
        TestRun { result, logs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(serde::Deserialize)]
    struct Batch {
        size: u32,
    }

    async fn batch(ctx: JobContext, p: Batch) -> Result<(), JobError> {
        ctx.log().info(format!("batch of {}", p.size));
        if p.size == 0 {
            ctx.log().error("empty batch");
            return Err(JobError::fail("batch size must be positive"));
        }
        Ok(())
    }

    #[tokio::test]
    async fn runs_a_handler_and_collects_its_logs() {
        let run = run(batch, json!({"size": 3})).await;
        assert_eq!(run.result, Ok(()));
        assert_eq!(run.logs, [(Level::Info, "batch of 3".to_owned())]);
    }

    #[tokio::test]
    async fn reports_the_handlers_error() {
        let run = run(batch, json!({"size": 0})).await;
        assert_eq!(
            run.result,
            Err(JobError::fail("batch size must be positive"))
        );
        assert_eq!(run.logs.len(), 2);
        assert_eq!(run.logs[1].0, Level::Error);
    }

    #[tokio::test]
    async fn params_that_do_not_decode_fail_naming_the_job_and_field() {
        let run = TestJob::new("close-orders")
            .run(batch, json!({"size": "three"}))
            .await;
        let err = run.result.unwrap_err();
        assert!(!err.is_retryable());
        assert!(
            err.message()
                .starts_with("params of job `close-orders` do not decode"),
            "{err}"
        );
        assert!(
            err.message()
                .contains("invalid type: string \"three\", expected u32"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn exposes_run_id_attempt_schedule_and_cancellation() {
        let at: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let job = TestJob::new("j").run_id(42).attempt(3).scheduled_at(at);
        job.cancellation_token().cancel();
        let run = job
            .run(
                move |ctx: JobContext, _: ()| async move {
                    assert_eq!((ctx.run_id(), ctx.attempt(), ctx.job()), (42, 3, "j"));
                    assert_eq!(ctx.scheduled_at(), at);
                    ctx.cancelled().await;
                    Err(JobError::cancel("stopped"))
                },
                Value::Null,
            )
            .await;
        assert_eq!(run.result, Err(JobError::cancel("stopped")));
    }
}
