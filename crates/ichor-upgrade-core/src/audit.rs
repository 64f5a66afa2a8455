//! The morning-after audit (issue 56 item 4): what a person checks the morning after an
//! upgrade, as one pure function of what was read. The runbook ends with it; every tool of
//! the field leaves it to a cron job. Each finding is a typed reason:
//!
//! - a Node left cordoned by the engine ([`Finding::LeftCordoned`]);
//! - a static pod crash-looping ([`Finding::StaticPodCrashLooping`]);
//! - a Node not Ready, or not on the target ([`Finding::NodeNotReady`],
//!   [`Finding::NodeNotOnTarget`]);
//! - etcd unhealthy, a member not a voter, an alarm ([`Finding::EtcdUnhealthy`],
//!   [`Finding::EtcdLearner`], [`Finding::EtcdAlarm`]);
//! - a PodDisruptionBudget left at zero ([`Finding::BudgetAtZero`]);
//! - something the audit could not read ([`Finding::NotRead`]): never a clean audit from a
//!   guess.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::versions::{KubernetesVersion, TalosVersion};

/// What every Node should run once the upgrade is through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// A Talos upgrade's target (the Node's `osImage`).
    Talos(TalosVersion),
    /// A Kubernetes upgrade's target (the Node's kubelet).
    Kubernetes(KubernetesVersion),
    /// The versions the cluster declares, both checked: what `kubectl ichor audit` holds a
    /// cluster to at any time.
    Declared {
        /// The cluster's Talos version (each Node's `osImage`).
        talos: TalosVersion,
        /// The cluster's Kubernetes version (each Node's kubelet).
        kubernetes: KubernetesVersion,
    },
    /// No target (an audit of the cluster as it stands).
    None,
}

/// A Node, as the audit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditNode {
    /// Its name.
    pub name: String,
    /// Whether it is Ready.
    pub ready: bool,
    /// `status.nodeInfo.osImage`.
    pub os_image: Option<String>,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: Option<String>,
    /// Whether it is cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    /// Whether the engine cordoned it (its cordon mark is on the Node).
    pub cordoned_by_engine: bool,
}

/// A static pod of a control plane (kube-apiserver, kube-controller-manager,
/// kube-scheduler), as the audit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPod {
    /// Its Node.
    pub node: String,
    /// Its name.
    pub name: String,
    /// Whether a container of it waits in `CrashLoopBackOff`.
    pub crash_looping: bool,
}

/// etcd, as the audit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditEtcd {
    /// Read: each member (name, whether a learner) and the alarms raised.
    Read {
        /// The members.
        members: Vec<(String, bool)>,
        /// The alarms, as etcd names them (`NOSPACE`, `CORRUPT`).
        alarms: Vec<String>,
        /// What fails the etcd gate (a member not answering, no leader), if anything.
        unhealthy: Option<String>,
    },
    /// Not read, and why.
    NotRead(String),
}

/// A PodDisruptionBudget, as the audit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditBudget {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i64,
    /// The pods it covers (healthy now, or desired): a budget over none holds nothing.
    pub expected_pods: i64,
}

/// What the audit is judged from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditInput<'a> {
    /// What the Nodes should run.
    pub target: &'a AuditTarget,
    /// The cluster's Nodes.
    pub nodes: &'a [AuditNode],
    /// The control planes' static pods; `Err`: not read, and why.
    pub static_pods: Result<&'a [AuditPod], &'a str>,
    /// etcd.
    pub etcd: &'a AuditEtcd,
    /// The PodDisruptionBudgets; `Err`: not read, and why.
    pub budgets: Result<&'a [AuditBudget], &'a str>,
}

