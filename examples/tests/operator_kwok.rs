//! The operator end to end on kwok Nodes: 3 control planes and 1,000 workers on the test
//! API server (`scripts/kube-test-server.sh start` runs kwok, the scheduler and the
//! workload controllers beside it), Deployments, StatefulSets and PodDisruptionBudgets
//! spread over them by the scheduler, the Talos side the project's stand-in. What it costs
//! (API requests per machine, the operator's peak memory) is printed and written down in
//! `docs/performance.md`.

use std::time::{Duration, Instant};

use crate::operator_e2e::{Scene, all_on_target, upgrade_calls};
use crate::support::{Process, TIME_SCALE, eventually_within};
use ichor_adapters::kubernetes::crd::{TalosCluster, TalosOperation, TalosOperationSpec};
use ichor_sim::fleet;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const CONTROL_PLANES: usize = 3;
const WORKERS: usize = 1_000;
/// Workers upgraded at once.
const MAX_UNAVAILABLE: i64 = 50;
/// Deployments of [`DEPLOYMENT_REPLICAS`], each with a budget of one pod down at a time.
const DEPLOYMENTS: usize = 30;
const DEPLOYMENT_REPLICAS: i32 = 20;
/// StatefulSets of three, each with a budget of two pods up at all times.
const STATEFUL_SETS: usize = 20;
/// The most each wait of the scenario may take, on a loaded 2-core machine: a guard
/// against a hang, not a measure (the rollout's time is printed and written down in
/// `docs/performance.md`). The rollout took 626.6 s alone on 2026-12-06's machine; inside
/// the whole suite it once never ended (a pass's thousand reads at once, refused with 429
/// and sent again by the next pass; `docs/performance.md`).
const BOUND: Duration = Duration::from_secs(1_500);

