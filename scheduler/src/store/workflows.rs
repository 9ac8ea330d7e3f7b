//! The SQL of workflow runs (docs/workflows.md): starting one when its fire is dispatched,
//! advancing the runs queued in `chime_workflow_advances` under the leader's fence (the rule is
//! [`crate::workflow::decide`]; [`crate::outbox`]'s sweep publishes the node runs made), and the
//! operators' reads and reruns. Part of [`crate::store`].
//!
//! One advance is one transaction: the fence is taken (`chime_fence`, the lease row locked for
//! the transaction), the queue rows deleted, the workflow runs locked, their node runs read,
//! the decisions written (node runs unique on (workflow run, node, round)) and the workflow
//! runs' states set. A crash anywhere rolls it all back, queue rows included.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::Context as _;
use chime_protocol::limits::MAX_PARAMS_BYTES;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row as _;

use super::{Fence, Store};
use crate::job::{JobSpec, Kind, KindName};
use crate::workflow::{self, Node, NodeState, Stopping, TemplateScope};

/// Workflow runs one advance takes at most from the queue; a full batch wakes the sweep again.
pub const WORKFLOW_BATCH: i64 = 500;

/// `cancel_requested_by` of a workflow run stopped by its timeout.
const TIMEOUT_ACTOR: &str = "timeout";

/// What one advance did to one workflow run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkflowStep {
    /// The workflow run.
    pub run_id: i64,
    /// Node runs made `pending`, as (node, run id).
    pub started: Vec<(String, i64)>,
    /// Node runs made `skipped` or `failed` without running.
    pub decided: usize,
    /// The state it ended in, if it did.
    pub ended: Option<String>,
    /// Seconds from the latest end among its `after` nodes to each started node's making, for
    /// nodes after others (the advance latency's first half).
    pub waits: Vec<f64>,
    /// Running node runs this advance stopped (the workflow run timed out): their workers are
    /// to be told (a cancel control message each).
    pub stopped: Vec<i64>,
}

/// A node run to insert.
struct NewNode {
    workflow_run_id: i64,
    node: String,
    round: i32,
    job: String,
    group: String,
    at: DateTime<Utc>,
    params: Value,
    state: &'static str,
    reason: Option<String>,
}

/// A workflow run as an advance reads it.
struct Locked {
    id: i64,
    name: String,
    state: String,
    params: Value,
    scheduled_at: DateTime<Utc>,
    deadline_at: Option<DateTime<Utc>>,
    cancel_by: Option<String>,
    cancelling: bool,
    reason: Option<String>,
    spec: Option<JobSpec>,
}

/// A node run as an advance reads it.
struct NodeRow {
    node: String,
    round: i32,
    state: String,
    finished_at: Option<DateTime<Utc>>,
}

/// A node's job as an advance reads it.
struct NodeJob {
    group: String,
    params: Value,
    paused: bool,
    workflow: bool,
}

