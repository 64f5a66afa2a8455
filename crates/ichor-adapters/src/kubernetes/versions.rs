//! What a Kubernetes upgrade reads of the cluster's Kubernetes, through its API server:
//! each node's kubelet (its Node) and static pods (their mirror pods in `kube-system`,
//! labelled `k8s-app=<component>`, as Talos renders them), the deprecated APIs clients still
//! request (the API server's own `apiserver_requested_deprecated_apis`, with the request
//! counts of `apiserver_request_total`), the objects stored of resources only removed
//! versions serve (counted after discovery), and kube-proxy's version (the
//! `kube-system/kube-proxy` DaemonSet's image).

use std::collections::BTreeMap;

use ichor_executor::kube_api::{ClusterKubernetesInfo, KubeError, NodeKubernetesInfo};
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::plan::{ApiUseSeenAs, DeprecatedApiUse};
use ichor_upgrade_core::kubernetes::removals::{self as kubernetes_removals, ServedResource};
use ichor_upgrade_core::machine::kubernetes::{StaticPodObservation, image_tag};
use ichor_upgrade_core::versions::KubernetesVersion;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::discovery::{Discovery, verbs};
use kube::{Client, ResourceExt};

use super::errors::kube_error;

/// The label Talos's static pods carry, with the component's name.
pub const COMPONENT_LABEL: &str = "k8s-app";
/// The label Talos's static pods carry, with the version they run (`1.35.0`).
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";
/// The selector of the control-plane static pods.
pub const STATIC_POD_SELECTOR: &str = "k8s-app in (kube-apiserver,kube-controller-manager,kube-scheduler)";

/// `node`'s Kubernetes: its Node's `kubeletVersion` and Ready, and the control-plane
/// static pods bound to it (one list of `kube-system`'s).
///
/// # Errors
/// The pods could not be listed.
pub async fn node_kubernetes(client: &Client, node: &Node) -> Result<NodeKubernetesInfo, KubeError> {
    let name = node.name_any();
    let status = node.status.as_ref();
    let kubelet_version =
        status.and_then(|s| s.node_info.as_ref()).map(|i| i.kubelet_version.clone()).unwrap_or_default();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let params = ListParams::default().labels(STATIC_POD_SELECTOR).fields(&format!("spec.nodeName={name}"));
    let list = pods.list(&params).await.map_err(|e| kube_error(&format!("list the static pods of {name}"), &e))?;
    Ok(NodeKubernetesInfo { kubelet_version, ready, static_pods: static_pods(&list.items) })
}

/// Every control plane's static pods, by the node each is bound to: one list of
/// `kube-system`'s mirror pods by [`STATIC_POD_SELECTOR`].
///
/// # Errors
/// The pods could not be listed.
pub async fn control_plane_pods(client: &Client) -> Result<ichor_executor::kube_api::ControlPlanePods, KubeError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let list = pods
        .list(&ListParams::default().labels(STATIC_POD_SELECTOR))
        .await
        .map_err(|e| kube_error("list the control planes' static pods", &e))?;
    let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for pod in list.items {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
        by_node.entry(node).or_default().push(pod);
    }
    Ok(by_node.into_iter().map(|(node, pods)| (node, static_pods(&pods))).collect())
}

/// The control-plane static pods among `pods` (one node's), by component; a pod being
/// deleted counts only when no other stands for its component.
#[must_use]
pub fn static_pods(pods: &[Pod]) -> BTreeMap<Component, StaticPodObservation> {
    let mut found: BTreeMap<Component, (bool, StaticPodObservation)> = BTreeMap::new();
    for pod in pods {
        let Some(component) = pod
            .labels()
            .get(COMPONENT_LABEL)
            .and_then(|name| Component::CONTROL_PLANE.into_iter().find(|c| c.as_str() == name))
        else {
            continue;
        };
        let status = pod.status.as_ref();
        let version = pod.labels().get(VERSION_LABEL).and_then(|v| KubernetesVersion::parse(v).ok()).or_else(|| {
            let image = pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.as_deref());
            image.and_then(image_tag).and_then(|tag| KubernetesVersion::parse(tag).ok())
        });
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let crash_looping = status.and_then(|s| s.container_statuses.as_ref()).is_some_and(|statuses| {
            statuses.iter().any(|c| {
                c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
            })
        });
        let live = pod.metadata.deletion_timestamp.is_none();
        let seen = StaticPodObservation { version, ready, crash_looping };
        if found.get(&component).is_none_or(|(was_live, _)| live || !*was_live) {
            found.insert(component, (live, seen));
        }
    }
    found.into_iter().map(|(c, (_, seen))| (c, seen)).collect()
}