/// One thing the audit found. Its [`Finding::reason`] is what a status and an Event say.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "finding")]
pub enum Finding {
    /// A Node the engine cordoned is still cordoned.
    LeftCordoned {
        /// The Node.
        node: String,
    },
    /// A static pod crash-loops.
    StaticPodCrashLooping {
        /// Its Node.
        node: String,
        /// The pod (its component, such as `kube-apiserver`).
        pod: String,
    },
    /// A Node is not Ready.
    NodeNotReady {
        /// The Node.
        node: String,
    },
    /// A Node does not run the target.
    NodeNotOnTarget {
        /// The Node.
        node: String,
        /// What it runs (`unknown` when it says nothing).
        running: String,
        /// The target.
        target: String,
    },
    /// etcd fails its gate.
    EtcdUnhealthy {
        /// What fails.
        reason: String,
    },
    /// An etcd member is a learner, not a voter.
    EtcdLearner {
        /// The member.
        member: String,
    },
    /// An etcd alarm is raised.
    EtcdAlarm {
        /// The alarm.
        alarm: String,
    },
    /// A PodDisruptionBudget allows no disruption.
    BudgetAtZero {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// Something the audit needs could not be read.
    #[serde(rename = "AuditNotRead")]
    NotRead {
        /// What, and why.
        what: String,
    },
}

impl Finding {
    /// The CamelCase reason of its Event.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::LeftCordoned { .. } => "LeftCordoned",
            Self::StaticPodCrashLooping { .. } => "StaticPodCrashLooping",
            Self::NodeNotReady { .. } => "NodeNotReady",
            Self::NodeNotOnTarget { .. } => "NodeNotOnTarget",
            Self::EtcdUnhealthy { .. } => "EtcdUnhealthy",
            Self::EtcdLearner { .. } => "EtcdLearner",
            Self::EtcdAlarm { .. } => "EtcdAlarm",
            Self::BudgetAtZero { .. } => "BudgetAtZero",
            Self::NotRead { .. } => "AuditNotRead",
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeftCordoned { node } => write!(f, "Node {node} is still cordoned by the engine"),
            Self::StaticPodCrashLooping { node, pod } => write!(f, "static pod {pod} on {node} is crash-looping"),
            Self::NodeNotReady { node } => write!(f, "Node {node} is not Ready"),
            Self::NodeNotOnTarget { node, running, target } => write!(f, "Node {node} runs {running}, not {target}"),
            Self::EtcdUnhealthy { reason } => write!(f, "etcd is unhealthy: {reason}"),
            Self::EtcdLearner { member } => write!(f, "etcd member {member} is a learner, not a voter"),
            Self::EtcdAlarm { alarm } => write!(f, "etcd alarm {alarm} is raised"),
            Self::BudgetAtZero { namespace, name } => {
                write!(f, "PodDisruptionBudget {namespace}/{name} allows no disruption")
            }
            Self::NotRead { what } => write!(f, "not read: {what}"),
        }
    }
}

/// Everything the audit finds in `input`, sorted; none: the cluster is as it should be.
#[must_use]
pub fn audit(input: &AuditInput<'_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for node in input.nodes {
        if node.unschedulable && node.cordoned_by_engine {
            found.push(Finding::LeftCordoned { node: node.name.clone() });
        }
        if !node.ready {
            found.push(Finding::NodeNotReady { node: node.name.clone() });
        }
        found.extend(off_target(input.target, node));
    }
    match input.static_pods {
        Ok(pods) => found.extend(
            pods.iter()
                .filter(|p| p.crash_looping)
                .map(|p| Finding::StaticPodCrashLooping { node: p.node.clone(), pod: p.name.clone() }),
        ),
        Err(why) => found.push(Finding::NotRead { what: format!("the static pods: {why}") }),
    }
    match input.etcd {
        AuditEtcd::Read { members, alarms, unhealthy } => {
            found.extend(unhealthy.iter().map(|reason| Finding::EtcdUnhealthy { reason: reason.clone() }));
            found.extend(
                members.iter().filter(|(_, learner)| *learner).map(|(m, _)| Finding::EtcdLearner { member: m.clone() }),
            );
            found.extend(alarms.iter().map(|alarm| Finding::EtcdAlarm { alarm: alarm.clone() }));
        }
        AuditEtcd::NotRead(why) => found.push(Finding::NotRead { what: format!("etcd: {why}") }),
    }
    match input.budgets {
        Ok(budgets) => found.extend(
            budgets
                .iter()
                .filter(|b| b.disruptions_allowed <= 0 && b.expected_pods > 0)
                .map(|b| Finding::BudgetAtZero { namespace: b.namespace.clone(), name: b.name.clone() }),
        ),
        Err(why) => found.push(Finding::NotRead { what: format!("the PodDisruptionBudgets: {why}") }),
    }
    found.sort();
    found.dedup();
    found
}

/// Where `node` runs something other than `target`: a finding per version it is off.
fn off_target(target: &AuditTarget, node: &AuditNode) -> Vec<Finding> {
    match target {
        AuditTarget::None => Vec::new(),
        AuditTarget::Talos(talos) => off_talos(talos, node).into_iter().collect(),
        AuditTarget::Kubernetes(kubernetes) => off_kubernetes(kubernetes, node).into_iter().collect(),
        AuditTarget::Declared { talos, kubernetes } => {
            off_talos(talos, node).into_iter().chain(off_kubernetes(kubernetes, node)).collect()
        }
    }
}

fn off_talos(target: &TalosVersion, node: &AuditNode) -> Option<Finding> {
    let running = node.os_image.as_deref().and_then(|i| TalosVersion::from_os_image(i).ok());
    off(node, running.as_ref().map(ToString::to_string), running.as_ref() == Some(target), target.to_string())
}

fn off_kubernetes(target: &KubernetesVersion, node: &AuditNode) -> Option<Finding> {
    let running = node.kubelet_version.as_deref().and_then(|v| KubernetesVersion::parse(v).ok());
    off(node, running.as_ref().map(ToString::to_string), running.as_ref() == Some(target), target.to_string())
}

fn off(node: &AuditNode, running: Option<String>, on_target: bool, target: String) -> Option<Finding> {
    (!on_target).then(|| Finding::NodeNotOnTarget {
        node: node.name.clone(),
        running: running.unwrap_or_else(|| "unknown".to_owned()),
        target,
    })
}

#[cfg(test)]
mod tests;
