//! Child jobs end to end, with a real scheduler, a real worker, PostgreSQL and RabbitMQ: a
//! three-job chain passes each handler's output to the next through `ctx.parent()`, a failure
//! takes the `on_failure` branch and not the `on_success` one, and a leader killed while ended
//! runs wait for their children leaves the next leader to make each child once: every upstream
//! run gets exactly one child run, run exactly once.

use std::collections::HashMap;
use std::time::Duration;

use chime_e2e::{Events, Scheduler, Setup, wait_for};
use chime_worker::{CancellationToken, JobContext, JobError, Upstream};
use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};

use crate::common::job;
use crate::failures::support::trigger;
use crate::kinds::KindWorker;

/// Longest a test waits for runs to end.
const PATIENCE: Duration = Duration::from_secs(60);

/// One handler call: the run, its job, and the upstream run `ctx.parent()` read.
#[derive(Debug, Clone)]
struct Call {
    run_id: i64,
    job: String,
    parent: Option<Upstream>,
}

/// A worker of the test's group with a handler for each of `jobs`: it records the call with
/// its parent, stores `{"job": <job>, "run": <id>}` as its output, waits for `gate` (when
/// given, for the job it names) to be cancelled, and fails when the params say
/// `{"fail": true}`.
fn chain_worker(
    t: &Setup,
    jobs: &[&str],
    calls: &Events<Call>,
    gate: Option<(&str, CancellationToken)>,
) -> KindWorker {
    KindWorker::start(t, "chain-worker", |mut builder| {
        builder = builder.capacity(32);
        for &name in jobs {
            let calls = calls.clone();
            let gate = gate
                .as_ref()
                .filter(|(gated, _)| *gated == name)
                .map(|(_, token)| token.clone());
            builder = builder.handle(name, move |ctx: JobContext, params: Value| {
                let (calls, gate) = (calls.clone(), gate.clone());
                async move {
                    if let Some(gate) = gate {
                        gate.cancelled().await;
                    }
                    let parent = ctx.parent().await.map_err(|e| e.into_job_error())?;
                    calls.record(Call {
                        run_id: ctx.run_id(),
                        job: ctx.job().to_owned(),
                        parent,
                    });
                    ctx.set_output(&json!({"job": ctx.job(), "run": ctx.run_id()}))
                        .await
                        .map_err(|e| e.into_job_error())?;
                    if params.get("fail") == Some(&json!(true)) {
                        return Err(JobError::fail("asked to fail"));
                    }
                    Ok::<(), JobError>(())
                }
            });
        }
        builder
    })
}

/// The runs of job `name`: (id, state, trigger, upstream_run_id), by id.
async fn runs_of(pool: &PgPool, name: &str) -> Vec<(i64, String, String, Option<i64>)> {
    sqlx::query(
        "SELECT id, state, trigger, upstream_run_id FROM chime_runs
          WHERE job_name = $1 AND parent_id IS NULL ORDER BY id",
    )
    .bind(name)
    .fetch_all(pool)
    .await
    .expect("read runs")
    .into_iter()
    .map(|r| {
        (
            r.get("id"),
            r.get("state"),
            r.get("trigger"),
            r.get("upstream_run_id"),
        )
    })
    .collect()
}

/// Waits until job `name` has `n` runs, all ended; them.
async fn ended_runs(
    pool: &PgPool,
    name: &str,
    n: usize,
) -> Vec<(i64, String, String, Option<i64>)> {
    wait_for(PATIENCE, &format!("{n} ended runs of {name}"), || async {
        let runs = runs_of(pool, name).await;
        let done = runs.len() >= n
            && runs.iter().all(|(_, state, _, _)| {
                !matches!(
                    state.as_str(),
                    "pending" | "queued" | "running" | "retrying"
                )
            });
        done.then_some(runs)
    })
    .await
}

