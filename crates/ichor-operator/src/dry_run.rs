//! A dry run (`spec.dryRun: true`): the plan of a Talos upgrade, written in the
//! operation's `status.plan`, and the calibration of that plan once a real upgrade of the
//! same kind and cluster completes (`status.calibration`). A Kubernetes upgrade's dry run
//! is [`kubernetes`].
//!
//! A dry run reads the watch stores (the cluster, its machines and their recorded
//! history, the Nodes, the operations) and the preflight gate's facts (pods, budgets,
//! workloads, listed as a pass before a start lists them), and plans with
//! [`ichor_upgrade_core::plan`]. The durations come from the machines' history of the
//! cluster's last completed upgrade ([`crate::recorded`]); without one, from the
//! simulator's defaults, and the plan says so. Storage: the storage objects and the bytes
//! of the replicas on each node now (one list of Longhorn's replicas), against the rate
//! the last upgrade's evacuations recorded (`status.lastUpgrade.evacuatedBytes`), so that
//! storage that grew, moved or went changes the plan.
//!
//! What it must not do: touch the cluster. It takes no lock, writes no machine, Node or
//! Lease, calls no Talos API; its only write is the operation's own status, under this
//! replica's leadership (the fence), like every other write of the operator.

use std::collections::BTreeMap;
use std::sync::Arc;

use ichor_adapters::kubernetes::crd::{
    Calibration, PlanGate, PlanHeld, PlanPhase, PlanStatus, PlanWindows, PlannedMachine, Role, TalosMachine,
    TalosOperation,
};
use ichor_storage::StorageObject;
use ichor_timeline::{History, Timeline};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::{HOLD_ANNOTATION, ORDER_LABEL, OperationKind};
use ichor_upgrade_core::plan::{
    DEFAULT_RUNS, Defaults, Models, PlanInput, PlanMachine, Recorded, RecordedTurn, StorageRate, describe_storage,
    models, plan,
};
use ichor_upgrade_core::preflight::{ClusterFacts, NodeFacts, Preflight, PreflightConfig, describe};
use ichor_upgrade_core::rollout::NameOrder;
use ichor_upgrade_core::versions::TalosVersion;
use ichor_upgrade_core::window::{MaintenanceSpec, TurnP90};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::recorded::{Origin, history_records, machines_of};

/// The reason of a dry run's phase once planned.
pub const PLANNED: &str = "Planned";

/// What a dry run plans from.
#[derive(Debug)]
pub struct DryRun<'a> {
    /// The dry run.
    pub operation: &'a TalosOperation,
    /// Every TalosMachine in the store.
    pub machines: &'a [Arc<TalosMachine>],
    /// Every Node in the store, already narrowed to the cluster's.
    pub nodes: &'a [Arc<Node>],
    /// Every TalosOperation in the store (the last completed upgrade is among them).
    pub operations: &'a [Arc<TalosOperation>],
    /// The preflight gate's facts about the machines' Nodes (`nodes` left empty).
    pub facts: ClusterFacts,
    /// The gate's settings for this operation.
    pub preflight: PreflightConfig,
    /// `spec.preflight: Warn`: what the gate finds starts a machine anyway (with a
    /// Warning Event), so it holds none.
    pub preflight_warns: bool,
    /// Defaults for what no history records.
    pub defaults: Defaults,
    /// The Node the operator runs on: its machine goes last in its role, as the engine
    /// orders it.
    pub own_node: Option<&'a str>,
    /// What storage holds now, or why it could not be read (the plan then times
    /// evacuations as recorded, and says so).
    pub storage: Result<StorageNow, String>,
    /// The maintenance windows the upgrade would keep to (the operation's own, else its
    /// cluster's), if any.
    pub maintenance: Option<&'a MaintenanceSpec>,
    /// The health gates the upgrade would keep to, as read now ([`read_gates`]).
    pub gates: Vec<PlanGate>,
    /// When the dry run plans: the windows are counted from it.
    pub now: Timestamp,
}

/// What storage holds now, as a dry run reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageNow {
    /// The storage objects (`TalosStorage`): a node none selects has nothing evacuated.
    pub objects: Vec<StorageObject>,
    /// The bytes of the replicas on each node that has any; `None` where a size did not
    /// read.
    pub bytes: BTreeMap<String, Option<u64>>,
}

