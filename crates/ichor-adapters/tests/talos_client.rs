//! The Talos client against a Talos API test server built from the same proto subset,
//! over real mutual TLS with Ed25519 certificates generated here, on loopback.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_adapters::talos::TalosClient;
use ichor_adapters::talos::proto::common::{Data, Metadata};
use ichor_adapters::talos::proto::machine::machine_service_server::{MachineService, MachineServiceServer};
use ichor_adapters::talos::proto::machine::{self as pb};
use ichor_adapters::talos::proto::resource::state_server::{State, StateServer};
use ichor_adapters::talos::proto::resource::{
    GetRequest, GetResponse, MachineStatusSpec, NodenameSpec, Resource, Spec, machine_status_spec::Stage,
};
use ichor_talos_executor::talos_api::{ResetRequest, TalosApi, TalosError, UpgradeRequest};
use ichor_talosconfig::{Endpoint, TalosContext};
use ichor_upgrade_core::talos_step::MachineStage;
use prost::Message;
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, PKCS_ED25519};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// An Ed25519 CA and leaf certificates, as Talos's own CA issues them.
struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, "talos");
        let ca = params.self_signed(&key).unwrap();
        Self { ca_pem: ca.pem(), issuer: Issuer::new(params, key) }
    }

    /// A leaf for these names (IP SANs for addresses), with `os:admin` as organisation.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::OrganizationName, "os:admin");
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// What the server saw.
#[derive(Default)]
struct Seen {
    nodes: Vec<String>,
    upgrades: Vec<pb::UpgradeRequest>,
    upgrade_deadlines: Vec<Option<String>>,
    resets: Vec<pb::ResetRequest>,
}

/// How the server answers.
#[derive(Clone, Default)]
struct Behaviour {
    upgrade_takes: Duration,
    upgrade_metadata_error: Option<String>,
    upgrade_status: Option<tonic::Code>,
}

#[derive(Clone)]
struct Talos {
    seen: Arc<Mutex<Seen>>,
    behaviour: Behaviour,
}

impl Talos {
    fn note<T>(&self, request: &Request<T>) {
        let node = request.metadata().get("node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        self.seen.lock().unwrap().nodes.push(node);
    }
}

#[tonic::async_trait]
impl MachineService for Talos {
    async fn version(&self, request: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        self.note(&request);
        let version = pb::Version {
            metadata: None,
            version: Some(pb::VersionInfo { tag: "v1.14.3".into(), ..pb::VersionInfo::default() }),
            platform: None,
        };
        Ok(Response::new(pb::VersionResponse { messages: vec![version] }))
    }

    async fn upgrade(&self, request: Request<pb::UpgradeRequest>) -> Result<Response<pb::UpgradeResponse>, Status> {
        self.note(&request);
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
        self.note(&request);
        assert_eq!(request.get_ref().mode, pb::reboot_request::Mode::Default as i32);
        Ok(Response::new(pb::RebootResponse {
            messages: vec![pb::Reboot { metadata: None, actor_id: "actor-r".into() }],
        }))
    }

    async fn reset(&self, request: Request<pb::ResetRequest>) -> Result<Response<pb::ResetResponse>, Status> {
        self.note(&request);
        self.seen.lock().unwrap().resets.push(request.into_inner());
        Ok(Response::new(pb::ResetResponse { messages: vec![pb::Reset::default()] }))
    }

