//! The publish path: trigger messages to the executor group's exchange with publisher confirms
//! and `mandatory`, on a connection this module owns and re-opens itself (through the
//! [`crate::amqp`] adapter).
//!
//! **Invariant:** a trigger counts as published only on a confirm that is an ack without a
//! returned message. An unroutable trigger (returned, then acked) is
//! [`PublishError::Unroutable`] (after forgetting the group's declared topology, so the next try
//! declares it and routes); nacks, confirm timeouts and connection errors are errors too. The
//! caller leaves the run in the outbox and tries again: nothing is assumed published without a
//! confirm.
//!
//! A nack, like a confirm timeout or a broken channel, also retires the connection it came on:
//! the next publish connects again, to the next broker address. A broker nacks when the queue
//! cannot take the message, and a RabbitMQ 3.10 cluster node can go on nacking every publish
//! to a quorum queue on that channel after the queue's leader node was killed, although the
//! queue has a new leader (seen in the cluster chaos test); a fresh connection publishes again.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use chime_protocol::Topology;
use chime_protocol::addresses::Addresses;
use chime_protocol::tls::AmqpTls;
use chime_protocol::wire::{CONTENT_TYPE, PROTOCOL_VERSION, Trigger};
use prometheus::{Histogram, HistogramOpts};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::amqp::{self, Channel, Confirmed, ConnectError, Connection, FieldTable};
use crate::store::OutboxRun;

/// Publish → confirm latency of triggers (`chime_publish_confirm_seconds`), observed here and
/// registered by [`crate::metrics`].
pub static CONFIRM_LATENCY: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::with_opts(
        HistogramOpts::new(
            "chime_publish_confirm_seconds",
            "Time from sending a trigger to the broker's confirm (or its failure).",
        )
        .buckets(vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        ]),
    )
    .expect("valid histogram")
});

/// How long to wait for a broker confirm before treating the publish as failed.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
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
        source: amqp::Error,
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
    Channel(#[from] amqp::Error),
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

impl From<ConnectError> for PublishError {
    fn from(e: ConnectError) -> PublishError {
        match e {
            ConnectError::Failed { url, source } => PublishError::Connect { url, source },
            ConnectError::TimedOut { url, after } => PublishError::ConnectTimeout { url, after },
        }
    }
}

struct Link {
    /// Which link this is: failures of publishes sent on an older one do not retire this one.
    generation: u64,
    connection: Connection,
    channel: Channel,
    declared: HashSet<String>,
}

/// A run's trigger as it goes on the wire: the body, its properties and its headers
/// ([`TriggerMessage::header`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerMessage {
    body: Vec<u8>,
    message_id: String,
    timestamp: u64,
    headers: FieldTable,
}

impl TriggerMessage {
    /// Attempt `run.attempt` of `run`, published under leader `term`. Its `x-chime-not-before`
    /// is the run's instant: it goes out up to the dispatcher's lead before it
    /// ([`crate::pace`]), and the worker holds it until then.
    pub fn new(run: &OutboxRun, term: i64) -> TriggerMessage {
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
            task: run.task.clone(),
        };
        TriggerMessage {
            body: trigger.to_body(),
            message_id: run.id.to_string(),
            timestamp: u64::try_from(run.scheduled_at.timestamp()).unwrap_or(0),
            headers: chime_protocol::headers::trigger_headers(run.attempt, term, run.scheduled_at),
        }
    }

    /// An integer header's value.
    pub fn header(&self, name: &str) -> Option<i64> {
        chime_protocol::headers::get_integer(Some(&self.headers), name)
            .ok()
            .flatten()
    }

    /// What the adapter sends (the message id and headers move into it, so it is sent once).
    fn message(&mut self) -> amqp::Message<'_> {
        amqp::Message {
            body: &self.body,
            content_type: CONTENT_TYPE,
            message_id: Some(std::mem::take(&mut self.message_id)),
            timestamp: Some(self.timestamp),
            headers: Some(std::mem::take(&mut self.headers)),
        }
    }
}

