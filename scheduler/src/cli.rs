//! The `chime` command line: run a scheduler, migrate, check job files, and control jobs, runs
//! and the parking lot at runtime (every listing also as `--output json`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::{ArgGroup, Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets};
use serde::Serialize;

use crate::auth::{Caller, Role};
pub use crate::ops::Broker;
use crate::ops::{
    Cancelled, FieldProblem, JobView, MAX_PAGE, MAX_TASK_PAGE, Operations, OpsError, OpsResult,
    TASK_PAGE, TasksPage, TriggerOptions,
};
use crate::store::{RunDetail, RunQuery, RunRecord, Store};

mod backfills;
mod grants;
mod workflows;

/// Chime: a distributed job scheduler on PostgreSQL and RabbitMQ.
#[derive(Debug, Parser)]
#[command(name = "chime", version, about, long_about = None)]
pub struct Cli {
    /// Settings file (TOML or YAML); settings also come from CHIME_* environment variables.
    #[arg(long, short = 'c', global = true, env = "CHIME_CONFIG")]
    pub config: Option<PathBuf>,
    /// Output format of listings.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Who the audit log records for changing commands, as `cli:NAME` (default: `cli:$USER`,
    /// else `cli:uid-UID@HOST`).
    #[arg(long = "as", global = true, env = "CHIME_ACTOR", value_name = "NAME",
          value_parser = actor_name)]
    pub actor: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A readable table.
    Table,
    /// JSON, for scripts.
    Json,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scheduler instance (several may run against one database; one leads).
    Scheduler {
        /// Job files, in addition to the `jobs` setting.
        #[arg(long = "jobs", value_name = "FILE")]
        jobs: Vec<PathBuf>,
        /// Reload the job files when they change (a burst of changes: one reload, 500 ms after
        /// the last), as SIGHUP does; also the `watch` setting.
        #[arg(long)]
        watch: bool,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Validate job files and print each job's next 5 fire times (exit 1 on any error).
    Check {
        /// Job files (TOML or YAML).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Compare job files with what the cluster runs: per job added, removed or changed (each
    /// field, and the next fires before and after). Exit 0: no change; 2: changes; 1: errors.
    Diff {
        /// Job files (TOML or YAML): all those the schedulers load, since a job-file job that
        /// none of them declares shows as removed.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Inspect and control jobs.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Inspect and cancel runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Follow and cancel backfills (`chime jobs backfill` starts one).
    #[command(subcommand)]
    Backfills(BackfillsCommand),
    /// Inspect workflows and their runs; rerun from a node, cancel (`chime jobs trigger`
    /// starts one, `chime jobs pause` pauses one).
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
    /// Inspect, replay and purge the parking lot (dead letters).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// List workers.
    #[command(subcommand)]
    Workers(WorkersCommand),
    /// Create, list and revoke API tokens.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Print a shell completion script: `chime completions bash > /etc/bash_completion.d/chime`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// An RFC 3339 instant on the command line (`--at 2026-12-01T09:30:00Z`).
fn rfc3339(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{e}; write an RFC 3339 instant such as 2026-12-01T09:30:00Z"))
}

/// Longest `--as` name.
const MAX_ACTOR_LEN: usize = 100;

/// Checks an `--as`/`CHIME_ACTOR` name: printable, no spaces, at most [`MAX_ACTOR_LEN`] bytes.
fn actor_name(name: &str) -> Result<String, String> {
    if name.is_empty()
        || name.len() > MAX_ACTOR_LEN
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "use a name of 1 to {MAX_ACTOR_LEN} characters without spaces, such as \
             `--as alice` or `--as cron-nightly`"
        ));
    }
    Ok(name.to_owned())
}

/// `chime workers …`
#[derive(Debug, Subcommand)]
pub enum WorkersCommand {
    /// Workers online or stopped within the last day, with capacity and running runs.
    List,
    /// Let a database role act for one executor group as its workers (and nothing more):
    /// prints the SQL an administrator runs and the matching RabbitMQ permissions, or runs the
    /// SQL with --apply.
    Grant {
        /// The executor group.
        #[arg(long)]
        group: String,
        /// The role's name (default chime_worker_GROUP).
        #[arg(long)]
        role: Option<String>,
        /// Create it as a login role (with a password) instead of a group role to grant to
        /// each worker's login role.
        #[arg(long)]
        login: bool,
        /// Run the SQL (create the role if missing; with --login, print its new password once).
        #[arg(long)]
        apply: bool,
    },
    /// Withdraw a role's grant of one executor group (with no group left, all its rights).
    Revoke {
        /// The executor group.
        #[arg(long)]
        group: String,
        /// The role's name (default chime_worker_GROUP).
        #[arg(long)]
        role: Option<String>,
        /// Run the SQL instead of printing it.
        #[arg(long)]
        apply: bool,
    },
}

/// `chime tokens …`
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create an API token and print its secret (shown only this once; only a hash is stored).
    Create {
        /// What it may do.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// A unique name, shown in the audit log as `token:NAME`.
        #[arg(long)]
        name: String,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token: requests with it are refused from now on.
    Revoke {
        /// Token name.
        name: String,
    },
}

/// A role, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    /// Reads everything.
    Viewer,
    /// Also triggers, pauses, resumes, cancels, replays.
    Operator,
    /// Also creates, changes and deletes jobs, purges dead letters, manages tokens.
    Admin,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Role {
        match role {
            RoleArg::Viewer => Role::Viewer,
            RoleArg::Operator => Role::Operator,
            RoleArg::Admin => Role::Admin,
        }
    }
}

