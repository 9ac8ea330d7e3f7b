//! Job file tests: one per kind of mistake with its exact message, and the good files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::DateTime;
use chrono_tz::Tz;

use super::*;
use crate::job::{ConcurrencyPolicy, Kind, MisfirePolicy, When};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Every message for a TOML job file named `jobs.toml`.
fn toml_errors(text: &str) -> Vec<String> {
    match parse_job_file("jobs.toml", text, SourceFormat::Toml) {
        Ok(jobs) => panic!("expected errors, loaded {jobs:#?}"),
        Err(errors) => errors.lines(),
    }
}

/// The one message for a TOML job file named `jobs.toml`.
fn toml_error(text: &str) -> String {
    let errors = toml_errors(text);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    errors.into_iter().next().unwrap()
}

fn yaml_error(text: &str) -> String {
    match parse_job_file("jobs.yaml", text, SourceFormat::Yaml) {
        Ok(jobs) => panic!("expected errors, loaded {jobs:#?}"),
        Err(errors) => {
            let lines = errors.lines();
            assert_eq!(lines.len(), 1, "expected one error, got {lines:#?}");
            lines.into_iter().next().unwrap()
        }
    }
}

fn toml_job(text: &str) -> JobSpec {
    let mut jobs = parse_job_file("jobs.toml", text, SourceFormat::Toml)
        .unwrap_or_else(|e| panic!("expected a job, got:\n{e}"));
    assert_eq!(jobs.len(), 1);
    jobs.remove(0)
}

const ALL_FIELDS: &str = "name, group, kind, shards, shard_params, min_workers, map_depth, nodes, \
                          on_task_failure, schedule, every, at, timezone, jitter, start_at, end_at, max_runs, calendar, calendar_mode, on_excluded, params, \
                          secret_params, timeout, misfire, \
                          misfire_grace, catchup_window, max_catchup, concurrency, retry, \
                          on_success, on_failure, on_complete, \
                          alerts, retention, paused, description";

#[test]
fn unknown_field_suggests_the_closest_field() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "send-reminders"
        group = "mail"
        shedule = "0 9 * * *"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "send-reminders": field "shedule" = "0 9 * * *": unknown field; did you mean "schedule"?"#
    );
}

#[test]
fn unknown_field_without_a_near_miss_lists_the_fields() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "send-reminders"
        group = "mail"
        notify = { email = "ops@example.com" }
        "#,
    );
    assert_eq!(
        error,
        format!(
            r#"jobs.toml: job "send-reminders": field "notify" = {{"email":"ops@example.com"}}: unknown field; remove it, or use one of the fields: {ALL_FIELDS}"#
        )
    );
}

#[test]
fn missing_name_names_the_job_by_position() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "first"
        group = "orders"

        [[jobs]]
        group = "orders"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job #2: field "name": missing; every job needs a unique name, such as "close-unpaid-orders""#
    );
}

#[test]
fn missing_group() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "send-reminders"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "send-reminders": field "group": missing; name the executor group whose workers run this job, such as "orders""#
    );
}

#[test]
fn invalid_name_says_the_allowed_characters_and_suggests_one() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "Close Orders"
        group = "orders"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "Close Orders": field "name" = "Close Orders": invalid name: 'C' is not allowed; use 1 to 63 characters from a-z, 0-9, "_", "." and "-", starting with a letter or digit, such as "close-orders""#
    );
}

#[test]
fn invalid_group_explains_the_queue_name() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "close-orders"
        group = "-orders"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "close-orders": field "group" = "-orders": invalid group: starts with '-' (a group name is part of RabbitMQ queue names); use 1 to 63 characters from a-z, 0-9, "_", "." and "-", starting with a letter or digit, such as "orders""#
    );
}

#[test]
fn identifier_rules() {
    let long = "a".repeat(64);
    let table = [
        ("orders", None),
        ("0rders.eu_west-1", None),
        (&"a".repeat(63), None),
        ("", Some("it is empty")),
        (&long, Some("64 characters is too long")),
        ("_orders", Some("starts with '_'")),
        ("orders queue", Some("' ' is not allowed")),
        ("ordérs", Some("'é' is not allowed")),
    ];
    for (text, want) in table {
        assert_eq!(identifier_problem(text).as_deref(), want, "{text:?}");
    }
    assert_eq!(slug("Close Orders!"), "close-orders");
    assert_eq!(slug("__Nightly  Export__"), "nightly-export");
    assert_eq!(slug("!!!"), "");
}

#[test]
fn duplicate_name_in_one_file_names_the_first() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "sync-stock"
        group = "inventory"

        [[jobs]]
        name = "sync-stock"
        group = "inventory"
        every = "5m"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "sync-stock": field "name" = "sync-stock": duplicate job name, first defined in job #1 of this file; job names must be unique across all job files, so rename one of them"#
    );
}

#[test]
fn duplicate_name_across_files_names_both_files() {
    let (a, b) = (fixture("dup_a.toml"), fixture("dup_b.yaml"));
    let errors = load_job_files(&[a.clone(), b.clone()]).unwrap_err().lines();
    assert_eq!(
        errors,
        [format!(
            r#"{}: job "sync-stock": field "name" = "sync-stock": duplicate job name, first defined in {} (job #1); job names must be unique across all job files, so rename one of them"#,
            b.display(),
            a.display()
        )]
    );
}

