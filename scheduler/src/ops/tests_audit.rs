//! The audit path against a real database (`#[sqlx::test]`): every changing action writes
//! exactly one audit entry for each outcome — `ok`, `denied` (the body does not run) and
//! `failed` — and a read-only action writes one only when it is refused.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;

use super::{Action, Operations, OpsError, OpsResult};
use crate::auth::{Caller, Role};
use crate::store::{AuditQuery, RunQuery, Store};

/// Calls operations and checks the audit entries each call leaves.
struct Audit {
    pool: PgPool,
    /// The outcomes seen per action.
    seen: HashMap<Action, BTreeSet<&'static str>>,
}

impl Audit {
    /// `(action, outcome, job, run)` of the entries after `after`, oldest first.
    async fn entries_after(
        &self,
        after: i64,
    ) -> Vec<(String, String, Option<String>, Option<i64>)> {
        sqlx::query_as(
            "SELECT action, outcome, job_name, run_id FROM chime_audit WHERE id > $1 ORDER BY id",
        )
        .bind(after)
        .fetch_all(&self.pool)
        .await
        .expect("audit log")
    }

    async fn last_id(&self) -> i64 {
        sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM chime_audit")
            .fetch_one(&self.pool)
            .await
            .expect("audit log")
    }

    /// Runs `call`, which must end with `outcome` and leave exactly one entry: `action` with
    /// `outcome`, about `job` and `run` (`None`: any run). Returns what the call returned, if it
    /// succeeded, and the entry's run.
    async fn once<T: Debug>(
        &mut self,
        action: Action,
        outcome: &'static str,
        job: Option<&str>,
        run: Option<i64>,
        call: impl Future<Output = OpsResult<T>>,
    ) -> (Option<T>, Option<i64>) {
        let before = self.last_id().await;
        let result = call.await;
        match (outcome, &result) {
            ("ok", Ok(_)) => {}
            (
                "denied",
                Err(OpsError::Forbidden {
                    action: refused, ..
                }),
            ) => {
                assert_eq!(*refused, action);
            }
            ("failed", Err(e)) if !matches!(e, OpsError::Forbidden { .. }) => {}
            _ => panic!("{action} should end {outcome}: {result:?}"),
        }
        let entries = self.entries_after(before).await;
        assert_eq!(entries.len(), 1, "{action} {outcome}: {entries:?}");
        let (name, got, got_job, got_run) = entries.into_iter().next().expect("one entry");
        assert_eq!((name.as_str(), got.as_str()), (action.as_str(), outcome));
        assert_eq!(got_job.as_deref(), job, "{action} {outcome}: the job");
        if run.is_some() {
            assert_eq!(got_run, run, "{action} {outcome}: the run");
        }
        self.seen.entry(action).or_default().insert(outcome);
        (result.ok(), got_run)
    }

