//! Alert gates on the simulated cluster (issue 56 item 2). Alertmanager fires
//! `KubeNodeNotReady` for every Node shown NotReady. An alert gate on it holds the next
//! start while any fires: without Ichor's silence a worker's own reboot holds the next
//! start until it is back, and the rollout crawls; with it, the alerts of the machines in
//! their turn are silenced (a lease, renewed by the passes, capped) and ignored, and the
//! next start goes as soon as a slot is free. An alert on a machine not in its turn holds
//! every start while it fires, naming it.

use std::time::Duration;

use ichor_executor::ExecutorConfig;
use ichor_executor::alert_gates::CREATED_BY;
use ichor_sim::world::SimAlert;
use ichor_sim::{RunEnd, SimCluster, SimConfig, run_operation};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::gate::GateSpec;
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::status::{Phase, WaitReason};
use ichor_upgrade_core::versions::TalosVersion;

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

const LEASE: u64 = 120;
const MAX: u64 = 1800;

/// The gate: no warning or critical alert fires, before each start; with `silence`,
/// Ichor silences the alerts of each machine in its turn.
fn no_alerts(silence: bool) -> GateSpec {
    let mut alerts = serde_json::json!({
        "alertmanager": "http://alertmanager.monitoring:9093",
        "matchers": ["severity=~warning|critical"],
    });
    if silence {
        alerts["silence"] = serde_json::json!({ "leaseSeconds": LEASE, "maxSeconds": MAX });
    }
    serde_json::from_value(serde_json::json!({
        "name": "no-alerts",
        "alerts": alerts,
        "phase": "beforeMachine",
        "timeoutSeconds": 7200,
    }))
    .unwrap()
}

struct Run {
    sim: SimCluster,
    end: RunEnd,
    waits: Vec<String>,
    makespan: Duration,
}

async fn run(sim: SimCluster, max_unavailable: i64) -> Run {
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", max_unavailable));
    let start = sim.now();
    let mut waits = Vec::new();
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 20_000, |sim| {
        sim.read_world(|w| {
            let status = &w.operations["upgrade"].info.status;
            let said = match &status.phase {
                Phase::Waiting(wait @ WaitReason::GateNotPassing { .. }) => {
                    Some(Phase::Waiting(wait.clone()).to_string())
                }
                // A start held while others are in their turn shows in the gate's state.
                _ => status.gates.get("no-alerts").and_then(|g| g.last.clone()),
            };
            if let Some(said) = said
                && waits.last() != Some(&said)
            {
                waits.push(said);
            }
        });
    })
    .await;
    let makespan = sim.now().saturating_since(start);
    Run { sim, end, waits, makespan }
}

fn cluster(seed: u64, gate: GateSpec) -> SimCluster {
    let config = SimConfig::new(3, 5, v("v1.14.3"), v("v1.14.4")).with_seed(seed);
    SimCluster::new(config.with_gates(vec![gate]))
}

#[tokio::test(start_paused = true)]
async fn silenced_turns_go_two_at_once_and_unsilenced_ones_wait_for_each_reboots_alert() {
    for seed in [1, 2, 3] {
        let own = "alert KubeNodeNotReady{";
        let without = run(cluster(seed, no_alerts(false)), 2).await;
        assert_eq!(without.end, RunEnd::Completed, "seed {seed}");
        assert!(
            without.waits.iter().any(|w| w.contains(own)),
            "seed {seed}: a reboot's own alert held the next start: {:?}",
            without.waits
        );
        assert!(without.sim.read_world(|w| w.alerting.writes.is_empty()), "no silence without one asked for");

        let with = run(cluster(seed, no_alerts(true)), 2).await;
        assert_eq!(with.end, RunEnd::Completed, "seed {seed}");
        assert!(!with.waits.iter().any(|w| w.contains(own)), "seed {seed}: silenced: {:?}", with.waits);
        assert_eq!(with.sim.read_world(|w| w.counters.max_workers_down), 2, "seed {seed}");
        assert!(
            with.makespan < without.makespan,
            "seed {seed}: {:?} silenced against {:?} not",
            with.makespan,
            without.makespan
        );
        with.sim.read_world(|w| {
            let writes = &w.alerting.writes;
            assert!(!writes.is_empty(), "seed {seed}");
            for (at, silence) in writes {
                assert_eq!(silence.created_by, CREATED_BY);
                assert!(silence.ends_at <= at.saturating_add(Duration::from_secs(LEASE)), "a lease at most");
                assert_eq!(silence.matchers.len(), 1, "{silence:?}");
                let node = &silence.matchers[0].value;
                assert_eq!(silence.matchers[0].name, "node");
                assert!(w.upgrades.iter().any(|u| &u.node == node), "a silence only for a machine in its turn");
                assert!(silence.comment.ends_with(&format!("machine {node}")), "{}", silence.comment);
            }
            // Every silence's end is capped from its machine's first.
            for (_, silence) in writes {
                let first: Timestamp = writes
                    .iter()
                    .filter(|(_, s)| s.comment == silence.comment)
                    .map(|(_, s)| s.starts_at)
                    .min()
                    .unwrap();
                assert!(silence.ends_at <= first.saturating_add(Duration::from_secs(MAX)));
            }
        });
        let renewed = with.sim.read_world(|w| w.alerting.writes.iter().filter(|(_, s)| s.id.is_some()).count());
        // A worker's turn outlasts half a lease: its silence is renewed, not made anew.
        assert!(renewed > 0, "seed {seed}: renewals");
    }
}

#[tokio::test(start_paused = true)]
async fn an_alert_on_a_machine_not_in_its_turn_holds_every_start_while_it_fires() {
    let sim = cluster(5, no_alerts(true));
    let from = sim.now().saturating_add(Duration::from_secs(900));
    let until = from.saturating_add(Duration::from_secs(1200));
    sim.with_world(|w| {
        let labels = [("alertname", "NodeFilesystemAlmostFull"), ("node", "worker-5"), ("severity", "critical")];
        w.alerting.firing.push(SimAlert {
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            from,
            until: Some(until),
        });
    });
    let run = run(sim, 1).await;
    assert_eq!(run.end, RunEnd::Completed);
    assert!(
        run.waits.iter().any(|w| w.contains(
            "gate no-alerts does not hold on alert NodeFilesystemAlmostFull{node=\"worker-5\", severity=\"critical\"}"
        )),
        "{:?}",
        run.waits
    );
    run.sim.read_world(|w| {
        // No Upgrade call went out while it fired (one sent just before it began may
        // still be answered in it).
        let during: Vec<_> = w.upgrades.iter().filter(|u| u.sent_at >= from && u.sent_at < until).collect();
        assert!(during.is_empty(), "started while the alert fired: {during:?}");
        assert!(w.upgrades.iter().any(|u| u.sent_at >= until), "and went on after it stopped");
    });
}
