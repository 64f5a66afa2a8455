//! A Kubernetes upgrade's bootstrap manifests applied as Talos applies them: each object
//! server-side, under Talos's field manager, taking over fields another manager holds.
//! The object's API is found by discovery (its group, version and kind), so any kind a
//! manifest holds (a CRD's included) applies. The applies go through a session under the
//! cluster's admin kubeconfig, as `talosctl upgrade-k8s` makes them, never the operator's
//! own identity. Then the rollouts of the workloads applied (the operator's own reads).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use ichor_executor::kube_api::{AdminKubeconfig, KubeError, ManifestSession};
use ichor_executor::machine::kubernetes::object_name;
use ichor_upgrade_core::kubernetes::manifests::WorkloadRollout;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{GroupVersionKind, TypeMeta};
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, Config};
use serde_json::Value;

use super::counters::Counters;
use super::errors::kube_error;

/// A client under the admin kubeconfig a control plane's Talos API gave: the bootstrap
/// manifests' session ([`ichor_executor::kube_api::KubeApi::manifest_session`]). The kubeconfig is read from memory
/// and never written; the client (its credentials inside) is dropped with the session.
pub struct AdminSession {
    client: Client,
    counters: Arc<Counters>,
}

impl AdminSession {
    /// A client from `kubeconfig`'s current context; its calls counted in `counters`.
    ///
    /// # Errors
    /// [`KubeError::Refused`]: a kubeconfig that does not parse, names no usable context,
    /// or whose credentials make no TLS client (nothing of the kubeconfig's own text is
    /// in the message).
    pub async fn new(kubeconfig: &AdminKubeconfig, counters: Arc<Counters>) -> Result<Self, KubeError> {
        let refused =
            |what: &str, e: &dyn std::fmt::Display| KubeError::Refused(format!("the admin kubeconfig {what}: {e}"));
        let parsed = Kubeconfig::from_yaml(kubeconfig.expose()).map_err(|e| refused("does not parse", &e))?;
        let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .map_err(|e| refused("names no usable cluster and user", &e))?;
        let client = Client::try_from(config).map_err(|e| refused("makes no client", &e))?;
        Ok(Self { client, counters })
    }
}

#[async_trait]
impl ManifestSession for AdminSession {
    async fn apply(&self, object: &Value, field_manager: &str) -> Result<(), KubeError> {
        // Discovery of its kind's API (one request), then the apply.
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        apply_manifest(&self.client, object, field_manager).await
    }
}

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
    let what = object_name(object);
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

/// The rollout of `workload` (`DaemonSet namespace/name` or `Deployment namespace/name`),
/// as `kubectl rollout status` judges it: its controller observed its latest generation,
/// and every pod it wants is updated and available (a Deployment: no old pod left either).
/// A workload that does not exist is not rolled out.
///
/// # Errors
/// A workload named in another form, or the read's own failure.
pub async fn workload_rollout(client: &Client, workload: &str) -> Result<WorkloadRollout, KubeError> {
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    let parsed =
        workload.split_once(' ').and_then(|(kind, rest)| rest.split_once('/').map(|(ns, name)| (kind, ns, name)));
    let Some((kind, namespace, name)) = parsed else {
        return Err(KubeError::Refused(format!("not a workload: {workload:?}")));
    };
    let rollout = |done: bool, detail: String, progress: i32| WorkloadRollout {
        workload: workload.to_owned(),
        done,
        detail,
        progress: u64::try_from(progress).unwrap_or(0),
    };
    let read = |e: &kube::Error| kube_error(&format!("read {workload}"), e);
    match kind {
        "DaemonSet" => {
            let Some(ds) =
                Api::<DaemonSet>::namespaced(client.clone(), namespace).get_opt(name).await.map_err(|e| read(&e))?
            else {
                return Ok(rollout(false, "not found".to_owned(), 0));
            };
            let status = ds.status.unwrap_or_default();
            let observed = status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0);
            let desired = status.desired_number_scheduled;
            let updated = status.updated_number_scheduled.unwrap_or(0);
            let available = status.number_available.unwrap_or(0);
            let done = observed && updated == desired && available == desired;
            let seen = if observed { "" } else { ", its latest spec not observed yet" };
            let detail = format!("updated {updated}/{desired}, available {available}/{desired}{seen}");
            Ok(rollout(done, detail, updated.saturating_add(available)))
        }
        "Deployment" => {
            let Some(deployment) =
                Api::<Deployment>::namespaced(client.clone(), namespace).get_opt(name).await.map_err(|e| read(&e))?
            else {
                return Ok(rollout(false, "not found".to_owned(), 0));
            };
            let wanted = deployment.spec.replicas.unwrap_or(1);
            let status = deployment.status.unwrap_or_default();
            let observed = status.observed_generation.unwrap_or(0) >= deployment.metadata.generation.unwrap_or(0);
            let updated = status.updated_replicas.unwrap_or(0);
            let available = status.available_replicas.unwrap_or(0);
            let all = status.replicas.unwrap_or(0);
            let done = observed && updated == wanted && available == wanted && all == wanted;
            let seen = if observed { "" } else { ", its latest spec not observed yet" };
            let detail = format!("updated {updated}/{wanted}, available {available}/{wanted}, {all} in all{seen}");
            Ok(rollout(done, detail, updated.saturating_add(available)))
        }
        other => Err(KubeError::Refused(format!("{workload}: the rollout of a {other} is not read"))),
    }
}
