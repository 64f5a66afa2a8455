//! Ichor's custom resources, `ichor.dev/v1alpha1`, derived from these types: the schema,
//! the printer columns and the status subresource all come from here, and
//! `deploy/crds.yaml` is generated from them ([`crate::kubernetes::manifests`]).
//!
//! | kind | what it is |
//! | --- | --- |
//! | [`TalosCluster`] | a Talos cluster: the release set's Talos version (the only allowed target), its Kubernetes version, the Image Factory platform and schematic, and the Secret with its talosconfig |
//! | [`TalosMachine`] | one machine of a cluster: its role, its Talos API address, its hostname; its conditions are where an upgrade's progress lives |
//! | [`TalosOperation`] | an upgrade of a cluster to a Talos version (`kind: talos`) or a Kubernetes version (`kind: kubernetes`), or a machine's removal (`kind: remove`) |
//! | [`TalosStorage`] | which nodes carry storage to evacuate before they go down |

use std::collections::BTreeMap;

use ichor_upgrade_core::gate::GateSpec;
use ichor_upgrade_core::machine::{lifecycle, vocabulary};
use ichor_upgrade_core::operation::MaxUnavailable;
use ichor_upgrade_core::window::MaintenanceSpec;
use ichor_upgrade_core::{evacuation, upgrade_marker};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "ichor.dev";
/// The version.
pub const VERSION: &str = "v1alpha1";

/// A Talos cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ichor.dev",
    version = "v1alpha1",
    kind = "TalosCluster",
    doc = "A Talos cluster: the release set's Talos version, its Kubernetes version, the Image Factory settings and its talosconfig Secret.",
    plural = "talosclusters",
    shortname = "tcl",
    category = "ichor",
    namespaced,
    status = "TalosClusterStatus",
    printcolumn = r#"{"name":"Talos","type":"string","jsonPath":".spec.talosVersion"}"#,
    printcolumn = r#"{"name":"Kubernetes","type":"string","jsonPath":".spec.kubernetesVersion"}"#,
    printcolumn = r#"{"name":"Running","type":"string","jsonPath":".status.running"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Operation","type":"string","jsonPath":".status.operation"}"#,
    printcolumn = r#"{"name":"Upgrades","type":"string","jsonPath":".status.upgrade.state"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterSpec {
    /// The release set's Talos version, such as `v1.14.4`: the only version an operation
    /// may roll the cluster to.
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$"))]
    pub talos_version: String,
    /// The cluster's Kubernetes version, such as `1.34.1`.
    #[schemars(regex(pattern = r"^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$"))]
    pub kubernetes_version: String,
    /// The Image Factory platform of the installer image, such as `metal` or `aws`.
    #[serde(default = "default_platform")]
    #[schemars(regex(pattern = r"^[a-z0-9-]+$"))]
    pub platform: String,
    /// The Image Factory schematic ID; without it, each node's own
    /// (`extensions.talos.dev/schematic`) is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub schematic: Option<String>,
    /// The name of a Secret in the same namespace with key `talosconfig`: the talosconfig
    /// the engine reaches the Talos API with.
    #[schemars(length(min = 1))]
    pub talosconfig_secret: String,
    /// The labels of this cluster's Nodes (every one must match). Without it, every Node
    /// the API server has is the cluster's: set it when Nodes of other clusters share the
    /// API server. An upgrade accounts for each of them: it is refused while one has no
    /// TalosMachine, and not Completed until every one reports the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// `Nodes`: the operator makes a TalosMachine for each of the cluster's Nodes that no
    /// machine names (named as the Node; its role from the `node-role.kubernetes.io/
    /// control-plane` label, its address the Node's InternalIP, its hostname the Node's
    /// name) and keeps those it made in step with their Nodes. It never deletes one.
    /// Without it (`Manual`, the default), every Node needs a TalosMachine made by hand,
    /// and an upgrade is refused while one has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    /// `Automatic`: a change of `talosVersion` or `kubernetesVersion` is enough. The
    /// operator makes the operation itself (owned by this cluster, named after its target,
    /// such as `talos-v1.14.4` or `kubernetes-1.35.2`), Talos first, then Kubernetes; a
    /// target more than one minor ahead goes as a chain of hops through the latest patch of
    /// each minor line between (`releases`), each a full rollout verified before the next.
    /// It keeps the last few operations it made and deletes older ones. Nothing is made
    /// while an operation holds the cluster, or while one it made did not complete (failed,
    /// refused, paused: a person decides). Without it (`Manual`, the default), a person
    /// writes each TalosOperation; one written by hand works in either mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrades: Option<UpgradePolicy>,
    /// Releases to go through beyond those the operator knows: the latest patch of a minor
    /// line, for the hops of an `Automatic` upgrade (and of an operation that targets such
    /// a hop). Of each minor line the latest listed or known patch is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releases: Option<ReleasesSpec>,
    /// Where the cluster's upgrades are told as they go (started, a machine failed,
    /// paused, waiting too long, completed): webhooks, each notice sent once in order with
    /// the header `Ichor-Event-Id`, retried while the receiver is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<NotificationsSpec>,
    /// Maintenance windows: a machine of an upgrade starts only inside one, and only when
    /// its calibrated p90 turn (from the cluster's last upgrade) ends before that window
    /// does; a machine under way is never stopped. `windows`: each a five-field cron
    /// `schedule` read in its IANA `timeZone` (UTC if left out) and a `duration` (`4h`,
    /// `90m`), as a union; `blackouts`: RFC 3339 `start` and `end` in which nothing
    /// starts and into which no turn runs. A wait says `OutsideWindow` or
    /// `WouldOverrunWindow` with the next window's start. Removals keep to none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "maintenance")]
    pub maintenance: Option<MaintenanceSpec>,
    /// Health gates: checks of the platform team's own, each a CEL `expression` over
    /// `object` (every object of one kind it reads, by namespace, name or labels) that
    /// must be `true` for `settleSeconds` before the gate passes. `phase`: `beforeMachine`
    /// (each start), `afterMachine` (after each machine, before the next start and the
    /// completion), `beforeOperation` or `afterOperation`; `scope`: a `role` and an order
    /// `wave`. A start waits (`GateNotPassing`, naming the gate, the object and its value);
    /// past `timeoutSeconds` the operation pauses (`GateTimedOut`). An expression that
    /// does not compile refuses the upgrade. The operator reads the objects with its own
    /// rights: grant it `get` and `list` on the kinds the gates name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "gates")]
    pub gates: Option<Vec<GateSpec>>,
}

/// `spec.notifications`: the receivers of a cluster's notices, and when a wait is one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationsSpec {
    /// How long an operation waits (phase `Waiting`, for the same reason) before a notice
    /// says so and what it waits on, seconds; 600 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub waiting_after_seconds: Option<i64>,
    /// How long a notice is retried, from when it was owed, before it is given up (a
    /// Warning Event on the operation says so), seconds; 21600 (6 h) by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub give_up_after_seconds: Option<i64>,
    /// The receivers; each gets every notice.
    #[serde(default)]
    pub sinks: Vec<NotificationSink>,
}

/// A receiver of notices.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationSink {
    /// Its name, unique in the list: the records of what was sent to it are kept by it.
    #[schemars(length(min = 1), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// `Webhook` (a JSON body: the notice's id, event, operation and message) or `Slack`
    /// (an incoming webhook's `{"text": ...}`).
    #[serde(rename = "type")]
    pub type_: SinkType,
    /// The Secret (in the cluster's namespace) and key holding the receiver's URL: never
    /// logged, never written to a status.
    pub url_secret: SecretKeyRef,
}

/// The body a receiver takes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
// No description of its own: the field's documentation is the one `kubectl explain` shows.
#[schemars(description = "")]
pub enum SinkType {
    /// The notice as JSON.
    Webhook,
    /// A Slack-compatible incoming webhook: `{"text": ...}`.
    Slack,
}