#[test]
fn more_than_one_of_schedule_every_at() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "heartbeat"
        group = "ops"
        schedule = "* * * * *"
        every = "30s"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "heartbeat": "schedule" and "every" are both set, but a job has at most one of "schedule", "every" and "at"; keep one, or none for a job that runs only when triggered"#
    );
    let errors = toml_errors(
        r#"
        [[jobs]]
        name = "heartbeat"
        group = "ops"
        schedule = "* * * * *"
        every = "30s"
        at = "2026-12-01T00:00:00Z"
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "heartbeat": "schedule", "every" and "at" are all set, but a job has at most one of "schedule", "every" and "at"; keep one, or none for a job that runs only when triggered"#
        ]
    );
}

#[test]
fn invalid_cron_uses_the_schedule_modules_reason() {
    let reason = match Schedule::cron("61 * * * *", Tz::UTC) {
        Err(ScheduleError::Cron { reason, .. }) => reason,
        other => panic!("expected a cron error, got {other:?}"),
    };
    let error = toml_error(
        r#"
        [[jobs]]
        name = "hourly-sync"
        group = "sync"
        schedule = "61 * * * *"
        "#,
    );
    assert_eq!(
        error,
        format!(
            r#"jobs.toml: job "hourly-sync": field "schedule" = "61 * * * *": invalid cron expression: {reason}"#
        )
    );
}

#[test]
fn unknown_time_zone_suggests_the_nearest_zone() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "close-unpaid-orders"
        group = "orders"
        schedule = "0 */2 * * * *"
        timezone = "Europe/Berln"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "close-unpaid-orders": field "timezone" = "Europe/Berln": unknown time zone; use an IANA name such as "Europe/Berlin""#
    );
}

#[test]
fn unknown_time_zone_suggestions() {
    let table = [
        ("europe/berlin", r#""Europe/Berlin""#),
        ("America/NewYork", r#""America/New_York""#),
        ("Asia/Beijing", r#""Asia/Shanghai""#),
        // Issue 12: abbreviations are not near misses of other zones (CST is not CET).
        (
            "CST",
            r#""Asia/Shanghai" (China Standard Time) or "America/Chicago" (US Central Time)"#,
        ),
        ("pdt", r#""America/Los_Angeles" (US Pacific Time)"#),
        ("JST", r#""Asia/Tokyo" (Japan Standard Time)"#),
        ("KST", r#""Asia/Seoul" (Korea Standard Time)"#),
        ("BST", r#""Europe/London" (British Time)"#),
        (
            "AEST",
            r#""Australia/Sydney" (Australian Eastern Time) or "Australia/Brisbane" (Queensland, no daylight saving)"#,
        ),
        (
            "IST",
            r#""Asia/Kolkata" (India Standard Time) or "Europe/Dublin" (Irish Time) or "Asia/Jerusalem" (Israel Time)"#,
        ),
        (
            "Mars/Olympus_Mons",
            r#""Europe/Berlin", "America/New_York" or "UTC""#,
        ),
    ];
    for (text, want) in table {
        assert_eq!(zone_suggestion(text), want, "{text:?}");
    }
}

#[test]
fn every_suggested_zone_for_an_abbreviation_exists_and_the_abbreviation_does_not() {
    for (abbreviation, zones) in ZONE_ABBREVIATIONS {
        for (zone, _) in *zones {
            assert!(zone.parse::<Tz>().is_ok(), "{abbreviation}: {zone}");
        }
    }
    // Those the tz database lacks get the suggestion; those it has (EST, CET, MST, …) parse,
    // and never reach it.
    for missing in [
        "CST", "PDT", "JST", "KST", "BST", "AEST", "IST", "PST", "EDT",
    ] {
        assert!(missing.parse::<Tz>().is_err(), "{missing} is a tz name now");
    }
}

#[test]
fn invalid_duration() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "nightly-export"
        group = "exports"
        timeout = "5 minutes please"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "nightly-export": field "timeout" = "5 minutes please": invalid duration (expected a number at "please"); write a number with a unit, such as "30s", "5m" or "1h30m""#
    );
}

#[test]
fn duration_problems() {
    let table = [
        ("", "empty"),
        ("30", "no unit after 30"),
        ("5 fortnights", "unknown unit \"fortnights\""),
        ("5m!", "unexpected character '!'"),
    ];
    for (text, want) in table {
        let error = humantime::parse_duration(text).unwrap_err();
        assert_eq!(duration_problem(text, &error), want, "{text:?}");
    }
}

#[test]
fn duration_without_a_unit() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "nightly-export"
        group = "exports"
        catchup_window = 300
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "nightly-export": field "catchup_window" = 300: a duration needs a unit; write it as a string such as "300s""#
    );
}

#[test]
fn at_must_be_an_rfc3339_instant() {
    let cases = [
        (
            r#"at = "next tuesday""#,
            r#"field "at" = "next tuesday": not an RFC 3339 instant; write a date, a time and a UTC offset, such as "2026-12-01T00:00:00+08:00" or "2026-12-01T00:00:00Z""#,
        ),
        (
            // A TOML local datetime, unquoted: `config` reads it as its text.
            r#"at = 2026-12-01T09:00:00"#,
            r#"field "at" = "2026-12-01T09:00:00": no UTC offset, so the instant is ambiguous; add one, such as "2026-12-01T09:00:00Z" or "2026-12-01T09:00:00+08:00""#,
        ),
        (
            r#"at = "2026-12-01""#,
            r#"field "at" = "2026-12-01": a date alone is not an instant; add a time and a UTC offset, such as "2026-12-01T00:00:00Z""#,
        ),
    ];
    for (line, want) in cases {
        let error = toml_error(&format!(
            "[[jobs]]\nname = \"launch\"\ngroup = \"web\"\n{line}\n"
        ));
        assert_eq!(error, format!(r#"jobs.toml: job "launch": {want}"#));
    }
}

#[test]
fn at_accepts_quoted_and_toml_datetimes() {
    for line in [
        r#"at = "2026-12-01T00:00:00+08:00""#,
        r#"at = 2026-12-01T00:00:00+08:00"#,
        r#"at = 2026-11-30T16:00:00Z"#,
    ] {
        let job = toml_job(&format!(
            "[[jobs]]\nname = \"launch\"\ngroup = \"web\"\n{line}\n"
        ));
        let When::At(at) = job.when else {
            panic!("{line}: {:?}", job.when);
        };
        assert_eq!(
            at.to_utc(),
            DateTime::parse_from_rfc3339("2026-11-30T16:00:00Z")
                .unwrap()
                .to_utc(),
            "{line}"
        );
    }
}

#[test]
fn invalid_enum_value_lists_the_allowed_values() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "nightly-export"
        group = "exports"
        misfire = "sometimes"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "nightly-export": field "misfire" = "sometimes": unknown value; use "skip", "fire_once" or "fire_all""#
    );
}

#[test]
fn invalid_enum_value_suggests_a_near_miss() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "nightly-export"
        group = "exports"
        concurrency = "Forbidden"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "nightly-export": field "concurrency" = "Forbidden": unknown value; did you mean "forbid"? (use "allow", "forbid", "queue" or "replace")"#
    );
    let error = toml_error(
        "[[jobs]]\nname = \"nightly-export\"\ngroup = \"exports\"\nmisfire = \"fire-once\"\n",
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "nightly-export": field "misfire" = "fire-once": unknown value; did you mean "fire_once"? (use "skip", "fire_once" or "fire_all")"#
    );
}

#[test]
fn params_must_be_a_table() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "close-unpaid-orders"
        group = "orders"
        params = [500]
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "close-unpaid-orders": field "params" = [500]: params must be a table of named values (a JSON object), found a list; wrap the value in a table, such as params = { batch = 500 } in TOML or params: { batch: 500 } in YAML"#
    );
}

