//! Prometheus metrics of one scheduler instance, served at `/metrics` (text format 0.0.4).
//!
//! Most figures are the cluster's, read from the database and the broker **at scrape time**, so
//! workers (other processes) need no exporter of their own for them. **Only the leader exports
//! the cluster's figures** (runs, lateness, outcomes, unfinished runs, workers, queues): a
//! follower exports those families without samples, so summing over instances counts each
//! figure once, and followers add no load to the database or the broker. An instance that stops
//! leading drops them (its counters restart from zero the next time it leads, which `rate`
//! treats as a reset). Every instance exports its own figures: `chime_is_leader`,
//! `chime_publish_confirm_seconds` (only a leader publishes), `chime_scrape_errors_total`, and
//! the lease's `chime_leader_term` (the same everywhere: aggregate it with `max`). An instance
//! without an elector (`Metrics::new(None, …)`) exports everything.
//!
//! * each fire's lateness to its handler's start (scheduled → started, read once the attempt's
//!   outcome is recorded: until then `started_at` is the claim's estimate) and its publish offset
//!   (published − scheduled: negative by design, as the dispatcher publishes a trigger its
//!   *lead* of 200 ms ahead of the instant; positive when published late), database clock,
//!   and the runs that finished, with their attempts and retries, are observed by a cursor that
//!   walks new runs by id, at most [`SCAN_LIMIT`] rows per scrape. A run counts as finished
//!   when it reaches a final state, or after [`SETTLE_AFTER`] (a run still running then is not
//!   counted in `chime_runs_finished_total`). The first scrape of a leader starts at the newest
//!   run: history is not replayed.
//!   Tasks (the runs of a broadcast, sharded or map/reduce fire) are observed like runs, but
//!   counted in `chime_tasks_finished_total`; their parent, never published nor run itself,
//!   only when it finishes.
//! * unfinished runs and tasks by job and state, workers online: one cheap query each
//!   (partial indexes).
//! * queue depth, consumers and parking-lot depth per group: from RabbitMQ's management API
//!   when `management_url` is set (then also unacknowledged messages), else passive declares
//!   (nothing is created); unknown queues are left out ([`crate::broker`]).
//!
//! Publish confirm latency is measured where it happens ([`crate::publish::CONFIRM_LATENCY`],
//! in the publish path) and only registered here; `chime_is_leader` comes from this instance's
//! elector.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use prometheus::core::Collector;
use prometheus::{
    Encoder as _, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tokio::sync::{Mutex, watch};

use crate::broker::Broker;
use crate::leader::Leadership;
use crate::publish::CONFIRM_LATENCY;
use crate::store::Store;

/// Most runs the lateness cursor reads per scrape.
pub const SCAN_LIMIT: i64 = 5000;
/// A run not final this long after it was created is no longer watched.
pub const SETTLE_AFTER: Duration = Duration::from_secs(600);

/// Every metric name `/metrics` exports (histograms also as `_bucket`, `_sum`, `_count`).
pub const METRIC_NAMES: &[&str] = &[
    "chime_fire_lateness_seconds",
    "chime_fire_publish_offset_seconds",
    "chime_child_advance_seconds",
    "chime_workflow_advance_seconds",
    "chime_workflow_runs_finished_total",
    "chime_runs_finished_total",
    "chime_runs_active",
    "chime_tasks_finished_total",
    "chime_tasks_active",
    "chime_attempts_total",
    "chime_retries_total",
    "chime_publish_confirm_seconds",
    "chime_queue_depth",
    "chime_queue_consumers",
    "chime_queue_unacked",
    "chime_parking_lot_depth",
    "chime_is_leader",
    "chime_leader_term",
    "chime_workers_online",
    "chime_scrape_errors_total",
];

/// Buckets of `chime_fire_publish_offset_seconds`: fine around the base lead (−200 ms), coarser
/// out to the longest lead of a large burst (−3 s), then lateness as for
/// `chime_fire_lateness_seconds`.
pub const PUBLISH_OFFSET_BUCKETS: &[f64] = &[
    -3.0, -2.0, -1.0, -0.5, -0.25, -0.22, -0.2, -0.18, -0.15, -0.1, -0.05, -0.01, 0.0, 0.01, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// One instance's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    lateness: HistogramVec,
    publish_offset: HistogramVec,
    advance: HistogramVec,
    workflow_advance: HistogramVec,
    workflow_finished: IntCounterVec,
    finished: IntCounterVec,
    attempts: IntCounterVec,
    retries: IntCounterVec,
    active: IntGaugeVec,
    tasks_finished: IntCounterVec,
    tasks_active: IntGaugeVec,
    queue_depth: IntGaugeVec,
    queue_consumers: IntGaugeVec,
    queue_unacked: IntGaugeVec,
    parking_depth: IntGaugeVec,
    is_leader: IntGauge,
    term: IntGauge,
    workers: IntGaugeVec,
    scrape_errors: IntCounterVec,
    cursor: Mutex<RunCursor>,
    leadership: Option<watch::Receiver<Leadership>>,
    broker: Option<Broker>,
}

/// Where the run observer is: every run with an id up to `after` is accounted for; `seen`
/// holds what was already observed of newer runs.
#[derive(Debug, Default)]
struct RunCursor {
    after: Option<i64>,
    seen: HashMap<i64, Seen>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    published: bool,
    started: bool,
    counted: bool,
}

impl Metrics {
    /// Metrics of an instance whose leadership `leadership` reports, with queues of `broker`.
    pub fn new(
        leadership: Option<watch::Receiver<Leadership>>,
        broker: Option<Broker>,
    ) -> anyhow::Result<Metrics> {
        let registry = Registry::new();
        let lateness = HistogramVec::new(
            HistogramOpts::new(
                "chime_fire_lateness_seconds",
                "Lateness of fires: scheduled instant to started (stage=\"started\": the \
                 handler's start as the worker recorded it with the outcome), database clock.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0,
            ]),
            &["stage"],
        )?;
        let publish_offset = HistogramVec::new(
            HistogramOpts::new(
                "chime_fire_publish_offset_seconds",
                "Published (broker confirm recorded) minus the scheduled instant, database \
                 clock: about minus the dispatcher's lead (200 ms, up to 3 s for an instant \
                 with many runs) while triggers go out ahead of their instant, positive when \
                 published late.",
            )
            .buckets(PUBLISH_OFFSET_BUCKETS.to_vec()),
            &[],
        )?;
        let advance = HistogramVec::new(
            HistogramOpts::new(
                "chime_child_advance_seconds",
                "Child runs (trigger child): their upstream run's end to the child's handler \
                 start as the worker recorded it with the outcome, database clock \
                 (docs/runs.md, \"Child runs\").",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &[],
        )?;
        let workflow_advance = HistogramVec::new(
            HistogramOpts::new(
                "chime_workflow_advance_seconds",
                "Workflow node runs made by an advance: the latest end among the other nodes of \
                 their workflow run before they were made, to their handler's start as the \
                 worker recorded it, database clock (docs/workflows.md). A workflow's first \
                 nodes are not observed.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &[],
        )?;
        let workflow_finished = IntCounterVec::new(
            Opts::new(
                "chime_workflow_runs_finished_total",
                "Workflow runs that ended, by workflow and state (succeeded, failed, cancelled, \
                 skipped); also counted in chime_runs_finished_total under the workflow's name.",
            ),
            &["workflow", "state"],
        )?;
        let finished = IntCounterVec::new(
            Opts::new(
                "chime_runs_finished_total",
                "Top-level runs (fires; tasks are in chime_tasks_finished_total) that reached a \
                 final state, by job and state.",
            ),
            &["job", "state"],
        )?;
        let attempts = IntCounterVec::new(
            Opts::new(
                "chime_attempts_total",
                "Attempts of finished runs and tasks, by job.",
            ),
            &["job"],
        )?;
        let retries = IntCounterVec::new(
            Opts::new(
                "chime_retries_total",
                "Attempts after the first of finished runs and tasks, by job.",
            ),
            &["job"],
        )?;
        let active = IntGaugeVec::new(
            Opts::new(
                "chime_runs_active",
                "Unfinished top-level runs (pending, queued, running, retrying) by job and \
                 state; tasks are in chime_tasks_active.",
            ),
            &["job", "state"],
        )?;
        let tasks_finished = IntCounterVec::new(
            Opts::new(
                "chime_tasks_finished_total",
                "Tasks of broadcast, sharded and map/reduce runs that reached a final state, by \
                 job and state.",
            ),
            &["job", "state"],
        )?;
        let tasks_active = IntGaugeVec::new(
            Opts::new(
                "chime_tasks_active",
                "Unfinished tasks (pending, queued, running, retrying) by job and state.",
            ),
            &["job", "state"],
        )?;
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "chime_queue_depth",
                "Ready messages in each group's work queue.",
            ),
            &["group"],
        )?;
        let queue_consumers = IntGaugeVec::new(
            Opts::new(
                "chime_queue_consumers",
                "Consumers of each group's work queue.",
            ),
            &["group"],
        )?;
        let queue_unacked = IntGaugeVec::new(
            Opts::new(
                "chime_queue_unacked",
                "Messages of each group's work queue delivered and not yet acknowledged (only \
                 while queue figures come from the management API).",
            ),
            &["group"],
        )?;
        let parking_depth = IntGaugeVec::new(
            Opts::new(
                "chime_parking_lot_depth",
                "Messages in each group's parking lot (dead letters).",
            ),
            &["group"],
        )?;
        let is_leader = IntGauge::new("chime_is_leader", "1 while this instance leads.")?;
        let term = IntGauge::new("chime_leader_term", "The leader lease's current term.")?;
        let workers = IntGaugeVec::new(
            Opts::new("chime_workers_online", "Workers heartbeating, by group."),
            &["group"],
        )?;
        let scrape_errors = IntCounterVec::new(
            Opts::new(
                "chime_scrape_errors_total",
                "Failures to read a source of metrics at scrape time.",
            ),
            &["source"],
        )?;
        registry.register(Box::new(lateness.clone()))?;
        registry.register(Box::new(publish_offset.clone()))?;
        registry.register(Box::new(advance.clone()))?;
        registry.register(Box::new(workflow_advance.clone()))?;
        registry.register(Box::new(workflow_finished.clone()))?;
        registry.register(Box::new(finished.clone()))?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(active.clone()))?;
        registry.register(Box::new(tasks_finished.clone()))?;
        registry.register(Box::new(tasks_active.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(queue_consumers.clone()))?;
        registry.register(Box::new(queue_unacked.clone()))?;
        registry.register(Box::new(parking_depth.clone()))?;
        registry.register(Box::new(is_leader.clone()))?;
        registry.register(Box::new(term.clone()))?;
        registry.register(Box::new(workers.clone()))?;
        registry.register(Box::new(scrape_errors.clone()))?;
        registry.register(Box::new(CONFIRM_LATENCY.clone()))?;
        // Make every labelled family visible before its first sample, so dashboards and
        // alerts find the name.
        lateness.with_label_values(&["started"]);
        publish_offset.with_label_values::<&str>(&[]);
        advance.with_label_values::<&str>(&[]);
        workflow_advance.with_label_values::<&str>(&[]);
        for source in ["runs", "database", "broker"] {
            scrape_errors.with_label_values(&[source]);
        }
        Ok(Metrics {
            registry,
            lateness,
            publish_offset,
            advance,
            workflow_advance,
            workflow_finished,
            finished,
            attempts,
            retries,
            active,
            tasks_finished,
            tasks_active,
            queue_depth,
            queue_consumers,
            queue_unacked,
            parking_depth,
            is_leader,
            term,
            workers,
            scrape_errors,
            cursor: Mutex::new(RunCursor::default()),
            leadership,
            broker,
        })
    }

    /// The names of every metric registered (whether or not it has samples yet).
    pub fn names(&self) -> Vec<String> {
        let collectors: [&dyn Collector; 20] = [
            &self.lateness,
            &self.publish_offset,
            &self.advance,
            &self.workflow_advance,
            &self.workflow_finished,
            &self.finished,
            &self.attempts,
            &self.retries,
            &self.active,
            &self.tasks_finished,
            &self.tasks_active,
            &self.queue_depth,
            &self.queue_consumers,
            &self.queue_unacked,
            &self.parking_depth,
            &self.is_leader,
            &self.term,
            &self.workers,
            &self.scrape_errors,
            &*CONFIRM_LATENCY,
        ];
        collectors
            .iter()
            .flat_map(|c| c.desc())
            .map(|d| d.fq_name.clone())
            .collect()
    }

    /// Refreshes the scrape-time figures and renders every metric as Prometheus text.
    pub async fn render(&self, store: &Store) -> anyhow::Result<String> {
        // Leading as the elector last decided (not the narrower trust window), so a late
        // renewal does not reset the counters.
        let exports_cluster = self
            .leadership
            .as_ref()
            .is_none_or(|l| matches!(*l.borrow(), Leadership::Leader { .. }));
        if exports_cluster {
            if let Err(e) = self.observe_runs(store).await {
                tracing::warn!(error = %format!("{e:#}"), "metrics: reading new runs failed");
                self.scrape_errors.with_label_values(&["runs"]).inc();
            }
            if let Err(e) = self.refresh_database(store).await {
                tracing::warn!(error = %format!("{e:#}"), "metrics: reading the database failed");
                self.scrape_errors.with_label_values(&["database"]).inc();
            }
            if let Err(e) = self.refresh_queues(store).await {
                tracing::debug!(error = %format!("{e:#}"), "metrics: reading queues failed");
                self.scrape_errors.with_label_values(&["broker"]).inc();
            }
        } else {
            self.drop_cluster_figures().await;
        }
        match store.leader().await {
            Ok(leader) => self.term.set(leader.term),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "metrics: reading the lease failed");
                self.scrape_errors.with_label_values(&["database"]).inc();
            }
        }
        self.is_leader
            .set(i64::from(self.leadership.as_ref().is_some_and(|l| {
                l.borrow().term_at(tokio::time::Instant::now()).is_some()
            })));
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .context("encoding metrics")?;
        String::from_utf8(text).context("metrics text is not UTF-8")
    }

    async fn observe_runs(&self, store: &Store) -> anyhow::Result<()> {
        let mut cursor = self.cursor.lock().await;
        let Some(after) = cursor.after else {
            cursor.after = Some(store.newest_run_id().await?);
            return Ok(());
        };
        let rows = store.runs_after(after, SCAN_LIMIT, SETTLE_AFTER).await?;
        let mut settled_prefix = true;
        for run in rows {
            let seen = cursor.seen.entry(run.id).or_default();
            // A parent run is neither published nor run: its tasks are, and are observed.
            if run.has_tasks {
                seen.published = true;
                seen.started = true;
            }
            if let Some(at) = run.published_at
                && !seen.published
            {
                seen.published = true;
                self.publish_offset
                    .with_label_values::<&str>(&[])
                    .observe(seconds(at - run.scheduled_at));
            }
            if let Some(at) = run.started_at
                && !seen.started
            {
                seen.started = true;
                self.lateness
                    .with_label_values(&["started"])
                    .observe(seconds(at - run.scheduled_at));
                if let Some(ended) = run.upstream_finished_at {
                    self.advance
                        .with_label_values::<&str>(&[])
                        .observe(seconds(at - ended));
                }
                if let Some(ended) = run.node_wait_from {
                    self.workflow_advance
                        .with_label_values::<&str>(&[])
                        .observe(seconds(at - ended));
                }
            }
            if run.is_final && !seen.counted {
                seen.counted = true;
                let finished = if run.is_task {
                    &self.tasks_finished
                } else {
                    &self.finished
                };
                finished.with_label_values(&[&run.job, &run.state]).inc();
                if run.is_workflow {
                    self.workflow_finished
                        .with_label_values(&[&run.job, &run.state])
                        .inc();
                }
                let attempts = u64::try_from(run.attempt).unwrap_or(0);
                self.attempts
                    .with_label_values(&[&run.job])
                    .inc_by(attempts);
                self.retries
                    .with_label_values(&[&run.job])
                    .inc_by(attempts.saturating_sub(1));
            }
            if !(run.is_final || run.settled) {
                settled_prefix = false;
            } else if settled_prefix {
                cursor.after = Some(run.id);
            }
        }
        let after = cursor.after.unwrap_or(0);
        cursor.seen.retain(|id, _| *id > after);
        Ok(())
    }

    /// A follower's: no samples of the cluster's figures, and a cursor that starts afresh at the
    /// newest run once this instance leads.
    async fn drop_cluster_figures(&self) {
        let mut cursor = self.cursor.lock().await;
        *cursor = RunCursor::default();
        self.lateness.reset();
        self.lateness.with_label_values(&["started"]);
        self.publish_offset.reset();
        self.publish_offset.with_label_values::<&str>(&[]);
        for histogram in [&self.advance, &self.workflow_advance] {
            histogram.reset();
            histogram.with_label_values::<&str>(&[]);
        }
        for family in [
            &self.workflow_finished,
            &self.finished,
            &self.tasks_finished,
            &self.attempts,
            &self.retries,
        ] {
            family.reset();
        }
        for family in [
            &self.active,
            &self.tasks_active,
            &self.queue_depth,
            &self.queue_consumers,
            &self.queue_unacked,
            &self.parking_depth,
            &self.workers,
        ] {
            family.reset();
        }
    }

    async fn refresh_database(&self, store: &Store) -> anyhow::Result<()> {
        let active = store.active_run_counts().await?;
        self.active.reset();
        self.tasks_active.reset();
        for (job, state, is_task, count) in active {
            let family = if is_task {
                &self.tasks_active
            } else {
                &self.active
            };
            family.with_label_values(&[&job, &state]).set(count);
        }
        self.workers.reset();
        for (group, count) in store.workers_online().await? {
            self.workers.with_label_values(&[&group]).set(count);
        }
        Ok(())
    }

    async fn refresh_queues(&self, store: &Store) -> anyhow::Result<()> {
        let Some(broker) = &self.broker else {
            return Ok(());
        };
        let groups = store.groups().await?;
        let names: Vec<String> = groups
            .iter()
            .flat_map(|group| {
                let topology = chime_protocol::Topology::new(&broker.queue_prefix, group);
                [topology.work_queue(), topology.parking_queue()]
            })
            .collect();
        let figures = broker.queue_figures(&names).await?;
        self.queue_depth.reset();
        self.queue_consumers.reset();
        self.queue_unacked.reset();
        self.parking_depth.reset();
        for group in groups {
            let topology = chime_protocol::Topology::new(&broker.queue_prefix, &group);
            if let Some(work) = figures.queues.get(&topology.work_queue()) {
                self.queue_depth
                    .with_label_values(&[&group])
                    .set(i64::from(work.ready));
                self.queue_consumers
                    .with_label_values(&[&group])
                    .set(i64::from(work.consumers));
                if let Some(unacked) = work.unacked {
                    self.queue_unacked
                        .with_label_values(&[&group])
                        .set(i64::from(unacked));
                }
            }
            if let Some(parking) = figures.queues.get(&topology.parking_queue()) {
                self.parking_depth
                    .with_label_values(&[&group])
                    .set(i64::from(parking.ready));
            }
        }
        Ok(())
    }
}

