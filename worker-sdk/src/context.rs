//! The handler's view of one attempt: [`JobContext`] and its run logger, [`JobLogger`]; for a
//! task of a broadcast, sharded or map/reduce job, its place in its run and its calls (map,
//! output, results: `tasks`).
//!
//! Log lines are emitted as `tracing` events at once and buffered for PostgreSQL
//! (`chime_run_logs`): a batch goes to the attempt's flusher when it holds [`FLUSH_EVERY`] lines
//! or when its oldest line is [`FLUSH_AFTER`] old (a timer task per attempt), so a line reaches
//! the database within about a second even from a handler that logs once a minute; the rest is
//! written with the attempt's outcome, after every batch, in order. Memory and storage are
//! bounded: an attempt stores at most [`MAX_LOG_LINES_PER_ATTEMPT`] lines and then one line
//! saying how many further lines were dropped; and if the store falls so far behind that
//! [`MAX_PENDING_BATCHES`] batches wait, further batches are dropped and counted, and the count
//! is stored as a final line.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chime_protocol::limits::MAX_LOG_LINES_PER_ATTEMPT;
use chime_protocol::wire::{Shard, Task};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::tasks::{TaskError, TaskResult, TaskScope, Upstream};

/// Lines per batch handed to the store while the handler runs.
pub(crate) const FLUSH_EVERY: usize = 100;
/// Age of the oldest unflushed line at which the timer hands the batch to the store anyway, so
/// that a quiet handler's lines show up live (the dashboard polls every second).
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(250);
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
    tasks: Arc<TaskScope>,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("run_id", &self.run_id)
            .field("job", &self.job)
            .field("attempt", &self.attempt)
            .field("scheduled_at", &self.scheduled_at)
            .field("task", &self.tasks.task)
            .field("cancelled", &self.cancellation.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// What a [`JobContext`] is made of, besides its logger and its token.
pub(crate) struct Attempt {
    pub run_id: i64,
    pub job: Arc<str>,
    pub attempt: u32,
    pub scheduled_at: DateTime<Utc>,
    pub params: Value,
}

impl JobContext {
    /// The context of `attempt`, whose task calls go through `tasks` (which names the same run
    /// and attempt).
    pub(crate) fn new(
        attempt: Attempt,
        cancellation: CancellationToken,
        logger: JobLogger,
        tasks: Arc<TaskScope>,
    ) -> Self {
        JobContext {
            run_id: attempt.run_id,
            job: attempt.job,
            attempt: attempt.attempt,
            scheduled_at: attempt.scheduled_at,
            params: Arc::new(attempt.params),
            cancellation,
            logger,
            tasks,
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

    /// Which task of its run this is, for a run of a broadcast, sharded or map/reduce job;
    /// `None` for a single run. [`run_id`](Self::run_id) is the task's own run id.
    pub fn task(&self) -> Option<&Task> {
        self.tasks.task.as_ref()
    }

    /// A sharded job's shard: its index, the number of shards and the job's `shard_params`
    /// entry for it.
    pub fn shard(&self) -> Option<&Shard> {
        self.task()?.shard.as_ref()
    }

    /// The run (the fire) this task belongs to: what `chime runs show` lists and a cancel
    /// names. `None` for a single run.
    pub fn parent_run_id(&self) -> Option<i64> {
        self.task().map(|t| t.parent_run_id)
    }

    /// Maps `items` to sub-tasks of this run under step name `step` (1 to 64 of `A-Z a-z 0-9
    /// _ . -`), one per item, whose params is the item; returns how many were created. Only the
    /// root task of a map/reduce job and its mapped sub-tasks map, up to the job's `map_depth`.
    ///
    /// The sub-tasks are stored before this returns and the scheduler publishes them; the
    /// job's handler runs each (see [`task`](Self::task): kind `map`, the step in
    /// [`Task::step`]). Items go in calls of at most
    /// [`MAX_MAP_ITEMS_PER_CALL`](crate::MAX_MAP_ITEMS_PER_CALL), numbered within the attempt,
    /// so a retried attempt that maps the same items in the same order makes the same sub-task
    /// keys and creates nothing twice (then returns 0): map sequentially, not from concurrent
    /// tasks, to keep the numbering stable.
    ///
    /// Errors: an item that does not serialize (naming its index), and the database's refusal
    /// naming the field (a bad step, an item over 64 KiB, too deep, too many tasks, or this is
    /// not a running root or mapped task).
    pub async fn map<I>(&self, step: &str, items: I) -> Result<u64, TaskError>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        self.tasks.map(step, items).await
    }

    /// Stores `output` (at most [`MAX_TASK_OUTPUT_BYTES`](crate::MAX_TASK_OUTPUT_BYTES) of
    /// JSON) as this run's output, for the job's reducer and the API; a later call replaces it.
    /// Any run may store one, a task or a single run.
    pub async fn set_output<T: Serialize + ?Sized>(&self, output: &T) -> Result<(), TaskError> {
        self.tasks.set_output(output).await
    }

    /// The run that ended and started this one, when this is a run of a child job (a job
    /// named in another's `on_success`, `on_failure` or `on_complete`): its id, job, state,
    /// output and error. `None` for any other run. In a task of a child job's fire (a shard, a
    /// broadcast copy, a mapped task), the run that started the fire. Not to be confused with
    /// [`parent_run_id`](Self::parent_run_id), a task's own fire.
    pub async fn parent(&self) -> Result<Option<Upstream>, TaskError> {
        self.tasks.parent().await
    }

    /// In a workflow node's run (trigger `workflow`): the latest ended run of node `node` of
    /// the same workflow run (its latest round, after a rerun): its id, job, state, output,
    /// error, end and [`node`](Upstream::node). `None` when this is no workflow node's run,
    /// when the workflow has no node of that name, or that node has no ended run (yet: the
    /// nodes this one comes after have all ended when it starts). This node's own name gives
    /// `None`. In a task of a node's run (a shard, a broadcast copy, a mapped task), the
    /// nodes of the node run's workflow run. [`parent`](Self::parent) is a child job's
    /// upstream run, never a node's.
    pub async fn upstream(&self, node: &str) -> Result<Option<Upstream>, TaskError> {
        self.tasks.upstream(node).await
    }

    /// In a reducer (a task of kind `reduce`): every other task of the run, in id order, with
    /// its state, output, error and params. Read page by page; for runs of very many tasks use
    /// [`results_page`](Self::results_page) to hold one page at a time.
    pub async fn results(&self) -> Result<Vec<TaskResult>, TaskError> {
        self.tasks.results().await
    }

    /// In a reducer: at most `page` (1 ..= [`RESULTS_PAGE`](crate::RESULTS_PAGE)) of the other
    /// tasks of the run whose id is above `after_id` (0 for the first page), in id order. The
    /// next page starts after the last id of this one; a page shorter than asked is the last.
    pub async fn results_page(
        &self,
        after_id: i64,
        page: u32,
    ) -> Result<Vec<TaskResult>, TaskError> {
        self.tasks.results_page(after_id, page).await
    }
}

/// Writes log lines that are stored with the run and also emitted as `tracing` events (target
/// `chime_worker::job`, fields `run_id`, `job`, `attempt`).
///
/// The methods never block and never fail: storing happens in the background, within about a
/// second of the call.
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

impl Clone for JobLogger {
    fn clone(&self) -> Self {
        JobLogger::new(self.sink.clone())
    }
}

impl Drop for JobLogger {
    fn drop(&mut self) {
        self.sink.state().loggers -= 1;
    }
}

impl JobLogger {
    pub(crate) fn new(sink: Arc<LogSink>) -> Self {
        sink.state().loggers += 1;
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
    /// Where batches go while the handler runs; `None` keeps every line in the buffer (the
    /// `testing` helper).
    flush: Option<mpsc::Sender<Vec<LogLine>>>,
    shared: Arc<Shared>,
}

/// What the sink shares with its flush timer.
struct Shared {
    state: Mutex<SinkState>,
    /// Rung when a line goes into an empty buffer: the timer starts counting [`FLUSH_AFTER`].
    first_line: Notify,
    /// Fires when the sink is finished or dropped: the timer ends.
    stop: CancellationToken,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, SinkState> {
        // A panic while holding this lock cannot leave the buffer inconsistent: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct SinkState {
    lines: Vec<LogLine>,
    /// Lines accepted for storage so far (at most [`MAX_LOG_LINES_PER_ATTEMPT`]).
    accepted: usize,
    /// Lines refused beyond [`MAX_LOG_LINES_PER_ATTEMPT`].
    over_limit: u64,
    /// Lines dropped because the store fell behind.
    dropped: u64,
    /// Live [`JobLogger`]s. The timer hands batches over only while one lives: once the handler
    /// has returned (and dropped its context), the attempt's flusher is draining and about to
    /// stop, and the rest belongs to [`LogSink::finish`].
    loggers: usize,
    closed: bool,
}

impl SinkState {
    /// Hands the buffered lines to `flush`, in order. If the flusher has stopped, they stay
    /// buffered (in front of any later ones) for [`LogSink::finish`]; if it is full, they are
    /// dropped and counted.
    fn hand_over(&mut self, flush: &mpsc::Sender<Vec<LogLine>>) {
        if self.lines.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.lines);
        match flush.try_send(batch) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(batch)) => self.dropped += batch.len() as u64,
            Err(mpsc::error::TrySendError::Closed(mut batch)) => {
                batch.append(&mut self.lines);
                self.lines = batch;
            }
        }
    }
}

impl LogSink {
    /// A sink that hands batches to `flush`: every [`FLUSH_EVERY`] lines, and through a timer
    /// task (when called inside a Tokio runtime) once the oldest buffered line is
    /// [`FLUSH_AFTER`] old.
    pub(crate) fn new(
        run_id: i64,
        job: Arc<str>,
        attempt: u32,
        flush: Option<mpsc::Sender<Vec<LogLine>>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(SinkState::default()),
            first_line: Notify::new(),
            stop: CancellationToken::new(),
        });
        if let Some(flush) = &flush
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(flush_timer(shared.clone(), flush.clone()));
        }
        LogSink {
            run_id,
            job,
            attempt,
            flush,
            shared,
        }
    }

    fn state(&self) -> MutexGuard<'_, SinkState> {
        self.shared.state()
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
        if state.accepted >= MAX_LOG_LINES_PER_ATTEMPT {
            state.over_limit += 1;
            return;
        }
        state.accepted += 1;
        state.lines.push(line);
        if state.lines.len() == 1 {
            self.shared.first_line.notify_one();
        }
        if let Some(flush) = &self.flush
            && state.lines.len() >= FLUSH_EVERY
        {
            state.hand_over(flush);
        }
    }

    /// Closes the sink (its timer ends) and returns the lines not yet handed to the flusher,
    /// with a final line for lines beyond the limit and a final warning if any were dropped.
    pub(crate) fn finish(&self) -> Vec<LogLine> {
        let mut state = self.state();
        state.closed = true;
        self.shared.stop.cancel();
        let mut lines = std::mem::take(&mut state.lines);
        if state.over_limit > 0 {
            lines.push(LogLine {
                at: Utc::now(),
                level: Level::Warn,
                message: format!(
                    "… {} further lines dropped (limit {MAX_LOG_LINES_PER_ATTEMPT} lines per \
                     attempt)",
                    state.over_limit
                ),
            });
        }
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

impl Drop for LogSink {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

/// One attempt's flush timer: when a line goes into an empty buffer, waits [`FLUSH_AFTER`] and
/// hands over whatever is buffered by then (unless a full batch went first). Ends with the sink.
async fn flush_timer(shared: Arc<Shared>, flush: mpsc::Sender<Vec<LogLine>>) {
    loop {
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = shared.first_line.notified() => {}
        }
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep(FLUSH_AFTER) => {}
        }
        let mut state = shared.state();
        if !state.closed && state.loggers > 0 {
            state.hand_over(&flush);
        }
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

    /// Issue 12: a handler logging every few seconds showed no line until it finished.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_handlers_lines_are_flushed_after_flush_after() {
        let (tx, mut rx) = mpsc::channel(MAX_PENDING_BATCHES);
        let logger = JobLogger::new(sink(Some(tx)));
        for round in 0..3 {
            let start = tokio::time::Instant::now();
            logger.info(format!("tick {round}"));
            tokio::time::sleep(FLUSH_AFTER / 2).await;
            logger.info(format!("tock {round}"));
            let batch = rx.recv().await.expect("a timed batch");
            assert_eq!(
                start.elapsed(),
                FLUSH_AFTER,
                "flushed when the oldest line was due"
            );
            let messages: Vec<_> = batch.iter().map(|l| l.message.as_str()).collect();
            assert_eq!(messages, [format!("tick {round}"), format!("tock {round}")]);
            // A quiet minute: nothing else is sent.
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert!(rx.try_recv().is_err());
        }
        assert!(logger.sink.finish().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn timed_and_full_batches_and_the_final_rest_keep_every_line_once_in_order() {
        let (tx, mut rx) = mpsc::channel(MAX_PENDING_BATCHES);
        let logger = JobLogger::new(sink(Some(tx)));
        let mut sent = Vec::new();
        let mut stored = Vec::new();
        for i in 0..(3 * FLUSH_EVERY + 7) {
            sent.push(format!("line {i}"));
            logger.info(format!("line {i}"));
            if i % 37 == 0 {
                tokio::time::sleep(FLUSH_AFTER).await;
            }
            while let Ok(batch) = rx.try_recv() {
                stored.extend(batch.into_iter().map(|l| l.message));
            }
        }
        stored.extend(logger.sink.finish().into_iter().map(|l| l.message));
        assert_eq!(stored, sent);
    }

    #[tokio::test(start_paused = true)]
    async fn once_the_handler_dropped_its_logger_the_rest_waits_for_finish() {
        let (tx, mut rx) = mpsc::channel(MAX_PENDING_BATCHES);
        let sink = sink(Some(tx));
        let logger = JobLogger::new(sink.clone());
        logger.info("last words");
        drop(logger);
        tokio::time::sleep(FLUSH_AFTER * 4).await;
        assert!(
            rx.try_recv().is_err(),
            "the flusher may be draining: not sent"
        );
        let rest = sink.finish();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].message, "last words");
    }

    #[tokio::test(start_paused = true)]
    async fn lines_for_a_stopped_flusher_are_kept_for_finish() {
        let (tx, rx) = mpsc::channel(MAX_PENDING_BATCHES);
        drop(rx);
        let logger = JobLogger::new(sink(Some(tx)));
        for i in 0..FLUSH_EVERY + 1 {
            logger.info(format!("line {i}"));
        }
        tokio::time::sleep(FLUSH_AFTER * 2).await;
        let rest = logger.sink.finish();
        assert_eq!(rest.len(), FLUSH_EVERY + 1);
        assert_eq!(rest[FLUSH_EVERY].message, format!("line {FLUSH_EVERY}"));
    }

    #[test]
    fn lines_beyond_the_limit_are_dropped_and_counted_in_one_marker_line() {
        let logger = JobLogger::new(sink(None));
        for i in 0..MAX_LOG_LINES_PER_ATTEMPT + 5 {
            logger.debug(format!("line {i}"));
        }
        let lines = logger.sink.finish();
        assert_eq!(lines.len(), MAX_LOG_LINES_PER_ATTEMPT + 1);
        assert_eq!(
            lines[MAX_LOG_LINES_PER_ATTEMPT - 1].message,
            format!("line {}", MAX_LOG_LINES_PER_ATTEMPT - 1)
        );
        let marker = &lines[MAX_LOG_LINES_PER_ATTEMPT];
        assert_eq!(
            marker.message,
            format!(
                "… 5 further lines dropped (limit {MAX_LOG_LINES_PER_ATTEMPT} lines per attempt)"
            )
        );
        assert_eq!(marker.level, Level::Warn);
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
