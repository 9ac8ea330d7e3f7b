//! `scale`: one `chime scheduler` process with N registered jobs of mixed schedules (default
//! 100,000; see [`crate::jobs::scale_job`]). Measures the start-up time (process start → lease
//! held, and → first run persisted, on a migrated database), the resident memory (VmRSS after
//! the measuring window, VmHWM peak), and the CPU the process uses per second of steady planning
//! (utime + stime from /proc) and per due fire. No worker runs: this is the scheduler's cost.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use serde::Serialize;

use crate::jobs::{scale_job, toml};
use crate::report::{Report, Row};
use crate::sandbox::{Sandbox, Services, now_us, poll, within, write_file};
use chime_e2e::process::Process;

/// Log lines of the scheduler's start-up, in order.
const PHASES: [&str; 6] = [
    "job files read",
    "job definitions applied",
    "scheduler started",
    "became leader",
    "planning",
    "planned",
];

/// Parameters of the scale scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Registered jobs.
    pub jobs: usize,
    /// Seconds of steady planning to measure CPU over.
    pub seconds: u64,
    /// Executor groups the jobs are spread over (each is an exchange and 15 quorum queues the
    /// scheduler declares at start).
    pub groups: usize,
}

/// What the scale scenario measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Jobs the scheduler stored.
    pub registered: i64,
    /// Size of the job file.
    pub job_file_bytes: usize,
    /// Process start → each start-up log line the scheduler wrote (best effort: `job files
    /// read`, `job definitions applied`, `scheduler started` (topology declared), `became
    /// leader`, `planning`, `planned` (every job read and planned)).
    pub startup_phases_ms: BTreeMap<String, f64>,
    /// Process start → this instance holds the lease.
    pub startup_to_leader_ms: f64,
    /// Process start → the first run is persisted (includes waiting for the first due fire of
    /// an every-second job, up to the 500 ms lookahead).
    pub startup_to_first_run_ms: f64,
    /// Resident memory after the measuring window.
    pub rss_bytes: u64,
    /// Peak resident memory since start.
    pub peak_rss_bytes: u64,
    /// Seconds the CPU was measured over.
    pub window_seconds: f64,
    /// CPU time used in the window.
    pub cpu_ms: f64,
    /// CPU per second of wall time (the planner ticks at least once a second here).
    pub cpu_ms_per_second: f64,
    /// Fires scheduled inside the window (runs persisted, including skipped ones).
    pub fires: i64,
    /// CPU per fire.
    pub cpu_us_per_fire: Option<f64>,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    ensure!(params.jobs > 0, "scale needs --jobs 1 or more");
    ensure!(params.seconds >= 1, "scale needs --seconds 1 or more");
    ensure!(params.groups >= 1, "scale needs --groups 1 or more");
    let chime = services.chime_binary()?;
    within(services, "scale", async |sandbox| {
        measure(sandbox, &chime, params).await
    })
    .await
}

async fn measure(
    sandbox: &Sandbox,
    chime: &std::path::Path,
    params: &Params,
) -> anyhow::Result<Report> {
    for g in 0..params.groups {
        sandbox.group(&format!("g{g:02}"));
    }
    let defs: Vec<_> = (0..params.jobs)
        .map(|i| scale_job(i, params.groups))
        .collect();
    let file = toml(&defs);
    let path = sandbox.path("jobs.toml");
    write_file(&path, &file)?;
    eprintln!(
        "[scale] {} jobs ({} KiB job file); starting chime",
        params.jobs,
        file.len() / 1024
    );

    let instance = "bench-scale";
    let started = tokio::time::Instant::now();
    let mut process = sandbox.scheduler(chime, instance, &path)?;
    let outcome = observe(sandbox, &mut process, started, instance, params).await;
    let stopped = process.stop(Duration::from_secs(30)).await;
    let mut results = outcome?;
    if !stopped.unwrap_or(false) {
        eprintln!("[scale] warning: the scheduler did not exit cleanly after SIGTERM");
    }
    results.job_file_bytes = file.len();
    Ok(report(params, results))
}

