//! The parking lot from the operator's side (`chime dlq …`): browse the groups' parking-lot
//! queues without removing anything, take chosen messages out (replay), and purge.
//!
//! With [`crate::publish`], the only scheduler module that speaks AMQP. Browsing is `basic.get`
//! with manual acknowledgement: every message fetched stays unacknowledged on this module's
//! channel until the session ends, then all are returned at once (`basic.nack`, multiple,
//! requeue). RabbitMQ puts returned messages at the back of a parking-lot queue (a quorum queue;
//! seen on 3.10: reading the first of three and returning it makes it the last). So reading
//! reads the whole queue, up to [`SCAN`] messages, before returning any: then every message goes
//! back in the order it was read, and the queue keeps its order. Only a parking lot longer than
//! [`SCAN`] is rotated by a read.

use std::time::Duration;

use anyhow::Context as _;
use chime_worker::Topology;
use chime_worker::protocol::{HEADER_ATTEMPT, HEADER_DEAD_BY, HEADER_DEAD_REASON, Trigger};
use chrono::{DateTime, Utc};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
use serde::Serialize;

use chime_worker::redact::redact_url as redact;
use chime_worker::tls::AmqpTls;

/// Most messages one read of a parking lot takes (and returns): a browse, a peek or a replay.
pub const SCAN: usize = 10_000;

/// How long to wait for the broker to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Header a worker may set with the instant (Unix milliseconds) it parked a message.
pub const HEADER_PARKED_AT: &str = "x-chime-parked-at";
/// Header with the last error of the run, if the worker that parked it set one.
pub const HEADER_ERROR: &str = "x-chime-error";

/// One message in a parking-lot queue, as its headers and body describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParkedMessage {
    /// Executor group whose parking lot holds it.
    pub group: String,
    /// Run id (the message id), when it has one.
    pub run_id: Option<i64>,
    /// Job, from the trigger body (or the run, when the body cannot be read).
    pub job: Option<String>,
    /// Attempt, from the `x-chime-attempt` header (or the body).
    pub attempt: Option<u32>,
    /// Why it was parked: `x-chime-dead-reason`, else RabbitMQ's `x-death` reason (such as
    /// `delivery_limit`).
    pub reason: Option<String>,
    /// The worker that parked it (`x-chime-dead-by`).
    pub parked_by: Option<String>,
    /// Last error: `x-chime-error` if set (the run's recorded error is filled in by the caller).
    pub error: Option<String>,
    /// When it was parked: `x-chime-parked-at`, else the time of the latest `x-death` entry
    /// (the caller may fall back to the run's finish time).
    pub parked_at: Option<DateTime<Utc>>,
}

impl ParkedMessage {
    /// Reads a delivery's headers and body.
    pub fn from_delivery(group: &str, delivery: &lapin::message::Delivery) -> ParkedMessage {
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let trigger = Trigger::from_body(&delivery.data).ok();
        let run_id = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| id.as_str().parse::<i64>().ok())
            .or(trigger.as_ref().map(|t| t.run_id));
        let death = latest_death(&headers);
        ParkedMessage {
            group: group.to_owned(),
            run_id,
            job: trigger.as_ref().map(|t| t.job.clone()),
            attempt: header_u32(&headers, HEADER_ATTEMPT).or(trigger.as_ref().map(|t| t.attempt)),
            reason: header_text(&headers, HEADER_DEAD_REASON)
                .or_else(|| death.as_ref().and_then(|d| header_text(d, "reason"))),
            parked_by: header_text(&headers, HEADER_DEAD_BY),
            error: header_text(&headers, HEADER_ERROR),
            parked_at: header_millis(&headers, HEADER_PARKED_AT)
                .or_else(|| death.as_ref().and_then(|d| header_time(d, "time"))),
        }
    }
}

