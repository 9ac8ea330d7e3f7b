//! Workflows (docs/workflows.md): a job of kind `workflow` whose fire runs a DAG of other jobs.
//! This module holds the DAG's definition ([`Node`], [`Edge`]), its checks ([`dag_problems`]),
//! its layered order ([`layers`]), the rule that advances a workflow run ([`decide`]) and the
//! node params templates ([`render_params`]), all pure: [`crate::store`] reads the state and
//! writes the decisions under the leader's fence.
//!
//! **Invariants** (enforced here):
//! * A node is decided only when every node it comes after has ended, so no node starts before
//!   its `after` nodes end, whatever order the ends arrive in.
//! * [`decide`] is a function of the node states alone: a repeated or a second leader's advance
//!   decides the same, and the database's uniqueness on (workflow run, node, round) makes it once.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One node of a workflow: a job to run once per workflow run, after the nodes it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Unique in its workflow; how edges, `ctx.upstream` and templates name it.
    pub name: String,
    /// The job it runs (any kind but `workflow`).
    pub job: String,
    /// The nodes it comes after, each with the condition on its end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<Edge>,
    /// What its failure does to the workflow run.
    #[serde(default, skip_serializing_if = "NodeFailurePolicy::is_default")]
    pub on_failure: NodeFailurePolicy,
    /// Params laid over the workflow run's (templates rendered when the node starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// An edge: the node comes after `node`, and runs only if `node` ended as `when` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The upstream node.
    pub node: String,
    /// The condition on its end.
    pub when: EdgeCondition,
}

impl Serialize for Edge {
    /// As the node's name alone when the condition is `success`, else `{node, when}`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        if self.when == EdgeCondition::Success {
            return s.serialize_str(&self.node);
        }
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("node", &self.node)?;
        map.serialize_entry("when", &self.when)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for Edge {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Edge, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            node: String,
            #[serde(default)]
            when: EdgeCondition,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Name(String),
            Table(Table),
        }
        Ok(match Form::deserialize(d)? {
            Form::Name(node) => Edge {
                node,
                when: EdgeCondition::Success,
            },
            Form::Table(t) => Edge {
                node: t.node,
                when: t.when,
            },
        })
    }
}

/// When an edge lets its node run, by how the upstream node ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeCondition {
    /// It succeeded (or failed under `on_failure = "continue"`).
    #[default]
    Success,
    /// It failed, died, was lost or cancelled: a failure handler.
    Failure,
    /// It ended, however (skipped included).
    Always,
}

impl EdgeCondition {
    /// Every condition, as job files spell them.
    pub const NAMES: &'static [&'static str] = &["success", "failure", "always"];

    /// As job files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeCondition::Success => "success",
            EdgeCondition::Failure => "failure",
            EdgeCondition::Always => "always",
        }
    }
}

/// What a node's failure (after its retries) does to its workflow run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeFailurePolicy {
    /// The workflow run fails: no node starts any more but failure handlers (nodes with a
    /// `failure` or `always` edge whose edges all hold); running nodes finish.
    #[default]
    FailWorkflow,
    /// The nodes after it by `success` edges are skipped; the other branches go on, and the
    /// workflow run fails when they end.
    SkipDownstream,
    /// The failure is tolerated: its `success` edges hold as if it succeeded, and it does not
    /// fail the workflow run.
    Continue,
}

impl NodeFailurePolicy {
    /// Every policy, as job files spell them.
    pub const NAMES: &'static [&'static str] = &["fail_workflow", "skip_downstream", "continue"];

    /// Whether it is the default (left out of the stored form).
    pub fn is_default(&self) -> bool {
        *self == NodeFailurePolicy::FailWorkflow
    }

    /// As job files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeFailurePolicy::FailWorkflow => "fail_workflow",
            NodeFailurePolicy::SkipDownstream => "skip_downstream",
            NodeFailurePolicy::Continue => "continue",
        }
    }
}

/// A mistake in a workflow's nodes: the field (`nodes[2].after[0]`), the value and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DagProblem {
    /// The field, from `nodes`.
    pub field: String,
    /// The value, as written.
    pub value: Option<String>,
    /// What is wrong and the fix.
    pub message: String,
}

