//! The worker's connection to RabbitMQ and the links it opens on it.
//!
//! Each opening is a [`Link`]: a consumer channel and a confirm-mode channel for parking
//! messages and publishing retries. The consumer channel consumes the group's work queue and
//! the worker's own queue (`P.G.worker.<id>`, its broadcast tasks: durable, with the work
//! queue's arguments, so a worker restarted under the same id finds what waits for it), with
//! the same prefetch each, and the worker's control queue: an exclusive, auto-deleted queue
//! bound to the fanout exchange `P.control`, which carries operators' cancels to every worker. Deliveries keep the `Link` they arrived on,
//! because an ack must go out on the delivery's own channel; acks of a dead channel return
//! `Ok(false)` and the broker redelivers those messages, which the claim then recognises as
//! duplicates.

use std::sync::Arc;

use chime_protocol::addresses::Addresses;
use chime_protocol::redact::redact_url;
use chime_protocol::tls::AmqpTls;
use chime_protocol::topology::{RetryTier, Topology, declare_control_queue};
use chrono::{DateTime, Utc};
use lapin::options::{BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, Consumer};
use tokio_util::sync::CancellationToken;

use super::delay;
use super::inbound::Inbound;
use super::parking;
use super::publish::PublishError;

/// How long one of several broker addresses may take to accept a connection before the next
/// is tried (the scheduler's `CONNECT_TIMEOUT`).
const ADDRESS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One opening of the group's queue: the channels a delivery needs until it is acked.
pub(crate) struct Link {
    /// The channel the consumer (and so every ack) lives on.
    pub(super) consume: Channel,
    /// A confirm-mode channel for publishing to the parking lot.
    pub(super) publish: Channel,
    /// Fired by a delivery task when the publish channel died, so the supervisor reopens.
    pub(super) broken: CancellationToken,
    /// The work queue consumer's tag.
    pub(super) consumer_tag: String,
    /// The worker queue consumer's tag.
    pub(super) own_tag: String,
}

impl Link {
    /// Publishes `body` (a trigger for attempt `attempt`) due at `due` through the delay tier
    /// that fits what remains, confirmed, with `original`'s identity and headers
    /// ([`delay::publish`]); returns the routing key it went to.
    pub(crate) async fn publish_delayed(
        &self,
        topology: &Topology,
        original: &Inbound,
        body: &[u8],
        attempt: u32,
        due: DateTime<Utc>,
    ) -> Result<String, PublishError> {
        let properties = &original.message().properties;
        delay::publish(&self.publish, topology, properties, body, attempt, due).await
    }

    /// Publishes `body` due at `due` through `tier` (the work queue itself when `None`),
    /// whatever remains until then ([`delay::publish_via`]); returns the routing key.
    pub(crate) async fn publish_via(
        &self,
        topology: &Topology,
        original: &Inbound,
        body: &[u8],
        attempt: u32,
        tier: Option<RetryTier>,
        due: DateTime<Utc>,
    ) -> Result<String, PublishError> {
        let properties = &original.message().properties;
        delay::publish_via(
            &self.publish,
            topology,
            properties,
            body,
            attempt,
            tier,
            due,
        )
        .await
    }

    /// Publishes a copy of `delivery` to the group's parking lot with `reason` (and the last
    /// attempt's `error`), confirmed ([`parking::park`]).
    pub(crate) async fn park(
        &self,
        topology: &Topology,
        delivery: &Inbound,
        reason: &str,
        error: Option<&str>,
        worker_id: &str,
    ) -> Result<(), PublishError> {
        parking::park(
            &self.publish,
            topology,
            delivery.message(),
            reason,
            error,
            worker_id,
        )
        .await
    }

    /// Publishes `original` to worker `worker`'s own queue (a broadcast task that reached this
    /// worker through the work queue), confirmed ([`delay::forward`]).
    pub(crate) async fn forward(
        &self,
        topology: &Topology,
        original: &Inbound,
        worker: &str,
    ) -> Result<(), PublishError> {
        delay::forward(&self.publish, topology, original.message(), worker).await
    }

    /// After a publish failed: if the publishing channel is dead, marks the link broken so the
    /// supervisor opens a new one.
    pub(crate) fn publish_failed(&self) {
        if !self.publish.status().connected() {
            self.broken.cancel();
        }
    }
}

/// A link and its three consumers: the work queue's, the worker queue's and the control
/// queue's.
pub(crate) struct Opened {
    pub(super) link: Arc<Link>,
    pub(super) work: Consumer,
    pub(super) own: Consumer,
    pub(super) control: Consumer,
}

/// The worker's connection and the links it opened.
pub(crate) struct Broker {
    urls: Addresses,
    tls: AmqpTls,
    /// The group's queues this worker consumes.
    topology: Topology,
    worker_id: String,
    connection_name: String,
    connection: Option<Connection>,
    generation: u64,
    links: Vec<Arc<Link>>,
}

impl Broker {
    pub(crate) fn new(urls: Addresses, tls: AmqpTls, topology: Topology, worker_id: &str) -> Self {
        Broker {
            urls,
            tls,
            topology,
            worker_id: worker_id.to_owned(),
            connection_name: format!("chime-worker-{worker_id}"),
            connection: None,
            generation: 0,
            links: Vec::new(),
        }
    }

