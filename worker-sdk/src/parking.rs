//! Dead-lettering by the worker itself: copying a message it cannot run to the group's parking
//! lot, with the reason, before acking the original.
//!
//! Rejecting with `requeue=false` would also reach the parking lot (the work queue dead-letters
//! there), but RabbitMQ would only record "rejected"; publishing ourselves carries the reason in
//! [`HEADER_DEAD_REASON`] for the operator who replays it. The copy is published `mandatory` on a
//! confirm-mode channel, and only a plain broker ack counts: `Ack(Some(returned))` means no queue
//! took it (unroutable) and `Nack` means the queue refused it; either way the original must stay.

use lapin::Channel;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};

use crate::protocol::{HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_ERROR, HEADER_PARKED_AT};
use crate::publish::{self, PublishError};
use crate::topology::{PARKING_KEY, Topology};

/// Why a message is parked, and what else its parked copy says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parked<'a> {
    /// `x-chime-dead-reason`.
    pub reason: &'a str,
    /// `x-chime-error`: the last attempt's error, for runs that ran.
    pub error: Option<&'a str>,
    /// `x-chime-parked-at`, Unix ms.
    pub at_ms: i64,
}

/// The headers of a parked copy: the original's plus why, by whom, when and the last error.
pub(crate) fn parked_headers(
    original: Option<&FieldTable>,
    parked: Parked<'_>,
    worker_id: &str,
) -> FieldTable {
    let Parked {
        reason,
        error,
        at_ms,
    } = parked;
    let mut headers = original.cloned().unwrap_or_default();
    headers.insert(
        HEADER_DEAD_REASON.into(),
        AMQPValue::LongString(reason.into()),
    );
    headers.insert(
        HEADER_DEAD_BY.into(),
        AMQPValue::LongString(worker_id.into()),
    );
    headers.insert(HEADER_PARKED_AT.into(), AMQPValue::LongLongInt(at_ms));
    if let Some(error) = error {
        headers.insert(HEADER_ERROR.into(), AMQPValue::LongString(error.into()));
    }
    headers
}

/// Publishes a copy of `delivery` (same body and properties, plus the reason headers) to the
/// group's parking lot and waits for the broker's confirm. `channel` must be in confirm mode.
pub(crate) async fn park(
    channel: &Channel,
    topology: &Topology,
    delivery: &Delivery,
    reason: &str,
    error: Option<&str>,
    worker_id: &str,
) -> Result<(), PublishError> {
    let parked = Parked {
        reason,
        error,
        at_ms: chrono::Utc::now().timestamp_millis(),
    };
    let headers = parked_headers(delivery.properties.headers().as_ref(), parked, worker_id);
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        // Persistent, whatever the original said: a parked message waits for a human.
        .with_delivery_mode(2);
    publish::confirmed(
        channel,
        &topology.exchange(),
        PARKING_KEY,
        &delivery.data,
        properties,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_headers_keep_the_original_and_add_reason_and_worker() {
        let mut original = FieldTable::default();
        original.insert("x-chime-attempt".into(), AMQPValue::LongUInt(2));
        let parked = Parked {
            reason: "unknown job `x`",
            error: Some("boom"),
            at_ms: 1_800_000_000_000,
        };
        let h = parked_headers(Some(&original), parked, "w1");
        let get = |k: &str| h.inner().get(k).cloned();
        assert_eq!(get("x-chime-attempt"), Some(AMQPValue::LongUInt(2)));
        assert_eq!(
            get(HEADER_DEAD_REASON),
            Some(AMQPValue::LongString("unknown job `x`".into()))
        );
        assert_eq!(
            get(HEADER_DEAD_BY),
            Some(AMQPValue::LongString("w1".into()))
        );
        assert_eq!(
            get(HEADER_PARKED_AT),
            Some(AMQPValue::LongLongInt(1_800_000_000_000))
        );
        assert_eq!(
            get(HEADER_ERROR),
            Some(AMQPValue::LongString("boom".into()))
        );
    }
}
