//! mockall tests of `reconcile` where a world of its own cannot show the defect: machines
//! whose names are not their node names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_executor::ExecutorConfig;
use ichor_executor::kube_api::{ClusterInfo, LeaseInfo, MachineInfo, NodeInfo, OperationInfo};
use ichor_executor::machine::talos::Executor;
use ichor_executor::reconcile::{PassMemory, ReconcileOutcome, reconcile};
use ichor_executor::talos_api::TalosError;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::{EvacuationRecord, STORAGE_EVACUATION, Scheduling, reason as evac};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::status::{MachineRecord, RecordState};
use ichor_upgrade_core::status::{OperationStatus, PauseReason, Phase};
use mockall::predicate::eq;

use crate::support::{FixedClock, MockKube, MockStorage, MockTalos, NOW};

const IDENTITY: &str = "default/upgrade/uid-1";

fn record(state: RecordState, reason: &str) -> MachineRecord {
    MachineRecord { state, reason: reason.into(), message: "m".into(), recheck_at: None }
}

fn worker(name: &str, hostname: Option<&str>, address: &str, conditions: Conditions) -> MachineInfo {
    MachineInfo {
        name: name.into(),
        role: MachineRole::Worker,
        hostname: hostname.map(str::to_owned),
        address: address.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        conditions,
        resource_version: None,
    }
}

/// Review finding 6: a paused operation stops a machine that began evacuating, but its node
/// name cannot be read (no `spec.hostname`, Talos unreachable). Storage knows the node by
/// its node name, not the machine's: ending the evacuation of the machine's name (which
/// Longhorn answers NotFound, read as success) would leave the real node unschedulable for
/// good. It waits instead.
#[tokio::test]
async fn a_stop_with_an_unknown_node_name_waits_and_never_guesses() {
    let mut evacuating = Conditions::new();
    evacuating.upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, ""), NOW);
    let machines = vec![
        worker("m-failed", Some("node-a"), "10.0.0.21", Conditions::new()),
        worker("m-evacuating", None, "10.0.0.22", evacuating),
    ];
    let mut kube = paused_cluster(machines);
    kube.expect_write_conditions().never();
    let written = capture_status(&mut kube);
    let mut talos = MockTalos::new();
    talos
        .expect_nodename()
        .with(eq("10.0.0.22"))
        .returning(|_| Err(TalosError::dial("10.0.0.22:50000", "connection refused")));
    talos.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    let mut storage = MockStorage::new();
    storage.expect_storage_objects().returning(|| Ok(Vec::new()));
    storage.expect_evacuation_record().returning(|_| Ok(None));

    let outcome = reconcile_once(&talos, &kube, &storage).await;
    assert!(matches!(outcome.phase, Phase::Paused(_)), "{:?}", outcome.phase);
    let status = written.lock().unwrap().last().cloned().expect("a status write");
    let stopping = &status.machines["m-evacuating"];
    assert_eq!(stopping.state, RecordState::InProgress, "still to be stopped: {stopping:?}");
    assert_eq!(stopping.reason, "NodeNameUnknown");
}

/// Decision 0011: an evacuation begun just before the pause may be recorded only by the
/// storage backend (no conditions write opens one). The stop finds it there and ends it
/// with the scheduling from before; a machine the backend records nothing for is left be.
#[tokio::test]
async fn a_stop_ends_an_evacuation_only_the_backend_records() {
    for recorded in [true, false] {
        let machines = vec![
            worker("m-failed", Some("node-a"), "10.0.0.21", Conditions::new()),
            worker("m-evacuating", Some("node-b"), "10.0.0.22", Conditions::new()),
        ];
        let mut kube = paused_cluster(machines);
        let conditions = Arc::new(Mutex::new(Vec::new()));
        let captured = Arc::clone(&conditions);
        kube.expect_write_conditions().returning(move |machine, c| {
            captured.lock().unwrap().push((machine.to_owned(), c.clone()));
            Ok(())
        });
        let written = capture_status(&mut kube);
        let mut talos = MockTalos::new();
        talos.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
        let mut storage = MockStorage::new();
        storage.expect_storage_objects().returning(|| Ok(Vec::new()));
        let before = Scheduling { allowed: false, eviction_requested: false };
        let record = EvacuationRecord { before, since: Some(NOW), bytes: None };
        storage.expect_evacuation_record().with(eq("node-a")).returning(|_| Ok(None));
        storage.expect_evacuation_record().with(eq("node-b")).returning(move |_| Ok(recorded.then_some(record)));
        storage
            .expect_restore_scheduling()
            .with(eq("node-b"), eq(before))
            .times(usize::from(recorded))
            .returning(|_, _| Ok(()));

        let outcome = reconcile_once(&talos, &kube, &storage).await;
        assert!(matches!(outcome.phase, Phase::Paused(_)), "{:?}", outcome.phase);
        let conditions = conditions.lock().unwrap();
        if recorded {
            let (machine, c) = conditions.first().expect("the evacuation's end written");
            assert_eq!(machine, "m-evacuating");
            assert_eq!(c.get(STORAGE_EVACUATION).map(|c| c.status), Some(ConditionStatus::False));
        } else {
            assert!(conditions.is_empty(), "{conditions:?}");
        }
        let status = written.lock().unwrap().last().cloned().expect("a status write");
        assert!(!status.machines.contains_key("m-evacuating"), "stopped: {:?}", status.machines);
    }
}

