//! The service layer of the operations surface: every runtime operation on jobs, runs, workers,
//! queues, dead letters, the leader, the audit log and API tokens, and who may do it.
//!
//! **Invariant:** this is the one place where authorization is decided. The REST API
//! ([`crate::api`]) and the CLI ([`crate::cli`]) both call [`Operations`] with a [`Caller`];
//! neither checks a role itself. Every action that changes something is written to the audit
//! log (`chime_audit`): done (`ok`), refused for the caller's role (`denied`), or refused for its
//! input or state (`failed`), with who, what, which job and run, and when.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use chime_protocol::Topology;
use chime_protocol::limits;
use chime_protocol::wire::ControlMessage;

use crate::auth::{self, Caller, Role};
use crate::broker::ControlDelivery;
use crate::config::{
    FieldError, api_link_problems, api_node_problems, validate_job, validate_params,
};
use crate::diff::FieldChange;
use crate::job::JobSpec;
use crate::parking::ParkingLot;
use crate::secrets;
use crate::store::{
    AuditQuery, AuditRecord, CancelOutcome, DeadLetterRecord, LeaderInfo, REPLAYABLE_STATES,
    ReplayOutcome, RunBrief, RunDetail, RunQuery, RunRecord, Store, TokenRecord, TriggerRequest,
    WorkerRecord,
};
use audit::{Entry, Outcome};

mod action;
mod audit;
mod backfills;
mod report;
#[cfg(test)]
mod tests_audit;
mod views;
mod workflows;

pub use action::{Action, Effect};
pub use backfills::{
    BACKFILL_STATES, BackfillCancelled, BackfillListQuery, BackfillPreview, BackfillRequest,
    BackfillStarted, BackfillsPage, DEFAULT_PARALLEL, DEFAULT_RATE, PREVIEW_FIRES, PreviewFire,
};
pub use report::{JobReport, REPORT_DAYS, REPORT_OUTCOMES, ReportDay};
pub use views::{
    DeadLetterMessage, MAX_TIMELINE_BUCKETS, PREVIEW_FIELDS, RunTimeline, SchedulePreview,
    TIMELINE_WINDOWS, TimelineBucket,
};
pub use workflows::{NodeDefinition, Reran, WorkflowDetail, WorkflowSummary};

pub use crate::broker::{Broker, QueueSource};

/// Run states, as filters accept them (docs/runs.md).
pub const RUN_STATES: &[&str] = &chime_protocol::RunState::NAMES;

/// Largest page of runs or audit entries.
pub const MAX_PAGE: i64 = 1000;

/// Most dead letters of one group one bulk replay goes through (in pages of [`MAX_PAGE`]).
const REPLAY_SCAN: i64 = 10_000;

/// One mistake in a request: the field, the value as given, what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldProblem {
    /// The field (dotted inside objects), if the mistake is about one.
    pub field: Option<String>,
    /// The value as given, compactly rendered.
    pub value: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl FieldProblem {
    fn new(field: &str, value: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        FieldProblem {
            field: Some(field.to_owned()),
            value: value.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.field, &self.value) {
            (Some(field), Some(value)) => write!(f, "field {field:?} = {value}: {}", self.message),
            (Some(field), None) => write!(f, "field {field:?}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Why an operation was not done.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The caller's role does not allow the action.
    #[error(
        "{action} needs the {needed} role, but {actor} is {has}; ask an admin for a token with that role"
    )]
    Forbidden {
        /// The action, such as `jobs.trigger`.
        action: Action,
        /// The lowest role allowed to do it.
        needed: Role,
        /// The caller's role.
        has: Role,
        /// The caller.
        actor: String,
    },
    /// What the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed; every mistake is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<FieldProblem>),
    /// The request is valid but the current state forbids it.
    #[error("{0}")]
    Conflict(String),
    /// A service it needs (the broker) cannot be reached or is not configured.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else; details are logged, not shown to API clients.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// Result of an operation.
pub type OpsResult<T> = Result<T, OpsError>;

/// A job as listed and shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    /// Job name.
    pub name: String,
    /// Executor group.
    pub group: String,
    /// The schedule in words (`cron "…" (zone)`, `every 30s`, `manual`).
    pub schedule: String,
    /// The next fire, unless paused or manual only.
    pub next_fire: Option<DateTime<Utc>>,
    /// The schedule's next [`UPCOMING`] fire times, also while paused (what resuming, or a
    /// schedule just changed, leads to).
    pub upcoming: Vec<DateTime<Utc>>,
    /// The IANA time zone the job's schedule is read in (`UTC` unless set).
    pub timezone: String,
    /// `next_fire` in the job's time zone, RFC 3339 with the zone's offset.
    pub next_fire_local: Option<String>,
    /// `upcoming` in the job's time zone, RFC 3339 with the zone's offset.
    pub upcoming_local: Vec<String>,
    /// Whether planning is paused.
    pub paused: bool,
    /// Who paused it: `file` (its job file says `paused = true`), or the operator who did
    /// (`cli:alice`, `token:ops`; `operator` when not recorded); `null` when not paused.
    pub paused_by: Option<String>,
    /// `config` (from job files; change the file) or `api` (created at runtime).
    pub source: String,
    /// The number of the definition's current version (`chime jobs history`).
    pub version: i32,
    /// The full definition, in its config-file form.
    pub spec: JobSpec,
}

/// Most definition versions a job's history lists: the latest ones (a job file reloaded with a
/// change every minute makes half a million a year).
pub const HISTORY_LIMIT: i64 = 1_000;

/// One version of a job's definition, with what changed from the version before it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VersionView {
    /// Its number.
    pub version: i32,
    /// When it was applied.
    pub at: DateTime<Utc>,
    /// Who applied it: `file` for job files, else the actor (`token:ops`, `cli:alice`).
    pub actor: String,
    /// `config` or `api`.
    pub source: String,
    /// Whether it is the definition the job has now.
    pub current: bool,
    /// The fields that differ from the version before (none for the first), secrets hidden.
    pub changes: Vec<FieldChange>,
    /// The definition (secrets hidden from those who may not see them).
    pub spec: JobSpec,
}

/// A manual trigger's run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Triggered {
    /// The new run (or, for a repeated idempotency key, the run made before).
    pub run_id: i64,
    /// Its job.
    pub job: String,
    /// False: the idempotency key named a run made before; nothing new was made.
    pub created: bool,
    /// What the caller should know: that no online worker handles the job (see
    /// [`Operations::handler_warnings`]).
    pub warnings: Vec<String>,
}

/// The options of a manual trigger besides its job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TriggerOptions {
    /// Params replacing the job's own for this run.
    pub params: Option<serde_json::Value>,
    /// The run's instant: now when `None`, else within now − 1 day ..= now + 366 days.
    pub at: Option<DateTime<Utc>>,
    /// Triggering again with the same key (1 to 200 bytes) returns the job's run of that key.
    pub idempotency_key: Option<String>,
}

