//! Operations on failures: `chime runs cancel`, `chime dlq list|replay|purge`, and alert
//! webhooks (generic and Slack bodies, rate limit, a failing webhook).

use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use chime_e2e::{AMQP_URL, Events, Setup, done_if, wait_for};
use chime_protocol::topology::{PARKING_KEY, control_exchange, declare_control};
use chime_protocol::wire::{ControlMessage, HEADER_ATTEMPT, HEADER_DEAD_BY, HEADER_DEAD_REASON};
use chime_protocol::{Topology, Trigger};
use chime_scheduler::cli::{
    Broker, Command, DlqCommand, JobsCommand, Output, RunsCommand, operate,
};
use chime_scheduler::config::{AlertSettings, GroupAlertSettings};
use chime_scheduler::service::DutySettings;
use chime_scheduler::store::Store;
use futures::StreamExt as _;
use lapin::BasicProperties;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};

use crate::common::{broker, job};
use crate::policies::{Leader, Spans, TestWorker};

async fn cli(store: &Store, prefix: &str, output: Output, command: Command) -> (ExitCode, String) {
    let broker = Broker::new(AMQP_URL, prefix);
    let mut out = Vec::new();
    let code = operate(store, Some(&broker), output, command, &mut out)
        .await
        .expect("command runs");
    (code, String::from_utf8(out).expect("utf-8 output"))
}

async fn state(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("run state")
}

