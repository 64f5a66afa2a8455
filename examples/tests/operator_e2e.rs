//! The operator end to end, as processes, on a real Kubernetes API server and the simulated
//! fleet (`ICHOR_TEST_KUBECONFIG`; skipped with one line without it).
//!
//! Each test has a namespace of its own. The fleet runs with the test server's admin
//! credentials; operators run in processes of their own under a ServiceAccount bound as
//! `deploy/operator.yaml` binds it (the test's namespace is both the operator's and the
//! cluster's), and every request they made (read from their `/metrics`, by namespace) must
//! be one the RBAC table grants there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{Process, TIME_SCALE, eventually};
use ichor_adapters::kubernetes::crd::{
    TalosCluster, TalosMachine, TalosOperation, TalosOperationSpec, TalosStorage, TalosStorageSpec,
};
use ichor_operator::rbac;
use ichor_sim::fleet;
use ichor_testkit::kube::TestNamespace;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A scenario: its namespace, a temporary directory, and a client.
pub(crate) struct Scene {
    pub(crate) ns: TestNamespace,
    pub(crate) dir: tempfile::TempDir,
    /// Whether the operator's ServiceAccount holds the Kubernetes-upgrade reads
    /// (`deploy/components/kubernetes-upgrades/`); without them the scene is a Talos-only
    /// install.
    kubernetes_upgrades: std::sync::atomic::AtomicBool,
}

impl Scene {
    pub(crate) async fn new(prefix: &str) -> Self {
        let ns = TestNamespace::create(prefix).await;
        Self { ns, dir: tempfile::tempdir().unwrap(), kubernetes_upgrades: false.into() }
    }

    /// A scene on the server of `kubeconfig` (one the test started itself).
    pub(crate) async fn on(kubeconfig: &Path, prefix: &str) -> Self {
        let ns = TestNamespace::create_on(kubeconfig, prefix).await;
        Self { ns, dir: tempfile::tempdir().unwrap(), kubernetes_upgrades: false.into() }
    }

    pub(crate) fn admin(&self) -> &Path {
        &self.ns.kubeconfig
    }

    /// The operator's ServiceAccount in the scene's namespace, bound as `deploy/` binds it:
    /// the cluster-wide ClusterRole, the leader Role in its own namespace, and the cluster
    /// namespace's RoleBinding (the scene's namespace is both).
    pub(crate) async fn operator_kubeconfig(&self) -> PathBuf {
        let client = &self.ns.client;
        let apply = PatchParams::apply("ichor-e2e").force();
        let roles: Api<ClusterRole> = Api::all(client.clone());
        roles.patch(rbac::NAME, &apply, &Patch::Apply(&typed(&rbac::cluster_role(rbac::NAME)))).await.unwrap();
        let namespaced = rbac::cluster_namespace_role();
        roles.patch(rbac::CLUSTER_NAMESPACE_ROLE, &apply, &Patch::Apply(&typed(&namespaced))).await.unwrap();
        let binding_name = format!("{}-{}", rbac::NAME, self.ns.name);
        let binding = rbac::cluster_role_binding(&binding_name, rbac::NAME, &self.ns.name, rbac::NAME);
        let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
        bindings.patch(&binding_name, &apply, &Patch::Apply(&typed(&binding))).await.unwrap();
        let ns = &self.ns.name;
        let leader: Api<Role> = Api::namespaced(client.clone(), ns);
        leader.patch(rbac::LEADER_ROLE, &apply, &Patch::Apply(&typed(&rbac::leader_role(ns)))).await.unwrap();
        let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
        let leader_binding = rbac::leader_role_binding(ns, rbac::NAME);
        role_bindings.patch(rbac::LEADER_ROLE, &apply, &Patch::Apply(&typed(&leader_binding))).await.unwrap();
        let grant = rbac::cluster_namespace_binding(ns, ns, rbac::NAME);
        role_bindings.patch(rbac::NAME, &apply, &Patch::Apply(&typed(&grant))).await.unwrap();
        self.ns.service_account_kubeconfig(rbac::NAME, &self.dir.path().join("operator.kubeconfig")).await
    }

