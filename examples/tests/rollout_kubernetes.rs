//! The main job's Kubernetes upgrade, run as a user runs it: the built `rollout` binary as
//! a process, with the command lines issue 32 makes a contract:
//! `rollout --operation kubernetes --to-kubernetes 1.35.0`, exit 0 completed, 3 refused at
//! planning (a skipped minor, a removed API in use) naming each cause, 4 paused by a fault
//! (a crash-looping component, with no other control plane touched after it); the trace
//! records `config-apply` with `node` and `component` for each change.

use std::process::{Command, Output};

use ichor_testkit::example_binary;
use serde_json::Value;

fn rollout(args: &[&str]) -> Output {
    Command::new(example_binary("rollout")).args(args).output().expect("the example runs")
}

fn summary(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn trace(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

const KUBERNETES: [&str; 4] = ["--operation", "kubernetes", "--to-kubernetes", "1.35.0"];
const COMPONENTS: [&str; 5] = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet"];

#[test]
fn three_control_planes_and_twenty_workers_complete_with_and_without_faults_each_change_traced() {
    for faults in [None, Some("controller-crash,api-outage"), Some("etcd-lag,control-plane-not-ready")] {
        let dir = tempfile::tempdir().unwrap();
        let trace_file = dir.path().join("trace.jsonl");
        let mut args =
            vec!["--workers", "20", "--max-unavailable", "4", "--json", "--trace", trace_file.to_str().unwrap()];
        args.extend(KUBERNETES);
        if let Some(faults) = faults {
            args.extend(["--faults", faults]);
        }
        let output = rollout(&args);
        assert_eq!(output.status.code(), Some(0), "{faults:?}: {output:?}");
        let json = summary(&output);
        assert_eq!(json["outcome"], "completed", "{json}");
        assert_eq!(json["kubelets_on_target"], 23, "{json}");
        assert_eq!(json["control_planes_on_target"], 3, "{json}");
        assert_eq!(json["repeated_applies"], 0, "no change applied twice: {json}");
        assert_eq!(json["max_control_planes_restarting"], 1, "{json}");
        // The bootstrap manifests, last: the kubelets' bootstrap token (a Secret),
        // kube-proxy's ServiceAccount and DaemonSet (applied again only when a controller
        // killed before their record applies them again).
        assert!(json["manifest_applies"].as_u64().is_some_and(|n| n >= 3 && n % 3 == 0), "{json}");
        assert_eq!(json["kube_proxy"], "1.35.0", "{json}");
        let applies: Vec<Value> = trace(&trace_file).into_iter().filter(|e| e["event"] == "config-apply").collect();
        // Three static pods and kube-proxy per control plane, a kubelet per node.
        assert_eq!(applies.len(), 3 * 4 + 23, "{faults:?}");
        for apply in &applies {
            assert!(apply["node"].as_str().is_some_and(|n| !n.is_empty()), "{apply}");
            assert!(COMPONENTS.contains(&apply["component"].as_str().unwrap_or_default()), "{apply}");
        }
        // Every API server first, then the kubelets.
        let last_api_server =
            applies.iter().rposition(|e| e["component"] == "kube-apiserver").expect("API servers changed");
        let first_kubelet = applies.iter().position(|e| e["component"] == "kubelet").expect("kubelets changed");
        assert!(last_api_server < first_kubelet, "{faults:?}");
    }
}

#[test]
fn a_skipped_minor_is_exit_3_naming_each_component_and_touching_nothing() {
    let output = rollout(&["--operation", "kubernetes", "--to-kubernetes", "1.36.0", "--json"]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["outcome"], "refused");
    assert_eq!(json["reason"], "KubernetesSkipsMinor");
    let message = json["message"].as_str().unwrap();
    assert!(message.contains("cp-1/kube-apiserver") && message.contains("upgrade to 1.35.x first"), "{message}");
    assert_eq!(json["applies"], serde_json::json!({}), "nothing touched");
    assert_eq!(json["manifest_applies"], 0, "nothing applied");
    assert_eq!(json["kube_proxy"], "1.34.1", "{json}");
    let text = String::from_utf8_lossy(&rollout(&["--operation", "kubernetes", "--to-kubernetes", "1.36.0"]).stdout)
        .into_owned();
    assert!(text.contains("outcome: refused") && text.contains("reason: KubernetesSkipsMinor"), "{text}");
}

#[test]
fn a_removed_api_in_use_is_exit_3_naming_the_resource_and_its_count() {
    let mut args = vec!["--faults", "removed-api-in-use", "--json"];
    args.extend(KUBERNETES);
    let output = rollout(&args);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let json = summary(&output);
    assert_eq!(json["reason"], "RemovedApisInUse");
    let message = json["message"].as_str().unwrap();
    assert!(message.contains("widgets.widgets.sim.ichor.dev/v1beta1 (3 uses, removed in 1.35)"), "{message}");
    assert_eq!(json["applies"], serde_json::json!({}), "nothing touched");
    assert_eq!(json["manifest_applies"], 0, "nothing applied");
    assert_eq!(json["kube_proxy"], "1.34.1", "{json}");
}

#[test]
fn a_crash_looping_component_is_exit_4_and_no_control_plane_is_touched_after_it() {
    for seed in ["1", "2", "5"] {
        let dir = tempfile::tempdir().unwrap();
        let trace_file = dir.path().join("trace.jsonl");
        let mut args = vec!["--faults", "component-crashloop", "--seed", seed, "--json"];
        args.extend(["--workers", "20", "--trace", trace_file.to_str().unwrap()]);
        args.extend(KUBERNETES);
        let output = rollout(&args);
        assert_eq!(output.status.code(), Some(4), "seed {seed}: {output:?}");
        let json = summary(&output);
        assert_eq!(json["outcome"], "paused", "{json}");
        assert_eq!(json["failed"][0]["reason"], "ComponentCrashLoop", "{json}");
        assert_eq!(json["kubelets_on_target"], 0, "no kubelet changed: {json}");
        let events = trace(&trace_file);
        let crash = events.iter().position(|e| e["event"] == "component-crash-loop").expect("a crash-loop traced");
        let crashed = events[crash]["node"].as_str().unwrap().to_owned();
        let after: Vec<&Value> = events[crash..].iter().filter(|e| e["event"] == "config-apply").collect();
        assert!(after.is_empty(), "seed {seed}: applied after {crashed}'s crash-loop: {after:?}");
        let touched: std::collections::BTreeSet<&str> =
            events.iter().filter(|e| e["event"] == "config-apply").filter_map(|e| e["node"].as_str()).collect();
        assert!(touched.iter().all(|n| *n <= crashed.as_str()), "seed {seed}: {touched:?} past {crashed}");
    }
}

#[test]
fn the_kubernetes_options_are_checked() {
    for args in [
        &["--operation", "kubernetes"][..],
        &["--to-kubernetes", "1.35.0"][..],
        &["--operation", "kubernetes", "--to-kubernetes", "1.35"][..],
        &["--operation", "kubernetes", "--to-kubernetes", "1.35.0", "--node", "cp-1"][..],
    ] {
        let output = rollout(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains("kubernetes") || err.contains("--node") || err.contains("1.35"), "{args:?}: {err}");
    }
}

#[test]
fn the_timeline_draws_each_change_and_its_verification_and_no_talos_bound() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("k8s.svg");
    let mut args = vec!["--workers", "4", "--json", "--timeline", svg.to_str().unwrap()];
    args.extend(KUBERNETES);
    let output = rollout(&args);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("Kubernetes 1.34.1 to 1.35.0"), "the title names the Kubernetes upgrade");
    for phase in ["applying", "verifying", "converged"] {
        assert!(text.contains(&format!("data-phase=\"{phase}\"")), "no {phase} bar");
    }
    assert!(!text.contains("data-phase=\"rebooting\""), "a kubelet restart is no reboot");
    assert!(!text.contains("data-kind=\"bound\""), "no Talos bound drawn for a Kubernetes upgrade");
}
