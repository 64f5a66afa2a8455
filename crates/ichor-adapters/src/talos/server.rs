//! A Talos API (apid) in front of any [`TalosApi`] that is [`Served`]: the gRPC services
//! of Ichor's proto subset, each call routed by its `node` metadata to the implementation,
//! its errors answered as apid answers them (a node it cannot reach: `Unavailable`).
//!
//! This is how the simulated fleet (`ichor_sim::fleet`: the simulator on a real API server) is reached by a
//! real Talos client: the operator runs exactly as in production, with a talosconfig, over
//! mutual TLS.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use async_trait::async_trait;
use ichor_executor::cause::report;
use ichor_executor::talos_api::{
    ApplyConfigRequest, BOOT_ID_PATH, InstallRequest, PullRequest, ResetRequest, TalosApi, TalosError, UpgradeRequest,
};
use ichor_executor::writes::{TalosWrite, TalosWritten};
use ichor_upgrade_core::machine::vocabulary::MachineStage;
use prost::Message;
use tonic::{Code, Request, Response, Status};

use super::client::{apply_mode, wire_mode};
use super::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace, Data};
use super::proto::machine::image_service_server::{ImageService, ImageServiceServer};
use super::proto::machine::lifecycle_service_server::{LifecycleService, LifecycleServiceServer};
use super::proto::machine::machine_service_server::{MachineService, MachineServiceServer};
use super::proto::machine::{self as pb};
use super::proto::resource::state_server::{State, StateServer};
use super::proto::resource::{
    GetRequest, GetResponse, ListRequest, ListResponse, MachineConfigSpec, MachineStatusSpec, Metadata, NodenameSpec,
    Resource, Spec, machine_status_spec::Stage,
};

/// The backend a stand-in serves: a [`TalosApi`] that also takes writes from the gRPC
/// peer rather than from the executor's effects. [`TalosApi::write`] asks for a
/// [`Seal`](ichor_executor::writes::Seal), which only the effects make; [`Served::serve`]
/// needs none, because the peer is a test's client (or the operator in front of a
/// simulated fleet), never the executor in this process.
#[async_trait]
pub trait Served: TalosApi {
    /// Carries out `write` on `node`, as [`TalosApi::write`] would, its answer of the
    /// write's own kind.
    async fn serve(&self, node: &str, write: TalosWrite<'_>) -> Result<TalosWritten, TalosError>;
}

/// Every service (`MachineService`, the resource `State`, `ImageService`,
/// `LifecycleService`), ready for `tonic::transport::Server::add_routes`.
pub fn services<T: Served + 'static>(api: Arc<T>) -> tonic::service::Routes {
    let apid = Apid { api };
    tonic::service::Routes::new(MachineServiceServer::new(apid.clone()))
        .add_service(StateServer::new(apid.clone()))
        .add_service(ImageServiceServer::new(apid.clone()))
        .add_service(LifecycleServiceServer::new(apid))
}

/// Which containerd namespace a call about images names. The engine's API holds the
/// `system` one (where the lifecycle install takes its installer from); the CRI one
/// (`k8s.io`, talosctl's default) holds workloads' images, which no engine model keeps:
/// a pull there is answered as done and a list there is empty, the node answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Namespace {
    System,
    Cri,
}

fn namespace(containerd: Option<&ContainerdInstance>) -> Result<Namespace, Status> {
    let of = |namespace: ContainerdNamespace| ContainerdInstance {
        driver: ContainerDriver::Cri as i32,
        namespace: namespace as i32,
    };
    match containerd {
        Some(c) if *c == of(ContainerdNamespace::NsSystem) => Ok(Namespace::System),
        Some(c) if *c == of(ContainerdNamespace::NsCri) => Ok(Namespace::Cri),
        other => Err(Status::invalid_argument(format!("no such containerd namespace: {other:?}"))),
    }
}

