//! One test per phase and case of the lifecycle executor's step.

use super::*;
use crate::conditions::ConditionUpdate;
use crate::evacuation::{STORAGE_EVACUATION, StorageObservation, reason as evac};
use crate::machine::talos::UpgradeTarget;
use crate::machine::vocabulary::MachineRole;
use crate::machine::vocabulary::{EtcdMembership, InstallExit, MachineSpec, NodeObservation, StepTimeouts};
use crate::rollout::CallDenied;
use crate::upgrade_marker::{TALOS_UPGRADE, reason as upgrade};

const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
const BOOT_BEFORE: &str = "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11";
const BOOT_AFTER: &str = "7e2d9c40-13b1-4c8f-8d7e-52a0c6f1e3b2";
const IMAGE: &str =
    "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.4";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_unix_secs(secs)
}

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

fn pod(name: &str) -> PodRef {
    PodRef { namespace: "billing".into(), name: name.into(), uid: None }
}

/// A Ready worker on v1.14.3, nothing in flight, at t=1000; built up by chaining.
#[derive(Clone)]
struct Observed {
    machine: MachineSpec,
    target: UpgradeTarget,
    node: Option<NodeObservation>,
    talos: TalosObservation,
    conditions: Conditions,
    storage: StorageObservation,
    etcd_member: Option<EtcdMembership>,
    authority: CallAuthority,
    finish: CallAuthority,
    timeouts: StepTimeouts,
    cordon: CordonState,
    drain: Option<DrainObservation>,
    talos_boot_id: Option<String>,
    install_running: bool,
    node_installing: Option<bool>,
    install_seen: bool,
    now: Timestamp,
}

impl Observed {
    fn fixture() -> Self {
        Self {
            machine: MachineSpec { name: "worker-1".into(), role: MachineRole::Worker },
            target: UpgradeTarget {
                version: v("v1.14.4"),
                schematic: None,
                platform: "metal".into(),
                kubernetes_version: "1.34.1".into(),
            },
            node: Some(NodeObservation {
                name: "worker-1".into(),
                ready: true,
                os_image: "Talos (v1.14.3)".into(),
                boot_id: BOOT_BEFORE.into(),
                schematic: Some(SCHEMATIC.into()),
            }),
            talos: TalosObservation::Answered { stage: MachineStage::Running },
            conditions: Conditions::new(),
            storage: StorageObservation::default(),
            etcd_member: None,
            authority: CallAuthority::Granted,
            finish: CallAuthority::Granted,
            timeouts: StepTimeouts::default(),
            cordon: CordonState::default(),
            drain: None,
            talos_boot_id: None,
            install_running: false,
            node_installing: None,
            install_seen: false,
            now: at(1000),
        }
    }

    fn control_plane(mut self) -> Self {
        self.machine.role = MachineRole::ControlPlane;
        self.etcd_member = Some(EtcdMembership::Voter);
        self
    }

    fn node(mut self, change: impl FnOnce(&mut NodeObservation)) -> Self {
        change(self.node.as_mut().expect("node present"));
        self
    }

    fn now(mut self, now: Timestamp) -> Self {
        self.now = now;
        self
    }

    fn stage(mut self, stage: MachineStage) -> Self {
        self.talos = TalosObservation::Answered { stage };
        self
    }

    fn unreachable(mut self) -> Self {
        self.talos = TalosObservation::Unreachable { error: "i/o timeout".into() };
        self
    }

    fn marker(deadline: Timestamp) -> String {
        UpgradeMarker { target: v("v1.14.4"), boot_id: BOOT_BEFORE.into(), call_deadline: deadline, node: None }
            .to_string()
    }

    fn lifecycle(mut self, status: ConditionStatus, reason: &str, deadline: Timestamp, since: Timestamp) -> Self {
        let update = ConditionUpdate::new(TALOS_LIFECYCLE, status, reason, Self::marker(deadline));
        self.conditions.upsert(update, since);
        self
    }

    /// The install intent written at t=900, its deadline at t=1500.
    fn install_intent(self) -> Self {
        self.lifecycle(ConditionStatus::Unknown, reason::INSTALL_INTENT, at(1500), at(900))
    }

    /// Installed at t=900.
    fn installed(self) -> Self {
        self.lifecycle(ConditionStatus::True, reason::INSTALLED, at(1500), at(900))
    }

