//! Properties of the rollout engine over random clusters: 1 to 7 control planes, 0 to 300
//! workers, random order labels, holds, readiness, lock states, progress and failures.
//!
//! Safety, on any single decision: never a second control plane; never over
//! `maxUnavailable`; never a start while paused, without the lock, or for a held, NotReady
//! or finished machine; never a machine past its Upgrade call stopped.
//! Liveness: when every started machine eventually converges and holds are lifted, the
//! operation reaches `Completed`, and the safety properties hold at every step on the way.
//! A Kubernetes upgrade (kind `kubernetes`) keeps every one of them, and its stages: in the
//! control planes' stage no worker starts and it never completes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::etcd::snapshot::{SnapshotRecord, SnapshotState};
use ichor_upgrade_core::machine::kubernetes::KubernetesStage;
use ichor_upgrade_core::machine::vocabulary::MachineRole;
use ichor_upgrade_core::operation::{OperationSpec, Refusal, SnapshotMode};
use ichor_upgrade_core::rollout::{
    CallAuthority, ComponentsVerdict, Decision, EtcdVerdict, KubernetesInput, LeaseHolder, LockAction, MachineView,
    OperationView, RolloutConfig, RolloutInput, decide,
};
use ichor_upgrade_core::status::{MachineProgress, OperationStatus, Phase};
use ichor_upgrade_core::status::{MachineRecord, RecordState};
use proptest::prelude::*;

const US: &str = "ns/op/uid-us";
const OTHER: &str = "ns/other/uid-other";
const CASES: u32 = 2000;

#[derive(Debug, Clone, Copy)]
enum LockKind {
    Free,
    Ours { age_secs: u64 },
    OtherLive,
    OtherDeleted,
    OtherExpired,
}

#[derive(Debug, Clone)]
struct Scenario {
    machines: Vec<MachineView>,
    max_unavailable: i64,
    lock: LockKind,
    etcd: EtcdVerdict,
    resume_token: Option<String>,
    observed_resume: Option<String>,
    deleting: bool,
    kind: &'static str,
    snapshot: SnapshotKind,
    /// For a Kubernetes upgrade: its stage.
    stage: KubernetesStage,
}

/// Whether an operation of `kind` upgrades machines (the kinds the engine runs).
fn runs(kind: &str) -> bool {
    kind == "talos" || kind == "kubernetes"
}

/// A Kubernetes upgrade's input for `s` (`None` for another kind).
fn kubernetes_input(s: &Scenario) -> Option<KubernetesInput> {
    (s.kind == "kubernetes").then(|| KubernetesInput {
        stage: s.stage,
        problems: Vec::new(),
        rollouts: None,
        on_target: BTreeSet::new(),
    })
}

/// The spec's etcd snapshot mode and what the status records of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SnapshotKind {
    Skip,
    RequiredNone,
    RequiredTaken,
    RequiredFailed,
}

fn order_label() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => Just(None),
        3 => (-2i64..4).prop_map(|n| Some(n.to_string())),
        1 => Just(Some("not-a-number".to_owned())),
    ]
}

fn progress() -> impl Strategy<Value = MachineProgress> {
    prop_oneof![
        12 => Just(MachineProgress::Pending),
        4 => Just(MachineProgress::Converged),
        2 => Just(MachineProgress::InProgress { past_upgrade_call: false }),
        2 => Just(MachineProgress::InProgress { past_upgrade_call: true }),
        1 => Just(MachineProgress::Failed { reason: "A/B fallback".to_owned() }),
    ]
}

fn machine(role: MachineRole) -> impl Strategy<Value = (MachineRole, Option<String>, bool, bool, MachineProgress)> {
    (Just(role), order_label(), prop::bool::weighted(0.1), prop::bool::weighted(0.85), progress())
}

