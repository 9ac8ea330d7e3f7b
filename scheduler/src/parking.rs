//! The parking lot from the operator's side (`chime dlq …`): the leader's drain of every
//! group's parking-lot queue into PostgreSQL, what a drained message says, and purging a queue.
//!
//! It reaches the broker through the [`crate::amqp`] adapter.
//!
//! **Why drain.** A quorum queue cannot be read without changing it: `basic.get` and a return
//! (`basic.nack` with requeue, or closing the channel) count as a delivery and raise the
//! message's `x-delivery-count`; RabbitMQ 3.10 cannot mark a queue's delivery limit unlimited,
//! and a queue's arguments cannot change once declared. So the leader takes each message out of
//! the parking-lot queues once ([`run`], every [`DRAIN_PERIOD`]) and stores it in
//! `chime_dead_letters`; every read (list, show, dashboard) reads that table and never touches
//! the broker.
//!
//! **Invariants.** A pass drains only the groups that have a job, and only queues that exist
//! (a passive declare first; nothing is declared). A batch is at most [`DRAIN_BATCH`] messages
//! and [`DRAIN_BATCH_BYTES`] stored bytes, fetched with manual acknowledgement, stored in one
//! fenced statement, and acknowledged only after that statement committed: a message that could
//! not be stored stays unacknowledged (the insert is retried) and returns to its queue when the
//! channel closes. A crash between commit and ack delivers it again; its fingerprint keeps it
//! stored once. Every stored text is cut to `limits::MAX_HEADER_VALUE_BYTES` (NUL characters,
//! which PostgreSQL text cannot hold, become U+FFFD), the body to `limits::MAX_TRIGGER_BYTES`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chime_protocol::Topology;
use chime_protocol::addresses::Addresses;
use chime_protocol::headers;
use chime_protocol::limits::{self, MAX_HEADER_VALUE_BYTES, MAX_TRIGGER_BYTES};
use chime_protocol::wire::{
    HEADER_ATTEMPT, HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_DELIVERY_COUNT, HEADER_ERROR,
    HEADER_PARKED_AT, Trigger,
};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::amqp::{AMQPValue, Connection, Delivery, FieldTable};
use crate::store::{DeadLetterContent, Fence, NewDeadLetter, Store};
use chime_protocol::tls::AmqpTls;

/// How long a passive declare may take (as long as a connection may take to open).
const INSPECT_TIMEOUT: Duration = crate::amqp::CONNECT_TIMEOUT;

/// How often the leader drains the parking-lot queues.
pub const DRAIN_PERIOD: Duration = Duration::from_secs(1);
/// Most messages one batch takes from a queue (and one statement stores).
pub const DRAIN_BATCH: usize = 500;
/// Most stored bytes (headers and bodies, after cutting) one batch holds.
pub const DRAIN_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Most batches one pass takes from one queue before going on to the next group.
pub const DRAIN_BATCHES_PER_PASS: usize = 20;
/// How long the drain leaves a group alone after finding its parking-lot queue missing (a
/// passive declare of a missing queue closes the channel, which the client logs as an error).
pub const MISSING_RECHECK: Duration = Duration::from_secs(30);
/// How deep header tables and arrays are kept; deeper values are stored as a marker.
const MAX_HEADER_DEPTH: usize = 8;

/// One parked message, as its headers and body describe it; every text is cut to
/// `limits::MAX_HEADER_VALUE_BYTES` and holds no NUL.
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
    /// (the caller may fall back to the run's finish time); only instants PostgreSQL can hold.
    pub parked_at: Option<DateTime<Utc>>,
}

