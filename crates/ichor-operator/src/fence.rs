//! Leadership fencing of every side effect (issue 29 item 12).
//!
//! A pass can last minutes (a legacy Upgrade call up to ten, an etcd snapshot up to
//! thirty) and an install job longer; leadership was checked only when a pass began. The
//! wrappers here sit in front of the Talos, Kubernetes and storage APIs a pass or a job is
//! given, and let a call that changes anything through only while this replica leads, as
//! the election judges it: on the local monotonic clock, the Lease's renewal deadline
//! ahead ([`crate::leader::leads`]). A call refused here was never sent: it fails as a call
//! that could not reach its server does (transient), so the engine records nothing from
//! it, and the replica that leads next resumes from the records.
//!
//! Reads go through unchecked: they change nothing, and a pass that lost leadership stops
//! at its next write. What it must not do is act on what it read after another replica may
//! have started to.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use ichor_executor::kube_api::{
    AdminKubeconfig, ClusterInfo, ClusterKubernetesInfo, Event, Eviction, KubeApi, KubeError, LeaseInfo, LeaseWrite,
    MachineInfo, ManifestSession, NodeInfo, NodeKubernetesInfo, OperationInfo, PodInfo,
};
use ichor_executor::talos_api::{
    ApplyConfigReply, ApplyConfigRequest, EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, InstallOutcome, InstallRequest,
    PullRequest, ResetRequest, SnapshotStream, TalosApi, TalosError, UpgradeAck, UpgradeRequest,
};
use ichor_storage::{ConditionStore, ConditionWriteError, EvacuationRequest, StorageApi, StorageError, StorageObject};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::preflight::ClusterFacts;
use ichor_upgrade_core::status::OperationStatus;
use tokio::sync::watch;

use crate::leader::leads;

/// Why a fenced call was not sent.
const NOT_LEADING: &str = "not sent: this replica no longer leads";

/// Until when this replica leads, as the election last renewed it.
#[derive(Clone)]
pub struct Fence {
    leading: watch::Receiver<Option<Instant>>,
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence").field("leads", &self.leads()).finish()
    }
}

impl Fence {
    /// A fence on the deadlines `leading` carries ([`crate::leader::Leadership::subscribe`]).
    #[must_use]
    pub fn new(leading: watch::Receiver<Option<Instant>>) -> Self {
        Self { leading }
    }

    /// Whether this replica leads now.
    #[must_use]
    pub fn leads(&self) -> bool {
        leads(*self.leading.borrow())
    }

    fn talos(&self, node: &str) -> Result<(), TalosError> {
        if self.leads() { Ok(()) } else { Err(TalosError::dial(node, NOT_LEADING)) }
    }

    fn kube(&self) -> Result<(), KubeError> {
        if self.leads() { Ok(()) } else { Err(KubeError::Unreachable(NOT_LEADING.to_owned())) }
    }

    fn storage(&self) -> Result<(), StorageError> {
        if self.leads() { Ok(()) } else { Err(StorageError::transient(NOT_LEADING)) }
    }

    fn conditions(&self, machine: &str) -> Result<(), ConditionWriteError> {
        if self.leads() {
            Ok(())
        } else {
            Err(ConditionWriteError { machine: machine.to_owned(), message: NOT_LEADING.to_owned(), transient: true })
        }
    }
}

/// The Talos API, its calls that change a node sent only while this replica leads.
pub struct FencedTalos<'a> {
    /// The API called.
    pub inner: &'a dyn TalosApi,
    /// The leadership every change is checked against.
    pub fence: &'a Fence,
}

