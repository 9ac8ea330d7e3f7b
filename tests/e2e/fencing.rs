//! A leader frozen past its lease (SIGSTOP, then SIGCONT after another instance took over)
//! writes and publishes nothing under its old term: `chime scheduler` processes, with the test
//! reading every trigger's term header straight off the work queue.

use std::time::Duration;

use chime_e2e::process::{Process, SchedulerEnv, sibling_binary};
use chime_e2e::{AMQP_URL, Events, Setup, passive_declare, wait_for};
use chime_protocol::Topology;
use chime_protocol::wire::{HEADER_TERM, Trigger};
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use lapin::options::BasicConsumeOptions;
use lapin::types::{AMQPValue, FieldTable};
use nix::sys::signal::Signal;
use sqlx::PgPool;

use crate::common::{assert_consecutive, leader, runs};

/// A trigger as it arrived on the work queue.
#[derive(Debug, Clone)]
struct Arrival {
    run_id: i64,
    term: i64,
    at: DateTime<Utc>,
}

/// Consumes the group's work queue with automatic acks and records every trigger's term.
async fn record_triggers(prefix: &str, group: &str) -> (Events<Arrival>, lapin::Connection) {
    let connection = lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = connection.create_channel().await.expect("channel");
    let topology = Topology::new(prefix, group);
    topology.declare(&channel).await.expect("declare topology");
    let queue = topology.work_queue();
    passive_declare(&channel, &queue)
        .await
        .expect("work queue exists");
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "fencing-test".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let arrivals = Events::new();
    let seen = arrivals.clone();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let at = Utc::now();
            let term = delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(HEADER_TERM).cloned())
                .and_then(|v| match v {
                    AMQPValue::LongLongInt(t) => Some(t),
                    _ => None,
                })
                .expect("every trigger carries its term");
            let trigger = Trigger::from_body(&delivery.data).expect("a trigger");
            seen.record(Arrival {
                run_id: trigger.run_id,
                term,
                at,
            });
        }
    });
    (arrivals, connection)
}

fn log_contains(process: &Process, text: &str) -> bool {
    std::fs::read_to_string(process.log()).is_ok_and(|log| log.contains(text))
}

#[sqlx::test(migrations = "../migrations")]
async fn a_leader_frozen_past_its_lease_writes_and_publishes_nothing_under_its_old_term(
    pool: PgPool,
) {
    let t = Setup::new(&pool).with_groups(&["fence"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let dir = tempfile::tempdir().expect("temporary directory");
    let jobs = dir.path().join("jobs.toml");
    let mut text = String::new();
    for i in 0..10 {
        text.push_str(&format!(
            "[[jobs]]\nname = \"tick-{i}\"\ngroup = \"fence\"\nevery = \"1s\"\nmisfire = \"fire_all\"\n\n"
        ));
    }
    std::fs::write(&jobs, text).expect("write jobs");
    let (arrivals, connection) = record_triggers(&prefix, "fence").await;
    let chime = sibling_binary("chime").expect("chime is built");
    let amqp_urls = [AMQP_URL.to_owned()];
    let env = SchedulerEnv {
        database_url: &db,
        amqp_urls: &amqp_urls,
        amqp_ca_file: None,
        prefix: &prefix,
        jobs: &jobs,
        json_logs: false,
    };
    let mut a = Process::scheduler(&chime, "a", &env, dir.path()).expect("start a");
    let (_, a_term) = wait_for(Duration::from_secs(30), "a to lead", || async {
        leader(&pool).await.filter(|(h, _)| h == "a")
    })
    .await;
    let mut b = Process::scheduler(&chime, "b", &env, dir.path()).expect("start b");
    wait_for(
        Duration::from_secs(10),
        "triggers under a's term",
        || async {
            let n = arrivals.with(|all| all.iter().filter(|t| t.term == a_term).count());
            (n >= 20).then_some(())
        },
    )
    .await;

    a.signal(Signal::SIGSTOP).expect("freeze a");
    let (_, b_term) = wait_for(Duration::from_secs(15), "b to take over", || async {
        leader(&pool).await.filter(|(h, _)| h == "b")
    })
    .await;
    let took_over = Utc::now();
    assert!(b_term > a_term);
    wait_for(
        Duration::from_secs(10),
        "triggers under b's term",
        || async {
            let n = arrivals.with(|all| all.iter().filter(|t| t.term == b_term).count());
            (n >= 20).then_some(())
        },
    )
    .await;

    let thawed = Utc::now();
    a.signal(Signal::SIGCONT).expect("thaw a");
    wait_for(
        Duration::from_secs(10),
        "a to notice it no longer leads",
        || async {
            (log_contains(&a, "lost the lease to another instance")
                || log_contains(&a, "stopping leader duties"))
            .then_some(())
        },
    )
    .await;
    // Give a's thawed planner and dispatcher every chance: three more seconds of b's fires.
    let after_thaw = arrivals.len() + 30;
    wait_for(
        Duration::from_secs(10),
        "more triggers after the thaw",
        || async { (arrivals.len() >= after_thaw).then_some(()) },
    )
    .await;
    a.ensure_running().expect("a survived the freeze");
    assert_eq!(
        leader(&pool).await.map(|(h, _)| h).as_deref(),
        Some("b"),
        "the thawed instance did not take the lease back"
    );

    let stale: Vec<Arrival> = arrivals
        .all()
        .into_iter()
        .filter(|t| t.term == a_term && t.at > thawed)
        .collect();
    assert!(
        stale.is_empty(),
        "published under the old term after the thaw: {stale:?}"
    );
    let stale_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE term = $1 AND created_at > $2")
            .bind(a_term)
            .bind(took_over)
            .fetch_one(&pool)
            .await
            .expect("count runs");
    assert_eq!(
        stale_rows, 0,
        "runs written under the old term after the takeover"
    );

    a.stop(Duration::from_secs(10)).await.expect("stop a");
    b.stop(Duration::from_secs(10)).await.expect("stop b");
    let _ = connection.close(200, "test done".into()).await;
    // Each instant once, nothing skipped: b caught up what fell due during the freeze.
    for i in 0..10 {
        let all = runs(&pool, &format!("tick-{i}")).await;
        assert_consecutive(&all, Duration::from_secs(1));
        assert!(all.iter().all(|r| r.state != "skipped"), "{all:?}");
        assert!(all.iter().any(|r| r.term == Some(b_term)));
        // Every run the broker confirmed reached the queue.
        let arrived = arrivals.all();
        for run in all.iter().filter(|r| r.published_at.is_some()) {
            assert!(
                arrived.iter().any(|t| t.run_id == run.id),
                "run {} confirmed but never delivered",
                run.id
            );
        }
    }
    t.finish().await;
}
