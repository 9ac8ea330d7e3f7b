//! The broker as the operations surface and the leader's control messages see it: where it is
//! ([`Broker`]), the one AMQP connection they share (through the [`crate::amqp`] adapter),
//! control messages to the workers ([`Broker::publish_control`]), and each queue's figures, read from RabbitMQ's
//! management HTTP API when `management_url` is set and answers, else from passive queue
//! declares (which create nothing).
//!
//! **The shared connection.** Every clone of a [`Broker`] shares one AMQP connection, opened on
//! first use and reopened on the next use after it closed or broke: queue figures, dead-letter
//! listing, replay and purge, and the control messages of cancel and of the `replace` policy
//! each open a channel on it (cheap)
//! instead of a connection (a TCP and AMQP handshake, and a connection the broker tracks). A
//! read that finds the connection broken after the fact (so its figures cannot be trusted) is
//! retried once on a new one; a change (replay, purge, cancel) is not, it fails and the next
//! call reconnects.
//!
//! The management API gives what a passive declare cannot: unacknowledged messages and message
//! rates. Its figures are the broker's statistics, sampled every `collect_statistics_interval`
//! (5 s by default), so they may lag by that much; a passive declare is exact at the moment it
//! runs. Any failure of the management API (refused, slow, unauthorized, incomplete) falls back
//! to passive declares, and the answer says which source it used and why it fell back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use chime_protocol::addresses::Addresses;
use chime_protocol::wire::ControlMessage;
use serde::{Deserialize, Serialize};

use crate::amqp::{self, Confirmed, Connection};
use crate::parking::ParkingLot;
use chime_protocol::redact::redact_url as redact;
use chime_protocol::tls::AmqpTls;

/// Longest wait for the broker's confirm of a control message.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// How a control message fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlDelivery {
    /// The broker confirmed it into at least one worker's control queue.
    Delivered,
    /// No worker is listening (no queue is bound to the control exchange): no worker of this
    /// prefix is running.
    NoListener,
}

/// Longest a management API request may take before passive declares are used instead.
pub const MANAGEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the broker is, for the operations that talk to it (cancel, dead letters, queues,
/// metrics). `Debug` hides the password.
#[derive(Clone)]
pub struct Broker {
    /// The broker addresses, tried in order ([`Connection::open_first`]).
    pub amqp_urls: Addresses,
    /// TLS options of an `amqps://` URL.
    pub amqp_tls: AmqpTls,
    /// Queue and exchange name prefix.
    pub queue_prefix: String,
    management: Option<Arc<Result<Management, String>>>,
    link: Arc<SharedLink>,
}

/// The shared connection, its name, and how many connections were opened (tests and logs).
struct SharedLink {
    name: String,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    opened: AtomicU64,
}

/// Numbers the [`Broker`]s of this process, for their connections' names.
static BROKERS: AtomicU64 = AtomicU64::new(0);

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("amqp_urls", &self.amqp_urls)
            .field("amqp_tls", &self.amqp_tls)
            .field("queue_prefix", &self.queue_prefix)
            .field(
                "management_url",
                &self
                    .management
                    .as_deref()
                    .map(|m| m.as_ref().map(|m| m.base.to_string())),
            )
            .finish()
    }
}

impl Broker {
    /// The broker at `amqp_urls` (one URL or several [`Addresses`]), with names under
    /// `queue_prefix`; queue figures come from passive declares until
    /// [`Broker::with_management_url`] names a management API.
    pub fn new(amqp_urls: impl Into<Addresses>, queue_prefix: impl Into<String>) -> Broker {
        Broker {
            amqp_urls: amqp_urls.into(),
            amqp_tls: AmqpTls::default(),
            queue_prefix: queue_prefix.into(),
            management: None,
            link: Arc::new(SharedLink {
                name: format!(
                    "chime-ops-{}-{}",
                    std::process::id(),
                    BROKERS.fetch_add(1, Ordering::Relaxed) + 1
                ),
                connection: tokio::sync::Mutex::new(None),
                opened: AtomicU64::new(0),
            }),
        }
    }