    /// The intent of t=900, its install seen running on the node.
    fn install_running(self) -> Self {
        self.lifecycle(ConditionStatus::Unknown, reason::INSTALL_RUNNING, at(1500), at(900))
    }

    /// The reboot requested at t=900, to be confirmed by t=1020.
    fn reboot_requested(self) -> Self {
        self.lifecycle(ConditionStatus::Unknown, reason::REBOOT_REQUESTED, at(1020), at(900))
    }

    fn cordoned_ours(mut self) -> Self {
        self.cordon = CordonState { unschedulable: true, ours: true, since: None };
        self
    }

    fn drain(mut self, evictable: &[&str], terminating: usize) -> Self {
        self.drain = Some(DrainObservation { evictable: evictable.iter().map(|p| pod(p)).collect(), terminating });
        self
    }

    fn rebooted_into(self, version: &str) -> Self {
        let os_image = format!("Talos ({version})");
        self.node(|n| {
            n.boot_id = BOOT_AFTER.into();
            n.os_image = os_image;
        })
    }

    fn step(&self) -> LifecycleAction {
        lifecycle_step(&LifecycleInput {
            step: StepInput {
                machine: &self.machine,
                target: &self.target,
                node: self.node.as_ref(),
                talos: &self.talos,
                conditions: &self.conditions,
                storage: &self.storage,
                etcd_member: self.etcd_member.as_ref(),
                authority: &self.authority,
                timeouts: &self.timeouts,
                now: self.now,
            },
            cordon: self.cordon,
            drain: self.drain.as_ref(),
            talos_boot_id: self.talos_boot_id.as_deref(),
            finish_authority: &self.finish,
            install_running: self.install_running,
            node_installing: self.node_installing,
            install_seen: self.install_seen,
        })
    }
}

fn waits(action: &LifecycleAction) -> &'static str {
    match action {
        LifecycleAction::Wait { reason, .. } => reason.reason(),
        other => panic!("expected a wait, got {other:?}"),
    }
}

fn fails(action: &LifecycleAction) -> &'static str {
    match action {
        LifecycleAction::Fail(failure) | LifecycleAction::FailEndingEvacuation(failure) => failure.reason(),
        other => panic!("expected a failure, got {other:?}"),
    }
}

// The executor a machine is on.

#[test]
fn auto_chooses_lifecycle_from_talos_1_18_and_legacy_before() {
    let none = Conditions::new();
    assert_eq!(executor_for(ExecutorChoice::Auto, &none, Some(&v("v1.17.9"))), ExecutorKind::Legacy);
    assert_eq!(executor_for(ExecutorChoice::Auto, &none, Some(&v("v1.18.0"))), ExecutorKind::Lifecycle);
    assert_eq!(executor_for(ExecutorChoice::Auto, &none, None), ExecutorKind::Legacy);
    assert_eq!(executor_for(ExecutorChoice::Lifecycle, &none, Some(&v("v1.14.3"))), ExecutorKind::Lifecycle);
    assert_eq!(executor_for(ExecutorChoice::Legacy, &none, Some(&v("v1.18.0"))), ExecutorKind::Legacy);
}

#[test]
fn a_machine_never_changes_executor_half_way() {
    let lifecycle = Observed::fixture().installed().conditions;
    assert_eq!(executor_for(ExecutorChoice::Legacy, &lifecycle, None), ExecutorKind::Lifecycle);
    let mut legacy = Conditions::new();
    legacy.upsert(
        ConditionUpdate::new(TALOS_UPGRADE, ConditionStatus::True, upgrade::UPGRADE_REQUESTED, Observed::marker(at(1))),
        at(1),
    );
    assert_eq!(executor_for(ExecutorChoice::Lifecycle, &legacy, Some(&v("v1.18.0"))), ExecutorKind::Legacy);
}

#[test]
fn executor_choices_parse_by_name() {
    assert_eq!(ExecutorChoice::from_name("auto"), Some(ExecutorChoice::Auto));
    assert_eq!(ExecutorChoice::from_name("lifecycle"), Some(ExecutorChoice::Lifecycle));
    assert_eq!(ExecutorChoice::from_name("legacy"), Some(ExecutorChoice::Legacy));
    assert_eq!(ExecutorChoice::from_name("Lifecycle"), None);
}

// Before the install: the legacy step's checks, then the install.