/// `chime dlq …`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List parked messages, oldest first, as the leader drained them into the database
    /// (reading changes nothing).
    List {
        /// Only this executor group's dead letters (default: every group).
        #[arg(long)]
        group: Option<String>,
        /// At most this many messages (at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only those drained after this dead letter id (the `id` of the last row of the
        /// previous page, as `--output json` shows it).
        #[arg(long)]
        after: Option<i64>,
    },
    /// Run a parked run again as a new attempt, and remove its message from the parking lot.
    #[command(group(ArgGroup::new("which").required(true).args(["id", "all"])))]
    Replay {
        /// Run id.
        id: Option<i64>,
        /// Every parked message that has a run (of --group, or of every group).
        #[arg(long)]
        all: bool,
        /// With --all: only this executor group.
        #[arg(long, conflicts_with = "id")]
        group: Option<String>,
    },
    /// Empty the parking lot: delete the dead letters and the messages not drained yet (their
    /// runs stay as they are).
    Purge {
        /// Only this executor group's parking lot (default: every group that has a job).
        #[arg(long)]
        group: Option<String>,
    },
}

/// `chime jobs …`
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs with their schedule and next fire.
    List,
    /// Show a job's definition, next fire and state.
    Show {
        /// Job name.
        name: String,
    },
    /// Delete a job created through the API (jobs from job files are removed from the file).
    Delete {
        /// Job name.
        name: String,
    },
    /// Trigger a job now (also when paused).
    Trigger {
        /// Job name.
        name: String,
        /// Parameters (JSON) replacing the job's own for this run.
        #[arg(long)]
        params: Option<String>,
        /// Run it at this instant (RFC 3339) instead of now: up to 366 days ahead.
        #[arg(long, value_parser = rfc3339)]
        at: Option<DateTime<Utc>>,
        /// Triggering again with the same key makes no second run (1 to 200 bytes).
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Stop planning a job's fires (manual triggers still work).
    Pause {
        /// Job name.
        name: String,
    },
    /// Resume planning a job's fires from now on.
    Resume {
        /// Job name.
        name: String,
    },
    /// A job's definition versions: each change (job file reload, API or CLI edit) with who
    /// made it, when, and which fields it changed.
    History {
        /// Job name.
        name: String,
    },
    /// Make the fires of a past range into runs, as one batch: a fire that has a run already
    /// keeps it (a repeated or overlapping backfill makes no second run of a fire).
    #[command(group(ArgGroup::new("concurrency").args(["parallel", "serial"])))]
    Backfill {
        /// Job name.
        name: String,
        /// Fires at or after this instant: RFC 3339, or a date (`2026-11-01`: its midnight in
        /// the job's time zone).
        #[arg(long, value_name = "INSTANT")]
        from: String,
        /// …and before this one (left out), not after now.
        #[arg(long, value_name = "INSTANT")]
        to: String,
        /// Runs of the backfill unfinished at once (1 to 100).
        #[arg(long, value_name = "N", default_value_t = crate::ops::DEFAULT_PARALLEL)]
        parallel: u32,
        /// One run after the other (`--parallel 1`).
        #[arg(long)]
        serial: bool,
        /// Runs made per second, at most (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = crate::ops::DEFAULT_RATE)]
        rate: u32,
        /// Only print the fires and which of them have a run already; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Put back an earlier definition of a job created through the API, as a new version.
    Rollback {
        /// Job name.
        name: String,
        /// The version to put back (`chime jobs history` lists them).
        #[arg(long, value_name = "VERSION")]
        to: i32,
    },
}

/// `chime backfills …`
#[derive(Debug, Subcommand)]
pub enum BackfillsCommand {
    /// List backfills, newest first, with their progress.
    List {
        /// Only this job's.
        #[arg(long)]
        job: Option<String>,
        /// Only those in this state (`running`, `done`, `cancelled`).
        #[arg(long)]
        state: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// Show a backfill: its range, progress and runs by state.
    Show {
        /// Backfill id.
        id: i64,
    },
    /// Cancel a backfill: it makes no more runs, its waiting runs are cancelled and its
    /// running ones are stopped through their workers.
    Cancel {
        /// Backfill id.
        id: i64,
    },
}

/// `chime workflows …`
#[derive(Debug, Subcommand)]
pub enum WorkflowsCommand {
    /// List workflows.
    List,
    /// Show a workflow's nodes, layer by layer.
    Show {
        /// Workflow name.
        name: String,
    },
    /// List a workflow's runs, newest first.
    Runs {
        /// Workflow name.
        name: String,
        /// Only runs in this state.
        #[arg(long)]
        state: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// Show a workflow run: each node's run, layer by layer (waiting nodes have none yet).
    Run {
        /// Workflow run id.
        id: i64,
    },
    /// Rerun an ended workflow run from a node: it and every node after it run again.
    Rerun {
        /// Workflow run id.
        id: i64,
        /// The node to rerun from.
        #[arg(long)]
        node: String,
    },
    /// Cancel a workflow run: waiting nodes are skipped, running ones stopped through their
    /// workers.
    Cancel {
        /// Workflow run id.
        id: i64,
    },
}

/// `chime runs …`
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List recent runs, newest first.
    List {
        /// Only this job's runs.
        #[arg(long)]
        job: Option<String>,
        /// Only runs in this state.
        #[arg(long)]
        state: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
        /// List tasks too (the runs of broadcast, sharded and map/reduce fires); by default
        /// only top-level runs, one per fire.
        #[arg(long)]
        tasks: bool,
        /// Only the runs of this backfill (`chime backfills list`).
        #[arg(long, value_name = "ID")]
        backfill: Option<i64>,
    },
    /// Show a run with its attempts and log lines; a run with tasks with its tasks (a page of
    /// them, in creation order), a task with its parent.
    Show {
        /// Run id.
        id: i64,
        /// The page of tasks after this task id (as the previous page names it).
        #[arg(long, value_name = "TASK_ID")]
        tasks_after: Option<i64>,
        /// Only tasks in this state.
        #[arg(long, value_name = "STATE")]
        task_state: Option<String>,
        /// Tasks per page (1 to 1000).
        #[arg(long, default_value_t = TASK_PAGE)]
        task_limit: i64,
    },
    /// Cancel a run: a waiting one at once, a running one through its worker (a run with tasks:
    /// each of its tasks).
    Cancel {
        /// Run id.
        id: i64,
    },
    /// Rerun the failed tasks of a finished run with tasks, in the same run.
    RetryFailed {
        /// Run id (the parent, as `chime runs list` shows it).
        id: i64,
    },
}

/// Runs a runtime command against the database; returns the process exit code. Commands that
/// need the broker (`runs cancel`, `dlq …`) fail here: use [`operate`].
pub async fn control(
    store: &Store,
    output: Output,
    command: Command,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    operate(store, None, output, command, out).await
}

/// Runs a runtime command against the database and, when it needs one, the broker; returns the
/// process exit code. The command goes through [`Operations`] as the local CLI caller
/// ([`Caller::cli`]), like an API request, so it is authorized and audited in the same place.
pub async fn operate(
    store: &Store,
    broker: Option<&Broker>,
    output: Output,
    command: Command,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    operate_as(store, broker, &Caller::cli(), output, command, out).await
}

/// [`operate`] for `caller` (`chime --as NAME …`: [`Caller::cli_as`]).
pub async fn operate_as(
    store: &Store,
    broker: Option<&Broker>,
    caller: &Caller,
    output: Output,
    command: Command,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let ops = Operations::new(store.clone(), broker.cloned());
    let result = execute(&ops, caller, output, command, out).await;
    ops.close().await;
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(OpsError::Internal(e)) => Err(e),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn execute(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: Command,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        Command::Jobs(command) => jobs(ops, caller, output, command, out).await,
        Command::Runs(command) => runs(ops, caller, output, command, out).await,
        Command::Backfills(command) => {
            backfills::backfills(ops, caller, output, command, out).await
        }
        Command::Workflows(command) => {
            workflows::workflows(ops, caller, output, command, out).await
        }
        Command::Dlq(command) => dlq(ops, caller, output, command, out).await,
        Command::Workers(WorkersCommand::List) => {
            let workers = ops.workers(caller).await?;
            render(output, out, &workers, |t| {
                t.set_header([
                    "WORKER",
                    "GROUP",
                    "HOST",
                    "ONLINE",
                    "CAPACITY",
                    "RUNNING",
                    "HEARTBEAT",
                ]);
                for w in &workers {
                    t.add_row([
                        w.id.clone(),
                        w.group.clone(),
                        w.hostname.clone(),
                        if w.online { "yes" } else { "no" }.into(),
                        w.capacity.to_string(),
                        w.running.to_string(),
                        time(Some(w.heartbeat_at)),
                    ]);
                }
            })
        }
        Command::Workers(command) => grants::workers(ops, caller, command, out).await,
        Command::Tokens(command) => tokens(ops, caller, output, command, out).await,
        Command::Scheduler { .. }
        | Command::Migrate
        | Command::Check { .. }
        | Command::Diff { .. }
        | Command::Completions { .. } => Err(OpsError::Internal(anyhow::anyhow!(
            "not a runtime control command"
        ))),
    }
}

async fn jobs(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: JobsCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        JobsCommand::List => {
            let jobs = ops.jobs(caller).await?;
            render(output, out, &jobs, |t| {
                t.set_header(["NAME", "GROUP", "SCHEDULE", "NEXT FIRE", "PAUSED", "SOURCE"]);
                for j in &jobs {
                    t.add_row([
                        j.name.clone(),
                        j.group.clone(),
                        j.schedule.clone(),
                        zoned(j.next_fire, &j.timezone),
                        paused(j),
                        j.source.clone(),
                    ]);
                }
            })
        }
        JobsCommand::Show { name } => {
            let job = ops.job(caller, &name).await?;
            if output == Output::Json {
                return json_out(out, &job);
            }
            show_job(&job, out).map_err(io)
        }
        JobsCommand::Trigger {
            name,
            params,
            at,
            idempotency_key,
        } => {
            let params = params
                .map(|p| {
                    serde_json::from_str::<serde_json::Value>(&p).map_err(|e| {
                        OpsError::Invalid(vec![FieldProblem {
                            field: Some("--params".into()),
                            value: Some(format!("{p:?}")),
                            message: format!(
                                "not JSON ({e}); pass an object such as '{{\"batch\": 10}}'"
                            ),
                        }])
                    })
                })
                .transpose()?;
            if let Some(p) = params.as_ref().filter(|p| !p.is_object() && !p.is_null()) {
                return Err(OpsError::Invalid(vec![FieldProblem {
                    field: Some("--params".into()),
                    value: Some(p.to_string()),
                    message: "params must be a JSON object of named values; pass one such as \
                              '{\"batch\": 10}'"
                        .into(),
                }]));
            }
            let options = TriggerOptions {
                params,
                at,
                idempotency_key,
            };
            let triggered = ops.trigger_with(caller, &name, options).await?;
            match output {
                Output::Json => json_line(out, &triggered)?,
                Output::Table if triggered.created => {
                    writeln!(out, "triggered {name}: run {}", triggered.run_id).map_err(io)?
                }
                Output::Table => writeln!(
                    out,
                    "{name} was triggered with this key before: run {}",
                    triggered.run_id
                )
                .map_err(io)?,
            }
            for warning in &triggered.warnings {
                eprintln!("warning: {warning}");
            }
            Ok(())
        }
        JobsCommand::Pause { name } => {
            ops.set_paused(caller, &name, true).await?;
            writeln!(out, "paused {name}").map_err(io)
        }
        JobsCommand::Resume { name } => {
            ops.set_paused(caller, &name, false).await?;
            writeln!(out, "resumed {name}").map_err(io)
        }
        JobsCommand::Delete { name } => {
            ops.delete_job(caller, &name).await?;
            writeln!(out, "deleted {name}").map_err(io)
        }
        JobsCommand::History { name } => {
            let versions = ops.job_history(caller, &name).await?;
            render(output, out, &versions, |t| {
                t.set_header(["VERSION", "AT", "BY", "SOURCE", "CHANGES"]);
                for v in &versions {
                    let changes = if v.version == 1 || v.changes.is_empty() {
                        if v.version == 1 {
                            "created"
                        } else {
                            "no field changed"
                        }
                        .to_owned()
                    } else {
                        v.changes
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("\n")
                    };
                    let number = if v.current {
                        format!("{} (current)", v.version)
                    } else {
                        v.version.to_string()
                    };
                    t.add_row([
                        number,
                        time(Some(v.at)),
                        v.actor.clone(),
                        v.source.clone(),
                        changes,
                    ]);
                }
            })
        }
        JobsCommand::Backfill {
            name,
            from,
            to,
            parallel,
            serial,
            rate,
            dry_run,
        } => {
            let request = crate::ops::BackfillRequest {
                from,
                to,
                parallel: Some(if serial { 1 } else { parallel }),
                rate: Some(rate),
                dry_run,
            };
            backfills::start(ops, caller, output, &name, &request, out).await
        }
        JobsCommand::Rollback { name, to } => {
            let job = ops.rollback_job(caller, &name, to).await?;
            writeln!(
                out,
                "rolled {name} back to version {to}, now version {}",
                job.version
            )
            .map_err(io)
        }
    }
}

async fn runs(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: RunsCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        RunsCommand::List {
            job,
            state,
            limit,
            tasks,
            backfill,
        } => {
            let zones = job_zones(ops, caller).await?;
            let page = ops
                .runs(
                    caller,
                    RunQuery {
                        job,
                        state,
                        limit: limit.clamp(1, MAX_PAGE),
                        include_tasks: tasks,
                        backfill,
                        ..RunQuery::default()
                    },
                )
                .await?;
            let runs = page.runs;
            render(output, out, &runs, |t| {
                t.set_header([
                    "ID",
                    "JOB",
                    "STATE",
                    "TRIGGER",
                    "SCHEDULED",
                    "STARTED",
                    "TOOK",
                    "ATTEMPT",
                    "TASKS",
                    "NOTE",
                ]);
                for r in &runs {
                    t.add_row([
                        r.id.to_string(),
                        r.job.clone(),
                        r.state.clone(),
                        r.trigger.clone(),
                        zoned(Some(r.scheduled_at), zone_of(&zones, &r.job)),
                        zoned(r.started_at, zone_of(&zones, &r.job)),
                        took(r),
                        r.attempt.to_string(),
                        tasks_cell(r),
                        r.reason
                            .clone()
                            .or_else(|| r.error.clone())
                            .unwrap_or_default(),
                    ]);
                }
            })
        }
        RunsCommand::Show {
            id,
            tasks_after,
            task_state,
            task_limit,
        } => {
            let detail = ops.run(caller, id).await?;
            let tasks = if detail.run.tasks_total > 0 {
                let limit = task_limit.clamp(1, MAX_TASK_PAGE);
                Some(
                    ops.tasks(caller, id, tasks_after, task_state.clone(), limit)
                        .await?,
                )
            } else {
                None
            };
            if output == Output::Json {
                let mut value = serde_json::to_value(&detail).map_err(anyhow::Error::from)?;
                if let (Some(page), Some(map)) = (&tasks, value.as_object_mut()) {
                    map.insert(
                        "tasks".into(),
                        serde_json::to_value(&page.tasks).map_err(anyhow::Error::from)?,
                    );
                    map.insert("tasks_next_after".into(), page.next_after.into());
                }
                return json_out(out, &value);
            }
            // The job's zone, if the job still exists (its runs outlive it).
            let zone = match ops.job(caller, &detail.run.job).await {
                Ok(job) => job.timezone,
                Err(_) => "UTC".to_owned(),
            };
            show_run(&detail, &zone, out).map_err(io)?;
            if let Some(page) = &tasks {
                let shown = TaskListing {
                    run: &detail,
                    page,
                    after: tasks_after,
                    state: task_state.as_deref(),
                };
                shown.write(&zone, out).map_err(io)?;
            }
            Ok(())
        }
        RunsCommand::RetryFailed { id } => {
            let retried = ops.retry_failed(caller, id).await?;
            if output == Output::Json {
                return json_line(out, &retried);
            }
            writeln!(
                out,
                "rerunning {} task{} of run {id} of {} (the same run: `chime runs show {id}` \
                 follows it)",
                retried.rerun,
                if retried.rerun == 1 { "" } else { "s" },
                retried.job
            )
            .map_err(io)
        }
        RunsCommand::Cancel { id } => {
            let cancelled = ops.cancel_run(caller, id).await?;
            match (output, &cancelled) {
                (Output::Json, Cancelled::Cancelled { .. }) => json_line(out, &cancelled),
                (
                    Output::Json,
                    Cancelled::CancelRequested {
                        job,
                        requested_before,
                        control_message,
                        ..
                    },
                ) => json_line(
                    out,
                    &serde_json::json!({"run_id": id, "job": job, "outcome": "cancel_requested",
                                       "previous_state": "running",
                                       "requested_before": requested_before,
                                       "control_message": control_message}),
                ),
                (
                    Output::Table,
                    Cancelled::Cancelled {
                        job,
                        previous_state,
                        ..
                    },
                ) => writeln!(
                    out,
                    "cancelled run {id} of {job} (it was {previous_state}; it will not run)"
                )
                .map_err(io),
                (
                    Output::Table,
                    Cancelled::CancelRequested {
                        job,
                        control_message,
                        ..
                    },
                ) if *control_message == "delivered" => writeln!(
                    out,
                    "cancel requested for run {id} of {job}: its worker was told and records the \
                     attempt as cancelled"
                )
                .map_err(io),
                (Output::Table, Cancelled::CancelRequested { job, .. }) => writeln!(
                    out,
                    "cancel requested for run {id} of {job}, but no worker is listening for \
                     control messages; the rescuer records it as cancelled once its worker is \
                     found lost"
                )
                .map_err(io),
            }
        }
    }
}

