//! Node removal's step: for one machine being removed, from what was observed, exactly one
//! [`RemovalAction`].
//!
//! The order is fixed: storage evacuation (the same definition as the upgrade's) → cordon
//! → drain through the Eviction API → on a control plane, leave etcd → graceful reset
//! through the Talos API → delete the Node. Every step is re-derived from the world and
//! two conditions, so a restarted controller resumes where it was:
//! - `StorageEvacuation` (shared with the upgrade): the evacuation's marker and clock;
//! - `NodeRemoval`: `Unknown/ResetRequested` written just before the reset call (an
//!   intent, as for the Upgrade call), `True/ResetRequested` once acknowledged,
//!   `True/Removed` at the end. An intent with no sign of the reset after one call bound
//!   is called again: a reset is harmless to repeat, and losing it would leave the node
//!   up forever.
//!
//! A removal-side evacuation timeout stops the removal: scheduling is re-enabled, a Warning
//! event recorded, and the evacuation starts again with a fresh clock. Nothing is drained
//! while an evacuation is under way or timed out.

use std::fmt;

use crate::conditions::{ConditionStatus, Conditions};
use crate::evacuation::{EvacuationState, StorageObservation, evacuation_state};
use crate::machine::vocabulary::MachineRole;
use crate::machine::vocabulary::{EtcdMembership, MachineSpec, MachineStage, PodRef, StepTimeouts, TalosObservation};
use crate::rollout::EtcdVerdict;
use crate::time::Timestamp;

/// The condition type that marks a removal's progress.
pub const NODE_REMOVAL: &str = "NodeRemoval";

/// The condition type recording, before the call, that a removal asked etcd to let the
/// machine's member go (`Unknown`, reason [`reason::ETCD_LEAVE_REQUESTED`] or
/// [`reason::ETCD_MEMBER_REMOVE_REQUESTED`]). Written under the machine's resourceVersion
/// as the pass read it, so a writer whose read is stale (a replica that no longer leads, a
/// pass overtaken by a change) fails there and never makes the call. Read by no step: the
/// member list is what tells whether the member is gone.
pub const ETCD_DEPARTURE: &str = "EtcdDeparture";

/// Condition reasons of [`NODE_REMOVAL`].
pub mod reason {
    /// `Unknown`: the graceful reset was asked for; the node is wiping itself.
    pub const RESET_REQUESTED: &str = "ResetRequested";
    /// [`super::ETCD_DEPARTURE`]: `EtcdLeaveCluster` asked of the node.
    pub const ETCD_LEAVE_REQUESTED: &str = "EtcdLeaveRequested";
    /// [`super::ETCD_DEPARTURE`]: `EtcdRemoveMemberByID` asked of another control plane.
    pub const ETCD_MEMBER_REMOVE_REQUESTED: &str = "EtcdMemberRemoveRequested";
    /// `True`: the Node is deleted; the machine is gone from the cluster.
    pub const REMOVED: &str = "Removed";
}

/// The node being removed, as Kubernetes reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovalNode {
    /// Whether the Node is Ready (kubelet running).
    pub ready: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Pods the drain must evict: DaemonSet-owned, mirror (static) and terminating pods
    /// left out.
    pub evictable: Vec<PodRef>,
    /// Pods evicted or deleted that have not gone yet; the drain waits for them.
    pub terminating: usize,
}

/// Everything [`removal_step`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct RemovalInput<'a> {
    /// The machine.
    pub machine: &'a MachineSpec,
    /// Its Node, if it still exists.
    pub node: Option<&'a RemovalNode>,
    /// The machine's conditions (`StorageEvacuation`, `NodeRemoval`).
    pub conditions: &'a Conditions,
    /// Storage's view of the node.
    pub storage: &'a StorageObservation,
    /// What the Talos API said.
    pub talos: &'a TalosObservation,
    /// On a control plane, its etcd membership, read through the other control planes.
    pub etcd_member: Option<&'a EtcdMembership>,
    /// On a control plane still in the member list, its member ID.
    pub etcd_member_id: Option<u64>,
    /// On a control plane, the etcd gate over the others: a member leaves only while the
    /// cluster is healthy, so that leaving never costs quorum.
    pub etcd_gate: &'a EtcdVerdict,
    /// The bounds (the evacuation's).
    pub timeouts: &'a StepTimeouts,
    /// The current time.
    pub now: Timestamp,
}

