//! What every delivery task of one worker shares ([`Shared`]): its identity, handlers, store
//! and batchers, the handler slots, and the runs it holds: one delivery per run at a time
//! ([`InFlight`]), with the handler's token an operator's cancel fires (naming the run, or the
//! parent run of a task), and the outcomes it could not write yet ([`Unrecorded`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chime_protocol::topology::Topology;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::claims::ClaimBatcher;
use crate::handler::Handlers;
use crate::recording::{OutcomeBatcher, Unrecorded, log_recorded};
use crate::store::Store;
use crate::tasks::TaskCalls;

/// State shared by the worker's tasks.
pub(crate) struct Shared {
    pub(crate) id: String,
    pub(crate) topology: Topology,
    pub(crate) handlers: Handlers,
    pub(crate) store: Store,
    /// Where handlers' task calls go (map, output, results): the store.
    pub(crate) task_calls: Arc<dyn TaskCalls>,
    /// Parent of every handler's cancellation token; fired when the drain timeout passes.
    pub(crate) stop_handlers: CancellationToken,
    /// Fired after the cancel grace of a shutdown: drop handlers that still run.
    pub(crate) abandon: CancellationToken,
    pub(crate) cancel_grace: Duration,
    /// A handler running this long has its delivery acked early.
    pub(crate) ack_after: Duration,
    /// How long a run of a job no online worker handles may wait, from its scheduled instant.
    pub(crate) unhandled_wait: Duration,
    /// One permit per handler that may run at once (`capacity`).
    pub(crate) handler_slots: Semaphore,
    /// Claims of deliveries arriving together, in one statement.
    pub(crate) claims: ClaimBatcher,
    /// Outcomes of attempts finishing together, in one statement.
    pub(crate) outcomes: OutcomeBatcher,
    in_flight: Mutex<HashMap<i64, RunSlot>>,
    /// Notified whenever a run leaves `in_flight`.
    released: Notify,
    unrecorded: Mutex<HashMap<i64, Unrecorded>>,
}

/// How long a delivery of a later attempt waits for this worker to be done with an earlier one.
const SLOT_WAIT: Duration = Duration::from_secs(10);

/// What the worker keeps about a run it is handling: the attempt, and for control messages its
/// handler's token.
struct RunSlot {
    attempt: u32,
    /// The run's parent, for a task: a cancel of the parent reaches it.
    parent: Option<i64>,
    token: CancellationToken,
    cancel_requested: Arc<AtomicBool>,
}

/// Whether a delivery may go on with its run.
pub(crate) enum Entered<'a> {
    /// It may; the guard leaves the run when dropped.
    Yes(InFlight<'a>),
    /// This worker is handling the same (or a later) attempt of the run.
    Duplicate,
    /// This worker is still handling an earlier attempt after [`SLOT_WAIT`].
    Busy,
}

/// Marks a run as being handled by this worker until dropped, with the handler's cancellation
/// token (fired by the timeout, the shutdown, or an operator's cancel).
pub(crate) struct InFlight<'a> {
    shared: &'a Shared,
    run_id: i64,
    /// The handler's token; a child of the worker's `stop_handlers`.
    pub token: CancellationToken,
    /// Set when an operator's cancel fired the token.
    pub cancel_requested: Arc<AtomicBool>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.shared.in_flight).remove(&self.run_id);
        self.shared.released.notify_waiters();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded maps stay consistent even if a holder panicked.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How the delivery path treats handlers, from the worker's configuration.
pub(crate) struct Limits {
    /// Handlers that may run at once.
    pub capacity: u16,
    pub cancel_grace: Duration,
    pub ack_after: Duration,
    pub unhandled_wait: Duration,
}

impl Shared {
    /// The state of worker `id` of `topology`'s group, on `pool` (writes retried for
    /// `db_retry_budget`); starts the claim and outcome batchers on the current runtime.
    pub(crate) fn new(
        id: String,
        topology: Topology,
        handlers: Handlers,
        pool: PgPool,
        db_retry_budget: Duration,
        limits: Limits,
    ) -> Self {
        let claims = ClaimBatcher::start(
            Store::new(pool.clone(), db_retry_budget),
            id.clone(),
            topology.group().to_owned(),
        );
        let outcomes = OutcomeBatcher::start(Store::new(pool.clone(), db_retry_budget), id.clone());
        Shared {
            id,
            topology,
            handlers,
            task_calls: Arc::new(Store::new(pool.clone(), db_retry_budget)),
            store: Store::new(pool, db_retry_budget),
            stop_handlers: CancellationToken::new(),
            abandon: CancellationToken::new(),
            cancel_grace: limits.cancel_grace,
            ack_after: limits.ack_after,
            unhandled_wait: limits.unhandled_wait,
            handler_slots: Semaphore::new(usize::from(limits.capacity)),
            claims,
            outcomes,
            in_flight: Mutex::default(),
            released: Notify::new(),
            unrecorded: Mutex::default(),
        }
    }

