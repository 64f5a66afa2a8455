//! The simulated control planes' etcd snapshots, and a snapshot store in memory.
//!
//! A simulated snapshot is shaped as etcd's `Maintenance.Snapshot` stream is, so that the
//! real talosctl takes it (`talosctl etcd snapshot` checks the trailer, then opens the
//! database with etcdutl): a bbolt database as bbolt creates one (two meta pages, a
//! freelist page, a root leaf; 4 KiB pages) holding etcd's `meta` bucket, empty (etcdutl
//! reads the storage version from it), then deterministic bytes beyond its
//! high-water mark (which bbolt never reads), then the SHA-256 of everything before it,
//! the whole a multiple of 512 bytes plus 32 (etcd's test for the trailer). It is 1 MiB
//! plus 512 bytes per node plus the 32-byte trailer, streamed in 64 KiB chunks at 100 MB/s
//! of virtual time (a real one of a small cluster is tens of MB, streamed at disk and
//! network speed; the size is kept small so that the many simulated rollouts of the tests
//! hash little). Its bytes depend on the cluster's seed and size only. Under the
//! `snapshot-fails` fault the stream breaks off half way, every time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use ichor_executor::snapshot::{SnapshotSink, SnapshotStore, SnapshotStoreError};
use ichor_executor::talos_api::{SnapshotStream, TalosError};
use sha2::Digest;

/// The size of one chunk of a simulated snapshot stream.
const CHUNK: usize = 64 * 1024;
/// Virtual time per chunk: 64 KiB at 100 MB/s.
const PER_CHUNK: Duration = Duration::from_micros(655);
/// bbolt's page size here (the OS page size when bbolt creates a database).
const PAGE: usize = 4096;
/// etcd's snapshot trailer: the SHA-256 of the database before it.
const TRAILER: usize = 32;

/// The size of a simulated snapshot of a cluster of `nodes` nodes.
#[must_use]
pub fn snapshot_size(nodes: usize) -> usize {
    1024 * 1024 + 512 * nodes + TRAILER
}

/// The bytes of a simulated snapshot of `size` bytes of the cluster seeded `seed`.
#[must_use]
pub fn snapshot_bytes(seed: u64, size: usize) -> Vec<u8> {
    let body = size.saturating_sub(TRAILER).max(4 * PAGE);
    let mut bytes: Vec<u8> = (0..body).map(|offset| byte(seed, offset)).collect();
    bytes[..4 * PAGE].copy_from_slice(&empty_bbolt());
    let digest = sha2::Sha256::digest(&bytes);
    bytes.extend_from_slice(&digest);
    bytes
}

/// The database bbolt's `Open` creates in an empty file (`db.init`): meta pages 0 and 1
/// (transactions 0 and 1), the freelist on page 2, the root bucket's empty leaf on page 3.
fn empty_bbolt() -> Vec<u8> {
    const META: u16 = 0x04;
    const FREELIST: u16 = 0x10;
    const LEAF: u16 = 0x02;
    let mut db = vec![0_u8; 4 * PAGE];
    let header = |db: &mut [u8], id: u64, flags: u16| {
        let at = id as usize * PAGE;
        db[at..at + 8].copy_from_slice(&id.to_le_bytes());
        db[at + 8..at + 10].copy_from_slice(&flags.to_le_bytes());
    };
    for txid in 0..2_u64 {
        header(&mut db, txid, META);
        let mut meta = Vec::with_capacity(64);
        meta.extend_from_slice(&0xED0C_DAED_u32.to_le_bytes()); // magic
        meta.extend_from_slice(&2_u32.to_le_bytes()); // version
        meta.extend_from_slice(&(PAGE as u32).to_le_bytes()); // page size
        meta.extend_from_slice(&0_u32.to_le_bytes()); // flags
        meta.extend_from_slice(&3_u64.to_le_bytes()); // root bucket: its page
        meta.extend_from_slice(&0_u64.to_le_bytes()); // root bucket: its sequence
        meta.extend_from_slice(&2_u64.to_le_bytes()); // freelist page
        meta.extend_from_slice(&4_u64.to_le_bytes()); // high-water mark
        meta.extend_from_slice(&txid.to_le_bytes()); // transaction
        let checksum = fnv1a64(&meta);
        meta.extend_from_slice(&checksum.to_le_bytes());
        let at = txid as usize * PAGE + 16;
        db[at..at + meta.len()].copy_from_slice(&meta);
    }
    header(&mut db, 2, FREELIST);
    header(&mut db, 3, LEAF);
    // The root leaf holds etcd's `meta` bucket, empty and inline (as bbolt keeps a small
    // bucket): etcdutl reads the storage version from it without asking whether it exists.
    let root = 3 * PAGE;
    db[root + 10..root + 12].copy_from_slice(&1_u16.to_le_bytes()); // one element
    let key = b"meta";
    let mut value = Vec::with_capacity(32);
    value.extend_from_slice(&0_u64.to_le_bytes()); // bucket: root 0, inline
    value.extend_from_slice(&0_u64.to_le_bytes()); // bucket: sequence
    value.extend_from_slice(&0_u64.to_le_bytes()); // inline page: id
    value.extend_from_slice(&LEAF.to_le_bytes()); // inline page: a leaf
    value.extend_from_slice(&[0; 6]); // no elements, no overflow
    let element = root + 16;
    let field = |db: &mut [u8], at: usize, v: u32| db[at..at + 4].copy_from_slice(&v.to_le_bytes());
    field(&mut db, element, 0x01); // a bucket
    field(&mut db, element + 4, 16); // its key starts right after the element
    field(&mut db, element + 8, key.len() as u32);
    field(&mut db, element + 12, value.len() as u32);
    let at = element + 16;
    db[at..at + key.len()].copy_from_slice(key);
    db[at + key.len()..at + key.len() + value.len()].copy_from_slice(&value);
    db
}

/// FNV-1a, 64 bits: bbolt's meta page checksum.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The stream of a simulated snapshot of `size` bytes; broken off half way if `fails`.
pub(crate) fn stream(seed: u64, size: usize, fails: bool, takes_time: bool) -> SnapshotStream {
    let bytes = Arc::new(snapshot_bytes(seed, size));
    let chunks = bytes.len().div_ceil(CHUNK);
    let stream = futures::stream::unfold(0_usize, move |k| {
        let bytes = Arc::clone(&bytes);
        async move {
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
            let chunk = bytes[k * CHUNK..bytes.len().min((k + 1) * CHUNK)].to_vec();
            Some((Ok(chunk), k + 1))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_carries_etcds_trailer_over_a_bbolt_database() {
        for nodes in [1, 6, 1000] {
            let bytes = snapshot_bytes(7, snapshot_size(nodes));
            assert_eq!(bytes.len(), snapshot_size(nodes));
            // etcd's (and talosctl's) test for the trailer, then the trailer itself.
            assert_eq!(bytes.len() % 512, TRAILER, "{nodes} nodes");
            let (db, trailer) = bytes.split_at(bytes.len() - TRAILER);
            assert_eq!(trailer, sha2::Sha256::digest(db).as_slice());
            // bbolt's magic and version on both meta pages, their checksums right.
            for page in 0..2 {
                let meta = &db[page * PAGE + 16..page * PAGE + 16 + 64];
                assert_eq!(&meta[..8], &[0xED, 0xDA, 0x0C, 0xED, 2, 0, 0, 0]);
                assert_eq!(u64::from_le_bytes(meta[56..64].try_into().unwrap()), fnv1a64(&meta[..56]));
            }
        }
    }
}
