//! Shared pieces of the end-to-end tests: job specs, a recording worker, run queries.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chime_e2e::{Events, Setup};
use chime_scheduler::job::JobSpec;
use chime_worker::{CancellationToken, JobContext, JobError, Worker};
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row as _};

/// A connection to the local RabbitMQ.
pub async fn broker() -> lapin::Connection {
    lapin::Connection::connect(chime_e2e::AMQP_URL, lapin::ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ")
}

/// A job from its JSON form (the config-file form), with defaults for everything not given.
pub fn job(spec: serde_json::Value) -> JobSpec {
    serde_json::from_value(spec).expect("valid job spec")
}

/// One handler invocation as the worker saw it.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub run_id: i64,
    pub scheduled_at: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
}

/// A worker whose handlers record every invocation.
pub struct RecordingWorker {
    pub invocations: Events<Invocation>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>,
}

impl RecordingWorker {
    /// Starts a worker for `group` that succeeds at every job in `jobs`.
    pub fn start(
        database_url: &str,
        amqp_url: &str,
        prefix: &str,
        group: &str,
        jobs: &[&str],
    ) -> Self {
        let invocations = Events::new();
        let mut builder = Worker::builder(group)
            .database_url(database_url)
            .amqp_url(amqp_url)
            .prefix(prefix)
            .capacity(16);
        for name in jobs {
            let seen = invocations.clone();
            builder = builder.handle(*name, move |ctx: JobContext, _: serde_json::Value| {
                let seen = seen.clone();
                async move {
                    seen.record(Invocation {
                        run_id: ctx.run_id(),
                        scheduled_at: ctx.scheduled_at(),
                        started_at: Utc::now(),
                    });
                    ctx.log().info("recorded");
                    Ok::<(), JobError>(())
                }
            });
        }
        let worker = builder.build().expect("worker builds");
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone()));
        RecordingWorker {
            invocations,
            stop,
            task,
        }
    }

    /// Starts a worker of the test's group that succeeds at every job in `jobs`.
    pub fn on(t: &Setup, jobs: &[&str]) -> Self {
        Self::start(&t.database_url, &t.amqp_url, &t.prefix, &t.group, jobs)
    }

    /// Invocations per run id.
    pub fn counts(&self) -> HashMap<i64, usize> {
        self.invocations.with(|invocations| {
            let mut counts = HashMap::new();
            for i in invocations {
                *counts.entry(i.run_id).or_default() += 1;
            }
            counts
        })
    }

    /// Lateness scheduled instant → handler start, in ms, as the handlers saw it, sorted.
    pub fn lateness_ms(&self) -> Vec<f64> {
        let mut ms: Vec<f64> = self
            .invocations
            .all()
            .iter()
            .map(|i| {
                (i.started_at - i.scheduled_at)
                    .num_microseconds()
                    .unwrap_or(i64::MAX) as f64
                    / 1000.0
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        ms
    }

    /// Drains and stops the worker.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("worker task")
            .expect("worker ran cleanly");
    }
}

/// A run as the tests look at it.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: i64,
    pub scheduled_at: DateTime<Utc>,
    pub trigger: String,
    pub state: String,
    pub reason: Option<String>,
    pub term: Option<i64>,
    pub published_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Every run of `job`, by scheduled instant.