async fn trigger(store: &Store, prefix: &str, name: &str) -> i64 {
    wait_for(Duration::from_secs(10), "the job to be stored", || async {
        store.job(name).await.expect("job").map(|_| ())
    })
    .await;
    let (code, out) = cli(
        store,
        prefix,
        Output::Json,
        Command::Jobs(JobsCommand::Trigger {
            name: name.into(),
            params: None,
            at: None,
            idempotency_key: None,
        }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    serde_json::from_str::<Value>(&out).expect("JSON")["run_id"]
        .as_i64()
        .expect("run id")
}

/// Waits until `queue` holds `expected` ready messages (the broker applies acks, nacks and
/// purges asynchronously).
async fn wait_depth(queue: &str, expected: u32) {
    wait_for(
        Duration::from_secs(10),
        &format!("{queue} to hold {expected} messages"),
        || async { done_if(depth(queue).await, |depth| *depth == expected) },
    )
    .await;
}

/// Messages ready in a queue.
async fn depth(queue: &str) -> u32 {
    let connection = broker().await;
    let ready = crate::dead_letters::depth(&connection, queue).await;
    let _ = connection.close(200, "done".into()).await;
    ready
}

#[sqlx::test(migrations = "../migrations")]
async fn cancelling_a_queued_run_means_it_never_executes(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["cq"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let store = Store::from_pool(pool.clone());
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(json!({"name": "later", "group": "cq"}))],
        DutySettings::default(),
    );
    // No worker yet: the run waits in the queue.
    let id = trigger(&store, &prefix, "later").await;
    wait_for(Duration::from_secs(10), "the run to be queued", || async {
        (state(&pool, id).await == "queued").then_some(())
    })
    .await;
    let (code, out) = cli(
        &store,
        &prefix,
        Output::Table,
        Command::Runs(RunsCommand::Cancel { id }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        out,
        format!("cancelled run {id} of later (it was queued; it will not run)\n")
    );
    let row = sqlx::query(
        "SELECT state, cancel_requested_by, reason, finished_at IS NOT NULL AS finished
         FROM chime_runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .expect("run");
    assert_eq!(row.get::<String, _>("state"), "cancelled");
    let by: String = row.get("cancel_requested_by");
    assert!(by.starts_with("cli:"), "{by}");
    assert_eq!(row.get::<String, _>("reason"), format!("cancelled by {by}"));
    assert!(row.get::<bool, _>("finished"));

    // A worker comes: the cancelled run's message finds nothing to claim; a later run runs.
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "cq", |b| {
        spans.register(b, "later", Duration::from_millis(1))
    });
    let next = trigger(&store, &prefix, "later").await;
    wait_for(
        Duration::from_secs(10),
        "the next run to succeed",
        || async { (state(&pool, next).await == "succeeded").then_some(()) },
    )
    .await;
    assert_eq!(
        depth(&Topology::new(&prefix, "cq").work_queue()).await,
        0,
        "the cancelled run's message was consumed"
    );
    let ran: Vec<i64> = spans.all().iter().map(|s| s.run_id).collect();
    assert_eq!(ran, [next], "the cancelled run never executed");
    assert_eq!(state(&pool, id).await, "cancelled");
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_attempts WHERE run_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(attempts, 0);

    // Finished runs and unknown ids: exit 1, nothing changes.
    for bad in [id, next, 999_999] {
        let (code, out) = cli(
            &store,
            &prefix,
            Output::Table,
            Command::Runs(RunsCommand::Cancel { id: bad }),
        )
        .await;
        assert_eq!(code, ExitCode::FAILURE, "cancel {bad}");
        assert!(out.is_empty());
    }
    assert_eq!(state(&pool, next).await, "succeeded");
    leader.stop().await;
    worker.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn cancelling_a_running_run_sends_a_control_message(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["cr"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let store = Store::from_pool(pool.clone());

    // Listen on the control exchange like a worker does.
    let connection = broker().await;
    let channel = connection.create_channel().await.expect("channel");
    declare_control(&channel, &prefix).await.expect("declare");
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("queue");
    channel
        .queue_bind(
            queue.name().clone(),
            control_exchange(&prefix).as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
    let mut control = channel
        .basic_consume(
            queue.name().clone(),
            "test".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume");

    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "cr", |b| {
        spans.register(b, "long", Duration::from_secs(60))
    });
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(json!({"name": "long", "group": "cr"}))],
        DutySettings::default(),
    );
    let id = trigger(&store, &prefix, "long").await;
    wait_for(Duration::from_secs(10), "the run to be running", || async {
        (state(&pool, id).await == "running").then_some(())
    })
    .await;
    let (code, out) = cli(
        &store,
        &prefix,
        Output::Json,
        Command::Runs(RunsCommand::Cancel { id }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    let out: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(out["outcome"], "cancel_requested");
    assert_eq!(out["control_message"], "delivered");

    let delivery = tokio::time::timeout(Duration::from_secs(10), control.next())
        .await
        .expect("a control message within 10 s")
        .expect("stream open")
        .expect("delivery");
    let message: ControlMessage = serde_json::from_slice(&delivery.data).expect("JSON");
    assert_eq!(message, ControlMessage::CancelRun { run_id: id });
    let requested: Option<String> =
        sqlx::query_scalar("SELECT cancel_requested_by FROM chime_runs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("run");
    assert!(requested.is_some_and(|by| by.starts_with("cli:")));

    // The worker holding it fires the run's token; the attempt ends cancelled.
    wait_for(
        Duration::from_secs(15),
        "the run to be cancelled",
        || async { (state(&pool, id).await == "cancelled").then_some(()) },
    )
    .await;
    assert!(spans.all()[0].end.is_some(), "the handler was cancelled");
    leader.stop().await;
    worker.stop().await;
    let _ = connection.close(200, "done".into()).await;
    t.finish().await;
}

/// Publishes a message to `group`'s parking lot as a worker would park it.
pub(crate) async fn park(
    prefix: &str,
    group: &str,
    run_id: i64,
    job: &str,
    attempt: u32,
    reason: &str,
) {
    let connection = broker().await;
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let topology = Topology::new(prefix, group);
    topology.declare(&channel).await.expect("declare");
    let trigger = Trigger {
        v: chime_protocol::wire::PROTOCOL_VERSION,
        run_id,
        job: job.into(),
        group: group.into(),
        attempt,
        scheduled_at: chrono::Utc::now(),
        params: json!({}),
        timeout_ms: None,
        retry: None,
        task: None,
    };
    let mut headers = FieldTable::default();
    headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(attempt));
    headers.insert(
        HEADER_DEAD_REASON.into(),
        AMQPValue::LongString(reason.into()),
    );
    headers.insert(
        HEADER_DEAD_BY.into(),
        AMQPValue::LongString("w-test".into()),
    );
    publish_parked(&channel, &topology, run_id, &trigger.to_body(), headers).await;
    let _ = connection.close(200, "done".into()).await;
}

/// Publishes `body` with `headers` to the parking lot of `topology` on `channel` (in confirm
/// mode), as a worker parks a message of run `run_id`, and waits for the broker's plain ack.
pub(crate) async fn publish_parked(
    channel: &lapin::Channel,
    topology: &Topology,
    run_id: i64,
    body: &[u8],
    headers: FieldTable,
) {
    let confirm = channel
        .basic_publish(
            topology.exchange().as_str().into(),
            PARKING_KEY.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            BasicProperties::default()
                .with_message_id(run_id.to_string().into())
                .with_delivery_mode(2)
                .with_headers(headers),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(
        matches!(confirm, lapin::Confirmation::Ack(None)),
        "parked: {confirm:?}"
    );
}

/// Waits until the leader has drained `count` dead letters of `group` into the database.
pub(crate) async fn wait_drained(pool: &PgPool, group: &str, count: usize) {
    let ops = chime_scheduler::ops::Operations::new(Store::from_pool(pool.clone()), None);
    wait_for(
        Duration::from_secs(10),
        &format!("{count} dead letters of {group} drained"),
        || async {
            let page = ops
                .dead_letters(
                    &chime_scheduler::auth::Caller::cli(),
                    Some(group.into()),
                    None,
                    1000,
                )
                .await
                .expect("list");
            (page.dead_letters.len() == count).then_some(())
        },
    )
    .await;
}

/// A run that died after `attempt` attempts.
pub(crate) async fn dead_run(
    pool: &PgPool,
    job: &str,
    group: &str,
    attempt: i32,
    error: &str,
) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                 error, reason, finished_at, worker_id)
         VALUES ($1, $2, now(), 'manual', 'dead', $3, $4, 'attempts exhausted', now(), 'w-test')
         RETURNING id",
    )
    .bind(job)
    .bind(group)
    .bind(attempt)
    .bind(error)
    .fetch_one(pool)
    .await
    .expect("insert run")
}

#[sqlx::test(migrations = "../migrations")]
async fn dlq_lists_replays_and_purges_parked_runs(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["dl"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let store = Store::from_pool(pool.clone());
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(json!({"name": "fragile", "group": "dl"}))],
        DutySettings::default(),
    );
    wait_for(Duration::from_secs(10), "the job to be stored", || async {
        store.job("fragile").await.expect("job").map(|_| ())
    })
    .await;
    let replayed = dead_run(&pool, "fragile", "dl", 3, "boom").await;
    let other = dead_run(&pool, "fragile", "dl", 1, "bad input").await;
    park(&prefix, "dl", replayed, "fragile", 3, "attempts exhausted").await;
    park(&prefix, "dl", other, "fragile", 1, "failed, no retry").await;
    let parking = Topology::new(&prefix, "dl").parking_queue();
    // The leader drains the parking lot into the database; the queue is left empty.
    wait_drained(&pool, "dl", 2).await;
    wait_depth(&parking, 0).await;

    // list: both, with what the headers and the database say; nothing is removed.
    for _ in 0..2 {
        let (code, out) = cli(
            &store,
            &prefix,
            Output::Json,
            Command::Dlq(DlqCommand::List {
                group: None,
                limit: 100,
                after: None,
            }),
        )
        .await;
        assert_eq!(code, ExitCode::SUCCESS);
        let listed: Vec<Value> = serde_json::from_str(&out).expect("JSON");
        assert_eq!(listed.len(), 2, "{out}");
        let row = listed
            .iter()
            .find(|r| r["run_id"] == replayed)
            .expect("the parked run is listed");
        assert_eq!(row["group"], "dl");
        assert_eq!(row["job"], "fragile");
        assert_eq!(row["attempt"], 3);
        assert_eq!(row["reason"], "attempts exhausted");
        assert_eq!(row["error"], "boom");
        assert_eq!(row["parked_by"], "w-test");
        assert_eq!(row["run_state"], "dead");
        assert!(row["parked_at"].is_string(), "{row}");
    }
    let (_, table) = cli(
        &store,
        &prefix,
        Output::Table,
        Command::Dlq(DlqCommand::List {
            group: Some("dl".into()),
            limit: 1,
            after: None,
        }),
    )
    .await;
    assert_eq!(table.lines().count(), 2, "header and one row:\n{table}");

    // replay: the run is published again as attempt 4 and runs; its message is gone.
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "dl", |b| {
        spans.register(b, "fragile", Duration::from_millis(1))
    });
    let (code, out) = cli(
        &store,
        &prefix,
        Output::Table,
        Command::Dlq(DlqCommand::Replay {
            id: Some(replayed),
            all: false,
            group: None,
        }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        out,
        format!("replayed run {replayed} of fragile as attempt 4; removed 1 parked message(s)\n")
    );
    wait_for(
        Duration::from_secs(10),
        "the replayed run to succeed",
        || async { (state(&pool, replayed).await == "succeeded").then_some(()) },
    )
    .await;
    let row = sqlx::query(
        "SELECT attempt, replayed_by, replayed_at IS NOT NULL AS replayed, error
         FROM chime_runs WHERE id = $1",
    )
    .bind(replayed)
    .fetch_one(&pool)
    .await
    .expect("run");
    assert_eq!(row.get::<i32, _>("attempt"), 4);
    assert!(row.get::<String, _>("replayed_by").starts_with("cli:"));
    assert!(row.get::<bool, _>("replayed"));
    assert_eq!(row.get::<Option<String>, _>("error"), None);
    let ran: Vec<(i64, u32)> = spans.all().iter().map(|s| (s.run_id, s.attempt)).collect();
    assert_eq!(ran, [(replayed, 4)]);
    let (_, out) = cli(
        &store,
        &prefix,
        Output::Json,
        Command::Dlq(DlqCommand::List {
            group: Some("dl".into()),
            limit: 100,
            after: None,
        }),
    )
    .await;
    let listed: Vec<Value> = serde_json::from_str(&out).expect("JSON");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["run_id"], other);

    // A run that is not dead cannot be replayed.
    let (code, _) = cli(
        &store,
        &prefix,
        Output::Table,
        Command::Dlq(DlqCommand::Replay {
            id: Some(replayed),
            all: false,
            group: None,
        }),
    )
    .await;
    assert_eq!(code, ExitCode::FAILURE);

    // purge: the rest goes.
    let (code, out) = cli(
        &store,
        &prefix,
        Output::Table,
        Command::Dlq(DlqCommand::Purge { group: None }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(out, format!("purged 1 messages from {parking}\n"));
    wait_depth(&parking, 0).await;
    wait_drained(&pool, "dl", 0).await;
    assert_eq!(
        state(&pool, other).await,
        "dead",
        "purging leaves runs alone"
    );

    leader.stop().await;
    worker.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn dlq_replay_all_replays_every_parked_run_of_the_group(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["dla"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let store = Store::from_pool(pool.clone());
    let leader = Leader::start(
        &db,
        &prefix,
        vec![job(json!({"name": "batch", "group": "dla"}))],
        DutySettings::default(),
    );
    let a = dead_run(&pool, "batch", "dla", 2, "x").await;
    let b = dead_run(&pool, "batch", "dla", 2, "y").await;
    park(&prefix, "dla", a, "batch", 2, "attempts exhausted").await;
    park(&prefix, "dla", b, "batch", 2, "attempts exhausted").await;
    park(&prefix, "dla", 999_999, "batch", 1, "unknown run").await;
    wait_drained(&pool, "dla", 3).await;
    let spans = Spans::default();
    let worker = TestWorker::start(&db, &prefix, "dla", |w| {
        spans.register(w, "batch", Duration::from_millis(1))
    });
    let (code, out) = cli(
        &store,
        &prefix,
        Output::Json,
        Command::Dlq(DlqCommand::Replay {
            id: None,
            all: true,
            group: Some("dla".into()),
        }),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    let out: Value = serde_json::from_str(&out).expect("JSON");
    let mut ids: Vec<i64> = out["replayed"]
        .as_array()
        .expect("replayed")
        .iter()
        .map(|v| v.as_i64().expect("id"))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [a, b]);
    assert_eq!(out["kept"][0]["run_id"], 999_999);
    wait_for(Duration::from_secs(10), "both runs to succeed", || async {
        (state(&pool, a).await == "succeeded" && state(&pool, b).await == "succeeded").then_some(())
    })
    .await;
    wait_drained(&pool, "dla", 1).await;
    leader.stop().await;
    worker.stop().await;
    t.finish().await;
}

/// Webhook bodies received, by path.
type Received = Events<(String, Value)>;

/// A local webhook receiver: `/ok/*` answers 200, `/fail/*` answers 500.
async fn webhook_server() -> (String, Received) {
    let received = Received::new();
    let app = axum::Router::new()
        .route(
            "/{kind}/{name}",
            axum::routing::post(
                |State(received): State<Received>,
                 Path((kind, name)): Path<(String, String)>,
                 axum::Json(body): axum::Json<Value>| async move {
                    received.record((format!("/{kind}/{name}"), body));
                    if kind == "ok" {
                        StatusCode::OK
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                },
            ),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, received)
}

async fn alert_rows(pool: &PgPool, job: &str) -> Vec<(String, bool, bool, Option<String>, String)> {
    sqlx::query(
        "SELECT kind, delivered, suppressed, error, target FROM chime_alerts
         WHERE job_name = $1 ORDER BY id",
    )
    .bind(job)
    .fetch_all(pool)
    .await
    .expect("alerts")
    .into_iter()
    .map(|r| {
        (
            r.get("kind"),
            r.get("delivered"),
            r.get("suppressed"),
            r.get("error"),
            r.get("target"),
        )
    })
    .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn alerts_post_generic_and_slack_webhooks_once_per_interval(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["reports", "chat"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let (base, received) = webhook_server().await;
    let mut alerts = AlertSettings {
        webhook: Some(format!("{base}/ok/generic")),
        consecutive_failures: 0,
        ..AlertSettings::default()
    };
    alerts.groups.insert(
        "chat".into(),
        GroupAlertSettings {
            consecutive_failures: Some(2),
            ..GroupAlertSettings::default()
        },
    );
    let leader = Leader::start(
        &db,
        &prefix,
        vec![
            job(json!({"name": "nightly", "group": "reports"})),
            job(json!({"name": "chatty", "group": "chat",
                        "alerts": {"webhook": format!("{base}/ok/slack"), "format": "slack"}})),
        ],
        DutySettings {
            alerts,
            ..DutySettings::default()
        },
    );
    let dead = dead_run(&pool, "nightly", "reports", 3, "disk full").await;
    wait_for(Duration::from_secs(10), "the generic alert", || async {
        let got = received.all();
        got.into_iter().find(|(path, _)| path == "/ok/generic")
    })
    .await;
    let body = received.all()[0].1.clone();
    assert_eq!(body["kind"], "dead");
    assert_eq!(body["job"], "nightly");
    assert_eq!(body["group"], "reports");
    assert_eq!(body["run_id"], dead);
    assert_eq!(body["attempt"], 3);
    assert_eq!(body["error"], "disk full");
    assert!(
        body["at"].as_str().is_some_and(|at| at.ends_with('Z')),
        "{body}"
    );
    assert_eq!(
        body["text"],
        format!(
            "Chime: run {dead} of job \"nightly\" (group reports) is dead after attempt 3: disk full"
        )
    );

    // A second dead run of the job within min_interval is recorded as suppressed, not sent.
    let again = dead_run(&pool, "nightly", "reports", 3, "disk still full").await;
    wait_for(
        Duration::from_secs(10),
        "the second alert to be recorded",
        || async { (alert_rows(&pool, "nightly").await.len() == 2).then_some(()) },
    )
    .await;
    let rows = alert_rows(&pool, "nightly").await;
    assert_eq!(
        rows[0],
        ("dead".into(), true, false, None, format!("{base}/***")),
        "the target is stored without its path"
    );
    assert_eq!((rows[1].1, rows[1].2), (false, true), "{rows:?}");
    assert!(
        rows[1]
            .3
            .as_deref()
            .is_some_and(|e| e.starts_with("suppressed"))
    );
    let suppressed_run: i64 = sqlx::query_scalar(
        "SELECT run_id FROM chime_alerts WHERE job_name = 'nightly' AND suppressed",
    )
    .fetch_one(&pool)
    .await
    .expect("suppressed row");
    assert_eq!(suppressed_run, again);

    // The job's own Slack webhook: two failed runs in a row (its group's threshold) → one
    // Slack-compatible body.
    for error in ["timeout talking to chat", "timeout again"] {
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                     error, finished_at)
             VALUES ('chatty', 'chat', now(), 'manual', 'failed', 1, $1, now())",
        )
        .bind(error)
        .execute(&pool)
        .await
        .expect("insert failed run");
    }
    let slack = wait_for(Duration::from_secs(10), "the Slack alert", || async {
        let got = received.all();
        got.into_iter().find(|(path, _)| path == "/ok/slack")
    })
    .await;
    let text = slack.1["text"].as_str().expect("text").to_owned();
    assert_eq!(slack.1.as_object().expect("object").len(), 1, "{}", slack.1);
    assert!(
        text.starts_with("Chime: job \"chatty\" (group chat) failed 2 runs in a row; latest run "),
        "{text}"
    );
    assert!(text.ends_with(": timeout again"), "{text}");
    let posts = received.len();
    assert_eq!(posts, 2, "one generic and one Slack post, nothing more");
    leader.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failing_webhook_is_recorded_and_does_not_stop_the_leader(pool: PgPool) {
    let t = Setup::new(&pool).with_groups(&["hooks"]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let (base, received) = webhook_server().await;
    // A port nobody listens on (bound, then closed).
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let leader = Leader::start(
        &db,
        &prefix,
        vec![
            job(json!({"name": "refused", "group": "hooks",
                        "alerts": {"webhook": format!("http://{closed}/hook")}})),
            job(json!({"name": "erroring", "group": "hooks",
                        "alerts": {"webhook": format!("{base}/fail/hook")}})),
            job(json!({"name": "beat", "group": "hooks", "every": "1s"})),
        ],
        DutySettings::default(),
    );
    dead_run(&pool, "refused", "hooks", 1, "x").await;
    dead_run(&pool, "erroring", "hooks", 1, "y").await;
    for job in ["refused", "erroring"] {
        wait_for(
            Duration::from_secs(15),
            "the failed delivery to be recorded",
            || async {
                alert_rows(&pool, job)
                    .await
                    .into_iter()
                    .find(|r| r.3.is_some())
            },
        )
        .await;
    }
    let refused = alert_rows(&pool, "refused").await;
    assert!(!refused[0].1, "not delivered");
    assert!(
        refused[0]
            .3
            .as_deref()
            .is_some_and(|e| e.starts_with("request failed")),
        "{refused:?}"
    );
    let erroring = alert_rows(&pool, "erroring").await;
    assert!(!erroring[0].1);
    assert!(
        erroring[0]
            .3
            .as_deref()
            .is_some_and(|e| e.starts_with("webhook answered 500")),
        "{erroring:?}"
    );
    assert_eq!(received.len(), 1);

    // The leader goes on planning.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE job_name = 'beat'")
        .fetch_one(&pool)
        .await
        .expect("count");
    wait_for(Duration::from_secs(10), "beat to keep firing", || async {
        let now: i64 =
            sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE job_name = 'beat'")
                .fetch_one(&pool)
                .await
                .expect("count");
        (now >= before + 2).then_some(())
    })
    .await;
    leader.stop().await;
    t.finish().await;
}
