//! The Kubernetes API, as far as the executor needs it: Nodes, the Talos custom resources,
//! the cluster's Lease and Events. The real implementation is kube-rs in `ichor-adapters`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ichor_storage::ConditionWriteError;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::plan::DeprecatedApiUse;
use ichor_upgrade_core::machine::kubernetes::StaticPodObservation;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::status::OperationStatus;
use ichor_upgrade_core::window::MaintenanceSpec;

use crate::effects::seal::Seal;

/// A failed Kubernetes API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    /// The API server could not be reached, or answered 5xx or 429.
    #[error("API server unreachable: {0}")]
    Unreachable(String),
    /// A write lost a race (409 Conflict, a stale resourceVersion).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The object does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Refused: invalid, or anything retrying will not fix.
    #[error("refused: {0}")]
    Refused(String),
    /// Forbidden (403): the operator's RBAC does not grant the call. Retrying does not fix
    /// it; a person granting it does.
    #[error("forbidden: {0}")]
    Forbidden(String),
}

impl KubeError {
    /// Whether waiting and retrying can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::Conflict(_) => true,
            Self::NotFound(_) | Self::Refused(_) | Self::Forbidden(_) => false,
        }
    }
}

/// An alert as an alert gate's source reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alert {
    /// Its labels (`alertname` among them).
    pub labels: Metadata,
    /// The IDs of the silences that cover it now (Alertmanager; none from Prometheus).
    pub silenced_by: Vec<String>,
    /// Since when it fires, as the source wrote it.
    pub since: String,
}

/// A silence in Alertmanager: who made it, what it matches, and its times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Silence {
    /// Its ID (`None` for one to create).
    pub id: Option<String>,
    /// Its matchers.
    pub matchers: Vec<SilenceMatcher>,
    /// When it starts.
    pub starts_at: Timestamp,
    /// When it ends.
    pub ends_at: Timestamp,
    /// Who made it (`ichor` for the engine's own).
    pub created_by: String,
    /// Why: the engine's name the operation, the gate and the machine.
    pub comment: String,
    /// Whether it is in force now (`active`), as Alertmanager says.
    pub active: bool,
}

/// One label matcher of a silence, as Alertmanager's API writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilenceMatcher {
    /// The label.
    pub name: String,
    /// The value or the regex.
    pub value: String,
    /// `value` is a regex.
    pub is_regex: bool,
    /// It matches when equal (`true`) or when not (`false`).
    pub is_equal: bool,
}

/// Labels or annotations, by key.
pub type Metadata = BTreeMap<String, String>;

/// A Node as the executor reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Whether its Ready condition is True.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `status.nodeInfo.osImage`.
    pub os_image: String,
    /// `status.nodeInfo.bootID`.
    pub boot_id: String,
    /// Its labels.
    pub labels: Metadata,
    /// Its annotations.
    pub annotations: Metadata,
    /// `metadata.resourceVersion` as read: the precondition of the engine's cordon and
    /// uncordon.
    pub resource_version: String,
}

/// What Kubernetes reports of one node's Kubernetes: its kubelet (from the Node) and, on a
/// control plane, its static pods (from their mirror pods in `kube-system`, label
/// `k8s-app=<component>`, on this node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeKubernetesInfo {
    /// `status.nodeInfo.kubeletVersion`, as written (`v1.34.2`); empty when unset.
    pub kubelet_version: String,
    /// Whether the Node is Ready.
    pub ready: bool,
    /// The control-plane components' mirror pods on the node, by component.
    pub static_pods: BTreeMap<Component, StaticPodObservation>,
}

/// The control planes' static pods as their mirror pods show them: by node name, then by
/// component.
pub type ControlPlanePods = BTreeMap<String, BTreeMap<Component, StaticPodObservation>>;

