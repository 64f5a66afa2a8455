//! Operations: their kinds, their spec as written, its validation, and the well-known
//! labels and annotations people use to steer a rollout.

use serde::{Deserialize, Serialize};

use crate::kubernetes::plan::KubernetesPlanProblem;
use crate::releases::KnownReleases;
use crate::versions::{KubernetesVersion, TalosVersion, VersionError};

/// Machine label (integer) that orders a rollout within a role: ascending, machines
/// without it last, then by name. Workers with different values are separate waves.
pub const ORDER_LABEL: &str = "ichor.dev/upgrade-order";
/// Annotation, on a machine or its Node, that holds the machine back: it is not started
/// and the operation cannot complete while it remains. Any value holds.
pub const HOLD_ANNOTATION: &str = "ichor.dev/hold";
/// A mark a controller puts on its own view of the machine of the node it runs on (never
/// written to the machine): that machine goes last in its role
/// ([`crate::rollout::MachineView::last`]).
pub const CONTROLLER_NODE_MARK: &str = "ichor.dev/controller-node";
/// Annotation on an operation that resumes it after a pause. Its value is a token (any
/// new value, such as a timestamp): each distinct value resumes once.
pub const RESUME_ANNOTATION: &str = "ichor.dev/resume";

/// Annotation on an operation that pauses it while it is there, whatever its value (who
/// paused it, and why, for people): nothing new begins (no machine starts, no call not yet
/// made goes out, a machine not past its call is stopped), and what is past its call
/// finishes. Removing it lifts the pause. A failure's pause is lifted by
/// [`RESUME_ANNOTATION`] instead.
pub const PAUSE_ANNOTATION: &str = "ichor.dev/pause";

/// How a person lifts the pause they put on operation `name` with [`PAUSE_ANNOTATION`].
#[must_use]
pub fn unpause_hint(name: &str) -> String {
    format!("to go on: kubectl annotate talosoperation {name} {PAUSE_ANNOTATION}- (or kubectl ichor resume {name})")
}

/// How a person resumes the paused operation `name`: the command that sets
/// [`RESUME_ANNOTATION`] to a new value, for pause messages and their Events.
#[must_use]
pub fn resume_hint(name: &str) -> String {
    format!(
        "to resume once the cause is fixed: kubectl annotate talosoperation {name} {RESUME_ANNOTATION}=$(date +%s) --overwrite"
    )
}

/// The kinds of operation this engine runs: an upgrade of Talos ([`OperationKind::Talos`]),
/// an upgrade of Kubernetes ([`OperationKind::Kubernetes`]) and a machine's removal
/// ([`OperationKind::Remove`]), all under the cluster's lock. Other kinds are refused by
/// [`OperationSpec::validate`], never run as another kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationKind {
    /// Upgrade the Talos OS of every machine of a cluster.
    Talos,
    /// Upgrade the Kubernetes of every machine of a cluster (`spec.targetVersion` is a
    /// Kubernetes version).
    Kubernetes,
    /// Remove one machine from the cluster (`spec.machine`).
    Remove,
}

impl OperationKind {
    /// The upgrade's kind as written in a spec.
    pub const TALOS: &'static str = "talos";
    /// The Kubernetes upgrade's kind as written in a spec.
    pub const KUBERNETES: &'static str = "kubernetes";
    /// The removal's kind as written in a spec.
    pub const REMOVE: &'static str = "remove";
}

/// A Kubernetes upgrade's spec that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSpec {
    /// The target Kubernetes version.
    pub target: KubernetesVersion,
    /// How many workers' kubelets may restart at once.
    pub max_unavailable: WorkerLimit,
    /// Whether an etcd snapshot precedes the first control plane.
    pub etcd_snapshot: SnapshotMode,
}

