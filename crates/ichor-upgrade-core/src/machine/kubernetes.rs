//! A Kubernetes upgrade's step: for one machine, from what was observed, exactly one
//! [`KubernetesAction`].
//!
//! A Kubernetes upgrade (an operation of kind `kubernetes`) runs in two stages under the
//! same rollout engine ([`KubernetesStage`]): first the control-plane components of each
//! control plane, one control plane at a time; then, once every control plane is done, each
//! machine's kubelet (a control plane's kube-proxy image first, when Talos manages it),
//! control planes first, workers up to `maxUnavailable` at once. So no kubelet is ever
//! newer than an API server.
//!
//! Each change is a machine configuration applied through the Talos API with no reboot
//! (`docs/kubernetes-upgrade-facts.md` §2): the image of one component in the machine's
//! configuration. Progress lives in one condition per machine, [`KUBERNETES_UPGRADE`]:
//! - `Unknown/ApplyRequested`, message `<component> <version>`: written just before the
//!   apply (the intent, as for an Upgrade call);
//! - `True/Applied`, same message: the apply was acknowledged;
//! - `True/ComponentVerified`, same message: that change verified, and another of the
//!   stage's changes still to make on the machine. No change is in flight: a hold, a
//!   pause or a deletion stops the machine here, before its next change (DESIGN §3.11),
//!   where an `ApplyRequested` or `Applied` record keeps it observed to its verification;
//! - `True/ControlPlaneConverged`, message the version: every control-plane component of
//!   the machine verified on it (the first stage's record);
//! - `True/KubernetesConverged`, message the version: the machine verified on it.
//!
//! What the machine's configuration holds is read before every decision, so a change is
//! applied at most once once acknowledged: a configuration that already holds the target
//! image is never applied again (an intent whose call landed is recorded as applied, with
//! no call), and an acknowledged change the configuration no longer holds is a failure,
//! never applied a second time (someone changed the machine under the operation). An
//! intent whose call never landed (the configuration still holds the old image) is applied
//! again: the first call had no effect.
//!
//! A change is verified, not assumed: a control-plane component by its mirror pod on the
//! node (on the target and Ready), a kubelet by its Node (`kubeletVersion` on the target
//! and Ready), kube-proxy by the configuration (Talos does not wait on it either). A
//! component that crash-loops on the target, or that is not Ready on it within its bound,
//! fails the machine: the operation pauses, and the next control plane is never touched.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::conditions::{Condition, ConditionStatus, Conditions};
use crate::kubernetes::component::Component;
use crate::machine::vocabulary::MachineRole;
use crate::time::Timestamp;
use crate::versions::KubernetesVersion;

/// The condition type that records a machine's Kubernetes upgrade.
pub const KUBERNETES_UPGRADE: &str = "KubernetesUpgrade";

/// Condition reasons of [`KUBERNETES_UPGRADE`].
pub mod reason {
    /// `Unknown`: the apply of a component's image is about to be made (the intent).
    pub const APPLY_REQUESTED: &str = "ApplyRequested";
    /// `True`: the apply was acknowledged by the node.
    pub const APPLIED: &str = "Applied";
    /// `True`: the change verified; the machine has another change of its stage to make.
    pub const VERIFIED: &str = "ComponentVerified";
    /// `True`: every control-plane component of the machine verified on the version.
    pub const CONTROL_PLANE_CONVERGED: &str = "ControlPlaneConverged";
    /// `True`: the machine verified on the version (its kubelet, and on a control plane
    /// everything else).
    pub const CONVERGED: &str = "KubernetesConverged";
    /// `False`: a person resumed the operation after the machine failed; the failed
    /// attempt is closed (no record for any target: the node's configuration decides).
    pub const RETRY: &str = "Retry";
    /// `False`: an intent whose apply never reached the node (its configuration does not
    /// hold the change), closed by a hold, a pause, a deletion or a refusal: the machine
    /// changed nothing, and is stopped there (no record for any target).
    pub const NOT_APPLIED: &str = "ApplyNotMade";
    /// A wait, never a record: the apply was not made because a read between its dry run
    /// and its call no longer authorised it (a pause, a hold or a deletion recorded
    /// meanwhile); the next pass decides again.
    pub const STOPPED_BEFORE_APPLY: &str = "StoppedBeforeApply";
}

