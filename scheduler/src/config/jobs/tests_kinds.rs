//! Job kinds in job files and API bodies: each accepted form of `kind`, `shards`,
//! `shard_params`, `min_workers`, `map_depth` and `on_task_failure` with the job it builds, and
//! each mistake with its exact message.

use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::job::{Kind, Shards, TaskFailurePolicy};

/// The job a JSON definition (an API body) validates into.
pub(super) fn job(definition: Value) -> JobSpec {
    validate_job(definition.as_object().expect("object"))
        .unwrap_or_else(|e| panic!("{definition}: {e:#?}"))
}

/// The mistakes of a JSON definition, as `field = value: message` lines.
pub(super) fn mistakes(definition: Value) -> Vec<String> {
    let errors = validate_job(definition.as_object().expect("object"))
        .map(|job| panic!("{definition}: expected mistakes, built {job:#?}"))
        .unwrap_or_else(|errors| errors);
    errors
        .into_iter()
        .map(|e| {
            let field = e.field.unwrap_or_default();
            match e.value {
                Some(value) => format!("{field} = {value}: {}", e.message),
                None => format!("{field}: {}", e.message),
            }
        })
        .collect()
}

/// A definition of job `a` in group `g` with `fields` added.
pub(super) fn with(fields: Value) -> Value {
    let mut definition = json!({"name": "a", "group": "g"});
    let (Value::Object(base), Value::Object(fields)) = (&mut definition, fields) else {
        panic!("objects");
    };
    base.extend(fields);
    definition
}

fn jobs(text: &str, format: SourceFormat) -> Vec<JobSpec> {
    parse_job_file("jobs", text, format).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn each_kind_builds_with_its_fields_and_their_defaults() {
    let cases = [
        (json!({}), Kind::Single, TaskFailurePolicy::Fail),
        (
            json!({"kind": "single"}),
            Kind::Single,
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "broadcast"}),
            Kind::Broadcast { min_workers: 1 },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "broadcast", "min_workers": 10_000, "on_task_failure": "ignore"}),
            Kind::Broadcast {
                min_workers: 10_000,
            },
            TaskFailurePolicy::Ignore,
        ),
        (
            json!({"kind": "sharded", "shards": 1}),
            Kind::Sharded {
                shards: Shards::Count(1),
                params: vec![],
            },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "sharded", "shards": 10_000, "on_task_failure": "fail"}),
            Kind::Sharded {
                shards: Shards::Count(10_000),
                params: vec![],
            },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "sharded", "shards": "workers", "on_task_failure": "ignore"}),
            Kind::Sharded {
                shards: Shards::Workers,
                params: vec![],
            },
            TaskFailurePolicy::Ignore,
        ),
        (
            json!({"kind": "sharded", "shards": 3, "shard_params": ["x", 2, {"k": [1]}]}),
            Kind::Sharded {
                shards: Shards::Count(3),
                params: vec![json!("x"), json!(2), json!({"k": [1]})],
            },
            TaskFailurePolicy::Fail,
        ),
        (
            // Fewer entries than shards: the shards past them have none.
            json!({"kind": "sharded", "shards": 3, "shard_params": ["x"]}),
            Kind::Sharded {
                shards: Shards::Count(3),
                params: vec![json!("x")],
            },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "sharded", "shards": 5, "shard_params": {"3": "d", "0": "a"}}),
            Kind::Sharded {
                shards: Shards::Count(5),
                params: vec![json!("a"), Value::Null, Value::Null, json!("d")],
            },
            TaskFailurePolicy::Fail,
        ),
        (
            // With "workers", any index up to the limit: those past the workers are unused.
            json!({"kind": "sharded", "shards": "workers", "shard_params": {"9999": 1}}),
            Kind::Sharded {
                shards: Shards::Workers,
                params: [vec![Value::Null; 9_999], vec![json!(1)]].concat(),
            },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "sharded", "shards": 2, "shard_params": []}),
            Kind::Sharded {
                shards: Shards::Count(2),
                params: vec![],
            },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "map_reduce"}),
            Kind::MapReduce { map_depth: 3 },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 1}),
            Kind::MapReduce { map_depth: 1 },
            TaskFailurePolicy::Fail,
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 10, "on_task_failure": "ignore"}),
            Kind::MapReduce { map_depth: 10 },
            TaskFailurePolicy::Ignore,
        ),
        (
            // `null` counts as absent, also for a field of another kind.
            json!({"kind": "broadcast", "shards": null, "min_workers": null}),
            Kind::Broadcast { min_workers: 1 },
            TaskFailurePolicy::Fail,
        ),
    ];
    for (fields, kind, on_task_failure) in cases {
        let definition = with(fields);
        let job = job(definition.clone());
        assert_eq!(job.kind, kind, "{definition}");
        assert_eq!(job.on_task_failure, on_task_failure, "{definition}");
    }
}

