//! The scheduler's settings: defaults for a local development machine, overlaid by an optional
//! settings file (TOML or YAML), overlaid by `CHIME_*` environment variables.
//!
//! Secrets belong in the environment: a settings file is usually committed or baked into an
//! image, so `database_url` and `amqp_url` with passwords should come from `CHIME_DATABASE_URL`
//! and `CHIME_AMQP_URL`. Messages and `Debug` output never show a URL's password
//! ([`chime_protocol::redact::redact_url`]).
//!
//! TLS: `amqp_tls.*` name the CA file and client certificate of an `amqps://` broker URL; the
//! database URL carries libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey`. Every file
//! they name is read and checked here, so a missing or invalid one is reported at start, naming
//! the setting.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chime_protocol::addresses::Addresses;
use chime_protocol::limits::{
    MAX_ALERT_INTERVAL, MAX_BATCH_SIZE, MAX_CONSECUTIVE_FAILURES, MAX_DUTY_INTERVAL, MAX_LEASE_TTL,
    MAX_LOOKAHEAD, MAX_RESCUE_WAIT, MAX_RETENTION,
};
use chime_protocol::redact::redact_url;
use chime_protocol::secret_file::FILE_SUFFIX;
use chime_protocol::tls::AmqpTls;
use config::{Source, ValueKind};

use super::jobs::{
    ALERT_FORMATS, duration_problem, identifier_problem, limit_text, webhook_problem,
};
use super::suggest::{closest, distance};
use super::{ConfigError, ConfigErrors, SourceFormat, render_config};
use crate::job::{AlertFormat, JobSpec};

/// Default `database_url`: the development machine's PostgreSQL, trust auth.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/chime";
/// Default `amqp_url`: the development machine's RabbitMQ, default vhost.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Default `bind`: API, dashboard and metrics on loopback only.
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";
/// Default `queue_prefix`: the protocol's, which workers default to as well.
pub const DEFAULT_QUEUE_PREFIX: &str = chime_protocol::topology::DEFAULT_PREFIX;

/// Every settings key, dotted for keys inside a section (`[leader]` → `leader.lease_ttl`). The
/// environment variable of a key is `CHIME_` + the key in capitals with `.` written as `__`.
pub const SETTINGS_KEYS: &[&str] = &[
    "database_url",
    "amqp_url",
    "amqp_urls",
    "amqp_tls.ca_file",
    "amqp_tls.cert_file",
    "amqp_tls.key_file",
    "management_url",
    "instance_id",
    "bind",
    "queue_prefix",
    "jobs",
    "watch",
    "leader.lease_ttl",
    "leader.renew_interval",
    "planner.lookahead",
    "rescuer.interval",
    "rescuer.rescue_after",
    "rescuer.retry_slack",
    "alerts.webhook",
    "alerts.format",
    "alerts.min_interval",
    "alerts.consecutive_failures",
    "retention.max_age",
    "retention.interval",
    "retention.batch_size",
    "retention.audit_max_age",
];

/// Keys of one group's alert overrides, `alerts.groups.<group>.<key>`.
pub const ALERT_GROUP_KEYS: &[&str] =
    &["webhook", "format", "min_interval", "consecutive_failures"];

/// Settings whose value may come from a file instead: `CHIME_<KEY>_FILE` names a file holding
/// it (a Kubernetes or Docker secret mounted as a file), and `CHIME_<KEY>` is then left unset.
/// A group's `alerts.groups.<group>.webhook` may too.
pub const FILE_SETTINGS: &[&str] = &[
    "database_url",
    "amqp_url",
    "amqp_urls",
    "management_url",
    "alerts.webhook",
];

/// Prefix of the settings' environment variables.
const ENV_PREFIX: &str = "CHIME";

/// Scheduler settings. `Debug` hides passwords in URLs.
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    /// PostgreSQL connection URL (`postgres://` or `postgresql://`).
    pub database_url: String,
    /// RabbitMQ connection URL (`amqp://` or `amqps://`); with `amqp_urls`, the list's first.
    pub amqp_url: String,
    /// Several addresses of one RabbitMQ cluster (`amqp_urls`), tried in order at connect and
    /// the next one after a lost connection ([`chime_protocol::addresses`]); empty: `amqp_url`
    /// alone. See [`Settings::amqp_addresses`].
    pub amqp_urls: Vec<String>,
    /// TLS options of an `amqps://` `amqp_url` (`[amqp_tls]`): CA file, client certificate and
    /// key; relative paths from a settings file are already resolved against its directory.
    pub amqp_tls: AmqpTls,
    /// RabbitMQ's management HTTP API (`http://host:15672`), for queue figures with unacked
    /// counts and rates; none: passive declares only. Credentials are `amqp_url`'s.
    pub management_url: Option<String>,
    /// This instance's name in the leader lease, worker registry and logs; `None` means
    /// `hostname-pid`, see [`Settings::resolved_instance_id`].
    pub instance_id: Option<String>,
    /// Address the API, dashboard and metrics listen on.
    pub bind: SocketAddr,
    /// First component of every queue and exchange name Chime declares.
    pub queue_prefix: String,
    /// Job files and patterns (see [`super::expand_job_patterns`]); relative ones from a
    /// settings file are already resolved against that file's directory.
    pub jobs: Vec<PathBuf>,
    /// Reload the job files when they change, as on SIGHUP (`chime scheduler --watch` sets it
    /// too; [`crate::watch`]).
    pub watch: bool,
    /// Leader election timings.
    pub leader: LeaderSettings,
    /// Planner timings.
    pub planner: PlannerSettings,
    /// The rescuer of lost and stuck runs.
    pub rescuer: RescuerSettings,
    /// Alert webhooks.
    pub alerts: AlertSettings,
    /// Pruning of old runs.
    pub retention: RetentionSettings,
}

/// Retention (`[retention]`): the leader deletes finished runs (with their attempts and log
/// lines) older than `max_age`, or than their job's own `retention`, and audit log entries
/// older than `audit_max_age`, in batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Finished runs older than this are deleted (unless their job says otherwise).
    pub max_age: Duration,
    /// How often the leader prunes.
    pub interval: Duration,
    /// Most runs (or audit entries) deleted per statement (each batch is its own short
    /// transaction).
    pub batch_size: u32,
    /// Audit log entries older than this are deleted.
    pub audit_max_age: Duration,
}

