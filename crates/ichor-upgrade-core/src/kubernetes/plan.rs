//! Planning a Kubernetes upgrade (an operation of kind `kubernetes`): from the versions
//! observed on every node, either the steps left to take, in the order Talos takes them,
//! or every reason the upgrade would break the cluster (refused at planning: nothing
//! touched).
//!
//! The order: the control-plane components (kube-apiserver, kube-controller-manager,
//! kube-scheduler) one control plane at a time; then kube-proxy, when Talos manages it;
//! then the kubelets, control planes first. Talos's `upgrade-k8s` takes the same stages
//! but goes component by component across the control planes
//! (`docs/kubernetes-upgrade-facts.md` §1); this plan goes node by node, so that each
//! node's static pods are verified together and a node that fails stops the next before
//! any of its components change. A component already on the target is not a step (an
//! upgrade resumed, or run twice, does what is left and nothing else). The kubelet skew
//! policy holds throughout: kubelets move only once every API server is on the target,
//! so none is ever newer than an API server.
//!
//! Refused, each cause named ([`KubernetesPlanProblem`]): a target more than one minor
//! above the lowest control-plane component, a downgrade of any component, a target the
//! Talos version of any node does not support, a kubelet the target's API server would
//! leave more than three minors behind, a version that was not observed (never guessed),
//! and APIs the target removes that are still in use, by resource and count.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::kubernetes::args::{ComponentArgs, RemovedArgUse, removed_args_in_use};
use crate::kubernetes::component::Component;
use crate::machine::vocabulary::MachineRole;
use crate::versions::{KubernetesVersion, Minor, TalosVersion, check_kubernetes_pairing};

/// What was observed of one node's Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeKubernetes {
    /// The machine (and its Node).
    pub name: String,
    /// Its role.
    pub role: MachineRole,
    /// The Talos version it runs.
    pub talos: TalosVersion,
    /// Its kubelet's version (`status.nodeInfo.kubeletVersion`); `None`: not observed.
    pub kubelet: Option<KubernetesVersion>,
    /// On a control plane, the version each static pod runs (from its mirror pod in
    /// kube-system); a component missing here was not observed. Empty on a worker.
    pub control_plane: BTreeMap<Component, KubernetesVersion>,
}

impl NodeKubernetes {
    /// Whether every component an upgrade to `target` changes on this node is observed
    /// on it already: its kubelet, and on a control plane its three static pods. Such a
    /// node's turn changes nothing (issue 53 item 6: it needs no etcd snapshot).
    #[must_use]
    pub fn on_target(&self, target: &KubernetesVersion) -> bool {
        self.kubelet.as_ref() == Some(target)
            && (self.role != MachineRole::ControlPlane
                || Component::CONTROL_PLANE.iter().all(|c| self.control_plane.get(c) == Some(target)))
    }
}

/// An API the API server reports as requested, with the release that removes it
/// (`apiserver_requested_deprecated_apis{group,version,resource,removed_release}`), or a
/// resource with stored objects that only removed versions serve.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeprecatedApiUse {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The version, such as `v1beta1` (for stored objects, every version serving them,
    /// joined by `,`).
    pub version: String,
    /// The resource (plural), such as `flowschemas`.
    pub resource: String,
    /// The release that removes it, as the metric writes it (`1.36`); for stored objects,
    /// the first release that serves none of its versions.
    pub removed_release: String,
    /// How many uses were seen: requests since the API server started, or stored objects.
    pub count: u64,
    /// What was counted.
    #[serde(default)]
    pub seen_as: ApiUseSeenAs,
}

/// What a [`DeprecatedApiUse`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApiUseSeenAs {
    /// Requests to the version (the API server's metrics).
    #[default]
    Requests,
    /// Objects stored of a resource that only removed versions serve.
    StoredObjects,
}

