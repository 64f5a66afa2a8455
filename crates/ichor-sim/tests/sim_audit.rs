//! The morning-after audit on the simulated cluster (issue 56 item 4): recorded with the
//! status that first says an upgrade Completed, clean when nothing is left wrong, and
//! naming what is.

use ichor_executor::ExecutorConfig;
use ichor_sim::{RunEnd, SimCluster, SimConfig, run_operation};
use ichor_upgrade_core::audit::Finding;
use ichor_upgrade_core::machine::lifecycle::{CORDONED_ANNOTATION, cordon_annotation};
use ichor_upgrade_core::operation::OperationSpec;
use ichor_upgrade_core::status::{Phase, RecordState};
use ichor_upgrade_core::versions::TalosVersion;

fn v(text: &str) -> TalosVersion {
    TalosVersion::parse(text).unwrap()
}

fn audit_of(sim: &SimCluster) -> Option<Vec<Finding>> {
    sim.read_world(|w| w.operations.get("upgrade").and_then(|o| o.info.status.audit.clone()))
}

#[tokio::test(start_paused = true)]
async fn a_clean_upgrade_is_audited_clean_when_it_completes() {
    let sim = SimCluster::new(SimConfig::new(3, 3, v("v1.14.3"), v("v1.14.4")).with_seed(5));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    let mut audited_before_completed = false;
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 5_000, |sim| {
        sim.read_world(|w| {
            let status = &w.operations["upgrade"].info.status;
            audited_before_completed |= status.audit.is_some() && status.phase != Phase::Completed;
        });
    })
    .await;
    assert_eq!(end, RunEnd::Completed);
    assert_eq!(audit_of(&sim), Some(Vec::new()), "audited, and nothing found");
    assert!(!audited_before_completed, "the audit comes with the status that says Completed");
}

#[tokio::test(start_paused = true)]
async fn a_node_left_cordoned_is_a_finding_of_the_audit() {
    let sim = SimCluster::new(SimConfig::new(1, 3, v("v1.14.3"), v("v1.14.4")).with_seed(9));
    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    let identity = sim.read_world(|w| w.operations["upgrade"].info.identity.clone());
    let mut left = false;
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 5_000, |sim| {
        // Once cp-1 is through, a cordon of this operation's is left on it (as a lost
        // uncordon would leave it).
        sim.with_world(|w| {
            let through = w.operations["upgrade"]
                .info
                .status
                .machines
                .get("cp-1")
                .is_none_or(|r| r.state == RecordState::Converged)
                && w.trace.iter().any(|e| e.node == "cp-1" && e.event == ichor_sim::TraceKind::Converged);
            if through && !left {
                let now = w.now;
                let cp = w.nodes.iter_mut().find(|n| n.name == "cp-1").unwrap();
                cp.unschedulable = true;
                cp.annotations.insert(CORDONED_ANNOTATION.to_owned(), cordon_annotation(now, &identity));
                left = true;
            }
        });
    })
    .await;
    assert_eq!(end, RunEnd::Completed);
    assert!(left);
    assert_eq!(audit_of(&sim), Some(vec![Finding::LeftCordoned { node: "cp-1".into() }]));
}

/// What `kubectl ichor audit` runs: the cluster held to the versions it declares, at any
/// time, reading only.
async fn audit_now(sim: &SimCluster) -> Vec<Finding> {
    let config = ExecutorConfig::default();
    let ex = sim.executor(&config);
    let cluster = sim.read_world(|w| w.cluster.name.clone());
    ichor_executor::reconcile::audit_cluster(&ex, &cluster).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_audit_at_any_time_holds_the_cluster_to_its_declared_versions_and_writes_nothing() {
    let sim = SimCluster::new(SimConfig::new(3, 2, v("v1.14.3"), v("v1.14.4")).with_seed(11));
    let counters = sim.read_world(|w| w.counters.clone());
    let before = audit_now(&sim).await;
    assert_eq!(
        sim.read_world(|w| (w.counters.kube_writes, w.counters.upgrade_calls, w.counters.evictions)),
        (counters.kube_writes, counters.upgrade_calls, counters.evictions),
        "the audit writes nothing"
    );
    let off: Vec<&str> = before
        .iter()
        .filter_map(|f| match f {
            Finding::NodeNotOnTarget { node, running, target } if running == "v1.14.3" && target == "v1.14.4" => {
                Some(node.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(off, ["cp-1", "cp-2", "cp-3", "worker-1", "worker-2"], "{before:?}");
    assert_eq!(off.len(), before.len(), "only the version is off: {before:?}");

    sim.create_operation("upgrade", OperationSpec::talos("v1.14.4", 1));
    let end = run_operation(&sim, "upgrade", &ExecutorConfig::default(), 5_000, |_| {}).await;
    assert_eq!(end, RunEnd::Completed);
    assert_eq!(audit_now(&sim).await, [], "through the upgrade, nothing is off");

    // A control plane's static pod that crash-loops, found the morning after.
    sim.with_world(|w| {
        let cp = w.nodes.iter_mut().find(|n| n.name == "cp-2").unwrap();
        cp.kube.pods.values_mut().next().unwrap().crash_looping = true;
    });
    let found = audit_now(&sim).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(matches!(&found[0], Finding::StaticPodCrashLooping { node, .. } if node == "cp-2"), "{found:?}");
}