impl ParkedMessage {
    /// Reads a delivery's headers and body.
    pub fn from_delivery(group: &str, delivery: &Delivery) -> ParkedMessage {
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let trigger = (delivery.data.len() <= MAX_TRIGGER_BYTES)
            .then(|| Trigger::from_body(&delivery.data).ok())
            .flatten();
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
            job: trigger.as_ref().map(|t| stored_text(&t.job)),
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
    /// strings as strings, numbers as numbers, tables as objects, byte arrays as their bytes;
    /// each string cut to `limits::MAX_HEADER_VALUE_BYTES`.
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// The body: the trigger as JSON when it parses, else the body as (lossy UTF-8) text.
    pub body: serde_json::Value,
    /// Whether `body` is the parsed JSON body (false: the raw text).
    pub body_is_json: bool,
    /// Whether the body was longer than `limits::MAX_TRIGGER_BYTES` and was cut when drained.
    pub body_truncated: bool,
}

impl ParkedPayload {
    /// A stored dead letter's properties, headers and body.
    pub fn from_stored(stored: &DeadLetterContent) -> ParkedPayload {
        let parsed = (!stored.body_truncated)
            .then(|| serde_json::from_slice::<serde_json::Value>(&stored.body).ok())
            .flatten();
        ParkedPayload {
            message_id: stored.message_id.clone(),
            content_type: stored.content_type.clone(),
            headers: match &stored.headers {
                serde_json::Value::Object(map) => map.clone(),
                _ => serde_json::Map::new(),
            },
            body_is_json: parsed.is_some(),
            body: parsed.unwrap_or_else(|| {
                serde_json::Value::String(String::from_utf8_lossy(&stored.body).into_owned())
            }),
            body_truncated: stored.body_truncated,
        }
    }
}

/// What the drain stores of a delivery from `group`'s parking lot: its fields (cut to their
/// bounds), its headers, its body (cut) and its fingerprint.
pub fn dead_letter(group: &str, delivery: &Delivery) -> NewDeadLetter {
    let properties = &delivery.properties;
    let message = ParkedMessage::from_delivery(group, delivery);
    let headers = table_json(&properties.headers().clone().unwrap_or_default(), 0);
    let message_id = properties
        .message_id()
        .as_ref()
        .map(|id| stored_text(id.as_str()));
    let content_type = properties
        .content_type()
        .as_ref()
        .map(|t| stored_text(t.as_str()));
    let mut fingerprint = Sha256::new();
    // Length-prefixed parts, so no two messages share a fingerprint by shifting bytes around.
    let mut part = |bytes: &[u8]| {
        fingerprint.update((bytes.len() as u64).to_be_bytes());
        fingerprint.update(bytes);
    };
    part(message_id.as_deref().unwrap_or("\0none").as_bytes());
    part(content_type.as_deref().unwrap_or("\0none").as_bytes());
    let mut stable = headers.clone();
    // The broker adds it on every redelivery: not part of a message's fingerprint.
    stable.remove(HEADER_DELIVERY_COUNT);
    part(serde_json::Value::Object(stable).to_string().as_bytes());
    part(&delivery.data);
    let body_truncated = delivery.data.len() > MAX_TRIGGER_BYTES;
    NewDeadLetter {
        group: group.to_owned(),
        run_id: message.run_id,
        job: message.job,
        attempt: message.attempt.and_then(|a| i32::try_from(a).ok()),
        reason: message.reason,
        parked_by: message.parked_by,
        error: message.error,
        parked_at: message.parked_at,
        message_id,
        content_type,
        headers: serde_json::Value::Object(headers),
        body: delivery.data[..delivery.data.len().min(MAX_TRIGGER_BYTES)].to_vec(),
        body_truncated,
        fingerprint: fingerprint.finalize().to_vec(),
    }
}

/// Bytes a stored dead letter takes, roughly (for the batch bound).
fn stored_size(letter: &NewDeadLetter) -> usize {
    letter.body.len() + letter.headers.to_string().len() + 512
}

/// Drains the parking-lot queues of every group that has a job into `chime_dead_letters`,
/// every [`DRAIN_PERIOD`], while `stop` is not cancelled and the fence holds. Opens its own
/// connection to the broker (named `name`, with TLS options `amqp_tls`), and a new one after it
/// broke.
pub async fn run(
    store: Store,
    fence: Fence,
    amqp_urls: Addresses,
    amqp_tls: AmqpTls,
    prefix: String,
    name: String,
    stop: CancellationToken,
) {
    let mut connection: Option<Connection> = None;
    let mut missing = MissingQueues::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(DRAIN_PERIOD) => {}
        }
        if !connection.as_ref().is_some_and(Connection::is_connected) {
            connection = match Connection::open_first(&amqp_urls, &amqp_tls, &name).await {
                Ok(c) => Some(c),
                Err(e) => {
                    let e = anyhow::Error::new(e);
                    debug!(error = %format!("{e:#}"), "drain: broker unreachable; next pass tries again");
                    continue;
                }
            };
        }
        let Some(link) = connection.as_ref() else {
            continue;
        };
        match drain(&store, &fence, link, &prefix, &mut missing, &stop).await {
            Ok(Some(0)) => {}
            Ok(Some(drained)) => info!(drained, "drained parked messages into the database"),
            Ok(None) => break,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "draining the parking lots failed; trying again")
            }
        }
    }
    if let Some(connection) = connection {
        let _ = connection.close("done").await;
    }
}

