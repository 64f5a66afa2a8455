//! Alert gates through the operator against a real Alertmanager (issue 56 item 2), and
//! Prometheus's alerts as a gate's source. A critical alert on a node that is not being
//! upgraded keeps the first start waiting, named in the status; resolved, the rollout
//! goes on. The machine in its turn gets Ichor's silence (a lease of 20 s, renewed by the
//! leader's passes), which Alertmanager applies to an alert about that node. The leader
//! killed mid-turn, the silence lapses within its lease.

use std::time::{Duration, Instant};

use ichor_adapters::kubernetes::crd::TalosCluster;
use ichor_sim::fleet;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::operator_e2e::{Scene, upgrade_calls};
use crate::support::monitoring::Peer;
use crate::support::{eventually, eventually_within};

const LEASE_S: u64 = 20;

fn rfc3339(at: std::time::SystemTime) -> String {
    let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    ichor_upgrade_core::Timestamp::from_unix_millis(i64::try_from(secs).unwrap()).rfc3339()
}

/// Posts an alert to Alertmanager, firing until `ends` from now (zero: resolved now).
async fn post_alert(am: &Peer, labels: &Value, ends: Duration) {
    let now = std::time::SystemTime::now();
    let body = json!([{
        "labels": labels,
        "startsAt": rfc3339(now - Duration::from_secs(60)),
        "endsAt": rfc3339(now + ends),
    }]);
    let (code, said) = am.request("POST", "/api/v2/alerts", Some(&body)).await.expect("Alertmanager answers");
    assert_eq!(code, 200, "{said}");
}

/// Alertmanager's silences that Ichor made.
async fn ichor_silences(am: &Peer) -> Vec<Value> {
    let all = am.json("/api/v2/silences").await;
    all.as_array().unwrap().iter().filter(|s| s["createdBy"] == "ichor").cloned().collect()
}

