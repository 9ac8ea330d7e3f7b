//! Reading dead letters never changes the broker: a viewer's read of an unknown group creates
//! no queue or exchange, reads leave every parked message's delivery count and the queue's
//! depth as they were, pages are capped, a message drained twice is listed once, and a drain
//! that may not store acknowledges nothing.

use std::time::Duration;

use chime_e2e::{AMQP_URL, init_tracing, passive_declare, unique, wait_for};
use chime_protocol::Topology;
use chime_protocol::wire::{HEADER_ATTEMPT, HEADER_DEAD_REASON};
use chime_scheduler::auth::Caller;
use chime_scheduler::ops::{Broker, Operations};
use chime_scheduler::store::{Fence, Store};
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ExchangeKind};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::common::{ServingInstance, TopologyGuard, broker};
use crate::ops::dead_run;

/// A passive declare of `queue` (which creates nothing): its figures, or `None` if it does not
/// exist.
async fn declared(connection: &Connection, queue: &str) -> Option<lapin::Queue> {
    let channel = connection.create_channel().await.expect("channel");
    match passive_declare(&channel, queue).await {
        Ok(queue) => {
            let _ = channel.close(200, "done".into()).await;
            Some(queue)
        }
        Err(e) => {
            assert!(e.to_string().contains("NOT_FOUND"), "{e}");
            None
        }
    }
}

/// Whether a queue exists, by a passive declare (which creates nothing).
async fn queue_exists(connection: &Connection, queue: &str) -> bool {
    declared(connection, queue).await.is_some()
}

/// Whether an exchange exists, by a passive declare.
async fn exchange_exists(connection: &Connection, exchange: &str) -> bool {
    let channel = connection.create_channel().await.expect("channel");
    let declared = channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(()) => {
            let _ = channel.close(200, "done".into()).await;
            true
        }
        Err(e) => {
            assert!(e.to_string().contains("NOT_FOUND"), "{e}");
            false
        }
    }
}

/// Ready messages of an existing queue.
pub(crate) async fn depth(connection: &Connection, queue: &str) -> u32 {
    declared(connection, queue)
        .await
        .expect("the queue exists")
        .message_count()
}

/// Publishes a message with a fixed body to `group`'s parking lot, as a worker parks one;
/// `redelivered` adds the header the broker adds on a redelivery.
async fn park_fixed(
    connection: &Connection,
    prefix: &str,
    group: &str,
    run_id: i64,
    redelivered: bool,
) {
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let topology = Topology::new(prefix, group);
    let mut headers = FieldTable::default();
    headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(2));
    headers.insert(
        HEADER_DEAD_REASON.into(),
        AMQPValue::LongString("attempts exhausted".into()),
    );
    if redelivered {
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(1));
    }
    let body = json!({"v": 1, "run_id": run_id, "job": "fixed", "group": group, "attempt": 2,
                      "scheduled_at": "2026-12-01T00:00:00Z", "params": {}});
    crate::ops::publish_parked(
        &channel,
        &topology,
        run_id,
        &body.to_string().into_bytes(),
        headers,
    )
    .await;
    let _ = channel.close(200, "done".into()).await;
}

/// The dead-letter list of `group` as run ids.
async fn listed(ops: &Operations, group: &str) -> Vec<Option<i64>> {
    ops.dead_letters(&Caller::cli(), Some(group.into()), None, 1000)
        .await
        .expect("list")
        .dead_letters
        .iter()
        .map(|d| d.run_id)
        .collect()
}

