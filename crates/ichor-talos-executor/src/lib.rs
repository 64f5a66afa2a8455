//! The Talos upgrade executor's drivers.
//!
//! This crate holds the IO seams the drivers call (the clock here; the Talos and
//! Kubernetes APIs as the executor grows) and the drivers themselves: each pass re-reads
//! the world, calls a pure step of `ichor-upgrade-core`, carries out the one action it
//! returns and writes conditions.
//!
//! # What this crate must not do
//! It makes no decision of its own: every choice lives in `ichor-upgrade-core`. It keeps no
//! state between passes (everything to remember is written to the cluster), and it talks
//! to no real API directly: `ichor-adapters` implements its traits, for real clusters and
//! for the simulated one.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;

pub use clock::Clock;
