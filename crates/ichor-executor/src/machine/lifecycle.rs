//! The lifecycle executor's driver (Talos 1.13 and later): one pass over one machine on
//! the client-driven path. It reads what the step's phase looks at
//! ([`lifecycle_reads`]), calls the pure [`lifecycle_step`], carries out its one action and
//! writes the machine's conditions. It keeps nothing between passes.
//!
//! The pull, the install, the cordon, the drain, the reboot and the uncordon are the
//! engine's on this path: Talos only writes the other boot slot (facts sheet §4.2).

use std::sync::Arc;

use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate};
use ichor_upgrade_core::machine::lifecycle::{
    CORDONED_ANNOTATION, CordonState, DrainObservation, INSTALLER_PULL, LifecycleAction, LifecycleInput, PULLED,
    cordon_annotation, cordoned_for, cordoned_since, lifecycle_reads, lifecycle_step, pulled_message, reason,
};
use ichor_upgrade_core::machine::talos::{Action, MachineFailure, MachineWait, StepInput, UpgradeTarget};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::PodRef;
use ichor_upgrade_core::machine::vocabulary::{EtcdMembership, MachineSpec, TalosObservation};
use ichor_upgrade_core::machine::vocabulary::{InstallExit, TALOS_LIFECYCLE};
use ichor_upgrade_core::rollout::CallAuthority;
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::upgrade_marker::UpgradeMarker;

use crate::background::{INSTALL_STOPPED, Job, StopFlag};
use crate::calls::{
    AdvanceError, CallTimedOut, Executor, TalosCallError, bounded, drains, failed, kube, node_observation, observe,
    seen_with_storage, talos_observation,
};
use crate::cause::report;
use crate::effects::{self, Calling, Grants, Intent, JobCheck, JobStep};
use crate::kube_api::{Eviction, MachineInfo, NodeInfo, PodInfo};
use crate::machine::actions::carry_out;
use crate::talos_api::{InstallOutcome, InstallRequest, PullRequest, TalosError};

/// A wait, never a record: the drain after a cordon was not made because a fresh read no
/// longer authorises it (the machine failed, or the operation lost the lock); the next pass
/// decides again.
pub const DRAIN_STOPPED: &str = "DrainStopped";

/// What the caller already read of the machine (its node name and Node), and the identity
/// of the operation it is advanced for (its cordon names it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    pub(crate) node_name: Option<&'a str>,
    pub(crate) node: Option<&'a NodeInfo>,
    pub(crate) operation: &'a str,
}

