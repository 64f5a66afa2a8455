//! mockall doubles of the drivers' seams, shared by the driver tests.
#![allow(dead_code, unreachable_pub)]

use async_trait::async_trait;
use ichor_executor::Clock;
use ichor_executor::StorageApi;
use ichor_executor::kube_api::{
    ClusterInfo, Event, Eviction, KubeApi, KubeError, LeaseInfo, LeaseWrite, MachineInfo, NodeInfo, OperationInfo,
    PodInfo,
};
use ichor_executor::talos_api::{
    EtcdAlarm, EtcdMember, EtcdStatus, InstallOutcome, InstallRequest, PullRequest, ResetRequest, TalosApi, TalosError,
    UpgradeAck, UpgradeRequest,
};
use ichor_executor::writes::{
    ConditionWrite, KubeWrite, KubeWritten, Seal, StorageWrite, StorageWritten, TalosWrite, TalosWritten,
};
use ichor_storage::{ConditionWriteError, EvacuationRequest, StorageError, StorageObject, StorageReads};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::status::OperationStatus;
use mockall::mock;

/// The fixed "now" of the driver tests.
pub const NOW: Timestamp = Timestamp::from_unix_secs(1_000);

/// The Talos API as the driver tests expect it, a method per call: [`TalosApi`] for the
/// mock below is this, its one `write` taken apart by variant.
#[async_trait]
pub trait TalosCalls: Send + Sync {
    async fn nodename(&self, node: &str) -> Result<String, TalosError>;
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError>;
    async fn upgrade(&self, node: &str, request: &UpgradeRequest) -> Result<UpgradeAck, TalosError>;
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError>;
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError>;
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError>;
    async fn etcd_leave_cluster(&self, node: &str) -> Result<(), TalosError>;
    async fn etcd_remove_member(&self, node: &str, member_id: u64) -> Result<(), TalosError>;
    async fn reset(&self, node: &str, request: &ResetRequest) -> Result<(), TalosError>;
    async fn image_pull(&self, node: &str, request: &PullRequest) -> Result<String, TalosError>;
    async fn lifecycle_upgrade(&self, node: &str, request: &InstallRequest) -> Result<InstallOutcome, TalosError>;
    async fn reboot(&self, node: &str) -> Result<String, TalosError>;
    async fn boot_id(&self, node: &str) -> Result<String, TalosError>;
}

/// The Kubernetes API as the driver tests expect it, a method per call (see [`TalosCalls`]).
#[async_trait]
pub trait KubeCalls: Send + Sync {
    async fn write_conditions(&self, machine: &str, conditions: &Conditions) -> Result<(), ConditionWriteError>;
    async fn write_conditions_at(
        &self,
        machine: &str,
        resource_version: &str,
        conditions: &Conditions,
    ) -> Result<(), ConditionWriteError>;
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError>;
    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError>;
    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError>;
    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError>;
    async fn machines(&self, cluster: &str) -> Result<Vec<std::sync::Arc<MachineInfo>>, KubeError>;
    async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError>;
    async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError>;
    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError>;
    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError>;
    async fn event(&self, event: &Event) -> Result<(), KubeError>;
    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError>;
    async fn cordon(&self, read: &NodeInfo, annotation: &str) -> Result<(), KubeError>;
    async fn uncordon(&self, read: &NodeInfo) -> Result<(), KubeError>;
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError>;
    async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError>;
    async fn evict(&self, namespace: &str, name: &str, uid: Option<String>) -> Result<Eviction, KubeError>;
    async fn delete_node(&self, read: &NodeInfo) -> Result<(), KubeError>;
}

