//! Stage "act": the decision carried out, machine by machine, under the authority it
//! gives each; a call that waits on a gate is authorised in the same pass ([`authorise_due`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use foldhash::fast::FixedState;
use futures::future::join_all;
use ichor_storage::EvacuationEnd;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::evacuation::{
    EvacuationState, STORAGE_EVACUATION, StorageObservation, evacuation_state, with_recorded_evacuation,
};
use ichor_upgrade_core::machine::removal::is_removed;
use ichor_upgrade_core::machine::talos::MachineWait;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::preflight::Blocker;
use ichor_upgrade_core::rollout::{
    CallAuthority, CallDenied, Decision, EtcdVerdict, PreflightVerdict, RolloutInput, call_authority, finish_authority,
};
use ichor_upgrade_core::status::MachineOutcome;

use super::decide::Gathered;
use super::gates::{GateVerdict, gather_etcd_gate};
use super::memory::{PassMemory, Remembered};
use super::observe::Observed;
use super::outcome::ReconcileError;
use super::view::Pass;
use crate::calls::{AdvanceError, Executor, OperationRef, at_most_a_few, bounded};
use crate::effects::{self, Advancing, Grants};
use crate::etcd::ControlPlane;
use crate::kube_api::MachineInfo;
use crate::machine::kubernetes::{KubernetesWork, advance_kubernetes};
use crate::machine::removal::remove_machine;
use crate::machine::talos::{advance_machine_with, machine_past_upgrade_call, reset_for_retry};

/// What stage "act" leaves for stage "record".
pub(super) struct Acted<'a> {
    /// What became of each machine in this pass (installs that ended outside it first).
    pub(super) outcomes: Vec<(String, MachineOutcome)>,
    /// The machines the decision or the status names, by name.
    pub(super) by_name: BTreeMap<&'a str, &'a Observed>,
    /// The earliest recheck of the machines passed over (their waits stand).
    pub(super) kept_recheck: Option<Timestamp>,
}

/// Stage "act": carries the decision out. The retries' records are closed, the stopped
/// machines stopped, and every machine the decision starts or advances is stepped under
/// the authority the decision gives it (its last wait passed over while it still stands),
/// then authorised and stepped again where a gate was due ([`authorise_due`]).
pub(super) async fn act<'p>(
    pass: &Pass<'p>,
    memory: &PassMemory,
    decision: &Decision,
    gathered: &mut Gathered,
    input: &RolloutInput<'_>,
) -> Result<Acted<'p>, ReconcileError> {
    let ex = pass.ex;
    // Only the machines the decision or the status names are looked up by name.
    let wanted: HashSet<&str, FixedState> =
        [&decision.retry, &decision.stop, &decision.start, &decision.advance, &decision.prepull]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .chain(pass.status.machines.keys().map(String::as_str))
            .collect();
    let by_name: BTreeMap<&'p str, &'p Observed> = pass
        .observed
        .iter()
        .filter(|o| wanted.contains(o.machine.name.as_str()))
        .map(|o| (o.machine.name.as_str(), o))
        .collect();
    let mut outcomes = retry_and_stop(pass, decision, &by_name).await?;
    // A machine reset for a retry is stepped from the next observation, not from the
    // conditions read before the reset.
    let moving: Vec<&Observed> = decision
        .start
        .iter()
        .chain(&decision.advance)
        .filter(|n| !decision.retry.contains(n))
        .filter_map(|n| by_name.get(n.as_str()).copied())
        .collect();
    let control_planes = control_planes(pass.observed);
    let stepper = Stepper { pass, decision, control_planes: &control_planes };
    let (moving, kept_recheck) = passed_over(pass, memory, &stepper, moving).await;
    let mut advanced =
        join_all(moving.iter().map(|o| stepper.advance(Arc::clone(&o.machine), stepper.authorities_of(o)))).await;
    let gates = (&mut gathered.etcd, &mut gathered.checked);
    let step = |o: &Observed, authorities| stepper.advance(Arc::clone(&o.machine), authorities);
    authorise_due(pass, input, decision, &by_name, gates, &mut advanced, step, pass.now).await;
    remember_waits(memory, &stepper, &moving, &advanced);
    outcomes.extend(advanced);
    // Installs that ended outside a pass since the last one: recorded as if this pass had
    // carried them out (a failure pauses), before this pass's own outcome of the machine.
    if let Some(background) = ex.background {
        let finished: Vec<(String, MachineOutcome)> = background.take_finished();
        outcomes.splice(0..0, finished);
    }
    Ok(Acted { outcomes, by_name, kept_recheck })
}

