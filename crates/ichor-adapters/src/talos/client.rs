//! `TalosApi` over the Talos machine API: tonic, mutual TLS from a talosconfig, each call
//! aimed at one node through apid's `node` metadata key.
//!
//! # Endpoints
//! Every endpoint of the context is used, as talosctl does: a call goes through the first
//! endpoint that connects, and a call about node X tries the endpoints that are not X first
//! (X's own apid is down while X reboots). Only a call that certainly never left (no
//! connection, or a TLS handshake that failed) goes on to the next endpoint: a call that
//! may have been delivered is never sent twice.
//!
//! # Bounds
//! Connecting (name resolution, TCP, TLS, the server's first frame) ends within the dial
//! bound; then each call has its own bound, sent as its gRPC deadline and kept on this side
//! as well. The etcd snapshot stream has a bound of its own.
//!
//! # Classification
//! As the executor acts on failures (see [`TalosError`]): no connection is
//! [`TalosError::Dial`], a failed handshake [`TalosError::Tls`] (not transient), a call
//! broken off [`TalosError::Transport`], apid's `Unavailable` and its kin
//! [`TalosError::Unreachable`], and any other answer [`TalosError::Answered`]. The cause is
//! kept whole behind `source()`.

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ichor_executor::cause::{Cause, report};
use ichor_executor::talos_api::{
    ApplyConfigReply, ApplyConfigRequest, ApplyMode, BOOT_ID_PATH, EtcdAlarm, EtcdMember, EtcdStatus,
    INSTALL_OUTPUT_LINES, ImageInfo, InstallOutcome, InstallRequest, PullRequest, ResetRequest, SnapshotStream,
    TalosApi, TalosError, UpgradeAck, UpgradeRequest,
};
use ichor_executor::writes::{Seal, TalosWrite, TalosWritten};
use ichor_talosconfig::{Endpoint, TalosContext};
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use prost::Message;
use tonic::transport::Channel;

use super::connect::{ConnectError, Connector, TlsMaterialError, client_tls};
use super::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace, Metadata};
use super::proto::machine::image_service_client::ImageServiceClient;
use super::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use super::proto::machine::machine_service_client::MachineServiceClient;
use super::proto::machine::{self as pb, apply_configuration_request::Mode as WireMode};
use super::proto::resource::state_client::StateClient;
use super::proto::resource::{
    GetRequest, ListRequest, ListResponse, MachineConfigSpec, MachineStatusSpec, ManifestSpec, NodenameSpec,
    machine_status_spec::Stage,
};

/// The COSI type of Talos's bootstrap manifests (namespace `controlplane`).
pub const MANIFESTS: &str = "Manifests.kubernetes.talos.dev";

/// The client's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientOptions {
    /// How long connecting to one endpoint may take, TLS handshake included (default 15 s,
    /// the engine's dial bound).
    pub dial_timeout: Duration,
    /// The bound of a call whose request carries none of its own (default 15 s).
    pub call_timeout: Duration,
    /// The bound of a whole etcd snapshot stream (default 30 minutes: etcd's largest
    /// recommended database, 8 GiB, at about 5 MiB/s).
    pub snapshot_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            dial_timeout: Duration::from_secs(15),
            call_timeout: Duration::from_secs(15),
            snapshot_timeout: Duration::from_secs(30 * 60),
        }
    }
}

impl ClientOptions {
    /// These options with another call bound.
    #[must_use]
    pub fn with_call_timeout(mut self, bound: Duration) -> Self {
        self.call_timeout = bound;
        self
    }

    /// These options with another dial bound.
    #[must_use]
    pub fn with_dial_timeout(mut self, bound: Duration) -> Self {
        self.dial_timeout = bound;
        self
    }

    /// These options with another snapshot bound.
    #[must_use]
    pub fn with_snapshot_timeout(mut self, bound: Duration) -> Self {
        self.snapshot_timeout = bound;
        self
    }
}

/// An etcd snapshot written out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Bytes written.
    pub size: u64,
    /// SHA-256 of those bytes, lowercase hex.
    pub sha256: String,
}

