//! The one seam every side effect of the drivers goes through (decision 0012, rule 12).
//!
//! Each function here changes the cluster, and takes what authorises it as an argument
//! whose type only an authority can produce, and the precondition it is made on:
//!
//! | side effect | authority | precondition |
//! |---|---|---|
//! | `MachineService.Upgrade`, the lifecycle install | [`Calling`] (the call granted in this pass, or a job's fresh read) | [`Recorded`] intent |
//! | a Kubernetes upgrade's `ApplyConfiguration` | [`Calling`] | [`Recorded`] `ApplyRequested` intent |
//! | its dry run (stores nothing) | [`Advancing`] | none |
//! | the lifecycle reboot | [`Finishing`] (the finish granted in this pass) | [`Recorded`] reboot request |
//! | etcd leave, member removal, the reset | [`Advancing`] (the pass advances the machine) | [`Recorded`] departure or reset intent |
//! | cordon, Node deletion | [`Advancing`] | the Node as read ([`NodeInfo`]: its resourceVersion) |
//! | eviction, the beginning of a storage evacuation | [`Advancing`] | the machine as read |
//! | an intent's record | the authority of the call it precedes | the machine as read (its resourceVersion) |
//!
//! What only gives back (an uncordon, the end of an evacuation, a record of what a node
//! showed, a retry's closing record) takes no authority: a stop, a pause or a deletion
//! must always be able to restore. An uncordon still takes the Node as read. Image pulls
//! change nothing a workload sees, and take neither.
//!
//! The authorities are built from what the rollout engine decided in this pass
//! ([`Advancing::of`] from the [`Decision`], [`Calling::of`] and [`Finishing::of`] from a
//! granted [`CallAuthority`]) or, for work outside a pass, from a fresh read that still
//! authorises it (`job_calling`); nothing else makes one.
//!
//! That nothing reaches a write around this module is a rule of the compiler: a Talos,
//! Kubernetes, condition or storage write is a value ([`crate::writes`]) carried out by
//! the one method that asks for a [`Seal`], and only this module makes one. The
//! evacuation's definition in `ichor-storage` writes through
//! [`EvacuationWrites`], which this module implements over those sealed writes.

use std::future::Future;

use async_trait::async_trait;
use ichor_storage::{
    ConditionWriteError, EvacuationEnd, EvacuationRequest, EvacuationWrites, StorageError, end_machine_evacuation,
    evacuate_machine,
};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::STORAGE_EVACUATION;
use ichor_upgrade_core::evacuation::Scheduling;
use ichor_upgrade_core::machine::vocabulary::PodRef;
use ichor_upgrade_core::operation::{HOLD_ANNOTATION, PAUSE_ANNOTATION};
use ichor_upgrade_core::rollout::{CallAuthority, Decision, LockAction};
use ichor_upgrade_core::status::Phase;
use ichor_upgrade_core::status::RecordState;

use crate::background::StopFlag;
use crate::calls::{AdvanceError, CallTimedOut, Executor, TalosCallError, bounded, kube, talos};
use crate::kube_api::{Eviction, KubeError, MachineInfo, NodeInfo};
use crate::talos_api::{
    ApplyConfigReply, ApplyConfigRequest, InstallOutcome, InstallRequest, PullRequest, ResetRequest, TalosError,
    UpgradeAck, UpgradeRequest,
};
use crate::writes::{ConditionWrite, KubeWrite, StorageWrite, TalosWrite};

pub(crate) mod seal;
use seal::Seal;

/// `write` on `node` through the Talos API, under `bound`: one error for the call.
async fn talos_write(
    ex: &Executor<'_>,
    call: &'static str,
    node: &str,
    write: TalosWrite<'_>,
    bound: std::time::Duration,
) -> Result<crate::writes::TalosWritten, TalosCallError> {
    Ok(bounded(call, bound, ex.talos.write(node, write, Seal::new())).await??)
}

/// The authority to advance one machine in this pass: the pass's decision starts or
/// advances it, under a cluster lock the operation holds. It authorises the steps on the
/// way to a call (the evacuation, the cordon, the drain) and a removal's steps (whose
/// etcd steps the removal's step gates on the etcd gate besides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advancing {
    machine: String,
}

