//! Child jobs against a real database (`#[sqlx::test]`): a run's end queues it for the advance
//! only when its job names children for that end, the advance makes each child run once under
//! the fence (whatever repeats), a paused child is made skipped, a deleted one is reported, and
//! the SQL rule of which lists apply is the Rust one (`ChildJobs::after`).

use serde_json::json;
use sqlx::PgPool;

use super::{ChildRun, Fence, Store, insert_test_job};
use crate::job::ChildJobs;

/// Stores job `name` of group `g` with child lists `children` (JSON fields).
async fn job(pool: &PgPool, name: &str, children: serde_json::Value) {
    let mut spec = json!({"name": name, "group": "g", "params": {"from": name}});
    if let (Some(spec), Some(children)) = (spec.as_object_mut(), children.as_object()) {
        spec.extend(children.clone());
    }
    insert_test_job(pool, name, spec).await;
}

/// A running top-level run of `job`.
async fn running(pool: &PgPool, job: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt)
         VALUES ($1, 'g', now(), 'schedule', 'running', 1) RETURNING id",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .expect("the run is stored")
}

/// Ends run `id` in `state`, as an outcome would.
async fn end(pool: &PgPool, id: i64, state: &str) {
    sqlx::query("UPDATE chime_runs SET state = $2, finished_at = now() WHERE id = $1")
        .bind(id)
        .bind(state)
        .execute(pool)
        .await
        .expect("the run ends");
}

async fn queued(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT run_id FROM chime_advances ORDER BY run_id")
        .fetch_all(pool)
        .await
        .expect("the queue reads")
}

/// The child runs of `upstream`: (job, state, trigger, params' `from`).
async fn children_of(pool: &PgPool, upstream: i64) -> Vec<(String, String, String, String)> {
    sqlx::query_as(
        "SELECT job_name, state, trigger, params->>'from' FROM chime_runs
          WHERE upstream_run_id = $1 ORDER BY id",
    )
    .bind(upstream)
    .fetch_all(pool)
    .await
    .expect("the children read")
}

async fn advance(store: &Store, fence: &Fence) -> Vec<ChildRun> {
    store
        .advance(fence, 100)
        .await
        .expect("the advance runs")
        .expect("the fence holds")
}

