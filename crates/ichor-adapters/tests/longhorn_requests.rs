//! The Longhorn backend's requests, checked on the wire against the shapes Longhorn's API
//! takes (method, path, content type, body, label selector), with the API server played
//! by a `tower_test` mock that answers as Kubernetes does.

use http::{Method, Request, Response, StatusCode};
use ichor_adapters::kubernetes::crds::CrdPresence;
use ichor_adapters::longhorn::{DEFAULT_NAMESPACE, LonghornCrds, LonghornStorage, NODES_CRD, SHARDS_CRD};
use ichor_storage::{EvacuationRequest, StorageReads};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{Handle, pair};

type Server = Handle<Request<Body>, Response<Body>>;

fn storage() -> (LonghornStorage, Server) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    (LonghornStorage::new(kube::Client::new(service, "default"), DEFAULT_NAMESPACE), handle)
}

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder().status(status).body(Body::from(serde_json::to_vec(body).unwrap())).unwrap()
}

fn longhorn_node(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "longhorn.io/v1beta2",
        "kind": "Node",
        "metadata": { "name": name, "namespace": DEFAULT_NAMESPACE, "resourceVersion": "2" },
        "spec": spec,
    })
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code })
}

/// Takes the next request, checks it is a merge patch of `node`, and returns its body.
async fn expect_patch(server: &mut Server, node: &str) -> (Value, tower_test::mock::SendResponse<Response<Body>>) {
    let (request, send) = server.next_request().await.expect("a request");
    assert_eq!(request.method(), Method::PATCH);
    assert_eq!(request.uri().path(), format!("/apis/longhorn.io/v1beta2/namespaces/longhorn-system/nodes/{node}"));
    assert_eq!(request.headers()["content-type"], "application/merge-patch+json");
    let query = request.uri().query().unwrap_or_default();
    assert!(query.contains("fieldManager=ichor"), "patches name their field manager: {query}");
    let body = request.into_body().collect_bytes().await.unwrap();
    (serde_json::from_slice(&body).unwrap(), send)
}

#[tokio::test]
async fn disabling_scheduling_patches_the_longhorn_node() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(body, json!({ "spec": { "allowScheduling": false } }));
        send.send_response(respond(StatusCode::OK, &longhorn_node("worker-1", body["spec"].clone())));
    });
    storage.set_scheduling("worker-1", false).await.unwrap();
    api.await.unwrap();
}

/// Takes the next request, checks it is a list of the replicas on `node` (by Longhorn's
/// label, whole objects: their sizes are read), and answers one replica per size.
async fn expect_replicas(server: &mut Server, node: &str, sizes: &[Value]) {
    let (request, send) = server.next_request().await.expect("a request");
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), "/apis/longhorn.io/v1beta2/namespaces/longhorn-system/replicas");
    let query = request.uri().query().unwrap_or_default();
    assert!(query.contains(&format!("labelSelector=longhornnode%3D{node}")), "{query}");
    assert!(!request.headers().get("accept").is_some_and(|a| a.to_str().unwrap().contains("PartialObjectMetadata")));
    let items: Vec<Value> = sizes
        .iter()
        .enumerate()
        .map(|(i, size)| {
            json!({ "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
                    "metadata": { "name": format!("pvc-{i}-r-{node}"), "labels": { "longhornnode": node } },
                    "spec": { "nodeID": node, "volumeSize": size } })
        })
        .collect();
    let list = json!({ "apiVersion": "longhorn.io/v1beta2", "kind": "ReplicaList",
                       "metadata": { "resourceVersion": "9" }, "items": items });
    send.send_response(respond(StatusCode::OK, &list));
}

/// Takes the next request, checks it is a GET of Longhorn Node `node`, and answers `body`.
async fn expect_get(server: &mut Server, node: &str, status: StatusCode, body: &Value) {
    let (request, send) = server.next_request().await.expect("a request");
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), format!("/apis/longhorn.io/v1beta2/namespaces/longhorn-system/nodes/{node}"));
    send.send_response(respond(status, body));
}

