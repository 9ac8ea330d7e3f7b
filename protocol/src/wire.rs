//! The wire contract between the scheduler and workers: the trigger message, the name of every
//! header either side writes or reads, and the control messages.
//!
//! Only these types go on the wire. They are versioned (`v`) and documented in `docs/protocol.md`
//! so that workers in other languages can join; change them only by adding optional fields or by
//! bumping [`PROTOCOL_VERSION`]. Each header's value type is written and read in one place,
//! `headers` (feature `amqp`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::limits::MAX_TRIGGER_BYTES;

/// Version of the trigger message format carried in [`Trigger::v`].
pub const PROTOCOL_VERSION: u32 = 1;

/// AMQP content type of a trigger message body.
pub const CONTENT_TYPE: &str = "application/json";

/// Header carrying the attempt number (1-based) of this delivery. The body carries the same value;
/// the header lets operators see it in the RabbitMQ management UI and lets retry tiers rewrite it
/// without re-encoding the body.
pub const HEADER_ATTEMPT: &str = "x-chime-attempt";

/// Header carrying the leader term that published the trigger (diagnostics only: RabbitMQ cannot
/// check fencing tokens; the worker's claim in PostgreSQL is what makes duplicates harmless).
pub const HEADER_TERM: &str = "x-chime-term";

/// Header set on messages a worker dead-letters itself, saying why (for example "unknown job").
pub const HEADER_DEAD_REASON: &str = "x-chime-dead-reason";

/// Header naming the worker that dead-lettered a message.
pub const HEADER_DEAD_BY: &str = "x-chime-dead-by";

/// Header set on parked messages: when the worker parked it (Unix milliseconds).
pub const HEADER_PARKED_AT: &str = "x-chime-parked-at";

/// Header set on parked messages of runs that ran: the last attempt's error.
pub const HEADER_ERROR: &str = "x-chime-error";

/// Header carrying the earliest instant (Unix milliseconds) a delayed retry may start; a retry
/// that comes back from a delay tier early is re-tiered or held until then.
pub const HEADER_NOT_BEFORE: &str = "x-chime-not-before";

/// Header set on a copy (parked, or sent through a delay tier) whose original carried more
/// headers than a copy keeps ([`crate::limits::MAX_COPIED_HEADER_BYTES`]): how many were left out.
pub const HEADER_HEADERS_DROPPED: &str = "x-chime-headers-dropped";

/// Header the broker sets on a quorum queue's redeliveries: how many times the message was
/// delivered before (absent on the first delivery). Written by RabbitMQ, never by Chime.
pub const HEADER_DELIVERY_COUNT: &str = "x-delivery-count";

/// A message on the control exchange ([`crate::topology::control_exchange`]), fanned out to every
/// worker under a prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ControlMessage {
    /// Stop this run if you hold it: fire its cancellation token.
    CancelRun {
        /// The run to cancel.
        run_id: i64,
    },
}

/// A trigger: "run attempt `attempt` of run `run_id` of job `job`, scheduled for `scheduled_at`".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub v: u32,
    /// Run id: the primary key of the run in PostgreSQL and the handler's idempotency key.
    pub run_id: i64,
    /// Job name, used to pick the handler.
    pub job: String,
    /// Executor group (queue) this trigger was published to.
    pub group: String,
    /// Attempt number, 1-based.
    pub attempt: u32,
    /// The instant the run was scheduled for (the manual trigger's request instant for manual runs).
    pub scheduled_at: DateTime<Utc>,
    /// Parameters handed to the handler.
    #[serde(default)]
    pub params: serde_json::Value,
    /// Handler timeout in milliseconds, if the job has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The job's retry policy. Absent means no retry (one attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Which task of its run this is, for a run of a broadcast, sharded or map/reduce job;
    /// absent for a single run. A worker that does not know the field runs the task as a
    /// single run of the job with `params` (its claim and outcome work all the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Task>,
}

