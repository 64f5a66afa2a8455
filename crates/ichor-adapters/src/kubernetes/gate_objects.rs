//! The objects a health gate reads ([`ichor_upgrade_core::gate::GateObjects`]), from the
//! API server: the kind's API found by discovery, then one get (by name) or one list (by
//! namespace and labels). Reads only.

use ichor_executor::kube_api::KubeError;
use ichor_upgrade_core::gate::GateObjects;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, TypeMeta};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};

use super::errors::kube_error;

/// The objects `objects` names, each as `(Kind namespace/name, the object as JSON)`, in
/// name order.
///
/// # Errors
/// A kind the API server does not serve, or the read's own failure.
pub async fn gate_objects(
    client: &Client,
    objects: &GateObjects,
) -> Result<Vec<(String, serde_json::Value)>, KubeError> {
    let types = TypeMeta { api_version: objects.api_version.clone(), kind: objects.kind.clone() };
    let gvk = GroupVersionKind::try_from(&types)
        .map_err(|e| KubeError::Refused(format!("apiVersion {:?}: {e}", objects.api_version)))?;
    let kind = objects.kind_name();
    let (resource, capabilities) =
        pinned_kind(client, &gvk).await.map_err(|e| kube_error(&format!("discover the API of {kind}"), &e))?;
    let api: Api<DynamicObject> = match (capabilities.scope, objects.namespace.as_deref()) {
        (Scope::Namespaced, Some(namespace)) => Api::namespaced_with(client.clone(), namespace, &resource),
        (Scope::Namespaced | Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    };
    let read = if let Some(name) = &objects.name {
        let got = api.get_opt(name).await.map_err(|e| kube_error(&format!("get {kind} {name}"), &e))?;
        got.into_iter().collect()
    } else {
        let selector =
            objects.label_selector.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        let params = if selector.is_empty() { ListParams::default() } else { ListParams::default().labels(&selector) };
        api.list(&params).await.map_err(|e| kube_error(&format!("list {kind}"), &e))?.items
    };
    let mut found: Vec<(String, serde_json::Value)> = read
        .into_iter()
        .map(|object| {
            let id = match object.metadata.namespace.as_deref() {
                Some(namespace) => {
                    format!("{} {namespace}/{}", objects.kind, object.metadata.name.clone().unwrap_or_default())
                }
                None => format!("{} {}", objects.kind, object.metadata.name.clone().unwrap_or_default()),
            };
            let json = serde_json::to_value(&object).unwrap_or(serde_json::Value::Null);
            (id, json)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}
