//! `throughput`: the highest sustained rate of durable runs (persisted, published with confirms
//! to the quorum queue, claimed, outcome recorded, acked) before the lateness p99 passes 100 ms,
//! and what happens past it: the ramp goes on to the last rate (20,000 runs/s by default), where
//! lateness grows but no run may be lost or doubled and the leader must keep its term.
//!
//! The rate climbs in steps. A step at R runs/s declares R / 100 jobs with `every = "10ms"`, so
//! the runs arrive as a burst of R / 100 every 10 ms rather than one burst a second (fixed-rate
//! schedules are aligned to the epoch; jobs cannot be offset). Jobs are only added from step to
//! step, through a config reload, so the scheduler never restarts. Each step is judged at its
//! end over its steady window (the step's first 2 s and last second excluded), counting a run not
//! yet started as infinitely late; the first step whose p99 is over 100 ms is where it
//! saturates. After the ramp the jobs are removed (a reload, no new fires) while the leader keeps
//! publishing what the ramp left in the outbox; everything is drained and each window is
//! counted again from the
//! worker side and from the database (runs that ended `succeeded`), and the lease's term is
//! compared with the one at the first fire.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use chime_e2e::Scheduler;
use serde::Serialize;

use crate::jobs::{JobDef, specs};
use crate::raw::{self, RawRate};
use crate::recorder::{WorkerKind, Workers};
use crate::report::{Report, Row, ms, summary};
use crate::sandbox::{Sandbox, Services, bounded, now_us, poll, sleep_until_us, within};
use crate::stats::{Summary, Tally, Window, tally};

const SECOND: i64 = 1_000_000;
/// Period of every throughput job.
const PERIOD_MS: u32 = 10;
/// Runs per second one job adds.
const RATE_PER_JOB: u32 = 1000 / PERIOD_MS;
/// The lateness p99 a step must stay under.
const P99_LIMIT_MS: f64 = 100.0;

/// Parameters of the throughput scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Rates to try, runs per second, ascending, multiples of 100.
    pub rates: Vec<u32>,
    /// Seconds per step.
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
}

/// One step of the ramp.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Target rate, runs per second.
    pub rate: u32,
    /// Jobs firing every 10 ms.
    pub jobs: u32,
    /// The step's steady window.
    pub window: Window,
    /// Lateness at the step's end, counting runs not started yet as infinitely late.
    pub at_end: Summary,
    /// Runs of the window not started by the step's end.
    pub not_started_at_end: u64,
    /// Whether the p99 stayed within 100 ms.
    pub sustained: bool,
    /// The window counted after the final drain.
    pub drained: Tally,
    /// Runs of the window that ended `succeeded` in the database, per second of window.
    pub durable_per_second: f64,
    /// Runs of the window the misfire policy skipped (recorded `skipped` with a reason):
    /// published too late, past `misfire_grace`, while the ramp was past saturation.
    pub skipped: u64,
    /// Fires of the window the planner had not written yet when the jobs were removed after
    /// the ramp (a removed job fires no more): never runs, so nothing to run.
    pub unwritten: u64,
    /// Runs of the window that were written but neither executed nor skipped with a reason
    /// after the drain: lost.
    pub lost: u64,
}

/// What the throughput scenario measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// The highest rate whose step (and every step before it) was sustained; 0 if none.
    pub sustained_rate: u32,
    /// The first rate whose step was not sustained, if any.
    pub saturated_at: Option<u32>,
    /// Leader elections between the first fire and the end of the drain.
    pub term_changes: i64,
    /// The broker's own limit, measured just before the ramp.
    pub raw_broker: RawRate,
    /// Every step run.
    pub steps: Vec<Step>,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    ensure!(
        params.seconds >= 4,
        "throughput needs --seconds 4 or more per step (2 s warm-up, 1 s tail)"
    );
    ensure!(
        !params.rates.is_empty(),
        "throughput needs at least one rate"
    );
    ensure!(
        params
            .rates
            .iter()
            .all(|r| *r > 0 && r.is_multiple_of(RATE_PER_JOB)),
        "throughput rates must be multiples of {RATE_PER_JOB} runs/s (one job every \
         {PERIOD_MS} ms adds {RATE_PER_JOB}/s)"
    );
    ensure!(
        params.rates.windows(2).all(|w| w[0] < w[1]),
        "throughput rates must be ascending"
    );
    within(services, "throughput", async |sandbox| {
        measure(sandbox, params).await
    })
    .await
}