/// What Kubernetes reports of the cluster's Kubernetes as a whole, for planning.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterKubernetesInfo {
    /// Deprecated APIs in use, with the release that removes each: the API servers'
    /// `apiserver_requested_deprecated_apis`, and stored objects of removed versions.
    pub deprecated_apis: Vec<DeprecatedApiUse>,
    /// The version kube-proxy runs (the `kube-system/kube-proxy` DaemonSet's image tag),
    /// when there is one.
    pub kube_proxy: Option<String>,
}

/// A `TalosMachine`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: MachineRole,
    /// `spec.hostname`, when set; else the node name comes from Talos's Nodename resource.
    pub hostname: Option<String>,
    /// The address the Talos API routes to.
    pub address: String,
    /// Its labels.
    pub labels: Metadata,
    /// Its annotations.
    pub annotations: Metadata,
    /// Its conditions (`TalosUpgrade`, `StorageEvacuation`).
    pub conditions: Conditions,
    /// The resourceVersion it was read at (`None` from a source that keeps none): the
    /// precondition of a write this read authorises.
    pub resource_version: Option<String>,
}

/// A `TalosCluster`, as far as an upgrade needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// Its name.
    pub name: String,
    /// The release set's Talos version.
    pub release_talos_version: String,
    /// The latest known patch of each minor line (the built-in ones and the cluster's
    /// own): an operation may target one on the way to the release set.
    pub releases: ichor_upgrade_core::releases::KnownReleases,
    /// The cluster's Kubernetes version.
    pub kubernetes_version: String,
    /// The schematic ID the spec names, if any.
    pub schematic: Option<String>,
    /// The Image Factory platform.
    pub platform: String,
    /// The names of the cluster's Nodes: those its node selector matches (every Node the
    /// API server has, without one). An upgrade accounts for each: a Node no machine
    /// names refuses its start and holds its completion.
    pub nodes: Vec<String>,
    /// The maintenance windows its upgrades keep to (`spec.maintenance`); an operation's
    /// own replace them ([`OperationInfo::maintenance`]).
    pub maintenance: Option<MaintenanceSpec>,
    /// The health gates its upgrades keep to (`spec.gates`); an operation's own replace
    /// them ([`OperationInfo::gates`]).
    pub gates: Vec<ichor_upgrade_core::gate::GateSpec>,
}

/// A `TalosOperation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationInfo {
    /// Its name.
    pub name: String,
    /// The identity it writes into the cluster's Lease (unique per object).
    pub identity: String,
    /// The cluster it operates on.
    pub cluster: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// Whether its deletion timestamp is set.
    pub deleting: bool,
    /// Its annotations.
    pub annotations: Metadata,
    /// Its spec.
    pub spec: OperationSpec,
    /// Its own maintenance windows (`spec.maintenance`), in place of its cluster's.
    pub maintenance: Option<MaintenanceSpec>,
    /// Its own health gates (`spec.gates`), in place of its cluster's (an empty list: none).
    pub gates: Option<Vec<ichor_upgrade_core::gate::GateSpec>>,
    /// Its status.
    pub status: OperationStatus,
}

/// The cluster's Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The holder's identity, if held.
    pub holder: Option<String>,
    /// When it was last acquired or renewed.
    pub renewed_at: Timestamp,
    /// Its duration.
    pub duration: Duration,
    /// Its resourceVersion, the precondition of the next write.
    pub resource_version: String,
}

/// A write of the cluster's Lease, made only if the Lease is still at
/// `expected_resource_version` (`None`: only if no Lease exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseWrite {
    /// The new holder, or `None` to release.
    pub holder: Option<String>,
    /// The acquire or renew time.
    pub renewed_at: Timestamp,
    /// The duration.
    pub duration: Duration,
    /// The precondition.
    pub expected_resource_version: Option<String>,
}

/// An Event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something normal happened.
    Normal,
    /// Something a person should look at.
    Warning,
}