/// An operation's spec as written by a person or a tool; validated, never trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationSpec {
    /// `talos`, `kubernetes` or `remove`; anything else is refused.
    pub kind: String,
    /// The version to upgrade to: a Talos version such as `v1.14.4`, or for `kubernetes`
    /// a Kubernetes version such as `1.35.0`.
    pub target_version: String,
    /// How many workers may be unavailable at once: a count (at least 1), or a
    /// percentage of the cluster's workers (`"10%"`).
    pub max_unavailable: MaxUnavailable,
    /// For `remove`: the machine to remove.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Whether a machine with preflight blockers waits ([`PreflightMode::Enforce`], the
    /// default) or is started with the blockers recorded ([`PreflightMode::Warn`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightMode>,
    /// Whether an etcd snapshot is taken before the first control plane's Upgrade call
    /// ([`SnapshotMode::Required`], the default) or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshot: Option<SnapshotMode>,
    /// For `remove`: go on with the removal of a control plane that leaves two. Without
    /// it such a removal is refused at planning ([`Refusal::LeavesTwoControlPlanes`]): a
    /// two-member etcd tolerates no failure, and the next upgrade refuses the cluster.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_two_control_planes: bool,
}

/// Whether an operation takes an etcd snapshot before it touches the first control plane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotMode {
    /// A snapshot is taken and recorded before the first control plane's Upgrade call;
    /// failing to take it pauses the operation before any control plane is touched.
    #[default]
    Required,
    /// No snapshot (the cluster is backed up otherwise).
    Skip,
}

/// What the preflight gate (see [`crate::preflight`]) does with a machine it finds
/// blockers for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreflightMode {
    /// The machine is not started while blockers stand; the operation waits, naming them.
    #[default]
    Enforce,
    /// The machine is started; the blockers are recorded as a warning.
    Warn,
}

/// `maxUnavailable` as written: a count of workers, or text, which must be a percentage
/// of them such as `"10%"`. Validated ([`MaxUnavailable::validate`]), never trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MaxUnavailable {
    /// A count of workers.
    Count(i64),
    /// Text: a percentage of the workers, `1%` to `100%`.
    Text(String),
}

impl From<i64> for MaxUnavailable {
    fn from(count: i64) -> Self {
        Self::Count(count)
    }
}

impl From<&str> for MaxUnavailable {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl std::fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}

impl MaxUnavailable {
    /// The count as written, if it is one.
    #[must_use]
    pub fn count(&self) -> Option<i64> {
        match self {
            Self::Count(n) => Some(*n),
            Self::Text(_) => None,
        }
    }

    /// The limit: a count from 1 to [`u32::MAX`], or a percentage from `1%` to `100%`
    /// (digits with no leading zero and a `%`, nothing else).
    ///
    /// # Errors
    /// [`Refusal::InvalidMaxUnavailable`] for a count out of range,
    /// [`Refusal::InvalidMaxUnavailablePercent`] for any other text.
    pub fn validate(&self) -> Result<WorkerLimit, Refusal> {
        match self {
            Self::Count(n) => match u32::try_from(*n) {
                Ok(n) if n >= 1 => Ok(WorkerLimit::Count(n)),
                _ => Err(Refusal::InvalidMaxUnavailable { value: *n }),
            },
            Self::Text(text) => text
                .strip_suffix('%')
                .filter(|digits| {
                    digits.len() <= 3 && !digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit())
                })
                .and_then(|digits| digits.parse::<u32>().ok())
                .filter(|p| (1..=100).contains(p))
                .map(WorkerLimit::Percent)
                .ok_or_else(|| Refusal::InvalidMaxUnavailablePercent { value: text.clone() }),
        }
    }
}

/// A valid `maxUnavailable`: how many workers may be unavailable at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerLimit {
    /// That many.
    Count(u32),
    /// That percentage of the cluster's workers, rounded down, at least 1.
    Percent(u32),
}

impl WorkerLimit {
    /// The limit in a cluster of `workers` workers: the count, or the percentage of them
    /// rounded down and at least 1 (`10%` of 25 is 2; of 5, 1).
    #[must_use]
    pub fn of(self, workers: usize) -> u32 {
        match self {
            Self::Count(n) => n,
            Self::Percent(p) => {
                let share = u64::try_from(workers).unwrap_or(u64::MAX).saturating_mul(u64::from(p)) / 100;
                u32::try_from(share).unwrap_or(u32::MAX).max(1)
            }
        }
    }
}

