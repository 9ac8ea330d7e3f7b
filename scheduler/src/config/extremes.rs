//! Property test of the whole path a job definition takes, fed random and extreme values
//! (durations up to `u64` units, counts up to `u64::MAX`, negative and fractional numbers, odd
//! strings, job kinds with fields of their own or of another kind): validation, the stored form
//! read back, then the planner's schedule (next fires) and misfire decisions, then
//! the worker's retry maths. Each case must end in a recorded outcome without a panic: either
//! validation errors that name what is wrong, or a job whose every value is inside the
//! documented limits, with planned fires, misfire decisions and a retry decision for each
//! attempt.

use chime_protocol::limits::{
    MAX_ATTEMPTS, MAX_CATCHUP, MAX_EVERY, MAX_LOOKBACK, MAX_MAP_DEPTH, MAX_MULTIPLIER,
    MAX_PARAMS_BYTES, MAX_RETENTION, MAX_RETRY_DELAY, MAX_SHARDS, MAX_TIMEOUT,
    MAX_WORKERS_PER_GROUP,
};
use chime_protocol::retry::{Decision as RetryDecision, decide};
use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::{Map, Value, json};
use std::cell::RefCell;

use super::validate_job;
use crate::job::{Kind, KindName, Shards, TaskFailurePolicy, When};
use crate::misfire::{CatchUpPolicy, catch_up};

/// A duration as a job file could spell it: any count of any unit, or something odd.
fn duration_text() -> impl Strategy<Value = Value> {
    let units = prop::sample::select(vec![
        "ns", "us", "ms", "s", "m", "h", "d", "days", "w", "months", "y", "years",
    ]);
    let count = prop_oneof![
        0u64..100,
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        any::<u64>()
    ];
    prop_oneof![
        4 => (count, units).prop_map(|(n, unit)| Value::String(format!("{n}{unit}"))),
        1 => "[-0-9a-z. ]{0,12}".prop_map(Value::String),
        1 => any::<i64>().prop_map(Value::from),
        1 => Just(Value::Null),
    ]
}

/// A count: small, at the edges of `u32` and `u64`, negative, fractional, or not a number.
fn count() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0u64..2_000).prop_map(Value::from),
        1 => prop::sample::select(vec![
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
            3_000_000_000,
            u64::MAX,
        ])
        .prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
        1 => "[0-9a-z]{0,6}".prop_map(Value::String),
    ]
}

/// A number for `retry.multiplier`.
fn multiplier() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0.5f64..150.0).prop_map(Value::from),
        any::<f64>()
            .prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
    ]
}

/// `params`: an object, or anything else a client could send.
fn params() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"batch": 500})),
        Just(json!([1, 2])),
        Just(json!("batch=500")),
        Just(json!(7)),
        Just(Value::Null),
        (0usize..2 * MAX_PARAMS_BYTES).prop_map(|n| json!({"blob": "x".repeat(n)})),
    ]
}

/// `shard_params`: a list, a table by index (some keys odd), a sparse table far out, or not a
/// list at all.
fn shard_params() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0usize..20).prop_map(|n| Value::Array((0..n).map(Value::from).collect())),
        prop::collection::btree_map(
            prop_oneof![
                (0u64..20).prop_map(|i| i.to_string()),
                Just("9999".to_owned()),
                Just("10000".to_owned()),
                Just("-1".to_owned()),
                "[a-z0]{1,3}"
            ],
            Just(json!("p")),
            0..4
        )
        .prop_map(|map| Value::Object(map.into_iter().collect())),
        (0usize..2 * MAX_PARAMS_BYTES).prop_map(|n| json!({"9999": "x".repeat(n)})),
        Just(json!("Beijing")),
    ]
}

/// The kind and its fields: for half the cases none (a `single` job), for the others each
/// field present or not whatever the kind, so that fields of another kind are drawn too.
fn kind_fields() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    prop_oneof![Just(Vec::new()), any_kind_fields()]
}

fn any_kind_fields() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    let kind = prop::sample::select(vec![
        "single",
        "broadcast",
        "sharded",
        "map_reduce",
        "map-reduce",
    ]);
    // A small count near the bounds of `min_workers` and `map_depth`, or any count.
    let small = || prop_oneof![(0u64..12).prop_map(Value::from), count()];
    kind.prop_flat_map(move |kind| {
        // A field of the kind is given often (`shards` nearly always), one of another rarely.
        let p = |field: &str| match KindName::parse(kind) {
            Some(KindName::Sharded) if field == "shards" => 0.9,
            Some(name) if Kind::applies(field, name) => 0.5,
            _ => 0.05,
        };
        let shards = prop_oneof![count(), Just(json!("workers"))];
        let policy = prop::sample::select(vec!["fail", "ignore", "retry"]);
        (
            Just(kind),
            prop::option::weighted(p("shards"), shards),
            prop::option::weighted(p("shard_params"), shard_params()),
            prop::option::weighted(p("min_workers"), small()),
            prop::option::weighted(p("map_depth"), small()),
            prop::option::weighted(p("on_task_failure"), policy),
        )
    })
    .prop_map(
        |(kind, shards, shard_params, min_workers, map_depth, policy)| {
            [
                ("kind", Some(Value::from(kind))),
                ("shards", shards),
                ("shard_params", shard_params),
                ("min_workers", min_workers),
                ("map_depth", map_depth),
                ("on_task_failure", policy.map(Value::from)),
            ]
            .into_iter()
            .filter_map(|(field, value)| Some((field, value?)))
            .collect()
        },
    )
}