impl Default for RetentionSettings {
    fn default() -> RetentionSettings {
        RetentionSettings {
            max_age: Duration::from_secs(30 * 24 * 3600),
            interval: Duration::from_secs(60),
            batch_size: 1000,
            audit_max_age: Duration::from_secs(400 * 24 * 3600),
        }
    }
}

/// The rescuer (`[rescuer]`): runs of lost workers and runs stuck in `retrying`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RescuerSettings {
    /// How often the leader looks for runs to rescue.
    pub interval: Duration,
    /// A `running` run is rescued once its worker has been lost for this long.
    pub rescue_after: Duration,
    /// A `retrying` run is republished once its `next_attempt_at` is this far past.
    pub retry_slack: Duration,
}

impl Default for RescuerSettings {
    fn default() -> RescuerSettings {
        RescuerSettings {
            interval: Duration::from_secs(5),
            rescue_after: Duration::from_secs(30),
            retry_slack: Duration::from_secs(60),
        }
    }
}

/// Alert webhooks (`[alerts]`, with per-group overrides in `[alerts.groups.<group>]`; a job's
/// own `alerts` table overrides both). `Debug` hides webhook paths, which often hold a secret.
#[derive(Clone, PartialEq, Eq)]
pub struct AlertSettings {
    /// Where alerts are posted; none: no alerts unless a group or job names a webhook.
    pub webhook: Option<String>,
    /// Body format.
    pub format: AlertFormat,
    /// At most one alert per (job, kind) in this interval; later ones are recorded as
    /// suppressed.
    pub min_interval: Duration,
    /// Alert when this many runs of a job in a row failed (0: never).
    pub consecutive_failures: u32,
    /// Overrides per executor group.
    pub groups: BTreeMap<String, GroupAlertSettings>,
}

/// One group's alert overrides (`[alerts.groups.<group>]`); unset keys fall back to `[alerts]`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GroupAlertSettings {
    /// Webhook for the group's jobs.
    pub webhook: Option<String>,
    /// Body format.
    pub format: Option<AlertFormat>,
    /// Rate limit per (job, kind).
    pub min_interval: Option<Duration>,
    /// Consecutive failures that trigger an alert.
    pub consecutive_failures: Option<u32>,
}

impl Default for AlertSettings {
    fn default() -> AlertSettings {
        AlertSettings {
            webhook: None,
            format: AlertFormat::Generic,
            min_interval: Duration::from_secs(60),
            consecutive_failures: 3,
            groups: BTreeMap::new(),
        }
    }
}

impl AlertSettings {
    /// Whether any webhook is configured in settings.
    pub fn any_webhook(&self) -> bool {
        self.webhook.is_some() || self.groups.values().any(|g| g.webhook.is_some())
    }
}

impl fmt::Debug for AlertSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlertSettings")
            .field("webhook", &self.webhook.as_deref().map(webhook_target))
            .field("format", &self.format)
            .field("min_interval", &self.min_interval)
            .field("consecutive_failures", &self.consecutive_failures)
            .field("groups", &self.groups)
            .finish()
    }
}

impl fmt::Debug for GroupAlertSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupAlertSettings")
            .field("webhook", &self.webhook.as_deref().map(webhook_target))
            .field("format", &self.format)
            .field("min_interval", &self.min_interval)
            .field("consecutive_failures", &self.consecutive_failures)
            .finish()
    }
}

/// A webhook URL without what may be secret (path, query, credentials): `https://host:port`.
/// Used in logs, `Debug` output and `chime_alerts.target`.
pub fn webhook_target(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit('@').next().unwrap_or(authority);
    if rest.len() > authority.len() {
        format!("{scheme}://{host}/***")
    } else {
        format!("{scheme}://{host}")
    }
}

/// Leader election timings (`[leader]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderSettings {
    /// How long a lease lasts without renewal; after it, another instance may take over.
    pub lease_ttl: Duration,
    /// How often the leader renews its lease (and followers try to take it); shorter than
    /// `lease_ttl`.
    pub renew_interval: Duration,
}

/// Planner timings (`[planner]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannerSettings {
    /// How far ahead of a fire the planner persists its run, so publishing at the instant
    /// itself costs no database round trip.
    pub lookahead: Duration,
}

impl Default for LeaderSettings {
    fn default() -> LeaderSettings {
        LeaderSettings {
            lease_ttl: Duration::from_secs(3),
            renew_interval: Duration::from_secs(1),
        }
    }
}

impl Default for PlannerSettings {
    fn default() -> PlannerSettings {
        PlannerSettings {
            lookahead: Duration::from_millis(500),
        }
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            database_url: DEFAULT_DATABASE_URL.to_owned(),
            amqp_url: DEFAULT_AMQP_URL.to_owned(),
            amqp_urls: Vec::new(),
            amqp_tls: AmqpTls::default(),
            management_url: None,
            instance_id: None,
            bind: DEFAULT_BIND
                .parse()
                .expect("DEFAULT_BIND is a socket address"),
            queue_prefix: DEFAULT_QUEUE_PREFIX.to_owned(),
            jobs: Vec::new(),
            watch: false,
            leader: LeaderSettings::default(),
            planner: PlannerSettings::default(),
            rescuer: RescuerSettings::default(),
            alerts: AlertSettings::default(),
            retention: RetentionSettings::default(),
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("database_url", &redact_url(&self.database_url))
            .field("amqp_url", &redact_url(&self.amqp_url))
            .field(
                "amqp_urls",
                &self
                    .amqp_urls
                    .iter()
                    .map(|url| redact_url(url))
                    .collect::<Vec<_>>(),
            )
            .field("amqp_tls", &self.amqp_tls)
            .field("management_url", &self.management_url)
            .field("instance_id", &self.instance_id)
            .field("bind", &self.bind)
            .field("queue_prefix", &self.queue_prefix)
            .field("jobs", &self.jobs)
            .field("watch", &self.watch)
            .field("leader", &self.leader)
            .field("planner", &self.planner)
            .field("rescuer", &self.rescuer)
            .field("alerts", &self.alerts)
            .field("retention", &self.retention)
            .finish()
    }
}

