//! `chime check`: validates job files and shows what each job will do (its group, its kind
//! unless `single`, a workflow's nodes layer by layer, schedule and next fire times in its own
//! time zone), or every mistake found. Pure except for reading the
//! files: the current instant is passed in, so the output is reproducible.

use std::io::Write;
use std::path::PathBuf;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::config::{ConfigErrors, LoadedJob, expand_job_patterns, load_located_jobs};
use crate::job::{Kind, TaskFailurePolicy};

/// How many upcoming fires are listed per job.
pub const UPCOMING_FIRES: usize = 5;

/// Checks the job files (or patterns, see [`crate::config::expand_job_patterns`]) at `paths`
/// and writes a report to `out`: each job with its next [`UPCOMING_FIRES`] fire times after
/// `now`, or, if anything is wrong, every mistake, one per line. Returns whether all files are
/// valid; the caller exits non-zero when they are not. Errors only when `out` fails.
pub fn check(paths: &[PathBuf], now: DateTime<Utc>, out: &mut dyn Write) -> anyhow::Result<bool> {
    let loaded = expand_job_patterns(paths)
        .and_then(|files| load_located_jobs(&files).map(|jobs| (files.len(), jobs)));
    match loaded {
        Ok((files, jobs)) => {
            for job in &jobs {
                write_job(out, job, now)?;
                writeln!(out)?;
            }
            writeln!(
                out,
                "OK: {} in {}",
                plural(jobs.len(), "job"),
                plural(files, "file")
            )?;
            Ok(true)
        }
        Err(ConfigErrors(errors)) => {
            for error in &errors {
                writeln!(out, "{error}")?;
            }
            writeln!(out, "FAILED: {}", plural(errors.len(), "error"))?;
            Ok(false)
        }
    }
}

fn write_job(out: &mut dyn Write, job: &LoadedJob, now: DateTime<Utc>) -> std::io::Result<()> {
    let spec = &job.spec;
    if let Kind::Workflow { nodes } = &spec.kind {
        writeln!(out, "workflow {:?} ({})", spec.name, job.origin)?;
        writeln!(out, "  kind:       {}", spec.kind.describe())?;
        for (i, line) in crate::workflow::describe_dag(nodes).iter().enumerate() {
            let label = if i == 0 { "nodes:" } else { "" };
            writeln!(out, "  {label:<11} {line}")?;
        }
    } else {
        writeln!(out, "job {:?} ({})", spec.name, job.origin)?;
        writeln!(out, "  group:      {}", spec.group)?;
    }
    if !spec.kind.is_single() && !matches!(spec.kind, Kind::Workflow { .. }) {
        let failure = match spec.on_task_failure {
            TaskFailurePolicy::Fail => "a failed task fails the run",
            TaskFailurePolicy::Ignore => "a failed task is ignored (on_task_failure = \"ignore\")",
        };
        writeln!(out, "  kind:       {}; {failure}", spec.kind.describe())?;
    }
    if spec.paused {
        writeln!(
            out,
            "  paused:     yes; fires start once the job is resumed"
        )?;
    }
    for (field, jobs) in spec.children.lists() {
        if !jobs.is_empty() {
            writeln!(out, "  {:<11} {}", format!("{field}:"), jobs.join(", "))?;
        }
    }
    let timing = match spec.timing() {
        Ok(timing) => timing,
        // Loading validated the schedule; keep going rather than panic if that ever changes.
        Err(e) => return writeln!(out, "  schedule:   {e}"),
    };
    writeln!(out, "  schedule:   {}", timing.describe())?;
    if let Some(max) = spec.max_runs {
        writeln!(
            out,
            "  ends:       after {} (max_runs)",
            plural(max as usize, "fire")
        )?;
    }
    let fires = spec.upcoming(&timing, now, UPCOMING_FIRES, 0);
    if fires.is_empty() {
        return writeln!(
            out,
            "  next fires: none ({})",
            spec.why_no_fires(&timing, now, 0)
        );
    }
    for (i, fire) in fires.iter().enumerate() {
        let label = if i == 0 { "next fires:" } else { "" };
        let local = fire
            .with_timezone(&spec.timezone)
            .to_rfc3339_opts(SecondsFormat::AutoSi, false);
        writeln!(out, "  {label:<11} {local} {}", spec.timezone.name())?;
    }
    Ok(())
}

