//! Shared pieces of the end-to-end tests: job specs, a recording worker, run queries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chime_scheduler::job::JobSpec;
use chime_worker::{CancellationToken, JobContext, JobError, Worker};
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row as _};

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
    pub invocations: Arc<Mutex<Vec<Invocation>>>,
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
        let invocations: Arc<Mutex<Vec<Invocation>>> = Arc::default();
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
                    seen.lock().expect("not poisoned").push(Invocation {
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

    /// Invocations per run id.
    pub fn counts(&self) -> HashMap<i64, usize> {
        let mut counts = HashMap::new();
        for i in self.invocations.lock().expect("not poisoned").iter() {
            *counts.entry(i.run_id).or_default() += 1;
        }
        counts
    }

    /// Lateness scheduled instant → handler start, in ms, as the handlers saw it, sorted.
    pub fn lateness_ms(&self) -> Vec<f64> {
        let mut ms: Vec<f64> = self
            .invocations
            .lock()
            .expect("not poisoned")
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

/// Deletes a group's exchange and queues, and the prefix's control exchange.
async fn try_delete_topology(prefix: &str, group: &str) -> Result<(), lapin::Error> {
    let connection =
        lapin::Connection::connect(chime_e2e::AMQP_URL, lapin::ConnectionProperties::default())
            .await?;
    let channel = connection.create_channel().await?;
    chime_protocol::Topology::new(prefix, group)
        .delete(&channel)
        .await?;
    // Workers and `chime runs cancel` declare the prefix's control exchange.
    channel
        .exchange_delete(
            chime_protocol::topology::control_exchange(prefix)
                .as_str()
                .into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await?;
    let _ = connection.close(200, "test done".into()).await;
    Ok(())
}

/// How long dropping an undeleted [`TopologyGuard`] waits for the broker before giving up.
const GUARD_DELETE_TIMEOUT: Duration = Duration::from_secs(15);

/// Deletes the broker topology (exchange and queues of each group, and the control exchange)
/// that a test creates under its prefix: explicitly with [`TopologyGuard::delete`] at the end
/// of the test, or, if the test panics before that, when the guard is dropped during unwinding.
///
/// Create it right after the prefix, so that it is dropped after the workers and instances.
pub struct TopologyGuard {
    prefix: String,
    groups: Vec<String>,
    deleted: bool,
}

impl TopologyGuard {
    /// Guards the topology of `groups` under `prefix`.
    pub fn new(prefix: &str, groups: &[&str]) -> Self {
        TopologyGuard {
            prefix: prefix.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            deleted: false,
        }
    }

    /// Deletes the topology now, and fails the test if the broker refuses.
    pub async fn delete(mut self) {
        for group in &self.groups {
            try_delete_topology(&self.prefix, group)
                .await
                .expect("delete topology");
        }
        self.deleted = true;
    }
}

impl Drop for TopologyGuard {
    /// Deletes the topology unless [`TopologyGuard::delete`] did. This runs inside the test's
    /// tokio runtime (which may be single-threaded and is blocked here), so the deletion runs on
    /// a thread of its own with its own runtime; a dead broker cannot hang the test past
    /// [`GUARD_DELETE_TIMEOUT`]. It never panics: it may run while the test is unwinding.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let prefix = std::mem::take(&mut self.prefix);
        let groups = std::mem::take(&mut self.groups);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => return eprintln!("TopologyGuard: no runtime: {e}"),
            };
            runtime.block_on(async {
                let deletion = async {
                    for group in &groups {
                        if let Err(e) = try_delete_topology(&prefix, group).await {
                            eprintln!("TopologyGuard: deleting {prefix}/{group}: {e}");
                        }
                    }
                };
                if tokio::time::timeout(GUARD_DELETE_TIMEOUT, deletion)
                    .await
                    .is_err()
                {
                    eprintln!("TopologyGuard: the broker did not answer; {prefix} left behind");
                }
            });
            let _ = done_tx.send(());
        });
        // The thread's own timeout bounds it; this one guards against a runtime that never
        // gets to it.
        if done_rx
            .recv_timeout(GUARD_DELETE_TIMEOUT + Duration::from_secs(5))
            .is_ok()
        {
            let _ = thread.join();
        }
    }
}

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
            "the instance to be ready",
            Duration::from_secs(30),
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

/// Passively declares `queue`: its message count if it exists, the broker's refusal if not.
async fn passive_declare(channel: &lapin::Channel, queue: &str) -> Result<u32, lapin::Error> {
    channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..lapin::options::QueueDeclareOptions::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .map(|q| q.message_count())
}

/// A test that panics after declaring its topology leaves no queue behind: its guard deletes
/// the topology while the panic unwinds.
#[tokio::test]
async fn a_test_that_panics_leaves_no_queues_behind() {
    use futures::FutureExt as _;

    let prefix = chime_e2e::unique("guard");
    let group = "guarded";
    let work_queue = chime_protocol::Topology::new(prefix.as_str(), group).work_queue();
    let connection =
        lapin::Connection::connect(chime_e2e::AMQP_URL, lapin::ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
    let outcome = std::panic::AssertUnwindSafe(async {
        let _topology = TopologyGuard::new(&prefix, &[group]);
        let channel = connection.create_channel().await.expect("channel");
        chime_protocol::Topology::new(prefix.as_str(), group)
            .declare(&channel)
            .await
            .expect("declare the topology");
        passive_declare(&channel, &work_queue)
            .await
            .expect("the work queue exists");
        panic!("the test fails before its end");
    })
    .catch_unwind()
    .await;
    assert!(outcome.is_err(), "the body panicked");

    let channel = connection.create_channel().await.expect("channel");
    let after = passive_declare(&channel, &work_queue).await;
    let _ = connection.close(200, "test done".into()).await;
    match after {
        Ok(messages) => panic!("{work_queue} is still there ({messages} messages)"),
        Err(e) => assert!(e.to_string().contains("NOT_FOUND"), "{e}"),
    }
}
