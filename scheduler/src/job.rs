//! The job definition: what config files and the runtime API declare, as validated domain values.
//!
//! A [`JobSpec`] is stored as JSON in `chime_jobs.spec`; its serde form is the same as the config
//! file form (durations as humantime strings such as "30s"), so a stored job reads like its file.

use chime_protocol::retry;
use chrono::{DateTime, FixedOffset, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

use crate::schedule::{
    CalendarClock, CalendarDef, CalendarUse, OnExcluded, Schedule, ScheduleError, Timing,
};
use crate::workflow::Node;

/// A validated job definition.
///
/// Serialized as the job-file form: `kind` and its fields only when it is not `single` (each
/// field only when not its default), `when` as one of the keys `schedule`, `every` and `at`
/// (none for a manual job). It is read back through
/// `StoredSpec`, the same form with the three keys as they are written, which refuses unknown
/// fields and two of the three keys at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "StoredSpec")]
pub struct JobSpec {
    /// Unique job name; also the handler name workers register.
    pub name: String,
    /// Executor group: the RabbitMQ queue its triggers go to. Empty for a workflow, whose
    /// nodes' jobs have their groups.
    pub group: String,
    /// What one fire runs, with its kind's fields (flat keys: `kind`, `shards`, ...).
    #[serde(flatten)]
    pub kind: Kind,
    /// What a failed task does to the run, for kinds other than `single` (whose one run fails
    /// or succeeds by itself); stored only when not `fail`.
    #[serde(skip_serializing_if = "TaskFailurePolicy::is_fail")]
    pub on_task_failure: TaskFailurePolicy,
    /// When the job fires.
    #[serde(flatten)]
    pub when: When,
    /// IANA time zone the cron expression is read in.
    pub timezone: Tz,
    /// Each fire moves later by a stable pseudo-random offset below this, different per fire
    /// and the same on every leader (`crate::schedule::Timing`).
    #[serde(
        serialize_with = "opt_duration::serialize",
        skip_serializing_if = "Option::is_none"
    )]
    pub jitter: Option<Duration>,
    /// No fire before this instant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<FixedOffset>>,
    /// No fire after this instant: the schedule ends there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at: Option<DateTime<FixedOffset>>,
    /// The schedule ends after this many fires (skipped ones included; manual triggers and
    /// backfills are not the schedule's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u32>,
    /// The calendar the job's fires are kept to or out of, references resolved
    /// (`crate::schedule::CalendarDef`; docs/configuration.md, "Calendars").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calendar: Option<CalendarDef>,
    /// Whether fires are allowed only in the calendar, or only outside it.
    #[serde(skip_serializing_if = "CalendarMode::is_only")]
    pub calendar_mode: CalendarMode,
    /// What a fire the calendar excludes does.
    #[serde(skip_serializing_if = "OnExcluded::is_skip")]
    pub on_excluded: OnExcluded,
    /// A calendar named in a job file and not yet looked up among the files' `[calendars]`
    /// (validation resolves it into `calendar`); never stored.
    #[serde(skip)]
    pub calendar_ref: Option<String>,
    /// JSON parameters handed to the handler.
    pub params: serde_json::Value,
    /// Keys of `params` whose values are secrets, hidden from viewers and in the audit log
    /// (besides the keys that read as credentials by convention, `crate::secrets`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret_params: Vec<String>,
    /// Handler timeout.
    #[serde(
        serialize_with = "opt_duration::serialize",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// What to do with fires missed while no leader could publish them.
    pub misfire: MisfirePolicy,
    /// A fire published later than this after its instant counts as missed.
    #[serde(serialize_with = "humantime_serde_compat::serialize")]
    pub misfire_grace: Duration,
    /// Missed fires older than this are skipped whatever the policy.
    #[serde(serialize_with = "humantime_serde_compat::serialize")]
    pub catchup_window: Duration,
    /// At most this many missed fires are run by `fire_all`.
    pub max_catchup: u32,
    /// Cluster-wide overlap policy.
    pub concurrency: ConcurrencyPolicy,
    /// Retries with exponential backoff after a failed attempt.
    pub retry: RetrySpec,
    /// The jobs that run after a run of this one ends (flat keys `on_success`, `on_failure`,
    /// `on_complete`).
    #[serde(flatten)]
    pub children: ChildJobs,
    /// Where this job's alerts go, overriding the settings' `alerts` (docs/failures.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alerts: Option<AlertSpec>,
    /// How long this job's finished runs are kept, overriding the `retention.max_age` setting.
    #[serde(
        serialize_with = "opt_duration::serialize",
        skip_serializing_if = "Option::is_none"
    )]
    pub retention: Option<Duration>,
    /// Whether the job starts paused.
    pub paused: bool,
    /// Free text shown in listings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A [`JobSpec`] as written in job files, API requests and `chime_jobs.spec`, with the defaults
