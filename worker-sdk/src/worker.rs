//! The [`Worker`]: built with [`WorkerBuilder`], it registers in PostgreSQL, consumes its
//! group's queue with bounded concurrency, and drains gracefully on shutdown.
//!
//! Shutdown, in order (tokio's graceful-shutdown shape):
//! 1. stop consuming (`basic.cancel`), so the broker sends this worker nothing more;
//! 2. let in-flight handlers finish, up to the drain timeout;
//! 3. fire the handlers' cancellation tokens and give them the cancel grace to return;
//! 4. abandon (drop) handlers that still run; every attempt is recorded, whatever happened;
//! 5. close the AMQP channels and connection, mark the worker stopped, close an owned pool.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chime_protocol::limits::MAX_UNHANDLED_WAIT;
use chime_protocol::redact::redact_url;
use chime_protocol::tls::{AmqpTls, TlsError};
use chime_protocol::topology::{DEFAULT_PREFIX, Topology};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::claims::ClaimBatcher;
use crate::consumer::{self, Broker};
use crate::context::{JobContext, LogLine};
use crate::delivery;
use crate::handler::{self, Handlers};
use crate::outcome::{JobError, Outcome};
use crate::recording::OutcomeBatcher;
use crate::store::{AttemptRecord, Store, WorkerRow};

/// PostgreSQL URL used when neither the builder nor `CHIME_DATABASE_URL` gives one: the
/// development machine's database, as the `chime` CLI's default.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/chime";
/// Environment variable of the database URL (the CLI's `database_url` setting).
pub const ENV_DATABASE_URL: &str = "CHIME_DATABASE_URL";
/// Environment variable of the RabbitMQ URL (the CLI's `amqp_url` setting).
pub const ENV_AMQP_URL: &str = "CHIME_AMQP_URL";
/// Environment variable of the queue name prefix (the CLI's `queue_prefix` setting).
pub const ENV_QUEUE_PREFIX: &str = "CHIME_QUEUE_PREFIX";
/// RabbitMQ URL used when none is given.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Concurrent handlers when none is given.
pub const DEFAULT_CAPACITY: u16 = 8;
/// Deliveries a worker may hold beyond its running handlers when none is given: triggers
/// published ahead of their instant (the scheduler's lead, 200 ms by default) waiting for it,
/// and deliveries waiting for a free handler. The consumer prefetch is `capacity + hold`.
pub const DEFAULT_HOLD: u16 = 256;
/// How long a shutdown waits for in-flight handlers before cancelling them.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a handler has to return after its cancellation token fired.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How often the worker refreshes `chime_workers.heartbeat_at`. Others judge the worker lost
/// once its heartbeat is three intervals old.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// How long a handler may run before its delivery is acked early, so that RabbitMQ's
/// `consumer_timeout` (30 min by default, not settable per queue on 3.10) never closes the
/// channel under it. From then on the heartbeat and the scheduler's rescuer protect the run.
pub const DEFAULT_ACK_AFTER: Duration = Duration::from_secs(10 * 60);
/// How long a run of a job that no online worker of the group has a handler for waits for one
/// (counted from its scheduled instant) before a worker parks it as an unknown job.
pub const DEFAULT_UNHANDLED_WAIT: Duration = Duration::from_secs(5 * 60);
/// How often outcomes that could not be written are tried again.
const UNRECORDED_RETRY: Duration = Duration::from_secs(5);
/// How long a database write keeps retrying through connection errors.
pub const DEFAULT_DB_RETRY_BUDGET: Duration = Duration::from_secs(30);

