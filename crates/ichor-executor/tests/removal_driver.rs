//! mockall tests of `remove_machine`: each removal action and its error handling.

use ichor_upgrade_core::evacuation::Scheduling;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ichor_executor::ExecutorConfig;
use ichor_executor::etcd::ControlPlane;
use ichor_executor::kube_api::{EventType, Eviction, MachineInfo, NodeInfo, PodInfo};
use ichor_executor::machine::removal::remove_machine;
use ichor_executor::machine::talos::Executor;
use ichor_executor::talos_api::{EtcdMember, EtcdStatus, TalosError};
use ichor_storage::ConditionWriteError;
use ichor_storage::{LabelSelector, StorageObject};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::{STORAGE_EVACUATION, reason as evac};
use ichor_upgrade_core::machine::lifecycle::cordon_annotation;
use ichor_upgrade_core::machine::removal::{ETCD_DEPARTURE, NODE_REMOVAL, reason};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::status::MachineOutcome;
use mockall::predicate::eq;

use crate::support::{FixedClock, MockKube, MockStorage, MockTalos, NOW};

/// The removal's operation identity.
const OPERATION: &str = "default/remove-worker-2/uid-9";
use ichor_executor::Clock;

fn machine(name: &str, role: MachineRole, address: &str) -> MachineInfo {
    MachineInfo {
        name: name.into(),
        role,
        hostname: Some(name.into()),
        address: address.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        conditions: Conditions::new(),
        resource_version: Some("5".into()),
    }
}

fn node(name: &str, unschedulable: bool) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        ready: true,
        unschedulable,
        os_image: "Talos (v1.14.3)".into(),
        boot_id: "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11".into(),
        labels: [("storage".to_owned(), "longhorn".to_owned())].into(),
        annotations: BTreeMap::new(),
        resource_version: "12".into(),
    }
}

fn pod(name: &str, owner: &str, mirror: bool) -> PodInfo {
    PodInfo {
        namespace: "apps".into(),
        name: name.into(),
        owner_kinds: vec![owner.into()],
        mirror,
        terminating: false,
        uid: Some(format!("uid-{name}")),
    }
}

struct World {
    talos: MockTalos,
    kube: MockKube,
    storage: MockStorage,
    writes: Arc<Mutex<Vec<Conditions>>>,
}

impl World {
    /// A Node `worker-2` with these pods, no storage selecting it, Talos answering Running.
    fn new(node_info: Option<NodeInfo>, pods: Vec<PodInfo>) -> Self {
        let mut talos = MockTalos::new();
        talos.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
        let mut kube = MockKube::new();
        kube.expect_node().returning(move |_| Ok(node_info.clone()));
        kube.expect_pods_on().returning(move |_| Ok(pods.clone()));
        // A store with no pods: each read is the API server's.
        kube.expect_cached_pods_on().returning(|_| Ok(Vec::new()));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let captured = Arc::clone(&writes);
        kube.expect_write_conditions().returning(move |_, c| {
            captured.lock().unwrap().push(c.clone());
            Ok(())
        });
        let mut storage = MockStorage::new();
        storage.expect_storage_objects().returning(|| Ok(Vec::new()));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        Self { talos, kube, storage, writes }
    }

    async fn remove(&self, m: &MachineInfo, control_planes: &[ControlPlane]) -> MachineOutcome {
        self.try_remove(m, control_planes).await.unwrap()
    }

    async fn try_remove(
        &self,
        m: &MachineInfo,
        control_planes: &[ControlPlane],
    ) -> Result<MachineOutcome, ichor_executor::AdvanceError> {
        let config = ExecutorConfig::default();
        let ex = Executor {
            snapshots: None,
            background: None,
            talos: &self.talos,
            kube: &self.kube,
            storage: &self.storage,
            clock: &FixedClock,
            config: &config,
        };
        remove_machine(&ex, &advancing(&m.name), OPERATION, m, control_planes).await
    }

