//! One test per rule of DESIGN §3, and per bad input of §9 that the engine sees.

use super::*;
use crate::operation::OperationSpec;

const US: &str = "ops/upgrade-1/uid-1";
const OTHER: &str = "ops/upgrade-0/uid-0";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_unix_secs(secs)
}

/// A cluster and one operation, built up by chaining.
#[derive(Clone)]
struct Fixture {
    op: OperationView,
    release: String,
    kubernetes: String,
    lease: Option<LeaseHolder>,
    machines: Vec<MachineView>,
    unaccounted: Vec<String>,
    k8s: Option<KubernetesInput>,
    etcd: EtcdVerdict,
    components: ComponentsVerdict,
    preflight: PreflightVerdict,
    windows: Option<Windows>,
    gates: Option<Gates>,
    config: RolloutConfig,
    now: Timestamp,
}

impl Fixture {
    /// `cps` control planes `cp-1..` and `workers` workers `worker-1..`, all Ready and
    /// pending; this operation holds a fresh lock; etcd is healthy; maxUnavailable 1.
    fn cluster(cps: usize, workers: usize) -> Self {
        let machine = |name: String, role| MachineView {
            name,
            role,
            order_label: None,
            held: false,
            node_ready: true,
            os_image: Some("Talos (v1.14.3)".into()),
            progress: MachineProgress::Pending,
            last: false,
        };
        let machines = (1..=cps)
            .map(|i| machine(format!("cp-{i}"), MachineRole::ControlPlane))
            .chain((1..=workers).map(|i| machine(format!("worker-{i}"), MachineRole::Worker)))
            .collect();
        Self {
            op: OperationView {
                identity: US.into(),
                generation: 1,
                deleting: false,
                resume_token: None,
                pause_requested: None,
                spec: OperationSpec {
                    preflight: None,
                    // The snapshot's own tests ask for it.
                    allow_two_control_planes: false,
                    etcd_snapshot: Some(crate::operation::SnapshotMode::Skip),
                    kind: "talos".into(),
                    target_version: "v1.14.4".into(),
                    max_unavailable: 1.into(),
                    machine: None,
                },
                status: OperationStatus::default(),
            },
            release: "v1.14.4".into(),
            kubernetes: "1.34.1".into(),
            lease: Some(LeaseHolder {
                identity: US.into(),
                renewed_at: at(1000),
                lease_duration: Duration::from_secs(120),
                holder_exists: true,
            }),
            machines,
            unaccounted: Vec::new(),
            k8s: None,
            etcd: EtcdVerdict::Healthy,
            components: ComponentsVerdict::all_ready(),
            preflight: PreflightVerdict::Off,
            windows: None,
            gates: None,
            config: RolloutConfig::default(),
            now: at(1010),
        }
    }

    fn max_unavailable(mut self, n: i64) -> Self {
        self.op.spec.max_unavailable = n.into();
        self
    }

    fn max_unavailable_text(mut self, text: &str) -> Self {
        self.op.spec.max_unavailable = text.into();
        self
    }

    fn kind(mut self, kind: &str) -> Self {
        self.op.spec.kind = kind.into();
        self
    }

    fn target(mut self, target: &str) -> Self {
        self.op.spec.target_version = target.into();
        self
    }

    fn lease(mut self, holder: &str, renewed_at: Timestamp, holder_exists: bool) -> Self {
        self.lease = Some(LeaseHolder {
            identity: holder.into(),
            renewed_at,
            lease_duration: Duration::from_secs(120),
            holder_exists,
        });
        self
    }

    fn no_lease(mut self) -> Self {
        self.lease = None;
        self
    }

    fn etcd(mut self, verdict: EtcdVerdict) -> Self {
        self.etcd = verdict;
        self
    }

    /// `machine`'s `components` are not Ready (its static pods, gathered with the gate).
    fn components_not_ready(mut self, machine: &str, components: &[Component]) -> Self {
        let ComponentsVerdict::Checked(found) = &mut self.components else { panic!("not checked") };
        found.insert(machine.to_owned(), components.to_vec());
        self
    }

    fn now(mut self, now: Timestamp) -> Self {
        self.now = now;
        self
    }

    fn with(mut self, name: &str, change: impl FnOnce(&mut MachineView)) -> Self {
        let m = self.machines.iter_mut().find(|m| m.name == name).unwrap_or_else(|| panic!("no machine {name}"));
        change(m);
        self
    }

    fn progress(self, name: &str, progress: MachineProgress) -> Self {
        self.with(name, |m| m.progress = progress)
    }

    fn in_progress(self, name: &str, past_upgrade_call: bool) -> Self {
        self.progress(name, MachineProgress::InProgress { past_upgrade_call })
    }

    fn converged(mut self, names: &[&str]) -> Self {
        for name in names {
            self = self.progress(name, MachineProgress::Converged);
        }
        self
    }

    fn all_control_planes_converged(mut self) -> Self {
        for m in &mut self.machines {
            if m.role == MachineRole::ControlPlane {
                m.progress = MachineProgress::Converged;
            }
        }
        self
    }

    fn failed(self, name: &str, reason: &str) -> Self {
        self.progress(name, MachineProgress::Failed { reason: reason.into() })
    }

    fn not_ready(self, name: &str) -> Self {
        self.with(name, |m| m.node_ready = false)
    }

    fn held(self, name: &str) -> Self {
        self.with(name, |m| m.held = true)
    }

    fn order(self, name: &str, label: &str) -> Self {
        self.with(name, |m| m.order_label = Some(label.into()))
    }

    fn resume(mut self, token: &str) -> Self {
        self.op.resume_token = Some(token.into());
        self
    }

    fn pause_requested(mut self, by: &str) -> Self {
        self.op.pause_requested = Some(by.into());
        self
    }

    fn status(mut self, status: OperationStatus) -> Self {
        self.op.status = status;
        self
    }

    /// A Kubernetes upgrade to 1.35.0 in `stage`, planning finding `problems`.
    fn kubernetes(mut self, stage: KubernetesStage, problems: Vec<KubernetesPlanProblem>) -> Self {
        self.op.spec.kind = "kubernetes".into();
        self.op.spec.target_version = "1.35.0".into();
        self.k8s = Some(KubernetesInput { stage, problems, rollouts: None, on_target: BTreeSet::new() });
        self
    }

    fn deleting(mut self) -> Self {
        self.op.deleting = true;
        self
    }

