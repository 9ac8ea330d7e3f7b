//! The AMQP side of a worker: the connection, and a supervisor that keeps a consumer on the
//! group's work queue until shutdown.
//!
//! lapin's auto-recovery (enabled here) survives a lost *connection*: it reconnects and replays
//! topology, QoS and consumers, and the consumer stream resumes after
//! [`Channel::wait_for_recovery`]. It does not recover a *channel* the broker closed (consumer
//! timeout `PRECONDITION_FAILED`, a deleted queue cancelling the consumer, a 404 on publish), and
//! recovery itself gives up after its retries. The supervisor covers those: on any such end it
//! reopens channels (and the connection if it is dead), re-declares the topology, re-applies the
//! prefetch and re-consumes, with capped backoff, until shutdown.
//!
//! Each opening is a [`Link`]: a consumer channel and a confirm-mode channel for parking
//! messages and publishing retries. The consumer channel also consumes the worker's control
//! queue: an exclusive, auto-deleted queue bound to the fanout exchange `P.control`, which
//! carries operators' cancels ([`ControlMessage`]) to every worker. Deliveries keep the `Link` they arrived on, because an ack must go out on the
//! delivery's own channel; acks of a dead channel return `Ok(false)` and the broker redelivers
//! those messages, which the claim then recognises as duplicates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chime_protocol::backoff;
use chime_protocol::tls::AmqpTls;
use chime_protocol::topology;
use chime_protocol::wire::ControlMessage;
use futures::StreamExt;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, Consumer};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::delivery;
use crate::worker::Shared;

/// One opening of the group's queue: the channels a delivery needs until it is acked.
pub(crate) struct Link {
    /// The channel the consumer (and so every ack) lives on.
    pub consume: Channel,
    /// A confirm-mode channel for publishing to the parking lot.
    pub publish: Channel,
    /// Fired by a delivery task when the publish channel died, so the supervisor reopens.
    pub broken: CancellationToken,
    consumer_tag: String,
}

/// A link and its two consumers: the work queue's and the control queue's.
pub(crate) struct Opened {
    link: Arc<Link>,
    work: Consumer,
    control: Consumer,
}

/// The worker's connection and the links it opened.
pub(crate) struct Broker {
    url: String,
    tls: AmqpTls,
    connection_name: String,
    connection: Option<Connection>,
    generation: u64,
    links: Vec<Arc<Link>>,
}

impl Broker {
    pub(crate) fn new(url: String, tls: AmqpTls, worker_id: &str) -> Self {
        Broker {
            url,
            tls,
            connection_name: format!("chime-worker-{worker_id}"),
            connection: None,
            generation: 0,
            links: Vec::new(),
        }
    }

    /// The connection, opened (again) if there is none or the old one is beyond recovery.
    async fn connection(&mut self) -> Result<&Connection, lapin::Error> {
        let usable = self
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected() || c.status().reconnecting());
        if !usable {
            let properties = ConnectionProperties::default()
                .enable_auto_recover()
                .with_connection_name(self.connection_name.as_str().into());
            let connection = chime_protocol::tls::connect(&self.url, &self.tls, properties).await?;
            tracing::info!(connection = %self.connection_name, "connected to RabbitMQ");
            self.connection = Some(connection);
        }
        Ok(self.connection.as_ref().expect("set above"))
    }

    /// Opens channels, declares the topology, sets the prefetch and starts consuming.
    pub(crate) async fn open(
        &mut self,
        shared: &Shared,
        capacity: u16,
    ) -> Result<Opened, lapin::Error> {
        self.generation += 1;
        let consumer_tag = format!("{}-{}", self.connection_name, self.generation);
        let prefix = shared.topology.prefix();
        let control_queue = format!("{prefix}.control.{}.{}", shared.id, self.generation);
        let connection = self.connection().await?;
        let consume = connection.create_channel().await?;
        let publish = match connection.create_channel().await {
            Ok(publish) => publish,
            Err(error) => {
                close_channel(&consume).await;
                return Err(error);
            }
        };
        let setup = async {
            shared.topology.declare(&consume).await?;
            // Per-consumer prefetch (global=false): global QoS is a channel error on quorum
            // queues.
            consume
                .basic_qos(capacity, BasicQosOptions { global: false })
                .await?;
            publish
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            topology::declare_control_queue(&consume, prefix, &control_queue).await?;
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
                    shared.topology.work_queue().as_str().into(),
                    consumer_tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((work, control))
        };
        let (work, control) = match setup.await {
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
            queue = %shared.topology.work_queue(),
            control_queue = %control_queue,
            consumer = %link.consumer_tag,
            prefetch = capacity,
            "consuming"
        );
        Ok(Opened {
            link,
            work,
            control,
        })
    }

    /// Closes every channel and the connection.
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

