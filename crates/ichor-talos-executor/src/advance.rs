//! `advance_machine`: one pass of the Talos executor over one machine.
//!
//! It reads the world (the node name, the Node, the Talos stage, storage, on a control
//! plane past its call the etcd member list), calls the pure
//! [`ichor_upgrade_core::talos_step::step`], carries out its one action, writes the
//! machine's conditions, and says what came of it. It keeps nothing between passes.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use ichor_storage::{
    ConditionWriteError, EvacuationEnd, EvacuationError, EvacuationFor, EvacuationRequest, StorageApi,
    end_machine_evacuation, evacuate_machine, evacuation_ended, observe_storage,
};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::STORAGE_EVACUATION;
use ichor_upgrade_core::evacuation::{StorageObservation, scheduling_to_restore, with_recorded_evacuation};
use ichor_upgrade_core::lifecycle_step::{
    ExecutorKind, TALOS_LIFECYCLE, executor_for, lifecycle_in_flight, reason as lifecycle_reason,
};
use ichor_upgrade_core::operation::{MachineRole, OperationKind};
use ichor_upgrade_core::rollout::CallAuthority;
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::talos_step::{
    Action, EtcdMembership, MachineFailure, MachineSpec, MachineStage, NodeObservation, StepInput, TalosObservation,
    UpgradeTarget, converged_message, needs_talos, past_upgrade_call, recorded_node_name, step,
};
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, UpgradeMarker, reason as upgrade_reason};
use ichor_upgrade_core::versions::TalosVersion;

use crate::cause::report;
use crate::clock::Clock;
use crate::config::ExecutorConfig;
use crate::kube_api::{KubeApi, KubeError, MachineInfo, NodeInfo};
use crate::snapshot::SnapshotStore;
use crate::talos_api::{TalosApi, TalosError, UpgradeRequest};

/// The Node annotation Talos writes with the node's schematic ID.
pub const SCHEMATIC_ANNOTATION: &str = "extensions.talos.dev/schematic";

/// The action (and Event reason) of an evacuation begun on a node the storage system
/// does not have: nothing to evacuate, said once.
pub const NO_STORAGE_NODE: &str = "NoStorageNode";

/// The seams a driver works through, and its configuration.
#[derive(Clone, Copy)]
pub struct Executor<'a> {
    /// The Talos API.
    pub talos: &'a dyn TalosApi,
    /// The Kubernetes API.
    pub kube: &'a dyn KubeApi,
    /// The storage backend.
    pub storage: &'a dyn StorageApi,
    /// The clock.
    pub clock: &'a dyn Clock,
    /// Bounds and timing.
    pub config: &'a ExecutorConfig,
    /// Where the etcd snapshot taken before the first control plane goes; `None` when none
    /// is configured (an operation that requires one then pauses before any control plane,
    /// saying so).
    pub snapshots: Option<&'a dyn SnapshotStore>,
    /// Where calls that outlive a pass go (the lifecycle install, pre-pulls); `None`: an
    /// install is carried out inside the pass, and nothing is pre-pulled.
    pub background: Option<&'a dyn crate::background::Background>,
}

impl Executor<'_> {
    /// When a machine whose pass failed on a transient error is looked at again: one
    /// [`poll`](ichor_upgrade_core::talos_step::StepTimeouts::poll) from now.
    #[must_use]
    pub fn retry_at(&self) -> Timestamp {
        self.clock.now().saturating_add(self.config.step.poll)
    }
}

/// A call that outlived its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} did not answer within {bound:?}")]
pub struct CallTimedOut {
    /// The call.
    pub call: &'static str,
    /// Its bound.
    pub bound: Duration,
}

/// A Talos API call that failed or outlived its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TalosCallError {
    /// The API failed.
    #[error(transparent)]
    Api(#[from] TalosError),
    /// The bound passed.
    #[error(transparent)]
    TimedOut(#[from] CallTimedOut),
}

impl TalosCallError {
    /// Whether the node could not be reached (including an ordinary call's bound passing).
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Api(e) => e.is_unreachable(),
            Self::TimedOut(_) => true,
        }
    }
}

