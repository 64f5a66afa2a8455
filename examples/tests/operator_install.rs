//! The operator as a platform team installs it, on the real API server: `kubectl apply -k`
//! of `deploy/` (through an overlay that sets the image, the one field a user changes, and
//! no replicas: the operator under test is the locally built binary, run as a process with
//! the token of the ServiceAccount the manifests make), then a TalosCluster applied with
//! kubectl, on a simulated fleet of 3 + 10 whose Nodes have no TalosMachines
//! (`operator --simulate-fleet CP+W --no-machines`, the contract). With discovery off the
//! upgrade is refused naming every Node; with `discovery: Nodes` the machines are made from
//! the Nodes and the upgrade completes with every Node on the target.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::api_restart::OwnServer;
use crate::operator_desired as desired_test;
use crate::operator_e2e::{KUBERNETES_TARGET, Scene, all_on_target, leader, only_allowed_requests};
use crate::operator_notify::{Receiver, records};
use crate::support::{Process, eventually};
use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine, TalosOperation, TalosOperationStatus};
use ichor_operator::{discovery, rbac};
use ichor_sim::fleet;
use ichor_upgrade_core::operation::OperationKind;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, ListParams};

/// The kubectl beside the test server's kubeconfig (`scripts/kube-test-server.sh` links
/// one there), else the one on `PATH`.
fn kubectl(kubeconfig: &Path) -> Command {
    let beside = std::env::var_os("ICHOR_TEST_KUBECONFIG")
        .map(PathBuf::from)
        .and_then(|k| k.parent().map(|d| d.join("kubectl")))
        .filter(|k| k.exists());
    let mut command = Command::new(beside.unwrap_or_else(|| PathBuf::from("kubectl")));
    command.env("KUBECONFIG", kubeconfig);
    command
}

/// Runs kubectl with `args`, panicking with its output when it fails; its stdout.
fn run(kubeconfig: &Path, args: &[&str]) -> String {
    let output = kubectl(kubeconfig).args(args).output().unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(output.status.success(), "kubectl {args:?}: {}{}", text(&output.stdout), text(&output.stderr));
    text(&output.stdout)
}

/// An overlay of `deploy/` in `dir`, as a user's own kustomization would be: the image
/// named, no replicas.
fn overlay(dir: &Path) -> PathBuf {
    let overlay = dir.join("install");
    std::fs::create_dir_all(&overlay).unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").canonicalize().unwrap();
    // kustomize takes a relative path to a base: up from the overlay to the root, then down.
    let up = "../".repeat(overlay.canonicalize().unwrap().components().count() - 1);
    let base = format!("{up}{}", deploy.strip_prefix("/").unwrap().display());
    let text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {base}\n\
         replicas:\n  - name: ichor-operator\n    count: 0\n\
         images:\n  - name: localhost/ichor-operator\n    newName: registry.example/ichor-operator\n    newTag: under-test\n"
    );
    std::fs::write(overlay.join("kustomization.yaml"), text).unwrap();
    overlay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server and kubectl: ICHOR_TEST_KUBECONFIG (bash scripts/kube-test-server.sh start DIR)"]
