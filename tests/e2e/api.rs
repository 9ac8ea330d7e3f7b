//! The operations surface over real HTTP: a scheduler serving its API, health probes and
//! `/metrics` on a port, a worker, and tokens with different roles; a parked message, drained
//! into the database by the leader, read in full.

use std::sync::Arc;
use std::time::Duration;

use chime_e2e::services::{PrivateRabbit, free_port};
use chime_e2e::{AMQP_URL, Setup, database_url, init_tracing, service_config, unique, wait_for};
use chime_scheduler::service::{self, DutySettings, OpsSettings};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::common::{RecordingWorker, ServingInstance, job};
use crate::ops::{dead_run, park};

struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("HTTP request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, token, None).await
    }

    async fn metrics(&self) -> String {
        match self.get("/metrics", None).await {
            (200, Value::String(text)) => text,
            other => panic!("/metrics: {other:?}"),
        }
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn the_api_triggers_shows_and_measures_a_run_end_to_end(pool: PgPool) {
    let group = "apig";
    let t = Setup::new(&pool).with_groups(&[group]);
    let (db, prefix) = (t.database_url.clone(), t.prefix.clone());
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let (operator, viewer) = (instance.operator.clone(), instance.viewer.clone());
    let http = Http {
        client: reqwest::Client::new(),
        base: instance.base.clone(),
    };
    // Only the leader observes runs; its first scrape starts the observer at the newest run.
    wait_for(Duration::from_secs(10), "the instance to lead", || async {
        let text = http.metrics().await;
        text.lines().any(|l| l == "chime_is_leader 1").then_some(())
    })
    .await;
    http.metrics().await;
    let worker = RecordingWorker::start(&db, AMQP_URL, &prefix, group, &["ping"]);

    // A viewer may look but not trigger: 403, and no run.
    let (status, _) = http
        .call(
            reqwest::Method::POST,
            "/api/jobs/ping/trigger",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, 403);
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(runs, 0);

    let (status, body) = http
        .call(
            reqwest::Method::POST,
            "/api/jobs/ping/trigger",
            Some(&operator),
            Some(json!({"params": {"n": 1}})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let run_id = body["run_id"].as_i64().expect("run id");

    let run = wait_for(Duration::from_secs(20), "the run to succeed", || async {
        let (_, run) = http
            .get(&format!("/api/runs/{run_id}"), Some(&viewer))
            .await;
        (run["state"] == "succeeded").then_some(run)
    })
    .await;
    assert_eq!(run["params"], json!({"n": 1}));
    assert_eq!(run["requested_by"], "token:alice");
    assert_eq!(run["attempts"].as_array().expect("attempts").len(), 1);
    assert_eq!(run["logs"][0]["message"], "recorded");

    let (_, queues) = http.get("/api/queues", Some(&viewer)).await;
    assert_eq!(queues["source"], "passive_declare", "{queues}");
    assert_eq!(queues["management_error"], Value::Null, "{queues}");
    let queue = &queues["queues"][0];
    assert_eq!(queue["group"], group);
    assert_eq!(queue["consumers"], 1, "{queues}");
    assert_eq!(queue["parking_depth"], 0, "{queues}");
    let (_, workers) = http.get("/api/workers", Some(&viewer)).await;
    assert_eq!(workers["workers"][0]["online"], true, "{workers}");
    assert_eq!(workers["workers"][0]["capacity"], 16);
    let leader = wait_for(Duration::from_secs(10), "this instance to lead", || async {
        let (_, leader) = http.get("/api/leader", Some(&viewer)).await;
        (leader["this_instance_leads"] == true).then_some(leader)
    })
    .await;
    assert!(leader["term"].as_i64().expect("term") >= 1);
    let (_, audit) = http.get("/api/audit?job=ping", Some(&viewer)).await;
    let outcomes: Vec<(&str, &str)> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().expect("actor"),
                e["outcome"].as_str().expect("outcome"),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [("token:alice", "ok"), ("token:grafana", "denied")]
    );

    let text = http.metrics().await;
    for line in [
        "chime_fire_publish_offset_seconds_count 1",
        "chime_fire_lateness_seconds_count{stage=\"started\"} 1",
        "chime_runs_finished_total{job=\"ping\",state=\"succeeded\"} 1",
        "chime_attempts_total{job=\"ping\"} 1",
        "chime_is_leader 1",
        "chime_queue_consumers{group=\"apig\"} 1",
        "chime_parking_lot_depth{group=\"apig\"} 0",
        "chime_workers_online{group=\"apig\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    assert!(
        !text.contains("chime_publish_confirm_seconds_count 0"),
        "the publish was timed:\n{text}"
    );

    worker.stop().await;
    instance.stop().await;
    t.finish().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn an_instance_bound_beyond_loopback_without_tokens_refuses_to_start(pool: PgPool) {
    let db = database_url(&pool);
    let prefix = unique("apiexp");
    let config = service_config(&db, AMQP_URL, &unique("api-sched"), &prefix);
    let loader: service::JobLoader =
        Arc::new(|| Ok(vec![job(json!({"name": "ping", "group": "apiexp"}))]));
    let (_reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
    let error = tokio::time::timeout(
        Duration::from_secs(20),
        service::run_serving(
            config,
            DutySettings::default(),
            OpsSettings {
                bind: Some(
                    format!("0.0.0.0:{}", free_port().expect("a free port"))
                        .parse()
                        .expect("address"),
                ),
                retention: None,
                ..OpsSettings::default()
            },
            loader,
            reload_rx,
            CancellationToken::new(),
        ),
    )
    .await
    .expect("refuses at once")
    .expect_err("refuses to start");
    assert!(
        format!("{error:#}").contains("no API token exists"),
        "{error:#}"
    );
    let leader: Option<String> =
        sqlx::query_scalar("SELECT holder FROM chime_leader WHERE name = 'default'")
            .fetch_one(&pool)
            .await
            .expect("lease");
    assert_eq!(leader, None, "it never campaigned");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_jobs")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(jobs, 0, "nothing was synced either");
}

/// The dead-letter viewer's endpoint: one parked message in full (headers, trigger), as the
/// leader drained it, read as often as asked without changing the list or its order.
#[sqlx::test(migrations = "../migrations")]
async fn a_parked_message_is_shown_in_full_and_the_parking_lot_keeps_its_order(pool: PgPool) {
    let group = "apidl";
    let t = Setup::new(&pool).with_groups(&[group]);
    let prefix = t.prefix.clone();
    let instance = ServingInstance::start(&pool, &prefix, group).await;
    let http = Http {
        client: reqwest::Client::new(),
        base: instance.base.clone(),
    };
    let viewer = instance.viewer.clone();
    let mut ids = Vec::new();
    for (attempt, reason) in [
        (1, "failed, no retry"),
        (3, "attempts <b>exhausted</b>"),
        (2, "x"),
    ] {
        let id = dead_run(&pool, "ping", group, attempt, "boom").await;
        park(&prefix, group, id, "ping", attempt as u32, reason).await;
        ids.push(id);
    }
    let listed = || async {
        let (status, body) = http.get("/api/dead-letters", Some(&viewer)).await;
        assert_eq!(status, 200, "{body}");
        body["dead_letters"]
            .as_array()
            .expect("list")
            .iter()
            .map(|d| d["run_id"].as_i64().expect("run id"))
            .collect::<Vec<_>>()
    };
    crate::ops::wait_drained(&pool, group, ids.len()).await;
    assert_eq!(listed().await, ids);

    // The middle one, in full; a viewer may look.
    let (status, body) = http
        .get(&format!("/api/dead-letters/{}", ids[1]), Some(&viewer))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["run_id"], ids[1]);
    assert_eq!(body["job"], "ping");
    assert_eq!(body["attempt"], 3);
    assert_eq!(body["reason"], "attempts <b>exhausted</b>");
    assert_eq!(body["run_state"], "dead");
    assert_eq!(body["position"], 1);
    assert_eq!(body["queue"], format!("{prefix}.{group}.parking"));
    let message = &body["message"];
    assert_eq!(message["message_id"], ids[1].to_string());
    assert_eq!(
        message["headers"]["x-chime-dead-reason"],
        "attempts <b>exhausted</b>"
    );
    assert_eq!(message["headers"]["x-chime-attempt"], 3);
    assert_eq!(message["headers"]["x-chime-dead-by"], "w-test");
    assert_eq!(message["body_is_json"], true);
    assert_eq!(message["body"]["run_id"], ids[1]);
    assert_eq!(message["body"]["job"], "ping");
    assert_eq!(message["body"]["attempt"], 3);

    // Peeking and a partial listing keep every message, in order.
    let (_, first) = http.get("/api/dead-letters?limit=1", Some(&viewer)).await;
    assert_eq!(first["dead_letters"][0]["run_id"], ids[0], "{first}");
    for _ in 0..2 {
        let (status, _) = http
            .get(&format!("/api/dead-letters/{}", ids[2]), Some(&viewer))
            .await;
        assert_eq!(status, 200);
        assert_eq!(listed().await, ids);
    }

    // A run without a parked message, and no run at all: 404 with what to do.
    let alive = dead_run(&pool, "ping", group, 1, "not parked").await;
    let (status, body) = http
        .get(&format!("/api/dead-letters/{alive}"), Some(&viewer))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("GET /api/dead-letters lists the parked runs"),
        "{body}"
    );
    let (status, _) = http.get("/api/dead-letters/999999999", Some(&viewer)).await;
    assert_eq!(status, 404);
    assert_eq!(listed().await, ids, "nothing was lost");

    instance.stop().await;
    t.finish().await;
}

/// Queue figures from the management HTTP API of a private RabbitMQ node with the plugin
/// enabled (the shared broker runs without it), and the fall-back to passive declares when
/// the management API is not configured or does not answer.
#[sqlx::test(migrations = "../migrations")]
async fn queue_figures_come_from_the_management_api_else_from_passive_declares(pool: PgPool) {
    use chime_protocol::Topology;
    use chime_scheduler::auth::Caller;
    use chime_scheduler::ops::{Broker, Operations, QueueSource};
    use chime_scheduler::store::Store;
    use futures::StreamExt as _;
    use lapin::options::{BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    init_tracing();
    let store = Store::from_pool(pool.clone());
    let (prefix, group) = (unique("mgmt"), "mgmtg");
    store
        .sync_config_jobs(&[job(json!({"name": "ping", "group": group}))])
        .await
        .expect("jobs");
    let rabbit = tokio::task::spawn_blocking(PrivateRabbit::start_with_management)
        .await
        .expect("joined")
        .expect("a private RabbitMQ node with the management plugin");
    let management = rabbit.management_url().expect("management port");

    // Three messages in the work queue; a consumer with a prefetch of 1 holds one unacked.
    let connection = Connection::connect(&rabbit.url(), ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    let topology = Topology::new(&prefix, group);
    topology.declare(&channel).await.expect("topology");
    let work = topology.work_queue();
    for _ in 0..3 {
        channel
            .basic_publish(
                "".into(),
                work.as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
    }
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = channel
        .basic_consume(
            work.as_str().into(),
            "holder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let _held = consumer
        .next()
        .await
        .expect("a delivery")
        .expect("delivery");

    let viewer = Caller::cli();
    let with_management = Operations::new(
        store.clone(),
        Some(Broker::new(rabbit.url(), &prefix).with_management_url(Some(management.as_str()))),
    );
    let figures = wait_for(
        Duration::from_secs(30),
        "the management API's statistics to show the held message",
        || async {
            let figures = with_management.queues(&viewer).await.expect("queues");
            let queue = &figures.queues[0];
            (queue.unacked == Some(1) && queue.depth == Some(2)).then_some(figures)
        },
    )
    .await;
    assert_eq!(figures.source, QueueSource::Management);
    assert_eq!(figures.management_error, None);
    let queue = &figures.queues[0];
    assert_eq!(queue.group, group);
    assert_eq!(queue.consumers, Some(1), "{figures:?}");
    assert_eq!(queue.parking_depth, Some(0), "{figures:?}");
    assert!(queue.publish_rate.is_some() && queue.deliver_rate.is_some());

    // Without management_url: passive declares, exact ready and consumer counts, no unacked.
    let passive_ops = Operations::new(store.clone(), Some(Broker::new(rabbit.url(), &prefix)));
    let passive = passive_ops.queues(&viewer).await.expect("queues");
    passive_ops.close().await;
    assert_eq!(passive.source, QueueSource::PassiveDeclare);
    assert_eq!(passive.management_error, None);
    let queue = &passive.queues[0];
    assert_eq!(
        (queue.depth, queue.consumers, queue.unacked),
        (Some(2), Some(1), None)
    );

    // A management API that does not answer: passive declares, and the reason says why.
    let closed = format!("http://127.0.0.1:{}", free_port().expect("a free port"));
    let fallback_ops = Operations::new(
        store.clone(),
        Some(Broker::new(rabbit.url(), &prefix).with_management_url(Some(closed.as_str()))),
    );
    let fallback = fallback_ops.queues(&viewer).await.expect("queues");
    fallback_ops.close().await;
    assert_eq!(fallback.source, QueueSource::PassiveDeclare);
    let reason = fallback.management_error.expect("a reason");
    assert!(
        reason.contains("management API at http://127.0.0.1:"),
        "{reason}"
    );
    assert_eq!(fallback.queues[0].depth, Some(2));

    // Every operation shares one AMQP connection, which the broker lists once; after the
    // broker closes it, the next operation opens a new one.
    let broker = Broker::new(rabbit.url(), &prefix);
    let ops = Operations::new(store.clone(), Some(broker.clone()));
    for _ in 0..3 {
        ops.queues(&viewer).await.expect("queues");
        ops.dead_letters(&viewer, None, None, 10)
            .await
            .expect("dead letters");
    }
    assert_eq!(broker.connections_opened(), 1);
    let http = reqwest::Client::new();
    let ours = |listing: &Value| -> Vec<String> {
        listing
            .as_array()
            .expect("connections")
            .iter()
            .filter(|c| {
                [
                    &c["user_provided_name"],
                    &c["client_properties"]["connection_name"],
                ]
                .iter()
                .any(|n| n.as_str() == Some(broker.connection_name()))
            })
            .map(|c| c["name"].as_str().expect("name").to_owned())
            .collect()
    };
    let connections = || async {
        http.get(format!("{management}/api/connections"))
            .basic_auth("guest", Some("guest"))
            .send()
            .await
            .expect("GET /api/connections")
            .json::<Value>()
            .await
            .expect("JSON")
    };
    let listed = wait_for(
        Duration::from_secs(30),
        "the broker to list the operations' connection",
        || async { Some(ours(&connections().await)).filter(|o| !o.is_empty()) },
    )
    .await;
    assert_eq!(listed.len(), 1, "one shared connection: {listed:?}");
    let mut closing = reqwest::Url::parse(&management).expect("URL");
    closing
        .path_segments_mut()
        .expect("path")
        .pop_if_empty()
        .extend(["api", "connections", listed[0].as_str()]);
    let closed = http
        .delete(closing)
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .expect("DELETE the connection");
    assert!(closed.status().is_success(), "{}", closed.status());
    let figures = wait_for(
        Duration::from_secs(30),
        "the operations to reconnect",
        || async {
            let figures = ops.queues(&viewer).await.ok()?;
            (broker.connections_opened() == 2).then_some(figures)
        },
    )
    .await;
    assert_eq!(figures.queues[0].depth, Some(2), "{figures:?}");
    ops.close().await;

    let _ = connection.close(200, "done".into()).await;
    tokio::task::spawn_blocking(move || drop(rabbit))
        .await
        .expect("stopped");
}