    async fn etcd_member_list(
        &self,
        request: Request<pb::EtcdMemberListRequest>,
    ) -> Result<Response<pb::EtcdMemberListResponse>, Status> {
        self.note(&request);
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
        self.note(&request);
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
        self.note(&request);
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
        self.note(&request);
        let chunk = |bytes: &[u8]| Ok(Data { metadata: None, bytes: bytes.to_vec() });
        let chunks = vec![chunk(b"etcd "), chunk(b"snapshot "), chunk(b"bytes")];
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn etcd_leave_cluster(
        &self,
        request: Request<pb::EtcdLeaveClusterRequest>,
    ) -> Result<Response<pb::EtcdLeaveClusterResponse>, Status> {
        self.note(&request);
        let metadata = Some(Metadata { error: "etcd is not running on this node".into(), ..Metadata::default() });
        Ok(Response::new(pb::EtcdLeaveClusterResponse { messages: vec![pb::EtcdLeaveCluster { metadata }] }))
    }
}

#[tonic::async_trait]
impl State for Talos {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.note(&request);
        let get = request.into_inner();
        let proto_spec = match (get.namespace.as_str(), get.r#type.as_str(), get.id.as_str()) {
            ("k8s", "Nodenames.kubernetes.talos.dev", "nodename") => {
                NodenameSpec { nodename: "worker-7".into(), ..NodenameSpec::default() }.encode_to_vec()
            }
            ("runtime", "MachineStatuses.runtime.talos.dev", "machine") => {
                MachineStatusSpec { stage: Stage::Upgrading as i32, status: None }.encode_to_vec()
            }
            _ => return Err(Status::not_found("no such resource")),
        };
        let resource = Resource { metadata: None, spec: Some(Spec { proto_spec, yaml_spec: String::new() }) };
        Ok(Response::new(GetResponse { resource: Some(resource) }))
    }
}

/// A running test server and a trusted client's context for it.
struct Fixture {
    addr: SocketAddr,
    pki: Pki,
    seen: Arc<Mutex<Seen>>,
    server: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(behaviour: Behaviour) -> Self {
        let pki = Pki::new();
        let (cert, key) = pki.leaf(&["127.0.0.1", "localhost"]);
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(&pki.ca_pem));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let talos = Talos { seen: Arc::clone(&seen), behaviour };
        let server = tokio::spawn(async move {
            Server::builder()
                .tls_config(tls)
                .unwrap()
                .add_service(MachineServiceServer::new(talos.clone()))
                .add_service(StateServer::new(talos))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Self { addr, pki, seen, server }
    }

    fn context_signed_by(&self, ca_pem: &str, pki: &Pki) -> TalosContext {
        let (crt_pem, key_pem) = pki.leaf(&[]);
        TalosContext {
            name: "test".into(),
            endpoints: vec![Endpoint { host: "127.0.0.1".into(), port: self.addr.port() }],
            nodes: vec![],
            ca_pem: ca_pem.to_owned(),
            crt_pem,
            key_pem,
        }
    }

    fn client(&self) -> TalosClient {
        TalosClient::new(&self.context_signed_by(&self.pki.ca_pem, &self.pki), Duration::from_secs(5)).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn upgrade_request(timeout: Duration) -> UpgradeRequest {
    UpgradeRequest { image: "factory.talos.dev/metal-installer/abc:v1.14.4".into(), timeout }
}

#[tokio::test]
async fn calls_go_over_mutual_tls_aimed_at_one_node() {
    let f = Fixture::start(Behaviour::default()).await;
    let client = f.client();
    assert_eq!(client.version("10.5.0.7").await.unwrap(), "v1.14.3");
    assert_eq!(client.nodename("10.5.0.7").await.unwrap(), "worker-7");
    assert_eq!(client.machine_stage("10.5.0.7").await.unwrap(), MachineStage::Upgrading);
    let members = client.etcd_members("10.5.0.2").await.unwrap();
    assert_eq!(
        members.iter().map(|m| (m.id, m.hostname.as_str(), m.is_learner)).collect::<Vec<_>>(),
        vec![(1, "cp-1", false), (2, "cp-2", true)]
    );
    assert_eq!(f.seen.lock().unwrap().nodes, vec!["10.5.0.7", "10.5.0.7", "10.5.0.7", "10.5.0.2"]);
}

#[tokio::test]
async fn the_upgrade_sends_the_image_without_force_or_preserve_and_its_deadline() {
    let f = Fixture::start(Behaviour::default()).await;
    let ack = f.client().upgrade("10.5.0.7", &upgrade_request(Duration::from_secs(540))).await.unwrap();
    assert_eq!((ack.ack.as_str(), ack.actor_id.as_str()), ("Upgrade request received", "actor-1"));
    let seen = f.seen.lock().unwrap();
    let sent = &seen.upgrades[0];
    assert_eq!(sent.image, "factory.talos.dev/metal-installer/abc:v1.14.4");
    assert!(!sent.force && !sent.preserve && !sent.stage);
    let deadline = seen.upgrade_deadlines[0].clone().expect("a grpc-timeout header");
    assert!(deadline.ends_with('m') || deadline.ends_with('S') || deadline.ends_with('u'), "{deadline}");
}

#[tokio::test]
async fn a_reply_with_metadata_error_is_an_answered_error() {
    let f = Fixture::start(Behaviour { upgrade_metadata_error: Some("upgrade locked".into()), ..Behaviour::default() })
        .await;
    let err = f.client().upgrade("10.5.0.7", &upgrade_request(Duration::from_secs(60))).await.unwrap_err();
    assert_eq!(err, TalosError::Answered { code: "Unknown".into(), message: "upgrade locked".into() });
    assert!(!err.is_unreachable());
    let err = f.client().etcd_leave_cluster("10.5.0.2").await.unwrap_err();
    assert!(matches!(err, TalosError::Answered { ref message, .. } if message.contains("etcd is not running")));
}

#[tokio::test]
async fn an_error_status_is_an_answered_error() {
    let f = Fixture::start(Behaviour { upgrade_status: Some(tonic::Code::FailedPrecondition), ..Behaviour::default() })
        .await;
    let err = f.client().upgrade("10.5.0.7", &upgrade_request(Duration::from_secs(60))).await.unwrap_err();
    assert!(
        matches!(err, TalosError::Answered { ref code, ref message } if code == "FailedPrecondition" && message.contains("installer")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_slow_upgrade_is_cut_at_its_deadline() {
    let f = Fixture::start(Behaviour { upgrade_takes: Duration::from_secs(5), ..Behaviour::default() }).await;
    let err = f.client().upgrade("10.5.0.7", &upgrade_request(Duration::from_millis(300))).await.unwrap_err();
    assert!(
        matches!(&err, TalosError::Answered { code, .. } if code == "DeadlineExceeded") || err.is_unreachable(),
        "{err:?}"
    );
}

#[tokio::test]
async fn etcd_status_and_alarms_are_read_for_the_gate() {
    let f = Fixture::start(Behaviour::default()).await;
    let client = f.client();
    let status = client.etcd_status("10.5.0.3").await.unwrap();
    assert_eq!((status.member_id, status.leader, status.errors.clone()), (2, 1, vec!["slow fdatasync".to_owned()]));
    let alarms = client.etcd_alarms("10.5.0.3").await.unwrap();
    assert_eq!(alarms, vec![ichor_talos_executor::talos_api::EtcdAlarm { member_id: 3, kind: 1 }]);
}

#[tokio::test]
async fn an_etcd_snapshot_is_streamed_with_its_size_and_checksum() {
    use sha2::Digest;
    let f = Fixture::start(Behaviour::default()).await;
    let mut out = Vec::new();
    let snapshot = f.client().etcd_snapshot("10.5.0.2", &mut out).await.unwrap();
    assert_eq!(out, b"etcd snapshot bytes");
    assert_eq!(snapshot.size, 19);
    let expected: String = sha2::Sha256::digest(b"etcd snapshot bytes").iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(snapshot.sha256, expected, "the checksum of exactly the bytes written");
}

#[tokio::test]
async fn the_reset_is_graceful_and_powers_off() {
    let f = Fixture::start(Behaviour::default()).await;
    f.client().reset("10.5.0.7", &ResetRequest { graceful: true, reboot: false }).await.unwrap();
    assert_eq!(f.client().reboot("10.5.0.8").await.unwrap(), "actor-r");
    assert_eq!(f.seen.lock().unwrap().resets, vec![pb::ResetRequest { graceful: true, reboot: false }]);
}

#[tokio::test]
async fn no_server_is_a_dial_error() {
    let f = Fixture::start(Behaviour::default()).await;
    let mut context = f.context_signed_by(&f.pki.ca_pem, &f.pki);
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    context.endpoints[0].port = unused;
    let err = TalosClient::new(&context, Duration::from_secs(2)).unwrap().version("").await.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
}

#[tokio::test]
async fn a_client_without_a_certificate_from_the_clusters_ca_is_refused() {
    let f = Fixture::start(Behaviour::default()).await;
    let stranger = Pki::new();
    let context = f.context_signed_by(&f.pki.ca_pem, &stranger);
    let err = TalosClient::new(&context, Duration::from_secs(2)).unwrap().version("").await.unwrap_err();
    assert!(err.is_unreachable(), "the handshake fails before any call: {err:?}");
    assert!(f.seen.lock().unwrap().nodes.is_empty(), "the server never saw the call");
}