/// The retries' failed attempts closed, and the stopped machines stopped: the outcomes of
/// those that could not be.
async fn retry_and_stop(
    pass: &Pass<'_>,
    decision: &Decision,
    by_name: &BTreeMap<&str, &Observed>,
) -> Result<Vec<(String, MachineOutcome)>, ReconcileError> {
    let ex = pass.ex;
    for machine in decision.retry.iter().filter_map(|n| by_name.get(n.as_str())) {
        // A resume is carried out whole or not at all: a machine whose failed attempt
        // could not be closed must not be advanced with its old marker as if resumed.
        let reset = match pass.kubernetes {
            Some((target, _)) => crate::machine::kubernetes::reset_for_retry(ex, &machine.machine, target).await,
            None => reset_for_retry(ex, &machine.machine).await,
        };
        reset.map_err(|source| ReconcileError::RetryReset { machine: machine.machine.name.clone(), source })?;
    }
    let mut outcomes = Vec::new();
    for machine in decision.stop.iter().filter_map(|n| by_name.get(n.as_str())) {
        if let Err(e) = stop_machine(ex, machine).await {
            outcomes.push((machine.machine.name.clone(), e.outcome(ex.retry_at())));
        }
    }
    Ok(outcomes)
}

/// The cluster's control planes, as a removal's etcd steps ask them. A control plane
/// removed earlier is no longer one (its node is wiped, its member gone): a removal keeps
/// it observed, never asks its etcd.
fn control_planes(observed: &[Observed]) -> Vec<ControlPlane> {
    observed
        .iter()
        .filter(|o| o.machine.role == MachineRole::ControlPlane && !is_removed(&o.machine.conditions))
        .filter_map(|o| {
            o.node_name().map(|node| ControlPlane { address: o.machine.address.clone(), node: node.to_owned() })
        })
        .collect()
}

/// Steps one machine under the authority the pass's decision gives it.
struct Stepper<'s, 'p> {
    pass: &'s Pass<'p>,
    decision: &'s Decision,
    control_planes: &'s [ControlPlane],
}

impl Stepper<'_, '_> {
    /// The authorities the decision gives `o`: its first call's and its finish's.
    fn authorities_of(&self, o: &Observed) -> (CallAuthority, CallAuthority) {
        let denied = CallAuthority::Denied(CallDenied::NotInCluster);
        let of = |grants: &BTreeMap<String, CallAuthority>| grants.get(&o.machine.name).cloned();
        (
            of(&self.decision.authority).unwrap_or_else(|| denied.clone()),
            of(&self.decision.finish_authority).unwrap_or(denied),
        )
    }

    /// Whether an install of this controller runs for `o`.
    fn installing(&self, o: &Observed) -> bool {
        self.pass.ex.background.is_some_and(|b| b.installing(&o.machine.name))
    }

    /// One step of `machine` with `authority` (its call's) and `finish`: every side effect
    /// on the machine is made under the authority this pass's decision gives it
    /// ([`crate::effects`]).
    async fn advance(
        &self,
        machine: Arc<MachineInfo>,
        (authority, finish): (CallAuthority, CallAuthority),
    ) -> (String, MachineOutcome) {
        let Pass { ex, op, removal, kubernetes, api_servers, target, .. } = *self.pass;
        let operation = OperationRef { kind: &op.spec.kind, identity: &op.identity };
        let Some(advancing) = Advancing::of(&machine.name, self.decision) else {
            let message = "the pass's decision does not advance it under a lock it holds".to_owned();
            let waiting = MachineOutcome::Waiting { reason: "NotAdvanced".into(), message, recheck_at: None };
            return (machine.name.clone(), waiting);
        };
        let outcome = match target {
            _ if removal => remove_machine(ex, &advancing, operation.identity, &machine, self.control_planes)
                .await
                .unwrap_or_else(|e| e.outcome(ex.retry_at())),
            _ if let Some((target, stage)) = kubernetes => {
                let grants = Grants::of(advancing, &authority, &finish);
                let work = KubernetesWork { target, stage: *stage, api_servers, operation: &op.identity };
                advance_kubernetes(ex, &grants, &authority, &machine, work)
                    .await
                    .unwrap_or_else(|e| e.outcome(ex.retry_at()))
            }
            Ok(target) => advance_machine_with(ex, &advancing, operation, &machine, target, &authority, &finish)
                .await
                .unwrap_or_else(|e| e.outcome(ex.retry_at())),
            Err(error) => MachineOutcome::Failed { reason: "InvalidTarget".into(), message: error.clone() },
        };
        (machine.name.clone(), outcome)
    }
}

