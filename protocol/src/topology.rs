//! RabbitMQ topology of one executor group, declared idempotently by the scheduler and by workers:
//! every name, routing key and queue argument, as data; the declares behind feature `amqp`.
//!
//! Per group `G` under a name prefix `P` (default `chime`):
//!
//! | object | name | notes |
//! |---|---|---|
//! | exchange | `P.G` | direct, durable; every message of the group goes through it |
//! | work queue | `P.G.work` | quorum, bound with key `work`; explicit `x-delivery-limit`; dead-letters to `P.G` with key `parking` (at-least-once) |
//! | parking lot | `P.G.parking` | quorum, bound with key `parking`; runs that cannot go on wait here for an operator |
//! | delay tiers | `P.G.retry.<tier>` for each of [`RETRY_TIERS`] | quorum, fixed `x-message-ttl`, bound with key `retry.<tier>`; dead-letter back to `P.G` with key `work` (at-least-once) |
//! | worker queues | `P.G.worker.<id>` for each worker `<id>` | quorum, bound with key `worker.<id>`; a broadcast task for that worker only; the work queue's arguments and `x-expires` one day; declared by the worker, kept across its restarts, deleted by the broker after a day unused |
//!
//! `Topology::declare` (feature `amqp`) declares the exchange, work queue and parking lot. A
//! delay tier is declared by the worker that first sends a message through it
//! (`Topology::declare_tier`, just before that confirmed publish), so a group whose jobs retry
//! after 1 s and 2 s has two tier queues, not thirteen: every quorum queue is a Raft group with
//! its own log on the broker.
//!
//! RabbitMQ 3.10 has no delayed-message plugin and a queue with per-message TTLs only expires
//! its head, so a 5 s retry would wait behind a 1 h one; each tier therefore has one fixed TTL,
//! which keeps its FIFO order equal to its expiry order. Declaring the same topology twice with
//! the same arguments is a no-op in RabbitMQ, and declaring it with different arguments is a
//! channel error, so every argument lives here, once.
//!
//! Under the prefix there is also the control exchange `P.control` (fanout,
//! [`control_exchange`]): every worker binds an exclusive, auto-deleted queue to it and receives
//! [`crate::wire::ControlMessage`]s such as "cancel run N".

use std::time::Duration;

#[cfg(feature = "amqp")]
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
#[cfg(feature = "amqp")]
use lapin::types::{AMQPValue, FieldTable};
#[cfg(feature = "amqp")]
use lapin::{Channel, ExchangeKind};

/// Routing key of the work queue.
pub const WORK_KEY: &str = "work";
/// Routing key of the parking-lot queue.
pub const PARKING_KEY: &str = "parking";
/// Routing keys of workers' own queues start with this ([`Topology::worker_key`]).
pub const WORKER_KEY_PREFIX: &str = "worker.";
/// How long a worker's own queue may go unused (no consumer, no declare) before the broker
/// deletes it: `x-expires` of [`Topology::worker_queue_arguments`] (one day).
pub const WORKER_QUEUE_EXPIRES: Duration = Duration::from_secs(24 * 3600);
/// Default name prefix of every exchange and queue Chime declares.
pub const DEFAULT_PREFIX: &str = "chime";
/// One delay tier: a queue whose messages wait `ttl`, then go back to the work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryTier {
    /// Name used in the queue name (`P.G.retry.<name>`) and routing key (`retry.<name>`).
    pub name: &'static str,
    /// The tier queue's `x-message-ttl`.
    pub ttl: Duration,
}

const fn tier(name: &'static str, ms: u64) -> RetryTier {
    RetryTier {
        name,
        ttl: Duration::from_millis(ms),
    }
}

/// The delay tiers of every group, shortest first. A delay is served by hopping through the
/// largest tier not longer than what remains (see [`crate::retry::plan_wait`]); the two
/// sub-second tiers keep the last in-memory wait under [`crate::timing::HOLD_MAX`] whatever the
/// delay, so jittered delays stay exact without holding a consumer slot for long.
pub const RETRY_TIERS: [RetryTier; 13] = [
    tier("250ms", 250),
    tier("500ms", 500),
    tier("1s", 1_000),
    tier("2s", 2_000),
    tier("5s", 5_000),
    tier("10s", 10_000),
    tier("30s", 30_000),
    tier("1m", 60_000),
    tier("2m", 120_000),
    tier("5m", 300_000),
    tier("10m", 600_000),
    tier("30m", 1_800_000),
    tier("1h", 3_600_000),
];