/// The Talos API services over `T`.
pub struct Apid<T> {
    api: Arc<T>,
}

impl<T> Clone for Apid<T> {
    fn clone(&self) -> Self {
        Self { api: Arc::clone(&self.api) }
    }
}

/// The node a call is routed to.
fn node<M>(request: &Request<M>) -> Result<String, Status> {
    request
        .metadata()
        .get("node")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Status::invalid_argument("a call must name its node (the `node` metadata key)"))
}

/// The call's gRPC deadline, if it carries one (`grpc-timeout`, such as `540000m`).
fn deadline<M>(request: &Request<M>) -> Option<Duration> {
    let text = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (value, unit) = text.split_at(text.len().checked_sub(1)?);
    let value: u64 = value.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// A failure answered as apid answers it.
fn status(error: &TalosError) -> Status {
    match error {
        TalosError::Dial { .. } | TalosError::Transport { .. } | TalosError::Tls { .. } => {
            Status::unavailable(format!("connection error: {}", report(error)))
        }
        TalosError::Unreachable { code, message } | TalosError::Answered { code, message } => {
            Status::new(code_of(code), message.clone())
        }
    }
}

fn code_of(name: &str) -> Code {
    match name {
        "Cancelled" => Code::Cancelled,
        "InvalidArgument" => Code::InvalidArgument,
        "DeadlineExceeded" => Code::DeadlineExceeded,
        "NotFound" => Code::NotFound,
        "AlreadyExists" => Code::AlreadyExists,
        "PermissionDenied" => Code::PermissionDenied,
        "ResourceExhausted" => Code::ResourceExhausted,
        "FailedPrecondition" => Code::FailedPrecondition,
        "Aborted" => Code::Aborted,
        "OutOfRange" => Code::OutOfRange,
        "Unimplemented" => Code::Unimplemented,
        "Internal" => Code::Internal,
        "Unavailable" => Code::Unavailable,
        "DataLoss" => Code::DataLoss,
        "Unauthenticated" => Code::Unauthenticated,
        _ => Code::Unknown,
    }
}

#[tonic::async_trait]
impl<T: Served + 'static> MachineService for Apid<T> {
    async fn apply_configuration(
        &self,
        request: Request<pb::ApplyConfigurationRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        let node = node(&request)?;
        let message = request.into_inner();
        let mode = apply_mode(message.mode)
            .ok_or_else(|| Status::invalid_argument(format!("unknown apply mode {}", message.mode)))?;
        let call = ApplyConfigRequest { data: message.data, mode, dry_run: message.dry_run };
        let reply = self
            .api
            .serve(&node, TalosWrite::ApplyConfiguration(&call))
            .await
            .and_then(TalosWritten::apply_configuration)
            .map_err(|e| status(&e))?;
        let applied = pb::ApplyConfiguration {
            metadata: None,
            warnings: reply.warnings,
            mode: wire_mode(reply.mode) as i32,
            mode_details: reply.mode_details,
        };
        Ok(Response::new(pb::ApplyConfigurationResponse { messages: vec![applied] }))
    }

    async fn version(&self, request: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        let node = node(&request)?;
        let tag = self.api.talos_version(&node).await.map_err(|e| status(&e))?;
        let hostname = self.api.nodename(&node).await.unwrap_or_default();
        // As apid answers: one message per node, its hostname in the metadata.
        let version = pb::Version {
            metadata: Some(super::proto::common::Metadata { hostname, ..Default::default() }),
            version: Some(pb::VersionInfo {
                tag,
                os: "linux".to_owned(),
                arch: "amd64".to_owned(),
                ..pb::VersionInfo::default()
            }),
            platform: Some(pb::PlatformInfo { name: "metal".to_owned(), mode: "metal".to_owned() }),
        };
        Ok(Response::new(pb::VersionResponse { messages: vec![version] }))
    }

    async fn upgrade(&self, request: Request<pb::UpgradeRequest>) -> Result<Response<pb::UpgradeResponse>, Status> {
        let node = node(&request)?;
        let timeout = deadline(&request).unwrap_or(Duration::from_secs(600));
        let call = UpgradeRequest { image: request.into_inner().image, timeout };
        let ack = self
            .api
            .serve(&node, TalosWrite::Upgrade(&call))
            .await
            .and_then(TalosWritten::upgrade)
            .map_err(|e| status(&e))?;
        let reply = pb::Upgrade { metadata: None, ack: ack.ack, actor_id: ack.actor_id };
        Ok(Response::new(pb::UpgradeResponse { messages: vec![reply] }))
    }

    async fn reboot(&self, request: Request<pb::RebootRequest>) -> Result<Response<pb::RebootResponse>, Status> {
        let node = node(&request)?;
        if request.get_ref().mode != pb::reboot_request::Mode::Default as i32 {
            return Err(Status::unimplemented("only the default reboot mode is served"));
        }
        let actor_id =
            self.api.serve(&node, TalosWrite::Reboot).await.and_then(TalosWritten::reboot).map_err(|e| status(&e))?;
        Ok(Response::new(pb::RebootResponse { messages: vec![pb::Reboot { metadata: None, actor_id }] }))
    }

    type ReadStream = futures::stream::BoxStream<'static, Result<Data, Status>>;

    async fn read(&self, request: Request<pb::ReadRequest>) -> Result<Response<Self::ReadStream>, Status> {
        let node = node(&request)?;
        if request.get_ref().path != BOOT_ID_PATH {
            return Err(Status::permission_denied(format!("only {BOOT_ID_PATH} is served")));
        }
        let boot_id = self.api.boot_id(&node).await.map_err(|e| status(&e))?;
        let chunk = Data { metadata: None, bytes: format!("{boot_id}\n").into_bytes() };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(chunk)]))))
    }

    async fn reset(&self, request: Request<pb::ResetRequest>) -> Result<Response<pb::ResetResponse>, Status> {
        let node = node(&request)?;
        let message = request.into_inner();
        let call = ResetRequest { graceful: message.graceful, reboot: message.reboot };
        let write = TalosWrite::Reset(&call);
        self.api.serve(&node, write).await.and_then(|done| done.done(&write)).map_err(|e| status(&e))?;
        Ok(Response::new(pb::ResetResponse { messages: vec![pb::Reset::default()] }))
    }

    async fn etcd_member_list(
        &self,
        request: Request<pb::EtcdMemberListRequest>,
    ) -> Result<Response<pb::EtcdMemberListResponse>, Status> {
        let node = node(&request)?;
        let members = self.api.etcd_members(&node).await.map_err(|e| status(&e))?;
        let members = members
            .into_iter()
            .map(|m| pb::EtcdMember {
                id: m.id,
                hostname: m.hostname,
                is_learner: m.is_learner,
                ..pb::EtcdMember::default()
            })
            .collect();
        Ok(Response::new(pb::EtcdMemberListResponse {
            messages: vec![pb::EtcdMembers { metadata: None, legacy_members: vec![], members }],
        }))
    }

    async fn etcd_status(&self, request: Request<()>) -> Result<Response<pb::EtcdStatusResponse>, Status> {
        let node = node(&request)?;
        let s = self.api.etcd_status(&node).await.map_err(|e| status(&e))?;
        let member_status = pb::EtcdMemberStatus {
            member_id: s.member_id,
            leader: s.leader,
            errors: s.errors,
            is_learner: s.is_learner,
            ..pb::EtcdMemberStatus::default()
        };
        Ok(Response::new(pb::EtcdStatusResponse {
            messages: vec![pb::EtcdStatus { metadata: None, member_status: Some(member_status) }],
        }))
    }

    async fn etcd_alarm_list(&self, request: Request<()>) -> Result<Response<pb::EtcdAlarmListResponse>, Status> {
        let node = node(&request)?;
        let alarms = self.api.etcd_alarms(&node).await.map_err(|e| status(&e))?;
        let member_alarms =
            alarms.into_iter().map(|a| pb::EtcdMemberAlarm { member_id: a.member_id, alarm: a.kind }).collect();
        Ok(Response::new(pb::EtcdAlarmListResponse { messages: vec![pb::EtcdAlarm { metadata: None, member_alarms }] }))
    }

    type KubeconfigStream = futures::stream::BoxStream<'static, Result<Data, Status>>;

    async fn kubeconfig(&self, request: Request<()>) -> Result<Response<Self::KubeconfigStream>, Status> {
        let node = node(&request)?;
        let kubeconfig = self.api.admin_kubeconfig(&node).await.map_err(|e| status(&e))?;
        let archive = super::kubeconfig::pack(&kubeconfig).map_err(|e| Status::internal(e.to_string()))?;
        let chunk = Data { metadata: None, bytes: archive };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(chunk)]))))
    }

    type EtcdSnapshotStream = futures::stream::BoxStream<'static, Result<Data, Status>>;

    async fn etcd_snapshot(
        &self,
        request: Request<pb::EtcdSnapshotRequest>,
    ) -> Result<Response<Self::EtcdSnapshotStream>, Status> {
        let node = node(&request)?;
        let chunks = self.api.etcd_snapshot(&node).await.map_err(|e| status(&e))?;
        let data = futures::StreamExt::map(chunks, |chunk| match chunk {
            Ok(bytes) => Ok(Data { metadata: None, bytes }),
            Err(e) => Err(status(&e)),
        });
        Ok(Response::new(Box::pin(data)))
    }

    async fn etcd_leave_cluster(
        &self,
        request: Request<pb::EtcdLeaveClusterRequest>,
    ) -> Result<Response<pb::EtcdLeaveClusterResponse>, Status> {
        let node = node(&request)?;
        let write = TalosWrite::EtcdLeaveCluster;
        self.api.serve(&node, write).await.and_then(|done| done.done(&write)).map_err(|e| status(&e))?;
        Ok(Response::new(pb::EtcdLeaveClusterResponse { messages: vec![pb::EtcdLeaveCluster { metadata: None }] }))
    }

    async fn etcd_remove_member_by_id(
        &self,
        request: Request<pb::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<pb::EtcdRemoveMemberByIdResponse>, Status> {
        let node = node(&request)?;
        let id = request.get_ref().member_id;
        let write = TalosWrite::EtcdRemoveMember { member_id: id };
        self.api.serve(&node, write).await.and_then(|done| done.done(&write)).map_err(|e| status(&e))?;
        Ok(Response::new(pb::EtcdRemoveMemberByIdResponse { messages: vec![pb::EtcdRemoveMemberById::default()] }))
    }
}

