//! Storage evacuation, shared by upgrades and node removal.
//!
//! A `TalosStorage` object names the nodes whose storage must be evacuated before they go
//! down, by a Kubernetes label selector. This crate says which storage objects select a
//! node ([`selection`]); as the engine grows it also holds the `StorageApi` trait and the
//! single definition of starting and ending an evacuation, called by both the upgrade and
//! the removal drivers.
//!
//! # What this crate must not do
//! It talks to no storage system directly (backends live in `ichor-adapters`) and keeps no
//! state: the `StorageEvacuation` condition is the resume marker and timeout clock.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod selection;

pub use selection::{LabelSelector, SelectorError, StorageObject, selecting};