#[test]
fn params_holding_quoted_json_gets_told_to_unquote_it() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "close-unpaid-orders"
        group = "orders"
        params = '{"batch": 500}'
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "close-unpaid-orders": field "params" = "{\"batch\": 500}": params must be a table of named values (a JSON object), found a string; this string holds JSON: write the table itself instead of quoting it, such as params = { batch = 500 } in TOML or params: { batch: 500 } in YAML"#
    );
}

#[test]
fn params_values_json_cannot_hold() {
    let errors = toml_errors(
        r#"
        [[jobs]]
        name = "rebalance"
        group = "orders"
        params = { ratio = nan, limits = [1.0, inf] }
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "rebalance": field "params.limits.1" = inf: JSON has no NaN or infinity; use a finite number, or quote it as a string"#,
            r#"jobs.toml: job "rebalance": field "params.ratio" = NaN: JSON has no NaN or infinity; use a finite number, or quote it as a string"#,
        ]
    );
}

#[test]
fn toml_dates_in_params_arrive_as_their_text() {
    let job = toml_job(
        r#"
        [[jobs]]
        name = "report"
        group = "reports"
        params = { since = 2026-01-01, at = 07:30:00 }
        "#,
    );
    assert_eq!(
        job.params,
        serde_json::json!({"since": "2026-01-01", "at": "07:30:00"})
    );
}

#[test]
fn max_catchup_zero_with_fire_all() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "billing-close"
        group = "billing"
        schedule = "0 0 * * *"
        misfire = "fire_all"
        max_catchup = 0
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "billing-close": field "max_catchup" = 0: with misfire = "fire_all" at least one missed fire must be allowed; set max_catchup to 1 or more, or use misfire = "skip""#
    );
    // Zero is fine with the other policies.
    let job = toml_job(
        "[[jobs]]\nname = \"billing-close\"\ngroup = \"billing\"\nmisfire = \"skip\"\nmax_catchup = 0\n",
    );
    assert_eq!(job.max_catchup, 0);
}

#[test]
fn every_zero() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "heartbeat"
        group = "ops"
        every = "0s"
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "heartbeat": field "every" = "0s": the period must be at least 1ms; use a duration such as "30s" or "5m""#
    );
}

#[test]
fn timeout_zero() {
    let error = toml_error("[[jobs]]\nname = \"heartbeat\"\ngroup = \"ops\"\ntimeout = \"0s\"\n");
    assert_eq!(
        error,
        r#"jobs.toml: job "heartbeat": field "timeout" = "0s": a timeout must be longer than 0s; remove the field for no timeout"#
    );
}

#[test]
fn wrong_types() {
    let errors = toml_errors(
        r#"
        [[jobs]]
        name = 2024
        group = "reports"
        paused = "yes"
        max_catchup = -1
        description = ["a", "b"]
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job #1: field "name" = 2024: expected a string, found a number; quote it: "2024""#,
            r#"jobs.toml: job #1: field "max_catchup" = -1: expected a whole number from 0 to 1000"#,
            r#"jobs.toml: job #1: field "paused" = "yes": expected true or false, found a string"#,
            r#"jobs.toml: job #1: field "description" = ["a","b"]: expected a string, found a list"#,
        ]
    );
}

#[test]
fn every_mistake_of_every_job_is_reported_in_order() {
    let errors = toml_errors(
        r#"
        [[jobs]]
        name = "a"
        group = "g"
        shedule = "* * * * *"
        timezone = "Nowhere/Special"

        [[jobs]]
        name = "b"
        group = "g"

        [[jobs]]
        name = "c"
        every = "soon"
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "a": field "shedule" = "* * * * *": unknown field; did you mean "schedule"?"#,
            r#"jobs.toml: job "a": field "timezone" = "Nowhere/Special": unknown time zone; use an IANA name such as "Europe/Berlin", "America/New_York" or "UTC""#,
            r#"jobs.toml: job "c": field "group": missing; name the executor group whose workers run this job, such as "orders""#,
            r#"jobs.toml: job "c": field "every" = "soon": invalid duration (expected a number at "soon"); write a number with a unit, such as "30s", "5m" or "1h30m""#,
        ]
    );
}

