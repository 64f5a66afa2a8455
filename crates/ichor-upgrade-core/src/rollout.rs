//! The rollout engine: the cluster lock and the state machine that decides, for one
//! operation, which machines to start, which to keep advancing and which to stop.
//!
//! # Calling protocol
//! The caller observes the world (the operation, its cluster's Lease, every machine with
//! its Node's readiness and its progress, the etcd gate's verdict) and calls [`decide`]
//! with `now`. It then carries out the [`Decision`]:
//!
//! 1. the lock action, first; when it is [`LockAction::Acquire`] nothing else is decided
//!    in that pass: the caller writes the Lease and observes again, so machines only ever
//!    start under a lock the API server has confirmed;
//! 2. [`Decision::retry`] (after a resume): clear those machines' failure records and what
//!    their failed attempt left, so that they start afresh; [`Decision::stop`]: end those
//!    machines' evacuations (they were not past their Upgrade call) and record them as not
//!    started;
//! 3. [`Decision::start`] and [`Decision::advance`]: advance each machine one step with the
//!    executor, recording its outcome;
//! 4. the phase, the acknowledged resume token and the generation in the operation's status.
//!
//! When [`Decision::check_etcd`] is set, a control plane is waiting only for the etcd
//! gate's verdict: the caller gathers it and calls [`decide`] again in the same pass.
//! Calling early or twice is harmless: the same inputs give the same decision.
//!
//! Terminal outcomes are sticky: a completed operation stays completed for its
//! generation; a pause lasts while a machine's failure is recorded, until a new value of
//! the resume annotation arrives; a refusal lasts while the spec is invalid.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::time::Duration;

use foldhash::fast::FixedState;
use serde::{Deserialize, Serialize};

use crate::etcd::snapshot::SnapshotState;
use crate::gate::{GatePhase, GateRule, GateState, Gates};
use crate::kubernetes::component::Component;
use crate::kubernetes::manifests::{ManifestsState, ManifestsStep, WorkloadRollout, manifests_step};
use crate::kubernetes::plan::KubernetesPlanProblem;
use crate::machine::kubernetes::KubernetesStage;
use crate::machine::vocabulary::MachineRole;
use crate::operation::{KubernetesSpec, OperationSpec, PlanProblem, PreflightMode, Refusal, SnapshotMode, ValidSpec};
use crate::preflight::{Blocker, describe};
use crate::status::{
    FailedMachine, MachineProgress, MachineRecord, OperationStatus, PauseReason, Phase, RecordState, WaitReason,
};
use crate::time::Timestamp;
use crate::versions::{
    KubernetesVersion, TalosVersion, check_kubernetes_pairing, check_upgrade_path, is_unknown_release,
    newest_known_talos,
};
use crate::window::{WindowVerdict, Windows};

/// How the engine keeps its cluster lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RolloutConfig {
    /// How long a Lease stays valid without renewal; written into the Lease.
    pub lease_duration: Duration,
    /// How long after its last renewal the holder renews the Lease.
    pub renew_after: Duration,
    /// How often machines held back by the preflight gate are checked again: no watch
    /// reports what releases them (a budget's count, a workload scaled up), so they are
    /// polled.
    pub preflight_recheck: Duration,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(120),
            renew_after: Duration::from_secs(40),
            preflight_recheck: Duration::from_secs(30),
        }
    }
}

/// The cluster's Lease as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The holder's identity (an operation's [`OperationView::identity`]).
    pub identity: String,
    /// When the holder last acquired or renewed the Lease. For a holder other than the
    /// operation deciding, the caller passes since when it has seen the Lease's record
    /// unchanged, on its own clock, never the time the holder wrote: replicas' clocks
    /// differ, and a holder is judged as leader election judges one (its record unchanged
    /// for a whole lease duration).
    pub renewed_at: Timestamp,
    /// The Lease's duration as written by its holder.
    pub lease_duration: Duration,
    /// Whether the holding operation still exists (the caller looks it up).
    pub holder_exists: bool,
}

/// The etcd gate's verdict over every control plane (DESIGN §3 rule 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdVerdict {
    /// One member per control plane, all answering with no errors, no learner, one agreed
    /// leader, no alarm.
    Healthy,
    /// Something fails; the text says what.
    Unhealthy {
        /// What fails, for the status.
        reason: String,
    },
    /// Not gathered in this pass (the caller gathers it when [`Decision::check_etcd`] asks).
    NotChecked,
}

/// The control planes' own components (kube-apiserver, kube-controller-manager,
/// kube-scheduler: their static pods, as their mirror pods show them), gathered with the
/// etcd gate. A control plane's component changes (a Kubernetes upgrade's apply, a Talos
/// upgrade's call or reboot) only while every other control plane's three are Ready: a
/// Ready Node says nothing of a kube-apiserver crash-looping on it, and restarting another
/// then leaves two of three API servers down (issue 53 item 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentsVerdict {
    /// Gathered: each control plane (by machine) with the components found not Ready (no
    /// mirror pod, not Ready, or crash-looping). A control plane not in the map has all
    /// three Ready.
    Checked(BTreeMap<String, Vec<Component>>),
    /// The mirror pods could not be read: no control plane changes on a guess.
    Unreadable {
        /// Why, for the status.
        reason: String,
    },
    /// Not gathered in this pass (gathered with the etcd gate, when
    /// [`Decision::check_etcd`] asks).
    NotChecked,
}

impl ComponentsVerdict {
    /// Every control plane's components Ready: what a caller with no static pods to read
    /// (a test, a simulator of Talos alone) passes.
    #[must_use]
    pub fn all_ready() -> Self {
        Self::Checked(BTreeMap::new())
    }

    /// The components not Ready on control planes other than `machine`, as
    /// `machine/component`; `Err` when they are not known.
    fn others_not_ready(&self, machine: &str) -> Result<Vec<String>, CallDenied> {
        match self {
            Self::Checked(found) => Ok(found
                .iter()
                .filter(|(m, _)| m.as_str() != machine)
                .flat_map(|(m, components)| components.iter().map(move |c| format!("{m}/{c}")))
                .collect()),
            Self::Unreadable { reason } => {
                Err(CallDenied::ControlPlaneComponentsNotReady { components: vec![format!("not observed: {reason}")] })
            }
            Self::NotChecked => Ok(Vec::new()),
        }
    }
}

/// One machine as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    /// The machine's name (unique in the cluster).
    pub name: String,
    /// Its role.
    pub role: MachineRole,
    /// The value of [`crate::operation::ORDER_LABEL`], if set.
    pub order_label: Option<String>,
    /// Whether the machine or its Node carries [`crate::operation::HOLD_ANNOTATION`].
    pub held: bool,
    /// Whether its Node is Ready.
    pub node_ready: bool,
    /// Its Node's `status.nodeInfo.osImage`, when the Node was read (planning checks every
    /// machine's version against the target before any machine starts).
    pub os_image: Option<String>,
    /// Its progress in this operation.
    pub progress: MachineProgress,
    /// It goes after every other machine of its role, whatever its order label: the
    /// machine of the node the controller runs on (see
    /// [`crate::operation::CONTROLLER_NODE_MARK`]), so that the controller is not drained
    /// and rebooted while it has the others of its role to do.
    pub last: bool,
}

/// One operation as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationView {
    /// The identity written into the Lease; unique per operation object (for example
    /// `namespace/name/uid`), so that a recreated operation is another holder.
    pub identity: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// Whether the operation is being deleted (its deletion timestamp is set).
    pub deleting: bool,
    /// The value of [`crate::operation::RESUME_ANNOTATION`], if set.
    pub resume_token: Option<String>,
    /// The value of [`crate::operation::PAUSE_ANNOTATION`], if set: a person paused it.
    pub pause_requested: Option<String>,
    /// The spec as written.
    pub spec: OperationSpec,
    /// The status as last written.
    pub status: OperationStatus,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct RolloutInput<'a> {
    /// The operation.
    pub operation: &'a OperationView,
    /// The release set's Talos version, as written.
    pub release_talos_version: &'a str,
    /// The latest known patch of each minor line: an operation may also target one of an
    /// earlier minor line than the release set's, a hop toward it
    /// ([`crate::operation::OperationSpec::validate_with`]).
    pub releases: &'a crate::releases::KnownReleases,
    /// The cluster's Kubernetes version, as written.
    pub kubernetes_version: &'a str,
    /// The cluster's Lease, if one exists with a holder.
    pub lease: Option<&'a LeaseHolder>,
    /// Every machine of the cluster.
    pub machines: &'a [MachineView],
    /// The cluster's Nodes that no machine names. An upgrade does not start while there is
    /// one (refused at planning), and is not Completed while there is one (it waits): its
    /// machines alone are not the cluster.
    pub unaccounted_nodes: &'a [String],
    /// The etcd gate's verdict.
    pub etcd: &'a EtcdVerdict,
    /// The control planes' components, gathered with the etcd gate.
    pub components: &'a ComponentsVerdict,
    /// For a Kubernetes upgrade: its stage and what planning found (`None` for other kinds;
    /// for a Kubernetes upgrade, not observed: it waits).
    pub kubernetes: Option<&'a KubernetesInput>,
    /// The preflight gate's verdicts.
    pub preflight: &'a PreflightVerdict,
    /// The maintenance windows an upgrade's starts keep to, expanded at `now` (`None`: no
    /// window rule; a removal keeps to none).
    pub windows: Option<&'a Windows>,
    /// The health gates and what each read in this pass (`None`: no gates).
    pub gates: Option<&'a Gates>,
    /// Lock timing.
    pub config: &'a RolloutConfig,
    /// The current time.
    pub now: Timestamp,
}

