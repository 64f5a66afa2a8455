//! The two places an etcd snapshot is kept ([`SnapshotStore`]): a mounted directory
//! ([`DirectoryStore`]) and S3-compatible object storage ([`S3Store`]).
//!
//! Both keep the seam's promise that a partial snapshot is never found under its final
//! name. The directory writes `<name>.partial` and renames it once the file is on disk; S3
//! writes a multipart upload, which is no object until it is completed.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use ichor_executor::report;
use ichor_executor::snapshot::{SnapshotSink, SnapshotStore, SnapshotStoreError};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{ObjectStoreExt, WriteMultipart};
use tokio::fs::{File, OpenOptions};
use tokio::io::AsyncWriteExt;

/// The suffix of a snapshot file still being written.
const PARTIAL_SUFFIX: &str = ".partial";

/// The size of each part of a multipart upload but the last. S3 refuses parts under 5 MiB
/// (the last excepted) and allows 10,000 parts: 8 MiB parts hold snapshots up to 78 GiB,
/// far over etcd's 8 GiB quota.
const PART_SIZE: usize = 8 * 1024 * 1024;

/// Parts uploading at once: a sink holds at most this many parts and one being filled.
const PARTS_IN_FLIGHT: usize = 2;

/// Snapshots as files in a directory (a mounted volume).
///
/// A snapshot is written to `<dir>/<name>.partial`, flushed to disk and renamed to
/// `<dir>/<name>`, and the directory is synced so that the rename survives a power loss.
/// A finished snapshot of the same name is replaced whole. One snapshot of a name is
/// written at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryStore {
    dir: PathBuf,
}

impl DirectoryStore {
    /// A store in `dir` (created on the first snapshot if missing).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[async_trait]
impl SnapshotStore for DirectoryStore {
    async fn begin(&self, name: &str) -> Result<Box<dyn SnapshotSink>, SnapshotStoreError> {
        check_name(name)?;
        tokio::fs::create_dir_all(&self.dir).await.map_err(|e| io_error("creating", &self.dir, &e))?;
        let partial = self.dir.join(format!("{name}{PARTIAL_SUFFIX}"));
        let file = match create_new(&partial).await {
            // Left by a writer that stopped before finishing or aborting: not a snapshot.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                tokio::fs::remove_file(&partial).await.map_err(|e| io_error("removing the stale", &partial, &e))?;
                create_new(&partial).await
            }
            other => other,
        }
        .map_err(|e| io_error("creating", &partial, &e))?;
        Ok(Box::new(FileSink { file: Some(file), partial, target: self.dir.join(name), dir: self.dir.clone() }))
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// A snapshot being written to `<name>.partial`.
struct FileSink {
    /// `None` once finished or aborted.
    file: Option<File>,
    partial: PathBuf,
    target: PathBuf,
    dir: PathBuf,
}

#[async_trait]
impl SnapshotSink for FileSink {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), SnapshotStoreError> {
        let Some(file) = self.file.as_mut() else {
            return Err(SnapshotStoreError(format!("writing {}: the snapshot is closed", self.partial.display())));
        };
        file.write_all(chunk).await.map_err(|e| io_error("writing", &self.partial, &e))
    }

    async fn finish(mut self: Box<Self>) -> Result<String, SnapshotStoreError> {
        let Some(file) = self.file.take() else {
            return Err(SnapshotStoreError(format!("finishing {}: the snapshot is closed", self.partial.display())));
        };
        if let Err(e) = make_durable(file).await {
            remove_quietly(&self.partial).await;
            return Err(io_error("syncing", &self.partial, &e));
        }
        if let Err(e) = tokio::fs::rename(&self.partial, &self.target).await {
            remove_quietly(&self.partial).await;
            return Err(SnapshotStoreError(format!(
                "renaming {} to {}: {}",
                self.partial.display(),
                self.target.display(),
                report(&e)
            )));
        }
        if let Err(e) = sync_dir(&self.dir).await {
            // The rename may not survive a power loss: not a snapshot to count on.
            remove_quietly(&self.target).await;
            return Err(io_error("syncing the directory", &self.dir, &e));
        }
        Ok(self.target.display().to_string())
    }