/// Seconds of the raw broker measurement before the ramp.
const RAW_SECONDS: u64 = 5;

async fn measure(sandbox: &Sandbox, params: &Params) -> anyhow::Result<Report> {
    let raw_broker = raw::measure(sandbox, RAW_SECONDS).await?;
    eprintln!(
        "[throughput] raw broker limit: {:.0} msg/s (quorum queue, persistent, confirm + consume + ack)",
        raw_broker.per_second
    );
    let group = sandbox.group("throughput");
    let most = params.rates.last().copied().unwrap_or_default() / RATE_PER_JOB;
    let names: Vec<String> = (0..most).map(|i| format!("throughput-{i:05}")).collect();
    let defs: Vec<JobDef> = names
        .iter()
        .map(|name| JobDef::new(name, &group).with("every", format!("{PERIOD_MS}ms")))
        .collect();
    let jobs_for = |rate: u32| (rate / RATE_PER_JOB) as usize;
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
    let first_rate = params.rates[0];
    let scheduler = Scheduler::start(
        sandbox.service_config("bench-throughput"),
        specs(&defs[..jobs_for(first_rate)])?,
    );
    poll(Duration::from_secs(120), "the first fire", || async {
        workers.earliest().await
    })
    .await?;
    let term_before = sandbox.lease_term().await?;

    let seconds = i64::try_from(params.seconds)?;
    let mut steps = Vec::new();
    for (k, &rate) in params.rates.iter().enumerate() {
        if k > 0 {
            scheduler.reload(specs(&defs[..jobs_for(rate)])?).await;
        }
        let start = now_us();
        eprintln!("[throughput] step {rate} runs/s for {} s", params.seconds);
        let window = Window {
            start_us: start + 2 * SECOND,
            end_us: start + (seconds - 1) * SECOND,
            period_us: i64::from(PERIOD_MS) * 1000,
        };
        sleep_until_us(start + seconds * SECOND + SECOND / 2).await;
        let count = tally(
            &workers.executions().await?,
            0..jobs_for(rate) as u32,
            &window,
        );
        let mut lateness = count.lateness_ms.clone();
        lateness.extend(std::iter::repeat_n(f64::INFINITY, count.missed as usize));
        let at_end = Summary::of(lateness);
        let sustained = at_end.p99_ms.is_some_and(|p99| p99 <= P99_LIMIT_MS);
        eprintln!(
            "[throughput] {rate} runs/s: {} not started by the step's end, lateness {}",
            count.missed,
            summary(&at_end)
        );
        steps.push(Step {
            rate,
            jobs: jobs_for(rate) as u32,
            window,
            at_end,
            not_started_at_end: count.missed,
            sustained,
            drained: Tally::default(),
            durable_per_second: 0.0,
            skipped: 0,
            unwritten: 0,
            lost: 0,
        });
    }
    // No new fires, but the leader keeps publishing what the ramp left in the outbox: past
    // saturation runs wait there, and the drain must show that none is lost.
    scheduler.reload(Vec::new()).await;
    let windows: Vec<(u32, Window)> = steps.iter().map(|s| (s.jobs, s.window)).collect();
    workers
        .settle(
            |seen| {
                windows
                    .iter()
                    .all(|(jobs, w)| tally(seen, 0..*jobs, w).missed == 0)
            },
            Duration::from_secs(10),
            Duration::from_secs(600),
        )
        .await?;
    let term_changes = sandbox.lease_term().await? - term_before;
    bounded(
        "stopping the scheduler",
        Duration::from_secs(60),
        scheduler.stop(),
    )
    .await?;
    let executions = workers.stop().await?;
    for step in &mut steps {
        step.drained = tally(&executions, 0..step.jobs, &step.window);
        step.durable_per_second =
            in_state(sandbox, &step.window, "succeeded").await? as f64 / step.window.seconds();
        step.skipped = u64::try_from(in_state(sandbox, &step.window, "skipped").await?)?;
        let written = u64::try_from(in_state(sandbox, &step.window, "any").await?)?;
        step.unwritten = step.drained.expected.saturating_sub(written);
        step.lost = step
            .drained
            .missed
            .saturating_sub(step.skipped + step.unwritten);
    }
    let sustained_rate = steps
        .iter()
        .take_while(|s| s.sustained)
        .map(|s| s.rate)
        .last()
        .unwrap_or(0);
    let saturated_at = steps.iter().find(|s| !s.sustained).map(|s| s.rate);
    Ok(report(
        params,
        Results {
            sustained_rate,
            saturated_at,
            term_changes,
            raw_broker,
            steps,
        },
    ))
}