    fn written(&self, type_: &str) -> Vec<(ConditionStatus, String)> {
        self.writes.lock().unwrap().iter().filter_map(|c| c.get(type_)).map(|c| (c.status, c.reason.clone())).collect()
    }
}

#[tokio::test]
async fn an_uncordoned_node_is_cordoned_first() {
    let mut world = World::new(Some(node("worker-2", false)), vec![pod("api-1", "ReplicaSet", false)]);
    world
        .kube
        .expect_cordon()
        .withf(|read, annotation| {
            read.name == "worker-2" && read.resource_version == "12" && annotation == cordon_annotation(NOW, OPERATION)
        })
        .times(1)
        .returning(|_, _| Ok(()));
    world.kube.expect_evict().never();
    let outcome = world.remove(&machine("worker-2", MachineRole::Worker, "10.0.0.22"), &[]).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "Cordon" });
}

#[tokio::test]
async fn the_drain_evicts_only_what_it_should_and_a_429_is_a_wait() {
    let pods = vec![
        pod("api-1", "ReplicaSet", false),
        pod("cilium-x", "DaemonSet", false),
        pod("static-web", "Node", true),
        pod("db-0", "StatefulSet", false),
    ];
    let mut world = World::new(Some(node("worker-2", true)), pods);
    let uid = |name: &str| eq(Some(format!("uid-{name}")));
    world
        .kube
        .expect_evict()
        .with(eq("apps"), eq("api-1"), uid("api-1"))
        .times(1)
        .returning(|_, _, _| Ok(Eviction::Evicted));
    world.kube.expect_evict().with(eq("apps"), eq("db-0"), uid("db-0")).times(1).returning(|_, _, _| {
        Ok(Eviction::Blocked { message: "Cannot evict pod as it would violate the pod's disruption budget.".into() })
    });
    let outcome = world.remove(&machine("worker-2", MachineRole::Worker, "10.0.0.22"), &[]).await;
    let MachineOutcome::Waiting { reason, message, recheck_at } = outcome else { panic!("{outcome:?}") };
    assert_eq!(reason, "EvictionBlocked");
    assert!(message.contains("apps/db-0") && message.contains("disruption budget"), "{message}");
    // Nothing watched says when the budget allows it: the wait has its own recheck, or a
    // controller woken only by watch events would wait for ever.
    assert_eq!(recheck_at, Some(FixedClock.now().saturating_add(ichor_executor::machine::removal::EVICTION_RETRY)));
}

#[tokio::test]
async fn the_reset_writes_its_intent_first_then_the_acknowledgement() {
    let mut world = World::new(Some(node("worker-2", true)), vec![pod("cilium-x", "DaemonSet", false)]);
    let writes = Arc::clone(&world.writes);
    // The intent is written on the machine as this pass read it.
    let intents = Arc::clone(&world.writes);
    world.kube.expect_write_conditions_at().times(1).returning(move |_, version, c| {
        assert_eq!(version, "5", "under the resourceVersion the pass read");
        intents.lock().unwrap().push(c.clone());
        Ok(())
    });
    world
        .talos
        .expect_reset()
        .withf(|node, request| node == "10.0.0.22" && request.graceful && !request.reboot)
        .times(1)
        .returning(move |_, _| {
            let intent = writes.lock().unwrap().last().cloned().expect("intent before the reset");
            assert_eq!(intent.get(NODE_REMOVAL).unwrap().status, ConditionStatus::Unknown);
            Ok(())
        });
    let outcome = world.remove(&machine("worker-2", MachineRole::Worker, "10.0.0.22"), &[]).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "Reset" });
    assert_eq!(
        world.written(NODE_REMOVAL),
        vec![
            (ConditionStatus::Unknown, reason::RESET_REQUESTED.to_owned()),
            (ConditionStatus::True, reason::RESET_REQUESTED.to_owned())
        ]
    );
}

