//! The IO seams of evacuation: what is read of the storage backend, and the writes an
//! evacuation makes (carried out by the executor, under its seal).

use std::collections::BTreeMap;

use async_trait::async_trait;
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::Conditions;
use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};

use crate::selection::StorageObject;

/// A storage backend's error. Says whether it is transient (wait and retry) or a failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage backend: {message}")]
pub struct StorageError {
    /// What went wrong.
    pub message: String,
    /// Whether retrying later can succeed (the backend was unreachable or busy).
    pub transient: bool,
}

impl StorageError {
    /// A transient error.
    #[must_use]
    pub fn transient(message: impl Into<String>) -> Self {
        Self { message: message.into(), transient: true }
    }

    /// A failure: retrying will not help.
    #[must_use]
    pub fn failure(message: impl Into<String>) -> Self {
        Self { message: message.into(), transient: false }
    }
}

/// What the engine reads of a storage system that keeps replicas on nodes (Longhorn, for
/// one). Its writes (asking for an evacuation, putting scheduling back) are not here: they
/// are values the executor's `StorageApi::write` carries out, under the seal only its
/// effects module makes (decision 0016). [`EvacuationWrites`] is how the evacuation's
/// definition asks for them.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait StorageReads: Send + Sync {
    /// The cluster's storage objects (`TalosStorage`).
    async fn storage_objects(&self) -> Result<Vec<StorageObject>, StorageError>;
    /// The record an evacuation's request keeps on the node
    /// ([`EvacuationWrites::request_evacuation`]), while the evacuation is open; `None`
    /// when there is none, or no such node.
    async fn evacuation_record(&self, node: &str) -> Result<Option<EvacuationRecord>, StorageError>;
    /// How many replicas are still on the node.
    async fn replicas_on(&self, node: &str) -> Result<u32, StorageError>;
    /// How many backing images still have a file on the node's disks (Longhorn: a
    /// BackingImage naming one of the node's disk UUIDs). A removal waits for these too:
    /// it wipes the disks, and a backing image whose only copy is there would be lost.
    /// An upgrade keeps the disks and does not ask.
    async fn backing_images_on(&self, node: &str) -> Result<u32, StorageError>;
}

/// The writes starting and ending an evacuation make ([`crate::evacuate_machine`],
/// [`crate::end_machine_evacuation`]): the storage backend's two and the machine's
/// conditions. The executor's effects module implements it over its sealed writes, so
/// these writes are made only there; a test implements it with a double.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait EvacuationWrites: Send + Sync {
    /// Turns storage scheduling on the node off and asks the backend to move its replicas
    /// elsewhere, and keeps the evacuation's [`EvacuationRecord`] (the node's scheduling
    /// before it, and `since`) in the same write (Longhorn: one patch of its Node, the
    /// record in an annotation). Idempotent: a repeated request keeps the first record and
    /// says its scheduling from before, or that the backend has no such node. That write
    /// is the evacuation's only record until the machine's conditions carry it.
    async fn request_evacuation(&self, node: &str, since: Timestamp) -> Result<EvacuationRequest, StorageError>;
    /// Puts the node's scheduling back as `before` (what [`Self::request_evacuation`] said)
    /// and removes the record, in one write. Idempotent; a node the backend no longer has
    /// is done.
    async fn restore_scheduling(&self, node: &str, before: Scheduling) -> Result<(), StorageError>;
    /// Replaces the machine's conditions with these.
    async fn write_conditions(&self, machine: &str, conditions: &Conditions) -> Result<(), ConditionWriteError>;
}

/// What asking for a node's evacuation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvacuationRequest {
    /// Asked; the node's scheduling before this evacuation.
    Requested {
        /// Scheduling as it was before the first request.
        before: Scheduling,
    },
    /// The storage system has no node of that name: nothing of it to evacuate.
    NoSuchNode,
}

/// What an evacuation is for: what must leave the node before it may go down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvacuationFor {
    /// An upgrade: the node's disks are kept; its replicas must move.
    Upgrade,
    /// A removal: the node's disks are wiped; its replicas and its backing images' files
    /// must move.
    Removal,
}

/// A failed write of a machine's conditions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("writing conditions of machine {machine}: {message}")]
pub struct ConditionWriteError {
    /// The machine.
    pub machine: String,
    /// What went wrong.
    pub message: String,
    /// Whether retrying later can succeed (unreachable, a conflict).
    pub transient: bool,
}

/// A node's labels, by key.
pub type Labels = BTreeMap<String, String>;
