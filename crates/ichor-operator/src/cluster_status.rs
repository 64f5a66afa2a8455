//! A `TalosCluster`'s status: the Talos and Kubernetes versions its Nodes run, how many
//! run each, its machines, and the operation that holds it. Written by the leader after
//! each pass of an operation on the cluster, under the fence, only when it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ichor_adapters::kubernetes::crd::{
    LAST_OPERATIONS, OperationSummary, TalosCluster, TalosClusterStatus, TalosMachine, TalosOperation, UpgradeState,
};
use ichor_upgrade_core::operation::OperationKind;
use ichor_upgrade_core::versions::TalosVersion;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::fence::Fence;

/// The phases of an operation that holds its cluster's lock.
const HOLDING: [&str; 3] = ["Progressing", "Waiting", "Paused"];

/// The status `cluster` has now, from the stores: its Nodes (those its node selector
/// selects), the TalosMachines that name it, and its operations.
#[must_use]
pub fn summarize(
    cluster: &TalosCluster,
    nodes: &[Arc<Node>],
    machines: &[Arc<TalosMachine>],
    operations: &[Arc<TalosOperation>],
) -> TalosClusterStatus {
    let namespace = cluster.namespace();
    let name = cluster.name_any();
    let ours = nodes.iter().filter(|n| cluster.spec.selects(n.labels()));
    let mut by_version: BTreeMap<TalosVersionKey, i64> = BTreeMap::new();
    let mut kubelets = BTreeSet::new();
    let mut count = 0;
    for node in ours {
        count += 1;
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        let talos = info.and_then(|i| TalosVersion::from_os_image(&i.os_image).ok());
        *by_version.entry(TalosVersionKey(talos)).or_default() += 1;
        if let Some(kubelet) = info.map(|i| i.kubelet_version.clone()).filter(|v| !v.is_empty()) {
            kubelets.insert(KubeletVersion(kubelet));
        }
    }
    let machines = machines.iter().filter(|m| m.namespace() == namespace && m.spec.cluster == name).count();
    let operation = operations
        .iter()
        .filter(|o| o.namespace() == namespace && o.spec.cluster == name && o.metadata.deletion_timestamp.is_none())
        .filter(|o| {
            let status = o.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
            // An operation waiting for the lock does not hold it.
            HOLDING.contains(&phase) && status.and_then(|s| s.reason.as_deref()) != Some("LockHeld")
        })
        .map(|o| o.name_any())
        .min();
    let running = match by_version.len() {
        0 => None,
        1 => by_version.keys().next().map(ToString::to_string),
        _ => Some(by_version.iter().map(|(k, n)| format!("{k} ({n})")).collect::<Vec<_>>().join(", ")),
    };
    TalosClusterStatus {
        conditions: Vec::new(),
        running,
        talos_versions: by_version.keys().filter_map(|k| k.0.as_ref().map(ToString::to_string)).collect(),
        kubernetes_versions: kubelets.into_iter().map(|k| k.0).collect(),
        nodes_by_talos_version: by_version.into_iter().map(|(k, n)| (k.to_string(), n)).collect(),
        nodes: Some(count),
        machines: Some(i64::try_from(machines).unwrap_or(i64::MAX)),
        operation,
        last_operations: last_operations(&namespace, &name, operations),
        upgrade: crate::desired::next(cluster, nodes, operations)
            .state()
            .map(|(state, message)| UpgradeState { state: state.to_owned(), message }),
    }
}

