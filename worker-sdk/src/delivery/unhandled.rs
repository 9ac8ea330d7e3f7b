//! A trigger of a job this worker has no handler for: during a rolling deploy, a job only newer
//! (or older) workers of the group know. It is sent back through a delay tier, for another
//! online worker that has the handler or to wait for one, and parked as an unknown job once it
//! has waited `unhandled_wait` past its instant.

use std::time::Duration;

use chime_protocol::limits::cap_header_value;
use chime_protocol::retry;
use chime_protocol::topology::RETRY_TIERS;
use chime_protocol::wire::Trigger;
use chrono::{DateTime, Utc};

use crate::link::{Inbound, Link};
use crate::verify;

use super::clock::due_after;
use super::settle::{dead_letter, dead_run, requeue_after_publish_failure};
use super::shared::Shared;

/// How many handler names an "unknown job" reason lists before it only counts the rest.
const LISTED_JOBS: usize = 20;

/// "unknown job" reason: names at most [`LISTED_JOBS`] of the worker's handlers and counts
/// the rest, so a worker with thousands of handlers still writes a short header.
fn unknown_job_reason(job: &str, worker: &str, group: &str, mut jobs: Vec<String>) -> String {
    jobs.sort();
    let total = jobs.len();
    let mut listed = jobs
        .into_iter()
        .take(LISTED_JOBS)
        .map(|j| verify::quote(&j))
        .collect::<Vec<_>>()
        .join(", ");
    if total > LISTED_JOBS {
        listed.push_str(&format!(" and {} more", total - LISTED_JOBS));
    }
    format!(
        "unknown job {}: worker {} of group {} has handlers for {listed}",
        verify::quote(job),
        verify::quote(worker),
        verify::quote(group)
    )
}

/// Why a run waits for a worker with its job's handler, until `until`.
fn unhandled_reason(job: &str, group: &str, until: DateTime<Utc>) -> String {
    format!(
        "no worker handles this job (waiting until {}): no online worker of group {} has a \
         handler for {}; then it is parked",
        until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        verify::quote(group),
        verify::quote(job),
    )
}

/// A trigger of a job this worker has no handler for: during a rolling deploy, a job only newer
/// (or older) workers of the group know. Never requeued (a requeue counts toward the work
/// queue's delivery limit and comes straight back): a copy goes through a delay tier, confirmed,
/// then the original is acked. If another online worker of the group declares the handler, the
/// copy goes through the shortest tier, for that worker. If none does, the run waits: its
/// `reason` says so (its state stays) and the copy pauses 5 to 30 s, until `unhandled_wait`
/// after the run's scheduled instant; then it is parked as an unknown job, as a job nobody will
/// ever handle.
pub(super) async fn send_back(shared: &Shared, link: &Link, delivery: &Inbound, trigger: &Trigger) {
    let group = shared.topology.group();
    let now = Utc::now();
    let until = due_after(trigger.scheduled_at, shared.unhandled_wait);
    let waiting = until.filter(|until| now < *until);
    let run = dead_run(shared, trigger);
    let tier = match shared
        .store
        .handled_elsewhere(group, &trigger.job, &shared.id)
        .await
    {
        Ok(true) => {
            tracing::info!(
                "no handler for this job here, but another online worker of the group has one; \
                 sending the trigger back for it"
            );
            RETRY_TIERS[0]
        }
        Ok(false) => {
            let Some(until) = waiting else {
                let reason =
                    unknown_job_reason(&trigger.job, &shared.id, group, shared.handlers.jobs());
                return dead_letter(shared, link, delivery, Some(run), reason).await;
            };
            let reason = unhandled_reason(&trigger.job, group, until);
            match shared
                .store
                .mark_unhandled(run, &cap_header_value(&reason))
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    // No run waits for this attempt (stale, or it moved on): nothing to wait for.
                    let reason =
                        unknown_job_reason(&trigger.job, &shared.id, group, shared.handlers.jobs());
                    return dead_letter(shared, link, delivery, Some(run), reason).await;
                }
                Err(error) => tracing::error!(%error, "cannot record why the run waits"),
            }
            tracing::info!(%reason, "no online worker has a handler for this job; the run waits");
            let waited = (now - trigger.scheduled_at).to_std().unwrap_or_default();
            let left = (until - now).to_std().unwrap_or_default();
            retry::unhandled_pause(waited, left)
        }
        Err(error) => {
            // Nothing is decided without the registry: the run waits, unmarked, and is looked
            // at again after the pause.
            tracing::error!(%error, "cannot look for a worker with this job's handler; sending the trigger back");
            retry::unhandled_pause(Duration::ZERO, Duration::MAX)
        }
    };
    // The copy keeps its instant: one due later (a retry) still waits it out where it is run.
    let due = delivery.not_before().unwrap_or(now);
    match link
        .publish_via(
            &shared.topology,
            delivery,
            delivery.body(),
            trigger.attempt,
            Some(tier),
            due,
        )
        .await
    {
        Ok(key) => {
            tracing::debug!(via = %key, "trigger of an unhandled job sent back");
            delivery.ack().await;
        }
        Err(error) => {
            tracing::error!(%error, "cannot send the trigger of an unhandled job back; requeueing it");
            requeue_after_publish_failure(link, delivery).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_job_reason_lists_twenty_handlers_and_counts_the_rest() {
        let jobs: Vec<String> = (0..15_000).map(|i| format!("job-{i:05}")).collect();
        let reason = unknown_job_reason(&"x".repeat(300_000), "w1", "orders", jobs);
        assert!(reason.starts_with("unknown job `xxx"), "{}", &reason[..40]);
        assert!(reason.contains("…[truncated]`: worker `w1` of group `orders`"));
        assert!(reason.contains("`job-00000`, `job-00001`"));
        assert!(reason.contains("`job-00019` and 14980 more"), "{reason}");
        assert!(!reason.contains("job-00020"));
        assert!(reason.len() < 1_024, "{} bytes", reason.len());
        let one = unknown_job_reason("nope", "w1", "orders", vec!["greet".into()]);
        assert_eq!(
            one,
            "unknown job `nope`: worker `w1` of group `orders` has handlers for `greet`"
        );
    }
}
