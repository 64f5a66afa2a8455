//! Implementations of the traits the Ichor drivers call.
//!
//! Real adapters (the system clock now; a tonic client of the Talos machine API, a kube-rs
//! client and a storage backend as the engine grows) and, later, an in-memory simulated
//! cluster that implements all of them for examples, property tests and benches.
//!
//! # What this crate must not do
//! It decides nothing: it moves data between the drivers and the outside world, mapping
//! each failure to a typed error that says whether it is transient.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;

pub use clock::SystemClock;
