//! The operation's persisted status, as the engine keeps it between passes: its
//! [`Phase`] (why it waits, why it paused), what it knows of each machine it started
//! ([`MachineRecord`]), and how a record and a machine's own conditions become the
//! rollout engine's view of the machine ([`MachineProgress`]). The status a pass records
//! from its decision is [`crate::record`]'s.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::etcd::snapshot::SnapshotState;
use crate::kubernetes::manifests::ManifestsState;
use crate::operation::Refusal;
use crate::time::Timestamp;

/// Where a started machine stands, as the operation records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    /// Started, not converged.
    InProgress,
    /// Verified on the target.
    Converged,
    /// Failed; the operation is paused.
    Failed,
}

/// One machine's entry in the operation's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRecord {
    /// Where it stands.
    pub state: RecordState,
    /// The last CamelCase reason (a wait, a failure, an action).
    pub reason: String,
    /// The last message.
    pub message: String,
    /// When it asked to be looked at again, if it is waiting on a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck_at: Option<Timestamp>,
}

/// What advancing one machine one step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineOutcome {
    /// An action was carried out (a write or a call); observe again at once.
    Progressed {
        /// The action's CamelCase name.
        action: &'static str,
    },
    /// Nothing to do until something changes or `recheck_at`.
    Waiting {
        /// CamelCase reason.
        reason: String,
        /// Why, for people.
        message: String,
        /// When to look again at the latest.
        recheck_at: Option<Timestamp>,
    },
    /// On the target and verified.
    Converged,
    /// Failed: the operation pauses.
    Failed {
        /// CamelCase reason.
        reason: String,
        /// Why, for people.
        message: String,
    },
}

impl MachineOutcome {
    /// When the machine asks to be looked at again: at once after an action, a convergence
    /// or a failure (what follows is decided from a new observation), else when its wait
    /// says.
    #[must_use]
    pub fn recheck_at(&self, now: Timestamp) -> Option<Timestamp> {
        match self {
            Self::Progressed { .. } | Self::Converged | Self::Failed { .. } => Some(now),
            Self::Waiting { recheck_at, .. } => *recheck_at,
        }
    }
}

/// One machine's progress in this operation, from the operation's status and the
/// machine's own conditions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MachineProgress {
    /// Not started by this operation.
    Pending,
    /// Started and not yet converged.
    InProgress {
        /// Whether its Upgrade call has been made (or may have been: an intent recorded).
        /// Such a machine is never interrupted: not by a hold, a pause or a deletion.
        past_upgrade_call: bool,
    },
    /// Verified on the target.
    Converged,
    /// The executor failed it; the operation is paused until a resume.
    Failed {
        /// Why, as the executor said.
        reason: String,
    },
}

/// What the engine keeps in the operation's status between passes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// The last decided phase.
    pub phase: Phase,
    /// The generation the phase was decided from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last resume token acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_resume: Option<String>,
    /// What this operation knows of each machine it started and that has not converged
    /// (see [`crate::status`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub machines: BTreeMap<String, MachineRecord>,
    /// How many machines are verified on the target; each one's record of it is in its
    /// own conditions.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub converged: usize,
    /// The etcd snapshot taken before the first control plane, or why it could not be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshot: Option<SnapshotState>,
    /// A Kubernetes upgrade's bootstrap manifests, applied last
    /// ([`crate::kubernetes::manifests`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests: Option<ManifestsState>,
    /// The target the operation started with, as written: recorded once it starts (or
    /// advances) a machine. A started operation's target never changes: a spec whose
    /// target differs is refused ([`Refusal::TargetChanged`]), whatever wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_target: Option<String>,
    /// The morning-after audit ([`crate::audit`]), judged when the operation first said
    /// Completed: what it found (none: the cluster is as it should be). `None`: not
    /// audited (not completed, a removal, or completed before audits were made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Vec<crate::audit::Finding>>,
    /// The health gates' states between passes ([`crate::gate`]), by gate name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gates: BTreeMap<String, crate::gate::GateState>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A failed machine, as the pause names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedMachine {
    /// The machine.
    pub name: String,
    /// The executor's reason.
    pub reason: String,
}

