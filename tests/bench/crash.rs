//! `crash`: a worker process SIGKILLed mid-run. N manual runs are triggered while only worker
//! `a` (a `chime-bench worker` process) consumes, so all N run on it and hold on; then worker `b`
//! starts, `a` is SIGKILLed, and the scenario measures, per run, the time from the kill to the
//! start of its next attempt on `b`, and checks that every run then ends `succeeded` with the
//! killed attempt recorded `lost`. The scheduler runs in this process.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use chime_e2e::Scheduler;
use serde::Serialize;
use tokio::process::Command;

use crate::jobs::{JobDef, specs};
use crate::report::{Report, Row, summary};
use crate::sandbox::{Sandbox, Services, bounded, now_us, poll, within};
use crate::stats::Summary;
use crate::worker::Event;
use chime_e2e::process::Process;

/// Parameters of the crash scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Runs in flight on the worker that is killed.
    pub runs: usize,
}

/// One run's story.
#[derive(Debug, Clone, Serialize)]
pub struct RunOutcome {
    /// The run.
    pub run_id: i64,
    /// Kill → start of the next attempt on the surviving worker.
    pub rerun_ms: Option<f64>,
    /// Handler starts after the kill (1 expected).
    pub starts_after_kill: usize,
    /// The run's final state.
    pub state: String,
    /// States of its attempts, oldest first.
    pub attempts: Vec<String>,
}

/// What the crash scenario measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Runs that started again on the surviving worker.
    pub rerun: usize,
    /// Kill → rerun start, over the runs.
    pub rerun_latency: Summary,
    /// Handler starts beyond one per (run, attempt), on either worker.
    pub duplicate_starts: usize,
    /// Every run.
    pub runs: Vec<RunOutcome>,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    ensure!(
        params.runs > 0,
        "crash needs --jobs 1 or more (runs in flight)"
    );
    within(services, "crash", async |sandbox| {
        measure(sandbox, params).await
    })
    .await
}

fn worker(sandbox: &Sandbox, id: &str, group: &str, jobs: &[String]) -> anyhow::Result<Process> {
    let exe = std::env::current_exe().context("locating chime-bench's own executable")?;
    let mut command = Command::new(exe);
    command
        .arg("worker")
        .args(["--group", group])
        .args(["--prefix", &sandbox.prefix])
        .args(["--database-url", &sandbox.database_url])
        .args(["--amqp-url", &sandbox.amqp_url])
        .args(["--id", id])
        .args(["--capacity", &jobs.len().to_string()])
        .args(["--jobs", &jobs.join(",")])
        .env("RUST_LOG", "info,sqlx=warn,lapin=warn")
        .env("NO_COLOR", "1");
    Process::spawn(
        &format!("worker {id}"),
        command,
        &sandbox.path(&format!("{id}.log")),
    )
}

fn events(process: &Process) -> Vec<Event> {
    process
        .stdout_lines()
        .iter()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The first start of a later attempt of each run, in Unix microseconds.
fn restarts(events: &[Event]) -> HashMap<i64, i64> {
    let mut first: HashMap<i64, i64> = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e.event == "start" && e.attempt >= 2)
    {
        let at = first.entry(e.run_id).or_insert(e.at_us);
        *at = (*at).min(e.at_us);
    }
    first
}