/// One task of a run with several: its parent run and its place in it (docs/protocol.md, "Job
/// kinds"). `Trigger::run_id` is the task's own run id; claims, outcomes, logs and heartbeats use
/// it as for any run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The run (the fire) this task belongs to: what `chime runs show` lists and a cancel names.
    pub parent_run_id: i64,
    /// The task's key, unique in its run: `worker/<id>`, `shard/<n>`, `root`, `reduce`, or
    /// `<caller>/<step>/<call>/<n>` for a mapped sub-task.
    pub key: String,
    /// What the task is.
    pub kind: TaskKind,
    /// A shard's place: index, total and its parameter (sharded jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// The worker a broadcast task is for: its trigger is routed to that worker's own queue,
    /// and a worker forwards one that reaches it otherwise (after a delay tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// A mapped sub-task's step name, as its caller named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// A map/reduce task's depth: the root task 0, what it maps 1, and so on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

/// What a task is ([`Task::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// A broadcast job's task for one worker.
    Broadcast,
    /// A sharded job's shard.
    Shard,
    /// A map/reduce job's first task: its handler maps the work.
    Root,
    /// A sub-task mapped by the root or another mapped task; its `params` is the item.
    Map,
    /// A map/reduce job's last task: runs the job's reducer once every other task has ended.
    Reduce,
}

/// A shard's place in its run ([`Task::shard`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shard {
    /// 0-based index.
    pub index: u32,
    /// How many shards the run has.
    pub total: u32,
    /// The job's `shard_params` entry for this index, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<serde_json::Value>,
}

/// A job's retry policy as it travels in the trigger (durations in milliseconds). See
/// `docs/failures.md` for the delay formula.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 = no retry.
    pub max_attempts: u32,
    /// Delay before the second attempt.
    pub initial_ms: u64,
    /// Factor applied to the delay after each further failure.
    pub multiplier: f64,
    /// Upper bound of any delay.
    pub max_ms: u64,
    /// Whether delays are spread by a random factor.
    pub jitter: bool,
}

impl Trigger {
    /// Encodes the trigger as the JSON body of an AMQP message.
    pub fn to_body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a Trigger always serialises")
    }

    /// Decodes a message body, rejecting bodies over [`MAX_TRIGGER_BYTES`] (without reading
    /// them) and unknown protocol versions.
    pub fn from_body(body: &[u8]) -> Result<Self, DecodeError> {
        if body.len() > MAX_TRIGGER_BYTES {
            return Err(DecodeError::TooLarge(body.len()));
        }
        let trigger: Trigger = serde_json::from_slice(body).map_err(DecodeError::Json)?;
        if trigger.v != PROTOCOL_VERSION {
            return Err(DecodeError::Version(trigger.v));
        }
        if trigger.attempt == 0 {
            return Err(DecodeError::Attempt);
        }
        Ok(trigger)
    }
}

/// Why a message body is not a trigger this worker understands.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The body is longer than [`MAX_TRIGGER_BYTES`]; it was not decoded.
    #[error(
        "message body is {0} bytes, over the limit of {MAX_TRIGGER_BYTES} for a trigger \
         (limits::MAX_TRIGGER_BYTES): not decoded; params must encode to at most \
         limits::MAX_PARAMS_BYTES"
    )]
    TooLarge(usize),
    /// The body is not JSON or lacks a required field.
    #[error("message body is not a Chime trigger: {0}")]
    Json(#[source] serde_json::Error),
    /// The protocol version is not one this SDK speaks.
    #[error("unsupported trigger protocol version {0} (this worker speaks {PROTOCOL_VERSION})")]
    Version(u32),
    /// Attempt numbers start at 1.
    #[error("trigger attempt must be at least 1")]
    Attempt,
}