/// A snapshot that could not be taken or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The Talos API failed.
    #[error(transparent)]
    Talos(#[from] TalosError),
    /// Writing the snapshot failed.
    #[error("writing the snapshot: {0}")]
    Write(#[from] std::io::Error),
    /// The stream did not end within its bound.
    #[error("the snapshot stream did not end within {0:?}")]
    TimedOut(Duration),
}

/// A talosconfig context that cannot make a client: found before any connection.
#[derive(Debug, thiserror::Error)]
#[error("talosconfig context {context:?}: {source}")]
pub struct ClientError {
    /// The context.
    pub context: String,
    /// What is wrong.
    #[source]
    pub source: TlsMaterialError,
}

/// The Talos machine API through a context's apid endpoints.
#[derive(Clone)]
pub struct TalosClient {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<Endpoint>,
    /// The Talos roles the client certificate names (`None`: not readable as X.509).
    roles: Option<Vec<String>>,
    tls: Arc<rustls::ClientConfig>,
    options: ClientOptions,
    /// One channel per endpoint, made on first use (a channel needs a running Tokio
    /// runtime, which a client built in `main` does not have yet) and dropped when its
    /// connection fails, so that the next call connects afresh.
    channels: Mutex<Vec<Option<Channel>>>,
}

impl std::fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosClient")
            .field("endpoints", &self.inner.endpoints)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl TalosClient {
    /// A client of the context's endpoints with its mutual-TLS material. Nothing connects
    /// until the first call, and this needs no Tokio runtime.
    ///
    /// # Errors
    /// A [`ClientError`] when the TLS material cannot form a client identity (a key that
    /// does not belong to the certificate, a key type TLS cannot use).
    pub fn new(context: &TalosContext, options: ClientOptions) -> Result<Self, ClientError> {
        let tls = client_tls(context).map_err(|source| ClientError { context: context.name.clone(), source })?;
        let channels = Mutex::new(vec![None; context.endpoints.len()]);
        let roles = context.roles();
        Ok(Self { inner: Arc::new(Inner { endpoints: context.endpoints.clone(), tls, options, channels, roles }) })
    }

    /// The endpoints in the order a call about `node` tries them: those that are not the
    /// node itself first, in the context's order.
    fn order(&self, node: &str) -> Vec<usize> {
        let node = node.trim_start_matches('[').trim_end_matches(']');
        let (others, itself): (Vec<usize>, Vec<usize>) =
            (0..self.inner.endpoints.len()).partition(|&i| self.inner.endpoints[i].host != node);
        others.into_iter().chain(itself).collect()
    }

    fn channel(&self, index: usize) -> Channel {
        let mut channels = self.inner.channels.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        channels[index]
            .get_or_insert_with(|| {
                let endpoint = &self.inner.endpoints[index];
                let connector = Connector {
                    endpoint: endpoint.clone(),
                    tls: Arc::clone(&self.inner.tls),
                    bound: self.inner.options.dial_timeout,
                };
                // The channel's own URI only names the connection; TLS is the connector's.
                // Requests carry the https origin apid expects.
                let origin = format!("https://{endpoint}").parse().expect("HOST:PORT forms a URI");
                tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
                    .expect("HOST:PORT forms a URI")
                    .origin(origin)
                    .connect_with_connector_lazy(connector)
            })
            .clone()
    }

    fn forget(&self, index: usize) {
        let mut channels = self.inner.channels.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        channels[index] = None;
    }

    /// Runs `call` through the endpoints for `node` until one connects; a call that may
    /// have been delivered is not sent again. The whole call, connecting included, ends
    /// within the dial bound plus `bound`.
    async fn call<T, F, Fut>(&self, node: &str, bound: Duration, call: F) -> Result<T, TalosError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut failed: Vec<TalosError> = Vec::new();
        for index in self.order(node) {
            let endpoint = self.inner.endpoints[index].to_string();
            let limit = self.inner.options.dial_timeout + bound;
            let error = match tokio::time::timeout(limit, call(self.channel(index))).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(status)) => classify(&status, &endpoint),
                Err(_) => TalosError::Transport { cause: Cause::message(format!("no answer within {limit:?}")) },
            };
            if matches!(error, TalosError::Dial { .. } | TalosError::Tls { .. } | TalosError::Transport { .. }) {
                self.forget(index);
            }
            if !error.never_sent() {
                return Err(error);
            }
            tracing::debug!(%endpoint, error = %report(&error), "endpoint failed; trying the next");
            failed.push(error);
        }
        Err(no_endpoint(failed))
    }

    async fn get(&self, node: &str, namespace: &str, kind: &str, id: &str) -> Result<Vec<u8>, TalosError> {
        let get = GetRequest { namespace: namespace.to_owned(), r#type: kind.to_owned(), id: id.to_owned() };
        let target = target(node)?;
        let bound = self.inner.options.call_timeout;
        let reply = self
            .call(node, bound, |channel| {
                let request = request(target.as_ref(), get.clone(), bound);
                async move { StateClient::new(channel).get(request).await }
            })
            .await?;
        let spec = reply
            .into_inner()
            .resource
            .and_then(|r| r.spec)
            .ok_or_else(|| answered("Unknown", format!("{kind} {id}: no spec")))?;
        Ok(spec.proto_spec)
    }

    /// A unary `MachineService` call under the ordinary bound, or `timeout` when given.
    async fn machine<Req, Resp, F, Fut>(
        &self,
        node: &str,
        message: Req,
        timeout: Option<Duration>,
        call: F,
    ) -> Result<Resp, TalosError>
    where
        Req: Clone,
        F: Fn(MachineServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let target = target(node)?;
        let bound = timeout.unwrap_or(self.inner.options.call_timeout);
        let reply = self
            .call(node, bound, |channel| {
                call(MachineServiceClient::new(channel), request(target.as_ref(), message.clone(), bound))
            })
            .await?;
        Ok(reply.into_inner())
    }

    /// `MachineService.EtcdSnapshot` into `out`: a consistent snapshot of etcd from the
    /// node, with its size and SHA-256. The stream ends within the snapshot bound
    /// ([`ClientOptions::snapshot_timeout`]). On an error `out` may hold part of it: use
    /// [`TalosClient::etcd_snapshot_to_file`] for a file that is either whole or absent.
    ///
    /// # Errors
    /// The classified API failure, a chunk carrying `metadata.error`, a failed write, or
    /// the bound passing.
    pub async fn etcd_snapshot(&self, node: &str, out: &mut impl std::io::Write) -> Result<Snapshot, SnapshotError> {
        use sha2::Digest;
        let bound = self.inner.options.snapshot_timeout;
        let target = target(node)?;
        let streaming = async {
            let response = self
                .call(node, bound, |channel| {
                    let request = request(target.as_ref(), pb::EtcdSnapshotRequest {}, bound);
                    async move { MachineServiceClient::new(channel).etcd_snapshot(request).await }
                })
                .await?;
            let mut stream = response.into_inner();
            let mut hasher = sha2::Sha256::new();
            let mut size = 0u64;
            while let Some(chunk) = stream.message().await.map_err(|status| classify(&status, "the snapshot stream"))? {
                if let Some(error) = chunk.metadata.as_ref().map(|m| m.error.clone()).filter(|e| !e.is_empty()) {
                    return Err(answered("Unknown", error).into());
                }
                hasher.update(&chunk.bytes);
                out.write_all(&chunk.bytes)?;
                size += chunk.bytes.len() as u64;
            }
            out.flush()?;
            let sha256 = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
            Ok(Snapshot { size, sha256 })
        };
        tokio::time::timeout(self.inner.options.dial_timeout + bound, streaming)
            .await
            .unwrap_or(Err(SnapshotError::TimedOut(bound)))
    }

    /// [`TalosClient::etcd_snapshot`] into the file at `path`, which appears only whole:
    /// the stream goes to a temporary file beside it, synced to disk, renamed into place
    /// once the stream ended cleanly; on any failure the temporary file is removed and
    /// `path` is untouched.
    ///
    /// # Errors
    /// As [`TalosClient::etcd_snapshot`], and a failure to create, sync or rename the file.
    pub async fn etcd_snapshot_to_file(&self, node: &str, path: &Path) -> Result<Snapshot, SnapshotError> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            Some(_) | None => Path::new("."),
        };
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let partial = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".partial").tempfile_in(dir)?;
        let mut out = std::io::BufWriter::new(partial);
        let snapshot = self.etcd_snapshot(node, &mut out).await?;
        let partial = out.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        partial.as_file().sync_all()?;
        partial.persist(path).map_err(|e| e.error)?;
        Ok(snapshot)
    }

    /// A server-streaming call through the endpoints for `node`, its messages gathered by
    /// `each` until the stream ends, the whole within the dial bound plus `bound`. A status
    /// in the stream is classified like the call's own.
    async fn stream<Req, Resp, F, Fut>(
        &self,
        node: &str,
        message: Req,
        bound: Duration,
        call: F,
        mut each: impl FnMut(Resp) -> Result<(), TalosError>,
    ) -> Result<(), TalosError>
    where
        Req: Clone,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, tonic::Status>>,
    {
        let target = target(node)?;
        let streaming = async {
            let response = self
                .call(node, bound, |channel| call(channel, request(target.as_ref(), message.clone(), bound)))
                .await?;
            let mut stream = response.into_inner();
            while let Some(reply) = stream.message().await.map_err(|status| classify(&status, "the stream"))? {
                each(reply)?;
            }
            Ok(())
        };
        tokio::time::timeout(self.inner.options.dial_timeout + bound, streaming).await.unwrap_or_else(|_| {
            Err(TalosError::Transport { cause: Cause::message(format!("the stream did not end within {bound:?}")) })
        })
    }

    /// `MachineService.Version`: the node's Talos version tag (such as `v1.14.3`).
    ///
    /// # Errors
    /// The classified failure.
    pub async fn version(&self, node: &str) -> Result<String, TalosError> {
        let reply = self.machine(node, (), None, |mut c, r| async move { c.version(r).await }).await?;
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(first.version.map(|v| v.tag).unwrap_or_default())
    }
}