impl Advancing {
    /// The authority to advance `machine`, if `decision` gives it: the machine is in its
    /// [`start`](Decision::start) or [`advance`](Decision::advance), and the operation
    /// keeps the lock ([`LockAction::Keep`] or [`LockAction::Renew`]).
    #[must_use]
    pub fn of(machine: &str, decision: &Decision) -> Option<Self> {
        let listed = decision.start.iter().chain(&decision.advance).any(|m| m == machine);
        let holds = matches!(decision.lock, LockAction::Keep | LockAction::Renew);
        (listed && holds).then(|| Self { machine: machine.to_owned() })
    }
}

/// The authority to make a machine's first disruptive call (the Upgrade call, the
/// lifecycle install).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calling {
    machine: String,
}

impl Calling {
    /// The authority of the call, if the rollout engine granted it in this pass to a
    /// machine the pass advances.
    #[must_use]
    pub fn of(advancing: &Advancing, authority: &CallAuthority) -> Option<Self> {
        (*authority == CallAuthority::Granted).then(|| Self { machine: advancing.machine.clone() })
    }
}

/// The authority to finish a machine past its call (the lifecycle reboot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finishing {
    machine: String,
}

impl Finishing {
    /// The authority to finish, if the rollout engine granted it in this pass
    /// ([`Decision::finish_authority`]) to a machine the pass advances.
    #[must_use]
    pub fn of(advancing: &Advancing, finish: &CallAuthority) -> Option<Self> {
        (*finish == CallAuthority::Granted).then(|| Self { machine: advancing.machine.clone() })
    }
}

/// An authority over one machine: what `record` takes (the record is made under the
/// authority of the call it precedes). Sealed: only this module's authorities are one.
pub trait Authority: sealed::Sealed {
    /// The machine it is over.
    fn machine(&self) -> &str;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Advancing {}
    impl Sealed for super::Calling {}
    impl Sealed for super::Finishing {}
}

impl Authority for Advancing {
    fn machine(&self) -> &str {
        &self.machine
    }
}

impl Authority for Calling {
    fn machine(&self) -> &str {
        &self.machine
    }
}

impl Authority for Finishing {
    fn machine(&self) -> &str {
        &self.machine
    }
}

/// Proof that a call's intent is recorded on its machine, written on the machine as read
/// (under its resourceVersion). Made only by `record`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded<'a> {
    machine: &'a str,
    condition: &'static str,
    reason: &'static str,
}

/// A side effect asked for on a machine its authority or record is not for: refused.
fn mismatch(call: &'static str, machine: &str, why: String) -> AdvanceError {
    AdvanceError::NotAuthorised { call, machine: machine.to_owned(), why }
}

/// Whether a side effect on `machine` may be made with an authority over `authorised` and
/// `recorded` as its intent, which must be `reason`.
fn check(
    call: &'static str,
    machine: &str,
    authorised: &str,
    recorded: &Recorded<'_>,
    reason: &str,
) -> Result<(), AdvanceError> {
    if authorised != machine {
        return Err(mismatch(call, machine, format!("its authority is for machine {authorised}")));
    }
    if recorded.machine != machine || recorded.reason != reason {
        let why = format!(
            "it needs {reason} recorded on it first; the record given is {}={} on machine {}",
            recorded.condition, recorded.reason, recorded.machine
        );
        return Err(mismatch(call, machine, why));
    }
    Ok(())
}

fn timed_out_write(machine: &str, bound: std::time::Duration) -> AdvanceError {
    AdvanceError::PatchConditions(ConditionWriteError {
        machine: machine.to_owned(),
        message: CallTimedOut { call: "write conditions", bound }.to_string(),
        transient: true,
    })
}

/// What a call's intent says: its condition, status, reason and message.
#[derive(Debug, Clone)]
pub(crate) struct Intent {
    pub(crate) condition: &'static str,
    pub(crate) status: ConditionStatus,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// Records `intent` on `machine` (with the rest of `conditions`) before the call it is the
/// intent of, on the machine as read: under its resourceVersion when the read carries one
/// (a writer whose read is stale fails here, before its call). `authority` is the
/// authority of that call.
///
/// # Errors
/// The write failed or outlived its bound (a conflict is transient); or the authority is
/// for another machine.
pub(crate) async fn record<'a>(
    ex: &Executor<'_>,
    authority: &impl Authority,
    machine: &'a MachineInfo,
    conditions: &mut Conditions,
    intent: Intent,
) -> Result<Recorded<'a>, AdvanceError> {
    let authorised = authority.machine();
    if authorised != machine.name {
        return Err(mismatch("record", &machine.name, format!("its authority is for machine {authorised}")));
    }
    let Intent { condition, status, reason, message } = intent;
    conditions.upsert(ConditionUpdate::new(condition, status, reason, message), ex.clock.now());
    let bound = ex.config.call_timeout;
    // A client that keeps no versions (a test double) reads none: the write is then
    // unconditional.
    let write = ConditionWrite { machine: &machine.name, conditions, at: machine.resource_version.as_deref() };
    match tokio::time::timeout(bound, ex.kube.write_conditions(write, Seal::new())).await {
        Ok(result) => result?,
        Err(_) => return Err(timed_out_write(&machine.name, bound)),
    }
    Ok(Recorded { machine: &machine.name, condition, reason })
}