#[test]
fn unknown_top_level_key() {
    let errors = toml_errors(
        r#"
        [[job]]
        name = "a"
        group = "g"

        database_url = "postgres://localhost/chime"
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: key "job" = [{"database_url":"postgres://localhost/chime","group":"g","name":"a"}]: unknown key; did you mean "jobs"?"#,
        ]
    );
    let error = toml_error("database_url = \"postgres://localhost/chime\"\n");
    assert_eq!(
        error,
        r#"jobs.toml: key "database_url" = "postgres://localhost/chime": unknown key; a job file holds "jobs" and "workflows" lists and "calendars" tables (this looks like a setting: it belongs in the settings file)"#
    );
}

#[test]
fn jobs_must_be_a_list_of_tables() {
    let error = toml_error("jobs = \"nightly\"\n");
    assert_eq!(
        error,
        r#"jobs.toml: key "jobs" = "nightly": expected a list of job tables: [[jobs]] sections in TOML, "- name: …" items under "jobs:" in YAML"#
    );
    let error = yaml_error("jobs:\n  - nightly\n");
    assert_eq!(
        error,
        r#"jobs.yaml: job #1 = "nightly": expected a table of job fields, such as name, group and schedule"#
    );
}

#[test]
fn toml_syntax_error_is_one_line() {
    let error = toml_error("[[jobs]]\nname = \"a\ngroup = \"g\"\n");
    assert!(!error.contains('\n'), "{error}");
    assert!(
        error.starts_with("jobs.toml: not valid TOML: TOML parse error at line 2, column"),
        "{error}"
    );
}

#[test]
fn yaml_unquoted_cron_gets_a_quoting_hint() {
    let error = yaml_error("jobs:\n  - name: a\n    group: g\n    schedule: */5 * * * *\n");
    assert!(error.starts_with("jobs.yaml: not valid YAML: "), "{error}");
    assert!(
        error.ends_with(
            r#"; quote values that start with "*", "@", "&" or "!", such as schedule: "*/5 * * * *""#
        ),
        "{error}"
    );
}

#[test]
fn yaml_null_counts_as_absent() {
    let jobs = parse_job_file(
        "jobs.yaml",
        "jobs:\n  - name: a\n    group: g\n    schedule: ~\n    every: 1m\n    params:\n",
        SourceFormat::Yaml,
    )
    .unwrap();
    assert_eq!(jobs[0].when, When::Every(Duration::from_secs(60)));
    assert_eq!(jobs[0].params, serde_json::Value::Null);
}

#[test]
fn yaml_merge_keys_are_explained() {
    let errors = parse_job_file(
        "jobs.yaml",
        "defaults: &defaults\n  group: g\njobs:\n  - name: a\n    <<: *defaults\n",
        SourceFormat::Yaml,
    )
    .unwrap_err()
    .lines();
    // A merge key refers to its shared fields by alias, and aliases are refused before parsing.
    assert_eq!(
        errors,
        [
            r#"jobs.yaml: line 5: YAML aliases ("*name", and merge keys "<<: *name") are not supported; write the value out where it is used, and quote values that start with "*", such as schedule: "*/5 * * * *""#,
        ]
    );
    // Without an alias, "<<" is an unknown field like any other.
    let errors = parse_job_file(
        "jobs.yaml",
        "jobs:\n  - name: a\n    <<: { group: g }\n",
        SourceFormat::Yaml,
    )
    .unwrap_err()
    .lines();
    assert_eq!(
        errors,
        [
            r#"jobs.yaml: job "a": field "<<" = {"group":"g"}: unknown field; YAML merge keys ("<<") are not supported, so write the shared fields out in each job"#,
            r#"jobs.yaml: job "a": field "group": missing; name the executor group whose workers run this job, such as "orders""#,
        ]
    );
}

#[test]
fn empty_file_has_no_jobs() {
    assert_eq!(
        parse_job_file("jobs.toml", "", SourceFormat::Toml),
        Ok(vec![])
    );
    assert_eq!(
        parse_job_file("jobs.yaml", "", SourceFormat::Yaml),
        Ok(vec![])
    );
}

#[test]
fn good_toml_and_yaml_load_to_the_same_specs() {
    let toml = load_job_files(&[fixture("good.toml")]).unwrap_or_else(|e| panic!("{e}"));
    let yaml = load_job_files(&[fixture("good.yaml")]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(toml, yaml);

    let names: Vec<&str> = toml.iter().map(|job| job.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "close-unpaid-orders",
            "weekday-report",
            "heartbeat",
            "new-year-banner",
            "rebuild-search-index"
        ]
    );
    let orders = &toml[0];
    assert_eq!(orders.group, "orders");
    assert_eq!(orders.when, When::Cron("0 */2 * * * *".into()));
    assert_eq!(orders.timezone, chrono_tz::Asia::Shanghai);
    assert_eq!(
        orders.params,
        serde_json::json!({
            "batch": 500, "dry_run": false, "ratio": 0.5, "regions": ["eu", "us"],
            "filter": {"status": "unpaid"}
        })
    );
    assert_eq!(orders.timeout, Some(Duration::from_secs(300)));
    assert_eq!(orders.misfire, MisfirePolicy::FireAll);
    assert_eq!(orders.misfire_grace, Duration::from_secs(10));
    assert_eq!(orders.catchup_window, Duration::from_secs(1800));
    assert_eq!(orders.max_catchup, 10);
    assert_eq!(orders.concurrency, ConcurrencyPolicy::Forbid);
    assert_eq!(
        orders.description.as_deref(),
        Some("Cancel orders left unpaid for 30 minutes")
    );
    let heartbeat = &toml[2];
    assert_eq!(heartbeat.when, When::Every(Duration::from_secs(30)));
    assert_eq!(heartbeat.timezone, Tz::UTC);
    assert_eq!(heartbeat.misfire, MisfirePolicy::FireOnce, "the default");
    let banner = &toml[3];
    assert_eq!(
        banner.when,
        When::At(DateTime::parse_from_rfc3339("2027-01-01T00:00:00+08:00").unwrap())
    );
    assert!(banner.paused);
    let manual = &toml[4];
    assert_eq!(manual.when, When::Manual);
}

