//! The broker as the operations surface sees it: where it is ([`Broker`]), and each queue's
//! figures, read from RabbitMQ's management HTTP API when `management_url` is set and answers,
//! else from passive queue declares (which create nothing).
//!
//! The management API gives what a passive declare cannot: unacknowledged messages and message
//! rates. Its figures are the broker's statistics, sampled every `collect_statistics_interval`
//! (5 s by default), so they may lag by that much; a passive declare is exact at the moment it
//! runs. Any failure of the management API (refused, slow, unauthorized, incomplete) falls back
//! to passive declares, and the answer says which source it used and why it fell back.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::parking::ParkingLot;
use crate::store::redact;

/// Longest a management API request may take before passive declares are used instead.
pub const MANAGEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the broker is, for the operations that talk to it (cancel, dead letters, queues,
/// metrics). `Debug` hides the password.
#[derive(Clone)]
pub struct Broker {
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// Queue and exchange name prefix.
    pub queue_prefix: String,
    management: Option<Arc<Result<Management, String>>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("amqp_url", &redact(&self.amqp_url))
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
    /// The broker at `amqp_url`, with names under `queue_prefix`; queue figures come from
    /// passive declares until [`Broker::with_management_url`] names a management API.
    pub fn new(amqp_url: impl Into<String>, queue_prefix: impl Into<String>) -> Broker {
        Broker {
            amqp_url: amqp_url.into(),
            queue_prefix: queue_prefix.into(),
            management: None,
        }
    }

    /// Reads queue figures from the management HTTP API at `url` (such as
    /// `http://127.0.0.1:15672`), as the AMQP URL's user, in its virtual host; `None` keeps
    /// passive declares.
    pub fn with_management_url(mut self, url: Option<&str>) -> Broker {
        self.management = url.map(|url| {
            Arc::new(Management::new(url, &self.amqp_url).map_err(|e| format!("{e:#}")))
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
        let lot = ParkingLot::connect(&self.amqp_url, &self.queue_prefix).await?;
        let mut queues = HashMap::new();
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
        lot.close().await;
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
        let amqp = lapin::uri::AMQPUri::from_str(amqp_url)
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
            user: amqp.authority.userinfo.username,
            password: amqp.authority.userinfo.password,
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
