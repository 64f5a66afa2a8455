//! What happened in the simulated world, in time order: one record per change of the
//! world, and per change of what the operation's status says (a failure, a pause, a
//! refusal, a new reason to wait), each of those with its reason.
//!
//! The records are the crate's [`crate::trace`] ones, shared with the operator's trace.

pub use crate::trace::*;
