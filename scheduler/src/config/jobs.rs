//! Job files: TOML or YAML holding a top-level `jobs` list, validated field by field into
//! [`JobSpec`]s, with every mistake of every file reported, not just the first.
//!
//! `config` parses the file into a generic value tree; each job table is then converted to JSON
//! (the form a [`JobSpec`] is stored and sent in) and checked by [`validate_job`], which knows
//! nothing about files, so the runtime API can give the same messages for a job sent as JSON.
//! A TOML file is parsed one `[[jobs]]` table at a time where it splits cleanly at those header
//! lines (a 100,000-job file's whole tree took several hundred MB), and whole otherwise.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chime_protocol::limits::{
    MAX_ATTEMPTS, MAX_CATCHUP, MAX_CHILD_JOBS, MAX_DESCRIPTION_BYTES, MAX_EVERY, MAX_JITTER,
    MAX_LOOKBACK, MAX_MAP_DEPTH, MAX_MULTIPLIER, MAX_NAME_BYTES, MAX_NESTING, MAX_PARAMS_BYTES,
    MAX_RETENTION, MAX_RETRY_DELAY, MAX_RUNS, MAX_SHARDS, MAX_TIMEOUT, MAX_WORKERS_PER_GROUP,
};
use chrono::{DateTime, Datelike as _, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use serde_json::{Map, Value};

use super::calendars;
use super::suggest::closest;
use super::{ConfigError, ConfigErrors, FieldError, JobRef, render, render_config, to_json};
use crate::job::{
    CalendarMode, ChildJobs, JobSpec, Kind, KindName, Shards, TaskFailurePolicy, When,
};
use crate::schedule::{OnExcluded, Schedule, ScheduleError};

/// Every field a job table may have, in the order messages and docs list them. A test keeps
/// this in step with [`JobSpec`]'s serde form.
pub const JOB_FIELDS: &[&str] = &[
    "name",
    "group",
    "kind",
    "shards",
    "shard_params",
    "min_workers",
    "map_depth",
    "nodes",
    "on_task_failure",
    "schedule",
    "every",
    "at",
    "timezone",
    "jitter",
    "start_at",
    "end_at",
    "max_runs",
    "calendar",
    "calendar_mode",
    "on_excluded",
    "params",
    "secret_params",
    "timeout",
    "misfire",
    "misfire_grace",
    "catchup_window",
    "max_catchup",
    "concurrency",
    "retry",
    "on_success",
    "on_failure",
    "on_complete",
    "alerts",
    "retention",
    "paused",
    "description",
];

/// Fields of the `retry` table.
const RETRY_FIELDS: &[&str] = &["max_attempts", "initial", "multiplier", "max", "jitter"];
/// Fields of the `alerts` table.
const ALERT_FIELDS: &[&str] = &["webhook", "format"];
/// Allowed values of an alert `format`.
pub(super) const ALERT_FORMATS: &[&str] = &["generic", "slack"];

/// Allowed values of `misfire`, as `MisfirePolicy` spells them.
const MISFIRE_VALUES: &[&str] = &["skip", "fire_once", "fire_all"];
/// Allowed values of `kind`.
const KIND_VALUES: &[&str] = Kind::NAMES;
/// Allowed values of `on_task_failure`.
const TASK_FAILURE_VALUES: &[&str] = TaskFailurePolicy::NAMES;
/// Allowed values of `concurrency`, as `ConcurrencyPolicy` spells them.
const CONCURRENCY_VALUES: &[&str] = &["allow", "forbid", "queue", "replace"];
/// Longest job or group name: group names become part of RabbitMQ queue names (255 bytes at
/// most) next to a prefix and a suffix, and short names read well in the dashboard. Names are
/// ASCII, so characters and bytes agree.
const MAX_IDENTIFIER_LEN: usize = MAX_NAME_BYTES;
/// Most entries of `secret_params`.
pub const MAX_SECRET_PARAMS: usize = 100;

/// The syntax of a settings or job file, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    /// `.toml`
    Toml,
    /// `.yaml` or `.yml`
    Yaml,
}

impl SourceFormat {
    /// The format a file's extension names, or `None` for any other extension.
    pub fn from_path(path: &Path) -> Option<SourceFormat> {
        match path.extension()?.to_str()? {
            "toml" => Some(SourceFormat::Toml),
            "yaml" | "yml" => Some(SourceFormat::Yaml),
            _ => None,
        }
    }

    /// Parses `text` into `config`'s value tree; a syntax error becomes one line.
    pub(super) fn parse(
        self,
        origin: &str,
        text: &str,
    ) -> Result<config::Map<String, config::Value>, ConfigError> {
        use config::Format;
        let uri = origin.to_owned();
        match self {
            SourceFormat::Toml => config::FileFormat::Toml
                .parse(Some(&uri), text)
                .map_err(|e| {
                    ConfigError::at(
                        origin,
                        format!("not valid TOML: {}", one_line(&e.to_string())),
                    )
                }),
            SourceFormat::Yaml => {
                if let Some(problem) = yaml_hazard(text) {
                    return Err(ConfigError::at(origin, problem));
                }
                config::FileFormat::Yaml
                    .parse(Some(&uri), text)
                    .map_err(|e| {
                        let mut message = format!("not valid YAML: {}", one_line(&e.to_string()));
                        // Cron expressions start with `*` or `@`, which YAML reserves for aliases and
                        // future use: the most common YAML mistake in a job file.
                        if message.contains("alias")
                            || message.contains("anchor")
                            || message.contains("cannot start any token")
                        {
                            message.push_str(
                                "; quote values that start with \"*\", \"@\", \"&\" or \"!\", \
                             such as schedule: \"*/5 * * * *\"",
                            );
                        }
                        ConfigError::at(origin, message)
                    })
            }
        }
    }
}