pub async fn runs(pool: &PgPool, job: &str) -> Vec<Run> {
    sqlx::query(
        "SELECT id, scheduled_at, trigger, state, reason, term, published_at, started_at,
                finished_at
         FROM chime_runs WHERE job_name = $1 ORDER BY scheduled_at, id",
    )
    .bind(job)
    .fetch_all(pool)
    .await
    .expect("query runs")
    .into_iter()
    .map(|r| Run {
        id: r.get("id"),
        scheduled_at: r.get("scheduled_at"),
        trigger: r.get("trigger"),
        state: r.get("state"),
        reason: r.get("reason"),
        term: r.get("term"),
        published_at: r.get("published_at"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
    })
    .collect()
}

/// The runs of `job` that succeeded, by scheduled instant.
pub async fn succeeded(pool: &PgPool, job: &str) -> Vec<Run> {
    let mut runs = runs(pool, job).await;
    runs.retain(|r| r.state == "succeeded");
    runs
}

/// Number of attempt rows of a run.
pub async fn attempts(pool: &PgPool, run_id: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM chime_attempts WHERE run_id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .expect("count attempts")
}

/// The current lease holder, if the lease is unexpired.
pub async fn leader(pool: &PgPool) -> Option<(String, i64)> {
    let row = sqlx::query(
        "SELECT holder, term FROM chime_leader WHERE name = 'default' AND expires_at > now()",
    )
    .fetch_optional(pool)
    .await
    .expect("read lease")?;
    let holder: Option<String> = row.get("holder");
    holder.map(|h| (h, row.get("term")))
}

/// Asserts that the scheduled instants are consecutive multiples of `step`: nothing skipped,
/// nothing doubled.
pub fn assert_consecutive(runs: &[Run], step: Duration) {
    let step = chrono::Duration::from_std(step).expect("small step");
    for pair in runs.windows(2) {
        assert_eq!(
            pair[1].scheduled_at - pair[0].scheduled_at,
            step,
            "runs {} ({}) and {} ({}) are not one step apart",
            pair[0].id,
            pair[0].scheduled_at,
            pair[1].id,
            pair[1].scheduled_at
        );
    }
}

/// Deletes a test's exchanges and queues at its end (the test kit's, with the broker's URL).
pub use chime_test_kit::TopologyGuard;

/// A scheduler instance serving the API and dashboard on a free loopback port, with one job
/// `ping` in its group, and two API tokens: an operator (`alice`) and a viewer (`grafana`).
pub struct ServingInstance {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The operator token's secret.
    pub operator: String,
    /// The viewer token's secret.
    pub viewer: String,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServingInstance {
    /// Creates the tokens, starts the instance under `prefix` and waits until `/readyz` answers.
    pub async fn start(pool: &PgPool, prefix: &str, group: &str) -> ServingInstance {
        use chime_scheduler::auth::{Caller, Role};
        use chime_scheduler::ops::Operations;
        use chime_scheduler::service::{self, DutySettings, OpsSettings};
        use chime_scheduler::store::Store;

        let ops = Operations::new(Store::from_pool(pool.clone()), None);
        let token = |name: &'static str, role| {
            let ops = &ops;
            async move {
                ops.create_token(&Caller::cli(), name, role)
                    .await
                    .expect("token")
                    .secret
            }
        };
        let operator = token("alice", Role::Operator).await;
        let viewer = token("grafana", Role::Viewer).await;

        let port = chime_e2e::services::free_port().expect("a free port");
        let db = chime_e2e::database_url(pool);
        let config = chime_e2e::service_config(
            &db,
            chime_e2e::AMQP_URL,
            &chime_e2e::unique("serving"),
            prefix,
        );
        let jobs = vec![job(serde_json::json!({"name": "ping", "group": group}))];
        let loader: service::JobLoader = Arc::new(move || Ok(jobs.clone()));
        let (_reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(service::run_serving(
            config,
            DutySettings::default(),
            OpsSettings {
                bind: Some(format!("127.0.0.1:{port}").parse().expect("address")),
                retention: None,
                ..OpsSettings::default()
            },
            loader,
            reload_rx,
            shutdown.clone(),
        ));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        chime_e2e::wait_for(
            Duration::from_secs(30),
            "the instance to be ready",
            || async {
                let response = http.get(format!("{base}/readyz")).send().await.ok()?;
                response.status().is_success().then_some(())
            },
        )
        .await;
        ServingInstance {
            base,
            operator,
            viewer,
            shutdown,
            task,
        }
    }

    /// Stops the instance gracefully and checks that it stopped cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("joined").expect("clean stop");
    }
}

/// Runs `rabbitmqctl` (RabbitMQ runs on this machine) and returns its output.
pub async fn rabbitmqctl(args: &[&str]) -> String {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .expect("rabbitmqctl (RabbitMQ runs on this machine)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