/// A parked message in full, for inspecting it: its AMQP properties and headers, and its body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParkedPayload {
    /// The `message-id` property (the run id, as text).
    pub message_id: Option<String>,
    /// The `content-type` property.
    pub content_type: Option<String>,
    /// Every header (`x-chime-dead-reason`, `x-chime-attempt`, RabbitMQ's `x-death`, …) as JSON:
    /// strings as strings, numbers as numbers, tables as objects, byte arrays as their bytes.
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// The body: the trigger as JSON when it parses, else the body as (lossy UTF-8) text.
    pub body: serde_json::Value,
    /// Whether `body` is the parsed JSON body (false: the raw text).
    pub body_is_json: bool,
}

impl ParkedPayload {
    /// Reads a delivery's properties, headers and body.
    pub fn from_delivery(delivery: &lapin::message::Delivery) -> ParkedPayload {
        let properties = &delivery.properties;
        let headers = properties.headers().clone().unwrap_or_default();
        let parsed = serde_json::from_slice::<serde_json::Value>(&delivery.data).ok();
        ParkedPayload {
            message_id: properties.message_id().as_ref().map(|id| id.to_string()),
            content_type: properties.content_type().as_ref().map(|t| t.to_string()),
            headers: table_json(&headers),
            body_is_json: parsed.is_some(),
            body: parsed.unwrap_or_else(|| {
                serde_json::Value::String(String::from_utf8_lossy(&delivery.data).into_owned())
            }),
        }
    }
}

/// A connection to the broker for parking-lot operations: its own, or the operations layer's
/// shared one ([`crate::broker::Broker::parking_lot`]), which [`ParkingLot::close`] leaves open.
pub struct ParkingLot {
    connection: std::sync::Arc<Connection>,
    prefix: String,
    owned: bool,
}

impl std::fmt::Debug for ParkingLot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkingLot")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Messages fetched from one parking-lot queue and held (unacknowledged) until
/// [`Fetched::release`]; [`Fetched::remove`] takes one out for good.
pub struct Fetched {
    channel: Channel,
    tags: Vec<u64>,
    /// The messages, in the order fetched.
    pub messages: Vec<ParkedMessage>,
    /// Each message in full (same order as `messages`).
    pub payloads: Vec<ParkedPayload>,
    /// Messages left in the queue beyond the ones fetched.
    pub remaining: u32,
}

impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetched")
            .field("messages", &self.messages)
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

impl Fetched {
    /// Removes the `index`th fetched message from the queue (acknowledges it).
    pub async fn remove(&self, index: usize) -> anyhow::Result<()> {
        self.channel
            .basic_ack(self.tags[index], BasicAckOptions::default())
            .await
            .context("removing a message from the parking lot")
    }

    /// Returns every message not removed to the queue and closes the session.
    pub async fn release(self) -> anyhow::Result<()> {
        if !self.tags.is_empty() {
            self.channel
                .basic_nack(
                    0,
                    BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    },
                )
                .await
                .context("returning browsed messages to the parking lot")?;
        }
        // Closing also returns anything still unacknowledged.
        let _ = self.channel.close(200, "done".into()).await;
        Ok(())
    }
}

impl ParkingLot {
    /// Connects to the broker at `url` (TLS options `tls`); queue names use `prefix`.
    pub async fn connect(url: &str, tls: &AmqpTls, prefix: &str) -> anyhow::Result<ParkingLot> {
        let connection = open_connection(url, tls, "chime-cli").await?;
        Ok(ParkingLot {
            connection: std::sync::Arc::new(connection),
            prefix: prefix.to_owned(),
            owned: true,
        })
    }

    /// Parking-lot operations on a connection shared with others: each operation opens its own
    /// channel on it, and [`ParkingLot::close`] does not close it.
    pub fn on(connection: std::sync::Arc<Connection>, prefix: &str) -> ParkingLot {
        ParkingLot {
            connection,
            prefix: prefix.to_owned(),
            owned: false,
        }
    }

    /// Whether the connection is still open (a failed operation may have broken it).
    pub fn connected(&self) -> bool {
        self.connection.status().connected()
    }

