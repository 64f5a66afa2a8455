//! The Helm chart (`deploy/chart/`) as helm takes it: the real helm, built from its Go
//! module (`ICHOR_TEST_HELM`: `bash scripts/helm.sh build`, then `bash scripts/helm.sh env`)
//! lints it, renders it, and refuses bad values; what it renders is the kustomize base
//! with the default values, and the real API server takes it (`ICHOR_TEST_KUBECONFIG`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ichor_testkit::kube::TestNamespace;

const HELM_VAR: &str = "ICHOR_TEST_HELM";

fn helm() -> Command {
    match std::env::var_os(HELM_VAR) {
        Some(path) if !path.is_empty() => Command::new(path),
        _ => panic!(
            "this test needs helm: {HELM_VAR}=<path> is not set (build it with `bash scripts/helm.sh build`, \
             then `bash scripts/helm.sh env` prints the line; `bash .ci/run` does it all)"
        ),
    }
}

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/chart")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `helm template` of the chart into `namespace` with `sets` (`key=value`); its output.
fn template(namespace: &str, sets: &[&str]) -> Output {
    let mut command = helm();
    command.args(["template", "ichor"]).arg(chart()).args(["--namespace", namespace, "--include-crds"]);
    for set in sets {
        command.args(["--set", set]);
    }
    command.output().unwrap()
}

/// The objects `helm template` rendered, by kind and name.
fn rendered(namespace: &str, sets: &[&str]) -> BTreeMap<(String, String), serde_json::Value> {
    let output = template(namespace, sets);
    assert!(output.status.success(), "helm template {sets:?}: {}", text(&output.stderr));
    objects(&text(&output.stdout))
}

/// The YAML documents of `yaml`, by kind and name.
fn objects(yaml: &str) -> BTreeMap<(String, String), serde_json::Value> {
    yaml.split("\n---")
        .map(|doc| doc.lines().filter(|l| !l.starts_with('#') && !l.starts_with("---")).collect::<Vec<_>>().join("\n"))
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(&doc).unwrap_or_else(|e| panic!("{e}:\n{doc}")))
        .map(|o| ((o["kind"].as_str().unwrap().to_owned(), o["metadata"]["name"].as_str().unwrap().to_owned()), o))
        .collect()
}

#[test]
#[ignore = "needs helm: ICHOR_TEST_HELM (bash scripts/helm.sh build)"]
fn helm_lints_the_chart_with_no_error() {
    let output = helm().arg("lint").arg(chart()).arg("--strict").output().unwrap();
    let said = text(&output.stdout) + &text(&output.stderr);
    assert!(output.status.success(), "helm lint --strict: {said}");
    assert!(said.contains("1 chart(s) linted, 0 chart(s) failed"), "{said}");
}

/// With the default values, into `ichor-system`: the objects of `deploy/operator.yaml` (less
/// its Namespace), of the Kubernetes-upgrade component and of `deploy/crds.yaml`, field for
/// field.
#[test]
#[ignore = "needs helm: ICHOR_TEST_HELM (bash scripts/helm.sh build)"]
fn with_its_default_values_the_chart_renders_the_kustomize_base() {
    let chart = rendered(ichor_operator::rbac::NAMESPACE, &[]);
    let mut base = objects(&ichor_operator::rbac::operator_yaml());
    base.retain(|(kind, _), _| kind != "Namespace");
    base.extend(objects(&ichor_operator::rbac::kubernetes_upgrades_yaml()));
    base.extend(objects(&ichor_adapters::kubernetes::manifests::crds_yaml()));
    assert_eq!(chart.keys().collect::<Vec<_>>(), base.keys().collect::<Vec<_>>());
    for (key, object) in &base {
        assert_eq!(&chart[key], object, "{key:?}");
    }
}

fn stateful_set(objects: &BTreeMap<(String, String), serde_json::Value>) -> &serde_json::Value {
    &objects[&("StatefulSet".to_owned(), ichor_operator::rbac::NAME.to_owned())]
}

