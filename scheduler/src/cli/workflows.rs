//! `chime workflows list|show|runs|run|rerun|cancel` (docs/workflows.md), through
//! [`Operations`] like every runtime command. A workflow's runs and a cancel are the runs'
//! commands on the workflow's job, once the name or id is known to be a workflow's.

use std::io::Write;

use super::{Output, RunsCommand, WorkflowsCommand, io, json_line, json_out, render, time};
use crate::auth::Caller;
use crate::ops::{Operations, OpsResult};
use crate::store::WorkflowRunView;

/// `chime workflows …`.
pub(super) async fn workflows(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: WorkflowsCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        WorkflowsCommand::List => {
            let list = ops.workflows(caller).await?;
            render(output, out, &list, |t| {
                t.set_header(["NAME", "NODES", "LAYERS", "SCHEDULE", "PAUSED"]);
                for w in &list {
                    t.add_row([
                        w.name.clone(),
                        w.nodes.to_string(),
                        w.layers.to_string(),
                        w.schedule.clone(),
                        if w.paused { "yes" } else { "" }.to_owned(),
                    ]);
                }
            })
        }
        WorkflowsCommand::Show { name } => {
            let workflow = ops.workflow(caller, &name).await?;
            if output == Output::Json {
                return json_out(out, &workflow);
            }
            writeln!(
                out,
                "workflow {}: {} nodes in {} layers; {}{}",
                workflow.summary.name,
                workflow.summary.nodes,
                workflow.summary.layers,
                workflow.summary.schedule,
                if workflow.summary.paused {
                    " (paused)"
                } else {
                    ""
                }
            )
            .map_err(io)?;
            for line in &workflow.dag {
                writeln!(out, "  {line}").map_err(io)?;
            }
            Ok(())
        }
        WorkflowsCommand::Runs { name, state, limit } => {
            ops.workflow(caller, &name).await?;
            let list = RunsCommand::List {
                job: Some(name),
                state,
                limit,
                tasks: false,
                backfill: None,
            };
            super::runs(ops, caller, output, list, out).await
        }
        WorkflowsCommand::Run { id } => {
            let run = ops.workflow_run(caller, id).await?;
            if output == Output::Json {
                return json_out(out, &run);
            }
            show_run(&run, out).map_err(io)
        }
        WorkflowsCommand::Rerun { id, node } => {
            let reran = ops.rerun_workflow(caller, id, &node).await?;
            if output == Output::Json {
                return json_line(out, &reran);
            }
            writeln!(
                out,
                "workflow run {id} reruns from {node} in round {}: {}; follow it with `chime \
                 workflows run {id}`",
                reran.round,
                reran.nodes.join(", ")
            )
            .map_err(io)
        }
        WorkflowsCommand::Cancel { id } => {
            ops.workflow_run(caller, id).await?;
            super::runs(ops, caller, output, RunsCommand::Cancel { id }, out).await
        }
    }
}

/// A workflow run: its state, then one line per node, layer by layer, with its run.
fn show_run(run: &WorkflowRunView, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "workflow run {} of {}: {}{} (trigger {}, scheduled {}, round {})",
        run.id,
        run.workflow,
        run.state,
        run.reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default(),
        run.trigger,
        time(Some(run.scheduled_at)),
        run.round
    )?;
    if run.cancel_requested && run.finished_at.is_none() {
        writeln!(
            out,
            "  cancel requested: waiting for its running nodes to end"
        )?;
    }
    let mut nodes: Vec<_> = run.nodes.iter().collect();
    nodes.sort_by_key(|n| n.shape.layer);
    let width = nodes.iter().map(|n| n.shape.name.len()).max().unwrap_or(0);
    for node in nodes {
        let state = match &node.run {
            None => "waiting".to_owned(),
            Some(r) => {
                let mut text = format!("{} (run {}", r.state, r.id);
                if r.round > 0 {
                    text.push_str(&format!(", round {}", r.round));
                }
                text.push(')');
                if let Some(reason) = &r.reason {
                    text.push_str(&format!(": {reason}"));
                }
                text
            }
        };
        writeln!(
            out,
            "  layer {}  {:<width$}  {}",
            node.shape.layer, node.shape.name, state
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone as _, Utc};
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::store::{NodeRunView, NodeShape, NodeView};

    fn node(name: &str, layer: usize, run: Option<(i64, &str, i32, Option<&str>)>) -> NodeView {
        NodeView {
            shape: NodeShape {
                name: name.into(),
                job: format!("{name}-job"),
                after: Vec::new(),
                on_failure: "fail_workflow",
                layer,
            },
            run: run.map(|(id, state, round, reason)| NodeRunView {
                id,
                state: state.into(),
                reason: reason.map(str::to_owned),
                round,
                attempt: 1,
                started_at: None,
                finished_at: None,
            }),
            earlier_runs: 0,
        }
    }

    #[test]
    fn a_workflow_run_reads_node_by_node_in_layer_order() {
        let run = WorkflowRunView {
            id: 7,
            workflow: "etl".into(),
            state: "running".into(),
            reason: None,
            trigger: "schedule".into(),
            params: serde_json::Value::Null,
            scheduled_at: Utc.with_ymd_and_hms(2026, 12, 4, 2, 0, 0).unwrap(),
            started_at: None,
            finished_at: None,
            deadline_at: None,
            cancel_requested: false,
            round: 1,
            nodes: vec![
                node("load", 2, None),
                node("extract", 0, Some((8, "succeeded", 0, None))),
                node("clean", 1, Some((12, "running", 1, None))),
                node("alert", 2, Some((9, "skipped", 0, Some("edge not met")))),
            ],
        };
        let mut out = Vec::new();
        show_run(&run, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("workflow run 7 of etl: running (trigger schedule"),
            "{text}"
        );
        assert_eq!(
            &lines[1..],
            [
                "  layer 0  extract  succeeded (run 8)",
                "  layer 1  clean    running (run 12, round 1)",
                "  layer 2  load     waiting",
                "  layer 2  alert    skipped (run 9): edge not met",
            ]
        );
    }

    #[test]
    fn the_commands_parse() {
        let cli = Cli::try_parse_from(["chime", "workflows", "rerun", "7", "--node", "clean"])
            .expect("it parses");
        assert!(matches!(
            cli.command,
            Command::Workflows(WorkflowsCommand::Rerun { id: 7, ref node }) if node == "clean"
        ));
        assert!(Cli::try_parse_from(["chime", "workflows", "rerun", "7"]).is_err());
    }
}
