//! Evacuation's invariants over random simulated clusters, read from the world's trace:
//! - never an Upgrade call while the node's evacuation is under way;
//! - after a successful upgrade, storage scheduling comes back only after the node is Ready
//!   on the target;
//! - after an upgrade-side evacuation timeout, no further machine starts, and scheduling is
//!   back on;
//! - never a drain on removal while an evacuation is open and unfinished;
//! - after a removal-side timeout, scheduling is back on, a Warning event exists, and the
//!   evacuation starts again.

use ichor_executor::ExecutorConfig;
use ichor_executor::kube_api::EventType;
use ichor_sim::{Fault, RunEnd, SimCluster, SimConfig, TraceEvent, TraceKind, run_operation, run_removal};
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::versions::TalosVersion;
use proptest::prelude::*;

fn world(control_planes: usize, workers: usize, seed: u64, faults: Vec<Fault>) -> SimCluster {
    let v = |t: &str| TalosVersion::parse(t).unwrap();
    SimCluster::new(
        SimConfig::new(control_planes, workers, v("v1.14.3"), v("v1.14.4")).with_seed(seed).with_faults(faults),
    )
}

fn block_on<T>(future: impl Future<Output = T>) -> T {
    ichor_sim::runtime().block_on(future)
}

fn of<'a>(trace: &'a [TraceEvent], node: &str) -> Vec<&'a TraceEvent> {
    trace.iter().filter(|e| e.node == node).collect()
}

/// Whether an evacuation is under way (started, not evacuated, not ended) just before
/// each event of one node's trace.
fn evacuating_before(events: &[&TraceEvent]) -> Vec<bool> {
    let mut under_way = false;
    events
        .iter()
        .map(|e| {
            let before = under_way;
            match e.event {
                TraceKind::EvacuationStart => under_way = true,
                TraceKind::Evacuated | TraceKind::EvacuationEnd => under_way = false,
                _ => {}
            }
            before
        })
        .collect()
}

fn faults() -> impl Strategy<Value = Vec<Fault>> {
    let all = [Fault::EvacuationStuck, Fault::SlowReboot, Fault::NotReady, Fault::AbFallback];
    prop::collection::vec(any::<bool>(), all.len())
        .prop_map(move |on| all.iter().zip(on).filter(|(_, on)| *on).map(|(f, _)| *f).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::cases("EVACUATION_CASES", 300), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn upgrades_keep_every_evacuation_invariant(
        control_planes in 1usize..=3,
        workers in 1usize..=6,
        max_unavailable in 1i64..=3,
        seed in any::<u64>(),
        faults in faults(),
    ) {
        let stuck = faults.contains(&Fault::EvacuationStuck);
        let sim = world(control_planes, workers, seed, faults.clone());
        sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", max_unavailable));
        let end = block_on(run_operation(&sim, "upgrade", &ExecutorConfig::default(), 20_000, |_| {}));
        let replay = format!("seed {seed}, {control_planes}+{workers}, maxUnavailable {max_unavailable}, faults {faults:?}");
        if control_planes == 2 {
            // Refused at planning: a two-member etcd cannot lose a member to a reboot.
            prop_assert_eq!(&end, &RunEnd::Refused, "{}", replay);
        } else {
            prop_assert!(matches!(end, RunEnd::Completed | RunEnd::Paused), "{:?}; {}", end, replay);
        }
        sim.with_world(|w| -> Result<(), TestCaseError> {
            for node in &w.nodes {
                let events = of(&w.trace, &node.name);
                for (e, evacuating) in events.iter().zip(evacuating_before(&events)) {
                    prop_assert!(!(e.event == TraceKind::UpgradeCall && evacuating), "{} called while evacuating; {}", node.name, replay);
                }
                // Scheduling comes back only after the node is Ready on the target.
                let converged = events.iter().any(|e| e.event == TraceKind::Converged);
                if converged && let Some(end_at) = events.iter().rposition(|e| e.event == TraceKind::EvacuationEnd) {
                    let ready_on_target = events[..end_at]
                        .iter()
                        .any(|e| e.event == TraceKind::Ready && e.version.as_deref() == Some("v1.14.4"));
                    let called = events[..end_at].iter().any(|e| e.event == TraceKind::UpgradeCall);
                    prop_assert!(!called || ready_on_target, "{}: scheduling back before Ready on target; {}", node.name, replay);
                }
            }
            if stuck && let Some(node) = w.nodes.iter().find(|n| n.stuck) {
                let failed_at = w.trace.iter().find(|e| e.node == node.name && e.event == TraceKind::Failed).map(|e| e.t);
                if let Some(failed_at) = failed_at {
                    prop_assert!(node.scheduling, "{}: scheduling left off after its timeout; {}", node.name, replay);
                    let later_start = w.trace.iter().any(|e| e.t > failed_at && e.node != node.name
                        && matches!(e.event, TraceKind::EvacuationStart | TraceKind::UpgradeCall));
                    prop_assert!(!later_start, "a machine started after the evacuation timeout paused; {}", replay);
                    prop_assert_eq!(end, RunEnd::Paused);
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn removals_never_drain_with_an_evacuation_open(
        control_planes in 1usize..=3,
        workers in 1usize..=4,
        seed in any::<u64>(),
        stuck in any::<bool>(),
        pdb in any::<bool>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut faults = Vec::new();
        if stuck { faults.push(Fault::EvacuationStuck) }
        if pdb { faults.push(Fault::PdbBlocked) }
        let sim = world(control_planes, workers, seed, faults);
        let node = sim.with_world(|w| {
            let candidates: Vec<&str> = w.nodes.iter().filter(|n| n.role.as_str() == "worker" || control_planes > 1).map(|n| n.name.as_str()).collect();
            candidates[pick.index(candidates.len())].to_owned()
        });
        let is_stuck = sim.with_world(|w| w.nodes.iter().any(|n| n.name == node && n.stuck));
        let end = block_on(run_removal(&sim, &node, &ExecutorConfig::default(), 600));
        let replay = format!("seed {seed}, {control_planes}+{workers}, remove {node}, stuck {stuck}, pdb {pdb}");
        if is_stuck {
            prop_assert_eq!(&end, &RunEnd::PassBound, "{}", replay);
        } else {
            prop_assert_eq!(&end, &RunEnd::Completed, "{}", replay);
        }
        sim.with_world(|w| -> Result<(), TestCaseError> {
            let events = of(&w.trace, &node);
            for (e, evacuating) in events.iter().zip(evacuating_before(&events)) {
                prop_assert!(!(e.event == TraceKind::Drain && evacuating), "drained while evacuating; {}", replay);
            }
            if is_stuck {
                let restarts = events.iter().filter(|e| e.event == TraceKind::EvacuationStart).count();
                let ends = events.iter().filter(|e| e.event == TraceKind::EvacuationEnd).count();
                prop_assert!(restarts >= 2 && ends >= 1, "timeouts end and restart the evacuation; {}", replay);
                prop_assert!(w.events.iter().any(|e| e.type_ == EventType::Warning && e.reason == "EvacuationTimedOut" && e.name == node));
                prop_assert!(!events.iter().any(|e| e.event == TraceKind::Drain), "{}", replay);
            }
            // Nothing else was touched.
            prop_assert!(w.nodes.iter().filter(|n| n.name != node).all(|n| !n.removed && n.ready && !n.unschedulable), "{}", replay);
            Ok(())
        })?;
    }
}
