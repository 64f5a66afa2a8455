//! Watch-fed stores of the cluster's workloads ([`WorkloadStores`]): pods,
//! PodDisruptionBudgets (`policy/v1`), Deployments, StatefulSets and ReplicaSets, shared by
//! the drain, the preflight gate and the dry run, so that a pass reads them and never lists
//! (`kubectl drain` watches too). Each object is trimmed to what those read before a store
//! keeps it (no managed fields, no pod template, no container specs): a pod costs its
//! names, labels, owners and Ready condition.
//!
//! How stale a store can be, and why that is safe (DESIGN §3.11):
//!
//! - A store shows what its watch delivered: a moment behind the API server while it
//!   follows, longer while the watch is down (an API server restart) and until its relist.
//!   A store that has not had its first list answers nothing ([`WorkloadStores::is_ready`]);
//!   the client then reads from the API server as before.
//! - The drain evicts what the store shows under each pod's UID as the store saw it: a pod
//!   made since under the same name (a StatefulSet's, placed on another node) is not the
//!   one read, and the Eviction API refuses it (409): nothing is evicted on a stale view.
//!   Budgets are the Eviction API's to enforce, never the store's.
//! - The decision that a node is drained, after which it reboots, is never taken from a
//!   store: an empty answer is read again from the API server
//!   ([`KubeApi::pods_on`](ichor_executor::kube_api::KubeApi::pods_on)).
//! - The preflight gate and the dry run judge from the stores: what they say is advice on
//!   whether a machine's drain can finish; the drain itself is judged as above.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::StreamExt;
use ichor_executor::kube_api::PodInfo;
use ichor_upgrade_core::preflight::ClusterFacts;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::preflight::{budget_facts, pod_facts, replica_set_facts, workload};
use super::watches::engine_watcher;
use ichor_upgrade_core::preflight::WorkloadKind;

/// The annotation of a mirror (static) pod.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// How many of the stores there are (each counted once its first list is in).
const STORES: u64 = 5;

/// The stores, filled by watches their own tasks drive ([`WorkloadStores::spawn`]).
#[derive(Clone)]
pub struct WorkloadStores {
    pods: Store<Pod>,
    budgets: Store<DynamicObject>,
    deployments: Store<Deployment>,
    stateful_sets: Store<StatefulSet>,
    replica_sets: Store<ReplicaSet>,
    /// How many stores have had their first list.
    listed: Arc<AtomicU64>,
    /// Whether the pods' store has.
    pods_listed: Arc<AtomicBool>,
}

impl std::fmt::Debug for WorkloadStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadStores").field("ready", &self.is_ready()).finish_non_exhaustive()
    }
}

impl WorkloadStores {
    /// Watches of every namespace's workloads, each driven by a task of its own (they wake
    /// no pass: a pass that waits on pods looks again at its own time).
    #[must_use]
    pub fn spawn(client: &Client) -> Self {
        let listed = Arc::new(AtomicU64::new(0));
        let (pods, pods_listed) = reflect(Api::<Pod>::all(client.clone()), (), &listed, trim_pod);
        let gvk = GroupVersionKind::gvk("policy", "v1", "PodDisruptionBudget");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
        let budgets_api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let (budgets, _) = reflect(budgets_api, resource, &listed, trim_budget);
        let (deployments, _) = reflect(Api::<Deployment>::all(client.clone()), (), &listed, |d: &mut Deployment| {
            trim_meta(d);
            d.spec.template = PodTemplateSpec::default();
            d.spec.selector = LabelSelector::default();
            d.spec.strategy = None;
            d.status = None;
        });
        let (stateful_sets, _) =
            reflect(Api::<StatefulSet>::all(client.clone()), (), &listed, |s: &mut StatefulSet| {
                trim_meta(s);
                s.spec.template = PodTemplateSpec::default();
                s.spec.selector = LabelSelector::default();
                s.spec.volume_claim_templates = None;
                s.status = None;
            });
        let (replica_sets, _) = reflect(Api::<ReplicaSet>::all(client.clone()), (), &listed, |r: &mut ReplicaSet| {
            trim_meta(r);
            r.spec.template = None;
            r.spec.selector = LabelSelector::default();
            r.status = None;
        });
        Self { pods, budgets, deployments, stateful_sets, replica_sets, listed, pods_listed }
    }

