//! Migration `worker_privilege` against a real database, connected as a worker's own role: a
//! role granted group A does a worker's every call for A, is refused (42501) each call on a
//! run, worker or job of group B, reads and writes no table and executes no scheduler
//! function; the owner still does everything; docs/protocol.md lists exactly the worker
//! functions. Then the retry decision and triggering from code (`chime_trigger`).

use std::time::Duration;

use chime_protocol::retry;
use chime_protocol::wire::RetryPolicy;
use chime_test_kit::RoleGuard;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;
use sqlx::{PgPool, Row as _};

use super::{Store, TriggerRequest};

/// Jobs `ja` of group `ga` and `jb` of group `gb`, each with a waiting run and a worker.
struct World {
    run_a: i64,
    run_b: i64,
}

async fn world(pool: &PgPool) -> World {
    for (job, group) in [("ja", "ga"), ("jb", "gb")] {
        sqlx::query("INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, $2, $3)")
            .bind(job)
            .bind(group)
            .bind(
                json!({"retry": {"max_attempts": 3, "initial": "1s", "multiplier": 2.0,
                                   "max": "3s", "jitter": false}}),
            )
            .execute(pool)
            .await
            .unwrap();
    }
    let mut runs = Vec::new();
    for (job, group) in [("ja", "ga"), ("jb", "gb")] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
             VALUES ($1, $2, now(), 'manual', 'queued') RETURNING id",
        )
        .bind(job)
        .bind(group)
        .fetch_one(pool)
        .await
        .unwrap();
        runs.push(id);
    }
    sqlx::query("SELECT chime_register_worker('wb', 'gb', 'h', 1, '{jb}', 1000)")
        .execute(pool)
        .await
        .unwrap();
    World {
        run_a: runs[0],
        run_b: runs[1],
    }
}

/// A login role granted group `ga` only.
async fn worker_role(pool: &PgPool) -> RoleGuard {
    let role = RoleGuard::create(pool, "chime_test_worker").await;
    let fresh: bool = sqlx::query_scalar("SELECT chime_grant_worker($1, 'ga', 'test')")
        .bind(&role.name)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(fresh);
    role
}

/// Runs `sql` and returns the error's SQLSTATE and message (panics if it succeeds).
async fn refused(pool: &PgPool, sql: &str) -> (String, String) {
    let e = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(pool)
        .await
        .err()
        .unwrap_or_else(|| panic!("not refused: {sql}"));
    let db = e
        .as_database_error()
        .unwrap_or_else(|| panic!("{sql}: {e}"));
    (
        db.code().unwrap_or_default().into_owned(),
        db.message().to_owned(),
    )
}

