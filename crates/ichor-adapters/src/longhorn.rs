//! A storage backend for Longhorn, through its custom resources (`longhorn.io/v1beta2`).
//!
//! What is read ([`StorageReads`]):
//!
//! | Read | Longhorn request |
//! | --- | --- |
//! | `storage_objects` | `GET /apis/ichor.dev/v1alpha1/talosstorages` (Ichor's own CRD; `spec.nodeSelector`) |
//! | `evacuation_record(n)` | `GET .../nodes/<n>`: its `ichor.dev/evacuation` and `ichor.dev/evacuation-bytes` annotations (any 404: no record); none while `nodes.longhorn.io` is known absent ([`LonghornStorage::with_crds`]) |
//! | `backing_images_on(n)` (removal only) | `GET .../nodes/<n>` (its disks' `status.diskStatus.*.diskUUID`), `GET .../backingimages`: those with a file, or one to be, on those disks (`status.diskFileStatusMap`, `spec.diskFileSpecMap`, keyed by disk UUID) |
//! | `replicas_on(n)` | `GET .../replicas?labelSelector=longhornnode=<n>` and, where Longhorn serves shards (1.12.1 and later), `GET .../shards?labelSelector=longhornnode=<n>`, metadata only, every item counted |
//!
//! What is written, each [`StorageWrite`] through
//! [`StorageApi::write`](ichor_executor::StorageApi::write) (decision 0016), and
//! [`LonghornStorage::set_scheduling`], which the engine does not call:
//!
//! | Write | Longhorn request |
//! | --- | --- |
//! | `RequestEvacuation { node: n, since }` | `GET .../nodes/<n>`; unless it has a record, `GET .../replicas?labelSelector=longhornnode=<n>` (their `spec.volumeSize`); then `PATCH .../nodes/<n>` `{"metadata":{"resourceVersion":<read>,"annotations":{"ichor.dev/evacuation":<its scheduling and since>,"ichor.dev/evacuation-bytes":<bytes>}},"spec":{"allowScheduling":false,"evictionRequested":true}}` |
//! | `RestoreScheduling { node: n, before }` | `PATCH .../nodes/<n>` `{"metadata":{"annotations":{"ichor.dev/evacuation":null,"ichor.dev/evacuation-bytes":null}},"spec":{"allowScheduling":<before>,"evictionRequested":<before>}}` |
//! | `set_scheduling(n, false)` | `PATCH .../nodes/<n>` merge patch `{"spec":{"allowScheduling":false}}` |
//! | `set_scheduling(n, true)` | `PATCH .../nodes/<n>` `{"spec":{"allowScheduling":true,"evictionRequested":false}}` |
//!
//! Longhorn's admission webhook refuses a Node with eviction requested and scheduling
//! allowed, so re-enabling scheduling also clears the eviction request in the same patch.
//! Every replica and shard labelled with the node counts, whatever its state: a failed or
//! stopped one still holds data on the node, and node eviction moves shards as it moves
//! replicas. Patches carry the field manager [`FIELD_MANAGER`].
//!
//! Errors: an outage, a conflict, throttling, a server error and the webhook's 403 "please
//! retry later" (while a node's disks sync) are transient; TLS, credentials, a kubeconfig
//! that does not load and any other answer are failures ([`crate::kubernetes::errors`]).
//! Turning scheduling back on counts as done only on a 404 for that very Node object
//! (`reason: NotFound`, its name), never on a 404 of a missing CRD. `docs/storage-longhorn.md`
//! has the details and the RBAC an operator grants.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use ichor_executor::writes::{Seal, StorageWrite, StorageWritten};
use ichor_storage::{EvacuationRequest, LabelSelector, StorageError, StorageObject, StorageReads};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::kubernetes::ListedStore;
use crate::kubernetes::crd::TalosStorage;
use crate::kubernetes::crds::CrdPresence;
use crate::kubernetes::errors::kube_error;

/// The namespace Longhorn runs in by default.
pub const DEFAULT_NAMESPACE: &str = "longhorn-system";

/// The label Longhorn puts on every replica and shard with the name of its node.
pub const REPLICA_NODE_LABEL: &str = "longhornnode";

/// The field manager of every write to Longhorn's objects.
pub const FIELD_MANAGER: &str = "ichor";

