//! Stage "observe": the operation, its cluster, the Lease and every machine with its Node,
//! read once for the pass ([`Observation`]).

use std::sync::Arc;

use ichor_upgrade_core::evacuation::{STORAGE_EVACUATION, StorageObservation, with_recorded_evacuation};
use ichor_upgrade_core::machine::removal::{is_removed, past_reset};
use ichor_upgrade_core::machine::talos::UpgradeTarget;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::rollout::LeaseHolder;
use ichor_upgrade_core::status::OperationStatus;
use ichor_upgrade_core::versions::TalosVersion;

use super::memory::PassMemory;
use super::outcome::{ReconcileError, kube_call};
use crate::calls::{AdvanceError, Executor, KubeCallError, at_most_a_few, bounded};
use crate::kube_api::{ClusterInfo, KubeError, LeaseInfo, MachineInfo, NodeInfo};
use crate::machine::talos::machine_past_upgrade_call;

/// A machine with its Node, as observed in this pass.
pub(super) struct Observed {
    pub(super) machine: Arc<MachineInfo>,
    /// The node name from Talos, for a machine without `spec.hostname`.
    pub(super) looked_up: Option<String>,
    pub(super) node: Option<Arc<NodeInfo>>,
}

impl Observed {
    /// Its node name: `spec.hostname`, else what Talos answered; `None` if neither.
    pub(super) fn node_name(&self) -> Option<&str> {
        self.machine.hostname.as_deref().filter(|h| !h.is_empty()).or(self.looked_up.as_deref())
    }
}

/// What the storage backends record of evacuations the status and the conditions do not
/// show: added to the machine's conditions as the step would see them (see
/// [`with_recorded_evacuation`]), so that the machine counts as in progress and is carried
/// on or stopped, never left evacuated beside others. Asked only of machines with no record
/// and no evacuation open, after a pass that did not end.
pub(super) async fn recover_evacuations(
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
    let records = at_most_a_few(asked.iter().map(|&i| {
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

/// What stage "observe" read, once for the pass.
pub(super) struct Observation {
    /// The operation.
    pub(super) op: crate::kube_api::OperationInfo,
    /// Its cluster.
    pub(super) cluster: ClusterInfo,
    /// The cluster's Lease.
    pub(super) lease: Option<LeaseInfo>,
    /// Who holds it, as stage lock judges it.
    pub(super) holder: Option<LeaseHolder>,
    /// The cluster's machines (an upgrade's without those removed earlier), with their Nodes.
    pub(super) observed: Vec<Observed>,
    /// The operation's status, for its generation.
    pub(super) status: OperationStatus,
}

/// Stage "observe": the operation, its cluster, its machines with their Nodes and the
/// Lease (its holder judged by stage lock's [`lease_holder`], in the order of the reads),
/// read once for the pass. `recover` after a pass that
/// did not end ([`recover_evacuations`]).
pub(super) async fn observe(
    ex: &Executor<'_>,
    name: &str,
    memory: &PassMemory,
    recover: bool,
) -> Result<Seen, ReconcileError> {
    let read_op = |source| ReconcileError::ReadOperation { name: name.to_owned(), source };
    let Some(op) = kube_call(ex, "read operation", ex.kube.operation(name)).await.map_err(read_op)? else {
        return Ok(Seen::Gone);
    };
    let read_cluster = |source| ReconcileError::ReadCluster { cluster: op.cluster.clone(), source };
    let cluster = match kube_call(ex, "read cluster", ex.kube.cluster(&op.cluster)).await {
        Ok(cluster) => cluster,
        Err(KubeCallError::Api(KubeError::NotFound(_))) => return Ok(Seen::NoCluster(Box::new(op))),
        Err(e) => return Err(read_cluster(e)),
    };
    let machines = kube_call(ex, "list machines", ex.kube.machines(&op.cluster)).await.map_err(read_cluster)?;
    let lease = match kube_call(ex, "read Lease", ex.kube.lease(&op.cluster)).await {
        Ok(lease) => lease,
        // Without the lock's Lease nothing can be known of who acts on the cluster.
        Err(KubeCallError::Api(KubeError::Forbidden(what))) => return Ok(Seen::Forbidden(Box::new(op), what)),
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
    Ok(Seen::Observed(Box::new(Observation { op, cluster, lease, holder, observed, status })))
}

/// What stage "observe" found.
pub(super) enum Seen {
    /// The operation is gone.
    Gone,
    /// Its cluster, machines and Lease.
    Observed(Box<Observation>),
    /// Its cluster does not exist.
    NoCluster(Box<crate::kube_api::OperationInfo>),
    /// The cluster lock's Lease may not be read: the call and the API server's answer.
    Forbidden(Box<crate::kube_api::OperationInfo>, String),
}

/// Stage "lock", its observation: who holds the cluster's Lease, as the rollout engine
/// judges it. Our own Lease carries the time we wrote; another holder's is judged by how
/// long this controller has seen it unchanged (never by the time another replica's clock
/// wrote in it), and whether its operation still exists is asked.
pub(super) async fn lease_holder(
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

/// Whether a machine is past the point where it may be interrupted: for an upgrade, its
/// Upgrade call made (or possibly made); for a removal, its reset asked for.
pub(super) fn past_the_point_of_no_return(removal: bool, machine: &MachineInfo) -> bool {
    if removal { past_reset(&machine.conditions) } else { machine_past_upgrade_call(machine) }
}

/// The target every machine is upgraded to: the operation's, when it is valid (the release
/// set's version, or a hop toward it), else the release set's (the engine refuses the
/// operation before any machine starts); and the cluster's image settings.
pub(super) fn upgrade_target(cluster: &ClusterInfo, spec: &OperationSpec) -> Result<UpgradeTarget, String> {
    let version = match spec.validate_with(&cluster.release_talos_version, &cluster.releases) {
        Ok(valid) => valid.target,
        Err(_) => TalosVersion::parse(&cluster.release_talos_version).map_err(|e| e.to_string())?,
    };
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
pub(super) async fn observe_machines(ex: &Executor<'_>, machines: Vec<Arc<MachineInfo>>) -> Vec<Observed> {
    // Only a machine without `spec.hostname` needs Talos for its node name.
    let unnamed: Vec<usize> =
        (0..machines.len()).filter(|&i| machines[i].hostname.as_deref().is_none_or(str::is_empty)).collect();
    let answers = at_most_a_few(unnamed.iter().map(|&i| {
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

pub(super) fn by_name_in<'o>(observed: &'o [Observed], machine: &str) -> Option<&'o Observed> {
    observed.iter().find(|o| o.machine.name == machine)
}
