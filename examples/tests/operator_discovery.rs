//! Every Node accounted for: a cluster whose Nodes have no TalosMachines is refused an
//! upgrade, naming them, until discovery makes the machines from the Nodes; then the
//! upgrade completes with every Node on the target. The fleet runs as the contract says:
//! `operator --simulate-fleet CP+W --no-machines`.

use crate::operator_e2e::{Scene, all_on_target, only_allowed_requests};
use crate::support::eventually;
use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine};
use ichor_operator::{discovery, fleet};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn nodes_without_machines_refuse_the_upgrade_until_discovery_makes_them() {
    let scene = Scene::new("e2e-discovery").await;
    let mut fleet_process = scene.fleet("3+10", &["--no-machines", "--fleet-only"]);
    eventually("the fleet's 13 Nodes", || async { scene.fleet_nodes().await.len() == 13 }).await;
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    assert!(machines.list(&ListParams::default()).await.unwrap().items.is_empty(), "--no-machines makes none");

    // Discovery off: refused, every Node named, nothing touched.
    let kubeconfig = scene.operator_kubeconfig().await;
    let operator = scene.operator("operator", &kubeconfig, &[]);
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation is refused", || async { scene.phase("upgrade").await == "Refused" }).await;
    let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    let message = status.message.unwrap_or_default();
    for node in scene.fleet_nodes().await {
        let name = node.metadata.name.unwrap_or_default();
        assert!(message.contains(&name), "the refusal names {name}: {message}");
    }
    assert!(message.contains("spec.discovery: Nodes"), "it says what fixes it: {message}");
    assert!(machines.list(&ListParams::default()).await.unwrap().items.is_empty());

    // Discovery on: a machine per Node, from the Node; then the upgrade runs to the end.
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let on = json!({ "spec": { "discovery": "Nodes" } });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&on)).await.unwrap();
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    let made = machines.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(made.len(), 13);
    let nodes = scene.fleet_nodes().await;
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let machine = made.iter().find(|m| m.metadata.name.as_deref() == Some(&name)).expect("a machine per Node");
        assert_eq!(machine.spec.hostname.as_deref(), Some(name.as_str()));
        let ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"));
        assert_eq!(Some(&machine.spec.address), ip.map(|a| &a.address));
        let control_plane =
            node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(discovery::CONTROL_PLANE_LABEL));
        assert_eq!(machine.spec.role == ichor_adapters::kubernetes::crd::Role::Controlplane, control_plane, "{name}");
    }
    assert!(all_on_target(&nodes), "every Node on {}", fleet::TARGET);
    only_allowed_requests(&operator).await;
    assert_eq!(fleet_process.terminate(), Some(0));
    scene.end().await;
}