/// Why a [`WorkerBuilder`] could not build a worker. Each message says how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `Worker::builder("")`.
    #[error("executor group name is empty: pass the group to Worker::builder(\"group\")")]
    EmptyGroup,
    /// No `.handle(..)` call.
    #[error("no handlers registered: add at least one with .handle(\"job-name\", handler)")]
    NoHandlers,
    /// A job name was registered twice.
    #[error("job `{0}` has two handlers: register each job name once")]
    DuplicateJob(String),
    /// `.capacity(0)`.
    #[error("capacity must be at least 1 (got 0)")]
    ZeroCapacity,
    /// `.heartbeat_interval(Duration::ZERO)`.
    #[error("heartbeat_interval must be longer than 0, such as 500ms (the default)")]
    ZeroHeartbeat,
    /// `.unhandled_wait(..)` longer than [`MAX_UNHANDLED_WAIT`].
    #[error(
        "unhandled_wait {0:?} is longer than {MAX_UNHANDLED_WAIT:?} (limits::MAX_UNHANDLED_WAIT); \
         pass a shorter wait, such as 5 min (the default)"
    )]
    UnhandledWaitTooLong(Duration),
    /// Neither `.pool(..)` nor `.database_url(..)`. No longer returned: without either, the
    /// builder reads `CHIME_DATABASE_URL` or falls back to [`DEFAULT_DATABASE_URL`].
    #[error("no database: call .pool(pool) or .database_url(\"postgres://…\")")]
    NoDatabase,
    /// `.database_url(..)` does not parse.
    #[error(
        "invalid database URL {url}: {source}; write it as \
         postgres://user:password@host:5432/database"
    )]
    DatabaseUrl {
        /// The URL, password hidden.
        url: String,
        /// Why it does not parse.
        #[source]
        source: sqlx::Error,
    },
    /// `.amqp_tls(..)` does not fit the URL, or a certificate file named by it or by the
    /// database URL (`sslrootcert`, `sslcert`, `sslkey`) is missing or invalid.
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// Why [`Worker::run`] could not start. Once running, a worker survives broker and database
/// outages (it retries) and only returns after a shutdown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The registry row could not be written.
    #[error("cannot register worker `{worker_id}` in PostgreSQL: {source}")]
    Register {
        /// The worker's id.
        worker_id: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// Connecting, declaring the topology or consuming failed at start.
    #[error("cannot consume group `{group}` from RabbitMQ at {url}: {source}")]
    Amqp {
        /// The executor group.
        group: String,
        /// The broker URL, password redacted.
        url: String,
        /// The AMQP error.
        #[source]
        source: lapin::Error,
    },
}

enum Database {
    Pool(PgPool),
    Url(Box<PgConnectOptions>),
}

