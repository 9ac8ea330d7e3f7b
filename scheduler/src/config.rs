//! Configuration: the scheduler's settings (a settings file plus `CHIME_*` environment variables)
//! and the job files that declare jobs.
//!
//! Both are read with the `config` crate into a generic value tree and then checked key by key,
//! so that every mistake in every file is reported at once rather than the first one only. Each
//! mistake is a [`ConfigError`]: one line naming the file (or environment variable), the job, the
//! field, the value as written, what is wrong and how to fix it. `docs/configuration.md` is the
//! reference for every key and for this error format; tests assert the exact lines, so treat a
//! change of wording as a change of interface.

mod calendars;
mod children;
#[cfg(test)]
mod corpus;
#[cfg(test)]
mod entries;
#[cfg(test)]
mod extremes;
mod jobs;
mod settings;
mod suggest;
mod workflows;

use std::fmt;

pub(crate) use children::api_link_problems;
pub use jobs::{
    JOB_FIELDS, SourceFormat, expand_job_patterns, load_job_files, parse_job_file, validate_job,
    validate_params,
};
pub(crate) use jobs::{LoadedJob, identifier_problem, load_located_jobs};
pub use settings::{
    ALERT_GROUP_KEYS, AlertSettings, DEFAULT_AMQP_URL, DEFAULT_BIND, DEFAULT_DATABASE_URL,
    DEFAULT_QUEUE_PREFIX, FILE_SETTINGS, GroupAlertSettings, LeaderSettings, PlannerSettings,
    RescuerSettings, RetentionSettings, SETTINGS_KEYS, Settings, default_instance_id, host_name,
    webhook_target,
};
pub(crate) use workflows::api_node_problems;

/// Which job a [`ConfigError`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRef {
    /// The job's `name`, when it has a usable one.
    Name(String),
    /// The job's position in its file's `jobs` list, counted from 1, when it has no usable name.
    Index(usize),
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobRef::Name(name) => write!(f, "job {name:?}"),
            JobRef::Index(index) => write!(f, "job #{index}"),
        }
    }
}

/// A mistake in one field of one job, independent of which file (or API request) it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field (a dotted path for nested values such as `params.ratio`); `None` when the
    /// mistake is about the combination of fields or the job as a whole.
    pub field: Option<String>,
    /// The value as written, rendered compactly (strings quoted); `None` when it is missing.
    pub value: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl FieldError {
    fn new(field: &str, value: Option<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            field: Some(field.to_owned()),
            value,
            message: message.into(),
        }
    }
}

