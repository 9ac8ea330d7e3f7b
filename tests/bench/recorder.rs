//! The worker side of the precision, throughput and failover scenarios: in-process SDK workers
//! whose handlers only record when they started, or worker processes of any implementation
//! started by a command (`--worker-cmd`), whose starts are read back from the database. Each
//! handler returns at once, so what is measured is Chime's path (claim, start, outcome record,
//! ack), not the handler.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use chime_e2e::Events;
use chime_e2e::process::Process;
use chime_worker::{CancellationToken, JobContext, JobError, Worker, WorkerError};
use tokio::task::JoinHandle;

use crate::sandbox::{Sandbox, bounded, now_us};
use crate::stats::Execution;

/// How the scenario's workers run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub enum WorkerKind {
    /// Rust SDK workers in this process (the default).
    #[default]
    InProcess,
    /// Worker processes started by `sh -c <command>` with the bench worker environment
    /// (docs/benchmarks.md, "Any worker"): their starts are read from the database.
    Command(String),
}

impl WorkerKind {
    /// A short description for the report's notes.
    pub fn describe(&self) -> String {
        match self {
            WorkerKind::InProcess => "Rust SDK workers in this process".to_owned(),
            WorkerKind::Command(command) => {
                format!("worker processes `{command}` (handler starts as recorded in the database)")
            }
        }
    }
}

/// How often executions are read back from the database for a command's workers.
const READ_BACK_EVERY: Duration = Duration::from_secs(1);

/// `count` workers of one group and what they ran.
pub struct Workers {
    source: Source,
}

enum Source {
    InProcess {
        executions: Events<Execution>,
        stop: CancellationToken,
        tasks: Vec<JoinHandle<Result<(), WorkerError>>>,
    },
    Processes {
        processes: Vec<Process>,
        pool: sqlx::PgPool,
        jobs: HashMap<String, u32>,
    },
}

impl Workers {
    /// Starts `count` workers of `group` with `capacity` handlers and a hold budget of `hold`
    /// deliveries each, handling every job in `jobs`; an execution of `jobs[i]` is recorded as
    /// one of job `i`.
    pub fn start(
        sandbox: &Sandbox,
        kind: &WorkerKind,
        group: &str,
        jobs: &[String],
        count: usize,
        capacity: u16,
        hold: u16,
    ) -> anyhow::Result<Workers> {
        let source = match kind {
            WorkerKind::InProcess => in_process(sandbox, group, jobs, count, capacity, hold)?,
            WorkerKind::Command(command) => {
                processes(sandbox, command, group, jobs, count, capacity, hold)?
            }
        };
        Ok(Workers { source })
    }

    /// Every execution so far.
    pub async fn executions(&self) -> anyhow::Result<Vec<Execution>> {
        match &self.source {
            Source::InProcess { executions, .. } => Ok(executions.all()),
            Source::Processes { pool, jobs, .. } => recorded(pool, jobs).await,
        }
    }

    /// The execution scheduled earliest so far, if any.
    pub async fn earliest(&self) -> anyhow::Result<Option<Execution>> {
        match &self.source {
            Source::InProcess { executions, .. } => {
                Ok(executions.with(|all| all.iter().min_by_key(|e| e.scheduled_us).copied()))
            }
            Source::Processes { .. } => Ok(self
                .executions()
                .await?
                .into_iter()
                .min_by_key(|e| e.scheduled_us)),
        }
    }

