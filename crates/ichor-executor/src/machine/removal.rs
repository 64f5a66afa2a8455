//! `remove_machine`: one pass of node removal over one machine, beside the upgrade's
//! `advance_machine`, with the same evacuation (`ichor_storage::evacuate_machine` and
//! `end_machine_evacuation`).
//!
//! It reads the world (the node name, the Node and its pods, the Talos stage, storage, on a
//! control plane the etcd membership and gate as the other control planes see them),
//! calls the pure [`removal_step`], carries out its one action and writes conditions.

use ichor_storage::EvacuationEnd;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::StorageObservation;
use ichor_upgrade_core::machine::lifecycle::cordon_annotation;
use ichor_upgrade_core::machine::removal::{
    ETCD_DEPARTURE, NODE_REMOVAL, RemovalAction, RemovalInput, RemovalNode, reason as removal_reason, removal_step,
};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::PodRef;
use ichor_upgrade_core::machine::vocabulary::{EtcdMembership, MachineSpec};
use ichor_upgrade_core::rollout::EtcdVerdict;
use ichor_upgrade_core::status::MachineOutcome;

use crate::calls::{
    AdvanceError, Executor, KubeCallError, bounded, kube, node_name, observe, seen_with_storage, talos_observation,
};
use crate::effects::{self, Advancing, Intent};
use crate::etcd::{self, ControlPlane};
use crate::kube_api::{Event, EventType, Eviction, KubeError, MachineInfo, NodeInfo};

/// How soon an eviction a PodDisruptionBudget refused is tried again (`kubectl drain`
/// retries every 5 s).
pub const EVICTION_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
use crate::talos_api::ResetRequest;

/// How the reset's intent records the node name, as the message's last word.
const NODE_KEY: &str = "node=";

/// The node name a reset's intent recorded, if any.
#[must_use]
pub fn recorded_node_name(conditions: &Conditions) -> Option<String> {
    let message = &conditions.get(NODE_REMOVAL)?.message;
    let name = message.rsplit(' ').next()?.strip_prefix(NODE_KEY)?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// One pass of removing `machine`, under `advancing` (the pass's decision advances it).
/// `control_planes` are the cluster's control planes
/// (this machine included if it is one): etcd is read through the others, and a control
/// plane leaves etcd only while the gate over all of them passes.
///
/// # Errors
/// An observation or a write that failed (see [`AdvanceError::is_transient`]).
pub async fn remove_machine(
    ex: &Executor<'_>,
    advancing: &Advancing,
    operation: &str,
    machine: &MachineInfo,
    control_planes: &[ControlPlane],
) -> Result<MachineOutcome, AdvanceError> {
    // After the reset the node is off and cannot say its name: the reset's intent recorded it.
    let node_name = match node_name(ex, machine).await {
        Ok(name) => name,
        Err(e) => recorded_node_name(&machine.conditions).ok_or(e)?,
    };
    let node = kube(ex, "read Node", ex.kube.node(&node_name)).await?;
    let removal_node = match &node {
        Some(n) => {
            let left = crate::machine::lifecycle::drain_observation(ex, &node_name).await?;
            Some(RemovalNode {
                ready: n.ready,
                unschedulable: n.unschedulable,
                evictable: left.evictable,
                terminating: left.terminating,
            })
        }
        None => None,
    };
    let talos_seen = talos_observation(
        bounded("machine stage", ex.config.call_timeout, ex.talos.machine_stage(&machine.address)).await,
    );
    // A Node already deleted needs nothing from storage (the step only says Removed), and
    // the backend may have forgotten the node by then.
    let storage = match &node {
        Some(n) => {
            observe(ex, &node_name, &n.labels, &machine.conditions, ichor_storage::EvacuationFor::Removal).await?
        }
        None => StorageObservation::default(),
    };
    let machine = &*seen_with_storage(ex, machine, &storage, Some(&node_name));
    // A control plane's member is read through the others, whether or not its Node is
    // still there: it is not Removed while the others still list it.
    let (member, etcd_gate) = if machine.role == MachineRole::ControlPlane {
        let others: Vec<&str> =
            control_planes.iter().filter(|cp| cp.address != machine.address).map(|cp| cp.address.as_str()).collect();
        let member = etcd::member(ex, &others, &node_name).await;
        let gate = match member.state {
            EtcdMembership::Voter | EtcdMembership::Learner => etcd::health(ex, control_planes).await,
            EtcdMembership::Absent | EtcdMembership::Unknown { .. } => EtcdVerdict::NotChecked,
        };
        (Some(member), gate)
    } else {
        (None, EtcdVerdict::NotChecked)
    };
    let spec = MachineSpec { name: machine.name.clone(), role: machine.role };
    let action = removal_step(&RemovalInput {
        machine: &spec,
        node: removal_node.as_ref(),
        conditions: &machine.conditions,
        storage: &storage,
        talos: &talos_seen,
        etcd_member: member.as_ref().map(|m| &m.state),
        etcd_member_id: member.as_ref().and_then(|m| m.id),
        etcd_gate: &etcd_gate,
        timeouts: &ex.config.step,
        now: ex.clock.now(),
    });
    tracing::debug!(machine = %machine.name, ?action, "removal step");
    let asked = member.and_then(|m| m.answered_by);
    let read = Read { node: node.as_ref(), operation, advancing };
    carry_out(ex, machine, &node_name, read, asked.as_deref(), action).await
}

async fn note_removal(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut Conditions,
    status: ConditionStatus,
    reason: &str,
    message: String,
) -> Result<(), AdvanceError> {
    effects::note_condition(ex, machine, conditions, ConditionUpdate::new(NODE_REMOVAL, status, reason, message)).await
}

/// What a removal's writes are made under: the Node as this pass read it (its
/// resourceVersion is the precondition of the cordon and the delete) and the operation
/// (the cordon names it), and the pass's authority over the machine.
#[derive(Clone, Copy)]
struct Read<'a> {
    node: Option<&'a NodeInfo>,
    operation: &'a str,
    advancing: &'a Advancing,
}

