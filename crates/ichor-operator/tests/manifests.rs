//! The committed `deploy/operator.yaml` and the Kubernetes-upgrade component are exactly
//! what the code generates. Run with
//! `ICHOR_WRITE_MANIFESTS=1` to rewrite it.

use std::path::PathBuf;

#[test]
fn the_committed_operator_manifests_are_the_generated_ones() {
    let mut files = vec![
        ("deploy/operator.yaml".to_owned(), ichor_operator::rbac::operator_yaml()),
        (
            "deploy/components/kubernetes-upgrades/kubernetes-upgrades.yaml".to_owned(),
            ichor_operator::rbac::kubernetes_upgrades_yaml(),
        ),
    ];
    // The chart, generated from the same tables (every file of deploy/chart/ is one).
    let chart = ichor_operator::chart::files();
    files.extend(chart.iter().map(|(path, text)| (format!("deploy/chart/{path}"), text.clone())));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/chart");
    if std::env::var_os("ICHOR_WRITE_MANIFESTS").is_none() {
        for entry in walk(&root) {
            let relative = entry.strip_prefix(&root).unwrap().display().to_string();
            assert!(
                chart.iter().any(|(path, _)| *path == relative),
                "deploy/chart/{relative} is not generated: remove it, or generate it in chart.rs"
            );
        }
    }
    for (file, generated) in files {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(&file);
        if std::env::var_os("ICHOR_WRITE_MANIFESTS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{file} differs from what the code generates; regenerate with \
             ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests"
        );
    }
}

/// The files under `dir`, at any depth.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}

/// The component is one kustomize takes (`kind: Component`, its one resource the generated
/// file), and the base lists it, on one line a Talos-only team removes.
#[test]
fn the_kubernetes_upgrade_grants_are_a_kustomize_component_the_base_lists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let component: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root.join("components/kubernetes-upgrades/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(component["kind"], "Component");
    assert_eq!(component["resources"], serde_json::json!(["kubernetes-upgrades.yaml"]));
    let base: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(root.join("kustomization.yaml")).unwrap()).unwrap();
    assert_eq!(base["components"], serde_json::json!(["components/kubernetes-upgrades"]));
}

#[test]
fn the_manifests_name_the_role_without_wildcards_and_two_replicas() {
    let yaml = ichor_operator::rbac::operator_yaml();
    assert!(!yaml.contains('*'), "no wildcard anywhere:\n{yaml}");
    assert!(yaml.contains("kind: ClusterRole\n") && yaml.contains("kind: StatefulSet\n"));
    assert!(yaml.contains("replicas: 2"), "{yaml}");
}

/// The objects of the generated manifests, as JSON.
fn documents() -> Vec<serde_json::Value> {
    let yaml = ichor_operator::rbac::operator_yaml();
    yaml.split("\n---\n")
        .map(|doc| doc.lines().filter(|l| !l.starts_with('#') && *l != "---").collect::<Vec<_>>().join("\n"))
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str(&doc).unwrap())
        .collect()
}

fn kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn as_shipped_the_operator_keeps_etcd_snapshots_on_a_volume_of_each_replica() {
    let docs = documents();
    let set = kind(&docs, "StatefulSet");
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    let dir = args.iter().position(|a| *a == "--etcd-snapshot-dir").map(|i| args[i + 1]);
    assert_eq!(dir, Some(ichor_operator::rbac::SNAPSHOT_DIR), "{args:?}");
    let mount = &container["volumeMounts"][0];
    assert_eq!(mount["mountPath"], ichor_operator::rbac::SNAPSHOT_DIR);
    assert_eq!(mount["name"], ichor_operator::rbac::SNAPSHOT_VOLUME);
    let claim = &set["spec"]["volumeClaimTemplates"][0];
    assert_eq!(claim["metadata"]["name"], ichor_operator::rbac::SNAPSHOT_VOLUME);
    assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteOnce", "a claim any default StorageClass serves");
    // The non-root user can write the volume.
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["fsGroup"], pod["securityContext"]["runAsUser"]);
}

