//! `kubectl ichor audit CLUSTER` (issue 56 item 4) as a person or a cron job runs it, a
//! process with the admin's kubeconfig, on a real API server and the simulated fleet's
//! Talos APIs: before an upgrade it finds every Node off the declared version, after it
//! finds nothing, and a cordon the engine left behind is found the morning after. It
//! changes nothing; its exit code says whether it found something.

use crate::kubectl_plugin::{ok, plugin, text};
use crate::operator_e2e::{Scene, all_on_target, upgrade_calls};
use crate::support::eventually;
use ichor_sim::fleet;
use ichor_upgrade_core::machine::lifecycle::CORDONED_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The exit code of an audit that found something.
const FOUND: i32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn the_audit_finds_what_a_morning_after_would_and_changes_nothing() {
    let scene = Scene::new("e2e-audit").await;
    let (admin, ns) = (scene.admin().to_path_buf(), scene.ns.name.clone());
    let both = scene.fleet("1+2", &[]);
    scene.fleet_up(3).await;

    // Before the upgrade: every Node runs the release before the declared one.
    let before = plugin(&admin, &ns, &["audit", fleet::CLUSTER]);
    let report = text(&before.stdout);
    assert_eq!(before.status.code(), Some(FOUND), "{report}{}", text(&before.stderr));
    assert!(report.contains(&format!("audited against Talos {}", fleet::TARGET)), "{report}");
    assert_eq!(report.matches("NodeNotOnTarget: ").count(), 3, "{report}");
    let json = plugin(&admin, &ns, &["audit", fleet::CLUSTER, "-o", "json"]);
    assert_eq!(json.status.code(), Some(FOUND));
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(parsed["clean"], false, "{parsed}");
    let findings = parsed["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 3, "{parsed}");
    assert!(findings.iter().all(|f| f["finding"] == "NodeNotOnTarget" && f["target"] == fleet::TARGET), "{parsed}");
    assert!(upgrade_calls(&both).await.is_empty(), "the audit starts nothing");

    // Through the upgrade: clean, and exit 0.
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the upgrade completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    assert!(all_on_target(&scene.fleet_nodes().await));
    let clean = ok(&admin, &ns, &["audit", fleet::CLUSTER]);
    assert!(clean.contains("clean: no Node left cordoned"), "{clean}");

    // A cordon the engine left behind, as a lost uncordon would leave it.
    let nodes: Api<Node> = Api::all(scene.ns.client.clone());
    let worker = scene.fleet_nodes().await.into_iter().map(|n| n.name_any()).find(|n| n.contains("worker")).unwrap();
    let left = json!({
        "metadata": { "annotations": { CORDONED_ANNOTATION: "left by a lost uncordon" } },
        "spec": { "unschedulable": true },
    });
    nodes.patch(&worker, &PatchParams::default(), &Patch::Merge(&left)).await.unwrap();
    let version = nodes.get(&worker).await.unwrap().resource_version();
    let after = plugin(&admin, &ns, &["audit", fleet::CLUSTER]);
    let report = text(&after.stdout);
    assert_eq!(after.status.code(), Some(FOUND), "{report}{}", text(&after.stderr));
    assert!(report.contains(&format!("LeftCordoned: Node {worker} is still cordoned by the engine")), "{report}");
    assert!(report.contains("\n1 finding:\n"), "one finding only: {report}");
    assert_eq!(nodes.get(&worker).await.unwrap().resource_version(), version, "the audit uncordons nothing");

    // A cluster that does not exist: a failure (exit 1), not an audit.
    let missing = plugin(&admin, &ns, &["audit", "no-such-cluster"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains(&format!("TalosCluster {ns}/no-such-cluster not found")));
    scene.end().await;
}