async fn measure(sandbox: &Sandbox, params: &Params) -> anyhow::Result<Report> {
    let group = sandbox.group("crash");
    let names: Vec<String> = (0..params.runs).map(|i| format!("crash-{i:03}")).collect();
    let defs: Vec<JobDef> = names.iter().map(|n| JobDef::new(n, &group)).collect();
    let scheduler = Scheduler::start(sandbox.service_config("bench-crash"), specs(&defs)?);
    poll(
        Duration::from_secs(120),
        "the scheduler to lead",
        || async { Ok(sandbox.leader().await?.map(|_| ())) },
    )
    .await?;
    poll(Duration::from_secs(60), "the jobs to be stored", || async {
        Ok(sandbox
            .store
            .job(&names[names.len() - 1])
            .await?
            .map(|_| ()))
    })
    .await?;

    let mut a = worker(sandbox, "bench-crash-a", &group, &names)?;
    sandbox.wait_for_consumers(&group, 1).await?;
    let mut run_ids = Vec::new();
    for name in &names {
        let id = sandbox
            .store
            .trigger(name, None, "chime-bench")
            .await?
            .with_context(|| format!("job {name} is not stored"))?;
        run_ids.push(id);
    }
    poll(
        Duration::from_secs(60),
        "every run to start on worker a",
        || {
            let started = events(&a)
                .iter()
                .filter(|e| e.event == "start" && e.attempt == 1)
                .count();
            let all = started >= run_ids.len();
            let alive = a.ensure_running();
            async move {
                alive?;
                Ok(all.then_some(()))
            }
        },
    )
    .await?;
    let mut b = worker(sandbox, "bench-crash-b", &group, &names)?;
    sandbox.wait_for_consumers(&group, 2).await?;

    // Taken just before the signal: the measured times include the kill itself.
    let killed_us = now_us();
    a.kill().await.context("killing worker a")?;
    eprintln!(
        "[crash] SIGKILLed worker a with {} runs in flight",
        run_ids.len()
    );
    let rerun = poll(
        Duration::from_secs(120),
        "every run to start again on worker b",
        || {
            let restarted = restarts(&events(&b));
            let all = run_ids.iter().all(|id| restarted.contains_key(id));
            let alive = b.ensure_running();
            async move {
                alive?;
                Ok(all.then_some(()))
            }
        },
    )
    .await;
    if let Err(e) = rerun {
        eprintln!("[crash] {e:#}");
    }
    // Even when the rerun never came, wait for outcomes and report what happened.
    let _ = poll(Duration::from_secs(30), "every run to finish", || async {
        for id in &run_ids {
            let run = sandbox.store.run(*id).await?;
            if run.is_none_or(|r| r.run.state != "succeeded") {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await;
    let restarted = restarts(&events(&b));
    let mut all_events = events(&a);
    all_events.extend(events(&b));
    if !b.stop(Duration::from_secs(15)).await? {
        eprintln!("[crash] warning: worker b did not exit cleanly after SIGTERM");
    }
    bounded(
        "stopping the scheduler",
        Duration::from_secs(60),
        scheduler.stop(),
    )
    .await?;

    let mut starts: HashMap<(i64, u32), usize> = HashMap::new();
    for e in all_events.iter().filter(|e| e.event == "start") {
        *starts.entry((e.run_id, e.attempt)).or_default() += 1;
    }
    let duplicate_starts = starts.values().map(|n| n - 1).sum();
    let mut runs = Vec::new();
    for id in &run_ids {
        let detail = sandbox.store.run(*id).await?;
        let (state, attempts) = match detail {
            Some(d) => (
                d.run.state.clone(),
                d.attempts.iter().map(|a| a.state.clone()).collect(),
            ),
            None => ("missing".to_owned(), Vec::new()),
        };
        runs.push(RunOutcome {
            run_id: *id,
            rerun_ms: restarted.get(id).map(|at| (at - killed_us) as f64 / 1000.0),
            starts_after_kill: all_events
                .iter()
                .filter(|e| e.event == "start" && e.run_id == *id && e.at_us > killed_us)
                .count(),
            state,
            attempts,
        });
    }
    let results = Results {
        rerun: runs.iter().filter(|r| r.rerun_ms.is_some()).count(),
        rerun_latency: Summary::of(runs.iter().filter_map(|r| r.rerun_ms).collect()),
        duplicate_starts,
        runs,
    };
    Ok(report(params, results))
}

fn report(params: &Params, r: Results) -> Report {
    let n = r.runs.len();
    let succeeded = r.runs.iter().filter(|x| x.state == "succeeded").count();
    let once = r.runs.iter().filter(|x| x.starts_after_kill == 1).count();
    let lost_recorded = r
        .runs
        .iter()
        .filter(|x| x.attempts.first().is_some_and(|a| a == "lost"))
        .count();
    let rows = vec![
        Row::judged(
            "runs started again on the other worker",
            format!("{} of {n}", r.rerun),
            format!("{n}"),
            r.rerun == n,
        ),
        Row::info("kill → rerun start", summary(&r.rerun_latency)),
        Row::judged(
            "rerun max",
            crate::report::ms(r.rerun_latency.max_ms),
            "≤ 2 s",
            r.rerun == n && r.rerun_latency.max_ms.is_some_and(|v| v <= 2000.0),
        ),
        Row::judged(
            "runs ended succeeded",
            format!("{succeeded} of {n}"),
            format!("{n}"),
            succeeded == n,
        ),
        Row::info(
            "killed attempt recorded lost",
            format!("{lost_recorded} of {n}"),
        ),
        Row::judged(
            "started exactly once after the kill",
            format!("{once} of {n}"),
            format!("{n}"),
            once == n,
        ),
        Row::judged(
            "duplicate starts of one attempt",
            r.duplicate_starts.to_string(),
            "0",
            r.duplicate_starts == 0,
        ),
    ];
    Report {
        scenario: "crash",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: n > 0 && r.rerun == n && succeeded == n && once == n && r.duplicate_starts == 0,
        results: serde_json::to_value(&r).unwrap_or_default(),
        table: rows,
        notes: vec![
            "two `chime-bench worker` processes (SDK defaults: heartbeat 500 ms, a worker is lost \
             after 3 missed heartbeats); the scheduler runs in this process"
                .to_owned(),
        ],
    }
}
