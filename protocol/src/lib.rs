//! Chime's protocol: what the scheduler and the workers share, in one place.
//!
//! Both `chime-scheduler` and `chime-worker` depend on this crate, and on nothing of each other:
//!
//! - [`wire`] — the trigger message, the name of every header, the control messages, the
//!   protocol version (docs/protocol.md describes them for workers in other languages);
//!   `headers` (feature `amqp`) — each header value's one codec;
//! - [`topology`] — exchange, queue and routing-key names, the delay tiers and every queue
//!   argument, as data; their declares behind feature `amqp`;
//! - [`state`] — [`RunState`] and [`AttemptState`], the words the migrations check;
//! - [`retry`] — the retry policy's defaults and its pure maths (delay before the next attempt,
//!   retry or dead, how a wait is served by the tiers); [`backoff`] — capped exponential backoff
//!   for reconnects;
//! - [`limits`] — the documented upper bound of every value that crosses an edge;
//! - [`timing`] — the time bounds one side promises and the other relies on (the scheduler's
//!   [`timing::MAX_LEAD`] under the workers' [`timing::TRIGGER_HOLD_MAX`]);
//! - [`redact`] — the one function that hides a URL's secrets; [`addresses`] — several broker
//!   addresses of one cluster and the one rule both sides connect through them by;
//! - `tls` (feature `amqp`) — TLS options of the broker connection and the one way both sides
//!   connect; `secret_file` (feature `amqp`, IO like `tls`) — a setting's value read from the
//!   file a `CHIME_<KEY>_FILE` variable names, the one way both sides read one.
//!
//! **Invariants.** Everything here but the `amqp` parts is pure: no IO, no clock. A relation
//! between two constants that the code relies on is a `const` assertion, so breaking it fails
//! the build. A change to a wire type is additive (a new optional field) or bumps
//! [`PROTOCOL_VERSION`].

pub mod addresses;
pub mod backoff;
#[cfg(feature = "amqp")]
pub mod headers;
pub mod limits;
pub mod redact;
pub mod retry;
#[cfg(feature = "amqp")]
pub mod secret_file;
pub mod state;
pub mod timing;
#[cfg(feature = "amqp")]
pub mod tls;
pub mod topology;
pub mod wire;

pub use state::{AttemptState, RunState, UnknownState};
pub use topology::Topology;
pub use wire::{ControlMessage, DecodeError, PROTOCOL_VERSION, RetryPolicy, Trigger};
