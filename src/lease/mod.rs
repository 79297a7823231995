//! The shared lease machinery, written once for every kind of lock: what a held lease is
//! (hold, state and watch, guard), re-entry, renewal and heartbeats, clean-ups of unknown
//! outcomes, poisoning, and the acquire logic of `RawLock`. A kind of lock brings only its
//! `Protocol` (the primitive seam).

mod at_shutdown;
mod cleanup;
mod contended;
mod context;
mod guard;
mod hold;
mod lessor;
mod plain_take;
mod poison;
mod protocol;
mod quorum;
mod raw_lock;
pub(crate) mod reentrancy;
mod renewal;
mod replication;
mod reply;
pub(crate) mod scripts;
mod single;
mod state;

pub(crate) use context::{Handle, LockContext};
#[cfg(feature = "serde")]
pub(crate) use guard::ReleaseWith;
pub(crate) use guard::{give_back, lost, LeaseGuard};
pub(crate) use hold::{HandOff, Hold};
pub(crate) use lessor::Lessor;
#[cfg(feature = "serde")]
pub(crate) use lessor::ValueAt;
pub use poison::PoisonInfo;
pub(crate) use protocol::{AcquireCall, Kind, PlainTake, Protocol, HAND_OFF_CLAIM};
#[cfg(test)]
pub(crate) use quorum::scripts as quorum_scripts;
pub(crate) use quorum::Quorum;
pub(crate) use raw_lock::RawLock;
pub(crate) use replication::LeaseWrite;
pub use state::LeaseWatch;
pub(crate) use state::LostReason;
