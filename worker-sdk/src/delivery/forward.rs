//! A broadcast task for another worker: its retry came back through a delay tier to the
//! group's work queue, which any worker consumes. This worker never claims or runs it: it
//! publishes it, confirmed, to that worker's own queue, then acks the original; if that queue
//! does not exist (the worker is gone for good), the message is parked and the run ended `dead`
//! with the reason.

use chime_protocol::topology::Topology;
use chime_protocol::wire::Trigger;

use crate::link::MAX_QUEUE_NAME_BYTES;
use crate::link::{Inbound, Link};
use crate::verify;

use super::settle::{dead_letter, dead_run, requeue_after_publish_failure};
use super::shared::Shared;

/// The worker another worker's broadcast task is for, if `trigger` is one: its task names a
/// worker other than this one.
pub(super) fn target<'t>(shared: &Shared, trigger: &'t Trigger) -> Option<&'t str> {
    let worker = trigger.task.as_ref()?.worker.as_deref()?;
    (worker != shared.id).then_some(worker)
}

/// Forwards the delivery of `trigger`, a broadcast task for worker `worker`, to that worker's
/// queue (see the module docs).
pub(super) async fn forward(
    shared: &Shared,
    link: &Link,
    delivery: &Inbound,
    trigger: &Trigger,
    worker: &str,
) {
    let queue = shared.topology.worker_queue(worker);
    if queue.len() > MAX_QUEUE_NAME_BYTES {
        let reason = format!(
            "{}broadcast task for worker {}: its queue name would be {} bytes, over RabbitMQ's \
             {MAX_QUEUE_NAME_BYTES}, so no such worker exists: the run is left as it is",
            verify::IMPLAUSIBLE,
            verify::quote(worker),
            queue.len()
        );
        return dead_letter(shared, link, delivery, None, reason).await;
    }
    match link.forward(&shared.topology, delivery, worker).await {
        Ok(()) => {
            tracing::info!(
                worker = %verify::quote(worker),
                key = %Topology::worker_key(worker),
                "broadcast task for another worker: forwarded to its own queue"
            );
            delivery.ack().await;
        }
        Err(error) if error.is_unroutable() => {
            let reason = format!(
                "broadcast task for worker {}: its queue {} does not exist (the worker is gone); \
                 a broadcast task runs on its own worker only, so it is not run elsewhere",
                verify::quote(worker),
                verify::quote(&queue)
            );
            dead_letter(
                shared,
                link,
                delivery,
                Some(dead_run(shared, trigger)),
                reason,
            )
            .await
        }
        Err(error) => {
            tracing::error!(%error, "cannot forward a broadcast task to its worker's queue; requeueing it");
            requeue_after_publish_failure(link, delivery).await;
        }
    }
}
