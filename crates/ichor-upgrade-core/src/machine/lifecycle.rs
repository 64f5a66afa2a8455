//! The lifecycle executor's step (Talos 1.13 and later; the only path from 1.18, which
//! removes the legacy `MachineService.Upgrade`): for one machine, from what was observed,
//! exactly one [`LifecycleAction`].
//!
//! On this path Talos only installs (`LifecycleService.Upgrade` writes the other boot slot
//! and ends with an exit code); the engine does the rest, in this order (facts sheet §4.2):
//! the pre-call checks and the storage evacuation of the legacy step, then the installer
//! image pulled into the `system` containerd namespace (`ImageService.Pull`), the install,
//! a cordon and a drain through the Eviction API (PodDisruptionBudgets honoured, DaemonSet
//! and mirror pods left, Talos's five-minute bound), `MachineService.Reboot`, the new boot
//! verified (on the target, else an A/B fallback: a failure), Ready, on a control plane a
//! voting etcd member, the uncordon, and the convergence.
//!
//! # What is recorded, and why
//! One condition, `TalosLifecycle` ([`TALOS_LIFECYCLE`]), its message an
//! [`UpgradeMarker`] (the target, the boot ID before the install, the current phase's
//! deadline, the node name), its reason the phase:
//! - `Unknown/InstallIntent`, written before the install: from here the other boot slot
//!   may be written, so the machine is past the point of no return (a hold, a pause or a
//!   deletion no longer interrupts it) and a reboot into another version is an A/B
//!   fallback. An intent found later, with the node on the same boot and answering, no
//!   install shown on the node and none seen, is installed again (the call never reached
//!   the node; the installer would write the same slot with the same image). That repeated
//!   install finishes a machine past its call, so it takes the finish authority.
//! - `Unknown/InstallRunning`, once the node shows the installer running (Talos keeps an
//!   `installer` ServicePID while its task runs, and runs it to its end whether or not a
//!   stream follows it: `internal/app/lifecycle/container.go` waits on a detached
//!   context). An intent is installed again only while the node shows no install and none
//!   was ever seen: an install seen running and now gone ended on this boot, its exit code
//!   unseen; it is taken as installed, and the reboot's verification judges it (on the old
//!   version it is reported as a fallback, never converged). Never an install after one
//!   that ran on the same boot (issue 29 item 3).
//! - `True/Installed`, on exit code 0: the drain's clock starts at its transition time.
//! - `Unknown/RebootRequested`, written before the Reboot call, with the boot ID before it.
//!   Found later with the node on that boot (as Talos itself reports its boot ID) and
//!   running, past the marker's deadline, the reboot is asked for again.
//! - `False/Converged` (with `TalosUpgrade=False/Converged`, the engine's record of a
//!   convergence whatever the executor), `False/InstallFailed`, `False/Retry`.
//!
//! The cordon carries the Node annotation [`CORDONED_ANNOTATION`] in the same write, naming
//! the operation, so the uncordon lifts only this operation's own cordon, never a person's
//! nor another operation's. Both writes carry the Node's resourceVersion as the pass read
//! it: a `kubectl cordon` landing in between makes the write a conflict, never a takeover.
//!
//! # Authority
//! The first install is the Upgrade call of this path: it goes out only with the full
//! authority of its pass ([`StepInput::authority`]). An install repeated after a lost
//! stream, and the reboot of a machine already installed, are the end of a machine past its
//! call, which a pause or a hold does not interrupt; they take
//! [`LifecycleInput::finish_authority`]: the lock held and, on a
//! control plane, every other control plane Ready and the engine's etcd gate passed in the
//! same pass. Talos's own etcd check does not run on this path: the engine's gate is the
//! only quorum guard.

use std::fmt;
use std::time::Duration;

use crate::conditions::{ConditionStatus, Conditions};
use crate::machine::talos::{
    Action, MachineFailure, MachineWait, StepInput, before_call, etcd_wait, polled, polled_every,
};
use crate::machine::vocabulary::PodRef;
use crate::machine::vocabulary::{MachineStage, TALOS_LIFECYCLE, TalosObservation};
use crate::rollout::CallAuthority;
use crate::time::Timestamp;
use crate::upgrade_marker::{MarkerRef, UpgradeMarker, is_valid_boot_id};
use crate::versions::TalosVersion;

