//! Handlers of the read-only views the dashboard needs beyond listing: the schedule preview, one
//! parked message in full, and runs by state over time.
//! Part of [`crate::api`]; the routes are in its router.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;

use super::{ApiError, ApiResult, ApiState, Authed, Params, body_json, ok, run_id};

pub(super) async fn preview_schedule(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let fields = body_json(&body)?;
    ok(s.ops
        .preview_schedule(&c, fields, chrono::Utc::now())
        .await?)
}

pub(super) async fn show_dead_letter(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    ok(s.ops.dead_letter_message(&c, run_id(&id)?).await?)
}

pub(super) async fn run_timeline(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["window", "bucket"], &mut problems);
    let window = q.duration("window", Duration::from_secs(3600), &mut problems);
    let bucket = q.duration("bucket", Duration::from_secs(60), &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    ok(s.ops
        .run_timeline(&c, window, bucket, chrono::Utc::now())
        .await?)
}
