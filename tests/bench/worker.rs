//! `chime-bench worker` (hidden): an SDK worker in its own process, for the crash scenario to
//! SIGKILL. Each handler reports its start and finish as a JSON line on stdout; attempt 1 of a
//! run holds on until cancelled (it is meant to be killed mid-run), later attempts return at once.
//! `chime-bench env-worker`: an SDK worker configured by the bench worker environment, whose
//! handlers return at once, for `--worker-cmd`.

use std::time::Duration;

use anyhow::Context as _;
use chime_worker::{JobContext, JobError, Worker};
use serde::{Deserialize, Serialize};

use crate::sandbox::now_us;

/// Arguments of the hidden `worker` subcommand.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Executor group.
    #[arg(long)]
    pub group: String,
    /// Queue prefix.
    #[arg(long)]
    pub prefix: String,
    /// PostgreSQL URL of the scenario's database.
    #[arg(long)]
    pub database_url: String,
    /// RabbitMQ URL.
    #[arg(long)]
    pub amqp_url: String,
    /// Worker id.
    #[arg(long)]
    pub id: String,
    /// Concurrent handlers.
    #[arg(long, default_value_t = 8)]
    pub capacity: u16,
    /// Job names to handle, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub jobs: Vec<String>,
    /// How long attempt 1 of a run holds on (unless cancelled).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub hold: Duration,
}

/// A handler start or finish, one JSON line on the worker's stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `start` or `finish`.
    pub event: String,
    /// The worker's id.
    pub worker: String,
    /// The job.
    pub job: String,
    /// The run.
    pub run_id: i64,
    /// The attempt, 1-based.
    pub attempt: u32,
    /// When, in Unix microseconds.
    pub at_us: i64,
}

fn emit(event: &str, worker: &str, ctx: &JobContext) {
    let line = Event {
        event: event.to_owned(),
        worker: worker.to_owned(),
        job: ctx.job().to_owned(),
        run_id: ctx.run_id(),
        attempt: ctx.attempt(),
        at_us: now_us(),
    };
    // One line per event; stdout is line-buffered, so the parent sees it at once.
    println!(
        "{}",
        serde_json::to_string(&line).expect("events serialise")
    );
}

/// Runs the worker until SIGTERM.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let mut builder = Worker::builder(args.group.as_str())
        .database_url(args.database_url)
        .amqp_url(args.amqp_url)
        .prefix(args.prefix)
        .worker_id(args.id.as_str())
        .capacity(args.capacity)
        .drain_timeout(Duration::from_secs(5));
    for job in &args.jobs {
        let id = args.id.clone();
        let hold = args.hold;
        builder = builder.handle(
            job.as_str(),
            move |ctx: JobContext, _: serde_json::Value| {
                let id = id.clone();
                async move {
                    emit("start", &id, &ctx);
                    if ctx.attempt() == 1 {
                        tokio::select! {
                            () = tokio::time::sleep(hold) => {}
                            () = ctx.cancelled() => {}
                        }
                    }
                    emit("finish", &id, &ctx);
                    Ok::<(), JobError>(())
                }
            },
        );
    }
    builder
        .build()
        .context("building the worker")?
        .run_until_signal()
        .await
        .context("running the worker")?;
    Ok(())
}

/// The bench worker environment's value of `name`, which must be set.
fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("the bench worker environment needs {name}"))
}

/// Runs a worker configured by the bench worker environment (docs/benchmarks.md, "Any
/// worker") until SIGTERM: every job of `CHIME_JOBS` succeeds at once.
pub async fn run_from_env() -> anyhow::Result<()> {
    let number = |name: &str| -> anyhow::Result<u16> {
        let value = env(name)?;
        value
            .parse()
            .with_context(|| format!("{name}={value:?} is not a number from 0 to 65535"))
    };
    let mut builder = Worker::builder(env("CHIME_GROUP")?.as_str())
        .worker_id(env("CHIME_WORKER_ID")?.as_str())
        .capacity(number("CHIME_CAPACITY")?)
        .hold(number("CHIME_HOLD")?)
        .drain_timeout(Duration::from_secs(10));
    for job in env("CHIME_JOBS")?.split(',').filter(|j| !j.is_empty()) {
        builder = builder.handle(job, |_: JobContext, _: serde_json::Value| async {
            Ok::<(), JobError>(())
        });
    }
    builder
        .build()
        .context("building the worker")?
        .run_until_signal()
        .await
        .context("running the worker")?;
    Ok(())
}
