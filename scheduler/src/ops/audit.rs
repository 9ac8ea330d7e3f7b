//! Authorization and the audit log: the one path every operation takes before it acts.
//!
//! A read-only action goes through [`Operations::authorize`]; a changing one through
//! [`Operations::audited`], which authorizes it, runs its body and records the outcome, once:
//! `denied` (the caller's role is too low; the body does not run), `ok`, or `failed` (refused
//! for its input or state). An internal error is logged by the caller and not audited. A
//! refusal of a read-only action is audited too; its success is not.

use serde_json::Value;

use super::limits;
use super::{Action, Operations, OpsError, OpsResult, without_nul};
use crate::auth::Caller;
use crate::secrets;
use crate::store::NewAuditEntry;

/// Longest job name an audit entry keeps: a refused request may name anything, and the audit
/// log's index on job names cannot hold a name of kilobytes.
const MAX_AUDITED_NAME_BYTES: usize = 256;

/// What an audit entry says about a request besides who, what and how it ended: the job and
/// the run concerned, if any, and the details worth keeping (the params given, a definition).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    /// The job concerned.
    pub(super) job: Option<String>,
    /// The run concerned.
    pub(super) run_id: Option<i64>,
    /// Details, a JSON object; a failure adds its `error`.
    pub(super) detail: Value,
}

impl Entry {
    /// About neither a job nor a run.
    pub(super) fn none() -> Entry {
        Entry {
            job: None,
            run_id: None,
            detail: Value::Object(serde_json::Map::new()),
        }
    }

    /// About job `name`.
    pub(super) fn job(name: &str) -> Entry {
        Entry::job_named(Some(name))
    }

    /// About job `name`, if the request names one.
    pub(super) fn job_named(name: Option<&str>) -> Entry {
        Entry {
            job: name.map(str::to_owned),
            ..Entry::none()
        }
    }

    /// About run `id`.
    pub(super) fn run(id: i64) -> Entry {
        Entry {
            run_id: Some(id),
            ..Entry::none()
        }
    }

    /// With `detail` (a JSON object).
    pub(super) fn detail(self, detail: Value) -> Entry {
        Entry { detail, ..self }
    }
}

/// An audit entry's `outcome` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Done.
    Ok,
    /// Refused for the caller's role.
    Denied,
    /// Refused for its input or state.
    Failed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Denied => "denied",
            Outcome::Failed => "failed",
        }
    }
}

impl Operations {
    /// Allows `caller` to do the read-only `action` if its role is at least the action's; a
    /// refusal is audited, as `entry`.
    pub(super) async fn authorize(
        &self,
        caller: &Caller,
        action: Action,
        entry: Entry,
    ) -> OpsResult<()> {
        debug_assert!(
            !action.changes_state(),
            "{action} changes state: run it through `audited`"
        );
        self.allow(caller, action, &entry).await
    }

    /// Runs the changing `action` for `caller`: authorizes it (a refusal is audited `denied`
    /// and `body` does not run), runs `body`, and audits its result once as `entry`, which
    /// `body` may complete (with the job or run it finds): `ok`, or `failed` with the error
    /// added to the details. An internal error is returned without an entry (the caller logs
    /// it).
    pub(super) async fn audited<T>(
        &self,
        caller: &Caller,
        action: Action,
        mut entry: Entry,
        body: impl AsyncFnOnce(&mut Entry) -> OpsResult<T>,
    ) -> OpsResult<T> {
        debug_assert!(
            action.changes_state(),
            "{action} only reads: authorize it with `authorize`"
        );
        self.allow(caller, action, &entry).await?;
        let result = body(&mut entry).await;
        let outcome = match &result {
            Ok(_) => Outcome::Ok,
            Err(OpsError::Internal(_)) | Err(OpsError::Forbidden { .. }) => return result,
            Err(e) => {
                if let Some(map) = entry.detail.as_object_mut() {
                    map.insert("error".into(), e.to_string().into());
                }
                Outcome::Failed
            }
        };
        self.audit_entry(caller, action, outcome, entry).await?;
        result
    }