#[test]
fn deploy_examples_load_and_agree() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let toml = load_job_files(&[examples.join("jobs.toml")]).unwrap_or_else(|e| panic!("{e}"));
    let yaml = load_job_files(&[examples.join("jobs.yaml")]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(toml, yaml);
    assert!(toml.len() >= 6, "one example of each kind of schedule");
    assert!(toml.iter().all(|job| job.group == "examples"));
}

#[test]
fn job_fields_match_the_spec_serde_form() {
    let spec = JobSpec {
        name: "a".into(),
        group: "g".into(),
        kind: Kind::Single,
        on_task_failure: crate::job::TaskFailurePolicy::Fail,
        when: When::Manual,
        timezone: Tz::UTC,
        jitter: Some(Duration::from_secs(1)),
        start_at: Some(DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z").unwrap()),
        end_at: Some(DateTime::parse_from_rfc3339("2026-12-02T00:00:00Z").unwrap()),
        max_runs: Some(3),
        calendar: Some(crate::schedule::CalendarDef {
            name: "c".into(),
            ..Default::default()
        }),
        calendar_mode: crate::job::CalendarMode::Except,
        on_excluded: crate::schedule::OnExcluded::NextAllowed,
        calendar_ref: None,
        params: serde_json::json!({}),
        secret_params: vec!["token".into()],
        timeout: Some(Duration::from_secs(1)),
        misfire: MisfirePolicy::Skip,
        misfire_grace: Duration::from_secs(1),
        catchup_window: Duration::from_secs(1),
        max_catchup: 1,
        concurrency: ConcurrencyPolicy::Allow,
        retry: crate::job::RetrySpec::default(),
        children: crate::job::ChildJobs {
            on_success: vec!["b".into()],
            on_failure: vec!["c".into()],
            on_complete: vec!["d".into()],
        },
        alerts: Some(crate::job::AlertSpec::default()),
        retention: Some(Duration::from_secs(3600)),
        paused: false,
        description: Some("d".into()),
    };
    let whens = [
        When::Cron("* * * * *".into()),
        When::Every(Duration::from_secs(1)),
        When::At(DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z").unwrap()),
    ];
    // Every kind with every field of it off its default, so each stored key shows.
    let kinds = [
        Kind::Broadcast { min_workers: 2 },
        Kind::Sharded {
            shards: crate::job::Shards::Count(2),
            params: vec![serde_json::json!("a")],
        },
        Kind::MapReduce { map_depth: 1 },
        Kind::Workflow {
            nodes: vec![crate::workflow::Node {
                name: "n".into(),
                job: "j".into(),
                after: Vec::new(),
                on_failure: crate::workflow::NodeFailurePolicy::Continue,
                params: None,
            }],
        },
    ];
    let mut serde_fields: Vec<String> = Vec::new();
    for (when, kind) in whens.into_iter().cycle().zip(kinds) {
        let spec = JobSpec {
            when,
            kind,
            on_task_failure: crate::job::TaskFailurePolicy::Ignore,
            ..spec.clone()
        };
        let serde_json::Value::Object(form) = serde_json::to_value(&spec).unwrap() else {
            panic!("a JobSpec serialises to an object");
        };
        serde_fields.extend(form.keys().cloned());
    }
    serde_fields.sort();
    serde_fields.dedup();
    let mut ours = JOB_FIELDS.to_vec();
    ours.sort();
    assert_eq!(ours, serde_fields, "JOB_FIELDS must list JobSpec's fields");
}

#[test]
fn validate_job_takes_api_json_too() {
    let body = serde_json::json!({"name": "a", "group": "g", "every": "1m", "tiemout": "5s"});
    let errors = validate_job(body.as_object().unwrap()).unwrap_err();
    assert_eq!(
        errors,
        [FieldError {
            field: Some("tiemout".into()),
            value: Some("\"5s\"".into()),
            message: "unknown field; did you mean \"timeout\"?".into(),
        }]
    );
}

#[test]
fn patterns_expand_to_job_files_only_in_order() {
    let dir = fixture("jobs.d");
    let pattern = dir.join("*");
    let paths = expand_job_patterns(&[pattern, dir.join("orders.toml")]).unwrap();
    assert_eq!(paths, [dir.join("orders.toml"), dir.join("reports.yml")]);
}

#[test]
fn pattern_matching_nothing_is_an_error() {
    let pattern = fixture("job.d/*.toml");
    let errors = expand_job_patterns(std::slice::from_ref(&pattern))
        .unwrap_err()
        .lines();
    assert_eq!(
        errors,
        [format!(
            "{}: no .toml, .yaml or .yml file matches this pattern; check the path (relative paths in a settings file are read from that file's directory)",
            pattern.display()
        )]
    );
}

#[test]
fn unreadable_and_unsupported_files() {
    let missing = fixture("missing.toml");
    let json = fixture("jobs.json");
    let errors = load_job_files(&[missing.clone(), json.clone()])
        .unwrap_err()
        .lines();
    assert_eq!(errors.len(), 2);
    assert!(
        errors[0].starts_with(&format!("{}: cannot read: ", missing.display())),
        "{}",
        errors[0]
    );
    assert_eq!(
        errors[1],
        format!(
            "{}: unsupported file type; job files end in .toml, .yaml or .yml",
            json.display()
        )
    );
}

#[test]
fn one_line_squeezes_a_toml_report() {
    let report = "TOML parse error at line 2, column 8\n  |\n2 | name = \"a\n  |        ^\ninvalid basic string, expected `\"`\n";
    assert_eq!(
        one_line(report),
        "TOML parse error at line 2, column 8: invalid basic string, expected `\"`"
    );
}

#[test]
fn retry_table_is_checked_key_by_key() {
    let errors = toml_errors(
        r#"
        [[jobs]]
        name = "bill"
        group = "billing"
        retry = { max_attempts = 0, initial = "0s", multiplier = 0.5, max = "1h", jiter = true }
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "bill": field "retry.jiter" = true: unknown field; did you mean "jitter"?"#,
            r#"jobs.toml: job "bill": field "retry.max_attempts" = 0: at least 1 attempt is needed; use 1 for no retry"#,
            r#"jobs.toml: job "bill": field "retry.initial" = "0s": the first delay must be longer than 0s, such as "1s""#,
            r#"jobs.toml: job "bill": field "retry.multiplier" = 0.5: expected a number from 1 to 100, such as 2 (each delay twice the last)"#,
        ]
    );
}

#[test]
fn retry_max_shorter_than_initial() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "bill"
        group = "billing"
        retry = { initial = "1m", max = "10s" }
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "bill": field "retry.max" = "10s": the longest delay is shorter than the first; make max at least as long as initial"#
    );
}