impl StorageNow {
    /// The bytes an evacuation of `node` (with `labels`) would move now: 0 when no storage
    /// object selects it (or when it holds no replica), `None` when unknown (a size or a
    /// selector that does not read).
    #[must_use]
    pub fn bytes_on(&self, node: &str, labels: &BTreeMap<String, String>) -> Option<u64> {
        match ichor_storage::selecting(&self.objects, labels) {
            Ok(selected) if selected.is_empty() => Some(0),
            Ok(_) => self.bytes.get(node).copied().unwrap_or(Some(0)),
            Err(_) => None,
        }
    }
}

/// Why a dry run cannot plan: its reason and message, for a Refused phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// CamelCase.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

/// The Node of `machine` ([`TalosMachine::node_in`]): by its hostname, the node its
/// latest call's marker recorded, or its name, else by its Talos API address.
#[must_use]
pub fn node_of<'a>(machine: &TalosMachine, nodes: &'a [Arc<Node>]) -> Option<&'a Node> {
    machine.node_in(nodes)
}

fn ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn os_image(node: &Node) -> Option<&str> {
    node.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| i.os_image.as_str())
}

/// The last upgrade of `kind` of the dry run's cluster that completed before it was
/// made, if the store still has it.
#[must_use]
pub fn last_completed<'a>(
    op: &TalosOperation,
    operations: &'a [Arc<TalosOperation>],
    kind: &str,
) -> Option<&'a TalosOperation> {
    let made = op.creation_timestamp().map(|t| t.0);
    operations
        .iter()
        .map(AsRef::as_ref)
        .filter(|o| o.namespace() == op.namespace() && o.spec.cluster == op.spec.cluster)
        .filter(|o| o.spec.kind == kind && !o.spec.dry_run)
        .filter(|o| completed_at(o).is_some() && o.creation_timestamp().map(|t| t.0) < made)
        .max_by_key(|o| o.creation_timestamp().map(|t| t.0))
}

/// When `op` completed (its `Completed` condition turned True), Unix milliseconds.
#[must_use]
pub fn completed_at(op: &TalosOperation) -> Option<i64> {
    let status = op.status.as_ref()?;
    if status.phase.as_deref() != Some("Completed") {
        return None;
    }
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Completed" && c.status == "True")
        .map(|c| c.last_transition_time.0.as_millisecond())
}

/// What `previous`'s machines recorded: each converged machine's turn by role with its
/// phases, the lead from its creation, the reaction time, and its evacuations' rate.
#[must_use]
pub fn recorded(previous: &TalosOperation, machines: &[Arc<TalosMachine>]) -> Recorded {
    let of = machines_of(previous, machines);
    let records = history_records(previous, &of, completed_at(previous), Origin::Creation);
    let history = History::from_timeline(&Timeline::from_records(&records));
    let (control_plane_turns, worker_turns) = recorded_turns(&history);
    Recorded {
        control_plane_turns,
        worker_turns,
        lead: history.lead,
        reaction: history.reaction,
        // The bytes each evacuation's opening recorded, over its evacuation as the turns
        // have it: the phase a plan replaces is the one the rate was measured on.
        storage: history.storage_rate().map(|bytes_per_s| StorageRate { bytes_per_s }),
    }
}

/// What a start of `op` is admitted on into a maintenance window: each role's p90 turn
/// ([`Models::p90`]) from the cluster's last completed upgrade of the same kind made
/// before it (a Kubernetes upgrade with none: the last Talos upgrade's, whose turns are
/// longer, so it errs long), a role it did not record from `defaults`. `None`: no history.
#[must_use]
pub fn turn_p90(
    op: &TalosOperation,
    machines: &[Arc<TalosMachine>],
    operations: &[Arc<TalosOperation>],
    defaults: &Defaults,
) -> Option<ichor_upgrade_core::window::TurnP90> {
    let previous = last_completed(op, operations, &op.spec.kind)
        .or_else(|| last_completed(op, operations, OperationKind::TALOS))?;
    Some(models(Some(&recorded(previous, machines)), defaults).p90())
}

