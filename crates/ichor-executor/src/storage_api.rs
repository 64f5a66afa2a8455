//! The storage backend, as far as the executor needs it: what it reads
//! ([`ichor_storage::StorageReads`]) and the two writes of an evacuation, as values
//! ([`StorageWrite`]) carried out under the seal only [`crate::effects`] makes (decision
//! 0016). The real implementation is Longhorn's, in `ichor-adapters`.

use async_trait::async_trait;
use ichor_storage::{EvacuationRequest, StorageError, StorageReads};
use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::evacuation::Scheduling;

use crate::effects::seal::Seal;

/// A storage system that keeps replicas on nodes (Longhorn, for one): its reads, and its
/// one method for writes.
#[async_trait]
pub trait StorageApi: StorageReads {
    /// Carries out `write` on the backend: the one way to change it through this API. Its
    /// answer is of the write's own kind ([`StorageWritten`]). `seal` is proof that the
    /// caller is [`crate::effects`], which alone makes one; a wrapper passes on the one it
    /// was given.
    async fn write(&self, write: StorageWrite<'_>, seal: Seal) -> Result<StorageWritten, StorageError>;
}

/// A write on the storage backend: the start and the end of a node's evacuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageWrite<'a> {
    /// Turns storage scheduling on `node` off and asks the backend to move its replicas
    /// elsewhere, keeping the evacuation's record (the node's scheduling before it, and
    /// `since`) in the same write (Longhorn: one patch of its Node, the record in an
    /// annotation). Idempotent: a repeated request keeps the first record and says its
    /// scheduling from before, or that the backend has no such node.
    RequestEvacuation {
        /// The node.
        node: &'a str,
        /// When the evacuation began: its timeout's clock.
        since: Timestamp,
    },
    /// Puts `node`'s scheduling back as `before` (what the request said) and removes the
    /// record, in one write. Idempotent; a node the backend no longer has is done.
    RestoreScheduling {
        /// The node.
        node: &'a str,
        /// Its scheduling before the evacuation.
        before: Scheduling,
    },
}

impl StorageWrite<'_> {
    /// The node it writes.
    #[must_use]
    pub fn node(&self) -> &str {
        match self {
            Self::RequestEvacuation { node, .. } | Self::RestoreScheduling { node, .. } => node,
        }
    }

    /// Its name, for logs and errors.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::RequestEvacuation { .. } => "request evacuation",
            Self::RestoreScheduling { .. } => "restore scheduling",
        }
    }
}

/// The answer to a [`StorageWrite`], of the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageWritten {
    /// What the evacuation's request found.
    Requested(EvacuationRequest),
    /// The scheduling is put back.
    Restored,
}

impl StorageWritten {
    /// Its kind, as [`StorageWrite::name`] names it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Requested(_) => "request evacuation",
            Self::Restored => "restore scheduling",
        }
    }

    fn other(self, asked: &'static str) -> StorageError {
        StorageError::failure(format!(
            "{asked} was answered as {}: an implementation of StorageApi::write is wrong",
            self.name()
        ))
    }

    /// What an evacuation's request found.
    ///
    /// # Errors
    /// An answer of another kind (a defect of the implementation, named).
    pub fn requested(self) -> Result<EvacuationRequest, StorageError> {
        match self {
            Self::Requested(request) => Ok(request),
            other => Err(other.other("request evacuation")),
        }
    }

    /// That a restore was answered as itself.
    ///
    /// # Errors
    /// An answer of another kind (a defect of the implementation, named).
    pub fn restored(self) -> Result<(), StorageError> {
        match self {
            Self::Restored => Ok(()),
            other => Err(other.other("restore scheduling")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_another_kind_is_a_failure_that_names_both() {
        let requested = StorageWritten::Requested(EvacuationRequest::NoSuchNode);
        assert_eq!(requested.requested(), Ok(EvacuationRequest::NoSuchNode));
        assert_eq!(StorageWritten::Restored.restored(), Ok(()));

        let wrong = StorageWritten::Restored.requested().expect_err("a restore is no request's answer");
        assert!(!wrong.transient, "a defect, never retried");
        assert!(wrong.message.contains("request evacuation was answered as restore scheduling"), "{wrong}");
        let wrong = requested.restored().expect_err("a request is no restore's answer");
        assert!(wrong.message.contains("restore scheduling was answered as request evacuation"), "{wrong}");
    }

    #[test]
    fn a_write_names_its_node_and_its_kind_as_its_answer_does() {
        let request = StorageWrite::RequestEvacuation { node: "worker-1", since: Timestamp::EPOCH };
        let restore = StorageWrite::RestoreScheduling { node: "worker-2", before: Scheduling::ON };
        assert_eq!((request.node(), restore.node()), ("worker-1", "worker-2"));
        assert_eq!(request.name(), StorageWritten::Requested(EvacuationRequest::NoSuchNode).name());
        assert_eq!(restore.name(), StorageWritten::Restored.name());
    }
}
