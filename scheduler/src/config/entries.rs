//! The bounds at the runtime entries: jobs created and changed through the operations layer,
//! and manual triggers, which the API and the CLI both go through, get the same checks and
//! messages as job files (`#[sqlx::test]`, one database per test).

use serde_json::{Value, json};
use sqlx::PgPool;

use crate::auth::Caller;
use crate::ops::{Operations, OpsError};
use crate::store::Store;

/// The fields an `Invalid` answer names, or a panic naming what came instead.
fn invalid_fields<T: std::fmt::Debug>(result: Result<T, OpsError>) -> Vec<String> {
    match result {
        Err(OpsError::Invalid(problems)) => problems
            .into_iter()
            .map(|p| p.field.unwrap_or_default())
            .collect(),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

async fn runs(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM chime_runs")
        .fetch_one(pool)
        .await
        .expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn api_and_cli_entries_refuse_what_job_files_refuse(pool: PgPool) {
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let admin = Caller::cli();

    // Create: absurd durations and counts, and params that are not an object.
    let fields = invalid_fields(
        ops.create_job(
            &admin,
            json!({"name": "absurd", "group": "g", "every": "10000years",
                   "retention": "10000years", "params": [1],
                   "retry": {"max_attempts": 3_000_000_000_u64, "initial": "300000years"}}),
        )
        .await,
    );
    assert_eq!(
        fields,
        [
            "every",
            "params",
            "retry.max_attempts",
            "retry.initial",
            "retention"
        ]
    );

    // Update: the merged definition is validated the same way.
    ops.create_job(&admin, json!({"name": "report", "group": "g"}))
        .await
        .expect("a plain job");
    let fields = invalid_fields(
        ops.update_job(
            &admin,
            "report",
            json!({"timeout": "1000years", "params": "batch=1"}),
        )
        .await,
    );
    assert_eq!(fields, ["params", "timeout"]);

    // Trigger: params must be an object (or absent) of at most MAX_PARAMS_BYTES.
    for params in [
        json!([1]),
        json!("batch=1"),
        json!(7),
        json!({"blob": "x".repeat(chime_protocol::limits::MAX_PARAMS_BYTES)}),
    ] {
        let fields = invalid_fields(ops.trigger(&admin, "report", Some(params)).await);
        assert_eq!(fields, ["params"]);
    }
    assert_eq!(runs(&pool).await, 0, "nothing refused was inserted");
    for params in [None, Some(Value::Null), Some(json!({"batch": 1}))] {
        ops.trigger(&admin, "report", params)
            .await
            .expect("an object, null or nothing is fine");
    }
    assert_eq!(runs(&pool).await, 3);
}
