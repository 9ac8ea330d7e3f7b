//! The handler's view of one attempt: [`JobContext`] and its run logger, [`JobLogger`].
//!
//! Log lines are emitted as `tracing` events at once and buffered for PostgreSQL
//! (`chime_run_logs`): every [`FLUSH_EVERY`] lines a batch goes to the attempt's flusher, and the
//! rest is written with the attempt's outcome. The buffer is bounded: if the store falls so far
//! behind that [`MAX_PENDING_BATCHES`] batches wait, further batches are dropped and counted, and
//! the count is stored as a final line, so a chatty handler cannot exhaust memory.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Lines per batch handed to the store while the handler runs.
pub(crate) const FLUSH_EVERY: usize = 100;
/// Batches that may wait for the store before new ones are dropped.
pub(crate) const MAX_PENDING_BATCHES: usize = 16;
/// Longest stored log line, in bytes; longer lines are cut at a character boundary.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024;

/// Severity of a run log line, stored as `debug`, `info`, `warn` or `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Detail for debugging.
    Debug,
    /// Normal progress.
    Info,
    /// Something odd that did not stop the job.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    /// The text stored in `chime_run_logs.level`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One buffered log line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogLine {
    pub at: DateTime<Utc>,
    pub level: Level,
    pub message: String,
}

/// Everything a handler knows about the attempt it runs.
///
/// Cheap to clone; clones share the logger and the cancellation token.
#[derive(Clone)]
pub struct JobContext {
    run_id: i64,
    job: Arc<str>,
    attempt: u32,
    scheduled_at: DateTime<Utc>,
    params: Arc<Value>,
    cancellation: CancellationToken,
    logger: JobLogger,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("run_id", &self.run_id)
            .field("job", &self.job)
            .field("attempt", &self.attempt)
            .field("scheduled_at", &self.scheduled_at)
            .field("cancelled", &self.cancellation.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl JobContext {
    pub(crate) fn new(
        run_id: i64,
        job: Arc<str>,
        attempt: u32,
        scheduled_at: DateTime<Utc>,
        params: Value,
        cancellation: CancellationToken,
        logger: JobLogger,
    ) -> Self {
        JobContext {
            run_id,
            job,
            attempt,
            scheduled_at,
            params: Arc::new(params),
            cancellation,
            logger,
        }
    }

    /// The run id: unique per run and stable across attempts, so use it as the idempotency key
    /// of whatever the job changes (execution is at-least-once).
    pub fn run_id(&self) -> i64 {
        self.run_id
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The attempt number, 1-based.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The instant this run was scheduled for (for manual runs: when it was requested).
    pub fn scheduled_at(&self) -> DateTime<Utc> {
        self.scheduled_at
    }

    /// The run's parameters as raw JSON (the handler also receives them decoded).
    pub fn params(&self) -> &Value {
        &self.params
    }

    /// Fires when the handler should stop: the job's timeout elapsed, an operator cancelled the
    /// run, or the worker is shutting down and its drain timeout passed. A handler that returns
    /// soon after is recorded as timed out, cancelled or interrupted; one that ignores it is
    /// abandoned after a grace period (its task is aborted at its next await).
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// True once [`cancellation_token`](Self::cancellation_token) has fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancellation.is_cancelled()
    }

    /// Completes when [`cancellation_token`](Self::cancellation_token) fires; handy in `select!`.
    pub async fn cancelled(&self) {
        self.cancellation.cancelled().await
    }

    /// The run logger: its lines are stored with this attempt in `chime_run_logs`.
    pub fn log(&self) -> &JobLogger {
        &self.logger
    }
}

/// Writes log lines that are stored with the run and also emitted as `tracing` events (target
/// `chime_worker::job`, fields `run_id`, `job`, `attempt`).
///
/// The methods never block and never fail: storing happens in the background.
#[derive(Clone)]
pub struct JobLogger {
    sink: Arc<LogSink>,
}

impl fmt::Debug for JobLogger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobLogger")
            .field("run_id", &self.sink.run_id)
            .finish_non_exhaustive()
    }
}

impl JobLogger {
    pub(crate) fn new(sink: Arc<LogSink>) -> Self {
        JobLogger { sink }
    }

    /// Logs a line at `level`.
    pub fn log(&self, level: Level, message: impl Into<String>) {
        self.sink.push(level, message.into());
    }

    /// Logs a debug line.
    pub fn debug(&self, message: impl Into<String>) {
        self.log(Level::Debug, message);
    }

    /// Logs an info line.
    pub fn info(&self, message: impl Into<String>) {
        self.log(Level::Info, message);
    }

    /// Logs a warning.
    pub fn warn(&self, message: impl Into<String>) {
        self.log(Level::Warn, message);
    }

