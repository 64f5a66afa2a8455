//! Stage "decide": the rollout engine's decision, with the gates it asks for gathered
//! and decided again.

use std::collections::BTreeMap;

use ichor_upgrade_core::etcd::snapshot::SnapshotState;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::preflight::Blocker;
use ichor_upgrade_core::rollout::{Decision, EtcdVerdict, OperationView, PreflightVerdict, RolloutInput, decide};
use ichor_upgrade_core::status::OperationStatus;

use super::gates::{GateVerdict, blocked_lines, gather_etcd_gate, report_preflight, take_snapshot};
use super::memory::PassMemory;
use super::observe::Observed;
use super::outcome::{ReconcileError, ReconcileOutcome};
use super::view::Pass;
use super::write::write_status;
use crate::kube_api::MachineInfo;

/// The gates stage "decide" gathered, which stage "act" may add to.
#[derive(Default)]
pub(super) struct Gathered {
    /// The etcd gate's verdict and the control planes' components, if gathered in this pass.
    pub(super) etcd: Option<GateVerdict>,
    /// The preflight's verdicts gathered in this pass, by machine.
    pub(super) checked: BTreeMap<String, Vec<Blocker>>,
}

/// The decision of a pass with the gates it asked for gathered.
pub(super) struct Decided {
    pub(super) decision: Decision,
    pub(super) gathered: Gathered,
    /// The operation as this pass sees it once it took (or failed to take) the snapshot.
    pub(super) recorded_view: Option<OperationView>,
    /// The snapshot this pass took (or failed to), as recorded.
    pub(super) snapshot: Option<SnapshotState>,
    /// The machines the preflight found clear, or started.
    pub(super) cleared: Vec<String>,
}

/// How stage "decide" ended.
pub(super) enum DecideEnd {
    /// Decided: stage "act" carries it out.
    Act(Box<Decided>),
    /// The pass ends here, with what it came to.
    Ended(ReconcileOutcome),
}

/// How gathering the gates ended.
enum GatesEnd {
    Decided(Box<(Decision, Gathered, Option<OperationView>)>),
    /// The etcd snapshot was taken and recorded (or a Kubernetes upgrade's bootstrap
    /// manifests applied and recorded): the pass ends there, and the next one authorises
    /// the first control plane from gates read again (or completes).
    SnapshotRecorded(Box<Decision>),
}

/// Stage "decide": the rollout engine's decision with the gates it asks for gathered
/// ([`gather_gates`]), and the preflight's holds reported.
pub(super) async fn decide_pass(
    pass: &Pass<'_>,
    memory: &PassMemory,
    view: &OperationView,
    input: RolloutInput<'_>,
) -> Result<DecideEnd, ReconcileError> {
    let (decision, gathered, recorded_view) = match gather_gates(pass, view, input).await? {
        GatesEnd::Decided(gates) => *gates,
        GatesEnd::SnapshotRecorded(decision) => {
            // The gate and the Nodes were read before the snapshot, which can take
            // minutes: the first control plane is authorised by the next pass, which
            // reads them again, never by this one's old verdict.
            // The phase this pass decided (a resume's), which the next pass writes.
            return Ok(DecideEnd::Ended(ReconcileOutcome {
                phase: decision.phase.clone(),
                requeue_at: Some(pass.ex.clock.now()),
                finished: false,
                preflight_blocked: blocked_lines(&decision),
                preflight_cleared: Vec::new(),
            }));
        }
    };
    let snapshot: Option<SnapshotState> = recorded_view.as_ref().and_then(|v| v.status.etcd_snapshot.clone());
    let cleared: Vec<String> = gathered
        .checked
        .iter()
        .filter(|(_, blockers)| blockers.is_empty())
        .map(|(machine, _)| machine.clone())
        .chain(decision.start.iter().cloned())
        .collect();
    report_preflight(pass.ex, pass.name, memory, &decision).await;
    Ok(DecideEnd::Act(Box::new(Decided { decision, gathered, recorded_view, snapshot, cleared })))
}

