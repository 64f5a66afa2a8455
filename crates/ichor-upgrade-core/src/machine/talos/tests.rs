//! One test per row of DESIGN §4's table, per bad input of §9 that the executor sees, and
//! per case of the crash window.

use super::*;
use crate::conditions::ConditionUpdate;
use crate::evacuation::{STORAGE_EVACUATION, reason as evac};
use crate::upgrade_marker::reason as upgrade;

const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
const BOOT_BEFORE: &str = "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11";
const BOOT_AFTER: &str = "7e2d9c40-13b1-4c8f-8d7e-52a0c6f1e3b2";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_unix_secs(secs)
}

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

/// One machine's observation, built up by chaining; starts as a Ready worker on v1.14.3
/// with a schematic, no storage, nothing in flight, at t=1000.
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
    timeouts: StepTimeouts,
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
                name: "cp-1".into(),
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
            timeouts: StepTimeouts::default(),
            now: at(1000),
        }
    }

    /// The void intent closed, as the driver writes it.
    fn void_intent_closed(self) -> Self {
        let message = self.conditions.get(TALOS_UPGRADE).map(|c| c.message.clone()).unwrap_or_default();
        let now = self.now;
        self.condition(TALOS_UPGRADE, ConditionStatus::False, upgrade::INTENT_VOID, &message, now)
    }

    fn authority(mut self, authority: CallAuthority) -> Self {
        self.authority = authority;
        self
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

    fn os_image(self, text: &str) -> Self {
        self.node(|n| n.os_image = text.into())
    }

    fn not_ready(self) -> Self {
        self.node(|n| n.ready = false)
    }

    fn no_node(mut self) -> Self {
        self.node = None;
        self
    }

    fn talos(mut self, talos: TalosObservation) -> Self {
        self.talos = talos;
        self
    }

    fn unreachable(self) -> Self {
        self.talos(TalosObservation::Unreachable {
            error: "dial tcp 10.0.0.21:50000: connect: connection refused".into(),
        })
    }

    fn stage(self, stage: MachineStage) -> Self {
        self.talos(TalosObservation::Answered { stage })
    }

    fn now(mut self, now: Timestamp) -> Self {
        self.now = now;
        self
    }

    fn condition(
        mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        since: Timestamp,
    ) -> Self {
        self.conditions.upsert(ConditionUpdate::new(type_, status, reason, message), since);
        self
    }

    fn marker(&self, boot_id: &str, target: &str, deadline: Timestamp) -> String {
        UpgradeMarker { target: v(target), boot_id: boot_id.into(), call_deadline: deadline, node: Some("cp-1".into()) }
            .to_string()
    }

    /// `TalosUpgrade=True` from an acknowledged call made at t=900.
    fn upgrade_acknowledged(self) -> Self {
        let message = self.marker(BOOT_BEFORE, "v1.14.4", at(1500));
        self.condition(TALOS_UPGRADE, ConditionStatus::True, upgrade::UPGRADE_REQUESTED, &message, at(900))
    }

    /// `TalosUpgrade=Unknown`: an intent written at t=900, call deadline t=1500.
    fn upgrade_intent(self) -> Self {
        let message = self.marker(BOOT_BEFORE, "v1.14.4", at(1500));
        self.condition(TALOS_UPGRADE, ConditionStatus::Unknown, upgrade::UPGRADE_INTENT, &message, at(900))
    }

    /// The node came back with a new boot ID, Ready, on `version`.
    fn rebooted_into(self, version: &str) -> Self {
        let image = format!("Talos ({version})");
        self.node(|n| {
            n.boot_id = BOOT_AFTER.into();
            n.os_image = image;
        })
    }

    fn storage(mut self, replicas_left: Option<u32>) -> Self {
        self.storage = StorageObservation {
            selected_by: vec!["longhorn".into()],
            replicas_left,
            recorded: None,
            evacuation_timeout: None,
        };
        self
    }

    fn evacuating_since(self, since: Timestamp) -> Self {
        self.condition(STORAGE_EVACUATION, ConditionStatus::True, evac::EVACUATING, "", since)
    }

    fn step(&self) -> Action {
        step(&StepInput {
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
        })
    }
}