    fn decide(&self) -> Decision {
        decide(&RolloutInput {
            kubernetes: self.k8s.as_ref(),
            operation: &self.op,
            release_talos_version: &self.release,
            releases: crate::releases::KnownReleases::built_in(),
            kubernetes_version: &self.kubernetes,
            lease: self.lease.as_ref(),
            machines: &self.machines,
            unaccounted_nodes: &self.unaccounted,
            etcd: &self.etcd,
            components: &self.components,
            preflight: &self.preflight,
            windows: self.windows.as_ref(),
            gates: self.gates.as_ref(),
            config: &self.config,
            now: self.now,
        })
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

// Rule 1: the cluster lock.

#[test]
fn rule1_a_free_lock_is_acquired_before_any_machine_starts() {
    let d = Fixture::cluster(3, 2).no_lease().decide();
    assert_eq!(d.lock, LockAction::Acquire { takeover_from: None });
    assert_eq!(d.phase, Phase::Pending);
    assert!(d.start.is_empty() && d.advance.is_empty());
    assert_eq!(d.recheck_at, Some(at(1010)), "observe again at once after the Lease write");
}

#[test]
fn rule1_a_lock_held_by_another_live_operation_is_waiting_naming_the_holder() {
    let d = Fixture::cluster(3, 2).lease(OTHER, at(1000), true).in_progress("cp-1", true).decide();
    assert_eq!(d.lock, LockAction::Leave);
    assert_eq!(d.phase, Phase::Waiting(WaitReason::LockHeld { holder: OTHER.into() }));
    assert!(d.start.is_empty() && d.advance.is_empty() && d.stop.is_empty(), "nothing moves without the lock");
    assert_eq!(d.recheck_at, Some(at(1120)), "look again when the holder's lease could expire");
}

#[test]
fn rule1_a_lock_whose_holder_was_deleted_is_taken_over() {
    let d = Fixture::cluster(3, 2).lease(OTHER, at(1000), false).decide();
    assert_eq!(d.lock, LockAction::Acquire { takeover_from: Some(OTHER.into()) });
    assert!(d.start.is_empty());
}

#[test]
fn rule1_an_expired_lease_is_taken_over() {
    let d = Fixture::cluster(3, 2).lease(OTHER, at(800), true).now(at(920)).decide();
    assert_eq!(d.lock, LockAction::Acquire { takeover_from: Some(OTHER.into()) });
    let live = Fixture::cluster(3, 2).lease(OTHER, at(800), true).now(at(919)).decide();
    assert_eq!(live.lock, LockAction::Leave, "one second before expiry the holder still owns it");
}

#[test]
fn rule1_the_holder_renews_only_when_due() {
    assert_eq!(Fixture::cluster(1, 0).now(at(1039)).decide().lock, LockAction::Keep);
    let d = Fixture::cluster(1, 0).now(at(1040)).decide();
    assert_eq!(d.lock, LockAction::Renew);
    assert_eq!(d.recheck_at, Some(at(1080)), "next renewal is due renew_after from now");
}

#[test]
fn rule1_the_lock_is_released_on_completion_and_completion_is_sticky() {
    let d = Fixture::cluster(1, 1).converged(&["cp-1", "worker-1"]).decide();
    assert_eq!((d.lock.clone(), d.phase.clone()), (LockAction::Release, Phase::Completed));
    assert_eq!(d.recheck_at, None);

    let done = OperationStatus {
        phase: Phase::Completed,
        observed_generation: Some(1),
        observed_resume: None,
        ..OperationStatus::default()
    };
    let after = Fixture::cluster(1, 1).no_lease().status(done.clone()).decide();
    assert_eq!((after.lock, after.phase), (LockAction::Leave, Phase::Completed), "no re-acquire loop");

    let changed = Fixture::cluster(1, 1).no_lease().status(OperationStatus { observed_generation: Some(0), ..done });
    assert_eq!(changed.decide().lock, LockAction::Acquire { takeover_from: None }, "a new generation is re-planned");
}

#[test]
fn a_completed_operation_stays_completed_when_the_release_set_moves_on() {
    // Seen on a real API server: an operation to v1.14.3 Completed 5/5 became Refused
    // (TargetNotReleaseSet) at the next release bump, its records wiped.
    let done = OperationStatus {
        phase: Phase::Completed,
        observed_generation: Some(1),
        converged: 2,
        ..OperationStatus::default()
    };
    let mut bumped = Fixture::cluster(1, 1).no_lease().status(done.clone());
    bumped.release = "v1.14.5".into();
    bumped.kubernetes = "not a version".into();
    let d = bumped.decide();
    assert_eq!((d.lock, d.phase), (LockAction::Leave, Phase::Completed), "terminal");
    assert!(d.start.is_empty() && d.stop.is_empty() && d.advance.is_empty());
    // Its deletion is still carried out (the finalizer is removed).
    let mut deleted = Fixture::cluster(1, 1).no_lease().status(done);
    deleted.op.deleting = true;
    assert!(deleted.decide().finalized);
}

#[test]
fn rule1_a_deleted_operation_releases_the_lock_once_nothing_is_in_flight() {
    let d = Fixture::cluster(3, 0).deleting().decide();
    assert_eq!(d.lock, LockAction::Release);
    assert!(d.finalized);

    let d = Fixture::cluster(3, 2).deleting().in_progress("cp-1", true).in_progress("worker-1", false).decide();
    assert_eq!(d.lock, LockAction::Keep, "a control plane past its call is still observed under the lock");
    assert_eq!(d.advance, names(&["cp-1"]));
    assert_eq!(d.stop, names(&["worker-1"]), "an evacuating machine has its evacuation ended");
    assert_eq!(d.phase, Phase::Waiting(WaitReason::WindingDown { machines: names(&["cp-1"]) }));
    assert!(!d.finalized && d.start.is_empty());

    let not_ours = Fixture::cluster(3, 0).deleting().lease(OTHER, at(1000), true).decide();
    assert_eq!(not_ours.lock, LockAction::Leave);
    assert!(not_ours.finalized);
}

// Rule 2: order.

#[test]
fn rule2_control_planes_go_first_and_workers_wait_for_them() {
    let d = Fixture::cluster(3, 4).max_unavailable(4).decide();
    assert_eq!(d.start, names(&["cp-1"]));
    let d = Fixture::cluster(3, 4).max_unavailable(4).converged(&["cp-1", "cp-2"]).decide();
    assert_eq!(d.start, names(&["cp-3"]), "workers do not start while a control plane remains");
    let d = Fixture::cluster(3, 4).max_unavailable(4).all_control_planes_converged().decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2", "worker-3", "worker-4"]));
}

#[test]
fn rule2_order_label_then_name_unlabelled_last() {
    let d = Fixture::cluster(3, 0).order("cp-3", "1").order("cp-2", "2").decide();
    assert_eq!(d.start, names(&["cp-3"]));
    let d = Fixture::cluster(1, 4)
        .all_control_planes_converged()
        .max_unavailable(1)
        .order("worker-4", "-5")
        .order("worker-2", "10")
        .decide();
    assert_eq!(d.start, names(&["worker-4"]), "negative orders come first");
}

// Issue 55 (papercuts): machines without an order label went in text order, worker-10
// and worker-11 before worker-2; people expect the numbers' order.
#[test]
fn unlabelled_machines_go_in_natural_order_of_their_names() {
    let d = Fixture::cluster(1, 12).all_control_planes_converged().max_unavailable(3).decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2", "worker-3"]));
    let mut keys: Vec<NameOrder<'_>> =
        ["worker-10", "worker-2", "cp-1", "worker-1", "worker", "worker-02", "db-9", "db-10a"].map(NameOrder).to_vec();
    keys.sort();
    let sorted: Vec<&str> = keys.iter().map(|k| k.0).collect();
    assert_eq!(sorted, ["cp-1", "db-9", "db-10a", "worker", "worker-1", "worker-02", "worker-2", "worker-10"]);
}

// Issue 55 item 3: `maxUnavailable: "10%"` is a tenth of the workers the cluster has,
// rounded down, at least 1; both kinds take it.
#[test]
fn a_percentage_max_unavailable_starts_that_share_of_the_workers() {
    let d = Fixture::cluster(1, 25).all_control_planes_converged().max_unavailable_text("10%").decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2"]), "10 % of 25, rounded down");
    let d = Fixture::cluster(1, 5).all_control_planes_converged().max_unavailable_text("10%").decide();
    assert_eq!(d.start, names(&["worker-1"]), "at least one");
    let d = Fixture::cluster(1, 4).all_control_planes_converged().max_unavailable_text("50%").decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2"]));
    let f = Fixture::cluster(3, 4).max_unavailable_text("50%").kubernetes(KubernetesStage::Kubelets, Vec::new());
    let d = f.all_control_planes_converged().decide();
    assert_eq!(d.start.iter().filter(|n| n.starts_with("worker")).count(), 2, "{:?}", d.start);
    let refused = Fixture::cluster(1, 4).max_unavailable_text("ten").decide();
    assert!(
        matches!(&refused.phase, Phase::Refused(Refusal::InvalidMaxUnavailablePercent { value }) if value == "ten"),
        "{:?}",
        refused.phase
    );
}

#[test]
fn the_controllers_own_machine_goes_last_in_its_role_whatever_its_order() {
    let mut f = Fixture::cluster(3, 3).order("cp-1", "-100");
    for m in &mut f.machines {
        m.last = m.name == "cp-1" || m.name == "worker-1";
    }
    let d = f.clone().decide();
    assert_eq!(d.start, names(&["cp-2"]), "not cp-1, though its order is the lowest");
    let d = f.clone().converged(&["cp-2", "cp-3"]).decide();
    assert_eq!(d.start, names(&["cp-1"]), "the others done: its turn");
    let d = f.clone().all_control_planes_converged().max_unavailable(3).decide();
    assert_eq!(d.start, names(&["worker-2", "worker-3"]), "a wave of its own, the last, even with room");
    let d = f.all_control_planes_converged().max_unavailable(3).converged(&["worker-2", "worker-3"]).decide();
    assert_eq!(d.start, names(&["worker-1"]));
}

#[test]
fn rule2_a_worker_wave_starts_only_when_the_previous_one_converged() {
    let base = Fixture::cluster(1, 4)
        .all_control_planes_converged()
        .max_unavailable(3)
        .order("worker-1", "1")
        .order("worker-2", "1")
        .order("worker-3", "2");
    let d = base.clone().decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2"]), "wave 1 only, though the budget allows three");
    let d = base.clone().converged(&["worker-1"]).in_progress("worker-2", true).decide();
    assert!(d.start.is_empty(), "wave 2 waits for worker-2");
    let d = base.clone().converged(&["worker-1", "worker-2"]).decide();
    assert_eq!(d.start, names(&["worker-3"]), "wave 2; unlabelled worker-4 is the last wave");
    let d = base.converged(&["worker-1", "worker-2", "worker-3"]).decide();
    assert_eq!(d.start, names(&["worker-4"]));
}

#[test]
fn rule2_a_non_integer_order_label_is_ignored_with_a_warning() {
    let d = Fixture::cluster(1, 2)
        .all_control_planes_converged()
        .order("worker-1", "first")
        .order("worker-2", "3")
        .decide();
    assert_eq!(d.start, names(&["worker-2"]), "worker-1 is ordered as if unlabelled, so last");
    assert_eq!(d.warnings, vec![Warning::InvalidOrderLabel { machine: "worker-1".into(), value: "first".into() }]);
    assert_eq!(d.warnings[0].reason(), "InvalidOrderLabel");
    assert!(d.warnings[0].to_string().contains("\"first\""));
}

// Rule 3: control planes one at a time, behind readiness and the etcd gate.

#[test]
fn rule3_only_one_control_plane_is_ever_in_progress() {
    let d = Fixture::cluster(3, 0).in_progress("cp-1", false).decide();
    assert!(d.start.is_empty());
    assert_eq!(d.advance, names(&["cp-1"]));
    assert_eq!(d.phase, Phase::Progressing);
}

#[test]
fn rule3_no_control_plane_starts_while_another_is_not_ready() {
    let d = Fixture::cluster(3, 2).converged(&["cp-1"]).not_ready("cp-1").decide();
    assert!(d.start.is_empty());
    assert_eq!(d.phase, Phase::Waiting(WaitReason::ControlPlaneNotReady { nodes: names(&["cp-1"]) }));
}

#[test]
fn rule3_no_control_plane_starts_while_the_etcd_gate_fails() {
    let d = Fixture::cluster(3, 2).etcd(EtcdVerdict::Unhealthy { reason: "member cp-2 is a learner".into() }).decide();
    assert!(d.start.is_empty());
    assert_eq!(d.phase, Phase::Waiting(WaitReason::EtcdUnhealthy { reason: "member cp-2 is a learner".into() }));
    assert!(!d.check_etcd);
}

#[test]
fn rule3_an_unchecked_gate_is_asked_for_not_assumed() {
    let d = Fixture::cluster(3, 2).converged(&["cp-1"]).etcd(EtcdVerdict::NotChecked).decide();
    assert!(d.start.is_empty());
    assert!(d.check_etcd);
    assert_eq!(d.phase, Phase::Waiting(WaitReason::EtcdGateNotChecked));
    let workers_only = Fixture::cluster(1, 2).all_control_planes_converged().etcd(EtcdVerdict::NotChecked).decide();
    assert!(!workers_only.check_etcd, "the gate is only needed before a control plane");
    assert_eq!(workers_only.start, names(&["worker-1"]));
}

#[test]
fn rule3_the_gate_runs_again_between_control_planes() {
    let d = Fixture::cluster(3, 0)
        .converged(&["cp-1"])
        .etcd(EtcdVerdict::Unhealthy { reason: "no leader agreed".into() })
        .decide();
    assert!(d.start.is_empty(), "cp-2 waits for etcd after cp-1 converged");
}

// Rule 4: maxUnavailable counts workers already unavailable.

#[test]
fn rule4_max_unavailable_counts_nodes_already_unavailable() {
    let d = Fixture::cluster(1, 5).all_control_planes_converged().max_unavailable(2).not_ready("worker-5").decide();
    assert_eq!(d.start, names(&["worker-1"]), "worker-5 is down already: one slot left");
    let d = Fixture::cluster(1, 5)
        .all_control_planes_converged()
        .max_unavailable(2)
        .not_ready("worker-4")
        .not_ready("worker-5")
        .decide();
    assert!(d.start.is_empty());
    assert_eq!(d.phase, Phase::Waiting(WaitReason::MaxUnavailable { unavailable: names(&["worker-4", "worker-5"]) }));
    let d =
        Fixture::cluster(1, 5).all_control_planes_converged().max_unavailable(2).in_progress("worker-1", true).decide();
    assert_eq!(d.start, names(&["worker-2"]));
}

#[test]
fn rule4_a_not_ready_worker_is_skipped_and_waited_for() {
    let d = Fixture::cluster(1, 2).all_control_planes_converged().max_unavailable(3).not_ready("worker-1").decide();
    assert_eq!(d.start, names(&["worker-2"]));
    let d =
        Fixture::cluster(1, 2).all_control_planes_converged().converged(&["worker-2"]).not_ready("worker-1").decide();
    assert_eq!(d.phase, Phase::Waiting(WaitReason::NodesNotReady { nodes: names(&["worker-1"]) }));
}

// Rule 5: holds.

#[test]
fn rule5_a_held_machine_is_not_started_and_blocks_completion() {
    let d = Fixture::cluster(3, 1).held("cp-1").decide();
    assert_eq!(d.start, names(&["cp-2"]));
    assert_eq!(d.held, names(&["cp-1"]));
    let d = Fixture::cluster(3, 1).held("cp-1").converged(&["cp-2", "cp-3", "worker-1"]).decide();
    assert_eq!(d.phase, Phase::Waiting(WaitReason::Held { machines: names(&["cp-1"]) }));
    assert_eq!(d.lock, LockAction::Keep, "not complete, so the lock is kept");
}

#[test]
fn rule5_a_hold_never_interrupts_a_machine_past_its_upgrade_call() {
    let d =
        Fixture::cluster(1, 2).all_control_planes_converged().in_progress("worker-1", true).held("worker-1").decide();
    assert_eq!(d.advance, names(&["worker-1"]));
    assert!(d.stop.is_empty());
    let d =
        Fixture::cluster(1, 2).all_control_planes_converged().in_progress("worker-1", false).held("worker-1").decide();
    assert_eq!(d.stop, names(&["worker-1"]), "before its call, a held machine's evacuation is ended");
    assert!(!d.advance.contains(&"worker-1".to_owned()));
}

// Rule 6: pause on failure, resume by annotation.

#[test]
fn rule6_a_failure_pauses_and_nothing_else_starts() {
    let d = Fixture::cluster(1, 4)
        .all_control_planes_converged()
        .max_unavailable(3)
        .failed("worker-1", "A/B fallback: booted v1.14.3")
        .in_progress("worker-2", true)
        .in_progress("worker-3", false)
        .decide();
    assert!(d.start.is_empty());
    assert_eq!(d.advance, names(&["worker-2"]), "a machine past its call is observed until it verifies");
    assert_eq!(d.stop, names(&["worker-3"]), "an evacuating machine has its evacuation ended");
    assert_eq!(
        d.phase,
        Phase::Paused(PauseReason::MachineFailed {
            machines: vec![FailedMachine { name: "worker-1".into(), reason: "A/B fallback: booted v1.14.3".into() }]
        })
    );
    assert_eq!(d.phase.reason(), "MachineFailed");
    assert_eq!(d.lock, LockAction::Keep, "a paused operation keeps its lock");
}

#[test]
fn rule6_a_resume_retries_the_failed_machine_once_per_token() {
    let paused = Fixture::cluster(3, 0).converged(&["cp-1"]).failed("cp-2", "evacuation timed out");
    let d = paused.clone().resume("2026-11-29T10:00").decide();
    assert_eq!(d.retry, names(&["cp-2"]));
    assert_eq!(d.start, names(&["cp-2"]));
    assert_eq!(d.acknowledge_resume, Some("2026-11-29T10:00".into()));
    assert_eq!(d.phase, Phase::Progressing);

    let seen = OperationStatus { observed_resume: Some("2026-11-29T10:00".into()), ..OperationStatus::default() };
    let again = paused.resume("2026-11-29T10:00").status(seen).decide();
    assert!(matches!(again.phase, Phase::Paused(_)), "the same token does not resume twice");
    assert!(again.retry.is_empty() && again.start.is_empty());
}

#[test]
fn rule6_a_resumed_machine_that_cannot_start_yet_is_still_reset() {
    let d = Fixture::cluster(3, 0).converged(&["cp-1"]).failed("cp-2", "x").not_ready("cp-3").resume("t").decide();
    assert_eq!(d.retry, names(&["cp-2"]), "reset now, or the next pass would pause again");
    assert!(d.start.is_empty());
    assert!(matches!(d.phase, Phase::Waiting(WaitReason::ControlPlaneNotReady { .. })));
}

// Rule 7: transient trouble is waiting, never failure.

#[test]
fn rule7_transient_trouble_waits_and_says_why() {
    let cases = [
        Fixture::cluster(3, 0).lease(OTHER, at(1000), true),
        Fixture::cluster(3, 0).not_ready("cp-2"),
        Fixture::cluster(3, 0).etcd(EtcdVerdict::Unhealthy { reason: "alarm NOSPACE on member 1".into() }),
        Fixture::cluster(1, 2).all_control_planes_converged().not_ready("worker-1").not_ready("worker-2"),
    ];
    for case in cases {
        let d = case.decide();
        assert!(matches!(d.phase, Phase::Waiting(_)), "{:?}", d.phase);
        assert!(!d.phase.to_string().is_empty());
    }
}

// Rule 8: all state is in the input; a restarted controller decides the same.

#[test]
fn rule8_the_same_observation_gives_the_same_decision() {
    let f =
        Fixture::cluster(3, 20).max_unavailable(4).converged(&["cp-1", "cp-2", "cp-3"]).in_progress("worker-3", true);
    assert_eq!(f.decide(), f.clone().decide());
    let d = f.decide();
    assert!(d.advance.contains(&"worker-3".to_owned()));
    assert!(!d.start.contains(&"worker-3".to_owned()), "a machine in progress is advanced, never started again");
}

// Rules 9 and 10: kinds and targets.

#[test]
fn rule9_other_kinds_are_refused_and_touch_nothing() {
    for kind in ["Kubernetes", "ichor", "unknown"] {
        let d = Fixture::cluster(3, 2).no_lease().kind(kind).decide();
        assert_eq!(d.phase, Phase::Refused(Refusal::UnsupportedKind { kind: kind.into() }));
        assert_eq!(d.lock, LockAction::Leave, "a refused operation never takes the lock");
        assert!(d.start.is_empty() && d.advance.is_empty() && d.stop.is_empty());
    }
}

#[test]
fn rule10_a_target_other_than_the_release_sets_is_refused() {
    let d = Fixture::cluster(3, 2).no_lease().target("v1.14.5").decide();
    assert_eq!(
        d.phase,
        Phase::Refused(Refusal::TargetNotReleaseSet { target: "v1.14.5".into(), release: "v1.14.4".into() })
    );
    assert!(d.start.is_empty());
}

// DESIGN §9 rows the engine sees.

#[test]
fn bad_input_max_unavailable_zero_or_negative_is_refused() {
    for n in [0, -3] {
        let d = Fixture::cluster(1, 2).max_unavailable(n).decide();
        assert_eq!(d.phase, Phase::Refused(Refusal::InvalidMaxUnavailable { value: n }));
        assert_eq!(d.lock, LockAction::Release, "a spec made invalid mid-way winds down and lets go");
    }
}

#[test]
fn bad_input_unparseable_target_is_refused_naming_field_and_text() {
    let d = Fixture::cluster(1, 0).target("v1.14").decide();
    let Phase::Refused(refusal) = &d.phase else { panic!("{:?}", d.phase) };
    assert!(refusal.to_string().starts_with("spec.targetVersion: \"v1.14\""), "{refusal}");
}

#[test]
fn bad_input_lease_renewed_in_the_future_is_treated_as_now() {
    let d = Fixture::cluster(1, 0).lease(US, at(5000), true).now(at(1000)).decide();
    assert_eq!(d.lock, LockAction::Keep, "no negative duration, no panic");
    let other = Fixture::cluster(1, 0).lease(OTHER, at(5000), true).now(at(1000)).decide();
    assert_eq!(other.lock, LockAction::Leave);
}

#[test]
fn phase_reasons_are_camel_case_and_distinct() {
    let phases = [
        Phase::Pending,
        Phase::Progressing,
        Phase::Waiting(WaitReason::LockHeld { holder: String::new() }),
        Phase::Waiting(WaitReason::ControlPlaneNotReady { nodes: vec![] }),
        Phase::Waiting(WaitReason::EtcdUnhealthy { reason: String::new() }),
        Phase::Waiting(WaitReason::EtcdGateNotChecked),
        Phase::Waiting(WaitReason::MaxUnavailable { unavailable: vec![] }),
        Phase::Waiting(WaitReason::NodesNotReady { nodes: vec![] }),
        Phase::Waiting(WaitReason::Held { machines: vec![] }),
        Phase::Waiting(WaitReason::WindingDown { machines: vec![] }),
        Phase::Paused(PauseReason::MachineFailed { machines: vec![] }),
        Phase::Completed,
        Phase::Refused(Refusal::UnsupportedKind { kind: String::new() }),
    ];
    let reasons: BTreeSet<&str> = phases.iter().map(Phase::reason).collect();
    assert_eq!(reasons.len(), phases.len());
    for r in reasons {
        assert!(
            r.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && r.chars().all(|c| c.is_ascii_alphanumeric())
        );
    }
}

#[test]
fn rule5_held_machines_do_not_block_later_waves_or_the_workers() {
    let d = Fixture::cluster(2, 2)
        .all_control_planes_converged()
        .progress("cp-2", MachineProgress::Pending)
        .held("cp-2")
        .order("worker-1", "1")
        .order("worker-2", "2")
        .held("worker-1")
        .decide();
    assert_eq!(d.start, names(&["worker-2"]), "a held control plane and a held first wave are skipped");
    assert_eq!(d.held, names(&["cp-2", "worker-1"]));
}

#[test]
fn rule6_a_paused_operation_keeps_renewing_its_lock() {
    let d = Fixture::cluster(2, 0).failed("cp-1", "A/B fallback").now(at(1050)).decide();
    assert!(matches!(d.phase, Phase::Paused(_)));
    assert_eq!(d.lock, LockAction::Renew, "no other operation may take over a half-done cluster");
    assert_eq!(d.recheck_at, Some(at(1090)));
}

#[test]
fn rule9_a_spec_made_invalid_mid_way_winds_down_before_releasing() {
    let d = Fixture::cluster(2, 2).kind("ichor").in_progress("cp-1", true).decide();
    assert!(matches!(d.phase, Phase::Refused(Refusal::UnsupportedKind { .. })));
    assert_eq!(d.advance, names(&["cp-1"]), "a machine past its call is still observed to the end");
    assert_eq!(d.lock, LockAction::Keep);
    assert!(d.start.is_empty());
    let d = Fixture::cluster(2, 2).kind("ichor").in_progress("worker-1", false).decide();
    assert_eq!(d.stop, names(&["worker-1"]));
}

// Rule 3, review finding 1: every machine the decision moves carries the authority for its
// Upgrade call, computed in this pass.

fn authority(d: &Decision, name: &str) -> CallAuthority {
    d.authority.get(name).cloned().unwrap_or_else(|| panic!("no authority for {name}: {d:?}"))
}

#[test]
fn a_started_control_plane_is_authorised_by_the_gate_gathered_for_it() {
    let d = Fixture::cluster(3, 1).decide();
    assert_eq!(d.start, names(&["cp-1"]));
    assert_eq!(authority(&d, "cp-1"), CallAuthority::Granted);
}

#[test]
fn an_advancing_control_plane_needs_the_gate_again_and_every_other_control_plane_ready() {
    let going = Fixture::cluster(3, 1).in_progress("cp-1", true);
    assert_eq!(authority(&going.clone().etcd(EtcdVerdict::NotChecked).decide(), "cp-1"), CallAuthority::NeedsEtcdGate);
    let d = going.clone().not_ready("cp-2").decide();
    assert_eq!(d.advance, names(&["cp-1"]), "observed to the end");
    assert_eq!(
        authority(&d, "cp-1"),
        CallAuthority::Denied(CallDenied::ControlPlaneNotReady { nodes: names(&["cp-2"]) })
    );
    let unhealthy = going.clone().etcd(EtcdVerdict::Unhealthy { reason: "NOSPACE".into() }).decide();
    assert_eq!(
        authority(&unhealthy, "cp-1"),
        CallAuthority::Denied(CallDenied::EtcdUnhealthy { reason: "NOSPACE".into() })
    );
    // Its own Node NotReady (it is rebooting) does not deny it: the step checks that.
    assert_eq!(authority(&going.not_ready("cp-1").decide(), "cp-1"), CallAuthority::Granted);
}

#[test]
fn a_paused_deleting_or_held_operation_authorises_no_call() {
    let paused =
        Fixture::cluster(3, 2).all_control_planes_converged().in_progress("worker-1", true).failed("worker-2", "x");
    let d = paused.decide();
    assert_eq!(d.advance, names(&["worker-1"]));
    assert_eq!(authority(&d, "worker-1"), CallAuthority::Denied(CallDenied::Paused));
    let deleting = Fixture::cluster(3, 1).all_control_planes_converged().in_progress("worker-1", true).deleting();
    assert_eq!(authority(&deleting.decide(), "worker-1"), CallAuthority::Denied(CallDenied::Deleting));
    let held = Fixture::cluster(3, 1).all_control_planes_converged().in_progress("worker-1", true).held("worker-1");
    assert_eq!(authority(&held.decide(), "worker-1"), CallAuthority::Denied(CallDenied::Held));
    let refused = Fixture::cluster(3, 1).all_control_planes_converged().in_progress("worker-1", true).kind("ichor");
    assert_eq!(authority(&refused.decide(), "worker-1"), CallAuthority::Denied(CallDenied::Refused));
}

#[test]
fn call_authority_asked_again_with_the_gate_gathered_later_in_the_pass() {
    let f = Fixture::cluster(3, 0).in_progress("cp-1", true).etcd(EtcdVerdict::Healthy);
    let input = RolloutInput {
        kubernetes: None,
        operation: &f.op,
        release_talos_version: &f.release,
        releases: crate::releases::KnownReleases::built_in(),
        kubernetes_version: &f.kubernetes,
        lease: f.lease.as_ref(),
        machines: &f.machines,
        unaccounted_nodes: &[],
        etcd: &f.etcd,
        components: &f.components,
        preflight: &PreflightVerdict::Off,
        windows: None,
        gates: None,
        config: &f.config,
        now: f.now,
    };
    assert_eq!(call_authority(&input, "cp-1"), CallAuthority::Granted);
    assert_eq!(call_authority(&input, "cp-9"), CallAuthority::Denied(CallDenied::NotInCluster));
    let not_ours = Fixture::cluster(3, 0).lease(OTHER, at(1000), true);
    let input = RolloutInput { operation: &not_ours.op, lease: not_ours.lease.as_ref(), ..input };
    assert_eq!(call_authority(&input, "cp-1"), CallAuthority::Denied(CallDenied::LockNotHeld));
}

// Issue 29 item 10: the preflight is judged again before the first call, not only at the
// start (an evacuation can take its whole timeout between the two).

#[test]
fn an_advancing_machines_first_call_needs_the_preflight_judged_in_its_own_pass() {
    let mut going = Fixture::cluster(3, 2).all_control_planes_converged().in_progress("worker-1", true);
    going.preflight = PreflightVerdict::NotChecked;
    assert_eq!(authority(&going.decide(), "worker-1"), CallAuthority::NeedsPreflight);
    let budget = Blocker::BudgetAtZero { namespace: "pay".into(), name: "ledger".into(), healthy: 2, desired: 2 };
    going.preflight = PreflightVerdict::Checked([("worker-1".to_owned(), vec![budget.clone()])].into());
    let denied = authority(&going.decide(), "worker-1");
    assert_eq!(
        denied,
        CallAuthority::Denied(CallDenied::PreflightBlocked { blockers: describe(std::slice::from_ref(&budget)) })
    );
    let CallAuthority::Denied(why) = denied else { unreachable!() };
    assert!(why.to_string().contains("PDB pay/ledger allows 0 disruptions"), "{why}");
    going.preflight = PreflightVerdict::Checked([("worker-1".to_owned(), Vec::new())].into());
    assert_eq!(authority(&going.decide(), "worker-1"), CallAuthority::Granted);
    // Under `preflight: Warn` the start recorded the warning; the call is not stopped.
    going.op.spec.preflight = Some(crate::operation::PreflightMode::Warn);
    going.preflight = PreflightVerdict::Checked([("worker-1".to_owned(), vec![budget])].into());
    assert_eq!(authority(&going.decide(), "worker-1"), CallAuthority::Granted);
}

#[test]
fn the_preflight_comes_before_the_etcd_gate_and_never_stops_a_machine_past_its_call() {
    let mut going = Fixture::cluster(3, 1).in_progress("cp-1", true).etcd(EtcdVerdict::NotChecked);
    going.preflight = PreflightVerdict::NotChecked;
    let d = going.decide();
    assert_eq!(authority(&d, "cp-1"), CallAuthority::NeedsPreflight);
    assert_eq!(finish(&d, "cp-1"), CallAuthority::NeedsEtcdGate, "the finish does not ask the preflight");
    going.preflight = PreflightVerdict::Checked([("cp-1".to_owned(), Vec::new())].into());
    assert_eq!(authority(&going.decide(), "cp-1"), CallAuthority::NeedsEtcdGate);
}

// The lifecycle executor's reboot of an installed machine: a pause, a hold or a deletion
// does not interrupt a machine past its call, the lock and the etcd gate still decide.

fn finish(d: &Decision, name: &str) -> CallAuthority {
    d.finish_authority.get(name).cloned().unwrap_or_else(|| panic!("no finish authority for {name}: {d:?}"))
}

#[test]
fn a_paused_held_or_deleting_operation_still_finishes_a_machine_past_its_call() {
    let paused =
        Fixture::cluster(3, 2).all_control_planes_converged().in_progress("worker-1", true).failed("worker-2", "x");
    assert_eq!(finish(&paused.decide(), "worker-1"), CallAuthority::Granted);
    let held = Fixture::cluster(3, 1).all_control_planes_converged().in_progress("worker-1", true).held("worker-1");
    assert_eq!(finish(&held.decide(), "worker-1"), CallAuthority::Granted);
    let deleting = Fixture::cluster(3, 1).all_control_planes_converged().in_progress("worker-1", true).deleting();
    assert_eq!(finish(&deleting.decide(), "worker-1"), CallAuthority::Granted);
}

#[test]
fn finishing_a_control_plane_needs_the_gate_and_every_other_control_plane_ready() {
    let going = Fixture::cluster(3, 1).in_progress("cp-1", true);
    assert_eq!(finish(&going.clone().etcd(EtcdVerdict::NotChecked).decide(), "cp-1"), CallAuthority::NeedsEtcdGate);
    assert_eq!(
        finish(&going.clone().not_ready("cp-3").decide(), "cp-1"),
        CallAuthority::Denied(CallDenied::ControlPlaneNotReady { nodes: names(&["cp-3"]) })
    );
    assert_eq!(
        finish(&going.clone().etcd(EtcdVerdict::Unhealthy { reason: "a learner".into() }).decide(), "cp-1"),
        CallAuthority::Denied(CallDenied::EtcdUnhealthy { reason: "a learner".into() })
    );
    assert_eq!(finish(&going.decide(), "cp-1"), CallAuthority::Granted);
}

#[test]
fn finish_authority_asked_again_needs_the_lock() {
    let f = Fixture::cluster(3, 0).in_progress("cp-1", true).etcd(EtcdVerdict::Healthy);
    let not_ours = Fixture::cluster(3, 0).lease(OTHER, at(1000), true);
    let input = RolloutInput {
        kubernetes: None,
        operation: &not_ours.op,
        release_talos_version: &f.release,
        releases: crate::releases::KnownReleases::built_in(),
        kubernetes_version: &f.kubernetes,
        lease: not_ours.lease.as_ref(),
        machines: &f.machines,
        unaccounted_nodes: &[],
        etcd: &f.etcd,
        components: &f.components,
        preflight: &PreflightVerdict::Off,
        windows: None,
        gates: None,
        config: &f.config,
        now: f.now,
    };
    assert_eq!(finish_authority(&input, "cp-1"), CallAuthority::Denied(CallDenied::LockNotHeld));
    let input = RolloutInput { operation: &f.op, lease: f.lease.as_ref(), ..input };
    assert_eq!(finish_authority(&input, "cp-1"), CallAuthority::Granted);
}

// Refusals at planning (review, "Refusals at planning"): before any machine starts, every
// problem that would stop the rollout part way.

fn refusal_of(d: &Decision) -> &Refusal {
    let Phase::Refused(refusal) = &d.phase else { panic!("not refused: {:?}", d.phase) };
    refusal
}

#[test]
fn planning_refuses_machines_that_cannot_reach_the_target_naming_each_and_the_path() {
    let f = Fixture::cluster(3, 2)
        .with("worker-1", |m| m.os_image = Some("Talos (v1.12.5)".into()))
        .with("worker-2", |m| m.os_image = Some("Talos (v1.12.5)".into()));
    let d = f.clone().no_lease().decide();
    assert!(d.start.is_empty() && d.advance.is_empty());
    assert_eq!(d.lock, LockAction::Leave, "the lock is not even taken");
    let refusal = refusal_of(&d);
    assert_eq!(refusal.reason(), "UpgradePathRefused");
    let text = refusal.to_string();
    assert!(text.contains("worker-1, worker-2") && text.contains("v1.13"), "{text}");
    // With the lock already taken, it is released; nothing starts.
    let d = f.decide();
    assert_eq!(d.lock, LockAction::Release);
    assert!(d.start.is_empty());
}

#[test]
fn nodes_no_machine_names_refuse_the_start_and_hold_the_completion() {
    // Before any machine started: refused, each Node named, the fix said, nothing started.
    let mut f = Fixture::cluster(3, 2);
    f.unaccounted = names(&["node-a", "node-b"]);
    let d = f.clone().no_lease().decide();
    assert!(d.start.is_empty() && d.advance.is_empty());
    let refusal = refusal_of(&d);
    assert_eq!(refusal.reason(), "NodesWithoutMachines");
    let text = refusal.to_string();
    assert!(text.contains("node-a, node-b") && text.contains("spec.discovery: Nodes"), "{text}");
    // Every machine converged while a Node has none (it appeared under way): not Completed,
    // and the lock is kept.
    let mut done = Fixture::cluster(3, 2).converged(&["cp-1", "cp-2", "cp-3", "worker-1", "worker-2"]);
    done.unaccounted = names(&["node-late"]);
    let d = done.decide();
    assert_eq!(d.phase, Phase::Waiting(WaitReason::NodesWithoutMachines { nodes: names(&["node-late"]) }));
    assert_ne!(d.lock, LockAction::Release);
    assert!(d.phase.to_string().contains("node-late"), "{}", d.phase);
    // Once accounted for, Completed.
    done.unaccounted.clear();
    assert_eq!(done.decide().phase, Phase::Completed);
    // A Node that appears under way does not stop the machines already going.
    let mut going = Fixture::cluster(3, 2).converged(&["cp-1"]);
    going.unaccounted = names(&["node-late"]);
    assert!(!matches!(going.decide().phase, Phase::Refused(_)), "{}", going.decide().phase);
}

// Issue 55 (papercuts): `v1.99.0` was refused as a Kubernetes pairing problem and a path
// that skips 84 minor lines, node by node; it is no release the engine knows, and that is
// all there is to say.
#[test]
fn planning_refuses_a_release_newer_than_any_known_as_unknown_and_says_nothing_else_of_it() {
    for target in ["v1.99.0", "v1.16.0", "v2.0.0"] {
        let mut f = Fixture::cluster(3, 2).target(target);
        f.release = target.to_owned();
        let d = f.decide();
        let refusal = refusal_of(&d);
        assert_eq!(refusal.reason(), "UnknownTalosRelease", "{target}: {refusal}");
        let text = refusal.to_string();
        assert!(text.contains(&format!("Talos {target} is not a release this engine knows")), "{text}");
        assert!(text.contains("v1.15"), "names the newest it knows: {text}");
        assert!(!text.contains("pairing") && !text.contains("skips"), "nothing else of it: {text}");
        assert!(d.start.is_empty() && d.advance.is_empty(), "nothing touched: {d:?}");
    }
    // The newest known line is planned as before.
    let mut f = Fixture::cluster(3, 2).target("v1.15.0");
    f.release = "v1.15.0".to_owned();
    let known = f.decide();
    assert!(!matches!(&known.phase, Phase::Refused(r) if r.reason() == "UnknownTalosRelease"), "{:?}", known.phase);
}

#[test]
fn planning_refuses_two_control_planes_duplicate_names_and_a_bad_pairing() {
    let two = Fixture::cluster(2, 3).decide();
    assert_eq!(refusal_of(&two).reason(), "TwoControlPlanes");
    assert!(refusal_of(&two).to_string().contains("quorum"));
    let mut dup = Fixture::cluster(3, 2);
    dup.machines[4].name = "worker-1".into();
    assert_eq!(refusal_of(&dup.decide()).reason(), "DuplicateMachineNames");
    let mut k8s = Fixture::cluster(3, 1);
    k8s.kubernetes = "1.31.4".into();
    let d = k8s.decide();
    assert_eq!(refusal_of(&d).reason(), "KubernetesPairingRefused");
    assert!(refusal_of(&d).to_string().contains("1.32.0 to 1.37.x"), "{}", refusal_of(&d));
    let bad = Fixture::cluster(3, 1).with("worker-1", |m| m.os_image = Some("Talos (1.14.3)".into())).decide();
    assert_eq!(refusal_of(&bad).reason(), "BadOsImage");
    // Every problem is named, not only the first.
    let mut all = Fixture::cluster(2, 1).with("worker-1", |m| m.os_image = Some("Talos (v1.12.5)".into()));
    all.kubernetes = "1.31.4".into();
    let Refusal::Unplannable { problems } = refusal_of(&all.decide()).clone() else { panic!() };
    assert_eq!(problems.len(), 3, "{problems:?}");
}

#[test]
fn planning_skips_unread_nodes_and_does_not_apply_once_machines_started() {
    let unread = Fixture::cluster(3, 1).with("worker-1", |m| m.os_image = None).decide();
    assert_eq!(unread.start, names(&["cp-1"]), "an unread Node is checked when its machine starts");
    let started = Fixture::cluster(3, 1)
        .converged(&["cp-1"])
        .with("worker-1", |m| m.os_image = Some("Talos (v1.12.5)".into()))
        .decide();
    assert!(matches!(started.phase, Phase::Progressing), "{:?}", started.phase);
}

// Removal under the lock (issue 12): kind `remove` holds the cluster's lock like an upgrade.

fn removal(f: Fixture, machine: Option<&str>) -> Fixture {
    let mut f = f;
    f.op.spec = OperationSpec {
        preflight: None,
        allow_two_control_planes: false,
        etcd_snapshot: None,
        kind: "remove".into(),
        target_version: String::new(),
        max_unavailable: 1.into(),
        machine: machine.map(str::to_owned),
    };
    f
}

#[test]
fn a_removal_takes_the_lock_then_removes_its_one_machine_then_releases() {
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).no_lease().decide();
    assert_eq!(d.lock, LockAction::Acquire { takeover_from: None });
    assert!(d.start.is_empty());
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).decide();
    assert_eq!((d.start.clone(), d.phase.clone()), (names(&["worker-2"]), Phase::Progressing));
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).in_progress("worker-2", false).decide();
    assert_eq!(d.advance, names(&["worker-2"]));
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).converged(&["worker-2"]).decide();
    assert_eq!((d.lock, d.phase), (LockAction::Release, Phase::Completed));
}

