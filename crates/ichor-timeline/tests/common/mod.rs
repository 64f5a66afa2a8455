//! Traces shaped like the simulator's, for the timeline's tests.

use ichor_timeline::TraceRecord;

/// A legacy upgrade of `node` starting at `t0`, `len` seconds of reboot.
fn upgrade(records: &mut Vec<TraceRecord>, node: &str, role: &str, t0: f64, reboot: f64) {
    for (dt, event) in [
        (0.0, "evacuation-start"),
        (20.0, "evacuated"),
        (21.0, "image-pull-start"),
        (41.0, "image-pulled"),
        (41.5, "upgrade-call"),
        (100.0, "reboot-start"),
        (100.0 + reboot, "reboot-end"),
        (130.0 + reboot, "ready"),
        (133.0 + reboot, "converged"),
        (134.0 + reboot, "evacuation-end"),
    ] {
        records.push(TraceRecord::new(t0 + dt, node, role, event));
    }
}

/// `control_planes` one after another, then `workers` in pools of `k`, with an etcd
/// snapshot, an API outage, a controller restart and one A/B fallback among the workers.
#[allow(unreachable_pub, reason = "shared by the test files, each its own crate")]
pub fn trace(control_planes: usize, workers: usize, k: usize) -> Vec<TraceRecord> {
    let mut records = vec![TraceRecord::new(1.0, "cp-2", "control-plane", "etcd-snapshot")];
    let mut t = 2.0;
    for i in 1..=control_planes {
        upgrade(&mut records, &format!("cp-{i}"), "control-plane", t, 80.0 + (i % 3) as f64 * 10.0);
        t += 230.0;
    }
    let mut free = vec![t; k];
    for i in 1..=workers {
        let slot = (0..k).min_by(|a, b| free[*a].total_cmp(&free[*b])).unwrap_or(0);
        let reboot = 70.0 + ((i * 37) % 50) as f64;
        upgrade(&mut records, &format!("worker-{i}"), "worker", free[slot], reboot);
        free[slot] += 135.0 + reboot;
    }
    records.push(TraceRecord::new(t + 300.0, "cluster", "cluster", "api-outage"));
    records.push(TraceRecord::new(t + 420.0, "cluster", "cluster", "api-back"));
    records.push(TraceRecord::new(t + 500.0, "controller", "controller", "controller-restart"));
    records.push(TraceRecord::new(t + 510.0, "operation", "operation", "waiting").with_reason("EtcdUnhealthy"));
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    records
}
