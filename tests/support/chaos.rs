//! The chaos suite: a steady load of every-second jobs on `chime scheduler` and
//! `chime-test-worker` processes against a private PostgreSQL and RabbitMQ (one node, or a
//! cluster of several), while faults strike one after another (leader SIGKILLed, leader stopped
//! gracefully, leader frozen past its lease, worker SIGKILLed, RabbitMQ restarted and killed,
//! PostgreSQL restarted and crashed; on a cluster, the node leading the work queue stopped and
//! SIGKILLed); then every fire that fell due is reconciled against the database and the
//! workers' own record of what they executed. A plan can run both services with TLS on.
//!
//! Used by `chime-chaos` (full size) and by the CI-sized tests in `tests/e2e/chaos.rs` and
//! `tests/e2e/rabbit_cluster.rs`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, DurationRound as _, Utc};
use nix::sys::signal::Signal;
use sqlx::{PgPool, Row as _};

use crate::pki::Pki;
use crate::process::{Process, SchedulerEnv, WorkerEnv, sibling_binary};
use crate::rabbit_cluster::{self, RabbitCluster};
use crate::services::{PrivatePostgres, RabbitTls};

/// One fault the suite injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the leader (a replacement instance is started after the takeover).
    KillLeader,
    /// SIGTERM the leader: it resigns, a follower takes over at once.
    StopLeader,
    /// SIGSTOP the leader until another instance has taken over, then SIGCONT it.
    FreezeLeader,
    /// SIGKILL a worker that is running handlers (a replacement is started).
    KillWorker,
    /// Stop RabbitMQ (every node of a cluster) for `outage`, then start it again.
    RestartRabbit,
    /// SIGKILL RabbitMQ's Erlang VM (every node's), start it again after `outage`.
    KillRabbit,
    /// Stop the cluster node leading the group's work queue; start it again once a fire
    /// published after the fault has run without it. Needs a cluster.
    StopQueueLeader,
    /// SIGKILL the cluster node leading the group's work queue; start it again once a fire
    /// published after the fault has run without it. Needs a cluster.
    KillQueueLeader,
    /// Stop PostgreSQL (fast shutdown) for `outage`, then start it again.
    RestartPostgres,
    /// Crash PostgreSQL (immediate shutdown: no checkpoint, recovery at start), start it again
    /// after `outage`.
    CrashPostgres,
}

impl Fault {
    /// Every fault a single RabbitMQ node allows, in the order the suite injects them.
    pub const ALL: [Fault; 8] = [
        Fault::KillLeader,
        Fault::StopLeader,
        Fault::FreezeLeader,
        Fault::KillWorker,
        Fault::RestartRabbit,
        Fault::KillRabbit,
        Fault::RestartPostgres,
        Fault::CrashPostgres,
    ];

    /// The faults of a RabbitMQ cluster's nodes, in order: the work queue's leader stopped,
    /// then (with the first back) the node that leads it next SIGKILLed.
    pub const CLUSTER: [Fault; 2] = [Fault::StopQueueLeader, Fault::KillQueueLeader];

    /// Whether the fault needs a RabbitMQ cluster.
    pub fn needs_cluster(self) -> bool {
        Fault::CLUSTER.contains(&self)
    }

    /// The fault's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "leader SIGKILL",
            Fault::StopLeader => "leader SIGTERM",
            Fault::FreezeLeader => "leader SIGSTOP",
            Fault::KillWorker => "worker SIGKILL",
            Fault::RestartRabbit => "RabbitMQ restart",
            Fault::KillRabbit => "RabbitMQ SIGKILL",
            Fault::RestartPostgres => "PostgreSQL restart",
            Fault::CrashPostgres => "PostgreSQL crash",
            Fault::StopQueueLeader => "RabbitMQ queue-leader node stop",
            Fault::KillQueueLeader => "RabbitMQ queue-leader node SIGKILL",
        }
    }
}