fn seconds_until(rfc3339: &str) -> f64 {
    let at: k8s_openapi::jiff::Timestamp = rfc3339.parse().unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    (at.as_millisecond() - now.as_millisecond()) as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server and Alertmanager: ICHOR_TEST_KUBECONFIG, ICHOR_TEST_ALERTMANAGER (bash .ci/run makes both)"]
async fn an_alert_elsewhere_holds_the_start_and_the_turns_silence_lapses_when_the_leader_dies() {
    let scene = Scene::new("e2e-alerts").await;
    let ns = scene.ns.name.clone();
    let am = Peer::alertmanager(scene.dir.path()).await;
    // Slow enough that a machine's turn lasts seconds, to be seen and cut short.
    let mut both = scene.fleet_at("1+2", "4", &[]);
    scene.fleet_up(3).await;
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &ns);
    // Refused at admission: objects and alerts at once, a silence Prometheus cannot hold,
    // a cap below the lease.
    let objects = json!({ "apiVersion": "v1", "kind": "ConfigMap" });
    let refusals = [
        (
            json!({ "objects": objects, "expression": "true", "alerts": { "alertmanager": "http://a:9093" } }),
            "one of the two",
        ),
        (json!({ "alerts": { "prometheus": "http://p:9090", "silence": {} } }), "a silence needs alertmanager"),
        (
            json!({ "alerts": { "alertmanager": "http://a:9093", "silence": { "maxSeconds": 60 } } }),
            "maxSeconds is at least leaseSeconds",
        ),
        (json!({ "alerts": { "alertmanager": "http://a:9093", "prometheus": "http://p:9090" } }), "name one source"),
    ];
    for (reads, says) in refusals {
        let mut gate = json!({ "name": "bad", "phase": "beforeMachine" });
        gate.as_object_mut().unwrap().extend(reads.as_object().unwrap().clone());
        let patch = json!({ "spec": { "gates": [gate] } });
        let refused = clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&patch)).await;
        let refused = refused.expect_err("refused at admission");
        assert!(refused.to_string().contains(says), "{says}: {refused}");
    }
    let gate = json!({ "spec": { "gates": [{
        "name": "no-critical",
        "alerts": {
            "alertmanager": format!("http://127.0.0.1:{}", am.port),
            "matchers": ["severity=critical"],
            "silence": { "leaseSeconds": LEASE_S, "maxSeconds": 600 },
        },
        "phase": "beforeMachine",
    }] } });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&gate)).await.unwrap();

    // A critical alert on a machine no operation upgrades: the first start waits on it.
    let elsewhere = json!({ "alertname": "DiskFull", "severity": "critical", "node": "ingress-7" });
    post_alert(&am, &elsewhere, Duration::from_secs(3600)).await;
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the first start waits on the alert, naming it", || async {
        let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("GateNotPassing")
            && status.message.as_deref().is_some_and(|m| {
                m.contains(
                    "gate no-critical does not hold on alert DiskFull{node=\"ingress-7\", severity=\"critical\"}",
                )
            })
    })
    .await;
    assert!(upgrade_calls(&both).await.is_empty(), "nothing starts while it fires");
    assert!(ichor_silences(&am).await.is_empty(), "no machine is in its turn yet");

    // Resolved: the first machine starts, and its turn is silenced, as a lease.
    post_alert(&am, &elsewhere, Duration::ZERO).await;
    eventually("a machine in its turn is silenced", || async { !ichor_silences(&am).await.is_empty() }).await;
    let silence = ichor_silences(&am).await.remove(0);
    assert_eq!(silence["status"]["state"], "active", "{silence}");
    let matcher = &silence["matchers"][0];
    assert_eq!((&matcher["name"], matcher["isRegex"].as_bool()), (&json!("node"), Some(false)), "{silence}");
    let node = matcher["value"].as_str().unwrap().to_owned();
    let left = seconds_until(silence["endsAt"].as_str().unwrap());
    assert!(left <= LEASE_S as f64 + 1.0, "a lease of {LEASE_S} s at most: {left} s left");
    // The comment names the machine (the Node's name is the machine's, with the fleet's suffix).
    let machine = node.split('.').next().unwrap();
    assert!(silence["comment"].as_str().unwrap().ends_with(&format!("machine {machine}")), "{silence}");

    // Alertmanager applies it to an alert about that node: the gate ignores it.
    let own = json!({ "alertname": "KubeNodeNotReady", "severity": "critical", "node": node });
    post_alert(&am, &own, Duration::from_secs(3600)).await;
    let id = silence["id"].as_str().unwrap().to_owned();
    eventually("the machine's own alert is silenced by Ichor's silence", || async {
        let alerts = am.json("/api/v2/alerts?silenced=true").await;
        alerts.as_array().unwrap().iter().any(|a| {
            a["labels"]["node"] == node.as_str()
                && a["status"]["state"] == "suppressed"
                && a["status"]["silencedBy"].as_array().is_some_and(|ids| ids.iter().any(|s| s == id.as_str()))
        })
    })
    .await;
    // Renewed by the passes while the turn lasts (half a lease before its end).
    let first_end = silence["endsAt"].as_str().unwrap().to_owned();
    eventually_within(Duration::from_secs(LEASE_S), "the silence is renewed", || async {
        ichor_silences(&am).await.iter().any(|s| s["id"] == id.as_str() && s["endsAt"].as_str() != Some(&first_end))
    })
    .await;

    // The leader dies mid-turn: nothing renews the silence, which lapses within its lease.
    both.kill();
    let killed = Instant::now();
    eventually_within(Duration::from_secs(LEASE_S + 10), "the silence lapses", || async {
        ichor_silences(&am).await.iter().filter(|s| s["id"] == id.as_str()).all(|s| s["status"]["state"] == "expired")
    })
    .await;
    assert!(killed.elapsed() <= Duration::from_secs(LEASE_S + 2), "lapsed {:?} after the kill", killed.elapsed());
    drop(am);
    scene.end().await;
}

/// Prometheus as an alert gate's source: its firing alerts, labels as its rules give them,
/// pending ones left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Prometheus: ICHOR_TEST_PROMETHEUS (bash scripts/monitoring.sh build, then env)"]
async fn prometheus_firing_alerts_are_read_and_pending_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let rules = "groups:\n  - name: test\n    rules:\n\
                 \x20     - alert: DiskFull\n        expr: vector(1)\n        labels: { severity: critical, node: ingress-7 }\n\
                 \x20     - alert: Slow\n        expr: vector(1)\n        for: 1h\n        labels: { severity: warning }\n";
    std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
    let config =
        format!("global:\n  evaluation_interval: 1s\nrule_files:\n  - {}\n", dir.path().join("rules.yml").display());
    let prometheus = Peer::prometheus(dir.path(), &config).await;
    let source = ichor_upgrade_core::gate::AlertSelector {
        prometheus: Some(format!("http://127.0.0.1:{}", prometheus.port)),
        ..Default::default()
    };
    let mut firing = Vec::new();
    for _ in 0..40 {
        firing = ichor_adapters::kubernetes::alerts::alerts(&source).await.unwrap();
        if !firing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(firing.len(), 1, "{firing:?}");
    assert_eq!(firing[0].labels.get("alertname").map(String::as_str), Some("DiskFull"));
    assert_eq!(firing[0].labels.get("node").map(String::as_str), Some("ingress-7"));
    assert!(!firing[0].since.is_empty());
    // Unreachable is a wait, never a pass.
    let gone = ichor_upgrade_core::gate::AlertSelector { prometheus: Some("http://127.0.0.1:9".into()), ..source };
    let err = ichor_adapters::kubernetes::alerts::alerts(&gone).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
}
