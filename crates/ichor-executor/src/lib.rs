//! The executor: the drivers that carry out the core's decisions, for every kind of operation
//! (a Talos upgrade on either executor, a Kubernetes upgrade, a machine's removal).
//!
//! This crate holds the IO seams the drivers call ([`TalosApi`], [`KubeApi`], [`Clock`];
//! [`StorageApi`], over `ichor_storage::StorageReads`) and the drivers: [`advance_machine`]
//! takes one machine one step (ADR 0043), and [`reconcile()`] runs one pass of one operation
//! through the rollout engine. Each pass re-reads the world, calls a pure function of
//! `ichor-upgrade-core`, carries out what it returned and writes conditions and status.
//!
//! Every side effect on a machine, its Node, its pods, its storage or etcd goes through
//! [`effects`], which takes the authority the pass's decision gave (or a background job's
//! fresh read) and the precondition each needs, by type. The modules depend downwards
//! only: [`reconcile`](mod@reconcile), the pass by stage, on the per-machine drivers in
//! [`machine`] (one per kind of work, as in the core's `machine`), the drivers on
//! [`effects`] and [`etcd`], and those on [`calls`]. [`calendar`] expands the maintenance
//! windows as written into the instants the engine decides on.
//!
//! # What this crate must not do
//! It makes no decision of its own: every choice lives in `ichor-upgrade-core`. It keeps no
//! state between passes (everything to remember is written to the cluster), and it talks
//! to no real API directly: `ichor-adapters` implements its traits, for real clusters and
//! for the simulated one.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod alert_gates;
pub mod background;
pub mod calendar;
pub mod calls;
pub mod cause;
pub mod clock;
pub mod config;
pub mod effects;
pub mod etcd;
pub mod etcd_snapshot;
pub mod health_gates;
pub mod jobs;
pub mod kube_api;
pub mod machine;
pub mod machine_config;
pub mod reconcile;
pub mod snapshot;
pub mod storage_api;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod talos_api;
pub mod writes;

pub use cause::{Cause, report};
pub use clock::Clock;
pub use config::ExecutorConfig;
pub use kube_api::{KubeApi, KubeError};
pub use machine::talos::{AdvanceError, Executor, OperationRef, advance_machine, advance_machine_with};
pub use reconcile::{PassMemory, reconcile, reconcile_with};
pub use snapshot::{SnapshotSink, SnapshotStore, SnapshotStoreError};
pub use storage_api::StorageApi;
pub use talos_api::{TalosApi, TalosError};