/// Every worker call for group A works as A's role; every one for group B is refused with
/// 42501 and a message naming the group, the role and the fix.
#[sqlx::test(migrations = "../migrations")]
async fn a_granted_role_acts_for_its_group_and_is_refused_every_call_for_another(pool: PgPool) {
    let w = world(&pool).await;
    let role = worker_role(&pool).await;
    let as_worker = role.connect(2).await;
    let (a, b) = (w.run_a, w.run_b);

    let allowed = [
        "SELECT chime_register_worker('wa', 'ga', 'h', 1, '{ja}', 1000)".to_owned(),
        "SELECT chime_heartbeat('wa')".to_owned(),
        format!(
            "SELECT * FROM chime_claim(ARRAY[{a}::bigint], ARRAY[1], ARRAY['ja'], \
             ARRAY[NULL::timestamptz], 'wa', 'ga')"
        ),
        format!("SELECT * FROM chime_run_snapshot({a})"),
        format!("SELECT chime_append_logs({a}, 1, ARRAY[now()], ARRAY['info'], ARRAY['hello'])"),
        format!("SELECT * FROM chime_retry_decision({a}, 1, NULL)"),
        format!(
            "SELECT * FROM chime_record_outcomes(ARRAY[{a}::bigint], ARRAY[1], \
             ARRAY['failed'], ARRAY[5::bigint], ARRAY['boom'], ARRAY['retrying'], \
             ARRAY[NULL::text], ARRAY[now() + interval '1 s'], ARRAY[NULL::timestamptz], 'wa', \
             ARRAY[{a}::bigint], ARRAY[1], ARRAY[now()], ARRAY['warn'], ARRAY['last'])"
        ),
        format!("SELECT * FROM chime_outcome_recorded({a}, 1, 'wa', 'failed', 5, 'boom')"),
        format!("SELECT chime_mark_unhandled({a}, 'ga', 'waiting for a handler', 'ja', 2)"),
        "SELECT chime_handled_elsewhere('ga', 'ja', 'wa')".to_owned(),
        format!(
            "SELECT * FROM chime_take_over({a}, 'ja', 9, 'nobody', 'lost', true, 5, NULL, 'wa')"
        ),
        "SELECT * FROM chime_trigger('ja', '{\"n\": 1}', NULL, 'k-a', 'worker-a')".to_owned(),
        format!("SELECT chime_mark_dead({a}, 'ga', 'no handler', 'wa', 'ja', 2)"),
        "SELECT chime_may_act_for('ga'), chime_may_act_for('gb')".to_owned(),
        "SELECT chime_worker_online(NULL, now(), 1000), chime_retry_exhausted('{}', 3)".to_owned(),
        "SELECT chime_worker_stopped('wa')".to_owned(),
    ];
    for sql in &allowed {
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_all(&as_worker)
            .await
        {
            panic!("{sql}: {e}");
        }
    }
    // What those calls did, seen by the owner.
    let (state, logs): (String, i64) = sqlx::query_as(
        "SELECT r.state, (SELECT count(*) FROM chime_run_logs l WHERE l.run_id = r.id)
           FROM chime_runs r WHERE r.id = $1",
    )
    .bind(a)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), logs), ("dead", 2));
    let may: (bool, bool) =
        sqlx::query_as("SELECT chime_may_act_for('ga'), chime_may_act_for('gb')")
            .fetch_one(&as_worker)
            .await
            .unwrap();
    assert_eq!(may, (true, false));

    let refused_calls = [
        "SELECT chime_register_worker('wb2', 'gb', 'h', 1, '{jb}', 1000)".to_owned(),
        // Another group's worker id, even re-registered under the worker's own group.
        "SELECT chime_register_worker('wb', 'ga', 'h', 1, '{ja}', 1000)".to_owned(),
        "SELECT chime_heartbeat('wb')".to_owned(),
        "SELECT chime_worker_stopped('wb')".to_owned(),
        format!(
            "SELECT * FROM chime_claim(ARRAY[{b}::bigint], ARRAY[1], ARRAY['jb'], \
             ARRAY[NULL::timestamptz], 'wa', 'gb')"
        ),
        format!("SELECT * FROM chime_run_snapshot({b})"),
        format!("SELECT chime_append_logs({b}, 1, ARRAY[now()], ARRAY['info'], ARRAY['forged'])"),
        format!("SELECT * FROM chime_retry_decision({b}, 1, NULL)"),
        format!(
            "SELECT * FROM chime_record_outcomes(ARRAY[{b}::bigint], ARRAY[1], \
             ARRAY['failed'], ARRAY[5::bigint], ARRAY['x'], ARRAY['dead'], ARRAY['x'], \
             ARRAY[NULL::timestamptz], ARRAY[NULL::timestamptz], 'wb', \
             '{{}}', '{{}}', '{{}}', '{{}}', '{{}}')"
        ),
        format!("SELECT * FROM chime_outcome_recorded({b}, 1, 'wb', 'failed', 5, 'x')"),
        format!("SELECT chime_mark_unhandled({b}, 'gb', 'x', 'jb', 1)"),
        // The run is B's even when the call names the worker's own group.
        format!("SELECT chime_mark_dead({b}, 'ga', 'x', 'wa', 'jb', 1)"),
        format!("SELECT chime_mark_dead({b}, 'gb', 'x', 'wa', 'jb', 1)"),
        "SELECT chime_handled_elsewhere('gb', 'jb', 'wa')".to_owned(),
        format!("SELECT * FROM chime_take_over({b}, 'jb', 0, 'wb', 'lost', false, 5, NULL, 'wa')"),
        "SELECT * FROM chime_trigger('jb', NULL, NULL, NULL, 'worker-a')".to_owned(),
    ];
    for sql in &refused_calls {
        let (code, message) = refused(&as_worker, sql).await;
        assert_eq!(code, "42501", "{sql}: {message}");
        assert!(
            message.contains("executor group gb")
                && message.contains(&role.name)
                && message.contains("chime workers grant --group gb"),
            "{sql}: {message}"
        );
    }
    // Nothing of B changed.
    let (state, logs, worker_stopped): (String, i64, bool) = sqlx::query_as(
        "SELECT r.state, (SELECT count(*) FROM chime_run_logs l WHERE l.run_id = r.id),
                (SELECT stopped_at IS NOT NULL FROM chime_workers WHERE id = 'wb')
           FROM chime_runs r WHERE r.id = $1",
    )
    .bind(b)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), logs, worker_stopped), ("queued", 0, false));
    let runs_of_b: i64 =
        sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE job_name = 'jb'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(runs_of_b, 1);
    as_worker.close().await;
}