/// of fields left out: the deserializing half of the spec's serde form.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredSpec {
    name: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: Option<KindName>,
    #[serde(default)]
    shards: Option<Shards>,
    #[serde(default)]
    shard_params: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    min_workers: Option<u32>,
    #[serde(default)]
    map_depth: Option<u32>,
    #[serde(default)]
    nodes: Option<Vec<Node>>,
    #[serde(default)]
    on_task_failure: Option<TaskFailurePolicy>,
    #[serde(default)]
    schedule: Option<String>,
    #[serde(default, deserialize_with = "opt_duration::deserialize")]
    every: Option<Duration>,
    #[serde(default)]
    at: Option<DateTime<FixedOffset>>,
    #[serde(default = "utc")]
    timezone: Tz,
    #[serde(default, deserialize_with = "opt_duration::deserialize")]
    jitter: Option<Duration>,
    #[serde(default)]
    start_at: Option<DateTime<FixedOffset>>,
    #[serde(default)]
    end_at: Option<DateTime<FixedOffset>>,
    #[serde(default)]
    max_runs: Option<u32>,
    #[serde(default)]
    calendar: Option<CalendarDef>,
    #[serde(default)]
    calendar_mode: CalendarMode,
    #[serde(default)]
    on_excluded: OnExcluded,
    #[serde(default)]
    params: serde_json::Value,
    #[serde(default)]
    secret_params: Vec<String>,
    #[serde(default, deserialize_with = "opt_duration::deserialize")]
    timeout: Option<Duration>,
    #[serde(default)]
    misfire: MisfirePolicy,
    #[serde(
        default = "default_misfire_grace",
        deserialize_with = "humantime_serde_compat::deserialize"
    )]
    misfire_grace: Duration,
    #[serde(
        default = "default_catchup_window",
        deserialize_with = "humantime_serde_compat::deserialize"
    )]
    catchup_window: Duration,
    #[serde(default = "default_max_catchup")]
    max_catchup: u32,
    #[serde(default)]
    concurrency: ConcurrencyPolicy,
    #[serde(default)]
    retry: RetrySpec,
    #[serde(default)]
    on_success: Vec<String>,
    #[serde(default)]
    on_failure: Vec<String>,
    #[serde(default)]
    on_complete: Vec<String>,
    #[serde(default)]
    alerts: Option<AlertSpec>,
    #[serde(default, deserialize_with = "opt_duration::deserialize")]
    retention: Option<Duration>,
    #[serde(default)]
    paused: bool,
    #[serde(default)]
    description: Option<String>,
}

impl TryFrom<StoredSpec> for JobSpec {
    type Error = String;

    fn try_from(stored: StoredSpec) -> Result<JobSpec, String> {
        if let Some(calendar) = &stored.calendar
            && let Err(problems) = calendar.compile(stored.timezone)
        {
            let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Err(format!("calendar: {}", problems.join("; ")));
        }
        Ok(JobSpec {
            when: When::from_fields(stored.schedule, stored.every, stored.at)?,
            name: stored.name,
            group: stored.group,
            kind: Kind::from_fields(KindFields {
                kind: stored.kind,
                shards: stored.shards,
                shard_params: stored.shard_params,
                min_workers: stored.min_workers,
                map_depth: stored.map_depth,
                nodes: stored.nodes,
                on_task_failure: stored.on_task_failure.is_some(),
            })?,
            on_task_failure: stored.on_task_failure.unwrap_or_default(),
            timezone: stored.timezone,
            jitter: stored.jitter,
            start_at: stored.start_at,
            end_at: stored.end_at,
            max_runs: stored.max_runs,
            calendar: stored.calendar,
            calendar_mode: stored.calendar_mode,
            on_excluded: stored.on_excluded,
            calendar_ref: None,
            params: stored.params,
            secret_params: stored.secret_params,
            timeout: stored.timeout,
            misfire: stored.misfire,
            misfire_grace: stored.misfire_grace,
            catchup_window: stored.catchup_window,
            max_catchup: stored.max_catchup,
            concurrency: stored.concurrency,
            retry: stored.retry,
            children: ChildJobs {
                on_success: stored.on_success,
                on_failure: stored.on_failure,
                on_complete: stored.on_complete,
            },
            alerts: stored.alerts,
            retention: stored.retention,
            paused: stored.paused,
            description: stored.description,
        })
    }
}

/// The jobs that run after a run of a job ends (docs/runs.md, "Child runs"): each list names
/// jobs, each at most once, at most [`MAX_CHILD_JOBS`](chime_protocol::limits::MAX_CHILD_JOBS)
/// in all. The database applies the same rule when a run ends (`chime_job_children`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ChildJobs {
    /// After the run succeeded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_success: Vec<String>,
    /// After it failed or went dead (retries exhausted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<String>,
    /// After either (not after a cancelled or skipped run).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_complete: Vec<String>,
}