#[test]
fn retry_must_be_a_table() {
    let error = toml_error(
        r#"
        [[jobs]]
        name = "bill"
        group = "billing"
        retry = 3
        "#,
    );
    assert_eq!(
        error,
        r#"jobs.toml: job "bill": field "retry" = 3: retry must be a table, found a number; write it such as retry = { max_attempts = 4, initial = "10s" }"#
    );
}

#[test]
fn retry_defaults_fill_what_is_not_given() {
    let job = toml_job(
        r#"
        [[jobs]]
        name = "bill"
        group = "billing"
        retry = { max_attempts = 5, initial = "1s", jitter = false }
        "#,
    );
    assert_eq!(
        job.retry,
        crate::job::RetrySpec {
            max_attempts: 5,
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max: Duration::from_secs(600),
            jitter: false,
        }
    );
}

#[test]
fn alerts_table_sets_a_jobs_own_webhook_and_format() {
    let job = toml_job(
        r#"
        [[jobs]]
        name = "bill"
        group = "billing"
        alerts = { webhook = "https://hooks.example.com/chime", format = "slack" }
        "#,
    );
    assert_eq!(
        job.alerts,
        Some(crate::job::AlertSpec {
            webhook: Some("https://hooks.example.com/chime".into()),
            format: Some(crate::job::AlertFormat::Slack),
        })
    );
    let plain = toml_job("[[jobs]]\nname = \"a\"\ngroup = \"g\"\n");
    assert_eq!(plain.alerts, None);
    let stored = serde_json::to_value(&plain).unwrap();
    assert!(
        stored.get("alerts").is_none(),
        "a job without alerts stores as before: {stored}"
    );
}

#[test]
fn alerts_table_is_checked_key_by_key() {
    let errors = toml_errors(
        r##"
        [[jobs]]
        name = "bill"
        group = "billing"
        alerts = { webhook = "hooks.example.com", format = "teams", chanel = "#ops" }
        "##,
    );
    assert_eq!(
        errors,
        [
            r##"jobs.toml: job "bill": field "alerts.chanel" = "#ops": unknown field; remove it, or use one of the fields: webhook, format"##,
            r#"jobs.toml: job "bill": field "alerts.webhook" = "hooks.example.com": expected an http:// or https:// URL, such as "https://hooks.slack.com/services/…""#,
            r#"jobs.toml: job "bill": field "alerts.format" = "teams": unknown value; use "generic" or "slack""#,
        ]
    );
    let errors = toml_errors("[[jobs]]\nname = \"a\"\ngroup = \"g\"\nalerts = \"slack\"\n");
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "a": field "alerts" = "slack": alerts must be a table, found a string; write it such as alerts = { webhook = "https://hooks.example.com/chime", format = "slack" }"#
        ]
    );
}

#[test]
fn retention_is_a_duration_of_at_least_a_minute() {
    let body = serde_json::json!({"name": "a", "group": "g", "retention": "30s"});
    let errors = validate_job(body.as_object().unwrap()).unwrap_err();
    assert_eq!(
        errors,
        [FieldError {
            field: Some("retention".into()),
            value: Some("\"30s\"".into()),
            message: "keep finished runs at least 1m; write a duration such as \"7days\"".into(),
        }]
    );
    let body = serde_json::json!({"name": "a", "group": "g", "retention": "7days"});
    let spec = validate_job(body.as_object().unwrap()).unwrap();
    assert_eq!(spec.retention, Some(Duration::from_secs(7 * 24 * 3600)));
}

