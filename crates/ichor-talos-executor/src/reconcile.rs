//! `reconcile`: one pass of one operation. It observes the operation, its cluster, the
//! Lease and every machine, asks the rollout engine, carries out the decision (the lock
//! first, then resets, stops and machine steps), and writes the operation's status. It
//! holds no state between calls: call it again at the returned time, or when something
//! changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use foldhash::fast::FixedState;
use futures::future::join_all;
use ichor_storage::EvacuationEnd;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::etcd_snapshot::SnapshotState;
use ichor_upgrade_core::evacuation::{
    EvacuationState, STORAGE_EVACUATION, StorageObservation, evacuation_state, with_recorded_evacuation,
};
use ichor_upgrade_core::kubernetes_args::ComponentArgs;
use ichor_upgrade_core::kubernetes_manifests::WorkloadRollout;
use ichor_upgrade_core::kubernetes_plan::{
    Component, KubernetesPlanInput, KubernetesPlanProblem, NodeKubernetes, plan_kubernetes,
};
use ichor_upgrade_core::kubernetes_step::{KubernetesStage, kubernetes_stage, past_apply, stage_converged};
use ichor_upgrade_core::lifecycle_step::{CORDONED_ANNOTATION, cordoned_for};
use ichor_upgrade_core::operation::{HOLD_ANNOTATION, MachineRole, ORDER_LABEL, RESUME_ANNOTATION, SnapshotMode};
use ichor_upgrade_core::preflight::{Blocker, ClusterFacts, NodeFacts, Preflight, PreflightConfig, describe};
use ichor_upgrade_core::removal_step::{is_removed, past_reset};
use ichor_upgrade_core::rollout::{
    CallAuthority, CallDenied, ComponentsVerdict, Decision, EtcdVerdict, KubernetesInput, LeaseHolder, LockAction,
    MachineProgress, MachineView, OperationStatus, OperationView, Phase, PreflightVerdict, RolloutInput, WaitReason,
    call_authority, decide, finish_authority,
};
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::talos_step::{ConvergedOn, MachineWait, UpgradeTarget, installer_image_for};
use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion};

use crate::advance::{advance_machine_with, machine_past_upgrade_call, outcome_recheck, reset_for_retry};
use crate::background::{Background, Job};
use crate::calls::{AdvanceError, Executor, KubeCallError, OperationRef, bounded};
use crate::cause::report;
use crate::effects::{self, Advancing, Grants};
use crate::etcd::{self, ControlPlane};
use crate::etcd_snapshot;
use crate::kube_api::{ClusterInfo, Event, EventType, KubeError, LeaseInfo, LeaseWrite, MachineInfo, NodeInfo};
use crate::kubernetes::{KubernetesWork, advance_kubernetes};
use crate::machine_config::MachineConfig;
use crate::removal::remove_machine;

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

async fn kube_call<T>(
    ex: &Executor<'_>,
    call: &'static str,
    future: impl Future<Output = Result<T, KubeError>>,
) -> Result<T, KubeCallError> {
    match tokio::time::timeout(ex.config.call_timeout, future).await {
        Ok(result) => result.map_err(KubeCallError::from),
        Err(_) => Err(crate::calls::CallTimedOut { call, bound: ex.config.call_timeout }.into()),
    }
}

/// What a controller remembers between passes of one operation, so that a pass advances
/// only the machines whose observation changed or whose recheck time is due, not all of
/// them. It is a cache, never a source of truth: a controller that lost it (a restart)
/// passes over every machine once, and nothing is decided from it but whether to look.
///
/// A machine is passed over only when its last step was a wait, and since then its
/// `TalosMachine`, its Node and its call authority are unchanged and its recheck time has
/// not come. The step is a function of those, of the time (its deadlines are its recheck
/// times), and of what no watch reports (Talos, etcd, storage), which every such wait
/// polls at [`StepTimeouts::poll`](ichor_upgrade_core::talos_step::StepTimeouts::poll).
///
/// It also keeps the last pass's machine views: a machine whose shared `TalosMachine` and
/// Node are the very objects of the last pass (the same `Arc`s, as a cache hands out while
/// they are unchanged) and that has no record in the status keeps its view.
#[derive(Debug, Default)]
pub struct PassMemory {
    waits: Mutex<HashMap<String, Remembered>>,
    views: Mutex<ViewCache>,
    /// Since when a status change that may wait (see
    /// [`OperationStatus::only_bookkeeping_since`]) has been held back.
    held_since: Mutex<Option<Timestamp>>,
    /// Nodes whose storage changed since the last pass (see [`PassMemory::storage_changed`]).
    storage_changed: Mutex<HashSet<String>>,
    /// The machines the preflight held back, as last reported in an Event.
    preflight_reported: Mutex<Vec<(String, Vec<Blocker>)>>,
    /// When the last pass started, and whether it asked to look again at once (see
    /// [`PassMemory::defer_pass`]).
    last_pass: Mutex<Option<(Timestamp, bool)>>,
    /// The cluster Lease's resourceVersion as last read, and since when (on this
    /// controller's clock) it has been read unchanged.
    lease_seen: Mutex<Option<(String, Timestamp)>>,
    /// Whether this process's last pass ended (not killed, not failed midway).
    last_pass_ended: Mutex<bool>,
}

/// The machine views of the last pass, with what each was built from.
#[derive(Debug, Default)]
struct ViewCache {
    /// Whether the views are of a removal, and the version convergence is judged on.
    key: Option<ViewKey>,
    views: Vec<MachineView>,
    sources: Vec<(Arc<MachineInfo>, Option<Arc<NodeInfo>>)>,
    /// Each machine's index, by name.
    index: HashMap<String, usize>,
    /// The machines with a record in the status the views were built from.
    recorded: Vec<String>,
}

impl ViewCache {
    /// Brings the views up to date with `observed` and `status`: a view is built again
    /// when its machine or Node object changed, and its progress read again when the
    /// machine has or had a record in the status.
    fn refresh(
        &mut self,
        key: ViewKey,
        observed: &[Observed],
        status: &OperationStatus,
        build: impl Fn(&Observed) -> MachineView,
        progress: impl Fn(&Observed) -> MachineProgress,
    ) {
        let same_list = self.key.as_ref() == Some(&key)
            && self.sources.len() == observed.len()
            && self
                .sources
                .iter()
                .zip(observed)
                .all(|((m, _), o)| Arc::ptr_eq(m, &o.machine) || m.name == o.machine.name);
        if !same_list {
            self.key = Some(key);
            self.views = observed.iter().map(&build).collect();
            self.sources = observed.iter().map(|o| (Arc::clone(&o.machine), o.node.clone())).collect();
            self.index = observed.iter().enumerate().map(|(i, o)| (o.machine.name.clone(), i)).collect();
            self.recorded = status.machines.keys().cloned().collect();
            return;
        }
        for (i, o) in observed.iter().enumerate() {
            let (machine, node) = &self.sources[i];
            let node_same = match (node, &o.node) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if !(Arc::ptr_eq(machine, &o.machine) && node_same) {
                self.views[i] = build(o);
                self.sources[i] = (Arc::clone(&o.machine), o.node.clone());
            }
        }
        let recorded: Vec<String> = status.machines.keys().cloned().collect();
        for name in recorded.iter().chain(&self.recorded) {
            if let Some(&i) = self.index.get(name) {
                self.views[i].progress = progress(&observed[i]);
            }
        }
        self.recorded = recorded;
    }
}

/// What the views' progress was read against: a removal, a Talos upgrade's target, or a
/// Kubernetes upgrade's target and stage.
type ViewKey = (bool, Option<ConvergedOn>, Option<(KubernetesVersion, KubernetesStage)>);

/// A machine's last wait, with what it was decided from.
#[derive(Debug, Clone)]
struct Remembered {
    machine: Arc<MachineInfo>,
    node: Option<Arc<NodeInfo>>,
    authority: (CallAuthority, CallAuthority),
    /// Whether an install of this controller ran for it (a job's end changes the step).
    installing: bool,
    recheck_at: Option<Timestamp>,
    /// The wait's reason.
    reason: String,
}

