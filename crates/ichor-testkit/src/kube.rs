//! Tests against a real Kubernetes API server.
//!
//! Each is `#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG"]`: `cargo test`
//! lists it as ignored, and `cargo test -- --include-ignored` with `ICHOR_TEST_KUBECONFIG`
//! naming a kubeconfig (any real cluster; `bash .ci/run` starts kube-apiserver with
//! `scripts/kube-test-server.sh`) runs it. Run without a server, it fails saying so, never
//! passes. Each test works in a namespace of its own, deleted at the end; the CRDs are
//! applied once per server.

use std::path::PathBuf;
use std::time::Duration;

use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine, TalosOperation, TalosStorage};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt};

/// The variable naming the kubeconfig of the server the tests use.
pub const KUBECONFIG_VAR: &str = "ICHOR_TEST_KUBECONFIG";

/// The kubeconfig the tests use.
///
/// # Panics
/// When none is set: a test that needs a server is ignored unless asked for, and asked
/// for without one it fails, saying how to start one.
#[must_use]
pub fn kubeconfig() -> PathBuf {
    match std::env::var_os(KUBECONFIG_VAR) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "this test needs a Kubernetes API server: {KUBECONFIG_VAR}=<kubeconfig> is not set (start one with \
             `bash scripts/kube-test-server.sh start DIR` and export the line it prints; `bash .ci/run` does it all)"
        ),
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

/// An API server of a test's own (etcd and kube-apiserver only, on loopback), started by
/// `scripts/kube-test-server.sh start-apiserver` from the binaries the shared test server
/// runs, serving the API versions `runtime_config` names; stopped (by process id) when
/// dropped. For a server shaped unlike the shared one.
pub struct OwnApiServer {
    dir: PathBuf,
    /// Its kubeconfig (an admin's token).
    pub kubeconfig: PathBuf,
}

fn test_server_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kube-test-server.sh")
}

impl OwnApiServer {
    /// Starts one serving `runtime_config` (`--runtime-config`, such as
    /// `resource.k8s.io/v1=false`), in a directory of its own.
    ///
    /// # Panics
    /// When no shared test server is set (the binaries are built with it), or the server
    /// does not start.
    #[must_use]
    pub fn start(runtime_config: &str) -> Self {
        let _built = kubeconfig();
        let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("ichor-own-apiserver-{}-{unique}", std::process::id()));
        let server = Self { kubeconfig: dir.join("kubeconfig"), dir };
        let status = std::process::Command::new("bash")
            .arg(test_server_script())
            .args(["start-apiserver".as_ref(), server.dir.as_os_str(), runtime_config.as_ref()])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("bash runs");
        assert!(status.success(), "kube-test-server.sh start-apiserver {runtime_config}: {status}");
        server
    }
}

impl Drop for OwnApiServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(test_server_script())
            .args(["stop".as_ref(), self.dir.as_os_str()])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
    /// A fresh namespace `ichor-<prefix>-<n>` and the CRDs.
    ///
    /// # Panics
    /// When no server is set ([`kubeconfig`]), or the server refuses what a test needs.
    pub async fn create(prefix: &str) -> Self {
        Self::create_on(&kubeconfig(), prefix).await
    }

    /// As [`Self::create`], on the server of `kubeconfig` (one a test started itself).
    ///
    /// # Panics
    /// When the server refuses what a test needs.
    pub async fn create_on(kubeconfig: &std::path::Path, prefix: &str) -> Self {
        let kubeconfig = kubeconfig.to_path_buf();
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
        Self { client, name, kubeconfig }
    }

    /// Deletes the namespace (and so everything in it; the controller-manager finishes it).
    /// Its pods go first, at once: with no kubelet to confirm, a pod deleted gracefully
    /// would hold the namespace in Terminating for ever.
    pub async fn delete(self) {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.client.clone(), &self.name);
        pods.delete_collection(&DeleteParams::default().grace_period(0), &kube::api::ListParams::default()).await.ok();
        // A simulated fleet's Nodes (cluster-wide, labelled with the namespace), left by a
        // fleet that was killed rather than stopped.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let fleet = kube::api::ListParams::default().labels(&format!("{FLEET_LABEL}={}", self.name));
        nodes.delete_collection(&DeleteParams::default(), &fleet).await.ok();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = namespaces.delete(&self.name, &DeleteParams::default()).await {
            eprintln!("deleting namespace {}: {e}", self.name);
        }
    }
}

impl TestNamespace {
    /// A kubeconfig for the ServiceAccount `account` of this namespace (created when
    /// absent), written to `path`: see [`Self::service_account_kubeconfig_in`].
    ///
    /// # Panics
    /// When the server refuses the account or the token.
    pub async fn service_account_kubeconfig(&self, account: &str, path: &std::path::Path) -> PathBuf {
        self.service_account_kubeconfig_in(&self.name, account, path).await
    }