/// One pass over a machine on the lifecycle executor.
pub(crate) async fn advance(
    ex: &Executor<'_>,
    grants: &Grants,
    machine: &MachineInfo,
    seen: Seen<'_>,
    target: &UpgradeTarget,
    authority: &CallAuthority,
    finish: &CallAuthority,
) -> Result<MachineOutcome, AdvanceError> {
    let bound = ex.config.call_timeout;
    let Seen { node_name, node, operation } = seen;
    let reads = lifecycle_reads(&machine.conditions, node.map(|n| (n.boot_id.as_str(), n.ready)), ex.clock.now());
    let talos = if reads.talos {
        talos_observation(bounded("machine stage", bound, ex.talos.machine_stage(&machine.address)).await)
    } else {
        TalosObservation::Unreachable { error: "not asked: the step does not look at it in this phase".to_owned() }
    };
    let labels = node.map(|n| n.labels.clone()).unwrap_or_default();
    let storage = match node_name {
        Some(name) if reads.storage => {
            observe(ex, name, &labels, &machine.conditions, ichor_storage::EvacuationFor::Upgrade).await?
        }
        Some(_) | None => ichor_upgrade_core::evacuation::StorageObservation::default(),
    };
    let machine = &*seen_with_storage(ex, machine, &storage, node_name);
    let etcd_member = match (machine.role, node_name) {
        (MachineRole::ControlPlane, Some(name)) if reads.talos => {
            Some(crate::etcd::membership(ex, &[machine.address.as_str()], name).await)
        }
        (MachineRole::ControlPlane, _) => Some(EtcdMembership::Unknown { error: "not read".into() }),
        (MachineRole::Worker, _) => None,
    };
    let drain = match (node_name, node) {
        (Some(name), Some(_)) if reads.drain => Some(drain_observation(ex, name).await?),
        _ => None,
    };
    let talos_boot_id = if reads.talos_boot_id {
        match bounded("read boot ID", bound, ex.talos.boot_id(&machine.address)).await {
            Ok(Ok(boot)) => Some(boot),
            Ok(Err(e)) => {
                tracing::debug!(machine = %machine.name, error = %report(&e), "boot ID unread");
                None
            }
            Err(_) => None,
        }
    } else {
        None
    };
    // Asked only of an intent on the same boot with no install of this controller's under
    // way: an answer that cannot be had is `None` (an intent is then installed again, and
    // an install seen running is waited for).
    let own_install = ex.background.is_some_and(|b| b.installing(&machine.name));
    let node_installing = if reads.install && !own_install {
        match bounded("read the installer's ServicePID", bound, ex.talos.install_running(&machine.address)).await {
            Ok(Ok(running)) => running,
            Ok(Err(e)) => {
                tracing::debug!(machine = %machine.name, error = %report(&e), "install state unread");
                None
            }
            Err(_) => None,
        }
    } else {
        None
    };
    let install_seen = ex.background.is_some_and(|b| {
        machine
            .conditions
            .get(TALOS_LIFECYCLE)
            .and_then(|c| ichor_upgrade_core::upgrade_marker::MarkerRef::parse(&c.message).ok())
            .is_some_and(|m| b.install_seen(&machine.name, m.boot_id))
    });
    let cordon = node.map_or_else(CordonState::default, |n| {
        let ours = n.annotations.get(CORDONED_ANNOTATION).filter(|v| cordoned_for(v) == Some(operation));
        CordonState {
            unschedulable: n.unschedulable,
            ours: ours.is_some(),
            since: ours.and_then(|v| cordoned_since(v)),
        }
    });
    let observation = node.map(node_observation);
    let spec = MachineSpec { name: machine.name.clone(), role: machine.role };
    let action = lifecycle_step(&LifecycleInput {
        step: StepInput {
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
        },
        cordon,
        drain: drain.as_ref(),
        talos_boot_id: talos_boot_id.as_deref(),
        finish_authority: finish,
        install_running: own_install,
        node_installing,
        install_seen,
    });
    tracing::debug!(machine = %machine.name, ?action, "lifecycle step");
    carry_out_lifecycle(ex, grants, machine, seen, target, action).await
}

/// The pods the drain has left on `node`: from the client's store while it shows some
/// (each eviction goes under the pod's UID, so a store a moment behind evicts nothing it
/// should not), and from the API server itself when the store shows none, since the reboot
/// follows on that answer (DESIGN §3.11: the store may not show a pod made a moment ago).
pub(crate) async fn drain_observation(ex: &Executor<'_>, node: &str) -> Result<DrainObservation, AdvanceError> {
    let cached = kube(ex, "read pods", ex.kube.cached_pods_on(node)).await?;
    let seen = left_to_drain(&cached);
    if !seen.evictable.is_empty() || seen.terminating > 0 {
        return Ok(seen);
    }
    let fresh = kube(ex, "list pods", ex.kube.pods_on(node)).await?;
    Ok(left_to_drain(&fresh))
}

/// What of `pods` the drain has left: those it evicts, and how many are terminating.
pub(crate) fn left_to_drain(pods: &[PodInfo]) -> DrainObservation {
    let (terminating, live): (Vec<_>, Vec<_>) = pods.iter().filter(|p| drains(p)).partition(|p| p.terminating);
    DrainObservation { evictable: live.iter().map(|p| p.reference()).collect(), terminating: terminating.len() }
}

fn progressed(action: &'static str) -> Result<MachineOutcome, AdvanceError> {
    Ok(MachineOutcome::Progressed { action })
}

fn waiting(reason: &MachineWait, message: String, ex: &Executor<'_>) -> Result<MachineOutcome, AdvanceError> {
    let recheck_at = Some(ex.clock.now().saturating_add(ex.config.step.poll));
    Ok(MachineOutcome::Waiting { reason: reason.reason().to_owned(), message, recheck_at })
}