#[async_trait]
impl TalosApi for FencedTalos<'_> {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        self.inner.nodename(node).await
    }
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        self.inner.machine_stage(node).await
    }
    async fn upgrade(&self, node: &str, request: &UpgradeRequest) -> Result<UpgradeAck, TalosError> {
        self.fence.talos(node)?;
        self.inner.upgrade(node, request).await
    }
    async fn machine_config(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.inner.machine_config(node).await
    }
    async fn bootstrap_manifests(&self, node: &str) -> Result<Vec<serde_json::Value>, TalosError> {
        self.inner.bootstrap_manifests(node).await
    }
    // Admin credentials are for the leader's manifests step alone: fenced like a write.
    fn client_roles(&self) -> Option<Vec<String>> {
        self.inner.client_roles()
    }
    async fn admin_kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        self.fence.talos(node)?;
        self.inner.admin_kubeconfig(node).await
    }
    async fn apply_configuration(
        &self,
        node: &str,
        request: &ApplyConfigRequest,
    ) -> Result<ApplyConfigReply, TalosError> {
        // A dry run stores nothing; an apply changes the node.
        if !request.dry_run {
            self.fence.talos(node)?;
        }
        self.inner.apply_configuration(node, request).await
    }
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        self.inner.etcd_members(node).await
    }
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        self.inner.etcd_status(node).await
    }
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        self.inner.etcd_alarms(node).await
    }
    async fn etcd_leave_cluster(&self, node: &str) -> Result<(), TalosError> {
        self.fence.talos(node)?;
        self.inner.etcd_leave_cluster(node).await
    }
    async fn etcd_remove_member(&self, node: &str, member_id: u64) -> Result<(), TalosError> {
        self.fence.talos(node)?;
        self.inner.etcd_remove_member(node, member_id).await
    }
    async fn reset(&self, node: &str, request: &ResetRequest) -> Result<(), TalosError> {
        self.fence.talos(node)?;
        self.inner.reset(node, request).await
    }
    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        self.inner.etcd_snapshot(node).await
    }
    async fn image_pull(&self, node: &str, request: &PullRequest) -> Result<String, TalosError> {
        // A pull changes no machine's state, but it is load an operation asked for.
        self.fence.talos(node)?;
        self.inner.image_pull(node, request).await
    }
    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        self.inner.image_list(node).await
    }
    async fn lifecycle_upgrade(&self, node: &str, request: &InstallRequest) -> Result<InstallOutcome, TalosError> {
        self.fence.talos(node)?;
        self.inner.lifecycle_upgrade(node, request).await
    }
    async fn lifecycle_upgrade_reporting(
        &self,
        node: &str,
        request: &InstallRequest,
        started: &std::sync::atomic::AtomicBool,
    ) -> Result<InstallOutcome, TalosError> {
        self.fence.talos(node)?;
        self.inner.lifecycle_upgrade_reporting(node, request, started).await
    }
    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        self.inner.install_running(node).await
    }
    async fn reboot(&self, node: &str) -> Result<String, TalosError> {
        self.fence.talos(node)?;
        self.inner.reboot(node).await
    }
    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        self.inner.boot_id(node).await
    }
}

/// The Kubernetes API, its writes made only while this replica leads.
pub struct FencedKube<'a> {
    /// The API called.
    pub inner: &'a dyn KubeApi,
    /// The leadership every change is checked against.
    pub fence: &'a Fence,
}

#[async_trait]
impl ConditionStore for FencedKube<'_> {
    async fn write_conditions(&self, machine: &str, conditions: &Conditions) -> Result<(), ConditionWriteError> {
        self.fence.conditions(machine)?;
        self.inner.write_conditions(machine, conditions).await
    }
    async fn write_conditions_at(
        &self,
        machine: &str,
        resource_version: &str,
        conditions: &Conditions,
    ) -> Result<(), ConditionWriteError> {
        self.fence.conditions(machine)?;
        self.inner.write_conditions_at(machine, resource_version, conditions).await
    }
}

/// The bootstrap manifests' session, its applies fenced as the operator's own writes.
struct FencedSession<'a> {
    inner: Box<dyn ManifestSession + 'a>,
    fence: &'a Fence,
}

#[async_trait]
impl ManifestSession for FencedSession<'_> {
    async fn apply(&self, object: &serde_json::Value, field_manager: &str) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.apply(object, field_manager).await
    }
}

#[async_trait]
impl KubeApi for FencedKube<'_> {
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError> {
        self.inner.node(name).await
    }
    async fn node_kubernetes(&self, node: &str) -> Result<Option<NodeKubernetesInfo>, KubeError> {
        self.inner.node_kubernetes(node).await
    }
    async fn control_plane_pods(&self) -> Result<ichor_executor::kube_api::ControlPlanePods, KubeError> {
        self.inner.control_plane_pods().await
    }
    async fn cluster_kubernetes(&self) -> Result<ClusterKubernetesInfo, KubeError> {
        self.inner.cluster_kubernetes().await
    }
    async fn manifest_session(&self, kubeconfig: AdminKubeconfig) -> Result<Box<dyn ManifestSession + '_>, KubeError> {
        let inner = self.inner.manifest_session(kubeconfig).await?;
        Ok(Box::new(FencedSession { inner, fence: self.fence }))
    }
    async fn workload_rollout(
        &self,
        workload: &str,
    ) -> Result<ichor_upgrade_core::kubernetes::manifests::WorkloadRollout, KubeError> {
        self.inner.workload_rollout(workload).await
    }
    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError> {
        self.inner.operation(name).await
    }
    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError> {
        self.inner.operation_exists(identity).await
    }
    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError> {
        self.inner.cluster(name).await
    }
    async fn machines(&self, cluster: &str) -> Result<Vec<Arc<MachineInfo>>, KubeError> {
        self.inner.machines(cluster).await
    }
    async fn nodes(&self, names: &[&str]) -> Result<Vec<Option<Arc<NodeInfo>>>, KubeError> {
        self.inner.nodes(names).await
    }
    async fn preflight_facts(&self, asked: &[&str]) -> Result<ClusterFacts, KubeError> {
        self.inner.preflight_facts(asked).await
    }
    async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError> {
        self.inner.lease(cluster).await
    }
    async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.write_lease(cluster, write).await
    }
    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.write_operation_status(name, status).await
    }
    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.remove_finalizer(name).await
    }
    async fn event(&self, event: &Event) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.event(event).await
    }
    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError> {
        self.inner.machine(name).await
    }
    async fn cordon(&self, read: &NodeInfo, annotation: &str) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.cordon(read, annotation).await
    }
    async fn uncordon(&self, read: &NodeInfo) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.uncordon(read).await
    }
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.inner.pods_on(node).await
    }
    async fn evict(&self, namespace: &str, name: &str) -> Result<Eviction, KubeError> {
        self.fence.kube()?;
        self.inner.evict(namespace, name).await
    }
    async fn delete_node(&self, read: &NodeInfo) -> Result<(), KubeError> {
        self.fence.kube()?;
        self.inner.delete_node(read).await
    }
}

