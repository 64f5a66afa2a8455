//! Stage "audit": the morning-after audit ([`ichor_upgrade_core::audit`]), read and
//! judged in the pass whose status first says an upgrade Completed, and recorded with
//! that status. It reads the cluster's Nodes as the pass observed them, the control
//! planes' static pods (one read), etcd (the etcd gate's reads) and the
//! PodDisruptionBudgets over the machines' Nodes (the preflight's reads); a read that
//! fails is a finding of its own, never a clean audit.

use ichor_upgrade_core::audit::{AuditBudget, AuditEtcd, AuditInput, AuditNode, AuditPod, AuditTarget, Finding, audit};
use ichor_upgrade_core::machine::lifecycle::CORDONED_ANNOTATION;
use ichor_upgrade_core::rollout::EtcdVerdict;

use std::sync::Arc;

use ichor_upgrade_core::machine::removal::is_removed;
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};

use super::gates::gather_etcd_gate;
use super::observe::{Observed, observe_machines};
use super::outcome::kube_call;
use super::view::Pass;
use crate::calls::{Executor, KubeCallError, bounded};
use crate::cause::report;
use crate::kube_api::{Event, EventType};

/// What the audit finds now, for the upgrade of `pass`.
pub(super) async fn findings(pass: &Pass<'_>) -> Vec<Finding> {
    let target = match (pass.kubernetes, pass.target) {
        (Some((target, _)), _) => AuditTarget::Kubernetes(target.clone()),
        (None, Ok(target)) => AuditTarget::Talos(target.version.clone()),
        (None, Err(_)) => AuditTarget::None,
    };
    findings_of(pass.ex, pass.observed, target).await
}

/// The morning-after audit of `cluster` as it stands now, outside any operation: its
/// machines (those not removed) and their Nodes held to the versions the cluster declares
/// (`AuditTarget::Declared`; `AuditTarget::None` where one does not read), with the same
/// reads as the audit at an upgrade's end. It only reads: no write, no Talos call that
/// changes anything. What `kubectl ichor audit` runs.
///
/// # Errors
/// A [`KubeCallError`] when the cluster or its machines cannot be read (`NotFound` for a
/// cluster that does not exist); a read the audit itself needs that fails is a finding.
pub async fn audit_cluster(ex: &Executor<'_>, cluster: &str) -> Result<Vec<Finding>, KubeCallError> {
    let info = kube_call(ex, "read cluster", ex.kube.cluster(cluster)).await?;
    let machines = kube_call(ex, "list machines", ex.kube.machines(cluster)).await?;
    let machines: Vec<Arc<_>> = machines.into_iter().filter(|m| !is_removed(&m.conditions)).collect();
    let observed = observe_machines(ex, machines).await;
    let target =
        match (TalosVersion::parse(&info.release_talos_version), KubernetesVersion::parse(&info.kubernetes_version)) {
            (Ok(talos), Ok(kubernetes)) => AuditTarget::Declared { talos, kubernetes },
            (Ok(talos), Err(_)) => AuditTarget::Talos(talos),
            (Err(_), Ok(kubernetes)) => AuditTarget::Kubernetes(kubernetes),
            (Err(_), Err(_)) => AuditTarget::None,
        };
    Ok(findings_of(ex, &observed, target).await)
}

/// What the audit finds now, of `observed` held to `target`.
async fn findings_of(ex: &Executor<'_>, observed: &[Observed], target: AuditTarget) -> Vec<Finding> {
    let bound = ex.config.call_timeout;
    let mut nodes = Vec::new();
    for observed in observed {
        let Some(node) = observed.node.as_ref() else { continue };
        // A Kubernetes target is on the kubelet, which only the Node's own read shows.
        let kubelet_version = match &target {
            AuditTarget::Kubernetes(_) | AuditTarget::Declared { .. } => {
                match bounded("read a Node's kubelet", bound, ex.kube.node_kubernetes(&node.name)).await {
                    Ok(Ok(Some(read))) => Some(read.kubelet_version),
                    _ => None,
                }
            }
            AuditTarget::Talos(_) | AuditTarget::None => None,
        };
        nodes.push(AuditNode {
            name: node.name.clone(),
            ready: node.ready,
            os_image: Some(node.os_image.clone()),
            kubelet_version,
            unschedulable: node.unschedulable,
            cordoned_by_engine: node.annotations.contains_key(CORDONED_ANNOTATION),
        });
    }
    let pods = match bounded("read the control planes' static pods", bound, ex.kube.control_plane_pods()).await {
        Ok(Ok(read)) => Ok(read
            .into_iter()
            .flat_map(|(node, pods)| {
                pods.into_iter().map(move |(component, pod)| AuditPod {
                    node: node.clone(),
                    name: component.to_string(),
                    crash_looping: pod.crash_looping,
                })
            })
            .collect::<Vec<_>>()),
        Ok(Err(e)) => Err(report(&e)),
        Err(e) => Err(e.to_string()),
    };
    let etcd = match gather_etcd_gate(ex, observed).await.0 {
        EtcdVerdict::Healthy => AuditEtcd::Read { members: Vec::new(), alarms: Vec::new(), unhealthy: None },
        EtcdVerdict::Unhealthy { reason } => {
            AuditEtcd::Read { members: Vec::new(), alarms: Vec::new(), unhealthy: Some(reason) }
        }
        EtcdVerdict::NotChecked => AuditEtcd::NotRead("the etcd gate was not gathered".to_owned()),
    };
    let asked: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let budgets = match bounded("read the cluster's budgets", bound, ex.kube.preflight_facts(&asked)).await {
        Ok(Ok(facts)) => Ok(facts
            .budgets
            .into_iter()
            .map(|b| AuditBudget {
                namespace: b.namespace,
                name: b.name,
                disruptions_allowed: i64::from(b.disruptions_allowed),
                expected_pods: i64::from(b.current_healthy.max(b.desired_healthy)),
            })
            .collect::<Vec<_>>()),
        Ok(Err(e)) => Err(report(&e)),
        Err(e) => Err(e.to_string()),
    };
    let (pods, budgets) = (pods.as_deref().map_err(String::as_str), budgets.as_deref().map_err(String::as_str));
    audit(&AuditInput { target: &target, nodes: &nodes, static_pods: pods, etcd: &etcd, budgets })
}

/// The audit told as Events on the operation: a Warning per finding, or one Normal
/// `Audited` Event for a clean one.
pub(super) fn events(operation: &str, findings: &[Finding]) -> Vec<Event> {
    let event = |type_, reason: &str, message: String| Event {
        kind: "TalosOperation",
        name: operation.to_owned(),
        type_,
        reason: reason.to_owned(),
        message,
    };
    if findings.is_empty() {
        return vec![event(
            EventType::Normal,
            "Audited",
            "the morning-after audit found nothing: no Node left cordoned, no static pod crash-looping, every Node Ready on the target, etcd healthy, no budget at zero".to_owned(),
        )];
    }
    findings.iter().map(|f| event(EventType::Warning, f.reason(), format!("after the upgrade: {f}"))).collect()
}
