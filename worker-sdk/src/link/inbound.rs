//! One delivery of the work queue as the delivery path sees it: its body and the headers it
//! trusts no further than `verify` lets it, and its settlement (ack or requeue), sent at most
//! once on the channel it arrived on.

use std::sync::atomic::{AtomicBool, Ordering};

use chime_protocol::headers::{NotAnInteger, get_instant, get_integer};
use chime_protocol::wire::{HEADER_DELIVERY_COUNT, HEADER_NOT_BEFORE};
use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};

/// A delivery, and whether it has been settled (acked early by `ack_after`, or acked or
/// requeued): settling twice is a no-op.
pub(crate) struct Inbound {
    delivery: Delivery,
    settled: AtomicBool,
}

impl Inbound {
    pub(crate) fn new(delivery: Delivery) -> Self {
        Inbound {
            delivery,
            settled: AtomicBool::new(false),
        }
    }

    /// The delivery as lapin gave it, for the link's own publishes of a copy.
    pub(super) fn message(&self) -> &Delivery {
        &self.delivery
    }

    /// The message body.
    pub(crate) fn body(&self) -> &[u8] {
        &self.delivery.data
    }

    /// The message id property (the scheduler writes the run id), unverified.
    pub(crate) fn message_id(&self) -> Option<&str> {
        self.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str())
    }

    /// The broker's `redelivered` flag.
    pub(crate) fn redelivered(&self) -> bool {
        self.delivery.redelivered
    }

    /// Header `name` as an integer ([`get_integer`]): `Ok(None)` when absent, an error when
    /// present but not an integer (so a forged value can be told from a missing one).
    pub(crate) fn header_integer(&self, name: &str) -> Result<Option<i64>, NotAnInteger> {
        get_integer(self.delivery.properties.headers().as_ref(), name)
    }

    /// When the delivery may start, from its [`HEADER_NOT_BEFORE`] header.
    pub(crate) fn not_before(&self) -> Option<DateTime<Utc>> {
        get_instant(
            self.delivery.properties.headers().as_ref(),
            HEADER_NOT_BEFORE,
        )
    }

    /// How many times the work queue delivered this message before (`x-delivery-count`, set by
    /// quorum queues on redelivery; absent on the first delivery).
    pub(crate) fn delivery_count(&self) -> u32 {
        self.header_integer(HEADER_DELIVERY_COUNT)
            .ok()
            .flatten()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    }

    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::SeqCst)
    }

    pub(crate) async fn ack(&self) {
        if !self.settled.swap(true, Ordering::SeqCst) {
            ack(&self.delivery).await;
        }
    }

    pub(crate) async fn requeue(&self) {
        if self.settled.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "the delivery was already acked early (ack_after), so it cannot be requeued; the \
                 run stays as recorded and the scheduler's rescuer republishes a run stuck in \
                 `retrying` or `running`"
            );
        } else {
            requeue(&self.delivery).await;
        }
    }
}

async fn ack(delivery: &Delivery) {
    match delivery.acker.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "ack not sent: the channel closed meanwhile; the broker redelivers the message and the \
             claim drops that copy"
        ),
        Err(error) => tracing::warn!(
            %error,
            "ack failed; the broker redelivers the message and the claim drops that copy"
        ),
    }
}

async fn requeue(delivery: &Delivery) {
    let options = BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    };
    match delivery.acker.nack(options).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "nack not sent: the channel closed; the broker requeues the message itself"
        ),
        Err(error) => {
            tracing::warn!(%error, "nack failed; the broker requeues the message when the channel closes")
        }
    }
}
