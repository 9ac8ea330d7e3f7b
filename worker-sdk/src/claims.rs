//! Batched claims: deliveries that arrive together (the burst of triggers published ahead of
//! one instant) are claimed in one statement instead of one database round trip each.
//!
//! One task sends the statements, one at a time: claims that arrive while a statement runs
//! wait and go together in the next one, so a lone claim costs one round trip as before and a
//! burst costs a few. A delivery whose run the batch did not claim is claimed alone
//! ([`crate::store::Store::claim`]), which also reads why it was refused.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};

use crate::store::{ClaimClock, ClaimRequest, Store};

/// Claims per statement at most.
const MAX_BATCH: usize = 512;

/// What the batch did with one claim.
pub(crate) enum Batched {
    /// The attempt is this worker's; `clock` dates the claim.
    Claimed { clock: ClaimClock },
    /// Not claimed by the batch: claim it alone. `maybe_ours` when the batch failed, so its
    /// commit may have happened with the reply lost.
    Alone { maybe_ours: bool },
}

type Request = (ClaimRequest, oneshot::Sender<Batched>);

/// The handle of the batching task; the task ends when this is dropped.
pub(crate) struct ClaimBatcher {
    requests: mpsc::UnboundedSender<Request>,
}

impl ClaimBatcher {
    /// Starts the batching task for `worker_id` of group `group` on the current runtime.
    pub(crate) fn start(store: Store, worker_id: String, group: String) -> Self {
        let (requests, mut incoming) = mpsc::unbounded_channel::<Request>();
        tokio::spawn(async move {
            while let Some(first) = incoming.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match incoming.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let claims: Vec<ClaimRequest> =
                    batch.iter().map(|(claim, _)| claim.clone()).collect();
                match store.claim_many(&claims, &worker_id, &group).await {
                    Ok(claimed) => {
                        let claimed: HashMap<i64, ClaimClock> = claimed.into_iter().collect();
                        for (claim, reply) in batch {
                            let answer = match claimed.get(&claim.run_id) {
                                Some(&clock) => Batched::Claimed { clock },
                                None => Batched::Alone { maybe_ours: false },
                            };
                            let _ = reply.send(answer);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, claims = batch.len(), "batched claim failed; claiming one by one");
                        for (_, reply) in batch {
                            let _ = reply.send(Batched::Alone { maybe_ours: true });
                        }
                    }
                }
            }
        });
        ClaimBatcher { requests }
    }

    /// Claims `claim` with whatever other claims are waiting.
    pub(crate) async fn claim(&self, claim: ClaimRequest) -> Batched {
        let (reply, answer) = oneshot::channel();
        if self.requests.send((claim, reply)).is_err() {
            return Batched::Alone { maybe_ours: false };
        }
        // The task went away mid-batch (runtime shutting down): the statement may have run.
        answer.await.unwrap_or(Batched::Alone { maybe_ours: true })
    }
}