fn made(children: &[ChildRun]) -> Vec<(i64, &str)> {
    children
        .iter()
        .filter(|c| c.run_id.is_some())
        .map(|c| (c.upstream_id, c.job.as_str()))
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn each_end_starts_its_lists_children_once(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(
        &pool,
        "a",
        json!({"on_success": ["b", "c"], "on_failure": ["d"], "on_complete": ["c", "e"]}),
    )
    .await;
    for name in ["b", "c", "d", "e"] {
        job(&pool, name, json!({})).await;
    }
    let fence = store.lead_for_test("t").await;
    let ok = running(&pool, "a").await;
    let failed = running(&pool, "a").await;
    let dead = running(&pool, "a").await;
    let cancelled = running(&pool, "a").await;
    end(&pool, ok, "succeeded").await;
    end(&pool, failed, "failed").await;
    end(&pool, dead, "dead").await;
    end(&pool, cancelled, "cancelled").await;
    // A cancelled run starts nothing, so it is not queued at all.
    assert_eq!(queued(&pool).await, [ok, failed, dead]);

    let children = advance(&store, &fence).await;
    assert_eq!(
        made(&children),
        [
            (ok, "b"),
            (ok, "c"),
            (ok, "e"),
            (failed, "d"),
            (failed, "c"),
            (failed, "e"),
            (dead, "d"),
            (dead, "c"),
            (dead, "e"),
        ]
    );
    assert!(queued(&pool).await.is_empty(), "the queue is taken");
    let of_ok = children_of(&pool, ok).await;
    let jobs: Vec<&str> = of_ok.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(jobs, ["b", "c", "e"]);
    for (job, state, trigger, from) in &of_ok {
        assert_eq!(
            (state.as_str(), trigger.as_str(), from.as_str()),
            ("pending", "child", job.as_str()),
            "a child run is pending, trigger child, with its own job's params"
        );
    }
    assert!(children_of(&pool, cancelled).await.is_empty());

    // Nothing left: an advance again makes nothing; queued again (a repeated end), it finds
    // every child made and makes none a second time.
    assert!(advance(&store, &fence).await.is_empty());
    sqlx::query("INSERT INTO chime_advances (run_id) VALUES ($1), ($2)")
        .bind(ok)
        .bind(failed)
        .execute(&pool)
        .await
        .expect("queued again");
    let again = advance(&store, &fence).await;
    assert_eq!(again.len(), 6, "each child wanted again");
    assert!(made(&again).is_empty(), "and none made twice");
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM chime_runs WHERE trigger = 'child'")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(total, 9);
}

/// Children of one job made in one statement share its now(): the fire key must not make one
/// of them conflict with the other, nor a child with a scheduled run of that instant.
#[sqlx::test(migrations = "../migrations")]
async fn children_of_one_job_in_one_advance_do_not_collide(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "a", json!({"on_complete": ["b"]})).await;
    job(&pool, "b", json!({})).await;
    let fence = store.lead_for_test("t").await;
    let runs = [running(&pool, "a").await, running(&pool, "a").await];
    for id in runs {
        end(&pool, id, "succeeded").await;
    }
    let children = advance(&store, &fence).await;
    assert_eq!(made(&children), [(runs[0], "b"), (runs[1], "b")]);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_paused_child_is_skipped_and_a_deleted_one_reported(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "a", json!({"on_success": ["sleepy", "gone"]})).await;
    job(&pool, "sleepy", json!({})).await;
    sqlx::query("UPDATE chime_jobs SET paused = true WHERE name = 'sleepy'")
        .execute(&pool)
        .await
        .expect("paused");
    let fence = store.lead_for_test("t").await;
    let run = running(&pool, "a").await;
    end(&pool, run, "succeeded").await;
    let children = advance(&store, &fence).await;
    assert_eq!(children.len(), 2);
    assert_eq!(children[0].state.as_deref(), Some("skipped"));
    assert!(children[0].known);
    assert_eq!(
        (
            children[1].job.as_str(),
            children[1].run_id,
            children[1].known
        ),
        ("gone", None, false)
    );
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM chime_runs WHERE upstream_run_id = $1")
            .bind(run)
            .fetch_one(&pool)
            .await
            .expect("the skipped child");
    assert_eq!(
        reason,
        format!("job sleepy is paused; not run after run {run}")
    );
}

/// A leader whose term ended makes nothing and leaves the queue for the next one.
#[sqlx::test(migrations = "../migrations")]
async fn an_advance_without_the_fence_makes_nothing(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "a", json!({"on_success": ["b"]})).await;
    job(&pool, "b", json!({})).await;
    let fence = store.lead_for_test("t").await;
    let run = running(&pool, "a").await;
    end(&pool, run, "succeeded").await;
    let stale = Fence {
        holder: fence.holder.clone(),
        term: fence.term - 1,
    };
    assert!(
        store
            .advance(&stale, 100)
            .await
            .expect("the call")
            .is_none()
    );
    assert_eq!(queued(&pool).await, [run], "the queue is kept");
    assert!(children_of(&pool, run).await.is_empty());
    assert_eq!(made(&advance(&store, &fence).await), [(run, "b")]);
}

/// A task's end queues nothing (its fire's does), and a run of a job without children neither.
#[sqlx::test(migrations = "../migrations")]
async fn only_top_level_runs_with_children_are_queued(pool: PgPool) {
    let (parent, tasks) = super::tests_tasks::sharded_run(&pool, "fan", 2, None).await;
    sqlx::query(
        "UPDATE chime_jobs SET spec = spec || '{\"on_success\": [\"fan\"]}' WHERE name = 'fan'",
    )
    .execute(&pool)
    .await
    .expect("children");
    for task in &tasks {
        super::tests_tasks::set_task(&pool, *task, "succeeded", Some("w1"), None).await;
    }
    let state: String = sqlx::query_scalar("SELECT state FROM chime_runs WHERE id = $1")
        .bind(parent)
        .fetch_one(&pool)
        .await
        .expect("the parent");
    assert_eq!(state, "succeeded", "the fire ended with its tasks");
    assert_eq!(
        queued(&pool).await,
        [parent],
        "the fire is queued, not its tasks"
    );
    job(&pool, "plain", json!({})).await;
    let run = running(&pool, "plain").await;
    end(&pool, run, "succeeded").await;
    assert_eq!(queued(&pool).await, [parent]);
}

