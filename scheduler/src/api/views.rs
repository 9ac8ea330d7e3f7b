//! Handlers of the read-only views the dashboard needs beyond listing: the schedule preview.
//! Part of [`crate::api`]; the routes are in its router.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;

use super::{ApiResult, ApiState, Authed, body_json, ok};

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
