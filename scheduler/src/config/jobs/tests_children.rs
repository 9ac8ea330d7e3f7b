//! Child jobs in job files: each list's own rules with the job's fields, and the links between
//! jobs once every file is read (unknown names with a suggestion, cycles named), with the
//! field, the value and the fix.

use crate::config::{SourceFormat, parse_job_file};

fn errors(text: &str) -> Vec<String> {
    match parse_job_file("jobs.toml", text, SourceFormat::Toml) {
        Ok(jobs) => panic!("expected errors, loaded {jobs:#?}"),
        Err(errors) => errors.lines(),
    }
}

#[test]
fn child_lists_load_in_order_and_store_as_written() {
    let jobs = parse_job_file(
        "jobs.toml",
        r#"
        [[jobs]]
        name = "export"
        group = "reports"
        every = "1h"
        on_success = ["upload", "notify"]
        on_failure = ["page"]
        on_complete = ["notify"]

        [[jobs]]
        name = "upload"
        group = "reports"
        on_success = ["notify"]

        [[jobs]]
        name = "notify"
        group = "mail"

        [[jobs]]
        name = "page"
        group = "mail"
        "#,
        SourceFormat::Toml,
    )
    .expect("valid");
    let export = &jobs[0];
    assert_eq!(export.children.on_success, ["upload", "notify"]);
    assert_eq!(export.children.after("succeeded"), ["upload", "notify"]);
    assert_eq!(export.children.after("dead"), ["page", "notify"]);
    assert!(export.children.after("cancelled").is_empty());
    let stored = serde_json::to_value(export).expect("serialises");
    assert_eq!(stored["on_failure"], serde_json::json!(["page"]));
    assert!(
        serde_json::to_value(&jobs[2])
            .expect("serialises")
            .get("on_success")
            .is_none(),
        "empty lists are not stored"
    );
}

#[test]
fn an_unknown_child_names_the_closest_job() {
    let lines = errors(
        r#"
        [[jobs]]
        name = "export"
        group = "reports"
        on_success = ["uplaod"]

        [[jobs]]
        name = "upload"
        group = "reports"
        "#,
    );
    assert_eq!(
        lines,
        [
            r#"jobs.toml: job "export": field "on_success" = "uplaod": no job of this name in the job files; did you mean "upload"? declare the child job in a job file, or fix the name"#
        ]
    );
}

#[test]
fn a_cycle_is_named_on_its_first_job() {
    let lines = errors(
        r#"
        [[jobs]]
        name = "a"
        group = "g"
        on_success = ["b"]

        [[jobs]]
        name = "b"
        group = "g"
        on_failure = ["c"]

        [[jobs]]
        name = "c"
        group = "g"
        on_complete = ["a"]
        "#,
    );
    assert_eq!(
        lines,
        [
            r#"jobs.toml: job "a": field "on_success" = "b": child jobs form a cycle: a → b → c → a, so each run would start the next for ever; remove one of these links"#
        ]
    );
}

#[test]
fn each_list_is_checked_with_the_jobs_fields() {
    let lines = errors(
        r#"
        [[jobs]]
        name = "a"
        group = "g"
        on_success = "b"
        on_failure = ["b", "b"]
        on_complete = ["a"]

        [[jobs]]
        name = "b"
        group = "g"
        on_success = ["Not A Name"]
        "#,
    );
    assert_eq!(
        lines,
        [
            r#"jobs.toml: job "a": field "on_success" = "b": expected a list of job names, found a string; write it such as on_success = ["send-report"]"#,
            r#"jobs.toml: job "a": field "on_failure" = ["b","b"]: names job "b" twice; name it once"#,
            r#"jobs.toml: job "a": field "on_complete" = ["a"]: child jobs form a cycle: a → a, so each run would start the next for ever; a job cannot be its own child, remove "a""#,
            r#"jobs.toml: job "b": field "on_success" = ["Not A Name"]: "Not A Name" is not a job name: 'N' is not allowed; name a job as its `name` field does"#,
        ]
    );
}

#[test]
fn at_most_max_child_jobs_are_named() {
    let max = chime_protocol::limits::MAX_CHILD_JOBS;
    let names: Vec<String> = (0..=max).map(|i| format!("\"c{i}\"")).collect();
    let (half, rest) = names.split_at(max / 2);
    let lines = errors(&format!(
        "[[jobs]]\nname = \"a\"\ngroup = \"g\"\non_success = [{}]\non_failure = [{}]\n",
        half.join(", "),
        rest.join(", ")
    ));
    assert_eq!(
        lines,
        [format!(
            r#"jobs.toml: job "a": on_success, on_failure and on_complete name {} jobs; at most {max} are allowed (limits::MAX_CHILD_JOBS): start one job that starts the others"#,
            max + 1
        )]
    );
    let one_list: Vec<String> = (0..=max).map(|i| format!("\"c{i}\"")).collect();
    let lines = errors(&format!(
        "[[jobs]]\nname = \"a\"\ngroup = \"g\"\non_complete = [{}]\n",
        one_list.join(", ")
    ));
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].contains(&format!("names {} jobs; at most {max}", max + 1)),
        "{}",
        lines[0]
    );
}
