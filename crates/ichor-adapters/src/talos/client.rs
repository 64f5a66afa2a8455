//! `TalosApi` over the Talos machine API: tonic, mutual TLS from a talosconfig, each call
//! aimed at one node through apid's `node` metadata key.
//!
//! Failures are classified as the executor acts on them: no connection (dial) or a broken
//! one (transport) is [`TalosError::Dial`] / [`TalosError::Transport`]; anything the API
//! answered, a gRPC status or a reply's `metadata.error`, is [`TalosError::Answered`].

use std::time::Duration;

use async_trait::async_trait;
use ichor_talos_executor::talos_api::{
    EtcdAlarm, EtcdMember, EtcdStatus, ResetRequest, TalosApi, TalosError, UpgradeAck, UpgradeRequest,
};
use ichor_talosconfig::TalosContext;
use ichor_upgrade_core::talos_step::MachineStage;
use prost::Message;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::proto::common::Metadata;
use super::proto::machine::machine_service_client::MachineServiceClient;
use super::proto::machine::{self as pb};
use super::proto::resource::state_client::StateClient;
use super::proto::resource::{GetRequest, MachineStatusSpec, NodenameSpec, machine_status_spec::Stage};

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
}

/// A client configuration that cannot make a TLS channel.
#[derive(Debug, thiserror::Error)]
#[error("Talos client for {endpoint}: {message}")]
pub struct ClientError {
    /// The endpoint.
    pub endpoint: String,
    /// What is wrong.
    pub message: String,
}

/// The Talos machine API through one apid endpoint.
#[derive(Clone, Debug)]
pub struct TalosClient {
    machine: MachineServiceClient<Channel>,
    state: StateClient<Channel>,
    /// The bound of a call whose own request carries none.
    call_timeout: Duration,
}

