//! The preflight gate against the simulator's workload faults (issue 14): a budget at zero
//! (`pdb-zero`) and a single-replica Deployment (`single-replica`). Checked against the
//! world's truth, not the engine's own reports: no machine whose node carries a pod the
//! fault protects is started (storage evacuation or Upgrade call) while the protection
//! stands, and machines elsewhere are not held back by it.

use ichor_executor::ExecutorConfig;
use ichor_sim::{Fault, RunEnd, SimCluster, SimConfig, TraceEvent, TraceKind, run_operation};
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::versions::TalosVersion;
use proptest::prelude::*;

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

/// The first time `node` was started: its evacuation or its Upgrade call, whichever first.
fn started_at(trace: &[TraceEvent], node: &str) -> Option<f64> {
    trace
        .iter()
        .filter(|e| e.node == node && matches!(e.event, TraceKind::EvacuationStart | TraceKind::UpgradeCall))
        .map(|e| e.t)
        .next()
}

/// Runs `fault` on a cluster of 1 control plane and `workers` workers; returns, for each
/// node carrying the fault's pods, when its protection ended (seconds from the start), and
/// the trace.
fn run(fault: Fault, seed: u64, workers: usize) -> (Vec<(String, f64)>, Vec<TraceEvent>, f64) {
    let config = SimConfig::new(1, workers, v("v1.14.3"), v("v1.14.4")).with_seed(seed).with_faults([fault]);
    let sim = SimCluster::new(config);
    let (namespace, until) = sim.read_world(|w| match fault {
        Fault::PdbZero => ("payments", w.pdb_zero_until.unwrap()),
        _ => ("reports", w.single_replica_until.unwrap()),
    });
    let protected: Vec<(String, f64)> = sim.read_world(|w| {
        let ends = until.saturating_since(w.start).as_secs_f64();
        w.nodes
            .iter()
            .filter(|n| n.pods.iter().any(|p| p.namespace == namespace))
            .map(|n| (n.name.clone(), ends))
            .collect()
    });
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 3));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let end = runtime.block_on(run_operation(&sim, "upgrade", &ExecutorConfig::default(), 20_000, |_| {}));
    assert_eq!(end, RunEnd::Completed, "{fault:?} seed {seed}");
    let (trace, waits) = sim.read_world(|w| (w.trace.clone(), w.counters.preflight_wait_ms as f64 / 1000.0));
    (protected, trace, waits)
}

fn check(fault: Fault, seed: u64, workers: usize, names: &str) -> Result<(), TestCaseError> {
    let (protected, trace, waits) = run(fault, seed, workers);
    prop_assert!(!protected.is_empty());
    for (node, ends) in &protected {
        let started = started_at(&trace, node).expect("every machine is upgraded in the end");
        prop_assert!(started >= *ends, "{node} started at {started:.1} s, its protection stood until {ends:.1} s");
        // A machine the gate was asked about while the protection stood was blocked,
        // naming it, and cleared only after (one reached later was never blocked).
        let blocked: Vec<&TraceEvent> =
            trace.iter().filter(|e| e.node == *node && e.event == TraceKind::PreflightBlocked).collect();
        if let Some(first) = blocked.first() {
            prop_assert!(first.message.as_deref().is_some_and(|m| m.contains(names)), "{:?}", first.message);
            let cleared = trace.iter().any(|e| e.node == *node && e.event == TraceKind::PreflightClear && e.t >= *ends);
            prop_assert!(cleared, "{node}: no preflight-clear after the protection ended");
        }
    }
    // (Whether the gate met a protected machine before the release depends on the waves;
    // the fixed runs below check that it holds them when it does.)
    let _ = waits;
    // No drain ever stalled on the budget: the gate kept its pods' nodes out instead.
    prop_assert!(!trace.iter().any(|e| e.reason.as_deref() == Some("DrainBlocked")));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_machine_starts_while_a_budget_at_zero_covers_a_pod_on_its_node(seed in 1u64..10_000, workers in 4usize..16) {
        check(Fault::PdbZero, seed, workers, "payments/ledger")?;
    }

    #[test]
    fn no_machine_starts_while_it_runs_a_single_replica_deployment(seed in 1u64..10_000, workers in 4usize..16) {
        check(Fault::SingleReplica, seed, workers, "reports/exporter")?;
    }
}

#[test]
fn the_json_summary_of_the_engine_counts_the_machine_seconds_held_back() {
    // Three ledger pods (a quarter of 12 workers), each held back until the release.
    let (protected, trace, waits) = run(Fault::PdbZero, 42, 12);
    assert_eq!(protected.len(), 3);
    for (node, _) in &protected {
        let blocked = trace.iter().find(|e| e.node == *node && e.event == TraceKind::PreflightBlocked);
        let message = blocked.and_then(|e| e.message.as_deref()).unwrap_or_default();
        assert!(message.contains("PDB payments/ledger allows 0 disruptions"), "{node}: {message:?}");
    }
    let ends = protected[0].1;
    // Sharper than a cluster-wide check: machines without the ledger's pods are not held.
    let others_early = trace
        .iter()
        .filter(|e| e.event == TraceKind::UpgradeCall && e.role == "worker" && e.t < ends)
        .filter(|e| !protected.iter().any(|(n, _)| *n == e.node))
        .count();
    assert!(others_early >= 3, "{others_early} other workers upgraded while the budget stood at zero");
    // Each was blocked from about the first pass that reached it to the release.
    assert!(waits > ends, "{waits} machine-seconds for {} machines blocked until {ends} s", protected.len());
    assert!(waits < 3.0 * ends + 90.0, "{waits}");

    let (protected, trace, waits) = run(Fault::SingleReplica, 42, 12);
    let blocked = trace.iter().find(|e| e.node == protected[0].0 && e.event == TraceKind::PreflightBlocked);
    let message = blocked.and_then(|e| e.message.as_deref()).unwrap_or_default();
    assert!(message.contains("Deployment reports/exporter has 1 replica"), "{message:?}");
    assert!(waits > 0.0 && waits <= protected[0].1, "{waits}");
}

#[test]
fn on_a_one_worker_cluster_the_workload_faults_end_and_the_rollout_completes() {
    // Found by the invariants property: no second replica can run elsewhere, so once the
    // fault is over the workload must stop blocking rather than block for ever.
    for fault in [Fault::SingleReplica, Fault::PdbZero] {
        let config = SimConfig::new(3, 1, v("v1.14.3"), v("v1.14.4")).with_seed(0).with_faults([fault]);
        let sim = SimCluster::new(config);
        sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let end = runtime.block_on(run_operation(&sim, "upgrade", &ExecutorConfig::default(), 20_000, |_| {}));
        assert_eq!(end, RunEnd::Completed, "{fault:?}");
    }
}