/// Where a Kubernetes upgrade stands as a whole: which of its two stages runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KubernetesStage {
    /// The control-plane components, one control plane at a time.
    ControlPlane,
    /// The kubelets (and a control plane's kube-proxy image), control planes first.
    Kubelets,
}

/// The stage a Kubernetes upgrade to `target` is in: [`KubernetesStage::ControlPlane`]
/// while any control plane lacks its record of the first stage, else the kubelets.
#[must_use]
pub fn kubernetes_stage<'a>(
    machines: impl IntoIterator<Item = (MachineRole, &'a Conditions)>,
    target: &KubernetesVersion,
) -> KubernetesStage {
    let behind = machines
        .into_iter()
        .any(|(role, conditions)| role == MachineRole::ControlPlane && !control_plane_done(conditions, target));
    if behind { KubernetesStage::ControlPlane } else { KubernetesStage::Kubelets }
}

/// What a machine's [`KUBERNETES_UPGRADE`] condition says, for `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubernetesRecord {
    /// Nothing for this target.
    None,
    /// An apply of `component` intended (`acknowledged: false`) or acknowledged.
    Apply {
        /// The component.
        component: Component,
        /// Whether the node acknowledged it.
        acknowledged: bool,
        /// When the record was written (the verification's clock).
        since: Timestamp,
    },
    /// `component`'s change verified, with nothing in flight: the machine is between two
    /// changes of its stage.
    Verified {
        /// The component.
        component: Component,
    },
    /// The first stage verified.
    ControlPlaneConverged,
    /// The machine verified.
    Converged,
}

/// Reads the machine's record for `target`. A record for another version, or one whose
/// message does not read, is no record for this target.
#[must_use]
pub fn kubernetes_record(conditions: &Conditions, target: &KubernetesVersion) -> KubernetesRecord {
    let Some(c) = conditions.get(KUBERNETES_UPGRADE) else { return KubernetesRecord::None };
    let version_is = |text: &str| KubernetesVersion::parse(text).is_ok_and(|v| &v == target);
    match (c.status, c.reason.as_str()) {
        (ConditionStatus::True, reason::CONVERGED) if version_is(&c.message) => KubernetesRecord::Converged,
        (ConditionStatus::True, reason::CONTROL_PLANE_CONVERGED) if version_is(&c.message) => {
            KubernetesRecord::ControlPlaneConverged
        }
        (ConditionStatus::Unknown, reason::APPLY_REQUESTED) | (ConditionStatus::True, reason::APPLIED) => {
            match parse_apply(c) {
                Some((component, version)) if &version == target => KubernetesRecord::Apply {
                    component,
                    acknowledged: c.status == ConditionStatus::True,
                    since: c.last_transition_time,
                },
                _ => KubernetesRecord::None,
            }
        }
        (ConditionStatus::True, reason::VERIFIED) => match parse_apply(c) {
            Some((component, version)) if &version == target => KubernetesRecord::Verified { component },
            _ => KubernetesRecord::None,
        },
        _ => KubernetesRecord::None,
    }
}

/// What a resume writes on a machine that failed, to close its failed attempt (`None`:
/// nothing to close), as `(status, reason, message)`. The retry starts from the node as it
/// is, with fresh bounds: a change its configuration holds is recorded applied again (with
/// no call) and verified within a new bound; one it does not hold (someone reverted it) is
/// applied again, the person's resume being the decision. A control plane through its
/// first stage keeps that record, so the upgrade stays in its kubelets' stage.
#[must_use]
pub fn retry_record(
    role: MachineRole,
    conditions: &Conditions,
    target: &KubernetesVersion,
) -> Option<(ConditionStatus, &'static str, String)> {
    match kubernetes_record(conditions, target) {
        KubernetesRecord::None | KubernetesRecord::Converged | KubernetesRecord::ControlPlaneConverged => None,
        _ if role == MachineRole::ControlPlane && control_plane_done(conditions, target) => {
            Some((ConditionStatus::True, reason::CONTROL_PLANE_CONVERGED, target.to_string()))
        }
        _ => Some((
            ConditionStatus::False,
            reason::RETRY,
            "a person resumed the operation; the failed attempt is closed".to_owned(),
        )),
    }
}