/// How long a channel whose consumer could not be cancelled is watched for lapin's recovery
/// (which replays its consumers) before the watch gives up; lapin's own recovery gives up
/// sooner (16 tries with exponential backoff).
const ORPHAN_WATCH: Duration = Duration::from_secs(300);

/// Closes `channel`, whose consumer could not be cancelled: at once if it is open, else as soon
/// as lapin's recovery has reopened it. Without this a recovery would replay the consumer on a
/// channel whose stream nobody reads, and the broker would push up to the prefetch of triggers
/// to it that stay unacked (and unrun) until the worker restarts.
pub(crate) fn close_orphaned(channel: Channel) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
        let deadline = Instant::now() + ORPHAN_WATCH;
        loop {
            let status = channel.status();
            if status.connected() {
                match channel.close(200, "consumer abandoned".into()).await {
                    Ok(()) => {
                        tracing::info!("closed the channel whose consumer could not be cancelled");
                        return true;
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        "closing a channel whose consumer could not be cancelled; trying again"
                    ),
                }
            }
            if !status.reconnecting() && !status.initializing() {
                return false; // closed for good: the broker dropped the consumer with it
            }
            if Instant::now() >= deadline {
                tracing::error!(
                    "a channel whose consumer could not be cancelled is still recovering after \
                     {ORPHAN_WATCH:?}; no longer watching it"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// How a link's consume loop ended.
enum LinkEnd {
    Shutdown,
    Lost(String),
}

/// Consumes until shutdown, reopening the link whenever it is lost. `first` is the link opened
/// at start-up. Returns once consuming has stopped; in-flight deliveries are in `tracker`.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    broker: &mut Broker,
    capacity: u16,
    first: Opened,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) {
    let mut current = Some(first);
    let mut failures: u32 = 0;
    loop {
        let opened = match current.take() {
            Some(opened) => opened,
            None => match broker.open(&shared, capacity).await {
                Ok(opened) => opened,
                Err(error) => {
                    let wait = reopen_delay(failures);
                    failures += 1;
                    tracing::warn!(%error, ?wait, "cannot consume the work queue; retrying");
                    if pause(wait, shutdown).await {
                        return;
                    }
                    continue;
                }
            },
        };
        let opened_at = Instant::now();
        match consume(&shared, opened, shutdown, tracker).await {
            LinkEnd::Shutdown => return,
            LinkEnd::Lost(why) => {
                if opened_at.elapsed() > Duration::from_secs(60) {
                    failures = 0;
                }
                let wait = reopen_delay(failures);
                failures += 1;
                tracing::warn!(reason = %why, ?wait, "lost the work queue consumer; reopening");
                if pause(wait, shutdown).await {
                    return;
                }
            }
        }
    }
}

fn reopen_delay(failures: u32) -> Duration {
    backoff::delay(
        failures,
        Duration::from_millis(200),
        Duration::from_secs(15),
    )
}

/// Sleeps for `wait`; true if shutdown came first.
async fn pause(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(wait) => false,
    }
}

async fn consume(
    shared: &Arc<Shared>,
    opened: Opened,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) -> LinkEnd {
    let Opened {
        link,
        work: mut consumer,
        mut control,
    } = opened;
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                stop_consuming(&link, consumer).await;
                return LinkEnd::Shutdown;
            }
            _ = link.broken.cancelled() => {
                // The consumer channel may be fine: stop its consumer so no delivery waits in
                // a stream nobody reads, and keep it open for the in-flight acks.
                stop_consuming(&link, consumer).await;
                return LinkEnd::Lost("the publishing channel closed".into());
            }
            message = control.next() => match message {
                Some(Ok(message)) => {
                    on_control(shared, &message.data);
                    continue;
                }
                // The channel or connection failed: the work consumer sees it too.
                Some(Err(error)) => Some(Err(error)),
                None => {
                    stop_consuming(&link, consumer).await;
                    return LinkEnd::Lost("the broker cancelled the control queue consumer".into());
                }
            },
            next = consumer.next() => next,
        };
        match next {
            Some(Ok(d)) => {
                tracker.spawn(delivery::handle(shared.clone(), link.clone(), d));
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "work queue consumer failed; waiting for recovery");
                let recovered = tokio::select! {
                    _ = shutdown.cancelled() => return LinkEnd::Shutdown,
                    recovered = link.consume.wait_for_recovery(error) => recovered,
                };
                match recovered {
                    Ok(()) => tracing::info!("AMQP connection recovered; consuming again"),
                    Err(error) => return LinkEnd::Lost(error.to_string()),
                }
            }
            None => {
                return LinkEnd::Lost(
                    "the broker cancelled the consumer (queue deleted or channel closed)".into(),
                );
            }
        }
    }
}

