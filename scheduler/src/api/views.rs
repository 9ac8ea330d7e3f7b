//! Handlers of the read-only views the dashboard needs beyond listing: the schedule preview and
//! one parked message in full.
//! Part of [`crate::api`]; the routes are in its router.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::IntoResponse;

use super::{ApiResult, ApiState, Authed, body_json, ok, run_id};

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