/// The cluster's operations that ran (not dry runs, not refused), newest first, at most
/// [`LAST_OPERATIONS`].
fn last_operations(
    namespace: &Option<String>,
    cluster: &str,
    operations: &[Arc<TalosOperation>],
) -> Vec<OperationSummary> {
    let mut ran: Vec<&Arc<TalosOperation>> = operations
        .iter()
        .filter(|o| o.namespace() == *namespace && o.spec.cluster == cluster && !o.spec.dry_run)
        .filter(|o| {
            let phase = o.status.as_ref().and_then(|s| s.phase.as_deref());
            phase.is_some_and(|p| p != "Refused" && p != "Pending")
        })
        .collect();
    ran.sort_by_key(|o| std::cmp::Reverse((o.creation_timestamp().map(|t| t.0), o.name_any())));
    ran.into_iter()
        .take(LAST_OPERATIONS)
        .filter_map(|o| {
            let status = o.status.as_ref()?;
            let start = o.creation_timestamp()?;
            let end = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Completed" && c.status == "True")
                .map(|c| c.last_transition_time.clone());
            #[allow(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
            let makespan_seconds =
                end.as_ref().map(|e| (e.0.as_millisecond() - start.0.as_millisecond()) as f64 / 1000.0);
            let counts = status.machines.clone().unwrap_or_default();
            let operation = match o.spec.machine.as_deref() {
                Some(machine) if o.spec.kind == OperationKind::REMOVE => format!("remove {machine}"),
                _ => format!("{} {}", o.spec.kind, o.spec.target_version),
            };
            Some(OperationSummary {
                name: o.name_any(),
                operation,
                phase: status.phase.clone().unwrap_or_default(),
                start,
                end,
                makespan_seconds,
                machines: counts.total,
                failed: counts.failed,
            })
        })
        .collect()
}

/// A Talos version or none (an `osImage` that names none), ordered versions first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct TalosVersionKey(Option<TalosVersion>);

impl std::fmt::Display for TalosVersionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            // Ordered by `Option`: `None` first; written `unknown`.
            Some(v) => write!(f, "{v}"),
            None => f.write_str("unknown"),
        }
    }
}

/// A kubelet version ordered as a version where it parses (`v1.34.1` before `v1.35.0`
/// before `v1.100.0`), as text otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KubeletVersion(String);

impl KubeletVersion {
    fn key(&self) -> (Option<semver::Version>, &str) {
        (semver::Version::parse(self.0.trim_start_matches('v')).ok(), &self.0)
    }
}

impl PartialOrd for KubeletVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KubeletVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// The field manager of the status this module writes (server-side apply: a version no
/// Node runs any more leaves `nodesByTalosVersion` with the next write).
pub const FIELD_MANAGER: &str = "ichor-cluster-status";