/// The machines to step in this pass, and the earliest recheck of those passed over:
/// a machine whose last wait still stands (its machine, Node, authority and install as
/// they were, its recheck not due) is passed over, unless only its storage changed and its
/// storage alone says its evacuation is done.
async fn passed_over<'o>(
    pass: &Pass<'_>,
    memory: &PassMemory,
    stepper: &Stepper<'_, '_>,
    moving: Vec<&'o Observed>,
) -> (Vec<&'o Observed>, Option<Timestamp>) {
    let (ex, decision, now) = (pass.ex, stepper.decision, pass.now);
    let mut kept_recheck: Option<Timestamp> = None;
    let storage_changed = memory.take_storage_changed();
    let evacuating = MachineWait::Evacuating { replicas_left: None }.reason();
    // Machines whose wait on their evacuation would stand but for a change of their storage.
    let mut storage_only: Vec<&Observed> = Vec::new();
    let mut moving: Vec<&Observed> = {
        let mut waits = memory.lock();
        let moving_names: HashSet<&str> = moving.iter().map(|o| o.machine.name.as_str()).collect();
        waits.retain(|name, _| moving_names.contains(name.as_str()));
        moving
            .into_iter()
            .filter(|o| {
                // A removal is one machine whose waits (drain, reset, storage) are not
                // polled by its step: it is always looked at. So is a Kubernetes upgrade's
                // machine: what it waits on (its mirror pods, its kubelet's version) is in
                // neither its machine nor its Node as remembered.
                let remembered = waits.get(&o.machine.name).filter(|r| {
                    !pass.removal
                        && pass.kubernetes.is_none()
                        && !decision.start.contains(&o.machine.name)
                        && r.recheck_at.is_none_or(|t| t > now)
                        && r.machine == o.machine
                        && r.node == o.node
                        && r.authority == stepper.authorities_of(o)
                        && r.installing == stepper.installing(o)
                });
                let Some(r) = remembered else { return true };
                if o.node_name().is_some_and(|node| storage_changed.contains(node)) {
                    if r.reason != evacuating {
                        return true;
                    }
                    storage_only.push(o);
                }
                kept_recheck = Timestamp::min_opt(kept_recheck, r.recheck_at);
                false
            })
            .collect()
    };
    // Only its storage changed since the step said it waits on its evacuation: storage
    // alone says whether it still does (no Talos call for each replica that moves).
    let still = at_most_a_few(storage_only.iter().map(|o| still_evacuating(ex, o, now))).await;
    moving.extend(storage_only.into_iter().zip(still).filter(|(_, still)| !still).map(|(o, _)| o));
    (moving, kept_recheck)
}

/// Remembers the waits of the machines stepped, with what they were decided from; forgets
/// the others.
fn remember_waits(
    memory: &PassMemory,
    stepper: &Stepper<'_, '_>,
    moving: &[&Observed],
    advanced: &[(String, MachineOutcome)],
) {
    let mut waits = memory.lock();
    for (o, (_, outcome)) in moving.iter().zip(advanced) {
        match outcome {
            MachineOutcome::Waiting { recheck_at, reason, .. } => {
                let remembered = Remembered {
                    machine: Arc::clone(&o.machine),
                    node: o.node.clone(),
                    authority: stepper.authorities_of(o),
                    installing: stepper.installing(o),
                    recheck_at: *recheck_at,
                    reason: reason.clone(),
                };
                waits.insert(o.machine.name.clone(), remembered);
            }
            MachineOutcome::Progressed { .. } | MachineOutcome::Converged | MachineOutcome::Failed { .. } => {
                waits.remove(&o.machine.name);
            }
        }
    }
}

