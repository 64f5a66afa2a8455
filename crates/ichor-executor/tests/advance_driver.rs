//! mockall tests of `advance_machine`: one per action the step can return, and the call
//! bounds. Time is tokio's paused clock, so bounds are exact and nothing sleeps for real.

use ichor_upgrade_core::evacuation::Scheduling;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ichor_executor::ExecutorConfig;
use ichor_executor::kube_api::{KubeError, MachineInfo, NodeInfo};
use ichor_executor::machine::talos::{AdvanceError, Executor, OperationRef, advance_machine};
use ichor_executor::talos_api::{EtcdAlarm, EtcdMember, EtcdStatus, TalosApi, TalosError, UpgradeAck};
use ichor_executor::writes::{Seal, TalosWrite, TalosWritten};
use ichor_storage::StorageObject;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::{STORAGE_EVACUATION, reason as evac};
use ichor_upgrade_core::machine::talos::UpgradeTarget;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::rollout::{CallAuthority, CallDenied};
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, UpgradeMarker, reason as upgrade};
use ichor_upgrade_core::versions::TalosVersion;
use mockall::predicate::eq;

use crate::support::{FixedClock, MockKube, MockStorage, MockTalos, NOW};

/// The operation every machine here is advanced for.
const TALOS_OP: OperationRef<'static> = OperationRef { kind: "talos", identity: "default/upgrade/uid-1" };
const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
const BOOT_BEFORE: &str = "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11";
const BOOT_AFTER: &str = "7e2d9c40-13b1-4c8f-8d7e-52a0c6f1e3b2";

/// A Talos API whose Upgrade and stage calls take a while before answering as the mock says.
struct Slow {
    inner: MockTalos,
    upgrade_takes: Duration,
    stage_takes: Duration,
}

#[async_trait]
impl TalosApi for Slow {
    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        self.inner.nodename(node).await
    }
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        tokio::time::sleep(self.stage_takes).await;
        self.inner.machine_stage(node).await
    }
    async fn write(&self, node: &str, write: TalosWrite<'_>, seal: Seal) -> Result<TalosWritten, TalosError> {
        match write {
            TalosWrite::Upgrade(_) => tokio::time::sleep(self.upgrade_takes).await,
            TalosWrite::EtcdLeaveCluster | TalosWrite::EtcdRemoveMember { .. } | TalosWrite::Reset(_) => {}
            // What this double never served.
            other => return Err(TalosError::unserved(other.method(), node)),
        }
        self.inner.write(node, write, seal).await
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
}

fn target() -> UpgradeTarget {
    UpgradeTarget {
        version: TalosVersion::parse("v1.14.4").unwrap(),
        schematic: None,
        platform: "metal".into(),
        kubernetes_version: "1.34.1".into(),
    }
}

fn machine(role: MachineRole) -> MachineInfo {
    MachineInfo {
        name: "m-worker-1".into(),
        role,
        hostname: Some("worker-1".into()),
        address: "10.0.0.21".into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        conditions: Conditions::new(),
        resource_version: None,
    }
}

fn node(os_image: &str, boot_id: &str, ready: bool) -> NodeInfo {
    NodeInfo {
        name: "worker-1".into(),
        ready,
        unschedulable: false,
        os_image: os_image.into(),
        boot_id: boot_id.into(),
        labels: [("storage".to_owned(), "longhorn".to_owned())].into(),
        annotations: [("extensions.talos.dev/schematic".to_owned(), SCHEMATIC.to_owned())].into(),
        resource_version: "1".into(),
    }
}

fn marker(boot_id: &str) -> String {
    UpgradeMarker {
        target: TalosVersion::parse("v1.14.4").unwrap(),
        boot_id: boot_id.into(),
        call_deadline: NOW.saturating_add(Duration::from_secs(600)),
        node: Some("worker-1".into()),
    }
    .to_string()
}

/// A machine whose Upgrade call was acknowledged while it ran `BOOT_BEFORE`.
fn requested(role: MachineRole) -> MachineInfo {
    with_condition(
        machine(role),
        TALOS_UPGRADE,
        ConditionStatus::True,
        upgrade::UPGRADE_REQUESTED,
        &marker(BOOT_BEFORE),
    )
}

