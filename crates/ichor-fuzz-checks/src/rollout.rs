//! The rollout engine's decision over arbitrary clusters.

use std::time::Duration;

use arbitrary::{Result, Unstructured};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::rollout::{
    CallAuthority, ComponentsVerdict, EtcdVerdict, LeaseHolder, MachineView, OperationView, RolloutConfig,
    RolloutInput, decide,
};
use ichor_upgrade_core::status::{MachineProgress, OperationStatus, Phase};

fn cluster(u: &mut Unstructured<'_>) -> Result<Vec<MachineView>> {
    let cps = u.int_in_range(1usize..=7)?;
    let workers = u.int_in_range(0usize..=60)?;
    let mut machines = Vec::new();
    let mut cp_busy = false;
    for i in 0..cps + workers {
        let role = if i < cps { MachineRole::ControlPlane } else { MachineRole::Worker };
        let mut progress = match u.int_in_range(0u8..=5)? {
            0 | 1 => MachineProgress::Pending,
            2 => MachineProgress::Converged,
            3 => MachineProgress::InProgress { past_upgrade_call: u.arbitrary()? },
            4 => MachineProgress::Failed { reason: "x".to_owned() },
            _ => MachineProgress::Pending,
        };
        // A state the engine can be in: at most one control plane in progress.
        if role == MachineRole::ControlPlane && matches!(progress, MachineProgress::InProgress { .. }) {
            if cp_busy {
                progress = MachineProgress::Converged;
            }
            cp_busy = true;
        }
        let order_label = match u.int_in_range(0u8..=4)? {
            0 => Some(u.int_in_range(-2i64..=3)?.to_string()),
            1 => Some(u.arbitrary::<String>()?),
            _ => None,
        };
        machines.push(MachineView {
            name: format!("m-{i:03}"),
            role,
            order_label,
            held: u.ratio(1, 10)?,
            node_ready: u.ratio(9, 10)?,
            os_image: Some("Talos (v1.14.3)".to_owned()),
            progress,
            last: false,
        });
    }
    Ok(machines)
}