/// The condition type that records the installer's pull on this path, written in the
/// same write as the install's intent (no write of its own, so no authority of its own):
/// `True/Pulled`, its message [`pulled_message`]. Nothing decides on it; it is what the
/// machine's history keeps of the pull (its `pull` step), since no other record sees it.
pub const INSTALLER_PULL: &str = "InstallerPull";

/// The reason of [`INSTALLER_PULL`]: the pull before the intent answered.
pub const PULLED: &str = "Pulled";

/// The message of [`INSTALLER_PULL`]: `pulled <image> in <seconds> s`, the seconds to the
/// millisecond (an image already on the node answers at once: about 0).
#[must_use]
pub fn pulled_message(image: &str, took: Duration) -> String {
    format!("pulled {image} in {:.3} s", took.as_secs_f64())
}

/// The seconds a [`pulled_message`] records; `None` for any other text.
#[must_use]
pub fn pulled_seconds(message: &str) -> Option<f64> {
    let rest = message.strip_prefix("pulled ")?.strip_suffix(" s")?;
    let (_, seconds) = rest.rsplit_once(" in ")?;
    seconds.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0)
}

/// The Node annotation the engine's cordon carries, so that only its own cordon is lifted.
/// Its value names the operation that cordoned and when ([`cordon_annotation`]); an older
/// engine wrote `true` or `since=<Unix ms>`, which name no operation.
pub const CORDONED_ANNOTATION: &str = "ichor.dev/cordoned";

/// The value of [`CORDONED_ANNOTATION`] for a cordon made at `at` by the operation whose
/// identity is `operation`: `since=<Unix ms>;operation=<identity>`.
#[must_use]
pub fn cordon_annotation(at: Timestamp, operation: &str) -> String {
    format!("since={};operation={operation}", at.unix_millis())
}

/// A field of a [`CORDONED_ANNOTATION`] value (`key=value`, separated by `;`).
fn cordon_field<'a>(value: &'a str, key: &str) -> Option<&'a str> {
    value.split(';').find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
}

/// When the engine cordoned, from the value of [`CORDONED_ANNOTATION`]; `None` for a value
/// that records no time (`true`, from an older engine) or does not parse.
#[must_use]
pub fn cordoned_since(value: &str) -> Option<Timestamp> {
    cordon_field(value, "since")?.parse::<i64>().ok().map(Timestamp::from_unix_millis)
}

/// The identity of the operation that cordoned, from the value of [`CORDONED_ANNOTATION`];
/// `None` for a value that names none (an older engine's). Only that operation lifts the
/// cordon: one that names no operation, or another, is never lifted by the engine (issue
/// 29 item 8), and the preflight counts it as a cordon not this operation's.
#[must_use]
pub fn cordoned_for(value: &str) -> Option<&str> {
    cordon_field(value, "operation").filter(|o| !o.is_empty())
}

/// Condition reasons of [`TALOS_LIFECYCLE`].
pub mod reason {
    /// `Unknown`: written before the install; the other boot slot may be written.
    pub const INSTALL_INTENT: &str = "InstallIntent";
    /// `Unknown`: the node was seen running the install; it is never made again on this
    /// boot.
    pub const INSTALL_RUNNING: &str = "InstallRunning";
    /// `True`: the install ended with exit code 0; the drain follows.
    pub const INSTALLED: &str = "Installed";
    /// `Unknown`: written before the Reboot call.
    pub const REBOOT_REQUESTED: &str = "RebootRequested";
    /// `False`: verified on the target.
    pub const CONVERGED: &str = "Converged";
    /// `False`: the install ended with a non-zero exit code.
    pub const INSTALL_FAILED: &str = "InstallFailed";
    /// `False`: a person resumed the operation; the failed attempt is closed.
    pub const RETRY: &str = "Retry";
}

/// Which executor upgrades a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorKind {
    /// `MachineService.Upgrade`: Talos pulls, drains, installs and reboots (ADR 0043).
    Legacy,
    /// `ImageService.Pull`, `LifecycleService.Upgrade`, the engine's drain, `Reboot`.
    Lifecycle,
}