fn with_condition(
    mut m: MachineInfo,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) -> MachineInfo {
    m.conditions.upsert(ConditionUpdate::new(type_, status, reason, message), Timestamp::from_unix_secs(900));
    m
}

/// Mocks for a node in a given state; writes are captured.
struct World {
    talos: MockTalos,
    kube: MockKube,
    storage: MockStorage,
    writes: Arc<Mutex<Vec<Conditions>>>,
}

impl World {
    fn new(node_info: Option<NodeInfo>, stage: Result<MachineStage, TalosError>) -> Self {
        let mut talos = MockTalos::new();
        talos.expect_machine_stage().with(eq("10.0.0.21")).returning(move |_| stage.clone());
        let mut kube = MockKube::new();
        kube.expect_node().with(eq("worker-1")).returning(move |_| Ok(node_info.clone()));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let captured = Arc::clone(&writes);
        kube.expect_write_conditions().returning(move |machine, conditions| {
            assert_eq!(machine, "m-worker-1");
            captured.lock().unwrap().push(conditions.clone());
            Ok(())
        });
        let mut storage = MockStorage::new();
        storage.expect_storage_objects().returning(|| Ok(Vec::new()));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        Self { talos, kube, storage, writes }
    }

    /// Status and reason of `type_` in each write, in order.
    fn written_of(&self, type_: &str) -> Vec<(ConditionStatus, String)> {
        self.writes
            .lock()
            .unwrap()
            .iter()
            .map(|c| {
                let condition = c.get(type_).unwrap_or_else(|| panic!("a write without {type_}"));
                (condition.status, condition.reason.clone())
            })
            .collect()
    }

    /// `TalosUpgrade` in each write.
    fn written(&self) -> Vec<(ConditionStatus, String)> {
        self.written_of(TALOS_UPGRADE)
    }
}

async fn run(
    talos: &dyn TalosApi,
    world: &World,
    m: &MachineInfo,
    config: &ExecutorConfig,
) -> Result<MachineOutcome, AdvanceError> {
    let ex = Executor {
        talos,
        kube: &world.kube,
        storage: &world.storage,
        clock: &FixedClock,
        config,
        snapshots: None,
        background: None,
    };
    advance_machine(&ex, &advancing(&m.name), TALOS_OP, m, &target(), &CallAuthority::Granted).await
}

#[tokio::test]
async fn kinds_other_than_talos_are_errors_and_touch_nothing() {
    let (talos, kube, storage) = (MockTalos::new(), MockKube::new(), MockStorage::new());
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
    for kind in ["kubernetes", "ichor"] {
        let err = advance_machine(
            &ex,
            &advancing("m"),
            OperationRef { kind, identity: TALOS_OP.identity },
            &machine(MachineRole::Worker),
            &target(),
            &CallAuthority::Granted,
        )
        .await
        .unwrap_err();
        assert_eq!(err, AdvanceError::UnsupportedKind(kind.into()));
        assert!(!err.is_transient());
    }
}

#[tokio::test]
async fn already_on_target_converges_with_one_write_and_no_call() {
    let world = World::new(Some(node("Talos (v1.14.4)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Converged);
    // Its convergence is recorded in its own conditions (the operation keeps no record of
    // each converged machine), once: read back, it converges with no write.
    assert_eq!(world.written(), vec![(ConditionStatus::False, upgrade::CONVERGED.to_owned())]);
    let recorded = MachineInfo { conditions: world.writes.lock().unwrap()[0].clone(), ..machine(MachineRole::Worker) };
    let again = run(&world.talos, &world, &recorded, &ExecutorConfig::default()).await.unwrap();
    assert_eq!(again, MachineOutcome::Converged);
    assert_eq!(world.writes.lock().unwrap().len(), 1, "no second write");
}

#[tokio::test]
async fn the_upgrade_call_writes_the_intent_calls_with_the_factory_image_then_records_the_ack() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let writes = Arc::clone(&world.writes);
    world
        .talos
        .expect_upgrade()
        .withf(|node, request| {
            node == "10.0.0.21"
                && request.image == format!("factory.talos.dev/metal-installer/{SCHEMATIC}:v1.14.4")
                && request.timeout == Duration::from_secs(600)
        })
        .times(1)
        .returning(move |_, _| {
            let intent = writes.lock().unwrap().last().cloned().expect("intent written before the call");
            let c = intent.get(TALOS_UPGRADE).unwrap();
            assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::Unknown, upgrade::UPGRADE_INTENT));
            Ok(UpgradeAck { ack: "Upgrade request received".into(), actor_id: "a-1".into() })
        });
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: "UpgradeRequested" });
    assert_eq!(
        world.written(),
        vec![
            (ConditionStatus::Unknown, upgrade::UPGRADE_INTENT.to_owned()),
            (ConditionStatus::True, upgrade::UPGRADE_REQUESTED.to_owned())
        ]
    );
    let last = world.writes.lock().unwrap().last().unwrap().get(TALOS_UPGRADE).unwrap().message.clone();
    assert_eq!(UpgradeMarker::parse(&last).unwrap().boot_id, BOOT_BEFORE, "the boot ID read just before the call");
}

