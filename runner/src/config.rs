//! The runner's config file: the worker (`[worker]`) and its handlers (`[[handlers]]`), read
//! with the `config` crate and checked field by field.
//!
//! Every mistake in the file is reported at once, one line each, naming the file, the handler,
//! the field, the value as written, what is wrong and how to fix it:
//! `runner.toml: handler "nightly-dump": field "argv[0]" = "{program}": …`. Every value has a
//! bound ([`limits`]); `docs/runner.md` is the reference for every key.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chime_protocol::limits::MAX_NAME_BYTES;
use serde::Deserialize;
use serde_json::Value;

use crate::http::HttpSpec;
use crate::params::{MAX_PARAM_VALUE_BYTES, kind};
use crate::shell::ShellSpec;

/// The bounds of every value in a runner config file.
pub mod limits {
    use std::time::Duration;

    /// Most handlers in one file.
    pub const MAX_HANDLERS: usize = 256;
    /// Longest timeout of a handler (the scheduler's limit for a job's timeout): 7 days.
    pub const MAX_TIMEOUT: Duration = chime_protocol::limits::MAX_TIMEOUT;
    /// Longest `kill_grace`: 10 minutes.
    pub const MAX_KILL_GRACE: Duration = Duration::from_secs(10 * 60);
    /// `kill_grace` when none is given: 10 seconds.
    pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
    /// Longest `drain_timeout` and `cancel_grace`: 1 hour.
    pub const MAX_DRAIN: Duration = Duration::from_secs(60 * 60);
    /// Most concurrent handlers of the worker.
    pub const MAX_CAPACITY: u16 = 1024;
    /// Largest `hold`.
    pub const MAX_HOLD: u16 = 10_000;
    /// Most argv elements.
    pub const MAX_ARGV: usize = 256;
    /// Longest argv element, URL, header value or environment value template, in bytes.
    pub const MAX_TEMPLATE_BYTES: usize = 4096;
    /// Longest `command` (with `shell = true`), in bytes.
    pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
    /// Most entries in `env`, `env_from_params`, `inherit_env`, `defaults` or `headers` each.
    pub const MAX_ENTRIES: usize = 256;
    /// `max_output` when none is given: 1 MiB.
    pub const DEFAULT_MAX_OUTPUT: u64 = 1024 * 1024;
    /// Largest `max_output` and `max_response`: 64 MiB.
    pub const MAX_MAX_OUTPUT: u64 = 64 * 1024 * 1024;
    /// Smallest `max_output` and `max_response`: 1 KiB.
    pub const MIN_MAX_OUTPUT: u64 = 1024;
    /// `max_response` when none is given: 64 KiB.
    pub const DEFAULT_MAX_RESPONSE: u64 = 64 * 1024;
    /// `timeout` of an HTTP handler when none is given: 30 seconds.
    pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(30);
    /// Most `allow` prefixes of an HTTP handler.
    pub const MAX_ALLOW: usize = 64;
    /// Largest request body after filling its placeholders: 1 MiB.
    pub const MAX_BODY_BYTES: usize = 1024 * 1024;
    /// What `cancel_grace` adds to the longest `kill_grace` when not set, so that a handler
    /// always finishes stopping its process group before the SDK abandons it.
    pub const CANCEL_GRACE_MARGIN: Duration = Duration::from_secs(5);
}

use limits::*;

/// Environment variables a param may never set (`env_from_params`): they change how programs
/// are loaded or how shells start, so a value from a trigger would run code of its choosing.
pub const FORBIDDEN_PARAM_ENV: &[&str] = &[
    "PATH",
    "IFS",
    "ENV",
    "BASH_ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "GCONV_PATH",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "NODE_OPTIONS",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
];

/// Which handler a [`ConfigError`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerRef {
    /// By its `name`.
    Name(String),
    /// By its position in the file, from 1, when it has no usable name.
    Index(usize),
}

