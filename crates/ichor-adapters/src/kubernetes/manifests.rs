//! The manifests generated from the code: the CRDs of [`crate::kubernetes::crd`]. CI checks that
//! the committed `deploy/` files are exactly what these functions produce (regenerate with
//! `ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-adapters --test suite manifests`).

use kube::CustomResourceExt;

use super::crd::{TalosCluster, TalosMachine, TalosOperation, TalosStorage};

/// `deploy/crds.yaml`: the four CustomResourceDefinitions, one YAML document each.
///
/// # Panics
/// Never in practice: the definitions are plain data that always serialize.
#[must_use]
pub fn crds_yaml() -> String {
    let crds = [TalosCluster::crd(), TalosMachine::crd(), TalosOperation::crd(), TalosStorage::crd()];
    let docs: Vec<String> =
        crds.iter().map(|crd| serde_saphyr::to_string(crd).expect("a CRD serializes to YAML")).collect();
    format!(
        "# Generated from crates/ichor-adapters/src/kubernetes/crd.rs; do not edit.\n# Regenerate: ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-adapters --test suite manifests\n---\n{}",
        docs.join("---\n")
    )
}
