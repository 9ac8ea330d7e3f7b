//! The documented upper bounds of every value that crosses an edge: a job definition, an API
//! body, a trigger message. The scheduler checks job definitions against them at validation, and
//! a worker checks a trigger against them before it acts on it, so a value that passed one edge
//! can never overflow the arithmetic behind the other. docs/configuration.md lists them.

use std::time::Duration;

const DAY: u64 = 24 * 60 * 60;

/// Longest retry delay: `retry.initial`, `retry.max` and a handler's `JobError::retry_after`
/// (7 days). A retry's `x-chime-not-before` further than this (plus [`NOT_BEFORE_SLACK`]) in the
/// future is forged or corrupt.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(7 * DAY);

/// How far past [`MAX_RETRY_DELAY`] a trigger's `x-chime-not-before` may lie before a worker
/// parks it as implausible (clock skew between the hosts that wrote and read it).
pub const NOT_BEFORE_SLACK: Duration = Duration::from_secs(60 * 60);

/// Longest handler `timeout` (7 days).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * DAY);

/// Most attempts a retry policy may allow (`retry.max_attempts`), the first included.
pub const MAX_ATTEMPTS: u32 = 1_000;

/// Largest `retry.multiplier`.
pub const MAX_MULTIPLIER: f64 = 100.0;

/// Longest fixed-rate period (`every`): one leap year.
pub const MAX_EVERY: Duration = Duration::from_secs(366 * DAY);

/// Largest `jitter` of a job: one hour. Jitter spreads a burst of fires written for the same
/// instant; an hour spreads the largest burst, and a longer shift is a different schedule.
pub const MAX_JITTER: Duration = Duration::from_secs(3600);

/// Most fires a job's schedule may make (`max_runs`).
pub const MAX_RUNS: u32 = 1_000_000_000;

/// Most rules (weekday, date, yearly and time entries) of one calendar with the calendars it
/// includes and excepts: ten thousand, a holiday list of several countries for decades.
pub const MAX_CALENDAR_ENTRIES: usize = 10_000;

/// Deepest chain of calendars through `include` and `except`.
pub const MAX_CALENDAR_DEPTH: usize = 8;

/// Largest calendar file (`file`), one date or range per line.
pub const MAX_CALENDAR_FILE_BYTES: u64 = 1024 * 1024;

/// How far a calendar is searched for an allowed instant (`on_excluded = "next_allowed"`, the
/// next fires `chime check` shows): one leap year.
pub const MAX_CALENDAR_SEARCH: Duration = Duration::from_secs(366 * DAY);

/// Most fires one backfill may make into runs (`chime jobs backfill`): a minutely job for two
/// months, a daily one for 270 years. A longer range is several backfills.
pub const MAX_BACKFILL_FIRES: u32 = 100_000;

/// Longest range of one backfill, from `--from` to `--to`: ten years.
pub const MAX_BACKFILL_RANGE: Duration = Duration::from_secs(3_653 * DAY);

/// Most runs of one backfill unfinished at once (`--parallel`).
pub const MAX_BACKFILL_PARALLEL: u32 = 100;

/// Most runs one backfill makes per second (`--rate`).
pub const MAX_BACKFILL_RATE: u32 = 1_000;

/// Longest catch-up window, misfire grace and similar look-backs (`catchup_window`,
/// `misfire_grace`): one leap year.
pub const MAX_LOOKBACK: Duration = Duration::from_secs(366 * DAY);

/// Longest retention of finished runs and audit entries (`retention`, `retention.max_age`,
/// `retention.audit_max_age`): 100 years.
pub const MAX_RETENTION: Duration = Duration::from_secs(36_525 * DAY);

/// Longest time a worker lets a run of a job no online worker of its group handles wait for
/// one (`WorkerBuilder::unhandled_wait`), counted from the run's scheduled instant: one day. A
/// rolling deploy takes minutes; a run waiting longer than this waits for a worker that is not
/// coming.
pub const MAX_UNHANDLED_WAIT: Duration = Duration::from_secs(DAY);

/// Longest job, group or worker name, in bytes (PostgreSQL's identifier length).
pub const MAX_NAME_BYTES: usize = 63;

/// Largest JSON encoding of a job's or a manual trigger's `params`, in bytes.
pub const MAX_PARAMS_BYTES: usize = 64 * 1024;

/// Largest file a `CHIME_<KEY>_FILE` variable may name (a secret file holds one value: a URL, a
/// webhook): 64 KiB.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Most broker addresses one process is given (`amqp_urls`, `CHIME_AMQP_URLS`): the nodes of
/// one cluster, tried in order at connect. More than a handful is a mistake (a cluster of 16 is
/// already large; a load balancer is one address).
pub const MAX_AMQP_URLS: usize = 16;

/// Most missed fires `misfire = "fire_all"` runs (`max_catchup`): the misfire policy decides at
/// most this many fires per call, so a larger value could never take effect.
pub const MAX_CATCHUP: u32 = 1_000;

/// Longest job `description`, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;

