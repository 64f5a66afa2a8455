//! A Kubernetes upgrade's dry run: what `talosctl upgrade-k8s --dry-run` reports, and
//! more. From what planning reads ([`KubernetesPlanInput`]), every finding at once: each
//! component that would change on each node and from which version, the APIs the target
//! removes that are still in use, the arguments it removes that are still set, and every
//! reason the upgrade would be refused. A dry run is a report, so a refusal is one finding
//! among the others, not the end of it.

use crate::kubernetes::args::{RemovedArgUse, removed_args_in_use};
use crate::kubernetes::component::Component;
use crate::kubernetes::plan::{DeprecatedApiUse, KubernetesPlanInput, KubernetesPlanProblem, plan_kubernetes};
use crate::machine::vocabulary::MachineRole;
use crate::versions::KubernetesVersion;

/// One component that would change: on a node, or cluster-wide (kube-proxy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentChange {
    /// The node whose configuration changes (`None`: kube-proxy, a DaemonSet).
    pub node: Option<String>,
    /// The component.
    pub component: Component,
    /// The version it runs now.
    pub from: KubernetesVersion,
    /// The target.
    pub to: KubernetesVersion,
}

/// Everything a Kubernetes dry run finds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubernetesFindings {
    /// Each component that would change, in the order the upgrade changes them: the
    /// control planes' static pods one control plane at a time, kube-proxy, then the
    /// kubelets, control planes' first. Only components observed below the target: one
    /// on it already is left be, one above it or not observed is a refusal.
    pub changes: Vec<ComponentChange>,
    /// The APIs the target removes that are still requested, or whose stored objects only
    /// removed versions serve, sorted.
    pub removed_apis: Vec<DeprecatedApiUse>,
    /// The flags, feature gates and admission plugins the target removes that the
    /// machines' configurations still set, sorted.
    pub removed_args: Vec<RemovedArgUse>,
    /// Every reason the upgrade would be refused (the two lists above among them), in
    /// planning's order; empty: it would go.
    pub refusals: Vec<KubernetesPlanProblem>,
}

impl KubernetesFindings {
    /// The nodes with at least one change, each once, in the order of their first change.
    #[must_use]
    pub fn nodes_changing(&self) -> Vec<&str> {
        let mut nodes: Vec<&str> = Vec::new();
        for node in self.changes.iter().filter_map(|c| c.node.as_deref()) {
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        nodes
    }
}

/// Everything an upgrade of `input.nodes` to `input.target` would change and meet.
#[must_use]
pub fn findings(input: &KubernetesPlanInput<'_>) -> KubernetesFindings {
    let target = input.target;
    let below = |current: Option<&KubernetesVersion>| current.filter(|v| *v < target).cloned();
    let change = |node: Option<&str>, component: Component, from: KubernetesVersion| ComponentChange {
        node: node.map(str::to_owned),
        component,
        from,
        to: target.clone(),
    };
    let mut changes = Vec::new();
    for node in input.nodes.iter().filter(|n| n.role == MachineRole::ControlPlane) {
        for component in Component::CONTROL_PLANE {
            if let Some(from) = below(node.control_plane.get(&component)) {
                changes.push(change(Some(&node.name), component, from));
            }
        }
    }
    if let Some(from) = below(input.kube_proxy) {
        changes.push(change(None, Component::KubeProxy, from));
    }
    for role in [MachineRole::ControlPlane, MachineRole::Worker] {
        for node in input.nodes.iter().filter(|n| n.role == role) {
            if let Some(from) = below(node.kubelet.as_ref()) {
                changes.push(change(Some(&node.name), Component::Kubelet, from));
            }
        }
    }
    let mut removed_apis: Vec<DeprecatedApiUse> =
        input.deprecated_apis.iter().filter(|api| api.count > 0 && api.removed_by(target)).cloned().collect();
    removed_apis.sort();
    KubernetesFindings {
        changes,
        removed_apis,
        removed_args: removed_args_in_use(input.args, target),
        refusals: plan_kubernetes(input).err().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
