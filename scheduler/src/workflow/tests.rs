//! Unit tests of the workflow DAG: checks, layers, the advance rule and params templates.

use serde_json::json;

use super::*;

fn node(name: &str, after: &[&str]) -> Node {
    Node {
        name: name.to_owned(),
        job: format!("job-{name}"),
        after: after
            .iter()
            .map(|a| Edge {
                node: (*a).to_owned(),
                when: EdgeCondition::Success,
            })
            .collect(),
        on_failure: NodeFailurePolicy::FailWorkflow,
        params: None,
    }
}

fn diamond() -> Vec<Node> {
    vec![
        node("extract", &[]),
        node("left", &["extract"]),
        node("right", &["extract"]),
        node("load", &["left", "right"]),
    ]
}

use NodeState::{Failed, Open, Skipped, Succeeded, Unmade};

#[test]
fn a_cycle_is_named_in_order() {
    let nodes = vec![node("a", &["c"]), node("b", &["a"]), node("c", &["b"])];
    let problems = dag_problems(&nodes);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].message.contains("a → c → b → a"),
        "{}",
        problems[0].message
    );
    assert_eq!(problems[0].field, "nodes[0].after");
}

#[test]
fn unknown_self_duplicate_and_twice_named_edges_are_refused() {
    let nodes = vec![
        node("a", &["a"]),
        node("b", &["zz", "a", "a"]),
        node("b", &[]),
    ];
    let fields: Vec<String> = dag_problems(&nodes).into_iter().map(|p| p.field).collect();
    assert_eq!(
        fields,
        [
            "nodes[2].name",
            "nodes[0].after[0]",
            "nodes[1].after[0]",
            "nodes[1].after[2]"
        ]
    );
}

#[test]
fn a_long_chain_has_no_cycle_and_no_stack_overflow() {
    let nodes: Vec<Node> = (0..100_000)
        .map(|i| {
            let before = format!("n{}", i.max(1) - 1);
            let after: Vec<&str> = if i == 0 {
                vec![]
            } else {
                vec![before.as_str()]
            };
            node(&format!("n{i}"), &after)
        })
        .collect();
    assert!(dag_problems(&nodes).is_empty());
    assert_eq!(layers(&nodes).len(), 100_000);
}

#[test]
fn layers_follow_the_longest_path() {
    let mut nodes = diamond();
    nodes.push(node("report", &["extract", "load"]));
    let names: Vec<Vec<&str>> = layers(&nodes)
        .iter()
        .map(|l| l.iter().map(|&i| nodes[i].name.as_str()).collect())
        .collect();
    assert_eq!(
        names,
        [
            vec!["extract"],
            vec!["left", "right"],
            vec!["load"],
            vec!["report"]
        ]
    );
}

#[test]
fn a_fresh_run_starts_the_roots_only() {
    let d = decide(&diamond(), &[Unmade; 4], &Stopping::No);
    assert_eq!(d.start, [0]);
    assert!(d.skip.is_empty() && d.end.is_none());
}

#[test]
fn fan_in_waits_for_every_upstream_node() {
    let nodes = diamond();
    let d = decide(&nodes, &[Succeeded, Succeeded, Open, Unmade], &Stopping::No);
    assert!(d.start.is_empty() && d.end.is_none(), "{d:?}");
    let d = decide(
        &nodes,
        &[Succeeded, Succeeded, Succeeded, Unmade],
        &Stopping::No,
    );
    assert_eq!(d.start, [3]);
    let d = decide(&nodes, &[Succeeded; 4], &Stopping::No);
    assert_eq!(d.end, Some(("succeeded", None)));
}