/// A spec that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSpec {
    /// What the operation does.
    pub kind: OperationKind,
    /// The target Talos version (equal to the release set's).
    pub target: TalosVersion,
    /// How many workers may be unavailable at once.
    pub max_unavailable: WorkerLimit,
    /// What the preflight gate does.
    pub preflight: PreflightMode,
    /// Whether an etcd snapshot precedes the first control plane.
    pub etcd_snapshot: SnapshotMode,
}

/// Why an operation is refused. A refusal touches nothing: no lock, no machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    /// `spec.cluster` names no TalosCluster (in the operation's namespace). The operation
    /// is judged again when one appears.
    #[error(
        "TalosCluster {cluster:?} does not exist in the operation's namespace: create it, or correct spec.cluster; the operation is looked at again when it appears"
    )]
    ClusterNotFound {
        /// The cluster as written.
        cluster: String,
    },
    /// The kind is not `talos`, `kubernetes` or `remove`.
    #[error(
        "operation kind {kind:?} is not supported: only \"talos\" (upgrade), \"kubernetes\" (upgrade) and \"remove\" operations run here, and no other kind is ever run as another"
    )]
    UnsupportedKind {
        /// The kind as written.
        kind: String,
    },
    /// A removal without `spec.machine`.
    #[error("spec.machine is required for an operation of kind \"remove\"")]
    MissingMachine,
    /// An upgrade that names a machine: `spec.machine` is a removal's alone, and an upgrade
    /// never runs on one machine.
    #[error(
        "spec.machine is only for an operation of kind \"remove\"; an upgrade (kind {kind:?}) takes every machine of the cluster and names none"
    )]
    MachineNotForKind {
        /// The kind as written.
        kind: String,
    },
    /// A removal of a machine the cluster does not have.
    #[error("spec.machine {machine:?} is not a machine of the cluster")]
    UnknownMachine {
        /// The machine as written.
        machine: String,
    },
    /// `spec.targetVersion` of a Kubernetes upgrade is not a Kubernetes version.
    #[error("spec.targetVersion (a Kubernetes version for kind \"kubernetes\"): {error}")]
    InvalidKubernetesTarget {
        /// The parse error, quoting the text.
        error: String,
    },
    /// `spec.targetVersion` is not a Talos version.
    #[error("spec.targetVersion: {error}")]
    InvalidTarget {
        /// The parse error, quoting the text.
        error: String,
    },
    /// The release set's Talos version is not a Talos version.
    #[error("the release set's Talos version: {error}")]
    InvalidReleaseVersion {
        /// The parse error, quoting the text.
        error: String,
    },
    /// The target is not the release set's Talos version.
    #[error(
        "spec.targetVersion {target} is not the release set's Talos version {release}; only the release set's version, or the latest known patch of a minor line on the way to it, can be rolled out"
    )]
    TargetNotReleaseSet {
        /// The operation's target.
        target: String,
        /// The release set's Talos version.
        release: String,
    },
    /// `maxUnavailable` is not between 1 and [`u32::MAX`].
    #[error("spec.maxUnavailable is {value}; it must be between 1 and 4294967295")]
    InvalidMaxUnavailable {
        /// The value as written.
        value: i64,
    },
    /// `maxUnavailable` is text other than a percentage from `1%` to `100%`.
    #[error("spec.maxUnavailable is {value:?}; text must be a percentage of the workers from \"1%\" to \"100%\"")]
    InvalidMaxUnavailablePercent {
        /// The text as written.
        value: String,
    },
    /// A removal of a control plane that would leave two, not allowed by the operation.
    #[error(
        "removing control plane {machine:?} would leave two: a two-member etcd tolerates no failure (losing either member loses quorum), and the next upgrade refuses a cluster of two control planes; add a control plane first, then remove this one (or, knowing this, allow it: spec.allowTwoControlPlanes, --allow-two-control-planes); nothing was touched"
    )]
    LeavesTwoControlPlanes {
        /// The control plane to remove.
        machine: String,
    },
    /// `spec.targetVersion` of an operation that started differs from the target it
    /// started with: a started operation's target never changes (a control plane between
    /// two targets could skip a minor, a kubelet pass its API servers). Nothing new starts;
    /// machines past their call are seen to their verification on the first target.
    #[error(
        "spec.targetVersion was changed from {started} to {now} after the operation started: a started operation's target never changes; set it back to {started} to go on, or delete this operation (what is under way finishes on {started}) and create another for {now}"
    )]
    TargetChanged {
        /// The target it started with.
        started: String,
        /// The target written now.
        now: String,
    },
    /// The maintenance windows (`spec.maintenance` of the operation, else of its
    /// TalosCluster) could not be read: a schedule, a duration, a time zone or a blackout
    /// is wrong. Nothing starts until they are corrected; what is under way is seen to
    /// its verification.
    #[error("spec.maintenance: {problem}; no machine starts until it is corrected, and nothing was touched")]
    InvalidMaintenance {
        /// What is wrong, naming the field.
        problem: String,
    },
    /// The health gates (`spec.gates`) do not read: a bad expression, an unknown kind,
    /// two gates of one name. Nothing starts until they are corrected; what is under way
    /// is seen to its verification.
    #[error("spec.gates: {problem}; no machine starts until they are corrected, and nothing was touched")]
    InvalidGate {
        /// What is wrong, naming the gate.
        problem: String,
    },
    /// Planning, before any machine started, found the cluster cannot be taken to the
    /// target as it stands. Nothing was touched.
    #[error("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unplannable {
        /// Every problem found, at least one.
        problems: Vec<PlanProblem>,
    },
}

