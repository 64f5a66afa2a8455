//! `LonghornStorage` against a real Kubernetes API server (`ICHOR_TEST_KUBECONFIG`; skipped
//! with one line without it) serving Longhorn's kinds. Longhorn's own CRD manifests are not
//! committed: the test applies minimal stand-ins with the group, version, kinds, plurals
//! and scope of Longhorn 1.12.1's (`longhorn.io/v1beta2`, namespaced; no status
//! subresource, so that a test writes a status as Longhorn's manager would), whose schema keeps
//! whatever is written. Each test works in a namespace of its own.

use std::time::Duration;

use ichor_adapters::longhorn::{
    EVACUATION_ANNOTATION, EVACUATION_BYTES_ANNOTATION, FIELD_MANAGER, LonghornStorage, REPLICA_NODE_LABEL,
};
use ichor_storage::{EvacuationRequest, StorageReads};
use ichor_testkit::kube::{TestNamespace, apply_longhorn_crds, longhorn_api};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

const BOUND: Duration = Duration::from_secs(60);

async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future).await.expect("the test's own bound")
}

/// A namespace of its own, with Longhorn's Node, Replica, Shard and BackingImage kinds served.
async fn longhorn_namespace(prefix: &str) -> TestNamespace {
    let ns = TestNamespace::create(prefix).await;
    bounded(apply_longhorn_crds(&ns.client)).await;
    ns
}

fn api(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    longhorn_api(&ns.client, &ns.name, kind, plural)
}

async fn create(api: &Api<DynamicObject>, object: Value) {
    let object: DynamicObject = serde_json::from_value(object).expect("an object");
    bounded(api.create(&PostParams::default(), &object)).await.expect("created");
}

/// A Longhorn Node as the manager creates it: scheduling on, no eviction.
async fn create_node(ns: &TestNamespace, name: &str) {
    let node = json!({
        "apiVersion": "longhorn.io/v1beta2", "kind": "Node",
        "metadata": { "name": name },
        "spec": { "name": name, "allowScheduling": true, "evictionRequested": false, "disks": {} }
    });
    create(&api(ns, "Node", "nodes"), node).await;
}

