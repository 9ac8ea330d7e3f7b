//! The `chime` command line: run a scheduler, migrate, check job files, and control jobs and
//! runs at runtime (every listing also as `--output json`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets};
use serde::Serialize;

use crate::store::{RunFilter, RunRecord, Store};

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
    /// Inspect runs.
    #[command(subcommand)]
    Runs(RunsCommand),
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
}

/// Runs a runtime command against the database; returns the process exit code.
pub async fn control(
    store: &Store,
    output: Output,
    command: Command,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
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
    }
    Ok(ExitCode::SUCCESS)
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