/// The annotation of a Longhorn Node that records the engine's evacuation of it: the
/// node's scheduling from before and when it was asked for
/// (`allowScheduling=<bool>,evictionRequested=<bool>,since=<Unix milliseconds>`). Written
/// in the patch that requests the eviction and removed by the one that puts the
/// scheduling back, so it is atomic with both; a repeated request (after a crash) keeps the
/// first record. It is the evacuation's only record until the machine's conditions carry
/// it (decision 0011).
pub const EVACUATION_ANNOTATION: &str = "ichor.dev/evacuation";

/// The annotation beside [`EVACUATION_ANNOTATION`], written and removed with it, that
/// keeps the bytes on the node when the evacuation was first asked for: the sum of the
/// `spec.volumeSize` of the replicas there (nominal sizes: a thin volume's data may be
/// less; shards are not counted). Absent when a replica's size did not read. An
/// annotation of its own, so that an operator of an earlier version, which reads the
/// first strictly, still reads it.
pub const EVACUATION_BYTES_ANNOTATION: &str = "ichor.dev/evacuation-bytes";

/// Longhorn's group and version.
const GROUP_VERSION: &str = "longhorn.io/v1beta2";

/// Longhorn, reached through the Kubernetes API.
#[derive(Clone)]
pub struct LonghornStorage {
    client: kube::Client,
    nodes: Api<DynamicObject>,
    replicas: Api<DynamicObject>,
    shards: Api<DynamicObject>,
    backing_images: Api<DynamicObject>,
    talos_storages: Api<DynamicObject>,
    /// Whether this Longhorn serves shards, once discovery has answered.
    shards_served: Arc<OnceCell<bool>>,
    /// Whether Longhorn's Node and Shard CRDs exist, as watches of them say
    /// ([`LonghornStorage::with_crds`]); `None`: not watched, the API server is asked.
    crds: Option<LonghornCrds>,
    /// The `TalosStorage` objects as a watch-fed store holds them
    /// ([`LonghornStorage::with_storage_objects`]); `None`: listed on each read.
    storage_objects: Option<ListedStore<TalosStorage>>,
}

/// The CRDs whose presence decides what is asked of Longhorn.
#[derive(Debug, Clone)]
pub struct LonghornCrds {
    /// `nodes.longhorn.io`: without it no Longhorn Node exists, so none holds a record or a
    /// disk.
    pub nodes: CrdPresence,
    /// `shards.longhorn.io` (Longhorn 1.12.1 and later): whether shards are counted.
    pub shards: CrdPresence,
}

impl LonghornCrds {
    /// Both, followed by watches of their own.
    #[must_use]
    pub fn watch(client: &kube::Client) -> Self {
        Self { nodes: CrdPresence::watch(client, NODES_CRD), shards: CrdPresence::watch(client, SHARDS_CRD) }
    }
}

