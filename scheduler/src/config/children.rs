//! The rules of child jobs that look past one job (docs/configuration.md, "Child jobs"): every
//! job a list names exists, and the links form no cycle. Job files are checked as a whole when
//! they are loaded ([`link_errors`]); a job created or changed through the API is checked
//! against the stored jobs it reaches ([`api_link_problems`]). One job's own lists are checked
//! with its other fields (`jobs::Check::child_jobs`).

use std::collections::HashMap;

use serde_json::Value;

use super::jobs::LoadedJob;
use super::suggest::closest;
use super::{ConfigError, FieldError, JobRef, render};
use crate::job::ChildJobs;

/// Each job's children by name, with the list naming each.
type Links<'a> = HashMap<&'a str, Vec<(&'static str, &'a str)>>;

/// The cycles through the links reachable from `roots`, each as the names along it, the first
/// repeated at the end (`a → b → a`); each found once, by a depth-first walk without recursion
/// (a chain of 100,000 jobs is fine).
fn cycles<'a>(links: &Links<'a>, roots: impl IntoIterator<Item = &'a str>) -> Vec<Vec<&'a str>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    let mut marks: HashMap<&str, Mark> = HashMap::new();
    let mut found = Vec::new();
    for root in roots {
        if marks.contains_key(root) {
            continue;
        }
        // The path from the root, each with the index of its next child to visit.
        let mut path: Vec<(&str, usize)> = vec![(root, 0)];
        marks.insert(root, Mark::Open);
        while let Some(&(node, next)) = path.last() {
            let children = links.get(node).map_or(&[][..], Vec::as_slice);
            let Some(&(_, child)) = children.get(next) else {
                marks.insert(node, Mark::Done);
                path.pop();
                continue;
            };
            if let Some(top) = path.last_mut() {
                top.1 += 1;
            }
            match marks.get(child) {
                Some(Mark::Done) => {}
                Some(Mark::Open) => {
                    let from = path.iter().position(|(n, _)| *n == child).unwrap_or(0);
                    let mut cycle: Vec<&str> = path[from..].iter().map(|(n, _)| *n).collect();
                    cycle.push(child);
                    found.push(cycle);
                }
                None => {
                    marks.insert(child, Mark::Open);
                    path.push((child, 0));
                }
            }
        }
    }
    found
}

/// The problem of a cycle, said on the link from its first job to the second.
fn cycle_problem(links: &Links<'_>, cycle: &[&str]) -> FieldError {
    let (first, second) = (cycle[0], cycle[1]);
    let field = links
        .get(first)
        .and_then(|children| children.iter().find(|(_, c)| *c == second))
        .map_or("on_complete", |(field, _)| *field);
    FieldError::new(
        field,
        Some(render(&Value::String(second.to_owned()))),
        format!(
            "child jobs form a cycle: {}, so each run would start the next for ever; remove \
             one of these links",
            cycle.join(" → ")
        ),
    )
}

fn links_of<'a>(links: &mut Links<'a>, name: &'a str, children: &'a ChildJobs) {
    if !children.is_empty() {
        links.insert(name, children.named());
    }
}

/// The job files' mistakes in child links: a child job no file declares (with the closest
/// name), and each cycle (on its first job).
pub(super) fn link_errors(jobs: &[LoadedJob]) -> Vec<ConfigError> {
    let mut links = Links::new();
    for job in jobs {
        links_of(&mut links, &job.spec.name, &job.spec.children);
    }
    if links.is_empty() {
        return Vec::new();
    }
    let origins: HashMap<&str, &str> = jobs
        .iter()
        .map(|job| (job.spec.name.as_str(), job.origin.as_str()))
        .collect();
    let mut errors = Vec::new();
    for job in jobs {
        for (field, child) in job.spec.children.named() {
            if origins.contains_key(child) {
                continue;
            }
            let near = closest(child, origins.keys().copied())
                .map(|near| format!(" did you mean {near:?}?"))
                .unwrap_or_default();
            errors.push(ConfigError::in_job(
                &job.origin,
                &JobRef::Name(job.spec.name.clone()),
                FieldError::new(
                    field,
                    Some(render(&Value::String(child.to_owned()))),
                    format!(
                        "no job of this name in the job files;{near} declare the child job in \
                         a job file, or fix the name"
                    ),
                ),
            ));
        }
    }
    let roots: Vec<&str> = jobs.iter().map(|job| job.spec.name.as_str()).collect();
    for cycle in cycles(&links, roots) {
        errors.push(ConfigError::in_job(
            origins.get(cycle[0]).copied().unwrap_or_default(),
            &JobRef::Name(cycle[0].to_owned()),
            cycle_problem(&links, &cycle),
        ));
    }
    errors
}