/// One mistake in a settings file, a job file or a settings environment variable.
///
/// `Display` gives the one-line message users see:
/// `ORIGIN[: job "NAME" | job #N][: field "F" | key "K"][ = VALUE]: PROBLEM; FIX`.
/// Fields of jobs are called `field`; keys of a settings file or of a job file's top level are
/// called `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// Where: a file path as given, or `environment variable CHIME_…`.
    pub origin: String,
    /// Which job, for a mistake inside a job table.
    pub job: Option<JobRef>,
    /// Which field or key (dotted for nested ones).
    pub key: Option<String>,
    /// The value as written, rendered compactly (strings quoted).
    pub value: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ConfigError {
    /// A mistake about a whole file or variable (unreadable, not valid TOML, …).
    pub(crate) fn at(origin: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            origin: origin.into(),
            job: None,
            key: None,
            value: None,
            message: message.into(),
        }
    }

    /// A mistake about one key of a file.
    pub(crate) fn key(
        origin: impl Into<String>,
        key: impl Into<String>,
        value: Option<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            origin: origin.into(),
            job: None,
            key: Some(key.into()),
            value,
            message: message.into(),
        }
    }

    /// A [`FieldError`] placed in its file and job.
    pub(crate) fn in_job(origin: &str, job: &JobRef, error: FieldError) -> ConfigError {
        ConfigError {
            origin: origin.to_owned(),
            job: Some(job.clone()),
            key: error.field,
            value: error.value,
            message: error.message,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(job) = &self.job {
            write!(f, ": {job}")?;
        }
        if let Some(key) = &self.key {
            let noun = if self.job.is_some() { "field" } else { "key" };
            write!(f, ": {noun} {key:?}")?;
        }
        if let Some(value) = &self.value {
            write!(f, " = {value}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every mistake found while loading settings or job files; `Display` puts one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The messages, one per mistake, in the order they were found (file by file, job by job).
    pub fn lines(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> ConfigErrors {
        ConfigErrors(vec![error])
    }
}

/// Longest rendering of a value inside a message; longer ones are cut with "…".
const MAX_RENDERED: usize = 80;

/// Renders a value the way messages quote it: compact JSON, cut at [`MAX_RENDERED`] characters.
fn render(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_RENDERED {
        text
    } else {
        let cut: String = text.chars().take(MAX_RENDERED - 1).collect();
        format!("{cut}…")
    }
}

/// Renders a `config` value; non-finite floats (which JSON lacks) are written as in the file.
fn render_config(value: &config::Value) -> String {
    match &value.kind {
        config::ValueKind::Float(x) if !x.is_finite() => x.to_string(),
        _ => render(&to_json(value, "", &mut Vec::new())),
    }
}

/// A value that has no JSON form, found while converting a `config` tree.
struct NotJson {
    /// Dotted path below the converted value, empty for the value itself.
    path: String,
    /// The value as written.
    value: String,
    /// Why JSON cannot hold it, and the fix.
    message: &'static str,
}

/// Converts a `config` value tree into JSON. Values JSON cannot hold (NaN, infinities, integers
/// beyond 64 bits) are recorded in `bad` and replaced by `null`.
fn to_json(value: &config::Value, path: &str, bad: &mut Vec<NotJson>) -> serde_json::Value {
    use config::ValueKind;
    use serde_json::Value as Json;

    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match &value.kind {
        ValueKind::Nil => Json::Null,
        ValueKind::Boolean(b) => Json::Bool(*b),
        ValueKind::I64(n) => Json::from(*n),
        ValueKind::U64(n) => Json::from(*n),
        ValueKind::I128(n) => match i64::try_from(*n) {
            Ok(n) => Json::from(n),
            Err(_) => {
                bad.push(NotJson {
                    path: path.to_owned(),
                    value: n.to_string(),
                    message: "integer too large for JSON; quote it as a string",
                });
                Json::Null
            }
        },
        ValueKind::U128(n) => match u64::try_from(*n) {
            Ok(n) => Json::from(n),
            Err(_) => {
                bad.push(NotJson {
                    path: path.to_owned(),
                    value: n.to_string(),
                    message: "integer too large for JSON; quote it as a string",
                });
                Json::Null
            }
        },
        ValueKind::Float(x) => match serde_json::Number::from_f64(*x) {
            Some(n) => Json::Number(n),
            None => {
                bad.push(NotJson {
                    path: path.to_owned(),
                    value: x.to_string(),
                    message: "JSON has no NaN or infinity; use a finite number, or quote it as a \
                              string",
                });
                Json::Null
            }
        },
        ValueKind::String(s) => Json::String(s.clone()),
        ValueKind::Array(items) => Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(item, &join(&i.to_string()), bad))
                .collect(),
        ),
        ValueKind::Table(table) => {
            // Sort keys so that conversion (and so every message order) is deterministic
            // whichever map type `config` was built with.
            let mut keys: Vec<&String> = table.keys().collect();
            keys.sort();
            Json::Object(
                keys.into_iter()
                    .map(|key| (key.clone(), to_json(&table[key], &join(key), bad)))
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_line_with_every_part() {
        let error = ConfigError {
            origin: "jobs.toml".into(),
            job: Some(JobRef::Name("close-unpaid-orders".into())),
            key: Some("timezone".into()),
            value: Some("\"Europe/Berln\"".into()),
            message: "unknown time zone; use an IANA name such as \"Europe/Berlin\"".into(),
        };
        assert_eq!(
            error.to_string(),
            r#"jobs.toml: job "close-unpaid-orders": field "timezone" = "Europe/Berln": unknown time zone; use an IANA name such as "Europe/Berlin""#
        );
    }

    #[test]
    fn error_line_without_job_says_key_and_without_value_skips_it() {
        let error = ConfigError::key("chime.toml", "bind", None, "missing");
        assert_eq!(error.to_string(), r#"chime.toml: key "bind": missing"#);
        let error = ConfigError::at("jobs.toml", "cannot read: gone");
        assert_eq!(error.to_string(), "jobs.toml: cannot read: gone");
    }

    #[test]
    fn errors_display_one_per_line() {
        let errors = ConfigErrors(vec![
            ConfigError::at("a.toml", "one"),
            ConfigError::at("b.toml", "two"),
        ]);
        assert_eq!(errors.to_string(), "a.toml: one\nb.toml: two");
        assert_eq!(errors.lines(), ["a.toml: one", "b.toml: two"]);
    }

    #[test]
    fn long_values_are_cut() {
        let long = serde_json::Value::String("x".repeat(200));
        let rendered = render(&long);
        assert_eq!(rendered.chars().count(), MAX_RENDERED);
        assert!(rendered.ends_with('…'));
    }

    #[test]
    fn non_finite_floats_are_reported_with_their_path() {
        let mut table = config::Map::new();
        table.insert(
            "ratio".to_owned(),
            config::Value::new(None, config::ValueKind::Float(f64::NAN)),
        );
        table.insert("ok".to_owned(), config::Value::new(None, 1.5));
        let value = config::Value::new(None, config::ValueKind::Table(table));
        let mut bad = Vec::new();
        let json = to_json(&value, "params", &mut bad);
        assert_eq!(json, serde_json::json!({"ok": 1.5, "ratio": null}));
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].path, "params.ratio");
        assert_eq!(bad[0].value, "NaN");
    }
}