#[tokio::test]
async fn an_evacuation_is_an_eviction_request_with_scheduling_off_that_keeps_what_was_before() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        // An operator had turned scheduling off by hand.
        let node = longhorn_node("worker-1", json!({ "allowScheduling": false, "evictionRequested": false }));
        expect_get(&mut server, "worker-1", StatusCode::OK, &node).await;
        // What is on the node before anything moves: its replicas' sizes (Longhorn writes
        // them as strings of bytes).
        expect_replicas(&mut server, "worker-1", &[json!("10737418240"), json!(2_147_483_648_u64)]).await;
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(
            body,
            json!({
                "metadata": { "resourceVersion": "2",
                              "annotations": { "ichor.dev/evacuation": "allowScheduling=false,evictionRequested=false,since=1000",
                                               "ichor.dev/evacuation-bytes": "12884901888" } },
                "spec": { "allowScheduling": false, "evictionRequested": true }
            })
        );
        send.send_response(respond(StatusCode::OK, &longhorn_node("worker-1", body["spec"].clone())));
        // Asked again (a pass after a crash): what was kept is what was before, with no
        // second count of what is left.
        let mut node = longhorn_node("worker-1", json!({ "allowScheduling": false, "evictionRequested": true }));
        node["metadata"]["annotations"] = json!({
            "ichor.dev/evacuation": "allowScheduling=false,evictionRequested=false,since=1000",
            "ichor.dev/evacuation-bytes": "12884901888",
        });
        expect_get(&mut server, "worker-1", StatusCode::OK, &node).await;
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(
            body["metadata"]["annotations"],
            json!({ "ichor.dev/evacuation": "allowScheduling=false,evictionRequested=false,since=1000",
                    "ichor.dev/evacuation-bytes": "12884901888" }),
            "the first request's record, its time and bytes included"
        );
        send.send_response(respond(StatusCode::OK, &node));
        // The record is read back from the node.
        expect_get(&mut server, "worker-1", StatusCode::OK, &node).await;
        // Its end puts it back and forgets it.
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(
            body,
            json!({ "metadata": { "annotations": { "ichor.dev/evacuation": null, "ichor.dev/evacuation-bytes": null } },
                    "spec": { "allowScheduling": false, "evictionRequested": false } })
        );
        send.send_response(respond(StatusCode::OK, &longhorn_node("worker-1", body["spec"].clone())));
    });
    let before = Scheduling { allowed: false, eviction_requested: false };
    let (first, again) = (Timestamp::from_unix_millis(1000), Timestamp::from_unix_millis(9000));
    assert_eq!(storage.request_evacuation("worker-1", first).await.unwrap(), EvacuationRequest::Requested { before });
    assert_eq!(storage.request_evacuation("worker-1", again).await.unwrap(), EvacuationRequest::Requested { before });
    let record = storage.evacuation_record("worker-1").await.unwrap();
    assert_eq!(record, Some(EvacuationRecord { before, since: Some(first), bytes: Some(12_884_901_888) }));
    storage.restore_scheduling("worker-1", before).await.unwrap();
    api.await.unwrap();
}

#[tokio::test]
async fn a_replica_whose_size_does_not_read_leaves_the_bytes_unsaid_not_undercounted() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let node = longhorn_node("worker-1", json!({ "allowScheduling": true, "evictionRequested": false }));
        expect_get(&mut server, "worker-1", StatusCode::OK, &node).await;
        expect_replicas(&mut server, "worker-1", &[json!("10737418240"), json!("ten gigabytes")]).await;
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(body["metadata"]["annotations"]["ichor.dev/evacuation-bytes"], Value::Null, "{body}");
        assert_eq!(body["spec"], json!({ "allowScheduling": false, "evictionRequested": true }), "the request goes on");
        send.send_response(respond(StatusCode::OK, &longhorn_node("worker-1", body["spec"].clone())));
    });
    let request = storage.request_evacuation("worker-1", Timestamp::from_unix_millis(1000)).await.unwrap();
    assert_eq!(request, EvacuationRequest::Requested { before: Scheduling::ON });
    api.await.unwrap();
}

#[tokio::test]
async fn re_enabling_scheduling_clears_the_eviction_request_in_the_same_patch() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(body, json!({ "spec": { "allowScheduling": true, "evictionRequested": false } }));
        send.send_response(respond(StatusCode::OK, &longhorn_node("worker-1", body["spec"].clone())));
    });
    storage.set_scheduling("worker-1", true).await.unwrap();
    api.await.unwrap();
}