    /// As [`Operations::audited`], for an action whose success the database records itself,
    /// in the transaction that does it (`chime_trigger`): `body` gets the entry's details with
    /// the secrets hidden, to pass on; only a refusal for the caller's role (`denied`) or for
    /// its input or state (`failed`) is recorded here. So each call leaves exactly one entry.
    pub(super) async fn audited_in_store<T>(
        &self,
        caller: &Caller,
        action: Action,
        mut entry: Entry,
        body: impl AsyncFnOnce(&mut Entry, &Value) -> OpsResult<T>,
    ) -> OpsResult<T> {
        debug_assert!(action.changes_state());
        self.allow(caller, action, &entry).await?;
        let detail = self.redacted_detail(&entry).await;
        let result = body(&mut entry, &detail).await;
        match &result {
            Ok(_) => {
                tracing::info!(actor = %caller.actor, role = %caller.role,
                               action = action.as_str(), outcome = "ok",
                               job = entry.job.as_deref().unwrap_or_default(),
                               run_id = entry.run_id, "operator action");
            }
            Err(OpsError::Internal(_)) | Err(OpsError::Forbidden { .. }) => {}
            Err(e) => {
                if let Some(map) = entry.detail.as_object_mut() {
                    map.insert("error".into(), e.to_string().into());
                }
                self.audit_entry(caller, action, Outcome::Failed, entry)
                    .await?;
            }
        }
        result
    }

    /// `entry`'s details with the secrets of its job hidden, as the audit log keeps them.
    async fn redacted_detail(&self, entry: &Entry) -> Value {
        let declared = match entry.job.as_deref() {
            Some(name) => self.declared_secrets(name).await,
            None => Vec::new(),
        };
        without_nul(secrets::redact_audit_detail(&entry.detail, &declared))
    }

    /// Allows `caller` to do `action` if its role is at least the action's; records a refusal
    /// about `entry`'s job and run.
    async fn allow(&self, caller: &Caller, action: Action, entry: &Entry) -> OpsResult<()> {
        let needed = action.role();
        if caller.role >= needed {
            return Ok(());
        }
        let refusal = Entry {
            job: entry.job.clone(),
            run_id: entry.run_id,
            detail: serde_json::json!({"needed": needed}),
        };
        self.audit_entry(caller, action, Outcome::Denied, refusal)
            .await?;
        Err(OpsError::Forbidden {
            action,
            needed,
            has: caller.role,
            actor: caller.actor.clone(),
        })
    }

    /// Writes one audit entry, with the secrets of its details hidden.
    pub(super) async fn audit_entry(
        &self,
        caller: &Caller,
        action: Action,
        outcome: Outcome,
        entry: Entry,
    ) -> OpsResult<()> {
        // A refused request may name anything; the audit log keeps a bounded prefix of it.
        // PostgreSQL's text and jsonb cannot hold NUL, which a hostile request may carry.
        let job = entry
            .job
            .as_deref()
            .map(|name| limits::cap_bytes(name, MAX_AUDITED_NAME_BYTES).replace('\0', "\u{FFFD}"));
        let job = job.as_deref();
        let declared = match job {
            Some(name) => self.declared_secrets(name).await,
            None => Vec::new(),
        };
        let detail = without_nul(secrets::redact_audit_detail(&entry.detail, &declared));
        let (action, outcome, run_id) = (action.as_str(), outcome.as_str(), entry.run_id);
        tracing::info!(actor = %caller.actor, role = %caller.role, action, outcome,
                       job = job.unwrap_or_default(), run_id, "operator action");
        self.store
            .record_audit(&NewAuditEntry {
                actor: &caller.actor,
                role: caller.role.as_str(),
                action,
                outcome,
                job,
                run_id,
                detail,
            })
            .await?;
        Ok(())
    }
}