/// The size of a chaos run.
#[derive(Debug, Clone)]
pub struct ChaosPlan {
    /// Jobs, each firing every second (so this is the load in fires per second).
    pub jobs: usize,
    /// Scheduler instances.
    pub schedulers: usize,
    /// Worker processes.
    pub workers: usize,
    /// Concurrent handlers per worker.
    pub capacity: u16,
    /// How long each handler runs.
    pub handler: Duration,
    /// Steady load before, between and after the faults.
    pub calm: Duration,
    /// How long RabbitMQ and PostgreSQL stay down.
    pub outage: Duration,
    /// RabbitMQ nodes: 1, or a cluster (3 for the cluster faults; at most
    /// [`rabbit_cluster::MAX_NODES`]). Each process gets every node's address, starting at a
    /// different node, so connections spread over the cluster.
    pub rabbit_nodes: usize,
    /// TLS to both services: PostgreSQL with `ssl = on` (clients `verify-full`) and RabbitMQ's
    /// TLS listeners (`amqps://`), with certificates made for the run.
    pub tls: bool,
    /// The faults, in order.
    pub faults: Vec<Fault>,
    /// Where process logs go (a temporary directory if `None`, deleted unless the run failed).
    pub log_dir: Option<PathBuf>,
}

impl ChaosPlan {
    /// The CI-sized plan: 20 fires/s, every fault once, about 100 s in all.
    pub fn ci() -> ChaosPlan {
        ChaosPlan {
            jobs: 20,
            schedulers: 2,
            workers: 2,
            capacity: 16,
            handler: Duration::from_millis(200),
            calm: Duration::from_secs(4),
            outage: Duration::from_secs(3),
            rabbit_nodes: 1,
            tls: false,
            faults: Fault::ALL.to_vec(),
            log_dir: None,
        }
    }

    /// The CI-sized cluster plan: 100 fires/s on a 3-node RabbitMQ cluster, TLS on to both
    /// services, the two cluster faults.
    pub fn rabbit_cluster_ci() -> ChaosPlan {
        ChaosPlan {
            jobs: 100,
            capacity: 64,
            rabbit_nodes: 3,
            tls: true,
            faults: Fault::CLUSTER.to_vec(),
            ..ChaosPlan::ci()
        }
    }

    /// Refuses a plan whose faults its services cannot take, or whose sizes are out of bounds.
    fn check(&self) -> anyhow::Result<()> {
        if !(1..=rabbit_cluster::MAX_NODES).contains(&self.rabbit_nodes) {
            bail!(
                "rabbit_nodes is {}; a plan has 1 to {} RabbitMQ nodes",
                self.rabbit_nodes,
                rabbit_cluster::MAX_NODES
            );
        }
        if let Some(fault) = self.faults.iter().find(|f| f.needs_cluster())
            && self.rabbit_nodes < 3
        {
            bail!(
                "fault {:?} needs a RabbitMQ cluster of at least 3 nodes (a quorum survives one \
                 node down), and the plan has {}",
                fault.name(),
                self.rabbit_nodes
            );
        }
        if self.jobs == 0 || self.schedulers == 0 || self.workers == 0 || self.capacity == 0 {
            bail!("a plan needs at least one job, scheduler, worker and handler slot: {self:?}");
        }
        Ok(())
    }
}

/// What one fault did, as measured.
#[derive(Debug, Clone)]
pub struct FaultReport {
    /// The fault.
    pub fault: Fault,
    /// When it struck (wall clock).
    pub at: DateTime<Utc>,
    /// From the fault to the first fire published afterwards, under the new term for leader
    /// faults (the "next fire lands" time).
    pub next_fire: Option<Duration>,
    /// From the fault to another instance holding the lease (leader faults only).
    pub takeover: Option<Duration>,
    /// Runs inserted under the old term after the takeover (must be 0; freeze only).
    pub fenced_writes: Option<i64>,
    /// From the fault to every job having run a fire scheduled after it: the whole load
    /// flows again (plan, publish, deliver, claim, record).
    pub recovered: Option<Duration>,
    /// The RabbitMQ node struck (cluster faults only).
    pub node: Option<String>,
}