/// What a Kubernetes upgrade is decided from, besides the machines: each machine's
/// [`MachineView::progress`] is its progress in this stage
/// ([`crate::machine::kubernetes::stage_converged`], [`crate::machine::kubernetes::past_apply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesInput {
    /// The stage the upgrade is in ([`crate::machine::kubernetes::kubernetes_stage`]).
    pub stage: KubernetesStage,
    /// What [`crate::kubernetes::plan::plan_kubernetes`] refused, if anything; judged
    /// before any machine starts, as a Talos upgrade's planning is.
    pub problems: Vec<KubernetesPlanProblem>,
    /// When the bootstrap manifests are recorded applied and not yet rolled out, their
    /// workloads' rollouts as observed in this pass (`None`: not read).
    pub rollouts: Option<Vec<WorkloadRollout>>,
    /// The control planes observed in this pass with every component the upgrade changes
    /// already on the target ([`crate::kubernetes::plan::NodeKubernetes::on_target`]): their
    /// turn changes nothing, so it needs no etcd snapshot. Read only while a snapshot is
    /// required and missing; a control plane not named here is taken to change.
    pub on_target: BTreeSet<String>,
}

/// What the preflight gate (see [`crate::preflight`]) found for the machines the engine
/// would start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreflightVerdict {
    /// Not gathered in this pass: a machine that would start is named in
    /// [`Decision::check_preflight`] instead, for the caller to gather and decide again.
    NotChecked,
    /// Gathered: each machine checked, with its blockers (none: clear). A machine not in
    /// the map was not checked.
    Checked(BTreeMap<String, Vec<Blocker>>),
    /// Gathered as far as the pass goes (its last round): as [`Self::Checked`], but a
    /// machine not in the map is not asked for either. It waits, starting nothing, until
    /// the blocked machines are looked at again ([`RolloutConfig::preflight_recheck`]):
    /// asking for it made a pass that could not gather it request another at once, for
    /// ever, while every machine it had checked stayed blocked (issue 29 item 6).
    Last(BTreeMap<String, Vec<Blocker>>),
    /// No gate: every machine is clear (a caller with nothing to check, as a test).
    Off,
}

impl PreflightVerdict {
    /// The blockers found for `machine`, or `None` if it was not checked.
    fn of(&self, machine: &str) -> Option<&[Blocker]> {
        match self {
            Self::NotChecked => None,
            Self::Checked(found) | Self::Last(found) => found.get(machine).map(Vec::as_slice),
            Self::Off => Some(&[]),
        }
    }
}

/// What to do with the cluster lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockAction {
    /// Write the Lease with this operation as holder; then observe again before anything
    /// else. `takeover_from` names a previous holder that is gone or whose lease expired.
    Acquire {
        /// The holder being replaced, if any.
        takeover_from: Option<String>,
    },
    /// This operation holds the Lease and must renew it now.
    Renew,
    /// This operation holds the Lease; no write needed.
    Keep,
    /// Release the Lease (completed, or wound down).
    Release,
    /// Do not touch the Lease: another live operation holds it, or this one has no use for it.
    Leave,
}

/// Something the caller reports as a Warning event; it does not stop the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// The order label is not an integer; the machine is ordered as if it had none.
    InvalidOrderLabel {
        /// The machine.
        machine: String,
        /// The label's value.
        value: String,
    },
    /// `spec.preflight: Warn`: the machine is started despite its blockers.
    PreflightIgnored {
        /// The machine.
        machine: String,
        /// Its blockers, as one line.
        blockers: String,
    },
}

impl Warning {
    /// The CamelCase event reason.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidOrderLabel { .. } => "InvalidOrderLabel",
            Self::PreflightIgnored { .. } => "PreflightIgnored",
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidOrderLabel { machine, value } => write!(
                f,
                "machine {machine}: label {} is {value:?}, not an integer; ordered as if it had none",
                crate::operation::ORDER_LABEL
            ),
            Self::PreflightIgnored { machine, blockers } => {
                write!(f, "machine {machine} started despite preflight blockers (spec.preflight: Warn): {blockers}")
            }
        }
    }
}

/// Whether a machine's Upgrade call, first or repeated, may go out in this pass (DESIGN §3
/// rule 3). Computed in the same pass as the call, never carried over: a machine in
/// progress is not exempt, and neither is the re-call of a void intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallAuthority {
    /// The call may go out.
    Granted,
    /// A control plane's call needs the etcd gate, not gathered in this pass: gather it and
    /// authorise again with [`call_authority`] before the call.
    NeedsEtcdGate,
    /// The call needs the preflight gate, judged in this pass about the machine's node
    /// and the nodes down with it: gather it and authorise again with [`call_authority`]
    /// before the call (issue 29 item 10: a machine is judged before its disruptive step,
    /// not only when it starts, whose evacuation can take its whole timeout first).
    NeedsPreflight,
    /// The call may not go out now; the machine waits.
    Denied(CallDenied),
}

/// Why a machine's Upgrade call may not go out in this pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallDenied {
    /// This operation does not hold the cluster lock.
    LockNotHeld,
    /// The machine, or its Node, is held.
    Held,
    /// The operation is paused after a failure.
    Paused,
    /// The operation is being deleted.
    Deleting,
    /// The operation is refused.
    Refused,
    /// The machine is not in this operation's cluster.
    NotInCluster,
    /// Another control plane's Node is not Ready.
    ControlPlaneNotReady {
        /// The control planes that are not Ready.
        nodes: Vec<String>,
    },
    /// Another control plane's own components (its static pods) are not all Ready.
    ControlPlaneComponentsNotReady {
        /// Each as `machine/component`.
        components: Vec<String>,
    },
    /// The etcd gate fails.
    EtcdUnhealthy {
        /// What fails.
        reason: String,
    },
    /// `spec.etcdSnapshot: Required` and no snapshot is recorded yet.
    EtcdSnapshotMissing,
    /// The etcd gate's verdict of this pass already authorises another control plane: one
    /// verdict authorises at most one disruptive control-plane step.
    GateSpent {
        /// The control plane it authorises.
        on: String,
    },
    /// The preflight gate, judged again before the call, finds blockers
    /// ([`PreflightMode::Enforce`]): the machine, started, waits (evacuated) until they
    /// clear, looked at again every [`RolloutConfig::preflight_recheck`].
    PreflightBlocked {
        /// The blockers, as users read them.
        blockers: String,
    },
}

impl CallDenied {
    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::LockNotHeld => "LockNotHeld",
            Self::Held => "Held",
            Self::Paused => "OperationPaused",
            Self::Deleting => "OperationDeleting",
            Self::Refused => "OperationRefused",
            Self::NotInCluster => "NotInCluster",
            Self::ControlPlaneNotReady { .. } => "ControlPlaneNotReady",
            Self::ControlPlaneComponentsNotReady { .. } => "ControlPlaneComponentNotReady",
            Self::EtcdUnhealthy { .. } => "EtcdUnhealthy",
            Self::EtcdSnapshotMissing => "EtcdSnapshotMissing",
            Self::GateSpent { .. } => "EtcdGateSpent",
            Self::PreflightBlocked { .. } => "PreflightBlocked",
        }
    }
}

impl fmt::Display for CallDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LockNotHeld => f.write_str("the operation does not hold the cluster lock"),
            Self::Held => f.write_str("the machine is held"),
            Self::Paused => f.write_str("the operation is paused"),
            Self::Deleting => f.write_str("the operation is being deleted"),
            Self::Refused => f.write_str("the operation is refused"),
            Self::NotInCluster => f.write_str("the machine is not in the operation's cluster"),
            Self::ControlPlaneNotReady { nodes } => {
                write!(f, "control-plane nodes not Ready: {}", nodes.join(", "))
            }
            Self::ControlPlaneComponentsNotReady { components } => {
                write!(f, "another control plane's components are not Ready: {}", components.join(", "))
            }
            Self::EtcdUnhealthy { reason } => write!(f, "the etcd gate fails: {reason}"),
            Self::EtcdSnapshotMissing => f.write_str("no etcd snapshot is recorded (spec.etcdSnapshot: Required)"),
            Self::GateSpent { on } => {
                write!(f, "this pass's etcd gate verdict already authorises control plane {on} (one per verdict)")
            }
            Self::PreflightBlocked { blockers } => write!(f, "the preflight blocks it now: {blockers}"),
        }
    }
}

