//! The operator's dry run (issue 33), end to end on a real API server and the simulated
//! fleet (`ICHOR_TEST_KUBECONFIG`): an upgrade runs, a dry run plans the next from the
//! durations the machines recorded, the next upgrade runs, and its makespan is held
//! against the plan (`status.calibration`).

use std::time::Duration;

use crate::kubectl_plugin::ok;
use crate::operator_e2e::Scene;
use crate::support::{Process, eventually_within};
use ichor_adapters::kubernetes::crd::{Calibration, TalosCluster, TalosMachine, TalosOperation, TalosOperationSpec};
use ichor_sim::fleet;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Slower than the other scenarios' (150): a turn of about 200 virtual seconds takes about
/// 13 s, so that a makespan measured in whole seconds (conditions' times) is over a
/// minute, and a second's rounding or a pass's delay on a loaded machine is small in it.
const TIME_SCALE: &str = "15";
/// What one upgrade of 3 + 5 may take at that pace, with a loaded machine.
const UPGRADE_BOUND: Duration = Duration::from_secs(300);
/// The next release after the fleet's target.
const NEXT: &str = "v1.14.4";
/// And the one after.
const AFTER: &str = "v1.14.5";

async fn create(scene: &Scene, name: &str, target: &str, dry_run: bool) {
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let spec = TalosOperationSpec {
        target_version: target.into(),
        max_unavailable: 2.into(),
        maintenance: None,
        gates: None,
        dry_run,
        ..scene.operation_spec("talos", None)
    };
    ops.create(&PostParams::default(), &TalosOperation::new(name, spec)).await.unwrap();
}

async fn completes(scene: &Scene, name: &str) {
    eventually_within(UPGRADE_BOUND, &format!("{name} completes"), || async { scene.phase(name).await == "Completed" })
        .await;
}