/// Groups whose parking-lot queue a pass found missing, each with the instant after which a
/// pass looks again ([`MISSING_RECHECK`]); at most one entry per group that has a job.
#[derive(Debug, Default)]
pub struct MissingQueues(HashMap<String, Instant>);

/// One pass over every group that has a job: returns how many messages were stored, or `None`
/// if the fence no longer holds or `stop` was cancelled.
pub async fn drain(
    store: &Store,
    fence: &Fence,
    connection: &Connection,
    prefix: &str,
    missing: &mut MissingQueues,
    stop: &CancellationToken,
) -> anyhow::Result<Option<u64>> {
    let mut drained = 0;
    let now = Instant::now();
    missing.0.retain(|_, recheck| *recheck > now);
    for group in store.groups().await? {
        if missing.0.contains_key(&group) {
            continue;
        }
        let queue = Topology::new(prefix, &group).parking_queue();
        for _ in 0..DRAIN_BATCHES_PER_PASS {
            match drain_batch(store, fence, connection, &group, &queue, stop).await? {
                Batch::Missing => {
                    missing.0.insert(group.clone(), now + MISSING_RECHECK);
                    break;
                }
                Batch::Stored { taken, stored } => {
                    drained += stored;
                    if taken < DRAIN_BATCH {
                        break;
                    }
                }
                Batch::Full { stored } => drained += stored,
                Batch::Stopped => return Ok(None),
            }
        }
    }
    Ok(Some(drained))
}

/// What one batch did.
enum Batch {
    /// Took `taken` messages and stored `stored` new ones (the others were stored before).
    Stored { taken: usize, stored: u64 },
    /// Stopped at the byte bound; more may wait.
    Full { stored: u64 },
    /// The fence no longer holds or `stop` was cancelled; nothing was acknowledged.
    Stopped,
    /// The queue does not exist.
    Missing,
}

/// Takes one batch from `queue` (if it exists), stores it, then acknowledges it.
async fn drain_batch(
    store: &Store,
    fence: &Fence,
    connection: &Connection,
    group: &str,
    queue: &str,
    stop: &CancellationToken,
) -> anyhow::Result<Batch> {
    let channel = connection
        .channel()
        .await
        .context("opening a channel to drain the parking lots")?;
    // A missing queue (its workers never ran, no instance declared it yet): nothing to drain,
    // and nothing is created. The broker closes the channel.
    let Ok(declared) = channel.passive_declare(queue).await else {
        return Ok(Batch::Missing);
    };
    if declared.messages == 0 {
        channel.close("done").await;
        return Ok(Batch::Stored {
            taken: 0,
            stored: 0,
        });
    }
    let mut letters = Vec::new();
    let (mut bytes, mut last_tag) = (0, None);
    while letters.len() < DRAIN_BATCH && bytes < DRAIN_BATCH_BYTES {
        let got = channel
            .get(queue)
            .await
            .with_context(|| format!("reading the parking lot {queue}"));
        let delivery = match got {
            Ok(Some(delivery)) => delivery,
            Ok(None) => break,
            Err(e) => {
                // Closing the channel returns what this batch took.
                channel.close("read failed").await;
                return Err(e);
            }
        };
        let letter = dead_letter(group, &delivery);
        bytes += stored_size(&letter);
        letters.push(letter);
        last_tag = Some(delivery.delivery_tag);
    }
    let Some(last_tag) = last_tag else {
        channel.close("done").await;
        return Ok(Batch::Stored {
            taken: 0,
            stored: 0,
        });
    };
    // Stored before acknowledged: while the database refuses, the messages stay taken (not
    // returned, which would count as a delivery) and the insert is tried again.
    let stored = loop {
        match store.insert_dead_letters(fence, &letters).await {
            Ok(Some(stored)) => break stored,
            Ok(None) => {
                channel.close("lease lost").await;
                return Ok(Batch::Stopped);
            }
            Err(e) => {
                warn!(group, queue, messages = letters.len(), error = %format!("{e:#}"),
                      "could not store drained dead letters; they stay in the queue, trying again");
                tokio::select! {
                    () = stop.cancelled() => {
                        channel.close("stopping").await;
                        return Ok(Batch::Stopped);
                    }
                    () = tokio::time::sleep(DRAIN_PERIOD) => {}
                }
            }
        }
    };
    channel
        .ack_through(last_tag)
        .await
        .with_context(|| format!("acknowledging drained messages of {queue}"))?;
    channel.close("done").await;
    let taken = letters.len();
    Ok(if bytes >= DRAIN_BATCH_BYTES {
        Batch::Full { stored }
    } else {
        Batch::Stored { taken, stored }
    })
}