fn expected_upgrade(boot_id: &str, now: Timestamp) -> Action {
    Action::Upgrade {
        image: format!("factory.talos.dev/metal-installer/{SCHEMATIC}:v1.14.4"),
        marker: UpgradeMarker {
            target: v("v1.14.4"),
            boot_id: boot_id.into(),
            call_deadline: now.saturating_add(Duration::from_secs(600)),
            node: Some("cp-1".into()),
        },
    }
}

// Row: no TalosUpgrade, node already on target.

#[test]
fn row_already_on_target_converges_without_a_call() {
    let on_target = Observed::fixture().os_image("Talos (v1.14.4)");
    assert_eq!(on_target.clone().step(), Action::RecordConverged, "recorded once, in its own conditions");
    let message = converged_message(&v("v1.14.4"), BOOT_BEFORE);
    let recorded = on_target.condition(TALOS_UPGRADE, ConditionStatus::False, upgrade::CONVERGED, &message, at(990));
    assert_eq!(converged_on(&recorded.conditions), Some(v("v1.14.4")));
    assert_eq!(recorded.step(), Action::Converged);
}

#[test]
fn a_convergence_is_recognised_without_parsing_exactly_as_parsed() {
    let versions = ["v1.14.4", "v1.14.3", "v1.13.0", "v1.14.4-beta.1", "v1.14.40", "v1.1.4"];
    for written in versions {
        let message = converged_message(&v(written), BOOT_BEFORE);
        let recorded = Observed::fixture().os_image("Talos (v1.14.4)").condition(
            TALOS_UPGRADE,
            ConditionStatus::False,
            upgrade::CONVERGED,
            &message,
            at(990),
        );
        for asked in versions {
            let parsed = converged_on(&recorded.conditions) == Some(v(asked));
            assert_eq!(ConvergedOn::new(&v(asked)).recorded(&recorded.conditions), parsed, "{written} asked {asked}");
        }
    }
    // Not a convergence: an open marker or another reason with the same message.
    let message = converged_message(&v("v1.14.4"), BOOT_BEFORE);
    let open = Observed::fixture().condition(TALOS_UPGRADE, ConditionStatus::True, upgrade::CONVERGED, &message, at(1));
    assert!(!ConvergedOn::new(&v("v1.14.4")).recorded(&open.conditions));
}

#[test]
fn a_convergence_recorded_for_another_version_or_by_an_older_engine_is_recorded_again() {
    let on_target = Observed::fixture().os_image("Talos (v1.14.4)");
    let older = converged_message(&v("v1.14.3"), BOOT_BEFORE);
    for message in [older.as_str(), "verified on the target; boot ID x", "verified on v1.14.4", ""] {
        let o =
            on_target.clone().condition(TALOS_UPGRADE, ConditionStatus::False, upgrade::CONVERGED, message, at(990));
        assert_eq!(o.step(), Action::RecordConverged, "{message:?}");
    }
}

#[test]
fn row_already_on_target_is_still_verified_ready_and_in_etcd() {
    let on_target = Observed::fixture().os_image("Talos (v1.14.4)");
    assert_eq!(
        on_target.clone().not_ready().step(),
        Action::Wait { reason: MachineWait::NodeNotReady, recheck_at: None }
    );
    let mut cp = on_target.control_plane();
    assert_eq!(cp.step(), Action::RecordConverged);
    cp.etcd_member = Some(EtcdMembership::Learner);
    assert_eq!(cp.step(), Action::Wait { reason: MachineWait::EtcdMemberLearner, recheck_at: Some(at(1005)) });
}

#[test]
fn row_already_on_target_ends_an_open_evacuation_first() {
    let o = Observed::fixture().os_image("Talos (v1.14.4)").storage(Some(0)).evacuating_since(at(900));
    assert_eq!(o.step(), Action::EndEvacuation);
}

// Row: path or Kubernetes pairing invalid.