/// A viewer asking for the dead letters of a group nobody declared gets an empty list (and a
/// 404 for one message), and the broker has no new queue or exchange afterwards; a page never
/// holds more than 1,000 dead letters, however many are asked for.
#[sqlx::test(migrations = "../migrations")]
async fn a_viewer_reading_an_unknown_group_creates_nothing_and_pages_are_capped(pool: PgPool) {
    init_tracing();
    let prefix = unique("dlread");
    let group = "dlread";
    let topology = TopologyGuard::new(AMQP_URL, &prefix, &[group, "nonexistent"]);
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let http = reqwest::Client::new();
    let get = |path: String| {
        let (http, base, viewer) = (&http, &instance.base, &instance.viewer);
        async move {
            let response = http
                .get(format!("{base}{path}"))
                .bearer_auth(viewer)
                .send()
                .await
                .expect("GET");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("JSON"))
        }
    };
    let connection = broker().await;
    let unknown = Topology::new(&prefix, "nonexistent");
    assert!(!queue_exists(&connection, &unknown.parking_queue()).await);
    assert!(!exchange_exists(&connection, &unknown.exchange()).await);

    let (status, body) = get("/api/dead-letters?group=nonexistent".into()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"dead_letters": [], "next_after": null}));
    let run = dead_run(&pool, "ghost", "nonexistent", 1, "x").await;
    let (status, body) = get(format!("/api/dead-letters/{run}")).await;
    assert_eq!(status, 404, "{body}");

    assert!(
        !queue_exists(&connection, &unknown.parking_queue()).await,
        "a read declared the parking lot"
    );
    assert!(!queue_exists(&connection, &unknown.work_queue()).await);
    assert!(
        !exchange_exists(&connection, &unknown.exchange()).await,
        "a read declared the exchange"
    );

    // 1,001 dead letters: a page holds at most 1,000, asked for through the API or directly.
    sqlx::query(
        "INSERT INTO chime_dead_letters (group_name, run_id, body, fingerprint)
         SELECT $1, i, '\\x7b7d', decode(md5(i::text), 'hex') FROM generate_series(1, 1001) i",
    )
    .bind(group)
    .execute(&pool)
    .await
    .expect("dead letters");
    let (status, body) = get("/api/dead-letters?limit=1000000".into()).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["problems"][0]["field"], "limit", "{body}");
    let (status, first) = get("/api/dead-letters?limit=1000".into()).await;
    assert_eq!(status, 200);
    assert_eq!(first["dead_letters"].as_array().expect("page").len(), 1000);
    let next = first["next_after"].as_i64().expect("a next page");
    let (_, rest) = get(format!("/api/dead-letters?limit=1000&after={next}")).await;
    assert_eq!(rest["dead_letters"].as_array().expect("page").len(), 1);
    assert_eq!(rest["dead_letters"][0]["run_id"], 1001);
    assert_eq!(rest["next_after"], Value::Null);
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let page = ops
        .dead_letters(&Caller::cli(), None, None, 1_000_000)
        .await
        .expect("page");
    assert_eq!(page.dead_letters.len(), 1000);
    assert!(page.next_after.is_some());

    let _ = connection.close(200, "done".into()).await;
    instance.stop().await;
    topology.delete().await;
}