/// A connection to the broker for purging parking-lot queues and reading their depth: its own,
/// or the operations layer's shared one ([`crate::broker::Broker::parking_lot`]), which
/// [`ParkingLot::close`] leaves open. Nothing here declares a queue.
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

impl ParkingLot {
    /// Connects to the broker at `url` (TLS options `tls`); queue names use `prefix`.
    pub async fn connect(url: &str, tls: &AmqpTls, prefix: &str) -> anyhow::Result<ParkingLot> {
        let connection = Connection::open(url, tls, "chime-cli").await?;
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
        self.connection.is_connected()
    }

    /// The parking-lot queue of `group`.
    pub fn queue(&self, group: &str) -> String {
        Topology::new(&self.prefix, group).parking_queue()
    }

    /// Empties `group`'s parking-lot queue of the messages not drained yet; returns how many
    /// were removed (0 if the queue does not exist: it is not created).
    pub async fn purge(&self, group: &str) -> anyhow::Result<u32> {
        let queue = self.queue(group);
        if self.inspect(&queue).await.is_none() {
            return Ok(0);
        }
        let channel = self
            .connection
            .channel()
            .await
            .context("opening a channel")?;
        let count = channel
            .purge(&queue)
            .await
            .with_context(|| format!("purging the parking lot {queue}"))?;
        channel.close("done").await;
        Ok(count)
    }

    /// A queue's ready messages and consumers, from a passive declare (which creates nothing);
    /// `None` if the queue does not exist or the broker does not answer in time.
    pub async fn inspect(&self, queue: &str) -> Option<(u32, u32)> {
        let inspect = async {
            // A passive declare of a missing queue closes its channel: use a channel per queue.
            let channel = self.connection.channel().await.ok()?;
            let declared = channel.passive_declare(queue).await.ok()?;
            channel.close("done").await;
            Some((declared.messages, declared.consumers))
        };
        tokio::time::timeout(INSPECT_TIMEOUT, inspect)
            .await
            .ok()
            .flatten()
    }

    /// Closes the connection, unless it is shared.
    pub async fn close(self) {
        if self.owned {
            let _ = self.connection.close("done").await;
        }
    }
}