/// The storage backend's reads, each one taking a moment, counting how many are in flight
/// at once (the most) and how many were made.
struct GaugedStorage {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    asked: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl ichor_storage::StorageReads for GaugedStorage {
    async fn storage_objects(&self) -> Result<Vec<ichor_storage::StorageObject>, ichor_storage::StorageError> {
        Ok(Vec::new())
    }
    async fn evacuation_record(&self, _node: &str) -> Result<Option<EvacuationRecord>, ichor_storage::StorageError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.asked.fetch_add(1, SeqCst);
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.now.fetch_sub(1, SeqCst);
        Ok(None)
    }
    async fn replicas_on(&self, _node: &str) -> Result<u32, ichor_storage::StorageError> {
        Ok(0)
    }
    async fn backing_images_on(&self, _node: &str) -> Result<u32, ichor_storage::StorageError> {
        Ok(0)
    }
}

#[async_trait::async_trait]
impl ichor_executor::StorageApi for GaugedStorage {
    async fn write(
        &self,
        write: ichor_executor::writes::StorageWrite<'_>,
        _seal: ichor_executor::writes::Seal,
    ) -> Result<ichor_executor::writes::StorageWritten, ichor_storage::StorageError> {
        panic!("no storage write expected: {write:?}")
    }
}

/// The 3 + 1,000 kwok test's livelock: a process's first pass (and every pass after one
/// that failed midway) reads the evacuation record of each machine with none. Sent all at
/// once, a thousand reads filled the API server's queues for the operator (429), the pass
/// failed, and the next one sent them all again. They go a few at a time, and every one
/// is still read.
#[tokio::test]
async fn the_first_pass_reads_the_evacuation_records_a_few_at_a_time() {
    let mut machines = vec![
        worker("m-failed", Some("node-a"), "10.0.0.21", Conditions::new()),
        worker("m-evacuating", Some("node-b"), "10.0.0.22", Conditions::new()),
    ];
    machines
        .extend((0..200).map(|i| worker(&format!("m-{i}"), Some(&format!("node-{i}")), "10.0.1.1", Conditions::new())));
    let mut kube = paused_cluster(machines);
    kube.expect_write_conditions().returning(|_, _| Ok(()));
    capture_status(&mut kube);
    let mut talos = MockTalos::new();
    talos.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    let storage = GaugedStorage { now: 0.into(), most: 0.into(), asked: 0.into() };

    let config = ExecutorConfig::default();
    let ex = Executor {
        talos: &talos,
        kube: &kube,
        storage: &storage,
        clock: &FixedClock,
        config: &config,
        snapshots: None,
        background: None,
    };
    reconcile(&ex, "upgrade").await.expect("the pass");
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(
        storage.asked.load(SeqCst),
        201,
        "each of the 200 machines with no record once, and m-evacuating's by its stop"
    );
    let most = storage.most.load(SeqCst);
    assert!(most > 1, "the reads overlap: {most}");
    assert!(most <= ichor_executor::calls::READS_AT_ONCE, "{most} reads in flight at once");
}

/// Operation `upgrade` of cluster `prod`, held by [`IDENTITY`], to `target_version`.
fn operation_info(target_version: &str, max_unavailable: i64, status: OperationStatus) -> OperationInfo {
    OperationInfo {
        name: "upgrade".into(),
        identity: IDENTITY.into(),
        cluster: "prod".into(),
        generation: 1,
        deleting: false,
        annotations: BTreeMap::new(),
        spec: OperationSpec {
            preflight: None,
            allow_two_control_planes: false,
            etcd_snapshot: None,
            kind: "talos".into(),
            target_version: target_version.into(),
            max_unavailable: max_unavailable.into(),
            machine: None,
        },
        maintenance: None,
        gates: None,
        status,
    }
}

