//! A stand-in for apid, the Talos API: a tonic server of Ichor's proto subset on loopback,
//! over mutual TLS that requires and verifies a client certificate from the cluster's CA,
//! answering as a Talos node does, including apid's `Unavailable` for a node it cannot
//! reach. It runs on a thread of its own, so that synchronous tests (an example run as a
//! process) can use it as well as async ones; dropping it stops it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_adapters::talos::proto::common::{Data, Metadata};
use ichor_adapters::talos::proto::machine::image_service_server::{ImageService, ImageServiceServer};
use ichor_adapters::talos::proto::machine::lifecycle_service_server::{LifecycleService, LifecycleServiceServer};
use ichor_adapters::talos::proto::machine::machine_service_server::{MachineService, MachineServiceServer};
use ichor_adapters::talos::proto::machine::{self as pb};
use ichor_adapters::talos::proto::resource::state_server::{State, StateServer};
use ichor_adapters::talos::proto::resource::{
    GetRequest, GetResponse, ListRequest, ListResponse, MachineStatusSpec, NodenameSpec, Resource, Spec,
    machine_status_spec::Stage,
};
use prost::Message;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};

use crate::pki::Ca;

/// How the stand-in answers.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// `Version`'s tag.
    pub version: String,
    /// The Nodename resource's name.
    pub nodename: String,
    /// The MachineStatus stage.
    pub stage: Stage,
    /// Nodes apid cannot reach: every call routed to one is answered `Unavailable`, with
    /// apid's own wording.
    pub unreachable: Vec<String>,
    /// How long the Upgrade call takes before it answers.
    pub upgrade_takes: Duration,
    /// An Upgrade reply carrying this `metadata.error`.
    pub upgrade_metadata_error: Option<String>,
    /// An Upgrade answered with this status.
    pub upgrade_status: Option<Code>,
    /// The snapshot's chunks.
    pub snapshot: Vec<Vec<u8>>,
    /// After this many chunks, the snapshot stream ends with an error.
    pub snapshot_fails_after: Option<usize>,
    /// The kernel's boot ID, as `Read` of `/proc/sys/kernel/random/boot_id` gives it.
    pub boot_id: String,
    /// The images in the `system` containerd namespace (a pull adds its image).
    pub images: Vec<String>,
    /// The installer's output lines, streamed before its exit code.
    pub install_output: Vec<String>,
    /// The installer's exit code; `None`: the stream ends without one.
    pub install_exit: Option<i32>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            version: "v1.14.3".to_owned(),
            nodename: "worker-7".to_owned(),
            stage: Stage::Running,
            unreachable: Vec::new(),
            upgrade_takes: Duration::ZERO,
            upgrade_metadata_error: None,
            upgrade_status: None,
            snapshot: vec![b"etcd ".to_vec(), b"snapshot ".to_vec(), b"bytes".to_vec()],
            snapshot_fails_after: None,
            boot_id: "0b6c1f8e-4a5e-4d0e-9a43-1f6f3d2a9c11".to_owned(),
            images: Vec::new(),
            install_output: vec!["installing".to_owned(), "upgrade successful".to_owned()],
            install_exit: Some(0),
        }
    }
}

/// What the stand-in saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// Each call's method and `node` metadata, in order.
    pub calls: Vec<(&'static str, String)>,
    /// The Upgrade requests.
    pub upgrades: Vec<pb::UpgradeRequest>,
    /// Their `grpc-timeout` headers.
    pub upgrade_deadlines: Vec<Option<String>>,
    /// The Reset requests.
    pub resets: Vec<pb::ResetRequest>,
    /// The member IDs asked to be removed.
    pub removed_members: Vec<u64>,
    /// The image pulls, with whether they named the `system` containerd namespace.
    pub pulls: Vec<(String, bool)>,
    /// The lifecycle installs' images.
    pub installs: Vec<String>,
    /// Whether any call carried the deprecated `nodes` key.
    pub nodes_key: bool,
    /// The paths read.
    pub reads: Vec<String>,
}