/// A Kubernetes API call that failed or outlived its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeCallError {
    /// The API failed.
    #[error(transparent)]
    Api(#[from] KubeError),
    /// The bound passed.
    #[error(transparent)]
    TimedOut(#[from] CallTimedOut),
}

impl KubeCallError {
    /// Whether waiting and retrying can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Api(e) => e.is_transient(),
            Self::TimedOut(_) => true,
        }
    }
}

/// Why a pass over a machine could not be carried out. Each error says whether it is
/// transient (the machine waits and the pass is retried) or a failure (the operation
/// pauses); that one method decides, nothing parses the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvanceError {
    /// The operation's kind is not `talos`; it is never run as a Talos upgrade.
    #[error("operation kind {0:?} is not supported: only \"talos\" operations are executed")]
    UnsupportedKind(String),
    /// The node name could not be read from Talos's Nodename resource.
    #[error("reading the node name of machine {machine} from Talos: {source}")]
    ResolveNodename {
        /// The machine.
        machine: String,
        /// The cause.
        #[source]
        source: TalosCallError,
    },
    /// The machine's node name is unknown (Talos cannot be asked for it and none was
    /// recorded), and what is to be done needs it: a wait, never a guess.
    #[error("the node name of machine {machine} is unknown: Talos cannot be asked for it and none was recorded")]
    NodeNameUnknown {
        /// The machine.
        machine: String,
    },
    /// The Node could not be read.
    #[error("reading Node {node}: {source}")]
    ReadNode {
        /// The Node.
        node: String,
        /// The cause.
        #[source]
        source: KubeCallError,
    },
    /// Storage could not be observed, or an evacuation step failed.
    #[error("storage for {node}: {source}")]
    Storage {
        /// The Node.
        node: String,
        /// The cause.
        #[source]
        source: EvacuationError,
    },
    /// A storage call outlived its bound.
    #[error("storage for {node}: {source}")]
    StorageTimedOut {
        /// The Node.
        node: String,
        /// The bound that passed.
        #[source]
        source: CallTimedOut,
    },
    /// The machine's conditions could not be written.
    #[error(transparent)]
    PatchConditions(#[from] ConditionWriteError),
    /// A Kubernetes call of a step failed (cordon, eviction, Node deletion).
    #[error("{call}: {source}")]
    KubeCall {
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        source: KubeCallError,
    },
    /// A Talos call of a step failed (leaving etcd, the reset).
    #[error("{call}: {source}")]
    TalosCall {
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        source: TalosCallError,
    },
}

impl AdvanceError {
    /// Whether waiting and retrying can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::UnsupportedKind(_) => false,
            Self::ResolveNodename { source, .. } => source.is_unreachable(),
            Self::NodeNameUnknown { .. } => true,
            Self::ReadNode { source, .. } => source.is_transient(),
            Self::Storage { source, .. } => source.is_transient(),
            Self::StorageTimedOut { .. } => true,
            Self::PatchConditions(e) => e.transient,
            Self::KubeCall { source, .. } => source.is_transient(),
            Self::TalosCall { source, .. } => source.is_unreachable(),
        }
    }

    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnsupportedKind(_) => "UnsupportedKind",
            Self::ResolveNodename { .. } => "ResolveNodename",
            Self::NodeNameUnknown { .. } => "NodeNameUnknown",
            Self::ReadNode { .. } => "ReadNode",
            Self::Storage { .. } | Self::StorageTimedOut { .. } => "Storage",
            Self::PatchConditions(_) => "PatchConditions",
            Self::KubeCall { .. } => "KubeCall",
            Self::TalosCall { .. } => "TalosCall",
        }
    }

    /// What the rollout engine makes of it: when transient, a wait looked at again at
    /// `retry_at` (no watch reports the end of an outage or a timeout: a wait without a
    /// time of its own would stand until its machine or Node next changed); else a failure.
    #[must_use]
    pub fn outcome(&self, retry_at: Timestamp) -> MachineOutcome {
        let message = report(self);
        if self.is_transient() {
            MachineOutcome::Waiting { reason: self.reason().to_owned(), message, recheck_at: Some(retry_at) }
        } else {
            MachineOutcome::Failed { reason: self.reason().to_owned(), message }
        }
    }
}

/// Runs `call` under `bound`.
pub(crate) async fn bounded<T>(
    call: &'static str,
    bound: Duration,
    future: impl Future<Output = T>,
) -> Result<T, CallTimedOut> {
    tokio::time::timeout(bound, future).await.map_err(|_| CallTimedOut { call, bound })
}

