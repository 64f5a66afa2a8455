//! The lifecycle executor's driver against mockall doubles: what each action calls and
//! writes, in order, and how each answer of Talos is classified (an installer exit code is
//! a typed failure, a stream broken off a wait, a reboot's record before its call).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{FixedClock, MockKube, MockStorage, MockTalos, NOW};
use ichor_executor::config::ExecutorConfig;
use ichor_executor::kube_api::{MachineInfo, NodeInfo, PodInfo};
use ichor_executor::machine::lifecycle::DRAIN_STOPPED;
use ichor_executor::talos_api::{InstallOutcome, TalosError};
use ichor_executor::{Executor, OperationRef, advance_machine_with};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::machine::lifecycle::{CORDONED_ANNOTATION, ExecutorChoice, cordon_annotation, reason};
use ichor_upgrade_core::machine::talos::UpgradeTarget;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use ichor_upgrade_core::machine::vocabulary::TALOS_LIFECYCLE;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::rollout::{CallAuthority, CallDenied};
use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::status::OperationStatus;
use ichor_upgrade_core::status::{MachineRecord, RecordState};
use ichor_upgrade_core::upgrade_marker::UpgradeMarker;
use ichor_upgrade_core::versions::TalosVersion;
use mockall::predicate::eq;

/// The operation every machine here is advanced for.
const OPERATION: OperationRef<'static> = OperationRef { kind: "talos", identity: "default/upgrade/uid-1" };
const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
const IMAGE: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";
const BOOT: &str = "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11";

fn target() -> UpgradeTarget {
    UpgradeTarget {
        version: TalosVersion::parse("v1.14.4").unwrap(),
        schematic: None,
        platform: "metal".into(),
        kubernetes_version: "1.34.1".into(),
    }
}

fn machine(conditions: Conditions) -> MachineInfo {
    MachineInfo {
        name: "m-worker-1".into(),
        role: MachineRole::Worker,
        hostname: Some("worker-1".into()),
        address: "10.0.0.21".into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        conditions,
        resource_version: None,
    }
}

fn node(unschedulable: bool, ours: bool) -> NodeInfo {
    let mut annotations: BTreeMap<String, String> =
        [("extensions.talos.dev/schematic".to_owned(), SCHEMATIC.to_owned())].into();
    if ours {
        annotations.insert(CORDONED_ANNOTATION.to_owned(), cordon_annotation(NOW, OPERATION.identity));
    }
    NodeInfo {
        name: "worker-1".into(),
        ready: true,
        unschedulable,
        os_image: "Talos (v1.14.3)".into(),
        boot_id: BOOT.into(),
        labels: BTreeMap::new(),
        annotations,
        resource_version: "41".into(),
    }
}

fn lifecycle(status: ConditionStatus, reason: &str) -> Conditions {
    let marker = UpgradeMarker {
        target: TalosVersion::parse("v1.14.4").unwrap(),
        boot_id: BOOT.into(),
        call_deadline: NOW.saturating_add(Duration::from_secs(600)),
        node: Some("worker-1".into()),
    };
    let mut conditions = Conditions::new();
    conditions.upsert(
        ConditionUpdate::new(TALOS_LIFECYCLE, status, reason, marker.to_string()),
        Timestamp::from_unix_secs(900),
    );
    conditions
}

struct World {
    talos: MockTalos,
    kube: MockKube,
    storage: MockStorage,
    writes: Arc<Mutex<Vec<Conditions>>>,
    /// What the client's pod store shows (none unless a test puts some there).
    cached: Arc<Mutex<Vec<PodInfo>>>,
}

impl World {
    fn new(node: NodeInfo) -> Self {
        let mut talos = MockTalos::new();
        talos.expect_machine_stage().returning(|_| Ok(MachineStage::Running));
        let mut kube = MockKube::new();
        kube.expect_node().with(eq("worker-1")).returning(move |_| Ok(Some(node.clone())));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let captured = Arc::clone(&writes);
        kube.expect_write_conditions().returning(move |_, conditions| {
            captured.lock().unwrap().push(conditions.clone());
            Ok(())
        });
        let cached = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::clone(&cached);
        kube.expect_cached_pods_on().returning(move |_| Ok(store.lock().unwrap().clone()));
        let mut storage = MockStorage::new();
        storage.expect_storage_objects().returning(|| Ok(Vec::new()));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        Self { talos, kube, storage, writes, cached }
    }

