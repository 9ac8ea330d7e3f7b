//! Workflows in job files: `[[workflows]]` tables load as jobs of kind `workflow`, and every
//! mistake in their nodes is named with the field, the value and the fix (unknown nodes and
//! jobs, cycles, conditions, templates, limits, fields a workflow does not take).

use crate::config::{SourceFormat, parse_job_file};
use crate::job::Kind;
use crate::workflow::{EdgeCondition, NodeFailurePolicy};

const JOBS: &str = r#"
[[jobs]]
name = "extract-orders"
group = "etl"

[[jobs]]
name = "load-warehouse"
group = "etl"
"#;

fn errors(workflow: &str) -> Vec<String> {
    let text = format!("{workflow}\n{JOBS}");
    match parse_job_file("jobs.toml", &text, SourceFormat::Toml) {
        Ok(jobs) => panic!("expected errors, loaded {jobs:#?}"),
        Err(errors) => errors.lines(),
    }
}

#[test]
fn a_workflow_loads_as_a_job_of_kind_workflow_with_its_edges() {
    let text = format!(
        r#"
        [[workflows]]
        name = "etl"
        schedule = "0 2 * * *"
        params = {{ region = "eu" }}

        [[workflows.nodes]]
        name = "extract"
        job = "extract-orders"

        [[workflows.nodes]]
        name = "load"
        job = "load-warehouse"
        after = ["extract"]
        when = "always"
        on_failure = "skip_downstream"
        params = {{ rows = "{{{{ nodes.extract.output.rows }}}}" }}

        [[workflows.nodes]]
        name = "page"
        job = "load-warehouse"
        after = [{{ node = "load", when = "failure" }}, "extract"]
        {JOBS}"#
    );
    let jobs = parse_job_file("jobs.toml", &text, SourceFormat::Toml).expect("the file loads");
    let etl = jobs
        .iter()
        .find(|j| j.name == "etl")
        .expect("the workflow loads");
    assert_eq!(etl.group, "");
    let Kind::Workflow { nodes } = &etl.kind else {
        panic!("kind workflow, found {:?}", etl.kind);
    };
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[1].after[0].when, EdgeCondition::Always);
    assert_eq!(nodes[1].on_failure, NodeFailurePolicy::SkipDownstream);
    assert_eq!(nodes[2].after[0].when, EdgeCondition::Failure);
    assert_eq!(nodes[2].after[1].when, EdgeCondition::Success);
    // The stored form reads back as the same definition.
    let stored = serde_json::to_value(etl).unwrap();
    assert_eq!(stored["kind"], "workflow");
    assert!(stored.get("group").is_some_and(|g| g == ""));
    let read: crate::job::JobSpec = serde_json::from_value(stored).unwrap();
    assert_eq!(&read, etl);
}

#[test]
fn a_file_of_workflows_only_loads() {
    let text = r#"
        [[workflows]]
        name = "etl"

        [[workflows.nodes]]
        name = "a"
        job = "x"

        [[workflows]]
        name = "x-job-free"

        [[workflows.nodes]]
        name = "a"
        job = "x"
    "#;
    let errors = match parse_job_file("jobs.toml", text, SourceFormat::Toml) {
        Ok(jobs) => panic!("expected errors, loaded {jobs:#?}"),
        Err(errors) => errors.lines(),
    };
    // Both workflows were read (and both name a job no file declares).
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].contains(r#"field "nodes[0].job" = "x": no job of this name"#),
        "{}",
        errors[0]
    );
}

#[test]
fn a_cycle_is_named_and_unknown_nodes_are_listed() {
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        after = ["c"]
        [[workflows.nodes]]
        name = "b"
        job = "extract-orders"
        after = ["a"]
        [[workflows.nodes]]
        name = "c"
        job = "extract-orders"
        after = ["b"]
        "#,
    );
    assert_eq!(
        got,
        [
            r#"jobs.toml: job "etl": field "nodes[0].after": the nodes form a cycle: a → c → b → a; a workflow is acyclic, so remove one of these edges"#
        ]
    );
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        after = ["zz"]
        "#,
    );
    assert_eq!(
        got,
        [
            r#"jobs.toml: job "etl": field "nodes[0].after[0]" = "zz": no node of this name in the workflow; name one of its nodes: a"#
        ]
    );
}