/// Whether the drain evicts this pod: not a DaemonSet's, not a mirror (static) pod.
#[must_use]
pub fn drains(pod: &crate::kube_api::PodInfo) -> bool {
    !pod.mirror && !pod.owner_kinds.iter().any(|k| k == "DaemonSet")
}

pub(crate) async fn kube<T>(
    ex: &Executor<'_>,
    call: &'static str,
    future: impl Future<Output = Result<T, KubeError>>,
) -> Result<T, AdvanceError> {
    bounded(call, ex.config.call_timeout, future)
        .await
        .map_err(KubeCallError::from)
        .and_then(|r| r.map_err(KubeCallError::from))
        .map_err(|source| AdvanceError::KubeCall { call, source })
}

pub(crate) async fn talos<T>(
    ex: &Executor<'_>,
    call: &'static str,
    future: impl Future<Output = Result<T, TalosError>>,
) -> Result<T, AdvanceError> {
    bounded(call, ex.config.call_timeout, future)
        .await
        .map_err(TalosCallError::from)
        .and_then(|r| r.map_err(TalosCallError::from))
        .map_err(|source| AdvanceError::TalosCall { call, source })
}

/// The operation a machine is advanced for: its kind, and its identity (the one it writes
/// into the cluster's Lease, [`OperationInfo::identity`](crate::kube_api::OperationInfo::identity)),
/// which the engine's cordon names so that only this operation lifts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationRef<'a> {
    /// Its kind (only `talos` is advanced here).
    pub kind: &'a str,
    /// Its identity.
    pub identity: &'a str,
}

/// How a machine's progress reads from its own conditions: whether an Upgrade call was
/// made or may have been.
#[must_use]
pub fn machine_past_upgrade_call(machine: &MachineInfo) -> bool {
    past_upgrade_call(&machine.conditions)
}

/// One pass over one machine: observe, step, carry out the one action. `authority` is
/// whether its Upgrade call may go out in this pass, as the rollout engine computed it in
/// this same pass ([`Decision::authority`](ichor_upgrade_core::rollout::Decision::authority)):
/// without [`CallAuthority::Granted`] no Upgrade call is made, first or repeated.
///
/// # Errors
/// [`AdvanceError::UnsupportedKind`] for any kind but `talos`, before anything is read;
/// otherwise an observation or a write that failed (see [`AdvanceError::is_transient`]).
pub async fn advance_machine(
    ex: &Executor<'_>,
    operation: OperationRef<'_>,
    machine: &MachineInfo,
    target: &UpgradeTarget,
    authority: &CallAuthority,
) -> Result<MachineOutcome, AdvanceError> {
    advance_machine_with(ex, operation, machine, target, authority, authority).await
}

