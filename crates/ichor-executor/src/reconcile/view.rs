//! What the pass shows the rollout engine of its observation ([`Shown`], built by
//! [`show`]): each machine's view, judged against the operation's target ([`Judge`]), the
//! operation's view, the Nodes no machine names, and for a Kubernetes upgrade what its
//! planning and its gates read; and what the pass's later stages share of it all
//! ([`Pass`]).

use std::collections::BTreeSet;

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::etcd::snapshot::SnapshotState;
use ichor_upgrade_core::evacuation::STORAGE_EVACUATION;
use ichor_upgrade_core::gate::{GateSpec, Gates};
use ichor_upgrade_core::machine::kubernetes::{KubernetesStage, kubernetes_stage, past_apply, stage_converged};
use ichor_upgrade_core::machine::talos::{ConvergedOn, UpgradeTarget};
use ichor_upgrade_core::operation::{
    CONTROLLER_NODE_MARK, HOLD_ANNOTATION, ORDER_LABEL, PAUSE_ANNOTATION, RESUME_ANNOTATION, SnapshotMode,
};
use ichor_upgrade_core::rollout::{
    ComponentsVerdict, EtcdVerdict, KubernetesInput, MachineView, OperationView, PreflightVerdict, RolloutInput,
};
use ichor_upgrade_core::status::{MachineProgress, OperationStatus, Phase};
use ichor_upgrade_core::versions::KubernetesVersion;
use ichor_upgrade_core::window::Windows;

use super::gates::gather_components;
use super::memory::ViewCache;
use super::observe::{Observation, Observed, past_the_point_of_no_return, upgrade_target};
use super::observe_kubernetes::kubernetes_input;
use crate::alert_gates::AlertGate;
use crate::calls::Executor;
use crate::health_gates::GatesRead;
use crate::kube_api::{MachineInfo, OperationInfo};

/// How this pass judges a machine's convergence and progress: against a Talos upgrade's
/// target, a Kubernetes upgrade's target and stage, or as a removal.
#[derive(Clone, Copy)]
pub(super) struct Judge<'a> {
    removal: bool,
    /// A Kubernetes upgrade's target and stage.
    kubernetes: Option<&'a (KubernetesVersion, KubernetesStage)>,
    /// A Talos upgrade's target, as each machine records its convergence on it.
    converged_on: Option<&'a ConvergedOn>,
    status: &'a OperationStatus,
}

impl Judge<'_> {
    /// Whether the machine's own conditions record it converged for this operation.
    pub(super) fn converged(&self, m: &MachineInfo) -> bool {
        match self.kubernetes {
            Some((target, stage)) => stage_converged(&m.conditions, target, *stage),
            None => self.converged_on.is_some_and(|c| c.recorded(&m.conditions)),
        }
    }

    /// The machine's progress, from its record and its own conditions.
    fn progress(&self, o: &Observed) -> MachineProgress {
        match self.kubernetes {
            Some((target, stage)) => self.status.kubernetes_progress_of(
                &o.machine.name,
                past_apply(&o.machine.conditions, target, *stage),
                stage_converged(&o.machine.conditions, target, *stage),
            ),
            None => self.status.progress_of(
                &o.machine.name,
                past_the_point_of_no_return(self.removal, &o.machine),
                o.machine.conditions.is_true(STORAGE_EVACUATION),
                self.converged(&o.machine),
            ),
        }
    }

    /// The machine as the engine sees it.
    fn view(&self, o: &Observed) -> MachineView {
        let held = o.machine.annotations.contains_key(HOLD_ANNOTATION)
            || o.node.as_ref().is_some_and(|n| n.annotations.contains_key(HOLD_ANNOTATION));
        MachineView {
            name: o.machine.name.clone(),
            role: o.machine.role,
            order_label: o.machine.labels.get(ORDER_LABEL).cloned(),
            held,
            node_ready: o.node.as_ref().is_some_and(|n| n.ready),
            os_image: o.node.as_ref().map(|n| n.os_image.clone()),
            progress: self.progress(o),
            last: o.machine.labels.contains_key(CONTROLLER_NODE_MARK),
        }
    }
}