/// Records, under the machine's resourceVersion as this pass read it, that etcd is asked
/// to let its member go: a stale writer fails here, before the call.
async fn record_etcd_departure<'m>(
    ex: &Executor<'_>,
    advancing: &Advancing,
    machine: &'m MachineInfo,
    reason: &'static str,
    message: String,
) -> Result<effects::Recorded<'m>, AdvanceError> {
    if machine.resource_version.is_none() {
        return Err(AdvanceError::PatchConditions(ichor_storage::ConditionWriteError {
            machine: machine.name.clone(),
            message: "read without a resourceVersion: the etcd departure cannot be recorded under it".to_owned(),
            transient: false,
        }));
    }
    let mut conditions = machine.conditions.clone();
    let intent = Intent { condition: ETCD_DEPARTURE, status: ConditionStatus::Unknown, reason, message };
    effects::record(ex, advancing, machine, &mut conditions, intent).await
}

/// Carries out one removal action; `etcd_peer` is the control plane that listed the etcd
/// members in this pass (it is asked to remove a member by ID).
async fn carry_out(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    node_name: &str,
    read: Read<'_>,
    etcd_peer: Option<&str>,
    action: RemovalAction,
) -> Result<MachineOutcome, AdvanceError> {
    let progressed = |action| Ok(MachineOutcome::Progressed { action });
    match action {
        RemovalAction::Removed => {
            let done = machine.conditions.get(NODE_REMOVAL).is_some_and(|c| c.reason == removal_reason::REMOVED);
            if !done {
                let mut conditions = machine.conditions.clone();
                let message = format!("Node {node_name} deleted");
                note_removal(ex, machine, &mut conditions, ConditionStatus::True, removal_reason::REMOVED, message)
                    .await?;
            }
            Ok(MachineOutcome::Converged)
        }
        RemovalAction::Wait { reason, recheck_at } => {
            Ok(MachineOutcome::Waiting { reason: reason.reason().to_owned(), message: reason.to_string(), recheck_at })
        }
        RemovalAction::BeginEvacuation => {
            effects::begin_evacuation(ex, read.advancing, machine, node_name).await?;
            progressed("BeginEvacuation")
        }
        RemovalAction::RestartEvacuation => restart_evacuation(ex, machine, node_name).await,
        // Under the Node as this pass read it, naming this operation: a cordon a person
        // placed since is a conflict, and one left by this removal, if it is abandoned, is
        // never lifted by another operation.
        RemovalAction::Cordon => {
            let Some(node) = read.node else {
                let source = KubeCallError::from(KubeError::NotFound(format!("Node {node_name}")));
                return Err(AdvanceError::KubeCall { call: "cordon", source });
            };
            let annotation = cordon_annotation(ex.clock.now(), read.operation);
            effects::cordon(ex, read.advancing, node, &annotation).await?;
            progressed("Cordon")
        }
        RemovalAction::Evict { pods } => evict(ex, &read, &pods).await,
        RemovalAction::LeaveEtcd => {
            let reason = removal_reason::ETCD_LEAVE_REQUESTED;
            let message = format!("EtcdLeaveCluster asked of {node_name}");
            let recorded = record_etcd_departure(ex, read.advancing, machine, reason, message).await?;
            effects::etcd_leave(ex, read.advancing, &recorded, machine).await?;
            progressed("LeaveEtcd")
        }
        RemovalAction::RemoveEtcdMember { member_id } => {
            // The step asks for this only with the member read in this pass, so a peer answered.
            let Some(peer) = etcd_peer else {
                return Ok(MachineOutcome::Waiting {
                    reason: "EtcdMemberUnknown".to_owned(),
                    message: "no control plane listed the etcd members in this pass".to_owned(),
                    recheck_at: None,
                });
            };
            let reason = removal_reason::ETCD_MEMBER_REMOVE_REQUESTED;
            let message = format!("EtcdRemoveMemberByID {member_id:x} asked of {peer}");
            let recorded = record_etcd_departure(ex, read.advancing, machine, reason, message).await?;
            effects::etcd_remove_member(ex, read.advancing, &recorded, machine, peer, member_id).await?;
            progressed("RemoveEtcdMember")
        }
        RemovalAction::Reset => reset(ex, &read, machine, node_name).await,
        // Under the Node as read: a Node changed since (another machine that joined under
        // the same name) is a conflict, never deleted.
        RemovalAction::DeleteNode => {
            let Some(node) = read.node else {
                let source = KubeCallError::from(KubeError::NotFound(format!("Node {node_name}")));
                return Err(AdvanceError::KubeCall { call: "delete Node", source });
            };
            effects::delete_node(ex, read.advancing, node).await?;
            progressed("DeleteNode")
        }
    }
}

