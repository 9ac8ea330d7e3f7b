//! A scenario's private corner of the local services: a fresh database (`chime_bench_…`,
//! migrated, dropped at the end), a unique queue prefix whose exchanges and queues are deleted at
//! the end, and a temporary directory for job files and process logs (kept when the scenario
//! failed, so its logs can be read).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, bail};
use chime_e2e::process::{Process, SchedulerEnv, sibling_binary};
use chime_e2e::{TopologyGuard, passive_declare, try_wait_for};
use chime_protocol::Topology;
use chime_scheduler::leader::LeaseTimings;
use chime_scheduler::planner::PlannerTimings;
use chime_scheduler::service::ServiceConfig;
use chime_scheduler::store::Store;
use futures::FutureExt as _;
use sqlx::migrate::MigrateDatabase as _;

use crate::report::Report;

/// Where the local services are, and which binaries to run.
#[derive(Debug, Clone)]
pub struct Services {
    /// PostgreSQL server URL without a database (`postgres://postgres@127.0.0.1:5432`).
    pub postgres_url: String,
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// The `chime` binary, if given explicitly (else found next to this executable).
    pub chime: Option<PathBuf>,
    /// Keep the database and the temporary directory for inspection.
    pub keep: bool,
    /// Fired on SIGINT or SIGTERM: the running scenario stops and cleans up.
    pub interrupt: tokio_util::sync::CancellationToken,
}

impl Services {
    /// The `chime` binary: `--chime`, else `chime` next to this executable (or next to its
    /// `deps/` directory, for a test binary).
    pub fn chime_binary(&self) -> anyhow::Result<PathBuf> {
        if let Some(path) = &self.chime {
            if path.is_file() {
                return Ok(path.clone());
            }
            bail!("--chime {} is not a file", path.display());
        }
        sibling_binary("chime").context(
            "build the whole workspace first (`cargo build --release --workspace`, then run \
             target/release/chime-bench), or pass --chime PATH",
        )
    }
}

/// A scenario's database, queue prefix and temporary directory.
pub struct Sandbox {
    /// The scenario's name (used in instance ids).
    pub scenario: &'static str,
    /// URL of the scenario's own database.
    pub database_url: String,
    /// Queue prefix of every exchange and queue the scenario makes.
    pub prefix: String,
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// A pool on the scenario's database.
    pub store: Store,
    /// Job files and process logs.
    pub dir: tempfile::TempDir,
    keep: bool,
    /// Deletes the exchanges and queues of every group named through [`Sandbox::group`].
    topology: TopologyGuard,
}

impl Sandbox {
    /// Creates and migrates a fresh database and picks a unique queue prefix.
    pub async fn create(services: &Services, scenario: &'static str) -> anyhow::Result<Sandbox> {
        let name = chime_e2e::unique(&format!("chime_bench_{scenario}_"));
        let database_url = format!("{}/{name}", services.postgres_url.trim_end_matches('/'));
        sqlx::Postgres::create_database(&database_url)
            .await
            .with_context(|| {
                format!(
                    "creating database {name} on {} (is PostgreSQL running? see --postgres)",
                    chime_protocol::redact::redact_url(&services.postgres_url)
                )
            })?;
        let store = match Store::connect(&database_url, 4).await {
            Ok(store) => store,
            Err(e) => {
                let _ = sqlx::Postgres::force_drop_database(&database_url).await;
                return Err(e);
            }
        };
        if let Err(e) = store.migrate().await {
            store.pool().close().await;
            let _ = sqlx::Postgres::force_drop_database(&database_url).await;
            return Err(e);
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("chime-bench-{scenario}-"))
            .tempdir()
            .context("creating a temporary directory")?;
        eprintln!(
            "[{scenario}] database {name}, temporary files in {}",
            dir.path().display()
        );
        let prefix = chime_e2e::unique("bench");
        Ok(Sandbox {
            scenario,
            database_url,
            topology: TopologyGuard::new(&services.amqp_url, &prefix, &[]),
            prefix,
            amqp_url: services.amqp_url.clone(),
            store,
            dir,
            keep: services.keep,
        })
    }

    /// Names an executor group and remembers it, so its queues are deleted at the end.
    pub fn group(&self, name: &str) -> String {
        self.topology.add_group(name);
        name.to_owned()
    }

