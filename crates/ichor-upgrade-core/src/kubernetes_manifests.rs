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
//!
//! Applied is not done: the workloads applied (DaemonSets, Deployments) must roll out,
//! each with its new pods updated and available everywhere it runs, within
//! [`ROLLOUT_TIMEOUT`] of the apply (Talos's own wait, `--manifests-reconcile-timeout`),
//! or the step fails naming what did not, and the operation pauses: a kube-proxy whose new
//! image does not run is never reported as an upgrade completed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::versions::KubernetesVersion;

/// The field manager of the server-side applies: Talos's own (`talos`), so that objects
/// it applied earlier stay under one manager.
pub const FIELD_MANAGER: &str = "talos";

/// How long the applied workloads have to roll out: Talos's default (5 minutes).
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How often a rollout is looked at again (nothing watches the workloads).
pub const ROLLOUT_POLL: Duration = Duration::from_secs(5);

/// A workload's rollout, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadRollout {
    /// `Kind namespace/name`.
    pub workload: String,
    /// Its new pods are updated and available everywhere it runs.
    pub done: bool,
    /// What was seen, for people (`updated 2/5, available 1/5`).
    pub detail: String,
}
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
        /// The workloads applied, `Kind namespace/name`, whose rollout is waited for.
        #[serde(default)]
        workloads: Vec<String>,
        /// Whether every one of them rolled out.
        #[serde(default)]
        rolled_out: bool,
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
    /// Whether the manifests are recorded applied for `target`, and rolled out.
    #[must_use]
    pub fn rolled_out_for(&self, target: &KubernetesVersion) -> bool {
        matches!(self, Self::Applied { target: t, rolled_out: true, .. } if same(t, target))
    }

    /// The workloads whose rollout is waited for, when the manifests are recorded applied
    /// for `target` and not yet rolled out.
    #[must_use]
    pub fn rolling_out(&self, target: &KubernetesVersion) -> Option<&[String]> {
        match self {
            Self::Applied { target: t, rolled_out: false, workloads, .. } if same(t, target) => Some(workloads),
            _ => None,
        }
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
    /// Write this record (the rollout done, or failed).
    Record(ManifestsState),
    /// The workloads roll out: look again by then.
    Wait {
        /// When, at the latest.
        recheck_at: Timestamp,
    },
    /// The apply failed and no resume came: the operation stays paused.
    Failed {
        /// Why.
        reason: String,
    },
}

