//! Desired state: a `TalosCluster` with `spec.upgrades: Automatic` is upgraded by changing
//! its `talosVersion` or `kubernetesVersion`, nothing else. The operator makes the
//! operation itself, owned by the cluster and named after its target (`talos-v1.14.4`,
//! `kubernetes-1.35.2`): Talos first, then Kubernetes, each target more than one minor
//! ahead as a chain of hops ([`ichor_upgrade_core::releases`]), one operation per hop,
//! the next made only once the last completed and the Nodes show it. It keeps the last
//! [`KEEP_COMPLETED`] completed operations it made and deletes older ones.
//!
//! What it decides ([`next`]) is a pure function of the cluster, its Nodes and its
//! operations. Its authority is the leader's: the loop that carries it out
//! ([`crate::controller`]) runs on the leader only and every write is fenced
//! ([`crate::fence::Fence`]). It never acts on an operation's machines: the operation it
//! makes does, under every gate a person's own would meet. It waits, and says why, while
//! any operation holds the cluster, while one it made did not complete (refused, paused:
//! a person decides, never a retry), and while a Node's version cannot be read.

use std::sync::Arc;

use ichor_adapters::kubernetes::crd::{TalosCluster, TalosOperation, TalosOperationSpec};
use ichor_upgrade_core::operation::OperationKind;
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

/// How many completed operations the operator keeps of those it made, per cluster.
pub const KEEP_COMPLETED: usize = 3;

/// The label on an operation the operator made for a cluster (its name).
pub const MADE_FOR_LABEL: &str = "ichor.dev/made-for";

/// What an `Automatic` cluster needs next.
#[derive(Debug, Clone)]
pub enum Next {
    /// Not an `Automatic` cluster, or one being deleted: nothing made.
    Manual,
    /// Every Node runs the cluster's versions.
    UpToDate,
    /// An operation not done holds the cluster (or is about to): its own passes decide.
    Held {
        /// Its name.
        operation: String,
        /// Its phase.
        phase: String,
        /// Whether the operator made it for this cluster.
        made: bool,
    },
    /// Nothing is made now, for this reason (a sentence naming what it waits on).
    Wait(String),
    /// No operation can take the cluster there (a downgrade, a hop through a minor line
    /// no release is known for): a person changes the spec.
    Refused(String),
    /// Make this operation.
    Make(Box<TalosOperation>),
}

/// The phases in which an operation is done with its cluster.
const DONE: [&str; 2] = ["Completed", "Refused"];