/// A key of a Secret in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key within it.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// Whether a change of the cluster's versions makes its operations.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
// No description of its own: the field's documentation is the one `kubectl explain` shows.
#[schemars(description = "")]
pub enum UpgradePolicy {
    /// No: a person writes each TalosOperation.
    #[default]
    Manual,
    /// Yes: the operator makes them from `talosVersion` and `kubernetesVersion`.
    Automatic,
}

/// Releases a person adds to those the operator knows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleasesSpec {
    /// Talos releases, such as `v1.13.10`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+$")))]
    pub talos: Vec<String>,
    /// Kubernetes releases, such as `1.35.3`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^v?[0-9]+\.[0-9]+\.[0-9]+$")))]
    pub kubernetes: Vec<String>,
}

impl TalosClusterSpec {
    /// The releases the engine knows for this cluster: the built-in ones and
    /// `spec.releases` ([`ichor_upgrade_core::releases::KnownReleases`]). An entry the
    /// schema let through that still does not parse leaves the built-in ones, with a
    /// warning: a hop through its line is then refused, naming it.
    #[must_use]
    pub fn known_releases(&self) -> ichor_upgrade_core::releases::KnownReleases {
        let built_in = ichor_upgrade_core::releases::KnownReleases::built_in().clone();
        let Some(extra) = &self.releases else { return built_in };
        built_in.clone().with(&extra.talos, &extra.kubernetes).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "spec.releases: an entry is not a release; the built-in releases are used");
            built_in
        })
    }

    /// Whether the operator makes this cluster's operations from its versions.
    #[must_use]
    pub fn automatic(&self) -> bool {
        self.upgrades == Some(UpgradePolicy::Automatic)
    }

    /// Whether a Node with `labels` is one of this cluster's: every label of the node
    /// selector equal (every Node without one).
    #[must_use]
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector.as_ref().is_none_or(|wanted| wanted.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }
}

/// Whether the operator makes the cluster's TalosMachines from its Nodes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
// No description of its own: the field's documentation is the one `kubectl explain` shows.
#[schemars(description = "")]
pub enum Discovery {
    /// No: the TalosMachines are made by hand.
    Manual,
    /// Yes, from the cluster's Nodes.
    Nodes,
}

fn default_platform() -> String {
    "metal".to_owned()
}

/// What the engine last saw of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterStatus {
    /// Conditions about the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The Talos versions the cluster's Nodes run, lowest first (from each Node's
    /// `osImage`); one entry once every Node is on the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub talos_versions: Vec<String>,
    /// The same, as one line for the `Running` column: the version when every Node runs
    /// it (`v1.14.3`), else each with how many Nodes run it, lowest first
    /// (`v1.14.2 (2), v1.14.3 (1)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// The Kubernetes versions of the cluster's kubelets, lowest first (each Node's
    /// `kubeletVersion`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_versions: Vec<String>,
    /// How many of the cluster's Nodes run each Talos version (`unknown` for an `osImage`
    /// that names none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes_by_talos_version: BTreeMap<String, i64>,
    /// How many Nodes the cluster has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// How many TalosMachines name the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines: Option<i64>,
    /// The operation that holds the cluster now (started, waiting or paused), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Its last operations that ran (dry runs aside), newest first, the last
    /// [`LAST_OPERATIONS`] kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_operations: Vec<OperationSummary>,
    /// With `spec.upgrades: Automatic`, where its upgrades stand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeState>,
}

/// Where an `Automatic` cluster's upgrades stand.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeState {
    /// `UpToDate`, `Upgrading` (an operation it made runs, or is being made), `Waiting`
    /// (on what the message says), or `Refused` (the spec asks what no operation can do).
    pub state: String,
    /// What it does or waits on, in a sentence.
    pub message: String,
}

/// How many operations [`TalosClusterStatus::last_operations`] keeps.
pub const LAST_OPERATIONS: usize = 5;

/// One operation of a cluster, in its status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationSummary {
    /// The TalosOperation.
    pub name: String,
    /// Its kind and target, such as `talos v1.14.4` or `remove worker-3`.
    pub operation: String,
    /// Its phase.
    pub phase: String,
    /// When it was made.
    pub start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// When it completed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// From its start to its end, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub makespan_seconds: Option<f64>,
    /// Its machines.
    pub machines: i64,
    /// Of those, failed.
    pub failed: i64,
}

/// A machine's role.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs etcd and the control plane.
    Controlplane,
    /// Runs workloads.
    Worker,
}

impl From<Role> for ichor_upgrade_core::machine::vocabulary::MachineRole {
    fn from(role: Role) -> Self {
        match role {
            Role::Controlplane => Self::ControlPlane,
            Role::Worker => Self::Worker,
        }
    }
}

/// A machine of a Talos cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ichor.dev",
    version = "v1alpha1",
    kind = "TalosMachine",
    doc = "A machine of a Talos cluster; its conditions hold an upgrade's or a removal's progress.",
    plural = "talosmachines",
    shortname = "tm",
    category = "ichor",
    namespaced,
    status = "TalosMachineStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Upgrade","type":"string","jsonPath":".status.conditions[?(@.type==\"TalosUpgrade\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineSpec {
    /// The `TalosCluster` it belongs to, in the same namespace.
    #[schemars(length(min = 1))]
    pub cluster: String,
    /// `controlplane` or `worker`.
    pub role: Role,
    /// The address the Talos API routes to (apid's `node`), usually the node's IP.
    #[schemars(length(min = 1))]
    pub address: String,
    /// The Kubernetes node name; without it, the node's Nodename resource is read through
    /// the Talos API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

impl TalosMachine {
    /// The names its Node may have, the surest first: its `hostname`, the node name the
    /// marker of its latest call recorded (read from the node by the engine), its own
    /// name.
    #[must_use]
    pub fn node_names(&self) -> Vec<String> {
        let marked = self.status.iter().flat_map(|s| &s.conditions).find_map(|c| {
            let marker = (c.type_ == upgrade_marker::TALOS_UPGRADE || c.type_ == vocabulary::TALOS_LIFECYCLE)
                .then(|| upgrade_marker::MarkerRef::parse(&c.message).ok())
                .flatten()?;
            marker.node.map(str::to_owned)
        });
        let mut names: Vec<String> = Vec::new();
        for name in
            [self.spec.hostname.clone().filter(|h| !h.is_empty()), marked, Some(self.name_any())].into_iter().flatten()
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Its Node among `nodes`: by [`Self::node_names`] in order, else the one with its Talos
    /// API address among its addresses.
    #[must_use]
    pub fn node_in<'a>(&self, nodes: &'a [std::sync::Arc<Node>]) -> Option<&'a Node> {
        let names = self.node_names();
        names
            .iter()
            .find_map(|name| nodes.iter().map(AsRef::as_ref).find(|n| n.metadata.name.as_ref() == Some(name)))
            .or_else(|| {
                nodes.iter().map(AsRef::as_ref).find(|n| {
                    let addresses = n.status.as_ref().and_then(|s| s.addresses.as_ref());
                    addresses.is_some_and(|a| a.iter().any(|a| a.address == self.spec.address))
                })
            })
    }
}

/// A machine's progress: its conditions (`TalosUpgrade`, `StorageEvacuation`,
/// `NodeRemoval`), which a restarted controller resumes from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineStatus {
    /// Its conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Every change of a condition's status or reason, oldest first, the last
    /// [`MACHINE_HISTORY`] kept: what `kubectl ichor timeline` draws an operation from once
    /// its Events have expired. Written with the conditions, in the same request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<MachineStep>,
    /// How its last upgrade went, once it converged: what a plan of the next one
    /// (`spec.dryRun`) learns from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_upgrade: Option<LastUpgrade>,
}