/// [`advance_machine`] with the authority to finish a machine already past its call as
/// well ([`Decision::finish_authority`](ichor_upgrade_core::rollout::Decision::finish_authority)):
/// the lifecycle executor's reboot of an installed machine takes it. The executor is the one
/// the machine is under way on, else the one [`ExecutorConfig::executor`] chooses for the
/// version its Node shows.
///
/// # Errors
/// As [`advance_machine`].
pub async fn advance_machine_with(
    ex: &Executor<'_>,
    operation: OperationRef<'_>,
    machine: &MachineInfo,
    target: &UpgradeTarget,
    authority: &CallAuthority,
    finish: &CallAuthority,
) -> Result<MachineOutcome, AdvanceError> {
    if operation.kind != OperationKind::TALOS {
        return Err(AdvanceError::UnsupportedKind(operation.kind.to_owned()));
    }
    let bound = ex.config.call_timeout;
    let node_name = match node_name(ex, machine).await {
        Ok(name) => Some(name),
        // Past the Upgrade call the machine may be rebooting, and Talos cannot be asked for
        // its name: the name recorded before the call is used meanwhile. Without one, the
        // Node is not read this pass; the step then waits, under its verify bound.
        Err(error) if past_upgrade_call(&machine.conditions) => {
            tracing::debug!(machine = %machine.name, error = %report(&error), "node name unreadable past the call");
            recorded_node_name(&machine.conditions)
        }
        Err(error) => return Err(error),
    };
    let node = match &node_name {
        Some(name) => bounded("read Node", bound, ex.kube.node(name))
            .await
            .map_err(KubeCallError::from)
            .and_then(|r| r.map_err(KubeCallError::from))
            .map_err(|source| AdvanceError::ReadNode { node: name.clone(), source })?,
        None => None,
    };
    let running = node.as_ref().and_then(|n| TalosVersion::from_os_image(&n.os_image).ok());
    if executor_for(ex.config.executor, &machine.conditions, running.as_ref()) == ExecutorKind::Lifecycle {
        let observed = crate::lifecycle::Seen {
            node_name: node_name.as_deref(),
            node: node.as_ref(),
            operation: operation.identity,
        };
        return crate::lifecycle::advance(ex, machine, observed, target, authority, finish).await;
    }
    // An acknowledged call whose node has not shown its new boot: the step waits on the
    // Node whatever Talos, etcd or storage say, so they are not asked (a node in its reboot
    // would hold the pass until its dial timeout).
    let asks = needs_talos(&machine.conditions, node.as_ref().map(|n| n.boot_id.as_str()));
    let talos = if asks {
        talos_observation(bounded("machine stage", bound, ex.talos.machine_stage(&machine.address)).await)
    } else {
        TalosObservation::Unreachable { error: "not asked: the Node still shows the boot before the call".to_owned() }
    };
    let labels = node.as_ref().map(|n| n.labels.clone()).unwrap_or_default();
    let storage = match &node_name {
        Some(name) if asks => observe(ex, name, &labels, &machine.conditions, EvacuationFor::Upgrade).await?,
        Some(_) | None => StorageObservation::default(),
    };
    let machine = &*seen_with_storage(ex, machine, &storage, node_name.as_deref());
    let etcd_member = match (machine.role, &node_name) {
        (MachineRole::ControlPlane, Some(_)) if !asks => None,
        (MachineRole::ControlPlane, Some(name)) => {
            Some(crate::etcd::membership(ex, &[machine.address.as_str()], name).await)
        }
        (MachineRole::ControlPlane, None) => Some(EtcdMembership::Unknown { error: "the node name is unknown".into() }),
        (MachineRole::Worker, _) => None,
    };
    let observation = node.as_ref().map(node_observation);
    let spec = MachineSpec { name: machine.name.clone(), role: machine.role };
    let action = step(&StepInput {
        machine: &spec,
        target,
        node: observation.as_ref(),
        talos: &talos,
        conditions: &machine.conditions,
        storage: &storage,
        etcd_member: etcd_member.as_ref(),
        authority,
        timeouts: &ex.config.step,
        now: ex.clock.now(),
    });
    tracing::debug!(machine = %machine.name, ?action, "step");
    carry_out(ex, machine, node_name.as_deref(), node.as_ref(), target, action).await
}

/// What a machine-stage read says, its failure named with its whole cause.
pub(crate) fn talos_observation(read: Result<Result<MachineStage, TalosError>, CallTimedOut>) -> TalosObservation {
    match read {
        Ok(Ok(stage)) => TalosObservation::Answered { stage },
        Ok(Err(e)) if e.is_unreachable() => TalosObservation::Unreachable { error: report(&e) },
        Ok(Err(e)) => TalosObservation::Error { error: report(&e) },
        Err(timed_out) => TalosObservation::Unreachable { error: timed_out.to_string() },
    }
}

pub(crate) async fn node_name(ex: &Executor<'_>, machine: &MachineInfo) -> Result<String, AdvanceError> {
    if let Some(hostname) = machine.hostname.as_deref().filter(|h| !h.is_empty()) {
        return Ok(hostname.to_owned());
    }
    bounded("read Nodename", ex.config.call_timeout, ex.talos.nodename(&machine.address))
        .await
        .map_err(TalosCallError::from)
        .and_then(|r| r.map_err(TalosCallError::from))
        .map_err(|source| AdvanceError::ResolveNodename { machine: machine.name.clone(), source })
}

pub(crate) fn node_observation(node: &NodeInfo) -> NodeObservation {
    NodeObservation {
        name: node.name.clone(),
        ready: node.ready,
        os_image: node.os_image.clone(),
        boot_id: node.boot_id.clone(),
        schematic: node.annotations.get(SCHEMATIC_ANNOTATION).cloned(),
    }
}

