//! Reading a run's tasks against a real database (`#[sqlx::test]`): top-level lists leave
//! tasks out, a parent pages its tasks by id, a task names its parent, and lists cut a long
//! output. Also the fixture the API, CLI and metrics tests build a sharded run with.

use serde_json::{Value, json};
use sqlx::PgPool;

use super::{MAX_LISTED_OUTPUT_BYTES, RunFilter, RunQuery, Store, TaskQuery, task_progress};

/// A sharded job `job` of group `g1` with `shards` shards (and `shard_params`, if given) and
/// one fire of it expanded into its tasks as the leader does (`chime_expand_run` under a test
/// lease): the parent (pending) and its tasks (queued), in shard order.
pub(crate) async fn sharded_run(
    pool: &PgPool,
    job: &str,
    shards: i32,
    shard_params: Option<Value>,
) -> (i64, Vec<i64>) {
    let mut spec = json!({"name": job, "group": "g1", "kind": "sharded", "shards": shards});
    if let Some(params) = shard_params {
        spec["shard_params"] = params;
    }
    sqlx::query(
        "INSERT INTO chime_jobs (name, group_name, spec, source) VALUES ($1, 'g1', $2, 'api')",
    )
    .bind(job)
    .bind(&spec)
    .execute(pool)
    .await
    .expect("the job is stored");
    let parent: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, params)
         VALUES ($1, 'g1', now(), 'schedule', 'pending', '{\"batch\": 1}') RETURNING id",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .expect("the parent is stored");
    sqlx::query(
        "UPDATE chime_leader SET holder = 't', term = 1, expires_at = now() + interval '1 hour'",
    )
    .execute(pool)
    .await
    .expect("the test leads");
    let tasks: Vec<i64> = sqlx::query_scalar("SELECT id FROM chime_expand_run('t', 1, $1)")
        .bind(parent)
        .fetch_all(pool)
        .await
        .expect("the parent expands");
    assert_eq!(tasks.len(), shards as usize, "one task per shard");
    (parent, tasks)
}

/// Sets task `id`'s state (and worker, attempt, output when given), as its worker's calls
/// would: the parent's counters and state follow (trigger `chime_runs_task_changed`).
pub(crate) async fn set_task(
    pool: &PgPool,
    id: i64,
    state: &str,
    worker: Option<&str>,
    output: Option<Value>,
) {
    sqlx::query(
        "UPDATE chime_runs SET state = $2, worker_id = coalesce($3, worker_id),
                attempt = CASE WHEN $3::text IS NULL THEN attempt ELSE greatest(attempt, 1) END,
                started_at = CASE WHEN $3::text IS NULL THEN started_at
                                  ELSE coalesce(started_at, now() - interval '2 seconds') END,
                finished_at = CASE WHEN chime_run_ended($2) THEN now() END,
                output = coalesce($4, output),
                error = CASE WHEN $2 = 'failed' THEN 'boom' END
          WHERE id = $1",
    )
    .bind(id)
    .bind(state)
    .bind(worker)
    .bind(output)
    .execute(pool)
    .await
    .expect("the task's state is set");
}

#[test]
fn progress_reads_the_counters_in_one_wording() {
    assert_eq!(task_progress(0, 0, 0), None, "a run without tasks");
    assert_eq!(task_progress(12, 12, 0).as_deref(), Some("12/12 ok"));
    assert_eq!(
        task_progress(12, 10, 1).as_deref(),
        Some("9/12 ok, 1 failed, 2 left")
    );
    assert_eq!(task_progress(12, 0, 0).as_deref(), Some("0/12 ok, 12 left"));
    assert_eq!(task_progress(3, 3, 3).as_deref(), Some("0/3 ok, 3 failed"));
}