// A tier's TTL is declared as an unsigned 32-bit integer of milliseconds.
const _: () = assert!(RETRY_TIERS[RETRY_TIERS.len() - 1].ttl.as_millis() <= u32::MAX as u128);

impl RetryTier {
    /// Routing key of this tier on the group's exchange: `retry.<name>`.
    pub fn routing_key(&self) -> String {
        format!("retry.{}", self.name)
    }
}

/// Default quorum delivery limit: how many times a message may be handed out (crash loops,
/// requeues) before RabbitMQ dead-letters it to the parking lot. RabbitMQ 3.10 has no default.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 5;

/// The value of a queue argument, as the broker must get it: declaring a queue again with an
/// argument of another type is a channel error (`PRECONDITION_FAILED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgValue {
    /// A text (an AMQP long string).
    Text(String),
    /// An unsigned 32-bit integer (an AMQP `long-uint`).
    U32(u32),
}

/// A queue's arguments (`x-queue-type`, `x-message-ttl`, …), in declaration order.
pub type QueueArguments = Vec<(&'static str, ArgValue)>;

fn text(s: &str) -> ArgValue {
    ArgValue::Text(s.to_owned())
}

/// Names and arguments of one executor group's exchange and queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
    group: String,
    delivery_limit: u32,
}

impl Topology {
    /// Topology of `group` under `prefix`.
    pub fn new(prefix: impl Into<String>, group: impl Into<String>) -> Self {
        Topology {
            prefix: prefix.into(),
            group: group.into(),
            delivery_limit: DEFAULT_DELIVERY_LIMIT,
        }
    }

    /// Overrides the quorum delivery limit of the work queue.
    pub fn with_delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// The executor group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The work queue's quorum delivery limit (`x-delivery-limit`).
    pub fn delivery_limit(&self) -> u32 {
        self.delivery_limit
    }

    /// The group's exchange.
    pub fn exchange(&self) -> String {
        format!("{}.{}", self.prefix, self.group)
    }

    /// The group's work queue.
    pub fn work_queue(&self) -> String {
        format!("{}.{}.work", self.prefix, self.group)
    }

    /// The group's parking-lot (dead-letter) queue.
    pub fn parking_queue(&self) -> String {
        format!("{}.{}.parking", self.prefix, self.group)
    }

    /// The queue of delay tier `tier`: `P.G.retry.<tier>`.
    pub fn retry_queue(&self, tier: &RetryTier) -> String {
        format!("{}.{}.retry.{}", self.prefix, self.group, tier.name)
    }

    /// Worker `worker_id`'s own queue, `P.G.worker.<id>`: the broadcast tasks for that worker
    /// (declared by the worker with [`Topology::work_queue_arguments`], durable, so a worker
    /// that restarts under the same id finds the tasks waiting for it).
    pub fn worker_queue(&self, worker_id: &str) -> String {
        format!("{}.{}.worker.{}", self.prefix, self.group, worker_id)
    }

    /// The routing key of worker `worker_id`'s own queue: `worker.<id>`.
    pub fn worker_key(worker_id: &str) -> String {
        format!("{WORKER_KEY_PREFIX}{worker_id}")
    }

    /// A worker's own queue's arguments: the work queue's, and `x-expires`
    /// ([`WORKER_QUEUE_EXPIRES`]): the broker deletes the queue of a worker id unused that
    /// long, so workers with generated ids leave nothing behind for good. A broadcast task
    /// still in it has long ended `lost` by then (the leader's rescuer, after `rescue_after`).
    pub fn worker_queue_arguments(&self) -> QueueArguments {
        let mut arguments = self.work_queue_arguments();
        let expires = u32::try_from(WORKER_QUEUE_EXPIRES.as_millis()).unwrap_or(u32::MAX);
        arguments.push(("x-expires", ArgValue::U32(expires)));
        arguments
    }

    /// The work queue's arguments.
    pub fn work_queue_arguments(&self) -> QueueArguments {
        vec![
            ("x-queue-type", text("quorum")),
            ("x-delivery-limit", ArgValue::U32(self.delivery_limit)),
            ("x-dead-letter-exchange", text(&self.exchange())),
            ("x-dead-letter-routing-key", text(PARKING_KEY)),
            // At-least-once dead-lettering needs reject-publish overflow (RabbitMQ docs, verified
            // on 3.10.8); with the default drop-head it silently falls back to at-most-once.
            ("x-dead-letter-strategy", text("at-least-once")),
            ("x-overflow", text("reject-publish")),
        ]
    }