#[test]
fn shard_params_as_a_list_or_a_table_by_index_in_toml_and_yaml() {
    let toml = jobs(
        r#"
        [[jobs]]
        name = "list"
        group = "g"
        kind = "sharded"
        shards = 3
        shard_params = ["Beijing", "Shanghai"]

        [[jobs]]
        name = "table"
        group = "g"
        kind = "sharded"
        shards = 3
        shard_params = { 0 = "Beijing", 2 = "Guangzhou" }

        [[jobs]]
        name = "sub-table"
        group = "g"
        kind = "sharded"
        shards = "workers"
        [jobs.shard_params]
        1 = { city = "Shanghai", districts = 16 }
        "#,
        SourceFormat::Toml,
    );
    let yaml = jobs(
        r#"
jobs:
  - name: list
    group: g
    kind: sharded
    shards: 3
    shard_params: [Beijing, Shanghai]
  - name: table
    group: g
    kind: sharded
    shards: 3
    shard_params: {0: Beijing, 2: Guangzhou}
  - name: sub-table
    group: g
    kind: sharded
    shards: workers
    shard_params:
      1: {city: Shanghai, districts: 16}
"#,
        SourceFormat::Yaml,
    );
    assert_eq!(toml, yaml);
    let params: Vec<&Kind> = toml.iter().map(|job| &job.kind).collect();
    assert_eq!(
        params,
        [
            &Kind::Sharded {
                shards: Shards::Count(3),
                params: vec![json!("Beijing"), json!("Shanghai")],
            },
            &Kind::Sharded {
                shards: Shards::Count(3),
                params: vec![json!("Beijing"), Value::Null, json!("Guangzhou")],
            },
            &Kind::Sharded {
                shards: Shards::Workers,
                params: vec![Value::Null, json!({"city": "Shanghai", "districts": 16})],
            },
        ]
    );
}

/// The stored form has the flat keys SQL reads, each default left out, `shard_params` as the
/// list; it reads back as the same job.
#[test]
fn kinds_store_flat_keys_without_their_defaults_and_read_back() {
    let base = r#""name":"a","group":"g""#;
    let rest = r#""timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false"#;
    let cases = [
        (
            json!({"kind": "broadcast", "min_workers": 1, "on_task_failure": "fail"}),
            r#""kind":"broadcast""#,
        ),
        (
            json!({"kind": "broadcast", "min_workers": 3, "on_task_failure": "ignore"}),
            r#""kind":"broadcast","min_workers":3,"on_task_failure":"ignore""#,
        ),
        (
            json!({"kind": "sharded", "shards": 4}),
            r#""kind":"sharded","shards":4"#,
        ),
        (
            json!({"kind": "sharded", "shards": "workers", "shard_params": {"2": {"x": 1}}}),
            r#""kind":"sharded","shards":"workers","shard_params":[null,null,{"x":1}]"#,
        ),
        (
            json!({"kind": "sharded", "shards": 2, "shard_params": ["a", "b"],
                   "on_task_failure": "ignore"}),
            r#""kind":"sharded","shards":2,"shard_params":["a","b"],"on_task_failure":"ignore""#,
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 3}),
            r#""kind":"map_reduce""#,
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 7}),
            r#""kind":"map_reduce","map_depth":7"#,
        ),
    ];
    for (fields, keys) in cases {
        let job = job(with(fields));
        let stored = serde_json::to_string(&job).expect("serialises");
        assert_eq!(stored, format!("{{{base},{keys},{rest}}}"));
        let read: JobSpec = serde_json::from_str(&stored).expect("reads back");
        assert_eq!(read, job);
        // The stored form validates into the same job too (an API update sends it back).
        let resent: Value = serde_json::from_str(&stored).expect("JSON");
        assert_eq!(self::job(resent), job);
    }
}