/// A worker role reads and writes no table and executes no function but the worker ones;
/// after its grant is revoked it executes none.
#[sqlx::test(migrations = "../migrations")]
async fn a_granted_role_touches_no_table_and_no_scheduler_function(pool: PgPool) {
    world(&pool).await;
    let role = worker_role(&pool).await;
    let as_worker = role.connect(1).await;
    let tables = [
        "chime_runs",
        "chime_attempts",
        "chime_leader",
        "chime_api_tokens",
        "chime_audit",
        "chime_jobs",
        "chime_workers",
        "chime_worker_grants",
    ];
    for table in tables {
        for sql in [
            format!("SELECT * FROM {table} LIMIT 1"),
            format!(
                "UPDATE {table} SET {} = {0}",
                first_column(&pool, table).await
            ),
            format!("DELETE FROM {table}"),
        ] {
            let (code, message) = refused(&as_worker, &sql).await;
            assert_eq!(code, "42501", "{sql}: {message}");
        }
    }
    for sql in [
        "SELECT * FROM chime_fence('me', 1)",
        "SELECT chime_worker_lost_since(NULL, now(), 1000)",
        "SELECT chime_acts_as_owner()",
        "SELECT chime_grant_worker(current_user, 'gb', 'me')",
        "SELECT chime_revoke_worker(current_user, 'ga')",
        "SELECT chime_retry_snapshot('{}')",
        "SELECT chime_require_group('gb', 'x')",
        "SELECT * FROM chime_worker_functions()",
    ] {
        let (code, message) = refused(&as_worker, sql).await;
        assert_eq!(code, "42501", "{sql}: {message}");
    }
    // No Chime function is executable by PUBLIC.
    let public: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
          WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'chime\\_%'
            AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner)))
                         WHERE grantee = 0 AND privilege_type = 'EXECUTE')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(public.is_empty(), "executable by PUBLIC: {public:?}");

    let had: bool = sqlx::query_scalar("SELECT chime_revoke_worker($1, 'ga')")
        .bind(&role.name)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(had);
    let (code, _) = refused(&as_worker, "SELECT chime_heartbeat('wa')").await;
    assert_eq!(code, "42501");
    as_worker.close().await;
}

