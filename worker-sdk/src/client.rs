//! Triggering runs from code: a [`Client`] over a PostgreSQL pool asks the database's
//! `chime_trigger` for a run of a job (docs/protocol.md section 11), as `chime jobs trigger`
//! and the API do: the same validation, the same audit entry, and the scheduler publishes the
//! run at its instant. A worker's own database role may trigger jobs of the groups it is
//! granted (`chime workers grant`), nothing else.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), chime_worker::TriggerError> {
//! use chime_worker::Client;
//!
//! let client = Client::new(pool).actor("billing-service");
//! let run = client
//!     .trigger("send-invoice")
//!     .params(&serde_json::json!({"invoice": 42}))?
//!     .at(chrono::Utc::now() + chrono::TimeDelta::minutes(5))
//!     .idempotency_key("invoice-42")
//!     .send()
//!     .await?;
//! println!("run {} (new: {})", run.run_id, run.created);
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::store;

/// Who the audit log names for a client that does not say ([`Client::actor`]).
pub const DEFAULT_ACTOR: &str = "chime-worker";

/// Triggers runs through the database (`chime_trigger`).
#[derive(Debug, Clone)]
pub struct Client {
    pool: PgPool,
    actor: String,
}

impl Client {
    /// A client over `pool` (any role granted the job's group, or the owner).
    pub fn new(pool: PgPool) -> Client {
        Client {
            pool,
            actor: DEFAULT_ACTOR.to_owned(),
        }
    }

    /// Who the runs' `requested_by` and the audit log name (1 to 256 bytes).
    pub fn actor(mut self, actor: impl Into<String>) -> Client {
        self.actor = actor.into();
        self
    }

    /// A trigger of job `job`, to complete and [`TriggerRun::send`].
    pub fn trigger(&self, job: impl Into<String>) -> TriggerRun<'_> {
        TriggerRun {
            client: self,
            job: job.into(),
            params: None,
            at: None,
            idempotency_key: None,
        }
    }
}

/// One trigger being built: its params, instant and idempotency key, each optional.
#[derive(Debug)]
#[must_use = "a trigger does nothing until it is sent"]
pub struct TriggerRun<'a> {
    client: &'a Client,
    job: String,
    params: Option<String>,
    at: Option<DateTime<Utc>>,
    idempotency_key: Option<String>,
}

impl TriggerRun<'_> {
    /// Params for this run instead of the job's own: a JSON object, at most 64 KiB.
    pub fn params(mut self, params: &impl Serialize) -> Result<Self, TriggerError> {
        self.params = Some(serde_json::to_string(params).map_err(TriggerError::Params)?);
        Ok(self)
    }

    /// The run's instant (default now): from a day before now to 366 days after.
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.at = Some(at);
        self
    }

    /// Sending again with the same key (1 to 200 bytes) makes no second run: it answers the
    /// job's run of that key, with [`Triggered::created`] false.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Asks the database for the run.
    pub async fn send(self) -> Result<Triggered, TriggerError> {
        let (run_id, created) = store::trigger_run(
            &self.client.pool,
            &self.job,
            self.params.as_deref(),
            self.at,
            self.idempotency_key.as_deref(),
            &self.client.actor,
        )
        .await
        .map_err(TriggerError::from_database)?;
        Ok(Triggered { run_id, created })
    }
}

/// The run a trigger made, or found by its idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Triggered {
    /// The run's id.
    pub run_id: i64,
    /// False: the idempotency key named a run made before; nothing new was made.
    pub created: bool,
}

/// Why a trigger was not made.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    /// The database refused a field (22023): no such job, params not an object or too large,
    /// an instant out of range, a key too long.
    #[error("{message}")]
    Invalid {
        /// `job`, `params`, `run_at`, `idempotency_key` or `actor`.
        field: String,
        /// The value as the database saw it.
        value: Option<String>,
        /// What is wrong and the fix.
        message: String,
    },
    /// The connection's role may not act for the job's executor group (42501); the message
    /// names the fix (`chime workers grant`).
    #[error("{0}")]
    Forbidden(String),
    /// The params do not serialize to JSON.
    #[error("params do not serialize to JSON: {0}")]
    Params(serde_json::Error),
    /// Any other database error.
    #[error("triggering the run: {0}")]
    Database(sqlx::Error),
}

impl TriggerError {
    fn from_database(error: sqlx::Error) -> TriggerError {
        if store::is_forbidden(&error) {
            let message = error
                .as_database_error()
                .map_or_else(String::new, |db| db.message().to_owned());
            return TriggerError::Forbidden(message);
        }
        match store::refusal(&error) {
            Some(r) => TriggerError::Invalid {
                field: r.field,
                value: r.value,
                message: r.message,
            },
            None => TriggerError::Database(error),
        }
    }
}