impl Seen {
    /// The `node` metadata of every call, in order.
    #[must_use]
    pub fn nodes(&self) -> Vec<String> {
        self.calls.iter().map(|(_, node)| node.clone()).collect()
    }
}

#[derive(Clone)]
struct Talos {
    seen: Arc<Mutex<Seen>>,
    behaviour: Behaviour,
}

impl Talos {
    /// Notes the call and answers as apid does for a node it cannot reach.
    fn route<T>(&self, method: &'static str, request: &Request<T>) -> Result<(), Status> {
        let node = request.metadata().get("node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        {
            let mut seen = self.seen.lock().unwrap();
            seen.calls.push((method, node.clone()));
            seen.nodes_key |= request.metadata().get("nodes").is_some();
        }
        if self.behaviour.unreachable.contains(&node) {
            return Err(Status::unavailable(format!(
                "connection error: desc = \"transport: Error while dialing: dial tcp {node}:50000: connect: connection refused\""
            )));
        }
        Ok(())
    }
}

/// Whether a call names the `system` containerd namespace, as Ichor's client names it
/// (talosctl's default is `cri`).
fn is_system(containerd: Option<&ichor_adapters::talos::proto::common::ContainerdInstance>) -> bool {
    use ichor_adapters::talos::proto::common::{ContainerDriver, ContainerdNamespace};
    containerd
        .is_some_and(|c| c.driver == ContainerDriver::Cri as i32 && c.namespace == ContainerdNamespace::NsSystem as i32)
}

type Streamed<T> = tokio_stream::Iter<std::vec::IntoIter<Result<T, Status>>>;

#[tonic::async_trait]
impl ImageService for Talos {
    type ListStream = Streamed<pb::ImageServiceListResponse>;

    async fn list(&self, request: Request<pb::ImageServiceListRequest>) -> Result<Response<Self::ListStream>, Status> {
        self.route("ImageService.List", &request)?;
        let images: Vec<Result<pb::ImageServiceListResponse, Status>> = self
            .seen
            .lock()
            .unwrap()
            .pulls
            .iter()
            .map(|(image, _)| image.clone())
            .chain(self.behaviour.images.iter().cloned())
            .map(|name| Ok(pb::ImageServiceListResponse { name, size: 1, ..pb::ImageServiceListResponse::default() }))
            .collect();
        Ok(Response::new(tokio_stream::iter(images)))
    }

    type PullStream = Streamed<pb::ImageServicePullResponse>;

    async fn pull(&self, request: Request<pb::ImageServicePullRequest>) -> Result<Response<Self::PullStream>, Status> {
        use pb::image_service_pull_response::Response as Reply;
        self.route("ImageService.Pull", &request)?;
        let message = request.into_inner();
        let system = is_system(message.containerd.as_ref());
        self.seen.lock().unwrap().pulls.push((message.image_ref.clone(), system));
        let layer = |status| {
            Ok(pb::ImageServicePullResponse {
                response: Some(Reply::PullProgress(pb::ImageServicePullProgress {
                    layer_id: "sha256:0a1b".into(),
                    progress: Some(pb::ImageServicePullLayerProgress {
                        status,
                        offset: 100,
                        total: 100,
                        ..pb::ImageServicePullLayerProgress::default()
                    }),
                })),
            })
        };
        let replies = vec![
            layer(pb::image_service_pull_layer_progress::Status::Downloading as i32),
            layer(pb::image_service_pull_layer_progress::Status::ExtractComplete as i32),
            Ok(pb::ImageServicePullResponse { response: Some(Reply::Name(message.image_ref)) }),
        ];
        Ok(Response::new(tokio_stream::iter(replies)))
    }
}

#[tonic::async_trait]
impl LifecycleService for Talos {
    type UpgradeStream = Streamed<pb::LifecycleServiceUpgradeResponse>;

