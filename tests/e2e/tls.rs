//! TLS end to end, against a private PostgreSQL (`ssl=on`) and a private RabbitMQ node with a
//! TLS listener, both presenting certificates this test makes (a CA, a server certificate for
//! 127.0.0.1, a client certificate, and an unrelated CA): the scheduler and a worker run a
//! trigger over TLS to both services, a client certificate is presented when the broker requires
//! one, and a wrong CA, a missing client certificate and `amqps://` against a plaintext port are
//! refused without any plaintext fallback.

use std::time::Duration;

use chime_e2e::pki::Pki;
use chime_e2e::services::{PrivatePostgres, PrivateRabbit, RabbitTls};
use chime_e2e::{Scheduler, init_tracing, service_config, unique, wait_for};
use chime_scheduler::ops::Broker;
use chime_scheduler::publish::Publisher;
use chime_scheduler::store::Store;
use chime_worker::{AmqpTls, CancellationToken, JobContext, JobError, Worker};
use lapin::ConnectionProperties;
use serde_json::json;

use crate::common::job;

/// A private PostgreSQL with TLS on and a private RabbitMQ node with a TLS listener.
async fn services(pki: &Pki, require_client_cert: bool) -> (PrivatePostgres, PrivateRabbit) {
    let tls = RabbitTls {
        ca_file: pki.path("ca.pem"),
        cert_file: pki.path("server.pem"),
        key_file: pki.path("server.key"),
        require_client_cert,
    };
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    tokio::task::spawn_blocking(move || {
        let postgres = PrivatePostgres::start_with_tls(&cert, &key)?;
        let rabbit = PrivateRabbit::start_with_tls(&tls)?;
        anyhow::Ok((postgres, rabbit))
    })
    .await
    .expect("starting services")
    .expect("private PostgreSQL and RabbitMQ with TLS")
}

/// Stops the services off the runtime (stopping waits for the processes).
async fn stop(postgres: PrivatePostgres, rabbit: PrivateRabbit) {
    tokio::task::spawn_blocking(move || drop((postgres, rabbit)))
        .await
        .expect("stopping services");
}

/// Whether the pool's connection is encrypted, as the server sees it.
async fn server_sees_tls(store: &Store) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