/// The mistakes of a workflow's DAG that need no other definition: duplicate node names, an
/// edge to an unknown node or to the node itself, a node named twice in one `after`, a cycle
/// (named, `a → b → a`). Whether each node's job exists is the caller's check.
pub fn dag_problems(nodes: &[Node]) -> Vec<DagProblem> {
    let mut problems = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        if index.insert(node.name.as_str(), i).is_some() {
            problems.push(DagProblem {
                field: format!("nodes[{i}].name"),
                value: Some(format!("{:?}", node.name)),
                message: "duplicate node name; node names must be unique in a workflow, so \
                          rename one of them"
                    .to_owned(),
            });
        }
    }
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    for (i, node) in nodes.iter().enumerate() {
        let mut seen = HashSet::new();
        for (e, edge) in node.after.iter().enumerate() {
            let field = format!("nodes[{i}].after[{e}]");
            let value = Some(format!("{:?}", edge.node));
            if edge.node == node.name {
                problems.push(DagProblem {
                    field,
                    value,
                    message: "a node cannot come after itself; remove it from `after`".to_owned(),
                });
            } else if !index.contains_key(edge.node.as_str()) {
                problems.push(DagProblem {
                    field,
                    value,
                    message: format!(
                        "no node of this name in the workflow; name one of its nodes: {}",
                        names.join(", ")
                    ),
                });
            } else if !seen.insert(edge.node.as_str()) {
                problems.push(DagProblem {
                    field,
                    value,
                    message: "this node is named twice in `after` (a node cannot wait for two \
                              ends of one node); keep one edge, with `when = \"always\"` if \
                              either end will do"
                        .to_owned(),
                });
            }
        }
    }
    if problems.is_empty()
        && let Some(cycle) = find_cycle(nodes, &index)
    {
        let first = cycle[0];
        problems.push(DagProblem {
            field: format!("nodes[{}].after", index[first]),
            value: None,
            message: format!(
                "the nodes form a cycle: {} → {first}; a workflow is acyclic, so remove one of \
                 these edges",
                cycle.join(" → ")
            ),
        });
    }
    problems
}

/// A cycle of `after` edges, as the node names in order (each comes after the next), if any.
/// Iterative, so a deep chain cannot overflow the stack.
fn find_cycle<'a>(nodes: &'a [Node], index: &HashMap<&str, usize>) -> Option<Vec<&'a str>> {
    // 0 unvisited, 1 on the path, 2 done.
    let mut mark = vec![0u8; nodes.len()];
    for start in 0..nodes.len() {
        if mark[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = 1;
        while let Some(&mut (at, ref mut next)) = path.last_mut() {
            let edges = &nodes[at].after;
            if *next == edges.len() {
                mark[at] = 2;
                path.pop();
                continue;
            }
            let to = index.get(edges[*next].node.as_str()).copied();
            *next += 1;
            let Some(to) = to else { continue };
            match mark[to] {
                0 => {
                    mark[to] = 1;
                    path.push((to, 0));
                }
                1 => {
                    let from = path.iter().position(|(n, _)| *n == to).unwrap_or(0);
                    return Some(
                        path[from..]
                            .iter()
                            .map(|(n, _)| nodes[*n].name.as_str())
                            .collect(),
                    );
                }
                _ => {}
            }
        }
    }
    None
}

/// The nodes in layers: layer 0 has the nodes after none, layer `k` the nodes whose longest
/// path from a layer-0 node has `k` edges. Each layer keeps the definition's order. Nodes on a
/// cycle (which [`dag_problems`] refuses) are left out.
pub fn layers(nodes: &[Node]) -> Vec<Vec<usize>> {
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let order = topological(nodes, &index);
    let mut depth = vec![0usize; nodes.len()];
    for &i in &order {
        depth[i] = nodes[i]
            .after
            .iter()
            .filter_map(|e| index.get(e.node.as_str()))
            .map(|&u| depth[u] + 1)
            .max()
            .unwrap_or(0);
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut placed: Vec<usize> = order.clone();
    placed.sort_unstable();
    for i in placed {
        let d = depth[i];
        if out.len() <= d {
            out.resize_with(d + 1, Vec::new);
        }
        out[d].push(i);
    }
    out
}

/// The nodes in an order where each comes after the nodes it names (Kahn's algorithm, the
/// definition's order among the ready ones); nodes on a cycle are left out.
fn topological(nodes: &[Node], index: &HashMap<&str, usize>) -> Vec<usize> {
    let mut waiting: Vec<usize> = nodes
        .iter()
        .map(|n| {
            n.after
                .iter()
                .filter(|e| index.contains_key(e.node.as_str()))
                .count()
        })
        .collect();
    let mut downstream: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for e in &n.after {
            if let Some(&u) = index.get(e.node.as_str()) {
                downstream[u].push(i);
            }
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..nodes.len())
        .filter(|&i| waiting[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &d in &downstream[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push(std::cmp::Reverse(d));
            }
        }
    }
    order
}

/// Each node's layer (see [`layers`]), by the nodes' index.
pub fn layer_of(nodes: &[Node]) -> Vec<usize> {
    let mut layer = vec![0usize; nodes.len()];
    for (depth, members) in layers(nodes).iter().enumerate() {
        for &i in members {
            layer[i] = depth;
        }
    }
    layer
}

/// The nodes downstream of `from` (by any edge, transitively), `from` included: what a rerun
/// from `from` runs again.
pub fn downstream_of(nodes: &[Node], from: &str) -> Vec<String> {
    let mut set: HashSet<&str> = HashSet::from([from]);
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    for i in topological(nodes, &index) {
        if nodes[i].after.iter().any(|e| set.contains(e.node.as_str())) {
            set.insert(nodes[i].name.as_str());
        }
    }
    nodes
        .iter()
        .filter(|n| set.contains(n.name.as_str()))
        .map(|n| n.name.clone())
        .collect()
}

/// How a node's run in the current round stands, as [`decide`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// No run made yet.
    Unmade,
    /// Made and not ended (pending, queued, running, retrying).
    Open,
    /// Succeeded.
    Succeeded,
    /// Failed, dead, lost or cancelled.
    Failed,
    /// Skipped (never ran).
    Skipped,
}