/// A job just created, with what the caller should know about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Created {
    /// The job, as shown.
    #[serde(flatten)]
    pub job: JobView,
    /// That no online worker handles the job, if none does (see
    /// [`Operations::handler_warnings`]).
    pub warnings: Vec<String>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunsPage {
    /// The runs.
    pub runs: Vec<RunRecord>,
    /// Pass as `before` to get the next (older) page; none on the last page.
    pub next_before: Option<i64>,
}

/// A page of a run's tasks, in creation order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TasksPage {
    /// The parent run.
    pub run_id: i64,
    /// Its tasks created so far, ended, and ended other than `succeeded`.
    pub tasks_total: i32,
    /// Its tasks in a final state.
    pub tasks_ended: i32,
    /// Its tasks that ended other than `succeeded`.
    pub tasks_failed: i32,
    /// Its progress in words (`9/12 ok, 1 failed, 2 left`); `None` without tasks.
    pub progress: Option<String>,
    /// The tasks (outputs cut to `store::MAX_LISTED_OUTPUT_BYTES` of JSON text).
    pub tasks: Vec<RunRecord>,
    /// Pass as `after` to get the next page; none on the last page.
    pub next_after: Option<i64>,
}

/// Largest page of tasks ([`Operations::tasks`]); the default page is [`TASK_PAGE`].
pub const MAX_TASK_PAGE: i64 = MAX_PAGE;

/// Default page of tasks: what `chime runs show` lists of a parent before pointing to the next
/// page.
pub const TASK_PAGE: i64 = 100;

/// What a rerun of a run's failed tasks did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetriedFailed {
    /// The parent run, running again.
    pub run_id: i64,
    /// Its job.
    pub job: String,
    /// Tasks put back in the outbox (for a map/reduce run, its reduce task included).
    pub rerun: i32,
}

/// A page of the audit log, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditPage {
    /// The entries.
    pub entries: Vec<AuditRecord>,
    /// Pass as `before` to get the next (older) page; none on the last page.
    pub next_before: Option<i64>,
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Cancelled {
    /// The run was waiting and will not run.
    Cancelled {
        /// Run id.
        run_id: i64,
        /// Job name.
        job: String,
        /// The state it had.
        previous_state: String,
    },
    /// The run is running; its worker was asked to cancel it.
    CancelRequested {
        /// Run id.
        run_id: i64,
        /// Job name.
        job: String,
        /// A cancel had been requested before.
        requested_before: bool,
        /// Whether a worker listens for control messages (`delivered`) or not
        /// (`no_listener`: the rescuer records it cancelled once its worker is found lost).
        control_message: &'static str,
    },
}

/// The cluster at a glance, for the dashboard's overview.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// The window the run counts cover, in seconds.
    pub window_seconds: u64,
    /// Runs created within the window, by state (states without runs are 0).
    pub runs_by_state: std::collections::BTreeMap<String, i64>,
    /// Failed and dead runs among the finished ones in the window; none without finished runs.
    pub failure_rate: Option<f64>,
    /// Who leads.
    pub leader: LeaderInfo,
    /// Jobs.
    pub jobs: i64,
    /// Paused jobs.
    pub paused_jobs: i64,
    /// Workers heartbeating.
    pub workers_online: i64,
}

/// Shortest and longest overview windows.
pub const OVERVIEW_WINDOWS: (Duration, Duration) =
    (Duration::from_secs(60), Duration::from_secs(7 * 24 * 3600));

/// Every executor group's queues, and where the figures came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Queues {
    /// `management` (RabbitMQ's management HTTP API) or `passive_declare`.
    pub source: QueueSource,
    /// Why the management API was not used although `management_url` is set.
    pub management_error: Option<String>,
    /// By group.
    pub queues: Vec<QueueView>,
}

/// One executor group's queues.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueView {
    /// Executor group.
    pub group: String,
    /// Work queue name.
    pub queue: String,
    /// Messages ready in the work queue (`null` if the queue does not exist yet).
    pub depth: Option<u32>,
    /// Consumers of the work queue.
    pub consumers: Option<u32>,
    /// Messages of the work queue delivered and not yet acknowledged (management API only).
    pub unacked: Option<u32>,
    /// Messages published into the work queue per second (management API only).
    pub publish_rate: Option<f64>,
    /// Messages delivered from the work queue per second (management API only).
    pub deliver_rate: Option<f64>,
    /// Parking-lot queue name.
    pub parking_queue: String,
    /// Messages in the parking lot.
    pub parking_depth: Option<u32>,
}

/// A parked message with what the database knows of its run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its id: the order in which the leader drained it (pass as `after` for the next page).
    pub id: i64,
    /// Executor group.
    pub group: String,
    /// Run id, when the message has one.
    pub run_id: Option<i64>,
    /// Job.
    pub job: Option<String>,
    /// Attempt.
    pub attempt: Option<u32>,
    /// Why it was parked.
    pub reason: Option<String>,
    /// Last error.
    pub error: Option<String>,
    /// When it was parked.
    pub parked_at: Option<DateTime<Utc>>,
    /// Who parked it.
    pub parked_by: Option<String>,
    /// Its run's state now.
    pub run_state: Option<String>,
}

/// A page of dead letters, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterPage {
    /// The dead letters.
    pub dead_letters: Vec<DeadLetter>,
    /// Pass as `after` to get the next page; none on the last page.
    pub next_after: Option<i64>,
}

/// A replayed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replayed {
    /// Run id.
    pub run_id: i64,
    /// Job.
    pub job: String,
    /// The attempt it will be published as.
    pub attempt: i32,
    /// Dead letters of the run removed.
    pub removed_messages: u64,
}

/// A message a bulk replay left in the parking lot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// Group.
    pub group: String,
    /// Run id, if the message has one.
    pub run_id: Option<i64>,
    /// Why it was kept.
    pub note: String,
}

/// What a bulk replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayedAll {
    /// Runs replayed.
    pub replayed: Vec<i64>,
    /// Messages kept.
    pub kept: Vec<Kept>,
}

/// What a purge did to one group's parking lot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Purged {
    /// Group.
    pub group: String,
    /// Queue.
    pub queue: String,
    /// Messages deleted: dead letters drained into the database and messages still in the queue.
    pub purged: u64,
}

/// A new API token: the secret is shown this once and never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewToken {
    /// The stored token.
    #[serde(flatten)]
    pub token: TokenRecord,
    /// The secret to send as `Authorization: Bearer SECRET`.
    pub secret: String,
}

/// The operations, for one database and (optionally) one broker.
#[derive(Debug, Clone)]
pub struct Operations {
    store: Store,
    broker: Option<Broker>,
}

impl Operations {
    /// Operations on `store`; those that need the broker fail without one.
    pub fn new(store: Store, broker: Option<Broker>) -> Operations {
        Operations { store, broker }
    }

    /// The database.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Closes the broker connection these operations share (at shutdown).
    pub async fn close(&self) {
        if let Some(broker) = &self.broker {
            broker.close().await;
        }
    }

