//! The pass's own writes: the cluster lock's Lease and the operation's status, and the
//! two ends a pass comes to before it decides anything (a cluster that does not exist, a
//! Lease it may not read).

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::rollout::{Decision, LockAction};
use ichor_upgrade_core::status::{Phase, WaitReason};

use super::outcome::{ReconcileError, ReconcileOutcome, kube_call};
use super::record::emit_phase_event;
use crate::calls::Executor;
use crate::kube_api::{LeaseInfo, LeaseWrite};

/// How soon an operation waiting for a permission is looked at again: RBAC is not watched.
pub const FORBIDDEN_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// An operation whose cluster lock the operator may not read (its RBAC lacks the
/// operation's namespace): Waiting, saying what was refused (the Kubernetes adapter adds
/// what grants it), with a Warning Event when it becomes so; nothing else is read or done.
/// Looked at again after [`FORBIDDEN_RECHECK`].
pub(super) async fn wait_forbidden(
    ex: &Executor<'_>,
    name: &str,
    op: &crate::kube_api::OperationInfo,
    what: String,
) -> Result<ReconcileOutcome, ReconcileError> {
    let read = op.status.clone().for_generation(op.generation);
    let phase = Phase::Waiting(WaitReason::Forbidden { what });
    let mut status = read.clone();
    status.phase = phase.clone();
    status.observed_generation = Some(op.generation);
    if write_status(ex, name, &op.status, &status).await? {
        emit_phase_event(ex, name, &read.phase, &phase).await;
    }
    Ok(ReconcileOutcome {
        phase,
        requeue_at: Some(ex.clock.now().saturating_add(FORBIDDEN_RECHECK)),
        finished: false,
        preflight_blocked: Vec::new(),
        preflight_cleared: Vec::new(),
    })
}

/// An operation whose cluster does not exist: Refused, naming it, with a Warning Event when
/// it becomes so (its machine records kept); judged again when the cluster appears (the
/// controller maps a TalosCluster's changes to its operations). Deleted, it lets go at once:
/// with no cluster there is nothing of it to observe or wind down.
pub(super) async fn refuse_for_missing_cluster(
    ex: &Executor<'_>,
    name: &str,
    op: &crate::kube_api::OperationInfo,
) -> Result<ReconcileOutcome, ReconcileError> {
    let outcome = |phase: Phase, finished: bool| ReconcileOutcome {
        phase,
        requeue_at: None,
        finished,
        preflight_blocked: Vec::new(),
        preflight_cleared: Vec::new(),
    };
    if op.deleting {
        kube_call(ex, "remove finalizer", ex.kube.remove_finalizer(name))
            .await
            .map_err(|source| ReconcileError::WriteOperation { name: name.to_owned(), source })?;
        return Ok(outcome(Phase::Completed, true));
    }
    let read = op.status.clone().for_generation(op.generation);
    let phase = Phase::Refused(ichor_upgrade_core::operation::Refusal::ClusterNotFound { cluster: op.cluster.clone() });
    let mut status = read.clone();
    status.phase = phase.clone();
    status.observed_generation = Some(op.generation);
    if write_status(ex, name, &op.status, &status).await? {
        emit_phase_event(ex, name, &read.phase, &phase).await;
    }
    Ok(outcome(phase, false))
}

/// Writes the Lease as the decision says, under the observed resourceVersion.
pub(super) async fn write_lock(
    ex: &Executor<'_>,
    cluster: &str,
    identity: &str,
    lease: Option<&LeaseInfo>,
    decision: &Decision,
    now: Timestamp,
) -> Result<(), ReconcileError> {
    let holder = match decision.lock {
        LockAction::Acquire { .. } | LockAction::Renew => Some(identity.to_owned()),
        LockAction::Release => None,
        LockAction::Keep | LockAction::Leave => return Ok(()),
    };
    let write = LeaseWrite {
        holder,
        renewed_at: now,
        duration: ex.config.rollout.lease_duration,
        expected_resource_version: lease.map(|l| l.resource_version.clone()),
    };
    kube_call(ex, "write Lease", ex.kube.write_lease(cluster, &write))
        .await
        .map_err(|source| ReconcileError::WriteLease { cluster: cluster.to_owned(), source })
}

/// Writes the operation's status, unless it is what was read: a pass that changed nothing
/// writes nothing. Whether it wrote.
pub(super) async fn write_status(
    ex: &Executor<'_>,
    name: &str,
    read: &ichor_upgrade_core::status::OperationStatus,
    status: &ichor_upgrade_core::status::OperationStatus,
) -> Result<bool, ReconcileError> {
    if read == status {
        return Ok(false);
    }
    kube_call(ex, "write operation status", ex.kube.write_operation_status(name, status))
        .await
        .map_err(|source| ReconcileError::WriteOperation { name: name.to_owned(), source })?;
    Ok(true)
}