/// What the pass shows the rollout engine, beside the machines' views (kept in the
/// [`ViewCache`] across passes).
pub(super) struct Shown {
    /// A Kubernetes upgrade's target and stage, read from the machines' own records.
    pub(super) kubernetes: Option<(KubernetesVersion, KubernetesStage)>,
    /// A Talos upgrade's target, as each machine records its convergence on it.
    converged_on: Option<ConvergedOn>,
    /// The target every machine of a Talos upgrade goes to, or why it cannot be named.
    pub(super) target: Result<UpgradeTarget, String>,
    /// The operation as the engine sees it.
    pub(super) view: OperationView,
    /// The Nodes of the cluster no machine names.
    unaccounted: Vec<String>,
    /// A Kubernetes upgrade's input (`None` when what it needs could not be read).
    kubernetes_input: Option<KubernetesInput>,
    /// The control planes' components, read at every pass of a Kubernetes upgrade.
    components: ComponentsVerdict,
    /// For a Kubernetes upgrade, the oldest kube-apiserver its control planes run.
    api_servers: Option<KubernetesVersion>,
    /// The maintenance windows an upgrade's starts keep to, expanded at `now`.
    windows: Option<Windows>,
    /// The health gates an upgrade keeps to, with what each read in this pass.
    gates: Option<Gates>,
    /// The alert gates that silence the machines in their turn.
    silencing: Vec<(GateSpec, AlertGate)>,
    /// When the pass observed.
    pub(super) now: Timestamp,
}

/// A Kubernetes upgrade's target and stage: the target it started with (a started
/// operation goes on with it: a spec whose target changed is refused, and what is under
/// way is seen to its verification on the first target, never judged against the new
/// one, issue 53 item 1), and the stage its machines' records show.
fn kubernetes_work(seen: &Observation) -> Option<(KubernetesVersion, KubernetesStage)> {
    let spec = seen.op.spec.validate_kubernetes().ok()?;
    let target = seen
        .status
        .started_target
        .as_deref()
        .and_then(|t| KubernetesVersion::parse(t.trim_start_matches('v')).ok())
        .unwrap_or(spec.target);
    let stage = kubernetes_stage(seen.observed.iter().map(|o| (o.machine.role, &o.machine.conditions)), &target);
    Some((target, stage))
}

/// Stage "observe", its end: the machines' views brought up to date in `cache`, and what
/// else the engine is shown, read once for the pass.
pub(super) async fn show(ex: &Executor<'_>, seen: &Observation, cache: &mut ViewCache) -> Shown {
    let Observation { op, cluster, observed, status, .. } = seen;
    let removal = op.spec.is_removal();
    let target = upgrade_target(cluster, &op.spec);
    let kubernetes = kubernetes_work(seen);
    // An upgrade's converged machines are recorded in their own conditions, for this target.
    let converged_on =
        target.as_ref().ok().filter(|_| !removal && !op.spec.is_kubernetes()).map(|t| ConvergedOn::new(&t.version));
    let judge = Judge { removal, kubernetes: kubernetes.as_ref(), converged_on: converged_on.as_ref(), status };
    let key = (removal, converged_on.clone(), kubernetes.clone());
    cache.refresh(key, observed, status, |o| judge.view(o), |o| judge.progress(o));
    debug_assert_eq!(cache.views, observed.iter().map(|o| judge.view(o)).collect::<Vec<_>>(), "a kept view is stale");
    let view = OperationView {
        identity: op.identity.clone(),
        generation: op.generation,
        deleting: op.deleting,
        resume_token: op.annotations.get(RESUME_ANNOTATION).cloned(),
        pause_requested: op.annotations.get(PAUSE_ANNOTATION).cloned(),
        spec: op.spec.clone(),
        status: status.clone(),
    };
    let now = ex.clock.now();
    // A Node of the cluster that no machine names (as far as this pass knows the machines'
    // node names: one it could not learn names none) is never left behind unsaid.
    let named: BTreeSet<&str> = observed.iter().filter_map(Observed::node_name).collect();
    let unaccounted: Vec<String> = cluster.nodes.iter().filter(|n| !named.contains(n.as_str())).cloned().collect();
    let kubernetes_input = match &kubernetes {
        Some((target, stage)) => {
            let snapshot_missing = op.spec.etcd_snapshot.unwrap_or_default() == SnapshotMode::Required
                && status.etcd_snapshot.as_ref().and_then(SnapshotState::taken).is_none();
            kubernetes_input(ex, observed, status, &cache.views, (target, *stage), snapshot_missing).await
        }
        None => None,
    };
    // A Kubernetes upgrade reads the control planes' components at every pass: each apply
    // is judged against them (no other control plane's component down, no kubelet newer
    // than the oldest API server). A Talos upgrade reads them with the etcd gate.
    let (components, api_servers) = match &kubernetes {
        Some(_) => gather_components(ex, observed).await,
        None => (ComponentsVerdict::NotChecked, None),
    };
    let windows = maintenance_windows(ex, seen, now);
    let (gates, silencing) = match health_gates(ex, seen).await {
        Some(read) => (Some(read.gates), read.silencing),
        None => (None, Vec::new()),
    };
    Shown {
        kubernetes,
        converged_on,
        target,
        view,
        unaccounted,
        kubernetes_input,
        components,
        api_servers,
        windows,
        gates,
        silencing,
        now,
    }
}