#[test]
fn the_replicas_run_apart_unprivileged_and_one_always_stays_up() {
    let docs = documents();
    let pod = &kind(&docs, "StatefulSet")["spec"]["template"]["spec"];
    let term = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["containers"][0]["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(
        pod["tolerations"].as_array().unwrap().iter().any(|t| t["key"] == "node-role.kubernetes.io/control-plane"),
        "it may run on control planes"
    );
    let budget = kind(&docs, "PodDisruptionBudget");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(budget["spec"]["selector"], pod_labels_selector(&docs));
}

fn pod_labels_selector(docs: &[serde_json::Value]) -> serde_json::Value {
    kind(docs, "StatefulSet")["spec"]["selector"].clone()
}

/// Every metric the shipped Grafana dashboard queries is one the operator exports (the
/// table of `crate::metrics`, each row of which its unit tests read back from `/metrics`),
/// and the pods carry the scrape annotations its Prometheus job keeps.
#[test]
fn the_dashboard_queries_only_metrics_the_operator_exports_and_the_pods_are_scraped() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("../../deploy/monitoring/grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let documented: String = std::fs::read_to_string(root.join("src/metrics.rs"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("//! | `ichor_"))
        .collect();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let names = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|t| t.starts_with("ichor_"))
                .map(|t| t.trim_end_matches("_bucket").trim_end_matches("_total"));
            for name in names {
                assert!(documented.contains(&format!("`{name}")), "{name} ({expr}) is not an exported metric");
                queried += 1;
            }
        }
    }
    assert!(queried >= 9, "{queried}");
    let yaml = ichor_operator::rbac::operator_yaml();
    for annotation in ["prometheus.io/scrape: \"true\"", "prometheus.io/port: \"8080\"", "prometheus.io/path: /metrics"]
    {
        assert!(yaml.contains(annotation), "{annotation}:\n{yaml}");
    }
}

/// The sample cluster carries the grant of its namespace, the one the code makes
/// (`rbac::cluster_namespace_binding`), so that applying it as shipped is enough.
#[test]
fn the_sample_cluster_grants_the_operator_its_namespace_as_the_code_does() {
    use ichor_operator::rbac;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/cluster.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let binding: serde_json::Value = text
        .split("\n---\n")
        .map(|doc| doc.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n"))
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(&doc).unwrap())
        .find(|doc| doc["kind"] == "RoleBinding")
        .expect("a RoleBinding in deploy/examples/cluster.yaml");
    let made = serde_json::to_value(rbac::cluster_namespace_binding("prod", rbac::NAMESPACE, rbac::NAME)).unwrap();
    assert_eq!(binding["metadata"]["name"], made["metadata"]["name"]);
    assert_eq!(binding["roleRef"], made["roleRef"]);
    assert_eq!(binding["subjects"], made["subjects"]);
}

/// The README's quick-start TalosCluster, as written: it reads as a TalosCluster, its
/// window expands, and its gate compiles.
#[test]
fn the_readme_quick_start_cluster_reads_with_its_window_and_its_gate() {
    let readme = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let block = readme
        .split("<!-- quick-start-cluster -->\n```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README's quick-start TalosCluster block");
    let cluster: ichor_adapters::kubernetes::crd::TalosCluster = serde_saphyr::from_str(block).unwrap();
    let maintenance = cluster.spec.maintenance.as_ref().expect("a window");
    let now = ichor_upgrade_core::Timestamp::from_unix_secs(1_796_099_400);
    let calendar = ichor_executor::calendar::calendar(maintenance, now).unwrap();
    assert!(calendar.spans().len() >= 8, "two weekend mornings a week for the horizon");
    let gates = cluster.spec.gates.as_deref().expect("a gate");
    assert_eq!(gates.len(), 1);
    ichor_executor::health_gates::compile(gates).unwrap();
    let rule = &ichor_upgrade_core::gate::rules(gates).unwrap()[0];
    assert_eq!(rule.phase, ichor_upgrade_core::gate::GatePhase::AfterMachine);
}