mock! {
    /// The Talos API.
    pub Talos {}
    #[async_trait]
    impl TalosCalls for Talos {
        async fn nodename(&self, node: &str) -> Result<String, TalosError>;
        async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError>;
        async fn upgrade(&self, node: &str, request: &UpgradeRequest) -> Result<UpgradeAck, TalosError>;
        async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError>;
        async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError>;
        async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError>;
        async fn etcd_leave_cluster(&self, node: &str) -> Result<(), TalosError>;
        async fn etcd_remove_member(&self, node: &str, member_id: u64) -> Result<(), TalosError>;
        async fn reset(&self, node: &str, request: &ResetRequest) -> Result<(), TalosError>;
        async fn image_pull(&self, node: &str, request: &PullRequest) -> Result<String, TalosError>;
        async fn lifecycle_upgrade(&self, node: &str, request: &InstallRequest) -> Result<InstallOutcome, TalosError>;
        async fn reboot(&self, node: &str) -> Result<String, TalosError>;
        async fn boot_id(&self, node: &str) -> Result<String, TalosError>;
    }
}

mock! {
    /// The Kubernetes API.
    pub Kube {}
    #[async_trait]
    impl KubeCalls for Kube {
        async fn write_conditions(&self, machine: &str, conditions: &Conditions) -> Result<(), ConditionWriteError>;
        async fn write_conditions_at(
            &self,
            machine: &str,
            resource_version: &str,
            conditions: &Conditions,
        ) -> Result<(), ConditionWriteError>;
        async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError>;
        async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError>;
        async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError>;
        async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError>;
        async fn machines(&self, cluster: &str) -> Result<Vec<std::sync::Arc<MachineInfo>>, KubeError>;
        async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError>;
        async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError>;
        async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError>;
        async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError>;
        async fn event(&self, event: &Event) -> Result<(), KubeError>;
        async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError>;
        async fn cordon(&self, read: &NodeInfo, annotation: &str) -> Result<(), KubeError>;
        async fn uncordon(&self, read: &NodeInfo) -> Result<(), KubeError>;
        async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError>;
        async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError>;
        async fn evict(&self, namespace: &str, name: &str, uid: Option<String>) -> Result<Eviction, KubeError>;
        async fn delete_node(&self, read: &NodeInfo) -> Result<(), KubeError>;
    }
}

#[async_trait]
impl TalosApi for MockTalos {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        TalosCalls::nodename(self, node).await
    }
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        TalosCalls::machine_stage(self, node).await
    }
    async fn write(&self, node: &str, write: TalosWrite<'_>, _seal: Seal) -> Result<TalosWritten, TalosError> {
        Ok(match write {
            TalosWrite::Upgrade(request) => TalosWritten::Upgrade(TalosCalls::upgrade(self, node, request).await?),
            // As the trait's old default did: the double never says the install began.
            TalosWrite::Install { request, started: _ } => {
                TalosWritten::Install(TalosCalls::lifecycle_upgrade(self, node, request).await?)
            }
            TalosWrite::Reboot => TalosWritten::Reboot(TalosCalls::reboot(self, node).await?),
            TalosWrite::EtcdLeaveCluster => {
                TalosCalls::etcd_leave_cluster(self, node).await?;
                TalosWritten::EtcdLeaveCluster
            }
            TalosWrite::EtcdRemoveMember { member_id } => {
                TalosCalls::etcd_remove_member(self, node, member_id).await?;
                TalosWritten::EtcdRemoveMember
            }
            TalosWrite::Reset(request) => {
                TalosCalls::reset(self, node, request).await?;
                TalosWritten::Reset
            }
            TalosWrite::ImagePull(request) => {
                TalosWritten::ImagePull(TalosCalls::image_pull(self, node, request).await?)
            }
            TalosWrite::ApplyConfiguration(_) => {
                return Err(TalosError::unserved("MachineService.ApplyConfiguration", node));
            }
        })
    }
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        TalosCalls::etcd_members(self, node).await
    }
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        TalosCalls::etcd_status(self, node).await
    }
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        TalosCalls::etcd_alarms(self, node).await
    }
    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        TalosCalls::boot_id(self, node).await
    }
}