    /// The parking lot's arguments.
    pub fn parking_queue_arguments(&self) -> QueueArguments {
        vec![("x-queue-type", text("quorum"))]
    }

    /// The arguments of delay tier `tier`'s queue.
    pub fn retry_queue_arguments(&self, tier: &RetryTier) -> QueueArguments {
        // Fits: checked at compile time for every tier (above).
        let ttl = u32::try_from(tier.ttl.as_millis()).unwrap_or(u32::MAX);
        vec![
            ("x-queue-type", text("quorum")),
            ("x-message-ttl", ArgValue::U32(ttl)),
            ("x-dead-letter-exchange", text(&self.exchange())),
            ("x-dead-letter-routing-key", text(WORK_KEY)),
            // As for the work queue: an expired retry must reach the work queue, not vanish.
            ("x-dead-letter-strategy", text("at-least-once")),
            ("x-overflow", text("reject-publish")),
        ]
    }

    /// The queues every group has from the start, with routing key and arguments: work queue
    /// and parking lot.
    pub fn base_queues(&self) -> [(String, String, QueueArguments); 2] {
        [
            (
                self.work_queue(),
                WORK_KEY.to_owned(),
                self.work_queue_arguments(),
            ),
            (
                self.parking_queue(),
                PARKING_KEY.to_owned(),
                self.parking_queue_arguments(),
            ),
        ]
    }

    /// Every queue the group may have, with routing key and arguments: the base queues and all
    /// delay tiers.
    pub fn queues(&self) -> Vec<(String, String, QueueArguments)> {
        let mut queues = self.base_queues().to_vec();
        for tier in &RETRY_TIERS {
            queues.push((
                self.retry_queue(tier),
                tier.routing_key(),
                self.retry_queue_arguments(tier),
            ));
        }
        queues
    }
}

/// The fanout exchange for control messages ([`crate::wire::ControlMessage`]) to every
/// worker under `prefix`: `P.control`. Each worker binds an exclusive, auto-deleted queue to it.
pub fn control_exchange(prefix: &str) -> String {
    format!("{prefix}.control")
}

#[cfg(feature = "amqp")]
impl Topology {
    /// Declares delay tier `tier`'s queue and binds it to the group's exchange (which must
    /// exist: [`Topology::declare`]). Idempotent; cheap enough to call before every delayed
    /// publish, which also repairs a tier queue an operator deleted.
    pub async fn declare_tier(
        &self,
        channel: &Channel,
        tier: &RetryTier,
    ) -> Result<(), lapin::Error> {
        declare_bound(
            channel,
            &self.exchange(),
            &self.retry_queue(tier),
            &tier.routing_key(),
            field_table(self.retry_queue_arguments(tier)),
        )
        .await
    }

    /// Declares worker `worker_id`'s own queue ([`Topology::worker_queue`], durable, with the
    /// work queue's arguments) and binds it to the group's exchange (which must exist:
    /// [`Topology::declare`]) with [`Topology::worker_key`]. Idempotent.
    pub async fn declare_worker_queue(
        &self,
        channel: &Channel,
        worker_id: &str,
    ) -> Result<(), lapin::Error> {
        declare_bound(
            channel,
            &self.exchange(),
            &self.worker_queue(worker_id),
            &Self::worker_key(worker_id),
            field_table(self.worker_queue_arguments()),
        )
        .await
    }

    /// Declares the exchange, the work queue and the parking lot and binds them. Idempotent.
    /// Delay tiers are declared on first use ([`Topology::declare_tier`]).
    pub async fn declare(&self, channel: &Channel) -> Result<(), lapin::Error> {
        let exchange = self.exchange();
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        for (queue, key, args) in self.base_queues() {
            declare_bound(channel, &exchange, &queue, &key, field_table(args)).await?;
        }
        Ok(())
    }