async fn installed_with_kubectl_apply_k_every_node_is_accounted_for_and_the_upgrade_completes() {
    let scene = Scene::new("e2e-install").await;
    let admin = scene.admin().to_path_buf();
    let applied = run(&admin, &["apply", "-k", &overlay(scene.dir.path()).display().to_string()]);
    for object in [
        "namespace/ichor-system",
        "serviceaccount/ichor-operator",
        "statefulset.apps/ichor-operator",
        "clusterrole.rbac.authorization.k8s.io/ichor-operator-kubernetes-upgrades",
    ] {
        assert!(applied.contains(object), "kubectl apply -k applied {object}: {applied}");
    }
    let sets: Api<StatefulSet> = Api::namespaced(scene.ns.client.clone(), rbac::NAMESPACE);
    let set = sets.get(rbac::NAME).await.unwrap();
    let image = set.spec.template.spec.and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
    assert_eq!(image.as_deref(), Some("registry.example/ichor-operator:under-test"), "the image is one field");

    // The cluster as a user writes it: its Nodes (those of this fleet), no machines listed.
    let cluster = format!(
        "apiVersion: ichor.dev/v1alpha1\nkind: TalosCluster\nmetadata:\n  name: {}\nspec:\n  talosVersion: {}\n  \
         kubernetesVersion: {}\n  platform: metal\n  talosconfigSecret: {}-talosconfig\n  nodeSelector:\n    {}: {}\n",
        fleet::CLUSTER,
        fleet::TARGET,
        fleet::KUBERNETES,
        fleet::CLUSTER,
        fleet::FLEET_LABEL,
        scene.ns.name
    );
    let cluster_file = scene.dir.path().join("cluster.yaml");
    std::fs::write(&cluster_file, &cluster).unwrap();
    run(&admin, &["apply", "-n", &scene.ns.name, "-f", &cluster_file.display().to_string()]);

    // The fleet publishes the Nodes, their Talos API and the talosconfig Secret.
    let mut fleet_process = scene.fleet("3+10", &["--no-machines", "--fleet-only"]);
    eventually("the fleet's 13 Nodes", || async { scene.fleet_nodes().await.len() == 13 }).await;
    let machines: Api<TalosMachine> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    assert!(machines.list(&ListParams::default()).await.unwrap().items.is_empty(), "--no-machines makes none");

    // The operator with the installed ServiceAccount's rights, and nothing else.
    let kubeconfig = scene
        .ns
        .service_account_kubeconfig_in(rbac::NAMESPACE, rbac::NAME, &scene.dir.path().join("operator.kubeconfig"))
        .await;

    // Run as the StatefulSet runs it: POD_NAMESPACE is its own namespace (the leader
    // Lease's, granted there by the Role `deploy/` makes).
    let snapshots = scene.snapshot_dir();
    let operator = Process::start_with_env(
        "operator",
        scene.dir.path(),
        &kubeconfig,
        &["--namespace", &scene.ns.name, "--etcd-snapshot-dir", &snapshots],
        &[("POD_NAMESPACE", rbac::NAMESPACE)],
    );
    scene.create_operation("upgrade", "talos", None).await;

    // Least privilege: `deploy/` grants no Secret and no cluster lock in the cluster's
    // namespace until the cluster's RoleBinding is made. The operation waits, stalled,
    // with the command that grants it; nothing is touched.
    eventually("the operation waits for a grant", || async {
        scene.operation("upgrade").await.and_then(|op| op.status).and_then(|s| s.reason).as_deref() == Some("Forbidden")
    })
    .await;
    let waiting = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    assert_eq!(kstatus(&waiting), [("Ready", "False"), ("Reconciling", "False"), ("Stalled", "True")]);
    let message = waiting.message.unwrap_or_default();
    let command = message.split("grant it with: ").nth(1).unwrap_or_else(|| panic!("no command in: {message}"));
    assert_eq!(command, rbac::grant_command(&scene.ns.name, rbac::NAMESPACE, rbac::NAME));
    assert!(scene.cluster_lease().await.is_none(), "no lock taken");
    // The command as a person pastes it.
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    run(&admin, &args);

    // Discovery off (the default): refused, every Node named, nothing touched.
    eventually("the operation is refused", || async { scene.phase("upgrade").await == "Refused" }).await;
    let status = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    let message = status.message.unwrap_or_default();
    for node in scene.fleet_nodes().await {
        let name = node.metadata.name.unwrap_or_default();
        assert!(message.contains(&name), "the refusal names {name}: {message}");
    }
    assert!(message.contains("spec.discovery: Nodes"), "it says what fixes it: {message}");
    assert!(machines.list(&ListParams::default()).await.unwrap().items.is_empty());
    let refused = scene.operation("upgrade").await.and_then(|op| op.status).unwrap_or_default();
    assert_eq!(kstatus(&refused), [("Ready", "False"), ("Reconciling", "False"), ("Stalled", "True")]);

    // Discovery on: a machine per Node, from the Node; then the upgrade runs to the end.
    std::fs::write(&cluster_file, format!("{cluster}  discovery: Nodes\n")).unwrap();
    run(&admin, &["apply", "-n", &scene.ns.name, "-f", &cluster_file.display().to_string()]);
    eventually("the operation completes", || async { scene.phase("upgrade").await == "Completed" }).await;
    let made = machines.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(made.len(), 13);
    let nodes = scene.fleet_nodes().await;
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let machine = made.iter().find(|m| m.metadata.name.as_deref() == Some(&name)).expect("a machine per Node");
        assert_eq!(machine.spec.hostname.as_deref(), Some(name.as_str()));
        let ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"));
        assert_eq!(Some(&machine.spec.address), ip.map(|a| &a.address));
        let control_plane =
            node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(discovery::CONTROL_PLANE_LABEL));
        assert_eq!(machine.spec.role == ichor_adapters::kubernetes::crd::Role::Controlplane, control_plane, "{name}");
    }
    assert!(all_on_target(&nodes), "every Node on {}", fleet::TARGET);
    // What Argo CD and Flux read: Ready, neither reconciling nor stalled, for this generation.
    let op = scene.operation("upgrade").await.unwrap();
    let status = op.status.clone().unwrap_or_default();
    assert_eq!(kstatus(&status), [("Ready", "True"), ("Reconciling", "False"), ("Stalled", "False")]);
    assert_eq!(status.observed_generation, op.metadata.generation, "kstatus reads the generation observed");
    // The TalosCluster says where the cluster stands.
    let clusters: Api<TalosCluster> = Api::namespaced(scene.ns.client.clone(), &scene.ns.name);
    eventually("the TalosCluster's status has every Node on the target", || async {
        let status = clusters.get(fleet::CLUSTER).await.ok().and_then(|c| c.status).unwrap_or_default();
        status.talos_versions == [fleet::TARGET]
            && status.nodes == Some(13)
            && status.machines == Some(13)
            && status.nodes_by_talos_version.get(fleet::TARGET) == Some(&13)
            && status.operation.is_none()
    })
    .await;
    // Its Running column is the version, not a JSON array (issue 55).
    let table = run(&admin, &["get", "taloscluster", fleet::CLUSTER, "-n", &scene.ns.name]);
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(row.contains(fleet::TARGET) && !row.contains('['), "{table}");
    // The fields' own documentation, as a user reads it.
    let explained = run(&admin, &["explain", "talosoperation.spec.preflight"]);
    assert!(explained.contains("preflight gate"), "kubectl explain shows the field's doc: {explained}");
    let placement = rbac::Placement {
        operator_namespace: rbac::NAMESPACE,
        cluster_namespaces: &[&scene.ns.name],
        kubernetes_upgrades: true,
    };
    only_allowed_requests(&operator, &placement).await;
    assert_eq!(fleet_process.terminate(), Some(0));
    scene.end().await;
}