/// The `system` containerd namespace (`talosctl image pull --namespace system`; talosctl's
/// default is `cri`, workloads' images): where `LifecycleService.Upgrade` takes its
/// installer from.
fn system_namespace() -> ContainerdInstance {
    ContainerdInstance { driver: ContainerDriver::Cri as i32, namespace: ContainerdNamespace::NsSystem as i32 }
}

/// An apply mode as `ApplyConfigurationRequest.Mode` numbers it.
pub(super) fn wire_mode(mode: ApplyMode) -> WireMode {
    match mode {
        ApplyMode::Reboot => WireMode::Reboot,
        ApplyMode::Auto => WireMode::Auto,
        ApplyMode::NoReboot => WireMode::NoReboot,
        ApplyMode::Staged => WireMode::Staged,
        ApplyMode::Try => WireMode::Try,
    }
}

/// The apply mode numbered `number` on the wire; `None` for a number the subset does not
/// know.
pub(super) fn apply_mode(number: i32) -> Option<ApplyMode> {
    Some(match WireMode::try_from(number).ok()? {
        WireMode::Reboot => ApplyMode::Reboot,
        WireMode::Auto => ApplyMode::Auto,
        WireMode::NoReboot => ApplyMode::NoReboot,
        WireMode::Staged => ApplyMode::Staged,
        WireMode::Try => ApplyMode::Try,
    })
}

