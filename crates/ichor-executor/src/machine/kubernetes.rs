//! `advance_kubernetes`: one pass of a Kubernetes upgrade over one machine.
//!
//! It reads the machine's configuration through the Talos API and its Node and mirror pods
//! through Kubernetes, calls the pure [`kubernetes_step`], and carries out its one action:
//! - an apply: a dry run first, which must say the node applies it with no reboot (a
//!   change that would reboot fails the machine, never applied); then the intent
//!   (`KubernetesUpgrade=Unknown/ApplyRequested`) written on the machine as read; then
//!   `ApplyConfiguration` with mode `NO_REBOOT`; then `Applied` once acknowledged. A call
//!   whose outcome is not known leaves the intent: the next pass reads the configuration,
//!   which says whether it landed;
//! - a record (applied with no call, a change verified between two, or the stage
//!   verified), written on the machine;
//! - a wait or a failure, as an outcome.
//!
//! The apply goes out only under [`CallAuthority::Granted`] in this pass (on a control
//! plane: every other control plane Ready and the etcd gate passed), through
//! [`crate::effects`]. It keeps nothing between passes.

use std::collections::BTreeMap;

use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate};
use ichor_upgrade_core::kubernetes::component::Component;
use ichor_upgrade_core::kubernetes::manifests::{FIELD_MANAGER, ManifestsState};
use ichor_upgrade_core::machine::kubernetes::{
    KUBERNETES_UPGRADE, KubeletObservation, KubernetesAction, KubernetesFailure, KubernetesStage, KubernetesStepInput,
    apply_message, kubernetes_step, reason, retry_record,
};
use ichor_upgrade_core::machine::talos::MachineWait;
use ichor_upgrade_core::rollout::{CallAuthority, CallDenied};
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::versions::KubernetesVersion;

use crate::calls::{AdvanceError, Executor, KubeCallError, TalosCallError, bounded, node_name};
use crate::effects::{self, Grants, Intent};
use crate::kube_api::{AdminKubeconfig, MachineInfo};
use crate::machine_config::MachineConfig;
use crate::talos_api::{ApplyConfigRequest, ApplyMode, TalosError};

/// What a Kubernetes upgrade's pass asks of one machine.
#[derive(Debug, Clone, Copy)]
pub struct KubernetesWork<'a> {
    /// The target.
    pub target: &'a KubernetesVersion,
    /// The stage the upgrade is in.
    pub stage: KubernetesStage,
    /// The oldest kube-apiserver the control planes run, as read in this pass (`None`: not
    /// known; a kubelet or kube-proxy then waits).
    pub api_servers: Option<&'a KubernetesVersion>,
    /// The operation's identity (`namespace/name/uid`), read again between the dry run and
    /// the apply.
    pub operation: &'a str,
}

