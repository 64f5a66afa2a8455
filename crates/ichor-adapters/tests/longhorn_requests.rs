//! The Longhorn backend's requests, checked on the wire against the shapes Longhorn's API
//! takes (method, path, content type, body, label selector), with the API server played
//! by a `tower_test` mock that answers as Kubernetes does.

use http::{Method, Request, Response, StatusCode};
use ichor_adapters::longhorn::{DEFAULT_NAMESPACE, LonghornStorage};
use ichor_storage::StorageApi;
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

#[tokio::test]
async fn an_evacuation_is_an_eviction_request_with_scheduling_off() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (body, send) = expect_patch(&mut server, "worker-1").await;
        assert_eq!(body, json!({ "spec": { "allowScheduling": false, "evictionRequested": true } }));
        send.send_response(respond(StatusCode::OK, &longhorn_node("worker-1", body["spec"].clone())));
    });
    storage.request_evacuation("worker-1").await.unwrap();
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

#[tokio::test]
async fn replicas_are_counted_by_the_node_label_whatever_their_state() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (request, send) = server.next_request().await.expect("a request");
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri().path(), "/apis/longhorn.io/v1beta2/namespaces/longhorn-system/replicas");
        let query = request.uri().query().unwrap_or_default();
        assert!(query.contains("labelSelector=longhornnode%3Dworker-1"), "{query}");
        let replica = |name: &str, state: &str| {
            json!({ "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
                    "metadata": { "name": name, "namespace": DEFAULT_NAMESPACE, "labels": { "longhornnode": "worker-1" } },
                    "spec": { "nodeID": "worker-1" }, "status": { "currentState": state } })
        };
        let list = json!({ "apiVersion": "longhorn.io/v1beta2", "kind": "ReplicaList", "metadata": { "resourceVersion": "9" },
                           "items": [replica("pvc-a-r-1", "running"), replica("pvc-b-r-2", "stopped"), replica("pvc-c-r-3", "error")] });
        send.send_response(respond(StatusCode::OK, &list));
    });
    assert_eq!(storage.replicas_on("worker-1").await.unwrap(), 3);
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
        let err = storage.request_evacuation("worker-1").await.unwrap_err();
        api.await.unwrap();
        assert_eq!(err.transient, transient, "{code}: {err}");
    }
}

#[tokio::test]
async fn re_enabling_scheduling_on_a_node_longhorn_no_longer_knows_is_done() {
    let (storage, mut server) = storage();
    let api = tokio::spawn(async move {
        let (_, send) = expect_patch(&mut server, "gone").await;
        send.send_response(respond(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound", "nodes.longhorn.io \"gone\" not found"),
        ));
        let (_, send) = expect_patch(&mut server, "gone").await;
        send.send_response(respond(StatusCode::NOT_FOUND, &status(404, "NotFound", "not found")));
    });
    storage.set_scheduling("gone", true).await.unwrap();
    let err = storage.request_evacuation("gone").await.unwrap_err();
    assert!(!err.transient, "evacuating a node Longhorn does not know is a failure");
    api.await.unwrap();
}