/// Which of `schedule`, `every` and `at` the job sets.
fn timing() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    let cron = prop::sample::select(vec![
        "0 * * * *",
        "*/15 * * * * *",
        "0 9 * * MON-FRI",
        "@daily",
        "0 0 29 2 *",
        "not cron",
    ]);
    prop_oneof![
        Just(Vec::new()),
        cron.prop_map(|c| vec![("schedule", Value::from(c))]),
        duration_text().prop_map(|d| vec![("every", d)]),
        (-100_000i64..300_000).prop_map(|days| {
            let at = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::days(days);
            vec![("at", Value::String(at.to_rfc3339()))]
        }),
    ]
}

/// A job definition: a plain valid job, each of whose durations, counts and params is replaced,
/// with probability `p`, by a value drawn from the strategies above (so a good share of cases
/// passes validation and goes on to the planner and the retry maths).
fn definition() -> impl Strategy<Value = Map<String, Value>> {
    const P: f64 = 0.2;
    let maybe = |s: BoxedStrategy<Value>| prop::option::weighted(P, s);
    let durations = (
        maybe(duration_text().boxed()),
        maybe(duration_text().boxed()),
        maybe(duration_text().boxed()),
        maybe(duration_text().boxed()),
        maybe(duration_text().boxed()),
        maybe(duration_text().boxed()),
    );
    let counts = (
        maybe(count().boxed()),
        maybe(count().boxed()),
        maybe(multiplier().boxed()),
        maybe(params().boxed()),
    );
    let misfire = prop::sample::select(vec!["skip", "fire_once", "fire_all"]);
    (timing(), durations, counts, misfire, kind_fields()).prop_map(
        |(
            timing,
            (timeout, grace, window, retention, initial, max),
            (attempts, catchup, mult, params),
            misfire,
            kind,
        )| {
            let mut map = Map::new();
            map.insert("name".into(), json!("extreme"));
            map.insert("group".into(), json!("g"));
            map.insert("misfire".into(), json!(misfire));
            for (field, value) in timing.into_iter().chain(kind) {
                map.insert(field.into(), value);
            }
            let mut retry = Map::new();
            for (field, value) in [
                ("timeout", timeout),
                ("misfire_grace", grace),
                ("catchup_window", window),
                ("max_catchup", catchup),
                ("retention", retention),
                ("params", params),
            ] {
                if let Some(value) = value {
                    map.insert(field.into(), value);
                }
            }
            for (field, value) in [
                ("max_attempts", attempts),
                ("initial", initial),
                ("max", max),
                ("multiplier", mult),
            ] {
                if let Some(value) = value {
                    retry.insert(field.into(), value);
                }
            }
            map.insert("retry".into(), Value::Object(retry));
            map
        },
    )
}

/// How one case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Validation refused it, naming what is wrong.
    Refused,
    /// Validated, planned and given a retry decision per attempt; `single` says whether the
    /// job is of kind `single`.
    Planned { single: bool },
}

