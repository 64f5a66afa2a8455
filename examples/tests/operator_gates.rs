//! Health gates through the operator on a real API server (issue 56 item 1): a gate the
//! platform team writes on the TalosCluster, read from the API server with the operator's
//! rights. An expression that does not compile refuses the upgrade, touching nothing; a
//! gate that does not hold keeps the first start waiting, naming the gate, the object and
//! its value, in the status and in `kubectl ichor status`; once the object says so, the
//! upgrade goes on and completes.

use ichor_adapters::kubernetes::crd::{TalosCluster, TalosOperation, TalosOperationSpec};
use ichor_sim::fleet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::kubectl_plugin::ok;
use crate::operator_e2e::{Scene, all_on_target, upgrade_calls};
use crate::support::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_gate_holds_the_first_start_until_its_object_says_so_and_a_bad_one_refuses() {
    let scene = Scene::new("e2e-gates").await;
    let ns = scene.ns.name.clone();
    let both = scene.fleet("1+2", &[]);
    scene.fleet_up(3).await;
    let client = scene.ns.client.clone();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let approval = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "change-approved" },
        "data": { "approved": "no" },
    });
    config_maps.create(&PostParams::default(), &serde_json::from_value(approval).unwrap()).await.unwrap();
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    let gate = |expression: &str| {
        json!({ "spec": { "gates": [{
            "name": "change-approved",
            "objects": { "apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "change-approved" },
            "expression": expression,
            "phase": "beforeOperation",
            "settleSeconds": 0,
        }] } })
    };
    let patch = |body: serde_json::Value| {
        let clusters = clusters.clone();
        async move { clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&body)).await }
    };

    // Refused at admission: a phase the engine does not know.
    let mut unknown = gate("object.data.approved == 'yes'");
    unknown["spec"]["gates"][0]["phase"] = json!("duringMachine");
    let refused = patch(unknown).await.expect_err("an unknown phase is refused at admission");
    assert!(refused.to_string().contains("phase"), "{refused}");

    // An expression that does not compile: refused by the engine, nothing touched.
    patch(gate("object.data.approved ==")).await.unwrap();
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the upgrade is refused, naming the gate", || async {
        let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("InvalidGate")
            && status.message.as_deref().is_some_and(|m| m.contains("gates[0] (change-approved).expression"))
    })
    .await;
    assert!(upgrade_calls(&both).await.is_empty(), "a refusal touches nothing");
    // A dry run is refused as the upgrade is.
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), &ns);
    let dry =
        TalosOperation::new("plan-bad", TalosOperationSpec { dry_run: true, ..scene.operation_spec("talos", None) });
    ops.create(&PostParams::default(), &dry).await.unwrap();
    eventually("the dry run is refused, naming the gate", || async {
        let status = scene.operation("plan-bad").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("InvalidGate")
            && status.message.as_deref().is_some_and(|m| m.contains("gates[0] (change-approved).expression"))
    })
    .await;

    // Corrected: it waits on the ConfigMap, naming it and its value.
    patch(gate("object.data.approved == 'yes'")).await.unwrap();
    eventually("the first start waits on the gate", || async {
        let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("GateNotPassing")
            && status.message.as_deref().is_some_and(|m| {
                m.contains(&format!("gate change-approved does not hold on ConfigMap {ns}/change-approved: false"))
            })
    })
    .await;
    let admin = scene.admin().to_path_buf();
    let shown = ok(&admin, &ns, &["status", "upgrade"]);
    assert!(shown.contains("GateNotPassing") && shown.contains("change-approved"), "{shown}");
    assert!(upgrade_calls(&both).await.is_empty(), "nothing starts while the gate does not hold");
    // A dry run reads the gate as the pass does, and says it would hold the start.
    let dry = TalosOperation::new("plan", TalosOperationSpec { dry_run: true, ..scene.operation_spec("talos", None) });
    ops.create(&PostParams::default(), &dry).await.unwrap();
    eventually("the dry run reads the gate", || async {
        let plan = scene.operation("plan").await.and_then(|op| op.status).and_then(|s| s.plan);
        plan.is_some_and(|p| {
            p.gates.len() == 1
                && p.gates[0].name == "change-approved"
                && p.gates[0].phase == "beforeOperation"
                && !p.gates[0].holds
                && p.gates[0].message == format!("does not hold on ConfigMap {ns}/change-approved: false")
        })
    })
    .await;
    let planned = ok(&admin, &ns, &["status", "plan"]);
    assert!(
        planned.contains(&format!(
            "gate change-approved (beforeOperation): does not hold on ConfigMap {ns}/change-approved: false"
        )),
        "{planned}"
    );

    // Approved: it goes on and completes.
    let approved = json!({ "data": { "approved": "yes" } });
    config_maps.patch("change-approved", &PatchParams::default(), &Patch::Merge(&approved)).await.unwrap();
    eventually("the upgrade completes once approved", || async { scene.phase("upgrade").await == "Completed" }).await;
    assert!(all_on_target(&scene.fleet_nodes().await));
    scene.end().await;
}