#[test]
fn a_ready_machine_is_installed_with_the_factory_image_and_a_marker_of_its_boot() {
    match Observed::fixture().step() {
        LifecycleAction::Install { image, marker } => {
            assert_eq!(image, IMAGE);
            assert_eq!(marker.boot_id, BOOT_BEFORE);
            assert_eq!(marker.target, v("v1.14.4"));
            assert_eq!(marker.call_deadline, at(1000 + 600));
        }
        other => panic!("expected the install, got {other:?}"),
    }
}

#[test]
fn the_install_needs_the_full_authority_of_the_pass() {
    let denied = CallAuthority::Denied(CallDenied::Paused);
    let observed = Observed { authority: denied, ..Observed::fixture() };
    assert_eq!(waits(&observed.step()), "CallNotAuthorised");
    let gate = Observed { authority: CallAuthority::NeedsEtcdGate, ..Observed::fixture().control_plane() };
    assert_eq!(waits(&gate.step()), "EtcdGateNotChecked");
}

#[test]
fn storage_is_evacuated_before_the_install() {
    let observed = Observed {
        storage: StorageObservation {
            selected_by: vec!["longhorn".into()],
            replicas_left: Some(3),
            recorded: None,
            evacuation_timeout: None,
        },
        ..Observed::fixture()
    };
    assert_eq!(observed.step(), LifecycleAction::BeginEvacuation);
}

#[test]
fn a_node_before_talos_1_13_cannot_take_the_lifecycle_path() {
    let observed = Observed::fixture().node(|n| n.os_image = "Talos (v1.12.9)".into());
    let observed = Observed { target: UpgradeTarget { version: v("v1.13.5"), ..observed.target.clone() }, ..observed };
    assert_eq!(fails(&observed.step()), "LifecycleUnsupported");
}

#[test]
fn a_node_on_the_target_cordoned_by_the_engine_is_uncordoned_before_its_convergence() {
    let on_target = Observed::fixture().node(|n| n.os_image = "Talos (v1.14.4)".into());
    assert_eq!(on_target.clone().step(), LifecycleAction::RecordConverged);
    assert_eq!(on_target.cordoned_ours().step(), LifecycleAction::Uncordon);
}

#[test]
fn a_cordon_by_someone_else_is_never_lifted() {
    let on_target = Observed::fixture().node(|n| n.os_image = "Talos (v1.14.4)".into());
    let by_hand = Observed { cordon: CordonState { unschedulable: true, ours: false, since: None }, ..on_target };
    assert_eq!(by_hand.step(), LifecycleAction::RecordConverged);
}

// The install intent.

#[test]
fn an_install_intent_found_on_the_same_boot_is_installed_again() {
    assert!(matches!(Observed::fixture().install_intent().step(), LifecycleAction::Install { .. }));
}

#[test]
fn an_install_intent_is_installed_again_on_the_finish_authority_a_pause_does_not_withdraw() {
    let paused = Observed { authority: CallAuthority::Denied(CallDenied::Paused), ..Observed::fixture() };
    assert!(matches!(paused.install_intent().step(), LifecycleAction::Install { .. }));
    let not_ready = CallDenied::ControlPlaneNotReady { nodes: vec!["cp-2".into()] };
    let unsafe_now = Observed { finish: CallAuthority::Denied(not_ready), ..Observed::fixture().control_plane() };
    assert_eq!(waits(&unsafe_now.install_intent().step()), "CallNotAuthorised");
    let first = Observed { authority: CallAuthority::Denied(CallDenied::Paused), ..Observed::fixture() };
    assert_eq!(waits(&first.step()), "CallNotAuthorised", "the first install still needs the full authority");
}

#[test]
fn an_install_intent_on_a_busy_or_silent_node_waits_under_the_verify_bound() {
    assert_eq!(waits(&Observed::fixture().install_intent().stage(MachineStage::Upgrading).step()), "MachineBusy");
    assert_eq!(waits(&Observed::fixture().install_intent().unreachable().step()), "TalosApiUnreachable");
    let late = Observed::fixture().install_intent().unreachable().now(at(900 + 30 * 60));
    assert_eq!(fails(&late.step()), "NotVerifiedInTime");
}

#[test]
fn a_reboot_after_an_install_intent_is_verified_or_a_fallback() {
    let on_target = Observed::fixture().install_intent().rebooted_into("v1.14.4");
    assert_eq!(on_target.step(), LifecycleAction::RecordConverged);
    let fell_back = Observed::fixture().install_intent().rebooted_into("v1.14.3");
    assert_eq!(fails(&fell_back.step()), "AbFallback");
}