#[sqlx::test(migrations = "../migrations")]
async fn a_chain_passes_each_output_to_the_next_and_a_failure_takes_its_branch(pool: PgPool) {
    let t = Setup::new(&pool);
    let specs = vec![
        job(
            json!({"name": "extract", "group": t.group, "on_success": ["load"],
                   "on_failure": ["alert"], "retry": {"max_attempts": 1}}),
        ),
        job(json!({"name": "load", "group": t.group, "on_complete": ["report"]})),
        job(json!({"name": "report", "group": t.group})),
        job(json!({"name": "alert", "group": t.group})),
    ];
    let scheduler = Scheduler::on(&t, "s1", specs);
    let calls = Events::new();
    let worker = chain_worker(&t, &["extract", "load", "report", "alert"], &calls, None);

    let extract = trigger(&pool, "extract", json!({})).await;
    let report = ended_runs(&pool, "report", 1).await;
    let load = runs_of(&pool, "load").await;
    assert_eq!(load.len(), 1, "one load run: {load:?}");
    assert_eq!(
        (load[0].1.as_str(), load[0].2.as_str(), load[0].3),
        ("succeeded", "child", Some(extract))
    );
    assert_eq!(
        (report[0].1.as_str(), report[0].2.as_str(), report[0].3),
        ("succeeded", "child", Some(load[0].0))
    );
    assert!(
        runs_of(&pool, "alert").await.is_empty(),
        "no failure, no alert"
    );
    let by_job: HashMap<String, Call> = calls
        .all()
        .into_iter()
        .map(|call| (call.job.clone(), call))
        .collect();
    assert!(
        by_job["extract"].parent.is_none(),
        "a triggered run has no parent"
    );
    let parent = by_job["load"].parent.clone().expect("load has a parent");
    assert_eq!(
        (parent.run_id, parent.job.as_str(), parent.state.as_str()),
        (extract, "extract", "succeeded")
    );
    assert_eq!(
        parent.output,
        Some(json!({"job": "extract", "run": extract}))
    );
    assert!(parent.finished_at.is_some());
    let parent = by_job["report"]
        .parent
        .clone()
        .expect("report has a parent");
    assert_eq!((parent.run_id, parent.job.as_str()), (load[0].0, "load"));
    assert_eq!(calls.len(), 3, "each run once");

    // A failed extract starts alert, which sees the failure; load does not run.
    let failed = trigger(&pool, "extract", json!({"fail": true})).await;
    let alert = ended_runs(&pool, "alert", 1).await;
    assert_eq!(
        (alert[0].1.as_str(), alert[0].3),
        ("succeeded", Some(failed))
    );
    let seen = calls
        .all()
        .into_iter()
        .find(|call| call.job == "alert")
        .and_then(|call| call.parent)
        .expect("alert read its parent");
    assert_eq!(
        (seen.run_id, seen.state.as_str(), seen.error.as_deref()),
        (failed, "failed", Some("asked to fail"))
    );
    assert_eq!(
        runs_of(&pool, "load").await.len(),
        1,
        "no load after a failure"
    );

    worker.stop().await;
    scheduler.stop().await.expect("graceful stop");
    t.finish().await;
}

/// Runs of `upstream` end while no leader advances (the leader was killed while they ran):
/// the next leader makes their children from the queue, each once, and each runs once.
#[sqlx::test(migrations = "../migrations")]
async fn a_new_leader_makes_each_child_once_after_the_old_one_was_killed(pool: PgPool) {
    const RUNS: usize = 20;
    let t = Setup::new(&pool);
    let specs = vec![
        job(json!({"name": "upstream", "group": t.group, "on_complete": ["child"]})),
        job(json!({"name": "child", "group": t.group})),
    ];
    let first = Scheduler::on(&t, "s1", specs.clone());
    let calls = Events::new();
    let gate = CancellationToken::new();
    let worker = chain_worker(
        &t,
        &["upstream", "child"],
        &calls,
        Some(("upstream", gate.clone())),
    );
    let mut upstream = Vec::new();
    for _ in 0..RUNS {
        upstream.push(trigger(&pool, "upstream", json!({})).await);
    }
    wait_for(PATIENCE, "every upstream run running", || async {
        let runs = runs_of(&pool, "upstream").await;
        runs.iter().all(|r| r.1 == "running").then_some(())
    })
    .await;
    first.kill().await;
    gate.cancel();
    let ended = ended_runs(&pool, "upstream", RUNS).await;
    assert!(ended.iter().all(|r| r.1 == "succeeded"));
    let queue = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM chime_advances")
            .fetch_one(&pool)
            .await
            .expect("queue")
    };
    assert_eq!(queue().await, RUNS as i64, "ended without a leader: queued");
    assert!(runs_of(&pool, "child").await.is_empty());

    let second = Scheduler::on(&t, "s2", specs);
    let children = ended_runs(&pool, "child", RUNS).await;
    let mut made_for: Vec<i64> = children.iter().filter_map(|c| c.3).collect();
    made_for.sort_unstable();
    assert_eq!(
        made_for, upstream,
        "one child run per upstream run, no more"
    );
    assert!(children.iter().all(|c| c.1 == "succeeded"));
    let mut child_calls: HashMap<i64, usize> = HashMap::new();
    for call in calls.all().into_iter().filter(|call| call.job == "child") {
        *child_calls.entry(call.run_id).or_default() += 1;
    }
    assert_eq!(child_calls.len(), RUNS);
    assert!(child_calls.values().all(|n| *n == 1), "{child_calls:?}");
    assert_eq!(queue().await, 0, "nothing left to advance");
    worker.stop().await;
    second.stop().await.expect("graceful stop");
    t.finish().await;
}