/// The engine's decision for one pass. Plain data; the caller carries it out.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// What to do with the cluster lock, first.
    pub lock: LockAction,
    /// Failed machines that a resume retries: clear their failure records and what their
    /// failed attempt left, before anything else in this pass. They start again when the
    /// rules allow (maybe in this very pass: they can be in [`Decision::start`] too).
    pub retry: Vec<String>,
    /// Machines to start, in order.
    pub start: Vec<String>,
    /// Machines in progress to advance one step.
    pub advance: Vec<String>,
    /// Machines in progress, not past their Upgrade call, to stop: end their evacuation
    /// and record them as not started (a pause, a hold or a deletion).
    pub stop: Vec<String>,
    /// The operation's phase after this pass.
    pub phase: Phase,
    /// Machines not started because they are held.
    pub held: Vec<String>,
    /// Warnings to report as events.
    pub warnings: Vec<Warning>,
    /// A new resume token this pass acted upon; the caller records it in the status.
    pub acknowledge_resume: Option<String>,
    /// A control plane waits only for the etcd gate: gather it and decide again.
    pub check_etcd: bool,
    /// Machines that would start but for the preflight gate, not gathered yet: gather it
    /// for them and decide again.
    pub check_preflight: Vec<String>,
    /// Machines not started because the preflight gate found blockers, with them.
    pub preflight_blocked: Vec<(String, Vec<Blocker>)>,
    /// The control plane that would start but for the etcd snapshot the spec requires:
    /// take the snapshot (from any healthy control plane), record it, and decide again.
    pub take_etcd_snapshot: Option<String>,
    /// A Kubernetes upgrade with every machine through: apply the bootstrap manifests
    /// (server-side, read from a control plane), record them in the status
    /// ([`OperationStatus::manifests`]), and decide again.
    pub apply_manifests: bool,
    /// A new record of the bootstrap manifests (their workloads rolled out, or not within
    /// their bound): the caller writes it in the status ([`OperationStatus::manifests`]).
    pub record_manifests: Option<ManifestsState>,
    /// For each machine in [`Decision::start`] and [`Decision::advance`], whether its
    /// Upgrade call may go out in this pass. The executor's step makes no call without
    /// [`CallAuthority::Granted`].
    pub authority: BTreeMap<String, CallAuthority>,
    /// For the same machines, whether a machine already past its call may be finished in
    /// this pass ([`finish_authority`]): the lifecycle executor's reboot of an installed
    /// machine, which a pause or a hold does not interrupt but the etcd gate does.
    pub finish_authority: BTreeMap<String, CallAuthority>,
    /// Machines expected to start next (in order, at most `maxUnavailable`, none started or
    /// under way): pull the installer image onto them ahead of their turn, outside the pass.
    /// Nothing is recorded and a failed pull is no failure.
    pub prepull: Vec<String>,
    /// The operation is being deleted and nothing of it is left: remove its finalizer.
    pub finalized: bool,
    /// The target to record as the one the operation started with
    /// ([`OperationStatus::started_target`]): set when this pass starts or advances a
    /// machine and none is recorded yet.
    pub started_target: Option<String>,
    /// When to decide again at the latest, if nothing changes before.
    pub recheck_at: Option<Timestamp>,
    /// The health gates' states to record in the status ([`OperationStatus::gates`]);
    /// `None`: leave them as they are.
    pub gates: Option<BTreeMap<String, GateState>>,
}

impl Decision {
    fn new(lock: LockAction, phase: Phase) -> Self {
        Self {
            lock,
            retry: Vec::new(),
            start: Vec::new(),
            advance: Vec::new(),
            stop: Vec::new(),
            phase,
            held: Vec::new(),
            warnings: Vec::new(),
            acknowledge_resume: None,
            check_etcd: false,
            check_preflight: Vec::new(),
            preflight_blocked: Vec::new(),
            take_etcd_snapshot: None,
            apply_manifests: false,
            record_manifests: None,
            authority: BTreeMap::new(),
            finish_authority: BTreeMap::new(),
            prepull: Vec::new(),
            finalized: false,
            started_target: None,
            recheck_at: None,
            gates: None,
        }
    }

    /// A decision that advances `machines` and nothing else, under a lock the operation
    /// keeps: what a driver of single machines (a driver's own tests, the simulator's
    /// removal runner) hands the executor in place of a pass's decision. It grants no call
    /// ([`Decision::authority`] is empty): calls take their own [`CallAuthority`].
    pub fn advancing(machines: impl IntoIterator<Item = String>) -> Self {
        let mut decision = Self::new(LockAction::Keep, Phase::Progressing);
        decision.advance = machines.into_iter().collect();
        decision
    }

    /// Fills [`Decision::authority`] for every machine it starts or advances.
    fn authorise(mut self, input: &RolloutInput<'_>) -> Self {
        let wanted: Vec<&str> = self.start.iter().chain(&self.advance).map(String::as_str).collect();
        let authoriser = Authoriser::new(input, wanted);
        let authority =
            self.start.iter().chain(&self.advance).map(|name| (name.clone(), authoriser.authority(name))).collect();
        let finish = self
            .start
            .iter()
            .chain(&self.advance)
            .map(|name| (name.clone(), authoriser.finish_authority(name)))
            .collect();
        self.authority = authority;
        self.finish_authority = finish;
        self.one_control_plane_per_verdict(input);
        self
    }

    /// One gate verdict authorises at most one disruptive control-plane step: of the
    /// control planes granted in this pass, the first one already past its call (else the
    /// first to start) keeps its grants; every other one is denied, naming it. The rules
    /// keep one control plane in progress; this holds even when a race left two there.
    fn one_control_plane_per_verdict(&mut self, input: &RolloutInput<'_>) {
        let role_of = |name: &str| input.machines.iter().find(|m| m.name == name);
        let granted = |d: &Self, name: &str| {
            d.authority.get(name) == Some(&CallAuthority::Granted)
                || d.finish_authority.get(name) == Some(&CallAuthority::Granted)
        };
        let past_call = |name: &str| {
            role_of(name).is_some_and(|m| m.progress == MachineProgress::InProgress { past_upgrade_call: true })
        };
        let mut candidates: Vec<String> = self
            .advance
            .iter()
            .chain(&self.start)
            .filter(|name| role_of(name).is_some_and(|m| m.role == MachineRole::ControlPlane))
            .filter(|name| granted(self, name))
            .cloned()
            .collect();
        if candidates.len() < 2 {
            return;
        }
        // Stable: past their call first, then in the decision's order.
        candidates.sort_by_key(|name| !past_call(name));
        let on = candidates[0].clone();
        for name in &candidates[1..] {
            let denied = CallAuthority::Denied(CallDenied::GateSpent { on: on.clone() });
            self.authority.insert(name.clone(), denied.clone());
            self.finish_authority.insert(name.clone(), denied);
        }
    }

    /// The preflight gate, for a machine the rules would start now: whether to start it.
    /// A machine not checked yet is named in [`Decision::check_preflight`]; one with
    /// blockers is held back under [`PreflightMode::Enforce`] and started with a warning
    /// under [`PreflightMode::Warn`].
    fn preflight_admits(&mut self, input: &RolloutInput<'_>, mode: Option<PreflightMode>, machine: &str) -> bool {
        let Some(mode) = mode else { return true };
        match input.preflight.of(machine) {
            None => {
                if !matches!(input.preflight, PreflightVerdict::Last(_)) {
                    self.check_preflight.push(machine.to_owned());
                }
                false
            }
            Some([]) => true,
            Some(blockers) => match mode {
                PreflightMode::Enforce => {
                    self.preflight_blocked.push((machine.to_owned(), blockers.to_vec()));
                    false
                }
                PreflightMode::Warn => {
                    let blockers = describe(blockers);
                    self.warnings.push(Warning::PreflightIgnored { machine: machine.to_owned(), blockers });
                    true
                }
            },
        }
    }

    /// Why machines wait on the preflight gate, if they do: those it blocks, each with its
    /// blockers (none listed while the gate is still to be gathered).
    fn preflight_wait(&self) -> Option<WaitReason> {
        if self.preflight_blocked.is_empty() && self.check_preflight.is_empty() {
            return None;
        }
        let machines = self.preflight_blocked.iter().map(|(m, b)| (m.clone(), describe(b))).collect();
        Some(WaitReason::PreflightBlocked { machines })
    }

    /// Whether this decision starts or keeps advancing any machine.
    #[must_use]
    pub fn moves_machines(&self) -> bool {
        !self.start.is_empty() || !self.advance.is_empty()
    }
}

/// Decides one pass of one operation. Pure: the same input gives the same decision.
pub fn decide(input: &RolloutInput<'_>) -> Decision {
    decide_unauthorised(input).authorise(input)
}

/// What an operation is to do, once its spec has been read.
enum Asked<'a> {
    /// Upgrade every machine to the target.
    Upgrade(ValidSpec),
    /// Upgrade every machine's Kubernetes to the target, in this stage.
    Kubernetes(KubernetesSpec, KubernetesStage),
    /// Remove this machine.
    Remove(&'a str),
}