impl Store {
    /// Advances workflow runs under the leader's fence: the pending ones in `start` (their fire
    /// was dispatched: they start, their first nodes are made), then up to `batch` runs from the
    /// queue (a node ended, a cancel, a rerun; with `batch` > 0 the runs past their deadline are
    /// queued first). `Ok(None)` when the fence no longer holds (nothing written).
    pub async fn advance_workflows(
        &self,
        fence: &Fence,
        start: &[i64],
        batch: i64,
    ) -> anyhow::Result<Option<Vec<WorkflowStep>>> {
        let mut tx = self
            .pool
            .begin()
            .await
            .context("starting a workflow advance")?;
        let leased: Option<i64> = sqlx::query_scalar("SELECT term FROM chime_fence($1, $2)")
            .bind(&fence.holder)
            .bind(fence.term)
            .fetch_optional(&mut *tx)
            .await
            .context("taking the fence for a workflow advance")?;
        if leased.is_none() {
            return Ok(None);
        }
        let mut ids: Vec<i64> = start.to_vec();
        if batch > 0 {
            sqlx::query(
                "INSERT INTO chime_workflow_advances (run_id)
                 SELECT id FROM chime_runs
                  WHERE deadline_at < now() AND state = 'running' AND cancel_requested_at IS NULL
                 ON CONFLICT DO NOTHING",
            )
            .execute(&mut *tx)
            .await
            .context("queueing workflow runs past their deadline")?;
            let taken: Vec<i64> = sqlx::query_scalar(
                "DELETE FROM chime_workflow_advances a
                  WHERE a.run_id IN (SELECT q.run_id FROM chime_workflow_advances q
                                      ORDER BY q.run_id LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING a.run_id",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await
            .context("taking queued workflow runs")?;
            if i64::try_from(taken.len()).unwrap_or(i64::MAX) >= batch {
                sqlx::query("SELECT pg_notify('chime_outbox', 'advance more')")
                    .execute(&mut *tx)
                    .await?;
            }
            ids.extend(taken);
        }
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Some(Vec::new()));
        }
        let runs = lock_runs(&mut tx, &ids).await?;
        let running: Vec<i64> = runs.iter().map(|r| r.id).collect();
        let mut nodes_of: HashMap<i64, Vec<NodeRow>> = HashMap::new();
        for r in sqlx::query(
            "SELECT workflow_run_id, node, node_round, state, finished_at
               FROM chime_runs WHERE workflow_run_id = ANY ($1)",
        )
        .bind(&running)
        .fetch_all(&mut *tx)
        .await
        .context("reading node runs")?
        {
            nodes_of
                .entry(r.get("workflow_run_id"))
                .or_default()
                .push(NodeRow {
                    node: r.get("node"),
                    round: r.get("node_round"),
                    state: r.get("state"),
                    finished_at: r.get("finished_at"),
                });
        }
        let rounds = node_rounds(&mut tx, &running).await?;
        let mut wanted: Vec<String> = runs
            .iter()
            .filter_map(|r| r.spec.as_ref())
            .filter_map(|s| match &s.kind {
                Kind::Workflow { nodes } => Some(nodes.iter().map(|n| n.job.clone())),
                _ => None,
            })
            .flatten()
            .collect();
        // Many nodes run one job: a long array of one name made the read 45 ms.
        wanted.sort_unstable();
        wanted.dedup();
        let jobs = node_jobs(&mut tx, &wanted).await?;

        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await?;
        let mut steps = Vec::new();
        let mut inserts: Vec<NewNode> = Vec::new();
        let mut ends: Vec<(i64, &'static str, Option<String>)> = Vec::new();
        let mut begun: Vec<(i64, Option<DateTime<Utc>>)> = Vec::new();
        let mut timeouts: Vec<(i64, String)> = Vec::new();
        let mut outputs_needed: Vec<i64> = Vec::new();
        let mut planned: Vec<(usize, Vec<usize>, Vec<i32>)> = Vec::new();
        for (k, run) in runs.iter().enumerate() {
            let Some(JobSpec {
                kind: Kind::Workflow { nodes },
                timeout,
                ..
            }) = &run.spec
            else {
                continue;
            };
            let since = rounds.get(&run.id);
            let round_of = |name: &str| -> i32 {
                since
                    .and_then(|m: &HashMap<String, i32>| m.get(name))
                    .copied()
                    .unwrap_or(0)
            };
            let rows = nodes_of.get(&run.id).map_or(&[][..], Vec::as_slice);
            let current: HashMap<&str, &NodeRow> = rows
                .iter()
                .filter(|row| row.round == round_of(&row.node))
                .map(|row| (row.node.as_str(), row))
                .collect();
            let states: Vec<NodeState> = nodes
                .iter()
                .map(|n| {
                    current
                        .get(n.name.as_str())
                        .map_or(NodeState::Unmade, |row| NodeState::of_run(&row.state))
                })
                .collect();
            let starting = run.state == "pending";
            if starting {
                begun.push((run.id, deadline(now, *timeout)));
            } else if run.state != "running" {
                continue;
            }
            let missing = nodes.iter().find_map(|n| match jobs.get(&n.job) {
                None => Some(format!(
                    "node {} cannot run: job {} does not exist any more",
                    n.name, n.job
                )),
                Some(job) if job.workflow => Some(format!(
                    "node {} cannot run: job {} is a workflow",
                    n.name, n.job
                )),
                Some(_) => None,
            });
            let stopping = if run.cancelling {
                if run.cancel_by.as_deref() == Some(TIMEOUT_ACTOR) {
                    Stopping::Failing(run.reason.clone().unwrap_or_default())
                } else {
                    Stopping::Cancelled
                }
            } else if let (Some(at), Some(t)) = (run.deadline_at, timeout)
                && at <= now
            {
                let why = format!("exceeded its timeout of {}", humantime::format_duration(*t));
                timeouts.push((run.id, why.clone()));
                Stopping::Failing(why)
            } else if let Some(why) = missing {
                Stopping::Failing(why)
            } else {
                Stopping::No
            };
            let decisions = workflow::decide(nodes, &states, &stopping);
            let mut step = WorkflowStep {
                run_id: run.id,
                decided: decisions.skip.len(),
                ..WorkflowStep::default()
            };
            for (i, reason) in &decisions.skip {
                let node = &nodes[*i];
                let job = jobs.get(&node.job);
                inserts.push(NewNode {
                    workflow_run_id: run.id,
                    node: node.name.clone(),
                    round: round_of(&node.name),
                    job: node.job.clone(),
                    group: job.map(|j| j.group.clone()).unwrap_or_default(),
                    at: now,
                    params: Value::Null,
                    state: "skipped",
                    reason: Some(reason.clone()),
                });
            }
            for &i in &decisions.start {
                let latest = nodes[i]
                    .after
                    .iter()
                    .filter_map(|e| current.get(e.node.as_str()))
                    .filter_map(|row| row.finished_at)
                    .max();
                if let Some(latest) = latest {
                    step.waits
                        .push((now - latest).num_microseconds().unwrap_or(0) as f64 / 1e6);
                }
            }
            if decisions.start.iter().any(|&i| {
                nodes[i].params.as_ref().is_some_and(|p| {
                    workflow::template_paths(p)
                        .iter()
                        .any(|t| t.starts_with("nodes."))
                })
            }) {
                outputs_needed.push(run.id);
            }
            let rounds_of_start = decisions
                .start
                .iter()
                .map(|&i| round_of(&nodes[i].name))
                .collect();
            planned.push((k, decisions.start.clone(), rounds_of_start));
            if let Some((state, reason)) = decisions.end {
                ends.push((run.id, state, reason));
                step.ended = Some(state.to_owned());
            }
            steps.push(step);
        }
        let outputs = node_outputs(&mut tx, &outputs_needed, &rounds).await?;
        for (k, start, node_rounds) in planned {
            let run = &runs[k];
            let Some(JobSpec {
                kind: Kind::Workflow { nodes },
                ..
            }) = &run.spec
            else {
                continue;
            };
            let empty = BTreeMap::new();
            let outs = outputs.get(&run.id).unwrap_or(&empty);
            for (i, round) in start.into_iter().zip(node_rounds) {
                let node: &Node = &nodes[i];
                let Some(job) = jobs.get(&node.job) else {
                    continue;
                };
                let scope = TemplateScope {
                    params: &run.params,
                    run_id: run.id,
                    workflow: &run.name,
                    outputs: outs.iter().map(|(k, v)| (k.as_str(), v)).collect(),
                };
                let rendered = match &node.params {
                    None => Ok(Value::Null),
                    Some(t) => workflow::render_params(t, &scope),
                };
                let (state, reason, params) = match rendered {
                    Err(why) => ("failed", Some(format!("params: {why}")), Value::Null),
                    Ok(own) => {
                        let params = workflow::layered_params(&[&job.params, &run.params, &own]);
                        let size = serde_json::to_vec(&params).map_or(0, |b| b.len());
                        if size > MAX_PARAMS_BYTES {
                            (
                                "failed",
                                Some(format!(
                                    "params: {size} bytes as JSON after templates, more than \
                                     the limit of {MAX_PARAMS_BYTES}; pass references to the \
                                     data instead"
                                )),
                                Value::Null,
                            )
                        } else if job.paused {
                            (
                                "skipped",
                                Some(format!("job {} is paused", node.job)),
                                params,
                            )
                        } else {
                            ("pending", None, params)
                        }
                    }
                };
                inserts.push(NewNode {
                    workflow_run_id: run.id,
                    node: node.name.clone(),
                    round,
                    job: node.job.clone(),
                    group: job.group.clone(),
                    at: if run.scheduled_at > now {
                        run.scheduled_at
                    } else {
                        now
                    },
                    params,
                    state,
                    reason,
                });
            }
        }
        let made = insert_nodes(&mut tx, fence.term, &inserts).await?;
        for step in &mut steps {
            step.started = made
                .iter()
                .filter(|(wr, _, _, state)| *wr == step.run_id && state == "pending")
                .map(|(_, node, id, _)| (node.clone(), *id))
                .collect();
        }
        // A node made failed or skipped at once needs another look: queue its run again.
        let again: Vec<i64> = made
            .iter()
            .filter(|(_, _, _, state)| state != "pending")
            .map(|(wr, _, _, _)| *wr)
            .collect();
        let stopped = write_states(&mut tx, &begun, &timeouts, &ends, &again).await?;
        for step in &mut steps {
            step.stopped = stopped
                .iter()
                .filter(|(wr, _)| *wr == step.run_id)
                .map(|(_, id)| *id)
                .collect();
        }
        if !start.is_empty() && !made.is_empty() {
            sqlx::query("SELECT pg_notify('chime_outbox', 'nodes')")
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await.context("committing a workflow advance")?;
        Ok(Some(steps))
    }
}

fn deadline(now: DateTime<Utc>, timeout: Option<Duration>) -> Option<DateTime<Utc>> {
    let t = chrono::Duration::from_std(timeout?).ok()?;
    now.checked_add_signed(t)
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Postgres>;

/// Locks the workflow runs among `ids` (top-level runs of workflow jobs) and reads them with
/// the definition each was made with.
async fn lock_runs(tx: &mut Tx<'_>, ids: &[i64]) -> anyhow::Result<Vec<Locked>> {
    let rows = sqlx::query(
        "SELECT r.id, r.job_name, r.state, r.params, r.scheduled_at, r.deadline_at, r.reason,
                r.cancel_requested_at IS NOT NULL AS cancelling, r.cancel_requested_by,
                coalesce(v.spec, j.spec) AS spec
           FROM chime_runs r
           LEFT JOIN chime_job_versions v ON v.job_name = r.job_name AND v.version = r.job_version
           LEFT JOIN chime_jobs j ON j.name = r.job_name
          WHERE r.id = ANY ($1) AND r.parent_id IS NULL AND r.workflow_run_id IS NULL
          ORDER BY r.id
            FOR UPDATE OF r",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await
    .context("locking workflow runs")?;
    Ok(rows
        .iter()
        .map(|r| Locked {
            id: r.get("id"),
            name: r.get("job_name"),
            state: r.get("state"),
            params: r.get("params"),
            scheduled_at: r.get("scheduled_at"),
            deadline_at: r.get("deadline_at"),
            cancel_by: r.get("cancel_requested_by"),
            cancelling: r.get("cancelling"),
            reason: r.get("reason"),
            spec: r
                .get::<Option<Value>, _>("spec")
                .and_then(|v| serde_json::from_value(v).ok()),
        })
        .filter(|r| {
            matches!(
                r.spec,
                Some(JobSpec {
                    kind: Kind::Workflow { .. },
                    ..
                })
            )
        })
        .collect())
}

/// The round each rerun node of these workflow runs is in (nodes not rerun are in round 0).
async fn node_rounds(
    tx: &mut Tx<'_>,
    runs: &[i64],
) -> anyhow::Result<HashMap<i64, HashMap<String, i32>>> {
    let mut out: HashMap<i64, HashMap<String, i32>> = HashMap::new();
    for r in sqlx::query(
        "SELECT w.run_id, n.node, max(w.round) AS round
           FROM chime_workflow_reruns w CROSS JOIN LATERAL unnest(w.nodes) AS n(node)
          WHERE w.run_id = ANY ($1) GROUP BY w.run_id, n.node",
    )
    .bind(runs)
    .fetch_all(&mut **tx)
    .await
    .context("reading workflow reruns")?
    {
        out.entry(r.get("run_id"))
            .or_default()
            .insert(r.get("node"), r.get("round"));
    }
    Ok(out)
}

/// The jobs that nodes name, by name.
async fn node_jobs(tx: &mut Tx<'_>, names: &[String]) -> anyhow::Result<HashMap<String, NodeJob>> {
    let rows = sqlx::query(
        "SELECT name, group_name, coalesce(spec->'params', 'null') AS params, paused,
                chime_job_kind(spec) = 'workflow' AS workflow
           FROM chime_jobs WHERE name = ANY ($1)",
    )
    .bind(names)
    .fetch_all(&mut **tx)
    .await
    .context("reading the jobs of workflow nodes")?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get("name"),
                NodeJob {
                    group: r.get("group_name"),
                    params: r.get("params"),
                    paused: r.get("paused"),
                    workflow: r.get("workflow"),
                },
            )
        })
        .collect())
}