    /// Deletes the group's exchange and queues (tests and `chime` admin cleanup only).
    pub async fn delete(&self, channel: &Channel) -> Result<(), lapin::Error> {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        for (queue, _, _) in self.queues() {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        channel
            .exchange_delete(
                self.exchange().as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
    }
}

/// Declares the control exchange (durable fanout). Idempotent.
#[cfg(feature = "amqp")]
pub async fn declare_control(channel: &Channel, prefix: &str) -> Result<(), lapin::Error> {
    channel
        .exchange_declare(
            control_exchange(prefix).as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// Declares the control exchange and a worker's own queue `queue` on it: exclusive (only this
/// connection may consume it) and auto-deleted (it goes when the worker does), bound to the
/// fanout exchange. Idempotent for the connection that owns it.
#[cfg(feature = "amqp")]
pub async fn declare_control_queue(
    channel: &Channel,
    prefix: &str,
    queue: &str,
) -> Result<(), lapin::Error> {
    declare_control(channel, prefix).await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.into(),
            control_exchange(prefix).as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

/// Declares durable queue `queue` with `args` and binds it to `exchange` with `key`.
#[cfg(feature = "amqp")]
async fn declare_bound(
    channel: &Channel,
    exchange: &str,
    queue: &str,
    key: &str,
    args: FieldTable,
) -> Result<(), lapin::Error> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel.queue_declare(queue.into(), durable, args).await?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

/// Queue arguments as lapin takes them.
#[cfg(feature = "amqp")]
pub fn field_table(args: QueueArguments) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in args {
        let value = match value {
            ArgValue::Text(s) => AMQPValue::LongString(s.into()),
            ArgValue::U32(n) => AMQPValue::LongUInt(n),
        };
        table.insert(name.into(), value);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_per_group() {
        let t = Topology::new("chime", "orders");
        assert_eq!(t.exchange(), "chime.orders");
        assert_eq!(t.work_queue(), "chime.orders.work");
        assert_eq!(t.parking_queue(), "chime.orders.parking");
    }

    fn get(args: &QueueArguments, name: &str) -> Option<ArgValue> {
        args.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn work_queue_has_an_explicit_delivery_limit_and_a_dead_letter_target() {
        let t = Topology::new("p", "g").with_delivery_limit(3);
        let args = t.work_queue_arguments();
        assert_eq!(get(&args, "x-delivery-limit"), Some(ArgValue::U32(3)));
        assert_eq!(get(&args, "x-dead-letter-exchange"), Some(text("p.g")));
        assert_eq!(
            get(&args, "x-dead-letter-routing-key"),
            Some(text(PARKING_KEY))
        );
        assert_eq!(get(&args, "x-queue-type"), Some(text("quorum")));
        assert_eq!(
            get(&args, "x-dead-letter-strategy"),
            Some(text("at-least-once"))
        );
        assert_eq!(get(&args, "x-overflow"), Some(text("reject-publish")));
    }

    #[test]
    fn retry_tiers_are_sorted_and_dead_letter_back_to_work() {
        assert!(RETRY_TIERS.windows(2).all(|w| w[0].ttl < w[1].ttl));
        let t = Topology::new("p", "g");
        let one_second = RETRY_TIERS.iter().find(|t| t.name == "1s").unwrap();
        assert_eq!(t.retry_queue(one_second), "p.g.retry.1s");
        assert_eq!(one_second.routing_key(), "retry.1s");
        let args = t.retry_queue_arguments(one_second);
        assert_eq!(get(&args, "x-message-ttl"), Some(ArgValue::U32(1_000)));
        assert_eq!(get(&args, "x-dead-letter-exchange"), Some(text("p.g")));
        assert_eq!(
            get(&args, "x-dead-letter-routing-key"),
            Some(text(WORK_KEY))
        );
        assert_eq!(get(&args, "x-queue-type"), Some(text("quorum")));
        assert_eq!(t.queues().len(), 2 + RETRY_TIERS.len());
    }

    /// The types docs/protocol.md names (`x-delivery-limit` and `x-message-ttl` unsigned 32-bit
    /// integers, the rest long strings): a declare with another type is a channel error.
    #[cfg(feature = "amqp")]
    #[test]
    fn arguments_reach_the_broker_with_the_documented_types() {
        let t = Topology::new("p", "g");
        let table = field_table(t.work_queue_arguments());
        let get = |k: &str| table.inner().get(k).cloned();
        assert_eq!(get("x-delivery-limit"), Some(AMQPValue::LongUInt(5)));
        assert_eq!(
            get("x-dead-letter-exchange"),
            Some(AMQPValue::LongString("p.g".into()))
        );
        assert_eq!(table.inner().len(), 6);
        let table = field_table(t.retry_queue_arguments(&RETRY_TIERS[12]));
        assert_eq!(
            table.inner().get("x-message-ttl"),
            Some(&AMQPValue::LongUInt(3_600_000))
        );
    }
}
