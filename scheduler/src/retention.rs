//! Leader duty: delete finished runs, with their attempts and log lines, once they are older
//! than the `retention.max_age` setting or their job's own `retention`; and audit log entries
//! once they are older than `retention.audit_max_age` (default 400 days).
//!
//! Work is bounded: each statement deletes at most `batch_size` runs (or audit entries) in its
//! own short transaction (rows another transaction holds are skipped, never waited for), and a
//! pass stops after [`MAX_BATCHES_PER_PASS`] batches of runs and as many of audit entries,
//! going on at the next interval. Every batch is fenced
//! by the leader's term like any leader write. Runs that are not finished (pending, queued,
//! running, retrying) are never deleted, whatever their age.
//!
//! One job never stops a pass: a job whose batch fails (whatever its stored definition says) is
//! logged and passed over, and the other jobs, the default and the audit log are still pruned.
//! Every age is capped at [`MAX_RETENTION`] before it reaches SQL, so a definition stored
//! before that bound was checked (`retention = "10000years"`) cannot put `now() - age` out of
//! the timestamp range.

use std::time::Duration;

use chime_protocol::limits::MAX_RETENTION;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::RetentionSettings;
use crate::store::{Fence, Store};

/// Most batches one pass deletes before yielding until the next interval.
pub const MAX_BATCHES_PER_PASS: u32 = 100;

/// What one pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Runs deleted (their attempts and log lines went with them).
    pub runs: u64,
    /// Audit log entries deleted.
    pub audit_entries: u64,
    /// Statements run.
    pub batches: u32,
}

/// Prunes every `settings.interval` while `stop` is not cancelled.
pub async fn run(store: Store, fence: Fence, settings: RetentionSettings, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(settings.interval) => {}
        }
        match prune(&store, &fence, &settings).await {
            Ok(Some(pruned)) if pruned.runs > 0 || pruned.audit_entries > 0 => {
                info!(
                    runs = pruned.runs,
                    audit_entries = pruned.audit_entries,
                    batches = pruned.batches,
                    "retention: pruned old runs and audit entries"
                );
            }
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => warn!(error = %format!("{e:#}"), "retention pass failed; trying again later"),
        }
    }
}

/// One pass: runs of jobs with their own retention one by one, then of every other job with the
/// default, then the audit log. Returns `None` if the fence no longer holds (nothing more is
/// deleted).
pub async fn prune(
    store: &Store,
    fence: &Fence,
    settings: &RetentionSettings,
) -> anyhow::Result<Option<Pruned>> {
    let mut pruned = match prune_runs(store, fence, settings).await {
        Ok(Some(pruned)) => pruned,
        Ok(None) => return Ok(None),
        Err(e) => {
            // The audit log does not depend on the runs: prune it anyway.
            warn!(error = %format!("{e:#}"), "retention: pruning runs failed; trying again later");
            Pruned::default()
        }
    };
    let batch = i64::from(settings.batch_size.max(1));
    for _ in 0..MAX_BATCHES_PER_PASS {
        let Some(deleted) = store
            .prune_audit(fence, capped(settings.audit_max_age), batch)
            .await?
        else {
            return Ok(None);
        };
        pruned.batches += 1;
        pruned.audit_entries += deleted;
        if deleted < batch as u64 {
            break;
        }
    }
    Ok(Some(pruned))
}

/// The runs' part of a pass, at most [`MAX_BATCHES_PER_PASS`] batches.
async fn prune_runs(
    store: &Store,
    fence: &Fence,
    settings: &RetentionSettings,
) -> anyhow::Result<Option<Pruned>> {
    let overrides = store.job_retentions().await?;
    let except: Vec<String> = overrides.iter().map(|(job, _)| job.clone()).collect();
    let mut pruned = Pruned::default();
    let targets = overrides
        .iter()
        .map(|(job, age)| (Some(job.as_str()), *age))
        .chain(std::iter::once((None, settings.max_age)));
    let batch = i64::from(settings.batch_size.max(1));
    for (job, age) in targets {
        loop {
            if pruned.batches >= MAX_BATCHES_PER_PASS {
                return Ok(Some(pruned));
            }
            let deleted = match store
                .prune_runs(fence, job, &except, capped(age), batch)
                .await
            {
                Ok(Some(deleted)) => deleted,
                Ok(None) => return Ok(None),
                Err(e) => match job {
                    Some(job) => {
                        warn!(job, error = %format!("{e:#}"),
                              "retention: pruning this job's runs failed; the other jobs go on");
                        pruned.batches += 1;
                        break;
                    }
                    None => return Err(e),
                },
            };
            pruned.batches += 1;
            pruned.runs += deleted;
            if deleted < batch as u64 {
                break;
            }
        }
    }
    Ok(Some(pruned))
}