    /// Binds the operator's ServiceAccount to the Kubernetes-upgrade reads, as
    /// `deploy/components/kubernetes-upgrades/` does (the scene's namespace is the
    /// ServiceAccount's): [`Scene::only_allowed_requests`] then allows them.
    pub(crate) async fn grant_kubernetes_upgrades(&self) {
        let client = &self.ns.client;
        let apply = PatchParams::apply("ichor-e2e").force();
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let role = rbac::kubernetes_upgrades_role();
        roles.patch(rbac::KUBERNETES_ROLE, &apply, &Patch::Apply(&typed(&role))).await.unwrap();
        let binding_name = format!("{}-{}", rbac::KUBERNETES_ROLE, self.ns.name);
        let binding = rbac::cluster_role_binding(&binding_name, rbac::KUBERNETES_ROLE, &self.ns.name, rbac::NAME);
        let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
        bindings.patch(&binding_name, &apply, &Patch::Apply(&typed(&binding))).await.unwrap();
        self.kubernetes_upgrades.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every request `operator` (run with [`Scene::operator_kubeconfig`]) made is one the
    /// RBAC table grants in the namespace it was made in.
    pub(crate) async fn only_allowed_requests(&self, operator: &Process) {
        let ns = self.ns.name.as_str();
        let kubernetes_upgrades = self.kubernetes_upgrades.load(std::sync::atomic::Ordering::Relaxed);
        let placement = rbac::Placement { operator_namespace: ns, cluster_namespaces: &[ns], kubernetes_upgrades };
        only_allowed_requests(operator, &placement).await;
    }

    pub(crate) fn fleet(&self, shape: &str, extra: &[&str]) -> Process {
        self.fleet_at(shape, TIME_SCALE, extra)
    }

    /// A fleet at `time_scale` virtual seconds per second.
    pub(crate) fn fleet_at(&self, shape: &str, time_scale: &str, extra: &[&str]) -> Process {
        let snapshots = self.snapshot_dir();
        // Its control planes give the test server's admin kubeconfig, as a real cluster's
        // give their own (a Kubernetes upgrade's manifests are applied under it).
        let admin = self.admin().display().to_string();
        let mut args = vec!["--namespace", &self.ns.name, "--simulate-fleet", shape, "--time-scale", time_scale];
        args.extend_from_slice(&["--etcd-snapshot-dir", &snapshots, "--fleet-admin-kubeconfig", &admin]);
        args.extend_from_slice(extra);
        Process::start("fleet", self.dir.path(), self.admin(), &args)
    }

    pub(crate) fn operator(&self, name: &str, kubeconfig: &Path, extra: &[&str]) -> Process {
        let snapshots = self.snapshot_dir();
        let mut args = vec!["--namespace", &self.ns.name, "--etcd-snapshot-dir", &snapshots];
        args.extend_from_slice(extra);
        Process::start(name, self.dir.path(), kubeconfig, &args)
    }

    /// Where the operators of this scene keep etcd snapshots.
    pub(crate) fn snapshot_dir(&self) -> String {
        self.dir.path().join("snapshots").display().to_string()
    }

    pub(crate) async fn create_operation(&self, name: &str, kind: &str, machine: Option<&str>) {
        self.create_operation_with(name, kind, machine, 1).await;
    }

    /// An operation with `max_unavailable` workers at once.
    pub(crate) async fn create_operation_with(
        &self,
        name: &str,
        kind: &str,
        machine: Option<&str>,
        max_unavailable: i64,
    ) {
        let ops: Api<TalosOperation> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        let spec = TalosOperationSpec { max_unavailable: max_unavailable.into(), ..self.operation_spec(kind, machine) };
        ops.create(&PostParams::default(), &TalosOperation::new(name, spec)).await.unwrap();
    }

    /// The spec of an operation of `kind` on the fleet's cluster, one worker at a time.
    pub(crate) fn operation_spec(&self, kind: &str, machine: Option<&str>) -> TalosOperationSpec {
        TalosOperationSpec {
            preflight: None,
            etcd_snapshot: None,
            dry_run: false,
            allow_two_control_planes: false,
            cluster: fleet::CLUSTER.into(),
            kind: kind.into(),
            target_version: fleet::TARGET.into(),
            max_unavailable: 1.into(),
            maintenance: None,
            gates: None,
            machine: machine.map(str::to_owned),
        }
    }

    pub(crate) async fn operation(&self, name: &str) -> Option<TalosOperation> {
        Api::<TalosOperation>::namespaced(self.ns.client.clone(), &self.ns.name).get_opt(name).await.unwrap()
    }

    pub(crate) async fn phase(&self, name: &str) -> String {
        self.operation(name).await.and_then(|op| op.status.and_then(|s| s.phase)).unwrap_or_default()
    }

    /// A pod `ledger-0` on `node` (it tolerates the fleet's taint) and a
    /// PodDisruptionBudget `ledger` allowing none of its pods down (policy/v1: a current
    /// server serves no other); their APIs.
    pub(crate) async fn ledger_under_a_budget_at_zero(&self, node: &str) -> (Api<Pod>, Api<DynamicObject>) {
        let pods: Api<Pod> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "ledger-0", "labels": { "app": "ledger" } },
            "spec": {
                "nodeName": node,
                "tolerations": [{ "key": fleet::TAINT, "operator": "Exists" }],
                "containers": [{ "name": "ledger", "image": "registry.invalid/ledger:1" }],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let pdb_kind = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("policy", "v1", "PodDisruptionBudget"),
            "poddisruptionbudgets",
        );
        let pdbs: Api<DynamicObject> = Api::namespaced_with(self.ns.client.clone(), &self.ns.name, &pdb_kind);
        let pdb: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": { "name": "ledger" },
            "spec": { "maxUnavailable": 0, "selector": { "matchLabels": { "app": "ledger" } } },
        }))
        .unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
        (pods, pdbs)
    }

    /// Waits until the fleet's objects exist.
    pub(crate) async fn fleet_up(&self, machines: usize) {
        let api: Api<TalosMachine> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        let nodes: Api<Node> = Api::all(self.ns.client.clone());
        let selector = ListParams::default().labels(&format!("{}={}", fleet::FLEET_LABEL, self.ns.name));
        eventually("the fleet's machines and Nodes", || async {
            api.list(&ListParams::default()).await.is_ok_and(|l| l.items.len() == machines)
                && nodes.list(&selector).await.is_ok_and(|l| {
                    l.items.len() == machines
                        && l.items.iter().all(|n| n.status.as_ref().is_some_and(|s| s.node_info.is_some()))
                })
        })
        .await;
    }

    pub(crate) async fn fleet_nodes(&self) -> Vec<Node> {
        let nodes: Api<Node> = Api::all(self.ns.client.clone());
        let selector = ListParams::default().labels(&format!("{}={}", fleet::FLEET_LABEL, self.ns.name));
        nodes.list(&selector).await.unwrap().items
    }

    pub(crate) async fn cluster_lease(&self) -> Option<Lease> {
        let leases: Api<Lease> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        leases.get_opt(&format!("ichor-cluster-{}", fleet::CLUSTER)).await.unwrap()
    }

    /// Deletes what the test made. The operations go first: an operator still running
    /// lifts their lock finalizer; one already stopped cannot, and a finalizer left would
    /// hold the namespace in Terminating for ever, so it is lifted here after a moment.
    pub(crate) async fn end(self) {
        let ops: Api<TalosOperation> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        ops.delete_collection(&Default::default(), &ListParams::default()).await.ok();
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = ops.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
            if left.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let lifted = json!({ "metadata": { "finalizers": null } });
                for op in left {
                    ops.patch(&op.name_any(), &PatchParams::default(), &Patch::Merge(&lifted)).await.ok();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(self.ns.client.clone());
        bindings.delete(&format!("{}-{}", rbac::NAME, self.ns.name), &Default::default()).await.ok();
        bindings.delete(&format!("{}-{}", rbac::KUBERNETES_ROLE, self.ns.name), &Default::default()).await.ok();
        self.ns.delete().await;
    }
}

