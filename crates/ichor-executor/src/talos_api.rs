//! The Talos machine API, as far as the executor needs it.
//!
//! Every method names the machine to reach by `node`: the address the Talos API routes to
//! (apid's `node` metadata key). The real implementation is a tonic client over mutual TLS
//! in `ichor-adapters`; the simulated cluster implements it too.

use std::sync::atomic::AtomicBool;

use async_trait::async_trait;
pub use ichor_upgrade_core::etcd::gate::{Alarm as EtcdAlarm, MemberStatus as EtcdStatus};
use ichor_upgrade_core::machine::vocabulary::MachineStage;

use crate::cause::Cause;
use crate::effects::seal::Seal;

/// gRPC codes that, answered by the Talos API, mean the node cannot be reached now rather
/// than that it refused: apid answers `Unavailable` when it cannot dial the node a call is
/// routed to (a rebooting machine), and `DeadlineExceeded`, `Cancelled` or `Aborted` when
/// the call did not finish on the node's side.
pub const UNREACHABLE_CODES: [&str; 4] = ["Unavailable", "DeadlineExceeded", "Cancelled", "Aborted"];

/// A failed Talos API call, classified the way the executor acts on it. The cause is kept
/// whole behind `source()`; [`report`](crate::cause::report) prints it in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TalosError {
    /// No connection could be made to the endpoint (no such host, refused, unreachable, or
    /// no TLS session within the dial bound): the request never left this side.
    #[error("cannot connect to {endpoint}: {cause}")]
    Dial {
        /// The apid endpoint tried (`HOST:PORT`).
        endpoint: String,
        /// What went wrong.
        #[source]
        cause: Cause,
    },
    /// The TLS handshake failed: a certificate refused either way (unknown issuer, expired,
    /// not for this host), or a protocol mismatch. Waiting does not fix it; a person must.
    #[error("TLS with {endpoint} failed: {cause}")]
    Tls {
        /// The apid endpoint tried.
        endpoint: String,
        /// What went wrong.
        #[source]
        cause: Cause,
    },
    /// The connection broke, or the call's deadline passed on this side, during the call:
    /// the node may or may not have received it.
    #[error("the call broke off: {cause}")]
    Transport {
        /// What went wrong.
        #[source]
        cause: Cause,
    },
    /// The API answered that the node cannot be reached now (one of [`UNREACHABLE_CODES`]).
    #[error("{code}: {message}")]
    Unreachable {
        /// The gRPC status code's name.
        code: String,
        /// The message.
        message: String,
    },
    /// The API answered with an error (a gRPC status, or `metadata.error` in the reply).
    #[error("{code}: {message}")]
    Answered {
        /// The gRPC status code's name, such as `FailedPrecondition`.
        code: String,
        /// The message.
        message: String,
    },
}

impl TalosError {
    /// No connection to `endpoint`, for `cause`.
    pub fn dial(endpoint: impl Into<String>, cause: impl Into<String>) -> Self {
        Self::Dial { endpoint: endpoint.into(), cause: Cause::message(cause) }
    }

    /// The call broke off, for `cause`.
    pub fn transport(cause: impl Into<String>) -> Self {
        Self::Transport { cause: Cause::message(cause) }
    }

    /// An answer with gRPC status `code` (its name, such as `Unavailable`), classified by
    /// the code: [`TalosError::Unreachable`] for [`UNREACHABLE_CODES`], else
    /// [`TalosError::Answered`].
    pub fn answer(code: &str, message: impl Into<String>) -> Self {
        let (code, message) = (code.to_owned(), message.into());
        if UNREACHABLE_CODES.contains(&code.as_str()) {
            Self::Unreachable { code, message }
        } else {
            Self::Answered { code, message }
        }
    }