/// A problem planning finds before any machine starts (DESIGN §9: refused at planning,
/// naming the reason; nothing touched).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PlanProblem {
    /// These machines cannot go to the target in one step.
    #[error("{}: {refusal}", machines.join(", "))]
    UpgradePath {
        /// The machines, all with the same refusal.
        machines: Vec<String>,
        /// The refusal, naming the path to take.
        refusal: String,
    },
    /// A machine's Node reports an osImage that is not `Talos (vX.Y.Z)`.
    #[error("{machine}: node status.nodeInfo.osImage: {error}")]
    BadOsImage {
        /// The machine.
        machine: String,
        /// The parse error, quoting the text.
        error: String,
    },
    /// The cluster's Kubernetes version does not parse.
    #[error("the cluster's Kubernetes version: {error}")]
    BadKubernetesVersion {
        /// The parse error, quoting the text.
        error: String,
    },
    /// The target is on a minor line newer than any this engine knows: a mistyped version,
    /// or a release newer than the engine. Its Kubernetes range and upgrade path are
    /// unknown, so nothing else is said of it.
    #[error(
        "Talos {target} is not a release this engine knows: the newest minor line it knows is {newest} (versions::KUBERNETES_SUPPORT); check the version for a typo, or upgrade Ichor to one that knows {target} before upgrading the cluster to it"
    )]
    UnknownRelease {
        /// The target.
        target: String,
        /// The newest minor line the engine knows (`v1.15`).
        newest: String,
    },
    /// The cluster's Kubernetes version does not run on the target.
    #[error("Kubernetes pairing refused: {refusal}")]
    KubernetesPairing {
        /// The refusal, naming the supported range.
        refusal: String,
    },
    /// Exactly two control planes: rebooting either loses etcd quorum.
    #[error(
        "two control planes ({}): a two-member etcd cluster loses quorum when either reboots; add a third control plane (or remove one) first",
        machines.join(", ")
    )]
    TwoControlPlanes {
        /// The two.
        machines: Vec<String>,
    },
    /// A Kubernetes upgrade would break the cluster (see
    /// [`crate::kubernetes::plan::KubernetesPlanProblem`]).
    #[error("{0}")]
    Kubernetes(KubernetesPlanProblem),
    /// Machine names that appear more than once.
    #[error("duplicate machine names: {}", names.join(", "))]
    DuplicateMachineNames {
        /// The names.
        names: Vec<String>,
    },
    /// Nodes of the cluster that no machine names: an upgrade of the machines alone would
    /// leave them on the old version and report Completed.
    #[error(
        "Nodes with no TalosMachine: {} (create a TalosMachine for each, or set spec.discovery: Nodes on the TalosCluster to create them from the Nodes)",
        nodes.join(", ")
    )]
    NodesWithoutMachines {
        /// The Nodes.
        nodes: Vec<String>,
    },
}