#[test]
fn fail_workflow_skips_the_rest_but_lets_open_nodes_end() {
    let mut nodes = diamond();
    nodes.push(node("unrelated", &[]));
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Open, Unmade, Unmade],
        &Stopping::No,
    );
    // load waits for right (still open); unrelated is skipped, the run is failing.
    assert!(d.start.is_empty());
    assert_eq!(d.skip.len(), 1);
    assert_eq!(d.skip[0].0, 4);
    assert!(d.skip[0].1.contains("node left failed"), "{}", d.skip[0].1);
    assert!(d.end.is_none());
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Succeeded, Unmade, Skipped],
        &Stopping::No,
    );
    assert_eq!(d.skip.iter().map(|s| s.0).collect::<Vec<_>>(), [3]);
    assert_eq!(d.end, Some(("failed", Some("node left failed".to_owned()))));
}

#[test]
fn a_failure_handler_runs_after_a_failure_and_is_skipped_after_a_success() {
    let mut nodes = vec![node("work", &[]), node("alert", &[])];
    nodes[1].after = vec![Edge {
        node: "work".into(),
        when: EdgeCondition::Failure,
    }];
    let d = decide(&nodes, &[Failed, Unmade], &Stopping::No);
    assert_eq!(d.start, [1]);
    let d = decide(&nodes, &[Failed, Succeeded], &Stopping::No);
    assert_eq!(d.end, Some(("failed", Some("node work failed".to_owned()))));
    let d = decide(&nodes, &[Succeeded, Unmade], &Stopping::No);
    assert_eq!(d.skip.len(), 1);
    assert!(
        d.skip[0].1.contains("when = \"failure\""),
        "{}",
        d.skip[0].1
    );
    assert_eq!(d.end, Some(("succeeded", None)));
}

#[test]
fn skip_downstream_lets_other_branches_finish_then_fails() {
    let mut nodes = diamond();
    nodes[1].on_failure = NodeFailurePolicy::SkipDownstream;
    nodes.push(node("side", &["right"]));
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Succeeded, Unmade, Unmade],
        &Stopping::No,
    );
    assert_eq!(d.start, [4]);
    assert_eq!(d.skip.iter().map(|s| s.0).collect::<Vec<_>>(), [3]);
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Succeeded, Skipped, Succeeded],
        &Stopping::No,
    );
    assert_eq!(d.end, Some(("failed", Some("node left failed".to_owned()))));
}

#[test]
fn continue_counts_a_failure_as_done() {
    let mut nodes = diamond();
    nodes[1].on_failure = NodeFailurePolicy::Continue;
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Succeeded, Unmade],
        &Stopping::No,
    );
    assert_eq!(d.start, [3]);
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Succeeded, Succeeded],
        &Stopping::No,
    );
    assert_eq!(d.end, Some(("succeeded", None)));
}

#[test]
fn skipped_nodes_pass_only_always_edges() {
    let mut nodes = vec![
        node("a", &[]),
        node("b", &["a"]),
        node("c", &[]),
        node("d", &[]),
    ];
    nodes[2].after = vec![Edge {
        node: "b".into(),
        when: EdgeCondition::Always,
    }];
    nodes[3].after = vec![Edge {
        node: "b".into(),
        when: EdgeCondition::Failure,
    }];
    nodes[0].on_failure = NodeFailurePolicy::SkipDownstream;
    let d = decide(&nodes, &[Failed, Unmade, Unmade, Unmade], &Stopping::No);
    // b skipped (a failed); c runs (always); d skipped (b did not fail, it was skipped).
    assert_eq!(d.start, [2]);
    assert_eq!(d.skip.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 3]);
}

#[test]
fn cancel_and_timeout_skip_what_is_not_made_and_end_when_open_nodes_end() {
    let nodes = diamond();
    let d = decide(
        &nodes,
        &[Succeeded, Open, Unmade, Unmade],
        &Stopping::Cancelled,
    );
    assert_eq!(d.skip.iter().map(|s| s.0).collect::<Vec<_>>(), [2, 3]);
    assert!(d.end.is_none());
    let d = decide(
        &nodes,
        &[Succeeded, Failed, Skipped, Skipped],
        &Stopping::Cancelled,
    );
    assert_eq!(d.end, Some(("cancelled", None)));
    let why = Stopping::Failing("exceeded its timeout of 1h".into());
    let d = decide(&nodes, &[Succeeded, Succeeded, Succeeded, Unmade], &why);
    assert_eq!(
        d.end,
        Some(("failed", Some("exceeded its timeout of 1h".into())))
    );
}