async fn carry_out_lifecycle(
    ex: &Executor<'_>,
    grants: &Grants,
    machine: &MachineInfo,
    seen: Seen<'_>,
    target: &UpgradeTarget,
    action: LifecycleAction,
) -> Result<MachineOutcome, AdvanceError> {
    let Seen { node_name, node, operation } = seen;
    let node_unread = || MachineOutcome::Waiting {
        reason: "NodeNotFound".to_owned(),
        message: "the Node was not read in this pass: it is cordoned or uncordoned only as read".to_owned(),
        recheck_at: Some(ex.retry_at()),
    };
    // What the legacy driver already carries out the same way.
    let shared = match action {
        LifecycleAction::Converged => Some(Action::Converged),
        LifecycleAction::RecordConverged => Some(Action::RecordConverged),
        LifecycleAction::Wait { ref reason, recheck_at } => Some(Action::Wait { reason: reason.clone(), recheck_at }),
        LifecycleAction::BeginEvacuation => Some(Action::BeginEvacuation),
        LifecycleAction::EndEvacuation => Some(Action::EndEvacuation),
        LifecycleAction::Fail(ref failure) => Some(Action::Fail(failure.clone())),
        LifecycleAction::FailEndingEvacuation(ref failure) => Some(Action::FailEndingEvacuation(failure.clone())),
        LifecycleAction::Install { .. }
        | LifecycleAction::RecordInstallRunning
        | LifecycleAction::RecordInstallEnded
        | LifecycleAction::Cordon
        | LifecycleAction::Evict { .. }
        | LifecycleAction::Reboot { .. }
        | LifecycleAction::Uncordon => None,
    };
    if let Some(action) = shared {
        return carry_out(ex, grants, machine, node_name, node, target, action).await;
    }
    match action {
        LifecycleAction::Install { image, marker } => match ex.background {
            // Out of the pass: the install's stream would hold every other machine.
            Some(background) => {
                let job = Job::Install {
                    machine: Arc::new(machine.clone()),
                    node: node_name.map(str::to_owned),
                    image: image.clone(),
                    marker,
                    operation: background.operation().to_owned(),
                    stop: StopFlag::default(),
                };
                let message = if background.submit(job) {
                    format!("installing {image}")
                } else {
                    "an install is already under way".to_owned()
                };
                waiting(&MachineWait::InstallUnderWay, message, ex)
            }
            None => install(ex, machine, image, marker, Launch::Pass(grants)).await,
        },
        LifecycleAction::RecordInstallRunning | LifecycleAction::RecordInstallEnded => {
            let (status, why, outcome) = if action == LifecycleAction::RecordInstallRunning {
                (ConditionStatus::Unknown, reason::INSTALL_RUNNING, "InstallRunning")
            } else {
                (ConditionStatus::True, reason::INSTALLED, "InstallEnded")
            };
            let mut conditions = machine.conditions.clone();
            let marker = conditions.get(TALOS_LIFECYCLE).map(|c| c.message.clone()).unwrap_or_default();
            note_lifecycle(ex, machine, &mut conditions, status, why, marker).await?;
            if action == LifecycleAction::RecordInstallRunning {
                return waiting(&MachineWait::InstallUnderWay, "the node runs the install".to_owned(), ex);
            }
            progressed(outcome)
        }
        // Both written under the Node as this pass read it (its resourceVersion): a cordon
        // placed or lifted by anyone since is a conflict, and the next pass decides again.
        LifecycleAction::Cordon => {
            let Some(read) = node else { return Ok(node_unread()) };
            effects::cordon(ex, &grants.advancing, read, &cordon_annotation(ex.clock.now(), operation)).await?;
            progressed("Cordon")
        }
        LifecycleAction::Uncordon => {
            let Some(read) = node else { return Ok(node_unread()) };
            effects::uncordon(ex, read).await?;
            progressed("Uncordon")
        }
        LifecycleAction::Evict { pods } => drain(ex, grants, machine, node_name, operation, &pods).await,
        LifecycleAction::Reboot { marker } => reboot(ex, grants, machine, &marker).await,
        LifecycleAction::Converged
        | LifecycleAction::RecordConverged
        | LifecycleAction::Wait { .. }
        | LifecycleAction::BeginEvacuation
        | LifecycleAction::EndEvacuation
        | LifecycleAction::Fail(_)
        | LifecycleAction::FailEndingEvacuation(_) => unreachable!("carried out above"),
    }
}

