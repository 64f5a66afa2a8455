//! Fixtures for the Criterion benchmarks in `benches/benches/`; run them with
//! `cargo bench -p ichor-benches`. Figures and commands are recorded in
//! `docs/performance.md`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::time::Duration;

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::rollout::{LeaseHolder, MachineView, OperationView};
use ichor_upgrade_core::status::{MachineProgress, OperationStatus};

/// The operation identity used by the fixtures.
pub const IDENTITY: &str = "ops/upgrade/uid";

/// A cluster in mid-rollout: 3 control planes converged, `workers` workers of which the
/// first third converged, `max_unavailable` in progress, the rest pending, in four order
/// waves; a few NotReady and held. The engine must look at every machine to decide.
#[must_use]
pub fn mid_rollout(workers: usize, max_unavailable: usize) -> Vec<MachineView> {
    let mut machines: Vec<MachineView> = (1..=3)
        .map(|i| MachineView {
            name: format!("cp-{i}"),
            role: MachineRole::ControlPlane,
            order_label: None,
            held: false,
            node_ready: true,
            os_image: Some("Talos (v1.14.4)".to_owned()),
            progress: MachineProgress::Converged,
            last: false,
        })
        .collect();
    let converged = workers / 3;
    for i in 0..workers {
        let progress = if i < converged {
            MachineProgress::Converged
        } else if i < converged + max_unavailable {
            MachineProgress::InProgress { past_upgrade_call: i % 2 == 0 }
        } else {
            MachineProgress::Pending
        };
        machines.push(MachineView {
            name: format!("worker-{}", i + 1),
            role: MachineRole::Worker,
            order_label: Some((i * 4 / workers.max(1)).to_string()),
            held: i % 97 == 96,
            node_ready: i % 89 != 88,
            os_image: Some("Talos (v1.14.3)".to_owned()),
            progress,
            last: false,
        });
    }
    machines
}

/// An operation holding a fresh lock, with `max_unavailable`.
#[must_use]
pub fn operation(max_unavailable: i64) -> (OperationView, LeaseHolder) {
    let op = OperationView {
        identity: IDENTITY.to_owned(),
        generation: 1,
        deleting: false,
        resume_token: None,
        pause_requested: None,
        spec: OperationSpec::talos("v1.14.4", max_unavailable),
        status: OperationStatus::default(),
    };
    let lease = LeaseHolder {
        identity: IDENTITY.to_owned(),
        renewed_at: Timestamp::from_unix_secs(1_000),
        lease_duration: Duration::from_secs(120),
        holder_exists: true,
    };
    (op, lease)
}
