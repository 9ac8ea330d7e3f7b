//! One scheduler instance: migrate, sync config jobs, campaign for leadership, lead while
//! elected, reload on request, shut down in order. [`run`] is the `chime scheduler` server;
//! [`run_serving`] and its shorthands run an instance from parts (tests, benchmarks).
//!
//! Shutdown order: stop the leader's duties (the dispatcher waits for confirms of publishes
//! already sent and records them), then resign the lease so a follower takes over at once, then
//! close the broker connection and the pool.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::config::{AlertSettings, RescuerSettings, RetentionSettings, Settings};
use crate::job::JobSpec;
use crate::leader::{Elector, LeaseTimings, while_leading};
use crate::overdue;
use crate::planner::{LeaderContext, PlannerTimings, lead};
use crate::publish::Publisher;
use crate::store::{Fence, JobDiff, Store};
use chime_protocol::addresses::Addresses;

/// Reads the job definitions (from config files); called at start and on every reload.
pub type JobLoader = Arc<dyn Fn() -> anyhow::Result<Vec<JobSpec>> + Send + Sync>;

/// What one instance needs to run.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// PostgreSQL URL.
    pub database_url: String,
    /// The RabbitMQ addresses (one, or several nodes of a cluster tried in order).
    pub amqp_urls: Addresses,
    /// TLS options of an `amqps://` URL (CA file, client certificate).
    pub amqp_tls: chime_protocol::tls::AmqpTls,
    /// Unique id of this instance (lease holder name).
    pub instance_id: String,
    /// Prefix of every exchange and queue.
    pub queue_prefix: String,
    /// Leader lease timings.
    pub lease: LeaseTimings,
    /// Planner timings.
    pub planner: PlannerTimings,
}

/// Settings of the leader's failure-handling duties: the rescuer and alerts.
#[derive(Debug, Clone, Default)]
pub struct DutySettings {
    /// The rescuer of runs of lost workers and of stuck retries.
    pub rescuer: RescuerSettings,
    /// Alert webhooks.
    pub alerts: AlertSettings,
}

/// The `chime scheduler` server: one instance as `settings` say (its job files, the leader's
/// duties, retention, and the API, health probes and `/metrics` on `bind`) until `shutdown`.
/// SIGHUP re-reads the job files and applies the difference; with `watch`, so does a change
/// of them ([`crate::watch`], debounced by [`crate::watch::Debounce`]'s defaults).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = ServiceConfig {
        database_url: settings.database_url.clone(),
        amqp_urls: settings.amqp_addresses(),
        amqp_tls: settings.amqp_tls.clone(),
        instance_id: settings.resolved_instance_id(),
        queue_prefix: settings.queue_prefix.clone(),
        lease: LeaseTimings {
            ttl: settings.leader.lease_ttl,
            renew_interval: settings.leader.renew_interval,
            ..LeaseTimings::default()
        },
        planner: PlannerTimings {
            lookahead: settings.planner.lookahead,
            ..PlannerTimings::default()
        },
    };
    let duties = DutySettings {
        rescuer: settings.rescuer,
        alerts: settings.alerts.clone(),
    };
    let operations = OpsSettings {
        bind: Some(settings.bind),
        retention: Some(settings.retention),
        management_url: settings.management_url.clone(),
    };
    let watch = settings.watch.then(|| settings.jobs.clone());
    let loader: JobLoader =
        Arc::new(move || settings.load_jobs().map_err(|e| anyhow::anyhow!("{e}")));

    let (reload_tx, reload_rx) = mpsc::channel(4);
    // A change of the job files sends the same reload as SIGHUP; the watcher ends with the
    // instance (or when the reload channel closes).
    if let Some(patterns) = watch {
        crate::watch::spawn(
            &patterns,
            reload_tx.clone(),
            crate::watch::Debounce::default(),
            shutdown.clone(),
        );
    }
    let mut hangup = signal(SignalKind::hangup())?;
    let hangups_stop = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = hangups_stop.cancelled() => break,
                _ = hangup.recv() => {
                    info!("SIGHUP: reloading job files");
                    let _ = reload_tx.send(()).await;
                }
            }
        }
    });
    run_serving(config, duties, operations, loader, reload_rx, shutdown).await
}

/// Runs an instance until `shutdown`, with default [`DutySettings`] and no operations side.
/// Each message on `reload` re-reads the job files and applies the difference (logged).
pub async fn run_instance(
    config: ServiceConfig,
    loader: JobLoader,
    reload: mpsc::Receiver<()>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with(config, DutySettings::default(), loader, reload, shutdown).await
}

