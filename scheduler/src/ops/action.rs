//! Every operation of the operations surface as data: its name in the audit log, the lowest role
//! that may do it, and whether it changes something (and so is audited).
//!
//! **Invariant:** this table is the one place an operation's name and role are written. The
//! names are the `action` column of `chime_audit` and appear in `403` messages, so they never
//! change; docs/api.md lists the roles.

use std::fmt;

use crate::auth::Role;

/// One operation, as authorized and audited by [`crate::ops::Operations`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// List jobs.
    JobsList,
    /// Show one job.
    JobsShow,
    /// A job's daily report.
    JobsReport,
    /// Create a job at runtime.
    JobsCreate,
    /// Change a job created at runtime.
    JobsUpdate,
    /// Delete a job created at runtime.
    JobsDelete,
    /// Pause planning a job's fires.
    JobsPause,
    /// Resume planning a job's fires.
    JobsResume,
    /// Run a job now.
    JobsTrigger,
    /// A job's definition versions.
    JobsHistory,
    /// Put back an earlier definition of a job created at runtime.
    JobsRollback,
    /// Start a backfill of a job's past range.
    JobsBackfill,
    /// What a backfill would do (nothing is saved).
    BackfillsPreview,
    /// List backfills.
    BackfillsList,
    /// Show one backfill with its progress.
    BackfillsShow,
    /// Cancel a backfill.
    BackfillsCancel,
    /// Preview a schedule's fire times (nothing is saved).
    SchedulesPreview,
    /// List runs.
    RunsList,
    /// Show one run with its attempts and log lines.
    RunsShow,
    /// Cancel a run.
    RunsCancel,
    /// Rerun the failed tasks of a finished run with tasks.
    RunsRetryFailed,
    /// List workers.
    WorkersList,
    /// Each group's queues.
    QueuesList,
    /// The cluster at a glance.
    OverviewShow,
    /// Runs per time bucket.
    OverviewTimeline,
    /// Who leads.
    LeaderShow,
    /// Read the audit log.
    AuditList,
    /// List dead letters.
    DlqList,
    /// Show one parked message in full.
    DlqShow,
    /// Replay one parked run.
    DlqReplay,
    /// Replay every parked run of a group (or of every group).
    DlqReplayAll,
    /// Delete the dead letters of a group (or of every group).
    DlqPurge,
    /// List workflows.
    WorkflowsList,
    /// Show one workflow's definition.
    WorkflowsShow,
    /// Show one workflow run with its nodes.
    WorkflowsRun,
    /// Rerun a workflow run from a node.
    WorkflowsRerun,
    /// Create an API token.
    TokensCreate,
    /// List API tokens.
    TokensList,
    /// Revoke an API token.
    TokensRevoke,
}

/// Whether an action changes something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Only reads; a refusal is audited, a success is not.
    Reads,
    /// Changes state; audited whatever the outcome (`ok`, `denied` or `failed`).
    Changes,
}

impl Action {
    /// Every action, in the order they are declared.
    pub const ALL: [Action; 39] = [
        Action::JobsList,
        Action::JobsShow,
        Action::JobsReport,
        Action::JobsCreate,
        Action::JobsUpdate,
        Action::JobsDelete,
        Action::JobsPause,
        Action::JobsResume,
        Action::JobsTrigger,
        Action::JobsHistory,
        Action::JobsRollback,
        Action::JobsBackfill,
        Action::BackfillsPreview,
        Action::BackfillsList,
        Action::BackfillsShow,
        Action::BackfillsCancel,
        Action::SchedulesPreview,
        Action::RunsList,
        Action::RunsShow,
        Action::RunsCancel,
        Action::RunsRetryFailed,
        Action::WorkersList,
        Action::QueuesList,
        Action::OverviewShow,
        Action::OverviewTimeline,
        Action::LeaderShow,
        Action::AuditList,
        Action::DlqList,
        Action::DlqShow,
        Action::DlqReplay,
        Action::DlqReplayAll,
        Action::DlqPurge,
        Action::WorkflowsList,
        Action::WorkflowsShow,
        Action::WorkflowsRun,
        Action::WorkflowsRerun,
        Action::TokensCreate,
        Action::TokensList,
        Action::TokensRevoke,
    ];