    /// `TalosLifecycle` in each write: status and reason.
    fn written(&self) -> Vec<(ConditionStatus, String)> {
        self.writes
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.get(TALOS_LIFECYCLE).map(|c| (c.status, c.reason.clone())).expect("TalosLifecycle written"))
            .collect()
    }

    async fn advance(&self, m: &MachineInfo, finish: CallAuthority) -> MachineOutcome {
        let config = ExecutorConfig::default().with_executor(ExecutorChoice::Lifecycle);
        let ex = Executor {
            talos: &self.talos,
            kube: &self.kube,
            storage: &self.storage,
            clock: &FixedClock,
            config: &config,
            snapshots: None,
            background: None,
        };
        advance_machine_with(&ex, &advancing(&m.name), OPERATION, m, &target(), &CallAuthority::Granted, &finish)
            .await
            .unwrap_or_else(|e| e.outcome(ex.retry_at()))
    }
}

fn installed_with(exit_code: i32, output: &[&str]) -> World {
    let mut world = World::new(node(false, false));
    world
        .talos
        .expect_image_pull()
        .withf(|node, r| node == "10.0.0.21" && r.image == IMAGE)
        .returning(|_, r| Ok(r.image.clone()));
    let output: Vec<String> = output.iter().map(|s| (*s).to_owned()).collect();
    world
        .talos
        .expect_lifecycle_upgrade()
        .withf(|node, r| node == "10.0.0.21" && r.image == IMAGE && r.timeout <= Duration::from_secs(600))
        .times(1)
        .returning(move |_, _| Ok(InstallOutcome { exit_code, output: output.clone() }));
    world
}

#[tokio::test]
async fn the_install_pulls_then_writes_its_intent_then_records_exit_code_0() {
    let world = installed_with(0, &["upgrade successful"]);
    let outcome = world.advance(&machine(Conditions::new()), CallAuthority::Granted).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "Installed" });
    assert_eq!(
        world.written(),
        vec![
            (ConditionStatus::Unknown, reason::INSTALL_INTENT.to_owned()),
            (ConditionStatus::True, reason::INSTALLED.to_owned())
        ]
    );
}

#[tokio::test]
async fn an_installer_exit_code_is_a_typed_failure_recorded_with_its_output() {
    let world = installed_with(4, &["host version check failed"]);
    let outcome = world.advance(&machine(Conditions::new()), CallAuthority::Granted).await;
    let MachineOutcome::Failed { reason: failed, message } = outcome else { panic!("{outcome:?}") };
    assert_eq!(failed, "InstallEnvironment");
    assert!(message.contains("code 4") && message.contains("host version check failed"), "{message}");
    assert_eq!(world.written().last(), Some(&(ConditionStatus::False, reason::INSTALL_FAILED.to_owned())));
}

#[tokio::test]
async fn an_install_stream_broken_off_leaves_the_intent_and_waits() {
    let mut world = World::new(node(false, false));
    world.talos.expect_image_pull().returning(|_, r| Ok(r.image.clone()));
    world.talos.expect_lifecycle_upgrade().returning(|_, _| Err(TalosError::transport("stream reset")));
    let outcome = world.advance(&machine(Conditions::new()), CallAuthority::Granted).await;
    assert!(matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == "InstallUnderWay"), "{outcome:?}");
    assert_eq!(world.written(), vec![(ConditionStatus::Unknown, reason::INSTALL_INTENT.to_owned())]);
}

