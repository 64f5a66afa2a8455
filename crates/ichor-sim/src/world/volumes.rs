//! The storage-degraded fault's volumes (issue 56 item 1): Longhorn-like volumes of three
//! replicas on three workers each. A replica is down while its node is not Ready, and
//! rebuilds for minutes once it is back (the fault's point: a volume stays degraded long
//! after its node's reboot). A health gate reads them as `longhorn.io/v1beta2` `Volume`s
//! with `status.robustness` (`healthy`, `degraded`, `faulted`); the world keeps the fewest
//! healthy replicas any volume had at once.

use ichor_executor::kube_api::KubeError;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::gate::GateObjects;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use serde_json::json;

use super::{NodePhase, World, secs};
use crate::config::Fault;

/// The namespace the volumes are in.
pub const VOLUME_NAMESPACE: &str = "longhorn-system";
/// Replicas per volume.
pub const REPLICAS: usize = 3;

/// A volume: its name, and the nodes its replicas are on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimVolume {
    /// `pvc-N`.
    pub name: String,
    /// Its replicas' nodes (indices).
    pub replicas: Vec<usize>,
}

/// The volumes of the storage-degraded fault.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimVolumes {
    /// Every volume.
    pub volumes: Vec<SimVolume>,
    /// Until when the replicas on each node (by index) rebuild after it came back.
    pub rebuilding_until: Vec<Option<Timestamp>>,
    /// The fewest healthy replicas any volume had at once (`None`: no volumes).
    pub min_healthy: Option<usize>,
}

impl World {
    /// With the storage-degraded fault, a volume per worker, its replicas on that worker
    /// and the next two (by name), when there are three workers or more.
    pub(super) fn place_volumes(&mut self) {
        let mut workers: Vec<usize> = self.indices(MachineRole::Worker);
        workers.sort_by(|a, b| self.nodes[*a].name.cmp(&self.nodes[*b].name));
        if !self.config.has(Fault::StorageDegraded) || workers.len() < REPLICAS {
            return;
        }
        let volumes = (0..workers.len())
            .map(|k| SimVolume {
                name: format!("pvc-{}", k + 1),
                replicas: (0..REPLICAS).map(|r| workers[(k + r) % workers.len()]).collect(),
            })
            .collect();
        self.volumes = SimVolumes { volumes, rebuilding_until: vec![None; self.nodes.len()], min_healthy: None };
        self.measure_volumes();
    }

    /// Node `i` turned Ready: its replicas rebuild for 3 to 8 minutes.
    pub(super) fn volumes_node_back(&mut self, i: usize) {
        if self.volumes.volumes.iter().any(|v| v.replicas.contains(&i)) {
            let until = self.now.saturating_add(secs(self.rng.in_range(180..=480)));
            self.volumes.rebuilding_until[i] = Some(until);
        }
    }

    /// Whether the replica on node `i` serves now.
    fn replica_healthy(&self, i: usize) -> bool {
        let node = &self.nodes[i];
        node.ready
            && matches!(node.phase, NodePhase::Running)
            && self.volumes.rebuilding_until[i].is_none_or(|t| self.now >= t)
    }

    /// How many of `volume`'s replicas serve now.
    fn healthy(&self, volume: &SimVolume) -> usize {
        volume.replicas.iter().filter(|&&i| self.replica_healthy(i)).count()
    }

    /// Keeps the fewest healthy replicas any volume has had.
    pub(super) fn measure_volumes(&mut self) {
        let now = self.volumes.volumes.iter().map(|v| self.healthy(v)).min();
        self.volumes.min_healthy = match (self.volumes.min_healthy, now) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// The volumes `objects` names, as the API server would list them.
    ///
    /// # Errors
    /// A kind other than `longhorn.io/v1beta2` `Volume`: the simulated API server serves
    /// no other to a gate.
    pub(crate) fn volume_objects(&self, objects: &GateObjects) -> Result<Vec<(String, serde_json::Value)>, KubeError> {
        if objects.api_version != "longhorn.io/v1beta2" || objects.kind != "Volume" {
            return Err(KubeError::NotFound(format!(
                "the server could not find the requested resource {}",
                objects.kind_name()
            )));
        }
        if objects.namespace.as_deref().is_some_and(|n| n != VOLUME_NAMESPACE) {
            return Ok(Vec::new());
        }
        let mut found: Vec<(String, serde_json::Value)> = self
            .volumes
            .volumes
            .iter()
            .filter(|v| objects.name.as_deref().is_none_or(|n| n == v.name))
            .map(|v| {
                let healthy = self.healthy(v);
                let robustness = match healthy {
                    0 => "faulted",
                    n if n == v.replicas.len() => "healthy",
                    _ => "degraded",
                };
                let object = json!({
                    "apiVersion": "longhorn.io/v1beta2",
                    "kind": "Volume",
                    "metadata": { "name": v.name, "namespace": VOLUME_NAMESPACE },
                    "spec": { "numberOfReplicas": v.replicas.len() },
                    "status": { "state": "attached", "robustness": robustness },
                });
                (format!("Volume {VOLUME_NAMESPACE}/{}", v.name), object)
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }
}
