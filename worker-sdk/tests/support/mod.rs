//! Test support of the worker's tests: on top of the test kit (`chime-test-kit`: its own
//! database, prefix and group, waits, captured events), the group's topology on the real
//! RabbitMQ, runs in the test's own database and a scheduler-like publisher.

#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use chime_protocol::topology::control_exchange;
use chime_protocol::wire::{
    CONTENT_TYPE, ControlMessage, HEADER_ATTEMPT, PROTOCOL_VERSION, RetryPolicy,
};
use chime_protocol::{Topology, Trigger};
use chime_test_kit::{Setup, done_if, passive_declare, wait_for};
use chime_worker::{CancellationToken, Worker, WorkerBuilder, WorkerError};
use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use serde_json::Value;
use sqlx::PgPool;
use tokio::task::JoinHandle;

/// How long any awaited condition may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// One test's world: the kit's [`Setup`] (its database, its own prefix and group, deleted at
/// the end; `env.pool`, `env.prefix`, `env.group` reach it), the group's topology, declared,
/// and a publishing channel.
pub struct Env {
    setup: Setup,
    pub topology: Topology,
    connection: Connection,
    pub channel: Channel,
    /// Ids of the workers built here: their own queues (which outlive a worker, for its
    /// restart under the same id) are deleted at cleanup.
    worker_ids: std::sync::Mutex<Vec<String>>,
}

impl std::ops::Deref for Env {
    type Target = Setup;

    fn deref(&self) -> &Setup {
        &self.setup
    }
}

/// A row of `chime_runs`, as tests look at it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    pub id: i64,
    pub state: String,
    pub reason: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A row of `chime_attempts`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRow {
    pub attempt: i32,
    pub worker_id: String,
    pub state: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<i64>,
    pub error: Option<String>,
}

/// A running worker under test.
pub struct Running {
    pub shutdown: CancellationToken,
    pub handle: JoinHandle<Result<(), WorkerError>>,
}

impl Running {
    /// Requests a shutdown and waits for `run` to return.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.join().await;
    }

    /// Waits for `run` to return (after a shutdown was requested).
    pub async fn join(self) {
        tokio::time::timeout(WAIT, self.handle)
            .await
            .expect("worker did not stop in time")
            .expect("worker task panicked")
            .expect("worker failed");
    }
}

impl Env {
    pub async fn new(pool: PgPool) -> Env {
        let setup = Setup::new(&pool);
        let topology = Topology::new(setup.prefix.as_str(), setup.group.as_str());
        let (connection, channel) = chime_test_kit::confirm_channel(&setup.amqp_url).await;
        topology.declare(&channel).await.unwrap();
        Env {
            setup,
            topology,
            connection,
            channel,
            worker_ids: std::sync::Mutex::default(),
        }
    }

    /// A builder for a worker of this test's group, with quick heartbeats.
    pub fn worker(&self) -> WorkerBuilder {
        let id = chime_test_kit::unique("w");
        self.delete_worker_queue_at_cleanup(&id);
        Worker::builder(self.group.as_str())
            .pool(self.pool.clone())
            .prefix(self.prefix.as_str())
            .amqp_url(self.amqp_url.as_str())
            .worker_id(id)
            .heartbeat_interval(Duration::from_millis(200))
    }

    /// Deletes worker `id`'s own queue at [`Env::cleanup`] (for a worker given an id of the
    /// test's own).
    pub fn delete_worker_queue_at_cleanup(&self, id: &str) {
        self.worker_ids.lock().unwrap().push(id.to_owned());
    }

    /// Starts `worker` in a task.
    pub fn start(&self, worker: Worker) -> Running {
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        Running { shutdown, handle }
    }