/// An Event about an operation or a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `TalosOperation` or `TalosMachine`.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// Its type.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// A pod on a node, as the drain needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The kinds of its controller owner references (`ReplicaSet`, `DaemonSet`, ...).
    pub owner_kinds: Vec<String>,
    /// A mirror (static) pod: annotation `kubernetes.io/config.mirror`.
    pub mirror: bool,
    /// Its deletion timestamp is set.
    pub terminating: bool,
    /// Its UID (`None` from a client that has none): an eviction's precondition.
    pub uid: Option<String>,
}

impl PodInfo {
    /// The pod as the drain names it, with its UID.
    #[must_use]
    pub fn reference(&self) -> ichor_upgrade_core::machine::vocabulary::PodRef {
        ichor_upgrade_core::machine::vocabulary::PodRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }
}

/// What an eviction came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// The pod is being evicted (or was already gone).
    Evicted,
    /// A PodDisruptionBudget refused it for now (HTTP 429): try again later.
    Blocked {
        /// The API server's message.
        message: String,
    },
}

/// An admin kubeconfig, as a control plane's Talos API gives it (`talosctl kubeconfig`):
/// held in memory only, zeroed when dropped, never printed (its `Debug` says nothing of
/// it).
pub struct AdminKubeconfig(secrecy::SecretString);

impl AdminKubeconfig {
    /// The kubeconfig in `bytes` (YAML, as the Talos API's archive held it).
    ///
    /// # Errors
    /// Bytes that are not UTF-8 (then zeroed too).
    pub fn new(bytes: Vec<u8>) -> Result<Self, KubeError> {
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Self(secrecy::SecretString::from(text))),
            Err(error) => {
                let mut bytes = error.into_bytes();
                secrecy::zeroize::Zeroize::zeroize(&mut bytes);
                Err(KubeError::Refused("the admin kubeconfig the Talos API gave is not UTF-8 text".to_owned()))
            }
        }
    }

    /// Its text, for the client that is made from it.
    #[must_use]
    pub fn expose(&self) -> &str {
        secrecy::ExposeSecret::expose_secret(&self.0)
    }
}

impl std::fmt::Debug for AdminKubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminKubeconfig([held in memory, not shown])")
    }
}

/// A Kubernetes API session under an identity other than the operator's
/// ([`KubeApi::manifest_session`]), for the bootstrap manifests only.
#[async_trait]
pub trait ManifestSession: Send + Sync {
    /// Applies `object` (a whole Kubernetes object as JSON) server-side under
    /// `field_manager`, taking over the fields another manager holds, as Talos's manifest
    /// sync does.
    async fn apply(&self, object: &serde_json::Value, field_manager: &str) -> Result<(), KubeError>;
}