impl PassMemory {
    /// An empty memory: the next pass advances every machine in flight.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything (as a restarted controller would).
    pub fn clear(&self) {
        self.lock().clear();
        *self.views.lock().unwrap_or_else(PoisonError::into_inner) = ViewCache::default();
        *self.held() = None;
        self.take_storage_changed();
        *self.last_pass.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.lease_seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.last_pass_ended.lock().unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// Since when, on this controller's clock, the Lease has been read at `version`: `now`
    /// when it changed since the last read (or none was made). Another holder's lease runs
    /// out only once its record stood unchanged for its whole duration by this clock, never
    /// by the time another replica's clock wrote in it.
    fn lease_unchanged_since(&self, version: &str, now: Timestamp) -> Timestamp {
        let mut seen = self.lease_seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.as_ref() {
            Some((v, since)) if v == version => *since,
            _ => {
                *seen = Some((version.to_owned(), now));
                now
            }
        }
    }

    /// Whether a pass may start at `now`, [`ExecutorConfig::pass_interval`] after the last
    /// one started: `None` if it may (and it is counted as started), else the time it may.
    /// A controller that is woken sooner requeues for that time: what woke it is folded
    /// into that pass. A pass that asked to look again at once ([`PassMemory::pass_ended`]:
    /// it wrote what it must read back, or its step goes on) is followed at once.
    ///
    /// [`ExecutorConfig::pass_interval`]: crate::ExecutorConfig::pass_interval
    pub fn defer_pass(&self, now: Timestamp, interval: std::time::Duration) -> Option<Timestamp> {
        let mut last = self.last_pass.lock().unwrap_or_else(PoisonError::into_inner);
        match Self::next_pass_from(*last, interval) {
            Some(at) if now < at => Some(at),
            _ => {
                *last = Some((now, false));
                None
            }
        }
    }

    /// The earliest a pass woken from outside may start, by the rule of
    /// [`PassMemory::defer_pass`]; `None`: at any time (no pass yet, or the last one asked
    /// to look again at once). A runner that waits for its wake itself waits for this too.
    #[must_use]
    pub fn next_pass_at(&self, interval: std::time::Duration) -> Option<Timestamp> {
        Self::next_pass_from(*self.last_pass.lock().unwrap_or_else(PoisonError::into_inner), interval)
    }

    fn next_pass_from(last: Option<(Timestamp, bool)>, interval: std::time::Duration) -> Option<Timestamp> {
        match last {
            Some((at, false)) => Some(at.saturating_add(interval)),
            Some((_, true)) | None => None,
        }
    }

    /// Says that the pass begun at the last [`PassMemory::defer_pass`] ended at `now` and
    /// asked to be looked at again at `requeue_at`: at once (`requeue_at` not after `now`),
    /// the next pass is not held to the pass interval.
    pub fn pass_ended(&self, now: Timestamp, requeue_at: Option<Timestamp>) {
        let mut last = self.last_pass.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, again)) = last.as_mut() {
            *again = requeue_at.is_some_and(|t| t <= now);
        }
    }

    /// Says that the storage on Node `node` changed (a replica moved or went, the storage
    /// backend's node changed), as a watch of the backend reports it: the next pass looks
    /// again at a machine there whose wait on its evacuation would otherwise stand until
    /// its next poll. The operator calls it from its watch of Longhorn's replicas and nodes.
    pub fn storage_changed(&self, node: &str) {
        self.storage_changed.lock().unwrap_or_else(PoisonError::into_inner).insert(node.to_owned());
    }

    fn take_storage_changed(&self) -> HashSet<String> {
        std::mem::take(&mut *self.storage_changed.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Timestamp>> {
        self.held_since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_views(&self) -> ViewCache {
        std::mem::take(&mut *self.views.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn keep_views(&self, views: ViewCache) {
        *self.views.lock().unwrap_or_else(PoisonError::into_inner) = views;
    }

    /// Machines currently remembered as waiting.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.waits.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A machine with its Node, as observed in this pass.
struct Observed {
    machine: Arc<MachineInfo>,
    /// The node name from Talos, for a machine without `spec.hostname`.
    looked_up: Option<String>,
    node: Option<Arc<NodeInfo>>,
}

impl Observed {
    /// Its node name: `spec.hostname`, else what Talos answered; `None` if neither.
    fn node_name(&self) -> Option<&str> {
        self.machine.hostname.as_deref().filter(|h| !h.is_empty()).or(self.looked_up.as_deref())
    }
}

/// One pass of the operation `name`, with a memory of its own: it never sees another
/// holder's Lease unchanged for long, so it takes over only a Lease whose holder is gone
/// (use [`reconcile_with`] across passes for the rest).
///
/// # Errors
/// A [`ReconcileError`] when the operation, its cluster or its Lease could not be read or
/// written; nothing after the failed call was done.
pub async fn reconcile(ex: &Executor<'_>, name: &str) -> Result<ReconcileOutcome, ReconcileError> {
    reconcile_with(ex, name, &PassMemory::new()).await
}

/// One pass of the operation `name`, advancing only the machines `memory` does not show
/// unchanged and waiting (see [`PassMemory`]). Keep one memory per operation across passes.
///
/// # Errors
/// As [`reconcile`].
pub async fn reconcile_with(
    ex: &Executor<'_>,
    name: &str,
    memory: &PassMemory,
) -> Result<ReconcileOutcome, ReconcileError> {
    // A pass that did not end (this process's first, or one that failed midway) may have
    // asked for an evacuation it never recorded: the next one looks for such records.
    let recover =
        !std::mem::replace(&mut *memory.last_pass_ended.lock().unwrap_or_else(PoisonError::into_inner), false);
    let outcome = reconcile_pass(ex, name, memory, recover).await;
    if outcome.is_ok() {
        *memory.last_pass_ended.lock().unwrap_or_else(PoisonError::into_inner) = true;
    }
    outcome
}

/// What the storage backends record of evacuations the status and the conditions do not
/// show: added to the machine's conditions as the step would see them (see
/// [`with_recorded_evacuation`]), so that the machine counts as in progress and is carried
/// on or stopped, never left evacuated beside others. Asked only of machines with no record
/// and no evacuation open, after a pass that did not end.
async fn recover_evacuations(
    ex: &Executor<'_>,
    observed: &mut [Observed],
    status: &OperationStatus,
) -> Result<(), ReconcileError> {
    let asked: Vec<usize> = (0..observed.len())
        .filter(|&i| {
            let m = &observed[i].machine;
            !status.machines.contains_key(&m.name)
                && !m.conditions.is_true(STORAGE_EVACUATION)
                && !machine_past_upgrade_call(m)
                && observed[i].node_name().is_some()
        })
        .collect();
    let records = join_all(asked.iter().map(|&i| {
        let node = observed[i].node_name().unwrap_or_default().to_owned();
        async move {
            let reading =
                bounded("read the evacuation's record", ex.config.call_timeout, ex.storage.evacuation_record(&node));
            let recorded = reading
                .await
                .map_err(|source| AdvanceError::StorageTimedOut { node: node.clone(), source })?
                .map_err(|source| AdvanceError::Storage { node: node.clone(), source: source.into() })?;
            Ok::<_, AdvanceError>((node, recorded))
        }
    }))
    .await;
    for (i, record) in asked.into_iter().zip(records) {
        let (node, recorded) = record
            .map_err(|source| ReconcileError::EvacuationRecord { machine: observed[i].machine.name.clone(), source })?;
        if recorded.is_none() {
            continue;
        }
        let storage = StorageObservation { recorded, ..StorageObservation::default() };
        let machine = &observed[i].machine;
        if let Some(conditions) = with_recorded_evacuation(&machine.conditions, &storage, &node, ex.clock.now()) {
            observed[i].machine = Arc::new(MachineInfo { conditions, ..(**machine).clone() });
        }
    }
    Ok(())
}

/// One pass; `recover` after a pass that did not end (see [`recover_evacuations`]).
async fn reconcile_pass(
    ex: &Executor<'_>,
    name: &str,
    memory: &PassMemory,
    recover: bool,
) -> Result<ReconcileOutcome, ReconcileError> {
    if let Some(background) = ex.background {
        background.begin_pass();
    }
    let seen = match observe(ex, name, memory, recover).await? {
        Some(Seen::Observed(seen)) => *seen,
        Some(Seen::NoCluster(op)) => return refuse_for_missing_cluster(ex, name, &op).await,
        Some(Seen::Forbidden(op, what)) => return wait_forbidden(ex, name, &op, what).await,
        None => {
            return Ok(ReconcileOutcome {
                phase: Phase::Completed,
                requeue_at: None,
                finished: true,
                preflight_blocked: Vec::new(),
                preflight_cleared: Vec::new(),
            });
        }
    };
    let Observation { op, cluster, lease, holder, observed, status } = seen;
    let removal = op.spec.is_removal();
    let target = upgrade_target(&cluster);
    // A Kubernetes upgrade's target and stage, read from the machines' own records.
    let kubernetes_work: Option<(KubernetesVersion, KubernetesStage)> =
        op.spec.validate_kubernetes().ok().map(|spec| {
            // A started operation goes on with the target it started with: a spec whose
            // target changed is refused, and what is under way is seen to its verification
            // on the first target, never judged against the new one (issue 53 item 1).
            let target = status
                .started_target
                .as_deref()
                .and_then(|t| KubernetesVersion::parse(t.trim_start_matches('v')).ok())
                .unwrap_or(spec.target);
            let stage = kubernetes_stage(observed.iter().map(|o| (o.machine.role, &o.machine.conditions)), &target);
            (target, stage)
        });
    // An upgrade's converged machines are recorded in their own conditions, for this target.
    let converged_on_target =
        target.as_ref().ok().filter(|_| !removal && !op.spec.is_kubernetes()).map(|t| ConvergedOn::new(&t.version));
    let converged = |m: &MachineInfo| match &kubernetes_work {
        Some((target, stage)) => stage_converged(&m.conditions, target, *stage),
        None => converged_on_target.as_ref().is_some_and(|c| c.recorded(&m.conditions)),
    };
    let progress = |o: &Observed| match &kubernetes_work {
        Some((target, stage)) => status.kubernetes_progress_of(
            &o.machine.name,
            past_apply(&o.machine.conditions, target, *stage),
            stage_converged(&o.machine.conditions, target, *stage),
        ),
        None => status.progress_of(
            &o.machine.name,
            past_the_point_of_no_return(removal, &o.machine),
            o.machine.conditions.is_true(STORAGE_EVACUATION),
            converged(&o.machine),
        ),
    };
    let build = |o: &Observed| {
        let held = o.machine.annotations.contains_key(HOLD_ANNOTATION)
            || o.node.as_ref().is_some_and(|n| n.annotations.contains_key(HOLD_ANNOTATION));
        MachineView {
            name: o.machine.name.clone(),
            role: o.machine.role,
            order_label: o.machine.labels.get(ORDER_LABEL).cloned(),
            held,
            node_ready: o.node.as_ref().is_some_and(|n| n.ready),
            os_image: o.node.as_ref().map(|n| n.os_image.clone()),
            progress: progress(o),
            last: o.machine.labels.contains_key(ichor_upgrade_core::operation::CONTROLLER_NODE_MARK),
        }
    };
    let mut cache = memory.take_views();
    let key = (removal, converged_on_target.clone(), kubernetes_work.clone());
    cache.refresh(key, &observed, &status, build, progress);
    debug_assert_eq!(cache.views, observed.iter().map(build).collect::<Vec<_>>(), "a kept view is stale");
    let views = &cache.views;
    let view = OperationView {
        identity: op.identity.clone(),
        generation: op.generation,
        deleting: op.deleting,
        resume_token: op.annotations.get(RESUME_ANNOTATION).cloned(),
        spec: op.spec.clone(),
        status: status.clone(),
    };
    let now = ex.clock.now();
    // A Node of the cluster that no machine names (as far as this pass knows the machines'
    // node names: one it could not learn names none) is never left behind unsaid.
    let named: BTreeSet<&str> = observed.iter().filter_map(Observed::node_name).collect();
    let unaccounted: Vec<String> = cluster.nodes.iter().filter(|n| !named.contains(n.as_str())).cloned().collect();
    let kubernetes_input = match &kubernetes_work {
        Some((target, stage)) => {
            let snapshot_missing = op.spec.etcd_snapshot.unwrap_or_default() == SnapshotMode::Required
                && status.etcd_snapshot.as_ref().and_then(SnapshotState::taken).is_none();
            kubernetes_input(ex, &observed, &status, views, (target, *stage), snapshot_missing).await
        }
        None => None,
    };
    // A Kubernetes upgrade reads the control planes' components at every pass: each apply
    // is judged against them (no other control plane's component down, no kubelet newer
    // than the oldest API server). A Talos upgrade reads them with the etcd gate.
    let (components, api_servers) = match &kubernetes_work {
        Some(_) => gather_components(ex, &observed).await,
        None => (ComponentsVerdict::NotChecked, None),
    };
    let input = RolloutInput {
        kubernetes: kubernetes_input.as_ref(),
        operation: &view,
        release_talos_version: &cluster.release_talos_version,
        kubernetes_version: &cluster.kubernetes_version,
        lease: holder.as_ref(),
        machines: views,
        unaccounted_nodes: &unaccounted,
        etcd: &EtcdVerdict::NotChecked,
        components: &components,
        preflight: &PreflightVerdict::NotChecked,
        config: &ex.config.rollout,
        now,
    };
    // The nodes of the machines past their disruptive call (down, or about to be): every
    // machine is judged by the preflight as one more beside them (issue 29 item 10).
    let down: Vec<&str> = observed
        .iter()
        .filter(|o| past_the_point_of_no_return(removal, &o.machine) && !converged(&o.machine))
        .filter_map(Observed::node_name)
        .collect();
    let pass = Pass {
        ex,
        name,
        op: &op,
        observed: &observed,
        status: &status,
        removal,
        down,
        kubernetes: kubernetes_work.as_ref(),
        api_servers: api_servers.as_ref(),
    };
    let Gates { decision, etcd: verdict, checked, recorded_view } = match gather_gates(&pass, &view, input).await? {
        GatesEnd::Decided(gates) => *gates,
        GatesEnd::SnapshotRecorded(decision) => {
            // The gate and the Nodes were read before the snapshot, which can take
            // minutes: the first control plane is authorised by the next pass, which
            // reads them again, never by this one's old verdict.
            memory.keep_views(cache);
            // The phase this pass decided (a resume's), which the next pass writes.
            return Ok(ReconcileOutcome {
                phase: decision.phase.clone(),
                requeue_at: Some(ex.clock.now()),
                finished: false,
                preflight_blocked: blocked_lines(&decision),
                preflight_cleared: Vec::new(),
            });
        }
    };
    let input = RolloutInput { operation: recorded_view.as_ref().unwrap_or(&view), ..input };
    let snapshot: Option<SnapshotState> = recorded_view.as_ref().and_then(|v| v.status.etcd_snapshot.clone());
    let cleared: Vec<String> = checked
        .iter()
        .filter(|(_, blockers)| blockers.is_empty())
        .map(|(machine, _)| machine.clone())
        .chain(decision.start.iter().cloned())
        .collect();
    report_preflight(ex, name, memory, &decision).await;

    write_lock(ex, &op.cluster, &op.identity, lease.as_ref(), &decision, now).await?;
    if matches!(decision.lock, LockAction::Acquire { .. }) {
        let mut next = status.next(op.generation, &decision, &[]);
        if snapshot.is_some() {
            next.etcd_snapshot.clone_from(&snapshot);
        }
        if !removal {
            let count = views.iter().filter(|v| v.progress == MachineProgress::Converged).count();
            next.forget_converged(count, |name| {
                observed.iter().any(|o| o.machine.name == name && converged(&o.machine))
            });
        }
        let wrote = write_status(ex, name, &op.status, &next).await?;
        let requeue_at = Timestamp::min_opt(decision.recheck_at, wrote.then_some(now));
        memory.keep_views(cache);
        let (preflight_blocked, preflight_cleared) = (blocked_lines(&decision), cleared);
        return Ok(ReconcileOutcome {
            phase: next.phase,
            requeue_at,
            finished: false,
            preflight_blocked,
            preflight_cleared,
        });
    }

    // Only the machines the decision or the status names are looked up by name.
    let wanted: HashSet<&str, FixedState> =
        [&decision.retry, &decision.stop, &decision.start, &decision.advance, &decision.prepull]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .chain(status.machines.keys().map(String::as_str))
            .collect();
    let by_name: BTreeMap<&str, &Observed> = observed
        .iter()
        .filter(|o| wanted.contains(o.machine.name.as_str()))
        .map(|o| (o.machine.name.as_str(), o))
        .collect();
    let (outcomes, kept_recheck) =
        act(&pass, memory, &decision, &by_name, &input, (verdict, checked), &target, now).await?;

    let acted = Acted {
        decision: &decision,
        outcomes: &outcomes,
        views,
        by_name: &by_name,
        target: &target,
        snapshot,
        kept_recheck,
        cleared,
        now,
    };
    let outcome = record_pass(&pass, memory, acted, &converged).await?;
    memory.keep_views(cache);
    Ok(outcome)
}

/// What stage "observe" read, once for the pass.
struct Observation {
    /// The operation.
    op: crate::kube_api::OperationInfo,
    /// Its cluster.
    cluster: ClusterInfo,
    /// The cluster's Lease.
    lease: Option<LeaseInfo>,
    /// Who holds it, as stage lock judges it.
    holder: Option<LeaseHolder>,
    /// The cluster's machines (an upgrade's without those removed earlier), with their Nodes.
    observed: Vec<Observed>,
    /// The operation's status, for its generation.
    status: OperationStatus,
}

/// Stage "observe": the operation, its cluster, its machines with their Nodes and the
/// Lease (its holder judged by stage lock's [`lease_holder`], in the order of the reads),
/// read once for the pass; `None` when the operation is gone. `recover` after a pass that
/// did not end ([`recover_evacuations`]).
async fn observe(
    ex: &Executor<'_>,
    name: &str,
    memory: &PassMemory,
    recover: bool,
) -> Result<Option<Seen>, ReconcileError> {
    let read_op = |source| ReconcileError::ReadOperation { name: name.to_owned(), source };
    let Some(op) = kube_call(ex, "read operation", ex.kube.operation(name)).await.map_err(read_op)? else {
        return Ok(None);
    };
    let read_cluster = |source| ReconcileError::ReadCluster { cluster: op.cluster.clone(), source };
    let cluster = match kube_call(ex, "read cluster", ex.kube.cluster(&op.cluster)).await {
        Ok(cluster) => cluster,
        Err(KubeCallError::Api(KubeError::NotFound(_))) => return Ok(Some(Seen::NoCluster(Box::new(op)))),
        Err(e) => return Err(read_cluster(e)),
    };
    let machines = kube_call(ex, "list machines", ex.kube.machines(&op.cluster)).await.map_err(read_cluster)?;
    let lease = match kube_call(ex, "read Lease", ex.kube.lease(&op.cluster)).await {
        Ok(lease) => lease,
        // Without the lock's Lease nothing can be known of who acts on the cluster.
        Err(KubeCallError::Api(KubeError::Forbidden(what))) => return Ok(Some(Seen::Forbidden(Box::new(op), what))),
        Err(e) => return Err(read_cluster(e)),
    };
    let holder = lease_holder(ex, memory, &op, lease.as_ref()).await.map_err(read_cluster)?;
    let removal = op.spec.is_removal();
    // A machine removed earlier is no longer the cluster's: an upgrade does not wait for
    // it, and a removal counts it among no control planes (only its own machine is kept
    // once removed: its removal's end).
    let machines: Vec<Arc<MachineInfo>> = machines
        .into_iter()
        .filter(|m| (removal && op.spec.machine.as_deref() == Some(m.name.as_str())) || !is_removed(&m.conditions))
        .collect();
    let mut observed = observe_machines(ex, machines).await;
    let status = op.status.clone().for_generation(op.generation);
    if recover {
        recover_evacuations(ex, &mut observed, &status).await?;
    }
    Ok(Some(Seen::Observed(Box::new(Observation { op, cluster, lease, holder, observed, status }))))
}

/// What stage "observe" found of an operation that exists.
enum Seen {
    /// Its cluster, machines and Lease.
    Observed(Box<Observation>),
    /// Its cluster does not exist.
    NoCluster(Box<crate::kube_api::OperationInfo>),
    /// The cluster lock's Lease may not be read: the call and the API server's answer.
    Forbidden(Box<crate::kube_api::OperationInfo>, String),
}

/// How soon an operation waiting for a permission is looked at again: RBAC is not watched.
pub const FORBIDDEN_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// An operation whose cluster lock the operator may not read (its RBAC lacks the
/// operation's namespace): Waiting, saying what was refused (the Kubernetes adapter adds
/// what grants it), with a Warning Event when it becomes so; nothing else is read or done.
/// Looked at again after [`FORBIDDEN_RECHECK`].
async fn wait_forbidden(
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
async fn refuse_for_missing_cluster(
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

/// Stage "act": carries the decision out. The retries' records are closed, the stopped
/// machines stopped, and every machine the decision starts or advances is stepped under
/// the authority the decision gives it (its last wait passed over while it still stands),
/// then authorised and stepped again where a gate was due ([`authorise_due`]). The
/// outcomes, and the earliest recheck of the waits passed over.
#[allow(clippy::too_many_arguments)]
async fn act(
    pass: &Pass<'_>,
    memory: &PassMemory,
    decision: &Decision,
    by_name: &BTreeMap<&str, &Observed>,
    input: &RolloutInput<'_>,
    (mut verdict, mut checked): (Option<GateVerdict>, BTreeMap<String, Vec<Blocker>>),
    target: &Result<UpgradeTarget, String>,
    now: Timestamp,
) -> Result<(Vec<(String, MachineOutcome)>, Option<Timestamp>), ReconcileError> {
    let (ex, op, observed, removal, kubernetes) = (pass.ex, pass.op, pass.observed, pass.removal, pass.kubernetes);
    let api_servers = pass.api_servers;
    let mut outcomes: Vec<(String, MachineOutcome)> = Vec::new();
    for machine in decision.retry.iter().filter_map(|n| by_name.get(n.as_str())) {
        // A resume is carried out whole or not at all: a machine whose failed attempt
        // could not be closed must not be advanced with its old marker as if resumed.
        let reset = match kubernetes {
            Some((target, _)) => crate::kubernetes::reset_for_retry(ex, &machine.machine, target).await,
            None => reset_for_retry(ex, &machine.machine).await,
        };
        reset.map_err(|source| ReconcileError::RetryReset { machine: machine.machine.name.clone(), source })?;
    }
    for machine in decision.stop.iter().filter_map(|n| by_name.get(n.as_str())) {
        if let Err(e) = stop_machine(ex, machine).await {
            outcomes.push((machine.machine.name.clone(), e.outcome(ex.retry_at())));
        }
    }
    // A machine reset for a retry is stepped from the next observation, not from the
    // conditions read before the reset.
    let moving: Vec<&Observed> = decision
        .start
        .iter()
        .chain(&decision.advance)
        .filter(|n| !decision.retry.contains(n))
        .filter_map(|n| by_name.get(n.as_str()).copied())
        .collect();
    // A control plane removed earlier is no longer one (its node is wiped, its member gone):
    // a removal keeps it observed, never asks its etcd.
    let control_planes: Vec<ControlPlane> = observed
        .iter()
        .filter(|o| o.machine.role == MachineRole::ControlPlane && !is_removed(&o.machine.conditions))
        .filter_map(|o| {
            o.node_name().map(|node| ControlPlane { address: o.machine.address.clone(), node: node.to_owned() })
        })
        .collect();
    let control_planes = &control_planes;
    let advance = |o: &Observed, (authority, finish): (CallAuthority, CallAuthority)| {
        let target = &target;
        let operation = OperationRef { kind: &op.spec.kind, identity: &op.identity };
        let machine = Arc::clone(&o.machine);
        // Every side effect on the machine is made under the authority this pass's decision
        // gives it ([`crate::effects`]).
        let advancing = Advancing::of(&machine.name, decision);
        async move {
            let Some(advancing) = advancing else {
                let message = "the pass's decision does not advance it under a lock it holds".to_owned();
                let waiting = MachineOutcome::Waiting { reason: "NotAdvanced".into(), message, recheck_at: None };
                return (machine.name.clone(), waiting);
            };
            let outcome = match target {
                _ if removal => remove_machine(ex, &advancing, operation.identity, &machine, control_planes)
                    .await
                    .unwrap_or_else(|e| e.outcome(ex.retry_at())),
                _ if let Some((target, stage)) = kubernetes => {
                    let grants = Grants::of(advancing, &authority, &finish);
                    let work = KubernetesWork { target, stage: *stage, api_servers, operation: &op.identity };
                    advance_kubernetes(ex, &grants, &authority, &machine, work)
                        .await
                        .unwrap_or_else(|e| e.outcome(ex.retry_at()))
                }
                Ok(target) => advance_machine_with(ex, &advancing, operation, &machine, target, &authority, &finish)
                    .await
                    .unwrap_or_else(|e| e.outcome(ex.retry_at())),
                Err(error) => MachineOutcome::Failed { reason: "InvalidTarget".into(), message: error.clone() },
            };
            (machine.name.clone(), outcome)
        }
    };
    let denied = CallAuthority::Denied(CallDenied::NotInCluster);
    let authority_of =
        |o: &Observed| decision.authority.get(&o.machine.name).cloned().unwrap_or_else(|| denied.clone());
    let installing = |o: &Observed| ex.background.is_some_and(|b| b.installing(&o.machine.name));
    let authorities_of = |o: &Observed| {
        let finish = decision.finish_authority.get(&o.machine.name).cloned().unwrap_or_else(|| denied.clone());
        (authority_of(o), finish)
    };
    // Machines whose last wait still stands are passed over; their recheck times are kept.
    let mut kept_recheck: Option<Timestamp> = None;
    let storage_changed = memory.take_storage_changed();
    let evacuating = MachineWait::Evacuating { replicas_left: None }.reason();
    // Machines whose wait on their evacuation would stand but for a change of their storage.
    let mut storage_only: Vec<&Observed> = Vec::new();
    let mut moving: Vec<&Observed> = {
        let mut waits = memory.lock();
        let moving_names: std::collections::HashSet<&str> = moving.iter().map(|o| o.machine.name.as_str()).collect();
        waits.retain(|name, _| moving_names.contains(name.as_str()));
        moving
            .into_iter()
            .filter(|o| {
                // A removal is one machine whose waits (drain, reset, storage) are not
                // polled by its step: it is always looked at. So is a Kubernetes upgrade's
                // machine: what it waits on (its mirror pods, its kubelet's version) is in
                // neither its machine nor its Node as remembered.
                let remembered = waits.get(&o.machine.name).filter(|r| {
                    !removal
                        && kubernetes.is_none()
                        && !decision.start.contains(&o.machine.name)
                        && r.recheck_at.is_none_or(|t| t > now)
                        && r.machine == o.machine
                        && r.node == o.node
                        && r.authority == authorities_of(o)
                        && r.installing == installing(o)
                });
                let Some(r) = remembered else { return true };
                if o.node_name().is_some_and(|node| storage_changed.contains(node)) {
                    if r.reason != evacuating {
                        return true;
                    }
                    storage_only.push(o);
                }
                kept_recheck = Timestamp::min_opt(kept_recheck, r.recheck_at);
                false
            })
            .collect()
    };
    // Only its storage changed since the step said it waits on its evacuation: storage
    // alone says whether it still does (no Talos call for each replica that moves).
    let still = join_all(storage_only.iter().map(|o| still_evacuating(ex, o, now))).await;
    moving.extend(storage_only.into_iter().zip(still).filter(|(_, still)| !still).map(|(o, _)| o));
    let mut advanced = join_all(moving.iter().map(|o| advance(o, authorities_of(o)))).await;
    authorise_due(pass, input, decision, by_name, (&mut verdict, &mut checked), &mut advanced, &advance, now).await;
    {
        let mut waits = memory.lock();
        for (o, (_, outcome)) in moving.iter().zip(&advanced) {
            match outcome {
                MachineOutcome::Waiting { recheck_at, reason, .. } => {
                    let remembered = Remembered {
                        machine: Arc::clone(&o.machine),
                        node: o.node.clone(),
                        authority: authorities_of(o),
                        installing: installing(o),
                        recheck_at: *recheck_at,
                        reason: reason.clone(),
                    };
                    waits.insert(o.machine.name.clone(), remembered);
                }
                MachineOutcome::Progressed { .. } | MachineOutcome::Converged | MachineOutcome::Failed { .. } => {
                    waits.remove(&o.machine.name);
                }
            }
        }
    }
    outcomes.extend(advanced);
    // Installs that ended outside a pass since the last one: recorded as if this pass had
    // carried them out (a failure pauses), before this pass's own outcome of the machine.
    if let Some(background) = ex.background {
        let finished: Vec<(String, MachineOutcome)> = background.take_finished();
        outcomes.splice(0..0, finished);
    }

    Ok((outcomes, kept_recheck))
}

/// A Kubernetes upgrade keeps a record only of a machine it started or advances in this
/// pass, one that failed, or one it does not observe (waited on): its machines' progress
/// is read from their own conditions, and a record left by the other stage (a control
/// plane's, once its first stage converged in a pass whose status write was held back)
/// would stand for ever, an operation paused with it counting as one still under way.
fn forget_other_stage(next: &mut OperationStatus, decision: &Decision, views: &[MachineView]) {
    let seen: HashSet<&str, FixedState> = views.iter().map(|v| v.name.as_str()).collect();
    next.machines.retain(|name, record| {
        record.state == ichor_upgrade_core::status::RecordState::Failed
            || decision.start.contains(name)
            || decision.advance.contains(name)
            || !seen.contains(name.as_str())
    });
}

/// A Kubernetes upgrade's input to the engine: its stage and, before any machine of it has
/// started, what planning finds (each node's kubelet and static pods, the deprecated APIs
/// in use, kube-proxy); while an etcd snapshot is required and missing, the control planes
/// already on the target (their turn needs none). `None` when what planning needs could
/// not be read: the engine waits, never planning from a guess.
async fn kubernetes_input(
    ex: &Executor<'_>,
    observed: &[Observed],
    status: &OperationStatus,
    views: &[MachineView],
    (target, stage): (&KubernetesVersion, KubernetesStage),
    snapshot_missing: bool,
) -> Option<KubernetesInput> {
    let on_target = |nodes: &[NodeKubernetes]| -> BTreeSet<String> {
        nodes
            .iter()
            .filter(|n| snapshot_missing && n.role == MachineRole::ControlPlane && n.on_target(target))
            .map(|n| n.name.clone())
            .collect()
    };
    let started = !status.machines.is_empty() || views.iter().any(|v| v.progress != MachineProgress::Pending);
    if started {
        // The bootstrap manifests applied and rolling out: their workloads, read now.
        let rollouts = match status.manifests.as_ref().and_then(|m| m.rolling_out(target)) {
            Some(workloads) => read_rollouts(ex, workloads).await,
            None => None,
        };
        // The control planes' components, while a snapshot is still wanted: one already on
        // the target needs none (a control plane not read is taken to change).
        let mut control_planes = Vec::new();
        if snapshot_missing {
            for o in observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane) {
                if let Ok(Some(node)) = read_node_kubernetes(ex, o).await {
                    control_planes.push(node);
                }
            }
        }
        return Some(KubernetesInput { stage, problems: Vec::new(), rollouts, on_target: on_target(&control_planes) });
    }
    let bound = ex.config.call_timeout;
    let cluster = match bounded("read cluster Kubernetes", bound, ex.kube.cluster_kubernetes()).await {
        Ok(Ok(cluster)) => cluster,
        // The Kubernetes-upgrade grants are not bound: refused, naming them (decided again
        // each pass: binding them lifts it).
        Ok(Err(KubeError::Forbidden(what))) => {
            let problems = vec![KubernetesPlanProblem::GrantsMissing { what }];
            return Some(KubernetesInput { stage, problems, rollouts: None, on_target: BTreeSet::new() });
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "the cluster's Kubernetes could not be read: the upgrade waits");
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, "the cluster's Kubernetes could not be read: the upgrade waits");
            return None;
        }
    };
    let mut nodes = Vec::with_capacity(observed.len());
    let mut problems = Vec::new();
    for o in observed {
        match read_node_kubernetes(ex, o).await {
            Ok(Some(node)) => nodes.push(node),
            Ok(None) => problems.push(KubernetesPlanProblem::NotObserved {
                node: o.machine.name.clone(),
                component: Component::Kubelet,
            }),
            Err(()) => return None,
        }
    }
    // The manifests step needs the admin kubeconfig, which the Talos API gives os:admin
    // only (decision 0014 rule 19): a talosconfig whose certificate names other roles is
    // refused before anything changes. Credentials with no role named are left to the
    // Talos API to judge.
    if let Some(roles) = ex.talos.client_roles()
        && !roles.is_empty()
        && !roles.iter().any(|r| r == "os:admin")
    {
        problems.push(KubernetesPlanProblem::TalosconfigNotAdmin { roles });
    }
    let kube_proxy = cluster.kube_proxy.as_deref().and_then(|v| KubernetesVersion::parse(v).ok());
    let args = read_component_args(ex, observed, kube_proxy.is_some()).await?;
    let plan = plan_kubernetes(&KubernetesPlanInput {
        target,
        nodes: &nodes,
        deprecated_apis: &cluster.deprecated_apis,
        kube_proxy: kube_proxy.as_ref(),
        args: &args,
    });
    if let Err(found) = plan {
        problems.extend(found);
    }
    Some(KubernetesInput { stage, problems, rollouts: None, on_target: on_target(&nodes) })
}

/// The extra arguments every machine's configuration sets for the components it runs
/// (kube-proxy's only when Talos manages it), read at planning so that one the target
/// removes is refused before anything is touched (issue 53 item 11). `None`: a
/// configuration was not read (logged): nothing is planned without it.
async fn read_component_args(ex: &Executor<'_>, observed: &[Observed], kube_proxy: bool) -> Option<Vec<ComponentArgs>> {
    let mut all = Vec::new();
    // Sixteen reads at a time: a large cluster's planning waits on its slowest node, not
    // on the sum of them all, and no node is asked by hundreds of reads at once.
    for chunk in observed.chunks(16) {
        for sets in join_all(chunk.iter().map(|o| read_args_of(ex, o, kube_proxy))).await {
            all.extend(sets?);
        }
    }
    Some(all)
}

/// One machine's extra arguments, for the components it runs (see
/// [`read_component_args`]).
async fn read_args_of(ex: &Executor<'_>, o: &Observed, kube_proxy: bool) -> Option<Vec<ComponentArgs>> {
    let name = &o.machine.name;
    let bound = ex.config.call_timeout;
    let read = bounded("read machine config", bound, ex.talos.machine_config(&o.machine.address)).await;
    let config = match read {
        Ok(Ok(bytes)) => MachineConfig::parse(&bytes).map_err(|e| e.to_string()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(error) => Err(error.to_string()),
    };
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            tracing::warn!(machine = %name, %error, "its configuration could not be read: the upgrade waits");
            return None;
        }
    };
    let components: &[Component] = match o.machine.role {
        MachineRole::ControlPlane => &Component::ALL,
        MachineRole::Worker => &[Component::Kubelet],
    };
    let sets = components
        .iter()
        .filter(|c| kube_proxy || **c != Component::KubeProxy)
        .map(|c| ComponentArgs { node: name.clone(), component: *c, args: config.extra_args(*c) })
        .filter(|set| !set.args.is_empty())
        .collect();
    Some(sets)
}

/// A machine's Kubernetes as planning reads it: its Talos version (from its Node), its
/// kubelet's and static pods' versions. `Ok(None)`: not observed (no Node, or its Talos
/// unreadable); `Err`: the read failed (logged), so nothing can be planned from it now.
async fn read_node_kubernetes(ex: &Executor<'_>, o: &Observed) -> Result<Option<NodeKubernetes>, ()> {
    let name = o.machine.name.clone();
    let talos = o.node.as_ref().and_then(|n| TalosVersion::from_os_image(&n.os_image).ok());
    let seen = match o.node_name() {
        Some(node) => {
            match bounded("read Node's Kubernetes", ex.config.call_timeout, ex.kube.node_kubernetes(node)).await {
                Ok(Ok(seen)) => seen,
                Ok(Err(error)) => {
                    tracing::warn!(machine = %name, %error, "its Kubernetes could not be read: the upgrade waits");
                    return Err(());
                }
                Err(error) => {
                    tracing::warn!(machine = %name, %error, "its Kubernetes could not be read: the upgrade waits");
                    return Err(());
                }
            }
        }
        None => None,
    };
    let (Some(talos), Some(seen)) = (talos, seen) else { return Ok(None) };
    let control_plane =
        seen.static_pods.iter().filter_map(|(component, pod)| pod.version.clone().map(|v| (*component, v))).collect();
    Ok(Some(NodeKubernetes {
        name,
        role: o.machine.role,
        talos,
        kubelet: KubernetesVersion::parse(&seen.kubelet_version).ok(),
        control_plane,
    }))
}

/// The rollouts of the bootstrap manifests' `workloads` (`Kind namespace/name`); `None`
/// when one could not be read (the engine looks again, never guessing it done).
async fn read_rollouts(ex: &Executor<'_>, workloads: &[String]) -> Option<Vec<WorkloadRollout>> {
    let mut rollouts = Vec::with_capacity(workloads.len());
    for workload in workloads {
        match bounded("read a workload's rollout", ex.config.call_timeout, ex.kube.workload_rollout(workload)).await {
            Ok(Ok(rollout)) => rollouts.push(rollout),
            Ok(Err(error)) => {
                tracing::warn!(%workload, %error, "its rollout could not be read");
                return None;
            }
            Err(error) => {
                tracing::warn!(%workload, %error, "its rollout could not be read");
                return None;
            }
        }
    }
    Some(rollouts)
}

/// Stage "lock", its observation: who holds the cluster's Lease, as the rollout engine
/// judges it. Our own Lease carries the time we wrote; another holder's is judged by how
/// long this controller has seen it unchanged (never by the time another replica's clock
/// wrote in it), and whether its operation still exists is asked.
async fn lease_holder(
    ex: &Executor<'_>,
    memory: &PassMemory,
    op: &crate::kube_api::OperationInfo,
    lease: Option<&crate::kube_api::LeaseInfo>,
) -> Result<Option<LeaseHolder>, KubeCallError> {
    Ok(match lease.as_ref().and_then(|l| l.holder.clone().map(|h| (h, l))) {
        Some((identity, l)) => {
            let exists = identity == op.identity
                || kube_call(ex, "read Lease holder", ex.kube.operation_exists(&identity)).await?;
            // Our own Lease carries the time we wrote; another holder's is judged by how
            // long this controller has seen it unchanged.
            let renewed_at = if identity == op.identity {
                l.renewed_at
            } else {
                memory.lease_unchanged_since(&l.resource_version, ex.clock.now())
            };
            Some(LeaseHolder { identity, renewed_at, lease_duration: l.duration, holder_exists: exists })
        }
        None => None,
    })
}

/// What a pass observed, as its stages after the observation share it.
struct Pass<'p> {
    ex: &'p Executor<'p>,
    name: &'p str,
    op: &'p crate::kube_api::OperationInfo,
    observed: &'p [Observed],
    status: &'p OperationStatus,
    removal: bool,
    /// The nodes of the machines past their disruptive call and not converged.
    down: Vec<&'p str>,
    /// A Kubernetes upgrade's target and stage.
    kubernetes: Option<&'p (KubernetesVersion, KubernetesStage)>,
    /// For a Kubernetes upgrade, the oldest kube-apiserver its control planes run, as read
    /// in this pass.
    api_servers: Option<&'p KubernetesVersion>,
}

impl Pass<'_> {
    /// The preflight's verdict on each machine `asked`, beside the nodes down.
    async fn judge_preflight(&self, asked: &[&str]) -> BTreeMap<String, Vec<Blocker>> {
        judge_preflight(self.ex, self.observed, self.status, &self.op.identity, self.removal, asked, &self.down).await
    }
}

/// The decision of a pass with the gates it asked for gathered (stage "decide").
struct Gates {
    decision: Decision,
    /// The etcd gate's verdict and the control planes' components, if gathered in this pass.
    etcd: Option<GateVerdict>,
    /// The preflight's verdicts gathered in this pass, by machine.
    checked: BTreeMap<String, Vec<Blocker>>,
    /// The operation as this pass sees it once it took (or failed to take) the snapshot.
    recorded_view: Option<OperationView>,
}

/// How stage "decide" ended.
enum GatesEnd {
    Decided(Box<Gates>),
    /// The etcd snapshot was taken and recorded (or a Kubernetes upgrade's bootstrap
    /// manifests applied and recorded): the pass ends there, and the next one authorises
    /// the first control plane from gates read again (or completes).
    SnapshotRecorded(Box<Decision>),
}

/// What stage "act" leaves for stage "record".
struct Acted<'a> {
    decision: &'a Decision,
    /// What became of each machine in this pass (installs that ended outside it first).
    outcomes: &'a [(String, MachineOutcome)],
    views: &'a [MachineView],
    by_name: &'a BTreeMap<&'a str, &'a Observed>,
    target: &'a Result<UpgradeTarget, String>,
    snapshot: Option<SnapshotState>,
    /// The earliest recheck of the machines passed over (their waits stand).
    kept_recheck: Option<Timestamp>,
    /// The machines the preflight found clear, or started.
    cleared: Vec<String>,
    now: Timestamp,
}