#[tokio::test(start_paused = true)]
async fn an_upgrade_call_longer_than_the_short_bound_is_not_failed_by_it() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let mut inner = MockTalos::new();
    inner.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    inner.expect_upgrade().times(1).returning(|_, _| Ok(UpgradeAck { ack: "ok".into(), actor_id: "a".into() }));
    world.talos = MockTalos::new();
    let slow = Slow { inner, upgrade_takes: Duration::from_secs(4 * 60), stage_takes: Duration::ZERO };
    let outcome = run(&slow, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: "UpgradeRequested" }, "4 minutes > 15 s, < 10 minutes");
}

#[tokio::test(start_paused = true)]
async fn an_upgrade_call_past_its_own_bound_pauses_with_the_node_untouched() {
    let world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let mut inner = MockTalos::new();
    inner.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    inner.expect_upgrade().never();
    let slow = Slow { inner, upgrade_takes: Duration::from_secs(11 * 60), stage_takes: Duration::ZERO };
    let outcome = run(&slow, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    let MachineOutcome::Failed { reason, message } = outcome else { panic!("{outcome:?}") };
    assert_eq!(reason, "UpgradeCallTimedOut");
    assert!(message.contains("600s"), "{message}");
    assert_eq!(
        world.written(),
        vec![(ConditionStatus::Unknown, upgrade::UPGRADE_INTENT.to_owned())],
        "the intent stays: an acknowledgement at the very edge would still be recognised"
    );
}

#[tokio::test(start_paused = true)]
async fn the_bounds_are_configuration() {
    let world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let mut inner = MockTalos::new();
    inner.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    inner.expect_upgrade().never();
    let slow = Slow { inner, upgrade_takes: Duration::from_secs(61), stage_takes: Duration::ZERO };
    let config = ExecutorConfig::default().with_upgrade_call_timeout(Duration::from_secs(60));
    let outcome = run(&slow, &world, &machine(MachineRole::Worker), &config).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Failed { ref reason, .. } if reason == "UpgradeCallTimedOut"));
}

#[tokio::test(start_paused = true)]
async fn an_ordinary_call_past_the_short_bound_is_unreachable_not_a_failure() {
    let world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let mut inner = MockTalos::new();
    inner.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    inner.expect_upgrade().never();
    let slow = Slow { inner, upgrade_takes: Duration::ZERO, stage_takes: Duration::from_secs(16) };
    let outcome = run(&slow, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(outcome, MachineOutcome::Waiting { ref reason, .. } if reason == "TalosApiUnreachable"),
        "{outcome:?}"
    );
    let config = ExecutorConfig::default().with_call_timeout(Duration::from_secs(20));
    let world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let mut inner = MockTalos::new();
    inner.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
    inner.expect_upgrade().times(1).returning(|_, _| Ok(UpgradeAck { ack: "ok".into(), actor_id: "a".into() }));
    let slow = Slow { inner, upgrade_takes: Duration::ZERO, stage_takes: Duration::from_secs(16) };
    let outcome = run(&slow, &world, &machine(MachineRole::Worker), &config).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: "UpgradeRequested" }, "a 20 s bound lets 16 s pass");
}

