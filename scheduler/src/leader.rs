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

/// How long [`while_leading`] waits before starting again a duty that ended by itself.
pub const DUTY_RESTART_PAUSE: Duration = Duration::from_secs(1);

/// Watches leadership and runs `duty(term, token)` while this instance leads; cancels the token
/// as soon as leadership is lost, the trust window closes, or the term changes.
///
/// A duty that ends by itself while this instance still leads (the planner stops on a database
/// error that the lease survived, such as a connection cut by a failover, or on finding that
/// the database lost its writes) is started again under the same term after
/// [`DUTY_RESTART_PAUSE`]: it re-reads the jobs and their persisted cursors, so a leader never
/// holds the lease with its duties stopped.
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
        let mut task = tokio::spawn(duty(term, leadership.clone(), token.clone()));
        let mut ended = None;
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
                joined = &mut task => {
                    ended = Some(joined);
                    break;
                }
            }
        }
        token.cancel();
        let ended_by_itself = ended.is_some();
        let joined = match ended {
            Some(joined) => joined,
            None => task.await,
        };
        if let Err(e) = joined {
            warn!(term, error = %e, "leader duty ended abnormally");
        }
        if shutdown.is_cancelled() {
            return;
        }
        if ended_by_itself && leadership.borrow().term_at(Instant::now()) == Some(term) {
            warn!(
                term,
                pause = ?DUTY_RESTART_PAUSE,
                "leader duties ended while this instance leads; starting them again"
            );
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(DUTY_RESTART_PAUSE) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Leading under `term`, trusted for an hour.
    fn leading(term: i64) -> Leadership {
        Leadership::Leader {
            term,
            trusted_until: Instant::now() + Duration::from_secs(3600),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_duty_that_ends_by_itself_while_leading_is_started_again_under_the_same_term() {
        let (_leadership, rx) = watch::channel(leading(7));
        let shutdown = CancellationToken::new();
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let supervisor = tokio::spawn(while_leading(rx, shutdown.clone(), move |term, _, _| {
            let started = started.clone();
            // Ends at once, as a planner that hit a database error does.
            async move {
                let _ = started.send((term, Instant::now()));
            }
        }));
        let mut seen = Vec::new();
        for _ in 0..3 {
            // Virtual time: a minute is far beyond the pause, and costs nothing.
            let start = tokio::time::timeout(Duration::from_secs(60), starts.recv()).await;
            seen.push(start.expect("started again").expect("started"));
        }
        shutdown.cancel();
        supervisor.await.expect("supervisor");
        assert!(seen.iter().all(|(term, _)| *term == 7), "{seen:?}");
        for pair in seen.windows(2) {
            assert!(pair[1].1 - pair[0].1 >= DUTY_RESTART_PAUSE, "{seen:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_duty_is_not_started_again_once_leadership_is_lost() {
        let (leadership, rx) = watch::channel(leading(7));
        let leadership = Arc::new(leadership);
        let shutdown = CancellationToken::new();
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let lose = leadership.clone();
        let supervisor = tokio::spawn(while_leading(rx, shutdown.clone(), move |term, _, _| {
            let (started, lose) = (started.clone(), lose.clone());
            // The fence was lost: leadership goes, then the duty ends.
            async move {
                lose.send_replace(Leadership::Follower);
                let _ = started.send(term);
            }
        }));
        assert_eq!(starts.recv().await, Some(7));
        // Long past the restart pause, nothing started again.
        tokio::time::sleep(DUTY_RESTART_PAUSE * 10).await;
        assert!(starts.try_recv().is_err(), "started again without leading");
        // Leading again under a new term starts it again.
        leadership.send_replace(leading(8));
        assert_eq!(starts.recv().await, Some(8));
        shutdown.cancel();
        supervisor.await.expect("supervisor");
    }
}
