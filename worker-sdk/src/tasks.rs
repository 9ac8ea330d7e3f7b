//! The calls a handler makes for a job kind's tasks (docs/protocol.md, "Job kinds and tasks"):
//! mapping sub-tasks (`chime_map`), storing its output (`chime_set_output`) and, in a reduce
//! task, reading the other tasks' results (`chime_task_results`), and in a child job's run,
//! reading the run that started it, or in a workflow node's run, the runs of the other nodes
//! (`chime_upstream_runs`); with [`TaskResult`], [`Upstream`] and [`TaskError`], their public
//! types.
//!
//! The calls go to the database through [`TaskCalls`], which the store implements (so this
//! module names no SQL) and the `testing` helper replaces with an in-memory one. One attempt's
//! calls share a [`TaskScope`]: the run, attempt and worker they act for, the task the trigger
//! describes and the attempt's map call counter, so a retried attempt that maps the same items
//! in the same order makes the same sub-task keys, and no duplicate.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use chime_protocol::RunState;
use chime_protocol::wire::{Task, TaskKind};
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::outcome::JobError;

/// Items one `chime_map` call takes; [`crate::JobContext::map`] splits larger maps into calls
/// of at most this many (the protocol's bound, as `chime_map` applies it).
pub use chime_protocol::limits::MAX_MAP_ITEMS_PER_CALL;

/// Largest output a handler may store, in bytes of JSON (the protocol's bound, as
/// `chime_set_output` applies it).
pub use chime_protocol::limits::MAX_TASK_OUTPUT_BYTES;

/// Results one `chime_task_results` call returns at most (its page).
pub const RESULTS_PAGE: u32 = 1_000;

/// One other task of a reduce task's run, as [`crate::JobContext::results`] reads it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TaskResult {
    /// The task's run id (results come in id order: creation order).
    pub id: i64,
    /// Its key in the run: `shard/<n>`, `worker/<id>`, `root`, or
    /// `<caller>/<step>/<call>/<n>` for a mapped sub-task.
    pub key: String,
    /// What it is.
    pub kind: TaskKind,
    /// A mapped sub-task's step name.
    pub step: Option<String>,
    /// A shard's index.
    pub shard_index: Option<u32>,
    /// Its state now: `succeeded`, `failed`, `dead`, `cancelled`, `lost` once it ended (the
    /// reduce task runs only after every other task ended).
    pub state: RunState,
    /// What its handler stored with `set_output`, if anything.
    pub output: Option<Value>,
    /// Its last error, if it failed.
    pub error: Option<String>,
    /// Its params (a mapped sub-task's item).
    pub params: Value,
}

impl TaskResult {
    /// A result of task `id` (key `key`, kind `kind`) in state `state`, without step, shard,
    /// output, error or params: for a reducer's unit test ([`crate::testing::TestJob::results`]);
    /// set the other fields as the test needs.
    pub fn new(id: i64, key: impl Into<String>, kind: TaskKind, state: RunState) -> Self {
        TaskResult {
            id,
            key: key.into(),
            kind,
            step: None,
            shard_index: None,
            state,
            output: None,
            error: None,
            params: Value::Null,
        }
    }
}

/// The run that ended and started this one: a child job's upstream run ([`crate::JobContext::parent`];
/// docs/runs.md, "Child runs"); or, in a workflow node's run, the latest ended run of another
/// node of the same workflow run ([`crate::JobContext::upstream`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Upstream {
    /// Its run id.
    pub run_id: i64,
    /// Its job.
    pub job: String,
    /// How it ended: `succeeded` for an `on_success` child, `failed` or `dead` for an
    /// `on_failure` one, any of them for `on_complete`; a workflow node's run, any end
    /// (`skipped` included, after an `always` edge).
    pub state: RunState,
    /// What its handler stored with `set_output`, if anything (a broadcast, sharded or
    /// map/reduce fire has none of its own: its tasks have theirs).
    pub output: Option<Value>,
    /// Its last error, if it failed.
    pub error: Option<String>,
    /// When it ended.
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The workflow node it is the run of ([`crate::JobContext::upstream`]); `None` for a
    /// child job's upstream run ([`crate::JobContext::parent`]).
    pub node: Option<String>,
}