/// The CRD of Longhorn's nodes.
pub const NODES_CRD: &str = "nodes.longhorn.io";
/// The CRD of Longhorn's shards.
pub const SHARDS_CRD: &str = "shards.longhorn.io";

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
        let shard = resource("longhorn.io", "v1beta2", "Shard", "shards");
        let backing_image = resource("longhorn.io", "v1beta2", "BackingImage", "backingimages");
        let talos_storage = resource("ichor.dev", "v1alpha1", "TalosStorage", "talosstorages");
        Self {
            nodes: Api::namespaced_with(client.clone(), namespace, &node),
            replicas: Api::namespaced_with(client.clone(), namespace, &replica),
            shards: Api::namespaced_with(client.clone(), namespace, &shard),
            backing_images: Api::namespaced_with(client.clone(), namespace, &backing_image),
            talos_storages: Api::all_with(client.clone(), &talos_storage),
            client,
            shards_served: Arc::new(OnceCell::new()),
            crds: None,
            storage_objects: None,
        }
    }

    /// The same, reading the `TalosStorage` objects from `store` once it has listed,
    /// instead of a list per read: they are configuration, read from a store as the
    /// clusters and machines are. A store of one namespace (an operator limited to one)
    /// gives that namespace's objects only.
    #[must_use]
    pub fn with_storage_objects(mut self, store: ListedStore<TalosStorage>) -> Self {
        self.storage_objects = Some(store);
        self
    }

    /// The same, going by whether Longhorn's CRDs exist: with no Node CRD, a node's record
    /// and disks are read as none without a request (a cluster without Longhorn is asked
    /// nothing per machine), and shards are counted exactly while their CRD exists. Until a
    /// watch has listed, the API server is asked as without them.
    #[must_use]
    pub fn with_crds(mut self, crds: LonghornCrds) -> Self {
        self.crds = Some(crds);
        self
    }

    /// Whether Longhorn's Node CRD is known to be absent.
    fn without_nodes(&self) -> bool {
        self.crds.as_ref().is_some_and(|c| c.nodes.exists() == Some(false))
    }

    async fn patch_node(&self, node: &str, spec: serde_json::Value) -> Result<(), kube::Error> {
        let patch = json!({ "spec": spec });
        self.nodes.patch(node, &patch_params(), &Patch::Merge(&patch)).await.map(drop)
    }

    /// Whether Longhorn serves `shards.longhorn.io` (v1.12.1 and later), asked of discovery
    /// once; an answer that did not come is asked again next time.
    async fn serves_shards(&self) -> Result<bool, StorageError> {
        // A CRD that appears or goes while the operator runs (Longhorn upgraded) is seen.
        if let Some(exists) = self.crds.as_ref().and_then(|c| c.shards.exists()) {
            return Ok(exists);
        }
        let served = self
            .shards_served
            .get_or_try_init(|| async {
                let list = self.client.list_api_group_resources(GROUP_VERSION).await?;
                Ok::<_, kube::Error>(list.resources.iter().any(|r| r.name == "shards"))
            })
            .await
            .map_err(|e| storage_error(&format!("discover the resources of {GROUP_VERSION}"), &e))?;
        Ok(*served)
    }

    /// The bytes of the replicas on `node`: the sum of their `spec.volumeSize` (a string
    /// of bytes, as Longhorn writes it, or a number); `None` when one has no size that
    /// reads (no guess below the truth).
    async fn bytes_on(&self, node: &str) -> Result<Option<u64>, StorageError> {
        let params = ListParams::default().labels(&format!("{REPLICA_NODE_LABEL}={node}"));
        let list = self
            .replicas
            .list(&params)
            .await
            .map_err(|e| storage_error(&format!("list Longhorn replicas on node {node}"), &e))?;
        Ok(list.items.iter().try_fold(0u64, |sum, replica| sum.checked_add(volume_size(replica)?)))
    }

    /// The bytes of the replicas on each node that has any, from one list of every
    /// replica (`GET .../replicas`, whole objects): the sum of their `spec.volumeSize` by
    /// the node their label names; `None` for a node one of whose replicas has no size
    /// that reads. What a dry run plans evacuations from; an upgrade asks per node, at its
    /// evacuation's start ([`LonghornStorage::request_evacuation`]).
    ///
    /// # Errors
    /// As every request of this backend: the list's failure, transient or not.
    pub async fn bytes_by_node(&self) -> Result<BTreeMap<String, Option<u64>>, StorageError> {
        let list = self
            .replicas
            .list(&ListParams::default())
            .await
            .map_err(|e| storage_error("list Longhorn replicas", &e))?;
        let mut bytes: BTreeMap<String, Option<u64>> = BTreeMap::new();
        for replica in &list.items {
            let Some(node) = replica.labels().get(REPLICA_NODE_LABEL).filter(|n| !n.is_empty()) else { continue };
            let sum = bytes.entry(node.clone()).or_insert(Some(0));
            *sum = sum.and_then(|s| s.checked_add(volume_size(replica)?));
        }
        Ok(bytes)
    }

    /// How many objects of `api` (`what`: their kind, for errors) carry `node`'s label.
    async fn count_on(&self, api: &Api<DynamicObject>, what: &str, node: &str) -> Result<u32, StorageError> {
        let params = ListParams::default().labels(&format!("{REPLICA_NODE_LABEL}={node}"));
        let list = api
            .list_metadata(&params)
            .await
            .map_err(|e| storage_error(&format!("list Longhorn {what} on node {node}"), &e))?;
        Ok(u32::try_from(list.items.len()).unwrap_or(u32::MAX))
    }
}