/// A machine's last upgrade, from its [`MachineStep`]s: its turn, end to end and by step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastUpgrade {
    /// When its turn began (its first step after its previous convergence).
    pub start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// When it converged.
    pub converged: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// From its start to its convergence, seconds.
    pub seconds: f64,
    /// Each step's duration, seconds: `evacuation` (storage moved off it: from its
    /// opening to the call's intent or the pull), `pull` (the lifecycle executor's pull of
    /// the installer, about 0 when a pre-pull put it there), `upgrade` (from the Upgrade
    /// call to convergence: pull, drain, install, reboot, Ready, verification), `install`
    /// and `reboot` (a lifecycle upgrade's: from its install, and from its Reboot call, to
    /// convergence); and, where its Node's turning Ready again was seen, `ready` (from the
    /// Upgrade or Reboot call to the Node Ready: Talos's pull, drain and install inside
    /// the call, the reboot, the kubelet's return) and `verification` (from Ready to
    /// convergence: the version, the etcd member, the uncordon). A legacy Upgrade call's
    /// pull is no step of its own: it is Talos's, inside the call, unseen.
    pub steps: BTreeMap<String, f64>,
    /// The bytes its evacuation moved off it at most (what was on it when the evacuation
    /// began, as the storage backend recorded it); absent with no evacuation, or none
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = int64_format)]
    pub evacuated_bytes: Option<u64>,
}

/// The durations of the steps of a machine's last upgrade, from its history: each step
/// from the last time it began to the step that ended it, before the convergence.
#[must_use]
pub fn step_durations(history: &[MachineStep]) -> Vec<(&'static str, f64)> {
    let at = |i: usize| history[i].time.0.as_millisecond();
    let last = |type_: &str, reason: &str, before: usize| {
        (0..before).rev().find(|&i| history[i].type_ == type_ && history[i].reason == reason)
    };
    let Some(end) = history.len().checked_sub(1) else { return Vec::new() };
    let mut durations = Vec::new();
    // The evacuation: from its opening to the first step after it that is not its own
    // (the call's intent, the pull) or to its end, whichever comes first. The engine keeps
    // storage off the node until the machine converges, so its `Ended` alone would measure
    // the whole turn, not the move.
    if let Some(open) = last("StorageEvacuation", "Evacuating", end + 1) {
        let moved = history[open + 1..]
            .iter()
            .find(|s| s.type_ != "StorageEvacuation" || s.reason == "Ended" || s.reason == "TimedOut")
            .map(MachineStep::began_ms);
        if let Some(moved) = moved {
            #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
            durations.push(("evacuation", (moved - at(open)).max(0) as f64 / 1000.0));
        }
    }
    if let Some(pull) = last(lifecycle::INSTALLER_PULL, lifecycle::PULLED, end + 1)
        && let Some(seconds) = history[pull].seconds
    {
        durations.push(("pull", seconds));
    }
    let spans = [
        ("upgrade", ("TalosUpgrade", "UpgradeRequested"), ("TalosUpgrade", "Converged")),
        ("install", ("TalosLifecycle", "InstallRunning"), ("TalosLifecycle", "Installed")),
        ("reboot", ("TalosLifecycle", "RebootRequested"), ("TalosLifecycle", "Converged")),
    ];
    for (step, (start_type, start_reason), (end_type, end_reason)) in spans {
        let Some(stop) = last(end_type, end_reason, end + 1) else { continue };
        let Some(start) = last(start_type, start_reason, stop) else { continue };
        #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
        durations.push((step, (at(stop) - at(start)).max(0) as f64 / 1000.0));
    }
    durations
}

/// Whether `step` is an upgrade's convergence (of a Talos Upgrade call or a lifecycle
/// install).
fn converges(step: &MachineStep) -> bool {
    (step.type_ == "TalosUpgrade" || step.type_ == "TalosLifecycle") && step.reason == "Converged"
}

/// The last upgrade `history` ends with, when its last step is a convergence: from the
/// first step after the convergence before it (or the first kept) to it. `ready`: when
/// the machine's Node last turned Ready, if known; within the upgrade's call (or Reboot
/// call) and its convergence, it splits that span into `ready` and `verification`.
#[must_use]
pub fn last_upgrade(history: &[MachineStep], ready: Option<&Time>) -> Option<LastUpgrade> {
    let end = history.last().filter(|s| converges(s))?;
    // The convergence may be recorded by more than one condition in its write (a lifecycle
    // upgrade's `TalosLifecycle` and `TalosUpgrade`): the upgrade began after the one
    // before them.
    let ending = history.iter().rposition(|s| !converges(s)).map_or(0, |i| i + 1);
    let first = history[..ending].iter().rposition(converges).map_or(0, |i| i + 1);
    let start = history[first..].iter().find(|s| s.type_ != "NodeRemoval")?;
    // A first step that records its own span (the pull) began that much before it.
    let start = Time(k8s_openapi::jiff::Timestamp::from_millisecond(start.began_ms()).unwrap_or(start.time.0));
    #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
    let seconds_between =
        |from: &Time, to: &Time| (to.0.as_millisecond() - from.0.as_millisecond()).max(0) as f64 / 1000.0;
    let mut steps: BTreeMap<String, f64> =
        step_durations(&history[first..]).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    // The call whose reboot the Node's Ready ends: the Upgrade call, or the Reboot call.
    let called = history[first..].iter().rev().find(|s| {
        (s.type_ == "TalosUpgrade" && s.reason == "UpgradeRequested")
            || (s.type_ == "TalosLifecycle" && s.reason == "RebootRequested")
    });
    if let (Some(called), Some(ready)) = (called, ready)
        && called.time.0 <= ready.0
        && ready.0 <= end.time.0
    {
        steps.insert("ready".to_owned(), seconds_between(&called.time, ready));
        steps.insert("verification".to_owned(), seconds_between(ready, &end.time));
    }
    Some(LastUpgrade {
        seconds: seconds_between(&start, &end.time),
        start,
        converged: end.time.clone(),
        steps,
        evacuated_bytes: history[first..].iter().rev().find_map(|s| s.bytes),
    })
}

/// How many [`MachineStep`]s a machine keeps: a few operations' worth (an upgrade takes
/// about six).
pub const MACHINE_HISTORY: usize = 32;

/// Kubernetes knows `int32` and `int64` for an integer, not schemars' `uint64`, and the API
/// server warns of an unrecognized format at every apply of the CRD (issue 55): a `u64`
/// field says `int64`, its `minimum: 0` kept. Every `uint*` format in `schema`, at any
/// depth, becomes the signed one of its width.
fn int64_format(schema: &mut schemars::Schema) {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(format)) = map.get_mut("format")
                    && let Some(width) = format.strip_prefix("uint")
                {
                    *format = format!("int{width}");
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(object) = schema.as_object_mut() {
        object.values_mut().for_each(walk);
        if let Some(serde_json::Value::String(format)) = object.get_mut("format")
            && let Some(width) = format.strip_prefix("uint")
        {
            *format = format!("int{width}");
        }
    }
}

/// A condition of a machine entering a status and reason.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStep {
    /// The condition's type, such as `TalosUpgrade`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason, such as `UpgradeRequested`.
    pub reason: String,
    /// When it entered them (the condition's `lastTransitionTime`).
    pub time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// For the opening of a storage evacuation (`StorageEvacuation` `Evacuating`): the
    /// bytes on the node then, as the storage backend recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = int64_format)]
    pub bytes: Option<u64>,
    /// For a step recorded at its end that says how long it took (the lifecycle
    /// executor's pull of the installer, `InstallerPull` `Pulled`): its seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

impl MachineStep {
    /// When the step began, Unix milliseconds: its time, less its own span if it records
    /// one.
    #[must_use]
    pub fn began_ms(&self) -> i64 {
        #[allow(clippy::cast_possible_truncation, reason = "a pull's seconds, far within i64 milliseconds")]
        let span = self.seconds.map_or(0, |s| (s * 1000.0).round() as i64);
        self.time.0.as_millisecond() - span
    }
}

impl TalosMachineStatus {
    /// This status with `conditions`, its history extended by each condition whose status
    /// or reason they change (the oldest dropped beyond [`MACHINE_HISTORY`]).
    #[must_use]
    pub fn with_conditions(&self, conditions: Vec<Condition>) -> Self {
        self.with_conditions_and_ready(conditions, None)
    }