/// Stage "record": the operation's next status from the decision and the outcomes,
/// written (or held back when only bookkeeping changed, for at most `status_hold`), its
/// Events, the pre-pulls offered, the finalizer removed when the decision says so, and
/// when to look again.
async fn record_pass(
    pass: &Pass<'_>,
    memory: &PassMemory,
    acted: Acted<'_>,
    converged: &(dyn Fn(&MachineInfo) -> bool + Sync),
) -> Result<ReconcileOutcome, ReconcileError> {
    let Pass { ex, name, op, status, removal, .. } = *pass;
    let Acted { decision, outcomes, views, by_name, target, snapshot, kept_recheck, cleared, now } = acted;
    let mut next = if removal {
        status.next_tracking_waits(op.generation, decision, outcomes)
    } else {
        status.next(op.generation, decision, outcomes)
    };
    // A Completed operation stays as it was written, records and counts included: it is
    // not judged again against a target that moved on since.
    let terminal = op.status.phase == Phase::Completed
        && decision.phase == Phase::Completed
        && op.status.observed_generation == Some(op.generation);
    if snapshot.is_some() {
        next.etcd_snapshot.clone_from(&snapshot);
    }
    if !removal && !terminal {
        // A machine converged before this pass is not advanced in it: the two add up.
        let converged_in_pass = |name: &str| outcomes.iter().any(|(n, o)| n == name && *o == MachineOutcome::Converged);
        let count = views.iter().filter(|v| v.progress == MachineProgress::Converged).count()
            + outcomes.iter().filter(|(_, o)| *o == MachineOutcome::Converged).count();
        next.forget_converged(count, |name| {
            converged_in_pass(name) || by_name.get(name).is_some_and(|o| converged(&o.machine))
        });
        if pass.kubernetes.is_some() {
            forget_other_stage(&mut next, decision, views);
        }
    }
    if let (Some(background), Ok(target)) = (ex.background, target)
        && ex.config.prepull.enabled
        && !removal
    {
        prepull(background, target, by_name, &decision.prepull);
    }
    // What happened in the pass (its calls, its warnings) is told whatever comes next; the
    // phase's change only once the status that records it is written: a pass whose
    // status write conflicts is decided again, and would tell it twice.
    emit_events(ex, name, decision, outcomes).await;
    // A change that may wait (convergences, the reasons of machines in progress) is held
    // back for at most `status_hold`, so that it rides with the next write that must be
    // made (usually the next machine's start): one status write per machine, not two.
    let held_until = if !removal && next != op.status && next.only_bookkeeping_since(&op.status) {
        let since = *memory.held().get_or_insert(now);
        let until = since.saturating_add(ex.config.status_hold);
        (now < until).then_some(until)
    } else {
        None
    };
    let wrote = match held_until {
        Some(_) => false,
        None => {
            let wrote = write_status(ex, name, &op.status, &next).await?;
            *memory.held() = None;
            wrote
        }
    };
    if held_until.is_none() {
        emit_phase_event(ex, name, &op.status.phase, &next.phase).await;
    }
    if decision.finalized {
        let write_op = |source| ReconcileError::WriteOperation { name: name.to_owned(), source };
        kube_call(ex, "remove finalizer", ex.kube.remove_finalizer(name)).await.map_err(write_op)?;
    }
    // A machine reset for a retry was not stepped: observe again at once.
    let retried = (!decision.retry.is_empty()).then_some(now);
    let requeue_at = outcomes
        .iter()
        .map(|(_, o)| outcome_recheck(o, now))
        .fold(Timestamp::min_opt(decision.recheck_at, retried), Timestamp::min_opt);
    // What the pass wrote is not watched (the status and conditions are the controller's
    // own): a pass that wrote its status looks again at once.
    let requeue_at = Timestamp::min_opt(Timestamp::min_opt(requeue_at, kept_recheck), wrote.then_some(now));
    let requeue_at = Timestamp::min_opt(requeue_at, held_until);
    let (preflight_blocked, preflight_cleared) = (blocked_lines(decision), cleared);
    Ok(ReconcileOutcome {
        phase: next.phase,
        requeue_at,
        finished: decision.finalized,
        preflight_blocked,
        preflight_cleared,
    })
}

