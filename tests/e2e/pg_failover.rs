//! PostgreSQL fails over under load: two schedulers and two workers reach a private primary
//! through a [`SwitchProxy`] (the database's address), 30 jobs fire every second, the primary
//! is stopped, its standby promoted and the address switched to it. Every fire of the
//! window is then reconciled against the new primary and the workers' record of what they ran;
//! the recovery time (fault → first run finished on the new primary) is printed.
//!
//! TLS is on: both servers present the test CA's certificate and every client connects with
//! `sslmode=verify-full` through the proxy.
//!
//! Synchronous replication (`synchronous_standby_names = '*'`, `synchronous_commit = on`) and
//! a fast shutdown of the primary: nothing it acknowledged is lost, so each fire has one run,
//! each run ran once or was skipped by its misfire policy, and nothing was written under a
//! superseded term. docs/operations.md ("PostgreSQL failover") has the numbers and what an
//! asynchronous standby would lose.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use chime_e2e::pg_failover::{
    Standby, SwitchProxy, check_replication_ready, port_of, require_synchronous,
};
use chime_e2e::pki::Pki;
use chime_e2e::services::PrivatePostgres;
use chime_e2e::{AMQP_URL, Scheduler, TopologyGuard, service_config, try_wait_for, unique};
use chime_scheduler::store::Store;
use chrono::{DateTime, DurationRound as _, Utc};
use serde_json::json;
use sqlx::{PgPool, Row as _};

use crate::common::{RecordingWorker, job};

/// The executor group of the jobs (unique under the test's own prefix).
const GROUP: &str = "pgfail";
/// Jobs firing every second: the load in fires per second.
const JOBS: usize = 30;
/// The misfire policies the jobs cycle through.
const POLICIES: [&str; 3] = ["fire_all", "fire_once", "skip"];
/// How long a step of the scenario may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// A probe's database error (the database is failing over) counts as "not yet".
async fn until<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Result<Option<T>, sqlx::Error>,
) -> T {
    let found = try_wait_for(timeout, what, async || match probe().await {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err("not yet".to_owned()),
        Err(e) => Err(e.to_string()),
    })
    .await;
    found.unwrap_or_else(|timed_out| panic!("{timed_out}"))
}

/// The lease holder and term, if the lease is unexpired.
async fn leader(pool: &PgPool) -> Result<Option<(String, i64)>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT holder, term FROM chime_leader WHERE name = 'default' AND expires_at > now()",
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(|r| {
        r.get::<Option<String>, _>("holder")
            .map(|h| (h, r.get("term")))
    }))
}

/// Jobs with a succeeded run scheduled at or after `from`.
async fn jobs_succeeded_since(pool: &PgPool, from: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT job_name) FROM chime_runs
         WHERE scheduled_at >= $1 AND state = 'succeeded'",
    )
    .bind(from)
    .fetch_one(pool)
    .await
}

fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(chrono::Duration::seconds(1))
        .expect("whole seconds")
}

fn ms(d: chrono::Duration) -> i64 {
    d.num_milliseconds()
}

/// A fire: job and scheduled instant.
type Fire = (String, DateTime<Utc>);

/// The fires of a window against the runs and the workers' executions.
#[derive(Debug, Default)]
struct Reconciliation {
    expected: usize,
    succeeded: usize,
    /// Skips by the misfire policy, by the job's policy.
    skipped: BTreeMap<&'static str, usize>,
    /// Fires with more than one run row.
    duplicate_triggers: usize,
    /// Fires whose handler ran more than once.
    run_twice: Vec<Fire>,
    /// Succeeded fires no handler ran under their id and instant.
    unseen: usize,
    /// Handler runs of run ids the database does not have (writes lost in the failover).
    unknown_executions: usize,
    /// Runs left open (pending, queued, running, retrying), by state.
    open: BTreeMap<String, usize>,
    /// Fires without a run, or whose run is neither succeeded, skipped by its job's policy nor
    /// open.
    unaccounted: Vec<String>,
}

/// A primary (reached through `proxy`), its synchronous standby, and the load on them.
struct Cluster {
    /// The certificates (deleted with the cluster).
    _pki: Pki,
    primary: PrivatePostgres,
    standby: Standby,
    /// The clients' database address.
    proxy: SwitchProxy,
    pool: PgPool,
    guard: Option<TopologyGuard>,
    policy_of: HashMap<String, &'static str>,
    schedulers: Vec<Scheduler>,
    workers: Vec<RecordingWorker>,
}