/// [`run_instance`] with the given settings of the leader's failure-handling duties.
pub async fn run_with(
    config: ServiceConfig,
    duties: DutySettings,
    loader: JobLoader,
    reload: mpsc::Receiver<()>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_serving(
        config,
        duties,
        OpsSettings::default(),
        loader,
        reload,
        shutdown,
    )
    .await
}

/// The operations side of an instance; off by default (as in tests that start instances).
#[derive(Debug, Clone, Default)]
pub struct OpsSettings {
    /// Serve the API, health probes and `/metrics` on this address ([`crate::api`]).
    pub bind: Option<SocketAddr>,
    /// Prune old runs while leading ([`crate::retention`]).
    pub retention: Option<RetentionSettings>,
    /// RabbitMQ's management HTTP API, for queue figures ([`crate::broker`]).
    pub management_url: Option<String>,
}

/// Connections of an instance's pool (its LISTENs included).
const POOL_CONNECTIONS: u32 = 11;

/// Connections of the elector's own pool: one for the lease statements, one for its `LISTEN`.
const LEASE_CONNECTIONS: u32 = 2;

/// [`run_with`], also serving HTTP and pruning old runs as `operations` says. Refuses to start
/// when it would listen beyond loopback without any API token.
pub async fn run_serving(
    config: ServiceConfig,
    duties: DutySettings,
    operations: OpsSettings,
    loader: JobLoader,
    mut reload: mpsc::Receiver<()>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    Store::create_database_if_missing(&config.database_url).await?;
    // Each LISTEN (jobs, outbox, backfills) holds one of the pool's connections for good: 11
    // leaves the leader's writes the 8 they had before the backfill duty's LISTEN (with 10, the
    // throughput bench's 200 runs/s step fell behind).
    let store = Store::connect(&config.database_url, POOL_CONNECTIONS).await?;
    store.migrate().await?;
    // The elector renews on connections of its own: a pool busy with the leader's writes (or
    // waiting for them) never delays a renewal.
    let lease_store = Store::connect(&config.database_url, LEASE_CONNECTIONS).await?;
    let (elector, leadership) = Elector::new(lease_store, config.instance_id.clone(), config.lease);
    // One shared connection for the operations and the leader's control messages, opened on
    // first use.
    let broker = Broker::new(config.amqp_urls.clone(), &config.queue_prefix)
        .with_amqp_tls(config.amqp_tls.clone())
        .with_management_url(operations.management_url.as_deref());
    // Bind first: an instance that may not serve (exposure rule, address taken) changes nothing.
    let http = match operations.bind {
        Some(bind) => Some(
            crate::api::Server::bind(
                bind,
                &store,
                &config.instance_id,
                broker.clone(),
                leadership.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let jobs = loader().context("loading job files")?;
    info!(jobs = jobs.len(), "job files read");
    apply(&store, &jobs).await?;

    let publisher = Arc::new(
        Publisher::new(
            config.amqp_urls.clone(),
            &config.instance_id,
            config.queue_prefix.clone(),
        )
        .with_tls(config.amqp_tls.clone()),
    );
    declare_groups(&publisher, &jobs).await;
    // The planner reads the jobs from the database; 100,000 definitions are worth freeing.
    drop(jobs);

    let server_stop = CancellationToken::new();
    let server = http.map(|http| tokio::spawn(http.serve(server_stop.clone())));
    let elector_stop = CancellationToken::new();
    let elector_task = tokio::spawn(elector.run(elector_stop.clone()));

    let ctx = Arc::new(LeaderContext {
        store: store.clone(),
        publisher: publisher.clone(),
        broker: broker.clone(),
        instance: config.instance_id.clone(),
        timings: config.planner,
        rescuer: duties.rescuer,
        alerts: Arc::new(duties.alerts),
    });
    let duties_stop = CancellationToken::new();
    let retention = operations.retention.map(|settings| {
        let store = store.clone();
        let instance = config.instance_id.clone();
        tokio::spawn(while_leading(
            leadership.clone(),
            duties_stop.clone(),
            move |term, _, stop| {
                let fence = Fence {
                    holder: instance.clone(),
                    term,
                };
                crate::retention::run(store.clone(), fence, settings, stop)
            },
        ))
    });
    // The drain of the parking-lot queues into `chime_dead_letters`, on its own connection.
    let drain = {
        let store = store.clone();
        let instance = config.instance_id.clone();
        let (amqp_urls, prefix) = (config.amqp_urls.clone(), config.queue_prefix.clone());
        let amqp_tls = config.amqp_tls.clone();
        tokio::spawn(while_leading(
            leadership.clone(),
            duties_stop.clone(),
            move |term, _, stop| {
                let fence = Fence {
                    holder: instance.clone(),
                    term,
                };
                crate::parking::run(
                    store.clone(),
                    fence,
                    amqp_urls.clone(),
                    amqp_tls.clone(),
                    prefix.clone(),
                    format!("chime-drain-{instance}"),
                    stop,
                )
            },
        ))
    };
    let duties = tokio::spawn(while_leading(
        leadership,
        duties_stop.clone(),
        move |term, leadership, stop: CancellationToken| {
            let ctx = ctx.clone();
            async move {
                let fence = Fence {
                    holder: ctx.instance.clone(),
                    term,
                };
                let store = ctx.store.clone();
                // The planner's duties, the misfire policy for triggers a broker outage held
                // back, and backfills; when one stops (lease lost), all do.
                let planner_stop = stop.clone();
                tokio::join!(
                    async move {
                        lead(ctx, term, leadership, planner_stop.clone()).await;
                        planner_stop.cancel();
                    },
                    overdue::run(store.clone(), fence.clone(), stop.clone()),
                    crate::backfill::run(store, fence, stop),
                );
            }
        },
    ));
    info!(instance = %config.instance_id, "scheduler started");

    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(()) = reload.recv() => {
                match loader() {
                    Ok(jobs) => {
                        if let Err(e) = apply(&store, &jobs).await {
                            warn!(error = %format!("{e:#}"), "reload failed; previous jobs stay");
                        } else {
                            declare_groups(&publisher, &jobs).await;
                        }
                    }
                    Err(e) => warn!(error = %format!("{e:#}"), "reload rejected; previous jobs stay"),
                }
            }
        }
    }

    info!(instance = %config.instance_id, "scheduler stopping");
    duties_stop.cancel();
    let _ = duties.await;
    let _ = drain.await;
    if let Some(retention) = retention {
        let _ = retention.await;
    }
    elector_stop.cancel();
    let _ = elector_task.await;
    server_stop.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    publisher.close().await;
    broker.close().await;
    store.pool().close().await;
    info!(instance = %config.instance_id, "scheduler stopped");
    Ok(())
}

/// Syncs job definitions into the database and logs what changed.
async fn apply(store: &Store, jobs: &[JobSpec]) -> anyhow::Result<JobDiff> {
    let diff = store.sync_config_jobs(jobs).await?;
    if diff.is_empty() {
        info!(jobs = jobs.len(), "job definitions unchanged");
    } else {
        info!(
            added = ?diff.added,
            changed = ?diff.changed,
            removed = ?diff.removed,
            "job definitions applied"
        );
    }
    // Job files name only their own jobs as children; an API job may name one the files no
    // longer declare, and its runs would then skip that child.
    match store.jobs_naming(&diff.removed).await {
        Ok(dangling) => {
            for (job, child) in dangling {
                warn!(
                    job,
                    child,
                    "a removed job is still named as a child job; the runs of the job skip it"
                );
            }
        }
        Err(e) => warn!(error = %format!("{e:#}"), "could not check the removed jobs' links"),
    }
    match store.workflows_naming(&diff.removed).await {
        Ok(dangling) => {
            for (workflow, job) in dangling {
                warn!(
                    workflow,
                    job,
                    "a removed job is still a workflow's node; the workflow's runs fail when it \
                     is due"
                );
            }
        }
        Err(e) => warn!(error = %format!("{e:#}"), "could not check the removed jobs' workflows"),
    }
    Ok(diff)
}

/// Declares the topology of every group, so workers that start later find their queue and
/// triggers published before any worker ran are kept; several groups at once
/// ([`Publisher::declare_groups`]). A broker that is down is not fatal.
async fn declare_groups(publisher: &Publisher, jobs: &[JobSpec]) {
    // A workflow has no group (its nodes' jobs have theirs).
    let mut groups: Vec<&str> = jobs
        .iter()
        .map(|j| j.group.as_str())
        .filter(|g| !g.is_empty())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    let declared =
        tokio::time::timeout(Duration::from_secs(30), publisher.declare_groups(&groups)).await;
    match declared {
        Ok(Ok(failed)) => {
            for (group, e) in failed {
                warn!(group, error = %e, "could not declare group topology yet");
            }
        }
        Ok(Err(e)) => warn!(error = %e, "could not declare group topologies yet"),
        Err(_) => warn!(
            groups = groups.len(),
            "declaring group topologies timed out"
        ),
    }
}