#[test]
fn a_removal_waits_for_an_upgrade_holding_the_lock_and_pauses_on_failure() {
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).lease(OTHER, at(1000), true).decide();
    assert_eq!(d.phase, Phase::Waiting(WaitReason::LockHeld { holder: OTHER.into() }));
    assert!(d.start.is_empty());
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).failed("worker-2", "ResetRefused").decide();
    assert!(matches!(d.phase, Phase::Paused(_)), "{:?}", d.phase);
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).failed("worker-2", "x").resume("t").decide();
    assert_eq!((d.retry.clone(), d.start.clone()), (names(&["worker-2"]), names(&["worker-2"])));
}

#[test]
fn a_removal_without_a_machine_or_of_an_unknown_one_is_refused() {
    let d = removal(Fixture::cluster(3, 2), None).decide();
    assert_eq!(d.phase, Phase::Refused(Refusal::MissingMachine));
    let d = removal(Fixture::cluster(3, 2), Some("worker-9")).decide();
    assert_eq!(d.phase, Phase::Refused(Refusal::UnknownMachine { machine: "worker-9".into() }));
    // Two control planes are no reason to refuse a removal (it is how one gets to three or one).
    let d = removal(Fixture::cluster(2, 1), Some("cp-2")).decide();
    assert_eq!(d.start, names(&["cp-2"]));
}