impl Settings {
    /// Loads settings from the defaults, the settings file `file` if given (TOML or YAML, by
    /// extension) and the process's `CHIME_*` environment variables, in rising precedence.
    /// Returns every mistake at once.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigErrors> {
        load(file, None)
    }

    /// [`Settings::load`] with the environment given as a map of variable names to values
    /// instead of read from the process (tests, and embedding).
    pub fn load_with_env<I>(file: Option<&Path>, env: I) -> Result<Settings, ConfigErrors>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        load(file, Some(env.into_iter().collect()))
    }

    /// The broker addresses, in the order they are tried: `amqp_urls`, or `amqp_url` alone.
    pub fn amqp_addresses(&self) -> Addresses {
        let urls: Vec<String> = self
            .amqp_urls
            .iter()
            .take(chime_protocol::addresses::MAX_AMQP_URLS)
            .cloned()
            .collect();
        Addresses::new(urls).unwrap_or_else(|_| Addresses::one(self.amqp_url.clone()))
    }

    /// The configured `instance_id`, or [`default_instance_id`] when none is set.
    pub fn resolved_instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(default_instance_id)
    }

    /// Expands [`Settings::jobs`] and loads every job file it names.
    pub fn load_jobs(&self) -> Result<Vec<JobSpec>, ConfigErrors> {
        let paths = super::expand_job_patterns(&self.jobs)?;
        super::load_job_files(&paths)
    }
}

/// `hostname-pid`: unique among the instances running at one time, recognisable in the
/// dashboard. The host name comes from the kernel (Linux), else `$HOSTNAME`, else `localhost`.
pub fn default_instance_id() -> String {
    format!("{}-{}", host_name(), std::process::id())
}

/// This machine's name: from the kernel (Linux), else `$HOSTNAME`, else `localhost`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Where a setting's value came from, to name it in messages.
enum Place<'a> {
    File {
        origin: &'a str,
        key: &'a str,
    },
    /// `via`: the `CHIME_<KEY>_FILE` variable and file the value was read from, if it was.
    Env {
        key: &'a str,
        via: Option<&'a str>,
    },
}

impl Place<'_> {
    /// An error about `key` (a key below this place's), from the same file or environment.
    fn error_at(
        &self,
        key: &str,
        value: Option<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        match self {
            Place::File { origin, .. } => ConfigError::key(*origin, key, value, message),
            Place::Env { .. } => ConfigError {
                value,
                ..ConfigError::at(format!("environment variable {}", env_var(key)), message)
            },
        }
    }

    fn error(&self, value: Option<String>, message: impl Into<String>) -> ConfigError {
        match self {
            Place::File { origin, key } => ConfigError::key(*origin, *key, value, message),
            Place::Env { key, via } => ConfigError {
                value,
                ..ConfigError::at(
                    via.map_or_else(
                        || format!("environment variable {}", env_var(key)),
                        str::to_owned,
                    ),
                    message,
                )
            },
        }
    }
}

/// The environment variable of a settings key: `leader.lease_ttl` → `CHIME_LEADER__LEASE_TTL`.
fn env_var(key: &str) -> String {
    format!("{ENV_PREFIX}_{}", key.replace('.', "__").to_uppercase())
}

/// The settings file's tree and the environment's, looked up key by key.
struct Layers {
    file: Option<(String, config::Map<String, config::Value>)>,
    /// Dotted, lowercased keys, as `config::Environment` makes them.
    env: config::Map<String, config::Value>,
    /// Keys of `env` read from files: the variable and the file, for messages.
    via: BTreeMap<String, String>,
}

impl Layers {
    /// The settings file's name, or "environment" when there is none.
    fn origin(&self) -> String {
        self.file
            .as_ref()
            .map_or_else(|| "environment".to_owned(), |(origin, _)| origin.clone())
    }

    /// The value of `key` (from the environment first, then the file) and where it came from.
    fn get<'a>(&'a self, key: &'a str) -> Option<(&'a config::Value, Place<'a>)> {
        if let Some(value) = self.env.get(key) {
            let via = self.via.get(key).map(String::as_str);
            return Some((value, Place::Env { key, via }));
        }
        let (origin, root) = self.file.as_ref()?;
        // A group name may itself contain dots: `alerts.groups.<group>.<key>`.
        let parts: Vec<&str> = match key
            .strip_prefix("alerts.groups.")
            .and_then(|rest| rest.rsplit_once('.'))
        {
            Some((group, leaf)) => vec!["alerts", "groups", group, leaf],
            None => key.split('.').collect(),
        };
        let mut parts = parts.into_iter();
        let mut value = root.get(parts.next()?)?;
        for part in parts {
            match &value.kind {
                ValueKind::Table(table) => value = table.get(part)?,
                _ => return None,
            }
        }
        if matches!(value.kind, ValueKind::Nil) {
            return None;
        }
        Some((value, Place::File { origin, key }))
    }
}

fn load(
    path: Option<&Path>,
    env: Option<config::Map<String, String>>,
) -> Result<Settings, ConfigErrors> {
    let file = match path {
        None => None,
        Some(path) => {
            let origin = path.display().to_string();
            let root = read_settings_file(path, &origin)?;
            Some((origin, root))
        }
    };
    let base_dir = path.map(|path| path.parent().unwrap_or(Path::new("")));
    resolve(file, base_dir, env)
}