    /// The caller holding the token with this secret, if any (unrevoked).
    pub async fn authenticate(&self, secret: &str) -> OpsResult<Option<Caller>> {
        let Some(token) = self.store.token_by_hash(&auth::secret_hash(secret)).await? else {
            return Ok(None);
        };
        let role = Role::parse(&token.role).ok_or_else(|| {
            anyhow::anyhow!("token {:?} has unknown role {:?}", token.name, token.role)
        })?;
        Ok(Some(Caller::token(&token.name, role)))
    }

    /// The job's declared `secret_params`; none when it does not exist or cannot be read (the
    /// naming convention of `crate::secrets` still applies).
    async fn declared_secrets(&self, job: &str) -> Vec<String> {
        if job.len() > limits::MAX_NAME_BYTES {
            return Vec::new();
        }
        match self.store.job(job).await {
            Ok(Some(record)) => record.spec.secret_params,
            _ => Vec::new(),
        }
    }

    /// Hides sensitive params and the values they leak into errors and log lines from a caller
    /// who may not see secrets (viewers), for runs of the jobs `runs` name.
    async fn hide_run_secrets<'r>(
        &self,
        caller: &Caller,
        runs: impl IntoIterator<Item = &'r mut RunRecord>,
    ) -> Vec<Vec<String>> {
        let mut declared: HashMap<String, Vec<String>> = HashMap::new();
        let mut found = Vec::new();
        for run in runs {
            if sees_secrets(caller) {
                found.push(Vec::new());
                continue;
            }
            if !declared.contains_key(&run.job) {
                let secret_params = self.declared_secrets(&run.job).await;
                declared.insert(run.job.clone(), secret_params);
            }
            let names = &declared[&run.job];
            let mut values = secrets::secret_values(&run.params, names);
            run.params = secrets::redact_params(&run.params, names);
            if let Some(param) = &mut run.shard_param {
                values.extend(secrets::secret_values(param, names));
                *param = secrets::redact_params(param, names);
            }
            for text in [&mut run.error, &mut run.reason].into_iter().flatten() {
                *text = secrets::scrub(text, &values);
            }
            if let Some(output) = &mut run.output {
                *output = secrets::scrub_json(&secrets::redact_params(output, names), &values);
            }
            found.push(values);
        }
        found
    }

    /// For a caller who may not see secrets, the secret values of each of the runs `ids` (their
    /// sensitive params), to scrub from texts about them; nothing for operators and admins.
    pub(crate) async fn run_secret_texts(
        &self,
        caller: &Caller,
        ids: &[i64],
    ) -> OpsResult<HashMap<i64, Vec<String>>> {
        let mut found = HashMap::new();
        if sees_secrets(caller) || ids.is_empty() {
            return Ok(found);
        }
        let mut declared: HashMap<String, Vec<String>> = HashMap::new();
        for (id, job, params) in self.store.run_params(ids).await? {
            if !declared.contains_key(&job) {
                let names = self.declared_secrets(&job).await;
                declared.insert(job.clone(), names);
            }
            found.insert(id, secrets::secret_values(&params, &declared[&job]));
        }
        Ok(found)
    }

    /// The broker's queue prefix, when this has a broker.
    pub fn broker_prefix(&self) -> Option<&str> {
        self.broker.as_ref().map(|b| b.queue_prefix.as_str())
    }

    fn broker(&self) -> OpsResult<&Broker> {
        self.broker.as_ref().ok_or_else(|| {
            OpsError::Unavailable("this operation needs the broker's URL and prefix".into())
        })
    }

    // ---- jobs ----------------------------------------------------------------------------

    /// Every job, by name.
    pub async fn jobs(&self, caller: &Caller) -> OpsResult<Vec<JobView>> {
        self.authorize(caller, Action::JobsList, Entry::none())
            .await?;
        let now = Utc::now();
        Ok(self
            .store
            .jobs()
            .await?
            .into_iter()
            .map(|j| shown_to(caller, job_view(j, now)))
            .collect())
    }

    /// One job.
    pub async fn job(&self, caller: &Caller, name: &str) -> OpsResult<JobView> {
        self.authorize(caller, Action::JobsShow, Entry::job(name))
            .await?;
        Ok(shown_to(caller, self.existing_job(name).await?))
    }

    async fn existing_job(&self, name: &str) -> OpsResult<JobView> {
        match self.store.job(name).await? {
            Some(job) => Ok(job_view(job, Utc::now())),
            None => Err(no_such_job(name)),
        }
    }

    /// Whether the jobs `spec`'s child lists name exist among the stored jobs, and no link
    /// leads back to it (docs/configuration.md, "Child jobs").
    /// For a workflow, also whether each node's job exists and is not a workflow
    /// (docs/workflows.md).
    async fn child_links_hold(&self, spec: &JobSpec) -> OpsResult<()> {
        if let crate::job::Kind::Workflow { nodes } = &spec.kind {
            let names: Vec<String> = nodes.iter().map(|n| n.job.clone()).collect();
            let kinds = self.store.job_kinds(&names).await?;
            let problems = api_node_problems(&spec.kind, &kinds);
            if !problems.is_empty() {
                return Err(invalid(problems));
            }
        }
        if spec.children.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = spec
            .children
            .named()
            .into_iter()
            .map(|(_, job)| job.to_owned())
            .collect();
        let stored = self.store.child_links(&names).await?;
        let problems = api_link_problems(&spec.name, &spec.children, &stored);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(invalid(problems))
        }
    }

    /// Creates a job at runtime from its definition (the job-file form, as JSON).
    pub async fn create_job(
        &self,
        caller: &Caller,
        definition: serde_json::Value,
    ) -> OpsResult<Created> {
        let name = definition
            .get("name")
            .and_then(|n| n.as_str())
            .map(str::to_owned);
        let entry =
            Entry::job_named(name.as_deref()).detail(serde_json::json!({"definition": definition}));
        self.audited(caller, Action::JobsCreate, entry, async |_| {
            let spec = validated(&definition)?;
            self.child_links_hold(&spec).await?;
            if !self.store.create_api_job(&spec, &caller.actor).await? {
                return Err(OpsError::Conflict(format!(
                    "a job named {:?} already exists; choose another name, or change it with \
                     PATCH /api/jobs/{}",
                    spec.name, spec.name
                )));
            }
            let job = self.existing_job(&spec.name).await?;
            let warnings = self.handler_warnings(&job.name).await;
            Ok(Created { job, warnings })
        })
        .await
    }

    /// Changes fields of a job created at runtime (schedule, params, policies, …): `changes`
    /// holds the fields to set, in the job-file form; `null` removes an optional field.
    pub async fn update_job(
        &self,
        caller: &Caller,
        name: &str,
        changes: serde_json::Value,
    ) -> OpsResult<JobView> {
        let entry = Entry::job(name).detail(serde_json::json!({"changes": changes}));
        self.audited(caller, Action::JobsUpdate, entry, async |_| {
            let serde_json::Value::Object(changes) = &changes else {
                return Err(OpsError::Invalid(vec![FieldProblem {
                    field: None,
                    value: Some(changes.to_string()),
                    message: "the body must be a JSON object of the fields to change, such as \
                              {\"schedule\": \"0 */5 * * * *\"}"
                        .into(),
                }]));
            };
            let job = self.existing_job(name).await?;
            if job.source != "api" {
                return Err(OpsError::Conflict(format!(
                    "job {name:?} is declared in a job file; change the file and reload \
                     (SIGHUP), or the next reload would undo the change"
                )));
            }
            if let Some(paused) = changes.get("paused") {
                return Err(OpsError::Invalid(vec![FieldProblem::new(
                    "paused",
                    paused.to_string(),
                    format!(
                        "pause and resume a job with POST /api/jobs/{name}/pause and /resume \
                         (or `chime jobs pause {name}`)"
                    ),
                )]));
            }
            if let Some(new) = changes.get("name").filter(|n| n.as_str() != Some(name)) {
                return Err(OpsError::Invalid(vec![FieldProblem::new(
                    "name",
                    new.to_string(),
                    "a job cannot be renamed; create a new job and delete this one",
                )]));
            }
            let mut definition =
                match serde_json::to_value(&job.spec).map_err(anyhow::Error::from)? {
                    serde_json::Value::Object(map) => map,
                    _ => unreachable!("a JobSpec serialises to an object"),
                };
            for (key, value) in changes {
                definition.insert(key.clone(), value.clone());
            }
            let spec = validated(&serde_json::Value::Object(definition))?;
            self.child_links_hold(&spec).await?;
            if !self.store.update_api_job(&spec, &caller.actor).await? {
                return Err(no_such_job(name));
            }
            self.existing_job(name).await
        })
        .await
    }

    /// Job `name`'s latest [`HISTORY_LIMIT`] definition versions, oldest first, each with its
    /// changes from the one before; those of a deleted job too.
    pub async fn job_history(&self, caller: &Caller, name: &str) -> OpsResult<Vec<VersionView>> {
        self.authorize(caller, Action::JobsHistory, Entry::job(name))
            .await?;
        let versions = self.store.job_versions(name, HISTORY_LIMIT).await?;
        if versions.is_empty() {
            return Err(no_such_job(name));
        }
        let current = self.store.job(name).await?.map(|job| job.version);
        // One more than shown when there are more: the oldest shown is diffed against it.
        let (mut before, shown) = match versions.split_first() {
            Some((first, rest)) if versions.len() as i64 > HISTORY_LIMIT => {
                (Some(&first.spec), rest)
            }
            _ => (None, &versions[..]),
        };
        let mut views = Vec::with_capacity(shown.len());
        for version in shown {
            let changes = before.map_or_else(Vec::new, |before| {
                crate::diff::field_changes(before, &version.spec)
            });
            let spec = if sees_secrets(caller) {
                version.spec.clone()
            } else {
                secrets::redact_spec(&version.spec)
            };
            views.push(VersionView {
                version: version.version,
                at: version.at,
                actor: version.actor.clone(),
                source: version.source.clone(),
                current: current == Some(version.version),
                changes,
                spec,
            });
            before = Some(&version.spec);
        }
        Ok(views)
    }

    /// Puts back version `to` of a job created at runtime, as a new version (the history keeps
    /// every step); its cursor and pause state stay, as with any change.
    pub async fn rollback_job(&self, caller: &Caller, name: &str, to: i32) -> OpsResult<JobView> {
        let entry = Entry::job(name).detail(serde_json::json!({"to": to}));
        self.audited(caller, Action::JobsRollback, entry, async |_| {
            let job = self.existing_job(name).await?;
            if job.source != "api" {
                return Err(OpsError::Conflict(format!(
                    "job {name:?} is declared in a job file; roll back the file (its version \
                     control) and reload (SIGHUP), or the next reload would undo the change"
                )));
            }
            let (found, last) = self.store.job_version(name, to).await?;
            let Some(version) = found else {
                return Err(OpsError::NotFound(format!(
                    "job {name:?} has no version {to}; its versions are 1 to {last} (`chime \
                     jobs history {name}`)"
                )));
            };
            if to == job.version {
                return Err(OpsError::Conflict(format!(
                    "version {to} is the current definition of job {name:?}; nothing to roll back"
                )));
            }
            // Validated again: limits may have tightened since that version was stored.
            let spec =
                validated(&serde_json::to_value(&version.spec).map_err(anyhow::Error::from)?)?;
            self.child_links_hold(&spec).await?;
            if !self.store.update_api_job(&spec, &caller.actor).await? {
                return Err(no_such_job(name));
            }
            self.existing_job(name).await
        })
        .await
    }

    /// Deletes a job created at runtime; its runs stay.
    pub async fn delete_job(&self, caller: &Caller, name: &str) -> OpsResult<()> {
        self.audited(caller, Action::JobsDelete, Entry::job(name), async |_| {
            let job = self.existing_job(name).await?;
            if job.source != "api" {
                return Err(OpsError::Conflict(format!(
                    "job {name:?} is declared in a job file; remove it from the file and reload \
                     (SIGHUP)"
                )));
            }
            let upstream = self.store.jobs_naming(&[name.to_owned()]).await?;
            if !upstream.is_empty() {
                let names: Vec<&str> = upstream.iter().map(|(job, _)| job.as_str()).collect();
                return Err(OpsError::Conflict(format!(
                    "job {name:?} is a child job of {}: their runs would start it; remove it \
                     from their on_success, on_failure and on_complete lists first",
                    names.join(", ")
                )));
            }
            let workflows = self.store.workflows_naming(&[name.to_owned()]).await?;
            if !workflows.is_empty() {
                let names: Vec<&str> = workflows.iter().map(|(w, _)| w.as_str()).collect();
                return Err(OpsError::Conflict(format!(
                    "job {name:?} is a node's job in workflow {}: their runs would fail; remove \
                     the node first",
                    names.join(", ")
                )));
            }
            if !self.store.delete_api_job(name, &caller.actor).await? {
                return Err(no_such_job(name));
            }
            Ok(())
        })
        .await
    }

    /// Pauses (`true`) or resumes (`false`) planning a job's fires.
    pub async fn set_paused(
        &self,
        caller: &Caller,
        name: &str,
        paused: bool,
    ) -> OpsResult<JobView> {
        let action = if paused {
            Action::JobsPause
        } else {
            Action::JobsResume
        };
        self.audited(caller, action, Entry::job(name), async |_| {
            if !self.store.set_paused(name, paused, &caller.actor).await? {
                return Err(no_such_job(name));
            }
            self.existing_job(name).await
        })
        .await
    }

    /// A warning when no online worker of `job`'s group declares a handler for it: its runs
    /// wait for one (each worker's `unhandled_wait`, 5 min by default), then are parked. Empty
    /// when one does, or when the registry cannot be read (the warning is advice, not a check).
    pub async fn handler_warnings(&self, job: &str) -> Vec<String> {
        match self.store.unhandled_job_group(job).await {
            Ok(Some(group)) => vec![format!(
                "no online worker of group `{group}` has a handler for `{job}`; its runs wait for \
                 one (the workers' unhandled_wait, 5 min by default), then are parked"
            )],
            Ok(None) => Vec::new(),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), job, "cannot look for a worker with the job's handler");
                Vec::new()
            }
        }
    }

    /// Triggers a job now (paused jobs too); `params` replaces the job's own for this run.
    pub async fn trigger(
        &self,
        caller: &Caller,
        name: &str,
        params: Option<serde_json::Value>,
    ) -> OpsResult<Triggered> {
        let options = TriggerOptions {
            params,
            ..TriggerOptions::default()
        };
        self.trigger_with(caller, name, options).await
    }

    /// Triggers a run of job `name` (paused jobs too) with `options`, through the database's
    /// `chime_trigger`, which validates it, makes (or, for a repeated idempotency key, finds)
    /// the run, writes its audit entry and wakes the leader.
    pub async fn trigger_with(
        &self,
        caller: &Caller,
        name: &str,
        options: TriggerOptions,
    ) -> OpsResult<Triggered> {
        let entry = Entry::job(name).detail(serde_json::json!({"params": options.params}));
        self.audited_in_store(caller, Action::JobsTrigger, entry, async |entry, detail| {
            if let Some(params) = &options.params {
                // The nesting and NUL checks beyond chime_trigger's (which bounds the size).
                validate_params(params).map_err(|e| {
                    OpsError::Invalid(vec![FieldProblem {
                        field: e.field,
                        value: e.value,
                        message: e.message,
                    }])
                })?;
            }
            let request = TriggerRequest {
                job: name,
                params: options.params.as_ref(),
                at: options.at,
                idempotency_key: options.idempotency_key.as_deref(),
                requested_by: &caller.actor,
                audit_role: caller.role.as_str(),
                audit_detail: detail,
            };
            let run = match self.store.trigger_with(&request).await? {
                Ok(run) => run,
                Err(refusal) if refusal.field == "job" => return Err(no_such_job(name)),
                Err(refusal) => {
                    let field = match refusal.field.as_str() {
                        "run_at" => "at".to_owned(),
                        other => other.to_owned(),
                    };
                    return Err(OpsError::Invalid(vec![FieldProblem {
                        field: Some(field),
                        value: refusal.value,
                        message: refusal.message,
                    }]));
                }
            };
            entry.run_id = Some(run.run_id);
            Ok(Triggered {
                run_id: run.run_id,
                job: name.to_owned(),
                created: run.created,
                warnings: self.handler_warnings(name).await,
            })
        })
        .await
    }

    // ---- runs ----------------------------------------------------------------------------

    /// A page of runs, newest first.
    pub async fn runs(&self, caller: &Caller, query: RunQuery) -> OpsResult<RunsPage> {
        self.authorize(
            caller,
            Action::RunsList,
            Entry::job_named(query.job.as_deref()),
        )
        .await?;
        let mut problems = Vec::new();
        if let Some(state) = &query.state
            && !RUN_STATES.contains(&state.as_str())
        {
            problems.push(FieldProblem::new(
                "state",
                format!("{state:?}"),
                format!("unknown run state; use one of {}", RUN_STATES.join(", ")),
            ));
        }
        if !(1..=MAX_PAGE).contains(&query.limit) {
            problems.push(FieldProblem::new(
                "limit",
                query.limit.to_string(),
                format!("use a page size from 1 to {MAX_PAGE}"),
            ));
        }
        if !problems.is_empty() {
            return Err(OpsError::Invalid(problems));
        }
        let limit = query.limit;
        let runs = self
            .store
            .runs_page(&RunQuery {
                limit: limit + 1,
                ..query
            })
            .await?;
        let (mut runs, next_before) = keyset_page(runs, limit, |r| r.id);
        self.hide_run_secrets(caller, runs.iter_mut()).await;
        Ok(RunsPage { runs, next_before })
    }

    /// One run with its attempts and log lines (a task with its parent, a parent with its
    /// tasks counted by state).
    pub async fn run(&self, caller: &Caller, id: i64) -> OpsResult<RunDetail> {
        self.authorize(caller, Action::RunsShow, Entry::run(id))
            .await?;
        let mut detail = self.store.run(id).await?.ok_or_else(|| no_such_run(id))?;
        if let Some(parent) = &mut detail.parent {
            self.hide_run_secrets(caller, [&mut **parent]).await;
        }
        let values = self
            .hide_run_secrets(caller, [&mut detail.run])
            .await
            .pop()
            .unwrap_or_default();
        if !values.is_empty() {
            for attempt in &mut detail.attempts {
                if let Some(error) = &mut attempt.error {
                    *error = secrets::scrub(error, &values);
                }
            }
            for line in &mut detail.logs {
                line.message = secrets::scrub(&line.message, &values);
            }
        }
        Ok(detail)
    }

    /// A page of run `id`'s tasks in creation order: after task id `after`, only in `state`
    /// when given, at most `limit` (1 ..= [`MAX_TASK_PAGE`]). A run without tasks has an
    /// empty page.
    pub async fn tasks(
        &self,
        caller: &Caller,
        id: i64,
        after: Option<i64>,
        state: Option<String>,
        limit: i64,
    ) -> OpsResult<TasksPage> {
        self.authorize(caller, Action::RunsShow, Entry::run(id))
            .await?;
        let mut problems = Vec::new();
        if let Some(state) = &state
            && !RUN_STATES.contains(&state.as_str())
        {
            problems.push(FieldProblem::new(
                "state",
                format!("{state:?}"),
                format!("unknown run state; use one of {}", RUN_STATES.join(", ")),
            ));
        }
        if !(1..=MAX_TASK_PAGE).contains(&limit) {
            problems.push(FieldProblem::new(
                "limit",
                limit.to_string(),
                format!("use a page size from 1 to {MAX_TASK_PAGE}"),
            ));
        }
        if !problems.is_empty() {
            return Err(OpsError::Invalid(problems));
        }
        let Some(counts) = self.store.task_counts(id).await? else {
            return Err(no_such_run(id));
        };
        let rows = self
            .store
            .tasks_page(&crate::store::TaskQuery {
                parent: id,
                after,
                state,
                limit: limit + 1,
            })
            .await?;
        let (mut tasks, next_after) = keyset_page(rows, limit, |t| t.id);
        self.hide_run_secrets(caller, tasks.iter_mut()).await;
        Ok(TasksPage {
            run_id: id,
            tasks_total: counts.total,
            tasks_ended: counts.ended,
            tasks_failed: counts.failed,
            progress: crate::store::task_progress(counts.total, counts.ended, counts.failed),
            tasks,
            next_after,
        })
    }

    /// Reruns the tasks of finished run `id` that did not succeed, in the same run
    /// (`chime_retry_failed`): each one's next attempt with its retry budget renewed, and a
    /// map/reduce run's reduce task after them; the run is running again.
    pub async fn retry_failed(&self, caller: &Caller, id: i64) -> OpsResult<RetriedFailed> {
        self.audited(
            caller,
            Action::RunsRetryFailed,
            Entry::run(id),
            async |entry| {
                let Some(run) = self.store.task_counts(id).await? else {
                    return Err(no_such_run(id));
                };
                entry.job = Some(run.job.clone());
                // chime_retry_failed refuses a run with no tasks, unfinished, or with nothing
                // to rerun, naming the fix.
                match self.store.retry_failed_tasks(id, &caller.actor).await? {
                    Ok(rerun) => Ok(RetriedFailed {
                        run_id: id,
                        job: run.job,
                        rerun,
                    }),
                    Err(refusal) => Err(OpsError::Conflict(refusal.message)),
                }
            },
        )
        .await
    }

    /// Cancels a run: a waiting one at once, a running one through its worker. A run with
    /// tasks passes the cancel on to them (in the database); for a running one, one control
    /// message names the run and workers cancel its tasks they run.
    pub async fn cancel_run(&self, caller: &Caller, id: i64) -> OpsResult<Cancelled> {
        self.audited(caller, Action::RunsCancel, Entry::run(id), async |entry| {
            let (name, again) = match self.store.cancel_run(id, &caller.actor).await? {
                CancelOutcome::NotFound => return Err(no_such_run(id)),
                CancelOutcome::Finished { state } => {
                    return Err(OpsError::Conflict(format!(
                        "run {id} has already finished ({state}); there is nothing to cancel"
                    )));
                }
                CancelOutcome::Cancelled {
                    job: name,
                    previous,
                } => {
                    entry.job = Some(name.clone());
                    return Ok(Cancelled::Cancelled {
                        run_id: id,
                        job: name,
                        previous_state: previous,
                    });
                }
                CancelOutcome::Requested {
                    job: name, again, ..
                } => (name, again),
            };
            entry.job = Some(name.clone());
            let broker = self.broker()?;
            let delivery = broker
                .publish_control(&ControlMessage::CancelRun { run_id: id })
                .await
                .map_err(|e| {
                    OpsError::Unavailable(format!(
                        "the cancel of run {id} is recorded, but the workers could not be \
                         told: {e:#}; cancel it again when the broker is back"
                    ))
                })?;
            // A workflow run's running nodes are runs of their own: each gets its message.
            for node_run in self.store.running_nodes(id).await? {
                broker
                    .publish_control(&ControlMessage::CancelRun { run_id: node_run })
                    .await
                    .map_err(|e| {
                        OpsError::Unavailable(format!(
                            "the cancel of workflow run {id} is recorded, but the workers of \
                             its node run {node_run} could not be told: {e:#}; cancel that run \
                             when the broker is back (`chime runs cancel {node_run}`)"
                        ))
                    })?;
            }
            Ok(Cancelled::CancelRequested {
                run_id: id,
                job: name,
                requested_before: again,
                control_message: if delivery == ControlDelivery::Delivered {
                    "delivered"
                } else {
                    "no_listener"
                },
            })
        })
        .await
    }

    // ---- workers, queues, leader, audit --------------------------------------------------

    /// Workers online or stopped within the last day.
    pub async fn workers(&self, caller: &Caller) -> OpsResult<Vec<WorkerRecord>> {
        self.authorize(caller, Action::WorkersList, Entry::none())
            .await?;
        Ok(self.store.workers().await?)
    }

    /// Each group's work queue and parking lot, from the management API when configured, else
    /// from passive declares (nothing is created either way).
    pub async fn queues(&self, caller: &Caller) -> OpsResult<Queues> {
        self.authorize(caller, Action::QueuesList, Entry::none())
            .await?;
        let broker = self.broker()?;
        let groups = self.store.groups().await?;
        let names: Vec<String> = groups
            .iter()
            .flat_map(|group| {
                let topology = Topology::new(&broker.queue_prefix, group);
                [topology.work_queue(), topology.parking_queue()]
            })
            .collect();
        let mut figures = broker
            .queue_figures(&names)
            .await
            .map_err(|e| OpsError::Unavailable(format!("{e:#}")))?;
        let views = groups
            .into_iter()
            .map(|group| {
                let topology = Topology::new(&broker.queue_prefix, &group);
                let (queue, parking_queue) = (topology.work_queue(), topology.parking_queue());
                let work = figures.queues.remove(&queue);
                let parking = figures.queues.remove(&parking_queue);
                QueueView {
                    group,
                    depth: work.as_ref().map(|w| w.ready),
                    consumers: work.as_ref().map(|w| w.consumers),
                    unacked: work.as_ref().and_then(|w| w.unacked),
                    publish_rate: work.as_ref().and_then(|w| w.publish_rate),
                    deliver_rate: work.as_ref().and_then(|w| w.deliver_rate),
                    parking_depth: parking.map(|p| p.ready),
                    queue,
                    parking_queue,
                }
            })
            .collect();
        Ok(Queues {
            source: figures.source,
            management_error: figures.management_error,
            queues: views,
        })
    }

    /// Runs per state and failure rate within `window`, leader, jobs and workers.
    pub async fn overview(&self, caller: &Caller, window: Duration) -> OpsResult<Overview> {
        self.authorize(caller, Action::OverviewShow, Entry::none())
            .await?;
        let (shortest, longest) = OVERVIEW_WINDOWS;
        if window < shortest || window > longest {
            return Err(OpsError::Invalid(vec![FieldProblem::new(
                "window",
                format!("{:?}", humantime::format_duration(window).to_string()),
                "use a window from 1m to 7days, such as \"1h\"",
            )]));
        }
        let mut runs_by_state: std::collections::BTreeMap<String, i64> =
            RUN_STATES.iter().map(|s| (s.to_string(), 0)).collect();
        runs_by_state.extend(self.store.run_state_counts(window).await?);
        let failed = runs_by_state["failed"] + runs_by_state["dead"];
        let finished = failed
            + ["succeeded", "cancelled"]
                .iter()
                .map(|s| runs_by_state[*s])
                .sum::<i64>();
        let (jobs, paused_jobs) = self.store.job_counts().await?;
        Ok(Overview {
            window_seconds: window.as_secs(),
            failure_rate: (finished > 0).then(|| failed as f64 / finished as f64),
            runs_by_state,
            leader: self.store.leader().await?,
            jobs,
            paused_jobs,
            workers_online: self
                .store
                .workers_online()
                .await?
                .iter()
                .map(|(_, n)| n)
                .sum(),
        })
    }

    /// Who leads.
    pub async fn leader(&self, caller: &Caller) -> OpsResult<LeaderInfo> {
        self.authorize(caller, Action::LeaderShow, Entry::none())
            .await?;
        Ok(self.store.leader().await?)
    }

    /// A page of the audit log, newest first.
    pub async fn audit(&self, caller: &Caller, query: AuditQuery) -> OpsResult<AuditPage> {
        self.authorize(caller, Action::AuditList, Entry::none())
            .await?;
        if !(1..=MAX_PAGE).contains(&query.limit) {
            return Err(OpsError::Invalid(vec![FieldProblem::new(
                "limit",
                query.limit.to_string(),
                format!("use a page size from 1 to {MAX_PAGE}"),
            )]));
        }
        let limit = query.limit;
        let entries = self
            .store
            .audit(&AuditQuery {
                limit: limit + 1,
                ..query
            })
            .await?;
        let (entries, next_before) = keyset_page(entries, limit, |e| e.id);
        Ok(AuditPage {
            entries,
            next_before,
        })
    }

    // ---- dead letters --------------------------------------------------------------------

    /// Parking-lot operations on the broker's shared connection.
    async fn parking_lot(&self, broker: &Broker) -> OpsResult<ParkingLot> {
        broker
            .parking_lot()
            .await
            .map_err(|e| OpsError::Unavailable(format!("{e:#}")))
    }

    async fn groups_or(&self, group: Option<String>) -> OpsResult<Vec<String>> {
        Ok(match group {
            Some(group) => vec![group],
            None => self.store.groups().await?,
        })
    }

    /// A page of dead letters (of `group`, or of every group) drained after `after`, oldest
    /// first, at most `limit` (capped at [`MAX_PAGE`]). Reads the database only: the broker is
    /// not asked anything, so a read changes no queue and creates none.
    pub async fn dead_letters(
        &self,
        caller: &Caller,
        group: Option<String>,
        after: Option<i64>,
        limit: usize,
    ) -> OpsResult<DeadLetterPage> {
        self.authorize(caller, Action::DlqList, Entry::none())
            .await?;
        let limit = i64::try_from(limit).unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
        let records = self
            .store
            .dead_letters(group.as_deref(), after, limit + 1)
            .await?;
        let (records, next_after) = keyset_page(records, limit, |r| r.id);
        let ids: Vec<i64> = records.iter().filter_map(|r| r.run_id).collect();
        let runs = self.store.run_briefs(&ids).await?;
        let secrets = self.run_secret_texts(caller, &ids).await?;
        let dead_letters = records
            .into_iter()
            .map(|record| {
                let run = runs.iter().find(|r| Some(r.id) == record.run_id);
                let mut letter = dead_letter(record, run);
                if let Some(values) = letter.run_id.and_then(|id| secrets.get(&id)) {
                    scrub_letter(&mut letter, values);
                }
                letter
            })
            .collect();
        Ok(DeadLetterPage {
            dead_letters,
            next_after,
        })
    }

    /// Runs a parked run again as a new attempt and removes its dead letters.
    pub async fn replay(&self, caller: &Caller, id: i64) -> OpsResult<Replayed> {
        self.audited(caller, Action::DlqReplay, Entry::run(id), async |entry| {
            let run = self.store.run_briefs(&[id]).await?.into_iter().next();
            let Some(run) = run else {
                return Err(OpsError::NotFound(format!(
                    "no run with id {id}; list parked runs with `chime dlq list` or GET \
                     /api/dead-letters"
                )));
            };
            entry.job = Some(run.job.clone());
            replay_one(&self.store, &run.group, id, &caller.actor).await
        })
        .await
    }

    /// Replays every dead letter of `group` (or every group) that has a replayable run.
    pub async fn replay_all(
        &self,
        caller: &Caller,
        group: Option<String>,
    ) -> OpsResult<ReplayedAll> {
        let entry = Entry::none().detail(serde_json::json!({"group": group}));
        let all = self
            .audited(caller, Action::DlqReplayAll, entry, async |_| {
                let groups = self.groups_or(group).await?;
                let mut all = ReplayedAll::default();
                for group in groups {
                    replay_group(&self.store, &group, &caller.actor, &mut all).await?;
                }
                Ok(all)
            })
            .await?;
        // Each run replayed is in the audit log as if replayed alone, so a run's history shows it.
        for id in &all.replayed {
            let entry = Entry::run(*id).detail(serde_json::json!({"bulk": true}));
            self.audit_entry(caller, Action::DlqReplay, Outcome::Ok, entry)
                .await?;
        }
        Ok(all)
    }

    /// Deletes the dead letters of `group` (or of every group), and empties its parking-lot
    /// queue of messages not drained yet (a queue that does not exist is not created); the
    /// runs stay as they are.
    pub async fn purge(&self, caller: &Caller, group: Option<String>) -> OpsResult<Vec<Purged>> {
        let entry = Entry::none().detail(serde_json::json!({"group": group}));
        self.audited(caller, Action::DlqPurge, entry, async |_| {
            let broker = self.broker()?;
            let groups = self.groups_or(group).await?;
            let lot = self.parking_lot(broker).await?;
            let mut purged = Vec::new();
            let mut result = Ok(());
            for group in groups {
                // The queue first: what the leader drains meanwhile is in the table below.
                let in_queue = match lot.purge(&group).await {
                    Ok(count) => u64::from(count),
                    Err(e) => {
                        result = Err(OpsError::Unavailable(format!("{e:#}")));
                        break;
                    }
                };
                match self.store.purge_dead_letters(&group).await {
                    Ok(stored) => purged.push(Purged {
                        queue: lot.queue(&group),
                        group,
                        purged: stored + in_queue,
                    }),
                    Err(e) => {
                        result = Err(e.into());
                        break;
                    }
                }
            }
            lot.close().await;
            result.map(|()| purged)
        })
        .await
    }

    // ---- API tokens ----------------------------------------------------------------------

    /// Creates a token; its secret is in the result and nowhere else.
    pub async fn create_token(
        &self,
        caller: &Caller,
        name: &str,
        role: Role,
    ) -> OpsResult<NewToken> {
        let entry = Entry::none().detail(serde_json::json!({"name": name, "role": role}));
        self.audited(caller, Action::TokensCreate, entry, async |_| {
            if name.is_empty()
                || name.len() > 63
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-@".contains(c))
            {
                return Err(OpsError::Invalid(vec![FieldProblem::new(
                    "name",
                    format!("{name:?}"),
                    "use 1 to 63 characters from a-z, A-Z, 0-9, \"_\", \".\", \"-\" and \"@\", \
                     such as \"grafana\" or \"alice@ops\"",
                )]));
            }
            let secret = auth::new_secret()?;
            let token = self
                .store
                .create_token(
                    name,
                    role.as_str(),
                    &auth::secret_hash(&secret),
                    &caller.actor,
                )
                .await?
                .ok_or_else(|| {
                    OpsError::Conflict(format!(
                        "a token named {name:?} exists (names are never reused, revoked or not, \
                         so the audit log stays unambiguous); choose another name, such as \
                         \"{name}-2\""
                    ))
                })?;
            Ok(NewToken { token, secret })
        })
        .await
    }

    /// Every token (never their secrets).
    pub async fn tokens(&self, caller: &Caller) -> OpsResult<Vec<TokenRecord>> {
        self.authorize(caller, Action::TokensList, Entry::none())
            .await?;
        Ok(self.store.tokens().await?)
    }

    /// Revokes a token: it is refused from now on.
    pub async fn revoke_token(&self, caller: &Caller, name: &str) -> OpsResult<()> {
        let entry = Entry::none().detail(serde_json::json!({"name": name}));
        self.audited(caller, Action::TokensRevoke, entry, async |_| {
            if !self.store.revoke_token(name).await? {
                return Err(OpsError::NotFound(format!(
                    "no active token named {name:?}; list tokens with `chime tokens list`"
                )));
            }
            Ok(())
        })
        .await
    }
}