impl fmt::Display for HandlerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerRef::Name(name) => write!(f, "handler {name:?}"),
            HandlerRef::Index(i) => write!(f, "handler #{i}"),
        }
    }
}

/// One mistake in the config file. `Display` gives the line users see:
/// `FILE[: handler "NAME"][: field "F"][ = VALUE]: PROBLEM; FIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The file as given.
    pub origin: String,
    /// The handler, for a mistake inside one.
    pub handler: Option<HandlerRef>,
    /// The field (`worker.capacity`, `argv[2]`, `headers.Authorization`).
    pub field: Option<String>,
    /// The value as written (strings quoted; secrets never shown).
    pub value: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(handler) = &self.handler {
            write!(f, ": {handler}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field {field:?}")?;
        }
        if let Some(value) = &self.value {
            write!(f, " = {value}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every mistake found in a config file, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    /// The messages, one per mistake.
    pub fn lines(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

/// A checked config file.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The worker.
    pub worker: WorkerSettings,
    /// The handlers, in file order; job names are unique.
    pub handlers: Vec<HandlerConfig>,
}

/// `[worker]`: what the SDK's builder gets. Unset URLs and prefix come from `CHIME_DATABASE_URL`,
/// `CHIME_AMQP_URL` and `CHIME_QUEUE_PREFIX` (read by the SDK), then the SDK's defaults.
#[derive(Clone)]
pub struct WorkerSettings {
    /// The executor group whose queue the runner consumes.
    pub group: String,
    /// Concurrent handlers.
    pub capacity: u16,
    /// Triggers held beyond running handlers (the SDK's default when `None`).
    pub hold: Option<u16>,
    /// The worker id (the SDK's default, `<host>-<pid>-<random>`, when `None`).
    pub worker_id: Option<String>,
    /// PostgreSQL URL.
    pub database_url: Option<String>,
    /// RabbitMQ URL.
    pub amqp_url: Option<String>,
    /// Several addresses of one RabbitMQ cluster, tried in order (`amqp_urls`; not with
    /// `amqp_url`).
    pub amqp_urls: Option<Vec<String>>,
    /// Queue name prefix.
    pub queue_prefix: Option<String>,
    /// How long a shutdown waits for running handlers before cancelling them.
    pub drain_timeout: Duration,
    /// How long a cancelled handler has to return; always longer than every `kill_grace`.
    pub cancel_grace: Duration,
}

impl fmt::Debug for WorkerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |u: &Option<String>| u.as_deref().map(chime_protocol::redact::redact_url);
        f.debug_struct("WorkerSettings")
            .field("group", &self.group)
            .field("capacity", &self.capacity)
            .field("hold", &self.hold)
            .field("worker_id", &self.worker_id)
            .field("database_url", &redact(&self.database_url))
            .field("amqp_url", &redact(&self.amqp_url))
            .field(
                "amqp_urls",
                &self.amqp_urls.as_ref().map(|urls| {
                    urls.iter()
                        .map(|url| chime_protocol::redact::redact_url(url))
                        .collect::<Vec<_>>()
                }),
            )
            .field("queue_prefix", &self.queue_prefix)
            .field("drain_timeout", &self.drain_timeout)
            .field("cancel_grace", &self.cancel_grace)
            .finish()
    }
}

/// One `[[handlers]]` entry.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// Its name (for messages and `--check`).
    pub name: String,
    /// The job it runs.
    pub job: String,
    /// What it does.
    pub spec: HandlerSpec,
}

/// What a handler does.
#[derive(Debug, Clone)]
pub enum HandlerSpec {
    /// `kind = "shell"`: runs a process.
    Shell(Arc<ShellSpec>),
    /// `kind = "http"`: calls an HTTP endpoint.
    Http(Arc<HttpSpec>),
}