    /// Whether the node could not be reached (no connection, a call broken off, or the API
    /// saying so): transient; after an Upgrade call it means "still rebooting".
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Dial { .. } | Self::Transport { .. } | Self::Unreachable { .. } => true,
            Self::Tls { .. } | Self::Answered { .. } => false,
        }
    }

    /// The answer of a double (or an older API) that does not serve `method` on `node`:
    /// `Unimplemented`.
    #[must_use]
    pub fn unserved(method: &str, node: &str) -> Self {
        unimplemented(method, node)
    }

    /// Whether the request certainly never reached the API, so that it may be sent through
    /// another endpoint.
    #[must_use]
    pub fn never_sent(&self) -> bool {
        match self {
            Self::Dial { .. } | Self::Tls { .. } => true,
            Self::Transport { .. } | Self::Unreachable { .. } | Self::Answered { .. } => false,
        }
    }
}

/// The legacy `MachineService.Upgrade` request. It has no `force` and no `preserve`: the
/// executor never sets them, so the node runs its own etcd pre-check and nothing is wiped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeRequest {
    /// The installer image.
    pub image: String,
    /// The time left until the call's recorded deadline. Implementations send it as the
    /// gRPC deadline, so that the node abandons the call when the caller does: the
    /// `TalosUpgrade` intent relies on no call being acknowledged after its deadline.
    pub timeout: std::time::Duration,
}

/// How a node applies a machine configuration (`ApplyConfigurationRequest.Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Apply and reboot (refused outside maintenance from Talos 1.14).
    Reboot,
    /// Apply with no reboot if possible, else reboot (Talos 1.13 and older; 1.14 turns it
    /// into [`ApplyMode::NoReboot`]).
    Auto,
    /// Apply with no reboot, or fail (`InvalidArgument` on Talos 1.13 and older when the
    /// change needs one).
    NoReboot,
    /// Store for the next boot.
    Staged,
    /// Apply with no reboot and roll back after a timeout unless confirmed.
    Try,
}

/// `MachineService.ApplyConfiguration`'s request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyConfigRequest {
    /// The whole configuration.
    pub data: Vec<u8>,
    /// How to apply it.
    pub mode: ApplyMode,
    /// Validate and say what would happen; store nothing.
    pub dry_run: bool,
}

/// The node's answer to an ApplyConfiguration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyConfigReply {
    /// The mode the node used (or, in a dry run, would use).
    pub mode: ApplyMode,
    /// What the node says of it (a dry run's summary and diff).
    pub mode_details: String,
    /// Warnings about the configuration.
    pub warnings: Vec<String>,
}

/// The node's acknowledgement of an Upgrade call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeAck {
    /// The acknowledgement text (`Upgrade request received`).
    pub ack: String,
    /// The actor ID the node gave the upgrade.
    pub actor_id: String,
}

/// One etcd member, from `EtcdMemberList`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    /// The member ID.
    pub id: u64,
    /// The member's name: the node's short hostname.
    pub hostname: String,
    /// Whether it is a learner.
    pub is_learner: bool,
}

/// An `ImageService.Pull` of an image into the node's `system` containerd namespace, where
/// `LifecycleService.Upgrade` takes its installer from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// The image reference.
    pub image: String,
    /// The pull's bound, sent as its gRPC deadline (a large image over a slow link).
    pub timeout: std::time::Duration,
}

/// An image in the node's `system` containerd namespace (`ImageService.List`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Its reference.
    pub name: String,
    /// Its digest.
    pub digest: String,
    /// Its size in bytes.
    pub size: i64,
}

/// A `LifecycleService.Upgrade`: install `image` (already in the node's `system`
/// namespace) into the other boot slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallRequest {
    /// The installer image.
    pub image: String,
    /// The time left until the install's recorded deadline, sent as its gRPC deadline.
    pub timeout: std::time::Duration,
}

/// How an install ended: its exit code (a non-zero code is a message of the stream, not a
/// gRPC error) and the last lines the installer wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOutcome {
    /// The installer's exit code.
    pub exit_code: i32,
    /// Its last lines of output ([`INSTALL_OUTPUT_LINES`] at most), oldest first.
    pub output: Vec<String>,
}

/// How many of the installer's last lines an [`InstallOutcome`] keeps.
pub const INSTALL_OUTPUT_LINES: usize = 20;