impl Cluster {
    /// A primary and its synchronous standby, migrations through the proxy, 2 schedulers and
    /// 2 workers, `JOBS` jobs every second; returns once every job has run.
    async fn start() -> Cluster {
        chime_e2e::init_tracing();
        let pki = Pki::generate();
        let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
        let primary =
            tokio::task::spawn_blocking(move || PrivatePostgres::start_with_tls(&cert, &key))
                .await
                .expect("joined")
                .expect("primary starts");
        check_replication_ready(&primary)
            .await
            .expect("the primary can stream");
        let primary_port = port_of(&primary);
        let standby = tokio::task::block_in_place(|| Standby::clone_from(primary_port, &primary))
            .expect("standby cloned and started");
        require_synchronous(&primary)
            .await
            .expect("the standby is synchronous");

        let primary_address = format!("127.0.0.1:{primary_port}");
        let proxy = SwitchProxy::start(&primary_address).await.expect("proxy");
        // TLS through the proxy, the server verified against the test's CA (chain and host
        // name), before and after the failover: the standby presents the same certificate.
        let db = format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            proxy.postgres_url("chime"),
            pki.path("ca.pem").display()
        );
        Store::create_database_if_missing(&db)
            .await
            .expect("create the database through the proxy");
        let store = Store::connect(&db, 4).await.expect("connect");
        store.migrate().await.expect("migrations through the proxy");
        let pool = store.pool().clone();
        let encrypted: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&pool)
                .await
                .expect("pg_stat_ssl");
        assert!(encrypted, "the clients' connections are TLS");

        let prefix = unique("pgf");
        let guard = TopologyGuard::new(AMQP_URL, &prefix, &[GROUP]);
        let names: Vec<String> = (0..JOBS).map(|i| format!("pgf-{i:02}")).collect();
        let policy_of: HashMap<String, &'static str> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), POLICIES[i % POLICIES.len()]))
            .collect();
        let jobs: Vec<_> = names
            .iter()
            .map(|n| {
                job(json!({
                    "name": n, "group": GROUP, "every": "1s",
                    "misfire": policy_of[n], "misfire_grace": "1s",
                }))
            })
            .collect();
        let handlers: Vec<&str> = names.iter().map(String::as_str).collect();
        let workers = vec![
            RecordingWorker::start(&db, AMQP_URL, &prefix, GROUP, &handlers),
            RecordingWorker::start(&db, AMQP_URL, &prefix, GROUP, &handlers),
        ];
        let schedulers = ["s1", "s2"]
            .into_iter()
            .map(|id| Scheduler::start(service_config(&db, AMQP_URL, id, &prefix), jobs.clone()))
            .collect();
        let cluster = Cluster {
            _pki: pki,
            primary,
            standby,
            proxy,
            pool,
            guard: Some(guard),
            policy_of,
            schedulers,
            workers,
        };
        until(WAIT, "a leader", || leader(&cluster.pool)).await;
        let started = Utc::now();
        cluster
            .wait_all_ran_since(started, "every job to run")
            .await;
        cluster
    }

    async fn wait_all_ran_since(&self, from: DateTime<Utc>, what: &str) {
        until(WAIT, what, async || {
            Ok((jobs_succeeded_since(&self.pool, from).await? == JOBS as i64).then_some(()))
        })
        .await;
    }

    /// Promotes the standby and moves the clients' address to it; returns when it was
    /// promoted.
    fn promote_and_switch(&self) -> DateTime<Utc> {
        tokio::task::block_in_place(|| self.standby.promote()).expect("promote the standby");
        let promoted_at = Utc::now();
        self.proxy
            .switch(&format!("127.0.0.1:{}", self.standby.port()));
        promoted_at
    }

    /// The first run finished and the first trigger published after `promoted_at`.
    async fn first_fire_after(&self, promoted_at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let finished = until(
            Duration::from_secs(60),
            "a run to finish on the new primary",
            async || {
                sqlx::query_scalar(
                    "SELECT min(finished_at) FROM chime_runs
                     WHERE state = 'succeeded' AND finished_at > $1",
                )
                .bind(promoted_at)
                .fetch_one(&self.pool)
                .await
            },
        )
        .await;
        let published = until(WAIT, "a trigger published on the new primary", async || {
            sqlx::query_scalar("SELECT min(published_at) FROM chime_runs WHERE published_at > $1")
                .bind(promoted_at)
                .fetch_one(&self.pool)
                .await
        })
        .await;
        (finished, published)
    }

    /// Waits until every fire of `[from, to]` has a run in a final state; the error names the
    /// first open runs.
    async fn wait_settled(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<(), String> {
        let expected = JOBS as i64 * ((to - from).num_seconds() + 1);
        let what = "every fire of the window to be decided and settled";
        let settled = try_wait_for(WAIT, what, async || {
            let counts: Result<(i64, i64), sqlx::Error> = sqlx::query_as(
                "SELECT count(*), count(*) FILTER (
                            WHERE state IN ('pending', 'queued', 'running', 'retrying'))
                 FROM chime_runs WHERE trigger <> 'manual' AND scheduled_at BETWEEN $1 AND $2",
            )
            .bind(from)
            .bind(to)
            .fetch_one(&self.pool)
            .await;
            match counts {
                Ok((rows, 0)) if rows >= expected => Ok(()),
                Ok((rows, open)) => Err(format!("{rows} of {expected} fires, {open} open")),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        if let Err(timed_out) = settled {
            let open: Vec<(i64, String, DateTime<Utc>, String)> = sqlx::query_as(
                "SELECT id, job_name, scheduled_at, state FROM chime_runs
                 WHERE state IN ('pending', 'queued', 'running', 'retrying')
                 ORDER BY scheduled_at LIMIT 10",
            )
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
            return Err(format!("{timed_out}; open runs: {open:?}"));
        }
        Ok(())
    }

    /// Runs written under a term older than one that had already written runs: a leader
    /// writing after it was superseded (must be 0).
    async fn stale_writes(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM (
                 SELECT term, max(term) OVER (ORDER BY created_at, id) AS newest
                 FROM chime_runs WHERE trigger <> 'manual' AND term IS NOT NULL
             ) r WHERE term < newest",
        )
        .fetch_one(&self.pool)
        .await
        .expect("read terms")
    }

    /// Runs written after `at`, by term.
    async fn terms_since(&self, at: DateTime<Utc>) -> Vec<(i64, i64)> {
        sqlx::query_as(
            "SELECT term, count(*) FROM chime_runs WHERE created_at > $1 AND term IS NOT NULL
             GROUP BY term ORDER BY term",
        )
        .bind(at)
        .fetch_all(&self.pool)
        .await
        .expect("terms")
    }

    /// Each fire of `[from, to]` of every job against its runs and the workers' executions.
    async fn reconcile(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Reconciliation {
        let rows = sqlx::query("SELECT id, job_name, scheduled_at, state, reason FROM chime_runs")
            .fetch_all(&self.pool)
            .await
            .expect("read runs");
        // Handler runs by (run id, instant): the instant as the trigger gave it.
        let mut executions: HashMap<(i64, DateTime<Utc>), usize> = HashMap::new();
        for worker in &self.workers {
            for invocation in worker.invocations.all() {
                *executions
                    .entry((invocation.run_id, invocation.scheduled_at))
                    .or_default() += 1;
            }
        }
        let known: HashSet<i64> = rows.iter().map(|r| r.get("id")).collect();
        let mut report = Reconciliation {
            unknown_executions: executions
                .keys()
                .filter(|(id, _)| !known.contains(id))
                .count(),
            ..Reconciliation::default()
        };
        let mut by_fire: HashMap<Fire, Vec<(i64, String, Option<String>)>> = HashMap::new();
        for row in rows {
            by_fire
                .entry((row.get("job_name"), row.get("scheduled_at")))
                .or_default()
                .push((row.get("id"), row.get("state"), row.get("reason")));
        }
        for (job, policy) in &self.policy_of {
            for s in 0..=(to - from).num_seconds() {
                report.expected += 1;
                let fire = (job.clone(), from + chrono::Duration::seconds(s));
                let at = fire.1;
                let Some(runs) = by_fire.get(&fire) else {
                    report.unaccounted.push(format!("{job} {at}: no run"));
                    continue;
                };
                report.duplicate_triggers += runs.len() - 1;
                let (id, state, reason) = &runs[0];
                let ran = executions.get(&(*id, at)).copied().unwrap_or(0);
                if ran > 1 {
                    report.run_twice.push(fire.clone());
                }
                match state.as_str() {
                    "succeeded" => {
                        report.succeeded += 1;
                        if ran == 0 {
                            report.unseen += 1;
                        }
                    }
                    "skipped"
                        if reason
                            .as_deref()
                            .is_some_and(|r| r.contains("misfire policy")) =>
                    {
                        *report.skipped.entry(policy).or_default() += 1;
                    }
                    "pending" | "queued" | "running" | "retrying" => {
                        *report.open.entry(state.clone()).or_default() += 1;
                    }
                    _ => report
                        .unaccounted
                        .push(format!("{job} {at}: run {id} {state} ({reason:?})")),
                }
            }
        }
        report
    }

    /// Stops schedulers and workers gracefully and deletes the test's exchanges and queues;
    /// the servers and proxies go when the cluster is dropped.
    async fn stop(&mut self) {
        for scheduler in std::mem::take(&mut self.schedulers) {
            scheduler.stop().await.expect("graceful stop");
        }
        for worker in std::mem::take(&mut self.workers) {
            worker.stop().await;
        }
        if let Some(guard) = self.guard.take() {
            // Each worker's own queue outlives it (a day, `x-expires`): delete those too.
            let registered: Vec<(String, String)> =
                sqlx::query_as("SELECT group_name, id FROM chime_workers")
                    .fetch_all(&self.pool)
                    .await
                    .expect("read the workers");
            for (group, id) in &registered {
                guard.add_worker_queue(group, id);
            }
            guard.delete().await;
        }
        self.pool.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_promoted_under_load_loses_and_doubles_no_fire() {
    let mut cluster = Cluster::start().await;
    // Fires are expected from the next whole second on: every job is planned by then.
    let from = whole_second(Utc::now()) + chrono::Duration::seconds(1);
    let calm = from + chrono::Duration::seconds(3);
    cluster
        .wait_all_ran_since(calm, "three seconds of load before the fault")
        .await;
    let (holder_before, term_before) = leader(&cluster.pool)
        .await
        .expect("read the lease")
        .expect("a leader");

    // The fault: the primary stops (fast shutdown: clients are disconnected; with synchronous
    // replication every commit it acknowledged is on the standby), the standby is promoted and
    // the database's address moves to it.
    let struck = Instant::now();
    let fault_at = Utc::now();
    tokio::task::block_in_place(|| cluster.primary.stop("fast")).expect("stop the primary");
    let stopped_in = struck.elapsed();
    let promoted_at = cluster.promote_and_switch();
    let promoted_in = struck.elapsed();
    let (first_finish, first_publish) = cluster.first_fire_after(promoted_at).await;
    let recovery = first_finish - fault_at;

    // Three more seconds of load on the new primary, then the window closes.
    let to = whole_second(first_finish) + chrono::Duration::seconds(3);
    cluster
        .wait_all_ran_since(to, "three seconds of load after the failover")
        .await;
    cluster.wait_settled(from, to).await.expect("settled");
    let (holder_after, term_after) = leader(&cluster.pool)
        .await
        .expect("read the lease")
        .expect("a leader");
    let stale_writes = cluster.stale_writes().await;
    let terms = cluster.terms_since(fault_at).await;
    let report = cluster.reconcile(from, to).await;
    println!(
        "PostgreSQL failover, synchronous_commit = on, {JOBS} fires/s, fires {} .. {}:\n  \
         primary stopped (fast) in {} ms, standby promoted {} ms after the fault\n  \
         recovery (fault -> first run finished on the new primary) {} ms; first trigger \
         published on it {} ms after the fault\n  \
         lease {holder_before} term {term_before} before, {holder_after} term {term_after} \
         after; runs written after the fault by term {terms:?}\n  \
         expected {}, succeeded {}, skipped by misfire policy {:?}, duplicate triggers {}, \
         run twice {}, unseen {}, executions of unknown runs {}, unaccounted {}, writes under \
         a superseded term {stale_writes}",
        from.format("%H:%M:%S"),
        to.format("%H:%M:%S"),
        stopped_in.as_millis(),
        promoted_in.as_millis(),
        ms(recovery),
        ms(first_publish - fault_at),
        report.expected,
        report.succeeded,
        report.skipped,
        report.duplicate_triggers,
        report.run_twice.len(),
        report.unseen,
        report.unknown_executions,
        report.unaccounted.len(),
    );
    cluster.stop().await;

    assert_eq!(report.duplicate_triggers, 0, "{report:?}");
    assert!(report.run_twice.is_empty(), "{report:?}");
    assert_eq!(report.unseen, 0, "{report:?}");
    assert_eq!(report.unknown_executions, 0, "{report:?}");
    assert!(report.open.is_empty(), "{report:?}");
    assert!(
        report.unaccounted.is_empty(),
        "fires not accounted for: {:?}",
        report.unaccounted
    );
    assert!(
        !report.skipped.contains_key("fire_all"),
        "a fire_all job skipped a fire: {report:?}"
    );
    assert!(report.succeeded > report.expected / 2, "{report:?}");
    assert!(
        term_after >= term_before,
        "the lease's term went back from {term_before} to {term_after}"
    );
    assert_eq!(stale_writes, 0, "runs written under a superseded term");
    assert!(recovery < chrono::Duration::seconds(20), "{recovery}");
}