    /// The action's name, the lowest role allowed to do it, and its effect: one row per action.
    const fn rule(self) -> (&'static str, Role, Effect) {
        use Effect::{Changes, Reads};
        use Role::{Admin, Operator, Viewer};
        match self {
            Action::JobsList => ("jobs.list", Viewer, Reads),
            Action::JobsShow => ("jobs.show", Viewer, Reads),
            Action::JobsReport => ("jobs.report", Viewer, Reads),
            Action::JobsCreate => ("jobs.create", Admin, Changes),
            Action::JobsUpdate => ("jobs.update", Admin, Changes),
            Action::JobsDelete => ("jobs.delete", Admin, Changes),
            Action::JobsPause => ("jobs.pause", Operator, Changes),
            Action::JobsResume => ("jobs.resume", Operator, Changes),
            Action::JobsTrigger => ("jobs.trigger", Operator, Changes),
            Action::JobsHistory => ("jobs.history", Viewer, Reads),
            Action::JobsRollback => ("jobs.rollback", Admin, Changes),
            Action::JobsBackfill => ("jobs.backfill", Operator, Changes),
            Action::BackfillsPreview => ("backfills.preview", Viewer, Reads),
            Action::BackfillsList => ("backfills.list", Viewer, Reads),
            Action::BackfillsShow => ("backfills.show", Viewer, Reads),
            Action::BackfillsCancel => ("backfills.cancel", Operator, Changes),
            Action::SchedulesPreview => ("schedules.preview", Viewer, Reads),
            Action::RunsList => ("runs.list", Viewer, Reads),
            Action::RunsShow => ("runs.show", Viewer, Reads),
            Action::RunsCancel => ("runs.cancel", Operator, Changes),
            Action::RunsRetryFailed => ("runs.retry_failed", Operator, Changes),
            Action::WorkersList => ("workers.list", Viewer, Reads),
            Action::QueuesList => ("queues.list", Viewer, Reads),
            Action::OverviewShow => ("overview.show", Viewer, Reads),
            Action::OverviewTimeline => ("overview.timeline", Viewer, Reads),
            Action::LeaderShow => ("leader.show", Viewer, Reads),
            Action::AuditList => ("audit.list", Viewer, Reads),
            Action::DlqList => ("dlq.list", Viewer, Reads),
            Action::DlqShow => ("dlq.show", Viewer, Reads),
            Action::DlqReplay => ("dlq.replay", Operator, Changes),
            Action::DlqReplayAll => ("dlq.replay_all", Operator, Changes),
            Action::DlqPurge => ("dlq.purge", Admin, Changes),
            Action::WorkflowsList => ("workflows.list", Viewer, Reads),
            Action::WorkflowsShow => ("workflows.show", Viewer, Reads),
            Action::WorkflowsRun => ("workflows.run", Viewer, Reads),
            Action::WorkflowsRerun => ("workflows.rerun", Operator, Changes),
            Action::TokensCreate => ("tokens.create", Admin, Changes),
            Action::TokensList => ("tokens.list", Admin, Reads),
            Action::TokensRevoke => ("tokens.revoke", Admin, Changes),
        }
    }

