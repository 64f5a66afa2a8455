//! The committed `deploy/operator.yaml` is exactly what the code generates. Run with
//! `ICHOR_WRITE_MANIFESTS=1` to rewrite it.

use std::path::PathBuf;

#[test]
fn the_committed_operator_manifests_are_the_generated_ones() {
    let generated = ichor_operator::rbac::operator_yaml();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator.yaml");
    if std::env::var_os("ICHOR_WRITE_MANIFESTS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "deploy/operator.yaml differs from what the code generates; regenerate with \
         ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests"
    );
}

#[test]
fn the_manifests_name_the_role_without_wildcards_and_two_replicas() {
    let yaml = ichor_operator::rbac::operator_yaml();
    assert!(!yaml.contains('*'), "no wildcard anywhere:\n{yaml}");
    assert!(yaml.contains("kind: ClusterRole\n") && yaml.contains("kind: Deployment\n"));
    assert!(yaml.contains("replicas: 2"), "{yaml}");
}