impl NodeState {
    /// The state of a node run in `chime_runs.state`.
    pub fn of_run(state: &str) -> NodeState {
        match state {
            "pending" | "queued" | "running" | "retrying" => NodeState::Open,
            "succeeded" => NodeState::Succeeded,
            "skipped" => NodeState::Skipped,
            _ => NodeState::Failed,
        }
    }

    fn ended(self) -> bool {
        !matches!(self, NodeState::Unmade | NodeState::Open)
    }
}

/// Why a workflow run stops starting nodes, besides a failed node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopping {
    /// It goes on.
    No,
    /// An operator cancelled it (or `replace` superseded it).
    Cancelled,
    /// It ran past its timeout, or a node cannot run (its job is gone): the message says which.
    Failing(String),
}

/// What one advance does to a workflow run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decisions {
    /// Nodes to start now (their runs made `pending`), in the definition's order.
    pub start: Vec<usize>,
    /// Nodes that will not run, each with the reason (their runs made `skipped`).
    pub skip: Vec<(usize, String)>,
    /// The workflow run's end, when every node has ended: its state and reason.
    pub end: Option<(&'static str, Option<String>)>,
}

/// Advances a workflow run from its nodes' states in the current round (`states[i]` for
/// `nodes[i]`): which nodes start, which are skipped, and whether the run ends. The rule
/// (docs/workflows.md, "How a workflow run advances"):
/// * a node waits until every node it comes after has ended;
/// * then it starts if every edge holds, unless the workflow run is failing (a node under
///   `fail_workflow` failed), when only failure handlers (a `failure` or `always` edge among
///   edges that all hold) start; otherwise it is skipped, with the reason;
/// * a cancelled or timed-out run skips every node not yet made;
/// * the run ends when no node is open or waiting: `cancelled`, `failed` (timed out, or a node
///   failed whose policy is not `continue`), else `succeeded`.
pub fn decide(nodes: &[Node], states: &[NodeState], stopping: &Stopping) -> Decisions {
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut states = states.to_vec();
    states.resize(nodes.len(), NodeState::Unmade);
    let fails = |i: usize, states: &[NodeState]| {
        states[i] == NodeState::Failed && nodes[i].on_failure != NodeFailurePolicy::Continue
    };
    let failing_at = |states: &[NodeState]| {
        (0..nodes.len())
            .find(|&i| fails(i, states) && nodes[i].on_failure == NodeFailurePolicy::FailWorkflow)
    };
    let mut out = Decisions::default();
    for i in topological(nodes, &index) {
        if states[i] != NodeState::Unmade {
            continue;
        }
        match stopping {
            Stopping::No => {}
            Stopping::Cancelled => {
                out.skip
                    .push((i, "the workflow run was cancelled".to_owned()));
                states[i] = NodeState::Skipped;
                continue;
            }
            Stopping::Failing(why) => {
                out.skip.push((i, why.clone()));
                states[i] = NodeState::Skipped;
                continue;
            }
        }
        let ups: Vec<(&Edge, usize)> = nodes[i]
            .after
            .iter()
            .filter_map(|e| index.get(e.node.as_str()).map(|&u| (e, u)))
            .collect();
        if ups.iter().any(|(_, u)| !states[*u].ended()) {
            continue;
        }
        let unmet = ups
            .iter()
            .find(|(e, u)| !holds(e.when, states[*u], nodes[*u].on_failure));
        let handler = ups.iter().any(|(e, _)| e.when != EdgeCondition::Success);
        let skip = if let Some((edge, u)) = unmet {
            Some(format!(
                "edge from node {} (when = \"{}\") not met: it {}",
                edge.node,
                edge.when.as_str(),
                ended_word(states[*u])
            ))
        } else {
            match failing_at(&states) {
                Some(f) if !handler => Some(format!(
                    "the workflow run is failing: node {} failed (on_failure = \"fail_workflow\")",
                    nodes[f].name
                )),
                _ => None,
            }
        };
        match skip {
            Some(reason) => {
                out.skip.push((i, reason));
                states[i] = NodeState::Skipped;
            }
            None => {
                out.start.push(i);
                states[i] = NodeState::Open;
            }
        }
    }
    out.start.sort_unstable();
    out.skip.sort_unstable_by_key(|(i, _)| *i);
    if states.iter().all(|s| s.ended()) {
        out.end = Some(match stopping {
            Stopping::Cancelled => ("cancelled", None),
            Stopping::Failing(why) => ("failed", Some(why.clone())),
            Stopping::No => match (0..nodes.len()).find(|&i| fails(i, &states)) {
                Some(f) => ("failed", Some(format!("node {} failed", nodes[f].name))),
                None => ("succeeded", None),
            },
        });
    }
    out
}