/// The path Talos's own reboot detection reads the boot ID from (facts sheet §3, §4.4).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// A `MachineService.Reset` request, as node removal sends it: graceful (the node leaves
/// etcd itself and stops its services in order), and powered off afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetRequest {
    /// Graceful: cordon, drain and leave etcd before wiping.
    pub graceful: bool,
    /// Reboot after the reset (false: power off).
    pub reboot: bool,
}

/// What the executor asks of the Talos API.
#[async_trait]
pub trait TalosApi: Send + Sync {
    /// The node's Kubernetes node name, from its `Nodenames.kubernetes.talos.dev` resource.
    async fn nodename(&self, node: &str) -> Result<String, TalosError>;
    /// The machine's stage, from its `MachineStatuses.runtime.talos.dev` resource.
    async fn machine_stage(&self, node: &str) -> Result<MachineStage, TalosError>;
    /// Carries out `write` on `node` (for [`TalosWrite::EtcdRemoveMember`], the control
    /// plane asked to remove another's member): the one way to change a node through this
    /// API. Its answer is of the write's own kind ([`TalosWritten`]). `seal` is proof that
    /// the caller is [`crate::effects`], which alone makes one; a wrapper passes on the one
    /// it was given. A legacy Upgrade blocks while the node pulls and checks the
    /// installer; an install follows its stream to the installer's exit code.
    async fn write(&self, node: &str, write: TalosWrite<'_>, seal: Seal) -> Result<TalosWritten, TalosError>;
    /// The etcd member list, as the node sees it.
    async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, TalosError>;
    /// `EtcdStatus`: the node's own etcd member's status.
    async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, TalosError>;
    /// `EtcdAlarmList`: the etcd cluster's alarms, as the node reports them.
    async fn etcd_alarms(&self, node: &str) -> Result<Vec<EtcdAlarm>, TalosError>;
    /// `MachineService.EtcdSnapshot`: a consistent snapshot of etcd from the node, as the
    /// chunks of its stream. An error in the stream ends it; the snapshot is then partial.
    /// (The default answers `Unimplemented`, for doubles that never take one.)
    async fn etcd_snapshot(&self, node: &str) -> Result<SnapshotStream, TalosError> {
        Err(TalosError::Answered {
            code: "Unimplemented".to_owned(),
            message: format!("no etcd snapshot from {node}: this Talos API does not serve one"),
        })
    }
    /// `ImageService.List` of the node's `system` containerd namespace.
    async fn image_list(&self, node: &str) -> Result<Vec<ImageInfo>, TalosError> {
        Err(unimplemented("ImageService.List", node))
    }
    /// Whether an install runs on the node now: Talos keeps the `installer` ServicePID
    /// (`ServicePIDs.runtime.talos.dev`, namespace `runtime`) while the installer's task
    /// runs, and removes it when it exits (`internal/app/lifecycle/container.go`).
    /// `Ok(None)` when this API cannot tell (the default, for doubles).
    async fn install_running(&self, node: &str) -> Result<Option<bool>, TalosError> {
        let _ = node;
        Ok(None)
    }
    /// The node's active machine configuration (`MachineConfigs.config.talos.dev`,
    /// namespace `config`, ID `v1alpha1`): the YAML it was given. (The default answers
    /// `Unimplemented`.)
    async fn machine_config(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        Err(unimplemented("COSI Get MachineConfigs", node))
    }
    /// The cluster's admin kubeconfig, as a control plane generates it
    /// (`MachineService.Kubeconfig`, the `os:admin` role): the kubeconfig YAML, to be held
    /// in memory for one step and never written. (The default answers `Unimplemented`;
    /// wrappers must forward it.)
    async fn admin_kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        Err(unimplemented("MachineService.Kubeconfig", node))
    }
    /// The Talos roles the client's credentials carry (`os:admin`, `os:operator`, ...,
    /// read from its certificate, no call made), or `None` when not known. (The default
    /// answers `None`; wrappers must forward it.)
    fn client_roles(&self) -> Option<Vec<String>> {
        None
    }
    /// The bootstrap manifests a control plane renders (`Manifests.kubernetes.talos.dev`,
    /// namespace `controlplane`, listed): every Kubernetes object in them, in the order of
    /// the resources' IDs and of the objects in each. (The default answers
    /// `Unimplemented`; wrappers must forward it.)
    async fn bootstrap_manifests(&self, node: &str) -> Result<Vec<serde_json::Value>, TalosError> {
        Err(unimplemented("COSI List Manifests", node))
    }
    /// The boot ID the node's kernel reports ([`BOOT_ID_PATH`], `MachineService.Read`).
    async fn boot_id(&self, node: &str) -> Result<String, TalosError> {
        Err(unimplemented("MachineService.Read", node))
    }
    /// The Talos version the node runs (`MachineService.Version`, its tag, such as
    /// `v1.14.3`). The engine reads the version from the Node; this is what `talosctl
    /// version` asks, served by the Talos API stand-in.
    async fn talos_version(&self, node: &str) -> Result<String, TalosError> {
        Err(unimplemented("MachineService.Version", node))
    }
}