    /// A kubeconfig for the ServiceAccount `account` of `namespace` (created when absent),
    /// written to `path`: the test server's address and CA, and a token from the
    /// TokenRequest API (an hour), this namespace its default. What the account may do is
    /// the caller's binding.
    ///
    /// # Panics
    /// When the server refuses the account or the token.
    pub async fn service_account_kubeconfig_in(
        &self,
        namespace: &str,
        account: &str,
        path: &std::path::Path,
    ) -> PathBuf {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let object = ServiceAccount {
            metadata: ObjectMeta { name: Some(account.to_owned()), ..ObjectMeta::default() },
            ..ServiceAccount::default()
        };
        match accounts.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("ServiceAccount {account} refused: {e}"),
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() }),
            ..TokenRequest::default()
        };
        let token = accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .expect("a token for the ServiceAccount")
            .status
            .expect("the TokenRequest's status")
            .token
            .expect("a token in the TokenRequest's status");
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("the test kubeconfig reads");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("the test kubeconfig is usable");
        let mut cluster = format!("    server: {}\n", config.cluster_url);
        if config.accept_invalid_certs {
            cluster.push_str("    insecure-skip-tls-verify: true\n");
        }
        if let Some(roots) = &config.root_cert {
            let pems: String =
                roots.iter().map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.clone()))).collect();
            let data = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pems);
            cluster.push_str(&format!("    certificate-authority-data: {data}\n"));
        }
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n{cluster}users:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: {account}\n  context:\n    cluster: test\n    user: {account}\n    namespace: {}\ncurrent-context: {account}\n",
            self.name
        );
        std::fs::write(path, text).expect("the kubeconfig is written");
        path.to_owned()
    }
}

/// The label a simulated fleet puts on its Nodes, with its namespace (re-exported as
/// `ichor_sim::fleet::FLEET_LABEL`, whose fleet uses this kit).
pub const FLEET_LABEL: &str = "ichor.dev/simulated-fleet";

/// Applies the four CRDs (creating those missing, replacing those of another schema) and
/// waits until they are established.
///
/// # Panics
/// When the server refuses a CRD or does not establish it within a minute.
pub async fn apply_crds(client: &Client) {
    for crd in [TalosCluster::crd(), TalosMachine::crd(), TalosOperation::crd(), TalosStorage::crd()] {
        apply_crd(client, &crd).await;
    }
}

/// Longhorn's kinds that Ichor reads and writes (`longhorn.io/v1beta2`, namespaced), by
/// kind and plural.
pub const LONGHORN_KINDS: [(&str, &str); 4] =
    [("Node", "nodes"), ("Replica", "replicas"), ("Shard", "shards"), ("BackingImage", "backingimages")];

/// A stand-in for one of Longhorn's CRDs (Longhorn 1.12.1's manifests are not committed):
/// its group, version, names and scope, no status subresource (a test writes a status as
/// Longhorn's manager would), any content kept.
///
/// # Panics
/// Never: the object is fixed.
#[must_use]
pub fn longhorn_crd(kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{plural}.longhorn.io") },
        "spec": {
            "group": "longhorn.io",
            "scope": "Namespaced",
            "names": { "kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List") },
            "versions": [{
                "name": "v1beta2", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
            }]
        }
    }))
    .expect("a CRD")
}

/// Longhorn's kind `kind` (`plural`) in `namespace` (where a test tells Ichor Longhorn runs).
#[must_use]
pub fn longhorn_api(client: &Client, namespace: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("longhorn.io", "v1beta2", kind), plural);
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Applies the stand-ins of [`LONGHORN_KINDS`] and waits until they are established.
///
/// # Panics
/// As [`apply_crd`].
pub async fn apply_longhorn_crds(client: &Client) {
    for (kind, plural) in LONGHORN_KINDS {
        apply_crd(client, &longhorn_crd(kind, plural)).await;
    }
}

/// Applies one CRD (creating it when missing, replacing it when its schema differs) and
/// waits until it is established: Ichor's own, or another system's minimal stand-in that a
/// test brings (Longhorn's kinds).
///
/// # Panics
/// When the server refuses the CRD or does not establish it within a minute.
pub async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    match crds.create(&PostParams::default(), crd).await {
        Ok(_) => {}
        // There already (a server kept between runs): brought up to this build's schema.
        Err(kube::Error::Api(status)) if status.code == 409 => loop {
            let existing = crds.get(&name).await.expect("the CRD reads back");
            if existing.spec == crd.spec {
                break;
            }
            let mut updated = crd.clone();
            updated.metadata.resource_version = existing.metadata.resource_version;
            match crds.replace(&name, &PostParams::default(), &updated).await {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => panic!("CRD {name} refused: {e}"),
            }
        },
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
    // Established is not yet served: the server's cache of the new kind answers 429
    // ("storage is (re)initializing") for a moment after, more so on a loaded machine.
    let spec = &crd.spec;
    let version = spec.versions.iter().find(|v| v.served).map(|v| v.name.clone()).unwrap_or_default();
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(&spec.group, &version, &spec.names.kind),
        &spec.names.plural,
    );
    let objects: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    let served = async {
        while objects.list(&kube::api::ListParams::default().limit(1)).await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), served).await.expect("the CRD's kind is served");
}
