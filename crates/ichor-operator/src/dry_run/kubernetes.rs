//! A Kubernetes upgrade's dry run (`spec.dryRun: true`, kind `kubernetes`): what
//! `talosctl upgrade-k8s --dry-run` reports, and more (issue 55 item 4). Written in the
//! operation's `status.plan`:
//!
//! - each component that would change, on each node, from which version
//!   (`plan.kubernetes.changes`);
//! - the APIs the target removes that are still in use, requested or stored
//!   (`plan.kubernetes.removedApis`);
//! - the flags, feature gates and admission plugins the target removes that the machines'
//!   configurations still set (`plan.kubernetes.removedFlags`);
//! - every reason the upgrade would be refused (`plan.kubernetes.refusals`): a dry run is a
//!   report, so it lists them all beside the rest instead of stopping at the first;
//! - a calibrated plan of its makespan, from the machines' turns in the cluster's last
//!   completed Kubernetes upgrade, else in its last Talos upgrade, else default durations,
//!   and `plan.assumed` says which.
//!
//! What it reads, as the engine's planning reads it: the Nodes' kubelets and the control
//! planes' mirror pods, the API servers' deprecated-API metrics and stored objects,
//! kube-proxy's DaemonSet, and each machine's configuration through the Talos API (a read,
//! as `talosctl get machineconfig`). What it must not do: write anything but the
//! operation's status, or call any Talos API that changes a machine.

use std::sync::Arc;
use std::time::Duration;

use ichor_adapters::kubernetes::crd::{
    KubernetesPlanned, PlanRefusal, PlanStatus, PlannedChange, PlannedRemovedApi, PlannedRemovedFlag, TalosMachine,
};
use ichor_executor::kube_api::KubeApi;
use ichor_executor::machine_config::MachineConfig;
use ichor_executor::{KubeError, TalosApi};
use ichor_upgrade_core::kubernetes::args::ComponentArgs;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::dry_run::{KubernetesFindings, findings};
use ichor_upgrade_core::kubernetes::plan::{
    ApiUseSeenAs, DeprecatedApiUse, KubernetesPlanInput, KubernetesPlanProblem, NodeKubernetes,
};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::{HOLD_ANNOTATION, OperationKind};
use ichor_upgrade_core::plan::{DEFAULT_RUNS, Models, PlanInput, PlanMachine, models, plan};
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::{
    DryRun, Refusal, last_completed, node_of, order_key, recorded, seed, start_key, to_status, windows, workers_at_once,
};
use crate::recorded::machines_of;

/// What a Kubernetes dry run read of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubernetesRead {
    /// Each machine's Kubernetes (by the machine's name): its kubelet, and on a control
    /// plane its static pods. A machine missing here was not observed.
    pub nodes: Vec<NodeKubernetes>,
    /// Deprecated APIs in use, with the release that removes each.
    pub deprecated_apis: Vec<DeprecatedApiUse>,
    /// The version kube-proxy runs, when Talos manages it.
    pub kube_proxy: Option<KubernetesVersion>,
    /// The extra arguments each machine's configuration sets for its components.
    pub args: Vec<ComponentArgs>,
    /// The machines whose configuration could not be read, and why: their removed flags
    /// are not checked, and the plan says so.
    pub unread: Vec<(String, String)>,
}