/// Runs scheduled inside `window` that ended in `state` (`any`: every run).
async fn in_state(sandbox: &Sandbox, window: &Window, state: &str) -> anyhow::Result<i64> {
    let from = chrono::DateTime::from_timestamp_micros(window.start_us).context("window start")?;
    let to = chrono::DateTime::from_timestamp_micros(window.end_us).context("window end")?;
    sqlx::query_scalar(
        "SELECT count(*) FROM chime_runs
         WHERE ($3 = 'any' OR state = $3) AND scheduled_at >= $1 AND scheduled_at < $2",
    )
    .bind(from)
    .bind(to)
    .bind(state)
    .fetch_one(sandbox.store.pool())
    .await
    .with_context(|| format!("counting {state} runs"))
}

fn report(params: &Params, results: Results) -> Report {
    let mut rows = Vec::new();
    for step in &results.steps {
        rows.push(Row::judged(
            format!(
                "{} runs/s ({} jobs every {PERIOD_MS} ms)",
                step.rate, step.jobs
            ),
            format!(
                "{}; durable {:.0}/s; {} not started at step end",
                summary(&step.at_end),
                step.durable_per_second,
                step.not_started_at_end
            ),
            "p99 ≤ 100 ms",
            step.sustained,
        ));
    }
    let missed: u64 = results.steps.iter().map(|s| s.drained.missed).sum();
    let duplicates: u64 = results.steps.iter().map(|s| s.drained.duplicates).sum();
    let expected: u64 = results.steps.iter().map(|s| s.drained.expected).sum();
    rows.push(Row::judged(
        "highest sustained rate",
        format!("{} runs/s", results.sustained_rate),
        "≥ 5,000 runs/s",
        results.sustained_rate >= 5000,
    ));
    rows.push(Row::info(
        "raw broker limit beside it",
        format!(
            "{:.0} msg/s (one quorum queue, persistent, confirm + consume + ack, no database); \
             the highest sustained rate is {:.0} % of it",
            results.raw_broker.per_second,
            100.0 * f64::from(results.sustained_rate) / results.raw_broker.per_second.max(1.0)
        ),
    ));
    rows.push(Row::info(
        "saturates at",
        match results.saturated_at {
            Some(rate) => format!("{rate} runs/s (first step with p99 over 100 ms)"),
            None => "not within the ramp".to_owned(),
        },
    ));
    rows.push(Row::judged(
        "leader term changes",
        results.term_changes.to_string(),
        "0",
        results.term_changes == 0,
    ));
    let skipped: u64 = results.steps.iter().map(|s| s.skipped).sum();
    let unwritten: u64 = results.steps.iter().map(|s| s.unwritten).sum();
    let lost: u64 = results.steps.iter().map(|s| s.lost).sum();
    rows.push(Row::info(
        "not run after drain (all steps)",
        format!(
            "{missed} of {expected}: {skipped} skipped by the misfire policy (published past \
             misfire_grace), {unwritten} fires not yet written by the planner when the jobs \
             were removed, {lost} written but neither run nor skipped"
        ),
    ));
    rows.push(Row::judged(
        "written runs lost after drain (all steps)",
        lost.to_string(),
        "0",
        lost == 0,
    ));
    rows.push(Row::judged(
        "duplicates (all steps)",
        duplicates.to_string(),
        "0",
        duplicates == 0,
    ));
    if let Some(last) = results.steps.last() {
        rows.push(Row::info(
            "last step after drain",
            format!("max lateness {}", ms(last.drained.lateness.max_ms)),
        ));
    }
    let unexpected: u64 = results.steps.iter().map(|s| s.drained.unexpected).sum();
    Report {
        scenario: "throughput",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: expected > 0
            && lost == 0
            && duplicates == 0
            && unexpected == 0
            && results.term_changes == 0,
        results: serde_json::to_value(&results).unwrap_or_default(),
        table: rows,
        notes: vec![
            format!(
                "the scheduler runs in this process (on its own runtime), the workers are {} \
                 ({} × {} handlers, hold {}); a step counts a run not started by its end as \
                 infinitely late",
                params.worker.describe(),
                params.workers,
                params.capacity,
                params.hold
            ),
            "durable/s = runs of the step's window that ended `succeeded` in PostgreSQL, per \
             second"
                .to_owned(),
        ],
    }
}
