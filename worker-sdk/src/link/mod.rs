//! The link to RabbitMQ: the one layer of the SDK that uses lapin.
//!
//! [`Broker`] holds the worker's connection and opens [`Link`]s on it (a consumer channel and a
//! confirm-mode publishing channel each); [`supervise`] keeps a consumer on the group's work
//! queue until shutdown, reopening links after channel-level errors, and hands each delivery
//! (an [`Inbound`]) and each control message to a [`Dispatch`] the runtime gives it. The
//! delivery path settles a delivery through it: `ack` and `requeue` on the delivery's own
//! channel, and the confirmed publishes of a copy (`publish`): a retry or the rest of a wait
//! through a delay tier (`delay`), a message it cannot run to the parking lot (`parking`).
//!
//! **Layering:** imports nothing of the crate; the delivery path and the runtime import it.

mod broker;
mod consume;
mod delay;
mod inbound;
mod parking;
mod publish;

pub(crate) use broker::{Broker, Link};

/// Longest queue name RabbitMQ takes (an AMQP short string), in bytes: the worker's own queue,
/// `<prefix>.<group>.worker.<id>`, must fit, which bounds the worker id.
pub const MAX_QUEUE_NAME_BYTES: usize = 255;
pub(crate) use consume::{Dispatch, supervise};
pub(crate) use inbound::Inbound;
/// The broker's error type, named here so that no module outside the link names lapin.
pub(crate) use lapin::Error as AmqpError;