    /// Whether every store has had its first list: until then nothing is answered from
    /// them.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.listed.load(Ordering::Relaxed) >= STORES
    }

    /// The pods the store shows on `node`; `None` before the pods' first list.
    #[must_use]
    pub fn pods_on(&self, node: &str) -> Option<Vec<PodInfo>> {
        // Only the pods' store is needed here: the drain does not wait for the others.
        if !self.pods_listed.load(Ordering::Relaxed) {
            return None;
        }
        let mut pods: Vec<PodInfo> = self
            .pods
            .state()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|p| pod_info(p))
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Some(pods)
    }

    /// What the preflight gate reads about the Nodes `asked`, as the lists of
    /// `preflight::read_facts` would give it (every pod, workload, ReplicaSet and budget of
    /// the namespaces with a pod on one of them); `None` until every store has its first
    /// list.
    #[must_use]
    pub fn facts(&self, asked: &[&str]) -> Option<ClusterFacts> {
        if !self.is_ready() {
            return None;
        }
        let asked: BTreeSet<&str> = asked.iter().copied().collect();
        let pods = self.pods.state();
        let namespaces: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| asked.contains(n)))
            .filter_map(|p| p.namespace())
            .collect();
        let within = |namespace: Option<String>| namespace.is_some_and(|n| namespaces.contains(&n));
        let mut facts = ClusterFacts::default();
        facts.pods.extend(pods.iter().filter(|p| within(p.namespace())).map(|p| pod_facts(p)));
        facts.workloads.extend(
            self.deployments
                .state()
                .iter()
                .filter(|d| within(d.namespace()))
                .map(|d| workload(WorkloadKind::Deployment, d.as_ref(), d.spec.replicas)),
        );
        facts.workloads.extend(
            self.stateful_sets
                .state()
                .iter()
                .filter(|s| within(s.namespace()))
                .map(|s| workload(WorkloadKind::StatefulSet, s.as_ref(), s.spec.replicas)),
        );
        facts
            .replica_sets
            .extend(self.replica_sets.state().iter().filter(|r| within(r.namespace())).map(|r| replica_set_facts(r)));
        facts
            .budgets
            .extend(self.budgets.state().iter().filter(|b| within(b.namespace())).map(|b| budget_facts(b, "v1")));
        // In the order the lists gave them: by namespace, then name.
        facts.pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        facts.workloads.sort_by(|a, b| (&a.namespace, &a.name, a.kind).cmp(&(&b.namespace, &b.name, b.kind)));
        facts.replica_sets.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        facts.budgets.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Some(facts)
    }
}

/// A pod as the drain sees it.
pub(crate) fn pod_info(pod: &Pod) -> PodInfo {
    PodInfo {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        owner_kinds: pod.owner_references().iter().map(|o| o.kind.clone()).collect(),
        mirror: pod.annotations().contains_key(MIRROR_ANNOTATION),
        terminating: pod.meta().deletion_timestamp.is_some(),
        uid: pod.uid(),
    }
}

/// A store of `api`'s objects, each trimmed by `trim` before it is kept, fed by a watch a
/// task of its own drives, with whether it has had its first list; `listed` counts that
/// too.
fn reflect<K>(
    api: Api<K>,
    dyntype: K::DynamicType,
    listed: &Arc<AtomicU64>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, Arc<AtomicBool>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let writer = reflector::store::Writer::new(dyntype);
    let store = writer.as_reader();
    let listed = Arc::clone(listed);
    let own = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&own);
    let mut first = true;
    let stream = reflector::reflector(writer, engine_watcher(api, watcher::Config::default()).modify(trim));
    tokio::spawn(stream.for_each(move |event| {
        match &event {
            Ok(watcher::Event::InitDone) if first => {
                first = false;
                done.store(true, Ordering::Relaxed);
                listed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "workload watch error; retried after its backoff"),
            Ok(_) => {}
        }
        std::future::ready(())
    }));
    (store, own)
}

