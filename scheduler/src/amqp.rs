//! The scheduler's one AMQP adapter: connections (with their TLS options), channels, publisher
//! confirms with `mandatory`, topology declares, passive declares and the parking-lot drain's
//! `basic.get`. Every other module reaches the broker through this one ([`crate::publish`] the
//! triggers, [`crate::broker`] the operations' shared connection and control messages,
//! [`crate::parking`] the drain and purges); a test (`tests/layering.rs`) fails if another
//! module names the AMQP client.
//!
//! **Invariants.** A connection opens within [`CONNECT_TIMEOUT`] or not at all, through
//! `chime_protocol::tls::connect` (so `amqps://` is TLS or nothing). Every publish is `mandatory`,
//! persistent, and reports its broker confirm as [`Confirmed`]: an unroutable message comes back
//! as [`Confirmed::Returned`], never as a plain ack. A passive declare creates nothing.
//!
//! The AMQP data model a reader of headers needs (field values and tables, message properties,
//! a fetched delivery) is the client's own, re-exported here under its names.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use chime_protocol::Topology;
use chime_protocol::addresses::Addresses;
use chime_protocol::redact::redact_url;
use chime_protocol::tls::AmqpTls;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::{Confirmation, ConnectionProperties, PublisherConfirm};

pub use lapin::BasicProperties;
pub use lapin::message::Delivery;
pub use lapin::types::{AMQPValue, FieldArray, FieldTable};

/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The logging directive that keeps the AMQP client's own logs to warnings (the binary's
/// default filter).
pub const QUIET_CLIENT_LOGS: &str = "lapin=warn";

/// An error of the broker or the connection to it.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(#[from] lapin::Error);

/// Why a connection did not open.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The broker refused or the connection failed (TLS included).
    #[error("connecting to RabbitMQ at {url}")]
    Failed {
        /// The URL without its password.
        url: String,
        /// The cause.
        #[source]
        source: Error,
    },
    /// The broker did not complete the handshake within [`CONNECT_TIMEOUT`].
    #[error("broker at {url} did not answer within {after:?}")]
    TimedOut {
        /// The URL without its password.
        url: String,
        /// The time waited.
        after: Duration,
    },
}

/// What an AMQP URL names, as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlParts {
    /// The virtual host.
    pub vhost: String,
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

/// Parses an AMQP URL as the client will; the error is the parser's message, which never
/// quotes the URL.
pub fn parse_url(url: &str) -> Result<UrlParts, String> {
    let uri = url.parse::<lapin::uri::AMQPUri>()?;
    Ok(UrlParts {
        vhost: uri.vhost,
        user: uri.authority.userinfo.username,
        password: uri.authority.userinfo.password,
    })
}

/// A connection to the broker.
pub struct Connection {
    inner: lapin::Connection,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Opens a connection to `url` (TLS options `tls`) named `name` in the broker's connection
    /// list, waiting at most [`CONNECT_TIMEOUT`].
    pub async fn open(url: &str, tls: &AmqpTls, name: &str) -> Result<Connection, ConnectError> {
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            chime_protocol::tls::connect(url, tls, properties),
        )
        .await
        {
            Ok(Ok(inner)) => Ok(Connection { inner }),
            Ok(Err(source)) => Err(ConnectError::Failed {
                url: redact_url(url),
                source: Error(source),
            }),
            Err(_) => Err(ConnectError::TimedOut {
                url: redact_url(url),
                after: CONNECT_TIMEOUT,
            }),
        }
    }

    /// Opens a connection (as [`Connection::open`]) to the first of `addresses` that accepts,
    /// starting after the address of its last connection ([`Addresses::connect`], the rule the
    /// workers connect by too); a refused address is logged and the next one tried. The error
    /// is the last address's.
    pub async fn open_first(
        addresses: &Addresses,
        tls: &AmqpTls,
        name: &str,
    ) -> Result<Connection, ConnectError> {
        let several = addresses.urls().len() > 1;
        let (url, connection) = addresses
            .connect(|url| {
                let url = url.to_owned();
                async move {
                    let opened = Connection::open(&url, tls, name).await;
                    if let Err(error) = &opened
                        && several
                    {
                        tracing::warn!(connection = name, error = %chain(error), "broker address unreachable; trying the next");
                    }
                    opened
                }
            })
            .await?;
        if several {
            tracing::debug!(connection = name, url = %redact_url(&url), "connected to a broker address");
        }
        Ok(connection)
    }

    /// Whether the connection is still open.
    pub fn is_connected(&self) -> bool {
        self.inner.status().connected()
    }

    /// Opens a channel.
    pub async fn channel(&self) -> Result<Channel, Error> {
        Ok(Channel {
            inner: self.inner.create_channel().await?,
        })
    }

    /// Closes the connection (reply code 200, `reason`).
    pub async fn close(&self, reason: &str) -> Result<(), Error> {
        Ok(self.inner.close(200, reason.into()).await?)
    }
}