#[test]
fn row_a_skipped_minor_fails_naming_the_path() {
    let action = Observed::fixture().os_image("Talos (v1.12.9)").step();
    let Action::Fail(failure) = action else { panic!("{action:?}") };
    assert_eq!(failure.reason(), "UpgradePathRefused");
    assert!(failure.to_string().contains("v1.13"), "{failure}");
}

#[test]
fn row_a_downgrade_fails() {
    let action = Observed::fixture().os_image("Talos (v1.14.5)").step();
    assert!(matches!(action, Action::Fail(MachineFailure::UpgradePath(PathRefusal::Downgrade { .. }))), "{action:?}");
}

#[test]
fn row_kubernetes_outside_the_targets_range_fails_naming_the_range() {
    let mut o = Observed::fixture();
    o.target.kubernetes_version = "1.31.4".into();
    let Action::Fail(failure) = o.step() else { panic!() };
    assert_eq!(failure.reason(), "KubernetesPairingRefused");
    assert!(failure.to_string().contains("1.32.0 to 1.37.x"), "{failure}");
}

// Row: node not Ready before the call.

#[test]
fn row_a_node_not_ready_before_the_call_waits() {
    assert_eq!(
        Observed::fixture().not_ready().step(),
        Action::Wait { reason: MachineWait::NodeNotReady, recheck_at: None }
    );
}

// Rows: storage selects the node.

#[test]
fn row_storage_selecting_the_node_begins_an_evacuation() {
    assert_eq!(Observed::fixture().storage(Some(5)).step(), Action::BeginEvacuation);
}

#[test]
fn row_an_evacuation_in_progress_is_awaited_until_its_deadline() {
    let o = Observed::fixture().storage(Some(2)).evacuating_since(at(500));
    assert_eq!(
        o.step(),
        Action::Wait { reason: MachineWait::Evacuating { replicas_left: Some(2) }, recheck_at: Some(at(1005)) }
    );
}

#[test]
fn row_an_evacuation_past_its_timeout_fails_and_ends_the_evacuation_never_proceeds() {
    let o = Observed::fixture().storage(Some(2)).evacuating_since(at(500)).now(at(2300));
    let action = o.step();
    assert_eq!(
        action,
        Action::FailEndingEvacuation(MachineFailure::EvacuationTimedOut {
            replicas_left: Some(2),
            timeout: Duration::from_secs(1800)
        })
    );
}

// Row: evacuated, or nothing to evacuate: the call.

#[test]
fn row_nothing_to_evacuate_calls_upgrade_with_the_factory_image() {
    assert_eq!(Observed::fixture().step(), expected_upgrade(BOOT_BEFORE, at(1000)));
}

#[test]
fn row_evacuated_calls_upgrade() {
    let o = Observed::fixture().storage(Some(0)).evacuating_since(at(500));
    assert_eq!(o.step(), expected_upgrade(BOOT_BEFORE, at(1000)));
}

#[test]
fn row_the_cluster_schematic_wins_over_the_nodes_and_the_platform_is_used() {
    let mut o = Observed::fixture();
    o.target.schematic = Some("a".repeat(64));
    o.target.platform = "aws".into();
    let Action::Upgrade { image, .. } = o.step() else { panic!() };
    assert_eq!(image, format!("factory.talos.dev/aws-installer/{}:v1.14.4", "a".repeat(64)));
}

#[test]
fn row_a_busy_machine_or_unreachable_api_is_not_called() {
    assert_eq!(
        Observed::fixture().stage(MachineStage::Upgrading).step(),
        Action::Wait {
            reason: MachineWait::MachineBusy { stage: MachineStage::Upgrading },
            recheck_at: Some(at(1005))
        }
    );
    assert_eq!(
        Observed::fixture().unreachable().step(),
        Action::Wait { reason: MachineWait::TalosApiUnreachable, recheck_at: Some(at(1005)) }
    );
    let answered = Observed::fixture().talos(TalosObservation::Error { error: "PermissionDenied".into() }).step();
    assert!(matches!(answered, Action::Fail(MachineFailure::TalosApi(_))));
}