/// Stage "decide": the rollout engine's decision, with the gates it asks for (the etcd
/// snapshot, the etcd gate, the preflight of the machines it would start) gathered and
/// decided again, up to [`GATE_ROUNDS`] rounds.
async fn gather_gates(
    pass: &Pass<'_>,
    view: &OperationView,
    input: RolloutInput<'_>,
) -> Result<GatesEnd, ReconcileError> {
    let Pass { ex, name, op, observed, .. } = *pass;
    let mut verdict = None;
    let mut decision = decide(&input);
    // The gates are gathered only for machines about to start, and decided again with
    // them: the etcd gate once, the preflight for each machine named (a blocked machine
    // lets the next one be named, up to a few rounds).
    let mut checked: BTreeMap<String, Vec<Blocker>> = BTreeMap::new();
    // The operation as this pass sees it once it took (or failed to take) the etcd snapshot.
    let mut recorded_view: Option<OperationView> = None;
    if decision.apply_manifests
        && let Some(spec) = op.spec.validate_kubernetes().ok()
    {
        // The Kubernetes upgrade's last step, alone in its pass: every machine is through.
        let mut control_planes: Vec<&Observed> =
            observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane).collect();
        // Ready ones first, then by name: the manifests of a control plane that answers.
        control_planes.sort_by_key(|o| (!o.node.as_ref().is_some_and(|n| n.ready), o.machine.name.clone()));
        let machines: Vec<&MachineInfo> = control_planes.iter().map(|o| o.machine.as_ref()).collect();
        let state = crate::kubernetes::apply_manifests(ex, &machines, &spec.target)
            .await
            .map_err(|source| ReconcileError::Manifests { source })?;
        // With the resume this pass acted upon: a failure recorded again is not resumed
        // again by the same token.
        let observed_resume = decision.acknowledge_resume.clone().or_else(|| op.status.observed_resume.clone());
        let recorded = OperationStatus { manifests: Some(state), observed_resume, ..op.status.clone() };
        write_status(ex, name, &op.status, &recorded).await?;
        return Ok(GatesEnd::SnapshotRecorded(Box::new(decision)));
    }
    for round in 1..=GATE_ROUNDS {
        let needs_etcd = decision.check_etcd && verdict.is_none();
        let needs_snapshot = decision.take_etcd_snapshot.is_some() && recorded_view.is_none();
        if !needs_etcd && decision.check_preflight.is_empty() && !needs_snapshot {
            break;
        }
        if needs_snapshot {
            let state = take_snapshot(ex, &op.cluster, view, observed, decision.take_etcd_snapshot.as_deref()).await;
            // Recorded before anything else in the pass: no control plane's call goes out on
            // a snapshot the status does not hold.
            let recorded = OperationStatus { etcd_snapshot: Some(state.clone()), ..op.status.clone() };
            write_status(ex, name, &op.status, &recorded).await?;
            if state.taken().is_some() {
                return Ok(GatesEnd::SnapshotRecorded(Box::new(decision)));
            }
            let mut with_it = view.clone();
            with_it.status.etcd_snapshot = Some(state);
            recorded_view = Some(with_it);
        }
        if needs_etcd {
            verdict = Some(gather_etcd_gate(ex, observed).await);
        }
        if !decision.check_preflight.is_empty() {
            // Read about the nodes asked in this round (each round asks about new ones).
            let asked: Vec<&str> = decision.check_preflight.iter().map(String::as_str).collect();
            checked.extend(pass.judge_preflight(&asked).await);
        }
        // No round follows the last: what it did not gather waits for the next recheck.
        let verdicts = if round == GATE_ROUNDS {
            PreflightVerdict::Last(checked.clone())
        } else {
            PreflightVerdict::Checked(checked.clone())
        };
        let (etcd, components) = match verdict.clone() {
            Some((etcd, components)) => (etcd, components),
            None => (EtcdVerdict::NotChecked, input.components.clone()),
        };
        let operation = recorded_view.as_ref().unwrap_or(view);
        decision =
            decide(&RolloutInput { operation, etcd: &etcd, components: &components, preflight: &verdicts, ..input });
    }
    Ok(GatesEnd::Decided(Box::new(Gates { decision, etcd: verdict, checked, recorded_view })))
}

