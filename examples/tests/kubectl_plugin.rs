//! `kubectl-ichor` (the kubectl plugin) as a person runs it, a process with the admin's
//! kubeconfig and `-n`, against the real API server: `status`, `resume` and `timeline` on
//! a paused and then a completed operation of a simulated fleet, `hold` and `release` on a
//! machine and on a Node, a Kubernetes upgrade after it, and its refusals.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::operator_e2e::{KUBERNETES_TARGET, Scene};
use crate::support::{Process, eventually};
use ichor_adapters::kubernetes::crd::TalosMachine;
use ichor_sim::fleet;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The plugin beside the test binary (`cargo build --bin kubectl-ichor`; `cargo test`
/// builds it with ichor-operator's tests).
fn plugin_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let path = profile.join(format!("kubectl-ichor{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} is missing: cargo build --bin kubectl-ichor", path.display());
    path
}

pub(crate) fn plugin(kubeconfig: &Path, namespace: &str, args: &[&str]) -> Output {
    Command::new(plugin_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", namespace])
        .args(args)
        .output()
        .unwrap()
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the plugin, expecting exit 0; its stdout.
pub(crate) fn ok(kubeconfig: &Path, namespace: &str, args: &[&str]) -> String {
    let output = plugin(kubeconfig, namespace, args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "kubectl-ichor {args:?}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn the_kubectl_plugin_shows_resumes_and_draws_a_paused_then_completed_operation() {
    let scene = Scene::new("e2e-plugin").await;
    let admin = scene.admin().to_path_buf();
    let ns = scene.ns.name.clone();
    let kubeconfig = scene.operator_kubeconfig().await;
    let mut fleet_process = scene.fleet("1+2", &["--fleet-only"]);
    scene.fleet_up(3).await;
    // No snapshot store: an upgrade that requires a snapshot pauses before its control plane.
    let operator = Process::start("operator", scene.dir.path(), &kubeconfig, &["--namespace", &ns]);
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation pauses", || async { scene.phase("upgrade").await == "Paused" }).await;

    let status = ok(&admin, &ns, &["status", "upgrade"]);
    let heading = format!("upgrade  cluster {}  talos {}", fleet::CLUSTER, fleet::TARGET);
    for needle in [
        heading.as_str(),
        "Paused (EtcdSnapshotFailed)",
        "] 0/3",
        "kubectl annotate talosoperation upgrade ichor.dev/resume=$(date +%s) --overwrite",
        "MACHINE",
    ] {
        assert!(status.contains(needle), "status shows {needle:?}:\n{status}");
    }
    for machine in ["demo-cp-1", "demo-worker-1", "demo-worker-2"] {
        assert!(status.lines().any(|l| l.trim_start().starts_with(machine)), "a row for {machine}:\n{status}");
    }
    assert_eq!(ok(&admin, &ns, &["status"]), status, "every operation: here the one");

    // Paused before its first machine: nothing to draw is an error, and no file is written
    // (it was an empty SVG and exit 0).
    let empty = scene.dir.path().join("empty.svg");
    let nothing = plugin(&admin, &ns, &["timeline", "upgrade", "-o", &empty.display().to_string()]);
    assert_eq!(nothing.status.code(), Some(1), "{nothing:?}");
    assert!(text(&nothing.stderr).contains("nothing to draw"), "{nothing:?}");
    assert!(nothing.stdout.is_empty() && !empty.exists(), "no picture: {nothing:?}");

    // A machine held by its own name (issue 55): shown as held while it waits; released,
    // its annotation is gone.
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &ns);
    let held = ok(&admin, &ns, &["hold", "demo-worker-2"]);
    assert!(held.contains("talosmachine demo-worker-2 held"), "{held}");
    assert!(machines.get("demo-worker-2").await.unwrap().annotations().contains_key("ichor.dev/hold"));
    let status = ok(&admin, &ns, &["status", "upgrade"]);
    let row = status.lines().find(|l| l.trim_start().starts_with("demo-worker-2")).unwrap_or_default();
    assert!(row.contains(" held "), "shown as held:\n{status}");
    let other = status.lines().find(|l| l.trim_start().starts_with("demo-worker-1")).unwrap_or_default();
    assert!(!other.contains(" held "), "only the held one:\n{status}");
    let released = ok(&admin, &ns, &["release", "demo-worker-2"]);
    assert!(released.starts_with("talosmachine demo-worker-2 released"), "{released}");
    assert!(!machines.get("demo-worker-2").await.unwrap().annotations().contains_key("ichor.dev/hold"));

    // Fix the cause (no snapshot), then resume with the plugin.
    let ops: Api<ichor_adapters::kubernetes::crd::TalosOperation> = Api::namespaced(scene.ns.client.clone(), &ns);
    let skip = json!({ "spec": { "etcdSnapshot": "Skip" } });
    ops.patch("upgrade", &PatchParams::default(), &Patch::Merge(&skip)).await.unwrap();
    let resumed = ok(&admin, &ns, &["resume", "upgrade"]);
    assert!(resumed.starts_with("talosoperation upgrade resumed (ichor.dev/resume="), "{resumed}");
    let token = scene.operation("upgrade").await.unwrap().annotations().get("ichor.dev/resume").cloned();
    assert!(token.is_some_and(|t| resumed.contains(&t)), "the annotation it set: {resumed}");
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;

    // Completed: nothing to resume, and nothing is changed.
    let before = scene.operation("upgrade").await.unwrap().annotations().get("ichor.dev/resume").cloned();
    let refused = plugin(&admin, &ns, &["resume", "upgrade"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(text(&refused.stderr).contains("is Completed, not Paused"), "{refused:?}");
    assert!(refused.stdout.is_empty());
    let after = scene.operation("upgrade").await.unwrap().annotations().get("ichor.dev/resume").cloned();
    assert_eq!(before, after, "a refused resume writes nothing");

    let status = ok(&admin, &ns, &["status", "upgrade"]);
    assert!(
        status.contains("Completed (Completed)") && status.contains(&format!("[{}] 3/3", "#".repeat(30))),
        "{status}"
    );
    assert_eq!(status.lines().filter(|l| l.contains("  done  ")).count(), 3, "every machine done:\n{status}");

    // The timeline, from the machines' recorded history.
    let svg = scene.dir.path().join("upgrade.svg");
    let drawn = ok(&admin, &ns, &["timeline", "upgrade", "-o", &svg.display().to_string()]);
    assert!(drawn.contains("3 machines"), "{drawn}");
    let records: usize = drawn.split(", ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok()).unwrap_or(0);
    assert!(records >= 6, "an Upgrade call and a convergence per machine at least: {drawn}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg"), "an SVG");
    for machine in ["demo-cp-1", "demo-worker-1", "demo-worker-2"] {
        assert!(picture.contains(machine), "the timeline has a row for {machine}");
    }
    let missing = plugin(&admin, &ns, &["timeline", "no-such-operation", "-o", &svg.display().to_string()]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(text(&missing.stderr).contains("talosoperation no-such-operation not found"), "{missing:?}");

    // Hold and release a Node.
    let node = scene.fleet_nodes().await.into_iter().map(|n| n.name_any()).find(|n| n.contains("worker-1")).unwrap();
    let nodes: Api<Node> = Api::all(scene.ns.client.clone());
    let held = ok(&admin, &ns, &["hold", &node]);
    assert!(held.contains(&format!("node {node} held")), "{held}");
    assert!(nodes.get(&node).await.unwrap().annotations().contains_key("ichor.dev/hold"));
    ok(&admin, &ns, &["release", &node]);
    assert!(!nodes.get(&node).await.unwrap().annotations().contains_key("ichor.dev/hold"));
    // Held on its Node, released by the machine's name: the Node's hold is lifted too.
    ok(&admin, &ns, &["hold", &node]);
    let released = ok(&admin, &ns, &["release", "demo-worker-1"]);
    assert!(released.contains(&format!("and node {node}")), "{released}");
    assert!(!nodes.get(&node).await.unwrap().annotations().contains_key("ichor.dev/hold"));
    let unknown = plugin(&admin, &ns, &["hold", "no-such-node"]);
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    assert!(text(&unknown.stderr).contains("node no-such-node not found"), "{unknown:?}");

    // A Kubernetes upgrade after it (issue 55 item 3), `maxUnavailable` a percentage of
    // the workers: its status is its own, never the TalosUpgrade conditions the Talos
    // upgrade left (which read as every machine done before it began), and its timeline
    // draws its changes.
    scene.grant_kubernetes_upgrades().await;
    let kubernetes: ichor_adapters::kubernetes::crd::TalosOperation = serde_json::from_value(json!({
        "apiVersion": "ichor.dev/v1alpha1",
        "kind": "TalosOperation",
        "metadata": { "name": "kubernetes" },
        "spec": {
            "cluster": fleet::CLUSTER, "kind": "kubernetes", "targetVersion": KUBERNETES_TARGET,
            "maxUnavailable": "50%", "etcdSnapshot": "Skip",
        },
    }))
    .unwrap();
    ops.create(&kube::api::PostParams::default(), &kubernetes).await.unwrap();
    // Paused by a person as soon as it is made (issue 55 item 3): nothing new begins
    // while the pause stands, and `resume` lifts it.
    let paused = ok(&admin, &ns, &["pause", "kubernetes"]);
    assert!(paused.starts_with("talosoperation kubernetes paused (ichor.dev/pause)"), "{paused}");
    let begun = ok(&admin, &ns, &["status", "kubernetes"]);
    assert!(begun.contains(&format!("kubernetes {KUBERNETES_TARGET}")), "{begun}");
    assert!(!begun.contains("TalosUpgrade"), "no step of the Talos upgrade:\n{begun}");
    let reason = || async { scene.operation("kubernetes").await.and_then(|op| op.status?.reason).unwrap_or_default() };
    eventually("the pause is recorded", || async { reason().await == "PauseRequested" }).await;
    let applies = fleet_process.value("ichor_fleet_config_applies_total").await.unwrap_or_default();
    let status = ok(&admin, &ns, &["status", "kubernetes"]);
    assert!(
        status.contains("Paused (PauseRequested)") && status.contains("kubectl ichor resume kubernetes"),
        "{status}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(reason().await, "PauseRequested", "it stays paused");
    let later = fleet_process.value("ichor_fleet_config_applies_total").await.unwrap_or_default();
    assert_eq!(later, applies, "no change applied while paused");
    let resumed = ok(&admin, &ns, &["resume", "kubernetes"]);
    assert_eq!(resumed, "talosoperation kubernetes resumed (ichor.dev/pause removed)\n");
    assert!(!scene.operation("kubernetes").await.unwrap().annotations().contains_key("ichor.dev/pause"));
    eventually("the Kubernetes upgrade completes", || async { scene.phase("kubernetes").await == "Completed" }).await;
    let ended = plugin(&admin, &ns, &["pause", "kubernetes"]);
    assert_eq!(ended.status.code(), Some(1), "{ended:?}");
    assert!(text(&ended.stderr).contains("is Completed: nothing to pause"), "{ended:?}");
    let status = ok(&admin, &ns, &["status", "kubernetes"]);
    assert!(status.contains(&format!("[{}] 3/3", "#".repeat(30))), "{status}");
    let converged =
        status.lines().filter(|l| l.contains("  done  ") && l.contains("KubernetesUpgrade=KubernetesConverged"));
    assert_eq!(converged.count(), 3, "every machine done, at its Kubernetes step:\n{status}");
    assert!(!status.contains("TalosUpgrade"), "{status}");
    let svg = scene.dir.path().join("kubernetes.svg");
    let drawn = ok(&admin, &ns, &["timeline", "kubernetes", "-o", &svg.display().to_string()]);
    assert!(drawn.contains("3 machines"), "{drawn}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("data-phase=\"applying\""), "the applies are drawn");
    for machine in ["demo-cp-1", "demo-worker-1", "demo-worker-2"] {
        assert!(picture.contains(machine), "the timeline has a row for {machine}");
    }

    scene.only_allowed_requests(&operator).await;
    assert_eq!(fleet_process.terminate(), Some(0));
    scene.end().await;
}

#[test]
fn bad_arguments_and_kubeconfigs_are_exit_2_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let output = plugin(&missing, "default", &["status"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(text(&output.stderr).contains("no-such-kubeconfig"), "{output:?}");
    assert!(output.stdout.is_empty());

    let output = plugin(&missing, "default", &["frobnicate"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(text(&output.stderr).contains("frobnicate"), "{output:?}");

    let output = plugin(&missing, "default", &["timeline", "x", "-o", "/nonexistent-dir/x.svg"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(text(&output.stderr).contains("/nonexistent-dir/x.svg"), "{output:?}");

    let help = Command::new(plugin_binary()).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    for command in ["status", "pause", "resume", "hold", "release", "timeline"] {
        assert!(text(&help.stdout).contains(command), "--help lists {command}");
    }
}