impl ChildJobs {
    /// The job-file keys, in the order messages and docs list them.
    pub const FIELDS: [&'static str; 3] = ["on_success", "on_failure", "on_complete"];

    /// Whether no list names a job.
    pub fn is_empty(&self) -> bool {
        self.on_success.is_empty() && self.on_failure.is_empty() && self.on_complete.is_empty()
    }

    /// Each list with its key, in [`ChildJobs::FIELDS`] order.
    pub fn lists(&self) -> [(&'static str, &[String]); 3] {
        [
            ("on_success", &self.on_success),
            ("on_failure", &self.on_failure),
            ("on_complete", &self.on_complete),
        ]
    }

    /// Every job named, with the key of the first list naming it, each once.
    pub fn named(&self) -> Vec<(&'static str, &str)> {
        let mut named: Vec<(&'static str, &str)> = Vec::new();
        for (field, jobs) in self.lists() {
            for job in jobs {
                if !named.iter().any(|(_, seen)| seen == job) {
                    named.push((field, job));
                }
            }
        }
        named
    }

    /// The jobs a run ending in `state` starts: `on_success` then `on_complete` after
    /// `succeeded`; `on_failure` then `on_complete` after `failed`, `dead` or `lost`; none
    /// otherwise. Each once, as `chime_job_children` computes it.
    pub fn after(&self, state: &str) -> Vec<&str> {
        let first: &[String] = match state {
            "succeeded" => &self.on_success,
            "failed" | "dead" | "lost" => &self.on_failure,
            _ => return Vec::new(),
        };
        let mut jobs: Vec<&str> = Vec::new();
        for job in first.iter().chain(&self.on_complete) {
            if !jobs.contains(&job.as_str()) {
                jobs.push(job);
            }
        }
        jobs
    }
}

/// When a job fires: the one rule that `schedule`, `every` and `at` exclude each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// `schedule`: a cron expression, read in the job's `timezone`.
    Cron(String),
    /// `every`: a fixed rate, aligned to the Unix epoch ("30s" fires at :00 and :30).
    Every(Duration),
    /// `at`: once, at this instant.
    At(DateTime<FixedOffset>),
    /// None of the three: only when triggered.
    Manual,
}

impl When {
    /// The job-file keys, in the order messages and docs list them.
    pub const FIELDS: [&'static str; 3] = ["schedule", "every", "at"];

    /// The value of at most one of the job-file keys `schedule`, `every` and `at`; none is
    /// [`When::Manual`]. Two or three are refused with [`When::conflict`].
    pub fn from_fields(
        schedule: Option<String>,
        every: Option<Duration>,
        at: Option<DateTime<FixedOffset>>,
    ) -> Result<When, String> {
        match (schedule, every, at) {
            (None, None, None) => Ok(When::Manual),
            (Some(expr), None, None) => Ok(When::Cron(expr)),
            (None, Some(period), None) => Ok(When::Every(period)),
            (None, None, Some(at)) => Ok(When::At(at)),
            (schedule, every, at) => {
                let given = [schedule.is_some(), every.is_some(), at.is_some()];
                let fields: Vec<&str> = When::FIELDS
                    .into_iter()
                    .zip(given)
                    .filter_map(|(field, given)| given.then_some(field))
                    .collect();
                Err(When::conflict(&fields))
            }
        }
    }

    /// The message for a job that sets several of `schedule`, `every` and `at`: `fields`.
    pub fn conflict(fields: &[&str]) -> String {
        let quoted: Vec<String> = fields.iter().map(|field| format!("{field:?}")).collect();
        let named = match quoted.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => quoted.join(""),
        };
        format!(
            "{named} are {} set, but a job has at most one of \"schedule\", \"every\" and \
             \"at\"; keep one, or none for a job that runs only when triggered",
            if fields.len() == 2 { "both" } else { "all" }
        )
    }
}

impl Serialize for When {
    /// As the one job-file key it is written with (`{"every": "30s"}`), or no key for
    /// [`When::Manual`]; flattened into the [`JobSpec`].
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(usize::from(*self != When::Manual)))?;
        match self {
            When::Cron(expr) => map.serialize_entry("schedule", expr)?,
            When::Every(period) => {
                map.serialize_entry("every", &humantime::format_duration(*period).to_string())?
            }
            When::At(at) => map.serialize_entry("at", at)?,
            When::Manual => {}
        }
        map.end()
    }
}

