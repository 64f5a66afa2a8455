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
use ichor_upgrade_core::kubernetes_plan::Component;
use ichor_upgrade_core::kubernetes_step::{
    KUBERNETES_UPGRADE, KubeletObservation, KubernetesAction, KubernetesFailure, KubernetesStage, KubernetesStepInput,
    apply_message, kubernetes_step, reason,
};
use ichor_upgrade_core::rollout::CallAuthority;
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::talos_step::MachineWait;
use ichor_upgrade_core::versions::KubernetesVersion;

use crate::calls::{AdvanceError, Executor, KubeCallError, TalosCallError, bounded, node_name};
use crate::effects::{self, Grants, Intent};
use crate::kube_api::MachineInfo;
use crate::machine_config::MachineConfig;
use crate::talos_api::{ApplyConfigRequest, ApplyMode};

/// What a Kubernetes upgrade's pass asks of one machine.
#[derive(Debug, Clone, Copy)]
pub struct KubernetesWork<'a> {
    /// The target.
    pub target: &'a KubernetesVersion,
    /// The stage the upgrade is in.
    pub stage: KubernetesStage,
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
            apply(ex, grants, authority, machine, &config, component, &image, work.target).await
        }
        KubernetesAction::RecordApplied { component } => {
            let mut conditions = machine.conditions.clone();
            let message = apply_message(component, work.target);
            let update = ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, reason::APPLIED, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "RecordApplied" })
        }
        KubernetesAction::RecordVerified { component } => {
            let mut conditions = machine.conditions.clone();
            let message = apply_message(component, work.target);
            let update = ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, reason::VERIFIED, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "RecordVerified" })
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

fn unreachable_config(machine: &MachineInfo) {
    tracing::warn!(machine = %machine.name, "an apply without a configuration read: waited on");
}

fn waiting(reason: &str, message: String, ex: &Executor<'_>) -> MachineOutcome {
    MachineOutcome::Waiting { reason: reason.to_owned(), message, recheck_at: Some(ex.retry_at()) }
}

fn failed(failure: &KubernetesFailure) -> MachineOutcome {
    MachineOutcome::Failed { reason: failure.reason().to_owned(), message: failure.to_string() }
}

/// The apply of one component's image: authority, dry run, intent, apply, acknowledgement.
#[allow(clippy::too_many_arguments)]
async fn apply(
    ex: &Executor<'_>,
    grants: &Grants,
    authority: &CallAuthority,
    machine: &MachineInfo,
    config: &MachineConfig,
    component: Component,
    image: &str,
    target: &KubernetesVersion,
) -> Result<MachineOutcome, AdvanceError> {
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
        Ok(Ok(reply)) if reply.mode == ApplyMode::NoReboot => {}
        Ok(Ok(reply)) => {
            return Ok(refused(format!(
                "its dry run says the node would apply it in mode {:?} (a reboot): {}",
                reply.mode, reply.mode_details
            )));
        }
        Ok(Err(error)) if !error.is_unreachable() => {
            return Ok(refused(format!("its dry run was refused: {error}")));
        }
        Ok(Err(error)) => {
            let source = TalosCallError::from(error);
            return Err(AdvanceError::TalosCall { call: "ApplyConfiguration (dry run)", source });
        }
        Err(timed_out) => {
            let source = TalosCallError::from(timed_out);
            return Err(AdvanceError::TalosCall { call: "ApplyConfiguration (dry run)", source });
        }
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
        Ok(Ok(reply)) if reply.mode == ApplyMode::NoReboot => {
            let message = apply_message(component, target);
            let update = ConditionUpdate::new(KUBERNETES_UPGRADE, ConditionStatus::True, reason::APPLIED, message);
            effects::note_condition(ex, machine, &mut conditions, update).await?;
            Ok(MachineOutcome::Progressed { action: "ApplyConfiguration" })
        }
        Ok(Ok(reply)) => Ok(refused(format!(
            "the node answered mode {:?} where NO_REBOOT was asked: {}",
            reply.mode, reply.mode_details
        ))),
        // Refused outright: nothing was applied (the configuration will say so).
        Ok(Err(error)) if !error.is_unreachable() => Ok(refused(error.to_string())),
        // Not known whether it landed: the intent stands; the configuration tells next pass.
        Ok(Err(error)) => {
            Err(AdvanceError::TalosCall { call: "ApplyConfiguration", source: TalosCallError::from(error) })
        }
        Err(timed_out) => {
            Err(AdvanceError::TalosCall { call: "ApplyConfiguration", source: TalosCallError::from(timed_out) })
        }
    }
}