// Rows after the call.

#[test]
fn row_after_the_call_a_dial_error_is_still_rebooting() {
    // Acknowledged, the Node still on the old boot: the new boot is awaited (Talos unasked).
    let o = Observed::fixture().upgrade_acknowledged().unreachable();
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::NotRebootedYet, recheck_at: Some(at(900 + 1800)) });
    // An intent: a dial error or Unavailable is a reboot under way, not a failure.
    let o = Observed::fixture().upgrade_intent().unreachable();
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::Rebooting, recheck_at: Some(at(900 + 1800)) });
    let rpc = Observed::fixture().upgrade_intent().talos(TalosObservation::Error { error: "Unavailable".into() });
    assert_eq!(rpc.step(), Action::Wait { reason: MachineWait::Rebooting, recheck_at: Some(at(2700)) });
}

#[test]
fn row_after_the_call_an_unchanged_boot_id_is_not_rebooted_yet() {
    let o = Observed::fixture().upgrade_acknowledged().stage(MachineStage::Upgrading);
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::NotRebootedYet, recheck_at: Some(at(2700)) });
}

#[test]
fn row_a_changed_boot_id_on_another_version_is_an_ab_fallback_failure() {
    let o = Observed::fixture().upgrade_acknowledged().rebooted_into("v1.14.3");
    let action = o.step();
    assert_eq!(
        action,
        Action::Fail(MachineFailure::AbFallback {
            booted: v("v1.14.3"),
            target: v("v1.14.4"),
            before: BOOT_BEFORE.into(),
            after: BOOT_AFTER.into()
        })
    );
    let Action::Fail(failure) = action else { unreachable!() };
    assert_eq!(failure.reason(), "AbFallback");
}

#[test]
fn row_on_target_waits_for_ready() {
    let o = Observed::fixture().upgrade_acknowledged().rebooted_into("v1.14.4").not_ready();
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::NodeNotReady, recheck_at: Some(at(2700)) });
}

#[test]
fn row_on_target_a_control_plane_waits_for_its_etcd_member() {
    let base = Observed::fixture().control_plane().upgrade_acknowledged().rebooted_into("v1.14.4");
    for (membership, reason) in [
        (Some(EtcdMembership::Absent), MachineWait::EtcdMemberMissing),
        (Some(EtcdMembership::Learner), MachineWait::EtcdMemberLearner),
        (Some(EtcdMembership::Unknown { error: "timeout".into() }), MachineWait::EtcdMemberUnknown),
        (None, MachineWait::EtcdMemberUnknown),
    ] {
        let mut o = base.clone();
        o.etcd_member = membership;
        assert_eq!(o.step(), Action::Wait { reason, recheck_at: Some(at(1005)) });
    }
    assert_eq!(base.step(), Action::RecordConverged);
}

#[test]
fn row_verified_ends_the_evacuation_then_records_convergence() {
    let o =
        Observed::fixture().storage(Some(0)).evacuating_since(at(500)).upgrade_acknowledged().rebooted_into("v1.14.4");
    let rebooted_not_ready = o.clone().not_ready();
    assert!(matches!(rebooted_not_ready.step(), Action::Wait { .. }), "scheduling comes back only after verification");
    assert_eq!(o.step(), Action::RecordConverged, "the evacuation ends in the same write as the convergence");
    let ended = o.condition(STORAGE_EVACUATION, ConditionStatus::False, evac::ENDED, "", at(1000));
    assert_eq!(ended.step(), Action::RecordConverged);
    let message = converged_message(&v("v1.14.4"), BOOT_AFTER);
    let recorded = ended.condition(TALOS_UPGRADE, ConditionStatus::False, upgrade::CONVERGED, &message, at(1001));
    assert_eq!(recorded.step(), Action::Converged);
}

#[test]
fn row_a_worker_needs_no_etcd_member() {
    let o = Observed::fixture().upgrade_acknowledged().rebooted_into("v1.14.4");
    assert_eq!(o.step(), Action::RecordConverged);
}

