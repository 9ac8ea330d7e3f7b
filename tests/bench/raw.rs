//! The broker's own limit on this machine, measured beside the throughput ramp: messages per
//! second through one quorum queue with what a durable run needs of RabbitMQ and nothing else
//! (persistent publish with confirms, consume, one ack per message), no database.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chime_e2e::{passive_declare, try_wait_for};
use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::Serialize;

use crate::sandbox::Sandbox;

/// Publishes awaiting their confirm at once, as the dispatcher keeps many in flight.
const IN_FLIGHT: usize = 1_000;
/// Body size, about a trigger's.
const BODY_BYTES: usize = 300;

/// What the raw measurement saw.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RawRate {
    /// Messages confirmed, consumed and acked per second.
    pub per_second: f64,
    /// Messages in the measurement.
    pub messages: u64,
}

/// Sends messages for `seconds` through a fresh quorum queue of the sandbox's prefix (deleted
/// after) and counts the acked ones per second.
pub async fn measure(sandbox: &Sandbox, seconds: u64) -> anyhow::Result<RawRate> {
    let connection = Connection::connect(&sandbox.amqp_url, ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ for the raw measurement")?;
    let queue = format!("{}.raw-limit", sandbox.prefix);
    let publish = connection.create_channel().await?;
    let consume = connection.create_channel().await?;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    publish
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .context("declaring the raw measurement's queue")?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    consume
        .basic_qos(IN_FLIGHT as u16, BasicQosOptions::default())
        .await?;
    let mut consumer = consume
        .basic_consume(
            queue.as_str().into(),
            "raw-limit".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let acker = tokio::spawn(async move {
        let mut acked = 0u64;
        while let Some(delivery) = consumer.next().await {
            let Ok(delivery) = delivery else { break };
            if delivery.ack(BasicAckOptions::default()).await.is_err() {
                break;
            }
            acked += 1;
        }
        acked
    });

    let body = vec![b'x'; BODY_BYTES];
    let properties = BasicProperties::default().with_delivery_mode(2);
    let mut confirms = futures::stream::FuturesUnordered::new();
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let mut sent = 0u64;
    while Instant::now() < until {
        while confirms.len() < IN_FLIGHT {
            let confirm = publish
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties.clone(),
                )
                .await
                .context("publishing in the raw measurement")?;
            confirms.push(confirm);
            sent += 1;
        }
        if let Some(confirmed) = confirms.next().await {
            confirmed.context("a raw measurement publish was not confirmed")?;
        }
    }
    while let Some(confirmed) = confirms.next().await {
        confirmed.context("a raw measurement publish was not confirmed")?;
    }
    // Every message confirmed; wait (at most a minute) for the consumer to ack them all.
    let drained =
        try_wait_for(
            Duration::from_secs(60),
            "every message acked",
            async || match passive_declare(&consume, &queue).await {
                Ok(declared) => (declared.message_count() == 0).then_some(Ok(())),
                Err(e) => Some(Err(e)),
            },
        )
        .await;
    if let Ok(Err(e)) = drained {
        return Err(e.into());
    }
    let elapsed = start.elapsed();
    publish
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .context("deleting the raw measurement's queue")?;
    let _ = connection.close(200, "done".into()).await;
    let acked = acker.await.unwrap_or(0);
    let messages = acked.min(sent);
    Ok(RawRate {
        per_second: messages as f64 / elapsed.as_secs_f64(),
        messages,
    })
}