/// The one thing to do for a machine being removed.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemovalAction {
    /// The Node is gone: write `NodeRemoval=True/Removed` if not yet written; done.
    Removed,
    /// Nothing to do yet.
    Wait {
        /// Why.
        reason: RemovalWait,
        /// When to look again at the latest, if a deadline is known.
        recheck_at: Option<Timestamp>,
    },
    /// Begin the evacuation (the shared definition).
    BeginEvacuation,
    /// The evacuation timed out: re-enable scheduling, write `StorageEvacuation=False/TimedOut`,
    /// record a Warning event. The next observation begins it again, with a fresh clock.
    RestartEvacuation,
    /// Cordon the Node (`spec.unschedulable=true`).
    Cordon,
    /// Evict these pods through the Eviction API (PodDisruptionBudgets honoured: a 429 is a
    /// wait, never a failure).
    Evict {
        /// The pods.
        pods: Vec<PodRef>,
    },
    /// `EtcdLeaveCluster` on the node.
    LeaveEtcd,
    /// `EtcdRemoveMemberByID` through another control plane: the member of a control plane
    /// whose Node is gone and whose Talos API does not answer, so it cannot leave itself.
    RemoveEtcdMember {
        /// The member's ID.
        member_id: u64,
    },
    /// Write `NodeRemoval=Unknown/ResetRequested` (the intent), then a graceful `Reset`
    /// through the Talos API, then `NodeRemoval=True/ResetRequested` on the acknowledgement.
    Reset,
    /// Delete the Node object.
    DeleteNode,
}

/// Why a removal waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemovalWait {
    /// Replicas are still moving off the node.
    Evacuating {
        /// Replicas left, if known.
        replicas_left: Option<u32>,
    },
    /// The etcd gate fails: leaving now could cost quorum.
    EtcdUnhealthy {
        /// What fails.
        reason: String,
    },
    /// The member list could not be read.
    EtcdMemberUnknown,
    /// The Talos API does not answer, and the reset has not been asked for.
    TalosApiUnreachable,
    /// The reset was asked for; kubelet still runs (deleting the Node now would let it
    /// register again).
    ResetUnderWay,
    /// Evicted pods are still terminating.
    DrainUnderWay {
        /// How many.
        terminating: usize,
    },
    /// The reset was only intended, and the node shows no sign of it (not `Resetting`): the
    /// Node is not deleted on a guess; the reset is asked for again once the node answers
    /// after the call bound.
    ResetUnconfirmed,
}

impl RemovalWait {
    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Evacuating { .. } => "Evacuating",
            Self::EtcdUnhealthy { .. } => "EtcdUnhealthy",
            Self::EtcdMemberUnknown => "EtcdMemberUnknown",
            Self::TalosApiUnreachable => "TalosApiUnreachable",
            Self::ResetUnderWay => "ResetUnderWay",
            Self::DrainUnderWay { .. } => "DrainUnderWay",
            Self::ResetUnconfirmed => "ResetUnconfirmed",
        }
    }
}

impl fmt::Display for RemovalWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Evacuating { replicas_left: Some(n) } => write!(f, "evacuating storage: {n} replicas left"),
            Self::Evacuating { replicas_left: None } => f.write_str("evacuating storage"),
            Self::EtcdUnhealthy { reason } => write!(f, "not leaving etcd while the gate fails: {reason}"),
            Self::EtcdMemberUnknown => f.write_str("the etcd member list could not be read"),
            Self::TalosApiUnreachable => f.write_str("the Talos API does not answer"),
            Self::ResetUnderWay => f.write_str("the reset was asked for; waiting for kubelet to stop"),
            Self::DrainUnderWay { terminating } => write!(f, "draining: {terminating} pods still terminating"),
            Self::ResetUnconfirmed => f.write_str(
                "the reset was asked for but is not confirmed and the node does not show it; waiting to ask again",
            ),
        }
    }
}

/// Whether the machine's conditions show it removed (`NodeRemoval=True/Removed`): an
/// upgrade no longer counts it among the cluster's machines.
#[must_use]
pub fn is_removed(conditions: &Conditions) -> bool {
    conditions.get(NODE_REMOVAL).is_some_and(|c| c.status == ConditionStatus::True && c.reason == reason::REMOVED)
}