/// Stage "authorise": the machines whose first call or finish is due and whose authority
/// waits on a gate not gathered in this pass (`advanced`, as stepped) get it now: the
/// preflight about them, beside the nodes down, and for a control plane the etcd gate
/// (once per pass, only when a call is due). Each is asked again for its authority and
/// stepped again with it: a call goes out only on gates passed in this same pass, and one
/// gate verdict authorises at most one disruptive control-plane step.
#[allow(clippy::too_many_arguments)]
pub(super) async fn authorise_due<F, Fut>(
    pass: &Pass<'_>,
    input: &RolloutInput<'_>,
    decision: &Decision,
    by_name: &BTreeMap<&str, &Observed>,
    (verdict, checked): (&mut Option<GateVerdict>, &mut BTreeMap<String, Vec<Blocker>>),
    advanced: &mut [(String, MachineOutcome)],
    advance: F,
    now: Timestamp,
) where
    F: Fn(&Observed, (CallAuthority, CallAuthority)) -> Fut,
    Fut: Future<Output = (String, MachineOutcome)>,
{
    let ex = pass.ex;
    // A machine ready for its first call waits for the preflight, judged now about its
    // node beside those down already; a control plane, for the etcd gate too, gathered now
    // (once per pass, only when a call is due). Both are asked again for its authority:
    // the call goes out only on gates passed in this same pass.
    let gate_due = MachineWait::EtcdGateNotChecked.reason();
    let preflight_due = MachineWait::PreflightNotChecked.reason();
    let due = |outcome: &MachineOutcome, reason_due: &str| matches!(outcome, MachineOutcome::Waiting { reason, .. } if reason == reason_due);
    let needs_gate: Vec<usize> = advanced
        .iter()
        .enumerate()
        .filter(|(_, (_, outcome))| due(outcome, gate_due) || due(outcome, preflight_due))
        .map(|(i, _)| i)
        .collect();
    if !needs_gate.is_empty() {
        let asked: Vec<&str> =
            needs_gate.iter().map(|&i| advanced[i].0.as_str()).filter(|m| !checked.contains_key(*m)).collect();
        if !asked.is_empty() {
            checked.extend(pass.judge_preflight(&asked).await);
        }
        let control_plane = |i: &usize| {
            by_name.get(advanced[*i].0.as_str()).is_some_and(|o| o.machine.role == MachineRole::ControlPlane)
        };
        let (gathered, components) = match verdict.take() {
            Some(verdict) => verdict,
            None if needs_gate.iter().any(control_plane) => gather_etcd_gate(ex, pass.observed).await,
            None => (EtcdVerdict::NotChecked, input.components.clone()),
        };
        let judged = PreflightVerdict::Checked(checked.clone());
        let rollout_input = RolloutInput { etcd: &gathered, components: &components, preflight: &judged, ..*input };
        // Still not gathered cannot happen with a verdict; never call on it.
        let gathered_or_denied = |authority| match authority {
            CallAuthority::NeedsEtcdGate => CallAuthority::Denied(CallDenied::EtcdUnhealthy {
                reason: "the etcd gate could not be gathered".to_owned(),
            }),
            CallAuthority::NeedsPreflight => CallAuthority::Denied(CallDenied::PreflightBlocked {
                blockers: "the preflight could not be judged".to_owned(),
            }),
            authority => authority,
        };
        // One verdict authorises at most one disruptive control-plane step (the decision's
        // grants count): a machine past its call first.
        let mut spent: Option<String> = decision
            .authority
            .iter()
            .chain(&decision.finish_authority)
            .filter(|(_, a)| **a == CallAuthority::Granted)
            .map(|(name, _)| name)
            .find(|name| by_name.get(name.as_str()).is_some_and(|o| o.machine.role == MachineRole::ControlPlane))
            .cloned();
        let mut needs_gate = needs_gate;
        needs_gate.sort_by_key(|&i| {
            !by_name.get(advanced[i].0.as_str()).is_some_and(|o| machine_past_upgrade_call(&o.machine))
        });
        for i in needs_gate {
            let name = advanced[i].0.clone();
            let Some(o) = by_name.get(name.as_str()) else { continue };
            let mut authority = gathered_or_denied(call_authority(&rollout_input, &name));
            let mut finish = gathered_or_denied(finish_authority(&rollout_input, &name));
            let grants = authority == CallAuthority::Granted || finish == CallAuthority::Granted;
            if grants && o.machine.role == MachineRole::ControlPlane {
                match &spent {
                    Some(on) if *on != name => {
                        let denied = CallAuthority::Denied(CallDenied::GateSpent { on: on.clone() });
                        (authority, finish) = (denied.clone(), denied);
                    }
                    _ => spent = Some(name.clone()),
                }
            }
            let blocked = matches!(authority, CallAuthority::Denied(CallDenied::PreflightBlocked { .. }));
            advanced[i] = advance(o, (authority, finish)).await;
            // Blockers no watch reports (pods, budgets) are looked at again at the
            // preflight's own pace, not at every poll.
            if blocked && let MachineOutcome::Waiting { recheck_at, .. } = &mut advanced[i].1 {
                let at = now.saturating_add(ex.config.rollout.preflight_recheck);
                *recheck_at = Some(recheck_at.map_or(at, |r| r.max(at)));
            }
        }
    }
}