/// A trigger body exactly as the scheduler of protocol v1 wrote it before the protocol had a
/// crate of its own (the serialization of the tests' `trigger()` then): it must still decode to
/// the same trigger, and encode to the same bytes, so workers and schedulers on either side of
/// the change read each other's messages.
#[cfg(test)]
pub(crate) const V1_BODY: &str = r#"{"v":1,"run_id":42,"job":"close-unpaid-orders","group":"orders","attempt":1,"scheduled_at":"2026-12-01T00:00:00Z","params":{"batch":500},"timeout_ms":300000,"retry":{"max_attempts":4,"initial_ms":1000,"multiplier":2.0,"max_ms":600000,"jitter":true}}"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger() -> Trigger {
        Trigger {
            v: PROTOCOL_VERSION,
            run_id: 42,
            job: "close-unpaid-orders".into(),
            group: "orders".into(),
            attempt: 1,
            scheduled_at: "2026-12-01T00:00:00Z".parse().unwrap(),
            params: serde_json::json!({"batch": 500}),
            timeout_ms: Some(300_000),
            retry: Some(RetryPolicy {
                max_attempts: 4,
                initial_ms: 1_000,
                multiplier: 2.0,
                max_ms: 600_000,
                jitter: true,
            }),
            task: None,
        }
    }

    #[test]
    fn a_task_trigger_round_trips_and_a_single_run_has_no_task_field() {
        let mut t = trigger();
        assert!(!String::from_utf8(t.to_body()).unwrap().contains("task"));
        t.task = Some(Task {
            parent_run_id: 41,
            key: "shard/2".into(),
            kind: TaskKind::Shard,
            shard: Some(Shard {
                index: 2,
                total: 3,
                param: Some(serde_json::json!("Guangzhou")),
            }),
            worker: None,
            step: None,
            depth: None,
        });
        let body = String::from_utf8(t.to_body()).unwrap();
        assert!(
            body.contains(r#""task":{"parent_run_id":41,"key":"shard/2","kind":"shard","shard":{"index":2,"total":3,"param":"Guangzhou"}}"#),
            "{body}"
        );
        assert_eq!(Trigger::from_body(body.as_bytes()).unwrap(), t);
    }

    #[test]
    fn a_v1_trigger_written_before_the_protocol_crate_still_decodes_and_encodes_the_same() {
        assert_eq!(Trigger::from_body(V1_BODY.as_bytes()).unwrap(), trigger());
        assert_eq!(String::from_utf8(trigger().to_body()).unwrap(), V1_BODY);
        // A minimal v1 body: no optional field, params absent (docs/protocol.md, section 2).
        let minimal = br#"{"v":1,"run_id":7,"job":"j","group":"g","attempt":2,"scheduled_at":"2026-12-01T00:00:00.250Z"}"#;
        let t = Trigger::from_body(minimal).unwrap();
        assert_eq!(
            (t.run_id, t.attempt, t.params.clone()),
            (7, 2, serde_json::Value::Null)
        );
        assert_eq!((t.timeout_ms, t.retry), (None, None));
        assert_eq!(t.scheduled_at.timestamp_millis(), 1_796_083_200_250);
        // Fields a newer publisher may add are ignored, as docs/protocol.md promises.
        let newer = br#"{"v":1,"run_id":7,"job":"j","group":"g","attempt":1,"scheduled_at":"2026-12-01T00:00:00Z","shard":3}"#;
        assert_eq!(Trigger::from_body(newer).unwrap().run_id, 7);
        // The control message of v1.
        assert_eq!(
            serde_json::from_str::<ControlMessage>(r#"{"cancel_run":{"run_id":42}}"#).unwrap(),
            ControlMessage::CancelRun { run_id: 42 }
        );
        assert_eq!(
            serde_json::to_string(&ControlMessage::CancelRun { run_id: 42 }).unwrap(),
            r#"{"cancel_run":{"run_id":42}}"#
        );
    }

    #[test]
    fn round_trips_through_the_body() {
        let t = trigger();
        assert_eq!(Trigger::from_body(&t.to_body()).unwrap(), t);
    }

    #[test]
    fn rejects_malformed_json_naming_the_problem() {
        let err = Trigger::from_body(b"{not json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("message body is not a Chime trigger"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_future_protocol_version() {
        let mut t = trigger();
        t.v = 2;
        let err = Trigger::from_body(&t.to_body()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported trigger protocol version 2 (this worker speaks 1)"
        );
    }

    #[test]
    fn rejects_an_oversized_body_before_decoding_it() {
        let mut body = trigger().to_body();
        body.resize(MAX_TRIGGER_BYTES + 1, b' ');
        let err = Trigger::from_body(&body).unwrap_err();
        assert!(matches!(err, DecodeError::TooLarge(n) if n == MAX_TRIGGER_BYTES + 1));
        assert!(
            err.to_string().contains("limits::MAX_TRIGGER_BYTES"),
            "{err}"
        );
        // Whitespace up to the limit is still a trigger.
        body.truncate(MAX_TRIGGER_BYTES);
        assert_eq!(Trigger::from_body(&body).unwrap(), trigger());
    }

    #[test]
    fn rejects_attempt_zero() {
        let mut t = trigger();
        t.attempt = 0;
        assert!(matches!(
            Trigger::from_body(&t.to_body()),
            Err(DecodeError::Attempt)
        ));
    }
}
