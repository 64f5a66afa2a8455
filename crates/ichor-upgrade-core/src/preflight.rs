//! The preflight gate: can the cluster lose this node now?
//!
//! The runbook ran one script before a whole rollout: every node Ready and schedulable, no
//! PodDisruptionBudget at zero, no single-replica workload, no multi-replica workload
//! whose Ready pods share one node. Here the same question is asked of each machine just
//! before it is started, about that machine's node: a budget at zero elsewhere does not
//! stall this node's drain, and a workload with no pod here does not go down with it.
//!
//! [`Preflight::new`] indexes what was observed once per pass; [`Preflight::blockers`]
//! answers for one node. A machine with blockers is not started; one already started is
//! never stopped by them (the rollout engine's rule, not this module's).
//!
//! What every drain skips is skipped here too: DaemonSet pods and mirror (static) pods. A
//! pod no controller owns counts: Talos's own drain (the legacy Upgrade call) leaves it,
//! but the engine's drain (the lifecycle executor, a removal) evicts it as `talosctl` and
//! `kubectl drain --force` do, and a reboot takes it down either way.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::labels::LabelSelector;

/// A Node as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Its name.
    pub name: String,
    /// Its Ready condition.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// Taken out by this operation (a machine it started): neither its NotReady nor its
    /// cordon blocks the next machine, or no two machines could ever be in flight.
    pub by_operation: bool,
    /// The operation whose engine cordon it carries, when that is another operation (an
    /// aborted removal, a deleted upgrade): a cordon this operation never lifts, named in
    /// its blocker so that a person knows whose it is.
    pub cordoned_by: Option<String>,
}

/// The controller that owns a pod (`metadata.ownerReferences` with `controller: true`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    /// `ReplicaSet`, `StatefulSet`, `DaemonSet`, `Job`, ...
    pub kind: String,
    /// Its name, in the pod's namespace.
    pub name: String,
}

/// A pod as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.nodeName`, once scheduled.
    pub node: Option<String>,
    /// Its Ready condition.
    pub ready: bool,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its controller, if any.
    pub owner: Option<Owner>,
    /// A mirror (static) pod.
    pub mirror: bool,
}

/// A PodDisruptionBudget as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The pods it covers, in its namespace. `None` covers no pod: an empty selector
    /// covers none in `policy/v1beta1` and every pod in `policy/v1`, so the adapter that
    /// reads it says which (an empty [`LabelSelector`] here covers every pod).
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `status.currentHealthy`.
    pub current_healthy: i32,
    /// `status.desiredHealthy`.
    pub desired_healthy: i32,
}

/// The kinds of workload the replica checks know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WorkloadKind {
    /// A Deployment (its pods are owned by its ReplicaSets).
    Deployment,
    /// A StatefulSet.
    StatefulSet,
    /// A ReplicaSet that no Deployment owns.
    ReplicaSet,
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::ReplicaSet => "ReplicaSet",
        })
    }
}