#[test]
fn a_machine_not_verified_within_its_bound_fails() {
    let o = Observed::fixture().upgrade_acknowledged().unreachable().now(at(2700));
    let Action::Fail(failure) = o.step() else { panic!() };
    assert_eq!(failure.reason(), "NotVerifiedInTime");
}

// The crash window: an intent without a recorded acknowledgement.

#[test]
fn crash_window_an_intent_with_a_new_boot_id_was_acknowledged_and_is_verified() {
    let o = Observed::fixture().upgrade_intent().rebooted_into("v1.14.4");
    assert_eq!(o.step(), Action::RecordConverged, "no second call");
}

#[test]
fn crash_window_an_intent_with_a_new_boot_id_on_the_old_version_is_never_missed_as_a_fallback() {
    let o = Observed::fixture().upgrade_intent().rebooted_into("v1.14.3");
    assert!(matches!(o.step(), Action::Fail(MachineFailure::AbFallback { .. })));
}

#[test]
fn crash_window_an_intent_with_the_upgrade_under_way_waits() {
    let o = Observed::fixture().upgrade_intent().stage(MachineStage::Upgrading);
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::UpgradeUnderWay, recheck_at: Some(at(2700)) });
    let rebooting = Observed::fixture().upgrade_intent().unreachable();
    assert_eq!(rebooting.step(), Action::Wait { reason: MachineWait::Rebooting, recheck_at: Some(at(2700)) });
}

#[test]
fn crash_window_an_unconfirmed_intent_waits_for_the_calls_deadline() {
    let o = Observed::fixture().upgrade_intent().now(at(1499));
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::IntentUnconfirmed, recheck_at: Some(at(1500)) });
}

#[test]
fn crash_window_after_the_deadline_with_no_sign_of_the_call_it_is_closed_then_made_again() {
    let o = Observed::fixture().upgrade_intent().now(at(1500));
    assert_eq!(o.step(), Action::CloseVoidIntent);
    assert_eq!(o.clone().not_ready().step(), Action::CloseVoidIntent, "void whatever else the node does");
    let closed = o.void_intent_closed();
    assert_eq!(closed.step(), expected_upgrade(BOOT_BEFORE, at(1500)));
}

#[test]
fn crash_window_a_void_intent_passes_every_pre_call_check_again() {
    let base = Observed::fixture().upgrade_intent().now(at(1500)).void_intent_closed();
    assert_eq!(base.clone().not_ready().step(), Action::Wait { reason: MachineWait::NodeNotReady, recheck_at: None });
    assert_eq!(
        base.clone().stage(MachineStage::Maintenance).step(),
        Action::Wait {
            reason: MachineWait::MachineBusy { stage: MachineStage::Maintenance },
            recheck_at: Some(at(1505))
        }
    );
    assert_eq!(base.storage(Some(3)).step(), Action::BeginEvacuation);
}

#[test]
fn crash_window_a_deadline_beyond_one_call_bound_is_not_waited_on() {
    let o = Observed::fixture();
    let message = o.marker(BOOT_BEFORE, "v1.14.4", at(999_999));
    let o = o.condition(TALOS_UPGRADE, ConditionStatus::Unknown, upgrade::UPGRADE_INTENT, &message, at(900));
    assert_eq!(o.clone().step(), Action::Wait { reason: MachineWait::IntentUnconfirmed, recheck_at: Some(at(1500)) });
    assert_eq!(o.now(at(1500)).step(), Action::CloseVoidIntent);
}

// Bad input (DESIGN §9).

#[test]
fn bad_input_unparseable_os_images_fail_naming_the_field_and_text() {
    for image in ["", "Talos (banana)", "Ubuntu 24.04.1 LTS"] {
        let Action::Fail(failure) = Observed::fixture().os_image(image).step() else { panic!("{image:?}") };
        assert_eq!(failure.reason(), "BadOsImage");
        let text = failure.to_string();
        assert!(text.starts_with("node status.nodeInfo.osImage: ") && text.contains(&format!("{image:?}")), "{text}");
    }
    let after = Observed::fixture().upgrade_acknowledged().rebooted_into("v1.14.4").os_image("Talos (v1.14)");
    assert!(matches!(after.step(), Action::Fail(MachineFailure::BadOsImage(_))));
}