/// What no reader of these stores looks at in any object's metadata.
fn trim_meta<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.finalizers = None;
}

/// A pod trimmed to its names, UID, labels, owners, mirror annotation, deletion, node and
/// Ready condition.
fn trim_pod(pod: &mut Pod) {
    let mirror = pod.annotations().get(MIRROR_ANNOTATION).cloned();
    trim_meta(pod);
    if let Some(mirror) = mirror {
        pod.meta_mut().annotations = Some([(MIRROR_ANNOTATION.to_owned(), mirror)].into());
    }
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec { node_name, ..PodSpec::default() });
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().filter(|c| c.type_ == "Ready").cloned().collect::<Vec<_>>());
    pod.status = Some(PodStatus { conditions: ready, ..PodStatus::default() });
}

/// A budget trimmed to its selector and the counts its controller writes.
fn trim_budget(budget: &mut DynamicObject) {
    trim_meta(budget);
    let spec = budget.data.get("spec").and_then(|s| s.get("selector")).cloned();
    let status = budget.data.get("status").map(|s| {
        let mut kept = serde_json::Map::new();
        for key in ["disruptionsAllowed", "currentHealthy", "desiredHealthy"] {
            if let Some(v) = s.get(key) {
                kept.insert(key.to_owned(), v.clone());
            }
        }
        serde_json::Value::Object(kept)
    });
    let mut data = serde_json::Map::new();
    if let Some(selector) = spec {
        data.insert("spec".to_owned(), serde_json::json!({ "selector": selector }));
    }
    if let Some(status) = status {
        data.insert("status".to_owned(), status);
    }
    budget.data = serde_json::Value::Object(data);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_trimmed_pod_keeps_what_the_drain_and_the_gate_read() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"},
                "annotations": {"kubernetes.io/config.mirror": "x", "other": "y"},
                "managedFields": [{"manager": "kubelet"}],
                "deletionTimestamp": "2026-12-08T00:00:00Z",
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d", "uid": "2", "controller": true}
                ]
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}
            ]}
        }))
        .unwrap();
        let before = (pod_info(&pod), pod_facts(&pod));
        trim_pod(&mut pod);
        assert_eq!((pod_info(&pod), pod_facts(&pod)), before, "the same to every reader");
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.annotations().len(), 1);
        assert!(pod.spec.as_ref().unwrap().containers.is_empty());
        assert_eq!(pod.status.as_ref().unwrap().conditions.as_ref().unwrap().len(), 1);
        assert_eq!(before.0.uid.as_deref(), Some("u-1"));
        assert!(before.0.terminating && before.0.mirror);
    }

    #[test]
    fn a_trimmed_budget_reads_as_before() {
        let raw = json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "shop", "managedFields": [{"manager": "m"}]},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1},
            "status": {"disruptionsAllowed": 1, "currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3,
                       "conditions": [{"type": "DisruptionAllowed", "status": "True"}]}
        });
        let mut budget: DynamicObject = serde_json::from_value(raw).unwrap();
        let before = budget_facts(&budget, "v1");
        trim_budget(&mut budget);
        assert_eq!(budget_facts(&budget, "v1"), before);
        assert!(budget.data["status"].get("conditions").is_none());
        // One with no status yet (its controller has not counted it) allows nothing, as before.
        let mut new: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "new", "namespace": "shop"}, "spec": {"selector": {}}
        }))
        .unwrap();
        let before = budget_facts(&new, "v1");
        trim_budget(&mut new);
        assert_eq!(budget_facts(&new, "v1"), before);
        assert_eq!(before.disruptions_allowed, 0);
    }
}
