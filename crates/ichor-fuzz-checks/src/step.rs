//! The Talos executor's step over arbitrary observations and conditions.

use std::time::Duration;

use arbitrary::{Result, Unstructured};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::{EvacuationState, STORAGE_EVACUATION, StorageObservation, evacuation_state};
use ichor_upgrade_core::machine::talos::{Action, StepInput, UpgradeTarget, step as decide};
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::machine::vocabulary::{
    EtcdMembership, MachineSpec, MachineStage, NodeObservation, StepTimeouts, TalosObservation,
};
use ichor_upgrade_core::rollout::{CallAuthority, CallDenied};
use ichor_upgrade_core::upgrade_marker::{TALOS_UPGRADE, UpgradeMarker};
use ichor_upgrade_core::versions::TalosVersion;

const BOOTS: [&str; 3] = ["0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11", "7e2d9c40-13b1-4c8f-8d7e-52a0c6f1e3b2", ""];

fn pick<'a, T: Copy>(u: &mut Unstructured<'a>, from: &[T]) -> Result<T> {
    Ok(*u.choose(from)?)
}

fn status(u: &mut Unstructured<'_>) -> Result<ConditionStatus> {
    pick(u, &[ConditionStatus::True, ConditionStatus::False, ConditionStatus::Unknown])
}

fn time(u: &mut Unstructured<'_>) -> Result<Timestamp> {
    Ok(Timestamp::from_unix_secs(u.int_in_range(-10_000i64..=20_000)?))
}

/// One arbitrary observation: its parts, kept so the properties can read them.
struct Case {
    machine: MachineSpec,
    target: UpgradeTarget,
    node: Option<NodeObservation>,
    talos: TalosObservation,
    conditions: Conditions,
    storage: StorageObservation,
    etcd_member: Option<EtcdMembership>,
    timeouts: StepTimeouts,
    now: Timestamp,
}

fn case(u: &mut Unstructured<'_>) -> Result<Case> {
    let target = TalosVersion::parse("v1.14.4").expect("a version");
    let role = if u.arbitrary()? { MachineRole::ControlPlane } else { MachineRole::Worker };
    let os_images = ["Talos (v1.14.3)", "Talos (v1.14.4)", "Talos (v1.12.0)", "Talos (v1.14.5)", "Talos (banana)", ""];
    let node = if u.ratio(9, 10)? {
        Some(NodeObservation {
            name: "node-1".to_owned(),
            ready: u.arbitrary()?,
            os_image: pick(u, &os_images)?.to_owned(),
            boot_id: pick(u, &BOOTS)?.to_owned(),
            schematic: if u.ratio(4, 5)? {
                Some("376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".to_owned())
            } else {
                None
            },
        })
    } else {
        None
    };
    let stages = [
        MachineStage::Running,
        MachineStage::Upgrading,
        MachineStage::Booting,
        MachineStage::Rebooting,
        MachineStage::Maintenance,
    ];
    let talos = match u.int_in_range(0u8..=2)? {
        0 => TalosObservation::Answered { stage: pick(u, &stages)? },
        1 => TalosObservation::Unreachable { error: "refused".to_owned() },
        _ => TalosObservation::Error { error: "denied".to_owned() },
    };
    let mut conditions = Conditions::new();
    if u.arbitrary()? {
        let message = match u.int_in_range(0u8..=3)? {
            0 | 1 => UpgradeMarker {
                target: if u.ratio(4, 5)? {
                    target.clone()
                } else {
                    TalosVersion::parse("v1.14.3").expect("a version")
                },
                boot_id: pick(u, &BOOTS[..2])?.to_owned(),
                call_deadline: time(u)?,
                node: Some("node-1".to_owned()),
            }
            .to_string(),
            2 => "Upgrade request received".to_owned(),
            _ => u.arbitrary::<String>()?,
        };
        let (s, since) = (status(u)?, time(u)?);
        conditions.upsert(ConditionUpdate::new(TALOS_UPGRADE, s, "Fuzz", message), since);
    }
    if u.arbitrary()? {
        let (s, since) = (status(u)?, time(u)?);
        conditions.upsert(ConditionUpdate::new(STORAGE_EVACUATION, s, "Fuzz", ""), since);
    }
    let storage = StorageObservation {
        selected_by: if u.arbitrary()? { vec!["replicated".to_owned()] } else { vec![] },
        replicas_left: if u.arbitrary()? { Some(u.int_in_range(0u32..=3)?) } else { None },
        // The driver folds the backend's record into the conditions before the step.
        recorded: None,
        evacuation_timeout: if u.arbitrary()? { Some(Duration::from_secs(u.int_in_range(1u64..=3600)?)) } else { None },
    };
    let etcd_member = match u.int_in_range(0u8..=4)? {
        0 => None,
        1 => Some(EtcdMembership::Voter),
        2 => Some(EtcdMembership::Learner),
        3 => Some(EtcdMembership::Absent),
        _ => Some(EtcdMembership::Unknown { error: "timeout".to_owned() }),
    };
    let mut timeouts = StepTimeouts::default();
    timeouts.evacuation = Duration::from_secs(u.int_in_range(1u64..=3600)?);
    Ok(Case {
        machine: MachineSpec { name: "m".to_owned(), role },
        target: UpgradeTarget {
            version: target,
            schematic: None,
            platform: pick(u, &["metal", "aws", "Bad/Platform"])?.to_owned(),
            kubernetes_version: pick(u, &["1.34.1", "1.31.0", "banana"])?.to_owned(),
        },
        node,
        talos,
        conditions,
        storage,
        etcd_member,
        timeouts,
        now: time(u)?,
    })
}

