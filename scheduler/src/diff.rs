//! `chime diff FILES…`: what loading these job files would change in the cluster, before it is
//! done. Compares each job of the files with the definition the cluster runs: added, removed
//! (a job from job files that no file declares any more), and changed with each changed field
//! (old and new values, secrets hidden) and the next fires before and after. Pure: the jobs the
//! cluster runs and the current instant are passed in; only [`run`], the command, reads the
//! files and the database.
//!
//! The comparison is the reload's own: a file job replaces the stored job of that name,
//! including one created through the API (which then becomes a job-file job), and job-file jobs
//! that no file declares are removed; API jobs are left alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::check::UPCOMING_FIRES;
use crate::config::{ConfigErrors, expand_job_patterns, load_job_files};
use crate::job::JobSpec;
use crate::secrets::redact_spec;
use crate::store::{JobRecord, Store};

/// How a job would change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// The files declare a job the cluster does not have.
    Added,
    /// The cluster has a job from job files that no file declares any more.
    Removed,
    /// The files declare the job differently.
    Changed,
}

/// One field whose value differs, in the stored (job-file) form; nested tables by dotted keys
/// (`retry.initial`). `None`: the field is not set on that side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldChange {
    /// The field, as job files name it.
    pub field: String,
    /// What the cluster has.
    pub before: Option<Value>,
    /// What the files say.
    pub after: Option<Value>,
}

impl std::fmt::Display for FieldChange {
    /// `field: before -> after`, `(not set)` for a side without it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = |v: &Option<Value>| v.as_ref().map_or("(not set)".to_owned(), Value::to_string);
        write!(
            f,
            "{}: {} -> {}",
            self.field,
            value(&self.before),
            value(&self.after)
        )
    }
}

/// One job that would change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobChange {
    /// The job.
    pub name: String,
    /// How.
    pub change: Change,
    /// The fields that differ (for a changed job; an API job taken over shows `source`).
    pub fields: Vec<FieldChange>,
    /// The next fires as the cluster runs the job now (none for an added job).
    pub fires_before: Vec<DateTime<Utc>>,
    /// The next fires once the files are loaded (none for a removed job).
    pub fires_after: Vec<DateTime<Utc>>,
}

/// Exit code of `chime diff` when loading the files would change something (0: nothing, 1:
/// the files have mistakes or the cluster cannot be read), as `diff` and `terraform plan
/// -detailed-exitcode` do, so CI can tell the three apart.
pub const CHANGES_EXIT: u8 = 2;