/// Stage "authorise": the machines whose first call or finish is due and whose authority
/// waits on a gate not gathered in this pass (`advanced`, as stepped) get it now: the
/// preflight about them, beside the nodes down, and for a control plane the etcd gate
/// (once per pass, only when a call is due). Each is asked again for its authority and
/// stepped again with it: a call goes out only on gates passed in this same pass, and one
/// gate verdict authorises at most one disruptive control-plane step.
#[allow(clippy::too_many_arguments)]
async fn authorise_due<F, Fut>(
    pass: &Pass<'_>,
    input: &RolloutInput<'_>,
    decision: &Decision,
    by_name: &BTreeMap<&str, &Observed>,
    (verdict, checked): (&mut Option<GateVerdict>, &mut BTreeMap<String, Vec<Blocker>>),
    advanced: &mut [(String, MachineOutcome)],
    advance: F,
    now: Timestamp,
) where
    F: Fn(&Observed, (CallAuthority, CallAuthority)) -> Fut,
    Fut: Future<Output = (String, MachineOutcome)>,
{
    let ex = pass.ex;
    // A machine ready for its first call waits for the preflight, judged now about its
    // node beside those down already; a control plane, for the etcd gate too, gathered now
    // (once per pass, only when a call is due). Both are asked again for its authority:
    // the call goes out only on gates passed in this same pass.
    let gate_due = MachineWait::EtcdGateNotChecked.reason();
    let preflight_due = MachineWait::PreflightNotChecked.reason();
    let due = |outcome: &MachineOutcome, reason_due: &str| matches!(outcome, MachineOutcome::Waiting { reason, .. } if reason == reason_due);
    let needs_gate: Vec<usize> = advanced
        .iter()
        .enumerate()
        .filter(|(_, (_, outcome))| due(outcome, gate_due) || due(outcome, preflight_due))
        .map(|(i, _)| i)
        .collect();
    if !needs_gate.is_empty() {
        let asked: Vec<&str> =
            needs_gate.iter().map(|&i| advanced[i].0.as_str()).filter(|m| !checked.contains_key(*m)).collect();
        if !asked.is_empty() {
            checked.extend(pass.judge_preflight(&asked).await);
        }
        let control_plane = |i: &usize| {
            by_name.get(advanced[*i].0.as_str()).is_some_and(|o| o.machine.role == MachineRole::ControlPlane)
        };
        let (gathered, components) = match verdict.take() {
            Some(verdict) => verdict,
            None if needs_gate.iter().any(control_plane) => gather_etcd_gate(ex, pass.observed).await,
            None => (EtcdVerdict::NotChecked, input.components.clone()),
        };
        let judged = PreflightVerdict::Checked(checked.clone());
        let rollout_input = RolloutInput { etcd: &gathered, components: &components, preflight: &judged, ..*input };
        // Still not gathered cannot happen with a verdict; never call on it.
        let gathered_or_denied = |authority| match authority {
            CallAuthority::NeedsEtcdGate => CallAuthority::Denied(CallDenied::EtcdUnhealthy {
                reason: "the etcd gate could not be gathered".to_owned(),
            }),
            CallAuthority::NeedsPreflight => CallAuthority::Denied(CallDenied::PreflightBlocked {
                blockers: "the preflight could not be judged".to_owned(),
            }),
            authority => authority,
        };
        // One verdict authorises at most one disruptive control-plane step (the decision's
        // grants count): a machine past its call first.
        let mut spent: Option<String> = decision
            .authority
            .iter()
            .chain(&decision.finish_authority)
            .filter(|(_, a)| **a == CallAuthority::Granted)
            .map(|(name, _)| name)
            .find(|name| by_name.get(name.as_str()).is_some_and(|o| o.machine.role == MachineRole::ControlPlane))
            .cloned();
        let mut needs_gate = needs_gate;
        needs_gate.sort_by_key(|&i| {
            !by_name.get(advanced[i].0.as_str()).is_some_and(|o| machine_past_upgrade_call(&o.machine))
        });
        for i in needs_gate {
            let name = advanced[i].0.clone();
            let Some(o) = by_name.get(name.as_str()) else { continue };
            let mut authority = gathered_or_denied(call_authority(&rollout_input, &name));
            let mut finish = gathered_or_denied(finish_authority(&rollout_input, &name));
            let grants = authority == CallAuthority::Granted || finish == CallAuthority::Granted;
            if grants && o.machine.role == MachineRole::ControlPlane {
                match &spent {
                    Some(on) if *on != name => {
                        let denied = CallAuthority::Denied(CallDenied::GateSpent { on: on.clone() });
                        (authority, finish) = (denied.clone(), denied);
                    }
                    _ => spent = Some(name.clone()),
                }
            }
            let blocked = matches!(authority, CallAuthority::Denied(CallDenied::PreflightBlocked { .. }));
            advanced[i] = advance(o, (authority, finish)).await;
            // Blockers no watch reports (pods, budgets) are looked at again at the
            // preflight's own pace, not at every poll.
            if blocked && let MachineOutcome::Waiting { recheck_at, .. } = &mut advanced[i].1 {
                let at = now.saturating_add(ex.config.rollout.preflight_recheck);
                *recheck_at = Some(recheck_at.map_or(at, |r| r.max(at)));
            }
        }
    }
}