/// What one fire of a job runs, with the fields of its kind. Written `kind` in job files;
/// absent means `single`, and a `single` job is stored without the key, so definitions from
/// before kinds existed read and store as they did.
///
/// Its serde form is flattened into the [`JobSpec`] as flat keys next to `name` and `group`
/// (`"kind": "sharded", "shards": 4, "shard_params": [...]`), the keys SQL reads from
/// `chime_jobs.spec`; each field is left out while it has its default. It is read back by
/// [`Kind::from_fields`], through the spec's stored form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Kind {
    /// One run per fire, executed by one worker of the group.
    #[default]
    Single,
    /// One task per worker of the group online at the fire.
    Broadcast {
        /// A fire with fewer workers of the group online fails, with the reason
        /// (`min_workers`, 1 to `MAX_WORKERS_PER_GROUP`).
        min_workers: u32,
    },
    /// One task per shard, each handed its shard index and its own params.
    Sharded {
        /// How many shards (`shards`).
        shards: Shards,
        /// Shard `i`'s params at index `i` (`shard_params`), `null` where none was given;
        /// empty when none was given at all. No longer than the shard count when that is a
        /// number; with [`Shards::Workers`], entries past the workers online are unused.
        params: Vec<serde_json::Value>,
    },
    /// A root task that may hand items out as sub-tasks (`ctx.map`) and reduce their outputs.
    MapReduce {
        /// How deep `ctx.map` may nest (`map_depth`): the root task is depth 0, the tasks it
        /// maps depth 1, and so on; 1 to `MAX_MAP_DEPTH`.
        map_depth: u32,
    },
    /// A DAG of other jobs' runs (docs/workflows.md): declared under `[[workflows]]`.
    Workflow {
        /// Its nodes (`nodes`), 1 to `MAX_WORKFLOW_NODES`, acyclic.
        nodes: Vec<Node>,
    },
}

/// How many shards a sharded job's fire makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shards {
    /// This many (`shards = 4`), 1 to `MAX_SHARDS`.
    Count(u32),
    /// One per worker of the group online at the fire (`shards = "workers"`).
    Workers,
}

impl Shards {
    /// The word `shards` takes for [`Shards::Workers`].
    pub const WORKERS: &'static str = "workers";
}

impl Serialize for Shards {
    /// As the JSON number, or the string `"workers"`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Shards::Count(n) => s.serialize_u32(*n),
            Shards::Workers => s.serialize_str(Shards::WORKERS),
        }
    }
}

impl<'de> Deserialize<'de> for Shards {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Shards, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Count(u32),
            Word(String),
        }
        match Form::deserialize(d)? {
            Form::Count(n) => Ok(Shards::Count(n)),
            Form::Word(word) if word == Shards::WORKERS => Ok(Shards::Workers),
            Form::Word(word) => Err(serde::de::Error::custom(format!(
                "field \"shards\" = {word:?}: expected a whole number or \"workers\""
            ))),
        }
    }
}

/// What a failed task does to the run of a `broadcast`, `sharded` or `map_reduce` job
/// (`on_task_failure`), once the task has used up its retries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskFailurePolicy {
    /// The run fails.
    #[default]
    Fail,
    /// The run goes on, and succeeds when the other tasks do; the failed task stays recorded.
    Ignore,
}

impl TaskFailurePolicy {
    /// Every policy, as job files spell them.
    pub const NAMES: &'static [&'static str] = &["fail", "ignore"];

    /// Whether it is the default, [`TaskFailurePolicy::Fail`] (left out of the stored form).
    pub fn is_fail(&self) -> bool {
        *self == TaskFailurePolicy::Fail
    }
}

/// The kind-specific keys of a job definition as given, before they are checked against the
/// kind: what [`Kind::from_fields`] builds a [`Kind`] from.
#[derive(Debug, Default)]
pub struct KindFields {
    /// `kind`; `None` is `single`.
    pub kind: Option<KindName>,
    /// `shards`.
    pub shards: Option<Shards>,
    /// `shard_params`, as stored (the normalized list).
    pub shard_params: Option<Vec<serde_json::Value>>,
    /// `min_workers`.
    pub min_workers: Option<u32>,
    /// `map_depth`.
    pub map_depth: Option<u32>,
    /// `nodes`.
    pub nodes: Option<Vec<Node>>,
    /// Whether `on_task_failure` was given.
    pub on_task_failure: bool,
}

/// A kind's name alone, as job files spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KindName {
    /// `single`
    Single,
    /// `broadcast`
    Broadcast,
    /// `sharded`
    Sharded,
    /// `map_reduce`
    MapReduce,
    /// `workflow`
    Workflow,
}

