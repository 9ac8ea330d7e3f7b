//! The dashboard's read-only views through the router against a real database: the schedule
//! preview.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;

#[sqlx::test(migrations = "../migrations")]
async fn a_schedule_preview_lists_five_fires_in_every_dialect_and_saves_nothing(pool: PgPool) {
    let app = app(pool).await;
    let viewer = app.token(Role::Viewer).await;
    let preview = |body: Value| {
        let (app, viewer) = (&app, &viewer);
        async move {
            app.call(
                Method::POST,
                "/api/schedules/preview",
                Some(viewer),
                Some(body),
            )
            .await
        }
    };

    // Quartz (1 = Sunday, so 2-6 is Monday to Friday) in a zone: five weekday 09:30 fires.
    let (status, body) = preview(json!({
        "schedule": "0 30 9 ? * 2-6", "timezone": "Europe/Berlin"
    }))
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["schedule"], "cron \"0 30 9 ? * 2-6\" (Europe/Berlin)");
    assert_eq!(body["timezone"], "Europe/Berlin");
    let local = body["upcoming_local"].as_array().expect("local times");
    assert_eq!(local.len(), 5, "{body}");
    for t in local {
        let t = chrono::DateTime::parse_from_rfc3339(t.as_str().expect("text")).expect("RFC 3339");
        let berlin = t.with_timezone(&chrono_tz::Europe::Berlin);
        assert_eq!(berlin.format("%H:%M:%S").to_string(), "09:30:00", "{body}");
        use chrono::Datelike as _;
        assert!(berlin.weekday().number_from_monday() <= 5, "{body}");
    }
    assert_eq!(body["upcoming"].as_array().expect("UTC").len(), 5);
    assert_eq!(body["none_because"], Value::Null);

    // Unix 5-field, 6-field with seconds, a macro, a fixed rate.
    for (fields, minute_second) in [
        (json!({"schedule": "*/15 * * * *"}), None),
        (json!({"schedule": "30 0 * * * *"}), Some(":00:30Z")),
        (json!({"schedule": "@hourly"}), Some(":00:00Z")),
        (json!({"every": "90s"}), None),
    ] {
        let (status, body) = preview(fields.clone()).await;
        assert_eq!(status, StatusCode::OK, "{fields}: {body}");
        let upcoming = body["upcoming"].as_array().expect("upcoming");
        assert_eq!(upcoming.len(), 5, "{fields}: {body}");
        if let Some(suffix) = minute_second {
            assert!(
                upcoming
                    .iter()
                    .all(|t| t.as_str().expect("text").ends_with(suffix)),
                "{fields}: {body}"
            );
        }
    }
    // A one-shot instant in the past, and no schedule at all: no fire, and why.
    let (_, body) = preview(json!({"at": "2020-01-01T00:00:00Z"})).await;
    assert_eq!(body["upcoming"], json!([]));
    assert_eq!(body["none_because"], "its one-shot instant has passed");
    let (_, body) = preview(json!({})).await;
    assert_eq!(body["schedule"], "manual");
    assert_eq!(body["none_because"], "manual only: runs when triggered");

    // Mistakes come back as `chime check` states them: field, value, fix, all at once.
    let (status, body) = preview(json!({
        "schedule": "0 9 * * MON", "timezone": "Europe/Berln"
    }))
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["message"],
        "field \"timezone\" = \"Europe/Berln\": unknown time zone; use an IANA name such as \
         \"Europe/Berlin\""
    );
    assert_eq!(body["error"]["problems"][0]["field"], "timezone");
    let (status, body) = preview(json!({"schedule": "61 * * * *", "every": "0s"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let fields: Vec<&Value> = body["error"]["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .map(|p| &p["field"])
        .collect();
    assert!(fields.contains(&&json!("schedule")), "{body}");
    assert!(fields.contains(&&json!(null)), "both set: {body}");
    let (status, body) = preview(json!({"schedule": "@daily", "name": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "name", "{body}");
    let (status, _) = preview(json!("0 9 * * *")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Nothing was saved, and previews are not operator actions (no audit entries).
    assert_eq!(app.count("SELECT count(*) FROM chime_jobs").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM chime_audit WHERE action <> 'tokens.create'")
            .await,
        0
    );
    let (status, _) = app
        .call(
            Method::POST,
            "/api/schedules/preview",
            None,
            Some(json!({"schedule": "@daily"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