    async fn upgrade(
        &self,
        request: Request<pb::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        use pb::lifecycle_service_install_progress::Response as Progress;
        self.route("LifecycleService.Upgrade", &request)?;
        let message = request.into_inner();
        if !is_system(message.containerd.as_ref()) {
            return Err(Status::failed_precondition("installer image not found in containerd store"));
        }
        let image = message.source.map(|s| s.image_name).unwrap_or_default();
        self.seen.lock().unwrap().installs.push(image);
        let reply = |progress| {
            Ok(pb::LifecycleServiceUpgradeResponse {
                progress: Some(pb::LifecycleServiceInstallProgress { response: Some(progress) }),
            })
        };
        let replies: Vec<Result<pb::LifecycleServiceUpgradeResponse, Status>> = self
            .behaviour
            .install_output
            .iter()
            .map(|line| reply(Progress::Message(line.clone())))
            .chain(self.behaviour.install_exit.map(|code| reply(Progress::ExitCode(code))))
            .collect();
        Ok(Response::new(tokio_stream::iter(replies)))
    }
}

#[tonic::async_trait]
impl MachineService for Talos {
    async fn apply_configuration(
        &self,
        request: Request<pb::ApplyConfigurationRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        self.route("ApplyConfiguration", &request)?;
        Err(Status::unimplemented("this stand-in does not serve ApplyConfiguration"))
    }

    async fn version(&self, request: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        self.route("Version", &request)?;
        let version = pb::Version {
            metadata: None,
            version: Some(pb::VersionInfo { tag: self.behaviour.version.clone(), ..pb::VersionInfo::default() }),
            platform: None,
        };
        Ok(Response::new(pb::VersionResponse { messages: vec![version] }))
    }