async fn tick(_: JobContext, _: serde_json::Value) -> Result<(), JobError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_and_a_worker_run_a_trigger_over_tls_to_both_services() {
    init_tracing();
    let pki = Pki::generate();
    let (postgres, rabbit) = services(&pki, false).await;
    let db = postgres.verify_full_url("chime", &pki.path("ca.pem"));
    Store::create_database_if_missing(&db)
        .await
        .expect("creating the database over TLS");
    let store = Store::connect(&db, 2)
        .await
        .expect("verify-full with the test's root");
    store.migrate().await.expect("migrations over TLS");
    assert!(server_sees_tls(&store).await, "the connection is not TLS");

    let amqps = rabbit.tls_url().expect("a TLS listener");
    let tls = AmqpTls::new().ca_file(pki.path("ca.pem"));
    let prefix = unique("tls");
    let stop_worker = CancellationToken::new();
    let worker = Worker::builder("secure")
        .database_url(&db)
        .amqp_url(&amqps)
        .amqp_tls(tls.clone())
        .prefix(&prefix)
        .handle("tick", tick)
        .build()
        .expect("worker with TLS options builds");
    let worker = tokio::spawn(worker.run(stop_worker.clone()));
    let mut config = service_config(&db, &amqps, "tls", &prefix);
    config.amqp_tls = tls.clone();
    let scheduler = Scheduler::start(
        config,
        vec![job(
            json!({"name": "tick", "group": "secure", "every": "1s"}),
        )],
    );

    wait_for(
        Duration::from_secs(60),
        "a run published, claimed and recorded over TLS",
        || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM chime_runs WHERE job_name = 'tick' AND state = 'succeeded'",
            )
            .fetch_one(store.pool())
            .await
            .ok()?;
            (done > 0).then_some(())
        },
    )
    .await;
    scheduler.stop().await.expect("graceful stop");
    stop_worker.cancel();
    worker
        .await
        .expect("worker task")
        .expect("worker ran cleanly");

    // The operations side (queue figures, dead letters) over the same TLS options.
    let broker = Broker::new(&amqps, &prefix).with_amqp_tls(tls);
    let work = format!("{prefix}.secure.work");
    let figures = broker
        .queue_figures(std::slice::from_ref(&work))
        .await
        .expect("queue figures over TLS");
    assert!(figures.queues.contains_key(&work), "{figures:?}");

    store.pool().close().await;
    stop(postgres, rabbit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_a_missing_client_certificate_and_a_plaintext_port_are_refused() {
    init_tracing();
    let pki = Pki::generate();
    let (postgres, rabbit) = services(&pki, true).await;
    let amqps = rabbit.tls_url().expect("a TLS listener");
    let with_cert = AmqpTls::new()
        .ca_file(pki.path("ca.pem"))
        .client_cert(pki.path("client.pem"), pki.path("client.key"));
    let properties = ConnectionProperties::default;

    // PostgreSQL: verify-full with a root that did not sign the server's certificate.
    let wrong_root = postgres.verify_full_url("postgres", &pki.path("other-ca.pem"));
    let error = format!("{:#}", Store::connect(&wrong_root, 1).await.unwrap_err());
    assert!(error.contains("UnknownIssuer"), "{error}");

    // RabbitMQ: a broker certificate from an unknown CA.
    let wrong_ca = AmqpTls::new()
        .ca_file(pki.path("other-ca.pem"))
        .client_cert(pki.path("client.pem"), pki.path("client.key"));
    let error = chime_protocol::tls::connect(&amqps, &wrong_ca, properties())
        .await
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(error.contains("UnknownIssuer"), "{error}");

    // The broker requires a client certificate: none, and the handshake fails.
    let no_cert = AmqpTls::new().ca_file(pki.path("ca.pem"));
    let refused = chime_protocol::tls::connect(&amqps, &no_cert, properties()).await;
    assert!(refused.is_err(), "connected without a client certificate");

    // amqps:// against the plaintext listener: no connection, nothing listed, a clear error.
    let downgraded = rabbit.url().replacen("amqp://", "amqps://", 1);
    let broker = Broker::new(&downgraded, unique("tls")).with_amqp_tls(with_cert.clone());
    let error = format!("{:#}", broker.connection().await.map(drop).unwrap_err());
    assert!(
        error.contains("TLS handshake with amqps://guest:***@"),
        "{error}"
    );
    assert!(error.contains("5671"), "{error}");
    assert!(
        broker
            .queue_figures(&["anything".to_owned()])
            .await
            .is_err(),
        "queue figures read over a refused connection"
    );
    assert_eq!(broker.connections_opened(), 0);

    // With its client certificate, the scheduler's publisher declares a group's topology and a
    // worker connects (PostgreSQL over verify-full) and consumes.
    let db = postgres.verify_full_url("chime", &pki.path("ca.pem"));
    Store::create_database_if_missing(&db).await.unwrap();
    let store = Store::connect(&db, 2).await.unwrap();
    store.migrate().await.unwrap();
    let prefix = unique("tls");
    Publisher::new(&amqps, "tls", &prefix)
        .with_tls(with_cert.clone())
        .declare("secure")
        .await
        .expect("publisher with a client certificate");
    let stop_worker = CancellationToken::new();
    let worker = Worker::builder("secure")
        .database_url(&db)
        .amqp_url(&amqps)
        .amqp_tls(with_cert.clone())
        .prefix(&prefix)
        .handle("tick", tick)
        .build()
        .expect("worker with a client certificate builds");
    let worker = tokio::spawn(worker.run(stop_worker.clone()));
    let broker = Broker::new(&amqps, &prefix).with_amqp_tls(with_cert);
    let work = format!("{prefix}.secure.work");
    wait_for(
        Duration::from_secs(30),
        "the worker consuming over TLS",
        || async {
            let figures = broker
                .queue_figures(std::slice::from_ref(&work))
                .await
                .ok()?;
            (figures.queues.get(&work)?.consumers == 1).then_some(())
        },
    )
    .await;
    stop_worker.cancel();
    worker
        .await
        .expect("worker task")
        .expect("worker ran cleanly");

    store.pool().close().await;
    stop(postgres, rabbit).await;
}