/// A machine interrupted before its Upgrade call: its evacuation, if open (in its
/// conditions, or only in the storage backend's record: decision 0011), is ended. Storage
/// knows the node by its name: when that is unknown this waits, never ending the
/// evacuation of a guessed name (which would leave the real node unschedulable), nor
/// guessing that the backend holds none.
pub(super) async fn stop_machine(ex: &Executor<'_>, o: &Observed) -> Result<(), AdvanceError> {
    // Its install job, if one is under way, ends before its next side effect: first, so
    // that nothing this pass ends below is put back by it.
    // A job that committed to its intent first has made the machine past its call: the
    // stop leaves it alone (its evacuation stays until the upgrade ends it).
    if ex.background.is_some_and(|b| b.stop_install(&o.machine.name)) {
        return Ok(());
    }
    let Some(node) = o.node_name() else {
        return Err(AdvanceError::NodeNameUnknown { machine: o.machine.name.clone() });
    };
    if o.machine.conditions.is_true(STORAGE_EVACUATION) {
        return effects::end_evacuation(ex, &o.machine, node, EvacuationEnd::Ended).await;
    }
    let reading = ex.storage.evacuation_record(node);
    let recorded = bounded("read the evacuation's record", ex.config.call_timeout, reading)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node.to_owned(), source: source.into() })?;
    let storage = StorageObservation { recorded, ..StorageObservation::default() };
    let Some(conditions) = with_recorded_evacuation(&o.machine.conditions, &storage, node, ex.clock.now()) else {
        return Ok(());
    };
    let machine = MachineInfo { conditions, ..(*o.machine).clone() };
    effects::end_evacuation(ex, &machine, node, EvacuationEnd::Ended).await
}

/// Whether machine `o`, whose step last waited on its evacuation and whose objects have not
/// changed since, still has replicas to move, by its storage alone. Anything but a clear
/// yes (a read that failed, the evacuation done or past its timeout) says no: the machine is
/// then stepped in full.
pub(super) async fn still_evacuating(ex: &Executor<'_>, o: &Observed, now: Timestamp) -> bool {
    let Some(node) = o.node_name() else { return false };
    let labels = o.node.as_ref().map(|n| n.labels.clone()).unwrap_or_default();
    let Ok(storage) =
        crate::calls::observe(ex, node, &labels, &o.machine.conditions, ichor_storage::EvacuationFor::Upgrade).await
    else {
        return false;
    };
    let machine = crate::calls::seen_with_storage(ex, &o.machine, &storage, Some(node));
    matches!(
        evacuation_state(&machine.conditions, &storage, ex.config.step.evacuation, now),
        EvacuationState::InProgress { replicas_left: Some(n), .. } if n > 0
    )
}