impl DeprecatedApiUse {
    /// Whether the target removes it: its removal release is the target's minor or earlier.
    /// A release that does not read as `MAJOR.MINOR` counts as removed (never guessed
    /// safe).
    #[must_use]
    pub fn removed_by(&self, target: &KubernetesVersion) -> bool {
        let parsed = self
            .removed_release
            .split_once('.')
            .and_then(|(major, minor)| Some(Minor { major: major.parse().ok()?, minor: minor.parse().ok()? }));
        parsed.is_none_or(|release| release <= target.minor_line())
    }
}

impl fmt::Display for DeprecatedApiUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() { String::new() } else { format!("{}/", self.group) };
        let (resource, version, count, removed) = (&self.resource, &self.version, self.count, &self.removed_release);
        match self.seen_as {
            ApiUseSeenAs::Requests => write!(f, "{resource}.{group}{version} ({count} uses, removed in {removed})"),
            ApiUseSeenAs::StoredObjects => write!(
                f,
                "{resource}.{group}{version} ({count} stored objects, served by no version from {removed} on)"
            ),
        }
    }
}

/// What a Kubernetes upgrade is planned from.
#[derive(Debug, Clone, Copy)]
pub struct KubernetesPlanInput<'a> {
    /// The target version.
    pub target: &'a KubernetesVersion,
    /// Every node of the cluster, control planes in the order they go.
    pub nodes: &'a [NodeKubernetes],
    /// Deprecated APIs in use (any removal release: those the target does not remove are
    /// left be).
    pub deprecated_apis: &'a [DeprecatedApiUse],
    /// The version kube-proxy runs, when Talos manages it (`None`: not managed, or
    /// disabled: not a step).
    pub kube_proxy: Option<&'a KubernetesVersion>,
    /// The extra arguments each node's configuration sets for its components: one the
    /// target removes is refused, named.
    pub args: &'a [ComponentArgs],
}

/// Why a Kubernetes upgrade is refused at planning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum KubernetesPlanProblem {
    /// The target is more than one minor above control-plane components (or kube-proxy):
    /// Kubernetes supports upgrading one minor at a time. One problem per version found.
    #[error(
        "Kubernetes {target} skips a minor: {} run {current}; upgrade to {next}.x first, one minor at a time",
        components.join(", ")
    )]
    SkipsMinor {
        /// Each component on that version, as `node/component` (`cluster/kube-proxy`).
        components: Vec<String>,
        /// Their version.
        current: String,
        /// The target.
        target: String,
        /// The minor line to go to first.
        next: String,
    },
    /// Components run a newer version than the target. One problem per version found,
    /// the components on it grouped by the nodes they run on (a sentence per component per
    /// node buried the one thing wrong).
    #[error(
        "Kubernetes {target} would downgrade {} from {current}; downgrades are not supported",
        downgraded(components)
    )]
    Downgrade {
        /// Each component on that version and the nodes it runs on there (`cluster` for
        /// kube-proxy), in the order found.
        components: Vec<(Component, Vec<String>)>,
        /// Their version.
        current: String,
        /// The target.
        target: String,
    },
    /// Nodes whose Talos does not run the target.
    #[error("{}: {refusal}", nodes.join(", "))]
    UnsupportedByTalos {
        /// The nodes, all with the same refusal.
        nodes: Vec<String>,
        /// The refusal, naming the supported range.
        refusal: String,
    },
    /// Kubelets the target's API servers would leave more than three minors behind (the
    /// kubelet skew policy).
    #[error(
        "kubelets more than three minors below Kubernetes {target}: {} (upgrade them first)",
        nodes.iter().map(|(n, v)| format!("{n} ({v})")).collect::<Vec<_>>().join(", ")
    )]
    KubeletTooOld {
        /// `(node, kubelet version)`.
        nodes: Vec<(String, String)>,
        /// The target.
        target: String,
    },
    /// A version that was not observed: nothing is planned from a guess.
    #[error("{node}'s {component} version was not observed (its Node or mirror pod is missing)")]
    NotObserved {
        /// The node.
        node: String,
        /// The component.
        component: Component,
    },
    /// APIs the target removes, still in use.
    #[error(
        "APIs removed by Kubernetes {target} are still in use: {}; move their clients and stored objects to a served version first",
        apis.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    RemovedApisInUse {
        /// The uses, by resource.
        apis: Vec<DeprecatedApiUse>,
        /// The target.
        target: String,
    },
    /// Flags, feature gates or admission plugins the target removes, set in the machine
    /// configuration: the component would exit at start (issue 53 item 11).
    #[error(
        "arguments Kubernetes {target} no longer accepts are set: {}; remove them from the machine configuration (extraArgs) first",
        uses.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    RemovedArgsInUse {
        /// The uses, by node, component and name.
        uses: Vec<RemovedArgUse>,
        /// The target.
        target: String,
    },
    /// The operator's own role may not make the reads a Kubernetes upgrade plans from
    /// (the ClusterRole of `deploy/components/kubernetes-upgrades/` is not bound).
    #[error(
        "the operator may not read what a Kubernetes upgrade is planned from ({what}): bind the ClusterRole \
         ichor-operator-kubernetes-upgrades (kubectl apply -k deploy/ with its component deploy/components/kubernetes-upgrades)"
    )]
    GrantsMissing {
        /// The call refused, and the API server's answer.
        what: String,
    },
    /// The talosconfig's roles do not include `os:admin`, which the Talos API requires to
    /// give the admin kubeconfig the bootstrap manifests are applied under.
    #[error(
        "the talosconfig's roles are {}, not os:admin: a Kubernetes upgrade applies the bootstrap manifests under \
         the admin kubeconfig the Talos API gives only to os:admin (as talosctl upgrade-k8s does); use a talosconfig \
         of role os:admin",
        roles.join(", ")
    )]
    TalosconfigNotAdmin {
        /// The roles its certificate names.
        roles: Vec<String>,
    },
}

