//! Dead-lettering by the worker itself: copying a message it cannot run to the group's parking
//! lot, with the reason, before acking the original.
//!
//! Rejecting with `requeue=false` would also reach the parking lot (the work queue dead-letters
//! there), but RabbitMQ would only record "rejected"; publishing ourselves carries the reason in
//! [`HEADER_DEAD_REASON`] for the operator who replays it. The copy is published `mandatory` on a
//! confirm-mode channel, and only a plain broker ack counts: `Ack(Some(returned))` means no queue
//! took it (unroutable) and `Nack` means the queue refused it; either way the original must stay.

use chime_protocol::headers::{count_value, millis_value, text_value};
use chime_protocol::limits::{MAX_COPIED_HEADER_BYTES, MAX_HEADER_VALUE_BYTES};
use chime_protocol::topology::{PARKING_KEY, Topology};
use chime_protocol::wire::{
    HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_ERROR, HEADER_HEADERS_DROPPED, HEADER_PARKED_AT,
};
use lapin::Channel;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};

use super::publish::{self, PublishError};

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

/// Roughly how many bytes `value` takes on the wire.
fn encoded_size(value: &AMQPValue) -> usize {
    match value {
        AMQPValue::LongString(s) => 5 + s.as_bytes().len(),
        AMQPValue::ShortString(s) => 2 + s.as_str().len(),
        AMQPValue::ByteArray(b) => 5 + b.as_slice().len(),
        AMQPValue::FieldArray(a) => 5 + a.as_slice().iter().map(encoded_size).sum::<usize>(),
        AMQPValue::FieldTable(t) => {
            5 + t
                .inner()
                .iter()
                .map(|(k, v)| 1 + k.as_str().len() + encoded_size(v))
                .sum::<usize>()
        }
        _ => 9,
    }
}

/// The headers of `original` a copy may carry: those not named in `skip`, each string value cut
/// to [`MAX_HEADER_VALUE_BYTES`], in name order until [`MAX_COPIED_HEADER_BYTES`] are used; the
/// count of those left out goes in [`HEADER_HEADERS_DROPPED`].
pub(crate) fn copied_headers(original: Option<&FieldTable>, skip: &[&str]) -> FieldTable {
    let mut headers = FieldTable::default();
    let (mut used, mut dropped) = (0_usize, 0_u32);
    for (name, value) in original.map(|h| h.inner().iter()).into_iter().flatten() {
        if skip.contains(&name.as_str()) || name.as_str() == HEADER_HEADERS_DROPPED {
            continue;
        }
        let value = match value {
            AMQPValue::LongString(s) if s.as_bytes().len() > MAX_HEADER_VALUE_BYTES => {
                text_value(&String::from_utf8_lossy(s.as_bytes()))
            }
            other => other.clone(),
        };
        let size = 1 + name.as_str().len() + encoded_size(&value);
        if used + size > MAX_COPIED_HEADER_BYTES {
            dropped += 1;
            continue;
        }
        used += size;
        headers.insert(name.clone(), value);
    }
    if dropped > 0 {
        headers.insert(HEADER_HEADERS_DROPPED.into(), count_value(dropped));
    }
    headers
}

/// The headers of a parked copy: the original's (bounded, see [`copied_headers`]) plus why, by
/// whom, when and the last error, each cut to [`MAX_HEADER_VALUE_BYTES`].
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
    let written = [
        HEADER_DEAD_REASON,
        HEADER_DEAD_BY,
        HEADER_PARKED_AT,
        HEADER_ERROR,
    ];
    let mut headers = copied_headers(original, &written);
    headers.insert(HEADER_DEAD_REASON.into(), text_value(reason));
    headers.insert(HEADER_DEAD_BY.into(), text_value(worker_id));
    headers.insert(HEADER_PARKED_AT.into(), millis_value(at_ms));
    if let Some(error) = error {
        headers.insert(HEADER_ERROR.into(), text_value(error));
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

    #[test]
    fn parked_headers_stay_bounded_whatever_the_original_and_the_reason() {
        let mut original = FieldTable::default();
        original.insert("x-chime-attempt".into(), AMQPValue::LongUInt(2));
        original.insert(
            "x-a-huge".into(),
            AMQPValue::LongString("h".repeat(300_000).into()),
        );
        for i in 0..2_000 {
            original.insert(
                format!("x-filler-{i:04}").into(),
                AMQPValue::LongString("f".repeat(100).into()),
            );
        }
        let reason = "r".repeat(185_000);
        let parked = Parked {
            reason: &reason,
            error: Some(&reason),
            at_ms: 1,
        };
        let h = parked_headers(Some(&original), parked, &"w".repeat(10_000));
        let total: usize = h
            .inner()
            .iter()
            .map(|(k, v)| 1 + k.as_str().len() + encoded_size(v))
            .sum();
        assert!(
            total <= MAX_COPIED_HEADER_BYTES + 4 * (MAX_HEADER_VALUE_BYTES + 64),
            "{total} bytes of headers"
        );
        let get = |k: &str| h.inner().get(k).cloned();
        assert_eq!(get("x-chime-attempt"), Some(AMQPValue::LongUInt(2)));
        let Some(AMQPValue::LongString(kept)) = get(HEADER_DEAD_REASON) else {
            panic!("no reason header");
        };
        assert_eq!(kept.as_bytes().len(), MAX_HEADER_VALUE_BYTES);
        assert!(String::from_utf8_lossy(kept.as_bytes()).ends_with("…[truncated]"));
        let Some(AMQPValue::LongString(huge)) = get("x-a-huge") else {
            panic!("the huge header is cut, not dropped");
        };
        assert!(huge.as_bytes().len() <= MAX_HEADER_VALUE_BYTES);
        assert!(matches!(get(HEADER_HEADERS_DROPPED), Some(AMQPValue::LongUInt(n)) if n > 1_000));
    }
}