#[sqlx::test(migrations = "../migrations")]
async fn lists_leave_tasks_out_and_a_parent_pages_its_tasks_by_id(pool: PgPool) {
    let store = Store::from_pool(pool.clone());
    let (parent, tasks) = sharded_run(&pool, "shard", 12, None).await;
    let long = json!({"rows": "x".repeat(5000)});
    for (i, id) in tasks.iter().enumerate() {
        match i {
            0..9 => {
                let output = (i == 0).then(|| long.clone());
                set_task(&pool, *id, "running", Some("w1"), None).await;
                set_task(&pool, *id, "succeeded", None, output).await;
            }
            9 => set_task(&pool, *id, "failed", Some("w2"), None).await,
            _ => set_task(&pool, *id, "running", Some("w1"), None).await,
        }
    }

    let top = store
        .list_runs(&RunFilter {
            limit: 100,
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(top.iter().map(|r| r.id).collect::<Vec<_>>(), [parent]);
    let shown = &top[0];
    assert_eq!(
        (shown.tasks_total, shown.tasks_ended, shown.tasks_failed),
        (12, 10, 1)
    );
    assert_eq!(shown.progress.as_deref(), Some("9/12 ok, 1 failed, 2 left"));
    assert_eq!(shown.state, "running", "the parent runs with its tasks");
    let all = store
        .runs_page(&RunQuery {
            limit: 100,
            include_tasks: true,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 13, "with tasks: the parent and its 12 tasks");
    let page = store
        .runs_page(&RunQuery {
            limit: 100,
            job: Some("shard".into()),
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.len(), 1, "a job's runs page lists its fires");

    // Pages of 5 by id: 5, 5, 2, in shard order.
    let mut after = None;
    let mut keys = Vec::new();
    loop {
        let page = store
            .tasks_page(&TaskQuery {
                parent,
                after,
                state: None,
                limit: 5,
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        keys.extend(page.iter().map(|t| t.task_key.clone().unwrap()));
    }
    let expected: Vec<String> = (0..12).map(|i| format!("shard/{i}")).collect();
    assert_eq!(keys, expected);
    let failed = store
        .tasks_page(&TaskQuery {
            parent,
            after: None,
            state: Some("failed".into()),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(failed.iter().map(|t| t.id).collect::<Vec<_>>(), [tasks[9]]);
    assert_eq!(failed[0].shard_index, Some(9));
    assert_eq!(failed[0].shard_total, Some(12));
    assert_eq!(failed[0].task_kind.as_deref(), Some("shard"));

    // A list cuts the long output; the task's own view has it whole.
    let first = store
        .tasks_page(&TaskQuery {
            parent,
            after: None,
            state: None,
            limit: 1,
        })
        .await
        .unwrap();
    assert!(first[0].output_truncated);
    let cut = first[0].output.as_ref().and_then(Value::as_str).unwrap();
    assert!(cut.len() <= MAX_LISTED_OUTPUT_BYTES, "{}", cut.len());
    // The database's JSON text: `{"rows": "xxx…`.
    assert!(cut.starts_with("{\"rows\": \"xxx"), "{cut}");
    assert!(cut.ends_with("…[truncated]"), "{cut}");
    let task = store.run(tasks[0]).await.unwrap().unwrap();
    assert_eq!(task.run.output.as_ref(), Some(&long));
    assert!(!task.run.output_truncated);
    let shown_parent = task.parent.expect("a task names its parent");
    assert_eq!(shown_parent.id, parent);
    assert_eq!(task.run.parent_id, Some(parent));
    assert!(task.tasks_by_state.is_empty());

    let detail = store.run(parent).await.unwrap().unwrap();
    assert!(detail.parent.is_none());
    assert_eq!(
        detail.tasks_by_state.into_iter().collect::<Vec<_>>(),
        [
            ("failed".to_owned(), 1),
            ("running".to_owned(), 2),
            ("succeeded".to_owned(), 9)
        ]
    );
}

/// A page of a parent's tasks is a range scan of `chime_runs_task_order`, also when its tasks
/// are spread among other runs' (mapped tasks are created while other fires run), not a walk
/// of the primary key nor a sort of every task of the run.
#[sqlx::test(migrations = "../migrations")]
async fn a_page_of_tasks_reads_the_task_order_index(pool: PgPool) {
    let (a, _) = sharded_run(&pool, "wide", 1, None).await;
    let (b, _) = sharded_run(&pool, "other", 1, None).await;
    // 20,000 tasks, one in 20 of them `a`'s.
    sqlx::query(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, parent_id,
                                 task_key, task_kind)
         SELECT 'wide', 'g1', now(), 'schedule', 'queued',
                CASE WHEN g % 20 = 0 THEN $1 ELSE $2 END, 'm/' || g, 'map'
           FROM generate_series(1, 20000) g",
    )
    .bind(a)
    .bind(b)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE chime_runs")
        .execute(&pool)
        .await
        .unwrap();
    let plan: Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) SELECT {} FROM chime_runs
          WHERE parent_id = $1 AND id > coalesce($2, 0) AND ($3::text IS NULL OR state = $3)
          ORDER BY id LIMIT $4",
        super::LISTED_RUN_COLUMNS
    )))
    .bind(a)
    .bind(None::<i64>)
    .bind(None::<String>)
    .bind(101_i64)
    .persistent(false)
    .fetch_one(&pool)
    .await
    .unwrap();
    let text = plan.to_string();
    assert!(text.contains("chime_runs_task_order"), "{plan:#}");
    assert!(!text.contains("\"Sort\""), "{plan:#}");
}