impl Upstream {
    /// An upstream run `run_id` of job `job` that ended `state`, without output, error, end or
    /// node: for a child handler's unit test ([`crate::testing::TestJob::parent`]) or a
    /// workflow node's ([`crate::testing::TestJob::upstream`], which sets the node); set the
    /// other fields as the test needs.
    pub fn new(run_id: i64, job: impl Into<String>, state: RunState) -> Self {
        Upstream {
            run_id,
            job: job.into(),
            state,
            output: None,
            error: None,
            finished_at: None,
            node: None,
        }
    }
}

/// Why a task call did not do what was asked. Through `?` in a handler it is a retryable
/// failure like any error; [`TaskError::into_job_error`] makes the ones another attempt would
/// not fix final.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// An item given to `map` does not serialize to JSON.
    #[error("map step `{step}`: item {index} does not serialize to JSON: {source}")]
    Item {
        /// The step name given to `map`.
        step: String,
        /// The item's index (0-based) in what was given to `map`.
        index: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The output given to `set_output` does not serialize to JSON.
    #[error("the output does not serialize to JSON: {0}")]
    Output(#[source] serde_json::Error),
    /// The output is over [`MAX_TASK_OUTPUT_BYTES`].
    #[error(
        "invalid output: {bytes} bytes of JSON, over the limit of {MAX_TASK_OUTPUT_BYTES} \
         (limits::MAX_TASK_OUTPUT_BYTES); store a summary or a reference (a key, a URL), not \
         the data"
    )]
    OutputTooLarge {
        /// Its size, in bytes of JSON.
        bytes: usize,
    },
    /// The database refused a field (22023): a bad step name, too many items, sub-tasks
    /// nested deeper than the job's `map_depth`, too many tasks in the run, or a caller that is
    /// not a running root or mapped task of this worker. The message names the field, the
    /// value and the fix.
    #[error("{message}")]
    Invalid {
        /// `step`, `items`, `map_depth`, `run` or `output`.
        field: String,
        /// The value as the database saw it.
        value: Option<String>,
        /// What is wrong, and the fix.
        message: String,
    },
    /// `set_output` found the attempt no longer running on this worker (cancelled, timed out
    /// and taken over): nothing was stored.
    #[error(
        "attempt {attempt} of run {run_id} is no longer running on this worker: the output was \
         not stored"
    )]
    NotRunning {
        /// The run.
        run_id: i64,
        /// The attempt.
        attempt: u32,
    },
    /// `results` outside a reduce task.
    #[error(
        "results() is for a map/reduce job's reducer (a task of kind `reduce`); run {run_id} \
         is {what}"
    )]
    NotReduce {
        /// The run.
        run_id: i64,
        /// What it is instead.
        what: String,
    },
    /// Any other database error (the database unreachable: worth another attempt).
    #[error("task call `{call}` failed: {source}")]
    Database {
        /// `chime_map`, `chime_set_output`, `chime_task_results` or `chime_upstream_runs`.
        call: &'static str,
        /// The error.
        #[source]
        source: sqlx::Error,
    },
}

impl TaskError {
    /// True for errors another attempt may not see (the database unreachable, the attempt
    /// moved on); false for those it would see again (bad items, step, output, limits).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TaskError::Database { .. } | TaskError::NotRunning { .. }
        )
    }

    /// The handler's verdict for this error: a retryable failure when
    /// [`is_retryable`](Self::is_retryable), else a final one (`JobError::fail`).
    pub fn into_job_error(self) -> JobError {
        if self.is_retryable() {
            JobError::retry(self.to_string())
        } else {
            JobError::fail(self.to_string())
        }
    }
}