#[tokio::test]
async fn an_answered_upgrade_error_closes_the_intent_and_fails() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_upgrade().times(1).returning(|_, _| {
        Err(TalosError::Answered { code: "Unknown".into(), message: "failed to pull installer image".into() })
    });
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(outcome, MachineOutcome::Failed { ref reason, ref message } if reason == "UpgradeRefused" && message.contains("pull"))
    );
    assert_eq!(world.written().last().unwrap(), &(ConditionStatus::False, upgrade::UPGRADE_REFUSED.to_owned()));
}

#[tokio::test]
async fn a_transport_error_during_the_call_leaves_the_intent_for_the_node_to_settle() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_upgrade().times(1).returning(|_, _| Err(TalosError::transport("stream reset")));
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(outcome, MachineOutcome::Waiting { ref reason, recheck_at: Some(_), .. } if reason == "IntentUnconfirmed")
    );
    assert_eq!(world.written(), vec![(ConditionStatus::Unknown, upgrade::UPGRADE_INTENT.to_owned())]);
}

#[tokio::test]
async fn dial_errors_after_the_call_count_as_rebooting() {
    let world = World::new(
        Some(node("Talos (v1.14.3)", BOOT_BEFORE, false)),
        Err(TalosError::dial("10.0.0.21:50000", "connection refused")),
    );
    let m = requested(MachineRole::Worker);
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Waiting { ref reason, .. } if reason == "NotRebootedYet"), "{outcome:?}");
    assert!(world.written().is_empty());
}

#[tokio::test]
async fn an_ab_fallback_fails_and_is_never_converged() {
    let world = World::new(Some(node("Talos (v1.14.3)", BOOT_AFTER, true)), Ok(MachineStage::Running));
    let m = requested(MachineRole::Worker);
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Failed { ref reason, .. } if reason == "AbFallback"));
    assert!(world.written().is_empty());
}

#[tokio::test]
async fn a_verified_control_plane_records_convergence() {
    let mut world = World::new(Some(node("Talos (v1.14.4)", BOOT_AFTER, true)), Ok(MachineStage::Running));
    world
        .talos
        .expect_etcd_members()
        .times(1)
        .returning(|_| Ok(vec![EtcdMember { id: 7, hostname: "worker-1".into(), is_learner: false }]));
    let m = requested(MachineRole::ControlPlane);
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Converged);
    assert_eq!(world.written(), vec![(ConditionStatus::False, upgrade::CONVERGED.to_owned())]);
}

#[tokio::test]
async fn a_control_plane_whose_member_is_a_learner_waits() {
    let mut world = World::new(Some(node("Talos (v1.14.4)", BOOT_AFTER, true)), Ok(MachineStage::Running));
    world
        .talos
        .expect_etcd_members()
        .returning(|_| Ok(vec![EtcdMember { id: 7, hostname: "worker-1".into(), is_learner: true }]));
    let m = requested(MachineRole::ControlPlane);
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Waiting { ref reason, .. } if reason == "EtcdMemberLearner"));
}

fn longhorn() -> StorageObject {
    StorageObject {
        name: "longhorn".into(),
        node_selector: ichor_storage::LabelSelector {
            match_labels: [("storage".to_owned(), "longhorn".to_owned())].into(),
            ..Default::default()
        },
        evacuation_timeout: None,
    }
}

/// Storage that selects the node (a `longhorn` object), with `replicas` left on it.
fn storage_selecting(world: &mut World, replicas: u32) {
    world.storage = MockStorage::new();
    world.storage.expect_storage_objects().returning(|| Ok(vec![longhorn()]));
    world.storage.expect_evacuation_record().returning(|_| Ok(None));
    world.storage.expect_replicas_on().returning(move |_| Ok(replicas));
}

#[tokio::test]
async fn storage_selecting_the_node_begins_an_evacuation_before_any_call() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    storage_selecting(&mut world, 4);
    world
        .storage
        .expect_request_evacuation()
        .with(eq("worker-1"), eq(NOW))
        .times(1)
        .returning(|_, _| Ok(ichor_storage::EvacuationRequest::Requested { before: Scheduling::ON }));
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: "BeginEvacuation" });
    // Decision 0011: the backend's write is the record; the conditions are not written.
    assert!(world.writes.lock().unwrap().is_empty(), "no conditions write");
}