/// `chime_job_children` and `ChildJobs::after` agree on every end state.
#[sqlx::test(migrations = "../migrations")]
async fn the_sql_rule_of_which_lists_apply_is_the_rust_one(pool: PgPool) {
    let children = ChildJobs {
        on_success: vec!["s1".into(), "both".into()],
        on_failure: vec!["f1".into(), "both".into()],
        on_complete: vec!["both".into(), "c1".into()],
    };
    let spec = serde_json::to_value(&children).expect("serialises");
    for state in [
        "succeeded",
        "failed",
        "dead",
        "lost",
        "cancelled",
        "skipped",
        "running",
    ] {
        let sql: Vec<String> = sqlx::query_scalar("SELECT chime_job_children($1, $2)")
            .bind(&spec)
            .bind(state)
            .fetch_one(&pool)
            .await
            .expect("the function");
        assert_eq!(sql, children.after(state), "{state}");
    }
    assert_eq!(children.after("succeeded"), ["s1", "both", "c1"]);
}

/// The API's check reads what the stored links reach, cycles included, and ends.
#[sqlx::test(migrations = "../migrations")]
async fn child_links_reads_every_reachable_job(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "b", json!({"on_success": ["c"]})).await;
    job(
        &pool,
        "c",
        json!({"on_failure": ["b"], "on_complete": ["d"]}),
    )
    .await;
    job(&pool, "d", json!({})).await;
    job(&pool, "other", json!({"on_success": ["d"]})).await;
    let links = store
        .child_links(&["b".to_owned(), "missing".to_owned()])
        .await
        .expect("the links");
    let mut names: Vec<&String> = links.keys().collect();
    names.sort();
    assert_eq!(names, ["b", "c", "d"]);
    assert_eq!(links["c"].on_complete, ["d"]);
    let naming = store
        .jobs_naming(&["d".to_owned(), "b".to_owned()])
        .await
        .expect("the jobs naming d or b");
    let pairs: Vec<(&str, &str)> = naming
        .iter()
        .map(|(job, child)| (job.as_str(), child.as_str()))
        .collect();
    assert_eq!(pairs, [("c", "b"), ("c", "d"), ("other", "d")]);
    assert!(store.jobs_naming(&[]).await.expect("none").is_empty());
}

/// A full batch leaves the rest queued and wakes the sweep for it (`advance more`), the one
/// way the rest is taken at once.
#[sqlx::test(migrations = "../migrations")]
async fn a_full_batch_wakes_the_sweep_for_the_rest(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    job(&pool, "a", json!({"on_success": ["b"]})).await;
    job(&pool, "b", json!({})).await;
    let fence = store.lead_for_test("t").await;
    let runs = [running(&pool, "a").await, running(&pool, "a").await];
    for id in runs {
        end(&pool, id, "succeeded").await;
    }
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("listener");
    listener
        .listen(super::OUTBOX_CHANNEL)
        .await
        .expect("listen");
    let first = store
        .advance(&fence, 1)
        .await
        .expect("advance")
        .expect("fence");
    assert_eq!(made(&first), [(runs[0], "b")]);
    assert_eq!(queued(&pool).await, [runs[1]], "the rest stays queued");
    let woken = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification arrives")
        .expect("notification");
    assert_eq!(woken.payload(), "advance more");
    let rest = store
        .advance(&fence, 1)
        .await
        .expect("advance")
        .expect("fence");
    assert_eq!(made(&rest), [(runs[1], "b")]);
}
