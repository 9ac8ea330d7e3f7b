//! The states of a run (`chime_runs.state`) and of an attempt (`chime_attempts.state`), as the
//! migrations' `CHECK` constraints name them (docs/runs.md has the state machine).
//!
//! Each state's text is written once, in [`RunState::as_str`] and [`AttemptState::as_str`];
//! serde, [`FromStr`] and [`Display`](fmt::Display) all use it, so a state read from the
//! database, a JSON body or a filter is the same lowercase word everywhere. A test checks the
//! words against `migrations/*.sql`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// State of a run (`chime_runs.state`):
/// `pending → queued → running [→ retrying → running …] → succeeded | failed | dead | cancelled`,
/// or `skipped` (never published; its `reason` says why), or for a broadcast task `lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Persisted, its trigger not yet confirmed by the broker: the outbox.
    Pending,
    /// Its trigger is in the work queue.
    Queued,
    /// A worker claimed an attempt and runs it.
    Running,
    /// An attempt failed and the next one waits in a delay tier until `next_attempt_at`.
    Retrying,
    /// An attempt succeeded.
    Succeeded,
    /// An attempt failed for good (the handler said not to retry).
    Failed,
    /// Attempts exhausted, or the run cannot go on; its message is in the parking lot.
    Dead,
    /// An operator cancelled it.
    Cancelled,
    /// Never published (a misfire policy or a concurrency policy skipped it).
    Skipped,
    /// A broadcast task whose worker was lost (or has no queue): broadcast means "on each
    /// worker", so it is not moved to another one.
    Lost,
}

/// State of an attempt (`chime_attempts.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Claimed; its handler runs (or is about to).
    Running,
    /// The handler succeeded.
    Succeeded,
    /// The handler failed (returned an error, or panicked).
    Failed,
    /// The job's timeout elapsed.
    TimedOut,
    /// Cancelled by an operator, or interrupted by the worker's shutdown.
    Cancelled,
    /// Its worker was lost (no heartbeat) while it ran.
    Lost,
}

/// A state word that is not one of [`RunState`] or [`AttemptState`], naming the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} state `{value}`; expected one of {expected}")]
pub struct UnknownState {
    /// `run` or `attempt`.
    pub kind: &'static str,
    /// The value, cut to 64 bytes.
    pub value: String,
    /// The states there are, comma-separated.
    pub expected: String,
}

impl UnknownState {
    fn new(kind: &'static str, value: &str, names: &[&str]) -> UnknownState {
        UnknownState {
            kind,
            value: crate::limits::cap_bytes(value, 64).into_owned(),
            expected: names.join(", "),
        }
    }
}

impl RunState {
    /// Every run state, in the state machine's order.
    pub const ALL: [RunState; 10] = [
        RunState::Pending,
        RunState::Queued,
        RunState::Running,
        RunState::Retrying,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Dead,
        RunState::Cancelled,
        RunState::Skipped,
        RunState::Lost,
    ];

    /// [`RunState::ALL`] as text (what filters and the dashboard offer).
    pub const NAMES: [&'static str; 10] = {
        let mut names = [""; 10];
        let mut i = 0;
        while i < names.len() {
            names[i] = RunState::ALL[i].as_str();
            i += 1;
        }
        names
    };

    /// The state as the database, the API and the wire write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            RunState::Pending => "pending",
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Retrying => "retrying",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Dead => "dead",
            RunState::Cancelled => "cancelled",
            RunState::Skipped => "skipped",
            RunState::Lost => "lost",
        }
    }

    /// Waiting for its next attempt (`pending`, `queued`, `retrying`): the states a claim takes
    /// a run from.
    pub const fn is_waiting(self) -> bool {
        matches!(
            self,
            RunState::Pending | RunState::Queued | RunState::Retrying
        )
    }

    /// Ended: no attempt will start or run any more (`succeeded`, `failed`, `dead`,
    /// `cancelled`, `skipped`, `lost`): `chime_run_ended` in SQL.
    pub const fn is_finished(self) -> bool {
        !self.is_waiting() && !matches!(self, RunState::Running)
    }
}

impl AttemptState {
    /// Every attempt state.
    pub const ALL: [AttemptState; 6] = [
        AttemptState::Running,
        AttemptState::Succeeded,
        AttemptState::Failed,
        AttemptState::TimedOut,
        AttemptState::Cancelled,
        AttemptState::Lost,
    ];

    /// [`AttemptState::ALL`] as text.
    pub const NAMES: [&'static str; 6] = {
        let mut names = [""; 6];
        let mut i = 0;
        while i < names.len() {
            names[i] = AttemptState::ALL[i].as_str();
            i += 1;
        }
        names
    };

    /// The state as the database and the API write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptState::Running => "running",
            AttemptState::Succeeded => "succeeded",
            AttemptState::Failed => "failed",
            AttemptState::TimedOut => "timed_out",
            AttemptState::Cancelled => "cancelled",
            AttemptState::Lost => "lost",
        }
    }
}

impl FromStr for RunState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState::new("run", s, &RunState::NAMES))
    }
}

impl FromStr for AttemptState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AttemptState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState::new("attempt", s, &AttemptState::NAMES))
    }
}