/// Writes the machine's conditions as they are: a record of what a node showed or of an
/// outcome (the install running, installed, converged, a closed or void intent), never an
/// authorisation of a call. Under the ordinary bound; the client's own precondition is the
/// last version of the machine it saw.
///
/// # Errors
/// The write failed or outlived its bound.
pub(crate) async fn note(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &Conditions,
) -> Result<(), AdvanceError> {
    let bound = ex.config.call_timeout;
    let write = ConditionWrite { machine: &machine.name, conditions, at: None };
    match tokio::time::timeout(bound, ex.kube.write_conditions(write, Seal::new())).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(timed_out_write(&machine.name, bound)),
    }
}

/// Sets one condition in `conditions` and writes them all ([`note`]).
///
/// # Errors
/// As [`note`].
pub(crate) async fn note_condition(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut Conditions,
    update: ConditionUpdate,
) -> Result<(), AdvanceError> {
    conditions.upsert(update, ex.clock.now());
    note(ex, machine, conditions).await
}

/// `MachineService.Upgrade` on the machine at `address`, under `bound`.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] when the authority or the record is not for this
/// machine's intent; nothing is called then. The call's own failure is the inner result.
pub(crate) async fn upgrade(
    ex: &Executor<'_>,
    calling: &Calling,
    recorded: &Recorded<'_>,
    machine: &MachineInfo,
    request: &UpgradeRequest,
    bound: std::time::Duration,
) -> Result<Result<UpgradeAck, TalosCallError>, AdvanceError> {
    use ichor_upgrade_core::upgrade_marker::reason;
    check("Upgrade", &machine.name, &calling.machine, recorded, reason::UPGRADE_INTENT)?;
    let written = talos_write(ex, "Upgrade", &machine.address, TalosWrite::Upgrade(request), bound).await;
    Ok(written.and_then(|w| Ok(w.upgrade()?)))
}

/// A Kubernetes upgrade's `MachineService.ApplyConfiguration` on the machine (never a dry
/// run: that is [`dry_run_configuration`]), under the ordinary bound.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] when the authority or the record is not for this
/// machine's apply intent, or the request is a dry run; nothing is called then. The
/// call's own failure is the inner result.
pub(crate) async fn apply_configuration(
    ex: &Executor<'_>,
    calling: &Calling,
    recorded: &Recorded<'_>,
    machine: &MachineInfo,
    request: &ApplyConfigRequest,
) -> Result<Result<ApplyConfigReply, TalosCallError>, AdvanceError> {
    use ichor_upgrade_core::machine::kubernetes::reason;
    check("ApplyConfiguration", &machine.name, &calling.machine, recorded, reason::APPLY_REQUESTED)?;
    if request.dry_run {
        return Err(mismatch("ApplyConfiguration", &machine.name, "a dry run is no apply".to_owned()));
    }
    Ok(apply(ex, machine, request).await)
}

/// An ApplyConfiguration (or its dry run) on the machine, under the ordinary bound.
async fn apply(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    request: &ApplyConfigRequest,
) -> Result<ApplyConfigReply, TalosCallError> {
    let write = TalosWrite::ApplyConfiguration(request);
    let written = talos_write(ex, "ApplyConfiguration", &machine.address, write, ex.config.call_timeout).await?;
    Ok(written.apply_configuration()?)
}

/// The dry run of an ApplyConfiguration: the node validates the configuration and says how
/// it would apply it, storing nothing. Under the pass's advancing of the machine.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] for another machine, or a request that is no dry run.
pub(crate) async fn dry_run_configuration(
    ex: &Executor<'_>,
    advancing: &Advancing,
    machine: &MachineInfo,
    request: &ApplyConfigRequest,
) -> Result<Result<ApplyConfigReply, TalosCallError>, AdvanceError> {
    if advancing.machine != machine.name {
        return Err(mismatch(
            "ApplyConfiguration",
            &machine.name,
            format!("its authority is for {}", advancing.machine),
        ));
    }
    if !request.dry_run {
        return Err(mismatch("ApplyConfiguration", &machine.name, "only a dry run goes out here".to_owned()));
    }
    Ok(apply(ex, machine, request).await)
}

