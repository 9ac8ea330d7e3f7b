//! The `chime` command line: run a scheduler, migrate, check job files, and control jobs, runs
//! and the parking lot at runtime (every listing also as `--output json`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets};
use serde::Serialize;

use chime_worker::protocol::ControlMessage;

use crate::parking::{ParkedMessage, ParkingLot};
use crate::publish::{ControlDelivery, Publisher};
use crate::store::{CancelOutcome, ReplayOutcome, RunBrief, RunFilter, RunRecord, Store};

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
}

/// `chime dlq …`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List parked messages (they stay in the parking lot).
    List {
        /// Only this executor group's parking lot (default: every group that has a job).
        #[arg(long)]
        group: Option<String>,
        /// At most this many messages.
        #[arg(long, default_value_t = 100)]
        limit: usize,
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
    /// Empty the parking lot (messages are deleted; their runs stay as they are).
    Purge {
        /// Only this executor group's parking lot (default: every group that has a job).
        #[arg(long)]
        group: Option<String>,
    },
}

/// Where the broker is, for the commands that talk to it (`runs cancel`, `dlq …`).
#[derive(Debug, Clone)]
pub struct Broker {
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// Queue and exchange name prefix.
    pub queue_prefix: String,
}

/// `chime jobs …`
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs with their schedule and next fire.
    List,
    /// Trigger a job now (also when paused).
    Trigger {
        /// Job name.
        name: String,
        /// Parameters (JSON) replacing the job's own for this run.
        #[arg(long)]
        params: Option<String>,
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
/// process exit code.
pub async fn operate(
    store: &Store,
    broker: Option<&Broker>,
    output: Output,
    command: Command,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let needs_broker =
        || broker.ok_or_else(|| anyhow::anyhow!("this command needs the broker's URL and prefix"));
    match command {
        Command::Runs(RunsCommand::Cancel { id }) => {
            return cancel(store, needs_broker()?, output, id, out).await;
        }
        Command::Dlq(command) => return dlq(store, needs_broker()?, output, command, out).await,
        _ => {}
    }
    match command {
        Command::Jobs(JobsCommand::List) => {
            let now = Utc::now();
            let jobs: Vec<JobRow> = store
                .jobs()
                .await?
                .into_iter()
                .map(|j| {
                    let schedule = j.spec.schedule().ok();
                    JobRow {
                        next_fire: if j.paused {
                            None
                        } else {
                            schedule.as_ref().and_then(|s| s.next_after(now))
                        },
                        schedule: schedule.map_or_else(|| "invalid".into(), |s| s.describe()),
                        name: j.spec.name,
                        group: j.spec.group,
                        paused: j.paused,
                        source: j.source,
                    }
                })
                .collect();
            render(output, out, &jobs, |t| {
                t.set_header(["NAME", "GROUP", "SCHEDULE", "NEXT FIRE", "PAUSED", "SOURCE"]);
                for j in &jobs {
                    t.add_row([
                        j.name.clone(),
                        j.group.clone(),
                        j.schedule.clone(),
                        time(j.next_fire),
                        if j.paused { "yes" } else { "no" }.into(),
                        j.source.clone(),
                    ]);
                }
            })?;
        }
        Command::Jobs(JobsCommand::Trigger { name, params }) => {
            let params = params
                .map(|p| {
                    serde_json::from_str::<serde_json::Value>(&p).with_context(|| {
                        format!(
                            "--params {p:?} is not JSON; pass an object such as '{{\"batch\": 10}}'"
                        )
                    })
                })
                .transpose()?;
            let Some(id) = store.trigger(&name, params, &requester()).await? else {
                return no_such_job(&name);
            };
            match output {
                Output::Json => {
                    writeln!(out, "{}", serde_json::json!({ "run_id": id, "job": name }))?
                }
                Output::Table => writeln!(out, "triggered {name}: run {id}")?,
            }
        }
        Command::Jobs(JobsCommand::Pause { name })
        | Command::Jobs(JobsCommand::Resume { name })
            if store.job(&name).await?.is_none() =>
        {
            return no_such_job(&name);
        }
        Command::Jobs(JobsCommand::Pause { name }) => {
            store.set_paused(&name, true).await?;
            writeln!(out, "paused {name}")?;
        }
        Command::Jobs(JobsCommand::Resume { name }) => {
            store.set_paused(&name, false).await?;
            writeln!(out, "resumed {name}")?;
        }
        Command::Runs(RunsCommand::List { job, state, limit }) => {
            let runs = store
                .list_runs(&RunFilter {
                    job,
                    state,
                    limit: limit.clamp(1, 10_000),
                })
                .await?;
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
                        time(Some(r.scheduled_at)),
                        time(r.started_at),
                        took(r),
                        r.attempt.to_string(),
                        r.reason
                            .clone()
                            .or_else(|| r.error.clone())
                            .unwrap_or_default(),
                    ]);
                }
            })?;
        }
        Command::Runs(RunsCommand::Show { id }) => {
            let Some(detail) = store.run(id).await? else {
                writeln!(
                    std::io::stderr(),
                    "error: no run with id {id}; list runs with `chime runs list`"
                )?;
                return Ok(ExitCode::FAILURE);
            };
            if output == Output::Json {
                serde_json::to_writer_pretty(&mut *out, &detail)?;
                writeln!(out)?;
                return Ok(ExitCode::SUCCESS);
            }
            let r = &detail.run;
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
                    at.duration_ms.map(|d| format!("{d}ms")).unwrap_or_default(),
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
        }
        Command::Scheduler { .. } | Command::Migrate | Command::Check { .. } => {
            anyhow::bail!("not a runtime control command")
        }
        Command::Runs(RunsCommand::Cancel { .. }) | Command::Dlq(_) => {
            unreachable!("handled above")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `chime runs cancel ID`.
async fn cancel(
    store: &Store,
    broker: &Broker,
    output: Output,
    id: i64,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let who = requester();
    match store.cancel_run(id, &who).await? {
        CancelOutcome::NotFound => {
            eprintln!("error: no run with id {id}; list runs with `chime runs list`");
            Ok(ExitCode::FAILURE)
        }
        CancelOutcome::Finished { state } => {
            eprintln!("error: run {id} has already finished ({state}); there is nothing to cancel");
            Ok(ExitCode::FAILURE)
        }
        CancelOutcome::Cancelled { job, previous } => {
            match output {
                Output::Json => writeln!(
                    out,
                    "{}",
                    serde_json::json!({"run_id": id, "job": job, "outcome": "cancelled",
                                       "previous_state": previous})
                )?,
                Output::Table => writeln!(
                    out,
                    "cancelled run {id} of {job} (it was {previous}; it will not run)"
                )?,
            }
            Ok(ExitCode::SUCCESS)
        }
        CancelOutcome::Requested { job, again, .. } => {
            let publisher = Publisher::new(
                broker.amqp_url.clone(),
                &format!("cli-{}", std::process::id()),
                broker.queue_prefix.clone(),
            );
            let sent = publisher
                .publish_control(&ControlMessage::CancelRun { run_id: id })
                .await;
            publisher.close().await;
            let delivery = match sent {
                Ok(delivery) => delivery,
                Err(e) => {
                    eprintln!(
                        "error: the cancel of run {id} is recorded, but the workers could not be \
                         told: {e}; run `chime runs cancel {id}` again when the broker is back"
                    );
                    return Ok(ExitCode::FAILURE);
                }
            };
            let delivered = delivery == ControlDelivery::Delivered;
            match output {
                Output::Json => writeln!(
                    out,
                    "{}",
                    serde_json::json!({"run_id": id, "job": job, "outcome": "cancel_requested",
                                       "previous_state": "running", "requested_before": again,
                                       "control_message": if delivered { "delivered" } else { "no_listener" }})
                )?,
                Output::Table if delivered => writeln!(
                    out,
                    "cancel requested for run {id} of {job}: its worker was told and records the \
                     attempt as cancelled"
                )?,
                Output::Table => writeln!(
                    out,
                    "cancel requested for run {id} of {job}, but no worker is listening for \
                     control messages; the rescuer records it as cancelled once its worker is \
                     found lost"
                )?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A parked message with what the database knows of its run.
#[derive(Debug, Serialize)]
struct DlqRow {
    group: String,
    run_id: Option<i64>,
    job: Option<String>,
    attempt: Option<u32>,
    reason: Option<String>,
    error: Option<String>,
    parked_at: Option<DateTime<Utc>>,
    parked_by: Option<String>,
    run_state: Option<String>,
}

fn dlq_row(message: ParkedMessage, run: Option<&RunBrief>) -> DlqRow {
    DlqRow {
        job: message.job.or_else(|| run.map(|r| r.job.clone())),
        error: message
            .error
            .or_else(|| run.and_then(|r| r.error.clone().or_else(|| r.reason.clone()))),
        parked_at: message.parked_at.or_else(|| {
            run.filter(|r| r.state == "dead")
                .and_then(|r| r.finished_at)
        }),
        run_state: run.map(|r| r.state.clone()),
        group: message.group,
        run_id: message.run_id,
        attempt: message.attempt,
        reason: message.reason,
        parked_by: message.parked_by,
    }
}

/// Most messages one `dlq replay` reads from a parking lot.
const REPLAY_SCAN: usize = 10_000;

/// `chime dlq …`.
async fn dlq(
    store: &Store,
    broker: &Broker,
    output: Output,
    command: DlqCommand,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let groups = |group: Option<String>| async move {
        match group {
            Some(group) => Ok::<_, anyhow::Error>(vec![group]),
            None => store.groups().await,
        }
    };
    let lot = ParkingLot::connect(&broker.amqp_url, &broker.queue_prefix).await?;
    let result = match command {
        DlqCommand::List { group, limit } => {
            let mut rows = Vec::new();
            for group in groups(group).await? {
                if rows.len() >= limit {
                    break;
                }
                let messages = lot.browse(&group, limit - rows.len()).await?;
                let ids: Vec<i64> = messages.iter().filter_map(|m| m.run_id).collect();
                let runs = store.run_briefs(&ids).await?;
                for message in messages {
                    let run = runs.iter().find(|r| Some(r.id) == message.run_id);
                    rows.push(dlq_row(message, run));
                }
            }
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
            })?;
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Replay {
            id: Some(id),
            all: false,
            ..
        } => replay_one(store, &lot, output, id, out).await,
        DlqCommand::Replay { group, .. } => {
            let mut replayed = Vec::new();
            let mut kept = Vec::new();
            for group in groups(group).await? {
                replay_group(store, &lot, &group, &mut replayed, &mut kept).await?;
            }
            match output {
                Output::Json => writeln!(
                    out,
                    "{}",
                    serde_json::json!({"replayed": replayed, "kept": kept})
                )?,
                Output::Table => {
                    writeln!(out, "replayed {} runs", replayed.len())?;
                    for k in &kept {
                        writeln!(out, "kept {}", k["note"].as_str().unwrap_or_default())?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Purge { group } => {
            let mut purged = Vec::new();
            for group in groups(group).await? {
                let count = lot.purge(&group).await?;
                purged.push(serde_json::json!({
                    "group": group, "queue": lot.queue(&group), "purged": count
                }));
            }
            match output {
                Output::Json => {
                    serde_json::to_writer_pretty(&mut *out, &purged)?;
                    writeln!(out)?;
                }
                Output::Table => {
                    for p in &purged {
                        writeln!(
                            out,
                            "purged {} messages from {}",
                            p["purged"],
                            p["queue"].as_str().unwrap_or_default()
                        )?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    };
    lot.close().await;
    result
}

/// `chime dlq replay ID`: the run goes back to the outbox; its parked messages are removed.
async fn replay_one(
    store: &Store,
    lot: &ParkingLot,
    output: Output,
    id: i64,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let Some(run) = store.run_briefs(&[id]).await?.into_iter().next() else {
        eprintln!("error: no run with id {id}; list parked runs with `chime dlq list`");
        return Ok(ExitCode::FAILURE);
    };
    let fetched = lot.fetch(&run.group, REPLAY_SCAN).await?;
    let outcome = store.replay_run(id, &requester()).await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            fetched.release().await?;
            return Err(e);
        }
    };
    let mut removed = 0;
    if matches!(outcome, ReplayOutcome::Replayed { .. }) {
        for (index, message) in fetched.messages.iter().enumerate() {
            if message.run_id == Some(id) {
                fetched.remove(index).await?;
                removed += 1;
            }
        }
    }
    fetched.release().await?;
    match outcome {
        ReplayOutcome::NotFound => {
            eprintln!("error: no run with id {id}; list parked runs with `chime dlq list`");
            Ok(ExitCode::FAILURE)
        }
        ReplayOutcome::NotReplayable { state } => {
            eprintln!(
                "error: run {id} is {state}; only runs that are {} can be replayed",
                crate::store::REPLAYABLE_STATES.join(", ")
            );
            Ok(ExitCode::FAILURE)
        }
        ReplayOutcome::Replayed {
            job, next_attempt, ..
        } => {
            match output {
                Output::Json => writeln!(
                    out,
                    "{}",
                    serde_json::json!({"run_id": id, "job": job, "attempt": next_attempt,
                                       "removed_messages": removed})
                )?,
                Output::Table => writeln!(
                    out,
                    "replayed run {id} of {job} as attempt {next_attempt}{}",
                    if removed > 0 {
                        format!("; removed {removed} parked message(s)")
                    } else {
                        "; it had no message in the parking lot".to_owned()
                    }
                )?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Replays every parked message of `group` that has a replayable run; keeps the others.
async fn replay_group(
    store: &Store,
    lot: &ParkingLot,
    group: &str,
    replayed: &mut Vec<i64>,
    kept: &mut Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    let fetched = lot.fetch(group, REPLAY_SCAN).await?;
    let who = requester();
    let mut done = std::collections::HashSet::new();
    for (index, message) in fetched.messages.iter().enumerate() {
        let Some(id) = message.run_id else {
            kept.push(serde_json::json!({"group": group, "run_id": null,
                "note": format!("a message of group {group} without a run id")}));
            continue;
        };
        if done.contains(&id) {
            // Another copy of a run replayed just now.
            fetched.remove(index).await?;
            continue;
        }
        match store.replay_run(id, &who).await {
            Ok(ReplayOutcome::Replayed { .. }) => {
                fetched.remove(index).await?;
                done.insert(id);
                replayed.push(id);
            }
            Ok(ReplayOutcome::NotFound) => kept.push(serde_json::json!({"group": group,
                "run_id": id, "note": format!("run {id}: no such run")})),
            Ok(ReplayOutcome::NotReplayable { state }) => kept.push(serde_json::json!({
                "group": group, "run_id": id, "note": format!("run {id}: it is {state}")})),
            Err(e) => {
                fetched.release().await?;
                return Err(e);
            }
        }
    }
    fetched.release().await
}

#[derive(Debug, Serialize)]
struct JobRow {
    name: String,
    group: String,
    schedule: String,
    next_fire: Option<DateTime<Utc>>,
    paused: bool,
    source: String,
}

fn render<T: Serialize>(
    output: Output,
    out: &mut dyn Write,
    rows: &T,
    fill: impl FnOnce(&mut Table),
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, rows)?;
            writeln!(out)?;
        }
        Output::Table => {
            let mut t = table();
            fill(&mut t);
            writeln!(out, "{t}")?;
        }
    }
    Ok(())
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

fn took(r: &RunRecord) -> String {
    match (r.started_at, r.finished_at) {
        (Some(s), Some(f)) => format!("{}ms", (f - s).num_milliseconds()),
        _ => String::new(),
    }
}

fn no_such_job(name: &str) -> anyhow::Result<ExitCode> {
    eprintln!("error: no job named {name:?}; list jobs with `chime jobs list`");
    Ok(ExitCode::FAILURE)
}

/// Who is asking, recorded with manual triggers.
fn requester() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn dlq_list_purge_and_runs_cancel_parse() {
        assert!(matches!(
            parse(&["dlq", "list"]),
            Ok(Command::Dlq(DlqCommand::List {
                group: None,
                limit: 100
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
