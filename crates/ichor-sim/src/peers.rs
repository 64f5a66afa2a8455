//! Other tools' rollout policies on the same drawn durations, for `rollout --compare`.
//!
//! Each policy is list scheduling over the machines' drawn times (evacuation, upgrade and
//! reboot until Ready: [`Drawn::machine_time`](super::world::Drawn::machine_time)), in the
//! engine's order: control planes one at a time, then workers. The peers are modelled as
//! if they learned of each machine's end at the instant it happens and added only their
//! own fixed waits, which favours them: the engine is measured under watches and latency.
//!
//! - `ideal`: a pool of `k`, each worker started the instant a slot frees (DESIGN §10).
//! - `mco-like`: a pool of `k`, with machine starts at least 20 s apart (a fixed gap
//!   between machines, as the machine-config operator paces its pool).
//! - `topf-like`: a pool of `k`, each slot sleeping 30 s after its machine before the next
//!   (a fixed stabilisation sleep).
//! - `tuppr-like`: batches of `k` with a barrier: a batch starts when the whole previous
//!   batch is done.
//! - `runbook`: one machine at a time, a 30 s health gate after each (the operator's
//!   runbook script: `talosctl upgrade --wait`, then the cluster's health, then the next).

use ichor_upgrade_core::machine::vocabulary::MachineRole;

use super::world::World;

/// A peer's fixed gap between machine starts in the pool (`mco-like`), seconds.
pub const MCO_START_GAP_S: f64 = 20.0;
/// A peer's stabilisation sleep after each machine (`topf-like`), seconds.
pub const TOPF_SLEEP_S: f64 = 30.0;
/// The runbook's health gate after each machine, seconds.
pub const RUNBOOK_GATE_S: f64 = 30.0;

/// One policy's makespan on the run's drawn durations.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeerRun {
    /// The policy's name.
    pub policy: &'static str,
    /// Its makespan, seconds.
    pub makespan_s: f64,
}

/// Every peer policy's makespan on the world's drawn durations, at `max_unavailable`.
#[must_use]
pub fn peers(world: &World, max_unavailable: usize) -> Vec<PeerRun> {
    let k = max_unavailable.max(1);
    let times = |role: MachineRole| {
        let mut nodes: Vec<_> = world.nodes.iter().filter(|n| n.role == role).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.into_iter().map(|n| n.drawn.machine_time().as_secs_f64()).collect::<Vec<f64>>()
    };
    let (cps, workers) = (times(MachineRole::ControlPlane), times(MachineRole::Worker));
    vec![
        PeerRun { policy: "ideal", makespan_s: pool(&cps, &workers, k, 0.0, 0.0) },
        PeerRun { policy: "mco-like", makespan_s: pool(&cps, &workers, k, 0.0, MCO_START_GAP_S) },
        PeerRun { policy: "topf-like", makespan_s: pool(&cps, &workers, k, TOPF_SLEEP_S, 0.0) },
        PeerRun { policy: "tuppr-like", makespan_s: batches(&cps, &workers, k) },
        PeerRun { policy: "runbook", makespan_s: pool(&cps, &workers, 1, RUNBOOK_GATE_S, 0.0) },
    ]
}

/// Control planes in series, then workers in a pool of `k`: a slot is free again `sleep`
/// after its machine ends, and starts are at least `spacing` apart.
fn pool(cps: &[f64], workers: &[f64], k: usize, sleep: f64, spacing: f64) -> f64 {
    let mut end = 0.0_f64;
    let mut free = 0.0_f64;
    let mut last_start = f64::NEG_INFINITY;
    for d in cps {
        let start = free.max(last_start + spacing);
        end = end.max(start + d);
        free = start + d + sleep;
        last_start = start;
    }
    let mut slots = vec![free; k];
    for d in workers {
        let (i, at) = slots.iter().copied().enumerate().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, free));
        let start = at.max(last_start + spacing);
        end = end.max(start + d);
        slots[i] = start + d + sleep;
        last_start = start;
    }
    end
}

/// Control planes in series, then workers in batches of `k`, each batch after the whole
/// previous one.
fn batches(cps: &[f64], workers: &[f64], k: usize) -> f64 {
    let mut t: f64 = cps.iter().sum();
    for batch in workers.chunks(k) {
        t += batch.iter().copied().fold(0.0, f64::max);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_schedules_as_documented() {
        let cps = [100.0, 100.0];
        let workers = [50.0, 10.0, 10.0, 50.0];
        assert!((pool(&cps, &workers, 2, 0.0, 0.0) - 270.0).abs() < 1e-9, "ideal: 200, then 50 | 10 + 10 + 50");
        assert!((batches(&cps, &workers, 2) - 300.0).abs() < 1e-9, "barrier: 200 + 50 + 50");
        // One at a time with a gate after each: 6 machines' time plus 5 gates before the last.
        assert!((pool(&cps, &workers, 1, 30.0, 0.0) - (320.0 + 5.0 * 30.0)).abs() < 1e-9);
        // Starts 20 s apart: the second worker waits for the spacing, not for a slot.
        let spaced = pool(&[], &[10.0, 10.0], 2, 0.0, 20.0);
        assert!((spaced - 30.0).abs() < 1e-9, "{spaced}");
    }
}
