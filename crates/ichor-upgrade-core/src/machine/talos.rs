//! The Talos upgrade executor's step (ADR 0043): for one machine, from what was observed,
//! exactly one [`Action`].
//!
//! # Calling protocol
//! The driver observes the machine (its Node, the Talos API's answer, the `TalosUpgrade`
//! and `StorageEvacuation` conditions, storage, and on a control plane past its Upgrade
//! call its etcd membership), calls [`step`] with `now`, carries out the one action, and
//! observes again before the next step. Calling twice on the same observation gives the
//! same action, so a driver restarted at any instant resumes where it was.
//!
//! # The Upgrade call and the crash window
//! ADR 0043 sets `TalosUpgrade` after the acknowledged call; a controller killed between
//! the acknowledgement and that write would not know the call was made. So the driver
//! writes an intent first ([`Action::Upgrade`]): `TalosUpgrade=Unknown` with the
//! [`UpgradeMarker`], then the call, then `True` on the acknowledgement. An intent found
//! later is reconciled against the node, never re-sent blindly (see
//! `docs/decisions/0003-upgrade-intent.md`):
//! - the boot ID changed: the call was acknowledged; the version then tells an upgrade
//!   from an A/B fallback, which is a failure, never converged;
//! - the node's Talos stage shows an upgrade under way: acknowledged, wait;
//! - neither, before the call's deadline: a call may still be in flight, wait;
//! - neither, after the deadline: gRPC carried the deadline to the node, so no call made
//!   under this intent can be acknowledged any more; the intent is void and is closed
//!   ([`Action::CloseVoidIntent`]). The next observation decides as if there were none:
//!   every pre-call check again, and the call only with the authority of that pass. Until
//!   it is closed, the engine counts the machine as past its call (never interrupted); once
//!   closed, a pause, a hold or a deletion stops it like any machine before its call.
//!
//! Terminal results: [`Action::Converged`] (nothing left to do) and [`Action::Fail`] /
//! [`Action::FailEndingEvacuation`] (the operation pauses; a person resumes).

use std::fmt;
use std::time::Duration;

use crate::conditions::{ConditionStatus, Conditions};
use crate::evacuation::{EvacuationState, StorageObservation, evacuation_state};
use crate::machine::vocabulary::MachineRole;
use crate::machine::vocabulary::{
    EtcdMembership, InstallExit, MachineSpec, MachineStage, NodeObservation, StepTimeouts, TALOS_LIFECYCLE,
    TalosObservation, lifecycle_in_flight,
};
use crate::rollout::{CallAuthority, CallDenied};
use crate::time::Timestamp;
use crate::upgrade_marker::{
    MarkerError, MarkerRef, TALOS_UPGRADE, UpgradeMarker, is_valid_boot_id, is_valid_node_name,
};
use crate::versions::{
    KubernetesVersion, PairingRefusal, PathRefusal, TalosVersion, check_kubernetes_pairing, check_upgrade_path,
};

/// The Image Factory that builds installer images.
pub const FACTORY: &str = "factory.talos.dev";

/// The installer image for a platform, schematic and version:
/// `factory.talos.dev/<platform>-installer/<schematic>:<version>`.
#[must_use]
pub fn installer_image(platform: &str, schematic: &str, version: &TalosVersion) -> String {
    format!("{FACTORY}/{platform}-installer/{schematic}:{version}")
}

/// What the machine is upgraded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeTarget {
    /// The target Talos version.
    pub version: TalosVersion,
    /// The cluster spec's schematic ID, if it names one.
    pub schematic: Option<String>,
    /// The Image Factory platform, such as `metal` or `aws`.
    pub platform: String,
    /// The cluster's Kubernetes version, as written.
    pub kubernetes_version: String,
}

/// Everything [`step`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// The machine.
    pub machine: &'a MachineSpec,
    /// The target.
    pub target: &'a UpgradeTarget,
    /// Its Node, if it exists.
    pub node: Option<&'a NodeObservation>,
    /// The Talos API's answer.
    pub talos: &'a TalosObservation,
    /// The machine's conditions (`TalosUpgrade`, `StorageEvacuation`).
    pub conditions: &'a Conditions,
    /// Storage's view of the node.
    pub storage: &'a StorageObservation,
    /// On a control plane, its etcd membership; `None` when not gathered.
    pub etcd_member: Option<&'a EtcdMembership>,
    /// Whether an Upgrade call may go out in this pass, as the rollout engine computed it
    /// in this same pass ([`crate::rollout::call_authority`]). Without
    /// [`CallAuthority::Granted`] the step never returns [`Action::Upgrade`].
    pub authority: &'a CallAuthority,
    /// The bounds.
    pub timeouts: &'a StepTimeouts,
    /// The current time.
    pub now: Timestamp,
}

