//! The API against a real database (`#[sqlx::test]`, one database per test), driven through the
//! router with `tower::ServiceExt::oneshot`: authentication, roles, audit, pagination, job
//! changes, errors, the OpenAPI document, health and metrics.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt as _;

use super::{ApiState, OPENAPI, Readiness, check_exposure, router};
use crate::auth::{Caller, Role};
use crate::config::validate_job;
use crate::metrics::{METRIC_NAMES, Metrics};
use crate::ops::Operations;
use crate::store::Store;

pub(super) struct App {
    router: Router,
    pub(super) ops: Operations,
    pub(super) pool: PgPool,
}

pub(super) async fn app(pool: PgPool) -> App {
    app_with(pool, Readiness::default()).await
}

pub(super) async fn app_with(pool: PgPool, readiness: Readiness) -> App {
    let store = Store::from_pool(pool.clone());
    let ops = Operations::new(store, None);
    let metrics = Metrics::new(None, None).expect("metrics");
    let state = Arc::new(ApiState {
        ops: ops.clone(),
        instance_id: "test-instance".into(),
        readiness,
        metrics: Some(Arc::new(metrics)),
    });
    App {
        router: router(state),
        ops,
        pool,
    }
}

impl App {
    pub(super) fn router(&self) -> Router {
        self.router.clone()
    }

    pub(super) async fn token(&self, role: Role) -> String {
        self.ops
            .create_token(&Caller::cli(), &format!("{role}-token"), role)
            .await
            .expect("token")
            .secret
    }

    pub(super) async fn call(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let body = match body {
            Some(body) => {
                request = request.header("content-type", "application/json");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        let response = self
            .router
            .clone()
            .oneshot(request.body(body).expect("request"))
            .await
            .expect("response");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 10 << 20)
            .await
            .expect("body");
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    /// Makes `definitions` the jobs of the job files.
    pub(super) async fn config_jobs(&self, definitions: &[Value]) {
        let specs: Vec<_> = definitions
            .iter()
            .map(|d| validate_job(d.as_object().expect("object")).expect("valid job"))
            .collect();
        self.ops
            .store()
            .sync_config_jobs(&specs)
            .await
            .expect("jobs stored");
    }

    pub(super) async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }
}

fn manual_job(name: &str) -> Value {
    json!({"name": name, "group": "g1", "params": {"batch": 1}})
}

#[sqlx::test(migrations = "../migrations")]
async fn missing_unknown_and_revoked_tokens_get_401(pool: PgPool) {
    let app = app(pool).await;
    let (status, body) = app.call(Method::GET, "/api/jobs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("Authorization: Bearer"),
        "{body}"
    );
    let (status, _) = app
        .call(Method::GET, "/api/jobs", Some("chime_not-a-token"), None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let secret = app.token(Role::Viewer).await;
    let (status, body) = app.call(Method::GET, "/api/me", Some(&secret), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"actor": "token:viewer-token", "role": "viewer"})
    );
    let tokens = app.ops.store().tokens().await.expect("tokens");
    assert!(tokens[0].last_used_at.is_some(), "use is noted: {tokens:?}");

