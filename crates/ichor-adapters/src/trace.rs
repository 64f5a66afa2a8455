//! A rollout's trace: what happened, in time order, one record per change, as JSON lines.
//!
//! The simulator ([`crate::sim`]) writes one of every change of its simulated world (in
//! virtual time), and the operator one of what its engine did and saw on a real cluster (in
//! wall-clock time), both with these records, so that one tool draws either. Each record
//! names the node it is about and its role; records about the operation as a whole, the
//! cluster's APIs or the controller name those instead.

use serde::Serialize;

/// A kind of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceKind {
    /// The machine as it was when the trace began (its role, version and boot ID): one
    /// per machine, first, so that a machine nothing happens to is in the trace too.
    Listed,
    /// The node began pulling the installer image (a legacy Upgrade call pulls before it
    /// answers).
    ImagePullStart,
    /// The installer image is in the node's store.
    ImagePulled,
    /// The node acknowledged an Upgrade call.
    UpgradeCall,
    /// A lifecycle install (`LifecycleService.Upgrade`) began.
    InstallStart,
    /// A lifecycle install ended with exit code 0: the other boot slot holds the target.
    Installed,
    /// The engine cordoned the Node (the lifecycle executor's drain).
    Cordon,
    /// The node took a Reboot call.
    RebootCall,
    /// The engine lifted its cordon.
    Uncordon,
    /// The node went down to reboot.
    RebootStart,
    /// The node booted (with the version it booted).
    RebootEnd,
    /// The Node turned Ready.
    Ready,
    /// The node went down (its kubelet stopped): the truth, which the Node object shows
    /// only later (see [`TraceKind::ShownNotReady`]).
    NotReady,
    /// The Node object turned NotReady, as the controller's cache shows it: after the node
    /// lifecycle controller's grace period and the watch's delay.
    ShownNotReady,
    /// Storage scheduling off and replicas asked to move.
    EvacuationStart,
    /// No replica left on the node.
    Evacuated,
    /// Storage scheduling back on.
    EvacuationEnd,
    /// The node was drained.
    Drain,
    /// An etcd snapshot was streamed from the node (before any control plane's Upgrade
    /// call).
    EtcdSnapshot,
    /// The node's etcd member left the member list.
    EtcdMemberMissing,
    /// The node's etcd member is a voter again.
    EtcdMemberBack,
    /// The machine was recorded converged.
    Converged,
    /// The machine was recorded failed.
    Failed,
    /// The operation paused.
    Paused,
    /// The operation resumed.
    Resumed,
    /// The controller was killed and restarted (the simulator), or began to lead (the
    /// operator, on the row `controller`).
    ControllerRestart,
    /// The node took a graceful Reset call (a removal): it leaves etcd, wipes its disks
    /// and powers off.
    ResetCall,
    /// The node was removed from the cluster.
    Removed,
    /// An Upgrade call broke off on the wire before it reached the node (the call-lost
    /// fault): the engine's intent stays unconfirmed.
    CallLost,
    /// The preflight gate holds the machine back; the message names the blockers (again
    /// when they change).
    PreflightBlocked,
    /// The preflight gate no longer holds the machine back.
    PreflightClear,
    /// The operation waits, for a reason new since the last record.
    Waiting,
    /// The cluster's APIs began refusing every call (the api-outage fault).
    ApiOutage,
    /// The cluster's APIs answer again.
    ApiBack,
    /// The operation was refused (at planning, or its spec): nothing was touched.
    Refused,
    /// A Kubernetes upgrade applied a machine configuration changing one component's image
    /// (`component` names it), with no reboot.
    ConfigApply,
    /// A Kubernetes component changed by an apply runs Ready on its new version
    /// (`component` names it).
    ComponentReady,
    /// A Kubernetes component changed by an apply crash-loops on its new version.
    ComponentCrashLoop,
    /// A control plane's component stops being Ready for reasons of its own (no change
    /// of the engine's: the simulator's `component-down` fault), its Node still Ready.
    ComponentDown,
    /// That component is Ready again.
    ComponentUp,
}

