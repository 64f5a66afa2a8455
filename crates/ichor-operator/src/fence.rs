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
use ichor_executor::StorageApi;
use ichor_executor::kube_api::{
    AdminKubeconfig, ClusterInfo, ClusterKubernetesInfo, Event, KubeApi, KubeError, LeaseInfo, LeaseWrite, MachineInfo,
    ManifestSession, NodeInfo, NodeKubernetesInfo, OperationInfo, PodInfo,
};
use ichor_executor::talos_api::{EtcdAlarm, EtcdMember, EtcdStatus, ImageInfo, SnapshotStream, TalosApi, TalosError};
use ichor_executor::writes::{
    ConditionWrite, KubeWrite, KubeWritten, Seal, StorageWrite, StorageWritten, TalosWrite, TalosWritten,
};
use ichor_storage::{ConditionWriteError, StorageError, StorageObject, StorageReads};
use ichor_upgrade_core::evacuation::EvacuationRecord;
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

    /// Whether the Talos write `write` on `node` may be sent now: a write only while this
    /// replica leads, except a dry run of a configuration, which stores nothing. An image
    /// pull changes no machine's state, but it is load an operation asked for: fenced.
    fn admits_talos(&self, node: &str, write: &TalosWrite<'_>) -> Result<(), TalosError> {
        if write.changes_the_node() { self.talos(node) } else { Ok(()) }
    }

    /// Whether the Kubernetes write `write` may be made now: every one only while this
    /// replica leads.
    fn admits_kube(&self, write: &KubeWrite<'_>) -> Result<(), KubeError> {
        match write {
            KubeWrite::Cordon { .. }
            | KubeWrite::Uncordon { .. }
            | KubeWrite::Evict { .. }
            | KubeWrite::DeleteNode { .. } => self.kube(),
        }
    }

    fn storage(&self) -> Result<(), StorageError> {
        if self.leads() { Ok(()) } else { Err(StorageError::transient(NOT_LEADING)) }
    }

    /// Whether the storage write `write` may be made now: the request of an evacuation and
    /// the restore of scheduling, each only while this replica leads.
    fn admits_storage(&self, write: &StorageWrite<'_>) -> Result<(), StorageError> {
        match write {
            StorageWrite::RequestEvacuation { .. } | StorageWrite::RestoreScheduling { .. } => self.storage(),
        }
    }

    /// Whether a write of a machine's conditions may be made now, with or without a
    /// resourceVersion to hold it to: only while this replica leads.
    fn admits_conditions(&self, write: &ConditionWrite<'_>) -> Result<(), ConditionWriteError> {
        if self.leads() {
            Ok(())
        } else {
            let machine = write.machine.to_owned();
            Err(ConditionWriteError { machine, message: NOT_LEADING.to_owned(), transient: true })
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
    async fn write(&self, node: &str, write: TalosWrite<'_>, seal: Seal) -> Result<TalosWritten, TalosError> {
        self.fence.admits_talos(node, &write)?;
        self.inner.write(node, write, seal).await
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
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        self.inner.etcd_members(node).await
    }
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        self.inner.etcd_status(node).await
    }
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        self.inner.etcd_alarms(node).await
    }
    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        self.inner.etcd_snapshot(node).await
    }
    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        self.inner.image_list(node).await
    }
    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        self.inner.install_running(node).await
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
    async fn gate_objects(
        &self,
        objects: &ichor_upgrade_core::gate::GateObjects,
    ) -> Result<Vec<(String, serde_json::Value)>, KubeError> {
        self.inner.gate_objects(objects).await
    }
    async fn alerts(
        &self,
        source: &ichor_upgrade_core::gate::AlertSelector,
    ) -> Result<Vec<ichor_executor::kube_api::Alert>, KubeError> {
        self.inner.alerts(source).await
    }
    async fn silences(&self, alertmanager: &str) -> Result<Vec<ichor_executor::kube_api::Silence>, KubeError> {
        self.inner.silences(alertmanager).await
    }
    async fn put_silence(
        &self,
        alertmanager: &str,
        silence: &ichor_executor::kube_api::Silence,
    ) -> Result<String, KubeError> {
        self.fence.kube()?;
        self.inner.put_silence(alertmanager, silence).await
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
    async fn write(&self, write: KubeWrite<'_>, seal: Seal) -> Result<KubeWritten, KubeError> {
        self.fence.admits_kube(&write)?;
        self.inner.write(write, seal).await
    }
    async fn write_conditions(&self, write: ConditionWrite<'_>, seal: Seal) -> Result<(), ConditionWriteError> {
        self.fence.admits_conditions(&write)?;
        self.inner.write_conditions(write, seal).await
    }
    async fn pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.inner.pods_on(node).await
    }
    async fn cached_pods_on(&self, node: &str) -> Result<Vec<PodInfo>, KubeError> {
        self.inner.cached_pods_on(node).await
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
impl StorageReads for FencedStorage<'_> {
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError> {
        self.inner.storage_objects().await
    }
    async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError> {
        self.inner.evacuation_record(node).await
    }
    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError> {
        self.inner.replicas_on(node).await
    }
    async fn backing_images_on(&self, node: &str) -> Result<u32, StorageError> {
        self.inner.backing_images_on(node).await
    }
}