    /// The connection, opened (again) if there is none or the old one is beyond recovery.
    ///
    /// With one address lapin's auto-recovery reconnects to it. With several it is off: a lost
    /// connection ends the consumers, the supervisor reopens, and this connects to the next
    /// address ([`Addresses::connect`], the scheduler's rule too) instead of waiting for a node
    /// that may stay down.
    async fn connection(&mut self) -> Result<&Connection, lapin::Error> {
        let usable = self
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected() || c.status().reconnecting());
        if !usable {
            let several = self.urls.urls().len() > 1;
            let name = self.connection_name.as_str();
            let tls = &self.tls;
            let (url, connection) = self
                .urls
                .connect(|url| {
                    let url = url.to_owned();
                    let mut properties =
                        ConnectionProperties::default().with_connection_name(name.into());
                    if !several {
                        properties = properties.enable_auto_recover();
                    }
                    async move {
                        let connect = chime_protocol::tls::connect(&url, tls, properties);
                        // A node that does not answer (not one that refuses) must not hold up
                        // the next address for the TCP timeout.
                        let connected = if several {
                            tokio::time::timeout(ADDRESS_TIMEOUT, connect)
                                .await
                                .unwrap_or_else(|_| {
                                    Err(lapin::Error::from(std::io::Error::new(
                                        std::io::ErrorKind::TimedOut,
                                        format!("no answer within {ADDRESS_TIMEOUT:?}"),
                                    )))
                                })
                        } else {
                            connect.await
                        };
                        if let Err(error) = &connected
                            && several
                        {
                            tracing::warn!(connection = name, url = %redact_url(&url), %error, "broker address unreachable; trying the next");
                        }
                        connected
                    }
                })
                .await?;
            tracing::info!(connection = %self.connection_name, url = %redact_url(&url), "connected to RabbitMQ");
            self.connection = Some(connection);
        }
        Ok(self.connection.as_ref().expect("set above"))
    }

    /// Opens channels, declares the topology, sets the prefetch and starts consuming.
    pub(crate) async fn open(&mut self, capacity: u16) -> Result<Opened, lapin::Error> {
        self.generation += 1;
        let consumer_tag = format!("{}-{}", self.connection_name, self.generation);
        let control_queue = format!(
            "{}.control.{}.{}",
            self.topology.prefix(),
            self.worker_id,
            self.generation
        );
        let connection = self.connection().await?;
        let consume = connection.create_channel().await?;
        let publish = match connection.create_channel().await {
            Ok(publish) => publish,
            Err(error) => {
                close_channel(&consume).await;
                return Err(error);
            }
        };
        let topology = &self.topology;
        let worker_id = self.worker_id.as_str();
        let own_tag = format!("{consumer_tag}-own");
        let setup = async {
            topology.declare(&consume).await?;
            topology.declare_worker_queue(&consume, worker_id).await?;
            // Per-consumer prefetch (global=false): global QoS is a channel error on quorum
            // queues.
            consume
                .basic_qos(capacity, BasicQosOptions { global: false })
                .await?;
            publish
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            declare_control_queue(&consume, topology.prefix(), &control_queue).await?;
            // Control messages are hints (a missed cancel leaves the run to finish or time out),
            // so they need no acks.
            let control = consume
                .basic_consume(
                    control_queue.as_str().into(),
                    format!("{consumer_tag}-control").as_str().into(),
                    BasicConsumeOptions {
                        no_ack: true,
                        exclusive: true,
                        ..BasicConsumeOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            let work = consume
                .basic_consume(
                    topology.work_queue().as_str().into(),
                    consumer_tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            // The same delivery path as the work queue's, the same handler slots; its own
            // prefetch (QoS is per consumer).
            let own = consume
                .basic_consume(
                    topology.worker_queue(worker_id).as_str().into(),
                    own_tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((work, own, control))
        };
        let (work, own, control) = match setup.await {
            Ok(consumers) => consumers,
            Err(error) => {
                // Do not leak a channel per failed attempt.
                close_channel(&consume).await;
                close_channel(&publish).await;
                return Err(error);
            }
        };
        let link = Arc::new(Link {
            consume,
            publish,
            broken: CancellationToken::new(),
            consumer_tag,
            own_tag,
        });
        // Links no delivery holds any more can go; close their channels.
        let (keep, done): (Vec<_>, Vec<_>) = std::mem::take(&mut self.links)
            .into_iter()
            .partition(|l| Arc::strong_count(l) > 1);
        self.links = keep;
        for old in done {
            close_link(&old).await;
        }
        self.links.push(link.clone());
        tracing::info!(
            queue = %topology.work_queue(),
            worker_queue = %topology.worker_queue(&self.worker_id),
            control_queue = %control_queue,
            consumer = %link.consumer_tag,
            prefetch = capacity,
            "consuming"
        );
        Ok(Opened {
            link,
            work,
            own,
            control,
        })
    }

    /// Closes every channel and the connection. The worker's own queue stays, with whatever
    /// waits in it, for the worker started again under the same id.
    pub(crate) async fn close(&mut self) {
        for link in std::mem::take(&mut self.links) {
            close_link(&link).await;
        }
        if let Some(connection) = self.connection.take()
            && connection.status().connected()
            && let Err(error) = connection.close(200, "worker stopped".into()).await
        {
            tracing::debug!(%error, "closing the AMQP connection");
        }
    }
}

async fn close_link(link: &Link) {
    close_channel(&link.consume).await;
    close_channel(&link.publish).await;
}

async fn close_channel(channel: &Channel) {
    if channel.status().connected()
        && let Err(error) = channel.close(200, "OK".into()).await
    {
        tracing::debug!(%error, "closing an AMQP channel");
    }
}