    /// As written in the audit log and in refusals, such as `jobs.trigger`.
    pub const fn as_str(self) -> &'static str {
        self.rule().0
    }

    /// The lowest role allowed to do it.
    pub const fn role(self) -> Role {
        self.rule().1
    }

    /// Whether it only reads or changes something.
    pub const fn effect(self) -> Effect {
        self.rule().2
    }

    /// Whether it changes something, so that every outcome of it is audited.
    pub const fn changes_state(self) -> bool {
        matches!(self.effect(), Effect::Changes)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The audit log's names, the roles and the effects as they were before actions became a
    /// table: a changed name would split the audit log's history, a changed role would change
    /// who may do what.
    #[test]
    fn every_action_keeps_its_name_role_and_effect() {
        use Effect::{Changes, Reads};
        use Role::{Admin, Operator, Viewer};
        let expected: [(Action, &str, Role, Effect); 39] = [
            (Action::JobsList, "jobs.list", Viewer, Reads),
            (Action::JobsShow, "jobs.show", Viewer, Reads),
            (Action::JobsReport, "jobs.report", Viewer, Reads),
            (Action::JobsCreate, "jobs.create", Admin, Changes),
            (Action::JobsUpdate, "jobs.update", Admin, Changes),
            (Action::JobsDelete, "jobs.delete", Admin, Changes),
            (Action::JobsPause, "jobs.pause", Operator, Changes),
            (Action::JobsResume, "jobs.resume", Operator, Changes),
            (Action::JobsTrigger, "jobs.trigger", Operator, Changes),
            (Action::JobsHistory, "jobs.history", Viewer, Reads),
            (Action::JobsRollback, "jobs.rollback", Admin, Changes),
            (Action::JobsBackfill, "jobs.backfill", Operator, Changes),
            (Action::BackfillsPreview, "backfills.preview", Viewer, Reads),
            (Action::BackfillsList, "backfills.list", Viewer, Reads),
            (Action::BackfillsShow, "backfills.show", Viewer, Reads),
            (
                Action::BackfillsCancel,
                "backfills.cancel",
                Operator,
                Changes,
            ),
            (Action::SchedulesPreview, "schedules.preview", Viewer, Reads),
            (Action::RunsList, "runs.list", Viewer, Reads),
            (Action::RunsShow, "runs.show", Viewer, Reads),
            (Action::RunsCancel, "runs.cancel", Operator, Changes),
            (
                Action::RunsRetryFailed,
                "runs.retry_failed",
                Operator,
                Changes,
            ),
            (Action::WorkersList, "workers.list", Viewer, Reads),
            (Action::QueuesList, "queues.list", Viewer, Reads),
            (Action::OverviewShow, "overview.show", Viewer, Reads),
            (Action::OverviewTimeline, "overview.timeline", Viewer, Reads),
            (Action::LeaderShow, "leader.show", Viewer, Reads),
            (Action::AuditList, "audit.list", Viewer, Reads),
            (Action::DlqList, "dlq.list", Viewer, Reads),
            (Action::DlqShow, "dlq.show", Viewer, Reads),
            (Action::DlqReplay, "dlq.replay", Operator, Changes),
            (Action::DlqReplayAll, "dlq.replay_all", Operator, Changes),
            (Action::DlqPurge, "dlq.purge", Admin, Changes),
            (Action::WorkflowsList, "workflows.list", Viewer, Reads),
            (Action::WorkflowsShow, "workflows.show", Viewer, Reads),
            (Action::WorkflowsRun, "workflows.run", Viewer, Reads),
            (Action::WorkflowsRerun, "workflows.rerun", Operator, Changes),
            (Action::TokensCreate, "tokens.create", Admin, Changes),
            (Action::TokensList, "tokens.list", Admin, Reads),
            (Action::TokensRevoke, "tokens.revoke", Admin, Changes),
        ];
        for (action, name, role, effect) in expected {
            assert_eq!(
                (action.as_str(), action.role(), action.effect()),
                (name, role, effect),
                "{action:?}"
            );
            assert_eq!(action.to_string(), name);
        }
        assert_eq!(
            Action::ALL.to_vec(),
            expected.map(|(action, ..)| action).to_vec(),
            "ALL lists every action once"
        );
    }

    #[test]
    fn names_are_unique() {
        let names: HashSet<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(names.len(), Action::ALL.len());
    }
}
