//! Chime runner: a worker for jobs that need no code. Its config file declares the worker (group,
//! capacity, connections) and handlers bound to job names: `shell` handlers run a declared
//! program, `http` handlers call a declared endpoint.
//!
//! A trigger's params never choose what runs: they only fill `{placeholders}` the config
//! declares, each value into one argument, one environment variable or one percent-encoded URL
//! piece, checked and bounded ([`params`]). See `docs/runner.md` for the config reference.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! let config = chime_runner::config::load("runner.toml".as_ref())?;
//! chime_runner::worker(&config)
//!     .build()?
//!     .run_until_signal() // SIGTERM drains: running processes get SIGTERM, then SIGKILL
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Modules: [`config`] (the file, checked), [`template`] (placeholders), [`params`] (a run's
//! values), [`shell`] and [`http`] (the two kinds), [`output`] (output as capped log lines).

pub mod config;
pub mod http;
pub mod output;
pub mod params;
pub mod shell;
pub mod template;

use std::sync::Arc;

use chime_worker::{JobContext, JobError, Worker, WorkerBuilder};
use serde_json::Value;

use crate::config::{HandlerSpec, RunnerConfig};

/// Runs one attempt of `spec`.
pub async fn run_handler(
    spec: &HandlerSpec,
    ctx: JobContext,
    params: Value,
) -> Result<(), JobError> {
    match spec {
        HandlerSpec::Shell(shell) => shell::run(shell, ctx, params).await,
        HandlerSpec::Http(http) => http::run(http, ctx, params).await,
    }
}

/// A handler for the SDK: runs `spec` with the run's raw params.
pub fn handler(
    spec: HandlerSpec,
) -> impl Fn(JobContext, Value) -> std::pin::Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>
+ Send
+ Sync
+ 'static {
    let spec = Arc::new(spec);
    move |ctx, params| {
        let spec = spec.clone();
        Box::pin(async move { run_handler(&spec, ctx, params).await })
    }
}

/// The SDK's worker builder for `config`: its group, capacity, connections (unset ones from
/// `CHIME_DATABASE_URL`, `CHIME_AMQP_URL`, `CHIME_QUEUE_PREFIX`, then the SDK's defaults),
/// drain timeout and cancel grace, with one handler per configured job.
pub fn worker(config: &RunnerConfig) -> WorkerBuilder {
    let settings = &config.worker;
    let mut builder = Worker::builder(settings.group.as_str())
        .capacity(settings.capacity)
        .drain_timeout(settings.drain_timeout)
        .cancel_grace(settings.cancel_grace);
    if let Some(hold) = settings.hold {
        builder = builder.hold(hold);
    }
    if let Some(id) = &settings.worker_id {
        builder = builder.worker_id(id.as_str());
    }
    if let Some(url) = &settings.database_url {
        builder = builder.database_url(url.as_str());
    }
    if let Some(url) = &settings.amqp_url {
        builder = builder.amqp_url(url.as_str());
    }
    if let Some(urls) = &settings.amqp_urls {
        builder = builder.amqp_urls(urls.iter().map(String::as_str));
    }
    if let Some(prefix) = &settings.queue_prefix {
        builder = builder.prefix(prefix.as_str());
    }
    for h in &config.handlers {
        builder = builder.handle(h.job.as_str(), handler(h.spec.clone()));
    }
    builder
}

/// What `--check` prints: the worker and one line per handler.
pub fn describe(config: &RunnerConfig) -> String {
    let w = &config.worker;
    let mut out = format!(
        "worker: group {:?}, capacity {}, drain_timeout {}, cancel_grace {}\n",
        w.group,
        w.capacity,
        humantime::format_duration(w.drain_timeout),
        humantime::format_duration(w.cancel_grace)
    );
    for h in &config.handlers {
        let what = match &h.spec {
            HandlerSpec::Shell(s) => s.describe(),
            HandlerSpec::Http(s) => s.describe(),
        };
        out.push_str(&format!(
            "job {:?} -> {} handler {:?}: {what}\n",
            h.job,
            h.spec.kind(),
            h.name
        ));
    }
    out
}