/// Hands the pre-pulls of the machines the decision names to `background` (those not pulled
/// ahead by this process yet; the background bounds how many run at once). A machine
/// whose image cannot be named (no schematic) is left to its own turn, which says why.
fn prepull(
    background: &dyn Background,
    target: &UpgradeTarget,
    by_name: &BTreeMap<&str, &Observed>,
    machines: &[String],
) {
    for machine in machines {
        if background.prepulled(machine) {
            continue;
        }
        let Some(o) = by_name.get(machine.as_str()) else { continue };
        let Some(node) = o.node.as_deref() else { continue };
        let Ok(image) = installer_image_for(target, &crate::calls::node_observation(node)) else { continue };
        let job = Job::Prepull { machine: machine.clone(), address: o.machine.address.clone(), image };
        if !background.submit(job) {
            // As many pre-pulls run as allowed: the next pass offers the rest.
            break;
        }
    }
}

/// Whether machine `o`, whose step last waited on its evacuation and whose objects have not
/// changed since, still has replicas to move, by its storage alone. Anything but a clear
/// yes (a read that failed, the evacuation done or past its timeout) says no: the machine is
/// then stepped in full.
async fn still_evacuating(ex: &Executor<'_>, o: &Observed, now: Timestamp) -> bool {
    let Some(node) = o.node_name() else { return false };
    let labels = o.node.as_ref().map(|n| n.labels.clone()).unwrap_or_default();
    let Ok(storage) =
        crate::calls::observe(ex, node, &labels, &o.machine.conditions, ichor_storage::EvacuationFor::Upgrade).await
    else {
        return false;
    };
    let machine = crate::calls::seen_with_storage(ex, &o.machine, &storage, Some(node));
    matches!(
        evacuation_state(&machine.conditions, &storage, ex.config.step.evacuation, now),
        EvacuationState::InProgress { replicas_left: Some(n), .. } if n > 0
    )
}

