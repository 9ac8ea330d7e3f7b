//! Concurrency policies decided cluster-wide by the leader (allow, forbid, queue, replace), and
//! the rescuer of runs whose worker was lost or whose retry never came.

use std::sync::Arc;
use std::time::Duration;

use chime_e2e::{AMQP_URL, Events, Setup, service_config, unique, wait_for};
use chime_scheduler::config::RescuerSettings;
use chime_scheduler::job::JobSpec;
use chime_scheduler::service::{self, DutySettings};
use chime_worker::{CancellationToken, JobContext, JobError, Worker, WorkerBuilder};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgPool, Row as _};
use tokio::sync::mpsc;

use crate::common::{job, runs};

/// A scheduler instance with the given duty settings, on the test's runtime.
pub struct Leader {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _reload: mpsc::Sender<()>,
}

impl Leader {
    /// Starts an instance serving `jobs` under `prefix`.
    pub fn start(db: &str, prefix: &str, jobs: Vec<JobSpec>, duties: DutySettings) -> Leader {
        let config = service_config(db, AMQP_URL, &unique("s"), prefix);
        let loader: service::JobLoader = Arc::new(move || Ok(jobs.clone()));
        let (reload, reload_rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let task = tokio::spawn(service::run_with(
            config,
            duties,
            loader,
            reload_rx,
            stop.clone(),
        ));
        Leader {
            stop,
            task,
            _reload: reload,
        }
    }

    /// Graceful stop.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("scheduler task")
            .expect("scheduler ran cleanly");
    }
}

/// A worker of `group` under `prefix` whose handlers `configure` registers.
pub struct TestWorker {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>,
}

impl TestWorker {
    /// Starts it, with a fast heartbeat.
    pub fn start(
        db: &str,
        prefix: &str,
        group: &str,
        configure: impl FnOnce(WorkerBuilder) -> WorkerBuilder,
    ) -> TestWorker {
        let builder = Worker::builder(group)
            .database_url(db)
            .amqp_url(AMQP_URL)
            .prefix(prefix)
            .capacity(8)
            .heartbeat_interval(Duration::from_millis(200));
        let worker = configure(builder).build().expect("worker builds");
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone()));
        TestWorker { stop, task }
    }

    /// Drains and stops it.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("worker task")
            .expect("worker ran cleanly");
    }
}

/// When each handler invocation ran, as the handler saw it.
#[derive(Debug, Clone)]
pub struct Span {
    pub run_id: i64,
    pub attempt: u32,
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
}

/// Handler invocations, shared with the handlers.
#[derive(Clone, Default)]
pub struct Spans(Events<Span>);

impl Spans {
    pub fn all(&self) -> Vec<Span> {
        self.0.all()
    }

    fn begin(&self, ctx: &JobContext) -> usize {
        self.0.record(Span {
            run_id: ctx.run_id(),
            attempt: ctx.attempt(),
            start: Utc::now(),
            end: None,
        })
    }

    fn end(&self, index: usize) {
        self.0.update(index, |span| span.end = Some(Utc::now()));
    }

    /// Registers `name` as a handler that works for `took` (and stops early, as cancelled, if
    /// its run is cancelled).
    pub fn register(&self, builder: WorkerBuilder, name: &str, took: Duration) -> WorkerBuilder {
        let spans = self.clone();
        builder.handle(name, move |ctx: JobContext, _: serde_json::Value| {
            let spans = spans.clone();
            async move {
                let index = spans.begin(&ctx);
                let result = tokio::select! {
                    () = tokio::time::sleep(took) => Ok(()),
                    () = ctx.cancelled() => Err(JobError::cancel("cancelled while working")),
                };
                spans.end(index);
                result
            }
        })
    }