/// The storage backend, its writes made only while this replica leads.
pub struct FencedStorage<'a> {
    /// The backend called.
    pub inner: &'a dyn StorageApi,
    /// The leadership every change is checked against.
    pub fence: &'a Fence,
}

#[async_trait]
impl StorageApi for FencedStorage<'_> {
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
        self.inner.storage_objects().await
    }
    async fn set_scheduling(&self, node: &str, enabled: bool) -> Result<(), StorageError> {
        self.fence.storage()?;
        self.inner.set_scheduling(node, enabled).await
    }
    async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError> {
        self.fence.storage()?;
        self.inner.request_evacuation(node, since).await
    }
    async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
        self.inner.evacuation_record(node).await
    }
    async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError> {
        self.fence.storage()?;
        self.inner.restore_scheduling(node, before).await
    }
    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError> {
        self.inner.replicas_on(node).await
    }
    async fn backing_images_on(&self, node: &str) -> Result<u32, StorageError> {
        self.inner.backing_images_on(node).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A Talos API that counts what reaches it.
    #[derive(Default)]
    struct Counted(std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl TalosApi for Counted {
        async fn nodename(&self, _: &str) -> Result<String, TalosError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok("n".into())
        }
        async fn machine_stage(&self, _: &str) -> Result<MachineStage, TalosError> {
            Ok(MachineStage::Running)
        }
        async fn upgrade(&self, _: &str, _: &UpgradeRequest) -> Result<UpgradeAck, TalosError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(UpgradeAck { ack: "ok".into(), actor_id: "a".into() })
        }
        async fn etcd_members(&self, _: &str) -> Result<Vec<EtcdMember>, TalosError> {
            Ok(Vec::new())
        }
        async fn etcd_status(&self, _: &str) -> Result<EtcdStatus, TalosError> {
            Err(TalosError::transport("unused"))
        }
        async fn etcd_alarms(&self, _: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
            Ok(Vec::new())
        }
        async fn etcd_leave_cluster(&self, _: &str) -> Result<(), TalosError> {
            Ok(())
        }
        async fn etcd_remove_member(&self, _: &str, _: u64) -> Result<(), TalosError> {
            Ok(())
        }
        async fn reset(&self, _: &str, _: &ResetRequest) -> Result<(), TalosError> {
            Ok(())
        }
        async fn reboot(&self, _: &str) -> Result<String, TalosError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok("a".into())
        }
    }

    /// A leadership that lapses between a pass's start and its call is not acted on: the
    /// call is refused before it leaves, as unreachable (transient), and reads still go.
    #[tokio::test]
    async fn a_call_that_changes_a_node_goes_out_only_while_this_replica_leads() {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(15)));
        let fence = Fence::new(rx);
        let counted = Counted::default();
        let talos = FencedTalos { inner: &counted, fence: &fence };
        let request = UpgradeRequest { image: "i".into(), timeout: Duration::from_secs(1) };
        talos.upgrade("10.5.0.2", &request).await.unwrap();
        talos.reboot("10.5.0.2").await.unwrap();
        // The renewal deadline passes (the Lease could not be renewed): no longer leading.
        tx.send(Some(Instant::now().checked_sub(Duration::from_millis(1)).unwrap())).unwrap();
        let refused = talos.upgrade("10.5.0.2", &request).await.unwrap_err();
        assert!(refused.is_unreachable(), "{refused:?}");
        assert!(refused.to_string().contains("no longer leads"), "{refused}");
        assert!(talos.reboot("10.5.0.2").await.is_err());
        assert_eq!(talos.nodename("10.5.0.2").await.unwrap(), "n", "a read still goes");
        assert_eq!(counted.0.load(std::sync::atomic::Ordering::Relaxed), 3, "two changes and one read reached it");
        tx.send(None).unwrap();
        assert!(!fence.leads());
    }
}