/// The lifecycle install (`LifecycleService.Upgrade`) on the machine, reporting through
/// `started` when the node takes it. Not bounded here: the caller follows its stream.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] when the authority or the record is not for this
/// machine's install intent; nothing is called then.
pub(crate) fn install<'f>(
    ex: &'f Executor<'_>,
    calling: &Calling,
    recorded: &Recorded<'_>,
    machine: &'f MachineInfo,
    request: &'f InstallRequest,
    started: &'f std::sync::atomic::AtomicBool,
) -> Result<impl Future<Output = Result<InstallOutcome, TalosError>> + 'f, AdvanceError> {
    use ichor_upgrade_core::machine::lifecycle::reason;
    check("LifecycleService.Upgrade", &machine.name, &calling.machine, recorded, reason::INSTALL_INTENT)?;
    let write = TalosWrite::Install { request, started };
    Ok(async move { ex.talos.write(&machine.address, write, Seal::new()).await?.install() })
}

/// `MachineService.Reboot` of the machine, under the ordinary bound.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] when the authority or the record is not for this
/// machine's reboot request; nothing is called then.
pub(crate) async fn reboot(
    ex: &Executor<'_>,
    finishing: &Finishing,
    recorded: &Recorded<'_>,
    machine: &MachineInfo,
) -> Result<Result<String, TalosCallError>, AdvanceError> {
    use ichor_upgrade_core::machine::lifecycle::reason;
    check("Reboot", &machine.name, &finishing.machine, recorded, reason::REBOOT_REQUESTED)?;
    let written = talos_write(ex, "Reboot", &machine.address, TalosWrite::Reboot, ex.config.call_timeout).await;
    Ok(written.and_then(|w| Ok(w.reboot()?)))
}

/// `EtcdLeaveCluster` on the machine.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] without its departure recorded; the call's failure.
pub(crate) async fn etcd_leave(
    ex: &Executor<'_>,
    advancing: &Advancing,
    recorded: &Recorded<'_>,
    machine: &MachineInfo,
) -> Result<(), AdvanceError> {
    use ichor_upgrade_core::machine::removal::reason;
    check("leave etcd", &machine.name, &advancing.machine, recorded, reason::ETCD_LEAVE_REQUESTED)?;
    sealed_talos(ex, "leave etcd", &machine.address, TalosWrite::EtcdLeaveCluster).await
}

/// `EtcdRemoveMemberByID` of the machine's member, asked of `peer`.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] without its departure recorded; the call's failure.
pub(crate) async fn etcd_remove_member(
    ex: &Executor<'_>,
    advancing: &Advancing,
    recorded: &Recorded<'_>,
    machine: &MachineInfo,
    peer: &str,
    member_id: u64,
) -> Result<(), AdvanceError> {
    use ichor_upgrade_core::machine::removal::reason;
    check("remove etcd member", &machine.name, &advancing.machine, recorded, reason::ETCD_MEMBER_REMOVE_REQUESTED)?;
    sealed_talos(ex, "remove etcd member", peer, TalosWrite::EtcdRemoveMember { member_id }).await
}

/// The graceful reset of the machine.
///
/// # Errors
/// [`AdvanceError::NotAuthorised`] without its intent recorded; the call's failure.
pub(crate) async fn reset(
    ex: &Executor<'_>,
    advancing: &Advancing,
    recorded: &Recorded<'_>,
    machine: &MachineInfo,
    request: &ResetRequest,
) -> Result<(), AdvanceError> {
    use ichor_upgrade_core::machine::removal::reason;
    check("reset", &machine.name, &advancing.machine, recorded, reason::RESET_REQUESTED)?;
    sealed_talos(ex, "reset", &machine.address, TalosWrite::Reset(request)).await
}

/// A Talos write with no reply of its own, under the ordinary bound.
async fn sealed_talos(
    ex: &Executor<'_>,
    call: &'static str,
    node: &str,
    write: TalosWrite<'_>,
) -> Result<(), AdvanceError> {
    talos(ex, call, async { ex.talos.write(node, write, Seal::new()).await?.done(&write) }).await
}