impl KindName {
    /// As job files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            KindName::Single => "single",
            KindName::Broadcast => "broadcast",
            KindName::Sharded => "sharded",
            KindName::MapReduce => "map_reduce",
            KindName::Workflow => "workflow",
        }
    }

    /// The kind a job file's word names, if any.
    pub fn parse(word: &str) -> Option<KindName> {
        [
            KindName::Single,
            KindName::Broadcast,
            KindName::Sharded,
            KindName::MapReduce,
            KindName::Workflow,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == word)
    }
}

impl Kind {
    /// Every kind, as job files spell them.
    pub const NAMES: &'static [&'static str] =
        &["single", "broadcast", "sharded", "map_reduce", "workflow"];

    /// The kind-specific fields, each with the kinds it applies to, in the order messages and
    /// docs list them. Any other kind refuses them ([`Kind::misplaced`]).
    pub const FIELDS: &'static [(&'static str, &'static [KindName])] = &[
        ("shards", &[KindName::Sharded]),
        ("shard_params", &[KindName::Sharded]),
        ("min_workers", &[KindName::Broadcast]),
        ("map_depth", &[KindName::MapReduce]),
        ("nodes", &[KindName::Workflow]),
        (
            "on_task_failure",
            &[KindName::Broadcast, KindName::Sharded, KindName::MapReduce],
        ),
    ];

    /// `min_workers` when not given.
    pub const DEFAULT_MIN_WORKERS: u32 = 1;
    /// `map_depth` when not given.
    pub const DEFAULT_MAP_DEPTH: u32 = 3;

    /// As job files spell it.
    pub fn as_str(&self) -> &'static str {
        self.name().as_str()
    }

    /// Its name alone.
    pub fn name(&self) -> KindName {
        match self {
            Kind::Single => KindName::Single,
            Kind::Broadcast { .. } => KindName::Broadcast,
            Kind::Sharded { .. } => KindName::Sharded,
            Kind::MapReduce { .. } => KindName::MapReduce,
            Kind::Workflow { .. } => KindName::Workflow,
        }
    }

    /// Whether it is the default kind, [`Kind::Single`] (stored without the `kind` key).
    pub fn is_single(&self) -> bool {
        *self == Kind::Single
    }

    /// Whether the kind-specific `field` applies to `kind`; a field that is not kind-specific
    /// applies to every kind.
    pub fn applies(field: &str, kind: KindName) -> bool {
        Kind::FIELDS
            .iter()
            .find(|(name, _)| *name == field)
            .is_none_or(|(_, kinds)| kinds.contains(&kind))
    }

    /// The message for the kind-specific `field` given to a job of a kind it does not apply to.
    pub fn misplaced(field: &str) -> String {
        let kinds = Kind::FIELDS
            .iter()
            .find(|(name, _)| *name == field)
            .map_or(&[][..], |(_, kinds)| *kinds);
        match kinds {
            [one] => format!(
                "applies to kind = \"{kind}\" only; remove it or set kind = \"{kind}\"",
                kind = one.as_str()
            ),
            _ => {
                let names: Vec<String> = kinds
                    .iter()
                    .map(|kind| format!("{:?}", kind.as_str()))
                    .collect();
                let named = match names.split_last() {
                    Some((last, rest)) if !rest.is_empty() => {
                        format!("{} or {last}", rest.join(", "))
                    }
                    _ => names.join(""),
                };
                format!("applies to kind = {named} only; remove it or set one of those kinds")
            }
        }
    }

    /// The message for a sharded job without `shards`.
    pub fn missing_shards() -> String {
        format!(
            "missing; kind = \"sharded\" needs the number of shards, a whole number from 1 to \
             {}, such as shards = 4, or shards = \"workers\" for one shard per worker of the \
             group online at the fire",
            chime_protocol::limits::MAX_SHARDS
        )
    }

    /// The kind the kind-specific keys of a definition describe, with the defaults of the keys
    /// not given. Refuses a key given for a kind it does not apply to ([`Kind::misplaced`]) and
    /// a sharded kind without `shards`, each message starting with the field's name. The
    /// values' bounds are the validation's (`crate::config::validate_job`).
    pub fn from_fields(fields: KindFields) -> Result<Kind, String> {
        let name = fields.kind.unwrap_or(KindName::Single);
        let given = [
            ("shards", fields.shards.is_some()),
            ("shard_params", fields.shard_params.is_some()),
            ("min_workers", fields.min_workers.is_some()),
            ("map_depth", fields.map_depth.is_some()),
            ("nodes", fields.nodes.is_some()),
            ("on_task_failure", fields.on_task_failure),
        ];
        if let Some((field, _)) = given
            .iter()
            .find(|(field, given)| *given && !Kind::applies(field, name))
        {
            return Err(format!("field {field:?}: {}", Kind::misplaced(field)));
        }
        Ok(match name {
            KindName::Single => Kind::Single,
            KindName::Broadcast => Kind::Broadcast {
                min_workers: fields.min_workers.unwrap_or(Kind::DEFAULT_MIN_WORKERS),
            },
            KindName::Sharded => Kind::Sharded {
                shards: fields
                    .shards
                    .ok_or_else(|| format!("field \"shards\": {}", Kind::missing_shards()))?,
                params: fields.shard_params.unwrap_or_default(),
            },
            KindName::MapReduce => Kind::MapReduce {
                map_depth: fields.map_depth.unwrap_or(Kind::DEFAULT_MAP_DEPTH),
            },
            KindName::Workflow => Kind::Workflow {
                nodes: fields.nodes.unwrap_or_default(),
            },
        })
    }

    /// One line for `chime check`: what a fire of this kind runs.
    pub fn describe(&self) -> String {
        match self {
            Kind::Single => "single: one run, by one worker of the group".to_owned(),
            Kind::Broadcast { min_workers } => format!(
                "broadcast: one task per worker of the group online at the fire (at least \
                 {min_workers})"
            ),
            Kind::Sharded { shards, params } => {
                let count = match shards {
                    Shards::Count(1) => "1 shard".to_owned(),
                    Shards::Count(n) => format!("{n} shards"),
                    Shards::Workers => {
                        "one shard per worker of the group online at the fire".to_owned()
                    }
                };
                let given = params.iter().filter(|param| !param.is_null()).count();
                match given {
                    0 => format!("sharded: {count}"),
                    1 => format!("sharded: {count}, 1 with its own params"),
                    n => format!("sharded: {count}, {n} with their own params"),
                }
            }
            Kind::MapReduce { map_depth } => {
                format!("map_reduce: ctx.map nests at most {map_depth} deep")
            }
            Kind::Workflow { nodes } => {
                let layers = crate::workflow::layers(nodes).len();
                format!("workflow: {} nodes in {layers} layers", nodes.len())
            }
        }
    }
}

