//! Implementations of the traits the Ichor drivers call.
//!
//! - [`SystemClock`]: the real clock;
//! - [`sim`]: a simulated Talos cluster implementing `TalosApi`, `KubeApi`, `StorageApi`
//!   and `Clock` on virtual time, for the examples, property tests and benches;
//! - [`snapshot_store`]: where etcd snapshots go, a mounted directory or S3-compatible storage;
//! - [`trace`]: the records of a rollout's trace, which the simulator and the operator write;
//! - (to come) a tonic client of the Talos machine API, a kube-rs client, a storage backend.
//!
//! # What this crate must not do
//! It decides nothing: it moves data between the drivers and the outside world (or the
//! simulated one), mapping each failure to a typed error that says whether it is transient.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod clock;
pub mod kubernetes;
pub mod longhorn;
pub mod sim;
pub mod snapshot_store;
pub mod talos;
pub mod trace;

pub use clock::SystemClock;
