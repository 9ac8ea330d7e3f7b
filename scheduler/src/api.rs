//! The HTTP face of every scheduler instance: the JSON REST API under `/api` (described by the
//! OpenAPI document at `/api/openapi.json`), health probes, `/metrics` and the web dashboard
//! at `/` ([`crate::dashboard`]).
//!
//! Handlers are thin: they parse the request, call [`Operations`] with the caller the bearer
//! token identifies, and render the result. Authorization is decided in [`crate::ops`], never
//! here. Every `/api` request needs `Authorization: Bearer SECRET` (a token from
//! `chime tokens create`), except the OpenAPI document; the API takes no cookies, so a browser
//! cannot be tricked into sending a request with the caller's rights (no CSRF surface).
//!
//! Errors are JSON: `{"error": {"status": 400, "message": "…", "problems": [{"field", "value",
//! "message"}]}}`. A 500 body never carries internals; the error is logged with a request id
//! that the body names.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chime_protocol::addresses::Addresses;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::auth::{Caller, Role};
use crate::leader::Leadership;
use crate::ops::{
    BackfillListQuery, BackfillRequest, Broker, FieldProblem, MAX_PAGE, Operations, OpsError,
    TASK_PAGE, TriggerOptions,
};
use crate::store::{AuditQuery, RunQuery, Store};

/// The OpenAPI 3.1 document, hand-written next to the router (a test checks that both name the
/// same routes).
pub const OPENAPI: &str = include_str!("api/openapi.json");

/// Default page size of runs and audit entries.
const DEFAULT_PAGE: i64 = 50;

/// What the handlers share.
#[derive(Debug)]
pub struct ApiState {
    /// The operations.
    pub ops: Operations,
    /// This instance's id (shown by `/api/leader`).
    pub instance_id: String,
    /// Extra checks `/readyz` runs besides the database (the broker).
    pub readiness: Readiness,
    /// Renders `/metrics`.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

/// How `/readyz` checks the broker, and its last answer.
#[derive(Debug, Default)]
pub struct Readiness {
    /// The broker addresses to open a connection to (any one that accepts will do); none: the
    /// broker is not checked.
    pub amqp_urls: Option<Addresses>,
    /// TLS options of an `amqps://` URL.
    pub amqp_tls: chime_protocol::tls::AmqpTls,
    /// The last answer and when it was found. Held while a check runs, so concurrent probes
    /// wait for that one check instead of each opening connections.
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, StatusCode, Value)>>,
}

impl Readiness {
    /// Checks the database and the broker at `amqp_urls` (with `amqp_tls` for `amqps://`).
    pub fn with_broker(
        amqp_urls: impl Into<Addresses>,
        amqp_tls: chime_protocol::tls::AmqpTls,
    ) -> Readiness {
        Readiness {
            amqp_urls: Some(amqp_urls.into()),
            amqp_tls,
            ..Readiness::default()
        }
    }
}

/// How long a `/readyz` answer is reused: an unauthenticated flood of probes costs one database
/// ping and one broker connection per period, not one per request.
pub const READY_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

