//! Node discovery: a `TalosCluster` with `spec.discovery: Nodes` gets a `TalosMachine` for
//! each of its Nodes that no machine names, made from the Node, and the machines made so
//! are kept in step with their Nodes (a new InternalIP, a new role).
//!
//! Authority: the leader's, checked right before each write (the [`Fence`]); each write is
//! a server-side apply of the machine's spec under [`FIELD_MANAGER`], so a pass that reads
//! a stale store writes the same spec again at worst. What it must not do: delete a
//! machine (a Node gone may be a machine down; a removal is an operation), or touch a
//! machine it did not make (one without [`DISCOVERED_LABEL`]) even when it names the same
//! Node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ichor_adapters::kubernetes::crd::{Discovery, Role, TalosCluster, TalosMachine, TalosMachineSpec};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::fence::Fence;

/// The field manager of the machines discovery makes.
pub const FIELD_MANAGER: &str = "ichor-discovery";
/// The label on a machine discovery made (its value: the cluster's name).
pub const DISCOVERED_LABEL: &str = "ichor.dev/discovered-for";
/// The label that makes a Node a control plane.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// A machine discovery would apply: its name and spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Discovered {
    /// The machine's name: its Node's.
    pub name: String,
    /// What it should say.
    pub spec: TalosMachineSpec,
}

/// What discovery found: machines to apply, and Nodes it cannot make one for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Findings {
    /// Machines to make or bring in step.
    pub apply: Vec<Discovered>,
    /// Nodes with no machine that discovery cannot make one for, and why.
    pub skipped: Vec<(String, String)>,
}

/// Whether `node` is one of `cluster`'s (its node selector matches; every Node without one).
#[must_use]
pub fn of_cluster(cluster: &TalosCluster, node: &Node) -> bool {
    cluster.spec.selects(node.labels())
}

/// What discovery does for `cluster` given the Nodes and the machines of its namespace.
/// Pure: the caller writes.
#[must_use]
pub fn plan(cluster: &TalosCluster, nodes: &[Arc<Node>], machines: &[Arc<TalosMachine>]) -> Findings {
    let mut findings = Findings::default();
    if cluster.spec.discovery != Some(Discovery::Nodes) {
        return findings;
    }
    let name = cluster.name_any();
    let ours: Vec<&Arc<TalosMachine>> = machines.iter().filter(|m| m.spec.cluster == name).collect();
    // The Nodes a machine names: its hostname, else its own name (a machine made by hand
    // without a hostname is looked up through Talos; its name is the best guess here, and
    // an unnamed Node stays unaccounted for the engine to say so).
    let named: BTreeSet<&str> =
        ours.iter().map(|m| m.spec.hostname.as_deref().unwrap_or(m.metadata.name.as_deref().unwrap_or(""))).collect();
    let by_name: BTreeMap<&str, &Arc<TalosMachine>> =
        machines.iter().filter_map(|m| Some((m.metadata.name.as_deref()?, m))).collect();
    for node in nodes.iter().filter(|n| of_cluster(cluster, n)) {
        let node_name = node.name_any();
        let existing = by_name.get(node_name.as_str());
        let made_by_us = existing.is_some_and(|m| m.labels().get(DISCOVERED_LABEL) == Some(&name));
        if named.contains(node_name.as_str()) && !made_by_us {
            continue;
        }
        if existing.is_some() && !made_by_us {
            let why = format!("a TalosMachine named {node_name} exists that discovery did not make");
            findings.skipped.push((node_name, why));
            continue;
        }
        let Some(address) = internal_ip(node) else {
            findings.skipped.push((node_name, "the Node has no InternalIP address".to_owned()));
            continue;
        };
        let role = if node.labels().contains_key(CONTROL_PLANE_LABEL) { Role::Controlplane } else { Role::Worker };
        let spec = TalosMachineSpec { cluster: name.clone(), role, address, hostname: Some(node_name.clone()) };
        if existing.is_some_and(|m| m.spec == spec) {
            continue;
        }
        findings.apply.push(Discovered { name: node_name, spec });
    }
    findings
}

fn internal_ip(node: &Node) -> Option<String> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses.iter().find(|a| a.type_ == "InternalIP").map(|a| a.address.clone())
}

