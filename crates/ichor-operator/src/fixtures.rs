//! Objects the unit tests of several modules build the same way.

use ichor_adapters::kubernetes::crd::{
    Discovery, TalosCluster, TalosClusterSpec, TalosOperation, TalosOperationSpec, TalosOperationStatus,
};

/// TalosCluster `ops/prod` on v1.14.4, its Nodes those labelled `pool=prod`.
pub(crate) fn cluster(discovery: Option<Discovery>) -> TalosCluster {
    let mut c = TalosCluster::new(
        "prod",
        TalosClusterSpec {
            talos_version: "v1.14.4".into(),
            kubernetes_version: "1.34.1".into(),
            platform: "metal".into(),
            schematic: None,
            talosconfig_secret: "prod-talosconfig".into(),
            node_selector: Some([("pool".to_owned(), "prod".to_owned())].into()),
            discovery,
            upgrades: None,
            releases: None,
            notifications: None,
            maintenance: None,
            gates: None,
        },
    );
    c.metadata.namespace = Some("ops".into());
    c
}

/// An upgrade `ops/name` of `prod` to v1.14.4, in `phase` for `reason`.
pub(crate) fn operation(name: &str, phase: &str, reason: &str) -> TalosOperation {
    let mut o = TalosOperation::new(
        name,
        TalosOperationSpec {
            cluster: "prod".into(),
            kind: "talos".into(),
            target_version: "v1.14.4".into(),
            max_unavailable: 1.into(),
            maintenance: None,
            gates: None,
            machine: None,
            preflight: None,
            etcd_snapshot: None,
            dry_run: false,
            allow_two_control_planes: false,
        },
    );
    o.metadata.namespace = Some("ops".into());
    o.status =
        Some(TalosOperationStatus { phase: Some(phase.into()), reason: Some(reason.into()), ..Default::default() });
    o
}
