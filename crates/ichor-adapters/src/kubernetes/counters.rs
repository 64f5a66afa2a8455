//! The calls a `KubeCluster` made, counted for the operator's metrics.

use std::sync::atomic::AtomicU64;

/// Calls made, for the operator's metrics (and to show that only the leader writes).
#[derive(Debug, Default)]
pub struct Counters {
    /// Writes (status, conditions, Lease, cordon, evictions, deletions, finalizers).
    pub writes: AtomicU64,
    /// Events recorded.
    pub events: AtomicU64,
    /// Reads that went to the API server rather than a store.
    pub reads: AtomicU64,
}