    /// Enters run `run_id` (a task of run `parent`, if given) for attempt `attempt`, unless
    /// this worker is already handling a delivery of it: of the same or an earlier attempt,
    /// that is a duplicate; of an earlier one, the caller waits (up to [`SLOT_WAIT`]) for it
    /// to be done, as a retry comes back within milliseconds when its delay is short.
    pub(crate) async fn enter(
        &self,
        run_id: i64,
        attempt: u32,
        parent: Option<i64>,
    ) -> Entered<'_> {
        let deadline = tokio::time::Instant::now() + SLOT_WAIT;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registers for the next release before looking, so none is missed.
            released.as_mut().enable();
            let held = {
                let mut in_flight = lock(&self.in_flight);
                match in_flight.entry(run_id) {
                    Entry::Occupied(slot) => Some(slot.get().attempt),
                    Entry::Vacant(vacant) => {
                        let token = self.stop_handlers.child_token();
                        let cancel_requested = Arc::new(AtomicBool::new(false));
                        vacant.insert(RunSlot {
                            attempt,
                            parent,
                            token: token.clone(),
                            cancel_requested: cancel_requested.clone(),
                        });
                        // Build the guard after the lock is released: dropping it locks again.
                        drop(in_flight);
                        return Entered::Yes(InFlight {
                            shared: self,
                            run_id,
                            token,
                            cancel_requested,
                        });
                    }
                }
            };
            if held.is_some_and(|held| held >= attempt) {
                return Entered::Duplicate;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Entered::Busy;
            }
        }
    }

    /// An operator's cancel of run `run_id`: fires the handler's token of that run and of
    /// every task of it (run `run_id` is their parent) this worker holds. Returns whether it
    /// fired any.
    pub(crate) fn cancel_run(&self, run_id: i64) -> bool {
        let in_flight = lock(&self.in_flight);
        let mut fired = false;
        for (_, slot) in in_flight
            .iter()
            .filter(|(id, slot)| **id == run_id || slot.parent == Some(run_id))
        {
            slot.cancel_requested.store(true, Ordering::SeqCst);
            slot.token.cancel();
            fired = true;
        }
        fired
    }

    fn unrecorded(&self) -> MutexGuard<'_, HashMap<i64, Unrecorded>> {
        lock(&self.unrecorded)
    }

    pub(crate) fn keep_unrecorded(&self, run_id: i64, pending: Unrecorded) {
        self.unrecorded().insert(run_id, pending);
    }

    /// The kept outcome of run `run_id` for a redelivery of attempt `attempt`: the attempt that
    /// ran may be later than the message's (a take-over runs the next attempt on the same
    /// message), never earlier.
    pub(crate) fn take_unrecorded(&self, run_id: i64, attempt: u32) -> Option<Unrecorded> {
        let mut unrecorded = self.unrecorded();
        if unrecorded.get(&run_id)?.attempt >= attempt {
            unrecorded.remove(&run_id)
        } else {
            None
        }
    }

    /// One more try for every outcome that could not be written (each try has the store's
    /// retry budget).
    pub(crate) async fn retry_unrecorded(&self) {
        let run_ids: Vec<i64> = self.unrecorded().keys().copied().collect();
        for run_id in run_ids {
            let Some(pending) = self.unrecorded().remove(&run_id) else {
                continue; // a redelivery is recording it
            };
            // An earlier try may have committed with its reply lost.
            match self
                .store
                .record_outcome(run_id, pending.attempt, &self.id, &pending.record(), true)
                .await
            {
                Ok(recorded) => {
                    // A retry or a parked copy is published when the requeued delivery comes
                    // back and finds the run `retrying` or `dead` at this attempt.
                    tracing::info!(run_id, "recorded a delayed outcome");
                    log_recorded(recorded, &pending.outcome);
                }
                Err(error) => {
                    tracing::warn!(%error, run_id, "outcome still cannot be recorded");
                    self.keep_unrecorded(run_id, pending);
                }
            }
        }
    }

    /// How many outcomes wait for a later try.
    pub(crate) fn unrecorded_count(&self) -> usize {
        self.unrecorded().len()
    }

    pub(crate) fn store_retry_budget(&self) -> Duration {
        self.store.retry_budget()
    }

    pub(crate) async fn mark_stopped(&self) {
        if let Err(error) = self.store.mark_stopped(&self.id).await {
            tracing::warn!(%error, "cannot mark the worker stopped in chime_workers");
        }
    }
}
