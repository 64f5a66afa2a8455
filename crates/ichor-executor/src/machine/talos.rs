//! `advance_machine`: one pass of the Talos executor over one machine.
//!
//! It reads the world (the node name, the Node, the Talos stage, storage, on a control
//! plane past its call the etcd member list), calls the pure
//! [`ichor_upgrade_core::machine::talos::step`], carries out its one action
//! ([`crate::machine::actions`], or the lifecycle executor's [`crate::machine::lifecycle`]), writes the
//! machine's conditions, and says what came of it. It keeps nothing between passes.

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate};
use ichor_upgrade_core::evacuation::StorageObservation;
use ichor_upgrade_core::machine::lifecycle::{ExecutorKind, executor_for, reason as lifecycle_reason};
use ichor_upgrade_core::machine::talos::{
    StepInput, UpgradeTarget, needs_talos, past_upgrade_call, recorded_node_name, step,
};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::{EtcdMembership, MachineSpec, TalosObservation};
use ichor_upgrade_core::machine::vocabulary::{TALOS_LIFECYCLE, lifecycle_in_flight};
use ichor_upgrade_core::operation::OperationKind;
use ichor_upgrade_core::rollout::CallAuthority;
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, reason as upgrade_reason};
use ichor_upgrade_core::versions::TalosVersion;

pub use crate::calls::{
    AdvanceError, CallTimedOut, Executor, KubeCallError, NO_STORAGE_NODE, OperationRef, SCHEMATIC_ANNOTATION,
    TalosCallError, drains,
};
use crate::calls::{bounded, node_name, node_observation, observe, seen_with_storage, talos_observation};
use crate::cause::report;
use crate::effects::{self, Advancing, Grants};
use crate::kube_api::MachineInfo;

/// How a machine's progress reads from its own conditions: whether an Upgrade call was
/// made or may have been.
#[must_use]
pub fn machine_past_upgrade_call(machine: &MachineInfo) -> bool {
    past_upgrade_call(&machine.conditions)
}

/// One pass over one machine: observe, step, carry out the one action, under `advancing`
/// (the pass's decision advances the machine, [`Advancing::of`]). `authority` is
/// whether its Upgrade call may go out in this pass, as the rollout engine computed it in
/// this same pass ([`Decision::authority`](ichor_upgrade_core::rollout::Decision::authority)):
/// without [`CallAuthority::Granted`] no Upgrade call is made, first or repeated.
///
/// # Errors
/// [`AdvanceError::UnsupportedKind`] for any kind but `talos`, before anything is read;
/// otherwise an observation or a write that failed (see [`AdvanceError::is_transient`]).
pub async fn advance_machine(
    ex: &Executor<'_>,
    advancing: &Advancing,
    operation: OperationRef<'_>,
    machine: &MachineInfo,
    target: &UpgradeTarget,
    authority: &CallAuthority,
) -> Result<MachineOutcome, AdvanceError> {
    advance_machine_with(ex, advancing, operation, machine, target, authority, authority).await
}