impl PlanProblem {
    /// The CamelCase reason users see.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UpgradePath { .. } => "UpgradePathRefused",
            Self::BadOsImage { .. } => "BadOsImage",
            Self::BadKubernetesVersion { .. } => "BadKubernetesVersion",
            Self::KubernetesPairing { .. } => "KubernetesPairingRefused",
            Self::UnknownRelease { .. } => "UnknownTalosRelease",
            Self::TwoControlPlanes { .. } => "TwoControlPlanes",
            Self::DuplicateMachineNames { .. } => "DuplicateMachineNames",
            Self::NodesWithoutMachines { .. } => "NodesWithoutMachines",
            Self::Kubernetes(problem) => problem.reason(),
        }
    }
}

impl Refusal {
    /// The CamelCase reason users see on the operation's condition and events.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ClusterNotFound { .. } => "ClusterNotFound",
            Self::UnsupportedKind { .. } => "UnsupportedKind",
            Self::MissingMachine => "MissingMachine",
            Self::UnknownMachine { .. } => "UnknownMachine",
            Self::InvalidTarget { .. } => "InvalidTargetVersion",
            Self::InvalidKubernetesTarget { .. } => "InvalidKubernetesTargetVersion",
            Self::InvalidReleaseVersion { .. } => "InvalidReleaseVersion",
            Self::TargetNotReleaseSet { .. } => "TargetNotReleaseSet",
            Self::InvalidMaxUnavailable { .. } | Self::InvalidMaxUnavailablePercent { .. } => "InvalidMaxUnavailable",
            Self::MachineNotForKind { .. } => "MachineNotForKind",
            Self::LeavesTwoControlPlanes { .. } => "LeavesTwoControlPlanes",
            Self::TargetChanged { .. } => "TargetChanged",
            Self::InvalidMaintenance { .. } => "InvalidMaintenance",
            Self::InvalidGate { .. } => "InvalidGate",
            Self::Unplannable { problems } => problems.first().map_or("Unplannable", PlanProblem::reason),
        }
    }
}

impl OperationSpec {
    /// An upgrade of every machine to `target_version`, at most `max_unavailable` workers
    /// at once, with the preflight gate's default.
    #[must_use]
    pub fn talos(target_version: &str, max_unavailable: i64) -> Self {
        Self {
            kind: OperationKind::TALOS.to_owned(),
            target_version: target_version.to_owned(),
            max_unavailable: max_unavailable.into(),
            machine: None,
            preflight: None,
            etcd_snapshot: None,
            allow_two_control_planes: false,
        }
    }

    /// Whether this is a removal (`kind: remove`).
    #[must_use]
    pub fn is_removal(&self) -> bool {
        self.kind == OperationKind::REMOVE
    }

    /// Whether this is a Kubernetes upgrade (`kind: kubernetes`).
    #[must_use]
    pub fn is_kubernetes(&self) -> bool {
        self.kind == OperationKind::KUBERNETES
    }

    /// Validates a Kubernetes upgrade's spec: kind `kubernetes`, naming no machine, the
    /// target a Kubernetes version, `maxUnavailable` between 1 and [`u32::MAX`].
    ///
    /// # Errors
    /// The first [`Refusal`] found, in that order.
    pub fn validate_kubernetes(&self) -> Result<KubernetesSpec, Refusal> {
        if !self.is_kubernetes() {
            return Err(Refusal::UnsupportedKind { kind: self.kind.clone() });
        }
        if self.machine.is_some() {
            return Err(Refusal::MachineNotForKind { kind: self.kind.clone() });
        }
        let target = KubernetesVersion::parse(&self.target_version)
            .map_err(|e| Refusal::InvalidKubernetesTarget { error: e.to_string() })?;
        let max_unavailable = self.max_unavailable.validate()?;
        Ok(KubernetesSpec { target, max_unavailable, etcd_snapshot: self.etcd_snapshot.unwrap_or_default() })
    }