/// A Kubernetes write, under the ordinary bound.
async fn sealed_kube(ex: &Executor<'_>, write: KubeWrite<'_>) -> Result<crate::writes::KubeWritten, AdvanceError> {
    kube(ex, write.name(), ex.kube.write(write, Seal::new())).await
}

/// Cordons the Node as read (its resourceVersion the precondition), naming the operation.
///
/// # Errors
/// The call's failure (a Node changed since the read is a conflict).
pub(crate) async fn cordon(
    ex: &Executor<'_>,
    advancing: &Advancing,
    node: &NodeInfo,
    annotation: &str,
) -> Result<(), AdvanceError> {
    tracing::debug!(machine = %advancing.machine, node = %node.name, "cordon");
    let write = KubeWrite::Cordon { node, annotation };
    sealed_kube(ex, write).await?.done(&write).map_err(|source| kube_answer(write, source))
}

/// A write answered as another (a defect of the implementation), as the pass reports it.
fn kube_answer(write: KubeWrite<'_>, source: KubeError) -> AdvanceError {
    AdvanceError::KubeCall { call: write.name(), source: source.into() }
}

/// Lifts the cordon of the Node as read: gives back, so no authority.
///
/// # Errors
/// The call's failure (a Node changed since the read is a conflict).
pub(crate) async fn uncordon(ex: &Executor<'_>, node: &NodeInfo) -> Result<(), AdvanceError> {
    let write = KubeWrite::Uncordon { node };
    sealed_kube(ex, write).await?.done(&write).map_err(|source| kube_answer(write, source))
}

/// Evicts `pod` through the Eviction API (a PodDisruptionBudget may refuse), under its
/// UID as read: a pod made since under its name is not the one read, and stays.
///
/// # Errors
/// The call's failure.
pub(crate) async fn evict(ex: &Executor<'_>, advancing: &Advancing, pod: &PodRef) -> Result<Eviction, AdvanceError> {
    tracing::debug!(machine = %advancing.machine, %pod, "evict");
    let write = KubeWrite::Evict { namespace: &pod.namespace, name: &pod.name, uid: pod.uid.as_deref() };
    sealed_kube(ex, write).await?.eviction().map_err(|source| kube_answer(write, source))
}

/// Deletes the Node as read (its resourceVersion the precondition).
///
/// # Errors
/// The call's failure (a Node changed since the read is a conflict).
pub(crate) async fn delete_node(ex: &Executor<'_>, advancing: &Advancing, node: &NodeInfo) -> Result<(), AdvanceError> {
    tracing::debug!(machine = %advancing.machine, node = %node.name, "delete Node");
    let write = KubeWrite::DeleteNode { node };
    sealed_kube(ex, write).await?.done(&write).map_err(|source| kube_answer(write, source))
}

/// Begins the machine's evacuation through the shared definition
/// ([`ichor_storage::evacuate_machine`]), on the machine as read.
///
/// # Errors
/// The storage call or condition write that failed, or its bound passing;
/// [`AdvanceError::NotAuthorised`] for an authority over another machine.
pub(crate) async fn begin_evacuation(
    ex: &Executor<'_>,
    advancing: &Advancing,
    machine: &MachineInfo,
    node_name: &str,
) -> Result<EvacuationRequest, AdvanceError> {
    if advancing.machine != machine.name {
        let why = format!("its authority is for machine {}", advancing.machine);
        return Err(mismatch("begin evacuation", &machine.name, why));
    }
    let now = ex.clock.now();
    let writes = Sealed(ex);
    let beginning = evacuate_machine(&writes, &machine.name, node_name, &machine.conditions, now);
    bounded("begin evacuation", ex.config.call_timeout, beginning)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node_name.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node_name.to_owned(), source })
}

/// Ends the machine's evacuation through the shared definition
/// ([`ichor_storage::end_machine_evacuation`]): gives back, so no authority.
///
/// # Errors
/// The storage call or condition write that failed, or its bound passing.
pub(crate) async fn end_evacuation(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    node_name: &str,
    end: EvacuationEnd,
) -> Result<(), AdvanceError> {
    let now = ex.clock.now();
    let writes = Sealed(ex);
    let ending = end_machine_evacuation(&writes, &machine.name, node_name, &machine.conditions, end, now);
    bounded("end evacuation", ex.config.call_timeout, ending)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node_name.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node_name.to_owned(), source })
}

