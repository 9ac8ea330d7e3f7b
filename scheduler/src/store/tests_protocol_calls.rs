//! The functions of migration `protocol_calls` against a real database: the fence refuses a
//! deposed term, liveness, the retry policy snapshot that retry-or-dead and the outbox read,
//! docs/protocol.md naming exactly the protocol's functions, and every static statement of the
//! store preparing against the migrated schema.

use std::time::Duration;

use chime_protocol::retry::DEFAULT_MAX_ATTEMPTS;
use chrono::Utc;
use sqlx::{Executor as _, PgPool, SqlSafeStr as _};

use super::{
    ConcurrencyPolicy, Fence, MARK_PUBLISHED_SQL, NewFire, PlanWritesLost, Store, TriggerKind,
};

async fn lead(store: &Store) -> Fence {
    store.lead_for_test("me").await
}

async fn job(pool: &PgPool, name: &str, spec: serde_json::Value) {
    super::insert_test_job(pool, name, spec).await;
}

fn fire(job: &str) -> NewFire {
    NewFire {
        job: job.into(),
        group: "g".into(),
        scheduled_at: Utc::now(),
        kind: TriggerKind::Schedule,
        params: serde_json::Value::Null,
        skip: None,
        concurrency: ConcurrencyPolicy::Allow,
    }
}

/// `chime_fence` answers the lease row only for the current, unexpired term: a deposed
/// leader's fenced insert writes nothing.
#[sqlx::test(migrations = "../migrations")]
async fn the_fence_refuses_a_deposed_term(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "j", serde_json::json!({})).await;
    let fence = lead(&store).await;
    let deposed = Fence {
        holder: "me".into(),
        term: fence.term - 1,
    };
    let stranger = Fence {
        holder: "other".into(),
        term: fence.term,
    };
    for refused in [&deposed, &stranger] {
        assert_eq!(
            store
                .insert_fires(refused, None, &[fire("j")])
                .await
                .unwrap(),
            None
        );
    }
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 0, "a refused fence wrote a run");
    let created = store
        .insert_fires(&fence, None, &[fire("j")])
        .await
        .unwrap();
    assert_eq!(created.map(|c| c.len()), Some(1));
    // Expired: refused too.
    sqlx::query("UPDATE chime_leader SET expires_at = now() - interval '1 s'")
        .execute(&pool)
        .await
        .unwrap();
    let leased: Option<i64> = sqlx::query_scalar("SELECT term FROM chime_fence($1, $2)")
        .bind(&fence.holder)
        .bind(fence.term)
        .fetch_optional(&pool)
        .await
        .unwrap();
    assert_eq!(leased, None);
}

/// The default of `max_attempts` in SQL is the protocol's, and any stored value is clamped.
#[sqlx::test(migrations = "../migrations")]
async fn the_sql_max_attempts_default_is_the_protocols(pool: PgPool) {
    let cases = [
        (None, i64::from(DEFAULT_MAX_ATTEMPTS)),
        (Some(serde_json::json!({})), i64::from(DEFAULT_MAX_ATTEMPTS)),
        (Some(serde_json::json!({"max_attempts": "many"})), 3),
        (Some(serde_json::json!({"max_attempts": 0})), 1),
        (
            Some(serde_json::json!({"max_attempts": 3_000_000_000_u64})),
            2_147_483_647,
        ),
        (Some(serde_json::json!({"max_attempts": 7})), 7),
    ];
    for (policy, expected) in cases {
        let got: i32 = sqlx::query_scalar("SELECT chime_retry_max_attempts($1)")
            .bind(&policy)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(i64::from(got), expected, "{policy:?}");
    }
}