/// The one thing to do for a machine.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The machine is on the target, verified, with no upgrade in flight and no
    /// evacuation open. Nothing to write.
    Converged,
    /// Verification passed: end the machine's evacuation if one is open (storage
    /// scheduling back on) and write `TalosUpgrade=False/Converged` with
    /// `StorageEvacuation=False/Ended` in one write, closing the upgrade; the next
    /// observation gives [`Action::Converged`].
    RecordConverged,
    /// Nothing to do yet. Observe again when something changes or at `recheck_at`.
    Wait {
        /// Why.
        reason: MachineWait,
        /// When to look again at the latest, if a deadline is known.
        recheck_at: Option<Timestamp>,
    },
    /// Disable storage scheduling on the node and ask the backend to move its replicas, in
    /// the backend's one write that also keeps the evacuation's record
    /// ([`EvacuationRecord`](crate::evacuation::EvacuationRecord)); the driver shows the
    /// step `StorageEvacuation=True/Evacuating` from that record until the next write of
    /// the conditions carries it.
    BeginEvacuation,
    /// Re-enable storage scheduling and write `StorageEvacuation=False/Ended`.
    EndEvacuation,
    /// Write `TalosUpgrade=Unknown/UpgradeIntent` with the marker; if that write is
    /// confirmed, call Upgrade with `image` (neither force nor preserve) under its own
    /// bound; on the acknowledgement write `TalosUpgrade=True/UpgradeRequested` with the
    /// same marker. An answered error: `TalosUpgrade=False/UpgradeRefused` and a failure.
    /// A transport error: leave the intent for the next observation. The bound passing:
    /// leave the intent and fail (the node abandoned the call at the propagated deadline;
    /// if it acknowledged at the very edge, the intent still catches its reboot).
    Upgrade {
        /// The installer image.
        image: String,
        /// What `TalosUpgrade` records.
        marker: UpgradeMarker,
    },
    /// The intent's call can no longer be acknowledged (its deadline passed with no sign of
    /// it on the node): write `TalosUpgrade=False/IntentVoid`. The next observation decides
    /// as if there had been no intent.
    CloseVoidIntent,
    /// The machine failed: the operation pauses.
    Fail(MachineFailure),
    /// The evacuation timed out: re-enable storage scheduling, write
    /// `StorageEvacuation=False/TimedOut`, then fail; never proceed.
    FailEndingEvacuation(MachineFailure),
}

/// Why a machine waits. Transient: the step moves on by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineWait {
    /// The Node does not exist (yet, or while it re-registers).
    NodeMissing,
    /// The Node is not Ready.
    NodeNotReady,
    /// Kubelet has not reported a usable boot ID; a reboot could not be detected.
    BootIdUnknown,
    /// Replicas are still moving off the node.
    Evacuating {
        /// Replicas left, if known.
        replicas_left: Option<u32>,
    },
    /// The Talos API did not answer (before the call: the call cannot be made).
    TalosApiUnreachable,
    /// The machine is busy with something else (a stage other than Running).
    MachineBusy {
        /// Its stage.
        stage: MachineStage,
    },
    /// After the call: the Talos API does not answer; the node is rebooting.
    Rebooting,
    /// After the acknowledged call: the boot ID has not changed yet.
    NotRebootedYet,
    /// An unconfirmed intent, and the node shows the upgrade under way: it was acknowledged.
    UpgradeUnderWay,
    /// An unconfirmed intent, before the call's deadline: a call may still be in flight.
    IntentUnconfirmed,
    /// After the reboot, on a control plane: its etcd member is missing.
    EtcdMemberMissing,
    /// After the reboot, on a control plane: its etcd member is still a learner.
    EtcdMemberLearner,
    /// After the reboot, on a control plane: the member list could not be read.
    EtcdMemberUnknown,
    /// Ready for the Upgrade call, but it is not authorised in this pass.
    CallNotAuthorised(CallDenied),
    /// Ready for the Upgrade call of a control plane; the etcd gate is to be gathered in
    /// this pass before it may go out.
    EtcdGateNotChecked,
    /// Ready for the first call (the Upgrade call, the install); the preflight gate is to
    /// be judged again in this pass, about its node and those down with it, before it may
    /// go out.
    PreflightNotChecked,
    /// Lifecycle executor: the node answers that an install is already under way.
    InstallUnderWay,
    /// Lifecycle executor: pods evicted by the drain are still terminating (or the pods
    /// were not read yet).
    Draining {
        /// How many.
        terminating: usize,
    },
    /// Lifecycle executor: a PodDisruptionBudget refused an eviction (HTTP 429); retried.
    EvictionBlocked {
        /// The pod.
        pod: String,
    },
    /// Lifecycle executor: a reboot was asked for and the node shows no sign of it yet.
    RebootUnconfirmed,
}

