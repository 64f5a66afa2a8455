//! Where etcd snapshots go: the seam ([`SnapshotStore`]) between the executor, which
//! streams a snapshot from a control plane before the first control plane's Upgrade call,
//! and the place that keeps it (a mounted directory, S3-compatible object storage).
//!
//! A store never shows a partial snapshot under its final name: bytes go to a
//! [`SnapshotSink`] and become an object only on [`SnapshotSink::finish`]; a sink dropped
//! or aborted leaves nothing a restore could mistake for a snapshot.

use async_trait::async_trait;

/// A store's failure, with its cause as text (the store's own error types stay in the
/// adapters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SnapshotStoreError(pub String);

/// Where snapshots are kept.
#[async_trait]
pub trait SnapshotStore: Send + Sync + std::fmt::Debug {
    /// Begins the snapshot object `name` (a file name: no `/`).
    ///
    /// # Errors
    /// The store could not be written to at all.
    async fn begin(&self, name: &str) -> Result<Box<dyn SnapshotSink>, SnapshotStoreError>;

    /// What a person reads to find the store (a directory, `s3://bucket/prefix`).
    fn describe(&self) -> String;
}

/// One snapshot being written.
#[async_trait]
pub trait SnapshotSink: Send {
    /// Appends `chunk`.
    ///
    /// # Errors
    /// The write failed; the caller aborts.
    async fn write(&mut self, chunk: &[u8]) -> Result<(), SnapshotStoreError>;

    /// Makes the whole snapshot visible under its name; returns its location (a path, an
    /// `s3://` URL).
    ///
    /// # Errors
    /// It could not be made durable; nothing is left under the name.
    async fn finish(self: Box<Self>) -> Result<String, SnapshotStoreError>;

    /// Discards what was written (best effort: a store that cannot clean up leaves only a
    /// partial object no reader lists as a snapshot).
    async fn abort(self: Box<Self>);
}