impl HandlerSpec {
    /// `shell` or `http`.
    pub fn kind(&self) -> &'static str {
        match self {
            HandlerSpec::Shell(_) => "shell",
            HandlerSpec::Http(_) => "http",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    worker: Option<RawWorker>,
    #[serde(default)]
    handlers: Vec<RawHandler>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    group: Option<String>,
    capacity: Option<i64>,
    hold: Option<i64>,
    worker_id: Option<String>,
    database_url: Option<String>,
    amqp_url: Option<String>,
    amqp_urls: Option<Vec<String>>,
    queue_prefix: Option<String>,
    drain_timeout: Option<String>,
    cancel_grace: Option<String>,
}

/// A `[[handlers]]` table as written; each kind reads its own fields and refuses the others'.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHandler {
    pub name: Option<String>,
    pub job: Option<String>,
    pub kind: Option<String>,
    pub timeout: Option<String>,
    pub defaults: Option<BTreeMap<String, Value>>,
    // shell
    pub argv: Option<Vec<String>>,
    pub shell: Option<bool>,
    pub command: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub env_from_params: Option<Vec<String>>,
    pub inherit_env: Option<Value>,
    pub workdir: Option<String>,
    pub kill_grace: Option<String>,
    pub max_output: Option<Value>,
    pub retry_codes: Option<Vec<i64>>,
    pub fail_codes: Option<Vec<i64>>,
    pub other_codes: Option<String>,
    pub allow_option_params: Option<bool>,
    // http
    pub method: Option<String>,
    pub url: Option<String>,
    pub allow: Option<Vec<String>>,
    pub headers: Option<BTreeMap<String, String>>,
    pub body: Option<Value>,
    pub expect: Option<Vec<Value>>,
    pub retry_statuses: Option<Vec<Value>>,
    pub max_response: Option<Value>,
}

impl RawHandler {
    /// The fields of the other kinds that are set, by name.
    fn set_fields(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        let mut mark = |name, present: bool| {
            if present {
                set.push(name)
            }
        };
        mark("argv", self.argv.is_some());
        mark("shell", self.shell.is_some());
        mark("command", self.command.is_some());
        mark("env", self.env.is_some());
        mark("env_from_params", self.env_from_params.is_some());
        mark("inherit_env", self.inherit_env.is_some());
        mark("workdir", self.workdir.is_some());
        mark("kill_grace", self.kill_grace.is_some());
        mark("max_output", self.max_output.is_some());
        mark("retry_codes", self.retry_codes.is_some());
        mark("fail_codes", self.fail_codes.is_some());
        mark("other_codes", self.other_codes.is_some());
        mark("allow_option_params", self.allow_option_params.is_some());
        mark("method", self.method.is_some());
        mark("url", self.url.is_some());
        mark("allow", self.allow.is_some());
        mark("headers", self.headers.is_some());
        mark("body", self.body.is_some());
        mark("expect", self.expect.is_some());
        mark("retry_statuses", self.retry_statuses.is_some());
        mark("max_response", self.max_response.is_some());
        set
    }
}

/// The fields only shell handlers take.
const SHELL_FIELDS: &[&str] = &[
    "argv",
    "shell",
    "command",
    "env",
    "env_from_params",
    "inherit_env",
    "workdir",
    "kill_grace",
    "max_output",
    "retry_codes",
    "fail_codes",
    "other_codes",
    "allow_option_params",
];

/// The mistakes found in one part of the file (the worker, or one handler).
pub(crate) struct Check<'a> {
    origin: &'a str,
    handler: Option<HandlerRef>,
    errors: &'a mut Vec<ConfigError>,
}

/// Renders a string value for a message: quoted, cut to 80 characters.
pub(crate) fn quoted(text: &str) -> String {
    format!("{:?}", crate::params::excerpt(text, 80))
}