    async fn upgrade(&self, request: Request<pb::UpgradeRequest>) -> Result<Response<pb::UpgradeResponse>, Status> {
        self.route("Upgrade", &request)?;
        let deadline = request.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).map(str::to_owned);
        {
            let mut seen = self.seen.lock().unwrap();
            seen.upgrade_deadlines.push(deadline);
            seen.upgrades.push(request.get_ref().clone());
        }
        tokio::time::sleep(self.behaviour.upgrade_takes).await;
        if let Some(code) = self.behaviour.upgrade_status {
            return Err(Status::new(code, "failed to pull installer image"));
        }
        let metadata =
            self.behaviour.upgrade_metadata_error.clone().map(|error| Metadata { error, ..Metadata::default() });
        let reply = pb::Upgrade { metadata, ack: "Upgrade request received".into(), actor_id: "actor-1".into() };
        Ok(Response::new(pb::UpgradeResponse { messages: vec![reply] }))
    }

    async fn reboot(&self, request: Request<pb::RebootRequest>) -> Result<Response<pb::RebootResponse>, Status> {
        self.route("Reboot", &request)?;
        if request.get_ref().mode != pb::reboot_request::Mode::Default as i32 {
            return Err(Status::invalid_argument("only the default mode is expected"));
        }
        Ok(Response::new(pb::RebootResponse {
            messages: vec![pb::Reboot { metadata: None, actor_id: "actor-r".into() }],
        }))
    }

    type KubeconfigStream = Streamed<Data>;

    async fn kubeconfig(&self, request: Request<()>) -> Result<Response<Self::KubeconfigStream>, Status> {
        self.route("Kubeconfig", &request)?;
        Err(Status::unimplemented("this apid serves no kubeconfig"))
    }

    type ReadStream = Streamed<Data>;

    async fn read(&self, request: Request<pb::ReadRequest>) -> Result<Response<Self::ReadStream>, Status> {
        self.route("Read", &request)?;
        let path = request.into_inner().path;
        self.seen.lock().unwrap().reads.push(path.clone());
        if path != "/proc/sys/kernel/random/boot_id" {
            return Err(Status::not_found(format!("{path}: no such file")));
        }
        let chunk = Data { metadata: None, bytes: format!("{}\n", self.behaviour.boot_id).into_bytes() };
        Ok(Response::new(tokio_stream::iter(vec![Ok(chunk)])))
    }

    async fn reset(&self, request: Request<pb::ResetRequest>) -> Result<Response<pb::ResetResponse>, Status> {
        self.route("Reset", &request)?;
        self.seen.lock().unwrap().resets.push(request.into_inner());
        Ok(Response::new(pb::ResetResponse { messages: vec![pb::Reset::default()] }))
    }

    async fn etcd_member_list(
        &self,
        request: Request<pb::EtcdMemberListRequest>,
    ) -> Result<Response<pb::EtcdMemberListResponse>, Status> {
        self.route("EtcdMemberList", &request)?;
        let member = |id, name: &str, is_learner| pb::EtcdMember {
            id,
            hostname: name.into(),
            is_learner,
            ..pb::EtcdMember::default()
        };
        let members = pb::EtcdMembers {
            metadata: None,
            legacy_members: vec![],
            members: vec![member(1, "cp-1", false), member(2, "cp-2", true)],
        };
        Ok(Response::new(pb::EtcdMemberListResponse { messages: vec![members] }))
    }

    async fn etcd_status(&self, request: Request<()>) -> Result<Response<pb::EtcdStatusResponse>, Status> {
        self.route("EtcdStatus", &request)?;
        let member_status = pb::EtcdMemberStatus {
            member_id: 2,
            leader: 1,
            errors: vec!["slow fdatasync".into()],
            is_learner: false,
            ..pb::EtcdMemberStatus::default()
        };
        Ok(Response::new(pb::EtcdStatusResponse {
            messages: vec![pb::EtcdStatus { metadata: None, member_status: Some(member_status) }],
        }))
    }

    async fn etcd_alarm_list(&self, request: Request<()>) -> Result<Response<pb::EtcdAlarmListResponse>, Status> {
        self.route("EtcdAlarmList", &request)?;
        let alarm = pb::EtcdMemberAlarm { member_id: 3, alarm: pb::etcd_member_alarm::AlarmType::Nospace as i32 };
        Ok(Response::new(pb::EtcdAlarmListResponse {
            messages: vec![pb::EtcdAlarm { metadata: None, member_alarms: vec![alarm] }],
        }))
    }

    type EtcdSnapshotStream = tokio_stream::Iter<std::vec::IntoIter<Result<Data, Status>>>;

    async fn etcd_snapshot(
        &self,
        request: Request<pb::EtcdSnapshotRequest>,
    ) -> Result<Response<Self::EtcdSnapshotStream>, Status> {
        self.route("EtcdSnapshot", &request)?;
        let mut chunks: Vec<Result<Data, Status>> =
            self.behaviour.snapshot.iter().map(|bytes| Ok(Data { metadata: None, bytes: bytes.clone() })).collect();
        if let Some(after) = self.behaviour.snapshot_fails_after {
            chunks.truncate(after);
            chunks.push(Err(Status::internal("etcdserver: snapshot stream broken")));
        }
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn etcd_leave_cluster(
        &self,
        request: Request<pb::EtcdLeaveClusterRequest>,
    ) -> Result<Response<pb::EtcdLeaveClusterResponse>, Status> {
        self.route("EtcdLeaveCluster", &request)?;
        let metadata = Some(Metadata { error: "etcd is not running on this node".into(), ..Metadata::default() });
        Ok(Response::new(pb::EtcdLeaveClusterResponse { messages: vec![pb::EtcdLeaveCluster { metadata }] }))
    }

    async fn etcd_remove_member_by_id(
        &self,
        request: Request<pb::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<pb::EtcdRemoveMemberByIdResponse>, Status> {
        self.route("EtcdRemoveMemberByID", &request)?;
        self.seen.lock().unwrap().removed_members.push(request.get_ref().member_id);
        Ok(Response::new(pb::EtcdRemoveMemberByIdResponse { messages: vec![pb::EtcdRemoveMemberById::default()] }))
    }
}

#[tonic::async_trait]
impl State for Talos {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.route("Get", &request)?;
        let get = request.into_inner();
        let proto_spec = match (get.namespace.as_str(), get.r#type.as_str(), get.id.as_str()) {
            ("k8s", "Nodenames.kubernetes.talos.dev", "nodename") => {
                NodenameSpec { nodename: self.behaviour.nodename.clone(), ..NodenameSpec::default() }.encode_to_vec()
            }
            ("runtime", "MachineStatuses.runtime.talos.dev", "machine") => {
                MachineStatusSpec { stage: self.behaviour.stage as i32, status: None }.encode_to_vec()
            }
            _ => return Err(Status::not_found("no such resource")),
        };
        let resource = Resource { metadata: None, spec: Some(Spec { proto_spec, yaml_spec: String::new() }) };
        Ok(Response::new(GetResponse { resource: Some(resource) }))
    }

    type ListStream = Streamed<ListResponse>;

    /// Lists nothing (no bootstrap manifests on this stand-in).
    async fn list(&self, request: Request<ListRequest>) -> Result<Response<Self::ListStream>, Status> {
        self.route("List", &request)?;
        Ok(Response::new(tokio_stream::iter(Vec::new())))
    }
}