impl MachineWait {
    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NodeMissing => "NodeMissing",
            Self::NodeNotReady => "NodeNotReady",
            Self::BootIdUnknown => "BootIdUnknown",
            Self::Evacuating { .. } => "Evacuating",
            Self::TalosApiUnreachable => "TalosApiUnreachable",
            Self::MachineBusy { .. } => "MachineBusy",
            Self::Rebooting => "Rebooting",
            Self::NotRebootedYet => "NotRebootedYet",
            Self::UpgradeUnderWay => "UpgradeUnderWay",
            Self::IntentUnconfirmed => "IntentUnconfirmed",
            Self::EtcdMemberMissing => "EtcdMemberMissing",
            Self::EtcdMemberLearner => "EtcdMemberLearner",
            Self::EtcdMemberUnknown => "EtcdMemberUnknown",
            Self::CallNotAuthorised(_) => "CallNotAuthorised",
            Self::EtcdGateNotChecked => "EtcdGateNotChecked",
            Self::PreflightNotChecked => "PreflightNotChecked",
            Self::InstallUnderWay => "InstallUnderWay",
            Self::Draining { .. } => "Draining",
            Self::EvictionBlocked { .. } => "EvictionBlocked",
            Self::RebootUnconfirmed => "RebootUnconfirmed",
        }
    }
}

/// Why a machine failed. The operation pauses until a person resumes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineFailure {
    /// The Node's osImage is not `Talos (vX.Y.Z)`.
    #[error("node status.nodeInfo.osImage: {0}")]
    BadOsImage(String),
    /// The cluster's Kubernetes version does not parse.
    #[error("cluster Kubernetes version: {0}")]
    BadKubernetesVersion(String),
    /// The upgrade path is refused.
    #[error("upgrade path refused: {0}")]
    UpgradePath(PathRefusal),
    /// The Kubernetes version does not run on the target.
    #[error("Kubernetes pairing refused: {0}")]
    KubernetesPairing(PairingRefusal),
    /// Neither the cluster spec nor the Node names a schematic.
    #[error(
        "no schematic: the cluster spec names none and the Node has no extensions.talos.dev/schematic annotation; the vanilla schematic is never assumed"
    )]
    NoSchematic,
    /// The schematic or platform cannot form an installer image reference.
    #[error("installer image: {0}")]
    BadImageReference(String),
    /// The evacuation did not finish in time.
    #[error("storage evacuation timed out after {timeout:?} with {} replicas left", replicas_left.map_or("unknown".to_owned(), |n| n.to_string()))]
    EvacuationTimedOut {
        /// Replicas left, if known.
        replicas_left: Option<u32>,
        /// The timeout.
        timeout: Duration,
    },
    /// The `TalosUpgrade` message is not a marker.
    #[error("{0}")]
    GarbledMarker(MarkerError),
    /// `TalosUpgrade` records an upgrade in flight to another version.
    #[error(
        "TalosUpgrade {text:?} records an unfinished upgrade to {recorded}, not {target}; a person must look at this machine"
    )]
    MarkerForOtherTarget {
        /// The marker's target.
        recorded: TalosVersion,
        /// This operation's target.
        target: TalosVersion,
        /// The condition's message as found.
        text: String,
    },
    /// The node rebooted on a version other than the target: the A/B slot fell back.
    #[error("A/B fallback: the node rebooted (boot ID {before} -> {after}) into {booted}, not {target}; not retried")]
    AbFallback {
        /// The version it booted.
        booted: TalosVersion,
        /// The target.
        target: TalosVersion,
        /// Boot ID before the call.
        before: String,
        /// Boot ID now.
        after: String,
    },
    /// The Talos API answered with an error before the call.
    #[error("Talos API error: {0}")]
    TalosApi(String),
    /// The node refused the Upgrade call (set by the driver).
    #[error("the Upgrade call was refused: {0}")]
    UpgradeRefused(String),
    /// The Upgrade call outlived its own bound; the node did not start an upgrade (set by
    /// the driver).
    #[error("the Upgrade call did not answer within its bound of {0:?}")]
    UpgradeCallTimedOut(Duration),
    /// The `TalosLifecycle` message is not a marker.
    #[error("TalosLifecycle: {0}")]
    GarbledLifecycleMarker(MarkerError),
    /// The `TalosLifecycle` condition records no phase of the lifecycle executor.
    #[error("{text}; a person must look at this machine")]
    LifecycleRecord {
        /// What was found.
        text: String,
    },
    /// The lifecycle executor was chosen for a node whose Talos does not serve it.
    #[error(
        "the node runs Talos {running}, which does not serve LifecycleService (Talos 1.13 and later); use the legacy executor"
    )]
    LifecycleUnsupported {
        /// The version it runs.
        running: TalosVersion,
    },
    /// The installer image could not be pulled (an answered error).
    #[error("pulling the installer image: {0}")]
    PullFailed(String),
    /// The installer ended with a non-zero exit code.
    #[error("the installer exited with code {} ({}): {output}", exit.code(), exit.meaning())]
    Install {
        /// How it ended.
        exit: InstallExit,
        /// Its last lines of output.
        output: String,
    },
    /// The node refused the install or the reboot call (an answered error).
    #[error("the {call} call was refused: {message}")]
    LifecycleCallRefused {
        /// `LifecycleService.Upgrade` or `Reboot`.
        call: &'static str,
        /// The answer.
        message: String,
    },
    /// An install recorded as failed (`TalosLifecycle=False/InstallFailed`), until resumed.
    #[error("{message}")]
    InstallFailedEarlier {
        /// The failure as recorded.
        message: String,
    },
    /// The drain did not finish within its bound.
    #[error("the drain did not finish within {timeout:?}: {pods_left} pods left{}", first.as_ref().map(|p| format!(" (first: {p})")).unwrap_or_default())]
    DrainTimedOut {
        /// The bound.
        timeout: Duration,
        /// Pods left to evict or terminating.
        pods_left: usize,
        /// The first pod left to evict, if any.
        first: Option<String>,
    },
    /// The machine was not verified on the target within the verify bound.
    #[error("not verified on {target} within {timeout:?} of the Upgrade call: {waiting}")]
    NotVerifiedInTime {
        /// The target.
        target: TalosVersion,
        /// The bound.
        timeout: Duration,
        /// What it was still waiting for.
        waiting: &'static str,
    },
}