/// The message of an apply's record: `<component> <version>`.
#[must_use]
pub fn apply_message(component: Component, target: &KubernetesVersion) -> String {
    format!("{component} v{target}")
}

fn parse_apply(c: &Condition) -> Option<(Component, KubernetesVersion)> {
    let (component, version) = c.message.split_once(' ')?;
    let component = Component::ALL.into_iter().find(|k| k.as_str() == component)?;
    Some((component, KubernetesVersion::parse(version).ok()?))
}

/// Whether the machine's first stage (its control-plane components) is recorded done for
/// `target`: its record says so, or says that it went past it (a kubelet or kube-proxy
/// apply, or the machine converged).
#[must_use]
pub fn control_plane_done(conditions: &Conditions, target: &KubernetesVersion) -> bool {
    match kubernetes_record(conditions, target) {
        KubernetesRecord::ControlPlaneConverged | KubernetesRecord::Converged => true,
        KubernetesRecord::Apply { component, .. } | KubernetesRecord::Verified { component } => {
            !Component::CONTROL_PLANE.contains(&component)
        }
        KubernetesRecord::None => false,
    }
}

/// Whether the machine is recorded converged on `target` for `stage`.
#[must_use]
pub fn stage_converged(conditions: &Conditions, target: &KubernetesVersion, stage: KubernetesStage) -> bool {
    match stage {
        KubernetesStage::ControlPlane => control_plane_done(conditions, target),
        KubernetesStage::Kubelets => kubernetes_record(conditions, target) == KubernetesRecord::Converged,
    }
}

/// Whether an apply of `stage` is recorded under way for `target` (intended or
/// acknowledged, not yet verified): such a machine is seen to its verification, never
/// interrupted by a hold, a pause or a deletion. Between two changes
/// ([`KubernetesRecord::Verified`]) it is not: nothing of it is in flight.
#[must_use]
pub fn past_apply(conditions: &Conditions, target: &KubernetesVersion, stage: KubernetesStage) -> bool {
    match kubernetes_record(conditions, target) {
        KubernetesRecord::Apply { component, .. } => {
            Component::CONTROL_PLANE.contains(&component) == (stage == KubernetesStage::ControlPlane)
        }
        _ => false,
    }
}

/// The default repository of each component's image (Talos's own defaults).
#[must_use]
pub fn default_repository(component: Component) -> &'static str {
    match component {
        Component::KubeApiserver => "registry.k8s.io/kube-apiserver",
        Component::KubeControllerManager => "registry.k8s.io/kube-controller-manager",
        Component::KubeScheduler => "registry.k8s.io/kube-scheduler",
        Component::KubeProxy => "registry.k8s.io/kube-proxy",
        Component::Kubelet => "ghcr.io/siderolabs/kubelet",
    }
}

/// The tag of an image reference (`registry:5000/repo:tag@digest` gives `tag`), if it has
/// one.
#[must_use]
pub fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split_once('@').map_or(image, |(name, _)| name);
    let last = without_digest.rsplit('/').next()?;
    last.split_once(':').map(|(_, tag)| tag).filter(|t| !t.is_empty())
}

/// The image of `component` on `target`, in the repository `current` uses (a mirror stays
/// the mirror), or Talos's default repository when the configuration names none.
#[must_use]
pub fn target_image(component: Component, current: Option<&str>, target: &KubernetesVersion) -> String {
    let repository = current
        .filter(|image| !image.is_empty())
        .map(|image| {
            let without_digest = image.split_once('@').map_or(image, |(name, _)| name);
            match image_tag(without_digest) {
                Some(tag) => &without_digest[..without_digest.len() - tag.len() - 1],
                None => without_digest,
            }
        })
        .unwrap_or_else(|| default_repository(component));
    format!("{repository}:v{target}")
}

/// Whether an image is `target`'s (by its tag).
#[must_use]
pub fn image_on(image: &str, target: &KubernetesVersion) -> bool {
    image_tag(image).and_then(|tag| KubernetesVersion::parse(tag).ok()).is_some_and(|v| &v == target)
}

/// A control-plane component's mirror pod on the node, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPodObservation {
    /// The version it runs (`app.kubernetes.io/version`); `None`: not readable.
    pub version: Option<KubernetesVersion>,
    /// Whether its Ready condition is True.
    pub ready: bool,
    /// Whether a container of it waits in `CrashLoopBackOff`.
    pub crash_looping: bool,
}