/// Why a YAML text must not reach the full parser, or `None`. The full parser expands every alias
/// into a copy of its anchor (a 412-byte file of nested aliases grew to gigabytes, the "billion
/// laughs"), and the conversion into `config`'s tree recurses once per level of nesting (a
/// 200 KB `- - - …` file overflowed the stack). So the text is first read as a stream of events,
/// which costs neither memory nor stack, and refused at its first alias or at nesting deeper
/// than [`MAX_NESTING`]. A syntax error is left to the full parse, which words it as usual.
fn yaml_hazard(text: &str) -> Option<String> {
    use yaml_rust2::Event;
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    let mut depth = 0usize;
    loop {
        let (event, mark) = parser.next_token().ok()?;
        match event {
            Event::StreamEnd => return None,
            Event::Alias(_) => {
                return Some(format!(
                    "line {}: YAML aliases (\"*name\", and merge keys \"<<: *name\") are not \
                     supported; write the value out where it is used, and quote values that \
                     start with \"*\", such as schedule: \"*/5 * * * *\"",
                    mark.line()
                ));
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(format!(
                        "line {}: lists and tables nested more than {MAX_NESTING} levels deep; \
                         flatten the structure (a job file needs a few levels, params a few more)",
                        mark.line()
                    ));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
}

/// Squeezes a parser's multi-line message (TOML errors quote the offending line and point at it
/// with a caret) into one line: the position, then the explanation.
fn one_line(message: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for line in message.lines() {
        let trimmed = line.trim();
        let is_snippet = trimmed.is_empty()
            || trimmed.starts_with('|')
            || trimmed
                .split_once(" |")
                .is_some_and(|(number, _)| number.chars().all(|c| c.is_ascii_digit()));
        if !is_snippet {
            parts.push(trimmed.trim_end_matches([':', ' ']));
        }
    }
    parts.join(": ")
}

/// A job read from a file, with where it was read from.
pub(crate) struct LoadedJob {
    /// The file, as given.
    pub(crate) origin: String,
    /// The validated job.
    pub(crate) spec: JobSpec,
}

/// Expands the `jobs` setting: a path without wildcards is kept as it is; a pattern (`*`, `?`,
/// `[…]`, `**` for any depth of directories) becomes the TOML and YAML files it matches, in
/// alphabetical order. A file named twice is kept once. A pattern that matches no job file is a
/// mistake, so a typo in a directory name cannot silently load no jobs.
pub fn expand_job_patterns(patterns: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut paths = Vec::new();
    for pattern in patterns {
        let text = pattern.to_string_lossy();
        if !text.contains(['*', '?', '[']) {
            paths.push(pattern.clone());
            continue;
        }
        let entries = match glob::glob(&text) {
            Ok(entries) => entries,
            Err(e) => {
                errors.push(ConfigError::at(
                    text,
                    format!(
                        "invalid file pattern: {} at character {}; use * and ? as wildcards, \
                         such as \"jobs.d/*.toml\"",
                        e.msg,
                        e.pos + 1
                    ),
                ));
                continue;
            }
        };
        let before = paths.len();
        for entry in entries {
            match entry {
                Ok(path) if path.is_file() && SourceFormat::from_path(&path).is_some() => {
                    paths.push(path);
                }
                Ok(_) => {}
                Err(e) => errors.push(ConfigError::at(
                    e.path().display().to_string(),
                    format!("cannot read: {}", e.error()),
                )),
            }
        }
        if paths.len() == before {
            errors.push(ConfigError::at(
                text,
                "no .toml, .yaml or .yml file matches this pattern; check the path (relative \
                 paths in a settings file are read from that file's directory)",
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    paths.retain(|path| seen.insert(path.canonicalize().unwrap_or_else(|_| path.clone())));
    if errors.is_empty() {
        Ok(paths)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Reads and validates job files (no wildcards; see [`expand_job_patterns`]). Job names must be
/// unique across all of them. Returns every job, or every mistake.
pub fn load_job_files(paths: &[PathBuf]) -> Result<Vec<JobSpec>, ConfigErrors> {
    load_located_jobs(paths).map(|jobs| jobs.into_iter().map(|job| job.spec).collect())
}

/// [`load_job_files`], keeping which file each job came from.
pub(crate) fn load_located_jobs(paths: &[PathBuf]) -> Result<Vec<LoadedJob>, ConfigErrors> {
    let mut reader = Reader::default();
    for path in paths {
        let origin = path.display().to_string();
        let Some(format) = SourceFormat::from_path(path) else {
            reader.errors.push(ConfigError::at(
                origin,
                "unsupported file type; job files end in .toml, .yaml or .yml",
            ));
            continue;
        };
        match std::fs::read_to_string(path) {
            Ok(text) => reader.read(&origin, &text, format),
            Err(e) => reader
                .errors
                .push(ConfigError::at(origin, format!("cannot read: {e}"))),
        }
    }
    reader.finish()
}

/// Validates the text of one job file; `origin` names it in messages. Pure: reads no file.
pub fn parse_job_file(
    origin: &str,
    text: &str,
    format: SourceFormat,
) -> Result<Vec<JobSpec>, ConfigErrors> {
    let mut reader = Reader::default();
    reader.read(origin, text, format);
    reader
        .finish()
        .map(|jobs| jobs.into_iter().map(|job| job.spec).collect())
}

/// How far a [`Reader`] had got, to undo a file read chunk by chunk.
struct Mark {
    jobs: usize,
    errors: usize,
}

/// Splits a TOML job file at its `[[jobs]]` header lines: the text before the first one (the
/// top-level keys), then one chunk per job table. `None` when there is no such line, or when
/// the file has multi-line strings (`"""`, `'''`), in which a header-like line could be text.
/// Each chunk holds one job table and its sub-tables (`[jobs.retry]`, `[jobs.params]`), so,
/// when every chunk parses and holds only that, reading the chunks one by one gives the jobs
/// the whole document holds; [`Reader::read_toml_chunks`] checks both and otherwise reads
/// the whole document.
fn toml_job_chunks(text: &str) -> Option<Vec<&str>> {
    if text.contains("\"\"\"") || text.contains("'''") {
        return None;
    }
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == "[[jobs]]" {
            starts.push(offset);
        }
        offset += line.len();
    }
    if starts.is_empty() {
        return None;
    }
    let mut chunks = Vec::with_capacity(starts.len() + 1);
    let mut from = 0;
    for start in starts {
        chunks.push(&text[from..start]);
        from = start;
    }
    chunks.push(&text[from..]);
    Some(chunks)
}

/// Accumulates jobs and mistakes over several files.
#[derive(Default)]
struct Reader {
    jobs: Vec<LoadedJob>,
    errors: Vec<ConfigError>,
    /// Job name → (file, position) of its first definition.
    names: HashMap<String, (String, usize)>,
    /// The calendars the files declare (`[calendars.NAME]`), by name.
    calendars: BTreeMap<String, calendars::Declared>,
}

impl Reader {
    fn read(&mut self, origin: &str, text: &str, format: SourceFormat) {
        if format == SourceFormat::Toml
            && let Some(chunks) = toml_job_chunks(text)
        {
            let mark = Mark {
                jobs: self.jobs.len(),
                errors: self.errors.len(),
            };
            let mut added_names = Vec::new();
            if self.read_toml_chunks(origin, &chunks, &mut added_names) {
                return;
            }
            // Not one job per chunk after all: undo, and read the whole document.
            self.jobs.truncate(mark.jobs);
            self.errors.truncate(mark.errors);
            for name in added_names {
                self.names.remove(&name);
            }
        }
        self.read_document(origin, text, format);
    }

    /// Reads a TOML job file chunk by chunk ([`toml_job_chunks`]), so only one job's value tree
    /// is in memory at a time, not the whole document's (at 100,000 jobs the whole tree was
    /// several hundred MB). Returns false, having perhaps recorded jobs and mistakes that the
    /// caller then undoes, when a chunk does not parse or is not exactly one job table: the
    /// whole document is then read as one, which gives the usual messages (a syntax error's
    /// line is that of the file).
    fn read_toml_chunks(
        &mut self,
        origin: &str,
        chunks: &[&str],
        added_names: &mut Vec<String>,
    ) -> bool {
        let Some((head, jobs)) = chunks.split_first() else {
            return false;
        };
        let Ok(root) = SourceFormat::Toml.parse(origin, head) else {
            return false;
        };
        if root.contains_key("jobs") || root.contains_key("workflows") {
            return false;
        }
        self.unknown_keys(origin, &root);
        self.read_calendars(origin, &root);
        drop(root);
        for (i, chunk) in jobs.iter().enumerate() {
            let Ok(mut root) = SourceFormat::Toml.parse(origin, chunk) else {
                return false;
            };
            let item = match root.remove("jobs").map(|jobs| jobs.kind) {
                Some(config::ValueKind::Array(mut items))
                    if root.is_empty() && items.len() == 1 =>
                {
                    items.pop().expect("one item")
                }
                _ => return false,
            };
            if let Some(name) = self.read_job(origin, i + 1, &item) {
                added_names.push(name);
            }
        }
        true
    }

    /// Reads a job file's whole document at once.
    fn read_document(&mut self, origin: &str, text: &str, format: SourceFormat) {
        let root = match format.parse(origin, text) {
            Ok(root) => root,
            Err(e) => {
                self.errors.push(e);
                return;
            }
        };
        self.unknown_keys(origin, &root);
        self.read_calendars(origin, &root);
        self.read_workflows(origin, &root);
        let items = match root.get("jobs").map(|jobs| &jobs.kind) {
            None | Some(config::ValueKind::Nil) => return,
            Some(config::ValueKind::Array(items)) => items,
            Some(_) => {
                self.errors.push(ConfigError::key(
                    origin,
                    "jobs",
                    Some(render_config(&root["jobs"])),
                    "expected a list of job tables: [[jobs]] sections in TOML, \
                     \"- name: …\" items under \"jobs:\" in YAML",
                ));
                return;
            }
        };
        for (i, item) in items.iter().enumerate() {
            self.read_job(origin, i + 1, item);
        }
    }

    /// Reads the `workflows` list of a file's top level: each table is a job of kind
    /// `workflow` (docs/workflows.md), checked like any job.
    fn read_workflows(&mut self, origin: &str, root: &config::Map<String, config::Value>) {
        let items = match root.get("workflows").map(|w| &w.kind) {
            None | Some(config::ValueKind::Nil) => return,
            Some(config::ValueKind::Array(items)) => items,
            Some(_) => {
                self.errors.push(ConfigError::key(
                    origin,
                    "workflows",
                    Some(render_config(&root["workflows"])),
                    "expected a list of workflow tables: [[workflows]] sections in TOML, \
                     \"- name: …\" items under \"workflows:\" in YAML",
                ));
                return;
            }
        };
        for (i, item) in items.iter().enumerate() {
            let mut item = item.clone();
            if let config::ValueKind::Table(table) = &mut item.kind {
                if table.contains_key("kind") {
                    self.errors.push(ConfigError::key(
                        origin,
                        format!("workflows[{i}].kind"),
                        Some(render_config(&table["kind"])),
                        "a [[workflows]] table is of kind \"workflow\"; remove the field",
                    ));
                    continue;
                }
                table.insert(
                    "kind".to_owned(),
                    config::Value::new(None, config::ValueKind::String("workflow".to_owned())),
                );
            }
            self.read_job(origin, i + 1, &item);
        }
    }

    /// Reads the `calendars` table of a file's top level, if it has one.
    fn read_calendars(&mut self, origin: &str, root: &config::Map<String, config::Value>) {
        let Some(value) = root.get("calendars") else {
            return;
        };
        let mut not_json = Vec::new();
        let json = to_json(value, "calendars", &mut not_json);
        for bad in not_json {
            self.errors.push(ConfigError::key(
                origin,
                bad.path,
                Some(bad.value),
                bad.message,
            ));
        }
        calendars::read_declared(origin, &json, &mut self.calendars, &mut self.errors);
    }

    /// Reports the top-level keys other than `jobs` and `calendars`.
    fn unknown_keys(&mut self, origin: &str, root: &config::Map<String, config::Value>) {
        let mut keys: Vec<&String> = root
            .keys()
            .filter(|key| !["jobs", "workflows", "calendars"].contains(&key.as_str()))
            .collect();
        keys.sort();
        for key in keys {
            let message = if super::SETTINGS_KEYS
                .iter()
                .any(|setting| setting.split('.').next() == Some(key.as_str()))
            {
                "unknown key; a job file holds \"jobs\" and \"workflows\" lists and \"calendars\" tables (this \
                 looks like a setting: it belongs in the settings file)"
                    .to_owned()
            } else if let Some(near) = closest(key, ["jobs", "workflows", "calendars"]) {
                format!("unknown key; did you mean {near:?}?")
            } else {
                "unknown key; a job file holds \"jobs\" and \"workflows\" lists and \"calendars\" tables".to_owned()
            };
            self.errors.push(ConfigError::key(
                origin,
                key.as_str(),
                Some(render_config(&root[key])),
                message,
            ));
        }
    }

    /// Reads one job table. Returns the job's name when this job was the first to take it.
    fn read_job(&mut self, origin: &str, index: usize, item: &config::Value) -> Option<String> {
        let mut not_json = Vec::new();
        let json = to_json(item, "", &mut not_json);
        let Value::Object(table) = json else {
            self.errors.push(ConfigError {
                origin: origin.to_owned(),
                job: Some(JobRef::Index(index)),
                key: None,
                value: Some(render_config(item)),
                message: "expected a table of job fields, such as name, group and schedule"
                    .to_owned(),
            });
            return None;
        };
        let job = match table.get("name") {
            Some(Value::String(name)) if !name.is_empty() => JobRef::Name(name.clone()),
            _ => JobRef::Index(index),
        };
        let before = self.errors.len();
        for bad in not_json {
            self.errors.push(ConfigError::in_job(
                origin,
                &job,
                FieldError::new(&bad.path, Some(bad.value), bad.message),
            ));
        }
        let result = validate(&table, Calendars::ByName);
        if let Err(field_errors) = &result {
            self.errors.extend(
                field_errors
                    .iter()
                    .cloned()
                    .map(|e| ConfigError::in_job(origin, &job, e)),
            );
        }
        let mut first_of_name = None;
        if let Some(Value::String(name)) = table.get("name")
            && identifier_problem(name).is_none()
        {
            match self.names.get(name) {
                Some((first_origin, first_index)) => {
                    let place = if first_origin == origin {
                        format!("job #{first_index} of this file")
                    } else {
                        format!("{first_origin} (job #{first_index})")
                    };
                    self.errors.push(ConfigError::in_job(
                        origin,
                        &job,
                        FieldError::new(
                            "name",
                            Some(render(&Value::String(name.clone()))),
                            format!(
                                "duplicate job name, first defined in {place}; job names must \
                                 be unique across all job files, so rename one of them"
                            ),
                        ),
                    ));
                }
                None => {
                    self.names.insert(name.clone(), (origin.to_owned(), index));
                    first_of_name = Some(name.clone());
                }
            }
        }
        if let Ok(spec) = result
            && self.errors.len() == before
        {
            self.jobs.push(LoadedJob {
                origin: origin.to_owned(),
                spec,
            });
        }
        first_of_name
    }

    fn finish(mut self) -> Result<Vec<LoadedJob>, ConfigErrors> {
        let resolved = calendars::resolve_declared(&self.calendars, &mut self.errors);
        let now = Utc::now();
        // The clock check of a declared calendar, once per calendar, zone and mode: many jobs
        // name one calendar, and compiling a long holiday list per job made loading slow.
        let mut checked: HashMap<(String, Tz, CalendarMode), Option<FieldError>> = HashMap::new();
        for job in &mut self.jobs {
            let Some(name) = job.spec.calendar_ref.take() else {
                continue;
            };
            let job_ref = JobRef::Name(job.spec.name.clone());
            let Some(def) = resolved.get(&name) else {
                // A declared calendar with mistakes has its own messages.
                if !self.calendars.contains_key(&name) {
                    let names = calendars::declared_names(&resolved);
                    let near = closest(&name, names.iter().copied())
                        .map(|near| format!(" did you mean {near:?}?"))
                        .unwrap_or_default();
                    let known = if names.is_empty() {
                        "the job files declare no calendar".to_owned()
                    } else {
                        format!("declared: {}", names.join(", "))
                    };
                    self.errors.push(ConfigError::in_job(
                        &job.origin,
                        &job_ref,
                        FieldError::new(
                            "calendar",
                            Some(render(&Value::String(name.clone()))),
                            format!(
                                "no calendar of this name ({known});{near} declare it as \
                                 [calendars.{name}] in a job file or fix the name"
                            ),
                        ),
                    ));
                }
                continue;
            };
            job.spec.calendar = Some(def.clone());
            let key = (name, job.spec.timezone, job.spec.calendar_mode);
            let problem = checked
                .entry(key)
                .or_insert_with(|| calendar_problem(&job.spec, now));
            if let Some(error) = problem.clone() {
                self.errors
                    .push(ConfigError::in_job(&job.origin, &job_ref, error));
            }
        }
        if self.errors.is_empty() {
            self.errors = super::children::link_errors(&self.jobs);
            self.errors
                .extend(super::workflows::node_job_errors(&self.jobs));
        }
        if self.errors.is_empty() {
            Ok(self.jobs)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }
}

/// Validates one job given as a JSON object (a job table of a file, or an API request body) and
/// builds its [`JobSpec`]; returns every mistake, each naming the field, the value and the fix.
/// A `null` field counts as absent. A calendar is written out as a table: names of declared
/// calendars are known only where job files are loaded.
pub fn validate_job(table: &Map<String, Value>) -> Result<JobSpec, Vec<FieldError>> {
    validate(table, Calendars::Inline)
}

/// How a job's `calendar` may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Calendars {
    /// A name of a job file's `[calendars.NAME]` (resolved when every file is read) or a table.
    ByName,
    /// Only a table (a definition sent to the API).
    Inline,
}

fn validate(table: &Map<String, Value>, calendars: Calendars) -> Result<JobSpec, Vec<FieldError>> {
    let mut check = Check {
        table,
        errors: Vec::new(),
        clean: Map::new(),
    };
    check.unknown_fields();

    check.identifier("name", IdentifierKind::Name);
    let workflow = check.get("kind").and_then(Value::as_str) == Some(KindName::Workflow.as_str());
    if !workflow {
        check.identifier("group", IdentifierKind::Group);
    } else if check.get("group").is_some() {
        check.fail(
            "group",
            "a workflow has no group: each node's job has its own; remove the field",
        );
    }

    let timezone = check.timezone();
    // `None` when `kind` is given but wrong: its fields are then checked each by itself.
    let kind = match check.get("kind") {
        None => Some(KindName::Single),
        Some(_) => check.one_of("kind", KIND_VALUES).and_then(KindName::parse),
    };
    check.kind_fields(kind);
    let when: Vec<&str> = When::FIELDS
        .into_iter()
        .filter(|field| check.get(field).is_some())
        .collect();
    if when.len() > 1 {
        check.errors.push(FieldError {
            field: None,
            value: None,
            message: When::conflict(&when),
        });
    }
    if let Some(expr) = check.string("schedule") {
        // Cron syntax does not depend on the zone: check it even when the zone is wrong, so
        // both mistakes are reported at once.
        match Schedule::cron(expr, timezone.unwrap_or(Tz::UTC)) {
            Ok(_) => check.keep("schedule"),
            Err(ScheduleError::Cron { reason, .. }) => {
                check.fail("schedule", format!("invalid cron expression: {reason}"));
            }
            Err(other) => check.fail("schedule", other.to_string()),
        }
    }
    if let Some(period) = check.duration_at_most("every", MAX_EVERY, "a period")
        && period < Duration::from_millis(1)
    {
        check.fail(
            "every",
            "the period must be at least 1ms; use a duration such as \"30s\" or \"5m\"",
        );
    }
    for field in ["at", "start_at", "end_at"] {
        check.instant(field);
    }
    check.duration_at_most("jitter", MAX_JITTER, "jitter");
    check.whole_number_in("max_runs", 1, MAX_RUNS);
    let calendar_ref = check.calendar(calendars);
    check.one_of("calendar_mode", CalendarMode::NAMES);
    check.one_of("on_excluded", OnExcluded::NAMES);
    check.params();
    check.secret_params();
    if let Some(timeout) = check.duration_at_most("timeout", MAX_TIMEOUT, "a timeout")
        && timeout.is_zero()
    {
        check.fail(
            "timeout",
            "a timeout must be longer than 0s; remove the field for no timeout",
        );
    }
    let misfire = check.one_of("misfire", MISFIRE_VALUES);
    check.duration_at_most("misfire_grace", MAX_LOOKBACK, "the grace");
    check.duration_at_most("catchup_window", MAX_LOOKBACK, "the catch-up window");
    if let Some(max) = check.whole_number("max_catchup", MAX_CATCHUP)
        && max == 0
        && misfire == Some("fire_all")
    {
        check.fail(
            "max_catchup",
            "with misfire = \"fire_all\" at least one missed fire must be allowed; set \
             max_catchup to 1 or more, or use misfire = \"skip\"",
        );
    }
    check.one_of("concurrency", CONCURRENCY_VALUES);
    if workflow && check.get("retry").is_some() {
        check.fail(
            "retry",
            "a workflow run is not retried; give the nodes' jobs their retry policies, or \
             rerun a failed node (chime workflows rerun)",
        );
    } else {
        check.retry();
    }
    check.child_jobs();
    check.alerts();
    if let Some(retention) = check.duration_at_most("retention", MAX_RETENTION, "retention")
        && retention < Duration::from_secs(60)
    {
        check.fail(
            "retention",
            "keep finished runs at least 1m; write a duration such as \"7days\"",
        );
    }
    check.boolean("paused");
    if let Some(text) = check.string("description") {
        if text.len() > MAX_DESCRIPTION_BYTES {
            check.fail(
                "description",
                format!(
                    "{} bytes is too long; keep the description to {MAX_DESCRIPTION_BYTES} \
                     bytes and link to longer documentation",
                    text.len()
                ),
            );
        } else {
            check.keep("description");
        }
    }

    if !check.errors.is_empty() {
        return Err(check.errors);
    }
    let mut spec: JobSpec = serde_json::from_value(Value::Object(check.clean)).map_err(|e| {
        // Unreachable unless JOB_FIELDS and the checks above lag behind JobSpec.
        vec![FieldError {
            field: None,
            value: None,
            message: format!("cannot build the job: {e}"),
        }]
    })?;
    spec.calendar_ref = calendar_ref;
    let now = Utc::now();
    let mut errors = timing_errors(&spec, table, now);
    if errors.is_empty()
        && let Some(error) = calendar_problem(&spec, now)
    {
        errors.push(error);
    }
    if errors.is_empty() {
        Ok(spec)
    } else {
        Err(errors)
    }
}

/// The check of a job's calendar that needs the clock: a calendar whose instants allowed to the
/// job (in it with `calendar_mode = "only"`, outside it with `"except"`) do not occur in the
/// [`MAX_CALENDAR_SEARCH`](chime_protocol::limits::MAX_CALENDAR_SEARCH) after `now` would keep
/// every fire from running, a mistake such as dates of a past year.
pub(super) fn calendar_problem(spec: &JobSpec, now: DateTime<Utc>) -> Option<FieldError> {
    let calendar = spec.calendar.as_ref()?;
    let clock = spec.calendar_clock()?;
    let only = spec.calendar_mode == CalendarMode::Only;
    if clock.first_at_or_after(now, only).is_some() {
        return None;
    }
    let (mode, fix) = if only {
        (
            "only",
            "add dates to come, or use calendar_mode = \"except\" to keep fires out of it",
        )
    } else {
        ("except", "narrow the calendar")
    };
    Some(FieldError::new(
        "calendar",
        Some(render(&Value::String(calendar.name.clone()))),
        format!(
            "with calendar_mode = \"{mode}\", calendar {} allows no instant in the next {} \
             (from {}), so the job would never run; {fix}",
            calendar.name,
            crate::schedule::calendar_search_words(),
            now.to_rfc3339_opts(SecondsFormat::Secs, true),
        ),
    ))
}

/// How many fires after the validation instant `jitter` is checked against: the shortest time
/// between two of them bounds it.
const JITTER_GAP_FIRES: usize = 100;

/// The checks of a job's timing fields that need its built schedule: `jitter`, `start_at`,
/// `end_at` and `max_runs` apply to a schedule; `end_at` comes after `start_at` and leaves a
/// fire between them; `jitter` is no longer than the time between two fires (a fire never
/// moves past the next one, so a longer jitter would not be what it says). The gaps of a cron
/// schedule are those of its next [`JITTER_GAP_FIRES`] fires after `now`.
fn timing_errors(
    spec: &JobSpec,
    table: &Map<String, Value>,
    now: DateTime<Utc>,
) -> Vec<FieldError> {
    let fail = |field: &str, message: String| {
        FieldError::new(field, table.get(field).map(render), message)
    };
    let mut errors = Vec::new();
    // The timing fields: JOB_FIELDS from `jitter` up to `params`.
    let given: Vec<&str> = JOB_FIELDS
        .iter()
        .copied()
        .skip_while(|field| *field != "jitter")
        .take_while(|field| *field != "params")
        .filter(|field| table.get(*field).is_some_and(|v| !v.is_null()))
        .collect();
    if !given.contains(&"calendar") {
        for field in ["calendar_mode", "on_excluded"] {
            if given.contains(&field) {
                errors.push(fail(
                    field,
                    "applies to the job's calendar, and the job has none; add calendar = \
                     \"NAME\" or remove it"
                        .to_owned(),
                ));
            }
        }
    }
    if spec.when == When::Manual {
        for field in given {
            errors.push(fail(
                field,
                "applies to scheduled fires, and a job without \"schedule\", \"every\" or \
                 \"at\" has none; remove it, or give the job a schedule"
                    .to_owned(),
            ));
        }
        return errors;
    }
    let Ok(schedule) = spec.schedule() else {
        return errors;
    };
    // A static never-firing expression is rejected by the parser; a Quartz year field can also
    // lie wholly in the past, which only the clock tells.
    if let Schedule::Cron(cron) = &schedule
        && cron.next_after(now).is_none()
    {
        errors.push(fail(
            "schedule",
            format!(
                "invalid cron expression: its year field allows no year from {} on, so it would \
                 never fire again; widen the year field (such as {}-{}) or remove it",
                now.year(),
                now.year(),
                now.year() + 4
            ),
        ));
        return errors;
    }
    if let (Some(start), Some(end)) = (spec.start_at, spec.end_at)
        && end <= start
    {
        errors.push(fail(
            "end_at",
            format!(
                "is not after start_at ({}), so the schedule would never fire; put end_at \
                 after start_at",
                start.to_rfc3339()
            ),
        ));
        return errors;
    }
    if let Some(jitter) = spec.jitter {
        if jitter.is_zero() {
            errors.push(fail(
                "jitter",
                "must be longer than 0s; remove the field for fires at their exact instants"
                    .to_owned(),
            ));
        } else if let Some((gap, from, to)) = shortest_gap(&schedule, now)
            && jitter > gap
        {
            let gap_text = humantime::format_duration(gap);
            errors.push(fail(
                "jitter",
                format!(
                    "is longer than the {gap_text} between two fires ({} and {}); a fire \
                     never moves past the next one, so use at most \"{gap_text}\"",
                    from.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                    to.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                ),
            ));
        }
    }
    // A window with no fire in it never fires, whenever it is loaded. (`end_at` alone is not
    // checked: a schedule that has ended by now is not a mistake.)
    if let (Some(start), Some(_)) = (spec.start_at, spec.end_at)
        && errors.is_empty()
    {
        let timing = spec.timing_of(std::sync::Arc::new(schedule));
        let before = start
            .to_utc()
            .checked_sub_signed(chrono::TimeDelta::nanoseconds(1));
        if before
            .and_then(|before| timing.next_after(before))
            .is_none()
        {
            errors.push(fail(
                "end_at",
                "leaves no fire of the schedule in the window (none at or after start_at and at \
                 or before end_at); widen the window or change the schedule"
                    .to_owned(),
            ));
        }
    }
    errors
}

/// The shortest time between two consecutive fires of `schedule` among its next
/// [`JITTER_GAP_FIRES`] after `now`, with the two fires; `None` with fewer than two.
fn shortest_gap(
    schedule: &Schedule,
    now: DateTime<Utc>,
) -> Option<(Duration, DateTime<Utc>, DateTime<Utc>)> {
    if let Schedule::Every(period) = schedule {
        let first = schedule.next_after(now)?;
        let second = schedule.next_after(first)?;
        return Some((*period, first, second));
    }
    schedule
        .upcoming(now, JITTER_GAP_FIRES)
        .windows(2)
        .filter_map(|pair| Some(((pair[1] - pair[0]).to_std().ok()?, pair[0], pair[1])))
        .min_by_key(|(gap, _, _)| *gap)
}

/// Checks a job's or a manual trigger's `params`: a JSON object (`null` counts as absent) whose
/// JSON encoding is at most [`MAX_PARAMS_BYTES`] bytes, nested at most [`MAX_NESTING`] levels.
/// The one check every entry uses: job files, the API's job create and update (through
/// [`validate_job`]), and manual triggers from the API and the CLI.
pub fn validate_params(value: &Value) -> Result<(), FieldError> {
    let fail = |message: String| Err(FieldError::new("params", Some(render(value)), message));
    if value.is_null() {
        return Ok(());
    }
    if !value.is_object() {
        let mut message = format!(
            "params must be a table of named values (a JSON object), found {}",
            kind(value)
        );
        if let Value::String(text) = value
            && serde_json::from_str::<Map<String, Value>>(text).is_ok()
        {
            message.push_str(
                "; this string holds JSON: write the table itself instead of quoting it, such \
                 as params = { batch = 500 } in TOML or params: { batch: 500 } in YAML",
            );
        } else {
            message.push_str(
                "; wrap the value in a table, such as params = { batch = 500 } in TOML or \
                 params: { batch: 500 } in YAML",
            );
        }
        return fail(message);
    }
    let depth = nesting(value);
    if depth > MAX_NESTING {
        return fail(format!(
            "nested {depth} levels deep, more than the limit of {MAX_NESTING}; flatten the \
             params"
        ));
    }
    if holds_nul(value) {
        return fail(
            "holds a NUL character (\\u0000), which PostgreSQL cannot store; remove it or \
             encode the data (base64, hex)"
                .to_owned(),
        );
    }
    let size = json_len(value);
    if size > MAX_PARAMS_BYTES {
        return fail(format!(
            "{size} bytes as JSON, more than the limit of {MAX_PARAMS_BYTES} bytes; pass a \
             reference to the data (an id, a URL) instead of the data itself"
        ));
    }
    Ok(())
}

/// Whether a string or key anywhere in `value` holds a NUL character.
fn holds_nul(value: &Value) -> bool {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(text) if text.contains('\0') => return true,
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return true;
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    false
}

/// How deeply lists and objects nest in `value` (a scalar is 0), without recursion.
fn nesting(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|item| (item, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|item| (item, depth + 1))),
            _ => continue,
        }
        deepest = deepest.max(depth + 1);
    }
    deepest
}

/// The length of `value`'s compact JSON encoding, counted without building it.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, and a `Value` always serialises.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A bound as the messages show it: whole years or days as such ("100years", "366days", the
/// way humantime reads them back), anything else as humantime writes it.
pub(super) fn limit_text(limit: Duration) -> String {
    const DAY: u64 = 24 * 60 * 60;
    // humantime's year is 365.25 days.
    const YEAR: u64 = 31_557_600;
    let secs = limit.as_secs();
    let whole = |unit: u64| limit.subsec_nanos() == 0 && secs > 0 && secs.is_multiple_of(unit);
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    if whole(YEAR) {
        format!("{}year{}", secs / YEAR, plural(secs / YEAR))
    } else if whole(DAY) {
        format!("{}day{}", secs / DAY, plural(secs / DAY))
    } else {
        humantime::format_duration(limit).to_string()
    }
}

/// Field-by-field checks of one job table. Each checker records mistakes in `errors` and copies
/// good values (normalised where useful) into `clean`, from which the `JobSpec` is built.
struct Check<'a> {
    table: &'a Map<String, Value>,
    errors: Vec<FieldError>,
    clean: Map<String, Value>,
}

#[derive(Clone, Copy)]
enum IdentifierKind {
    Name,
    Group,
}

impl<'a> Check<'a> {
    /// The field's value; `null` counts as absent.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.table.get(field).filter(|value| !value.is_null())
    }

    fn fail(&mut self, field: &str, message: impl Into<String>) {
        let value = self.get(field).map(render);
        self.errors.push(FieldError::new(field, value, message));
    }

    fn keep(&mut self, field: &str) {
        if let Some(value) = self.get(field) {
            self.clean.insert(field.to_owned(), value.clone());
        }
    }

    /// `secret_params`: the param keys whose values are secrets (crate::secrets), a list of at
    /// most [`MAX_SECRET_PARAMS`] non-empty names of at most `MAX_NAME_BYTES` bytes each.
    fn secret_params(&mut self) {
        let Some(value) = self.get("secret_params") else {
            return;
        };
        let Value::Array(keys) = value else {
            self.fail(
                "secret_params",
                format!(
                    "expected a list of param names, found {}; write it such as \
                     secret_params = [\"db_password\"]",
                    kind(value)
                ),
            );
            return;
        };
        if keys.len() > MAX_SECRET_PARAMS {
            self.fail(
                "secret_params",
                format!(
                    "lists {} names; at most {MAX_SECRET_PARAMS} are allowed, name only the \
                     params that hold secrets",
                    keys.len()
                ),
            );
            return;
        }
        let max = chime_protocol::limits::MAX_NAME_BYTES;
        let bad = keys
            .iter()
            .find(|key| key.as_str().is_none_or(|k| k.is_empty() || k.len() > max));
        if let Some(bad) = bad {
            self.fail(
                "secret_params",
                format!(
                    "{} is not a param name; each entry is a string of 1 to {max} bytes, such \
                     as \"db_password\"",
                    render(bad)
                ),
            );
            return;
        }
        self.keep("secret_params");
    }

    /// `on_success`, `on_failure`, `on_complete`: each a list of job names, none twice in one
    /// list nor the job's own, at most [`MAX_CHILD_JOBS`] jobs in all (the links between jobs
    /// are checked where every job is known: `super::children`).
    fn child_jobs(&mut self) {
        let own = self.get("name").and_then(Value::as_str);
        let mut named: Vec<&str> = Vec::new();
        for field in ChildJobs::FIELDS {
            let Some(value) = self.get(field) else {
                continue;
            };
            let Value::Array(names) = value else {
                self.fail(
                    field,
                    format!(
                        "expected a list of job names, found {}; write it such as \
                         {field} = [\"send-report\"]",
                        kind(value)
                    ),
                );
                continue;
            };
            if names.len() > MAX_CHILD_JOBS {
                self.fail(
                    field,
                    format!(
                        "names {} jobs; at most {MAX_CHILD_JOBS} are allowed \
                         (limits::MAX_CHILD_JOBS): start one job that starts the others",
                        names.len()
                    ),
                );
                continue;
            }
            let mut problem = None;
            for (i, name) in names.iter().enumerate() {
                let Some(text) = name.as_str() else {
                    problem = Some(format!(
                        "{} is not a job name; each entry is the name of a job, as a string",
                        render(name)
                    ));
                    break;
                };
                if let Some(why) = identifier_problem(text) {
                    problem = Some(format!(
                        "{text:?} is not a job name: {why}; name a job as its `name` field does"
                    ));
                    break;
                }
                if names[..i]
                    .iter()
                    .any(|before| before.as_str() == Some(text))
                {
                    problem = Some(format!("names job {text:?} twice; name it once"));
                    break;
                }
                if own == Some(text) {
                    problem = Some(format!(
                        "child jobs form a cycle: {text} → {text}, so each run would start \
                         the next for ever; a job cannot be its own child, remove {text:?}"
                    ));
                    break;
                }
                if !named.contains(&text) {
                    named.push(text);
                }
            }
            match problem {
                Some(problem) => self.fail(field, problem),
                None => self.keep(field),
            }
        }
        if named.len() > MAX_CHILD_JOBS {
            self.errors.push(FieldError {
                field: None,
                value: None,
                message: format!(
                    "on_success, on_failure and on_complete name {} jobs; at most \
                     {MAX_CHILD_JOBS} are allowed (limits::MAX_CHILD_JOBS): start one job \
                     that starts the others",
                    named.len()
                ),
            });
        }
    }

    /// The `retry` table: each key checked like a job field, errors named `retry.<key>`.
    fn retry(&mut self) {
        let Some(value) = self.get("retry") else {
            return;
        };
        let Value::Object(table) = value else {
            self.fail(
                "retry",
                format!(
                    "retry must be a table, found {}; write it such as retry = {{ max_attempts = 4, \
                     initial = \"10s\" }}",
                    kind(value)
                ),
            );
            return;
        };
        let mut inner = Check {
            table,
            errors: Vec::new(),
            clean: Map::new(),
        };
        inner.unknown_keys(RETRY_FIELDS);
        if let Some(n) = inner.whole_number("max_attempts", MAX_ATTEMPTS)
            && n == 0
        {
            inner.fail(
                "max_attempts",
                "at least 1 attempt is needed; use 1 for no retry",
            );
        }
        let initial = inner.duration_at_most("initial", MAX_RETRY_DELAY, "a retry delay");
        if initial.is_some_and(|d| d.is_zero()) {
            inner.fail(
                "initial",
                "the first delay must be longer than 0s, such as \"1s\"",
            );
        }
        if let Some(value) = inner.get("multiplier") {
            match value.as_f64() {
                Some(m) if (1.0..=MAX_MULTIPLIER).contains(&m) => inner.keep("multiplier"),
                _ => inner.fail(
                    "multiplier",
                    format!(
                        "expected a number from 1 to {MAX_MULTIPLIER}, such as 2 (each delay \
                         twice the last)"
                    ),
                ),
            }
        }
        let max = inner.duration_at_most("max", MAX_RETRY_DELAY, "a retry delay");
        if let (Some(initial), Some(max)) = (initial, max)
            && max < initial
        {
            inner.fail(
                "max",
                "the longest delay is shorter than the first; make max at least as long as initial",
            );
        }
        inner.boolean("jitter");
        for mut error in inner.errors {
            error.field = Some(match error.field {
                Some(field) => format!("retry.{field}"),
                None => "retry".to_owned(),
            });
            self.errors.push(error);
        }
        self.clean
            .insert("retry".to_owned(), Value::Object(inner.clean));
    }

    /// The `alerts` table (`webhook`, `format`), errors named `alerts.<key>`.
    fn alerts(&mut self) {
        let Some(value) = self.get("alerts") else {
            return;
        };
        let Value::Object(table) = value else {
            self.fail(
                "alerts",
                format!(
                    "alerts must be a table, found {}; write it such as alerts = {{ webhook = \
                     \"https://hooks.example.com/chime\", format = \"slack\" }}",
                    kind(value)
                ),
            );
            return;
        };
        let mut inner = Check {
            table,
            errors: Vec::new(),
            clean: Map::new(),
        };
        inner.unknown_keys(ALERT_FIELDS);
        if let Some(url) = inner.string("webhook") {
            match webhook_problem(url) {
                None => inner.keep("webhook"),
                Some(problem) => inner.fail("webhook", problem),
            }
        }
        inner.one_of("format", ALERT_FORMATS);
        for mut error in inner.errors {
            error.field = Some(match error.field {
                Some(field) => format!("alerts.{field}"),
                None => "alerts".to_owned(),
            });
            self.errors.push(error);
        }
        self.clean
            .insert("alerts".to_owned(), Value::Object(inner.clean));
    }

    /// The kind-specific fields ([`Kind::FIELDS`]) against `kind` (`None` when `kind` itself
    /// is wrong: each field is then checked alone, so its own mistakes are reported too). A
    /// field of another kind is refused without looking at its value; a sharded job needs
    /// `shards`.
    fn kind_fields(&mut self, kind: Option<KindName>) {
        let applies = |check: &mut Check<'_>, field: &str| {
            if check.get(field).is_none() {
                return false;
            }
            match kind {
                Some(kind) if !Kind::applies(field, kind) => {
                    check.fail(field, Kind::misplaced(field));
                    false
                }
                _ => true,
            }
        };
        let shards = if applies(self, "shards") {
            self.shards()
        } else {
            None
        };
        if kind == Some(KindName::Sharded) && self.get("shards").is_none() {
            self.errors
                .push(FieldError::new("shards", None, Kind::missing_shards()));
        }
        if applies(self, "shard_params") {
            self.shard_params(shards);
        }
        if applies(self, "min_workers") {
            self.whole_number_in("min_workers", 1, MAX_WORKERS_PER_GROUP);
        }
        if applies(self, "map_depth") {
            self.whole_number_in("map_depth", 1, MAX_MAP_DEPTH);
        }
        if applies(self, "on_task_failure") {
            self.one_of("on_task_failure", TASK_FAILURE_VALUES);
        }
        if kind == Some(KindName::Workflow) {
            self.nodes();
        } else {
            applies(self, "nodes");
        }
    }

    /// `shards`: a whole number from 1 to [`MAX_SHARDS`], or `"workers"`.
    fn shards(&mut self) -> Option<Shards> {
        let value = self.get("shards")?;
        let range = format!("a whole number from 1 to {MAX_SHARDS}");
        let or_workers = "or \"workers\" for one shard per worker of the group online at the fire";
        let message = match value {
            Value::String(word) if word == Shards::WORKERS => {
                self.keep("shards");
                return Some(Shards::Workers);
            }
            Value::String(word) if word.trim().parse::<i64>().is_ok() => format!(
                "expected a number, found a string; write it without quotes: shards = {}",
                word.trim()
            ),
            Value::String(word) => match closest(&word.trim().to_lowercase(), [Shards::WORKERS]) {
                Some(near) => {
                    format!("unknown value; did you mean {near:?}? (use {range}, {or_workers})")
                }
                None => format!("unknown value; use {range}, {or_workers}"),
            },
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(count), _) if (1..=u64::from(MAX_SHARDS)).contains(&count) => {
                    self.keep("shards");
                    return u32::try_from(count).ok().map(Shards::Count);
                }
                (Some(count), _) if count > u64::from(MAX_SHARDS) => {
                    format!("too large: the limit is {MAX_SHARDS}; use {range}, {or_workers}")
                }
                (Some(_), _) | (None, Some(_)) => {
                    format!(
                        "too small: a sharded job has at least 1 shard; use {range}, {or_workers}"
                    )
                }
                _ => format!("expected {range}, {or_workers}"),
            },
            other => format!("expected {range}, {or_workers}; found {}", kind(other)),
        };
        self.fail("shards", message);
        None
    }

    /// `shard_params`: a list (entry `i` is shard `i`'s params) or a table keyed by shard
    /// index, stored as the list with `null` for the indexes not given. With a numeric `shards`
    /// every index must be below it; the list as JSON is bounded like `params`.
    fn shard_params(&mut self, shards: Option<Shards>) {
        let Some(value) = self.get("shard_params") else {
            return;
        };
        let example = "such as shard_params = [\"Beijing\", \"Shanghai\"] or shard_params = \
                       { 0 = \"Beijing\", 2 = \"Guangzhou\" } in TOML";
        let list: Vec<Value> = match value {
            Value::Array(items) => {
                if items.len() > MAX_SHARDS as usize {
                    self.fail(
                        "shard_params",
                        format!(
                            "{} entries; a sharded job has at most {MAX_SHARDS} shards, so give \
                             at most {MAX_SHARDS} entries",
                            items.len()
                        ),
                    );
                    return;
                }
                items.clone()
            }
            Value::Object(table) => {
                let mut indexed: Vec<(u32, &String, &Value)> = Vec::with_capacity(table.len());
                let mut bad = false;
                for (key, param) in table {
                    let index = key
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                        .then(|| key.parse::<u32>().ok())
                        .flatten()
                        .filter(|index| *index < MAX_SHARDS);
                    match index {
                        Some(index) => indexed.push((index, key, param)),
                        None => {
                            bad = true;
                            let field = format!("shard_params.{key}");
                            let message =
                                if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
                                    format!(
                                        "shard index too large: a sharded job has at most \
                                     {MAX_SHARDS} shards, numbered 0 to {}; use an index in \
                                     that range",
                                        MAX_SHARDS - 1
                                    )
                                } else {
                                    format!(
                                        "not a shard index; the keys of a shard_params table are \
                                     shard indexes, whole numbers from 0 to {}, {example}",
                                        MAX_SHARDS - 1
                                    )
                                };
                            self.errors
                                .push(FieldError::new(&field, Some(render(param)), message));
                        }
                    }
                }
                indexed.sort_by_key(|(index, _, _)| *index);
                for pair in indexed.windows(2) {
                    if let [(index, first, _), (next, second, param)] = pair
                        && index == next
                    {
                        bad = true;
                        self.errors.push(FieldError::new(
                            &format!("shard_params.{second}"),
                            Some(render(param)),
                            format!(
                                "shard {index} is given twice, as {first:?} and {second:?}; \
                                 keep one of the entries"
                            ),
                        ));
                    }
                }
                if bad {
                    return;
                }
                let len = indexed
                    .last()
                    .map_or(0, |(index, _, _)| *index as usize + 1);
                let mut list = vec![Value::Null; len];
                for (index, _, param) in indexed {
                    list[index as usize] = param.clone();
                }
                list
            }
            other => {
                self.fail(
                    "shard_params",
                    format!(
                        "expected a list (entry i is shard i's params) or a table keyed by \
                         shard index, found {}; write it {example}",
                        kind(other)
                    ),
                );
                return;
            }
        };
        if let Some(Shards::Count(count)) = shards {
            // The indexes given, each with the field naming it: a list gives every index up to
            // its length, a table only its keys.
            let given: Vec<(usize, String)> = match value {
                Value::Object(table) => {
                    let mut keys: Vec<(usize, String)> = table
                        .keys()
                        .filter_map(|key| Some((key.parse().ok()?, key.clone())))
                        .collect();
                    keys.sort();
                    keys
                }
                _ => (0..list.len()).map(|i| (i, i.to_string())).collect(),
            };
            let beyond: Vec<&(usize, String)> = given
                .iter()
                .filter(|(index, _)| *index >= count as usize)
                .collect();
            if let (Some((first, key)), Some((last, _))) = (beyond.first(), beyond.last()) {
                let (missing, drop) = if beyond.len() == 1 {
                    (format!("there is no shard {first}"), "the entry")
                } else {
                    (
                        format!(
                            "there are no shards {first} to {last} ({} entries)",
                            beyond.len()
                        ),
                        "those entries",
                    )
                };
                self.errors.push(FieldError::new(
                    &format!("shard_params.{key}"),
                    Some(render(&list[*first])),
                    format!(
                        "{missing}: shards = {count} numbers them 0 to {}; raise shards to {}, \
                         or drop {drop}",
                        count - 1,
                        last + 1
                    ),
                ));
                return;
            }
        }
        let list = Value::Array(list);
        let depth = nesting(&list);
        let message = if depth > MAX_NESTING {
            Some(format!(
                "nested {depth} levels deep (the list counts as one), more than the limit of \
                 {MAX_NESTING}; flatten the shard params"
            ))
        } else if holds_nul(&list) {
            Some(
                "holds a NUL character (\\u0000), which PostgreSQL cannot store; remove it or \
                 encode the data (base64, hex)"
                    .to_owned(),
            )
        } else {
            let size = json_len(&list);
            (size > MAX_PARAMS_BYTES).then(|| {
                format!(
                    "{size} bytes as JSON (stored as a list, with null for each index not \
                     given), more than the limit of {MAX_PARAMS_BYTES} bytes; pass a reference \
                     to the data (an id, a URL) instead of the data itself"
                )
            })
        };
        match message {
            Some(message) => self.fail("shard_params", message),
            None => {
                self.clean.insert("shard_params".to_owned(), list);
            }
        }
    }

    /// A whole number from `min` to `max`.
    fn whole_number_in(&mut self, field: &str, min: u32, max: u32) -> Option<u32> {
        let value = self.get(field)?;
        let range = format!("use a whole number from {min} to {max}");
        let message = match (value.as_u64(), value.as_i64()) {
            (Some(n), _) if (u64::from(min)..=u64::from(max)).contains(&n) => {
                self.keep(field);
                return u32::try_from(n).ok();
            }
            (Some(n), _) if n > u64::from(max) => {
                format!("too large: the limit is {max}; {range}")
            }
            (Some(_), _) | (None, Some(_)) => format!("too small: the least is {min}; {range}"),
            _ => format!("expected a whole number from {min} to {max}"),
        };
        self.fail(field, message);
        None
    }

    fn unknown_fields(&mut self) {
        self.unknown_keys(JOB_FIELDS);
    }

    fn unknown_keys(&mut self, fields: &[&str]) {
        let mut unknown: Vec<&String> = self
            .table
            .keys()
            .filter(|key| !fields.contains(&key.as_str()))
            .collect();
        unknown.sort();
        for key in unknown {
            let message = match closest(key, fields.iter().copied()) {
                Some(near) => format!("unknown field; did you mean {near:?}?"),
                None if key == "<<" => "unknown field; YAML merge keys (\"<<\") are not \
                                        supported, so write the shared fields out in each job"
                    .to_owned(),
                None => format!(
                    "unknown field; remove it, or use one of the fields: {}",
                    fields.join(", ")
                ),
            };
            let value = Some(render(&self.table[key]));
            self.errors.push(FieldError::new(key, value, message));
        }
    }

    /// A string field; anything else is a mistake.
    fn string(&mut self, field: &str) -> Option<&'a str> {
        match self.get(field)? {
            Value::String(text) => Some(text),
            other => {
                let message = match other {
                    Value::Number(_) | Value::Bool(_) => {
                        format!(
                            "expected a string, found {}; quote it: \"{other}\"",
                            kind(other)
                        )
                    }
                    _ => format!("expected a string, found {}", kind(other)),
                };
                self.fail(field, message);
                None
            }
        }
    }

    fn identifier(&mut self, field: &str, what: IdentifierKind) {
        if self.get(field).is_none() {
            let message = match what {
                IdentifierKind::Name => {
                    "missing; every job needs a unique name, such as \"close-unpaid-orders\""
                }
                IdentifierKind::Group => {
                    "missing; name the executor group whose workers run this job, such as \
                     \"orders\""
                }
            };
            self.errors.push(FieldError::new(field, None, message));
            return;
        }
        let Some(text) = self.string(field) else {
            return;
        };
        match identifier_problem(text) {
            None => self.keep(field),
            Some(problem) => {
                let why = match what {
                    IdentifierKind::Name => "",
                    IdentifierKind::Group => " (a group name is part of RabbitMQ queue names)",
                };
                let mut message = format!(
                    "invalid {field}: {problem}{why}; use 1 to {MAX_IDENTIFIER_LEN} characters \
                     from a-z, 0-9, \"_\", \".\" and \"-\", starting with a letter or digit"
                );
                let fixed = slug(text);
                if !fixed.is_empty() {
                    message.push_str(&format!(", such as {fixed:?}"));
                }
                self.fail(field, message);
            }
        }
    }

    fn timezone(&mut self) -> Option<Tz> {
        let text = self.string("timezone")?;
        match text.parse::<Tz>() {
            Ok(tz) => {
                self.keep("timezone");
                Some(tz)
            }
            Err(_) => {
                self.fail(
                    "timezone",
                    format!(
                        "unknown time zone; use an IANA name such as {}",
                        zone_suggestion(text)
                    ),
                );
                None
            }
        }
    }

    /// A humantime duration string ("30s", "5m", "1h30m").
    fn duration(&mut self, field: &str) -> Option<Duration> {
        let value = self.get(field)?;
        if let Value::Number(n) = value {
            self.fail(
                field,
                format!("a duration needs a unit; write it as a string such as \"{n}s\""),
            );
            return None;
        }
        let text = self.string(field)?;
        match humantime::parse_duration(text) {
            Ok(duration) => {
                self.keep(field);
                Some(duration)
            }
            Err(e) => {
                let reason = duration_problem(text, &e);
                self.fail(
                    field,
                    format!(
                        "invalid duration ({reason}); write a number with a unit, such as \
                         \"30s\", \"5m\" or \"1h30m\""
                    ),
                );
                None
            }
        }
    }

    /// [`Check::duration`] with an upper bound: a longer duration is a mistake naming the limit.
    /// `what` names the value in the message ("a timeout").
    fn duration_at_most(&mut self, field: &str, max: Duration, what: &str) -> Option<Duration> {
        let duration = self.duration(field)?;
        if duration <= max {
            return Some(duration);
        }
        self.clean.remove(field);
        self.fail(
            field,
            format!(
                "too long: {what} is at most {limit}; write a duration up to \"{limit}\"",
                limit = limit_text(max)
            ),
        );
        None
    }

    /// An RFC 3339 instant with its UTC offset (`at`, `start_at`, `end_at`).
    fn instant(&mut self, field: &str) {
        let Some(text) = self.string(field) else {
            return;
        };
        match DateTime::parse_from_rfc3339(text) {
            // A UTC offset can carry a four-digit year out of that range in UTC, which RFC 3339
            // (and so the API and the dashboard) cannot write.
            Ok(at) if !(0..=9999).contains(&at.to_utc().year()) => {
                self.fail(
                    field,
                    "the instant in UTC is outside the years 0000 to 9999; use an instant \
                     inside them, such as \"2026-12-01T00:00:00Z\"",
                );
            }
            Ok(at) => {
                self.clean
                    .insert(field.to_owned(), Value::String(at.to_rfc3339()));
            }
            Err(_) => {
                let trimmed = text.trim();
                let message = if NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%dT%H:%M:%S%.f")
                    .or_else(|_| NaiveDateTime::parse_from_str(trimmed, "%Y-%m-%d %H:%M:%S%.f"))
                    .is_ok()
                {
                    format!(
                        "no UTC offset, so the instant is ambiguous; add one, such as \
                         \"{trimmed}Z\" or \"{trimmed}+08:00\""
                    )
                } else if NaiveDate::parse_from_str(trimmed, "%Y-%m-%d").is_ok() {
                    format!(
                        "a date alone is not an instant; add a time and a UTC offset, such as \
                         \"{trimmed}T00:00:00Z\""
                    )
                } else {
                    "not an RFC 3339 instant; write a date, a time and a UTC offset, such as \
                     \"2026-12-01T00:00:00+08:00\" or \"2026-12-01T00:00:00Z\""
                        .to_owned()
                };
                self.fail(field, message);
            }
        }
    }

    fn params(&mut self) {
        let Some(value) = self.get("params") else {
            return;
        };
        match validate_params(value) {
            Ok(()) => self.keep("params"),
            Err(error) => self.errors.push(error),
        }
    }

    /// `calendar`: a declared calendar's name, returned to be resolved against the job files'
    /// `[calendars]`, or a calendar written out as a table, checked and kept.
    fn calendar(&mut self, calendars: Calendars) -> Option<String> {
        match self.get("calendar")? {
            Value::String(_) if calendars == Calendars::Inline => {
                self.fail(
                    "calendar",
                    "a calendar's name refers to a [calendars.NAME] table of the job files, \
                     which a definition sent to the API does not see; write the calendar out \
                     as a table, such as {\"weekdays\": [\"mon-fri\"]}"
                        .to_owned(),
                );
                None
            }
            Value::String(name) => {
                match identifier_problem(name) {
                    None => return Some(name.clone()),
                    Some(problem) => self.fail(
                        "calendar",
                        format!(
                            "invalid calendar name: {problem}; name a calendar declared as \
                             [calendars.NAME] in a job file"
                        ),
                    ),
                }
                None
            }
            Value::Object(table) => {
                match calendars::read_inline(table) {
                    Ok(def) => {
                        let value = serde_json::to_value(&def).unwrap_or(Value::Null);
                        self.clean.insert("calendar".into(), value);
                    }
                    Err(errors) => self.errors.extend(errors),
                }
                None
            }
            other => {
                let found = kind(other);
                self.fail(
                    "calendar",
                    format!(
                        "expected a calendar's name, such as \"cn-workdays\", or a calendar \
                         table, found {found}"
                    ),
                );
                None
            }
        }
    }

    /// One of a fixed set of lowercase words.
    fn one_of(&mut self, field: &str, allowed: &'static [&'static str]) -> Option<&'static str> {
        let text = self.string(field)?;
        if let Some(word) = allowed.iter().find(|word| **word == text) {
            self.keep(field);
            return Some(word);
        }
        let normalised = text.trim().to_lowercase().replace(['-', ' '], "_");
        let near = allowed
            .iter()
            .copied()
            .find(|word| *word == normalised)
            .or_else(|| closest(&normalised, allowed.iter().copied()));
        let choices = quoted_list(allowed, "or");
        let message = match near {
            Some(near) => format!("unknown value; did you mean {near:?}? (use {choices})"),
            None => format!("unknown value; use {choices}"),
        };
        self.fail(field, message);
        None
    }

    /// A whole number from 0 to `max`.
    fn whole_number(&mut self, field: &str, max: u32) -> Option<u32> {
        let value = self.get(field)?;
        match value.as_u64() {
            Some(n) if n <= u64::from(max) => {
                self.keep(field);
                u32::try_from(n).ok()
            }
            Some(_) => {
                self.fail(
                    field,
                    format!("too large: the limit is {max}; use a whole number from 0 to {max}"),
                );
                None
            }
            None => {
                self.fail(field, format!("expected a whole number from 0 to {max}"));
                None
            }
        }
    }

    fn boolean(&mut self, field: &str) {
        match self.get(field) {
            None => {}
            Some(Value::Bool(_)) => self.keep(field),
            Some(other) => {
                let message = format!("expected true or false, found {}", kind(other));
                self.fail(field, message);
            }
        }
    }
}