#[test]
fn removing_a_control_plane_that_leaves_two_is_refused_unless_allowed() {
    let refused = Refusal::LeavesTwoControlPlanes { machine: "cp-2".into() };
    let d = removal(Fixture::cluster(3, 2), Some("cp-2")).decide();
    assert_eq!(d.phase, Phase::Refused(refused.clone()));
    assert!(d.start.is_empty(), "nothing touched");
    assert_eq!(refused.reason(), "LeavesTwoControlPlanes");
    assert!(refused.to_string().contains("add a control plane first"), "{refused}");
    // Allowed by the operation; four control planes leave three; a worker leaves three.
    let mut allowed = removal(Fixture::cluster(3, 2), Some("cp-2"));
    allowed.op.spec.allow_two_control_planes = true;
    assert_eq!(allowed.decide().start, names(&["cp-2"]));
    assert_eq!(removal(Fixture::cluster(4, 0), Some("cp-2")).decide().start, names(&["cp-2"]));
    assert_eq!(removal(Fixture::cluster(3, 2), Some("worker-1")).decide().start, names(&["worker-1"]));
    // A removal already under way is finished, never refused half way.
    let d = removal(Fixture::cluster(3, 2), Some("cp-2")).in_progress("cp-2", false).decide();
    assert_eq!(d.advance, names(&["cp-2"]));
}