#[tokio::test]
async fn a_pull_the_registry_refuses_fails_before_anything_is_written() {
    let mut world = World::new(node(false, false));
    world.talos.expect_image_pull().returning(|_, _| Err(TalosError::answer("NotFound", "manifest unknown")));
    let outcome = world.advance(&machine(Conditions::new()), CallAuthority::Granted).await;
    assert!(
        matches!(&outcome, MachineOutcome::Failed { reason, message } if reason == "PullFailed" && message.contains("manifest unknown")),
        "{outcome:?}"
    );
    assert!(world.written().is_empty());
}

#[tokio::test]
async fn an_installed_machine_is_cordoned_with_the_engines_annotation() {
    let mut world = World::new(node(false, false));
    world.kube.expect_pods_on().returning(|_| Ok(Vec::new()));
    world
        .kube
        .expect_cordon()
        .withf(|read, annotation| {
            read.name == "worker-1"
                && read.resource_version == "41"
                && annotation == cordon_annotation(NOW, OPERATION.identity)
        })
        .times(1)
        .returning(|_, _| Ok(()));
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "Cordon" });
}

/// The operation as a fresh read shows it, holding the lock, with m-worker-1's record in
/// `state` (issue 53 item 8: the drain reads it again after its cordon).
fn operation_read_again(kube: &mut MockKube, state: RecordState) {
    use ichor_executor::kube_api::{LeaseInfo, OperationInfo};
    let mut status = OperationStatus::default();
    status.machines.insert(
        "m-worker-1".into(),
        MachineRecord { state, reason: "Installed".into(), message: String::new(), recheck_at: None },
    );
    let operation = OperationInfo {
        name: "upgrade".into(),
        identity: OPERATION.identity.into(),
        cluster: "prod".into(),
        generation: 1,
        deleting: false,
        annotations: BTreeMap::new(),
        spec: OperationSpec::talos("v1.14.4", 1),
        maintenance: None,
        gates: None,
        status,
    };
    kube.expect_operation().with(eq("upgrade")).returning(move |_| Ok(Some(operation.clone())));
    kube.expect_lease().with(eq("prod")).returning(|_| {
        Ok(Some(LeaseInfo {
            holder: Some(OPERATION.identity.into()),
            renewed_at: NOW,
            duration: Duration::from_secs(120),
            resource_version: "7".into(),
        }))
    });
}

/// Issue 53 item 8: a failure recorded after the pass read the operation (between the
/// cordon and the drain) is seen by a fresh read before any eviction.
#[tokio::test]
async fn a_drain_after_the_machine_failed_evicts_nothing_and_waits() {
    let mut world = World::new(node(true, true));
    operation_read_again(&mut world.kube, RecordState::Failed);
    world.kube.expect_pods_on().returning(|_| {
        Ok(vec![PodInfo {
            namespace: "billing".into(),
            name: "api-1".into(),
            owner_kinds: vec!["ReplicaSet".into()],
            mirror: false,
            terminating: false,
            uid: None,
        }])
    });
    world.kube.expect_evict().never();
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, recheck_at: None, message }
            if reason == DRAIN_STOPPED && message.contains("failed")),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_drain_evicts_what_a_drain_evicts_and_a_budget_is_a_wait() {
    let mut world = World::new(node(true, true));
    operation_read_again(&mut world.kube, RecordState::InProgress);
    world.kube.expect_pods_on().returning(|_| {
        let pod = |name: &str, owner: &str, mirror: bool| PodInfo {
            namespace: "billing".into(),
            name: name.into(),
            owner_kinds: vec![owner.into()],
            mirror,
            terminating: false,
            uid: None,
        };
        Ok(vec![pod("api-1", "ReplicaSet", false), pod("cilium-1", "DaemonSet", false), pod("static", "Node", true)])
    });
    world
        .kube
        .expect_evict()
        .with(eq("billing"), eq("api-1"), eq(None))
        .times(1)
        .returning(|_, _, _| Ok(ichor_executor::kube_api::Eviction::Blocked { message: "disruption budget".into() }));
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert!(
        matches!(&outcome, MachineOutcome::Waiting { reason, recheck_at: Some(_), .. } if reason == "EvictionBlocked"),
        "{outcome:?}"
    );
}