/// Largest request body the API reads (a job definition with its params fits many times over);
/// a larger one is refused with 413 in the JSON error shape.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The router: `/api/…`, `/healthz`, `/readyz`, `/metrics` and the dashboard at `/`.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/api/openapi.json", get(openapi))
        .route("/api/me", get(me))
        .route("/api/overview", get(overview))
        .route("/api/overview/timeline", get(views::run_timeline))
        .route("/api/jobs", get(list_jobs).post(create_job))
        .route(
            "/api/jobs/{name}",
            get(show_job).patch(update_job).delete(delete_job),
        )
        .route("/api/jobs/{name}/pause", post(pause_job))
        .route("/api/jobs/{name}/resume", post(resume_job))
        .route("/api/jobs/{name}/trigger", post(trigger_job))
        .route("/api/jobs/{name}/report", get(views::job_report))
        .route("/api/jobs/{name}/versions", get(job_versions))
        .route("/api/jobs/{name}/rollback", post(rollback_job))
        .route("/api/jobs/{name}/backfills", post(backfill_job))
        .route("/api/backfills", get(list_backfills))
        .route("/api/backfills/{id}", get(show_backfill))
        .route("/api/backfills/{id}/cancel", post(cancel_backfill))
        .route("/api/schedules/preview", post(views::preview_schedule))
        .route("/api/runs", get(list_runs))
        .route("/api/runs/{id}", get(show_run))
        .route("/api/runs/{id}/cancel", post(cancel_run))
        .route("/api/runs/{id}/tasks", get(list_tasks))
        .route("/api/runs/{id}/retry-failed", post(retry_failed))
        .route("/api/workflows", get(list_workflows))
        .route("/api/workflows/{name}", get(show_workflow))
        .route("/api/workflows/{name}/runs", get(list_workflow_runs))
        .route("/api/workflows/runs/{id}", get(show_workflow_run))
        .route("/api/workflows/runs/{id}/rerun", post(rerun_workflow))
        .route("/api/workflows/runs/{id}/cancel", post(cancel_workflow_run))
        .route("/api/workers", get(list_workers))
        .route("/api/queues", get(list_queues))
        .route("/api/dead-letters", get(list_dead_letters))
        .route("/api/dead-letters/replay", post(replay_all))
        .route("/api/dead-letters/purge", post(purge))
        .route("/api/dead-letters/{id}/replay", post(replay))
        .route("/api/dead-letters/{id}", get(views::show_dead_letter))
        .route("/api/leader", get(leader))
        .route("/api/audit", get(audit))
        .route("/api/tokens", get(list_tokens).post(create_token))
        .route("/api/tokens/{name}", axum::routing::delete(revoke_token))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::dashboard::router())
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state)
}

/// Refuses an address beyond loopback while no API token exists: the API would be exposed with
/// nobody able to use it, which is always a setup mistake (and with tokens created later from
/// the database side, the operator decides who gets in, never a default).
pub async fn check_exposure(bind: SocketAddr, ops: &Operations) -> anyhow::Result<()> {
    if bind.ip().is_loopback() || ops.store().any_active_token().await? {
        return Ok(());
    }
    anyhow::bail!(
        "bind = {bind} listens beyond loopback, but no API token exists, so the API has no \
         authentication configured; create one first with `chime tokens create --role admin \
         --name NAME`, or set bind to a loopback address such as 127.0.0.1:8080"
    )
}

/// A scheduler instance's HTTP server, bound and ready to serve.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    state: Arc<ApiState>,
}