impl MachineFailure {
    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadOsImage(_) => "BadOsImage",
            Self::BadKubernetesVersion(_) => "BadKubernetesVersion",
            Self::UpgradePath(_) => "UpgradePathRefused",
            Self::KubernetesPairing(_) => "KubernetesPairingRefused",
            Self::NoSchematic => "NoSchematic",
            Self::BadImageReference(_) => "BadImageReference",
            Self::EvacuationTimedOut { .. } => "EvacuationTimedOut",
            Self::GarbledMarker(_) => "GarbledUpgradeMarker",
            Self::MarkerForOtherTarget { .. } => "UpgradeMarkerForOtherTarget",
            Self::AbFallback { .. } => "AbFallback",
            Self::TalosApi(_) => "TalosApiError",
            Self::UpgradeRefused(_) => "UpgradeRefused",
            Self::UpgradeCallTimedOut(_) => "UpgradeCallTimedOut",
            Self::NotVerifiedInTime { .. } => "NotVerifiedInTime",
            Self::GarbledLifecycleMarker(_) => "GarbledLifecycleMarker",
            Self::LifecycleRecord { .. } => "LifecycleRecordUnknown",
            Self::LifecycleUnsupported { .. } => "LifecycleUnsupported",
            Self::PullFailed(_) => "PullFailed",
            Self::Install { exit, .. } => exit.reason(),
            Self::LifecycleCallRefused { .. } => "LifecycleCallRefused",
            Self::DrainTimedOut { .. } => "DrainTimedOut",
            Self::InstallFailedEarlier { .. } => "InstallFailed",
        }
    }
}

