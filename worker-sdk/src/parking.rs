//! Dead-lettering by the worker itself: copying a message it cannot run to the group's parking
//! lot, with the reason, before acking the original.
//!
//! Rejecting with `requeue=false` would also reach the parking lot (the work queue dead-letters
//! there), but RabbitMQ would only record "rejected"; publishing ourselves carries the reason in
//! [`HEADER_DEAD_REASON`] for the operator who replays it. The copy is published `mandatory` on a
//! confirm-mode channel, and only a plain broker ack counts: `Ack(Some(returned))` means no queue
//! took it (unroutable) and `Nack` means the queue refused it; either way the original must stay.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Confirmation};

use crate::protocol::{HEADER_DEAD_BY, HEADER_DEAD_REASON};
use crate::topology::{PARKING_KEY, Topology};

/// How long to wait for the broker's confirm of a parked copy.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a message could not be parked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParkError {
    #[error("publishing to the parking lot failed: {0}")]
    Publish(#[from] lapin::Error),
    #[error("the parking lot copy was unroutable ({0}): is the parking queue bound?")]
    Unroutable(String),
    #[error("the broker refused the parking lot copy (nack)")]
    Nacked,
    #[error("the broker did not confirm the parking lot copy within {CONFIRM_TIMEOUT:?}")]
    Timeout,
    #[error("the parking lot channel is not in confirm mode, so the copy cannot be trusted")]
    NotConfirmed,
}

/// The headers of a parked copy: the original's plus why and by whom.
pub(crate) fn parked_headers(
    original: Option<&FieldTable>,
    reason: &str,
    worker_id: &str,
) -> FieldTable {
    let mut headers = original.cloned().unwrap_or_default();
    headers.insert(
        HEADER_DEAD_REASON.into(),
        AMQPValue::LongString(reason.into()),
    );
    headers.insert(
        HEADER_DEAD_BY.into(),
        AMQPValue::LongString(worker_id.into()),
    );
    headers
}

/// Publishes a copy of `delivery` (same body and properties, plus the reason headers) to the
/// group's parking lot and waits for the broker's confirm. `channel` must be in confirm mode.
pub(crate) async fn park(
    channel: &Channel,
    topology: &Topology,
    delivery: &Delivery,
    reason: &str,
    worker_id: &str,
) -> Result<(), ParkError> {
    let headers = parked_headers(delivery.properties.headers().as_ref(), reason, worker_id);
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        // Persistent, whatever the original said: a parked message waits for a human.
        .with_delivery_mode(2);
    let exchange = topology.exchange();
    let confirm = channel
        .basic_publish(
            exchange.as_str().into(),
            PARKING_KEY.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &delivery.data,
            properties,
        )
        .await?;
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Err(_) => Err(ParkError::Timeout),
        Ok(Err(e)) => Err(ParkError::Publish(e)),
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(ParkError::Unroutable(format!(
            "{} {}",
            returned.reply_code, returned.reply_text
        ))),
        Ok(Ok(Confirmation::Nack(_))) => Err(ParkError::Nacked),
        Ok(Ok(Confirmation::NotRequested)) => Err(ParkError::NotConfirmed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_headers_keep_the_original_and_add_reason_and_worker() {
        let mut original = FieldTable::default();
        original.insert("x-chime-attempt".into(), AMQPValue::LongUInt(2));
        let h = parked_headers(Some(&original), "unknown job `x`", "w1");
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
    }
}
