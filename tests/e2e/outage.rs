//! The broker becomes unreachable for some seconds: runs keep being persisted, and are published
//! once it is back; none lost, none executed twice.

use std::time::Duration;

use chime_e2e::{AMQP_URL, Proxy, Scheduler, Setup, service_config, wait_for};
use serde_json::json;
use sqlx::PgPool;

use crate::common::{RecordingWorker, assert_consecutive, job, runs};

#[sqlx::test(migrations = "../migrations")]
async fn runs_persisted_while_the_broker_is_unreachable_are_published_after_it_returns(
    pool: PgPool,
) {
    let t = Setup::new(&pool).with_groups(&["outage"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    // Only the scheduler goes through the proxy; the worker stays connected.
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, "outage", &["pulse"]);
    let scheduler = Scheduler::start(
        service_config(&db, &proxy.amqp_url(), "solo", &prefix),
        vec![job(
            // Every fire runs, however late the outage makes it.
            json!({"name": "pulse", "group": "outage", "every": "1s", "misfire": "fire_all"}),
        )],
    );
    wait_for(Duration::from_secs(15), "two published runs", || async {
        (runs(&pool, "pulse")
            .await
            .iter()
            .filter(|r| r.published_at.is_some())
            .count()
            >= 2)
            .then_some(())
    })
    .await;

    proxy.cut();
    // While the broker is away, fires are still persisted, and wait in the outbox.
    let stuck = wait_for(
        Duration::from_secs(10),
        "three due runs persisted but unpublished",
        || async {
            let overdue = chrono::Utc::now() - chrono::Duration::milliseconds(500);
            let pending: Vec<_> = runs(&pool, "pulse")
                .await
                .into_iter()
                .filter(|r| r.state == "pending" && r.scheduled_at < overdue)
                .collect();
            (pending.len() >= 3).then_some(pending)
        },
    )
    .await;
    proxy.restore();

    let ids: Vec<i64> = stuck.iter().map(|r| r.id).collect();
    wait_for(
        Duration::from_secs(20),
        "the runs from the outage to be executed",
        || async {
            let all = runs(&pool, "pulse").await;
            ids.iter()
                .all(|id| all.iter().any(|r| r.id == *id && r.state == "succeeded"))
                .then_some(())
        },
    )
    .await;
    scheduler.stop().await.expect("graceful stop");
    let stopped = chrono::Utc::now();
    // Runs written ahead of their instant by the stopped leader wait in the outbox for the next,
    // unless their trigger went out (up to the lead before the instant) before the stop: those
    // run at their instant like any other.
    let all = wait_for(
        Duration::from_secs(15),
        "every run due or published before the stop to finish",
        || async {
            let all = runs(&pool, "pulse").await;
            let (due, ahead): (Vec<_>, Vec<_>) = all
                .into_iter()
                .partition(|r| r.scheduled_at <= stopped || r.published_at.is_some());
            (due.iter().all(|r| r.state == "succeeded")
                && ahead.iter().all(|r| r.state == "pending"))
            .then_some(due)
        },
    )
    .await;
    let executions = worker.counts();
    worker.stop().await;

    assert_consecutive(&all, Duration::from_secs(1));
    for run in &all {
        assert_eq!(
            executions.get(&run.id),
            Some(&1),
            "run {} executed exactly once",
            run.id
        );
    }
    for run in &stuck {
        let after = all.iter().find(|r| r.id == run.id).expect("still there");
        let delay = after.published_at.expect("published") - run.scheduled_at;
        assert!(
            delay > chrono::Duration::milliseconds(500),
            "run {} was published during the outage?",
            run.id
        );
    }
    t.finish().await;
}
