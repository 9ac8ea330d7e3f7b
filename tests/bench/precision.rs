//! `precision` and `burst`: N jobs all due on the same instants for D seconds, seen from the
//! worker side. `precision` fires 1,000 jobs every second, `burst` 10,000 jobs every 10 s (one
//! instant that needs far more than the base lead to cross the broker and be claimed). Per
//! (job, scheduled instant) of the steady window: expected, delivered, missed, duplicates, and
//! the lateness from the scheduled instant to the handler's start; also whether the leader kept
//! its term. Optionally writes every execution to a CSV
//! `job_id,intended_at_unix_ms,started_at_unix_ms`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use chime_e2e::Scheduler;
use serde::Serialize;

use crate::jobs::{JobDef, specs};
use crate::recorder::{WorkerKind, Workers};
use crate::report::{Report, Row, ms, share, summary};
use crate::sandbox::{Sandbox, Services, bounded, poll, sleep_until_us, within};
use crate::stats::{Execution, Summary, Tally, Window, tally};

const SECOND: i64 = 1_000_000;

/// Parameters of the precision and burst scenarios.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// `precision` or `burst`.
    pub scenario: &'static str,
    /// Jobs, each `every = "<period>s"`.
    pub jobs: usize,
    /// Seconds between two instants of every job.
    pub period: u32,
    /// The lateness p99 to meet, ms.
    pub p99_limit_ms: f64,
    /// Seconds of firing, counted from the first fire; the steady window excludes the first 2
    /// and the last second.
    pub seconds: u64,
    /// Workers.
    pub workers: usize,
    /// How the workers run: in this process, or processes started by a command.
    pub worker: WorkerKind,
    /// Handlers each worker runs at once.
    pub capacity: u16,
    /// Deliveries each worker may hold beyond its handlers (triggers waiting for their
    /// instant); the prefetch is `capacity + hold`.
    pub hold: u16,
    /// Where to write the per-execution CSV.
    pub csv: Option<PathBuf>,
}

/// What the precision scenario measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// The steady window.
    pub window: Window,
    /// Per (job, instant) counts and lateness over the window.
    pub tally: Tally,
    /// Executions observed in the whole run, warm-up and tail included.
    pub executions: usize,
    /// How far each execution's recorded `started_at` (database) is from its handler's start
    /// as the worker saw it, in absolute milliseconds: the database's lateness against the
    /// worker-side figure above, for the same runs. `None` for worker processes, whose
    /// handler starts are read from the database in the first place.
    pub database_vs_worker: Option<Summary>,
    /// Leader elections between the first fire and the stop (the lease's term moved).
    pub term_changes: i64,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    let scenario = params.scenario;
    ensure!(
        params.seconds >= 4,
        "{scenario} needs --seconds 4 or more (2 s warm-up, 1 s tail)"
    );
    ensure!(params.jobs > 0, "{scenario} needs --jobs 1 or more");
    ensure!(
        params.period > 0,
        "{scenario} needs a period of 1 s or more"
    );
    within(services, scenario, async |sandbox| {
        measure(sandbox, params).await
    })
    .await
}

async fn measure(sandbox: &Sandbox, params: &Params) -> anyhow::Result<Report> {
    let scenario = params.scenario;
    let group = sandbox.group(scenario);
    let names: Vec<String> = (0..params.jobs)
        .map(|i| format!("{scenario}-{i:05}"))
        .collect();
    let every = format!("{}s", params.period);
    let defs: Vec<JobDef> = names
        .iter()
        .map(|name| JobDef::new(name, &group).with("every", every.as_str()))
        .collect();
    let workers = Workers::start(
        sandbox,
        &params.worker,
        &group,
        &names,
        params.workers,
        params.capacity,
        params.hold,
    )?;
    sandbox
        .wait_for_consumers(&group, params.workers as u32)
        .await?;
    eprintln!(
        "[{scenario}] {} jobs every {every} for {} s",
        params.jobs, params.seconds
    );
    let scheduler = Scheduler::start(
        sandbox.service_config(&format!("bench-{scenario}")),
        specs(&defs)?,
    );

    let first = poll(Duration::from_secs(120), "the first fire", || async {
        workers.earliest().await
    })
    .await?;
    let term_before = sandbox.lease_term().await?;
    let period_us = i64::from(params.period) * SECOND;
    let t0 = first.scheduled_us.div_euclid(period_us) * period_us;
    let seconds = i64::try_from(params.seconds)?;
    let window = Window {
        start_us: t0 + 2 * SECOND,
        end_us: t0 + (seconds - 1) * SECOND,
        period_us,
    };
    // Fires run from t0 to t0 + D − 1 s; stop after the last one, leaving the window's last
    // instant (t0 + D − 2 s) 2.5 s to be published before the graceful stop.
    sleep_until_us(t0 + seconds * SECOND + SECOND / 2).await;
    let term_changes = sandbox.lease_term().await? - term_before;
    bounded(
        "stopping the scheduler",
        Duration::from_secs(60),
        scheduler.stop(),
    )
    .await?;
    let jobs = 0..u32::try_from(params.jobs)?;
    workers
        .settle(
            |seen| tally(seen, jobs.clone(), &window).missed == 0,
            Duration::from_secs(5),
            Duration::from_secs(60),
        )
        .await?;
    let executions = workers.stop().await?;
    if let Some(path) = &params.csv {
        write_csv(path, &names, &executions)?;
        eprintln!(
            "[{scenario}] wrote {} executions to {}",
            executions.len(),
            path.display()
        );
    }
    let tally = tally(&executions, jobs, &window);
    let database_vs_worker = match params.worker {
        WorkerKind::InProcess => Some(database_vs_worker(sandbox, &executions).await?),
        WorkerKind::Command(_) => None,
    };
    Ok(report(
        params,
        &tally,
        Results {
            window,
            tally: tally.clone(),
            executions: executions.len(),
            database_vs_worker,
            term_changes,
        },
    ))
}