/// Stage "decide": the rollout engine's decision, with the gates it asks for (the etcd
/// snapshot, the etcd gate, the preflight of the machines it would start) gathered and
/// decided again, up to [`GATE_ROUNDS`] rounds.
async fn gather_gates(
    pass: &Pass<'_>,
    view: &OperationView,
    input: RolloutInput<'_>,
) -> Result<GatesEnd, ReconcileError> {
    let Pass { ex, name, op, observed, .. } = *pass;
    let mut verdict = None;
    let mut decision = decide(&input);
    // The gates are gathered only for machines about to start, and decided again with
    // them: the etcd gate once, the preflight for each machine named (a blocked machine
    // lets the next one be named, up to a few rounds).
    let mut checked: BTreeMap<String, Vec<Blocker>> = BTreeMap::new();
    // The operation as this pass sees it once it took (or failed to take) the etcd snapshot.
    let mut recorded_view: Option<OperationView> = None;
    if decision.apply_manifests
        && let Some(spec) = op.spec.validate_kubernetes().ok()
    {
        // The Kubernetes upgrade's last step, alone in its pass: every machine is through.
        let mut control_planes: Vec<&Observed> =
            observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane).collect();
        // Ready ones first, then by name: the manifests of a control plane that answers.
        control_planes.sort_by_key(|o| (!o.node.as_ref().is_some_and(|n| n.ready), o.machine.name.clone()));
        let machines: Vec<&MachineInfo> = control_planes.iter().map(|o| o.machine.as_ref()).collect();
        let state = crate::machine::kubernetes::apply_manifests(ex, &machines, &spec.target)
            .await
            .map_err(|source| ReconcileError::Manifests { source })?;
        // With the resume this pass acted upon: a failure recorded again is not resumed
        // again by the same token.
        let observed_resume = decision.acknowledge_resume.clone().or_else(|| op.status.observed_resume.clone());
        let recorded = OperationStatus { manifests: Some(state), observed_resume, ..op.status.clone() };
        write_status(ex, name, &op.status, &recorded).await?;
        return Ok(GatesEnd::SnapshotRecorded(Box::new(decision)));
    }
    for round in 1..=GATE_ROUNDS {
        let needs_etcd = decision.check_etcd && verdict.is_none();
        let needs_snapshot = decision.take_etcd_snapshot.is_some() && recorded_view.is_none();
        if !needs_etcd && decision.check_preflight.is_empty() && !needs_snapshot {
            break;
        }
        if needs_snapshot {
            let state = take_snapshot(ex, &op.cluster, view, observed, decision.take_etcd_snapshot.as_deref()).await;
            // Recorded before anything else in the pass: no control plane's call goes out on
            // a snapshot the status does not hold.
            let recorded = OperationStatus { etcd_snapshot: Some(state.clone()), ..op.status.clone() };
            write_status(ex, name, &op.status, &recorded).await?;
            if state.taken().is_some() {
                return Ok(GatesEnd::SnapshotRecorded(Box::new(decision)));
            }
            let mut with_it = view.clone();
            with_it.status.etcd_snapshot = Some(state);
            recorded_view = Some(with_it);
        }
        if needs_etcd {
            verdict = Some(gather_etcd_gate(ex, observed).await);
        }
        if !decision.check_preflight.is_empty() {
            // Read about the nodes asked in this round (each round asks about new ones).
            let asked: Vec<&str> = decision.check_preflight.iter().map(String::as_str).collect();
            checked.extend(pass.judge_preflight(&asked).await);
        }
        // No round follows the last: what it did not gather waits for the next recheck.
        let verdicts = if round == GATE_ROUNDS {
            PreflightVerdict::Last(checked.clone())
        } else {
            PreflightVerdict::Checked(checked.clone())
        };
        let (etcd, components) = match verdict.clone() {
            Some((etcd, components)) => (etcd, components),
            None => (EtcdVerdict::NotChecked, input.components.clone()),
        };
        let operation = recorded_view.as_ref().unwrap_or(view);
        decision =
            decide(&RolloutInput { operation, etcd: &etcd, components: &components, preflight: &verdicts, ..input });
    }
    Ok(GatesEnd::Decided(Box::new((decision, Gathered { etcd: verdict, checked }, recorded_view))))
}

/// How many times a pass decides again with gates gathered: the etcd gate and the
/// preflight for the first machines named, the etcd snapshot once both passed for a
/// control plane, then the preflight for those named after a blocked one.
pub(super) const GATE_ROUNDS: usize = 5;