/// Settings from a parsed settings file (its name and tree) and the environment (`None`: the
/// process's). Relative job paths from the file are resolved against `base_dir`.
fn resolve(
    file: Option<(String, config::Map<String, config::Value>)>,
    base_dir: Option<&Path>,
    env: Option<config::Map<String, String>>,
) -> Result<Settings, ConfigErrors> {
    let mut errors = Vec::new();
    let mut env = env.unwrap_or_else(process_env);
    let via = values_from_files(&mut env, &mut errors);
    let env = config::Environment::with_prefix(ENV_PREFIX)
        .prefix_separator("_")
        .separator("__")
        .ignore_empty(true)
        .source(Some(env))
        .collect()
        .map_err(|e| ConfigError::at("environment", e.to_string()))?;
    let layers = Layers { file, env, via };
    if let Some((origin, root)) = &layers.file {
        unknown_file_keys(origin, root, "", &mut errors);
    }
    unknown_env_vars(&layers.env, &mut errors);

    let mut settings = Settings::default();
    if let Some(url) = url_setting(
        &layers,
        "database_url",
        &["postgres", "postgresql"],
        &mut errors,
    ) {
        settings.database_url = url;
    }
    if let Some(url) = url_setting(&layers, "amqp_url", &["amqp", "amqps"], &mut errors) {
        settings.amqp_url = url;
    }
    if let Some(urls) = amqp_urls(&layers, &mut errors) {
        settings.amqp_url = urls[0].clone();
        settings.amqp_urls = urls;
    }
    settings.amqp_tls = amqp_tls(
        &layers,
        base_dir,
        settings.amqp_addresses().urls(),
        &mut errors,
    );
    if let Some(url) = url_setting(&layers, "management_url", &["http", "https"], &mut errors) {
        if url.split_once("://").is_some_and(|(_, rest)| {
            rest.split(['/', '?', '#'])
                .next()
                .is_some_and(|host| host.contains('@'))
        }) {
            if let Some((_, place)) = layers.get("management_url") {
                errors.push(place.error(
                    Some(format!("{:?}", redact_url(&url))),
                    "write the URL without credentials, such as \"http://127.0.0.1:15672\": \
                     the management API is used as amqp_url's user",
                ));
            }
        } else {
            settings.management_url = Some(url);
        }
    }
    if let Some((text, place)) = string(&layers, "instance_id", &mut errors) {
        if text.is_empty() || text.chars().count() > 128 || text.chars().any(char::is_whitespace) {
            errors.push(place.error(
                Some(format!("{text:?}")),
                "expected 1 to 128 characters without spaces, such as \"scheduler-1\"; leave it \
                 unset for hostname-pid",
            ));
        } else {
            settings.instance_id = Some(text);
        }
    }
    if let Some((text, place)) = string(&layers, "bind", &mut errors) {
        match text.trim().parse::<SocketAddr>() {
            Ok(bind) => settings.bind = bind,
            Err(_) => errors.push(place.error(
                Some(format!("{text:?}")),
                "expected an IP address and a port, such as \"127.0.0.1:8080\" or \
                 \"0.0.0.0:8080\" (a host name is not accepted)",
            )),
        }
    }
    if let Some((text, place)) = string(&layers, "queue_prefix", &mut errors) {
        match identifier_problem(&text) {
            None => settings.queue_prefix = text,
            Some(problem) => errors.push(place.error(
                Some(format!("{text:?}")),
                format!(
                    "invalid queue prefix: {problem}; use 1 to 63 characters from a-z, 0-9, \
                     \"_\", \".\" and \"-\", starting with a letter or digit, such as \"chime\""
                ),
            )),
        }
    }
    if let Some(jobs) = job_patterns(&layers, base_dir, &mut errors) {
        settings.jobs = jobs;
    }
    if let Some(watch) = boolean(&layers, "watch", &mut errors) {
        settings.watch = watch;
    }
    let lease_ttl = duration_at_most(&layers, "leader.lease_ttl", MAX_LEASE_TTL, &mut errors);
    let renew_interval =
        duration_at_most(&layers, "leader.renew_interval", MAX_LEASE_TTL, &mut errors);
    let lookahead = duration_at_most(&layers, "planner.lookahead", MAX_LOOKAHEAD, &mut errors);
    for found in [&lease_ttl, &renew_interval] {
        if let Some((d, place, written)) = found
            && d.is_zero()
        {
            errors.push(place.error(
                Some(written.clone()),
                "must be longer than 0s; write a duration such as \"1s\"",
            ));
        }
    }
    if let Some((d, _, _)) = &lease_ttl {
        settings.leader.lease_ttl = *d;
    }
    if let Some((d, _, _)) = &renew_interval {
        settings.leader.renew_interval = *d;
    }
    if let Some((d, _, _)) = &lookahead {
        settings.planner.lookahead = *d;
    }
    let LeaderSettings {
        lease_ttl: ttl,
        renew_interval: renew,
    } = settings.leader;
    if !ttl.is_zero() && !renew.is_zero() && renew >= ttl {
        // Blame the key that was set (renew_interval if both were); the other is its default.
        if let Some((_, place, written)) = renew_interval.as_ref().or(lease_ttl.as_ref()) {
            errors.push(place.error(
                Some(written.clone()),
                format!(
                    "leader.renew_interval ({}) must be shorter than leader.lease_ttl ({}) so \
                     the leader renews its lease before it runs out; a third of lease_ttl is usual",
                    humantime::format_duration(renew),
                    humantime::format_duration(ttl)
                ),
            ));
        }
    }

    for (key, target, max) in [
        (
            "rescuer.interval",
            &mut settings.rescuer.interval,
            MAX_DUTY_INTERVAL,
        ),
        (
            "rescuer.rescue_after",
            &mut settings.rescuer.rescue_after,
            MAX_RESCUE_WAIT,
        ),
        (
            "rescuer.retry_slack",
            &mut settings.rescuer.retry_slack,
            MAX_RESCUE_WAIT,
        ),
    ] {
        if let Some((d, place, written)) = duration_at_most(&layers, key, max, &mut errors) {
            if d.is_zero() && key == "rescuer.interval" {
                errors.push(place.error(
                    Some(written),
                    "must be longer than 0s; write a duration such as \"5s\"",
                ));
            } else {
                *target = d;
            }
        }
    }
    if let Some(webhook) = webhook(&layers, "alerts.webhook", &mut errors) {
        settings.alerts.webhook = Some(webhook);
    }
    if let Some(format) = alert_format(&layers, "alerts.format", &mut errors) {
        settings.alerts.format = format;
    }
    if let Some((d, _, _)) = duration_at_most(
        &layers,
        "alerts.min_interval",
        MAX_ALERT_INTERVAL,
        &mut errors,
    ) {
        settings.alerts.min_interval = d;
    }
    if let Some(n) = whole_number_at_most(
        &layers,
        "alerts.consecutive_failures",
        MAX_CONSECUTIVE_FAILURES,
        &mut errors,
    ) {
        settings.alerts.consecutive_failures = n;
    }
    settings.alerts.groups = alert_groups(&layers, &mut errors);
    for (key, target, max) in [
        (
            "retention.max_age",
            &mut settings.retention.max_age,
            MAX_RETENTION,
        ),
        (
            "retention.interval",
            &mut settings.retention.interval,
            MAX_DUTY_INTERVAL,
        ),
        (
            "retention.audit_max_age",
            &mut settings.retention.audit_max_age,
            MAX_RETENTION,
        ),
    ] {
        if let Some((d, place, written)) = duration_at_most(&layers, key, max, &mut errors) {
            if d < Duration::from_secs(1) {
                errors.push(place.error(
                    Some(written),
                    "must be at least 1s; write a duration such as \"30days\" or \"1m\"",
                ));
            } else {
                *target = d;
            }
        }
    }
    if let Some(n) =
        whole_number_at_most(&layers, "retention.batch_size", MAX_BATCH_SIZE, &mut errors)
    {
        if n == 0 {
            if let Some((_, place)) = layers.get("retention.batch_size") {
                errors.push(place.error(
                    Some("0".into()),
                    "must be at least 1; a batch of 1000 is usual",
                ));
            }
        } else {
            settings.retention.batch_size = n;
        }
    }

    if errors.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// A webhook URL setting.
fn webhook(layers: &Layers, key: &str, errors: &mut Vec<ConfigError>) -> Option<String> {
    let (text, place) = string(layers, key, errors)?;
    match webhook_problem(&text) {
        None => Some(text),
        Some(problem) => {
            errors.push(place.error(Some(format!("{:?}", webhook_target(&text))), problem));
            None
        }
    }
}

/// An alert body format: `generic` or `slack`.
fn alert_format(layers: &Layers, key: &str, errors: &mut Vec<ConfigError>) -> Option<AlertFormat> {
    let (text, place) = string(layers, key, errors)?;
    match AlertFormat::parse(text.trim()) {
        Some(format) => Some(format),
        None => {
            errors.push(place.error(
                Some(format!("{text:?}")),
                format!(
                    "unknown alert format; use {}",
                    ALERT_FORMATS
                        .iter()
                        .map(|f| format!("{f:?}"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            ));
            None
        }
    }
}

/// A whole number setting (a number in a file, digits in the environment).
fn whole_number(layers: &Layers, key: &str, errors: &mut Vec<ConfigError>) -> Option<u32> {
    let (value, place) = layers.get(key)?;
    let number = match &value.kind {
        ValueKind::I64(n) => u32::try_from(*n).ok(),
        ValueKind::U64(n) => u32::try_from(*n).ok(),
        ValueKind::String(text) => text.trim().parse::<u32>().ok(),
        _ => None,
    };
    if number.is_none() {
        errors.push(place.error(
            Some(render_config(value)),
            format!("expected a whole number from 0 to {}, such as 3", u32::MAX),
        ));
    }
    number
}

/// `[alerts.groups.<group>]` tables from the file, and `CHIME_ALERTS__GROUPS__<GROUP>__<KEY>`
/// variables from the environment.
fn alert_groups(
    layers: &Layers,
    errors: &mut Vec<ConfigError>,
) -> BTreeMap<String, GroupAlertSettings> {
    let mut names: Vec<String> = Vec::new();
    if let Some((value, place)) = layers.get("alerts.groups") {
        match &value.kind {
            ValueKind::Table(table) => {
                for (name, group) in table {
                    match &group.kind {
                        ValueKind::Table(keys) => {
                            for key in keys.keys() {
                                if !ALERT_GROUP_KEYS.contains(&key.as_str()) {
                                    let full = format!("alerts.groups.{name}.{key}");
                                    let message = match closest(key, ALERT_GROUP_KEYS.iter().copied()) {
                                        Some(near) => format!("unknown key; did you mean \"alerts.groups.{name}.{near}\"?"),
                                        None => format!(
                                            "unknown key; a group's alert settings are {}",
                                            ALERT_GROUP_KEYS.join(", ")
                                        ),
                                    };
                                    errors.push(place.error_at(&full, Some(render_config(&keys[key])), message));
                                }
                            }
                        }
                        _ => errors.push(place.error_at(
                            &format!("alerts.groups.{name}"),
                            Some(render_config(group)),
                            format!(
                                "expected a table of alert settings ([alerts.groups.{name}] in TOML), \
                                 such as webhook = \"https://hooks.example.com/chime\""
                            ),
                        )),
                    }
                    names.push(name.clone());
                }
            }
            _ => errors.push(place.error(
                Some(render_config(value)),
                "expected a table with one table per executor group, such as \
                 [alerts.groups.orders] in TOML",
            )),
        }
    }
    for key in layers.env.keys() {
        let Some(rest) = key.strip_prefix("alerts.groups.") else {
            continue;
        };
        match rest.rsplit_once('.') {
            Some((name, leaf)) if ALERT_GROUP_KEYS.contains(&leaf) => names.push(name.to_owned()),
            _ => errors.push(ConfigError::at(
                format!("environment variable {}", env_var(key)),
                format!(
                    "unknown setting; a group's alert settings are \
                     CHIME_ALERTS__GROUPS__<GROUP>__ followed by one of {}",
                    ALERT_GROUP_KEYS
                        .iter()
                        .map(|k| k.to_uppercase())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }
    names.sort();
    names.dedup();
    let mut groups = BTreeMap::new();
    for name in names {
        if let Some(problem) = identifier_problem(&name) {
            errors.push(ConfigError::key(
                layers.origin(),
                format!("alerts.groups.{name}"),
                None,
                format!("invalid group name: {problem}; use the executor group's name"),
            ));
            continue;
        }
        let key = |k: &str| format!("alerts.groups.{name}.{k}");
        let (webhook_key, format_key, interval_key, failures_key) = (
            key("webhook"),
            key("format"),
            key("min_interval"),
            key("consecutive_failures"),
        );
        let group = GroupAlertSettings {
            webhook: webhook(layers, &webhook_key, errors),
            format: alert_format(layers, &format_key, errors),
            min_interval: duration_at_most(layers, &interval_key, MAX_ALERT_INTERVAL, errors)
                .map(|(d, _, _)| d),
            consecutive_failures: whole_number_at_most(
                layers,
                &failures_key,
                MAX_CONSECUTIVE_FAILURES,
                errors,
            ),
        };
        groups.insert(name, group);
    }
    groups
}

fn read_settings_file(
    path: &Path,
    origin: &str,
) -> Result<config::Map<String, config::Value>, ConfigError> {
    let format = SourceFormat::from_path(path).ok_or_else(|| {
        ConfigError::at(
            origin,
            "unsupported file type; a settings file ends in .toml, .yaml or .yml",
        )
    })?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::at(origin, format!("cannot read: {e}")))?;
    format.parse(origin, &text)
}

/// Reports keys of the settings file that are not settings, with the nearest one.
fn unknown_file_keys(
    origin: &str,
    table: &config::Map<String, config::Value>,
    prefix: &str,
    errors: &mut Vec<ConfigError>,
) {
    let mut keys: Vec<&String> = table.keys().collect();
    keys.sort();
    for key in keys {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let value = &table[key];
        if SETTINGS_KEYS.contains(&full.as_str()) || full == "alerts.groups" {
            // `alerts.groups` has a key per group: checked with its values in `alert_groups`.
            continue;
        }
        let is_section = SETTINGS_KEYS
            .iter()
            .any(|known| known.starts_with(&format!("{full}.")));
        if is_section {
            match &value.kind {
                ValueKind::Table(inner) => unknown_file_keys(origin, inner, &full, errors),
                _ => errors.push(ConfigError::key(
                    origin,
                    full.as_str(),
                    Some(render_config(value)),
                    format!("expected a table ([{full}] in TOML, \"{full}:\" with indented keys in YAML)"),
                )),
            }
            continue;
        }
        // Compare with full names and with the last part, so that a key put outside its
        // section (lease_ttl at the top) is pointed to its place (leader.lease_ttl).
        let near = SETTINGS_KEYS
            .iter()
            .map(|known| {
                let leaf = known.rsplit('.').next().unwrap_or(known);
                (distance(&full, known).min(distance(key, leaf)), *known)
            })
            .filter(|(d, _)| *d <= (key.chars().count() / 3).max(1))
            .min_by_key(|(d, _)| *d)
            .map(|(_, known)| known);
        let message = match near {
            Some(near) => format!("unknown key; did you mean {near:?}?"),
            None if super::JOB_FIELDS.contains(&key.as_str()) || key == "jobs" => {
                "unknown key; jobs are declared in job files, listed under \"jobs\"".to_owned()
            }
            None => format!(
                "unknown key; remove it, or use one of the settings: {}",
                SETTINGS_KEYS.join(", ")
            ),
        };
        errors.push(ConfigError::key(
            origin,
            full.as_str(),
            Some(render_config(value)),
            message,
        ));
    }
}

/// The process's `CHIME_*` variables (others, and any that is not UTF-8, are not Chime's).
fn process_env() -> config::Map<String, String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| name.starts_with(&format!("{ENV_PREFIX}_")))
        .collect()
}

/// Whether `CHIME_<KEY>` (`variable`) is a setting that may come from a file.
fn file_setting(variable: &str) -> bool {
    FILE_SETTINGS.iter().any(|key| env_var(key) == variable)
        || variable
            .strip_prefix(&format!("{ENV_PREFIX}_ALERTS__GROUPS__"))
            .is_some_and(|rest| rest.ends_with("__WEBHOOK") && rest.len() > "__WEBHOOK".len())
}

/// Replaces each `CHIME_<KEY>_FILE` variable of `env` by `CHIME_<KEY>` holding the named file's
/// contents (without its final line break), for the settings of [`FILE_SETTINGS`]. A file that
/// cannot be read, is empty or too large, a value given both ways, or a `_FILE` variable for
/// another setting is an error naming the variable. Returns, per settings key read from a file,
/// the variable and the file, for later messages about the value.
fn values_from_files(
    env: &mut config::Map<String, String>,
    errors: &mut Vec<ConfigError>,
) -> BTreeMap<String, String> {
    let mut via = BTreeMap::new();
    let mut file_variables: Vec<String> = env
        .keys()
        .filter(|name| name.starts_with(&format!("{ENV_PREFIX}_")) && name.ends_with(FILE_SUFFIX))
        .cloned()
        .collect();
    file_variables.sort();
    for name in file_variables {
        let base = &name[..name.len() - FILE_SUFFIX.len()];
        let origin = format!("environment variable {name}");
        let key = base[ENV_PREFIX.len() + 1..]
            .to_lowercase()
            .replace("__", ".");
        if !file_setting(base) {
            if SETTINGS_KEYS.contains(&key.as_str()) {
                let path = env.remove(&name).unwrap_or_default();
                errors.push(ConfigError {
                    value: Some(format!("{path:?}")),
                    ..ConfigError::at(
                        origin,
                        format!(
                            "{key} cannot come from a file (only {} and a group's webhook can); \
                             set {base} itself",
                            FILE_SETTINGS.join(", ")
                        ),
                    )
                });
            }
            continue;
        }
        let path = env.remove(&name).unwrap_or_default();
        if path.is_empty() {
            continue;
        }
        if env.get(base).is_some_and(|value| !value.is_empty()) {
            errors.push(ConfigError::at(
                origin,
                format!("{base} is set too; give the value one way, the variable or the file"),
            ));
            continue;
        }
        match chime_protocol::secret_file::read(Path::new(&path)) {
            Ok(value) => {
                env.insert(base.to_owned(), value);
                via.insert(key, format!("{origin} (file {path:?})"));
            }
            Err(error) => errors.push(ConfigError {
                value: Some(format!("{path:?}")),
                ..ConfigError::at(origin, error.to_string())
            }),
        }
    }
    via
}

/// Reports `CHIME_*` variables that look like a misspelt setting. Other unknown `CHIME_*`
/// variables are left alone: they may belong to the command line (such as `CHIME_CONFIG`).
fn unknown_env_vars(env: &config::Map<String, config::Value>, errors: &mut Vec<ConfigError>) {
    let mut keys: Vec<&String> = env.keys().collect();
    keys.sort();
    for key in keys {
        if SETTINGS_KEYS.contains(&key.as_str()) || key.starts_with("alerts.groups.") {
            continue;
        }
        let flat = key.replace('.', "_");
        let flat_keys: Vec<(String, &str)> = SETTINGS_KEYS
            .iter()
            .map(|known| (known.replace('.', "_"), *known))
            .collect();
        let Some(near_flat) = closest(&flat, flat_keys.iter().map(|(f, _)| f.as_str())) else {
            continue;
        };
        let near = flat_keys
            .iter()
            .find(|(f, _)| f == near_flat)
            .map(|(_, known)| *known)
            .unwrap_or(near_flat);
        let hint = if near_flat == flat {
            " (two underscores between a section and its key)"
        } else {
            ""
        };
        errors.push(ConfigError::at(
            format!("environment variable {}", env_var(key)),
            format!("unknown setting; did you mean {}?{hint}", env_var(near)),
        ));
    }
}

/// A string setting; anything else is a mistake.
fn string<'a>(
    layers: &'a Layers,
    key: &'a str,
    errors: &mut Vec<ConfigError>,
) -> Option<(String, Place<'a>)> {
    let (value, place) = layers.get(key)?;
    match &value.kind {
        ValueKind::String(text) => Some((text.clone(), place)),
        ValueKind::I64(_) | ValueKind::U64(_) | ValueKind::Float(_) | ValueKind::Boolean(_) => {
            errors.push(place.error(
                Some(render_config(value)),
                format!("expected a string; quote it: \"{}\"", value.kind),
            ));
            None
        }
        _ => {
            errors.push(place.error(Some(render_config(value)), "expected a string"));
            None
        }
    }
}

/// A `true`/`false` setting: a boolean in a file, `true` or `false` in the environment.
fn boolean(layers: &Layers, key: &str, errors: &mut Vec<ConfigError>) -> Option<bool> {
    let (value, place) = layers.get(key)?;
    let parsed = match (&value.kind, &place) {
        (ValueKind::Boolean(b), _) => Some(*b),
        (ValueKind::String(text), Place::Env { .. }) => {
            match text.trim().to_ascii_lowercase().as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            }
        }
        _ => None,
    };
    if parsed.is_none() {
        errors.push(place.error(
            Some(render_config(value)),
            "expected true or false (unquoted in a file)",
        ));
    }
    parsed
}

fn url_setting(
    layers: &Layers,
    key: &str,
    schemes: &[&str],
    errors: &mut Vec<ConfigError>,
) -> Option<String> {
    let (text, place) = string(layers, key, errors)?;
    let scheme_ok = text
        .split_once("://")
        .is_some_and(|(scheme, rest)| schemes.contains(&scheme) && !rest.is_empty());
    let example = match key {
        "database_url" => DEFAULT_DATABASE_URL,
        "management_url" => "http://127.0.0.1:15672",
        _ => DEFAULT_AMQP_URL,
    };
    if scheme_ok {
        // Parsed as the client will parse it, so a bad port or host is reported now, with the
        // password hidden (the parsers' messages never quote the URL).
        let problem = match key {
            "database_url" => text
                .parse::<sqlx::postgres::PgConnectOptions>()
                .err()
                .map(|e| format!("not a valid PostgreSQL URL ({e}); write it like {example:?}"))
                .or_else(|| {
                    chime_protocol::tls::check_database_url(&text)
                        .err()
                        .map(|e| e.to_string())
                }),
            "amqp_url" => crate::amqp::parse_url(&text)
                .err()
                .map(|e| format!("not a valid AMQP URL ({e}); write it like {example:?}")),
            _ => None,
        };
        let Some(problem) = problem else {
            return Some(text);
        };
        errors.push(place.error(Some(format!("{:?}", redact_url(&text))), problem));
        return None;
    }
    errors.push(place.error(
        Some(format!("{:?}", redact_url(&text))),
        format!(
            "expected a URL starting with {}, such as {example:?}",
            schemes
                .iter()
                .map(|s| format!("\"{s}://\""))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    ));
    None
}

/// A duration setting, where it came from, and the value as written (for later messages).
fn duration<'a>(
    layers: &'a Layers,
    key: &'a str,
    errors: &mut Vec<ConfigError>,
) -> Option<(Duration, Place<'a>, String)> {
    let (value, place) = layers.get(key)?;
    let text = match &value.kind {
        ValueKind::String(text) => text,
        ValueKind::I64(_) | ValueKind::U64(_) | ValueKind::I128(_) | ValueKind::U128(_) => {
            errors.push(place.error(
                Some(render_config(value)),
                format!(
                    "a duration needs a unit; write it as a string such as \"{}s\"",
                    value.kind
                ),
            ));
            return None;
        }
        _ => {
            errors.push(place.error(
                Some(render_config(value)),
                "expected a duration such as \"3s\" or \"500ms\"",
            ));
            return None;
        }
    };
    match humantime::parse_duration(text) {
        Ok(d) => Some((d, place, render_config(value))),
        Err(e) => {
            errors.push(place.error(
                Some(render_config(value)),
                format!(
                    "invalid duration ({}); write a number with a unit, such as \"3s\" or \
                     \"500ms\"",
                    duration_problem(text, &e)
                ),
            ));
            None
        }
    }
}

/// [`duration`] with an upper bound (docs/configuration.md, "Limits"): a longer duration is a
/// mistake naming the limit, and the setting keeps its default.
fn duration_at_most<'a>(
    layers: &'a Layers,
    key: &'a str,
    max: Duration,
    errors: &mut Vec<ConfigError>,
) -> Option<(Duration, Place<'a>, String)> {
    let (d, place, written) = duration(layers, key, errors)?;
    if d <= max {
        return Some((d, place, written));
    }
    errors.push(place.error(
        Some(written),
        format!(
            "too long: the limit is {limit}; write a duration up to \"{limit}\"",
            limit = limit_text(max)
        ),
    ));
    None
}

/// [`whole_number`] with an upper bound: a larger number is a mistake naming the limit.
fn whole_number_at_most(
    layers: &Layers,
    key: &str,
    max: u32,
    errors: &mut Vec<ConfigError>,
) -> Option<u32> {
    let n = whole_number(layers, key, errors)?;
    if n <= max {
        return Some(n);
    }
    if let Some((value, place)) = layers.get(key) {
        errors.push(place.error(
            Some(render_config(value)),
            format!("too large: the limit is {max}; use a whole number from 0 to {max}"),
        ));
    }
    None
}

/// The `jobs` setting: a list of strings (or one string) in a file, comma-separated in the
/// environment. Relative paths from the file are resolved against the file's directory.
fn job_patterns(
    layers: &Layers,
    base_dir: Option<&Path>,
    errors: &mut Vec<ConfigError>,
) -> Option<Vec<PathBuf>> {
    let (value, place) = layers.get("jobs")?;
    let texts: Vec<String> = match (&value.kind, &place) {
        (ValueKind::String(text), Place::Env { .. }) => text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect(),
        (ValueKind::String(text), Place::File { .. }) => vec![text.clone()],
        (ValueKind::Array(items), _) => {
            let mut texts = Vec::new();
            for item in items {
                match &item.kind {
                    ValueKind::String(text) => texts.push(text.clone()),
                    ValueKind::Table(_) => {
                        errors.push(place.error(
                            Some(render_config(value)),
                            "expected a list of job file paths or patterns; jobs themselves \
                             ([[jobs]] tables) belong in a job file whose path is listed here",
                        ));
                        return None;
                    }
                    _ => {
                        errors.push(place.error(
                            Some(render_config(value)),
                            "expected a list of job file paths or patterns, such as \
                             [\"jobs/*.toml\"]",
                        ));
                        return None;
                    }
                }
            }
            texts
        }
        _ => {
            errors.push(place.error(
                Some(render_config(value)),
                "expected a list of job file paths or patterns, such as [\"jobs/*.toml\"]",
            ));
            return None;
        }
    };
    let resolve = |text: String| {
        let path = PathBuf::from(text);
        match (&place, base_dir) {
            (Place::File { .. }, Some(dir)) if path.is_relative() => dir.join(path),
            _ => path,
        }
    };
    Some(texts.into_iter().map(resolve).collect())
}

/// The `amqp_urls` setting: a list of strings in a file, comma-separated in the environment,
/// 1 to [`chime_protocol::addresses::MAX_AMQP_URLS`] URLs each checked as `amqp_url` is. Giving
/// `amqp_url` too is a mistake: which one would win is not obvious.
fn amqp_urls(layers: &Layers, errors: &mut Vec<ConfigError>) -> Option<Vec<String>> {
    let (value, place) = layers.get("amqp_urls")?;
    let shown = |texts: &[String]| {
        let redacted: Vec<String> = texts.iter().map(|url| redact_url(url)).collect();
        format!("{redacted:?}")
    };
    let texts: Vec<String> = match (&value.kind, &place) {
        (ValueKind::String(text), Place::Env { .. }) => chime_protocol::addresses::split_list(text),
        (ValueKind::Array(items), _) => {
            let mut texts = Vec::new();
            for item in items {
                match &item.kind {
                    ValueKind::String(text) => texts.push(text.clone()),
                    _ => {
                        errors.push(place.error(
                            None,
                            format!(
                                "expected a list of URLs, such as [\"{DEFAULT_AMQP_URL}\"]; \
                                 item {} is not a string",
                                texts.len() + 1
                            ),
                        ));
                        return None;
                    }
                }
            }
            texts
        }
        (ValueKind::String(text), Place::File { .. }) => {
            errors.push(place.error(
                Some(format!("{:?}", redact_url(text))),
                format!(
                    "expected a list of URLs, such as [\"{DEFAULT_AMQP_URL}\"] (one address: \
                     amqp_url)"
                ),
            ));
            return None;
        }
        _ => {
            errors.push(place.error(
                None,
                format!("expected a list of URLs, such as [\"{DEFAULT_AMQP_URL}\"]"),
            ));
            return None;
        }
    };
    if let Some((_, single)) = layers.get("amqp_url") {
        let single = match single {
            Place::File { origin, .. } => format!("amqp_url in {origin}"),
            Place::Env { key, .. } => env_var(key),
        };
        errors.push(place.error(
            Some(shown(&texts)),
            format!(
                "{single} is set too; give one address as amqp_url or several as amqp_urls, \
                 not both (put the amqp_url address into the list and remove amqp_url)"
            ),
        ));
        return None;
    }
    if let Err(problem) = chime_protocol::addresses::check_count(texts.len()) {
        errors.push(place.error(Some(shown(&texts)), problem.to_string()));
        return None;
    }
    let mut ok = true;
    for (index, text) in texts.iter().enumerate() {
        if let Some(problem) = amqp_url_problem(text) {
            errors.push(place.error(
                Some(format!("{:?}", redact_url(text))),
                format!("address {} of {}: {problem}", index + 1, texts.len()),
            ));
            ok = false;
        }
    }
    ok.then_some(texts)
}

/// What is wrong with `text` as an AMQP URL, as `amqp_url` is checked; `None`: nothing.
fn amqp_url_problem(text: &str) -> Option<String> {
    let scheme_ok = text
        .split_once("://")
        .is_some_and(|(scheme, rest)| ["amqp", "amqps"].contains(&scheme) && !rest.is_empty());
    if !scheme_ok {
        return Some(format!(
            "expected a URL starting with \"amqp://\" or \"amqps://\", such as \
             {DEFAULT_AMQP_URL:?}"
        ));
    }
    crate::amqp::parse_url(text)
        .err()
        .map(|e| format!("not a valid AMQP URL ({e}); write it like {DEFAULT_AMQP_URL:?}"))
}

/// The `amqp_tls.*` settings, every file read and checked against each broker address.
/// Relative paths from the settings file are resolved against `base_dir`.
fn amqp_tls(
    layers: &Layers,
    base_dir: Option<&Path>,
    amqp_urls: &[String],
    errors: &mut Vec<ConfigError>,
) -> AmqpTls {
    let mut tls = AmqpTls::default();
    let mut complete = true;
    for (key, slot) in [
        ("amqp_tls.ca_file", &mut tls.ca_file),
        ("amqp_tls.cert_file", &mut tls.cert_file),
        ("amqp_tls.key_file", &mut tls.key_file),
    ] {
        let Some((text, place)) = string(layers, key, errors) else {
            complete &= layers.get(key).is_none();
            continue;
        };
        if text.trim().is_empty() {
            errors.push(place.error(
                Some(format!("{text:?}")),
                "expected the path of a PEM file, such as \"/etc/chime/tls/ca.pem\"",
            ));
            complete = false;
            continue;
        }
        let path = PathBuf::from(text);
        *slot = Some(match (&place, base_dir) {
            (Place::File { .. }, Some(dir)) if path.is_relative() => dir.join(path),
            _ => path,
        });
    }
    if !complete {
        return AmqpTls::default();
    }
    match amqp_urls.iter().try_for_each(|url| tls.check(url)) {
        Ok(()) => tls,
        Err(error) => {
            // Blame the setting the error is about, else the first amqp_tls key that is set.
            let key = [
                "amqp_tls.ca_file",
                "amqp_tls.cert_file",
                "amqp_tls.key_file",
            ]
            .into_iter()
            .find(|key| *key == error.setting())
            .or_else(|| {
                [
                    "amqp_tls.ca_file",
                    "amqp_tls.cert_file",
                    "amqp_tls.key_file",
                ]
                .into_iter()
                .find(|key| layers.get(key).is_some())
            });
            if let Some((value, place)) = key.and_then(|key| layers.get(key)) {
                errors.push(place.error(Some(render_config(value)), error.problem()));
            }
            AmqpTls::default()
        }
    }
}

#[cfg(test)]
mod tests;
