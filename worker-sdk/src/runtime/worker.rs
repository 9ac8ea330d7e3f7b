//! The [`Worker`] and its [`WorkerBuilder`]: the SDK's public face. The builder checks the
//! configuration (no IO); [`Worker::run`] hands it to the runtime's `run`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chime_protocol::addresses::{Addresses, AddressesError};
use chime_protocol::limits::MAX_UNHANDLED_WAIT;
use chime_protocol::redact::redact_url;
use chime_protocol::secret_file::{FILE_SUFFIX, SecretFileError};
use chime_protocol::tls::{AmqpTls, TlsError};
use chime_protocol::topology::{DEFAULT_PREFIX, Topology};
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use tokio_util::sync::CancellationToken;

use crate::context::JobContext;
use crate::handler::{self, Handlers};
pub use crate::link::MAX_QUEUE_NAME_BYTES;
use crate::outcome::JobError;

use super::run::{self, Config, Database, WorkerError};

/// PostgreSQL URL used when neither the builder nor `CHIME_DATABASE_URL` gives one: the
/// development machine's database, as the `chime` CLI's default.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/chime";
/// Environment variable of the database URL (the CLI's `database_url` setting).
pub const ENV_DATABASE_URL: &str = "CHIME_DATABASE_URL";
/// Environment variable of the RabbitMQ URL (the CLI's `amqp_url` setting).
pub const ENV_AMQP_URL: &str = "CHIME_AMQP_URL";
/// Environment variable of several RabbitMQ addresses of one cluster, comma-separated (the
/// CLI's `amqp_urls` setting); not together with [`ENV_AMQP_URL`].
pub const ENV_AMQP_URLS: &str = "CHIME_AMQP_URLS";
/// Environment variable of the queue name prefix (the CLI's `queue_prefix` setting).
pub const ENV_QUEUE_PREFIX: &str = "CHIME_QUEUE_PREFIX";
/// Environment variable of the worker's id ([`WorkerBuilder::worker_id`]); as `chime-runner`
/// and the conformance workers read it.
pub const ENV_WORKER_ID: &str = "CHIME_WORKER_ID";

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
    #[error(
        "no handlers registered: add at least one with .handle(\"job-name\", handler) (or a \
         reducer with .reducer(\"job-name\", reducer))"
    )]
    NoHandlers,
    /// A job name was registered twice.
    #[error("job `{0}` has two handlers: register each job name once")]
    DuplicateJob(String),
    /// A job's reducer was registered twice.
    #[error("job `{0}` has two reducers: register each job's reducer once")]
    DuplicateReducer(String),
    /// The worker id is empty.
    #[error(
        "worker_id is empty: pass a stable id to .worker_id(..) (or CHIME_WORKER_ID), or leave \
         both unset for <hostname>-<pid>-<random>"
    )]
    EmptyWorkerId,
    /// The worker's own queue name, `<prefix>.<group>.worker.<id>`, would be longer than
    /// [`MAX_QUEUE_NAME_BYTES`].
    #[error(
        "worker_id `{id}` is too long: the worker's queue `{queue}` would be {bytes} bytes, over \
         RabbitMQ's {MAX_QUEUE_NAME_BYTES} (MAX_QUEUE_NAME_BYTES); use a shorter worker id (or \
         prefix or group)"
    )]
    WorkerIdTooLong {
        /// The id, cut to 64 bytes.
        id: String,
        /// The queue name, cut to 64 bytes.
        queue: String,
        /// The queue name's length.
        bytes: usize,
    },
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
    /// `CHIME_DATABASE_URL_FILE` or `CHIME_AMQP_URL_FILE` names a file that gives no value.
    #[error("environment variable {variable} = {path:?}: {source}")]
    SecretFile {
        /// The `…_FILE` variable.
        variable: String,
        /// The file it names.
        path: String,
        /// What is wrong with the file.
        #[source]
        source: SecretFileError,
    },
    /// Both `CHIME_AMQP_URL` and `CHIME_AMQP_URLS` (or their `_FILE` variables) are set.
    #[error(
        "environment variables CHIME_AMQP_URL and CHIME_AMQP_URLS are both set: give one broker \
         address as CHIME_AMQP_URL or several as CHIME_AMQP_URLS, not both"
    )]
    AmqpUrlTwice,
    /// The broker addresses (`.amqp_urls(..)`, `CHIME_AMQP_URLS`) are none or too many.
    #[error("{0}")]
    AmqpAddresses(#[from] AddressesError),
    /// Both `CHIME_<KEY>` and `CHIME_<KEY>_FILE` are set.
    #[error(
        "environment variables {variable} and {variable}_FILE are both set: give the value one \
         way, the variable or the file"
    )]
    SecretTwice {
        /// The variable, without `_FILE`.
        variable: String,
    },
}