#[test]
fn node_jobs_must_exist_and_not_be_workflows() {
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        [[workflows.nodes]]
        name = "a"
        job = "extract-order"
        [[workflows.nodes]]
        name = "b"
        job = "other"

        [[workflows]]
        name = "other"
        [[workflows.nodes]]
        name = "x"
        job = "load-warehouse"
        "#,
    );
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].contains(r#""nodes[0].job" = "extract-order": no job of this name; did you mean "extract-orders"?"#),
        "{}",
        got[0]
    );
    assert!(
        got[1].contains(r#"job "other" is a workflow"#),
        "{}",
        got[1]
    );
}

#[test]
fn fields_a_workflow_does_not_take_are_refused() {
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        group = "etl"
        kind = "single"
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        "#,
    );
    assert_eq!(
        got,
        [
            r#"jobs.toml: key "workflows[0].kind" = "single": a [[workflows]] table is of kind "workflow"; remove the field"#
        ]
    );
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        group = "etl"
        retry = { max_attempts = 3 }
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        "#,
    );
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].contains(r#"field "group" = "etl": a workflow has no group"#),
        "{}",
        got[0]
    );
    assert!(
        got[1].contains(r#"field "retry""#) && got[1].contains("not retried"),
        "{}",
        got[1]
    );
    let got = errors(
        r#"
        [[jobs]]
        name = "plain"
        group = "g"
        nodes = []
        "#,
    );
    assert!(
        got[0].contains(r#"field "nodes""#) && got[0].contains("workflow"),
        "{}",
        got[0]
    );
}

#[test]
fn node_fields_are_checked_each_with_its_path() {
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        when = "sometimes"
        on_failure = "retry"
        colour = "red"
        [[workflows.nodes]]
        name = "b"
        job = "load-warehouse"
        after = ["a", 3]
        params = { x = "{{ nodes.c.output.x }}", y = "{{ env.HOME }}" }
        [[workflows.nodes]]
        name = "c"
        job = "load-warehouse"
        after = ["a", "a"]
        "#,
    );
    let fields: Vec<&str> = got
        .iter()
        .map(|e| {
            e.split("field ")
                .nth(1)
                .unwrap_or(e)
                .split(':')
                .next()
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        fields,
        [
            r#""nodes[0].colour" = "red""#,
            r#""nodes[0].when" = "sometimes""#,
            r#""nodes[0].on_failure" = "retry""#,
            r#""nodes[1].after[1]" = 3"#,
        ],
        "{got:#?}"
    );
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        [[workflows.nodes]]
        name = "b"
        job = "load-warehouse"
        after = ["a"]
        params = { x = "{{ nodes.c.output.x }}", y = "{{ env.HOME }}" }
        [[workflows.nodes]]
        name = "c"
        job = "load-warehouse"
        after = ["a", "a"]
        "#,
    );
    assert_eq!(
        got.len(),
        1,
        "the DAG is checked before templates: {got:#?}"
    );
    assert!(
        got[0].contains(r#""nodes[2].after[1]" = "a""#),
        "{}",
        got[0]
    );
    let got = errors(
        r#"
        [[workflows]]
        name = "etl"
        [[workflows.nodes]]
        name = "a"
        job = "extract-orders"
        [[workflows.nodes]]
        name = "b"
        job = "load-warehouse"
        after = ["a"]
        params = { x = "{{ nodes.c.output.x }}", y = "{{ env.HOME }}" }
        [[workflows.nodes]]
        name = "c"
        job = "load-warehouse"
        "#,
    );
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("does not come after"), "{}", got[0]);
    assert!(got[1].contains("is not one of"), "{}", got[1]);
}

#[test]
fn the_node_count_is_bounded() {
    let got = errors("[[workflows]]\nname = \"etl\"\nnodes = []\n");
    assert!(
        got[0].contains("has 0 nodes; a workflow has 1 to 1000"),
        "{}",
        got[0]
    );
    let mut text = String::from("[[workflows]]\nname = \"big\"\n");
    for i in 0..=chime_protocol::limits::MAX_WORKFLOW_NODES {
        text.push_str(&format!(
            "[[workflows.nodes]]\nname = \"n{i}\"\njob = \"extract-orders\"\n"
        ));
    }
    let got = errors(&text);
    assert!(got[0].contains("has 1001 nodes"), "{}", got[0]);
    let got = errors("[[workflows]]\nname = \"etl\"\n");
    assert!(got[0].contains(r#"field "nodes": missing"#), "{}", got[0]);
}
