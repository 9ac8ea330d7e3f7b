//! `chime-runs-bench`: loads a large `chime_runs` table (10 million runs by default) into a
//! database of its own and reports p50/p95/p99 latency of the queries the API, the dashboard,
//! `/metrics` and retention run against it, through the scheduler's own code (docs/operations.md).
//!
//! ```text
//! cargo build --release -p chime-e2e --bin chime-runs-bench
//! target/release/chime-runs-bench --runs 10000000          # drops its database at the end
//! ```

use std::time::{Duration, Instant};

use chime_e2e::percentile;
use chime_scheduler::auth::Caller;
use chime_scheduler::ops::Operations;
use chime_scheduler::store::{Fence, RunQuery, Store};
use clap::Parser;

/// Latency of the operations surface's queries on a large runs table.
#[derive(Debug, Parser)]
#[command(name = "chime-runs-bench")]
struct Args {
    /// Runs to load.
    #[arg(long, default_value_t = 10_000_000)]
    runs: i64,
    /// Distinct jobs the runs belong to (20 groups).
    #[arg(long, default_value_t = 1000)]
    jobs: i64,
    /// Timed executions of each query.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// PostgreSQL server (the benchmark creates and drops its own database there).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    server: String,
    /// Database name.
    #[arg(long, default_value = "chime_runs_bench")]
    database: String,
    /// Reuse a database already loaded with --runs runs, and keep it at the end.
    #[arg(long)]
    keep: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Target p95 for every query (issue 5).
const TARGET: Duration = Duration::from_millis(100);
/// Runs loaded per statement.
const CHUNK: i64 = 500_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = format!("{}/{}", args.server.trim_end_matches('/'), args.database);
    let reuse = args.keep && sqlx_exists(&url).await;
    if !reuse {
        drop_database(&url).await;
    }
    Store::create_database_if_missing(&url).await?;
    let store = Store::connect(&url, 4).await?;
    store.migrate().await?;
    let loaded: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs")
        .fetch_one(store.pool())
        .await?;
    if loaded < args.runs {
        load(&store, &args, loaded).await?;
    }
    eprintln!("measuring {} samples per query", args.samples);
    let results = measure(&store, &args).await?;
    if args.json {
        let rows: Vec<_> = results
            .iter()
            .map(|r| {
                serde_json::json!({"query": r.name, "p50_ms": r.p50, "p95_ms": r.p95,
                                   "p99_ms": r.p99, "max_ms": r.max, "rows": r.rows})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"runs": args.runs, "samples": args.samples,
                               "target_p95_ms": TARGET.as_millis(), "queries": rows})
        );
    } else {
        println!(
            "{} runs, {} samples per query, target p95 <= {} ms\n",
            args.runs,
            args.samples,
            TARGET.as_millis()
        );
        println!(
            "{:<44} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "QUERY", "P50 ms", "P95 ms", "P99 ms", "MAX ms", "ROWS"
        );
        for r in &results {
            println!(
                "{:<44} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7} {}",
                r.name,
                r.p50,
                r.p95,
                r.p99,
                r.max,
                r.rows,
                if r.p95 <= TARGET.as_secs_f64() * 1000.0 {
                    ""
                } else {
                    "OVER TARGET"
                }
            );
        }
    }
    store.pool().close().await;
    if !args.keep {
        drop_database(&url).await;
    }
    Ok(())
}

async fn sqlx_exists(url: &str) -> bool {
    use sqlx::migrate::MigrateDatabase as _;
    sqlx::Postgres::database_exists(url).await.unwrap_or(false)
}

async fn drop_database(url: &str) {
    use sqlx::migrate::MigrateDatabase as _;
    if sqlx_exists(url).await {
        let _ = sqlx::Postgres::force_drop_database(url).await;
    }
}