fn decide_unauthorised(input: &RolloutInput<'_>) -> Decision {
    let op = input.operation;
    let lock = LockState::observe(input);
    // A terminal phase is terminal: a Completed operation is never judged again against a
    // release set or a cluster that changed since (a release bump once turned one into
    // Refused and wiped its records). Only a new generation of its spec, or its deletion,
    // moves it.
    if op.status.phase == Phase::Completed && op.status.observed_generation == Some(op.generation) && !op.deleting {
        let action = if matches!(lock, LockState::Ours { .. }) { LockAction::Release } else { LockAction::Leave };
        return Decision::new(action, Phase::Completed);
    }

    let asked = if op.spec.is_removal() {
        match op.spec.validate_removal() {
            Ok(machine) => Asked::Remove(machine),
            Err(refusal) => return wind_down(input, &lock, Phase::Refused(refusal)),
        }
    } else if op.spec.is_kubernetes() {
        let spec = match op.spec.validate_kubernetes() {
            Ok(spec) => spec,
            Err(refusal) => return wind_down(input, &lock, Phase::Refused(refusal)),
        };
        let Some(kubernetes) = input.kubernetes else {
            return wind_down(input, &lock, Phase::Waiting(WaitReason::KubernetesNotObserved));
        };
        if let Some(refusal) = kubernetes_refusal(input, kubernetes) {
            return wind_down(input, &lock, Phase::Refused(refusal));
        }
        Asked::Kubernetes(spec, kubernetes.stage)
    } else {
        let spec = match op.spec.validate_with(input.release_talos_version, input.releases) {
            Ok(spec) => spec,
            Err(refusal) => return wind_down(input, &lock, Phase::Refused(refusal)),
        };
        if let Some(refusal) = plan_refusal(input, &spec) {
            return wind_down(input, &lock, Phase::Refused(refusal));
        }
        Asked::Upgrade(spec)
    };
    if let Some(refusal) = target_changed(op) {
        return wind_down(input, &lock, Phase::Refused(refusal));
    }
    if let (Some(Windows::Invalid(problem)), Asked::Upgrade(_) | Asked::Kubernetes(..)) = (input.windows, &asked) {
        return wind_down(input, &lock, Phase::Refused(Refusal::InvalidMaintenance { problem: problem.clone() }));
    }
    if let (Some(Gates::Invalid(problem)), Asked::Upgrade(_) | Asked::Kubernetes(..)) = (input.gates, &asked) {
        return wind_down(input, &lock, Phase::Refused(Refusal::InvalidGate { problem: problem.clone() }));
    }
    if let Asked::Remove(machine) = asked
        && !input.machines.iter().any(|m| m.name == machine)
        && !op.status.machines.contains_key(machine)
    {
        let refusal = Refusal::UnknownMachine { machine: machine.to_owned() };
        return wind_down(input, &lock, Phase::Refused(refusal));
    }
    if let Asked::Remove(machine) = asked
        && let Some(refusal) = two_control_planes_left(input, machine)
    {
        return wind_down(input, &lock, Phase::Refused(refusal));
    }
    if op.deleting {
        return wind_down(input, &lock, Phase::Waiting(WaitReason::WindingDown { machines: Vec::new() }));
    }

    let renewed_at = match lock {
        LockState::HeldBy { holder, until } => {
            let mut d = Decision::new(LockAction::Leave, Phase::Waiting(WaitReason::LockHeld { holder }));
            d.recheck_at = Some(until);
            return d;
        }
        LockState::Free => return acquire(input, None),
        LockState::TakeOver { from } => return acquire(input, Some(from)),
        LockState::Ours { renewed_at } => renewed_at,
    };
    let renew = input.now.saturating_since(renewed_at) >= input.config.renew_after;
    let (action, renewed_at) = if renew { (LockAction::Renew, input.now) } else { (LockAction::Keep, renewed_at) };

    // A percentage `maxUnavailable` is of the workers the cluster has now.
    let workers = input.machines.iter().filter(|m| m.role == MachineRole::Worker).count();
    let mut d = match asked {
        Asked::Upgrade(spec) => schedule(input, &Rules::talos(&spec, workers), action),
        Asked::Kubernetes(spec, stage) => schedule(input, &Rules::kubernetes(&spec, stage, workers), action),
        Asked::Remove(machine) => schedule_removal(input, machine, action),
    };
    if d.lock != LockAction::Release {
        d.recheck_at = Timestamp::min_opt(d.recheck_at, Some(renewed_at.saturating_add(input.config.renew_after)));
    }
    if op.status.started_target.is_none() && !op.spec.is_removal() && d.moves_machines() {
        d.started_target = Some(op.spec.target_version.clone());
    }
    d
}

/// A started operation whose spec's target is no longer the one it started with
/// (issue 53 item 1): refused, whatever wrote it. The CRD refuses the edit at admission;
/// this holds behind an API server that does not, or a status written before it.
/// Machines past their call are still observed on the target they started with.
fn target_changed(op: &OperationView) -> Option<Refusal> {
    let started = op.status.started_target.as_deref()?;
    let bare = |v: &str| v.trim().trim_start_matches('v').to_owned();
    (bare(started) != bare(&op.spec.target_version))
        .then(|| Refusal::TargetChanged { started: started.to_owned(), now: op.spec.target_version.clone() })
}

/// A removal of control plane `machine` that would leave two, not started yet and not
/// allowed by the operation (issue 34): a two-member etcd loses quorum with either member,
/// and the next upgrade refuses the cluster. A removal already started is never refused
/// half way: it is finished. The machines are the cluster's not yet removed.
fn two_control_planes_left(input: &RolloutInput<'_>, machine: &str) -> Option<Refusal> {
    let op = input.operation;
    if op.spec.allow_two_control_planes || op.status.machines.contains_key(machine) {
        return None;
    }
    let view = input.machines.iter().find(|m| m.name == machine)?;
    if view.role != MachineRole::ControlPlane || !matches!(view.progress, MachineProgress::Pending) {
        return None;
    }
    let others = input.machines.iter().filter(|m| m.role == MachineRole::ControlPlane && m.name != machine).count();
    removal_refusal(false, machine, view.role, others)
}

/// Whether the removal of `machine` (of `role`) is refused before it starts, with
/// `other_control_planes` control planes besides it left in the cluster: a control plane
/// whose removal leaves two is, unless `allowed` (`spec.allowTwoControlPlanes`).
#[must_use]
pub fn removal_refusal(
    allowed: bool,
    machine: &str,
    role: MachineRole,
    other_control_planes: usize,
) -> Option<Refusal> {
    (!allowed && role == MachineRole::ControlPlane && other_control_planes == 2)
        .then(|| Refusal::LeavesTwoControlPlanes { machine: machine.to_owned() })
}

/// A removal under the cluster's lock: the one machine is started, advanced until it is
/// removed (then the lock is released), paused on its failure and retried on a resume. Its
/// own step guards etcd (a member leaves only while etcd is healthy).
fn schedule_removal(input: &RolloutInput<'_>, machine: &str, lock: LockAction) -> Decision {
    let op = input.operation;
    let resuming = op.resume_token.is_some() && op.resume_token != op.status.observed_resume;
    let mut d = Decision::new(lock, Phase::Progressing);
    if resuming {
        d.acknowledge_resume.clone_from(&op.resume_token);
    }
    let observed = input.machines.iter().find(|m| m.name == machine).map(|m| m.progress.clone());
    // A machine not observed stands where its record says: gone after its removal was
    // recorded converged, or not seen (yet) while under way, which is waited out.
    let progress = match observed {
        Some(progress) => progress,
        None => match op.status.machines.get(machine).map(|r| (r.state, r)) {
            Some((RecordState::Failed, record)) => MachineProgress::Failed { reason: record.message.clone() },
            Some((RecordState::InProgress, _)) => {
                let wait = WaitReason::MachinesUnobserved { machines: vec![machine.to_owned()] };
                d.phase = Phase::Waiting(wait);
                return d;
            }
            Some((RecordState::Converged, _)) | None => MachineProgress::Converged,
        },
    };
    match &progress {
        MachineProgress::Converged => {
            d.lock = LockAction::Release;
            d.phase = Phase::Completed;
        }
        MachineProgress::Failed { reason } if !resuming => {
            let failed = vec![FailedMachine { name: machine.to_owned(), reason: reason.clone() }];
            d.phase = Phase::Paused(PauseReason::MachineFailed { machines: failed });
        }
        // A person's pause: nothing begins. A removal under way is carried on: its steps
        // answer to no call authority, and one stopped half way would leave its node
        // drained and half out of etcd.
        _ if op.pause_requested.is_some() => {
            if matches!(progress, MachineProgress::InProgress { .. }) {
                d.advance.push(machine.to_owned());
            }
            d.phase = Phase::Paused(PauseReason::Requested { by: op.pause_requested.clone().unwrap_or_default() });
        }
        MachineProgress::Failed { .. } => {
            d.retry.push(machine.to_owned());
            d.start.push(machine.to_owned());
        }
        MachineProgress::Pending => d.start.push(machine.to_owned()),
        MachineProgress::InProgress { .. } => d.advance.push(machine.to_owned()),
    }
    d
}

/// Whether `machine`'s Upgrade call may go out in this pass: for any machine, this
/// operation holds the lock, is neither refused, paused nor being deleted, and the machine
/// is not held; for a control plane, also every other control-plane Node is Ready and the
/// etcd gate passed in this pass ([`RolloutInput::etcd`]). Pure; [`decide`] fills
/// [`Decision::authority`] with it, and a caller that gathers the gate later in the same
/// pass asks again with the verdict.
#[must_use]
pub fn call_authority(input: &RolloutInput<'_>, machine: &str) -> CallAuthority {
    Authoriser::new(input, vec![machine]).authority(machine)
}

/// Whether a machine already past its call may be finished in this pass (the lifecycle
/// executor's reboot of an installed machine), as [`Decision::finish_authority`] says: the
/// lock held and, on a control plane, every other control plane Ready and the etcd gate
/// passed in this same pass; a pause, a hold or a deletion does not deny it.
#[must_use]
pub fn finish_authority(input: &RolloutInput<'_>, machine: &str) -> CallAuthority {
    Authoriser::new(input, vec![machine]).finish_authority(machine)
}

/// What authorises calls in a pass, computed once for all its machines.
struct Authoriser<'a> {
    input: &'a RolloutInput<'a>,
    /// Why no call at all may go out, if so.
    operation_denied: Option<CallDenied>,
    /// The control planes whose Nodes are not Ready.
    control_planes_not_ready: Vec<&'a str>,
    /// The machines asked about, by name.
    by_name: BTreeMap<&'a str, &'a MachineView>,
}

impl<'a> Authoriser<'a> {
    /// What authorises calls for the machines `wanted`.
    fn new(input: &'a RolloutInput<'a>, wanted: Vec<&str>) -> Self {
        let op = input.operation;
        let resuming = op.resume_token.is_some() && op.resume_token != op.status.observed_resume;
        let operation_denied = if !matches!(LockState::observe(input), LockState::Ours { .. }) {
            Some(CallDenied::LockNotHeld)
        } else if op.deleting {
            Some(CallDenied::Deleting)
        } else if !refused(input) {
            let failed = input.machines.iter().any(|m| matches!(m.progress, MachineProgress::Failed { .. }))
                || matches!(op.status.etcd_snapshot, Some(SnapshotState::Failed { .. }));
            ((!resuming && failed) || op.pause_requested.is_some()).then_some(CallDenied::Paused)
        } else {
            Some(CallDenied::Refused)
        };
        let control_planes_not_ready = input
            .machines
            .iter()
            .filter(|m| m.role == MachineRole::ControlPlane && !m.node_ready)
            .map(|m| m.name.as_str())
            .collect();
        let wanted: HashSet<&str, FixedState> = wanted.into_iter().collect();
        let by_name =
            input.machines.iter().filter(|m| wanted.contains(m.name.as_str())).map(|m| (m.name.as_str(), m)).collect();
        Self { input, operation_denied, control_planes_not_ready, by_name }
    }

