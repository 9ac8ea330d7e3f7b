//! Workflow operations (docs/workflows.md): list and show workflows, show a workflow run with
//! its nodes, rerun a workflow run from a node, cancel one. One home for these: the API, the
//! CLI and the dashboard all come here. A workflow is a job of kind `workflow`, so pausing,
//! triggering and listing its runs are the jobs' and runs' operations.

use serde::Serialize;

use super::audit::Entry;
use super::{Action, Cancelled, Operations, OpsError, OpsResult, no_such_job};
use crate::auth::Caller;
use crate::job::{JobSpec, Kind};
use crate::store::{NodeShape, Rerun, WorkflowRunView};
use crate::workflow;

/// A workflow in a listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowSummary {
    /// Its name (a job's).
    pub name: String,
    /// Its schedule in words.
    pub schedule: String,
    /// Whether it is paused.
    pub paused: bool,
    /// How many nodes.
    pub nodes: usize,
    /// How many layers its drawing has.
    pub layers: usize,
    /// `config` or `api`.
    pub source: String,
    /// Free text.
    pub description: Option<String>,
}

/// A node of a workflow's definition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDefinition {
    /// What it is.
    #[serde(flatten)]
    pub shape: NodeShape,
    /// Its params template, if any.
    pub params: Option<serde_json::Value>,
}

/// A workflow's definition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowDetail {
    /// What the listing shows.
    #[serde(flatten)]
    pub summary: WorkflowSummary,
    /// Its nodes, in the definition's order.
    pub nodes: Vec<NodeDefinition>,
    /// The DAG as text, layer by layer (as `chime check` prints it).
    pub dag: Vec<String>,
}

/// What a rerun did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reran {
    /// The workflow run.
    pub run_id: i64,
    /// Its new round.
    pub round: i32,
    /// The nodes that run again, the node asked for first.
    pub nodes: Vec<String>,
}

fn summary(spec: &JobSpec, paused: bool, source: &str) -> Option<WorkflowSummary> {
    let Kind::Workflow { nodes } = &spec.kind else {
        return None;
    };
    Some(WorkflowSummary {
        name: spec.name.clone(),
        schedule: spec
            .timing()
            .map_or_else(|e| e.to_string(), |t| t.describe()),
        paused,
        nodes: nodes.len(),
        layers: workflow::layers(nodes).len(),
        source: source.to_owned(),
        description: spec.description.clone(),
    })
}

fn no_such_workflow_run(id: i64) -> OpsError {
    OpsError::NotFound(format!(
        "no workflow run with id {id}; list a workflow's runs with `chime workflows runs NAME` \
         or GET /api/workflows/NAME/runs"
    ))
}

impl Operations {
    /// Every workflow, by name.
    pub async fn workflows(&self, caller: &Caller) -> OpsResult<Vec<WorkflowSummary>> {
        self.authorize(caller, Action::WorkflowsList, Entry::none())
            .await?;
        Ok(self
            .store
            .workflow_jobs()
            .await?
            .iter()
            .filter_map(|job| summary(&job.spec, job.paused, &job.source))
            .collect())
    }

    /// One workflow's definition.
    pub async fn workflow(&self, caller: &Caller, name: &str) -> OpsResult<WorkflowDetail> {
        self.authorize(caller, Action::WorkflowsShow, Entry::job(name))
            .await?;
        let job = self
            .store
            .job(name)
            .await?
            .ok_or_else(|| no_such_job(name))?;
        let Kind::Workflow { nodes } = &job.spec.kind else {
            return Err(OpsError::NotFound(format!(
                "job {name:?} is not a workflow (it is of kind {}); list workflows with \
                 `chime workflows list`",
                job.spec.kind.as_str()
            )));
        };
        Ok(WorkflowDetail {
            summary: summary(&job.spec, job.paused, &job.source).unwrap_or_else(|| unreachable!()),
            nodes: NodeShape::of(nodes)
                .into_iter()
                .zip(nodes)
                .map(|(shape, n)| NodeDefinition {
                    shape,
                    params: n.params.clone(),
                })
                .collect(),
            dag: workflow::describe_dag(nodes),
        })
    }

    /// A workflow run with each node's current run.
    pub async fn workflow_run(&self, caller: &Caller, id: i64) -> OpsResult<WorkflowRunView> {
        self.authorize(caller, Action::WorkflowsRun, Entry::run(id))
            .await?;
        self.store
            .workflow_run(id)
            .await?
            .ok_or_else(|| no_such_workflow_run(id))
    }

    /// Reruns ended workflow run `id` from node `node`: it and every node after it run again,
    /// in a new round; the run is `running` until they end.
    pub async fn rerun_workflow(&self, caller: &Caller, id: i64, node: &str) -> OpsResult<Reran> {
        let entry = Entry::run(id).detail(serde_json::json!({"node": node}));
        self.audited(caller, Action::WorkflowsRerun, entry, async |_| match self
            .store
            .rerun_workflow(id, node, &caller.actor)
            .await?
        {
            Rerun::Done { round, nodes } => Ok(Reran {
                run_id: id,
                round,
                nodes,
            }),
            Rerun::NotFound => Err(no_such_workflow_run(id)),
            Rerun::NoSuchNode(names) => Err(OpsError::NotFound(format!(
                "workflow run {id} has no node {node:?}; its nodes: {}",
                names.join(", ")
            ))),
            Rerun::Running => Err(OpsError::Conflict(format!(
                "workflow run {id} has not ended; rerun a node once it has, or cancel it \
                     first (`chime workflows cancel {id}`)"
            ))),
        })
        .await
    }

    /// Cancels workflow run `id` (as [`Operations::cancel_run`], which tells the workers of
    /// its running nodes).
    pub async fn cancel_workflow_run(&self, caller: &Caller, id: i64) -> OpsResult<Cancelled> {
        self.authorize(caller, Action::WorkflowsRun, Entry::run(id))
            .await?;
        if self.store.workflow_run(id).await?.is_none() {
            return Err(no_such_workflow_run(id));
        }
        self.cancel_run(caller, id).await
    }
}
