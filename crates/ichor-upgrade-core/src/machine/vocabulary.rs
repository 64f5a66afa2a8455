//! What the per-machine steps share: the machine and its Node as observed, what the Talos
//! API said of it, its etcd membership, the steps' bounds, the pods a drain sees, and the
//! records that say a Talos upgrade is in flight whichever executor made it (the legacy
//! Upgrade call's `TalosUpgrade`, the lifecycle install's `TalosLifecycle`).
//!
//! It depends on no step: each step depends on it.

use std::fmt;
use std::time::Duration;

use crate::conditions::{ConditionStatus, Conditions};
use serde::{Deserialize, Serialize};

/// The role a machine plays in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MachineRole {
    /// Runs etcd and the Kubernetes control plane; upgraded first, strictly one at a time.
    ControlPlane,
    /// Runs workloads; upgraded after the control planes, up to `maxUnavailable` at once.
    Worker,
}

impl MachineRole {
    /// `control-plane` or `worker`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControlPlane => "control-plane",
            Self::Worker => "worker",
        }
    }
}

/// The machine being upgraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    /// The machine's name.
    pub name: String,
    /// Its role.
    pub role: MachineRole,
}

/// The machine's Node, as Kubernetes reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeObservation {
    /// The Node's name (recorded in the Upgrade marker).
    pub name: String,
    /// Whether the Node is Ready.
    pub ready: bool,
    /// `status.nodeInfo.osImage`, such as `Talos (v1.14.3)`.
    pub os_image: String,
    /// `status.nodeInfo.bootID`.
    pub boot_id: String,
    /// The `extensions.talos.dev/schematic` annotation, if set.
    pub schematic: Option<String>,
}

/// A Talos machine stage (`MachineStatuses.runtime.talos.dev`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineStage {
    /// Booting.
    Booting,
    /// Installing.
    Installing,
    /// In maintenance mode.
    Maintenance,
    /// Running.
    Running,
    /// Rebooting.
    Rebooting,
    /// Shutting down.
    ShuttingDown,
    /// Resetting.
    Resetting,
    /// Running an upgrade sequence.
    Upgrading,
    /// A stage this build does not know.
    Unknown,
}

impl MachineStage {
    /// Whether the stage shows an upgrade under way or its reboot.
    #[must_use]
    pub fn shows_upgrade(self) -> bool {
        match self {
            Self::Upgrading | Self::Installing | Self::Rebooting | Self::ShuttingDown => true,
            Self::Booting | Self::Maintenance | Self::Running | Self::Resetting | Self::Unknown => false,
        }
    }
}

/// What the Talos API said when the driver asked the machine's stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TalosObservation {
    /// It answered.
    Answered {
        /// The machine's stage.
        stage: MachineStage,
    },
    /// It could not be reached (dial or transport error, or the call's bound passed).
    Unreachable {
        /// The error, for the status.
        error: String,
    },
    /// It answered with an error.
    Error {
        /// The error, for the status.
        error: String,
    },
}

/// A control plane's etcd membership, from the member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdMembership {
    /// A voting member.
    Voter,
    /// A learner, not yet voting.
    Learner,
    /// Not in the member list.
    Absent,
    /// The member list could not be read.
    Unknown {
        /// Why.
        error: String,
    },
}

/// The step's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepTimeouts {
    /// How long an evacuation may take before the operation pauses.
    pub evacuation: Duration,
    /// The Upgrade call's own bound (the node pulls and checks the installer before it
    /// answers); also how long an unconfirmed intent is waited on.
    pub upgrade_call: Duration,
    /// How long after the Upgrade call the machine may take to come back verified.
    pub verify: Duration,
    /// How often a wait on something no Kubernetes watch reports is looked at again: the
    /// Talos API (a busy or unreachable machine before its call), etcd membership, and
    /// storage replicas moving off. Waits on the Node (Ready, boot ID, osImage) have no
    /// poll: a watch on Nodes reports them. Default 5 s: one Talos stage read (and, on a
    /// control plane, one member list) per waiting machine every 5 s.
    pub poll: Duration,
    /// The lifecycle executor's drain bound, from the install's end: Talos's own
    /// `DrainTimeout`, 5 minutes. Past it with pods left, the operation pauses.
    pub drain: Duration,
    /// How often the lifecycle executor's drain looks at the pods it evicted (no watch
    /// reports them to the engine): 1 s, the interval `kubectl drain` waits for deletions
    /// at.
    pub drain_poll: Duration,
    /// How long a reboot the lifecycle executor asked for may show no sign (the node on
    /// the same boot, as Talos itself reports it, and running) before it is asked for
    /// again. Default 2 minutes: Talos's reboot stops its pods and services, then reboots,
    /// and its API goes silent within seconds of the call.
    pub reboot_confirm: Duration,
}