#[test]
fn bad_input_a_garbled_marker_fails_with_the_text_and_never_calls() {
    for status in [ConditionStatus::True, ConditionStatus::Unknown] {
        let o = Observed::fixture().condition(
            TALOS_UPGRADE,
            status,
            "UpgradeRequested",
            "Upgrade request received",
            at(900),
        );
        let Action::Fail(failure) = o.step() else { panic!() };
        assert_eq!(failure.reason(), "GarbledUpgradeMarker");
        assert!(failure.to_string().contains("\"Upgrade request received\""), "{failure}");
    }
}

#[test]
fn bad_input_a_marker_for_another_target_is_never_mistaken_for_this_one() {
    let o = Observed::fixture();
    let message = o.marker(BOOT_BEFORE, "v1.14.3", at(1500));
    let o = o
        .condition(TALOS_UPGRADE, ConditionStatus::True, upgrade::UPGRADE_REQUESTED, &message, at(900))
        .rebooted_into("v1.14.4");
    let Action::Fail(failure) = o.step() else { panic!() };
    assert!(
        matches!(&failure, MachineFailure::MarkerForOtherTarget { recorded, target, .. } if *recorded == v("v1.14.3") && *target == v("v1.14.4"))
    );
    assert!(failure.to_string().contains(&format!("{message:?}")), "the text is quoted: {failure}");
}

#[test]
fn bad_input_a_closed_marker_from_an_earlier_operation_is_ignored() {
    let o = Observed::fixture();
    let message = o.marker(BOOT_BEFORE, "v1.14.3", at(1500));
    let o = o.condition(TALOS_UPGRADE, ConditionStatus::False, upgrade::CONVERGED, &message, at(100));
    assert_eq!(o.step(), expected_upgrade(BOOT_BEFORE, at(1000)));
}

#[test]
fn bad_input_transition_times_in_the_future_are_treated_as_now() {
    let evacuating = Observed::fixture().storage(Some(3)).evacuating_since(at(9_000));
    assert_eq!(
        evacuating.step(),
        Action::Wait { reason: MachineWait::Evacuating { replicas_left: Some(3) }, recheck_at: Some(at(1005)) }
    );
    let o = Observed::fixture();
    let message = o.marker(BOOT_BEFORE, "v1.14.4", at(9_600));
    let o = o
        .condition(TALOS_UPGRADE, ConditionStatus::True, upgrade::UPGRADE_REQUESTED, &message, at(9_000))
        .unreachable();
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::NotRebootedYet, recheck_at: Some(at(2800)) });
}

#[test]
fn bad_input_no_schematic_anywhere_fails_before_any_call() {
    let o = Observed::fixture().node(|n| n.schematic = None);
    assert_eq!(o.step(), Action::Fail(MachineFailure::NoSchematic));
    let o = Observed::fixture().node(|n| n.schematic = None).storage(Some(3));
    assert_eq!(o.step(), Action::Fail(MachineFailure::NoSchematic), "not even an evacuation");
}

#[test]
fn bad_input_malformed_schematic_or_platform_fails() {
    let o = Observed::fixture().node(|n| n.schematic = Some("not-a-schematic".into()));
    assert!(matches!(o.step(), Action::Fail(MachineFailure::BadImageReference(_))));
    let mut o = Observed::fixture();
    o.target.platform = "Metal/../x".into();
    assert!(matches!(o.step(), Action::Fail(MachineFailure::BadImageReference(_))));
}

#[test]
fn bad_input_missing_boot_id_waits_rather_than_calling() {
    let o = Observed::fixture().node(|n| n.boot_id = String::new());
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::BootIdUnknown, recheck_at: None });
}

#[test]
fn a_missing_node_waits() {
    assert_eq!(
        Observed::fixture().no_node().step(),
        Action::Wait { reason: MachineWait::NodeMissing, recheck_at: None }
    );
}