/// One pass over one machine of a Kubernetes upgrade, under `grants` (the pass advances it;
/// its apply needs the call granted).
///
/// # Errors
/// A read or a write that failed (see [`AdvanceError::is_transient`]).
pub async fn advance_kubernetes(
    ex: &Executor<'_>,
    grants: &Grants,
    authority: &CallAuthority,
    machine: &MachineInfo,
    work: KubernetesWork<'_>,
) -> Result<MachineOutcome, AdvanceError> {
    let bound = ex.config.call_timeout;
    let node = node_name(ex, machine).await?;
    let config = match bounded("read machine config", bound, ex.talos.machine_config(&machine.address)).await {
        Ok(Ok(bytes)) => match MachineConfig::parse(&bytes) {
            Ok(config) => Some(config),
            Err(error) => {
                return Ok(MachineOutcome::Failed {
                    reason: "MachineConfigUnreadable".into(),
                    message: error.to_string(),
                });
            }
        },
        Ok(Err(error)) => {
            tracing::debug!(machine = %machine.name, %error, "machine config unreadable");
            None
        }
        Err(timed_out) => {
            tracing::debug!(machine = %machine.name, %timed_out, "machine config unreadable");
            None
        }
    };
    let seen = bounded("read Node's Kubernetes", bound, ex.kube.node_kubernetes(&node))
        .await
        .map_err(KubeCallError::from)
        .and_then(|r| r.map_err(KubeCallError::from))
        .map_err(|source| AdvanceError::ReadNode { node: node.clone(), source })?;
    let kubelet = seen
        .as_ref()
        .map(|n| KubeletObservation { version: KubernetesVersion::parse(&n.kubelet_version).ok(), ready: n.ready });
    let pods = seen.map(|n| n.static_pods).unwrap_or_default();
    let images: Option<BTreeMap<Component, String>> = config.as_ref().map(MachineConfig::images);
    let action = kubernetes_step(&KubernetesStepInput {
        stage: work.stage,
        role: machine.role,
        kube_proxy: config.as_ref().is_some_and(MachineConfig::kube_proxy_enabled),
        target: work.target,
        conditions: &machine.conditions,
        config: images.as_ref(),
        pods: &pods,
        kubelet: kubelet.as_ref(),
        api_servers: work.api_servers,
        stopped: stopped(authority),
        timeouts: &ex.config.kubernetes,
        now: ex.clock.now(),
    });
    tracing::debug!(machine = %machine.name, ?action, "kubernetes step");
    match action {
        KubernetesAction::Apply { component, image } => {
            let Some(config) = config else {
                unreachable_config(machine);
                return Ok(waiting("MachineConfigUnreadable", "its machine configuration was not read".into(), ex));
            };
            apply(ex, grants, authority, machine, &config, (component, &image), work, &node).await
        }
        KubernetesAction::RecordApplied { component } | KubernetesAction::RecordVerified { component } => {
            let (why, action) = if matches!(action, KubernetesAction::RecordApplied { .. }) {
                (reason::APPLIED, "RecordApplied")
            } else {
                (reason::VERIFIED, "RecordVerified")
            };
            let mut conditions = machine.conditions.clone();
            let message = apply_message(component, work.target);
            let update = ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, why, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action })
        }
        KubernetesAction::CloseIntent { component } => {
            let why = match authority {
                CallAuthority::Denied(denied) => denied.to_string(),
                CallAuthority::Granted | CallAuthority::NeedsEtcdGate | CallAuthority::NeedsPreflight => {
                    "the machine is stopped".to_owned()
                }
            };
            let message = format!(
                "the apply of {} never reached the node (its configuration does not hold it); closed, nothing changed: {why}",
                apply_message(component, work.target)
            );
            let mut conditions = machine.conditions.clone();
            let update = ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::False, reason::NOT_APPLIED, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "CloseIntent" })
        }
        KubernetesAction::Converged { reason } => {
            let mut conditions = machine.conditions.clone();
            let update =
                ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, reason, work.target.to_string());
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Converged)
        }
        KubernetesAction::Wait { reason, recheck_at } => {
            Ok(MachineOutcome::Waiting { reason: reason.reason().to_owned(), message: reason.to_string(), recheck_at })
        }
        KubernetesAction::Fail(failure) => Ok(failed(&failure)),
    }
}

/// A resume of a machine that failed in a Kubernetes upgrade to `target`: its failed
/// attempt is closed ([`ichor_upgrade_core::machine::kubernetes::retry_record`]), so that the
/// retry starts from the node's configuration with fresh bounds, never from the old
/// record's clock or its verdict on a configuration someone changed.
///
/// # Errors
/// The condition write that failed.
pub async fn reset_for_retry(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    target: &KubernetesVersion,
) -> Result<(), AdvanceError> {
    let Some((status, why, message)) = retry_record(machine.role, &machine.conditions, target) else {
        return Ok(());
    };
    let mut conditions = machine.conditions.clone();
    effects::note_condition(
        ex,
        machine,
        &mut conditions,
        ConditionUpdate::new(KUBERNETES_UPGRADE, status, why, message),
    )
    .await
}

