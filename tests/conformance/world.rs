//! One scenario's world: a fresh database migrated to the current schema, a queue prefix and
//! executor group of its own, an in-process scheduler serving the scenario's jobs, the worker
//! processes under test, and the cleanup of all of it (processes, broker objects, database,
//! login role).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use chime_e2e::process::Process;
use chime_e2e::{Scheduler, TopologyGuard, service_config, try_wait_for, unique};
use chime_scheduler::auth::Caller;
use chime_scheduler::cli::Broker;
use chime_scheduler::job::JobSpec;
use chime_scheduler::ops::Operations;
use chime_scheduler::store::Store;
use chrono::{DateTime, Utc};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor as _, PgPool, Row as _};

/// What every scenario needs to know about the run of the suite.
#[derive(Debug, Clone)]
pub struct Config {
    /// A PostgreSQL URL whose user may create and drop databases and roles.
    pub database_url: String,
    /// The RabbitMQ URL.
    pub amqp_url: String,
    /// The command that starts one worker (run as `sh -c 'exec COMMAND'`).
    pub worker: String,
    /// Where the workers' output goes, one file per worker process.
    pub log_dir: PathBuf,
    /// Run every worker as a login role granted only its group (`chime_grant_worker`).
    pub least_privilege: bool,
}

/// A run row as the scenarios look at it.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub state: String,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub reason: Option<String>,
    pub scheduled_at: DateTime<Utc>,
}

/// An attempt row.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub attempt: i32,
    pub worker_id: String,
    pub state: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

/// A log line of a run.
#[derive(Debug, Clone)]
pub struct LogRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub message: String,
}

/// A worker process under test, in a process group of its own: SIGKILL reaches whatever it
/// started (a generic runner's shell jobs), and dropping it kills the group.
pub struct WorkerProcess {
    /// Its `CHIME_WORKER_ID`.
    pub id: String,
    process: Process,
}

impl WorkerProcess {
    /// SIGKILL to the whole process group, then reaps the worker.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        let _ = killpg(self.group(), Signal::SIGKILL);
        self.process.kill().await
    }

    /// SIGTERM to the worker process alone; waits up to `timeout` for it to exit. Returns
    /// whether it exited by itself with status 0.
    pub async fn terminate(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        self.process.stop(timeout).await
    }

    /// Fails if the worker has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.process.ensure_running()
    }

    /// Its log file.
    pub fn log(&self) -> String {
        self.process.log().display().to_string()
    }

    fn group(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.process.pid()).unwrap_or(i32::MAX))
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = killpg(self.group(), Signal::SIGKILL);
    }
}

/// A login role granted only one group, and how to connect as it.
struct Role {
    name: String,
    url: String,
}

/// One scenario's world.
pub struct World {
    pub config: Config,
    /// The scenario's name (for file names).
    pub scenario: String,
    /// A pool on the scenario's database, as its owner.
    pub pool: PgPool,
    /// The database's URL, as its owner.
    pub database_url: String,
    pub prefix: String,
    pub group: String,
    pub ops: Operations,
    database: String,
    admin: PgPool,
    guard: Option<TopologyGuard>,
    scheduler: Option<Scheduler>,
    role: Option<Role>,
    workers: u32,
}

/// A job of the scenario: `name` in `group`, manual, with `extra` fields (`retry`, `timeout`,
/// `every`, …) in the job file's form.
pub fn job(name: &str, group: &str, extra: Value) -> anyhow::Result<JobSpec> {
    let mut spec = serde_json::json!({"name": name, "group": group});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    serde_json::from_value(spec).with_context(|| format!("job {name} is not a valid job"))
}

/// `url` with its database replaced by `database` (the path, up to a `?`).
pub fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .with_context(|| format!("database URL {url:?} has no scheme"))?;
    let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let query = tail.split_once('?').map(|(_, q)| format!("?{q}"));
    Ok(format!(
        "{scheme}://{authority}/{database}{}",
        query.unwrap_or_default()
    ))
}

