//! `runner`: how long `chime-runner` takes from a run's scheduled instant to the start of its
//! shell job's process. N jobs due every second for D seconds, each bound in a generated runner
//! config to `date +%s%N`, whose only output line (a log line of the run) is the process's own
//! start on the wall clock. Per run: instant → process start, and handler start (the attempt's
//! recorded `started_at`) → process start, the runner's own share.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use chime_e2e::Scheduler;
use chime_e2e::process::{Process, sibling_binary};
use serde::Serialize;

use crate::jobs::{JobDef, specs};
use crate::report::{Report, Row, ms, summary};
use crate::sandbox::{Sandbox, Services, bounded, poll, sleep_until_us, within, write_file};
use crate::stats::Summary;

const SECOND: i64 = 1_000_000;

/// Parameters of the runner scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Jobs due every second, each a shell handler of the runner.
    pub jobs: usize,
    /// Seconds of firing; the first 2 and the last are left out.
    pub seconds: u64,
}

/// What the runner scenario measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Runs of the steady window.
    pub runs: usize,
    /// Runs of the window that did not succeed with a start line.
    pub failed: usize,
    /// Scheduled instant → the process's start.
    pub instant_to_process: Summary,
    /// The handler's recorded start → the process's start.
    pub handler_to_process: Summary,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    ensure!(params.seconds >= 4, "runner needs --seconds 4 or more");
    ensure!(
        (1..=1000).contains(&params.jobs),
        "runner needs --jobs from 1 to 1000 (one handler each in the runner's config)"
    );
    let runner = sibling_binary("chime-runner")?;
    within(services, "runner", async |sandbox| {
        measure(sandbox, &runner, params).await
    })
    .await
}

async fn measure(
    sandbox: &Sandbox,
    runner: &std::path::Path,
    params: &Params,
) -> anyhow::Result<Report> {
    let group = sandbox.group("runner");
    let names: Vec<String> = (0..params.jobs).map(|i| format!("runner-{i:05}")).collect();
    let config = sandbox.path("runner.toml");
    write_file(&config, &runner_config(&group, &names))?;
    let mut command = tokio::process::Command::new(runner);
    command
        .arg("--config")
        .arg(&config)
        .env("CHIME_DATABASE_URL", &sandbox.database_url)
        .env("CHIME_AMQP_URL", &sandbox.amqp_url)
        .env("CHIME_QUEUE_PREFIX", &sandbox.prefix);
    let mut process = Process::spawn("chime-runner", command, &sandbox.path("runner.log"))?;
    sandbox.wait_for_consumers(&group, 1).await?;
    let defs: Vec<JobDef> = names
        .iter()
        .map(|name| JobDef::new(name, &group).with("every", "1s"))
        .collect();
    eprintln!(
        "[runner] {} shell jobs every second for {} s",
        params.jobs, params.seconds
    );
    let scheduler = Scheduler::start(sandbox.service_config("bench-runner"), specs(&defs)?);
    let first: i64 = poll(Duration::from_secs(120), "the first fire", || async {
        Ok(sqlx::query_scalar(
            "SELECT (extract(epoch FROM min(scheduled_at)) * 1000000)::bigint FROM chime_runs",
        )
        .fetch_one(sandbox.store.pool())
        .await?)
    })
    .await?;
    let t0 = first.div_euclid(SECOND) * SECOND;
    let seconds = i64::try_from(params.seconds)?;
    let (from_us, to_us) = (t0 + 2 * SECOND, t0 + (seconds - 1) * SECOND);
    sleep_until_us(t0 + seconds * SECOND + SECOND / 2).await;
    bounded(
        "stopping the scheduler",
        Duration::from_secs(60),
        scheduler.stop(),
    )
    .await?;
    let expected = params.jobs * usize::try_from(seconds - 2)?;
    let starts = poll(
        Duration::from_secs(60),
        "the window's runs to finish",
        async || {
            process.ensure_running()?;
            let starts = window_starts(sandbox, from_us, to_us).await?;
            Ok((starts.iter().filter(|s| s.finished).count() >= expected).then_some(starts))
        },
    )
    .await?;
    ensure!(
        process.stop(Duration::from_secs(60)).await?,
        "chime-runner did not stop cleanly on SIGTERM; its log: {}",
        process.log().display()
    );
    let failed = starts.iter().filter(|s| s.process_us.is_none()).count();
    let instant_to_process = Summary::of(
        starts
            .iter()
            .filter_map(|s| Some((s.process_us? - s.scheduled_us) as f64 / 1000.0))
            .collect(),
    );
    let handler_to_process = Summary::of(
        starts
            .iter()
            .filter_map(|s| Some((s.process_us? - s.handler_us) as f64 / 1000.0))
            .collect(),
    );
    Ok(report(
        params,
        Results {
            runs: starts.len(),
            failed,
            instant_to_process,
            handler_to_process,
        },
    ))
}