/// What the executor asks of the Kubernetes API.
#[async_trait]
pub trait KubeApi: Send + Sync {
    /// A Node, if it exists.
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError>;
    /// An operation, if it exists.
    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError>;
    /// Whether the operation with this Lease identity still exists.
    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError>;
    /// A cluster.
    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError>;
    /// The machines of a cluster. Shared, as a reflector's store holds them: a pass over
    /// thousands of machines copies none of them.
    async fn machines(&self, cluster: &str) -> Result<Vec<Arc<MachineInfo>>, KubeError>;
    /// Several Nodes at once, in the order of `names` (`None` for one that does not
    /// exist). The default reads them one by one; an implementation backed by a cache
    /// answers them in one call, shared.
    async fn nodes(&self, names: &[&str]) -> Result<Vec<Option<Arc<NodeInfo>>>, KubeError> {
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            found.push(self.node(name).await?.map(Arc::new));
        }
        Ok(found)
    }
    /// What the preflight gate reads of the cluster's workloads, about the Nodes `asked`:
    /// at least every pod on them, of every workload with a pod there the pods elsewhere
    /// that are Ready (one is enough to show not all run on the node asked), the
    /// PodDisruptionBudgets, and the Deployments, StatefulSets and ReplicaSets of those
    /// pods (`nodes` is left empty: the engine fills it from the Nodes it reads). Read only
    /// when a machine is about to start. The default reads nothing: only the Nodes are
    /// then checked.
    async fn preflight_facts(&self, asked: &[&str]) -> Result<ichor_upgrade_core::preflight::ClusterFacts, KubeError> {
        let _ = asked;
        Ok(ichor_upgrade_core::preflight::ClusterFacts::default())
    }
    /// The cluster's Lease, if one exists.
    async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError>;
    /// Writes the cluster's Lease under its precondition ([`KubeError::Conflict`] if lost).
    async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError>;
    /// Writes an operation's status (status subresource).
    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError>;
    /// Removes the operation's finalizer, letting its deletion complete.
    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError>;
    /// Records an Event.
    async fn event(&self, event: &Event) -> Result<(), KubeError>;
    /// One machine, if it exists.
    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError>;
    /// Carries out `write` on a machine's Node or its pods: the one way to change them
    /// through this API. Its answer is of the write's own kind ([`KubeWritten`]). `seal` is
    /// proof that the caller is [`crate::effects`], which alone makes one; a wrapper passes
    /// on the one it was given.
    async fn write(&self, write: KubeWrite<'_>, seal: Seal) -> Result<KubeWritten, KubeError>;
    /// Carries out `write`, the replacement of a machine's conditions (the `TalosMachine`
    /// status, through its status subresource): the one way to write them through this
    /// API, under the seal only [`crate::effects`] makes.
    async fn write_conditions(&self, write: ConditionWrite<'_>, seal: Seal) -> Result<(), ConditionWriteError>;
    /// The pods scheduled on a Node, read from the API server itself: what the decision
    /// that a node is drained (the reboot follows) rests on.
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError>;
    /// The pods scheduled on a Node as a watch-fed store holds them, with no request: a
    /// moment behind the API server (a pod just made may be missing, one just gone still
    /// shown), so only for what a write's precondition or a fresh read then checks (an
    /// eviction goes under the pod's UID; an empty answer is read again through
    /// [`KubeApi::pods_on`]). The default reads them fresh; wrappers must forward it.
    async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.pods_on(node).await
    }
    /// A node's Kubernetes: its kubelet and, on a control plane, its static pods; `None`
    /// when the Node does not exist. (The default answers [`KubeError::Refused`]: a
    /// Kubernetes upgrade then waits, never guessing.)
    async fn node_kubernetes(&self, node: &str) -> Result<Option<NodeKubernetesInfo>, KubeError> {
        Err(KubeError::Refused(format!("the Kubernetes versions of {node} cannot be read through this client")))
    }
    /// The control planes' own components: every mirror pod of a kube-apiserver,
    /// kube-controller-manager or kube-scheduler, by the node it is bound to, then by
    /// component (one read). A control plane changes only while every other one's are
    /// Ready ([`ichor_upgrade_core::rollout::ComponentsVerdict`]). (The default answers
    /// [`KubeError::Refused`]: no control plane then changes, never on a guess; wrappers
    /// must forward it.)
    async fn control_plane_pods(&self) -> Result<ControlPlanePods, KubeError> {
        Err(KubeError::Refused("the control planes' static pods cannot be read through this client".to_owned()))
    }
    /// The objects a health gate reads ([`ichor_upgrade_core::gate::GateObjects`]), each
    /// as `(Kind namespace/name, the whole object as JSON)`, in name order. (The default
    /// answers [`KubeError::Refused`]: the gate then does not pass, never on a guess;
    /// wrappers must forward it.)
    async fn gate_objects(
        &self,
        objects: &ichor_upgrade_core::gate::GateObjects,
    ) -> Result<Vec<(String, serde_json::Value)>, KubeError> {
        Err(KubeError::Refused(format!("{} cannot be read through this client", objects.kind_name())))
    }
    /// The alerts an alert gate's source holds now: Alertmanager's active ones (silenced
    /// and inhibited included, with the silences that cover each), or Prometheus's
    /// firing ones. Unfiltered: the gate's matchers are the shell's. (The default answers
    /// [`KubeError::Refused`]: the gate then does not pass; wrappers must forward it.)
    async fn alerts(&self, source: &ichor_upgrade_core::gate::AlertSelector) -> Result<Vec<Alert>, KubeError> {
        Err(KubeError::Refused(format!("{} cannot be read through this client", source.source())))
    }
    /// Every silence an Alertmanager holds, expired ones included. (The default answers
    /// [`KubeError::Refused`]; wrappers must forward it.)
    async fn silences(&self, alertmanager: &str) -> Result<Vec<Silence>, KubeError> {
        Err(KubeError::Refused(format!("the silences of {alertmanager} cannot be read through this client")))
    }
    /// Creates a silence, or extends one (`silence.id`): the silence's ID. A write:
    /// fencing wrappers refuse it when not leading. (The default answers
    /// [`KubeError::Refused`].)
    async fn put_silence(&self, alertmanager: &str, silence: &Silence) -> Result<String, KubeError> {
        let _ = silence;
        Err(KubeError::Refused(format!("{alertmanager} cannot be silenced through this client")))
    }
    /// The cluster's Kubernetes as planning reads it. (The default answers
    /// [`KubeError::Refused`].)
    async fn cluster_kubernetes(&self) -> Result<ClusterKubernetesInfo, KubeError> {
        Err(KubeError::Refused("the cluster's deprecated APIs cannot be read through this client".to_owned()))
    }
    /// A session on this API server under `kubeconfig`'s identity instead of the
    /// operator's own: the admin kubeconfig a control plane's Talos API gave, for a
    /// Kubernetes upgrade's bootstrap manifests step only (the operator holds no standing
    /// grant to write them; decision 0014 rule 19). The session is dropped when the step
    /// ends; the kubeconfig is never written or logged. A kubeconfig that cannot make a
    /// client is [`KubeError::Refused`]. (The default answers [`KubeError::Refused`];
    /// wrappers must forward it, fencing its writes as their own.)
    async fn manifest_session(&self, kubeconfig: AdminKubeconfig) -> Result<Box<dyn ManifestSession + '_>, KubeError> {
        drop(kubeconfig);
        Err(KubeError::Refused("no session under another identity can be made through this client".to_owned()))
    }
    /// The rollout of `workload` (`DaemonSet namespace/name` or `Deployment
    /// namespace/name`): done when its controller observed its latest spec and its pods
    /// are all updated and available. (The default answers [`KubeError::Refused`];
    /// wrappers must forward it.)
    async fn workload_rollout(
        &self,
        workload: &str,
    ) -> Result<ichor_upgrade_core::kubernetes::manifests::WorkloadRollout, KubeError> {
        Err(KubeError::Refused(format!("the rollout of {workload} cannot be read through this client")))
    }
}

