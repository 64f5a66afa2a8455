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

/// What the ideal scheduler takes on these durations, in this order (seconds each):
/// control planes one at a time, then workers in a pool of `k`, each started the instant a
/// slot frees. The measure of a run's turns ([`Turn`]) against its makespan.
#[must_use]
pub fn ideal(cps: &[f64], workers: &[f64], k: usize) -> f64 {
    pool(cps, workers, k.max(1), 0.0, 0.0)
}

/// One machine's turn in a run, in the simulation's seconds since its start: from the
/// first call that began it (an install, an Upgrade call or a storage evacuation) to its
/// Node's last turn Ready on the version it was upgraded to.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Turn {
    /// The machine.
    pub node: String,
    /// Its role.
    pub role: &'static str,
    /// When its turn began.
    pub started_s: f64,
    /// When it was Ready after it; `None` while it is not.
    pub ended_s: Option<f64>,
}

/// The turns of every machine `trace` shows begun, in the order they began.
#[must_use]
pub fn turns(trace: &[crate::TraceEvent]) -> Vec<Turn> {
    use crate::TraceKind;
    let mut turns: Vec<Turn> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for event in trace {
        let begins =
            matches!(event.event, TraceKind::InstallStart | TraceKind::UpgradeCall | TraceKind::EvacuationStart);
        match index.get(event.node.as_str()) {
            None if begins => {
                index.insert(&event.node, turns.len());
                turns.push(Turn { node: event.node.clone(), role: event.role, started_s: event.t, ended_s: None });
            }
            Some(&i) if event.event == TraceKind::Ready => turns[i].ended_s = Some(event.t),
            Some(&i) if matches!(event.event, TraceKind::NotReady | TraceKind::RebootStart) => turns[i].ended_s = None,
            _ => {}
        }
    }
    turns
}

/// A run's makespan from its turns (the first begun to the last ended), and what the ideal
/// scheduler takes on the same turns' durations in the order they began, with `k` workers
/// at once; `None` while a turn has not ended.
#[must_use]
pub fn makespan_against_ideal(turns: &[Turn], k: usize) -> Option<(f64, f64)> {
    let first = turns.iter().map(|t| t.started_s).fold(f64::INFINITY, f64::min);
    let mut last = f64::NEG_INFINITY;
    let (mut cps, mut workers) = (Vec::new(), Vec::new());
    for turn in turns {
        let ended = turn.ended_s?;
        last = last.max(ended);
        let took = ended - turn.started_s;
        if turn.role == MachineRole::ControlPlane.as_str() { cps.push(took) } else { workers.push(took) }
    }
    (!turns.is_empty()).then(|| (last - first, ideal(&cps, &workers, k)))
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

    fn event(t: f64, node: &str, role: MachineRole, event: crate::TraceKind) -> crate::TraceEvent {
        crate::TraceEvent {
            t,
            node: node.into(),
            role: role.as_str(),
            event,
            version: None,
            boot_id: None,
            reason: None,
            message: None,
            component: None,
            bytes: None,
        }
    }

    /// Issue 57 item 3: a run's turns, measured from its trace, against the ideal
    /// scheduler on the same turns: a worker started 30 s after a slot freed shows as the
    /// makespan's excess.
    #[test]
    fn turns_are_read_from_the_trace_and_measured_against_the_ideal() {
        use crate::TraceKind::{InstallStart, NotReady, Ready, RebootStart, UpgradeCall};
        let (cp, w) = (MachineRole::ControlPlane, MachineRole::Worker);
        let trace = [
            event(0.0, "cp-1", cp, Ready),
            event(10.0, "cp-1", cp, UpgradeCall),
            event(40.0, "cp-1", cp, RebootStart),
            event(41.0, "cp-1", cp, NotReady),
            event(110.0, "cp-1", cp, Ready),
            event(110.0, "worker-1", w, InstallStart),
            event(170.0, "worker-1", w, Ready),
            // Its slot freed at 170; it began 30 s later.
            event(200.0, "worker-2", w, InstallStart),
            event(250.0, "worker-2", w, RebootStart),
        ];
        let turns = turns(&trace);
        assert_eq!(
            turns.iter().map(|t| (t.node.as_str(), t.started_s, t.ended_s)).collect::<Vec<_>>(),
            [("cp-1", 10.0, Some(110.0)), ("worker-1", 110.0, Some(170.0)), ("worker-2", 200.0, None),]
        );
        assert_eq!(makespan_against_ideal(&turns, 1), None, "a turn not ended");
        let mut ended = turns;
        ended[2].ended_s = Some(290.0);
        let (makespan, ideal) = makespan_against_ideal(&ended, 1).unwrap();
        assert!((makespan - 280.0).abs() < 1e-9, "{makespan}");
        assert!((ideal - 250.0).abs() < 1e-9, "100 + 60 + 90: {ideal}");
        let (_, two_at_once) = makespan_against_ideal(&ended, 2).unwrap();
        assert!((two_at_once - 190.0).abs() < 1e-9, "100, then 90 beside 60: {two_at_once}");
    }
}