impl Serialize for Kind {
    /// As the flat keys of the job-file form (`{"kind": "broadcast", "min_workers": 2}`), each
    /// left out while it has its default, so `single` writes nothing; flattened into the
    /// [`JobSpec`].
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(None)?;
        if !self.is_single() {
            map.serialize_entry("kind", self.as_str())?;
        }
        match self {
            Kind::Single => {}
            Kind::Broadcast { min_workers } => {
                if *min_workers != Kind::DEFAULT_MIN_WORKERS {
                    map.serialize_entry("min_workers", min_workers)?;
                }
            }
            Kind::Sharded { shards, params } => {
                map.serialize_entry("shards", shards)?;
                if !params.is_empty() {
                    map.serialize_entry("shard_params", params)?;
                }
            }
            Kind::MapReduce { map_depth } => {
                if *map_depth != Kind::DEFAULT_MAP_DEPTH {
                    map.serialize_entry("map_depth", map_depth)?;
                }
            }
            Kind::Workflow { nodes } => map.serialize_entry("nodes", nodes)?,
        }
        map.end()
    }
}

/// Misfire (catch-up) policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// Record missed fires as skipped; resume with the next future fire.
    Skip,
    /// Run the latest missed fire once; record the others as skipped.
    #[default]
    FireOnce,
    /// Run every missed fire inside the catch-up window, up to `max_catchup`.
    FireAll,
}

/// Retry policy: `max_attempts` in all; the delay before attempt `n + 1` is
/// `min(max, initial × multiplier^(n−1))`, spread by ±20 % with `jitter` (docs/failures.md).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included; 1 = no retry.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Delay before the second attempt.
    #[serde(default = "default_retry_initial", with = "humantime_serde_compat")]
    pub initial: Duration,
    /// Factor applied to the delay after each further failure.
    #[serde(default = "default_retry_multiplier")]
    pub multiplier: f64,
    /// Upper bound of any delay.
    #[serde(default = "default_retry_max", with = "humantime_serde_compat")]
    pub max: Duration,
    /// Spread delays by a random factor in [0.8, 1.2].
    #[serde(default = "default_jitter")]
    pub jitter: bool,
}

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: default_max_attempts(),
            initial: default_retry_initial(),
            multiplier: default_retry_multiplier(),
            max: default_retry_max(),
            jitter: default_jitter(),
        }
    }
}

impl RetrySpec {
    /// The policy as it travels in the trigger message, inside the documented limits
    /// (`chime_protocol::limits`) whatever the spec says: validation keeps new definitions inside
    /// them, and this clamps a definition stored before they were checked, so no trigger
    /// carries a value a worker would refuse.
    pub fn to_wire(&self) -> chime_protocol::wire::RetryPolicy {
        use chime_protocol::limits::{MAX_ATTEMPTS, MAX_MULTIPLIER, MAX_RETRY_DELAY};
        let ms = |d: Duration| u64::try_from(d.min(MAX_RETRY_DELAY).as_millis()).unwrap_or(0);
        let multiplier = if self.multiplier.is_finite() {
            self.multiplier.clamp(1.0, MAX_MULTIPLIER)
        } else {
            1.0
        };
        chime_protocol::wire::RetryPolicy {
            max_attempts: self.max_attempts.clamp(1, MAX_ATTEMPTS),
            initial_ms: ms(self.initial),
            multiplier,
            max_ms: ms(self.max),
            jitter: self.jitter,
        }
    }
}

