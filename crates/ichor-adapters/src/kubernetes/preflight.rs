//! What the preflight gate reads of a cluster's workloads ([`read_facts`]): pods,
//! PodDisruptionBudgets, Deployments, StatefulSets and ReplicaSets, listed. The operator
//! reads them from watch-fed stores ([`super::workloads`]); these lists are what a client
//! without them reads, and what one reads until its stores have listed.
//!
//! Only what can block the nodes asked about is read: their pods (by field selector on
//! `spec.nodeName`), then the pods, workloads and budgets of those pods' namespaces (a
//! budget or a workload covers pods of its own namespace only). A namespace with no pod
//! on those nodes is never listed, so a pass over one machine of a 5,000-node cluster reads
//! that machine's tenants, not the cluster.
//!
//! PodDisruptionBudgets are read through the policy version the server serves: `policy/v1`
//! (Kubernetes 1.21 and later), else `policy/v1beta1`. The two differ on an empty selector:
//! it covers every pod of the namespace in v1 and none in v1beta1.

use std::collections::{BTreeMap, BTreeSet};

use ichor_executor::kube_api::KubeError;
use ichor_upgrade_core::labels::LabelSelector;
use ichor_upgrade_core::preflight::{
    BudgetFacts, ClusterFacts, Owner, PodFacts, ReplicaSetFacts, WorkloadFacts, WorkloadKind,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Client, ResourceExt};

use super::errors::kube_error;

/// The policy versions a PodDisruptionBudget may be served at, newest first.
const POLICY_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// Lists what the gate needs to judge the nodes `asked` (its `nodes` are left empty: the
/// engine has them). Returns how many lists it made, with the facts.
///
/// # Errors
/// The first list that failed, named.
pub(crate) async fn read_facts(client: &Client, asked: &[&str]) -> Result<(ClusterFacts, u64), KubeError> {
    let mut namespaces = BTreeSet::new();
    let mut lists = 0;
    for node in asked {
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = Api::<Pod>::all(client.clone())
            .list_metadata(&on_node)
            .await
            .map_err(|e| kube_error(&format!("list the pods on {node}"), &e))?;
        lists += 1;
        namespaces.extend(pods.items.iter().filter_map(|p| p.metadata.namespace.clone()));
    }
    let mut facts = ClusterFacts::default();
    let mut version = None;
    for namespace in &namespaces {
        let all = ListParams::default();
        let named = |what: &str| format!("list {what} in {namespace}");
        let pods = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&all)
            .await
            .map_err(|e| kube_error(&named("pods"), &e))?;
        let deployments = Api::<Deployment>::namespaced(client.clone(), namespace)
            .list(&all)
            .await
            .map_err(|e| kube_error(&named("Deployments"), &e))?;
        let stateful_sets = Api::<StatefulSet>::namespaced(client.clone(), namespace)
            .list(&all)
            .await
            .map_err(|e| kube_error(&named("StatefulSets"), &e))?;
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
            .list(&all)
            .await
            .map_err(|e| kube_error(&named("ReplicaSets"), &e))?;
        let (budgets, served) = read_budgets(client, namespace, version).await?;
        version = Some(served);
        lists += 5;
        facts.pods.extend(pods.items.iter().map(pod_facts));
        facts.workloads.extend(
            deployments
                .items
                .iter()
                .map(|d| workload(WorkloadKind::Deployment, d, d.spec.replicas))
                .chain(stateful_sets.items.iter().map(|s| workload(WorkloadKind::StatefulSet, s, s.spec.replicas))),
        );
        facts.replica_sets.extend(replica_sets.items.iter().map(replica_set_facts));
        facts.budgets.extend(budgets);
    }
    Ok((facts, lists))
}

/// The budgets of `namespace`, through the newest policy version the server serves (or
/// `known`, found earlier in the same read), with that version.
async fn read_budgets(
    client: &Client,
    namespace: &str,
    known: Option<&'static str>,
) -> Result<(Vec<BudgetFacts>, &'static str), KubeError> {
    let mut last = None;
    let versions: Vec<&'static str> = known.map_or_else(|| POLICY_VERSIONS.to_vec(), |v| vec![v]);
    for version in versions {
        let gvk = GroupVersionKind::gvk("policy", version, "PodDisruptionBudget");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
        match Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => return Ok((list.items.iter().map(|b| budget_facts(b, version)).collect(), version)),
            Err(kube::Error::Api(status)) if status.code == 404 => last = Some(status.message),
            Err(e) => return Err(kube_error(&format!("list policy/{version} PodDisruptionBudgets"), &e)),
        }
    }
    Err(KubeError::NotFound(format!("no policy version serves PodDisruptionBudgets ({})", last.unwrap_or_default())))
}