// Installed: cordon, drain, reboot.

#[test]
fn an_installed_machine_is_cordoned_first() {
    assert_eq!(Observed::fixture().installed().drain(&["api-1"], 0).step(), LifecycleAction::Cordon);
}

#[test]
fn a_cordoned_machine_has_its_pods_evicted() {
    let observed = Observed::fixture().installed().cordoned_ours().drain(&["api-1", "worker-1"], 0);
    assert_eq!(observed.step(), LifecycleAction::Evict { pods: vec![pod("api-1"), pod("worker-1")] });
}

#[test]
fn the_drain_waits_for_evicted_pods_to_go_polled() {
    let observed = Observed::fixture().installed().cordoned_ours().drain(&[], 2);
    match observed.step() {
        LifecycleAction::Wait { reason: MachineWait::Draining { terminating: 2 }, recheck_at } => {
            assert_eq!(recheck_at, Some(at(1001)), "kubectl drain's pace");
        }
        other => panic!("expected the drain's wait, got {other:?}"),
    }
}

#[test]
fn a_drain_past_its_five_minutes_pauses_naming_the_pod() {
    let observed = Observed::fixture().installed().cordoned_ours().drain(&["api-1"], 1).now(at(900 + 300));
    let action = observed.step();
    assert_eq!(fails(&action), "DrainTimedOut");
    let LifecycleAction::Fail(failure) = action else { unreachable!() };
    assert!(failure.to_string().contains("billing/api-1"), "{failure}");
    assert!(failure.to_string().contains("2 pods left"), "{failure}");
}

#[test]
fn the_drain_clock_starts_at_the_engines_cordon_not_at_the_install() {
    // Issue 29, item 11: a controller down for more than five minutes after an install
    // paused the machine with DrainTimedOut before a single eviction was tried.
    let mut late = Observed::fixture().installed().drain(&["api-1"], 0).now(at(900 + 600));
    late.cordon = CordonState { unschedulable: true, ours: true, since: Some(at(900 + 590)) };
    assert!(matches!(late.step(), LifecycleAction::Evict { .. }), "{:?}", late.step());
    let timed_out = Observed { now: at(900 + 590 + 300), ..late.clone() };
    assert_eq!(fails(&timed_out.step()), "DrainTimedOut", "five minutes from the cordon");
    // A person's cordon, or one that records no time, leaves the install's time.
    let by_hand =
        Observed { cordon: CordonState { unschedulable: true, ours: false, since: Some(at(900 + 590)) }, ..late };
    assert_eq!(fails(&by_hand.step()), "DrainTimedOut");
    assert_eq!(cordoned_since(&cordon_annotation(at(1234), "ops/up/1")), Some(at(1234)));
    assert_eq!(cordoned_since("true"), None, "an older engine's value");
    assert_eq!(cordoned_since("since=1234000"), Some(at(1234)), "the previous engine's value");
}

#[test]
fn the_cordon_annotation_names_its_operation_and_only_that_one() {
    let value = cordon_annotation(at(1234), "ichor-system/upgrade-1/0b6e");
    assert_eq!(value, "since=1234000;operation=ichor-system/upgrade-1/0b6e");
    assert_eq!(cordoned_for(&value), Some("ichor-system/upgrade-1/0b6e"));
    assert_eq!(cordoned_for("since=1234000"), None, "the previous engine named no operation");
    assert_eq!(cordoned_for("true"), None);
    assert_eq!(cordoned_for("since=1;operation="), None, "an empty identity is nobody's");
}

#[test]
fn a_cordon_not_this_operations_is_never_lifted() {
    // On the target after a reboot, cordoned: only this operation's own cordon is lifted
    // before the convergence is recorded; another's (an aborted removal, a deleted upgrade)
    // or a person's stays, and the machine converges under it.
    let rebooted = Observed::fixture().reboot_requested().rebooted_into("v1.14.4");
    assert_eq!(rebooted.clone().cordoned_ours().step(), LifecycleAction::Uncordon);
    let anothers =
        Observed { cordon: CordonState { unschedulable: true, ours: false, since: Some(at(1)) }, ..rebooted };
    assert_eq!(anothers.step(), LifecycleAction::RecordConverged);
}