/// Listing and showing parked messages five times leaves the parking-lot queue as it was (same
/// depth, every message still at its first delivery) before the leader drains it, and the
/// table as it was after; a message delivered again (the broker's delivery count added, as
/// after a crash between the drain's commit and its ack) is listed once.
#[sqlx::test(migrations = "../migrations")]
async fn reads_leave_every_parked_message_as_it_was_and_a_redelivery_is_listed_once(pool: PgPool) {
    init_tracing();
    let prefix = unique("dlcount");
    let group = "dlcount";
    let topology = TopologyGuard::new(AMQP_URL, &prefix, &[group]);
    let store = Store::from_pool(pool.clone());
    store
        .sync_config_jobs(&[crate::common::job(json!({"name": "fixed", "group": group}))])
        .await
        .expect("jobs");
    let connection = broker().await;
    let channel = connection.create_channel().await.expect("channel");
    let t = Topology::new(&prefix, group);
    t.declare(&channel).await.expect("topology");
    let parking = t.parking_queue();
    let ids = [
        dead_run(&pool, "fixed", group, 2, "a").await,
        dead_run(&pool, "fixed", group, 2, "b").await,
        dead_run(&pool, "fixed", group, 2, "c").await,
    ];
    for id in ids {
        park_fixed(&connection, &prefix, group, id, false).await;
    }
    wait_for(
        Duration::from_secs(10),
        "the three parked messages",
        || async { (depth(&connection, &parking).await == 3).then_some(()) },
    )
    .await;

    // No leader drains: five reads of each kind find nothing yet and touch nothing.
    let ops = Operations::new(store.clone(), Some(Broker::new(AMQP_URL, &prefix)));
    for _ in 0..5 {
        assert_eq!(listed(&ops, group).await, Vec::<Option<i64>>::new());
        assert!(
            ops.dead_letter_message(&Caller::cli(), ids[0])
                .await
                .is_err()
        );
    }
    assert_eq!(depth(&connection, &parking).await, 3, "reads took nothing");

    // One drain pass (the leader's duty, called directly): the table has all three, in order.
    let term = store
        .acquire_lease("drainer", Duration::from_secs(60))
        .await
        .expect("lease")
        .expect("free");
    let fence = Fence {
        holder: "drainer".into(),
        term,
    };
    let stop = CancellationToken::new();
    // The drain's own connection, through the scheduler's AMQP adapter.
    let drainer = chime_scheduler::amqp::Connection::open(AMQP_URL, &Default::default(), "drainer")
        .await
        .expect("connect to RabbitMQ");
    let mut missing = chime_scheduler::parking::MissingQueues::default();
    let drained =
        chime_scheduler::parking::drain(&store, &fence, &drainer, &prefix, &mut missing, &stop)
            .await
            .expect("drain");
    assert_eq!(drained, Some(3));
    assert_eq!(depth(&connection, &parking).await, 0, "drained");
    let expected: Vec<Option<i64>> = ids.iter().copied().map(Some).collect();
    let before = ops
        .dead_letter_message(&Caller::cli(), ids[1])
        .await
        .expect("in full");
    assert_eq!(before.position, 1);
    for id in ids {
        let stored = ops
            .dead_letter_message(&Caller::cli(), id)
            .await
            .expect("in full");
        // RabbitMQ 3.10 sets 0 on a first delivery; each return would have added one.
        let count = stored.message.headers.get("x-delivery-count");
        assert!(
            count.is_none() || count == Some(&json!(0)),
            "run {id}: its first delivery was the drain's: {count:?}"
        );
    }
    for _ in 0..5 {
        assert_eq!(listed(&ops, group).await, expected);
        let again = ops
            .dead_letter_message(&Caller::cli(), ids[1])
            .await
            .expect("in full");
        assert_eq!(again, before, "a read changed the dead letter");
    }

    // The first message again, as the broker redelivers it: listed once.
    park_fixed(&connection, &prefix, group, ids[0], true).await;
    let drained =
        chime_scheduler::parking::drain(&store, &fence, &drainer, &prefix, &mut missing, &stop)
            .await
            .expect("drain");
    assert_eq!(drained, Some(0), "the copy was not stored again");
    assert_eq!(depth(&connection, &parking).await, 0, "the copy was taken");
    assert_eq!(listed(&ops, group).await, expected);

    // A drain that may not store (its fence is stale: another leader took over) acknowledges
    // nothing: the message waits in the queue for the next leader.
    let late = dead_run(&pool, "fixed", group, 2, "d").await;
    park_fixed(&connection, &prefix, group, late, false).await;
    let stale = Fence {
        holder: "drainer".into(),
        term: term - 1,
    };
    let drained =
        chime_scheduler::parking::drain(&store, &stale, &drainer, &prefix, &mut missing, &stop)
            .await
            .expect("drain");
    assert_eq!(drained, None, "the stale leader stopped");
    wait_for(
        Duration::from_secs(10),
        "the message back in the queue",
        || async { (depth(&connection, &parking).await == 1).then_some(()) },
    )
    .await;
    assert_eq!(listed(&ops, group).await, expected);
    let drained =
        chime_scheduler::parking::drain(&store, &fence, &drainer, &prefix, &mut missing, &stop)
            .await
            .expect("drain");
    assert_eq!(drained, Some(1));
    let mut expected = expected;
    expected.push(Some(late));
    assert_eq!(listed(&ops, group).await, expected);

    // A replay after the drain: the run is pending again, its dead letter gone.
    let replayed = ops.replay(&Caller::cli(), ids[0]).await.expect("replay");
    assert_eq!((replayed.attempt, replayed.removed_messages), (3, 1));
    assert_eq!(listed(&ops, group).await, expected[1..]);

    ops.close().await;
    let _ = drainer.close("done").await;
    let _ = connection.close(200, "done".into()).await;
    topology.delete().await;
}
