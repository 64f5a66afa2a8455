//! A Kubernetes upgrade's bootstrap manifests applied as Talos applies them: each object
//! server-side, under Talos's field manager, taking over fields another manager holds.
//! The object's API is found by discovery (its group, version and kind), so any kind a
//! manifest holds (a CRD's included) applies.

use ichor_talos_executor::kube_api::KubeError;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{GroupVersionKind, TypeMeta};
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;

use super::errors::kube_error;

/// Applies `object` server-side under `field_manager`, forced.
///
/// # Errors
/// An object without `apiVersion`, `kind` or `metadata.name`, a kind the API server does
/// not serve ([`KubeError::Refused`]), or the apply's own failure.
pub async fn apply_manifest(client: &Client, object: &Value, field_manager: &str) -> Result<(), KubeError> {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (Some(api_version), Some(kind), Some(name)) = (text("/apiVersion"), text("/kind"), text("/metadata/name"))
    else {
        return Err(KubeError::Refused(
            "a bootstrap manifest object lacks its apiVersion, kind or metadata.name".to_owned(),
        ));
    };
    let what = match text("/metadata/namespace") {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    };
    let types = TypeMeta { api_version: api_version.to_owned(), kind: kind.to_owned() };
    let gvk = GroupVersionKind::try_from(&types)
        .map_err(|e| KubeError::Refused(format!("{what}: apiVersion {api_version:?}: {e}")))?;
    let (resource, capabilities) =
        pinned_kind(client, &gvk).await.map_err(|e| kube_error(&format!("discover the API of {what}"), &e))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            Api::namespaced_with(client.clone(), text("/metadata/namespace").unwrap_or("default"), &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    api.patch(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(object))
        .await
        .map_err(|e| kube_error(&format!("apply {what}"), &e))?;
    Ok(())
}