    /// Validates a removal's spec: kind `remove` naming the machine to remove.
    ///
    /// # Errors
    /// [`Refusal::UnsupportedKind`] for another kind, [`Refusal::MissingMachine`] without a
    /// machine.
    pub fn validate_removal(&self) -> Result<&str, Refusal> {
        if !self.is_removal() {
            return Err(Refusal::UnsupportedKind { kind: self.kind.clone() });
        }
        self.machine.as_deref().filter(|m| !m.is_empty()).ok_or(Refusal::MissingMachine)
    }

    /// Validates the spec against the release set's Talos version (DESIGN §3 rules 9 and
    /// 10, §9): the kind must be `talos`, naming no machine, the target a Talos version
    /// equal to the release set's, and `maxUnavailable` between 1 and [`u32::MAX`] (the
    /// CRD's schema says the same to an API server that checks it).
    ///
    /// # Errors
    /// The first [`Refusal`] found, in that order.
    pub fn validate(&self, release_talos_version: &str) -> Result<ValidSpec, Refusal> {
        self.validate_with(release_talos_version, &KnownReleases::empty())
    }

    /// As [`Self::validate`], with one more target allowed: a hop toward the release set,
    /// the latest patch `releases` knows of a minor line before the release set's
    /// ([`KnownReleases::is_talos_hop_toward`]). A cluster whose release set is two minors
    /// ahead goes there in such hops, each verified before the next; every other rule
    /// (the path from each machine's version, the Kubernetes pairing) still applies.
    ///
    /// # Errors
    /// As [`Self::validate`].
    pub fn validate_with(&self, release_talos_version: &str, releases: &KnownReleases) -> Result<ValidSpec, Refusal> {
        if self.kind == OperationKind::REMOVE || self.kind == OperationKind::KUBERNETES {
            // A removal and a Kubernetes upgrade are valid on their own terms (see
            // `validate_removal`, `validate_kubernetes`), never as a Talos upgrade.
            return Err(Refusal::UnsupportedKind { kind: self.kind.clone() });
        }
        let kind = match self.kind.as_str() {
            OperationKind::TALOS => OperationKind::Talos,
            other => return Err(Refusal::UnsupportedKind { kind: other.to_owned() }),
        };
        if self.machine.is_some() {
            return Err(Refusal::MachineNotForKind { kind: self.kind.clone() });
        }
        let target = TalosVersion::parse(&self.target_version)
            .map_err(|e: VersionError| Refusal::InvalidTarget { error: e.to_string() })?;
        let release = TalosVersion::parse(release_talos_version)
            .map_err(|e| Refusal::InvalidReleaseVersion { error: e.to_string() })?;
        if target != release && !releases.is_talos_hop_toward(&target, &release) {
            return Err(Refusal::TargetNotReleaseSet { target: target.to_string(), release: release.to_string() });
        }
        let max_unavailable = self.max_unavailable.validate()?;
        Ok(ValidSpec {
            kind,
            target,
            max_unavailable,
            preflight: self.preflight.unwrap_or_default(),
            etcd_snapshot: self.etcd_snapshot.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str, target: &str, max_unavailable: i64) -> OperationSpec {
        OperationSpec {
            preflight: None,
            allow_two_control_planes: false,
            etcd_snapshot: None,
            kind: kind.into(),
            target_version: target.into(),
            max_unavailable: max_unavailable.into(),
            machine: None,
        }
    }

    #[test]
    fn a_talos_spec_for_the_release_set_is_valid() {
        let valid = spec("talos", "v1.14.4", 2).validate("v1.14.4").unwrap();
        assert_eq!(valid.kind, OperationKind::Talos);
        assert_eq!(valid.target.to_string(), "v1.14.4");
        assert_eq!(valid.max_unavailable, WorkerLimit::Count(2));
    }

    #[test]
    fn kinds_other_than_talos_are_refused_never_run() {
        for kind in ["kubernetes", "ichor", "Talos", "", "banana", "Kubernetes"] {
            let refusal = spec(kind, "v1.14.4", 1).validate("v1.14.4").unwrap_err();
            assert_eq!(refusal, Refusal::UnsupportedKind { kind: kind.into() });
            assert!(refusal.to_string().contains("not supported"), "{refusal}");
        }
    }

    #[test]
    fn an_upgrade_that_names_a_machine_is_refused() {
        let mut upgrade = spec("talos", "v1.14.4", 1);
        upgrade.machine = Some("worker-2".into());
        let refusal = upgrade.validate("v1.14.4").unwrap_err();
        assert_eq!(refusal, Refusal::MachineNotForKind { kind: "talos".into() });
        assert_eq!(refusal.reason(), "MachineNotForKind");
        assert!(refusal.to_string().starts_with("spec.machine is only for"), "{refusal}");
    }

    #[test]
    fn max_unavailable_past_u32_is_refused_naming_the_real_limit() {
        for value in [0, -1, i64::from(u32::MAX) + 1, i64::MAX] {
            let refusal = spec("talos", "v1.14.4", value).validate("v1.14.4").unwrap_err();
            assert_eq!(refusal, Refusal::InvalidMaxUnavailable { value });
            assert!(refusal.to_string().contains("between 1 and 4294967295"), "{refusal}");
        }
        assert_eq!(
            spec("talos", "v1.14.4", i64::from(u32::MAX)).validate("v1.14.4").unwrap().max_unavailable,
            WorkerLimit::Count(u32::MAX)
        );
    }

    #[test]
    fn a_target_other_than_the_release_sets_is_refused_naming_both() {
        let refusal = spec("talos", "v1.14.5", 1).validate("v1.14.4").unwrap_err();
        assert_eq!(refusal, Refusal::TargetNotReleaseSet { target: "v1.14.5".into(), release: "v1.14.4".into() });
        let text = refusal.to_string();
        assert!(text.contains("v1.14.5") && text.contains("v1.14.4"), "{text}");
    }

    #[test]
    fn a_hop_toward_the_release_set_is_valid_only_as_the_latest_known_patch_of_an_earlier_line() {
        let known = KnownReleases::built_in();
        let hop = spec("talos", "v1.13.9", 1).validate_with("v1.14.4", known).unwrap();
        assert_eq!(hop.target.to_string(), "v1.13.9");
        // Not without the releases, not an older patch, not past the release set.
        assert!(spec("talos", "v1.13.9", 1).validate("v1.14.4").is_err());
        for target in ["v1.13.8", "v1.14.5", "v1.15.0", "v1.12.1"] {
            let refusal = spec("talos", target, 1).validate_with("v1.14.4", known).unwrap_err();
            assert_eq!(refusal.reason(), "TargetNotReleaseSet", "{target}");
        }
    }

    #[test]
    fn an_unparseable_target_is_refused_naming_the_field_and_text() {
        let refusal = spec("talos", "v1.14", 1).validate("v1.14.4").unwrap_err();
        assert_eq!(refusal.reason(), "InvalidTargetVersion");
        let text = refusal.to_string();
        assert!(text.starts_with("spec.targetVersion: ") && text.contains("\"v1.14\""), "{text}");
    }

    #[test]
    fn a_removal_names_its_machine_and_is_never_an_upgrade() {
        let mut removal = spec("remove", "", 1);
        assert_eq!(removal.validate_removal(), Err(Refusal::MissingMachine));
        removal.machine = Some("worker-2".into());
        assert_eq!(removal.validate_removal(), Ok("worker-2"));
        assert!(matches!(removal.validate("v1.14.4"), Err(Refusal::UnsupportedKind { .. })));
        assert!(matches!(spec("talos", "v1.14.4", 1).validate_removal(), Err(Refusal::UnsupportedKind { .. })));
    }

    #[test]
    fn a_kubernetes_upgrade_takes_a_kubernetes_version_and_names_no_machine() {
        let valid = spec("kubernetes", "1.35.0", 3).validate_kubernetes().unwrap();
        assert_eq!(valid.target.to_string(), "1.35.0");
        assert_eq!(valid.max_unavailable, WorkerLimit::Count(3));
        assert_eq!(spec("kubernetes", "v1.35.0", 1).validate_kubernetes().unwrap().target, valid.target);
        let refusal = spec("kubernetes", "1.35", 1).validate_kubernetes().unwrap_err();
        assert_eq!(refusal.reason(), "InvalidKubernetesTargetVersion");
        assert!(refusal.to_string().contains("\"1.35\""), "{refusal}");
        let mut named = spec("kubernetes", "1.35.0", 1);
        named.machine = Some("cp-1".into());
        assert_eq!(named.validate_kubernetes(), Err(Refusal::MachineNotForKind { kind: "kubernetes".into() }));
        assert!(matches!(spec("talos", "v1.14.4", 1).validate_kubernetes(), Err(Refusal::UnsupportedKind { .. })));
        let refusal = spec("kubernetes", "1.35.0", 0).validate_kubernetes().unwrap_err();
        assert_eq!(refusal, Refusal::InvalidMaxUnavailable { value: 0 });
    }

    #[test]
    fn max_unavailable_must_be_at_least_one() {
        for value in [0, -1, i64::MIN, i64::from(u32::MAX) + 1] {
            let refusal = spec("talos", "v1.14.4", value).validate("v1.14.4").unwrap_err();
            assert_eq!(refusal, Refusal::InvalidMaxUnavailable { value });
        }
    }

    /// Issue 55 item 3: `maxUnavailable` also takes a percentage of the workers, rounded
    /// down, at least 1; any other text is refused naming it, and both kinds take it.
    #[test]
    fn max_unavailable_takes_a_percentage_of_the_workers_rounded_down_at_least_one() {
        let percent = |text: &str| OperationSpec { max_unavailable: text.into(), ..spec("talos", "v1.14.4", 1) };
        let limit = percent("10%").validate("v1.14.4").unwrap().max_unavailable;
        assert_eq!(limit, WorkerLimit::Percent(10));
        assert_eq!([limit.of(25), limit.of(10), limit.of(9), limit.of(0), limit.of(1000)], [2, 1, 1, 1, 100]);
        assert_eq!(WorkerLimit::Percent(100).of(7), 7);
        assert_eq!(WorkerLimit::Count(3).of(1), 3, "a count is the count, whatever the workers");
        let kubernetes = OperationSpec { kind: "kubernetes".into(), target_version: "1.35.0".into(), ..percent("50%") };
        assert_eq!(kubernetes.validate_kubernetes().unwrap().max_unavailable, WorkerLimit::Percent(50));
        for text in ["0%", "101%", "10", "%", "10 %", " 10%", "1.5%", "-5%", "ten%", "", "0010%", "+5%"] {
            let refusal = percent(text).validate("v1.14.4").unwrap_err();
            assert_eq!(refusal, Refusal::InvalidMaxUnavailablePercent { value: text.into() });
            assert_eq!(refusal.reason(), "InvalidMaxUnavailable");
            assert!(refusal.to_string().contains(&format!("{text:?}")), "{refusal}");
        }
    }

    /// The spec as persisted: a count is a number, a percentage its text, each read back
    /// as written.
    #[test]
    fn max_unavailable_round_trips_as_a_number_or_its_text() {
        for (value, json) in [(MaxUnavailable::Count(3), "3"), (MaxUnavailable::from("25%"), "\"25%\"")] {
            assert_eq!(serde_json::to_string(&value).unwrap(), json);
            assert_eq!(serde_json::from_str::<MaxUnavailable>(json).unwrap(), value);
        }
    }
}