/// Why an operation is waiting. Transient: it goes on by itself when this clears.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitReason {
    /// Another live operation holds the cluster's lock.
    LockHeld {
        /// The holder's identity.
        holder: String,
    },
    /// A control plane is next, but some control-plane nodes are not Ready.
    ControlPlaneNotReady {
        /// The control planes that are not Ready.
        nodes: Vec<String>,
    },
    /// A control plane is next, and another control plane's own components (its static
    /// pods) are not all Ready: changing it could leave two API servers down.
    ControlPlaneComponentsNotReady {
        /// Each as `machine/component`.
        components: Vec<String>,
    },
    /// A control plane is next, and the etcd gate fails.
    EtcdUnhealthy {
        /// What fails.
        reason: String,
    },
    /// A control plane is next; the etcd gate has not been gathered yet.
    EtcdGateNotChecked,
    /// A control plane is next; the etcd snapshot it requires is to be taken first.
    EtcdSnapshotPending,
    /// Workers are next, but `maxUnavailable` workers are already unavailable.
    MaxUnavailable {
        /// The workers counted as unavailable.
        unavailable: Vec<String>,
    },
    /// The machines left to start have Nodes that are not Ready.
    NodesNotReady {
        /// Those machines.
        nodes: Vec<String>,
    },
    /// Everything else has converged; held machines remain.
    Held {
        /// The held machines.
        machines: Vec<String>,
    },
    /// The machines next in line cannot be taken out now (the preflight gate): each with
    /// its blockers, as one line.
    PreflightBlocked {
        /// `(machine, its blockers)`.
        machines: Vec<(String, String)>,
    },
    /// Machines this operation recorded as started (or failed) are not among the machines
    /// observed: a cache not filled yet, or a machine object deleted under way. Nothing is
    /// started and the operation does not complete until they are seen again (or a person
    /// deletes the operation): an unseen machine may be down.
    MachinesUnobserved {
        /// Those machines.
        machines: Vec<String>,
    },
    /// Every machine converged, but these Nodes of the cluster have no machine: the
    /// operation is not Completed while a Node may be on the old version.
    NodesWithoutMachines {
        /// The Nodes.
        nodes: Vec<String>,
    },
    /// The machines next in line may start only inside a maintenance window, and none is
    /// open now ([`crate::window`]).
    OutsideWindow {
        /// When the next window that can take a turn opens; `None`: none within the
        /// calendar the engine looks ahead in.
        next_start: Option<Timestamp>,
    },
    /// A maintenance window is open, but the next machine's calibrated p90 turn would
    /// run past its end: it waits for a window it fits in.
    WouldOverrunWindow {
        /// The machine next in line.
        machine: String,
        /// Its turn's p90, seconds.
        turn_p90_s: u64,
        /// When the open window closes.
        closes: Timestamp,
        /// When the next window that can take the turn opens.
        next_start: Option<Timestamp>,
    },
    /// A health gate ([`crate::gate`]) keeps the next start, or the completion, waiting:
    /// it does not hold, was not read, or holds but has not settled.
    GateNotPassing {
        /// The gate.
        gate: String,
        /// The object it failed on (empty when it only settles, or was not read).
        object: String,
        /// Its value there, or what keeps it.
        value: String,
        /// When it passes if it keeps holding.
        settles_at: Option<Timestamp>,
    },
    /// The operation is being deleted; machines past their Upgrade call are still observed
    /// until they verify, then the lock is released.
    WindingDown {
        /// Machines still being observed.
        machines: Vec<String>,
    },
    /// A Kubernetes upgrade whose cluster's Kubernetes versions were not observed (the
    /// caller could not read them): nothing is planned from a guess.
    KubernetesNotObserved,
    /// The operator may not read or write what the pass needs first (the cluster lock
    /// Lease in the operation's namespace): its RBAC lacks that namespace. Nothing is read
    /// further and nothing is done until a person grants it; the operation is looked at
    /// again on its own.
    Forbidden {
        /// The refused call, the API server's answer and what grants it.
        what: String,
    },
}