fn name_machines(raw: Vec<(MachineRole, Option<String>, bool, bool, MachineProgress)>) -> Vec<MachineView> {
    let mut counts = BTreeMap::new();
    let mut cp_in_progress = false;
    raw.into_iter()
        .map(|(role, order_label, held, node_ready, mut progress)| {
            let n = counts.entry(role).and_modify(|n| *n += 1).or_insert(1);
            let name = match role {
                MachineRole::ControlPlane => format!("cp-{n}"),
                MachineRole::Worker => format!("worker-{n}"),
            };
            // A valid state has at most one control plane in progress.
            if role == MachineRole::ControlPlane && matches!(progress, MachineProgress::InProgress { .. }) {
                if cp_in_progress {
                    progress = MachineProgress::Converged;
                }
                cp_in_progress = true;
            }
            MachineView {
                name,
                role,
                order_label,
                held,
                node_ready,
                os_image: Some("Talos (v1.14.3)".into()),
                progress,
                last: false,
            }
        })
        .collect()
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let cps = prop::collection::vec(machine(MachineRole::ControlPlane), 1..=7);
    let workers = prop::collection::vec(machine(MachineRole::Worker), 0..=300);
    let lock = prop_oneof![
        Just(LockKind::Free),
        (0u64..200).prop_map(|age_secs| LockKind::Ours { age_secs }),
        (0u64..200).prop_map(|age_secs| LockKind::Ours { age_secs }),
        Just(LockKind::OtherLive),
        Just(LockKind::OtherDeleted),
        Just(LockKind::OtherExpired),
    ];
    let etcd = prop_oneof![
        3 => Just(EtcdVerdict::Healthy),
        1 => Just(EtcdVerdict::Unhealthy { reason: "learner".into() }),
        1 => Just(EtcdVerdict::NotChecked),
    ];
    let resume = prop_oneof![
        Just((None, None)),
        Just((Some("t1".to_owned()), None)),
        Just((Some("t1".to_owned()), Some("t1".to_owned()))),
        Just((Some("t2".to_owned()), Some("t1".to_owned()))),
    ];
    let kind = prop_oneof![12 => Just("talos"), 6 => Just("kubernetes"), 1 => Just("ichor")];
    let snapshot = prop_oneof![
        Just(SnapshotKind::Skip),
        Just(SnapshotKind::RequiredNone),
        Just(SnapshotKind::RequiredTaken),
        Just(SnapshotKind::RequiredFailed),
    ];
    let stage = prop_oneof![Just(KubernetesStage::ControlPlane), Just(KubernetesStage::Kubelets)];
    (cps, workers, 1i64..=10, lock, etcd, resume, prop::bool::weighted(0.05), kind, snapshot, stage).prop_map(
        |(
            cps,
            workers,
            max_unavailable,
            lock,
            etcd,
            (resume_token, observed_resume),
            deleting,
            kind,
            snapshot,
            stage,
        )| {
            Scenario {
                machines: name_machines(cps.into_iter().chain(workers).collect()),
                max_unavailable,
                lock,
                etcd,
                resume_token,
                observed_resume,
                deleting,
                kind,
                snapshot,
                stage,
            }
        },
    )
}

const NOW: Timestamp = Timestamp::from_unix_secs(10_000);

fn lease(kind: LockKind) -> Option<LeaseHolder> {
    let holder = |identity: &str, renewed_at: Timestamp, holder_exists| LeaseHolder {
        identity: identity.to_owned(),
        renewed_at,
        lease_duration: Duration::from_secs(120),
        holder_exists,
    };
    match kind {
        LockKind::Free => None,
        LockKind::Ours { age_secs } => Some(holder(US, Timestamp::from_unix_secs(10_000 - age_secs as i64), true)),
        LockKind::OtherLive => Some(holder(OTHER, Timestamp::from_unix_secs(9_990), true)),
        LockKind::OtherDeleted => Some(holder(OTHER, Timestamp::from_unix_secs(9_990), false)),
        LockKind::OtherExpired => Some(holder(OTHER, Timestamp::from_unix_secs(9_000), true)),
    }
}

fn operation(s: &Scenario) -> OperationView {
    OperationView {
        identity: US.to_owned(),
        generation: 1,
        deleting: s.deleting,
        resume_token: s.resume_token.clone(),
        pause_requested: None,
        spec: OperationSpec {
            preflight: None,
            allow_two_control_planes: false,
            etcd_snapshot: Some(if s.snapshot == SnapshotKind::Skip {
                SnapshotMode::Skip
            } else {
                SnapshotMode::Required
            }),
            kind: s.kind.to_owned(),
            target_version: if s.kind == "kubernetes" { "1.35.0" } else { "v1.14.4" }.to_owned(),
            max_unavailable: s.max_unavailable.into(),
            machine: None,
        },
        status: OperationStatus {
            observed_resume: s.observed_resume.clone(),
            etcd_snapshot: match s.snapshot {
                SnapshotKind::Skip | SnapshotKind::RequiredNone => None,
                SnapshotKind::RequiredTaken => Some(taken_snapshot()),
                SnapshotKind::RequiredFailed => {
                    Some(SnapshotState::Failed { reason: "store unreachable".into(), at: NOW })
                }
            },
            ..OperationStatus::default()
        },
    }
}