/// The node's kubelet, as its Node reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletObservation {
    /// `status.nodeInfo.kubeletVersion`; `None`: not readable.
    pub version: Option<KubernetesVersion>,
    /// Whether the Node is Ready.
    pub ready: bool,
}

/// How long a changed component may take to be verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubernetesTimeouts {
    /// A control-plane component's mirror pod, from the apply to Ready on the target:
    /// 5 minutes, Talos's own wait.
    pub component_ready: Duration,
    /// A kubelet, from the apply to its Node Ready with the target's `kubeletVersion`:
    /// 3 minutes after its restart in Talos; 5 here, restart included.
    pub kubelet_ready: Duration,
    /// How often a wait no watch reports is looked at again (the Talos API).
    pub poll: Duration,
}

impl Default for KubernetesTimeouts {
    fn default() -> Self {
        Self {
            component_ready: Duration::from_secs(5 * 60),
            kubelet_ready: Duration::from_secs(5 * 60),
            poll: Duration::from_secs(5),
        }
    }
}

/// Everything [`kubernetes_step`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct KubernetesStepInput<'a> {
    /// The stage the upgrade is in.
    pub stage: KubernetesStage,
    /// The machine's role.
    pub role: MachineRole,
    /// Whether Talos manages kube-proxy (a control plane's configuration carries its image).
    pub kube_proxy: bool,
    /// The target.
    pub target: &'a KubernetesVersion,
    /// The machine's conditions.
    pub conditions: &'a Conditions,
    /// The images its machine configuration holds, by component (a component missing
    /// here: Talos's default image); `None`: the configuration could not be read.
    pub config: Option<&'a BTreeMap<Component, String>>,
    /// On a control plane, its mirror pods by component (a component missing: no pod).
    pub pods: &'a BTreeMap<Component, StaticPodObservation>,
    /// Its kubelet; `None`: no Node.
    pub kubelet: Option<&'a KubeletObservation>,
    /// The oldest kube-apiserver of the cluster, as its control planes' mirror pods show
    /// it in this pass (`None`: not observed). A kubelet or kube-proxy is never made newer
    /// than it (the skew rule, checked at every apply).
    pub api_servers: Option<&'a KubernetesVersion>,
    /// The pass may make no change on this machine: a hold, a pause, a deletion or a
    /// refusal stops it (DESIGN §3.11). An intent whose apply never reached the node is
    /// then closed: the machine changed nothing, and nothing is left waiting for an apply
    /// that will not be authorised.
    pub stopped: bool,
    /// The bounds.
    pub timeouts: &'a KubernetesTimeouts,
    /// The current time.
    pub now: Timestamp,
}

/// The one thing to do for a machine of a Kubernetes upgrade.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubernetesAction {
    /// Apply the machine's configuration with `component`'s image set to `image`: a dry
    /// run first, which must show no reboot (else the machine fails, nothing applied);
    /// then `ApplyRequested` written (the intent), the apply with no reboot, `Applied`
    /// once acknowledged. Only under the pass's call authority.
    Apply {
        /// The component.
        component: Component,
        /// Its new image.
        image: String,
    },
    /// The configuration already holds `component`'s target image (a call that landed
    /// before its acknowledgement was written, or a person's own change): write `Applied`
    /// with no call, which starts the verification's clock.
    RecordApplied {
        /// The component.
        component: Component,
    },
    /// `component`'s change verified, and the stage has another change to make on the
    /// machine: write `ComponentVerified`, so that a hold, a pause or a deletion stops the
    /// machine before that change.
    RecordVerified {
        /// The component.
        component: Component,
    },
    /// The intent of `component`'s apply never reached the node (its configuration does
    /// not hold the change) and the machine is stopped ([`KubernetesStepInput::stopped`]):
    /// write `False/ApplyNotMade`. The machine changed nothing; it is no longer under way.
    CloseIntent {
        /// The component.
        component: Component,
    },
    /// Nothing to do yet.
    Wait {
        /// Why.
        reason: KubernetesWait,
        /// When to look again at the latest, if a deadline is known.
        recheck_at: Option<Timestamp>,
    },
    /// The stage's work on this machine is verified: write its record
    /// (`ControlPlaneConverged` or `KubernetesConverged`).
    Converged {
        /// The record's reason.
        reason: &'static str,
    },
    /// The machine fails: the operation pauses.
    Fail(KubernetesFailure),
}