#[tonic::async_trait]
impl<T: Served + 'static> ImageService for Apid<T> {
    type ListStream = futures::stream::BoxStream<'static, Result<pb::ImageServiceListResponse, Status>>;

    async fn list(&self, request: Request<pb::ImageServiceListRequest>) -> Result<Response<Self::ListStream>, Status> {
        let node = node(&request)?;
        if namespace(request.get_ref().containerd.as_ref())? == Namespace::Cri {
            self.api.nodename(&node).await.map_err(|e| status(&e))?;
            return Ok(Response::new(Box::pin(futures::stream::empty())));
        }
        let images = self.api.image_list(&node).await.map_err(|e| status(&e))?;
        let replies: Vec<Result<pb::ImageServiceListResponse, Status>> = images
            .into_iter()
            .map(|i| {
                Ok(pb::ImageServiceListResponse {
                    name: i.name,
                    digest: i.digest,
                    size: i.size,
                    ..pb::ImageServiceListResponse::default()
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(replies))))
    }

    type PullStream = futures::stream::BoxStream<'static, Result<pb::ImageServicePullResponse, Status>>;

    /// The pull, then its one progress line (every layer there) and the image's name.
    async fn pull(&self, request: Request<pb::ImageServicePullRequest>) -> Result<Response<Self::PullStream>, Status> {
        use pb::image_service_pull_response::Response as Reply;
        let node = node(&request)?;
        let timeout = deadline(&request).unwrap_or(Duration::from_secs(600));
        let space = namespace(request.get_ref().containerd.as_ref())?;
        let image = request.into_inner().image_ref;
        let name = match space {
            Namespace::System => {
                let call = PullRequest { image, timeout };
                self.api
                    .serve(&node, TalosWrite::ImagePull(&call))
                    .await
                    .and_then(TalosWritten::image_pull)
                    .map_err(|e| status(&e))?
            }
            Namespace::Cri => {
                self.api.nodename(&node).await.map_err(|e| status(&e))?;
                image
            }
        };
        let done = pb::ImageServicePullProgress {
            layer_id: "sha256:installer".to_owned(),
            progress: Some(pb::ImageServicePullLayerProgress {
                status: pb::image_service_pull_layer_progress::Status::DownloadComplete as i32,
                ..pb::ImageServicePullLayerProgress::default()
            }),
        };
        let replies = [
            Ok(pb::ImageServicePullResponse { response: Some(Reply::PullProgress(done)) }),
            Ok(pb::ImageServicePullResponse { response: Some(Reply::Name(name)) }),
        ];
        Ok(Response::new(Box::pin(futures::stream::iter(replies))))
    }
}