/// "1 job", "2 jobs".
fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    fn run(paths: &[PathBuf], now: &str) -> (bool, String) {
        let now = DateTime::parse_from_rfc3339(now).unwrap().to_utc();
        let mut out = Vec::new();
        let ok = check(paths, now, &mut out).unwrap();
        (ok, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_workflow_is_printed_with_its_nodes_layer_by_layer() {
        let path = fixture("workflow.toml");
        let (ok, out) = run(std::slice::from_ref(&path), "2026-03-26T12:00:00Z");
        assert!(ok, "{out}");
        let header = format!("workflow \"nightly-etl\" ({})", path.display());
        let workflow: Vec<&str> = out.lines().take(7).collect();
        assert_eq!(
            workflow,
            [
                header.as_str(),
                "  kind:       workflow: 3 nodes in 3 layers",
                "  nodes:      layer 0  extract  job extract-orders",
                "              layer 1  clean    job clean-orders    after extract  on_failure = \"continue\"",
                "              layer 2  load     job load-warehouse  after clean, extract (always)",
                "  schedule:   cron \"0 2 * * *\" (UTC)",
                "  next fires: 2026-03-27T02:00:00+00:00 UTC",
            ]
        );
        assert!(out.ends_with("OK: 4 jobs in 1 file\n"), "{out}");
    }

    #[test]
    fn good_file_lists_each_job_with_its_next_fires_in_its_zone() {
        let path = fixture("good.toml");
        let (ok, out) = run(std::slice::from_ref(&path), "2026-03-26T12:00:00Z");
        let file = path.display();
        // Berlin moves to summer time on 2026-03-29: the offset changes between fires.
        let want = format!(
            r#"job "close-unpaid-orders" ({file})
  group:      orders
  schedule:   cron "0 */2 * * * *" (Asia/Shanghai)
  next fires: 2026-03-26T20:02:00+08:00 Asia/Shanghai
              2026-03-26T20:04:00+08:00 Asia/Shanghai
              2026-03-26T20:06:00+08:00 Asia/Shanghai
              2026-03-26T20:08:00+08:00 Asia/Shanghai
              2026-03-26T20:10:00+08:00 Asia/Shanghai

job "weekday-report" ({file})
  group:      reports
  schedule:   cron "30 9 * * MON-FRI" (Europe/Berlin)
  next fires: 2026-03-27T09:30:00+01:00 Europe/Berlin
              2026-03-30T09:30:00+02:00 Europe/Berlin
              2026-03-31T09:30:00+02:00 Europe/Berlin
              2026-04-01T09:30:00+02:00 Europe/Berlin
              2026-04-02T09:30:00+02:00 Europe/Berlin

job "heartbeat" ({file})
  group:      ops
  schedule:   every 30s
  next fires: 2026-03-26T12:00:30+00:00 UTC
              2026-03-26T12:01:00+00:00 UTC
              2026-03-26T12:01:30+00:00 UTC
              2026-03-26T12:02:00+00:00 UTC
              2026-03-26T12:02:30+00:00 UTC

job "new-year-banner" ({file})
  group:      web
  paused:     yes; fires start once the job is resumed
  schedule:   at 2026-12-31T16:00:00Z
  next fires: 2026-12-31T16:00:00+00:00 UTC

job "rebuild-search-index" ({file})
  group:      search
  schedule:   manual
  next fires: none (manual only: runs when triggered)

OK: 5 jobs in 1 file
"#
        );
        assert_eq!(out, want);
        assert!(ok);
    }

    /// A job of another kind than `single` says what a fire runs; a `single` job has no line
    /// for it (`good_file_lists_each_job_with_its_next_fires_in_its_zone`).
    #[test]
    fn each_kind_says_what_a_fire_runs() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/job-kinds.toml");
        let (ok, out) = run(&[path], "2026-12-01T00:00:00Z");
        assert!(ok, "{out}");
        let kinds: Vec<&str> = out.lines().filter(|l| l.starts_with("  kind:")).collect();
        assert_eq!(
            kinds,
            [
                "  kind:       broadcast: one task per worker of the group online at the fire (at \
                 least 2); a failed task is ignored (on_task_failure = \"ignore\")",
                "  kind:       sharded: 4 shards, 4 with their own params; a failed task fails the run",
                "  kind:       sharded: one shard per worker of the group online at the fire, 1 with \
                 its own params; a failed task fails the run",
                "  kind:       map_reduce: ctx.map nests at most 2 deep; a failed task fails the run",
            ]
        );
        assert!(
            out.contains("  group:      examples\n  kind:       broadcast"),
            "the kind follows the group: {out}"
        );
    }

    #[test]
    fn child_lists_are_printed_after_the_group() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("jobs.toml");
        std::fs::write(
            &path,
            "[[jobs]]\nname = \"a\"\ngroup = \"g\"\non_success = [\"b\", \"c\"]\n\
             on_complete = [\"c\"]\n\n[[jobs]]\nname = \"b\"\ngroup = \"g\"\n\n\
             [[jobs]]\nname = \"c\"\ngroup = \"g\"\n",
        )
        .expect("written");
        let (ok, out) = run(&[path], "2026-12-01T00:00:00Z");
        assert!(ok, "{out}");
        assert!(
            out.contains(
                "  group:      g\n  on_success: b, c\n  on_complete: c\n  schedule:   manual"
            ),
            "{out}"
        );
    }

    #[test]
    fn a_one_shot_in_the_past_has_no_next_fire() {
        let (ok, out) = run(&[fixture("good.toml")], "2027-06-01T00:00:00Z");
        assert!(ok);
        assert!(
            out.contains(
                "  schedule:   at 2026-12-31T16:00:00Z\n  next fires: none (its one-shot instant has passed)\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn broken_file_prints_every_mistake_and_fails() {
        let path = fixture("broken.toml");
        let (ok, out) = run(std::slice::from_ref(&path), "2026-03-26T12:00:00Z");
        let file = path.display();
        let want = format!(
            r#"{file}: job "close-unpaid-orders": field "timezone" = "Europe/Berln": unknown time zone; use an IANA name such as "Europe/Berlin"
{file}: job "send-reminders": field "shedule" = "0 9 * * *": unknown field; did you mean "schedule"?
{file}: job #3: field "name": missing; every job needs a unique name, such as "close-unpaid-orders"
{file}: job "nightly-export": field "timeout" = "5 minutes please": invalid duration (expected a number at "please"); write a number with a unit, such as "30s", "5m" or "1h30m"
{file}: job "nightly-export": field "misfire" = "sometimes": unknown value; use "skip", "fire_once" or "fire_all"
{file}: job "close-unpaid-orders": field "name" = "close-unpaid-orders": duplicate job name, first defined in job #1 of this file; job names must be unique across all job files, so rename one of them
FAILED: 6 errors
"#
        );
        assert_eq!(out, want);
        assert!(!ok);
    }

    #[test]
    fn patterns_are_expanded() {
        let (ok, out) = run(&[fixture("jobs.d/*")], "2026-03-26T12:00:00Z");
        assert!(ok, "{out}");
        assert!(out.ends_with("OK: 2 jobs in 2 files\n"), "{out}");
    }
}