fn typed<T: serde::Serialize + k8s_openapi::Resource>(object: &T) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap();
    value["apiVersion"] = T::API_VERSION.into();
    value["kind"] = T::KIND.into();
    value
}

/// Every Node of the fleet on the target and Ready.
pub(crate) fn all_on_target(nodes: &[Node]) -> bool {
    nodes.iter().all(|n| {
        let status = n.status.as_ref();
        let image = status.and_then(|s| s.node_info.as_ref()).map(|i| i.os_image.clone()).unwrap_or_default();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        image == format!("Talos ({})", fleet::TARGET) && ready
    })
}

/// The Upgrade calls the fleet received, by node.
pub(crate) async fn upgrade_calls(fleet: &Process) -> Vec<(String, f64)> {
    let text = fleet.metrics().await.expect("the fleet's metrics");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("ichor_fleet_upgrade_calls_total{node=\"")?;
            let (node, value) = rest.split_once("\"} ")?;
            Some((node.to_owned(), value.parse().ok()?))
        })
        .collect()
}

// The lifecycle executor through the operator: its installs run in tasks beside the
// passes (not inside them), its cordon, drain and Reboot are the operator's own, and the
// legacy Upgrade call is never made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_lifecycle_upgrade_completes_on_the_simulated_fleet_with_no_upgrade_call() {
    let scene = Scene::new("e2e-lifecycle").await;
    let fleet = scene.fleet("3+3", &["--fleet-only"]);
    scene.fleet_up(6).await;
    let kubeconfig = scene.operator_kubeconfig().await;
    let operator = scene.operator("operator", &kubeconfig, &["--executor", "lifecycle"]);
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    let nodes = scene.fleet_nodes().await;
    assert!(all_on_target(&nodes), "every Node on {} and Ready: {nodes:#?}", fleet::TARGET);
    for node in &nodes {
        let spec = node.spec.clone().unwrap_or_default();
        assert_ne!(spec.unschedulable, Some(true), "{:?} uncordoned", node.metadata.name);
    }
    assert!(upgrade_calls(&fleet).await.iter().all(|(_, n)| *n == 0.0), "no legacy Upgrade call");
    assert_eq!(fleet.value("ichor_fleet_max_control_planes_down").await, Some(1.0));
    // Each machine's pull is a step of its own, recorded with its intent, and its turn
    // starts at it.
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    for machine in machines.list(&ListParams::default()).await.unwrap() {
        let status = machine.status.clone().unwrap_or_default();
        let last = status.last_upgrade.clone().expect("status.lastUpgrade");
        let pull = status.history.iter().rfind(|s| s.type_ == "InstallerPull").expect("the pull's step");
        let intent = status.history.iter().rfind(|s| s.reason == "InstallIntent").expect("the intent's step");
        assert_eq!(
            (pull.time.clone(), last.steps.get("pull").copied()),
            (intent.time.clone(), pull.seconds),
            "{status:?}"
        );
        assert!(last.start.0.as_millisecond() <= pull.began_ms(), "the turn starts at the pull: {last:?}");
    }
    scene.only_allowed_requests(&operator).await;
    scene.end().await;
}

/// Every request the operator made is one the RBAC table grants where it was made, for an
/// operator placed as `placement`.
pub(crate) async fn only_allowed_requests(operator: &Process, placement: &rbac::Placement<'_>) {
    let text = operator.metrics().await.expect("the operator's metrics");
    let mut seen = 0;
    for line in text.lines().filter(|l| l.starts_with("ichor_kube_requests_total{")) {
        let field = |name: &str| {
            let start = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            line[start..].split('"').next().unwrap().to_owned()
        };
        let request = ichor_operator::requests::Request {
            verb: field("verb"),
            group: field("group"),
            resource: field("resource"),
            subresource: field("subresource"),
            namespace: field("namespace"),
        };
        assert!(rbac::allows(&request, placement), "the operator made a request its RBAC does not grant there: {line}");
        seen += 1;
    }
    assert!(seen > 5, "the operator's requests were not counted:\n{text}");
}