impl Check<'_> {
    /// Mistakes recorded so far (of the whole file).
    pub(crate) fn errors_len(&self) -> usize {
        self.errors.len()
    }

    /// Records a mistake in `field` (its value rendered already, or `None`).
    pub(crate) fn error(&mut self, field: &str, value: Option<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            origin: self.origin.to_owned(),
            handler: self.handler.clone(),
            field: Some(field.to_owned()),
            value,
            message: message.into(),
        });
    }

    /// Records a mistake in string field `field`.
    pub(crate) fn bad(&mut self, field: &str, value: &str, message: impl Into<String>) {
        self.error(field, Some(quoted(value)), message);
    }

    /// A duration within `(0, max]`, or `None` (recorded) when it is not one.
    pub(crate) fn duration(&mut self, field: &str, text: &str, max: Duration) -> Option<Duration> {
        match humantime::parse_duration(text) {
            Ok(d) if d.is_zero() => {
                self.bad(field, text, "must be longer than 0, such as \"30s\"");
                None
            }
            Ok(d) if d > max => {
                self.bad(
                    field,
                    text,
                    format!(
                        "is longer than the limit of {}; give a shorter duration",
                        humantime::format_duration(max)
                    ),
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.bad(
                    field,
                    text,
                    format!("is not a duration ({e}); write it like \"30s\", \"5m\" or \"1h30m\""),
                );
                None
            }
        }
    }

    /// A size in bytes within `[min, max]` (an integer, or a string such as "1MiB").
    pub(crate) fn bytes(&mut self, field: &str, value: &Value, min: u64, max: u64) -> Option<u64> {
        let parsed = match value {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => crate::output::parse_bytes(s),
            _ => None,
        };
        let human = crate::output::human_bytes;
        match parsed {
            Some(n) if (min..=max).contains(&n) => Some(n),
            Some(_) => {
                self.error(
                    field,
                    Some(crate::params::excerpt(&value.to_string(), 80)),
                    format!("must be between {} and {}", human(min), human(max)),
                );
                None
            }
            None => {
                self.error(
                    field,
                    Some(crate::params::excerpt(&value.to_string(), 80)),
                    "is not a size: write a number of bytes or a string such as \"64KiB\" or \
                     \"1MiB\"",
                );
                None
            }
        }
    }

    /// Checks a list length against `max`.
    pub(crate) fn count(&mut self, field: &str, len: usize, max: usize) -> bool {
        if len > max {
            self.error(
                field,
                Some(format!("{len} entries")),
                format!("has more than {max} entries; split the handler or trim the list"),
            );
            false
        } else {
            true
        }
    }

    /// The `defaults` table: param name → string or number, as text.
    pub(crate) fn defaults(&mut self, raw: &RawHandler) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Some(defaults) = &raw.defaults else {
            return out;
        };
        if !self.count("defaults", defaults.len(), MAX_ENTRIES) {
            return out;
        }
        for (name, value) in defaults {
            let field = format!("defaults.{name}");
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    self.error(
                        &field,
                        Some(crate::params::excerpt(&other.to_string(), 80)),
                        format!("is {}; a default is a string or a number", kind(other)),
                    );
                    continue;
                }
            };
            if text.len() > MAX_PARAM_VALUE_BYTES || text.contains('\0') {
                self.bad(
                    &field,
                    &text,
                    format!("must be at most {MAX_PARAM_VALUE_BYTES} bytes without NUL bytes"),
                );
                continue;
            }
            out.insert(name.clone(), text);
        }
        out
    }
}

/// Why a name does not fit Chime's names (lower-case letters, digits, `_`, `.`, `-`; starting
/// with a letter or digit; at most 63 bytes), or `None` when it fits.
pub fn name_problem(text: &str) -> Option<String> {
    let Some(first) = text.chars().next() else {
        return Some("is empty; give a name such as \"ops\"".to_owned());
    };
    if text.len() > MAX_NAME_BYTES {
        return Some(format!("is longer than {MAX_NAME_BYTES} bytes"));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c);
    if let Some(c) = text.chars().find(|c| !allowed(*c)) {
        return Some(format!(
            "contains {c:?}; use lower-case letters, digits, `_`, `.` and `-`"
        ));
    }
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Some("must start with a lower-case letter or a digit".to_owned());
    }
    None
}

