//! Chime worker SDK: embed it in a service to consume an executor group's trigger queue.
//!
//! See `README.md` for a tour and `docs/protocol.md` for the wire contract.

pub mod protocol;
pub mod topology;

pub use protocol::Trigger;
pub use topology::Topology;