#[test]
fn past_upgrade_call_is_true_for_intents_and_acknowledgements_only() {
    assert!(!past_upgrade_call(&Conditions::new()));
    assert!(past_upgrade_call(&Observed::fixture().upgrade_intent().conditions));
    assert!(past_upgrade_call(&Observed::fixture().upgrade_acknowledged().conditions));
    let closed = Observed::fixture().condition(TALOS_UPGRADE, ConditionStatus::False, upgrade::CONVERGED, "", at(1));
    assert!(!past_upgrade_call(&closed.conditions));
}

#[test]
fn reasons_are_camel_case() {
    let failures = [
        MachineFailure::NoSchematic,
        MachineFailure::UpgradeCallTimedOut(Duration::from_secs(600)),
        MachineFailure::UpgradeRefused("x".into()),
    ];
    for f in failures {
        assert!(f.reason().chars().all(|c| c.is_ascii_alphanumeric()));
    }
    assert_eq!(MachineWait::Rebooting.reason(), "Rebooting");
}

// DESIGN §3 rule 3: no Upgrade call, first or repeated, without an authorisation computed
// in the same pass.

#[test]
fn no_first_call_without_authority() {
    let ready = Observed::fixture();
    assert_eq!(ready.step(), expected_upgrade(BOOT_BEFORE, at(1000)));
    for denied in [
        CallDenied::Held,
        CallDenied::Paused,
        CallDenied::Deleting,
        CallDenied::ControlPlaneNotReady { nodes: vec!["cp-2".into()] },
        CallDenied::EtcdUnhealthy { reason: "NOSPACE alarm".into() },
    ] {
        let action = ready.clone().authority(CallAuthority::Denied(denied.clone())).step();
        assert_eq!(action, Action::Wait { reason: MachineWait::CallNotAuthorised(denied), recheck_at: Some(at(1005)) });
    }
    assert_eq!(
        ready.authority(CallAuthority::NeedsEtcdGate).step(),
        Action::Wait { reason: MachineWait::EtcdGateNotChecked, recheck_at: None }
    );
}

#[test]
fn a_void_intent_is_not_called_again_without_authority() {
    // The review's case: cp-1's intent is void (deadline passed, no sign of the call) while
    // cp-2 is NotReady: before the fix the step returned Upgrade.
    let void = Observed::fixture().control_plane().upgrade_intent().now(at(1600));
    assert_eq!(void.step(), Action::CloseVoidIntent);
    let void = void.void_intent_closed();
    assert_eq!(void.step(), expected_upgrade(BOOT_BEFORE, at(1600)), "with authority it is called again");
    let denied = CallDenied::ControlPlaneNotReady { nodes: vec!["cp-2".into()] };
    let action = void.clone().authority(CallAuthority::Denied(denied.clone())).step();
    assert_eq!(action, Action::Wait { reason: MachineWait::CallNotAuthorised(denied), recheck_at: Some(at(1605)) });
    assert!(matches!(
        void.authority(CallAuthority::NeedsEtcdGate).step(),
        Action::Wait { reason: MachineWait::EtcdGateNotChecked, .. }
    ));
}

#[test]
fn authority_does_not_stop_a_machine_past_its_acknowledged_call() {
    let rebooting = Observed::fixture().upgrade_acknowledged().unreachable();
    let denied = rebooting.clone().authority(CallAuthority::Denied(CallDenied::Paused));
    assert_eq!(denied.step(), rebooting.step(), "observed to the end, whatever the authority");
    let verified = Observed::fixture().upgrade_acknowledged().rebooted_into("v1.14.4");
    assert_eq!(verified.authority(CallAuthority::Denied(CallDenied::Held)).step(), Action::RecordConverged);
}

// Review finding 7: an open evacuation never waits past its timeout, and none begins on a
// machine that could not then be called.

#[test]
fn an_evacuation_past_its_timeout_fails_even_on_a_not_ready_node() {
    // Open for 2 h against a 30 min bound, the node NotReady: before the fix, Wait(NodeNotReady).
    let o = Observed::fixture().storage(Some(2)).evacuating_since(at(1000)).now(at(1000 + 7200)).not_ready();
    assert!(
        matches!(o.step(), Action::FailEndingEvacuation(MachineFailure::EvacuationTimedOut { .. })),
        "{:?}",
        o.step()
    );
}