/// A TOML job file read as one document, without the chunked path.
fn whole_document(text: &str) -> Result<Vec<JobSpec>, Vec<String>> {
    let mut reader = Reader::default();
    reader.read_document("jobs.toml", text, SourceFormat::Toml);
    reader
        .finish()
        .map(|jobs| jobs.into_iter().map(|job| job.spec).collect())
        .map_err(|errors| errors.lines())
}

/// A TOML job file read as `chime` reads it (chunk by chunk where possible).
fn as_read(text: &str) -> Result<Vec<JobSpec>, Vec<String>> {
    parse_job_file("jobs.toml", text, SourceFormat::Toml).map_err(|errors| errors.lines())
}

#[test]
fn toml_is_split_at_job_headers() {
    let text = "# jobs\n[[jobs]]\nname = \"a\"\n  [[jobs]]  \r\nname = \"b\"\n";
    assert_eq!(
        toml_job_chunks(text),
        Some(vec![
            "# jobs\n",
            "[[jobs]]\nname = \"a\"\n",
            "  [[jobs]]  \r\nname = \"b\"\n"
        ])
    );
    assert_eq!(toml_job_chunks("jobs = []\n"), None);
    assert_eq!(
        toml_job_chunks("[[jobs]]\nname = \"a\"\ndescription = '''\n[[jobs]]\n'''\n"),
        None
    );
}

#[test]
fn chunked_toml_reads_the_jobs_of_the_whole_document() {
    let text = r#"
        # Nightly work.
        [[jobs]]
        name = "close-unpaid-orders"
        group = "orders"
        schedule = "0 3 * * *"
        timezone = "Europe/Berlin"
        params = { older_than = "2d", limits = [1, 2.5, true] }

        [jobs.retry]
        max_attempts = 5
        initial = "30s"

        [[jobs]]
        name = "send-reminders"
        group = "mail"
        every = "15m"
        [jobs.params]
        template = "reminder"
        [[jobs.params.batches]]
        size = 100
        [[jobs.params.batches]]
        size = 200
        [jobs.alerts]
        webhook = "https://hooks.example.com/chime"
        format = "slack"

        [[jobs]]
        name = "manual"
        group = "ops"
        description = "run by hand; [[jobs]] in a string is text"
        at = 2026-12-01T00:00:00Z
        "#;
    assert_eq!(toml_job_chunks(text).map(|chunks| chunks.len()), Some(4));
    let jobs = as_read(text).unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0].retry.max_attempts, 5);
    assert_eq!(
        jobs[1].params,
        serde_json::json!({"template": "reminder", "batches": [{"size": 100}, {"size": 200}]})
    );
    assert_eq!(Ok(jobs), whole_document(text));
}

#[test]
fn chunked_toml_gives_the_messages_of_the_whole_document() {
    let text = r#"
        database_url = "postgres://localhost/chime"

        [[jobs]]
        name = "a"
        group = "g"
        shedule = "0 9 * * *"

        [[jobs]]
        group = "g"

        [[jobs]]
        name = "a"
        group = "g"
        params = { ratio = nan }

        [[jobs]]
        name = "b"
        group = "g"
        every = "soon"
        "#;
    let errors = as_read(text).unwrap_err();
    assert_eq!(
        errors,
        [
            r#"jobs.toml: key "database_url" = "postgres://localhost/chime": unknown key; a job file holds "jobs" and "workflows" lists and "calendars" tables (this looks like a setting: it belongs in the settings file)"#,
            r#"jobs.toml: job "a": field "shedule" = "0 9 * * *": unknown field; did you mean "schedule"?"#,
            r#"jobs.toml: job #2: field "name": missing; every job needs a unique name, such as "close-unpaid-orders""#,
            r#"jobs.toml: job "a": field "params.ratio" = NaN: JSON has no NaN or infinity; use a finite number, or quote it as a string"#,
            r#"jobs.toml: job "a": field "name" = "a": duplicate job name, first defined in job #1 of this file; job names must be unique across all job files, so rename one of them"#,
            r#"jobs.toml: job "b": field "every" = "soon": invalid duration (expected a number at "soon"); write a number with a unit, such as "30s", "5m" or "1h30m""#,
        ]
    );
    assert_eq!(Err(errors), whole_document(text));
}

#[test]
fn toml_syntax_error_in_a_later_job_gives_its_line_in_the_file() {
    let text = "[[jobs]]\nname = \"a\"\ngroup = \"g\"\n\n[[jobs]]\nname = \"b\"\ngroup = \"g\n";
    let error = toml_error(text);
    assert!(
        error.starts_with("jobs.toml: not valid TOML: TOML parse error at line 7, column"),
        "{error}"
    );
    assert_eq!(Err(vec![error]), whole_document(text));
}