fn taken_snapshot() -> SnapshotState {
    SnapshotState::Taken(SnapshotRecord {
        location: "/snapshots/s.db".into(),
        size: 1,
        sha256: "00".repeat(32),
        node: "cp-1".into(),
        taken_at: NOW,
    })
}

/// Checks every safety property of one decision against its input.
fn check_safety(
    machines: &[MachineView],
    op: &OperationView,
    lease: Option<&LeaseHolder>,
    etcd: &EtcdVerdict,
    d: &Decision,
) -> Result<(), TestCaseError> {
    let by_name: BTreeMap<&str, &MachineView> = machines.iter().map(|m| (m.name.as_str(), m)).collect();
    let ours = lease.is_some_and(|l| l.identity == op.identity);
    let resuming = op.resume_token.is_some() && op.resume_token != op.status.observed_resume;
    let failed = machines.iter().any(|m| matches!(m.progress, MachineProgress::Failed { .. }));

    if !ours {
        prop_assert!(d.start.is_empty() && d.advance.is_empty() && d.stop.is_empty(), "moved without the lock: {d:?}");
        prop_assert!(!matches!(d.lock, LockAction::Renew | LockAction::Keep | LockAction::Release));
    }
    if matches!(d.lock, LockAction::Acquire { .. }) {
        prop_assert!(d.start.is_empty() && d.advance.is_empty(), "started before the lock was confirmed");
    }
    if failed && !resuming {
        prop_assert!(d.start.is_empty(), "started while paused: {:?}", d.start);
        prop_assert!(matches!(d.phase, Phase::Paused(_)) || !ours || op.deleting || !runs(&op.spec.kind));
    }
    if op.deleting || !runs(&op.spec.kind) {
        prop_assert!(d.start.is_empty());
    }

    for name in &d.start {
        let m = by_name[name.as_str()];
        prop_assert!(!m.held, "started held {name}");
        prop_assert!(m.node_ready, "started NotReady {name}");
        let startable = match m.progress {
            MachineProgress::Pending => true,
            MachineProgress::Failed { .. } => resuming,
            MachineProgress::InProgress { .. } | MachineProgress::Converged => false,
        };
        prop_assert!(startable, "started {name} in {:?}", m.progress);
    }
    for name in &d.stop {
        prop_assert_eq!(
            &by_name[name.as_str()].progress,
            &MachineProgress::InProgress { past_upgrade_call: false },
            "stopped {} past its Upgrade call",
            name
        );
    }

    // Rule 3: every machine moved carries its authority, and a call is authorised only by
    // the rules, computed in this pass.
    let moved: Vec<&String> = d.start.iter().chain(&d.advance).collect();
    prop_assert_eq!(d.authority.len(), moved.len(), "every machine moved carries its authority");
    for name in moved {
        let m = by_name[name.as_str()];
        if d.authority.get(name) != Some(&CallAuthority::Granted) {
            continue;
        }
        prop_assert!(ours && !op.deleting && runs(&op.spec.kind), "{name}: a call authorised out of the operation");
        prop_assert!(!m.held, "{name}: a call authorised for a held machine");
        prop_assert!(!failed || resuming, "{name}: a call authorised while paused");
        if m.role == MachineRole::ControlPlane {
            prop_assert_eq!(etcd, &EtcdVerdict::Healthy, "{}: a call authorised without the gate", name);
            let others_ready = machines
                .iter()
                .filter(|o| o.role == MachineRole::ControlPlane && o.name != m.name)
                .all(|o| o.node_ready);
            prop_assert!(others_ready, "{name}: a call authorised with another control plane down");
        }
    }

    // A control plane is started, or its call authorised, only with the snapshot the spec
    // requires recorded; a failed snapshot pauses everything until resumed.
    let snapshot_ok = op.spec.etcd_snapshot == Some(SnapshotMode::Skip)
        || matches!(op.status.etcd_snapshot, Some(SnapshotState::Taken(_)));
    let cp_moved = d.start.iter().any(|n| by_name[n.as_str()].role == MachineRole::ControlPlane);
    let cp_granted = d
        .authority
        .iter()
        .any(|(n, a)| *a == CallAuthority::Granted && by_name[n.as_str()].role == MachineRole::ControlPlane);
    prop_assert!(snapshot_ok || !(cp_moved || cp_granted), "a control plane moved without its snapshot: {d:?}");
    if matches!(op.status.etcd_snapshot, Some(SnapshotState::Failed { .. })) && !resuming {
        prop_assert!(d.start.is_empty(), "started after a failed snapshot: {:?}", d.start);
    }
    if d.take_etcd_snapshot.is_some() {
        prop_assert!(!snapshot_ok && etcd == &EtcdVerdict::Healthy && ours, "a snapshot asked for out of turn");
    }

    // A Kubernetes upgrade's bootstrap manifests go last: under the lock, with every
    // machine on the target and none under way.
    if d.apply_manifests {
        prop_assert!(op.spec.is_kubernetes() && ours && !op.deleting, "manifests applied out of turn: {d:?}");
        prop_assert!(
            machines.iter().all(|m| m.progress == MachineProgress::Converged),
            "manifests applied before every machine is through: {machines:?}"
        );
        prop_assert!(d.start.is_empty() && d.advance.is_empty(), "manifests applied beside a machine: {d:?}");
    }

    // Control planes: never a second one.
    let is_cp = |name: &String| by_name[name.as_str()].role == MachineRole::ControlPlane;
    let cp_started = d.start.iter().filter(|n| is_cp(n)).count();
    let cp_busy = machines
        .iter()
        .filter(|m| m.role == MachineRole::ControlPlane && matches!(m.progress, MachineProgress::InProgress { .. }))
        .count();
    prop_assert!(cp_started <= 1);
    prop_assert!(cp_busy + cp_started <= 1, "second control plane: busy {cp_busy}, started {cp_started}");
    if cp_started == 1 {
        prop_assert_eq!(etcd, &EtcdVerdict::Healthy);
        prop_assert!(machines.iter().filter(|m| m.role == MachineRole::ControlPlane).all(|m| m.node_ready));
    }

    // Completed only when every machine observed is converged and every machine the
    // status records as under way or failed is observed.
    if d.phase == Phase::Completed && runs(&op.spec.kind) && !op.deleting {
        prop_assert!(
            machines.iter().all(|m| m.progress == MachineProgress::Converged),
            "Completed with a machine not converged"
        );
        let unseen = op
            .status
            .machines
            .iter()
            .find(|(name, r)| r.state != RecordState::Converged && !by_name.contains_key(name.as_str()));
        prop_assert!(unseen.is_none(), "Completed with {unseen:?} recorded and not observed");
    }
    // A machine recorded under way and not observed may be down: nothing starts beside it.
    let unseen_under_way = op
        .status
        .machines
        .iter()
        .any(|(name, r)| r.state == RecordState::InProgress && !by_name.contains_key(name.as_str()));
    if unseen_under_way {
        prop_assert!(d.start.is_empty(), "started {:?} beside a machine under way and not observed", d.start);
    }

    // Workers: never over maxUnavailable, counting those already unavailable.
    let workers_started = d.start.iter().filter(|n| !is_cp(n)).count();
    if workers_started > 0 {
        prop_assert_eq!(cp_started + cp_busy, 0, "worker started while a control plane is in progress");
        let unavailable = machines
            .iter()
            .filter(|m| m.role == MachineRole::Worker)
            .filter(|m| matches!(m.progress, MachineProgress::InProgress { .. }) || !m.node_ready)
            .count();
        let max = op.spec.max_unavailable.count().and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
        prop_assert!(
            unavailable + workers_started <= max,
            "{unavailable} unavailable + {workers_started} started > {max}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    /// One decision over any cluster state keeps every safety property.
    #[test]
    fn a_single_decision_is_always_safe(s in scenario()) {
        let op = operation(&s);
        let lease = lease(s.lock);
        let config = RolloutConfig::default();
        let kubernetes = kubernetes_input(&s);
        let input = RolloutInput {
            kubernetes: kubernetes.as_ref(),
            operation: &op,
            release_talos_version: "v1.14.4",
            releases: ichor_upgrade_core::releases::KnownReleases::built_in(),
            kubernetes_version: "1.34.1",
            lease: lease.as_ref(),
            machines: &s.machines,
            unaccounted_nodes: &[],
            etcd: &s.etcd,
            components: &ComponentsVerdict::all_ready(),
            preflight: &ichor_upgrade_core::rollout::PreflightVerdict::Off,
            windows: None,
            gates: None,
            config: &config,
            now: NOW,
        };
        let d = decide(&input);
        check_safety(&s.machines, &op, lease.as_ref(), &s.etcd, &d)?;
        prop_assert_eq!(&d, &decide(&input), "not deterministic");
        if s.kind == "kubernetes" && s.stage == KubernetesStage::ControlPlane {
            let workers: Vec<&String> = d
                .start
                .iter()
                .filter(|name| s.machines.iter().any(|m| &m.name == *name && m.role == MachineRole::Worker))
                .collect();
            prop_assert!(workers.is_empty(), "a worker started in the control planes' stage: {workers:?}");
            prop_assert_ne!(&d.phase, &Phase::Completed, "completed in the control planes' stage");
            prop_assert!(d.prepull.is_empty(), "no installer to pull");
        }
    }

    /// A partial view (a cache of machines not filled yet, or machines deleted under way)
    /// never completes the operation and never starts a machine beside one recorded under
    /// way and not seen.
    #[test]
    fn a_partial_view_never_completes_nor_starts_beside_a_machine_not_seen(
        s in scenario(),
        seen in prop::collection::vec(prop::bool::weighted(0.6), 307),
        keep_converged_record in any::<bool>(),
    ) {
        let mut op = operation(&s);
        // The status records what the machines' progress says, as the executor writes it.
        op.status.phase = Phase::Progressing;
        op.status.observed_generation = Some(op.generation);
        for m in &s.machines {
            let state = match m.progress {
                MachineProgress::InProgress { .. } => RecordState::InProgress,
                MachineProgress::Failed { .. } => RecordState::Failed,
                MachineProgress::Converged if keep_converged_record => RecordState::Converged,
                MachineProgress::Converged | MachineProgress::Pending => continue,
            };
            let record = MachineRecord { state, reason: "UpgradeCalled".into(), message: "x".into(), recheck_at: None };
            op.status.machines.insert(m.name.clone(), record);
        }
        let observed: Vec<MachineView> =
            s.machines.iter().zip(&seen).filter(|(_, seen)| **seen).map(|(m, _)| m.clone()).collect();
        let lease = lease(s.lock);
        let config = RolloutConfig::default();
        let kubernetes = kubernetes_input(&s);
        let d = decide(&RolloutInput {
            kubernetes: kubernetes.as_ref(),
            operation: &op,
            release_talos_version: "v1.14.4",
            releases: ichor_upgrade_core::releases::KnownReleases::built_in(),
            kubernetes_version: "1.34.1",
            lease: lease.as_ref(),
            machines: &observed,
            unaccounted_nodes: &[],
            etcd: &s.etcd,
            components: &ComponentsVerdict::all_ready(),
            preflight: &ichor_upgrade_core::rollout::PreflightVerdict::Off,
            windows: None,
            gates: None,
            config: &config,
            now: NOW,
        });
        check_safety(&observed, &op, lease.as_ref(), &s.etcd, &d)?;
    }

    /// A Kubernetes upgrade's first stage, whatever its control planes' progress (all of
    /// them through it included): no worker starts, and it never completes.
    #[test]
    fn in_the_control_planes_stage_no_worker_starts_and_nothing_completes(
        s in scenario(),
        all_through in any::<bool>(),
    ) {
        let mut s = s;
        s.kind = "kubernetes";
        s.stage = KubernetesStage::ControlPlane;
        s.deleting = false;
        s.resume_token = None;
        s.lock = LockKind::Ours { age_secs: 0 };
        for m in &mut s.machines {
            m.progress = match (m.role, &m.progress) {
                (MachineRole::Worker, _) => MachineProgress::Pending,
                (MachineRole::ControlPlane, _) if all_through => MachineProgress::Converged,
                (MachineRole::ControlPlane, MachineProgress::Failed { .. }) => MachineProgress::Pending,
                (MachineRole::ControlPlane, progress) => progress.clone(),
            };
            m.node_ready = true;
            m.held = false;
        }
        let op = operation(&s);
        let lease = lease(s.lock);
        let config = RolloutConfig::default();
        let kubernetes = kubernetes_input(&s);
        let d = decide(&RolloutInput {
            kubernetes: kubernetes.as_ref(),
            operation: &op,
            release_talos_version: "v1.14.4",
            releases: ichor_upgrade_core::releases::KnownReleases::built_in(),
            kubernetes_version: "1.34.1",
            lease: lease.as_ref(),
            machines: &s.machines,
            unaccounted_nodes: &[],
            etcd: &s.etcd,
            components: &ComponentsVerdict::all_ready(),
            preflight: &ichor_upgrade_core::rollout::PreflightVerdict::Off,
            windows: None,
            gates: None,
            config: &config,
            now: NOW,
        });
        check_safety(&s.machines, &op, lease.as_ref(), &s.etcd, &d)?;
        let workers: Vec<&String> =
            d.start.iter().filter(|name| name.starts_with("worker-")).collect();
        prop_assert!(workers.is_empty(), "a worker started in the control planes' stage: {workers:?}");
        prop_assert_ne!(&d.phase, &Phase::Completed, "completed in the control planes' stage");
    }

    /// Played forward, with every started machine converging after a while and holds
    /// lifted at some point, any cluster reaches Completed; safety holds at every step.
    #[test]
    fn a_rollout_completes_when_machines_converge_and_holds_lift(
        s in scenario(),
        seed in any::<u64>(),
        lift_holds_at in 0usize..40,
        recover_at in 0usize..40,
        kubernetes in prop::bool::weighted(0.3),
    ) {
        run_to_completion(s, seed, lift_holds_at, recover_at, kubernetes)?;
    }
}

/// A tiny deterministic generator for the played-forward world (tests only).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn run_to_completion(
    mut s: Scenario,
    seed: u64,
    lift_holds_at: usize,
    recover_at: usize,
    kubernetes: bool,
) -> Result<(), TestCaseError> {
    // The liveness run starts from a consistent, unfailed, live operation; a Kubernetes
    // upgrade from its first stage, nothing started (a worker is never under way in it).
    s.kind = if kubernetes { "kubernetes" } else { "talos" };
    if kubernetes {
        s.stage = KubernetesStage::ControlPlane;
        s.machines.iter_mut().for_each(|m| m.progress = MachineProgress::Pending);
    }
    s.deleting = false;
    s.resume_token = None;
    if s.snapshot == SnapshotKind::RequiredFailed {
        s.snapshot = SnapshotKind::RequiredNone;
    }
    for m in &mut s.machines {
        if matches!(m.progress, MachineProgress::Failed { .. }) {
            m.progress = MachineProgress::Pending;
        }
    }
    let mut rng = Rng(seed | 1);
    let config = RolloutConfig::default();
    let mut op = operation(&s);
    let mut lease = lease(s.lock);
    let mut now = NOW;
    // Steps left for each in-progress machine before its next stage.
    let mut timers: BTreeMap<String, u64> = BTreeMap::new();
    let bound = (50 + 8 * s.machines.len()) * if kubernetes { 2 } else { 1 };
    let index: BTreeMap<String, usize> = s.machines.iter().enumerate().map(|(i, m)| (m.name.clone(), i)).collect();

    for step in 0..bound {
        if step == lift_holds_at {
            s.machines.iter_mut().for_each(|m| m.held = false);
        }
        // Nodes down for reasons of their own (not past an Upgrade call) come back from
        // `recover_at` on.
        if step >= recover_at {
            s.machines
                .iter_mut()
                .filter(|m| !matches!(m.progress, MachineProgress::InProgress { past_upgrade_call: true }))
                .for_each(|m| m.node_ready = true);
        }
        let cps_ready = s.machines.iter().filter(|m| m.role == MachineRole::ControlPlane).all(|m| m.node_ready);
        let etcd =
            if cps_ready { EtcdVerdict::Healthy } else { EtcdVerdict::Unhealthy { reason: "member down".into() } };
        // The second stage begins once every control plane's first is recorded: each
        // machine is pending again, for its kubelet.
        if kubernetes
            && s.stage == KubernetesStage::ControlPlane
            && s.machines
                .iter()
                .filter(|m| m.role == MachineRole::ControlPlane)
                .all(|m| m.progress == MachineProgress::Converged)
        {
            s.stage = KubernetesStage::Kubelets;
            s.machines.iter_mut().for_each(|m| m.progress = MachineProgress::Pending);
            timers.clear();
        }
        let input = kubernetes_input(&s);
        let d = decide(&RolloutInput {
            kubernetes: input.as_ref(),
            operation: &op,
            release_talos_version: "v1.14.4",
            releases: ichor_upgrade_core::releases::KnownReleases::built_in(),
            kubernetes_version: "1.34.1",
            lease: lease.as_ref(),
            machines: &s.machines,
            unaccounted_nodes: &[],
            etcd: &etcd,
            components: &ComponentsVerdict::all_ready(),
            preflight: &ichor_upgrade_core::rollout::PreflightVerdict::Off,
            windows: None,
            gates: None,
            config: &config,
            now,
        });
        check_safety(&s.machines, &op, lease.as_ref(), &etcd, &d)?;
        if let Phase::Refused(Refusal::Unplannable { problems }) = &d.phase {
            // Planning refuses a cluster of exactly two control planes while nothing of the
            // operation has started (at the start, or once a stopped machine is pending again).
            let cps = s.machines.iter().filter(|m| m.role == MachineRole::ControlPlane).count();
            let nothing_started = s.machines.iter().all(|m| m.progress == MachineProgress::Pending);
            prop_assert!(cps == 2 && nothing_started, "refused at planning at step {step}: {problems:?}");
            prop_assert!(d.start.is_empty() && d.advance.is_empty());
            return Ok(());
        }
        if d.phase == Phase::Completed {
            // Every machine converged; a hold put on a machine after it converged holds nothing back.
            prop_assert!(s.machines.iter().all(|m| m.progress == MachineProgress::Converged));
            prop_assert!(!kubernetes || s.stage == KubernetesStage::Kubelets, "completed in the first stage");
            return Ok(());
        }
        prop_assert!(!matches!(d.phase, Phase::Paused(_) | Phase::Refused(_)), "{:?}", d.phase);

        match d.lock {
            LockAction::Acquire { .. } | LockAction::Renew => {
                lease = Some(LeaseHolder {
                    identity: US.into(),
                    renewed_at: now,
                    lease_duration: config.lease_duration,
                    holder_exists: true,
                })
            }
            LockAction::Release => lease = None,
            LockAction::Keep | LockAction::Leave => {}
        }
        // The executor takes the snapshot asked for and records it.
        if d.take_etcd_snapshot.is_some() {
            op.status.etcd_snapshot = Some(taken_snapshot());
        }
        // The executor applies the bootstrap manifests asked for and records them.
        if d.apply_manifests {
            op.status.manifests = Some(ichor_upgrade_core::kubernetes::manifests::ManifestsState::Applied {
                target: op.spec.target_version.clone(),
                objects: 1,
                at: now,
                workloads: Vec::new(),
                rolled_out: true,
                progress: 0,
                progress_at: None,
            });
        }
        for name in &d.stop {
            s.machines[index[name]].progress = MachineProgress::Pending;
            timers.remove(name);
        }
        for name in &d.start {
            s.machines[index[name]].progress = MachineProgress::InProgress { past_upgrade_call: false };
            timers.insert(name.clone(), rng.below(3));
        }
        for name in &d.advance {
            let m = &mut s.machines[index[name]];
            let timer = timers.entry(name.clone()).or_insert(0);
            if *timer > 0 {
                *timer -= 1;
                continue;
            }
            *timer = rng.below(3);
            match m.progress {
                // The Upgrade call, only with this pass's authority: the node goes down.
                MachineProgress::InProgress { past_upgrade_call: false }
                    if d.authority.get(name) == Some(&CallAuthority::Granted) =>
                {
                    m.progress = MachineProgress::InProgress { past_upgrade_call: true };
                    m.node_ready = false;
                }
                MachineProgress::InProgress { past_upgrade_call: true } if !m.node_ready => m.node_ready = true,
                MachineProgress::InProgress { past_upgrade_call: true } => m.progress = MachineProgress::Converged,
                MachineProgress::InProgress { past_upgrade_call: false }
                | MachineProgress::Pending
                | MachineProgress::Converged
                | MachineProgress::Failed { .. } => {}
            }
        }
        if let Some(token) = d.acknowledge_resume {
            op.status.observed_resume = Some(token);
        }
        op.status.phase = d.phase;
        op.status.observed_generation = Some(op.generation);
        now = now.saturating_add(Duration::from_secs(10));
        // The other holder stops renewing: its lease expires within the bound.
    }
    Err(TestCaseError::fail(format!("no completion within {bound} steps")))
}