/// `paused` of a job as listed: `no`, or `yes` and by whom.
fn paused(job: &JobView) -> String {
    match (job.paused, job.paused_by.as_deref()) {
        (false, _) => "no".into(),
        (true, Some("file")) => "yes (job file)".into(),
        (true, Some(by)) => format!("yes ({by})"),
        (true, None) => "yes".into(),
    }
}

/// `chime jobs show`: one `key  value` line per fact, then the definition as indented JSON.
fn show_job(job: &JobView, out: &mut dyn Write) -> std::io::Result<()> {
    for (k, v) in [
        ("job", job.name.clone()),
        ("group", job.group.clone()),
        ("schedule", job.schedule.clone()),
        ("next fire", zoned(job.next_fire, &job.timezone)),
        ("next (UTC)", time(job.next_fire)),
        ("time zone", job.timezone.clone()),
        ("paused", paused(job)),
        ("source", job.source.clone()),
    ] {
        writeln!(out, "{k:<10} {v}")?;
    }
    let definition = serde_json::to_string_pretty(&job.spec)?;
    writeln!(out, "definition:")?;
    for line in definition.lines() {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// Longest JSON text of params or output `chime runs show` prints (`-o json` has them whole).
const MAX_SHOWN_JSON_BYTES: usize = 2048;

/// Longest text of one cell of the task table (output, error).
const MAX_TASK_CELL_BYTES: usize = 60;

/// The TASKS cell of a run in a list: a parent's progress, a task's parent and key.
fn tasks_cell(r: &RunRecord) -> String {
    match (&r.progress, r.parent_id) {
        (Some(progress), _) => progress.clone(),
        (None, Some(parent)) => {
            format!("task of {parent}: {}", r.task_key.as_deref().unwrap_or("?"))
        }
        (None, None) => String::new(),
    }
}

/// `value` as compact JSON of at most `max` bytes (cut with `…[truncated]`).
fn capped_json(value: &serde_json::Value, max: usize) -> String {
    chime_protocol::limits::cap_bytes(&value.to_string(), max).into_owned()
}

/// A task's place in its run: `shard 3/12 {"region":"eu"}`, `worker w-1`, `step resize (depth
/// 1)`, `root`, `reduce`.
fn task_place(r: &RunRecord) -> String {
    match r.task_kind.as_deref() {
        Some("shard") => {
            let mut text = format!(
                "shard {}/{}",
                r.shard_index.map_or("?".into(), |i| i.to_string()),
                r.shard_total.map_or("?".into(), |n| n.to_string())
            );
            if let Some(param) = &r.shard_param {
                text.push(' ');
                text.push_str(&capped_json(param, MAX_TASK_CELL_BYTES));
            }
            text
        }
        Some("broadcast") => format!("worker {}", r.target_worker.as_deref().unwrap_or("?")),
        Some("map") => format!(
            "step {} (depth {})",
            r.map_step.as_deref().unwrap_or("?"),
            r.map_depth.unwrap_or(0)
        ),
        Some(kind) => kind.to_owned(),
        None => String::new(),
    }
}

/// A page of a parent run's tasks as `chime runs show` prints it after the run.
struct TaskListing<'a> {
    run: &'a RunDetail,
    page: &'a TasksPage,
    after: Option<i64>,
    state: Option<&'a str>,
}

impl TaskListing<'_> {
    fn write(&self, zone: &str, out: &mut dyn Write) -> std::io::Result<()> {
        let (run, page) = (&self.run.run, self.page);
        let by_state = self
            .run
            .tasks_by_state
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            out,
            "\ntasks: {} ({by_state})",
            page.progress.as_deref().unwrap_or("none")
        )?;
        let mut t = table();
        t.set_header([
            "TASK",
            "KEY",
            "STATE",
            "WORKER",
            "ATTEMPT",
            "PLACE",
            "STARTED",
            "TOOK",
            "OUTPUT/ERROR",
        ]);
        for task in &page.tasks {
            let note = match (&task.error, &task.output) {
                (Some(error), _) => {
                    chime_protocol::limits::cap_bytes(error, MAX_TASK_CELL_BYTES).into_owned()
                }
                (None, Some(output)) => capped_json(output, MAX_TASK_CELL_BYTES),
                (None, None) => task.reason.clone().unwrap_or_default(),
            };
            t.add_row([
                task.id.to_string(),
                task.task_key.clone().unwrap_or_default(),
                task.state.clone(),
                task.worker_id.clone().unwrap_or_default(),
                task.attempt.to_string(),
                task_place(task),
                zoned(task.started_at, zone),
                took(task),
                note,
            ]);
        }
        writeln!(out, "{t}")?;
        // Of the first page, how many follow is known from the counters.
        let matching = match self.state {
            Some(state) => self.run.tasks_by_state.get(state).copied().unwrap_or(0),
            None => i64::from(run.tasks_total),
        };
        let filter = self
            .state
            .map(|s| format!(" --task-state {s}"))
            .unwrap_or_default();
        if let Some(next) = page.next_after {
            let more = if self.after.is_none() {
                format!("{} more", matching - page.tasks.len() as i64)
            } else {
                "more".to_owned()
            };
            writeln!(
                out,
                "{more}: chime runs show {} --tasks-after {next}{filter}",
                run.id
            )?;
        }
        Ok(())
    }
}

