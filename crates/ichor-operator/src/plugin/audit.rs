//! `kubectl ichor audit CLUSTER`: the morning-after audit
//! ([`ichor_executor::reconcile::audit_cluster`]) run at any time, as a cron job would run
//! it the morning after. It is the plugin's one command that reaches the Talos API: with
//! the talosconfig of the cluster's own Secret, to read etcd. It carries no authority: its
//! clients sit behind a [`Fence`] that never leads, so a write it tried would not be sent;
//! the audit only reads.

use std::sync::Arc;
use std::time::Duration;

use ichor_adapters::clock::SystemClock;
use ichor_adapters::kubernetes::crd::TalosCluster;
use ichor_adapters::kubernetes::{Counters, KubeCluster, Stores};
use ichor_adapters::longhorn::LonghornStorage;
use ichor_adapters::talos::client::{ClientOptions, TalosClient};
use ichor_executor::calls::KubeCallError;
use ichor_executor::kube_api::KubeError;
use ichor_executor::{Executor, ExecutorConfig, report};
use ichor_upgrade_core::audit::Finding;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::Reporter;
use tokio::sync::watch;

use super::PluginError;
use crate::controller::talos_context;
use crate::fence::{Fence, FencedKube, FencedStorage, FencedTalos};

/// How long the plugin waits for its first lists of the namespace's objects and the Nodes.
const FIRST_LISTS: Duration = Duration::from_secs(30);

/// What the audit of one cluster found, and what it held the cluster to.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Audited {
    /// `NAMESPACE/NAME` of the TalosCluster.
    pub(super) cluster: String,
    /// The Talos version the cluster declares.
    pub(super) talos_version: String,
    /// The Kubernetes version the cluster declares.
    pub(super) kubernetes_version: String,
    /// Whether nothing was found.
    pub(super) clean: bool,
    /// What was found, each with its typed reason (`finding`).
    pub(super) findings: Vec<Finding>,
}

impl Audited {
    /// The report people read.
    #[must_use]
    pub(super) fn text(&self) -> String {
        let mut text = format!(
            "TalosCluster {}: audited against Talos {} and Kubernetes {} (the versions it declares)\n",
            self.cluster, self.talos_version, self.kubernetes_version
        );
        if self.findings.is_empty() {
            text.push_str(
                "clean: no Node left cordoned, no static pod crash-looping, every Node Ready on the target, etcd \
                 healthy with every member a voter and no alarm, no budget at zero\n",
            );
        } else {
            let n = self.findings.len();
            text.push_str(&format!("{n} finding{}:\n", if n == 1 { "" } else { "s" }));
            for finding in &self.findings {
                text.push_str(&format!("  {}: {finding}\n", finding.reason()));
            }
        }
        text
    }
}

/// The audit of TalosCluster `name` in `namespace`, now.
///
/// # Errors
/// [`PluginError::Failed`] when the cluster, its Secret or its talosconfig cannot be read,
/// or its machines cannot be listed: no audit is then reported (a read the audit itself
/// makes that fails is one of its findings).
pub(super) async fn audit(client: &Client, namespace: &str, name: &str) -> Result<Audited, PluginError> {
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), namespace);
    let cluster = clusters
        .get_opt(name)
        .await
        .map_err(|e| PluginError::Failed(format!("read TalosCluster {namespace}/{name}: {e}")))?
        .ok_or_else(|| PluginError::Failed(format!("TalosCluster {namespace}/{name} not found")))?;
    let secret_name = &cluster.spec.talosconfig_secret;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(secret_name)
        .await
        .map_err(|e| PluginError::Failed(format!("read Secret {namespace}/{secret_name} (talosconfigSecret): {e}")))?
        .ok_or_else(|| {
            PluginError::Failed(format!("Secret {namespace}/{secret_name} (talosconfigSecret) not found"))
        })?;
    let context = talos_context(&secret, namespace, secret_name).map_err(PluginError::Failed)?;
    let talos = TalosClient::new(&context, ClientOptions::default())
        .map_err(|e| PluginError::Failed(format!("Secret {namespace}/{secret_name}: {}", report(&e))))?;
    let stores = Stores::spawn(client, Some(namespace), FIRST_LISTS)
        .await
        .map_err(|e| PluginError::Failed(format!("list the namespace's TalosMachines and the Nodes: {e}")))?;
    let reporter = Reporter { controller: "kubectl-ichor".to_owned(), instance: None };
    let kube = KubeCluster::new(client.clone(), namespace, stores, reporter, Arc::new(Counters::default()));
    let storage = LonghornStorage::new(client.clone(), "longhorn-system");
    // A fence that never leads: the audit carries no authority to change anything.
    let (_never, leading) = watch::channel(None);
    let fence = Fence::new(leading);
    let config = ExecutorConfig::default();
    let ex = Executor {
        talos: &FencedTalos { inner: &talos, fence: &fence },
        kube: &FencedKube { inner: &kube, fence: &fence },
        storage: &FencedStorage { inner: &storage, fence: &fence },
        clock: &SystemClock,
        config: &config,
        snapshots: None,
        background: None,
    };
    let findings = ichor_executor::reconcile::audit_cluster(&ex, name).await.map_err(|e| match e {
        KubeCallError::Api(KubeError::NotFound(_)) => {
            PluginError::Failed(format!("TalosCluster {namespace}/{name} not found"))
        }
        e => PluginError::Failed(format!("read TalosCluster {namespace}/{name} and its machines: {}", report(&e))),
    })?;
    Ok(Audited {
        cluster: format!("{namespace}/{name}"),
        talos_version: cluster.spec.talos_version.clone(),
        kubernetes_version: cluster.spec.kubernetes_version.clone(),
        clean: findings.is_empty(),
        findings,
    })
}