/// Answers the discovery of `longhorn.io/v1beta2` with these plurals.
async fn expect_discovery(server: &mut Server, plurals: &[&str]) {
    let (request, send) = server.next_request().await.expect("a request");
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), "/apis/longhorn.io/v1beta2");
    let resources: Vec<Value> = plurals
        .iter()
        .map(|p| json!({ "name": p, "singularName": "", "namespaced": true, "kind": "X", "verbs": ["get", "list"] }))
        .collect();
    let list = json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "longhorn.io/v1beta2", "resources": resources });
    send.send_response(respond(StatusCode::OK, &list));
}

/// Answers a metadata-only list of `plural` on worker-1 with objects in these states.
async fn expect_list(server: &mut Server, plural: &str, states: &[&str]) {
    let (request, send) = server.next_request().await.expect("a request");
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), format!("/apis/longhorn.io/v1beta2/namespaces/longhorn-system/{plural}"));
    let query = request.uri().query().unwrap_or_default();
    assert!(query.contains("labelSelector=longhornnode%3Dworker-1"), "{query}");
    let accept = request.headers()["accept"].to_str().unwrap().to_owned();
    assert!(accept.contains("as=PartialObjectMetadataList"), "metadata only: {accept}");
    let items: Vec<Value> = states
        .iter()
        .enumerate()
        .map(|(i, state)| {
            json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                    "metadata": { "name": format!("{plural}-{i}-{state}"), "namespace": DEFAULT_NAMESPACE,
                                  "labels": { "longhornnode": "worker-1" } } })
        })
        .collect();
    let list = json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": { "resourceVersion": "9" }, "items": items });
    send.send_response(respond(StatusCode::OK, &list));
}

#[tokio::test]
async fn replicas_are_counted_by_the_node_label_whatever_their_state() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        expect_list(&mut server, "replicas", &["running", "stopped", "error"]).await;
        // A Longhorn before 1.12.1: no shards.
        expect_discovery(&mut server, &["nodes", "replicas", "engines"]).await;
        // Discovery is asked once.
        expect_list(&mut server, "replicas", &[]).await;
    });
    assert_eq!(storage.replicas_on("worker-1").await.unwrap(), 3);
    assert_eq!(storage.replicas_on("worker-1").await.unwrap(), 0);
    api.await.unwrap();
}

#[tokio::test]
async fn where_longhorn_serves_shards_a_shard_left_counts_as_a_replica_left() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        expect_list(&mut server, "replicas", &[]).await;
        expect_discovery(&mut server, &["nodes", "replicas", "shards", "shardgroups"]).await;
        expect_list(&mut server, "shards", &["normal", "failed"]).await;
        expect_list(&mut server, "replicas", &[]).await;
        expect_list(&mut server, "shards", &[]).await;
    });
    assert_eq!(storage.replicas_on("worker-1").await.unwrap(), 2, "no replica, two shards: not evacuated");
    assert_eq!(storage.replicas_on("worker-1").await.unwrap(), 0);
    api.await.unwrap();
}

/// Issue 57 item 1: with Longhorn's Node CRD known absent, an evacuation's record and a
/// node's disks read as none with no request at all (the API server here answers none:
/// its handle is dropped, and any request would fail).
#[tokio::test]
async fn without_longhorns_node_crd_nothing_is_asked_per_machine() {
    let (storage, server) = storage();
    drop(server);
    let crds = LonghornCrds {
        nodes: CrdPresence::fixed(NODES_CRD, Some(false)),
        shards: CrdPresence::fixed(SHARDS_CRD, Some(false)),
    };
    let storage = storage.with_crds(crds);
    assert_eq!(storage.evacuation_record("worker-1").await.unwrap(), None);
    assert_eq!(storage.backing_images_on("worker-1").await.unwrap(), 0);
}

