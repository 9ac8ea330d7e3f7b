//! Handlers of the read-only views the dashboard needs beyond listing: the schedule preview, one
//! parked message in full, runs by state over time, and a job's report (runs per day).
//! Part of [`crate::api`]; the routes are in its router.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;

use super::{ApiError, ApiResult, ApiState, Authed, Params, body_json, ok, run_id};
use crate::ops::{FieldProblem, REPORT_DAYS};

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

pub(super) async fn job_report(
    State(s): State<Arc<ApiState>>,
    Authed(c): Authed,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let q = Params(q);
    let mut problems = Vec::new();
    q.reject_unknown(&["days"], &mut problems);
    let (fewest, most) = REPORT_DAYS;
    let days = match q.text("days") {
        None => Some(14),
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|d| (fewest..=most).contains(d)),
    };
    let Some(days) = days.filter(|_| problems.is_empty()) else {
        if days.is_none() {
            problems.push(FieldProblem {
                field: Some("days".into()),
                value: q.text("days").map(|t| format!("{t:?}")),
                message: format!("use a whole number of days from {fewest} to {most}, such as 14"),
            });
        }
        return Err(ApiError::invalid(problems));
    };
    ok(s.ops
        .job_report(&c, &name, days, chrono::Utc::now())
        .await?)
}