fn blocker(node: &str) -> crate::preflight::Blocker {
    crate::preflight::Blocker::BudgetAtZero {
        namespace: "billing".into(),
        name: format!("pdb-{node}"),
        healthy: 1,
        desired: 1,
    }
}

fn checked(entries: &[(&str, bool)]) -> PreflightVerdict {
    PreflightVerdict::Checked(
        entries
            .iter()
            .map(|(m, blocked)| ((*m).to_owned(), if *blocked { vec![blocker(m)] } else { vec![] }))
            .collect(),
    )
}

#[test]
fn preflight_not_gathered_names_the_machines_it_would_start_and_starts_none() {
    let mut f = Fixture::cluster(0, 5);
    f.op.spec.max_unavailable = 2.into();
    f.preflight = PreflightVerdict::NotChecked;
    let d = f.decide();
    assert!(d.start.is_empty(), "{d:?}");
    assert_eq!(d.check_preflight, names(&["worker-1", "worker-2"]), "no more than could start");
    assert!(matches!(d.phase, Phase::Waiting(WaitReason::PreflightBlocked { .. })), "never Completed: {:?}", d.phase);
    assert_eq!(d.recheck_at, Some(f.now));
}

#[test]
fn preflight_enforce_skips_a_blocked_worker_and_names_the_next_to_check() {
    let mut f = Fixture::cluster(0, 5);
    f.op.spec.max_unavailable = 2.into();
    f.preflight = checked(&[("worker-1", true), ("worker-2", false)]);
    let d = f.decide();
    assert_eq!(d.start, names(&["worker-2"]));
    assert_eq!(d.check_preflight, names(&["worker-3"]), "the blocked one's slot goes to the next in line");
    assert_eq!(d.preflight_blocked, vec![("worker-1".to_owned(), vec![blocker("worker-1")])]);
    assert_eq!(d.phase, Phase::Progressing);
    // Everything left is blocked: the operation waits, naming each machine's blockers.
    let f = Fixture { preflight: checked(&[("worker-1", true)]), ..Fixture::cluster(0, 1) };
    let d = f.decide();
    assert!(d.start.is_empty());
    assert_eq!(
        d.phase.to_string(),
        "waiting: preflight blocks worker-1: PDB billing/pdb-worker-1 allows 0 disruptions (healthy 1/1)"
    );
    assert_eq!(d.phase.reason(), "PreflightBlocked");
}

/// Issue 29 item 6: with maxUnavailable 1 and every worker blocked, each round of a pass
/// names the next; the last round's decision asked for one more and so for a pass at
/// once, whose rounds found the same: a pass after a pass, the clock never moving under
/// the oracle. What the last round did not gather waits for the blocked ones' recheck.
#[test]
fn preflight_gathered_in_a_passs_last_round_asks_for_no_more_and_rechecks_later() {
    let blocked = [("worker-1", true), ("worker-2", true)];
    let f = Fixture { preflight: checked(&blocked), ..Fixture::cluster(0, 4) };
    let d = f.decide();
    assert_eq!(d.check_preflight, names(&["worker-3"]), "a round to come gathers the next one");
    assert_eq!(d.recheck_at, Some(f.now));

    let PreflightVerdict::Checked(found) = checked(&blocked) else { unreachable!() };
    let f = Fixture { preflight: PreflightVerdict::Last(found), ..Fixture::cluster(0, 4) };
    let d = f.decide();
    assert!(d.start.is_empty() && d.check_preflight.is_empty(), "{d:?}");
    assert_eq!(d.preflight_blocked.len(), 2);
    assert_eq!(d.phase.reason(), "PreflightBlocked");
    assert_eq!(d.recheck_at, Some(f.now.saturating_add(f.config.preflight_recheck)));
}

#[test]
fn preflight_warn_starts_a_blocked_machine_with_a_warning() {
    let mut f = Fixture::cluster(0, 1);
    f.op.spec.preflight = Some(crate::operation::PreflightMode::Warn);
    f.preflight = checked(&[("worker-1", true)]);
    let d = f.decide();
    assert_eq!(d.start, names(&["worker-1"]));
    assert_eq!(d.warnings.len(), 1);
    assert_eq!(d.warnings[0].reason(), "PreflightIgnored");
    assert!(d.warnings[0].to_string().contains("pdb-worker-1"), "{}", d.warnings[0]);
}

#[test]
fn preflight_never_stops_a_machine_already_started_and_holds_a_control_plane() {
    let f =
        Fixture { preflight: checked(&[("worker-1", true)]), ..Fixture::cluster(0, 2).in_progress("worker-1", false) };
    let d = f.decide();
    assert_eq!(d.advance, names(&["worker-1"]), "started before: advanced whatever the gate says");
    assert!(d.stop.is_empty());
    // The next control plane waits on its blockers; no worker starts before the control planes.
    let f = Fixture { preflight: checked(&[("cp-1", true)]), ..Fixture::cluster(1, 2) };
    let d = f.decide();
    assert!(d.start.is_empty());
    assert!(
        matches!(d.phase, Phase::Waiting(WaitReason::PreflightBlocked { ref machines }) if machines[0].0 == "cp-1")
    );
    // With the etcd gate not gathered either, both are asked for in one round.
    let f = Fixture { preflight: PreflightVerdict::NotChecked, ..Fixture::cluster(1, 0).etcd(EtcdVerdict::NotChecked) };
    let d = f.decide();
    assert!(d.check_etcd);
    assert_eq!(d.check_preflight, names(&["cp-1"]));
}

// Machines the status records but the pass does not see (a restarted controller whose
// cache of machines has not listed yet looked exactly like an empty cluster, and an
// operation was reported Completed with six machines never upgraded).

fn recorded(state: crate::status::RecordState, names: &[&str]) -> OperationStatus {
    let record = crate::status::MachineRecord {
        state,
        reason: "UpgradeCalled".into(),
        message: "installer refused".into(),
        recheck_at: None,
    };
    OperationStatus {
        phase: Phase::Progressing,
        observed_generation: Some(1),
        machines: names.iter().map(|n| ((*n).to_owned(), record.clone())).collect(),
        ..OperationStatus::default()
    }
}

#[test]
fn machines_recorded_under_way_but_not_observed_hold_completion_and_every_start() {
    use crate::status::RecordState;
    // The cache is empty: nothing observed, two machines recorded under way.
    let mut f = Fixture::cluster(3, 5).status(recorded(RecordState::InProgress, &["cp-1", "worker-1"]));
    f.machines.clear();
    let d = f.decide();
    let unobserved = WaitReason::MachinesUnobserved { machines: names(&["cp-1", "worker-1"]) };
    assert_eq!(d.phase, Phase::Waiting(unobserved));
    assert_ne!(d.lock, LockAction::Release);
    // Only some machines observed: the ones seen advance, none starts, none completes.
    let mut f = Fixture::cluster(3, 5).status(recorded(RecordState::InProgress, &["cp-1", "worker-1"]));
    f.machines.retain(|m| m.name != "cp-1");
    let f = f.in_progress("worker-1", true);
    let d = f.decide();
    assert_eq!((d.advance.clone(), d.start.clone()), (names(&["worker-1"]), names(&[])));
    assert_eq!(d.phase, Phase::Progressing);
    // Every machine seen: the usual rollout.
    let f = Fixture::cluster(3, 5).status(recorded(RecordState::InProgress, &["cp-1"])).in_progress("cp-1", true);
    assert_eq!(f.decide().advance, names(&["cp-1"]));
    // A converged record of a machine gone is no reason to wait.
    let mut f = Fixture::cluster(1, 1).status(recorded(RecordState::Converged, &["worker-9"]));
    f = f.converged(&["cp-1", "worker-1"]);
    assert_eq!(f.decide().phase, Phase::Completed);
}

#[test]
fn a_failure_recorded_for_a_machine_not_observed_pauses() {
    use crate::status::RecordState;
    let mut f = Fixture::cluster(1, 2).status(recorded(RecordState::Failed, &["worker-2"]));
    f.machines.retain(|m| m.name != "worker-2");
    let f = f.converged(&["cp-1", "worker-1"]);
    let failed = vec![FailedMachine { name: "worker-2".into(), reason: "installer refused".into() }];
    assert_eq!(f.decide().phase, Phase::Paused(PauseReason::MachineFailed { machines: failed }));
    // Resumed, it still is not seen: waited for, not completed.
    let d = f.resume("t").decide();
    assert_eq!(d.phase, Phase::Waiting(WaitReason::MachinesUnobserved { machines: names(&["worker-2"]) }));
}

#[test]
fn a_removal_whose_machine_is_not_observed_stands_where_its_record_says() {
    use crate::status::RecordState;
    let gone = |state| {
        let mut f = removal(Fixture::cluster(3, 2), Some("worker-2")).status(recorded(state, &["worker-2"]));
        f.machines.retain(|m| m.name != "worker-2");
        f.decide()
    };
    let d = gone(RecordState::InProgress);
    assert_eq!(d.phase, Phase::Waiting(WaitReason::MachinesUnobserved { machines: names(&["worker-2"]) }));
    assert!(d.start.is_empty() && d.lock != LockAction::Release);
    assert_eq!(gone(RecordState::Converged).phase, Phase::Completed);
    assert!(matches!(gone(RecordState::Failed).phase, Phase::Paused(_)));
}

// The etcd snapshot before the first control plane (issue 14).

fn snapshot_required(mut f: Fixture) -> Fixture {
    f.op.spec.etcd_snapshot = None;
    f
}

fn snapshot_taken() -> crate::etcd::snapshot::SnapshotState {
    crate::etcd::snapshot::SnapshotState::Taken(crate::etcd::snapshot::SnapshotRecord {
        location: "/snapshots/prod.db".into(),
        size: 4096,
        sha256: "00".repeat(32),
        node: "cp-2".into(),
        taken_at: at(1005),
    })
}