/// Configures a [`Worker`]; start with [`Worker::builder`].
#[must_use = "call .build() to get a Worker"]
pub struct WorkerBuilder {
    group: String,
    pool: Option<PgPool>,
    database_url: Option<String>,
    amqp_url: String,
    amqp_tls: AmqpTls,
    prefix: String,
    capacity: u16,
    hold: u16,
    worker_id: Option<String>,
    drain_timeout: Duration,
    cancel_grace: Duration,
    heartbeat_interval: Duration,
    db_retry_budget: Duration,
    ack_after: Duration,
    unhandled_wait: Duration,
    delivery_limit: u32,
    handlers: Handlers,
    duplicate: Option<String>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("group", &self.group)
            .field("prefix", &self.prefix)
            .field("capacity", &self.capacity)
            .field("jobs", &self.handlers.jobs())
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// Uses an existing pool (the worker does not close it).
    pub fn pool(mut self, pool: PgPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Connects to PostgreSQL at `url` (a pool of `capacity + 2` connections, closed on exit);
    /// default `CHIME_DATABASE_URL`, else [`DEFAULT_DATABASE_URL`].
    pub fn database_url(mut self, url: impl Into<String>) -> Self {
        self.database_url = Some(url.into());
        self
    }

    /// The RabbitMQ URL; default `CHIME_AMQP_URL`, else [`DEFAULT_AMQP_URL`].
    pub fn amqp_url(mut self, url: impl Into<String>) -> Self {
        self.amqp_url = url.into();
        self
    }

    /// TLS options of an `amqps://` broker URL: a CA file to trust and a client certificate to
    /// present (see `chime_protocol::tls`); default none (the system's roots, no client
    /// certificate).
    /// [`WorkerBuilder::build`] reads the files and refuses options with an `amqp://` URL.
    ///
    /// ```no_run
    /// # use chime_worker::{AmqpTls, Worker};
    /// let builder = Worker::builder("orders")
    ///     .amqp_url("amqps://chime:secret@mq.internal:5671/%2f")
    ///     .amqp_tls(
    ///         AmqpTls::new()
    ///             .ca_file("/etc/chime/tls/ca.pem")
    ///             .client_cert("/etc/chime/tls/worker.pem", "/etc/chime/tls/worker.key"),
    ///     )
    ///     .database_url(
    ///         "postgres://chime@db.internal/chime?sslmode=verify-full&sslrootcert=/etc/chime/tls/ca.pem",
    ///     );
    /// ```
    pub fn amqp_tls(mut self, tls: AmqpTls) -> Self {
        self.amqp_tls = tls;
        self
    }

    /// Name prefix of the group's exchange and queues; default `CHIME_QUEUE_PREFIX`, else
    /// `chime`. Must match the scheduler's `queue_prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Handlers that may run at once; default [`DEFAULT_CAPACITY`].
    pub fn capacity(mut self, capacity: u16) -> Self {
        self.capacity = capacity;
        self
    }

    /// Deliveries this worker may hold unacked beyond its running handlers; default
    /// [`DEFAULT_HOLD`]. The scheduler publishes each trigger a little ahead of its instant
    /// (its lead), and the worker claims it and holds it until the instant, so that at the
    /// instant only the handler has to start. Held deliveries occupy no handler slot, but they
    /// count against the prefetch, which is `capacity + hold`: set `hold` to at least the
    /// triggers this worker receives within one lead (for a group of jobs firing on the same
    /// instant, their number divided by the group's workers). A larger hold costs a little
    /// memory per message and, when the queue has a backlog, lets this worker take up to
    /// `capacity + hold` messages that an idle peer could have run.
    pub fn hold(mut self, hold: u16) -> Self {
        self.hold = hold;
        self
    }

    /// This worker's id in `chime_workers` and in the runs it executes; default
    /// `<hostname>-<pid>-<random>`. Must be unique among live workers.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// How long a shutdown waits for in-flight handlers before cancelling them; default
    /// [`DEFAULT_DRAIN_TIMEOUT`].
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// How long a handler has to return after its cancellation token fired (timeout or
    /// shutdown) before it is abandoned; default [`DEFAULT_CANCEL_GRACE`].
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// How often the worker's heartbeat is refreshed; default [`DEFAULT_HEARTBEAT_INTERVAL`].
    /// The interval is stored with the worker: it counts as lost (its runs are taken over) once
    /// its heartbeat is three intervals old.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// How long a handler may run before its delivery is acked early; default
    /// [`DEFAULT_ACK_AFTER`]. Keep it below the broker's `consumer_timeout`.
    pub fn ack_after(mut self, after: Duration) -> Self {
        self.ack_after = after;
        self
    }

    /// How long a run of a job this worker has no handler for may wait for a worker that has
    /// one, counted from the run's scheduled instant; default [`DEFAULT_UNHANDLED_WAIT`], at
    /// most [`MAX_UNHANDLED_WAIT`]. During a rolling deploy a worker receives triggers of jobs
    /// only newer (or older) workers handle: it sends one back for an online worker of the
    /// group that declares the handler, and while there is none the run stays waiting (its
    /// `reason` says until when) and comes back every 5 to 30 s; after this wait the worker
    /// parks it as an unknown job and the run is `dead`.
    pub fn unhandled_wait(mut self, wait: Duration) -> Self {
        self.unhandled_wait = wait;
        self
    }

    /// The work queue's quorum delivery limit; default
    /// [`DEFAULT_DELIVERY_LIMIT`](chime_protocol::topology::DEFAULT_DELIVERY_LIMIT). It is a queue
    /// argument, so it must match what the scheduler and the other workers of the group declare.
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// How long a database write keeps retrying through connection errors; default
    /// [`DEFAULT_DB_RETRY_BUDGET`].
    pub fn db_retry_budget(mut self, budget: Duration) -> Self {
        self.db_retry_budget = budget;
        self
    }

    /// Registers `handler` for job `job`. The run's params are decoded into `P`; if they do not
    /// decode, the attempt fails (without retry) with a message naming the job and the field.
    pub fn handle<P, F, Fut>(mut self, job: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(JobContext, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let job = job.into();
        let erased = handler::erase(&job, handler);
        if !self.handlers.insert(job.clone(), erased) && self.duplicate.is_none() {
            self.duplicate = Some(job);
        }
        self
    }

    /// Checks the configuration and builds the worker. Does no IO.
    pub fn build(self) -> Result<Worker, BuildError> {
        if self.group.is_empty() {
            return Err(BuildError::EmptyGroup);
        }
        if self.handlers.is_empty() {
            return Err(BuildError::NoHandlers);
        }
        if let Some(job) = self.duplicate {
            return Err(BuildError::DuplicateJob(job));
        }
        if self.capacity == 0 {
            return Err(BuildError::ZeroCapacity);
        }
        if self.heartbeat_interval.is_zero() {
            return Err(BuildError::ZeroHeartbeat);
        }
        if self.unhandled_wait > MAX_UNHANDLED_WAIT {
            return Err(BuildError::UnhandledWaitTooLong(self.unhandled_wait));
        }
        let database = match (self.pool, self.database_url) {
            (Some(pool), _) => Database::Pool(pool),
            (None, Some(url)) => {
                let options =
                    PgConnectOptions::from_str(&url).map_err(|source| BuildError::DatabaseUrl {
                        url: redact_url(&url),
                        source,
                    })?;
                chime_protocol::tls::check_database_url(&url)?;
                Database::Url(Box::new(options))
            }
            (None, None) => return Err(BuildError::NoDatabase),
        };
        self.amqp_tls.check(&self.amqp_url)?;
        let hostname = gethostname::gethostname().to_string_lossy().into_owned();
        let id = self
            .worker_id
            .unwrap_or_else(|| default_worker_id(&hostname));
        Ok(Worker {
            id,
            hostname,
            topology: Topology::new(self.prefix, self.group)
                .with_delivery_limit(self.delivery_limit),
            database,
            amqp_url: self.amqp_url,
            amqp_tls: self.amqp_tls,
            capacity: self.capacity,
            hold: self.hold,
            drain_timeout: self.drain_timeout,
            cancel_grace: self.cancel_grace,
            heartbeat_interval: self.heartbeat_interval,
            db_retry_budget: self.db_retry_budget,
            ack_after: self.ack_after,
            unhandled_wait: self.unhandled_wait,
            handlers: self.handlers,
        })
    }
}

fn default_worker_id(hostname: &str) -> String {
    let suffix: String = std::iter::repeat_with(fastrand::alphanumeric)
        .take(6)
        .collect::<String>()
        .to_lowercase();
    format!("{hostname}-{}-{suffix}", std::process::id())
}

/// A worker of one executor group. See the crate docs for a tour.
pub struct Worker {
    id: String,
    hostname: String,
    topology: Topology,
    database: Database,
    amqp_url: String,
    amqp_tls: AmqpTls,
    capacity: u16,
    hold: u16,
    drain_timeout: Duration,
    cancel_grace: Duration,
    heartbeat_interval: Duration,
    db_retry_budget: Duration,
    ack_after: Duration,
    unhandled_wait: Duration,
    handlers: Handlers,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("group", &self.topology.group())
            .field("queue", &self.topology.work_queue())
            .field("amqp_url", &redact_url(&self.amqp_url))
            .field("amqp_tls", &self.amqp_tls)
            .field("capacity", &self.capacity)
            .field("jobs", &self.handlers.jobs())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Starts configuring a worker of executor group `group`.
    ///
    /// The connection settings start from the same environment variables as the `chime` CLI's
    /// settings, with the same defaults; an explicit builder call wins over both:
    ///
    /// | Builder call | Environment variable | Default |
    /// | --- | --- | --- |
    /// | [`database_url`](WorkerBuilder::database_url) (or [`pool`](WorkerBuilder::pool)) | `CHIME_DATABASE_URL` | [`DEFAULT_DATABASE_URL`] |
    /// | [`amqp_url`](WorkerBuilder::amqp_url) | `CHIME_AMQP_URL` | [`DEFAULT_AMQP_URL`] |
    /// | [`prefix`](WorkerBuilder::prefix) | `CHIME_QUEUE_PREFIX` | `chime` |
    ///
    /// An empty variable counts as unset. Everything else has a builder call only.
    pub fn builder(group: impl Into<String>) -> WorkerBuilder {
        Self::builder_with_env(group.into(), |name| std::env::var(name).ok())
    }

    /// [`Worker::builder`] with the environment looked up through `env`.
    fn builder_with_env(group: String, env: impl Fn(&str) -> Option<String>) -> WorkerBuilder {
        let env = |name| env(name).filter(|value: &String| !value.is_empty());
        WorkerBuilder {
            group,
            pool: None,
            database_url: Some(
                env(ENV_DATABASE_URL).unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
            ),
            amqp_url: env(ENV_AMQP_URL).unwrap_or_else(|| DEFAULT_AMQP_URL.to_owned()),
            amqp_tls: AmqpTls::default(),
            prefix: env(ENV_QUEUE_PREFIX).unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            capacity: DEFAULT_CAPACITY,
            hold: DEFAULT_HOLD,
            worker_id: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            db_retry_budget: DEFAULT_DB_RETRY_BUDGET,
            ack_after: DEFAULT_ACK_AFTER,
            unhandled_wait: DEFAULT_UNHANDLED_WAIT,
            delivery_limit: chime_protocol::topology::DEFAULT_DELIVERY_LIMIT,
            handlers: Handlers::default(),
            duplicate: None,
        }
    }

    /// This worker's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The group's queue topology this worker consumes.
    #[cfg(test)]
    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Runs until `shutdown` fires, then drains (see the module docs) and returns.
    ///
    /// Fails only at start (registry row, first connection and consumer). After that, broker
    /// and database outages are retried and logged, never returned.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let (pool, owned_pool) = match self.database {
            Database::Pool(pool) => (pool, false),
            Database::Url(options) => (
                PgPoolOptions::new()
                    .max_connections(u32::from(self.capacity) + 2)
                    .connect_lazy_with(*options),
                true,
            ),
        };
        let jobs = self.handlers.jobs();
        let claims = ClaimBatcher::start(
            Store::new(pool.clone(), self.db_retry_budget),
            self.id.clone(),
            self.topology.group().to_owned(),
        );
        let outcomes = OutcomeBatcher::start(
            Store::new(pool.clone(), self.db_retry_budget),
            self.id.clone(),
        );
        let shared = Arc::new(Shared {
            id: self.id,
            topology: self.topology,
            handlers: self.handlers,
            store: Store::new(pool, self.db_retry_budget),
            stop_handlers: CancellationToken::new(),
            abandon: CancellationToken::new(),
            cancel_grace: self.cancel_grace,
            ack_after: self.ack_after,
            unhandled_wait: self.unhandled_wait,
            handler_slots: Semaphore::new(usize::from(self.capacity)),
            claims,
            outcomes,
            in_flight: Mutex::default(),
            released: Notify::new(),
            unrecorded: Mutex::default(),
        });
        let row = WorkerRow {
            id: &shared.id,
            group: shared.topology.group(),
            hostname: &self.hostname,
            capacity: self.capacity,
            jobs: &jobs,
            heartbeat_interval: self.heartbeat_interval,
        };
        if let Err(source) = shared.store.register_worker(&row).await {
            return Err(WorkerError::Register {
                worker_id: shared.id.clone(),
                source,
            });
        }

        let mut broker = Broker::new(self.amqp_url.clone(), self.amqp_tls.clone(), &shared.id);
        // Held deliveries are unacked too: the prefetch makes room for them next to the running
        // handlers, whose number the `handler_slots` semaphore bounds.
        let prefetch = self.capacity.saturating_add(self.hold);
        let first = match broker.open(&shared, prefetch).await {
            Ok(first) => first,
            Err(source) => {
                broker.close().await;
                shared.mark_stopped().await;
                if owned_pool {
                    shared.store.pool().close().await;
                }
                return Err(WorkerError::Amqp {
                    group: shared.topology.group().to_owned(),
                    url: redact_url(&self.amqp_url),
                    source,
                });
            }
        };
        tracing::info!(
            worker_id = %shared.id,
            group = shared.topology.group(),
            jobs = ?jobs,
            capacity = self.capacity,
            prefetch,
            "worker started"
        );

        let stop_heartbeat = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat_loop(
            shared.clone(),
            self.heartbeat_interval,
            stop_heartbeat.clone(),
        ));
        let unrecorded = tokio::spawn(unrecorded_loop(shared.clone(), stop_heartbeat.clone()));
        let tracker = TaskTracker::new();
        consumer::supervise(
            shared.clone(),
            &mut broker,
            prefetch,
            first,
            &shutdown,
            &tracker,
        )
        .await;