    /// The name of the shared connection in the broker's connection list:
    /// `chime-ops-PID-N`, N numbering the `Broker`s of the process (clones share it).
    pub fn connection_name(&self) -> &str {
        &self.link.name
    }

    /// The shared connection: the open one, or a new one if there is none or it closed or
    /// broke.
    pub async fn connection(&self) -> anyhow::Result<Arc<Connection>> {
        let mut slot = self.link.connection.lock().await;
        if let Some(connection) = slot.as_ref()
            && connection.is_connected()
        {
            return Ok(connection.clone());
        }
        *slot = None;
        let connection = Arc::new(
            Connection::open_first(&self.amqp_urls, &self.amqp_tls, &self.link.name).await?,
        );
        let opened = self.link.opened.fetch_add(1, Ordering::Relaxed) + 1;
        if opened > 1 {
            tracing::info!(urls = %self.amqp_urls.redacted(), opened, "operations reconnected to the broker");
        }
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// How many connections the shared slot has opened so far (1 while the first one lasts).
    pub fn connections_opened(&self) -> u64 {
        self.link.opened.load(Ordering::Relaxed)
    }

    /// Parking-lot operations on the shared connection.
    pub async fn parking_lot(&self) -> anyhow::Result<ParkingLot> {
        Ok(ParkingLot::on(self.connection().await?, &self.queue_prefix))
    }

    /// Closes the shared connection (shutdown); a later use opens a new one.
    pub async fn close(&self) {
        if let Some(connection) = self.link.connection.lock().await.take()
            && connection.is_connected()
        {
            let _ = connection.close("done").await;
        }
    }

    /// Publishes a control message to every worker under the prefix (fanout exchange
    /// `P.control`, declared if needed) on a channel of the shared connection, and waits for
    /// the broker's confirm: the one way the scheduler sends control messages (an operator's
    /// cancel, the `replace` policy).
    pub async fn publish_control(
        &self,
        message: &ControlMessage,
    ) -> anyhow::Result<ControlDelivery> {
        let connection = self.connection().await?;
        let channel = connection.channel().await.context("opening a channel")?;
        let published = async {
            let sent = async {
                channel.enable_confirms().await?;
                channel.declare_control(&self.queue_prefix).await?;
                let exchange = chime_protocol::topology::control_exchange(&self.queue_prefix);
                let body = serde_json::to_vec(message).expect("a ControlMessage always serialises");
                channel
                    .publish(
                        &exchange,
                        "",
                        amqp::Message {
                            body: &body,
                            content_type: chime_protocol::wire::CONTENT_TYPE,
                            message_id: None,
                            timestamp: None,
                            headers: None,
                        }
                        .prepare(),
                    )
                    .await
            }
            .await
            .context("publishing the control message")?;
            tokio::time::timeout(CONFIRM_TIMEOUT, sent)
                .await
                .map_err(|_| anyhow::anyhow!("no publisher confirm within {CONFIRM_TIMEOUT:?}"))?
                .context("waiting for the broker's confirm")
        }
        .await;
        if channel.is_connected() {
            channel.close("done").await;
        }
        match published? {
            Confirmed::Ack => Ok(ControlDelivery::Delivered),
            Confirmed::Returned { .. } => Ok(ControlDelivery::NoListener),
            Confirmed::Nack => anyhow::bail!("the broker nacked the control message"),
        }
    }

    /// Connects with the TLS options `tls` (an `amqps://` URL's CA file and client
    /// certificate); default none. Set it before the first use: the shared connection is
    /// opened with the options of the first call.
    pub fn with_amqp_tls(mut self, tls: AmqpTls) -> Broker {
        self.amqp_tls = tls;
        self
    }

    /// Reads queue figures from the management HTTP API at `url` (such as
    /// `http://127.0.0.1:15672`), as the AMQP URL's user, in its virtual host; `None` keeps
    /// passive declares.
    pub fn with_management_url(mut self, url: Option<&str>) -> Broker {
        self.management = url.map(|url| {
            Arc::new(Management::new(url, self.amqp_urls.first()).map_err(|e| format!("{e:#}")))
        });
        self
    }

    /// Figures of the queues named `names` (those that exist), from the management API when
    /// configured and it answers, else from passive declares. Fails only if neither source can
    /// be read.
    pub async fn queue_figures(&self, names: &[String]) -> anyhow::Result<QueueFigures> {
        let mut management_error = None;
        if let Some(management) = self.management.as_deref() {
            let read = match management {
                Ok(management) => management.queues(names).await,
                Err(e) => Err(anyhow::anyhow!("{e}")),
            };
            match read {
                Ok(queues) => {
                    return Ok(QueueFigures {
                        source: QueueSource::Management,
                        management_error: None,
                        queues,
                    });
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    tracing::debug!(error = %e, "management API failed; using passive declares");
                    management_error = Some(e);
                }
            }
        }
        // A queue that cannot be inspected counts as missing, which a broken connection would
        // fake for every queue: if the connection broke meanwhile, read again on a new one.
        let mut queues = HashMap::new();
        for attempt in 1.. {
            let lot = self.parking_lot().await?;
            queues.clear();
            for name in names {
                if let Some((ready, consumers)) = lot.inspect(name).await {
                    queues.insert(
                        name.clone(),
                        QueueFigure {
                            ready,
                            consumers,
                            ..QueueFigure::default()
                        },
                    );
                }
            }
            if lot.connected() {
                break;
            }
            if attempt == 2 {
                anyhow::bail!("the connection to the broker broke while reading queue figures");
            }
        }
        Ok(QueueFigures {
            source: QueueSource::PassiveDeclare,
            management_error,
            queues,
        })
    }
}

/// Where queue figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueSource {
    /// RabbitMQ's management HTTP API (sampled statistics, with unacked counts and rates).
    Management,
    /// Passive queue declares over AMQP (exact ready and consumer counts, nothing else).
    PassiveDeclare,
}

