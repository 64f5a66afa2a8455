//! The last step of a Kubernetes upgrade: Talos's bootstrap manifests applied to the
//! cluster server-side, as `talosctl upgrade-k8s` syncs them once every kubelet is on the
//! target (`docs/kubernetes-upgrade-facts.md` §4).
//!
//! A control plane renders the manifests (kube-proxy's DaemonSet with the image its
//! configuration now holds, CoreDNS, the CNI) as `Manifests.kubernetes.talos.dev`
//! resources, but applies on its own only the objects missing from the cluster: an
//! existing kube-proxy DaemonSet keeps its old image until someone applies them. The
//! engine does, through the Kubernetes API with server-side apply and the field manager
//! Talos uses ([`FIELD_MANAGER`]), after the kubelets' stage and before the operation
//! completes.
//!
//! A server-side apply of the same objects is idempotent: applied again after a crash
//! before its record, it changes nothing the first did not. So the record
//! ([`ManifestsState`], in the operation's status) is written after the applies, and a
//! pass that finds none applies them (again). An apply the API server refuses (an
//! invalid object, a forbidden kind) fails the step: the operation pauses, naming the
//! object, and a resume applies them again.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::versions::KubernetesVersion;

/// The field manager of the server-side applies: Talos's own (`talos`), so that objects
/// it applied earlier stay under one manager.
pub const FIELD_MANAGER: &str = "talos";

/// Where a Kubernetes upgrade's bootstrap manifests stand, in its status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManifestsState {
    /// Every object applied, for `target`.
    Applied {
        /// The Kubernetes version they were applied for.
        target: String,
        /// How many objects.
        objects: usize,
        /// When.
        at: Timestamp,
    },
    /// An apply was refused, for `target`: the operation pauses until resumed.
    Failed {
        /// The Kubernetes version.
        target: String,
        /// Which object and why.
        reason: String,
        /// When.
        at: Timestamp,
    },
}

impl ManifestsState {
    /// Whether the manifests are recorded applied for `target`.
    #[must_use]
    pub fn applied_for(&self, target: &KubernetesVersion) -> bool {
        matches!(self, Self::Applied { target: t, .. } if same(t, target))
    }

    /// Why the apply for `target` failed, if it is recorded failed.
    #[must_use]
    pub fn failed_for(&self, target: &KubernetesVersion) -> Option<&str> {
        match self {
            Self::Failed { target: t, reason, .. } if same(t, target) => Some(reason),
            _ => None,
        }
    }
}

fn same(recorded: &str, target: &KubernetesVersion) -> bool {
    KubernetesVersion::parse(recorded).is_ok_and(|v| &v == target)
}

/// What the last step asks, from the operation's record, when every machine is through
/// the kubelets' stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestsStep {
    /// Applied for the target: the upgrade completes.
    Done,
    /// Apply them (read from a control plane), then record it.
    Apply,
    /// The apply failed and no resume came: the operation stays paused.
    Failed {
        /// Why.
        reason: String,
    },
}

/// The last step's decision, from the record for `target` and whether a resume arrived.
#[must_use]
pub fn manifests_step(recorded: Option<&ManifestsState>, target: &KubernetesVersion, resuming: bool) -> ManifestsStep {
    match recorded {
        Some(state) if state.applied_for(target) => ManifestsStep::Done,
        Some(state) => match state.failed_for(target) {
            Some(reason) if !resuming => ManifestsStep::Failed { reason: reason.to_owned() },
            _ => ManifestsStep::Apply,
        },
        None => ManifestsStep::Apply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> KubernetesVersion {
        KubernetesVersion::parse(s).unwrap()
    }

    const AT: Timestamp = Timestamp::from_unix_millis(1_000);

    #[test]
    fn nothing_recorded_applies_and_an_apply_for_the_target_is_done() {
        assert_eq!(manifests_step(None, &v("1.35.0"), false), ManifestsStep::Apply);
        let applied = ManifestsState::Applied { target: "1.35.0".into(), objects: 4, at: AT };
        assert_eq!(manifests_step(Some(&applied), &v("1.35.0"), false), ManifestsStep::Done);
        assert_eq!(manifests_step(Some(&applied), &v("v1.35.0"), false), ManifestsStep::Done, "a leading v reads");
        // A record of another version is none for this target.
        assert_eq!(manifests_step(Some(&applied), &v("1.36.0"), false), ManifestsStep::Apply);
    }

    #[test]
    fn a_failure_pauses_until_a_resume_applies_again() {
        let failed = ManifestsState::Failed { target: "1.35.0".into(), reason: "DaemonSet x: invalid".into(), at: AT };
        assert_eq!(
            manifests_step(Some(&failed), &v("1.35.0"), false),
            ManifestsStep::Failed { reason: "DaemonSet x: invalid".into() }
        );
        assert_eq!(manifests_step(Some(&failed), &v("1.35.0"), true), ManifestsStep::Apply);
        assert_eq!(manifests_step(Some(&failed), &v("1.36.0"), false), ManifestsStep::Apply, "another version's");
    }

    #[test]
    fn the_record_reads_back_as_written() {
        let applied = ManifestsState::Applied { target: "1.35.0".into(), objects: 4, at: AT };
        let json = serde_json::to_value(&applied).unwrap();
        assert_eq!(serde_json::from_value::<ManifestsState>(json).unwrap(), applied);
    }
}