#[tokio::test]
async fn a_refused_reset_closes_the_intent_and_fails() {
    let mut world = World::new(Some(node("worker-2", true)), vec![]);
    let intents = Arc::clone(&world.writes);
    world.kube.expect_write_conditions_at().times(1).returning(move |_, _, c| {
        intents.lock().unwrap().push(c.clone());
        Ok(())
    });
    world
        .talos
        .expect_reset()
        .returning(|_, _| Err(TalosError::Answered { code: "PermissionDenied".into(), message: "not admin".into() }));
    let outcome = world.remove(&machine("worker-2", MachineRole::Worker, "10.0.0.22"), &[]).await;
    assert!(matches!(outcome, MachineOutcome::Failed { ref reason, .. } if reason == "ResetRefused"));
    assert_eq!(world.written(NODE_REMOVAL).last().unwrap().0, ConditionStatus::False);
}

/// Storage that selects the node (a `longhorn` object with a label selector).
fn storage_selecting(world: &mut World) {
    world.storage = MockStorage::new();
    world.storage.expect_evacuation_record().returning(|_| Ok(None));
    world.storage.expect_storage_objects().returning(|| {
        Ok(vec![StorageObject {
            name: "longhorn".into(),
            node_selector: LabelSelector {
                match_labels: [("storage".to_owned(), "longhorn".to_owned())].into(),
                ..LabelSelector::default()
            },
            evacuation_timeout: None,
        }])
    });
}

#[tokio::test]
async fn a_removal_side_timeout_re_enables_scheduling_warns_and_does_not_drain() {
    let mut world = World::new(Some(node("worker-2", false)), vec![pod("api-1", "ReplicaSet", false)]);
    storage_selecting(&mut world);
    world.storage.expect_replicas_on().returning(|_| Ok(2));
    world.storage.expect_backing_images_on().returning(|_| Ok(0));
    world
        .storage
        .expect_restore_scheduling()
        .with(eq("worker-2"), eq(Scheduling::ON))
        .times(1)
        .returning(|_, _| Ok(()));
    world.kube.expect_cordon().never();
    world.kube.expect_evict().never();
    world
        .kube
        .expect_event()
        .withf(|e| e.type_ == EventType::Warning && e.reason == "EvacuationTimedOut" && e.name == "worker-2")
        .times(1)
        .returning(|_| Ok(()));
    let mut m = machine("worker-2", MachineRole::Worker, "10.0.0.22");
    m.conditions.upsert(
        ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, ""),
        Timestamp::from_unix_secs(-5_000),
    );
    let outcome = world.remove(&m, &[]).await;
    assert!(matches!(outcome, MachineOutcome::Waiting { ref reason, .. } if reason == "EvacuationRestarted"));
    assert_eq!(world.written(STORAGE_EVACUATION), vec![(ConditionStatus::False, evac::TIMED_OUT.to_owned())]);
}

// Issue 17: a removal wipes the disks; it waited for replicas only, so a backing image
// whose only copy was on the node was lost.
#[tokio::test]
async fn a_removal_waits_for_the_backing_images_on_the_node_not_only_its_replicas() {
    let mut world = World::new(Some(node("worker-2", false)), vec![pod("api-1", "ReplicaSet", false)]);
    storage_selecting(&mut world);
    world.storage.expect_replicas_on().returning(|_| Ok(0));
    world.storage.expect_backing_images_on().with(eq("worker-2")).returning(|_| Ok(1));
    world.storage.expect_restore_scheduling().never();
    world.kube.expect_cordon().never();
    world.kube.expect_evict().never();
    world.talos.expect_reset().never();
    let mut m = machine("worker-2", MachineRole::Worker, "10.0.0.22");
    m.conditions.upsert(
        ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, ""),
        Timestamp::from_unix_secs(990),
    );
    let outcome = world.remove(&m, &[]).await;
    assert!(matches!(outcome, MachineOutcome::Waiting { .. }), "a backing image is left: {outcome:?}");
    assert!(world.written(STORAGE_EVACUATION).is_empty(), "the evacuation stays open");
}