    /// [`Self::with_conditions`], with when the machine's Node last turned Ready (its
    /// `Ready` condition's `lastTransitionTime`, as the writer's store has it): an upgrade
    /// that converges in this write gets its `ready` and `verification` steps from it.
    #[must_use]
    pub fn with_conditions_and_ready(&self, conditions: Vec<Condition>, ready: Option<&Time>) -> Self {
        let mut history = self.history.clone();
        for condition in &conditions {
            let before = self.conditions.iter().find(|c| c.type_ == condition.type_);
            // A pull is recorded anew at each intent with the same status and reason: its
            // transition time tells a new one.
            let pull = condition.type_ == lifecycle::INSTALLER_PULL;
            if before.is_some_and(|b| {
                b.status == condition.status
                    && b.reason == condition.reason
                    && (!pull || b.last_transition_time == condition.last_transition_time)
            }) {
                continue;
            }
            let opens_evacuation =
                condition.type_ == evacuation::STORAGE_EVACUATION && condition.reason == evacuation::reason::EVACUATING;
            history.push(MachineStep {
                type_: condition.type_.clone(),
                status: condition.status.clone(),
                reason: condition.reason.clone(),
                time: condition.last_transition_time.clone(),
                bytes: opens_evacuation.then(|| evacuation::bytes_from_message(&condition.message)).flatten(),
                seconds: (pull && condition.reason == lifecycle::PULLED)
                    .then(|| lifecycle::pulled_seconds(&condition.message))
                    .flatten(),
            });
        }
        // A convergence just recorded is the end of an upgrade: its durations are kept
        // (before the oldest steps are dropped, which may hold its start).
        let before = self.history.len();
        let last_upgrade = history[before..]
            .iter()
            .rposition(converges)
            .and_then(|i| last_upgrade(&history[..=before + i], ready))
            .or_else(|| self.last_upgrade.clone());
        let excess = history.len().saturating_sub(MACHINE_HISTORY);
        history.drain(..excess);
        Self { conditions, history, last_upgrade }
    }
}

/// An operation on a cluster: an upgrade of Talos (`kind: talos`) or of Kubernetes (`kind:
/// kubernetes`), or a machine's removal (`kind: remove`). Other kinds are refused, never
/// run as another.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ichor.dev",
    version = "v1alpha1",
    kind = "TalosOperation",
    doc = "An operation on a Talos cluster: an upgrade of Talos (kind talos) or of Kubernetes (kind kubernetes), or a machine's removal (kind remove), under the cluster's lock.",
    plural = "talosoperations",
    shortname = "top",
    category = "ichor",
    namespaced,
    status = "TalosOperationStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.kind"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetVersion"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason"}"#,
    printcolumn = r#"{"name":"Waiting-For","type":"string","jsonPath":".status.waitingFor"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#,
    // A started operation's target never changes (issue 53 item 1): a control plane between
    // two targets could skip a minor, a kubelet pass its API servers. The engine refuses
    // it too (TargetChanged), behind an API server that does not check this. The rule
    // compares the spec with the old spec, not with the status: a status write (the spec
    // unchanged) always passes, so the engine can record its refusal of a target changed
    // before the rule saw it.
    validation = Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.startedTarget) || (has(self.spec.targetVersion) && has(oldSelf.spec.targetVersion) && self.spec.targetVersion == oldSelf.spec.targetVersion)"
    ).message("spec.targetVersion cannot change once the operation started (status.startedTarget): delete it and create another for the new target")
)]
#[serde(rename_all = "camelCase")]
// Refused by the API server itself (CEL rules, Kubernetes 1.25 and later), before any
// controller sees it, where a pattern cannot say it: a removal that names no machine has
// nothing to act on, an upgrade that names one would read as an upgrade of that machine
// alone, and an upgrade with no target has nowhere to go. The controller checks the same
// (`OperationSpec::validate`) for API servers without CEL.
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.kind != 'remove' || (has(self.machine) && size(self.machine) > 0)",
        "message": "a removal names the TalosMachine to remove in spec.machine"
    },
    {
        "rule": "self.kind == 'remove' || !has(self.machine)",
        "message": "spec.machine is only for kind remove: an upgrade takes every machine of the cluster"
    },
    {
        "rule": "self.kind != 'talos' || (has(self.targetVersion) && size(self.targetVersion) > 0)",
        "message": "an upgrade (kind talos) names its Talos version in spec.targetVersion"
    },
    {
        "rule": "self.kind != 'kubernetes' || (has(self.targetVersion) && size(self.targetVersion) > 0)",
        "message": "a Kubernetes upgrade (kind kubernetes) names its Kubernetes version in spec.targetVersion"
    }
]))]
pub struct TalosOperationSpec {
    /// The `TalosCluster` it operates on, in the same namespace.
    #[schemars(length(min = 1))]
    pub cluster: String,
    /// `talos` (upgrade every machine's Talos to `targetVersion`), `kubernetes` (upgrade
    /// every machine's Kubernetes to `targetVersion`) or `remove` (remove `machine`). The
    /// schema admits no other; a controller behind an API server that does not check it
    /// refuses any other with a Warning Event, never running it as another.
    #[schemars(extend("enum" = ["talos", "kubernetes", "remove"]))]
    pub kind: String,
    /// For `talos` (required): the Talos version to upgrade to, such as `v1.14.4`; it must
    /// be the cluster's `talosVersion`. For `kubernetes` (required): the Kubernetes version,
    /// such as `1.35.0`, at most one minor above the control planes'.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$"))]
    pub target_version: String,
    /// For `talos` and `kubernetes`: how many workers may be unavailable (or restart their
    /// kubelet) at once: a count, 1 (the default) to 4294967295, or a percentage of the
    /// cluster's workers, `"1%"` to `"100%"`, rounded down and at least 1. Control planes
    /// always go one at a time.
    #[serde(default = "one")]
    #[schemars(schema_with = "count_or_percentage")]
    pub max_unavailable: MaxUnavailable,
    /// For `talos` and `kubernetes`: maintenance windows in place of the cluster's
    /// (`TalosCluster.spec.maintenance`, which says how they read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "maintenance")]
    pub maintenance: Option<MaintenanceSpec>,
    /// For `talos` and `kubernetes`: health gates in place of the cluster's
    /// (`TalosCluster.spec.gates`, which says how they read); an empty list: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "gates")]
    pub gates: Option<Vec<GateSpec>>,
    /// For `remove` (required, and only for `remove`): the `TalosMachine` to remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// For `talos`: what the preflight gate does with a machine it finds blockers for
    /// (another node not Ready or cordoned, a PodDisruptionBudget at zero over a pod on
    /// its node, a single-replica workload there, a workload whose Ready pods all run
    /// there): `Enforce` (the default) does not start it and waits, naming them; `Warn`
    /// starts it and records them in a Warning Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Preflight>,
    /// For `talos`: `Required` (the default) streams an etcd snapshot from a healthy
    /// control plane into the operator's snapshot store and records it in
    /// `status.etcdSnapshot` before the first control plane's Upgrade call; failing to
    /// take it pauses the operation before any control plane is touched. `Skip` takes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshot: Option<EtcdSnapshotMode>,
    /// For `talos`: `true` plans the upgrade and touches nothing (no lock, no machine, no
    /// Talos call): the operator reads the cluster (its machines, Nodes, budgets and
    /// workloads) and the durations its machines recorded in their last upgrade, draws
    /// the rollout 200 times, and writes `status.plan`: the makespan's p10, p50 and p90,
    /// the physical bound, the order, the machines the preflight would hold now and why,
    /// and what it assumed. The operation is then Completed (reason `Planned`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// For `remove`: `true` goes on with the removal of a control plane that leaves two.
    /// Without it that removal is refused (`LeavesTwoControlPlanes`): a two-member etcd
    /// tolerates no failure, and the next upgrade refuses the cluster. Add a control plane
    /// first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_two_control_planes: bool,
}

/// `spec.etcdSnapshot`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
// No description of its own: the field's documentation is the one `kubectl explain` shows.
#[schemars(description = "")]
pub enum EtcdSnapshotMode {
    /// A snapshot is taken before the first control plane.
    Required,
    /// None is taken.
    Skip,
}