/// Loads runs `from..args.runs`: one every 0.5 s of scheduled time ending now (10 M runs span
/// 58 days), 1000 jobs in 20 groups; every job's runs (in turns of the jobs) about 96 % succeeded, 1 % failed, 0.1 % dead, 2 % skipped,
/// 0.5 % cancelled, the newest few hundred unfinished; attempts and log lines for the newest
/// 100,000.
async fn load(store: &Store, args: &Args, from: i64) -> anyhow::Result<()> {
    let started = Instant::now();
    let total = args.runs;
    let mut next = from;
    while next < total {
        let to = (next + CHUNK).min(total);
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state,
                                     reason, term, attempt, worker_id, error, created_at,
                                     published_at, started_at, finished_at)
             SELECT 'job-' || (g % $3), 'group-' || (g % $3 % 20), t, 'schedule',
                    '{\"batch\": 500}', st,
                    CASE WHEN st = 'skipped' THEN 'missed by 3s; misfire policy skip' END, 1,
                    CASE WHEN st = 'skipped' THEN 0 ELSE 1 END,
                    CASE WHEN st = 'skipped' THEN NULL ELSE 'worker-' || (g % 7) END,
                    CASE WHEN st IN ('failed', 'dead') THEN 'connection refused' END,
                    t - interval '500 ms',
                    CASE WHEN st <> 'skipped' THEN t + interval '3 ms' END,
                    CASE WHEN st <> 'skipped' THEN t + interval '5 ms' END,
                    t + interval '1 s'
             FROM (SELECT g, now() - ($4 - g) * interval '500 ms' AS t,
                          CASE WHEN (g / $3) % 1000 = 7 THEN 'dead'
                               WHEN (g / $3) % 100 = 3 THEN 'failed'
                               WHEN (g / $3) % 50 = 1 THEN 'skipped'
                               WHEN (g / $3) % 200 = 5 THEN 'cancelled'
                               ELSE 'succeeded' END AS st
                   FROM generate_series($1::bigint, $2::bigint - 1) g) s",
        )
        .bind(next)
        .bind(to)
        .bind(args.jobs)
        .bind(total)
        .execute(store.pool())
        .await?;
        next = to;
        eprintln!(
            "loaded {next} of {total} runs ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    // The newest runs are still in flight.
    sqlx::query(
        "UPDATE chime_runs SET state = (ARRAY['pending', 'queued', 'running', 'retrying'])[id % 4 + 1],
                finished_at = NULL
         WHERE id > (SELECT max(id) - 400 FROM chime_runs)",
    )
    .execute(store.pool())
    .await?;
    sqlx::query(
        "INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at, finished_at,
                                     duration_ms, error)
         SELECT id, 1, worker_id, CASE WHEN state IN ('failed', 'dead') THEN 'failed'
                                       ELSE 'succeeded' END,
                started_at, finished_at, 995, error
         FROM chime_runs
         WHERE id > (SELECT max(id) - 100000 FROM chime_runs) AND attempt = 1
           AND finished_at IS NOT NULL",
    )
    .execute(store.pool())
    .await?;
    sqlx::query(
        "INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
         SELECT run_id, 1, started_at + n * interval '100 ms', 'info', 'step ' || n
         FROM chime_attempts, generate_series(1, 3) n",
    )
    .execute(store.pool())
    .await?;
    sqlx::query("VACUUM ANALYZE chime_runs")
        .execute(store.pool())
        .await?;
    sqlx::query("ANALYZE chime_attempts")
        .execute(store.pool())
        .await?;
    sqlx::query("ANALYZE chime_run_logs")
        .execute(store.pool())
        .await?;
    eprintln!("loaded in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

struct Measured {
    name: &'static str,
    p50: f64,
    p95: f64,
    p99: f64,
    max: f64,
    rows: usize,
}

/// Times `samples` executions of `query` (in milliseconds); `rows` from the last one.
async fn time<F, Fut>(name: &'static str, samples: usize, mut query: F) -> anyhow::Result<Measured>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    // One untimed execution warms the cache the way a live system's would be.
    query(usize::MAX).await?;
    let mut times = Vec::with_capacity(samples);
    let mut rows = 0;
    for i in 0..samples {
        let start = Instant::now();
        rows = query(i).await?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    eprintln!("  {name}: p95 {:.2} ms", percentile(&times, 95.0));
    Ok(Measured {
        name,
        p50: percentile(&times, 50.0),
        p95: percentile(&times, 95.0),
        p99: percentile(&times, 99.0),
        max: *times.last().unwrap_or(&f64::NAN),
        rows,
    })
}

async fn measure(store: &Store, args: &Args) -> anyhow::Result<Vec<Measured>> {
    let ops = Operations::new(store.clone(), None);
    let caller = Caller::cli();
    let max_id: i64 = sqlx::query_scalar("SELECT max(id) FROM chime_runs")
        .fetch_one(store.pool())
        .await?;
    let min_id: i64 = sqlx::query_scalar("SELECT min(id) FROM chime_runs")
        .fetch_one(store.pool())
        .await?;
    let jobs = args.jobs;
    let n = args.samples;
    let page = |query: RunQuery| {
        let ops = ops.clone();
        let caller = caller.clone();
        async move {
            let page = ops
                .runs(&caller, query)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok::<usize, anyhow::Error>(page.runs.len())
        }
    };
    // Spread samples over jobs and ids deterministically (a multiplicative hash of the sample
    // number), so runs are comparable.
    let spread = |i: usize, range: i64| (i.wrapping_mul(2_654_435_761) as i64).rem_euclid(range);
    let random_job = |i: usize| format!("job-{}", spread(i, jobs));
    let random_id = |i: usize| min_id + spread(i, max_id - min_id + 1);
    let q = |job: Option<String>, state: Option<&str>, group: Option<String>, before| RunQuery {
        job,
        state: state.map(str::to_owned),
        group,
        before,
        limit: 50,
        include_tasks: false,
        backfill: None,
    };
    let mut results = Vec::new();
    results.push(
        time("runs page: newest 50", n, |_| {
            page(q(None, None, None, None))
        })
        .await?,
    );
    results.push(
        time("runs page: job=J", n, |i| {
            page(q(Some(random_job(i)), None, None, None))
        })
        .await?,
    );
    results.push(
        time("runs page: group=G", n, |i| {
            page(q(None, None, Some(format!("group-{}", i % 20)), None))
        })
        .await?,
    );
    for (name, state) in [
        ("runs page: state=failed (1 %)", "failed"),
        ("runs page: state=dead (0.1 %)", "dead"),
        ("runs page: state=running (newest only)", "running"),
    ] {
        results.push(time(name, n, |_| page(q(None, Some(state), None, None))).await?);
    }
    results.push(
        time("runs page: job=J state=failed", n, |i| {
            page(q(Some(random_job(i)), Some("failed"), None, None))
        })
        .await?,
    );
    results.push(
        time("runs page: job=J state=dead", n, |i| {
            page(q(Some(random_job(i)), Some("dead"), None, None))
        })
        .await?,
    );
    results.push(
        time("runs page: deep (before=random id)", n, |i| {
            page(q(None, None, None, Some(random_id(i))))
        })
        .await?,
    );
    results.push(
        time("runs page: job=J deep (before=random)", n, |i| {
            page(q(Some(random_job(i)), None, None, Some(random_id(i))))
        })
        .await?,
    );
    results.push(
        time("run detail (attempts, log lines)", n, |i| {
            let ops = ops.clone();
            let caller = caller.clone();
            let id = (max_id - spread(i, 100_000)).max(min_id);
            async move {
                let run = ops
                    .run(&caller, id)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(1 + run.attempts.len() + run.logs.len())
            }
        })
        .await?,
    );
    results.push(
        time("overview: runs of the last hour by state", n, |_| {
            let ops = ops.clone();
            let caller = caller.clone();
            async move {
                let overview = ops
                    .overview(&caller, Duration::from_secs(3600))
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(overview.runs_by_state.len())
            }
        })
        .await?,
    );
    results.push(
        time("jobs' unfinished runs (metrics)", n, |_| {
            let store = store.clone();
            async move { Ok(store.active_run_counts().await?.len()) }
        })
        .await?,
    );
    results.push(
        time("new runs after cursor (metrics)", n, |_| {
            let store = store.clone();
            async move {
                Ok(store
                    .runs_after(max_id - 5000, 5000, Duration::from_secs(600))
                    .await?
                    .len())
            }
        })
        .await?,
    );
    let term = store
        .acquire_lease("runs-bench", Duration::from_secs(3600))
        .await?
        .ok_or_else(|| anyhow::anyhow!("the bench database's lease is taken"))?;
    let fence = Fence {
        holder: "runs-bench".into(),
        term,
    };
    // Retention: batches of 1000 at the old end (50 batches = 50,000 runs deleted).
    results.push(
        time("retention batch (1000 runs)", n.min(50), |_| {
            let store = store.clone();
            let fence = fence.clone();
            async move {
                let deleted = store
                    .prune_runs(&fence, None, &[], Duration::from_secs(30 * 24 * 3600), 1000)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("fence lost"))?;
                Ok(usize::try_from(deleted).unwrap_or(0))
            }
        })
        .await?,
    );
    // A job with its own retention: its (job_name, id) index below the cutoff's id.
    results.push(
        time("retention batch, one job (500 runs)", n.min(8), |i| {
            let store = store.clone();
            let fence = fence.clone();
            let job = random_job(i);
            async move {
                let deleted = store
                    .prune_runs(
                        &fence,
                        Some(&job),
                        &[],
                        Duration::from_secs(7 * 24 * 3600),
                        500,
                    )
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("fence lost"))?;
                Ok(usize::try_from(deleted).unwrap_or(0))
            }
        })
        .await?,
    );
    Ok(results)
}