    /// A path in the temporary directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Starts `chime scheduler --jobs JOBS` on the sandbox as instance `instance`, logging
    /// JSON lines (so that [`Process::logged`] sees its messages) to the temporary directory.
    pub fn scheduler(&self, chime: &Path, instance: &str, jobs: &Path) -> anyhow::Result<Process> {
        let env = SchedulerEnv {
            database_url: &self.database_url,
            amqp_urls: std::slice::from_ref(&self.amqp_url),
            amqp_ca_file: None,
            prefix: &self.prefix,
            jobs,
            json_logs: true,
        };
        Process::scheduler(chime, instance, &env, self.dir.path())
    }

    /// Settings for an in-process scheduler instance: the `chime` binary's defaults (lease TTL
    /// 3 s renewed every second, lookahead 500 ms).
    pub fn service_config(&self, instance: &str) -> ServiceConfig {
        ServiceConfig {
            database_url: self.database_url.clone(),
            amqp_urls: self.amqp_url.as_str().into(),
            amqp_tls: Default::default(),
            instance_id: instance.to_owned(),
            queue_prefix: self.prefix.clone(),
            lease: LeaseTimings::default(),
            planner: PlannerTimings::default(),
        }
    }

    /// The leader lease's current term: each election adds one.
    pub async fn lease_term(&self) -> anyhow::Result<i64> {
        sqlx::query_scalar("SELECT term FROM chime_leader WHERE name = 'default'")
            .fetch_one(self.store.pool())
            .await
            .context("reading the lease's term")
    }

    /// Consumers on a group's work queue (0 while it does not exist).
    pub async fn consumers(&self, group: &str) -> anyhow::Result<u32> {
        broker_call(self.count_consumers(group)).await
    }

    async fn count_consumers(&self, group: &str) -> anyhow::Result<u32> {
        let connection =
            lapin::Connection::connect(&self.amqp_url, lapin::ConnectionProperties::default())
                .await
                .context("connecting to RabbitMQ")?;
        let channel = connection.create_channel().await?;
        let topology = Topology::new(self.prefix.clone(), group);
        // Declaring it first (idempotent, the SDK's own arguments) spares the broker's 404 on
        // a passive declare of a queue nobody declared yet.
        topology
            .declare(&channel)
            .await
            .with_context(|| format!("declaring group {group}"))?;
        let declared = passive_declare(&channel, &topology.work_queue()).await;
        let _ = connection.close(200, "counted".into()).await;
        Ok(declared.map(|q| q.consumer_count()).unwrap_or(0))
    }

    /// Waits until a group's work queue has at least `n` consumers.
    pub async fn wait_for_consumers(&self, group: &str, n: u32) -> anyhow::Result<()> {
        poll(
            Duration::from_secs(60),
            &format!("{n} consumer(s) on group {group}'s work queue"),
            || async { Ok((self.consumers(group).await? >= n).then_some(())) },
        )
        .await
    }

    /// The current lease holder, if the lease is unexpired.
    pub async fn leader(&self) -> anyhow::Result<Option<String>> {
        // Not `Store::leader`: on a fresh database the lease expires at '-infinity', which
        // that method's timestamp decoding does not survive.
        let holder: Option<Option<String>> = sqlx::query_scalar(
            "SELECT holder FROM chime_leader WHERE name = 'default' AND expires_at > now()",
        )
        .fetch_optional(self.store.pool())
        .await
        .context("reading the leader lease")?;
        Ok(holder.flatten())
    }

    /// Deletes the scenario's exchanges and queues, drops its database and removes its
    /// temporary directory (kept when `succeeded` is false or `--keep` was given).
    pub async fn finish(self, succeeded: bool) {
        let scenario = self.scenario;
        let topology = self.topology;
        // Workers' own queues outlive them (a day, `x-expires`): delete those of every worker
        // that registered in the scenario's database.
        let workers: Vec<(String, String)> =
            sqlx::query_as("SELECT group_name, id FROM chime_workers")
                .fetch_all(self.store.pool())
                .await
                .unwrap_or_default();
        for (group, id) in &workers {
            topology.add_worker_queue(group, id);
        }
        if let Err(e) = broker_call(async move { Ok(topology.try_delete().await?) }).await {
            eprintln!(
                "[{scenario}] warning: could not delete queues under {}: {e:#}",
                self.prefix
            );
        }
        self.store.pool().close().await;
        if self.keep {
            eprintln!("[{scenario}] kept database {}", self.database_url);
        } else if let Err(e) = sqlx::Postgres::force_drop_database(&self.database_url).await {
            eprintln!(
                "[{scenario}] warning: could not drop {}: {e}",
                self.database_url
            );
        }
        if self.keep || !succeeded {
            let dir = self.dir.keep();
            eprintln!("[{scenario}] kept logs and job files in {}", dir.display());
        }
    }
}