/// Whether the pass may make no change on the machine for a stop (DESIGN §3.11): a hold, a
/// pause, a deletion or a refusal. A gate that fails (another control plane, etcd) is no
/// stop: the machine waits for it.
fn stopped(authority: &CallAuthority) -> bool {
    match authority {
        CallAuthority::Denied(denied) => match denied {
            CallDenied::Held | CallDenied::Paused | CallDenied::Deleting | CallDenied::Refused => true,
            CallDenied::LockNotHeld
            | CallDenied::NotInCluster
            | CallDenied::ControlPlaneNotReady { .. }
            | CallDenied::ControlPlaneComponentsNotReady { .. }
            | CallDenied::EtcdUnhealthy { .. }
            | CallDenied::EtcdSnapshotMissing
            | CallDenied::GateSpent { .. }
            | CallDenied::PreflightBlocked { .. } => false,
        },
        CallAuthority::Granted | CallAuthority::NeedsEtcdGate | CallAuthority::NeedsPreflight => false,
    }
}

fn unreachable_config(machine: &MachineInfo) {
    tracing::warn!(machine = %machine.name, "an apply without a configuration read: waited on");
}

fn waiting(reason: &str, message: String, ex: &Executor<'_>) -> MachineOutcome {
    MachineOutcome::Waiting { reason: reason.to_owned(), message, recheck_at: Some(ex.retry_at()) }
}

fn failed(failure: &KubernetesFailure) -> MachineOutcome {
    MachineOutcome::Failed { reason: failure.reason().to_owned(), message: failure.to_string() }
}

/// The apply of one component's image: authority, dry run, a fresh read that still
/// authorises it, intent, apply, acknowledgement.
#[allow(clippy::too_many_arguments)]
async fn apply(
    ex: &Executor<'_>,
    grants: &Grants,
    authority: &CallAuthority,
    machine: &MachineInfo,
    config: &MachineConfig,
    (component, image): (Component, &str),
    work: KubernetesWork<'_>,
    node: &str,
) -> Result<MachineOutcome, AdvanceError> {
    let target = work.target;
    match authority {
        CallAuthority::Granted => {}
        CallAuthority::NeedsEtcdGate | CallAuthority::NeedsPreflight => {
            // The pass gathers the gate and asks again (`reconcile::authorise_due`).
            let wait = MachineWait::EtcdGateNotChecked;
            return Ok(MachineOutcome::Waiting {
                reason: wait.reason().to_owned(),
                message: format!("the apply of {component} waits for the etcd gate"),
                recheck_at: None,
            });
        }
        CallAuthority::Denied(denied) => {
            return Ok(MachineOutcome::Waiting {
                reason: denied.reason().to_owned(),
                message: format!("the apply of {component} is not authorised in this pass: {denied}"),
                recheck_at: None,
            });
        }
    }
    let calling = grants.calling("ApplyConfiguration")?;
    let refused = |detail: String| failed(&KubernetesFailure::ApplyRefused { component, detail });
    let data = match config.with_image(component, image).and_then(|next| next.to_yaml()) {
        Ok(data) => data,
        Err(error) => return Ok(refused(error.to_string())),
    };
    let dry = ApplyConfigRequest { data: data.clone(), mode: ApplyMode::NoReboot, dry_run: true };
    match effects::dry_run_configuration(ex, &grants.advancing, machine, &dry).await? {
        Ok(reply) if reply.mode == ApplyMode::NoReboot => {}
        Ok(reply) => {
            return Ok(refused(format!(
                "its dry run says the node would apply it in mode {:?} (a reboot): {}",
                reply.mode, reply.mode_details
            )));
        }
        Err(TalosCallError::Api(error)) if !error.is_unreachable() => {
            return Ok(refused(format!("its dry run was refused: {error}")));
        }
        Err(source) => return Err(AdvanceError::TalosCall { call: "ApplyConfiguration (dry run)", source }),
    }
    // The dry run took a call's time since the pass read the operation: a stop recorded
    // meanwhile (a pause, a hold, a deletion) is seen before the apply, never after it.
    if let Err(why) = effects::still_authorised(ex, work.operation, &machine.name, Some(node), false).await {
        tracing::info!(machine = %machine.name, %why, "the apply is not made: a fresh read no longer authorises it");
        return Ok(MachineOutcome::Waiting {
            reason: reason::STOPPED_BEFORE_APPLY.to_owned(),
            message: format!("the apply of {component} was not made: {why}"),
            recheck_at: None,
        });
    }
    let mut conditions = machine.conditions.clone();
    let intent = Intent {
        condition: KUBERNETES_UPGRADE,
        status: ConditionStatus::Unknown,
        reason: reason::APPLY_REQUESTED,
        message: apply_message(component, target),
    };
    let recorded = effects::record(ex, calling, machine, &mut conditions, intent).await?;
    let request = ApplyConfigRequest { data, mode: ApplyMode::NoReboot, dry_run: false };
    match effects::apply_configuration(ex, calling, &recorded, machine, &request).await? {
        Ok(reply) if reply.mode == ApplyMode::NoReboot => {
            let message = apply_message(component, target);
            let update = ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, reason::APPLIED, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "ApplyConfiguration" })
        }
        Ok(reply) => Ok(refused(format!(
            "the node answered mode {:?} where NO_REBOOT was asked: {}",
            reply.mode, reply.mode_details
        ))),
        // Refused outright: nothing was applied (the configuration will say so).
        Err(TalosCallError::Api(error)) if !error.is_unreachable() => Ok(refused(error.to_string())),
        // Not known whether it landed: the intent stands; the configuration tells next pass.
        Err(source) => Err(AdvanceError::TalosCall { call: "ApplyConfiguration", source }),
    }
}

