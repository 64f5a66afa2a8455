//! `kubectl-ichor` (the kubectl plugin) as a person runs it, a process with the admin's
//! kubeconfig and `-n`, against the real API server: `status`, `resume` and `timeline` on
//! a paused and then a completed operation of a simulated fleet, `hold` and `release` on a
//! Node, and its refusals.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::operator_e2e::Scene;
use crate::support::{Process, eventually};
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

fn plugin(kubeconfig: &Path, namespace: &str, args: &[&str]) -> Output {
    Command::new(plugin_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", namespace])
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
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
    let unknown = plugin(&admin, &ns, &["hold", "no-such-node"]);
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    assert!(text(&unknown.stderr).contains("node no-such-node not found"), "{unknown:?}");

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
    for command in ["status", "resume", "hold", "release", "timeline"] {
        assert!(text(&help.stdout).contains(command), "--help lists {command}");
    }
}