        drain(&shared, &tracker, self.drain_timeout).await;
        broker.close().await;
        stop_heartbeat.cancel();
        for (task, what) in [(heartbeat, "heartbeat"), (unrecorded, "outcome retry")] {
            if let Err(error) = task.await {
                tracing::error!(%error, "{what} task failed");
            }
        }
        shared.retry_unrecorded().await;
        let lost = shared.unrecorded().len();
        if lost > 0 {
            tracing::error!(
                runs = lost,
                "EXITING WITH UNRECORDED OUTCOMES: these runs stay `running` until the rescuer \
                 takes them over"
            );
        }
        shared.mark_stopped().await;
        if owned_pool {
            shared.store.pool().close().await;
        }
        tracing::info!(worker_id = %shared.id, "worker stopped");
        Ok(())
    }

    /// Runs until SIGTERM or SIGINT (Ctrl-C), then drains and returns.
    pub async fn run_until_signal(self) -> Result<(), WorkerError> {
        let shutdown = CancellationToken::new();
        let signals = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                wait_for_signal().await;
                tracing::info!("shutdown signal received; draining");
                shutdown.cancel();
            }
        });
        let result = self.run(shutdown).await;
        signals.abort();
        result
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the worker")
            }
        }
    }
    if let Err(error) = tokio::signal::ctrl_c().await {
        tracing::error!(%error, "cannot listen for Ctrl-C");
        std::future::pending::<()>().await;
    }
}