/// The cluster's Kubernetes as planning reads it: the API server's deprecated APIs still
/// requested, and kube-proxy's version.
///
/// # Errors
/// The API server's metrics could not be read, or the DaemonSets listed.
pub async fn cluster_kubernetes(client: &Client) -> Result<ClusterKubernetesInfo, KubeError> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| KubeError::Refused(format!("the API server's /metrics: {e}")))?;
    let metrics = client.request_text(request).await.map_err(|e| kube_error("read the API server's /metrics", &e))?;
    let mut deprecated_apis = deprecated_apis(&metrics);
    deprecated_apis.extend(stored_only_in_removed_versions(client).await?);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let params = ListParams::default().fields("metadata.name=kube-proxy");
    let list = daemonsets.list(&params).await.map_err(|e| kube_error("list kube-system/kube-proxy", &e))?;
    let kube_proxy = list
        .items
        .first()
        .and_then(|d| d.spec.template.spec.as_ref())
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .and_then(image_tag)
        .and_then(|tag| KubernetesVersion::parse(tag).ok())
        .map(|v| v.to_string());
    Ok(ClusterKubernetesInfo { deprecated_apis, kube_proxy })
}

/// Every resource with stored objects that only versions a release removes serve, with
/// its object count (issue 32, item 1): aggregated discovery of the groups the removal
/// table names (one request; per group on a server without it), then a metadata list of
/// each such resource, 500 objects a page.
///
/// # Errors
/// Discovery failed, or a resource could not be listed (never taken as empty).
pub async fn stored_only_in_removed_versions(client: &Client) -> Result<Vec<DeprecatedApiUse>, KubeError> {
    let groups = kubernetes_removals::groups();
    let discovery = match Discovery::new(client.clone()).filter(&groups).run_aggregated().await {
        Ok(discovery) => discovery,
        Err(_) => Discovery::new(client.clone())
            .filter(&groups)
            .run()
            .await
            .map_err(|e| kube_error("discover the served API versions", &e))?,
    };
    let mut served: BTreeMap<(String, String), (ServedResource, Option<ApiResource>)> = BTreeMap::new();
    for group in discovery.groups() {
        for version in group.versions() {
            for (resource, capabilities) in group.versioned_resources(version) {
                if !capabilities.supports_operation(verbs::LIST) {
                    continue;
                }
                let entry = served.entry((resource.group.clone(), resource.plural.clone())).or_insert_with(|| {
                    let empty = ServedResource {
                        group: resource.group.clone(),
                        resource: resource.plural.clone(),
                        versions: Vec::new(),
                    };
                    (empty, None)
                });
                entry.0.versions.push((resource.version.clone(), resource.kind.clone()));
                entry.1.get_or_insert(resource);
            }
        }
    }
    let resources: Vec<ServedResource> = served.values().map(|(r, _)| r.clone()).collect();
    let mut uses = Vec::new();
    for stranded in kubernetes_removals::served_only_by_removed(&resources) {
        let Some((_, Some(api_resource))) = served.get(&(stranded.group.clone(), stranded.resource.clone())) else {
            continue;
        };
        let count = count_objects(client, api_resource).await?;
        if count > 0 {
            uses.push(DeprecatedApiUse {
                group: stranded.group,
                version: stranded.versions.join(","),
                resource: stranded.resource,
                removed_release: format!("{}.{}", stranded.stranded_from.major, stranded.stranded_from.minor),
                count,
                seen_as: ApiUseSeenAs::StoredObjects,
            });
        }
    }
    Ok(uses)
}

/// How many objects of `resource` the cluster stores, in every namespace.
async fn count_objects(client: &Client, resource: &ApiResource) -> Result<u64, KubeError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let what = format!("list {}.{}/{}", resource.plural, resource.group, resource.version);
    let mut params = ListParams::default().limit(500);
    let mut count = 0u64;
    loop {
        let page = api.list_metadata(&params).await.map_err(|e| kube_error(&what, &e))?;
        count += page.items.len() as u64;
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(count),
        }
    }
}

/// The deprecated APIs in `metrics` (the Prometheus text of an API server) that a release
/// removes, each with the requests `apiserver_request_total` counts for it (at least 1:
/// the gauge says it was requested).
#[must_use]
pub fn deprecated_apis(metrics: &str) -> Vec<DeprecatedApiUse> {
    let mut requests: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut deprecated: BTreeMap<(String, String, String), String> = BTreeMap::new();
    for line in metrics.lines() {
        let Some((name, labels, value)) = sample(line) else { continue };
        let key = |labels: &BTreeMap<String, String>| {
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            (get("group"), get("version"), get("resource"))
        };
        match name {
            "apiserver_requested_deprecated_apis" => {
                let removed = labels.get("removed_release").cloned().unwrap_or_default();
                if !removed.is_empty() && value > 0.0 {
                    deprecated.insert(key(&labels), removed);
                }
            }
            "apiserver_request_total" => {
                // Whole requests only; the float is a counter's integer value.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let count = value.max(0.0) as u64;
                *requests.entry(key(&labels)).or_default() += count;
            }
            _ => {}
        }
    }
    deprecated
        .into_iter()
        .map(|((group, version, resource), removed_release)| {
            let count = requests.get(&(group.clone(), version.clone(), resource.clone())).copied().unwrap_or(0).max(1);
            DeprecatedApiUse { group, version, resource, removed_release, count, seen_as: ApiUseSeenAs::Requests }
        })
        .collect()
}