    fn authority(&self, machine: &str) -> CallAuthority {
        if let Some(denied) = &self.operation_denied {
            return CallAuthority::Denied(denied.clone());
        }
        let Some(m) = self.by_name.get(machine) else {
            return CallAuthority::Denied(CallDenied::NotInCluster);
        };
        if m.held {
            return CallAuthority::Denied(CallDenied::Held);
        }
        if m.role == MachineRole::ControlPlane && snapshot_missing(self.input) && !already_on_target(self.input, m) {
            if let Some(denied) = self.others_not_ready(m) {
                return CallAuthority::Denied(denied);
            }
            return CallAuthority::Denied(CallDenied::EtcdSnapshotMissing);
        }
        if let Some(not_now) = self.preflight(m) {
            return not_now;
        }
        self.disruption(m)
    }

    /// The preflight gate before the first call (the Upgrade call, the install): `None`
    /// when it lets the call go; judged in this pass or to be gathered. Under
    /// [`PreflightMode::Warn`] it never stops a call (the start recorded the warning).
    fn preflight(&self, m: &MachineView) -> Option<CallAuthority> {
        if self.input.operation.spec.is_kubernetes() {
            // A kubelet or a static pod restarting is no disruption the gate weighs.
            return None;
        }
        let mode = self.input.operation.spec.preflight.unwrap_or_default();
        match (self.input.preflight.of(&m.name), mode) {
            (_, PreflightMode::Warn) | (Some([]), PreflightMode::Enforce) => None,
            (None, PreflightMode::Enforce) => Some(CallAuthority::NeedsPreflight),
            (Some(blockers), PreflightMode::Enforce) => {
                Some(CallAuthority::Denied(CallDenied::PreflightBlocked { blockers: describe(blockers) }))
            }
        }
    }

    /// The authority to finish a machine already past its call (the lifecycle executor's
    /// reboot of an installed machine): a pause, a hold or a deletion does not interrupt
    /// it, but the lock must be held and, on a control plane, every other control plane
    /// Ready and the etcd gate passed in this pass.
    fn finish_authority(&self, machine: &str) -> CallAuthority {
        if matches!(self.operation_denied, Some(CallDenied::LockNotHeld)) {
            return CallAuthority::Denied(CallDenied::LockNotHeld);
        }
        let Some(m) = self.by_name.get(machine) else {
            return CallAuthority::Denied(CallDenied::NotInCluster);
        };
        self.disruption(m)
    }

    fn others_not_ready(&self, m: &MachineView) -> Option<CallDenied> {
        let others: Vec<String> =
            self.control_planes_not_ready.iter().filter(|n| **n != m.name).map(|n| (*n).to_owned()).collect();
        (!others.is_empty()).then_some(CallDenied::ControlPlaneNotReady { nodes: others })
    }

    /// Whether taking `m` down is safe now: a worker always (its count is the rules'); a
    /// control plane with every other one's Node and components Ready and the etcd gate
    /// passed.
    fn disruption(&self, m: &MachineView) -> CallAuthority {
        if m.role == MachineRole::Worker {
            return CallAuthority::Granted;
        }
        if let Some(denied) = self.others_not_ready(m) {
            return CallAuthority::Denied(denied);
        }
        match self.input.components.others_not_ready(&m.name) {
            Err(denied) => return CallAuthority::Denied(denied),
            Ok(components) if !components.is_empty() => {
                return CallAuthority::Denied(CallDenied::ControlPlaneComponentsNotReady { components });
            }
            Ok(_) if *self.input.components == ComponentsVerdict::NotChecked => return CallAuthority::NeedsEtcdGate,
            Ok(_) => {}
        }
        match self.input.etcd {
            EtcdVerdict::Healthy => CallAuthority::Granted,
            EtcdVerdict::Unhealthy { reason } => {
                CallAuthority::Denied(CallDenied::EtcdUnhealthy { reason: reason.clone() })
            }
            EtcdVerdict::NotChecked => CallAuthority::NeedsEtcdGate,
        }
    }
}

/// Whether the operation is refused (its spec, or its planning): no call goes out.
fn refused(input: &RolloutInput<'_>) -> bool {
    let spec = &input.operation.spec;
    if target_changed(input.operation).is_some() {
        return true;
    }
    if spec.is_kubernetes() {
        spec.validate_kubernetes().is_err()
            || input.kubernetes.is_none_or(|kubernetes| kubernetes_refusal(input, kubernetes).is_some())
    } else {
        !spec
            .validate_with(input.release_talos_version, input.releases)
            .is_ok_and(|spec| plan_refusal(input, &spec).is_none())
    }
}

/// Whether no machine of this operation has started (planning is judged only then).
fn not_started(input: &RolloutInput<'_>) -> bool {
    input.operation.status.machines.is_empty()
        && input.machines.iter().all(|m| matches!(m.progress, MachineProgress::Pending))
}

/// A Kubernetes upgrade's planning, before any machine of it has started: what
/// [`crate::kubernetes::plan::plan_kubernetes`] refused, and the cluster's own shape (two
/// control planes, duplicate names, Nodes without machines), as for a Talos upgrade.
fn kubernetes_refusal(input: &RolloutInput<'_>, kubernetes: &KubernetesInput) -> Option<Refusal> {
    if !not_started(input) {
        return None;
    }
    let mut problems = shape_problems(input);
    problems.extend(kubernetes.problems.iter().cloned().map(PlanProblem::Kubernetes));
    (!problems.is_empty()).then_some(Refusal::Unplannable { problems })
}

/// Whether a control plane must wait for an etcd snapshot: required by the spec (an
/// invalid spec requires one too) and none recorded.
fn snapshot_missing(input: &RolloutInput<'_>) -> bool {
    let op = input.operation;
    op.spec.etcd_snapshot.unwrap_or_default() == SnapshotMode::Required
        && op.status.etcd_snapshot.as_ref().and_then(SnapshotState::taken).is_none()
}

/// Whether `m` already runs the operation's target: its Node the Talos target, or for a
/// Kubernetes upgrade every component the upgrade changes (as observed in this pass). Its
/// turn makes no call and changes nothing, so it needs no etcd snapshot (decision 0009:
/// nothing is done when nothing is to be done; issue 53 item 6).
fn already_on_target(input: &RolloutInput<'_>, m: &MachineView) -> bool {
    let spec = &input.operation.spec;
    if spec.kind == "kubernetes" {
        return input.kubernetes.is_some_and(|k| k.on_target.contains(&m.name));
    }
    if spec.kind != "talos" {
        return false;
    }
    let running = m.os_image.as_deref().and_then(|image| TalosVersion::from_os_image(image).ok());
    running.is_some() && running == TalosVersion::parse(&spec.target_version).ok()
}

/// Planning, before any machine of this operation has started: every problem that would
/// stop the rollout part way, found up front so that nothing is touched (DESIGN §9):
/// duplicate machine names, exactly two control planes, a Kubernetes version the target
/// does not run, and each machine's version against the target (the upgrade path). A
/// machine whose Node could not be read is checked when it starts.
fn plan_refusal(input: &RolloutInput<'_>, spec: &ValidSpec) -> Option<Refusal> {
    if !not_started(input) {
        return None;
    }
    let mut problems = shape_problems(input);
    if is_unknown_release(&spec.target) {
        // Its Kubernetes range and its path are unknown too: saying so per node and per
        // minor line would bury the one thing wrong.
        let (target, newest) = (spec.target.to_string(), newest_known_talos().talos());
        problems.push(PlanProblem::UnknownRelease { target, newest });
        return Some(Refusal::Unplannable { problems });
    }
    match KubernetesVersion::parse(input.kubernetes_version) {
        Ok(kubernetes) => {
            if let Err(refusal) = check_kubernetes_pairing(&spec.target, &kubernetes) {
                problems.push(PlanProblem::KubernetesPairing { refusal: refusal.to_string() });
            }
        }
        Err(e) => problems.push(PlanProblem::BadKubernetesVersion { error: e.to_string() }),
    }
    let mut by_refusal: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in input.machines {
        let Some(os_image) = &m.os_image else { continue };
        match TalosVersion::from_os_image(os_image) {
            Ok(version) => {
                if let Err(refusal) = check_upgrade_path(&version, &spec.target) {
                    by_refusal.entry(refusal.to_string()).or_default().push(m.name.clone());
                }
            }
            Err(e) => problems.push(PlanProblem::BadOsImage { machine: m.name.clone(), error: e.to_string() }),
        }
    }
    problems.extend(by_refusal.into_iter().map(|(refusal, machines)| PlanProblem::UpgradePath { machines, refusal }));
    (!problems.is_empty()).then_some(Refusal::Unplannable { problems })
}

