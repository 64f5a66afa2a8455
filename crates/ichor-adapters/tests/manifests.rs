//! The committed manifests in `deploy/` are exactly what the code generates. Run with
//! `ICHOR_WRITE_MANIFESTS=1` to rewrite them.

use std::path::PathBuf;

fn check(file: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file);
    if std::env::var_os("ICHOR_WRITE_MANIFESTS").is_some() {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "deploy/{file} differs from what the code generates; regenerate with \
         ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-adapters --test suite manifests"
    );
}

#[test]
fn the_committed_crds_are_the_generated_ones() {
    check("crds.yaml", &ichor_adapters::kubernetes::manifests::crds_yaml());
}

/// Issue 55 (papercuts): a `u64` field's `format: uint64` made the API server warn at
/// every apply of the CRDs. Every format in them is one Kubernetes knows.
#[test]
fn every_format_in_the_crds_is_one_kubernetes_knows() {
    use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine, TalosOperation, TalosStorage};
    use kube::CustomResourceExt;
    const KNOWN: [&str; 12] = [
        "int32",
        "int64",
        "float",
        "double",
        "byte",
        "date",
        "date-time",
        "duration",
        "password",
        "uri",
        "email",
        "uuid",
    ];
    fn formats(value: &serde_json::Value, path: &str, found: &mut Vec<(String, String)>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(format) = map.get("format").and_then(serde_json::Value::as_str) {
                    found.push((path.to_owned(), format.to_owned()));
                }
                for (key, child) in map {
                    formats(child, &format!("{path}.{key}"), found);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|child| formats(child, path, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for crd in [TalosCluster::crd(), TalosMachine::crd(), TalosOperation::crd(), TalosStorage::crd()] {
        let crd = serde_json::to_value(&crd).unwrap();
        formats(&crd, crd["spec"]["names"]["kind"].as_str().unwrap(), &mut found);
    }
    assert!(found.iter().any(|(_, f)| f == "int64"), "the u64 fields say int64: {found:?}");
    let unknown: Vec<_> = found.iter().filter(|(_, f)| !KNOWN.contains(&f.as_str())).collect();
    assert!(unknown.is_empty(), "formats Kubernetes does not know: {unknown:?}");
    assert!(!ichor_adapters::kubernetes::manifests::crds_yaml().contains("uint"), "the committed form too");
}

/// Every field of every spec carries its own documentation, the one `kubectl explain`
/// shows: not its type's (an enum's doc once replaced the field's, so `kubectl explain
/// talosoperation.spec.preflight` said only "`spec.preflight`.").
#[test]
fn every_spec_field_is_documented_by_its_own_doc_comment() {
    use ichor_adapters::kubernetes::crd::{TalosCluster, TalosMachine, TalosOperation, TalosStorage};
    use kube::CustomResourceExt;
    let crds = [TalosCluster::crd(), TalosMachine::crd(), TalosOperation::crd(), TalosStorage::crd()];
    let mut seen = 0;
    for crd in crds {
        let crd = serde_json::to_value(&crd).unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_owned();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for (field, schema) in spec.as_object().unwrap() {
            let description = schema["description"].as_str().unwrap_or_default();
            assert!(description.len() > 20, "{kind}.spec.{field}: {description:?}");
            assert!(!description.starts_with("`spec."), "{kind}.spec.{field} shows its type's doc: {description:?}");
            seen += 1;
        }
    }
    assert!(seen >= 15, "{seen} fields");
    let operation = serde_json::to_value(TalosOperation::crd()).unwrap();
    let preflight =
        &operation["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["preflight"];
    assert!(preflight["description"].as_str().unwrap().contains("preflight gate"), "{preflight}");
}