/// The stored form refuses what validation refuses structurally, with the field's name first.
#[test]
fn the_stored_form_refuses_a_field_of_another_kind_and_shards_missing() {
    for (definition, message) in [
        (
            json!({"name": "a", "group": "g", "kind": "broadcast", "shards": 4}),
            r#"field "shards": applies to kind = "sharded" only; remove it or set kind = "sharded""#,
        ),
        (
            json!({"name": "a", "group": "g", "on_task_failure": "ignore"}),
            r#"field "on_task_failure": applies to kind = "broadcast", "sharded" or "map_reduce" only; remove it or set one of those kinds"#,
        ),
        (
            json!({"name": "a", "group": "g", "kind": "sharded"}),
            r#"field "shards": missing; kind = "sharded" needs the number of shards, a whole number from 1 to 10000, such as shards = 4, or shards = "workers" for one shard per worker of the group online at the fire"#,
        ),
    ] {
        let error = serde_json::from_value::<JobSpec>(definition).expect_err("refused");
        assert_eq!(error.to_string(), message);
    }
    let word = json!({"name": "a", "group": "g", "kind": "sharded", "shards": "all"});
    let error = serde_json::from_value::<JobSpec>(word).expect_err("refused");
    assert!(
        error.to_string().contains("did not match any variant")
            || error.to_string().contains("\"workers\""),
        "{error}"
    );
}

#[test]
fn a_field_of_another_kind_is_refused_naming_its_kind() {
    let cases = [
        (
            json!({"kind": "broadcast", "shards": 4}),
            r#"shards = 4: applies to kind = "sharded" only; remove it or set kind = "sharded""#,
        ),
        (
            // No kind is `single`; the value is not looked at.
            json!({"shard_params": "not even a list"}),
            r#"shard_params = "not even a list": applies to kind = "sharded" only; remove it or set kind = "sharded""#,
        ),
        (
            json!({"kind": "sharded", "shards": 2, "min_workers": 2}),
            r#"min_workers = 2: applies to kind = "broadcast" only; remove it or set kind = "broadcast""#,
        ),
        (
            json!({"kind": "broadcast", "map_depth": 2}),
            r#"map_depth = 2: applies to kind = "map_reduce" only; remove it or set kind = "map_reduce""#,
        ),
        (
            json!({"kind": "single", "on_task_failure": "fail"}),
            r#"on_task_failure = "fail": applies to kind = "broadcast", "sharded" or "map_reduce" only; remove it or set one of those kinds"#,
        ),
        (
            json!({"kind": "sharded"}),
            r#"shards: missing; kind = "sharded" needs the number of shards, a whole number from 1 to 10000, such as shards = 4, or shards = "workers" for one shard per worker of the group online at the fire"#,
        ),
    ];
    for (fields, message) in cases {
        assert_eq!(mistakes(with(fields.clone())), [message], "{fields}");
    }
    // Every misplaced field is reported, in the order of `Kind::FIELDS`.
    assert_eq!(
        mistakes(with(
            json!({"kind": "map_reduce", "on_task_failure": "ignore",
                              "min_workers": 2, "shards": 4})
        )),
        [
            r#"shards = 4: applies to kind = "sharded" only; remove it or set kind = "sharded""#,
            r#"min_workers = 2: applies to kind = "broadcast" only; remove it or set kind = "broadcast""#,
        ]
    );
}

