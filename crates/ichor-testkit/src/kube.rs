//! Tests against a real Kubernetes API server.
//!
//! They run whenever `ICHOR_TEST_KUBECONFIG` names a kubeconfig (any real cluster; CI
//! starts kube-apiserver with `scripts/kube-test-server.sh`), and otherwise print one line
//! saying they were skipped and how to run them. Each test works in a namespace of its own,
//! deleted at the end; the CRDs are applied once per server.

use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine, TalosOperation, TalosStorage};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt};

/// The variable naming the kubeconfig of the server the tests use.
pub const KUBECONFIG_VAR: &str = "ICHOR_TEST_KUBECONFIG";

static SKIPPED: Once = Once::new();

/// The kubeconfig the tests use, or `None` (saying so once) when none is set.
#[must_use]
pub fn kubeconfig() -> Option<PathBuf> {
    match std::env::var_os(KUBECONFIG_VAR) {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            SKIPPED.call_once(|| {
                // Straight to the process's stderr: the test harness captures eprintln!.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: the tests against a real Kubernetes API server need {KUBECONFIG_VAR}=<kubeconfig> \
                     (start one with `bash scripts/kube-test-server.sh start DIR`; `bash .ci/run` does it all)"
                );
            });
            None
        }
    }
}

/// A client for the kubeconfig at `path`.
///
/// # Panics
/// When the kubeconfig does not load.
pub async fn client_for(path: &std::path::Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("the test kubeconfig reads");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("the test kubeconfig is usable");
    ichor_adapters::kubernetes::client(config).expect("a client")
}

/// A namespace of its own on the test server, with Ichor's CRDs applied.
pub struct TestNamespace {
    /// The client.
    pub client: Client,
    /// The namespace.
    pub name: String,
    /// The kubeconfig.
    pub kubeconfig: PathBuf,
}

impl TestNamespace {
    /// A fresh namespace `ichor-<prefix>-<n>` and the CRDs, or `None` when no server is set.
    ///
    /// # Panics
    /// When the server refuses what a test needs.
    pub async fn create(prefix: &str) -> Option<Self> {
        let kubeconfig = kubeconfig()?;
        let client = client_for(&kubeconfig).await;
        apply_crds(&client).await;
        let suffix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let name = format!("ichor-{prefix}-{:x}", suffix % 0xff_ffff_ffff);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
            ..Namespace::default()
        };
        namespaces.create(&PostParams::default(), &namespace).await.expect("a test namespace");
        Some(Self { client, name, kubeconfig })
    }

    /// Deletes the namespace (and so everything in it; the controller-manager finishes it).
    /// Its pods go first, at once: with no kubelet to confirm, a pod deleted gracefully
    /// would hold the namespace in Terminating for ever.
    pub async fn delete(self) {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.client.clone(), &self.name);
        pods.delete_collection(&DeleteParams::default().grace_period(0), &kube::api::ListParams::default()).await.ok();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = namespaces.delete(&self.name, &DeleteParams::default()).await {
            eprintln!("deleting namespace {}: {e}", self.name);
        }
    }
}

/// Applies the four CRDs (creating those missing) and waits until they are established.
///
/// # Panics
/// When the server refuses a CRD or does not establish it within a minute.
pub async fn apply_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [TalosCluster::crd(), TalosMachine::crd(), TalosOperation::crd(), TalosStorage::crd()] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("CRD {name} refused: {e}"),
        }
        let established = async {
            loop {
                let crd = crds.get(&name).await.expect("the CRD reads back");
                let ok = crd
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
                if ok {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), established).await.expect("the CRD is established");
    }
}