impl Default for StepTimeouts {
    fn default() -> Self {
        Self {
            evacuation: Duration::from_secs(30 * 60),
            upgrade_call: Duration::from_secs(10 * 60),
            verify: Duration::from_secs(30 * 60),
            poll: Duration::from_secs(5),
            drain: DRAIN_TIMEOUT,
            drain_poll: Duration::from_secs(1),
            reboot_confirm: Duration::from_secs(2 * 60),
        }
    }
}

/// The condition type of the lifecycle executor's progress.
pub const TALOS_LIFECYCLE: &str = "TalosLifecycle";

/// Whether the machine's conditions show a lifecycle upgrade in flight.
#[must_use]
pub fn lifecycle_in_flight(conditions: &Conditions) -> bool {
    conditions.get(TALOS_LIFECYCLE).is_some_and(|c| c.status != ConditionStatus::False)
}

/// The bound of the drain (Talos's `DrainTimeout`, five minutes) as a default.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How the installer ended, by its exit code (`pkg/machinery/constants`, facts sheet §1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallExit {
    /// 0: installed.
    Success,
    /// 1: an error of no known kind.
    Unknown,
    /// 2: invalid input (the request or the image).
    InvalidInput,
    /// 3: not supported on this machine.
    Unsupported,
    /// 4: the environment refused it (the host-version preflight: an upgrade path the
    /// target's installer does not take).
    Environment,
    /// 5: a dependency failed (an image or artifact could not be had).
    Dependency,
    /// 6: an I/O error (the disk).
    Io,
    /// 7: the install itself failed.
    InstallFailed,
    /// Any other code.
    Other(i32),
}

impl InstallExit {
    /// The exit of this code.
    #[must_use]
    pub fn from_code(code: i32) -> Self {
        match code {
            0 => Self::Success,
            1 => Self::Unknown,
            2 => Self::InvalidInput,
            3 => Self::Unsupported,
            4 => Self::Environment,
            5 => Self::Dependency,
            6 => Self::Io,
            7 => Self::InstallFailed,
            other => Self::Other(other),
        }
    }

    /// The exit code.
    #[must_use]
    pub fn code(self) -> i32 {
        match self {
            Self::Success => 0,
            Self::Unknown => 1,
            Self::InvalidInput => 2,
            Self::Unsupported => 3,
            Self::Environment => 4,
            Self::Dependency => 5,
            Self::Io => 6,
            Self::InstallFailed => 7,
            Self::Other(code) => code,
        }
    }

    /// The CamelCase reason of a failure with this exit.
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Self::Success => "Installed",
            Self::Unknown => "InstallUnknownError",
            Self::InvalidInput => "InstallInvalidInput",
            Self::Unsupported => "InstallUnsupported",
            Self::Environment => "InstallEnvironment",
            Self::Dependency => "InstallDependency",
            Self::Io => "InstallIoError",
            Self::InstallFailed => "InstallFailed",
            Self::Other(_) => "InstallExitCode",
        }
    }

    /// What the code means, for people.
    #[must_use]
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Unknown => "an unknown error",
            Self::InvalidInput => "invalid input",
            Self::Unsupported => "not supported on this machine",
            Self::Environment => "refused by the environment (the installer's host-version preflight)",
            Self::Dependency => "a dependency failed (an image or artifact)",
            Self::Io => "an I/O error",
            Self::InstallFailed => "the install failed",
            Self::Other(_) => "an exit code the installer does not document",
        }
    }
}

/// A pod on the node, as the drain sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID as read, the eviction's precondition: a pod of the same name made since
    /// (a StatefulSet's, on another node) is not the one read, and is left alone. `None`
    /// from a view that has no UIDs: the eviction then goes by name.
    pub uid: Option<String>,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
