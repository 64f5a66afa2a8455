//! Taking the etcd snapshot the core asks for ([`Decision::take_etcd_snapshot`]): stream
//! it from a Ready control plane into the [`SnapshotStore`](crate::SnapshotStore), hashing it on the way, and
//! say what to record. Whole or failed: a snapshot that broke off is aborted in the store
//! and never recorded.
//!
//! [`Decision::take_etcd_snapshot`]: ichor_upgrade_core::rollout::Decision::take_etcd_snapshot

use futures::StreamExt;
use ichor_upgrade_core::etcd::snapshot::{SnapshotRecord, SnapshotState, snapshot_name};
use sha2::{Digest, Sha256};

use crate::calls::Executor;
use crate::cause::report;
use crate::snapshot::SnapshotSink;

/// A control plane a snapshot may be streamed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Its machine's name.
    pub machine: String,
    /// Its Talos API address.
    pub address: String,
    /// Its Node's name.
    pub node: String,
}

/// Why an operation pauses when the operator has nowhere to put a snapshot, and the fixes.
pub const NO_STORE: &str = "no etcd snapshot store is configured: start the operator with --etcd-snapshot-dir DIR \
     (a mounted volume; deploy/operator.yaml mounts one at /var/lib/ichor/snapshots) or --etcd-snapshot-s3-bucket \
     BUCKET (credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or set spec.etcdSnapshot: Skip on the \
     TalosOperation to upgrade without one";

/// Streams a snapshot of etcd from the first of `sources` (Ready control planes, the one
/// about to be upgraded last) into the executor's store, as `cluster`'s snapshot before
/// `target`. Each source is tried in turn when one cannot be reached; what the store
/// refuses is not retried.
pub async fn take(ex: &Executor<'_>, cluster: &str, target: &str, sources: &[Source]) -> SnapshotState {
    let failed = |reason: String| SnapshotState::Failed { reason, at: ex.clock.now() };
    let Some(store) = ex.snapshots else {
        return failed(NO_STORE.to_owned());
    };
    if sources.is_empty() {
        return failed("no control plane is Ready to stream a snapshot from".to_owned());
    }
    let name = snapshot_name(cluster, target, ex.clock.now());
    let mut errors = Vec::new();
    for source in sources {
        let sink = match store.begin(&name).await {
            Ok(sink) => sink,
            Err(e) => return failed(format!("snapshot store {}: {e}", store.describe())),
        };
        match tokio::time::timeout(ex.config.snapshot_timeout, stream_into(ex, &source.address, sink)).await {
            Ok(Ok((location, size, sha256))) => {
                tracing::info!(%location, size, %sha256, node = %source.node, "etcd snapshot taken");
                return SnapshotState::Taken(SnapshotRecord {
                    location,
                    size,
                    sha256,
                    node: source.node.clone(),
                    taken_at: ex.clock.now(),
                });
            }
            Ok(Err(Failure::Store(e))) => return failed(format!("snapshot store {}: {e}", store.describe())),
            Ok(Err(Failure::Source(e))) => errors.push(format!("{}: {e}", source.node)),
            Err(_) => errors.push(format!("{}: not whole within {:?}", source.node, ex.config.snapshot_timeout)),
        }
    }
    failed(format!("no control plane gave a whole snapshot: {}", errors.join("; ")))
}

/// Why one attempt failed: the store (not retried) or the node's stream (the next node is
/// tried).
enum Failure {
    Store(String),
    Source(String),
}

async fn stream_into(
    ex: &Executor<'_>,
    address: &str,
    mut sink: Box<dyn SnapshotSink>,
) -> Result<(String, u64, String), Failure> {
    let mut stream = match tokio::time::timeout(ex.config.call_timeout, ex.talos.etcd_snapshot(address)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            sink.abort().await;
            return Err(Failure::Source(report(&e)));
        }
        Err(_) => {
            sink.abort().await;
            return Err(Failure::Source(format!("EtcdSnapshot did not answer within {:?}", ex.config.call_timeout)));
        }
    };
    let (mut hash, mut size) = (Sha256::new(), 0_u64);
    loop {
        // A stream that stalls is broken off like any silent call.
        let chunk = match tokio::time::timeout(ex.config.call_timeout, stream.next()).await {
            Ok(Some(Ok(chunk))) => chunk,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                sink.abort().await;
                return Err(Failure::Source(report(&e)));
            }
            Err(_) => {
                sink.abort().await;
                return Err(Failure::Source(format!("the stream stalled for {:?}", ex.config.call_timeout)));
            }
        };
        hash.update(&chunk);
        size += chunk.len() as u64;
        if let Err(e) = sink.write(&chunk).await {
            sink.abort().await;
            return Err(Failure::Store(e.to_string()));
        }
    }
    if size == 0 {
        sink.abort().await;
        return Err(Failure::Source("the snapshot was empty".to_owned()));
    }
    let location = sink.finish().await.map_err(|e| Failure::Store(e.to_string()))?;
    let sha256 = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((location, size, sha256))
}
