//! Properties another operator's suite asks of the engine, over arbitrary simulated
//! clusters (roles, order labels, holds, NotReady Nodes) and fault schedules, read from the
//! simulator's report and trace. Few cases each: this suite runs beside the workspace's
//! own, much larger, properties.

use ichor_executor::ExecutorConfig;
use ichor_sim::strategies::{HARMLESS, SimCase, TO, fault_schedule_among, sim_case, sim_case_with};
use ichor_sim::{Fault, RunEnd, SimCluster, TraceKind};
use ichor_upgrade_core::machine::lifecycle::ExecutorChoice;
use ichor_upgrade_core::strategies::{MachineShape, cluster_shape, cluster_shape_with};
use proptest::prelude::*;

const MAX_PASSES: usize = 20_000;

fn executor(lifecycle: bool) -> ExecutorConfig {
    let choice = if lifecycle { ExecutorChoice::Lifecycle } else { ExecutorChoice::Legacy };
    ExecutorConfig::default().with_executor(choice)
}

fn run(case: &SimCase, lifecycle: bool) -> (RunEnd, SimCluster) {
    let sim = case.build();
    let end = case.run(&sim, &executor(lifecycle), MAX_PASSES);
    (end, sim)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Whatever the cluster and whatever goes wrong: never two control planes down at once,
    /// and once a node has fallen back to its old version (A/B), the engine never sends it
    /// another Upgrade, install or Reboot call, and never records it converged.
    #[test]
    fn never_two_control_planes_down_nor_a_call_after_a_fallback(
        case in sim_case(1..=4, 0..=8),
        lifecycle in any::<bool>(),
    ) {
        let (end, sim) = run(&case, lifecycle);
        let control_planes = case.shape.control_planes().count();
        if control_planes == 2 {
            prop_assert_eq!(&end, &RunEnd::Refused, "two control planes are refused at planning");
        } else {
            let deleted = end == RunEnd::Deleted && case.schedule.faults.contains(&Fault::DeleteDuringInstall);
            prop_assert!(matches!(end, RunEnd::Completed | RunEnd::Paused) || deleted, "{:?}", end);
        }
        let report = sim.report(case.max_unavailable as usize);
        prop_assert!(report.max_control_planes_down <= 1, "{} control planes down", report.max_control_planes_down);
        if control_planes == 2 {
            prop_assert_eq!(report.upgrade_calls, 0, "a refused operation touched a node");
        }
        sim.read_world(|w| -> Result<(), TestCaseError> {
            for node in &w.nodes {
                let events: Vec<_> = w.trace.iter().filter(|e| e.node == node.name).collect();
                let fell_back = events
                    .iter()
                    .position(|e| e.event == TraceKind::RebootEnd && e.version.as_deref() != Some(TO));
                let Some(at) = fell_back else { continue };
                let after: Vec<_> = events[at..]
                    .iter()
                    .filter(|e| {
                        matches!(
                            e.event,
                            TraceKind::UpgradeCall | TraceKind::InstallStart | TraceKind::RebootCall | TraceKind::Converged
                        )
                    })
                    .map(|e| e.event.name())
                    .collect();
                prop_assert!(after.is_empty(), "{} fell back, then: {:?}", node.name, after);
                prop_assert!(
                    events[at..].iter().any(|e| e.event == TraceKind::Failed),
                    "{}'s fallback was not reported as a failure",
                    node.name
                );
            }
            Ok(())
        })?;
    }

    /// Through faults that only delay it, with holds lifted and NotReady Nodes coming back,
    /// a rollout completes: every node on the target, never more workers down than
    /// `maxUnavailable`, never two control planes down.
    #[test]
    fn a_rollout_through_harmless_faults_completes(
        case in sim_case_with(
            prop_oneof![cluster_shape(1..=1, 0..=8), cluster_shape(3..=4, 0..=8)],
            fault_schedule_among(&HARMLESS, 0.25),
        ),
        lifecycle in any::<bool>(),
    ) {
        let (end, sim) = run(&case, lifecycle);
        prop_assert_eq!(&end, &RunEnd::Completed, "faults: {}", case.schedule.names());
        let report = sim.report(case.max_unavailable as usize);
        prop_assert_eq!(report.on_target, case.shape.machines.len());
        prop_assert!(report.max_workers_down <= case.max_unavailable as usize);
        prop_assert!(report.max_control_planes_down <= 1);
    }
    /// The order labels set the order: control planes are called one by one in label order
    /// (unlabelled, or labelled with something that is not a number, last; then by name),
    /// and a worker is called only once every worker of an earlier label has converged.
    #[test]
    fn order_labels_set_the_order_of_the_calls(
        case in sim_case_with(
            prop_oneof![cluster_shape_with(1..=1, 0..=8, 0.0, 1.0), cluster_shape_with(3..=4, 0..=8, 0.0, 1.0)],
            fault_schedule_among(&[], 0.0),
        ),
        lifecycle in any::<bool>(),
    ) {
        let (end, sim) = run(&case, lifecycle);
        prop_assert_eq!(&end, &RunEnd::Completed);
        let key = |m: &MachineShape| {
            let order = m.order_label.as_deref().and_then(|v| v.parse::<i64>().ok());
            (order.is_none(), order.unwrap_or(0))
        };
        sim.read_world(|w| -> Result<(), TestCaseError> {
            let first = |node: &str, kinds: &[TraceKind]| {
                w.trace.iter().find(|e| e.node == node && kinds.contains(&e.event)).map(|e| e.t)
            };
            let called = |m: &MachineShape| first(&m.name, &[TraceKind::UpgradeCall, TraceKind::InstallStart]);
            let converged = |m: &MachineShape| first(&m.name, &[TraceKind::Converged]);

            let mut cps: Vec<&MachineShape> = case.shape.control_planes().collect();
            cps.sort_by_key(|m| (key(m), m.name.clone()));
            let mut by_call = cps.clone();
            by_call.sort_by(|a, b| called(a).unwrap_or(f64::MAX).total_cmp(&called(b).unwrap_or(f64::MAX)));
            let names = |ms: &[&MachineShape]| ms.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
            prop_assert_eq!(names(&by_call), names(&cps), "control planes called out of order");

            let workers: Vec<&MachineShape> = case.shape.workers().collect();
            for a in &workers {
                for b in workers.iter().filter(|b| key(b) > key(a)) {
                    let (done, call) = (converged(a), called(b));
                    prop_assert!(
                        done.is_some() && call.is_some() && call >= done,
                        "{} (order {:?}) called at {:?}, before {} (order {:?}) converged at {:?}",
                        b.name, b.order_label, call, a.name, a.order_label, done
                    );
                }
            }
            Ok(())
        })?;
    }
}
