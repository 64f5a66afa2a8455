//! What a change of an operation's status says to a trace: each machine newly failed; a
//! pause or a resume; a refusal, or a new reason to wait. The simulator and the operator
//! both record these, so that their traces agree.

use crate::status::RecordState;
use crate::status::{OperationStatus, Phase};

/// What kind of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// A machine newly failed.
    Failed,
    /// The operation paused.
    Paused,
    /// The operation left a pause.
    Resumed,
    /// The operation is refused, for a reason new since its last status.
    Refused,
    /// The operation waits, for a reason new since its last status.
    Waiting,
}

/// One record a change of an operation's status makes: about a machine (by name), or
/// about the operation itself when `machine` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    /// The machine it is about, if one: the newly failed one, or the failed one a pause
    /// or a resume is for.
    pub machine: Option<String>,
    /// `Failed`, `Paused`, `Resumed`, `Refused` or `Waiting`.
    pub event: ChangeKind,
    /// The CamelCase reason.
    pub reason: String,
    /// The message for people.
    pub message: String,
}

/// The records the status change from `before` to `after` makes, the same for the
/// simulator and the operator: each machine newly failed; the pause (on the failed
/// machine's row, else the operation's) or the resume; a refusal, or a new reason to wait.
#[must_use]
pub fn status_changes(before: &OperationStatus, after: &OperationStatus) -> Vec<StatusChange> {
    let failed = |s: &OperationStatus, name: &str| s.machines.get(name).is_some_and(|r| r.state == RecordState::Failed);
    let mut changes: Vec<StatusChange> = after
        .machines
        .iter()
        .filter(|(name, _)| failed(after, name) && !failed(before, name))
        .map(|(name, r)| StatusChange {
            machine: Some(name.clone()),
            event: ChangeKind::Failed,
            reason: r.reason.clone(),
            message: r.message.clone(),
        })
        .collect();
    let why = |machine: Option<String>, event: ChangeKind| StatusChange {
        machine,
        event,
        reason: after.phase.reason().to_owned(),
        message: after.phase.to_string(),
    };
    let paused = |p: &Phase| matches!(p, Phase::Paused(_));
    let failed_machine =
        |s: &OperationStatus| s.machines.iter().find(|(_, r)| r.state == RecordState::Failed).map(|(n, _)| n.clone());
    let subject = || failed_machine(after).or_else(|| failed_machine(before));
    if paused(&after.phase) && !paused(&before.phase) {
        changes.push(why(subject(), ChangeKind::Paused));
    } else if paused(&before.phase) && !paused(&after.phase) {
        changes.push(why(subject(), ChangeKind::Resumed));
    }
    if before.phase.reason() != after.phase.reason() {
        match &after.phase {
            Phase::Refused(_) => changes.push(why(None, ChangeKind::Refused)),
            Phase::Waiting(_) => changes.push(why(None, ChangeKind::Waiting)),
            Phase::Pending | Phase::Progressing | Phase::Paused(_) | Phase::Completed => {}
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{PauseReason, WaitReason};

    #[test]
    fn a_pause_with_no_failed_machine_is_the_operations_and_a_new_wait_is_recorded_once() {
        let waiting = OperationStatus { phase: Phase::Waiting(WaitReason::EtcdSnapshotPending), ..Default::default() };
        let changes = status_changes(&OperationStatus::default(), &waiting);
        assert_eq!(
            changes.iter().map(|c| (c.machine.clone(), c.event)).collect::<Vec<_>>(),
            [(None, ChangeKind::Waiting)]
        );
        assert_eq!(changes[0].reason, "EtcdSnapshotPending");
        assert!(status_changes(&waiting, &waiting).is_empty(), "the same wait again is no record");
        let paused = OperationStatus {
            phase: Phase::Paused(PauseReason::EtcdSnapshotFailed { reason: "stream cut".to_owned() }),
            ..Default::default()
        };
        let changes = status_changes(&waiting, &paused);
        assert_eq!(
            changes.iter().map(|c| (c.machine.clone(), c.event)).collect::<Vec<_>>(),
            [(None, ChangeKind::Paused)]
        );
        assert!(changes[0].message.contains("stream cut"), "{changes:?}");
        let resumed = status_changes(&paused, &OperationStatus::default());
        assert_eq!(resumed.iter().map(|c| c.event).collect::<Vec<_>>(), [ChangeKind::Resumed]);
    }
}