/// What kind of value this is, for "expected …, found …" messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "true/false",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

/// `"a", "b" and "c"` (or `or`, as `conjunction` says).
fn quoted_list(words: &[&str], conjunction: &str) -> String {
    let quoted: Vec<String> = words.iter().map(|word| format!("{word:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("{} {conjunction} {last}", rest.join(", "))
        }
        _ => quoted.join(""),
    }
}

/// What is wrong with an alert webhook URL, with the fix, or `None` if it is usable.
pub(super) fn webhook_problem(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest)
            if !rest.is_empty() && !rest.starts_with('/') && !url.contains(char::is_whitespace) =>
        {
            None
        }
        _ => Some(
            "expected an http:// or https:// URL, such as \"https://hooks.slack.com/services/…\""
                .to_owned(),
        ),
    }
}

/// What is wrong with a job or group name (or queue prefix), or `None` if it is valid.
pub(crate) fn identifier_problem(text: &str) -> Option<String> {
    let Some(first) = text.chars().next() else {
        return Some("it is empty".to_owned());
    };
    let len = text.chars().count();
    if len > MAX_IDENTIFIER_LEN {
        return Some(format!("{len} characters is too long"));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c);
    if let Some(c) = text.chars().find(|c| !allowed(*c)) {
        return Some(format!("{c:?} is not allowed"));
    }
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Some(format!("starts with {first:?}"));
    }
    None
}