#[test]
fn toml_that_is_not_one_job_per_chunk_is_read_whole() {
    // A table after the last job is a top-level key, not part of the job.
    let after = "[[jobs]]\nname = \"a\"\ngroup = \"g\"\n\n[defaults]\ngroup = \"g\"\n";
    assert_eq!(
        as_read(after),
        Err(vec![
            r#"jobs.toml: key "defaults" = {"group":"g"}: unknown key; a job file holds "jobs" and "workflows" lists and "calendars" tables"#
                .to_owned()
        ])
    );
    // Jobs both as an inline list and as [[jobs]] sections: the document's own error.
    let both =
        "jobs = [{ name = \"a\", group = \"g\" }]\n\n[[jobs]]\nname = \"b\"\ngroup = \"g\"\n";
    let errors = as_read(both).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("jobs.toml: not valid TOML: "),
        "{errors:?}"
    );
    assert_eq!(Err(errors), whole_document(both));
    // Two jobs under one header line with a comment: read whole, both jobs kept.
    let commented =
        "[[jobs]] # first\nname = \"a\"\ngroup = \"g\"\n[[jobs]]\nname = \"b\"\ngroup = \"g\"\n";
    let jobs = as_read(commented).unwrap();
    assert_eq!(
        jobs.iter().map(|job| job.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn durations_and_counts_beyond_their_limits_name_the_limit() {
    let errors = toml_errors(
        r#"
        [[jobs]]
        name = "absurd"
        group = "g"
        every = "10000years"
        timeout = "8days"
        misfire_grace = "367days"
        max_catchup = 1001
        retention = "10000years"
        retry = { max_attempts = 3000000000, initial = "300000years", max = "300000years", multiplier = 101 }
        "#,
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "absurd": field "every" = "10000years": too long: a period is at most 366days; write a duration up to "366days""#,
            r#"jobs.toml: job "absurd": field "timeout" = "8days": too long: a timeout is at most 7days; write a duration up to "7days""#,
            r#"jobs.toml: job "absurd": field "misfire_grace" = "367days": too long: the grace is at most 366days; write a duration up to "366days""#,
            r#"jobs.toml: job "absurd": field "max_catchup" = 1001: too large: the limit is 1000; use a whole number from 0 to 1000"#,
            r#"jobs.toml: job "absurd": field "retry.max_attempts" = 3000000000: too large: the limit is 1000; use a whole number from 0 to 1000"#,
            r#"jobs.toml: job "absurd": field "retry.initial" = "300000years": too long: a retry delay is at most 7days; write a duration up to "7days""#,
            r#"jobs.toml: job "absurd": field "retry.multiplier" = 101: expected a number from 1 to 100, such as 2 (each delay twice the last)"#,
            r#"jobs.toml: job "absurd": field "retry.max" = "300000years": too long: a retry delay is at most 7days; write a duration up to "7days""#,
            r#"jobs.toml: job "absurd": field "retention" = "10000years": too long: retention is at most 100years; write a duration up to "100years""#,
        ]
    );
}

#[test]
fn values_at_their_limits_load() {
    let job = toml_job(
        r#"
        [[jobs]]
        name = "at-the-limits"
        group = "g"
        every = "366days"
        timeout = "7days"
        misfire = "fire_all"
        misfire_grace = "366days"
        catchup_window = "366days"
        max_catchup = 1000
        retention = "100years"
        retry = { max_attempts = 1000, initial = "7days", max = "7days", multiplier = 100 }
        "#,
    );
    assert_eq!(job.when, When::Every(chime_protocol::limits::MAX_EVERY));
    assert_eq!(job.retention, Some(chime_protocol::limits::MAX_RETENTION));
    assert_eq!(job.retry.max_attempts, chime_protocol::limits::MAX_ATTEMPTS);
    assert_eq!(job.retry.max, chime_protocol::limits::MAX_RETRY_DELAY);
    assert_eq!(job.max_catchup, chime_protocol::limits::MAX_CATCHUP);
}

#[test]
fn trigger_params_are_checked_like_job_params() {
    assert_eq!(validate_params(&Value::Null), Ok(()));
    assert_eq!(validate_params(&serde_json::json!({"batch": 7})), Ok(()));
    let error = validate_params(&serde_json::json!([1, 2])).expect_err("a list");
    assert_eq!(error.field.as_deref(), Some("params"));
    assert_eq!(error.value.as_deref(), Some("[1,2]"));
    assert!(
        error
            .message
            .starts_with("params must be a table of named values (a JSON object), found a list"),
        "{error:?}"
    );
    let big = serde_json::json!({"blob": "x".repeat(MAX_PARAMS_BYTES)});
    let error = validate_params(&big).expect_err("too large");
    assert!(
        error.message.starts_with(&format!(
            "{} bytes as JSON, more than the limit of 65536 bytes",
            MAX_PARAMS_BYTES + 11
        )),
        "{error:?}"
    );
    let mut deep = serde_json::json!(1);
    for _ in 0..MAX_NESTING {
        deep = serde_json::json!({ "a": deep });
    }
    assert_eq!(validate_params(&deep), Ok(()), "{MAX_NESTING} levels");
    let deeper = serde_json::json!({ "a": deep });
    assert!(
        validate_params(&deeper)
            .expect_err("too deep")
            .message
            .starts_with("nested 65 levels deep, more than the limit of 64")
    );
}

#[test]
fn yaml_bombs_are_refused_before_parsing() {
    // The classic billion laughs, 9 levels of 9 aliases: ~387 million strings once expanded.
    let mut bomb =
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
            .to_owned();
    for (prev, next) in "abcdefgh".chars().zip("bcdefghi".chars()) {
        let refs = vec![format!("*{prev}"); 9].join(",");
        bomb.push_str(&format!("{next}: &{next} [{refs}]\n"));
    }
    assert!(bomb.len() < 450, "{}", bomb.len());
    let error = yaml_error(&bomb);
    assert!(
        error.starts_with(
            "jobs.yaml: line 2: YAML aliases (\"*name\", and merge keys \"<<: *name\") are not \
             supported"
        ),
        "{error}"
    );

    let deep = format!("jobs:\n{}x\n", "- ".repeat(100_000));
    assert!(deep.len() > 200_000);
    assert_eq!(
        yaml_error(&deep),
        "jobs.yaml: line 2: lists and tables nested more than 64 levels deep; flatten the \
         structure (a job file needs a few levels, params a few more)"
    );

    // An anchor that nothing refers to is harmless.
    let jobs = parse_job_file(
        "jobs.yaml",
        "jobs:\n  - &first\n    name: a\n    group: g\n",
        SourceFormat::Yaml,
    )
    .expect("anchors alone load");
    assert_eq!(jobs.len(), 1);
}