/// The answer of a `TalosApi` method that a double does not serve.
fn unimplemented(method: &str, node: &str) -> TalosError {
    TalosError::Answered {
        code: "Unimplemented".to_owned(),
        message: format!("{method} on {node}: this Talos API does not serve it"),
    }
}

/// The chunks of an etcd snapshot as they arrive.
pub type SnapshotStream = futures::stream::BoxStream<'static, Result<Vec<u8>, TalosError>>;

/// A call to the Talos API that changes a node (or, for a dry run of a configuration and
/// an image pull, asks it to do work an operation wanted).
#[derive(Debug, Clone, Copy)]
pub enum TalosWrite<'a> {
    /// `MachineService.Upgrade` (legacy: the node checks etcd, installs and reboots).
    Upgrade(&'a UpgradeRequest),
    /// `MachineService.ApplyConfiguration`, or its dry run (`dry_run` set: stores nothing).
    ApplyConfiguration(&'a ApplyConfigRequest),
    /// `LifecycleService.Upgrade`: the install into the other boot slot, to its exit code.
    /// It neither drains nor reboots, and Talos runs no etcd check for it. `started` is
    /// set once the node answered that the install began (the stream's first message: the
    /// installer then runs to its end whatever becomes of the stream). A stream that ends
    /// without an exit code is [`TalosError::Transport`].
    Install {
        /// What to install.
        request: &'a InstallRequest,
        /// Set when the node took the install.
        started: &'a AtomicBool,
    },
    /// `MachineService.Reboot` in the default mode. It does not drain.
    Reboot,
    /// `EtcdLeaveCluster`: the node's etcd member leaves the cluster.
    EtcdLeaveCluster,
    /// `EtcdRemoveMemberByID`, asked of a node (another control plane): removes the member
    /// of a control plane that can no longer leave by itself.
    EtcdRemoveMember {
        /// The member to remove.
        member_id: u64,
    },
    /// `MachineService.Reset`: the node wipes itself.
    Reset(&'a ResetRequest),
    /// `ImageService.Pull` into the node's `system` containerd namespace (Talos 1.13 and
    /// later): changes nothing a workload sees.
    ImagePull(&'a PullRequest),
}

impl TalosWrite<'_> {
    /// The API method, as the Talos API names it.
    #[must_use]
    pub fn method(&self) -> &'static str {
        match self {
            Self::Upgrade(_) => "MachineService.Upgrade",
            Self::ApplyConfiguration(_) => "MachineService.ApplyConfiguration",
            Self::Install { .. } => "LifecycleService.Upgrade",
            Self::Reboot => "MachineService.Reboot",
            Self::EtcdLeaveCluster => "MachineService.EtcdLeaveCluster",
            Self::EtcdRemoveMember { .. } => "MachineService.EtcdRemoveMemberByID",
            Self::Reset(_) => "MachineService.Reset",
            Self::ImagePull(_) => "ImageService.Pull",
        }
    }

    /// Whether it changes what the node stores or runs: everything but a configuration's
    /// dry run.
    #[must_use]
    pub fn changes_the_node(&self) -> bool {
        !matches!(self, Self::ApplyConfiguration(request) if request.dry_run)
    }
}

/// The answer to a [`TalosWrite`], of the same kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TalosWritten {
    /// The node's acknowledgement of an Upgrade call.
    Upgrade(UpgradeAck),
    /// How the node applied (or would apply) the configuration.
    ApplyConfiguration(ApplyConfigReply),
    /// How the install ended.
    Install(InstallOutcome),
    /// The reboot's actor ID.
    Reboot(String),
    /// The member left.
    EtcdLeaveCluster,
    /// The member was removed.
    EtcdRemoveMember,
    /// The reset began.
    Reset,
    /// The pulled image's name.
    ImagePull(String),
}