/// `deploy/monitoring/prometheus-rule.yaml`, the Prometheus Operator's PrometheusRule:
/// the groups of `ichor-rules.yaml` (Prometheus's own rule file, which `promtool` tests)
/// under `spec:`, generated from it so that the two never part.
fn prometheus_rule(rules: &str) -> String {
    let mut out = String::from(
        "# Generated from ichor-rules.yaml (the same groups, for the Prometheus Operator): edit that file,\n\
         # then ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests.\n\
         # Scrape the operator with honor_labels: true (prometheus-scrape.yaml does): see ichor-rules.yaml.\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  name: ichor-operator\n  namespace: ichor-system\n\
         \x20 labels:\n    app.kubernetes.io/name: ichor-operator\n\
         spec:\n",
    );
    for line in rules.lines().skip_while(|l| l.starts_with('#')) {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The alert rules read only metrics the operator exports (the table of
/// `crate::metrics`), only phases and reasons the engine writes, and the PrometheusRule is
/// the rule file's groups; the scrape job keeps the operations' own `namespace` label.
#[test]
fn the_alert_rules_read_only_what_the_operator_exports_and_ship_as_a_prometheus_rule() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rules = std::fs::read_to_string(root.join("deploy/monitoring/ichor-rules.yaml")).unwrap();
    let path = root.join("deploy/monitoring/prometheus-rule.yaml");
    let generated = prometheus_rule(&rules);
    if std::env::var_os("ICHOR_WRITE_MANIFESTS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).unwrap_or_default() == generated,
        "deploy/monitoring/prometheus-rule.yaml differs from ichor-rules.yaml's groups; regenerate with \
         ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests"
    );
    let documented: String = std::fs::read_to_string(root.join("crates/ichor-operator/src/metrics.rs"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("//! | `ichor_"))
        .collect();
    let status = std::fs::read_to_string(root.join("crates/ichor-upgrade-core/src/status.rs")).unwrap();
    let mut metrics = 0;
    for expr in &exprs(&rules) {
        for name in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|t| t.starts_with("ichor_")) {
            assert!(documented.contains(&format!("`{name}")), "{name} ({expr}) is not an exported metric");
            metrics += 1;
        }
        for label in ["phase", "reason"] {
            for value in label_values(expr, label) {
                assert!(
                    status.contains(&format!("\"{value}\"")),
                    "{label} {value:?} ({expr}) is not one the engine writes"
                );
            }
        }
    }
    assert!(metrics >= 6, "{metrics}");
    for alert in ["IchorOperationPaused", "IchorOperationStuckWaiting", "IchorMachineFailed", "IchorNoLeader"] {
        assert!(rules.contains(&format!("- alert: {alert}\n")), "{alert}");
    }
    let scrape = std::fs::read_to_string(root.join("deploy/monitoring/prometheus-scrape.yaml")).unwrap();
    assert!(scrape.contains("\n  honor_labels: true\n"), "{scrape}");
}

/// Each rule's `expr`, folded onto one line (`expr: >-` and the lines indented under it).
fn exprs(rules: &str) -> Vec<String> {
    let mut exprs = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(at) = line.find("expr: ") else { continue };
        let first = &line[at + "expr: ".len()..];
        if first != ">-" {
            exprs.push(first.to_owned());
            continue;
        }
        let mut folded = Vec::new();
        while let Some(next) = lines.next_if(|l| l.len() - l.trim_start().len() > at) {
            folded.push(next.trim());
        }
        exprs.push(folded.join(" "));
    }
    exprs
}

/// The values a selector in `expr` matches `label` with (`label="A"`, `label!~"A|B"`).
fn label_values(expr: &str, label: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find(label) {
        rest = &rest[at + label.len()..];
        let after = rest.trim_start_matches(['=', '!', '~']);
        if after.len() == rest.len() || !after.starts_with('"') {
            continue;
        }
        let quoted = &after[1..];
        let end = quoted.find('"').unwrap();
        values.extend(quoted[..end].split('|').map(str::to_owned));
        rest = &quoted[end..];
    }
    values
}