fn default_max_attempts() -> u32 {
    retry::DEFAULT_MAX_ATTEMPTS
}
fn default_retry_initial() -> Duration {
    retry::DEFAULT_INITIAL
}
fn default_retry_multiplier() -> f64 {
    retry::DEFAULT_MULTIPLIER
}
fn default_retry_max() -> Duration {
    retry::DEFAULT_MAX_DELAY
}
fn default_jitter() -> bool {
    retry::DEFAULT_JITTER
}

/// A job's own alert target: its webhook and body format, each overriding the settings'.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertSpec {
    /// Webhook URL (`http://` or `https://`) the job's alerts are posted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// Body format of the job's alerts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<AlertFormat>,
}

/// Body of an alert webhook.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertFormat {
    /// `{"kind", "job", "group", "run_id", "attempt", "error", "at", "text"}`.
    #[default]
    Generic,
    /// Slack-compatible incoming webhook: `{"text": …}`.
    Slack,
}

impl AlertFormat {
    /// As written in settings and job files.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertFormat::Generic => "generic",
            AlertFormat::Slack => "slack",
        }
    }

    /// The format a word names, if any.
    pub fn parse(word: &str) -> Option<AlertFormat> {
        match word {
            "generic" => Some(AlertFormat::Generic),
            "slack" => Some(AlertFormat::Slack),
            _ => None,
        }
    }
}

/// Whether a job's calendar lists the instants its fires are allowed at, or those they are not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalendarMode {
    /// Fires only at instants in the calendar.
    #[default]
    Only,
    /// Fires only at instants not in the calendar.
    Except,
}

impl CalendarMode {
    /// The words of job files.
    pub const NAMES: &'static [&'static str] = &["only", "except"];

    /// Parses the word of job files.
    pub fn parse(word: &str) -> Option<CalendarMode> {
        match word {
            "only" => Some(CalendarMode::Only),
            "except" => Some(CalendarMode::Except),
            _ => None,
        }
    }

    fn is_only(&self) -> bool {
        *self == CalendarMode::Only
    }
}

/// Cluster-wide overlap policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyPolicy {
    /// Runs may overlap.
    #[default]
    Allow,
    /// Skip a fire while a run of the job is still going.
    Forbid,
    /// Start the new run after the current one.
    Queue,
    /// Cancel the running one and start the new one.
    Replace,
}

impl ConcurrencyPolicy {
    /// The policy as the job file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConcurrencyPolicy::Allow => "allow",
            ConcurrencyPolicy::Forbid => "forbid",
            ConcurrencyPolicy::Queue => "queue",
            ConcurrencyPolicy::Replace => "replace",
        }
    }

    /// The policy a job file's word names, if any.
    pub fn parse(word: &str) -> Option<ConcurrencyPolicy> {
        match word {
            "allow" => Some(ConcurrencyPolicy::Allow),
            "forbid" => Some(ConcurrencyPolicy::Forbid),
            "queue" => Some(ConcurrencyPolicy::Queue),
            "replace" => Some(ConcurrencyPolicy::Replace),
            _ => None,
        }
    }
}

impl JobSpec {
    /// Builds the schedule this spec describes.
    pub fn schedule(&self) -> Result<Schedule, ScheduleError> {
        match &self.when {
            When::Cron(expr) => Schedule::cron(expr, self.timezone),
            When::Every(period) => Schedule::every(*period),
            When::At(at) => Ok(Schedule::At(at.to_utc())),
            When::Manual => Ok(Schedule::Manual),
        }
    }

    /// The job's fire instants: its schedule with its window and jitter.
    pub fn timing(&self) -> Result<Timing, ScheduleError> {
        Ok(self.timing_of(Arc::new(self.schedule()?)))
    }

    /// Up to `n` fires after `now` that run as the planner makes them: by `timing` (this
    /// spec's), among the fires its `max_runs` leaves after the `made` fires its schedule has
    /// made (fires its calendar skips count against it).
    pub fn upcoming(
        &self,
        timing: &Timing,
        now: DateTime<Utc>,
        n: usize,
        made: i64,
    ) -> Vec<DateTime<Utc>> {
        let left = self.max_runs.map_or(usize::MAX, |max| {
            let left = u64::from(max).saturating_sub(u64::try_from(made).unwrap_or(0));
            usize::try_from(left).unwrap_or(usize::MAX)
        });
        timing.upcoming_within(now, n, left)
    }