impl fmt::Display for MachineWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeMissing => f.write_str("the Node does not exist"),
            Self::NodeNotReady => f.write_str("the Node is not Ready"),
            Self::BootIdUnknown => f.write_str("the Node reports no usable boot ID"),
            Self::Evacuating { replicas_left: Some(n) } => write!(f, "evacuating storage: {n} replicas left"),
            Self::Evacuating { replicas_left: None } => f.write_str("evacuating storage"),
            Self::TalosApiUnreachable => f.write_str("the Talos API does not answer"),
            Self::MachineBusy { stage } => write!(f, "the machine is busy ({stage:?})"),
            Self::Rebooting => f.write_str("rebooting: the Talos API does not answer"),
            Self::NotRebootedYet => f.write_str("the Upgrade call was acknowledged; the node has not rebooted yet"),
            Self::UpgradeUnderWay => f.write_str("the node shows the upgrade under way"),
            Self::IntentUnconfirmed => f.write_str("an Upgrade call may still be in flight; waiting for its deadline"),
            Self::EtcdMemberMissing => f.write_str("the etcd member is not in the member list yet"),
            Self::EtcdMemberLearner => f.write_str("the etcd member is still a learner"),
            Self::EtcdMemberUnknown => f.write_str("the etcd member list could not be read"),
            Self::CallNotAuthorised(denied) => write!(f, "the Upgrade call waits: {denied}"),
            Self::EtcdGateNotChecked => f.write_str("the Upgrade call waits for the etcd gate"),
            Self::PreflightNotChecked => f.write_str("the Upgrade call waits for the preflight gate"),
            Self::InstallUnderWay => f.write_str("the node is already running an install"),
            Self::Draining { terminating } => write!(f, "draining: {terminating} pods still terminating"),
            Self::EvictionBlocked { pod } => {
                write!(f, "draining: a PodDisruptionBudget refuses the eviction of {pod} for now")
            }
            Self::RebootUnconfirmed => f.write_str("a reboot was asked for; the node shows no sign of it yet"),
        }
    }
}

/// Decides the one action for a machine. Pure: the same input gives the same action.
pub fn step(input: &StepInput<'_>) -> Action {
    let in_flight = input.conditions.get(TALOS_UPGRADE).filter(|c| c.status != ConditionStatus::False);
    let Some(condition) = in_flight else { return before_call(input) };
    let marker = match MarkerRef::parse(&condition.message) {
        Ok(marker) => marker,
        Err(e) => return Action::Fail(MachineFailure::GarbledMarker(e)),
    };
    if marker.target != input.target.version {
        return Action::Fail(MachineFailure::MarkerForOtherTarget {
            recorded: marker.target,
            target: input.target.version.clone(),
            text: condition.message.clone(),
        });
    }
    let since = condition.last_transition_time.min(input.now);
    let acknowledged = condition.status == ConditionStatus::True;
    after_call(input, &marker, acknowledged, since)
}

pub(crate) fn wait(reason: MachineWait, recheck_at: Option<Timestamp>) -> Action {
    Action::Wait { reason, recheck_at }
}

/// A wait on something no watch reports: looked at again at the next tick of the poll
/// interval, or at the wait's own deadline if that is sooner. The ticks are on a grid of
/// the interval (multiples of it since the epoch), so that every machine polling at once
/// shares one pass instead of each costing its own.
pub(crate) fn polled(input: &StepInput<'_>, reason: MachineWait, deadline: Option<Timestamp>) -> Action {
    polled_every(input, input.timeouts.poll, reason, deadline)
}

/// As [`polled`], on a grid of `interval`.
pub(crate) fn polled_every(
    input: &StepInput<'_>,
    interval: Duration,
    reason: MachineWait,
    deadline: Option<Timestamp>,
) -> Action {
    wait(reason, Timestamp::min_opt(deadline, Some(next_tick(input.now, interval))))
}

/// The first multiple of `interval` after `now` (`now` plus the interval if it is zero).
fn next_tick(now: Timestamp, interval: std::time::Duration) -> Timestamp {
    let step = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    if step <= 0 {
        return now.saturating_add(interval);
    }
    let t = now.unix_millis();
    Timestamp::from_unix_millis(t.div_euclid(step).saturating_add(1).saturating_mul(step))
}