/// A valid name derived from an invalid one ("Close Orders" → "close-orders"), possibly empty.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-') {
            c
        } else {
            '-'
        };
        if !(c == '-' && (out.is_empty() || out.ends_with('-'))) {
            out.push(c);
        }
    }
    let start = out
        .find(|c: char| c.is_ascii_alphanumeric())
        .unwrap_or(out.len());
    let mut out: String = out[start..].chars().take(MAX_IDENTIFIER_LEN).collect();
    while out.ends_with(['-', '_', '.']) {
        out.pop();
    }
    out
}

/// Common time-zone abbreviations (lower case) that are not IANA names, with the zones they
/// usually mean and what they stand for there. An abbreviation can mean several places (CST is
/// China's and the US Central time): every one is offered, the most populous first.
const ZONE_ABBREVIATIONS: &[(&str, &[(&str, &str)])] = &[
    (
        "cst",
        &[
            ("Asia/Shanghai", "China Standard Time"),
            ("America/Chicago", "US Central Time"),
        ],
    ),
    ("cdt", &[("America/Chicago", "US Central Time")]),
    ("est", &[("America/New_York", "US Eastern Time")]),
    ("edt", &[("America/New_York", "US Eastern Time")]),
    ("pst", &[("America/Los_Angeles", "US Pacific Time")]),
    ("pdt", &[("America/Los_Angeles", "US Pacific Time")]),
    (
        "mst",
        &[
            ("America/Denver", "US Mountain Time"),
            ("America/Phoenix", "Arizona"),
        ],
    ),
    ("mdt", &[("America/Denver", "US Mountain Time")]),
    ("akst", &[("America/Anchorage", "Alaska Time")]),
    ("hst", &[("Pacific/Honolulu", "Hawaii Time")]),
    ("cet", &[("Europe/Berlin", "Central European Time")]),
    ("cest", &[("Europe/Berlin", "Central European Time")]),
    ("eet", &[("Europe/Athens", "Eastern European Time")]),
    ("eest", &[("Europe/Athens", "Eastern European Time")]),
    ("wet", &[("Europe/Lisbon", "Western European Time")]),
    ("bst", &[("Europe/London", "British Time")]),
    ("msk", &[("Europe/Moscow", "Moscow Time")]),
    (
        "ist",
        &[
            ("Asia/Kolkata", "India Standard Time"),
            ("Europe/Dublin", "Irish Time"),
            ("Asia/Jerusalem", "Israel Time"),
        ],
    ),
    ("pkt", &[("Asia/Karachi", "Pakistan Time")]),
    ("wib", &[("Asia/Jakarta", "Western Indonesia Time")]),
    ("sgt", &[("Asia/Singapore", "Singapore Time")]),
    ("hkt", &[("Asia/Hong_Kong", "Hong Kong Time")]),
    ("jst", &[("Asia/Tokyo", "Japan Standard Time")]),
    ("kst", &[("Asia/Seoul", "Korea Standard Time")]),
    ("awst", &[("Australia/Perth", "Australian Western Time")]),
    ("acst", &[("Australia/Adelaide", "Australian Central Time")]),
    (
        "aest",
        &[
            ("Australia/Sydney", "Australian Eastern Time"),
            ("Australia/Brisbane", "Queensland, no daylight saving"),
        ],
    ),
    ("aedt", &[("Australia/Sydney", "Australian Eastern Time")]),
    ("nzst", &[("Pacific/Auckland", "New Zealand Time")]),
    ("nzdt", &[("Pacific/Auckland", "New Zealand Time")]),
    ("brt", &[("America/Sao_Paulo", "Brasilia Time")]),
];