/// The outputs of the current ended node runs of these workflow runs, by node.
async fn node_outputs(
    tx: &mut Tx<'_>,
    runs: &[i64],
    rounds: &HashMap<i64, HashMap<String, i32>>,
) -> anyhow::Result<HashMap<i64, BTreeMap<String, Value>>> {
    let mut out: HashMap<i64, BTreeMap<String, Value>> = HashMap::new();
    if runs.is_empty() {
        return Ok(out);
    }
    for r in sqlx::query(
        "SELECT workflow_run_id, node, node_round, output FROM chime_runs
          WHERE workflow_run_id = ANY ($1) AND output IS NOT NULL",
    )
    .bind(runs)
    .fetch_all(&mut **tx)
    .await
    .context("reading node outputs")?
    {
        let run: i64 = r.get("workflow_run_id");
        let node: String = r.get("node");
        let round: i32 = r.get("node_round");
        let current = rounds
            .get(&run)
            .and_then(|m| m.get(&node))
            .copied()
            .unwrap_or(0);
        if round == current {
            out.entry(run).or_default().insert(node, r.get("output"));
        }
    }
    Ok(out)
}

/// Inserts node runs (once per workflow run, node and round); returns those made as
/// (workflow run, node, run id, state). `created_at` is the insert's instant, not the
/// transaction's start: the ends the advance read may have committed after that start.
async fn insert_nodes(
    tx: &mut Tx<'_>,
    term: i64,
    nodes: &[NewNode],
) -> anyhow::Result<Vec<(i64, String, i64, String)>> {
    if nodes.is_empty() {
        return Ok(Vec::new());
    }
    let col = |f: fn(&NewNode) -> String| nodes.iter().map(f).collect::<Vec<_>>();
    let rows = sqlx::query(
        "INSERT INTO chime_runs (workflow_run_id, node, node_round, job_name, group_name,
                                 scheduled_at, trigger, params, state, reason, term, finished_at,
                                 created_at)
         SELECT u.wr, u.node, u.round, u.job, u.grp, u.at, 'workflow', u.params, u.state,
                u.reason, $11, CASE WHEN u.state = 'pending' THEN NULL ELSE now() END,
                clock_timestamp()
           FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::text[],
                       $6::timestamptz[], $7::jsonb[], $8::text[], $9::text[], $10::int[])
                AS u(wr, node, round, job, grp, at, params, state, reason, ord)
          ORDER BY u.ord
         ON CONFLICT (workflow_run_id, node, node_round) WHERE workflow_run_id IS NOT NULL
         DO NOTHING
         RETURNING workflow_run_id, node, id, state",
    )
    .bind(nodes.iter().map(|n| n.workflow_run_id).collect::<Vec<_>>())
    .bind(col(|n| n.node.clone()))
    .bind(nodes.iter().map(|n| n.round).collect::<Vec<_>>())
    .bind(col(|n| n.job.clone()))
    .bind(col(|n| n.group.clone()))
    .bind(nodes.iter().map(|n| n.at).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.params.clone()).collect::<Vec<_>>())
    .bind(col(|n| n.state.to_owned()))
    .bind(nodes.iter().map(|n| n.reason.clone()).collect::<Vec<_>>())
    .bind(
        (0..nodes.len())
            .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
            .collect::<Vec<_>>(),
    )
    .bind(term)
    .persistent(false)
    .fetch_all(&mut **tx)
    .await
    .context("making node runs")?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get("workflow_run_id"),
                r.get("node"),
                r.get("id"),
                r.get("state"),
            )
        })
        .collect())
}