/// How many times a pass decides again with gates gathered: the etcd gate and the
/// preflight for the first machines named, the etcd snapshot once both passed for a
/// control plane, then the preflight for those named after a blocked one.
const GATE_ROUNDS: usize = 5;

/// The machines the preflight gate holds back, each with its blockers as one line.
fn blocked_lines(decision: &Decision) -> Vec<(String, String)> {
    decision.preflight_blocked.iter().map(|(machine, blockers)| (machine.clone(), describe(blockers))).collect()
}

/// The etcd snapshot the decision asks for, from the Ready control planes, the one about to
/// be upgraded (`next`) last.
async fn take_snapshot(
    ex: &Executor<'_>,
    cluster: &str,
    view: &OperationView,
    observed: &[Observed],
    next: Option<&str>,
) -> SnapshotState {
    let mut sources: Vec<etcd_snapshot::Source> = observed
        .iter()
        .filter(|o| o.machine.role == MachineRole::ControlPlane && o.node.as_ref().is_some_and(|n| n.ready))
        .filter_map(|o| {
            Some(etcd_snapshot::Source {
                machine: o.machine.name.clone(),
                address: o.machine.address.clone(),
                node: o.node_name()?.to_owned(),
            })
        })
        .collect();
    sources.sort_by_key(|s| Some(s.machine.as_str()) == next);
    etcd_snapshot::take(ex, cluster, &view.spec.target_version, &sources).await
}

fn by_name_in<'o>(observed: &'o [Observed], machine: &str) -> Option<&'o Observed> {
    observed.iter().find(|o| o.machine.name == machine)
}

/// The preflight's verdict on each machine `asked` (by name), its node judged beside the
/// nodes `down` (those of machines past their disruptive call): its blockers, or, when the
/// facts could not be read, the read's failure as every one's blocker.
async fn judge_preflight(
    ex: &Executor<'_>,
    observed: &[Observed],
    status: &OperationStatus,
    operation: &str,
    removal: bool,
    asked: &[&str],
    down: &[&str],
) -> BTreeMap<String, Vec<Blocker>> {
    let asked: Vec<(&str, &str)> =
        asked.iter().map(|m| (*m, by_name_in(observed, m).and_then(Observed::node_name).unwrap_or(m))).collect();
    // Every pod on the nodes down too: a workload is judged over the whole set.
    let mut nodes: Vec<&str> = asked.iter().map(|(_, node)| *node).chain(down.iter().copied()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    match gather_preflight(ex, observed, status, operation, removal, &nodes).await {
        Ok(facts) => {
            let config = PreflightConfig::default();
            let gate = Preflight::new(&facts, &config);
            asked.iter().map(|(machine, node)| ((*machine).to_owned(), gate.blockers_with(node, down))).collect()
        }
        Err(error) => asked
            .iter()
            .map(|(machine, _)| ((*machine).to_owned(), vec![Blocker::NotObserved { error: error.clone() }]))
            .collect(),
    }
}

/// What the preflight gate reads: the cluster's workloads from the API, and its Nodes as
/// this pass observed them, each marked when this operation (`operation`, its identity)
/// took it out (a machine it recorded, one past its Upgrade call, or one carrying its
/// cordon). A read that fails is said, with its cause: it
/// blocks every machine, since nothing can be said to be safe.
async fn gather_preflight(
    ex: &Executor<'_>,
    observed: &[Observed],
    status: &OperationStatus,
    operation: &str,
    removal: bool,
    asked: &[&str],
) -> Result<ClusterFacts, String> {
    let bound = ex.config.call_timeout;
    let mut facts = match bounded("read the cluster's workloads", bound, ex.kube.preflight_facts(asked)).await {
        Ok(Ok(facts)) => facts,
        Ok(Err(e)) => return Err(report(&e)),
        Err(e) => return Err(e.to_string()),
    };
    // Only a Node that is not Ready or is cordoned can block: the others are left out (a
    // pass over thousands of machines would copy every name for nothing).
    facts.nodes = observed
        .iter()
        .filter_map(|o| {
            let node = o.node.as_ref().filter(|n| !n.ready || n.unschedulable)?;
            let cordoned_by = node.annotations.get(CORDONED_ANNOTATION).and_then(|v| cordoned_for(v));
            Some(NodeFacts {
                name: node.name.clone(),
                ready: node.ready,
                unschedulable: node.unschedulable,
                by_operation: status.machines.contains_key(&o.machine.name)
                    || past_the_point_of_no_return(removal, &o.machine)
                    || cordoned_by.is_some_and(|by| by == operation),
                // Another operation's engine cordon (an aborted removal, a deleted upgrade)
                // is never lifted here: it blocks as a person's does, and says whose it is.
                cordoned_by: cordoned_by.filter(|by| *by != operation).map(str::to_owned),
            })
        })
        .collect();
    Ok(facts)
}

/// A Warning Event naming the machines the preflight holds back, once per change of them.
async fn report_preflight(ex: &Executor<'_>, operation: &str, memory: &PassMemory, decision: &Decision) {
    let blocked = &decision.preflight_blocked;
    {
        let mut last = memory.preflight_reported.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == *blocked {
            return;
        }
        last.clone_from(blocked);
    }
    if blocked.is_empty() {
        return;
    }
    let message = blocked
        .iter()
        .map(|(machine, blockers)| format!("{machine}: {}", describe(blockers)))
        .collect::<Vec<_>>()
        .join("; ");
    let event = Event {
        kind: "TalosOperation",
        name: operation.to_owned(),
        type_: EventType::Warning,
        reason: "PreflightBlocked".to_owned(),
        message: format!("not started while the preflight gate blocks them: {message}"),
    };
    if let Err(e) = bounded("record Event", ex.config.call_timeout, ex.kube.event(&event)).await {
        tracing::debug!(error = %e, "preflight Event not recorded");
    }
}

/// Whether a machine is past the point where it may be interrupted: for an upgrade, its
/// Upgrade call made (or possibly made); for a removal, its reset asked for.
fn past_the_point_of_no_return(removal: bool, machine: &MachineInfo) -> bool {
    if removal { past_reset(&machine.conditions) } else { machine_past_upgrade_call(machine) }
}

/// The target every machine is upgraded to: the release set's version (the engine has
/// already refused any other) and the cluster's image settings.
fn upgrade_target(cluster: &ClusterInfo) -> Result<UpgradeTarget, String> {
    let version = TalosVersion::parse(&cluster.release_talos_version).map_err(|e| e.to_string())?;
    Ok(UpgradeTarget {
        version,
        schematic: cluster.schematic.clone(),
        platform: cluster.platform.clone(),
        kubernetes_version: cluster.kubernetes_version.clone(),
    })
}

/// Reads each machine's Node, all in one read of the cache. A machine whose node name or
/// Node cannot be read counts as not Ready: the engine then neither starts it nor counts on
/// it.
async fn observe_machines(ex: &Executor<'_>, machines: Vec<Arc<MachineInfo>>) -> Vec<Observed> {
    // Only a machine without `spec.hostname` needs Talos for its node name.
    let unnamed: Vec<usize> =
        (0..machines.len()).filter(|&i| machines[i].hostname.as_deref().is_none_or(str::is_empty)).collect();
    let answers = join_all(unnamed.iter().map(|&i| {
        let address = &machines[i].address;
        async move {
            tokio::time::timeout(ex.config.call_timeout, ex.talos.nodename(address)).await.ok().and_then(Result::ok)
        }
    }))
    .await;
    let mut observed: Vec<Observed> =
        machines.into_iter().map(|machine| Observed { machine, looked_up: None, node: None }).collect();
    for (i, looked_up) in unnamed.into_iter().zip(answers) {
        observed[i].looked_up = looked_up;
    }
    let named: Vec<(usize, &str)> =
        observed.iter().enumerate().filter_map(|(i, o)| o.node_name().map(|n| (i, n))).collect();
    let names: Vec<&str> = named.iter().map(|(_, n)| *n).collect();
    let nodes = kube_call(ex, "read Nodes", ex.kube.nodes(&names)).await.unwrap_or_default();
    let indices: Vec<usize> = named.iter().map(|(i, _)| *i).collect();
    for (i, node) in indices.into_iter().zip(nodes) {
        observed[i].node = node;
    }
    observed
}

/// The control-plane gate: the etcd gate's verdict and the control planes' own
/// components, gathered together.
type GateVerdict = (EtcdVerdict, ComponentsVerdict);

/// Gathers the control-plane gate: the etcd gate from every control plane, and every
/// control plane's components ([`gather_components`]). A control plane whose node name is
/// unknown cannot be matched to its member: the gate fails, naming it, rather than guess.
async fn gather_etcd_gate(ex: &Executor<'_>, observed: &[Observed]) -> GateVerdict {
    let (components, _) = gather_components(ex, observed).await;
    let mut control_planes = Vec::new();
    for o in observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane) {
        let Some(node) = o.node_name().map(str::to_owned) else {
            let reason = format!("the node name of control plane {} is unknown", o.machine.name);
            return (EtcdVerdict::Unhealthy { reason }, components);
        };
        control_planes.push(ControlPlane { address: o.machine.address.clone(), node });
    }
    (etcd::gate(ex, &control_planes).await, components)
}