/// Configures a [`Worker`]; start with [`Worker::builder`].
#[must_use = "call .build() to get a Worker"]
pub struct WorkerBuilder {
    group: String,
    pool: Option<PgPool>,
    database_url: Option<String>,
    amqp_urls: Vec<String>,
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
    duplicate_reducer: Option<String>,
    /// A URL's `…_FILE` variable that gave no value: returned by `build` unless the URL is
    /// then given in code.
    database_url_error: Option<BuildError>,
    amqp_url_error: Option<BuildError>,
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
        self.database_url_error = None;
        self
    }

    /// The RabbitMQ URL; default `CHIME_AMQP_URL` (or `CHIME_AMQP_URLS`), else
    /// [`DEFAULT_AMQP_URL`].
    pub fn amqp_url(mut self, url: impl Into<String>) -> Self {
        self.amqp_urls = vec![url.into()];
        self.amqp_url_error = None;
        self
    }

    /// Several addresses of one RabbitMQ cluster (1 to
    /// [`MAX_AMQP_URLS`](chime_protocol::limits::MAX_AMQP_URLS)), tried in order at connect;
    /// after a lost connection the worker connects to the next one, wrapping around (the rule
    /// of `chime_protocol::addresses`, as the scheduler's). Default `CHIME_AMQP_URLS`
    /// (comma-separated); the TLS options apply to every address.
    ///
    /// ```no_run
    /// # use chime_worker::Worker;
    /// let builder = Worker::builder("orders").amqp_urls([
    ///     "amqp://chime:secret@mq-1.internal:5672/%2f",
    ///     "amqp://chime:secret@mq-2.internal:5672/%2f",
    ///     "amqp://chime:secret@mq-3.internal:5672/%2f",
    /// ]);
    /// ```
    pub fn amqp_urls<I>(mut self, urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.amqp_urls = urls.into_iter().map(Into::into).collect();
        self.amqp_url_error = None;
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
    /// `CHIME_WORKER_ID`, else `<hostname>-<pid>-<random>`. Must be unique among live workers,
    /// and short enough for the worker's own queue `<prefix>.<group>.worker.<id>` to fit in
    /// [`MAX_QUEUE_NAME_BYTES`].
    ///
    /// Give a worker that runs broadcast jobs a stable id (the same across restarts, such as
    /// the pod's or the host's name): the broadcast tasks published for it wait in its own
    /// queue, and a worker restarted under the same id runs them, while a new id starts with
    /// an empty queue.
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

    /// Registers `reducer` as job `job`'s reducer: it runs the job's reduce task (a map/reduce
    /// job's last task, published once every other task of the run has ended) instead of the
    /// job's handler, with the run's params decoded into `P`; [`JobContext::results`] reads
    /// the other tasks' outputs. The worker counts as handling `job` with a reducer alone.
    ///
    /// A reduce task reaching a worker that has the job's handler but no reducer fails (not
    /// retried), naming the job and this call.
    pub fn reducer<P, F, Fut>(mut self, job: impl Into<String>, reducer: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(JobContext, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let job = job.into();
        let erased = handler::erase(&job, reducer);
        if !self.handlers.insert_reducer(job.clone(), erased) && self.duplicate_reducer.is_none() {
            self.duplicate_reducer = Some(job);
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
        if let Some(job) = self.duplicate_reducer {
            return Err(BuildError::DuplicateReducer(job));
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
        if self.pool.is_none()
            && let Some(error) = self.database_url_error
        {
            return Err(error);
        }
        if let Some(error) = self.amqp_url_error {
            return Err(error);
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
        let amqp_urls = Addresses::new(self.amqp_urls)?;
        for url in amqp_urls.urls() {
            self.amqp_tls.check(url)?;
        }
        let hostname = gethostname::gethostname().to_string_lossy().into_owned();
        let id = self
            .worker_id
            .unwrap_or_else(|| default_worker_id(&hostname));
        let topology =
            Topology::new(self.prefix, self.group).with_delivery_limit(self.delivery_limit);
        check_worker_id(&topology, &id)?;
        Ok(Worker {
            config: Config {
                id,
                hostname,
                topology,
                database,
                amqp_urls,
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
            },
        })
    }
}

/// The worker id is not empty and its queue's name fits in [`MAX_QUEUE_NAME_BYTES`].
fn check_worker_id(topology: &Topology, id: &str) -> Result<(), BuildError> {
    if id.is_empty() {
        return Err(BuildError::EmptyWorkerId);
    }
    let queue = topology.worker_queue(id);
    if queue.len() > MAX_QUEUE_NAME_BYTES {
        return Err(BuildError::WorkerIdTooLong {
            id: chime_protocol::limits::cap_bytes(id, 64).into_owned(),
            queue: chime_protocol::limits::cap_bytes(&queue, 64).into_owned(),
            bytes: queue.len(),
        });
    }
    Ok(())
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
    config: Config,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.config.id)
            .field("group", &self.config.topology.group())
            .field("queue", &self.config.topology.work_queue())
            .field("amqp_urls", &self.config.amqp_urls)
            .field("amqp_tls", &self.config.amqp_tls)
            .field("capacity", &self.config.capacity)
            .field("jobs", &self.config.handlers.jobs())
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
    /// | [`amqp_urls`](WorkerBuilder::amqp_urls) | `CHIME_AMQP_URLS` (comma-separated; not with `CHIME_AMQP_URL`) | |
    /// | [`prefix`](WorkerBuilder::prefix) | `CHIME_QUEUE_PREFIX` | `chime` |
    /// | [`worker_id`](WorkerBuilder::worker_id) | `CHIME_WORKER_ID` | `<hostname>-<pid>-<random>` |
    ///
    /// An empty variable counts as unset. Everything else has a builder call only.
    pub fn builder(group: impl Into<String>) -> WorkerBuilder {
        Self::builder_with_env(group.into(), |name| std::env::var(name).ok())
    }

    /// [`Worker::builder`] with the environment looked up through `env`.
    fn builder_with_env(group: String, env: impl Fn(&str) -> Option<String>) -> WorkerBuilder {
        let env = |name: &str| env(name).filter(|value: &String| !value.is_empty());
        let (database_url, database_url_error) = value_or_file(&env, ENV_DATABASE_URL);
        let (amqp_url, amqp_url_error) = value_or_file(&env, ENV_AMQP_URL);
        let (amqp_list, amqp_list_error) = value_or_file(&env, ENV_AMQP_URLS);
        let (amqp_urls, amqp_url_error) = match (amqp_url, amqp_list) {
            (Some(_), Some(_)) => (Vec::new(), Some(BuildError::AmqpUrlTwice)),
            (None, Some(list)) => (
                chime_protocol::addresses::split_list(&list),
                amqp_list_error,
            ),
            (Some(url), None) => (vec![url], amqp_url_error.or(amqp_list_error)),
            (None, None) => (
                vec![DEFAULT_AMQP_URL.to_owned()],
                amqp_url_error.or(amqp_list_error),
            ),
        };
        WorkerBuilder {
            group,
            pool: None,
            database_url: Some(database_url.unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned())),
            amqp_urls,
            database_url_error,
            amqp_url_error,
            amqp_tls: AmqpTls::default(),
            prefix: env(ENV_QUEUE_PREFIX).unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            capacity: DEFAULT_CAPACITY,
            hold: DEFAULT_HOLD,
            worker_id: env(ENV_WORKER_ID),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            db_retry_budget: DEFAULT_DB_RETRY_BUDGET,
            ack_after: DEFAULT_ACK_AFTER,
            unhandled_wait: DEFAULT_UNHANDLED_WAIT,
            delivery_limit: chime_protocol::topology::DEFAULT_DELIVERY_LIMIT,
            handlers: Handlers::default(),
            duplicate: None,
            duplicate_reducer: None,
        }
    }

    /// This worker's id.
    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// The group's queue topology this worker consumes.
    #[cfg(test)]
    pub(crate) fn topology(&self) -> &Topology {
        &self.config.topology
    }

    /// Runs until `shutdown` fires, then drains (stops consuming, lets in-flight handlers
    /// finish up to the drain timeout, cancels the rest, records every attempt) and returns.
    ///
    /// Fails only at start (registry row, first connection and consumer). After that, broker
    /// and database outages are retried and logged, never returned.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        run::run(self.config, shutdown).await
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

/// Variable `name`'s value, or the value in the file `name_FILE` names (a mounted secret:
/// `chime_protocol::secret_file`); with the error to return from `build` when that file gives
/// none or both are set.
fn value_or_file(
    env: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> (Option<String>, Option<BuildError>) {
    let variable = format!("{name}{FILE_SUFFIX}");
    match (env(name), env(&variable)) {
        (value, None) => (value, None),
        (Some(value), Some(_)) => (
            Some(value),
            Some(BuildError::SecretTwice {
                variable: name.to_owned(),
            }),
        ),
        (None, Some(path)) => match chime_protocol::secret_file::read(Path::new(&path)) {
            Ok(value) => (Some(value), None),
            Err(source) => (
                None,
                Some(BuildError::SecretFile {
                    variable,
                    path,
                    source,
                }),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::postgres::PgPoolOptions;

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
        assert_eq!(
            w.config.amqp_urls.urls(),
            ["amqp://env:pw@mq.internal:5672/%2f"]
        );
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
        assert_eq!(w.config.amqp_urls.urls(), ["amqp://mine@h:5672/%2f"]);
        assert_eq!(w.topology().work_queue(), "mine.g.work");

        let unset = |name: &str| (name == ENV_QUEUE_PREFIX).then(String::new);
        let defaults = Worker::builder_with_env("g".into(), unset);
        assert_eq!(defaults.database_url.as_deref(), Some(DEFAULT_DATABASE_URL));
        let w = defaults.handle("a", noop).build().expect("builds");
        assert_eq!(w.config.amqp_urls.urls(), [DEFAULT_AMQP_URL]);
        assert_eq!(w.topology().work_queue(), "chime.g.work");
    }

    /// The URLs come from the files `CHIME_DATABASE_URL_FILE` and `CHIME_AMQP_URL_FILE` name (a
    /// mounted secret); a file that gives no value, or a URL given both ways, fails `build`
    /// naming the variable, unless the URL is then given in code.
    #[tokio::test]
    async fn the_urls_come_from_secret_files_and_a_bad_one_fails_the_build() {
        let dir = std::env::temp_dir().join(format!("chime-sdk-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("db"), "postgres://file:pw@db.internal/chime\n").unwrap();
        std::fs::write(dir.join("mq"), "amqp://file:pw@mq.internal:5672/%2f\n").unwrap();
        std::fs::write(dir.join("empty"), "").unwrap();
        let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
        let with = |vars: Vec<(&'static str, String)>| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
            }
        };

        let files = with(vec![
            ("CHIME_DATABASE_URL_FILE", path("db")),
            ("CHIME_AMQP_URL_FILE", path("mq")),
        ]);
        let builder = Worker::builder_with_env("g".into(), files);
        assert_eq!(
            builder.database_url.as_deref(),
            Some("postgres://file:pw@db.internal/chime")
        );
        let w = builder.handle("a", noop).build().expect("builds");
        assert_eq!(
            w.config.amqp_urls.urls(),
            ["amqp://file:pw@mq.internal:5672/%2f"]
        );

        let empty = with(vec![("CHIME_AMQP_URL_FILE", path("empty"))]);
        let error = Worker::builder_with_env("g".into(), &empty)
            .handle("a", noop)
            .build()
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            format!(
                "environment variable CHIME_AMQP_URL_FILE = {:?}: the file is empty; write the \
                 value into it",
                path("empty")
            )
        );
        // Given in code, the URL no longer needs the file.
        Worker::builder_with_env("g".into(), &empty)
            .amqp_url("amqp://mine@h:5672/%2f")
            .handle("a", noop)
            .build()
            .expect("the explicit URL wins");

        let twice = with(vec![
            ("CHIME_DATABASE_URL", "postgres://env@db/chime".to_owned()),
            ("CHIME_DATABASE_URL_FILE", path("missing")),
        ]);
        let error = Worker::builder_with_env("g".into(), &twice)
            .handle("a", noop)
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "environment variables CHIME_DATABASE_URL and CHIME_DATABASE_URL_FILE are both set"
            ),
            "{error}"
        );
        // A pool of its own needs no database URL at all.
        Worker::builder_with_env("g".into(), &twice)
            .pool(lazy_pool())
            .handle("a", noop)
            .build()
            .expect("the pool wins");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The worker id comes from CHIME_WORKER_ID unless given; it must be non-empty and fit
    /// the worker's own queue name in 255 bytes; reducers count as handled jobs.
    #[tokio::test]
    async fn the_worker_id_is_read_from_the_environment_and_bounded_by_its_queue_name() {
        let env = |name: &str| (name == ENV_WORKER_ID).then(|| "pod-7".to_owned());
        let w = Worker::builder_with_env("g".into(), env)
            .pool(lazy_pool())
            .handle("a", noop)
            .build()
            .unwrap();
        assert_eq!(w.id(), "pod-7");
        assert_eq!(w.topology().worker_queue(w.id()), "chime.g.worker.pod-7");
        let explicit = Worker::builder_with_env("g".into(), env)
            .pool(lazy_pool())
            .handle("a", noop)
            .worker_id("mine")
            .build()
            .unwrap();
        assert_eq!(explicit.id(), "mine");
        let err = |id: &str| {
            Worker::builder("g")
                .pool(lazy_pool())
                .handle("a", noop)
                .worker_id(id)
                .build()
                .unwrap_err()
                .to_string()
        };
        // `chime.g.worker.` is 15 bytes: 240 more fit, 241 do not.
        let fits = "x".repeat(MAX_QUEUE_NAME_BYTES - 15);
        assert!(
            Worker::builder("g")
                .pool(lazy_pool())
                .handle("a", noop)
                .worker_id(fits)
                .build()
                .is_ok()
        );
        let long = err(&"x".repeat(MAX_QUEUE_NAME_BYTES - 14));
        assert!(
            long.starts_with("worker_id `xxx") && long.contains("would be 256 bytes, over"),
            "{long}"
        );
        assert!(err("").starts_with("worker_id is empty"));
        let twice = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .reducer("a", noop)
            .reducer("a", noop)
            .build()
            .unwrap_err();
        assert_eq!(
            twice.to_string(),
            "job `a` has two reducers: register each job's reducer once"
        );
        let reducer_only = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .reducer("b", noop)
            .build()
            .unwrap();
        assert_eq!(reducer_only.config.handlers.jobs(), ["a", "b"]);
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
        assert_eq!(w.config.capacity, DEFAULT_CAPACITY);
        assert_eq!(w.topology().work_queue(), "chime.orders.work");
        let pid = std::process::id().to_string();
        assert!(w.id().contains(&format!("-{pid}-")), "{}", w.id());
        let zero = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .capacity(0)
            .build();
        assert!(matches!(zero, Err(BuildError::ZeroCapacity)));
        assert_eq!(w.config.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(w.config.ack_after, DEFAULT_ACK_AFTER);
        assert_eq!(w.topology().delivery_limit(), 5);
        let no_beat = Worker::builder("g")
            .pool(lazy_pool())
            .handle("a", noop)
            .heartbeat_interval(Duration::ZERO)
            .build();
        assert!(matches!(no_beat, Err(BuildError::ZeroHeartbeat)));
        assert_eq!(w.config.unhandled_wait, DEFAULT_UNHANDLED_WAIT);
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
    /// `CHIME_AMQP_URLS` (or `.amqp_urls(..)`) gives several addresses; with `CHIME_AMQP_URL`
    /// too the build fails naming both, and more than `MAX_AMQP_URLS` fail it with the limit.
    #[tokio::test]
    async fn several_broker_addresses_come_from_amqp_urls_and_are_bounded() {
        let list = "amqp://a:pw@mq-1:5672/%2f, amqp://a:pw@mq-2:5672/%2f,amqp://a:pw@mq-3:5672/%2f";
        let env = |name: &str| (name == ENV_AMQP_URLS).then(|| list.to_owned());
        let w = Worker::builder_with_env("g".into(), env)
            .pool(lazy_pool())
            .handle("a", noop)
            .build()
            .expect("builds");
        assert_eq!(
            w.config.amqp_urls.urls(),
            [
                "amqp://a:pw@mq-1:5672/%2f",
                "amqp://a:pw@mq-2:5672/%2f",
                "amqp://a:pw@mq-3:5672/%2f"
            ]
        );
        assert!(!format!("{w:?}").contains(":pw@"), "{w:?}");

        let both = |name: &str| match name {
            ENV_AMQP_URL => Some("amqp://a:pw@mq-1:5672/%2f".to_owned()),
            ENV_AMQP_URLS => Some(list.to_owned()),
            _ => None,
        };
        let error = Worker::builder_with_env("g".into(), both)
            .pool(lazy_pool())
            .handle("a", noop)
            .build()
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "environment variables CHIME_AMQP_URL and CHIME_AMQP_URLS are both set: give one \
             broker address as CHIME_AMQP_URL or several as CHIME_AMQP_URLS, not both"
        );
        // A list given in code wins over the environment's mistake.
        let w = Worker::builder_with_env("g".into(), both)
            .pool(lazy_pool())
            .amqp_urls(["amqp://mine@h1:5672/%2f", "amqp://mine@h2:5672/%2f"])
            .handle("a", noop)
            .build()
            .expect("builds");
        assert_eq!(w.config.amqp_urls.urls().len(), 2);

        let max = chime_protocol::limits::MAX_AMQP_URLS;
        let too_many = (0..=max).map(|i| format!("amqp://h{i}:5672/%2f"));
        let error = Worker::builder("g")
            .pool(lazy_pool())
            .amqp_urls(too_many)
            .handle("a", noop)
            .build()
            .unwrap_err()
            .to_string();
        assert!(error.contains(&format!("the limit is {max}")), "{error}");
        let none: [&str; 0] = [];
        let error = Worker::builder("g")
            .pool(lazy_pool())
            .amqp_urls(none)
            .handle("a", noop)
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("list of broker addresses is empty"),
            "{error}"
        );
    }
}