/// Why a Kubernetes dry run read nothing to plan from.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Refused for good (the grants are not bound): the dry run is Refused, naming why.
    #[error("{}", .0.message)]
    Refused(Refusal),
    /// A read failed: tried again.
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// Reads what a Kubernetes dry run of `machines` plans from, each call within `bound`.
///
/// # Errors
/// [`ReadError::Refused`] when the operator may not make the reads (the
/// Kubernetes-upgrade grants are not bound); [`ReadError::Kube`] when a read failed.
pub async fn read(
    kube: &dyn KubeApi,
    talos: &dyn TalosApi,
    machines: &[&TalosMachine],
    nodes: &[Arc<Node>],
    bound: Duration,
) -> Result<KubernetesRead, ReadError> {
    let cluster = match within("read cluster Kubernetes", bound, kube.cluster_kubernetes()).await {
        Ok(cluster) => cluster,
        Err(KubeError::Forbidden(what)) => {
            let problem = KubernetesPlanProblem::GrantsMissing { what };
            return Err(ReadError::Refused(Refusal { reason: problem.reason(), message: problem.to_string() }));
        }
        Err(e) => return Err(e.into()),
    };
    let mut read = KubernetesRead {
        deprecated_apis: cluster.deprecated_apis,
        kube_proxy: cluster.kube_proxy.as_deref().and_then(|v| KubernetesVersion::parse(v).ok()),
        ..KubernetesRead::default()
    };
    for machine in machines {
        let name = machine.name_any();
        let role = MachineRole::from(machine.spec.role);
        let node = node_of(machine, nodes);
        let talos_version = node
            .and_then(|n| n.status.as_ref()?.node_info.as_ref().map(|i| i.os_image.clone()))
            .and_then(|image| TalosVersion::from_os_image(&image).ok());
        if let (Some(node), Some(talos_version)) = (node, talos_version) {
            let seen = within("read Node's Kubernetes", bound, kube.node_kubernetes(&node.name_any())).await?;
            if let Some(seen) = seen {
                read.nodes.push(NodeKubernetes {
                    name: name.clone(),
                    role,
                    talos: talos_version,
                    kubelet: KubernetesVersion::parse(&seen.kubelet_version).ok(),
                    control_plane: seen
                        .static_pods
                        .iter()
                        .filter_map(|(component, pod)| pod.version.clone().map(|v| (*component, v)))
                        .collect(),
                });
            }
        }
        let config = match tokio::time::timeout(bound, talos.machine_config(&machine.spec.address)).await {
            Ok(Ok(bytes)) => MachineConfig::parse(&bytes).map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {bound:?}")),
        };
        match config {
            Ok(config) => {
                let components: &[Component] = match role {
                    MachineRole::ControlPlane => &Component::ALL,
                    MachineRole::Worker => &[Component::Kubelet],
                };
                read.args.extend(
                    components
                        .iter()
                        .filter(|c| read.kube_proxy.is_some() || **c != Component::KubeProxy)
                        .map(|c| ComponentArgs { node: name.clone(), component: *c, args: config.extra_args(*c) })
                        .filter(|set| !set.args.is_empty()),
                );
            }
            Err(why) => read.unread.push((name, why)),
        }
    }
    Ok(read)
}

/// `call` within `bound`: one that takes longer is an unreachable API server (tried
/// again).
async fn within<T>(
    call: &str,
    bound: Duration,
    future: impl Future<Output = Result<T, KubeError>>,
) -> Result<T, KubeError> {
    tokio::time::timeout(bound, future)
        .await
        .unwrap_or_else(|_| Err(KubeError::Unreachable(format!("{call}: no answer within {bound:?}"))))
}