#[test]
fn a_drained_machine_is_rebooted_with_a_marker_of_its_boot() {
    let observed = Observed::fixture().installed().cordoned_ours().drain(&[], 0);
    match observed.step() {
        LifecycleAction::Reboot { marker } => {
            assert_eq!(marker.boot_id, BOOT_BEFORE);
            assert_eq!(marker.call_deadline, at(1000 + 120));
        }
        other => panic!("expected the reboot, got {other:?}"),
    }
}

#[test]
fn the_reboot_of_an_installed_machine_needs_only_the_finish_authority() {
    // A pause does not interrupt a machine past its call: the reboot goes on.
    let drained = Observed::fixture().installed().cordoned_ours().drain(&[], 0);
    let paused = Observed { authority: CallAuthority::Denied(CallDenied::Paused), ..drained.clone() };
    assert!(matches!(paused.step(), LifecycleAction::Reboot { .. }));
    // The etcd gate does.
    let unhealthy = CallAuthority::Denied(CallDenied::EtcdUnhealthy { reason: "a learner".into() });
    let gate = Observed { finish: unhealthy, ..drained.clone().control_plane() };
    assert_eq!(waits(&gate.step()), "CallNotAuthorised");
    let not_gathered = Observed { finish: CallAuthority::NeedsEtcdGate, ..drained.control_plane() };
    assert_eq!(waits(&not_gathered.step()), "EtcdGateNotChecked");
}

#[test]
fn a_node_cordoned_by_hand_is_drained_without_a_cordon_of_the_engine() {
    let by_hand =
        Observed { cordon: CordonState { unschedulable: true, ours: false, since: None }, ..Observed::fixture() };
    let observed = by_hand.installed().drain(&[], 0);
    assert!(matches!(observed.step(), LifecycleAction::Reboot { .. }));
}

// The reboot requested.

#[test]
fn a_requested_reboot_waits_for_the_node_to_show_it() {
    let requested = Observed::fixture().installed().cordoned_ours().reboot_requested();
    // Before its deadline: the Node's watch tells, whatever Talos says.
    assert_eq!(waits(&requested.clone().unreachable().step()), "RebootUnconfirmed");
    // The Node NotReady: the node is down, rebooting.
    let down = requested.clone().node(|n| n.ready = false).now(at(1100));
    assert_eq!(waits(&down.step()), "Rebooting");
    // Past the deadline, Ready, and Talos shows the reboot under way, or does not answer.
    let late = requested.now(at(1100));
    assert_eq!(waits(&late.clone().stage(MachineStage::ShuttingDown).step()), "Rebooting");
    assert_eq!(waits(&late.unreachable().step()), "Rebooting");
}

#[test]
fn a_new_boot_that_the_kubelet_has_not_reported_is_waited_for() {
    let mut requested = Observed::fixture().reboot_requested().now(at(1100));
    requested.talos_boot_id = Some(BOOT_AFTER.into());
    assert_eq!(waits(&requested.step()), "NotRebootedYet");
}

#[test]
fn an_unconfirmed_reboot_is_asked_for_again_only_after_its_deadline() {
    let mut requested = Observed::fixture().reboot_requested();
    requested.talos_boot_id = Some(BOOT_BEFORE.into());
    match requested.clone().step() {
        LifecycleAction::Wait { reason: MachineWait::RebootUnconfirmed, recheck_at } => {
            assert_eq!(recheck_at, Some(at(1020)));
        }
        other => panic!("expected a wait for the deadline, got {other:?}"),
    }
    assert!(matches!(requested.now(at(1020)).step(), LifecycleAction::Reboot { .. }));
}

#[test]
fn without_talos_own_boot_id_a_reboot_is_never_asked_for_again() {
    let requested = Observed::fixture().reboot_requested().now(at(1100));
    assert_eq!(waits(&requested.step()), "RebootUnconfirmed");
}

// After the reboot.

#[test]
fn a_reboot_into_the_target_is_verified_uncordoned_then_converged() {
    let rebooted = Observed::fixture().reboot_requested().rebooted_into("v1.14.4");
    assert_eq!(rebooted.clone().cordoned_ours().step(), LifecycleAction::Uncordon);
    assert_eq!(rebooted.clone().step(), LifecycleAction::RecordConverged);
    assert_eq!(waits(&rebooted.node(|n| n.ready = false).step()), "NodeNotReady");
}