#[test]
fn no_evacuation_begins_on_a_machine_that_could_not_be_called() {
    let selected = Observed::fixture().storage(Some(3));
    assert_eq!(selected.step(), Action::BeginEvacuation);
    let no_boot_id = selected.clone().node(|n| n.boot_id = String::new());
    assert_eq!(no_boot_id.step(), Action::Wait { reason: MachineWait::BootIdUnknown, recheck_at: None });
    let busy = selected.clone().stage(MachineStage::Upgrading);
    assert!(matches!(busy.step(), Action::Wait { reason: MachineWait::MachineBusy { .. }, .. }));
    let unreachable = selected.unreachable();
    assert!(matches!(unreachable.step(), Action::Wait { reason: MachineWait::TalosApiUnreachable, .. }));
}

#[test]
fn waits_during_an_open_evacuation_recheck_at_its_deadline() {
    let o = Observed::fixture().storage(Some(2)).evacuating_since(at(900)).node(|n| n.boot_id = String::new());
    assert_eq!(o.step(), Action::Wait { reason: MachineWait::BootIdUnknown, recheck_at: Some(at(900 + 1800)) });
}

#[test]
fn waits_on_what_no_watch_reports_are_polled_and_waits_on_the_node_are_not() {
    // The Node is watched: a wait on it needs no recheck of its own.
    let not_ready = Observed::fixture().not_ready().step();
    assert_eq!(not_ready, Action::Wait { reason: MachineWait::NodeNotReady, recheck_at: None });
    let rebooting = Observed::fixture().upgrade_acknowledged().unreachable().step();
    assert!(
        matches!(rebooting, Action::Wait { reason: MachineWait::NotRebootedYet, recheck_at: Some(t) } if t == at(2700))
    );
    // Acknowledged and not rebooted yet: the step decides without Talos or etcd, and says so.
    let acked = Observed::fixture().control_plane().upgrade_acknowledged();
    assert!(!needs_talos(&acked.conditions, Some(BOOT_BEFORE)));
    assert!(needs_talos(&acked.conditions, Some(BOOT_AFTER)));
    assert!(
        needs_talos(&Observed::fixture().upgrade_intent().conditions, Some(BOOT_BEFORE)),
        "an intent needs the stage"
    );
    let mut unasked = acked.unreachable();
    unasked.etcd_member = None;
    assert_eq!(unasked.step(), Action::Wait { reason: MachineWait::NotRebootedYet, recheck_at: Some(at(2700)) });
    // A node whose Node shows its new boot but whose Talos API does not answer: no watch
    // reports Talos coming back, so it is polled (found by the operator's end-to-end test:
    // after a restart with no Talos credentials for a while, cp-2 was never looked at again).
    let rebooted_silent = Observed::fixture().upgrade_acknowledged().rebooted_into("v1.14.4").unreachable();
    assert_eq!(rebooted_silent.step(), Action::Wait { reason: MachineWait::Rebooting, recheck_at: Some(at(1005)) });
    // Storage, Talos and etcd are not: each is looked at again at the poll interval, never
    // later than the wait's own deadline.
    // Polls fall on a grid of the interval: machines waiting at once share one pass.
    let between = Observed::fixture().stage(MachineStage::Upgrading).now(Timestamp::from_unix_millis(1_001_500));
    assert_eq!(
        between.step(),
        Action::Wait {
            reason: MachineWait::MachineBusy { stage: MachineStage::Upgrading },
            recheck_at: Some(at(1005))
        }
    );
    let near_deadline = Observed::fixture().storage(Some(2)).evacuating_since(at(500)).now(at(2298));
    assert_eq!(
        near_deadline.step(),
        Action::Wait { reason: MachineWait::Evacuating { replicas_left: Some(2) }, recheck_at: Some(at(2300)) }
    );
}
