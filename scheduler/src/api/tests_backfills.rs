//! Backfills through the router against a real database: who may preview, start, list, show
//! and cancel one, and the answers to a malformed request.

use axum::http::{Method, StatusCode};
use chrono::{TimeDelta, Utc};
use serde_json::json;
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;

#[sqlx::test(migrations = "../migrations")]
async fn a_backfill_is_previewed_by_viewers_started_and_cancelled_by_operators(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    let viewer = app.token(Role::Viewer).await;
    let operator = app.token(Role::Operator).await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "hourly", "group": "g", "schedule": "0 0 * * * *"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let now = Utc::now();
    let range = json!({
        "from": (now - TimeDelta::hours(6)).to_rfc3339(),
        "to": now.to_rfc3339(),
        "parallel": 2,
    });
    let mut dry = range.clone();
    dry["dry_run"] = json!(true);

    let (status, preview) = app
        .call(
            Method::POST,
            "/api/jobs/hourly/backfills",
            Some(&viewer),
            Some(dry),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    assert_eq!(preview["fires_total"], 6, "{preview}");
    assert_eq!(preview["fires_to_make"], 6, "{preview}");
    assert_eq!(preview["fires"].as_array().map(Vec::len), Some(6));

    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/hourly/backfills",
            Some(&viewer),
            Some(range.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, started) = app
        .call(
            Method::POST,
            "/api/jobs/hourly/backfills",
            Some(&operator),
            Some(range),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["state"], "running");
    assert_eq!(started["fires_total"], 6);
    assert_eq!(started["parallel"], 2);
    assert_eq!(started["requested_by"], "token:operator-token");
    let id = started["id"].as_i64().expect("an id");

    let (status, page) = app
        .call(
            Method::GET,
            "/api/backfills?job=hourly&state=running",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["backfills"][0]["id"], id, "{page}");
    let (status, shown) = app
        .call(
            Method::GET,
            &format!("/api/backfills/{id}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["progress"], "0/6 fires handled (0 made, 0 existing)");

    let (status, body) = app
        .call(
            Method::POST,
            &format!("/api/backfills/{id}/cancel"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, cancelled) = app
        .call(
            Method::POST,
            &format!("/api/backfills/{id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["job"], "hourly");
    let (status, body) = app
        .call(
            Method::POST,
            &format!("/api/backfills/{id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = app
        .call(Method::GET, "/api/backfills/99", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_malformed_backfill_request_names_its_field(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    app.call(
        Method::POST,
        "/api/jobs",
        Some(&admin),
        Some(json!({"name": "hourly", "group": "g", "schedule": "0 0 * * * *"})),
    )
    .await;
    let cases = [
        (
            json!({"from": "2026-11-01", "to": "2026-11-02", "speed": 3}),
            "speed",
        ),
        (
            json!({"from": "2026-11-01", "to": "2026-11-02", "parallel": 0}),
            "parallel",
        ),
        (json!({"from": "2026-11-01", "to": "next week"}), "to"),
        (
            json!({"from": "2026-11-01", "to": "2026-11-02", "rate": 0}),
            "rate",
        ),
        (
            json!({"from": "2026-11-01", "to": "2026-11-02", "rate": -4}),
            "rate",
        ),
        (json!({"from": 20261101, "to": "2026-11-02"}), "from"),
        (json!({"to": "2026-11-02"}), "from"),
        (
            json!({"from": "2026-11-01", "to": "2026-11-02", "dry_run": "yes"}),
            "dry_run",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = app
            .call(
                Method::POST,
                "/api/jobs/hourly/backfills",
                Some(&admin),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let fields: Vec<_> = answer["error"]["problems"]
            .as_array()
            .expect("problems")
            .iter()
            .filter_map(|p| p["field"].as_str())
            .collect();
        assert!(fields.contains(&field), "{body}: {answer}");
    }
    let (status, answer) = app
        .call(
            Method::GET,
            "/api/backfills?state=paused",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, answer) = app
        .call(Method::GET, "/api/runs?backfill=seven", Some(&admin), None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
}