/// `(allowScheduling, evictionRequested)` of Longhorn Node `name`, and its field managers.
async fn node_spec(ns: &TestNamespace, name: &str) -> ((bool, bool), Vec<String>) {
    let node = bounded(api(ns, "Node", "nodes").get(name)).await.expect("the node reads");
    let spec = &node.data["spec"];
    let flag = |key: &str| spec[key].as_bool().unwrap_or_else(|| panic!("spec.{key} is a bool: {spec}"));
    let managers = node.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|f| f.manager).collect();
    ((flag("allowScheduling"), flag("evictionRequested")), managers)
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_an_evacuation_and_its_end_patch_the_node_as_ichor() {
    let ns = longhorn_namespace("lh-evac").await;
    create_node(&ns, "worker-1").await;
    let storage = LonghornStorage::new(ns.client.clone(), &ns.name);

    let request = bounded(storage.request_evacuation("worker-1", Timestamp::EPOCH)).await.unwrap();
    assert_eq!(request, EvacuationRequest::Requested { before: Scheduling::ON });
    let (spec, managers) = node_spec(&ns, "worker-1").await;
    assert_eq!(spec, (false, true), "scheduling off and eviction requested, in one patch");
    assert!(managers.iter().any(|m| m == FIELD_MANAGER), "the patch's field manager is ichor: {managers:?}");

    bounded(storage.set_scheduling("worker-1", true)).await.unwrap();
    assert_eq!(node_spec(&ns, "worker-1").await.0, (true, false), "scheduling on, the eviction request cleared");
    bounded(storage.set_scheduling("worker-1", false)).await.unwrap();
    assert_eq!(node_spec(&ns, "worker-1").await.0, (false, false));
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_an_evacuation_puts_back_the_scheduling_an_operator_had_set() {
    let ns = longhorn_namespace("lh-prior").await;
    create_node(&ns, "worker-1").await;
    let nodes = api(&ns, "Node", "nodes");
    // An operator makes the node unschedulable by hand.
    let by_hand = json!({ "spec": { "allowScheduling": false } });
    let params = kube::api::PatchParams { field_manager: Some("kubectl".into()), ..Default::default() };
    bounded(nodes.patch("worker-1", &params, &kube::api::Patch::Merge(&by_hand))).await.unwrap();
    // Two replicas on it, of 20 GiB and 5 GiB volumes (sizes as Longhorn writes them),
    // and one elsewhere.
    let replicas = api(&ns, "Replica", "replicas");
    for (name, node, size) in [
        ("pvc-a-r-1", "worker-1", "21474836480"),
        ("pvc-b-r-1", "worker-1", "5368709120"),
        ("pvc-a-r-2", "worker-2", "1"),
    ] {
        let replica = json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
            "metadata": { "name": name, "labels": { REPLICA_NODE_LABEL: node } },
            "spec": { "nodeID": node, "volumeSize": size }
        });
        create(&replicas, replica).await;
    }
    let storage = LonghornStorage::new(ns.client.clone(), &ns.name);
    let before = Scheduling { allowed: false, eviction_requested: false };
    let (first, again) =
        (Timestamp::from_unix_millis(1_764_640_000_000), Timestamp::from_unix_millis(1_764_640_060_000));
    let request = bounded(storage.request_evacuation("worker-1", first)).await.unwrap();
    assert_eq!(request, EvacuationRequest::Requested { before });
    // Asked again, as a pass after a crash would: the state from before the first request,
    // not the engine's own, and the first request's time.
    let request = bounded(storage.request_evacuation("worker-1", again)).await.unwrap();
    assert_eq!(request, EvacuationRequest::Requested { before });
    assert_eq!(node_spec(&ns, "worker-1").await.0, (false, true));
    let record = bounded(storage.evacuation_record("worker-1")).await.unwrap();
    let bytes = Some(26_843_545_600);
    assert_eq!(
        record,
        Some(EvacuationRecord { before, since: Some(first), bytes }),
        "the record, as the server keeps it"
    );
    bounded(storage.restore_scheduling("worker-1", before)).await.unwrap();
    assert_eq!(node_spec(&ns, "worker-1").await.0, (false, false), "still unschedulable, as the operator left it");
    let node = bounded(nodes.get("worker-1")).await.unwrap();
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(EVACUATION_ANNOTATION), "the record is gone: {annotations:?}");
    assert!(!annotations.contains_key(EVACUATION_BYTES_ANNOTATION), "its bytes too: {annotations:?}");
    assert_eq!(bounded(storage.evacuation_record("worker-1")).await.unwrap(), None);
    assert_eq!(bounded(storage.evacuation_record("no-such-node")).await.unwrap(), None);
    // The next evacuation reads the node afresh.
    let request = bounded(storage.request_evacuation("worker-1", again)).await.unwrap();
    assert_eq!(request, EvacuationRequest::Requested { before });
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_replicas_and_shards_left_on_a_node_are_all_counted() {
    let ns = longhorn_namespace("lh-count").await;
    let storage = LonghornStorage::new(ns.client.clone(), &ns.name);
    let labelled = |kind: &str, name: &str, node: &str, state: &str| {
        json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": kind,
            "metadata": { "name": name, "labels": { REPLICA_NODE_LABEL: node } },
            "spec": { "nodeID": node }, "status": { "currentState": state, "state": state }
        })
    };
    let replicas = api(&ns, "Replica", "replicas");
    let shards = api(&ns, "Shard", "shards");
    assert_eq!(bounded(storage.replicas_on("worker-1")).await.unwrap(), 0, "nothing on the node yet");
    create(&replicas, labelled("Replica", "pvc-a-r-1", "worker-1", "running")).await;
    create(&replicas, labelled("Replica", "pvc-b-r-1", "worker-1", "error")).await;
    create(&replicas, labelled("Replica", "pvc-a-r-2", "worker-2", "running")).await;
    assert_eq!(bounded(storage.replicas_on("worker-1")).await.unwrap(), 2, "a failed replica counts");
    // Longhorn 1.12.1's v2 sharding: a shard holds data on the node as a replica does.
    create(&shards, labelled("Shard", "sg-a-0", "worker-1", "normal")).await;
    assert_eq!(bounded(storage.replicas_on("worker-1")).await.unwrap(), 3, "the shard counts");
    for name in ["pvc-a-r-1", "pvc-b-r-1"] {
        bounded(replicas.delete(name, &Default::default())).await.unwrap();
    }
    assert_eq!(bounded(storage.replicas_on("worker-1")).await.unwrap(), 1, "its last replica gone, a shard left");
    bounded(shards.delete("sg-a-0", &Default::default())).await.unwrap();
    assert_eq!(bounded(storage.replicas_on("worker-1")).await.unwrap(), 0);
    assert_eq!(bounded(storage.replicas_on("worker-2")).await.unwrap(), 1);
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_the_bytes_on_each_node_come_from_one_list_of_the_replicas_sizes() {
    let ns = longhorn_namespace("lh-bytes").await;
    let storage = LonghornStorage::new(ns.client.clone(), &ns.name);
    assert!(bounded(storage.bytes_by_node()).await.unwrap().is_empty(), "no replica, no node");
    let replicas = api(&ns, "Replica", "replicas");
    for (name, node, size) in [
        ("pvc-a-r-1", "worker-1", json!("21474836480")),
        ("pvc-b-r-1", "worker-1", json!(5_368_709_120_u64)),
        ("pvc-a-r-2", "worker-2", json!("1073741824")),
        ("pvc-c-r-2", "worker-2", json!("unknown")),
        ("pvc-a-r-3", "worker-3", json!("1073741824")),
    ] {
        let replica = json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
            "metadata": { "name": name, "labels": { REPLICA_NODE_LABEL: node } },
            "spec": { "nodeID": node, "volumeSize": size }
        });
        create(&replicas, replica).await;
    }
    let bytes = bounded(storage.bytes_by_node()).await.unwrap();
    let expected = [
        ("worker-1".to_owned(), Some(26_843_545_600)),
        ("worker-2".to_owned(), None),
        ("worker-3".to_owned(), Some(1_073_741_824)),
    ];
    assert_eq!(bytes, expected.into(), "a size that does not read leaves its node's bytes unsaid");
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_only_a_404_for_that_node_counts_as_gone() {
    let ns = longhorn_namespace("lh-gone").await;
    let storage = LonghornStorage::new(ns.client.clone(), &ns.name);
    // The real server's 404 for a Node that is not there names it: re-enabling is done.
    bounded(storage.set_scheduling("removed", true)).await.unwrap();
    // Evacuating it has nothing to do, and says so.
    assert_eq!(
        bounded(storage.request_evacuation("removed", Timestamp::EPOCH)).await.unwrap(),
        EvacuationRequest::NoSuchNode
    );
    bounded(storage.restore_scheduling("removed", Scheduling::ON)).await.unwrap();
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_errors_without_an_answer_are_classified_not_all_transient() {
    let ns = longhorn_namespace("lh-tls").await;
    // The test server's address, reached without trusting its certificate authority.
    let kubeconfig = kube::config::Kubeconfig::read_from(&ns.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    if config.accept_invalid_certs {
        eprintln!("the test server's kubeconfig skips TLS verification: nothing to check");
        ns.delete().await;
        return;
    }
    config.root_cert = None;
    let untrusting = kube::Client::try_from(config.clone()).unwrap();
    let err = bounded(LonghornStorage::new(untrusting, &ns.name).replicas_on("worker-1")).await.unwrap_err();
    assert!(!err.transient, "a server the client does not trust is not an outage: {err}");
    // A port on loopback where nothing listens: an outage, transient.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    let nowhere = kube::Client::try_from(config).unwrap();
    let err = bounded(LonghornStorage::new(nowhere, &ns.name).replicas_on("worker-1")).await.unwrap_err();
    assert!(err.transient, "connection refused is transient: {err}");
    ns.delete().await;
}

// Issue 17: a removal wipes the node's disks; Longhorn's backing images whose copy is on
// them were not waited for.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn longhorn_backing_images_with_a_file_on_the_nodes_disks_are_counted() {
    let ns = longhorn_namespace("lh-bi").await;
    let storage = LonghornStorage::new(ns.client.clone(), &ns.name);
    let node = json!({
        "apiVersion": "longhorn.io/v1beta2", "kind": "Node",
        "metadata": { "name": "worker-1" },
        "spec": { "name": "worker-1", "allowScheduling": false, "evictionRequested": true,
                  "disks": { "default": {}, "ssd": {} } },
        "status": { "diskStatus": { "default": { "diskUUID": "uuid-w1-a" }, "ssd": { "diskUUID": "uuid-w1-b" } } }
    });
    create(&api(&ns, "Node", "nodes"), node).await;
    assert_eq!(bounded(storage.backing_images_on("worker-1")).await.unwrap(), 0, "no backing image yet");
    let image = |name: &str, status_disks: &[&str], spec_disks: &[&str]| {
        let files = |disks: &[&str]| {
            disks.iter().map(|d| ((*d).to_owned(), json!({ "state": "ready" }))).collect::<serde_json::Map<_, _>>()
        };
        json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": "BackingImage", "metadata": { "name": name },
            "spec": { "diskFileSpecMap": files(spec_disks) }, "status": { "diskFileStatusMap": files(status_disks) }
        })
    };
    let images = api(&ns, "BackingImage", "backingimages");
    // Only on worker-1's disk: would be lost.
    create(&images, image("ubuntu", &["uuid-w1-a"], &["uuid-w1-a"])).await;
    // On worker-1 and elsewhere: still a file on the disk being wiped.
    create(&images, image("debian", &["uuid-w1-b", "uuid-w2-a"], &["uuid-w2-a"])).await;
    // Being copied there (spec only).
    create(&images, image("fedora", &["uuid-w2-a"], &["uuid-w2-a", "uuid-w1-a"])).await;
    // Elsewhere only.
    create(&images, image("alpine", &["uuid-w2-a"], &["uuid-w2-a"])).await;
    assert_eq!(bounded(storage.backing_images_on("worker-1")).await.unwrap(), 3);
    // A node Longhorn does not have has none.
    assert_eq!(bounded(storage.backing_images_on("worker-9")).await.unwrap(), 0);
    ns.delete().await;
}
