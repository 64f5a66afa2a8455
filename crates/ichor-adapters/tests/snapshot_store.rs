//! The snapshot stores: a directory on the local disk, and S3 against a real S3-speaking
//! server (`ICHOR_TEST_S3_ENDPOINT`, moto started by `scripts/s3-test-server.sh`; those
//! tests are skipped with one line without it). Each S3 test works in a bucket of its own.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use ichor_adapters::snapshot_store::{DirectoryStore, S3Config, S3Store};
use ichor_executor::snapshot::SnapshotStore;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BOUND: Duration = Duration::from_secs(60);
const MIB: usize = 1024 * 1024;

async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future).await.expect("the test's own bound")
}

/// `len` bytes that differ from offset to offset and from seed to seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// `data` cut into chunks of uneven sizes, cycling through `sizes`.
fn chunks<'a>(data: &'a [u8], sizes: &'a [usize]) -> impl Iterator<Item = &'a [u8]> {
    let mut rest = data;
    let mut i = 0;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (chunk, tail) = rest.split_at(sizes[i % sizes.len()].min(rest.len()));
        rest = tail;
        i += 1;
        Some(chunk)
    })
}

/// The names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

// ---------------------------------------------------------------- the directory

#[tokio::test]
async fn snapshot_store_directory_finished_snapshot_has_the_exact_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots"); // not there yet: the store creates it
    let store = DirectoryStore::new(&dir);
    assert_eq!(store.describe(), dir.display().to_string());
    let data = pattern(6 * MIB + 12_345, 1);

    let mut sink = bounded(store.begin("etcd-1.db")).await.unwrap();
    for chunk in chunks(&data, &[1, 65_536, 3 * MIB, 777, 2 * MIB]) {
        bounded(sink.write(chunk)).await.unwrap();
    }
    assert_eq!(entries(&dir), ["etcd-1.db.partial"], "while written, only the partial file is there");
    let location = bounded(sink.finish()).await.unwrap();

    assert_eq!(location, dir.join("etcd-1.db").display().to_string());
    assert_eq!(entries(&dir), ["etcd-1.db"], "no partial file stays");
    assert!(std::fs::read(dir.join("etcd-1.db")).unwrap() == data, "the snapshot holds exactly the bytes written");
}

#[tokio::test]
async fn snapshot_store_directory_replaces_a_stale_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("etcd-2.db.partial"), pattern(4096, 9)).unwrap();
    let store = DirectoryStore::new(tmp.path());
    let data = pattern(1000, 2);

    let mut sink = bounded(store.begin("etcd-2.db")).await.unwrap();
    bounded(sink.write(&data)).await.unwrap();
    bounded(sink.finish()).await.unwrap();

    assert_eq!(entries(tmp.path()), ["etcd-2.db"]);
    assert_eq!(std::fs::read(tmp.path().join("etcd-2.db")).unwrap(), data, "nothing of the stale file is left");
}

#[tokio::test]
async fn snapshot_store_directory_abort_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = DirectoryStore::new(tmp.path());

    let mut sink = bounded(store.begin("etcd-3.db")).await.unwrap();
    bounded(sink.write(&pattern(100_000, 3))).await.unwrap();
    bounded(sink.abort()).await;

    assert!(entries(tmp.path()).is_empty(), "left behind: {:?}", entries(tmp.path()));
}

#[tokio::test]
async fn snapshot_store_directory_dropped_sink_leaves_no_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let store = DirectoryStore::new(tmp.path());

    let mut sink = bounded(store.begin("etcd-4.db")).await.unwrap();
    bounded(sink.write(&pattern(100_000, 4))).await.unwrap();
    drop(sink);

    assert!(!tmp.path().join("etcd-4.db").exists(), "a dropped snapshot is not under its name");
    assert!(entries(tmp.path()).is_empty(), "and its partial file is removed: {:?}", entries(tmp.path()));
}

#[tokio::test]
async fn snapshot_store_directory_refuses_bad_names_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let store = DirectoryStore::new(&dir);

    for name in ["", "..", "../etcd.db", "sub/etcd.db", "/etcd.db"] {
        let Err(error) = bounded(store.begin(name)).await else { panic!("{name:?} was accepted") };
        assert!(error.to_string().contains(&format!("{name:?}")), "the error names {name:?}: {error}");
    }
    assert!(!dir.exists(), "a refused name creates nothing, not even the directory");
    assert!(entries(tmp.path()).is_empty());
}

// ---------------------------------------------------------------- S3, without a server