/// Gives the node's storage scheduling back as `conditions` recorded it before the
/// evacuation (the first half of closing it with the converged record).
///
/// # Errors
/// The storage call that failed, or its bound passing.
pub(crate) async fn restore_scheduling(
    ex: &Executor<'_>,
    node_name: &str,
    conditions: &Conditions,
) -> Result<(), AdvanceError> {
    let before = ichor_upgrade_core::evacuation::scheduling_to_restore(conditions);
    let writes = Sealed(ex);
    let restoring = writes.restore_scheduling(node_name, before);
    bounded("end evacuation", ex.config.call_timeout, restoring)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node_name.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node_name.to_owned(), source: source.into() })
}

/// The evacuation's writes as its definition in `ichor-storage` makes them, each sealed
/// here: what [`begin_evacuation`], [`end_evacuation`] and [`restore_scheduling`] hand it.
/// Under the authority of the function that made it (none for what gives back).
struct Sealed<'e, 'a>(&'e Executor<'a>);

#[async_trait]
impl EvacuationWrites for Sealed<'_, '_> {
    async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError> {
        let write = StorageWrite::RequestEvacuation { node, since };
        self.0.storage.write(write, Seal::new()).await?.requested()
    }

    async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError> {
        let write = StorageWrite::RestoreScheduling { node, before };
        self.0.storage.write(write, Seal::new()).await?.restored()
    }

    async fn write_conditions(&self, machine: &str, conditions: &Conditions) -> Result<(), ConditionWriteError> {
        self.0.kube.write_conditions(ConditionWrite { machine, conditions, at: None }, Seal::new()).await
    }
}

/// Pulls `request.image` onto the node at `address`: changes nothing a workload sees.
pub(crate) async fn pull(ex: &Executor<'_>, address: &str, request: &PullRequest) -> Result<String, TalosCallError> {
    let written =
        talos_write(ex, "ImageService.Pull", address, TalosWrite::ImagePull(request), request.timeout).await?;
    Ok(written.image_pull()?)
}

/// What an install run outside its pass checks again before each side effect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobCheck<'a> {
    /// The operation whose pass submitted it.
    pub(crate) operation: &'a str,
    /// The machine's node name, as that pass knew it.
    pub(crate) node: Option<&'a str>,
    /// Set by a pass that stops the machine.
    pub(crate) stop: &'a StopFlag,
}

/// Which side effect a job is about to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobStep {
    /// The intent's write: from here the machine is past its call. Everything that denies
    /// a start denies it.
    Intent,
    /// The install, after the intent: the machine is past its call, which a hold, a pause,
    /// a deletion or a stop does not interrupt; the lock and the operation must still be
    /// there, and the machine not failed.
    Install,
}

/// A read made again for a job's check: its answer, or why nothing can be done on it.
async fn reread<T>(
    ex: &Executor<'_>,
    what: &'static str,
    call: impl Future<Output = Result<T, KubeError>>,
) -> Result<T, String> {
    match bounded(what, ex.config.call_timeout, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(format!("{what}: {e}; nothing is done on an old read")),
        Err(e) => Err(format!("{what}: {e}; nothing is done on an old read")),
    }
}

/// Whether a fresh read still lets a pass make a side effect on `machine` for the
/// operation `identity` (`namespace/name/uid`), read again just before it: the operation
/// is there (the same one), it holds the lock, and the machine's record is not failed
/// (unless a resume arrived); before its call (`past_call` false) besides, the operation is
/// not being deleted or paused, and neither the machine nor its Node `node` is held (past
/// its call a machine is finished whatever holds, pauses or deletes the rest). A step that
/// makes two calls in a row (a dry run then the apply; a cordon then the drain) reads
/// again between them, so a stop recorded after the pass read the operation is seen before
/// the next side effect (issue 53 item 8).
///
/// # Errors
/// Why not, for people; or a read that failed (nothing is done on an old read).
pub(crate) async fn still_authorised(
    ex: &Executor<'_>,
    identity: &str,
    machine: &str,
    node: Option<&str>,
    past_call: bool,
) -> Result<(), String> {
    let name = identity.split('/').nth(1).unwrap_or(identity);
    let Some(op) = reread(ex, "read operation", ex.kube.operation(name)).await? else {
        return Err(format!("operation {name} is gone"));
    };
    if op.identity != identity {
        return Err(format!("operation {name} was replaced"));
    }
    let lease = reread(ex, "read Lease", ex.kube.lease(&op.cluster)).await?;
    if lease.as_ref().and_then(|l| l.holder.as_deref()) != Some(op.identity.as_str()) {
        return Err(format!("operation {name} no longer holds the cluster lock"));
    }
    let resuming = op
        .annotations
        .get(ichor_upgrade_core::operation::RESUME_ANNOTATION)
        .is_some_and(|token| op.status.observed_resume.as_ref() != Some(token));
    if !resuming && op.status.machines.get(machine).is_some_and(|r| r.state == RecordState::Failed) {
        return Err(format!("machine {machine} failed; only a resume touches it again"));
    }
    if past_call {
        return Ok(());
    }
    if op.deleting {
        return Err(format!("operation {name} is being deleted"));
    }
    if !resuming && matches!(op.status.phase, Phase::Paused(_)) {
        return Err(format!("operation {name} is paused"));
    }
    // A person's pause holds from the moment it is written, before a pass records it.
    if let Some(by) = op.annotations.get(PAUSE_ANNOTATION) {
        return Err(format!("operation {name} is paused ({PAUSE_ANNOTATION}: {by})"));
    }
    let held = |annotations: &crate::kube_api::Metadata| annotations.contains_key(HOLD_ANNOTATION);
    if reread(ex, "read machine", ex.kube.machine(machine)).await?.is_some_and(|m| held(&m.annotations)) {
        return Err(format!("machine {machine} is held"));
    }
    if let Some(node) = node
        && reread(ex, "read Node", ex.kube.node(node)).await?.is_some_and(|n| held(&n.annotations))
    {
        return Err(format!("Node {node} is held"));
    }
    Ok(())
}