/// Moves the cluster's release set to `version`.
async fn release(scene: &Scene, version: &str) {
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let patch = json!({ "spec": { "talosVersion": version } });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// One scenario: upgrade, plan, upgrade; the plan and its calibration.
async fn scenario(seed: u64) -> (Scene, Process) {
    let scene = Scene::new(&format!("e2e-plan-{seed}")).await;
    let both = scene.fleet_at("3+5", TIME_SCALE, &["--seed", &seed.to_string()]);
    scene.fleet_up(8).await;
    // A dry run with no history plans from a real cluster's defaults, in the fleet's time.
    create(&scene, "plan-new", fleet::TARGET, true).await;
    completes(&scene, "plan-new").await;
    create(&scene, "first", fleet::TARGET, false).await;
    completes(&scene, "first").await;
    first_held_against_defaults(&scene, seed).await;

    // Every machine recorded its turn, and the cluster its last operation.
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    for machine in machines.list(&ListParams::default()).await.unwrap() {
        let last = machine.status.and_then(|s| s.last_upgrade).expect("status.lastUpgrade");
        assert!(last.seconds > 0.0 && last.steps.get("upgrade").is_some_and(|s| *s > 0.0), "{last:?}");
        // Its Node seen turning Ready again splits the call: to Ready, then verified.
        let (ready, verification) = (last.steps.get("ready"), last.steps.get("verification"));
        assert!(ready.zip(verification).is_some_and(|(r, v)| *r > 0.0 && *v >= 0.0), "{last:?}");
        assert!((ready.unwrap() + verification.unwrap() - last.steps["upgrade"]).abs() < 1e-6, "{last:?}");
    }

    release(&scene, NEXT).await;
    create(&scene, "plan", NEXT, true).await;
    completes(&scene, "plan").await;
    let planned = scene.operation("plan").await.unwrap();
    let status = planned.status.clone().unwrap();
    assert_eq!(status.reason.as_deref(), Some("Planned"), "{status:?}");
    assert!(planned.finalizers().is_empty(), "a dry run takes no lock: {:?}", planned.metadata);
    let plan = status.plan.expect("status.plan");
    assert_eq!(plan.history.as_deref(), Some("first"), "{plan:?}");
    assert_eq!(plan.order.len(), 8, "{plan:?}");
    assert!(plan.held.is_empty(), "{plan:?}");
    assert!(plan.p10_seconds <= plan.p50_seconds && plan.p50_seconds <= plan.p90_seconds, "{plan:?}");
    assert!(plan.bound_seconds < plan.p50_seconds, "{plan:?}");
    assert_eq!(plan.median_run.len(), 8);
    assert!(
        scene.fleet_nodes().await.iter().all(|n| n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .is_some_and(|i| i.os_image.contains(fleet::TARGET))),
        "the dry run upgraded nothing"
    );

    create(&scene, "second", NEXT, false).await;
    completes(&scene, "second").await;
    (scene, both)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn the_next_upgrade_lands_within_its_plan_for_three_seeds() {
    // The three scenarios side by side, each in its namespace with its own fleet.
    let (one, two, three) = tokio::join!(checked(1), checked(2), checked(3));
    let results = [one, two, three];
    for (seed, c) in &results {
        eprintln!(
            "seed {seed}: actual {:.0} s, plan p10 {:.1} p50 {:.1} p90 {:.1} ({:+.1} %)",
            c.actual_seconds, c.p10_seconds, c.p50_seconds, c.p90_seconds, c.error_percent
        );
    }
    // The band is an 80 % one, and conditions' times are whole seconds, so a makespan can
    // be read a second long or short. The plan is made from the first upgrade's recorded
    // turns, and on a loaded machine that upgrade can run slow: once the first took 93 s
    // where its seeds' siblings took 80 s, its plan said 98 s, and the second took 88 s
    // (-10.2 %). That is the machine's load, not the plan's arithmetic, whose errors are
    // far larger (a plan that ignored the time scale said -92 %). So: every run lands
    // within 20 % of its p50, the median run within 10 %, and at least two of the three
    // in the band widened by that second.
    for (seed, c) in &results {
        assert!(c.error_percent.abs() <= 20.0, "seed {seed}: {c:?}");
    }
    let mut errors: Vec<f64> = results.iter().map(|(_, c)| c.error_percent.abs()).collect();
    errors.sort_by(f64::total_cmp);
    assert!(errors[1] <= 10.0, "the median run is {:.1} % off its plan: {results:?}", errors[1]);
    let in_band = results
        .iter()
        .filter(|(_, c)| c.p10_seconds - RULER <= c.actual_seconds && c.actual_seconds <= c.p90_seconds + RULER)
        .count();
    assert!(in_band >= 2, "{in_band} of 3 in their plan's p10-p90: {results:?}");
}

/// The first upgrade, planned with no history, against that plan. The defaults are a
/// real cluster's (the simulator's are the same) divided by the fleet's time scale: a plan
/// that ignored the scale said -92 % (issue 55). Defaults are no calibration, so the bound
/// is loose: the right order, not the band.
async fn first_held_against_defaults(scene: &Scene, seed: u64) {
    let calibration = || async { scene.operation("first").await.and_then(|op| op.status?.calibration) };
    eventually_within(Duration::from_secs(10), "first's status.calibration", || async {
        calibration().await.is_some()
    })
    .await;
    let c = calibration().await.unwrap();
    eprintln!(
        "seed {seed}, no history: actual {:.0} s, plan p10 {:.1} p50 {:.1} p90 {:.1} ({:+.1} %)",
        c.actual_seconds, c.p10_seconds, c.p50_seconds, c.p90_seconds, c.error_percent
    );
    assert_eq!(c.plan, "plan-new");
    assert!(c.error_percent.abs() <= 30.0, "seed {seed}: {c:?}");
}

/// How far a makespan read from conditions' whole-second times can be off.
const RULER: f64 = 1.0;

/// [`scenario`], then what the operator recorded of it: the calibration and the
/// cluster's last operations (and, for seed 1, the plugin's view and a plan that holds).
async fn checked(seed: u64) -> (u64, Calibration) {
    let (scene, both) = scenario(seed).await;
    // Recorded in the pass that completed it, just after its status.
    let calibration = || async { scene.operation("second").await.and_then(|op| op.status?.calibration) };
    eventually_within(Duration::from_secs(10), "status.calibration", || async { calibration().await.is_some() }).await;
    let calibration = calibration().await.unwrap();
    assert_eq!(calibration.plan, "plan");
    // The cluster keeps the last operations that ran, newest first.
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    eventually_within(Duration::from_secs(30), "the cluster's last operations", || async {
        let status = clusters.get(fleet::CLUSTER).await.unwrap().status.unwrap_or_default();
        let last: Vec<(String, Option<f64>)> =
            status.last_operations.iter().map(|o| (o.name.clone(), o.makespan_seconds)).collect();
        last.len() == 2
            && last[0].0 == "second"
            && last[1].0 == "first"
            && last[0].1 == Some(calibration.actual_seconds)
    })
    .await;
    if seed == 1 {
        seen_through_the_plugin(&scene);
        held_by_a_budget_at_zero(&scene).await;
    }
    drop(both);
    scene.end().await;
    (seed, calibration)
}

/// `kubectl ichor status` prints the plan and the calibration; `timeline` draws the plan's
/// median run.
fn seen_through_the_plugin(scene: &Scene) {
    let (admin, ns) = (scene.admin(), scene.ns.name.as_str());
    let status = ok(admin, ns, &["status", "plan"]);
    assert!(status.contains("plan: makespan p10 ") && status.contains("from the history of first"), "{status}");
    assert!(status.contains("order: demo-cp-1, demo-cp-2, demo-cp-3, demo-worker-1"), "{status}");
    let second = ok(admin, ns, &["status", "second"]);
    assert!(second.contains("against plan plan: took "), "{second}");
    let svg = scene.dir.path().join("plan.svg");
    let drawn = ok(admin, ns, &["timeline", "plan", "-o", &svg.display().to_string()]);
    assert!(drawn.contains("8 machines, 16 records"), "{drawn}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("plan, median run") && picture.contains("demo-worker-5"), "the median run is drawn");
}

/// A PodDisruptionBudget at zero over a pod on a worker: a dry run names that worker as
/// held, and leaves it out of the order.
async fn held_by_a_budget_at_zero(scene: &Scene) {
    let node = format!("{}-worker-2.{}", fleet::CLUSTER, scene.ns.name);
    let (_, pdbs) = scene.ledger_under_a_budget_at_zero(&node).await;
    // The budget's status (0 allowed, 1 healthy) once its controller saw the pod Ready.
    eventually_within(Duration::from_secs(60), "the budget counts the pod", || async {
        let pdb = pdbs.get("ledger").await.unwrap();
        pdb.data["status"]["currentHealthy"].as_i64() == Some(1)
    })
    .await;

    release(scene, AFTER).await;
    create(scene, "plan-held", AFTER, true).await;
    completes(scene, "plan-held").await;
    let plan = scene.operation("plan-held").await.unwrap().status.unwrap().plan.unwrap();
    let held: Vec<(&str, &str)> = plan.held.iter().map(|h| (h.machine.as_str(), h.reason.as_str())).collect();
    assert_eq!(held.len(), 1, "{plan:?}");
    assert_eq!(held[0].0, "demo-worker-2");
    assert!(held[0].1.contains("ledger") && held[0].1.contains("0 disruptions"), "{held:?}");
    assert_eq!(plan.order.len(), 7, "{plan:?}");
    assert!(!plan.order.iter().any(|m| m == "demo-worker-2"), "{plan:?}");
    assert_eq!(plan.history.as_deref(), Some("second"), "the last upgrade that completed");
}