    /// Waits until `done` holds for the executions so far, or until nothing new has arrived for
    /// `quiet`, or `limit` passed. Returns whether `done` held.
    pub async fn settle(
        &self,
        done: impl Fn(&[Execution]) -> bool,
        quiet: Duration,
        limit: Duration,
    ) -> anyhow::Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut last_len = None;
        let mut last_change = tokio::time::Instant::now();
        let every = match self.source {
            Source::InProcess { .. } => Duration::from_millis(250),
            Source::Processes { .. } => READ_BACK_EVERY,
        };
        loop {
            let seen = self.executions().await?;
            if done(&seen) {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if last_len != Some(seen.len()) {
                last_len = Some(seen.len());
                last_change = now;
            }
            if now >= deadline || now - last_change >= quiet {
                return Ok(false);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Drains and stops the workers; returns every execution.
    pub async fn stop(mut self) -> anyhow::Result<Vec<Execution>> {
        match &mut self.source {
            Source::InProcess { stop, tasks, .. } => {
                stop.cancel();
                let tasks = std::mem::take(tasks);
                bounded(
                    "stopping the bench workers",
                    Duration::from_secs(60),
                    async {
                        for task in tasks {
                            task.await
                                .context("bench worker task panicked")?
                                .context("bench worker failed")?;
                        }
                        Ok(())
                    },
                )
                .await?;
            }
            Source::Processes { processes, .. } => {
                for process in processes.iter_mut() {
                    if !process.stop(Duration::from_secs(60)).await? {
                        anyhow::bail!(
                            "{} did not stop cleanly on SIGTERM; its log: {}",
                            process.name,
                            process.log().display()
                        );
                    }
                }
            }
        }
        self.executions().await
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        if let Source::InProcess { stop, .. } = &self.source {
            stop.cancel();
        }
        // Worker processes are SIGKILLed when their `Process` drops.
    }
}

fn in_process(
    sandbox: &Sandbox,
    group: &str,
    jobs: &[String],
    count: usize,
    capacity: u16,
    hold: u16,
) -> anyhow::Result<Source> {
    let executions = Events::new();
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for n in 0..count {
        let mut builder = Worker::builder(group)
            .database_url(&sandbox.database_url)
            .amqp_url(&sandbox.amqp_url)
            .prefix(&sandbox.prefix)
            .worker_id(format!("bench-{}-{n}", sandbox.scenario))
            .capacity(capacity)
            .hold(hold)
            .drain_timeout(Duration::from_secs(10));
        for (i, name) in jobs.iter().enumerate() {
            let seen = executions.clone();
            let job = u32::try_from(i).context("fewer than 2^32 jobs")?;
            builder = builder.handle(
                name.as_str(),
                move |ctx: JobContext, _: serde_json::Value| {
                    let started_us = now_us();
                    let seen = seen.clone();
                    async move {
                        let scheduled_us = ctx.scheduled_at().timestamp_micros();
                        seen.record(Execution {
                            job,
                            run_id: ctx.run_id(),
                            attempt: ctx.attempt(),
                            scheduled_us,
                            started_us,
                        });
                        Ok::<(), JobError>(())
                    }
                },
            );
        }
        let worker = builder.build().context("building a bench worker")?;
        tasks.push(tokio::spawn(worker.run(stop.clone())));
    }
    Ok(Source::InProcess {
        executions,
        stop,
        tasks,
    })
}

/// Starts `count` processes of `sh -c 'exec <command>'` with the bench worker environment.
fn processes(
    sandbox: &Sandbox,
    command: &str,
    group: &str,
    jobs: &[String],
    count: usize,
    capacity: u16,
    hold: u16,
) -> anyhow::Result<Source> {
    let mut processes = Vec::with_capacity(count);
    for n in 0..count {
        let id = format!("bench-{}-{n}", sandbox.scenario);
        let mut child = tokio::process::Command::new("sh");
        child
            .arg("-c")
            // `exec`: SIGTERM reaches the worker, not a shell waiting for it.
            .arg(format!("exec {command}"))
            .env("CHIME_DATABASE_URL", &sandbox.database_url)
            .env("CHIME_AMQP_URL", &sandbox.amqp_url)
            .env("CHIME_QUEUE_PREFIX", &sandbox.prefix)
            .env("CHIME_GROUP", group)
            .env("CHIME_WORKER_ID", &id)
            .env("CHIME_CAPACITY", capacity.to_string())
            .env("CHIME_HOLD", hold.to_string())
            .env("CHIME_JOBS", jobs.join(","));
        processes.push(Process::spawn(
            &format!("worker {id}"),
            child,
            &sandbox.path(&format!("{id}.log")),
        )?);
    }
    let jobs = jobs
        .iter()
        .enumerate()
        .map(|(i, name)| Ok((name.clone(), u32::try_from(i)?)))
        .collect::<anyhow::Result<_>>()?;
    Ok(Source::Processes {
        processes,
        pool: sandbox.store.pool().clone(),
        jobs,
    })
}

/// The finished attempts of `jobs` as executions, each started at its recorded `started_at`
/// (the handler's start on the database's clock, docs/runs.md).
async fn recorded(
    pool: &sqlx::PgPool,
    jobs: &HashMap<String, u32>,
) -> anyhow::Result<Vec<Execution>> {
    let rows: Vec<(String, i64, i32, i64, i64)> = sqlx::query_as(
        "SELECT r.job_name, a.run_id, a.attempt,
                (extract(epoch FROM r.scheduled_at) * 1000000)::bigint,
                (extract(epoch FROM a.started_at) * 1000000)::bigint
           FROM chime_attempts a JOIN chime_runs r ON r.id = a.run_id
          WHERE a.state <> 'running'",
    )
    .fetch_all(pool)
    .await
    .context("reading the recorded attempts")?;
    Ok(rows
        .into_iter()
        .filter_map(|(job, run_id, attempt, scheduled_us, started_us)| {
            Some(Execution {
                job: *jobs.get(&job)?,
                run_id,
                attempt: u32::try_from(attempt).ok()?,
                scheduled_us,
                started_us,
            })
        })
        .collect())
}