/// Applies what [`plan`] found, each write under the fence. Returns how many machines it
/// wrote.
///
/// # Errors
/// The first write the API server refused, or [`kube::Error`] for a replica that stopped
/// leading (nothing written after it).
pub async fn apply(
    client: &Client,
    namespace: &str,
    found: &[Discovered],
    fence: &Fence,
) -> Result<usize, kube::Error> {
    let api: Api<TalosMachine> = Api::namespaced(client.clone(), namespace);
    let mut written = 0;
    for machine in found {
        if !fence.leads() {
            return Err(kube::Error::Service("not sent: this replica no longer leads".into()));
        }
        let mut object = TalosMachine::new(&machine.name, machine.spec.clone());
        object.metadata.labels = Some([(DISCOVERED_LABEL.to_owned(), machine.spec.cluster.clone())].into());
        let mut value = serde_json::to_value(&object).map_err(kube::Error::SerdeError)?;
        value["apiVersion"] = "ichor.dev/v1alpha1".into();
        value["kind"] = "TalosMachine".into();
        api.patch(&machine.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&value)).await?;
        tracing::info!(%namespace, machine = %machine.name, address = %machine.spec.address, role = ?machine.spec.role,
            "TalosMachine discovered from its Node");
        written += 1;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::fixtures::cluster;

    fn node(name: &str, pool: &str, control_plane: bool, ip: Option<&str>) -> Arc<Node> {
        let mut labels = json!({ "pool": pool });
        if control_plane {
            labels[CONTROL_PLANE_LABEL] = "".into();
        }
        let addresses: Vec<_> = ip.map(|ip| json!({ "type": "InternalIP", "address": ip })).into_iter().collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name, "labels": labels },
                "status": { "addresses": addresses },
            }))
            .unwrap(),
        )
    }

    fn machine(name: &str, hostname: Option<&str>, address: &str, discovered: bool) -> Arc<TalosMachine> {
        let mut m = TalosMachine::new(
            name,
            TalosMachineSpec {
                cluster: "prod".into(),
                role: Role::Worker,
                address: address.into(),
                hostname: hostname.map(str::to_owned),
            },
        );
        if discovered {
            m.metadata.labels = Some([(DISCOVERED_LABEL.to_owned(), "prod".to_owned())].into());
        }
        Arc::new(m)
    }

    #[test]
    fn manual_discovers_nothing() {
        let nodes = [node("cp-1", "prod", true, Some("10.0.0.1"))];
        assert_eq!(plan(&cluster(None), &nodes, &[]), Findings::default());
        assert_eq!(plan(&cluster(Some(Discovery::Manual)), &nodes, &[]), Findings::default());
    }

    #[test]
    fn each_node_of_the_cluster_without_a_machine_gets_one_from_the_node() {
        let nodes = [
            node("cp-1", "prod", true, Some("10.0.0.1")),
            node("w-1", "prod", false, Some("10.0.0.2")),
            node("other", "staging", false, Some("10.0.1.1")),
            node("w-2", "prod", false, Some("10.0.0.3")),
        ];
        // w-2 has a machine made by hand (another name, its hostname): left alone.
        let machines = [machine("worker-two", Some("w-2"), "10.0.0.3", false)];
        let found = plan(&cluster(Some(Discovery::Nodes)), &nodes, &machines);
        let made: Vec<_> =
            found.apply.iter().map(|d| (d.name.as_str(), d.spec.role, d.spec.address.as_str())).collect();
        assert_eq!(made, [("cp-1", Role::Controlplane, "10.0.0.1"), ("w-1", Role::Worker, "10.0.0.2")]);
        assert!(
            found.apply.iter().all(|d| d.spec.hostname.as_deref() == Some(d.name.as_str()) && d.spec.cluster == "prod")
        );
        assert!(found.skipped.is_empty());
    }

    #[test]
    fn a_machine_it_made_follows_its_node_and_one_made_by_hand_is_never_touched() {
        let nodes = [node("w-1", "prod", false, Some("10.0.0.9")), node("w-2", "prod", false, Some("10.0.0.3"))];
        let machines = [
            machine("w-1", Some("w-1"), "10.0.0.2", true),
            // Named as the Node, made by hand, naming another hostname: not ours to change.
            machine("w-2", Some("w-2-old"), "10.0.0.3", false),
        ];
        let found = plan(&cluster(Some(Discovery::Nodes)), &nodes, &machines);
        assert_eq!(found.apply.len(), 1);
        assert_eq!((found.apply[0].name.as_str(), found.apply[0].spec.address.as_str()), ("w-1", "10.0.0.9"));
        assert_eq!(found.skipped.len(), 1, "{found:?}");
        assert!(found.skipped[0].1.contains("did not make"), "{found:?}");
        // In step: nothing to write.
        let in_step = [machine("w-1", Some("w-1"), "10.0.0.9", true)];
        assert!(plan(&cluster(Some(Discovery::Nodes)), &nodes[..1], &in_step).apply.is_empty());
    }

    #[test]
    fn a_node_without_an_internal_ip_is_skipped_and_said() {
        let nodes = [node("w-1", "prod", false, None)];
        let found = plan(&cluster(Some(Discovery::Nodes)), &nodes, &[]);
        assert!(found.apply.is_empty());
        assert_eq!(found.skipped, [("w-1".to_owned(), "the Node has no InternalIP address".to_owned())]);
    }
}
