//! The stored form of a job (`chime_jobs.spec`, API JSON) pinned to what the scheduler wrote
//! before `when` and `kind` replaced three optional fields: every documented job file stores
//! exactly the JSON it did, and those stored definitions read back into the same jobs. The job
//! kinds' documented files are pinned the same way, from when they were added: their flat keys
//! (`kind`, `shards`, `shard_params`, ...) are what SQL reads from `chime_jobs.spec`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::DateTime;

use super::*;
use crate::config::{SourceFormat, load_job_files, parse_job_file, validate_job};

/// `deploy/examples/jobs.toml` and `jobs.yaml`.
const EXAMPLES: &[&str] = &[
    r##"{"name":"weekday-digest","group":"examples","schedule":"30 9 * * MON-FRI","timezone":"Europe/Berlin","params":null,"timeout":"10m","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"forbid","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false,"description":"Mail the support team yesterday's open tickets"}"##,
    r##"{"name":"close-unpaid-orders","group":"examples","schedule":"0 */2 * * * *","timezone":"Asia/Shanghai","params":{"batch":500,"older_than_minutes":30},"timeout":"5m","misfire":"skip","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"forbid","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"nightly-ledger-export","group":"examples","schedule":"0 15 2 ? * 2-6 *","timezone":"America/New_York","params":{"bucket":"ledger-exports","format":"parquet"},"timeout":"1h","misfire":"fire_all","misfire_grace":"5s","catchup_window":"3days","max_catchup":3,"concurrency":"queue","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"purge-temp-uploads","group":"examples","schedule":"@hourly","timezone":"UTC","params":{"older_than":"6h"},"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"refresh-exchange-rates","group":"examples","every":"30s","timezone":"UTC","params":null,"timeout":"20s","misfire":"fire_once","misfire_grace":"2s","catchup_window":"1h","max_catchup":100,"concurrency":"replace","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"open-spring-sale","group":"examples","at":"2027-03-01T08:00:00+01:00","timezone":"UTC","params":{"campaign":"spring-2027"},"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":true}"##,
    r##"{"name":"reindex-products","group":"examples","timezone":"UTC","params":{"full":true,"notify":{"channel":"#search"},"shards":[1,2,3]},"timeout":"2h","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false,"description":"Rebuild the product search index"}"##,
];
/// `deploy/examples/job-kinds.toml` and `job-kinds.yaml`.
const KIND_EXAMPLES: &[&str] = &[
    r##"{"name":"flush-local-caches","group":"examples","kind":"broadcast","min_workers":2,"on_task_failure":"ignore","schedule":"0 4 * * *","timezone":"Europe/Berlin","params":null,"timeout":"1m","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"recalculate-city-prices","group":"examples","kind":"sharded","shards":4,"shard_params":["Beijing","Shanghai","Guangzhou","Shenzhen"],"schedule":"0 2 * * *","timezone":"Asia/Shanghai","params":{"currency":"CNY"},"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"forbid","retry":{"max_attempts":5,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"scan-customer-partitions","group":"examples","kind":"sharded","shards":"workers","shard_params":[{"also_archived":true}],"every":"1h","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"monthly-invoices","group":"examples","kind":"map_reduce","map_depth":2,"schedule":"0 0 1 * *","timezone":"Europe/Berlin","params":null,"timeout":"30m","misfire":"fire_all","misfire_grace":"5s","catchup_window":"3days","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// `deploy/local/demo-jobs.toml`.
const DEMO: &[&str] = &[
    r##"{"name":"heartbeat","group":"examples","every":"2s","timezone":"UTC","params":{"note":"demo"},"misfire":"skip","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// `scheduler/tests/fixtures/good.toml` and `good.yaml`.
const FIXTURES: &[&str] = &[
    r##"{"name":"close-unpaid-orders","group":"orders","schedule":"0 */2 * * * *","timezone":"Asia/Shanghai","params":{"batch":500,"dry_run":false,"filter":{"status":"unpaid"},"ratio":0.5,"regions":["eu","us"]},"timeout":"5m","misfire":"fire_all","misfire_grace":"10s","catchup_window":"30m","max_catchup":10,"concurrency":"forbid","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false,"description":"Cancel orders left unpaid for 30 minutes"}"##,
    r##"{"name":"weekday-report","group":"reports","schedule":"30 9 * * MON-FRI","timezone":"Europe/Berlin","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"heartbeat","group":"ops","every":"30s","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"replace","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"new-year-banner","group":"web","at":"2027-01-01T00:00:00+08:00","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":true}"##,
    r##"{"name":"rebuild-search-index","group":"search","timezone":"UTC","params":{"full":true},"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// `scheduler/tests/fixtures/jobs.d/`: `orders.toml`, then `reports.yml`.
const JOBS_D: &[&str] = &[
    r##"{"name":"close-unpaid-orders","group":"orders","schedule":"0 */2 * * * *","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"weekday-report","group":"reports","schedule":"30 9 * * MON-FRI","timezone":"Europe/Berlin","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// The job file of docs/configuration.md, in TOML and in YAML.
const CONFIGURATION_MD: &[&str] = &[
    r##"{"name":"close-unpaid-orders","group":"orders","schedule":"0 */2 * * * *","timezone":"Asia/Shanghai","params":{"batch":500},"timeout":"5m","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"forbid","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// The job file of docs/configuration.md's "Job kinds", in TOML and in YAML.
const CONFIGURATION_MD_KINDS: &[&str] = &[
    r##"{"name":"flush-local-caches","group":"caches","kind":"broadcast","min_workers":2,"on_task_failure":"ignore","schedule":"0 4 * * *","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"recalculate-city-prices","group":"pricing","kind":"sharded","shards":4,"shard_params":["Beijing","Shanghai","Guangzhou","Shenzhen"],"schedule":"0 2 * * *","timezone":"Asia/Shanghai","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"scan-customer-partitions","group":"customers","kind":"sharded","shards":"workers","shard_params":[{"also_archived":true},null,"eu-only"],"every":"1h","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"monthly-invoices","group":"billing","kind":"map_reduce","map_depth":2,"schedule":"0 0 1 * *","timezone":"UTC","params":null,"timeout":"30m","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// The jitter and window example of docs/configuration.md.
const CONFIGURATION_MD_TIMING: &[&str] = &[
    r##"{"name":"nightly-export","group":"reports","schedule":"0 0 * * *","timezone":"UTC","jitter":"5m","start_at":"2027-01-01T00:00:00+08:00","end_at":"2027-06-30T23:59:59+08:00","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// The calendars example of docs/configuration.md.
const CONFIGURATION_MD_CALENDARS: &[&str] = &[
    r##"{"name":"daily-settlement","group":"billing","schedule":"0 2 * * *","timezone":"Asia/Shanghai","calendar":{"name":"cn-workdays","timezone":"Asia/Shanghai","weekdays":["mon-fri"],"include":[{"name":"cn-extra-workdays","dates":["2027-02-20"]}],"except":[{"name":"cn-holidays","dates":["2027-02-10..2027-02-17","2027-10-01..2027-10-07"]}]},"params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"night-batch","group":"etl","every":"10m","timezone":"UTC","calendar":{"name":"inline","times":["22:00-06:00"]},"calendar_mode":"except","on_excluded":"next_allowed","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
/// The job file of README.md.
/// docs/configuration.md's child jobs example.
const CONFIGURATION_MD_CHILDREN: &[&str] = &[
    r##"{"name":"export-orders","group":"reports","schedule":"0 2 * * *","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"on_success":["upload-export","notify-finance"],"on_failure":["page-oncall"],"paused":false}"##,
    r##"{"name":"upload-export","group":"reports","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"notify-finance","group":"mail","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"page-oncall","group":"mail","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];
const README_MD: &[&str] = &[
    r##"{"name":"close-unpaid-orders","group":"orders","schedule":"0 */2 * * * *","timezone":"Asia/Shanghai","params":{"batch":500},"timeout":"5m","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"forbid","retry":{"max_attempts":4,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"alerts":{"webhook":"https://hooks.slack.com/services/…","format":"slack"},"paused":false}"##,
];

/// The job kinds of README.md.
const README_MD_KINDS: &[&str] = &[
    r##"{"name":"purge-local-cache","group":"web","kind":"broadcast","min_workers":2,"timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"settle-cities","group":"billing","kind":"sharded","shards":3,"shard_params":["Beijing","Shanghai","Guangzhou"],"timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
    r##"{"name":"monthly-totals","group":"billing","kind":"map_reduce","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"##,
];

/// Definitions sent as API JSON (`POST /api/jobs`), then as stored: one per `when`, and one
/// with every optional field.
const API: &[(&str, &str)] = &[
    (
        r#"{"name": "a", "group": "g"}"#,
        r#"{"name":"a","group":"g","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"#,
    ),
    (
        r#"{"name": "a", "group": "g", "schedule": "0 9 * * *", "timezone": "Europe/Berlin"}"#,
        r#"{"name":"a","group":"g","schedule":"0 9 * * *","timezone":"Europe/Berlin","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"#,
    ),
    (
        r#"{"name": "a", "group": "g", "every": "1h 30m"}"#,
        r#"{"name":"a","group":"g","every":"1h 30m","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"#,
    ),
    (
        r#"{"name": "a", "group": "g", "every": "500ms", "timeout": "5m", "retention": "7days"}"#,
        r#"{"name":"a","group":"g","every":"500ms","timezone":"UTC","params":null,"timeout":"5m","misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"retention":"7days","paused":false}"#,
    ),
    (
        r#"{"name": "a", "group": "g", "at": "2027-03-01T08:00:00+01:00"}"#,
        r#"{"name":"a","group":"g","at":"2027-03-01T08:00:00+01:00","timezone":"UTC","params":null,"misfire":"fire_once","misfire_grace":"5s","catchup_window":"1h","max_catchup":100,"concurrency":"allow","retry":{"max_attempts":3,"initial":"10s","multiplier":2.0,"max":"10m","jitter":true},"paused":false}"#,
    ),
    (
        r#"{"name": "a", "group": "g", "at": "2027-03-01T08:00:00Z", "secret_params": ["token"],
            "alerts": {"webhook": "https://h.example/x", "format": "slack"}, "description": "d",
            "paused": true, "concurrency": "queue", "misfire": "fire_all", "max_catchup": 3,
            "retry": {"max_attempts": 5, "initial": "1s", "multiplier": 1.5, "max": "1m",
                      "jitter": false},
            "params": {"k": [1, 2, {"x": null}]}}"#,
        r#"{"name":"a","group":"g","at":"2027-03-01T08:00:00Z","timezone":"UTC","params":{"k":[1,2,{"x":null}]},"secret_params":["token"],"misfire":"fire_all","misfire_grace":"5s","catchup_window":"1h","max_catchup":3,"concurrency":"queue","retry":{"max_attempts":5,"initial":"1s","multiplier":1.5,"max":"1m","jitter":false},"alerts":{"webhook":"https://h.example/x","format":"slack"},"paused":true,"description":"d"}"#,
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The job files of `markdown`'s fenced TOML and YAML blocks that declare jobs, in order.
fn job_blocks(markdown: &str) -> Vec<Vec<JobSpec>> {
    let text = std::fs::read_to_string(root().join(markdown)).expect("readable");
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let format = match line.trim_end() {
            "```toml" => SourceFormat::Toml,
            "```yaml" => SourceFormat::Yaml,
            _ => continue,
        };
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        let block = block.join("\n");
        if block.contains("[[jobs]]") || block.starts_with("jobs:") {
            let jobs = parse_job_file(markdown, &block, format)
                .unwrap_or_else(|e| panic!("{markdown}: a job file that does not load:\n{e}"));
            blocks.push(jobs);
        }
    }
    blocks
}

/// `jobs` store as `stored`, one by one, and each of `stored` reads back as its job.
fn assert_stored_as(origin: &str, jobs: &[JobSpec], stored: &[&str]) {
    let written: Vec<String> = jobs
        .iter()
        .map(|job| serde_json::to_string(job).expect("serialises"))
        .collect();
    assert_eq!(written, stored, "{origin}: the stored form changed");
    for (job, stored) in jobs.iter().zip(stored) {
        let read: JobSpec = serde_json::from_str(stored)
            .unwrap_or_else(|e| panic!("{origin}: {stored} does not read back: {e}"));
        assert_eq!(&read, job, "{origin}");
    }
}

#[test]
fn job_files_store_the_json_they_stored_before() {
    let cases: [(&[&str], &[&str]); 8] = [
        (&["deploy/examples/jobs.toml"], EXAMPLES),
        (&["deploy/examples/jobs.yaml"], EXAMPLES),
        (&["deploy/examples/job-kinds.toml"], KIND_EXAMPLES),
        (&["deploy/examples/job-kinds.yaml"], KIND_EXAMPLES),
        (&["deploy/local/demo-jobs.toml"], DEMO),
        (&["scheduler/tests/fixtures/good.toml"], FIXTURES),
        (&["scheduler/tests/fixtures/good.yaml"], FIXTURES),
        (
            &[
                "scheduler/tests/fixtures/jobs.d/orders.toml",
                "scheduler/tests/fixtures/jobs.d/reports.yml",
            ],
            JOBS_D,
        ),
    ];
    for (paths, stored) in cases {
        let files: Vec<PathBuf> = paths.iter().map(|path| root().join(path)).collect();
        let jobs = load_job_files(&files).unwrap_or_else(|e| panic!("{e}"));
        assert_stored_as(&paths.join(", "), &jobs, stored);
    }
}

#[test]
fn documented_job_files_store_the_json_they_stored_before() {
    let configuration = job_blocks("docs/configuration.md");
    assert_eq!(
        configuration.len(),
        7,
        "one job file in TOML, the same in YAML; then the job kinds' in TOML, the same in YAML; \
         then the jitter and window example, the calendars example and the child jobs example"
    );
    for jobs in &configuration[..2] {
        assert_stored_as("docs/configuration.md", jobs, CONFIGURATION_MD);
    }
    for jobs in &configuration[2..4] {
        assert_stored_as("docs/configuration.md", jobs, CONFIGURATION_MD_KINDS);
    }
    assert_stored_as(
        "docs/configuration.md",
        &configuration[4],
        CONFIGURATION_MD_TIMING,
    );
    assert_stored_as(
        "docs/configuration.md",
        &configuration[5],
        CONFIGURATION_MD_CALENDARS,
    );
    assert_stored_as(
        "docs/configuration.md",
        &configuration[6],
        CONFIGURATION_MD_CHILDREN,
    );
    let readme = job_blocks("README.md");
    assert_eq!(readme.len(), 2, "README.md's job files");
    assert_stored_as("README.md", &readme[0], README_MD);
    assert_stored_as("README.md", &readme[1], README_MD_KINDS);
}

#[test]
fn api_definitions_store_the_json_they_stored_before() {
    for (definition, stored) in API {
        let definition: serde_json::Value = serde_json::from_str(definition).expect("JSON");
        let job = validate_job(definition.as_object().expect("object"))
            .unwrap_or_else(|e| panic!("{definition}: {e:?}"));
        assert_stored_as(&definition.to_string(), &[job], &[stored]);
    }
}

/// Each `when` is written as its one key and read back from it.
#[test]
fn every_when_round_trips_through_its_key() {
    let base: JobSpec =
        serde_json::from_value(serde_json::json!({"name": "a", "group": "g"})).expect("valid");
    assert_eq!(base.when, When::Manual);
    let at = DateTime::parse_from_rfc3339("2027-03-01T08:00:00+01:00").expect("instant");
    for (when, key) in [
        (
            When::Cron("0 9 * * MON-FRI".into()),
            Some(("schedule", "0 9 * * MON-FRI")),
        ),
        (
            When::Every(Duration::from_secs(90)),
            Some(("every", "1m 30s")),
        ),
        (When::At(at), Some(("at", "2027-03-01T08:00:00+01:00"))),
        (When::Manual, None),
    ] {
        let spec = JobSpec {
            when: when.clone(),
            ..base.clone()
        };
        let form = serde_json::to_value(&spec).expect("serialises");
        for field in When::FIELDS {
            let expected = key.filter(|(k, _)| *k == field).map(|(_, v)| v);
            assert_eq!(
                form.get(field).and_then(|v| v.as_str()),
                expected,
                "{when:?}"
            );
        }
        let read: JobSpec = serde_json::from_value(form).expect("reads back");
        assert_eq!(read.when, when);
    }
}

/// Two of `schedule`, `every` and `at` are refused whichever way a definition comes in, with
/// the message job files give.
#[test]
fn two_of_schedule_every_and_at_are_refused_by_the_stored_form_too() {
    let both = serde_json::json!({"name": "a", "group": "g", "schedule": "* * * * *",
                                  "every": "1m"});
    let error = serde_json::from_value::<JobSpec>(both.clone()).expect_err("refused");
    let message = r#""schedule" and "every" are both set, but a job has at most one of "schedule", "every" and "at"; keep one, or none for a job that runs only when triggered"#;
    assert_eq!(error.to_string(), message);
    let errors = validate_job(both.as_object().expect("object")).expect_err("refused");
    assert_eq!(errors[0].message, message);
    let all = serde_json::json!({"name": "a", "group": "g", "schedule": "* * * * *",
                                 "every": "1m", "at": "2027-03-01T08:00:00Z"});
    let error = serde_json::from_value::<JobSpec>(all).expect_err("refused");
    assert!(
        error
            .to_string()
            .starts_with(r#""schedule", "every" and "at" are all set"#),
        "{error}"
    );
}

/// `kind = "single"` is the default: written or not, the job is the same and is stored without
/// the key, so a definition from before `kind` existed neither reads nor stores differently.
#[test]
fn kind_single_is_the_default_and_stored_without_the_key() {
    let plain = serde_json::json!({"name": "a", "group": "g", "every": "1m"});
    let single = serde_json::json!({"name": "a", "group": "g", "every": "1m", "kind": "single"});
    let plain_job = validate_job(plain.as_object().expect("object")).expect("valid");
    let single_job = validate_job(single.as_object().expect("object")).expect("valid");
    assert_eq!(plain_job.kind, Kind::Single);
    assert_eq!(single_job, plain_job);
    let stored = serde_json::to_value(&single_job).expect("serialises");
    assert_eq!(stored.get("kind"), None, "{stored}");
    assert_eq!(
        serde_json::from_value::<JobSpec>(single).expect("reads"),
        plain_job
    );
    let other = serde_json::json!({"name": "a", "group": "g", "kind": "fan_out"});
    let error = serde_json::from_value::<JobSpec>(other.clone()).expect_err("refused");
    assert!(
        error.to_string().contains("unknown variant `fan_out`"),
        "{error}"
    );
    let errors = validate_job(other.as_object().expect("object")).expect_err("refused");
    assert_eq!(errors[0].field.as_deref(), Some("kind"));
    assert_eq!(
        errors[0].message,
        r#"unknown value; use "single", "broadcast", "sharded", "map_reduce" or "workflow""#
    );
    let kinds = [
        Kind::Single,
        Kind::Broadcast { min_workers: 1 },
        Kind::Sharded {
            shards: Shards::Workers,
            params: Vec::new(),
        },
        Kind::MapReduce { map_depth: 3 },
        Kind::Workflow { nodes: Vec::new() },
    ];
    let names: Vec<&str> = kinds.iter().map(Kind::as_str).collect();
    assert_eq!(Kind::NAMES, names);
}