/// Whether one of the broker addresses `urls` accepts a connection (for `/readyz`).
pub async fn ping(urls: &Addresses, tls: &AmqpTls) -> Result<(), String> {
    match Connection::open_first(urls, tls, "chime-cli").await {
        Ok(connection) => {
            let _ = connection.close("done").await;
            Ok(())
        }
        Err(e) => Err(format!("{:#}", anyhow::Error::new(e))),
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

/// A header table as a JSON object, each text cut to its bound and free of NUL.
fn table_json(table: &FieldTable, depth: usize) -> serde_json::Map<String, serde_json::Value> {
    table
        .inner()
        .iter()
        .map(|(key, value)| (stored_text(key.as_str()), amqp_json(value, depth + 1)))
        .collect()
}

/// An AMQP field value as JSON: texts cut to `limits::MAX_HEADER_VALUE_BYTES` (NUL becomes
/// U+FFFD, which PostgreSQL can store), byte arrays to as many bytes, tables and arrays nested
/// deeper than [`MAX_HEADER_DEPTH`] replaced by a marker.
fn amqp_json(value: &AMQPValue, depth: usize) -> serde_json::Value {
    use serde_json::Value;
    if depth > MAX_HEADER_DEPTH
        && matches!(value, AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_))
    {
        return Value::String("…[nested too deep]".into());
    }
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
        AMQPValue::DecimalValue(d) => {
            serde_json::Number::from_f64(f64::from(d.value) / 10f64.powi(i32::from(d.scale)))
                .map_or(Value::Null, Value::Number)
        }
        AMQPValue::ShortString(s) => stored_text(s.as_str()).into(),
        AMQPValue::LongString(s) => stored_text(&String::from_utf8_lossy(s.as_bytes())).into(),
        AMQPValue::FieldArray(items) => Value::Array(
            items
                .as_slice()
                .iter()
                .map(|item| amqp_json(item, depth + 1))
                .collect(),
        ),
        AMQPValue::FieldTable(table) => Value::Object(table_json(table, depth)),
        AMQPValue::ByteArray(bytes) => {
            let bytes = bytes.as_slice();
            bytes[..bytes.len().min(MAX_HEADER_VALUE_BYTES)]
                .to_vec()
                .into()
        }
        AMQPValue::Void => Value::Null,
    }
}

/// `text` as the database stores it: at most `limits::MAX_HEADER_VALUE_BYTES` (cut at a
/// character boundary and marked), NUL replaced by U+FFFD.
fn stored_text(text: &str) -> String {
    let capped = limits::cap_header_value(text);
    if capped.contains('\0') {
        // U+FFFD is three bytes: cut again so the bound holds.
        let replaced = capped.replace('\0', "\u{FFFD}");
        limits::cap_header_value(&replaced).into_owned()
    } else {
        capped.into_owned()
    }
}

/// A text header (the protocol's one codec), cut and cleaned as every stored text.
fn header_text(table: &FieldTable, name: &str) -> Option<String> {
    headers::text(table.inner().get(name)?).map(|text| stored_text(&text))
}

/// An integer header (the protocol's one codec: any integer type, or its decimal text).
fn header_i64(table: &FieldTable, name: &str) -> Option<i64> {
    headers::integer(table.inner().get(name)?)
}

fn header_u32(headers: &FieldTable, name: &str) -> Option<u32> {
    header_i64(headers, name).and_then(|n| u32::try_from(n).ok())
}

/// Latest instant a parked-at header may name: the end of year 9999, well inside PostgreSQL's
/// range (a forged far-off instant would make the insert fail).
const LATEST_MILLIS: i64 = 253_402_300_799_999;

fn header_millis(headers: &FieldTable, name: &str) -> Option<DateTime<Utc>> {
    header_i64(headers, name)
        .filter(|ms| (0..=LATEST_MILLIS).contains(ms))
        .and_then(DateTime::from_timestamp_millis)
}