/// A storage evacuation past its timeout: scheduling turned back on, a Warning Event, and
/// the evacuation started again with a fresh clock.
async fn restart_evacuation(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    node_name: &str,
) -> Result<MachineOutcome, AdvanceError> {
    effects::end_evacuation(ex, machine, node_name, EvacuationEnd::TimedOut).await?;
    let event = Event {
        kind: "TalosMachine",
        name: machine.name.clone(),
        type_: EventType::Warning,
        reason: "EvacuationTimedOut".to_owned(),
        message: format!(
            "storage evacuation of {node_name} timed out; scheduling re-enabled; the removal stops and the evacuation starts again"
        ),
    };
    if let Err(e) = kube(ex, "record Event", ex.kube.event(&event)).await {
        tracing::warn!(error = %e, "could not record an Event");
    }
    Ok(MachineOutcome::Waiting {
        reason: "EvacuationRestarted".to_owned(),
        message: event.message,
        recheck_at: Some(ex.clock.now()),
    })
}

/// The pods evicted, under the authority of the pass: a PodDisruptionBudget that blocks
/// one is a wait, tried again at `kubectl drain`'s pace.
async fn evict(ex: &Executor<'_>, read: &Read<'_>, pods: &[PodRef]) -> Result<MachineOutcome, AdvanceError> {
    let mut blocked = Vec::new();
    for pod in pods {
        match effects::evict(ex, read.advancing, pod).await? {
            Eviction::Evicted => {}
            Eviction::Blocked { message } => blocked.push(format!("{pod}: {message}")),
        }
    }
    if blocked.is_empty() {
        Ok(MachineOutcome::Progressed { action: "Drain" })
    } else {
        // Nothing the engine watches says when the budget allows it again (the
        // budget's pods may be elsewhere): try again at kubectl drain's pace.
        Ok(MachineOutcome::Waiting {
            reason: "EvictionBlocked".to_owned(),
            message: format!("a PodDisruptionBudget blocks evictions: {}", blocked.join("; ")),
            recheck_at: Some(ex.clock.now().saturating_add(EVICTION_RETRY)),
        })
    }
}

/// The graceful reset: its intent recorded first, then the call; an acknowledgement
/// recorded, a refusal a failure, an unreachable machine a wait the step settles from
/// the node.
async fn reset(
    ex: &Executor<'_>,
    read: &Read<'_>,
    machine: &MachineInfo,
    node_name: &str,
) -> Result<MachineOutcome, AdvanceError> {
    let mut conditions = machine.conditions.clone();
    conditions.remove(NODE_REMOVAL);
    let reason = removal_reason::RESET_REQUESTED;
    let message = format!("graceful reset asked for; {NODE_KEY}{node_name}");
    let intent = Intent { condition: NODE_REMOVAL, status: ConditionStatus::Unknown, reason, message };
    let recorded = effects::record(ex, read.advancing, machine, &mut conditions, intent).await?;
    let request = ResetRequest { graceful: true, reboot: false };
    match effects::reset(ex, read.advancing, &recorded, machine, &request).await {
        Ok(()) => {
            let message = format!("graceful reset acknowledged; {NODE_KEY}{node_name}");
            note_removal(ex, machine, &mut conditions, ConditionStatus::True, reason, message).await?;
            Ok(MachineOutcome::Progressed { action: "Reset" })
        }
        // Unreachable: the intent stays, and the step settles it from the node.
        Err(e) if e.is_transient() => Ok(e.outcome(ex.retry_at())),
        Err(e) => {
            let message = format!("the reset was refused: {e}");
            note_removal(ex, machine, &mut conditions, ConditionStatus::False, "ResetRefused", message.clone()).await?;
            Ok(MachineOutcome::Failed { reason: "ResetRefused".to_owned(), message })
        }
    }
}