/// An age as SQL may use it: at most [`MAX_RETENTION`].
fn capped(age: Duration) -> Duration {
    age.min(MAX_RETENTION)
}

#[cfg(test)]
mod tests {
    //! Retention against a real database (`#[sqlx::test]`).

    use std::time::Duration;

    use sqlx::PgPool;

    use super::*;
    use crate::config::validate_job;

    async fn leader(store: &Store) -> Fence {
        store.lead_for_test("retention-test").await
    }

    /// Inserts a run of `job` created `age_days` ago in `state`, with an attempt and a log line.
    async fn run(pool: &PgPool, job: &str, state: &str, age_days: i32) -> i64 {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                     attempt, created_at)
             VALUES ($1, 'g', now() - make_interval(days => $3), 'manual', $2, 1,
                     now() - make_interval(days => $3))
             RETURNING id",
        )
        .bind(job)
        .bind(state)
        .bind(age_days)
        .fetch_one(pool)
        .await
        .expect("run");
        sqlx::query(
            "INSERT INTO chime_attempts (run_id, attempt, worker_id, state) VALUES ($1, 1, 'w', 'failed');
             INSERT INTO chime_run_logs (run_id, attempt, at, level, message)
             VALUES ($1, 1, now(), 'info', 'hello')",
        )
        .bind(id)
        .execute(pool)
        .await
        .ok();
        id
    }

    async fn ids(pool: &PgPool) -> Vec<i64> {
        sqlx::query_scalar("SELECT id FROM chime_runs ORDER BY id")
            .fetch_all(pool)
            .await
            .expect("ids")
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn old_finished_runs_go_in_batches_with_per_job_overrides(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let keep_long = validate_job(
            serde_json::json!({"name": "audit-export", "group": "g", "retention": "90days"})
                .as_object()
                .expect("object"),
        )
        .expect("job");
        let keep_short = validate_job(
            serde_json::json!({"name": "heartbeat", "group": "g", "retention": "1day"})
                .as_object()
                .expect("object"),
        )
        .expect("job");
        store
            .sync_config_jobs(&[keep_long, keep_short])
            .await
            .expect("jobs");
        let fence = leader(&store).await;

        // Oldest first, as in production, where ids follow creation (the prune bounds its scan
        // by id).
        let mut expired = Vec::new();
        expired.push(run(&pool, "audit-export", "succeeded", 91).await);
        let old_but_running = run(&pool, "report", "running", 60).await;
        let old_but_retrying = run(&pool, "report", "retrying", 60).await;
        let long_kept = run(&pool, "audit-export", "succeeded", 60).await;
        for _ in 0..5 {
            expired.push(run(&pool, "report", "succeeded", 40).await);
        }
        expired.push(run(&pool, "gone-job", "skipped", 35).await);
        expired.push(run(&pool, "report", "dead", 31).await);
        let young = run(&pool, "report", "failed", 29).await;
        expired.push(run(&pool, "heartbeat", "succeeded", 2).await);
        let short_young = run(&pool, "heartbeat", "succeeded", 0).await;

        let settings = RetentionSettings {
            max_age: Duration::from_secs(30 * 24 * 3600),
            interval: Duration::from_secs(60),
            batch_size: 2,
            ..RetentionSettings::default()
        };
        let pruned = prune(&store, &fence, &settings)
            .await
            .expect("prune")
            .expect("fenced");
        assert_eq!(pruned.runs, expired.len() as u64);
        assert!(pruned.batches >= 5, "batches of 2: {pruned:?}");
        let mut kept = vec![
            old_but_running,
            old_but_retrying,
            young,
            long_kept,
            short_young,
        ];
        kept.sort_unstable();
        assert_eq!(ids(&pool).await, kept);
        let orphans: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM chime_attempts WHERE run_id <> ALL($1))
                  + (SELECT count(*) FROM chime_run_logs WHERE run_id <> ALL($1))",
        )
        .bind(&kept)
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!(orphans, 0, "attempts and log lines go with their runs");

        // A second pass finds nothing; a deposed leader deletes nothing.
        let again = prune(&store, &fence, &settings).await.expect("prune");
        assert_eq!(again.map(|p| p.runs), Some(0));
        run(&pool, "report", "succeeded", 45).await;
        let stale = Fence {
            holder: fence.holder.clone(),
            term: fence.term + 1,
        };
        assert_eq!(prune(&store, &stale, &settings).await.expect("prune"), None);
        assert_eq!(ids(&pool).await.len(), kept.len() + 1);
    }

    /// Regression: a job stored with `retention = "10000years"` (accepted before retention was
    /// bounded) made every pass fail with "timestamp out of range", so no run of any job and no
    /// audit entry was pruned any more.
    #[sqlx::test(migrations = "../migrations")]
    async fn an_absurd_stored_retention_stops_no_pruning(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        for (name, retention) in [
            ("forever", "10000years"),
            ("overflow", "99999999999999999999years"),
            ("garbage", "a while"),
        ] {
            let spec = serde_json::json!({"name": name, "group": "g", "retention": retention});
            crate::store::insert_test_job(&pool, name, spec).await;
        }
        let fence = leader(&store).await;
        let kept_forever = run(&pool, "forever", "succeeded", 400).await;
        let old_unrelated = run(&pool, "report", "succeeded", 40).await;
        let old_unreadable = run(&pool, "garbage", "failed", 40).await;
        let young = run(&pool, "report", "succeeded", 1).await;
        let old_entry = audit(&pool, 500).await;

        let pruned = prune(&store, &fence, &RetentionSettings::default())
            .await
            .expect("prune")
            .expect("fenced");
        assert_eq!((pruned.runs, pruned.audit_entries), (2, 1), "{pruned:?}");
        let left = ids(&pool).await;
        assert_eq!(left, [kept_forever, young]);
        assert!(!left.contains(&old_unrelated) && !left.contains(&old_unreadable));
        assert!(!audit_ids(&pool).await.contains(&old_entry));
    }

    /// Inserts an audit entry written `age_days` ago.
    async fn audit(pool: &PgPool, age_days: i32) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO chime_audit (at, actor, role, action, outcome)
             VALUES (now() - make_interval(days => $1), 'cli:test', 'admin', 'jobs.trigger', 'ok')
             RETURNING id",
        )
        .bind(age_days)
        .fetch_one(pool)
        .await
        .expect("audit entry")
    }

    async fn audit_ids(pool: &PgPool) -> Vec<i64> {
        sqlx::query_scalar("SELECT id FROM chime_audit ORDER BY id")
            .fetch_all(pool)
            .await
            .expect("ids")
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn old_audit_entries_go_in_batches_under_the_fence(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let fence = leader(&store).await;
        // Oldest first, as in production, where ids follow `at`.
        for age in [900, 500, 450, 402, 401] {
            audit(&pool, age).await;
        }
        let kept = vec![audit(&pool, 399).await, audit(&pool, 0).await];
        let settings = RetentionSettings {
            batch_size: 2,
            ..RetentionSettings::default()
        };
        assert_eq!(settings.audit_max_age, Duration::from_secs(400 * 24 * 3600));

        let pruned = prune(&store, &fence, &settings)
            .await
            .expect("prune")
            .expect("fenced");
        assert_eq!(pruned.audit_entries, 5);
        assert_eq!(pruned.runs, 0);
        assert!(pruned.batches >= 3, "batches of 2: {pruned:?}");
        assert_eq!(audit_ids(&pool).await, kept);

        // A second pass finds nothing; a deposed leader deletes nothing.
        let again = prune(&store, &fence, &settings).await.expect("prune");
        assert_eq!(again.map(|p| p.audit_entries), Some(0));
        let old = audit(&pool, 800).await;
        let stale = Fence {
            holder: fence.holder.clone(),
            term: fence.term + 1,
        };
        assert_eq!(prune(&store, &stale, &settings).await.expect("prune"), None);
        assert!(audit_ids(&pool).await.contains(&old));
    }
}