pub(crate) fn workload<K: ResourceExt>(kind: WorkloadKind, object: &K, replicas: Option<i32>) -> WorkloadFacts {
    WorkloadFacts {
        kind,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        // Kubernetes defaults an unset `spec.replicas` to 1.
        replicas: replicas.unwrap_or(1),
    }
}

/// A pod as the gate sees it.
pub(crate) fn pod_facts(pod: &Pod) -> PodFacts {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| Owner { kind: o.kind.clone(), name: o.name.clone() });
    PodFacts {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready,
        labels: pod.labels().clone(),
        owner,
        mirror: pod.annotations().contains_key("kubernetes.io/config.mirror"),
    }
}

pub(crate) fn replica_set_facts(rs: &ReplicaSet) -> ReplicaSetFacts {
    ReplicaSetFacts {
        namespace: rs.namespace().unwrap_or_default(),
        name: rs.name_any(),
        replicas: rs.spec.replicas.unwrap_or(1),
        deployment: rs
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "Deployment")
            .map(|o| o.name.clone()),
    }
}

/// A budget as the gate sees it, from its object at `version` (`v1` or `v1beta1`). A
/// selector that does not parse is kept as one that cannot be evaluated (an unknown
/// operator), so that the gate names it rather than passing over it.
pub(crate) fn budget_facts(budget: &DynamicObject, version: &str) -> BudgetFacts {
    let field = |path: &[&str]| {
        let mut value = &budget.data;
        for key in path {
            value = value.get(key)?;
        }
        Some(value)
    };
    let int = |path: &[&str]| {
        field(path).and_then(serde_json::Value::as_i64).and_then(|v| i32::try_from(v).ok()).unwrap_or(0)
    };
    let selector = match field(&["spec", "selector"]) {
        None | Some(serde_json::Value::Null) => None,
        Some(raw) => match serde_json::from_value::<LabelSelector>(raw.clone()) {
            // An empty selector covers every pod in v1, none in v1beta1.
            Ok(s) if s.match_labels.is_empty() && s.match_expressions.is_empty() && version != "v1" => None,
            Ok(s) => Some(s),
            Err(e) => Some(LabelSelector {
                match_labels: BTreeMap::new(),
                match_expressions: vec![ichor_upgrade_core::labels::LabelSelectorRequirement {
                    key: format!("(selector does not parse: {e})"),
                    operator: "Unparsed".to_owned(),
                    values: Vec::new(),
                }],
            }),
        },
    };
    BudgetFacts {
        namespace: budget.namespace().unwrap_or_default(),
        name: budget.name_any(),
        selector,
        disruptions_allowed: int(&["status", "disruptionsAllowed"]),
        current_healthy: int(&["status", "currentHealthy"]),
        desired_healthy: int(&["status", "desiredHealthy"]),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_budgets_empty_selector_covers_every_pod_in_v1_and_none_in_v1beta1() {
        let raw = json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "all", "namespace": "shop"},
            "spec": {"selector": {}, "minAvailable": 1},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
        });
        let v1 = budget_facts(&object(raw.clone()), "v1");
        assert_eq!(v1.selector, Some(LabelSelector::default()));
        assert_eq!((v1.disruptions_allowed, v1.current_healthy, v1.desired_healthy), (0, 1, 1));
        assert_eq!(budget_facts(&object(raw), "v1beta1").selector, None);
    }

    #[test]
    fn a_budget_without_status_allows_nothing_and_a_broken_selector_is_kept_unevaluable() {
        let raw = json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "new", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": "not a map"}}
        });
        let facts = budget_facts(&object(raw), "v1");
        assert_eq!(facts.disruptions_allowed, 0, "a budget its controller has not counted yet");
        let selector = facts.selector.unwrap();
        assert!(selector.matches(&BTreeMap::new()).is_err(), "never taken as covering nothing");
    }

    #[test]
    fn a_pods_readiness_owner_and_mirror_annotation_are_read() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "labels": {"app": "web"},
                "annotations": {"kubernetes.io/config.mirror": "x"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "1"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d", "uid": "2", "controller": true}
                ]
            },
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let facts = pod_facts(&pod);
        assert!(facts.ready && facts.mirror);
        assert_eq!(facts.node.as_deref(), Some("n1"));
        assert_eq!(facts.owner, Some(Owner { kind: "ReplicaSet".into(), name: "web-5d".into() }));
    }
}
