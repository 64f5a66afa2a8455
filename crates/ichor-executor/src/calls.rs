//! What every driver of this crate shares, below all of them: the [`Executor`] (the seams
//! and the configuration a driver works through), the errors of a pass, the bounded call
//! helpers, and the reads each driver makes the same way (the node name, the Node as the
//! step sees it, storage). Nothing here changes the cluster: side effects go through
//! [`crate::effects`].

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use ichor_storage::{ConditionWriteError, EvacuationError, observe_storage};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::evacuation::{StorageObservation, with_recorded_evacuation};
use ichor_upgrade_core::machine::talos::MachineFailure;
use ichor_upgrade_core::machine::vocabulary::{MachineStage, NodeObservation, TalosObservation};
use ichor_upgrade_core::status::MachineOutcome;

use crate::cause::report;
use crate::clock::Clock;
use crate::config::ExecutorConfig;
use crate::kube_api::{KubeApi, KubeError, MachineInfo, NodeInfo};
use crate::snapshot::SnapshotStore;
use crate::storage_api::StorageApi;
use crate::talos_api::{TalosApi, TalosError};

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
    /// [`poll`](ichor_upgrade_core::machine::vocabulary::StepTimeouts::poll) from now.
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
    /// A side effect was asked for under a mandate or a record of another machine (a
    /// defect of the caller): nothing was done, and the operation pauses.
    #[error("{call} on machine {machine} was not made: {why}")]
    NotAuthorised {
        /// The side effect.
        call: &'static str,
        /// The machine.
        machine: String,
        /// What did not match.
        why: String,
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
            Self::NotAuthorised { .. } => false,
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
            Self::NotAuthorised { .. } => "NotAuthorised",
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

/// How many of a pass's reads of one kind are in flight at once (one per machine: its
/// evacuation's record, its node name, its configuration). A pass over a thousand machines
/// that sent them all at once would fill the API server's queues for this client (API
/// Priority and Fairness answers 429 past a few hundred), and a pass that then failed and
/// was retried would send them all again: on a loaded server, no pass would ever end.
pub const READS_AT_ONCE: usize = 16;

/// Runs `futures` with at most [`READS_AT_ONCE`] in flight, each started only when a slot
/// is free (so a bound inside it counts from its start); their outputs in their order.
pub(crate) async fn at_most_a_few<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    use futures::StreamExt as _;
    // Made first (a future does nothing until polled): a stream over the caller's closure
    // would hold it across the awaits, which rustc cannot then prove `Send`.
    let futures: Vec<F> = futures.into_iter().collect();
    futures::stream::iter(futures).buffered(READS_AT_ONCE).collect().await
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

pub(crate) fn failed(failure: &MachineFailure) -> MachineOutcome {
    MachineOutcome::Failed { reason: failure.reason().to_owned(), message: failure.to_string() }
}