/// One decision over an arbitrary cluster: never a second control plane, never over
/// maxUnavailable counting workers already unavailable, never a start while paused or
/// without the lock, never an Upgrade call authorised against the rules, and nothing at
/// all when planning refuses.
pub fn rollout(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(mut machines) = cluster(&mut u) else { return };
    let (Ok(max), Ok(lock), Ok(verdict), Ok(resume)) =
        (u.int_in_range(-1i64..=8), u.int_in_range(0u8..=4), u.int_in_range(0u8..=2), u.int_in_range(0u8..=2))
    else {
        return;
    };
    // What planning sees, read last so that older corpus entries decode as before.
    let mut kubernetes = "1.34.1";
    match u.int_in_range(0u8..=3).unwrap_or(0) {
        1 => {
            if let Some(m) = machines.last_mut() {
                m.os_image = Some("Talos (v1.12.5)".to_owned());
            }
        }
        2 => kubernetes = "1.31.0",
        3 => {
            if let Some(m) = machines.first_mut() {
                m.os_image = None;
            }
        }
        _ => {}
    }
    // A person's pause (`ichor.dev/pause`), read after the rest for the same reason.
    let requested = u.int_in_range(0u8..=3).unwrap_or(0) == 3;
    let identity = "ns/op/uid";
    let lease = match lock {
        0 => None,
        1 => Some(LeaseHolder {
            identity: identity.into(),
            renewed_at: Timestamp::from_unix_secs(990),
            lease_duration: Duration::from_secs(120),
            holder_exists: true,
        }),
        2 => Some(LeaseHolder {
            identity: "other".into(),
            renewed_at: Timestamp::from_unix_secs(990),
            lease_duration: Duration::from_secs(120),
            holder_exists: true,
        }),
        3 => Some(LeaseHolder {
            identity: "other".into(),
            renewed_at: Timestamp::from_unix_secs(990),
            lease_duration: Duration::from_secs(120),
            holder_exists: false,
        }),
        _ => Some(LeaseHolder {
            identity: "other".into(),
            renewed_at: Timestamp::from_unix_secs(0),
            lease_duration: Duration::from_secs(120),
            holder_exists: true,
        }),
    };
    let etcd = match verdict {
        0 => EtcdVerdict::Healthy,
        1 => EtcdVerdict::NotChecked,
        _ => EtcdVerdict::Unhealthy { reason: "x".into() },
    };
    let op = OperationView {
        identity: identity.into(),
        generation: 1,
        deleting: false,
        resume_token: (resume > 0).then(|| "t".to_owned()),
        pause_requested: requested.then(|| "a person".to_owned()),
        spec: OperationSpec {
            preflight: None,
            allow_two_control_planes: false,
            etcd_snapshot: None,
            kind: "talos".into(),
            target_version: "v1.14.4".into(),
            max_unavailable: max.into(),
            machine: None,
        },
        status: OperationStatus {
            observed_resume: (resume == 2).then(|| "t".to_owned()),
            ..OperationStatus::default()
        },
    };
    let config = RolloutConfig::default();
    let input = RolloutInput {
        kubernetes: None,
        operation: &op,
        release_talos_version: "v1.14.4",
        releases: ichor_upgrade_core::releases::KnownReleases::built_in(),
        kubernetes_version: kubernetes,
        lease: lease.as_ref(),
        machines: &machines,
        unaccounted_nodes: &[],
        etcd: &etcd,
        components: &ComponentsVerdict::all_ready(),
        preflight: &ichor_upgrade_core::rollout::PreflightVerdict::Off,
        windows: None,
        gates: None,
        config: &config,
        now: Timestamp::from_unix_secs(1_000),
    };
    let d = decide(&input);
    assert_eq!(d, decide(&input), "not deterministic");

    let ours = lease.as_ref().is_some_and(|l| l.identity == identity);
    if !ours {
        assert!(d.start.is_empty() && d.advance.is_empty() && d.stop.is_empty(), "moved without the lock");
    }
    let resuming = resume == 1;
    if machines.iter().any(|m| matches!(m.progress, MachineProgress::Failed { .. })) && !resuming {
        assert!(d.start.is_empty(), "started while paused");
    }
    if requested {
        assert!(d.start.is_empty(), "started while a person paused it");
    }
    let find = |name: &str| machines.iter().find(|m| m.name == name).expect("a started machine exists");
    let cp_started = d.start.iter().filter(|n| find(n).role == MachineRole::ControlPlane).count();
    let cp_busy = machines
        .iter()
        .filter(|m| m.role == MachineRole::ControlPlane && matches!(m.progress, MachineProgress::InProgress { .. }))
        .count();
    assert!(cp_busy + cp_started <= 1, "a second control plane");
    let workers_started = d.start.len() - cp_started;
    if workers_started > 0 {
        let unavailable = machines
            .iter()
            .filter(|m| m.role == MachineRole::Worker)
            .filter(|m| matches!(m.progress, MachineProgress::InProgress { .. }) || !m.node_ready)
            .count();
        assert!(unavailable + workers_started <= usize::try_from(max).unwrap_or(0), "over maxUnavailable");
    }
    if matches!(d.phase, Phase::Refused(_)) {
        assert!(d.start.is_empty(), "started while refused");
    }
    let moved: Vec<&String> = d.start.iter().chain(&d.advance).collect();
    assert_eq!(d.authority.len(), moved.len(), "every machine moved carries its authority");
    let cp_not_ready: Vec<&str> = machines
        .iter()
        .filter(|m| m.role == MachineRole::ControlPlane && !m.node_ready)
        .map(|m| m.name.as_str())
        .collect();
    for name in moved {
        let m = find(name);
        if d.authority.get(name) != Some(&CallAuthority::Granted) {
            continue;
        }
        assert!(ours && !op.deleting && !m.held, "a call authorised without the lock, or for a held machine");
        let paused = machines.iter().any(|m| matches!(m.progress, MachineProgress::Failed { .. }));
        assert!(!paused || resuming, "a call authorised while paused");
        assert!(!requested, "a call authorised while a person paused it");
        if m.role == MachineRole::ControlPlane {
            assert_eq!(etcd, EtcdVerdict::Healthy, "a control plane's call authorised without the gate");
            assert!(cp_not_ready.iter().all(|n| *n == m.name), "a control plane's call authorised with another down");
        }
    }
}