#[tonic::async_trait]
impl<T: Served + 'static> LifecycleService for Apid<T> {
    type UpgradeStream = futures::stream::BoxStream<'static, Result<pb::LifecycleServiceUpgradeResponse, Status>>;

    /// The install, then its output lines and its exit code, as Talos streams them.
    async fn upgrade(
        &self,
        request: Request<pb::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        use pb::lifecycle_service_install_progress::Response as Progress;
        // LifecycleService refuses the deprecated multi-node key, as Talos does.
        if request.metadata().get("nodes").is_some() {
            return Err(Status::invalid_argument("LifecycleService takes the node key, not nodes"));
        }
        let node = node(&request)?;
        let timeout = deadline(&request).unwrap_or(Duration::from_secs(600));
        let message = request.into_inner();
        if namespace(message.containerd.as_ref())? != Namespace::System {
            return Err(Status::invalid_argument("the installer is taken from the system containerd namespace"));
        }
        let image = message.source.map(|s| s.image_name).unwrap_or_default();
        let call = InstallRequest { image, timeout };
        // The stream is answered once the install ended: no one reads when it began.
        let started = AtomicBool::new(false);
        let outcome = self
            .api
            .serve(&node, TalosWrite::Install { request: &call, started: &started })
            .await
            .and_then(TalosWritten::install)
            .map_err(|e| status(&e))?;
        let reply = |progress| pb::LifecycleServiceUpgradeResponse {
            progress: Some(pb::LifecycleServiceInstallProgress { response: Some(progress) }),
        };
        let replies: Vec<Result<pb::LifecycleServiceUpgradeResponse, Status>> = outcome
            .output
            .into_iter()
            .map(|line| Ok(reply(Progress::Message(line))))
            .chain([Ok(reply(Progress::ExitCode(outcome.exit_code)))])
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(replies))))
    }
}