/// The planning problems of any upgrade from the cluster's own shape: duplicate machine
/// names, exactly two control planes, Nodes without machines.
fn shape_problems(input: &RolloutInput<'_>) -> Vec<PlanProblem> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    let duplicates: BTreeSet<&str> =
        input.machines.iter().map(|m| m.name.as_str()).filter(|name| !seen.insert(*name)).collect();
    if !duplicates.is_empty() {
        problems
            .push(PlanProblem::DuplicateMachineNames { names: duplicates.into_iter().map(str::to_owned).collect() });
    }
    let control_planes: Vec<String> =
        input.machines.iter().filter(|m| m.role == MachineRole::ControlPlane).map(|m| m.name.clone()).collect();
    if control_planes.len() == 2 {
        problems.push(PlanProblem::TwoControlPlanes { machines: control_planes });
    }
    if !input.unaccounted_nodes.is_empty() {
        problems.push(PlanProblem::NodesWithoutMachines { nodes: input.unaccounted_nodes.to_vec() });
    }
    problems
}

/// The cluster lock as this operation sees it.
enum LockState {
    Free,
    Ours { renewed_at: Timestamp },
    TakeOver { from: String },
    HeldBy { holder: String, until: Timestamp },
}

impl LockState {
    fn observe(input: &RolloutInput<'_>) -> Self {
        let Some(lease) = input.lease else { return Self::Free };
        if lease.identity == input.operation.identity {
            return Self::Ours { renewed_at: lease.renewed_at };
        }
        let until = lease.renewed_at.saturating_add(lease.lease_duration);
        if !lease.holder_exists || input.now >= until {
            Self::TakeOver { from: lease.identity.clone() }
        } else {
            Self::HeldBy { holder: lease.identity.clone(), until }
        }
    }
}

fn acquire(input: &RolloutInput<'_>, takeover_from: Option<String>) -> Decision {
    let mut d = Decision::new(LockAction::Acquire { takeover_from }, Phase::Pending);
    d.recheck_at = Some(input.now);
    d
}

/// A refused or deleted operation: nothing new starts; machines past their Upgrade call
/// are still observed until they verify (if this operation holds the lock); others stop.
fn wind_down(input: &RolloutInput<'_>, lock: &LockState, phase: Phase) -> Decision {
    let LockState::Ours { renewed_at } = *lock else {
        let mut d = Decision::new(LockAction::Leave, phase);
        d.finalized = input.operation.deleting;
        if let LockState::HeldBy { until, .. } = lock {
            d.recheck_at = Some(*until);
        }
        return d;
    };
    let mut d = Decision::new(LockAction::Keep, phase);
    for m in input.machines {
        match m.progress {
            MachineProgress::InProgress { past_upgrade_call: true } => d.advance.push(m.name.clone()),
            MachineProgress::InProgress { past_upgrade_call: false } => d.stop.push(m.name.clone()),
            MachineProgress::Pending | MachineProgress::Converged | MachineProgress::Failed { .. } => {}
        }
    }
    if d.advance.is_empty() && d.stop.is_empty() {
        d.lock = LockAction::Release;
        d.finalized = input.operation.deleting;
    } else {
        if input.now.saturating_since(renewed_at) >= input.config.renew_after {
            d.lock = LockAction::Renew;
        }
        d.recheck_at = Some(renewed_at.max(input.now).saturating_add(input.config.renew_after));
    }
    if let Phase::Waiting(WaitReason::WindingDown { machines }) = &mut d.phase {
        machines.clone_from(&d.advance);
    }
    d
}

/// What the engine makes of one machine in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// In progress and kept going.
    Advancing,
    /// In progress, not past its call, interrupted by a pause or a hold.
    Stopping,
    /// May be started (pending, or failed and being retried after a resume).
    Candidate,
    /// Held and not in progress.
    Held,
    /// On the target.
    Converged,
    /// Failed, and no resume yet.
    Failed,
}

/// Ordering key within a role: the controller's own machine after all others, then the
/// order label ascending, machines without one (or with one that is not an integer) last,
/// then the name, in natural order.
fn order_key(m: &MachineView) -> (bool, bool, i64, NameOrder<'_>) {
    start_order(m.order_label.as_deref(), m.last, &m.name)
}

/// The key the engine orders a role's machines by (smallest first): the controller's own
/// machine (`last`) after all others, then the [`crate::operation::ORDER_LABEL`] value
/// ascending, machines without one (or with one that is not an integer) last, then the
/// name in natural order ([`NameOrder`]). A plan of the rollout orders by the same key.
#[must_use]
pub fn start_order<'a>(order_label: Option<&str>, last: bool, name: &'a str) -> (bool, bool, i64, NameOrder<'a>) {
    let order = order_label.and_then(|v| v.parse::<i64>().ok());
    (last, order.is_none(), order.unwrap_or(0), NameOrder(name))
}

/// A machine's name as the engine orders names: by the text before its trailing number,
/// then by that number, then by the whole text, so that `worker-2` goes before
/// `worker-10` as people expect (in text order `worker-10` went first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NameOrder<'a>(pub &'a str);

impl<'a> NameOrder<'a> {
    /// The text before the trailing number, and the number (`None`: no trailing digits, or
    /// more than fit in a `u128`).
    fn split(self) -> (&'a str, Option<u128>) {
        let text = self.0;
        let at = text.len() - text.bytes().rev().take_while(u8::is_ascii_digit).count();
        (&text[..at], text[at..].parse().ok())
    }
}

impl Ord for NameOrder<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.split().cmp(&other.split()).then_with(|| self.0.cmp(other.0))
    }
}

impl PartialOrd for NameOrder<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The rules of an upgrade's schedule, whatever it upgrades.
struct Rules {
    /// How many workers may be unavailable at once.
    max_unavailable: u32,
    /// The preflight gate's mode; `None`: no gate (a Kubernetes upgrade restarts
    /// components, it takes no node out).
    preflight: Option<PreflightMode>,
    /// For a Kubernetes upgrade, its stage: in the first, only control planes start and
    /// the operation does not complete.
    stage: Option<KubernetesStage>,
    /// For a Kubernetes upgrade, its target: it completes once its bootstrap manifests
    /// are applied for it.
    kubernetes_target: Option<KubernetesVersion>,
}

impl Rules {
    /// `workers`: how many the cluster has, against which a percentage is taken.
    fn talos(spec: &ValidSpec, workers: usize) -> Self {
        Self {
            max_unavailable: spec.max_unavailable.of(workers),
            preflight: Some(spec.preflight),
            stage: None,
            kubernetes_target: None,
        }
    }

    fn kubernetes(spec: &KubernetesSpec, stage: KubernetesStage, workers: usize) -> Self {
        Self {
            max_unavailable: spec.max_unavailable.of(workers),
            preflight: None,
            stage: Some(stage),
            kubernetes_target: Some(spec.target.clone()),
        }
    }
}
/// The machines in the engine's order: by role, then by [`order_key`]. They usually come
/// in the same order pass after pass: sorted once, checked after.
fn in_order(machines: &[MachineView]) -> Vec<&MachineView> {
    fn key<'m>(m: &&'m MachineView) -> (MachineRole, (bool, bool, i64, NameOrder<'m>)) {
        (m.role, order_key(m))
    }
    let mut machines: Vec<&MachineView> = machines.iter().collect();
    // Each key is made once (an order label is parsed), not once per neighbour.
    let mut keys = machines.iter().map(key);
    let sorted =
        keys.next().is_none_or(|first| keys.try_fold(first, |previous, k| (previous <= k).then_some(k)).is_some());
    if !sorted {
        machines.sort_by_cached_key(key);
    }
    machines
}

/// Machines recorded as under way or failed that are not observed: what they are doing is
/// not known, so nothing completes or starts on a guess (a cache not filled yet looks
/// exactly like this).
fn unobserved<'a>(input: &RolloutInput<'a>) -> Vec<(&'a String, &'a MachineRecord)> {
    let op = input.operation;
    if !op.status.machines.values().any(|r| r.state != RecordState::Converged) {
        return Vec::new();
    }
    let seen: HashSet<&str, FixedState> = input.machines.iter().map(|m| m.name.as_str()).collect();
    op.status
        .machines
        .iter()
        .filter(|(name, r)| r.state != RecordState::Converged && !seen.contains(name.as_str()))
        .collect()
}

/// The machines that failed (observed, or recorded and not observed), none when resuming.
fn failed_machines(
    machines: &[&MachineView],
    unobserved: &[(&String, &MachineRecord)],
    resuming: bool,
) -> Vec<FailedMachine> {
    if resuming {
        return Vec::new();
    }
    let recorded = unobserved.iter().filter(|(_, r)| r.state == RecordState::Failed);
    let recorded = recorded.map(|(name, r)| FailedMachine { name: (*name).clone(), reason: r.message.clone() });
    machines
        .iter()
        .filter_map(|m| match &m.progress {
            MachineProgress::Failed { reason } => Some(FailedMachine { name: m.name.clone(), reason: reason.clone() }),
            MachineProgress::Pending | MachineProgress::InProgress { .. } | MachineProgress::Converged => None,
        })
        .chain(recorded)
        .collect()
}

/// What the engine makes of each machine in this pass.
fn slots<'m>(machines: &[&'m MachineView], paused: bool, resuming: bool) -> Vec<(&'m MachineView, Slot)> {
    machines
        .iter()
        .map(|m| {
            let slot = match &m.progress {
                MachineProgress::InProgress { past_upgrade_call: true } => Slot::Advancing,
                MachineProgress::InProgress { past_upgrade_call: false } if paused || m.held => Slot::Stopping,
                MachineProgress::InProgress { past_upgrade_call: false } => Slot::Advancing,
                MachineProgress::Converged => Slot::Converged,
                MachineProgress::Failed { .. } if !resuming => Slot::Failed,
                MachineProgress::Pending | MachineProgress::Failed { .. } if m.held => Slot::Held,
                MachineProgress::Pending | MachineProgress::Failed { .. } => Slot::Candidate,
            };
            (*m, slot)
        })
        .collect()
}