impl From<EtcdSnapshotMode> for ichor_upgrade_core::operation::SnapshotMode {
    fn from(value: EtcdSnapshotMode) -> Self {
        match value {
            EtcdSnapshotMode::Required => Self::Required,
            EtcdSnapshotMode::Skip => Self::Skip,
        }
    }
}

/// `spec.preflight`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
// No description of its own: the field's documentation is the one `kubectl explain` shows.
#[schemars(description = "")]
pub enum Preflight {
    /// Machines with blockers wait.
    Enforce,
    /// Machines with blockers start; the blockers are recorded.
    Warn,
}

impl From<Preflight> for ichor_upgrade_core::operation::PreflightMode {
    fn from(value: Preflight) -> Self {
        match value {
            Preflight::Enforce => Self::Enforce,
            Preflight::Warn => Self::Warn,
        }
    }
}

fn one() -> MaxUnavailable {
    MaxUnavailable::Count(1)
}

/// `maxUnavailable`'s schema: an integer from 1 to the engine's largest (a u32), or the
/// text of a percentage. The API server applies `minimum` and `maximum` to a number only,
/// `pattern` and `maxLength` to a string only, so each kind is checked at admission by its
/// own rules, naming them. Not nullable (kube marks an int-or-string field nullable unless
/// told): the API server drops a `null` and defaults the field, where the engine could not
/// read it.
fn count_or_percentage(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "nullable": false,
        "minimum": 1,
        "maximum": 4_294_967_295_i64,
        "maxLength": 4,
        "pattern": "^(100|[1-9][0-9]?)%$",
    })
}

/// Counts of the machines an operation concerns.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineCounts {
    /// Every machine the operation concerns.
    pub total: i64,
    /// On the target (or removed), verified.
    pub converged: i64,
    /// Started and not yet converged.
    pub in_progress: i64,
    /// Failed: the operation is paused.
    pub failed: i64,
}

/// Where an operation stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationStatus {
    /// `Pending`, `Progressing`, `Waiting`, `Paused`, `Completed` or `Refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The CamelCase reason of the phase (the same as its Events').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the phase means now, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generation the phase was decided from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Converged machines out of all, such as `3/8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The started machine that waits on a deadline soonest, until when and why (such as
    /// an Upgrade call that may still be in flight), and how many more wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Machine counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines: Option<MachineCounts>,
    /// The target the operation started with, as written: once set, `spec.targetVersion`
    /// cannot change (refused at admission, and by the engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_target: Option<String>,
    /// The morning-after audit, judged when the upgrade first said Completed: whether it
    /// found nothing, else each finding (a Node left cordoned, a static pod crash-looping,
    /// a Node not Ready or not on the target, etcd unhealthy, a budget at zero, a read that
    /// failed), each also a Warning Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
    /// kstatus's `Ready` (True once Completed), `Reconciling` (True while it works or
    /// waits) and `Stalled` (True when Paused or Refused), which Argo CD and Flux read, and
    /// `Completed`, `Paused` and `Refused`; each True or False with its own reason, its
    /// `lastTransitionTime` the last change of its status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The etcd snapshot taken before the first control plane, once taken whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshot: Option<EtcdSnapshotStatus>,
    /// The engine's own state between passes (its phase, the resume token acted upon, and
    /// a record per started machine); read back on every pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub engine: Option<serde_json::Value>,
    /// A dry run's plan (`spec.dryRun`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// Once a real operation completed after a dry run of the same cluster: the plan
    /// against what happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// The notices this operation owes its cluster's receivers and what became of each
    /// (`spec.notifications` of its TalosCluster): the outbox a new leader goes on from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<NotificationsStatus>,
}

/// `status.audit`: what the morning-after audit found.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditStatus {
    /// Whether it found nothing.
    pub clean: bool,
    /// Each finding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<AuditFinding>,
}

/// One finding of the audit.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditFinding {
    /// Its CamelCase reason (`LeftCordoned`, `StaticPodCrashLooping`, `NodeNotReady`,
    /// `NodeNotOnTarget`, `EtcdUnhealthy`, `EtcdLearner`, `EtcdAlarm`, `BudgetAtZero`,
    /// `AuditNotRead`).
    pub reason: String,
    /// What it found, for people.
    pub message: String,
}

/// `status.notifications`: an operation's outbox.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationsStatus {
    /// The wait the operation is in, and since when, while its phase is `Waiting`: a
    /// notice is owed once it lasts `waitingAfterSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitingSince>,
    /// A record per notice and receiver, in the order the notices were owed.
    #[serde(default)]
    pub records: Vec<NotificationRecord>,
}

/// A wait's reason and its beginning, as the notifier first saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingSince {
    /// The phase's reason, such as `EtcdUnhealthy`.
    pub reason: String,
    /// When it was first seen.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// A notice owed to one receiver, and what became of it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationRecord {
    /// The notice's id, the same across passes and replicas (sent as `Ichor-Event-Id`),
    /// such as `<uid>/completed`.
    pub id: String,
    /// The receiver's name (`spec.notifications.sinks[].name`).
    pub sink: String,
    /// `Started`, `MachineFailed`, `Paused`, `Waiting` or `Completed`.
    pub event: String,
    /// What it says.
    pub message: String,
    /// `Pending` (due at `nextAttempt`), `Sending` (an attempt made, its answer not yet
    /// recorded: sent again, with the same id, by a leader that finds it so),
    /// `Delivered` (the receiver answered 2xx) or `GaveUp`.
    pub state: String,
    /// The attempts made.
    pub attempts: i64,
    /// When it was owed.
    pub owed: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// When the next attempt is due, after a failed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Why the last attempt failed (never the URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// `status.plan`: what a dry run predicts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// The makespan (from the operation's start to its last machine's convergence) one
    /// run in ten beats, seconds.
    pub p10_seconds: f64,
    /// The median makespan, seconds.
    pub p50_seconds: f64,
    /// The makespan nine runs in ten beat, seconds.
    pub p90_seconds: f64,
    /// The median run's physical bound: its control planes' turns in a row, then its
    /// workers' spread over `maxUnavailable` (or its longest), with no lead or reaction.
    pub bound_seconds: f64,
    /// How many runs were drawn.
    pub runs: i64,
    /// The machines in the order they would go (held ones left out).
    pub order: Vec<String>,
    /// Each machine the preflight (or a hold) would hold now, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<PlanHeld>,
    /// Where the durations came from: the operation whose recorded turns were drawn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
    /// What it assumed for want of a record, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assumed: Vec<String>,
    /// The median run, machine by machine, for `kubectl ichor timeline`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub median_run: Vec<PlannedMachine>,
    /// Each phase's distribution per role the turns were drawn from: recorded, or a
    /// default range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PlanPhase>,
    /// A Kubernetes upgrade's dry run: what would change on each node, and what the
    /// target removes that is still in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesPlanned>,
    /// With maintenance windows (`spec.maintenance`): how the median run goes through
    /// them from the dry run's instant, each start admitted on its role's p90 turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<PlanWindows>,
    /// With health gates (`spec.gates`): each gate as the dry run read it, whether it
    /// would hold a start now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<PlanGate>,
}

/// A health gate as a dry run read it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanGate {
    /// The gate.
    pub name: String,
    /// When it is checked (`beforeMachine`, ...).
    pub phase: String,
    /// Whether it holds now.
    pub holds: bool,
    /// What it read: `holds`, or the object (or alert) it fails on and its value, or why
    /// it could not be read.
    pub message: String,
}

/// How a dry run's median run goes through the maintenance windows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanWindows {
    /// How many windows its starts fall in; absent when a turn fits in none of the next
    /// two months' windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed: Option<i64>,
    /// When its last turn would end (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// What it says, for people.
    pub message: String,
}