/// The drain: the pods evicted under the pass's authority, once a fresh read still
/// authorises it; a PodDisruptionBudget that blocks one is a wait.
async fn drain(
    ex: &Executor<'_>,
    grants: &Grants,
    machine: &MachineInfo,
    node_name: Option<&str>,
    operation: &str,
    pods: &[PodRef],
) -> Result<MachineOutcome, AdvanceError> {
    // The cordon (or an eviction) just before took a call's time since the pass
    // read the operation: a failure recorded meanwhile is seen before the drain.
    // Past its call, a hold, a pause or a deletion stops nothing here.
    let name = node_name.unwrap_or(&machine.name);
    if let Err(why) = effects::still_authorised(ex, operation, &machine.name, Some(name), true).await {
        tracing::info!(machine = %machine.name, %why, "the drain is not made: a fresh read no longer authorises it");
        return Ok(MachineOutcome::Waiting {
            reason: DRAIN_STOPPED.to_owned(),
            message: format!("the drain was not made: {why}"),
            recheck_at: None,
        });
    }
    let mut blocked = Vec::new();
    for pod in pods {
        match effects::evict(ex, &grants.advancing, pod).await? {
            Eviction::Evicted => {}
            Eviction::Blocked { message } => blocked.push((pod.to_string(), message)),
        }
    }
    match blocked.first() {
        None => progressed("Drain"),
        // No watch says when a budget allows an eviction again: polled.
        Some((pod, _)) => {
            let message = blocked.iter().map(|(p, m)| format!("{p}: {m}")).collect::<Vec<_>>().join("; ");
            let wait = MachineWait::EvictionBlocked { pod: pod.clone() };
            waiting(&wait, format!("a PodDisruptionBudget blocks evictions: {message}"), ex)
        }
    }
}

async fn note_lifecycle(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut ichor_upgrade_core::conditions::Conditions,
    status: ConditionStatus,
    reason: &str,
    message: String,
) -> Result<(), AdvanceError> {
    effects::note_condition(ex, machine, conditions, ConditionUpdate::new(TALOS_LIFECYCLE, status, reason, message))
        .await
}

fn stopped(machine: &str, why: &str) -> Result<MachineOutcome, AdvanceError> {
    tracing::info!(%machine, why, "install job stopped before its next side effect");
    Ok(MachineOutcome::Waiting { reason: INSTALL_STOPPED.to_owned(), message: why.to_owned(), recheck_at: None })
}

/// Where an install is carried out: in its pass, under the pass's grants, or outside it, by
/// a job that checks its authority again against fresh reads.
#[derive(Clone, Copy)]
pub(crate) enum Launch<'a> {
    /// In the pass.
    Pass(&'a Grants),
    /// By a background job.
    Job(&'a JobCheck<'a>),
}