/// A replica's `spec.volumeSize`, in bytes.
fn volume_size(replica: &DynamicObject) -> Option<u64> {
    let size = &replica.data["spec"]["volumeSize"];
    size.as_u64().or_else(|| size.as_str()?.parse().ok())
}

fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() }
}

/// The annotation's text: `allowScheduling=<bool>,evictionRequested=<bool>,since=<ms>`.
fn record_text(record: EvacuationRecord) -> String {
    let EvacuationRecord { before, since, .. } = record;
    let mut text = format!("allowScheduling={},evictionRequested={}", before.allowed, before.eviction_requested);
    if let Some(since) = since {
        text.push_str(&format!(",since={}", since.unix_millis()));
    }
    text
}

/// The annotation's record; `since` may be missing (it then counts as now), anything else
/// missing or malformed is no record.
fn parse_record(text: &str) -> Option<EvacuationRecord> {
    let mut parts = text.split(',');
    let flag = |part: Option<&str>, key: &str| part?.strip_prefix(key)?.parse::<bool>().ok();
    let before = Scheduling {
        allowed: flag(parts.next(), "allowScheduling=")?,
        eviction_requested: flag(parts.next(), "evictionRequested=")?,
    };
    let since = match parts.next() {
        None => None,
        Some(part) => Some(Timestamp::from_unix_millis(part.strip_prefix("since=")?.parse().ok()?)),
    };
    parts.next().is_none().then_some(EvacuationRecord { before, since, bytes: None })
}

/// The record of the Longhorn Node `object` (named `node`, for errors), with its bytes
/// when [`EVACUATION_BYTES_ANNOTATION`] reads (a size is a detail: one that does not read
/// is no size, never an error).
fn record_of(object: &DynamicObject, node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
    let annotations = object.metadata.annotations.as_ref();
    let Some(kept) = annotations.and_then(|a| a.get(EVACUATION_ANNOTATION)) else {
        return Ok(None);
    };
    let record = parse_record(kept).ok_or_else(|| {
        StorageError::failure(format!(
            "Longhorn Node {node}: annotation {EVACUATION_ANNOTATION} does not parse: {kept:?}"
        ))
    })?;
    let bytes = annotations.and_then(|a| a.get(EVACUATION_BYTES_ANNOTATION)).and_then(|b| b.parse().ok());
    Ok(Some(EvacuationRecord { bytes, ..record }))
}

/// Maps a Kubernetes API error as every other call of the adapters does
/// ([`kube_error`]: outages, conflicts, throttling and server errors transient; TLS,
/// credentials and other answers not), except Longhorn's webhook's 403 "please retry
/// later", which its own text calls transient (a node's disks are syncing).
fn storage_error(what: &str, error: &kube::Error) -> StorageError {
    let kind = kube_error(what, error);
    let retry_later = matches!(error, kube::Error::Api(status) if status.code == 403 && status.message.contains("please retry later"));
    StorageError { message: kind.to_string(), transient: kind.is_transient() || retry_later }
}

/// Whether `error` says that the Longhorn Node `name` does not exist: a 404 with reason
/// `NotFound` naming it. A 404 without them (no such resource: Longhorn's CRDs are not
/// installed, or a wrong path) is not.
fn is_node_not_found(error: &kube::Error, name: &str) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.code == 404
            && status.reason == "NotFound"
            && status.details.as_ref().is_some_and(|d| d.name == name))
}

impl LonghornStorage {
    /// Turns storage scheduling on `node` on or off (on also clears an eviction request:
    /// Longhorn's webhook refuses both). Idempotent; turning it on for a node Longhorn no
    /// longer has is done. Not an evacuation's write: the engine does not call it.
    ///
    /// # Errors
    /// As every request of this backend: the patch's failure, transient or not.
    pub async fn set_scheduling(&self, node: &str, enabled: bool) -> Result<(), StorageError> {
        let spec = if enabled {
            json!({ "allowScheduling": true, "evictionRequested": false })
        } else {
            json!({ "allowScheduling": false })
        };
        match self.patch_node(node, spec).await {
            Ok(()) => Ok(()),
            // Re-enabling on a node Longhorn no longer knows (removed) has nothing to do.
            Err(e) if enabled && is_node_not_found(&e, node) => Ok(()),
            Err(e) => Err(storage_error(&format!("patch Longhorn Node {node} (scheduling)"), &e)),
        }
    }