/// The `node` metadata value that routes a call to `node` through apid; none for an empty
/// name (the endpoint's own node).
fn target(node: &str) -> Result<Option<tonic::metadata::AsciiMetadataValue>, TalosError> {
    if node.is_empty() {
        return Ok(None);
    }
    node.parse().map(Some).map_err(|_| TalosError::Answered {
        code: "InvalidArgument".to_owned(),
        message: format!("node {node:?} cannot be sent as gRPC metadata"),
    })
}

/// A request for `target` with `timeout` as its gRPC deadline.
fn request<T>(
    target: Option<&tonic::metadata::AsciiMetadataValue>,
    message: T,
    timeout: Duration,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(node) = target {
        request.metadata_mut().insert("node", node.clone());
    }
    request.set_timeout(timeout);
    request
}

fn answered(code: &str, message: String) -> TalosError {
    TalosError::Answered { code: code.to_owned(), message }
}

/// Classifies a failed call. A status the server sent carries no source: it is an answer,
/// classified by its code. A status made on this side carries the failure underneath: a
/// failed connection ([`ConnectError`]: dial or TLS, never sent), or a call that broke off.
fn classify(status: &tonic::Status, endpoint: &str) -> TalosError {
    let Some(source) = std::error::Error::source(status) else {
        return TalosError::answer(&format!("{:?}", status.code()), status.message());
    };
    let connect = std::iter::successors(Some(source), |e| e.source()).find_map(|e| e.downcast_ref::<ConnectError>());
    match connect {
        Some(error) if error.is_tls() => {
            TalosError::Tls { endpoint: endpoint.to_owned(), cause: Cause::capture(error) }
        }
        Some(error) => TalosError::Dial { endpoint: endpoint.to_owned(), cause: Cause::capture(error) },
        None => TalosError::Transport { cause: Cause::capture(source) },
    }
}

