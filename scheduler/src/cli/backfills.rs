//! `chime jobs backfill` (start one, or `--dry-run` to see what it would do) and `chime
//! backfills list|show|cancel`, through [`Operations`] like every runtime command.

use std::io::Write;

use super::{BackfillsCommand, Output, io, json_line, json_out, render, time};
use crate::auth::Caller;
use crate::ops::{BackfillListQuery, BackfillRequest, Operations, OpsResult};
use crate::store::BackfillRecord;

/// `chime jobs backfill NAME --from … --to … [--parallel N | --serial] [--rate N] [--dry-run]`.
pub(super) async fn start(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    name: &str,
    request: &BackfillRequest,
    out: &mut dyn Write,
) -> OpsResult<()> {
    if request.dry_run {
        let preview = ops.preview_backfill(caller, name, request).await?;
        if output == Output::Json {
            return json_out(out, &preview);
        }
        writeln!(
            out,
            "backfill of {name} from {} to {} ({}): {} fires, {} with a run already, {} to make; \
             {} at once, {} per second at most (dry run: nothing was changed)",
            time(Some(preview.from)),
            time(Some(preview.to)),
            preview.schedule,
            preview.fires_total,
            preview.fires_existing,
            preview.fires_to_make,
            preview.parallel,
            preview.rate,
        )
        .map_err(io)?;
        return render(output, out, &preview, |t| {
            t.set_header(["FIRE", "LOCAL", "RUN"]);
            for fire in &preview.fires {
                let run = fire.run.as_ref().map_or_else(
                    || "to make".to_owned(),
                    |r| format!("run {} ({}, {})", r.id, r.state, r.trigger),
                );
                t.add_row([time(Some(fire.at)), fire.at_local.clone(), run]);
            }
            if preview.fires_total > preview.fires.len() {
                t.add_row([
                    format!("… {} more", preview.fires_total - preview.fires.len()),
                    String::new(),
                    String::new(),
                ]);
            }
        });
    }
    let started = ops.start_backfill(caller, name, request).await?;
    match output {
        Output::Json => json_line(out, &started)?,
        Output::Table => writeln!(
            out,
            "backfill {} of {name}: {} fires from {} to {}, {} at once; follow it with `chime \
             backfills show {}`",
            started.backfill.id,
            started.backfill.fires_total,
            time(Some(started.backfill.from)),
            time(Some(started.backfill.to)),
            started.backfill.parallel,
            started.backfill.id,
        )
        .map_err(io)?,
    }
    for warning in &started.warnings {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// `chime backfills …`.
pub(super) async fn backfills(
    ops: &Operations,
    caller: &Caller,
    output: Output,
    command: BackfillsCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    match command {
        BackfillsCommand::List { job, state, limit } => {
            let page = ops
                .backfills(
                    caller,
                    BackfillListQuery {
                        job,
                        state,
                        before: None,
                        limit: Some(limit),
                    },
                )
                .await?;
            render(output, out, &page.backfills, |t| {
                t.set_header(["ID", "JOB", "FROM", "TO", "STATE", "PROGRESS", "BY"]);
                for b in &page.backfills {
                    t.add_row([
                        b.id.to_string(),
                        b.job.clone(),
                        time(Some(b.from)),
                        time(Some(b.to)),
                        b.state.clone(),
                        b.progress.clone(),
                        b.requested_by.clone(),
                    ]);
                }
            })
        }
        BackfillsCommand::Show { id } => {
            let backfill = ops.backfill(caller, id).await?;
            if output == Output::Json {
                return json_out(out, &backfill);
            }
            show(&backfill, out).map_err(io)
        }
        BackfillsCommand::Cancel { id } => {
            let cancelled = ops.cancel_backfill(caller, id).await?;
            if output == Output::Json {
                return json_line(out, &cancelled);
            }
            writeln!(
                out,
                "cancelled backfill {id} of {}: {} waiting runs cancelled, {} running asked to \
                 stop",
                cancelled.job,
                cancelled.runs_cancelled,
                cancelled.cancel_requested.len()
            )
            .map_err(io)
        }
    }
}

fn show(b: &BackfillRecord, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "backfill {} of {}", b.id, b.job)?;
    writeln!(
        out,
        "  range:      {} to {}",
        time(Some(b.from)),
        time(Some(b.to))
    )?;
    writeln!(out, "  state:      {}", b.state)?;
    writeln!(out, "  progress:   {}", b.progress)?;
    writeln!(
        out,
        "  limits:     {} at once, {} per second",
        b.parallel, b.rate
    )?;
    if let Some(cursor) = b.cursor_at {
        writeln!(out, "  handled to: {}", time(Some(cursor)))?;
    }
    writeln!(
        out,
        "  requested:  {} by {}",
        time(Some(b.created_at)),
        b.requested_by
    )?;
    if let Some(at) = b.finished_at {
        writeln!(out, "  ended:      {}", time(Some(at)))?;
    }
    if let Some(reason) = &b.reason {
        writeln!(out, "  reason:     {reason}")?;
    }
    writeln!(
        out,
        "  its runs:   chime runs list --backfill {} (or GET /api/runs?backfill={})",
        b.id, b.id
    )
}