/// Runs `body` in a fresh sandbox and cleans the sandbox up afterwards, also when `body` fails
/// or panics.
pub async fn within<F>(
    services: &Services,
    scenario: &'static str,
    body: F,
) -> anyhow::Result<Report>
where
    F: AsyncFnOnce(&Sandbox) -> anyhow::Result<Report>,
{
    let sandbox = Sandbox::create(services, scenario).await?;
    // On an interrupt the body is dropped (child processes are killed, in-process schedulers
    // and workers cancelled) before the sandbox is cleaned up.
    let outcome = tokio::select! {
        outcome = AssertUnwindSafe(body(&sandbox)).catch_unwind() => {
            outcome.unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(anyhow!("the {scenario} scenario panicked: {message}"))
            })
        }
        () = services.interrupt.cancelled() => Err(anyhow!("interrupted")),
    };
    sandbox.finish(outcome.is_ok()).await;
    outcome
}

/// Bounds a call to the broker, so a broker that accepts connections but does not answer fails
/// the scenario instead of hanging it.
async fn broker_call<T>(call: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    const LIMIT: Duration = Duration::from_secs(30);
    tokio::time::timeout(LIMIT, call).await.map_err(|_| {
        anyhow!("RabbitMQ did not answer within {LIMIT:?} (is it up? `rabbitmqctl await_startup`)")
    })?
}

/// Awaits `step` of a shutdown for at most `limit`.
pub async fn bounded<T>(
    what: &str,
    limit: Duration,
    step: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(limit, step)
        .await
        .map_err(|_| anyhow!("{what} did not finish within {limit:?}"))?
}

/// A worker running in this process until its stop token fires.
pub type WorkerTask = tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>;

/// Starts `count` in-process workers of `group` on the sandbox (`bench-<scenario>-<n>`, each
/// with `capacity` handlers and what `configure` registers), running until the returned token
/// is cancelled ([`stop_in_process`]).
pub fn start_in_process(
    sandbox: &Sandbox,
    scenario: &str,
    group: &str,
    count: usize,
    capacity: u16,
    configure: impl Fn(chime_worker::WorkerBuilder) -> chime_worker::WorkerBuilder,
) -> anyhow::Result<(tokio_util::sync::CancellationToken, Vec<WorkerTask>)> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::with_capacity(count);
    for n in 0..count {
        let builder = chime_worker::Worker::builder(group)
            .database_url(&sandbox.database_url)
            .amqp_url(&sandbox.amqp_url)
            .prefix(&sandbox.prefix)
            .worker_id(format!("bench-{scenario}-{n}"))
            .capacity(capacity)
            .drain_timeout(Duration::from_secs(10));
        let worker = configure(builder)
            .build()
            .with_context(|| format!("building a {scenario} worker"))?;
        tasks.push(tokio::spawn(worker.run(stop.clone())));
    }
    Ok((stop, tasks))
}

/// Stops the in-process `workers` (cancelling `stop`) and then `scheduler`, each within a
/// minute; a worker that panicked or failed fails the run.
pub async fn stop_in_process(
    stop: &tokio_util::sync::CancellationToken,
    workers: Vec<WorkerTask>,
    scheduler: chime_e2e::Scheduler,
) -> anyhow::Result<()> {
    stop.cancel();
    for worker in workers {
        bounded("stopping a worker", Duration::from_secs(60), async {
            worker
                .await
                .context("a worker task panicked")?
                .map_err(anyhow::Error::from)
        })
        .await?;
    }
    bounded(
        "stopping the scheduler",
        Duration::from_secs(60),
        scheduler.stop(),
    )
    .await
}

/// The test kit's wait ([`chime_e2e::try_wait_for`]) for a probe that can fail: calls `check`
/// until it returns `Some`, fails at once with its error, or after `timeout` naming `what`.
pub async fn poll<T>(
    timeout: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    try_wait_for(timeout, what, async || check().await.transpose()).await?
}

/// Now, in Unix microseconds (wall clock, comparable with scheduled instants).
pub fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("before year 294,000")
}

/// Sleeps until the wall clock reads `at_us` (Unix microseconds).
pub async fn sleep_until_us(at_us: i64) {
    let wait = at_us - now_us();
    if wait > 0 {
        tokio::time::sleep(Duration::from_micros(wait as u64)).await;
    }
}

/// Writes `text` to `path`.
pub fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