impl ExecutorKind {
    /// The name on the command line and in the trace.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Legacy => "legacy",
            Self::Lifecycle => "lifecycle",
        }
    }
}

/// Which executor to use, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorChoice {
    /// The legacy executor for every machine (refused by a node on Talos 1.18 or later).
    Legacy,
    /// The lifecycle executor for every machine (a node before Talos 1.13 fails: it does
    /// not serve `LifecycleService`).
    Lifecycle,
    /// The lifecycle executor for a node whose running Talos no longer serves the legacy
    /// call ([`LEGACY_REMOVED`] or later), the legacy one otherwise.
    #[default]
    Auto,
}

impl ExecutorChoice {
    /// The choice of this name (`legacy`, `lifecycle`, `auto`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "legacy" => Some(Self::Legacy),
            "lifecycle" => Some(Self::Lifecycle),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

/// The first Talos minor that serves `LifecycleService.Upgrade` and `ImageService.Pull`.
pub const LIFECYCLE_SINCE: (u64, u64) = (1, 13);
/// The first Talos minor without the legacy `MachineService.Upgrade`.
pub const LEGACY_REMOVED: (u64, u64) = (1, 18);

fn minor_at_least(version: &TalosVersion, (major, minor): (u64, u64)) -> bool {
    let v = version.as_semver();
    (v.major, v.minor) >= (major, minor)
}

/// The executor for a machine: the one its conditions show under way, whatever the
/// configuration says now (a machine never changes executor half way); else the choice,
/// with [`ExecutorChoice::Auto`] looking at the version the node runs (`None`: not known,
/// the legacy executor, whose pre-call checks then say why it cannot go on).
#[must_use]
pub fn executor_for(choice: ExecutorChoice, conditions: &Conditions, running: Option<&TalosVersion>) -> ExecutorKind {
    let in_flight = |type_: &str| conditions.get(type_).is_some_and(|c| c.status != ConditionStatus::False);
    if in_flight(TALOS_LIFECYCLE) {
        return ExecutorKind::Lifecycle;
    }
    if in_flight(crate::upgrade_marker::TALOS_UPGRADE) {
        return ExecutorKind::Legacy;
    }
    match choice {
        ExecutorChoice::Legacy => ExecutorKind::Legacy,
        ExecutorChoice::Lifecycle => ExecutorKind::Lifecycle,
        ExecutorChoice::Auto if running.is_some_and(|v| minor_at_least(v, LEGACY_REMOVED)) => ExecutorKind::Lifecycle,
        ExecutorChoice::Auto => ExecutorKind::Legacy,
    }
}

/// The Node as the lifecycle step needs it beyond [`crate::machine::vocabulary::NodeObservation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CordonState {
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Whether it carries [`CORDONED_ANNOTATION`] naming this operation
    /// ([`cordoned_for`]): the cordon is this operation's own, the only one it lifts. A
    /// person's cordon, another operation's, or an older engine's that names none, is left.
    pub ours: bool,
    /// When this operation cordoned, as its annotation records ([`cordoned_since`]).
    pub since: Option<Timestamp>,
}

/// The pods the drain has left to do on the node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainObservation {
    /// Pods to evict: DaemonSet-owned, mirror (static) and terminating pods left out.
    pub evictable: Vec<PodRef>,
    /// Pods evicted that have not gone yet.
    pub terminating: usize,
}

/// Everything [`lifecycle_step`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct LifecycleInput<'a> {
    /// What the legacy step looks at (the pre-call checks are the same). Its `authority` is
    /// the first install's: the full authority of the pass.
    pub step: StepInput<'a>,
    /// The Node's cordon.
    pub cordon: CordonState,
    /// The drain's view of the node's pods, read once the machine is installed.
    pub drain: Option<&'a DrainObservation>,
    /// The boot ID Talos reports (`/proc/sys/kernel/random/boot_id`), read while a reboot
    /// was requested and the Node still shows the boot before it.
    pub talos_boot_id: Option<&'a str>,
    /// The authority of a machine past its call: an install repeated under an intent, and
    /// the reboot of a machine already installed (see the module doc).
    pub finish_authority: &'a CallAuthority,
    /// Whether this controller's install of the machine is under way (its stream runs
    /// outside the pass): it is waited for, never started again.
    pub install_running: bool,
    /// Whether the node shows an install under way (asked when [`LifecycleReads::install`]
    /// says so); `None` when not asked or not known.
    pub node_installing: Option<bool>,
    /// Whether this controller saw the intent's install begin on the node (the call's
    /// answer) and could not record it yet (an outage cut the stream and the write).
    pub install_seen: bool,
}

