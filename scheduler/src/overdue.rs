//! The overdue-outbox duty, a leader duty: the misfire policy for fires that were decided and
//! persisted on time but whose trigger could not be published in time (a broker outage).
//!
//! The planner applies each job's misfire policy to fires nobody decided (a scheduler or
//! database outage). A broker outage is different: the leader keeps writing runs on time and
//! they wait in the outbox. Every second this duty reads the scheduled first attempts still
//! unpublished past their job's `misfire_grace`, and skips what the policy would not run late
//! ([`crate::misfire::undelivered`]): all of them for `skip`, all but the latest for
//! `fire_once`, all but the latest `max_catchup` for `fire_all`, and any older than the
//! catch-up window; each with its reason. The dispatcher publishes the rest when the broker is
//! back. Skips are fenced, and never touch a run published or claimed meanwhile; a trigger the
//! dispatcher sent just before the skip finds the run not claimable, so it never executes.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::job::JobSpec;
use crate::misfire::{self, CatchUpPolicy};
use crate::store::{Fence, Overdue, Store};

/// How often the outbox is checked for overdue runs.
const INTERVAL: Duration = Duration::from_secs(1);
/// Overdue runs read per pass.
const LIMIT: i64 = 10_000;
/// Runs younger than this are never considered (the dispatcher is simply at work on them).
const MIN_AGE: Duration = Duration::from_millis(500);

/// Runs the duty for `fence`'s term until `stop`; cancels `stop` if the lease is lost.
pub async fn run(store: Store, fence: Fence, stop: CancellationToken) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match pass(&store, &fence).await {
            Ok(true) => {}
            Ok(false) => {
                warn!(
                    term = fence.term,
                    "lease lost while skipping overdue runs; leader duties stop"
                );
                stop.cancel();
                return;
            }
            Err(e) => {
                warn!(error = %format!("{e:#}"), "checking overdue runs failed; next pass retries")
            }
        }
    }
}

/// One pass. Returns false when the fence no longer holds.
pub async fn pass(store: &Store, fence: &Fence) -> anyhow::Result<bool> {
    let overdue = store.overdue_runs(MIN_AGE, LIMIT).await?;
    if overdue.is_empty() {
        return Ok(true);
    }
    let skips = decide(&overdue, Utc::now());
    if skips.is_empty() {
        return Ok(true);
    }
    let Some(skipped) = store.skip_overdue(fence, &skips).await? else {
        return Ok(false);
    };
    for (id, reason) in skips.iter().filter(|(id, _)| skipped.contains(id)) {
        let job = overdue
            .iter()
            .find(|o| o.id == *id)
            .map_or("", |o| o.job.as_str());
        info!(run_id = id, job, reason = %reason, "run skipped: its trigger could not be published in time");
    }
    Ok(true)
}

/// The runs to skip, with their reasons, per job.
fn decide(overdue: &[Overdue], now: chrono::DateTime<Utc>) -> Vec<(i64, String)> {
    let mut by_job: BTreeMap<&str, Vec<&Overdue>> = BTreeMap::new();
    for run in overdue {
        by_job.entry(run.job.as_str()).or_default().push(run);
    }
    let mut skips = Vec::new();
    for (job, mut runs) in by_job {
        let spec: JobSpec = match serde_json::from_value(runs[0].spec.clone()) {
            Ok(spec) => spec,
            Err(e) => {
                warn!(job, error = %e, "stored job definition unreadable; its overdue runs stay");
                continue;
            }
        };
        runs.sort_by_key(|r| (r.scheduled_at, r.id));
        let instants: Vec<_> = runs.iter().map(|r| r.scheduled_at).collect();
        for (i, reason) in misfire::undelivered(&instants, now, &CatchUpPolicy::from_spec(&spec)) {
            skips.push((runs[i].id, reason.to_string()));
        }
    }
    skips
}