/// What a Kubernetes upgrade's dry run found, beside its timing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesPlanned {
    /// Each component that would change, in the order the upgrade changes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<PlannedChange>,
    /// The APIs the target removes that are still requested, or whose stored objects
    /// only removed versions serve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_apis: Vec<PlannedRemovedApi>,
    /// The flags, feature gates and admission plugins the target removes that the
    /// machines' configurations still set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_flags: Vec<PlannedRemovedFlag>,
    /// Why the upgrade would be refused, each cause once (empty: it would go).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<PlanRefusal>,
}

/// One component a Kubernetes upgrade would change.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedChange {
    /// The node (its TalosMachine's name); `cluster` for kube-proxy, a DaemonSet.
    pub node: String,
    /// `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`, `kube-proxy` or
    /// `kubelet`.
    pub component: String,
    /// The version it runs now.
    pub from: String,
    /// The version it would run.
    pub to: String,
}

/// An API the target removes, still in use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedRemovedApi {
    /// The API group (empty for the core group).
    pub group: String,
    /// The version (for stored objects, every version serving them, joined by `,`).
    pub version: String,
    /// The resource (plural).
    pub resource: String,
    /// The release that removes it, such as `1.36`.
    pub removed_release: String,
    /// How many uses were seen.
    pub count: i64,
    /// `Requests` (since the API server started) or `StoredObjects`.
    pub seen_as: String,
}

/// A flag, feature gate or admission plugin the target removes, still set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedRemovedFlag {
    /// The node whose configuration sets it.
    pub node: String,
    /// The component started with it.
    pub component: String,
    /// `flag`, `feature gate` or `admission plugin`.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The release that removed it.
    pub removed_release: String,
}

/// A reason an upgrade would be refused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanRefusal {
    /// CamelCase.
    pub reason: String,
    /// For people.
    pub message: String,
}

/// One phase's distribution for one role in a plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanPhase {
    /// `control-plane` or `worker`.
    pub role: String,
    /// The phase (`evacuating`, `installing`, `draining`, `rebooting`, `waiting-ready`,
    /// `verifying`; `turn`: the whole turn; a default's own name).
    pub phase: String,
    /// How many recorded turns went through it (0 for a default).
    pub samples: i64,
    /// One in ten is shorter, seconds.
    pub p10_seconds: f64,
    /// The median, seconds.
    pub p50_seconds: f64,
    /// Nine in ten are shorter, seconds.
    pub p90_seconds: f64,
    /// Whether it comes from the record (else from a default range).
    pub recorded: bool,
}

/// A machine a plan holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanHeld {
    /// The TalosMachine.
    pub machine: String,
    /// Why.
    pub reason: String,
}

/// A machine's turn in a plan's median run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMachine {
    /// The TalosMachine.
    pub machine: String,
    /// `control-plane` or `worker`.
    pub role: String,
    /// Its start, seconds from the operation's.
    pub start_seconds: f64,
    /// Its convergence, seconds from the operation's start.
    pub end_seconds: f64,
}

/// `status.calibration`: a plan against what happened.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Calibration {
    /// The dry run whose plan this is.
    pub plan: String,
    /// Its p10, seconds.
    pub p10_seconds: f64,
    /// Its p50, seconds.
    pub p50_seconds: f64,
    /// Its p90, seconds.
    pub p90_seconds: f64,
    /// This operation's makespan, seconds.
    pub actual_seconds: f64,
    /// `(actual - p50) / p50`, percent.
    pub error_percent: f64,
    /// Whether the makespan fell between p10 and p90.
    pub within_band: bool,
}

/// `status.etcdSnapshot`: where the snapshot is and how to check it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSnapshotStatus {
    /// Where it is (a path in the operator's snapshot volume, an `s3://` URL).
    pub location: String,
    /// Its size in bytes.
    pub size: i64,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
    /// The control plane it was streamed from.
    pub node: String,
    /// When it was finished.
    pub time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// `maintenance`'s schema: the shapes the engine reads, checked at admission as far as a
/// schema can (five cron fields, a duration of hours and minutes, instants with offsets);
/// the engine reads the schedules and time zones again and refuses an upgrade whose
/// windows do not read (`InvalidMaintenance`), touching nothing.
fn maintenance(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": {
            "windows": {
                "type": "array",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "required": ["schedule", "duration"],
                    "properties": {
                        "schedule": {
                            "type": "string",
                            "description": "When it opens: five cron fields (minute hour day-of-month month day-of-week), such as `0 2 * * SAT,SUN`, in timeZone.",
                            "maxLength": 128,
                            "pattern": "^(@[a-z]+|\\S+(\\s+\\S+){4})$"
                        },
                        "duration": {
                            "type": "string",
                            "description": "How long it stays open, elapsed time: `4h`, `90m`, `1h30m` (a minute to a week).",
                            "maxLength": 16,
                            "pattern": "^([0-9]+h)?([0-9]+m)?$",
                            "minLength": 2
                        },
                        "timeZone": {
                            "type": "string",
                            "description": "The IANA time zone the schedule is read in, such as `Europe/Berlin` (UTC if left out).",
                            "minLength": 1,
                            "maxLength": 64
                        }
                    }
                }
            },
            "blackouts": {
                "type": "array",
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "required": ["start", "end"],
                    "properties": {
                        "start": {"type": "string", "format": "date-time", "description": "When it begins (RFC 3339, with its offset)."},
                        "end": {"type": "string", "format": "date-time", "description": "When it ends."},
                        "reason": {"type": "string", "maxLength": 256, "description": "Why, for people."}
                    },
                    "x-kubernetes-validations": [{
                        "rule": "timestamp(self.end) > timestamp(self.start)",
                        "message": "a blackout's end is after its start"
                    }]
                }
            }
        }
    })
}

/// `gates`' schema: the shapes the engine reads, checked at admission as far as a schema
/// can (an expression is compiled by the engine, which refuses the upgrade when it does
/// not).
fn gates(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 16,
        "x-kubernetes-validations": [{
            "rule": "self.all(g, self.exists_one(h, h.name == g.name))",
            "message": "each gate's name is its own"
        }],
        "items": {
            "type": "object",
            "required": ["name", "phase"],
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.objects) != has(self.alerts)",
                    "message": "a gate reads objects (with an expression) or alerts, one of the two"
                },
                {
                    "rule": "has(self.objects) == has(self.expression)",
                    "message": "objects need an expression, and an expression needs objects"
                }
            ],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                         "description": "The gate's name, said in a wait and a pause."},
                "objects": {
                    "type": "object",
                    "required": ["apiVersion", "kind"],
                    "description": "The objects it reads: one kind, in a namespace (every one if left out), by name or labels.",
                    "properties": {
                        "apiVersion": {"type": "string", "minLength": 1, "maxLength": 253, "description": "Such as `longhorn.io/v1beta2`, or `v1`."},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "description": "Such as `Volume`."},
                        "namespace": {"type": "string", "maxLength": 63},
                        "name": {"type": "string", "maxLength": 253},
                        "labelSelector": {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string", "maxLength": 63}}
                    }
                },
                "expression": {"type": "string", "minLength": 1, "maxLength": 4096,
                               "description": "CEL over `object`, true when it is as it should be, such as `object.status.robustness == 'healthy'`."},
                "alerts": {
                    "type": "object",
                    "description": "An alert gate: it holds while no alert its matchers select fires, in one Alertmanager or one Prometheus (but for alerts Ichor's own silence covers).",
                    "x-kubernetes-validations": [
                        {
                            "rule": "has(self.alertmanager) != has(self.prometheus)",
                            "message": "name one source, alertmanager or prometheus"
                        },
                        {
                            "rule": "!has(self.silence) || has(self.alertmanager)",
                            "message": "a silence needs alertmanager: Prometheus holds no silences"
                        }
                    ],
                    "properties": {
                        "alertmanager": {"type": "string", "maxLength": 2048, "pattern": "^https?://",
                                         "description": "Alertmanager's base URL, such as `http://alertmanager.monitoring:9093`."},
                        "prometheus": {"type": "string", "maxLength": 2048, "pattern": "^https?://",
                                       "description": "Prometheus's base URL, such as `http://prometheus.monitoring:9090` (its firing alerts)."},
                        "matchers": {"type": "array", "maxItems": 16,
                                     "items": {"type": "string", "minLength": 2, "maxLength": 1024},
                                     "description": "Label matchers every alert it waits on carries: `name=value`, `name!=value`, `name=~regex`, `name!~regex`."},
                        "silence": {
                            "type": "object",
                            "description": "Silence the alerts about each machine in its turn, as a lease the leader renews (Alertmanager only).",
                            "x-kubernetes-validations": [{
                                "rule": "(has(self.maxSeconds) ? self.maxSeconds : 3600) >= (has(self.leaseSeconds) ? self.leaseSeconds : 300)",
                                "message": "maxSeconds is at least leaseSeconds"
                            }],
                            "properties": {
                                "nodeLabel": {"type": "string", "minLength": 1, "maxLength": 63,
                                              "description": "The alert label that names a machine's Node (default `node`)."},
                                "matchers": {"type": "array", "maxItems": 16,
                                             "items": {"type": "string", "minLength": 2, "maxLength": 1024},
                                             "description": "More matchers the silence carries."},
                                "leaseSeconds": {"type": "integer", "format": "int64", "minimum": 10, "maximum": 86400,
                                                 "description": "How long each renewal holds it (default 300)."},
                                "maxSeconds": {"type": "integer", "format": "int64", "minimum": 10, "maximum": 604800,
                                               "description": "The longest it lasts from its first start (default 3600)."}
                            }
                        }
                    }
                },
                "phase": {"type": "string", "enum": ["beforeMachine", "afterMachine", "beforeOperation", "afterOperation"]},
                "scope": {
                    "type": "object",
                    "properties": {
                        "role": {"type": "string", "enum": ["controlPlane", "worker"]},
                        "wave": {"type": "integer", "format": "int64", "description": "An `ichor.dev/order` wave."}
                    }
                },
                "settleSeconds": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 86400,
                                  "description": "How long it must hold, without a break, before it passes."},
                "timeoutSeconds": {"type": "integer", "format": "int64", "minimum": 1, "maximum": 604800,
                                   "description": "How long a start waits on it before the operation pauses (never, if left out)."}
            }
        }
    })
}