impl QueueSource {
    /// The name used in answers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueSource::Management => "management",
            QueueSource::PassiveDeclare => "passive_declare",
        }
    }
}

/// One queue's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueFigure {
    /// Messages ready for delivery.
    pub ready: u32,
    /// Consumers.
    pub consumers: u32,
    /// Messages delivered and not yet acknowledged (management API only).
    pub unacked: Option<u32>,
    /// Messages published into the queue per second, over the broker's last sample interval
    /// (management API only).
    pub publish_rate: Option<f64>,
    /// Messages delivered to consumers (or fetched) per second (management API only).
    pub deliver_rate: Option<f64>,
}

/// Figures of the queues that exist, and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueFigures {
    /// The source used.
    pub source: QueueSource,
    /// Why the management API was not used, when it is configured but failed.
    pub management_error: Option<String>,
    /// By queue name; queues that do not exist are left out.
    pub queues: HashMap<String, QueueFigure>,
}

/// A client of the management API's queue listing for one virtual host.
struct Management {
    base: reqwest::Url,
    queues_url: reqwest::Url,
    user: String,
    password: String,
    client: reqwest::Client,
}

/// The columns asked of `GET /api/queues/{vhost}`: enough for [`QueueFigure`], no more.
const COLUMNS: &str = "name,messages_ready,messages_unacknowledged,consumers,\
                       message_stats.publish_details.rate,message_stats.deliver_get_details.rate";