/// Why a machine waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubernetesWait {
    /// Its machine configuration could not be read (the Talos API).
    ConfigUnreadable,
    /// Its Node is not Ready: nothing is applied to it until it is.
    NodeNotReady,
    /// A component was applied; its mirror pod is not on the target and Ready yet.
    ComponentNotReady {
        /// The component.
        component: Component,
    },
    /// The kubelet was applied; the Node does not report it on the target and Ready yet.
    KubeletNotBack,
    /// The version `component` runs now is not observed (no mirror pod, a version that
    /// does not read, or no kube-apiserver seen for a kubelet's skew): nothing is applied
    /// on a guess.
    VersionUnobserved {
        /// The component.
        component: Component,
    },
}

impl KubernetesWait {
    /// The CamelCase reason.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ConfigUnreadable => "MachineConfigUnreadable",
            Self::NodeNotReady => "NodeNotReady",
            Self::ComponentNotReady { .. } => "ComponentNotReady",
            Self::KubeletNotBack => "KubeletNotBack",
            Self::VersionUnobserved { .. } => "ComponentVersionUnobserved",
        }
    }
}

impl fmt::Display for KubernetesWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConfigUnreadable => f.write_str("its machine configuration could not be read through the Talos API"),
            Self::NodeNotReady => f.write_str("its Node is not Ready: nothing is applied until it is"),
            Self::ComponentNotReady { component } => {
                write!(f, "{component} was applied; waiting for its mirror pod on the target and Ready")
            }
            Self::KubeletNotBack => {
                f.write_str("the kubelet was applied; waiting for the Node on the target and Ready")
            }
            Self::VersionUnobserved { component: Component::Kubelet | Component::KubeProxy } => f.write_str(
                "no kube-apiserver version is observed: a kubelet or kube-proxy is never made newer than an API server on a guess",
            ),
            Self::VersionUnobserved { component } => write!(
                f,
                "the version {component} runs on the node is not observed (its mirror pod): nothing is applied on a guess"
            ),
        }
    }
}

/// Why a machine of a Kubernetes upgrade fails (the operation pauses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubernetesFailure {
    /// A component crash-loops on the target.
    CrashLoop {
        /// The component.
        component: Component,
        /// The target.
        target: String,
    },
    /// A component was not Ready on the target within its bound.
    NotReady {
        /// The component.
        component: Component,
        /// The target.
        target: String,
        /// The bound.
        seconds: u64,
        /// What was seen last.
        observed: String,
    },
    /// An acknowledged change is no longer in the machine's configuration: it is never
    /// applied a second time.
    ConfigReverted {
        /// The component.
        component: Component,
        /// What the configuration holds now.
        image: String,
    },
    /// The change would break the version skew policy from what the component runs now
    /// (a control-plane component more than one minor ahead, or a downgrade; a kubelet or
    /// kube-proxy newer than the oldest API server). Nothing is applied. The operation's
    /// planning refuses such a target; this is the step's own check, which holds whatever
    /// changed since (an edited target, a node changed by hand).
    Skew {
        /// The component.
        component: Component,
        /// What it runs now (or, for a kubelet or kube-proxy, the oldest API server).
        observed: String,
        /// The target.
        target: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The node refused the apply, or its dry run showed a reboot (from the driver).
    ApplyRefused {
        /// The component.
        component: Component,
        /// The node's answer.
        detail: String,
    },
}

impl std::error::Error for KubernetesFailure {}

impl fmt::Display for KubernetesFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CrashLoop { component, target } => {
                write!(f, "{component} crash-loops on v{target}; the next control plane is not touched")
            }
            Self::NotReady { component, target, seconds, observed } => {
                write!(
                    f,
                    "{component} was not Ready on v{target} within {seconds} s of its apply (observed: {observed})"
                )
            }
            Self::ConfigReverted { component, image } => write!(
                f,
                "{component}'s change was acknowledged but the machine configuration now holds {image:?}: someone changed the machine under the operation; it is not applied again"
            ),
            Self::ApplyRefused { component, detail } => {
                write!(f, "the apply of {component} was refused, nothing changed: {detail}")
            }
            Self::Skew { component, observed, target, rule } => {
                write!(f, "{component} is not changed to v{target} from {observed}: {rule}; nothing was applied")
            }
        }
    }
}