/// What the driver must read for the step, beyond the Node: the lifecycle step asks only
/// what its phase looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifecycleReads {
    /// The Talos machine stage (and, on a control plane, the etcd member list).
    pub talos: bool,
    /// Storage (the evacuation).
    pub storage: bool,
    /// The node's pods.
    pub drain: bool,
    /// The boot ID as Talos reports it.
    pub talos_boot_id: bool,
    /// Whether the node runs an install (an intent's, on the same boot).
    pub install: bool,
}

/// What [`lifecycle_step`] needs read for a machine with these conditions whose Node shows
/// `node` (its boot ID and readiness), at `now`. A pass never asks a node that may be in
/// its reboot: Talos is asked about a requested reboot only once its deadline passed with
/// the Node still Ready on the old boot (a node that reboots turns NotReady within the node
/// monitor's grace, and its API would hold the pass until the dial timeout).
#[must_use]
pub fn lifecycle_reads(conditions: &Conditions, node: Option<(&str, bool)>, now: Timestamp) -> LifecycleReads {
    let all = LifecycleReads { talos: true, storage: true, drain: false, talos_boot_id: false, install: false };
    let Some(condition) = conditions.get(TALOS_LIFECYCLE).filter(|c| c.status != ConditionStatus::False) else {
        return all;
    };
    let Ok(marker) = MarkerRef::parse(&condition.message) else { return all };
    let rebooted = node.is_some_and(|(boot, _)| boot != marker.boot_id);
    let ready = node.is_some_and(|(_, ready)| ready);
    let nothing = LifecycleReads { talos: false, storage: false, drain: false, talos_boot_id: false, install: false };
    match condition.reason.as_str() {
        // A node shown on a new boot is verified from the Node (and etcd, read with Talos).
        _ if rebooted => LifecycleReads { talos: true, ..nothing },
        // The install again goes through every pre-call check, the evacuation's included.
        reason::INSTALL_INTENT => LifecycleReads { install: true, ..all },
        reason::INSTALL_RUNNING => LifecycleReads { talos: true, install: true, ..nothing },
        reason::INSTALLED => LifecycleReads { drain: true, ..nothing },
        reason::REBOOT_REQUESTED if ready && now >= marker.call_deadline => {
            LifecycleReads { talos: true, talos_boot_id: true, ..nothing }
        }
        reason::REBOOT_REQUESTED => nothing,
        _ => all,
    }
}

/// The one thing to do for a machine on the lifecycle executor.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleAction {
    /// On the target, verified, nothing in flight, no evacuation open, not cordoned by
    /// the engine. Nothing to write.
    Converged,
    /// Verified: end the evacuation if one is open, then write `TalosUpgrade=False/
    /// Converged`, `TalosLifecycle=False/Converged` and `StorageEvacuation=False/Ended` in
    /// one write.
    RecordConverged,
    /// Nothing to do yet.
    Wait {
        /// Why.
        reason: MachineWait,
        /// When to look again at the latest, if a deadline is known.
        recheck_at: Option<Timestamp>,
    },
    /// Begin the storage evacuation (the shared definition).
    BeginEvacuation,
    /// End the storage evacuation (on the target already, nothing else to do).
    EndEvacuation,
    /// Pull `image` into the node's `system` containerd namespace (at once if it is
    /// there), write `TalosLifecycle=Unknown/InstallIntent` with the marker, run
    /// `LifecycleService.Upgrade` under the marker's deadline, then on exit code 0 write
    /// `True/Installed`; on another code `False/InstallFailed` and a failure.
    Install {
        /// The installer image.
        image: String,
        /// What `TalosLifecycle` records.
        marker: UpgradeMarker,
    },
    /// Write `TalosLifecycle=Unknown/InstallRunning` (the same marker): the node shows the
    /// intent's install running.
    RecordInstallRunning,
    /// Write `TalosLifecycle=True/Installed` (the same marker): the install seen running
    /// ended on this boot with no stream to report its exit code; the reboot's
    /// verification judges it.
    RecordInstallEnded,
    /// Cordon the Node with [`CORDONED_ANNOTATION`], in one write.
    Cordon,
    /// Evict these pods through the Eviction API (a PodDisruptionBudget's 429 is a wait).
    Evict {
        /// The pods.
        pods: Vec<PodRef>,
    },
    /// Write `TalosLifecycle=Unknown/RebootRequested` with the marker (the boot ID before
    /// the reboot, the deadline after which an unconfirmed reboot is asked for again), then
    /// call `MachineService.Reboot`.
    Reboot {
        /// What `TalosLifecycle` records.
        marker: UpgradeMarker,
    },
    /// Lift the engine's cordon: `spec.unschedulable=false`, the annotation removed.
    Uncordon,
    /// The machine failed: the operation pauses.
    Fail(MachineFailure),
    /// The evacuation timed out: re-enable storage scheduling, write
    /// `StorageEvacuation=False/TimedOut`, then fail.
    FailEndingEvacuation(MachineFailure),
}