    /// The parking-lot queue of `group`.
    pub fn queue(&self, group: &str) -> String {
        Topology::new(&self.prefix, group).parking_queue()
    }

    /// A channel on which `group`'s topology is declared (idempotent), so a group whose workers
    /// never ran still has its (empty) parking lot instead of a channel error.
    async fn channel(&self, group: &str) -> anyhow::Result<Channel> {
        let channel = self
            .connection
            .create_channel()
            .await
            .context("opening a channel")?;
        Topology::new(&self.prefix, group)
            .declare(&channel)
            .await
            .with_context(|| format!("declaring the queues of group {group:?}"))?;
        Ok(channel)
    }

    /// Fetches up to `limit` messages of `group`'s parking lot and holds them; the caller must
    /// [`Fetched::release`] them.
    pub async fn fetch(&self, group: &str, limit: usize) -> anyhow::Result<Fetched> {
        let channel = self.channel(group).await?;
        let queue = self.queue(group);
        let mut fetched = Fetched {
            channel,
            tags: Vec::new(),
            messages: Vec::new(),
            payloads: Vec::new(),
            remaining: 0,
        };
        while fetched.messages.len() < limit {
            let got = fetched
                .channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .with_context(|| format!("reading the parking lot {queue}"));
            let got = match got {
                Ok(got) => got,
                Err(e) => {
                    let _ = fetched.release().await;
                    return Err(e);
                }
            };
            let Some(message) = got else {
                fetched.remaining = 0;
                break;
            };
            fetched.remaining = message.message_count;
            fetched.tags.push(message.delivery.delivery_tag);
            fetched
                .messages
                .push(ParkedMessage::from_delivery(group, &message.delivery));
            fetched
                .payloads
                .push(ParkedPayload::from_delivery(&message.delivery));
        }
        Ok(fetched)
    }

    /// The first `limit` messages of `group`'s parking lot, without removing any. It reads the
    /// whole queue (up to [`SCAN`] messages), so that returning them keeps the queue's order.
    pub async fn browse(&self, group: &str, limit: usize) -> anyhow::Result<Vec<ParkedMessage>> {
        let fetched = self.fetch(group, SCAN.max(limit)).await?;
        let mut messages = fetched.messages.clone();
        messages.truncate(limit);
        fetched.release().await?;
        Ok(messages)
    }

    /// The first message of run `run_id` in `group`'s parking lot, in full, and its position
    /// (0 = the head), reading at most `scan` messages; nothing is removed. Every message read
    /// is returned at once, in the order read, so when the whole queue fits in `scan` the
    /// queue keeps its order.
    pub async fn peek(
        &self,
        group: &str,
        run_id: i64,
        scan: usize,
    ) -> anyhow::Result<Option<(usize, ParkedMessage, ParkedPayload)>> {
        let fetched = self.fetch(group, scan).await?;
        let found = fetched
            .messages
            .iter()
            .position(|m| m.run_id == Some(run_id))
            .map(|i| (i, fetched.messages[i].clone(), fetched.payloads[i].clone()));
        fetched.release().await?;
        Ok(found)
    }

    /// Empties `group`'s parking lot; returns how many messages were removed.
    pub async fn purge(&self, group: &str) -> anyhow::Result<u32> {
        let channel = self.channel(group).await?;
        let queue = self.queue(group);
        let count = channel
            .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .with_context(|| format!("purging the parking lot {queue}"))?;
        let _ = channel.close(200, "done".into()).await;
        Ok(count)
    }

    /// A queue's ready messages and consumers, from a passive declare (which creates nothing);
    /// `None` if the queue does not exist or the broker does not answer in time.
    pub async fn inspect(&self, queue: &str) -> Option<(u32, u32)> {
        let inspect = async {
            // A passive declare of a missing queue closes its channel: use a channel per queue.
            let channel = self.connection.create_channel().await.ok()?;
            let declared = channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .ok()?;
            let _ = channel.close(200, "done".into()).await;
            Some((declared.message_count(), declared.consumer_count()))
        };
        tokio::time::timeout(CONNECT_TIMEOUT, inspect)
            .await
            .ok()
            .flatten()
    }