impl TryFrom<&str> for RunState {
    type Error = UnknownState;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl TryFrom<&str> for AttemptState {
    type Error = UnknownState;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for AttemptState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_state_round_trips_through_its_text_and_serde() {
        for state in RunState::ALL {
            let text = state.as_str();
            assert_eq!(text.parse::<RunState>(), Ok(state));
            assert_eq!(RunState::try_from(text), Ok(state));
            assert_eq!(state.to_string(), text);
            assert_eq!(serde_json::to_value(state).unwrap(), text);
            assert_eq!(
                serde_json::from_value::<RunState>(text.into()).unwrap(),
                state
            );
        }
        for state in AttemptState::ALL {
            let text = state.as_str();
            assert_eq!(text.parse::<AttemptState>(), Ok(state));
            assert_eq!(AttemptState::try_from(text), Ok(state));
            assert_eq!(state.to_string(), text);
            assert_eq!(serde_json::to_value(state).unwrap(), text);
            assert_eq!(
                serde_json::from_value::<AttemptState>(text.into()).unwrap(),
                state
            );
        }
        assert_eq!(RunState::NAMES.len(), RunState::ALL.len());
        assert_eq!(
            BTreeSet::from(RunState::NAMES).len(),
            RunState::NAMES.len(),
            "two run states share a word"
        );
        assert_eq!(
            BTreeSet::from(AttemptState::NAMES).len(),
            AttemptState::NAMES.len(),
            "two attempt states share a word"
        );
    }

    #[test]
    fn an_unknown_state_is_refused_naming_the_value_and_the_states() {
        let error = "Running".parse::<RunState>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown run state `Running`; expected one of pending, queued, running, retrying, \
             succeeded, failed, dead, cancelled, skipped, lost"
        );
        let error = "skipped".parse::<AttemptState>().unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("unknown attempt state `skipped`"),
            "{error}"
        );
        // A long value is cut, so the message stays bounded.
        let error = "x".repeat(10_000).parse::<RunState>().unwrap_err();
        assert!(error.value.len() <= 64, "{}", error.value.len());
        assert!(serde_json::from_str::<RunState>("\"timed_out\"").is_err());
    }

    #[test]
    fn waiting_running_and_finished_split_the_run_states() {
        let waiting: Vec<_> = RunState::ALL
            .into_iter()
            .filter(|s| s.is_waiting())
            .collect();
        assert_eq!(
            waiting,
            [RunState::Pending, RunState::Queued, RunState::Retrying]
        );
        for state in RunState::ALL {
            let kinds = [
                state.is_waiting(),
                state == RunState::Running,
                state.is_finished(),
            ];
            assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{state}");
        }
    }

    /// The migrations' text, in the order they apply.
    fn migrations() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "sql"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no migrations in {}", dir.display());
        files
            .into_iter()
            .map(|path| {
                let sql = std::fs::read_to_string(&path).unwrap();
                (path.display().to_string(), sql)
            })
            .collect()
    }

    /// The quoted words of `list` (`'a', 'b'`).
    fn quoted(list: &str) -> Vec<String> {
        list.split('\'')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// The words of the last `CHECK (state IN (…))` of a statement creating or altering `table`.
    fn checked_states(migrations: &[(String, String)], table: &str) -> Vec<String> {
        let mut found = None;
        for (_, sql) in migrations {
            for statement in sql.split(';') {
                // The table's own definition or alteration (another table's may reference it).
                let about_table = [
                    format!("CREATE TABLE {table} "),
                    format!("ALTER TABLE {table} "),
                ]
                .iter()
                .any(|head| statement.contains(head.as_str()));
                let Some(at) = statement.find("CHECK (state IN (") else {
                    continue;
                };
                if about_table {
                    let list = &statement[at + "CHECK (state IN (".len()..];
                    let end = list.find(')').expect("the CHECK list ends");
                    found = Some(quoted(&list[..end]));
                }
            }
        }
        found.unwrap_or_else(|| panic!("no CHECK (state IN (…)) on {table} in the migrations"))
    }

    #[test]
    fn the_states_are_those_the_migrations_check() {
        let migrations = migrations();
        let runs: BTreeSet<String> = checked_states(&migrations, "chime_runs")
            .into_iter()
            .collect();
        let ours: BTreeSet<String> = RunState::NAMES.iter().map(|s| s.to_string()).collect();
        assert_eq!(runs, ours, "chime_runs.state");
        let attempts: BTreeSet<String> = checked_states(&migrations, "chime_attempts")
            .into_iter()
            .collect();
        let ours: BTreeSet<String> = AttemptState::NAMES.iter().map(|s| s.to_string()).collect();
        assert_eq!(attempts, ours, "chime_attempts.state");
    }

    #[test]
    fn every_state_the_migrations_name_is_a_state() {
        let known: BTreeSet<&str> = RunState::NAMES
            .into_iter()
            .chain(AttemptState::NAMES)
            .collect();
        let mut seen = 0;
        for (file, sql) in migrations() {
            // `state = 'x'`, `state <> 'x'`, `state IN ('x', …)`, `state NOT IN (…)`.
            for (at, _) in sql.match_indices("state") {
                let before = sql[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = sql[at + "state".len()..].trim_start();
                let list = if let Some(rest) = rest
                    .strip_prefix("IN (")
                    .or_else(|| rest.strip_prefix("NOT IN ("))
                {
                    &rest[..rest.find(')').unwrap_or(rest.len())]
                } else if let Some(rest) =
                    rest.strip_prefix('=').or_else(|| rest.strip_prefix("<>"))
                {
                    let rest = rest.trim_start();
                    if !rest.starts_with('\'') {
                        continue;
                    }
                    &rest[..rest[1..].find('\'').map_or(rest.len(), |end| end + 2)]
                } else {
                    continue;
                };
                for word in quoted(list) {
                    assert!(
                        known.contains(word.as_str()),
                        "{file} names state `{word}`, which is neither a RunState nor an \
                         AttemptState"
                    );
                    seen += 1;
                }
            }
        }
        assert!(
            seen > 20,
            "found only {seen} state words: is the scan broken?"
        );
    }
}
