//! In-process SDK workers whose handlers only record when they started: the worker side of the
//! precision, throughput and failover scenarios. Each handler returns at once, so what is
//! measured is Chime's path (claim, start, outcome record, ack), not the handler.

use std::time::Duration;

use anyhow::Context as _;
use chime_e2e::Events;
use chime_worker::{CancellationToken, JobContext, JobError, Worker, WorkerError};
use tokio::task::JoinHandle;

use crate::sandbox::{Sandbox, bounded, now_us};
use crate::stats::Execution;

/// `count` workers of one group, sharing one record of executions.
pub struct Workers {
    executions: Events<Execution>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<Result<(), WorkerError>>>,
}

impl Workers {
    /// Starts `count` workers of `group` with `capacity` handlers and a hold budget of `hold`
    /// deliveries each, handling every job in `jobs`;
    /// the handler of `jobs[i]` records executions of job `i`.
    pub fn start(
        sandbox: &Sandbox,
        group: &str,
        jobs: &[String],
        count: usize,
        capacity: u16,
        hold: u16,
    ) -> anyhow::Result<Workers> {
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
        Ok(Workers {
            executions,
            stop,
            tasks,
        })
    }

    /// Every execution so far.
    pub fn executions(&self) -> Vec<Execution> {
        self.executions.all()
    }

    /// How many executions so far.
    pub fn len(&self) -> usize {
        self.executions.len()
    }

    /// The execution scheduled earliest so far, if any.
    pub fn earliest(&self) -> Option<Execution> {
        self.executions
            .with(|all| all.iter().min_by_key(|e| e.scheduled_us).copied())
    }

    /// Waits until `done` holds for the executions so far, or until nothing new has arrived for
    /// `quiet`, or `limit` passed. Returns whether `done` held.
    pub async fn settle(
        &self,
        done: impl Fn(&[Execution]) -> bool,
        quiet: Duration,
        limit: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let mut last_len = self.len();
        let mut last_change = tokio::time::Instant::now();
        loop {
            if self.executions.with(&done) {
                return true;
            }
            let now = tokio::time::Instant::now();
            let len = self.len();
            if len != last_len {
                last_len = len;
                last_change = now;
            }
            if now >= deadline || now - last_change >= quiet {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Drains and stops the workers; returns every execution.
    pub async fn stop(mut self) -> anyhow::Result<Vec<Execution>> {
        self.stop.cancel();
        let tasks = std::mem::take(&mut self.tasks);
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
        Ok(self.executions.all())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