/// Cluster `prod`, its release set on v1.14.4.
fn prod_cluster() -> ClusterInfo {
    ClusterInfo {
        name: "prod".into(),
        release_talos_version: "v1.14.4".into(),
        releases: ichor_upgrade_core::releases::KnownReleases::built_in().clone(),
        kubernetes_version: "1.34.1".into(),
        schematic: None,
        platform: "metal".into(),
        nodes: Vec::new(),
        maintenance: None,
        gates: Vec::new(),
    }
}

/// A cluster with operation `upgrade` paused on `m-failed`, with `m-evacuating` in progress.
fn paused_cluster(machines: Vec<MachineInfo>) -> MockKube {
    let mut status = OperationStatus {
        phase: Phase::Paused(PauseReason::MachineFailed { machines: vec![] }),
        observed_generation: Some(1),
        ..OperationStatus::default()
    };
    status.machines.insert("m-failed".into(), record(RecordState::Failed, "AbFallback"));
    status.machines.insert("m-evacuating".into(), record(RecordState::InProgress, "Evacuating"));
    let operation = operation_info("v1.14.4", 2, status);

    let mut kube = MockKube::new();
    kube.expect_operation().with(eq("upgrade")).returning(move |_| Ok(Some(operation.clone())));
    kube.expect_cluster().returning(|_| Ok(prod_cluster()));
    kube.expect_machines().returning(move |_| Ok(machines.iter().cloned().map(std::sync::Arc::new).collect()));
    kube.expect_lease().returning(|_| {
        Ok(Some(LeaseInfo {
            holder: Some(IDENTITY.into()),
            renewed_at: NOW,
            duration: Duration::from_secs(120),
            resource_version: "7".into(),
        }))
    });
    kube.expect_node().returning(|name| {
        Ok(Some(NodeInfo {
            name: name.to_owned(),
            ready: true,
            unschedulable: false,
            os_image: "Talos (v1.14.3)".into(),
            boot_id: "b".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            resource_version: "3".into(),
        }))
    });
    kube.expect_event().returning(|_| Ok(()));
    kube
}

/// The operation statuses `kube` is asked to write, in order.
fn capture_status(kube: &mut MockKube) -> Arc<Mutex<Vec<OperationStatus>>> {
    let written = Arc::new(Mutex::new(Vec::new()));
    let captured = Arc::clone(&written);
    kube.expect_write_operation_status().returning(move |_, s| {
        captured.lock().unwrap().push(s.clone());
        Ok(())
    });
    written
}

async fn reconcile_once(talos: &MockTalos, kube: &MockKube, storage: &MockStorage) -> ReconcileOutcome {
    pass(talos, kube, storage).await.unwrap()
}

/// One pass of `upgrade` with the default configuration.
async fn pass(
    talos: &MockTalos,
    kube: &MockKube,
    storage: &MockStorage,
) -> Result<ReconcileOutcome, ichor_executor::reconcile::ReconcileError> {
    let config = ExecutorConfig::default();
    let ex = Executor { talos, kube, storage, clock: &FixedClock, config: &config, snapshots: None, background: None };
    reconcile(&ex, "upgrade").await
}

#[test]
fn passes_start_at_least_the_pass_interval_apart_and_a_restart_passes_at_once() {
    let memory = PassMemory::new();
    let t = Timestamp::from_unix_millis;
    let second = Duration::from_secs(1);
    assert_eq!(memory.defer_pass(t(10_000), second), None, "the first pass at once");
    assert_eq!(memory.next_pass_at(second), Some(t(11_000)), "what a runner that waits itself waits for");
    assert_eq!(memory.defer_pass(t(10_400), second), Some(t(11_000)), "woken early: requeued for the interval's end");
    assert_eq!(memory.defer_pass(t(10_999), second), Some(t(11_000)));
    assert_eq!(memory.defer_pass(t(11_000), second), None);
    memory.pass_ended(t(11_050), Some(t(11_050)));
    assert_eq!(memory.next_pass_at(second), None);
    assert_eq!(memory.defer_pass(t(11_100), second), None, "a pass that asked to look again at once is followed");
    memory.pass_ended(t(11_150), Some(t(20_000)));
    assert_eq!(memory.defer_pass(t(11_200), second), Some(t(12_100)), "a later requeue waits for the interval");
    assert_eq!(memory.defer_pass(t(11_500), Duration::ZERO), None, "no interval: every wake passes");
    memory.clear();
    assert_eq!(memory.defer_pass(t(11_600), second), None, "a restarted controller passes at once");
}