/// A Kubernetes upgrade's last step ([`ichor_upgrade_core::kubernetes::manifests`]): the
/// bootstrap manifests and the admin kubeconfig read from the first of `control_planes`
/// whose Talos API answers, then each object applied server-side under Talos's field
/// manager, in order, in a session under that admin kubeconfig (as `talosctl upgrade-k8s`
/// does: the operator's own identity holds no grant to write them), Secrets included.
/// The kubeconfig lives in memory for this call only.
/// Its record, for the status: applied, or failed naming the object the API server
/// refused (a refusal retrying will not fix; the operation pauses).
///
/// Called only when the pass's decision asks for it (under the lock, every machine
/// through). Applied again after a crash before its record, it changes nothing.
///
/// # Errors
/// No control plane's manifests could be read, or an apply failed in a way retrying can
/// fix: the next pass applies them again.
pub async fn apply_manifests(
    ex: &Executor<'_>,
    control_planes: &[&MachineInfo],
    target: &KubernetesVersion,
) -> Result<ManifestsState, AdvanceError> {
    let bound = ex.config.call_timeout;
    let failed = |reason: String| ManifestsState::Failed { target: target.to_string(), reason, at: ex.clock.now() };
    let mut last = None;
    let mut read = None;
    for machine in control_planes {
        let error = match read_from(ex, &machine.address).await {
            Ok(both) => {
                read = Some((machine.name.as_str(), both));
                break;
            }
            Err(error) => error,
        };
        tracing::debug!(machine = %machine.name, %error, "bootstrap manifests or admin kubeconfig unreadable");
        last = Some((machine.name.clone(), error));
    }
    let Some((source, (objects, kubeconfig))) = read else {
        return match last {
            // Every control plane answered, and refused: a person must look.
            Some((machine, error)) if !error.is_unreachable() => Ok(failed(format!(
                "reading the bootstrap manifests and the admin kubeconfig (a talosconfig of role os:admin) \
                 from {machine}: {error}"
            ))),
            Some((_, source)) => Err(AdvanceError::TalosCall { call: "COSI List Manifests", source }),
            None => Ok(failed("no control plane to read the bootstrap manifests from".to_owned())),
        };
    };
    let session = match bounded("make the manifests' session", bound, ex.kube.manifest_session(kubeconfig)).await {
        Ok(Ok(session)) => session,
        Ok(Err(error)) if !error.is_transient() => {
            return Ok(failed(format!("a session under the admin kubeconfig of {source}: {error}")));
        }
        Ok(Err(error)) => {
            return Err(AdvanceError::KubeCall { call: "make the manifests' session", source: error.into() });
        }
        Err(timed_out) => {
            return Err(AdvanceError::KubeCall { call: "make the manifests' session", source: timed_out.into() });
        }
    };
    // Every object Talos lists is applied, its own and the cluster's inline and extra
    // manifests alike, Secrets included, as `talosctl upgrade-k8s` applies them
    // (decision 0014 rules 18 and 19: under the admin kubeconfig, which may write them).
    for object in &objects {
        let name = object_name(object);
        match bounded("apply a bootstrap manifest", bound, session.apply(object, FIELD_MANAGER)).await {
            Ok(Ok(())) => tracing::debug!(object = %name, "bootstrap manifest applied"),
            Ok(Err(error)) if !error.is_transient() => return Ok(failed(format!("{name}: {error}"))),
            Ok(Err(error)) => {
                return Err(AdvanceError::KubeCall { call: "apply a bootstrap manifest", source: error.into() });
            }
            Err(timed_out) => {
                return Err(AdvanceError::KubeCall { call: "apply a bootstrap manifest", source: timed_out.into() });
            }
        }
    }
    // Its DaemonSets and Deployments must roll out before the upgrade completes.
    let workloads = objects
        .iter()
        .filter(|o| matches!(o.get("kind").and_then(serde_json::Value::as_str), Some("DaemonSet" | "Deployment")))
        .map(object_name)
        .collect();
    Ok(ManifestsState::Applied {
        target: target.to_string(),
        objects: objects.len(),
        at: ex.clock.now(),
        workloads,
        rolled_out: false,
        progress: 0,
        progress_at: None,
    })
}