/// One `chime_map` call: attempt `attempt` of task `caller` on worker `worker` maps `items`
/// under `step`, as the attempt's call number `call_no`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MapCall<'a> {
    pub caller: i64,
    pub attempt: u32,
    pub worker: &'a str,
    pub step: &'a str,
    pub call_no: i32,
    pub items: &'a [Value],
}

/// Where a handler's task calls go: the store in a worker, memory in `testing`.
pub(crate) trait TaskCalls: Send + Sync {
    /// `chime_map`: the sub-tasks created (0 when all existed).
    fn map<'a>(&'a self, call: MapCall<'a>) -> BoxFuture<'a, Result<u32, TaskError>>;
    /// `chime_set_output`: false when the attempt is not running on the worker any more.
    fn set_output<'a>(
        &'a self,
        run_id: i64,
        attempt: u32,
        worker: &'a str,
        output: &'a Value,
    ) -> BoxFuture<'a, Result<bool, TaskError>>;
    /// `chime_task_results`: the other tasks of reduce task `reduce_run`'s run after task id
    /// `after_id`, at most `page`.
    fn task_results(
        &self,
        reduce_run: i64,
        after_id: i64,
        page: u32,
    ) -> BoxFuture<'_, Result<Vec<TaskResult>, TaskError>>;
    /// `chime_upstream_runs`: the row of run `run_id` whose `node` is `node`, if any: with
    /// `None`, the run that ended and started its fire; with a node name, the latest ended run
    /// of that node of its workflow run.
    fn upstream<'a>(
        &'a self,
        run_id: i64,
        node: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Upstream>, TaskError>>;
}

/// One attempt's task calls: what they act for, and the map call counter its context clones
/// share.
pub(crate) struct TaskScope {
    pub run_id: i64,
    pub attempt: u32,
    pub worker_id: Arc<str>,
    pub task: Option<Task>,
    calls: Arc<dyn TaskCalls>,
    /// The next `call_no` of this attempt.
    map_calls: AtomicI32,
}

