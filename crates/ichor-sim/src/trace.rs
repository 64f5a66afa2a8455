//! What happened in the simulated world, in time order: one record per change of the
//! world, and per change of what the operation's status says (a failure, a pause, a
//! refusal, a new reason to wait), each of those with its reason.
//!
//! The records are the trace format's ([`ichor_timeline::trace`]), which the operator's
//! trace writes too and the timeline reads.

pub use ichor_timeline::trace::{TraceEvent, TraceKind};
use ichor_upgrade_core::changes::ChangeKind;

/// The record of a change of an operation's status.
#[must_use]
pub fn trace_kind(kind: ChangeKind) -> TraceKind {
    match kind {
        ChangeKind::Failed => TraceKind::Failed,
        ChangeKind::Paused => TraceKind::Paused,
        ChangeKind::Resumed => TraceKind::Resumed,
        ChangeKind::Refused => TraceKind::Refused,
        ChangeKind::Waiting => TraceKind::Waiting,
    }
}