pub(crate) async fn observe(
    ex: &Executor<'_>,
    node: &str,
    labels: &ichor_storage::Labels,
    conditions: &Conditions,
    purpose: ichor_storage::EvacuationFor,
) -> Result<StorageObservation, AdvanceError> {
    let observing = observe_storage(ex.storage, node, labels, conditions, purpose);
    bounded("observe storage", ex.config.call_timeout, observing)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node.to_owned(), source })
}

/// The machine as its step sees it: with `StorageEvacuation` open from the storage
/// backend's record of an evacuation of its node when its conditions do not show one yet
/// (decision 0011). Every write of its conditions from here carries the condition.
pub(crate) fn seen_with_storage<'m>(
    ex: &Executor<'_>,
    machine: &'m MachineInfo,
    storage: &StorageObservation,
    node: Option<&str>,
) -> Cow<'m, MachineInfo> {
    let opened = node.and_then(|node| with_recorded_evacuation(&machine.conditions, storage, node, ex.clock.now()));
    match opened {
        Some(conditions) => Cow::Owned(MachineInfo { conditions, ..machine.clone() }),
        None => Cow::Borrowed(machine),
    }
}

/// Sets one condition in `conditions` and writes them all (under the ordinary bound).
pub(crate) async fn write_condition(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut Conditions,
    update: ConditionUpdate,
) -> Result<(), AdvanceError> {
    conditions.upsert(update, ex.clock.now());
    write_conditions(ex, machine, conditions).await
}

async fn write_talos_upgrade(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut Conditions,
    status: ConditionStatus,
    reason: &str,
    message: String,
) -> Result<(), AdvanceError> {
    write_condition(ex, machine, conditions, ConditionUpdate::new(TALOS_UPGRADE, status, reason, message)).await
}

/// Writes the machine's conditions under the ordinary call bound.
pub(crate) async fn write_conditions(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &Conditions,
) -> Result<(), AdvanceError> {
    let bound = ex.config.call_timeout;
    match tokio::time::timeout(bound, ex.kube.write_conditions(&machine.name, conditions)).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(AdvanceError::PatchConditions(ConditionWriteError {
            machine: machine.name.clone(),
            message: CallTimedOut { call: "write conditions", bound }.to_string(),
            transient: true,
        })),
    }
}

/// Writes the machine's conditions under the ordinary call bound, only if the machine is
/// still at `resource_version` (the read that authorised the write).
pub(crate) async fn write_conditions_at(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    resource_version: &str,
    conditions: &Conditions,
) -> Result<(), AdvanceError> {
    let bound = ex.config.call_timeout;
    match tokio::time::timeout(bound, ex.kube.write_conditions_at(&machine.name, resource_version, conditions)).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(AdvanceError::PatchConditions(ConditionWriteError {
            machine: machine.name.clone(),
            message: CallTimedOut { call: "write conditions", bound }.to_string(),
            transient: true,
        })),
    }
}

pub(crate) fn failed(failure: &MachineFailure) -> MachineOutcome {
    MachineOutcome::Failed { reason: failure.reason().to_owned(), message: failure.to_string() }
}