fn cps() -> Vec<ControlPlane> {
    (1..=3).map(|i| ControlPlane { address: format!("10.0.0.1{i}"), node: format!("cp-{i}") }).collect()
}

fn status(node: &str) -> EtcdStatus {
    let id = node.chars().last().and_then(|c| c.to_digit(10)).map_or(0, u64::from);
    EtcdStatus { member_id: id, leader: 1, errors: vec![], is_learner: false }
}

fn members() -> Vec<EtcdMember> {
    (1..=3).map(|i| EtcdMember { id: i, hostname: format!("cp-{i}"), is_learner: false }).collect()
}

#[tokio::test]
async fn a_control_plane_leaves_etcd_through_talos_when_the_gate_passes() {
    let mut world = World::new(Some(node("cp-3", true)), vec![pod("kube-apiserver-cp-3", "Node", true)]);
    world.talos.expect_etcd_members().returning(|_| Ok(members()));
    world.talos.expect_etcd_status().returning(|node| Ok(status(node)));
    world.talos.expect_etcd_alarms().returning(|_| Ok(vec![]));
    // The departure is recorded first, under the machine as this pass read it.
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&recorded);
    world.kube.expect_write_conditions_at().times(1).returning(move |_, version, c| {
        seen.lock().unwrap().push((version.to_owned(), c.get(ETCD_DEPARTURE).map(|c| (c.status, c.reason.clone()))));
        Ok(())
    });
    let left = Arc::clone(&recorded);
    world.talos.expect_etcd_leave_cluster().with(eq("10.0.0.13")).times(1).returning(move |_| {
        assert_eq!(left.lock().unwrap().len(), 1, "recorded before the call");
        Ok(())
    });
    let outcome = world.remove(&machine("cp-3", MachineRole::ControlPlane, "10.0.0.13"), &cps()).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "LeaveEtcd" });
    assert_eq!(
        *recorded.lock().unwrap(),
        vec![("5".to_owned(), Some((ConditionStatus::Unknown, reason::ETCD_LEAVE_REQUESTED.to_owned())))]
    );
}

#[tokio::test]
async fn a_stale_read_never_asks_etcd_to_let_a_member_go() {
    // The machine changed since this pass read it (another writer, a replica that lost its
    // lead): the departure's record is a conflict, and no leave is asked for.
    let mut world = World::new(Some(node("cp-3", true)), vec![pod("kube-apiserver-cp-3", "Node", true)]);
    world.talos.expect_etcd_members().returning(|_| Ok(members()));
    world.talos.expect_etcd_status().returning(|node| Ok(status(node)));
    world.talos.expect_etcd_alarms().returning(|_| Ok(vec![]));
    world.kube.expect_write_conditions_at().times(1).returning(|machine, _, _| {
        Err(ConditionWriteError { machine: machine.to_owned(), message: "conflict".into(), transient: true })
    });
    world.talos.expect_etcd_leave_cluster().never();
    let err = world.try_remove(&machine("cp-3", MachineRole::ControlPlane, "10.0.0.13"), &cps()).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
}

#[tokio::test]
async fn a_control_plane_does_not_leave_while_another_is_unreachable() {
    let mut world = World::new(Some(node("cp-3", true)), vec![]);
    world
        .talos
        .expect_etcd_members()
        .with(eq("10.0.0.11"))
        .returning(|_| Err(TalosError::dial("10.0.0.21:50000", "connection refused")));
    world.talos.expect_etcd_members().returning(|_| Ok(members()));
    world.talos.expect_etcd_status().returning(|node| Ok(status(node)));
    world.talos.expect_etcd_alarms().returning(|_| Ok(vec![]));
    world.talos.expect_etcd_leave_cluster().never();
    let outcome = world.remove(&machine("cp-3", MachineRole::ControlPlane, "10.0.0.13"), &cps()).await;
    assert!(matches!(outcome, MachineOutcome::Waiting { ref reason, .. } if reason == "EtcdUnhealthy"), "{outcome:?}");
}

