//! Stage "record": what the pass decided to record ([`ichor_upgrade_core::record`])
//! carried out: the status written or held back, the Events, the pre-pulls, the
//! finalizer.

use std::collections::BTreeMap;

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::talos::{UpgradeTarget, installer_image_for};
use ichor_upgrade_core::record::{self, PassRecord, StatusWrite, Work};
use ichor_upgrade_core::rollout::Decision;
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::status::{OperationStatus, Phase, RecordState, WaitReason};

use super::act::Acted;
use super::decide::Decided;
use super::gates::blocked_lines;
use super::memory::PassMemory;
use super::observe::Observed;
use super::outcome::{ReconcileError, ReconcileOutcome, kube_call};
use super::view::Pass;
use super::write::write_status;
use crate::alert_gates::InTurn;
use crate::background::{Background, Job};
use crate::calls::Executor;
use crate::kube_api::{Event, EventType};

/// Stage "record": what the pass decided to record ([`record::record`]: the next status,
/// written now or held back while only bookkeeping changed, and when to look again)
/// carried out, with its Events, the pre-pulls offered, and the finalizer removed when the
/// decision says so.
pub(super) async fn record_pass(
    pass: &Pass<'_>,
    memory: &PassMemory,
    decided: &Decided,
    acted: Acted<'_>,
) -> Result<ReconcileOutcome, ReconcileError> {
    let Pass { ex, name, op, status, removal, views, target, now, .. } = *pass;
    let Acted { outcomes, by_name, kept_recheck } = acted;
    let decision = &decided.decision;
    let work = work(pass);
    let converged = |name: &str| by_name.get(name).is_some_and(|o| pass.judge.converged(&o.machine));
    let held_since = *memory.held();
    let mut recorded = record::record(&PassRecord {
        written: &op.status,
        read: status,
        generation: op.generation,
        decision,
        outcomes: &outcomes,
        views,
        work,
        snapshot: decided.snapshot.as_ref(),
        converged: &converged,
        kept_recheck,
        held_since,
        status_hold: ex.config.status_hold,
        now,
    });
    if let (Some(background), Ok(target)) = (ex.background, target)
        && ex.config.prepull.enabled
        && !removal
    {
        prepull(background, target, &by_name, &decision.prepull);
    }
    // The morning-after audit, with the status that first says an upgrade Completed.
    let audited = recorded.status.phase == Phase::Completed
        && op.status.phase != Phase::Completed
        && recorded.status.audit.is_none()
        && !removal;
    if audited {
        recorded.status.audit = Some(super::audit::findings(pass).await);
    }
    // What happened in the pass (its calls, its warnings) is told whatever comes next; the
    // phase's change only once the status that records it is written: a pass whose
    // status write conflicts is decided again, and would tell it twice.
    emit_events(ex, name, decision, &outcomes).await;
    let wrote = match recorded.write {
        StatusWrite::HeldBack { since, .. } => {
            *memory.held() = Some(since);
            false
        }
        StatusWrite::Now => {
            let wrote = write_status(ex, name, &op.status, &recorded.status).await?;
            *memory.held() = None;
            emit_phase_event(ex, name, &op.status.phase, &recorded.status.phase).await;
            if let (true, Some(findings)) = (audited && wrote, &recorded.status.audit) {
                send_events(ex, super::audit::events(name, findings)).await;
            }
            wrote
        }
    };
    if decision.finalized {
        let write_op = |source| ReconcileError::WriteOperation { name: name.to_owned(), source };
        kube_call(ex, "remove finalizer", ex.kube.remove_finalizer(name)).await.map_err(write_op)?;
    }
    // The silences of the machines in their turn, once the status that records the turns
    // is decided: renewed in the pass, by the lock's holder, never between passes.
    let renew_silences = hold_silences(pass, &recorded.status).await;
    Ok(ReconcileOutcome {
        requeue_at: Timestamp::min_opt(recorded.requeue_at(wrote), renew_silences),
        phase: recorded.status.phase,
        finished: decision.finalized,
        preflight_blocked: blocked_lines(decision),
        preflight_cleared: decided.cleared.clone(),
    })
}

/// The alert gates' silences for the machines in their turn in `status` (started, not
/// converged or failed): when the pass should come back to renew them.
async fn hold_silences(pass: &Pass<'_>, status: &OperationStatus) -> Option<Timestamp> {
    if pass.silencing.is_empty() || pass.removal {
        return None;
    }
    let in_turn: Vec<InTurn> = pass
        .views
        .iter()
        .filter(|v| status.machines.get(&v.name).is_some_and(|r| r.state == RecordState::InProgress))
        .filter_map(|v| {
            let observed = pass.observed.iter().find(|o| o.machine.name == v.name)?;
            Some(InTurn {
                machine: v.name.clone(),
                node: observed.node_name()?.to_owned(),
                role: v.role,
                order: v.order_label.clone(),
            })
        })
        .collect();
    crate::alert_gates::hold_silences(pass.ex, &pass.op.identity, pass.silencing, &in_turn, pass.now).await
}

/// What the operation does, as the record tells it apart.
fn work(pass: &Pass<'_>) -> Work {
    match pass.kubernetes {
        _ if pass.removal => Work::Removal,
        Some(_) => Work::Kubernetes,
        None => Work::Upgrade,
    }
}

