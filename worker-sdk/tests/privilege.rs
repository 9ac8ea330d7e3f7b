//! The SDK under least privilege (docs/protocol.md section 11): a worker connected as a login
//! role granted only its group (`chime_grant_worker`) runs a job end to end — claim, log lines,
//! a failed attempt decided by the database (`chime_retry_decision`), its retry, the outcome, the
//! registry — so a worker needs nothing more; a trigger naming another group's run is parked,
//! and [`chime_worker::Client`] triggers runs of its group's jobs only.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use chime_protocol::wire::HEADER_DEAD_REASON;
use chime_test_kit::{RoleGuard, done_if, wait_for};
use chime_worker::{Client, JobContext, JobError, TriggerError};
use serde_json::json;
use sqlx::PgPool;
use support::{Env, WAIT, header};

#[sqlx::test(migrations = "../migrations")]
async fn a_worker_granted_only_its_group_runs_a_job_end_to_end(pool: PgPool) {
    let env = Env::new(pool).await;
    let role = RoleGuard::create(&env.pool, "chime_test_sdk").await;
    sqlx::query("SELECT chime_grant_worker($1, $2, 'test')")
        .bind(&role.name)
        .bind(&env.group)
        .execute(&env.pool)
        .await
        .unwrap();
    for (job, group) in [("flaky", env.group.as_str()), ("theirs", "another-group")] {
        sqlx::query("INSERT INTO chime_jobs (name, group_name, spec) VALUES ($1, $2, '{}')")
            .bind(job)
            .bind(group)
            .execute(&env.pool)
            .await
            .unwrap();
    }
    let as_worker = role.connect(8).await;

    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let worker = env
        .worker()
        .pool(as_worker.clone())
        .handle("flaky", move |ctx: JobContext, _: serde_json::Value| {
            let call = counted.fetch_add(1, SeqCst);
            async move {
                ctx.log().info(format!("attempt {}", ctx.attempt()));
                if call == 0 {
                    Err(JobError::retry("not yet"))
                } else {
                    Ok(())
                }
            }
        })
        .build()
        .unwrap();
    let running = env.start(worker);

    let run_id = env.insert_run("flaky", &json!({})).await;
    let mut trigger = env.trigger(run_id, "flaky", json!({})).await;
    trigger.retry = Some(support::policy(3, 100, 1.0, 100));
    env.publish(&trigger).await;
    let run = env.run_in_state(run_id, "succeeded").await;
    assert_eq!(run.attempt, 2);
    let attempts = env.attempts(run_id).await;
    let states: Vec<&str> = attempts.iter().map(|a| a.state.as_str()).collect();
    assert_eq!(states, ["failed", "succeeded"]);
    // The retry waited the snapshot's 100 ms, decided by the database.
    let gap = attempts[1].started_at - attempts[0].finished_at.unwrap();
    assert!(gap.num_milliseconds() >= 90, "{gap:?}");
    let logs = env.logs(run_id).await;
    assert_eq!(logs.len(), 2, "{logs:?}");

    // A trigger naming a run of another group is parked; that run is untouched.
    let theirs: i64 = sqlx::query_scalar(
        "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state)
         VALUES ('flaky', 'another-group', now(), 'manual', 'queued') RETURNING id",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let forged = env.trigger(theirs, "flaky", json!({})).await;
    env.publish(&forged).await;
    let parked = wait_for(WAIT, "the forged trigger to be parked", || async {
        done_if(env.take_parked().await, Option::is_some)
    })
    .await
    .unwrap();
    let reason = header(&parked, HEADER_DEAD_REASON).unwrap();
    assert!(
        reason.starts_with(&format!(
            "implausible trigger: run {theirs} is not of a group this worker may act for: "
        )) && reason.contains("another-group"),
        "{reason}"
    );
    assert_eq!(env.run(theirs).await.state, "queued");
    assert_eq!(calls.load(SeqCst), 2);

    // Triggering from code, as the worker's role: its group's jobs only.
    let client = Client::new(as_worker.clone()).actor("billing-service");
    let made = client
        .trigger("flaky")
        .params(&json!({"invoice": 42}))
        .unwrap()
        .idempotency_key("invoice-42")
        .send()
        .await
        .unwrap();
    assert!(made.created);
    let again = client
        .trigger("flaky")
        .idempotency_key("invoice-42")
        .send()
        .await
        .unwrap();
    assert_eq!((again.run_id, again.created), (made.run_id, false));
    let (params, by): (serde_json::Value, String) =
        sqlx::query_as("SELECT params, requested_by FROM chime_runs WHERE id = $1")
            .bind(made.run_id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        (params, by.as_str()),
        (json!({"invoice": 42}), "billing-service")
    );
    match client.trigger("theirs").send().await {
        Err(TriggerError::Forbidden(message)) => {
            assert!(
                message.contains("chime workers grant --group another-group"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    match client.trigger("flaky").idempotency_key("").send().await {
        Err(TriggerError::Invalid { field, .. }) => assert_eq!(field, "idempotency_key"),
        other => panic!("{other:?}"),
    }

    running.stop().await;
    as_worker.close().await;
    env.cleanup().await;
}