#[test]
fn kind_and_on_task_failure_suggest_a_near_miss() {
    assert_eq!(
        mistakes(with(json!({"kind": "map-reduce"}))),
        [
            r#"kind = "map-reduce": unknown value; did you mean "map_reduce"? (use "single", "broadcast", "sharded", "map_reduce" or "workflow")"#
        ]
    );
    assert_eq!(
        mistakes(with(json!({"kind": "fan_out"}))),
        [
            r#"kind = "fan_out": unknown value; use "single", "broadcast", "sharded", "map_reduce" or "workflow""#
        ]
    );
    assert_eq!(
        mistakes(with(
            json!({"kind": "broadcast", "on_task_failure": "ignored"})
        )),
        [
            r#"on_task_failure = "ignored": unknown value; did you mean "ignore"? (use "fail" or "ignore")"#
        ]
    );
    // With the kind unknown, its fields are still checked, each by itself.
    assert_eq!(
        mistakes(with(
            json!({"kind": "shraded", "shards": 0, "min_workers": 2})
        )),
        [
            r#"kind = "shraded": unknown value; did you mean "sharded"? (use "single", "broadcast", "sharded", "map_reduce" or "workflow")"#,
            r#"shards = 0: too small: a sharded job has at least 1 shard; use a whole number from 1 to 10000, or "workers" for one shard per worker of the group online at the fire"#,
        ]
    );
}

#[test]
fn shards_out_of_range_or_of_the_wrong_type() {
    let or_workers = r#"or "workers" for one shard per worker of the group online at the fire"#;
    let cases = [
        (
            json!(0),
            format!(
                "shards = 0: too small: a sharded job has at least 1 shard; use a whole number from 1 to 10000, {or_workers}"
            ),
        ),
        (
            json!(-3),
            format!(
                "shards = -3: too small: a sharded job has at least 1 shard; use a whole number from 1 to 10000, {or_workers}"
            ),
        ),
        (
            json!(10_001),
            format!(
                "shards = 10001: too large: the limit is 10000; use a whole number from 1 to 10000, {or_workers}"
            ),
        ),
        (
            json!(u64::MAX),
            format!(
                "shards = 18446744073709551615: too large: the limit is 10000; use a whole number from 1 to 10000, {or_workers}"
            ),
        ),
        (
            json!(2.5),
            format!("shards = 2.5: expected a whole number from 1 to 10000, {or_workers}"),
        ),
        (
            json!("4"),
            r#"shards = "4": expected a number, found a string; write it without quotes: shards = 4"#
                .to_owned(),
        ),
        (
            json!("Worker"),
            format!(
                r#"shards = "Worker": unknown value; did you mean "workers"? (use a whole number from 1 to 10000, {or_workers})"#
            ),
        ),
        (
            json!("all"),
            format!(
                r#"shards = "all": unknown value; use a whole number from 1 to 10000, {or_workers}"#
            ),
        ),
        (
            json!([4]),
            format!(
                "shards = [4]: expected a whole number from 1 to 10000, {or_workers}; found a list"
            ),
        ),
    ];
    for (shards, message) in cases {
        let definition = with(json!({"kind": "sharded", "shards": shards}));
        assert_eq!(mistakes(definition), [message], "{shards}");
    }
}