/// One case through validation, the planner and the retry maths; `Err` is a broken property.
fn one_case(
    definition: &Map<String, Value>,
    now: DateTime<Utc>,
    behind: TimeDelta,
    random: f64,
) -> Result<Outcome, TestCaseError> {
    let spec = match validate_job(definition) {
        Err(errors) => {
            prop_assert!(!errors.is_empty());
            for error in &errors {
                prop_assert!(!error.message.is_empty());
                // Every mistake names its field, but the one about a combination of them.
                prop_assert!(
                    error.field.is_some() || error.message.contains("at most one of"),
                    "{error:?}"
                );
            }
            return Ok(Outcome::Refused);
        }
        Ok(spec) => spec,
    };
    // Inside every documented limit.
    if let When::Every(period) = spec.when {
        prop_assert!(period <= MAX_EVERY);
    }
    prop_assert!(spec.timeout.is_none_or(|d| d <= MAX_TIMEOUT));
    prop_assert!(spec.retention.is_none_or(|d| d <= MAX_RETENTION));
    prop_assert!(spec.misfire_grace <= MAX_LOOKBACK);
    prop_assert!(spec.catchup_window <= MAX_LOOKBACK);
    prop_assert!(spec.max_catchup <= MAX_CATCHUP);
    prop_assert!((1..=MAX_ATTEMPTS).contains(&spec.retry.max_attempts));
    prop_assert!(spec.retry.initial <= MAX_RETRY_DELAY);
    prop_assert!(spec.retry.max <= MAX_RETRY_DELAY);
    prop_assert!(spec.retry.multiplier <= MAX_MULTIPLIER);
    prop_assert!(spec.params.is_null() || spec.params.is_object());
    prop_assert!(serde_json::to_vec(&spec.params).map_or(0, |b| b.len()) <= MAX_PARAMS_BYTES);
    match &spec.kind {
        Kind::Single => prop_assert_eq!(spec.on_task_failure, TaskFailurePolicy::Fail),
        Kind::Broadcast { min_workers } => {
            prop_assert!((1..=MAX_WORKERS_PER_GROUP).contains(min_workers));
        }
        Kind::Sharded { shards, params } => {
            let most = match shards {
                Shards::Count(n) => {
                    prop_assert!((1..=MAX_SHARDS).contains(n));
                    *n
                }
                Shards::Workers => MAX_SHARDS,
            };
            prop_assert!(params.len() <= most as usize);
            prop_assert!(serde_json::to_vec(params).map_or(0, |b| b.len()) <= MAX_PARAMS_BYTES);
        }
        Kind::MapReduce { map_depth } => prop_assert!((1..=MAX_MAP_DEPTH).contains(map_depth)),
        Kind::Workflow { nodes } => {
            prop_assert!((1..=chime_protocol::limits::MAX_WORKFLOW_NODES).contains(&nodes.len()));
            prop_assert!(crate::workflow::dag_problems(nodes).is_empty());
        }
    }
    // The stored form reads back as the same job.
    let stored = serde_json::to_value(&spec).expect("a JobSpec serialises");
    let read: crate::job::JobSpec = serde_json::from_value(stored)
        .map_err(|e| TestCaseError::fail(format!("the stored form does not read back: {e}")))?;
    prop_assert_eq!(&read, &spec);

    // Planner: next fires and misfire decisions.
    let timing = spec.timing().expect("a validated job has a schedule");
    let fires = timing.upcoming(now, 5);
    prop_assert!(fires.windows(2).all(|w| w[0] < w[1]));
    prop_assert!(fires.iter().all(|f| *f > now));
    let cursor = now - behind;
    let decided = catch_up(&timing, cursor, now, &CatchUpPolicy::from_spec(&spec));
    prop_assert!(decided.cursor <= now);
    prop_assert!(
        decided
            .decisions
            .iter()
            .all(|d| d.at() > cursor && d.at() <= now)
    );

    // Worker: a retry decision for every attempt, within the policy's bounds.
    let wire = spec.retry.to_wire();
    let last = spec.retry.max_attempts;
    for failed in [1, 2, last.saturating_sub(1).max(1), last, u32::MAX] {
        match decide(Some(&wire), failed, None, random) {
            RetryDecision::Retry {
                next_attempt,
                delay,
            } => {
                prop_assert_eq!(next_attempt, failed + 1);
                prop_assert!(next_attempt <= last);
                prop_assert!(delay <= spec.retry.max.max(spec.retry.initial));
            }
            RetryDecision::Exhausted { max_attempts } => {
                prop_assert!(failed >= max_attempts);
            }
        }
    }
    Ok(Outcome::Planned {
        single: spec.kind.is_single(),
    })
}

#[test]
fn extreme_definitions_are_refused_or_planned_and_retried_without_panic() {
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    });
    let outcomes = RefCell::new(Vec::new());
    let case = (definition(), 0i64..40_000, 0i64..(24 * 3600), 0.0f64..1.0);
    runner
        .run(&case, |(definition, now_days, behind_secs, random)| {
            let now = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::days(now_days);
            let outcome = one_case(&definition, now, TimeDelta::seconds(behind_secs), random)?;
            outcomes.borrow_mut().push(outcome);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // Every case was recorded, and both ends of the path were exercised.
    let outcomes = outcomes.into_inner();
    let planned = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Planned { .. }))
        .count();
    let other_kinds = outcomes
        .iter()
        .filter(|o| **o == Outcome::Planned { single: false })
        .count();
    let refused = outcomes.len() - planned;
    assert!(
        planned >= 25,
        "only {planned} of {} cases planned",
        outcomes.len()
    );
    assert!(
        other_kinds >= 5,
        "only {other_kinds} of {planned} planned cases are of kinds other than single"
    );
    assert!(
        refused >= 25,
        "only {refused} of {} cases refused",
        outcomes.len()
    );
}