    /// Closes the connection, unless it is shared.
    pub async fn close(self) {
        if self.owned {
            let _ = self.connection.close(200, "done".into()).await;
        }
    }
}

/// A connection to the broker at `url` (TLS options `tls`) named `name` (as the broker lists
/// it), waiting at most 5 s.
pub async fn open_connection(url: &str, tls: &AmqpTls, name: &str) -> anyhow::Result<Connection> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    tokio::time::timeout(
        CONNECT_TIMEOUT,
        chime_worker::tls::connect(url, tls, properties),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "broker at {} did not answer within {CONNECT_TIMEOUT:?}",
            redact(url)
        )
    })?
    .with_context(|| format!("connecting to RabbitMQ at {}", redact(url)))
}

/// Whether the broker at `url` accepts a connection (for `/readyz`).
pub async fn ping(url: &str, tls: &AmqpTls) -> Result<(), String> {
    match ParkingLot::connect(url, tls, "").await {
        Ok(lot) => {
            lot.close().await;
            Ok(())
        }
        Err(e) => Err(format!("{e:#}")),
    }
}

/// The most recent `x-death` entry (RabbitMQ keeps them newest first).
fn latest_death(headers: &FieldTable) -> Option<FieldTable> {
    match headers.inner().get("x-death")? {
        AMQPValue::FieldArray(entries) => entries.as_slice().iter().find_map(|e| match e {
            AMQPValue::FieldTable(t) => Some(t.clone()),
            _ => None,
        }),
        _ => None,
    }
}

/// A header table as a JSON object.
fn table_json(table: &FieldTable) -> serde_json::Map<String, serde_json::Value> {
    table
        .inner()
        .iter()
        .map(|(key, value)| (key.as_str().to_owned(), amqp_json(value)))
        .collect()
}

/// An AMQP field value as JSON.
fn amqp_json(value: &AMQPValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        AMQPValue::Timestamp(n) => (*n).into(),
        AMQPValue::Float(x) => {
            serde_json::Number::from_f64(f64::from(*x)).map_or(Value::Null, Value::Number)
        }
        AMQPValue::Double(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
        AMQPValue::DecimalValue(d) => (f64::from(d.value) / 10f64.powi(i32::from(d.scale))).into(),
        AMQPValue::ShortString(s) => s.as_str().into(),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned().into(),
        AMQPValue::FieldArray(items) => {
            Value::Array(items.as_slice().iter().map(amqp_json).collect())
        }
        AMQPValue::FieldTable(table) => Value::Object(table_json(table)),
        AMQPValue::ByteArray(bytes) => bytes.as_slice().to_vec().into(),
        AMQPValue::Void => Value::Null,
    }
}

fn header_text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn header_i64(headers: &FieldTable, name: &str) -> Option<i64> {
    match headers.inner().get(name)? {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).trim().parse().ok(),
        _ => None,
    }
}

fn header_u32(headers: &FieldTable, name: &str) -> Option<u32> {
    header_i64(headers, name).and_then(|n| u32::try_from(n).ok())
}

fn header_millis(headers: &FieldTable, name: &str) -> Option<DateTime<Utc>> {
    header_i64(headers, name).and_then(DateTime::from_timestamp_millis)
}