    async fn abort(mut self: Box<Self>) {
        drop(self.file.take());
        remove_quietly(&self.partial).await;
    }
}

impl Drop for FileSink {
    fn drop(&mut self) {
        // Dropped while open: neither finished nor aborted. Unlinking is quick enough to
        // do here, and the partial file would otherwise stay until the next snapshot.
        if self.file.take().is_some()
            && let Err(e) = std::fs::remove_file(&self.partial)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.partial.display(), error = %e, "a dropped snapshot's partial file stays");
        }
    }
}

/// Where to find an S3-compatible bucket and how to sign in.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Config {
    /// The bucket (which must exist).
    pub bucket: String,
    /// The key prefix snapshots are written under (`""` for the bucket's top; a trailing
    /// `/` is optional).
    pub prefix: String,
    /// The service's URL (`https://minio.example:9000`); `None` for AWS itself, from the
    /// region. Requests use path-style URLs (`<endpoint>/<bucket>/<key>`).
    pub endpoint: Option<String>,
    /// The region (`us-east-1`; other services accept any).
    pub region: String,
    /// The access key's ID.
    pub access_key_id: String,
    /// The secret access key (never printed).
    pub secret_access_key: String,
    /// Whether plain HTTP is allowed (a test server, a service on the node's network).
    pub allow_http: bool,
}

impl S3Config {
    /// Snapshots at the top of `bucket` on AWS in `region`, over HTTPS.
    pub fn new(
        bucket: impl Into<String>,
        region: impl Into<String>,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        Self {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            region: region.into(),
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            allow_http: false,
        }
    }

    /// The same configuration with snapshots under `prefix`.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The same configuration against the service at `endpoint`.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// The same configuration, allowing plain HTTP or not.
    #[must_use]
    pub fn with_allow_http(mut self, allow_http: bool) -> Self {
        self.allow_http = allow_http;
        self
    }
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// Snapshots as objects `<prefix>/<name>` in an S3-compatible bucket, each written as a
/// multipart upload in 8 MiB parts: the object appears only when the upload is completed.
///
/// An upload neither completed nor aborted (a process killed mid-snapshot) leaves parts
/// that no listing shows but the bucket still stores; a lifecycle rule that aborts
/// incomplete multipart uploads after a day clears them.
#[derive(Debug)]
pub struct S3Store {
    store: AmazonS3,
    bucket: String,
    /// The prefix without leading or trailing `/`.
    prefix: String,
}

impl S3Store {
    /// A store for `config`. Makes no request: a wrong bucket or credentials show on the
    /// first snapshot.
    ///
    /// # Errors
    /// The prefix is not a valid key prefix, or the endpoint not a URL.
    pub fn new(config: &S3Config) -> Result<Self, SnapshotStoreError> {
        ensure_tls_provider();
        let prefix = config.prefix.trim_matches('/').to_owned();
        object_store::path::Path::parse(&prefix)
            .map_err(|e| SnapshotStoreError(format!("the S3 key prefix {:?}: {}", config.prefix, report(&e))))?;
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.allow_http);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let store = builder
            .build()
            .map_err(|e| SnapshotStoreError(format!("the S3 store s3://{}/{prefix}: {}", config.bucket, report(&e))))?;
        Ok(Self { store, bucket: config.bucket.clone(), prefix })
    }

    /// The key of the snapshot `name`.
    fn key(&self, name: &str) -> String {
        object_key(&self.prefix, name)
    }
}

#[async_trait]
impl SnapshotStore for S3Store {
    async fn begin(&self, name: &str) -> Result<Box<dyn SnapshotSink>, SnapshotStoreError> {
        check_name(name)?;
        let key = self.key(name);
        let url = format!("s3://{}/{key}", self.bucket);
        let path = object_store::path::Path::parse(&key)
            .map_err(|e| SnapshotStoreError(format!("the snapshot name {name:?}: {}", report(&e))))?;
        let upload = self
            .store
            .put_multipart(&path)
            .await
            .map_err(|e| SnapshotStoreError(format!("starting the upload of {url}: {}", report(&e))))?;
        Ok(Box::new(S3Sink { writer: Some(WriteMultipart::new_with_chunk_size(upload, PART_SIZE)), url }))
    }