    /// Logs an error line.
    pub fn error(&self, message: impl Into<String>) {
        self.log(Level::Error, message);
    }
}

/// The buffer behind one attempt's logger.
pub(crate) struct LogSink {
    run_id: i64,
    job: Arc<str>,
    attempt: u32,
    /// Where full batches go while the handler runs; `None` keeps every line in the buffer
    /// (the `testing` helper).
    flush: Option<mpsc::Sender<Vec<LogLine>>>,
    state: Mutex<SinkState>,
}

#[derive(Default)]
struct SinkState {
    lines: Vec<LogLine>,
    dropped: u64,
    closed: bool,
}

impl LogSink {
    /// A sink that hands batches of [`FLUSH_EVERY`] lines to `flush`.
    pub(crate) fn new(
        run_id: i64,
        job: Arc<str>,
        attempt: u32,
        flush: Option<mpsc::Sender<Vec<LogLine>>>,
    ) -> Self {
        LogSink {
            run_id,
            job,
            attempt,
            flush,
            state: Mutex::new(SinkState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, SinkState> {
        // A panic while holding this lock cannot leave the buffer inconsistent: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, level: Level, mut message: String) {
        let (run_id, job, attempt) = (self.run_id, &*self.job, self.attempt);
        match level {
            Level::Debug => {
                tracing::debug!(target: "chime_worker::job", run_id, job, attempt, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "chime_worker::job", run_id, job, attempt, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "chime_worker::job", run_id, job, attempt, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "chime_worker::job", run_id, job, attempt, "{message}")
            }
        }
        truncate(&mut message, MAX_LINE_BYTES);
        let line = LogLine {
            at: Utc::now(),
            level,
            message,
        };
        let mut state = self.state();
        if state.closed {
            // The attempt is already recorded (a task the handler spawned outlived it).
            return;
        }
        state.lines.push(line);
        if let Some(flush) = &self.flush
            && state.lines.len() >= FLUSH_EVERY
        {
            let batch = std::mem::take(&mut state.lines);
            let n = batch.len() as u64;
            if flush.try_send(batch).is_err() {
                state.dropped += n;
            }
        }
    }

    /// Closes the sink and returns the lines not yet handed to the flusher, with a final warning
    /// line if any were dropped.
    pub(crate) fn finish(&self) -> Vec<LogLine> {
        let mut state = self.state();
        state.closed = true;
        let mut lines = std::mem::take(&mut state.lines);
        if state.dropped > 0 {
            lines.push(LogLine {
                at: Utc::now(),
                level: Level::Warn,
                message: format!(
                    "{} log lines were dropped because the log store fell behind",
                    state.dropped
                ),
            });
        }
        lines
    }
}

fn truncate(message: &mut String, max: usize) {
    if message.len() > max {
        let mut end = max;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" …[truncated]");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(flush: Option<mpsc::Sender<Vec<LogLine>>>) -> Arc<LogSink> {
        Arc::new(LogSink::new(1, "job".into(), 1, flush))
    }

    #[test]
    fn lines_are_batched_every_flush_every_lines() {
        let (tx, mut rx) = mpsc::channel(MAX_PENDING_BATCHES);
        let logger = JobLogger::new(sink(Some(tx)));
        for i in 0..FLUSH_EVERY + 3 {
            logger.info(format!("line {i}"));
        }
        let batch = rx.try_recv().expect("one full batch");
        assert_eq!(batch.len(), FLUSH_EVERY);
        assert_eq!(batch[0].message, "line 0");
        assert!(rx.try_recv().is_err());
        let rest = logger.sink.finish();
        assert_eq!(rest.len(), 3);
        assert_eq!(rest[2].message, format!("line {}", FLUSH_EVERY + 2));
    }

    #[test]
    fn a_stalled_store_drops_batches_and_says_so() {
        let (tx, _rx) = mpsc::channel(1);
        let logger = JobLogger::new(sink(Some(tx)));
        for _ in 0..FLUSH_EVERY * 3 {
            logger.warn("x");
        }
        let rest = logger.sink.finish();
        assert_eq!(rest.len(), 1);
        assert_eq!(
            rest[0].message,
            format!(
                "{} log lines were dropped because the log store fell behind",
                FLUSH_EVERY * 2
            )
        );
        assert_eq!(rest[0].level, Level::Warn);
    }

    #[test]
    fn lines_after_finish_are_not_buffered() {
        let logger = JobLogger::new(sink(None));
        logger.info("kept");
        assert_eq!(logger.sink.finish().len(), 1);
        logger.info("late");
        assert!(logger.sink.finish().is_empty());
    }

    #[test]
    fn long_lines_are_cut_on_a_char_boundary() {
        let mut s = "é".repeat(10);
        truncate(&mut s, 5);
        assert_eq!(s, "éé …[truncated]");
    }
}