pub(crate) async fn leader(process: &Process) -> bool {
    process.value("ichor_leader").await == Some(1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_3_plus_5_upgrade_completes_on_the_simulated_fleet() {
    let scene = Scene::new("e2e-upgrade").await;
    // One process, as a person runs it: the operator and the fleet together.
    let mut both = scene.fleet("3+5", &[]);
    scene.fleet_up(8).await;
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;

    let nodes = scene.fleet_nodes().await;
    assert_eq!(nodes.len(), 8);
    assert!(all_on_target(&nodes), "every Node on {} and Ready: {nodes:#?}", fleet::TARGET);
    let lease = scene.cluster_lease().await.expect("the cluster Lease");
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert!(holder.is_empty(), "the cluster Lease is released, not held by {holder}");
    let calls = upgrade_calls(&both).await;
    assert_eq!(calls.len(), 8, "{calls:?}");
    assert!(calls.iter().all(|(_, n)| *n == 1.0), "one Upgrade call per machine: {calls:?}");
    assert_eq!(both.value("ichor_fleet_max_control_planes_down").await, Some(1.0));
    let converged = format!(
        "ichor_operation_machines{{namespace=\"{}\",operation=\"upgrade\",state=\"converged\"}}",
        scene.ns.name
    );
    assert_eq!(both.value(&converged).await, Some(8.0));
    // Each machine's upgrade step, from its recorded history, observed once by the leader.
    let upgrades = "ichor_machine_step_duration_seconds_count{step=\"upgrade\"}";
    eventually("every machine's upgrade step observed", || async { both.value(upgrades).await == Some(8.0) }).await;

    // The etcd snapshot taken before the first control plane: recorded, and the file is
    // whole (its size and SHA-256 are the recorded ones), streamed over the Talos API.
    let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    let snapshot = status.etcd_snapshot.expect("status.etcdSnapshot");
    assert!(snapshot.location.starts_with(&scene.snapshot_dir()), "{}", snapshot.location);
    let bytes = std::fs::read(&snapshot.location).unwrap();
    assert_eq!(i64::try_from(bytes.len()).unwrap(), snapshot.size);
    let sha256: String = <sha2::Sha256 as sha2::Digest>::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(sha256, snapshot.sha256);
    let files: Vec<_> = std::fs::read_dir(scene.snapshot_dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files.len(), 1, "one snapshot, no partial file: {files:?}");

    // SIGTERM: a clean stop, the fleet's Nodes gone.
    assert_eq!(both.terminate(), Some(0));
    assert!(scene.fleet_nodes().await.is_empty(), "a stopped fleet deletes its Nodes");
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn an_operator_killed_mid_rollout_resumes_with_no_second_upgrade_call() {
    let scene = Scene::new("e2e-kill").await;
    let fleet = scene.fleet("3+5", &["--fleet-only"]);
    scene.fleet_up(8).await;
    let kubeconfig = scene.operator_kubeconfig().await;
    let mut first = scene.operator("operator-1", &kubeconfig, &["--identity", "replica-a"]);
    scene.create_operation("upgrade", "talos", None).await;
    // Kill it right after a second machine's Upgrade call: a machine is past its call and
    // not converged.
    eventually("two Upgrade calls", || async {
        upgrade_calls(&fleet).await.iter().map(|(_, n)| n).sum::<f64>() >= 2.0
    })
    .await;
    scene.only_allowed_requests(&first).await;
    first.kill();
    let before = upgrade_calls(&fleet).await;

    // The same pod restarted (same identity): it leads again at once.
    let second = scene.operator("operator-2", &kubeconfig, &["--identity", "replica-a"]);
    eventually("the operation completes after the restart", || async { scene.phase("upgrade").await == "Completed" })
        .await;
    let calls = upgrade_calls(&fleet).await;
    assert_eq!(calls.len(), 8, "{calls:?}");
    assert!(calls.iter().all(|(_, n)| *n == 1.0), "no second Upgrade call (before the kill: {before:?}): {calls:?}");
    assert!(all_on_target(&scene.fleet_nodes().await));
    assert_eq!(fleet.value("ichor_fleet_max_control_planes_down").await, Some(1.0));
    scene.only_allowed_requests(&second).await;
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn of_two_replicas_only_the_leader_writes_and_the_other_takes_over() {
    let scene = Scene::new("e2e-replicas").await;
    let fleet = scene.fleet("3+5", &["--fleet-only"]);
    scene.fleet_up(8).await;
    let kubeconfig = scene.operator_kubeconfig().await;
    let mut a = scene.operator("replica-a", &kubeconfig, &["--identity", "replica-a"]);
    let mut b = scene.operator("replica-b", &kubeconfig, &["--identity", "replica-b"]);
    eventually("one replica leads", || async { leader(&a).await || leader(&b).await }).await;
    let a_leads = leader(&a).await;
    assert!(a_leads != leader(&b).await, "exactly one leader");
    let (leading, following) = if a_leads { (&mut a, &mut b) } else { (&mut b, &mut a) };

    scene.create_operation("upgrade", "talos", None).await;
    eventually("three Upgrade calls", || async {
        upgrade_calls(&fleet).await.iter().map(|(_, n)| n).sum::<f64>() >= 3.0
    })
    .await;
    assert!(leading.value("ichor_kube_writes_total").await.unwrap_or(0.0) > 0.0);
    assert_eq!(following.value("ichor_kube_writes_total").await, Some(0.0), "the follower wrote");
    assert_eq!(following.value("ichor_kube_events_total").await, Some(0.0), "the follower recorded Events");
    assert_eq!(following.value("ichor_reconciles_total{outcome=\"ok\"}").await, None, "the follower reconciled");
    scene.only_allowed_requests(leading).await;
    scene.only_allowed_requests(following).await;

    let killed = Instant::now();
    leading.kill();
    eventually("the follower takes over", || async { leader(following).await }).await;
    let takeover = killed.elapsed();
    eprintln!("takeover {:.1} s after the leader was killed (Lease 15 s, looked at every 2 s)", takeover.as_secs_f64());
    assert!(takeover < Duration::from_secs(15 + 2 + 3), "takeover took {takeover:?}");
    eventually("the operation completes under the new leader", || async {
        scene.phase("upgrade").await == "Completed"
    })
    .await;
    let calls = upgrade_calls(&fleet).await;
    assert!(calls.len() == 8 && calls.iter().all(|(_, n)| *n == 1.0), "one Upgrade call per machine: {calls:?}");
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_lease_held_by_a_deleted_operation_is_taken_over() {
    let scene = Scene::new("e2e-takeover").await;
    // A Lease an operation that no longer exists took an hour ago, for a day.
    let leases: Api<Lease> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let gone = format!("{}/gone/0b7c5d1e-0000-4000-8000-000000000000", scene.ns.name);
    let taken = (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1)).to_string();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": format!("ichor-cluster-{}", fleet::CLUSTER) },
        "spec": { "holderIdentity": gone, "leaseDurationSeconds": 86_400, "acquireTime": taken, "renewTime": taken },
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();

    let _both = scene.fleet("1+2", &[]);
    scene.fleet_up(3).await;
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    assert!(all_on_target(&scene.fleet_nodes().await));
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_second_operation_on_the_cluster_waits_naming_the_holder() {
    let scene = Scene::new("e2e-second").await;
    let _both = scene.fleet("1+3", &[]);
    scene.fleet_up(4).await;
    scene.create_operation("first", "talos", None).await;
    eventually("the first operation holds the lock", || async { scene.phase("first").await == "Progressing" }).await;
    scene.create_operation("second", "talos", None).await;
    let first_uid = scene.operation("first").await.unwrap().uid().unwrap();
    eventually("the second waits, naming the holder", || async {
        let status = scene.operation("second").await.and_then(|op| op.status).unwrap_or_default();
        status.reason.as_deref() == Some("LockHeld")
            && status.message.as_deref().is_some_and(|m| m.contains("first") && m.contains(&first_uid))
    })
    .await;
    eventually("both complete, one after the other", || async {
        scene.phase("first").await == "Completed" && scene.phase("second").await == "Completed"
    })
    .await;
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_pdb_at_zero_holds_a_removal_at_its_eviction_until_it_allows_it() {
    let scene = Scene::new("e2e-pdb").await;
    let fleet = scene.fleet("1+2", &["--fleet-only"]);
    scene.fleet_up(3).await;
    let kubeconfig = scene.operator_kubeconfig().await;
    let operator = scene.operator("operator", &kubeconfig, &[]);
    let node = format!("{}-worker-2.{}", fleet::CLUSTER, scene.ns.name);
    let (pods, pdbs) = scene.ledger_under_a_budget_at_zero(&node).await;
    eventually("the pod runs", || async {
        pods.get("ledger-0").await.ok().and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;

    scene.create_operation("remove-worker-2", "remove", Some("demo-worker-2")).await;
    eventually("the removal waits at the eviction", || async {
        let op = scene.operation("remove-worker-2").await.and_then(|op| op.status).unwrap_or_default();
        let engine = op.engine.map(|e| e.to_string()).unwrap_or_default();
        engine.contains("EvictionBlocked") && engine.contains("ledger-0")
    })
    .await;
    // Waiting, not failed: held for a while, the Node still there and the operation not paused.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(scene.fleet_nodes().await.iter().any(|n| n.name_any() == node), "the Node is still there");
    let phase = scene.phase("remove-worker-2").await;
    assert!(phase != "Paused" && phase != "Failed" && phase != "Completed", "{phase}");
    assert!(pods.get_opt("ledger-0").await.unwrap().is_some(), "the guarded pod is still there");

    // The budget lifted: the eviction goes through at the next try and the removal ends.
    pdbs.delete("ledger", &Default::default()).await.unwrap();
    eventually("the removal completes", || async { scene.phase("remove-worker-2").await == "Completed" }).await;
    assert!(!scene.fleet_nodes().await.iter().any(|n| n.name_any() == node), "the Node is deleted");
    assert!(pods.get_opt("ledger-0").await.unwrap().is_none(), "the pod was evicted");
    scene.only_allowed_requests(&operator).await;
    drop(fleet);
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_bad_kind_is_refused_by_the_schema_and_a_bad_machine_by_the_controller() {
    let scene = Scene::new("e2e-kind").await;
    let both = scene.fleet("1+1", &[]);
    scene.fleet_up(2).await;
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let mut spec = scene.operation_spec("ichor", None);
    let refused = ops.create(&PostParams::default(), &TalosOperation::new("k8s", spec.clone())).await.unwrap_err();
    let text = refused.to_string();
    assert!(text.contains("spec.kind") && text.contains("\"talos\"") && text.contains("\"kubernetes\""), "{text}");
    spec.kind = "talos".into();
    spec.machine = Some(fleet::CLUSTER.to_owned() + "-worker-1");
    let refused = ops.create(&PostParams::default(), &TalosOperation::new("k8s", spec)).await.unwrap_err();
    assert!(refused.to_string().contains("only for kind remove"), "{refused}");
    scene.create_operation("ghost", "remove", Some("ghost-machine")).await;
    eventually("the operation is refused", || async { scene.phase("ghost").await == "Refused" }).await;
    let status = scene.operation("ghost").await.and_then(|op| op.status).unwrap_or_default();
    assert!(status.message.as_deref().is_some_and(|m| m.contains("ghost-machine")), "{status:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    eventually("a Warning Event on the operation", || async {
        events.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("ghost")
                    && e.note.as_deref().is_some_and(|n| n.contains("ghost-machine"))
            })
        })
    })
    .await;
    assert_eq!(both.value("ichor_fleet_talos_calls_total").await, Some(0.0), "nothing was called on the fleet");
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn an_operation_for_a_missing_cluster_is_refused_naming_it_and_runs_once_the_cluster_appears() {
    let scene = Scene::new("e2e-nocluster").await;
    let kubeconfig = scene.operator_kubeconfig().await;
    let operator = scene.operator("operator", &kubeconfig, &[]);
    scene.create_operation("early", "talos", None).await;
    eventually("the operation is refused", || async { scene.phase("early").await == "Refused" }).await;
    let status = scene.operation("early").await.and_then(|op| op.status).unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("ClusterNotFound"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(message.contains(&format!("TalosCluster {:?} does not exist", fleet::CLUSTER)), "{message}");
    let stalled = status.conditions.iter().find(|c| c.type_ == "Stalled").map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(stalled, Some(("True".to_owned(), "ClusterNotFound".to_owned())));
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    eventually("a Warning Event naming the cluster", || async {
        events.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("ClusterNotFound")
                    && e.note.as_deref().is_some_and(|n| n.contains(fleet::CLUSTER))
            })
        })
    })
    .await;
    // The cluster appears (the fleet makes it, its machines and Nodes): the operation runs.
    let mut fleet_process = scene.fleet("1+2", &["--fleet-only"]);
    scene.fleet_up(3).await;
    eventually("the operation completes", || async { scene.phase("early").await == "Completed" }).await;
    assert!(all_on_target(&scene.fleet_nodes().await));
    let warnings = events.list(&ListParams::default()).await.unwrap().items;
    let refusals: Vec<_> = warnings.iter().filter(|e| e.reason.as_deref() == Some("ClusterNotFound")).collect();
    assert_eq!(refusals.len(), 1, "one Event when it became refused, not one per pass");
    assert!(refusals[0].series.is_none(), "not repeated as a series: {:?}", refusals[0].series);
    scene.only_allowed_requests(&operator).await;
    assert_eq!(fleet_process.terminate(), Some(0));
    scene.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn the_control_plane_the_operator_runs_on_is_upgraded_last() {
    let scene = Scene::new("e2e-own-node").await;
    let fleet_process = scene.fleet("3+2", &["--fleet-only"]);
    scene.fleet_up(5).await;
    // The operator's pod bound to the fleet's first control plane (NODE_NAME, as the
    // StatefulSet sets it from spec.nodeName).
    let own = format!("{}-cp-1.{}", fleet::CLUSTER, scene.ns.name);
    let kubeconfig = scene.operator_kubeconfig().await;
    let snapshots = scene.snapshot_dir();
    let args = ["--namespace", scene.ns.name.as_str(), "--etcd-snapshot-dir", snapshots.as_str()];
    let operator = Process::start_with_env("operator", scene.dir.path(), &kubeconfig, &args, &[("NODE_NAME", &own)]);
    scene.create_operation("upgrade", "talos", None).await;
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let called = |m: &TalosMachine| {
        let history = m.status.as_ref().map(|s| s.history.clone()).unwrap_or_default();
        history.iter().rev().find(|s| s.reason == "UpgradeRequested").map(|s| s.time.0).expect("an Upgrade call")
    };
    let mut control_planes: Vec<(String, _)> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|m| m.spec.role == ichor_adapters::kubernetes::crd::Role::Controlplane)
        .map(|m| (m.name_any(), called(m)))
        .collect();
    control_planes.sort_by_key(|(_, at)| *at);
    let order: Vec<&str> = control_planes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order.last(), Some(&format!("{}-cp-1", fleet::CLUSTER).as_str()), "its own node last: {order:?}");
    assert_eq!(order.len(), 3);
    scene.only_allowed_requests(&operator).await;
    drop(fleet_process);
    scene.end().await;
}

/// The Longhorn Node with the engine's evacuation record, and the record.
async fn recorded_evacuation(nodes: &Api<DynamicObject>) -> Option<(String, String)> {
    let list = nodes.list(&ListParams::default()).await.unwrap().items;
    list.into_iter().find_map(|n| Some((n.name_any(), n.annotations().get("ichor.dev/evacuation")?.clone())))
}

/// Plays Longhorn's manager: the replicas of every Longhorn Node with an eviction
/// requested are gone (moved elsewhere).
async fn evict_replicas(nodes: &Api<DynamicObject>, replicas: &Api<DynamicObject>) {
    for node in nodes.list(&ListParams::default()).await.unwrap().items {
        if node.data["spec"]["evictionRequested"] == json!(true) {
            let on = ListParams::default().labels(&format!("longhornnode={}", node.name_any()));
            replicas.delete_collection(&Default::default(), &on).await.unwrap();
        }
    }
}

// Decision 0011, through the operator on a real API server with Longhorn's kinds: the
// patch that starts an evacuation is its only record (no condition is written for it),
// and an operator killed while it stands resumes from it: the same record, one Upgrade
// call per machine, and each node's storage scheduling put back as it was before,
// including the one an operator had made unschedulable by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn an_operator_killed_during_a_longhorn_evacuation_resumes_from_longhorns_record() {
    let scene = Scene::new("e2e-longhorn").await;
    ichor_testkit::kube::apply_longhorn_crds(&scene.ns.client).await;
    let fleet = scene.fleet("1+2", &["--fleet-only"]);
    scene.fleet_up(3).await;
    let workers: Vec<String> = (1..=2).map(|i| format!("{}-worker-{i}.{}", fleet::CLUSTER, scene.ns.name)).collect();
    // Storage on this scene's workers: a TalosStorage, Longhorn's Nodes and a replica each.
    let storage: Api<TalosStorage> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let selector = serde_json::from_value(json!({
        "matchLabels": { fleet::FLEET_LABEL: scene.ns.name },
        "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist" }],
    }))
    .unwrap();
    let talos_storage = TalosStorage::new(
        "longhorn",
        TalosStorageSpec {
            backend: "longhorn".into(),
            node_selector: selector,
            evacuation_timeout_seconds: Some(3600),
        },
    );
    storage.create(&PostParams::default(), &talos_storage).await.unwrap();
    let longhorn = |kind, plural| ichor_testkit::kube::longhorn_api(&scene.ns.client, &scene.ns.name, kind, plural);
    let (nodes, replicas) = (longhorn("Node", "nodes"), longhorn("Replica", "replicas"));
    for (i, worker) in workers.iter().enumerate() {
        // The first worker was made unschedulable for storage by hand.
        let node: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": "Node", "metadata": { "name": worker },
            "spec": { "name": worker, "allowScheduling": i != 0, "evictionRequested": false, "disks": {} },
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        // A 1 GiB volume's replica on the first, a 2 GiB one on the second.
        let replica: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
            "metadata": { "name": format!("pvc-data-r-{i}"), "labels": { "longhornnode": worker } },
            "spec": { "nodeID": worker, "volumeSize": ((i as u64 + 1) << 30).to_string() },
        }))
        .unwrap();
        replicas.create(&PostParams::default(), &replica).await.unwrap();
    }

    let kubeconfig = scene.operator_kubeconfig().await;
    let namespace = scene.ns.name.clone();
    let extra = ["--identity", "replica-a", "--longhorn-namespace", &namespace];
    let mut first = scene.operator("operator-1", &kubeconfig, &extra);
    scene.create_operation("upgrade", "talos", None).await;
    // The first evacuation asked for: its replica is still there, so it stands.
    eventually("an evacuation recorded on Longhorn's Node", || async { recorded_evacuation(&nodes).await.is_some() })
        .await;
    scene.only_allowed_requests(&first).await;
    first.kill();
    let (node, record) = recorded_evacuation(&nodes).await.expect("it still stands");
    assert!(record.contains(",since="), "the record keeps its time: {record}");
    let hostname = node.split('.').next().unwrap().to_owned();
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let machine = machines.get(&hostname).await.unwrap();
    let conditions = machine.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        !conditions.iter().any(|c| c.type_ == "StorageEvacuation"),
        "no condition opened the evacuation: Longhorn's Node is its record ({conditions:?})"
    );

    let second = scene.operator("operator-2", &kubeconfig, &extra);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = nodes.get(&node).await.unwrap();
    assert_eq!(kept.annotations().get("ichor.dev/evacuation"), Some(&record), "the same record, not a new one");
    eventually("the operation completes after the restart", || {
        let (nodes, replicas) = (nodes.clone(), replicas.clone());
        let scene = &scene;
        async move {
            evict_replicas(&nodes, &replicas).await;
            scene.phase("upgrade").await == "Completed"
        }
    })
    .await;

    let calls = upgrade_calls(&fleet).await;
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|(_, n)| *n == 1.0), "one Upgrade call per machine: {calls:?}");
    assert!(all_on_target(&scene.fleet_nodes().await));
    for (i, worker) in workers.iter().enumerate() {
        let node = nodes.get(worker).await.unwrap();
        let spec = (&node.data["spec"]["allowScheduling"], &node.data["spec"]["evictionRequested"]);
        assert_eq!(spec, (&json!(i != 0), &json!(false)), "{worker}: put back as it was before");
        assert!(!node.annotations().contains_key("ichor.dev/evacuation"), "{worker}: the record is gone");
        let machine = machines.get(worker.split('.').next().unwrap()).await.unwrap();
        let conditions = machine.status.clone().map(|s| s.conditions).unwrap_or_default();
        let evacuation = conditions.iter().find(|c| c.type_ == "StorageEvacuation").expect("the evacuation's end");
        assert_eq!((evacuation.status.as_str(), evacuation.reason.as_str()), ("False", "Ended"), "{worker}");
        // Its upgrade recorded the bytes that were on it when the evacuation began, from
        // Longhorn's record (for the first, the one the killed operator asked for).
        let last = machine.status.and_then(|s| s.last_upgrade).expect("status.lastUpgrade");
        assert_eq!(last.evacuated_bytes, Some((i as u64 + 1) << 30), "{worker}: {last:?}");
        // The move, not the whole turn: storage stays off the node until it converges.
        assert!(last.steps["evacuation"] < last.seconds - last.steps["upgrade"] + 1e-6, "{worker}: {last:?}");
    }

    // A plan of the next upgrade reads the replicas' sizes now (a 3 GiB volume's replica
    // on the second worker) and times its evacuation at the rate the upgrade recorded.
    let replica: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
        "metadata": { "name": "pvc-logs-r-1", "labels": { "longhornnode": &workers[1] } },
        "spec": { "nodeID": &workers[1], "volumeSize": (3u64 << 30).to_string() },
    }))
    .unwrap();
    replicas.create(&PostParams::default(), &replica).await.unwrap();
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let next = json!({ "spec": { "talosVersion": "v1.14.4" } });
    clusters.patch(fleet::CLUSTER, &PatchParams::default(), &Patch::Merge(&next)).await.unwrap();
    let spec =
        TalosOperationSpec { target_version: "v1.14.4".into(), dry_run: true, ..scene.operation_spec("talos", None) };
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    ops.create(&PostParams::default(), &TalosOperation::new("plan", spec)).await.unwrap();
    eventually("the plan is made", || async { scene.phase("plan").await == "Completed" }).await;
    let plan = ops.get("plan").await.unwrap().status.and_then(|s| s.plan).expect("status.plan");
    let said = plan.assumed.iter().find(|a| a.starts_with("storage: ")).unwrap_or_else(|| panic!("{plan:?}"));
    assert!(said.starts_with("storage: 3.0 GiB on 1 machines now, each evacuation timed at the recorded "), "{said}");
    scene.only_allowed_requests(&second).await;
    drop(fleet);
    scene.end().await;
}