/// Storage selecting the node, with `replicas` left and the backend's record of an
/// evacuation begun at `since` (by a pass before a crash, say).
fn storage_recording(world: &mut World, replicas: u32, before: Scheduling, since: Timestamp) {
    world.storage = MockStorage::new();
    world.storage.expect_storage_objects().returning(|| Ok(vec![longhorn()]));
    world.storage.expect_replicas_on().returning(move |_| Ok(replicas));
    let record = ichor_upgrade_core::evacuation::EvacuationRecord { before, since: Some(since), bytes: None };
    world.storage.expect_evacuation_record().with(eq("worker-1")).returning(move |_| Ok(Some(record)));
}

#[tokio::test]
async fn an_evacuation_only_the_backend_records_is_awaited_from_its_time_never_begun_again() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let since = Timestamp::from_unix_millis(NOW.unix_millis() - 60_000);
    storage_recording(&mut world, 3, Scheduling::ON, since);
    world.storage.expect_request_evacuation().never();
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    let MachineOutcome::Waiting { reason, recheck_at, .. } = outcome else { panic!("{outcome:?}") };
    assert_eq!(reason, "Evacuating");
    let timeout = ExecutorConfig::default().step.evacuation;
    assert!(recheck_at.is_some_and(|t| t <= since.saturating_add(timeout)), "the deadline counts from the record");
    assert!(world.writes.lock().unwrap().is_empty(), "a wait writes nothing");
}

#[tokio::test]
async fn the_upgrade_intent_carries_the_evacuation_the_backend_recorded_with_its_scheduling_and_time() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let since = Timestamp::from_unix_millis(NOW.unix_millis() - 60_000);
    let before = Scheduling { allowed: false, eviction_requested: false };
    storage_recording(&mut world, 0, before, since);
    world.talos.expect_upgrade().times(1).returning(|_, _| Ok(UpgradeAck { ack: "ok".into(), actor_id: "a".into() }));
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: "UpgradeRequested" });
    let writes = world.writes.lock().unwrap();
    let intent = writes.first().expect("the intent");
    let c = intent.get(STORAGE_EVACUATION).expect("the evacuation rides with the intent");
    assert_eq!((c.status, c.reason.as_str(), c.last_transition_time), (ConditionStatus::True, evac::EVACUATING, since));
    assert_eq!(ichor_upgrade_core::evacuation::scheduling_to_restore(intent), before);
    assert!(writes.iter().all(|w| w.is_true(STORAGE_EVACUATION)), "every later write keeps it");
}

#[tokio::test]
async fn a_converged_machine_ends_an_evacuation_only_the_backend_records() {
    // Begun, then the node was found on the target before its call (upgraded by hand).
    let mut world = World::new(Some(node("Talos (v1.14.4)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    let before = Scheduling { allowed: false, eviction_requested: true };
    storage_recording(&mut world, 3, before, NOW);
    world.storage.expect_restore_scheduling().with(eq("worker-1"), eq(before)).times(1).returning(|_, _| Ok(()));
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Progressed { .. } | MachineOutcome::Converged), "{outcome:?}");
    assert_eq!(world.written_of(STORAGE_EVACUATION).last().map(|w| w.0), Some(ConditionStatus::False));
}

// Issue 17: a node that storage selects but Longhorn has no Node object for paused the
// operation (the eviction patch's 404 was a failure).
#[tokio::test]
async fn a_node_the_storage_system_lacks_is_said_once_and_does_not_pause() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    storage_selecting(&mut world, 0);
    world
        .storage
        .expect_request_evacuation()
        .times(1)
        .returning(|_, _| Ok(ichor_storage::EvacuationRequest::NoSuchNode));
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: ichor_executor::machine::talos::NO_STORAGE_NODE });
    assert_eq!(world.written_of(STORAGE_EVACUATION), vec![(ConditionStatus::True, evac::EVACUATING.to_owned())]);
}

