//! One delivery, start to finish, in the order of its life: decode and check it, then
//! [`claim`] its attempt (or take the run over from a lost worker), [`execute`] the handler at
//! the trigger's instant, and [`settle`]: record the outcome, then retry, park or ack. A trigger
//! of a job this worker has no handler for goes back for another worker instead
//! ([`unhandled`]), and another worker's broadcast task goes to that worker's own queue
//! ([`forward`]). Deliveries of the work queue and of the worker's own queue take the same
//! path.
//!
//! The order is the guarantee. The claim comes before the handler, so a duplicate delivery of an
//! attempt never executes twice; the outcome is committed before anything is published or
//! acked, so an ack never hides a lost record and a lost or hung worker's late outcome is fenced
//! out; a retry or a parked copy is confirmed by the broker before the original is acked, so a
//! crash in between can duplicate it (the claim drops the duplicate) but never lose it. Each of
//! those steps can be redone by a redelivery of the original: a run found `retrying` or `dead`
//! at this attempt has its retry published (or its message parked) again.
//!
//! **Layering:** this file calls the phases; `claim` and `unhandled` may settle a delivery they
//! do not run (`settle`), and every phase reads the worker's [`Shared`] state and the checked
//! time arithmetic of `clock`; nothing here imports this file or the runtime above it. Below:
//! the link (acks and publishes) and the leaf modules (store, batchers, context, outcome).

mod claim;
mod clock;
mod execute;
mod forward;
mod settle;
mod shared;
mod unhandled;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use chime_protocol::wire::Trigger;
use futures::FutureExt;
use tracing::Instrument;

use crate::handler::Found;
use crate::link::{Inbound, Link};
use crate::verify;

use claim::Start;
use shared::Entered;
pub(crate) use shared::{Limits, Shared};

/// Handles one delivery; never fails (every path ends in an ack or a requeue, and a log line).
/// A panic anywhere on the way (a bug, or an input nobody foresaw) is caught here: the attempt
/// the delivery claimed, if any, is recorded failed and its run `dead`, and the message is
/// parked with the panic as its reason, so a run never stays `running` on a live worker.
pub(crate) async fn handle(shared: Arc<Shared>, link: Arc<Link>, delivery: Inbound) {
    let claimed = Claimed::default();
    let path = route(&shared, &link, &delivery, &claimed);
    let Err(panic) = AssertUnwindSafe(path).catch_unwind().await else {
        return;
    };
    let message = execute::panic_message(panic.as_ref());
    let reason = format!("the worker panicked handling this delivery: {message}");
    tracing::error!(%reason, "per-delivery path panicked; recording and parking");
    settle::after_panic(&shared, &link, &delivery, claimed.get(), reason).await;
}

/// The run and attempt a delivery claimed (or took over), once it has: what a panic further on
/// must record.
#[derive(Default)]
struct Claimed(Mutex<Option<(i64, u32)>>);

impl Claimed {
    fn set(&self, run_id: i64, attempt: u32) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((run_id, attempt));
    }

    fn get(&self) -> Option<(i64, u32)> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Decodes and checks the delivery, then runs it; everything but a panic ends here.
async fn route(shared: &Shared, link: &Link, delivery: &Inbound, claimed: &Claimed) {
    let trigger = match Trigger::from_body(delivery.body()) {
        Ok(trigger) => trigger,
        Err(error) => {
            // The message id names a run, but nothing vouches for it: the run is left as it is
            // (a forged message must not end a real run); the parked copy keeps the reason.
            let run_id = delivery.message_id().map(verify::quote);
            let span = tracing::warn_span!("undecodable", run_id);
            return settle::dead_letter(shared, link, delivery, None, error.to_string())
                .instrument(span)
                .await;
        }
    };
    let span = tracing::info_span!(
        "run",
        run_id = trigger.run_id,
        job = %verify::quote(&trigger.job),
        attempt = trigger.attempt
    );
    if let Err(reason) = claim::verify(shared, delivery, &trigger) {
        return settle::dead_letter(shared, link, delivery, None, reason)
            .instrument(span)
            .await;
    }
    run(shared, link, delivery, trigger, claimed)
        .instrument(span)
        .await
}

/// The life of a checked trigger: claim, execute, settle.
async fn run(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    mut trigger: Trigger,
    claimed: &Claimed,
) {
    // Another worker's broadcast task: never claimed nor run here.
    if let Some(worker) = forward::target(shared, &trigger) {
        let worker = worker.to_owned();
        return forward::forward(shared, link, delivery, &trigger, &worker).await;
    }
    let kind = trigger.task.as_ref().map(|t| t.kind);
    let handler = match shared.handlers.for_trigger(&trigger.job, kind) {
        Found::Handler(handler) => handler.clone(),
        Found::NoReducer => execute::no_reducer(&trigger.job),
        Found::Unknown => return unhandled::send_back(shared, link, delivery, &trigger).await,
    };

    // One delivery of a run at a time in this worker (see `Store::claim`). A later attempt
    // (its retry, published just before this worker acks the earlier one) waits its turn.
    let parent = trigger.task.as_ref().map(|t| t.parent_run_id);
    let slot = match shared.enter(trigger.run_id, trigger.attempt, parent).await {
        Entered::Yes(slot) => slot,
        Entered::Duplicate => {
            tracing::info!(
                "duplicate delivery of a run this worker is handling right now; acked without running"
            );
            return delivery.ack().await;
        }
        Entered::Busy => {
            tracing::warn!("a later attempt of a run this worker is still handling; requeueing it");
            return delivery.requeue().await;
        }
    };

    // An earlier delivery of this attempt ran here but could not record its outcome.
    if let Some(pending) = shared.take_unrecorded(trigger.run_id, trigger.attempt) {
        tracing::info!("redelivery of an attempt whose outcome is not recorded yet; recording it");
        return settle::finish(shared, link, delivery, trigger.run_id, pending).await;
    }

    // A trigger published ahead of its instant (the scheduler's lead) or a retry due within
    // the hold limit is claimed now and started at its instant; one due later goes through a
    // delay tier.
    let start_at = match delivery.not_before() {
        None => None,
        Some(due) => match claim::plan_start(shared, link, delivery, &trigger, due).await {
            Start::Now => None,
            Start::At(at) => Some(at),
            Start::Retiered => return,
        },
    };

    // At most `capacity` handlers run at once, but the claim comes first, outside the slots,
    // for a due delivery as for one held for its instant: a slot taken before the claim would
    // stay busy for the claim's round trip, so that once deliveries arrive late (a backlog)
    // throughput would fall to `capacity` / claim latency, just when it is most needed. The
    // claimed runs waiting for a slot are bounded by the prefetch (`capacity + hold`), and
    // the outcome records when each handler really started.
    let Some((attempt, claim)) = claim::acquire(shared, link, delivery, &trigger, start_at).await
    else {
        return;
    };
    claimed.set(trigger.run_id, attempt);
    if attempt != trigger.attempt {
        tracing::Span::current().record("attempt", attempt);
        trigger.attempt = attempt;
    }

    let run_id = trigger.run_id;
    let pending = execute::run(shared, delivery, &handler, trigger, &slot, claim, start_at).await;
    settle::finish(shared, link, delivery, run_id, pending).await
}