/// An AMQP timestamp (seconds).
fn header_time(headers: &FieldTable, name: &str) -> Option<DateTime<Utc>> {
    header_i64(headers, name).and_then(|s| DateTime::from_timestamp(s, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;
    use lapin::types::FieldArray;

    fn delivery(properties: BasicProperties, body: &[u8]) -> lapin::message::Delivery {
        let mut d = lapin::message::Delivery::mock(
            1,
            "chime.g".into(),
            "parking".into(),
            false,
            body.to_vec(),
        );
        d.properties = properties;
        d
    }

    #[test]
    fn reads_the_workers_headers() {
        let mut headers = FieldTable::default();
        headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(3));
        headers.insert(
            HEADER_DEAD_REASON.into(),
            AMQPValue::LongString("attempts exhausted".into()),
        );
        headers.insert(HEADER_DEAD_BY.into(), AMQPValue::LongString("w1".into()));
        headers.insert(
            HEADER_PARKED_AT.into(),
            AMQPValue::LongLongInt(1_796_000_000_123),
        );
        let properties = BasicProperties::default()
            .with_message_id("42".into())
            .with_headers(headers);
        let m = ParkedMessage::from_delivery("g", &delivery(properties, b"not json"));
        assert_eq!(m.run_id, Some(42));
        assert_eq!(m.job, None);
        assert_eq!(m.attempt, Some(3));
        assert_eq!(m.reason.as_deref(), Some("attempts exhausted"));
        assert_eq!(m.parked_by.as_deref(), Some("w1"));
        assert_eq!(
            m.parked_at,
            DateTime::from_timestamp_millis(1_796_000_000_123)
        );
        // In full: every header as JSON, and a body that is not JSON as text.
        let properties = BasicProperties::default()
            .with_message_id("42".into())
            .with_headers({
                let mut h = FieldTable::default();
                h.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(3));
                h.insert(
                    HEADER_DEAD_REASON.into(),
                    AMQPValue::LongString("<b>attempts</b>".into()),
                );
                h
            });
        let p = ParkedPayload::from_delivery(&delivery(properties, b"not json"));
        assert_eq!(p.message_id.as_deref(), Some("42"));
        assert_eq!(
            serde_json::Value::Object(p.headers),
            serde_json::json!({HEADER_ATTEMPT: 3, HEADER_DEAD_REASON: "<b>attempts</b>"})
        );
        assert_eq!(p.body, serde_json::json!("not json"));
        assert!(!p.body_is_json);
    }

    #[test]
    fn falls_back_to_rabbitmqs_x_death() {
        let mut death = FieldTable::default();
        death.insert(
            "reason".into(),
            AMQPValue::LongString("delivery_limit".into()),
        );
        death.insert("time".into(), AMQPValue::Timestamp(1_796_000_000));
        let mut entries = FieldArray::default();
        entries.push(AMQPValue::FieldTable(death));
        let mut headers = FieldTable::default();
        headers.insert("x-death".into(), AMQPValue::FieldArray(entries));
        let trigger = Trigger {
            v: chime_worker::protocol::PROTOCOL_VERSION,
            run_id: 7,
            job: "nightly".into(),
            group: "g".into(),
            attempt: 2,
            scheduled_at: Utc::now(),
            params: serde_json::Value::Null,
            timeout_ms: None,
            retry: None,
        };
        let properties = BasicProperties::default().with_headers(headers);
        let m = ParkedMessage::from_delivery("g", &delivery(properties, &trigger.to_body()));
        assert_eq!(m.run_id, Some(7));
        assert_eq!(m.job.as_deref(), Some("nightly"));
        assert_eq!(m.attempt, Some(2));
        assert_eq!(m.reason.as_deref(), Some("delivery_limit"));
        assert_eq!(m.parked_at, DateTime::from_timestamp(1_796_000_000, 0));
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(1));
        let mut entries = FieldArray::default();
        entries.push(AMQPValue::FieldTable(death));
        let mut headers = FieldTable::default();
        headers.insert("x-death".into(), AMQPValue::FieldArray(entries));
        let p = ParkedPayload::from_delivery(&delivery(
            BasicProperties::default().with_headers(headers),
            &trigger.to_body(),
        ));
        assert!(p.body_is_json);
        assert_eq!(p.body["run_id"], 7);
        assert_eq!(p.body["job"], "nightly");
        assert_eq!(p.headers["x-death"], serde_json::json!([{"count": 1}]));
    }
}