/// The zone to suggest for an unknown one: the same name in its proper case, the zones a
/// common abbreviation stands for, a well-known alias, a zone whose name is a near miss, or a
/// plain example.
fn zone_suggestion(text: &str) -> String {
    let names = || chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name());
    let lower = text.trim().to_lowercase();
    if let Some((_, zones)) = ZONE_ABBREVIATIONS.iter().find(|(abbr, _)| *abbr == lower) {
        let offered: Vec<String> = zones
            .iter()
            .map(|(zone, meaning)| format!("{zone:?} ({meaning})"))
            .collect();
        return offered.join(" or ");
    }
    let exact = names().find(|name| name.to_lowercase() == lower);
    // Zones people expect to exist but the tz database names after another city.
    let alias = match lower.as_str() {
        "asia/beijing" | "beijing" | "china" => Some("Asia/Shanghai"),
        "india" | "asia/mumbai" | "asia/delhi" | "asia/new_delhi" => Some("Asia/Kolkata"),
        _ => None,
    };
    let near = || {
        let lowered: Vec<(String, &'static str)> =
            names().map(|name| (name.to_lowercase(), name)).collect();
        closest(&lower, lowered.iter().map(|(low, _)| low.as_str())).and_then(|low| {
            lowered
                .iter()
                .find(|(candidate, _)| candidate == low)
                .map(|(_, name)| *name)
        })
    };
    match exact.or(alias).or_else(near) {
        Some(name) => format!("{name:?}"),
        None => "\"Europe/Berlin\", \"America/New_York\" or \"UTC\"".to_owned(),
    }
}

/// A short account of why humantime rejected a duration.
pub(super) fn duration_problem(text: &str, error: &humantime::DurationError) -> String {
    use humantime::DurationError as E;
    let rest = |at: usize| text.get(at..).unwrap_or("").trim();
    match error {
        E::Empty => "empty".to_owned(),
        E::UnknownUnit { unit, value, .. } if unit.is_empty() => format!("no unit after {value}"),
        E::UnknownUnit { unit, .. } => format!("unknown unit {unit:?}"),
        E::NumberExpected(at) => format!("expected a number at {:?}", rest(*at)),
        E::InvalidCharacter(at) => match rest(*at).chars().next() {
            Some(c) => format!("unexpected character {c:?}"),
            None => "unexpected end".to_owned(),
        },
        E::NumberOverflow => "too large".to_owned(),
    }
}

mod nodes;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_children;
#[cfg(test)]
mod tests_kinds;
#[cfg(test)]
mod tests_timing;
#[cfg(test)]
mod tests_workflows;
