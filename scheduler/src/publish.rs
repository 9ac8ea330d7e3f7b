//! The publish path: trigger messages to the executor group's exchange with publisher confirms
//! and `mandatory`, on a connection this module owns and re-opens itself.
//!
//! A publish is a success only when the broker acks it *and* did not return it: with lapin an
//! unroutable mandatory message comes back as `Ack(Some(returned))`, which this module reports as
//! [`PublishError::Unroutable`] (after re-declaring the group's topology, so the next try routes).
//! Nacks, timeouts and connection errors are errors too; the caller leaves the run in the outbox
//! and tries again. Nothing is assumed published without a confirm.
//!
//! Control messages ([`ControlMessage`], such as "cancel run N") go the same way to the fanout
//! exchange `P.control` that every worker binds a queue to.

use std::collections::HashSet;
use std::time::Duration;

use chime_protocol::Topology;
use chime_protocol::redact::redact_url;
use chime_protocol::tls::AmqpTls;
use chime_protocol::wire::{CONTENT_TYPE, ControlMessage, PROTOCOL_VERSION, Trigger};
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::store::OutboxRun;

/// How long to wait for a broker confirm before treating the publish as failed.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Groups declared at once by [`Publisher::declare_groups`].
pub const DECLARE_CONCURRENCY: usize = 16;

/// Why a trigger was not published. The run stays in the outbox in every case.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// No connection to the broker.
    #[error("broker unreachable at {url}: {source}")]
    Connect {
        /// Broker URL without password.
        url: String,
        /// The cause.
        source: lapin::Error,
    },
    /// The broker did not complete the connection handshake in time.
    #[error("broker at {url} did not answer within {after:?}")]
    ConnectTimeout {
        /// Broker URL without password.
        url: String,
        /// The time waited.
        after: Duration,
    },
    /// The channel or connection failed during the publish.
    #[error("publish failed: {0}")]
    Channel(#[from] lapin::Error),
    /// The exchange had no queue bound for the routing key.
    #[error("broker returned the trigger as unroutable ({code} {text}); topology re-declared")]
    Unroutable {
        /// AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// AMQP reply text.
        text: String,
    },
    /// The broker refused the message (for example a full queue with reject-publish).
    #[error("broker nacked the trigger")]
    Nacked,
    /// A connection attempt failed moments ago; not retried yet.
    #[error("broker unreachable; next connection attempt within {0:?}")]
    Reconnecting(Duration),
    /// No confirm arrived in time.
    #[error("no publisher confirm within {0:?}")]
    Unconfirmed(Duration),
}

struct Link {
    connection: Connection,
    channel: Channel,
    declared: HashSet<String>,
    control_declared: bool,
}

/// How a control message fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlDelivery {
    /// The broker confirmed it into at least one worker's control queue.
    Delivered,
    /// No worker is listening (no queue is bound to the control exchange): no worker of this
    /// prefix is running.
    NoListener,
}

/// Publishes triggers; safe to share between tasks.
pub struct Publisher {
    url: String,
    tls: AmqpTls,
    connection_name: String,
    prefix: String,
    link: Mutex<Option<Link>>,
    /// When the last connection attempt failed: publishes fail fast for a moment after it
    /// instead of each waiting on a dead broker.
    last_connect_failure: std::sync::Mutex<Option<std::time::Instant>>,
}