impl KubernetesPlanProblem {
    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SkipsMinor { .. } => "KubernetesSkipsMinor",
            Self::Downgrade { .. } => "KubernetesDowngrade",
            Self::UnsupportedByTalos { .. } => "KubernetesUnsupportedByTalos",
            Self::KubeletTooOld { .. } => "KubeletTooOld",
            Self::NotObserved { .. } => "KubernetesVersionNotObserved",
            Self::RemovedApisInUse { .. } => "RemovedApisInUse",
            Self::RemovedArgsInUse { .. } => "RemovedArgsInUse",
            Self::GrantsMissing { .. } => "KubernetesGrantsMissing",
            Self::TalosconfigNotAdmin { .. } => "TalosconfigNotAdmin",
        }
    }
}

/// One change of a Kubernetes upgrade: a component on a node (kube-proxy's on no node).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KubernetesStep {
    /// The node whose machine configuration changes (`None` for kube-proxy).
    pub node: Option<String>,
    /// The component.
    pub component: Component,
}

impl fmt::Display for KubernetesStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "{node}/{}", self.component),
            None => f.write_str(self.component.as_str()),
        }
    }
}

/// The steps left, in their stages: each stage starts only once the one before is done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesPlan {
    /// Per control plane, in order, its components not on the target: one control plane at
    /// a time, verified before the next.
    pub control_planes: Vec<(String, Vec<Component>)>,
    /// Whether kube-proxy changes.
    pub kube_proxy: bool,
    /// The kubelets not on the target: control planes first (one at a time), then workers
    /// (up to `maxUnavailable` at once).
    pub kubelets: Vec<(String, MachineRole)>,
}

impl KubernetesPlan {
    /// Every step, in order.
    #[must_use]
    pub fn steps(&self) -> Vec<KubernetesStep> {
        let components = self.control_planes.iter().flat_map(|(node, components)| {
            components.iter().map(|c| KubernetesStep { node: Some(node.clone()), component: *c })
        });
        let proxy = self.kube_proxy.then_some(KubernetesStep { node: None, component: Component::KubeProxy });
        let kubelets = self
            .kubelets
            .iter()
            .map(|(node, _)| KubernetesStep { node: Some(node.clone()), component: Component::Kubelet });
        components.chain(proxy).chain(kubelets).collect()
    }