/// Each converged machine's turn in `history` with its phases (by the timeline's names),
/// control planes' and workers': what a plan resamples.
#[must_use]
pub fn recorded_turns(history: &History) -> (Vec<RecordedTurn>, Vec<RecordedTurn>) {
    let (control_planes, workers): (Vec<_>, Vec<_>) = history.turns.iter().partition(|t| t.control_plane);
    let recorded = |turns: Vec<&ichor_timeline::history::Turn>| {
        turns
            .into_iter()
            .map(|t| RecordedTurn {
                seconds: t.seconds,
                phases: t.phases.iter().map(|(phase, s)| (phase.key().to_owned(), *s)).collect(),
            })
            .collect()
    };
    (recorded(control_planes), recorded(workers))
}

/// The plan of `dry`, a Talos upgrade's dry run, or why there is none. A Kubernetes
/// upgrade's dry run plans from what is read of the cluster's Kubernetes: its own
/// [`kubernetes::plan_status`].
///
/// # Errors
/// A [`Refusal`] for an operation that is not a Talos upgrade, or whose target does not
/// parse.
pub fn plan_status(dry: &DryRun<'_>) -> Result<PlanStatus, Refusal> {
    let op = dry.operation;
    if op.spec.kind != OperationKind::TALOS {
        return Err(Refusal {
            reason: "DryRunUnsupported",
            message: format!(
                "a dry run plans an upgrade (kind talos or kubernetes), not kind {}: nothing was read or changed",
                op.spec.kind
            ),
        });
    }
    let target = TalosVersion::parse(&op.spec.target_version).map_err(|e| Refusal {
        reason: "InvalidTarget",
        message: format!("spec.targetVersion {:?}: {e}", op.spec.target_version),
    })?;
    let machines = machines_of(op, dry.machines);
    let mut facts = dry.facts.clone();
    // Every Node that is not Ready or is cordoned holds every machine but its own, as it
    // would hold the upgrade's first start.
    facts.nodes = dry
        .nodes
        .iter()
        .filter(|n| !ready(n) || n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
        .map(|n| NodeFacts {
            name: n.name_any(),
            ready: ready(n),
            unschedulable: n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            by_operation: false,
            cordoned_by: None,
        })
        .collect();
    let gate = Preflight::new(&facts, &dry.preflight);
    let mut on_target = 0;
    let mut warned = Vec::new();
    let mut planned: Vec<(PlanMachine, (bool, bool, i64, String))> = Vec::new();
    for machine in &machines {
        let name = machine.name_any();
        let role = MachineRole::from(machine.spec.role);
        let node = node_of(machine, dry.nodes);
        if node.and_then(os_image).and_then(|i| TalosVersion::from_os_image(i).ok()).as_ref() == Some(&target) {
            on_target += 1;
            continue;
        }
        let held = match node {
            None => Some(format!("no Node found for it (hostname {:?})", machine.spec.hostname)),
            Some(_) if machine.annotations().contains_key(HOLD_ANNOTATION) => {
                Some(format!("held by the annotation {HOLD_ANNOTATION} on the TalosMachine"))
            }
            Some(n) if n.annotations().contains_key(HOLD_ANNOTATION) => {
                Some(format!("held by the annotation {HOLD_ANNOTATION} on Node {}", n.name_any()))
            }
            Some(n) => {
                let blockers = gate.blockers(&n.name_any());
                if dry.preflight_warns && !blockers.is_empty() {
                    warned.push(format!("{name}: {}", describe(&blockers)));
                    None
                } else {
                    (!blockers.is_empty()).then(|| describe(&blockers))
                }
            }
        };
        let key = order_key(machine, node, dry.own_node);
        let bytes = match (&dry.storage, node) {
            (Ok(storage), Some(n)) => storage.bytes_on(&n.name_any(), n.labels()),
            _ => None,
        };
        planned.push((PlanMachine { node: name, role, held, bytes }, key));
    }
    // The engine's own key, its name in natural order (`worker-2` before `worker-10`).
    planned.sort_by(|a, b| start_key(a).cmp(&start_key(b)));
    let plan_machines: Vec<PlanMachine> = planned.into_iter().map(|(m, _)| m).collect();
    let previous = last_completed(op, dry.operations, OperationKind::TALOS);
    let recorded = previous.map(|p| recorded(p, dry.machines));
    let Models { control_plane, worker, lead_s, reaction_s, storage, mut assumed } =
        models(recorded.as_ref(), &dry.defaults);
    match &dry.storage {
        Ok(_) => assumed.extend(describe_storage(&plan_machines, storage)),
        Err(why) => assumed.push(format!("storage: not read ({why}): evacuations as the recorded turns had them")),
    }
    for line in warned {
        assumed.push(format!("preflight Warn: started despite {line}"));
    }
    if on_target > 0 {
        assumed.push(format!("{on_target} machines already run {target}: nothing to do for them"));
    }
    let input = PlanInput {
        machines: &plan_machines,
        control_plane,
        worker,
        lead_s,
        reaction_s,
        storage,
        max_unavailable: workers_at_once(op, &machines),
        runs: DEFAULT_RUNS,
        seed: seed(&op.uid().unwrap_or_else(|| op.name_any())),
    };
    let planned = plan(&input);
    let windows = windows(dry, &planned, &input)?;
    Ok(PlanStatus { windows, gates: dry.gates.clone(), ..to_status(planned, previous, assumed) })
}

/// The health gates of `specs` as a dry run reports them: each read now through `kube`
/// (every call within `bound`), as the upgrade's pass would read it; the silences of the
/// operation `identity` seen through.
///
/// # Errors
/// A [`Refusal`] (`InvalidGate`) for gates that do not read, as the upgrade itself would
/// be refused.
pub async fn read_gates(
    kube: &dyn ichor_executor::kube_api::KubeApi,
    bound: std::time::Duration,
    specs: &[ichor_upgrade_core::gate::GateSpec],
    identity: &str,
) -> Result<Vec<PlanGate>, Refusal> {
    use ichor_upgrade_core::gate::GateReading;
    let checked = ichor_executor::health_gates::compile(specs).map_err(|problem| Refusal {
        reason: "InvalidGate",
        message: format!("spec.gates: {problem}; nothing was read or changed"),
    })?;
    let mut gates = Vec::new();
    for gate in &checked.compiled {
        let reading = ichor_executor::health_gates::read(kube, bound, gate, identity).await;
        let spec = gate.spec();
        let phase = serde_json::to_value(spec.phase).ok().and_then(|v| v.as_str().map(str::to_owned));
        let (holds, message) = match reading {
            GateReading::Holds if spec.settle_seconds > 0 => {
                (true, format!("holds now; it must hold {} s without a break to pass", spec.settle_seconds))
            }
            GateReading::Holds => (true, "holds now".to_owned()),
            GateReading::Fails { object, value } => (false, format!("does not hold on {object}: {value}")),
            GateReading::NotRead { why } => (false, format!("not read: {why}")),
        };
        gates.push(PlanGate { name: spec.name.clone(), phase: phase.unwrap_or_default(), holds, message });
    }
    Ok(gates)
}

/// How `planned`, planned from `input`, goes through the dry run's maintenance windows
/// from its instant and its lead ([`ichor_upgrade_core::plan::Plan::through_windows`]).
///
/// # Errors
/// A [`Refusal`] (`InvalidMaintenance`) for windows that do not read, as the upgrade
/// itself would be refused.
pub fn windows(
    dry: &DryRun<'_>,
    planned: &ichor_upgrade_core::plan::Plan,
    input: &PlanInput<'_>,
) -> Result<Option<PlanWindows>, Refusal> {
    let Some(spec) = dry.maintenance.filter(|m| !m.is_empty()) else { return Ok(None) };
    let calendar = ichor_executor::calendar::calendar(spec, dry.now).map_err(|problem| Refusal {
        reason: "InvalidMaintenance",
        message: format!("spec.maintenance: {problem}; nothing was read or changed"),
    })?;
    let seconds = |s: f64| std::time::Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(std::time::Duration::MAX);
    let p90 = TurnP90 { control_plane: seconds(input.control_plane.p90()), worker: seconds(input.worker.p90()) };
    let from = dry.now.saturating_add(seconds(input.lead_s));
    Ok(Some(match planned.through_windows(&calendar, from, p90, input.max_unavailable) {
        Some(fitted) => PlanWindows {
            needed: Some(i64::try_from(fitted.windows).unwrap_or(i64::MAX)),
            finish: Some(fitted.finish.rfc3339()),
            message: format!(
                "the median run needs {} maintenance window{}, its last turn ending at {}",
                fitted.windows,
                if fitted.windows == 1 { "" } else { "s" },
                fitted.finish.rfc3339()
            ),
        },
        None => PlanWindows {
            needed: None,
            finish: None,
            message: format!(
                "a turn's p90 (control plane {} s, worker {} s) is longer than every maintenance window of the next {} days: no machine would start",
                p90.control_plane.as_secs(),
                p90.worker.as_secs(),
                ichor_executor::calendar::HORIZON.as_secs() / 86_400
            ),
        },
    }))
}

/// The start key of `machine` (on `node`): last when it is the operator's own node, then
/// its order label, then its name, as the engine orders its starts.
fn order_key(machine: &TalosMachine, node: Option<&Node>, own_node: Option<&str>) -> (bool, bool, i64, String) {
    let last = own_node.is_some() && node.map(ResourceExt::name_any).as_deref() == own_node;
    let name = machine.name_any();
    let order =
        ichor_upgrade_core::rollout::start_order(machine.labels().get(ORDER_LABEL).map(String::as_str), last, &name);
    (order.0, order.1, order.2, order.3.0.to_owned())
}

/// The status of `planned`, drawn from the turns of `previous` (none: defaults), with what
/// it `assumed`.
fn to_status(
    planned: ichor_upgrade_core::plan::Plan,
    previous: Option<&TalosOperation>,
    assumed: Vec<String>,
) -> PlanStatus {
    PlanStatus {
        p10_seconds: planned.p10_s,
        p50_seconds: planned.p50_s,
        p90_seconds: planned.p90_s,
        bound_seconds: planned.bound_s,
        runs: i64::try_from(planned.runs).unwrap_or(i64::MAX),
        order: planned.order,
        held: planned.held.into_iter().map(|h| PlanHeld { machine: h.node, reason: h.reason }).collect(),
        history: previous.map(ResourceExt::name_any),
        assumed,
        median_run: planned
            .median_run
            .into_iter()
            .map(|t| PlannedMachine {
                machine: t.node,
                role: t.role.as_str().to_owned(),
                start_seconds: t.start_s,
                end_seconds: t.end_s,
            })
            .collect(),
        phases: planned
            .phases
            .into_iter()
            .map(|f| PlanPhase {
                role: f.role.as_str().to_owned(),
                phase: f.phase,
                samples: i64::try_from(f.samples).unwrap_or(i64::MAX),
                p10_seconds: f.p10_s,
                p50_seconds: f.p50_s,
                p90_seconds: f.p90_s,
                recorded: f.recorded,
            })
            .collect(),
        kubernetes: None,
        windows: None,
        gates: Vec::new(),
    }
}

/// A seed from `text` (FNV-1a): the same operation plans the same.
fn seed(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The calibration `op` (a real upgrade) should record, when it completed after a dry run
/// of its cluster that planned it and has none yet: the latest planned dry run made
/// before it.
#[must_use]
pub fn calibration(op: &TalosOperation, operations: &[Arc<TalosOperation>]) -> Option<Calibration> {
    if op.spec.dry_run || (op.spec.kind != OperationKind::TALOS && op.spec.kind != OperationKind::KUBERNETES) {
        return None;
    }
    if op.status.as_ref().is_some_and(|s| s.calibration.is_some()) {
        return None;
    }
    let end = completed_at(op)?;
    let start = op.creation_timestamp()?.0.as_millisecond();
    let made = op.creation_timestamp().map(|t| t.0);
    let dry = operations
        .iter()
        .map(AsRef::as_ref)
        .filter(|o| o.namespace() == op.namespace() && o.spec.cluster == op.spec.cluster && o.spec.dry_run)
        .filter(|o| o.spec.kind == op.spec.kind)
        .filter(|o| o.creation_timestamp().map(|t| t.0) <= made)
        .filter(|o| o.status.as_ref().is_some_and(|s| s.plan.is_some()))
        .max_by_key(|o| o.creation_timestamp().map(|t| t.0))?;
    let plan = dry.status.as_ref()?.plan.as_ref()?;
    #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
    let actual = (end - start) as f64 / 1000.0;
    let error_percent =
        if plan.p50_seconds > 0.0 { (actual - plan.p50_seconds) / plan.p50_seconds * 100.0 } else { 0.0 };
    Some(Calibration {
        plan: dry.name_any(),
        p10_seconds: plan.p10_seconds,
        p50_seconds: plan.p50_seconds,
        p90_seconds: plan.p90_seconds,
        actual_seconds: actual,
        error_percent: (error_percent * 10.0).round() / 10.0,
        within_band: plan.p10_seconds <= actual && actual <= plan.p90_seconds,
    })
}

/// The status a dry run writes: Completed with its plan, or Refused.
#[must_use]
pub fn status_patch(op: &TalosOperation, planned: &Result<PlanStatus, Refusal>, now: Time) -> serde_json::Value {
    let condition = |type_: &str, on: bool, reason: &str, message: &str| Condition {
        type_: type_.to_owned(),
        status: if on { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: now.clone(),
        observed_generation: op.metadata.generation,
    };
    let (phase, reason, message, plan) = match planned {
        Ok(plan) => {
            let held = if plan.held.is_empty() { String::new() } else { format!("; {} held now", plan.held.len()) };
            let mut message = format!(
                "planned (nothing touched): makespan p10 {:.0} s, p50 {:.0} s, p90 {:.0} s; {} machines{held}",
                plan.p10_seconds,
                plan.p50_seconds,
                plan.p90_seconds,
                plan.order.len()
            );
            if let Some(found) = &plan.kubernetes {
                message.push_str(&format!("; {} component changes", found.changes.len()));
                if !found.refusals.is_empty() {
                    let reasons: Vec<&str> = found.refusals.iter().map(|r| r.reason.as_str()).collect();
                    message.push_str(&format!("; the upgrade would be refused: {}", reasons.join(", ")));
                }
            }
            ("Completed", PLANNED, message, Some(plan))
        }
        Err(refusal) => ("Refused", refusal.reason, refusal.message.clone(), None),
    };
    let done = phase == "Completed";
    let conditions = vec![
        condition("Ready", done, if done { reason } else { phase }, &message),
        condition("Reconciling", false, phase, &message),
        condition("Stalled", !done, if done { phase } else { reason }, &message),
        condition("Completed", done, if done { reason } else { phase }, &message),
        condition("Refused", !done, if done { phase } else { reason }, &message),
    ];
    serde_json::json!({
        "phase": phase,
        "reason": reason,
        "message": message,
        "observedGeneration": op.metadata.generation,
        "conditions": conditions,
        "plan": plan,
    })
}

/// Whether `op` is a dry run whose plan is for its current generation already.
#[must_use]
pub fn planned_already(op: &TalosOperation) -> bool {
    op.status.as_ref().is_some_and(|s| {
        s.observed_generation == op.metadata.generation && matches!(s.phase.as_deref(), Some("Completed" | "Refused"))
    })
}

/// The engine's order of a planned machine: control planes first, then its start key, its
/// name in natural order (`worker-2` before `worker-10`).
fn start_key(planned: &(PlanMachine, (bool, bool, i64, String))) -> (bool, bool, bool, i64, NameOrder<'_>) {
    let (m, (last, unordered, order, name)) = planned;
    (m.role != MachineRole::ControlPlane, *last, *unordered, *order, NameOrder(name.as_str()))
}

/// How many workers `op` lets be unavailable at once among the cluster's `machines` (a
/// percentage is of their workers); 1 for a value the engine would refuse.
pub(crate) fn workers_at_once(op: &TalosOperation, machines: &[&TalosMachine]) -> usize {
    let workers = machines.iter().filter(|m| m.spec.role == Role::Worker).count();
    op.spec.max_unavailable.validate().map_or(1, |limit| usize::try_from(limit.of(workers)).unwrap_or(usize::MAX))
}

pub mod kubernetes;

#[cfg(test)]
mod tests;