/// A Deployment or StatefulSet with its desired replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadFacts {
    /// Deployment or StatefulSet.
    pub kind: WorkloadKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.replicas` (1 when unset, as Kubernetes defaults it).
    pub replicas: i32,
}

/// A ReplicaSet: the link from a pod to its Deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSetFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// The Deployment that owns it, if any.
    pub deployment: Option<String>,
}

/// Everything the preflight reads, as observed in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Every Node.
    pub nodes: Vec<NodeFacts>,
    /// Every pod.
    pub pods: Vec<PodFacts>,
    /// Every PodDisruptionBudget.
    pub budgets: Vec<BudgetFacts>,
    /// Every Deployment and StatefulSet.
    pub workloads: Vec<WorkloadFacts>,
    /// Every ReplicaSet.
    pub replica_sets: Vec<ReplicaSetFacts>,
}

/// What the preflight leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightConfig {
    /// Namespaces whose budgets and workloads are not checked (`kube-system` by default,
    /// as the runbook: its system pods are the platform's to keep up).
    pub ignored_namespaces: BTreeSet<String>,
}

impl Default for PreflightConfig {
    fn default() -> Self {
        Self { ignored_namespaces: ["kube-system".to_owned()].into() }
    }
}

/// Why a node cannot be taken out now.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Blocker {
    /// Another node is not Ready (and not because of this operation).
    NodeNotReady {
        /// The node.
        node: String,
    },
    /// Another node is cordoned, not by this operation.
    NodeCordoned {
        /// The node.
        node: String,
        /// The other operation whose engine cordon it is, if it is one (`None`: a person's,
        /// or an older engine's that names no operation).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        operation: Option<String>,
    },
    /// A budget that allows no disruption covers a pod on the node: its drain would stall.
    BudgetAtZero {
        /// The budget's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// `status.currentHealthy`.
        healthy: i32,
        /// `status.desiredHealthy`.
        desired: i32,
    },
    /// A budget whose selector cannot be evaluated: whether it covers a pod on the node is
    /// unknown, so it counts as if it did.
    BudgetUnreadable {
        /// The budget's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        error: String,
    },
    /// A workload of one replica has its pod on the node: it goes down while it drains.
    SingleReplica {
        /// Its kind.
        workload: WorkloadKind,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Its replicas.
        replicas: i32,
        /// The node.
        node: String,
    },
    /// What the preflight reads could not be read: nothing can be said to be safe.
    NotObserved {
        /// Why.
        error: String,
    },
    /// A workload of several replicas has every Ready pod on the node.
    AllReadyPodsOnNode {
        /// Its kind.
        workload: WorkloadKind,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Its replicas.
        replicas: i32,
        /// Its Ready pods, all on the node.
        ready: usize,
        /// The node.
        node: String,
    },
    /// A workload whose Ready pods all run on the node and on nodes that would be down
    /// with it (machines of this operation past their disruptive call): judged one at a
    /// time, each node keeps a Ready pod elsewhere, yet together they take every one.
    AllReadyPodsOnNodesDownTogether {
        /// Its kind.
        workload: WorkloadKind,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Its replicas.
        replicas: i32,
        /// Its Ready pods, all on those nodes.
        ready: usize,
        /// The node asked about, then the others down with it that hold its Ready pods.
        nodes: Vec<String>,
    },
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeNotReady { node } => write!(f, "node {node} is not Ready"),
            Self::NodeCordoned { node, operation: None } => {
                write!(f, "node {node} is cordoned (not by this operation)")
            }
            Self::NodeCordoned { node, operation: Some(operation) } => write!(
                f,
                "node {node} is cordoned by operation {operation} (annotation ichor.dev/cordoned), never lifted by \
                 another operation: uncordon it once that operation is done with it"
            ),
            Self::BudgetAtZero { namespace, name, healthy, desired } => {
                write!(f, "PDB {namespace}/{name} allows 0 disruptions (healthy {healthy}/{desired})")
            }
            Self::NotObserved { error } => write!(f, "the cluster's workloads could not be read: {error}"),
            Self::BudgetUnreadable { namespace, name, error } => {
                write!(f, "PDB {namespace}/{name} cannot be evaluated: {error}")
            }
            Self::SingleReplica { workload, namespace, name, replicas, node } => {
                let s = if *replicas == 1 { "" } else { "s" };
                write!(f, "{workload} {namespace}/{name} has {replicas} replica{s}: it goes down while {node} drains")
            }
            Self::AllReadyPodsOnNode { workload, namespace, name, replicas, ready, node } => {
                write!(f, "{workload} {namespace}/{name}: all {ready} Ready pods of {replicas} run on {node}")
            }
            Self::AllReadyPodsOnNodesDownTogether { workload, namespace, name, replicas, ready, nodes } => write!(
                f,
                "{workload} {namespace}/{name}: all {ready} Ready pods of {replicas} run on {}, which would be down together",
                nodes.join(" and ")
            ),
        }
    }
}

/// The blockers, as one line: `; ` between them.
#[must_use]
pub fn describe(blockers: &[Blocker]) -> String {
    blockers.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// A workload by kind, namespace and name.
type WorkloadKey = (WorkloadKind, String, String);

/// What was observed, indexed for the question asked of each node.
#[derive(Debug)]
pub struct Preflight<'a> {
    facts: &'a ClusterFacts,
    config: &'a PreflightConfig,
    /// Pods by node (indices into `facts.pods`), only those a drain may evict.
    evicted_on: BTreeMap<&'a str, Vec<usize>>,
    /// Each pod's workload, where known.
    workload_of: Vec<Option<WorkloadKey>>,
    /// Each workload's desired replicas.
    replicas: BTreeMap<WorkloadKey, i32>,
    /// The nodes each workload has Ready pods on, with how many.
    ready_on: BTreeMap<WorkloadKey, BTreeMap<&'a str, usize>>,
    /// The nodes that block every other node (not Ready, or cordoned), not taken out by
    /// this operation: found once, not once per node asked about.
    bad_nodes: Vec<(&'a str, Blocker)>,
}

impl<'a> Preflight<'a> {
    /// Indexes `facts` once.
    #[must_use]
    pub fn new(facts: &'a ClusterFacts, config: &'a PreflightConfig) -> Self {
        let mut replicas: BTreeMap<WorkloadKey, i32> =
            facts.workloads.iter().map(|w| ((w.kind, w.namespace.clone(), w.name.clone()), w.replicas)).collect();
        let mut deployment_of: BTreeMap<(&str, &str), Option<&str>> = BTreeMap::new();
        for rs in &facts.replica_sets {
            deployment_of.insert((rs.namespace.as_str(), rs.name.as_str()), rs.deployment.as_deref());
            if rs.deployment.is_none() {
                replicas.insert((WorkloadKind::ReplicaSet, rs.namespace.clone(), rs.name.clone()), rs.replicas);
            }
        }
        let workload_of: Vec<Option<WorkloadKey>> = facts
            .pods
            .iter()
            .map(|pod| {
                let owner = pod.owner.as_ref()?;
                let key = match owner.kind.as_str() {
                    "StatefulSet" => (WorkloadKind::StatefulSet, pod.namespace.clone(), owner.name.clone()),
                    "ReplicaSet" => match deployment_of.get(&(pod.namespace.as_str(), owner.name.as_str()))? {
                        Some(deployment) => (WorkloadKind::Deployment, pod.namespace.clone(), (*deployment).to_owned()),
                        None => (WorkloadKind::ReplicaSet, pod.namespace.clone(), owner.name.clone()),
                    },
                    _ => return None,
                };
                // A workload not observed is not judged: its replicas are unknown.
                replicas.contains_key(&key).then_some(key)
            })
            .collect();
        let mut evicted_on: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut ready_on: BTreeMap<WorkloadKey, BTreeMap<&str, usize>> = BTreeMap::new();
        for (i, pod) in facts.pods.iter().enumerate() {
            let Some(node) = pod.node.as_deref() else { continue };
            let skipped = pod.mirror || pod.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet");
            if !skipped {
                evicted_on.entry(node).or_default().push(i);
            }
            if let (true, Some(key)) = (pod.ready, &workload_of[i]) {
                *ready_on.entry(key.clone()).or_default().entry(node).or_default() += 1;
            }
        }
        let bad_nodes = facts
            .nodes
            .iter()
            .filter(|n| !n.by_operation)
            .filter_map(|n| {
                let blocker = if !n.ready {
                    Blocker::NodeNotReady { node: n.name.clone() }
                } else if n.unschedulable {
                    Blocker::NodeCordoned { node: n.name.clone(), operation: n.cordoned_by.clone() }
                } else {
                    return None;
                };
                Some((n.name.as_str(), blocker))
            })
            .collect();
        Self { facts, config, evicted_on, workload_of, replicas, ready_on, bad_nodes }
    }

    /// Why `node` cannot be taken out now, in a stable order; empty when it can.
    #[must_use]
    pub fn blockers(&self, node: &str) -> Vec<Blocker> {
        self.blockers_with(node, &[])
    }

    /// Why `node` cannot be taken out now while the nodes `together` are down too (the
    /// machines of this operation past their disruptive call): as [`Self::blockers`], and
    /// a workload is blocked when its Ready pods all run on `node` and those nodes, not
    /// only on `node` (issue 29 item 10: with `maxUnavailable` of 2 or more, two nodes
    /// each judged alone can together hold every Ready pod of a workload). The facts must
    /// hold every pod on `together` too (ask the adapter about them).
    #[must_use]
    pub fn blockers_with(&self, node: &str, together: &[&str]) -> Vec<Blocker> {
        let mut found: BTreeSet<Blocker> =
            self.bad_nodes.iter().filter(|(name, _)| *name != node).map(|(_, b)| b.clone()).collect();
        let ignored = |namespace: &str| self.config.ignored_namespaces.contains(namespace);
        let here: Vec<&PodFacts> = self
            .evicted_on
            .get(node)
            .map(|pods| pods.iter().map(|&i| &self.facts.pods[i]).collect())
            .unwrap_or_default();
        for budget in self.facts.budgets.iter().filter(|b| !ignored(&b.namespace) && b.disruptions_allowed < 1) {
            let Some(selector) = &budget.selector else { continue };
            let mut covered = Ok(false);
            for pod in here.iter().filter(|p| p.namespace == budget.namespace) {
                match selector.matches(&pod.labels) {
                    Ok(false) => {}
                    other => {
                        covered = other;
                        break;
                    }
                }
            }
            match covered {
                Ok(true) => found.insert(Blocker::BudgetAtZero {
                    namespace: budget.namespace.clone(),
                    name: budget.name.clone(),
                    healthy: budget.current_healthy,
                    desired: budget.desired_healthy,
                }),
                Ok(false) => false,
                Err(e) => found.insert(Blocker::BudgetUnreadable {
                    namespace: budget.namespace.clone(),
                    name: budget.name.clone(),
                    error: e.to_string(),
                }),
            };
        }
        let workloads_here: BTreeSet<&WorkloadKey> = self
            .evicted_on
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|&i| self.workload_of[i].as_ref())
            .filter(|(_, namespace, _)| !ignored(namespace))
            .collect();
        for key in workloads_here {
            let (workload, namespace, name) = key.clone();
            let replicas = self.replicas.get(key).copied().unwrap_or(0);
            if replicas < 2 {
                found.insert(Blocker::SingleReplica { workload, namespace, name, replicas, node: node.to_owned() });
                continue;
            }
            let Some(ready_on) = self.ready_on.get(key) else { continue };
            let down = |n: &str| n == node || together.contains(&n);
            if !ready_on.keys().all(|n| down(n)) {
                continue;
            }
            let ready: usize = ready_on.values().sum();
            if ready_on.len() == 1 && ready_on.contains_key(node) {
                found.insert(Blocker::AllReadyPodsOnNode {
                    workload,
                    namespace,
                    name,
                    replicas,
                    ready,
                    node: node.to_owned(),
                });
            } else if ready_on.contains_key(node) {
                let others = ready_on.keys().filter(|n| **n != node).map(|n| (*n).to_owned());
                found.insert(Blocker::AllReadyPodsOnNodesDownTogether {
                    workload,
                    namespace,
                    name,
                    replicas,
                    ready,
                    nodes: std::iter::once(node.to_owned()).chain(others).collect(),
                });
            }
        }
        found.into_iter().collect()
    }
}

#[cfg(test)]
mod tests;