    /// Whether nothing is left to do.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.control_planes.is_empty() && !self.kube_proxy && self.kubelets.is_empty()
    }
}

/// At most this many nodes are named for a group of downgraded components; the rest are
/// counted.
const LISTED_NODES: usize = 8;

/// `kube-apiserver, kube-scheduler on cp-1, cp-2; kubelet on 1,003 nodes (cp-1, ...)`:
/// the components that share their nodes named together.
fn downgraded(components: &[(Component, Vec<String>)]) -> String {
    let mut groups: Vec<(Vec<Component>, &Vec<String>)> = Vec::new();
    for (component, nodes) in components {
        match groups.iter_mut().find(|(_, on)| *on == nodes) {
            Some((named, _)) => named.push(*component),
            None => groups.push((vec![*component], nodes)),
        }
    }
    let group = |(named, nodes): &(Vec<Component>, &Vec<String>)| {
        let named = named.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ");
        if nodes.as_slice() == ["cluster"] {
            return named;
        }
        let listed = nodes.iter().take(LISTED_NODES).map(String::as_str).collect::<Vec<_>>().join(", ");
        if nodes.len() > LISTED_NODES {
            format!("{named} on {} nodes ({listed} and {} more)", nodes.len(), nodes.len() - LISTED_NODES)
        } else {
            format!("{named} on {listed}")
        }
    };
    groups.iter().map(group).collect::<Vec<_>>().join("; ")
}

