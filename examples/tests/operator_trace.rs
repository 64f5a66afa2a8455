//! The operator's `--trace FILE`, as a process: on a real Kubernetes API server and the
//! simulated fleet (`ICHOR_TEST_KUBECONFIG`; skipped with one line without it), a completed
//! upgrade leaves a trace in the simulator's records, each machine's in the order its
//! upgrade went; and a path that cannot be written is a bad argument.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::support::{Process, TIME_SCALE, eventually};
use ichor_adapters::kubernetes::crd::{TalosOperation, TalosOperationSpec};
use ichor_sim::fleet;
use ichor_testkit::example_binary;
use ichor_testkit::kube::TestNamespace;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use serde_json::Value;

/// One record of the trace file, as the operator wrote it.
#[derive(Debug, Clone)]
struct Record {
    t: f64,
    node: String,
    role: String,
    event: String,
    version: Option<String>,
}

/// Every line of the trace file at `path`, parsed (a line that is not a record fails).
fn read_trace(path: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"));
            let text = |key: &str| value[key].as_str().unwrap_or_else(|| panic!("no {key} in {line}")).to_owned();
            Record {
                t: value["t"].as_f64().unwrap_or_else(|| panic!("no t in {line}")),
                node: text("node"),
                role: text("role"),
                event: text("event"),
                version: value["version"].as_str().map(str::to_owned),
            }
        })
        .collect()
}

/// The records of each node, in order.
fn by_node(trace: &[Record]) -> BTreeMap<String, Vec<Record>> {
    let mut nodes: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for record in trace {
        nodes.entry(record.node.clone()).or_default().push(record.clone());
    }
    nodes
}

/// Where `event` first is in `records`, failing with the node's records without one.
fn position(records: &[Record], event: &str) -> usize {
    records.iter().position(|r| r.event == event).unwrap_or_else(|| {
        let kinds: Vec<&str> = records.iter().map(|r| r.event.as_str()).collect();
        panic!("no {event} for {}: {kinds:?}", records.first().map_or("?", |r| r.node.as_str()))
    })
}

