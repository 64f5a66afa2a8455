//! Carrying out the upgrade step's actions: those both executors share (the evacuation,
//! the converged record, waits and failures) and the legacy executor's Upgrade call. Every
//! side effect goes through [`crate::effects`] with its authority and precondition.

use ichor_storage::evacuation_ended;
use ichor_storage::{EvacuationEnd, EvacuationRequest};
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate};
use ichor_upgrade_core::evacuation::STORAGE_EVACUATION;
use ichor_upgrade_core::machine::lifecycle::reason as lifecycle_reason;
use ichor_upgrade_core::machine::talos::{Action, MachineFailure, UpgradeTarget, converged_message};
use ichor_upgrade_core::machine::vocabulary::{TALOS_LIFECYCLE, lifecycle_in_flight};
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, UpgradeMarker, reason as upgrade_reason};

use crate::calls::{AdvanceError, Executor, NO_STORAGE_NODE, TalosCallError, failed};
use crate::cause::report;
use crate::effects::{self, Grants, Intent};
use crate::kube_api::{MachineInfo, NodeInfo};
use crate::talos_api::UpgradeRequest;

/// Carries out one action of the upgrade step on `machine`, under `grants`.
pub(crate) async fn carry_out(
    ex: &Executor<'_>,
    grants: &Grants,
    machine: &MachineInfo,
    node_name: Option<&str>,
    node: Option<&NodeInfo>,
    target: &UpgradeTarget,
    action: Action,
) -> Result<MachineOutcome, AdvanceError> {
    // Storage is reached by node name; the step asks for it only with the Node observed,
    // so an unknown name here is a wait, never a guess.
    let name_unknown = || MachineOutcome::Waiting {
        reason: "NodeNameUnknown".to_owned(),
        message: "the node name cannot be read from Talos and none was recorded".to_owned(),
        recheck_at: None,
    };
    match action {
        Action::Converged => Ok(MachineOutcome::Converged),
        Action::RecordConverged => {
            let boot = node.map_or("", |n| n.boot_id.as_str());
            let mut conditions = machine.conditions.clone();
            if conditions.is_true(STORAGE_EVACUATION) {
                // Scheduling back on first; then one write closes both conditions.
                let Some(node_name) = node_name else { return Ok(name_unknown()) };
                effects::restore_scheduling(ex, node_name, &conditions).await?;
                conditions = evacuation_ended(&conditions, node_name, EvacuationEnd::Ended, ex.clock.now());
            }
            let message = converged_message(&target.version, boot);
            if lifecycle_in_flight(&conditions) {
                let closed = ConditionUpdate::new(
                    TALOS_LIFECYCLE,
                    ConditionStatus::False,
                    lifecycle_reason::CONVERGED,
                    message.clone(),
                );
                conditions.upsert(closed, ex.clock.now());
            }
            let update =
                ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::False, upgrade_reason::CONVERGED, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Converged)
        }
        Action::Wait { reason, recheck_at } => {
            Ok(MachineOutcome::Waiting { reason: reason.reason().to_owned(), message: reason.to_string(), recheck_at })
        }
        Action::BeginEvacuation => {
            let Some(node_name) = node_name else { return Ok(name_unknown()) };
            let action = match effects::begin_evacuation(ex, &grants.advancing, machine, node_name).await? {
                EvacuationRequest::Requested { .. } => "BeginEvacuation",
                // Said once, as an Event: the storage selects a node its backend lacks.
                EvacuationRequest::NoSuchNode => NO_STORAGE_NODE,
            };
            Ok(MachineOutcome::Progressed { action })
        }
        Action::EndEvacuation => {
            let Some(node_name) = node_name else { return Ok(name_unknown()) };
            effects::end_evacuation(ex, machine, node_name, EvacuationEnd::Ended).await?;
            Ok(MachineOutcome::Progressed { action: "EndEvacuation" })
        }
        Action::FailEndingEvacuation(failure) => {
            let Some(node_name) = node_name else { return Ok(name_unknown()) };
            effects::end_evacuation(ex, machine, node_name, EvacuationEnd::TimedOut).await?;
            Ok(failed(&failure))
        }
        Action::Fail(failure) => Ok(failed(&failure)),
        Action::CloseVoidIntent => {
            let mut conditions = machine.conditions.clone();
            let marker = conditions.get(TALOS_UPGRADE).map(|c| c.message.clone()).unwrap_or_default();
            let message = format!("void: no sign of the call on the node by its deadline; {marker}");
            let update =
                ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::False, upgrade_reason::INTENT_VOID, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "CloseVoidIntent" })
        }
        Action::Upgrade { image, marker } => call_upgrade(ex, grants, machine, image, &marker).await,
    }
}

/// The intent, the call under what is left of its own bound, then the acknowledgement.
async fn call_upgrade(
    ex: &Executor<'_>,
    grants: &Grants,
    machine: &MachineInfo,
    image: String,
    marker: &UpgradeMarker,
) -> Result<MachineOutcome, AdvanceError> {
    let calling = grants.calling("Upgrade")?;
    // A new intent starts a new clock: its transition time is when this call was decided,
    // not when an earlier, void intent was written.
    let mut conditions = machine.conditions.clone();
    conditions.remove(TALOS_UPGRADE);
    let intent = Intent {
        condition: TALOS_UPGRADE,
        status: ConditionStatus::Unknown,
        reason: upgrade_reason::UPGRADE_INTENT,
        message: marker.to_string(),
    };
    let recorded = effects::record(ex, calling, machine, &mut conditions, intent).await?;
    // The call must end by the recorded deadline, whatever the intent's write took.
    let left = marker.call_deadline.saturating_since(ex.clock.now()).min(ex.config.step.upgrade_call);
    let request = UpgradeRequest { image, timeout: left };
    tracing::info!(machine = %machine.name, image = %request.image, "calling Upgrade");
    let outcome = |status, reason, message| ConditionUpdate::new(TALOS_UPGRADE, status, reason, message);
    match effects::upgrade(ex, calling, &recorded, machine, &request, left).await? {
        Ok(ack) => {
            tracing::info!(machine = %machine.name, actor = %ack.actor_id, "Upgrade acknowledged");
            let update = outcome(ConditionStatus::True, upgrade_reason::UPGRADE_REQUESTED, marker.to_string());
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "UpgradeRequested" })
        }
        Err(TalosCallError::Api(e)) if e.is_unreachable() => {
            // The call may or may not have reached the node: the intent stays, and the
            // step reconciles it against the node (boot ID, stage, the call's deadline).
            Ok(MachineOutcome::Waiting {
                reason: "IntentUnconfirmed".to_owned(),
                message: format!("the Upgrade call broke off ({}); its outcome is read from the node", report(&e)),
                recheck_at: Some(marker.call_deadline),
            })
        }
        Err(TalosCallError::Api(e)) => {
            let failure = MachineFailure::UpgradeRefused(report(&e));
            let update = outcome(ConditionStatus::False, upgrade_reason::UPGRADE_REFUSED, failure.to_string());
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(failed(&failure))
        }
        // The node abandoned the call at the propagated deadline: nothing was started.
        // The intent stays, so that an acknowledgement at the very edge, and its reboot,
        // would still be recognised; the operation pauses.
        Err(TalosCallError::TimedOut(timed_out)) => Ok(failed(&MachineFailure::UpgradeCallTimedOut(timed_out.bound))),
    }
}
