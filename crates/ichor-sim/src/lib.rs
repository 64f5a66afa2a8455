//! A simulated Talos cluster: one in-memory implementation of `TalosApi`, `KubeApi`,
//! `StorageApi` (with its reads, `StorageReads`) and `Clock`, on virtual time, driven by a
//! seed, faithful enough that the real drivers run on it unchanged. Their writes are
//! values under the executor's seal (decision 0016); [`SimCluster`] also has each as an
//! inherent method, without the seal, for the simulator's tests (and, the Talos writes,
//! for the apid stand-in).
//!
//! Nodes are `cp-1`, `cp-2`, ... and `worker-1`, ...; each machine is named after its node.
//! An acknowledged Upgrade call drains and installs for a drawn time, reboots (the Talos API
//! refuses connections, the Node is NotReady, a control plane's etcd member leaves the
//! list), comes back with a new boot ID on the target (or, under the A/B fallback fault, on
//! its old version), and turns Ready after a drawn time; its etcd member then rejoins.
//! Storage replicas move off a node one by one once asked. Time only moves when the runner
//! advances it, to the next change of the world or the controller's requested recheck.
//!
//! # What this crate must not do
//! Be linked by a production binary: it pauses and advances tokio's clock (`test-util`),
//! and its worlds are made up. It serves the examples, the property suites, the benches
//! and, with [`fleet`], the operator example's simulated fleet on a real API server;
//! `publish = false`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod apis;
pub mod config;
pub mod fleet;
pub mod kubernetes;
pub mod peers;
mod rng;
pub mod runner;
pub mod snapshot;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod trace;
pub mod world;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ichor_executor::ExecutorConfig;
use ichor_executor::kube_api::{Metadata, OperationInfo};
use ichor_executor::machine::talos::Executor;
use ichor_executor::snapshot::SnapshotStore;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::status::OperationStatus;

pub use config::{Durations, Fault, Naming, Realism, Registry, SimConfig, Wake};
pub use runner::{RunEnd, run_operation, run_removal};
pub use trace::{TraceEvent, TraceKind};
pub use world::{
    CLUSTER, InstallRun, SIM_ADMIN_KUBECONFIG, SimOperation, StopCall, StopDuringInstall, StopKind, World,
};

/// The simulated cluster. Cheap to share by reference; every call locks its world briefly.
pub struct SimCluster {
    world: Mutex<World>,
    /// Wakes the image pulls under way when one starts or ends: their shares change.
    pulls_changed: tokio::sync::Notify,
    /// Where the operations' etcd snapshots go (in memory unless given another).
    snapshots: Mutex<Arc<dyn SnapshotStore>>,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster").field("world", &self.world).finish_non_exhaustive()
    }
}

impl SimCluster {
    /// A cluster as configured.
    #[must_use]
    pub fn new(config: SimConfig) -> Self {
        Self {
            world: Mutex::new(World::new(config)),
            pulls_changed: tokio::sync::Notify::new(),
            snapshots: Mutex::new(Arc::new(snapshot::MemoryStore::default())),
        }
    }

    /// Sends the operations' etcd snapshots to `store` (a directory, for the main job).
    pub fn set_snapshot_store(&self, store: Arc<dyn SnapshotStore>) {
        *self.snapshots.lock().unwrap_or_else(PoisonError::into_inner) = store;
    }

    /// Where the operations' etcd snapshots go.
    #[must_use]
    pub fn snapshot_store(&self) -> Arc<dyn SnapshotStore> {
        Arc::clone(&self.snapshots.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// An executor over this cluster's APIs and clock, with `config`, no snapshot store
    /// and no background queue (the runner's passes add theirs).
    #[must_use]
    pub fn executor<'a>(&'a self, config: &'a ExecutorConfig) -> Executor<'a> {
        Executor { talos: self, kube: self, storage: self, clock: self, config, snapshots: None, background: None }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads or changes the world directly (tests, the examples). Any node may have been
    /// changed: the simulator reads every node's next change again.
    pub fn with_world<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        let mut w = self.lock();
        let result = f(&mut w);
        w.touched();
        result
    }

    /// Reads the world (a progress line, a summary), changing nothing.
    pub fn read_world<T>(&self, f: impl FnOnce(&World) -> T) -> T {
        f(&self.lock())
    }

    /// Runs `f`, which changes no node by hand (time may move, through the world's own
    /// course; counters and deliveries may change): the runner's bookkeeping.
    pub(crate) fn with_world_untouched<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut self.lock())
    }

    /// Creates a `TalosOperation` named `name` with this spec, on the simulated cluster.
    pub fn create_operation(&self, name: &str, spec: OperationSpec) {
        self.with_world(|w| {
            let uid = w.operations.len() + 1;
            let info = OperationInfo {
                name: name.to_owned(),
                identity: format!("default/{name}/uid-{uid}"),
                cluster: CLUSTER.to_owned(),
                generation: 1,
                deleting: false,
                annotations: Metadata::new(),
                spec,
                status: OperationStatus::default(),
                maintenance: None,
                gates: None,
            };
            w.operations.insert(name.to_owned(), SimOperation { info, finalized: false, version: 0, seen: 0 });
        });
    }

    /// Sets an annotation on an operation (the resume annotation, for one).
    pub fn annotate_operation(&self, name: &str, key: &str, value: &str) {
        self.with_world(|w| {
            if let Some(op) = w.operations.get_mut(name) {
                op.info.annotations.insert(key.to_owned(), value.to_owned());
            }
        });
    }

    /// Virtual now.
    #[must_use]
    pub fn now(&self) -> Timestamp {
        let mut w = self.lock();
        w.sync_clock();
        w.now
    }
}

