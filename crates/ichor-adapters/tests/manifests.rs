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