/// How many fire times a job view lists.
pub const UPCOMING: usize = 5;

/// A keyset page from `rows` fetched with `limit + 1`: the first `limit` rows, and the id to
/// pass as `before` for the next page when there was one more row.
fn keyset_page<T>(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> i64) -> (Vec<T>, Option<i64>) {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_before = if more { rows.last().map(id) } else { None };
    (rows, next_before)
}

/// `letter`'s texts without `values`.
pub(crate) fn scrub_letter(letter: &mut DeadLetter, values: &[String]) {
    for text in [&mut letter.error, &mut letter.reason]
        .into_iter()
        .flatten()
    {
        *text = secrets::scrub(text, values);
    }
}

/// `value` with every NUL character in its strings and keys replaced by U+FFFD.
fn without_nul(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let clean = |text: String| {
        if text.contains('\0') {
            text.replace('\0', "\u{FFFD}")
        } else {
            text
        }
    };
    match value {
        Value::String(text) => Value::String(clean(text)),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nul).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, value)| (clean(key), without_nul(value)))
                .collect(),
        ),
        other => other,
    }
}

/// Whether `caller` reads secrets (sensitive params, webhook URLs) in full: operators and admins,
/// who trigger and edit jobs with them; viewers never do.
pub(crate) fn sees_secrets(caller: &Caller) -> bool {
    caller.role >= Role::Operator
}