    /// Runs `call`, which must succeed and leave no entry.
    async fn none<T: Debug>(&self, what: &str, call: impl Future<Output = OpsResult<T>>) {
        let before = self.last_id().await;
        let result = call.await;
        assert!(result.is_ok(), "{what}: {result:?}");
        assert_eq!(self.entries_after(before).await, [], "{what}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn each_changing_action_is_audited_once_per_outcome(pool: PgPool) {
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let admin = Caller::cli();
    let operator = Caller::token("ops", Role::Operator);
    let viewer = Caller::token("eyes", Role::Viewer);
    let mut audit = Audit {
        pool,
        seen: HashMap::new(),
    };
    let (job, nope) = (Some("api-job"), Some("nope"));
    let definition = json!({"name": "api-job", "group": "g"});

    let a = Action::JobsCreate;
    audit
        .once(
            a,
            "denied",
            job,
            None,
            ops.create_job(&operator, definition.clone()),
        )
        .await;
    audit
        .once(
            a,
            "ok",
            job,
            None,
            ops.create_job(&admin, definition.clone()),
        )
        .await;
    audit
        .once(a, "failed", job, None, ops.create_job(&admin, definition))
        .await;

    let a = Action::JobsUpdate;
    let change = || json!({"every": "1m"});
    audit
        .once(
            a,
            "denied",
            job,
            None,
            ops.update_job(&operator, "api-job", change()),
        )
        .await;
    audit
        .once(
            a,
            "ok",
            job,
            None,
            ops.update_job(&admin, "api-job", change()),
        )
        .await;
    audit
        .once(
            a,
            "failed",
            nope,
            None,
            ops.update_job(&admin, "nope", change()),
        )
        .await;

    // api-job now has versions 1 (created) and 2 (every = 1m).
    let a = Action::JobsRollback;
    audit
        .once(
            a,
            "denied",
            job,
            None,
            ops.rollback_job(&operator, "api-job", 1),
        )
        .await;
    audit
        .once(a, "ok", job, None, ops.rollback_job(&admin, "api-job", 1))
        .await;
    audit
        .once(
            a,
            "failed",
            job,
            None,
            ops.rollback_job(&admin, "api-job", 9),
        )
        .await;

    for (a, paused) in [(Action::JobsPause, true), (Action::JobsResume, false)] {
        audit
            .once(
                a,
                "denied",
                job,
                None,
                ops.set_paused(&viewer, "api-job", paused),
            )
            .await;
        audit
            .once(
                a,
                "ok",
                job,
                None,
                ops.set_paused(&operator, "api-job", paused),
            )
            .await;
        audit
            .once(
                a,
                "failed",
                nope,
                None,
                ops.set_paused(&operator, "nope", paused),
            )
            .await;
    }

    let a = Action::JobsTrigger;
    audit
        .once(
            a,
            "denied",
            job,
            None,
            ops.trigger(&viewer, "api-job", None),
        )
        .await;
    let (triggered, run) = audit
        .once(a, "ok", job, None, ops.trigger(&operator, "api-job", None))
        .await;
    let id = triggered.expect("triggered").run_id;
    assert_eq!(run, Some(id), "the trigger's entry names its run");
    audit
        .once(
            a,
            "failed",
            nope,
            None,
            ops.trigger(&operator, "nope", None),
        )
        .await;
    let bad = Some(json!("not a table"));
    audit
        .once(
            a,
            "failed",
            job,
            None,
            ops.trigger(&operator, "api-job", bad),
        )
        .await;

    let a = Action::RunsCancel;
    let run = Some(id);
    audit
        .once(a, "denied", None, run, ops.cancel_run(&viewer, id))
        .await;
    audit
        .once(a, "ok", job, run, ops.cancel_run(&operator, id))
        .await;
    // Finished now: refused, and the entry does not name the job (the store's answer has none).
    audit
        .once(a, "failed", None, run, ops.cancel_run(&operator, id))
        .await;

    let a = Action::RunsRetryFailed;
    let shards = Some("sharded-job");
    let (parent, tasks) =
        crate::store::tests_tasks::sharded_run(&audit.pool, "sharded-job", 2, None).await;
    for (id, end) in tasks.iter().zip(["succeeded", "failed"]) {
        crate::store::tests_tasks::set_task(&audit.pool, *id, end, Some("w1"), None).await;
    }
    let parent_run = Some(parent);
    audit
        .once(
            a,
            "denied",
            None,
            parent_run,
            ops.retry_failed(&viewer, parent),
        )
        .await;
    audit
        .once(
            a,
            "ok",
            shards,
            parent_run,
            ops.retry_failed(&operator, parent),
        )
        .await;
    // Running again now: refused with the reason.
    audit
        .once(
            a,
            "failed",
            shards,
            parent_run,
            ops.retry_failed(&operator, parent),
        )
        .await;

    let a = Action::WorkflowsRerun;
    let wf = crate::store::tests_workflows::ended_workflow_run(&audit.pool).await;
    let wf_run = Some(wf);
    audit
        .once(
            a,
            "denied",
            None,
            wf_run,
            ops.rerun_workflow(&viewer, wf, "extract"),
        )
        .await;
    audit
        .once(
            a,
            "ok",
            None,
            wf_run,
            ops.rerun_workflow(&operator, wf, "extract"),
        )
        .await;
    // Running again now: refused with the reason.
    audit
        .once(
            a,
            "failed",
            None,
            wf_run,
            ops.rerun_workflow(&operator, wf, "extract"),
        )
        .await;

    let a = Action::DlqReplay;
    audit
        .once(a, "denied", None, run, ops.replay(&viewer, id))
        .await;
    audit
        .once(a, "ok", job, run, ops.replay(&operator, id))
        .await;
    // Pending again: not replayable.
    audit
        .once(a, "failed", job, run, ops.replay(&operator, id))
        .await;
    audit
        .once(a, "failed", None, Some(9_999), ops.replay(&operator, 9_999))
        .await;

    // Nothing is parked: one entry for the whole replay (each run replayed adds its own).
    let a = Action::DlqReplayAll;
    audit
        .once(a, "denied", None, None, ops.replay_all(&viewer, None))
        .await;
    audit
        .once(a, "ok", None, None, ops.replay_all(&operator, None))
        .await;

    // Without a broker a purge cannot empty the queue: refused, as when the broker is down.
    let a = Action::DlqPurge;
    audit
        .once(a, "denied", None, None, ops.purge(&operator, None))
        .await;
    audit
        .once(a, "failed", None, None, ops.purge(&admin, None))
        .await;

    let a = Action::TokensCreate;
    audit
        .once(
            a,
            "denied",
            None,
            None,
            ops.create_token(&operator, "grafana", Role::Viewer),
        )
        .await;
    audit
        .once(
            a,
            "ok",
            None,
            None,
            ops.create_token(&admin, "grafana", Role::Viewer),
        )
        .await;
    audit
        .once(
            a,
            "failed",
            None,
            None,
            ops.create_token(&admin, "no spaces", Role::Viewer),
        )
        .await;

    let a = Action::TokensRevoke;
    audit
        .once(
            a,
            "denied",
            None,
            None,
            ops.revoke_token(&operator, "grafana"),
        )
        .await;
    audit
        .once(a, "ok", None, None, ops.revoke_token(&admin, "grafana"))
        .await;
    audit
        .once(a, "failed", None, None, ops.revoke_token(&admin, "grafana"))
        .await;

    let a = Action::JobsBackfill;
    let hourly = json!({"name": "bf-job", "group": "g", "schedule": "0 0 * * * *"});
    ops.create_job(&admin, hourly).await.expect("created");
    let range = super::BackfillRequest {
        from: (Utc::now() - chrono::TimeDelta::hours(5)).to_rfc3339(),
        to: Utc::now().to_rfc3339(),
        ..super::BackfillRequest::default()
    };
    let bf = Some("bf-job");
    audit
        .once(
            a,
            "denied",
            bf,
            None,
            ops.start_backfill(&viewer, "bf-job", &range),
        )
        .await;
    let (started, _) = audit
        .once(
            a,
            "ok",
            bf,
            None,
            ops.start_backfill(&operator, "bf-job", &range),
        )
        .await;
    let backfill = started.expect("started").backfill.id;
    audit
        .once(
            a,
            "failed",
            nope,
            None,
            ops.start_backfill(&operator, "nope", &range),
        )
        .await;

    let a = Action::BackfillsCancel;
    audit
        .once(
            a,
            "denied",
            None,
            None,
            ops.cancel_backfill(&viewer, backfill),
        )
        .await;
    audit
        .once(a, "ok", bf, None, ops.cancel_backfill(&operator, backfill))
        .await;
    // Ended now: refused.
    audit
        .once(
            a,
            "failed",
            None,
            None,
            ops.cancel_backfill(&operator, backfill),
        )
        .await;

    let a = Action::JobsDelete;
    audit
        .once(a, "denied", job, None, ops.delete_job(&operator, "api-job"))
        .await;
    audit
        .once(a, "ok", job, None, ops.delete_job(&admin, "api-job"))
        .await;
    audit
        .once(a, "failed", job, None, ops.delete_job(&admin, "api-job"))
        .await;

    // Every changing action was seen refused and done; every one that can fail for its input
    // or state, failing. (A bulk replay fails only for internal errors, which are logged, not
    // audited; a purge's success needs a broker: tests/e2e/dead_letters.rs.)
    let all = BTreeSet::from(["denied", "failed", "ok"]);
    for action in Action::ALL.into_iter().filter(|a| a.changes_state()) {
        let expected = match action {
            Action::DlqReplayAll => BTreeSet::from(["denied", "ok"]),
            Action::DlqPurge => BTreeSet::from(["denied", "failed"]),
            _ => all.clone(),
        };
        assert_eq!(audit.seen.get(&action), Some(&expected), "{action}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn read_only_actions_are_audited_only_when_refused(pool: PgPool) {
    let ops = Operations::new(Store::from_pool(pool.clone()), None);
    let admin = Caller::cli();
    let mut audit = Audit {
        pool,
        seen: HashMap::new(),
    };
    ops.create_job(&admin, json!({"name": "j", "group": "g", "every": "1m"}))
        .await
        .expect("job");
    let run = ops.trigger(&admin, "j", None).await.expect("run").run_id;
    let (now, hour) = (Utc::now(), Duration::from_secs(3600));
    let runs = RunQuery {
        limit: 10,
        ..RunQuery::default()
    };
    let entries = AuditQuery {
        limit: 10,
        ..AuditQuery::default()
    };
    audit.none("jobs.list", ops.jobs(&admin)).await;
    audit.none("jobs.show", ops.job(&admin, "j")).await;
    audit
        .none("jobs.report", ops.job_report(&admin, "j", 7, now))
        .await;
    let fields = json!({"every": "1m"});
    audit
        .none(
            "schedules.preview",
            ops.preview_schedule(&admin, fields, now),
        )
        .await;
    audit.none("runs.list", ops.runs(&admin, runs)).await;
    audit.none("runs.show", ops.run(&admin, run)).await;
    audit.none("workers.list", ops.workers(&admin)).await;
    audit
        .none("overview.show", ops.overview(&admin, hour))
        .await;
    let minute = Duration::from_secs(60);
    audit
        .none(
            "overview.timeline",
            ops.run_timeline(&admin, hour, minute, now),
        )
        .await;
    audit.none("leader.show", ops.leader(&admin)).await;
    audit.none("audit.list", ops.audit(&admin, entries)).await;
    audit
        .none("dlq.list", ops.dead_letters(&admin, None, None, 10))
        .await;
    audit.none("tokens.list", ops.tokens(&admin)).await;
    ops.create_job(
        &admin,
        json!({"name": "hourly", "group": "g", "schedule": "0 0 * * * *"}),
    )
    .await
    .expect("job");
    let range = super::BackfillRequest {
        from: (now - chrono::TimeDelta::hours(5)).to_rfc3339(),
        to: now.to_rfc3339(),
        ..super::BackfillRequest::default()
    };
    audit
        .none(
            "backfills.preview",
            ops.preview_backfill(&admin, "hourly", &range),
        )
        .await;
    let backfill = ops
        .start_backfill(&admin, "hourly", &range)
        .await
        .expect("started")
        .backfill
        .id;
    audit
        .none(
            "backfills.list",
            ops.backfills(&admin, super::BackfillListQuery::default()),
        )
        .await;
    audit
        .none("backfills.show", ops.backfill(&admin, backfill))
        .await;

    // Refused: one `denied` entry, about what was asked for.
    let operator = Caller::token("ops", Role::Operator);
    audit
        .once(
            Action::TokensList,
            "denied",
            None,
            None,
            ops.tokens(&operator),
        )
        .await;
}