/// Whether the machine's reset was asked for (or may have been): like an Upgrade call, a
/// removal past it is never interrupted, only observed to its end.
#[must_use]
pub fn past_reset(conditions: &Conditions) -> bool {
    conditions.get(NODE_REMOVAL).is_some_and(|c| c.status != ConditionStatus::False)
}

/// Decides the one removal action. Pure: the same input gives the same action.
pub fn removal_step(input: &RemovalInput<'_>) -> RemovalAction {
    let removal = input.conditions.get(NODE_REMOVAL).filter(|c| c.status != ConditionStatus::False);
    let Some(node) = input.node else { return node_gone(input) };
    if let Some(removal) = removal {
        let since = removal.last_transition_time.min(input.now);
        let deadline = since.saturating_add(input.timeouts.upgrade_call);
        let acknowledged = removal.status == ConditionStatus::True;
        let stage = match input.talos {
            TalosObservation::Answered { stage } => Some(*stage),
            TalosObservation::Unreachable { .. } | TalosObservation::Error { .. } => None,
        };
        // The Node goes only once the reset is known to have reached the node: its
        // acknowledgement, or the node seen resetting. A NotReady Node alone (a partition
        // does that too) proves nothing.
        if !node.ready && (acknowledged || stage == Some(MachineStage::Resetting)) {
            return RemovalAction::DeleteNode;
        }
        if acknowledged || stage == Some(MachineStage::Resetting) {
            return RemovalAction::Wait { reason: RemovalWait::ResetUnderWay, recheck_at: None };
        }
        if stage == Some(MachineStage::Running) && input.now >= deadline {
            return RemovalAction::Reset;
        }
        let reason = if node.ready { RemovalWait::ResetUnderWay } else { RemovalWait::ResetUnconfirmed };
        return RemovalAction::Wait { reason, recheck_at: Some(deadline) };
    }
    match evacuation_state(input.conditions, input.storage, input.timeouts.evacuation, input.now) {
        EvacuationState::NotStarted => return RemovalAction::BeginEvacuation,
        EvacuationState::InProgress { replicas_left, deadline } => {
            return RemovalAction::Wait {
                reason: RemovalWait::Evacuating { replicas_left },
                recheck_at: Some(deadline),
            };
        }
        EvacuationState::TimedOut { .. } => return RemovalAction::RestartEvacuation,
        EvacuationState::Evacuated | EvacuationState::NothingToEvacuate => {}
    }
    if !node.unschedulable {
        return RemovalAction::Cordon;
    }
    if !node.evictable.is_empty() {
        return RemovalAction::Evict { pods: node.evictable.clone() };
    }
    if node.terminating > 0 {
        return RemovalAction::Wait {
            reason: RemovalWait::DrainUnderWay { terminating: node.terminating },
            recheck_at: None,
        };
    }
    if input.machine.role == MachineRole::ControlPlane {
        match input.etcd_member {
            Some(EtcdMembership::Voter | EtcdMembership::Learner) => return leave_etcd(input),
            Some(EtcdMembership::Absent) => {}
            Some(EtcdMembership::Unknown { .. }) | None => {
                return RemovalAction::Wait { reason: RemovalWait::EtcdMemberUnknown, recheck_at: None };
            }
        }
    }
    match input.talos {
        TalosObservation::Answered { .. } | TalosObservation::Error { .. } => RemovalAction::Reset,
        TalosObservation::Unreachable { .. } => {
            RemovalAction::Wait { reason: RemovalWait::TalosApiUnreachable, recheck_at: None }
        }
    }
}