    fn describe(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// A snapshot being written as a multipart upload.
struct S3Sink {
    /// `None` once finished or aborted.
    writer: Option<WriteMultipart>,
    url: String,
}

#[async_trait]
impl SnapshotSink for S3Sink {
    async fn write(&mut self, chunk: &[u8]) -> Result<(), SnapshotStoreError> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(SnapshotStoreError(format!("writing {}: the snapshot is closed", self.url)));
        };
        // A full part starts uploading as soon as it is filled: wait for room first, so
        // that a fast reader does not buffer the whole snapshot.
        writer
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|e| SnapshotStoreError(format!("uploading a part of {}: {}", self.url, report(&e))))?;
        writer.write(chunk);
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<String, SnapshotStoreError> {
        let Some(writer) = self.writer.take() else {
            return Err(SnapshotStoreError(format!("finishing {}: the snapshot is closed", self.url)));
        };
        // On a failure `finish` has aborted the upload itself.
        match writer.finish().await {
            Ok(_) => Ok(self.url.clone()),
            Err(e) => Err(SnapshotStoreError(format!("completing the upload of {}: {}", self.url, report(&e)))),
        }
    }

    async fn abort(mut self: Box<Self>) {
        if let Some(writer) = self.writer.take()
            && let Err(e) = writer.abort().await
        {
            tracing::warn!(url = %self.url, error = %report(&e), "aborting a snapshot's upload failed; its parts stay");
        }
    }
}

impl Drop for S3Sink {
    fn drop(&mut self) {
        // Dropped while open: abort the upload in the background when a runtime is there
        // to run it (best effort; the upload is no object either way).
        if let Some(writer) = self.writer.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let url = std::mem::take(&mut self.url);
            runtime.spawn(async move {
                if let Err(e) = writer.abort().await {
                    tracing::warn!(%url, error = %report(&e), "aborting a dropped snapshot's upload failed");
                }
            });
        }
    }
}

/// A snapshot name is one file name: not empty, no `/`, no `..`, no NUL.
fn check_name(name: &str) -> Result<(), SnapshotStoreError> {
    if name.is_empty() || name == "." || name.contains('/') || name.contains("..") || name.contains('\0') {
        return Err(SnapshotStoreError(format!(
            "the snapshot name {name:?} is not a file name (empty, `.`, or holding `/`, `..` or NUL)"
        )));
    }
    Ok(())
}

/// `<prefix>/<name>`, or `name` alone under an empty prefix.
fn object_key(prefix: &str, name: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() { name.to_owned() } else { format!("{prefix}/{name}") }
}

/// Opens a new file, failing if one is there.
async fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path).await
}

/// Writes out what the file still buffers and syncs it to disk.
async fn make_durable(mut file: File) -> io::Result<()> {
    file.flush().await?;
    file.sync_all().await
}

/// Syncs a directory, so that a rename in it is on disk.
async fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).await?.sync_all().await
}

/// Removes a file, if it is there (a cleanup after a failure: its own failure is logged).
async fn remove_quietly(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "removing a snapshot file failed");
    }
}

fn io_error(what: &str, path: &Path, error: &io::Error) -> SnapshotStoreError {
    SnapshotStoreError(format!("{what} {}: {}", path.display(), report(error)))
}

/// object_store's HTTP client (reqwest, built without a TLS provider of its own) uses the
/// process's default rustls provider. Ring is the only provider in this build, the one
/// rustls would install itself on the first client configuration made without one, so
/// installing it first changes nothing for the other clients.
pub(crate) fn ensure_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing it is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_join_the_prefix_with_one_slash() {
        assert_eq!(object_key("", "snap.db"), "snap.db");
        assert_eq!(object_key("etcd", "snap.db"), "etcd/snap.db");
        assert_eq!(object_key("etcd/", "snap.db"), "etcd/snap.db");
        assert_eq!(object_key("/clusters/a/", "snap.db"), "clusters/a/snap.db");
    }

    #[test]
    fn names_are_single_file_names() {
        for bad in ["", ".", "..", "../x", "a/b", "/x", "x..y", "a\0b"] {
            let error = check_name(bad).unwrap_err();
            assert!(error.0.contains(&format!("{bad:?}")), "{error} names {bad:?}");
        }
        check_name("etcd-2026-01-01T00-00-00Z.db").unwrap();
    }
}