#[test]
fn a_required_snapshot_is_asked_for_before_the_first_control_plane_starts() {
    let d = snapshot_required(Fixture::cluster(3, 2)).decide();
    assert_eq!(d.take_etcd_snapshot.as_deref(), Some("cp-1"));
    assert!(d.start.is_empty(), "{:?}", d.start);
    assert_eq!(d.phase, Phase::Waiting(WaitReason::EtcdSnapshotPending));
    assert_eq!(d.recheck_at, Some(at(1010)), "decided again at once, once it is taken");
    // Only once the etcd gate passed: the snapshot comes from a healthy cluster.
    let d = snapshot_required(Fixture::cluster(3, 2)).etcd(EtcdVerdict::NotChecked).decide();
    assert!(d.check_etcd && d.take_etcd_snapshot.is_none());
    let unhealthy = EtcdVerdict::Unhealthy { reason: "learner".into() };
    assert!(snapshot_required(Fixture::cluster(3, 2)).etcd(unhealthy).decide().take_etcd_snapshot.is_none());
    // Recorded: the control plane starts, and no second snapshot is asked for.
    let mut f = snapshot_required(Fixture::cluster(3, 2));
    f.op.status.etcd_snapshot = Some(snapshot_taken());
    let d = f.decide();
    assert_eq!((d.start.clone(), d.take_etcd_snapshot.clone()), (names(&["cp-1"]), None));
    assert_eq!(d.authority.get("cp-1"), Some(&CallAuthority::Granted));
    // `Skip`: none asked for.
    let d = Fixture::cluster(3, 2).decide();
    assert_eq!((d.start.clone(), d.take_etcd_snapshot.clone()), (names(&["cp-1"]), None));
}

#[test]
fn no_snapshot_is_asked_for_when_no_control_plane_is_left_to_start() {
    let f = snapshot_required(Fixture::cluster(3, 2)).all_control_planes_converged();
    let d = f.decide();
    assert_eq!(d.take_etcd_snapshot, None);
    assert_eq!(d.start, names(&["worker-1"]));
    // A worker-only cluster never needs one.
    assert_eq!(snapshot_required(Fixture::cluster(0, 2)).decide().take_etcd_snapshot, None);
}

/// Issue 34, item 3 (decision 0009): a control plane already on the target makes no
/// call, so no snapshot is taken for it; the first one that needs a call still waits for
/// one.
#[test]
fn a_control_plane_already_on_the_target_takes_no_snapshot() {
    let target = |f: Fixture| {
        let image = format!("Talos ({})", f.op.spec.target_version);
        f.with("cp-1", |m| m.os_image = Some(image.clone()))
    };
    let d = target(snapshot_required(Fixture::cluster(3, 2))).decide();
    assert_eq!((d.start.clone(), d.take_etcd_snapshot.clone()), (names(&["cp-1"]), None));
    assert_eq!(d.authority.get("cp-1"), Some(&CallAuthority::Granted));
    // cp-1 converged, cp-2 on the old version: its snapshot is asked for.
    let d = target(snapshot_required(Fixture::cluster(3, 2))).converged(&["cp-1"]).decide();
    assert_eq!(d.take_etcd_snapshot.as_deref(), Some("cp-2"));
}

/// Issue 53 item 6: a Kubernetes upgrade whose control planes already run the target
/// took a snapshot (and paused when that failed): it changes nothing, so it takes none;
/// the first control plane that changes still waits for one.
#[test]
fn a_kubernetes_upgrade_already_on_its_target_takes_no_snapshot() {
    let on = |f: Fixture, machines: &[&str]| {
        let mut f = snapshot_required(f.kubernetes(KubernetesStage::ControlPlane, Vec::new()));
        if let Some(k) = f.k8s.as_mut() {
            k.on_target = machines.iter().map(|m| (*m).to_owned()).collect();
        }
        f
    };
    let d = on(Fixture::cluster(3, 2), &["cp-1", "cp-2", "cp-3"]).decide();
    assert_eq!((d.start.clone(), d.take_etcd_snapshot.clone()), (names(&["cp-1"]), None));
    assert_eq!(d.authority.get("cp-1"), Some(&CallAuthority::Granted));
    // Only cp-1 on the target: once it is through, cp-2's snapshot is asked for.
    let d = on(Fixture::cluster(3, 2), &["cp-1"]).converged(&["cp-1"]).decide();
    assert_eq!(d.take_etcd_snapshot.as_deref(), Some("cp-2"));
    // Not observed on the target: a snapshot first, as before.
    let d = on(Fixture::cluster(3, 2), &[]).decide();
    assert_eq!(d.take_etcd_snapshot.as_deref(), Some("cp-1"));
}

#[test]
fn a_control_plane_call_without_the_required_snapshot_is_denied() {
    // Started earlier (say while the spec said Skip), not past its call: no call until a
    // snapshot is recorded.
    let d = snapshot_required(Fixture::cluster(3, 2)).in_progress("cp-1", false).decide();
    assert_eq!(d.advance, names(&["cp-1"]));
    assert_eq!(d.authority.get("cp-1"), Some(&CallAuthority::Denied(CallDenied::EtcdSnapshotMissing)));
    // Workers are not held to it.
    let d = snapshot_required(Fixture::cluster(3, 2)).all_control_planes_converged().decide();
    assert_eq!(d.authority.get("worker-1"), Some(&CallAuthority::Granted));
}

#[test]
fn a_failed_snapshot_pauses_until_resumed_and_a_resume_takes_it_again() {
    let mut f = snapshot_required(Fixture::cluster(3, 2));
    let failed = crate::etcd::snapshot::SnapshotState::Failed { reason: "store: disk full".into(), at: at(1000) };
    f.op.status.etcd_snapshot = Some(failed);
    let d = f.decide();
    assert_eq!(d.phase, Phase::Paused(PauseReason::EtcdSnapshotFailed { reason: "store: disk full".into() }));
    assert!(d.start.is_empty() && d.take_etcd_snapshot.is_none());
    assert_eq!(d.phase.reason(), "EtcdSnapshotFailed");
    assert!(d.phase.to_string().contains("disk full"), "{}", d.phase);
    let d = f.resume("t").decide();
    assert_eq!(d.acknowledge_resume.as_deref(), Some("t"));
    assert_eq!(d.take_etcd_snapshot.as_deref(), Some("cp-1"));
}

// Pre-pulls: the machines expected to start next.

#[test]
fn the_next_machines_to_start_are_named_for_a_pre_pull() {
    let d = Fixture::cluster(3, 4).all_control_planes_converged().max_unavailable(2).decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2"]));
    assert_eq!(d.prepull, names(&["worker-3", "worker-4"]), "the next two, never one started");
    let going = Fixture::cluster(3, 4).in_progress("cp-1", true).decide();
    assert_eq!(going.prepull, names(&["cp-2"]), "one ahead at maxUnavailable 1");
}

#[test]
fn no_pre_pull_for_a_machine_held_under_way_failed_or_not_ready() {
    let d = Fixture::cluster(3, 4)
        .all_control_planes_converged()
        .in_progress("worker-1", true)
        .held("worker-2")
        .not_ready("worker-3")
        .max_unavailable(3)
        .decide();
    assert!(!d.prepull.iter().any(|m| ["worker-1", "worker-2", "worker-3"].contains(&m.as_str())), "{:?}", d.prepull);
    let paused = Fixture::cluster(3, 3).all_control_planes_converged().failed("worker-1", "x").decide();
    assert!(paused.prepull.is_empty(), "a paused operation pulls nothing ahead");
}

#[test]
fn one_etcd_gate_verdict_authorises_one_control_plane() {
    // Found by the review: cp-1 and cp-2, both installed and drained after a race, waited on
    // the gate; the one verdict of a pass authorised both, and they rebooted 0.1 s apart.
    let past = MachineProgress::InProgress { past_upgrade_call: true };
    let f = Fixture::cluster(3, 0).with("cp-1", |m| m.progress = past.clone()).with("cp-2", |m| m.progress = past);
    let d = f.decide();
    let grants: Vec<&str> =
        ["cp-1", "cp-2"].into_iter().filter(|m| d.finish_authority.get(*m) == Some(&CallAuthority::Granted)).collect();
    assert_eq!(grants, vec!["cp-1"], "{:?}", d.finish_authority);
    let spent = CallAuthority::Denied(CallDenied::GateSpent { on: "cp-1".into() });
    assert_eq!(d.finish_authority.get("cp-2"), Some(&spent));
    assert_eq!(d.authority.get("cp-2"), Some(&spent));
    // Workers are not counted against it.
    let w = Fixture::cluster(1, 2).max_unavailable(2).decide();
    assert!(w.start.iter().all(|m| w.authority.get(m) == Some(&CallAuthority::Granted)), "{w:?}");
}

// A person's pause (issue 55 item 3, decision 0017): as a failure's pause, nothing new
// begins; past its call a machine finishes; a failure is said first.

#[test]
fn a_persons_pause_starts_nothing_stops_what_is_not_past_its_call_and_finishes_the_rest() {
    let f = Fixture::cluster(1, 4)
        .all_control_planes_converged()
        .max_unavailable(3)
        .in_progress("worker-1", true)
        .in_progress("worker-2", false)
        .pause_requested("alice: a change freeze");
    let d = f.clone().decide();
    assert_eq!(d.phase, Phase::Paused(PauseReason::Requested { by: "alice: a change freeze".into() }));
    assert_eq!(d.phase.reason(), "PauseRequested");
    assert!(d.start.is_empty(), "nothing new begins: {:?}", d.start);
    assert_eq!(d.advance, names(&["worker-1"]), "past its call: finished");
    assert_eq!(d.stop, names(&["worker-2"]), "not past its call: stopped");
    assert!(d.authority.values().all(|a| *a == CallAuthority::Denied(CallDenied::Paused)), "{:?}", d.authority);
    assert_ne!(d.lock, LockAction::Release, "the lock is kept");
    assert!(d.phase.message_for("upgrade").contains("ichor.dev/pause-"), "how to lift it");
    // Lifted: the rollout goes on.
    let mut lifted = f.clone();
    lifted.op.pause_requested = None;
    assert!(lifted.decide().start.contains(&"worker-3".to_owned()), "{:?}", lifted.decide().start);
    // A failure is said first, and a resume does not lift the person's pause.
    let failed = f.clone().failed("worker-3", "AbFallback").decide();
    assert!(matches!(failed.phase, Phase::Paused(PauseReason::MachineFailed { .. })), "{:?}", failed.phase);
    let resumed = f.failed("worker-3", "AbFallback").resume("t").decide();
    assert!(matches!(resumed.phase, Phase::Paused(PauseReason::Requested { .. })), "{:?}", resumed.phase);
    assert!(resumed.start.is_empty());
}

#[test]
fn a_persons_pause_before_a_removal_starts_does_not_start_it() {
    let d = removal(Fixture::cluster(3, 2), Some("worker-2")).pause_requested("bob").decide();
    assert!(d.start.is_empty() && d.advance.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Paused(PauseReason::Requested { by: "bob".into() }));
    let under_way =
        removal(Fixture::cluster(3, 2), Some("worker-2")).in_progress("worker-2", false).pause_requested("bob");
    let d = under_way.decide();
    assert_eq!(d.advance, names(&["worker-2"]), "observed");
    assert_eq!(d.phase, Phase::Paused(PauseReason::Requested { by: "bob".into() }));
}

// Kubernetes upgrades (issue 32): the same engine, in two stages.

#[test]
fn a_kubernetes_upgrade_starts_one_control_plane_and_no_worker_in_its_first_stage() {
    let f = Fixture::cluster(3, 4).max_unavailable(3).kubernetes(KubernetesStage::ControlPlane, Vec::new());
    let d = f.decide();
    assert_eq!(d.start, names(&["cp-1"]));
    assert_eq!(authority(&d, "cp-1"), CallAuthority::Granted, "no preflight gate for a Kubernetes upgrade");
    assert!(d.prepull.is_empty(), "there is no installer to pull");
    // Every control plane through its first stage: still no worker, and not completed.
    let d = f.clone().all_control_planes_converged().decide();
    assert!(d.start.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Progressing);
    assert_ne!(d.lock, LockAction::Release);
}

