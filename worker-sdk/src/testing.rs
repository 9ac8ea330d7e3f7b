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
//! A task of a job kind is tested the same way: [`TestJob::task`] gives the handler its place
//! in the run ([`JobContext::task`], [`JobContext::shard`]), the items it maps and the output
//! it stores come back in [`TestRun::mapped`] and [`TestRun::output`], and a reducer reads the
//! results given to [`TestJob::results`]:
//!
//! ```
//! use chime_worker::{JobContext, JobError, RunState, Shard, Task, TaskKind, TaskResult, testing};
//!
//! async fn count(ctx: JobContext, _: ()) -> Result<(), JobError> {
//!     let shard = ctx.shard().ok_or_else(|| JobError::fail("not a shard"))?;
//!     ctx.set_output(&serde_json::json!({"shard": shard.index})).await?;
//!     Ok(())
//! }
//!
//! async fn total(ctx: JobContext, _: ()) -> Result<(), JobError> {
//!     let results = ctx.results().await?;
//!     let sum: u64 = results.iter().filter_map(|r| r.output.as_ref()?["shard"].as_u64()).sum();
//!     ctx.set_output(&sum).await?;
//!     Ok(())
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let task = |key: &str, kind, shard| Task {
//!     parent_run_id: 7, key: key.into(), kind, shard, worker: None, step: None, depth: None,
//! };
//! let shard = Some(Shard { index: 2, total: 3, param: None });
//! let run = testing::TestJob::new("count")
//!     .task(task("shard/2", TaskKind::Shard, shard))
//!     .run(count, serde_json::Value::Null)
//!     .await;
//! assert_eq!(run.output, Some(serde_json::json!({"shard": 2})));
//!
//! let mut shard = TaskResult::new(11, "shard/2", TaskKind::Shard, RunState::Succeeded);
//! shard.output = Some(serde_json::json!({"shard": 2}));
//! let run = testing::TestJob::new("count")
//!     .task(task("reduce", TaskKind::Reduce, None))
//!     .results(vec![shard])
//!     .run(total, serde_json::Value::Null)
//!     .await;
//! assert_eq!(run.output, Some(serde_json::json!(2)));
//! # });
//! ```
//!
//! A child job's handler gets the run that started it from [`TestJob::parent`]; a workflow
//! node's handler gets the runs of the nodes it reads from [`TestJob::upstream`].
//!
//! A panic in the handler propagates to the test (the worker records it as a failure instead).

use std::sync::{Arc, Mutex};

use chime_protocol::wire::Task;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::context::{Attempt, JobContext, JobLogger, Level, LogSink};
use crate::handler;
use crate::outcome::JobError;
use crate::tasks::{MapCall, TaskCalls, TaskError, TaskResult, TaskScope, Upstream};

/// What a test run produced.
#[derive(Debug)]
#[non_exhaustive]
pub struct TestRun {
    /// The handler's result (a params decode failure shows here as [`JobError::Fail`]).
    pub result: Result<(), JobError>,
    /// The lines the handler logged, in order.
    pub logs: Vec<(Level, String)>,
    /// What the handler mapped ([`JobContext::map`]): each call's step and items, in order (a
    /// map of more than [`MAX_MAP_ITEMS_PER_CALL`](crate::MAX_MAP_ITEMS_PER_CALL) items shows
    /// as several calls).
    pub mapped: Vec<(String, Vec<Value>)>,
    /// The output the handler stored last ([`JobContext::set_output`]).
    pub output: Option<Value>,
}

/// The task calls of a test run: kept in memory. Map calls are not checked as the database
/// checks them (step names, depth, limits); each counts all its items as created.
#[derive(Default)]
struct Recorder {
    mapped: Mutex<Vec<(String, Vec<Value>)>>,
    output: Mutex<Option<Value>>,
    results: Vec<TaskResult>,
    parent: Option<Upstream>,
    upstream: Vec<Upstream>,
}

impl TaskCalls for Recorder {
    fn map<'a>(&'a self, call: MapCall<'a>) -> BoxFuture<'a, Result<u32, TaskError>> {
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        mapped.push((call.step.to_owned(), call.items.to_vec()));
        let created = u32::try_from(call.items.len()).unwrap_or(u32::MAX);
        Box::pin(async move { Ok(created) })
    }

    fn set_output<'a>(
        &'a self,
        _run_id: i64,
        _attempt: u32,
        _worker: &'a str,
        output: &'a Value,
    ) -> BoxFuture<'a, Result<bool, TaskError>> {
        *self.output.lock().unwrap_or_else(|e| e.into_inner()) = Some(output.clone());
        Box::pin(async { Ok(true) })
    }

    fn task_results(
        &self,
        _reduce_run: i64,
        after_id: i64,
        page: u32,
    ) -> BoxFuture<'_, Result<Vec<TaskResult>, TaskError>> {
        let mut results: Vec<TaskResult> = self
            .results
            .iter()
            .filter(|r| r.id > after_id)
            .cloned()
            .collect();
        results.sort_by_key(|r| r.id);
        results.truncate(page as usize);
        Box::pin(async move { Ok(results) })
    }

    fn upstream<'a>(
        &'a self,
        _run_id: i64,
        node: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Upstream>, TaskError>> {
        let found = match node {
            None => self.parent.clone(),
            Some(node) => self
                .upstream
                .iter()
                .find(|u| u.node.as_deref() == Some(node))
                .cloned(),
        };
        Box::pin(async move { Ok(found) })
    }
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
    task: Option<Task>,
    results: Vec<TaskResult>,
    parent: Option<Upstream>,
    upstream: Vec<Upstream>,
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
            task: None,
            results: Vec::new(),
            parent: None,
            upstream: Vec::new(),
        }
    }

    /// Runs the handler as a child job's run started by `upstream` ([`JobContext::parent`]).
    pub fn parent(mut self, upstream: Upstream) -> Self {
        self.parent = Some(upstream);
        self
    }

    /// Runs the handler as a workflow node's run whose workflow run has `run`, ended, as the
    /// latest run of node `node` ([`JobContext::upstream`]); its [`node`](Upstream::node) is
    /// set to `node`. Call once per node; a node given again replaces the earlier run.
    pub fn upstream(mut self, node: impl Into<String>, mut run: Upstream) -> Self {
        let node = node.into();
        self.upstream
            .retain(|u| u.node.as_deref() != Some(node.as_str()));
        run.node = Some(node);
        self.upstream.push(run);
        self
    }

    /// Runs the handler as task `task` of a run ([`JobContext::task`]).
    pub fn task(mut self, task: Task) -> Self {
        self.task = Some(task);
        self
    }

    /// The other tasks a reducer's [`JobContext::results`] reads (a reducer runs as a task of
    /// kind `reduce`: see [`TestJob::task`]).
    pub fn results(mut self, results: Vec<TaskResult>) -> Self {
        self.results = results;
        self
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
        let recorder = Arc::new(Recorder {
            results: self.results,
            parent: self.parent,
            upstream: self.upstream,
            ..Recorder::default()
        });
        let tasks = Arc::new(TaskScope::new(
            self.run_id,
            self.attempt,
            "test-worker".into(),
            self.task,
            recorder.clone(),
        ));
        let attempt = Attempt {
            run_id: self.run_id,
            job,
            attempt: self.attempt,
            scheduled_at: self.scheduled_at,
            params: params.clone(),
        };
        let ctx = JobContext::new(
            attempt,
            self.cancellation,
            JobLogger::new(sink.clone()),
            tasks,
        );
        let result = handler(ctx, params).await;
        let logs = sink
            .finish()
            .into_iter()
            .map(|line| (line.level, line.message))
            .collect();
        let mapped =
            std::mem::take(&mut *recorder.mapped.lock().unwrap_or_else(|e| e.into_inner()));
        let output = recorder
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        TestRun {
            result,
            logs,
            mapped,
            output,
        }
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

    /// The README's child job handler: it reads the upstream run's output, and fails without
    /// one.
    async fn upload(ctx: JobContext, _: ()) -> Result<(), JobError> {
        let Some(export) = ctx.parent().await? else {
            return Err(JobError::fail("upload runs after export (on_success)"));
        };
        let file = export
            .output
            .as_ref()
            .and_then(|o| o["file"].as_str())
            .unwrap_or("?");
        ctx.log()
            .info(format!("uploading {file} from run {}", export.run_id));
        Ok(())
    }

    #[tokio::test]
    async fn a_child_handler_reads_the_upstream_run_it_is_given() {
        let mut export = Upstream::new(41, "export", chime_protocol::RunState::Succeeded);
        export.output = Some(json!({"file": "orders.csv"}));
        let run = TestJob::new("upload")
            .parent(export)
            .run(upload, Value::Null)
            .await;
        assert_eq!(run.result, Ok(()));
        assert_eq!(
            run.logs,
            [(Level::Info, "uploading orders.csv from run 41".to_owned())]
        );
        let alone = TestJob::new("upload").run(upload, Value::Null).await;
        assert_eq!(
            alone.result,
            Err(JobError::fail("upload runs after export (on_success)"))
        );
    }

    /// The README's workflow node handler: it reads the output of node `extract` of its
    /// workflow run, and fails when that node did not succeed.
    async fn clean(ctx: JobContext, _: ()) -> Result<(), JobError> {
        let Some(extract) = ctx.upstream("extract").await? else {
            return Err(JobError::fail("clean runs after node extract"));
        };
        if extract.state != chime_protocol::RunState::Succeeded {
            return Err(JobError::fail(format!("extract ended {:?}", extract.state)));
        }
        let rows = extract
            .output
            .as_ref()
            .and_then(|o| o["rows"].as_u64())
            .unwrap_or(0);
        ctx.log()
            .info(format!("cleaning {rows} rows of run {}", extract.run_id));
        Ok(())
    }

    #[tokio::test]
    async fn a_node_handler_reads_the_upstream_node_runs_it_is_given() {
        let mut extract = Upstream::new(51, "extract-orders", chime_protocol::RunState::Succeeded);
        extract.output = Some(json!({"rows": 1200}));
        let run = TestJob::new("clean-orders")
            .upstream("extract", extract)
            .run(clean, Value::Null)
            .await;
        assert_eq!(run.result, Ok(()));
        assert_eq!(
            run.logs,
            [(Level::Info, "cleaning 1200 rows of run 51".to_owned())]
        );

        let failed = Upstream::new(52, "extract-orders", chime_protocol::RunState::Dead);
        let run = TestJob::new("clean-orders")
            .upstream("extract", failed)
            .run(clean, Value::Null)
            .await;
        assert_eq!(run.result, Err(JobError::fail("extract ended Dead")));

        let alone = TestJob::new("clean-orders").run(clean, Value::Null).await;
        assert_eq!(
            alone.result,
            Err(JobError::fail("clean runs after node extract"))
        );
    }

    /// Each node name reads its own run, with `node` set; a name given again replaces the
    /// earlier run; an unknown name reads none; and `parent` stays the child job's upstream
    /// run alone (none here), as `chime_upstream_runs`' row with `node` NULL.
    #[tokio::test]
    async fn upstream_reads_each_node_by_name_and_parent_none_of_them() {
        use chime_protocol::RunState;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let run = TestJob::new("load-warehouse")
            .upstream(
                "extract",
                Upstream::new(1, "extract-orders", RunState::Failed),
            )
            .upstream("clean", Upstream::new(2, "clean-orders", RunState::Failed))
            .upstream(
                "clean",
                Upstream::new(3, "clean-orders", RunState::Succeeded),
            )
            .run(
                move |ctx: JobContext, _: ()| {
                    let record = record.clone();
                    async move {
                        let found = (
                            ctx.upstream("extract").await?,
                            ctx.upstream("clean").await?,
                            ctx.upstream("load").await?,
                            ctx.parent().await?,
                        );
                        record.lock().unwrap().push(found);
                        Ok(())
                    }
                },
                Value::Null,
            )
            .await;
        assert_eq!(run.result, Ok(()));
        let (extract, clean, load, parent) = seen.lock().unwrap().pop().unwrap();
        let extract = extract.unwrap();
        assert_eq!(
            (extract.run_id, extract.node.as_deref(), extract.state),
            (1, Some("extract"), RunState::Failed)
        );
        let clean = clean.unwrap();
        assert_eq!(
            (clean.run_id, clean.job.as_str(), clean.node.as_deref()),
            (3, "clean-orders", Some("clean"))
        );
        assert_eq!((load, parent), (None, None));

        // A child job's upstream run is no node's: `upstream` does not read it.
        let run = TestJob::new("upload")
            .parent(Upstream::new(41, "export", RunState::Succeeded))
            .run(
                |ctx: JobContext, _: ()| async move {
                    assert_eq!(ctx.upstream("export").await?, None);
                    assert_eq!(ctx.parent().await?.map(|p| p.run_id), Some(41));
                    Ok(())
                },
                Value::Null,
            )
            .await;
        assert_eq!(run.result, Ok(()));
    }
}