/// Deepest nesting of lists and tables in a settings or job file (and so in `params`): far more
/// than any real file needs, far below what could exhaust a parser's or converter's stack.
pub const MAX_NESTING: usize = 64;

/// Longest leader lease (`leader.lease_ttl`; `leader.renew_interval` is shorter still): a
/// failover waits this long at most.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(10 * 60);

/// Longest planner lookahead (`planner.lookahead`): runs are persisted at most this far ahead.
pub const MAX_LOOKAHEAD: Duration = Duration::from_secs(60);

/// Longest pause between two passes of a leader duty (`rescuer.interval`,
/// `retention.interval`).
pub const MAX_DUTY_INTERVAL: Duration = Duration::from_secs(DAY);

/// Longest wait before the rescuer acts (`rescuer.rescue_after`, `rescuer.retry_slack`).
pub const MAX_RESCUE_WAIT: Duration = Duration::from_secs(DAY);

/// Longest alert rate-limit interval (`alerts.min_interval`, also per group).
pub const MAX_ALERT_INTERVAL: Duration = Duration::from_secs(7 * DAY);

/// Most consecutive failures an alert may wait for (`alerts.consecutive_failures`).
pub const MAX_CONSECUTIVE_FAILURES: u32 = MAX_ATTEMPTS;

/// Largest retention batch (`retention.batch_size`): each batch is one short statement.
pub const MAX_BATCH_SIZE: u32 = 100_000;

/// Most shards of a sharded job (`shards`, and so the highest index of `shard_params` plus one):
/// one task per shard is created at each fire.
pub const MAX_SHARDS: u32 = 10_000;

/// Most jobs one job's child lists (`on_success`, `on_failure`, `on_complete`) name in all: a
/// run's end makes at most this many runs.
pub const MAX_CHILD_JOBS: usize = 20;

/// Most nodes one workflow has (`nodes`): a workflow run makes at most this many node runs per
/// round.
pub const MAX_WORKFLOW_NODES: usize = 1_000;

/// Most nodes one workflow node comes after (`after`).
pub const MAX_NODE_EDGES: usize = 100;

/// Most workers a broadcast job may require online at a fire (`min_workers`), and so the most
/// workers of one group a fire counts on.
pub const MAX_WORKERS_PER_GROUP: u32 = 10_000;

/// Deepest nesting of `ctx.map` in a map/reduce job (`map_depth`): the root task is depth 0, the
/// tasks it maps depth 1, and so on.
pub const MAX_MAP_DEPTH: u32 = 10;

/// Most tasks one run of a job of any kind other than `single` may have in all (the shards, the
/// broadcast copies, the root task of a map/reduce run and every task it maps, at any depth).
pub const MAX_TASKS_PER_RUN: u32 = 100_000;

/// Most items one `ctx.map` call may hand out as tasks.
pub const MAX_MAP_ITEMS_PER_CALL: u32 = 10_000;

/// Largest JSON encoding of one task's output (what a mapped task returns to its reducer), in
/// bytes.
pub const MAX_TASK_OUTPUT_BYTES: usize = 64 * 1024;

/// The length of `value` as PostgreSQL prints a `jsonb`, which is what `chime_set_output`
/// measures against [`MAX_TASK_OUTPUT_BYTES`]: compact JSON plus a space after each `:` and
/// each `,` (the SDKs and `chime-runner` measure the same before they store an output).
pub fn jsonb_text_len(value: &serde_json::Value) -> usize {
    fn separators(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::Array(items) => {
                items.len().saturating_sub(1) + items.iter().map(separators).sum::<usize>()
            }
            serde_json::Value::Object(entries) => {
                (entries.len() * 2).saturating_sub(1)
                    + entries.values().map(separators).sum::<usize>()
            }
            _ => 0,
        }
    }
    value.to_string().len() + separators(value)
}

/// Longest name of a map/reduce step (the step `ctx.map` names its tasks with), in bytes:
/// ASCII letters, digits, `_`, `-` and `.`.
pub const MAX_MAP_STEP_LEN: usize = 64;

/// Most log lines one attempt stores in `chime_run_logs` (each at most 16 KiB). Lines beyond it
/// are still emitted as `tracing` events but not stored; the attempt's last stored line says how
/// many were dropped.
pub const MAX_LOG_LINES_PER_ATTEMPT: usize = 10_000;

/// Largest trigger message body a worker decodes, in bytes (params plus the envelope).
pub const MAX_TRIGGER_BYTES: usize = MAX_PARAMS_BYTES + 4 * 1024;

/// Longest header value a worker or the scheduler writes (a dead reason, an error), in bytes;
/// longer values are cut at a character boundary and marked. Far below RabbitMQ's `frame_max`
/// (128 KiB by default), so a header can never make the broker close the connection.
pub const MAX_HEADER_VALUE_BYTES: usize = 4 * 1024;