/// A column of `table` an UPDATE may set (not an identity or generated one).
async fn first_column(pool: &PgPool, table: &str) -> String {
    sqlx::query_scalar(
        "SELECT attname::text FROM pg_attribute
          WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
            AND attidentity = '' AND attgenerated = ''
          ORDER BY attnum LIMIT 1",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The owner (the scheduler's role) acts for every group with the same functions.
#[sqlx::test(migrations = "../migrations")]
async fn the_owner_acts_for_every_group(pool: PgPool) {
    let w = world(&pool).await;
    for (run, job, group) in [(w.run_a, "ja", "ga"), (w.run_b, "jb", "gb")] {
        let claimed: Vec<i64> = sqlx::query_scalar(
            "SELECT run_id FROM chime_claim(ARRAY[$1::bigint], ARRAY[1], ARRAY[$2],
                                             ARRAY[NULL::timestamptz], 'owner', $3)",
        )
        .bind(run)
        .bind(job)
        .bind(group)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(claimed, [run]);
        let may: bool = sqlx::query_scalar("SELECT chime_may_act_for($1)")
            .bind(group)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(may);
    }
}

/// The worker functions named between the markers of docs/protocol.md section 11.
fn worker_functions_in_doc() -> std::collections::BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"))
        .expect("docs/protocol.md");
    let start = doc.find("<!-- worker-functions -->").expect("start marker");
    let end = doc.find("<!-- /worker-functions -->").expect("end marker");
    doc[start..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// docs/protocol.md lists exactly `chime_worker_functions()`, and those are exactly what
/// `chime_grant_worker` lets a role execute.
#[sqlx::test(migrations = "../migrations")]
async fn the_protocol_doc_lists_exactly_the_worker_functions(pool: PgPool) {
    let listed: std::collections::BTreeSet<String> = sqlx::query_scalar(
        "SELECT DISTINCT p.proname::text FROM chime_worker_functions() f
           JOIN pg_proc p ON p.oid = f",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(worker_functions_in_doc(), listed);
    let role = worker_role(&pool).await;
    let executable: std::collections::BTreeSet<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p
          WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'chime\\_%'
            AND has_function_privilege($1, p.oid, 'EXECUTE')",
    )
    .bind(&role.name)
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(executable, listed);
}

// ---- the retry decision ----------------------------------------------------------------

/// A run of job `ja` with retry policy snapshot `policy`.
async fn run_with_policy(pool: &PgPool, policy: serde_json::Value) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, retry_policy)
         VALUES ('ja', 'ga', now(), 'manual', 'running', $1) RETURNING id",
    )
    .bind(policy)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `(run_state, delay in ms from the call, reason)` of `chime_retry_decision`.
async fn decision(
    pool: &PgPool,
    run: i64,
    attempt: i32,
    retry_after_ms: Option<i64>,
) -> (String, Option<i64>, Option<String>) {
    let row = sqlx::query(
        "SELECT d.run_state, d.reason,
                (extract(epoch FROM d.next_attempt_at - clock_timestamp()) * 1000)::bigint AS ms
           FROM chime_retry_decision($1, $2, $3) d",
    )
    .bind(run)
    .bind(attempt)
    .bind(retry_after_ms)
    .fetch_one(pool)
    .await
    .unwrap();
    (row.get("run_state"), row.get("ms"), row.get("reason"))
}

fn close_to(got: Option<i64>, want_ms: u128) -> bool {
    // The delay is measured against the clock just after the call: a few ms less.
    got.is_some_and(|ms| (want_ms as i64 - 50..=want_ms as i64).contains(&ms))
}