/// Why an operation is paused. Sticky until a person resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PauseReason {
    /// The executor failed these machines.
    MachineFailed {
        /// The failed machines and why.
        machines: Vec<FailedMachine>,
    },
    /// The etcd snapshot required before the first control plane could not be taken;
    /// no control plane was touched.
    EtcdSnapshotFailed {
        /// Why, with its causes.
        reason: String,
    },
    /// A Kubernetes upgrade's bootstrap manifests could not be applied; every machine is
    /// on the target.
    ManifestsFailed {
        /// Which object, and why.
        reason: String,
    },
    /// A health gate kept a start, or the completion, waiting past its timeout; nothing new
    /// begins until a person resumes it (the gate is then waited on afresh).
    GateTimedOut {
        /// The gate.
        gate: String,
        /// What it last failed on (`object: value`).
        last: String,
        /// Its timeout, seconds.
        timeout_s: u64,
    },
    /// A person paused it ([`crate::operation::PAUSE_ANNOTATION`]); it goes on once the
    /// annotation is removed.
    Requested {
        /// The annotation's value: who paused it, and why.
        by: String,
    },
}

/// The phase of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Phase {
    /// Accepted; taking the cluster lock. No machine has been started in this pass.
    #[default]
    Pending,
    /// Machines are being upgraded.
    Progressing,
    /// Nothing can move right now, for a transient reason.
    Waiting(WaitReason),
    /// Stopped after a failure; a person must resume.
    Paused(PauseReason),
    /// Every machine is on the target.
    Completed,
    /// The spec is invalid; nothing was or will be touched until it changes.
    Refused(Refusal),
}

