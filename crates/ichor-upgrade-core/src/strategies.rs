//! Proptest strategies over the engine's view of a cluster, for property suites of other
//! crates and other teams (the `proptest` feature).
//!
//! A [`ClusterShape`] is what a cluster looks like to the rollout engine before any
//! operation: its machines' roles, [`ORDER_LABEL`] values, [`HOLD_ANNOTATION`]s and which
//! Nodes are NotReady. [`cluster_shape`] draws one; [`machine_views`] draws the engine's
//! input for one pass ([`MachineView`]s, progress included) over such a cluster.
//! Machines are named as the simulated cluster names its nodes: `cp-1`, `cp-2`, ... and
//! `worker-1`, ...
//!
//! ```
//! use ichor_upgrade_core::strategies::cluster_shape;
//! use proptest::strategy::{Strategy, ValueTree};
//! use proptest::test_runner::TestRunner;
//!
//! let mut runner = TestRunner::deterministic();
//! let shape = cluster_shape(1..=3, 0..=5).new_tree(&mut runner).unwrap().current();
//! assert!((1..=3).contains(&shape.control_planes().count()));
//! assert!(shape.workers().count() <= 5);
//! ```

use std::collections::BTreeMap;

use proptest::collection::SizeRange;
use proptest::prelude::*;

use crate::machine::vocabulary::MachineRole;
use crate::operation::{HOLD_ANNOTATION, ORDER_LABEL};
use crate::rollout::MachineView;
use crate::status::MachineProgress;

/// One machine of a [`ClusterShape`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineShape {
    /// Its name (`cp-N` or `worker-N`), which is also its Node's name.
    pub name: String,
    /// Its role.
    pub role: MachineRole,
    /// The value of its [`ORDER_LABEL`], if it has one (not always a number: the engine
    /// must cope with a label it cannot parse).
    pub order_label: Option<String>,
    /// Whether it carries [`HOLD_ANNOTATION`].
    pub held: bool,
    /// Whether its Node is Ready at the start.
    pub node_ready: bool,
}

impl MachineShape {
    /// Its labels, as a `TalosMachine` carries them (the order label, if any).
    #[must_use]
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.order_label.iter().map(|v| (ORDER_LABEL.to_owned(), v.clone())).collect()
    }

    /// Its annotations, as a `TalosMachine` carries them (the hold, if any).
    #[must_use]
    pub fn annotations(&self) -> BTreeMap<String, String> {
        if self.held { [(HOLD_ANNOTATION.to_owned(), "true".to_owned())].into() } else { BTreeMap::new() }
    }

    /// Its view for the rollout engine with this progress, its Node on `os_image` (such as
    /// `Talos (v1.14.3)`).
    #[must_use]
    pub fn view(&self, os_image: &str, progress: MachineProgress) -> MachineView {
        MachineView {
            name: self.name.clone(),
            role: self.role,
            order_label: self.order_label.clone(),
            held: self.held,
            node_ready: self.node_ready,
            os_image: Some(os_image.to_owned()),
            progress,
            last: false,
        }
    }
}

/// A cluster as the engine meets it: control planes first, then workers, each role
/// numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterShape {
    /// The machines.
    pub machines: Vec<MachineShape>,
}

impl ClusterShape {
    /// `control_planes` control planes and `workers` workers, none labelled or held, every
    /// Node Ready: a starting point for a case written by hand.
    #[must_use]
    pub fn plain(control_planes: usize, workers: usize) -> Self {
        let machine = |role, name| MachineShape { name, role, order_label: None, held: false, node_ready: true };
        let machines = (1..=control_planes)
            .map(|i| machine(MachineRole::ControlPlane, format!("cp-{i}")))
            .chain((1..=workers).map(|i| machine(MachineRole::Worker, format!("worker-{i}"))))
            .collect();
        Self { machines }
    }

    /// The control planes.
    pub fn control_planes(&self) -> impl Iterator<Item = &MachineShape> {
        self.machines.iter().filter(|m| m.role == MachineRole::ControlPlane)
    }

    /// The workers.
    pub fn workers(&self) -> impl Iterator<Item = &MachineShape> {
        self.machines.iter().filter(|m| m.role == MachineRole::Worker)
    }

    /// The machine of that name.
    #[must_use]
    pub fn machine(&self, name: &str) -> Option<&MachineShape> {
        self.machines.iter().find(|m| m.name == name)
    }
}

/// An [`ORDER_LABEL`] value or none: mostly none, else a small integer (negative ones
/// too), now and then one that is not a number.
pub fn order_label() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => Just(None),
        3 => (-2i64..4).prop_map(|n| Some(n.to_string())),
        1 => Just(Some("not-a-number".to_owned())),
    ]
}

/// A machine's progress in an operation under way: mostly pending, some converged, some
/// in progress on either side of the Upgrade call, now and then failed.
pub fn machine_progress() -> impl Strategy<Value = MachineProgress> {
    prop_oneof![
        12 => Just(MachineProgress::Pending),
        4 => Just(MachineProgress::Converged),
        2 => Just(MachineProgress::InProgress { past_upgrade_call: false }),
        2 => Just(MachineProgress::InProgress { past_upgrade_call: true }),
        1 => Just(MachineProgress::Failed { reason: "A/B fallback".to_owned() }),
    ]
}

