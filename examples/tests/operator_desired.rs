//! Desired state, end to end on the real API server and the simulated fleet
//! (`ICHOR_TEST_KUBECONFIG`): a `TalosCluster` with `spec.upgrades: Automatic` whose
//! `talosVersion` is two minor lines ahead of its Nodes goes there in two operations the
//! operator makes (through the latest known patch of the line between), then follows a
//! change of `kubernetesVersion`; nothing but the cluster's spec is written by the test.

use std::time::Duration;

use crate::kubectl_plugin::ok;
use crate::operator_e2e::{KUBERNETES_TARGET, Scene};
use crate::support::eventually;
use ichor_adapters::kubernetes::crd::{TalosCluster, TalosOperation};
use ichor_operator::desired;
use ichor_sim::fleet;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// Two minor lines behind the fleet's cluster (`fleet::TARGET`, v1.14.3).
pub(crate) const FROM: &str = "v1.12.5";
/// The latest known patch of the line between (`releases::BUILT_IN_TALOS`).
pub(crate) const HOP: &str = "v1.13.9";
/// What one rollout of 3 + 2 may take, on a loaded machine.
const ROLLOUT: Duration = Duration::from_secs(300);

async fn patch_cluster(scene: &Scene, spec: serde_json::Value) {
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let patch = json!({ "spec": spec });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

async fn cluster(scene: &Scene) -> TalosCluster {
    Api::<TalosCluster>::namespaced(scene.ns.client.clone(), &scene.ns.name).get(fleet::CLUSTER).await.unwrap()
}

async fn operations(scene: &Scene) -> Vec<TalosOperation> {
    let api: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    api.list(&ListParams::default()).await.unwrap().items
}

/// Waits for operation `name` to be made, owned by the cluster, then to complete; all the
/// while, `kubectl ichor status NAME` says what it is (its kind and target), and its
/// progress never goes back. Then `kubectl ichor timeline NAME` draws every machine.
pub(crate) async fn made_and_completed(scene: &Scene, name: &str) -> TalosOperation {
    eventually(&format!("{name} is made"), || async { scene.operation(name).await.is_some() }).await;
    let op = scene.operation(name).await.unwrap();
    assert!(desired::made_for(&op, &cluster(scene).await), "{name} is owned by the cluster: {:?}", op.metadata);
    let heading = format!("{name}  cluster {}  {} {}", fleet::CLUSTER, op.spec.kind, op.spec.target_version);
    let (admin, ns) = (scene.admin().to_path_buf(), scene.ns.name.clone());
    let mut seen = 0;
    let started = std::time::Instant::now();
    loop {
        let completed = scene.phase(name).await == "Completed";
        let (admin, ns, op_name) = (admin.clone(), ns.clone(), name.to_owned());
        let status = tokio::task::spawn_blocking(move || ok(&admin, &ns, &["status", &op_name])).await.unwrap();
        assert!(status.contains(&heading), "status names the operation's kind and target ({heading}):\n{status}");
        if op.spec.kind == "kubernetes" {
            assert!(!status.contains("TalosUpgrade"), "no step of a Talos upgrade:\n{status}");
        }
        let progress = status
            .split("] ")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or_else(|| panic!("a progress bar:\n{status}"));
        assert!(progress >= seen, "progress went back from {seen} to {progress}:\n{status}");
        seen = progress;
        if completed {
            assert!(status.contains(&format!("[{}] 5/5", "#".repeat(30))), "{status}");
            break;
        }
        assert!(started.elapsed() < ROLLOUT, "{name} did not complete within {ROLLOUT:?}:\n{status}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let svg = scene.dir.path().join(format!("{name}.svg"));
    let drawn = ok(scene.admin(), &scene.ns.name, &["timeline", name, "-o", &svg.display().to_string()]);
    assert!(drawn.contains("5 machines"), "{drawn}");
    scene.operation(name).await.unwrap()
}

/// A dry run of the Kubernetes upgrade to [`KUBERNETES_TARGET`], made by a person, once it
/// has planned: every component of the 3 + 2 fleet changes, nothing would refuse it, and
/// its durations come from `talos_upgrade` (no Kubernetes upgrade is recorded yet), said
/// so. `kubectl ichor status` lists the changes. Its name.
async fn kubernetes_dry_run(scene: &Scene, talos_upgrade: &str) -> String {
    let name = "kubernetes-plan";
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let spec = ichor_adapters::kubernetes::crd::TalosOperationSpec {
        target_version: KUBERNETES_TARGET.into(),
        dry_run: true,
        ..scene.operation_spec("kubernetes", None)
    };
    ops.create(&kube::api::PostParams::default(), &TalosOperation::new(name, spec)).await.unwrap();
    eventually("the Kubernetes dry run plans", || async { scene.phase(name).await == "Completed" }).await;
    let plan = scene.operation(name).await.unwrap().status.unwrap().plan.unwrap();
    let found = plan.kubernetes.as_ref().expect("a Kubernetes dry run's findings");
    assert!(found.refusals.is_empty(), "{:?}", found.refusals);
    let per = |component: &str| found.changes.iter().filter(|c| c.component == component).count();
    assert_eq!(
        (per("kube-apiserver"), per("kube-controller-manager"), per("kube-scheduler"), per("kubelet")),
        (3, 3, 3, 5),
        "{:?}",
        found.changes
    );
    assert!(found.changes.iter().all(|c| c.to == KUBERNETES_TARGET && c.from != c.to), "{:?}", found.changes);
    assert_eq!(plan.order.len(), 5, "{:?}", plan.order);
    assert_eq!(plan.history.as_deref(), Some(talos_upgrade));
    assert!(
        plan.assumed.iter().any(|a| a.contains("no Kubernetes upgrade of this cluster is recorded")),
        "{:?}",
        plan.assumed
    );
    assert!(plan.p10_seconds > 0.0 && plan.p10_seconds <= plan.p50_seconds && plan.p50_seconds <= plan.p90_seconds);
    let (admin, ns) = (scene.admin().to_path_buf(), scene.ns.name.clone());
    let status = tokio::task::spawn_blocking(move || ok(&admin, &ns, &["status", name])).await.unwrap();
    assert!(status.contains("changes: ") && status.contains(&format!("-> {KUBERNETES_TARGET}")), "{status}");
    assert!(!status.contains("would be refused"), "{status}");
    name.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn an_automatic_cluster_goes_two_minors_in_two_hops_then_follows_its_kubernetes_version() {
    let scene = Scene::new("e2e-desired").await;
    let fleet = scene.fleet("3+2", &["--fleet-only", "--fleet-from", FROM]);
    scene.fleet_up(5).await;
    let kubeconfig = scene.operator_kubeconfig().await;
    scene.grant_kubernetes_upgrades().await;
    let mut operator = scene.operator("operator", &kubeconfig, &[]);

    // Before any operation, and Manual: the cluster's status follows its Nodes by itself.
    eventually("the cluster's status, with no operation", || async {
        let status = cluster(&scene).await.status.unwrap_or_default();
        status.running.as_deref() == Some(FROM) && status.nodes == Some(5) && status.machines == Some(5)
    })
    .await;
    assert!(cluster(&scene).await.status.unwrap_or_default().upgrade.is_none(), "Manual: no upgrade state");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(operations(&scene).await.is_empty(), "Manual: nothing is made");

    // One field: the cluster's own talosVersion (v1.14.3) two minor lines ahead.
    patch_cluster(&scene, json!({ "upgrades": "Automatic" })).await;
    let first =
        made_and_completed(&scene, &desired::operation_name(ichor_upgrade_core::operation::OperationKind::Talos, HOP))
            .await;
    assert_eq!(first.spec.target_version, HOP);
    let second_name = desired::operation_name(ichor_upgrade_core::operation::OperationKind::Talos, fleet::TARGET);
    let second = made_and_completed(&scene, &second_name).await;
    // The second hop was made only once the first had completed.
    let completed_first = first.status.as_ref().and_then(|s| {
        s.conditions.iter().filter(|c| c.type_ == "Ready" && c.status == "True").map(|c| c.last_transition_time.0).max()
    });
    let made_second = second.metadata.creation_timestamp.as_ref().map(|t| t.0);
    assert!(completed_first.is_some() && made_second >= completed_first, "{completed_first:?} {made_second:?}");
    eventually("the cluster is up to date on Talos", || async {
        let status = cluster(&scene).await.status.unwrap_or_default();
        status.running.as_deref() == Some(fleet::TARGET) && status.upgrade.is_some_and(|u| u.state == "UpToDate")
    })
    .await;

    // A dry run of the Kubernetes upgrade first (issue 55 item 4): what would change on
    // each node, from the cluster's own reads, timed from its last Talos upgrade.
    let plan = kubernetes_dry_run(&scene, &second_name).await;

    // Then Kubernetes: one field again.
    patch_cluster(&scene, json!({ "kubernetesVersion": KUBERNETES_TARGET })).await;
    let kubernetes_name =
        desired::operation_name(ichor_upgrade_core::operation::OperationKind::Kubernetes, KUBERNETES_TARGET);
    let kubernetes = made_and_completed(&scene, &kubernetes_name).await;
    assert_eq!(kubernetes.spec.kind, "kubernetes");
    eventually("the Kubernetes upgrade is calibrated against its dry run", || async {
        let op = scene.operation(&kubernetes_name).await.unwrap();
        op.status.and_then(|s| s.calibration).is_some_and(|c| c.plan == plan)
    })
    .await;
    for node in scene.fleet_nodes().await {
        let info = node.status.and_then(|s| s.node_info).unwrap();
        assert_eq!(info.kubelet_version, format!("v{KUBERNETES_TARGET}"));
        assert_eq!(info.os_image, format!("Talos ({})", fleet::TARGET));
    }
    eventually("the cluster is up to date", || async {
        let status = cluster(&scene).await.status.unwrap_or_default();
        status.kubernetes_versions == [format!("v{KUBERNETES_TARGET}")]
            && status.upgrade.is_some_and(|u| u.state == "UpToDate")
    })
    .await;
    // Exactly the three it needed, every one its own.
    let mut names: Vec<String> =
        operations(&scene).await.iter().filter(|o| !o.spec.dry_run).map(ResourceExt::name_any).collect();
    names.sort();
    assert_eq!(names, [kubernetes_name, first.name_any(), second_name]);
    scene.only_allowed_requests(&operator).await;
    // Manual again before the scene's end deletes the operations: nothing is made again.
    patch_cluster(&scene, json!({ "upgrades": "Manual" })).await;
    operator.terminate();
    drop(fleet);
    scene.end().await;
}