#[tokio::test]
async fn an_evacuation_past_its_timeout_re_enables_scheduling_and_fails() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    storage_selecting(&mut world, 2);
    world
        .storage
        .expect_restore_scheduling()
        .with(eq("worker-1"), eq(Scheduling::ON))
        .times(1)
        .returning(|_, _| Ok(()));
    world.talos.expect_upgrade().never();
    let mut m = machine(MachineRole::Worker);
    m.conditions.upsert(
        ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, ""),
        Timestamp::from_unix_secs(-1_000),
    );
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Failed { ref reason, .. } if reason == "EvacuationTimedOut"));
    assert_eq!(world.written_of(STORAGE_EVACUATION), vec![(ConditionStatus::False, evac::TIMED_OUT.to_owned())]);
}

#[tokio::test]
async fn a_verified_machine_gets_storage_scheduling_back_and_converges_in_one_write() {
    let mut world = World::new(Some(node("Talos (v1.14.4)", BOOT_AFTER, true)), Ok(MachineStage::Running));
    storage_selecting(&mut world, 0);
    world
        .storage
        .expect_restore_scheduling()
        .with(eq("worker-1"), eq(Scheduling::ON))
        .times(1)
        .returning(|_, _| Ok(()));
    let m = requested(MachineRole::Worker);
    let m = with_condition(m, STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, "");
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Converged);
    assert_eq!(world.written_of(STORAGE_EVACUATION), vec![(ConditionStatus::False, evac::ENDED.to_owned())]);
    assert_eq!(world.written(), vec![(ConditionStatus::False, upgrade::CONVERGED.to_owned())]);
    assert_eq!(world.writes.lock().unwrap().len(), 1, "both conditions in one write");
}

#[tokio::test]
async fn the_node_name_comes_from_talos_when_the_hostname_is_unset() {
    let mut world = World::new(Some(node("Talos (v1.14.4)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_nodename().with(eq("10.0.0.21")).times(1).returning(|_| Ok("worker-1".into()));
    let mut m = machine(MachineRole::Worker);
    m.hostname = None;
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert_eq!(outcome, MachineOutcome::Converged);
}

#[tokio::test]
async fn an_unreadable_nodename_is_transient_when_unreachable_and_a_failure_when_answered() {
    let mut world = World::new(None, Ok(MachineStage::Running));
    world.talos.expect_nodename().returning(|_| Err(TalosError::dial("10.0.0.21:50000", "connection refused")));
    let mut m = machine(MachineRole::Worker);
    m.hostname = None;
    let err = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap_err();
    assert!(err.is_transient());
    let retry_at = Timestamp::from_unix_millis(5_000);
    assert!(
        matches!(err.outcome(retry_at), MachineOutcome::Waiting { recheck_at: Some(t), .. } if t == retry_at),
        "a transient error is looked at again at its retry time, not left to a watch"
    );

    let mut world = World::new(None, Ok(MachineStage::Running));
    world
        .talos
        .expect_nodename()
        .returning(|_| Err(TalosError::Answered { code: "PermissionDenied".into(), message: "not allowed".into() }));
    let err = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap_err();
    assert!(!err.is_transient());
    assert!(matches!(err.outcome(Timestamp::from_unix_millis(0)), MachineOutcome::Failed { .. }));
}

#[tokio::test]
async fn a_kubernetes_read_error_is_typed_and_classified() {
    let mut world = World::new(None, Ok(MachineStage::Running));
    world.kube = MockKube::new();
    world.kube.expect_node().returning(|_| Err(KubeError::Unreachable("connection refused".into())));
    let err = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap_err();
    assert!(matches!(err, AdvanceError::ReadNode { .. }));
    assert!(err.is_transient());
}

#[tokio::test]
async fn bad_input_a_node_without_schematic_fails_before_any_call() {
    let mut n = node("Talos (v1.14.3)", BOOT_BEFORE, true);
    n.annotations.clear();
    let mut world = World::new(Some(n), Ok(MachineStage::Running));
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Failed { ref reason, .. } if reason == "NoSchematic"));
    assert!(world.written().is_empty());
}

#[tokio::test]
async fn bad_input_a_garbled_marker_fails_and_never_calls() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_upgrade().never();
    let m = with_condition(
        machine(MachineRole::Worker),
        TALOS_UPGRADE,
        ConditionStatus::True,
        "UpgradeRequested",
        "garbage",
    );
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(outcome, MachineOutcome::Failed { ref reason, ref message } if reason == "GarbledUpgradeMarker" && message.contains("\"garbage\""))
    );
}

