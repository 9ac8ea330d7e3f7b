//! The test's own names on the shared RabbitMQ, and the deletion of what it declared under
//! them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chime_protocol::Topology;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

use crate::wait::{WAIT, wait_for};

/// The local RabbitMQ.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// `AMQP_URL` from the environment, else the local RabbitMQ ([`AMQP_URL`]).
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| AMQP_URL.to_owned())
}

/// A name no other test uses, in this process or another one running at the same time: queue
/// prefixes, groups, instance and worker ids, databases.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!("{prefix}{}x{n}x{nanos:x}", std::process::id())
}

/// A passive declare of `queue`: its ready messages and consumers, or the broker's error (404
/// when nobody declared it; that error also closes the channel).
pub async fn passive_declare(
    channel: &lapin::Channel,
    queue: &str,
) -> Result<lapin::Queue, lapin::Error> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// A connection to the broker at `amqp_url` and a channel on it in confirm mode, for a test that
/// publishes as the scheduler does (keep the connection: dropping it closes the channel).
pub async fn confirm_channel(amqp_url: &str) -> (Connection, lapin::Channel) {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default())
        .await
        .expect("RabbitMQ at AMQP_URL (default 127.0.0.1:5672)");
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    (connection, channel)
}

/// Publishes `body` to `exchange` with `routing_key` (mandatory, on `channel` in confirm mode)
/// until the broker acks it routed: a worker may still be declaring (or re-declaring) the queue.
/// Fails the test after [`WAIT`].
pub async fn publish_routed(
    channel: &lapin::Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: &BasicProperties,
) {
    wait_for(WAIT, "the message to be routed to a queue", || async move {
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                properties.clone(),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        matches!(confirm, Confirmation::Ack(None)).then_some(())
    })
    .await;
}

/// How long dropping an undeleted [`TopologyGuard`] waits for the broker before giving up.
const DROP_DELETE_TIMEOUT: Duration = Duration::from_secs(15);

/// Deletes the broker topology a test (or benchmark) creates under its prefix: the exchange and
/// queues of each group, and the prefix's control exchange (workers and `chime runs cancel`
/// declare it). Explicitly with [`TopologyGuard::delete`] at the end, or, if the test panics
/// before that, when the guard is dropped during unwinding.
///
/// Create it right after the prefix, so that it is dropped after the workers and instances.
#[derive(Debug)]
pub struct TopologyGuard {
    amqp_url: String,
    prefix: String,
    groups: Mutex<Vec<String>>,
    /// Queues outside the groups' fixed topology: workers' own queues (`P.G.worker.<id>`).
    queues: Mutex<Vec<String>>,
    deleted: bool,
}

impl TopologyGuard {
    /// Guards the topology of `groups` under `prefix` on the broker at `amqp_url`.
    pub fn new(amqp_url: &str, prefix: &str, groups: &[&str]) -> TopologyGuard {
        TopologyGuard {
            amqp_url: amqp_url.to_owned(),
            prefix: prefix.to_owned(),
            groups: Mutex::new(groups.iter().map(|g| (*g).to_owned()).collect()),
            queues: Mutex::new(Vec::new()),
            deleted: false,
        }
    }

    /// The guarded prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Guards worker `worker_id`'s own queue in group `group` too (durable: a worker leaves it
    /// for its next start, so a test that starts workers under fixed ids names them here).
    pub fn add_worker_queue(&self, group: &str, worker_id: &str) {
        let queue = Topology::new(self.prefix.as_str(), group).worker_queue(worker_id);
        let mut queues = self.queues.lock().expect("not poisoned");
        if !queues.contains(&queue) {
            queues.push(queue);
        }
    }

    /// Guards group `group` too (once, however often it is added).
    pub fn add_group(&self, group: &str) {
        let mut groups = self.groups.lock().expect("not poisoned");
        if !groups.iter().any(|g| g == group) {
            groups.push(group.to_owned());
        }
    }

    /// Deletes the topology now, and fails the test if the broker refuses.
    pub async fn delete(self) {
        let prefix = self.prefix.clone();
        if let Err(e) = self.try_delete().await {
            panic!("deleting the topology under {prefix}: {e}");
        }
    }