/// Writes `status` to the cluster when it differs from what it has (conditions aside:
/// this module writes none).
///
/// # Errors
/// The API server's refusal, or [`kube::Error::Service`] when this replica no longer
/// leads (nothing sent).
pub async fn write(
    client: &Client,
    cluster: &TalosCluster,
    status: &TalosClusterStatus,
    fence: &Fence,
) -> Result<bool, kube::Error> {
    let current = cluster.status.clone().map(|s| TalosClusterStatus { conditions: Vec::new(), ..s });
    if current.as_ref() == Some(status) {
        return Ok(false);
    }
    if !fence.leads() {
        return Err(kube::Error::Service("not sent: this replica no longer leads".into()));
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<TalosCluster> = Api::namespaced(client.clone(), &namespace);
    let patch = json!({ "apiVersion": "ichor.dev/v1alpha1", "kind": "TalosCluster", "status": status });
    api.patch_status(&cluster.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_adapters::kubernetes::crd::{Role, TalosMachineSpec};
    use serde_json::json;

    fn cluster() -> TalosCluster {
        crate::fixtures::cluster(None)
    }

    fn node(name: &str, pool: &str, os_image: &str, kubelet: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "pool": pool } },
                "status": { "nodeInfo": {
                    "osImage": os_image, "kubeletVersion": kubelet, "architecture": "amd64",
                    "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                    "machineID": "", "operatingSystem": "linux", "systemUUID": ""
                } }
            }))
            .unwrap(),
        )
    }

    fn machine(name: &str, cluster: &str) -> Arc<TalosMachine> {
        let mut m = TalosMachine::new(
            name,
            TalosMachineSpec {
                cluster: cluster.into(),
                role: Role::Worker,
                address: "10.5.0.2".into(),
                hostname: None,
            },
        );
        m.metadata.namespace = Some("ops".into());
        Arc::new(m)
    }

    fn operation(name: &str, phase: &str, reason: &str) -> Arc<TalosOperation> {
        Arc::new(crate::fixtures::operation(name, phase, reason))
    }

    #[test]
    fn counts_the_clusters_nodes_by_version_and_names_the_operation_holding_it() {
        let nodes = [
            node("cp-1", "prod", "Talos (v1.14.4)", "v1.34.1"),
            node("w-1", "prod", "Talos (v1.14.3)", "v1.34.1"),
            node("w-2", "prod", "Talos (v1.14.3)", "v1.9.0"),
            node("w-3", "prod", "Ubuntu 24.04", "v1.34.1"),
            node("other", "staging", "Talos (v1.13.0)", "v1.33.0"),
        ];
        let machines = [machine("cp-1", "prod"), machine("w-1", "prod"), machine("x", "staging")];
        let operations = [
            operation("a-waiting", "Waiting", "LockHeld"),
            operation("b-upgrade", "Progressing", "Progressing"),
            operation("c-done", "Completed", "Completed"),
        ];
        let status = summarize(&cluster(), &nodes, &machines, &operations);
        assert_eq!(status.talos_versions, ["v1.14.3", "v1.14.4"], "lowest first; the staging Node is not ours");
        assert_eq!(status.running.as_deref(), Some("unknown (1), v1.14.3 (2), v1.14.4 (1)"), "one line, counted");
        assert_eq!(status.kubernetes_versions, ["v1.9.0", "v1.34.1"], "ordered as versions, not as text");
        assert_eq!(
            status.nodes_by_talos_version,
            [("unknown".to_owned(), 1), ("v1.14.3".to_owned(), 2), ("v1.14.4".to_owned(), 1)].into()
        );
        assert_eq!((status.nodes, status.machines), (Some(4), Some(2)));
        assert_eq!(status.operation.as_deref(), Some("b-upgrade"), "not the one waiting for the lock");

        let status = summarize(&cluster(), &nodes, &machines, &operations[2..]);
        assert_eq!(status.operation, None, "a completed operation holds nothing");

        // Every Node on one version: the column says just that; no Node, nothing.
        let status = summarize(&cluster(), &nodes[1..3], &machines, &operations);
        assert_eq!(status.running.as_deref(), Some("v1.14.3"));
        assert_eq!(summarize(&cluster(), &[], &machines, &operations).running, None);
    }

    #[test]
    fn the_last_operations_that_ran_are_summarized_newest_first() {
        use ichor_adapters::kubernetes::crd::MachineCounts;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |secs: i64| Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap());
        let made = |name: &str, phase: &str, secs: i64, completed: Option<i64>, dry_run: bool| {
            let mut o = crate::fixtures::operation(name, phase, phase);
            o.metadata.creation_timestamp = Some(at(secs));
            o.spec.dry_run = dry_run;
            let status = o.status.as_mut().unwrap();
            status.machines =
                Some(MachineCounts { total: 8, converged: 8, in_progress: 0, failed: i64::from(phase == "Paused") });
            if let Some(end) = completed {
                status.conditions.push(Condition {
                    type_: "Completed".into(),
                    status: "True".into(),
                    reason: "Completed".into(),
                    message: String::new(),
                    last_transition_time: at(end),
                    observed_generation: None,
                });
            }
            Arc::new(o)
        };
        let mut operations: Vec<Arc<TalosOperation>> = vec![
            made("first", "Completed", 1_000, Some(1_300), false),
            made("plan", "Completed", 2_000, Some(2_001), true),
            made("refused", "Refused", 2_500, None, false),
            made("second", "Paused", 3_000, None, false),
        ];
        operations.extend((0..6).map(|i| made(&format!("old-{i}"), "Completed", i, Some(i + 10), false)));
        let status = summarize(&cluster(), &[], &[], &operations);
        let names: Vec<&str> = status.last_operations.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["second", "first", "old-5", "old-4", "old-3"], "no dry run, no refusal, five kept");
        let first = &status.last_operations[1];
        assert_eq!(
            (first.operation.as_str(), first.makespan_seconds, first.machines),
            ("talos v1.14.4", Some(300.0), 8)
        );
        let second = &status.last_operations[0];
        assert_eq!((second.end.is_none(), second.makespan_seconds, second.failed), (true, None, 1));
    }
}
