//! Delayed messages: publishing a retry (or the rest of an early arrival's wait) through the
//! group's delay tiers. [`super::Inbound`] reads the headers that say when a message is due.
//!
//! A delayed message carries [`HEADER_NOT_BEFORE`] (Unix ms). It goes to the largest tier not
//! longer than what remains ([`retry::plan_wait`]), comes back through the work queue when the
//! tier's TTL expires, and the worker that receives it either runs it, holds it in memory for
//! the last few hundred milliseconds, or sends it through another tier. The instant is absolute,
//! so hops never add up errors; workers compare it with their wall clock.

use chime_protocol::headers::{attempt_value, instant_value};
use chime_protocol::retry::{self, Wait};
use chime_protocol::topology::{RetryTier, Topology, WORK_KEY};
use chime_protocol::wire::{
    HEADER_ATTEMPT, HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_DELIVERY_COUNT, HEADER_ERROR,
    HEADER_NOT_BEFORE, HEADER_PARKED_AT,
};
use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::{BasicProperties, Channel};

use super::parking;
use super::publish::{self, PublishError};

/// Headers that describe an earlier life of a message (set by the broker on redelivery and
/// dead-lettering, or by a worker that parked it) and that a republished copy must not inherit:
/// a stale `x-delivery-count` would make a fresh retry look like a crash loop.
const STALE_HEADERS: [&str; 12] = [
    HEADER_DELIVERY_COUNT,
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    HEADER_DEAD_REASON,
    HEADER_DEAD_BY,
    HEADER_PARKED_AT,
    HEADER_ERROR,
];

/// The routing key for a message due at `not_before`, seen at `now`: the tier that fits what
/// remains, or the work queue itself when it is (almost) due.
pub(crate) fn route(not_before: DateTime<Utc>, now: DateTime<Utc>) -> Option<RetryTier> {
    let remaining = (not_before - now).to_std().unwrap_or_default();
    match retry::plan_wait(remaining) {
        Wait::Tier(tier) => Some(tier),
        Wait::Now | Wait::Hold(_) => None,
    }
}

/// Properties of a delayed copy: the original's identity (content type, message id, timestamp),
/// its headers without [`STALE_HEADERS`] (bounded: [`parking::copied_headers`]), and the attempt and due instant.
pub(crate) fn delayed_properties(
    original: &BasicProperties,
    attempt: u32,
    not_before: DateTime<Utc>,
) -> BasicProperties {
    let mut headers = parking::copied_headers(original.headers().as_ref(), &STALE_HEADERS);
    headers.insert(HEADER_ATTEMPT.into(), attempt_value(attempt));
    headers.insert(HEADER_NOT_BEFORE.into(), instant_value(not_before));
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(content_type) = original.content_type() {
        properties = properties.with_content_type(content_type.clone());
    }
    if let Some(id) = original.message_id() {
        properties = properties.with_message_id(id.clone());
    }
    if let Some(timestamp) = original.timestamp() {
        properties = properties.with_timestamp(*timestamp);
    }
    properties
}

/// Publishes `body` (a trigger for attempt `attempt`) due at `not_before` through the delay
/// tiers, with confirms; returns the routing key it went to.
pub(crate) async fn publish(
    channel: &Channel,
    topology: &Topology,
    original: &BasicProperties,
    body: &[u8],
    attempt: u32,
    not_before: DateTime<Utc>,
) -> Result<String, PublishError> {
    let tier = route(not_before, Utc::now());
    publish_via(channel, topology, original, body, attempt, tier, not_before).await
}

/// Publishes `body` (a trigger for attempt `attempt`, due at `not_before`) through `tier` (the
/// work queue itself when `None`), with confirms, whatever remains until `not_before`: a
/// delivery sent back for another worker waits the tier out even when it is due already.
/// Returns the routing key it went to.
pub(crate) async fn publish_via(
    channel: &Channel,
    topology: &Topology,
    original: &BasicProperties,
    body: &[u8],
    attempt: u32,
    tier: Option<RetryTier>,
    not_before: DateTime<Utc>,
) -> Result<String, PublishError> {
    let key = match tier {
        Some(tier) => {
            topology
                .declare_tier(channel, &tier)
                .await
                .map_err(|source| PublishError::Publish {
                    key: tier.routing_key(),
                    source,
                })?;
            tier.routing_key()
        }
        None => WORK_KEY.to_owned(),
    };
    let properties = delayed_properties(original, attempt, not_before);
    publish::confirmed(channel, &topology.exchange(), &key, body, properties).await?;
    Ok(key)
}