/// What `caller` may see of a job: its secrets hidden from those who may not see them.
fn shown_to(caller: &Caller, mut view: JobView) -> JobView {
    if !sees_secrets(caller) {
        view.spec = secrets::redact_spec(&view.spec);
    }
    view
}

fn job_view(j: crate::store::JobRecord, now: DateTime<Utc>) -> JobView {
    let timing = j.spec.timing().ok();
    let upcoming = timing.as_ref().map_or_else(Vec::new, |timing| {
        j.spec.upcoming(timing, now, UPCOMING, j.scheduled_runs)
    });
    let next_fire = if j.paused {
        None
    } else {
        upcoming.first().copied()
    };
    let zone = j.spec.timezone;
    let local = |t: &DateTime<Utc>| {
        t.with_timezone(&zone)
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false)
    };
    JobView {
        timezone: zone.name().to_owned(),
        next_fire_local: next_fire.as_ref().map(local),
        upcoming_local: upcoming.iter().map(local).collect(),
        upcoming,
        next_fire,
        schedule: timing.map_or_else(|| "invalid".into(), |t| t.describe()),
        name: j.spec.name.clone(),
        group: j.spec.group.clone(),
        paused: j.paused,
        paused_by: j.paused_by,
        source: j.source,
        version: j.version,
        spec: j.spec,
    }
}

