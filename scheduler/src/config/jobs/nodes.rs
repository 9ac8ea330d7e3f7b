//! The `nodes` of a workflow (docs/workflows.md), checked node by node and then as a DAG
//! (`crate::workflow::dag_problems`); errors are named `nodes[i].field`. Whether each node's
//! job exists is checked where every job is known (`crate::config::workflow_link_errors`).

use std::collections::HashSet;

use chime_protocol::limits::{MAX_NODE_EDGES, MAX_WORKFLOW_NODES};
use serde_json::{Map, Value};

use super::{Check, FieldError, identifier_problem, kind, render, validate_params};
use crate::workflow::{self, EdgeCondition, Node, NodeFailurePolicy};

/// Every field a node table may have.
pub const NODE_FIELDS: &[&str] = &["name", "job", "after", "when", "on_failure", "params"];

impl Check<'_> {
    /// `nodes`: required for a workflow, 1 to [`MAX_WORKFLOW_NODES`] node tables, acyclic. A
    /// node's `when` is the condition of its `after` entries given as names; the stored form
    /// keeps the conditions on the edges.
    pub(super) fn nodes(&mut self) {
        let Some(value) = self.get("nodes") else {
            self.errors.push(FieldError::new(
                "nodes",
                None,
                "missing; a workflow needs its nodes, such as [[workflows.nodes]] tables with \
                 name = \"extract\" and job = \"extract-orders\"",
            ));
            return;
        };
        let Value::Array(items) = value else {
            self.fail(
                "nodes",
                format!(
                    "expected a list of node tables, found {}; write [[workflows.nodes]] \
                     sections in TOML",
                    kind(value)
                ),
            );
            return;
        };
        if items.is_empty() || items.len() > MAX_WORKFLOW_NODES {
            self.fail(
                "nodes",
                format!(
                    "has {} nodes; a workflow has 1 to {MAX_WORKFLOW_NODES} \
                     (limits::MAX_WORKFLOW_NODES): split a larger one into workflows started \
                     as child jobs",
                    items.len()
                ),
            );
            return;
        }
        let before = self.errors.len();
        let mut nodes = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(node) = self.node(i, item) {
                nodes.push(node);
            }
        }
        if self.errors.len() > before {
            return;
        }
        let dag = workflow::dag_problems(&nodes);
        if !dag.is_empty() {
            for problem in dag {
                self.errors.push(FieldError::new(
                    &problem.field,
                    problem.value,
                    problem.message,
                ));
            }
            return;
        }
        for (i, node) in nodes.iter().enumerate() {
            let Some(params) = &node.params else { continue };
            let upstream = workflow::upstream_of(&nodes, i);
            for path in workflow::template_paths(params) {
                if let Some(problem) = workflow::path_problem(&path, &upstream) {
                    self.errors.push(FieldError::new(
                        &format!("nodes[{i}].params"),
                        Some(render(params)),
                        problem,
                    ));
                }
            }
        }
        if self.errors.len() == before {
            match serde_json::to_value(&nodes) {
                Ok(value) => {
                    self.clean.insert("nodes".to_owned(), value);
                }
                Err(e) => self
                    .errors
                    .push(FieldError::new("nodes", None, e.to_string())),
            }
        }
    }

    /// One node table, `nodes[i]`.
    fn node(&mut self, i: usize, item: &Value) -> Option<Node> {
        let at = |field: &str| format!("nodes[{i}].{field}");
        let Value::Object(table) = item else {
            self.errors.push(FieldError::new(
                &format!("nodes[{i}]"),
                Some(render(item)),
                "expected a node table with name and job, such as \
                 { name = \"extract\", job = \"extract-orders\" }",
            ));
            return None;
        };
        let before = self.errors.len();
        let mut keys: Vec<&String> = table
            .keys()
            .filter(|k| !NODE_FIELDS.contains(&k.as_str()))
            .collect();
        keys.sort();
        for key in keys {
            self.errors.push(FieldError::new(
                &at(key),
                Some(render(&table[key])),
                format!("unknown node field; a node has {}", NODE_FIELDS.join(", ")),
            ));
        }
        let name = self.node_identifier(
            table,
            &at("name"),
            "name",
            "a node name such as \"extract\"",
        );
        let job = self.node_identifier(table, &at("job"), "job", "the name of the job it runs");
        let default_when = match table.get("when").filter(|v| !v.is_null()) {
            None => EdgeCondition::Success,
            Some(value) => match value.as_str().and_then(|w| {
                EdgeCondition::NAMES.iter().position(|n| *n == w).map(|p| {
                    [
                        EdgeCondition::Success,
                        EdgeCondition::Failure,
                        EdgeCondition::Always,
                    ][p]
                })
            }) {
                Some(when) => when,
                None => {
                    self.errors.push(FieldError::new(
                        &at("when"),
                        Some(render(value)),
                        "expected \"success\", \"failure\" or \"always\": the end of the `after` \
                         nodes this node runs after",
                    ));
                    EdgeCondition::Success
                }
            },
        };
        let on_failure = match table.get("on_failure").filter(|v| !v.is_null()) {
            None => NodeFailurePolicy::FailWorkflow,
            Some(value) => match serde_json::from_value::<NodeFailurePolicy>(value.clone()) {
                Ok(policy) => policy,
                Err(_) => {
                    self.errors.push(FieldError::new(
                        &at("on_failure"),
                        Some(render(value)),
                        "expected \"fail_workflow\", \"skip_downstream\" or \"continue\"",
                    ));
                    NodeFailurePolicy::FailWorkflow
                }
            },
        };
        let after = self.node_after(table, i, default_when);
        let params = match table.get("params").filter(|v| !v.is_null()) {
            None => None,
            Some(value) => match validate_params(value) {
                Ok(()) => Some(value.clone()),
                Err(mut e) => {
                    e.field = Some(at("params"));
                    self.errors.push(e);
                    None
                }
            },
        };
        if self.errors.len() > before {
            return None;
        }
        Some(Node {
            name: name?,
            job: job?,
            after,
            on_failure,
            params,
        })
    }

    fn node_identifier(
        &mut self,
        table: &Map<String, Value>,
        field: &str,
        key: &str,
        what: &str,
    ) -> Option<String> {
        let value = table.get(key).filter(|v| !v.is_null());
        let problem = match value {
            None => format!("missing; give {what}"),
            Some(Value::String(text)) => match identifier_problem(text) {
                None => return Some(text.clone()),
                Some(why) => format!("{why}; give {what}"),
            },
            Some(other) => format!("expected a string, found {}; give {what}", kind(other)),
        };
        self.errors
            .push(FieldError::new(field, value.map(render), problem));
        None
    }

    /// A node's `after`: node names (with the node's `when`) or `{ node, when }` tables.
    fn node_after(
        &mut self,
        table: &Map<String, Value>,
        i: usize,
        default_when: EdgeCondition,
    ) -> Vec<workflow::Edge> {
        let field = format!("nodes[{i}].after");
        let Some(value) = table.get("after").filter(|v| !v.is_null()) else {
            return Vec::new();
        };
        let Value::Array(entries) = value else {
            self.errors.push(FieldError::new(
                &field,
                Some(render(value)),
                format!(
                    "expected a list of node names, found {}; write it such as \
                     after = [\"extract\"]",
                    kind(value)
                ),
            ));
            return Vec::new();
        };
        if entries.len() > MAX_NODE_EDGES {
            self.errors.push(FieldError::new(
                &field,
                None,
                format!(
                    "names {} nodes; a node comes after at most {MAX_NODE_EDGES} \
                     (limits::MAX_NODE_EDGES): add a node that joins them",
                    entries.len()
                ),
            ));
            return Vec::new();
        }
        let mut edges = Vec::with_capacity(entries.len());
        let mut seen = HashSet::new();
        for (e, entry) in entries.iter().enumerate() {
            let edge = match entry {
                Value::String(node) => Some(workflow::Edge {
                    node: node.clone(),
                    when: default_when,
                }),
                Value::Object(_) => serde_json::from_value::<workflow::Edge>(entry.clone()).ok(),
                _ => None,
            };
            match edge {
                Some(edge) if identifier_problem(&edge.node).is_none() => {
                    seen.insert(edge.node.clone());
                    edges.push(edge);
                }
                _ => self.errors.push(FieldError::new(
                    &format!("{field}[{e}]"),
                    Some(render(entry)),
                    "expected a node name, or a table such as { node = \"extract\", when = \
                     \"failure\" } (when: \"success\", \"failure\" or \"always\")",
                )),
            }
        }
        edges
    }
}