/// A job's authority for `step`, from a fresh read: the authority and the machine as that
/// read shows it, if it still authorises the step; else why not. The only authority not
/// made from a pass's decision.
pub(crate) async fn job_calling(
    ex: &Executor<'_>,
    check: &JobCheck<'_>,
    submitted: &MachineInfo,
    step: JobStep,
) -> Result<(Calling, MachineInfo), String> {
    let machine = job_read(ex, check, submitted, step).await?;
    Ok((Calling { machine: machine.name.clone() }, machine))
}

async fn job_read(
    ex: &Executor<'_>,
    check: &JobCheck<'_>,
    submitted: &MachineInfo,
    step: JobStep,
) -> Result<MachineInfo, String> {
    // Past its call, a stop leaves the machine to be finished (the pass learns so from
    // the flag); before, it ends the job.
    if step == JobStep::Intent && check.stop.stopped() {
        return Err("a pass stopped the machine (a hold, a pause or a deletion)".to_owned());
    }
    let Some(op) = reread(ex, "read operation", ex.kube.operation(check.operation)).await? else {
        return Err(format!("operation {} is gone", check.operation));
    };
    let lease = reread(ex, "read Lease", ex.kube.lease(&op.cluster)).await?;
    if lease.as_ref().and_then(|l| l.holder.as_deref()) != Some(op.identity.as_str()) {
        return Err(format!("operation {} no longer holds the cluster lock", check.operation));
    }
    let name = &submitted.name;
    let Some(machine) = reread(ex, "read machine", ex.kube.machine(name)).await? else {
        return Err(format!("TalosMachine {name} is gone"));
    };
    let record = op.status.machines.get(name).map(|r| r.state);
    if record == Some(RecordState::Failed) {
        return Err(format!("machine {name} failed; only a resume touches it again"));
    }
    // Past its call a machine is finished whatever holds, pauses or deletes the rest.
    if step == JobStep::Install {
        return Ok(machine);
    }
    if op.deleting {
        return Err(format!("operation {} is being deleted", check.operation));
    }
    if matches!(op.status.phase, Phase::Paused(_)) {
        return Err(format!("operation {} is paused", check.operation));
    }
    if let Some(by) = op.annotations.get(PAUSE_ANNOTATION) {
        return Err(format!("operation {} is paused ({PAUSE_ANNOTATION}: {by})", check.operation));
    }
    if record != Some(RecordState::InProgress) {
        return Err(format!("the operation no longer records machine {name} as started"));
    }
    let held = |annotations: &crate::kube_api::Metadata| annotations.contains_key(HOLD_ANNOTATION);
    if held(&machine.annotations) {
        return Err(format!("machine {name} is held"));
    }
    if let Some(node) = check.node
        && reread(ex, "read Node", ex.kube.node(node)).await?.is_some_and(|n| held(&n.annotations))
    {
        return Err(format!("Node {node} is held"));
    }
    // The evacuation the pass saw is carried into the intent's write (decision 0011: it
    // may be only in the storage backend's record, which the pass read). A stop that ended
    // it dropped the machine's record above, and set the stop flag first.
    let mut machine = machine;
    if let Some(evacuation) = submitted.conditions.get(STORAGE_EVACUATION)
        && !machine.conditions.is_true(STORAGE_EVACUATION)
        && evacuation.status == ConditionStatus::True
    {
        machine.conditions.upsert(
            ConditionUpdate::new(STORAGE_EVACUATION, evacuation.status, &evacuation.reason, evacuation.message.clone()),
            evacuation.last_transition_time,
        );
    }
    Ok(machine)
}