/// The step never panics, decides the same twice, never calls Upgrade on an acknowledged
/// marker for this target or while an evacuation is under way or timed out, and never
/// converges a node that rebooted into another version after a call for this target.
pub fn step(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(c) = case(&mut u) else { return };
    // Read last, so that older corpus entries decode as before (and mostly grant).
    let authority = match u.int_in_range(0u8..=3).unwrap_or(0) {
        1 => CallAuthority::NeedsEtcdGate,
        2 => CallAuthority::Denied(CallDenied::Paused),
        3 => CallAuthority::Denied(CallDenied::ControlPlaneNotReady { nodes: vec!["other".to_owned()] }),
        _ => CallAuthority::Granted,
    };
    let input = StepInput {
        machine: &c.machine,
        target: &c.target,
        node: c.node.as_ref(),
        talos: &c.talos,
        conditions: &c.conditions,
        storage: &c.storage,
        etcd_member: c.etcd_member.as_ref(),
        authority: &authority,
        timeouts: &c.timeouts,
        now: c.now,
    };
    let action = decide(&input);
    assert_eq!(action, decide(&input), "not deterministic");

    let marker = c.conditions.get(TALOS_UPGRADE).filter(|m| m.status != ConditionStatus::False);
    let parsed = marker.and_then(|m| UpgradeMarker::parse(&m.message).ok()).filter(|m| m.target == c.target.version);
    if let Action::Upgrade { .. } = action {
        assert_eq!(authority, CallAuthority::Granted, "an Upgrade call without the authority of this pass");
        let acknowledged = marker.is_some_and(|m| m.status == ConditionStatus::True);
        assert!(!(acknowledged && parsed.is_some()), "an Upgrade call for an acknowledged one");
        assert!(marker.is_none() || parsed.is_some(), "an Upgrade call past a garbled or foreign marker");
        let evacuation = evacuation_state(&c.conditions, &c.storage, c.timeouts.evacuation, c.now);
        assert!(
            !matches!(
                evacuation,
                EvacuationState::InProgress { .. } | EvacuationState::TimedOut { .. } | EvacuationState::NotStarted
            ),
            "an Upgrade call with the evacuation {evacuation:?}"
        );
    }
    if let (Some(m), Some(node)) = (&parsed, &c.node) {
        let rebooted = node.boot_id != m.boot_id && ichor_upgrade_core::upgrade_marker::is_valid_boot_id(&node.boot_id);
        let elsewhere = TalosVersion::from_os_image(&node.os_image).is_ok_and(|v| v != c.target.version);
        if rebooted && elsewhere {
            assert!(!matches!(action, Action::Converged | Action::RecordConverged), "an A/B fallback converged");
        }
    }
}