/// `error` and its sources, `: `-separated (as anyhow's `{:#}`).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether the broker at `url` (TLS options `tls`) accepts a connection: one is opened (named
/// `name`) and closed again.
pub async fn ping(url: &str, tls: &AmqpTls, name: &str) -> Result<(), ConnectError> {
    let connection = Connection::open(url, tls, name).await?;
    let _ = connection.close("done").await;
    Ok(())
}

/// A queue's counts, from a passive declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCounts {
    /// Messages ready for delivery.
    pub messages: u32,
    /// Consumers.
    pub consumers: u32,
}

/// What a publish sends: always persistent and `mandatory`.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<'a> {
    /// The body.
    pub body: &'a [u8],
    /// The `content-type` property.
    pub content_type: &'static str,
    /// The `message-id` property.
    pub message_id: Option<String>,
    /// The `timestamp` property (Unix seconds).
    pub timestamp: Option<u64>,
    /// Headers, written with `chime_protocol::headers`' codec; none: no header table.
    pub headers: Option<FieldTable>,
}

/// A [`Message`] in the client's terms, ready to publish ([`Message::prepare`]).
pub struct Prepared<'a> {
    body: &'a [u8],
    properties: BasicProperties,
}

impl<'a> Message<'a> {
    /// The message in the client's terms: built before a publish, so a caller that publishes
    /// under a lock does not build it while holding the lock.
    pub fn prepare(mut self) -> Prepared<'a> {
        Prepared {
            body: self.body,
            properties: self.properties(),
        }
    }

    /// The AMQP properties; the message id moves into them.
    fn properties(&mut self) -> BasicProperties {
        let mut properties = BasicProperties::default()
            .with_content_type(self.content_type.into())
            .with_delivery_mode(2);
        if let Some(id) = self.message_id.take() {
            properties = properties.with_message_id(id.into());
        }
        if let Some(timestamp) = self.timestamp {
            properties = properties.with_timestamp(timestamp);
        }
        if let Some(headers) = self.headers.take() {
            properties = properties.with_headers(headers);
        }
        properties
    }
}

/// How the broker answered a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmed {
    /// Taken: routed to at least one queue.
    Ack,
    /// Unroutable (no queue bound for the routing key): returned, then acked.
    Returned {
        /// AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// AMQP reply text.
        text: String,
    },
    /// Refused (for example a full queue with reject-publish).
    Nack,
}

/// The broker's confirm of one publish, still to come.
pub struct Confirm {
    inner: PublisherConfirm,
}

impl Future for Confirm {
    type Output = Result<Confirmed, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx).map(|result| {
            Ok(match result? {
                Confirmation::Ack(None) => Confirmed::Ack,
                Confirmation::Ack(Some(returned)) => Confirmed::Returned {
                    code: returned.reply_code,
                    text: returned.reply_text.to_string(),
                },
                Confirmation::Nack(_) => Confirmed::Nack,
                Confirmation::NotRequested => {
                    unreachable!("publishes go on channels in confirm mode")
                }
            })
        })
    }
}

/// A channel on a [`Connection`].
pub struct Channel {
    inner: lapin::Channel,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// Whether the channel is still open.
    pub fn is_connected(&self) -> bool {
        self.inner.status().connected()
    }

    /// Puts the channel in confirm mode: every publish on it gets a [`Confirm`].
    pub async fn enable_confirms(&self) -> Result<(), Error> {
        Ok(self
            .inner
            .confirm_select(ConfirmSelectOptions::default())
            .await?)
    }

    /// Closes the channel (reply code 200, `reason`), ignoring a failure (a broken channel
    /// is closed already).
    pub async fn close(&self, reason: &str) {
        let _ = self.inner.close(200, reason.into()).await;
    }

    /// Declares the topology of `group` under `prefix` (idempotent).
    pub async fn declare_group(&self, prefix: &str, group: &str) -> Result<(), Error> {
        Ok(Topology::new(prefix, group).declare(&self.inner).await?)
    }

    /// Declares the fanout exchange of control messages under `prefix` (idempotent).
    pub async fn declare_control(&self, prefix: &str) -> Result<(), Error> {
        Ok(chime_protocol::topology::declare_control(&self.inner, prefix).await?)
    }