fn show_run(detail: &RunDetail, zone: &str, out: &mut dyn Write) -> std::io::Result<()> {
    let r = &detail.run;
    let time = |t: Option<DateTime<Utc>>| zoned(t, zone);
    let mut t = table();
    let mut task_rows = Vec::new();
    if let Some(parent) = &detail.parent {
        task_rows.push((
            "parent",
            format!(
                "{} ({}{})",
                parent.id,
                parent.state,
                parent
                    .progress
                    .as_deref()
                    .map(|p| format!(", {p}"))
                    .unwrap_or_default()
            ),
        ));
        task_rows.push(("task", r.task_key.clone().unwrap_or_default()));
        task_rows.push(("place", task_place(r)));
    }
    if let Some(progress) = &r.progress {
        task_rows.push(("tasks", progress.clone()));
    }
    if let Some(output) = &r.output {
        task_rows.push(("output", capped_json(output, MAX_SHOWN_JSON_BYTES)));
    }
    if !detail.children.is_empty() {
        let children: Vec<String> = detail
            .children
            .iter()
            .map(|c| format!("{} {} ({})", c.id, c.job, c.state))
            .collect();
        task_rows.push(("children", children.join(", ")));
    }
    for (k, v) in [
        ("run", r.id.to_string()),
        ("job", r.job.clone()),
        ("group", r.group.clone()),
        ("state", r.state.clone()),
        (
            "trigger",
            match r.upstream_run_id {
                Some(upstream) => format!("{} (after run {upstream})", r.trigger),
                None => r.trigger.clone(),
            },
        ),
        (
            "job version",
            r.job_version.map(|v| v.to_string()).unwrap_or_default(),
        ),
        ("scheduled", time(Some(r.scheduled_at))),
        ("published", time(r.published_at)),
        ("started", time(r.started_at)),
        ("finished", time(r.finished_at)),
        ("attempts", r.attempt.to_string()),
        ("params", capped_json(&r.params, MAX_SHOWN_JSON_BYTES)),
        ("reason", r.reason.clone().unwrap_or_default()),
        ("error", r.error.clone().unwrap_or_default()),
        ("next attempt", time(r.next_attempt_at)),
        (
            "cancel asked",
            match (&r.cancel_requested_by, r.cancel_requested_at) {
                (Some(by), at) => format!("{} by {by}", time(at)),
                _ => "-".into(),
            },
        ),
        (
            "replayed",
            match (&r.replayed_by, r.replayed_at) {
                (Some(by), at) => format!("{} by {by}", time(at)),
                _ => "-".into(),
            },
        ),
    ]
    .into_iter()
    .chain(task_rows)
    {
        t.add_row([k.to_owned(), v]);
    }
    writeln!(out, "{t}")?;
    let mut a = table();
    a.set_header(["ATTEMPT", "WORKER", "STATE", "STARTED", "TOOK", "ERROR"]);
    for at in &detail.attempts {
        a.add_row([
            at.attempt.to_string(),
            at.worker_id.clone(),
            at.state.clone(),
            time(Some(at.started_at)),
            at.duration_ms.map(human_ms).unwrap_or_default(),
            at.error.clone().unwrap_or_default(),
        ]);
    }
    writeln!(out, "\n{a}")?;
    writeln!(out, "\nlog:")?;
    for l in &detail.logs {
        writeln!(
            out,
            "  {} #{} {:5} {}",
            time(Some(l.at)),
            l.attempt,
            l.level,
            l.message
        )?;
    }
    Ok(())
}

