//! The dashboard's read-only views through the router against a real database: the schedule
//! preview and the runs-over-time timeline.

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

#[sqlx::test(migrations = "../migrations")]
async fn the_timeline_counts_runs_per_bucket_and_state(pool: PgPool) {
    let app = app(pool).await;
    let viewer = app.token(Role::Viewer).await;
    // Runs created 2 min, 30 min (three) and 2 h ago, in several states.
    let mut created = Vec::new();
    for (ago, state) in [
        ("2 minutes", "succeeded"),
        ("30 minutes", "succeeded"),
        ("30 minutes", "failed"),
        ("30 minutes", "succeeded"),
        ("2 hours", "dead"),
    ] {
        let at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, created_at)
             VALUES ('j', 'g', now(), 'manual', $1, now() - $2::interval) RETURNING created_at",
        )
        .bind(state)
        .bind(ago)
        .fetch_one(&app.pool)
        .await
        .expect("insert");
        created.push((at, state));
    }
    let (status, body) = app
        .call(Method::GET, "/api/overview/timeline", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["bucket_seconds"], 60);
    assert_eq!(body["states"][0], "pending");
    let buckets = body["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 60);
    let start = |b: &Value| {
        chrono::DateTime::parse_from_rfc3339(b["start"].as_str().expect("start"))
            .expect("RFC 3339")
            .to_utc()
    };
    assert_eq!(
        start(&buckets[0]).timestamp() % 60,
        0,
        "aligned to the minute"
    );
    assert_eq!(body["from"], buckets[0]["start"]);
    // Each run is in the bucket its creation falls in; the one of 2 h ago in none.
    let mut expected = std::collections::BTreeMap::<usize, Value>::new();
    for (at, state) in &created[..4] {
        let index = buckets
            .iter()
            .position(|b| start(b) <= *at && *at < start(b) + chrono::Duration::seconds(60))
            .unwrap_or_else(|| panic!("a bucket for {at}: {body}"));
        let counts = expected.entry(index).or_insert_with(|| json!({}));
        counts[*state] = json!(counts[*state].as_i64().unwrap_or(0) + 1);
    }
    for (i, bucket) in buckets.iter().enumerate() {
        let want = expected.get(&i).cloned().unwrap_or_else(|| json!({}));
        assert_eq!(bucket["counts"], want, "bucket {i}: {body}");
        let total: i64 = want
            .as_object()
            .expect("counts")
            .values()
            .filter_map(Value::as_i64)
            .sum();
        assert_eq!(bucket["total"], total, "bucket {i}");
    }
    // A day in hours holds the run of 2 h ago too.
    let (status, body) = app
        .call(
            Method::GET,
            "/api/overview/timeline?window=24h&bucket=1h",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let buckets = body["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 24);
    let sum: i64 = buckets.iter().filter_map(|b| b["total"].as_i64()).sum();
    assert_eq!(sum, 5, "{body}");

    for (query, field) in [
        ("window=7days", "window"),
        ("bucket=0s", "bucket"),
        ("bucket=2h", "bucket"),
        ("window=24h&bucket=1s", "bucket"),
        ("window=soon", "window"),
        ("size=5", "size"),
    ] {
        let (status, body) = app
            .call(
                Method::GET,
                &format!("/api/overview/timeline?{query}"),
                Some(&viewer),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(
            body["error"]["problems"][0]["field"], field,
            "{query}: {body}"
        );
    }
}