/// Waits for in-flight deliveries: drain timeout, then cancellation, then abandonment.
async fn drain(shared: &Shared, tracker: &TaskTracker, drain_timeout: Duration) {
    tracker.close();
    if tracker.is_empty() {
        return;
    }
    tracing::info!(in_flight = tracker.len(), timeout = ?drain_timeout, "draining in-flight runs");
    if tokio::time::timeout(drain_timeout, tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        in_flight = tracker.len(),
        grace = ?shared.cancel_grace,
        "drain timeout passed; cancelling the remaining handlers"
    );
    shared.stop_handlers.cancel();
    if tokio::time::timeout(shared.cancel_grace, tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    shared.abandon.cancel();
    // Abandoned handlers are recorded now; the store's own retry budget bounds that.
    let budget = shared
        .store_retry_budget()
        .saturating_add(Duration::from_secs(5));
    if tokio::time::timeout(budget, tracker.wait()).await.is_err() {
        tracing::error!(
            in_flight = tracker.len(),
            "runs still unrecorded at exit; the broker redelivers their messages"
        );
    }
}

async fn heartbeat_loop(shared: Arc<Shared>, every: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate; registration just happened
    let mut connection = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        // Past three intervals the beat is too late to matter; give up and reconnect.
        let limit = every.saturating_mul(3).max(Duration::from_secs(1));
        if let Err(error) = shared
            .store
            .heartbeat(&mut connection, &shared.id, limit)
            .await
        {
            tracing::warn!(%error, "heartbeat failed; others judge this worker lost after three missed beats");
        }
    }
    if let Some(connection) = connection
        && let Err(error) = sqlx::Connection::close(connection).await
    {
        tracing::debug!(%error, "closing the heartbeat connection");
    }
}