/// The pull (no record: an image in the store is harmless, and a pull of one already there
/// ends at once), the intent, the install under what is left of its bound, its outcome.
/// Run outside its pass ([`Launch::Job`]), it checks its authority again against a fresh
/// read before the intent and before the install, and writes the intent on that read.
pub(crate) async fn install(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    image: String,
    mut marker: UpgradeMarker,
    launch: Launch<'_>,
) -> Result<MachineOutcome, AdvanceError> {
    let check = match launch {
        Launch::Job(check) => Some(check),
        Launch::Pass(_) => None,
    };
    if let Some(check) = check
        && check.stop.stopped()
    {
        return stopped(&machine.name, "a pass stopped the machine before its pull");
    }
    let bound = ex.config.step.upgrade_call;
    let pull = PullRequest { image: image.clone(), timeout: bound };
    let pull_began = ex.clock.now();
    match effects::pull(ex, &machine.address, &pull).await {
        Ok(_) => {}
        Err(TalosCallError::Api(e)) if e.is_unreachable() => {
            return waiting(&MachineWait::TalosApiUnreachable, format!("pulling {image}: {}", report(&e)), ex);
        }
        Err(TalosCallError::Api(e)) => {
            return Ok(failed(&MachineFailure::PullFailed(format!("{image}: {}", report(&e)))));
        }
        Err(TalosCallError::TimedOut(timed_out)) => {
            return Ok(failed(&MachineFailure::PullFailed(format!("{image}: {timed_out}"))));
        }
    }
    // An install asked for again under an intent finishes a machine already past its call
    // (a hold or a pause does not interrupt it): it is checked as the install is.
    let repeated = machine
        .conditions
        .get(TALOS_LIFECYCLE)
        .is_some_and(|c| c.status == ConditionStatus::Unknown && c.reason == reason::INSTALL_INTENT);
    let step = if repeated { JobStep::Install } else { JobStep::Intent };
    // The intent is written under the pass's grant on the pass's read; outside a pass, on
    // what a fresh read shows, if it still authorises it.
    let fresh;
    let (machine, calling): (&MachineInfo, Calling) = match launch {
        Launch::Pass(grants) => (machine, grants.calling("LifecycleService.Upgrade")?.clone()),
        Launch::Job(check) => match effects::job_calling(ex, check, machine, step).await {
            Ok((calling, read)) => {
                fresh = read;
                (&fresh, calling)
            }
            Err(why) => return stopped(&machine.name, &why),
        },
    };
    // The install's bound counts from now, after the pull.
    marker.call_deadline = ex.clock.now().saturating_add(bound);
    let mut conditions = machine.conditions.clone();
    // A new intent starts a new clock (the verify bound counts from it); an install asked
    // for again under an intent keeps the intent's clock, so that a node that never takes
    // it fails at the verify bound instead of being asked for ever.
    if !repeated {
        conditions.remove(TALOS_LIFECYCLE);
        // The pull is recorded in the intent's own write (the machine's history keeps it
        // as its `pull` step); a repeated install's pull of an image already there is not.
        conditions.remove(INSTALLER_PULL);
        let took = ex.clock.now().saturating_since(pull_began);
        let pulled = ConditionUpdate::new(INSTALLER_PULL, ConditionStatus::True, PULLED, pulled_message(&image, took));
        conditions.upsert(pulled, ex.clock.now());
    }
    if let Some(check) = check
        && !repeated
        && !check.stop.commit()
    {
        return stopped(&machine.name, "a pass stopped the machine before its intent");
    }
    let text = marker.to_string();
    let intent = Intent {
        condition: TALOS_LIFECYCLE,
        status: ConditionStatus::Unknown,
        reason: reason::INSTALL_INTENT,
        message: text.clone(),
    };
    let recorded = effects::record(ex, &calling, machine, &mut conditions, intent).await?;
    // Outside a pass the install is authorised by a fresh read again. If it is not, the
    // intent stands: the machine is past its call, and a later pass finishes it under the
    // authority it then has.
    let calling = match check {
        Some(check) => match effects::job_calling(ex, check, machine, JobStep::Install).await {
            Ok((calling, _)) => calling,
            Err(why) => return stopped(&machine.name, &why),
        },
        None => calling,
    };
    let left = marker.call_deadline.saturating_since(ex.clock.now()).min(bound);
    let request = InstallRequest { image, timeout: left };
    tracing::info!(machine = %machine.name, image = %request.image, "LifecycleService.Upgrade");
    let started = std::sync::atomic::AtomicBool::new(false);
    let call = effects::install(ex, &calling, &recorded, machine, &request, &started)?;
    let call = bounded("LifecycleService.Upgrade", left, call);
    let answer = follow_install(ex, machine, &mut conditions, &marker, &started, call).await?;
    install_answered(ex, machine, &mut conditions, text, answer).await
}

/// What the install's answer comes to: an exit of 0 recorded as installed, another exit
/// or a refusal a failure, a stream broken off or another install running a wait.
async fn install_answered(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut ichor_upgrade_core::conditions::Conditions,
    text: String,
    answer: Result<Result<InstallOutcome, TalosError>, CallTimedOut>,
) -> Result<MachineOutcome, AdvanceError> {
    match answer {
        Ok(Ok(outcome)) => match InstallExit::from_code(outcome.exit_code) {
            InstallExit::Success => {
                note_lifecycle(ex, machine, conditions, ConditionStatus::True, reason::INSTALLED, text).await?;
                progressed("Installed")
            }
            exit => {
                let failure = MachineFailure::Install { exit, output: outcome.output.join(" | ") };
                let message = failure.to_string();
                note_lifecycle(ex, machine, conditions, ConditionStatus::False, reason::INSTALL_FAILED, message)
                    .await?;
                Ok(failed(&failure))
            }
        },
        Ok(Err(e)) if e.is_unreachable() => waiting(
            &MachineWait::InstallUnderWay,
            format!("the install broke off ({}); the node is asked again", report(&e)),
            ex,
        ),
        // Talos answers FailedPrecondition while another install runs on the node (one at a
        // time): a wait, under the verify bound the intent's clock sets.
        Ok(Err(e)) if matches!(&e, TalosError::Answered { code, .. } if code == "FailedPrecondition") => {
            waiting(&MachineWait::InstallUnderWay, report(&e), ex)
        }
        Ok(Err(e)) => {
            let failure =
                MachineFailure::LifecycleCallRefused { call: "LifecycleService.Upgrade", message: report(&e) };
            let message = failure.to_string();
            note_lifecycle(ex, machine, conditions, ConditionStatus::False, reason::INSTALL_FAILED, message).await?;
            Ok(failed(&failure))
        }
        Err(timed_out) => Ok(failed(&MachineFailure::UpgradeCallTimedOut(timed_out.bound))),
    }
}