fn validated(definition: &serde_json::Value) -> OpsResult<JobSpec> {
    let serde_json::Value::Object(table) = definition else {
        return Err(OpsError::Invalid(vec![FieldProblem {
            field: None,
            value: Some(definition.to_string()),
            message: "a job definition is a JSON object, such as {\"name\": \"report\", \
                      \"group\": \"orders\", \"schedule\": \"0 9 * * *\"}"
                .into(),
        }]));
    };
    validate_job(table).map_err(invalid)
}

/// A definition's mistakes as the API says them.
fn invalid(errors: Vec<FieldError>) -> OpsError {
    OpsError::Invalid(
        errors
            .into_iter()
            .map(|e| FieldProblem {
                field: e.field,
                value: e.value,
                message: e.message,
            })
            .collect(),
    )
}

fn no_such_job(name: &str) -> OpsError {
    OpsError::NotFound(format!(
        "no job named {name:?}; list jobs with `chime jobs list` or GET /api/jobs"
    ))
}

fn no_such_run(id: i64) -> OpsError {
    OpsError::NotFound(format!(
        "no run with id {id}; list runs with `chime runs list` or GET /api/runs"
    ))
}

fn dead_letter(record: DeadLetterRecord, run: Option<&RunBrief>) -> DeadLetter {
    DeadLetter {
        id: record.id,
        job: record.job.or_else(|| run.map(|r| r.job.clone())),
        error: record
            .error
            .or_else(|| run.and_then(|r| r.error.clone().or_else(|| r.reason.clone()))),
        parked_at: record.parked_at.or_else(|| {
            run.filter(|r| r.state == "dead")
                .and_then(|r| r.finished_at)
        }),
        run_state: run.map(|r| r.state.clone()),
        group: record.group,
        run_id: record.run_id,
        attempt: record.attempt.and_then(|a| u32::try_from(a).ok()),
        reason: record.reason,
        parked_by: record.parked_by,
    }
}