/// Publishes triggers; safe to share between tasks.
pub struct Publisher {
    urls: Addresses,
    tls: AmqpTls,
    connection_name: String,
    prefix: String,
    link: Mutex<Option<Link>>,
    /// Links opened so far (the next link's generation).
    generations: std::sync::atomic::AtomicU64,
    /// When the last connection attempt failed: publishes fail fast for a moment after it
    /// instead of each waiting on a dead broker.
    last_connect_failure: std::sync::Mutex<Option<std::time::Instant>>,
}

/// After a failed connection attempt, publishes fail fast for this long.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("urls", &self.urls)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher to `urls` (one URL or several [`Addresses`], tried in order and the next
    /// after a lost connection); connects lazily on the first publish.
    pub fn new(urls: impl Into<Addresses>, instance: &str, prefix: impl Into<String>) -> Publisher {
        Publisher {
            urls: urls.into(),
            tls: AmqpTls::default(),
            connection_name: format!("chime-scheduler-{instance}"),
            prefix: prefix.into(),
            link: Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
            last_connect_failure: std::sync::Mutex::new(None),
        }
    }

    /// The name prefix of every exchange and queue it publishes to.
    pub fn prefix(&self) -> &str {
        &self.prefix
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

    /// Publishes attempt `run.attempt` of `run` under leader `term` ([`TriggerMessage`]) and
    /// waits for the confirm: to the group's work queue, or a broadcast task to its worker's
    /// own queue ([`Topology::worker_key`]).
    pub async fn publish(&self, run: &OutboxRun, term: i64) -> Result<(), PublishError> {
        let mut trigger = TriggerMessage::new(run, term);
        let message = trigger.message().prepare();
        let topology = Topology::new(&self.prefix, &run.group);
        let routing_key = match run.task.as_ref().and_then(|t| t.worker.as_deref()) {
            Some(worker) => Topology::worker_key(worker),
            None => chime_protocol::topology::WORK_KEY.to_owned(),
        };

        // Send under the lock, wait for the confirm outside it so publishes pipeline.
        let sent_at = std::time::Instant::now();
        let (generation, confirm) = {
            let mut guard = self.link().await?;
            let link = guard.as_mut().expect("link() leaves a link in place");
            let generation = link.generation;
            let sent = async {
                self.ensure_declared(link, &run.group).await?;
                link.channel
                    .publish(topology.exchange().as_str(), &routing_key, message)
                    .await
                    .map_err(PublishError::from)
            }
            .await;
            match sent {
                Ok(confirm) => (generation, confirm),
                Err(e) => {
                    *guard = None;
                    return Err(e);
                }
            }
        };
        let confirmed = tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await;
        CONFIRM_LATENCY.observe(sent_at.elapsed().as_secs_f64());
        let confirmation = match confirmed {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                self.retire_link(generation).await;
                return Err(e.into());
            }
            Err(_) => {
                self.retire_link(generation).await;
                return Err(PublishError::Unconfirmed(CONFIRM_TIMEOUT));
            }
        };
        match confirmation {
            Confirmed::Ack => Ok(()),
            Confirmed::Returned { code, text } => {
                // Someone deleted the queue or binding: forget what we declared so the next
                // publish declares it again.
                if let Some(link) = self.link.lock().await.as_mut() {
                    link.declared.remove(&run.group);
                }
                Err(PublishError::Unroutable { code, text })
            }
            Confirmed::Nack => {
                self.retire_link(generation).await;
                Err(PublishError::Nacked)
            }
        }
    }

    /// Closes the connection (graceful shutdown).
    pub async fn close(&self) {
        if let Some(link) = self.link.lock().await.take() {
            link.channel.close("scheduler stopping").await;
            let _ = link.connection.close("scheduler stopping").await;
        }
    }

    /// Drops link `generation` if it is still the current one (a burst of failures on one
    /// link reconnects once).
    async fn retire_link(&self, generation: u64) {
        let mut guard = self.link.lock().await;
        if guard.as_ref().is_some_and(|l| l.generation == generation)
            && let Some(link) = guard.take()
        {
            // Closed, not only dropped: the broker must not keep a connection per failure.
            // In the background: a broken connection can take a while to say so.
            tokio::spawn(async move {
                let _ = link
                    .connection
                    .close("publishing again on a new connection")
                    .await;
            });
        }
    }

    /// The current link, opening a new one if there is none or it broke.
    async fn link(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Link>>, PublishError> {
        let mut guard = self.link.lock().await;
        let healthy = guard
            .as_ref()
            .is_some_and(|l| l.connection.is_connected() && l.channel.is_connected());
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
            info!(urls = %self.urls.redacted(), "connected to the broker for publishing");
            *guard = Some(link);
        }
        Ok(guard)
    }

    async fn open(&self) -> Result<Link, PublishError> {
        let connection =
            Connection::open_first(&self.urls, &self.tls, &self.connection_name).await?;
        let connect_error = |source| PublishError::Connect {
            url: self.urls.redacted(),
            source,
        };
        let channel = connection.channel().await.map_err(connect_error)?;
        channel.enable_confirms().await.map_err(connect_error)?;
        Ok(Link {
            generation: self
                .generations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            connection,
            channel,
            declared: HashSet::new(),
        })
    }

    async fn ensure_declared(&self, link: &mut Link, group: &str) -> Result<(), PublishError> {
        if link.declared.contains(group) {
            return Ok(());
        }
        link.channel
            .declare_group(&self.prefix, group)
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
) -> Result<(), amqp::Error> {
    let channel = connection.channel().await?;
    let declared = channel.declare_group(prefix, group).await;
    if channel.is_connected() {
        channel.close("declared").await;
    }
    declared
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::amqp::AMQPValue;
    use crate::job::ConcurrencyPolicy;
    use chime_protocol::wire::{HEADER_ATTEMPT, HEADER_NOT_BEFORE, HEADER_TERM};

    fn run(id: i64, at: DateTime<Utc>) -> OutboxRun {
        OutboxRun {
            id,
            group: "g".into(),
            job: "tick".into(),
            scheduled_at: at,
            attempt: 2,
            params: serde_json::json!({"n": 1}),
            timeout: Some(Duration::from_secs(5)),
            retry: None,
            concurrency: ConcurrencyPolicy::Allow,
            task: None,
            fan_out: false,
            workflow: false,
        }
    }

    /// The headers a worker relies on: the attempt, the term that published it, and the
    /// instant it must not start before; the body is the protocol's trigger.
    #[test]
    fn a_trigger_carries_its_attempt_term_and_instant() {
        let at = DateTime::from_timestamp_millis(1_800_000_000_123).expect("instant");
        let mut trigger = TriggerMessage::new(&run(42, at), 7);
        // The wire types of protocol v1: a long-uint attempt, long-long-int term and instant.
        let raw = |name: &str| trigger.headers.inner().get(name).cloned();
        assert_eq!(raw(HEADER_ATTEMPT), Some(AMQPValue::LongUInt(2)));
        assert_eq!(raw(HEADER_TERM), Some(AMQPValue::LongLongInt(7)));
        assert_eq!(
            raw(HEADER_NOT_BEFORE),
            Some(AMQPValue::LongLongInt(1_800_000_000_123))
        );
        assert_eq!(trigger.header(HEADER_NOT_BEFORE), Some(1_800_000_000_123));
        let message = trigger.message();
        assert_eq!(message.message_id.as_deref(), Some("42"));
        assert_eq!(message.timestamp, Some(1_800_000_000));
        assert_eq!(message.content_type, CONTENT_TYPE);
        let decoded = Trigger::from_body(message.body).expect("a trigger");
        assert_eq!((decoded.run_id, decoded.attempt), (42, 2));
        assert_eq!(decoded.scheduled_at, at);
        assert_eq!(decoded.timeout_ms, Some(5_000));
    }
}