impl fmt::Debug for TaskScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskScope")
            .field("run_id", &self.run_id)
            .field("attempt", &self.attempt)
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl TaskScope {
    pub(crate) fn new(
        run_id: i64,
        attempt: u32,
        worker_id: Arc<str>,
        task: Option<Task>,
        calls: Arc<dyn TaskCalls>,
    ) -> Self {
        TaskScope {
            run_id,
            attempt,
            worker_id,
            task,
            calls,
            map_calls: AtomicI32::new(0),
        }
    }

    /// Serializes `items` (naming the index of one that does not serialize) and maps them in
    /// calls of at most [`MAX_MAP_ITEMS_PER_CALL`], each with the attempt's next call number;
    /// returns the sub-tasks created.
    pub(crate) async fn map<I>(&self, step: &str, items: I) -> Result<u64, TaskError>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        let mut values = Vec::new();
        for (index, item) in items.into_iter().enumerate() {
            let value = serde_json::to_value(item).map_err(|source| TaskError::Item {
                step: step.to_owned(),
                index,
                source,
            })?;
            values.push(value);
        }
        let mut created = 0_u64;
        // The bound is a u32; on a 16-bit usize no chunk could be that large anyway.
        let per_call = usize::try_from(MAX_MAP_ITEMS_PER_CALL).unwrap_or(usize::MAX);
        for chunk in values.chunks(per_call) {
            let call_no = self.map_calls.fetch_add(1, Ordering::SeqCst);
            let call = MapCall {
                caller: self.run_id,
                attempt: self.attempt,
                worker: &self.worker_id,
                step,
                call_no,
                items: chunk,
            };
            created += u64::from(self.calls.map(call).await?);
        }
        Ok(created)
    }

    /// Stores `output` as the attempt's output, checked against [`MAX_TASK_OUTPUT_BYTES`]
    /// first.
    pub(crate) async fn set_output<T: Serialize + ?Sized>(
        &self,
        output: &T,
    ) -> Result<(), TaskError> {
        let value = serde_json::to_value(output).map_err(TaskError::Output)?;
        let bytes = chime_protocol::limits::jsonb_text_len(&value);
        if bytes > MAX_TASK_OUTPUT_BYTES {
            return Err(TaskError::OutputTooLarge { bytes });
        }
        if self
            .calls
            .set_output(self.run_id, self.attempt, &self.worker_id, &value)
            .await?
        {
            Ok(())
        } else {
            Err(TaskError::NotRunning {
                run_id: self.run_id,
                attempt: self.attempt,
            })
        }
    }

    /// The other tasks of this reduce task's run after task id `after_id`, at most `page`
    /// (1 ..= [`RESULTS_PAGE`]).
    pub(crate) async fn results_page(
        &self,
        after_id: i64,
        page: u32,
    ) -> Result<Vec<TaskResult>, TaskError> {
        let kind = self.task.as_ref().map(|t| t.kind);
        if kind != Some(TaskKind::Reduce) {
            return Err(TaskError::NotReduce {
                run_id: self.run_id,
                what: match kind {
                    None => "not a task".to_owned(),
                    Some(kind) => format!("a task of kind `{}`", kind_name(kind)),
                },
            });
        }
        self.calls
            .task_results(self.run_id, after_id, page.clamp(1, RESULTS_PAGE))
            .await
    }

    /// The run that ended and started this run's fire (a child job's), if any.
    pub(crate) async fn parent(&self) -> Result<Option<Upstream>, TaskError> {
        self.calls.upstream(self.run_id, None).await
    }

    /// The latest ended run of workflow node `node` of this run's workflow run, if any.
    pub(crate) async fn upstream(&self, node: &str) -> Result<Option<Upstream>, TaskError> {
        self.calls.upstream(self.run_id, Some(node)).await
    }

    /// Every other task of this reduce task's run, in id order, read page by page.
    pub(crate) async fn results(&self) -> Result<Vec<TaskResult>, TaskError> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = self.results_page(after, RESULTS_PAGE).await?;
            let full = page.len() == RESULTS_PAGE as usize;
            if let Some(last) = page.last() {
                after = last.id;
            }
            all.extend(page);
            if !full {
                return Ok(all);
            }
        }
    }
}

/// The wire name of a task kind (`shard`, `reduce`, …).
pub(crate) fn kind_name(kind: TaskKind) -> String {
    match serde_json::to_value(kind) {
        Ok(Value::String(name)) => name,
        _ => format!("{kind:?}"),
    }
}

/// A task kind from its wire name, `None` if unknown.
pub(crate) fn kind_from_name(name: &str) -> Option<TaskKind> {
    serde_json::from_value(Value::String(name.to_owned())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_are_the_wire_names() {
        assert_eq!(kind_name(TaskKind::Reduce), "reduce");
        assert_eq!(kind_from_name("shard"), Some(TaskKind::Shard));
        assert_eq!(kind_from_name("single"), None);
    }

    #[test]
    fn only_database_and_not_running_errors_are_retryable() {
        let invalid = TaskError::Invalid {
            field: "step".into(),
            value: Some("a b".into()),
            message: "invalid step: not a step name; use 1 to 64 characters".into(),
        };
        assert!(!invalid.is_retryable());
        assert!(!invalid.into_job_error().is_retryable());
        let gone = TaskError::NotRunning {
            run_id: 1,
            attempt: 2,
        };
        assert!(gone.into_job_error().is_retryable());
        let big = TaskError::OutputTooLarge { bytes: 70_000 };
        assert!(big.to_string().contains("limits::MAX_TASK_OUTPUT_BYTES"));
    }
}