fn seconds(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().map_or(0.0, |us| us as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    //! Which instance exports what, against a real database (`#[sqlx::test]`).

    use sqlx::PgPool;

    use super::*;
    use crate::config::validate_job;

    fn has_sample(text: &str, prefix: &str) -> bool {
        text.lines().any(|l| l.starts_with(prefix))
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn only_the_leader_exports_the_clusters_figures(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let job = validate_job(
            serde_json::json!({"name": "report", "group": "g1"})
                .as_object()
                .expect("object"),
        )
        .expect("job");
        store.sync_config_jobs(&[job]).await.expect("jobs");
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt)
             VALUES ('report', 'g1', now(), 'manual', 'pending', 0)",
        )
        .execute(&pool)
        .await
        .expect("run");
        let (leadership, watched) = watch::channel(Leadership::Follower);
        let metrics = Metrics::new(Some(watched), None).expect("metrics");
        let active = "chime_runs_active{job=\"report\",state=\"pending\"} 1";

        let follower = metrics.render(&store).await.expect("render");
        assert!(!has_sample(&follower, "chime_runs_active"), "{follower}");
        assert!(has_sample(&follower, "chime_is_leader 0"), "{follower}");
        assert!(has_sample(&follower, "chime_leader_term "), "{follower}");

        leadership.send_replace(Leadership::Leader {
            term: 1,
            trusted_until: tokio::time::Instant::now() + Duration::from_secs(60),
        });
        let leader = metrics.render(&store).await.expect("render");
        assert!(leader.contains(active), "{leader}");
        assert!(has_sample(&leader, "chime_is_leader 1"), "{leader}");

        // Deposed: the figures go, so a sum over instances counts them once.
        leadership.send_replace(Leadership::Follower);
        let deposed = metrics.render(&store).await.expect("render");
        assert!(!has_sample(&deposed, "chime_runs_active"), "{deposed}");

        // Without an elector (a single process), everything is exported.
        let alone = Metrics::new(None, None).expect("metrics");
        let text = alone.render(&store).await.expect("render");
        assert!(text.contains(active), "{text}");
    }

    /// A fire of a sharded job counts once among runs, its tasks among tasks.
    #[sqlx::test(migrations = "../migrations")]
    async fn tasks_are_counted_apart_from_runs(pool: PgPool) {
        use crate::store::tests_tasks::{set_task, sharded_run};
        let store = Store::from_pool(pool.clone());
        let metrics = Metrics::new(None, None).expect("metrics");
        // The first scrape starts the cursor at the newest run.
        metrics.render(&store).await.expect("render");
        let (_, tasks) = sharded_run(&pool, "shard", 4, None).await;
        set_task(&pool, tasks[0], "running", Some("w1"), None).await;
        set_task(&pool, tasks[1], "succeeded", Some("w1"), None).await;
        set_task(&pool, tasks[2], "failed", Some("w1"), None).await;
        let text = metrics.render(&store).await.expect("render");
        for line in [
            "chime_runs_active{job=\"shard\",state=\"running\"} 1",
            "chime_tasks_active{job=\"shard\",state=\"running\"} 1",
            "chime_tasks_active{job=\"shard\",state=\"queued\"} 1",
            "chime_tasks_finished_total{job=\"shard\",state=\"succeeded\"} 1",
            "chime_tasks_finished_total{job=\"shard\",state=\"failed\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(
            !text.contains("chime_runs_finished_total{job=\"shard\""),
            "tasks are not runs: {text}"
        );
        set_task(&pool, tasks[0], "succeeded", None, None).await;
        set_task(&pool, tasks[3], "succeeded", Some("w1"), None).await;
        let text = metrics.render(&store).await.expect("render");
        assert!(
            text.contains("chime_runs_finished_total{job=\"shard\",state=\"failed\"} 1"),
            "the fire, once: {text}"
        );
        assert!(!has_sample(&text, "chime_tasks_active"), "{text}");
    }

    /// A child run's start is observed against its upstream run's end, once; other runs add
    /// no sample.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_child_runs_advance_is_observed_from_its_upstreams_end(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let metrics = Metrics::new(None, None).expect("metrics");
        metrics.render(&store).await.expect("render");
        let upstream: i64 = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                     started_at, finished_at)
             VALUES ('a', 'g', now(), 'manual', 'succeeded', 1, now() - interval '2 s',
                     now() - interval '1 s') RETURNING id",
        )
        .fetch_one(&pool)
        .await
        .expect("upstream");
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                     started_at, finished_at, upstream_run_id)
             VALUES ('b', 'g', now(), 'child', 'succeeded', 1, now() - interval '970 ms', now(),
                     $1)",
        )
        .bind(upstream)
        .execute(&pool)
        .await
        .expect("child");
        let text = metrics.render(&store).await.expect("render");
        assert!(
            text.contains("chime_child_advance_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("chime_child_advance_seconds_bucket{le=\"0.025\"} 0")
                && text.contains("chime_child_advance_seconds_bucket{le=\"0.05\"} 1"),
            "30 ms: {text}"
        );
        let again = metrics.render(&store).await.expect("render");
        assert!(
            again.contains("chime_child_advance_seconds_count 1"),
            "once: {again}"
        );
    }
    /// A node run made by an advance is observed from the latest end among its workflow run's
    /// other nodes before it was made; a first node is not; the workflow run counts by state.
    #[sqlx::test(migrations = "../migrations")]
    async fn a_node_runs_advance_and_a_workflow_runs_end_are_observed(pool: PgPool) {
        let store = Store::from_pool(pool.clone());
        let metrics = Metrics::new(None, None).expect("metrics");
        metrics.render(&store).await.expect("render");
        crate::store::insert_test_job(
            &pool,
            "wf",
            serde_json::json!({"name": "wf", "kind": "workflow",
                               "nodes": [{"name": "a", "job": "a"}]}),
        )
        .await;
        let wf: i64 = sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state,
                                     finished_at)
             VALUES ('wf', '', now(), 'manual', 'succeeded', now()) RETURNING id",
        )
        .fetch_one(&pool)
        .await
        .expect("workflow run");
        sqlx::query(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, state, attempt,
                                     workflow_run_id, node, node_round, created_at, started_at,
                                     finished_at)
             VALUES ('a', 'g', now(), 'workflow', 'succeeded', 1, $1, 'a', 0,
                     now() - interval '3 s', now() - interval '2 s', now() - interval '1 s'),
                    ('b', 'g', now(), 'workflow', 'succeeded', 1, $1, 'b', 0,
                     now() - interval '990 ms', now() - interval '970 ms', now())",
        )
        .bind(wf)
        .execute(&pool)
        .await
        .expect("node runs");
        let text = metrics.render(&store).await.expect("render");
        assert!(
            text.contains("chime_workflow_advance_seconds_count 1"),
            "only b was made after another node ended: {text}"
        );
        assert!(
            text.contains("chime_workflow_advance_seconds_bucket{le=\"0.025\"} 0")
                && text.contains("chime_workflow_advance_seconds_bucket{le=\"0.05\"} 1"),
            "30 ms: {text}"
        );
        assert!(
            text.contains(
                "chime_workflow_runs_finished_total{state=\"succeeded\",workflow=\"wf\"} 1"
            ),
            "{text}"
        );
        assert!(
            !text
                .contains("chime_workflow_runs_finished_total{state=\"succeeded\",workflow=\"a\"}"),
            "node runs are not workflow runs: {text}"
        );
    }
}