fn phase(op: &TalosOperation) -> &str {
    op.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

impl Next {
    /// As `status.upgrade` says it: a state (`UpToDate`, `Upgrading`, `Waiting`,
    /// `Refused`) and a sentence; `None` for a `Manual` cluster.
    #[must_use]
    pub fn state(&self) -> Option<(&'static str, String)> {
        Some(match self {
            Self::Manual => return None,
            Self::UpToDate => ("UpToDate", "every Node runs the cluster's Talos and Kubernetes versions".to_owned()),
            Self::Held { operation, phase, made: true } => ("Upgrading", format!("operation {operation} is {phase}")),
            Self::Held { operation, phase, made: false } => {
                ("Waiting", format!("operation {operation}, not made for this cluster's versions, is {phase}"))
            }
            Self::Wait(why) => ("Waiting", why.clone()),
            Self::Refused(why) => ("Refused", why.clone()),
            Self::Make(op) => (
                "Upgrading",
                format!("making operation {}: {} to {}", op.name_any(), op.spec.kind, op.spec.target_version),
            ),
        })
    }
}

/// The name of the operation the operator makes for `kind` and `target`.
#[must_use]
pub fn operation_name(kind: OperationKind, target: &str) -> String {
    let kind = match kind {
        OperationKind::Talos => OperationKind::TALOS,
        OperationKind::Kubernetes => OperationKind::KUBERNETES,
        OperationKind::Remove => OperationKind::REMOVE,
    };
    format!("{kind}-{}", target.to_ascii_lowercase())
}

/// Whether `op` was made by the operator for `cluster` (its controller owner).
#[must_use]
pub fn made_for(op: &TalosOperation, cluster: &TalosCluster) -> bool {
    let uid = cluster.uid();
    uid.is_some() && op.owner_references().iter().any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// The oldest Talos and Kubernetes (kubelet) versions of `nodes`, or the Node whose version
/// cannot be read.
fn oldest(nodes: &[&Node]) -> Result<(TalosVersion, KubernetesVersion), String> {
    let mut talos: Option<TalosVersion> = None;
    let mut kubelet: Option<KubernetesVersion> = None;
    for node in nodes {
        let name = node.name_any();
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        let os_image = info.map(|i| i.os_image.as_str()).unwrap_or_default();
        let version = TalosVersion::from_os_image(os_image)
            .map_err(|e| format!("the Talos version of Node {name} cannot be read: {e}"))?;
        let kubelet_text = info.map(|i| i.kubelet_version.as_str()).unwrap_or_default();
        let kubelet_version = KubernetesVersion::parse(kubelet_text)
            .map_err(|e| format!("the kubelet version of Node {name} cannot be read: {e}"))?;
        talos = Some(talos.map_or(version.clone(), |t| t.min(version)));
        kubelet = Some(kubelet.map_or(kubelet_version.clone(), |k| k.min(kubelet_version)));
    }
    talos.zip(kubelet).ok_or_else(|| "the cluster has no Node yet".to_owned())
}

/// The Nodes of `nodes` that run `version` (Talos, or the kubelet's for Kubernetes), as
/// one phrase naming at most five.
fn behind(nodes: &[&Node], kind: OperationKind, version: &str) -> String {
    let names: Vec<String> = nodes
        .iter()
        .filter(|n| {
            let info = n.status.as_ref().and_then(|s| s.node_info.as_ref());
            info.is_some_and(|i| match kind {
                OperationKind::Talos => {
                    TalosVersion::from_os_image(&i.os_image).is_ok_and(|v| v.to_string() == version)
                }
                _ => KubernetesVersion::parse(&i.kubelet_version).is_ok_and(|v| v.to_string() == version),
            })
        })
        .map(|n| n.name_any())
        .collect();
    let shown = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    match names.len() {
        0 | 1 => format!("Node {shown}"),
        2..=5 => format!("Nodes {shown}"),
        n => format!("Nodes {shown} and {} more", n - 5),
    }
}

/// What `cluster` needs next, from its Nodes (all of the API server's: those it selects
/// are taken) and every operation.
#[must_use]
pub fn next(cluster: &TalosCluster, nodes: &[Arc<Node>], operations: &[Arc<TalosOperation>]) -> Next {
    if !cluster.spec.automatic() || cluster.meta().deletion_timestamp.is_some() {
        return Next::Manual;
    }
    let (namespace, name) = (cluster.namespace(), cluster.name_any());
    let ours: Vec<&TalosOperation> = operations
        .iter()
        .map(AsRef::as_ref)
        .filter(|o| o.namespace() == namespace && o.spec.cluster == name && !o.spec.dry_run)
        .collect();
    // Any operation not done holds the cluster, or is about to: its own pass decides.
    if let Some(op) = ours.iter().filter(|o| !DONE.contains(&phase(o))).min_by_key(|o| o.name_any()) {
        return Next::Held { operation: op.name_any(), phase: phase(op).to_owned(), made: made_for(op, cluster) };
    }
    let selected: Vec<&Node> = nodes.iter().map(AsRef::as_ref).filter(|n| cluster.spec.selects(n.labels())).collect();
    let (talos, kubelet) = match oldest(&selected) {
        Ok(versions) => versions,
        Err(why) => return Next::Wait(why),
    };
    let releases = cluster.spec.known_releases();
    let Ok(talos_target) = TalosVersion::parse(&cluster.spec.talos_version) else {
        return Next::Refused(format!("spec.talosVersion {:?} is not a Talos version", cluster.spec.talos_version));
    };
    let (kind, target) = match releases.talos_hops(&talos, &talos_target) {
        Err(refusal) => return Next::Refused(format!("Talos: {refusal}")),
        Ok(hops) if !hops.is_empty() => (OperationKind::Talos, hops[0].to_string()),
        Ok(_) => {
            let Ok(kubernetes_target) = KubernetesVersion::parse(&cluster.spec.kubernetes_version) else {
                return Next::Refused(format!(
                    "spec.kubernetesVersion {:?} is not a Kubernetes version",
                    cluster.spec.kubernetes_version
                ));
            };
            match releases.kubernetes_hops(&kubelet, &kubernetes_target) {
                Err(refusal) => return Next::Refused(format!("Kubernetes: {refusal}")),
                Ok(hops) if !hops.is_empty() => (OperationKind::Kubernetes, hops[0].to_string()),
                Ok(_) => return Next::UpToDate,
            }
        }
    };
    let op_name = operation_name(kind, &target);
    if let Some(op) = ours.iter().find(|o| o.name_any() == op_name) {
        // Done, and still the next step: refused, or completed while a Node stayed behind
        // (one that joined since on an older version). Never made again by itself.
        let oldest = if kind == OperationKind::Talos { talos.to_string() } else { kubelet.to_string() };
        let behind = behind(&selected, kind, &oldest);
        return Next::Wait(format!(
            "operation {op_name} is {} and {behind} still run{} {oldest}: a person decides (delete the operation to \
             run it again)",
            phase(op),
            if behind.starts_with("Nodes") { "" } else { "s" },
        ));
    }
    Next::Make(Box::new(operation(cluster, kind, &op_name, &target)))
}

/// The operation `name` the operator makes for `cluster`: `kind` to `target`, owned by the
/// cluster, with the defaults a person's operation has (one worker at a time, the
/// preflight gate, an etcd snapshot).
fn operation(cluster: &TalosCluster, kind: OperationKind, name: &str, target: &str) -> TalosOperation {
    let kind = if kind == OperationKind::Talos { OperationKind::TALOS } else { OperationKind::KUBERNETES };
    let mut op = TalosOperation::new(
        name,
        TalosOperationSpec {
            cluster: cluster.name_any(),
            kind: kind.to_owned(),
            target_version: target.to_owned(),
            max_unavailable: 1.into(),
            maintenance: None,
            gates: None,
            machine: None,
            preflight: None,
            etcd_snapshot: None,
            dry_run: false,
            allow_two_control_planes: false,
        },
    );
    op.metadata.namespace = cluster.namespace();
    op.metadata.labels = Some([(MADE_FOR_LABEL.to_owned(), cluster.name_any())].into());
    op.metadata.owner_references = Some(vec![OwnerReference {
        api_version: TalosCluster::api_version(&()).into_owned(),
        kind: TalosCluster::kind(&()).into_owned(),
        name: cluster.name_any(),
        uid: cluster.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    op
}

/// The completed operations the operator made for `cluster` beyond the newest
/// [`KEEP_COMPLETED`]: the ones to delete. Never one a person wrote, never one not
/// completed, never one whose notices are not all delivered or given up (its status is
/// their outbox, [`crate::notify`]: deleting it would lose them).
#[must_use]
pub fn to_collect<'a>(cluster: &TalosCluster, operations: &'a [Arc<TalosOperation>]) -> Vec<&'a TalosOperation> {
    let mut made: Vec<&TalosOperation> = operations
        .iter()
        .map(AsRef::as_ref)
        .filter(|o| made_for(o, cluster) && phase(o) == "Completed" && o.meta().deletion_timestamp.is_none())
        .collect();
    // Newest first: by creation time, then name.
    made.sort_by(|a, b| {
        (b.meta().creation_timestamp.as_ref().map(|t| t.0), b.name_any())
            .cmp(&(a.meta().creation_timestamp.as_ref().map(|t| t.0), a.name_any()))
    });
    made.into_iter().skip(KEEP_COMPLETED).filter(|o| all_told(o)).collect()
}

/// Whether every notice `op` owes was delivered or given up.
fn all_told(op: &TalosOperation) -> bool {
    let outbox = op.status.as_ref().and_then(|s| s.notifications.as_ref());
    outbox.is_none_or(|o| {
        o.records.iter().all(|r| r.state == crate::notices::DELIVERED || r.state == crate::notices::GAVE_UP)
    })
}

#[cfg(test)]
mod tests {
    use ichor_adapters::kubernetes::crd::{TalosOperationStatus, UpgradePolicy};
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::fixtures;

    fn automatic(talos: &str, kubernetes: &str) -> TalosCluster {
        let mut c = fixtures::cluster(None);
        c.spec.upgrades = Some(UpgradePolicy::Automatic);
        c.spec.talos_version = talos.into();
        c.spec.kubernetes_version = kubernetes.into();
        c.metadata.uid = Some("uid-prod".into());
        c
    }

    fn node(name: &str, talos: &str, kubelet: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("pool".to_owned(), "prod".to_owned())].into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo {
                    os_image: format!("Talos ({talos})"),
                    kubelet_version: kubelet.into(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    fn fleet(talos: &str, kubelet: &str) -> Vec<Arc<Node>> {
        vec![node("cp-1", talos, kubelet), node("w-1", talos, kubelet)]
    }

    fn made(cluster: &TalosCluster, name: &str, phase: &str, minute: i64) -> Arc<TalosOperation> {
        let (kind, target) = name.split_once('-').unwrap();
        let kind = if kind == "talos" { OperationKind::Talos } else { OperationKind::Kubernetes };
        let mut op = operation(cluster, kind, name, target);
        op.status = Some(TalosOperationStatus { phase: Some(phase.into()), ..Default::default() });
        let at = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + minute * 60).unwrap();
        op.metadata.creation_timestamp = Some(Time(at));
        Arc::new(op)
    }

    fn made_name(next: &Next) -> Option<(String, String, String)> {
        match next {
            Next::Make(op) => Some((op.name_any(), op.spec.kind.clone(), op.spec.target_version.clone())),
            _ => None,
        }
    }

    #[test]
    fn a_manual_cluster_makes_nothing() {
        let mut cluster = automatic("v1.14.4", "1.34.1");
        cluster.spec.upgrades = None;
        assert!(matches!(next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[]), Next::Manual));
        cluster.spec.upgrades = Some(UpgradePolicy::Manual);
        assert!(matches!(next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[]), Next::Manual));
    }

    #[test]
    fn a_talos_bump_makes_one_owned_operation_named_after_its_target() {
        let cluster = automatic("v1.14.4", "1.34.1");
        let next = next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[]);
        let Next::Make(op) = &next else { panic!("{next:?}") };
        assert_eq!(op.name_any(), "talos-v1.14.4");
        assert_eq!((op.spec.kind.as_str(), op.spec.target_version.as_str()), ("talos", "v1.14.4"));
        assert_eq!(op.namespace().as_deref(), Some("ops"));
        assert!(made_for(op, &cluster), "owned by the cluster, as its controller");
        assert_eq!(op.labels().get(MADE_FOR_LABEL).map(String::as_str), Some("prod"));
    }

    #[test]
    fn two_minors_ahead_goes_through_the_latest_patch_between_then_the_target() {
        let cluster = automatic("v1.14.3", "1.34.1");
        let first = next(&cluster, &fleet("v1.12.5", "v1.34.1"), &[]);
        assert_eq!(made_name(&first).unwrap(), ("talos-v1.13.9".into(), "talos".into(), "v1.13.9".into()));
        // While it runs, nothing else.
        let running = [made(&cluster, "talos-v1.13.9", "Progressing", 0)];
        assert!(matches!(
            next(&cluster, &fleet("v1.12.5", "v1.34.1"), &running),
            Next::Held { operation, phase, made: true } if operation == "talos-v1.13.9" && phase == "Progressing"
        ));
        // Once it completed and the Nodes show it, the next hop.
        let done = [made(&cluster, "talos-v1.13.9", "Completed", 0)];
        let second = next(&cluster, &fleet("v1.13.9", "v1.34.1"), &done);
        assert_eq!(made_name(&second).unwrap().0, "talos-v1.14.3");
        // Completed while a Node still runs the old version: a person decides.
        let behind = vec![node("cp-1", "v1.13.9", "v1.34.1"), node("w-9", "v1.12.5", "v1.34.1")];
        assert!(matches!(next(&cluster, &behind, &done), Next::Wait(w) if w.contains("Node w-9 still runs v1.12.5")));
    }

    #[test]
    fn kubernetes_goes_after_talos_one_minor_at_a_time() {
        let cluster = automatic("v1.14.4", "1.36.0");
        // Talos first.
        assert_eq!(made_name(&next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[])).unwrap().0, "talos-v1.14.4");
        let talos_done = [made(&cluster, "talos-v1.14.4", "Completed", 0)];
        let k = next(&cluster, &fleet("v1.14.4", "v1.34.1"), &talos_done);
        assert_eq!(made_name(&k).unwrap(), ("kubernetes-1.35.2".into(), "kubernetes".into(), "1.35.2".into()));
        let both = [talos_done[0].clone(), made(&cluster, "kubernetes-1.35.2", "Completed", 1)];
        assert_eq!(made_name(&next(&cluster, &fleet("v1.14.4", "v1.35.2"), &both)).unwrap().0, "kubernetes-1.36.0");
        assert!(matches!(next(&cluster, &fleet("v1.14.4", "v1.36.0"), &both), Next::UpToDate));
    }

    #[test]
    fn a_refused_or_paused_operation_it_made_is_never_made_again_by_itself() {
        let cluster = automatic("v1.14.4", "1.34.1");
        let refused = [made(&cluster, "talos-v1.14.4", "Refused", 0)];
        let waiting = next(&cluster, &fleet("v1.14.3", "v1.34.1"), &refused);
        assert!(
            matches!(&waiting, Next::Wait(w) if w.contains("Refused") && w.contains("a person decides")),
            "{waiting:?}"
        );
        let paused = [made(&cluster, "talos-v1.14.4", "Paused", 0)];
        assert!(
            matches!(next(&cluster, &fleet("v1.14.3", "v1.34.1"), &paused), Next::Held { phase, .. } if phase == "Paused")
        );
    }

    #[test]
    fn a_persons_operation_holds_the_cluster_too_and_a_dry_run_does_not() {
        let cluster = automatic("v1.14.4", "1.34.1");
        let persons = Arc::new(fixtures::operation("by-hand", "Waiting", "LockHeld"));
        assert!(matches!(
            next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[persons]),
            Next::Held { operation, made: false, .. } if operation == "by-hand"
        ));
        let mut dry = fixtures::operation("plan", "Pending", "");
        dry.spec.dry_run = true;
        assert!(matches!(next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[Arc::new(dry)]), Next::Make(_)));
    }

    #[test]
    fn bad_versions_and_downgrades_are_refused_and_unreadable_nodes_waited_on() {
        let cluster = automatic("v1.14.2", "1.34.1");
        assert!(matches!(next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[]), Next::Refused(r) if r.contains("older")));
        let cluster = automatic("v1.14.4", "1.34.1");
        let unreadable = vec![node("cp-1", "banana", "v1.34.1")];
        assert!(matches!(next(&cluster, &unreadable, &[]), Next::Wait(w) if w.contains("cp-1")));
        assert!(matches!(next(&cluster, &[], &[]), Next::Wait(w) if w.contains("no Node")));
        let far = automatic("v1.14.4", "1.34.1");
        let mut far = far;
        far.spec.talos_version = "v1.16.0".into();
        assert!(matches!(next(&far, &fleet("v1.14.4", "v1.34.1"), &[]), Next::Refused(r) if r.contains("v1.15")));
    }

    #[test]
    fn a_cluster_being_deleted_makes_nothing() {
        let mut cluster = automatic("v1.14.4", "1.34.1");
        cluster.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(matches!(next(&cluster, &fleet("v1.14.3", "v1.34.1"), &[]), Next::Manual));
    }

    #[test]
    fn only_completed_operations_it_made_beyond_the_newest_few_are_collected() {
        let cluster = automatic("v1.14.4", "1.34.1");
        let mut ops: Vec<Arc<TalosOperation>> =
            (0..5).map(|i| made(&cluster, &format!("talos-v1.14.{i}"), "Completed", i64::from(i))).collect();
        ops.push(made(&cluster, "talos-v1.13.0", "Refused", -5));
        ops.push(Arc::new(fixtures::operation("by-hand", "Completed", "")));
        let collected: Vec<String> = to_collect(&cluster, &ops).iter().map(|o| o.name_any()).collect();
        assert_eq!(collected, ["talos-v1.14.1", "talos-v1.14.0"]);
        // One whose notice is still owed to a receiver is kept until it is told.
        let mut owing = (*ops[0]).clone();
        let record = |state: &str| ichor_adapters::kubernetes::crd::NotificationRecord {
            id: "u/completed".into(),
            sink: "hook".into(),
            event: "Completed".into(),
            message: String::new(),
            state: state.into(),
            attempts: 1,
            owed: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            next_attempt: None,
            last_error: None,
        };
        let outbox = |state: &str| ichor_adapters::kubernetes::crd::NotificationsStatus {
            waiting: None,
            records: vec![record(crate::notices::DELIVERED), record(state)],
        };
        owing.status.as_mut().unwrap().notifications = Some(outbox(crate::notices::PENDING));
        ops[0] = Arc::new(owing.clone());
        let collected: Vec<String> = to_collect(&cluster, &ops).iter().map(|o| o.name_any()).collect();
        assert_eq!(collected, ["talos-v1.14.1"]);
        owing.status.as_mut().unwrap().notifications = Some(outbox(crate::notices::GAVE_UP));
        ops[0] = Arc::new(owing);
        let collected: Vec<String> = to_collect(&cluster, &ops).iter().map(|o| o.name_any()).collect();
        assert_eq!(collected, ["talos-v1.14.1", "talos-v1.14.0"]);
    }
}
