//! The simulated control planes' etcd snapshots, and a snapshot store in memory.
//!
//! A simulated snapshot is 1 MiB plus 256 bytes per node, streamed in 64 KiB chunks at
//! 100 MB/s of virtual time (a real one of a small cluster is tens of MB, streamed at disk
//! and network speed; the size is kept small so that the many simulated rollouts of the
//! tests hash little). Its bytes depend on the cluster's seed and size only. Under the
//! `snapshot-fails` fault the stream breaks off half way, every time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use ichor_talos_executor::snapshot::{SnapshotSink, SnapshotStore, SnapshotStoreError};
use ichor_talos_executor::talos_api::{SnapshotStream, TalosError};

/// The size of one chunk of a simulated snapshot stream.
const CHUNK: usize = 64 * 1024;
/// Virtual time per chunk: 64 KiB at 100 MB/s.
const PER_CHUNK: Duration = Duration::from_micros(655);

/// The size of a simulated snapshot of a cluster of `nodes` nodes.
#[must_use]
pub fn snapshot_size(nodes: usize) -> usize {
    1024 * 1024 + 256 * nodes
}

/// The stream of a simulated snapshot of `size` bytes; broken off half way if `fails`.
pub(crate) fn stream(seed: u64, size: usize, fails: bool, takes_time: bool) -> SnapshotStream {
    let chunks = size.div_ceil(CHUNK);
    let stream = futures::stream::unfold(0_usize, move |k| async move {
        if k >= chunks {
            return None;
        }
        if takes_time {
            tokio::time::sleep(PER_CHUNK).await;
        }
        if fails && k == chunks / 2 {
            let broken = TalosError::transport("stream reset by peer (the snapshot-fails fault)");
            return Some((Err(broken), chunks));
        }
        let len = CHUNK.min(size - k * CHUNK);
        let chunk = (0..len).map(|j| byte(seed, k * CHUNK + j)).collect();
        Some((Ok(chunk), k + 1))
    });
    Box::pin(stream)
}

/// Byte `offset` of a snapshot of the cluster seeded `seed`.
fn byte(seed: u64, offset: usize) -> u8 {
    let x = (offset as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
    (x >> 56) as u8
}

/// A snapshot store in memory: what the simulator's operations use unless given another.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    objects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl MemoryStore {
    /// The finished snapshots, by name, with their sizes.
    #[must_use]
    pub fn sizes(&self) -> BTreeMap<String, usize> {
        let objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        objects.iter().map(|(name, bytes)| (name.clone(), bytes.len())).collect()
    }
}

#[async_trait]
impl SnapshotStore for MemoryStore {
    async fn begin(&self, name: &str) -> Result<Box<dyn SnapshotSink>, SnapshotStoreError> {
        Ok(Box::new(MemorySink { name: name.to_owned(), bytes: Vec::new(), objects: Arc::clone(&self.objects) }))
    }

    fn describe(&self) -> String {
        "memory".to_owned()
    }
}

struct MemorySink {
    name: String,
    bytes: Vec<u8>,
    objects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

#[async_trait]
impl SnapshotSink for MemorySink {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), SnapshotStoreError> {
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<String, SnapshotStoreError> {
        let location = format!("memory://{}", self.name);
        self.objects.lock().unwrap_or_else(PoisonError::into_inner).insert(self.name, self.bytes);
        Ok(location)
    }

    async fn abort(self: Box<Self>) {}
}