/// The problems of `spec`'s child links among the stored jobs: `stored` holds the child lists
/// of every stored job reachable from `spec`'s children (`Store::child_links`; a name missing
/// there does not exist). A child job that does not exist, and a cycle back to `spec`.
pub(crate) fn api_link_problems(
    name: &str,
    children: &ChildJobs,
    stored: &HashMap<String, ChildJobs>,
) -> Vec<FieldError> {
    let mut problems = Vec::new();
    for (field, child) in children.named() {
        if child != name && !stored.contains_key(child) {
            problems.push(FieldError::new(
                field,
                Some(render(&Value::String(child.to_owned()))),
                format!(
                    "no job named {child:?}; create the child job first (POST /api/jobs), or \
                     fix the name"
                ),
            ));
        }
    }
    let mut links = Links::new();
    for (job, its) in stored {
        if job != name {
            links_of(&mut links, job, its);
        }
    }
    links_of(&mut links, name, children);
    if let Some(cycle) = cycles(&links, [name]).into_iter().next() {
        problems.push(cycle_problem(&links, &cycle));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links<'a>(edges: &[(&'a str, &'a str)]) -> Links<'a> {
        let mut links = Links::new();
        for (from, to) in edges {
            links.entry(*from).or_default().push(("on_success", *to));
        }
        links
    }

    #[test]
    fn a_cycle_is_found_once_with_its_path() {
        let graph = links(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("x", "b")]);
        let found = cycles(&graph, ["x", "a", "b", "c", "d"]);
        assert_eq!(found, [vec!["b", "c", "a", "b"]]);
        let graph = links(&[("a", "a")]);
        assert_eq!(cycles(&graph, ["a"]), [vec!["a", "a"]]);
    }

    #[test]
    fn a_diamond_is_no_cycle() {
        let graph = links(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]);
        assert!(cycles(&graph, ["a", "b", "c", "d"]).is_empty());
    }

    #[test]
    fn a_long_chain_is_walked_without_recursion() {
        let names: Vec<String> = (0..100_000).map(|i| format!("j{i}")).collect();
        let edges: Vec<(&str, &str)> = names
            .windows(2)
            .map(|w| (w[0].as_str(), w[1].as_str()))
            .collect();
        let mut graph = links(&edges);
        assert!(cycles(&graph, names.iter().map(String::as_str)).is_empty());
        graph
            .entry(names[99_999].as_str())
            .or_default()
            .push(("on_failure", names[0].as_str()));
        let found = cycles(&graph, names.iter().map(String::as_str));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].len(), 100_001);
    }

    #[test]
    fn an_api_job_names_stored_jobs_and_closes_no_cycle() {
        let on_success = |jobs: &[&str]| ChildJobs {
            on_success: jobs.iter().map(|j| (*j).to_owned()).collect(),
            ..ChildJobs::default()
        };
        let mut stored = HashMap::new();
        stored.insert("b".to_owned(), on_success(&["c"]));
        stored.insert("c".to_owned(), ChildJobs::default());
        assert!(api_link_problems("a", &on_success(&["b"]), &stored).is_empty());
        let missing = api_link_problems("a", &on_success(&["b", "zz"]), &stored);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].value.as_deref(), Some("\"zz\""));
        stored.insert("c".to_owned(), on_success(&["a"]));
        let cycle = api_link_problems("a", &on_success(&["b"]), &stored);
        assert_eq!(cycle.len(), 1);
        assert!(
            cycle[0].message.contains("a → b → c → a"),
            "{}",
            cycle[0].message
        );
        assert_eq!(cycle[0].field.as_deref(), Some("on_success"));
    }
}
