//! Definition versions through the router against a real database: every applied change is a
//! numbered version with who and when, runs record the version they were made under, and an
//! API job rolls back as a new version; a job-file job does not.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;
use crate::config::{SourceFormat, parse_job_file};
use crate::store::Store;

#[sqlx::test(migrations = "../migrations")]
async fn each_change_is_a_version_runs_record_theirs_and_an_api_job_rolls_back(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = app.token(Role::Admin).await;
    let viewer = app.token(Role::Viewer).await;
    let operator = app.token(Role::Operator).await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "report", "group": "g", "every": "1h",
                        "params": {"api_key": "k1", "n": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["version"], 1, "{body}");
    let (status, body) = app
        .call(
            Method::PATCH,
            "/api/jobs/report",
            Some(&admin),
            Some(json!({"every": "2h", "params": {"api_key": "k2", "n": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], 2);
    // Pausing changes no definition, so no version.
    app.call(Method::POST, "/api/jobs/report/pause", Some(&admin), None)
        .await;

    let (status, versions) = app
        .call(
            Method::GET,
            "/api/jobs/report/versions",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{versions}");
    let versions = versions.as_array().expect("a list").clone();
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert_eq!(versions[0]["version"], 1);
    assert_eq!(versions[0]["changes"], json!([]));
    assert_eq!(versions[0]["current"], false);
    assert_eq!(versions[1]["current"], true);
    assert_eq!(versions[1]["actor"], "token:admin-token");
    assert_eq!(versions[1]["source"], "api");
    // The secret param changed too, but is hidden on both sides: only `every` shows.
    assert_eq!(
        versions[1]["changes"],
        json!([{"field": "every", "before": "1h", "after": "2h"}])
    );
    assert!(
        !Value::Array(versions.clone()).to_string().contains("k2"),
        "{versions:?}"
    );

    // A run records the version it was made under.
    let (status, triggered) = app
        .call(
            Method::POST,
            "/api/jobs/report/trigger",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{triggered}");
    let recorded: Option<i32> =
        sqlx::query_scalar("SELECT job_version FROM chime_runs WHERE id = $1")
            .bind(triggered["run_id"].as_i64().expect("run id"))
            .fetch_one(&pool)
            .await
            .expect("the run");
    assert_eq!(recorded, Some(2));
    let run_id = triggered["run_id"].as_i64().expect("run id");
    let (_, run) = app
        .call(
            Method::GET,
            &format!("/api/runs/{run_id}"),
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(run["job_version"], 2, "{run}");

    // Rolling back: admins only, to a version that exists and is not the current one.
    let rollback = |token: String, body: Value| {
        let app = &app;
        async move {
            app.call(
                Method::POST,
                "/api/jobs/report/rollback",
                Some(&token),
                Some(body),
            )
            .await
        }
    };
    let (status, _) = rollback(operator.clone(), json!({"to": 1})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = rollback(admin.clone(), json!({"to": 9})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("versions are 1 to 2"),
        "{body}"
    );
    let (status, body) = rollback(admin.clone(), json!({"to": 2})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = rollback(admin.clone(), json!({"to": "one"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = rollback(admin.clone(), json!({"to": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], 3);
    assert_eq!(body["spec"]["every"], "1h");
    assert_eq!(body["paused"], true, "the pause stays");
    let (_, versions) = app
        .call(Method::GET, "/api/jobs/report/versions", Some(&admin), None)
        .await;
    assert_eq!(versions[2]["changes"][0]["field"], "every", "{versions}");
    assert_eq!(
        versions[2]["spec"]["params"]["api_key"], "k1",
        "admins see secrets"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM chime_audit WHERE action = 'jobs.rollback'")
            .await,
        4,
        "every rollback asked of the operation is audited, refusals too (a body that is not \
         {{\"to\": N}} is refused before)"
    );

    // A job-file job: versions by `file`, one per changed load, no rollback through the API.
    let store = Store::from_pool(pool.clone());
    for every in ["1m", "1m", "5m"] {
        let text = format!("[[jobs]]\nname = \"filed\"\ngroup = \"g\"\nevery = \"{every}\"\n");
        let specs = parse_job_file("jobs.toml", &text, SourceFormat::Toml).expect("valid");
        store.sync_config_jobs(&specs).await.expect("synced");
    }
    let (_, versions) = app
        .call(Method::GET, "/api/jobs/filed/versions", Some(&viewer), None)
        .await;
    let by: Vec<(i64, &str)> = versions
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| (v["version"].as_i64().unwrap(), v["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(by, [(1, "file"), (2, "file")], "{versions}");
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs/filed/rollback",
            Some(&admin),
            Some(json!({"to": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // A deleted job keeps its history, and one created again numbers on.
    app.call(Method::DELETE, "/api/jobs/report", Some(&admin), None)
        .await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "report", "group": "g", "every": "3h"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["version"], 4, "{body}");
    let (status, _) = app
        .call(
            Method::GET,
            "/api/jobs/nothing/versions",
            Some(&viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_history_lists_the_latest_versions_each_against_the_one_before(pool: PgPool) {
    let app = app(pool.clone()).await;
    let viewer = app.token(Role::Viewer).await;
    // 1,005 versions of one job, the period changing at each.
    sqlx::query(
        "INSERT INTO chime_job_versions (job_name, version, spec, source, actor)
         SELECT 'busy', v, jsonb_build_object('name', 'busy', 'group', 'g',
                                               'every', v || 's'), 'api', 'cli:bot'
         FROM generate_series(1, 1005) AS v",
    )
    .execute(&pool)
    .await
    .expect("versions");
    let (status, versions) = app
        .call(Method::GET, "/api/jobs/busy/versions", Some(&viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{versions}");
    let versions = versions.as_array().expect("a list");
    assert_eq!(versions.len() as i64, crate::ops::HISTORY_LIMIT);
    assert_eq!(versions[0]["version"], 6);
    // The oldest shown is compared with the one before it, which is not shown.
    assert_eq!(
        versions[0]["changes"],
        json!([{"field": "every", "before": "5s", "after": "6s"}])
    );
    assert_eq!(versions.last().unwrap()["version"], 1005);
    // The job itself is gone: no version is current, and none can be rolled back to.
    assert!(versions.iter().all(|v| v["current"] == false));
}