impl TraceKind {
    /// The name the trace file uses, such as `upgrade-call`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Listed => "listed",
            Self::ImagePullStart => "image-pull-start",
            Self::ImagePulled => "image-pulled",
            Self::UpgradeCall => "upgrade-call",
            Self::InstallStart => "install-start",
            Self::Installed => "installed",
            Self::Cordon => "cordon",
            Self::RebootCall => "reboot-call",
            Self::Uncordon => "uncordon",
            Self::RebootStart => "reboot-start",
            Self::RebootEnd => "reboot-end",
            Self::Ready => "ready",
            Self::NotReady => "not-ready",
            Self::ShownNotReady => "shown-not-ready",
            Self::EvacuationStart => "evacuation-start",
            Self::Evacuated => "evacuated",
            Self::EvacuationEnd => "evacuation-end",
            Self::Drain => "drain",
            Self::EtcdSnapshot => "etcd-snapshot",
            Self::EtcdMemberMissing => "etcd-member-missing",
            Self::EtcdMemberBack => "etcd-member-back",
            Self::Converged => "converged",
            Self::Failed => "failed",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::ControllerRestart => "controller-restart",
            Self::ResetCall => "reset-call",
            Self::Removed => "removed",
            Self::CallLost => "call-lost",
            Self::PreflightBlocked => "preflight-blocked",
            Self::PreflightClear => "preflight-clear",
            Self::Waiting => "waiting",
            Self::ApiOutage => "api-outage",
            Self::ApiBack => "api-back",
            Self::Refused => "refused",
            Self::ConfigApply => "config-apply",
            Self::ComponentReady => "component-ready",
            Self::ComponentCrashLoop => "component-crash-loop",
            Self::ComponentDown => "component-down",
            Self::ComponentUp => "component-up",
        }
    }
}

/// One record of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEvent {
    /// Seconds since the start of the trace: virtual in the simulator, wall-clock in the
    /// operator.
    pub t: f64,
    /// The node (for a record about something else: `operation`, `cluster`, `controller`).
    pub node: String,
    /// `control-plane` or `worker` for a node; `operation`, `cluster` or `controller` for a
    /// record about one of those.
    pub role: &'static str,
    /// What happened.
    pub event: TraceKind,
    /// The node's Talos version, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The node's boot ID, where it matters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Why, for failures, pauses, waits and refusals: the CamelCase reason the status
    /// and Events carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The message for people, with the reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Kubernetes component a Kubernetes upgrade's record is about: `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`, `kube-proxy` or `kubelet`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<&'static str>,
    /// For an `evacuation-start`: the bytes on the node that the evacuation moves off it,
    /// where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// One record a change of an operation's status makes: about a machine (by name), or
/// about the operation itself when `machine` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    /// The machine it is about, if one: the newly failed one, or the failed one a pause
    /// or a resume is for.
    pub machine: Option<String>,
    /// `Failed`, `Paused`, `Resumed`, `Refused` or `Waiting`.
    pub event: TraceKind,
    /// The CamelCase reason.
    pub reason: String,
    /// The message for people.
    pub message: String,
}