/// One sample line: its metric name, labels and value; `None` for comments and lines that
/// do not read.
fn sample(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (name, rest) = match line.find('{') {
        Some(open) => (&line[..open], &line[open + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some((name, BTreeMap::new(), value.trim().split(' ').next()?.parse().ok()?));
        }
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.char_indices().peekable();
    let mut end = None;
    loop {
        while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
            chars.next();
        }
        match chars.peek() {
            Some((i, '}')) => {
                end = Some(*i);
                break;
            }
            None => break,
            Some(_) => {}
        }
        let mut key = String::new();
        for (_, c) in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next().map(|(_, c)| c) != Some('"') {
            return None;
        }
        let mut value = String::new();
        let mut escaped = false;
        for (_, c) in chars.by_ref() {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => break,
                (false, c) => value.push(c),
            }
        }
        labels.insert(key.trim().to_owned(), value);
    }
    let after = &rest[end? + 1..];
    let value = after.trim().split(' ').next()?.parse().ok()?;
    Some((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As an API server writes them (abridged).
    const METRICS: &str = r#"# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.
# TYPE apiserver_requested_deprecated_apis gauge
apiserver_requested_deprecated_apis{group="flowcontrol.apiserver.k8s.io",removed_release="1.32",resource="flowschemas",subresource="",version="v1beta3"} 1
apiserver_requested_deprecated_apis{group="storage.k8s.io",removed_release="",resource="csistoragecapacities",subresource="",version="v1beta1"} 1
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="flowcontrol.apiserver.k8s.io",resource="flowschemas",scope="cluster",subresource="",verb="LIST",version="v1beta3"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="flowcontrol.apiserver.k8s.io",resource="flowschemas",scope="resource",subresource="",verb="GET",version="v1beta3"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="flowcontrol.apiserver.k8s.io",resource="flowschemas",scope="cluster",subresource="",verb="LIST",version="v1"} 900
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 3.0
"#;

    #[test]
    fn deprecated_apis_with_a_removal_are_read_with_their_request_counts() {
        let apis = deprecated_apis(METRICS);
        assert_eq!(apis.len(), 1, "one with no removal release planned is left out: {apis:?}");
        assert_eq!(apis[0].group, "flowcontrol.apiserver.k8s.io");
        assert_eq!(apis[0].version, "v1beta3");
        assert_eq!(apis[0].resource, "flowschemas");
        assert_eq!(apis[0].removed_release, "1.32");
        assert_eq!(apis[0].count, 12, "the v1beta3 requests only");
        assert!(deprecated_apis("# nothing\n").is_empty());
    }

    #[test]
    fn label_values_with_escapes_and_commas_are_read_whole() {
        let (name, labels, value) = sample(r#"m{a="x,\"y\"",b="z\\w"} 2.5"#).unwrap();
        assert_eq!(name, "m");
        assert_eq!(labels["a"], "x,\"y\"");
        assert_eq!(labels["b"], "z\\w");
        assert!((value - 2.5).abs() < f64::EPSILON);
        assert_eq!(sample("up 1").map(|(n, _, v)| (n, v)), Some(("up", 1.0)));
        assert!(sample(r#"m{a="unterminated} 1"#).is_none());
    }

    #[test]
    fn a_static_pod_is_read_by_its_labels_and_status() {
        let pod = |name: &str, version: &str, ready: &str, waiting: Option<&str>, deleting: bool| -> Pod {
            let mut value = serde_json::json!({
                "metadata": { "name": name, "labels": { "k8s-app": "kube-apiserver", "app.kubernetes.io/version": version } },
                "spec": { "containers": [{ "name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v9.9.9" }] },
                "status": {
                    "conditions": [{ "type": "Ready", "status": ready }],
                    "containerStatuses": [{
                        "name": "kube-apiserver", "image": "x", "imageID": "", "ready": false, "restartCount": 4,
                        "state": waiting.map_or(serde_json::json!({ "running": {} }), |r| serde_json::json!({ "waiting": { "reason": r } })),
                    }],
                },
            });
            if deleting {
                value["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z".into();
            }
            serde_json::from_value(value).unwrap()
        };
        let seen = static_pods(&[
            pod("old", "1.34.1", "True", None, true),
            pod("new", "1.35.0", "False", Some("CrashLoopBackOff"), false),
        ]);
        let apiserver = &seen[&Component::KubeApiserver];
        assert_eq!(apiserver.version.as_ref().map(ToString::to_string).as_deref(), Some("1.35.0"), "the live one");
        assert!(!apiserver.ready && apiserver.crash_looping);
        let mut no_label = pod("p", "", "True", None, false);
        no_label.metadata.labels.as_mut().unwrap().remove(VERSION_LABEL);
        let seen = static_pods(&[no_label]);
        assert_eq!(
            seen[&Component::KubeApiserver].version.as_ref().map(ToString::to_string).as_deref(),
            Some("9.9.9"),
            "from the image's tag"
        );
    }
}