/// `chime dlq …`.
async fn dlq(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: DlqCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        DlqCommand::List {
            group,
            limit,
            after,
        } => {
            let rows = ops
                .dead_letters(caller, group, after, limit)
                .await?
                .dead_letters;
            render(output, out, &rows, |t| {
                t.set_header([
                    "RUN",
                    "GROUP",
                    "JOB",
                    "ATTEMPT",
                    "REASON",
                    "ERROR",
                    "PARKED",
                    "RUN STATE",
                ]);
                for r in &rows {
                    t.add_row([
                        r.run_id
                            .map(|id| id.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r.group.clone(),
                        r.job.clone().unwrap_or_else(|| "-".into()),
                        r.attempt
                            .map(|a| a.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r.reason.clone().unwrap_or_default(),
                        r.error.clone().unwrap_or_default(),
                        time(r.parked_at),
                        r.run_state.clone().unwrap_or_else(|| "(no run)".into()),
                    ]);
                }
            })
        }
        DlqCommand::Replay {
            id: Some(id),
            all: false,
            ..
        } => {
            let replayed = ops.replay(caller, id).await?;
            match output {
                Output::Json => json_line(out, &replayed),
                Output::Table => writeln!(
                    out,
                    "replayed run {id} of {} as attempt {}{}",
                    replayed.job,
                    replayed.attempt,
                    if replayed.removed_messages > 0 {
                        format!("; removed {} parked message(s)", replayed.removed_messages)
                    } else {
                        "; it had no message in the parking lot".to_owned()
                    }
                )
                .map_err(io),
            }
        }
        DlqCommand::Replay { group, .. } => {
            let all = ops.replay_all(caller, group).await?;
            match output {
                Output::Json => json_line(out, &all),
                Output::Table => {
                    writeln!(out, "replayed {} runs", all.replayed.len()).map_err(io)?;
                    for k in &all.kept {
                        writeln!(out, "kept {}", k.note).map_err(io)?;
                    }
                    Ok(())
                }
            }
        }
        DlqCommand::Purge { group } => {
            let purged = ops.purge(caller, group).await?;
            match output {
                Output::Json => json_out(out, &purged),
                Output::Table => {
                    for p in &purged {
                        writeln!(out, "purged {} messages from {}", p.purged, p.queue)
                            .map_err(io)?;
                    }
                    Ok(())
                }
            }
        }
    }
}

/// `chime tokens …`.
async fn tokens(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: TokensCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        TokensCommand::Create { name, role } => {
            let token = ops.create_token(caller, &name, role.into()).await?;
            match output {
                Output::Json => json_line(out, &token),
                Output::Table => writeln!(
                    out,
                    "created {} token {name:?}. Its secret, shown only this once:\n\n  {}\n\n\
                     Send it as `Authorization: Bearer SECRET`.",
                    token.token.role, token.secret
                )
                .map_err(io),
            }
        }
        TokensCommand::List => {
            let tokens = ops.tokens(caller).await?;
            render(output, out, &tokens, |t| {
                t.set_header(["NAME", "ROLE", "CREATED", "BY", "LAST USED", "REVOKED"]);
                for k in &tokens {
                    t.add_row([
                        k.name.clone(),
                        k.role.clone(),
                        time(Some(k.created_at)),
                        k.created_by.clone(),
                        time(k.last_used_at),
                        time(k.revoked_at),
                    ]);
                }
            })
        }
        TokensCommand::Revoke { name } => {
            ops.revoke_token(caller, &name).await?;
            writeln!(out, "revoked token {name:?}").map_err(io)
        }
    }
}

