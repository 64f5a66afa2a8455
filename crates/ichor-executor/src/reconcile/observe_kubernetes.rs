//! Stage "observe", for a Kubernetes upgrade: what its planning and its steps read of
//! the cluster beyond the machines (each node's kubelet and static pods, the components'
//! flags, the deprecated APIs in use, the workloads the manifests roll out).

use std::collections::BTreeSet;

use ichor_upgrade_core::kubernetes::args::ComponentArgs;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::manifests::WorkloadRollout;
use ichor_upgrade_core::kubernetes::plan::{
    KubernetesPlanInput, KubernetesPlanProblem, NodeKubernetes, plan_kubernetes,
};
use ichor_upgrade_core::machine::kubernetes::KubernetesStage;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::rollout::{KubernetesInput, MachineView};
use ichor_upgrade_core::status::{MachineProgress, OperationStatus};
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};

use super::observe::Observed;
use crate::calls::{Executor, at_most_a_few, bounded};
use crate::kube_api::KubeError;
use crate::machine_config::MachineConfig;

/// A Kubernetes upgrade's input to the engine: its stage and, before any machine of it has
/// started, what planning finds (each node's kubelet and static pods, the deprecated APIs
/// in use, kube-proxy); while an etcd snapshot is required and missing, the control planes
/// already on the target (their turn needs none). `None` when what planning needs could
/// not be read: the engine waits, never planning from a guess.
pub(super) async fn kubernetes_input(
    ex: &Executor<'_>,
    observed: &[Observed],
    status: &OperationStatus,
    views: &[MachineView],
    (target, stage): (&KubernetesVersion, KubernetesStage),
    snapshot_missing: bool,
) -> Option<KubernetesInput> {
    let on_target = |nodes: &[NodeKubernetes]| -> BTreeSet<String> {
        nodes
            .iter()
            .filter(|n| snapshot_missing && n.role == MachineRole::ControlPlane && n.on_target(target))
            .map(|n| n.name.clone())
            .collect()
    };
    let started = !status.machines.is_empty() || views.iter().any(|v| v.progress != MachineProgress::Pending);
    if started {
        // The bootstrap manifests applied and rolling out: their workloads, read now.
        let rollouts = match status.manifests.as_ref().and_then(|m| m.rolling_out(target)) {
            Some(workloads) => read_rollouts(ex, workloads).await,
            None => None,
        };
        // The control planes' components, while a snapshot is still wanted: one already on
        // the target needs none (a control plane not read is taken to change).
        let mut control_planes = Vec::new();
        if snapshot_missing {
            for o in observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane) {
                if let Ok(Some(node)) = read_node_kubernetes(ex, o).await {
                    control_planes.push(node);
                }
            }
        }
        return Some(KubernetesInput { stage, problems: Vec::new(), rollouts, on_target: on_target(&control_planes) });
    }
    let bound = ex.config.call_timeout;
    let cluster = match bounded("read cluster Kubernetes", bound, ex.kube.cluster_kubernetes()).await {
        Ok(Ok(cluster)) => cluster,
        // The Kubernetes-upgrade grants are not bound: refused, naming them (decided again
        // each pass: binding them lifts it).
        Ok(Err(KubeError::Forbidden(what))) => {
            let problems = vec![KubernetesPlanProblem::GrantsMissing { what }];
            return Some(KubernetesInput { stage, problems, rollouts: None, on_target: BTreeSet::new() });
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "the cluster's Kubernetes could not be read: the upgrade waits");
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, "the cluster's Kubernetes could not be read: the upgrade waits");
            return None;
        }
    };
    let mut nodes = Vec::with_capacity(observed.len());
    let mut problems = Vec::new();
    for o in observed {
        match read_node_kubernetes(ex, o).await {
            Ok(Some(node)) => nodes.push(node),
            Ok(None) => problems.push(KubernetesPlanProblem::NotObserved {
                node: o.machine.name.clone(),
                component: Component::Kubelet,
            }),
            Err(()) => return None,
        }
    }
    // The manifests step needs the admin kubeconfig, which the Talos API gives os:admin
    // only (decision 0014 rule 19): a talosconfig whose certificate names other roles is
    // refused before anything changes. Credentials with no role named are left to the
    // Talos API to judge.
    if let Some(roles) = ex.talos.client_roles()
        && !roles.is_empty()
        && !roles.iter().any(|r| r == "os:admin")
    {
        problems.push(KubernetesPlanProblem::TalosconfigNotAdmin { roles });
    }
    let kube_proxy = cluster.kube_proxy.as_deref().and_then(|v| KubernetesVersion::parse(v).ok());
    let args = read_component_args(ex, observed, kube_proxy.is_some()).await?;
    let plan = plan_kubernetes(&KubernetesPlanInput {
        target,
        nodes: &nodes,
        deprecated_apis: &cluster.deprecated_apis,
        kube_proxy: kube_proxy.as_ref(),
        args: &args,
    });
    if let Err(found) = plan {
        problems.extend(found);
    }
    Some(KubernetesInput { stage, problems, rollouts: None, on_target: on_target(&nodes) })
}