#[tonic::async_trait]
impl<T: Served + 'static> State for Apid<T> {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let node = node(&request)?;
        let get = request.into_inner();
        let proto_spec = match (get.namespace.as_str(), get.r#type.as_str(), get.id.as_str()) {
            ("k8s", "Nodenames.kubernetes.talos.dev", "nodename") => {
                let nodename = self.api.nodename(&node).await.map_err(|e| status(&e))?;
                NodenameSpec { nodename, ..NodenameSpec::default() }.encode_to_vec()
            }
            ("runtime", "MachineStatuses.runtime.talos.dev", "machine") => {
                let stage = match self.api.machine_stage(&node).await.map_err(|e| status(&e))? {
                    MachineStage::Booting => Stage::Booting,
                    MachineStage::Installing => Stage::Installing,
                    MachineStage::Maintenance => Stage::Maintenance,
                    MachineStage::Running => Stage::Running,
                    MachineStage::Rebooting => Stage::Rebooting,
                    MachineStage::ShuttingDown => Stage::ShuttingDown,
                    MachineStage::Resetting => Stage::Resetting,
                    MachineStage::Upgrading => Stage::Upgrading,
                    MachineStage::Unknown => Stage::Unknown,
                };
                MachineStatusSpec { stage: stage as i32, status: None }.encode_to_vec()
            }
            ("config", "MachineConfigs.config.talos.dev", "v1alpha1") => {
                let yaml_marshalled = self.api.machine_config(&node).await.map_err(|e| status(&e))?;
                MachineConfigSpec { yaml_marshalled }.encode_to_vec()
            }
            // Talos keeps the installer's PID while its task runs (the spec's content is
            // not read: its existence is the answer).
            ("runtime", "ServicePIDs.runtime.talos.dev", "installer") => {
                match self.api.install_running(&node).await.map_err(|e| status(&e))? {
                    Some(true) => Vec::new(),
                    Some(false) => return Err(Status::not_found("runtime/ServicePIDs.runtime.talos.dev/installer")),
                    None => return Err(Status::unimplemented("this Talos API cannot tell an install under way")),
                }
            }
            (namespace, kind, id) => return Err(Status::not_found(format!("{namespace}/{kind}/{id}"))),
        };
        let resource = Resource { metadata: None, spec: Some(Spec { proto_spec, yaml_spec: String::new() }) };
        Ok(Response::new(GetResponse { resource: Some(resource) }))
    }

    type ListStream = futures::stream::BoxStream<'static, Result<ListResponse, Status>>;

    /// The bootstrap manifests, as one resource (`10-manifests`) holding every object
    /// the implementation gives; any other type lists nothing.
    async fn list(&self, request: Request<ListRequest>) -> Result<Response<Self::ListStream>, Status> {
        let node = node(&request)?;
        let list = request.into_inner();
        let mut replies = Vec::new();
        if (list.namespace.as_str(), list.r#type.as_str()) == ("controlplane", super::client::MANIFESTS) {
            let objects = self.api.bootstrap_manifests(&node).await.map_err(|e| status(&e))?;
            if !objects.is_empty() {
                let metadata = Metadata {
                    namespace: list.namespace.clone(),
                    r#type: list.r#type.clone(),
                    id: "10-manifests".to_owned(),
                    ..Metadata::default()
                };
                let proto_spec = super::manifests::manifest(&objects).encode_to_vec();
                let spec = Spec { proto_spec, yaml_spec: String::new() };
                replies
                    .push(Ok(ListResponse { resource: Some(Resource { metadata: Some(metadata), spec: Some(spec) }) }));
            }
        }
        Ok(Response::new(Box::pin(futures::stream::iter(replies))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_read_from_grpc_timeout() {
        let mut request = Request::new(());
        request.set_timeout(Duration::from_secs(540));
        assert_eq!(deadline(&request), Some(Duration::from_secs(540)));
        assert_eq!(deadline(&Request::new(())), None);
    }

    #[test]
    fn failures_are_answered_as_apid_answers_them() {
        let refused = TalosError::dial("10.5.0.3:50000", "connection refused");
        assert_eq!(status(&refused).code(), Code::Unavailable);
        let locked = TalosError::answer("FailedPrecondition", "locked");
        assert_eq!((status(&locked).code(), status(&locked).message()), (Code::FailedPrecondition, "locked"));
    }
}