/// The kstatus conditions (`Ready`, `Reconciling`, `Stalled`) and their statuses.
fn kstatus(status: &TalosOperationStatus) -> [(&'static str, &str); 3] {
    ["Ready", "Reconciling", "Stalled"].map(|type_| {
        let condition = status.conditions.iter().find(|c| c.type_ == type_);
        (type_, condition.map_or("absent", |c| c.status.as_str()))
    })
}

/// The variable naming helm (`scripts/helm.sh`).
const HELM_VAR: &str = "ICHOR_TEST_HELM";

/// The variable naming the operator's image, an OCI archive (`scripts/image.sh build`).
const IMAGE_VAR: &str = "ICHOR_TEST_OPERATOR_IMAGE";

/// An OCI archive unpacked: its reference, its configuration and its root filesystem.
struct Image {
    reference: String,
    config: serde_json::Value,
    root: PathBuf,
}

impl Image {
    /// The archive `$ICHOR_TEST_OPERATOR_IMAGE`, unpacked into `dir` as a runtime would:
    /// the index's manifest, its config, its layers in order.
    fn unpack(dir: &Path) -> Self {
        let archive = match std::env::var_os(IMAGE_VAR) {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => panic!(
                "this test needs the operator's image: {IMAGE_VAR}=<OCI archive> is not set (build it with \
                 `bash scripts/image.sh build target/debug/ichor-operator FILE`; `bash .ci/run` does it)"
            ),
        };
        let layout = dir.join("oci");
        let root = dir.join("rootfs");
        std::fs::create_dir_all(&layout).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        untar(&archive, &layout);
        let json = |path: PathBuf| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
        };
        let blob = |digest: &serde_json::Value| {
            let digest = digest.as_str().unwrap();
            layout.join("blobs/sha256").join(digest.strip_prefix("sha256:").unwrap())
        };
        let index = json(layout.join("index.json"));
        let entry = &index["manifests"][0];
        let reference = entry["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap().to_owned();
        let manifest = json(blob(&entry["digest"]));
        let config = json(blob(&manifest["config"]["digest"]));
        for layer in manifest["layers"].as_array().unwrap() {
            untar(&blob(&layer["digest"]), &root);
        }
        Self { reference, config, root }
    }

    /// The image's entrypoint, run through the image's own loader and libraries (no file
    /// of the host's is loaded).
    fn command(&self) -> Command {
        let entrypoint: Vec<&str> =
            self.config["config"]["Entrypoint"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
        let loader = ["lib64/ld-linux-x86-64.so.2", "lib/ld-linux-aarch64.so.1"]
            .map(|l| self.root.join(l))
            .into_iter()
            .find(|l| l.exists())
            .expect("the image holds the loader");
        let libraries = ["lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "usr/lib/x86_64-linux-gnu", "usr/lib"]
            .map(|l| self.root.join(l).display().to_string())
            .join(":");
        let mut command = Command::new(loader);
        command.arg("--library-path").arg(libraries).arg(self.root.join(entrypoint[0].trim_start_matches('/')));
        command.args(&entrypoint[1..]);
        command
    }
}

/// `archive` (a tar, compressed or not) unpacked into `dir`.
fn untar(archive: &Path, dir: &Path) {
    let status = Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(dir).status().unwrap();
    assert!(status.success(), "tar -xf {}: {status}", archive.display());
}

/// The commands of the README's install section, continuation lines joined.
fn readme_install_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let section = readme.split("\n## Install\n").nth(1).expect("the README has an Install section");
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("a sh block");
    block.replace("\\\n", " ").lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

/// The README's install section as written, on an API server of the test's own (the one
/// the other tests share holds their grants): `helm install` of the chart, the grant of
/// the cluster's namespace; the operator is the image's own binary, run with the token of
/// the ServiceAccount the chart made, as its pod would. Then nothing but a TalosCluster
/// with `upgrades: Automatic` (its machines discovered from the Nodes) two minor lines
/// ahead of a 3 + 2 fleet: it goes there in two operations the operator makes; then a
/// change of its `kubernetesVersion` with `kubectl patch` completes too. Two replicas run,
/// and the leader is killed in the middle of the first hop; the cluster's webhook receiver
/// gets each operation's notices once. Every request was one the chart grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the operator's image, helm and the Kubernetes test server's binaries: ICHOR_TEST_OPERATOR_IMAGE, \
            ICHOR_TEST_HELM, ICHOR_TEST_KUBECONFIG (bash .ci/run makes all three)"]
async fn installed_as_the_readme_says_the_images_operator_upgrades_two_minors_then_kubernetes_by_a_field() {
    let work = tempfile::tempdir().unwrap();
    let image = Image::unpack(work.path());
    assert_eq!(image.config["config"]["User"], "65532:65532", "it runs as nonroot");
    let version = image.command().arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("ichor-operator {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(image.reference.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))), "{}", image.reference);

    let helm = std::env::var(HELM_VAR).unwrap_or_else(|_| {
        panic!("this test needs helm: {HELM_VAR}=<path> (bash scripts/helm.sh build; bash scripts/helm.sh env)")
    });
    let _ = ichor_testkit::kube::kubeconfig(); // the binaries are built
    let server = OwnServer::start();
    let commands = readme_install_commands();
    let install = commands.iter().find(|c| c.starts_with("helm install ")).expect("a helm install line");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(&helm)
        .args(install.split_whitespace().skip(1))
        .current_dir(&chart)
        .env("KUBECONFIG", server.kubeconfig())
        .env("HELM_CACHE_HOME", work.path().join("helm/cache"))
        .env("HELM_CONFIG_HOME", work.path().join("helm/config"))
        .env("HELM_DATA_HOME", work.path().join("helm/data"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{install}: {said}");
    assert!(said.contains("STATUS: deployed") && said.contains("kubectl create rolebinding"), "{said}");

    // The CRDs came from the chart; the scene's namespace is the cluster's.
    let scene = Scene::on(server.kubeconfig(), "e2e-helm").await;
    let admin = scene.admin().to_path_buf();
    let grant = commands.iter().find(|c| c.starts_with("kubectl create rolebinding")).expect("the grant line");
    let grant = grant.replace("--namespace prod", &format!("--namespace {}", scene.ns.name));
    run(&admin, &grant.split_whitespace().skip(1).collect::<Vec<_>>());

    // A webhook receiver, its URL in a Secret as a person would keep it.
    let receiver = Receiver::start().await;
    receiver.set_up("/hook", true);
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: receivers\nstringData:\n  webhook: {}\n",
        receiver.url("/hook")
    );
    let secret_file = scene.dir.path().join("receivers.yaml");
    std::fs::write(&secret_file, &secret).unwrap();
    run(&admin, &["apply", "-n", &scene.ns.name, "-f", &secret_file.display().to_string()]);
    let cluster = format!(
        "apiVersion: ichor.dev/v1alpha1\nkind: TalosCluster\nmetadata:\n  name: {}\nspec:\n  talosVersion: {}\n  \
         kubernetesVersion: {}\n  platform: metal\n  talosconfigSecret: {}-talosconfig\n  discovery: Nodes\n  \
         upgrades: Automatic\n  nodeSelector:\n    {}: {}\n  notifications:\n    sinks:\n      - name: hook\n        \
         type: Webhook\n        urlSecret: {{ name: receivers, key: webhook }}\n",
        fleet::CLUSTER,
        fleet::TARGET,
        fleet::KUBERNETES,
        fleet::CLUSTER,
        fleet::FLEET_LABEL,
        scene.ns.name
    );
    let cluster_file = scene.dir.path().join("cluster.yaml");
    std::fs::write(&cluster_file, &cluster).unwrap();
    run(&admin, &["apply", "-n", &scene.ns.name, "-f", &cluster_file.display().to_string()]);
    let mut fleet_process = scene.fleet("3+2", &["--no-machines", "--fleet-only", "--fleet-from", desired_test::FROM]);
    eventually("the fleet's 5 Nodes", || async { scene.fleet_nodes().await.len() == 5 }).await;

    let kubeconfig = scene
        .ns
        .service_account_kubeconfig_in(rbac::NAMESPACE, rbac::NAME, &scene.dir.path().join("operator.kubeconfig"))
        .await;
    let snapshots = scene.snapshot_dir();
    let replica = |name: &str| {
        Process::start_command(
            name,
            image.command(),
            scene.dir.path(),
            &kubeconfig,
            &["--etcd-snapshot-dir", &snapshots, "--identity", name],
            &[("POD_NAMESPACE", rbac::NAMESPACE)],
        )
    };
    let first = replica("replica-a");
    eventually("replica-a leads", || async { leader(&first).await }).await;
    let operator = replica("replica-b");
    let placement = rbac::Placement {
        operator_namespace: rbac::NAMESPACE,
        cluster_namespaces: &[&scene.ns.name],
        kubernetes_upgrades: true,
    };
    // The leader killed once two machines of the first hop converged.
    let hop = ichor_operator::desired::operation_name(OperationKind::Talos, desired_test::HOP);
    let killer = {
        let ops = Api::<TalosOperation>::namespaced(scene.ns.client.clone(), &scene.ns.name);
        let (hop, namespace) = (hop.clone(), scene.ns.name.clone());
        let mut first = first;
        tokio::spawn(async move {
            eventually("two machines of the first hop converged", || async {
                let status = ops.get_opt(&hop).await.ok().flatten().and_then(|o| o.status);
                status.and_then(|s| s.machines).is_some_and(|m| m.converged >= 2)
            })
            .await;
            let placement = rbac::Placement {
                operator_namespace: rbac::NAMESPACE,
                cluster_namespaces: &[&namespace],
                kubernetes_upgrades: true,
            };
            only_allowed_requests(&first, &placement).await;
            first.kill();
            first
        })
    };
    desired_test::made_and_completed(&scene, &hop).await;
    let first = killer.await.unwrap();
    assert!(leader(&operator).await, "replica-b leads once replica-a is dead");
    let last = ichor_operator::desired::operation_name(OperationKind::Talos, fleet::TARGET);
    desired_test::made_and_completed(&scene, &last).await;
    assert!(all_on_target(&scene.fleet_nodes().await), "every Node on {}", fleet::TARGET);

    let patch = format!(r#"{{"spec":{{"kubernetesVersion":"{KUBERNETES_TARGET}"}}}}"#);
    run(&admin, &["patch", "taloscluster", fleet::CLUSTER, "-n", &scene.ns.name, "--type", "merge", "-p", &patch]);
    let kubernetes = ichor_operator::desired::operation_name(OperationKind::Kubernetes, KUBERNETES_TARGET);
    desired_test::made_and_completed(&scene, &kubernetes).await;
    for node in scene.fleet_nodes().await {
        let kubelet = node.status.and_then(|s| s.node_info).map(|i| i.kubelet_version).unwrap_or_default();
        assert_eq!(kubelet, format!("v{KUBERNETES_TARGET}"));
    }
    let table = run(&admin, &["get", "taloscluster", fleet::CLUSTER, "-n", &scene.ns.name]);
    assert!(table.lines().nth(1).is_some_and(|row| row.contains("UpToDate")), "{table}");
    // Each operation's start and completion told once, across the leader's death.
    let names = [hop.as_str(), last.as_str(), kubernetes.as_str()];
    eventually("every notice delivered", || async {
        let mut all = Vec::new();
        for name in names {
            all.extend(records(&scene, name).await);
        }
        all.iter().filter(|r| r.2 == "Completed").count() == 3 && all.iter().all(|r| r.3 == "Delivered")
    })
    .await;
    let mut owed = Vec::new();
    for name in names {
        let events: Vec<String> = records(&scene, name).await.into_iter().map(|r| r.2).collect();
        assert_eq!(events.first().map(String::as_str), Some("Started"), "{name}: {events:?}");
        assert_eq!(events.last().map(String::as_str), Some("Completed"), "{name}: {events:?}");
        owed.extend(records(&scene, name).await.into_iter().map(|r| r.0));
    }
    let mut got = receiver.ids("/hook");
    got.sort();
    owed.sort();
    assert_eq!(got, owed, "each notice once");
    let url = receiver.url("");
    assert!(!first.log_lines().iter().chain(&operator.log_lines()).any(|l| l.contains(&url)), "a URL logged");
    only_allowed_requests(&operator, &placement).await;
    // Manual again before the scene's end deletes the operations: nothing is made again.
    run(
        &admin,
        &[
            "patch",
            "taloscluster",
            fleet::CLUSTER,
            "-n",
            &scene.ns.name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"upgrades":"Manual"}}"#,
        ],
    );
    assert_eq!(fleet_process.terminate(), Some(0));
    scene.end().await;
}
