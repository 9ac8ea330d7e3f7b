//! One worker's life, [`run`]: open the link (its own queue declared before anything else),
//! register, consume until shutdown, drain, stop.
//!
//! Shutdown, in order (tokio's graceful-shutdown shape):
//! 1. stop consuming (`basic.cancel`), so the broker sends this worker nothing more;
//! 2. let in-flight handlers finish, up to the drain timeout;
//! 3. fire the handlers' cancellation tokens and give them the cancel grace to return;
//! 4. abandon (drop) handlers that still run; every attempt is recorded, whatever happened;
//! 5. close the AMQP channels and connection, mark the worker stopped, close an owned pool.
//!
//! Beside the consume loop run the heartbeat (on a connection of its own) and the retry of
//! outcomes that could not be written.

use std::sync::Arc;
use std::time::Duration;

use chime_protocol::addresses::Addresses;
use chime_protocol::tls::AmqpTls;
use chime_protocol::topology::Topology;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::delivery::{self, Limits, Shared};
use crate::handler::Handlers;
use crate::link::{self, AmqpError, Broker, Dispatch, Inbound, Link};
use crate::store::WorkerRow;

/// How often outcomes that could not be written are tried again.
const UNRECORDED_RETRY: Duration = Duration::from_secs(5);

/// A worker's configuration, checked by the builder.
pub(crate) struct Config {
    pub id: String,
    pub hostname: String,
    pub topology: Topology,
    pub database: Database,
    pub amqp_urls: Addresses,
    pub amqp_tls: AmqpTls,
    pub capacity: u16,
    pub hold: u16,
    pub drain_timeout: Duration,
    pub cancel_grace: Duration,
    pub heartbeat_interval: Duration,
    pub db_retry_budget: Duration,
    pub ack_after: Duration,
    pub unhandled_wait: Duration,
    pub handlers: Handlers,
}

/// Why [`Worker::run`](crate::Worker::run) could not start. Once running, a worker survives broker and database
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
        source: AmqpError,
    },
}

/// Where the worker's database is.
pub(crate) enum Database {
    Pool(PgPool),
    Url(Box<PgConnectOptions>),
}

/// Runs the worker `config` describes until `shutdown` fires, then drains (see the module
/// docs) and returns.
///
/// Fails only at start (registry row, first connection and consumer). After that, broker
/// and database outages are retried and logged, never returned.
pub(crate) async fn run(config: Config, shutdown: CancellationToken) -> Result<(), WorkerError> {
    let (pool, owned_pool) = match config.database {
        Database::Pool(pool) => (pool, false),
        Database::Url(options) => (
            PgPoolOptions::new()
                .max_connections(u32::from(config.capacity) + 2)
                .connect_lazy_with(*options),
            true,
        ),
    };
    let jobs = config.handlers.jobs();
    let limits = Limits {
        capacity: config.capacity,
        cancel_grace: config.cancel_grace,
        ack_after: config.ack_after,
        unhandled_wait: config.unhandled_wait,
    };
    let shared = Arc::new(Shared::new(
        config.id,
        config.topology,
        config.handlers,
        pool,
        config.db_retry_budget,
        limits,
    ));
    // The broker first: the worker's own queue exists before the worker registers, so a
    // broadcast task the scheduler routes to it once it counts the worker is never
    // unroutable. Deliveries wait in the consumers until the consume loop starts.
    let mut broker = Broker::new(
        config.amqp_urls.clone(),
        config.amqp_tls.clone(),
        shared.topology.clone(),
        &shared.id,
    );
    // Held deliveries are unacked too: the prefetch makes room for them next to the running
    // handlers, whose number the `handler_slots` semaphore bounds.
    let prefetch = config.capacity.saturating_add(config.hold);
    let first = match broker.open(prefetch).await {
        Ok(first) => first,
        Err(source) => {
            broker.close().await;
            if owned_pool {
                shared.store.pool().close().await;
            }
            return Err(WorkerError::Amqp {
                group: shared.topology.group().to_owned(),
                url: config.amqp_urls.redacted(),
                source,
            });
        }
    };
    let row = WorkerRow {
        id: &shared.id,
        group: shared.topology.group(),
        hostname: &config.hostname,
        capacity: config.capacity,
        jobs: &jobs,
        heartbeat_interval: config.heartbeat_interval,
    };
    if let Err(source) = shared.store.register_worker(&row).await {
        // Unacked deliveries go back to their queues as the channels close.
        drop(first);
        broker.close().await;
        if owned_pool {
            shared.store.pool().close().await;
        }
        return Err(WorkerError::Register {
            worker_id: shared.id.clone(),
            source,
        });
    }
    tracing::info!(
        worker_id = %shared.id,
        group = shared.topology.group(),
        jobs = ?jobs,
        capacity = config.capacity,
        prefetch,
        "worker started"
    );

    let stop_heartbeat = CancellationToken::new();
    let heartbeat = tokio::spawn(heartbeat_loop(
        shared.clone(),
        config.heartbeat_interval,
        stop_heartbeat.clone(),
    ));
    let unrecorded = tokio::spawn(unrecorded_loop(shared.clone(), stop_heartbeat.clone()));
    let tracker = TaskTracker::new();
    let deliveries = Deliveries {
        shared: &shared,
        tracker: &tracker,
    };
    link::supervise(&mut broker, prefetch, first, &shutdown, &deliveries).await;

    drain(&shared, &tracker, config.drain_timeout).await;
    broker.close().await;
    stop_heartbeat.cancel();
    for (task, what) in [(heartbeat, "heartbeat"), (unrecorded, "outcome retry")] {
        if let Err(error) = task.await {
            tracing::error!(%error, "{what} task failed");
        }
    }
    shared.retry_unrecorded().await;
    let lost = shared.unrecorded_count();
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

/// The delivery path, as the link's consume loop sees it: each delivery in a task of its own
/// (tracked, so the drain can wait for it), each operator's cancel to the run's token.
struct Deliveries<'a> {
    shared: &'a Arc<Shared>,
    tracker: &'a TaskTracker,
}

impl Dispatch for Deliveries<'_> {
    fn delivery(&self, link: Arc<Link>, delivery: Inbound) {
        self.tracker
            .spawn(delivery::handle(self.shared.clone(), link, delivery));
    }

    fn cancel_run(&self, run_id: i64) -> bool {
        self.shared.cancel_run(run_id)
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