/// The runtime a simulation runs on: one thread, Tokio's clock paused, so that the time
/// calls and timeouts take is virtual (it moves when every task waits) and a run is
/// deterministic for its seed.
///
/// # Panics
/// If the runtime cannot be built (the operating system refuses a thread).
#[must_use]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// What a run came to, in the numbers `cargo run --example rollout -- --json` prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Nodes on the target version.
    pub on_target: usize,
    /// Acknowledged Upgrade calls.
    pub upgrade_calls: u64,
    /// Lifecycle installs carried out to their end.
    pub install_calls: u64,
    /// Reboot calls carried out.
    pub reboot_calls: u64,
    /// Pods evicted (counted in `kube_writes` too).
    pub evictions: u64,
    /// Most control planes down at once.
    pub max_control_planes_down: usize,
    /// Most workers down at once because of upgrades.
    pub max_workers_down: usize,
    /// Virtual seconds from the start to now.
    pub makespan_s: f64,
    /// The physical bound from the drawn durations: control planes in series, workers
    /// `max_unavailable` at a time (the longer of the longest worker and the workers'
    /// total over `max_unavailable`), each machine's time being its evacuation plus its
    /// upgrade and reboot until Ready.
    pub lower_bound_s: f64,
    /// What an ideal scheduler would take on the same durations and in the same order
    /// (control planes in series; each worker started the instant a slot frees): the
    /// measure of the engine's own overhead.
    pub ideal_s: f64,
    /// Writes to the Kubernetes API: the operation's status, machines' conditions, the
    /// storage backend's objects, Nodes and evictions; not Events nor the Lease.
    pub kube_writes: u64,
    /// Of which, writes of the operation's status.
    pub status_writes: u64,
    /// Of which, writes of machines' conditions.
    pub condition_writes: u64,
    /// Of which, writes to the storage backend.
    pub storage_writes: u64,
    /// Of which, writes of Nodes (the engine's cordon and uncordon).
    pub node_writes: u64,
    /// Events recorded.
    pub events: u64,
    /// Writes of the cluster's Lease (acquire, renewals, release).
    pub lease_writes: u64,
    /// Reads of the Kubernetes API, from the watch cache or not.
    pub kube_reads: u64,
    /// The largest operation status written, in bytes of JSON.
    pub status_bytes_max: usize,
    /// Calls to the Talos API.
    pub talos_calls: u64,
    /// Of which, by the `TalosApi` method called (a lifecycle install's stream counts
    /// twice: its start and its end, as `lifecycle_upgrade_end`).
    pub talos_calls_by_method: std::collections::BTreeMap<&'static str, u64>,
    /// Reconcile passes.
    pub passes: u64,
    /// Machine-seconds spent held back by the preflight gate.
    pub preflight_waits_s: f64,
}

impl SimCluster {
    /// The run's numbers so far, for a rollout at `max_unavailable`.
    #[must_use]
    pub fn report(&self, max_unavailable: usize) -> Report {
        self.with_world(|w| {
            let time =
                |role| w.nodes.iter().filter(move |n| n.role == role).map(|n| n.drawn.machine_time().as_secs_f64());
            let control_planes: f64 = time(ichor_upgrade_core::machine::vocabulary::MachineRole::ControlPlane).sum();
            let workers: Vec<f64> = time(ichor_upgrade_core::machine::vocabulary::MachineRole::Worker).collect();
            let longest = workers.iter().copied().fold(0.0, f64::max);
            let total: f64 = workers.iter().sum();
            #[allow(clippy::cast_precision_loss)]
            let spread = total / max_unavailable.max(1) as f64;
            // The engine's order: by name within a role (no order labels in the simulation).
            let mut ordered: Vec<&world::SimNode> = w
                .nodes
                .iter()
                .filter(|n| n.role == ichor_upgrade_core::machine::vocabulary::MachineRole::Worker)
                .collect();
            ordered.sort_by(|a, b| a.name.cmp(&b.name));
            let mut slots = vec![0.0_f64; max_unavailable.max(1)];
            for node in ordered {
                let (k, free_at) =
                    slots.iter().copied().enumerate().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, 0.0));
                slots[k] = free_at + node.drawn.machine_time().as_secs_f64();
            }
            let ideal_workers = slots.iter().copied().fold(0.0, f64::max);
            Report {
                ideal_s: control_planes + ideal_workers,
                nodes: w.nodes.len(),
                on_target: w.nodes.iter().filter(|n| n.version == w.config.to).count(),
                upgrade_calls: w.counters.upgrade_calls,
                install_calls: w.counters.install_calls,
                reboot_calls: w.counters.reboot_calls,
                evictions: w.counters.evictions,
                max_control_planes_down: w.counters.max_control_planes_down,
                max_workers_down: w.counters.max_workers_down,
                makespan_s: w.now.saturating_since(w.start).as_secs_f64(),
                lower_bound_s: control_planes + longest.max(spread),
                kube_writes: w.counters.kube_writes,
                status_writes: w.counters.status_writes,
                condition_writes: w.counters.condition_writes,
                storage_writes: w.counters.storage_writes,
                node_writes: w.counters.node_writes,
                events: w.counters.events,
                lease_writes: w.counters.lease_writes,
                kube_reads: w.counters.kube_reads,
                status_bytes_max: w.counters.status_bytes_max,
                talos_calls: w.counters.talos_calls,
                talos_calls_by_method: w.counters.talos_calls_by_method.clone(),
                passes: w.counters.passes,
                preflight_waits_s: w.counters.preflight_wait_ms as f64 / 1000.0,
            }
        })
    }
}