/// Writes the workflow runs' new states: started (running, with a deadline), timed out (a
/// cancel by `timeout`, which the cancel trigger passes on to the nodes), ended; and queues
/// again the runs in `again`. Returns the running node runs the timeouts stopped, as
/// (workflow run, node run).
async fn write_states(
    tx: &mut Tx<'_>,
    begun: &[(i64, Option<DateTime<Utc>>)],
    timeouts: &[(i64, String)],
    ends: &[(i64, &'static str, Option<String>)],
    again: &[i64],
) -> anyhow::Result<Vec<(i64, i64)>> {
    if !begun.is_empty() {
        sqlx::query(
            "UPDATE chime_runs r SET state = 'running', started_at = coalesce(r.started_at, now()),
                    deadline_at = u.deadline
               FROM unnest($1::bigint[], $2::timestamptz[]) AS u(id, deadline)
              WHERE r.id = u.id AND r.state = 'pending'",
        )
        .bind(begun.iter().map(|b| b.0).collect::<Vec<_>>())
        .bind(begun.iter().map(|b| b.1).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await
        .context("starting workflow runs")?;
    }
    if !timeouts.is_empty() {
        sqlx::query(
            "UPDATE chime_runs r SET cancel_requested_at = now(), cancel_requested_by = $3,
                    reason = u.reason
               FROM unnest($1::bigint[], $2::text[]) AS u(id, reason)
              WHERE r.id = u.id AND r.cancel_requested_at IS NULL",
        )
        .bind(timeouts.iter().map(|t| t.0).collect::<Vec<_>>())
        .bind(timeouts.iter().map(|t| t.1.clone()).collect::<Vec<_>>())
        .bind(TIMEOUT_ACTOR)
        .execute(&mut **tx)
        .await
        .context("stopping workflow runs past their timeout")?;
    }
    let timed_out: Vec<i64> = timeouts.iter().map(|t| t.0).collect();
    let stopped: Vec<(i64, i64)> = if timed_out.is_empty() {
        Vec::new()
    } else {
        sqlx::query_as(
            "SELECT workflow_run_id, id FROM chime_runs
              WHERE workflow_run_id = ANY ($1) AND state = 'running' ORDER BY id",
        )
        .bind(&timed_out)
        .fetch_all(&mut **tx)
        .await
        .context("reading the running nodes of timed-out workflow runs")?
    };
    if !ends.is_empty() {
        sqlx::query(
            "UPDATE chime_runs r SET state = u.state, reason = coalesce(u.reason, r.reason),
                    finished_at = now(), deadline_at = NULL
               FROM unnest($1::bigint[], $2::text[], $3::text[]) AS u(id, state, reason)
              WHERE r.id = u.id AND r.state IN ('pending', 'running')",
        )
        .bind(ends.iter().map(|e| e.0).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.1.to_owned()).collect::<Vec<_>>())
        .bind(ends.iter().map(|e| e.2.clone()).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await
        .context("ending workflow runs")?;
    }
    let ended: Vec<i64> = ends.iter().map(|e| e.0).collect();
    let again: Vec<i64> = again
        .iter()
        .copied()
        .filter(|id| !ended.contains(id))
        .collect();
    if !again.is_empty() {
        sqlx::query(
            "INSERT INTO chime_workflow_advances (run_id) SELECT unnest($1::bigint[])
             ON CONFLICT DO NOTHING",
        )
        .bind(&again)
        .execute(&mut **tx)
        .await
        .context("queueing workflow runs again")?;
        sqlx::query("SELECT pg_notify('chime_outbox', 'advance more')")
            .execute(&mut **tx)
            .await?;
    }
    Ok(stopped)
}

/// A node as operators see it: its name, job, edges, failure policy and layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeShape {
    /// The node's name.
    pub name: String,
    /// Its job.
    pub job: String,
    /// The nodes it comes after, with each edge's condition.
    pub after: Vec<EdgeView>,
    /// Its failure policy.
    pub on_failure: &'static str,
    /// Its layer in the drawing (0: after none).
    pub layer: usize,
}

impl NodeShape {
    /// The shapes of `nodes`, in their order.
    pub fn of(nodes: &[Node]) -> Vec<NodeShape> {
        let layer = workflow::layer_of(nodes);
        nodes
            .iter()
            .zip(layer)
            .map(|(n, layer)| NodeShape {
                name: n.name.clone(),
                job: n.job.clone(),
                after: n
                    .after
                    .iter()
                    .map(|e| EdgeView {
                        node: e.node.clone(),
                        when: e.when.as_str(),
                    })
                    .collect(),
                on_failure: n.on_failure.as_str(),
                layer,
            })
            .collect()
    }
}

/// A node of a workflow run as operators see it: its definition and its current run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    /// What it is.
    #[serde(flatten)]
    pub shape: NodeShape,
    /// Its run in the current round, if made: id, state, reason, attempt, times.
    pub run: Option<NodeRunView>,
    /// How many earlier rounds' runs it has (reruns).
    pub earlier_runs: usize,
}

/// An edge as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EdgeView {
    /// The upstream node.
    pub node: String,
    /// `success`, `failure` or `always`.
    pub when: &'static str,
}