fn tls_refused() -> TalosError {
    TalosError::Tls {
        endpoint: "10.0.0.11:50000".into(),
        cause: ichor_executor::Cause::message("TLS handshake: received fatal alert: CertificateExpired"),
    }
}

fn apid_unavailable() -> TalosError {
    TalosError::answer("Unavailable", "connection error: dial tcp 10.0.0.21:50000: connect: connection refused")
}

#[tokio::test]
async fn a_certificate_problem_before_the_call_fails_the_machine_naming_the_cause() {
    // With spec.hostname: the stage read fails TLS.
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Err(tls_refused()));
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(&outcome, MachineOutcome::Failed { reason, message } if reason == "TalosApiError" && message.contains("CertificateExpired")),
        "{outcome:?}"
    );
    // Without: the node-name read fails TLS; not "still rebooting", a failure with its cause.
    let mut world = World::new(None, Ok(MachineStage::Running));
    world.talos.expect_nodename().returning(|_| Err(tls_refused()));
    let mut m = machine(MachineRole::Worker);
    m.hostname = None;
    let err = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap_err();
    assert!(!err.is_transient(), "{err:?}");
    assert!(
        matches!(err.outcome(Timestamp::from_unix_millis(0)), MachineOutcome::Failed { ref message, .. } if message.contains("CertificateExpired")),
        "{:?}",
        err.outcome(Timestamp::from_unix_millis(0))
    );
}

#[tokio::test]
async fn apids_unavailable_before_the_call_is_a_wait_not_a_failure() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Err(apid_unavailable()));
    world.talos.expect_upgrade().never();
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == "TalosApiUnreachable"),
        "{outcome:?}"
    );
    let mut world = World::new(None, Ok(MachineStage::Running));
    world.talos.expect_nodename().returning(|_| Err(apid_unavailable()));
    let mut m = machine(MachineRole::Worker);
    m.hostname = None;
    let err = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
}

#[tokio::test]
async fn an_upgrade_answered_unavailable_leaves_the_intent_open() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_upgrade().times(1).returning(|_, _| Err(apid_unavailable()));
    let outcome = run(&world.talos, &world, &machine(MachineRole::Worker), &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == "IntentUnconfirmed"),
        "the node may have the call: {outcome:?}"
    );
    assert_eq!(world.written(), vec![(ConditionStatus::Unknown, upgrade::UPGRADE_INTENT.to_owned())]);
}

#[tokio::test]
async fn the_intent_records_the_node_name_read_before_the_call() {
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_nodename().returning(|_| Ok("worker-1".into()));
    world.talos.expect_upgrade().times(1).returning(|_, _| Ok(UpgradeAck { ack: "ok".into(), actor_id: "a".into() }));
    let mut m = machine(MachineRole::Worker);
    m.hostname = None;
    run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    let written = world.writes.lock().unwrap().last().unwrap().get(TALOS_UPGRADE).unwrap().message.clone();
    assert_eq!(UpgradeMarker::parse(&written).unwrap().node.as_deref(), Some("worker-1"), "{written}");
}