/// No upgrade in flight: check, evacuate, then call.
pub(crate) fn before_call(input: &StepInput<'_>) -> Action {
    let target = &input.target.version;
    let Some(node) = input.node else { return wait(MachineWait::NodeMissing, None) };
    let version = match TalosVersion::from_os_image(&node.os_image) {
        Ok(v) => v,
        Err(e) => return Action::Fail(MachineFailure::BadOsImage(e.to_string())),
    };
    let evacuation = evacuation_state(input.conditions, input.storage, input.timeouts.evacuation, input.now);
    if &version == target {
        // Verified like an upgraded machine: Ready, and on a control plane a voting member.
        if !node.ready {
            return wait(MachineWait::NodeNotReady, None);
        }
        if let Some(reason) = etcd_wait(input) {
            return polled(input, reason, None);
        }
        // The machine's own condition is the record of its convergence (the operation's
        // status keeps none per machine): written once, for this target.
        return if evacuation.is_open() {
            Action::EndEvacuation
        } else if converged_on(input.conditions).as_ref() == Some(target) {
            Action::Converged
        } else {
            Action::RecordConverged
        };
    }
    if let Err(refusal) = check_upgrade_path(&version, target) {
        return Action::Fail(MachineFailure::UpgradePath(refusal));
    }
    let kubernetes = match KubernetesVersion::parse(&input.target.kubernetes_version) {
        Ok(k) => k,
        Err(e) => return Action::Fail(MachineFailure::BadKubernetesVersion(e.to_string())),
    };
    if let Err(refusal) = check_kubernetes_pairing(target, &kubernetes) {
        return Action::Fail(MachineFailure::KubernetesPairing(refusal));
    }
    let image = match image_for(input.target, node) {
        Ok(image) => image,
        Err(problem) => return Action::Fail(problem.into()),
    };
    // An evacuation past its timeout fails whatever else the node is doing: it is never
    // left open behind a wait.
    if let EvacuationState::TimedOut { replicas_left } = evacuation {
        return Action::FailEndingEvacuation(MachineFailure::EvacuationTimedOut {
            replicas_left,
            timeout: input.timeouts.evacuation,
        });
    }
    let evacuation_deadline = match evacuation {
        EvacuationState::InProgress { deadline, .. } => Some(deadline),
        EvacuationState::NotStarted
        | EvacuationState::Evacuated
        | EvacuationState::NothingToEvacuate
        | EvacuationState::TimedOut { .. } => None,
    };
    if !node.ready {
        return wait(MachineWait::NodeNotReady, evacuation_deadline);
    }
    // Everything the call needs from the node is checked before storage is touched: an
    // evacuation never begins on a machine that could not then be called.
    match input.talos {
        TalosObservation::Answered { stage: MachineStage::Running } => {}
        TalosObservation::Answered { stage } => {
            return polled(input, MachineWait::MachineBusy { stage: *stage }, evacuation_deadline);
        }
        TalosObservation::Unreachable { .. } => {
            return polled(input, MachineWait::TalosApiUnreachable, evacuation_deadline);
        }
        TalosObservation::Error { error } => return Action::Fail(MachineFailure::TalosApi(error.clone())),
    }
    if !is_valid_boot_id(&node.boot_id) {
        return wait(MachineWait::BootIdUnknown, evacuation_deadline);
    }
    match evacuation {
        EvacuationState::NotStarted => return Action::BeginEvacuation,
        EvacuationState::InProgress { replicas_left, deadline } => {
            return polled(input, MachineWait::Evacuating { replicas_left }, Some(deadline));
        }
        EvacuationState::Evacuated | EvacuationState::NothingToEvacuate | EvacuationState::TimedOut { .. } => {}
    }
    match input.authority {
        CallAuthority::Granted => Action::Upgrade { image, marker: marker_for(input, &node.boot_id) },
        CallAuthority::NeedsEtcdGate => wait(MachineWait::EtcdGateNotChecked, None),
        CallAuthority::NeedsPreflight => wait(MachineWait::PreflightNotChecked, None),
        // A denial may rest on the etcd gate, which no watch reports.
        CallAuthority::Denied(denied) => polled(input, MachineWait::CallNotAuthorised(denied.clone()), None),
    }
}

fn marker_for(input: &StepInput<'_>, boot_id: &str) -> UpgradeMarker {
    UpgradeMarker {
        target: input.target.version.clone(),
        boot_id: boot_id.to_owned(),
        call_deadline: input.now.saturating_add(input.timeouts.upgrade_call),
        node: input.node.map(|n| n.name.clone()).filter(|n| is_valid_node_name(n)),
    }
}

/// Why no installer image can be named.
enum ImageProblem {
    NoSchematic,
    Bad(String),
}

impl From<ImageProblem> for MachineFailure {
    fn from(problem: ImageProblem) -> Self {
        match problem {
            ImageProblem::NoSchematic => Self::NoSchematic,
            ImageProblem::Bad(text) => Self::BadImageReference(text),
        }
    }
}