/// A node's run as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRunView {
    /// Run id.
    pub id: i64,
    /// Its state.
    pub state: String,
    /// Why it is in that state (skipped, failed without running).
    pub reason: Option<String>,
    /// Its round.
    pub round: i32,
    /// Its attempts so far.
    pub attempt: i32,
    /// When its handler started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
}

/// A workflow run as operators see it (`GET /api/workflows/runs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowRunView {
    /// The workflow run's id (a run of the workflow job).
    pub id: i64,
    /// The workflow.
    pub workflow: String,
    /// Its state.
    pub state: String,
    /// Why it ended so.
    pub reason: Option<String>,
    /// Its trigger.
    pub trigger: String,
    /// Its params.
    pub params: Value,
    /// Its scheduled instant.
    pub scheduled_at: DateTime<Utc>,
    /// When it started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// When it times out, while running.
    pub deadline_at: Option<DateTime<Utc>>,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// Its current round (0, one more per rerun).
    pub round: i32,
    /// Its nodes, in the definition's order.
    pub nodes: Vec<NodeView>,
}

/// The outcome of a rerun request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rerun {
    /// Rerun: the new round and the nodes it reruns.
    Done {
        /// The round.
        round: i32,
        /// The nodes.
        nodes: Vec<String>,
    },
    /// No such workflow run.
    NotFound,
    /// Not a node of its workflow (the names it has).
    NoSuchNode(Vec<String>),
    /// Still running.
    Running,
}