impl Phase {
    /// The phase's name: `Pending`, `Progressing`, `Waiting`, `Paused`, `Completed`, `Refused`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Progressing => "Progressing",
            Self::Waiting(_) => "Waiting",
            Self::Paused(_) => "Paused",
            Self::Completed => "Completed",
            Self::Refused(_) => "Refused",
        }
    }

    /// Whether the operation is stuck until a person acts (kstatus `Stalled`): paused,
    /// refused, or waiting for a permission the operator lacks.
    #[must_use]
    pub fn needs_person(&self) -> bool {
        matches!(self, Self::Paused(_) | Self::Refused(_) | Self::Waiting(WaitReason::Forbidden { .. }))
    }

    /// What the phase says to people about the operation `operation`, in its status and
    /// its Event alike: [`Display`](fmt::Display), and for a pause how to resume it
    /// ([`crate::operation::resume_hint`]; a person's pause:
    /// [`crate::operation::unpause_hint`]).
    #[must_use]
    pub fn message_for(&self, operation: &str) -> String {
        match self {
            Self::Paused(PauseReason::Requested { .. }) => {
                format!("{self}; {}", crate::operation::unpause_hint(operation))
            }
            Self::Paused(_) => format!("{self}; {}", crate::operation::resume_hint(operation)),
            _ => self.to_string(),
        }
    }

    /// The CamelCase reason users see on conditions and events; one source for all of them.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Pending => "AcquiringLock",
            Self::Progressing => "Progressing",
            Self::Waiting(wait) => match wait {
                WaitReason::LockHeld { .. } => "LockHeld",
                WaitReason::ControlPlaneNotReady { .. } => "ControlPlaneNotReady",
                WaitReason::ControlPlaneComponentsNotReady { .. } => "ControlPlaneComponentNotReady",
                WaitReason::EtcdUnhealthy { .. } => "EtcdUnhealthy",
                WaitReason::EtcdGateNotChecked => "EtcdGateNotChecked",
                WaitReason::EtcdSnapshotPending => "EtcdSnapshotPending",
                WaitReason::MaxUnavailable { .. } => "MaxUnavailable",
                WaitReason::NodesNotReady { .. } => "NodesNotReady",
                WaitReason::Held { .. } => "Held",
                WaitReason::PreflightBlocked { .. } => "PreflightBlocked",
                WaitReason::MachinesUnobserved { .. } => "MachinesUnobserved",
                WaitReason::NodesWithoutMachines { .. } => "NodesWithoutMachines",
                WaitReason::WindingDown { .. } => "WindingDown",
                WaitReason::OutsideWindow { .. } => "OutsideWindow",
                WaitReason::WouldOverrunWindow { .. } => "WouldOverrunWindow",
                WaitReason::Forbidden { .. } => "Forbidden",
                WaitReason::GateNotPassing { .. } => "GateNotPassing",
                WaitReason::KubernetesNotObserved => "KubernetesNotObserved",
            },
            Self::Paused(PauseReason::MachineFailed { .. }) => "MachineFailed",
            Self::Paused(PauseReason::EtcdSnapshotFailed { .. }) => "EtcdSnapshotFailed",
            Self::Paused(PauseReason::ManifestsFailed { .. }) => "ManifestsFailed",
            Self::Paused(PauseReason::Requested { .. }) => "PauseRequested",
            Self::Paused(PauseReason::GateTimedOut { .. }) => "GateTimedOut",
            Self::Completed => "Completed",
            Self::Refused(refusal) => refusal.reason(),
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pending => f.write_str("taking the cluster lock"),
            Self::Progressing => f.write_str("upgrading machines"),
            Self::Waiting(wait) => match wait {
                WaitReason::LockHeld { holder } => write!(f, "waiting: the cluster lock is held by {holder}"),
                WaitReason::ControlPlaneNotReady { nodes } => {
                    write!(f, "waiting: control-plane nodes not Ready: {}", nodes.join(", "))
                }
                WaitReason::ControlPlaneComponentsNotReady { components } => write!(
                    f,
                    "waiting: no control plane changes while another's components are not Ready: {}",
                    components.join(", ")
                ),
                WaitReason::EtcdUnhealthy { reason } => write!(f, "waiting: etcd gate fails: {reason}"),
                WaitReason::EtcdGateNotChecked => f.write_str("waiting: etcd gate not checked yet"),
                WaitReason::EtcdSnapshotPending => {
                    f.write_str("waiting: an etcd snapshot is taken before the first control plane")
                }
                WaitReason::MaxUnavailable { unavailable } => {
                    write!(f, "waiting: maxUnavailable reached; unavailable: {}", unavailable.join(", "))
                }
                WaitReason::NodesNotReady { nodes } => write!(f, "waiting: nodes not Ready: {}", nodes.join(", ")),
                WaitReason::Held { machines } => write!(
                    f,
                    "waiting: held machines remain: {}; the operation keeps the cluster lock until they are released or it is deleted",
                    machines.join(", ")
                ),
                WaitReason::PreflightBlocked { machines } => {
                    f.write_str("waiting: preflight blocks ")?;
                    for (i, (machine, blockers)) in machines.iter().enumerate() {
                        if i > 0 {
                            f.write_str("; ")?;
                        }
                        write!(f, "{machine}: {blockers}")?;
                    }
                    Ok(())
                }
                WaitReason::MachinesUnobserved { machines } => {
                    write!(f, "waiting: machines recorded as started are not observed: {}", machines.join(", "))
                }
                WaitReason::NodesWithoutMachines { nodes } => write!(
                    f,
                    "waiting: every machine converged, but these Nodes have no TalosMachine: {} (create one for \
                     each, or set spec.discovery: Nodes on the TalosCluster)",
                    nodes.join(", ")
                ),
                WaitReason::WindingDown { machines } => {
                    write!(f, "deleting: observing machines past their Upgrade call: {}", machines.join(", "))
                }
                WaitReason::Forbidden { what } => write!(f, "waiting: forbidden: {what}"),
                WaitReason::GateNotPassing { gate, object, value, settles_at } => match settles_at {
                    Some(at) => {
                        write!(f, "waiting: gate {gate} holds; it passes at {} if it keeps holding", at.rfc3339())
                    }
                    None if object.is_empty() => write!(f, "waiting: gate {gate} does not pass: {value}"),
                    None => write!(f, "waiting: gate {gate} does not hold on {object}: {value}"),
                },
                WaitReason::OutsideWindow { next_start } => {
                    f.write_str("waiting: outside every maintenance window; ")?;
                    next_window(f, *next_start)
                }
                WaitReason::WouldOverrunWindow { machine, turn_p90_s, closes, next_start } => {
                    write!(
                        f,
                        "waiting: {machine}'s turn (p90 {turn_p90_s} s) would run past the maintenance window's end at {}; ",
                        closes.rfc3339()
                    )?;
                    next_window(f, *next_start)
                }
                WaitReason::KubernetesNotObserved => {
                    f.write_str("waiting: the cluster's Kubernetes versions are not observed yet")
                }
            },
            Self::Paused(PauseReason::MachineFailed { machines }) => {
                f.write_str("paused: ")?;
                for (i, m) in machines.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{} failed: {}", m.name, m.reason)?;
                }
                Ok(())
            }
            Self::Paused(PauseReason::EtcdSnapshotFailed { reason }) => {
                write!(f, "paused: the etcd snapshot before the first control plane failed: {reason}")
            }
            Self::Paused(PauseReason::ManifestsFailed { reason }) => {
                write!(
                    f,
                    "paused: every machine is on the target, but the bootstrap manifests were not applied: {reason}"
                )
            }
            Self::Paused(PauseReason::GateTimedOut { gate, last, timeout_s }) => {
                write!(f, "paused: gate {gate} did not pass within its timeout of {timeout_s} s (last: {last})")
            }
            Self::Paused(PauseReason::Requested { by }) if by.is_empty() => {
                f.write_str("paused on request: nothing new begins, what is past its call finishes")
            }
            Self::Paused(PauseReason::Requested { by }) => {
                write!(f, "paused on request ({by}): nothing new begins, what is past its call finishes")
            }
            Self::Completed => f.write_str("every machine is on the target"),
            Self::Refused(refusal) => write!(f, "refused: {refusal}"),
        }
    }
}