/// The plan of a Kubernetes dry run: its findings and its timing.
///
/// # Errors
/// A [`Refusal`] when its target does not parse.
pub fn plan_status(dry: &DryRun<'_>, read: &KubernetesRead) -> Result<PlanStatus, Refusal> {
    let op = dry.operation;
    let target = KubernetesVersion::parse(&op.spec.target_version).map_err(|e| Refusal {
        reason: "InvalidTarget",
        message: format!("spec.targetVersion {:?}: {e}", op.spec.target_version),
    })?;
    let machines = machines_of(op, dry.machines);
    // Every machine of the cluster not observed is a refusal, as planning has it.
    let mut problems: Vec<KubernetesPlanProblem> = machines
        .iter()
        .filter(|m| !read.nodes.iter().any(|n| n.name == m.name_any()))
        .map(|m| KubernetesPlanProblem::NotObserved { node: m.name_any(), component: Component::Kubelet })
        .collect();
    let found = findings(&KubernetesPlanInput {
        target: &target,
        nodes: &read.nodes,
        deprecated_apis: &read.deprecated_apis,
        kube_proxy: read.kube_proxy.as_ref(),
        args: &read.args,
    });
    problems.extend(found.refusals.iter().cloned());
    let changing = found.nodes_changing();
    let mut planned: Vec<(PlanMachine, (bool, bool, i64, String))> = Vec::new();
    for machine in machines.iter().filter(|m| changing.contains(&m.name_any().as_str())) {
        let node = node_of(machine, dry.nodes);
        let held = if machine.annotations().contains_key(HOLD_ANNOTATION) {
            Some(format!("held by the annotation {HOLD_ANNOTATION} on the TalosMachine"))
        } else {
            node.filter(|n| n.annotations().contains_key(HOLD_ANNOTATION))
                .map(|n| format!("held by the annotation {HOLD_ANNOTATION} on Node {}", n.name_any()))
        };
        let role = MachineRole::from(machine.spec.role);
        // A Kubernetes upgrade evacuates no storage.
        let key = order_key(machine, node, dry.own_node);
        planned.push((PlanMachine { node: machine.name_any(), role, held, bytes: Some(0) }, key));
    }
    planned.sort_by(|a, b| start_key(a).cmp(&start_key(b)));
    let plan_machines: Vec<PlanMachine> = planned.into_iter().map(|(m, _)| m).collect();
    // The durations: the last Kubernetes upgrade's turns, else the last Talos upgrade's.
    let (previous, from) = match last_completed(op, dry.operations, OperationKind::KUBERNETES) {
        Some(previous) => (Some(previous), None),
        None => {
            let talos = last_completed(op, dry.operations, OperationKind::TALOS);
            let said = match talos {
                Some(t) => format!(
                    "durations: no Kubernetes upgrade of this cluster is recorded: the turns of its last Talos \
                     upgrade, {}, which reinstall and reboot each machine (a Kubernetes turn only restarts its \
                     components: likely shorter)",
                    t.name_any()
                ),
                None => "durations: no upgrade of this cluster is recorded: a Talos upgrade's default phases \
                         (a Kubernetes turn only restarts its components: likely shorter)"
                    .to_owned(),
            };
            (talos, Some(said))
        }
    };
    let recorded = previous.map(|p| recorded(p, dry.machines));
    let Models { control_plane, worker, lead_s, reaction_s, storage, mut assumed } =
        models(recorded.as_ref(), &dry.defaults);
    assumed.extend(from);
    for (machine, why) in &read.unread {
        assumed
            .push(format!("flags: {machine}'s configuration was not read ({why}): its removed flags are not checked"));
    }
    let on_target = machines.len().saturating_sub(changing.len());
    if on_target > 0 {
        assumed.push(format!("{on_target} machines already run Kubernetes {target}: nothing to do for them"));
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
    let mut status = PlanStatus { windows, gates: dry.gates.clone(), ..to_status(planned, previous, assumed) };
    status.kubernetes = Some(planned_of(&found, &problems));
    Ok(status)
}

/// The CRD's form of `found`, with `problems` (every refusal) as its refusals.
fn planned_of(found: &KubernetesFindings, problems: &[KubernetesPlanProblem]) -> KubernetesPlanned {
    KubernetesPlanned {
        changes: found
            .changes
            .iter()
            .map(|c| PlannedChange {
                node: c.node.clone().unwrap_or_else(|| "cluster".to_owned()),
                component: c.component.as_str().to_owned(),
                from: c.from.to_string(),
                to: c.to.to_string(),
            })
            .collect(),
        removed_apis: found
            .removed_apis
            .iter()
            .map(|a| PlannedRemovedApi {
                group: a.group.clone(),
                version: a.version.clone(),
                resource: a.resource.clone(),
                removed_release: a.removed_release.clone(),
                count: i64::try_from(a.count).unwrap_or(i64::MAX),
                seen_as: match a.seen_as {
                    ApiUseSeenAs::Requests => "Requests",
                    ApiUseSeenAs::StoredObjects => "StoredObjects",
                }
                .to_owned(),
            })
            .collect(),
        removed_flags: found
            .removed_args
            .iter()
            .map(|a| PlannedRemovedFlag {
                node: a.node.clone(),
                component: a.component.as_str().to_owned(),
                kind: a.kind.as_str().to_owned(),
                name: a.name.clone(),
                removed_release: a.removed_release.clone(),
            })
            .collect(),
        refusals: problems
            .iter()
            .map(|p| PlanRefusal { reason: p.reason().to_owned(), message: p.to_string() })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
