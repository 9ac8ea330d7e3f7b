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
    Cancelled, FieldProblem, JobView, MAX_PAGE, Operations, OpsError, OpsResult, TriggerOptions,
};
use crate::store::{RunDetail, RunQuery, RunRecord, Store};

mod grants;

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
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Validate job files and print each job's next 5 fire times (exit 1 on any error).
    Check {
        /// Job files (TOML or YAML).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Inspect and control jobs.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Inspect and cancel runs.
    #[command(subcommand)]
    Runs(RunsCommand),
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
    },
    /// Show a run with its attempts and log lines.
    Show {
        /// Run id.
        id: i64,
    },
    /// Cancel a run: a waiting one at once, a running one through its worker.
    Cancel {
        /// Run id.
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
        RunsCommand::List { job, state, limit } => {
            let zones = job_zones(ops, caller).await?;
            let page = ops
                .runs(
                    caller,
                    RunQuery {
                        job,
                        state,
                        limit: limit.clamp(1, MAX_PAGE),
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
                        r.reason
                            .clone()
                            .or_else(|| r.error.clone())
                            .unwrap_or_default(),
                    ]);
                }
            })
        }
        RunsCommand::Show { id } => {
            let detail = ops.run(caller, id).await?;
            if output == Output::Json {
                return json_out(out, &detail);
            }
            // The job's zone, if the job still exists (its runs outlive it).
            let zone = match ops.job(caller, &detail.run.job).await {
                Ok(job) => job.timezone,
                Err(_) => "UTC".to_owned(),
            };
            show_run(&detail, &zone, out).map_err(io)
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

fn show_run(detail: &RunDetail, zone: &str, out: &mut dyn Write) -> std::io::Result<()> {
    let r = &detail.run;
    let time = |t: Option<DateTime<Utc>>| zoned(t, zone);
    let mut t = table();
    for (k, v) in [
        ("run", r.id.to_string()),
        ("job", r.job.clone()),
        ("group", r.group.clone()),
        ("state", r.state.clone()),
        ("trigger", r.trigger.clone()),
        ("scheduled", time(Some(r.scheduled_at))),
        ("published", time(r.published_at)),
        ("started", time(r.started_at)),
        ("finished", time(r.finished_at)),
        ("attempts", r.attempt.to_string()),
        ("params", r.params.to_string()),
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
    ] {
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
}