impl TalosClient {
    /// A client of the context's first endpoint, with its mutual-TLS material. The channel
    /// connects on the first call.
    ///
    /// # Errors
    /// A [`ClientError`] when the endpoint or the TLS material cannot form a channel.
    pub fn new(context: &TalosContext, call_timeout: Duration) -> Result<Self, ClientError> {
        let endpoint = context.endpoints.first().ok_or_else(|| ClientError {
            endpoint: String::new(),
            message: "the context has no endpoint".to_owned(),
        })?;
        let fail = |message: String| ClientError { endpoint: endpoint.to_string(), message };
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&context.ca_pem))
            .identity(Identity::from_pem(&context.crt_pem, &context.key_pem))
            .domain_name(endpoint.host.clone());
        let channel = Endpoint::from_shared(format!("https://{endpoint}"))
            .map_err(|e| fail(e.to_string()))?
            .connect_timeout(call_timeout)
            .tls_config(tls)
            .map_err(|e| fail(e.to_string()))?
            .connect_lazy();
        Ok(Self { machine: MachineServiceClient::new(channel.clone()), state: StateClient::new(channel), call_timeout })
    }

    fn request<T>(&self, node: &str, message: T, timeout: Option<Duration>) -> Result<tonic::Request<T>, TalosError> {
        let mut request = tonic::Request::new(message);
        if !node.is_empty() {
            let value = node.parse().map_err(|_| TalosError::Answered {
                code: "InvalidArgument".to_owned(),
                message: format!("node {node:?} cannot be sent as gRPC metadata"),
            })?;
            request.metadata_mut().insert("node", value);
        }
        request.set_timeout(timeout.unwrap_or(self.call_timeout));
        Ok(request)
    }

    async fn get(&self, node: &str, namespace: &str, kind: &str, id: &str) -> Result<Vec<u8>, TalosError> {
        let get = GetRequest { namespace: namespace.to_owned(), r#type: kind.to_owned(), id: id.to_owned() };
        let reply = self.state.clone().get(self.request(node, get, None)?).await.map_err(classify)?.into_inner();
        let spec =
            reply.resource.and_then(|r| r.spec).ok_or_else(|| answered("Unknown", format!("{kind} {id}: no spec")))?;
        Ok(spec.proto_spec)
    }

    /// `MachineService.EtcdSnapshot`: streams a consistent snapshot of etcd from the node
    /// into `out`, returning its size and SHA-256. The stream has no deadline of its own
    /// beyond the connection's: a large database takes as long as it takes.
    ///
    /// # Errors
    /// The classified API failure, a chunk carrying `metadata.error`, or a failed write.
    pub async fn etcd_snapshot(&self, node: &str, out: &mut impl std::io::Write) -> Result<Snapshot, SnapshotError> {
        use sha2::Digest;
        let mut request = self.request(node, pb::EtcdSnapshotRequest {}, None)?;
        request.set_timeout(Duration::from_secs(24 * 3600));
        let mut stream = self.machine.clone().etcd_snapshot(request).await.map_err(classify)?.into_inner();
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = stream.message().await.map_err(classify)? {
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
    }

    /// `MachineService.Reboot` in the default mode (kexec when prepared); the actor ID.
    ///
    /// # Errors
    /// The classified failure.
    pub async fn reboot(&self, node: &str) -> Result<String, TalosError> {
        let message = pb::RebootRequest { mode: pb::reboot_request::Mode::Default as i32 };
        let reply =
            self.machine.clone().reboot(self.request(node, message, None)?).await.map_err(classify)?.into_inner();
        Ok(first_reply(reply.messages, |m| m.metadata.as_ref())?.actor_id)
    }

    /// `MachineService.Version`: the node's Talos version tag (such as `v1.14.3`).
    ///
    /// # Errors
    /// The classified failure.
    pub async fn version(&self, node: &str) -> Result<String, TalosError> {
        let reply = self.machine.clone().version(self.request(node, (), None)?).await.map_err(classify)?.into_inner();
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(first.version.map(|v| v.tag).unwrap_or_default())
    }
}

fn answered(code: &str, message: String) -> TalosError {
    TalosError::Answered { code: code.to_owned(), message }
}

/// Classifies a failed call: a transport error underneath is a dial or transport failure;
/// anything else was answered by the API.
fn classify(status: tonic::Status) -> TalosError {
    let mut source = std::error::Error::source(&status);
    while let Some(error) = source {
        if let Some(transport) = error.downcast_ref::<tonic::transport::Error>() {
            let text = format!("{transport}: {}", status.message());
            return if status.code() == tonic::Code::Unavailable {
                TalosError::Dial(text)
            } else {
                TalosError::Transport(text)
            };
        }
        if error.downcast_ref::<std::io::Error>().is_some() {
            return TalosError::Transport(format!("{error}: {}", status.message()));
        }
        source = error.source();
    }
    if status.code() == tonic::Code::Cancelled {
        return TalosError::Transport(status.message().to_owned());
    }
    answered(&format!("{:?}", status.code()), status.message().to_owned())
}

/// The first reply of a multi-node envelope, with its `metadata.error` treated as an error.
fn first_reply<T>(messages: Vec<T>, metadata: impl Fn(&T) -> Option<&Metadata>) -> Result<T, TalosError> {
    let first = messages.into_iter().next().ok_or_else(|| answered("Unknown", "an empty reply".to_owned()))?;
    if let Some(error) = metadata(&first).map(|m| m.error.clone()).filter(|e| !e.is_empty()) {
        return Err(answered("Unknown", error));
    }
    Ok(first)
}

#[async_trait]
impl TalosApi for TalosClient {
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

    async fn upgrade(&self, node: &str, request: &UpgradeRequest) -> Result<UpgradeAck, TalosError> {
        // Neither force nor preserve; the call's remaining bound travels as its deadline.
        let message = pb::UpgradeRequest { image: request.image.clone(), ..pb::UpgradeRequest::default() };
        let call = self.request(node, message, Some(request.timeout))?;
        let reply = self.machine.clone().upgrade(call).await.map_err(classify)?.into_inner();
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(UpgradeAck { ack: first.ack, actor_id: first.actor_id })
    }

    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError> {
        let call = self.request(node, pb::EtcdMemberListRequest { query_local: false }, None)?;
        let reply = self.machine.clone().etcd_member_list(call).await.map_err(classify)?.into_inner();
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(first
            .members
            .into_iter()
            .map(|m| EtcdMember { id: m.id, hostname: m.hostname, is_learner: m.is_learner })
            .collect())
    }

    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError> {
        let reply =
            self.machine.clone().etcd_status(self.request(node, (), None)?).await.map_err(classify)?.into_inner();
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
        let call = self.request(node, (), None)?;
        let reply = self.machine.clone().etcd_alarm_list(call).await.map_err(classify)?.into_inner();
        let first = first_reply(reply.messages, |m| m.metadata.as_ref())?;
        Ok(first.member_alarms.into_iter().map(|a| EtcdAlarm { member_id: a.member_id, kind: a.alarm }).collect())
    }

    async fn etcd_leave_cluster(&self, node: &str) -> Result<(), TalosError> {
        let call = self.request(node, pb::EtcdLeaveClusterRequest {}, None)?;
        let reply = self.machine.clone().etcd_leave_cluster(call).await.map_err(classify)?.into_inner();
        first_reply(reply.messages, |m| m.metadata.as_ref()).map(drop)
    }

    async fn reset(&self, node: &str, request: &ResetRequest) -> Result<(), TalosError> {
        let message = pb::ResetRequest { graceful: request.graceful, reboot: request.reboot };
        let reply =
            self.machine.clone().reset(self.request(node, message, None)?).await.map_err(classify)?.into_inner();
        first_reply(reply.messages, |m| m.metadata.as_ref()).map(drop)
    }
}