/// Properties of a forwarded copy: the original's, with its headers less [`STALE_HEADERS`]
/// (bounded: [`parking::copied_headers`]); the attempt and not-before headers stay as they are.
pub(crate) fn forwarded_properties(original: &BasicProperties) -> BasicProperties {
    let headers = parking::copied_headers(original.headers().as_ref(), &STALE_HEADERS);
    original.clone().with_headers(headers).with_delivery_mode(2)
}

/// Publishes `original` (body and properties, less the broker's record of its earlier life:
/// a stale `x-delivery-count` would count against the delivery limit of the queue it goes to)
/// to worker `worker`'s own queue, routing key `worker.<worker>`, with confirms: a broadcast
/// task that came back through a delay tier to the group's work queue. Unroutable when that
/// worker's queue does not exist.
pub(crate) async fn forward(
    channel: &Channel,
    topology: &Topology,
    original: &Delivery,
    worker: &str,
) -> Result<(), PublishError> {
    let properties = forwarded_properties(&original.properties);
    let key = Topology::worker_key(worker);
    publish::confirmed(
        channel,
        &topology.exchange(),
        &key,
        &original.data,
        properties,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable};

    #[test]
    fn routes_by_what_remains() {
        let now: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let ms = chrono::Duration::milliseconds;
        let key = |due| route(due, now).map(|tier| tier.routing_key());
        assert_eq!(key(now - ms(5)), None);
        assert_eq!(key(now + ms(100)), None);
        assert_eq!(key(now + ms(1_000)).as_deref(), Some("retry.1s"));
        assert_eq!(key(now + ms(3_700)).as_deref(), Some("retry.2s"));
        assert_eq!(key(now + ms(7_200_000)).as_deref(), Some("retry.1h"));
    }

    #[test]
    fn a_forwarded_copy_keeps_its_headers_but_not_the_brokers_record_of_its_past() {
        let mut headers = FieldTable::default();
        headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(3));
        headers.insert(
            HEADER_NOT_BEFORE.into(),
            AMQPValue::LongLongInt(1_800_000_000_000),
        );
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(4));
        headers.insert("x-death".into(), AMQPValue::FieldArray(Default::default()));
        let original = BasicProperties::default()
            .with_message_id("42".into())
            .with_headers(headers);
        let p = forwarded_properties(&original);
        let h = p.headers().as_ref().unwrap().inner();
        assert_eq!(h.get(HEADER_ATTEMPT), Some(&AMQPValue::LongUInt(3)));
        assert_eq!(
            h.get(HEADER_NOT_BEFORE),
            Some(&AMQPValue::LongLongInt(1_800_000_000_000))
        );
        assert!(!h.contains_key("x-delivery-count") && !h.contains_key("x-death"));
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "42");
        assert_eq!(p.delivery_mode(), &Some(2));
    }

    #[test]
    fn a_delayed_copy_keeps_its_identity_and_sheds_its_past() {
        let mut headers = FieldTable::default();
        headers.insert("x-chime-term".into(), AMQPValue::LongLongInt(7));
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(2));
        headers.insert("x-death".into(), AMQPValue::FieldArray(Default::default()));
        headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(1));
        let original = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id("42".into())
            .with_timestamp(1_800_000_000)
            .with_headers(headers);
        let due: DateTime<Utc> = "2026-12-01T00:00:01.5Z".parse().unwrap();
        let p = delayed_properties(&original, 2, due);
        let h = p.headers().as_ref().unwrap().inner();
        assert_eq!(h.get("x-chime-term"), Some(&AMQPValue::LongLongInt(7)));
        assert_eq!(h.get(HEADER_ATTEMPT), Some(&AMQPValue::LongUInt(2)));
        assert_eq!(
            h.get(HEADER_NOT_BEFORE),
            Some(&AMQPValue::LongLongInt(due.timestamp_millis()))
        );
        assert!(!h.contains_key("x-delivery-count") && !h.contains_key("x-death"));
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "42");
        assert_eq!(p.delivery_mode(), &Some(2));
        assert_eq!(p.timestamp(), &Some(1_800_000_000));
    }
}