#[test]
fn snapshot_store_s3_config_debug_hides_the_secret() {
    let config = S3Config::new("bucket", "us-east-1", "AKIDEXAMPLE", "wJalrXUtnFEMI-very-secret").with_prefix("etcd");
    let printed = format!("{config:?}");
    assert!(!printed.contains("wJalrXUtnFEMI-very-secret"), "{printed}");
    assert!(printed.contains("AKIDEXAMPLE") && printed.contains("etcd"), "{printed}");
}

#[test]
fn snapshot_store_s3_describes_bucket_and_prefix() {
    let describe = |prefix: &str| {
        let config = S3Config::new("backups", "us-east-1", "id", "secret")
            .with_prefix(prefix)
            .with_endpoint("http://127.0.0.1:9")
            .with_allow_http(true);
        S3Store::new(&config).unwrap().describe()
    };
    assert_eq!(describe(""), "s3://backups");
    assert_eq!(describe("etcd"), "s3://backups/etcd");
    assert_eq!(describe("clusters/a/"), "s3://backups/clusters/a");
}

#[tokio::test]
async fn snapshot_store_s3_refuses_bad_names() {
    // The name is checked before any request: the endpoint need not answer.
    let config = S3Config::new("backups", "us-east-1", "id", "secret")
        .with_endpoint("http://127.0.0.1:9")
        .with_allow_http(true)
        .with_prefix("etcd");
    let store = S3Store::new(&config).unwrap();
    for name in ["", "..", "../etcd.db", "a/b"] {
        let Err(error) = bounded(store.begin(name)).await else { panic!("{name:?} was accepted") };
        assert!(error.to_string().contains(&format!("{name:?}")), "the error names {name:?}: {error}");
    }
}

// ---------------------------------------------------------------- S3, against a server

/// The variable naming the S3 server the tests use.
const ENDPOINT_VAR: &str = "ICHOR_TEST_S3_ENDPOINT";

/// The endpoint (`http://127.0.0.1:PORT`).
///
/// # Panics
/// When none is set: the tests that need it are ignored unless asked for, and asked for
/// without a server they fail, saying how to start one.
fn endpoint() -> String {
    match std::env::var(ENDPOINT_VAR) {
        Ok(endpoint) if !endpoint.is_empty() => endpoint,
        _ => panic!(
            "this test needs an S3 server: {ENDPOINT_VAR}=http://127.0.0.1:PORT is not set (start one with \
             `bash scripts/s3-test-server.sh start DIR` and export the line it prints; `bash .ci/run` does it all)"
        ),
    }
}

/// A fresh bucket on the test server, and a client of it that is not the store's.
struct TestBucket {
    endpoint: String,
    name: String,
    client: AmazonS3,
}

impl TestBucket {
    async fn create(tag: &str) -> Self {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let endpoint = endpoint();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let name = format!("ichor-{tag}-{:x}-{}", nanos % 0xff_ffff_ffff, COUNT.fetch_add(1, Ordering::Relaxed));
        // object_store cannot create buckets; moto takes an unsigned CreateBucket.
        let (status, body) = http(&endpoint, "PUT", &format!("/{name}")).await;
        assert_eq!(status, 200, "creating bucket {name}: {body}");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = AmazonS3Builder::new()
            .with_bucket_name(&name)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .build()
            .unwrap();
        Self { endpoint, name, client }
    }

    fn config(&self, prefix: &str) -> S3Config {
        S3Config::new(&self.name, "us-east-1", "ichor-test", "ichor-test-secret")
            .with_prefix(prefix)
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
    }

    /// Every key in the bucket, sorted.
    async fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> =
            self.client.list(None).map_ok(|meta| meta.location.to_string()).try_collect().await.unwrap();
        keys.sort();
        keys
    }

    /// The keys under `prefix`, sorted.
    async fn keys_under(&self, prefix: &str) -> Vec<String> {
        let prefix = ObjectPath::from(prefix);
        let mut keys: Vec<String> =
            self.client.list(Some(&prefix)).map_ok(|meta| meta.location.to_string()).try_collect().await.unwrap();
        keys.sort();
        keys
    }

    async fn read(&self, key: &str) -> Vec<u8> {
        self.client.get(&ObjectPath::from(key)).await.unwrap().bytes().await.unwrap().to_vec()
    }

    /// The body of ListMultipartUploads: the uploads started and neither completed nor
    /// aborted.
    async fn pending_uploads(&self) -> String {
        let (status, body) = http(&self.endpoint, "GET", &format!("/{}?uploads", self.name)).await;
        assert_eq!(status, 200, "listing the uploads of {}: {body}", self.name);
        body
    }
}

/// The text between the first `open` and the `close` after it.
fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let len = text[start..].find(close)?;
    Some(&text[start..start + len])
}

