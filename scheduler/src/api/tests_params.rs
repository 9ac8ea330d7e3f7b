//! Params that are not a JSON object are refused at every API entry (issue 12, point 4):
//! trigger, create and update answer 400 naming the `params` field, and change nothing.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::tests::app;
use crate::auth::Role;

/// The 400 names `params`, shows the value and says what to write instead.
fn assert_params_refused(status: StatusCode, body: &Value, value: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let problem = &body["error"]["problems"][0];
    assert_eq!(problem["field"], "params", "{body}");
    assert_eq!(problem["value"], value, "{body}");
    assert!(
        problem["message"]
            .as_str()
            .is_some_and(|m| m.contains("JSON object")),
        "{body}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn trigger_create_and_update_refuse_params_that_are_not_an_object(pool: PgPool) {
    let app = app(pool).await;
    let admin = app.token(Role::Admin).await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/jobs",
            Some(&admin),
            Some(json!({"name": "report", "group": "g1", "params": {"batch": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    for params in [json!([1]), json!("{\"batch\": 1}"), json!(7), json!(true)] {
        let shown = params.to_string();
        let (status, body) = app
            .call(
                Method::POST,
                "/api/jobs/report/trigger",
                Some(&admin),
                Some(json!({"params": params})),
            )
            .await;
        assert_params_refused(status, &body, &shown);

        let (status, body) = app
            .call(
                Method::POST,
                "/api/jobs",
                Some(&admin),
                Some(json!({"name": "other", "group": "g1", "params": params})),
            )
            .await;
        assert_params_refused(status, &body, &shown);

        let (status, body) = app
            .call(
                Method::PATCH,
                "/api/jobs/report",
                Some(&admin),
                Some(json!({"params": params})),
            )
            .await;
        assert_params_refused(status, &body, &shown);
    }

    assert_eq!(app.count("SELECT count(*) FROM chime_runs").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM chime_jobs WHERE name = 'other'")
            .await,
        0
    );
    let (_, job) = app
        .call(Method::GET, "/api/jobs/report", Some(&admin), None)
        .await;
    assert_eq!(job["spec"]["params"], json!({"batch": 1}), "{job}");
}