/// A write of a machine's conditions: they replace the ones it has.
#[derive(Debug, Clone, Copy)]
pub struct ConditionWrite<'a> {
    /// The machine.
    pub machine: &'a str,
    /// Its conditions, whole.
    pub conditions: &'a Conditions,
    /// The resourceVersion the machine was read at, when the write is authorised by that
    /// read: it then fails (a transient conflict) when anything changed the machine since,
    /// instead of winning with what it read. `None`: the client's own precondition, the
    /// last version of the machine it saw (or none, for a client that keeps no versions).
    pub at: Option<&'a str>,
}

/// A Kubernetes write on a machine's Node or its pods.
#[derive(Debug, Clone, Copy)]
pub enum KubeWrite<'a> {
    /// Cordons the Node `node` (as read): `spec.unschedulable=true` and the annotation
    /// [`CORDONED_ANNOTATION`](ichor_upgrade_core::machine::lifecycle::CORDONED_ANNOTATION)
    /// set to `annotation` ([`cordon_annotation`](ichor_upgrade_core::machine::lifecycle::cordon_annotation):
    /// when, and which operation), in one write, so that only that operation's cordon is
    /// ever lifted. Written under `node.resource_version`: a Node changed since it was read
    /// (a `kubectl cordon` landing in between) makes it [`KubeError::Conflict`], never a
    /// takeover.
    Cordon {
        /// The Node as read.
        node: &'a NodeInfo,
        /// The annotation's value.
        annotation: &'a str,
    },
    /// Lifts the engine's cordon of the Node `node` (as read): `spec.unschedulable=false`
    /// and the annotation removed, in one write, under its resourceVersion (else
    /// [`KubeError::Conflict`]). The caller checks the annotation first: a person's cordon,
    /// or another operation's, stays.
    Uncordon {
        /// The Node as read.
        node: &'a NodeInfo,
    },
    /// Evicts a pod through the Eviction API (`policy/v1` Eviction), under the pod's UID
    /// as read when there is one: a pod made since under the same name (a StatefulSet's,
    /// placed elsewhere) is not evicted, and the answer is
    /// [`Eviction::Evicted`]: the pod read is gone.
    Evict {
        /// The pod's namespace.
        namespace: &'a str,
        /// The pod's name.
        name: &'a str,
        /// The pod's UID as read.
        uid: Option<&'a str>,
    },
    /// Deletes the Node object `node`, only if it is still at its resourceVersion as read
    /// ([`KubeError::Conflict`] otherwise: a Node changed since, or another that joined
    /// under the same name, is never deleted on an old read). One already gone is done.
    DeleteNode {
        /// The Node as read.
        node: &'a NodeInfo,
    },
}

