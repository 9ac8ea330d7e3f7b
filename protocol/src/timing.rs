//! The time bounds one side of the wire promises and the other relies on, with their relations
//! checked when this crate compiles (a change that breaks one fails the build, not a run).
//!
//! The scheduler publishes a trigger up to its *lead* ahead of the run's instant, with
//! `x-chime-not-before` = the instant; a worker holds such a trigger in memory (claimed, no
//! handler slot) until the instant when it is due within [`TRIGGER_HOLD_MAX`], and otherwise
//! sends it through a delay tier, which costs a publish and tier-TTL granularity. So the longest
//! lead, [`MAX_LEAD`], must stay under the hold limit, with room for clock skew between the two
//! hosts ([`MIN_SKEW_ROOM`]). A retry's wait is held only under [`HOLD_MAX`]: retries can be
//! hours long, and a held delivery keeps its consumer slot.

use std::time::Duration;

/// The longest lead of any instant: how far ahead of a run's instant the scheduler may publish
/// its trigger. The scheduler's lead grows with the number of triggers due at the same instant
/// (`chime_scheduler::pace`) and is capped here, a second under the workers' hold limit for
/// triggers ([`TRIGGER_HOLD_MAX`]), so a trigger published ahead is held, never sent through a
/// delay tier, with room for clock skew between the hosts.
pub const MAX_LEAD: Duration = Duration::from_secs(3);

/// A trigger the scheduler published ahead of its own instant (its `x-chime-not-before` is the
/// run's scheduled instant) is held in memory when due within this, however far ahead the
/// scheduler's lead put it ([`MAX_LEAD`]). Held triggers count against the worker's `hold`
/// budget, never its handler slots.
pub const TRIGGER_HOLD_MAX: Duration = Duration::from_secs(4);

/// A wait shorter than this is held in memory by the worker that received the message (keeping
/// its consumer slot) rather than sent through another delay tier: the tail of a retry's delay.
pub const HOLD_MAX: Duration = Duration::from_millis(250);

/// The least difference between [`TRIGGER_HOLD_MAX`] and [`MAX_LEAD`]: how far the worker's
/// wall clock may run behind the scheduler's before a trigger published at the full lead looks
/// further ahead than the hold limit to the worker.
pub const MIN_SKEW_ROOM: Duration = Duration::from_secs(1);

// The relations the prose above states, checked at compile time.
const _: () = assert!(MAX_LEAD.as_millis() < TRIGGER_HOLD_MAX.as_millis());
const _: () =
    assert!(MAX_LEAD.as_millis() + MIN_SKEW_ROOM.as_millis() <= TRIGGER_HOLD_MAX.as_millis());
const _: () = assert!(HOLD_MAX.as_millis() < TRIGGER_HOLD_MAX.as_millis());