/// [`advance_machine`] with the authority to finish a machine already past its call as
/// well ([`Decision::finish_authority`](ichor_upgrade_core::rollout::Decision::finish_authority)):
/// the lifecycle executor's reboot of an installed machine takes it. The executor is the one
/// the machine is under way on, else the one [`ExecutorConfig::executor`](crate::config::ExecutorConfig::executor) chooses for the
/// version its Node shows.
///
/// # Errors
/// As [`advance_machine`].
pub async fn advance_machine_with(
    ex: &Executor<'_>,
    advancing: &Advancing,
    operation: OperationRef<'_>,
    machine: &MachineInfo,
    target: &UpgradeTarget,
    authority: &CallAuthority,
    finish: &CallAuthority,
) -> Result<MachineOutcome, AdvanceError> {
    if operation.kind != OperationKind::TALOS {
        return Err(AdvanceError::UnsupportedKind(operation.kind.to_owned()));
    }
    let grants = Grants::of(advancing.clone(), authority, finish);
    let bound = ex.config.call_timeout;
    let node_name = match node_name(ex, machine).await {
        Ok(name) => Some(name),
        // Past the Upgrade call the machine may be rebooting, and Talos cannot be asked for
        // its name: the name recorded before the call is used meanwhile. Without one, the
        // Node is not read this pass; the step then waits, under its verify bound.
        Err(error) if past_upgrade_call(&machine.conditions) => {
            tracing::debug!(machine = %machine.name, error = %report(&error), "node name unreadable past the call");
            recorded_node_name(&machine.conditions)
        }
        Err(error) => return Err(error),
    };
    let node = match &node_name {
        Some(name) => bounded("read Node", bound, ex.kube.node(name))
            .await
            .map_err(KubeCallError::from)
            .and_then(|r| r.map_err(KubeCallError::from))
            .map_err(|source| AdvanceError::ReadNode { node: name.clone(), source })?,
        None => None,
    };
    let running = node.as_ref().and_then(|n| TalosVersion::from_os_image(&n.os_image).ok());
    if executor_for(ex.config.executor, &machine.conditions, running.as_ref()) == ExecutorKind::Lifecycle {
        let observed = crate::machine::lifecycle::Seen {
            node_name: node_name.as_deref(),
            node: node.as_ref(),
            operation: operation.identity,
        };
        return crate::machine::lifecycle::advance(ex, &grants, machine, observed, target, authority, finish).await;
    }
    // An acknowledged call whose node has not shown its new boot: the step waits on the
    // Node whatever Talos, etcd or storage say, so they are not asked (a node in its reboot
    // would hold the pass until its dial timeout).
    let asks = needs_talos(&machine.conditions, node.as_ref().map(|n| n.boot_id.as_str()));
    let talos = if asks {
        talos_observation(bounded("machine stage", bound, ex.talos.machine_stage(&machine.address)).await)
    } else {
        TalosObservation::Unreachable { error: "not asked: the Node still shows the boot before the call".to_owned() }
    };
    let labels = node.as_ref().map(|n| n.labels.clone()).unwrap_or_default();
    let storage = match &node_name {
        Some(name) if asks => {
            observe(ex, name, &labels, &machine.conditions, ichor_storage::EvacuationFor::Upgrade).await?
        }
        Some(_) | None => StorageObservation::default(),
    };
    let machine = &*seen_with_storage(ex, machine, &storage, node_name.as_deref());
    let etcd_member = match (machine.role, &node_name) {
        (MachineRole::ControlPlane, Some(_)) if !asks => None,
        (MachineRole::ControlPlane, Some(name)) => {
            Some(crate::etcd::membership(ex, &[machine.address.as_str()], name).await)
        }
        (MachineRole::ControlPlane, None) => Some(EtcdMembership::Unknown { error: "the node name is unknown".into() }),
        (MachineRole::Worker, _) => None,
    };
    let observation = node.as_ref().map(node_observation);
    let spec = MachineSpec { name: machine.name.clone(), role: machine.role };
    let action = step(&StepInput {
        machine: &spec,
        target,
        node: observation.as_ref(),
        talos: &talos,
        conditions: &machine.conditions,
        storage: &storage,
        etcd_member: etcd_member.as_ref(),
        authority,
        timeouts: &ex.config.step,
        now: ex.clock.now(),
    });
    tracing::debug!(machine = %machine.name, ?action, "step");
    crate::machine::actions::carry_out(ex, &grants, machine, node_name.as_deref(), node.as_ref(), target, action).await
}

/// Closes what a failed attempt left on a machine so that a resume retries it afresh:
/// `TalosUpgrade=False/Retry` whenever an upgrade is recorded in flight. The person's resume
/// is the decision; the retry then starts from the node as it is (a node still installing
/// or rebooting is waited for by the pre-call checks, never called again).
///
/// # Errors
/// The condition write that failed.
pub async fn reset_for_retry(ex: &Executor<'_>, machine: &MachineInfo) -> Result<(), AdvanceError> {
    let install_failed = machine
        .conditions
        .get(TALOS_LIFECYCLE)
        .is_some_and(|c| c.status == ConditionStatus::False && c.reason == lifecycle_reason::INSTALL_FAILED);
    if !past_upgrade_call(&machine.conditions) && !install_failed {
        return Ok(());
    }
    let mut conditions = machine.conditions.clone();
    let message = "a person resumed the operation; the failed attempt is closed".to_owned();
    if lifecycle_in_flight(&conditions) || install_failed {
        let update =
            ConditionUpdate::new(TALOS_LIFECYCLE, ConditionStatus::False, lifecycle_reason::RETRY, message.clone());
        conditions.upsert(update, ex.clock.now());
    }
    if conditions.get(TALOS_UPGRADE).is_some_and(|c| c.status != ConditionStatus::False) {
        let update = ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::False, upgrade_reason::RETRY, message);
        conditions.upsert(update, ex.clock.now());
    }
    effects::note(ex, machine, &conditions).await
}

/// The time a machine's outcome asks the operation to be looked at again, if any. A
/// machine that progressed, converged or failed changes what the rollout engine decides
/// (the next machine may start, or the operation pauses): at once.
#[must_use]
pub fn outcome_recheck(outcome: &MachineOutcome, now: Timestamp) -> Option<Timestamp> {
    match outcome {
        MachineOutcome::Progressed { .. } | MachineOutcome::Converged | MachineOutcome::Failed { .. } => Some(now),
        MachineOutcome::Waiting { recheck_at, .. } => *recheck_at,
    }
}
