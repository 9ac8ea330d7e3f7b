//! Leader election through a lease row in PostgreSQL, with a local trust window.
//!
//! Every instance runs an [`Elector`]. Each `renew_interval` it runs one short compare-and-set
//! on the lease row (DB clock; no transaction is held open): it renews its own lease or takes
//! over an expired one, bumping the term. Followers also wake at once when a leader resigns
//! (`NOTIFY chime_leader`).
//!
//! The database is authoritative; this process uses its monotonic clock only to stop trusting
//! its leadership *sooner*: a lease obtained by an attempt that started at `t` is trusted until
//! `t + lease_ttl - safety_margin`. A leader that cannot renew (database down, network partition,
//! process frozen) stops acting before its lease can have expired in the database, and every
//! leader write is fenced by the term anyway ([`crate::store::Fence`]).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::{Fence, LEADER_CHANNEL, Store};

/// What this instance may do right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// Another instance leads, or nobody does.
    Follower,
    /// This instance leads under `term` until `trusted_until` (monotonic clock).
    Leader {
        /// The fencing token.
        term: i64,
        /// Stop acting at this instant unless renewed before.
        trusted_until: Instant,
    },
}

impl Leadership {
    /// The term, if leading and still trusted at `now`.
    pub fn term_at(&self, now: Instant) -> Option<i64> {
        match self {
            Leadership::Leader {
                term,
                trusted_until,
            } if now < *trusted_until => Some(*term),
            _ => None,
        }
    }
}

/// Lease timings.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTimings {
    /// How long a lease lasts in the database without renewal.
    pub ttl: Duration,
    /// How often the leader renews and followers try to take over.
    pub renew_interval: Duration,
    /// Local trust ends this long before the lease can have expired.
    pub safety_margin: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        LeaseTimings {
            ttl: Duration::from_secs(3),
            renew_interval: Duration::from_secs(1),
            safety_margin: Duration::from_millis(500),
        }
    }
}

/// Runs the election for one instance.
#[derive(Debug)]
pub struct Elector {
    store: Store,
    me: String,
    timings: LeaseTimings,
    tx: watch::Sender<Leadership>,
}

impl Elector {
    /// An elector for instance `me`, and a receiver that follows its leadership.
    pub fn new(
        store: Store,
        me: impl Into<String>,
        timings: LeaseTimings,
    ) -> (Elector, watch::Receiver<Leadership>) {
        let (tx, rx) = watch::channel(Leadership::Follower);
        (
            Elector {
                store,
                me: me.into(),
                timings,
                tx,
            },
            rx,
        )
    }

    /// Campaigns and renews until `shutdown`, then resigns if leading.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut resigned = self.listen_for_resignations().await;
        let mut tick = tokio::time::interval(self.timings.renew_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                Some(()) = resigned.recv() => {}
            }
            self.campaign().await;
        }
        let leading = self.tx.borrow().term_at(Instant::now());
        self.tx.send_replace(Leadership::Follower);
        if let Some(term) = leading {
            let fence = Fence {
                holder: self.me.clone(),
                term,
            };
            match self.store.resign(&fence).await {
                Ok(_) => info!(term, instance = %self.me, "resigned leadership"),
                Err(e) => {
                    warn!(term, error = %format!("{e:#}"), "could not resign; the lease will expire")
                }
            }
        }
    }

    async fn campaign(&self) {
        let started = Instant::now();
        // A renewal slower than the trust window is worthless: bound it.
        let budget = self.timings.ttl.saturating_sub(self.timings.safety_margin);
        let result =
            tokio::time::timeout(budget, self.store.acquire_lease(&self.me, self.timings.ttl))
                .await;
        let previous = self.tx.borrow().clone();
        let now = Instant::now();
        match result {
            Ok(Ok(Some(term))) => {
                let trusted_until = started + budget;
                if previous.term_at(now) != Some(term) {
                    info!(term, instance = %self.me, "became leader");
                }
                self.tx.send_replace(Leadership::Leader {
                    term,
                    trusted_until,
                });
            }
            Ok(Ok(None)) => {
                // Also when the trust window has closed already (a process frozen past its
                // lease learns here that another instance leads).
                if let Leadership::Leader { term, .. } = previous {
                    warn!(term, instance = %self.me, "lost the lease to another instance");
                }
                self.tx.send_replace(Leadership::Follower);
            }
            Ok(Err(e)) => self.renew_failed(&previous, now, &format!("{e:#}")),
            Err(_) => self.renew_failed(&previous, now, "lease statement timed out"),
        }
    }

    fn renew_failed(&self, previous: &Leadership, now: Instant, error: &str) {
        match previous.term_at(now) {
            // Keep leading until the trust window closes; the next tick tries again.
            Some(term) => warn!(
                term,
                error, "could not renew the lease; still trusted for now"
            ),
            None => {
                if matches!(previous, Leadership::Leader { .. }) {
                    warn!(error, "stepping down: lease could not be renewed in time");
                }
                self.tx.send_replace(Leadership::Follower);
            }
        }
    }

    /// A stream of "the leader resigned" wake-ups; empty if LISTEN is unavailable (polling
    /// still works, only slower).
    async fn listen_for_resignations(&self) -> tokio::sync::mpsc::Receiver<()> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let pool = self.store.pool().clone();
        tokio::spawn(async move {
            loop {
                match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(mut listener) => {
                        if listener.listen(LEADER_CHANNEL).await.is_ok() {
                            while listener.recv().await.is_ok() {
                                if tx.send(()).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot LISTEN for leader changes; polling only"),
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        rx
    }
}

/// Watches leadership and runs `duty(term, token)` while this instance leads; cancels the token
/// as soon as leadership is lost, the trust window closes, or the term changes.
pub async fn while_leading<F, Fut>(
    mut leadership: watch::Receiver<Leadership>,
    shutdown: CancellationToken,
    mut duty: F,
) where
    F: FnMut(i64, watch::Receiver<Leadership>, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let current = leadership.borrow_and_update().clone();
        let Some(term) = current.term_at(Instant::now()) else {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = leadership.changed() => if changed.is_err() { return },
            }
            continue;
        };
        let token = shutdown.child_token();
        let task = tokio::spawn(duty(term, leadership.clone(), token.clone()));
        // Supervise: stop the duty when the trust window closes or leadership changes.
        loop {
            let trusted_until = match &*leadership.borrow() {
                Leadership::Leader {
                    term: t,
                    trusted_until,
                } if *t == term => Some(*trusted_until),
                _ => None,
            };
            let Some(trusted_until) = trusted_until else {
                break;
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(trusted_until) => {
                    if leadership.borrow().term_at(Instant::now()) != Some(term) {
                        warn!(term, "trust window closed without renewal; stopping leader duties");
                        break;
                    }
                }
                changed = leadership.changed() => if changed.is_err() { break },
            }
        }
        token.cancel();
        if let Err(e) = task.await {
            warn!(term, error = %e, "leader duty ended abnormally");
        }
        if shutdown.is_cancelled() {
            return;
        }
    }
}