/// Issue 57 item 1: the shards' CRD decides whether shards are counted, with no discovery:
/// a Longhorn upgraded to 1.12.1 under a running operator has its shards counted as soon
/// as their CRD appears; and while the Node CRD's presence is unknown (the watch has not
/// listed), the record is asked of the API server as before.
#[tokio::test]
async fn the_shards_crd_decides_whether_shards_are_counted() {
    let (storage, mut server) = storage();
    let shards = CrdPresence::fixed(SHARDS_CRD, Some(true));
    let storage = storage.with_crds(LonghornCrds { nodes: CrdPresence::fixed(NODES_CRD, None), shards });
    let api = tokio::spawn(async move {
        expect_list(&mut server, "replicas", &["running"]).await;
        expect_list(&mut server, "shards", &["normal"]).await;
        let (request, send) = server.next_request().await.expect("a request");
        assert_eq!(request.uri().path(), "/apis/longhorn.io/v1beta2/namespaces/longhorn-system/nodes/worker-1");
        send.send_response(respond(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound", "nodes.longhorn.io \"worker-1\" not found"),
        ));
    });
    assert_eq!(storage.replicas_on("worker-1").await.unwrap(), 2, "a replica and a shard");
    assert_eq!(storage.evacuation_record("worker-1").await.unwrap(), None);
    api.await.unwrap();
}

#[tokio::test]
async fn talos_storage_objects_are_read_with_their_node_selectors() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (request, send) = server.next_request().await.expect("a request");
        assert_eq!(request.uri().path(), "/apis/ichor.dev/v1alpha1/talosstorages");
        let list = json!({ "apiVersion": "ichor.dev/v1alpha1", "kind": "TalosStorageList", "metadata": {},
            "items": [{ "apiVersion": "ichor.dev/v1alpha1", "kind": "TalosStorage", "metadata": { "name": "longhorn" },
                        "spec": { "nodeSelector": { "matchLabels": { "node.longhorn.io/create-default-disk": "true" } } } }] });
        send.send_response(respond(StatusCode::OK, &list));
    });
    let objects = storage.storage_objects().await.unwrap();
    api.await.unwrap();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].name, "longhorn");
    assert_eq!(objects[0].node_selector.match_labels["node.longhorn.io/create-default-disk"], "true");
}

#[tokio::test]
async fn errors_are_classified_transient_or_failure_by_status_code() {
    for (code, reason, transient) in [
        (500, "InternalError", true),
        (429, "TooManyRequests", true),
        (409, "Conflict", true),
        (403, "Forbidden", false),
        (422, "Invalid", false),
    ] {
        let (storage, mut server) = storage();
        let api = tokio::spawn(async move {
            let (_, send) = expect_patch(&mut server, "worker-1").await;
            send.send_response(respond(StatusCode::from_u16(code).unwrap(), &status(code, reason, "refused")));
        });
        let err = storage.set_scheduling("worker-1", false).await.unwrap_err();
        api.await.unwrap();
        assert_eq!(err.transient, transient, "{code}: {err}");
    }
}

#[tokio::test]
async fn the_webhooks_retry_later_is_transient_and_other_refusals_are_not() {
    let retry = "admission webhook \"validator.longhorn.io\" denied the request: spec and status of disks on node worker-1 are being syncing and please retry later.";
    let invalid = "admission webhook \"validator.longhorn.io\" denied the request: need to disable scheduling on node worker-1 for node eviction, or cancel eviction to enable scheduling on this node";
    for (code, reason, message, transient) in [
        (403, "Forbidden", retry, true),
        (422, "Invalid", invalid, false),
        (403, "Forbidden", "nodes.longhorn.io \"worker-1\" is forbidden: User \"ichor\" cannot patch resource", false),
    ] {
        let (storage, mut server) = storage();
        let api = tokio::spawn(async move {
            let (_, send) = expect_patch(&mut server, "worker-1").await;
            send.send_response(respond(StatusCode::from_u16(code).unwrap(), &status(code, reason, message)));
        });
        let err = storage.set_scheduling("worker-1", true).await.unwrap_err();
        api.await.unwrap();
        assert_eq!(err.transient, transient, "{code} {message}: {err}");
        assert!(err.message.contains("Longhorn Node worker-1"), "the error names the kind and object: {err}");
    }
}

#[tokio::test]
async fn errors_without_an_answer_are_transient_unless_they_are_tls() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (_, send) = server.next_request().await.expect("a request");
        send.send_error(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
        let (_, send) = server.next_request().await.expect("a request");
        send.send_error(std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        )));
    });
    let refused = storage.request_evacuation("worker-1", Timestamp::EPOCH).await.unwrap_err();
    assert!(refused.transient, "{refused}");
    let tls = storage.request_evacuation("worker-1", Timestamp::EPOCH).await.unwrap_err();
    assert!(!tls.transient, "a certificate the client does not trust is not an outage: {tls}");
    api.await.unwrap();
}