#[tokio::test]
async fn a_deleted_node_is_recorded_removed_without_asking_storage() {
    let mut world = World::new(None, vec![]);
    world.storage = MockStorage::new();
    world.storage.expect_storage_objects().never();
    let outcome = world.remove(&machine("worker-2", MachineRole::Worker, "10.0.0.22"), &[]).await;
    assert_eq!(outcome, MachineOutcome::Converged);
    assert_eq!(world.written(NODE_REMOVAL), vec![(ConditionStatus::True, reason::REMOVED.to_owned())]);
}

#[tokio::test]
async fn a_control_plane_whose_node_is_gone_is_not_removed_while_its_member_votes() {
    // The Node object of cp-3 is gone and cp-3 is down (its Talos API refuses), but the
    // other control planes still list its member: before the fix this reported Removed.
    let mut world = World::new(None, vec![]);
    world.talos = MockTalos::new();
    world
        .talos
        .expect_machine_stage()
        .with(eq("10.0.0.13"))
        .returning(|_| Err(TalosError::dial("10.0.0.13:50000", "connection refused")));
    let down = || TalosError::dial("10.0.0.13:50000", "connection refused");
    world.talos.expect_etcd_members().with(eq("10.0.0.13")).returning(move |_| Err(down()));
    world.talos.expect_etcd_members().returning(|_| Ok(members()));
    world.talos.expect_etcd_status().with(eq("10.0.0.13")).returning(move |_| Err(down()));
    world.talos.expect_etcd_status().returning(|node| Ok(status(node)));
    world.talos.expect_etcd_alarms().with(eq("10.0.0.13")).returning(move |_| Err(down()));
    world.talos.expect_etcd_alarms().returning(|_| Ok(vec![]));
    world.talos.expect_etcd_leave_cluster().never();
    world.kube.expect_write_conditions_at().times(1).returning(|_, version, c| {
        assert_eq!(version, "5");
        let departure = c.get(ETCD_DEPARTURE).unwrap();
        assert_eq!(departure.reason, reason::ETCD_MEMBER_REMOVE_REQUESTED);
        assert!(departure.message.contains("10.0.0.11"), "{}", departure.message);
        Ok(())
    });
    world.talos.expect_etcd_remove_member().with(eq("10.0.0.11"), eq(3)).times(1).returning(|_, _| Ok(()));
    let outcome = world.remove(&machine("cp-3", MachineRole::ControlPlane, "10.0.0.13"), &cps()).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "RemoveEtcdMember" });
    assert!(world.written(NODE_REMOVAL).is_empty(), "not recorded removed");

    // Once the member is gone from the list: removed.
    let mut world = World::new(None, vec![]);
    world
        .talos
        .expect_etcd_members()
        .returning(|_| Ok(members().into_iter().filter(|m| m.hostname != "cp-3").collect()));
    world.talos.expect_etcd_remove_member().never();
    let outcome = world.remove(&machine("cp-3", MachineRole::ControlPlane, "10.0.0.13"), &cps()).await;
    assert_eq!(outcome, MachineOutcome::Converged);
    assert_eq!(world.written(NODE_REMOVAL), vec![(ConditionStatus::True, reason::REMOVED.to_owned())]);
}

/// The authority of a pass that advances `machine` (and nothing else).
fn advancing(machine: &str) -> ichor_executor::effects::Advancing {
    let decision = ichor_upgrade_core::rollout::Decision::advancing([machine.to_owned()]);
    ichor_executor::effects::Advancing::of(machine, &decision).expect("the decision advances it")
}

#[tokio::test]
async fn a_reset_on_a_stale_read_is_never_made() {
    let mut world = World::new(Some(node("worker-2", true)), vec![]);
    world.kube.expect_write_conditions_at().times(1).returning(|machine, _, _| {
        Err(ConditionWriteError { machine: machine.to_owned(), message: "conflict".into(), transient: true })
    });
    world.talos.expect_reset().never();
    let err = world.try_remove(&machine("worker-2", MachineRole::Worker, "10.0.0.22"), &[]).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
}
