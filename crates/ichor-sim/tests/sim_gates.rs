//! Health gates on the simulated cluster (issue 56 item 1): with the storage-degraded
//! fault a volume stays degraded for minutes after its worker's reboot. Without a gate the
//! next worker reboots meanwhile and a volume is left on one replica (or none); with an
//! `afterMachine` gate on the volumes' robustness, no worker starts while a volume is
//! degraded, and no volume ever has fewer than two replicas.

use ichor_executor::ExecutorConfig;
use ichor_sim::{Fault, RunEnd, SimCluster, SimConfig, run_operation};
use ichor_upgrade_core::gate::GateSpec;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::status::{Phase, WaitReason};
use ichor_upgrade_core::versions::TalosVersion;

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

/// The gate a platform team would write for Longhorn: every volume healthy for a minute
/// after each worker, else the next waits (at most half an hour).
fn volumes_healthy(expression: &str) -> GateSpec {
    serde_json::from_value(serde_json::json!({
        "name": "volumes-healthy",
        "objects": { "apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "namespace": "longhorn-system" },
        "expression": expression,
        "phase": "afterMachine",
        "scope": { "role": "worker" },
        "settleSeconds": 60,
        "timeoutSeconds": 1800,
    }))
    .unwrap()
}

struct Run {
    end: RunEnd,
    min_healthy: Option<usize>,
    gate_waits: Vec<String>,
    makespan_s: i64,
}

async fn run(gates: Vec<GateSpec>, seed: u64) -> Run {
    let config = SimConfig::new(3, 5, v("v1.14.3"), v("v1.14.4")).with_seed(seed).with_faults([Fault::StorageDegraded]);
    let sim = SimCluster::new(config.with_gates(gates));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    let start = sim.now();
    let mut gate_waits = Vec::new();
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 20_000, |sim| {
        sim.read_world(|w| {
            if let Phase::Waiting(wait @ WaitReason::GateNotPassing { .. }) = &w.operations["upgrade"].info.status.phase
            {
                let said = Phase::Waiting(wait.clone()).to_string();
                if gate_waits.last() != Some(&said) {
                    gate_waits.push(said);
                }
            }
        });
    })
    .await;
    let makespan_s = sim.now().saturating_since(start).as_secs().try_into().unwrap();
    Run { end, min_healthy: sim.read_world(|w| w.volumes.min_healthy), gate_waits, makespan_s }
}

#[tokio::test(start_paused = true)]
async fn without_a_gate_a_volume_drops_to_one_replica_and_with_it_never_below_two() {
    for seed in [1, 2, 3] {
        let without = run(Vec::new(), seed).await;
        assert_eq!(without.end, RunEnd::Completed, "seed {seed}");
        assert!(
            matches!(without.min_healthy, Some(0 | 1)),
            "seed {seed}: the next worker rebooted under a degraded volume: {:?}",
            without.min_healthy
        );
        assert!(without.gate_waits.is_empty());

        let with = run(vec![volumes_healthy("object.status.robustness == 'healthy'")], seed).await;
        assert_eq!(with.end, RunEnd::Completed, "seed {seed}");
        assert_eq!(with.min_healthy, Some(2), "seed {seed}: one replica down at a time, never a second");
        assert!(
            with.gate_waits
                .iter()
                .any(|w| w.contains("gate volumes-healthy does not hold on Volume longhorn-system/pvc-")
                    && w.contains("false")),
            "seed {seed}: the wait names the gate, the volume and its value: {:?}",
            with.gate_waits
        );
        assert!(
            with.gate_waits.iter().any(|w| w.contains("gate volumes-healthy holds; it passes at")),
            "seed {seed}: it settles: {:?}",
            with.gate_waits
        );
        assert!(with.makespan_s > without.makespan_s, "seed {seed}: the rebuilds are waited for");
    }
}

#[tokio::test(start_paused = true)]
async fn a_gate_that_does_not_compile_refuses_the_upgrade_touching_nothing() {
    let config = SimConfig::new(1, 3, v("v1.14.3"), v("v1.14.4")).with_seed(4).with_faults([Fault::StorageDegraded]);
    let sim = SimCluster::new(config.with_gates(vec![volumes_healthy("object.status.robustness ==")]));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 200, |_| {}).await;
    assert_ne!(end, RunEnd::Completed);
    let phase = sim.read_world(|w| w.operations["upgrade"].info.status.phase.clone());
    assert_eq!(phase.reason(), "InvalidGate", "{phase}");
    assert!(phase.to_string().contains("gates[0] (volumes-healthy).expression"), "{phase}");
    assert_eq!(sim.read_world(|w| (w.counters.upgrade_calls, w.upgrades.len())), (0, 0), "nothing touched");

    // Corrected to a gate that does not hold: the upgrade waits on it, never goes on
    // without it.
    let never = volumes_healthy("object.status.robustness == 'never'");
    let never = GateSpec { phase: ichor_upgrade_core::gate::GatePhase::BeforeOperation, scope: None, ..never };
    sim.with_world(|w| w.cluster.gates = vec![never]);
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 200, |_| {}).await;
    assert_ne!(end, RunEnd::Completed);
    let phase = sim.read_world(|w| w.operations["upgrade"].info.status.phase.clone());
    assert_eq!(phase.reason(), "GateNotPassing", "{phase}");
    assert_eq!(sim.read_world(|w| w.counters.upgrade_calls), 0, "nothing started past the gate");
}

#[tokio::test(start_paused = true)]
async fn gates_edited_bad_then_good_mid_run_are_kept_to_from_the_first_pass() {
    let config = SimConfig::new(1, 4, v("v1.14.3"), v("v1.14.4")).with_seed(6).with_faults([Fault::StorageDegraded]);
    let sim = SimCluster::new(config);
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    // Under way (the control plane and a worker called), the gates are edited to one that
    // does not compile: refused.
    let bad = volumes_healthy("object.status.robustness ==");
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 5_000, |sim| {
        sim.with_world(|w| {
            if w.counters.upgrade_calls >= 2 && w.cluster.gates.is_empty() {
                w.cluster.gates = vec![bad.clone()];
            }
        });
    })
    .await;
    assert_ne!(end, RunEnd::Completed);
    let phase = sim.read_world(|w| w.operations["upgrade"].info.status.phase.clone());
    assert_eq!(phase.reason(), "InvalidGate", "{phase}");
    // Corrected to a gate before each worker that never holds: from the first pass after
    // the edit, no worker starts.
    let never = GateSpec {
        phase: ichor_upgrade_core::gate::GatePhase::BeforeMachine,
        ..volumes_healthy("object.status.robustness == 'never'")
    };
    sim.with_world(|w| w.cluster.gates = vec![never]);
    let calls = sim.read_world(|w| w.counters.upgrade_calls);
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 300, |_| {}).await;
    assert_ne!(end, RunEnd::Completed);
    assert_eq!(sim.read_world(|w| w.counters.upgrade_calls), calls, "no start past the corrected gate");
}