/// Plans the upgrade of `input.nodes` to `input.target`.
///
/// # Errors
/// Every problem found (at least one), in a stable order.
pub fn plan_kubernetes(input: &KubernetesPlanInput<'_>) -> Result<KubernetesPlan, Vec<KubernetesPlanProblem>> {
    let target = input.target;
    let mut problems = Vec::new();
    let mut skipping: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut downgrading = Downgrades::default();
    let mut unsupported: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut too_old = Vec::new();
    let mut plan = KubernetesPlan::default();
    let mut version_of = |node: &str, component: Component, current: &KubernetesVersion| {
        let (changes, skips) = compare(node, component, current, target, &mut downgrading);
        (changes, skips.then(|| (current.to_string(), format!("{node}/{component}"))))
    };
    for node in input.nodes {
        if let Err(refusal) = check_kubernetes_pairing(&node.talos, target) {
            unsupported.entry(refusal.to_string()).or_default().push(node.name.clone());
        }
        if node.role == MachineRole::ControlPlane {
            let mut left = Vec::new();
            for component in Component::CONTROL_PLANE {
                match node.control_plane.get(&component) {
                    None => problems.push(KubernetesPlanProblem::NotObserved { node: node.name.clone(), component }),
                    Some(current) => {
                        let (changes, skips) = version_of(&node.name, component, current);
                        if let Some((version, what)) = skips {
                            skipping.entry(version).or_default().push(what);
                        }
                        if changes {
                            left.push(component);
                        }
                    }
                }
            }
            if !left.is_empty() {
                plan.control_planes.push((node.name.clone(), left));
            }
        }
        match &node.kubelet {
            None => problems
                .push(KubernetesPlanProblem::NotObserved { node: node.name.clone(), component: Component::Kubelet }),
            Some(kubelet) => {
                if target.minor_line().major == kubelet.minor_line().major
                    && target.minor_line().minor > kubelet.minor_line().minor + 3
                {
                    too_old.push((node.name.clone(), kubelet.to_string()));
                }
                if version_of(&node.name, Component::Kubelet, kubelet).0 {
                    plan.kubelets.push((node.name.clone(), node.role));
                }
            }
        }
    }
    if let Some(proxy) = input.kube_proxy {
        let (changes, skips) = version_of("cluster", Component::KubeProxy, proxy);
        if let Some((version, what)) = skips {
            skipping.entry(version).or_default().push(what);
        }
        plan.kube_proxy = changes;
    }
    // One problem per version skipped from, lowest first, before the others.
    let mut skips: Vec<(KubernetesVersion, Vec<String>)> = skipping
        .into_iter()
        .filter_map(|(current, components)| KubernetesVersion::parse(&current).ok().map(|v| (v, components)))
        .collect();
    skips.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, (current, components)) in skips.into_iter().enumerate() {
        let from = current.minor_line();
        let next = format!("{}.{}", from.major, from.minor + 1);
        let problem = KubernetesPlanProblem::SkipsMinor {
            components,
            current: current.to_string(),
            target: target.to_string(),
            next,
        };
        problems.insert(k, problem);
    }
    // One problem per version downgraded from, highest first, after the skips.
    let mut downgrades: Vec<(KubernetesVersion, ComponentNodes)> = downgrading
        .0
        .into_iter()
        .filter_map(|(current, components)| KubernetesVersion::parse(&current).ok().map(|v| (v, components)))
        .collect();
    downgrades.sort_by(|a, b| b.0.cmp(&a.0));
    let skipped = problems.iter().filter(|p| matches!(p, KubernetesPlanProblem::SkipsMinor { .. })).count();
    for (k, (current, components)) in downgrades.into_iter().enumerate() {
        let problem =
            KubernetesPlanProblem::Downgrade { components, current: current.to_string(), target: target.to_string() };
        problems.insert(skipped + k, problem);
    }
    // Control planes' kubelets first, each role in the order given.
    plan.kubelets.sort_by_key(|(_, role)| *role);
    for (refusal, nodes) in unsupported {
        problems.push(KubernetesPlanProblem::UnsupportedByTalos { nodes, refusal });
    }
    if !too_old.is_empty() {
        problems.push(KubernetesPlanProblem::KubeletTooOld { nodes: too_old, target: target.to_string() });
    }
    let mut removed: Vec<DeprecatedApiUse> =
        input.deprecated_apis.iter().filter(|api| api.count > 0 && api.removed_by(target)).cloned().collect();
    if !removed.is_empty() {
        removed.sort();
        problems.push(KubernetesPlanProblem::RemovedApisInUse { apis: removed, target: target.to_string() });
    }
    let args = removed_args_in_use(input.args, target);
    if !args.is_empty() {
        problems.push(KubernetesPlanProblem::RemovedArgsInUse { uses: args, target: target.to_string() });
    }
    if problems.is_empty() { Ok(plan) } else { Err(problems) }
}

/// Components and the nodes each runs on.
type ComponentNodes = Vec<(Component, Vec<String>)>;

/// The components a target would downgrade: by the version they run, each with its nodes.
#[derive(Default)]
struct Downgrades(BTreeMap<String, ComponentNodes>);

impl Downgrades {
    fn add(&mut self, current: &KubernetesVersion, component: Component, node: &str) {
        let components = self.0.entry(current.to_string()).or_default();
        match components.iter_mut().find(|(c, _)| *c == component) {
            Some((_, nodes)) => nodes.push(node.to_owned()),
            None => components.push((component, vec![node.to_owned()])),
        }
    }
}

/// Whether `component` on `node` must change to reach `target` (`false` when it is there
/// already), and whether it would skip a minor; a downgrade is recorded in `downgrades`.
fn compare(
    node: &str,
    component: Component,
    current: &KubernetesVersion,
    target: &KubernetesVersion,
    downgrades: &mut Downgrades,
) -> (bool, bool) {
    if current == target {
        return (false, false);
    }
    if current > target {
        downgrades.add(current, component, node);
        return (false, false);
    }
    let (from, to) = (current.minor_line(), target.minor_line());
    // The kubelet may trail by more (the skew policy, checked apart); every other component
    // moves one minor at a time.
    let skips = from.major != to.major || to.minor > from.minor + 1;
    (true, skips && component != Component::Kubelet)
}

#[cfg(test)]
mod tests;
