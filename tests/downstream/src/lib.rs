//! Another operator's test suite, as it would be written: it uses the engine's public API
//! and its `proptest` feature only (the `strategies` modules of `ichor-upgrade-core`,
//! `ichor-executor` and `ichor-adapters`), never anything private to the workspace.
//!
//! - `tests/properties.rs`: properties of the engine on arbitrary simulated clusters (roles,
//!   order labels, holds, NotReady Nodes) and fault schedules.
//! - `tests/own_doubles.rs`: a `TalosApi` and a `KubeApi` of the suite's own, run through the
//!   engine's `reconcile` on the simulated cluster.
//! - [`embedding`]: `docs/embedding.md`, how another kube-rs operator embeds the engine; its
//!   code is compiled (and, where it needs no cluster, run) as this crate's doctests.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[doc = include_str!("../../../docs/embedding.md")]
pub mod embedding {}
