//! `failover`: two `chime scheduler` processes, N jobs every second (`misfire = "fire_all"`, so
//! a fire that falls due during the gap is run late rather than coalesced, and "missed" means
//! lost). Once both run and the jobs fire, the leader is SIGKILLed. Measures the time until the
//! other instance holds the lease, the time from the kill to the first handler start of a fire
//! scheduled after the kill, and, over the steady window (first fire + 2 s to the graceful stop
//! − 1 s), expected, delivered, missed and duplicate (job, instant) pairs from the worker side.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use serde::Serialize;

use crate::jobs::{JobDef, toml};
use crate::recorder::{WorkerKind, Workers};
use crate::report::{Report, Row, ms, share, summary};
use crate::sandbox::{Sandbox, Services, now_us, poll, sleep_until_us, within, write_file};
use crate::stats::{Tally, Window, tally};

const SECOND: i64 = 1_000_000;

/// Parameters of the failover scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Jobs, each `every = "1s"`.
    pub jobs: usize,
    /// Seconds from the first fire to the graceful stop; the kill comes a third of the way in
    /// (at least 3 s after the first fire), and at least 10 s are left after it.
    pub seconds: u64,
    /// Workers.
    pub workers: usize,
    /// Handlers each worker runs at once.
    pub capacity: u16,
    /// Deliveries each worker may hold beyond its handlers (triggers waiting for their
    /// instant); the prefetch is `capacity + hold`.
    pub hold: u16,
}

/// What the failover scenario measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// SIGKILL → the other instance holds the lease.
    pub takeover_ms: f64,
    /// SIGKILL → first handler start of a fire scheduled after the kill.
    pub next_fire_ms: Option<f64>,
    /// Fires recorded as catch-up runs in the window (fell due while no one led).
    pub catchup_runs: i64,
    /// The steady window.
    pub window: Window,
    /// Per (job, instant) counts and lateness over the window.
    pub tally: Tally,
}

/// Runs the scenario in a fresh sandbox.
pub async fn run(services: &Services, params: &Params) -> anyhow::Result<Report> {
    ensure!(params.jobs > 0, "failover needs --jobs 1 or more");
    let chime = services.chime_binary()?;
    within(services, "failover", async |sandbox| {
        measure(sandbox, &chime, params).await
    })
    .await
}