/// True for a usable environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads and checks the config file at `path` (TOML).
pub fn load(path: &Path) -> Result<RunnerConfig, ConfigErrors> {
    let origin = path.display().to_string();
    let at = |message: String| {
        ConfigErrors(vec![ConfigError {
            origin: origin.clone(),
            handler: None,
            field: None,
            value: None,
            message,
        }])
    };
    let meta = std::fs::metadata(path).map_err(|e| {
        at(format!(
            "cannot read it ({e}); pass an existing file to --config"
        ))
    })?;
    if meta.len() > 1024 * 1024 {
        return Err(at(format!(
            "is {} bytes; a runner config is at most 1 MiB",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| at(format!("cannot read it ({e}); pass a readable UTF-8 file")))?;
    parse(&origin, &text)
}

/// Checks config `text` (TOML) read from `origin`.
pub fn parse(origin: &str, text: &str) -> Result<RunnerConfig, ConfigErrors> {
    let at = |message: String| {
        ConfigErrors(vec![ConfigError {
            origin: origin.to_owned(),
            handler: None,
            field: None,
            value: None,
            message,
        }])
    };
    let raw: RawFile = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .build()
        .and_then(|c| c.try_deserialize())
        .map_err(|e| {
            at(format!(
                "{e}; see docs/runner.md for the keys and their types"
            ))
        })?;
    let mut errors = Vec::new();
    let handlers = check_handlers(origin, &raw.handlers, &mut errors);
    let worker = check_worker(
        origin,
        &raw.worker.unwrap_or_default(),
        &handlers,
        &mut errors,
    );
    match worker {
        Some(worker) if errors.is_empty() => Ok(RunnerConfig { worker, handlers }),
        _ => Err(ConfigErrors(errors)),
    }
}

fn check_worker(
    origin: &str,
    raw: &RawWorker,
    handlers: &[HandlerConfig],
    errors: &mut Vec<ConfigError>,
) -> Option<WorkerSettings> {
    let mut check = Check {
        origin,
        handler: None,
        errors,
    };
    let group = match raw.group.as_deref() {
        None => {
            check.error(
                "worker.group",
                None,
                "missing; name the executor group whose jobs this runner runs, such as \
                 group = \"ops\"",
            );
            None
        }
        Some(g) => match name_problem(g) {
            Some(problem) => {
                check.bad("worker.group", g, problem);
                None
            }
            None => Some(g.to_owned()),
        },
    };
    let capacity = match raw.capacity {
        None => Some(chime_worker::DEFAULT_CAPACITY),
        Some(c) if (1..=i64::from(MAX_CAPACITY)).contains(&c) => Some(c as u16),
        Some(c) => {
            check.error(
                "worker.capacity",
                Some(c.to_string()),
                format!("must be between 1 and {MAX_CAPACITY} concurrent handlers"),
            );
            None
        }
    };
    let hold = match raw.hold {
        None => Some(None),
        Some(h) if (0..=i64::from(MAX_HOLD)).contains(&h) => Some(Some(h as u16)),
        Some(h) => {
            check.error(
                "worker.hold",
                Some(h.to_string()),
                format!("must be between 0 and {MAX_HOLD} triggers"),
            );
            None
        }
    };
    if let Some(id) = &raw.worker_id
        && (id.is_empty() || id.len() > MAX_NAME_BYTES || id.chars().any(char::is_control))
    {
        check.bad(
            "worker.worker_id",
            id,
            format!("must be 1 to {MAX_NAME_BYTES} bytes without control characters"),
        );
    }
    for (field, url, schemes) in [
        (
            "worker.database_url",
            &raw.database_url,
            &["postgres", "postgresql"][..],
        ),
        ("worker.amqp_url", &raw.amqp_url, &["amqp", "amqps"][..]),
    ] {
        if let Some(url) = url {
            let scheme = url.split_once("://").map(|(s, _)| s);
            if !scheme.is_some_and(|s| schemes.contains(&s)) || url.len() > 4096 {
                check.error(
                    field,
                    Some(quoted(&chime_protocol::redact::redact_url(url))),
                    format!(
                        "must be a {}:// URL of at most 4096 bytes (or leave it out and set the \
                         CHIME_{} environment variable)",
                        schemes[0],
                        field.trim_start_matches("worker.").to_uppercase()
                    ),
                );
            }
        }
    }
    if let Some(urls) = &raw.amqp_urls {
        let shown = || {
            let redacted: Vec<String> = urls
                .iter()
                .map(|url| chime_protocol::redact::redact_url(url))
                .collect();
            format!("{redacted:?}")
        };
        if raw.amqp_url.is_some() {
            check.error(
                "worker.amqp_urls",
                Some(shown()),
                "worker.amqp_url is set too; give one address as amqp_url or several as \
                 amqp_urls, not both (put the amqp_url address into the list and remove it)",
            );
        } else if let Err(problem) = chime_protocol::addresses::check_count(urls.len()) {
            check.error("worker.amqp_urls", Some(shown()), problem.to_string());
        }
        for (index, url) in urls.iter().enumerate() {
            let scheme = url.split_once("://").map(|(s, _)| s);
            if !scheme.is_some_and(|s| ["amqp", "amqps"].contains(&s)) || url.len() > 4096 {
                check.error(
                    "worker.amqp_urls",
                    Some(quoted(&chime_protocol::redact::redact_url(url))),
                    format!(
                        "address {} of {}: must be an amqp:// or amqps:// URL of at most 4096 \
                         bytes",
                        index + 1,
                        urls.len()
                    ),
                );
            }
        }
    }
    if let Some(prefix) = &raw.queue_prefix
        && let Some(problem) = name_problem(prefix)
    {
        check.bad("worker.queue_prefix", prefix, problem);
    }
    let drain_timeout = match &raw.drain_timeout {
        None => Some(chime_worker::DEFAULT_DRAIN_TIMEOUT),
        Some(text) => check.duration("worker.drain_timeout", text, MAX_DRAIN),
    };
    let longest_kill_grace = handlers
        .iter()
        .filter_map(|h| match &h.spec {
            HandlerSpec::Shell(s) => Some(s.kill_grace),
            HandlerSpec::Http(_) => None,
        })
        .max()
        .unwrap_or(Duration::ZERO);
    let cancel_grace = match &raw.cancel_grace {
        None => {
            Some(chime_worker::DEFAULT_CANCEL_GRACE.max(longest_kill_grace + CANCEL_GRACE_MARGIN))
        }
        Some(text) => match check.duration("worker.cancel_grace", text, MAX_DRAIN) {
            Some(g) if g <= longest_kill_grace => {
                check.bad(
                    "worker.cancel_grace",
                    text,
                    format!(
                        "must be longer than the longest kill_grace of the handlers ({}), or a \
                         handler would be abandoned before it has stopped its processes; leave \
                         it out to get kill_grace + {}",
                        humantime::format_duration(longest_kill_grace),
                        humantime::format_duration(CANCEL_GRACE_MARGIN)
                    ),
                );
                None
            }
            other => other,
        },
    };
    if handlers.is_empty() && check.errors.is_empty() {
        check.error(
            "handlers",
            None,
            "no handlers: add at least one [[handlers]] table with a name, a job and a kind",
        );
    }
    Some(WorkerSettings {
        group: group?,
        capacity: capacity?,
        hold: hold?,
        worker_id: raw.worker_id.clone(),
        database_url: raw.database_url.clone(),
        amqp_url: raw.amqp_url.clone(),
        amqp_urls: raw.amqp_urls.clone(),
        queue_prefix: raw.queue_prefix.clone(),
        drain_timeout: drain_timeout?,
        cancel_grace: cancel_grace?,
    })
}

fn check_handlers(
    origin: &str,
    raws: &[RawHandler],
    errors: &mut Vec<ConfigError>,
) -> Vec<HandlerConfig> {
    let mut handlers = Vec::new();
    if raws.len() > MAX_HANDLERS {
        errors.push(ConfigError {
            origin: origin.to_owned(),
            handler: None,
            field: Some("handlers".into()),
            value: Some(format!("{} handlers", raws.len())),
            message: format!("at most {MAX_HANDLERS} handlers per runner; run several runners"),
        });
        return handlers;
    }
    let mut names = BTreeSet::new();
    let mut jobs: BTreeMap<String, String> = BTreeMap::new();
    for (index, raw) in raws.iter().enumerate() {
        let usable_name = raw.name.as_deref().filter(|n| name_problem(n).is_none());
        let handler = match usable_name {
            Some(n) => HandlerRef::Name(n.to_owned()),
            None => HandlerRef::Index(index + 1),
        };
        let mut check = Check {
            origin,
            handler: Some(handler),
            errors,
        };
        match raw.name.as_deref() {
            None => check.error(
                "name",
                None,
                "missing; give every handler a unique name, such as \"nightly-dump\"",
            ),
            Some(n) => {
                if let Some(problem) = name_problem(n) {
                    check.bad("name", n, problem);
                } else if !names.insert(n.to_owned()) {
                    check.bad(
                        "name",
                        n,
                        "is used by another handler; names must be unique",
                    );
                }
            }
        }
        // The job defaults to the handler's name.
        let job = raw.job.clone().or_else(|| usable_name.map(str::to_owned));
        if let Some(job) = &job {
            match name_problem(job) {
                Some(problem) => check.bad("job", job, problem),
                None => {
                    if let Some(other) = jobs.get(job) {
                        check.bad(
                            "job",
                            job,
                            format!(
                                "is already bound to handler {other:?}; a job has one handler: \
                                 remove one of them"
                            ),
                        );
                    } else {
                        jobs.insert(job.clone(), usable_name.unwrap_or("(unnamed)").to_owned());
                    }
                }
            }
        }
        let before = check.errors.len();
        let spec = match raw.kind.as_deref() {
            None => {
                check.error(
                    "kind",
                    None,
                    "missing; set kind = \"shell\" or kind = \"http\"",
                );
                None
            }
            Some("shell") => {
                refuse_foreign(&mut check, raw, "shell", |f| SHELL_FIELDS.contains(&f));
                crate::shell::spec(raw, &mut check).map(|s| HandlerSpec::Shell(Arc::new(s)))
            }
            Some("http") => {
                refuse_foreign(&mut check, raw, "http", |f| !SHELL_FIELDS.contains(&f));
                crate::http::spec(raw, &mut check).map(|s| HandlerSpec::Http(Arc::new(s)))
            }
            Some(other) => {
                check.bad(
                    "kind",
                    other,
                    "is not a handler kind: use \"shell\" or \"http\"",
                );
                None
            }
        };
        if let (Some(spec), Some(job), Some(name)) = (spec, job, usable_name)
            && check.errors.len() == before
        {
            handlers.push(HandlerConfig {
                name: name.to_owned(),
                job,
                spec,
            });
        }
    }
    handlers
}

/// Records every field set on `raw` that kind `kind` does not take.
fn refuse_foreign(check: &mut Check<'_>, raw: &RawHandler, kind: &str, own: impl Fn(&str) -> bool) {
    for field in raw.set_fields() {
        if !own(field) {
            let other = if kind == "shell" { "http" } else { "shell" };
            check.error(
                field,
                None,
                format!(
                    "is a field of kind = \"{other}\" handlers; remove it from this {kind} handler"
                ),
            );
        }
    }
}