#[test]
fn a_kubernetes_upgrades_kubelets_go_control_planes_first_then_max_unavailable_workers() {
    let f = Fixture::cluster(3, 4).max_unavailable(3).kubernetes(KubernetesStage::Kubelets, Vec::new());
    assert_eq!(f.decide().start, names(&["cp-1"]));
    let d = f.clone().all_control_planes_converged().decide();
    assert_eq!(d.start, names(&["worker-1", "worker-2", "worker-3"]));
    let through = f.all_control_planes_converged().converged(&["worker-1", "worker-2", "worker-3", "worker-4"]);
    // Every machine through: the bootstrap manifests go last, then it completes.
    let d = through.clone().decide();
    assert!(d.apply_manifests && d.start.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Progressing);
    assert_ne!(d.lock, LockAction::Release);
    let at = Timestamp::from_unix_millis(0);
    let workloads = vec!["DaemonSet kube-system/kube-proxy".to_owned()];
    // Applied, rolling out: looked at again, not completed.
    let rolling = ManifestsState::Applied {
        target: "1.35.0".into(),
        objects: 3,
        at,
        workloads: workloads.clone(),
        rolled_out: false,
        progress: 0,
        progress_at: None,
    };
    let d = through.clone().status(OperationStatus { manifests: Some(rolling), ..OperationStatus::default() }).decide();
    assert_eq!(d.phase, Phase::Progressing);
    assert!(!d.apply_manifests && d.record_manifests.is_none() && d.recheck_at.is_some(), "{d:?}");
    let applied = ManifestsState::Applied {
        target: "1.35.0".into(),
        objects: 3,
        at,
        workloads,
        rolled_out: true,
        progress: 0,
        progress_at: None,
    };
    let d = through.status(OperationStatus { manifests: Some(applied), ..OperationStatus::default() }).decide();
    assert_eq!(d.phase, Phase::Completed);
    assert!(!d.apply_manifests);
    assert_eq!(d.lock, LockAction::Release);
}

#[test]
fn a_kubernetes_upgrades_manifests_refused_pause_it_until_a_resume_applies_them_again() {
    let failed = ManifestsState::Failed {
        target: "1.35.0".into(),
        reason: "DaemonSet kube-system/kube-proxy: forbidden".into(),
        at: Timestamp::from_unix_millis(0),
    };
    let f = Fixture::cluster(1, 1)
        .kubernetes(KubernetesStage::Kubelets, Vec::new())
        .converged(&["cp-1", "worker-1"])
        .status(OperationStatus { manifests: Some(failed), ..OperationStatus::default() });
    let d = f.clone().decide();
    let Phase::Paused(PauseReason::ManifestsFailed { reason }) = &d.phase else { panic!("{:?}", d.phase) };
    assert!(reason.contains("kube-proxy: forbidden"));
    assert!(!d.apply_manifests);
    assert!(d.phase.to_string().contains("bootstrap manifests were not applied"), "{}", d.phase);
    let d = f.resume("again").decide();
    assert!(d.apply_manifests, "{d:?}");
    assert_eq!(d.acknowledge_resume.as_deref(), Some("again"));
}

#[test]
fn a_kubernetes_upgrade_is_refused_at_planning_naming_each_cause_and_takes_no_lock() {
    let problems = vec![
        KubernetesPlanProblem::SkipsMinor {
            components: vec!["cp-1/kube-apiserver".into()],
            current: "1.33.4".into(),
            target: "1.35.0".into(),
            next: "1.34".into(),
        },
        KubernetesPlanProblem::RemovedApisInUse {
            apis: vec![crate::kubernetes::plan::DeprecatedApiUse {
                group: "flowcontrol.apiserver.k8s.io".into(),
                version: "v1beta3".into(),
                resource: "flowschemas".into(),
                removed_release: "1.35".into(),
                count: 2,
                seen_as: crate::kubernetes::plan::ApiUseSeenAs::Requests,
            }],
            target: "1.35.0".into(),
        },
    ];
    let d = Fixture::cluster(3, 2).no_lease().kubernetes(KubernetesStage::ControlPlane, problems).decide();
    let Phase::Refused(refusal) = &d.phase else { panic!("{:?}", d.phase) };
    assert_eq!(refusal.reason(), "KubernetesSkipsMinor");
    let text = refusal.to_string();
    assert!(
        text.contains("skips a minor") && text.contains("flowschemas.flowcontrol.apiserver.k8s.io/v1beta3 (2 uses"),
        "{text}"
    );
    assert_eq!(d.lock, LockAction::Leave);
    assert!(d.start.is_empty());
}

#[test]
fn a_kubernetes_upgrade_not_observed_waits_and_grants_no_call() {
    let mut f = Fixture::cluster(3, 2).kubernetes(KubernetesStage::ControlPlane, Vec::new()).in_progress("cp-1", true);
    f.k8s = None;
    let d = f.decide();
    assert_eq!(d.phase, Phase::Waiting(WaitReason::KubernetesNotObserved));
    assert_eq!(d.advance, names(&["cp-1"]), "a machine past its apply is still observed");
    assert!(matches!(authority(&d, "cp-1"), CallAuthority::Denied(CallDenied::Refused)));
}

#[test]
fn a_kubernetes_upgrade_pauses_on_a_failed_control_plane_and_starts_no_other() {
    let d = Fixture::cluster(3, 2)
        .kubernetes(KubernetesStage::ControlPlane, Vec::new())
        .failed("cp-1", "kube-apiserver crash-loops on v1.35.0")
        .decide();
    assert!(matches!(d.phase, Phase::Paused(PauseReason::MachineFailed { .. })));
    assert!(d.start.is_empty() && d.advance.is_empty());
}

// Issue 53 item 2: a Ready Node says nothing of its static pods. No control plane changes
// while another's kube-apiserver, kube-controller-manager or kube-scheduler is not Ready.

#[test]
fn no_control_plane_starts_while_another_control_planes_api_server_is_not_ready_on_a_ready_node() {
    let d =
        Fixture::cluster(3, 2).converged(&["cp-1"]).components_not_ready("cp-3", &[Component::KubeApiserver]).decide();
    assert!(d.start.is_empty(), "{:?}", d.start);
    assert_eq!(
        d.phase,
        Phase::Waiting(WaitReason::ControlPlaneComponentsNotReady { components: names(&["cp-3/kube-apiserver"]) })
    );
    assert_eq!(d.phase.reason(), "ControlPlaneComponentNotReady");
    // Its own components do not hold it back: cp-2 is next, and its own scheduler being
    // down is what its change may fix.
    let own =
        Fixture::cluster(3, 2).converged(&["cp-1"]).components_not_ready("cp-2", &[Component::KubeScheduler]).decide();
    assert_eq!(own.start, names(&["cp-2"]));
}

#[test]
fn the_components_are_gathered_with_the_etcd_gate_and_never_assumed() {
    let mut f = Fixture::cluster(3, 0).converged(&["cp-1"]);
    f.components = ComponentsVerdict::NotChecked;
    let d = f.decide();
    assert!(d.start.is_empty());
    assert!(d.check_etcd, "the components are gathered with the gate");
    assert_eq!(d.phase, Phase::Waiting(WaitReason::EtcdGateNotChecked));
    f.components = ComponentsVerdict::Unreadable { reason: "pods: forbidden".into() };
    let d = f.decide();
    assert!(d.start.is_empty());
    assert!(matches!(d.phase, Phase::Waiting(WaitReason::ControlPlaneComponentsNotReady { .. })), "{:?}", d.phase);
}

#[test]
fn a_control_plane_past_its_call_is_not_authorised_while_anothers_component_is_not_ready() {
    // A Kubernetes upgrade's control plane between two changes, or a Talos upgrade's
    // lifecycle reboot: every next disruptive step asks again.
    let f = Fixture::cluster(3, 0).in_progress("cp-1", true);
    let d = f.clone().components_not_ready("cp-2", &[Component::KubeControllerManager]).decide();
    let denied = CallAuthority::Denied(CallDenied::ControlPlaneComponentsNotReady {
        components: names(&["cp-2/kube-controller-manager"]),
    });
    assert_eq!(authority(&d, "cp-1"), denied);
    assert_eq!(finish(&d, "cp-1"), denied);
    let mut unchecked = f.clone();
    unchecked.components = ComponentsVerdict::NotChecked;
    assert_eq!(authority(&unchecked.decide(), "cp-1"), CallAuthority::NeedsEtcdGate);
    assert_eq!(authority(&f.decide(), "cp-1"), CallAuthority::Granted);
    // Workers are not the control planes' concern.
    let workers = Fixture::cluster(3, 1)
        .all_control_planes_converged()
        .components_not_ready("cp-2", &[Component::KubeApiserver])
        .decide();
    assert_eq!(workers.start, names(&["worker-1"]));
    assert_eq!(authority(&workers, "worker-1"), CallAuthority::Granted);
}

// Issue 53 item 1: a started operation's target never changes, whatever wrote it.

#[test]
fn a_started_operation_records_its_target_and_refuses_a_changed_one_winding_down() {
    let f = Fixture::cluster(3, 2).kubernetes(KubernetesStage::ControlPlane, Vec::new());
    let d = f.decide();
    assert_eq!(d.start, names(&["cp-1"]));
    assert_eq!(d.started_target.as_deref(), Some("1.35.0"));
    let status = crate::record::next_status(&OperationStatus::default(), 1, &d, &[]);
    assert_eq!(status.started_target.as_deref(), Some("1.35.0"));
    // Recorded once: a later pass does not write it again.
    let later = f.clone().status(status.clone()).in_progress("cp-1", true).decide();
    assert_eq!(later.started_target, None);
    // The same target written another way is the same target.
    let same = f.clone().status(status.clone()).in_progress("cp-1", true).target("v1.35.0").decide();
    assert_eq!(same.phase, Phase::Progressing);
    // Edited under way: refused, nothing new starts, the machine past its apply is still
    // observed, and no call is authorised.
    let edited = f.clone().status(status.clone()).in_progress("cp-1", true).target("1.36.0");
    let d = edited.decide();
    assert_eq!(d.phase, Phase::Refused(Refusal::TargetChanged { started: "1.35.0".into(), now: "1.36.0".into() }));
    assert_eq!(d.phase.reason(), "TargetChanged");
    assert!(d.start.is_empty());
    assert_eq!(d.advance, names(&["cp-1"]));
    assert_eq!(authority(&d, "cp-1"), CallAuthority::Denied(CallDenied::Refused));
    assert!(refusal_of(&d).to_string().contains("set it back to 1.35.0"), "{}", refusal_of(&d));
    // Nothing under way: the lock is released, the records kept.
    let idle = f.clone().status(status.clone()).converged(&["cp-1"]).target("1.36.0").decide();
    assert_eq!(idle.lock, LockAction::Release);
    // Set back: it goes on.
    let back = f.status(status).converged(&["cp-1"]).decide();
    assert_eq!(back.start, names(&["cp-2"]));
}

#[test]
fn a_talos_upgrades_target_is_recorded_and_kept_too() {
    let f = Fixture::cluster(3, 0);
    let d = f.decide();
    let status = crate::record::next_status(&OperationStatus::default(), 1, &d, &[]);
    assert_eq!(status.started_target.as_deref(), Some("v1.14.4"));
    let edited = f.status(status).in_progress("cp-1", true).target("v1.15.0");
    let mut edited = edited;
    edited.release = "v1.15.0".into();
    assert!(matches!(edited.decide().phase, Phase::Refused(Refusal::TargetChanged { .. })));
}

// Issue 53 item 5: a Kubernetes upgrade whose first stage is left with a held control plane
// said Progressing for ever; it waits, naming the hold, as a Talos upgrade does.

#[test]
fn a_kubernetes_upgrade_blocked_by_a_held_control_plane_waits_naming_it() {
    let d = Fixture::cluster(3, 2)
        .kubernetes(KubernetesStage::ControlPlane, Vec::new())
        .converged(&["cp-1", "cp-2"])
        .held("cp-3")
        .decide();
    assert!(d.start.is_empty());
    assert_eq!(d.phase, Phase::Waiting(WaitReason::Held { machines: names(&["cp-3"]) }));
    assert_eq!(d.phase.reason(), "Held");
    assert_ne!(d.lock, LockAction::Release, "the operation keeps its lock while it waits on the hold");
    // One still under way: it progresses.
    let going = Fixture::cluster(3, 2)
        .kubernetes(KubernetesStage::ControlPlane, Vec::new())
        .converged(&["cp-1"])
        .in_progress("cp-2", true)
        .held("cp-3")
        .decide();
    assert_eq!(going.phase, Phase::Progressing);
}

// Maintenance windows (issue 56 item 3): a start only inside a window, and only when the
// machine's p90 turn ends before the window does.

/// Windows from `spans` (seconds), a control plane's p90 of `cp` seconds, a worker's `w`.
fn windows(spans: &[(i64, i64)], cp: u64, w: u64) -> Windows {
    let spans = spans.iter().map(|(from, to)| crate::window::Span::new(at(*from), at(*to)));
    Windows::Calendar {
        calendar: crate::window::Calendar::new(spans, [], at(1_000_000)),
        p90: crate::window::TurnP90 { control_plane: Duration::from_secs(cp), worker: Duration::from_secs(w) },
    }
}