/// Without jitter the database's delays are `chime_protocol::retry::delay`'s, for a table of
/// policies, attempts and requested delays; the last attempt is dead with the SDK's reason.
#[sqlx::test(migrations = "../migrations")]
async fn the_retry_decision_is_the_protocols_backoff(pool: PgPool) {
    world(&pool).await;
    let cases: [(u32, u64, f64, u64, u32, Option<u64>); 9] = [
        // (max_attempts, initial ms, multiplier, max ms, failed attempt, requested ms)
        (5, 1_000, 2.0, 60_000, 1, None),
        (5, 1_000, 2.0, 60_000, 3, None),
        (5, 1_000, 2.0, 5_000, 4, None),
        (5, 1_500, 1.5, 60_000, 3, None),
        (5, 1_000, 0.5, 60_000, 3, None),
        (1_000, 1_000, 100.0, 600_000, 999, None),
        (5, 90_000, 2.0, 60_000, 1, None),
        (5, 1_000, 2.0, 60_000, 1, Some(250)),
        (5, 1_000, 2.0, 60_000, 1, Some(3_600_000)),
    ];
    for (max_attempts, initial_ms, multiplier, max_ms, failed, requested) in cases {
        let policy = RetryPolicy {
            max_attempts,
            initial_ms,
            multiplier,
            max_ms,
            jitter: false,
        };
        let run = run_with_policy(
            &pool,
            json!({"max_attempts": max_attempts, "initial": format!("{initial_ms}ms"),
                   "multiplier": multiplier, "max": format!("{max_ms}ms"), "jitter": false}),
        )
        .await;
        let want = retry::delay(&policy, failed, requested.map(Duration::from_millis), 0.5);
        let got = decision(&pool, run, failed as i32, requested.map(|r| r as i64)).await;
        assert_eq!(got.0, "retrying", "{policy:?}");
        assert!(
            close_to(got.1, want.as_millis()),
            "{policy:?} after {failed}, requested {requested:?}: {got:?}, want {want:?}"
        );
    }
    let run = run_with_policy(&pool, json!({"max_attempts": 3})).await;
    assert_eq!(
        decision(&pool, run, 3, None).await,
        (
            "dead".into(),
            None,
            Some("attempts exhausted (3 of 3)".into())
        )
    );
    assert_eq!(decision(&pool, run, 7, Some(10)).await.0, "dead");
    // No snapshot: the default policy (3 attempts, 10 s, jitter).
    let run = run_with_policy(&pool, serde_json::Value::Null).await;
    let (state, ms, _) = decision(&pool, run, 1, None).await;
    assert_eq!(state, "retrying");
    assert!(
        ms.is_some_and(|ms| (7_950..=12_000).contains(&ms)),
        "{ms:?}"
    );
    // No such run: no row.
    let none: Option<String> =
        sqlx::query_scalar("SELECT run_state FROM chime_retry_decision(-1, 1, NULL)")
            .fetch_optional(&pool)
            .await
            .unwrap();
    assert_eq!(none, None);
}

/// Jitter spreads the delay within [0.8, 1.2] of the backoff (and both ends are reached in a
/// hundred draws), capped by `max`; a requested delay is never spread.
#[sqlx::test(migrations = "../migrations")]
async fn the_retry_decisions_jitter_stays_within_its_bounds(pool: PgPool) {
    world(&pool).await;
    let run = run_with_policy(
        &pool,
        json!({"max_attempts": 5, "initial": "10s", "multiplier": 2.0, "max": "22s",
               "jitter": true}),
    )
    .await;
    let mut delays = Vec::new();
    for _ in 0..100 {
        let (_, ms, _) = decision(&pool, run, 1, None).await;
        delays.push(ms.unwrap());
    }
    let (low, high) = (*delays.iter().min().unwrap(), *delays.iter().max().unwrap());
    assert!(low >= 8_000 - 50 && high <= 12_000, "{low}..{high}");
    assert!(low < 9_000 && high > 11_000, "not spread: {low}..{high}");
    // Attempt 2: 20 s × [0.8, 1.2], capped at 22 s.
    for _ in 0..30 {
        let (_, ms, _) = decision(&pool, run, 2, None).await;
        assert!(
            ms.is_some_and(|ms| (16_000 - 50..=22_000).contains(&ms)),
            "{ms:?}"
        );
    }
    let (_, ms, _) = decision(&pool, run, 1, Some(1_234)).await;
    assert!(close_to(ms, 1_234), "{ms:?}");
}

// ---- triggering from code ----------------------------------------------------------------

async fn trigger(
    pool: &PgPool,
    job: &str,
    params: Option<serde_json::Value>,
    at: Option<DateTime<Utc>>,
    key: Option<&str>,
) -> Result<(i64, bool), sqlx::Error> {
    sqlx::query_as("SELECT run_id, created FROM chime_trigger($1, $2, $3, $4, 'test')")
        .bind(job)
        .bind(params)
        .bind(at)
        .bind(key)
        .fetch_one(pool)
        .await
}