/// Each value lands where it says: the image, the replicas, the snapshot volume's size and
/// class, an S3 store with its Secret, the node selection, the Kubernetes-upgrade grants off.
#[test]
#[ignore = "needs helm: ICHOR_TEST_HELM (bash scripts/helm.sh build)"]
fn the_values_set_the_image_replicas_store_placement_and_grants() {
    let volume = rendered(
        "ops",
        &[
            "image.repository=registry.example/ichor",
            "image.tag=1.2.3",
            "replicas=3",
            "etcdSnapshots.volume.size=20Gi",
            "etcdSnapshots.volume.storageClassName=fast",
            "nodeSelector.pool=infra",
        ],
    );
    let set = stateful_set(&volume);
    assert_eq!(set["metadata"]["namespace"], "ops");
    assert_eq!(set["spec"]["replicas"], 3);
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "registry.example/ichor:1.2.3");
    assert_eq!(pod["nodeSelector"], serde_json::json!({ "pool": "infra" }));
    let claim = &set["spec"]["volumeClaimTemplates"][0]["spec"];
    assert_eq!(claim["resources"]["requests"]["storage"], "20Gi");
    assert_eq!(claim["storageClassName"], "fast");
    // The binding names the release's ServiceAccount, and the grants are on by default.
    let binding = &volume[&("ClusterRoleBinding".to_owned(), ichor_operator::rbac::NAME.to_owned())];
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    assert!(volume.contains_key(&("ClusterRole".to_owned(), ichor_operator::rbac::KUBERNETES_ROLE.to_owned())));

    let s3 = rendered(
        "ops",
        &[
            "etcdSnapshots.store=s3",
            "etcdSnapshots.s3.bucket=snapshots",
            "etcdSnapshots.s3.secretName=ichor-s3",
            "etcdSnapshots.s3.endpoint=https://s3.example",
            "kubernetesUpgrades.enabled=false",
        ],
    );
    let set = stateful_set(&s3);
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    let after = |flag: &str| args.iter().position(|a| *a == flag).map(|i| args[i + 1]);
    assert_eq!(after("--etcd-snapshot-s3-bucket"), Some("snapshots"), "{args:?}");
    assert_eq!(after("--etcd-snapshot-s3-endpoint"), Some("https://s3.example"), "{args:?}");
    assert_eq!(after("--etcd-snapshot-s3-region"), Some("us-east-1"), "{args:?}");
    assert!(!args.contains(&"--etcd-snapshot-dir"), "{args:?}");
    assert!(set["spec"].get("volumeClaimTemplates").is_none() && container.get("volumeMounts").is_none());
    for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        let env = container["env"].as_array().unwrap().iter().find(|e| e["name"] == key).expect(key);
        assert_eq!(env["valueFrom"]["secretKeyRef"], serde_json::json!({ "name": "ichor-s3", "key": key }));
    }
    assert!(!s3.keys().any(|(_, name)| name == ichor_operator::rbac::KUBERNETES_ROLE), "the grants are off");
    // No endpoint: the flag is left out (AWS, from the region), not given empty.
    let aws =
        rendered("ops", &["etcdSnapshots.store=s3", "etcdSnapshots.s3.bucket=b", "etcdSnapshots.s3.secretName=s"]);
    let args = stateful_set(&aws)["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(!args.contains("endpoint"), "{args}");
}

/// A value that would make a broken install is refused, naming it, and nothing is rendered.
#[test]
#[ignore = "needs helm: ICHOR_TEST_HELM (bash scripts/helm.sh build)"]
fn bad_values_are_refused_naming_the_value_and_nothing_is_rendered() {
    let cases: [(&[&str], &str); 5] = [
        (&["etcdSnapshots.store=nfs"], "/etcdSnapshots/store"),
        (&["etcdSnapshots.store=s3", "etcdSnapshots.s3.secretName=s"], "/etcdSnapshots/s3/bucket"),
        (&["etcdSnapshots.store=s3", "etcdSnapshots.s3.bucket=b"], "/etcdSnapshots/s3/secretName"),
        (&["replica=3"], "'replica'"),
        (&["etcdSnapshots.volume.size=lots"], "/etcdSnapshots/volume/size"),
    ];
    for (sets, named) in cases {
        let output = template("ops", sets);
        let said = text(&output.stderr);
        assert!(!output.status.success(), "{sets:?} was rendered");
        assert!(said.contains(named), "{sets:?}: the refusal names {named}: {said}");
        assert!(output.stdout.is_empty(), "{sets:?}: nothing rendered");
    }
}

/// The kubectl beside the test server's kubeconfig, else the one on `PATH`.
fn kubectl(kubeconfig: &Path) -> Command {
    let beside = kubeconfig.parent().map(|d| d.join("kubectl")).filter(|k| k.exists());
    let mut command = Command::new(beside.unwrap_or_else(|| PathBuf::from("kubectl")));
    command.env("KUBECONFIG", kubeconfig);
    command
}

/// `helm template | kubectl apply --dry-run=server -f -`, as the check and a
/// GitOps pipeline run it: the server takes every object, for a volume store and an S3 one.
#[tokio::test]
#[ignore = "needs helm and a Kubernetes API server: ICHOR_TEST_HELM, ICHOR_TEST_KUBECONFIG"]
async fn what_the_chart_renders_the_api_server_takes() {
    let _ = helm();
    let ns = TestNamespace::create("chart").await;
    let s3 = ["etcdSnapshots.store=s3", "etcdSnapshots.s3.bucket=b", "etcdSnapshots.s3.secretName=s"];
    for sets in [&[][..], &s3[..]] {
        let output = template(&ns.name, sets);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let mut apply = kubectl(&ns.kubeconfig)
            .args(["apply", "--dry-run=server", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        apply.stdin.take().unwrap().write_all(&output.stdout).unwrap();
        let applied = apply.wait_with_output().unwrap();
        let said = text(&applied.stdout);
        assert!(applied.status.success(), "kubectl apply {sets:?}: {said}{}", text(&applied.stderr));
        for object in ["statefulset.apps/ichor-operator", "serviceaccount/ichor-operator", "poddisruptionbudget"] {
            assert!(said.contains(object) && said.contains("(server dry run)"), "{object}: {said}");
        }
    }
    ns.delete().await;
}
