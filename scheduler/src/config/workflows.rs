//! The rules of workflows that look past one definition (docs/workflows.md): every node's job
//! exists and is not itself a workflow. Job files are checked as a whole when they are loaded
//! ([`node_job_errors`]); a workflow sent to the API is checked against the stored jobs
//! ([`api_node_problems`]). One workflow's own nodes are checked with its other fields
//! (`jobs::Check::nodes`).

use std::collections::HashMap;

use serde_json::Value;

use super::jobs::LoadedJob;
use super::suggest::closest;
use super::{ConfigError, FieldError, JobRef, render};
use crate::job::{Kind, KindName};

/// The problem with node `i` naming job `job`, given the kinds of the jobs that exist.
fn node_problem(
    i: usize,
    job: &str,
    kinds: &HashMap<&str, KindName>,
    fix: &str,
) -> Option<FieldError> {
    let field = format!("nodes[{i}].job");
    let value = Some(render(&Value::String(job.to_owned())));
    match kinds.get(job) {
        Some(KindName::Workflow) => Some(FieldError::new(
            &field,
            value,
            format!(
                "job {job:?} is a workflow; a node runs a job of another kind (single, \
                 broadcast, sharded or map_reduce): start the other workflow as a child job \
                 (on_success) instead"
            ),
        )),
        Some(_) => None,
        None => {
            let near = closest(job, kinds.keys().copied())
                .map(|near| format!(" did you mean {near:?}?"))
                .unwrap_or_default();
            Some(FieldError::new(
                &field,
                value,
                format!("no job of this name;{near} {fix}"),
            ))
        }
    }
}

/// The job files' mistakes in workflow nodes: a node's job no file declares (with the closest
/// name), or one that is itself a workflow.
pub(super) fn node_job_errors(jobs: &[LoadedJob]) -> Vec<ConfigError> {
    let kinds: HashMap<&str, KindName> = jobs
        .iter()
        .map(|job| (job.spec.name.as_str(), job.spec.kind.name()))
        .collect();
    let mut errors = Vec::new();
    for job in jobs {
        let Kind::Workflow { nodes } = &job.spec.kind else {
            continue;
        };
        for (i, node) in nodes.iter().enumerate() {
            if let Some(problem) = node_problem(
                i,
                &node.job,
                &kinds,
                "declare the job in a job file, or fix the name",
            ) {
                errors.push(ConfigError::in_job(
                    &job.origin,
                    &JobRef::Name(job.spec.name.clone()),
                    problem,
                ));
            }
        }
    }
    errors
}

/// The problems of a workflow's nodes among the stored jobs: `stored` holds the kind of every
/// stored job its nodes name (a name missing there does not exist).
pub(crate) fn api_node_problems(
    kind: &Kind,
    stored: &HashMap<String, KindName>,
) -> Vec<FieldError> {
    let Kind::Workflow { nodes } = kind else {
        return Vec::new();
    };
    let kinds: HashMap<&str, KindName> = stored.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            node_problem(
                i,
                &node.job,
                &kinds,
                "create the job first (POST /api/jobs), or fix the name",
            )
        })
        .collect()
}