/// The bootstrap manifests and the admin kubeconfig of the control plane at `address`,
/// each read under the call bound.
async fn read_from(
    ex: &Executor<'_>,
    address: &str,
) -> Result<(Vec<serde_json::Value>, AdminKubeconfig), TalosCallError> {
    let bound = ex.config.call_timeout;
    let objects = bounded("read the bootstrap manifests", bound, ex.talos.bootstrap_manifests(address)).await??;
    let bytes = bounded("read the admin kubeconfig", bound, ex.talos.admin_kubeconfig(address)).await??;
    AdminKubeconfig::new(bytes)
        .map(|kubeconfig| (objects, kubeconfig))
        .map_err(|e| TalosCallError::from(TalosError::Answered { code: "DataLoss".to_owned(), message: e.to_string() }))
}

/// `Kind namespace/name` (or `Kind name`) of an object: how the manifests' objects and
/// workloads are named, in records and for people.
#[must_use]
pub fn object_name(object: &serde_json::Value) -> String {
    let field = |path: &[&str]| {
        path.iter().try_fold(object, |v, k| v.get(k)).and_then(serde_json::Value::as_str).unwrap_or("?").to_owned()
    };
    match object.pointer("/metadata/namespace").and_then(serde_json::Value::as_str) {
        Some(namespace) => format!("{} {namespace}/{}", field(&["kind"]), field(&["metadata", "name"])),
        None => format!("{} {}", field(&["kind"]), field(&["metadata", "name"])),
    }
}