#[tokio::test]
async fn past_the_call_a_node_name_error_is_rebooting_and_the_recorded_name_is_used() {
    // Any error reading the name past the call (apid's Unavailable, even an answered one):
    // a wait, with the Node read under the name recorded before the call.
    for error in [apid_unavailable(), TalosError::Answered { code: "Internal".into(), message: "booting".into() }] {
        let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, false)), Err(apid_unavailable()));
        world.talos.expect_nodename().returning(move |_| Err(error.clone()));
        world.talos.expect_upgrade().never();
        let mut m = requested(MachineRole::Worker);
        m.hostname = None;
        let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
        assert!(
            matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == "Rebooting" || reason == "NotRebootedYet"),
            "{outcome:?}"
        );
        assert!(world.written().is_empty());
    }
    // A marker written before names were recorded: no Node read, still a wait, under the
    // verify bound.
    let old_marker = UpgradeMarker { node: None, ..UpgradeMarker::parse(&marker(BOOT_BEFORE)).unwrap() }.to_string();
    let mut world = World::new(None, Err(apid_unavailable()));
    world.kube = MockKube::new();
    world.kube.expect_node().never();
    world.talos.expect_nodename().returning(|_| Err(apid_unavailable()));
    let mut m = with_condition(
        machine(MachineRole::ControlPlane),
        TALOS_UPGRADE,
        ConditionStatus::True,
        upgrade::UPGRADE_REQUESTED,
        &old_marker,
    );
    m.hostname = None;
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, recheck_at: Some(_), .. } if reason == "Rebooting"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn no_upgrade_call_goes_out_without_the_authority_of_this_pass() {
    let denied = CallDenied::ControlPlaneNotReady { nodes: vec!["cp-2".into()] };
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos.expect_upgrade().never();
    world
        .talos
        .expect_etcd_members()
        .returning(|_| Ok(vec![EtcdMember { id: 1, hostname: "worker-1".into(), is_learner: false }]));
    let ex = Executor {
        snapshots: None,
        background: None,
        talos: &world.talos,
        kube: &world.kube,
        storage: &world.storage,
        clock: &FixedClock,
        config: &ExecutorConfig::default(),
    };
    // A control plane whose intent went void (deadline passed, no sign of the call) while
    // another control plane went NotReady: the review saw the call made again.
    let void = with_condition(
        machine(MachineRole::ControlPlane),
        TALOS_UPGRADE,
        ConditionStatus::Unknown,
        upgrade::UPGRADE_INTENT,
        &marker(BOOT_BEFORE).replace("call-deadline-ms=1600000", "call-deadline-ms=950000"),
    );
    // The void intent is closed first (whatever the authority); then nothing is called
    // without the authority of the pass.
    let outcome = advance_machine(
        &ex,
        &advancing(&void.name),
        TALOS_OP,
        &void,
        &target(),
        &CallAuthority::Denied(denied.clone()),
    )
    .await
    .unwrap();
    assert_eq!(outcome, MachineOutcome::Progressed { action: "CloseVoidIntent" });
    assert_eq!(world.written(), vec![(ConditionStatus::False, upgrade::INTENT_VOID.to_owned())]);
    let closed = MachineInfo { conditions: world.writes.lock().unwrap()[0].clone(), ..void };
    let outcome =
        advance_machine(&ex, &advancing(&closed.name), TALOS_OP, &closed, &target(), &CallAuthority::Denied(denied))
            .await
            .unwrap();
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, message, .. } if reason == "CallNotAuthorised" && message.contains("cp-2")),
        "{outcome:?}"
    );
    let outcome =
        advance_machine(&ex, &advancing(&closed.name), TALOS_OP, &closed, &target(), &CallAuthority::NeedsEtcdGate)
            .await
            .unwrap();
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == "EtcdGateNotChecked"),
        "{outcome:?}"
    );
    assert_eq!(world.written().len(), 1, "no intent written without the authority");
}

#[tokio::test]
async fn an_acknowledged_call_not_rebooted_yet_asks_neither_talos_nor_etcd_nor_storage() {
    // A node in its reboot does not answer until its dial timeout: a pass that asked it
    // would wait that long for every other machine.
    let mut world = World::new(Some(node("Talos (v1.14.3)", BOOT_BEFORE, true)), Ok(MachineStage::Running));
    world.talos = MockTalos::new();
    world.talos.expect_machine_stage().never();
    world.talos.expect_etcd_members().never();
    world.talos.expect_upgrade().never();
    world.storage = MockStorage::new();
    world.storage.expect_replicas_on().never();
    world.storage.expect_evacuation_record().never();
    world.storage.expect_storage_objects().never();
    let m = requested(MachineRole::ControlPlane);
    let outcome = run(&world.talos, &world, &m, &ExecutorConfig::default()).await.unwrap();
    assert!(matches!(outcome, MachineOutcome::Waiting { ref reason, .. } if reason == "NotRebootedYet"), "{outcome:?}");
    assert!(world.written().is_empty());
}

/// The authority of a pass that advances `machine` (and nothing else).
fn advancing(machine: &str) -> ichor_executor::effects::Advancing {
    let decision = ichor_upgrade_core::rollout::Decision::advancing([machine.to_owned()]);
    ichor_executor::effects::Advancing::of(machine, &decision).expect("the decision advances it")
}