/// Whether an edge with condition `when` holds for an upstream node that ended in `state`
/// under failure policy `policy`.
fn holds(when: EdgeCondition, state: NodeState, policy: NodeFailurePolicy) -> bool {
    match when {
        EdgeCondition::Always => true,
        EdgeCondition::Failure => state == NodeState::Failed,
        EdgeCondition::Success => {
            state == NodeState::Succeeded
                || (state == NodeState::Failed && policy == NodeFailurePolicy::Continue)
        }
    }
}

fn ended_word(state: NodeState) -> &'static str {
    match state {
        NodeState::Succeeded => "succeeded",
        NodeState::Failed => "failed",
        NodeState::Skipped => "was skipped",
        NodeState::Unmade | NodeState::Open => "has not ended",
    }
}

/// What a node's params templates may name: the workflow run's params and id, and the
/// upstream nodes' outputs by node name.
#[derive(Debug, Clone, Default)]
pub struct TemplateScope<'a> {
    /// The workflow run's params.
    pub params: &'a Value,
    /// The workflow run's id.
    pub run_id: i64,
    /// The workflow's name.
    pub workflow: &'a str,
    /// Upstream nodes' outputs (`null` for none), by node name.
    pub outputs: BTreeMap<&'a str, &'a Value>,
}

/// Renders a node's params: every string that is exactly `{{ path }}` becomes the JSON value
/// the path names (kept as its type), and a `{{ path }}` inside other text is replaced by the
/// value as text. Paths: `params.a.b`, `workflow.run_id`, `workflow.name`,
/// `nodes.<node>.output.a.b`; a path naming nothing renders `null` (or nothing in text).
/// Returns the first path that is not one of these forms as an error.
pub fn render_params(template: &Value, scope: &TemplateScope<'_>) -> Result<Value, String> {
    Ok(match template {
        Value::String(text) => render_text(text, scope)?,
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| render_params(v, scope))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), render_params(v, scope)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

/// The `{{ … }}` paths a params template names, for validation.
pub fn template_paths(template: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_paths(template, &mut out);
    out
}

fn collect_paths(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) => {
            let mut rest = text.as_str();
            while let Some(start) = rest.find("{{") {
                let Some(len) = rest[start..].find("}}") else {
                    out.push(rest[start..].to_owned());
                    break;
                };
                out.push(rest[start + 2..start + len].trim().to_owned());
                rest = &rest[start + len + 2..];
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_paths(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_paths(v, out)),
        _ => {}
    }
}

/// The problem with a template path, if it is not one of the forms [`render_params`] knows or
/// names a node not in `upstream` (a node may read only the outputs of nodes it comes after,
/// directly or not).
pub fn path_problem(path: &str, upstream: &HashSet<&str>) -> Option<String> {
    let parts: Vec<&str> = path.split('.').collect();
    match parts.as_slice() {
        ["params", rest @ ..] if rest.iter().all(|p| !p.is_empty()) => None,
        ["workflow", "run_id" | "name"] => None,
        ["nodes", node, "output", rest @ ..] if rest.iter().all(|p| !p.is_empty()) => {
            if upstream.contains(node) {
                None
            } else {
                Some(format!(
                    "template {{{{ {path} }}}} names node {node:?}, which this node does not \
                     come after; a node reads the outputs of the nodes it comes after only"
                ))
            }
        }
        _ => Some(format!(
            "template {{{{ {path} }}}} is not one of {{{{ params.KEY }}}}, \
             {{{{ workflow.run_id }}}}, {{{{ workflow.name }}}} or \
             {{{{ nodes.NODE.output.KEY }}}}; fix the path"
        )),
    }
}

fn render_text(text: &str, scope: &TemplateScope<'_>) -> Result<Value, String> {
    let trimmed = text.trim();
    if let Some(inner) = trimmed
        .strip_prefix("{{")
        .and_then(|t| t.strip_suffix("}}"))
        && !inner.contains("{{")
        && !inner.contains("}}")
    {
        return lookup(inner.trim(), scope);
    }
    if !text.contains("{{") {
        return Ok(Value::String(text.to_owned()));
    }
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find("}}") else {
            return Err(format!(
                "unclosed template in {text:?}: add the closing }}}}"
            ));
        };
        match lookup(rest[start + 2..start + len].trim(), scope)? {
            Value::Null => {}
            Value::String(s) => out.push_str(&s),
            other => out.push_str(&other.to_string()),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    Ok(Value::String(out))
}

fn lookup(path: &str, scope: &TemplateScope<'_>) -> Result<Value, String> {
    let parts: Vec<&str> = path.split('.').collect();
    let walk = |mut at: &Value, rest: &[&str]| -> Value {
        for key in rest {
            at = match at {
                Value::Object(map) => map.get(*key).unwrap_or(&Value::Null),
                Value::Array(items) => key
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i))
                    .unwrap_or(&Value::Null),
                _ => &Value::Null,
            };
        }
        at.clone()
    };
    match parts.as_slice() {
        ["params", rest @ ..] => Ok(walk(scope.params, rest)),
        ["workflow", "run_id"] => Ok(Value::from(scope.run_id)),
        ["workflow", "name"] => Ok(Value::String(scope.workflow.to_owned())),
        ["nodes", node, "output", rest @ ..] => Ok(scope
            .outputs
            .get(node)
            .map_or(Value::Null, |out| walk(out, rest))),
        _ => Err(path_problem(path, &HashSet::new()).unwrap_or_default()),
    }
}