/// The reconciliation of expected fires against what happened.
#[derive(Debug, Clone, Default)]
pub struct ChaosReport {
    /// Fires that fell due in the measured window (jobs × seconds).
    pub expected: usize,
    /// Fires whose run succeeded.
    pub run: usize,
    /// Skipped fires, by reason (numbers in the reason elided).
    pub skipped: BTreeMap<String, usize>,
    /// Runs that ended failed, dead or cancelled, by state.
    pub failed: BTreeMap<String, usize>,
    /// Fires with more than one run row.
    pub duplicate_triggers: usize,
    /// Runs whose handler started more than once, one of them on a worker that was killed.
    pub duplicate_executions_after_crash: usize,
    /// Runs whose handler started more than once without a killed worker to explain it.
    pub duplicate_executions_unexplained: usize,
    /// Fires without a run, or whose run never reached a final state.
    pub lost: usize,
    /// Examples of lost fires (job, instant, state), for the error message.
    pub lost_examples: Vec<String>,
    /// Succeeded runs no worker reported executing.
    pub succeeded_unseen: usize,
    /// The window the fires were expected in.
    pub window: (DateTime<Utc>, DateTime<Utc>),
    /// Each fault's measurements.
    pub faults: Vec<FaultReport>,
}

impl ChaosReport {
    /// The reconciliation table and the fault timings, for people.
    pub fn table(&self) -> String {
        let mut table = comfy_table::Table::new();
        table.load_style(comfy_table::presets::ASCII_MARKDOWN);
        table.set_header(vec!["fires", "count"]);
        table.add_row(vec!["expected".to_owned(), self.expected.to_string()]);
        table.add_row(vec!["run (succeeded)".to_owned(), self.run.to_string()]);
        let skipped: usize = self.skipped.values().sum();
        table.add_row(vec!["skipped".to_owned(), skipped.to_string()]);
        for (reason, n) in &self.skipped {
            table.add_row(vec![format!("  skipped: {reason}"), n.to_string()]);
        }
        for (state, n) in &self.failed {
            table.add_row(vec![format!("ended {state}"), n.to_string()]);
        }
        table.add_row(vec![
            "duplicate triggers (must be 0)".to_owned(),
            self.duplicate_triggers.to_string(),
        ]);
        table.add_row(vec![
            "duplicate executions, worker died".to_owned(),
            self.duplicate_executions_after_crash.to_string(),
        ]);
        table.add_row(vec![
            "duplicate executions, otherwise (must be 0)".to_owned(),
            self.duplicate_executions_unexplained.to_string(),
        ]);
        table.add_row(vec!["lost (must be 0)".to_owned(), self.lost.to_string()]);
        let mut faults = comfy_table::Table::new();
        faults.load_style(comfy_table::presets::ASCII_MARKDOWN);
        faults.set_header(vec![
            "fault",
            "at",
            "takeover",
            "next fire",
            "recovered",
            "old-term writes",
        ]);
        let ms =
            |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()));
        for f in &self.faults {
            faults.add_row(vec![
                f.fault.name().to_owned(),
                f.at.format("%H:%M:%S%.3f").to_string(),
                ms(f.takeover),
                ms(f.next_fire),
                ms(f.recovered),
                f.fenced_writes.map_or("-".to_owned(), |n| n.to_string()),
            ]);
        }
        format!(
            "fires due {} .. {}\n{table}\n\n{faults}",
            self.window.0.format("%H:%M:%S"),
            self.window.1.format("%H:%M:%S")
        )
    }

    /// Fails if a guarantee was broken: a duplicate trigger, an unexplained duplicate
    /// execution, a lost fire, a write under an old term, or a success nobody executed.
    pub fn check(&self) -> anyhow::Result<()> {
        let fenced: i64 = self.faults.iter().filter_map(|f| f.fenced_writes).sum();
        if self.duplicate_triggers > 0
            || self.duplicate_executions_unexplained > 0
            || self.lost > 0
            || fenced > 0
            || self.succeeded_unseen > 0
        {
            bail!(
                "chaos broke a guarantee: {} duplicate triggers, {} unexplained duplicate \
                 executions, {} lost (e.g. {:?}), {fenced} writes under an old term, {} \
                 successes no worker executed\n{}",
                self.duplicate_triggers,
                self.duplicate_executions_unexplained,
                self.lost,
                self.lost_examples,
                self.succeeded_unseen,
                self.table()
            );
        }
        Ok(())
    }
}

/// A scheduler or worker process of the run, with the name it has in the database.
struct Member {
    id: String,
    process: Process,
}