impl KubeWrite<'_> {
    /// The API verb and resource it needs (its RBAC rule), such as `patch nodes`.
    #[must_use]
    pub fn verb(&self) -> (&'static str, &'static str) {
        match self {
            Self::Cordon { .. } | Self::Uncordon { .. } => ("patch", "nodes"),
            Self::Evict { .. } => ("create", "pods/eviction"),
            Self::DeleteNode { .. } => ("delete", "nodes"),
        }
    }

    /// Its name, for logs and errors.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cordon { .. } => "cordon",
            Self::Uncordon { .. } => "uncordon",
            Self::Evict { .. } => "evict",
            Self::DeleteNode { .. } => "delete Node",
        }
    }
}

/// The answer to a [`KubeWrite`], of the same kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeWritten {
    /// The Node is cordoned.
    Cordoned,
    /// The cordon is lifted.
    Uncordoned,
    /// What the eviction came to.
    Evicted(Eviction),
    /// The Node is deleted (or was gone).
    NodeDeleted,
}

impl KubeWritten {
    /// Its kind, as [`KubeWrite::name`] names it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cordoned => "cordon",
            Self::Uncordoned => "uncordon",
            Self::Evicted(_) => "evict",
            Self::NodeDeleted => "delete Node",
        }
    }

    fn other(&self, asked: &'static str) -> KubeError {
        KubeError::Refused(format!(
            "{asked} was answered as {}: an implementation of KubeApi::write is wrong",
            self.name()
        ))
    }

    /// What an eviction came to.
    ///
    /// # Errors
    /// An answer of another kind (a defect of the implementation, named).
    pub fn eviction(self) -> Result<Eviction, KubeError> {
        match self {
            Self::Evicted(eviction) => Ok(eviction),
            other => Err(other.other("evict")),
        }
    }

    /// That a write with no reply of its own was answered as itself.
    ///
    /// # Errors
    /// An answer of another kind than `asked`'s.
    pub fn done(self, asked: &KubeWrite<'_>) -> Result<(), KubeError> {
        if self.name() == asked.name() { Ok(()) } else { Err(self.other(asked.name())) }
    }
}