/// Acts on one control message.
fn on_control(shared: &Shared, body: &[u8]) {
    match serde_json::from_slice::<ControlMessage>(body) {
        Ok(ControlMessage::CancelRun { run_id }) => {
            if shared.cancel_run(run_id) {
                tracing::info!(
                    run_id,
                    "cancel requested by an operator: fired the run's cancellation token"
                );
            } else {
                tracing::debug!(run_id, "cancel for a run this worker does not hold");
            }
        }
        // A message of a newer protocol crate this worker was built without: as one that does
        // not decode (the wire contract says to ignore what does not concern the worker).
        Ok(other) => tracing::warn!(
            ?other,
            "ignoring a control message this worker does not know"
        ),
        Err(error) => tracing::warn!(%error, "ignoring a control message that does not decode"),
    }
}

/// Cancels the consumer so the broker sends nothing more, and hands back anything it had
/// already pushed to us but we had not started (requeued for another worker).
async fn stop_consuming(link: &Link, mut consumer: Consumer) {
    if let Err(error) = link
        .consume
        .basic_cancel(
            link.consumer_tag.as_str().into(),
            BasicCancelOptions::default(),
        )
        .await
    {
        tracing::warn!(
            %error,
            "cancelling the consumer failed; closing its channel (now, or once the connection \
             has recovered) so that no recovery revives a consumer nobody reads"
        );
        drop(consumer);
        close_orphaned(link.consume.clone());
        return;
    }
    while let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await
    {
        let requeue = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        if let Err(error) = d.acker.nack(requeue).await {
            tracing::debug!(%error, "requeueing an unstarted delivery");
        }
    }
    tracing::info!("stopped consuming");
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::JoinHandle;

    const BROKER: &str = "127.0.0.1:5672";

    /// A TCP proxy in front of the broker that the test can cut (listener closed, every
    /// connection dropped: the client sees the connection fail and its reconnects refused)
    /// and restore on the same port.
    struct Proxy {
        port: u16,
        accept: JoinHandle<()>,
        links: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    }

    impl Proxy {
        async fn start(port: u16) -> Proxy {
            let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let links: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>> = Arc::default();
            let held = links.clone();
            let accept = tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let link = tokio::spawn(async move {
                        if let Ok(mut broker) = TcpStream::connect(BROKER).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                        }
                    });
                    held.lock().unwrap().push(link);
                }
            });
            Proxy {
                port,
                accept,
                links,
            }
        }

        fn cut(&self) {
            self.accept.abort();
            for link in self.links.lock().unwrap().drain(..) {
                link.abort();
            }
        }
    }

    async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Once: `basic.cancel` failed while the connection was recovering, the channel stayed
    /// open, lapin's recovery replayed the consumer, and the broker pushed triggers to a stream
    /// nobody read. Now the channel is closed once it is back, and the queue keeps its messages.
    #[tokio::test]
    async fn a_consumer_whose_cancel_failed_is_not_revived_by_the_recovery() {
        let proxy = Proxy::start(0).await;
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port);
        let properties = ConnectionProperties::default().enable_auto_recover();
        let connection = Connection::connect(&url, properties).await.unwrap();
        let direct = Connection::connect(
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            ConnectionProperties::default(),
        )
        .await
        .unwrap();
        let probe = direct.create_channel().await.unwrap();
        let queue = format!("orphan-test-{}", fastrand::u64(..));
        probe
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let consume = connection.create_channel().await.unwrap();
        let publish = connection.create_channel().await.unwrap();
        let consumer = consume
            .basic_consume(
                queue.as_str().into(),
                "orphan".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let link = Link {
            consume,
            publish,
            broken: CancellationToken::new(),
            consumer_tag: "orphan".into(),
        };

        proxy.cut();
        wait_until("the channel to wait for recovery", || {
            link.consume.status().reconnecting()
        })
        .await;
        stop_consuming(&link, consumer).await;
        let _restored = Proxy::start(proxy.port).await;
        wait_until("the connection to recover", || {
            connection.status().connected()
        })
        .await;
        wait_until("the recovered channel to be closed", || {
            let status = link.consume.status();
            !status.connected() && !status.reconnecting() && !status.initializing()
        })
        .await;

        // The client sees the channel closed as it sends `channel.close`; the broker drops the
        // channel's consumers when it handles it, a moment later. A revived consumer on a live
        // channel would stay.
        let consumers = || async {
            probe
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap()
                .consumer_count()
        };
        let settle = Instant::now() + Duration::from_secs(5);
        let mut count = consumers().await;
        while count > 0 && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(20)).await;
            count = consumers().await;
        }
        assert_eq!(count, 0, "the consumer was revived");
        assert!(
            link.publish.status().connected(),
            "the other channel recovered"
        );
        probe
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let _ = connection.close(200, "test done".into()).await;
        let _ = direct.close(200, "test done".into()).await;
    }
}