    /// Turns storage scheduling on `node` off and asks Longhorn to evict its replicas,
    /// keeping the evacuation's record (the node's scheduling before it, `since`, and the
    /// bytes on it) in annotations of the same patch, under the version read. Idempotent:
    /// a repeated request keeps the first record and says the scheduling from before; a
    /// node Longhorn does not have is [`EvacuationRequest::NoSuchNode`]. What
    /// [`StorageWrite::RequestEvacuation`] carries out.
    ///
    /// # Errors
    /// As every request of this backend (a conflict with a change since the read is
    /// transient), or a record on the node that does not parse.
    pub async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError> {
        let what = || format!("patch Longhorn Node {node} (eviction)");
        let object = match self.nodes.get(node).await {
            Ok(object) => object,
            Err(e) if is_node_not_found(&e, node) => return Ok(EvacuationRequest::NoSuchNode),
            Err(e) => return Err(storage_error(&format!("get Longhorn Node {node}"), &e)),
        };
        // Kept from the first request of this evacuation; else as the node is now.
        let record = match record_of(&object, node)? {
            Some(kept) => kept,
            None => {
                let flag = |key: &str| object.data["spec"][key].as_bool().unwrap_or(false);
                let before =
                    Scheduling { allowed: flag("allowScheduling"), eviction_requested: flag("evictionRequested") };
                // What is on the node now, before anything moves.
                EvacuationRecord { before, since: Some(since), bytes: self.bytes_on(node).await? }
            }
        };
        let before = record.before;
        // The record rides with the eviction request, on the version read: a change in
        // between is a conflict (transient), never a record of the wrong state.
        let patch = json!({
            "metadata": {
                "resourceVersion": object.metadata.resource_version,
                "annotations": {
                    EVACUATION_ANNOTATION: record_text(record),
                    EVACUATION_BYTES_ANNOTATION: record.bytes.map(|b| b.to_string()),
                },
            },
            "spec": { "allowScheduling": false, "evictionRequested": true },
        });
        match self.nodes.patch(node, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(EvacuationRequest::Requested { before }),
            Err(e) if is_node_not_found(&e, node) => Ok(EvacuationRequest::NoSuchNode),
            Err(e) => Err(storage_error(&what(), &e)),
        }
    }

    /// Puts `node`'s scheduling back as `before` and removes the evacuation's record, in
    /// one patch. Idempotent; a node Longhorn no longer has is done. What
    /// [`StorageWrite::RestoreScheduling`] carries out.
    ///
    /// # Errors
    /// As every request of this backend: the patch's failure, transient or not.
    pub async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError> {
        let patch = json!({
            "metadata": { "annotations": { EVACUATION_ANNOTATION: null, EVACUATION_BYTES_ANNOTATION: null } },
            "spec": { "allowScheduling": before.allowed, "evictionRequested": before.eviction_requested },
        });
        match self.nodes.patch(node, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            // A node Longhorn no longer knows (removed) has nothing to put back.
            Err(e) if is_node_not_found(&e, node) => Ok(()),
            Err(e) => Err(storage_error(&format!("patch Longhorn Node {node} (restore scheduling)"), &e)),
        }
    }
}

