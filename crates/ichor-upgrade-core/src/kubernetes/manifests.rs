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
//! each with its new pods updated and available everywhere it runs. The wait is bound on
//! lack of progress, not on total time: a rollout that goes on (one more pod updated or
//! available) may take as long as the cluster is large, and one that has not moved for
//! [`ROLLOUT_STALL`] (Talos's own wait, `--manifests-reconcile-timeout`) fails the step,
//! naming what did not roll out, and the operation pauses: a kube-proxy whose new image
//! does not run is never reported as an upgrade completed. Talos bounds the total; at two
//! seconds a node, that failed every cluster past about 150 nodes with nothing failed
//! (issue 53 item 4).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::versions::KubernetesVersion;

/// The field manager of the server-side applies: Talos's own (`talos`), so that objects
/// it applied earlier stay under one manager.
pub const FIELD_MANAGER: &str = "talos";

/// How long the applied workloads' rollout may go without progress (no pod more updated
/// or available) before the step fails: Talos's default wait (5 minutes).
pub const ROLLOUT_STALL: Duration = Duration::from_secs(5 * 60);

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
    /// How far it has gone: its pods updated plus its pods available. It grows while the
    /// rollout goes on; the wait is bound on how long it stays where it is.
    pub progress: u64,
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
        /// The most progress seen (the workloads' [`WorkloadRollout::progress`] summed).
        #[serde(default)]
        progress: u64,
        /// When it was first seen; `None`: no progress seen since `at`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress_at: Option<Timestamp>,
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
    let (Some(workloads), ManifestsState::Applied { objects, at, progress, progress_at, .. }) =
        (state.rolling_out(target), state)
    else {
        return ManifestsStep::Apply;
    };
    let poll = now.saturating_add(ROLLOUT_POLL);
    let Some(observed) = observed else { return ManifestsStep::Wait { recheck_at: poll } };
    let applied = |rolled_out: bool, progress: u64, progress_at: Option<Timestamp>| ManifestsState::Applied {
        target: target.to_string(),
        objects: *objects,
        at: *at,
        workloads: workloads.to_vec(),
        rolled_out,
        progress,
        progress_at,
    };
    let pending: Vec<String> = workloads
        .iter()
        .filter(|w| !observed.iter().any(|o| &o.workload == *w && o.done))
        .map(|w| match observed.iter().find(|o| &o.workload == w) {
            Some(o) => format!("{w} ({})", o.detail),
            None => format!("{w} (not read)"),
        })
        .collect();
    if pending.is_empty() {
        return ManifestsStep::Record(applied(true, *progress, *progress_at));
    }
    let seen: u64 =
        workloads.iter().filter_map(|w| observed.iter().find(|o| &o.workload == w)).map(|o| o.progress).sum();
    if seen > *progress {
        // Progress: recorded, and the bound starts again from now.
        return ManifestsStep::Record(applied(false, seen, Some(now)));
    }
    let deadline = progress_at.unwrap_or(*at).saturating_add(ROLLOUT_STALL);
    if now >= deadline {
        return ManifestsStep::Record(ManifestsState::Failed {
            target: target.to_string(),
            reason: format!(
                "applied, but its rollout made no progress for {} s: {}",
                ROLLOUT_STALL.as_secs(),
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
            progress: 0,
            progress_at: None,
        }
    }

    fn step(recorded: Option<&ManifestsState>, target: &str, observed: Option<&[WorkloadRollout]>) -> ManifestsStep {
        manifests_step(recorded, &v(target), false, observed, AT.saturating_add(Duration::from_secs(10)))
    }

    fn rollout(done: bool) -> WorkloadRollout {
        WorkloadRollout { workload: PROXY.into(), done, detail: "updated 1/3, available 0/3".into(), progress: 1 }
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
        assert_eq!(step(Some(&waiting), "1.35.0", Some(&[])), ManifestsStep::Wait { recheck_at: poll }, "not read");
        // A pod more than recorded: progress, recorded with its time.
        let ManifestsStep::Record(ManifestsState::Applied {
            progress: 1,
            progress_at: Some(at),
            rolled_out: false,
            ..
        }) = step(Some(&waiting), "1.35.0", Some(&[rollout(false)]))
        else {
            panic!()
        };
        assert_eq!(at, AT.saturating_add(Duration::from_secs(10)));
        // Rolled out: recorded, then done.
        assert_eq!(step(Some(&waiting), "1.35.0", Some(&[rollout(true)])), ManifestsStep::Record(applied(true)));
        // Past the bound with no progress: a failure naming the workload and what was seen.
        let seen = ManifestsState::Applied {
            target: "1.35.0".into(),
            objects: 4,
            at: AT,
            workloads: vec![PROXY.into()],
            rolled_out: false,
            progress: 1,
            progress_at: None,
        };
        assert_eq!(step(Some(&seen), "1.35.0", Some(&[rollout(false)])), ManifestsStep::Wait { recheck_at: poll });
        let late = AT.saturating_add(ROLLOUT_STALL);
        let ManifestsStep::Record(ManifestsState::Failed { reason, .. }) =
            manifests_step(Some(&seen), &v("1.35.0"), false, Some(&[rollout(false)]), late)
        else {
            panic!()
        };
        assert!(
            reason.contains("no progress for 300 s") && reason.contains("kube-proxy (updated 1/3, available 0/3)"),
            "{reason}"
        );
        // Nothing to wait for: done at once.
        let none = ManifestsState::Applied {
            target: "1.35.0".into(),
            objects: 1,
            at: AT,
            workloads: vec![],
            rolled_out: false,
            progress: 0,
            progress_at: None,
        };
        assert!(matches!(
            step(Some(&none), "1.35.0", Some(&[])),
            ManifestsStep::Record(ManifestsState::Applied { rolled_out: true, .. })
        ));
    }

    // Issue 53 item 4: the bound was on total time, so a rollout going on at two seconds a
    // node failed every cluster past about 150 nodes with nothing failed.
    #[test]
    fn a_rollout_that_goes_on_is_waited_for_however_long_and_one_that_stalls_fails() {
        let target = v("1.35.0");
        let mut record = applied(false);
        let mut now = AT;
        // A pod more every 2 s for 2,000 s, far past the stall bound in all.
        for pods in 1..=1_000_u64 {
            now = now.saturating_add(Duration::from_secs(2));
            let going = WorkloadRollout {
                workload: PROXY.into(),
                done: false,
                detail: format!("updated {pods}/1000"),
                progress: pods,
            };
            match manifests_step(Some(&record), &target, false, Some(&[going]), now) {
                ManifestsStep::Record(next @ ManifestsState::Applied { .. }) => record = next,
                other => panic!("at {pods} pods: {other:?}"),
            }
        }
        assert!(now.saturating_since(AT) > ROLLOUT_STALL * 6);
        let ManifestsState::Applied { progress: 1_000, progress_at: Some(at), .. } = record else {
            panic!("{record:?}")
        };
        assert_eq!(at, now, "the bound starts again from the last progress");
        // Then it stalls: waited for until the bound from its last progress, then failed.
        let stalled = WorkloadRollout {
            workload: PROXY.into(),
            done: false,
            detail: "updated 1000/1001".into(),
            progress: 1_000,
        };
        let almost = now.saturating_add(ROLLOUT_STALL - Duration::from_secs(1));
        assert!(matches!(
            manifests_step(Some(&record), &target, false, Some(std::slice::from_ref(&stalled)), almost),
            ManifestsStep::Wait { .. }
        ));
        let past = now.saturating_add(ROLLOUT_STALL);
        assert!(matches!(
            manifests_step(Some(&record), &target, false, Some(&[stalled]), past),
            ManifestsStep::Record(ManifestsState::Failed { .. })
        ));
        // A record from before progress was kept reads with none.
        let old: ManifestsState = serde_json::from_value(serde_json::json!({"Applied": {
            "target": "1.35.0", "objects": 4, "at": AT, "workloads": [PROXY], "rolled_out": false
        }}))
        .unwrap();
        assert_eq!(old, applied(false));
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
