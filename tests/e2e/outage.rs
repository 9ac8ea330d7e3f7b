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

/// The broker's names (client and server address) of the open connections whose client gave
/// `name` as its connection name.
async fn connections_named(name: &str) -> Vec<String> {
    crate::common::rabbitmqctl(&["list_connections", "name", "client_properties", "--quiet"])
        .await
        .lines()
        .filter(|line| line.contains(&format!("\"{name}\"")))
        .filter_map(|line| line.split('\t').next().map(str::to_owned))
        .collect()
}

/// A trigger the broker nacks (a policy makes the work queue full, with `reject-publish`) is an
/// error that leaves the run to be published again, and it retires the connection it came on:
/// the broker ends with one connection of the publisher, a new one, which publishes once the
/// queue takes messages again.
#[sqlx::test(migrations = "../migrations")]
async fn a_nacked_trigger_retires_its_connection_and_the_next_publish_goes_out_on_a_new_one(
    pool: PgPool,
) {
    use chime_scheduler::publish::{PublishError, Publisher};
    use chime_scheduler::store::OutboxRun;

    let t = Setup::new(&pool).with_groups(&["nacked"]);
    let instance = chime_e2e::unique("nack-test");
    let publisher = Publisher::new(AMQP_URL, &instance, &t.prefix);
    publisher.declare("nacked").await.expect("declare");
    let connection_name = format!("chime-scheduler-{instance}");
    let first = connections_named(&connection_name).await;
    assert_eq!(first.len(), 1, "{first:?}");

    let policy = format!("{}-full", t.prefix);
    let work = chime_protocol::Topology::new(&t.prefix, "nacked").work_queue();
    let pattern = format!("^{}$", work.replace('.', "\\."));
    let _policy_guard = PolicyGuard(policy.clone());
    crate::common::rabbitmqctl(&[
        "set_policy",
        "--apply-to",
        "queues",
        &policy,
        &pattern,
        r#"{"max-length": 0, "overflow": "reject-publish"}"#,
    ])
    .await;
    let run = OutboxRun {
        id: 1,
        job: "j".to_owned(),
        group: "nacked".to_owned(),
        scheduled_at: chrono::Utc::now(),
        attempt: 1,
        params: json!({}),
        timeout: None,
        retry: None,
        concurrency: Default::default(),
        task: None,
        fan_out: false,
        workflow: false,
    };
    // The policy reaches the queue's leader a moment after rabbitmqctl returns.
    wait_for(Duration::from_secs(15), "a nack", || async {
        matches!(publisher.publish(&run, 1).await, Err(PublishError::Nacked)).then_some(())
    })
    .await;
    crate::common::rabbitmqctl(&["clear_policy", &policy]).await;
    // The failed publishes left the run to be tried again; it goes out on a new connection.
    wait_for(Duration::from_secs(15), "a confirmed publish", || async {
        publisher.publish(&run, 1).await.ok()
    })
    .await;
    wait_for(
        Duration::from_secs(15),
        "the nacked connection closed and another open",
        || async {
            let now = connections_named(&connection_name).await;
            (now.len() == 1 && now != first).then_some(())
        },
    )
    .await;
    publisher.close().await;
    t.finish().await;
}

/// Clears a broker policy when dropped, so that a failing test leaves none behind.
struct PolicyGuard(String);

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["clear_policy", &self.0])
            .output();
    }
}