async fn observe(
    sandbox: &Sandbox,
    process: &mut Process,
    started: tokio::time::Instant,
    instance: &str,
    params: &Params,
) -> anyhow::Result<Results> {
    let limit = Duration::from_secs(300);
    let mut leader_at = None;
    let first_run_at = poll(
        limit,
        "a run persisted after starting the scheduler",
        async || {
            process.ensure_running()?;
            if leader_at.is_none() && sandbox.leader().await?.as_deref() == Some(instance) {
                leader_at = Some(started.elapsed());
            }
            let any: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM chime_runs)")
                .fetch_one(sandbox.store.pool())
                .await?;
            Ok(any.then(|| started.elapsed()))
        },
    )
    .await?;
    let leader_at = leader_at.unwrap_or(first_run_at);
    eprintln!(
        "[scale] leading after {leader_at:?}, first run persisted after {first_run_at:?}; \
         measuring {} s",
        params.seconds
    );
    // Let the start-up catch-up settle before measuring the steady state.
    tokio::time::sleep(Duration::from_secs(2)).await;
    process.ensure_running()?;
    let (cpu0, wall0, t0) = (process.cpu_time()?, now_us(), tokio::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(params.seconds)).await;
    process.ensure_running()?;
    let (cpu1, wall1, elapsed) = (process.cpu_time()?, now_us(), t0.elapsed());
    let (rss, peak) = process.memory()?;
    let from = chrono::DateTime::from_timestamp_micros(wall0).context("window start")?;
    let to = chrono::DateTime::from_timestamp_micros(wall1).context("window end")?;
    let fires: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chime_runs WHERE scheduled_at >= $1 AND scheduled_at < $2",
    )
    .bind(from)
    .bind(to)
    .fetch_one(sandbox.store.pool())
    .await
    .context("counting fires")?;
    let registered: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_jobs")
        .fetch_one(sandbox.store.pool())
        .await
        .context("counting jobs")?;
    let cpu_ms = (cpu1 - cpu0).as_secs_f64() * 1000.0;
    let startup_phases_ms = PHASES
        .iter()
        .filter_map(|phase| {
            let at = process.logged(phase)?;
            Some(((*phase).to_owned(), (at - started).as_secs_f64() * 1000.0))
        })
        .collect();
    let window_seconds = elapsed.as_secs_f64();
    Ok(Results {
        registered,
        job_file_bytes: 0,
        startup_phases_ms,
        startup_to_leader_ms: leader_at.as_secs_f64() * 1000.0,
        startup_to_first_run_ms: first_run_at.as_secs_f64() * 1000.0,
        rss_bytes: rss,
        peak_rss_bytes: peak,
        window_seconds,
        cpu_ms,
        cpu_ms_per_second: cpu_ms / window_seconds,
        fires,
        cpu_us_per_fire: (fires > 0).then(|| cpu_ms * 1000.0 / fires as f64),
    })
}

fn report(params: &Params, r: Results) -> Report {
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let rows = vec![
        Row::judged(
            "registered jobs",
            r.registered.to_string(),
            params.jobs.to_string(),
            r.registered == params.jobs as i64,
        ),
        Row::info(
            "start-up phases (log lines)",
            PHASES
                .iter()
                .filter_map(|p| {
                    Some(format!(
                        "{p} {:.2} s",
                        r.startup_phases_ms.get(*p)? / 1000.0
                    ))
                })
                .collect::<Vec<_>>()
                .join(" · "),
        ),
        Row::info(
            "start-up to leader",
            format!("{:.2} s", r.startup_to_leader_ms / 1000.0),
        ),
        Row::judged(
            "start-up to first run persisted",
            format!("{:.2} s", r.startup_to_first_run_ms / 1000.0),
            "≤ 5 s",
            r.startup_to_first_run_ms <= 5000.0,
        ),
        Row::judged(
            "RSS after the window",
            format!("{:.1} MiB", mib(r.rss_bytes)),
            "≤ 150 MB",
            r.rss_bytes <= 150_000_000,
        ),
        Row::judged(
            "peak RSS (VmHWM)",
            format!("{:.1} MiB", mib(r.peak_rss_bytes)),
            "≤ 150 MB",
            r.peak_rss_bytes <= 150_000_000,
        ),
        Row::info(
            "CPU per 1 s tick",
            format!(
                "{:.1} ms ({:.1} % of a core)",
                r.cpu_ms_per_second,
                r.cpu_ms_per_second / 10.0
            ),
        ),
        Row::info(
            "due fires in the window",
            format!("{} ({:.0}/s)", r.fires, r.fires as f64 / r.window_seconds),
        ),
        Row::info(
            "CPU per due fire",
            r.cpu_us_per_fire
                .map_or_else(|| "n/a".to_owned(), |us| format!("{us:.0} µs")),
        ),
    ];
    Report {
        scenario: "scale",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: r.registered == params.jobs as i64 && r.fires > 0,
        results: serde_json::to_value(&r).unwrap_or_default(),
        table: rows,
        notes: vec![
            "one `chime scheduler` process on a migrated database, no worker; the targets are \
             for --jobs 100000"
                .to_owned(),
            "tick cost should follow due fires, not registered jobs: compare CPU per due fire \
             at --jobs 1000 and --jobs 100000"
                .to_owned(),
        ],
    }
}