    /// Why [`JobSpec::upcoming`] lists no fire (`chime check`, the API's views and schedule
    /// preview say it).
    pub fn why_no_fires(&self, timing: &Timing, now: DateTime<Utc>, made: i64) -> &'static str {
        match self.when {
            When::Manual => "manual only: runs when triggered",
            _ if self.max_runs.is_some_and(|max| made >= i64::from(max)) => {
                "its schedule has made its max_runs fires"
            }
            _ if timing.ended_by_window(now) => "its end_at has passed",
            _ if timing.calendar().is_some() && timing.schedule().next_after(now).is_some() => {
                const _: () = assert!(crate::schedule::UPCOMING_SCAN == 100_000);
                "its calendar excludes every one of its next fires (100000 looked at)"
            }
            When::At(_) => "its one-shot instant has passed",
            When::Cron(_) | When::Every(_) => "the schedule never fires again",
        }
    }

    /// [`JobSpec::timing`] over `schedule`, this spec's schedule already built (and shared).
    pub fn timing_of(&self, schedule: Arc<Schedule>) -> Timing {
        self.timing_with(schedule, self.calendar_clock().map(Arc::new))
    }

    /// [`JobSpec::timing_of`] with the job's calendar already compiled (and shared): `clock`
    /// is [`JobSpec::calendar_clock`]'s, or `None` for a job without calendar.
    pub fn timing_with(
        &self,
        schedule: Arc<Schedule>,
        clock: Option<Arc<CalendarClock>>,
    ) -> Timing {
        let calendar = self
            .calendar
            .as_ref()
            .zip(clock)
            .map(|(calendar, clock)| CalendarUse {
                clock,
                name: calendar.name.clone().into_boxed_str(),
                only: self.calendar_mode == CalendarMode::Only,
                on_excluded: self.on_excluded,
            });
        Timing::plain(schedule).shaped(
            &self.name,
            self.start_at.map(|t| t.to_utc()),
            self.end_at.map(|t| t.to_utc()),
            self.jitter,
            calendar,
        )
    }

    /// The job's calendar compiled, read in its zone or the job's (`None` without calendar; a
    /// stored calendar always compiles, validation and `StoredSpec` check it).
    pub fn calendar_clock(&self) -> Option<CalendarClock> {
        self.calendar.as_ref()?.compile(self.timezone).ok()
    }
}

fn utc() -> Tz {
    Tz::UTC
}
fn default_misfire_grace() -> Duration {
    Duration::from_secs(5)
}
fn default_catchup_window() -> Duration {
    Duration::from_secs(3600)
}
fn default_max_catchup() -> u32 {
    100
}

/// Serde for `Duration` as a humantime string ("30s", "5m").
mod humantime_serde_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?}: {e}; write a number with a unit, such as \"30s\", \"5m\" or \"1h\""
            ))
        })
    }
}

/// Serde for `Option<Duration>` as a humantime string.
mod opt_duration {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::humantime_serde_compat::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::humantime_serde_compat::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests_stored;

#[cfg(test)]
mod tests {
    use super::*;
    use chime_protocol::limits::{MAX_ATTEMPTS, MAX_MULTIPLIER, MAX_RETRY_DELAY};

    /// A definition stored before the limits were checked still sends a policy inside them.
    #[test]
    fn a_stored_out_of_range_retry_policy_goes_on_the_wire_clamped() {
        let stored = RetrySpec {
            max_attempts: 3_000_000_000,
            initial: Duration::from_secs(300_000 * 366 * 24 * 3600),
            multiplier: f64::INFINITY,
            max: Duration::MAX,
            jitter: true,
        };
        let wire = stored.to_wire();
        assert_eq!(wire.max_attempts, MAX_ATTEMPTS);
        assert_eq!(wire.initial_ms, MAX_RETRY_DELAY.as_millis() as u64);
        assert_eq!(wire.max_ms, MAX_RETRY_DELAY.as_millis() as u64);
        assert_eq!(wire.multiplier, 1.0);
        let steep = RetrySpec {
            multiplier: 1e300,
            max_attempts: 0,
            ..RetrySpec::default()
        };
        assert_eq!(steep.to_wire().multiplier, MAX_MULTIPLIER);
        assert_eq!(steep.to_wire().max_attempts, 1);
        // A valid policy is sent as it is.
        let default = RetrySpec::default().to_wire();
        assert_eq!(
            (default.max_attempts, default.initial_ms, default.max_ms),
            (3, 10_000, 600_000)
        );
        assert_eq!(default.multiplier, 2.0);
    }
}
