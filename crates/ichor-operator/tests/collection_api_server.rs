//! The collection of old operations on a real API server (`ICHOR_TEST_KUBECONFIG`): it
//! deletes an operation only as it was read.

use ichor_adapters::kubernetes::crd::{TalosOperation, TalosOperationSpec};
use ichor_operator::controller::delete_as_read;
use ichor_testkit::kube::TestNamespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

fn operation(name: &str) -> TalosOperation {
    TalosOperation::new(
        name,
        TalosOperationSpec {
            cluster: "prod".into(),
            kind: "talos".into(),
            target_version: "v1.14.4".into(),
            max_unavailable: 1.into(),
            maintenance: None,
            gates: None,
            machine: None,
            preflight: None,
            etcd_snapshot: None,
            dry_run: false,
            allow_two_control_planes: false,
        },
    )
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn an_old_operation_is_deleted_only_as_it_was_read() {
    let ns = TestNamespace::create("collect").await;
    let ops: Api<TalosOperation> = Api::namespaced(ns.client.clone(), &ns.name);
    let read = ops.create(&PostParams::default(), &operation("talos-v1.14.4")).await.unwrap();

    // Changed since it was read (a person's annotation): kept.
    let note = serde_json::json!({ "metadata": { "annotations": { "ichor.dev/hold": "keep it" } } });
    let changed = ops.patch("talos-v1.14.4", &PatchParams::default(), &Patch::Merge(&note)).await.unwrap();
    assert!(!delete_as_read(&ops, &read).await.unwrap(), "a stale reading deleted it");
    assert!(ops.get_opt("talos-v1.14.4").await.unwrap().is_some());

    // Deleted and made again under the same name since: the namesake is kept.
    ops.delete("talos-v1.14.4", &DeleteParams::default()).await.unwrap();
    let namesake = ops.create(&PostParams::default(), &operation("talos-v1.14.4")).await.unwrap();
    assert_ne!(namesake.uid(), changed.uid());
    assert!(!delete_as_read(&ops, &changed).await.unwrap(), "the namesake was deleted");
    assert_eq!(ops.get_opt("talos-v1.14.4").await.unwrap().and_then(|o| o.uid()), namesake.uid());

    // As read now: deleted; again: gone already.
    assert!(delete_as_read(&ops, &namesake).await.unwrap());
    assert!(ops.get_opt("talos-v1.14.4").await.unwrap().is_none());
    assert!(!delete_as_read(&ops, &namesake).await.unwrap());
    ns.delete().await;
}
