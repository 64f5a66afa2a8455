//! Implementations of the traits the Ichor drivers call, over the real world.
//!
//! - [`SystemClock`]: the real clock;
//! - [`talos`]: the Talos machine API client (tonic, mutual TLS from a talosconfig), and a
//!   Talos API server in front of any `TalosApi`;
//! - [`kubernetes`]: the kube-rs client (`KubeApi`), the CRDs and their manifests;
//! - [`longhorn`]: storage evacuation through Longhorn's CRDs (`StorageReads` and the
//!   executor's `StorageApi`, whose sealed writes start and end an evacuation);
//! - [`snapshot_store`]: where etcd snapshots go, a mounted directory or S3-compatible storage.
//!
//! The simulated cluster is the crate `ichor-sim`.
//!
//! # What this crate must not do
//! It decides nothing: it moves data between the drivers and the outside world, mapping
//! each failure to a typed error that says whether it is transient.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod clock;
pub mod kubernetes;
pub mod longhorn;
pub mod snapshot_store;
pub mod talos;

pub use clock::SystemClock;