/// The same (job, key) makes one run; another key or job another; the audit log has one entry
/// per call, the second saying it made nothing.
#[sqlx::test(migrations = "../migrations")]
async fn a_repeated_idempotency_key_returns_the_first_run(pool: PgPool) {
    world(&pool).await;
    let role = worker_role(&pool).await;
    let as_worker = role.connect(1).await;
    let first = trigger(
        &as_worker,
        "ja",
        Some(json!({"n": 1})),
        None,
        Some("order-7"),
    )
    .await
    .unwrap();
    assert!(first.1);
    let again = trigger(
        &as_worker,
        "ja",
        Some(json!({"n": 2})),
        None,
        Some("order-7"),
    )
    .await
    .unwrap();
    assert_eq!(again, (first.0, false));
    let other = trigger(&pool, "ja", None, None, Some("order-8"))
        .await
        .unwrap();
    assert!(other.1 && other.0 != first.0);
    let unkeyed = trigger(&pool, "ja", None, None, None).await.unwrap();
    let unkeyed_again = trigger(&pool, "ja", None, None, None).await.unwrap();
    assert!(unkeyed.1 && unkeyed_again.1 && unkeyed.0 != unkeyed_again.0);

    let (params, by, state): (serde_json::Value, String, String) =
        sqlx::query_as("SELECT params, requested_by, state FROM chime_runs WHERE id = $1")
            .bind(first.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (params, by.as_str(), state.as_str()),
        (json!({"n": 1}), "test", "pending")
    );
    let audit: Vec<(
        String,
        String,
        String,
        String,
        Option<i64>,
        serde_json::Value,
    )> = sqlx::query_as(
        "SELECT actor, role, action, outcome, run_id, detail FROM chime_audit
              WHERE detail->>'idempotency_key' = 'order-7' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    for (i, (actor, role_name, action, outcome, run, detail)) in audit.iter().enumerate() {
        assert_eq!(
            (
                actor.as_str(),
                role_name.as_str(),
                action.as_str(),
                outcome.as_str(),
                *run
            ),
            ("test", "worker", "jobs.trigger", "ok", Some(first.0))
        );
        assert_eq!(detail["created"], json!(i == 0));
        assert_eq!(detail["db_role"], json!(role.name));
        // The params' keys only: their values may be secrets.
        assert_eq!(detail["param_keys"], json!(["n"]));
    }
    as_worker.close().await;
}

/// A call of chime_trigger that must be refused: job, params, instant, key, then the field
/// refused and what the message says.
type Refused = (
    &'static str,
    Option<serde_json::Value>,
    Option<DateTime<Utc>>,
    Option<String>,
    &'static str,
    &'static str,
);

/// Each bad input is refused with 22023, the field as the error's column and a message naming
/// the value's problem and the fix; nothing is written.
#[sqlx::test(migrations = "../migrations")]
async fn chime_trigger_refuses_bad_input_naming_the_field_and_the_fix(pool: PgPool) {
    world(&pool).await;
    let huge = json!({"blob": "x".repeat(70_000)});
    let cases: [Refused; 7] = [
        ("nope", None, None, None, "job", "no such job"),
        (
            "ja",
            Some(json!([1, 2])),
            None,
            None,
            "params",
            "found an array",
        ),
        (
            "ja",
            Some(json!("text")),
            None,
            None,
            "params",
            "found a string",
        ),
        (
            "ja",
            Some(huge),
            None,
            None,
            "params",
            "over the limit of 65536 bytes",
        ),
        (
            "ja",
            None,
            Some(Utc::now() - TimeDelta::days(2)),
            None,
            "run_at",
            "now - 1 day",
        ),
        (
            "ja",
            None,
            Some(Utc::now() + TimeDelta::days(367)),
            None,
            "run_at",
            "366 days",
        ),
        (
            "ja",
            None,
            None,
            Some("k".repeat(201)),
            "idempotency_key",
            "201 bytes",
        ),
    ];
    for (job, params, at, key, field, says) in cases {
        let e = trigger(&pool, job, params, at, key.as_deref())
            .await
            .expect_err(field);
        let pg = e
            .as_database_error()
            .unwrap()
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .unwrap();
        assert_eq!(pg.code(), "22023", "{e}");
        assert_eq!(pg.column(), Some(field), "{e}");
        assert!(
            pg.message().starts_with(&format!("invalid {field}: ")) && pg.message().contains(says),
            "{}",
            pg.message()
        );
        assert!(pg.hint().is_some_and(|h| !h.is_empty()), "no fix: {e}");
        assert!(
            pg.detail()
                .is_some_and(|d| d.starts_with(&format!("{field} = ")))
        );
    }
    let empty = trigger(&pool, "ja", None, None, Some(""))
        .await
        .expect_err("empty key");
    assert!(empty.to_string().contains("idempotency_key"));
    let (runs, audit): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM chime_runs WHERE trigger = 'manual' AND state = 'pending'),
                (SELECT count(*) FROM chime_audit)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((runs, audit), (0, 0));
}

