//! Real restarts of the services, on private instances (never the shared ones): PostgreSQL
//! stopped under a leader and workers mid-run, RabbitMQ stopped under the publisher and the
//! consumers. Nothing is lost, nothing runs twice, fires follow the misfire policy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chime_e2e::services::{PrivatePostgres, PrivateRabbit};
use chime_e2e::{
    AMQP_URL, Scheduler, database_url, init_tracing, service_config, unique, wait_for,
};
use chime_scheduler::config::RescuerSettings;
use chime_scheduler::service::{self, DutySettings};
use chime_scheduler::store::Store;
use chime_worker::{CancellationToken, JobContext, JobError, Worker};
use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;

use crate::common::{Run, TopologyGuard, assert_consecutive, job, leader, runs};

/// A worker whose handlers count their executions per run and take `hold` each.
struct CountingWorker {
    executions: Arc<Mutex<HashMap<i64, usize>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), chime_worker::WorkerError>>,
}

impl CountingWorker {
    fn start(
        db: &str,
        amqp: &str,
        prefix: &str,
        group: &str,
        jobs: &[&str],
        hold: Duration,
    ) -> Self {
        let executions: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
        let mut builder = Worker::builder(group)
            .database_url(db)
            .amqp_url(amqp)
            .prefix(prefix)
            .capacity(16)
            .heartbeat_interval(Duration::from_millis(500));
        for name in jobs {
            let seen = executions.clone();
            builder = builder.handle(*name, move |ctx: JobContext, _: serde_json::Value| {
                let seen = seen.clone();
                async move {
                    *seen
                        .lock()
                        .expect("not poisoned")
                        .entry(ctx.run_id())
                        .or_default() += 1;
                    tokio::time::sleep(hold).await;
                    Ok::<(), JobError>(())
                }
            });
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.build().expect("worker builds").run(stop.clone()));
        CountingWorker {
            executions,
            stop,
            task,
        }
    }

    fn counts(&self) -> HashMap<i64, usize> {
        self.executions.lock().expect("not poisoned").clone()
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("worker task")
            .expect("worker ran cleanly");
    }
}