/// Replays run `id` (of `group`): the run goes back to the outbox (the leader publishes it as
/// the next attempt, with confirms), its dead letters are deleted.
async fn replay_one(store: &Store, group: &str, id: i64, by: &str) -> OpsResult<Replayed> {
    match store.replay_run(id, by).await? {
        ReplayOutcome::NotFound => Err(no_such_run(id)),
        ReplayOutcome::NotReplayable { state } => Err(OpsError::Conflict(format!(
            "run {id} is {state}; only runs that are {} can be replayed",
            REPLAYABLE_STATES.join(", ")
        ))),
        ReplayOutcome::Replayed {
            job, next_attempt, ..
        } => Ok(Replayed {
            run_id: id,
            job,
            attempt: next_attempt,
            removed_messages: store.delete_dead_letters_of_run(group, id).await?,
        }),
    }
}

/// Replays every dead letter of `group` that has a replayable run (at most [`REPLAY_SCAN`] of
/// them per call, read in pages); keeps the others.
async fn replay_group(
    store: &Store,
    group: &str,
    by: &str,
    all: &mut ReplayedAll,
) -> OpsResult<()> {
    let mut done = HashSet::new();
    let (mut after, mut read) = (None, 0);
    while read < REPLAY_SCAN {
        let page = store.dead_letters(Some(group), after, MAX_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.id);
        read += page.len() as i64;
        for letter in page {
            let keep = |run_id, note| Kept {
                group: group.to_owned(),
                run_id,
                note,
            };
            let Some(id) = letter.run_id else {
                all.kept.push(keep(
                    None,
                    format!("a message of group {group} without a run id"),
                ));
                continue;
            };
            if !done.insert(id) {
                // Another copy of a run replayed (or kept) just now.
                continue;
            }
            match store.replay_run(id, by).await? {
                ReplayOutcome::Replayed { .. } => {
                    store.delete_dead_letters_of_run(group, id).await?;
                    all.replayed.push(id);
                }
                ReplayOutcome::NotFound => {
                    all.kept
                        .push(keep(Some(id), format!("run {id}: no such run")));
                }
                ReplayOutcome::NotReplayable { state } => {
                    all.kept
                        .push(keep(Some(id), format!("run {id}: it is {state}")));
                }
            }
        }
    }
    Ok(())
}
