//! Backfills made by a running leader and executed by a real worker: two overlapping
//! backfills started through the CLI make each fire of their ranges one run, executed once;
//! a cancelled backfill cancels its waiting runs and makes no more.

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::Duration;

use chime_e2e::{AMQP_URL, Scheduler, Setup, service_config, wait_for};
use chime_scheduler::cli::{BackfillsCommand, Command, JobsCommand, Output, control};
use chime_scheduler::store::{BackfillRecord, Store};
use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use serde_json::json;
use sqlx::PgPool;

use crate::common::{RecordingWorker, job, runs};

async fn run_cli(store: &Store, command: Command) -> (ExitCode, String) {
    let mut out = Vec::new();
    let code = control(store, Output::Json, command, &mut out)
        .await
        .expect("command runs");
    (code, String::from_utf8(out).expect("utf-8 output"))
}

/// `chime jobs backfill NAME --from FROM --to TO --parallel N`; returns the backfill's id.
async fn backfill(
    store: &Store,
    name: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    parallel: u32,
) -> i64 {
    let (code, out) = run_cli(
        store,
        Command::Jobs(JobsCommand::Backfill {
            name: name.into(),
            from: from.to_rfc3339(),
            to: to.to_rfc3339(),
            parallel,
            serial: false,
            rate: 1000,
            dry_run: false,
        }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let started: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    started["id"].as_i64().expect("a backfill id")
}

async fn shown(store: &Store, id: i64) -> BackfillRecord {
    store.backfill(id).await.expect("read").expect("exists")
}

#[sqlx::test(migrations = "../migrations")]
async fn overlapping_backfills_run_each_fire_once_and_a_cancel_stops_one(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["fill", "idle"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let store = Store::from_pool(pool.clone());
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, "fill", &["minutely"]);
    let scheduler = Scheduler::start(
        service_config(&db, AMQP_URL, "solo", &prefix),
        vec![
            job(json!({"name": "minutely", "group": "fill", "schedule": "0 * * * * *"})),
            // No worker consumes `idle`: its runs wait, queued.
            job(json!({"name": "waiting", "group": "idle", "schedule": "0 * * * * *"})),
        ],
    );
    wait_for(Duration::from_secs(30), "the jobs loaded", || async {
        let loaded = store.job("waiting").await.expect("read").is_some()
            && store.job("minutely").await.expect("read").is_some();
        loaded.then_some(())
    })
    .await;
    let minute = Utc::now()
        .duration_trunc(TimeDelta::minutes(1))
        .expect("truncated");
    let ago = |m: i64| minute - TimeDelta::minutes(m);

    // 20..10 and 15..5 minutes ago: 15 fires, 5 of them in both ranges. The second starts while
    // the first is under way, one run at a time.
    let first = backfill(&store, "minutely", ago(20), ago(10), 3).await;
    let second = backfill(&store, "minutely", ago(15), ago(5), 1).await;
    let (a, b) = wait_for(Duration::from_secs(60), "both backfills done", || async {
        let (a, b) = (shown(&store, first).await, shown(&store, second).await);
        (a.state == "done" && b.state == "done").then_some((a, b))
    })
    .await;
    assert_eq!((a.fires_total, b.fires_total), (10, 10));
    assert_eq!(a.fires_made + b.fires_made, 15, "{a:?} {b:?}");
    assert_eq!(a.fires_existing + b.fires_existing, 5, "{a:?} {b:?}");
    let filled: Vec<_> = runs(&pool, "minutely")
        .await
        .into_iter()
        .filter(|r| r.scheduled_at < ago(5))
        .collect();
    let instants: Vec<_> = filled.iter().map(|r| r.scheduled_at).collect();
    assert_eq!(
        instants,
        (6..=20).rev().map(ago).collect::<Vec<_>>(),
        "each fire of the ranges one run, in order"
    );
    assert!(
        filled
            .iter()
            .all(|r| r.trigger == "backfill" && r.state == "succeeded"),
        "{filled:?}"
    );
    let counts = worker.counts();
    for run in &filled {
        assert_eq!(counts.get(&run.id), Some(&1), "run {} ran once", run.id);
    }
    let ids: HashSet<i64> = filled.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 15);

    // A backfill of a job nobody consumes: two runs wait; the cancel cancels them, and the
    // backfill makes no more.
    let stuck = backfill(&store, "waiting", ago(30), ago(10), 2).await;
    wait_for(Duration::from_secs(30), "two runs made", || async {
        (shown(&store, stuck).await.fires_made == 2).then_some(())
    })
    .await;
    let (code, out) = run_cli(
        &store,
        Command::Backfills(BackfillsCommand::Cancel { id: stuck }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let cancelled: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(cancelled["runs_cancelled"], 2, "{cancelled}");
    // Stopped, the leader's duty has made its last pass: what it made is all there is.
    scheduler.stop().await.expect("graceful stop");
    worker.stop().await;
    let record = shown(&store, stuck).await;
    assert_eq!((record.state.as_str(), record.fires_made), ("cancelled", 2));
    let waiting = runs(&pool, "waiting").await;
    let backfilled: Vec<_> = waiting.iter().filter(|r| r.trigger == "backfill").collect();
    assert_eq!(backfilled.len(), 2, "{waiting:?}");
    assert!(
        backfilled.iter().all(|r| r.state == "cancelled"),
        "{waiting:?}"
    );
    t.finish().await;
}