#[test]
fn min_workers_and_map_depth_out_of_range() {
    let cases = [
        (
            json!({"kind": "broadcast", "min_workers": 0}),
            "min_workers = 0: too small: the least is 1; use a whole number from 1 to 10000",
        ),
        (
            json!({"kind": "broadcast", "min_workers": 10_001}),
            "min_workers = 10001: too large: the limit is 10000; use a whole number from 1 to 10000",
        ),
        (
            json!({"kind": "broadcast", "min_workers": "2"}),
            r#"min_workers = "2": expected a whole number from 1 to 10000"#,
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 0}),
            "map_depth = 0: too small: the least is 1; use a whole number from 1 to 10",
        ),
        (
            json!({"kind": "map_reduce", "map_depth": -1}),
            "map_depth = -1: too small: the least is 1; use a whole number from 1 to 10",
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 11}),
            "map_depth = 11: too large: the limit is 10; use a whole number from 1 to 10",
        ),
        (
            json!({"kind": "map_reduce", "map_depth": 1.5}),
            "map_depth = 1.5: expected a whole number from 1 to 10",
        ),
    ];
    for (fields, message) in cases {
        assert_eq!(mistakes(with(fields.clone())), [message], "{fields}");
    }
}

#[test]
fn shard_params_past_the_last_shard_name_the_index_and_the_fix() {
    let cases = [
        (
            json!({"shards": 4, "shard_params": ["a", "b", "c", "d", "Chengdu"]}),
            r#"shard_params.4 = "Chengdu": there is no shard 4: shards = 4 numbers them 0 to 3; raise shards to 5, or drop the entry"#,
        ),
        (
            json!({"shards": 2, "shard_params": ["a", "b", "c", "d", "e"]}),
            r#"shard_params.2 = "c": there are no shards 2 to 4 (3 entries): shards = 2 numbers them 0 to 1; raise shards to 5, or drop those entries"#,
        ),
        (
            json!({"shards": 4, "shard_params": {"0": "a", "4": "Chengdu"}}),
            r#"shard_params.4 = "Chengdu": there is no shard 4: shards = 4 numbers them 0 to 3; raise shards to 5, or drop the entry"#,
        ),
        (
            // A `null` entry is an entry all the same.
            json!({"shards": 1, "shard_params": {"7": null, "30": 1}}),
            r#"shard_params.7 = null: there are no shards 7 to 30 (2 entries): shards = 1 numbers them 0 to 0; raise shards to 31, or drop those entries"#,
        ),
    ];
    for (fields, message) in cases {
        let mut definition = with(fields.clone());
        definition["kind"] = json!("sharded");
        assert_eq!(mistakes(definition), [message], "{fields}");
    }
}

#[test]
fn shard_params_keys_must_be_shard_indexes() {
    let sharded = |params: Value| {
        with(json!({"kind": "sharded", "shards": "workers",
                                              "shard_params": params}))
    };
    assert_eq!(
        mistakes(sharded(json!({"beijing": 1, "-1": 2, "0": 3}))),
        [
            r#"shard_params.-1 = 2: not a shard index; the keys of a shard_params table are shard indexes, whole numbers from 0 to 9999, such as shard_params = ["Beijing", "Shanghai"] or shard_params = { 0 = "Beijing", 2 = "Guangzhou" } in TOML"#,
            r#"shard_params.beijing = 1: not a shard index; the keys of a shard_params table are shard indexes, whole numbers from 0 to 9999, such as shard_params = ["Beijing", "Shanghai"] or shard_params = { 0 = "Beijing", 2 = "Guangzhou" } in TOML"#,
        ]
    );
    assert_eq!(
        mistakes(sharded(json!({"10000": "x"}))),
        [
            r#"shard_params.10000 = "x": shard index too large: a sharded job has at most 10000 shards, numbered 0 to 9999; use an index in that range"#
        ]
    );
    assert_eq!(
        mistakes(sharded(json!({"0": "a", "00": "b"}))),
        [
            r#"shard_params.00 = "b": shard 0 is given twice, as "0" and "00"; keep one of the entries"#
        ]
    );
    assert_eq!(
        mistakes(sharded(json!("Beijing"))),
        [
            r#"shard_params = "Beijing": expected a list (entry i is shard i's params) or a table keyed by shard index, found a string; write it such as shard_params = ["Beijing", "Shanghai"] or shard_params = { 0 = "Beijing", 2 = "Guangzhou" } in TOML"#
        ]
    );
    let long = vec![json!(0); 10_001];
    let errors = mistakes(sharded(Value::Array(long)));
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].ends_with(
            ": 10001 entries; a sharded job has at most 10000 shards, so give at most 10000 entries"
        ),
        "{errors:?}"
    );
}