#[test]
fn deciding_twice_decides_the_same() {
    let nodes = diamond();
    let states = [Succeeded, Unmade, Unmade, Unmade];
    assert_eq!(
        decide(&nodes, &states, &Stopping::No),
        decide(&nodes, &states, &Stopping::No)
    );
}

#[test]
fn downstream_of_a_node_includes_it_and_every_later_node() {
    let mut nodes = diamond();
    nodes.push(node("other", &[]));
    assert_eq!(downstream_of(&nodes, "left"), ["left", "load"]);
    assert_eq!(
        downstream_of(&nodes, "extract"),
        ["extract", "left", "right", "load"]
    );
}

#[test]
fn templates_keep_types_and_interpolate_text() {
    let params = json!({"day": "2026-12-04", "limit": 5});
    let out = json!({"rows": 42, "files": ["a", "b"]});
    let mut scope = TemplateScope {
        params: &params,
        run_id: 7,
        workflow: "etl",
        outputs: BTreeMap::new(),
    };
    scope.outputs.insert("extract", &out);
    let rendered = render_params(
        &json!({
            "limit": "{{ params.limit }}",
            "rows": "{{nodes.extract.output.rows}}",
            "file": "{{ nodes.extract.output.files.1 }}",
            "label": "run {{ workflow.run_id }} of {{ workflow.name }} for {{ params.day }}",
            "missing": "{{ params.nope }}",
            "plain": "no template",
        }),
        &scope,
    )
    .unwrap();
    assert_eq!(
        rendered,
        json!({
            "limit": 5, "rows": 42, "file": "b",
            "label": "run 7 of etl for 2026-12-04", "missing": null, "plain": "no template",
        })
    );
    assert!(render_params(&json!("{{ env.HOME }}"), &scope).is_err());
    assert!(render_params(&json!("x {{ params.a"), &scope).is_err());
}

#[test]
fn template_paths_are_checked_against_the_upstream_nodes() {
    let nodes = diamond();
    let up = upstream_of(&nodes, 3);
    assert_eq!(up, HashSet::from(["extract", "left", "right"]));
    assert!(path_problem("nodes.extract.output.rows", &up).is_none());
    assert!(path_problem("params.day", &up).is_none());
    let problem = path_problem("nodes.load.output.x", &upstream_of(&nodes, 1)).unwrap();
    assert!(problem.contains("does not come after"), "{problem}");
    assert!(path_problem("secrets.x", &up).is_some());
    assert_eq!(
        template_paths(&json!({"a": ["{{ params.x }} and {{workflow.name}}"]})),
        ["params.x", "workflow.name"]
    );
}

#[test]
fn params_layer_key_by_key() {
    let job = json!({"a": 1, "b": 1});
    let wf = json!({"b": 2, "c": 2});
    let node = json!({"c": 3});
    assert_eq!(
        layered_params(&[&job, &wf, &node]),
        json!({"a": 1, "b": 2, "c": 3})
    );
    assert_eq!(
        layered_params(&[&job, &Value::Null, &json!([1])]),
        json!([1])
    );
}

#[test]
fn edges_read_both_forms_and_write_the_short_one() {
    let node: Node = serde_json::from_value(json!({
        "name": "load", "job": "load-job",
        "after": ["a", {"node": "b", "when": "failure"}],
    }))
    .unwrap();
    assert_eq!(node.after[1].when, EdgeCondition::Failure);
    assert_eq!(
        serde_json::to_value(&node).unwrap(),
        json!({"name": "load", "job": "load-job", "after": ["a", {"node": "b", "when": "failure"}]})
    );
}