#[test]
fn a_reboot_into_another_version_is_an_ab_fallback_never_converged() {
    let fell_back = Observed::fixture().reboot_requested().cordoned_ours().rebooted_into("v1.14.3");
    let action = fell_back.step();
    assert_eq!(fails(&action), "AbFallback");
}

#[test]
fn a_control_plane_waits_for_its_voting_etcd_member() {
    let mut rebooted = Observed::fixture().control_plane().reboot_requested().rebooted_into("v1.14.4");
    rebooted.etcd_member = Some(EtcdMembership::Learner);
    assert_eq!(waits(&rebooted.step()), "EtcdMemberLearner");
}

// Bad records.

#[test]
fn a_garbled_lifecycle_marker_fails_with_its_text() {
    let mut observed = Observed::fixture();
    observed.conditions.upsert(
        ConditionUpdate::new(TALOS_LIFECYCLE, ConditionStatus::True, reason::INSTALLED, "installed, honest"),
        at(900),
    );
    let action = observed.step();
    assert_eq!(fails(&action), "GarbledLifecycleMarker");
    let LifecycleAction::Fail(failure) = action else { unreachable!() };
    assert!(failure.to_string().contains("installed, honest"), "{failure}");
}

#[test]
fn a_phase_the_executor_does_not_know_fails() {
    let observed = Observed::fixture().lifecycle(ConditionStatus::True, "Teleported", at(1500), at(900));
    assert_eq!(fails(&observed.step()), "LifecycleRecordUnknown");
}

#[test]
fn a_marker_for_another_target_is_never_taken_for_this_one() {
    let mut observed = Observed::fixture().installed();
    observed.target.version = v("v1.14.5");
    assert_eq!(fails(&observed.step()), "UpgradeMarkerForOtherTarget");
}

#[test]
fn an_evacuation_left_open_is_ended_with_the_convergence() {
    let mut observed = Observed::fixture().reboot_requested().rebooted_into("v1.14.4");
    observed
        .conditions
        .upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATED, ""), at(800));
    assert_eq!(observed.step(), LifecycleAction::RecordConverged);
}

// What the driver reads.

#[test]
fn each_phase_reads_only_what_it_looks_at() {
    let before = Some((BOOT_BEFORE, true));
    let none = Observed::fixture();
    assert_eq!(
        lifecycle_reads(&none.conditions, before, at(1000)),
        LifecycleReads { talos: true, storage: true, drain: false, talos_boot_id: false, install: false }
    );
    let installed = Observed::fixture().installed();
    assert_eq!(
        lifecycle_reads(&installed.conditions, before, at(1000)),
        LifecycleReads { talos: false, storage: false, drain: true, talos_boot_id: false, install: false }
    );
    let requested = Observed::fixture().reboot_requested();
    let nothing = LifecycleReads { talos: false, storage: false, drain: false, talos_boot_id: false, install: false };
    // Before its deadline, or with the Node NotReady, a reboot is never asked about: the
    // node may be down, and its API would hold the pass until the dial timeout.
    assert_eq!(lifecycle_reads(&requested.conditions, before, at(1000)), nothing);
    assert_eq!(lifecycle_reads(&requested.conditions, Some((BOOT_BEFORE, false)), at(1100)), nothing);
    assert_eq!(
        lifecycle_reads(&requested.conditions, before, at(1020)),
        LifecycleReads { talos: true, storage: false, drain: false, talos_boot_id: true, install: false }
    );
    assert_eq!(
        lifecycle_reads(&requested.conditions, Some((BOOT_AFTER, false)), at(1000)),
        LifecycleReads { talos: true, storage: false, drain: false, talos_boot_id: false, install: false }
    );
}

#[test]
fn install_exit_codes_map_to_typed_failures() {
    assert_eq!(InstallExit::from_code(0), InstallExit::Success);
    assert_eq!(InstallExit::from_code(4).reason(), "InstallEnvironment");
    assert_eq!(InstallExit::from_code(5).reason(), "InstallDependency");
    assert_eq!(InstallExit::from_code(7).reason(), "InstallFailed");
    assert_eq!(InstallExit::from_code(42), InstallExit::Other(42));
    for code in -1..10 {
        assert_eq!(InstallExit::from_code(code).code(), code);
    }
    let failure = MachineFailure::Install { exit: InstallExit::Environment, output: "host version check".into() };
    assert_eq!(failure.reason(), "InstallEnvironment");
    assert!(failure.to_string().contains("code 4"), "{failure}");
}