/// An object whose fields the API server keeps as written.
fn preserved_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// Which nodes carry storage: those its selector selects are evacuated before they go
/// down, through the storage backend (Longhorn).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ichor.dev",
    version = "v1alpha1",
    kind = "TalosStorage",
    doc = "Which nodes carry storage to evacuate before they go down.",
    plural = "talosstorages",
    shortname = "tst",
    category = "ichor",
    namespaced,
    status = "TalosStorageStatus",
    printcolumn = r#"{"name":"Backend","type":"string","jsonPath":".spec.backend"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TalosStorageSpec {
    /// The storage system: `longhorn`.
    #[serde(default = "default_backend")]
    #[schemars(regex(pattern = r"^longhorn$"))]
    pub backend: String,
    /// The nodes it selects (by their labels). An empty selector selects every node.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// How long, in seconds, the replicas of a node it selects may take to move off
    /// before the operation pauses (`StorageEvacuation=False/TimedOut`; storage scheduling
    /// is put back): 60 to 604800, default 1800 (30 minutes). Size it to the data on the
    /// node and the bandwidth between nodes: a node with 2 TiB of replicas over 1 Gbit/s
    /// needs about six hours (`docs/storage-longhorn.md`). Where several storage objects
    /// select a node, the longest applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 604_800))]
    pub evacuation_timeout_seconds: Option<i64>,
}

fn default_backend() -> String {
    "longhorn".to_owned()
}