/// The failure of a call that no endpoint took: a TLS failure first (it needs a person,
/// and is likely the same for every endpoint), else every endpoint's reason.
fn no_endpoint(mut failed: Vec<TalosError>) -> TalosError {
    if let Some(tls) = failed.iter().position(|e| matches!(e, TalosError::Tls { .. })) {
        return failed.swap_remove(tls);
    }
    if failed.len() == 1 {
        return failed.remove(0);
    }
    let endpoints = failed
        .iter()
        .filter_map(|e| match e {
            TalosError::Dial { endpoint, .. } => Some(endpoint.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(", ");
    let causes = failed.iter().map(|e| report(e)).collect::<Vec<_>>().join("; ");
    TalosError::Dial { endpoint: endpoints, cause: Cause::message(causes) }
}

/// The first reply of a multi-node envelope, with its `metadata.error` treated as an error.
fn first_reply<T>(messages: Vec<T>, metadata: impl Fn(&T) -> Option<&Metadata>) -> Result<T, TalosError> {
    let first = messages.into_iter().next().ok_or_else(|| answered("Unknown", "an empty reply".to_owned()))?;
    if let Some(error) = metadata(&first).map(|m| m.error.clone()).filter(|e| !e.is_empty()) {
        return Err(answered("Unknown", error));
    }
    Ok(first)
}

impl TalosClient {
    /// `MachineService.Upgrade`: blocks while the node pulls and checks the installer.
    pub async fn upgrade(&self, node: &str, request: &UpgradeRequest) -> Result<UpgradeAck, TalosError> {
        // Neither force nor preserve; the call's remaining bound travels as its deadline.
        let message = pb::UpgradeRequest { image: request.image.clone(), ..pb::UpgradeRequest::default() };
        let reply =
            self.machine(node, message, Some(request.timeout), |mut c, r| async move { c.upgrade(r).await }).await?;
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(UpgradeAck { ack: first.ack, actor_id: first.actor_id })
    }

    /// `EtcdLeaveCluster`: the node's etcd member leaves the cluster.
    pub async fn etcd_leave_cluster(&self, node: &str) -> Result<(), TalosError> {
        let message = pb::EtcdLeaveClusterRequest {};
        let reply = self.machine(node, message, None, |mut c, r| async move { c.etcd_leave_cluster(r).await }).await?;
        first_reply(reply.messages, |m| m.metadata.as_ref()).map(drop)
    }

    /// `EtcdRemoveMemberByID`, asked of `node` (another control plane).
    pub async fn etcd_remove_member(&self, node: &str, member_id: u64) -> Result<(), TalosError> {
        let message = pb::EtcdRemoveMemberByIdRequest { member_id };
        let reply =
            self.machine(node, message, None, |mut c, r| async move { c.etcd_remove_member_by_id(r).await }).await?;
        first_reply(reply.messages, |m| m.metadata.as_ref()).map(drop)
    }

    /// `MachineService.Reset`: the node wipes itself.
    pub async fn reset(&self, node: &str, request: &ResetRequest) -> Result<(), TalosError> {
        let message = pb::ResetRequest { graceful: request.graceful, reboot: request.reboot };
        let reply = self.machine(node, message, None, |mut c, r| async move { c.reset(r).await }).await?;
        first_reply(reply.messages, |m| m.metadata.as_ref()).map(drop)
    }

    /// `ImageService.Pull` into the node's `system` containerd namespace: the pulled image's name.
    pub async fn image_pull(&self, node: &str, pull: &PullRequest) -> Result<String, TalosError> {
        use pb::image_service_pull_response::Response;
        let message =
            pb::ImageServicePullRequest { containerd: Some(system_namespace()), image_ref: pull.image.clone() };
        let mut name = None;
        self.stream(
            node,
            message,
            pull.timeout,
            |channel, r| async move { ImageServiceClient::new(channel).pull(r).await },
            |reply: pb::ImageServicePullResponse| {
                if let Some(Response::Name(pulled)) = reply.response {
                    name = Some(pulled);
                }
                Ok(())
            },
        )
        .await?;
        name.ok_or_else(|| TalosError::transport(format!("the pull of {} ended without the image's name", pull.image)))
    }

    /// `LifecycleService.Upgrade`, to the installer's exit code.
    pub async fn lifecycle_upgrade(&self, node: &str, install: &InstallRequest) -> Result<InstallOutcome, TalosError> {
        self.lifecycle_upgrade_reporting(node, install, &std::sync::atomic::AtomicBool::new(false)).await
    }

    /// [`Self::lifecycle_upgrade`], setting `started` once the node answered that the install began.
    pub async fn lifecycle_upgrade_reporting(
        &self,
        node: &str,
        install: &InstallRequest,
        started: &std::sync::atomic::AtomicBool,
    ) -> Result<InstallOutcome, TalosError> {
        use pb::lifecycle_service_install_progress::Response;
        let message = pb::LifecycleServiceUpgradeRequest {
            containerd: Some(system_namespace()),
            source: Some(pb::InstallArtifactsSource { image_name: install.image.clone() }),
        };
        let mut output: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let mut exit_code = None;
        self.stream(
            node,
            message,
            install.timeout,
            |channel, r| async move { LifecycleServiceClient::new(channel).upgrade(r).await },
            |reply: pb::LifecycleServiceUpgradeResponse| {
                // Any message: the node took its install lock and runs the installer.
                started.store(true, std::sync::atomic::Ordering::Relaxed);
                match reply.progress.and_then(|p| p.response) {
                    Some(Response::Message(line)) => {
                        if output.len() == INSTALL_OUTPUT_LINES {
                            output.pop_front();
                        }
                        output.push_back(line);
                    }
                    Some(Response::ExitCode(code)) => exit_code = Some(code),
                    None => {}
                }
                Ok(())
            },
        )
        .await?;
        let exit_code = exit_code
            .ok_or_else(|| TalosError::transport("the install stream ended without the installer's exit code"))?;
        Ok(InstallOutcome { exit_code, output: output.into() })
    }

    /// `MachineService.ApplyConfiguration` (or its dry run).
    pub async fn apply_configuration(
        &self,
        node: &str,
        request: &ApplyConfigRequest,
    ) -> Result<ApplyConfigReply, TalosError> {
        // No try_mode_timeout: the request has none (Talos's default applies to TRY).
        let message = pb::ApplyConfigurationRequest {
            data: request.data.clone(),
            mode: wire_mode(request.mode) as i32,
            dry_run: request.dry_run,
            try_mode_timeout: None,
        };
        let reply = self.machine(node, message, None, |mut c, r| async move { c.apply_configuration(r).await }).await?;
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        let mode = apply_mode(first.mode).ok_or_else(|| {
            answered("Unknown", format!("ApplyConfiguration answered an unknown mode {}", first.mode))
        })?;
        Ok(ApplyConfigReply { mode, mode_details: first.mode_details, warnings: first.warnings })
    }

    /// `MachineService.Reboot` in the default mode: the actor ID.
    pub async fn reboot(&self, node: &str) -> Result<String, TalosError> {
        let message = pb::RebootRequest { mode: pb::reboot_request::Mode::Default as i32 };
        let reply = self.machine(node, message, None, |mut c, r| async move { c.reboot(r).await }).await?;
        Ok(first_reply(reply.messages, |m| m.metadata.as_ref())?.actor_id)
    }
}

#[async_trait]
impl TalosApi for TalosClient {
    async fn write(&self, node: &str, write: TalosWrite<'_>, _seal: Seal) -> Result<TalosWritten, TalosError> {
        Ok(match write {
            TalosWrite::Upgrade(request) => TalosWritten::Upgrade(self.upgrade(node, request).await?),
            TalosWrite::ApplyConfiguration(request) => {
                TalosWritten::ApplyConfiguration(self.apply_configuration(node, request).await?)
            }
            TalosWrite::Install { request, started } => {
                TalosWritten::Install(self.lifecycle_upgrade_reporting(node, request, started).await?)
            }
            TalosWrite::Reboot => TalosWritten::Reboot(self.reboot(node).await?),
            TalosWrite::EtcdLeaveCluster => {
                self.etcd_leave_cluster(node).await?;
                TalosWritten::EtcdLeaveCluster
            }
            TalosWrite::EtcdRemoveMember { member_id } => {
                self.etcd_remove_member(node, member_id).await?;
                TalosWritten::EtcdRemoveMember
            }
            TalosWrite::Reset(request) => {
                self.reset(node, request).await?;
                TalosWritten::Reset
            }
            TalosWrite::ImagePull(request) => TalosWritten::ImagePull(self.image_pull(node, request).await?),
        })
    }

    fn client_roles(&self) -> Option<Vec<String>> {
        self.inner.roles.clone()
    }

    async fn nodename(&self, node: &str) -> Result<String, TalosError> {
        let spec = self.get(node, "k8s", "Nodenames.kubernetes.talos.dev", "nodename").await?;
        let spec = NodenameSpec::decode(spec.as_slice()).map_err(|e| answered("DataLoss", e.to_string()))?;
        Ok(spec.nodename)
    }

    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError> {
        let spec = self.get(node, "runtime", "MachineStatuses.runtime.talos.dev", "machine").await?;
        let spec = MachineStatusSpec::decode(spec.as_slice()).map_err(|e| answered("DataLoss", e.to_string()))?;
        Ok(match spec.stage() {
            Stage::Booting => MachineStage::Booting,
            Stage::Installing => MachineStage::Installing,
            Stage::Maintenance => MachineStage::Maintenance,
            Stage::Running => MachineStage::Running,
            Stage::Rebooting => MachineStage::Rebooting,
            Stage::ShuttingDown => MachineStage::ShuttingDown,
            Stage::Resetting => MachineStage::Resetting,
            Stage::Upgrading => MachineStage::Upgrading,
            Stage::Unknown => MachineStage::Unknown,
        })
    }

    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        let message = pb::EtcdMemberListRequest { query_local: false };
        let reply = self.machine(node, message, None, |mut c, r| async move { c.etcd_member_list(r).await }).await?;
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(first
            .members
            .into_iter()
            .map(|m| EtcdMember { id: m.id, hostname: m.hostname, is_learner: m.is_learner })
            .collect())
    }

    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        let reply = self.machine(node, (), None, |mut c, r| async move { c.etcd_status(r).await }).await?;
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        let status = first.member_status.ok_or_else(|| answered("Unknown", "no member status".to_owned()))?;
        Ok(EtcdStatus {
            member_id: status.member_id,
            leader: status.leader,
            errors: status.errors,
            is_learner: status.is_learner,
        })
    }

    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError> {
        let reply = self.machine(node, (), None, |mut c, r| async move { c.etcd_alarm_list(r).await }).await?;
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(first.member_alarms.into_iter().map(|a| EtcdAlarm { member_id: a.member_id, kind: a.alarm }).collect())
    }

    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        let bound = self.inner.options.snapshot_timeout;
        let target = target(node)?;
        let response = self
            .call(node, bound, |channel| {
                let request = request(target.as_ref(), pb::EtcdSnapshotRequest {}, bound);
                async move { MachineServiceClient::new(channel).etcd_snapshot(request).await }
            })
            .await?;
        // Each chunk as it comes; an error ends the stream (the caller aborts the copy).
        let chunks = futures::stream::unfold(Some(response.into_inner()), |stream| async move {
            let mut stream = stream?;
            match stream.message().await {
                Ok(Some(chunk)) => match chunk.metadata.as_ref().map(|m| m.error.clone()).filter(|e| !e.is_empty()) {
                    Some(error) => Some((Err(answered("Unknown", error)), None)),
                    None => Some((Ok(chunk.bytes), Some(stream))),
                },
                Ok(None) => None,
                Err(status) => Some((Err(classify(&status, "the snapshot stream")), None)),
            }
        });
        Ok(Box::pin(chunks))
    }

    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        let message = pb::ImageServiceListRequest { containerd: Some(system_namespace()) };
        let mut images = Vec::new();
        self.stream(
            node,
            message,
            self.inner.options.call_timeout,
            |channel, r| async move { ImageServiceClient::new(channel).list(r).await },
            |image: pb::ImageServiceListResponse| {
                images.push(ImageInfo { name: image.name, digest: image.digest, size: image.size });
                Ok(())
            },
        )
        .await?;
        Ok(images)
    }

    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        // The installer's PID record exists while its task runs (pid.NewStateRecorder).
        match self.get(node, "runtime", "ServicePIDs.runtime.talos.dev", "installer").await {
            Ok(_) => Ok(Some(true)),
            Err(TalosError::Answered { code, .. }) if code == "NotFound" => Ok(Some(false)),
            Err(e) => Err(e),
        }
    }

    async fn machine_config(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        let spec = self.get(node, "config", "MachineConfigs.config.talos.dev", "v1alpha1").await?;
        let spec = MachineConfigSpec::decode(spec.as_slice()).map_err(|e| answered("DataLoss", e.to_string()))?;
        Ok(spec.yaml_marshalled)
    }

    async fn bootstrap_manifests(&self, node: &str) -> Result<Vec<serde_json::Value>, TalosError> {
        let list = ListRequest { namespace: "controlplane".to_owned(), r#type: MANIFESTS.to_owned() };
        let mut specs: Vec<(String, Vec<u8>)> = Vec::new();
        let bound = self.inner.options.call_timeout;
        self.stream(
            node,
            list,
            bound,
            |channel, r| async move { StateClient::new(channel).list(r).await },
            |reply: ListResponse| {
                let resource = reply.resource.unwrap_or_default();
                let id = resource.metadata.map(|m| m.id).unwrap_or_default();
                specs.push((id, resource.spec.map(|s| s.proto_spec).unwrap_or_default()));
                Ok(())
            },
        )
        .await?;
        // In the resources' order (`05-flannel` before `10-kube-proxy`), as Talos applies.
        specs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut objects = Vec::new();
        for (id, bytes) in specs {
            let spec = ManifestSpec::decode(bytes.as_slice())
                .map_err(|e| answered("DataLoss", format!("{MANIFESTS} {id}: {e}")))?;
            objects.extend(super::manifests::objects(&spec));
        }
        Ok(objects)
    }

    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        let message = pb::ReadRequest { path: BOOT_ID_PATH.to_owned() };
        let mut bytes = Vec::new();
        self.stream(
            node,
            message,
            self.inner.options.call_timeout,
            |channel, r| async move { MachineServiceClient::new(channel).read(r).await },
            collect_into(&mut bytes),
        )
        .await?;
        let text = String::from_utf8(bytes).map_err(|_| answered("DataLoss", "the boot ID is not UTF-8".to_owned()))?;
        Ok(text.trim().to_owned())
    }

    async fn talos_version(&self, node: &str) -> Result<String, TalosError> {
        self.version(node).await
    }

    async fn admin_kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        let mut archive = Vec::new();
        self.stream(
            node,
            (),
            self.inner.options.call_timeout,
            |channel, r| async move { MachineServiceClient::new(channel).kubeconfig(r).await },
            collect_into(&mut archive),
        )
        .await?;
        super::kubeconfig::unpack(&archive).map_err(|e| answered("DataLoss", format!("the admin kubeconfig: {e}")))
    }
}