/// One unsigned HTTP/1.1 request with an empty body to the loopback `endpoint`: the status
/// and the body.
async fn http(endpoint: &str, method: &str, target: &str) -> (u16, String) {
    let authority = endpoint.strip_prefix("http://").expect("an http:// endpoint").trim_end_matches('/');
    assert!(authority.starts_with("127.0.0.1:") || authority.starts_with("localhost:"), "loopback only: {endpoint}");
    bounded(async {
        let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
        let request = format!(
            "{method} {target} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.unwrap();
        let reply = String::from_utf8_lossy(&reply).into_owned();
        let status = reply.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
        let body = reply.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
        (status, body)
    })
    .await
}

#[tokio::test]
#[ignore = "needs an S3 server: ICHOR_TEST_S3_ENDPOINT (bash scripts/s3-test-server.sh start DIR)"]
async fn snapshot_store_s3_round_trips_a_12_mib_snapshot_under_the_prefix() {
    let bucket = TestBucket::create("round-trip").await;
    let store = S3Store::new(&bucket.config("clusters/a/")).unwrap();
    let data = pattern(12 * MIB, 5);

    let mut sink = bounded(store.begin("etcd-5.db")).await.unwrap();
    for chunk in chunks(&data, &[1_000_003, 17, 4 * MIB + 1, 65_536, 3 * MIB]) {
        bounded(sink.write(chunk)).await.unwrap();
    }
    // Two 8 MiB parts' worth were written (one uploaded, one buffered): still no object.
    assert!(bucket.keys().await.is_empty(), "a snapshot in progress is an object: {:?}", bucket.keys().await);
    let location = bounded(sink.finish()).await.unwrap();

    assert_eq!(location, format!("s3://{}/clusters/a/etcd-5.db", bucket.name));
    assert_eq!(bucket.keys_under("clusters/a").await, ["clusters/a/etcd-5.db"]);
    assert_eq!(bucket.keys().await, ["clusters/a/etcd-5.db"], "the key carries the prefix, and nothing else is there");
    assert!(bucket.read("clusters/a/etcd-5.db").await == data, "the object holds exactly the bytes written");
    assert!(!bucket.pending_uploads().await.contains("<Upload>"), "no upload is left open");
}

#[tokio::test]
#[ignore = "needs an S3 server: ICHOR_TEST_S3_ENDPOINT (bash scripts/s3-test-server.sh start DIR)"]
async fn snapshot_store_s3_a_small_snapshot_at_the_top_of_the_bucket() {
    let bucket = TestBucket::create("small").await;
    let store = S3Store::new(&bucket.config("")).unwrap();
    let data = pattern(300_000, 6);

    let mut sink = bounded(store.begin("etcd-6.db")).await.unwrap();
    for chunk in chunks(&data, &[70_000, 1]) {
        bounded(sink.write(chunk)).await.unwrap();
    }
    let location = bounded(sink.finish()).await.unwrap();

    assert_eq!(location, format!("s3://{}/etcd-6.db", bucket.name));
    assert_eq!(bucket.keys().await, ["etcd-6.db"]);
    assert!(bucket.read("etcd-6.db").await == data);
}

#[tokio::test]
#[ignore = "needs an S3 server: ICHOR_TEST_S3_ENDPOINT (bash scripts/s3-test-server.sh start DIR)"]
async fn snapshot_store_s3_abort_leaves_no_object_and_no_upload() {
    let bucket = TestBucket::create("abort").await;
    let store = S3Store::new(&bucket.config("etcd")).unwrap();

    let mut sink = bounded(store.begin("etcd-7.db")).await.unwrap();
    // Two 8 MiB parts and more: a write after the second part waits until one of them is
    // uploaded, so that the abort has parts to discard.
    for chunk in chunks(&pattern(18 * MIB, 7), &[MIB + 3]) {
        bounded(sink.write(chunk)).await.unwrap();
    }
    let uploads = bucket.pending_uploads().await;
    let upload_id = between(&uploads, "<UploadId>", "</UploadId>").expect("the upload was started");
    let (status, parts) =
        http(&bucket.endpoint, "GET", &format!("/{}/etcd/etcd-7.db?uploadId={upload_id}", bucket.name)).await;
    assert_eq!(status, 200, "listing the upload's parts: {parts}");
    assert!(parts.contains("<Part>"), "a part was uploaded before the abort: {parts}");
    bounded(sink.abort()).await;

    assert!(bucket.keys_under("etcd").await.is_empty(), "an aborted snapshot is an object");
    assert!(bucket.keys().await.is_empty());
    let uploads = bucket.pending_uploads().await;
    assert!(!uploads.contains("<Upload>"), "the aborted upload is still open: {uploads}");
}