/// Every control plane's components (kube-apiserver, kube-controller-manager,
/// kube-scheduler) as their mirror pods show them, in one read: each control plane with
/// those not Ready (no mirror pod, not Ready, crash-looping), and the oldest version a
/// kube-apiserver runs (`None` when one is not known). A control plane whose node name is
/// unknown counts as none Ready: never a guess. Removed control planes are not counted.
async fn gather_components(ex: &Executor<'_>, observed: &[Observed]) -> (ComponentsVerdict, Option<KubernetesVersion>) {
    let pods =
        match bounded("read the control planes' static pods", ex.config.call_timeout, ex.kube.control_plane_pods())
            .await
        {
            Ok(Ok(pods)) => pods,
            Ok(Err(error)) => return (ComponentsVerdict::Unreadable { reason: error.to_string() }, None),
            Err(timed_out) => return (ComponentsVerdict::Unreadable { reason: timed_out.to_string() }, None),
        };
    let mut not_ready = BTreeMap::new();
    let mut oldest: Option<KubernetesVersion> = None;
    let mut all_known = true;
    let control_planes =
        observed.iter().filter(|o| o.machine.role == MachineRole::ControlPlane && !is_removed(&o.machine.conditions));
    for o in control_planes {
        let on_node = o.node_name().and_then(|node| pods.get(node));
        let mut down = Vec::new();
        for component in Component::CONTROL_PLANE {
            let pod = on_node.and_then(|p| p.get(&component));
            if !pod.is_some_and(|p| p.ready && !p.crash_looping) {
                down.push(component);
            }
            if component == Component::KubeApiserver {
                match pod.and_then(|p| p.version.clone()) {
                    Some(v) => oldest = Some(oldest.map_or(v.clone(), |o| o.min(v))),
                    None => all_known = false,
                }
            }
        }
        if !down.is_empty() {
            not_ready.insert(o.machine.name.clone(), down);
        }
    }
    (ComponentsVerdict::Checked(not_ready), oldest.filter(|_| all_known))
}

/// Writes the Lease as the decision says, under the observed resourceVersion.
async fn write_lock(
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

/// A machine interrupted before its Upgrade call: its evacuation, if open (in its
/// conditions, or only in the storage backend's record: decision 0011), is ended. Storage
/// knows the node by its name: when that is unknown this waits, never ending the
/// evacuation of a guessed name (which would leave the real node unschedulable), nor
/// guessing that the backend holds none.
async fn stop_machine(ex: &Executor<'_>, o: &Observed) -> Result<(), AdvanceError> {
    // Its install job, if one is under way, ends before its next side effect: first, so
    // that nothing this pass ends below is put back by it.
    // A job that committed to its intent first has made the machine past its call: the
    // stop leaves it alone (its evacuation stays until the upgrade ends it).
    if ex.background.is_some_and(|b| b.stop_install(&o.machine.name)) {
        return Ok(());
    }
    let Some(node) = o.node_name() else {
        return Err(AdvanceError::NodeNameUnknown { machine: o.machine.name.clone() });
    };
    if o.machine.conditions.is_true(STORAGE_EVACUATION) {
        return effects::end_evacuation(ex, &o.machine, node, EvacuationEnd::Ended).await;
    }
    let reading = ex.storage.evacuation_record(node);
    let recorded = bounded("read the evacuation's record", ex.config.call_timeout, reading)
        .await
        .map_err(|source| AdvanceError::StorageTimedOut { node: node.to_owned(), source })?
        .map_err(|source| AdvanceError::Storage { node: node.to_owned(), source: source.into() })?;
    let storage = StorageObservation { recorded, ..StorageObservation::default() };
    let Some(conditions) = with_recorded_evacuation(&o.machine.conditions, &storage, node, ex.clock.now()) else {
        return Ok(());
    };
    let machine = MachineInfo { conditions, ..(*o.machine).clone() };
    effects::end_evacuation(ex, &machine, node, EvacuationEnd::Ended).await
}

/// Writes the operation's status, unless it is what was read: a pass that changed nothing
/// writes nothing. Whether it wrote.
async fn write_status(
    ex: &Executor<'_>,
    name: &str,
    read: &ichor_upgrade_core::rollout::OperationStatus,
    status: &ichor_upgrade_core::rollout::OperationStatus,
) -> Result<bool, ReconcileError> {
    if read == status {
        return Ok(false);
    }
    kube_call(ex, "write operation status", ex.kube.write_operation_status(name, status))
        .await
        .map_err(|source| ReconcileError::WriteOperation { name: name.to_owned(), source })?;
    Ok(true)
}

/// The actions recorded as Events: the Upgrade call (on the lifecycle path, the Reboot
/// call: the moment the node goes down), a void intent closed (rare, and worth a look),
/// and storage that selects a node its backend does not have (a Normal Event, no pause).
const EVENT_ACTIONS: [&str; 4] =
    ["UpgradeRequested", "RebootRequested", "CloseVoidIntent", crate::calls::NO_STORAGE_NODE];

/// What an [`EVENT_ACTIONS`] Event says happened.
fn action_message(action: &str) -> &'static str {
    match action {
        "UpgradeRequested" => "the Upgrade call was made: the node installs the target and reboots into it",
        "RebootRequested" => "the Reboot call was made: the node goes down and comes back on the installed target",
        "CloseVoidIntent" => {
            "no sign on the node of the call recorded as intended, and its deadline has passed: the intent is \
             void and closed; the next pass decides again with every check"
        }
        _ => "the storage selects this node, but its backend has no such node: nothing to evacuate",
    }
}

/// Events are best effort: a failed Event never fails the pass.
async fn emit_events(ex: &Executor<'_>, operation: &str, decision: &Decision, outcomes: &[(String, MachineOutcome)]) {
    let mut events = Vec::new();
    for warning in &decision.warnings {
        events.push(Event {
            kind: "TalosOperation",
            name: operation.to_owned(),
            type_: EventType::Warning,
            reason: warning.reason().to_owned(),
            message: warning.to_string(),
        });
    }
    for (machine, outcome) in outcomes {
        let (type_, reason, message) = match outcome {
            MachineOutcome::Failed { reason, message } => (EventType::Warning, reason.clone(), message.clone()),
            // Evacuations begin and end in the machine's StorageEvacuation condition; an Event
            // is kept for the call and the outcome, at most two per machine.
            MachineOutcome::Progressed { action } if EVENT_ACTIONS.contains(action) => {
                (EventType::Normal, (*action).to_owned(), action_message(action).to_owned())
            }
            MachineOutcome::Progressed { .. } => continue,
            MachineOutcome::Converged => (EventType::Normal, "Converged".to_owned(), "on the target".to_owned()),
            MachineOutcome::Waiting { .. } => continue,
        };
        events.push(Event { kind: "TalosMachine", name: machine.clone(), type_, reason, message });
    }
    record(ex, events).await;
}

/// The operation's change of phase as an Event (a Warning for a pause, a refusal or
/// machines unobserved), once its status is written.
async fn emit_phase_event(ex: &Executor<'_>, operation: &str, before: &Phase, after: &Phase) {
    // A wait on the preflight gate is reported as a Warning naming the machines, once per
    // change of them (`report_preflight`), not again here.
    let preflight = matches!(after, Phase::Waiting(WaitReason::PreflightBlocked { .. }));
    if before.reason() == after.reason() || preflight {
        return;
    }
    let type_ = match after {
        Phase::Paused(_) | Phase::Refused(_) | Phase::Waiting(WaitReason::MachinesUnobserved { .. }) => {
            EventType::Warning
        }
        Phase::Pending | Phase::Progressing | Phase::Waiting(_) | Phase::Completed => EventType::Normal,
    };
    let message = after.message_for(operation);
    let event =
        Event { kind: "TalosOperation", name: operation.to_owned(), type_, reason: after.reason().to_owned(), message };
    record(ex, vec![event]).await;
}

async fn record(ex: &Executor<'_>, events: Vec<Event>) {
    for event in events {
        if let Err(e) = kube_call(ex, "record Event", ex.kube.event(&event)).await {
            tracing::warn!(reason = %event.reason, error = %e, "could not record an Event");
        }
    }
}