/// What the engine last saw of a storage object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosStorageStatus {
    /// Conditions about it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn condition(type_: &str, status: &str, reason: &str, secs: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap()),
            observed_generation: None,
        }
    }

    #[test]
    fn a_machines_history_records_each_change_of_status_or_reason_and_keeps_the_last_ones() {
        let status = TalosMachineStatus::default()
            .with_conditions(vec![condition("TalosUpgrade", "True", "UpgradeIntent", 10)])
            .with_conditions(vec![condition("TalosUpgrade", "True", "UpgradeIntent", 10)])
            .with_conditions(vec![
                condition("TalosUpgrade", "True", "UpgradeRequested", 12),
                condition("StorageEvacuation", "False", "Ended", 11),
            ]);
        let steps: Vec<(&str, &str, i64)> =
            status.history.iter().map(|s| (s.type_.as_str(), s.reason.as_str(), s.time.0.as_second())).collect();
        assert_eq!(
            steps,
            [
                ("TalosUpgrade", "UpgradeIntent", 10),
                ("TalosUpgrade", "UpgradeRequested", 12),
                ("StorageEvacuation", "Ended", 11)
            ],
            "the same condition again adds nothing"
        );
        let mut long = status;
        for i in 0..40 {
            long = long.with_conditions(vec![condition("TalosUpgrade", "True", &format!("R{i}"), 100 + i)]);
        }
        assert_eq!(long.history.len(), MACHINE_HISTORY);
        assert_eq!(long.history.last().unwrap().reason, "R39", "the newest kept, the oldest dropped");
    }

    #[test]
    fn a_convergence_records_the_upgrade_it_ends_and_keeps_it_until_the_next() {
        let step = |status: TalosMachineStatus, type_: &str, reason: &str, secs: i64| {
            let mut conditions = status.conditions.clone();
            conditions.retain(|c| c.type_ != type_);
            conditions.push(condition(type_, "True", reason, secs));
            status.with_conditions(conditions)
        };
        let mut status = TalosMachineStatus::default();
        status = step(status, "TalosUpgrade", "Converged", 5);
        assert_eq!(status.last_upgrade.as_ref().unwrap().seconds, 0.0, "a convergence with nothing before it");
        status = step(status, "StorageEvacuation", "Evacuating", 100);
        status = step(status, "StorageEvacuation", "Ended", 160);
        status = step(status, "TalosUpgrade", "UpgradeIntent", 161);
        status = step(status, "TalosUpgrade", "UpgradeRequested", 162);
        assert_eq!(status.last_upgrade.as_ref().unwrap().seconds, 0.0, "kept until the next convergence");
        status = step(status, "TalosUpgrade", "Converged", 400);
        let last = status.last_upgrade.clone().unwrap();
        assert_eq!((last.start.0.as_second(), last.converged.0.as_second(), last.seconds), (100, 400, 300.0));
        assert_eq!(last.steps, [("evacuation".to_owned(), 60.0), ("upgrade".to_owned(), 238.0)].into());
        assert_eq!(last.evacuated_bytes, None, "no bytes recorded, none claimed");
        // A write that changes nothing keeps it.
        let again = status.with_conditions(status.conditions.clone());
        assert_eq!(again.last_upgrade, Some(last));
    }

    #[test]
    fn the_nodes_ready_splits_the_call_into_ready_and_verification() {
        let steps = |ready: Option<i64>| {
            let ready = ready.map(|s| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
            let status = TalosMachineStatus::default()
                .with_conditions(vec![condition("TalosUpgrade", "True", "UpgradeRequested", 100)])
                .with_conditions_and_ready(vec![condition("TalosUpgrade", "False", "Converged", 400)], ready.as_ref());
            status.last_upgrade.unwrap().steps
        };
        let split = steps(Some(370));
        assert_eq!((split["upgrade"], split["ready"], split["verification"]), (300.0, 270.0, 30.0));
        // A Ready from before the call (a reboot the Node never showed), or none known: no split.
        for ready in [Some(50), None] {
            let steps = steps(ready);
            assert!(!steps.contains_key("ready") && !steps.contains_key("verification"), "{ready:?}: {steps:?}");
        }
        // A lifecycle upgrade: from its Reboot call.
        let ready = Time(k8s_openapi::jiff::Timestamp::from_second(260).unwrap());
        let status = TalosMachineStatus::default()
            .with_conditions(vec![condition("TalosLifecycle", "Unknown", "InstallRunning", 100)])
            .with_conditions(vec![condition("TalosLifecycle", "True", "Installed", 150)])
            .with_conditions(vec![condition("TalosLifecycle", "Unknown", "RebootRequested", 160)])
            .with_conditions_and_ready(
                vec![
                    condition("TalosLifecycle", "False", "Converged", 300),
                    condition("TalosUpgrade", "False", "Converged", 300),
                ],
                Some(&ready),
            );
        let steps = status.last_upgrade.unwrap().steps;
        assert_eq!((steps["reboot"], steps["ready"], steps["verification"]), (140.0, 100.0, 40.0));
    }

    #[test]
    fn the_bytes_an_evacuation_recorded_at_its_opening_are_the_upgrades_evacuated_bytes() {
        let opened = |bytes: Option<u64>| {
            let record = evacuation::EvacuationRecord {
                before: evacuation::Scheduling::ON,
                since: Some(ichor_upgrade_core::Timestamp::from_unix_millis(100_000)),
                bytes,
            };
            let storage = evacuation::StorageObservation { recorded: Some(record), ..Default::default() };
            let now = ichor_upgrade_core::Timestamp::from_unix_millis(100_000);
            let seen = evacuation::with_recorded_evacuation(
                &ichor_upgrade_core::conditions::Conditions::new(),
                &storage,
                "w-1",
                now,
            )
            .unwrap();
            let c = seen.get(evacuation::STORAGE_EVACUATION).unwrap();
            Condition {
                message: c.message.clone(),
                ..condition(evacuation::STORAGE_EVACUATION, "True", evacuation::reason::EVACUATING, 100)
            }
        };
        for bytes in [Some(32_212_254_720), None] {
            let status = TalosMachineStatus::default()
                .with_conditions(vec![opened(bytes)])
                .with_conditions(vec![
                    condition(evacuation::STORAGE_EVACUATION, "False", evacuation::reason::ENDED, 160),
                    condition("TalosUpgrade", "True", "UpgradeRequested", 161),
                ])
                .with_conditions(vec![
                    condition(evacuation::STORAGE_EVACUATION, "False", evacuation::reason::ENDED, 160),
                    condition("TalosUpgrade", "True", "Converged", 400),
                ]);
            assert_eq!(status.history[0].bytes, bytes, "the opening step keeps them");
            assert!(status.history[1..].iter().all(|s| s.bytes.is_none()));
            let last = status.last_upgrade.expect("converged");
            assert_eq!(last.evacuated_bytes, bytes);
            assert_eq!(last.steps["evacuation"], 60.0);
            // Written as the API server keeps it: absent when unknown.
            let json = serde_json::to_value(&last).unwrap();
            assert_eq!(json.get("evacuatedBytes").and_then(serde_json::Value::as_u64), bytes);
        }
    }

    #[test]
    fn an_evacuation_is_timed_to_the_call_not_to_its_end_at_the_convergence() {
        // The engine's own order: storage stays off the node until the machine converges,
        // and the evacuation's `Ended` is written with the convergence.
        let status = TalosMachineStatus::default()
            .with_conditions(vec![condition(
                evacuation::STORAGE_EVACUATION,
                "True",
                evacuation::reason::EVACUATING,
                100,
            )])
            .with_conditions(vec![condition("TalosUpgrade", "Unknown", "UpgradeIntent", 190)])
            .with_conditions(vec![condition("TalosUpgrade", "True", "UpgradeRequested", 191)])
            .with_conditions(vec![
                condition(evacuation::STORAGE_EVACUATION, "False", evacuation::reason::ENDED, 400),
                condition("TalosUpgrade", "False", "Converged", 400),
            ]);
        let last = status.last_upgrade.unwrap();
        assert_eq!((last.seconds, last.steps["evacuation"], last.steps["upgrade"]), (300.0, 90.0, 209.0));
    }

    #[test]
    fn a_lifecycle_pull_is_a_step_of_its_own_and_starts_the_turn() {
        let pulled = |secs: i64, took_ms: u64| Condition {
            message: lifecycle::pulled_message("installer:v1.14.4", std::time::Duration::from_millis(took_ms)),
            ..condition(lifecycle::INSTALLER_PULL, "True", lifecycle::PULLED, secs)
        };
        let upgrade = |status: TalosMachineStatus, at: i64, took_ms: u64| {
            status
                .with_conditions(vec![pulled(at, took_ms), condition("TalosLifecycle", "Unknown", "InstallIntent", at)])
                .with_conditions(vec![pulled(at, took_ms), condition("TalosLifecycle", "True", "Installed", at + 60)])
                .with_conditions(vec![
                    pulled(at, took_ms),
                    condition("TalosLifecycle", "Unknown", "RebootRequested", at + 70),
                ])
                // The engine records a lifecycle convergence in both conditions, in one write.
                .with_conditions(vec![
                    pulled(at, took_ms),
                    condition("TalosLifecycle", "False", "Converged", at + 200),
                    condition("TalosUpgrade", "False", "Converged", at + 200),
                ])
        };
        let first = upgrade(TalosMachineStatus::default(), 1_000, 42_500);
        let last = first.last_upgrade.clone().unwrap();
        assert_eq!(last.steps["pull"], 42.5);
        assert_eq!(last.start.0.as_millisecond(), 957_500, "the turn starts at the pull");
        assert_eq!(last.seconds, 242.5);
        assert_eq!(first.history.iter().filter(|s| s.type_ == lifecycle::INSTALLER_PULL).count(), 1);
        // The next upgrade's pull has the same status and reason, and is recorded anew;
        // pre-pulled, it took no time.
        let second = upgrade(first, 5_000, 0);
        let pulls: Vec<_> = second.history.iter().filter_map(|s| s.seconds).collect();
        assert_eq!(pulls, [42.5, 0.0]);
        let last = second.last_upgrade.unwrap();
        assert_eq!((last.steps["pull"], last.seconds, last.start.0.as_second()), (0.0, 200.0, 5_000));
    }

    #[test]
    fn a_machines_node_is_found_by_hostname_marker_name_or_address() {
        let node = |name: &str, address: &str| {
            std::sync::Arc::new(
                serde_json::from_value::<Node>(serde_json::json!({
                    "metadata": { "name": name },
                    "status": { "addresses": [{ "type": "InternalIP", "address": address }] },
                }))
                .unwrap(),
            )
        };
        let nodes = [node("w-1", "10.5.0.11"), node("talos-abc", "10.5.0.12"), node("w-3", "10.5.0.13")];
        let machine = |name: &str, hostname: Option<&str>, address: &str| {
            TalosMachine::new(
                name,
                TalosMachineSpec {
                    cluster: "prod".into(),
                    role: Role::Worker,
                    address: address.into(),
                    hostname: hostname.map(str::to_owned),
                },
            )
        };
        let found = |m: &TalosMachine| m.node_in(&nodes).map(|n| n.name_any());
        assert_eq!(found(&machine("w-1", None, "10.9.9.9")), Some("w-1".into()), "by its name");
        assert_eq!(found(&machine("w-1", Some("w-3"), "10.5.0.11")), Some("w-3".into()), "its hostname first");
        assert_eq!(found(&machine("w-1", Some(""), "10.9.9.9")), Some("w-1".into()), "an empty hostname names none");
        assert_eq!(found(&machine("w-2", None, "10.5.0.12")), Some("talos-abc".into()), "by its address");
        assert_eq!(found(&machine("w-2", None, "10.9.9.9")), None);
        // The node name its call's marker recorded (Talos's own nodename, read by the engine).
        let mut marked = machine("w-2", None, "10.9.9.9");
        let marker = "talos-upgrade/v1 target=v1.14.4 boot-id=b-1 call-deadline-ms=1000 node=talos-abc";
        marked.status = Some(TalosMachineStatus {
            conditions: vec![Condition {
                message: marker.into(),
                ..condition("TalosLifecycle", "Unknown", "RebootRequested", 5)
            }],
            ..TalosMachineStatus::default()
        });
        assert_eq!(marked.node_names(), ["talos-abc", "w-2"]);
        assert_eq!(found(&marked), Some("talos-abc".into()));
    }
}