impl OperationStatus {
    /// The engine's view of a machine: its record, or, with none, whether its conditions
    /// show an Upgrade call in flight (left by an earlier operation or controller); such a
    /// machine is observed to the end, never treated as not started. `converged` is whether
    /// the machine's own conditions record it verified on the target: that is its record
    /// of convergence, unless a failure is recorded. `evacuating` is whether its
    /// conditions (or its storage backend's record) show an evacuation open: a machine
    /// whose evacuation began is in progress, whatever the status says (a pass killed
    /// between the backend's write and its status write left it so; counted as pending, it
    /// stayed evacuated beside another machine, and the preflight held it, issue 29 item 4).
    #[must_use]
    pub fn progress_of(
        &self,
        machine: &str,
        past_upgrade_call: bool,
        evacuating: bool,
        converged: bool,
    ) -> MachineProgress {
        match self.machines.get(machine).map(|r| (r.state, r)) {
            Some((RecordState::Failed, record)) => MachineProgress::Failed { reason: record.message.clone() },
            Some((RecordState::Converged, _)) => MachineProgress::Converged,
            _ if converged && !past_upgrade_call => MachineProgress::Converged,
            Some((RecordState::InProgress, _)) => MachineProgress::InProgress { past_upgrade_call },
            None if past_upgrade_call || evacuating => MachineProgress::InProgress { past_upgrade_call },
            None => MachineProgress::Pending,
        }
    }

    /// A Kubernetes upgrade's view of a machine in its current stage, from the machine's own
    /// conditions: `converged` (the stage's record,
    /// [`crate::machine::kubernetes::stage_converged`]) is its only record of convergence, and
    /// `past_apply` ([`crate::machine::kubernetes::past_apply`]: an apply of this stage
    /// intended or made, not yet verified) its only record of being under way. A record of
    /// the status says neither: it may be the other stage's (a control plane's record left
    /// in progress by its first stage once carried it into its kubelet's with no start, past
    /// the rule that starts one control plane at a time, all of them Ready). Only a failure
    /// is read from the status. A machine started and not yet applied is pending again: it
    /// has changed nothing, and the rules start it again (the same one, in the same order).
    #[must_use]
    pub fn kubernetes_progress_of(&self, machine: &str, past_apply: bool, converged: bool) -> MachineProgress {
        match self.machines.get(machine).map(|r| (r.state, r)) {
            Some((RecordState::Failed, record)) => MachineProgress::Failed { reason: record.message.clone() },
            _ if converged => MachineProgress::Converged,
            _ if past_apply => MachineProgress::InProgress { past_upgrade_call: true },
            _ => MachineProgress::Pending,
        }
    }