/// Most bytes (as encoded, roughly) of a message's own headers that a copy a worker publishes
/// (parked, or sent through a delay tier) carries over; the count of those left out goes in
/// `x-chime-headers-dropped`. With the headers the worker adds (each value at most
/// [`MAX_HEADER_VALUE_BYTES`]) the copy's header frame stays far below the broker's
/// [`BROKER_FRAME_MAX`] whatever the original carried, so republishing a message can never make
/// the broker close the connection (`FRAME_ERROR`).
pub const MAX_COPIED_HEADER_BYTES: usize = 16 * 1024;

/// RabbitMQ's default `frame_max` (128 KiB): a header frame larger than this closes the whole
/// connection. Not a Chime setting; the bounds above are kept far below it.
pub const BROKER_FRAME_MAX: usize = 128 * 1024;

/// Cuts `value` to at most [`MAX_HEADER_VALUE_BYTES`] bytes at a character boundary, ending a cut
/// value with `…[truncated]`.
pub fn cap_header_value(value: &str) -> std::borrow::Cow<'_, str> {
    cap_bytes(value, MAX_HEADER_VALUE_BYTES)
}

/// Cuts `value` to at most `max` bytes at a character boundary, ending a cut value with
/// `…[truncated]` (the marker counts towards `max`; a `max` shorter than the marker gives the
/// marker alone).
pub fn cap_bytes(value: &str, max: usize) -> std::borrow::Cow<'_, str> {
    const MARK: &str = "…[truncated]";
    if value.len() <= max {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut end = max.saturating_sub(MARK.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}{MARK}", &value[..end]))
}

// A copy carries at most `MAX_COPIED_HEADER_BYTES` of the original's headers plus the few a
// worker or the scheduler writes (attempt, term, not-before, dead reason, dead by, parked at,
// error, dropped count: at most 8 values of at most `MAX_HEADER_VALUE_BYTES` each, with their
// names): far below the broker's frame.
const _: () =
    assert!(MAX_COPIED_HEADER_BYTES + 8 * (MAX_HEADER_VALUE_BYTES + 64) < BROKER_FRAME_MAX / 2);

// The retry maths multiplies delays up to `MAX_RETRY_DELAY` by at most `MAX_MULTIPLIER` and a
// jitter factor below 2; that product must stay far inside chrono's and std's ranges.
const _: () = assert!(
    MAX_RETRY_DELAY.as_secs() * (MAX_MULTIPLIER as u64) * 2 < (i64::MAX as u64) / 1_000_000
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonb_text_len_counts_the_spaces_postgresql_prints() {
        // As `SELECT '…'::jsonb::text` prints them.
        for (value, text) in [
            (
                serde_json::json!({"a": [1, 2], "b": {}}),
                r#"{"a": [1, 2], "b": {}}"#,
            ),
            (serde_json::json!([]), "[]"),
            (serde_json::json!({}), "{}"),
            (serde_json::json!({"k": "v"}), r#"{"k": "v"}"#),
            (serde_json::json!("x\ny"), r#""x\ny""#),
        ] {
            assert_eq!(jsonb_text_len(&value), text.len(), "{text}");
        }
    }

    /// Every `MAX_*` bound of this file is named in docs/configuration.md's "Limits" table, but
    /// those of the wire alone, which docs/protocol.md describes with the messages they cause.
    #[test]
    fn every_bound_is_in_the_documented_limits_table() {
        const WIRE: &[&str] = &[
            "MAX_TRIGGER_BYTES",
            "MAX_HEADER_VALUE_BYTES",
            "MAX_COPIED_HEADER_BYTES",
        ];
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
        let docs = std::fs::read_to_string(path).expect("docs/configuration.md");
        let table = docs
            .split_once("\n## Limits\n")
            .and_then(|(_, rest)| rest.split("\n## ").next())
            .expect("a Limits section");
        let bounds: Vec<&str> = include_str!("limits.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("pub const MAX_"))
            .filter_map(|rest| rest.split(':').next())
            .collect();
        assert!(bounds.len() >= 20, "{bounds:?}");
        let missing: Vec<String> = bounds
            .iter()
            .map(|bound| format!("MAX_{bound}"))
            .filter(|name| !WIRE.contains(&name.as_str()))
            .filter(|name| !table.contains(&format!("`{name}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "not in docs/configuration.md's Limits table: {missing:?}"
        );
    }

    #[test]
    fn short_values_pass_unchanged() {
        assert_eq!(cap_bytes("abc", 10), "abc");
        assert_eq!(
            cap_header_value(&"x".repeat(MAX_HEADER_VALUE_BYTES)).len(),
            MAX_HEADER_VALUE_BYTES
        );
    }

    #[test]
    fn long_values_are_cut_at_a_char_boundary_and_marked() {
        let long = "é".repeat(MAX_HEADER_VALUE_BYTES);
        let cut = cap_header_value(&long);
        assert!(cut.len() <= MAX_HEADER_VALUE_BYTES, "{}", cut.len());
        assert!(cut.ends_with("…[truncated]"));
        assert!(cut.starts_with("éé"));
    }

    #[test]
    fn a_tiny_cap_still_returns_valid_text() {
        assert_eq!(cap_bytes("abcdefghijklmnopqrstuvwxyz", 3), "…[truncated]");
    }
}
