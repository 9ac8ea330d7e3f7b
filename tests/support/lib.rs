//! Helpers for Chime's end-to-end tests: scheduler instances that can be stopped or killed,
//! and a TCP proxy that can cut the broker off; child processes ([`process`]), private
//! PostgreSQL and RabbitMQ instances to restart ([`services`]) and the chaos suite ([`chaos`]).
//! Unique names, waiting on conditions, captured events and the per-test setup come from the
//! test kit (`chime-test-kit`, re-exported here), which the worker SDK's tests share.
//!
//! Every test gets its own database (`#[sqlx::test]`) and its own queue prefix, so tests run in
//! parallel without seeing each other's runs or messages.

pub mod chaos;
pub mod pg_failover;
pub mod pki;
pub mod process;
pub mod rabbit_cluster;
pub mod services;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chime_scheduler::job::JobSpec;
use chime_scheduler::leader::LeaseTimings;
use chime_scheduler::planner::PlannerTimings;
use chime_scheduler::service::{self, DutySettings, ServiceConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use chime_test_kit::{
    AMQP_URL, Events, Setup, TopologyGuard, WAIT, capture_logs, database_url, done_if,
    init_tracing, passive_declare, try_wait_for, unique, wait_for,
};

/// Service settings for a test: fast lease timings so failover tests stay short.
pub fn service_config(
    database_url: &str,
    amqp_url: &str,
    instance: &str,
    prefix: &str,
) -> ServiceConfig {
    ServiceConfig {
        database_url: database_url.to_owned(),
        amqp_urls: amqp_url.into(),
        amqp_tls: Default::default(),
        instance_id: instance.to_owned(),
        queue_prefix: prefix.to_owned(),
        lease: LeaseTimings {
            ttl: Duration::from_secs(3),
            renew_interval: Duration::from_millis(500),
            safety_margin: Duration::from_millis(500),
        },
        planner: PlannerTimings::default(),
    }
}

/// A scheduler instance on its own thread and runtime, so it can be killed like a process:
/// [`Scheduler::kill`] drops every task at once, with no resignation and no cleanup.
pub struct Scheduler {
    shutdown: CancellationToken,
    reload: mpsc::Sender<()>,
    kill: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    jobs: Arc<std::sync::Mutex<Vec<JobSpec>>>,
}

impl Scheduler {
    /// Starts an instance serving `jobs`.
    pub fn start(config: ServiceConfig, jobs: Vec<JobSpec>) -> Scheduler {
        Scheduler::start_with(config, DutySettings::default(), jobs)
    }

    /// Starts an instance serving `jobs` with the given settings of the leader's duties (a
    /// faster rescuer, say).
    pub fn start_with(
        config: ServiceConfig,
        duties: DutySettings,
        jobs: Vec<JobSpec>,
    ) -> Scheduler {
        let shutdown = CancellationToken::new();
        let (reload_tx, reload_rx) = mpsc::channel(4);
        let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
        let jobs = Arc::new(std::sync::Mutex::new(jobs));
        let loader_jobs = jobs.clone();
        let loader: service::JobLoader =
            Arc::new(move || Ok(loader_jobs.lock().expect("not poisoned").clone()));
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let handle = runtime.spawn(service::run_with(config, duties, loader, reload_rx, token));
            // Either the service ends (graceful stop) or the test kills the runtime.
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            runtime.spawn(async move {
                let result = handle.await;
                let _ = done_tx.send(result);
            });
            loop {
                if kill_rx.try_recv().is_ok() {
                    runtime.shutdown_background();
                    return Ok(());
                }
                match done_rx.recv_timeout(Duration::from_millis(10)) {
                    Ok(result) => return result?,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
        });
        Scheduler {
            shutdown,
            reload: reload_tx,
            kill: Some(kill_tx),
            thread: Some(thread),
            jobs,
        }
    }

    /// Starts instance `instance` on a test's [`Setup`] (its database and queue prefix),
    /// serving `jobs`.
    pub fn on(t: &Setup, instance: &str, jobs: Vec<JobSpec>) -> Scheduler {
        let config = service_config(&t.database_url, &t.amqp_url, instance, &t.prefix);
        Scheduler::start(config, jobs)
    }

    /// [`Scheduler::on`] with the given settings of the leader's duties.
    pub fn on_with(
        t: &Setup,
        instance: &str,
        jobs: Vec<JobSpec>,
        duties: DutySettings,
    ) -> Scheduler {
        let config = service_config(&t.database_url, &t.amqp_url, instance, &t.prefix);
        Scheduler::start_with(config, duties, jobs)
    }

    /// Replaces the job list and reloads, as SIGHUP does.
    pub async fn reload(&self, jobs: Vec<JobSpec>) {
        *self.jobs.lock().expect("not poisoned") = jobs;
        self.reload.send(()).await.expect("scheduler running");
    }

    /// Graceful stop: finishes publishing, resigns, closes connections.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let thread = self.thread.take().expect("running");
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("scheduler thread panicked"))?
    }

    /// Abrupt stop, like SIGKILL: tasks dropped, lease left to expire.
    pub async fn kill(mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        let thread = self.thread.take().expect("running");
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
    }
}

/// A TCP proxy to a local service that a test can cut off and restore, to simulate an outage
/// without disturbing the shared service other tests use.
pub struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    stop: CancellationToken,
}

impl Proxy {
    /// Starts a proxy on an ephemeral loopback port forwarding to `target`.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("local addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let generation = Arc::new(generation);
        let stop = CancellationToken::new();
        let target = target.to_owned();
        let (up2, gen2, stop2) = (up.clone(), generation.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop2.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut client, _)) = accepted else {
                    continue;
                };
                if !up2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let target = target.clone();
                let mut cut = gen2.subscribe();
                let stop3 = stop2.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                        () = stop3.cancelled() => {}
                    }
                });
            }
        });
        Proxy {
            port,
            up,
            generation,
            stop,
        }
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Percentile (0–100) of a sorted slice.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