async fn try_runs(pool: &PgPool, job: &str) -> Option<Vec<Run>> {
    // The pool errors while the server is down; `runs` would panic.
    sqlx::query("SELECT 1").execute(pool).await.ok()?;
    Some(runs(pool, job).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_the_leader_steps_down_resumes_under_a_new_term_and_no_record_is_lost() {
    init_tracing();
    let mut postgres = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .expect("join")
        .expect("private PostgreSQL");
    let db = postgres.url("chime");
    Store::create_database_if_missing(&db)
        .await
        .expect("create database");
    let store = Store::connect(&db, 4).await.expect("connect");
    store.migrate().await.expect("migrate");
    let pool = store.pool().clone();
    let prefix = unique("t");
    let topology = TopologyGuard::new(AMQP_URL, &prefix, &["pgr"]);
    // Handlers take 1.5 s, so some are always running when the database goes away: their
    // outcome writes have to wait for it.
    let worker = CountingWorker::start(
        &db,
        AMQP_URL,
        &prefix,
        "pgr",
        &["all", "skip"],
        Duration::from_millis(1500),
    );
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![
            job(
                json!({"name": "all", "group": "pgr", "every": "1s", "misfire": "fire_all", "misfire_grace": "500ms"}),
            ),
            job(
                json!({"name": "skip", "group": "pgr", "every": "1s", "misfire": "skip", "misfire_grace": "500ms"}),
            ),
        ],
    );
    wait_for(Duration::from_secs(30), "three runs succeeded", || async {
        let done = runs(&pool, "all")
            .await
            .iter()
            .filter(|r| r.state == "succeeded")
            .count();
        (done >= 3).then_some(())
    })
    .await;
    let (_, before) = leader(&pool).await.expect("solo leads");

    let stopped = Utc::now();
    tokio::task::block_in_place(|| {
        postgres.stop("fast")?;
        // Longer than the lease: the leader must give up and take a new term afterwards.
        std::thread::sleep(Duration::from_secs(4));
        postgres.start_server()
    })
    .expect("restart PostgreSQL");
    let restarted = Utc::now();

    let (holder, after) = wait_for(
        Duration::from_secs(30),
        "a leader after the restart",
        || async {
            sqlx::query("SELECT 1").execute(&pool).await.ok()?;
            leader(&pool).await
        },
    )
    .await;
    assert_eq!(holder, "solo");
    assert!(
        after > before,
        "the leader kept term {before} through an outage longer than its lease"
    );
    // Everything due up to a few seconds after the restart settles.
    let horizon = restarted + chrono::Duration::seconds(3);
    for name in ["all", "skip"] {
        wait_for(
            Duration::from_secs(45),
            &format!("{name}: every fire up to the horizon settled"),
            || async {
                let all = try_runs(&pool, name).await?;
                let due: Vec<&Run> = all.iter().filter(|r| r.scheduled_at <= horizon).collect();
                let settled = due
                    .last()
                    .is_some_and(|r| r.scheduled_at > horizon - chrono::Duration::seconds(1))
                    && due
                        .iter()
                        .all(|r| r.state == "succeeded" || r.state == "skipped");
                settled.then_some(())
            },
        )
        .await;
    }
    scheduler.stop().await.expect("graceful stop");
    let counts = worker.counts();
    worker.stop().await;

    for name in ["all", "skip"] {
        let all: Vec<Run> = runs(&pool, name)
            .await
            .into_iter()
            .filter(|r| r.scheduled_at <= horizon)
            .collect();
        assert_consecutive(&all, Duration::from_secs(1));
        for run in all.iter().filter(|r| r.state == "succeeded") {
            assert_eq!(
                counts.get(&run.id),
                Some(&1),
                "run {} executed once",
                run.id
            );
        }
        // Runs that were executing when the database went away finished and were recorded.
        assert!(
            all.iter()
                .filter(|r| r.scheduled_at < stopped
                    && r.scheduled_at > stopped - chrono::Duration::seconds(2))
                .all(|r| r.state == "succeeded"),
            "{name}: {all:?}"
        );
    }
    let all = runs(&pool, "all").await;
    assert!(
        all.iter().any(|r| r.trigger == "catchup"),
        "fire_all caught up the outage"
    );
    assert!(all.iter().all(|r| r.state != "skipped"));
    let skip = runs(&pool, "skip").await;
    let skipped: Vec<&Run> = skip.iter().filter(|r| r.state == "skipped").collect();
    assert!(
        skipped.len() >= 2,
        "skip recorded the fires the outage missed: {skip:?}"
    );
    assert!(skipped.iter().all(|r| {
        r.reason
            .as_deref()
            .is_some_and(|w| w.contains("misfire policy skip"))
    }));
    pool.close().await;
    topology.delete().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn rabbitmq_restart_runs_due_meanwhile_follow_the_misfire_policy_and_consumers_come_back(
    pool: PgPool,
) {
    init_tracing();
    let db = database_url(&pool);
    let mut rabbit = tokio::task::spawn_blocking(PrivateRabbit::start)
        .await
        .expect("join")
        .expect("private RabbitMQ");
    let amqp = rabbit.url();
    let prefix = unique("t");
    let names = ["all", "once", "skip"];
    let worker = CountingWorker::start(
        &db,
        &amqp,
        &prefix,
        "mqr",
        &names,
        Duration::from_millis(300),
    );
    let scheduler = Scheduler::start(
        service_config(&db, &amqp, "solo", &prefix),
        ["fire_all", "fire_once", "skip"]
            .iter()
            .zip(names)
            .map(|(policy, name)| {
                job(
                    json!({"name": name, "group": "mqr", "every": "1s", "misfire": policy,
                           "misfire_grace": "1s"}),
                )
            })
            .collect(),
    );
    wait_for(Duration::from_secs(30), "three runs succeeded", || async {
        let done = runs(&pool, "all")
            .await
            .iter()
            .filter(|r| r.state == "succeeded")
            .count();
        (done >= 3).then_some(())
    })
    .await;

    let (rabbit, down_from, down_until) = tokio::task::spawn_blocking(move || {
        rabbit.stop()?;
        let down_from = Utc::now();
        std::thread::sleep(Duration::from_secs(3));
        let down_until = Utc::now();
        rabbit.start_node()?;
        anyhow::Ok((rabbit, down_from, down_until))
    })
    .await
    .expect("join")
    .expect("restart RabbitMQ");
    let restarted = Utc::now();

    // Runs were still persisted on time while the broker was down, and waited in the outbox.
    let during = |all: &[Run]| -> Vec<i64> {
        all.iter()
            .filter(|r| r.scheduled_at > down_from && r.scheduled_at < down_until)
            .map(|r| r.id)
            .collect()
    };
    let horizon = restarted + chrono::Duration::seconds(3);
    let mut settled = HashMap::new();
    for name in names {
        let due = wait_for(
            Duration::from_secs(60),
            &format!("{name}: every run up to the horizon settled"),
            || async {
                let all = runs(&pool, name).await;
                let due: Vec<Run> = all
                    .into_iter()
                    .filter(|r| r.scheduled_at <= horizon)
                    .collect();
                (due.last()
                    .is_some_and(|r| r.scheduled_at > horizon - chrono::Duration::seconds(1))
                    && due
                        .iter()
                        .all(|r| r.state == "succeeded" || r.state == "skipped"))
                .then_some(due)
            },
        )
        .await;
        settled.insert(name, due);
    }
    scheduler.stop().await.expect("graceful stop");
    let counts = worker.counts();
    worker.stop().await;

    for (name, due) in &settled {
        assert_consecutive(due, Duration::from_secs(1));
        assert!(
            during(due).len() >= 2,
            "{name}: runs persisted during the outage: {due:?}"
        );
        for run in due.iter().filter(|r| r.state == "succeeded") {
            assert_eq!(
                counts.get(&run.id),
                Some(&1),
                "run {} executed once",
                run.id
            );
        }
        for run in due.iter().filter(|r| r.state == "skipped") {
            assert!(
                !counts.contains_key(&run.id),
                "skipped run {} executed",
                run.id
            );
        }
        // The consumers came back: the runs after the restart ran.
        assert!(
            due.iter()
                .filter(|r| r.scheduled_at > restarted)
                .all(|r| r.state == "succeeded"),
            "{name}: {due:?}"
        );
    }
    // fire_all: every run of the outage published once the broker was back.
    let all = &settled["all"];
    for id in during(all) {
        let run = all.iter().find(|r| r.id == id).expect("listed");
        assert_eq!(run.state, "succeeded", "{run:?}");
        assert!(
            run.published_at.expect("published") > down_until,
            "run {} confirmed while the broker was down?",
            run.id
        );
    }
    // skip: the runs the outage held back past the grace were skipped, with the policy's reason.
    let skip = &settled["skip"];
    let skipped: Vec<&Run> = skip.iter().filter(|r| r.state == "skipped").collect();
    assert!(skipped.len() >= 2, "{skip:?}");
    assert!(
        skipped.iter().all(|r| r
            .reason
            .as_deref()
            .is_some_and(|why| why.ends_with("misfire policy skip"))),
        "{skipped:?}"
    );
    // fire_once: of the runs held back past the grace, only the latest ran.
    let once = &settled["once"];
    let coalesced = once
        .iter()
        .filter(|r| {
            r.reason
                .as_deref()
                .is_some_and(|why| why.contains("fire_once runs only the latest missed fire"))
        })
        .count();
    assert!(coalesced >= 1, "{once:?}");
    let ran = during(once)
        .into_iter()
        .filter(|id| once.iter().any(|r| r.id == *id && r.state == "succeeded"))
        .count();
    assert!(
        ran <= 1,
        "fire_once ran {ran} of the outage's fires: {once:?}"
    );
    drop(rabbit);
}

/// Regression: after a database outage longer than `rescue_after`, the new term's first rescuer
/// pass took the workers' silence (no heartbeat could be written) for lost workers and
/// republished every running run, which then executed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_outage_longer_than_rescue_after_does_not_make_live_workers_lost() {
    init_tracing();
    let mut postgres = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .expect("join")
        .expect("private PostgreSQL");
    let db = postgres.url("chime");
    Store::create_database_if_missing(&db)
        .await
        .expect("create database");
    let store = Store::connect(&db, 4).await.expect("connect");
    store.migrate().await.expect("migrate");
    let pool = store.pool().clone();
    let prefix = unique("t");
    let topology = TopologyGuard::new(AMQP_URL, &prefix, &["silent"]);
    // Every run is still running when the database goes away, and long after it is back.
    let worker = CountingWorker::start(
        &db,
        AMQP_URL,
        &prefix,
        "silent",
        &["long"],
        Duration::from_secs(10),
    );
    let duties = DutySettings {
        rescuer: RescuerSettings {
            interval: Duration::from_millis(200),
            rescue_after: Duration::from_secs(2),
            ..RescuerSettings::default()
        },
        ..DutySettings::default()
    };
    let jobs = vec![job(
        json!({"name": "long", "group": "silent", "every": "1s"}),
    )];
    let loader: service::JobLoader = Arc::new(move || Ok(jobs.clone()));
    let (_reload, reload_rx) = tokio::sync::mpsc::channel(1);
    let stop = CancellationToken::new();
    let scheduler = tokio::spawn(service::run_with(
        service_config(&db, AMQP_URL, "solo", &prefix),
        duties,
        loader,
        reload_rx,
        stop.clone(),
    ));
    wait_for(Duration::from_secs(30), "three runs running", || async {
        let running = runs(&pool, "long")
            .await
            .iter()
            .filter(|r| r.state == "running")
            .count();
        (running >= 3).then_some(())
    })
    .await;
    let stopped = Utc::now();
    tokio::task::block_in_place(|| {
        postgres.stop("fast")?;
        // Three times `rescue_after`: every heartbeat is stale when the database returns.
        std::thread::sleep(Duration::from_secs(6));
        postgres.start_server()
    })
    .expect("restart PostgreSQL");

    let before: Vec<i64> = wait_for(
        Duration::from_secs(60),
        "every run started before the outage to finish",
        || async {
            let all = try_runs(&pool, "long").await?;
            let before: Vec<&Run> = all.iter().filter(|r| r.scheduled_at < stopped).collect();
            before
                .iter()
                .all(|r| matches!(r.state.as_str(), "succeeded" | "failed" | "dead"))
                .then(|| before.iter().map(|r| r.id).collect())
        },
    )
    .await;
    stop.cancel();
    scheduler
        .await
        .expect("scheduler task")
        .expect("scheduler ran cleanly");
    let counts = worker.counts();
    worker.stop().await;

    let lost: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_attempts WHERE state = 'lost'")
        .fetch_one(&pool)
        .await
        .expect("count lost attempts");
    assert_eq!(lost, 0, "live workers' attempts were recorded lost");
    for id in before {
        assert_eq!(counts.get(&id), Some(&1), "run {id} executed once");
        assert_eq!(
            runs_state(&pool, id).await,
            "succeeded",
            "run {id} finished where it ran"
        );
    }
    pool.close().await;
    topology.delete().await;
}

async fn runs_state(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("run state")
}
