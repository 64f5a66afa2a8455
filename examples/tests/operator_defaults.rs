//! The operator as shipped and as its quick start (`docs/operator.md`, named from the README) runs it: no option a newcomer would not know
//! to give. A simulated fleet's upgrade completes with no snapshot store named; a real
//! cluster's, with none, pauses before its first control plane and says what fixes it.

use crate::operator_e2e::{Scene, all_on_target};
use crate::support::{Process, TIME_SCALE, eventually};
use ichor_sim::fleet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn the_readme_quick_start_completes_with_no_snapshot_store_named() {
    let scene = Scene::new("e2e-quick-start").await;
    // The quick start's command (with this test's namespace and time scale): no snapshot flag.
    let args = ["--namespace", &scene.ns.name, "--simulate-fleet", "3+2", "--time-scale", TIME_SCALE];
    let mut both = Process::start("quick-start", scene.dir.path(), scene.admin(), &args);
    scene.fleet_up(5).await;
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    assert!(all_on_target(&scene.fleet_nodes().await), "every Node on {}", fleet::TARGET);

    // The snapshot the default spec requires was taken, into the new directory the log names.
    let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    let snapshot = status.etcd_snapshot.expect("status.etcdSnapshot");
    let dir = std::env::temp_dir().join(format!("ichor-operator-snapshots-{}", both.pid()));
    assert!(
        snapshot.location.starts_with(&dir.display().to_string()),
        "{} not in {}",
        snapshot.location,
        dir.display()
    );
    let bytes = std::fs::read(&snapshot.location).unwrap();
    assert_eq!(i64::try_from(bytes.len()).unwrap(), snapshot.size);
    assert!(both.log_lines().iter().any(|l| l.contains("new directory") && l.contains(&dir.display().to_string())));
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(both.terminate(), Some(0));
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn with_no_snapshot_store_a_real_cluster_pauses_naming_the_flags_and_the_spec_field() {
    let scene = Scene::new("e2e-no-store").await;
    let _fleet = scene.fleet("3+1", &["--fleet-only"]);
    scene.fleet_up(4).await;
    // An operator as on a real cluster: no fleet, no snapshot flag.
    let kubeconfig = scene.operator_kubeconfig().await;
    let _operator = Process::start("operator", scene.dir.path(), &kubeconfig, &["--namespace", &scene.ns.name]);
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation pauses", || async { scene.phase("upgrade").await == "Paused" }).await;
    let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    let message = status.message.unwrap_or_default();
    for fix in ["--etcd-snapshot-dir", "--etcd-snapshot-s3-bucket", "spec.etcdSnapshot: Skip"] {
        assert!(message.contains(fix), "the pause names {fix}: {message}");
    }
    // Before any control plane: nothing was touched.
    let nodes = scene.fleet_nodes().await;
    assert!(nodes.iter().all(|n| {
        n.status.as_ref().and_then(|s| s.node_info.as_ref()).is_some_and(|i| !i.os_image.contains(fleet::TARGET))
    }));
    scene.end().await;
}