/// A run keeps the retry policy its job had when it was inserted: the rescuer ends a run whose
/// worker was lost on its last attempt by that snapshot, and the outbox publishes it, whatever
/// the job says now.
#[sqlx::test(migrations = "../migrations")]
async fn retry_or_dead_reads_the_runs_snapshot_not_the_jobs_current_policy(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(
        &pool,
        "j",
        serde_json::json!({"retry": {"max_attempts": 2}}),
    )
    .await;
    let fence = lead(&store).await;
    let lost: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                 worker_id, started_at)
         VALUES ('j', 'g', now() - interval '1 h', 'schedule', 'running', 2, 'gone',
                 now() - interval '1 h')
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO chime_attempts (run_id, attempt, worker_id, state) VALUES ($1, 2, 'gone', 'running')",
    )
    .bind(lost)
    .execute(&pool)
    .await
    .unwrap();
    let waiting = store
        .insert_fires(&fence, None, &[fire("j")])
        .await
        .unwrap()
        .unwrap()[0]
        .id;
    sqlx::query("UPDATE chime_jobs SET spec = '{\"retry\": {\"max_attempts\": 9}}'")
        .execute(&pool)
        .await
        .unwrap();

    let rescued = store
        .rescue_lost_runs(&fence, Duration::from_secs(1), 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rescued.len(), 1);
    assert_eq!(
        rescued[0].state,
        chime_protocol::RunState::Dead,
        "{rescued:?}"
    );
    let reason: String = sqlx::query_scalar("SELECT reason FROM chime_runs WHERE id = $1")
        .bind(lost)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(reason, "worker lost on the last attempt (2 of 2)");

    let outbox = store
        .outbox(Utc::now() + chrono::TimeDelta::hours(1), 10)
        .await
        .unwrap();
    let published = outbox
        .iter()
        .find(|r| r.id == waiting)
        .expect("in the outbox");
    assert_eq!(published.retry.map(|r| r.max_attempts), Some(2));
}

/// Liveness as the scheduler reads it: online while not stopped and beaten within three of
/// its own intervals.
#[sqlx::test(migrations = "../migrations")]
async fn a_worker_is_online_until_three_of_its_intervals_pass(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    for (id, age_ms, stopped) in [("a", 1_000, false), ("b", 5_000, false), ("c", 0, true)] {
        sqlx::query(
            "INSERT INTO chime_workers (id, group_name, hostname, capacity, jobs,
                                        heartbeat_interval_ms, heartbeat_at, stopped_at)
             VALUES ($1, 'g', 'h', 1, '{}', 1000, now() - $2 * interval '1 millisecond',
                     CASE WHEN $3 THEN now() END)",
        )
        .bind(id)
        .bind(age_ms)
        .bind(stopped)
        .execute(&pool)
        .await
        .unwrap();
    }
    let online: Vec<(String, bool)> = store
        .workers()
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.id, w.online))
        .collect();
    assert_eq!(
        online,
        [("a".into(), true), ("b".into(), false), ("c".into(), false)]
    );
    assert_eq!(store.workers_online().await.unwrap(), [("g".into(), 1)]);
}

/// The `chime_*` functions docs/protocol.md names (as `chime_name(`).
fn functions_named_in(doc: &str) -> std::collections::BTreeSet<String> {
    let mut named = std::collections::BTreeSet::new();
    let mut rest = doc;
    while let Some(at) = rest.find("chime_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        if tail[len..].starts_with('(') {
            named.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    named
}

/// docs/protocol.md and the schema name the same protocol functions: every `chime_*(` the
/// page names exists, and every function whose comment says `Protocol:` is on the page.
#[sqlx::test(migrations = "../migrations")]
async fn the_protocol_doc_names_exactly_the_schemas_protocol_functions(pool: PgPool) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"))
        .expect("docs/protocol.md");
    let named = functions_named_in(&doc);
    let functions: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT p.proname::text, obj_description(p.oid, 'pg_proc')
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = current_schema() AND p.proname LIKE 'chime\\_%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let exists: std::collections::BTreeSet<&str> =
        functions.iter().map(|(name, _)| name.as_str()).collect();
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !exists.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/protocol.md names functions the schema lacks: {missing:?}"
    );
    let protocol: Vec<&str> = functions
        .iter()
        .filter(|(_, comment)| {
            comment
                .as_deref()
                .is_some_and(|c| c.starts_with("Protocol:"))
        })
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(protocol.len() >= 10, "protocol functions: {protocol:?}");
    let undocumented: Vec<&&str> = protocol.iter().filter(|p| !named.contains(**p)).collect();
    assert!(
        undocumented.is_empty(),
        "docs/protocol.md does not name protocol functions {undocumented:?}"
    );
}

/// The SQL string literals passed to `query`, `query_as` and `query_scalar` in `source`.
fn query_literals(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for call in ["query(", "query_as(", "query_scalar("] {
        let mut rest = source;
        while let Some(at) = rest.find(call) {
            rest = &rest[at + call.len()..];
            let trimmed = rest.trim_start();
            let Some(body) = trimmed.strip_prefix('"') else {
                continue;
            };
            let mut sql = String::new();
            let mut chars = body.chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        Some('\n') => {
                            // A line continuation: the next line's indentation is skipped.
                            while chars.next_if(|c| c.is_whitespace()).is_some() {}
                        }
                        Some('n') => sql.push('\n'),
                        Some(other) => sql.push(other),
                        None => break,
                    },
                    c => sql.push(c),
                }
            }
            found.push(sql);
        }
    }
    found
}