#[test]
fn a_machine_with_an_install_under_way_is_past_its_call() {
    assert!(crate::machine::talos::past_upgrade_call(&Observed::fixture().install_intent().conditions));
    assert!(crate::machine::talos::past_upgrade_call(&Observed::fixture().reboot_requested().conditions));
    assert!(!crate::machine::talos::past_upgrade_call(&Observed::fixture().conditions));
}

// The install's stream outside the pass.

#[test]
fn an_install_under_way_in_this_controller_is_waited_for_never_started_again() {
    let running = Observed { install_running: true, ..Observed::fixture() };
    assert_eq!(waits(&running.clone().step()), "InstallUnderWay");
    assert_eq!(waits(&running.install_intent().step()), "InstallUnderWay");
}

/// Issue 29 item 3: Talos runs an install to its end whether or not a stream follows it.
/// An intent whose install the node shows running is recorded so, and waited for; once it
/// is gone it ended on this boot and is taken as installed (its exit code unseen: the
/// reboot's verification judges it), never made again. An intent the node shows no install
/// for, and none was seen, is installed again.
#[test]
fn an_install_seen_running_on_the_node_is_recorded_waited_for_and_never_made_again() {
    let intent = Observed::fixture().install_intent();
    let on_node = Observed { node_installing: Some(true), ..intent.clone() };
    assert_eq!(on_node.step(), LifecycleAction::RecordInstallRunning);
    let seen = Observed { install_seen: true, node_installing: Some(false), ..intent.clone() };
    assert_eq!(seen.step(), LifecycleAction::RecordInstallRunning, "seen by this process, not recorded yet");
    let none = Observed { node_installing: Some(false), ..intent.clone() };
    assert!(matches!(none.step(), LifecycleAction::Install { .. }), "provably none ran: made again");

    let running = Observed::fixture().install_running();
    assert_eq!(waits(&Observed { node_installing: Some(true), ..running.clone() }.step()), "InstallUnderWay");
    assert_eq!(waits(&running.clone().step()), "InstallUnderWay", "the node cannot tell: waited for");
    let ended = Observed { node_installing: Some(false), ..running.clone() };
    assert_eq!(ended.step(), LifecycleAction::RecordInstallEnded);
    // Past the verify bound it fails, as any wait on the install.
    let late = Observed { node_installing: Some(true), now: at(900 + 3600), ..running };
    assert_eq!(fails(&late.step()), "NotVerifiedInTime");
    // The install is asked of the node only for an intent on the same boot.
    let before = Some((BOOT_BEFORE, true));
    assert!(lifecycle_reads(&intent.conditions, before, at(1000)).install);
    assert!(lifecycle_reads(&Observed::fixture().install_running().conditions, before, at(1000)).install);
    assert!(!lifecycle_reads(&Observed::fixture().installed().conditions, before, at(1000)).install);
    assert!(crate::machine::talos::past_upgrade_call(&Observed::fixture().install_running().conditions));
}

#[test]
fn a_failed_install_is_a_failure_until_resumed() {
    let mut observed = Observed::fixture();
    observed.conditions.upsert(
        ConditionUpdate::new(
            TALOS_LIFECYCLE,
            ConditionStatus::False,
            reason::INSTALL_FAILED,
            "the installer exited with code 4 (refused by the environment): host version check",
        ),
        at(900),
    );
    let action = observed.step();
    assert_eq!(fails(&action), "InstallFailed");
    let LifecycleAction::Fail(failure) = action else { unreachable!() };
    assert!(failure.to_string().contains("code 4"), "{failure}");
}

#[test]
fn a_pull_records_its_seconds_in_a_message_read_back_exactly() {
    let image = "factory.talos.dev/installer/376567988ad3:v1.14.4";
    let message = pulled_message(image, Duration::from_millis(12_345));
    assert_eq!(message, format!("pulled {image} in 12.345 s"));
    assert_eq!(pulled_seconds(&message), Some(12.345));
    assert_eq!(pulled_seconds(&pulled_message(image, Duration::ZERO)), Some(0.0), "an image already there");
    for other in ["", "pulled in s", "pulled x in -1 s", "pulled x in NaN s", "installing x", "pulled x in 3 ms"] {
        assert_eq!(pulled_seconds(other), None, "{other:?}");
    }
}
