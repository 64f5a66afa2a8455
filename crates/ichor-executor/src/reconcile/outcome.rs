//! What a pass comes to ([`ReconcileOutcome`]), why one could not be carried out
//! ([`ReconcileError`]), and the bound every Kubernetes call of a pass is made under.

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::status::Phase;

use crate::calls::{AdvanceError, Executor, KubeCallError};
use crate::kube_api::KubeError;

/// What one pass came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileOutcome {
    /// The operation's phase after the pass.
    pub phase: Phase,
    /// When to reconcile again at the latest; `None` when only a change can move it.
    pub requeue_at: Option<Timestamp>,
    /// The operation is gone, or was finalized in this pass.
    pub finished: bool,
    /// The machines the preflight gate held back in this pass, each with its blockers as
    /// one line (for traces and metrics; the Warning Event says the same to people).
    pub preflight_blocked: Vec<(String, String)>,
    /// The machines the gate found clear in this pass, or that started in it: no longer
    /// held back. (A machine the gate was not asked about in a pass is in neither list.)
    pub preflight_cleared: Vec<String>,
}

impl ReconcileOutcome {
    /// The outcome of a pass that found its operation gone.
    pub(super) fn gone() -> Self {
        Self {
            phase: Phase::Completed,
            requeue_at: None,
            finished: true,
            preflight_blocked: Vec::new(),
            preflight_cleared: Vec::new(),
        }
    }
}

/// Why a pass could not be carried out. Machine-level trouble never lands here: it is a
/// machine's wait or failure in the status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconcileError {
    /// The operation could not be read.
    #[error("reading operation {name}: {source}")]
    ReadOperation {
        /// The operation.
        name: String,
        /// The cause.
        #[source]
        source: KubeCallError,
    },
    /// The cluster, its machines or its Lease could not be read.
    #[error("reading cluster {cluster}: {source}")]
    ReadCluster {
        /// The cluster.
        cluster: String,
        /// The cause.
        #[source]
        source: KubeCallError,
    },
    /// The Lease could not be written (a lost race is a conflict: transient).
    #[error("writing the Lease of cluster {cluster}: {source}")]
    WriteLease {
        /// The cluster.
        cluster: String,
        /// The cause.
        #[source]
        source: KubeCallError,
    },
    /// The operation's status or finalizer could not be written.
    #[error("writing operation {name}: {source}")]
    WriteOperation {
        /// The operation.
        name: String,
        /// The cause.
        #[source]
        source: KubeCallError,
    },
    /// A resume could not be carried out: what a failed machine's attempt left could not
    /// be closed. The resume is not acknowledged and the machine stays failed, so that the
    /// next pass tries again; nothing else was done in this pass.
    #[error("resuming: closing the failed attempt of machine {machine}: {source}")]
    RetryReset {
        /// The machine.
        machine: String,
        /// The cause.
        #[source]
        source: AdvanceError,
    },
    /// After a pass that did not end, the storage backend's record of an evacuation could
    /// not be read: whether the machine is in progress is unknown, so nothing is decided.
    #[error("reading the evacuation record of machine {machine}: {source}")]
    EvacuationRecord {
        /// The machine.
        machine: String,
        /// The cause.
        #[source]
        source: AdvanceError,
    },
    /// A Kubernetes upgrade's bootstrap manifests could not be read from any control
    /// plane, or an apply failed in a way a retry can fix: nothing is recorded, the next
    /// pass applies them again.
    #[error("applying the bootstrap manifests: {source}")]
    Manifests {
        /// The cause.
        #[source]
        source: AdvanceError,
    },
}

impl ReconcileError {
    /// Whether waiting and retrying can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::ReadOperation { source, .. }
            | Self::ReadCluster { source, .. }
            | Self::WriteLease { source, .. }
            | Self::WriteOperation { source, .. } => source.is_transient(),
            Self::RetryReset { source, .. } | Self::EvacuationRecord { source, .. } | Self::Manifests { source } => {
                source.is_transient()
            }
        }
    }
}

pub(super) async fn kube_call<T>(
    ex: &Executor<'_>,
    call: &'static str,
    future: impl Future<Output = Result<T, KubeError>>,
) -> Result<T, KubeCallError> {
    match tokio::time::timeout(ex.config.call_timeout, future).await {
        Ok(result) => result.map_err(KubeCallError::from),
        Err(_) => Err(crate::calls::CallTimedOut { call, bound: ex.config.call_timeout }.into()),
    }
}