/// The running cluster: private services, schedulers, workers.
struct Cluster {
    plan: ChaosPlan,
    postgres: PrivatePostgres,
    rabbit: RabbitCluster,
    /// The certificates of a TLS plan.
    pki: Option<Pki>,
    database_url: String,
    prefix: String,
    jobs_file: PathBuf,
    log_dir: PathBuf,
    chime: PathBuf,
    worker_binary: PathBuf,
    pool: PgPool,
    schedulers: Vec<Member>,
    workers: Vec<Member>,
    /// Workers that were killed: their stdout still counts.
    dead_workers: Vec<Member>,
    next_id: usize,
}

/// A run as the reconciliation reads it: id, state, reason.
type RunRow = (i64, String, Option<String>);

/// The group every chaos job belongs to.
const GROUP: &str = "chaos";
/// The misfire policies the jobs cycle through.
const POLICIES: [&str; 3] = ["fire_all", "fire_once", "skip"];

/// Runs `plan` and returns its reconciliation. Process logs are kept in `plan.log_dir` (or in a
/// temporary directory that is kept, and named in the error, when the run fails).
pub async fn run(plan: ChaosPlan) -> anyhow::Result<ChaosReport> {
    let temp = tempfile::Builder::new()
        .prefix("chime-chaos-")
        .tempdir()
        .context("creating a temporary directory")?;
    let log_dir = plan
        .log_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&log_dir)?;
    let result = run_in(plan, log_dir.clone()).await;
    if result.is_err() {
        let kept = temp.keep();
        eprintln!("chaos: logs kept in {}", kept.display());
    }
    result
}

async fn run_in(plan: ChaosPlan, log_dir: PathBuf) -> anyhow::Result<ChaosReport> {
    plan.check()?;
    let pki = plan.tls.then(Pki::generate);
    let tls = pki.as_ref().map(|pki| RabbitTls {
        ca_file: pki.path("ca.pem"),
        cert_file: pki.path("server.pem"),
        key_file: pki.path("server.key"),
        require_client_cert: false,
    });
    let nodes = plan.rabbit_nodes;
    let (postgres, rabbit) = tokio::task::spawn_blocking(move || {
        let postgres = match &tls {
            Some(tls) => PrivatePostgres::start_with_tls(&tls.cert_file, &tls.key_file)?,
            None => PrivatePostgres::start()?,
        };
        let rabbit = RabbitCluster::start(nodes, tls.as_ref())?;
        anyhow::Ok((postgres, rabbit))
    })
    .await??;
    let database_url = match &pki {
        Some(pki) => postgres.verify_full_url("chime", &pki.path("ca.pem")),
        None => postgres.url("chime"),
    };
    chime_scheduler::store::Store::create_database_if_missing(&database_url).await?;
    let store = chime_scheduler::store::Store::connect(&database_url, 4).await?;
    store.migrate().await?;
    let jobs_file = log_dir.join("jobs.toml");
    std::fs::write(&jobs_file, job_file(&plan))?;
    let mut cluster = Cluster {
        postgres,
        rabbit,
        pki,
        prefix: crate::unique("chaos"),
        database_url,
        jobs_file,
        log_dir,
        chime: sibling_binary("chime")?,
        worker_binary: sibling_binary("chime-test-worker")?,
        pool: store.pool().clone(),
        schedulers: Vec::new(),
        workers: Vec::new(),
        dead_workers: Vec::new(),
        next_id: 0,
        plan,
    };
    let outcome = cluster.exercise().await;
    cluster.shutdown().await;
    // Stopping the nodes waits for their VMs: off the runtime.
    let Cluster { rabbit, .. } = cluster;
    tokio::task::spawn_blocking(move || drop(rabbit)).await?;
    outcome
}

fn job_file(plan: &ChaosPlan) -> String {
    let mut text = String::from("# Generated by the chaos suite.\n");
    for i in 0..plan.jobs {
        text.push_str(&format!(
            "[[jobs]]\nname = \"chaos-{i:04}\"\ngroup = \"{GROUP}\"\nevery = \"1s\"\n\
             misfire = \"{}\"\nmisfire_grace = \"1s\"\nparams = {{ ms = {} }}\n\
             retry = {{ max_attempts = 5, initial = \"1s\" }}\n\n",
            POLICIES[i % POLICIES.len()],
            plan.handler.as_millis()
        ));
    }
    text
}