impl Store {
    /// A workflow run with its nodes' current runs, if `id` is a workflow run.
    pub async fn workflow_run(&self, id: i64) -> anyhow::Result<Option<WorkflowRunView>> {
        let Some(r) = sqlx::query(
            "SELECT r.id, r.job_name, r.state, r.reason, r.trigger, r.params, r.scheduled_at,
                    r.started_at, r.finished_at, r.deadline_at,
                    r.cancel_requested_at IS NOT NULL AS cancelling,
                    coalesce(v.spec, j.spec) AS spec,
                    (SELECT coalesce(max(w.round), 0) FROM chime_workflow_reruns w
                      WHERE w.run_id = r.id) AS round
               FROM chime_runs r
               LEFT JOIN chime_job_versions v ON v.job_name = r.job_name
                                             AND v.version = r.job_version
               LEFT JOIN chime_jobs j ON j.name = r.job_name
              WHERE r.id = $1 AND r.parent_id IS NULL AND r.workflow_run_id IS NULL",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .context("reading a workflow run")?
        else {
            return Ok(None);
        };
        let Some(JobSpec {
            kind: Kind::Workflow { nodes },
            ..
        }) = r
            .get::<Option<Value>, _>("spec")
            .and_then(|v| serde_json::from_value(v).ok())
        else {
            return Ok(None);
        };
        let rows = sqlx::query(
            "SELECT id, node, node_round, state, reason, attempt, started_at, finished_at
               FROM chime_runs WHERE workflow_run_id = $1 ORDER BY node_round DESC, id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .context("reading a workflow run's nodes")?;
        let mut runs: HashMap<String, Vec<NodeRunView>> = HashMap::new();
        for row in &rows {
            runs.entry(row.get("node")).or_default().push(NodeRunView {
                id: row.get("id"),
                state: row.get("state"),
                reason: row.get("reason"),
                round: row.get("node_round"),
                attempt: row.get("attempt"),
                started_at: row.get("started_at"),
                finished_at: row.get("finished_at"),
            });
        }
        let round: i32 = r.get("round");
        let mut since: HashMap<String, i32> = HashMap::new();
        for s in sqlx::query(
            "SELECT n.node, max(w.round) AS round FROM chime_workflow_reruns w
              CROSS JOIN LATERAL unnest(w.nodes) AS n(node) WHERE w.run_id = $1 GROUP BY n.node",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?
        {
            since.insert(s.get("node"), s.get("round"));
        }
        let views = NodeShape::of(&nodes)
            .into_iter()
            .map(|shape| {
                let mine = runs.remove(&shape.name).unwrap_or_default();
                let current_round = since.get(&shape.name).copied().unwrap_or(0);
                let (current, earlier): (Vec<_>, Vec<_>) =
                    mine.into_iter().partition(|run| run.round == current_round);
                NodeView {
                    shape,
                    run: current.into_iter().next(),
                    earlier_runs: earlier.len(),
                }
            })
            .collect();
        Ok(Some(WorkflowRunView {
            id,
            workflow: r.get("job_name"),
            state: r.get("state"),
            reason: r.get("reason"),
            trigger: r.get("trigger"),
            params: r.get("params"),
            scheduled_at: r.get("scheduled_at"),
            started_at: r.get("started_at"),
            finished_at: r.get("finished_at"),
            deadline_at: r.get("deadline_at"),
            cancel_requested: r.get("cancelling"),
            round,
            nodes: views,
        }))
    }

    /// Reruns node `node` of ended workflow run `id` and every node after it, in a new round:
    /// the run is `running` again (its timeout counting from now) and queued for its advance, which makes `node`'s run (its
    /// `after` nodes ended as before). `by` is recorded with the rerun.
    pub async fn rerun_workflow(&self, id: i64, node: &str, by: &str) -> anyhow::Result<Rerun> {
        let mut tx = self.pool.begin().await?;
        let Some(r) = sqlx::query(
            "SELECT r.state, coalesce(v.spec, j.spec) AS spec
               FROM chime_runs r
               LEFT JOIN chime_job_versions v ON v.job_name = r.job_name
                                             AND v.version = r.job_version
               LEFT JOIN chime_jobs j ON j.name = r.job_name
              WHERE r.id = $1 AND r.parent_id IS NULL AND r.workflow_run_id IS NULL
                FOR UPDATE OF r",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await
        .context("locking a workflow run to rerun")?
        else {
            return Ok(Rerun::NotFound);
        };
        let Some(JobSpec {
            kind: Kind::Workflow { nodes },
            timeout,
            ..
        }) = r
            .get::<Option<Value>, _>("spec")
            .and_then(|v| serde_json::from_value(v).ok())
        else {
            return Ok(Rerun::NotFound);
        };
        if !nodes.iter().any(|n| n.name == node) {
            return Ok(Rerun::NoSuchNode(
                nodes.iter().map(|n| n.name.clone()).collect(),
            ));
        }
        let state: String = r.get("state");
        if matches!(
            state.as_str(),
            "pending" | "queued" | "running" | "retrying"
        ) {
            return Ok(Rerun::Running);
        }
        let rerun = workflow::downstream_of(&nodes, node);
        let round: i32 = sqlx::query_scalar(
            "INSERT INTO chime_workflow_reruns (run_id, round, node, nodes, actor)
             SELECT $1, coalesce(max(round), 0) + 1, $2, $3, $4
               FROM chime_workflow_reruns WHERE run_id = $1
             RETURNING round",
        )
        .bind(id)
        .bind(node)
        .bind(&rerun)
        .bind(by)
        .fetch_one(&mut *tx)
        .await
        .context("recording a workflow rerun")?;
        sqlx::query(
            "UPDATE chime_runs SET state = 'running', finished_at = NULL, reason = NULL,
                    cancel_requested_at = NULL, cancel_requested_by = NULL, deadline_at = $2
              WHERE id = $1",
        )
        .bind(id)
        .bind(deadline(Utc::now(), timeout))
        .execute(&mut *tx)
        .await
        .context("reopening a workflow run")?;
        sqlx::query(
            "INSERT INTO chime_workflow_advances (run_id) VALUES ($1) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("SELECT pg_notify('chime_outbox', 'advance w' || $1::bigint)")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Rerun::Done {
            round,
            nodes: rerun,
        })
    }

    /// Every workflow job, by name.
    pub async fn workflow_jobs(&self) -> anyhow::Result<Vec<super::JobRecord>> {
        let rows = sqlx::query(
            "SELECT spec, source, paused, paused_by, coalesce(cursor_at, updated_at) AS cursor_at,
                    scheduled_runs, version FROM chime_jobs
              WHERE chime_job_kind(spec) = 'workflow' ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .context("loading workflows")?;
        rows.into_iter().map(super::job_record).collect()
    }

    /// The workflows whose nodes run one of `jobs`, as (workflow, job) pairs, at most 100: what
    /// a delete or a reload's removal leaves dangling.
    pub async fn workflows_naming(&self, jobs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_as(
            "SELECT DISTINCT j.name, n.node->>'job' AS job
               FROM chime_jobs j
              CROSS JOIN LATERAL jsonb_array_elements(j.spec->'nodes') AS n(node)
              WHERE chime_job_kind(j.spec) = 'workflow' AND n.node->>'job' = ANY ($1)
              ORDER BY j.name, job LIMIT 100",
        )
        .bind(jobs)
        .fetch_all(&self.pool)
        .await
        .context("finding the workflows whose nodes run these jobs")
    }

    /// The kinds of the stored jobs among `names`, by name (what an API workflow's nodes are
    /// checked against).
    pub async fn job_kinds(&self, names: &[String]) -> anyhow::Result<HashMap<String, KindName>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, chime_job_kind(spec) FROM chime_jobs WHERE name = ANY ($1)",
        )
        .bind(names)
        .fetch_all(&self.pool)
        .await
        .context("reading the kinds of jobs")?;
        Ok(rows
            .into_iter()
            .filter_map(|(name, kind)| KindName::parse(&kind).map(|k| (name, k)))
            .collect())
    }

    /// The running node runs of workflow run `id` (what a cancel asks workers to stop).
    pub async fn running_nodes(&self, id: i64) -> anyhow::Result<Vec<i64>> {
        sqlx::query_scalar(
            "SELECT id FROM chime_runs WHERE workflow_run_id = $1 AND state = 'running'
              ORDER BY id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .context("reading a workflow run's running nodes")
    }
}
