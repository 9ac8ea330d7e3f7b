//! RabbitMQ topology of one executor group, declared idempotently by the scheduler and by workers.
//!
//! Per group `G` under a name prefix `P` (default `chime`):
//!
//! | object | name | notes |
//! |---|---|---|
//! | exchange | `P.G` | direct, durable; every message of the group goes through it |
//! | work queue | `P.G.work` | quorum, bound with key `work`; explicit `x-delivery-limit`; dead-letters to `P.G` with key `parking` (at-least-once) |
//! | parking lot | `P.G.parking` | quorum, bound with key `parking`; runs that cannot go on wait here for an operator |
//!
//! Retry delay tiers (`P.G.retry.<tier>`, fixed TTL each, dead-lettering back with key `work`)
//! join this table with the failure-handling work; the exchange and routing keys leave room for
//! them. Declaring the same topology twice with the same arguments is a no-op in RabbitMQ, and
//! declaring it with different arguments is a channel error, so every argument lives here, once.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

/// Routing key of the work queue.
pub const WORK_KEY: &str = "work";
/// Routing key of the parking-lot queue.
pub const PARKING_KEY: &str = "parking";
/// Default name prefix of every exchange and queue Chime declares.
pub const DEFAULT_PREFIX: &str = "chime";
/// Default quorum delivery limit: how many times a message may be handed out (crash loops,
/// requeues) before RabbitMQ dead-letters it to the parking lot. RabbitMQ 3.10 has no default.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 5;

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

    fn work_queue_arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), string("quorum"));
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongUInt(self.delivery_limit),
        );
        args.insert("x-dead-letter-exchange".into(), string(&self.exchange()));
        args.insert("x-dead-letter-routing-key".into(), string(PARKING_KEY));
        // At-least-once dead-lettering needs reject-publish overflow (RabbitMQ docs, verified on 3.10.8);
        // with the default drop-head it silently falls back to at-most-once.
        args.insert("x-dead-letter-strategy".into(), string("at-least-once"));
        args.insert("x-overflow".into(), string("reject-publish"));
        args
    }

    fn parking_queue_arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), string("quorum"));
        args
    }

    /// Declares the exchange and queues and binds them. Idempotent.
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
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        for (queue, key, args) in [
            (self.work_queue(), WORK_KEY, self.work_queue_arguments()),
            (
                self.parking_queue(),
                PARKING_KEY,
                self.parking_queue_arguments(),
            ),
        ] {
            channel
                .queue_declare(queue.as_str().into(), durable, args)
                .await?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// Deletes the group's exchange and queues (tests and `chime` admin cleanup only).
    pub async fn delete(&self, channel: &Channel) -> Result<(), lapin::Error> {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        for queue in [self.work_queue(), self.parking_queue()] {
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

/// The fanout exchange for control messages ([`crate::protocol::ControlMessage`]) to every
/// worker under `prefix`: `P.control`. Each worker binds an exclusive, auto-deleted queue to it.
pub fn control_exchange(prefix: &str) -> String {
    format!("{prefix}.control")
}

/// Declares the control exchange (durable fanout). Idempotent.
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

fn string(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
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

    #[test]
    fn work_queue_has_an_explicit_delivery_limit_and_a_dead_letter_target() {
        let t = Topology::new("p", "g").with_delivery_limit(3);
        let args = t.work_queue_arguments();
        let get = |k: &str| args.inner().get(k).cloned();
        assert_eq!(get("x-delivery-limit"), Some(AMQPValue::LongUInt(3)));
        assert_eq!(get("x-dead-letter-exchange"), Some(string("p.g")));
        assert_eq!(get("x-dead-letter-routing-key"), Some(string(PARKING_KEY)));
        assert_eq!(get("x-queue-type"), Some(string("quorum")));
    }
}