impl Management {
    fn new(url: &str, amqp_url: &str) -> anyhow::Result<Management> {
        let base = reqwest::Url::parse(url)
            .with_context(|| format!("management_url {url:?} is not a URL"))?;
        let amqp = amqp::parse_url(amqp_url)
            .map_err(|e| anyhow::anyhow!("amqp_url {}: {e}", redact(amqp_url)))?;
        let mut queues_url = base.clone();
        queues_url
            .path_segments_mut()
            .map_err(|()| anyhow::anyhow!("management_url {url:?} cannot have a path"))?
            .pop_if_empty()
            .extend(["api", "queues", amqp.vhost.as_str()]);
        queues_url.set_query(Some(&format!("columns={COLUMNS}")));
        let client = reqwest::Client::builder()
            .timeout(MANAGEMENT_TIMEOUT)
            .connect_timeout(MANAGEMENT_TIMEOUT)
            .user_agent(concat!("chime/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("building the management API client")?;
        Ok(Management {
            base,
            queues_url,
            user: amqp.user,
            password: amqp.password,
            client,
        })
    }

    async fn queues(&self, names: &[String]) -> anyhow::Result<HashMap<String, QueueFigure>> {
        let response = self
            .client
            .get(self.queues_url.clone())
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    anyhow::anyhow!(
                        "management API at {} did not answer within {MANAGEMENT_TIMEOUT:?}",
                        self.base
                    )
                } else {
                    anyhow::anyhow!("management API at {}: {e}", self.base)
                }
            })?;
        let status = response.status();
        if !status.is_success() {
            anyhow::bail!(
                "management API at {} answered {status} for {}",
                self.base,
                self.queues_url.path()
            );
        }
        let body = response
            .text()
            .await
            .with_context(|| format!("reading the management API's answer from {}", self.base))?;
        figures_from_listing(&body, names)
    }
}

/// One queue of a `GET /api/queues/{vhost}?columns=…` answer.
#[derive(Debug, Deserialize)]
struct ListedQueue {
    name: String,
    messages_ready: Option<u32>,
    messages_unacknowledged: Option<u32>,
    consumers: Option<u32>,
    #[serde(default)]
    message_stats: MessageStats,
}

#[derive(Debug, Default, Deserialize)]
struct MessageStats {
    publish_details: Option<Rate>,
    deliver_get_details: Option<Rate>,
}

#[derive(Debug, Deserialize)]
struct Rate {
    rate: f64,
}