/// Retries outcomes that could not be written, every few seconds, apart from the heartbeat (a
/// write may wait out the store's whole retry budget).
async fn unrecorded_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(UNRECORDED_RETRY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        shared.retry_unrecorded().await;
    }
}

/// State shared by the worker's tasks.
pub(crate) struct Shared {
    pub(crate) id: String,
    pub(crate) topology: Topology,
    pub(crate) handlers: Handlers,
    pub(crate) store: Store,
    /// Parent of every handler's cancellation token; fired when the drain timeout passes.
    pub(crate) stop_handlers: CancellationToken,
    /// Fired after the cancel grace of a shutdown: drop handlers that still run.
    pub(crate) abandon: CancellationToken,
    pub(crate) cancel_grace: Duration,
    /// A handler running this long has its delivery acked early.
    pub(crate) ack_after: Duration,
    /// How long a run of a job no online worker handles may wait, from its scheduled instant.
    pub(crate) unhandled_wait: Duration,
    /// One permit per handler that may run at once (`capacity`).
    pub(crate) handler_slots: Semaphore,
    /// Claims of deliveries arriving together, in one statement.
    pub(crate) claims: ClaimBatcher,
    /// Outcomes of attempts finishing together, in one statement.
    pub(crate) outcomes: OutcomeBatcher,
    in_flight: Mutex<HashMap<i64, RunSlot>>,
    /// Notified whenever a run leaves `in_flight`.
    released: Notify,
    unrecorded: Mutex<HashMap<i64, Unrecorded>>,
}

/// How long a delivery of a later attempt waits for this worker to be done with an earlier one.
const SLOT_WAIT: Duration = Duration::from_secs(10);

/// What the worker keeps about a run it is handling: the attempt, and for control messages its
/// handler's token.
struct RunSlot {
    attempt: u32,
    token: CancellationToken,
    cancel_requested: Arc<AtomicBool>,
}

/// An attempt's outcome that could not be written yet.
#[derive(Clone)]
pub(crate) struct Unrecorded {
    pub attempt: u32,
    pub outcome: Outcome,
    /// When the retry is due, if the run is to be retried.
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub duration: Duration,
    pub lines: Vec<LogLine>,
    /// When the handler started (database clock), kept so a late write records the same start.
    pub started_at: Option<DateTime<Utc>>,
}

impl Unrecorded {
    /// The outcome as the store writes it.
    pub(crate) fn record(&self) -> AttemptRecord<'_> {
        AttemptRecord {
            outcome: &self.outcome,
            next_attempt_at: self.next_attempt_at,
            duration: self.duration,
            lines: &self.lines,
            started_at: self.started_at,
        }
    }
}

/// Whether a delivery may go on with its run.
pub(crate) enum Entered<'a> {
    /// It may; the guard leaves the run when dropped.
    Yes(InFlight<'a>),
    /// This worker is handling the same (or a later) attempt of the run.
    Duplicate,
    /// This worker is still handling an earlier attempt after [`SLOT_WAIT`].
    Busy,
}