#[async_trait]
impl KubeApi for MockKube {
    async fn write_conditions(&self, write: ConditionWrite<'_>, _seal: Seal) -> Result<(), ConditionWriteError> {
        match write.at {
            Some(version) => KubeCalls::write_conditions_at(self, write.machine, version, write.conditions).await,
            None => KubeCalls::write_conditions(self, write.machine, write.conditions).await,
        }
    }
    async fn node(&self, name: &str) -> Result<Option<NodeInfo>, KubeError> {
        KubeCalls::node(self, name).await
    }
    async fn operation(&self, name: &str) -> Result<Option<OperationInfo>, KubeError> {
        KubeCalls::operation(self, name).await
    }
    async fn operation_exists(&self, identity: &str) -> Result<bool, KubeError> {
        KubeCalls::operation_exists(self, identity).await
    }
    async fn cluster(&self, name: &str) -> Result<ClusterInfo, KubeError> {
        KubeCalls::cluster(self, name).await
    }
    async fn machines(&self, cluster: &str) -> Result<Vec<std::sync::Arc<MachineInfo>>, KubeError> {
        KubeCalls::machines(self, cluster).await
    }
    async fn lease(&self, cluster: &str) -> Result<Option<LeaseInfo>, KubeError> {
        KubeCalls::lease(self, cluster).await
    }
    async fn write_lease(&self, cluster: &str, write: &LeaseWrite) -> Result<(), KubeError> {
        KubeCalls::write_lease(self, cluster, write).await
    }
    async fn write_operation_status(&self, name: &str, status: &OperationStatus) -> Result<(), KubeError> {
        KubeCalls::write_operation_status(self, name, status).await
    }
    async fn remove_finalizer(&self, name: &str) -> Result<(), KubeError> {
        KubeCalls::remove_finalizer(self, name).await
    }
    async fn event(&self, event: &Event) -> Result<(), KubeError> {
        KubeCalls::event(self, event).await
    }
    async fn machine(&self, name: &str) -> Result<Option<MachineInfo>, KubeError> {
        KubeCalls::machine(self, name).await
    }
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        KubeCalls::pods_on(self, node).await
    }
    async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        KubeCalls::cached_pods_on(self, node).await
    }
    async fn write(&self, write: KubeWrite<'_>, _seal: Seal) -> Result<KubeWritten, KubeError> {
        Ok(match write {
            KubeWrite::Cordon { node, annotation } => {
                KubeCalls::cordon(self, node, annotation).await?;
                KubeWritten::Cordoned
            }
            KubeWrite::Uncordon { node } => {
                KubeCalls::uncordon(self, node).await?;
                KubeWritten::Uncordoned
            }
            KubeWrite::Evict { namespace, name, uid } => {
                KubeWritten::Evicted(KubeCalls::evict(self, namespace, name, uid.map(str::to_owned)).await?)
            }
            KubeWrite::DeleteNode { node } => {
                KubeCalls::delete_node(self, node).await?;
                KubeWritten::NodeDeleted
            }
        })
    }
}

/// The storage backend's writes as the driver tests expect them, a method per write (see
/// [`TalosCalls`]).
#[async_trait]
pub trait StorageCalls: Send + Sync {
    async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError>;
    async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError>;
}

mock! {
    /// The storage backend.
    pub Storage {}
    #[async_trait]
    impl StorageReads for Storage {
        async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError>;
        async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError>;
        async fn replicas_on(&self, node: &str) -> Result<u32, StorageError>;
        async fn backing_images_on(&self, node: &str) -> Result<u32, StorageError>;
    }
    #[async_trait]
    impl StorageCalls for Storage {
        async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError>;
        async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError>;
    }
}

#[async_trait]
impl StorageApi for MockStorage {
    async fn write(&self, write: StorageWrite<'_>, _seal: Seal) -> Result<StorageWritten, StorageError> {
        Ok(match write {
            StorageWrite::RequestEvacuation { node, since } => {
                StorageWritten::Requested(StorageCalls::request_evacuation(self, node, since).await?)
            }
            StorageWrite::RestoreScheduling { node, before } => {
                StorageCalls::restore_scheduling(self, node, before).await?;
                StorageWritten::Restored
            }
        })
    }
}

/// A clock that always reads [`NOW`].
pub struct FixedClock;

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        NOW
    }
}