    /// Drops the records of converged machines, counting them in `converged` instead: a
    /// machine's convergence is recorded in its own conditions, and the status stays small
    /// whatever the cluster's size. `converged` is how many machines are converged now;
    /// `is_converged` says whether a machine is (whatever its record said: a record left in
    /// progress by a pass whose status write was lost is dropped too). A failure's record
    /// is kept.
    pub fn forget_converged(&mut self, converged: usize, is_converged: impl Fn(&str) -> bool) {
        self.machines.retain(|name, r| {
            r.state == RecordState::Failed || (r.state != RecordState::Converged && !is_converged(name))
        });
        self.converged = converged;
    }

    /// Whether this status, compared with the one `written`, carries nothing that must be
    /// written at once: the same phase, generation and resume token, no machine newly
    /// recorded and none whose state changed; only records dropped (machines converged,
    /// which their own conditions record), the count of converged machines, and the last
    /// reason, message or recheck time of machines in progress. Losing such a change in a
    /// crash loses nothing: the next pass derives it again from the machines' conditions.
    /// A new record must be written at once: it is what bounds how many machines are
    /// started.
    #[must_use]
    pub fn only_bookkeeping_since(&self, written: &Self) -> bool {
        self.phase == written.phase
            && self.observed_generation == written.observed_generation
            && self.observed_resume == written.observed_resume
            && self.etcd_snapshot == written.etcd_snapshot
            && self.manifests == written.manifests
            && self.started_target == written.started_target
            && self.machines.iter().all(|(name, r)| written.machines.get(name).is_some_and(|w| w.state == r.state))
    }

    /// The status to read for `generation`: when the spec changed since the status was
    /// written, converged records no longer prove anything and are dropped (the executor
    /// re-verifies each machine, at no cost for one already on the target).
    #[must_use]
    pub fn for_generation(mut self, generation: i64) -> Self {
        if self.observed_generation.is_some_and(|g| g != generation) {
            self.machines.retain(|_, r| r.state != RecordState::Converged);
        }
        self
    }
}

