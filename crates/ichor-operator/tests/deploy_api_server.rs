//! The manifests in `deploy/` as a real API server takes them (`ICHOR_TEST_KUBECONFIG`;
//! skipped with one line without it): every object of `deploy/operator.yaml`,
//! `deploy/crds.yaml` and `deploy/examples/` is created with a server-side dry run, so a
//! field the server does not know, a sample the CRDs' schema refuses, or a role the RBAC
//! API rejects fails here.

use std::path::PathBuf;

use ichor_testkit::kube::TestNamespace;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::{Discovery, Scope};

fn documents(file: &str) -> Vec<serde_json::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    text.split("\n---\n")
        .map(|doc| doc.lines().filter(|l| !l.starts_with('#') && *l != "---").collect::<Vec<_>>().join("\n"))
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str(&doc).unwrap_or_else(|e| panic!("{file}: {e}")))
        .collect()
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn every_manifest_and_sample_is_accepted_by_the_api_server() {
    let ns = TestNamespace::create("deploy").await;
    let discovery = Discovery::new(ns.client.clone()).run().await.unwrap();
    let files = [
        "crds.yaml",
        "operator.yaml",
        "examples/cluster.yaml",
        "examples/upgrade.yaml",
        "examples/plan.yaml",
        "examples/remove.yaml",
        "examples/storage.yaml",
    ];
    let mut checked = 0;
    for file in files {
        for value in documents(file) {
            let mut object: DynamicObject = serde_json::from_value(value).unwrap();
            let types = object.types.clone().unwrap();
            let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
            let gvk = kube::api::GroupVersionKind::gvk(group, version, &types.kind);
            let (resource, capabilities) =
                discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{file}: the server does not serve {gvk:?}"));
            let api: Api<DynamicObject> = if capabilities.scope == Scope::Namespaced {
                object.metadata.namespace = Some(ns.name.clone());
                Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
            } else {
                Api::all_with(ns.client.clone(), &resource)
            };
            let params = PostParams { dry_run: true, ..PostParams::default() };
            match api.create(&params, &object).await {
                Ok(_) => {}
                // Cluster-scoped objects the tests already made (the CRDs, the role).
                Err(kube::Error::Api(status)) if status.code == 409 && capabilities.scope == Scope::Cluster => {}
                Err(e) => panic!("{file}: {} {:?} refused: {e}", types.kind, object.metadata.name),
            }
            checked += 1;
        }
    }
    assert!(checked >= 14, "{checked} objects");
    ns.delete().await;
}