fn report(params: &Params, t: &Tally, results: Results) -> Report {
    let rows = vec![
        Row::info(
            "steady window",
            format!(
                "{} jobs × {} instants ({:.0} s)",
                t.jobs,
                t.instants_per_job,
                results.window.seconds()
            ),
        ),
        Row::info("expected (job, instant)", t.expected.to_string()),
        Row::judged(
            "delivered",
            format!("{} ({})", t.delivered, share(t.delivered, t.expected)),
            "100 %",
            t.delivered == t.expected && t.expected > 0,
        ),
        Row::judged("missed", t.missed.to_string(), "0", t.missed == 0),
        Row::judged(
            "duplicates",
            t.duplicates.to_string(),
            "0",
            t.duplicates == 0,
        ),
        Row::info("lateness scheduled → handler start", summary(&t.lateness)),
        Row::judged(
            "lateness p99",
            ms(t.lateness.p99_ms),
            format!("≤ {} ms", params.p99_limit_ms),
            t.lateness
                .p99_ms
                .is_some_and(|p99| p99 <= params.p99_limit_ms),
        ),
        Row::judged(
            "leader term changes",
            results.term_changes.to_string(),
            "0",
            results.term_changes == 0,
        ),
        Row::info(
            "|database started_at − handler start|",
            results
                .database_vs_worker
                .as_ref()
                .map_or_else(|| "— (the starts are the database's)".to_owned(), summary),
        ),
    ];
    Report {
        scenario: params.scenario,
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: t.expected > 0
            && t.missed == 0
            && t.duplicates == 0
            && t.unexpected == 0
            && results.term_changes == 0,
        results: serde_json::to_value(&results).unwrap_or_default(),
        table: rows,
        notes: vec![
            format!(
                "the scheduler runs in this process (on its own runtime), the workers are {}; \
                 the target is for the scenario's default --jobs and --seconds; {} worker(s) × \
                 {} handlers, hold {}",
                params.worker.describe(),
                params.workers,
                params.capacity,
                params.hold
            ),
            format!(
                "steady window = fires from the first one + 2 s to D − 1 s; {} executions seen \
                 in all",
                results.executions
            ),
        ],
    }
}

/// For every execution, `|started_at − the handler's own start|` in ms, `started_at` as the
/// outcome recorded it on the attempt (docs/runs.md); an execution without a recorded attempt
/// is an error.
async fn database_vs_worker(
    sandbox: &Sandbox,
    executions: &[Execution],
) -> anyhow::Result<Summary> {
    let run_ids: Vec<i64> = executions.iter().map(|e| e.run_id).collect();
    let recorded: Vec<(i64, i32, i64)> = sqlx::query_as(
        "SELECT run_id, attempt, (extract(epoch FROM started_at) * 1000000)::bigint
           FROM chime_attempts WHERE run_id = ANY($1) AND state <> 'running'",
    )
    .bind(&run_ids)
    .fetch_all(sandbox.store.pool())
    .await
    .context("reading the recorded starts")?;
    let recorded: HashMap<(i64, i32), i64> = recorded
        .into_iter()
        .map(|(run, attempt, at)| ((run, attempt), at))
        .collect();
    let mut differences = Vec::with_capacity(executions.len());
    for e in executions {
        let attempt = i32::try_from(e.attempt)?;
        let Some(at) = recorded.get(&(e.run_id, attempt)) else {
            anyhow::bail!(
                "run {} attempt {attempt} ran but has no recorded start",
                e.run_id
            );
        };
        differences.push((at - e.started_us).abs() as f64 / 1000.0);
    }
    Ok(Summary::of(differences))
}

/// `job_id,intended_at_unix_ms,started_at_unix_ms`, one row per execution, times with
/// microsecond decimals; `job_id` is the job's name.
fn write_csv(path: &Path, names: &[String], executions: &[Execution]) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "job_id,intended_at_unix_ms,started_at_unix_ms")?;
    let mut sorted = executions.to_vec();
    sorted.sort_by_key(|e| (e.scheduled_us, e.job, e.started_us));
    for e in &sorted {
        writeln!(
            out,
            "{},{},{}",
            names[e.job as usize],
            unix_ms(e.scheduled_us),
            unix_ms(e.started_us)
        )?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// Unix microseconds as milliseconds with three decimals, exactly.
fn unix_ms(us: i64) -> String {
    format!("{}.{:03}", us.div_euclid(1000), us.rem_euclid(1000))
}