/// The end of a window wait's message: when the next window that can take the turn opens.
fn next_window(f: &mut fmt::Formatter<'_>, next_start: Option<Timestamp>) -> fmt::Result {
    match next_start {
        Some(at) => write!(f, "the next window opens at {}", at.rfc3339()),
        None => f.write_str("no window ahead is long enough for it (look at spec.maintenance)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: RecordState) -> MachineRecord {
        MachineRecord { state, reason: "R".into(), message: "m".into(), recheck_at: None }
    }

    #[test]
    fn a_kubernetes_upgrade_reads_convergence_from_the_stage_record_never_from_the_status() {
        let record = |state| MachineRecord { state, reason: "r".into(), message: "m".into(), recheck_at: None };
        let mut status = OperationStatus::default();
        // A record left Converged by the first stage is not the kubelet's convergence.
        status.machines.insert("cp-1".into(), record(RecordState::Converged));
        assert_eq!(status.kubernetes_progress_of("cp-1", false, false), MachineProgress::Pending);
        assert_eq!(status.kubernetes_progress_of("cp-1", false, true), MachineProgress::Converged);
        assert_eq!(
            status.kubernetes_progress_of("cp-1", true, false),
            MachineProgress::InProgress { past_upgrade_call: true },
            "an intent recorded is in progress whatever the status says"
        );
        status.machines.insert("cp-1".into(), record(RecordState::Failed));
        assert!(matches!(status.kubernetes_progress_of("cp-1", false, true), MachineProgress::Failed { .. }));
        // Found by the property: a record left in progress by the first stage is no start
        // of the second.
        status.machines.insert("cp-1".into(), record(RecordState::InProgress));
        assert_eq!(status.kubernetes_progress_of("cp-1", false, false), MachineProgress::Pending);
    }

    #[test]
    fn progress_comes_from_the_record_or_the_machines_conditions() {
        let mut status = OperationStatus::default();
        status.machines.insert("a".into(), record(RecordState::Converged));
        status.machines.insert("b".into(), record(RecordState::Failed));
        status.machines.insert("c".into(), record(RecordState::InProgress));
        assert_eq!(status.progress_of("a", false, false, false), MachineProgress::Converged);
        assert_eq!(status.progress_of("b", true, false, false), MachineProgress::Failed { reason: "m".into() });
        assert_eq!(status.progress_of("b", false, false, true), MachineProgress::Failed { reason: "m".into() });
        assert_eq!(
            status.progress_of("c", true, false, false),
            MachineProgress::InProgress { past_upgrade_call: true }
        );
        assert_eq!(status.progress_of("c", false, false, true), MachineProgress::Converged, "its conditions say so");
        assert_eq!(status.progress_of("d", false, false, false), MachineProgress::Pending);
        assert_eq!(status.progress_of("d", false, false, true), MachineProgress::Converged, "no record needed");
        assert_eq!(
            status.progress_of("d", true, false, false),
            MachineProgress::InProgress { past_upgrade_call: true },
            "a call in flight from an earlier controller is observed, not ignored"
        );
        assert_eq!(
            status.progress_of("d", false, true, false),
            MachineProgress::InProgress { past_upgrade_call: false },
            "an evacuation begun is in progress with no record"
        );
        assert_eq!(status.progress_of("a", false, true, false), MachineProgress::Converged, "a record wins");
    }

    #[test]
    fn only_convergences_and_the_reasons_of_machines_in_progress_may_wait_to_be_written() {
        let mut written = OperationStatus { phase: Phase::Progressing, ..OperationStatus::default() };
        written.machines.insert("a".into(), record(RecordState::InProgress));
        written.machines.insert("b".into(), record(RecordState::InProgress));
        let mut next = written.clone();
        assert!(next.only_bookkeeping_since(&written), "nothing changed");
        next.machines.remove("a");
        next.converged = 1;
        next.machines.get_mut("b").unwrap().reason = "WaitingForReboot".into();
        assert!(next.only_bookkeeping_since(&written), "a convergence and a new reason");
        let mut started = next.clone();
        started.machines.insert("c".into(), record(RecordState::InProgress));
        assert!(!started.only_bookkeeping_since(&written), "a machine started bounds the others");
        let mut failed = next.clone();
        failed.machines.get_mut("b").unwrap().state = RecordState::Failed;
        assert!(!failed.only_bookkeeping_since(&written), "a failure");
        let paused = OperationStatus { phase: Phase::Completed, ..next.clone() };
        assert!(!paused.only_bookkeeping_since(&written), "a new phase");
        let resumed = OperationStatus { observed_resume: Some("t".into()), ..next.clone() };
        assert!(!resumed.only_bookkeeping_since(&written), "a resume acknowledged");
        let regenerated = OperationStatus { observed_generation: Some(2), ..next };
        assert!(!regenerated.only_bookkeeping_since(&written), "a new generation");
    }

    #[test]
    fn a_new_generation_drops_converged_records_only() {
        let mut status = OperationStatus { observed_generation: Some(1), ..OperationStatus::default() };
        status.machines.insert("a".into(), record(RecordState::Converged));
        status.machines.insert("b".into(), record(RecordState::InProgress));
        let same = status.clone().for_generation(1);
        assert_eq!(same.machines.len(), 2);
        let next = status.for_generation(2);
        assert_eq!(next.machines.keys().collect::<Vec<_>>(), vec!["b"]);
    }

    #[test]
    fn converged_machines_are_counted_not_listed() {
        let mut status = OperationStatus::default();
        status.machines.insert("a".into(), record(RecordState::Converged));
        status.machines.insert("b".into(), record(RecordState::InProgress));
        status.machines.insert("c".into(), record(RecordState::InProgress));
        status.forget_converged(3, |name| ["a", "c", "d"].contains(&name));
        assert_eq!(status.machines.keys().collect::<Vec<_>>(), vec!["b"], "c's record was left behind");
        assert_eq!(status.converged, 3);
    }
}