/// The params a node's run gets: the job's own, then the workflow run's, then the node's
/// rendered ones, each laid over the one before key by key when both are objects (replacing
/// it otherwise); `null` layers add nothing.
pub fn layered_params(layers: &[&Value]) -> Value {
    let mut out = Value::Null;
    for layer in layers {
        match (&mut out, layer) {
            (_, Value::Null) => {}
            (Value::Object(base), Value::Object(over)) => {
                for (k, v) in over {
                    base.insert(k.clone(), v.clone());
                }
            }
            (slot, other) => *slot = (*other).clone(),
        }
    }
    out
}

/// The DAG as text, one line per node, layer by layer: `layer 1  clean  job clean-orders
/// after extract, load (failure)  on_failure = "continue"` (the edge condition shown when not
/// `success`, the policy when not the default); what `chime check` and `chime workflows show`
/// print.
pub fn describe_dag(nodes: &[Node]) -> Vec<String> {
    let name_width = nodes.iter().map(|n| n.name.len()).max().unwrap_or(0);
    let job_width = nodes.iter().map(|n| n.job.len()).max().unwrap_or(0);
    let mut lines = Vec::with_capacity(nodes.len());
    for (depth, layer) in layers(nodes).iter().enumerate() {
        for &i in layer {
            let node = &nodes[i];
            let mut line = format!(
                "layer {depth}  {:<name_width$}  job {:<job_width$}",
                node.name, node.job
            );
            if !node.after.is_empty() {
                let after: Vec<String> = node
                    .after
                    .iter()
                    .map(|e| match e.when {
                        EdgeCondition::Success => e.node.clone(),
                        other => format!("{} ({})", e.node, other.as_str()),
                    })
                    .collect();
                line.push_str(&format!("  after {}", after.join(", ")));
            }
            if !node.on_failure.is_default() {
                line.push_str(&format!("  on_failure = {:?}", node.on_failure.as_str()));
            }
            lines.push(line.trim_end().to_owned());
        }
    }
    lines
}

/// Every node upstream of node `i` (transitively), by name.
pub fn upstream_of(nodes: &[Node], i: usize) -> HashSet<&str> {
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut seen = HashSet::new();
    let mut stack = vec![i];
    while let Some(at) = stack.pop() {
        for e in &nodes[at].after {
            if let Some(&u) = index.get(e.node.as_str())
                && seen.insert(nodes[u].name.as_str())
            {
                stack.push(u);
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests;