#[async_trait]
impl StorageApi for FencedStorage<'_> {
    async fn write(&self, write: StorageWrite<'_>, seal: Seal) -> Result<StorageWritten, StorageError> {
        self.fence.admits_storage(&write)?;
        self.inner.write(write, seal).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use ichor_executor::kube_api::Metadata;
    use ichor_executor::talos_api::{ApplyConfigRequest, ApplyMode, PullRequest, UpgradeAck, UpgradeRequest};

    use super::*;

    /// A Talos API that counts what reaches it.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    #[async_trait]
    impl TalosApi for Counted {
        async fn nodename(&self, _: &str) -> Result<String, TalosError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok("n".into())
        }
        async fn machine_stage(&self, _: &str) -> Result<MachineStage, TalosError> {
            Ok(MachineStage::Running)
        }
        async fn write(&self, _: &str, write: TalosWrite<'_>, _: Seal) -> Result<TalosWritten, TalosError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(match write {
                TalosWrite::Upgrade(_) => TalosWritten::Upgrade(UpgradeAck { ack: "ok".into(), actor_id: "a".into() }),
                TalosWrite::Reboot => TalosWritten::Reboot("a".into()),
                TalosWrite::EtcdLeaveCluster => TalosWritten::EtcdLeaveCluster,
                TalosWrite::EtcdRemoveMember { .. } => TalosWritten::EtcdRemoveMember,
                TalosWrite::Reset(_) => TalosWritten::Reset,
                other => return Err(TalosError::unserved(other.method(), "n")),
            })
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
    }

    /// A leadership that lapses between a pass's start and its call is not acted on: the
    /// call is refused before it leaves, as unreachable (transient), and reads still go.
    /// (A write needs a seal only the executor makes: the fence's decision on it is what
    /// `write` applies before it forwards.)
    #[tokio::test]
    async fn a_call_that_changes_a_node_goes_out_only_while_this_replica_leads() {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(15)));
        let fence = Fence::new(rx);
        let counted = Counted::default();
        let talos = FencedTalos { inner: &counted, fence: &fence };
        let request = UpgradeRequest { image: "i".into(), timeout: Duration::from_secs(1) };
        let pull = PullRequest { image: "i".into(), timeout: Duration::from_secs(1) };
        let apply = |dry_run| ApplyConfigRequest { data: Vec::new(), mode: ApplyMode::NoReboot, dry_run };
        let (applied, dry_run) = (apply(false), apply(true));
        let node = "10.5.0.2";
        let writes = [
            TalosWrite::Upgrade(&request),
            TalosWrite::Reboot,
            TalosWrite::ImagePull(&pull),
            TalosWrite::ApplyConfiguration(&applied),
            TalosWrite::EtcdLeaveCluster,
            TalosWrite::EtcdRemoveMember { member_id: 7 },
        ];
        for write in &writes {
            fence.admits_talos(node, write).unwrap();
        }
        // The renewal deadline passes (the Lease could not be renewed): no longer leading.
        tx.send(Some(Instant::now().checked_sub(Duration::from_millis(1)).unwrap())).unwrap();
        let refused = fence.admits_talos(node, &TalosWrite::Upgrade(&request)).unwrap_err();
        assert!(refused.is_unreachable(), "{refused:?}");
        assert!(refused.to_string().contains("no longer leads"), "{refused}");
        for write in &writes {
            assert!(fence.admits_talos(node, write).is_err(), "{} went out", write.method());
        }
        // A dry run stores nothing: it goes.
        fence.admits_talos(node, &TalosWrite::ApplyConfiguration(&dry_run)).unwrap();
        assert_eq!(talos.nodename(node).await.unwrap(), "n", "a read still goes");
        assert_eq!(counted.0.load(Ordering::Relaxed), 1, "the read reached it");
        tx.send(None).unwrap();
        assert!(!fence.leads());
    }

    /// The machine-level Kubernetes writes (cordon, uncordon, eviction, Node deletion) are
    /// made only while this replica leads, refused as unreachable otherwise.
    #[test]
    fn a_kubernetes_write_is_made_only_while_this_replica_leads() {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(15)));
        let fence = Fence::new(rx);
        let node = NodeInfo {
            name: "n".into(),
            ready: true,
            unschedulable: false,
            os_image: String::new(),
            boot_id: String::new(),
            labels: Metadata::new(),
            annotations: Metadata::new(),
            resource_version: "1".into(),
        };
        let writes = [
            KubeWrite::Cordon { node: &node, annotation: "since=1;operation=default/demo/1" },
            KubeWrite::Uncordon { node: &node },
            KubeWrite::Evict { namespace: "apps", name: "web-1", uid: None },
            KubeWrite::DeleteNode { node: &node },
        ];
        for write in &writes {
            fence.admits_kube(write).unwrap();
        }
        tx.send(Some(Instant::now().checked_sub(Duration::from_millis(1)).unwrap())).unwrap();
        for write in &writes {
            let refused = fence.admits_kube(write).unwrap_err();
            assert!(matches!(&refused, KubeError::Unreachable(why) if why.contains("no longer leads")), "{refused:?}");
        }
    }

    /// The storage writes (an evacuation's request, the restore of scheduling) and the
    /// writes of a machine's conditions, held to a resourceVersion or not, are made only
    /// while this replica leads, refused as transient otherwise.
    #[test]
    fn a_storage_write_or_a_write_of_conditions_is_made_only_while_this_replica_leads() {
        use ichor_upgrade_core::Timestamp;
        use ichor_upgrade_core::conditions::Conditions;
        use ichor_upgrade_core::evacuation::Scheduling;

        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(15)));
        let fence = Fence::new(rx);
        let storage = [
            StorageWrite::RequestEvacuation { node: "n", since: Timestamp::EPOCH },
            StorageWrite::RestoreScheduling { node: "n", before: Scheduling::ON },
        ];
        let conditions = Conditions::new();
        let writes = [None, Some("7")].map(|at| ConditionWrite { machine: "m", conditions: &conditions, at });
        for write in &storage {
            fence.admits_storage(write).unwrap();
        }
        for write in &writes {
            fence.admits_conditions(write).unwrap();
        }
        tx.send(Some(Instant::now().checked_sub(Duration::from_millis(1)).unwrap())).unwrap();
        for write in &storage {
            let refused = fence.admits_storage(write).unwrap_err();
            assert_eq!(refused, StorageError::transient(NOT_LEADING), "{}", write.name());
        }
        for write in &writes {
            let refused = fence.admits_conditions(write).unwrap_err();
            let expected =
                ConditionWriteError { machine: "m".to_owned(), message: NOT_LEADING.to_owned(), transient: true };
            assert_eq!(refused, expected, "{write:?}");
        }
    }
}