    app.ops
        .revoke_token(&Caller::cli(), "viewer-token")
        .await
        .expect("revoke");
    let (status, _) = app.call(Method::GET, "/api/me", Some(&secret), None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a revoked token is refused"
    );
    // Only the hash is stored.
    let stored: i64 = app
        .count(&format!(
            "SELECT count(*) FROM chime_api_tokens WHERE secret_sha256::text LIKE '%{}%'",
            &secret[6..20]
        ))
        .await;
    assert_eq!(stored, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_viewer_cannot_trigger_and_nothing_is_inserted(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("report")]).await;
    let viewer = app.token(Role::Viewer).await;

    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/report/trigger",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("jobs.trigger needs the operator role"),
        "{body}"
    );
    assert_eq!(app.count("SELECT count(*) FROM chime_runs").await, 0);
    let denied = sqlx::query_as::<_, (String, String, String, Option<String>)>(
        "SELECT actor, action, outcome, job_name FROM chime_audit WHERE outcome = 'denied'",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(
        denied,
        [(
            "token:viewer-token".into(),
            "jobs.trigger".into(),
            "denied".into(),
            Some("report".into())
        )]
    );

    // Neither may a viewer pause, nor an operator delete or purge.
    let (status, _) = app
        .call(Method::POST, "/api/jobs/report/pause", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let operator = app.token(Role::Operator).await;
    let (status, _) = app
        .call(Method::DELETE, "/api/jobs/report", Some(&operator), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = app
        .call(
            Method::POST,
            "/api/dead-letters/purge",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(app.ops.store().job("report").await.expect("job").is_some());
    assert!(
        !app.ops
            .store()
            .job("report")
            .await
            .expect("job")
            .expect("job")
            .paused
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn an_operator_triggers_with_params_and_the_audit_log_says_who(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("report")]).await;
    let operator = app.token(Role::Operator).await;

    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/report/trigger",
            Some(&operator),
            Some(json!({"params": {"batch": 7}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let run_id = body["run_id"].as_i64().expect("run id");
    let (params, by): (Value, String) =
        sqlx::query_as("SELECT params, requested_by FROM chime_runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&app.pool)
            .await
            .expect("run");
    assert_eq!(params, json!({"batch": 7}));
    assert_eq!(by, "token:operator-token");

    let (status, body) = app
        .call(Method::GET, "/api/audit?job=report", Some(&operator), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let entry = &body["entries"][0];
    assert_eq!(entry["actor"], "token:operator-token");
    assert_eq!(entry["role"], "operator");
    assert_eq!(entry["action"], "jobs.trigger");
    assert_eq!(entry["outcome"], "ok");
    assert_eq!(entry["job"], "report");
    assert_eq!(entry["run_id"], run_id);
    assert_eq!(entry["detail"]["params"], json!({"batch": 7}));

    // Unknown job: 404 naming the fix, recorded as failed.
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/nope/trigger",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("no job named \"nope\""),
        "{body}"
    );
    // A body with another field is rejected, naming it.
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/report/trigger",
            Some(&operator),
            Some(json!({"param": {}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "param");
    assert_eq!(app.count("SELECT count(*) FROM chime_runs").await, 1);

    // The overview counts it (pending) over the default hour.
    let (status, overview) = app
        .call(Method::GET, "/api/overview", Some(&operator), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    assert_eq!(overview["window_seconds"], 3600);
    assert_eq!(overview["runs_by_state"]["pending"], 1);
    assert_eq!(overview["runs_by_state"]["succeeded"], 0);
    assert_eq!(overview["failure_rate"], Value::Null);
    assert_eq!(overview["jobs"], 1);
    let (status, body) = app
        .call(
            Method::GET,
            "/api/overview?window=1s",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "window");

    // Cancel the pending run: audited with job and run.
    let (status, body) = app
        .call(
            Method::POST,
            &format!("/api/runs/{run_id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "cancelled");
    let (action, job, run): (String, Option<String>, Option<i64>) = sqlx::query_as(
        "SELECT action, job_name, run_id FROM chime_audit WHERE outcome = 'ok' ORDER BY id DESC
         LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .expect("audit");
    assert_eq!(
        (action.as_str(), job.as_deref(), run),
        ("runs.cancel", Some("report"), Some(run_id))
    );
    let (status, _) = app
        .call(
            Method::POST,
            &format!("/api/runs/{run_id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a finished run cannot be cancelled"
    );
}

/// `at` and `idempotency_key`: a run for later, the same key answering its first run (200,
/// `created: false`) with one audit entry per request, and each bad value refused naming its
/// field.
#[sqlx::test(migrations = "../migrations")]
async fn a_trigger_for_later_with_an_idempotency_key_makes_one_run(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("report")]).await;
    let operator = app.token(Role::Operator).await;
    let at = "2030-01-01T00:00:00Z";
    let later = chrono::Utc::now() + chrono::TimeDelta::days(30);
    let request = json!({"params": {"batch": 1}, "at": later.to_rfc3339(),
                         "idempotency_key": "order-7"});
    let (status, first) = app
        .call(
            Method::POST,
            "/api/jobs/report/trigger",
            Some(&operator),
            Some(request.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["created"], true);
    let (status, again) = app
        .call(
            Method::POST,
            "/api/jobs/report/trigger",
            Some(&operator),
            Some(request),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (&again["run_id"], &again["created"]),
        (&first["run_id"], &json!(false))
    );
    let (scheduled, state): (chrono::DateTime<chrono::Utc>, String) =
        sqlx::query_as("SELECT scheduled_at, state FROM chime_runs WHERE id = $1")
            .bind(first["run_id"].as_i64().expect("run id"))
            .fetch_one(&app.pool)
            .await
            .expect("run");
    assert!((scheduled - later).abs() < chrono::TimeDelta::milliseconds(1));
    assert_eq!(state, "pending");
    assert_eq!(
        app.count("SELECT count(*) FROM chime_audit WHERE action = 'jobs.trigger'")
            .await,
        2,
        "one entry per request"
    );

    for (body, field) in [
        (json!({"at": "tomorrow"}), "at"),
        (json!({"at": 5}), "at"),
        (json!({"at": at.replace("2030", "2099")}), "at"),
        (json!({"idempotency_key": 7}), "idempotency_key"),
        (
            json!({"idempotency_key": "k".repeat(201)}),
            "idempotency_key",
        ),
    ] {
        let (status, answer) = app
            .call(
                Method::POST,
                "/api/jobs/report/trigger",
                Some(&operator),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["problems"][0]["field"], field, "{answer}");
    }
    assert_eq!(app.count("SELECT count(*) FROM chime_runs").await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn runs_are_filtered_and_paged_by_keyset(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("a"), manual_job("b")]).await;
    let operator = app.token(Role::Operator).await;
    let mut ids = Vec::new();
    for job in ["a", "b", "a", "a", "b"] {
        let (_, body) = app
            .call(
                Method::POST,
                &format!("/api/jobs/{job}/trigger"),
                Some(&operator),
                None,
            )
            .await;
        ids.push((job, body["run_id"].as_i64().expect("run id")));
    }
    let expected: Vec<i64> = ids
        .iter()
        .rev()
        .filter(|(j, _)| *j == "a")
        .map(|(_, id)| *id)
        .collect();
    let mut seen = Vec::new();
    let mut uri = "/api/runs?job=a&limit=2".to_owned();
    loop {
        let (status, body) = app.call(Method::GET, &uri, Some(&operator), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for run in body["runs"].as_array().expect("runs") {
            assert_eq!(run["job"], "a");
            seen.push(run["id"].as_i64().expect("id"));
        }
        match body["next_before"].as_i64() {
            Some(before) => uri = format!("/api/runs?job=a&limit=2&before={before}"),
            None => break,
        }
    }
    assert_eq!(seen, expected, "newest first, every run once");

    let (status, body) = app
        .call(
            Method::GET,
            "/api/runs?state=finished&limit=0&sort=id",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let fields: Vec<&str> = body["error"]["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .map(|p| p["field"].as_str().expect("field"))
        .collect();
    assert_eq!(
        fields,
        ["sort"],
        "unknown parameters are rejected first: {body}"
    );
    let (status, body) = app
        .call(
            Method::GET,
            "/api/runs?state=finished&limit=0",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "state");
    assert_eq!(body["error"]["problems"][0]["value"], "\"finished\"");
    assert!(
        body["error"]["problems"][0]["message"]
            .as_str()
            .expect("message")
            .contains("succeeded"),
        "{body}"
    );
    assert_eq!(body["error"]["problems"][1]["field"], "limit");

    let (status, body) = app
        .call(
            Method::GET,
            &format!("/api/runs/{}", ids[0].1),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["attempts"], json!([]));
    assert_eq!(body["logs"], json!([]));
    let (status, body) = app
        .call(Method::GET, "/api/runs/abc", Some(&operator), None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "id");
}

#[sqlx::test(migrations = "../migrations")]
async fn jobs_are_created_changed_and_deleted_by_admins_only(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("from-file")]).await;
    let admin = app.token(Role::Admin).await;
    let operator = app.token(Role::Operator).await;
    let definition = json!({"name": "nightly", "group": "g2", "schedule": "0 3 * * *",
                            "timezone": "Europe/Berlin"});

    let (status, _) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&operator),
            Some(definition.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(app.ops.store().job("nightly").await.expect("job").is_none());

    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(
                json!({"name": "bad", "group": "g2", "schedule": "61 * * * *",
                        "timezone": "Europe/Berln"}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let problems = body["error"]["problems"].as_array().expect("problems");
    assert!(
        problems
            .iter()
            .any(|p| p["field"] == "timezone" && p["value"] == "\"Europe/Berln\""),
        "{body}"
    );
    assert!(problems.iter().any(|p| p["field"] == "schedule"), "{body}");

    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(definition.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["source"], "api");
    assert!(body["next_fire"].is_string());
    let (status, _) = app
        .call(Method::POST, "/api/jobs", Some(&admin), Some(definition))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    let (status, body) = app
        .call(
            Method::PATCH,
            "/api/jobs/nightly",
            Some(&admin),
            Some(json!({"schedule": null, "every": "30s", "params": {"x": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["schedule"], "every 30s");
    let stored = app
        .ops
        .store()
        .job("nightly")
        .await
        .expect("job")
        .expect("job");
    assert_eq!(stored.spec.params, json!({"x": 1}));
    assert_eq!(
        stored.spec.timezone.name(),
        "Europe/Berlin",
        "other fields stay"
    );

    let (status, body) = app
        .call(
            Method::PATCH,
            "/api/jobs/nightly",
            Some(&admin),
            Some(json!({"paused": true})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "paused");

    let (status, body) = app
        .call(
            Method::PATCH,
            "/api/jobs/from-file",
            Some(&admin),
            Some(json!({"every": "1m"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("job file"),
        "{body}"
    );

    let (status, _) = app
        .call(Method::DELETE, "/api/jobs/nightly", Some(&admin), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(app.ops.store().job("nightly").await.expect("job").is_none());
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action || ':' || outcome FROM chime_audit WHERE job_name = 'nightly' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("audit");
    assert_eq!(
        actions,
        [
            "jobs.create:denied",
            "jobs.create:ok",
            "jobs.create:failed",
            "jobs.update:ok",
            "jobs.update:failed",
            "jobs.delete:ok"
        ]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_openapi_document_and_the_router_name_the_same_routes(pool: PgPool) {
    let app = app(pool).await;
    let doc: Value = serde_json::from_str(OPENAPI).expect("OpenAPI is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    // Every documented operation is routed (anything but the fallback's 404/405).
    for (path, item) in paths {
        for method in item.as_object().expect("path item").keys() {
            let uri = path.replace("{name}", "x").replace("{id}", "1");
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            let (status, body) = app.call(method.clone(), &uri, None, None).await;
            assert!(
                status != StatusCode::METHOD_NOT_ALLOWED
                    && !(status == StatusCode::NOT_FOUND
                        && body["error"]["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("no such endpoint"))),
                "{method} {path} is documented but not routed ({status})"
            );
        }
    }
    // Every routed path is documented.
    let source = include_str!("../api.rs");
    let routed: Vec<&str> = source
        .split(".route(\"")
        .skip(1)
        .map(|rest| rest.split('"').next().expect("path"))
        .collect();
    assert!(routed.len() >= 20, "{routed:?}");
    for path in routed {
        assert!(
            paths.contains_key(path),
            "{path} is routed but not documented"
        );
    }
    let (status, body) = app.call(Method::GET, "/api/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, doc);
}

#[sqlx::test(migrations = "../migrations")]
async fn health_readiness_and_exposure(pool: PgPool) {
    let app = app(pool.clone()).await;
    let (status, _) = app.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["database"]["ok"], true);

    // A broker nobody listens on: not ready, and the body says why.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let down = app_with(
        pool,
        Readiness::with_broker(
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            Default::default(),
        ),
    )
    .await;
    let (status, body) = down.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["broker"]["ok"], false);
    assert_eq!(body["database"]["ok"], true);

    let open: std::net::SocketAddr = "0.0.0.0:8080".parse().expect("addr");
    let error = check_exposure(open, &app.ops)
        .await
        .expect_err("no token: refused");
    assert!(error.to_string().contains("chime tokens create"), "{error}");
    check_exposure("127.0.0.1:8080".parse().expect("addr"), &app.ops)
        .await
        .expect("loopback is fine without tokens");
    app.token(Role::Viewer).await;
    check_exposure(open, &app.ops)
        .await
        .expect("with a token, any address");
}

#[sqlx::test(migrations = "../migrations")]
async fn metrics_export_every_name_and_observe_new_runs(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("report")]).await;
    let mut registered = Metrics::new(None, None).expect("metrics").names();
    registered.sort();
    let mut listed: Vec<String> = METRIC_NAMES.iter().map(|n| n.to_string()).collect();
    listed.sort();
    assert_eq!(
        registered, listed,
        "METRIC_NAMES lists exactly what is registered"
    );
    let (status, first) = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let first = first.as_str().expect("text").to_owned();
    // Families with samples from the start (the others appear with their first labels).
    for name in [
        "chime_fire_lateness_seconds",
        "chime_fire_publish_offset_seconds",
        "chime_publish_confirm_seconds",
        "chime_is_leader",
        "chime_leader_term",
        "chime_scrape_errors_total",
    ] {
        assert!(
            first.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{first}"
        );
    }
    // Two runs: one published 2 s late and started 3 s late and finished after 2 attempts,
    // one still pending.
    sqlx::query(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                 published_at, started_at, finished_at)
         VALUES ('report', 'g1', now() - interval '10s', 'schedule', 'succeeded', 2,
                 now() - interval '8s', now() - interval '7s', now()),
                ('report', 'g1', now() - interval '1s', 'schedule', 'pending', 0,
                 NULL, NULL, NULL)",
    )
    .execute(&app.pool)
    .await
    .expect("runs");
    let (_, text) = app.call(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().expect("text");
    let sample = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("{line_start} missing:\n{text}"))
            .rsplit(' ')
            .next()
            .expect("value")
            .parse()
            .expect("number")
    };
    assert_eq!(sample("chime_fire_publish_offset_seconds_count"), 1.0);
    assert_eq!(
        sample("chime_fire_lateness_seconds_count{stage=\"started\"}"),
        1.0
    );
    assert!(
        !text.contains("stage=\"published\""),
        "publishing is measured by the offset:\n{text}"
    );
    let published_sum = sample("chime_fire_publish_offset_seconds_sum");
    assert!((1.9..2.1).contains(&published_sum), "{published_sum}");
    assert_eq!(
        sample("chime_runs_finished_total{job=\"report\",state=\"succeeded\"}"),
        1.0
    );
    assert_eq!(sample("chime_attempts_total{job=\"report\"}"), 2.0);
    assert_eq!(sample("chime_retries_total{job=\"report\"}"), 1.0);
    assert_eq!(
        sample("chime_runs_active{job=\"report\",state=\"pending\"}"),
        1.0
    );
    // The pending run is published ahead of its instant, as the dispatcher does: observed
    // once, as a negative offset; the finished one not again.
    sqlx::query(
        "UPDATE chime_runs SET state = 'queued', published_at = scheduled_at - interval '210ms'
         WHERE state = 'pending'",
    )
    .execute(&app.pool)
    .await
    .expect("publish");
    let (_, text) = app.call(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().expect("text");
    for line in [
        "chime_fire_publish_offset_seconds_count 2",
        "chime_fire_publish_offset_seconds_bucket{le=\"-0.22\"} 0",
        "chime_fire_publish_offset_seconds_bucket{le=\"-0.2\"} 1",
        "chime_fire_publish_offset_seconds_bucket{le=\"0\"} 1",
        "chime_fire_publish_offset_seconds_bucket{le=\"2.5\"} 2",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    assert!(
        text.contains("chime_runs_finished_total{job=\"report\",state=\"succeeded\"} 1"),
        "{text}"
    );
}

/// While a run is `running` its `started_at` is the claim's estimate (the instant, for a
/// trigger claimed ahead); the lateness metric waits for the outcome, which records the
/// handler's real start, and observes that.
#[sqlx::test(migrations = "../migrations")]
async fn lateness_metric_reads_the_start_the_outcome_recorded(pool: PgPool) {
    let app = app(pool).await;
    app.config_jobs(&[manual_job("report")]).await;
    // The first scrape starts the cursor at the newest run.
    app.call(Method::GET, "/metrics", None, None).await;
    sqlx::query(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                 published_at, started_at)
         VALUES ('report', 'g1', now() - interval '1s', 'schedule', 'running', 1,
                 now() - interval '1200ms', now() - interval '1s')",
    )
    .execute(&app.pool)
    .await
    .expect("run");
    let lateness = |text: &str, name: &str| -> f64 {
        let line = format!("chime_fire_lateness_seconds_{name}{{stage=\"started\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .unwrap_or_else(|| panic!("{line} missing:\n{text}"))
            .parse()
            .expect("number")
    };
    let (_, text) = app.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(
        lateness(text.as_str().expect("text"), "count"),
        0.0,
        "a running run's estimate is not observed"
    );
    sqlx::query(
        "UPDATE chime_runs SET state = 'succeeded', started_at = scheduled_at + interval '160ms',
                               finished_at = scheduled_at + interval '170ms'",
    )
    .execute(&app.pool)
    .await
    .expect("outcome");
    let (_, text) = app.call(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().expect("text");
    assert_eq!(lateness(text, "count"), 1.0, "{text}");
    let sum = lateness(text, "sum");
    assert!(
        (0.159..0.161).contains(&sum),
        "observed {sum} s, not 0.16 s"
    );
}

/// The Grafana dashboard in deploy/ uses only metric names `/metrics` exports.
#[test]
fn the_grafana_dashboard_uses_only_exported_metrics() {
    let dashboard: Value = serde_json::from_str(include_str!("../../../deploy/grafana/chime.json"))
        .expect("dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 8, "{exprs:?}");
    let mut used = std::collections::BTreeSet::new();
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("chime_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            used.insert(name);
        }
    }
    for name in &used {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| METRIC_NAMES.contains(base))
            .unwrap_or(name);
        assert!(
            METRIC_NAMES.contains(&base),
            "the dashboard uses {name}, which /metrics does not export"
        );
    }
    for required in [
        "chime_fire_lateness_seconds_bucket",
        "chime_fire_publish_offset_seconds_bucket",
        "chime_queue_depth",
        "chime_parking_lot_depth",
        "chime_is_leader",
        "chime_leader_term",
        "chime_workers_online",
        "chime_publish_confirm_seconds_bucket",
    ] {
        assert!(
            used.contains(required),
            "the dashboard does not show {required}"
        );
    }
}

fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}