/// Marks a run as being handled by this worker until dropped, with the handler's cancellation
/// token (fired by the timeout, the shutdown, or an operator's cancel).
pub(crate) struct InFlight<'a> {
    shared: &'a Shared,
    run_id: i64,
    /// The handler's token; a child of the worker's `stop_handlers`.
    pub token: CancellationToken,
    /// Set when an operator's cancel fired the token.
    pub cancel_requested: Arc<AtomicBool>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.shared.in_flight).remove(&self.run_id);
        self.shared.released.notify_waiters();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded maps stay consistent even if a holder panicked.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Enters run `run_id` for attempt `attempt`, unless this worker is already handling a
    /// delivery of it: of the same or an earlier attempt, that is a duplicate; of an earlier
    /// one, the caller waits (up to [`SLOT_WAIT`]) for it to be done, as a retry comes back
    /// within milliseconds when its delay is short.
    pub(crate) async fn enter(&self, run_id: i64, attempt: u32) -> Entered<'_> {
        let deadline = tokio::time::Instant::now() + SLOT_WAIT;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registers for the next release before looking, so none is missed.
            released.as_mut().enable();
            let held = {
                let mut in_flight = lock(&self.in_flight);
                match in_flight.entry(run_id) {
                    Entry::Occupied(slot) => Some(slot.get().attempt),
                    Entry::Vacant(vacant) => {
                        let token = self.stop_handlers.child_token();
                        let cancel_requested = Arc::new(AtomicBool::new(false));
                        vacant.insert(RunSlot {
                            attempt,
                            token: token.clone(),
                            cancel_requested: cancel_requested.clone(),
                        });
                        // Build the guard after the lock is released: dropping it locks again.
                        drop(in_flight);
                        return Entered::Yes(InFlight {
                            shared: self,
                            run_id,
                            token,
                            cancel_requested,
                        });
                    }
                }
            };
            if held.is_some_and(|held| held >= attempt) {
                return Entered::Duplicate;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Entered::Busy;
            }
        }
    }

    /// An operator's cancel of run `run_id`: fires its handler's token if this worker holds the
    /// run. Returns whether it did.
    pub(crate) fn cancel_run(&self, run_id: i64) -> bool {
        let in_flight = lock(&self.in_flight);
        let Some(slot) = in_flight.get(&run_id) else {
            return false;
        };
        slot.cancel_requested.store(true, Ordering::SeqCst);
        slot.token.cancel();
        true
    }

    fn unrecorded(&self) -> MutexGuard<'_, HashMap<i64, Unrecorded>> {
        lock(&self.unrecorded)
    }

    pub(crate) fn keep_unrecorded(&self, run_id: i64, pending: Unrecorded) {
        self.unrecorded().insert(run_id, pending);
    }

    /// The kept outcome of run `run_id` for a redelivery of attempt `attempt`: the attempt that
    /// ran may be later than the message's (a take-over runs the next attempt on the same
    /// message), never earlier.
    pub(crate) fn take_unrecorded(&self, run_id: i64, attempt: u32) -> Option<Unrecorded> {
        let mut unrecorded = self.unrecorded();
        if unrecorded.get(&run_id)?.attempt >= attempt {
            unrecorded.remove(&run_id)
        } else {
            None
        }
    }

    /// One more try for every outcome that could not be written (each try has the store's
    /// retry budget).
    async fn retry_unrecorded(&self) {
        let run_ids: Vec<i64> = self.unrecorded().keys().copied().collect();
        for run_id in run_ids {
            let Some(pending) = self.unrecorded().remove(&run_id) else {
                continue; // a redelivery is recording it
            };
            // An earlier try may have committed with its reply lost.
            match self
                .store
                .record_outcome(run_id, pending.attempt, &self.id, &pending.record(), true)
                .await
            {
                Ok(recorded) => {
                    // A retry or a parked copy is published when the requeued delivery comes
                    // back and finds the run `retrying` or `dead` at this attempt.
                    tracing::info!(run_id, "recorded a delayed outcome");
                    delivery::log_recorded(recorded, &pending.outcome);
                }
                Err(error) => {
                    tracing::warn!(%error, run_id, "outcome still cannot be recorded");
                    self.keep_unrecorded(run_id, pending);
                }
            }
        }
    }

    fn store_retry_budget(&self) -> Duration {
        self.store.retry_budget()
    }

    async fn mark_stopped(&self) {
        if let Err(error) = self.store.mark_stopped(&self.id).await {
            tracing::warn!(%error, "cannot mark the worker stopped in chime_workers");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn noop(_: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        Ok(())
    }

    fn lazy_pool() -> PgPool {
        PgPoolOptions::new().connect_lazy_with(PgConnectOptions::new())
    }

    #[test]
    fn build_explains_what_is_missing() {
        let err = |b: WorkerBuilder| b.build().unwrap_err().to_string();
        assert!(err(Worker::builder("").handle("a", noop)).contains("group name is empty"));
        assert!(err(Worker::builder("g").database_url("postgres://x")).contains("no handlers"));
        assert_eq!(
            err(Worker::builder("g").handle("a", noop).handle("a", noop)),
            "job `a` has two handlers: register each job name once"
        );
        assert!(
            err(Worker::builder("g")
                .handle("a", noop)
                .database_url("postgres://h:notaport/db"))
            .starts_with("invalid database URL")
        );
    }

    /// Issue 12: README's worker, with no database call, failed with "no database"; the
    /// builder reads the CLI's variables, and explicit calls win.
    #[tokio::test]
    async fn builder_reads_the_clis_environment_variables_and_explicit_calls_win() {
        let vars = [
            (ENV_DATABASE_URL, "postgres://env@db.internal/chime"),
            (ENV_AMQP_URL, "amqp://env:pw@mq.internal:5672/%2f"),
            (ENV_QUEUE_PREFIX, "envp"),
        ];
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let from_env = Worker::builder_with_env("g".into(), env);
        assert_eq!(
            from_env.database_url.as_deref(),
            Some("postgres://env@db.internal/chime")
        );
        let w = from_env.handle("a", noop).build().expect("builds");
        assert_eq!(w.amqp_url, "amqp://env:pw@mq.internal:5672/%2f");
        assert_eq!(w.topology().work_queue(), "envp.g.work");

        let explicit = Worker::builder_with_env("g".into(), env)
            .database_url("postgres://mine@h/db")
            .amqp_url("amqp://mine@h:5672/%2f")
            .prefix("mine");
        assert_eq!(
            explicit.database_url.as_deref(),
            Some("postgres://mine@h/db")
        );
        let w = explicit.handle("a", noop).build().expect("builds");
        assert_eq!(w.amqp_url, "amqp://mine@h:5672/%2f");
        assert_eq!(w.topology().work_queue(), "mine.g.work");

        let unset = |name: &str| (name == ENV_QUEUE_PREFIX).then(String::new);
        let defaults = Worker::builder_with_env("g".into(), unset);
        assert_eq!(defaults.database_url.as_deref(), Some(DEFAULT_DATABASE_URL));
        let w = defaults.handle("a", noop).build().expect("builds");
        assert_eq!(w.amqp_url, DEFAULT_AMQP_URL);
        assert_eq!(w.topology().work_queue(), "chime.g.work");
    }

    /// Issue 10: a URL that does not parse was shown whole, password included.
    #[test]
    fn build_errors_never_show_a_password() {
        let err = |b: WorkerBuilder| b.build().unwrap_err().to_string();
        let bad_port = err(Worker::builder("g")
            .handle("a", noop)
            .database_url("postgres://u:secret@h:notaport/db"));
        assert!(
            bad_port.contains("postgres://u:***@h:notaport/db"),
            "{bad_port}"
        );
        assert!(!bad_port.contains("secret"), "{bad_port}");
        let plain = err(Worker::builder("g")
            .handle("a", noop)
            .database_url("postgres://h/db")
            .amqp_url("amqp://u:secret@mq:5672/%2f")
            .amqp_tls(AmqpTls::new().ca_file("ca.pem")));
        assert!(plain.contains("write it as amqps://"), "{plain}");
        assert!(!plain.contains("secret"), "{plain}");
    }

    #[tokio::test]
    async fn build_applies_defaults() {
        let w = Worker::builder("orders")
            .pool(lazy_pool())
            .handle("a", noop)
            .build()
            .unwrap();
        assert_eq!(w.capacity, DEFAULT_CAPACITY);
        assert_eq!(w.topology().work_queue(), "chime.orders.work");
        let pid = std::process::id().to_string();
        assert!(w.id().contains(&format!("-{pid}-")), "{}", w.id());
        let zero = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .capacity(0)
            .build();
        assert!(matches!(zero, Err(BuildError::ZeroCapacity)));
        assert_eq!(w.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(w.ack_after, DEFAULT_ACK_AFTER);
        assert_eq!(w.topology().delivery_limit(), 5);
        let no_beat = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .heartbeat_interval(Duration::ZERO)
            .build();
        assert!(matches!(no_beat, Err(BuildError::ZeroHeartbeat)));
        assert_eq!(w.unhandled_wait, DEFAULT_UNHANDLED_WAIT);
        let forever = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .unhandled_wait(MAX_UNHANDLED_WAIT + Duration::from_secs(1))
            .build();
        let Err(error) = forever else {
            panic!("an unhandled_wait past the limit builds");
        };
        assert!(
            error
                .to_string()
                .starts_with("unhandled_wait 86401s is longer than 86400s"),
            "{error}"
        );
    }
}