/// How often a running install's stream asks the node whether the installer runs, until
/// it is seen (then recorded) once.
const INSTALL_SEEN_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs the install's `call` to its end and, beside it, records `InstallRunning` as soon as
/// the node shows the installer running: from then on a controller that died with the
/// stream (or a stream an outage cut) knows the install ran on this boot, and never makes
/// it again (its exit code unseen, the reboot's verification judges it).
async fn follow_install<T>(
    ex: &Executor<'_>,
    machine: &MachineInfo,
    conditions: &mut ichor_upgrade_core::conditions::Conditions,
    marker: &UpgradeMarker,
    started: &std::sync::atomic::AtomicBool,
    call: impl Future<Output = T>,
) -> Result<T, AdvanceError> {
    let mut call = std::pin::pin!(call);
    let text = marker.to_string();
    let mut remembered = false;
    loop {
        // The call first, so that a seed replays the same run.
        let tick = std::pin::pin!(tokio::time::sleep(INSTALL_SEEN_POLL));
        if let futures::future::Either::Left((answer, _)) = futures::future::select(call.as_mut(), tick).await {
            return Ok(answer);
        }
        let seen = started.load(std::sync::atomic::Ordering::Relaxed) || {
            let asked = ex.talos.install_running(&machine.address);
            matches!(bounded("read the installer's ServicePID", INSTALL_SEEN_POLL, asked).await, Ok(Ok(Some(true))))
        };
        if !seen {
            continue;
        }
        if !remembered && let Some(background) = ex.background {
            background.install_started(&machine.name, &marker.boot_id);
            remembered = true;
        }
        let status = ConditionStatus::Unknown;
        match note_lifecycle(ex, machine, conditions, status, reason::INSTALL_RUNNING, text.clone()).await {
            Ok(()) => return Ok(call.await),
            // (An outage: this process remembers it; the record is tried again.)
            Err(e) => tracing::debug!(machine = %machine.name, error = %e, "InstallRunning not recorded yet"),
        }
    }
}

/// The reboot's record, then the call, under the pass's authority to finish.
async fn reboot(
    ex: &Executor<'_>,
    grants: &Grants,
    machine: &MachineInfo,
    marker: &UpgradeMarker,
) -> Result<MachineOutcome, AdvanceError> {
    let finishing = grants.finishing("Reboot")?;
    let mut conditions = machine.conditions.clone();
    let intent = Intent {
        condition: TALOS_LIFECYCLE,
        status: ConditionStatus::Unknown,
        reason: reason::REBOOT_REQUESTED,
        message: marker.to_string(),
    };
    let recorded = effects::record(ex, finishing, machine, &mut conditions, intent).await?;
    tracing::info!(machine = %machine.name, "MachineService.Reboot");
    match effects::reboot(ex, finishing, &recorded, machine).await? {
        Ok(actor) => {
            tracing::info!(machine = %machine.name, %actor, "Reboot acknowledged");
            progressed("RebootRequested")
        }
        // The reboot may have reached the node: what it does next says (its boot ID).
        Err(TalosCallError::Api(e)) if e.is_unreachable() => waiting(
            &MachineWait::RebootUnconfirmed,
            format!("the Reboot call broke off ({}); the node's boot ID tells", report(&e)),
            ex,
        ),
        Err(TalosCallError::TimedOut(timed_out)) => waiting(&MachineWait::RebootUnconfirmed, timed_out.to_string(), ex),
        Err(TalosCallError::Api(e)) => {
            Ok(failed(&MachineFailure::LifecycleCallRefused { call: "Reboot", message: report(&e) }))
        }
    }
}