    /// Pairs of invocations that ran at the same time.
    pub fn overlaps(&self) -> Vec<(Span, Span)> {
        let spans = self.all();
        let mut found = Vec::new();
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                let a_end = a.end.unwrap_or(DateTime::<Utc>::MAX_UTC);
                let b_end = b.end.unwrap_or(DateTime::<Utc>::MAX_UTC);
                if a.start < b_end && b.start < a_end {
                    found.push((a.clone(), b.clone()));
                }
            }
        }
        found
    }
}

fn duties(rescuer: RescuerSettings) -> DutySettings {
    DutySettings {
        rescuer,
        ..DutySettings::default()
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn forbid_records_fires_during_a_slow_run_as_skipped_with_the_reason(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["forbid"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "forbid", |b| {
        // Not 2.5 s: the fire 3 s after a run's start is decided `lookahead` (0.5 s) before it,
        // and a run that ends at that very moment makes the decision a race.
        spans.register(b, "slow", Duration::from_millis(2300))
    });
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(
            json!({"name": "slow", "group": "forbid", "every": "1s", "concurrency": "forbid"}),
        )],
        DutySettings::default(),
    );
    wait_for(
        Duration::from_secs(30),
        "two runs to succeed and two fires to be skipped",
        || async {
            let runs = runs(&pool, "slow").await;
            let ok = runs.iter().filter(|r| r.state == "succeeded").count();
            let skipped = runs.iter().filter(|r| r.state == "skipped").count();
            (ok >= 2 && skipped >= 2).then_some(())
        },
    )
    .await;
    leader.stop().await;
    worker.stop().await;

    assert!(
        spans.overlaps().is_empty(),
        "runs overlapped: {:?}",
        spans.overlaps()
    );
    let rows = sqlx::query(
        "SELECT id, state, reason, created_at, finished_at FROM chime_runs
         WHERE job_name = 'slow' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("runs");
    let mut skipped = 0;
    for row in &rows {
        if row.get::<String, _>("state") != "skipped" {
            continue;
        }
        skipped += 1;
        let id: i64 = row.get("id");
        let reason: String = row.get("reason");
        let blocker: i64 = reason
            .strip_prefix("previous run ")
            .and_then(|rest| rest.strip_suffix(" still active (concurrency forbid)"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("run {id}: unexpected reason {reason:?}"));
        let blocking = rows
            .iter()
            .find(|r| r.get::<i64, _>("id") == blocker)
            .unwrap_or_else(|| panic!("run {id} names run {blocker}, not a run of the job"));
        assert!(blocker < id);
        assert_ne!(blocking.get::<String, _>("state"), "skipped");
        // When the fire was decided, the run it names had not finished. Both timestamps are
        // their transactions' start times: a finish whose transaction began a moment before
        // the insert but committed after the insert's snapshot was rightly not seen, so allow
        // the finishing transaction's commit latency.
        let finished: Option<DateTime<Utc>> = blocking.get("finished_at");
        let created: DateTime<Utc> = row.get("created_at");
        let commit_latency = chrono::Duration::milliseconds(100);
        assert!(
            finished.is_none_or(|f| created <= f + commit_latency),
            "run {id} was skipped at {created} for run {blocker}, which had finished at {finished:?}"
        );
    }
    assert!(skipped >= 2);
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn queue_starts_the_next_run_right_after_the_current_one_ends(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["queue"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "queue", |b| {
        spans.register(b, "serial", Duration::from_millis(1200))
    });
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(
            json!({"name": "serial", "group": "queue", "every": "1s", "concurrency": "queue"}),
        )],
        DutySettings::default(),
    );
    wait_for(Duration::from_secs(30), "four runs to finish", || async {
        let done = spans.all().iter().filter(|s| s.end.is_some()).count();
        (done >= 4).then_some(())
    })
    .await;
    // Fires keep coming faster than runs finish: they wait in the outbox, none is skipped.
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chime_runs WHERE job_name = 'serial' AND state = 'pending'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert!(waiting >= 1, "later fires should wait in the outbox");
    leader.stop().await;
    worker.stop().await;

    assert!(
        spans.overlaps().is_empty(),
        "runs overlapped: {:?}",
        spans.overlaps()
    );
    let mut finished: Vec<Span> = spans
        .all()
        .into_iter()
        .filter(|s| s.end.is_some())
        .collect();
    finished.sort_by_key(|s| s.start);
    assert!(
        finished.windows(2).all(|w| w[0].run_id < w[1].run_id),
        "runs ran out of order: {finished:?}"
    );
    // The next run starts right after the current one ends: the finished run wakes the
    // leader's outbox sweep (NOTIFY), instead of waiting for the next periodic sweep (1 s).
    let mut gaps: Vec<i64> = finished
        .windows(2)
        .map(|w| (w[1].start - w[0].end.expect("finished")).num_milliseconds())
        .collect();
    gaps.sort_unstable();
    assert!(gaps[gaps.len() / 2] < 300, "gaps between runs: {gaps:?} ms");
    assert!(
        gaps.iter().all(|g| *g < 2_000),
        "gaps between runs: {gaps:?} ms"
    );
    assert!(
        runs(&pool, "serial")
            .await
            .iter()
            .all(|r| r.state != "skipped"),
        "queue never skips"
    );
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn replace_cancels_the_running_run_and_starts_the_new_one(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["replace"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "replace", |b| {
        spans.register(b, "latest", Duration::from_secs(60))
    });
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(
            json!({"name": "latest", "group": "replace", "every": "2s", "concurrency": "replace"}),
        )],
        DutySettings::default(),
    );
    // The database side: the first run gets a cancel request naming the run that replaces it.
    let (first, second) = wait_for(
        Duration::from_secs(20),
        "the first run to be replaced",
        || async {
            let row = sqlx::query(
                "SELECT id, cancel_requested_by FROM chime_runs
                 WHERE job_name = 'latest' AND cancel_requested_at IS NOT NULL
                 ORDER BY id LIMIT 1",
            )
            .fetch_optional(&pool)
            .await
            .expect("query")?;
            let by: String = row.get("cancel_requested_by");
            let second: i64 = by
                .strip_prefix("replace policy (run ")?
                .strip_suffix(')')?
                .parse()
                .ok()?;
            Some((row.get::<i64, _>("id"), second))
        },
    )
    .await;
    assert!(second > first);
    // The worker side: the running run is cancelled through the control message, and the new
    // run runs.
    wait_for(
        Duration::from_secs(20),
        "the replaced run to end cancelled and the new one to start",
        || async {
            let state: String = sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
                .bind(first)
                .fetch_one(&pool)
                .await
                .expect("state");
            let started = spans.all().iter().any(|s| s.run_id == second);
            (state == "cancelled" && started).then_some(())
        },
    )
    .await;
    let first_span = spans
        .all()
        .into_iter()
        .find(|s| s.run_id == first)
        .expect("the first run ran");
    assert!(
        first_span.end.is_some(),
        "the first run's handler was cancelled"
    );
    let attempt: String =
        sqlx::query_scalar("SELECT state FROM chime_attempts WHERE run_id = $1 AND attempt = 1")
            .bind(first)
            .fetch_one(&pool)
            .await
            .expect("attempt");
    assert_eq!(attempt, "cancelled");
    leader.stop().await;
    worker.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn allow_lets_runs_overlap(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["allow"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "allow", |b| {
        spans.register(b, "overlapping", Duration::from_millis(2500))
    });
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(
            json!({"name": "overlapping", "group": "allow", "every": "1s", "concurrency": "allow"}),
        )],
        DutySettings::default(),
    );
    wait_for(Duration::from_secs(20), "two runs to overlap", || async {
        (!spans.overlaps().is_empty()).then_some(())
    })
    .await;
    let running: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chime_runs WHERE job_name = 'overlapping' AND state = 'running'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert!(running >= 2, "{running} runs running at once");
    assert!(
        runs(&pool, "overlapping")
            .await
            .iter()
            .all(|r| r.state != "skipped")
    );
    leader.stop().await;
    worker.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn rescuer_republishes_runs_of_a_lost_worker_and_stuck_retries(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["rescue"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    // A worker that died an hour ago, holding a running run, and a run whose retry never came.
    sqlx::query(
        "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs, started_at,
                                    heartbeat_at)
         VALUES ('ghost', 'rescue', 'gone', 1, '{rescued}', now() - interval '2 hours',
                 now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .expect("insert worker");
    let lost: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                 worker_id, published_at, started_at)
         VALUES ('rescued', 'rescue', now() - interval '1 hour', 'manual', 'running', 1, 'ghost',
                 now() - interval '1 hour', now() - interval '1 hour')
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .expect("insert run");
    let stuck: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                 worker_id, published_at, started_at, next_attempt_at, error)
         VALUES ('rescued', 'rescue', now() - interval '10 minutes', 'manual', 'retrying', 1,
                 'ghost', now() - interval '10 minutes', now() - interval '10 minutes',
                 now() - interval '5 minutes', 'first try failed')
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .expect("insert run");
    sqlx::query(
        "INSERT INTO chime_attempts (run_id, attempt, worker_id, state, started_at, finished_at)
         VALUES ($1, 1, 'ghost', 'running', now() - interval '1 hour', NULL),
                ($2, 1, 'ghost', 'failed', now() - interval '10 minutes',
                 now() - interval '10 minutes')",
    )
    .bind(lost)
    .bind(stuck)
    .execute(&pool)
    .await
    .expect("insert attempts");

    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "rescue", |b| {
        spans.register(b, "rescued", Duration::from_millis(10))
    });
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(json!({"name": "rescued", "group": "rescue"}))],
        duties(RescuerSettings {
            interval: Duration::from_millis(200),
            rescue_after: Duration::from_secs(1),
            retry_slack: Duration::from_secs(1),
        }),
    );
    wait_for(
        Duration::from_secs(20),
        "both runs to succeed as attempt 2",
        || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM chime_runs
                 WHERE id = ANY($1) AND state = 'succeeded' AND attempt = 2",
            )
            .bind([lost, stuck])
            .fetch_one(&pool)
            .await
            .expect("count");
            (done == 2).then_some(())
        },
    )
    .await;
    leader.stop().await;
    worker.stop().await;

    let attempts = sqlx::query(
        "SELECT run_id, attempt, worker_id, state, error FROM chime_attempts
         WHERE run_id = ANY($1) ORDER BY run_id, attempt",
    )
    .bind([lost, stuck])
    .fetch_all(&pool)
    .await
    .expect("attempts");
    let rows: Vec<(i64, i32, String, String, Option<String>)> = attempts
        .iter()
        .map(|r| {
            (
                r.get("run_id"),
                r.get("attempt"),
                r.get("worker_id"),
                r.get("state"),
                r.get("error"),
            )
        })
        .collect();
    assert_eq!(rows.len(), 4, "{rows:?}");
    let (_, _, worker_id, state, error) = &rows[0];
    assert_eq!((worker_id.as_str(), state.as_str()), ("ghost", "lost"));
    let error = error.as_deref().expect("lost attempts say why");
    assert!(
        error.starts_with("worker ghost lost (no heartbeat since "),
        "{error}"
    );
    assert_eq!(rows[1].1, 2);
    assert_eq!(rows[1].3, "succeeded");
    assert_ne!(rows[1].2, "ghost");
    assert_eq!((rows[2].1, rows[2].3.as_str()), (1, "failed"));
    assert_eq!((rows[3].1, rows[3].3.as_str()), (2, "succeeded"));
    // Each ran exactly once more, as attempt 2.
    let mut ran: Vec<(i64, u32)> = spans.all().iter().map(|s| (s.run_id, s.attempt)).collect();
    ran.sort_unstable();
    assert_eq!(ran, [(lost, 2), (stuck, 2)]);
    t.finish().await;
}
