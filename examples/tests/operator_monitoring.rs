//! The operator's alert rules (`deploy/monitoring/ichor-rules.yaml`, issue 56 item 5)
//! loaded into a real Prometheus that scrapes a running operator, as the shipped scrape
//! job does (`honor_labels`): every rule evaluates, every metric the rules read is one the
//! operator exports with the labels they select on, and an operation that waits, then is
//! paused, makes the matching alerts pending, named by the operation's own namespace.
//! (`promtool test rules` tests when each alert fires: crates/ichor-operator/tests/monitoring.rs.)

use std::path::PathBuf;

use ichor_adapters::kubernetes::crd::TalosCluster;
use ichor_sim::fleet;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::kubectl_plugin::ok;
use crate::operator_e2e::{Scene, upgrade_calls};
use crate::support::eventually;
use crate::support::monitoring::Peer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server and Prometheus: ICHOR_TEST_KUBECONFIG, ICHOR_TEST_PROMETHEUS (bash .ci/run makes both)"]
async fn the_alert_rules_evaluate_on_what_a_running_operator_exports() {
    let scene = Scene::new("e2e-rules").await;
    let ns = scene.ns.name.clone();
    let both = scene.fleet("1+2", &[]);
    scene.fleet_up(3).await;
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/ichor-rules.yaml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n  - job_name: ichor-operator\n    honor_labels: true\n    \
         static_configs:\n      - targets: ['127.0.0.1:{}']\n        labels: {{ namespace: ichor-system }}\n",
        rules.canonicalize().unwrap().display(),
        both.port()
    );
    let prometheus = Peer::prometheus(scene.dir.path(), &config).await;

    // A gate that never holds: the first start waits, GateNotPassing.
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &ns);
    let gate = json!({ "spec": { "gates": [{
        "name": "approved",
        "objects": { "apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "absent" },
        "expression": "object.data.approved == 'yes'",
        "phase": "beforeOperation",
    }] } });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&gate)).await.unwrap();
    scene.create_operation("upgrade", "talos", None).await;

    let waiting = format!(
        "ALERTS{{alertname=\"IchorOperationStuckWaiting\",alertstate=\"pending\",namespace=\"{ns}\",operation=\"upgrade\",reason=\"GateNotPassing\"}}"
    );
    eventually("the waiting operation makes IchorOperationStuckWaiting pending", || async {
        prometheus.query(&waiting).await.len() == 1
    })
    .await;
    assert!(upgrade_calls(&both).await.is_empty());

    // Every rule evaluates without error, and each metric the rules read has series.
    let groups = prometheus.json("/api/v1/rules").await;
    let rules: Vec<&serde_json::Value> =
        groups["data"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    assert_eq!(rules.len(), 5, "{groups}");
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    for metric in ["ichor_operation_phase", "ichor_operation_machines", "ichor_leader"] {
        assert!(!prometheus.query(metric).await.is_empty(), "no series of {metric}");
    }
    let leader = prometheus.query("max by (namespace) (ichor_leader)").await;
    assert_eq!(leader.len(), 1, "{leader:?}");
    assert_eq!(leader[0]["metric"]["namespace"], "ichor-system", "{leader:?}");
    assert!(prometheus.query("ALERTS{alertname=\"IchorNoLeader\"}").await.is_empty(), "a replica leads");

    // Paused by a person: IchorOperationPaused, with its reason.
    ok(scene.admin(), &ns, &["pause", "upgrade"]);
    let paused = format!(
        "ALERTS{{alertname=\"IchorOperationPaused\",alertstate=\"pending\",namespace=\"{ns}\",operation=\"upgrade\",reason=\"PauseRequested\"}}"
    );
    eventually("the paused operation makes IchorOperationPaused pending", || async {
        prometheus.query(&paused).await.len() == 1
    })
    .await;
    drop(prometheus);
    scene.end().await;
}