    /// Publishes `message` to `exchange` with `routing_key`, `mandatory`; the channel must be
    /// in confirm mode ([`Channel::enable_confirms`]). Returns once sent; the confirm follows.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Prepared<'_>,
    ) -> Result<Confirm, Error> {
        let inner = self
            .inner
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                message.body,
                message.properties,
            )
            .await?;
        Ok(Confirm { inner })
    }

    /// A queue's counts from a passive declare, which creates nothing. A missing queue is an
    /// error, and the broker closes the channel.
    pub async fn passive_declare(&self, queue: &str) -> Result<QueueCounts, Error> {
        let declared = self
            .inner
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(QueueCounts {
            messages: declared.message_count(),
            consumers: declared.consumer_count(),
        })
    }

    /// Takes the next message of `queue`, to be acknowledged ([`Channel::ack_through`]);
    /// `None` when the queue is empty.
    pub async fn get(&self, queue: &str) -> Result<Option<Delivery>, Error> {
        let got = self
            .inner
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?;
        Ok(got.map(|message| message.delivery))
    }

    /// Acknowledges every message taken on this channel up to the delivery tag `tag`.
    pub async fn ack_through(&self, tag: u64) -> Result<(), Error> {
        Ok(self
            .inner
            .basic_ack(tag, BasicAckOptions { multiple: true })
            .await?)
    }

    /// Empties `queue`; returns how many messages it removed.
    pub async fn purge(&self, queue: &str) -> Result<u32, Error> {
        Ok(self
            .inner
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_headers_and_is_persistent() {
        let mut message = Message {
            body: b"{}",
            content_type: "application/json",
            message_id: Some("42".into()),
            timestamp: Some(1_800_000_000),
            headers: Some({
                let mut table = FieldTable::default();
                table.insert("x-a".into(), AMQPValue::LongUInt(3));
                table.insert("x-b".into(), AMQPValue::LongLongInt(-7));
                table
            }),
        };
        let properties = message.properties();
        assert_eq!(properties.delivery_mode(), &Some(2));
        assert_eq!(
            properties.content_type().as_ref().map(|t| t.as_str()),
            Some("application/json")
        );
        assert_eq!(
            properties.message_id().as_ref().map(|t| t.as_str()),
            Some("42")
        );
        assert_eq!(properties.timestamp(), &Some(1_800_000_000));
        let headers = properties.headers().clone().expect("headers");
        assert_eq!(headers.inner().get("x-a"), Some(&AMQPValue::LongUInt(3)));
        assert_eq!(
            headers.inner().get("x-b"),
            Some(&AMQPValue::LongLongInt(-7))
        );
        // No headers: no header table at all (a control message carries none).
        let mut bare = Message {
            headers: None,
            message_id: None,
            timestamp: None,
            ..message
        };
        let properties = bare.properties();
        assert_eq!(properties.headers(), &None);
        assert_eq!(properties.message_id(), &None);
        assert_eq!(properties.delivery_mode(), &Some(2));
    }

    #[test]
    fn urls_are_read_as_the_client_reads_them() {
        let parts = parse_url("amqp://chime:s%40cret@rabbit:5672/%2f").expect("valid");
        assert_eq!(
            parts,
            UrlParts {
                vhost: "/".into(),
                user: "chime".into(),
                password: "s@cret".into()
            }
        );
        assert!(parse_url("amqp://host:notaport").is_err());
    }
    /// A port nothing listens on (bound, then released).
    fn dead_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }

    /// Against the shared broker: with a dead address first, the connection goes to the second;
    /// the next connection (as after losing that one) starts at the address after it, so it
    /// goes to the third, and from there wraps around past the dead one to the second again.
    #[tokio::test]
    async fn connects_to_the_first_reachable_address_and_after_a_loss_to_the_next() {
        let dead = format!("amqp://guest:guest@127.0.0.1:{}/%2f", dead_port());
        let second = crate::config::DEFAULT_AMQP_URL.to_owned();
        let third = "amqp://guest:guest@localhost:5672/%2f".to_owned();
        let addresses =
            Addresses::new(vec![dead.clone(), second.clone(), third.clone()]).expect("three");
        let tls = AmqpTls::default();
        let name = format!("chime-test-fallback-{}", std::process::id());
        let tried = std::sync::Mutex::new(Vec::new());
        let open = |url: &str| {
            tried.lock().unwrap().push(url.to_owned());
            let url = url.to_owned();
            let (tls, name) = (&tls, name.as_str());
            async move { Connection::open(&url, tls, name).await }
        };

        let (url, first) = addresses.connect(open).await.expect("the second address");
        assert_eq!(url, second);
        assert!(first.is_connected());
        assert_eq!(*tried.lock().unwrap(), [dead.clone(), second.clone()]);
        first.close("lost").await.expect("close");

        tried.lock().unwrap().clear();
        let (url, next) = addresses.connect(open).await.expect("the third address");
        assert_eq!(url, third);
        next.close("lost").await.expect("close");
        let (url, again) = addresses.connect(open).await.expect("the second again");
        assert_eq!(url, second);
        assert_eq!(*tried.lock().unwrap(), [third, dead.clone(), second]);
        again.close("done").await.expect("close");

        // The scheduler's own entry point follows the same rule, and fails with the last
        // address's error when none answers.
        let connection = Connection::open_first(&addresses, &tls, &name)
            .await
            .expect("a reachable address");
        connection.close("done").await.expect("close");
        let only_dead = Addresses::new(vec![dead.clone(), dead]).expect("two");
        let error = Connection::open_first(&only_dead, &tls, &name)
            .await
            .expect_err("nothing answers");
        assert!(
            error
                .to_string()
                .starts_with("connecting to RabbitMQ at amqp://guest:***@127.0.0.1:"),
            "{error}"
        );
    }
}