impl Server {
    /// Checks the exposure rule ([`check_exposure`]) and binds `bind`, for the instance
    /// `instance_id` whose operations go to `broker` (its readiness probe connects there too)
    /// and whose elector reports through `leadership`.
    pub async fn bind(
        bind: SocketAddr,
        store: &Store,
        instance_id: &str,
        broker: Broker,
        leadership: watch::Receiver<Leadership>,
    ) -> anyhow::Result<Server> {
        let readiness = Readiness::with_broker(broker.amqp_urls.clone(), broker.amqp_tls.clone());
        let ops = Operations::new(store.clone(), Some(broker.clone()));
        check_exposure(bind, &ops).await?;
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .with_context(|| format!("listening on bind = {bind} for the API"))?;
        let metrics = crate::metrics::Metrics::new(Some(leadership), Some(broker))?;
        tracing::info!(address = %listener.local_addr()?, "API, health and /metrics listening");
        Ok(Server {
            listener,
            state: Arc::new(ApiState {
                ops,
                instance_id: instance_id.to_owned(),
                readiness,
                metrics: Some(Arc::new(metrics)),
            }),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown`, then closes the broker connection the operations share.
    pub async fn serve(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let state = self.state.clone();
        let served = axum::serve(self.listener, router(self.state))
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        state.ops.close().await;
        served
    }
}

// ---- errors ---------------------------------------------------------------------------------

/// An API error: a status and a JSON body naming what is wrong and how to fix it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    problems: Vec<FieldProblem>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            problems: Vec::new(),
        }
    }

    fn invalid(problems: Vec<FieldProblem>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            problems,
        }
    }

    fn unauthenticated(message: &str) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
    }
}

impl From<OpsError> for ApiError {
    fn from(e: OpsError) -> ApiError {
        match e {
            OpsError::Forbidden { .. } => ApiError::new(StatusCode::FORBIDDEN, e.to_string()),
            OpsError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, m),
            OpsError::Invalid(problems) => ApiError::invalid(problems),
            OpsError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, m),
            OpsError::Unavailable(m) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m),
            OpsError::Internal(e) => {
                static NEXT: AtomicU64 = AtomicU64::new(1);
                let id = NEXT.fetch_add(1, Ordering::Relaxed);
                tracing::error!(request_error = id, error = %format!("{e:#}"), "API request failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "internal error {id}; the scheduler's log has the details \
                         (request_error={id})"
                    ),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "status": self.status.as_u16(),
            "message": self.message,
            "problems": self.problems,
        }});
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn ok<T: Serialize>(value: T) -> ApiResult<axum::Json<T>> {
    Ok(axum::Json(value))
}

// ---- authentication -------------------------------------------------------------------------

/// The caller, from `Authorization: Bearer SECRET`.
pub struct Authed(pub Caller);

impl FromRequestParts<Arc<ApiState>> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(ApiError::unauthenticated(
                "no API token; send `Authorization: Bearer SECRET` with a token from \
                 `chime tokens create --role viewer --name NAME`",
            ));
        };
        let secret = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ApiError::unauthenticated(
                    "the Authorization header is not `Bearer SECRET`; send the token's secret \
                     after \"Bearer \"",
                )
            })?;
        match state.ops.authenticate(secret).await? {
            Some(caller) => Ok(Authed(caller)),
            None => Err(ApiError::unauthenticated(
                "unknown or revoked API token; create one with `chime tokens create`",
            )),
        }
    }
}

// ---- request parsing ------------------------------------------------------------------------

/// A JSON body; an empty body is `null`.
fn body_json(body: &Bytes) -> ApiResult<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(vec![FieldProblem {
            field: None,
            value: Some(String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned()),
            message: format!(
                "the body is not JSON ({e}); send a JSON object with Content-Type: \
                 application/json"
            ),
        }])
    })
}

struct Params(HashMap<String, String>);

impl Params {
    fn text(&self, key: &str) -> Option<String> {
        self.0.get(key).filter(|v| !v.is_empty()).cloned()
    }

    fn number(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<i64> {
        let text = self.text(key)?;
        match text.parse() {
            Ok(n) => Some(n),
            Err(_) => {
                problems.push(FieldProblem {
                    field: Some(key.to_owned()),
                    value: Some(format!("{text:?}")),
                    message: "not a whole number; give one such as 50".into(),
                });
                None
            }
        }
    }

    /// A yes/no parameter (`true` or `false`); false when absent.
    fn flag(&self, key: &str, problems: &mut Vec<FieldProblem>) -> bool {
        match self.text(key).as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                problems.push(FieldProblem {
                    field: Some(key.to_owned()),
                    value: Some(format!("{other:?}")),
                    message: "use true or false".into(),
                });
                false
            }
        }
    }

    /// A duration parameter ("5m", "1h"); `default` when absent.
    fn duration(
        &self,
        key: &str,
        default: std::time::Duration,
        problems: &mut Vec<FieldProblem>,
    ) -> std::time::Duration {
        let Some(text) = self.text(key) else {
            return default;
        };
        humantime::parse_duration(&text).unwrap_or_else(|_| {
            problems.push(FieldProblem {
                field: Some(key.to_owned()),
                value: Some(format!("{text:?}")),
                message: "not a duration; write one such as \"1h\" or \"24h\"".into(),
            });
            std::time::Duration::ZERO
        })
    }

    fn reject_unknown(&self, known: &[&str], problems: &mut Vec<FieldProblem>) {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        for key in keys {
            if !known.contains(&key.as_str()) {
                problems.push(FieldProblem {
                    field: Some(key.clone()),
                    value: Some(format!("{:?}", self.0[key])),
                    message: format!("unknown query parameter; use {}", known.join(", ")),
                });
            }
        }
    }
}

fn run_id(text: &str) -> ApiResult<i64> {
    path_id(text, "a run id is a whole number, such as /api/runs/42")
}

fn backfill_id(text: &str) -> ApiResult<i64> {
    path_id(
        text,
        "a backfill id is a whole number, such as /api/backfills/7",
    )
}

/// The `{id}` of a path, or a 400 naming it with `message`.
fn path_id(text: &str, message: &str) -> ApiResult<i64> {
    text.parse().map_err(|_| {
        ApiError::invalid(vec![FieldProblem {
            field: Some("id".into()),
            value: Some(format!("{text:?}")),
            message: message.into(),
        }])
    })
}

// ---- handlers -------------------------------------------------------------------------------

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI.to_owned(),
    )
        .into_response()
}

async fn me(Authed(caller): Authed) -> ApiResult<axum::Json<Value>> {
    ok(json!({"actor": caller.actor, "role": caller.role}))
}

async fn overview(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["window"], &mut problems);
    let window = q.duration(
        "window",
        std::time::Duration::from_secs(3600),
        &mut problems,
    );
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    ok(s.ops.overview(&c, window).await?)
}

async fn list_jobs(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
) -> ApiResult<impl IntoResponse> {
    ok(json!({"jobs": s.ops.jobs(&c).await?}))
}

async fn create_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let definition = body_json(&body)?;
    let job = s.ops.create_job(&c, definition).await?;
    Ok((StatusCode::CREATED, axum::Json(job)))
}

async fn show_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.job(&c, &name).await?)
}

async fn update_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let changes = body_json(&body)?;
    ok(s.ops.update_job(&c, &name, changes).await?)
}

async fn delete_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    s.ops.delete_job(&c, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.set_paused(&c, &name, true).await?)
}

async fn resume_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.set_paused(&c, &name, false).await?)
}

async fn job_versions(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.job_history(&c, &name).await?)
}

async fn rollback_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    const SHAPE: &str = "the body is {\"to\": N}, N the version to put back (GET \
                         /api/jobs/NAME/versions lists them)";
    let problem = |field: Option<&str>, value: &Value| {
        ApiError::invalid(vec![FieldProblem {
            field: field.map(str::to_owned),
            value: Some(value.to_string()),
            message: SHAPE.to_owned(),
        }])
    };
    let body = body_json(&body)?;
    let Value::Object(map) = &body else {
        return Err(problem(None, &body));
    };
    if let Some(key) = map.keys().find(|k| k.as_str() != "to") {
        return Err(problem(Some(key), &map[key]));
    }
    let to = map.get("to").unwrap_or(&Value::Null);
    let Some(version) = to
        .as_i64()
        .and_then(|n| i32::try_from(n).ok())
        .filter(|n| *n > 0)
    else {
        return Err(problem(Some("to"), to));
    };
    ok(s.ops.rollback_job(&c, &name, version).await?)
}

async fn trigger_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    const SHAPE: &str = "the body is {\"params\": {…}, \"at\": \"<RFC 3339 instant>\", \"idempotency_key\": \"…\"} \
         (each optional) or empty";
    let mut options = TriggerOptions::default();
    match body_json(&body)? {
        Value::Null => {}
        Value::Object(mut map) => {
            if let Some(key) = map
                .keys()
                .find(|k| !["params", "at", "idempotency_key"].contains(&k.as_str()))
            {
                return Err(ApiError::invalid(vec![FieldProblem {
                    field: Some(key.clone()),
                    value: Some(map[key].to_string()),
                    message: format!("unknown field; {SHAPE}"),
                }]));
            }
            options.params = map.remove("params").filter(|p| !p.is_null());
            let mut problems = Vec::new();
            match map.remove("at") {
                None | Some(Value::Null) => {}
                Some(Value::String(at)) => match DateTime::parse_from_rfc3339(&at) {
                    Ok(at) => options.at = Some(at.with_timezone(&Utc)),
                    Err(e) => problems.push(FieldProblem {
                        field: Some("at".into()),
                        value: Some(format!("{at:?}")),
                        message: format!(
                            "not an RFC 3339 instant ({e}); write one such as \
                             \"2026-12-01T09:30:00Z\""
                        ),
                    }),
                },
                Some(other) => problems.push(FieldProblem {
                    field: Some("at".into()),
                    value: Some(other.to_string()),
                    message: "must be a string holding an RFC 3339 instant, such as \
                              \"2026-12-01T09:30:00Z\""
                        .into(),
                }),
            }
            match map.remove("idempotency_key") {
                None | Some(Value::Null) => {}
                Some(Value::String(key)) => options.idempotency_key = Some(key),
                Some(other) => problems.push(FieldProblem {
                    field: Some("idempotency_key".into()),
                    value: Some(other.to_string()),
                    message: "must be a string of 1 to 200 bytes, such as an order id".into(),
                }),
            }
            if !problems.is_empty() {
                return Err(ApiError::invalid(problems));
            }
        }
        other => {
            return Err(ApiError::invalid(vec![FieldProblem {
                field: None,
                value: Some(other.to_string()),
                message: SHAPE.into(),
            }]));
        }
    }
    let triggered = s.ops.trigger_with(&c, &name, options).await?;
    // 200 for a repeated idempotency key: nothing new was made.
    let status = if triggered.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(triggered)))
}

async fn backfill_job(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let request = backfill_request(&body_json(&body)?)?;
    if request.dry_run {
        return Ok(axum::Json(s.ops.preview_backfill(&c, &name, &request).await?).into_response());
    }
    let started = s.ops.start_backfill(&c, &name, &request).await?;
    Ok((StatusCode::CREATED, axum::Json(started)).into_response())
}

/// A backfill's body, each mistake naming its field (the bounds are checked by the operation).
fn backfill_request(body: &Value) -> ApiResult<BackfillRequest> {
    const SHAPE: &str = "the body is {\"from\": \"<RFC 3339 or YYYY-MM-DD>\", \"to\": \"…\", \
         \"parallel\": N, \"rate\": N, \"dry_run\": true} (parallel, rate and dry_run optional)";
    let problem = |field: Option<&str>, value: &Value, message: &str| FieldProblem {
        field: field.map(str::to_owned),
        value: Some(value.to_string()),
        message: message.to_owned(),
    };
    let Value::Object(map) = body else {
        return Err(ApiError::invalid(vec![problem(None, body, SHAPE)]));
    };
    let mut request = BackfillRequest::default();
    let mut problems = Vec::new();
    for (key, value) in map {
        match (key.as_str(), value) {
            ("from", Value::String(text)) => request.from.clone_from(text),
            ("to", Value::String(text)) => request.to.clone_from(text),
            ("from" | "to", _) => problems.push(problem(
                Some(key),
                value,
                "must be a string: an RFC 3339 instant such as \"2026-11-01T00:00:00Z\", or a \
                 date such as \"2026-11-01\"",
            )),
            ("parallel" | "rate", Value::Null) => {}
            ("parallel" | "rate", _) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if key == "parallel" => request.parallel = Some(n),
                Some(n) => request.rate = Some(n),
                None => problems.push(problem(
                    Some(key),
                    value,
                    "must be a whole number: runs at once from 1 to 100 (parallel), runs per \
                     second from 1 to 1000 (rate)",
                )),
            },
            ("dry_run", Value::Bool(dry)) => request.dry_run = *dry,
            ("dry_run", _) => problems.push(problem(Some(key), value, "must be true or false")),
            _ => problems.push(problem(
                Some(key),
                value,
                &format!("unknown field; {SHAPE}"),
            )),
        }
    }
    for field in ["from", "to"] {
        if !map.contains_key(field) {
            problems.push(FieldProblem {
                field: Some(field.into()),
                value: None,
                message: format!("missing; {SHAPE}"),
            });
        }
    }
    if problems.is_empty() {
        Ok(request)
    } else {
        Err(ApiError::invalid(problems))
    }
}

async fn list_backfills(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["job", "state", "before", "limit"], &mut problems);
    let query = BackfillListQuery {
        job: q.text("job"),
        state: q.text("state"),
        before: q.number("before", &mut problems),
        limit: q.number("limit", &mut problems),
    };
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    ok(s.ops.backfills(&c, query).await?)
}

async fn show_backfill(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.backfill(&c, backfill_id(&id)?).await?)
}

async fn cancel_backfill(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.cancel_backfill(&c, backfill_id(&id)?).await?)
}

async fn list_runs(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(
        &[
            "job", "state", "group", "before", "limit", "tasks", "backfill",
        ],
        &mut problems,
    );
    let query = RunQuery {
        job: q.text("job"),
        state: q.text("state"),
        group: q.text("group"),
        before: q.number("before", &mut problems),
        limit: q.number("limit", &mut problems).unwrap_or(DEFAULT_PAGE),
        include_tasks: q.flag("tasks", &mut problems),
        backfill: q.number("backfill", &mut problems),
    };
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    ok(s.ops.runs(&c, query).await?)
}

async fn show_run(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.run(&c, run_id(&id)?).await?)
}

async fn cancel_run(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.cancel_run(&c, run_id(&id)?).await?)
}

async fn list_tasks(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let id = run_id(&id)?;
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["after", "state", "limit"], &mut problems);
    let after = q.number("after", &mut problems);
    let limit = q.number("limit", &mut problems).unwrap_or(TASK_PAGE);
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    ok(s.ops.tasks(&c, id, after, q.text("state"), limit).await?)
}

async fn retry_failed(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.retry_failed(&c, run_id(&id)?).await?)
}

async fn list_workflows(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
) -> ApiResult<impl IntoResponse> {
    ok(json!({"workflows": s.ops.workflows(&c).await?}))
}

async fn show_workflow(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.workflow(&c, &name).await?)
}

/// A workflow's runs: the runs of its job (`/api/runs?job=NAME`), once the name is known to be
/// a workflow's.
async fn list_workflow_runs(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["state", "before", "limit"], &mut problems);
    let query = RunQuery {
        job: Some(name.clone()),
        state: q.text("state"),
        before: q.number("before", &mut problems),
        limit: q.number("limit", &mut problems).unwrap_or(DEFAULT_PAGE),
        ..RunQuery::default()
    };
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    s.ops.workflow(&c, &name).await?;
    ok(s.ops.runs(&c, query).await?)
}

async fn show_workflow_run(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.workflow_run(&c, run_id(&id)?).await?)
}

/// `{"node": "clean"}`: rerun the workflow run from that node.
async fn rerun_workflow(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let id = run_id(&id)?;
    let body = body_json(&body)?;
    let node = match body.get("node") {
        Some(Value::String(node)) if crate::config::identifier_problem(node).is_none() => {
            node.clone()
        }
        other => {
            return Err(ApiError::invalid(vec![FieldProblem {
                field: Some("node".to_owned()),
                value: other.map(Value::to_string),
                message: "give the name of the node to rerun from, such as {\"node\": \"clean\"}"
                    .to_owned(),
            }]));
        }
    };
    ok(s.ops.rerun_workflow(&c, id, &node).await?)
}

async fn cancel_workflow_run(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.cancel_workflow_run(&c, run_id(&id)?).await?)
}

async fn list_workers(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
) -> ApiResult<impl IntoResponse> {
    ok(json!({"workers": s.ops.workers(&c).await?}))
}

async fn list_queues(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.queues(&c).await?)
}

async fn list_dead_letters(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["group", "after", "limit"], &mut problems);
    let limit = q.number("limit", &mut problems).unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        problems.push(FieldProblem {
            field: Some("limit".into()),
            value: Some(limit.to_string()),
            message: format!("use a number from 1 to {MAX_PAGE}"),
        });
    }
    let after = q.number("after", &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    let page = s
        .ops
        .dead_letters(&c, q.text("group"), after, limit as usize)
        .await?;
    ok(page)
}

async fn replay(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.replay(&c, run_id(&id)?).await?)
}

fn group_param(q: HashMap<String, String>) -> ApiResult<Option<String>> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["group"], &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    Ok(q.text("group"))
}

async fn replay_all(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.replay_all(&c, group_param(q)?).await?)
}

async fn purge(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    ok(json!({"purged": s.ops.purge(&c, group_param(q)?).await?}))
}

async fn leader(State(s): State<Arc<ApiState>>, Authed(c): Authed) -> ApiResult<impl IntoResponse> {
    let lease = s.ops.leader(&c).await?;
    ok(json!({
        "instance": lease.holder.clone().filter(|_| lease.active),
        "term": lease.term,
        "since": lease.elected_at.filter(|_| lease.active),
        "expires_at": lease.expires_at,
        "active": lease.active,
        "this_instance": s.instance_id,
        "this_instance_leads": lease.active && lease.holder.as_deref() == Some(s.instance_id.as_str()),
    }))
}

async fn audit(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["job", "actor", "before", "limit"], &mut problems);
    let query = AuditQuery {
        job: q.text("job"),
        actor: q.text("actor"),
        before: q.number("before", &mut problems),
        limit: q.number("limit", &mut problems).unwrap_or(DEFAULT_PAGE),
    };
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    ok(s.ops.audit(&c, query).await?)
}

async fn list_tokens(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
) -> ApiResult<impl IntoResponse> {
    ok(json!({"tokens": s.ops.tokens(&c).await?}))
}

async fn create_token(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let body = body_json(&body)?;
    let mut problems = Vec::new();
    let name = body.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        problems.push(FieldProblem {
            field: Some("name".into()),
            value: body.get("name").map(Value::to_string),
            message: "missing; name the token after who uses it, such as \"grafana\"".into(),
        });
    }
    let role = body
        .get("role")
        .and_then(Value::as_str)
        .and_then(Role::parse);
    if role.is_none() {
        problems.push(FieldProblem {
            field: Some("role".into()),
            value: body.get("role").map(Value::to_string),
            message: "use \"viewer\", \"operator\" or \"admin\"".into(),
        });
    }
    let Some(role) = role.filter(|_| problems.is_empty()) else {
        return Err(ApiError::invalid(problems));
    };
    let token = s.ops.create_token(&c, name, role).await?;
    Ok((StatusCode::CREATED, axum::Json(token)))
}

async fn revoke_token(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    s.ops.revoke_token(&c, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn readyz(State(s): State<Arc<ApiState>>) -> Response {
    let mut last = s.readiness.last.lock().await;
    let (status, body) = match &*last {
        Some((at, status, body)) if at.elapsed() < READY_CACHE => (*status, body.clone()),
        _ => {
            let (status, body) = check_readiness(&s).await;
            *last = Some((tokio::time::Instant::now(), status, body.clone()));
            (status, body)
        }
    };
    drop(last);
    (status, axum::Json(body)).into_response()
}

/// One readiness check: the database answers a ping within 2 s and the broker accepts a
/// connection.
async fn check_readiness(s: &ApiState) -> (StatusCode, Value) {
    let database =
        match tokio::time::timeout(std::time::Duration::from_secs(2), s.ops.store().ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{e:#}")),
            Err(_) => Err("no answer within 2s".to_owned()),
        };
    let broker = match &s.readiness.amqp_urls {
        None => None,
        Some(urls) => Some(crate::parking::ping(urls, &s.readiness.amqp_tls).await),
    };
    let ready = database.is_ok() && broker.as_ref().is_none_or(Result::is_ok);
    let check = |r: &Result<(), String>| match r {
        Ok(()) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "error": e}),
    };
    let body = json!({
        "status": if ready { "ready" } else { "unavailable" },
        "database": check(&database),
        "broker": broker.as_ref().map(check),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

/// Gives every error response the API's JSON shape: axum's own rejections (a body over
/// [`MAX_BODY_BYTES`], a path or query that is not valid UTF-8 or not the expected type, a wrong
/// method) answer in plain text, which clients of a JSON API cannot read.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("the request body is larger than {MAX_BODY_BYTES} bytes; send a smaller body")
        }
        StatusCode::METHOD_NOT_ALLOWED => {
            "this endpoint does not take that method; the API is described at \
             /api/openapi.json"
                .to_owned()
        }
        _ if text.is_empty() => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_owned(),
        _ => text,
    };
    let mut response = ApiError::new(status, message).into_response();
    if let Some(allow) = allow {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}

async fn metrics(State(s): State<Arc<ApiState>>) -> Response {
    match &s.metrics {
        Some(metrics) => match metrics.render(s.ops.store()).await {
            Ok(text) => {
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
            }
            Err(e) => ApiError::from(OpsError::Internal(e)).into_response(),
        },
        None => ApiError::new(StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such endpoint; the API is described at /api/openapi.json",
    )
}

mod views;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_backfills;
#[cfg(test)]
mod tests_children;
#[cfg(test)]
mod tests_hostile;
#[cfg(test)]
mod tests_params;
#[cfg(test)]
mod tests_tasks;
#[cfg(test)]
mod tests_versions;
#[cfg(test)]
mod tests_views;
#[cfg(test)]
mod tests_warnings;
#[cfg(test)]
mod tests_workflows;