/// A run triggered for later waits in the outbox until the sweep's horizon reaches its instant
/// (the dispatcher then holds it until its lead), and the trigger wakes the outbox.
#[sqlx::test(migrations = "../migrations")]
async fn a_run_triggered_for_later_is_in_the_outbox_only_once_due(pool: PgPool) {
    world(&pool).await;
    let store = Store::from_pool(pool.clone());
    let mut wake = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    wake.listen(super::OUTBOX_CHANNEL).await.unwrap();
    let at = Utc::now() + TimeDelta::hours(1);
    let (run, _) = trigger(&pool, "ja", None, Some(at), None).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(10), wake.recv())
        .await
        .expect("the trigger notifies the outbox")
        .unwrap();
    assert_eq!(woken.payload(), run.to_string());
    let ids = |runs: Vec<super::OutboxRun>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let now = store
        .outbox(Utc::now() + TimeDelta::seconds(5), 10)
        .await
        .unwrap();
    assert!(!ids(now).contains(&run), "published before its instant");
    let due = store.outbox(at, 10).await.unwrap();
    let due_run = due
        .iter()
        .find(|r| r.id == run)
        .expect("in the outbox at its instant");
    assert!((due_run.scheduled_at - at).abs() < TimeDelta::milliseconds(1));
    assert_eq!(due_run.retry.map(|r| r.max_attempts), Some(3));
}

/// The API's trigger goes through chime_trigger: one audit entry per request, with the
/// caller's role and the params' secrets hidden.
#[sqlx::test(migrations = "../migrations")]
async fn the_stores_trigger_passes_the_callers_role_and_hidden_details(pool: PgPool) {
    world(&pool).await;
    let store = Store::from_pool(pool.clone());
    let detail = json!({"params": {"password": "[redacted]"}});
    let request = TriggerRequest {
        job: "ja",
        params: Some(&json!({"password": "hunter22"})),
        at: None,
        idempotency_key: Some("k"),
        requested_by: "token:ops",
        audit_role: "operator",
        audit_detail: &detail,
    };
    let made = store.trigger_with(&request).await.unwrap().unwrap();
    assert!(made.created);
    let again = store.trigger_with(&request).await.unwrap().unwrap();
    assert_eq!((again.run_id, again.created), (made.run_id, false));
    let entries: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("SELECT actor, role, detail FROM chime_audit ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(entries.len(), 2);
    for (actor, role, detail) in entries {
        assert_eq!((actor.as_str(), role.as_str()), ("token:ops", "operator"));
        assert_eq!(detail["params"], json!({"password": "[redacted]"}));
    }
    let bad = TriggerRequest {
        job: "ja",
        idempotency_key: Some(""),
        ..request
    };
    let refusal = store.trigger_with(&bad).await.unwrap().unwrap_err();
    assert_eq!(refusal.field, "idempotency_key");
    assert_eq!(refusal.value.as_deref(), Some(""));
}