impl KubernetesFailure {
    /// The CamelCase reason.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CrashLoop { .. } => "ComponentCrashLoop",
            Self::NotReady { component: Component::Kubelet, .. } => "KubeletNotBack",
            Self::NotReady { .. } => "ComponentNotReady",
            Self::ConfigReverted { .. } => "MachineConfigReverted",
            Self::ApplyRefused { .. } => "ApplyRefused",
            Self::Skew { .. } => "VersionSkew",
        }
    }
}

/// The components a machine changes in `stage`, in order.
#[must_use]
pub fn components_of(stage: KubernetesStage, role: MachineRole, kube_proxy: bool) -> Vec<Component> {
    match (stage, role) {
        (KubernetesStage::ControlPlane, MachineRole::ControlPlane) => Component::CONTROL_PLANE.to_vec(),
        (KubernetesStage::ControlPlane, MachineRole::Worker) => Vec::new(),
        (KubernetesStage::Kubelets, MachineRole::ControlPlane) if kube_proxy => {
            vec![Component::KubeProxy, Component::Kubelet]
        }
        (KubernetesStage::Kubelets, _) => vec![Component::Kubelet],
    }
}

/// The one thing to do for this machine now.
pub fn kubernetes_step(input: &KubernetesStepInput<'_>) -> KubernetesAction {
    let target = input.target;
    if stage_converged(input.conditions, target, input.stage) {
        return KubernetesAction::Converged { reason: converged_reason(input.stage) };
    }
    let Some(config) = input.config else {
        return wait(KubernetesWait::ConfigUnreadable, Some(input.now.saturating_add(input.timeouts.poll)));
    };
    let record = kubernetes_record(input.conditions, target);
    let components = components_of(input.stage, input.role, input.kube_proxy);
    for (k, &component) in components.iter().enumerate() {
        let configured = config.get(&component).map(String::as_str);
        let in_config = configured.is_some_and(|image| image_on(image, target));
        let (recorded, acknowledged, since) = match record {
            KubernetesRecord::Apply { component: c, acknowledged, since } if c == component => {
                (true, acknowledged, Some(since))
            }
            _ => (false, false, None),
        };
        // kube-proxy is verified by the configuration alone: Talos waits on nothing for it.
        if verified(input, component) || (component == Component::KubeProxy && in_config) {
            if recorded && k + 1 < components.len() {
                return KubernetesAction::RecordVerified { component };
            }
            continue;
        }
        if !in_config {
            if acknowledged {
                let image = configured.unwrap_or("(Talos's default)").to_owned();
                return KubernetesAction::Fail(KubernetesFailure::ConfigReverted { component, image });
            }
            // An intent whose apply never reached the node changed nothing: a stopped
            // machine is stopped there, its intent closed, not kept under way waiting for
            // an apply that will not be authorised.
            if recorded && input.stopped {
                return KubernetesAction::CloseIntent { component };
            }
            // A node whose kubelet is down restarts nothing: its static pods and its
            // kubelet would not come back, and its wait would run out for nothing.
            if input.kubelet.is_none_or(|k| !k.ready) {
                return wait(KubernetesWait::NodeNotReady, Some(input.now.saturating_add(input.timeouts.poll)));
            }
            if let Some(not_now) = skew(input, component) {
                return not_now;
            }
            let image = target_image(component, configured, target);
            return KubernetesAction::Apply { component, image };
        }
        // In the configuration: verified by its pod or Node, on a clock from its record.
        let Some(since) = since.filter(|_| recorded && acknowledged) else {
            return KubernetesAction::RecordApplied { component };
        };
        return judge_wait(input, component, since);
    }
    KubernetesAction::Converged { reason: converged_reason(input.stage) }
}

fn converged_reason(stage: KubernetesStage) -> &'static str {
    match stage {
        KubernetesStage::ControlPlane => reason::CONTROL_PLANE_CONVERGED,
        KubernetesStage::Kubelets => reason::CONVERGED,
    }
}