fn api_pod(uid: &str) -> PodInfo {
    PodInfo {
        namespace: "billing".into(),
        name: "api-1".into(),
        owner_kinds: vec!["ReplicaSet".into()],
        mirror: false,
        terminating: false,
        uid: Some(uid.into()),
    }
}

/// Issue 57 item 1: the pods the store shows are evicted from it, with no list, each under
/// its UID as the store saw it.
#[tokio::test]
async fn pods_the_store_shows_are_evicted_under_their_uid_without_a_list() {
    let mut world = World::new(node(true, true));
    operation_read_again(&mut world.kube, RecordState::InProgress);
    world.cached.lock().unwrap().push(api_pod("uid-7"));
    world.kube.expect_pods_on().never();
    world
        .kube
        .expect_evict()
        .with(eq("billing"), eq("api-1"), eq(Some("uid-7".to_owned())))
        .times(1)
        .returning(|_, _, _| Ok(ichor_executor::kube_api::Eviction::Evicted));
    world.talos.expect_reboot().never();
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "Drain" });
}

/// Issue 57 item 1: a store that shows the node empty is not taken at its word before the
/// reboot: the API server's list, which still has a pod the store has not seen, decides.
#[tokio::test]
async fn a_store_that_shows_no_pods_is_read_again_before_the_reboot() {
    let mut world = World::new(node(true, true));
    operation_read_again(&mut world.kube, RecordState::InProgress);
    world.kube.expect_pods_on().with(eq("worker-1")).times(1).returning(|_| Ok(vec![api_pod("uid-8")]));
    world
        .kube
        .expect_evict()
        .with(eq("billing"), eq("api-1"), eq(Some("uid-8".to_owned())))
        .times(1)
        .returning(|_, _, _| Ok(ichor_executor::kube_api::Eviction::Evicted));
    world.talos.expect_reboot().never();
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "Drain" });
}

#[tokio::test]
async fn a_drained_machine_records_its_reboot_before_the_call() {
    let mut world = World::new(node(true, true));
    world.kube.expect_pods_on().returning(|_| Ok(Vec::new()));
    world.talos.expect_reboot().with(eq("10.0.0.21")).times(1).returning(|_| Ok("actor-1".into()));
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert_eq!(outcome, MachineOutcome::Progressed { action: "RebootRequested" });
    assert_eq!(world.written(), vec![(ConditionStatus::Unknown, reason::REBOOT_REQUESTED.to_owned())]);
}

#[tokio::test]
async fn no_reboot_without_the_finish_authority() {
    let mut world = World::new(node(true, true));
    world.kube.expect_pods_on().returning(|_| Ok(Vec::new()));
    world.talos.expect_reboot().never();
    let denied = CallAuthority::Denied(CallDenied::LockNotHeld);
    let outcome = world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), denied).await;
    assert!(matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == "CallNotAuthorised"), "{outcome:?}");
    assert!(world.writes.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_refused_reboot_fails_and_leaves_the_record() {
    let mut world = World::new(node(true, true));
    world.kube.expect_pods_on().returning(|_| Ok(Vec::new()));
    world.talos.expect_reboot().returning(|_| Err(TalosError::answer("PermissionDenied", "not authorized")));
    let outcome =
        world.advance(&machine(lifecycle(ConditionStatus::True, reason::INSTALLED)), CallAuthority::Granted).await;
    assert!(
        matches!(&outcome, MachineOutcome::Failed { reason, .. } if reason == "LifecycleCallRefused"),
        "{outcome:?}"
    );
    assert_eq!(world.written(), vec![(ConditionStatus::Unknown, reason::REBOOT_REQUESTED.to_owned())]);
}

/// The authority of a pass that advances `machine` (and nothing else).
fn advancing(machine: &str) -> ichor_executor::effects::Advancing {
    let decision = ichor_upgrade_core::rollout::Decision::advancing([machine.to_owned()]);
    ichor_executor::effects::Advancing::of(machine, &decision).expect("the decision advances it")
}