#[test]
fn outside_every_window_nothing_starts_and_the_engine_looks_again_when_one_opens() {
    let f = Fixture { windows: Some(windows(&[(5_000, 9_000)], 600, 300)), ..Fixture::cluster(3, 2) };
    let d = f.decide();
    assert!(d.start.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Waiting(WaitReason::OutsideWindow { next_start: Some(at(5_000)) }));
    assert!(d.recheck_at <= Some(at(5_000)), "{:?}", d.recheck_at);
    assert!(!d.check_etcd, "no gate is gathered for a start the windows refuse");
    // Inside it, the first control plane starts.
    let d = Fixture { now: at(5_000), ..f }.decide();
    assert_eq!(d.start, names(&["cp-1"]));
}

#[test]
fn a_control_plane_whose_p90_would_run_past_the_window_waits_for_the_next_it_fits_in() {
    let spans = [(0, 1_500), (3_000, 3_400), (8_000, 9_000)];
    let f = Fixture { windows: Some(windows(&spans, 600, 300)), ..Fixture::cluster(3, 2) };
    // At 1010 the turn would end at 1610, past 1500; the window at 3000 is too short.
    let d = f.decide();
    assert!(d.start.is_empty(), "{d:?}");
    let wait = WaitReason::WouldOverrunWindow {
        machine: "cp-1".into(),
        turn_p90_s: 600,
        closes: at(1_500),
        next_start: Some(at(8_000)),
    };
    assert_eq!(d.phase, Phase::Waiting(wait.clone()));
    assert!(Phase::Waiting(wait).to_string().contains("1970-01-01T02:13:20Z"), "names the next window's start");
    // Early enough, it starts.
    let d = Fixture { now: at(800), ..f }.decide();
    assert_eq!(d.start, names(&["cp-1"]));
}

#[test]
fn workers_are_admitted_on_their_own_p90_and_none_starts_once_one_is_refused() {
    let f = Fixture { windows: Some(windows(&[(0, 1_400)], 600, 300)), ..Fixture::cluster(0, 3).max_unavailable(3) };
    // A worker's 300 s from 1010 ends at 1310, inside: all three start.
    assert_eq!(f.clone().decide().start, names(&["worker-1", "worker-2", "worker-3"]));
    let d = Fixture { now: at(1_200), ..f }.decide();
    assert!(d.start.is_empty(), "{d:?}");
    assert!(
        matches!(&d.phase, Phase::Waiting(WaitReason::WouldOverrunWindow { machine, next_start: None, .. }) if machine == "worker-1"),
        "{:?}",
        d.phase
    );
}

#[test]
fn a_machine_under_way_is_never_stopped_by_a_window_s_end() {
    let f = Fixture { windows: Some(windows(&[(5_000, 9_000)], 600, 300)), ..Fixture::cluster(0, 2) };
    let d = f.in_progress("worker-1", true).decide();
    assert_eq!(d.advance, names(&["worker-1"]));
    assert!(d.stop.is_empty() && d.start.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Progressing);
}

#[test]
fn windows_that_do_not_read_refuse_an_upgrade_and_touch_nothing() {
    let bad = Windows::Invalid("windows[0].timeZone \"Mars/Olympus\" is not an IANA time zone".into());
    let f = Fixture { windows: Some(bad), ..Fixture::cluster(3, 2) };
    let d = f.clone().decide();
    assert!(d.start.is_empty() && d.advance.is_empty(), "{d:?}");
    assert!(
        matches!(&d.phase, Phase::Refused(Refusal::InvalidMaintenance { problem }) if problem.contains("Mars")),
        "{:?}",
        d.phase
    );
    assert_eq!(d.phase.reason(), "InvalidMaintenance");
    // Without the lock, it is not even taken.
    assert_eq!(f.no_lease().decide().lock, LockAction::Leave);
}

#[test]
fn a_removal_keeps_to_no_window() {
    let f = Fixture { windows: Some(windows(&[(5_000, 9_000)], 600, 300)), ..Fixture::cluster(4, 2) };
    let d = removal(f, Some("worker-1")).decide();
    assert_eq!(d.start, names(&["worker-1"]), "{d:?}");
}

// Health gates (issue 56 item 1): the shell reads them, the core decides.

fn gate_rule(name: &str, phase: crate::gate::GatePhase, settle: u64, timeout: u64) -> crate::gate::GateRule {
    crate::gate::GateRule {
        name: name.into(),
        phase,
        role: None,
        wave: None,
        settle: Duration::from_secs(settle),
        timeout: Some(Duration::from_secs(timeout)),
    }
}

fn gates(rules: Vec<crate::gate::GateRule>, reading: &crate::gate::GateReading) -> Gates {
    let readings = rules.iter().map(|r| (r.name.clone(), reading.clone())).collect();
    Gates::Rules { rules, readings }
}

fn degraded() -> crate::gate::GateReading {
    crate::gate::GateReading::Fails { object: "Volume longhorn-system/pvc-1".into(), value: "\"degraded\"".into() }
}

/// The fixture's status after `d`, as the caller records it.
fn after_pass(f: &Fixture, d: &Decision) -> OperationStatus {
    crate::record::next_status(&f.op.status, f.op.generation, d, &[])
}

#[test]
fn an_after_machine_gate_holds_the_next_start_until_it_has_held_for_its_settle() {
    use crate::gate::{GatePhase, GateReading};
    let rule = gate_rule("volumes-healthy", GatePhase::AfterMachine, 120, 3_600);
    let base = Fixture::cluster(0, 3).max_unavailable(1);
    // Nothing converged yet: the first worker starts, the gate is not asked.
    let f = Fixture { gates: Some(gates(vec![rule.clone()], &degraded())), ..base.clone() };
    assert_eq!(f.decide().start, names(&["worker-1"]));
    // worker-1 is through and a volume is degraded: nothing starts, the wait names it.
    let f = f.converged(&["worker-1"]);
    let d = f.decide();
    assert!(d.start.is_empty(), "{d:?}");
    let wait = WaitReason::GateNotPassing {
        gate: "volumes-healthy".into(),
        object: "Volume longhorn-system/pvc-1".into(),
        value: "\"degraded\"".into(),
        settles_at: None,
    };
    assert_eq!(d.phase, Phase::Waiting(wait.clone()));
    assert_eq!(d.phase.reason(), "GateNotPassing");
    assert!(Phase::Waiting(wait).to_string().contains("gate volumes-healthy does not hold on Volume"), "named");
    assert!(d.recheck_at <= Some(at(1_010 + 30)), "polled: {:?}", d.recheck_at);
    // It holds from 1100: it settles until 1220.
    let status = after_pass(&f, &d);
    let holds = Fixture {
        gates: Some(gates(vec![rule.clone()], &GateReading::Holds)),
        now: at(1_100),
        ..f.clone().status(status)
    };
    let d = holds.decide();
    assert!(d.start.is_empty(), "{d:?}");
    assert!(
        matches!(&d.phase, Phase::Waiting(WaitReason::GateNotPassing { settles_at: Some(t), .. }) if *t == at(1_220))
    );
    assert!(d.recheck_at <= Some(at(1_220)), "looked at again when it settles at the latest");
    let status = after_pass(&holds, &d);
    let settled = Fixture { now: at(1_220), ..holds.status(status) };
    assert_eq!(settled.decide().start, names(&["worker-2"]));
}

#[test]
fn without_gates_the_same_rollout_starts_the_next_machine_at_once() {
    let f = Fixture::cluster(0, 3).max_unavailable(1).converged(&["worker-1"]);
    assert_eq!(f.decide().start, names(&["worker-2"]));
}

#[test]
fn a_before_operation_gate_holds_only_the_first_start_and_an_after_operation_gate_the_completion() {
    use crate::gate::{GatePhase, GateReading};
    let before = gate_rule("change-freeze-lifted", GatePhase::BeforeOperation, 0, 3_600);
    let f = Fixture { gates: Some(gates(vec![before.clone()], &degraded())), ..Fixture::cluster(1, 1) };
    assert!(f.decide().start.is_empty());
    // Once started, it is not asked again.
    let started = OperationStatus { started_target: Some("v1.14.4".into()), ..OperationStatus::default() };
    let f = f.status(started).converged(&["cp-1"]);
    assert_eq!(f.decide().start, names(&["worker-1"]));

    let after = gate_rule("smoke-test", GatePhase::AfterOperation, 0, 3_600);
    let all = Fixture::cluster(1, 1).converged(&["cp-1", "worker-1"]);
    let f = Fixture { gates: Some(gates(vec![after.clone()], &degraded())), ..all.clone() };
    let d = f.decide();
    assert!(matches!(d.phase, Phase::Waiting(WaitReason::GateNotPassing { .. })), "{:?}", d.phase);
    assert_ne!(d.lock, LockAction::Release);
    let f = Fixture { gates: Some(gates(vec![after], &GateReading::Holds)), ..all };
    assert_eq!(f.decide().phase, Phase::Completed);
}

#[test]
fn a_gate_that_waits_past_its_timeout_pauses_until_a_resume_then_is_waited_on_afresh() {
    use crate::gate::GatePhase;
    let rule = gate_rule("volumes-healthy", GatePhase::BeforeMachine, 0, 600);
    let f = Fixture { gates: Some(gates(vec![rule], &degraded())), ..Fixture::cluster(0, 2) };
    let d = f.decide();
    assert_eq!(d.recheck_at, Some(at(1_010 + 30)));
    let f = f.clone().status(after_pass(&f, &d));
    assert_eq!(f.op.status.gates["volumes-healthy"].waiting_since, Some(at(1_010)));
    // At its bound, the wait is recorded timed out; the next pass pauses, naming it.
    let f = Fixture { now: at(1_610), ..f };
    let d = f.decide();
    assert!(d.start.is_empty());
    let f = f.clone().status(after_pass(&f, &d));
    let d = Fixture { now: at(1_611), ..f.clone() }.decide();
    let Phase::Paused(PauseReason::GateTimedOut { gate, last, timeout_s }) = &d.phase else { panic!("{:?}", d.phase) };
    assert_eq!((gate.as_str(), timeout_s), ("volumes-healthy", &600));
    assert!(last.contains("pvc-1"), "{last}");
    assert_eq!(d.phase.reason(), "GateTimedOut");
    // Still paused later, with the gate now holding: a pause waits for a person.
    let holding = Fixture {
        gates: Some(gates(
            vec![gate_rule("volumes-healthy", GatePhase::BeforeMachine, 0, 600)],
            &crate::gate::GateReading::Holds,
        )),
        now: at(2_000),
        ..f.clone()
    };
    assert!(matches!(holding.decide().phase, Phase::Paused(PauseReason::GateTimedOut { .. })));
    // A resume: the wait begins afresh.
    let d = Fixture { now: at(2_000), ..f.clone() }.resume("r1").decide();
    assert!(matches!(d.phase, Phase::Waiting(WaitReason::GateNotPassing { .. })), "{:?}", d.phase);
    assert_eq!(d.gates.as_ref().unwrap()["volumes-healthy"].waiting_since, Some(at(2_000)));
    assert_eq!(d.acknowledge_resume.as_deref(), Some("r1"));
}

#[test]
fn gates_scoped_to_a_role_leave_the_other_role_alone() {
    use crate::gate::GatePhase;
    let rule = crate::gate::GateRule {
        role: Some(MachineRole::Worker),
        ..gate_rule("workers-only", GatePhase::BeforeMachine, 0, 600)
    };
    let f = Fixture { gates: Some(gates(vec![rule], &degraded())), ..Fixture::cluster(1, 1) };
    assert_eq!(f.clone().decide().start, names(&["cp-1"]));
    let d = f.converged(&["cp-1"]).decide();
    assert!(d.start.is_empty() && matches!(d.phase, Phase::Waiting(WaitReason::GateNotPassing { .. })));
}

#[test]
fn gates_that_do_not_read_refuse_an_upgrade_and_touch_nothing() {
    let f = Fixture {
        gates: Some(Gates::Invalid("gates[0].expression: undeclared reference".into())),
        ..Fixture::cluster(3, 2)
    };
    let d = f.decide();
    assert!(d.start.is_empty() && d.advance.is_empty(), "{d:?}");
    assert!(matches!(&d.phase, Phase::Refused(Refusal::InvalidGate { problem }) if problem.contains("gates[0]")));
    assert_eq!(d.phase.reason(), "InvalidGate");
}