/// Stage "record" of a pass that took the cluster lock, and did nothing else: the status
/// as the decision leaves it (the snapshot taken, the machines converged counted), written.
pub(super) async fn record_lock_taken(pass: &Pass<'_>, decided: &Decided) -> Result<ReconcileOutcome, ReconcileError> {
    let Pass { ex, name, op, status, observed, views, now, .. } = *pass;
    let decision = &decided.decision;
    let work = work(pass);
    let converged = |name: &str| observed.iter().any(|o| o.machine.name == name && pass.judge.converged(&o.machine));
    let snapshot = decided.snapshot.as_ref();
    let next = record::lock_taken(status, op.generation, decision, views, work, snapshot, &converged);
    let wrote = write_status(ex, name, &op.status, &next).await?;
    Ok(ReconcileOutcome {
        phase: next.phase,
        requeue_at: Timestamp::min_opt(decision.recheck_at, wrote.then_some(now)),
        finished: false,
        preflight_blocked: blocked_lines(decision),
        preflight_cleared: decided.cleared.clone(),
    })
}

/// Hands the pre-pulls of the machines the decision names to `background` (those not pulled
/// ahead by this process yet; the background bounds how many run at once). A machine
/// whose image cannot be named (no schematic) is left to its own turn, which says why.
pub(super) fn prepull(
    background: &dyn Background,
    target: &UpgradeTarget,
    by_name: &BTreeMap<&str, &Observed>,
    machines: &[String],
) {
    for machine in machines {
        if background.prepulled(machine) {
            continue;
        }
        let Some(o) = by_name.get(machine.as_str()) else { continue };
        let Some(node) = o.node.as_deref() else { continue };
        let Ok(image) = installer_image_for(target, &crate::calls::node_observation(node)) else { continue };
        let job = Job::Prepull { machine: machine.clone(), address: o.machine.address.clone(), image };
        if !background.submit(job) {
            // As many pre-pulls run as allowed: the next pass offers the rest.
            break;
        }
    }
}

/// The actions recorded as Events: the Upgrade call (on the lifecycle path, the Reboot
/// call: the moment the node goes down), a void intent closed (rare, and worth a look),
/// and storage that selects a node its backend does not have (a Normal Event, no pause).
pub(super) const EVENT_ACTIONS: [&str; 4] =
    ["UpgradeRequested", "RebootRequested", "CloseVoidIntent", crate::calls::NO_STORAGE_NODE];

/// What an [`EVENT_ACTIONS`] Event says happened.
pub(super) fn action_message(action: &str) -> &'static str {
    match action {
        "UpgradeRequested" => "the Upgrade call was made: the node installs the target and reboots into it",
        "RebootRequested" => "the Reboot call was made: the node goes down and comes back on the installed target",
        "CloseVoidIntent" => {
            "no sign on the node of the call recorded as intended, and its deadline has passed: the intent is \
             void and closed; the next pass decides again with every check"
        }
        _ => "the storage selects this node, but its backend has no such node: nothing to evacuate",
    }
}

/// Events are best effort: a failed Event never fails the pass.
pub(super) async fn emit_events(
    ex: &Executor<'_>,
    operation: &str,
    decision: &Decision,
    outcomes: &[(String, MachineOutcome)],
) {
    let mut events = Vec::new();
    for warning in &decision.warnings {
        events.push(Event {
            kind: "TalosOperation",
            name: operation.to_owned(),
            type_: EventType::Warning,
            reason: warning.reason().to_owned(),
            message: warning.to_string(),
        });
    }
    for (machine, outcome) in outcomes {
        let (type_, reason, message) = match outcome {
            MachineOutcome::Failed { reason, message } => (EventType::Warning, reason.clone(), message.clone()),
            // Evacuations begin and end in the machine's StorageEvacuation condition; an Event
            // is kept for the call and the outcome, at most two per machine.
            MachineOutcome::Progressed { action } if EVENT_ACTIONS.contains(action) => {
                (EventType::Normal, (*action).to_owned(), action_message(action).to_owned())
            }
            MachineOutcome::Progressed { .. } => continue,
            MachineOutcome::Converged => (EventType::Normal, "Converged".to_owned(), "on the target".to_owned()),
            MachineOutcome::Waiting { .. } => continue,
        };
        events.push(Event { kind: "TalosMachine", name: machine.clone(), type_, reason, message });
    }
    send_events(ex, events).await;
}

/// The operation's change of phase as an Event (a Warning for a pause, a refusal or
/// machines unobserved), once its status is written.
pub(super) async fn emit_phase_event(ex: &Executor<'_>, operation: &str, before: &Phase, after: &Phase) {
    // A wait on the preflight gate is reported as a Warning naming the machines, once per
    // change of them (`report_preflight`), not again here.
    let preflight = matches!(after, Phase::Waiting(WaitReason::PreflightBlocked { .. }));
    if before.reason() == after.reason() || preflight {
        return;
    }
    let type_ = match after {
        Phase::Paused(_) | Phase::Refused(_) | Phase::Waiting(WaitReason::MachinesUnobserved { .. }) => {
            EventType::Warning
        }
        Phase::Pending | Phase::Progressing | Phase::Waiting(_) | Phase::Completed => EventType::Normal,
    };
    let message = after.message_for(operation);
    let event =
        Event { kind: "TalosOperation", name: operation.to_owned(), type_, reason: after.reason().to_owned(), message };
    send_events(ex, vec![event]).await;
}

pub(super) async fn send_events(ex: &Executor<'_>, events: Vec<Event>) {
    for event in events {
        if let Err(e) = kube_call(ex, "record Event", ex.kube.event(&event)).await {
            tracing::warn!(reason = %event.reason, error = %e, "could not record an Event");
        }
    }
}