/// A stream of `common.Data` chunks gathered into `bytes`; a chunk whose metadata carries
/// an error ends it with that error.
fn collect_into(bytes: &mut Vec<u8>) -> impl FnMut(super::proto::common::Data) -> Result<(), TalosError> + '_ {
    |chunk| {
        if let Some(error) = chunk.metadata.as_ref().map(|m| m.error.clone()).filter(|e| !e.is_empty()) {
            return Err(answered("Unknown", error));
        }
        bytes.extend_from_slice(&chunk.bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_the_server_sent_is_an_answer_classified_by_its_code() {
        let unavailable =
            tonic::Status::unavailable("connection error: dial tcp 10.5.0.3:50000: connect: connection refused");
        let e = classify(&unavailable, "10.5.0.2:50000");
        assert!(matches!(&e, TalosError::Unreachable { code, .. } if code == "Unavailable"), "{e:?}");
        assert!(e.is_unreachable() && !e.never_sent());
        for code in [tonic::Code::DeadlineExceeded, tonic::Code::Cancelled, tonic::Code::Aborted] {
            assert!(classify(&tonic::Status::new(code, "x"), "e").is_unreachable(), "{code:?}");
        }
        let refused = classify(&tonic::Status::failed_precondition("locked"), "e");
        assert_eq!(refused, TalosError::Answered { code: "FailedPrecondition".into(), message: "locked".into() });
        assert!(!refused.is_unreachable());
    }

    #[test]
    fn a_status_made_on_this_side_keeps_its_cause() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let connect =
            ConnectError::Tcp { addr: "127.0.0.1:1".parse().unwrap(), summary: "connection refused", source: refused };
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(connect))));
        let e = classify(&status, "127.0.0.1:1");
        assert!(matches!(e, TalosError::Dial { .. }) && e.never_sent(), "{e:?}");
        let line = report(&e);
        assert!(line.contains("connection refused") && line.contains("os error 111"), "{line}");
    }

    #[test]
    fn several_endpoints_that_failed_are_all_named_and_tls_wins() {
        let dial = |endpoint: &str| TalosError::dial(endpoint, "connection refused");
        let both = no_endpoint(vec![dial("a:1"), dial("b:2")]);
        assert!(matches!(&both, TalosError::Dial { endpoint, .. } if endpoint == "a:1, b:2"), "{both:?}");
        assert!(report(&both).contains("b:2: connection refused"), "{}", report(&both));
        let tls =
            TalosError::Tls { endpoint: "b:2".into(), cause: Cause::message("received fatal alert: BadCertificate") };
        assert_eq!(no_endpoint(vec![dial("a:1"), tls.clone()]), tls);
    }
}
