//! The deterministic core of the Ichor upgrade engine.
//!
//! Ichor rolls the machines of a Talos Linux cluster to a new OS version with no
//! maintenance window. This crate holds every decision it makes, and nothing else:
//!
//! - [`versions`]: strict parsing of Talos and Kubernetes versions, the upgrade-path rule
//!   and the Talos-to-Kubernetes support table;
//! - [`audit`]: the morning-after audit: what is left wrong after an upgrade, each a
//!   typed finding;
//! - [`changes`]: what a change of an operation's status says to a trace;
//! - [`conditions`]: `metav1.Condition`-shaped progress markers with upsert semantics;
//! - [`operation`]: operation kinds, spec validation and the labels people steer with;
//! - [`preflight`]: whether the cluster can lose a node now (the runbook's preflight, per
//!   machine), from what was observed of its workloads;
//! - [`machine`]: one machine's part of an operation, one module per kind of work (a
//!   Talos upgrade on the legacy Upgrade call or on the lifecycle API, a removal, a
//!   Kubernetes upgrade's component changes) and the vocabulary they share;
//! - [`kubernetes`]: what a Kubernetes upgrade knows of Kubernetes itself: its plan (its
//!   steps in Talos's order, or every reason it would break the cluster), the components'
//!   flags, the bootstrap manifests and the API versions releases remove;
//! - [`etcd`]: the etcd gate and the operation's etcd snapshot;
//! - [`status`]: the operation's persisted status: its phase, its machines' records;
//! - [`record`]: the status a pass records from its decision and its machines' outcomes;
//! - [`plan`]: a calibrated plan of an upgrade before it runs (its makespan's spread
//!   from the cluster's own history, the order, the machines held);
//! - [`window`]: maintenance windows as the engine decides on them: a start only inside
//!   one, and only when its calibrated p90 turn ends before the window does;
//! - [`rollout`]: the rollout engine, a pure function from what was observed to a
//!   [`rollout::Decision`].
//!
//! The modules depend on each other in one direction, never in a circle (`docs/architecture.md`
//! says how that is checked).
//!
//! # What this crate must not do
//! It is deterministic: no IO, no clock, no async, no randomness, no global state. Time
//! enters as an argument ([`Timestamp`]); the same inputs always give the same output. Its
//! normal dependencies are serde, semver, thiserror and foldhash (a fast hash of machine
//! names, no IO), never tokio, tonic, hyper, kube or async-trait. Drivers (`ichor-executor`, `ichor-storage`) observe the world, call
//! these functions and carry out what they return.
//!
//! # Example
//! ```
//! use ichor_upgrade_core::versions::{check_kubernetes_pairing, check_upgrade_path, KubernetesVersion, TalosVersion};
//!
//! let from = TalosVersion::from_os_image("Talos (v1.13.6)")?;
//! let to = TalosVersion::parse("v1.14.4")?;
//! check_upgrade_path(&from, &to)?;
//! let range = check_kubernetes_pairing(&to, &KubernetesVersion::parse("1.34.1")?)?;
//! assert_eq!(range.to_string(), "Kubernetes 1.32.0 to 1.37.x");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod audit;
pub mod changes;
pub mod conditions;
pub mod etcd;
pub mod evacuation;
pub mod gate;
pub mod kubernetes;
pub mod labels;
pub mod machine;
pub mod operation;
pub mod plan;
pub mod preflight;
pub mod record;
pub mod releases;
pub mod rollout;
pub mod status;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod time;
pub mod upgrade_marker;
pub mod versions;
pub mod window;

pub use time::Timestamp;