impl LifecycleAction {
    /// The CamelCase name of the action, for outcomes and the log.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Converged => "Converged",
            Self::RecordConverged => "RecordConverged",
            Self::Wait { .. } => "Wait",
            Self::BeginEvacuation => "BeginEvacuation",
            Self::EndEvacuation => "EndEvacuation",
            Self::Install { .. } => "Install",
            Self::RecordInstallRunning => "RecordInstallRunning",
            Self::RecordInstallEnded => "RecordInstallEnded",
            Self::Cordon => "Cordon",
            Self::Evict { .. } => "Evict",
            Self::Reboot { .. } => "Reboot",
            Self::Uncordon => "Uncordon",
            Self::Fail(_) => "Fail",
            Self::FailEndingEvacuation(_) => "FailEndingEvacuation",
        }
    }
}

fn lwait(reason: MachineWait, recheck_at: Option<Timestamp>) -> LifecycleAction {
    LifecycleAction::Wait { reason, recheck_at }
}

fn from_legacy(action: Action) -> LifecycleAction {
    match action {
        Action::Wait { reason, recheck_at } => LifecycleAction::Wait { reason, recheck_at },
        Action::Fail(failure) => LifecycleAction::Fail(failure),
        Action::FailEndingEvacuation(failure) => LifecycleAction::FailEndingEvacuation(failure),
        Action::BeginEvacuation => LifecycleAction::BeginEvacuation,
        Action::EndEvacuation => LifecycleAction::EndEvacuation,
        Action::Converged => LifecycleAction::Converged,
        Action::RecordConverged => LifecycleAction::RecordConverged,
        Action::Upgrade { image, marker } => LifecycleAction::Install { image, marker },
        // The pre-call checks never close an intent: that is the legacy step's after a
        // call. Should one appear, nothing is done on it.
        Action::CloseVoidIntent => LifecycleAction::Fail(MachineFailure::LifecycleRecord {
            text: "a legacy TalosUpgrade intent is open on a machine on the lifecycle executor".to_owned(),
        }),
    }
}