    /// Inserts a queued run of `job`, as the scheduler would, and returns its id.
    pub async fn insert_run(&self, job: &str, params: &Value) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO chime_runs (job_name, group_name, scheduled_at, trigger, params, state)
             VALUES ($1, $2, now(), 'manual', $3, 'queued') RETURNING id",
        )
        .bind(job)
        .bind(&self.group)
        .bind(params)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn scheduled_at(&self, run_id: i64) -> DateTime<Utc> {
        sqlx::query_scalar("SELECT scheduled_at FROM chime_runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The trigger the scheduler would publish for run `run_id`.
    pub async fn trigger(&self, run_id: i64, job: &str, params: Value) -> Trigger {
        Trigger {
            v: PROTOCOL_VERSION,
            run_id,
            job: job.to_owned(),
            group: self.group.clone(),
            attempt: 1,
            scheduled_at: self.scheduled_at(run_id).await,
            params,
            timeout_ms: None,
            retry: None,
            task: None,
        }
    }

    /// Inserts a run and publishes its trigger; returns the run id.
    pub async fn submit(&self, job: &str, params: Value) -> i64 {
        let run_id = self.insert_run(job, &params).await;
        let trigger = self.trigger(run_id, job, params).await;
        self.publish(&trigger).await;
        run_id
    }

    /// Publishes a trigger the way the scheduler does.
    pub async fn publish(&self, trigger: &Trigger) {
        self.publish_with_headers(trigger, FieldTable::default())
            .await;
    }

    /// Publishes a trigger with extra headers (a not-before instant, a forged delivery count).
    /// As the scheduler publishes a run's retry policy snapshot, the run (if any) gets the
    /// trigger's policy as its snapshot first: the worker's retry decision
    /// (`chime_retry_decision`) reads the snapshot.
    pub async fn publish_with_headers(&self, trigger: &Trigger, mut headers: FieldTable) {
        sqlx::query("UPDATE chime_runs SET retry_policy = $2 WHERE id = $1")
            .bind(trigger.run_id)
            .bind(snapshot_of(trigger.retry.as_ref()))
            .execute(&self.pool)
            .await
            .unwrap();
        headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongUInt(trigger.attempt));
        self.publish_raw(&trigger.to_body(), Some(trigger.run_id), headers)
            .await;
    }

    /// Requests the cancellation of run `run_id` as `chime runs cancel` does for a running run:
    /// sets `cancel_requested_at`, then publishes the control message to every worker.
    pub async fn cancel(&self, run_id: i64) {
        self.request_cancel(run_id).await;
        chime_protocol::topology::declare_control(&self.channel, &self.prefix)
            .await
            .unwrap();
        let body = serde_json::to_vec(&ControlMessage::CancelRun { run_id }).unwrap();
        let confirm = self
            .channel
            .basic_publish(
                control_exchange(&self.prefix).as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default().with_content_type(CONTENT_TYPE.into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(matches!(confirm, Confirmation::Ack(None)), "{confirm:?}");
    }

    /// Sets the run's `cancel_requested_at` (and nothing else).
    pub async fn request_cancel(&self, run_id: i64) {
        sqlx::query(
            "UPDATE chime_runs SET cancel_requested_at = now(), cancel_requested_by = 'test'
              WHERE id = $1",
        )
        .bind(run_id)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// Publishes `body` to the work queue (persistent, mandatory, confirmed), retrying while it
    /// is unroutable (a worker may be re-declaring the queue).
    pub async fn publish_raw(&self, body: &[u8], message_id: Option<i64>, headers: FieldTable) {
        let mut properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = message_id {
            properties = properties.with_message_id(id.to_string().into());
        }
        chime_test_kit::publish_routed(
            &self.channel,
            &self.topology.exchange(),
            chime_protocol::topology::WORK_KEY,
            body,
            &properties,
        )
        .await;
    }

    /// Whether `queue` exists (a passive declare on a channel of its own, since a missing
    /// queue closes the channel).
    pub async fn queue_exists(&self, queue: &str) -> bool {
        let channel = self.connection.create_channel().await.unwrap();
        let found = passive_declare(&channel, queue).await.is_ok();
        if found {
            let _ = channel.close(200, "done".into()).await;
        }
        found
    }

    /// `(ready messages, consumers)` of `queue` (passive declare: the queue must exist).
    pub async fn queue_state(&self, queue: &str) -> (u32, u32) {
        let q = passive_declare(&self.channel, queue).await.unwrap();
        (q.message_count(), q.consumer_count())
    }

    /// Takes the next message from the parking lot (acked), if any.
    pub async fn take_parked(&self) -> Option<Delivery> {
        let got = self
            .channel
            .basic_get(
                self.topology.parking_queue().as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap();
        got.map(|m| m.delivery)
    }

    pub async fn run(&self, run_id: i64) -> RunRow {
        sqlx::query_as(
            "SELECT id, state, reason, next_attempt_at, attempt, worker_id, error, started_at,
                    finished_at
               FROM chime_runs WHERE id = $1",
        )
        .bind(run_id)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Waits until run `run_id` is in `state`.
    pub async fn run_in_state(&self, run_id: i64, state: &str) -> RunRow {
        wait_for(
            WAIT,
            &format!("run {run_id} to be {state}"),
            || async move { done_if(self.run(run_id).await, |run| run.state == state) },
        )
        .await
    }

    pub async fn attempts(&self, run_id: i64) -> Vec<AttemptRow> {
        sqlx::query_as(
            "SELECT attempt, worker_id, state, started_at, finished_at, duration_ms, error
               FROM chime_attempts WHERE run_id = $1 ORDER BY attempt",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// `(attempt, level, message)` of the run's stored log lines, in order.
    pub async fn logs(&self, run_id: i64) -> Vec<(i32, String, String)> {
        sqlx::query_as(
            "SELECT attempt, level, message FROM chime_run_logs WHERE run_id = $1 ORDER BY id",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Deletes the test's exchange and queues now (they are deleted anyway when a failed
    /// test drops its `Env`).
    pub async fn cleanup(self) {
        let ids = std::mem::take(&mut *self.worker_ids.lock().unwrap());
        for id in ids {
            let queue = self.topology.worker_queue(&id);
            let options = lapin::options::QueueDeleteOptions::default();
            self.channel
                .queue_delete(queue.as_str().into(), options)
                .await
                .unwrap();
        }
        let _ = self.connection.close(200, "test done".into()).await;
        self.setup.finish().await;
    }
}

/// A run's `retry_policy` snapshot (the job file's form) for the policy a trigger carries
/// (none: one attempt).
pub fn snapshot_of(policy: Option<&RetryPolicy>) -> Value {
    match policy {
        None => serde_json::json!({"max_attempts": 1}),
        Some(p) => serde_json::json!({
            "max_attempts": p.max_attempts,
            "initial": format!("{}ms", p.initial_ms),
            "multiplier": p.multiplier,
            "max": format!("{}ms", p.max_ms),
            "jitter": p.jitter,
        }),
    }
}

/// A retry policy without jitter.
pub fn policy(max_attempts: u32, initial_ms: u64, multiplier: f64, max_ms: u64) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_ms,
        multiplier,
        max_ms,
        jitter: false,
    }
}

/// The text of header `name`, if it is a string.
pub fn header(delivery: &Delivery, name: &str) -> Option<String> {
    let headers = delivery.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}