/// After a failed connection attempt, publishes fail fast for this long.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("url", &redact_url(&self.url))
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher to `url`; connects lazily on the first publish.
    pub fn new(url: impl Into<String>, instance: &str, prefix: impl Into<String>) -> Publisher {
        Publisher {
            url: url.into(),
            tls: AmqpTls::default(),
            connection_name: format!("chime-scheduler-{instance}"),
            prefix: prefix.into(),
            link: Mutex::new(None),
            last_connect_failure: std::sync::Mutex::new(None),
        }
    }

    /// Connects with the TLS options `tls` (an `amqps://` URL's CA file and client
    /// certificate); default none.
    #[must_use]
    pub fn with_tls(mut self, tls: AmqpTls) -> Publisher {
        self.tls = tls;
        self
    }

    /// Declares the topology of `group` (idempotent).
    pub async fn declare(&self, group: &str) -> Result<(), PublishError> {
        let mut guard = self.link().await?;
        let link = guard.as_mut().expect("link() leaves a link in place");
        let result = self.ensure_declared(link, group).await;
        if result.is_err() {
            *guard = None;
        }
        result
    }

    /// Declares the topology of every group in `groups` not declared on this connection yet,
    /// up to [`DECLARE_CONCURRENCY`] at once, each on a short-lived channel of its own (an AMQP
    /// channel runs one synchronous method at a time, and a quorum queue takes the broker tens of
    /// milliseconds to create). Returns the groups that failed, with their errors.
    pub async fn declare_groups(
        &self,
        groups: &[&str],
    ) -> Result<Vec<(String, PublishError)>, PublishError> {
        let mut guard = self.link().await?;
        let link = guard.as_mut().expect("link() leaves a link in place");
        let todo: Vec<&str> = groups
            .iter()
            .copied()
            .filter(|g| !link.declared.contains(*g))
            .collect();
        let mut results = Vec::with_capacity(todo.len());
        for chunk in todo.chunks(DECLARE_CONCURRENCY) {
            let declared = futures::future::join_all(
                chunk
                    .iter()
                    .map(|group| declare_on_own_channel(&link.connection, &self.prefix, group)),
            )
            .await;
            results.extend(chunk.iter().copied().zip(declared));
        }
        let mut failed = Vec::new();
        for (group, result) in results {
            match result {
                Ok(()) => {
                    link.declared.insert(group.to_owned());
                }
                Err(e) => failed.push((group.to_owned(), PublishError::from(e))),
            }
        }
        Ok(failed)
    }

    /// Publishes attempt `run.attempt` of `run` under leader `term` and waits for the confirm.
    pub async fn publish(&self, run: &OutboxRun, term: i64) -> Result<(), PublishError> {
        let trigger = Trigger {
            v: PROTOCOL_VERSION,
            run_id: run.id,
            job: run.job.clone(),
            group: run.group.clone(),
            attempt: run.attempt,
            scheduled_at: run.scheduled_at,
            params: run.params.clone(),
            timeout_ms: run
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            retry: run.retry,
        };
        // Published up to the dispatcher's lead before the instant (crate::pace): the worker
        // holds it until then.
        let headers = chime_protocol::headers::trigger_headers(run.attempt, term, run.scheduled_at);
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(run.id.to_string().into())
            .with_timestamp(u64::try_from(run.scheduled_at.timestamp()).unwrap_or(0))
            .with_headers(headers);
        let topology = Topology::new(&self.prefix, &run.group);

        // Send under the lock, wait for the confirm outside it so publishes pipeline.
        let sent_at = std::time::Instant::now();
        let confirm = {
            let mut guard = self.link().await?;
            let link = guard.as_mut().expect("link() leaves a link in place");
            let sent = async {
                self.ensure_declared(link, &run.group).await?;
                link.channel
                    .basic_publish(
                        topology.exchange().as_str().into(),
                        chime_protocol::topology::WORK_KEY.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &trigger.to_body(),
                        properties,
                    )
                    .await
                    .map_err(PublishError::from)
            }
            .await;
            match sent {
                Ok(confirm) => confirm,
                Err(e) => {
                    *guard = None;
                    return Err(e);
                }
            }
        };
        let confirmed = tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await;
        crate::metrics::observe_confirm(sent_at.elapsed());
        let confirmation = match confirmed {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                self.drop_link().await;
                return Err(e.into());
            }
            Err(_) => {
                self.drop_link().await;
                return Err(PublishError::Unconfirmed(CONFIRM_TIMEOUT));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => {
                // Someone deleted the queue or binding: forget what we declared so the next
                // publish declares it again.
                if let Some(link) = self.link.lock().await.as_mut() {
                    link.declared.remove(&run.group);
                }
                Err(PublishError::Unroutable {
                    code: returned.reply_code,
                    text: returned.reply_text.to_string(),
                })
            }
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => unreachable!("the channel is in confirm mode"),
        }
    }

    /// Publishes a control message to every worker under this prefix (fanout exchange
    /// `P.control`, declared here if needed) and waits for the broker's confirm.
    pub async fn publish_control(
        &self,
        message: &ControlMessage,
    ) -> Result<ControlDelivery, PublishError> {
        let body = serde_json::to_vec(message).expect("a ControlMessage always serialises");
        let exchange = chime_protocol::topology::control_exchange(&self.prefix);
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2);
        let confirm = {
            let mut guard = self.link().await?;
            let link = guard.as_mut().expect("link() leaves a link in place");
            let sent = async {
                if !link.control_declared {
                    chime_protocol::topology::declare_control(&link.channel, &self.prefix).await?;
                    link.control_declared = true;
                }
                link.channel
                    .basic_publish(
                        exchange.as_str().into(),
                        "".into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &body,
                        properties,
                    )
                    .await
            }
            .await;
            match sent {
                Ok(confirm) => confirm,
                Err(e) => {
                    *guard = None;
                    return Err(e.into());
                }
            }
        };
        let confirmation = match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                self.drop_link().await;
                return Err(e.into());
            }
            Err(_) => {
                self.drop_link().await;
                return Err(PublishError::Unconfirmed(CONFIRM_TIMEOUT));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(ControlDelivery::Delivered),
            Confirmation::Ack(Some(_)) => Ok(ControlDelivery::NoListener),
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => unreachable!("the channel is in confirm mode"),
        }
    }

    /// Closes the connection (graceful shutdown).
    pub async fn close(&self) {
        if let Some(link) = self.link.lock().await.take() {
            let _ = link.channel.close(200, "scheduler stopping".into()).await;
            let _ = link
                .connection
                .close(200, "scheduler stopping".into())
                .await;
        }
    }

    async fn drop_link(&self) {
        *self.link.lock().await = None;
    }

    /// The current link, opening a new one if there is none or it broke.
    async fn link(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Link>>, PublishError> {
        let mut guard = self.link.lock().await;
        let healthy = guard
            .as_ref()
            .is_some_and(|l| l.connection.status().connected() && l.channel.status().connected());
        if !healthy {
            *guard = None;
            let recently_failed = self
                .last_connect_failure
                .lock()
                .expect("not poisoned")
                .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE);
            if recently_failed {
                return Err(PublishError::Reconnecting(RECONNECT_PAUSE));
            }
            let link = self.open().await.inspect_err(|_| {
                *self.last_connect_failure.lock().expect("not poisoned") =
                    Some(std::time::Instant::now());
            })?;
            info!(url = %redact_url(&self.url), "connected to the broker for publishing");
            *guard = Some(link);
        }
        Ok(guard)
    }

    async fn open(&self) -> Result<Link, PublishError> {
        let connect_error = |source| PublishError::Connect {
            url: redact_url(&self.url),
            source,
        };
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.as_str().into());
        let connection = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            chime_protocol::tls::connect(&self.url, &self.tls, properties),
        )
        .await
        {
            Ok(result) => result.map_err(connect_error)?,
            Err(_) => {
                return Err(PublishError::ConnectTimeout {
                    url: redact_url(&self.url),
                    after: CONNECT_TIMEOUT,
                });
            }
        };
        let channel = connection.create_channel().await.map_err(connect_error)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(connect_error)?;
        Ok(Link {
            connection,
            channel,
            declared: HashSet::new(),
            control_declared: false,
        })
    }

    async fn ensure_declared(&self, link: &mut Link, group: &str) -> Result<(), PublishError> {
        if link.declared.contains(group) {
            return Ok(());
        }
        Topology::new(&self.prefix, group)
            .declare(&link.channel)
            .await
            .inspect_err(|e| warn!(group, error = %e, "declaring group topology failed"))?;
        link.declared.insert(group.to_owned());
        Ok(())
    }
}

/// Declares `group`'s topology on a channel opened for it and closed after.
async fn declare_on_own_channel(
    connection: &Connection,
    prefix: &str,
    group: &str,
) -> Result<(), lapin::Error> {
    let channel = connection.create_channel().await?;
    let declared = Topology::new(prefix, group).declare(&channel).await;
    if channel.status().connected() {
        let _ = channel.close(200, "declared".into()).await;
    }
    declared
}