/// The installer image for a machine whose Node is `node`: the factory image of the target
/// with the cluster's schematic, else the node's own.
///
/// # Errors
/// [`MachineFailure::NoSchematic`] or [`MachineFailure::BadImageReference`].
pub fn installer_image_for(target: &UpgradeTarget, node: &NodeObservation) -> Result<String, Box<MachineFailure>> {
    image_for(target, node).map_err(|problem| Box::new(problem.into()))
}

/// The installer image, from the cluster's schematic or else the node's own.
fn image_for(target: &UpgradeTarget, node: &NodeObservation) -> Result<String, ImageProblem> {
    let schematic = target.schematic.as_deref().or(node.schematic.as_deref()).ok_or(ImageProblem::NoSchematic)?;
    if schematic.len() != 64 || !schematic.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return Err(ImageProblem::Bad(format!("schematic {schematic:?} is not a 64-character lowercase hex ID")));
    }
    let platform = &target.platform;
    if platform.is_empty() || !platform.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err(ImageProblem::Bad(format!("platform {platform:?} is not a factory platform name")));
    }
    Ok(installer_image(platform, schematic, &target.version))
}

/// An upgrade in flight (intent or acknowledged) for this target.
fn after_call(input: &StepInput<'_>, marker: &MarkerRef<'_>, acknowledged: bool, since: Timestamp) -> Action {
    let target = &input.target.version;
    let verify_deadline = since.saturating_add(input.timeouts.verify);
    let timed_out = input.now >= verify_deadline;
    let waiting = |reason: MachineWait, what: &'static str| {
        if timed_out {
            Action::Fail(MachineFailure::NotVerifiedInTime {
                target: target.clone(),
                timeout: input.timeouts.verify,
                waiting: what,
            })
        } else {
            wait(reason, Some(verify_deadline))
        }
    };
    // Acknowledged, and the Node still shows the boot before the call: what comes next is
    // the kubelet's report of the new boot, which a watch brings. Talos and etcd are not
    // looked at (see `needs_talos`): a pass never waits on a rebooting node's silence.
    if acknowledged && input.node.is_some_and(|n| n.boot_id == marker.boot_id) {
        return waiting(MachineWait::NotRebootedYet, "the node to reboot");
    }
    let stage = match input.talos {
        TalosObservation::Answered { stage } => *stage,
        TalosObservation::Unreachable { .. } | TalosObservation::Error { .. } => {
            // While the Node still shows the boot before the call, its kubelet's report of
            // the new boot is what comes next, and a watch brings it. Once the Node shows a
            // new boot, only Talos can move the machine on, and no watch reports Talos: poll.
            let rebooted = input.node.is_some_and(|n| n.boot_id != marker.boot_id && is_valid_boot_id(&n.boot_id));
            if rebooted && !timed_out {
                return polled(input, MachineWait::Rebooting, Some(verify_deadline));
            }
            return waiting(MachineWait::Rebooting, "the Talos API to answer");
        }
    };
    let Some(node) = input.node else { return waiting(MachineWait::NodeMissing, "the Node to exist") };
    if node.boot_id == marker.boot_id || !is_valid_boot_id(&node.boot_id) {
        if acknowledged {
            return waiting(MachineWait::NotRebootedYet, "the node to reboot");
        }
        if stage.shows_upgrade() {
            return waiting(MachineWait::UpgradeUnderWay, "the node to reboot");
        }
        // A genuine marker's deadline is at most one call bound after its intent was
        // written; a later one (garbled, or a clock far off) is not waited on beyond that.
        let call_deadline = marker.call_deadline.min(since.saturating_add(input.timeouts.upgrade_call));
        if input.now < call_deadline {
            return wait(MachineWait::IntentUnconfirmed, Some(call_deadline));
        }
        // The deadline passed with no sign of the call on the node: it was never
        // acknowledged, and can no longer be. The intent is void: close it, and decide the
        // next time as if there were none (every pre-call check, and the call only with
        // that pass's authority).
        return Action::CloseVoidIntent;
    }
    let booted = match TalosVersion::from_os_image(&node.os_image) {
        Ok(v) => v,
        Err(e) => return Action::Fail(MachineFailure::BadOsImage(e.to_string())),
    };
    if &booted != target {
        return Action::Fail(MachineFailure::AbFallback {
            booted,
            target: target.clone(),
            before: marker.boot_id.to_owned(),
            after: node.boot_id.clone(),
        });
    }
    if !node.ready {
        return waiting(MachineWait::NodeNotReady, "the Node to be Ready");
    }
    if let Some(reason) = etcd_wait(input) {
        if timed_out {
            return waiting(reason, "a voting etcd member");
        }
        return polled(input, reason, Some(verify_deadline));
    }
    // Storage scheduling comes back only now, after verification, and in the same write as
    // the convergence.
    Action::RecordConverged
}

