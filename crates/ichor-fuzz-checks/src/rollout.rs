//! The rollout engine's decision over arbitrary clusters.

use std::time::Duration;

use arbitrary::{Result, Unstructured};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::operation::{MachineRole, OperationSpec};
use ichor_upgrade_core::rollout::{
    EtcdVerdict, LeaseHolder, MachineProgress, MachineView, OperationStatus, OperationView, RolloutConfig,
    RolloutInput, decide,
};

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
            progress,
        });
    }
    Ok(machines)
}

/// One decision over an arbitrary cluster: never a second control plane, never over
/// maxUnavailable counting workers already unavailable, never a start while paused or
/// without the lock.
pub fn rollout(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(machines) = cluster(&mut u) else { return };
    let (Ok(max), Ok(lock), Ok(verdict), Ok(resume)) =
        (u.int_in_range(-1i64..=8), u.int_in_range(0u8..=4), u.int_in_range(0u8..=2), u.int_in_range(0u8..=2))
    else {
        return;
    };
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
        spec: OperationSpec { kind: "talos".into(), target_version: "v1.14.4".into(), max_unavailable: max },
        status: OperationStatus {
            observed_resume: (resume == 2).then(|| "t".to_owned()),
            ..OperationStatus::default()
        },
    };
    let config = RolloutConfig::default();
    let input = RolloutInput {
        operation: &op,
        release_talos_version: "v1.14.4",
        lease: lease.as_ref(),
        machines: &machines,
        etcd: &etcd,
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
}