impl TalosWritten {
    /// Its kind, as [`TalosWrite::method`] names it.
    #[must_use]
    pub fn method(&self) -> &'static str {
        match self {
            Self::Upgrade(_) => "MachineService.Upgrade",
            Self::ApplyConfiguration(_) => "MachineService.ApplyConfiguration",
            Self::Install(_) => "LifecycleService.Upgrade",
            Self::Reboot(_) => "MachineService.Reboot",
            Self::EtcdLeaveCluster => "MachineService.EtcdLeaveCluster",
            Self::EtcdRemoveMember => "MachineService.EtcdRemoveMemberByID",
            Self::Reset => "MachineService.Reset",
            Self::ImagePull(_) => "ImageService.Pull",
        }
    }

    fn other(self, asked: &'static str) -> TalosError {
        TalosError::Answered {
            code: "Internal".to_owned(),
            message: format!(
                "{asked} was answered as {}: an implementation of TalosApi::write is wrong",
                self.method()
            ),
        }
    }

    /// The acknowledgement of an Upgrade call.
    ///
    /// # Errors
    /// An answer of another kind (a defect of the implementation, named).
    pub fn upgrade(self) -> Result<UpgradeAck, TalosError> {
        match self {
            Self::Upgrade(ack) => Ok(ack),
            other => Err(other.other("MachineService.Upgrade")),
        }
    }

    /// The reply to an ApplyConfiguration.
    ///
    /// # Errors
    /// An answer of another kind.
    pub fn apply_configuration(self) -> Result<ApplyConfigReply, TalosError> {
        match self {
            Self::ApplyConfiguration(reply) => Ok(reply),
            other => Err(other.other("MachineService.ApplyConfiguration")),
        }
    }

    /// How an install ended.
    ///
    /// # Errors
    /// An answer of another kind.
    pub fn install(self) -> Result<InstallOutcome, TalosError> {
        match self {
            Self::Install(outcome) => Ok(outcome),
            other => Err(other.other("LifecycleService.Upgrade")),
        }
    }

    /// A reboot's actor ID.
    ///
    /// # Errors
    /// An answer of another kind.
    pub fn reboot(self) -> Result<String, TalosError> {
        match self {
            Self::Reboot(actor_id) => Ok(actor_id),
            other => Err(other.other("MachineService.Reboot")),
        }
    }

    /// The pulled image's name.
    ///
    /// # Errors
    /// An answer of another kind.
    pub fn image_pull(self) -> Result<String, TalosError> {
        match self {
            Self::ImagePull(name) => Ok(name),
            other => Err(other.other("ImageService.Pull")),
        }
    }

    /// That a write with no reply of its own (the etcd leave, a member's removal, the
    /// reset) was answered as itself.
    ///
    /// # Errors
    /// An answer of another kind than `asked`'s.
    pub fn done(self, asked: &TalosWrite<'_>) -> Result<(), TalosError> {
        if self.method() == asked.method() { Ok(()) } else { Err(self.other(asked.method())) }
    }
}