/// The Node is gone. A worker is removed. A control plane is removed only once its etcd
/// member is absent from the list the other control planes give: a machine still running
/// leaves by itself (while the gate passes); one that does not answer is removed by its ID.
fn node_gone(input: &RemovalInput<'_>) -> RemovalAction {
    if input.machine.role != MachineRole::ControlPlane {
        return RemovalAction::Removed;
    }
    let unknown = RemovalAction::Wait { reason: RemovalWait::EtcdMemberUnknown, recheck_at: None };
    match input.etcd_member {
        Some(EtcdMembership::Absent) => RemovalAction::Removed,
        Some(EtcdMembership::Voter | EtcdMembership::Learner) => match input.talos {
            TalosObservation::Answered { .. } => leave_etcd(input),
            TalosObservation::Unreachable { .. } | TalosObservation::Error { .. } => match input.etcd_member_id {
                Some(member_id) => RemovalAction::RemoveEtcdMember { member_id },
                None => unknown,
            },
        },
        Some(EtcdMembership::Unknown { .. }) | None => unknown,
    }
}

/// `LeaveEtcd` while the gate passes, else a wait naming why.
fn leave_etcd(input: &RemovalInput<'_>) -> RemovalAction {
    match input.etcd_gate {
        EtcdVerdict::Healthy => RemovalAction::LeaveEtcd,
        EtcdVerdict::Unhealthy { reason } => {
            RemovalAction::Wait { reason: RemovalWait::EtcdUnhealthy { reason: reason.clone() }, recheck_at: None }
        }
        EtcdVerdict::NotChecked => RemovalAction::Wait {
            reason: RemovalWait::EtcdUnhealthy { reason: "not checked".to_owned() },
            recheck_at: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::ConditionUpdate;
    use crate::evacuation::{STORAGE_EVACUATION, reason as evac};

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_secs(secs)
    }

    /// A Ready, schedulable worker with two pods, no storage, at t=1000.
    #[derive(Clone)]
    struct Removing {
        machine: MachineSpec,
        node: Option<RemovalNode>,
        conditions: Conditions,
        storage: StorageObservation,
        talos: TalosObservation,
        etcd_member: Option<EtcdMembership>,
        etcd_member_id: Option<u64>,
        etcd_gate: EtcdVerdict,
        timeouts: StepTimeouts,
        now: Timestamp,
    }

    fn pod(name: &str) -> PodRef {
        PodRef { namespace: "billing".into(), name: name.into(), uid: None }
    }

    impl Removing {
        fn fixture() -> Self {
            Self {
                machine: MachineSpec { name: "worker-2".into(), role: MachineRole::Worker },
                node: Some(RemovalNode {
                    ready: true,
                    unschedulable: false,
                    evictable: vec![pod("api-1"), pod("api-2")],
                    terminating: 0,
                }),
                conditions: Conditions::new(),
                storage: StorageObservation::default(),
                talos: TalosObservation::Answered { stage: MachineStage::Running },
                etcd_member: None,
                etcd_member_id: None,
                etcd_gate: EtcdVerdict::Healthy,
                timeouts: StepTimeouts::default(),
                now: at(1000),
            }
        }

        fn control_plane(mut self) -> Self {
            self.machine.role = MachineRole::ControlPlane;
            self.etcd_member = Some(EtcdMembership::Voter);
            self
        }

        fn cordoned_and_drained(mut self) -> Self {
            let node = self.node.as_mut().unwrap();
            node.unschedulable = true;
            node.evictable.clear();
            self
        }

        fn condition(mut self, type_: &str, status: ConditionStatus, reason: &str, since: Timestamp) -> Self {
            self.conditions.upsert(ConditionUpdate::new(type_, status, reason, ""), since);
            self
        }

        fn storage(mut self, replicas_left: u32) -> Self {
            self.storage = StorageObservation {
                selected_by: vec!["longhorn".into()],
                replicas_left: Some(replicas_left),
                recorded: None,
                evacuation_timeout: None,
            };
            self
        }

        fn step(&self) -> RemovalAction {
            removal_step(&RemovalInput {
                machine: &self.machine,
                node: self.node.as_ref(),
                conditions: &self.conditions,
                storage: &self.storage,
                talos: &self.talos,
                etcd_member: self.etcd_member.as_ref(),
                etcd_member_id: self.etcd_member_id,
                etcd_gate: &self.etcd_gate,
                timeouts: &self.timeouts,
                now: self.now,
            })
        }
    }

    #[test]
    fn storage_selecting_the_node_is_evacuated_first() {
        assert_eq!(Removing::fixture().storage(3).step(), RemovalAction::BeginEvacuation);
    }

    #[test]
    fn nothing_is_cordoned_or_drained_while_the_evacuation_runs() {
        let o = Removing::fixture().storage(3).condition(
            STORAGE_EVACUATION,
            ConditionStatus::True,
            evac::EVACUATING,
            at(900),
        );
        assert_eq!(
            o.step(),
            RemovalAction::Wait {
                reason: RemovalWait::Evacuating { replicas_left: Some(3) },
                recheck_at: Some(at(2700))
            }
        );
    }

    #[test]
    fn a_removal_side_timeout_restarts_the_evacuation_and_never_drains() {
        let o = Removing::fixture()
            .storage(1)
            .condition(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, at(900))
            .cordoned_and_drained();
        let mut late = o.clone();
        late.now = at(2700);
        assert_eq!(late.step(), RemovalAction::RestartEvacuation);
        let timed_out = late.condition(STORAGE_EVACUATION, ConditionStatus::False, evac::TIMED_OUT, at(2700));
        assert_eq!(timed_out.step(), RemovalAction::BeginEvacuation, "retried, with a fresh clock from its write");
    }

    #[test]
    fn evacuated_or_nothing_to_evacuate_then_cordon_then_drain() {
        assert_eq!(Removing::fixture().step(), RemovalAction::Cordon);
        let evacuated = Removing::fixture().storage(0).condition(
            STORAGE_EVACUATION,
            ConditionStatus::True,
            evac::EVACUATING,
            at(900),
        );
        assert_eq!(evacuated.step(), RemovalAction::Cordon);
        let mut cordoned = Removing::fixture();
        cordoned.node.as_mut().unwrap().unschedulable = true;
        assert_eq!(cordoned.step(), RemovalAction::Evict { pods: vec![pod("api-1"), pod("api-2")] });
    }

    #[test]
    fn terminating_pods_are_waited_for_not_evicted_again() {
        let mut o = Removing::fixture().cordoned_and_drained();
        o.node.as_mut().unwrap().terminating = 2;
        assert_eq!(
            o.step(),
            RemovalAction::Wait { reason: RemovalWait::DrainUnderWay { terminating: 2 }, recheck_at: None }
        );
    }

    #[test]
    fn a_reset_intent_with_no_sign_of_the_reset_after_one_call_bound_is_called_again() {
        let intent = Removing::fixture().cordoned_and_drained().condition(
            NODE_REMOVAL,
            ConditionStatus::Unknown,
            reason::RESET_REQUESTED,
            at(1000),
        );
        assert_eq!(
            intent.step(),
            RemovalAction::Wait { reason: RemovalWait::ResetUnderWay, recheck_at: Some(at(1600)) }
        );
        let mut late = intent.clone();
        late.now = at(1600);
        assert_eq!(late.step(), RemovalAction::Reset);
        late.talos = TalosObservation::Answered { stage: MachineStage::Resetting };
        assert_eq!(late.step(), RemovalAction::Wait { reason: RemovalWait::ResetUnderWay, recheck_at: None });
        let acknowledged = intent.condition(NODE_REMOVAL, ConditionStatus::True, reason::RESET_REQUESTED, at(1001));
        let mut acknowledged = acknowledged;
        acknowledged.now = at(99_999);
        assert_eq!(acknowledged.step(), RemovalAction::Wait { reason: RemovalWait::ResetUnderWay, recheck_at: None });
    }

    #[test]
    fn a_drained_worker_is_reset_then_its_node_deleted_once_kubelet_stops() {
        let drained = Removing::fixture().cordoned_and_drained();
        assert_eq!(drained.step(), RemovalAction::Reset);
        let reset = drained.condition(NODE_REMOVAL, ConditionStatus::True, reason::RESET_REQUESTED, at(1000));
        assert_eq!(reset.step(), RemovalAction::Wait { reason: RemovalWait::ResetUnderWay, recheck_at: None });
        let mut stopped = reset.clone();
        stopped.node.as_mut().unwrap().ready = false;
        assert_eq!(stopped.step(), RemovalAction::DeleteNode);
        let mut gone = stopped;
        gone.node = None;
        assert_eq!(gone.step(), RemovalAction::Removed);
    }

    #[test]
    fn a_control_plane_leaves_etcd_before_its_reset_only_while_the_gate_passes() {
        let cp = Removing::fixture().control_plane().cordoned_and_drained();
        assert_eq!(cp.step(), RemovalAction::LeaveEtcd);
        let mut unhealthy = cp.clone();
        unhealthy.etcd_gate = EtcdVerdict::Unhealthy { reason: "cp-3 unreachable".into() };
        assert_eq!(
            unhealthy.step(),
            RemovalAction::Wait {
                reason: RemovalWait::EtcdUnhealthy { reason: "cp-3 unreachable".into() },
                recheck_at: None
            }
        );
        let mut left = cp.clone();
        left.etcd_member = Some(EtcdMembership::Absent);
        assert_eq!(left.step(), RemovalAction::Reset);
        let mut unknown = cp;
        unknown.etcd_member = Some(EtcdMembership::Unknown { error: "timeout".into() });
        assert_eq!(unknown.step(), RemovalAction::Wait { reason: RemovalWait::EtcdMemberUnknown, recheck_at: None });
    }

    #[test]
    fn an_unreachable_talos_api_before_the_reset_waits() {
        let mut o = Removing::fixture().cordoned_and_drained();
        o.talos = TalosObservation::Unreachable { error: "refused".into() };
        assert_eq!(o.step(), RemovalAction::Wait { reason: RemovalWait::TalosApiUnreachable, recheck_at: None });
    }

    #[test]
    fn a_node_already_gone_is_removed() {
        let mut o = Removing::fixture();
        o.node = None;
        assert_eq!(o.step(), RemovalAction::Removed);
    }

    #[test]
    fn an_intended_reset_and_a_not_ready_node_do_not_delete_the_node() {
        // A partition makes the Node NotReady and the Talos API unreachable: the review saw
        // the Node deleted on that alone.
        let mut partitioned = Removing::fixture().cordoned_and_drained().condition(
            NODE_REMOVAL,
            ConditionStatus::Unknown,
            reason::RESET_REQUESTED,
            at(1000),
        );
        partitioned.node.as_mut().unwrap().ready = false;
        partitioned.talos = TalosObservation::Unreachable { error: "i/o timeout".into() };
        assert_eq!(
            partitioned.step(),
            RemovalAction::Wait { reason: RemovalWait::ResetUnconfirmed, recheck_at: Some(at(1600)) }
        );
        // Back, still Running, after the call bound: the reset is asked for again.
        let mut back = partitioned.clone();
        back.now = at(1600);
        back.talos = TalosObservation::Answered { stage: MachineStage::Running };
        assert_eq!(back.step(), RemovalAction::Reset);
        // Seen resetting: the reset reached it; the Node goes once kubelet stopped.
        let mut resetting = partitioned;
        resetting.talos = TalosObservation::Answered { stage: MachineStage::Resetting };
        assert_eq!(resetting.step(), RemovalAction::DeleteNode);
    }

    #[test]
    fn a_control_plane_whose_node_is_gone_is_removed_only_once_its_member_is_gone() {
        let mut gone = Removing::fixture().control_plane();
        gone.node = None;
        gone.etcd_member_id = Some(0x3c2b);
        // Still a voter, its Talos API gone: removed by ID through another control plane.
        gone.talos = TalosObservation::Unreachable { error: "refused".into() };
        assert_eq!(gone.step(), RemovalAction::RemoveEtcdMember { member_id: 0x3c2b });
        // Still running Talos: it leaves by itself, while the gate passes.
        let mut alive = gone.clone();
        alive.talos = TalosObservation::Answered { stage: MachineStage::Running };
        assert_eq!(alive.step(), RemovalAction::LeaveEtcd);
        alive.etcd_gate = EtcdVerdict::Unhealthy { reason: "cp-3: status unreadable".into() };
        assert!(matches!(alive.step(), RemovalAction::Wait { reason: RemovalWait::EtcdUnhealthy { .. }, .. }));
        let mut unknown = gone.clone();
        unknown.etcd_member = Some(EtcdMembership::Unknown { error: "timeout".into() });
        assert_eq!(unknown.step(), RemovalAction::Wait { reason: RemovalWait::EtcdMemberUnknown, recheck_at: None });
        let mut absent = gone;
        absent.etcd_member = Some(EtcdMembership::Absent);
        assert_eq!(absent.step(), RemovalAction::Removed);
    }
}