/// The extra arguments every machine's configuration sets for the components it runs
/// (kube-proxy's only when Talos manages it), read at planning so that one the target
/// removes is refused before anything is touched (issue 53 item 11). `None`: a
/// configuration was not read (logged): nothing is planned without it.
pub(super) async fn read_component_args(
    ex: &Executor<'_>,
    observed: &[Observed],
    kube_proxy: bool,
) -> Option<Vec<ComponentArgs>> {
    let mut all = Vec::new();
    // A few reads at a time: a large cluster's planning waits on its slowest node, not on
    // the sum of them all, and no server is asked by hundreds of reads at once.
    for sets in at_most_a_few(observed.iter().map(|o| read_args_of(ex, o, kube_proxy))).await {
        all.extend(sets?);
    }
    Some(all)
}

/// One machine's extra arguments, for the components it runs (see
/// [`read_component_args`]).
pub(super) async fn read_args_of(ex: &Executor<'_>, o: &Observed, kube_proxy: bool) -> Option<Vec<ComponentArgs>> {
    let name = &o.machine.name;
    let bound = ex.config.call_timeout;
    let read = bounded("read machine config", bound, ex.talos.machine_config(&o.machine.address)).await;
    let config = match read {
        Ok(Ok(bytes)) => MachineConfig::parse(&bytes).map_err(|e| e.to_string()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(error) => Err(error.to_string()),
    };
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            tracing::warn!(machine = %name, %error, "its configuration could not be read: the upgrade waits");
            return None;
        }
    };
    let components: &[Component] = match o.machine.role {
        MachineRole::ControlPlane => &Component::ALL,
        MachineRole::Worker => &[Component::Kubelet],
    };
    let sets = components
        .iter()
        .filter(|c| kube_proxy || **c != Component::KubeProxy)
        .map(|c| ComponentArgs { node: name.clone(), component: *c, args: config.extra_args(*c) })
        .filter(|set| !set.args.is_empty())
        .collect();
    Some(sets)
}

/// A machine's Kubernetes as planning reads it: its Talos version (from its Node), its
/// kubelet's and static pods' versions. `Ok(None)`: not observed (no Node, or its Talos
/// unreadable); `Err`: the read failed (logged), so nothing can be planned from it now.
pub(super) async fn read_node_kubernetes(ex: &Executor<'_>, o: &Observed) -> Result<Option<NodeKubernetes>, ()> {
    let name = o.machine.name.clone();
    let talos = o.node.as_ref().and_then(|n| TalosVersion::from_os_image(&n.os_image).ok());
    let seen = match o.node_name() {
        Some(node) => {
            match bounded("read Node's Kubernetes", ex.config.call_timeout, ex.kube.node_kubernetes(node)).await {
                Ok(Ok(seen)) => seen,
                Ok(Err(error)) => {
                    tracing::warn!(machine = %name, %error, "its Kubernetes could not be read: the upgrade waits");
                    return Err(());
                }
                Err(error) => {
                    tracing::warn!(machine = %name, %error, "its Kubernetes could not be read: the upgrade waits");
                    return Err(());
                }
            }
        }
        None => None,
    };
    let (Some(talos), Some(seen)) = (talos, seen) else { return Ok(None) };
    let control_plane =
        seen.static_pods.iter().filter_map(|(component, pod)| pod.version.clone().map(|v| (*component, v))).collect();
    Ok(Some(NodeKubernetes {
        name,
        role: o.machine.role,
        talos,
        kubelet: KubernetesVersion::parse(&seen.kubelet_version).ok(),
        control_plane,
    }))
}

/// The rollouts of the bootstrap manifests' `workloads` (`Kind namespace/name`); `None`
/// when one could not be read (the engine looks again, never guessing it done).
pub(super) async fn read_rollouts(ex: &Executor<'_>, workloads: &[String]) -> Option<Vec<WorkloadRollout>> {
    let mut rollouts = Vec::with_capacity(workloads.len());
    for workload in workloads {
        match bounded("read a workload's rollout", ex.config.call_timeout, ex.kube.workload_rollout(workload)).await {
            Ok(Ok(rollout)) => rollouts.push(rollout),
            Ok(Err(error)) => {
                tracing::warn!(%workload, %error, "its rollout could not be read");
                return None;
            }
            Err(error) => {
                tracing::warn!(%workload, %error, "its rollout could not be read");
                return None;
            }
        }
    }
    Some(rollouts)
}