/// The records the status change from `before` to `after` makes, the same for the
/// simulator and the operator: each machine newly failed; the pause (on the failed
/// machine's row, else the operation's) or the resume; a refusal, or a new reason to wait.
#[must_use]
pub fn status_changes(
    before: &ichor_upgrade_core::rollout::OperationStatus,
    after: &ichor_upgrade_core::rollout::OperationStatus,
) -> Vec<StatusChange> {
    use ichor_upgrade_core::rollout::{OperationStatus, Phase};
    use ichor_upgrade_core::status::RecordState;

    let failed = |s: &OperationStatus, name: &str| s.machines.get(name).is_some_and(|r| r.state == RecordState::Failed);
    let mut changes: Vec<StatusChange> = after
        .machines
        .iter()
        .filter(|(name, _)| failed(after, name) && !failed(before, name))
        .map(|(name, r)| StatusChange {
            machine: Some(name.clone()),
            event: TraceKind::Failed,
            reason: r.reason.clone(),
            message: r.message.clone(),
        })
        .collect();
    let why = |machine: Option<String>, event: TraceKind| StatusChange {
        machine,
        event,
        reason: after.phase.reason().to_owned(),
        message: after.phase.to_string(),
    };
    let paused = |p: &Phase| matches!(p, Phase::Paused(_));
    let failed_machine =
        |s: &OperationStatus| s.machines.iter().find(|(_, r)| r.state == RecordState::Failed).map(|(n, _)| n.clone());
    let subject = || failed_machine(after).or_else(|| failed_machine(before));
    if paused(&after.phase) && !paused(&before.phase) {
        changes.push(why(subject(), TraceKind::Paused));
    } else if paused(&before.phase) && !paused(&after.phase) {
        changes.push(why(subject(), TraceKind::Resumed));
    }
    if before.phase.reason() != after.phase.reason() {
        match &after.phase {
            Phase::Refused(_) => changes.push(why(None, TraceKind::Refused)),
            Phase::Waiting(_) => changes.push(why(None, TraceKind::Waiting)),
            Phase::Pending | Phase::Progressing | Phase::Paused(_) | Phase::Completed => {}
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_with_no_failed_machine_is_the_operations_and_a_new_wait_is_recorded_once() {
        use ichor_upgrade_core::rollout::{OperationStatus, PauseReason, Phase, WaitReason};
        let waiting = OperationStatus { phase: Phase::Waiting(WaitReason::EtcdSnapshotPending), ..Default::default() };
        let changes = status_changes(&OperationStatus::default(), &waiting);
        assert_eq!(
            changes.iter().map(|c| (c.machine.clone(), c.event)).collect::<Vec<_>>(),
            [(None, TraceKind::Waiting)]
        );
        assert_eq!(changes[0].reason, "EtcdSnapshotPending");
        assert!(status_changes(&waiting, &waiting).is_empty(), "the same wait again is no record");
        let paused = OperationStatus {
            phase: Phase::Paused(PauseReason::EtcdSnapshotFailed { reason: "stream cut".to_owned() }),
            ..Default::default()
        };
        let changes = status_changes(&waiting, &paused);
        assert_eq!(
            changes.iter().map(|c| (c.machine.clone(), c.event)).collect::<Vec<_>>(),
            [(None, TraceKind::Paused)]
        );
        assert!(changes[0].message.contains("stream cut"), "{changes:?}");
        let resumed = status_changes(&paused, &OperationStatus::default());
        assert_eq!(resumed.iter().map(|c| c.event).collect::<Vec<_>>(), [TraceKind::Resumed]);
    }

    #[test]
    fn names_are_the_serialized_names() {
        for kind in [
            TraceKind::Listed,
            TraceKind::UpgradeCall,
            TraceKind::InstallStart,
            TraceKind::Installed,
            TraceKind::Cordon,
            TraceKind::RebootCall,
            TraceKind::Uncordon,
            TraceKind::EtcdMemberMissing,
            TraceKind::ControllerRestart,
            TraceKind::Removed,
            TraceKind::CallLost,
            TraceKind::Waiting,
            TraceKind::ApiOutage,
            TraceKind::ApiBack,
            TraceKind::Refused,
            TraceKind::ConfigApply,
            TraceKind::ComponentReady,
            TraceKind::ComponentCrashLoop,
            TraceKind::ComponentDown,
            TraceKind::ComponentUp,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::Value::String(kind.name().to_owned()));
        }
    }

    #[test]
    fn a_record_is_one_flat_object_without_the_fields_it_lacks() {
        let event = TraceEvent {
            t: 1.5,
            node: "cp-1".to_owned(),
            role: "control-plane",
            event: TraceKind::RebootEnd,
            version: Some("v1.14.4".to_owned()),
            boot_id: None,
            reason: None,
            message: None,
            component: None,
            bytes: None,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"t":1.5,"node":"cp-1","role":"control-plane","event":"reboot-end","version":"v1.14.4"}"#
        );
    }
}