/// The decision's lists from the slots: the machines retried, advanced, stopped and held,
/// and a warning for each order label that is not an integer.
fn sort_into(d: &mut Decision, slots: &[(&MachineView, Slot)], resuming: bool) {
    for (m, slot) in slots {
        if resuming && matches!(m.progress, MachineProgress::Failed { .. }) {
            d.retry.push(m.name.clone());
        }
        if let Some(value) = m.order_label.as_deref().filter(|v| v.parse::<i64>().is_err()) {
            d.warnings.push(Warning::InvalidOrderLabel { machine: m.name.clone(), value: value.to_owned() });
        }
        match slot {
            Slot::Advancing => d.advance.push(m.name.clone()),
            Slot::Stopping => d.stop.push(m.name.clone()),
            Slot::Held => d.held.push(m.name.clone()),
            Slot::Candidate | Slot::Converged | Slot::Failed => {}
        }
    }
}

/// The schedule of an upgrade's pass while this operation holds the lock: which machines
/// advance, stop and start, and the operation's phase.
fn schedule(input: &RolloutInput<'_>, spec: &Rules, lock: LockAction) -> Decision {
    let op = input.operation;
    let resuming = op.resume_token.is_some() && op.resume_token != op.status.observed_resume;
    let machines = in_order(input.machines);
    let unobserved = unobserved(input);
    let failed = failed_machines(&machines, &unobserved, resuming);
    let snapshot_failed = match &op.status.etcd_snapshot {
        Some(SnapshotState::Failed { reason, .. }) if !resuming => Some(reason.clone()),
        _ => None,
    };
    let gates = tracked_gates(input, resuming);
    let gate_timed_out = gates.as_ref().and_then(|states| timed_out_gate(input, states));
    let paused =
        !failed.is_empty() || snapshot_failed.is_some() || gate_timed_out.is_some() || op.pause_requested.is_some();
    let slots = slots(&machines, paused, resuming);

    let mut d = Decision::new(lock, Phase::Progressing);
    d.gates = gates;
    if resuming {
        d.acknowledge_resume.clone_from(&op.resume_token);
    }
    sort_into(&mut d, &slots, resuming);
    if paused {
        // A failure is said first: a person's pause does not hide it, and lifting the
        // pause leaves it to be resumed.
        d.phase = match (snapshot_failed, gate_timed_out, &op.pause_requested) {
            _ if !failed.is_empty() => Phase::Paused(PauseReason::MachineFailed { machines: failed }),
            (Some(reason), _, _) => Phase::Paused(PauseReason::EtcdSnapshotFailed { reason }),
            (None, Some(timed_out), _) => Phase::Paused(timed_out),
            (None, None, by) => Phase::Paused(PauseReason::Requested { by: by.clone().unwrap_or_default() }),
        };
        return d;
    }
    if !unobserved.is_empty() {
        let machines = unobserved.into_iter().map(|(name, _)| name.clone()).collect();
        d.phase = if d.moves_machines() {
            Phase::Progressing
        } else {
            Phase::Waiting(WaitReason::MachinesUnobserved { machines })
        };
        return d;
    }

    let (control_planes, workers): (Vec<_>, Vec<_>) =
        slots.iter().partition(|(m, _)| m.role == MachineRole::ControlPlane);
    let blocked = match start_control_plane(input, spec.preflight, &control_planes, &mut d) {
        // The first stage of a Kubernetes upgrade is the control planes' alone: the
        // kubelets go once every API server is on the target.
        // A control plane held keeps the stage from ending: the operation waits on it,
        // naming it, as a Talos upgrade does (issue 53 item 5), never Progressing for ever.
        Stage::Done if spec.stage == Some(KubernetesStage::ControlPlane) => {
            let held: Vec<String> =
                control_planes.iter().filter(|(_, slot)| *slot == Slot::Held).map(|(m, _)| m.name.clone()).collect();
            d.phase = if d.moves_machines() || !d.stop.is_empty() || held.is_empty() {
                Phase::Progressing
            } else {
                Phase::Waiting(WaitReason::Held { machines: held })
            };
            return d;
        }
        Stage::Done => start_workers(input, spec, &workers, &mut d),
        Stage::Busy => None,
        Stage::Blocked(wait) => Some(wait),
    };
    d.phase = phase_after_starts(input, spec, &mut d, blocked, resuming);
    look_ahead(input, spec, &slots, &mut d);
    d
}

/// The phase once the machines to start are chosen: Progressing while machines move,
/// Waiting on what blocks or holds them, else (every machine through) Completed, a
/// Kubernetes upgrade's once its bootstrap manifests are applied and rolled out.
fn phase_after_starts(
    input: &RolloutInput<'_>,
    spec: &Rules,
    d: &mut Decision,
    blocked: Option<WaitReason>,
    resuming: bool,
) -> Phase {
    if d.moves_machines() {
        Phase::Progressing
    } else if let Some(wait) = blocked {
        Phase::Waiting(wait)
    } else if !d.held.is_empty() {
        Phase::Waiting(WaitReason::Held { machines: d.held.clone() })
    } else if !d.stop.is_empty() {
        // Interrupted machines are still being stopped; nothing else left to do.
        Phase::Progressing
    } else if !input.unaccounted_nodes.is_empty() {
        Phase::Waiting(WaitReason::NodesWithoutMachines { nodes: input.unaccounted_nodes.to_vec() })
    } else if let Some(wait) = gate_wait(input, None, d) {
        Phase::Waiting(wait)
    } else if let Some(target) = spec.kubernetes_target.as_ref() {
        manifests_phase(input, target, d, resuming)
    } else {
        d.lock = LockAction::Release;
        Phase::Completed
    }
}

/// A Kubernetes upgrade ends with its bootstrap manifests, applied and rolled out.
fn manifests_phase(input: &RolloutInput<'_>, target: &KubernetesVersion, d: &mut Decision, resuming: bool) -> Phase {
    let rollouts = input.kubernetes.and_then(|k| k.rollouts.as_deref());
    match manifests_step(input.operation.status.manifests.as_ref(), target, resuming, rollouts, input.now) {
        ManifestsStep::Done => {
            d.lock = LockAction::Release;
            Phase::Completed
        }
        ManifestsStep::Apply => {
            d.apply_manifests = true;
            d.recheck_at = Some(input.now);
            Phase::Progressing
        }
        ManifestsStep::Record(state) => {
            d.record_manifests = Some(state);
            d.recheck_at = Some(input.now);
            Phase::Progressing
        }
        ManifestsStep::Wait { recheck_at } => {
            d.recheck_at = Timestamp::min_opt(d.recheck_at, Some(recheck_at));
            Phase::Progressing
        }
        ManifestsStep::Failed { reason } => Phase::Paused(PauseReason::ManifestsFailed { reason }),
    }
}

/// The next machines to start, in the order they will, offered their installer's pull
/// ahead (a Talos upgrade's alone), and when to look again for the gates asked or the
/// preflight's holds.
fn look_ahead(input: &RolloutInput<'_>, spec: &Rules, slots: &[(&MachineView, Slot)], d: &mut Decision) {
    let ahead = if spec.stage.is_some() { 0 } else { usize::try_from(spec.max_unavailable).unwrap_or(1).max(1) };
    d.prepull = slots
        .iter()
        .filter(|(m, slot)| *slot == Slot::Candidate && m.node_ready && !d.start.contains(&m.name))
        .take(ahead)
        .map(|(m, _)| m.name.clone())
        .collect();
    if d.check_etcd || !d.check_preflight.is_empty() || d.take_etcd_snapshot.is_some() {
        d.recheck_at = Some(input.now);
    } else if !d.preflight_blocked.is_empty() {
        let again = input.now.saturating_add(input.config.preflight_recheck);
        d.recheck_at = Timestamp::min_opt(d.recheck_at, Some(again));
    }
}

/// How a role's stage of the rollout stands.
enum Stage {
    /// Nothing left to start in this role (later roles may go).
    Done,
    /// Machines of this role are in progress or were just started.
    Busy,
    /// Machines of this role wait to start, for this reason.
    Blocked(WaitReason),
}