/// Runs an operator with a `control_planes`+`workers` fleet and `--trace` in a namespace of
/// its own, upgrades the fleet to [`fleet::TARGET`], and returns the trace once every
/// machine's `converged` is in it, with the fleet's Node names.
async fn traced_upgrade(prefix: &str, control_planes: usize, workers: usize, extra: &[&str]) -> Traced {
    let ns = TestNamespace::create(prefix).await;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let snapshots = dir.path().join("snapshots").display().to_string();
    let shape = format!("{control_planes}+{workers}");
    let mut args = vec!["--namespace", ns.name.as_str()];
    args.extend_from_slice(&["--simulate-fleet", &shape, "--time-scale", TIME_SCALE]);
    args.extend_from_slice(&["--etcd-snapshot-dir", &snapshots, "--trace", trace.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let mut process = Process::start("operator", dir.path(), &ns.kubeconfig, &args);

    let machines = control_planes + workers;
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let selector = ListParams::default().labels(&format!("{}={}", fleet::FLEET_LABEL, ns.name));
    eventually("the fleet's Nodes", || async {
        nodes.list(&selector).await.is_ok_and(|l| {
            l.items.len() == machines
                && l.items.iter().all(|n| n.status.as_ref().is_some_and(|s| s.node_info.is_some()))
        })
    })
    .await;
    let names: Vec<String> =
        nodes.list(&selector).await.unwrap().items.iter().filter_map(|n| n.metadata.name.clone()).collect();

    let ops: Api<TalosOperation> = Api::namespaced(ns.client.clone(), &ns.name);
    let op = TalosOperation::new(
        "upgrade",
        TalosOperationSpec {
            preflight: None,
            etcd_snapshot: None,
            dry_run: false,
            allow_two_control_planes: false,
            cluster: fleet::CLUSTER.into(),
            kind: "talos".into(),
            target_version: fleet::TARGET.into(),
            max_unavailable: 1.into(),
            maintenance: None,
            gates: None,
            machine: None,
        },
    );
    ops.create(&PostParams::default(), &op).await.unwrap();
    eventually("the operation completes", || async {
        ops.get_opt("upgrade").await.ok().flatten().and_then(|op| op.status).and_then(|s| s.phase).as_deref()
            == Some("Completed")
    })
    .await;
    // Each converged record was handed to the writer before the status said Completed; the
    // writer flushes as soon as it has written what it was handed.
    eventually("every machine's converged record in the file", || async {
        let trace = read_trace(&trace);
        names.iter().all(|n| trace.iter().any(|r| &r.node == n && r.event == "converged"))
    })
    .await;
    assert_eq!(process.terminate(), Some(0), "a clean stop");
    let records = read_trace(&trace);
    ns.delete().await;
    Traced { records, nodes: names }
}

struct Traced {
    records: Vec<Record>,
    nodes: Vec<String>,
}

impl Traced {
    /// What holds of every trace: times from 0 and non-decreasing; every record about a
    /// fleet machine (with its role), the operation or the controller; each machine listed
    /// first, with the version it ran; no controller restart (one replica, leading once).
    fn check_common(&self) {
        let trace = &self.records;
        assert!(!trace.iter().any(|r| r.event == "controller-restart"), "{trace:#?}");
        assert!(trace.iter().all(|r| r.t >= 0.0), "{trace:#?}");
        for pair in trace.windows(2) {
            assert!(pair[0].t <= pair[1].t, "times never go back: {:?} then {:?}", pair[0], pair[1]);
        }
        for record in trace {
            let known = match record.role.as_str() {
                "control-plane" | "worker" => self.nodes.contains(&record.node),
                "operation" => record.node == "operation",
                "controller" => record.node == "controller",
                _ => false,
            };
            assert!(known, "a record about something else: {record:?}");
        }
        let cps = self.nodes.iter().filter(|n| n.contains("-cp-")).count();
        let roles = by_node(trace);
        for (node, records) in &roles {
            if self.nodes.contains(node) {
                let expected = if node.contains("-cp-") { "control-plane" } else { "worker" };
                assert!(records.iter().all(|r| r.role == expected), "{node} is a {expected}: {records:#?}");
            }
        }
        assert!(cps > 0, "{:?}", self.nodes);
        // Each machine rebooted into the target once and converged after it.
        for node in &self.nodes {
            let records = &roles[node];
            assert_eq!(records[0].event, "listed", "{node}: listed first: {records:#?}");
            // Listed as first seen: with the version it ran, or none when its Node had
            // not reported one yet (a fleet's Node may be seen before its kubelet's first
            // status, as a real cluster's may).
            assert_ne!(records[0].version.as_deref(), Some(fleet::TARGET), "{node}: listed as it was: {records:#?}");
            let reboot_end = position(records, "reboot-end");
            assert!(reboot_end < position(records, "converged"), "{node}: rebooted before converged: {records:#?}");
            assert_eq!(records[reboot_end].version.as_deref(), Some(fleet::TARGET), "{node}: {records:#?}");
            assert!(
                records[reboot_end..].iter().any(|r| r.event == "ready"),
                "{node}: Ready after its reboot: {records:#?}"
            );
            assert_eq!(records.iter().filter(|r| r.event == "converged").count(), 1, "{node}: {records:#?}");
        }
        // The etcd snapshot, from a control plane, before any control plane's upgrade.
        let snapshot = trace.iter().position(|r| r.event == "etcd-snapshot").expect("an etcd-snapshot record");
        assert_eq!(trace[snapshot].role, "control-plane");
        let first_start = trace
            .iter()
            .position(|r| r.role == "control-plane" && (r.event == "upgrade-call" || r.event == "install-start"))
            .expect("a control plane started");
        assert!(snapshot < first_start, "{trace:#?}");
        // The timeline draws it: a row per machine, each ending converged.
        let records: Vec<ichor_timeline::TraceRecord> = trace
            .iter()
            .map(|r| ichor_timeline::TraceRecord {
                version: r.version.clone(),
                ..ichor_timeline::TraceRecord::new(r.t, &r.node, &r.role, &r.event)
            })
            .collect();
        let timeline = ichor_timeline::Timeline::from_records(&records);
        assert_eq!(timeline.rows.len(), self.nodes.len());
        for row in &timeline.rows {
            let phases: Vec<ichor_timeline::Phase> = row.bars.iter().map(|b| b.phase).collect();
            assert!(phases.contains(&ichor_timeline::Phase::Rebooting), "{}: {phases:?}", row.node);
            assert_eq!(phases.last(), Some(&ichor_timeline::Phase::Converged), "{}: {phases:?}", row.node);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_legacy_upgrade_by_the_operator_is_traced_machine_by_machine() {
    let traced = traced_upgrade("e2e-trace-legacy", 3, 2, &["--executor", "legacy"]).await;
    traced.check_common();
    let nodes = by_node(&traced.records);
    for node in &traced.nodes {
        let records = &nodes[node];
        let call = position(records, "upgrade-call");
        assert!(call < position(records, "shown-not-ready"), "{node}: {records:#?}");
        assert!(call < position(records, "reboot-end"), "{node}: {records:#?}");
        assert_eq!(records.iter().filter(|r| r.event == "upgrade-call").count(), 1, "{node}: one call");
        assert!(records.iter().all(|r| r.event != "install-start"), "{node}: no lifecycle install");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_lifecycle_upgrade_by_the_operator_traces_its_background_installs() {
    let traced = traced_upgrade("e2e-trace-lifecycle", 3, 1, &["--executor", "lifecycle"]).await;
    traced.check_common();
    let nodes = by_node(&traced.records);
    for node in &traced.nodes {
        let records = &nodes[node];
        let installed = position(records, "installed");
        assert!(position(records, "image-pulled") < installed, "{node}: pulled, then installed: {records:#?}");
        assert!(position(records, "install-start") < installed, "{node}: {records:#?}");
        let reboot_call = position(records, "reboot-call");
        assert!(installed < reboot_call && position(records, "cordon") < reboot_call, "{node}: {records:#?}");
        assert!(reboot_call < position(records, "reboot-end"), "{node}: {records:#?}");
        assert!(position(records, "reboot-end") < position(records, "uncordon"), "{node}: {records:#?}");
        assert!(records.iter().all(|r| r.event != "upgrade-call"), "{node}: no legacy call");
    }
}

#[test]
fn a_trace_path_that_cannot_be_written_is_a_bad_argument() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-directory").join("trace.jsonl");
    let output = Command::new(example_binary("operator"))
        .args(["--kubeconfig", "/nonexistent/kubeconfig", "--trace"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: --trace ") && stderr.contains("trace.jsonl"), "{stderr}");
    assert!(output.stdout.is_empty(), "errors go to stderr: {output:?}");
}