/// An error as `chime` prints it: its chain of causes on one line, each said once (a cause
/// whose text the line already holds is left out), database errors without the server's source
/// location, and, when the database or Chime's tables are missing, the fix.
pub fn error_report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        // A database error ends the chain: its message says it all, whereas its Display and
        // its source add the server's source line ("… at line 948").
        let database = match cause.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Database(e)) => Some(e.message().to_owned()),
            _ => None,
        };
        let part = database.clone().unwrap_or_else(|| cause.to_string());
        if !part.is_empty() && !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        if database.is_some() {
            break;
        }
    }
    if needs_migrate(error) {
        text.push_str(
            "\nhint: run `chime migrate` first (with the same settings): it creates the \
             database and its tables",
        );
    }
    text
}

/// Whether `error` says the database (SQLSTATE 3D000) or one of its tables (42P01) does not
/// exist.
fn needs_migrate(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("3D000" | "42P01"))
        )
    })
}

fn io(e: std::io::Error) -> OpsError {
    OpsError::Internal(anyhow::Error::from(e).context("writing the output"))
}

fn json_out<T: Serialize>(out: &mut dyn Write, value: &T) -> OpsResult<()> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(anyhow::Error::from)?;
    writeln!(out).map_err(io)
}

fn json_line<T: Serialize>(out: &mut dyn Write, value: &T) -> OpsResult<()> {
    serde_json::to_writer(&mut *out, value).map_err(anyhow::Error::from)?;
    writeln!(out).map_err(io)
}