async fn measure(
    sandbox: &Sandbox,
    chime: &std::path::Path,
    params: &Params,
) -> anyhow::Result<Report> {
    let group = sandbox.group("failover");
    let names: Vec<String> = (0..params.jobs)
        .map(|i| format!("failover-{i:05}"))
        .collect();
    let defs: Vec<JobDef> = names
        .iter()
        .map(|name| {
            JobDef::new(name, &group)
                .with("every", "1s")
                .with("misfire", "fire_all")
        })
        .collect();
    let path = sandbox.path("jobs.toml");
    write_file(&path, &toml(&defs))?;
    let workers = Workers::start(
        sandbox,
        &WorkerKind::InProcess,
        &group,
        &names,
        params.workers,
        params.capacity,
        params.hold,
    )?;
    sandbox
        .wait_for_consumers(&group, params.workers as u32)
        .await?;

    let mut a = sandbox.scheduler(chime, "bench-failover-a", &path)?;
    poll(Duration::from_secs(120), "instance a to lead", || async {
        Ok((sandbox.leader().await?.as_deref() == Some("bench-failover-a")).then_some(()))
    })
    .await?;
    let first = poll(Duration::from_secs(60), "the first fire", || async {
        workers.earliest().await
    })
    .await?;
    let t0 = first.scheduled_us.div_euclid(SECOND) * SECOND;
    let mut b = sandbox.scheduler(chime, "bench-failover-b", &path)?;
    b.wait_for_log("scheduler started", Duration::from_secs(120))
        .await?;
    a.ensure_running()?;
    ensure!(
        sandbox.leader().await?.as_deref() == Some("bench-failover-a"),
        "instance a lost the lead before the kill"
    );

    let seconds = i64::try_from(params.seconds)?;
    let kill_at = (t0 + (seconds * SECOND / 3).max(3 * SECOND)).max(now_us() + SECOND);
    sleep_until_us(kill_at).await;
    // Taken just before the signal: the measured times include the kill itself.
    let killed_us = now_us();
    let killed = tokio::time::Instant::now();
    a.kill().await.context("killing instance a")?;
    eprintln!("[failover] SIGKILLed the leader (pid {})", a.pid());
    poll(
        Duration::from_secs(60),
        "instance b to take over",
        || async {
            Ok((sandbox.leader().await?.as_deref() == Some("bench-failover-b")).then_some(()))
        },
    )
    .await?;
    let takeover = killed.elapsed();
    eprintln!("[failover] instance b leads {takeover:?} after the kill");

    let stop_at = (t0 + seconds * SECOND).max(killed_us + 10 * SECOND);
    sleep_until_us(stop_at).await;
    b.ensure_running()?;
    if !b.stop(Duration::from_secs(30)).await? {
        eprintln!("[failover] warning: instance b did not exit cleanly after SIGTERM");
    }
    let window = Window {
        start_us: t0 + 2 * SECOND,
        end_us: stop_at.div_euclid(SECOND) * SECOND - SECOND,
        period_us: SECOND,
    };
    let jobs = 0..u32::try_from(params.jobs)?;
    workers
        .settle(
            |seen| tally(seen, jobs.clone(), &window).missed == 0,
            Duration::from_secs(5),
            Duration::from_secs(60),
        )
        .await?;
    let executions = workers.stop().await?;
    let next_fire_ms = executions
        .iter()
        .filter(|e| e.scheduled_us > killed_us)
        .map(|e| (e.started_us - killed_us) as f64 / 1000.0)
        .min_by(f64::total_cmp);
    let from = chrono::DateTime::from_timestamp_micros(window.start_us).context("window")?;
    let to = chrono::DateTime::from_timestamp_micros(window.end_us).context("window")?;
    let catchup_runs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chime_runs
         WHERE trigger = 'catchup' AND scheduled_at >= $1 AND scheduled_at < $2",
    )
    .bind(from)
    .bind(to)
    .fetch_one(sandbox.store.pool())
    .await
    .context("counting catch-up runs")?;
    let tally = tally(&executions, jobs, &window);
    Ok(report(
        params,
        Results {
            takeover_ms: takeover.as_secs_f64() * 1000.0,
            next_fire_ms,
            catchup_runs,
            window,
            tally,
        },
    ))
}

fn report(params: &Params, r: Results) -> Report {
    let t = &r.tally;
    let rows = vec![
        Row::info(
            "takeover (kill → other instance holds the lease)",
            ms(Some(r.takeover_ms)),
        ),
        Row::judged(
            "next fire (kill → first handler start of a later fire)",
            ms(r.next_fire_ms),
            "≤ 5 s",
            r.next_fire_ms.is_some_and(|v| v <= 5000.0),
        ),
        Row::info(
            "steady window",
            format!(
                "{} jobs × {} instants ({:.0} s)",
                t.jobs,
                t.instants_per_job,
                r.window.seconds()
            ),
        ),
        Row::info(
            "delivered",
            format!(
                "{} of {} ({})",
                t.delivered,
                t.expected,
                share(t.delivered, t.expected)
            ),
        ),
        Row::judged("missed", t.missed.to_string(), "0", t.missed == 0),
        Row::judged(
            "duplicates",
            t.duplicates.to_string(),
            "0",
            t.duplicates == 0,
        ),
        Row::info("catch-up runs in the window", r.catchup_runs.to_string()),
        Row::info("lateness over the window", summary(&t.lateness)),
    ];
    Report {
        scenario: "failover",
        settings: serde_json::to_value(params).unwrap_or_default(),
        correct: t.expected > 0
            && t.missed == 0
            && t.duplicates == 0
            && t.unexpected == 0
            && r.next_fire_ms.is_some(),
        results: serde_json::to_value(&r).unwrap_or_default(),
        table: rows,
        notes: vec![
            "two `chime scheduler` processes (lease TTL 3 s, renewed every second), workers in \
             this process; jobs use misfire = fire_all"
                .to_owned(),
        ],
    }
}
