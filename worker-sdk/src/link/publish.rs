//! Confirmed publishes from the worker (parked copies, delayed retries): `mandatory`, on a
//! confirm-mode channel, and only a plain broker ack counts.
//!
//! `Ack(Some(returned))` means no queue took the message (unroutable: a missing queue or
//! binding) and `Nack` means the queue refused it; either way the caller must keep the original
//! delivery (requeue it) rather than ack it.

use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};

/// How long to wait for the broker's confirm of a publish.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a publish did not count as done.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PublishError {
    #[error("publishing to routing key `{key}` failed: {source}")]
    Publish {
        key: String,
        #[source]
        source: lapin::Error,
    },
    #[error("the message to routing key `{key}` was unroutable ({detail}): is its queue bound?")]
    Unroutable { key: String, detail: String },
    #[error("the broker refused the message to routing key `{key}` (nack)")]
    Nacked { key: String },
    #[error(
        "the broker did not confirm the message to routing key `{key}` within {CONFIRM_TIMEOUT:?}"
    )]
    Timeout { key: String },
    #[error("the publishing channel is not in confirm mode, so the message cannot be trusted")]
    NotConfirmed,
}

impl PublishError {
    /// No queue took the message: nothing is bound to its routing key.
    pub(crate) fn is_unroutable(&self) -> bool {
        matches!(self, PublishError::Unroutable { .. })
    }
}

/// Publishes `body` to `exchange` with routing key `key`, `mandatory`, and waits for the
/// broker's confirm. `channel` must be in confirm mode.
pub(crate) async fn confirmed(
    channel: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<(), PublishError> {
    let failed = |source| PublishError::Publish {
        key: key.to_owned(),
        source,
    };
    let confirm = channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            properties,
        )
        .await
        .map_err(failed)?;
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Err(_) => Err(PublishError::Timeout {
            key: key.to_owned(),
        }),
        Ok(Err(e)) => Err(failed(e)),
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(PublishError::Unroutable {
            key: key.to_owned(),
            detail: format!("{} {}", returned.reply_code, returned.reply_text),
        }),
        Ok(Ok(Confirmation::Nack(_))) => Err(PublishError::Nacked {
            key: key.to_owned(),
        }),
        Ok(Ok(Confirmation::NotRequested)) => Err(PublishError::NotConfirmed),
    }
}