fn render<T: Serialize>(
    output: Output,
    out: &mut dyn Write,
    rows: &T,
    fill: impl FnOnce(&mut Table),
) -> OpsResult<()> {
    match output {
        Output::Json => json_out(out, rows),
        Output::Table => {
            let mut t = table();
            fill(&mut t);
            writeln!(out, "{t}").map_err(io)
        }
    }
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| "-".into())
}

/// `t` in the IANA zone `zone` (`2026-12-02 09:30:00.000 +08:00`), UTC as `…Z`; an unknown
/// zone falls back to UTC.
fn zoned(t: Option<DateTime<Utc>>, zone: &str) -> String {
    match (t, zone.parse::<chrono_tz::Tz>()) {
        (Some(t), Ok(tz)) if tz != chrono_tz::UTC => t
            .with_timezone(&tz)
            .format("%Y-%m-%d %H:%M:%S%.3f %:z")
            .to_string(),
        _ => time(t),
    }
}

/// Each job's time zone by name, for lists of runs of many jobs.
async fn job_zones(
    ops: &Operations,
    caller: &Caller,
) -> OpsResult<std::collections::HashMap<String, String>> {
    Ok(ops
        .jobs(caller)
        .await?
        .into_iter()
        .map(|j| (j.name, j.timezone))
        .collect())
}

/// A job's zone from [`job_zones`]; UTC for a job that is gone.
fn zone_of<'a>(zones: &'a std::collections::HashMap<String, String>, job: &str) -> &'a str {
    zones.get(job).map_or("UTC", String::as_str)
}