/// The target of the fleet's Kubernetes upgrades: the next minor of [`fleet::KUBERNETES`].
pub(crate) const KUBERNETES_TARGET: &str = "1.35.0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn a_kubernetes_upgrade_completes_on_the_simulated_fleet_with_every_kubelet_on_the_target() {
    let scene = Scene::new("e2e-k8s").await;
    let fleet = scene.fleet("3+3", &["--fleet-only"]);
    scene.fleet_up(6).await;
    let kubeconfig = scene.operator_kubeconfig().await;
    scene.grant_kubernetes_upgrades().await;
    let mut first = scene.operator("operator-1", &kubeconfig, &["--identity", "replica-a"]);
    let ops: Api<TalosOperation> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    let spec = TalosOperationSpec {
        target_version: KUBERNETES_TARGET.into(),
        max_unavailable: 2.into(),
        maintenance: None,
        gates: None,
        ..scene.operation_spec("kubernetes", None)
    };
    ops.create(&PostParams::default(), &TalosOperation::new("kubernetes", spec)).await.unwrap();
    // Killed after its first applies, while a control plane's components change.
    eventually("three applies", || async { fleet.value("ichor_fleet_config_applies_total").await >= Some(3.0) }).await;
    scene.only_allowed_requests(&first).await;
    first.kill();
    let before = fleet.value("ichor_fleet_config_applies_total").await.unwrap_or_default();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let traced = ["--identity", "replica-a", "--trace", trace.to_str().unwrap()];
    let second = scene.operator("operator-2", &kubeconfig, &traced);
    eventually("the Kubernetes upgrade completes", || async { scene.phase("kubernetes").await == "Completed" }).await;
    // The restarted operator's trace: a config-apply, with its node and component, before
    // each apply it made.
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["event"] == "config-apply")
        .collect();
    let components = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet"];
    for record in &records {
        assert!(record["node"].as_str().is_some_and(|n| n.starts_with("demo-")), "{record}");
        assert!(components.contains(&record["component"].as_str().unwrap_or_default()), "{record}");
    }
    let after = fleet.value("ichor_fleet_config_applies_total").await.unwrap_or_default();
    #[allow(clippy::cast_precision_loss)]
    let traced_applies = records.len() as f64;
    assert_eq!(traced_applies, after - before, "one config-apply record per apply after the restart: {records:?}");

    let nodes = scene.fleet_nodes().await;
    assert_eq!(nodes.len(), 6);
    for node in &nodes {
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref()).expect("nodeInfo");
        assert_eq!(info.kubelet_version, format!("v{KUBERNETES_TARGET}"), "{}", node.name_any());
    }
    // Every control plane's mirror pods on the target and Ready.
    let pods: Api<Pod> = Api::namespaced(scene.ns.client.clone(), "kube-system");
    let mirrors = pods
        .list(&ListParams::default().labels(&format!("{}={}", fleet::FLEET_LABEL, scene.ns.name)))
        .await
        .unwrap()
        .items;
    assert_eq!(mirrors.len(), 9, "three static pods on each of three control planes");
    for pod in &mirrors {
        assert_eq!(pod.labels().get("app.kubernetes.io/version").map(String::as_str), Some(KUBERNETES_TARGET));
    }
    // The bootstrap manifests, last: kube-proxy's DaemonSet on the target, applied
    // server-side by the operator under Talos's field manager.
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(scene.ns.client.clone(), "kube-system");
    let proxy = daemonsets.get("kube-proxy").await.expect("kube-system/kube-proxy");
    let containers = &proxy.spec.template.spec.as_ref().expect("a pod spec").containers;
    assert_eq!(
        containers[0].image.as_deref(),
        Some(format!("registry.k8s.io/kube-proxy:v{KUBERNETES_TARGET}").as_str())
    );
    assert!(
        proxy
            .managed_fields()
            .iter()
            .any(|f| f.manager.as_deref() == Some("talos") && f.operation.as_deref() == Some("Apply")),
        "{:?}",
        proxy.managed_fields()
    );
    // Three static pods and kube-proxy per control plane, a kubelet per node; none twice.
    assert_eq!(fleet.value("ichor_fleet_config_applies_total").await, Some(3.0 * 4.0 + 6.0));
    assert_eq!(fleet.value("ichor_fleet_repeated_applies").await, Some(0.0), "no change applied twice");
    assert_eq!(fleet.value("ichor_fleet_talos_calls_total").await.map(|n| n > 0.0), Some(true));
    let lease = scene.cluster_lease().await.expect("the cluster Lease");
    assert!(lease.spec.and_then(|s| s.holder_identity).unwrap_or_default().is_empty(), "the lock is released");
    scene.only_allowed_requests(&second).await;
    scene.end().await;
}