/// The kwok tests one at a time: each puts hundreds of Nodes on the one API server and
/// measures what its rollout costs. Side by side inside the suite, the 3 + 200 Kubernetes
/// upgrade once stalled after its second control plane's first change while the 3 + 1,000
/// upgrade ran (alone it completes in about 70 s).
static ONE_FLEET_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits up to [`BOUND`] for operation `name` to complete; past it, fails with the
/// operation's status, which says what it waited on.
async fn completes(scene: &Scene, name: &str) {
    let deadline = Instant::now() + BOUND;
    while scene.phase(name).await != "Completed" {
        if Instant::now() > deadline {
            let status = scene.operation(name).await.and_then(|op| op.status);
            panic!("not within {}s: operation {name} completes; its status: {status:#?}", BOUND.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A pod template that lands on the Nodes of the fleet in `namespace` and no other (it
/// tolerates their taint; another test's fleet on the same API server is not this one's),
/// spread by the scheduler's default topology spreading.
fn template(app: &str, namespace: &str) -> serde_json::Value {
    json!({
        "metadata": { "labels": { "app": app } },
        "spec": {
            "nodeSelector": { fleet::FLEET_LABEL: namespace },
            "tolerations": [{ "key": fleet::TAINT, "operator": "Exists" }],
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": app, "image": format!("registry.invalid/{app}:1") }],
        },
    })
}

async fn create_workloads(scene: &Scene) {
    let client = scene.ns.client.clone();
    let ns = &scene.ns.name;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let post = PostParams::default();
    for i in 0..DEPLOYMENTS {
        let app = format!("web-{i}");
        let deployment = json!({
            "metadata": { "name": app },
            "spec": {
                "replicas": DEPLOYMENT_REPLICAS,
                "selector": { "matchLabels": { "app": app } },
                "template": template(&app, ns),
            },
        });
        deployments.create(&post, &serde_json::from_value(deployment).unwrap()).await.unwrap();
        let budget = json!({
            "metadata": { "name": app },
            "spec": { "maxUnavailable": 1, "selector": { "matchLabels": { "app": app } } },
        });
        budgets.create(&post, &serde_json::from_value(budget).unwrap()).await.unwrap();
    }
    for i in 0..STATEFUL_SETS {
        let app = format!("db-{i}");
        let set = json!({
            "metadata": { "name": app },
            "spec": {
                "replicas": 3,
                "serviceName": app,
                "podManagementPolicy": "Parallel",
                "selector": { "matchLabels": { "app": app } },
                "template": template(&app, ns),
            },
        });
        stateful_sets.create(&post, &serde_json::from_value(set).unwrap()).await.unwrap();
        let budget = json!({
            "metadata": { "name": app },
            "spec": { "minAvailable": 2, "selector": { "matchLabels": { "app": app } } },
        });
        budgets.create(&post, &serde_json::from_value(budget).unwrap()).await.unwrap();
    }
}

/// Every workload has all its replicas ready, and every budget counts them.
async fn workloads_ready(scene: &Scene) -> bool {
    let client = scene.ns.client.clone();
    let ns = &scene.ns.name;
    let lp = ListParams::default();
    let Ok(deployments) = Api::<Deployment>::namespaced(client.clone(), ns).list(&lp).await else { return false };
    let Ok(sets) = Api::<StatefulSet>::namespaced(client.clone(), ns).list(&lp).await else { return false };
    let Ok(budgets) = Api::<PodDisruptionBudget>::namespaced(client, ns).list(&lp).await else { return false };
    deployments.items.len() == DEPLOYMENTS
        && deployments.items.iter().all(|d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(DEPLOYMENT_REPLICAS)
                && d.status.as_ref().and_then(|s| s.updated_replicas) == Some(DEPLOYMENT_REPLICAS)
        })
        && sets.items.len() == STATEFUL_SETS
        && sets.items.iter().all(|s| s.status.as_ref().and_then(|s| s.ready_replicas) == Some(3))
        && budgets.items.len() == DEPLOYMENTS + STATEFUL_SETS
        && budgets.items.iter().all(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.current_healthy >= s.desired_healthy && s.expected_pods.is_some_and(|n| n > 0))
        })
}

/// The sum of a counter's series in a metrics text.
fn total(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// What a kwok rollout measured ([`kwok_rollout`]).
pub(crate) struct KwokRun {
    /// Its scene (ended by the caller).
    pub(crate) scene: Scene,
    /// The fleet's process (terminated by the caller).
    pub(crate) fleet: Process,
    /// Machines in the fleet.
    pub(crate) machines: usize,
    /// Pods placed before the rollout.
    pub(crate) pods: usize,
    /// Nodes they were placed on.
    pub(crate) spread: usize,
    /// From the fleet's start to every Node Ready.
    pub(crate) fleet_up: Duration,
    /// From the operation's creation to Completed.
    pub(crate) rollout: Duration,
    /// The operator's metrics at the end.
    pub(crate) metrics: String,
    /// The fleet's metrics at the end.
    pub(crate) fleet_metrics: String,
    /// The operator's peak RSS, KiB.
    pub(crate) peak_kib: u64,
    /// The original pods that were never evicted, named with their Node.
    pub(crate) stayed: Vec<String>,
    /// The operator (the caller checks its requests).
    pub(crate) operator: Process,
}

/// An upgrade of `control_planes` + `workers` kwok Nodes at `max_unavailable` (the fleet's
/// time at `time_scale`), with [`DEPLOYMENTS`] and [`STATEFUL_SETS`] under budgets placed
/// by the scheduler; waits for the operation to complete and every workload to be whole
/// again. What the test asserts and the `kwok-figures` bench prints.
pub(crate) async fn kwok_rollout(
    control_planes: usize,
    workers: usize,
    max_unavailable: i64,
    time_scale: &str,
    operator_args: &[&str],
) -> KwokRun {
    let machines = control_planes + workers;
    let scene = Scene::new("e2e-kwok").await;
    let shape = format!("{control_planes}+{workers}");
    let fleet = scene.fleet_at(&shape, time_scale, &["--fleet-only", "--kwok"]);
    let started = Instant::now();
    eventually_within(BOUND, "kwok makes the fleet's Nodes Ready", || async {
        let nodes = scene.fleet_nodes().await;
        nodes.len() == machines
            && nodes.iter().all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
    })
    .await;
    let fleet_up = started.elapsed();

    // The scheduler places the pods, kwok runs them, the controllers count the budgets.
    create_workloads(&scene).await;
    eventually_within(BOUND, "every workload ready and counted by its budget", || workloads_ready(&scene)).await;
    let pods: Api<Pod> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let placed = pods.list(&ListParams::default()).await.unwrap().items;
    let spread: std::collections::BTreeSet<_> =
        placed.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
    let uids: std::collections::BTreeSet<_> = placed.iter().filter_map(|p| p.metadata.uid.clone()).collect();

    let kubeconfig = scene.operator_kubeconfig().await;
    let operator = scene.operator("operator", &kubeconfig, operator_args);
    let rollout = Instant::now();
    scene.create_operation_with("upgrade", "talos", None, max_unavailable).await;
    completes(&scene, "upgrade").await;
    let rollout = rollout.elapsed();
    let metrics = operator.metrics().await.expect("the operator's metrics");
    let fleet_metrics = fleet.metrics().await.expect("the fleet's metrics");
    let peak_kib = operator.peak_rss_kib().expect("the operator's memory");
    // The drains moved the pods (evicted, replaced by their controllers, placed again by
    // the scheduler).
    let after = pods.list(&ListParams::default()).await.unwrap().items;
    let stayed = after
        .iter()
        .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
        .map(|p| {
            format!(
                "{} on {:?}",
                p.metadata.name.as_deref().unwrap_or("?"),
                p.spec.as_ref().and_then(|s| s.node_name.as_deref())
            )
        })
        .collect();
    eventually_within(BOUND, "every workload ready again", || workloads_ready(&scene)).await;
    KwokRun {
        scene,
        fleet,
        machines,
        pods: placed.len(),
        spread: spread.len(),
        fleet_up,
        rollout,
        metrics,
        fleet_metrics,
        peak_kib,
        stayed,
        operator,
    }
}

/// The operator's API requests and writes in `metrics`.
pub(crate) fn requests_and_writes(metrics: &str) -> (f64, f64) {
    (total(metrics, "ichor_kube_requests_total{"), total(metrics, "ichor_kube_writes_total"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server with kwok and a scheduler: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_3_plus_1000_upgrade_on_kwok_nodes_keeps_every_workload_and_budget() {
    let _alone = ONE_FLEET_AT_A_TIME.lock().await;
    let run = kwok_rollout(CONTROL_PLANES, WORKERS, MAX_UNAVAILABLE, TIME_SCALE, &["--executor", "lifecycle"]).await;
    let KwokRun { scene, mut fleet, machines, spread, operator, .. } = run;
    let expected_pods = DEPLOYMENTS * usize::try_from(DEPLOYMENT_REPLICAS).unwrap() + STATEFUL_SETS * 3;
    assert_eq!(run.pods, expected_pods);
    assert!(spread > expected_pods / 2, "the scheduler spread {expected_pods} pods over {spread} Nodes");

    let nodes = scene.fleet_nodes().await;
    assert_eq!(nodes.len(), machines);
    assert!(all_on_target(&nodes), "every Node on {} and Ready", fleet::TARGET);
    let cordoned: Vec<_> =
        nodes.iter().filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)).collect();
    assert!(cordoned.is_empty(), "{} Nodes left cordoned", cordoned.len());
    assert!(upgrade_calls(&fleet).await.iter().all(|(_, n)| *n == 0.0), "no legacy Upgrade call");
    assert_eq!(fleet.value("ichor_fleet_max_control_planes_down").await, Some(1.0));
    let workers_down = fleet.value("ichor_fleet_max_workers_down").await.unwrap_or(f64::MAX);
    assert!(workers_down <= MAX_UNAVAILABLE as f64, "{workers_down} workers down at once");
    // Every original pod was evicted and placed again, and every workload is whole again
    // (awaited by `kwok_rollout`).
    assert!(run.stayed.is_empty(), "{} pods were never evicted: {:?}", run.stayed.len(), run.stayed);
    // The fleet recorded every machine's turn: what the bench measures the makespan by.
    let turns = turns(&run.fleet_metrics);
    assert_eq!(turns.len(), machines, "a turn per machine");
    assert!(turns.iter().all(|t| t.ended_s.is_some_and(|end| end > t.started_s)), "{turns:?}");
    let k = usize::try_from(MAX_UNAVAILABLE).unwrap();
    let (makespan, ideal) = ichor_sim::peers::makespan_against_ideal(&turns, k).expect("every turn ended");

    // A dry run of the next release on the same 1,003 machines, from this upgrade's history.
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let next = json!({ "spec": { "talosVersion": "v1.14.4" } });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&next)).await.unwrap();
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let spec = TalosOperationSpec {
        target_version: "v1.14.4".into(),
        max_unavailable: MAX_UNAVAILABLE.into(),
        maintenance: None,
        dry_run: true,
        ..scene.operation_spec("talos", None)
    };
    let planning = Instant::now();
    ops.create(&PostParams::default(), &TalosOperation::new("plan", spec)).await.unwrap();
    eventually_within(BOUND, "the dry run plans", || async { scene.phase("plan").await == "Completed" }).await;
    let planned_in = planning.elapsed();
    let plan = scene.operation("plan").await.and_then(|op| op.status?.plan).expect("status.plan");
    assert_eq!(plan.history.as_deref(), Some("upgrade"), "{:?}", plan.assumed);
    assert_eq!(plan.order.len() + plan.held.len(), machines, "every machine planned or held");
    assert!(plan.p10_seconds <= plan.p50_seconds && plan.p50_seconds <= plan.p90_seconds);
    eprintln!(
        "dry run of {machines} machines: Completed {:.1} s after its creation; p50 {:.0} s ({} held)",
        planned_in.as_secs_f64(),
        plan.p50_seconds,
        plan.held.len()
    );
    scene.only_allowed_requests(&operator).await;

    let (requests, writes) = requests_and_writes(&run.metrics);
    let talos = fleet.value("ichor_fleet_talos_calls_total").await.unwrap_or_default();
    #[allow(clippy::cast_precision_loss, reason = "a thousand machines")]
    let per = |n: f64| n / machines as f64;
    eprintln!(
        "kwok fleet {CONTROL_PLANES}+{WORKERS}, maxUnavailable {MAX_UNAVAILABLE}, time scale {TIME_SCALE}, {expected_pods} \
         pods on {spread} Nodes: fleet Ready in {:.1} s; rollout {:.1} s; operator: {requests} API requests ({:.1} per \
         machine), {writes} writes ({:.1} per machine), peak RSS {:.1} MiB; {talos} Talos API calls ({:.1} per machine)",
        run.fleet_up.as_secs_f64(),
        run.rollout.as_secs_f64(),
        per(requests),
        per(writes),
        run.peak_kib as f64 / 1024.0,
        per(talos),
    );
    eprintln!(
        "makespan {makespan:.0} fleet seconds, {:.3} of the ideal scheduler's on the same turns ({ideal:.0} s)",
        makespan / ideal
    );
    for line in busiest(&run.metrics, 8) {
        eprintln!("  {line}");
    }
    // A fleet stopped by SIGTERM deletes its Nodes: kwok stops renewing their Leases.
    assert_eq!(fleet.terminate(), Some(0));
    assert!(scene.fleet_nodes().await.is_empty(), "a stopped fleet deletes its Nodes");
    scene.end().await;
}

/// Each machine's turn from the fleet's `ichor_fleet_turn_*_seconds` series.
pub(crate) fn turns(fleet_metrics: &str) -> Vec<ichor_sim::peers::Turn> {
    let series = |prefix: &str| -> Vec<(String, String, f64)> {
        fleet_metrics
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(prefix)?;
                let (labels, value) = rest.rsplit_once(' ')?;
                let label = |key: &str| {
                    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
                    let end = labels[start..].find('"')? + start;
                    Some(labels[start..end].to_owned())
                };
                Some((label("node")?, label("role")?, value.parse().ok()?))
            })
            .collect()
    };
    let ended: std::collections::HashMap<String, f64> =
        series("ichor_fleet_turn_ended_seconds{").into_iter().map(|(node, _, at)| (node, at)).collect();
    let mut turns: Vec<ichor_sim::peers::Turn> = series("ichor_fleet_turn_started_seconds{")
        .into_iter()
        .map(|(node, role, started_s)| ichor_sim::peers::Turn {
            ended_s: ended.get(&node).copied(),
            role: if role == "control-plane" { "control-plane" } else { "worker" },
            node,
            started_s,
        })
        .collect();
    turns.sort_by(|a, b| a.started_s.total_cmp(&b.started_s));
    turns
}

