//! Storage evacuation, shared by upgrades and node removal.
//!
//! A `TalosStorage` object names the nodes whose storage must be evacuated before they go
//! down, by a Kubernetes label selector ([`selection`]). [`StorageReads`] is what is read
//! of the storage system; [`evacuate_machine`] and [`end_machine_evacuation`] are the one
//! definition of starting and ending an evacuation, called by both the upgrade and the
//! removal drivers, through [`EvacuationWrites`] (which the executor's effects module
//! implements over its sealed writes: no write is made here but through it);
//! [`observe_storage`] gathers what the pure step needs.
//!
//! # What this crate must not do
//! It talks to no storage system directly (backends live in `ichor-adapters`) and keeps no
//! state: the `StorageEvacuation` condition is the resume marker and the timeout clock.
//! Where an evacuation stands is decided by `ichor_upgrade_core::evacuation`, not here.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod api;
pub mod evacuate;
pub mod selection;

pub use api::{
    ConditionWriteError, EvacuationFor, EvacuationRequest, EvacuationWrites, Labels, StorageError, StorageReads,
};
pub use evacuate::{
    EvacuationEnd, EvacuationError, end_machine_evacuation, evacuate_machine, evacuation_ended, observe_storage,
};
pub use selection::{LabelSelector, SelectorError, StorageObject, selecting};