/// Every static statement of the scheduler's store (string literals and `const`s) prepares
/// against the migrated schema, or fails for want of a parameter's type only: a renamed table,
/// column or function fails CI, not production.
/// Statements assembled with `format!` are not listed here; the store's tests run each.
#[sqlx::test(migrations = "../migrations")]
async fn every_static_statement_of_the_store_prepares(pool: PgPool) {
    let sources = [
        include_str!("../store.rs"),
        include_str!("dead_letters.rs"),
        include_str!("failures.rs"),
        include_str!("grants.rs"),
        include_str!("ops.rs"),
        include_str!("overdue.rs"),
        include_str!("report.rs"),
        include_str!("timeline.rs"),
    ];
    let mut statements: Vec<String> = sources.iter().flat_map(|s| query_literals(s)).collect();
    statements.push(MARK_PUBLISHED_SQL.to_owned());
    assert!(
        statements.len() > 40,
        "found only {} statements",
        statements.len()
    );
    let mut conn = pool.acquire().await.unwrap();
    let mut failed = Vec::new();
    for sql in statements {
        let Err(e) = (&mut *conn)
            .prepare(sqlx::AssertSqlSafe(sql.clone()).into_sql_str())
            .await
        else {
            continue;
        };
        // Prepared without the types the binds give at run time, a parameter's type may stay
        // undetermined (`$2 - interval …`): only a missing name is this test's business.
        let missing = e.as_database_error().is_some_and(|db| {
            matches!(db.code().as_deref(), Some("42703" | "42P01"))
                || (db.code().as_deref() == Some("42883") && db.message().starts_with("function"))
        });
        if missing {
            failed.push(format!("{e}\n{sql}"));
        }
    }
    assert!(
        failed.is_empty(),
        "statements that do not prepare:\n{}",
        failed.join("\n\n")
    );
}

/// Each checked write of fires adds one to the planner's write count (`chime_plan_writes`); a
/// database whose count is lower than the planner's (acknowledged writes lost in a failover to
/// an asynchronous standby) refuses the next write, names both counts and writes nothing, and
/// a planner starting again from the database's count writes.
#[sqlx::test(migrations = "../migrations")]
async fn a_database_that_lost_planner_writes_refuses_the_next_one(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "j", serde_json::json!({})).await;
    job(&pool, "k", serde_json::json!({})).await;
    let fence = lead(&store).await;
    let mut writes = store.plan_writes().await.unwrap();
    assert_eq!(writes, 0);
    let created = store
        .insert_fires(&fence, Some(&mut writes), &[fire("j")])
        .await
        .unwrap();
    assert_eq!(created.map(|c| c.len()), Some(1));
    assert_eq!(writes, 1);
    assert_eq!(store.plan_writes().await.unwrap(), 1);

    // The database loses that write, as a promoted asynchronous standby would.
    sqlx::query("UPDATE chime_plan_writes SET writes = 0")
        .execute(&pool)
        .await
        .unwrap();
    let refused = store
        .insert_fires(&fence, Some(&mut writes), &[fire("k")])
        .await
        .expect_err("a count behind the planner's is refused");
    let lost = refused
        .downcast_ref::<PlanWritesLost>()
        .unwrap_or_else(|| panic!("not PlanWritesLost: {refused:#}"));
    assert_eq!((lost.expected, lost.found), (1, 0));
    assert!(
        refused.to_string().contains("synchronous replication"),
        "{refused}"
    );
    let (runs, cursor): (i64, Option<chrono::DateTime<Utc>>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM chime_runs WHERE job_name = 'k'),
                (SELECT cursor_at FROM chime_jobs WHERE name = 'k')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((runs, cursor), (0, None), "the refused write wrote nothing");

    let mut writes = store.plan_writes().await.unwrap();
    let created = store
        .insert_fires(&fence, Some(&mut writes), &[fire("k")])
        .await
        .unwrap();
    assert_eq!(created.map(|c| c.len()), Some(1));
    assert_eq!(writes, 1);
}