/// The test kit's wait ([`crate::try_wait_for`]) for a probe that can fail while services are
/// down: calls `check` until it returns `Some`; its errors (a database that is down) count as
/// "not yet", and the last one is in the timeout's message.
async fn until<T>(
    timeout: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let found = crate::try_wait_for(timeout, what, async || match check().await {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err("not yet".to_owned()),
        Err(e) => Err(format!("{e:#}")),
    })
    .await?;
    Ok(found)
}

impl Cluster {
    fn next_name(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{}", self.next_id)
    }

    /// Every node's address, starting at the `n`th node: process `n` connects there first.
    fn amqp_urls(&self, n: usize) -> Vec<String> {
        let mut urls = self.rabbit.urls();
        let len = urls.len();
        urls.rotate_left(n % len);
        urls
    }

    fn ca_file(&self) -> Option<PathBuf> {
        self.pki.as_ref().map(|pki| pki.path("ca.pem"))
    }

    fn start_scheduler(&mut self) -> anyhow::Result<()> {
        let id = self.next_name("s");
        let amqp_urls = self.amqp_urls(self.next_id);
        let ca_file = self.ca_file();
        let env = SchedulerEnv {
            database_url: &self.database_url,
            amqp_urls: &amqp_urls,
            amqp_ca_file: ca_file.as_deref(),
            prefix: &self.prefix,
            jobs: &self.jobs_file,
            json_logs: false,
        };
        let process = Process::scheduler(&self.chime, &id, &env, &self.log_dir)?;
        self.schedulers.push(Member { id, process });
        Ok(())
    }

    fn start_worker(&mut self) -> anyhow::Result<()> {
        let id = self.next_name("w");
        let amqp_urls = self.amqp_urls(self.next_id);
        let ca_file = self.ca_file();
        let env = WorkerEnv {
            database_url: &self.database_url,
            amqp_urls: &amqp_urls,
            amqp_ca_file: ca_file.as_deref(),
            prefix: &self.prefix,
            group: GROUP,
            capacity: self.plan.capacity,
            chaos_jobs: self.plan.jobs,
        };
        let process = Process::worker(&self.worker_binary, &id, &env, &self.log_dir)?;
        self.workers.push(Member { id, process });
        Ok(())
    }