pub(crate) async fn carry_out(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    node_name: Option<&str>,
    node: Option<&NodeInfo>,
    target: &UpgradeTarget,
    action: Action,
) -> Result<MachineOutcome, AdvanceError> {
    // Storage is reached by node name; the step asks for it only with the Node observed,
    // so an unknown name here is a wait, never a guess.
    let name_unknown = || MachineOutcome::Waiting {
        reason: "NodeNameUnknown".to_owned(),
        message: "the node name cannot be read from Talos and none was recorded".to_owned(),
        recheck_at: None,
    };
    match action {
        Action::Converged => Ok(MachineOutcome::Converged),
        Action::RecordConverged => {
            let boot = node.map_or("", |n| n.boot_id.as_str());
            let mut conditions = machine.conditions.clone();
            if conditions.is_true(STORAGE_EVACUATION) {
                // Scheduling back on first; then one write closes both conditions.
                let Some(node_name) = node_name else { return Ok(name_unknown()) };
                let enabling = ex.storage.restore_scheduling(node_name, scheduling_to_restore(&conditions));
                bounded("end evacuation", ex.config.call_timeout, enabling)
                    .await
                    .map_err(|source| AdvanceError::StorageTimedOut { node: node_name.to_owned(), source })?
                    .map_err(|source| AdvanceError::Storage { node: node_name.to_owned(), source: source.into() })?;
                conditions = evacuation_ended(&conditions, node_name, EvacuationEnd::Ended, ex.clock.now());
            }
            let message = converged_message(&target.version, boot);
            if lifecycle_in_flight(&conditions) {
                let closed = ConditionUpdate::new(
                    TALOS_LIFECYCLE,
                    ConditionStatus::False,
                    lifecycle_reason::CONVERGED,
                    message.clone(),
                );
                conditions.upsert(closed, ex.clock.now());
            }
            write_talos_upgrade(
                ex,
                machine,
                &mut conditions,
                ConditionStatus::False,
                upgrade_reason::CONVERGED,
                message,
            )
            .await?;
            Ok(MachineOutcome::Converged)
        }
        Action::Wait { reason, recheck_at } => {
            Ok(MachineOutcome::Waiting { reason: reason.reason().to_owned(), message: reason.to_string(), recheck_at })
        }
        Action::BeginEvacuation => {
            let Some(node_name) = node_name else { return Ok(name_unknown()) };
            let action = match begin_evacuation(ex, machine, node_name).await? {
                EvacuationRequest::Requested { .. } => "BeginEvacuation",
                // Said once, as an Event: the storage selects a node its backend lacks.
                EvacuationRequest::NoSuchNode => NO_STORAGE_NODE,
            };
            Ok(MachineOutcome::Progressed { action })
        }
        Action::EndEvacuation => {
            let Some(node_name) = node_name else { return Ok(name_unknown()) };
            end_evacuation(ex, machine, node_name, EvacuationEnd::Ended).await?;
            Ok(MachineOutcome::Progressed { action: "EndEvacuation" })
        }
        Action::FailEndingEvacuation(failure) => {
            let Some(node_name) = node_name else { return Ok(name_unknown()) };
            end_evacuation(ex, machine, node_name, EvacuationEnd::TimedOut).await?;
            Ok(failed(&failure))
        }
        Action::Fail(failure) => Ok(failed(&failure)),
        Action::CloseVoidIntent => {
            let mut conditions = machine.conditions.clone();
            let marker = conditions.get(TALOS_UPGRADE).map(|c| c.message.clone()).unwrap_or_default();
            let message = format!("void: no sign of the call on the node by its deadline; {marker}");
            let reason = upgrade_reason::INTENT_VOID;
            write_talos_upgrade(ex, machine, &mut conditions, ConditionStatus::False, reason, message).await?;
            Ok(MachineOutcome::Progressed { action: "CloseVoidIntent" })
        }
        Action::Upgrade { image, marker } => call_upgrade(ex, machine, image, &marker).await,
    }
}

/// Begins the machine's evacuation through the shared definition.
///
/// # Errors
/// The storage call or condition write that failed, or its bound passing.
pub async fn begin_evacuation(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    node_name: &str,
) -> Result<EvacuationRequest, AdvanceError> {
    let now = ex.clock.now();
    let beginning = evacuate_machine(ex.storage, ex.kube, &machine.name, node_name, &machine.conditions, now);
    bounded("begin evacuation", ex.config.call_timeout, beginning)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node_name.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node_name.to_owned(), source })
}

/// Ends the machine's evacuation through the shared definition.
///
/// # Errors
/// The storage call or condition write that failed, or its bound passing.
pub async fn end_evacuation(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    node_name: &str,
    end: EvacuationEnd,
) -> Result<(), AdvanceError> {
    let now = ex.clock.now();
    let ending = end_machine_evacuation(ex.storage, ex.kube, &machine.name, node_name, &machine.conditions, end, now);
    bounded("end evacuation", ex.config.call_timeout, ending)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node_name.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node_name.to_owned(), source })
}

