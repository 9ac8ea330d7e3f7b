//! The dashboard's read-only views through the router against a real database: the schedule
//! preview, the runs-over-time timeline and a job's report (runs per day).

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
    let (status, body) = preview(json!({"schedule": "@daily", "group": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["problems"][0]["field"], "group", "{body}");

    // Jitter, a window and max_runs: the fires the job of that name will have.
    let timed = json!({"schedule": "0 0 * * *", "jitter": "5m", "name": "nightly",
                       "start_at": "2030-01-01T00:00:00Z", "max_runs": 3});
    let (status, body) = preview(timed.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let spec = crate::config::validate_job(
        json!({"group": "g", "schedule": "0 0 * * *", "jitter": "5m", "name": "nightly",
               "start_at": "2030-01-01T00:00:00Z", "max_runs": 3})
        .as_object()
        .unwrap(),
    )
    .expect("valid");
    let fires: Vec<String> = spec
        .upcoming(&spec.timing().unwrap(), chrono::Utc::now(), 5, 0)
        .iter()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        .collect();
    assert_eq!(fires.len(), 3);
    assert_eq!(body["upcoming"], json!(fires), "{body}");
    assert!(
        body["schedule"]
            .as_str()
            .unwrap()
            .contains("jitter up to 5m"),
        "{body}"
    );
    let mut renamed = timed;
    renamed["name"] = json!("nightly-2");
    let (_, other) = preview(renamed).await;
    assert_ne!(
        other["upcoming"], body["upcoming"],
        "another job, other instants"
    );
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

/// Inserts a finished (or not started) manual run of `job` scheduled at `at`.
async fn seed_run(
    app: &super::tests::App,
    job: &str,
    at: chrono::DateTime<chrono::Utc>,
    state: &str,
    duration_ms: Option<i64>,
) {
    sqlx::query(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, started_at,
                                 finished_at)
         VALUES ($1, 'reports', $2, 'manual', $3, $4, $5)",
    )
    .bind(job)
    .bind(at)
    .bind(state)
    .bind(duration_ms.map(|_| at))
    .bind(duration_ms.map(|ms| at + chrono::Duration::milliseconds(ms)))
    .execute(&app.pool)
    .await
    .expect("seeding a run");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_job_report_counts_runs_per_day_in_the_jobs_zone_with_duration_percentiles(pool: PgPool) {
    use chrono::{Days, TimeZone as _};
    let app = app(pool).await;
    let (admin, viewer) = (app.token(Role::Admin).await, app.token(Role::Viewer).await);
    for name in ["nightly", "other"] {
        let (status, body) = app
            .call(
                Method::POST,
                "/api/jobs",
                Some(&admin),
                Some(json!({"name": name, "group": "reports", "timezone": "Asia/Shanghai"})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let zone = chrono_tz::Asia::Shanghai;
    let today = chrono::Utc::now().with_timezone(&zone).date_naive();
    let at = |day: chrono::NaiveDate, hour: u32, minute: u32| {
        zone.from_local_datetime(&day.and_hms_opt(hour, minute, 0).expect("time"))
            .single()
            .expect("Shanghai has no DST")
            .with_timezone(&chrono::Utc)
    };
    let yesterday = today - Days::new(1);
    // Today: three finished runs of 1, 2 and 3 s, and one dead run that never started.
    seed_run(&app, "nightly", at(today, 0, 1), "succeeded", Some(1000)).await;
    seed_run(&app, "nightly", at(today, 0, 2), "failed", Some(2000)).await;
    seed_run(&app, "nightly", at(today, 0, 3), "succeeded", Some(3000)).await;
    seed_run(&app, "nightly", at(today, 0, 4), "dead", None).await;
    // 00:30 in Shanghai is 16:30 UTC the day before: the run counts on Shanghai's day.
    seed_run(
        &app,
        "nightly",
        at(yesterday, 0, 30),
        "succeeded",
        Some(500),
    )
    .await;
    seed_run(&app, "nightly", at(yesterday, 23, 59), "cancelled", None).await;
    // Before the window, and another job's run: not counted.
    seed_run(
        &app,
        "nightly",
        at(today - Days::new(14), 12, 0),
        "succeeded",
        Some(9),
    )
    .await;
    seed_run(&app, "other", at(today, 0, 5), "failed", Some(7)).await;

    let (status, body) = app
        .call(
            Method::GET,
            "/api/jobs/nightly/report?days=14",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["timezone"], "Asia/Shanghai");
    assert!(
        body["from"]
            .as_str()
            .expect("from")
            .ends_with("T00:00:00+08:00"),
        "{body}"
    );
    let days = body["days"].as_array().expect("days");
    assert_eq!(days.len(), 14, "{body}");
    assert_eq!(days[13]["day"], today.to_string());
    assert_eq!(days[0]["day"], (today - Days::new(13)).to_string());
    assert_eq!(days[13]["total"], 4);
    assert_eq!(
        days[13]["counts"],
        json!({"succeeded": 2, "failed": 1, "dead": 1})
    );
    assert_eq!(days[13]["p50_ms"], 2000.0);
    assert_eq!(days[13]["p95_ms"], 2900.0);
    assert_eq!(days[12]["day"], yesterday.to_string());
    assert_eq!(days[12]["counts"], json!({"succeeded": 1, "cancelled": 1}));
    assert_eq!(days[12]["p50_ms"], 500.0);
    assert_eq!(days[0]["total"], 0);
    assert_eq!(days[0]["counts"], json!({}));
    assert_eq!(days[0]["p50_ms"], Value::Null);
    assert_eq!(
        body["totals"],
        json!({"succeeded": 3, "failed": 1, "dead": 1, "cancelled": 1})
    );
    assert_eq!(body["success_rate"], 0.6);
    assert_eq!(
        body["outcomes"],
        json!(["succeeded", "failed", "dead", "cancelled"])
    );
    // One day is today only; the default is 14.
    let (_, body) = app
        .call(
            Method::GET,
            "/api/jobs/nightly/report?days=1",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(body["days"].as_array().expect("days").len(), 1, "{body}");
    assert_eq!(body["days"][0]["total"], 4);
    let (_, body) = app
        .call(Method::GET, "/api/jobs/nightly/report", Some(&viewer), None)
        .await;
    assert_eq!(body["days"].as_array().expect("days").len(), 14);

    // Days outside 1..=90, not a number, or an unknown parameter: a 400 naming the field.
    for (query, field) in [
        ("days=0", "days"),
        ("days=91", "days"),
        ("days=two", "days"),
        ("days=-3", "days"),
        ("day=3", "day"),
    ] {
        let (status, body) = app
            .call(
                Method::GET,
                &format!("/api/jobs/nightly/report?{query}"),
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
    let (status, body) = app
        .call(
            Method::GET,
            "/api/jobs/nightly/report?days=91",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(
        body["error"]["message"],
        "field \"days\" = \"91\": use a whole number of days from 1 to 90, such as 14",
        "{status}"
    );
    let (status, _) = app
        .call(Method::GET, "/api/jobs/nope/report", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .call(Method::GET, "/api/jobs/nightly/report", None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_job_shows_its_times_in_its_own_zone_besides_utc(pool: PgPool) {
    let app = app(pool).await;
    let admin = app.token(Role::Admin).await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(
                json!({"name": "shanghai", "group": "g", "schedule": "0 30 9 * * *",
                        "timezone": "Asia/Shanghai"}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, body) = app
        .call(Method::GET, "/api/jobs/shanghai", Some(&admin), None)
        .await;
    assert_eq!(body["timezone"], "Asia/Shanghai");
    let local = body["next_fire_local"].as_str().expect("next_fire_local");
    assert!(local.ends_with("T09:30:00+08:00"), "{body}");
    let utc = chrono::DateTime::parse_from_rfc3339(body["next_fire"].as_str().expect("UTC"))
        .expect("RFC 3339");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(local).expect("local"),
        utc
    );
    let upcoming = body["upcoming_local"].as_array().expect("upcoming_local");
    assert_eq!(upcoming.len(), 5);
    assert!(
        upcoming
            .iter()
            .all(|t| t.as_str().expect("text").ends_with("T09:30:00+08:00")),
        "{body}"
    );
}
