//! A storage backend for Longhorn, through its custom resources (`longhorn.io/v1beta2`).
//!
//! | `StorageApi` | Longhorn request |
//! | --- | --- |
//! | `storage_objects` | `GET /apis/ichor.dev/v1alpha1/talosstorages` (Ichor's own CRD; `spec.nodeSelector`) |
//! | `set_scheduling(n, false)` | `PATCH .../nodes/<n>` merge patch `{"spec":{"allowScheduling":false}}` |
//! | `request_evacuation(n)` | `PATCH .../nodes/<n>` `{"spec":{"allowScheduling":false,"evictionRequested":true}}` |
//! | `set_scheduling(n, true)` | `PATCH .../nodes/<n>` `{"spec":{"allowScheduling":true,"evictionRequested":false}}` |
//! | `replicas_on(n)` | `GET .../replicas?labelSelector=longhornnode=<n>`, every item counted |
//!
//! Longhorn's admission webhook refuses a Node with eviction requested and scheduling
//! allowed, so re-enabling scheduling also clears the eviction request in the same patch.
//! Every replica labelled with the node counts, whatever its state: a failed or stopped
//! replica still holds data on the node. `docs/storage-longhorn.md` has the details and the
//! RBAC an operator grants.

use async_trait::async_trait;
use ichor_storage::{LabelSelector, StorageApi, StorageError, StorageObject};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::json;

/// The namespace Longhorn runs in by default.
pub const DEFAULT_NAMESPACE: &str = "longhorn-system";

/// The label Longhorn puts on every replica with the name of its node.
pub const REPLICA_NODE_LABEL: &str = "longhornnode";

/// Longhorn, reached through the Kubernetes API.
#[derive(Clone)]
pub struct LonghornStorage {
    nodes: Api<DynamicObject>,
    replicas: Api<DynamicObject>,
    talos_storages: Api<DynamicObject>,
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

impl LonghornStorage {
    /// Longhorn in `namespace` (usually [`DEFAULT_NAMESPACE`]), with the cluster's
    /// `TalosStorage` objects read through the same client.
    #[must_use]
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        let node = resource("longhorn.io", "v1beta2", "Node", "nodes");
        let replica = resource("longhorn.io", "v1beta2", "Replica", "replicas");
        let talos_storage = resource("ichor.dev", "v1alpha1", "TalosStorage", "talosstorages");
        Self {
            nodes: Api::namespaced_with(client.clone(), namespace, &node),
            replicas: Api::namespaced_with(client.clone(), namespace, &replica),
            talos_storages: Api::all_with(client, &talos_storage),
        }
    }

    async fn patch_node(&self, node: &str, spec: serde_json::Value) -> Result<(), kube::Error> {
        let patch = json!({ "spec": spec });
        self.nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
    }
}

/// Maps a Kubernetes API error: unreachable, throttled, a conflict or a server error is
/// transient; anything else (forbidden, invalid, not found) is a failure.
fn storage_error(what: &str, error: &kube::Error) -> StorageError {
    let transient = match error {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599),
        _ => true,
    };
    StorageError { message: format!("Longhorn {what}: {error}"), transient }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

#[async_trait]
impl StorageApi for LonghornStorage {
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
        let list = self
            .talos_storages
            .list(&ListParams::default())
            .await
            .map_err(|e| storage_error("list TalosStorage", &e))?;
        list.items
            .into_iter()
            .map(|object| {
                let name = object.metadata.name.clone().unwrap_or_default();
                let selector = object.data.get("spec").and_then(|spec| spec.get("nodeSelector")).cloned();
                let node_selector: LabelSelector = match selector {
                    Some(value) => serde_json::from_value(value).map_err(|e| {
                        StorageError::failure(format!("TalosStorage {name}: spec.nodeSelector does not parse: {e}"))
                    })?,
                    None => LabelSelector::default(),
                };
                Ok(StorageObject { name, node_selector })
            })
            .collect()
    }

    async fn set_scheduling(&self, node: &str, enabled: bool) -> Result<(), StorageError> {
        let spec = if enabled {
            json!({ "allowScheduling": true, "evictionRequested": false })
        } else {
            json!({ "allowScheduling": false })
        };
        match self.patch_node(node, spec).await {
            Ok(()) => Ok(()),
            // Re-enabling on a node Longhorn no longer knows (removed) has nothing to do.
            Err(e) if enabled && is_not_found(&e) => Ok(()),
            Err(e) => Err(storage_error("set scheduling", &e)),
        }
    }

    async fn request_evacuation(&self, node: &str) -> Result<(), StorageError> {
        self.patch_node(node, json!({ "allowScheduling": false, "evictionRequested": true }))
            .await
            .map_err(|e| storage_error("request eviction", &e))
    }

    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError> {
        let params = ListParams::default().labels(&format!("{REPLICA_NODE_LABEL}={node}"));
        let list = self.replicas.list(&params).await.map_err(|e| storage_error("list replicas", &e))?;
        Ok(u32::try_from(list.items.len()).unwrap_or(u32::MAX))
    }
}