/// The intent, the call under what is left of its own bound, then the acknowledgement.
async fn call_upgrade(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    image: String,
    marker: &UpgradeMarker,
) -> Result<MachineOutcome, AdvanceError> {
    // A new intent starts a new clock: its transition time is when this call was decided,
    // not when an earlier, void intent was written.
    let mut conditions = machine.conditions.clone();
    conditions.remove(TALOS_UPGRADE);
    let intent = marker.to_string();
    write_talos_upgrade(ex, machine, &mut conditions, ConditionStatus::Unknown, upgrade_reason::UPGRADE_INTENT, intent)
        .await?;
    // The call must end by the recorded deadline, whatever the intent's write took.
    let left = marker.call_deadline.saturating_since(ex.clock.now()).min(ex.config.step.upgrade_call);
    let request = UpgradeRequest { image, timeout: left };
    tracing::info!(machine = %machine.name, image = %request.image, "calling Upgrade");
    match bounded("Upgrade", left, ex.talos.upgrade(&machine.address, &request)).await {
        Ok(Ok(ack)) => {
            tracing::info!(machine = %machine.name, actor = %ack.actor_id, "Upgrade acknowledged");
            let message = marker.to_string();
            let reason = upgrade_reason::UPGRADE_REQUESTED;
            write_talos_upgrade(ex, machine, &mut conditions, ConditionStatus::True, reason, message).await?;
            Ok(MachineOutcome::Progressed { action: "UpgradeRequested" })
        }
        Ok(Err(e)) if e.is_unreachable() => {
            // The call may or may not have reached the node: the intent stays, and the
            // step reconciles it against the node (boot ID, stage, the call's deadline).
            Ok(MachineOutcome::Waiting {
                reason: "IntentUnconfirmed".to_owned(),
                message: format!("the Upgrade call broke off ({}); its outcome is read from the node", report(&e)),
                recheck_at: Some(marker.call_deadline),
            })
        }
        Ok(Err(e)) => {
            let failure = MachineFailure::UpgradeRefused(report(&e));
            let message = failure.to_string();
            let reason = upgrade_reason::UPGRADE_REFUSED;
            write_talos_upgrade(ex, machine, &mut conditions, ConditionStatus::False, reason, message).await?;
            Ok(failed(&failure))
        }
        // The node abandoned the call at the propagated deadline: nothing was started.
        // The intent stays, so that an acknowledgement at the very edge, and its reboot,
        // would still be recognised; the operation pauses.
        Err(timed_out) => Ok(failed(&MachineFailure::UpgradeCallTimedOut(timed_out.bound))),
    }
}

/// Closes what a failed attempt left on a machine so that a resume retries it afresh:
/// `TalosUpgrade=False/Retry` whenever an upgrade is recorded in flight. The person's resume
/// is the decision; the retry then starts from the node as it is (a node still installing
/// or rebooting is waited for by the pre-call checks, never called again).
///
/// # Errors
/// The condition write that failed.
pub async fn reset_for_retry(ex: &Executor<'_>, machine: &MachineInfo) -> Result<(), AdvanceError> {
    let install_failed = machine
        .conditions
        .get(TALOS_LIFECYCLE)
        .is_some_and(|c| c.status == ConditionStatus::False && c.reason == lifecycle_reason::INSTALL_FAILED);
    if !past_upgrade_call(&machine.conditions) && !install_failed {
        return Ok(());
    }
    let mut conditions = machine.conditions.clone();
    let message = "a person resumed the operation; the failed attempt is closed".to_owned();
    if lifecycle_in_flight(&conditions) || install_failed {
        let update =
            ConditionUpdate::new(TALOS_LIFECYCLE, ConditionStatus::False, lifecycle_reason::RETRY, message.clone());
        conditions.upsert(update, ex.clock.now());
    }
    if conditions.get(TALOS_UPGRADE).is_some_and(|c| c.status != ConditionStatus::False) {
        let update = ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::False, upgrade_reason::RETRY, message);
        conditions.upsert(update, ex.clock.now());
    }
    write_conditions(ex, machine, &conditions).await
}

/// The time a machine's outcome asks the operation to be looked at again, if any. A
/// machine that progressed, converged or failed changes what the rollout engine decides
/// (the next machine may start, or the operation pauses): at once.
#[must_use]
pub fn outcome_recheck(outcome: &MachineOutcome, now: Timestamp) -> Option<Timestamp> {
    match outcome {
        MachineOutcome::Progressed { .. } | MachineOutcome::Converged | MachineOutcome::Failed { .. } => Some(now),
        MachineOutcome::Waiting { recheck_at, .. } => *recheck_at,
    }
}