/// A change of phase is told once: a pass whose status write lost a race (its store behind
/// another write) is decided again, and used to send the phase's Event twice.
#[tokio::test]
async fn a_phase_change_whose_status_write_conflicts_is_told_once() {
    let operation = operation_info("banana", 1, OperationStatus::default());
    let mut kube = MockKube::new();
    kube.expect_operation().returning(move |_| Ok(Some(operation.clone())));
    kube.expect_cluster().returning(|_| Ok(prod_cluster()));
    kube.expect_machines().returning(|_| Ok(Vec::new()));
    kube.expect_lease().returning(|_| Ok(None));
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    kube.expect_event().returning(move |e| {
        seen.lock().unwrap().push(e.reason.clone());
        Ok(())
    });
    let writes = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&writes);
    kube.expect_write_operation_status().returning(move |_, _| {
        let mut n = counted.lock().unwrap();
        *n += 1;
        if *n == 1 {
            Err(ichor_executor::kube_api::KubeError::Conflict("the object has been modified".into()))
        } else {
            Ok(())
        }
    });
    let (talos, storage) = (MockTalos::new(), MockStorage::new());
    assert!(pass(&talos, &kube, &storage).await.is_err(), "the conflict ends the first pass");
    assert!(
        events.lock().unwrap().is_empty(),
        "nothing told before the status is written: {:?}",
        events.lock().unwrap()
    );
    let outcome = reconcile_once(&talos, &kube, &storage).await;
    assert_eq!(outcome.phase.name(), "Refused");
    assert_eq!(*events.lock().unwrap(), ["InvalidTargetVersion"], "told once");
}

/// Issue 31 item 10: with RBAC per namespace, an operation in a namespace the operator was
/// not granted cannot read its cluster's lock. It waits, stalled, saying what was refused;
/// it writes no Lease, reads no machine's Node and calls no Talos API; it is told once and
/// looked at again on its own (RBAC is not watched).
#[tokio::test]
async fn an_operation_whose_lock_lease_is_forbidden_waits_saying_so_and_touches_nothing() {
    let operation = operation_info("v1.14.3", 1, OperationStatus::default());
    let mut kube = MockKube::new();
    kube.expect_operation().returning(move |_| Ok(Some(operation.clone())));
    kube.expect_cluster().returning(|_| Ok(prod_cluster()));
    kube.expect_machines()
        .returning(|_| Ok(vec![Arc::new(worker("w-1", Some("w-1"), "10.0.0.21", Conditions::new()))]));
    let refused = "read Lease ichor-cluster-prod: leases.coordination.k8s.io \"ichor-cluster-prod\" is forbidden";
    kube.expect_lease().returning(move |_| Err(ichor_executor::kube_api::KubeError::Forbidden(refused.into())));
    kube.expect_write_lease().never();
    kube.expect_node().never();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    kube.expect_event().returning(move |e| {
        seen.lock().unwrap().push((e.reason.clone(), e.message.clone()));
        Ok(())
    });
    let written = capture_status(&mut kube);
    let (talos, storage) = (MockTalos::new(), MockStorage::new());

    let outcome = reconcile_once(&talos, &kube, &storage).await;
    assert_eq!(outcome.phase.reason(), "Forbidden", "{:?}", outcome.phase);
    assert!(outcome.phase.needs_person(), "a person grants it: kstatus Stalled");
    assert!(outcome.phase.to_string().contains(refused), "{}", outcome.phase);
    let recheck = NOW.saturating_add(ichor_executor::reconcile::FORBIDDEN_RECHECK);
    assert_eq!(outcome.requeue_at, Some(recheck), "looked at again on its own");
    let status = written.lock().unwrap().last().cloned().expect("the wait is written");
    assert_eq!(status.phase, outcome.phase);
    assert!(status.machines.is_empty(), "no machine started");
    assert_eq!(events.lock().unwrap().len(), 1);
    assert_eq!(events.lock().unwrap()[0].0, "Forbidden");
}