/// `url` with its user and password replaced.
fn with_user(url: &str, user: &str, password: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .with_context(|| format!("database URL {url:?} has no scheme"))?;
    let rest = rest.split_once('@').map_or(rest, |(_, host)| host);
    Ok(format!("{scheme}://{user}:{password}@{rest}"))
}

impl World {
    /// Creates the database and names the world's prefix and group; [`World::start`] does the
    /// rest, and [`World::finish`] undoes both.
    pub async fn new(config: &Config, admin: &PgPool, scenario: &str) -> anyhow::Result<World> {
        let database = unique("chime_conf_");
        admin
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                r#"CREATE DATABASE "{database}""#
            ))))
            .await
            .with_context(|| format!("creating database {database}"))?;
        let database_url = with_database(&config.database_url, &database)?;
        let options: PgConnectOptions = database_url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await;
        let pool = match pool {
            Ok(pool) => pool,
            Err(e) => {
                let _ = admin
                    .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        r#"DROP DATABASE IF EXISTS "{database}""#
                    ))))
                    .await;
                return Err(e).with_context(|| format!("connecting to {database}"));
            }
        };
        let prefix = unique("conf");
        let group = unique("cg");
        Ok(World {
            config: config.clone(),
            scenario: scenario.to_owned(),
            pool: pool.clone(),
            database_url: database_url.clone(),
            ops: Operations::new(
                Store::from_pool(pool.clone()),
                Some(Broker::new(&config.amqp_url, &prefix)),
            ),
            guard: Some(TopologyGuard::new(&config.amqp_url, &prefix, &[&group])),
            prefix,
            group,
            database,
            admin: admin.clone(),
            scheduler: None,
            role: None,
            workers: 0,
        })
    }

    /// Migrates the database, creates the worker's role (with least privilege) and starts a
    /// scheduler serving `jobs` (built for the world's group).
    pub async fn start(
        &mut self,
        jobs: impl FnOnce(&str) -> anyhow::Result<Vec<JobSpec>>,
    ) -> anyhow::Result<()> {
        sqlx::migrate!("../migrations")
            .run(&self.pool)
            .await
            .context("migrating the scenario's database")?;
        if self.config.least_privilege {
            self.role = Some(self.create_role().await?);
        }
        let jobs = jobs(&self.group)?;
        for job in &jobs {
            if job.group != self.group {
                self.add_group(&job.group);
            }
        }
        let scheduler = Scheduler::start(
            service_config(
                &self.database_url,
                &self.config.amqp_url,
                &unique("conf-scheduler"),
                &self.prefix,
            ),
            jobs,
        );
        self.scheduler = Some(scheduler);
        Ok(())
    }

    /// Deletes `group`'s broker objects at the end too.
    pub fn add_group(&self, group: &str) {
        if let Some(guard) = &self.guard {
            guard.add_group(group);
        }
    }

    /// A login role granted only the world's group by `chime_grant_worker`.
    async fn create_role(&self) -> anyhow::Result<Role> {
        let name = unique("chime_conf_worker_");
        let password = unique("pw");
        self.admin
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                r#"CREATE ROLE "{name}" LOGIN PASSWORD '{password}'"#
            ))))
            .await
            .with_context(|| format!("creating role {name}"))?;
        let role = Role {
            url: with_user(&self.database_url, &name, &password)?,
            name,
        };
        sqlx::query("SELECT chime_grant_worker($1::name, $2, $3)")
            .bind(&role.name)
            .bind(&self.group)
            .bind("chime-conformance")
            .execute(&self.pool)
            .await
            .with_context(|| {
                format!(
                    "chime_grant_worker({}, {}, 'chime-conformance')",
                    role.name, self.group
                )
            })?;
        Ok(role)
    }

    /// The database URL a worker connects with: the least-privileged role's, if there is one.
    pub fn worker_database_url(&self) -> &str {
        self.role.as_ref().map_or(&self.database_url, |r| &r.url)
    }

    /// The login role granted only the world's group, if workers run as one.
    pub fn role(&self) -> Option<&str> {
        self.role.as_ref().map(|r| r.name.as_str())
    }

    /// Starts a worker process of the world's group with a fresh worker id.
    pub fn spawn_worker(&mut self) -> anyhow::Result<WorkerProcess> {
        self.workers += 1;
        let id = unique(&format!("conf-w{}-", self.workers));
        // A worker declares a durable queue of its own (broadcast tasks); it outlives the
        // process, so the world deletes it at the end with the group's.
        if let Some(guard) = &self.guard {
            guard.add_worker_queue(&self.group, &id);
        }
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(format!("exec {}", self.config.worker))
            .env("CHIME_DATABASE_URL", self.worker_database_url())
            .env("CHIME_AMQP_URL", &self.config.amqp_url)
            .env("CHIME_QUEUE_PREFIX", &self.prefix)
            .env("CHIME_GROUP", &self.group)
            .env("CHIME_WORKER_ID", &id)
            .env("NO_COLOR", "1")
            .process_group(0);
        let log = self
            .config
            .log_dir
            .join(format!("{}-w{}.log", self.scenario, self.workers));
        let process = Process::spawn(&format!("worker {id}"), command, &log)?;
        Ok(WorkerProcess { id, process })
    }

    /// Starts a worker and waits until it has registered (its `chime_workers` row).
    pub async fn start_worker(&mut self) -> anyhow::Result<WorkerProcess> {
        let mut worker = self.spawn_worker()?;
        let pool = self.pool.clone();
        let id = worker.id.clone();
        let what = format!("worker {id} to register in chime_workers");
        let registered = try_wait_for(Duration::from_secs(30), &what, async || {
            if let Err(exited) = worker.ensure_running() {
                return Ok(Err(exited));
            }
            let row: Option<i64> = sqlx::query_scalar(
                "SELECT 1::bigint FROM chime_workers WHERE id = $1 AND stopped_at IS NULL",
            )
            .bind(&id)
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten();
            row.map(|_| Ok(())).ok_or("not registered")
        })
        .await;
        match registered {
            Ok(Ok(())) => Ok(worker),
            Ok(Err(exited)) => Err(exited),
            Err(timed_out) => bail!("{timed_out}; its log: {}", worker.log()),
        }
    }

    /// Triggers `job` with `params` once the scheduler has stored it; returns the run id.
    pub async fn trigger(&self, job: &str, params: Value) -> anyhow::Result<i64> {
        let what = format!("the scheduler to store job {job} and accept a trigger");
        let triggered = try_wait_for(Duration::from_secs(30), &what, || async {
            self.ops
                .trigger(&Caller::cli(), job, Some(params.clone()))
                .await
                .map(|t| t.run_id)
                .map_err(|e| e.to_string())
        })
        .await?;
        Ok(triggered)
    }

    /// The run `id`.
    pub async fn run(&self, id: i64) -> anyhow::Result<RunRow> {
        let row = sqlx::query(
            "SELECT state, attempt, worker_id, reason, scheduled_at FROM chime_runs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .with_context(|| format!("reading run {id}"))?;
        Ok(RunRow {
            state: row.get("state"),
            attempt: row.get("attempt"),
            worker_id: row.get("worker_id"),
            reason: row.get("reason"),
            scheduled_at: row.get("scheduled_at"),
        })
    }

    /// Waits up to `timeout` for run `id` to satisfy `done`; fails naming `what` and the row.
    pub async fn wait_run(
        &self,
        id: i64,
        timeout: Duration,
        what: &str,
        done: impl Fn(&RunRow) -> bool,
    ) -> anyhow::Result<RunRow> {
        let what = format!("run {id} {what}");
        let row = try_wait_for(timeout, &what, || async {
            match self.run(id).await {
                Ok(row) if done(&row) => Ok(row),
                Ok(row) => Err(format!(
                    "{} at attempt {} on {:?}, reason {:?}",
                    row.state, row.attempt, row.worker_id, row.reason
                )),
                Err(e) => Err(format!("{e:#}")),
            }
        })
        .await?;
        Ok(row)
    }

    /// Waits for run `id` to reach state `state`.
    pub async fn wait_state(
        &self,
        id: i64,
        state: &str,
        timeout: Duration,
    ) -> anyhow::Result<RunRow> {
        self.wait_run(id, timeout, &format!("to be {state}"), |r| r.state == state)
            .await
    }

    /// The attempts of run `id`, in order.
    pub async fn attempts(&self, id: i64) -> anyhow::Result<Vec<AttemptRow>> {
        let rows = sqlx::query(
            "SELECT attempt, worker_id, state, started_at, finished_at, error
             FROM chime_attempts WHERE run_id = $1 ORDER BY attempt",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("reading the attempts of run {id}"))?;
        Ok(rows
            .into_iter()
            .map(|r| AttemptRow {
                attempt: r.get("attempt"),
                worker_id: r.get("worker_id"),
                state: r.get("state"),
                started_at: r.get("started_at"),
                finished_at: r.get("finished_at"),
                error: r.get("error"),
            })
            .collect())
    }

    /// The log lines of run `id`, in order.
    pub async fn logs(&self, id: i64) -> anyhow::Result<Vec<LogRow>> {
        let rows =
            sqlx::query("SELECT id, at, message FROM chime_run_logs WHERE run_id = $1 ORDER BY id")
                .bind(id)
                .fetch_all(&self.pool)
                .await
                .with_context(|| format!("reading the log lines of run {id}"))?;
        Ok(rows
            .into_iter()
            .map(|r| LogRow {
                id: r.get("id"),
                at: r.get("at"),
                message: r.get("message"),
            })
            .collect())
    }

    /// Waits until run `id` has logged `message`.
    pub async fn wait_logged(
        &self,
        id: i64,
        message: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let what = format!("run {id} to log {message:?}");
        try_wait_for(timeout, &what, || async {
            let logs = self.logs(id).await.map_err(|e| format!("{e:#}"))?;
            let messages: Vec<String> = logs.into_iter().map(|l| l.message).collect();
            if messages.iter().any(|m| m == message) {
                Ok(())
            } else {
                Err(format!("lines {messages:?}"))
            }
        })
        .await?;
        Ok(())
    }

    /// A connection to the broker.
    pub async fn broker(&self) -> anyhow::Result<lapin::Connection> {
        lapin::Connection::connect(
            &self.config.amqp_url,
            lapin::ConnectionProperties::default(),
        )
        .await
        .context("connecting to RabbitMQ")
    }

    /// Stops the scheduler, deletes the broker objects, drops the database and the role.
    /// Worker processes are the scenario's: they are gone (dropped) before this runs.
    pub async fn finish(mut self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        if let Some(scheduler) = self.scheduler.take()
            && let Err(e) = scheduler.stop().await
        {
            problems.push(format!("the scheduler did not stop cleanly: {e:#}"));
        }
        if let Some(guard) = self.guard.take()
            && let Err(e) = guard.try_delete().await
        {
            problems.push(format!("deleting the broker objects: {e}"));
        }
        self.ops.close().await;
        self.pool.close().await;
        if let Err(e) = self
            .admin
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                r#"DROP DATABASE IF EXISTS "{}" WITH (FORCE)"#,
                self.database
            ))))
            .await
        {
            problems.push(format!("dropping database {}: {e}", self.database));
        }
        if let Some(role) = self.role.take()
            && let Err(e) = self
                .admin
                .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    r#"DROP ROLE IF EXISTS "{}""#,
                    role.name
                ))))
                .await
        {
            problems.push(format!("dropping role {}: {e}", role.name));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("cleanup: {}", problems.join("; "))
        }
    }
}