#[tokio::test]
async fn re_enabling_scheduling_on_a_node_longhorn_no_longer_knows_is_done() {
    let (storage, mut server) = storage();
    let not_found = |name: &str| {
        let mut s = status(404, "NotFound", &format!("nodes.longhorn.io \"{name}\" not found"));
        s["details"] = json!({ "name": name, "group": "longhorn.io", "kind": "nodes" });
        s
    };
    let api = tokio::spawn(async move {
        let (_, send) = expect_patch(&mut server, "gone").await;
        send.send_response(respond(StatusCode::NOT_FOUND, &not_found("gone")));
        expect_get(&mut server, "gone", StatusCode::NOT_FOUND, &not_found("gone")).await;
        // Longhorn's CRDs not installed: the server's plain 404, no Status.
        let (_, send) = expect_patch(&mut server, "worker-1").await;
        send.send_response(Response::builder().status(404).body(Body::from(b"404 page not found\n".to_vec())).unwrap());
        // A 404 about another object.
        let (_, send) = expect_patch(&mut server, "worker-1").await;
        send.send_response(respond(StatusCode::NOT_FOUND, &not_found("worker-2")));
    });
    storage.set_scheduling("gone", true).await.unwrap();
    assert_eq!(
        storage.request_evacuation("gone", Timestamp::EPOCH).await.unwrap(),
        EvacuationRequest::NoSuchNode,
        "a node Longhorn does not know has nothing to evacuate"
    );
    let err = storage.set_scheduling("worker-1", true).await.unwrap_err();
    assert!(!err.transient, "a missing CRD is not a node that is gone: {err}");
    storage.set_scheduling("worker-1", true).await.unwrap_err();
    api.await.unwrap();
}

// Decision 0011: the annotation is the evacuation's only record until the machine's
// conditions carry it, so reading it must neither invent one nor lose one.
#[tokio::test]
async fn the_evacuations_record_is_read_from_the_nodes_annotation_and_a_404_is_no_record() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let mut node = longhorn_node("worker-1", json!({ "allowScheduling": false, "evictionRequested": true }));
        node["metadata"]["annotations"] =
            json!({ "ichor.dev/evacuation": "allowScheduling=true,evictionRequested=false,since=42" });
        expect_get(&mut server, "worker-1", StatusCode::OK, &node).await;
        // No annotation: no evacuation of the engine's.
        let plain = longhorn_node("worker-1", json!({ "allowScheduling": true, "evictionRequested": false }));
        expect_get(&mut server, "worker-1", StatusCode::OK, &plain).await;
        // No Longhorn at all (its CRD not served): nothing can be recorded there.
        let (_, send) = server.next_request().await.expect("a request");
        send.send_response(Response::builder().status(404).body(Body::from(b"404 page not found\n".to_vec())).unwrap());
        // A record it did not write is a failure, not "none".
        node["metadata"]["annotations"] = json!({ "ichor.dev/evacuation": "allowScheduling=maybe" });
        expect_get(&mut server, "worker-1", StatusCode::OK, &node).await;
        // Forbidden (RBAC): a failure, never "no record".
        let (_, send) = server.next_request().await.expect("a request");
        send.send_response(respond(StatusCode::FORBIDDEN, &status(403, "Forbidden", "nodes.longhorn.io is forbidden")));
    });
    let record = storage.evacuation_record("worker-1").await.unwrap();
    let since = Some(Timestamp::from_unix_millis(42));
    assert_eq!(record, Some(EvacuationRecord { before: Scheduling::ON, since, bytes: None }));
    assert_eq!(storage.evacuation_record("worker-1").await.unwrap(), None);
    assert_eq!(storage.evacuation_record("worker-1").await.unwrap(), None);
    let err = storage.evacuation_record("worker-1").await.unwrap_err();
    assert!(!err.transient && err.message.contains("ichor.dev/evacuation"), "{err}");
    let err = storage.evacuation_record("worker-1").await.unwrap_err();
    assert!(!err.transient, "{err}");
    api.await.unwrap();
}
