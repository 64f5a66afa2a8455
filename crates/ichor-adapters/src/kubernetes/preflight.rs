//! What the preflight gate reads of a cluster's workloads ([`read_facts`]): pods,
//! PodDisruptionBudgets, Deployments, StatefulSets and ReplicaSets, listed when a machine
//! is about to start (not watched: the gate asks rarely, and a watch of every pod of a
//! large cluster would cost more than these lists).
//!
//! PodDisruptionBudgets are read through the policy version the server serves: `policy/v1`
//! (Kubernetes 1.21 and later), else `policy/v1beta1`. The two differ on an empty selector:
//! it covers every pod of the namespace in v1 and none in v1beta1.

use std::collections::BTreeMap;

use ichor_talos_executor::kube_api::KubeError;
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

/// Lists everything the gate reads (its `nodes` are left empty: the engine has them).
///
/// # Errors
/// The first list that failed, named.
pub(crate) async fn read_facts(client: &Client) -> Result<ClusterFacts, KubeError> {
    let all = ListParams::default();
    let pods = Api::<Pod>::all(client.clone()).list(&all).await.map_err(|e| kube_error("list pods", &e))?;
    let deployments =
        Api::<Deployment>::all(client.clone()).list(&all).await.map_err(|e| kube_error("list Deployments", &e))?;
    let stateful_sets =
        Api::<StatefulSet>::all(client.clone()).list(&all).await.map_err(|e| kube_error("list StatefulSets", &e))?;
    let replica_sets =
        Api::<ReplicaSet>::all(client.clone()).list(&all).await.map_err(|e| kube_error("list ReplicaSets", &e))?;
    let budgets = read_budgets(client).await?;
    let workloads = deployments
        .items
        .iter()
        .map(|d| workload(WorkloadKind::Deployment, d, d.spec.replicas))
        .chain(stateful_sets.items.iter().map(|s| workload(WorkloadKind::StatefulSet, s, s.spec.replicas)))
        .collect();
    Ok(ClusterFacts {
        nodes: Vec::new(),
        pods: pods.items.iter().map(pod_facts).collect(),
        budgets,
        workloads,
        replica_sets: replica_sets.items.iter().map(replica_set_facts).collect(),
    })
}

/// The budgets, through the newest policy version the server serves.
async fn read_budgets(client: &Client) -> Result<Vec<BudgetFacts>, KubeError> {
    let mut last = None;
    for version in POLICY_VERSIONS {
        let gvk = GroupVersionKind::gvk("policy", version, "PodDisruptionBudget");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
        match Api::<DynamicObject>::all_with(client.clone(), &resource).list(&ListParams::default()).await {
            Ok(list) => return Ok(list.items.iter().map(|b| budget_facts(b, version)).collect()),
            Err(kube::Error::Api(status)) if status.code == 404 => last = Some(status.message),
            Err(e) => return Err(kube_error(&format!("list policy/{version} PodDisruptionBudgets"), &e)),
        }
    }
    Err(KubeError::NotFound(format!("no policy version serves PodDisruptionBudgets ({})", last.unwrap_or_default())))
}

fn workload<K: ResourceExt>(kind: WorkloadKind, object: &K, replicas: Option<i32>) -> WorkloadFacts {
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

fn replica_set_facts(rs: &ReplicaSet) -> ReplicaSetFacts {
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
