//! Handlers: async functions registered by job name, and their type-erased form.
//!
//! A handler takes the [`JobContext`] and the run's params decoded into the handler's own type.
//! Decoding happens here, once, for the worker and the `testing` helper alike, so a params
//! mismatch reads the same everywhere.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use chime_protocol::wire::TaskKind;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::JobContext;
use crate::outcome::JobError;

/// An async job handler taking params of type `P`.
///
/// Implemented for every `Fn(JobContext, P) -> impl Future<Output = Result<(), JobError>>` that
/// is `Send + Sync + 'static`, so both `async fn`s and closures returning `async move` blocks
/// qualify:
///
/// ```
/// use chime_worker::{JobContext, JobError};
///
/// #[derive(serde::Deserialize)]
/// struct Close { batch: u32 }
///
/// async fn close_unpaid_orders(ctx: JobContext, p: Close) -> Result<(), JobError> {
///     ctx.log().info(format!("closing up to {} orders", p.batch));
///     Ok(())
/// }
/// # fn assert_handler<P, H: chime_worker::Handler<P>>(_: H) {}
/// # assert_handler(close_unpaid_orders);
/// # assert_handler(|ctx: JobContext, _: serde_json::Value| async move { ctx.log().info("hi"); Ok(()) });
/// ```
///
/// `P` is any `DeserializeOwned` type: a struct of the job's params, `serde_json::Value` for raw
/// JSON, or `()` for a job without params (`null`).
pub trait Handler<P>: Send + Sync + 'static {
    /// The future the handler returns.
    type Future: Future<Output = Result<(), JobError>> + Send + 'static;

    /// Runs the handler.
    fn call(&self, ctx: JobContext, params: P) -> Self::Future;
}

impl<F, Fut, P> Handler<P> for F
where
    F: Fn(JobContext, P) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    type Future = Fut;

    fn call(&self, ctx: JobContext, params: P) -> Fut {
        self(ctx, params)
    }
}

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>;

/// A handler with its params type erased: takes raw JSON params.
pub(crate) type ErasedHandler = Arc<dyn Fn(JobContext, Value) -> HandlerFuture + Send + Sync>;

/// Wraps `handler` so it takes raw JSON; a params decode failure becomes a non-retryable
/// failure naming the job and the serde error (the same params would fail again).
pub(crate) fn erase<P, H>(job: &str, handler: H) -> ErasedHandler
where
    P: DeserializeOwned + Send + 'static,
    H: Handler<P>,
{
    let job = job.to_owned();
    Arc::new(
        move |ctx, params| match serde_json::from_value::<P>(params) {
            Ok(params) => Box::pin(handler.call(ctx, params)),
            Err(e) => {
                let message = format!(
                    "params of job `{job}` do not decode into the handler's params type {}: {e}",
                    std::any::type_name::<P>()
                );
                Box::pin(async move { Err(JobError::fail(message)) })
            }
        },
    )
}

/// The handlers a worker knows, by job name, and the reducers of its map/reduce jobs.
#[derive(Clone, Default)]
pub(crate) struct Handlers {
    by_job: BTreeMap<String, ErasedHandler>,
    reducers: BTreeMap<String, ErasedHandler>,
}

/// What runs a trigger ([`Handlers::for_trigger`]).
pub(crate) enum Found<'a> {
    /// This handler (the job's, or its reducer for a reduce task).
    Handler(&'a ErasedHandler),
    /// A reduce task of a job this worker handles but has no reducer for.
    NoReducer,
    /// Neither a handler nor a reducer for the job.
    Unknown,
}

impl Handlers {
    /// Adds a handler; returns false if the job already had one.
    pub(crate) fn insert(&mut self, job: String, handler: ErasedHandler) -> bool {
        self.by_job.insert(job, handler).is_none()
    }

    /// Adds a job's reducer; returns false if the job already had one.
    pub(crate) fn insert_reducer(&mut self, job: String, reducer: ErasedHandler) -> bool {
        self.reducers.insert(job, reducer).is_none()
    }

    /// What runs a trigger of job `job` whose task is of kind `kind`: the reducer for a
    /// reduce task, the job's handler for any other.
    pub(crate) fn for_trigger(&self, job: &str, kind: Option<TaskKind>) -> Found<'_> {
        let found = if kind == Some(TaskKind::Reduce) {
            self.reducers.get(job)
        } else {
            self.by_job.get(job)
        };
        match found {
            Some(handler) => Found::Handler(handler),
            None if kind == Some(TaskKind::Reduce) && self.by_job.contains_key(job) => {
                Found::NoReducer
            }
            None => Found::Unknown,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_job.is_empty() && self.reducers.is_empty()
    }

    /// Job names with a handler or a reducer, sorted: what the worker registers as handling.
    pub(crate) fn jobs(&self) -> Vec<String> {
        let jobs: std::collections::BTreeSet<&String> =
            self.by_job.keys().chain(self.reducers.keys()).collect();
        jobs.into_iter().cloned().collect()
    }
}
