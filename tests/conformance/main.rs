//! `chime-conformance`: drives any worker implementation, given the command that starts it,
//! through the wire protocol's scenarios (docs/conformance.md) against the real PostgreSQL and
//! RabbitMQ, and prints a Markdown table (or JSON) of the results. Exits non-zero if any
//! scenario fails.
//!
//! ```text
//! chime-conformance --name python --worker "python3 sdks/python/examples/conformance.py"
//! ```

mod scenarios;
mod world;

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use futures::{FutureExt as _, StreamExt as _};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

use crate::scenarios::{SCENARIOS, Verdict};
use crate::world::{Config, World};

/// How long one scenario may take, its world's setup and cleanup not included.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);

/// Most scenarios run at once (`--parallel`).
const MAX_PARALLEL: usize = 16;

#[derive(Parser, Debug)]
#[command(
    name = "chime-conformance",
    about = "Runs a Chime worker through the wire protocol's conformance scenarios",
    after_help = "The worker command is run as `sh -c 'exec COMMAND'` with CHIME_DATABASE_URL, \
                  CHIME_AMQP_URL, CHIME_QUEUE_PREFIX, CHIME_GROUP and CHIME_WORKER_ID set; it \
                  must handle the jobs conf-ok, conf-sleep, conf-fail, conf-fatal and conf-log \
                  (docs/conformance.md)."
)]
struct Cli {
    /// The command that starts one worker process (several scenarios start two).
    #[arg(long)]
    worker: String,
    /// The implementation's name in the report (`rust`, `python`, `runner`, …).
    #[arg(long, default_value = "worker")]
    name: String,
    /// PostgreSQL URL of a user that may create databases and roles; each scenario creates a
    /// database of its own on that server and drops it at the end.
    #[arg(
        long,
        env = "CHIME_CONFORMANCE_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// RabbitMQ URL; each scenario uses a queue prefix of its own and deletes its objects.
    #[arg(
        long,
        env = "CHIME_CONFORMANCE_AMQP_URL",
        default_value = chime_e2e::AMQP_URL
    )]
    amqp_url: String,
    /// Run only these scenarios (comma-separated names; default all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Scenarios run at once (1 to 16).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Connect every worker as a login role granted only its group (`chime_grant_worker`):
    /// `auto` does when the schema has that function.
    #[arg(long, value_enum, default_value_t = Privilege::Auto)]
    privilege: Privilege,
    /// Where the workers' output goes (default: a new temporary directory, deleted after a
    /// passing run and kept after a failing one).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Print the results as JSON instead of a Markdown table.
    #[arg(long)]
    json: bool,
    /// List the scenarios and what each checks, and exit.
    #[arg(long)]
    list: bool,
}

/// Whether workers run as a least-privileged role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Privilege {
    Auto,
    On,
    Off,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
struct Outcome {
    scenario: &'static str,
    result: &'static str,
    seconds: f64,
    detail: String,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report<'a> {
    worker: &'a str,
    command: &'a str,
    least_privilege: bool,
    passed: bool,
    scenarios: &'a [Outcome],
}

/// Whether the schema this suite was built with has `chime_grant_worker`.
fn schema_grants_workers() -> bool {
    sqlx::migrate!("../migrations")
        .iter()
        .any(|m| m.sql.as_str().contains("chime_grant_worker"))
}

/// Runs one scenario in a world of its own and cleans up after it.
async fn run_one(name: &'static str, config: Arc<Config>, admin: sqlx::PgPool) -> Outcome {
    let started = Instant::now();
    let outcome = async {
        let mut world = World::new(&config, &admin, name).await?;
        let verdict = match world.start(|group| scenarios::jobs(name, group)).await {
            Ok(()) => tokio::time::timeout(SCENARIO_TIMEOUT, scenarios::run(name, &mut world))
                .await
                .unwrap_or_else(|_| {
                    Err(anyhow::anyhow!(
                        "did not finish within {SCENARIO_TIMEOUT:?}"
                    ))
                }),
            Err(e) => Err(e),
        };
        // Whatever happened, the world is cleaned up; a failed cleanup fails a passed scenario.
        let cleaned = world.finish().await;
        match (verdict, cleaned) {
            (Ok(verdict), Ok(())) => Ok(verdict),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    }
    .await;
    let (result, detail) = match outcome {
        Ok(Verdict::Pass(detail)) => ("pass", detail),
        Ok(Verdict::Skip(why)) => ("skip", why),
        Err(e) => ("FAIL", format!("{e:#}")),
    };
    Outcome {
        scenario: name,
        result,
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        detail,
    }
}

/// The text of a panic's payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".into())
}

/// A table cell: one line, no pipes.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn markdown(report: &Report<'_>) -> String {
    let passed = report
        .scenarios
        .iter()
        .filter(|o| o.result == "pass")
        .count();
    let failed = report
        .scenarios
        .iter()
        .filter(|o| o.result == "FAIL")
        .count();
    let skipped = report.scenarios.len() - passed - failed;
    let mut out = format!(
        "Conformance of `{}` (`{}`{}): {passed} passed, {failed} failed, {skipped} skipped\n\n",
        cell(report.worker),
        cell(report.command),
        if report.least_privilege {
            ", as a least-privileged role"
        } else {
            ""
        }
    );
    out.push_str("| scenario | result | seconds | detail |\n|---|---|---:|---|\n");
    for o in report.scenarios {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {} |\n",
            o.scenario,
            o.result,
            o.seconds,
            cell(&o.detail)
        ));
    }
    out
}