/// Decides the one action for a machine on the lifecycle executor. Pure: the same input
/// gives the same action.
pub fn lifecycle_step(input: &LifecycleInput<'_>) -> LifecycleAction {
    let s = &input.step;
    // A failed install is a failure until a person resumes (the resume closes it): its
    // outcome may have been written outside any pass that could record the failure.
    if let Some(failed) = s
        .conditions
        .get(TALOS_LIFECYCLE)
        .filter(|c| c.status == ConditionStatus::False && c.reason == reason::INSTALL_FAILED)
    {
        return LifecycleAction::Fail(MachineFailure::InstallFailedEarlier { message: failed.message.clone() });
    }
    let in_flight = s.conditions.get(TALOS_LIFECYCLE).filter(|c| c.status != ConditionStatus::False);
    let Some(condition) = in_flight else { return before_install(input) };
    let marker = match MarkerRef::parse(&condition.message) {
        Ok(marker) => marker,
        Err(e) => return LifecycleAction::Fail(MachineFailure::GarbledLifecycleMarker(e)),
    };
    if marker.target != s.target.version {
        return LifecycleAction::Fail(MachineFailure::MarkerForOtherTarget {
            recorded: marker.target,
            target: s.target.version.clone(),
            text: condition.message.clone(),
        });
    }
    let since = condition.last_transition_time.min(s.now);
    let phase = match (condition.status, condition.reason.as_str()) {
        (ConditionStatus::Unknown, reason::INSTALL_INTENT) => Phase::InstallIntent,
        (ConditionStatus::Unknown, reason::INSTALL_RUNNING) => Phase::InstallRunning,
        (ConditionStatus::True, reason::INSTALLED) => Phase::Installed,
        (ConditionStatus::Unknown, reason::REBOOT_REQUESTED) => Phase::RebootRequested,
        (status, other) => {
            return LifecycleAction::Fail(MachineFailure::LifecycleRecord {
                text: format!("TalosLifecycle {status:?}/{other} is not a phase of the lifecycle executor"),
            });
        }
    };
    let verify_deadline = since.saturating_add(s.timeouts.verify);
    let Some(node) = s.node else { return waiting(input, verify_deadline, MachineWait::NodeMissing, "the Node") };
    // A new boot, whatever the phase: the node rebooted since the install began. On the
    // target it is verified; on any other version the slot fell back (or the install never
    // took, which is reported the same way: on the safe side, never converged).
    if node.boot_id != marker.boot_id && is_valid_boot_id(&node.boot_id) {
        return rebooted(input, &marker, verify_deadline);
    }
    match phase {
        Phase::InstallIntent => after_install_intent(input, verify_deadline),
        Phase::InstallRunning => install_seen_running(input, verify_deadline),
        Phase::Installed => installed(input, &marker, since),
        Phase::RebootRequested => after_reboot_request(input, &marker, verify_deadline),
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    InstallIntent,
    InstallRunning,
    Installed,
    RebootRequested,
}

/// A wait under the verify bound: past it, a failure naming what was waited for.
fn waiting(
    input: &LifecycleInput<'_>,
    deadline: Timestamp,
    reason: MachineWait,
    what: &'static str,
) -> LifecycleAction {
    let s = &input.step;
    if s.now >= deadline {
        return LifecycleAction::Fail(MachineFailure::NotVerifiedInTime {
            target: s.target.version.clone(),
            timeout: s.timeouts.verify,
            waiting: what,
        });
    }
    lwait(reason, Some(deadline))
}

/// A polled wait under the verify bound.
fn polled_waiting(
    input: &LifecycleInput<'_>,
    deadline: Timestamp,
    reason: MachineWait,
    what: &'static str,
) -> LifecycleAction {
    if input.step.now >= deadline {
        return waiting(input, deadline, reason, what);
    }
    from_legacy(polled(&input.step, reason, Some(deadline)))
}

/// Nothing in flight: the legacy step's pre-call checks and evacuation, then the install.
fn before_install(input: &LifecycleInput<'_>) -> LifecycleAction {
    let s = &input.step;
    if let Some(node) = s.node
        && let Ok(running) = TalosVersion::from_os_image(&node.os_image)
        && running != s.target.version
        && !minor_at_least(&running, LIFECYCLE_SINCE)
    {
        return LifecycleAction::Fail(MachineFailure::LifecycleUnsupported { running });
    }
    match from_legacy(before_call(s)) {
        LifecycleAction::Install { .. } if input.install_running => lwait(MachineWait::InstallUnderWay, None),
        // On the target: the engine's own cordon (left by a crash before its convergence)
        // is lifted before the convergence is recorded.
        LifecycleAction::RecordConverged | LifecycleAction::Converged if input.cordon.ours => LifecycleAction::Uncordon,
        action => action,
    }
}

/// An install intent, the node on the same boot: an install the node shows (or this
/// process saw begin) is recorded as running; with none, install again (the same image
/// into the same slot: the call never reached the node). The slot may be written
/// already, so the machine is past its call: the repeated install takes the finish
/// authority, which a pause or a hold does not withdraw (a paused operation whose install
/// died with its controller would otherwise leave the machine to fail at the verify bound,
/// where the same operation never killed finishes it).
fn after_install_intent(input: &LifecycleInput<'_>, verify_deadline: Timestamp) -> LifecycleAction {
    let s = &input.step;
    if let Some(wait) = unless_running(input, verify_deadline) {
        return wait;
    }
    if s.now >= verify_deadline {
        return waiting(input, verify_deadline, MachineWait::InstallUnderWay, "the install");
    }
    if input.install_running {
        return lwait(MachineWait::InstallUnderWay, Some(verify_deadline));
    }
    if input.node_installing == Some(true) || input.install_seen {
        // The stream that began it is gone (or runs beside the pass); the node runs it,
        // or ran it on this boot.
        return LifecycleAction::RecordInstallRunning;
    }
    let finishing = StepInput { authority: input.finish_authority, ..*s };
    match before_call(&finishing) {
        Action::Upgrade { image, marker } => LifecycleAction::Install { image, marker },
        other => from_legacy(other),
    }
}

/// A polled wait while the node is not running or cannot be asked (an install is judged
/// only on a running node); `None` once it runs.
fn unless_running(input: &LifecycleInput<'_>, verify_deadline: Timestamp) -> Option<LifecycleAction> {
    match input.step.talos {
        TalosObservation::Answered { stage: MachineStage::Running } => None,
        TalosObservation::Answered { stage } => {
            Some(polled_waiting(input, verify_deadline, MachineWait::MachineBusy { stage: *stage }, "the install"))
        }
        TalosObservation::Unreachable { .. } | TalosObservation::Error { .. } => {
            Some(polled_waiting(input, verify_deadline, MachineWait::TalosApiUnreachable, "the install"))
        }
    }
}

/// The node was seen running the intent's install, on the same boot: waited for while it
/// runs (or cannot be asked); once gone, it ended, and is never made again.
fn install_seen_running(input: &LifecycleInput<'_>, verify_deadline: Timestamp) -> LifecycleAction {
    if let Some(wait) = unless_running(input, verify_deadline) {
        return wait;
    }
    if input.install_running || input.node_installing != Some(false) {
        return polled_waiting(input, verify_deadline, MachineWait::InstallUnderWay, "the install");
    }
    LifecycleAction::RecordInstallEnded
}

/// Installed, the node on the same boot: cordon, drain, then the reboot.
fn installed(input: &LifecycleInput<'_>, marker: &MarkerRef<'_>, since: Timestamp) -> LifecycleAction {
    let s = &input.step;
    if !input.cordon.unschedulable {
        return LifecycleAction::Cordon;
    }
    // The drain's clock starts at the engine's cordon, which comes right before the first
    // eviction: a controller down for a while after the install does not find its drain
    // timed out before it tried a single eviction (the install's time when the cordon
    // records none).
    let drain_from = input.cordon.since.filter(|_| input.cordon.ours).map_or(since, |c| c.max(since)).min(s.now);
    let drain_deadline = drain_from.saturating_add(s.timeouts.drain);
    let Some(drain) = input.drain else {
        return from_legacy(polled(s, MachineWait::Draining { terminating: 0 }, Some(drain_deadline)));
    };
    let left = drain.evictable.len() + drain.terminating;
    if left > 0 && s.now >= drain_deadline {
        return LifecycleAction::Fail(MachineFailure::DrainTimedOut {
            timeout: s.timeouts.drain,
            pods_left: left,
            first: drain.evictable.first().map(ToString::to_string),
        });
    }
    if !drain.evictable.is_empty() {
        return LifecycleAction::Evict { pods: drain.evictable.clone() };
    }
    if drain.terminating > 0 {
        let waiting = MachineWait::Draining { terminating: drain.terminating };
        return from_legacy(polled_every(s, s.timeouts.drain_poll, waiting, Some(drain_deadline)));
    }
    reboot(input, marker.boot_id)
}

/// The reboot, with the authority of a machine past its call.
fn reboot(input: &LifecycleInput<'_>, boot_id: &str) -> LifecycleAction {
    let s = &input.step;
    match input.finish_authority {
        CallAuthority::Granted => LifecycleAction::Reboot {
            marker: UpgradeMarker {
                target: s.target.version.clone(),
                boot_id: boot_id.to_owned(),
                call_deadline: s.now.saturating_add(s.timeouts.reboot_confirm),
                node: s.node.map(|n| n.name.clone()).filter(|n| crate::upgrade_marker::is_valid_node_name(n)),
            },
        },
        CallAuthority::NeedsEtcdGate => lwait(MachineWait::EtcdGateNotChecked, None),
        CallAuthority::NeedsPreflight => lwait(MachineWait::PreflightNotChecked, None),
        CallAuthority::Denied(denied) => from_legacy(polled(s, MachineWait::CallNotAuthorised(denied.clone()), None)),
    }
}

/// A reboot requested, the Node still showing the boot before it.
fn after_reboot_request(
    input: &LifecycleInput<'_>,
    marker: &MarkerRef<'_>,
    verify_deadline: Timestamp,
) -> LifecycleAction {
    let s = &input.step;
    // Before the deadline, or with the Node NotReady (the node is down: it rebooted, or is
    // rebooting), the Node's watch brings what comes next: its new boot.
    let ready = s.node.is_some_and(|n| n.ready);
    if s.now < marker.call_deadline || !ready {
        if s.now >= verify_deadline {
            return waiting(input, verify_deadline, MachineWait::Rebooting, "the node to reboot");
        }
        let reason = if ready { MachineWait::RebootUnconfirmed } else { MachineWait::Rebooting };
        let recheck = if ready { marker.call_deadline.min(verify_deadline) } else { verify_deadline };
        return lwait(reason, Some(recheck));
    }
    let stage = match s.talos {
        TalosObservation::Answered { stage } => *stage,
        TalosObservation::Unreachable { .. } | TalosObservation::Error { .. } => {
            return waiting(input, verify_deadline, MachineWait::Rebooting, "the node to reboot");
        }
    };
    if stage.shows_upgrade() {
        return waiting(input, verify_deadline, MachineWait::Rebooting, "the node to reboot");
    }
    match input.talos_boot_id {
        // Talos is on a new boot; the Node shows it once the kubelet reports (a watch).
        Some(boot) if boot != marker.boot_id => {
            waiting(input, verify_deadline, MachineWait::NotRebootedYet, "the kubelet to report the new boot")
        }
        Some(_) if s.now >= marker.call_deadline.min(verify_deadline) => {
            if s.now >= verify_deadline {
                return waiting(input, verify_deadline, MachineWait::RebootUnconfirmed, "the node to reboot");
            }
            if stage != MachineStage::Running {
                return polled_waiting(input, verify_deadline, MachineWait::MachineBusy { stage }, "the reboot");
            }
            reboot(input, marker.boot_id)
        }
        Some(_) => lwait(MachineWait::RebootUnconfirmed, Some(marker.call_deadline.min(verify_deadline))),
        None => polled_waiting(input, verify_deadline, MachineWait::RebootUnconfirmed, "the node to reboot"),
    }
}

/// The Node shows a new boot: the version tells an upgrade from a fallback; then Ready, the
/// etcd member, the uncordon and the convergence.
fn rebooted(input: &LifecycleInput<'_>, marker: &MarkerRef<'_>, verify_deadline: Timestamp) -> LifecycleAction {
    let s = &input.step;
    let Some(node) = s.node else { return waiting(input, verify_deadline, MachineWait::NodeMissing, "the Node") };
    let booted = match TalosVersion::from_os_image(&node.os_image) {
        Ok(v) => v,
        Err(e) => return LifecycleAction::Fail(MachineFailure::BadOsImage(e.to_string())),
    };
    if booted != s.target.version {
        return LifecycleAction::Fail(MachineFailure::AbFallback {
            booted,
            target: s.target.version.clone(),
            before: marker.boot_id.to_owned(),
            after: node.boot_id.clone(),
        });
    }
    if !node.ready {
        return waiting(input, verify_deadline, MachineWait::NodeNotReady, "the Node to be Ready");
    }
    if let Some(reason) = etcd_wait(s) {
        return polled_waiting(input, verify_deadline, reason, "a voting etcd member");
    }
    if input.cordon.ours {
        return LifecycleAction::Uncordon;
    }
    LifecycleAction::RecordConverged
}

impl fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