    /// The lease holder and term, if the lease is unexpired.
    async fn leader(&self) -> anyhow::Result<Option<(String, i64)>> {
        let row = sqlx::query(
            "SELECT holder, term FROM chime_leader WHERE name = 'default' AND expires_at > now()",
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|r| {
            let holder: Option<String> = r.get("holder");
            holder.map(|h| (h, r.get("term")))
        }))
    }

    /// Waits (up to a minute) for the first publish after `after` under any term.
    async fn wait_published_after(
        &self,
        after: DateTime<Utc>,
        what: &str,
    ) -> anyhow::Result<DateTime<Utc>> {
        until(Duration::from_secs(60), what, || {
            self.first_publish_after(after, 0)
        })
        .await
    }

    /// The first publish of a run scheduled after `after`, under a term of at least `term`.
    async fn first_publish_after(
        &self,
        after: DateTime<Utc>,
        term: i64,
    ) -> anyhow::Result<Option<DateTime<Utc>>> {
        Ok(sqlx::query_scalar(
            "SELECT min(published_at) FROM chime_runs
             WHERE published_at > $1 AND term >= $2 AND trigger <> 'manual'",
        )
        .bind(after)
        .bind(term)
        .fetch_one(&self.pool)
        .await?)
    }

    /// A run scheduled after `after` has succeeded: the whole path works again.
    async fn wait_recovered(&self, after: DateTime<Utc>) -> anyhow::Result<()> {
        self.wait_jobs_ran_since(after, 1, "a run after the fault to succeed")
            .await
    }

    /// Every job has a succeeded run scheduled after `after`: the whole load flows again.
    async fn wait_all_recovered(&self, after: DateTime<Utc>) -> anyhow::Result<()> {
        let jobs = i64::try_from(self.plan.jobs).context("job count")?;
        self.wait_jobs_ran_since(after, jobs, "every job to run a fire after the fault")
            .await
    }

    /// Waits until `jobs` jobs have a succeeded run scheduled after `after`.
    async fn wait_jobs_ran_since(
        &self,
        after: DateTime<Utc>,
        jobs: i64,
        what: &str,
    ) -> anyhow::Result<()> {
        until(Duration::from_secs(60), what, || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(DISTINCT job_name) FROM chime_runs
                 WHERE scheduled_at > $1 AND state = 'succeeded'",
            )
            .bind(after)
            .fetch_one(&self.pool)
            .await?;
            Ok((n >= jobs).then_some(()))
        })
        .await
    }

    async fn exercise(&mut self) -> anyhow::Result<ChaosReport> {
        for _ in 0..self.plan.schedulers {
            self.start_scheduler()?;
        }
        for _ in 0..self.plan.workers {
            self.start_worker()?;
        }
        until(Duration::from_secs(30), "a leader", || self.leader()).await?;
        let started = Utc::now();
        self.wait_recovered(started).await?;
        // Fires are expected from the next whole second on: every job is planned by then.
        let from = next_second(Utc::now());
        tokio::time::sleep(self.plan.calm).await;

        let mut reports = Vec::new();
        for fault in self.plan.faults.clone() {
            for member in self.schedulers.iter_mut().chain(self.workers.iter_mut()) {
                member.process.ensure_running()?;
            }
            let report = self
                .strike(fault)
                .await
                .with_context(|| format!("fault {}", fault.name()))?;
            eprintln!(
                "chaos: {} done (takeover {:?}, next fire {:?})",
                fault.name(),
                report.takeover,
                report.next_fire
            );
            reports.push(report);
            tokio::time::sleep(self.plan.calm).await;
        }
        let to = Utc::now()
            .duration_trunc(chrono::Duration::seconds(1))
            .expect("whole seconds");

        // Let every fire of the window settle while the cluster keeps running (the outbox
        // needs a leader), then reconcile.
        let settle = Duration::from_secs(60) + self.plan.handler * 10;
        let settled = until(settle, "every fire of the window to settle", || async {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM chime_runs WHERE scheduled_at BETWEEN $1 AND $2
                 AND state IN ('pending', 'queued', 'running', 'retrying')",
            )
            .bind(from)
            .bind(to)
            .fetch_one(&self.pool)
            .await?;
            Ok((open == 0).then_some(()))
        })
        .await;
        if let Err(e) = settled {
            eprintln!("chaos: {e}; reconciling anyway");
        }
        let mut report = self.reconcile(from, to).await?;
        report.faults = reports;
        Ok(report)
    }

    async fn strike(&mut self, fault: Fault) -> anyhow::Result<FaultReport> {
        let at = Utc::now();
        let mut report = FaultReport {
            fault,
            at,
            next_fire: None,
            takeover: None,
            fenced_writes: None,
            recovered: None,
            node: None,
        };
        match fault {
            Fault::KillLeader | Fault::StopLeader | Fault::FreezeLeader => {
                let (holder, term) =
                    until(Duration::from_secs(30), "a leader", || self.leader()).await?;
                let index = self
                    .schedulers
                    .iter()
                    .position(|m| m.id == holder)
                    .with_context(|| format!("leader {holder} is not one of ours"))?;
                let struck = Instant::now();
                let at = Utc::now();
                report.at = at;
                match fault {
                    Fault::KillLeader => self.schedulers[index].process.kill().await?,
                    Fault::StopLeader => {
                        self.schedulers[index].process.signal(Signal::SIGTERM)?;
                    }
                    _ => self.schedulers[index].process.signal(Signal::SIGSTOP)?,
                }
                let (_, new_term) = until(Duration::from_secs(30), "another leader", || async {
                    Ok(self.leader().await?.filter(|(h, _)| *h != holder))
                })
                .await?;
                report.takeover = Some(struck.elapsed());
                let takeover_at: DateTime<Utc> = Utc::now();
                let published = until(
                    Duration::from_secs(30),
                    "a fire published under the new term",
                    || self.first_publish_after(at, new_term),
                )
                .await?;
                report.next_fire = (published - at).to_std().ok();
                match fault {
                    Fault::FreezeLeader => {
                        // Frozen past its lease, then thawed: it must not write under its old
                        // term. Give it time to try.
                        let thawed = Utc::now();
                        self.schedulers[index].process.signal(Signal::SIGCONT)?;
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        let writes: i64 = sqlx::query_scalar(
                            "SELECT count(*) FROM chime_runs WHERE term = $1 AND created_at > $2",
                        )
                        .bind(term)
                        .bind(takeover_at.min(thawed))
                        .fetch_one(&self.pool)
                        .await?;
                        report.fenced_writes = Some(writes);
                    }
                    _ => {
                        let mut gone = self.schedulers.remove(index);
                        gone.process.stop(Duration::from_secs(10)).await?;
                        self.start_scheduler()?;
                    }
                }
            }
            Fault::KillWorker => {
                // The worker running the most handlers right now.
                let busiest: Option<String> = until(
                    Duration::from_secs(30),
                    "a worker running handlers",
                    || async {
                        Ok(sqlx::query_scalar(
                            "SELECT worker_id FROM chime_runs WHERE state = 'running'
                             GROUP BY worker_id ORDER BY count(*) DESC LIMIT 1",
                        )
                        .fetch_optional(&self.pool)
                        .await?)
                    },
                )
                .await?;
                let index = busiest
                    .and_then(|id| self.workers.iter().position(|m| m.id == id))
                    .unwrap_or(0);
                let mut gone = self.workers.remove(index);
                gone.process.kill().await?;
                self.dead_workers.push(gone);
                self.start_worker()?;
                self.wait_recovered(Utc::now()).await?;
                report.next_fire = (Utc::now() - at).to_std().ok();
            }
            Fault::RestartRabbit | Fault::KillRabbit => {
                let outage = self.plan.outage;
                let rabbit = &mut self.rabbit;
                tokio::task::block_in_place(|| {
                    if fault == Fault::KillRabbit {
                        rabbit.kill_all()?;
                    } else {
                        rabbit.stop_all()?;
                    }
                    std::thread::sleep(outage);
                    rabbit.start_stopped()
                })?;
                let back = Utc::now();
                let published = self
                    .wait_published_after(back, "a fire published after the restart")
                    .await?;
                report.next_fire = (published - at).to_std().ok();
                self.wait_recovered(back).await?;
            }
            Fault::StopQueueLeader | Fault::KillQueueLeader => {
                let queue =
                    chime_protocol::topology::Topology::new(&self.prefix, GROUP).work_queue();
                let rabbit = &mut self.rabbit;
                let (index, node) = tokio::task::block_in_place(|| {
                    let index = rabbit.queue_leader(&queue, Duration::from_secs(30))?;
                    let node = rabbit.node(index).node().to_owned();
                    if fault == Fault::KillQueueLeader {
                        rabbit.kill(index)?;
                    } else {
                        rabbit.stop(index)?;
                    }
                    anyhow::Ok((index, node))
                })?;
                report.node = Some(node);
                // The cluster goes on without the node: a fire scheduled after the fault is
                // published (confirmed by the queue's new leader) and runs.
                let recovered = async {
                    let published = self
                        .wait_published_after(at, "a fire published after the node went down")
                        .await?;
                    report.next_fire = (published - at).to_std().ok();
                    self.wait_all_recovered(at).await
                }
                .await;
                if let Err(e) = recovered {
                    let status = tokio::task::block_in_place(|| self.rabbit.quorum_status(&queue));
                    return Err(e.context(format!("the work queue: {status:?}")));
                }
                report.recovered = (Utc::now() - at).to_std().ok();
                let rabbit = &mut self.rabbit;
                tokio::task::block_in_place(|| {
                    rabbit.start_stopped()?;
                    rabbit.wait_queue_whole(&queue, Duration::from_secs(60))
                })
                .with_context(|| format!("starting node {index} again"))?;
            }
            Fault::RestartPostgres | Fault::CrashPostgres => {
                let outage = self.plan.outage;
                let postgres = &mut self.postgres;
                let mode = if fault == Fault::CrashPostgres {
                    "immediate"
                } else {
                    "fast"
                };
                tokio::task::block_in_place(|| {
                    postgres.stop(mode)?;
                    std::thread::sleep(outage);
                    postgres.start_server()
                })?;
                let back = Utc::now();
                let published = self
                    .wait_published_after(back, "a fire published after the restart")
                    .await?;
                report.next_fire = (published - at).to_std().ok();
                self.wait_recovered(back).await?;
            }
        }
        if report.recovered.is_none() {
            self.wait_all_recovered(report.at).await?;
            report.recovered = (Utc::now() - report.at).to_std().ok();
        }
        Ok(report)
    }

    async fn reconcile(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> anyhow::Result<ChaosReport> {
        let mut report = ChaosReport {
            window: (from, to),
            ..ChaosReport::default()
        };
        let rows = sqlx::query(
            "SELECT id, job_name, scheduled_at, state, reason FROM chime_runs
             WHERE trigger <> 'manual' AND scheduled_at BETWEEN $1 AND $2",
        )
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await
        .context("reading runs")?;
        let mut by_fire: HashMap<(String, DateTime<Utc>), Vec<RunRow>> = HashMap::new();
        for row in rows {
            by_fire
                .entry((row.get("job_name"), row.get("scheduled_at")))
                .or_default()
                .push((row.get("id"), row.get("state"), row.get("reason")));
        }
        // Handler starts per run, and which of them happened on a worker that was killed.
        let mut executions: HashMap<i64, Vec<bool>> = HashMap::new();
        for (member, killed) in self
            .workers
            .iter()
            .map(|m| (m, false))
            .chain(self.dead_workers.iter().map(|m| (m, true)))
        {
            for line in member.process.stdout_lines() {
                let mut words = line.split_whitespace();
                if words.next() == Some("ran")
                    && let Some(Ok(run)) = words.next().map(str::parse::<i64>)
                {
                    executions.entry(run).or_default().push(killed);
                }
            }
        }
        let seconds = (to - from).num_seconds() + 1;
        for i in 0..self.plan.jobs {
            let job = format!("chaos-{i:04}");
            for s in 0..seconds {
                report.expected += 1;
                let at = from + chrono::Duration::seconds(s);
                let Some(runs) = by_fire.get(&(job.clone(), at)) else {
                    report.lost += 1;
                    if report.lost_examples.len() < 5 {
                        report.lost_examples.push(format!("{job} {at}: no run"));
                    }
                    continue;
                };
                if runs.len() > 1 {
                    report.duplicate_triggers += runs.len() - 1;
                }
                let (id, state, reason) = &runs[0];
                match state.as_str() {
                    "succeeded" => {
                        report.run += 1;
                        match executions.get(id) {
                            None => report.succeeded_unseen += 1,
                            Some(starts) if starts.len() > 1 => {
                                if starts.iter().any(|&killed| killed) {
                                    report.duplicate_executions_after_crash += 1;
                                } else {
                                    report.duplicate_executions_unexplained += 1;
                                }
                            }
                            Some(_) => {}
                        }
                    }
                    "skipped" => {
                        *report
                            .skipped
                            .entry(elide_numbers(reason.as_deref().unwrap_or("no reason")))
                            .or_default() += 1;
                    }
                    "failed" | "dead" | "cancelled" => {
                        *report.failed.entry(state.clone()).or_default() += 1;
                    }
                    _ => {
                        report.lost += 1;
                        if report.lost_examples.len() < 5 {
                            report
                                .lost_examples
                                .push(format!("{job} {at}: run {id} still {state}"));
                        }
                    }
                }
            }
        }
        Ok(report)
    }

    async fn shutdown(&mut self) {
        for member in self.schedulers.iter_mut().chain(self.workers.iter_mut()) {
            let _ = member.process.stop(Duration::from_secs(15)).await;
        }
        self.pool.close().await;
    }
}

/// The next whole second after `t`.
fn next_second(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(chrono::Duration::seconds(1))
        .expect("whole seconds")
        + chrono::Duration::seconds(1)
}

/// `missed by 3.2s; misfire policy skip` → `missed by #s; misfire policy skip`, so skip reasons
/// group.
fn elide_numbers(reason: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in reason.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('#');
                in_number = true;
            }
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_reasons_group_without_their_numbers() {
        assert_eq!(
            elide_numbers("missed by 3.2s; misfire policy skip"),
            "missed by #s; misfire policy skip"
        );
        assert_eq!(
            elide_numbers("missed by 12ms; fire_all runs only the latest 3 missed fires"),
            "missed by #ms; fire_all runs only the latest # missed fires"
        );
    }
}
