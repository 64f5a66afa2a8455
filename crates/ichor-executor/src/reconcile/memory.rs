//! What a controller remembers between passes of one operation ([`PassMemory`]): a cache,
//! never a source of truth.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::kubernetes::KubernetesStage;
use ichor_upgrade_core::machine::talos::ConvergedOn;
use ichor_upgrade_core::preflight::Blocker;
use ichor_upgrade_core::rollout::{CallAuthority, MachineView};
use ichor_upgrade_core::status::{MachineProgress, OperationStatus};
use ichor_upgrade_core::versions::KubernetesVersion;

use super::observe::Observed;
use crate::kube_api::{MachineInfo, NodeInfo};

/// What a controller remembers between passes of one operation, so that a pass advances
/// only the machines whose observation changed or whose recheck time is due, not all of
/// them. It is a cache, never a source of truth: a controller that lost it (a restart)
/// passes over every machine once, and nothing is decided from it but whether to look.
///
/// A machine is passed over only when its last step was a wait, and since then its
/// `TalosMachine`, its Node and its call authority are unchanged and its recheck time has
/// not come. The step is a function of those, of the time (its deadlines are its recheck
/// times), and of what no watch reports (Talos, etcd, storage), which every such wait
/// polls at [`StepTimeouts::poll`](ichor_upgrade_core::machine::vocabulary::StepTimeouts::poll).
///
/// It also keeps the last pass's machine views: a machine whose shared `TalosMachine` and
/// Node are the very objects of the last pass (the same `Arc`s, as a cache hands out while
/// they are unchanged) and that has no record in the status keeps its view.
#[derive(Debug, Default)]
pub struct PassMemory {
    pub(super) waits: Mutex<HashMap<String, Remembered>>,
    pub(super) views: Mutex<ViewCache>,
    /// Since when a status change that may wait (see
    /// [`OperationStatus::only_bookkeeping_since`]) has been held back.
    pub(super) held_since: Mutex<Option<Timestamp>>,
    /// Nodes whose storage changed since the last pass (see [`PassMemory::storage_changed`]).
    pub(super) storage_changed: Mutex<HashSet<String>>,
    /// The machines the preflight held back, as last reported in an Event.
    pub(super) preflight_reported: Mutex<Vec<(String, Vec<Blocker>)>>,
    /// When the last pass started, and whether it asked to look again at once (see
    /// [`PassMemory::defer_pass`]).
    pub(super) last_pass: Mutex<Option<(Timestamp, bool)>>,
    /// The cluster Lease's resourceVersion as last read, and since when (on this
    /// controller's clock) it has been read unchanged.
    pub(super) lease_seen: Mutex<Option<(String, Timestamp)>>,
    /// Whether this process's last pass ended (not killed, not failed midway).
    pub(super) last_pass_ended: Mutex<bool>,
}

/// The machine views of the last pass, with what each was built from.
#[derive(Debug, Default)]
pub(super) struct ViewCache {
    /// Whether the views are of a removal, and the version convergence is judged on.
    pub(super) key: Option<ViewKey>,
    pub(super) views: Vec<MachineView>,
    pub(super) sources: Vec<(Arc<MachineInfo>, Option<Arc<NodeInfo>>)>,
    /// Each machine's index, by name.
    pub(super) index: HashMap<String, usize>,
    /// The machines with a record in the status the views were built from.
    pub(super) recorded: Vec<String>,
}

impl ViewCache {
    /// Brings the views up to date with `observed` and `status`: a view is built again
    /// when its machine or Node object changed, and its progress read again when the
    /// machine has or had a record in the status.
    pub(super) fn refresh(
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
pub(super) type ViewKey = (bool, Option<ConvergedOn>, Option<(KubernetesVersion, KubernetesStage)>);

/// A machine's last wait, with what it was decided from.
#[derive(Debug, Clone)]
pub(super) struct Remembered {
    pub(super) machine: Arc<MachineInfo>,
    pub(super) node: Option<Arc<NodeInfo>>,
    pub(super) authority: (CallAuthority, CallAuthority),
    /// Whether an install of this controller ran for it (a job's end changes the step).
    pub(super) installing: bool,
    pub(super) recheck_at: Option<Timestamp>,
    /// The wait's reason.
    pub(super) reason: String,
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
    pub(super) fn lease_unchanged_since(&self, version: &str, now: Timestamp) -> Timestamp {
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

    pub(super) fn next_pass_from(last: Option<(Timestamp, bool)>, interval: std::time::Duration) -> Option<Timestamp> {
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

    pub(super) fn take_storage_changed(&self) -> HashSet<String> {
        std::mem::take(&mut *self.storage_changed.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, Option<Timestamp>> {
        self.held_since.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this process's last pass ended (not killed, not failed midway); the next
    /// pass counts as not ended until it says so ([`Self::set_pass_ended`]).
    pub(super) fn take_pass_ended(&self) -> bool {
        std::mem::replace(&mut *self.last_pass_ended.lock().unwrap_or_else(PoisonError::into_inner), false)
    }

    /// Says that the pass ended.
    pub(super) fn set_pass_ended(&self) {
        *self.last_pass_ended.lock().unwrap_or_else(PoisonError::into_inner) = true;
    }

    pub(super) fn take_views(&self) -> ViewCache {
        std::mem::take(&mut *self.views.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn keep_views(&self, views: ViewCache) {
        *self.views.lock().unwrap_or_else(PoisonError::into_inner) = views;
    }

    /// Machines currently remembered as waiting.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.lock().len()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.waits.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