/// `chime diff FILES…`: loads the job files (patterns as `chime check` takes them), reads the
/// jobs of the cluster at `store`, and writes the changes for people, or as JSON when `json`.
/// Mistakes in the files are written like `chime check` writes them.
pub async fn run(
    store: &Store,
    paths: &[PathBuf],
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let loaded = expand_job_patterns(paths).and_then(|files| load_job_files(&files));
    let files = match loaded {
        Ok(files) => files,
        Err(ConfigErrors(errors)) => {
            for error in &errors {
                writeln!(out, "{error}")?;
            }
            writeln!(out, "FAILED: {} errors", errors.len())?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let stored = store.jobs().await?;
    let changes = diff(&files, &stored, Utc::now());
    let declared: HashSet<&str> = files.iter().map(|s| s.name.as_str()).collect();
    let unchanged = declared.len()
        - changes
            .iter()
            .filter(|c| c.change != Change::Removed)
            .count();
    if json {
        let report = serde_json::json!({"changes": changes, "unchanged": unchanged});
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        render(&changes, unchanged, out)?;
    }
    Ok(if changes.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(CHANGES_EXIT)
    })
}

/// The changes loading `files` (the jobs of the job files, validated) would make to `stored`
/// (every job the cluster has), in name order; empty when loading them changes nothing.
pub fn diff(files: &[JobSpec], stored: &[JobRecord], now: DateTime<Utc>) -> Vec<JobChange> {
    // A later definition of a name wins, as in a reload.
    let declared: BTreeMap<&str, &JobSpec> = files.iter().map(|s| (s.name.as_str(), s)).collect();
    let stored_by_name: HashMap<&str, &JobRecord> =
        stored.iter().map(|r| (r.spec.name.as_str(), r)).collect();
    let mut changes = Vec::new();
    for (name, spec) in &declared {
        let fires_after = fires(spec, now, 0);
        match stored_by_name.get(name) {
            None => changes.push(JobChange {
                name: (*name).to_owned(),
                change: Change::Added,
                fields: Vec::new(),
                fires_before: Vec::new(),
                fires_after,
            }),
            Some(record) => {
                let mut fields = field_changes(&record.spec, spec);
                if record.source != "config" {
                    fields.insert(
                        0,
                        FieldChange {
                            field: "source".into(),
                            before: Some(Value::String(record.source.clone())),
                            after: Some(Value::String("config".into())),
                        },
                    );
                }
                if fields.is_empty() {
                    continue;
                }
                changes.push(JobChange {
                    name: (*name).to_owned(),
                    change: Change::Changed,
                    fields,
                    fires_before: fires(&record.spec, now, record.scheduled_runs),
                    // The count of fires made stays with the job.
                    fires_after: fires(spec, now, record.scheduled_runs),
                });
            }
        }
    }
    for record in stored {
        if record.source == "config" && !declared.contains_key(record.spec.name.as_str()) {
            changes.push(JobChange {
                name: record.spec.name.clone(),
                change: Change::Removed,
                fields: Vec::new(),
                fires_before: fires(&record.spec, now, record.scheduled_runs),
                fires_after: Vec::new(),
            });
        }
    }
    changes.sort_by(|a, b| a.name.cmp(&b.name));
    changes
}

/// The next fires of `spec` after `now`, its schedule having made `made` fires.
fn fires(spec: &JobSpec, now: DateTime<Utc>, made: i64) -> Vec<DateTime<Utc>> {
    spec.timing()
        .map(|timing| spec.upcoming(&timing, now, UPCOMING_FIRES, made))
        .unwrap_or_default()
}

/// The fields of the stored forms of `before` and `after` that differ, secrets hidden.
pub fn field_changes(before: &JobSpec, after: &JobSpec) -> Vec<FieldChange> {
    let flat = |spec: &JobSpec| {
        let mut fields = BTreeMap::new();
        if let Ok(Value::Object(form)) = serde_json::to_value(redact_spec(spec)) {
            flatten("", form, &mut fields);
        }
        fields
    };
    let (old, new) = (flat(before), flat(after));
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|key| old.get(*key) != new.get(*key))
        .map(|key| FieldChange {
            field: key.clone(),
            before: old.get(key).cloned(),
            after: new.get(key).cloned(),
        })
        .collect()
}

/// Tables as dotted keys (`retry.initial`), except the handler's `params` and `shard_params`,
/// which are compared whole.
fn flatten(prefix: &str, form: serde_json::Map<String, Value>, out: &mut BTreeMap<String, Value>) {
    for (key, value) in form {
        let field = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            Value::Null => {}
            Value::Object(table) if !matches!(key.as_str(), "params" | "shard_params") => {
                flatten(&field, table, out);
            }
            value => {
                out.insert(field, value);
            }
        }
    }
}