/// What authorises this pass's side effects on one machine: that the pass advances it,
/// and whether its call and its finish are granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    /// The pass advances the machine.
    pub advancing: Advancing,
    /// Its first disruptive call is granted in this pass.
    pub calling: Option<Calling>,
    /// Its finish (the lifecycle reboot) is granted in this pass.
    pub finishing: Option<Finishing>,
}

impl Grants {
    /// The grants of a machine the pass advances, from the authorities the rollout engine
    /// computed for it in this pass.
    #[must_use]
    pub fn of(advancing: Advancing, authority: &CallAuthority, finish: &CallAuthority) -> Self {
        let calling = Calling::of(&advancing, authority);
        let finishing = Finishing::of(&advancing, finish);
        Self { advancing, calling, finishing }
    }

    /// The call's authority, or why there is none (the step asked for a call it was not
    /// granted: a defect, refused).
    pub(crate) fn calling(&self, call: &'static str) -> Result<&Calling, AdvanceError> {
        self.calling
            .as_ref()
            .ok_or_else(|| mismatch(call, &self.advancing.machine, "the call is not granted in this pass".to_owned()))
    }

    /// The finish's authority, or why there is none.
    pub(crate) fn finishing(&self, call: &'static str) -> Result<&Finishing, AdvanceError> {
        self.finishing
            .as_ref()
            .ok_or_else(|| mismatch(call, &self.advancing.machine, "the finish is not granted in this pass".to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_upgrade_core::rollout::CallDenied;

    #[test]
    fn an_authority_comes_only_from_what_the_pass_decided() {
        let decision = Decision::advancing(["w-1".to_owned()]);
        let advancing = Advancing::of("w-1", &decision).expect("advanced, the lock kept");
        assert_eq!(Advancing::of("w-2", &decision), None, "a machine the decision does not advance");
        for lock in [LockAction::Acquire { takeover_from: None }, LockAction::Release, LockAction::Leave] {
            let unlocked = Decision { lock: lock.clone(), ..decision.clone() };
            assert_eq!(Advancing::of("w-1", &unlocked), None, "{lock:?}: no lock kept, nothing advanced");
        }
        let denied =
            [CallAuthority::NeedsEtcdGate, CallAuthority::NeedsPreflight, CallAuthority::Denied(CallDenied::Held)];
        for authority in &denied {
            assert_eq!(Calling::of(&advancing, authority), None, "{authority:?}");
            assert_eq!(Finishing::of(&advancing, authority), None, "{authority:?}");
        }
        assert_eq!(Calling::of(&advancing, &CallAuthority::Granted).map(|c| c.machine), Some("w-1".to_owned()));
        let grants = Grants::of(advancing, &CallAuthority::Granted, &CallAuthority::NeedsEtcdGate);
        assert!(grants.calling("Upgrade").is_ok());
        assert!(matches!(grants.finishing("Reboot"), Err(AdvanceError::NotAuthorised { call: "Reboot", .. })));
    }

    #[test]
    fn a_side_effect_needs_its_own_intent_on_its_own_machine() {
        use ichor_upgrade_core::upgrade_marker::reason::{UPGRADE_INTENT, UPGRADE_REQUESTED};
        let intent = Recorded { machine: "w-1", condition: "TalosUpgrade", reason: UPGRADE_INTENT };
        assert!(check("Upgrade", "w-1", "w-1", &intent, UPGRADE_INTENT).is_ok());
        let refused = [
            check("Upgrade", "w-1", "w-2", &intent, UPGRADE_INTENT),
            check("Upgrade", "w-2", "w-2", &intent, UPGRADE_INTENT),
            check("Upgrade", "w-1", "w-1", &intent, UPGRADE_REQUESTED),
        ];
        for refusal in refused {
            let error = refusal.expect_err("refused");
            assert!(!error.is_transient(), "{error}: a defect pauses, never retried");
            assert_eq!(error.reason(), "NotAuthorised");
        }
    }
}