/// A duration for people: `850 ms`, `10.9 s`, `3 min 5 s`, `2 h 4 min`.
fn human_ms(ms: i64) -> String {
    match ms {
        ..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn took(r: &RunRecord) -> String {
    match (r.started_at, r.finished_at) {
        (Some(s), Some(f)) => human_ms((f - s).num_milliseconds()),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them_and_times_in_the_jobs_zone() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(10_873), "10.9 s");
        assert_eq!(human_ms(185_000), "3 min 5 s");
        assert_eq!(human_ms(7_440_000), "2 h 4 min");
        let t = DateTime::parse_from_rfc3339("2026-12-02T01:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            zoned(Some(t), "Asia/Shanghai"),
            "2026-12-02 09:30:00.000 +08:00"
        );
        assert_eq!(zoned(Some(t), "UTC"), "2026-12-02 01:30:00.000Z");
        assert_eq!(zoned(Some(t), "Not/AZone"), "2026-12-02 01:30:00.000Z");
        assert_eq!(zoned(None, "Asia/Shanghai"), "-");
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("chime").chain(args.iter().copied())).map(|c| c.command)
    }

    #[test]
    fn scheduler_watch_is_off_unless_asked_for() {
        assert!(matches!(
            parse(&["scheduler", "--jobs", "jobs.toml"]),
            Ok(Command::Scheduler { watch: false, .. })
        ));
        assert!(matches!(
            parse(&["scheduler", "--watch"]),
            Ok(Command::Scheduler { watch: true, jobs }) if jobs.is_empty()
        ));
    }

    #[test]
    fn dlq_replay_takes_an_id_or_all() {
        assert!(matches!(
            parse(&["dlq", "replay", "42"]),
            Ok(Command::Dlq(DlqCommand::Replay {
                id: Some(42),
                all: false,
                group: None
            }))
        ));
        assert!(matches!(
            parse(&["dlq", "replay", "--all", "--group", "orders"]),
            Ok(Command::Dlq(DlqCommand::Replay { id: None, all: true, group: Some(g) })) if g == "orders"
        ));
        assert!(
            parse(&["dlq", "replay"]).is_err(),
            "one of ID and --all is needed"
        );
        assert!(
            parse(&["dlq", "replay", "42", "--all"]).is_err(),
            "not both"
        );
        assert!(
            parse(&["dlq", "replay", "42", "--group", "g"]).is_err(),
            "--group goes with --all"
        );
    }

    #[test]
    fn tokens_create_needs_a_known_role_and_a_name() {
        assert!(matches!(
            parse(&["tokens", "create", "--role", "operator", "--name", "alice"]),
            Ok(Command::Tokens(TokensCommand::Create { role: RoleArg::Operator, name }))
                if name == "alice"
        ));
        assert!(parse(&["tokens", "create", "--role", "root", "--name", "a"]).is_err());
        assert!(parse(&["tokens", "create", "--role", "admin"]).is_err());
        assert_eq!(Role::from(RoleArg::Viewer), Role::Viewer);
    }

    #[test]
    fn dlq_list_purge_and_runs_cancel_parse() {
        assert!(matches!(
            parse(&["dlq", "list"]),
            Ok(Command::Dlq(DlqCommand::List {
                group: None,
                limit: 100,
                after: None
            }))
        ));
        assert!(matches!(
            parse(&["-o", "json", "dlq", "purge", "--group", "g"]),
            Ok(Command::Dlq(DlqCommand::Purge { group: Some(_) }))
        ));
        assert!(matches!(
            parse(&["runs", "cancel", "7"]),
            Ok(Command::Runs(RunsCommand::Cancel { id: 7 }))
        ));
    }

    #[test]
    fn a_task_reads_as_its_place_in_its_run() {
        let mut task = RunRecord {
            task_kind: Some("shard".into()),
            shard_index: Some(3),
            shard_total: Some(12),
            shard_param: Some(serde_json::json!({"region": "eu"})),
            parent_id: Some(41),
            task_key: Some("shard/3".into()),
            ..test_record()
        };
        assert_eq!(task_place(&task), r#"shard 3/12 {"region":"eu"}"#);
        assert_eq!(tasks_cell(&task), "task of 41: shard/3");
        task.task_kind = Some("broadcast".into());
        task.target_worker = Some("w-1".into());
        assert_eq!(task_place(&task), "worker w-1");
        task.task_kind = Some("map".into());
        task.map_step = Some("resize".into());
        task.map_depth = Some(2);
        assert_eq!(task_place(&task), "step resize (depth 2)");
        let parent = RunRecord {
            progress: crate::store::task_progress(12, 10, 1),
            ..test_record()
        };
        assert_eq!(tasks_cell(&parent), "9/12 ok, 1 failed, 2 left");
        assert_eq!(tasks_cell(&test_record()), "");
        let long = serde_json::json!({"blob": "y".repeat(500)});
        let shown = capped_json(&long, MAX_TASK_CELL_BYTES);
        assert!(shown.len() <= MAX_TASK_CELL_BYTES && shown.ends_with("…[truncated]"));
    }

    fn test_record() -> RunRecord {
        let at = DateTime::parse_from_rfc3339("2026-12-02T01:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        RunRecord {
            id: 1,
            job: "j".into(),
            group: "g".into(),
            scheduled_at: at,
            trigger: "schedule".into(),
            state: "queued".into(),
            reason: None,
            attempt: 0,
            worker_id: None,
            error: None,
            params: serde_json::json!({}),
            term: None,
            job_version: None,
            backfill_id: None,
            upstream_run_id: None,
            requested_by: None,
            created_at: at,
            published_at: None,
            started_at: None,
            finished_at: None,
            next_attempt_at: None,
            cancel_requested_at: None,
            cancel_requested_by: None,
            replayed_by: None,
            replayed_at: None,
            parent_id: None,
            task_key: None,
            task_kind: None,
            shard_index: None,
            shard_total: None,
            shard_param: None,
            target_worker: None,
            map_step: None,
            map_depth: None,
            output: None,
            output_truncated: false,
            tasks_total: 0,
            tasks_ended: 0,
            tasks_failed: 0,
            progress: None,
        }
    }

    /// `chime runs list` shows the fire with its progress, `runs show` a page of its tasks and
    /// the command for the next, a task its parent, and `runs retry-failed` reruns the failed.
    #[sqlx::test(migrations = "../migrations")]
    async fn runs_show_pages_a_parents_tasks_and_retry_failed_reruns_them(pool: sqlx::PgPool) {
        use crate::store::tests_tasks::{set_task, sharded_run};
        let store = Store::from_pool(pool.clone());
        let run = async |args: &[&str]| -> String {
            let cli =
                Cli::try_parse_from(std::iter::once("chime").chain(args.iter().copied())).unwrap();
            let mut out = Vec::new();
            let code = control(&store, Output::Table, cli.command, &mut out)
                .await
                .unwrap();
            assert_eq!(code, ExitCode::SUCCESS, "{args:?}");
            String::from_utf8(out).unwrap()
        };
        let (parent, tasks) = sharded_run(&pool, "shard", 12, None).await;
        for (i, id) in tasks.iter().enumerate() {
            let end = match i {
                0..9 => "succeeded",
                9 => "failed",
                _ => "running",
            };
            set_task(&pool, *id, end, Some("w1"), None).await;
        }
        let listed = run(&["runs", "list"]).await;
        assert!(listed.contains("9/12 ok, 1 failed, 2 left"), "{listed}");
        assert_eq!(
            listed.lines().count(),
            2,
            "the header and the fire: {listed}"
        );
        let all = run(&["runs", "list", "--tasks"]).await;
        assert!(all.contains("task of"), "{all}");

        let parent_id = parent.to_string();
        let shown = run(&["runs", "show", &parent_id, "--task-limit", "5"]).await;
        assert!(
            shown.contains("tasks: 9/12 ok, 1 failed, 2 left (1 failed, 2 running, 9 succeeded)"),
            "{shown}"
        );
        assert!(
            shown.contains("shard/4") && !shown.contains("shard/5"),
            "{shown}"
        );
        let next = format!(
            "7 more: chime runs show {parent} --tasks-after {}",
            tasks[4]
        );
        assert!(shown.contains(&next), "{shown}");
        let after = tasks[4].to_string();
        let page = run(&["runs", "show", &parent_id, "--tasks-after", &after]).await;
        assert!(
            page.contains("shard/5") && page.contains("shard/11"),
            "{page}"
        );
        assert!(
            !page.contains("shard/4") && !page.contains("more:"),
            "{page}"
        );
        let failed = run(&["runs", "show", &parent_id, "--task-state", "failed"]).await;
        assert!(
            failed.contains("shard/9") && failed.contains("boom"),
            "{failed}"
        );
        assert!(!failed.contains("shard/8"), "{failed}");

        let task = run(&["runs", "show", &tasks[9].to_string()]).await;
        assert!(
            task.contains(&format!("{parent} (running, 9/12 ok, 1 failed, 2 left)")),
            "{task}"
        );
        assert!(task.contains("shard 9/12"), "{task}");

        for id in &tasks[10..] {
            set_task(&pool, *id, "succeeded", None, None).await;
        }
        let rerun = run(&["runs", "retry-failed", &parent_id]).await;
        assert!(
            rerun.starts_with(&format!("rerunning 1 task of run {parent} of shard")),
            "{rerun}"
        );
    }
}