/// Rule 3: at most one control plane in progress; the next starts only when every
/// control-plane node is Ready and the etcd gate passes.
fn start_control_plane(
    input: &RolloutInput<'_>,
    preflight: Option<PreflightMode>,
    cps: &[&(&MachineView, Slot)],
    d: &mut Decision,
) -> Stage {
    if cps.iter().any(|(_, slot)| matches!(slot, Slot::Advancing | Slot::Stopping)) {
        // A control plane started before a snapshot was required (or left by another
        // operation) still needs one before its call.
        let before_call = cps.iter().find(|(m, slot)| {
            *slot == Slot::Advancing && m.progress == MachineProgress::InProgress { past_upgrade_call: false }
        });
        if let Some((m, _)) = before_call.filter(|(m, _)| snapshot_missing(input) && !already_on_target(input, m)) {
            match input.etcd {
                EtcdVerdict::Healthy => d.take_etcd_snapshot = Some(m.name.clone()),
                EtcdVerdict::NotChecked => d.check_etcd = true,
                EtcdVerdict::Unhealthy { .. } => {}
            }
        }
        return Stage::Busy;
    }
    let Some((next, _)) = cps.iter().find(|(_, slot)| *slot == Slot::Candidate) else {
        return Stage::Done;
    };
    let not_ready: Vec<String> = cps.iter().filter(|(m, _)| !m.node_ready).map(|(m, _)| m.name.clone()).collect();
    if !not_ready.is_empty() {
        return Stage::Blocked(WaitReason::ControlPlaneNotReady { nodes: not_ready });
    }
    if let Some(wait) = window_wait(input, next, d).or_else(|| gate_wait(input, Some(next), d)) {
        return Stage::Blocked(wait);
    }
    // The other control planes' components are gathered with the etcd gate.
    match input.components.others_not_ready(&next.name) {
        Err(CallDenied::ControlPlaneComponentsNotReady { components }) | Ok(components) if !components.is_empty() => {
            return Stage::Blocked(WaitReason::ControlPlaneComponentsNotReady { components });
        }
        Err(_) | Ok(_) => {}
    }
    let components_pending = *input.components == ComponentsVerdict::NotChecked;
    match input.etcd {
        EtcdVerdict::Healthy | EtcdVerdict::Unhealthy { .. } if components_pending => {
            d.check_etcd = true;
            if input.preflight.of(&next.name).is_none() {
                d.check_preflight.push(next.name.clone());
            }
            Stage::Blocked(WaitReason::EtcdGateNotChecked)
        }
        EtcdVerdict::Healthy => {
            if d.preflight_admits(input, preflight, &next.name) {
                if snapshot_missing(input) && !already_on_target(input, next) {
                    d.take_etcd_snapshot = Some(next.name.clone());
                    return Stage::Blocked(WaitReason::EtcdSnapshotPending);
                }
                d.start.push(next.name.clone());
                Stage::Busy
            } else {
                Stage::Blocked(d.preflight_wait().unwrap_or(WaitReason::EtcdGateNotChecked))
            }
        }
        EtcdVerdict::Unhealthy { reason } => Stage::Blocked(WaitReason::EtcdUnhealthy { reason: reason.clone() }),
        EtcdVerdict::NotChecked => {
            d.check_etcd = true;
            // Both gates are gathered for the next round.
            if input.preflight.of(&next.name).is_none() {
                d.check_preflight.push(next.name.clone());
            }
            Stage::Blocked(WaitReason::EtcdGateNotChecked)
        }
    }
}

/// The maintenance windows, for `machine`, which the rules would start now: why it waits,
/// if it does, with the decision to look again when the next window that can take its turn
/// opens (and before the calendar's horizon, to look further).
fn window_wait(input: &RolloutInput<'_>, machine: &MachineView, d: &mut Decision) -> Option<WaitReason> {
    let Some(Windows::Calendar { calendar, p90 }) = input.windows else { return None };
    let turn = match machine.role {
        MachineRole::ControlPlane => p90.control_plane,
        MachineRole::Worker => p90.worker,
    };
    let (wait, next_start) = match calendar.admit(input.now, turn) {
        WindowVerdict::Open { .. } => return None,
        WindowVerdict::Outside { next_start } => (WaitReason::OutsideWindow { next_start }, next_start),
        WindowVerdict::WouldOverrun { closes, next_start } => {
            let wait = WaitReason::WouldOverrunWindow {
                machine: machine.name.clone(),
                turn_p90_s: turn.as_secs(),
                closes,
                next_start,
            };
            (wait, next_start)
        }
    };
    d.recheck_at = Timestamp::min_opt(d.recheck_at, Some(next_start.unwrap_or(calendar.horizon())));
    Some(wait)
}

/// How many machines `rule` covers have converged.
fn converged_in_scope(input: &RolloutInput<'_>, rule: &GateRule) -> usize {
    input
        .machines
        .iter()
        .filter(|m| m.progress == MachineProgress::Converged && rule.covers(m.role, m.order_label.as_deref()))
        .count()
}

/// The gates' states after this pass's readings ([`crate::gate::track`]); a resume lets
/// a timed-out gate be waited on afresh. `None`: no gates.
fn tracked_gates(input: &RolloutInput<'_>, resuming: bool) -> Option<BTreeMap<String, GateState>> {
    let Some(Gates::Rules { rules, readings }) = input.gates else { return None };
    let previous = &input.operation.status.gates;
    let mut states = crate::gate::track(rules, readings, previous, |r| converged_in_scope(input, r), input.now);
    if resuming {
        for state in states.values_mut() {
            state.timed_out = false;
            state.waiting_since = None;
        }
    }
    Some(states)
}

/// The pause of a gate that waited past its timeout, if one did.
fn timed_out_gate(input: &RolloutInput<'_>, states: &BTreeMap<String, GateState>) -> Option<PauseReason> {
    let Some(Gates::Rules { rules, .. }) = input.gates else { return None };
    rules.iter().find_map(|rule| {
        let state = states.get(&rule.name).filter(|s| s.timed_out)?;
        Some(PauseReason::GateTimedOut {
            gate: rule.name.clone(),
            last: state.last.clone().unwrap_or_default(),
            timeout_s: rule.timeout.unwrap_or_default().as_secs(),
        })
    })
}

/// The health gates that keep `machine` from starting now, or (`None`) the operation
/// from completing: the first that does not pass, as a wait, with the decision to look
/// again when it settles, when its wait times out, or at the next poll. A wait past its
/// timeout is recorded ([`GateState::timed_out`]): the next pass pauses on it. A gate that
/// passes ends its wait.
fn gate_wait(input: &RolloutInput<'_>, machine: Option<&MachineView>, d: &mut Decision) -> Option<WaitReason> {
    let (Some(Gates::Rules { rules, readings }), Some(states)) = (input.gates, d.gates.as_mut()) else { return None };
    let started = input.operation.status.started_target.is_some();
    let asked = |rule: &GateRule| match (machine, rule.phase) {
        (Some(m), GatePhase::BeforeMachine) => rule.covers(m.role, m.order_label.as_deref()),
        (Some(m), GatePhase::AfterMachine) => {
            rule.covers(m.role, m.order_label.as_deref()) && converged_in_scope(input, rule) > 0
        }
        (Some(_), GatePhase::BeforeOperation) => !started,
        (None, GatePhase::AfterMachine) => converged_in_scope(input, rule) > 0,
        (None, GatePhase::AfterOperation) => true,
        (Some(_), GatePhase::AfterOperation) | (None, GatePhase::BeforeMachine | GatePhase::BeforeOperation) => false,
    };
    for rule in rules.iter().filter(|r| asked(r)) {
        let state = states.entry(rule.name.clone()).or_default();
        let Some(block) = crate::gate::block(rule, state, readings.get(&rule.name), input.now) else {
            state.waiting_since = None;
            continue;
        };
        let timed_out = crate::gate::waited(rule, state, input.now);
        let poll = input.now.saturating_add(input.config.preflight_recheck);
        let deadline = rule.timeout.zip(state.waiting_since).map(|(t, since)| since.saturating_add(t));
        let again = if timed_out { Some(input.now) } else { block.settles_at.or(Some(poll)) };
        d.recheck_at = Timestamp::min_opt(Timestamp::min_opt(d.recheck_at, again), deadline);
        return Some(WaitReason::GateNotPassing {
            gate: block.gate,
            object: block.object,
            value: block.value,
            settles_at: block.settles_at,
        });
    }
    None
}

/// Rules 2 and 4: the lowest unfinished order wave, within `maxUnavailable` counting
/// workers already unavailable for other reasons.
fn start_workers(
    input: &RolloutInput<'_>,
    spec: &Rules,
    workers: &[&(&MachineView, Slot)],
    d: &mut Decision,
) -> Option<WaitReason> {
    // The controller's own machine is a wave of its own, the last.
    let wave_of = |m: &MachineView| {
        let (last, unordered, order, _) = order_key(m);
        (last, unordered, order)
    };
    let wave = workers
        .iter()
        .filter(|(_, slot)| matches!(slot, Slot::Advancing | Slot::Candidate))
        .map(|(m, _)| wave_of(m))
        .min()?;

    let unavailable: BTreeSet<&str> = workers
        .iter()
        .filter(|(m, slot)| matches!(slot, Slot::Advancing | Slot::Stopping) || !m.node_ready)
        .map(|(m, _)| m.name.as_str())
        .collect();
    let mut free = usize::try_from(spec.max_unavailable).unwrap_or(usize::MAX).saturating_sub(unavailable.len());

    let mut not_ready = Vec::new();
    let mut budget_blocked = false;
    let mut window = None;
    let mut asked = 0_usize;
    for (m, slot) in workers.iter().filter(|(m, _)| wave_of(m) == wave) {
        if *slot != Slot::Candidate {
            continue;
        }
        if !m.node_ready {
            not_ready.push(m.name.clone());
        } else if free == 0 {
            // The slots left are held by machines whose preflight is still to be gathered.
            budget_blocked |= asked == 0;
        } else if window.is_some() {
            // Every worker is admitted on the same p90: none after it starts either.
        } else if let Some(wait) = window_wait(input, m, d).or_else(|| gate_wait(input, Some(m), d)) {
            window = Some(wait);
        } else if d.preflight_admits(input, spec.preflight, &m.name) {
            d.start.push(m.name.clone());
            free -= 1;
        } else if d.check_preflight.last() == Some(&m.name) {
            // Not checked yet: it holds its slot until the gate is gathered, so that no
            // more machines are checked than could start.
            free -= 1;
            asked += 1;
        }
    }
    if budget_blocked {
        Some(WaitReason::MaxUnavailable { unavailable: unavailable.into_iter().map(str::to_owned).collect() })
    } else if let Some(wait) = window {
        Some(wait)
    } else if let Some(wait) = d.preflight_wait() {
        Some(wait)
    } else if !not_ready.is_empty() {
        Some(WaitReason::NodesNotReady { nodes: not_ready })
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