/// A runner config binding every job of `names` to `date +%s%N`.
fn runner_config(group: &str, names: &[String]) -> String {
    let mut out = format!(
        "[worker]\ngroup = {group:?}\ncapacity = {}\nhold = 4096\nworker_id = \"bench-runner\"\n\n",
        names.len().clamp(1, 256)
    );
    for name in names {
        out.push_str(&format!(
            "[[handlers]]\nname = {name:?}\nkind = \"shell\"\nargv = [\"date\", \"+%s%N\"]\n\n"
        ));
    }
    out
}

/// One run of the window: its instant, its handler's recorded start and its process's start
/// (the first log line, `date +%s%N`), in Unix microseconds.
struct Start {
    scheduled_us: i64,
    handler_us: i64,
    process_us: Option<i64>,
    finished: bool,
}

async fn window_starts(sandbox: &Sandbox, from_us: i64, to_us: i64) -> anyhow::Result<Vec<Start>> {
    let rows: Vec<(i64, Option<i64>, Option<String>, String)> = sqlx::query_as(
        "SELECT (extract(epoch FROM r.scheduled_at) * 1000000)::bigint,
                (extract(epoch FROM r.started_at) * 1000000)::bigint,
                (SELECT l.message FROM chime_run_logs l WHERE l.run_id = r.id
                  ORDER BY l.id LIMIT 1),
                r.state
           FROM chime_runs r
          WHERE r.scheduled_at >= to_timestamp($1 / 1000000.0)
            AND r.scheduled_at <= to_timestamp($2 / 1000000.0)",
    )
    .bind(from_us)
    .bind(to_us)
    .fetch_all(sandbox.store.pool())
    .await
    .context("reading the window's runs")?;
    Ok(rows
        .into_iter()
        .map(|(scheduled_us, handler_us, line, state)| Start {
            scheduled_us,
            handler_us: handler_us.unwrap_or(scheduled_us),
            process_us: (state == "succeeded")
                .then(|| line?.trim().parse::<i64>().ok().map(|ns| ns / 1000))
                .flatten(),
            finished: !matches!(
                state.as_str(),
                "pending" | "queued" | "running" | "retrying"
            ),
        })
        .collect())
}

fn report(params: &Params, results: Results) -> Report {
    let rows = vec![
        Row::info(
            "runs of the steady window",
            format!("{} ({} jobs)", results.runs, params.jobs),
        ),
        Row::judged(
            "runs without a started process",
            results.failed.to_string(),
            "0",
            results.failed == 0,
        ),
        Row::info(
            "scheduled instant → process started",
            summary(&results.instant_to_process),
        ),
        Row::info(
            "p99 instant → process started",
            ms(results.instant_to_process.p99_ms),
        ),
        Row::info(
            "handler start → process started",
            summary(&results.handler_to_process),
        ),
    ];
    Report {
        scenario: "runner",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: results.runs > 0 && results.failed == 0,
        results: serde_json::to_value(&results).unwrap_or_default(),
        table: rows,
        notes: vec![
            "each job runs `date +%s%N` through chime-runner (no shell); its output line is the \
             process's start on the same wall clock as the scheduled instant"
                .to_owned(),
        ],
    }
}