/// The `n` series of the operator's requests with the most, the most first.
pub(crate) fn busiest(metrics: &str, n: usize) -> Vec<&str> {
    let mut series: Vec<(f64, &str)> = metrics
        .lines()
        .filter(|l| l.starts_with("ichor_kube_requests_total{"))
        .filter_map(|l| Some((l.rsplit(' ').next()?.parse().ok()?, l)))
        .collect();
    series.sort_by(|a, b| b.0.total_cmp(&a.0));
    series.into_iter().take(n).map(|(_, line)| line).collect()
}

/// Issue 53's done-when: a Kubernetes upgrade of 3 control planes and 200 workers on kwok
/// Nodes completes on the real API server, the operator under its ServiceAccount with the
/// Kubernetes-upgrade reads bound and no write of any manifest object (the manifests go
/// under the admin kubeconfig the fleet's Talos API gives): every kubelet on the target,
/// one control plane down at a time, each change applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server with kwok: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_3_plus_200_kubernetes_upgrade_on_kwok_nodes_completes() {
    use crate::operator_e2e::KUBERNETES_TARGET;
    const KUBE_WORKERS: usize = 200;
    let _alone = ONE_FLEET_AT_A_TIME.lock().await;
    let machines = CONTROL_PLANES + KUBE_WORKERS;
    let scene = Scene::new("e2e-kwok-k8s").await;
    let shape = format!("{CONTROL_PLANES}+{KUBE_WORKERS}");
    let mut fleet = scene.fleet(&shape, &["--fleet-only", "--kwok"]);
    eventually_within(BOUND, "kwok makes the fleet's Nodes Ready", || async {
        let nodes = scene.fleet_nodes().await;
        nodes.len() == machines
            && nodes.iter().all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
    })
    .await;
    let kubeconfig = scene.operator_kubeconfig().await;
    scene.grant_kubernetes_upgrades().await;
    let operator = scene.operator("operator", &kubeconfig, &[]);
    let rollout = Instant::now();
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let spec = TalosOperationSpec {
        target_version: KUBERNETES_TARGET.into(),
        max_unavailable: MAX_UNAVAILABLE.into(),
        maintenance: None,
        ..scene.operation_spec("kubernetes", None)
    };
    ops.create(&PostParams::default(), &TalosOperation::new("kubernetes", spec)).await.unwrap();
    completes(&scene, "kubernetes").await;
    let makespan = rollout.elapsed();
    let metrics = operator.metrics().await.expect("the operator's metrics");

    let nodes = scene.fleet_nodes().await;
    assert_eq!(nodes.len(), machines);
    for node in &nodes {
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref()).expect("nodeInfo");
        assert_eq!(info.kubelet_version, format!("v{KUBERNETES_TARGET}"), "{}", kube::ResourceExt::name_any(node));
    }
    #[allow(clippy::cast_precision_loss, reason = "a count of machines")]
    let changes = (CONTROL_PLANES * 4 + machines) as f64;
    // Three static pods and kube-proxy per control plane, a kubelet per node.
    assert_eq!(fleet.value("ichor_fleet_config_applies_total").await, Some(changes), "each change once");
    assert_eq!(fleet.value("ichor_fleet_repeated_applies").await, Some(0.0), "no change applied twice");
    assert_eq!(fleet.value("ichor_fleet_max_control_planes_down").await, Some(1.0));
    scene.only_allowed_requests(&operator).await;
    let requests = total(&metrics, "ichor_kube_requests_total{");
    let writes = total(&metrics, "ichor_kube_writes_total");
    #[allow(clippy::cast_precision_loss, reason = "a count of machines")]
    let per = |n: f64| n / machines as f64;
    eprintln!(
        "kwok fleet {shape}, Kubernetes upgrade to {KUBERNETES_TARGET}, maxUnavailable {MAX_UNAVAILABLE}, time scale \
         {TIME_SCALE}: rollout {:.1} s; operator: {requests} API requests ({:.1} per machine), {writes} writes ({:.1} \
         per machine)",
        makespan.as_secs_f64(),
        per(requests),
        per(writes),
    );
    assert_eq!(fleet.terminate(), Some(0));
    scene.end().await;
}