fn wait(reason: KubernetesWait, recheck_at: Option<Timestamp>) -> KubernetesAction {
    KubernetesAction::Wait { reason, recheck_at }
}

/// The skew rule, checked at every apply against what runs now (never only at planning:
/// a target may be edited, a node changed by hand): a control-plane component goes at most
/// one minor up and never down from the version its mirror pod runs; a kubelet or
/// kube-proxy is never made newer than the oldest kube-apiserver. `None`: the apply may go.
fn skew(input: &KubernetesStepInput<'_>, component: Component) -> Option<KubernetesAction> {
    let target = input.target;
    let recheck = Some(input.now.saturating_add(input.timeouts.poll));
    let unobserved = || Some(wait(KubernetesWait::VersionUnobserved { component }, recheck));
    let fail = |observed: &KubernetesVersion, rule: &'static str| {
        Some(KubernetesAction::Fail(KubernetesFailure::Skew {
            component,
            observed: format!("v{observed}"),
            target: target.to_string(),
            rule,
        }))
    };
    match component {
        Component::KubeApiserver | Component::KubeControllerManager | Component::KubeScheduler => {
            let Some(running) = input.pods.get(&component).and_then(|p| p.version.as_ref()) else {
                return unobserved();
            };
            let (from, to) = (running.minor_line(), target.minor_line());
            if to.major != from.major || to.minor > from.minor + 1 {
                return fail(running, "a control-plane component goes up one minor at a time");
            }
            if target < running {
                return fail(running, "a control-plane component is never downgraded");
            }
            None
        }
        Component::Kubelet | Component::KubeProxy => {
            let Some(oldest) = input.api_servers else { return unobserved() };
            if target.minor_line() > oldest.minor_line() {
                return fail(oldest, "a kubelet or kube-proxy is never newer than the oldest kube-apiserver");
            }
            None
        }
    }
}

/// Whether `component` runs on the target and Ready on the machine (kube-proxy: never by
/// observation alone; its configuration and record say).
fn verified(input: &KubernetesStepInput<'_>, component: Component) -> bool {
    let target = input.target;
    match component {
        Component::Kubelet => input.kubelet.is_some_and(|k| k.ready && k.version.as_ref() == Some(target)),
        Component::KubeProxy => false,
        _ => input.pods.get(&component).is_some_and(|p| p.ready && p.version.as_ref() == Some(target)),
    }
}

/// A component in the configuration, acknowledged at `since`, not verified yet.
fn judge_wait(input: &KubernetesStepInput<'_>, component: Component, since: Timestamp) -> KubernetesAction {
    let target = input.target;
    let (bound, observed) = if component == Component::Kubelet {
        let observed = match input.kubelet {
            None => "no Node".to_owned(),
            Some(k) => format!(
                "kubelet {}, Node {}",
                k.version.as_ref().map_or_else(|| "unknown".to_owned(), |v| format!("v{v}")),
                if k.ready { "Ready" } else { "NotReady" }
            ),
        };
        (input.timeouts.kubelet_ready, observed)
    } else {
        let pod = input.pods.get(&component);
        if pod.is_some_and(|p| p.crash_looping && p.version.as_ref() == Some(target)) {
            return KubernetesAction::Fail(KubernetesFailure::CrashLoop { component, target: target.to_string() });
        }
        let observed = match pod {
            None => "no mirror pod".to_owned(),
            Some(p) => format!(
                "pod {}, {}",
                p.version.as_ref().map_or_else(|| "version unknown".to_owned(), |v| format!("v{v}")),
                if p.ready { "Ready" } else { "not Ready" }
            ),
        };
        (input.timeouts.component_ready, observed)
    };
    let deadline = since.saturating_add(bound);
    if input.now >= deadline {
        return KubernetesAction::Fail(KubernetesFailure::NotReady {
            component,
            target: target.to_string(),
            seconds: bound.as_secs(),
            observed,
        });
    }
    let reason = if component == Component::Kubelet {
        KubernetesWait::KubeletNotBack
    } else {
        KubernetesWait::ComponentNotReady { component }
    };
    // Looked at again at the poll as well: a controller need not watch mirror pods.
    wait(reason, Some(deadline.min(input.now.saturating_add(input.timeouts.poll))))
}

#[cfg(test)]
mod tests;