#[test]
fn shard_params_are_bounded_like_params_nulls_included() {
    let sharded = |params: Value| {
        with(json!({"kind": "sharded", "shards": "workers",
                                              "shard_params": params}))
    };
    // 9999 nulls and their commas are 49,995 bytes: a last entry of 16,000 bytes goes over.
    let errors = mistakes(sharded(json!({"9999": "x".repeat(16_000)})));
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].ends_with(
            ": 65999 bytes as JSON (stored as a list, with null for each index not given), more \
             than the limit of 65536 bytes; pass a reference to the data (an id, a URL) instead \
             of the data itself"
        ),
        "{errors:?}"
    );
    assert!(
        errors[0].starts_with("shard_params = {\"9999\":"),
        "{errors:?}"
    );
    // The same entry at index 0 fits.
    job(sharded(json!({"0": "x".repeat(16_000)})));
    assert_eq!(
        mistakes(sharded(json!(["a\u{0}b"]))),
        [
            r#"shard_params = ["a\u0000b"]: holds a NUL character (\u0000), which PostgreSQL cannot store; remove it or encode the data (base64, hex)"#
        ]
    );
    let mut deep = json!(1);
    for _ in 0..MAX_NESTING {
        deep = json!([deep]);
    }
    let errors = mistakes(sharded(json!([deep])));
    assert!(
        errors[0].ends_with(
            ": nested 65 levels deep (the list counts as one), more than the limit of 64; \
             flatten the shard params"
        ),
        "{errors:?}"
    );
}

/// A job file's line for each kind of mistake, as `chime check` prints it.
#[test]
fn job_file_messages_name_the_job_the_field_and_the_fix() {
    let errors = parse_job_file(
        "jobs.toml",
        r#"
        [[jobs]]
        name = "flush-caches"
        group = "caches"
        kind = "broadcast"
        shards = 4

        [[jobs]]
        name = "city-prices"
        group = "pricing"
        kind = "sharded"
        shards = 4
        shard_params = { 0 = "Beijing", 4 = "Chengdu" }

        [[jobs]]
        name = "invoices"
        group = "billing"
        kind = "sharded"
        "#,
        SourceFormat::Toml,
    )
    .expect_err("mistakes")
    .lines();
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "flush-caches": field "shards" = 4: applies to kind = "sharded" only; remove it or set kind = "sharded""#,
            r#"jobs.toml: job "city-prices": field "shard_params.4" = "Chengdu": there is no shard 4: shards = 4 numbers them 0 to 3; raise shards to 5, or drop the entry"#,
            r#"jobs.toml: job "invoices": field "shards": missing; kind = "sharded" needs the number of shards, a whole number from 1 to 10000, such as shards = 4, or shards = "workers" for one shard per worker of the group online at the fire"#,
        ]
    );
}

#[test]
fn deploy_kind_examples_load_and_agree() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let toml = load_job_files(&[examples.join("job-kinds.toml")]).unwrap_or_else(|e| panic!("{e}"));
    let yaml = load_job_files(&[examples.join("job-kinds.yaml")]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(toml, yaml);
    let kinds: Vec<&str> = toml.iter().map(|job| job.kind.as_str()).collect();
    assert_eq!(kinds, ["broadcast", "sharded", "sharded", "map_reduce"]);
    assert!(toml.iter().all(|job| job.group == "examples"));
}
