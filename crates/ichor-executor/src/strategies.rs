//! Proptest strategies over the objects a [`KubeApi`](crate::kube_api::KubeApi) hands the
//! drivers (the `proptest` feature): a cluster's `TalosCluster`, `TalosMachine`s and
//! Nodes, built from an [`ichor_upgrade_core::strategies::ClusterShape`], for a property
//! suite that feeds its own `KubeApi` double to the engine.
//!
//! ```
//! use ichor_executor::strategies::cluster_objects;
//! use proptest::strategy::{Strategy, ValueTree};
//! use proptest::test_runner::TestRunner;
//!
//! let mut runner = TestRunner::deterministic();
//! let objects = cluster_objects(3..=3, 0..=4).new_tree(&mut runner).unwrap().current();
//! assert_eq!(objects.machines.len(), objects.nodes.len());
//! assert_eq!(objects.nodes[0].os_image, "Talos (v1.14.3)");
//! ```

use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::strategies::{ClusterShape, cluster_shape};
use ichor_upgrade_core::versions::TalosVersion;
use proptest::collection::SizeRange;
use proptest::prelude::*;

use crate::kube_api::{ClusterInfo, MachineInfo, Metadata, NodeInfo};

/// The name of the cluster [`ClusterObjects`] describes.
pub const CLUSTER_NAME: &str = "cluster";
/// The schematic the cluster's spec names (the Image Factory's ID of vanilla Talos).
pub const SCHEMATIC: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
/// The version every Node runs in [`cluster_objects`].
pub const FROM: &str = "v1.14.3";
/// The release set's version in [`cluster_objects`].
pub const TO: &str = "v1.14.4";

/// A cluster as a `KubeApi` reads it: one `TalosCluster`, its machines and their Nodes (in
/// the same order, the Node named as the machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterObjects {
    /// What the objects were built from.
    pub shape: ClusterShape,
    /// The `TalosCluster` [`CLUSTER_NAME`], on Kubernetes 1.34.1, platform `metal`.
    pub cluster: ClusterInfo,
    /// The `TalosMachine`s: hostname set, address `10.5.0.{i + 2}`, the shape's order label
    /// and hold, no conditions.
    pub machines: Vec<MachineInfo>,
    /// Their Nodes, schedulable, Ready as the shape says, on the version the objects were
    /// built for, with boot ID `boot-{name}-1`.
    pub nodes: Vec<NodeInfo>,
}

impl ClusterObjects {
    /// The objects of `shape`, its Nodes on `from`, the release set on `to`.
    #[must_use]
    pub fn from_shape(shape: &ClusterShape, from: &TalosVersion, to: &TalosVersion) -> Self {
        let machines = shape
            .machines
            .iter()
            .enumerate()
            .map(|(i, m)| MachineInfo {
                name: m.name.clone(),
                role: m.role,
                hostname: Some(m.name.clone()),
                address: format!("10.5.0.{}", i + 2),
                labels: m.labels(),
                annotations: m.annotations(),
                conditions: Conditions::default(),
                resource_version: None,
            })
            .collect();
        let nodes: Vec<NodeInfo> = shape
            .machines
            .iter()
            .map(|m| NodeInfo {
                name: m.name.clone(),
                ready: m.node_ready,
                unschedulable: false,
                os_image: from.os_image(),
                boot_id: format!("boot-{}-1", m.name),
                labels: Metadata::new(),
                annotations: Metadata::new(),
                resource_version: "1".to_owned(),
            })
            .collect();
        let cluster = ClusterInfo {
            name: CLUSTER_NAME.to_owned(),
            release_talos_version: to.to_string(),
            releases: ichor_upgrade_core::releases::KnownReleases::built_in().clone(),
            kubernetes_version: "1.34.1".to_owned(),
            schematic: Some(SCHEMATIC.to_owned()),
            platform: "metal".to_owned(),
            nodes: nodes.iter().map(|n| n.name.clone()).collect(),
            maintenance: None,
            gates: Vec::new(),
        };
        Self { shape: shape.clone(), cluster, machines, nodes }
    }
}

/// The objects of a [`cluster_shape`] of `control_planes` and `workers`, Nodes on
/// [`FROM`], the release set on [`TO`].
///
/// # Panics
/// Never: [`FROM`] and [`TO`] parse.
pub fn cluster_objects(
    control_planes: impl Into<SizeRange>,
    workers: impl Into<SizeRange>,
) -> impl Strategy<Value = ClusterObjects> {
    let from = TalosVersion::parse(FROM).expect("FROM parses");
    let to = TalosVersion::parse(TO).expect("TO parses");
    cluster_shape(control_planes, workers).prop_map(move |shape| ClusterObjects::from_shape(&shape, &from, &to))
}

#[cfg(test)]
mod tests {
    use ichor_upgrade_core::operation::{HOLD_ANNOTATION, ORDER_LABEL};
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn objects_carry_the_shapes_labels_holds_and_readiness(objects in cluster_objects(1..=5, 0..=10)) {
            prop_assert_eq!(objects.machines.len(), objects.shape.machines.len());
            for ((machine, node), shape) in objects.machines.iter().zip(&objects.nodes).zip(&objects.shape.machines) {
                prop_assert_eq!(&machine.name, &node.name);
                prop_assert_eq!(machine.hostname.as_deref(), Some(node.name.as_str()));
                prop_assert_eq!(machine.labels.get(ORDER_LABEL), shape.order_label.as_ref());
                prop_assert_eq!(machine.annotations.contains_key(HOLD_ANNOTATION), shape.held);
                prop_assert_eq!(node.ready, shape.node_ready);
                prop_assert_eq!(TalosVersion::from_os_image(&node.os_image).unwrap().to_string(), FROM);
            }
            prop_assert_eq!(&objects.cluster.release_talos_version, TO);
        }
    }
}