/// The health gates of an upgrade (the operation's own, else its cluster's), each read
/// now, until the operation completed (a completion is sticky). A refused operation reads
/// them too: gates corrected after a refusal are kept to, never skipped. A removal keeps
/// to none.
async fn health_gates(ex: &Executor<'_>, seen: &Observation) -> Option<GatesRead> {
    if seen.op.spec.is_removal() || seen.status.phase == Phase::Completed {
        return None;
    }
    let specs = seen.op.gates.as_ref().unwrap_or(&seen.cluster.gates);
    crate::health_gates::gates(ex, specs, &seen.op.identity).await
}

/// The maintenance windows of an upgrade (the operation's own, else its cluster's),
/// expanded at `now`, admitting starts on the configuration's p90 turns (which the
/// operator takes from the cluster's last upgrade). A removal keeps to none.
fn maintenance_windows(ex: &Executor<'_>, seen: &Observation, now: Timestamp) -> Option<Windows> {
    if seen.op.spec.is_removal() {
        return None;
    }
    let spec = seen.op.maintenance.as_ref().or(seen.cluster.maintenance.as_ref()).filter(|s| !s.is_empty())?;
    crate::calendar::windows(spec, now, ex.config.turn_p90)
}

impl Shown {
    /// The rollout engine's input, before any gate is gathered.
    pub(super) fn input<'a>(
        &'a self,
        ex: &'a Executor<'_>,
        seen: &'a Observation,
        views: &'a [MachineView],
    ) -> RolloutInput<'a> {
        RolloutInput {
            kubernetes: self.kubernetes_input.as_ref(),
            operation: &self.view,
            release_talos_version: &seen.cluster.release_talos_version,
            releases: &seen.cluster.releases,
            kubernetes_version: &seen.cluster.kubernetes_version,
            lease: seen.holder.as_ref(),
            machines: views,
            unaccounted_nodes: &self.unaccounted,
            etcd: &EtcdVerdict::NotChecked,
            components: &self.components,
            preflight: &PreflightVerdict::NotChecked,
            windows: self.windows.as_ref(),
            gates: self.gates.as_ref(),
            config: &ex.config.rollout,
            now: self.now,
        }
    }

    /// What the pass's stages after the observation share.
    pub(super) fn pass<'p>(
        &'p self,
        ex: &'p Executor<'p>,
        name: &'p str,
        seen: &'p Observation,
        views: &'p [MachineView],
    ) -> Pass<'p> {
        let removal = seen.op.spec.is_removal();
        let judge = Judge {
            removal,
            kubernetes: self.kubernetes.as_ref(),
            converged_on: self.converged_on.as_ref(),
            status: &seen.status,
        };
        // The nodes of the machines past their disruptive call (down, or about to be): every
        // machine is judged by the preflight as one more beside them (issue 29 item 10).
        let down: Vec<&str> = seen
            .observed
            .iter()
            .filter(|o| past_the_point_of_no_return(removal, &o.machine) && !judge.converged(&o.machine))
            .filter_map(Observed::node_name)
            .collect();
        Pass {
            ex,
            name,
            op: &seen.op,
            observed: &seen.observed,
            status: &seen.status,
            removal,
            down,
            kubernetes: self.kubernetes.as_ref(),
            api_servers: self.api_servers.as_ref(),
            judge,
            views,
            target: &self.target,
            silencing: &self.silencing,
            now: self.now,
        }
    }
}

/// What a pass observed, as its stages after the observation share it.
pub(super) struct Pass<'p> {
    pub(super) ex: &'p Executor<'p>,
    pub(super) name: &'p str,
    pub(super) op: &'p OperationInfo,
    pub(super) observed: &'p [Observed],
    /// The operation's status, for its generation.
    pub(super) status: &'p OperationStatus,
    pub(super) removal: bool,
    /// The nodes of the machines past their disruptive call and not converged.
    pub(super) down: Vec<&'p str>,
    /// A Kubernetes upgrade's target and stage.
    pub(super) kubernetes: Option<&'p (KubernetesVersion, KubernetesStage)>,
    /// For a Kubernetes upgrade, the oldest kube-apiserver its control planes run, as read
    /// in this pass.
    pub(super) api_servers: Option<&'p KubernetesVersion>,
    /// How the machines' convergence is judged.
    pub(super) judge: Judge<'p>,
    /// The machines as the engine sees them.
    pub(super) views: &'p [MachineView],
    /// A Talos upgrade's target.
    pub(super) target: &'p Result<UpgradeTarget, String>,
    /// The alert gates that silence the machines in their turn.
    pub(super) silencing: &'p [(GateSpec, AlertGate)],
    /// When the pass observed.
    pub(super) now: Timestamp,
}