/// The last step's decision, from the record for `target`, whether a resume arrived, and
/// the applied workloads' rollouts as observed now (`None`: not read).
#[must_use]
pub fn manifests_step(
    recorded: Option<&ManifestsState>,
    target: &KubernetesVersion,
    resuming: bool,
    observed: Option<&[WorkloadRollout]>,
    now: Timestamp,
) -> ManifestsStep {
    let Some(state) = recorded else { return ManifestsStep::Apply };
    if state.rolled_out_for(target) {
        return ManifestsStep::Done;
    }
    if let Some(reason) = state.failed_for(target) {
        return if resuming { ManifestsStep::Apply } else { ManifestsStep::Failed { reason: reason.to_owned() } };
    }
    let (Some(workloads), ManifestsState::Applied { objects, at, .. }) = (state.rolling_out(target), state) else {
        return ManifestsStep::Apply;
    };
    let poll = now.saturating_add(ROLLOUT_POLL);
    let Some(observed) = observed else { return ManifestsStep::Wait { recheck_at: poll } };
    let pending: Vec<String> = workloads
        .iter()
        .filter(|w| !observed.iter().any(|o| &o.workload == *w && o.done))
        .map(|w| match observed.iter().find(|o| &o.workload == w) {
            Some(o) => format!("{w} ({})", o.detail),
            None => format!("{w} (not read)"),
        })
        .collect();
    if pending.is_empty() {
        return ManifestsStep::Record(ManifestsState::Applied {
            target: target.to_string(),
            objects: *objects,
            at: *at,
            workloads: workloads.to_vec(),
            rolled_out: true,
        });
    }
    let deadline = at.saturating_add(ROLLOUT_TIMEOUT);
    if now >= deadline {
        return ManifestsStep::Record(ManifestsState::Failed {
            target: target.to_string(),
            reason: format!(
                "applied, but not rolled out within {} s: {}",
                ROLLOUT_TIMEOUT.as_secs(),
                pending.join("; ")
            ),
            at: now,
        });
    }
    ManifestsStep::Wait { recheck_at: poll.min(deadline) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> KubernetesVersion {
        KubernetesVersion::parse(s).unwrap()
    }

    const AT: Timestamp = Timestamp::from_unix_millis(1_000);

    const PROXY: &str = "DaemonSet kube-system/kube-proxy";

    fn applied(rolled_out: bool) -> ManifestsState {
        ManifestsState::Applied {
            target: "1.35.0".into(),
            objects: 4,
            at: AT,
            workloads: vec![PROXY.into()],
            rolled_out,
        }
    }

    fn step(recorded: Option<&ManifestsState>, target: &str, observed: Option<&[WorkloadRollout]>) -> ManifestsStep {
        manifests_step(recorded, &v(target), false, observed, AT.saturating_add(Duration::from_secs(10)))
    }

    fn rollout(done: bool) -> WorkloadRollout {
        WorkloadRollout { workload: PROXY.into(), done, detail: "updated 1/3, available 0/3".into() }
    }

    #[test]
    fn nothing_recorded_applies_and_a_rolled_out_apply_for_the_target_is_done() {
        assert_eq!(step(None, "1.35.0", None), ManifestsStep::Apply);
        assert_eq!(step(Some(&applied(true)), "1.35.0", None), ManifestsStep::Done);
        assert_eq!(step(Some(&applied(true)), "v1.35.0", None), ManifestsStep::Done, "a leading v reads");
        // A record of another version is none for this target.
        assert_eq!(step(Some(&applied(true)), "1.36.0", None), ManifestsStep::Apply);
        assert_eq!(step(Some(&applied(false)), "1.36.0", None), ManifestsStep::Apply);
    }

    #[test]
    fn applied_workloads_are_waited_for_until_rolled_out_or_past_their_bound() {
        let waiting = applied(false);
        // Not read, or not rolled out: looked at again at the poll.
        let poll = AT.saturating_add(Duration::from_secs(10) + ROLLOUT_POLL);
        assert_eq!(step(Some(&waiting), "1.35.0", None), ManifestsStep::Wait { recheck_at: poll });
        assert_eq!(step(Some(&waiting), "1.35.0", Some(&[rollout(false)])), ManifestsStep::Wait { recheck_at: poll });
        assert_eq!(step(Some(&waiting), "1.35.0", Some(&[])), ManifestsStep::Wait { recheck_at: poll }, "not read");
        // Rolled out: recorded, then done.
        assert_eq!(step(Some(&waiting), "1.35.0", Some(&[rollout(true)])), ManifestsStep::Record(applied(true)));
        // Past the bound: a failure naming the workload and what was seen.
        let late = AT.saturating_add(ROLLOUT_TIMEOUT);
        let ManifestsStep::Record(ManifestsState::Failed { reason, .. }) =
            manifests_step(Some(&waiting), &v("1.35.0"), false, Some(&[rollout(false)]), late)
        else {
            panic!()
        };
        assert!(
            reason.contains("within 300 s") && reason.contains("kube-proxy (updated 1/3, available 0/3)"),
            "{reason}"
        );
        // Nothing to wait for: done at once.
        let none = ManifestsState::Applied {
            target: "1.35.0".into(),
            objects: 1,
            at: AT,
            workloads: vec![],
            rolled_out: false,
        };
        assert!(matches!(
            step(Some(&none), "1.35.0", Some(&[])),
            ManifestsStep::Record(ManifestsState::Applied { rolled_out: true, .. })
        ));
    }

    #[test]
    fn a_failure_pauses_until_a_resume_applies_again() {
        let failed = ManifestsState::Failed { target: "1.35.0".into(), reason: "DaemonSet x: invalid".into(), at: AT };
        assert_eq!(
            step(Some(&failed), "1.35.0", None),
            ManifestsStep::Failed { reason: "DaemonSet x: invalid".into() }
        );
        assert_eq!(manifests_step(Some(&failed), &v("1.35.0"), true, None, AT), ManifestsStep::Apply);
        assert_eq!(step(Some(&failed), "1.36.0", None), ManifestsStep::Apply, "another version's");
    }

    #[test]
    fn the_record_reads_back_as_written() {
        let applied = applied(false);
        let json = serde_json::to_value(&applied).unwrap();
        assert_eq!(serde_json::from_value::<ManifestsState>(json).unwrap(), applied);
    }
}