/// The figures of the queues in `names` from a management API queue listing. A listed queue
/// without message counts (its statistics are not collected yet, as for a queue declared a
/// moment ago) makes the listing unusable: the caller falls back to passive declares. Rates
/// missing from a queue's `message_stats` mean no such traffic: 0.
fn figures_from_listing(
    body: &str,
    names: &[String],
) -> anyhow::Result<HashMap<String, QueueFigure>> {
    let listed: Vec<ListedQueue> = serde_json::from_str(body)
        .context("the management API's queue listing is not as expected")?;
    let mut figures = HashMap::new();
    for queue in listed {
        if !names.contains(&queue.name) {
            continue;
        }
        let (Some(ready), Some(consumers)) = (queue.messages_ready, queue.consumers) else {
            anyhow::bail!(
                "the management API has no statistics for queue {} yet",
                queue.name
            );
        };
        let rate = |r: Option<Rate>| Some(r.map_or(0.0, |r| r.rate));
        figures.insert(
            queue.name,
            QueueFigure {
                ready,
                consumers,
                unacked: Some(queue.messages_unacknowledged.unwrap_or(0)),
                publish_rate: rate(queue.message_stats.publish_details),
                deliver_rate: rate(queue.message_stats.deliver_get_details),
            },
        );
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of RabbitMQ 3.10.8's management plugin to `GET /api/queues/%2F?columns=…`:
    /// the idle queue with three messages is verbatim from a private node; the busy one has the
    /// same shape with traffic, the last one belongs to another application.
    const RECORDED: &str = r#"[{"consumers":1,"message_stats":{"deliver_get_details":{"rate":2.4},"publish_details":{"rate":2.6}},"messages_ready":0,"messages_unacknowledged":3,"name":"chime.g.work"},{"consumers":0,"message_stats":{"publish_details":{"rate":0.0}},"messages_ready":3,"messages_unacknowledged":0,"name":"chime.g.parking"},{"consumers":0,"messages_ready":7,"messages_unacknowledged":0,"name":"other.app"}]"#;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn reads_a_recorded_listing() {
        let figures = figures_from_listing(
            RECORDED,
            &names(&["chime.g.work", "chime.g.parking", "chime.h.work"]),
        )
        .expect("parsed");
        assert_eq!(figures.len(), 2, "unwanted and missing queues are left out");
        assert_eq!(
            figures["chime.g.work"],
            QueueFigure {
                ready: 0,
                consumers: 1,
                unacked: Some(3),
                publish_rate: Some(2.6),
                deliver_rate: Some(2.4),
            }
        );
        assert_eq!(
            figures["chime.g.parking"],
            QueueFigure {
                ready: 3,
                consumers: 0,
                unacked: Some(0),
                publish_rate: Some(0.0),
                deliver_rate: Some(0.0),
            }
        );
    }

    #[test]
    fn a_queue_without_statistics_or_a_foreign_answer_is_an_error() {
        let fresh = r#"[{"name":"chime.g.work"}]"#;
        let error = figures_from_listing(fresh, &names(&["chime.g.work"])).expect_err("no stats");
        assert!(error.to_string().contains("no statistics"), "{error}");
        // Another queue without statistics does not matter.
        assert!(figures_from_listing(fresh, &names(&["chime.h.work"])).is_ok());
        let login_page = "<html>please log in</html>";
        assert!(figures_from_listing(login_page, &names(&["chime.g.work"])).is_err());
    }

    /// Against the shared broker: passive declares of queues that do not exist create nothing.
    #[tokio::test]
    async fn the_shared_connection_is_reused_and_reopened_once_closed() {
        let prefix = format!("chime-link-{}", std::process::id());
        let broker = Broker::new(crate::config::DEFAULT_AMQP_URL, &prefix);
        let names = vec![format!("{prefix}.none.work")];
        for _ in 0..3 {
            let figures = broker.queue_figures(&names).await.expect("figures");
            assert_eq!(figures.source, QueueSource::PassiveDeclare);
            assert!(figures.queues.is_empty(), "the queue does not exist");
        }
        let clone = broker.clone();
        clone.queue_figures(&names).await.expect("figures");
        clone
            .parking_lot()
            .await
            .expect("parking lot")
            .close()
            .await;
        assert_eq!(
            broker.connections_opened(),
            1,
            "clones share one connection"
        );
        assert!(broker.connection().await.expect("open").is_connected());

        // Closed under it: the next use opens a new one.
        let first = broker.connection().await.expect("connection");
        first.close("test closes it").await.expect("closed");
        broker.queue_figures(&names).await.expect("figures");
        assert_eq!(broker.connections_opened(), 2);
        let second = broker.connection().await.expect("connection");
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(second.is_connected());

        broker.close().await;
        assert!(!second.is_connected(), "close closes the shared connection");
    }

    #[test]
    fn the_listing_url_has_the_vhost_and_the_amqp_credentials() {
        let m = Management::new(
            "http://rabbit:15672/",
            "amqp://chime:s%40cret@rabbit:5672/%2f",
        )
        .expect("management");
        assert_eq!(m.queues_url.path(), "/api/queues/%2F");
        assert_eq!(m.queues_url.query(), Some(&*format!("columns={COLUMNS}")));
        assert_eq!((m.user.as_str(), m.password.as_str()), ("chime", "s@cret"));
        let behind_proxy = Management::new("https://ops.example.com/rabbit", "amqp://u:p@h/orders")
            .expect("management");
        assert_eq!(behind_proxy.queues_url.path(), "/rabbit/api/queues/orders");
        assert!(Management::new("not a url", "amqp://u:p@h/").is_err());
    }
}