/// The chance that a drawn machine is held.
pub const HELD_CHANCE: f64 = 0.1;
/// The chance that a drawn machine's Node is Ready.
pub const READY_CHANCE: f64 = 0.85;

/// A cluster of `control_planes` control planes and `workers` workers (each a range of
/// counts), with [`order_label`]s, holds ([`HELD_CHANCE`]) and NotReady Nodes (Ready at
/// [`READY_CHANCE`]).
pub fn cluster_shape(
    control_planes: impl Into<SizeRange>,
    workers: impl Into<SizeRange>,
) -> impl Strategy<Value = ClusterShape> {
    cluster_shape_with(control_planes, workers, HELD_CHANCE, READY_CHANCE)
}

/// [`cluster_shape`] with other chances of a hold and of a Ready Node.
pub fn cluster_shape_with(
    control_planes: impl Into<SizeRange>,
    workers: impl Into<SizeRange>,
    held: f64,
    ready: f64,
) -> impl Strategy<Value = ClusterShape> {
    let machine = move || (order_label(), prop::bool::weighted(held), prop::bool::weighted(ready));
    (prop::collection::vec(machine(), control_planes), prop::collection::vec(machine(), workers)).prop_map(
        |(cps, workers)| {
            let named = |role: MachineRole, prefix: &'static str| {
                move |(i, (order_label, held, node_ready)): (usize, (Option<String>, bool, bool))| MachineShape {
                    name: format!("{prefix}-{}", i + 1),
                    role,
                    order_label,
                    held,
                    node_ready,
                }
            };
            let machines = cps
                .into_iter()
                .enumerate()
                .map(named(MachineRole::ControlPlane, "cp"))
                .chain(workers.into_iter().enumerate().map(named(MachineRole::Worker, "worker")))
                .collect();
            ClusterShape { machines }
        },
    )
}

/// The engine's input for one pass over a [`cluster_shape`] (Nodes on `Talos (v1.14.3)`),
/// each machine with a [`machine_progress`]. The state is one the engine can reach: at
/// most one control plane in progress (any other drawn so is converged instead).
pub fn machine_views(
    control_planes: impl Into<SizeRange>,
    workers: impl Into<SizeRange>,
) -> impl Strategy<Value = Vec<MachineView>> {
    let control_planes = control_planes.into();
    let workers = workers.into();
    let most = control_planes.end_incl() + workers.end_incl();
    (cluster_shape(control_planes, workers), prop::collection::vec(machine_progress(), most)).prop_map(
        |(shape, progress)| {
            let mut cp_in_progress = false;
            shape
                .machines
                .iter()
                .zip(progress)
                .map(|(m, mut progress)| {
                    if m.role == MachineRole::ControlPlane && matches!(progress, MachineProgress::InProgress { .. }) {
                        if cp_in_progress {
                            progress = MachineProgress::Converged;
                        }
                        cp_in_progress = true;
                    }
                    m.view("Talos (v1.14.3)", progress)
                })
                .collect()
        },
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn shapes_are_named_by_role_and_counted_within_bounds(shape in cluster_shape(1..=3, 0..=6)) {
            let cps: Vec<&str> = shape.control_planes().map(|m| m.name.as_str()).collect();
            let workers: Vec<&str> = shape.workers().map(|m| m.name.as_str()).collect();
            prop_assert!((1..=3).contains(&cps.len()) && workers.len() <= 6);
            for (i, name) in cps.iter().enumerate() {
                prop_assert_eq!(*name, format!("cp-{}", i + 1));
            }
            for (i, name) in workers.iter().enumerate() {
                prop_assert_eq!(*name, format!("worker-{}", i + 1));
            }
            for m in &shape.machines {
                let labels = m.labels();
                prop_assert_eq!(labels.get(ORDER_LABEL), m.order_label.as_ref());
                prop_assert_eq!(m.annotations().contains_key(HOLD_ANNOTATION), m.held);
            }
        }

        #[test]
        fn a_plain_shape_is_named_as_a_drawn_one(shape in cluster_shape(0..=3, 0..=6)) {
            let plain = ClusterShape::plain(shape.control_planes().count(), shape.workers().count());
            let names = |s: &ClusterShape| s.machines.iter().map(|m| (m.name.clone(), m.role)).collect::<Vec<_>>();
            prop_assert_eq!(names(&plain), names(&shape));
            prop_assert!(plain.machines.iter().all(|m| m.order_label.is_none() && !m.held && m.node_ready));
        }

        #[test]
        fn views_have_at_most_one_control_plane_in_progress(views in machine_views(1..=7, 0..=20)) {
            let busy = views
                .iter()
                .filter(|v| v.role == MachineRole::ControlPlane)
                .filter(|v| matches!(v.progress, MachineProgress::InProgress { .. }))
                .count();
            prop_assert!(busy <= 1, "{} control planes in progress", busy);
        }
    }
}