async fn main_inner(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.list {
        for s in SCENARIOS {
            println!("{:<20} {}", s.name, s.checks);
        }
        return Ok(ExitCode::SUCCESS);
    }
    anyhow::ensure!(
        (1..=MAX_PARALLEL).contains(&cli.parallel),
        "--parallel {} is out of range; use 1 to {MAX_PARALLEL}",
        cli.parallel
    );
    anyhow::ensure!(
        !cli.worker.trim().is_empty(),
        "--worker is empty; give the command that starts one worker"
    );
    let mut selected: Vec<&'static str> = Vec::new();
    for name in &cli.only {
        let scenario = SCENARIOS.iter().find(|s| s.name == name).with_context(|| {
            format!(
                "--only names no scenario {name:?}; the scenarios are {}",
                SCENARIOS
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        selected.push(scenario.name);
    }
    if selected.is_empty() {
        selected = SCENARIOS.iter().map(|s| s.name).collect();
    }
    let least_privilege = match cli.privilege {
        Privilege::On => {
            anyhow::ensure!(
                schema_grants_workers(),
                "--privilege on, but the schema this suite was built with has no \
                 chime_grant_worker; use --privilege auto or off"
            );
            true
        }
        Privilege::Auto => schema_grants_workers(),
        Privilege::Off => false,
    };
    // Without --log-dir the logs go to a temporary directory, deleted after a passing run and
    // kept (and named) after a failing one.
    let mut temporary = None;
    let log_dir = match cli.log_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating --log-dir {}", dir.display()))?;
            dir
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix("chime-conformance-")
                .tempdir()
                .context("creating a log directory")?;
            let path = dir.path().to_owned();
            temporary = Some(dir);
            path
        }
    };
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&cli.database_url)
        .await
        .with_context(|| format!("connecting to --database-url {}", cli.database_url))?;
    let config = Arc::new(Config {
        database_url: cli.database_url.clone(),
        amqp_url: cli.amqp_url.clone(),
        worker: cli.worker.clone(),
        log_dir: log_dir.clone(),
        least_privilege,
    });
    eprintln!(
        "chime-conformance: {} scenarios against `{}`, {} at once; worker logs in {}",
        selected.len(),
        cli.worker,
        cli.parallel,
        log_dir.display()
    );
    // The scenarios run as futures of this task (their schedulers and workers have threads and
    // processes of their own), at most `parallel` at once; a panic fails its scenario only.
    let mut outcomes: Vec<Outcome> = futures::stream::iter(selected.iter().copied())
        .map(|name| {
            let (config, admin) = (config.clone(), admin.clone());
            async move {
                let outcome = AssertUnwindSafe(run_one(name, config, admin))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Outcome {
                        scenario: name,
                        result: "FAIL",
                        seconds: 0.0,
                        detail: format!("the scenario panicked: {}", panic_message(&panic)),
                    });
                eprintln!(
                    "  {:<4} {:<20} {:>5.1} s  {}",
                    outcome.result,
                    outcome.scenario,
                    outcome.seconds,
                    cell(&outcome.detail)
                );
                outcome
            }
        })
        .buffer_unordered(cli.parallel)
        .collect()
        .await;
    outcomes.sort_by_key(|o| selected.iter().position(|s| *s == o.scenario));
    admin.close().await;
    let passed = outcomes.iter().all(|o| o.result != "FAIL");
    if !passed && let Some(dir) = temporary.take() {
        eprintln!(
            "chime-conformance: worker logs kept in {}",
            dir.keep().display()
        );
    }
    drop(temporary);
    let report = Report {
        worker: &cli.name,
        command: &cli.worker,
        least_privilege,
        passed,
        scenarios: &outcomes,
    };
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    // Warnings of the in-process schedulers go to stderr, never into the table on stdout.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match main_inner(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("chime-conformance: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_one_line_without_pipes() {
        assert_eq!(cell("a | b\n  c"), "a \\| b c");
    }

    #[test]
    fn the_table_is_markdown_with_one_row_per_scenario() {
        let outcomes = [Outcome {
            scenario: "timeout",
            result: "pass",
            seconds: 2.3,
            detail: "timed_out after 1003 ms".into(),
        }];
        let table = markdown(&Report {
            worker: "rust",
            command: "chime-conformance-worker",
            least_privilege: false,
            passed: true,
            scenarios: &outcomes,
        });
        assert!(table.contains("1 passed, 0 failed, 0 skipped"), "{table}");
        assert!(
            table.ends_with(
                "| scenario | result | seconds | detail |\n|---|---|---:|---|\n\
                 | timeout | pass | 2.3 | timed_out after 1003 ms |\n"
            ),
            "{table}"
        );
    }
}