#[async_trait]
impl StorageReads for LonghornStorage {
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
        if let Some(store) = self.storage_objects.as_ref().filter(|s| s.is_listed()) {
            let mut objects = store.store.state();
            objects.sort_by_key(|o| (o.namespace(), o.name_any()));
            return objects
                .iter()
                .map(|object| {
                    let name = object.name_any();
                    let node_selector = serde_json::to_value(&object.spec.node_selector)
                        .and_then(serde_json::from_value::<LabelSelector>)
                        .map_err(|e| {
                            StorageError::failure(format!("TalosStorage {name}: spec.nodeSelector does not parse: {e}"))
                        })?;
                    let evacuation_timeout = object
                        .spec
                        .evacuation_timeout_seconds
                        .and_then(|s| u64::try_from(s).ok())
                        .map(std::time::Duration::from_secs);
                    Ok(StorageObject { name, node_selector, evacuation_timeout })
                })
                .collect();
        }
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
                let spec = object.data.get("spec");
                let evacuation_timeout = spec
                    .and_then(|spec| spec.get("evacuationTimeoutSeconds"))
                    .and_then(serde_json::Value::as_u64)
                    .map(std::time::Duration::from_secs);
                Ok(StorageObject { name, node_selector, evacuation_timeout })
            })
            .collect()
    }

    async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
        if self.without_nodes() {
            return Ok(None);
        }
        match self.nodes.get(node).await {
            Ok(object) => record_of(&object, node),
            // No such Node, or no Longhorn at all (its CRD not served): nothing recorded.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(storage_error(&format!("get Longhorn Node {node}"), &e)),
        }
    }

    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError> {
        let replicas = self.count_on(&self.replicas, "replicas", node).await?;
        let shards = if self.serves_shards().await? { self.count_on(&self.shards, "shards", node).await? } else { 0 };
        Ok(replicas.saturating_add(shards))
    }

    async fn backing_images_on(&self, node: &str) -> Result<u32, StorageError> {
        if self.without_nodes() {
            return Ok(0);
        }
        // The node's disks, by UUID (`status.diskStatus.<disk>.diskUUID`).
        let object = match self.nodes.get(node).await {
            Ok(object) => object,
            Err(e) if is_node_not_found(&e, node) => return Ok(0),
            Err(e) => return Err(storage_error(&format!("get Longhorn Node {node}"), &e)),
        };
        let disks: BTreeSet<&str> = object.data["status"]["diskStatus"]
            .as_object()
            .map(|disks| disks.values().filter_map(|d| d["diskUUID"].as_str()).filter(|u| !u.is_empty()).collect())
            .unwrap_or_default();
        if disks.is_empty() {
            return Ok(0);
        }
        let list = self
            .backing_images
            .list(&ListParams::default())
            .await
            .map_err(|e| storage_error(&format!("list Longhorn backing images for node {node}"), &e))?;
        // A file the backing image has (status) or is to have (spec) on one of those disks.
        let on_node = |image: &DynamicObject| {
            [&image.data["status"]["diskFileStatusMap"], &image.data["spec"]["diskFileSpecMap"]]
                .into_iter()
                .filter_map(serde_json::Value::as_object)
                .any(|files| files.keys().any(|uuid| disks.contains(uuid.as_str())))
        };
        Ok(u32::try_from(list.items.iter().filter(|i| on_node(i)).count()).unwrap_or(u32::MAX))
    }
}

#[async_trait]
impl ichor_executor::StorageApi for LonghornStorage {
    async fn write(&self, write: StorageWrite<'_>, _seal: Seal) -> Result<StorageWritten, StorageError> {
        Ok(match write {
            StorageWrite::RequestEvacuation { node, since } => {
                StorageWritten::Requested(self.request_evacuation(node, since).await?)
            }
            StorageWrite::RestoreScheduling { node, before } => {
                self.restore_scheduling(node, before).await?;
                StorageWritten::Restored
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_keeps_the_scheduling_and_the_time_and_refuses_what_it_did_not_write() {
        for allowed in [true, false] {
            for eviction_requested in [true, false] {
                for since in [None, Some(Timestamp::from_unix_millis(1_764_640_488_123))] {
                    let record =
                        EvacuationRecord { before: Scheduling { allowed, eviction_requested }, since, bytes: None };
                    assert_eq!(parse_record(&record_text(record)), Some(record), "{record:?}");
                }
            }
        }
        assert_eq!(
            record_text(EvacuationRecord {
                before: Scheduling::ON,
                since: Some(Timestamp::from_unix_millis(5)),
                bytes: Some(7)
            }),
            "allowScheduling=true,evictionRequested=false,since=5"
        );
        for text in [
            "",
            "allowScheduling=true",
            "allowScheduling=yes,evictionRequested=false",
            "allowScheduling=true,evictionRequested=false,since=soon",
            "allowScheduling=true,evictionRequested=false,at=5",
            "allowScheduling=true,evictionRequested=false,since=5,more",
        ] {
            assert_eq!(parse_record(text), None, "{text:?}");
        }
    }
}