/// An AMQP timestamp (seconds), within the same range.
fn header_time(headers: &FieldTable, name: &str) -> Option<DateTime<Utc>> {
    header_i64(headers, name)
        .filter(|s| (0..=LATEST_MILLIS / 1000).contains(s))
        .and_then(|s| DateTime::from_timestamp(s, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{BasicProperties, FieldArray};

    fn delivery(properties: BasicProperties, body: &[u8]) -> Delivery {
        let mut d = Delivery::mock(1, "chime.g".into(), "parking".into(), false, body.to_vec());
        d.properties = properties;
        d
    }

    fn stored(letter: NewDeadLetter) -> ParkedPayload {
        ParkedPayload::from_stored(&DeadLetterContent {
            record: crate::store::DeadLetterRecord {
                id: 1,
                group: letter.group,
                run_id: letter.run_id,
                job: letter.job,
                attempt: letter.attempt,
                reason: letter.reason,
                parked_by: letter.parked_by,
                error: letter.error,
                parked_at: letter.parked_at,
            },
            position: 0,
            message_id: letter.message_id,
            content_type: letter.content_type,
            headers: letter.headers,
            body: letter.body,
            body_truncated: letter.body_truncated,
        })
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
        let p = stored(dead_letter("g", &delivery(properties, b"not json")));
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
            v: chime_protocol::wire::PROTOCOL_VERSION,
            run_id: 7,
            job: "nightly".into(),
            group: "g".into(),
            attempt: 2,
            scheduled_at: Utc::now(),
            params: serde_json::Value::Null,
            timeout_ms: None,
            retry: None,
            task: None,
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
        let p = stored(dead_letter(
            "g",
            &delivery(
                BasicProperties::default().with_headers(headers),
                &trigger.to_body(),
            ),
        ));
        assert!(p.body_is_json);
        assert_eq!(p.body["run_id"], 7);
        assert_eq!(p.body["job"], "nightly");
        assert_eq!(p.headers["x-death"], serde_json::json!([{"count": 1}]));
    }

    /// Whatever a message carries, what the drain stores is bounded and storable: long texts
    /// cut, NUL replaced, deep nesting cut off, far-off instants dropped, a huge body cut and
    /// flagged; and a redelivery (the broker's delivery count added) has the same fingerprint.
    #[test]
    fn a_hostile_message_is_stored_bounded_and_fingerprinted_without_its_delivery_count() {
        let long = "x".repeat(MAX_HEADER_VALUE_BYTES * 3);
        let mut nested = AMQPValue::LongString("bottom".into());
        for _ in 0..1_000 {
            let mut items = FieldArray::default();
            items.push(nested);
            nested = AMQPValue::FieldArray(items);
        }
        let mut headers = FieldTable::default();
        headers.insert(
            HEADER_DEAD_REASON.into(),
            AMQPValue::LongString(long.as_str().into()),
        );
        headers.insert(
            HEADER_ERROR.into(),
            AMQPValue::LongString("nul\0here".into()),
        );
        headers.insert(HEADER_PARKED_AT.into(), AMQPValue::LongLongInt(i64::MIN));
        headers.insert("deep".into(), nested);
        headers.insert(
            "bytes".into(),
            AMQPValue::ByteArray(vec![7u8; MAX_HEADER_VALUE_BYTES * 2].into()),
        );
        let body = vec![b'{'; MAX_TRIGGER_BYTES + 10];
        let properties = BasicProperties::default()
            .with_message_id("not\0a number".into())
            .with_headers(headers.clone());
        let letter = dead_letter("g", &delivery(properties.clone(), &body));
        assert!(letter.reason.as_ref().unwrap().len() <= MAX_HEADER_VALUE_BYTES);
        assert!(letter.reason.as_ref().unwrap().ends_with("…[truncated]"));
        assert_eq!(letter.error.as_deref(), Some("nul\u{FFFD}here"));
        assert_eq!(letter.message_id.as_deref(), Some("not\u{FFFD}a number"));
        assert_eq!((letter.run_id, letter.parked_at), (None, None));
        assert_eq!(letter.body.len(), MAX_TRIGGER_BYTES);
        assert!(letter.body_truncated);
        let text = letter.headers.to_string();
        assert!(!text.contains("bottom") && text.contains("nested too deep"));
        assert!(!text.contains("\\u0000"), "{}", &text[..200]);
        assert_eq!(
            letter.headers["bytes"].as_array().unwrap().len(),
            MAX_HEADER_VALUE_BYTES
        );
        assert!(stored_size(&letter) < 64 * 1024 + MAX_TRIGGER_BYTES);
        let shown = stored(letter.clone());
        assert!(shown.body_truncated && !shown.body_is_json);

        headers.insert(HEADER_DELIVERY_COUNT.into(), AMQPValue::LongLongInt(1));
        let again = dead_letter(
            "g",
            &delivery(properties.clone().with_headers(headers), &body),
        );
        assert_eq!(again.fingerprint, letter.fingerprint);
        let other = dead_letter("g", &delivery(properties, b"{}"));
        assert_ne!(other.fingerprint, letter.fingerprint);
    }
}
