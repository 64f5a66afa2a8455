//! A simulated Talos cluster: one in-memory implementation of `TalosApi`, `KubeApi`,
//! `StorageApi` and `Clock`, on virtual time, driven by a seed, faithful enough that the
//! real drivers run on it unchanged.
//!
//! Nodes are `cp-1`, `cp-2`, ... and `worker-1`, ...; each machine is named after its node.
//! An acknowledged Upgrade call drains and installs for a drawn time, reboots (the Talos API
//! refuses connections, the Node is NotReady, a control plane's etcd member leaves the
//! list), comes back with a new boot ID on the target (or, under the A/B fallback fault, on
//! its old version), and turns Ready after a drawn time; its etcd member then rejoins.
//! Storage replicas move off a node one by one once asked. Time only moves when the runner
//! advances it, to the next change of the world or the controller's requested recheck.

mod apis;
pub mod config;
mod rng;
pub mod runner;
pub mod trace;
pub mod world;

use std::sync::{Mutex, MutexGuard, PoisonError};

use ichor_talos_executor::kube_api::{Metadata, OperationInfo};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::rollout::OperationStatus;

pub use config::{Durations, Fault, SimConfig};
pub use runner::{RunEnd, run_operation, run_removal};
pub use trace::{TraceEvent, TraceKind};
pub use world::{CLUSTER, SimOperation, World};

/// The simulated cluster. Cheap to share by reference; every call locks its world briefly.
#[derive(Debug)]
pub struct SimCluster {
    world: Mutex<World>,
}

impl SimCluster {
    /// A cluster as configured.
    #[must_use]
    pub fn new(config: SimConfig) -> Self {
        Self { world: Mutex::new(World::new(config)) }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads or changes the world directly (tests, the runner, the examples).
    pub fn with_world<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
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
            };
            w.operations.insert(name.to_owned(), SimOperation { info, finalized: false });
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
        self.lock().now
    }
}
