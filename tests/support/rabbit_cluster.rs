//! A private RabbitMQ cluster on this machine: several [`PrivateRabbit`] nodes (own node names,
//! AMQP and distribution ports, data directories; one Erlang cookie, `rabbitmq`'s), joined to
//! the first one before any client connects, so every quorum queue declared afterwards has a
//! member on each node (RabbitMQ's default quorum size is 3). The chaos suite's cluster faults
//! stop or kill the node leading a queue ([`RabbitCluster::queue_leader`]) and start it again.
//!
//! Dropping the cluster stops every node and deletes its data.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::services::{PrivateRabbit, RabbitTls};

/// Most nodes a test cluster may have: each is an Erlang VM of about 100 MB on a 2-core machine.
pub const MAX_NODES: usize = 5;

/// A quorum queue as `rabbitmqctl list_queues` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumStatus {
    /// The node leading the queue's Raft group, if one is elected.
    pub leader: Option<String>,
    /// Every member node.
    pub members: Vec<String>,
    /// The members that are up.
    pub online: Vec<String>,
}

/// Several private nodes forming one cluster.
pub struct RabbitCluster {
    nodes: Vec<PrivateRabbit>,
    tls: bool,
}

impl RabbitCluster {
    /// Starts `size` nodes (each with a TLS listener when `tls` is given) and joins nodes 2…n
    /// to the first; returns once every node is a running member.
    pub fn start(size: usize, tls: Option<&RabbitTls>) -> anyhow::Result<RabbitCluster> {
        if !(1..=MAX_NODES).contains(&size) {
            bail!("a test cluster has 1 to {MAX_NODES} nodes, not {size}");
        }
        // Booting is mostly waiting for the VM: start the nodes side by side.
        let started: Vec<anyhow::Result<PrivateRabbit>> = std::thread::scope(|scope| {
            let booting: Vec<_> = (0..size)
                .map(|_| scope.spawn(|| PrivateRabbit::start_with(false, tls)))
                .collect();
            booting
                .into_iter()
                .map(|b| b.join().expect("a node's boot thread panicked"))
                .collect()
        });
        let mut nodes = started.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        let seed = nodes[0].node().to_owned();
        for node in &mut nodes[1..] {
            node.join_cluster(&seed)
                .with_context(|| format!("joining {} to {seed}", node.node()))?;
        }
        let cluster = RabbitCluster {
            nodes,
            tls: tls.is_some(),
        };
        cluster.wait_members(size, Duration::from_secs(60))?;
        Ok(cluster)
    }

    /// How many nodes the cluster has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (never: [`RabbitCluster::start`] starts at least one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `index`.
    pub fn node(&self, index: usize) -> &PrivateRabbit {
        &self.nodes[index]
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.node() == name)
    }

    /// Every node's client URL, in node order: `amqps://` of the TLS listeners when the
    /// cluster has them, else `amqp://`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| {
                if self.tls {
                    n.tls_url()
                        .expect("a TLS cluster's nodes have TLS listeners")
                } else {
                    n.url()
                }
            })
            .collect()
    }

    /// Stops node `index` cleanly.
    pub fn stop(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].stop()
    }

    /// SIGKILLs node `index`'s VM.
    pub fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].kill()
    }

    /// Stops every node cleanly, one after another (the whole broker goes down).
    pub fn stop_all(&mut self) -> anyhow::Result<()> {
        self.nodes.iter_mut().try_for_each(PrivateRabbit::stop)
    }

    /// SIGKILLs every node's VM.
    pub fn kill_all(&mut self) -> anyhow::Result<()> {
        self.nodes.iter_mut().try_for_each(PrivateRabbit::kill)
    }

    /// Starts every node that is down, side by side (a clustered node that was not the last
    /// one down waits at boot for the others), and waits until every node is a running member.
    pub fn start_stopped(&mut self) -> anyhow::Result<()> {
        std::thread::scope(|scope| {
            let booting: Vec<_> = self
                .nodes
                .iter_mut()
                .filter(|n| !n.is_running())
                .map(|n| scope.spawn(|| n.start_node()))
                .collect();
            booting
                .into_iter()
                .try_for_each(|b| b.join().expect("a node's boot thread panicked"))
        })?;
        self.wait_members(self.nodes.len(), Duration::from_secs(60))
    }

    /// A running node to ask about the cluster.
    fn any_running(&self) -> anyhow::Result<&PrivateRabbit> {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .context("no node of the cluster is running")
    }

    /// Waits until `count` nodes are running members of the cluster.
    fn wait_members(&self, count: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let output = self
                .any_running()?
                .ctl(&["cluster_status", "--formatter", "json"])
                .output()
                .context("running rabbitmqctl cluster_status")?;
            let running = serde_json::from_slice::<serde_json::Value>(&output.stdout)
                .ok()
                .and_then(|status| status["running_nodes"].as_array().map(Vec::len));
            if running == Some(count) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{count} running nodes expected within {timeout:?}; cluster_status says {}",
                    String::from_utf8_lossy(&output.stdout)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The quorum queue `queue` of the default vhost: leader, members, online members; `None`
    /// if it does not exist.
    pub fn quorum_status(&self, queue: &str) -> anyhow::Result<Option<QuorumStatus>> {
        let output = self
            .any_running()?
            .ctl(&[
                "list_queues",
                "name",
                "leader",
                "members",
                "online",
                "--formatter",
                "json",
            ])
            .output()
            .context("running rabbitmqctl list_queues")?;
        if !output.status.success() {
            bail!(
                "rabbitmqctl list_queues failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let queues: Vec<serde_json::Value> =
            serde_json::from_slice(&output.stdout).context("list_queues' JSON")?;
        let names = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(queues
            .iter()
            .find(|q| q["name"] == queue)
            .map(|q| QuorumStatus {
                leader: q["leader"].as_str().map(str::to_owned),
                members: names(&q["members"]),
                online: names(&q["online"]),
            }))
    }

    /// Waits until every member of quorum queue `queue` is online and one leads: a member
    /// node that was restarted has its queue replica running again, so the queue survives
    /// the next node going down.
    pub fn wait_queue_whole(&self, queue: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.quorum_status(queue)?;
            if let Some(s) = &status
                && s.leader.is_some()
                && !s.members.is_empty()
                && s.members.iter().all(|m| s.online.contains(m))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("quorum queue {queue} is not whole within {timeout:?}: {status:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The index of the node leading quorum queue `queue`, waiting up to `timeout` for the
    /// queue to exist and have a leader among the running nodes.
    pub fn queue_leader(&self, queue: &str, timeout: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.quorum_status(queue)?;
            if let Some(index) = status
                .as_ref()
                .and_then(|s| s.leader.as_deref())
                .and_then(|leader| self.index_of(leader))
                .filter(|&i| self.nodes[i].is_running())
            {
                return Ok(index);
            }
            if Instant::now() >= deadline {
                bail!("quorum queue {queue} has no leader on a running node: {status:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_size_outside_the_bound_is_refused_before_any_node_starts() {
        for size in [0, MAX_NODES + 1] {
            let error = RabbitCluster::start(size, None)
                .err()
                .expect("refused")
                .to_string();
            assert!(error.contains(&size.to_string()), "{error}");
        }
    }
}