/// Writes `changes` for people: one block per job, then a summary line.
pub fn render(changes: &[JobChange], unchanged: usize, out: &mut dyn Write) -> std::io::Result<()> {
    let instant = |t: &DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    let list = |fires: &[DateTime<Utc>]| {
        if fires.is_empty() {
            "none".to_owned()
        } else {
            fires.iter().map(instant).collect::<Vec<_>>().join(", ")
        }
    };
    for change in changes {
        match change.change {
            Change::Added => {
                writeln!(out, "+ job {:?} (added)", change.name)?;
                writeln!(out, "    next fires:        {}", list(&change.fires_after))?;
            }
            Change::Removed => {
                writeln!(out, "- job {:?} (removed)", change.name)?;
                writeln!(out, "    next fires were:   {}", list(&change.fires_before))?;
            }
            Change::Changed => {
                writeln!(out, "~ job {:?} (changed)", change.name)?;
                for field in &change.fields {
                    writeln!(out, "    {field}")?;
                }
                if change.fires_before != change.fires_after {
                    writeln!(out, "    next fires before: {}", list(&change.fires_before))?;
                    writeln!(out, "    next fires after:  {}", list(&change.fires_after))?;
                }
            }
        }
    }
    let count = |kind: Change| changes.iter().filter(|c| c.change == kind).count();
    if changes.is_empty() {
        writeln!(out, "No changes: {unchanged} jobs as the cluster runs them")
    } else {
        writeln!(
            out,
            "{} added, {} changed, {} removed; {unchanged} unchanged",
            count(Change::Added),
            count(Change::Changed),
            count(Change::Removed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate_job;
    use serde_json::json;

    fn spec(definition: Value) -> JobSpec {
        validate_job(definition.as_object().unwrap()).unwrap()
    }

    fn record(spec: JobSpec, source: &str, made: i64) -> JobRecord {
        JobRecord {
            spec,
            source: source.into(),
            paused: false,
            paused_by: None,
            cursor_at: None,
            scheduled_runs: made,
            version: 1,
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-02T10:00:30Z")
            .unwrap()
            .to_utc()
    }

    #[test]
    fn added_removed_and_changed_jobs_with_their_fields_and_fires() {
        let stored = vec![
            record(
                spec(json!({"name": "same", "group": "g", "every": "1m"})),
                "config",
                0,
            ),
            record(
                spec(
                    json!({"name": "moved", "group": "g", "schedule": "0 9 * * *",
                            "retry": {"max_attempts": 3}, "params": {"token": "s3cret", "n": 1}}),
                ),
                "config",
                0,
            ),
            record(
                spec(json!({"name": "gone", "group": "g", "every": "1h"})),
                "config",
                0,
            ),
            record(
                spec(json!({"name": "api-only", "group": "g", "every": "1h"})),
                "api",
                0,
            ),
            record(
                spec(json!({"name": "taken", "group": "g", "every": "1h"})),
                "api",
                0,
            ),
        ];
        let files = vec![
            spec(json!({"name": "same", "group": "g", "every": "1m"})),
            spec(
                json!({"name": "moved", "group": "g", "schedule": "0 10 * * *",
                        "retry": {"max_attempts": 5}, "params": {"token": "other", "n": 1}}),
            ),
            spec(json!({"name": "new", "group": "g", "every": "30s"})),
            spec(json!({"name": "taken", "group": "g", "every": "1h"})),
        ];
        let changes = diff(&files, &stored, now());
        let names: Vec<(&str, Change)> = changes
            .iter()
            .map(|c| (c.name.as_str(), c.change))
            .collect();
        assert_eq!(
            names,
            [
                ("gone", Change::Removed),
                ("moved", Change::Changed),
                ("new", Change::Added),
                ("taken", Change::Changed),
            ]
        );
        let moved = &changes[1];
        let fields: Vec<(&str, Option<Value>, Option<Value>)> = moved
            .fields
            .iter()
            .map(|f| (f.field.as_str(), f.before.clone(), f.after.clone()))
            .collect();
        // The secret param differs but is hidden on both sides, so it shows as no change.
        assert_eq!(
            fields,
            [
                ("retry.max_attempts", Some(json!(3)), Some(json!(5))),
                (
                    "schedule",
                    Some(json!("0 9 * * *")),
                    Some(json!("0 10 * * *"))
                ),
            ]
        );
        assert_eq!(
            moved.fires_before[0].to_rfc3339(),
            "2026-12-03T09:00:00+00:00"
        );
        assert_eq!(
            moved.fires_after[0].to_rfc3339(),
            "2026-12-03T10:00:00+00:00"
        );
        assert_eq!(changes[2].fires_after.len(), UPCOMING_FIRES);
        assert_eq!(changes[3].fields[0].field, "source");
        assert_eq!(changes[0].fires_after, Vec::<DateTime<Utc>>::new());

        let mut text = Vec::new();
        render(&changes, 1, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("~ job \"moved\" (changed)\n    retry.max_attempts: 3 -> 5\n    schedule: \"0 9 * * *\" -> \"0 10 * * *\"\n"), "{text}");
        assert!(text.contains("- job \"gone\" (removed)"), "{text}");
        assert!(
            text.contains("+ job \"new\" (added)\n    next fires:        2026-12-02T10:01:00Z"),
            "{text}"
        );
        assert!(
            text.ends_with("1 added, 2 changed, 1 removed; 1 unchanged\n"),
            "{text}"
        );
        assert!(
            !text.contains("s3cret") && !text.contains("other"),
            "{text}"
        );
    }

    #[test]
    fn the_same_files_change_nothing() {
        let jobs = vec![
            spec(json!({"name": "a", "group": "g", "every": "1m", "jitter": "10s"})),
            spec(json!({"name": "b", "group": "g", "schedule": "0 0 0 L * ?"})),
        ];
        let stored: Vec<JobRecord> = jobs
            .iter()
            .map(|s| record(s.clone(), "config", 0))
            .collect();
        assert!(diff(&jobs, &stored, now()).is_empty());
        let mut text = Vec::new();
        render(&[], 2, &mut text).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "No changes: 2 jobs as the cluster runs them\n"
        );
    }
}