    /// Deletes the topology now; the broker's refusal, if it refuses.
    pub async fn try_delete(mut self) -> Result<(), lapin::Error> {
        let groups = std::mem::take(&mut *self.groups.lock().expect("not poisoned"));
        let queues = std::mem::take(&mut *self.queues.lock().expect("not poisoned"));
        self.deleted = true;
        delete_topology(&self.amqp_url, &self.prefix, &groups, &queues).await
    }
}

async fn delete_topology(
    amqp_url: &str,
    prefix: &str,
    groups: &[String],
    queues: &[String],
) -> Result<(), lapin::Error> {
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    for queue in queues {
        let channel = connection.create_channel().await?;
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    for group in groups {
        // A channel per group: an error closes the channel it happened on.
        let channel = connection.create_channel().await?;
        Topology::new(prefix, group.as_str())
            .delete(&channel)
            .await?;
    }
    let channel = connection.create_channel().await?;
    channel
        .exchange_delete(
            chime_protocol::topology::control_exchange(prefix)
                .as_str()
                .into(),
            ExchangeDeleteOptions::default(),
        )
        .await?;
    let _ = connection.close(200, "test done".into()).await;
    Ok(())
}

impl Drop for TopologyGuard {
    /// Deletes the topology unless [`TopologyGuard::delete`] did. This runs inside the test's
    /// tokio runtime (which may be single-threaded and is blocked here), so the deletion runs on
    /// a thread of its own with its own runtime; a dead broker cannot hang the test past
    /// 15 seconds. It never panics: it may run while the test is unwinding.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let amqp_url = std::mem::take(&mut self.amqp_url);
        let prefix = std::mem::take(&mut self.prefix);
        let groups = std::mem::take(&mut *self.groups.lock().unwrap_or_else(|p| p.into_inner()));
        let queues = std::mem::take(&mut *self.queues.lock().unwrap_or_else(|p| p.into_inner()));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => return eprintln!("TopologyGuard: no runtime: {e}"),
            };
            runtime.block_on(async {
                let deletion = delete_topology(&amqp_url, &prefix, &groups, &queues);
                match tokio::time::timeout(DROP_DELETE_TIMEOUT, deletion).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!("TopologyGuard: deleting {prefix} {groups:?}: {e}"),
                    Err(_) => {
                        eprintln!("TopologyGuard: the broker did not answer; {prefix} left behind")
                    }
                }
            });
            let _ = done_tx.send(());
        });
        // The thread's own timeout bounds it; this one guards against a runtime that never
        // gets to it.
        if done_rx
            .recv_timeout(DROP_DELETE_TIMEOUT + Duration::from_secs(5))
            .is_ok()
        {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test that panics after declaring its topology leaves no queue behind: its guard deletes
    /// the topology while the panic unwinds. Needs the local RabbitMQ.
    #[tokio::test]
    async fn a_test_that_panics_leaves_no_queues_behind() {
        let prefix = unique("guard");
        let group = "guarded";
        let work_queue = Topology::new(prefix.as_str(), group).work_queue();
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let channel = connection.create_channel().await.expect("channel");
        let body = {
            let (prefix, work_queue) = (prefix.clone(), work_queue.clone());
            async move {
                let _topology = TopologyGuard::new(&amqp_url(), &prefix, &[group]);
                Topology::new(prefix.as_str(), group)
                    .declare(&channel)
                    .await
                    .expect("declare the topology");
                passive_declare(&channel, &work_queue)
                    .await
                    .expect("the work queue exists");
                panic!("the test fails before its end");
            }
        };
        let outcome = tokio::spawn(body).await;
        assert!(outcome.is_err_and(|e| e.is_panic()), "the body panicked");

        let channel = connection.create_channel().await.expect("channel");
        let after = passive_declare(&channel, &work_queue).await;
        let _ = connection.close(200, "test done".into()).await;
        match after {
            Ok(queue) => panic!(
                "{work_queue} is still there ({} messages)",
                queue.message_count()
            ),
            Err(e) => assert!(e.to_string().contains("NOT_FOUND"), "{e}"),
        }
    }
}