/// A running apid stand-in.
pub struct Apid {
    served: Served,
    seen: Arc<Mutex<Seen>>,
}

impl Apid {
    /// Starts one on a free loopback port, serving a certificate from `ca` for `127.0.0.1`
    /// and `localhost`, and accepting only clients with a certificate from `client_ca`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start(ca: &Ca, client_ca: &Ca, behaviour: Behaviour) -> Self {
        let server = ca.server(&["127.0.0.1", "localhost"]);
        Self::start_with(&server.cert_pem, &server.key_pem, &client_ca.cert_pem, behaviour)
    }

    /// Starts one serving `cert_pem`/`key_pem`, accepting clients from `client_ca_pem`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start_with(cert_pem: &str, key_pem: &str, client_ca_pem: &str, behaviour: Behaviour) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let talos = Talos { seen: Arc::clone(&seen), behaviour };
        let served = serve(
            cert_pem,
            key_pem,
            client_ca_pem,
            tonic::service::Routes::new(MachineServiceServer::new(talos.clone()))
                .add_service(StateServer::new(talos.clone()))
                .add_service(ImageServiceServer::new(talos.clone()))
                .add_service(LifecycleServiceServer::new(talos)),
        );
        Self { served, seen }
    }

    /// Its address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.served.addr
    }

    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        self.served.endpoint()
    }

    /// What it saw so far.
    ///
    /// # Panics
    /// When a handler panicked while holding the record.
    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }
}

/// A Talos API served on loopback over mutual TLS (this server's certificate, clients
/// verified against `client_ca_pem`), on a thread of its own; dropping it stops it.
pub struct Served {
    /// Its address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        drop(self.thread.take());
    }
}

/// Serves these Talos API services (any implementation: the stand-in's, or the simulated
/// fleet's through `ichor_adapters::talos::server`) on a free loopback port.
///
/// # Panics
/// When no loopback port can be bound.
pub fn serve(cert_pem: &str, key_pem: &str, client_ca_pem: &str, routes: tonic::service::Routes) -> Served {
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .client_ca_root(Certificate::from_pem(client_ca_pem));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("its address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            Server::builder()
                .tls_config(tls)
                .expect("server TLS")
                .add_routes(routes)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    stopped.await.ok();
                })
                .await
                .expect("the server runs");
        });
    });
    Served { addr, stop: Some(stop), thread: Some(thread) }
}
