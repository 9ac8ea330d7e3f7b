//! Hostile and careless input against the API (issue "Hostile input and secrets"): the request
//! corpus of `tests/corpus/api/`, secrets hidden from viewers and the audit log, error responses
//! that are always JSON, and a `/readyz` flood that costs one check.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt as _;

use super::tests::{App, app, app_with};
use super::{MAX_BODY_BYTES, Readiness};
use crate::auth::{Caller, Role};
use crate::secrets::REDACTED;

/// A param value no answer may ever show to a viewer or keep in the audit log.
const SECRET: &str = "hunter22";

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/corpus/api");

/// Sends `body` as it is; returns the status, the content type and the body as JSON (or text).
async fn send(
    app: &App,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, String, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if !body.is_empty() {
        request = request.header("content-type", "application/json");
    }
    let response = app
        .router()
        .oneshot(request.body(Body::from(body)).expect("request"))
        .await
        .expect("response");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = axum::body::to_bytes(response.into_body(), 10 << 20)
        .await
        .expect("body");
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, content_type, value)
}

fn corpus_job() -> Value {
    json!({
        "name": "corpus-job",
        "group": "g1",
        "params": {"batch": 1, "db_password": SECRET},
    })
}

#[sqlx::test(migrations = "../migrations")]
async fn the_api_corpus_gets_clear_json_errors(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[corpus_job()]).await;
    let tokens = [
        ("viewer", app.token(Role::Viewer).await),
        ("operator", app.token(Role::Operator).await),
        ("admin", app.token(Role::Admin).await),
    ];
    let long_name = "a".repeat(12 * 1024);
    let mut files: Vec<_> = std::fs::read_dir(CORPUS)
        .expect("the corpus folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "only {} cases in {CORPUS}", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let case: Value = serde_json::from_str(&std::fs::read_to_string(file).expect("read"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let token = match case["role"].as_str().expect("role") {
            "none" => None,
            role => Some(
                tokens
                    .iter()
                    .find(|(r, _)| *r == role)
                    .unwrap_or_else(|| panic!("{name}: unknown role {role}"))
                    .1
                    .as_str(),
            ),
        };
        let method: Method = case["method"].as_str().expect("method").parse().unwrap();
        let path = case["path"]
            .as_str()
            .expect("path")
            .replace("LONGNAME", &long_name);
        let body = if let Some(repeat) = case.get("repeat") {
            repeat["text"]
                .as_str()
                .expect("repeat.text")
                .repeat(repeat["times"].as_u64().expect("repeat.times") as usize)
                .into_bytes()
        } else if let Some(raw) = case.get("raw_body") {
            raw.as_str().expect("raw_body").as_bytes().to_vec()
        } else if let Some(body) = case.get("body") {
            body.to_string()
                .replace("LONGNAME", &long_name)
                .into_bytes()
        } else {
            Vec::new()
        };
        let audited_before = app.count("SELECT count(*) FROM chime_audit").await;
        let (status, content_type, answer) = send(&app, method, &path, token, body).await;
        let expected = case["status"].as_u64().expect("status") as u16;
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        let mut problems = Vec::new();
        if status.as_u16() != expected {
            problems.push(format!("status {status}, expected {expected}"));
        }
        if !content_type.starts_with("application/json") || answer["error"].is_null() {
            problems.push(format!("not the JSON error shape ({content_type})"));
        }
        for want in case["expect"].as_array().expect("expect") {
            let want = want.as_str().expect("expect entries are strings");
            if !message.contains(want) {
                problems.push(format!("message lacks {want:?}"));
            }
        }
        if answer.to_string().contains(SECRET) {
            problems.push("the answer shows a secret".to_owned());
        }
        if let Some(outcome) = case["audited"].as_str() {
            let total = app.count("SELECT count(*) FROM chime_audit").await;
            let newest: Option<String> =
                sqlx::query_scalar("SELECT outcome FROM chime_audit ORDER BY id DESC LIMIT 1")
                    .fetch_optional(&app.pool)
                    .await
                    .expect("audit");
            if total != audited_before + 1 || newest.as_deref() != Some(outcome) {
                problems.push(format!("no {outcome} audit entry was written"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{name}: {} — got {answer}", problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Audit rows keep a bounded prefix of a hostile name.
    let longest = app
        .count("SELECT coalesce(max(octet_length(job_name)), 0)::bigint FROM chime_audit")
        .await;
    assert!(longest <= 256, "an audit row kept a {longest}-byte name");
}

#[sqlx::test(migrations = "../migrations")]
async fn viewers_never_see_secret_params_or_webhooks_operators_do(pool: PgPool) {
    let app = app(pool).await;
    let admin = app.token(Role::Admin).await;
    let viewer = app.token(Role::Viewer).await;
    let operator = app.token(Role::Operator).await;
    let hook = "https://hooks.slack.com/services/T0SECRET/B0SECRET/XXXXSECRET";
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({
                "name": "ledger",
                "group": "g1",
                "secret_params": ["iban"],
                "params": {"batch": 5, "db_password": SECRET, "iban": "DE00123456"},
                "alerts": {"webhook": hook},
            })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    for path in ["/api/jobs", "/api/jobs/ledger"] {
        let (status, seen) = app.call(Method::GET, path, Some(&viewer), None).await;
        assert_eq!(status, StatusCode::OK, "{seen}");
        let text = seen.to_string();
        for secret in [SECRET, "DE00123456", "T0SECRET", "XXXXSECRET"] {
            assert!(
                !text.contains(secret),
                "a viewer sees {secret} at {path}: {text}"
            );
        }
        assert!(text.contains(REDACTED), "{text}");
        assert!(
            text.contains("\"batch\":5"),
            "non-secret params stay visible: {text}"
        );
        let (_, full) = app.call(Method::GET, path, Some(&operator), None).await;
        assert!(
            full.to_string().contains(SECRET),
            "operators read params in full"
        );
    }

    // A run whose error and log lines echo the password.
    let (status, triggered) = app
        .call(
            Method::POST,
            "/api/jobs/ledger/trigger",
            Some(&operator),
            Some(json!({"params": {"db_password": "s3cr3t-override", "iban": "DE00999999"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{triggered}");
    let run_id = triggered["run_id"].as_i64().expect("run id");
    for sql in [
        format!(
            "UPDATE chime_runs SET error = 'login failed for \"s3cr3t-override\"' \
             WHERE id = {run_id}"
        ),
        format!(
            "INSERT INTO chime_attempts (run_id, attempt, worker_id, state, error) \
             VALUES ({run_id}, 1, 'w1', 'failed', 'bad iban DE00999999')"
        ),
        format!(
            "INSERT INTO chime_run_logs (run_id, attempt, at, level, message) \
             VALUES ({run_id}, 1, now(), 'info', 'connecting with s3cr3t-override')"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&app.pool)
            .await
            .expect("seed");
    }
    for path in [
        format!("/api/runs/{run_id}"),
        "/api/runs?job=ledger".to_owned(),
    ] {
        let (status, seen) = app.call(Method::GET, &path, Some(&viewer), None).await;
        assert_eq!(status, StatusCode::OK, "{seen}");
        let text = seen.to_string();
        for secret in ["s3cr3t-override", "DE00999999"] {
            assert!(
                !text.contains(secret),
                "a viewer sees {secret} at {path}: {text}"
            );
        }
        assert!(text.contains("login failed for"), "{text}");
    }
    let (_, full) = app
        .call(
            Method::GET,
            &format!("/api/runs/{run_id}"),
            Some(&admin),
            None,
        )
        .await;
    assert!(full.to_string().contains("s3cr3t-override"));

    // The audit log keeps no secret, for anyone.
    let (_, audit) = app
        .call(Method::GET, "/api/audit?job=ledger", Some(&admin), None)
        .await;
    let stored: Vec<String> = sqlx::query_scalar("SELECT detail::text FROM chime_audit")
        .fetch_all(&app.pool)
        .await
        .expect("audit");
    for secret in [
        SECRET,
        "DE00123456",
        "XXXXSECRET",
        "s3cr3t-override",
        "DE00999999",
    ] {
        assert!(!audit.to_string().contains(secret), "{secret} in {audit}");
        assert!(
            stored.iter().all(|d| !d.contains(secret)),
            "{secret} stored in the audit log: {stored:?}"
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failed_change_keeps_the_webhook_out_of_the_audit_error(pool: PgPool) {
    let app = app(pool).await;
    let admin = app.token(Role::Admin).await;
    // An invalid webhook (not http/https) is echoed by the validation error; the audit log's
    // copy of that error must not keep it.
    let hook = "ftp://hooks.example.com/T0SECRET/XXXXSECRET";
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "bad-hook", "group": "g1", "alerts": {"webhook": hook}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT detail::text FROM chime_audit WHERE outcome = 'failed'")
            .fetch_all(&app.pool)
            .await
            .expect("audit");
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert!(!stored[0].contains("XXXXSECRET"), "{stored:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_readyz_flood_costs_one_broker_connection_per_period(pool: PgPool) {
    // A "broker" that counts the connections it is asked for and closes each at once.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let server = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    let app = app_with(
        pool,
        Readiness::with_broker(
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            Default::default(),
        ),
    )
    .await;
    let probes = (0..50).map(|_| send(&app, Method::GET, "/readyz", None, Vec::new()));
    let answers = futures::future::join_all(probes).await;
    for (status, _, body) in &answers {
        assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["broker"]["ok"], false, "{body}");
    }
    let connections = accepted.load(Ordering::SeqCst);
    // The AMQP client may retry its handshake once; 50 probes must not mean 50 connections.
    assert!(
        (1..=2).contains(&connections),
        "{connections} broker connections for 50 probes"
    );
    server.abort();
}

#[sqlx::test(migrations = "../migrations")]
async fn every_rejection_answers_in_the_json_error_shape(pool: PgPool) {
    let app = app(pool).await;
    let admin = app.token(Role::Admin).await;
    let cases: [(Method, &str, Vec<u8>, StatusCode); 3] = [
        (
            Method::POST,
            "/api/jobs",
            vec![b'{'; MAX_BODY_BYTES + 1],
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            Method::GET,
            "/api/jobs/%C3%28",
            Vec::new(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::PUT,
            "/api/overview",
            Vec::new(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ];
    for (method, path, body, expected) in cases {
        let (status, content_type, answer) =
            send(&app, method.clone(), path, Some(&admin), body).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert!(
            content_type.starts_with("application/json"),
            "{method} {path}: {content_type}"
        );
        assert_eq!(answer["error"]["status"], expected.as_u16(), "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
    // A denied request still answers 403 in JSON when its name is absurd.
    let viewer = app
        .ops
        .create_token(&Caller::cli(), "v", Role::Viewer)
        .await
        .expect("token")
        .secret;
    let (status, _, answer) = send(
        &app,
        Method::DELETE,
        &format!("/api/jobs/{}", "n".repeat(12 * 1024)),
        Some(&viewer),
        Vec::new(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_viewer_reads_dead_letters_without_their_secrets(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[corpus_job()]).await;
    let viewer = app.token(Role::Viewer).await;
    let admin = app.token(Role::Admin).await;
    let run_id: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state, error)
         VALUES ('corpus-job', 'g1', now(), 'manual', $1, 'dead',
                 'login refused for password hunter22')
         RETURNING id",
    )
    .bind(json!({"batch": 1, "db_password": SECRET}))
    .fetch_one(&app.pool)
    .await
    .expect("run");
    let trigger = json!({
        "v": 1, "run_id": run_id, "job": "corpus-job", "group": "g1", "attempt": 3,
        "scheduled_at": "2026-12-01T00:00:00Z",
        "params": {"batch": 1, "db_password": SECRET},
    });
    sqlx::query(
        "INSERT INTO chime_dead_letters (group_name, run_id, job_name, attempt, reason, error,
                                         headers, body, fingerprint)
         VALUES ('g1', $1, 'corpus-job', 3, 'retries exhausted', $2, $3, $4, '\\x01')",
    )
    .bind(run_id)
    .bind(format!("login refused for password {SECRET}"))
    .bind(json!({"x-chime-error": format!("login refused for password {SECRET}")}))
    .bind(trigger.to_string().into_bytes())
    .execute(&app.pool)
    .await
    .expect("dead letter");

    for path in [
        "/api/dead-letters?group=g1".to_owned(),
        format!("/api/dead-letters/{run_id}"),
    ] {
        let (status, seen) = app.call(Method::GET, &path, Some(&viewer), None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {seen}");
        let text = seen.to_string();
        assert!(
            !text.contains(SECRET),
            "a viewer sees the password at {path}: {text}"
        );
        assert!(text.contains("login refused for password"), "{text}");
        let (_, full) = app.call(Method::GET, &path, Some(&admin), None).await;
        assert!(
            full.to_string().contains(SECRET),
            "an admin reads {path} in full"
        );
    }
}