/// On a control plane, what its etcd membership still waits for, if anything.
pub(crate) fn etcd_wait(input: &StepInput<'_>) -> Option<MachineWait> {
    if input.machine.role != MachineRole::ControlPlane {
        return None;
    }
    match input.etcd_member {
        Some(EtcdMembership::Voter) => None,
        Some(EtcdMembership::Learner) => Some(MachineWait::EtcdMemberLearner),
        Some(EtcdMembership::Absent) => Some(MachineWait::EtcdMemberMissing),
        Some(EtcdMembership::Unknown { .. }) | None => Some(MachineWait::EtcdMemberUnknown),
    }
}

/// Whether [`step`] needs the Talos API (the stage) and etcd membership to decide for a
/// machine with these conditions and a Node showing `node_boot_id`: not while an
/// acknowledged call's node still shows the boot from before the call, when the step waits
/// for the new boot whatever they say. A driver may then leave them unread (a node in its
/// reboot does not answer until its dial timeout).
#[must_use]
pub fn needs_talos(conditions: &Conditions, node_boot_id: Option<&str>) -> bool {
    let Some(condition) = conditions.get(TALOS_UPGRADE).filter(|c| c.status == ConditionStatus::True) else {
        return true;
    };
    MarkerRef::parse(&condition.message).map_or(true, |marker| node_boot_id != Some(marker.boot_id))
}

/// The message of `TalosUpgrade=False/Converged`: the version verified and the boot ID.
#[must_use]
pub fn converged_message(target: &TalosVersion, boot_id: &str) -> String {
    format!("verified on {target}; boot ID {boot_id}")
}

/// The version the machine's conditions record it verified on (`TalosUpgrade=False/
/// Converged` with a [`converged_message`]), if any. A message of another form (an older
/// engine's) records none: the machine is verified again, at the cost of one write.
#[must_use]
pub fn converged_on(conditions: &Conditions) -> Option<TalosVersion> {
    let condition = conditions.get(TALOS_UPGRADE)?;
    if condition.status != ConditionStatus::False || condition.reason != crate::upgrade_marker::reason::CONVERGED {
        return None;
    }
    let (version, _) = condition.message.strip_prefix("verified on ")?.split_once(';')?;
    TalosVersion::parse(version).ok()
}

/// Recognises the machines whose conditions record them verified on one version, without
/// parsing each record: a pass over thousands of machines asks it of every one. It agrees
/// with [`converged_on`] for every record [`converged_message`] writes; a record of the
/// version in another spelling is not recognised (the machine is verified again, at the
/// cost of one write: the safe side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvergedOn {
    prefix: String,
}

impl ConvergedOn {
    /// Recognises records of `version`.
    #[must_use]
    pub fn new(version: &TalosVersion) -> Self {
        Self { prefix: format!("verified on {version};") }
    }

    /// Whether `conditions` record the machine verified on this version.
    #[must_use]
    pub fn recorded(&self, conditions: &Conditions) -> bool {
        conditions.get(TALOS_UPGRADE).is_some_and(|c| {
            c.status == ConditionStatus::False
                && c.reason == crate::upgrade_marker::reason::CONVERGED
                && c.message.starts_with(&self.prefix)
        })
    }
}

/// The node name recorded before the Upgrade call in flight, if any: what the driver uses
/// while the rebooting machine cannot be asked for its name.
#[must_use]
pub fn recorded_node_name(conditions: &Conditions) -> Option<String> {
    [TALOS_UPGRADE, TALOS_LIFECYCLE].into_iter().find_map(|type_| {
        let condition = conditions.get(type_).filter(|c| c.status != ConditionStatus::False)?;
        MarkerRef::parse(&condition.message).ok()?.node.map(str::to_owned)
    })
}

/// Whether the machine's conditions show an Upgrade call made, or possibly made (on the
/// lifecycle executor: an install begun, whose boot slot may be written): such a machine is
/// never interrupted by a hold, a pause or a deletion.
#[must_use]
pub fn past_upgrade_call(conditions: &Conditions) -> bool {
    conditions.get(TALOS_UPGRADE).is_some_and(|c| c.status != ConditionStatus::False) || lifecycle_in_flight(conditions)
}

#[cfg(test)]
mod tests;
