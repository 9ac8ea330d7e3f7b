//! The consume loop: a supervisor that keeps consumers on the group's work queue and on the
//! worker's own queue until shutdown, and hands each delivery (of either queue, alike) and
//! control message up through [`Dispatch`].
//!
//! lapin's auto-recovery (enabled here) survives a lost *connection*: it reconnects and replays
//! topology, QoS and consumers, and the consumer stream resumes after
//! [`Channel::wait_for_recovery`]. It does not recover a *channel* the broker closed (consumer
//! timeout `PRECONDITION_FAILED`, a deleted queue cancelling the consumer, a 404 on publish), and
//! recovery itself gives up after its retries. The supervisor covers those: on any such end it
//! reopens channels (and the connection if it is dead), re-declares the topology, re-applies the
//! prefetch and re-consumes, with capped backoff, until shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chime_protocol::backoff;
use chime_protocol::wire::ControlMessage;
use futures::StreamExt;
use lapin::options::{BasicCancelOptions, BasicNackOptions};
use lapin::{Channel, Consumer};
use tokio_util::sync::CancellationToken;

use super::broker::{Broker, Link, Opened};
use super::inbound::Inbound;

/// Where the consume loop hands what it receives. The runtime implements it with the delivery
/// path, so this layer never imports a layer above it.
pub(crate) trait Dispatch {
    /// Starts handling a delivery of the work queue or the worker's own queue that arrived on
    /// `link`, in a task of its own.
    fn delivery(&self, link: Arc<Link>, delivery: Inbound);
    /// An operator's cancel of run `run_id`: fires its handler's token if this worker holds the
    /// run, and those of the tasks of run `run_id` it holds. Returns whether it did.
    fn cancel_run(&self, run_id: i64) -> bool;
}

/// How long a channel whose consumer could not be cancelled is watched for lapin's recovery
/// (which replays its consumers) before the watch gives up; lapin's own recovery gives up
/// sooner (16 tries with exponential backoff).
const ORPHAN_WATCH: Duration = Duration::from_secs(300);

/// Closes `channel`, whose consumer could not be cancelled: at once if it is open, else as soon
/// as lapin's recovery has reopened it. Without this a recovery would replay the consumer on a
/// channel whose stream nobody reads, and the broker would push up to the prefetch of triggers
/// to it that stay unacked (and unrun) until the worker restarts.
fn close_orphaned(channel: Channel) -> tokio::task::JoinHandle<bool> {
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
/// at start-up. Returns once consuming has stopped; the deliveries handed to `dispatch` may
/// still be in flight.
pub(crate) async fn supervise(
    broker: &mut Broker,
    capacity: u16,
    first: Opened,
    shutdown: &CancellationToken,
    dispatch: &impl Dispatch,
) {
    let mut current = Some(first);
    let mut failures: u32 = 0;
    loop {
        let opened = match current.take() {
            Some(opened) => opened,
            None => match broker.open(capacity).await {
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
        match consume(opened, shutdown, dispatch).await {
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
    opened: Opened,
    shutdown: &CancellationToken,
    dispatch: &impl Dispatch,
) -> LinkEnd {
    let Opened {
        link,
        work: mut consumer,
        mut own,
        mut control,
    } = opened;
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                stop_both(&link, consumer, own).await;
                return LinkEnd::Shutdown;
            }
            _ = link.broken.cancelled() => {
                // The consumer channel may be fine: stop its consumers so no delivery waits in
                // a stream nobody reads, and keep it open for the in-flight acks.
                stop_both(&link, consumer, own).await;
                return LinkEnd::Lost("the publishing channel closed".into());
            }
            message = control.next() => match message {
                Some(Ok(message)) => {
                    on_control(dispatch, &message.data);
                    continue;
                }
                // The channel or connection failed: the work consumer sees it too.
                Some(Err(error)) => Some(Err(error)),
                None => {
                    stop_both(&link, consumer, own).await;
                    return LinkEnd::Lost("the broker cancelled the control queue consumer".into());
                }
            },
            next = own.next() => match next {
                // The worker's own queue was deleted (or its channel closed): reopen, which
                // declares it again.
                None => {
                    stop_consuming(&link, &link.consumer_tag, consumer).await;
                    return LinkEnd::Lost(
                        "the broker cancelled the worker queue consumer (queue deleted or \
                         channel closed)"
                            .into(),
                    );
                }
                some => some,
            },
            next = consumer.next() => next,
        };
        match next {
            Some(Ok(d)) => {
                dispatch.delivery(link.clone(), Inbound::new(d));
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "queue consumer failed; waiting for recovery");
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
                stop_consuming(&link, &link.own_tag, own).await;
                return LinkEnd::Lost(
                    "the broker cancelled the consumer (queue deleted or channel closed)".into(),
                );
            }
        }
    }
}

/// Acts on one control message.
fn on_control(dispatch: &impl Dispatch, body: &[u8]) {
    match serde_json::from_slice::<ControlMessage>(body) {
        Ok(ControlMessage::CancelRun { run_id }) => {
            if dispatch.cancel_run(run_id) {
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

/// Stops both queue consumers of `link` ([`stop_consuming`]): the work queue's and the
/// worker queue's.
async fn stop_both(link: &Link, work: Consumer, own: Consumer) {
    stop_consuming(link, &link.consumer_tag, work).await;
    stop_consuming(link, &link.own_tag, own).await;
}

/// Cancels consumer `tag` so the broker sends nothing more, and hands back anything it had
/// already pushed to us but we had not started (requeued for another worker, or for this one
/// restarted).
async fn stop_consuming(link: &Link, tag: &str, mut consumer: Consumer) {
    if let Err(error) = link
        .consume
        .basic_cancel(tag.into(), BasicCancelOptions::default())
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
    use lapin::options::{BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties};
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
            own_tag: "orphan-own".into(),
        };

        proxy.cut();
        wait_until("the channel to wait for recovery", || {
            link.consume.status().reconnecting()
        })
        .await;
        stop_consuming(&link, "orphan", consumer).await;
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
